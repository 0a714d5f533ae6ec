//! A connection's reading side: what came on the streams quiche has data
//! for, read through [`Http3`]: the client's control and QPACK streams,
//! request heads (each made a request in a slot), and request bodies as
//! fast as their readers take them.

use http::{HeaderMap, Method, StatusCode, Version};
use rustc_hash::FxHashMap;

use super::{BODY_AHEAD, Conn, Slot, Task};
use crate::accesslog::reason;
use crate::body::ClientBody;
use crate::downstream::h3::http3::{Fault, Read};
use crate::downstream::recv;
use crate::h2::request::{Fields, Refused};
use crate::h3::frame::code;
use crate::proxy::{self, HeadWriter};

impl Conn {
    /// Reads what came on the streams quiche has data for: the client's
    /// control and QPACK streams, request heads, and request bodies as
    /// fast as their readers take them.
    pub(super) fn events(&mut self) {
        let mut ids = std::mem::take(&mut self.readable);
        ids.extend(self.quic.readable());
        let mut next = 0;
        while let Some(&id) = ids.get(next) {
            next += 1;
            let Some(h3) = self.h3.as_mut() else { break };
            if id & 0x2 != 0 {
                // A client unidirectional stream.
                let read = h3.read_uni(&mut self.quic, id);
                // Requests whose heads waited for QPACK entries that came.
                ids.extend(h3.take_unblocked());
                if let Err(c) = read {
                    self.close(c);
                }
            } else if let Some(slot) = self.slot_of(id) {
                if let Some(s) = self.slots[slot].as_mut() {
                    s.unread = true;
                }
                self.read_body(slot);
            } else {
                self.read_head(id);
            }
            if self.quic.is_closed() || self.quic.local_error().is_some() {
                break;
            }
        }
        ids.clear();
        self.readable = ids;
        if let Some(Err(c)) = self.h3.as_mut().map(|h3| h3.flush_decoder(&mut self.quic)) {
            self.close(c);
        }
    }

    /// Closes the connection for a protocol error.
    pub(super) fn close(&mut self, c: u64) {
        if !self.quic.is_closed() && self.quic.local_error().is_none() {
            let _ = self.quic.close(true, c, b"");
        }
    }

    /// A stream with no request yet: its head, once all of it is here.
    pub(super) fn read_head(&mut self, stream: u64) {
        let Some(h3) = self.h3.as_mut() else { return };
        match h3.read(&mut self.quic, stream) {
            Ok(Read::Head { more }) => self.headers(stream, more),
            Ok(Read::Nothing | Read::Reset) => {}
            // A body, trailers or end before the head: the reader says so
            // as an error first.
            Ok(Read::Data(_) | Read::Trailers | Read::End) => self.reset(stream, code::INTERNAL_ERROR),
            Err(Fault::Stream(c)) => self.reset(stream, c),
            Err(Fault::Connection(c)) => self.close(c),
        }
    }

    pub(super) fn slot_of(&self, stream: u64) -> Option<usize> {
        self.by_stream.get(&stream).copied()
    }

    /// The fields the last head or trailers read decode to.
    pub(super) fn fields(&mut self, trailers: bool) -> Option<Fields> {
        let snap = self.worker.shared.snapshot.load();
        let mut f = Fields::new(trailers, snap.http.max_header_bytes, snap.http.max_headers);
        drop(snap);
        let h3 = self.h3.as_mut()?;
        match h3.decode(|n, v| {
            f.field(n, v);
            // A QPACK bomb stops at the limit.
            !f.is_refused()
        }) {
            Ok(()) => Some(f),
            Err(Fault::Connection(c) | Fault::Stream(c)) => {
                self.close(c);
                None
            }
        }
    }

    pub(super) fn headers(&mut self, stream: u64, more: bool) {
        self.last_stream = Some(self.last_stream.map_or(stream, |s| s.max(stream)));
        let Some(f) = self.fields(false) else { return };
        let Some(state) = self.state.clone() else { return };
        let content_length = f.content_length;
        let request = match f.into_request(()) {
            Ok(r) => r,
            Err(Refused::Malformed) => {
                state.log_rejected(400, reason::BAD_REQUEST);
                return self.reset(stream, code::MESSAGE_ERROR);
            }
            Err(Refused::TooLarge) => {
                state.log_rejected(431, reason::HEAD_TOO_LARGE);
                return self.answer(stream, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
            }
        };
        if let (Some(p), Some(h3)) = (request.headers().get("priority"), self.h3.as_mut()) {
            h3.prioritize(stream, p.as_bytes());
        }
        if request.method() == Method::CONNECT {
            state.log_rejected(405, reason::BAD_REQUEST);
            return self.answer(stream, StatusCode::METHOD_NOT_ALLOWED);
        }
        let early = match self.early.iter().position(|id| *id == stream) {
            Some(at) => {
                self.early.swap_remove(at);
                true
            }
            None => self.quic.is_in_early_data(),
        };
        if early && !matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
            // Replayable data must not start an unsafe request (RFC 8470).
            return self.answer(stream, StatusCode::from_u16(425).unwrap_or(StatusCode::BAD_REQUEST));
        }
        let Some(slot) = self.take_slot(stream) else {
            return self.reset(stream, code::REQUEST_REJECTED);
        };
        let Some(s) = self.slots[slot].as_mut() else { return };
        let body = if more {
            let (tx, rx) = recv::channel(s.waker.clone(), content_length);
            s.body = Some(tx);
            // What came with the head is read when the slot is polled.
            s.unread = true;
            ClientBody::Stream(rx)
        } else {
            ClientBody::None
        };
        let mut request = request.map(|()| body);
        *request.version_mut() = Version::HTTP_3;
        if early {
            request.headers_mut().insert("early-data", http::HeaderValue::from_static("1"));
        }
        s.task = Task::Handling(proxy::handle_boxed(request, state, HeadWriter::Map));
        self.ready.mark(slot);
    }

    /// A response made here (a refusal), with no body.
    pub(super) fn answer(&mut self, stream: u64, status: StatusCode) {
        let Some(h3) = self.h3.as_mut() else { return };
        if h3.send_head(&mut self.quic, stream, status, &HeaderMap::new(), true).is_err() {
            return self.reset(stream, code::REQUEST_REJECTED);
        }
        let _ = self.quic.stream_shutdown(stream, quiche::Shutdown::Read, code::NO_ERROR);
        h3.done(stream);
    }

    pub(super) fn reset(&mut self, stream: u64, code: u64) {
        let _ = self.quic.stream_shutdown(stream, quiche::Shutdown::Read, code);
        let _ = self.quic.stream_shutdown(stream, quiche::Shutdown::Write, code);
        if let Some(h3) = self.h3.as_mut() {
            h3.done(stream);
        }
    }

    pub(super) fn take_slot(&mut self, stream: u64) -> Option<usize> {
        let index = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None if self.slots.len() < self.ready.capacity() => {
                if self.slots.capacity() == 0 {
                    let room = self.busiest.max(4).min(self.ready.capacity());
                    self.slots.reserve_exact(room);
                    self.by_stream.reserve(room);
                }
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return None,
        };
        self.slots[index] = Some(Slot {
            stream,
            task: Task::Done,
            body: None,
            ahead: 0,
            unread: false,
            pending: None,
            waker: self.ready.waker(index),
        });
        self.by_stream.insert(stream, index);
        Some(index)
    }

    pub(super) fn free(&mut self, slot: usize) {
        self.blocked.forget(slot);
        if let Some(s) = self.slots.get_mut(slot).and_then(Option::take) {
            self.by_stream.remove(&s.stream);
            if let Some(h3) = self.h3.as_mut() {
                h3.done(s.stream);
            }
        }
        if self.by_stream.is_empty() {
            // An idle connection keeps no room for requests: the slots'
            // vector starts at four (448 bytes), and most connections sit idle
            // between a few requests. One that was busy gets its room back
            // whole when the next request comes.
            self.busiest = self.slots.len();
            self.slots = Vec::new();
            self.by_stream = FxHashMap::default();
        }
    }

    /// Reads the request body from quiche while the reader keeps up.
    pub(super) fn read_body(&mut self, slot: usize) {
        loop {
            let Some(h3) = self.h3.as_mut() else { return };
            let Some(s) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
            if let Some(body) = &s.body {
                s.ahead = s.ahead.saturating_sub(body.take_released());
            }
            if !s.unread || s.ahead >= BODY_AHEAD {
                return;
            }
            let stream = s.stream;
            match h3.read(&mut self.quic, stream) {
                Ok(Read::Data(d)) => {
                    s.ahead += d.len();
                    if let Some(body) = &s.body {
                        body.data(d);
                    }
                }
                Ok(Read::Trailers) => {
                    let Some(f) = self.fields(true) else { return };
                    let Some(s) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
                    match (f.into_trailers(), s.body.take()) {
                        (Ok(t), Some(body)) => body.end(Some(t)),
                        (Err(_), Some(body)) => {
                            body.fail("malformed trailers");
                            self.reset(stream, code::MESSAGE_ERROR);
                            return self.free(slot);
                        }
                        _ => {}
                    }
                }
                Ok(Read::End) => {
                    s.unread = false;
                    if let Some(body) = s.body.take() {
                        body.end(None);
                    }
                }
                Ok(Read::Nothing) => s.unread = false,
                Ok(Read::Head { .. }) => {
                    self.reset(stream, code::INTERNAL_ERROR);
                    return self.free(slot);
                }
                Ok(Read::Reset) => {
                    // The client gave up on the request: its work stops.
                    self.reset(stream, code::REQUEST_CANCELLED);
                    return self.free(slot);
                }
                Err(Fault::Stream(c)) => {
                    if let Some(body) = s.body.take() {
                        body.fail("stream error");
                    }
                    self.reset(stream, c);
                    return self.free(slot);
                }
                Err(Fault::Connection(c)) => {
                    if let Some(body) = s.body.take() {
                        body.fail("stream error");
                    }
                    return self.close(c);
                }
            }
        }
    }
}
