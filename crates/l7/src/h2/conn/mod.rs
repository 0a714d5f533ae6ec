//! An HTTP/2 server connection's protocol state (RFC 9113), without I/O:
//! the bytes the client sent and the time go in; the frames to send and
//! [`Event`]s for the driver come out. It keeps the preface and SETTINGS,
//! PING, GOAWAY, the flow-control windows of the connection and of each
//! stream, the stream states and limits, the gathering and decoding of
//! header blocks, and the hostile-input rules. The driver
//! ([`crate::downstream::h2`]) owns the socket, runs each stream's request
//! and response body, and tells this what they produced.
//!
//! Hostile input: streams the client opens and resets before they finish,
//! streams refused for concurrency, empty DATA frames and empty
//! CONTINUATION frames draw on a budget that finished responses refill; an
//! empty budget ends the connection with ENHANCE_YOUR_CALM (rapid reset,
//! CVE-2023-44487; CVE-2019-9518). A header block is bounded while it is
//! gathered (CONTINUATION floods) and while it is decoded (HPACK bombs:
//! see [`super::request`]). A client that leaves what is owed to it
//! unread, or holds a window closed, for the stall timeout is told so by
//! [`Connection::stall_deadline`].

mod send;
mod streams;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, Method, Request, StatusCode};

use self::send::SendSide;
pub use self::send::Sent;
use self::streams::{Stream, Streams};
use super::frame::{self, Head, Reason};
use super::hpack::Decoder;
use super::request::{Fields, Refused};

/// What a connection allows and advertises.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_concurrent: usize,
    pub max_header_list: usize,
    pub max_fields: usize,
    /// The window each stream's request body gets.
    pub stream_window: u32,
    /// The window all request bodies share.
    pub conn_window: u32,
    /// How long a client may leave what is owed to it unread: responses
    /// queued it does not read, or held for a window it does not open.
    /// Then the connection closes, and the upstream exchanges it held
    /// with it.
    pub stall_timeout: Duration,
}

impl Limits {
    pub fn new(http: &gatehouse_config::HttpSettings) -> Self {
        Limits {
            max_concurrent: 256,
            max_header_list: http.max_header_bytes,
            max_fields: http.max_headers,
            stream_window: 256 * 1024,
            conn_window: 1024 * 1024,
            stall_timeout: http.client_idle_timeout,
        }
    }
}

/// Cancelled and refused streams allowed beyond those finished.
pub const RESET_BUDGET: i64 = 200;

/// What the driver is to do, in the order it happened.
#[derive(Debug)]
pub enum Event {
    /// A stream opened with a request to answer. `end`: it has no body;
    /// otherwise its body comes as [`Event::Data`] and [`Event::End`].
    Request { slot: usize, request: Request<()>, end: bool, content_length: Option<u64> },
    /// A request was answered here with this status (for the access log).
    Refused(StatusCode),
    /// Request body bytes for the stream in `slot`.
    Data { slot: usize, data: Bytes },
    /// The request body ended, with its trailers if it had any.
    End { slot: usize, trailers: Option<HeaderMap> },
    /// The stream is gone: the driver drops what it holds for it (a
    /// request body not ended fails for its reader).
    Closed { slot: usize },
    /// A window opened: the stream's response may go on.
    Wake { slot: usize },
}

/// What the HEADERS frame that starts a header block says.
#[derive(Clone, Copy)]
struct BlockHead {
    stream: u32,
    end_stream: bool,
    /// A stream that depends on itself (a stream error once decoded).
    self_dependent: bool,
}

/// A header block being gathered from HEADERS and CONTINUATION frames
/// (one that fits its HEADERS frame is decoded where it lies).
struct Block {
    head: BlockHead,
    bytes: Vec<u8>,
}

/// Ends the connection: GOAWAY with this code.
struct ConnError(Reason);

impl From<Reason> for ConnError {
    fn from(why: Reason) -> Self {
        ConnError(why)
    }
}

pub struct Connection {
    limits: Limits,
    preface_done: bool,
    settings_seen: bool,
    /// Frames to send, in order.
    out: Vec<u8>,
    events: VecDeque<Event>,
    decoder: Decoder,
    block: Option<Block>,
    streams: Streams,
    send: SendSide,
    conn_recv_window: i64,
    /// Request body bytes taken (or dropped) and not yet given back to the
    /// connection's window.
    conn_released: usize,
    budget: i64,
    goaway_sent: bool,
    peer_goaway: bool,
    /// While the client owes us reading or a window: when it last moved,
    /// plus the stall timeout.
    stall_deadline: Option<Instant>,
    /// After a connection error or the end of input: nothing more is read.
    read_done: bool,
}

impl Connection {
    /// A connection whose first frames (SETTINGS, and the connection
    /// window's update) are queued.
    pub fn new(limits: Limits) -> Self {
        let mut out = Vec::new();
        frame::put_settings(
            &mut out,
            &[
                (frame::SETTINGS_ENABLE_PUSH, 0),
                (frame::SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent as u32),
                (frame::SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window),
                (frame::SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list as u32),
            ],
        );
        let conn_extra = limits.conn_window.saturating_sub(frame::DEFAULT_WINDOW as u32);
        if conn_extra > 0 {
            frame::put_window_update(&mut out, 0, conn_extra);
        }
        Connection {
            limits,
            preface_done: false,
            settings_seen: false,
            out,
            events: VecDeque::new(),
            decoder: Decoder::default(),
            block: None,
            streams: Streams::new(limits.max_concurrent),
            send: SendSide::new(),
            conn_recv_window: frame::DEFAULT_WINDOW + i64::from(conn_extra),
            conn_released: 0,
            budget: RESET_BUDGET,
            goaway_sent: false,
            peer_goaway: false,
            stall_deadline: None,
            read_done: false,
        }
    }

    /// The frames to send; the driver takes them from here.
    pub fn output(&mut self) -> &mut Vec<u8> {
        &mut self.out
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Streams open.
    pub fn open_streams(&self) -> usize {
        self.streams.open()
    }

    /// Whether the stream in `slot` is open.
    pub fn is_open(&self, slot: usize) -> bool {
        self.streams.get(slot).is_some()
    }

    /// Whether the client's preface is still to come.
    pub fn awaiting_preface(&self) -> bool {
        !self.preface_done
    }

    /// Nothing more is to be read: the connection failed, or the client
    /// is gone.
    pub fn read_done(&self) -> bool {
        self.read_done
    }

    /// Whether the connection has nothing left to do.
    pub fn finished(&self) -> bool {
        self.read_done || ((self.goaway_sent || self.peer_goaway) && self.streams.open() == 0)
    }

    /// When the client, owing us reading (`queued` bytes are unsent) or a
    /// window, has stalled for the stall timeout; `None` while it owes
    /// nothing. `moved`: bytes went out since the last call. `now` is
    /// asked only when the deadline moves, not on every call.
    pub fn stall_deadline(&mut self, now: impl FnOnce() -> Instant, queued: usize, moved: bool) -> Option<Instant> {
        let waiting = queued > 0 || self.send.waiting();
        let moved = self.send.take_opened() || moved;
        if !waiting {
            self.stall_deadline = None;
            return None;
        }
        if moved || self.stall_deadline.is_none() {
            self.stall_deadline = Some(now() + self.limits.stall_timeout);
        }
        self.stall_deadline
    }

    // ---- input ----

    /// Takes the whole frames at the start of `input` (what is left is
    /// the start of a frame). A connection error queues GOAWAY and ends
    /// the reading.
    pub fn receive(&mut self, input: &mut BytesMut) {
        if self.read_done {
            return;
        }
        if let Err(ConnError(why)) = self.process(input) {
            self.connection_error(why);
        }
    }

    /// The client is gone, or idled out (then GOAWAY says so, if it still
    /// listens); nothing it asked for can reach it.
    pub fn peer_gone(&mut self) {
        self.go_away(Reason::NoError);
        self.read_done = true;
        self.drop_streams();
    }

    fn process(&mut self, input: &mut BytesMut) -> Result<(), ConnError> {
        if !self.preface_done {
            let n = input.len().min(frame::PREFACE.len());
            if input[..n] != frame::PREFACE[..n] {
                return Err(ConnError(Reason::Protocol));
            }
            if n < frame::PREFACE.len() {
                return Ok(());
            }
            input.advance(n);
            self.preface_done = true;
        }
        while !self.read_done {
            let Some(head) = Head::parse(input) else { return Ok(()) };
            if head.len > frame::DEFAULT_MAX_FRAME {
                return Err(ConnError(Reason::FrameSize));
            }
            if input.len() < frame::HEADER_LEN + head.len {
                return Ok(());
            }
            input.advance(frame::HEADER_LEN);
            let payload = input.split_to(head.len).freeze();
            if !self.settings_seen {
                if head.kind != frame::SETTINGS || head.has(frame::ACK) {
                    return Err(ConnError(Reason::Protocol));
                }
                self.settings_seen = true;
            }
            self.frame(head, payload)?;
        }
        Ok(())
    }

    fn frame(&mut self, head: Head, payload: Bytes) -> Result<(), ConnError> {
        if let Some(block) = &self.block
            && (head.kind != frame::CONTINUATION || head.stream != block.head.stream)
        {
            return Err(ConnError(Reason::Protocol));
        }
        match head.kind {
            frame::DATA => self.data(head, payload),
            frame::HEADERS => self.headers(head, payload),
            frame::CONTINUATION => self.continuation(head, &payload),
            frame::PRIORITY => {
                if head.stream == 0 {
                    return Err(ConnError(Reason::Protocol));
                }
                if head.len != 5 {
                    self.stream_error(head.stream, Reason::FrameSize);
                } else if u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff
                    == head.stream
                {
                    self.stream_error(head.stream, Reason::Protocol);
                }
                Ok(())
            }
            frame::RST_STREAM => self.rst_stream(head, &payload),
            frame::SETTINGS => self.settings(head, &payload),
            frame::PUSH_PROMISE => Err(ConnError(Reason::Protocol)),
            frame::PING => {
                if head.stream != 0 {
                    return Err(ConnError(Reason::Protocol));
                }
                if head.len != 8 {
                    return Err(ConnError(Reason::FrameSize));
                }
                if !head.has(frame::ACK) {
                    frame::put_ping_ack(&mut self.out, &payload);
                }
                Ok(())
            }
            frame::GOAWAY => {
                if head.stream != 0 {
                    return Err(ConnError(Reason::Protocol));
                }
                if head.len < 8 {
                    return Err(ConnError(Reason::FrameSize));
                }
                self.peer_goaway = true;
                Ok(())
            }
            frame::WINDOW_UPDATE => self.window_update(head, &payload),
            // Unknown frame types are ignored (RFC 9113 4.1).
            _ => Ok(()),
        }
    }

    fn stream(&mut self, slot: usize) -> &mut Stream {
        match self.streams.get_mut(slot) {
            Some(s) => s,
            None => unreachable!("slot {slot} is in use"),
        }
    }

    /// The frame's payload without its padding (RFC 9113 6.1, 6.2).
    fn unpad(head: &Head, mut payload: Bytes) -> Result<Bytes, ConnError> {
        if head.has(frame::PADDED) {
            let Some(&pad) = payload.first() else { return Err(ConnError(Reason::FrameSize)) };
            let pad = pad as usize;
            if pad >= payload.len() {
                return Err(ConnError(Reason::Protocol));
            }
            payload.advance(1);
            payload.truncate(payload.len() - pad);
        }
        Ok(payload)
    }

    fn data(&mut self, head: Head, payload: Bytes) -> Result<(), ConnError> {
        if head.stream == 0 || head.stream > self.streams.last() {
            return Err(ConnError(Reason::Protocol));
        }
        let len = head.len as i64;
        if len > self.conn_recv_window {
            return Err(ConnError(Reason::FlowControl));
        }
        self.conn_recv_window -= len;
        let data = Self::unpad(&head, payload)?;
        let Some(slot) = self.streams.slot_of(head.stream) else {
            // A closed stream: its bytes go back to the connection's window.
            self.conn_released += head.len;
            self.stream_error(head.stream, Reason::StreamClosed);
            return Ok(());
        };
        // Padding is never taken by anyone: given back at once.
        self.conn_released += head.len - data.len();
        let end = head.has(frame::END_STREAM);
        let s = self.stream(slot);
        if s.remote_closed {
            self.conn_released += data.len();
            self.stream_error(head.stream, Reason::StreamClosed);
            return Ok(());
        }
        if len > s.recv_window {
            self.conn_released += data.len();
            self.stream_error(head.stream, Reason::FlowControl);
            return Ok(());
        }
        s.recv_window -= len;
        // Padding counts against the stream's window too, and no reader
        // will take it: it is owed back with the next update.
        s.unacked += len - data.len() as i64;
        s.received += data.len() as u64;
        let overrun = s.content_length.is_some_and(|cl| s.received > cl);
        let short = end && s.content_length.is_some_and(|cl| s.received != cl);
        if overrun || short {
            self.conn_released += data.len();
            self.stream_error(head.stream, Reason::Protocol);
            return Ok(());
        }
        let empty_flood = data.is_empty() && !end;
        s.unreleased += data.len();
        if end {
            s.remote_closed = true;
        }
        if !data.is_empty() {
            self.events.push_back(Event::Data { slot, data });
        }
        if end {
            self.events.push_back(Event::End { slot, trailers: None });
            self.maybe_close(slot);
        }
        if empty_flood {
            // Empty DATA frames do nothing but cost (CVE-2019-9518).
            self.spend_budget()?;
        }
        Ok(())
    }

    fn headers(&mut self, head: Head, payload: Bytes) -> Result<(), ConnError> {
        if head.stream == 0 || head.stream.is_multiple_of(2) {
            return Err(ConnError(Reason::Protocol));
        }
        let mut fragment = Self::unpad(&head, payload)?;
        let mut self_dependent = false;
        if head.has(frame::PRIORITY_FLAG) {
            if fragment.len() < 5 {
                return Err(ConnError(Reason::FrameSize));
            }
            let dep = u32::from_be_bytes([fragment[0], fragment[1], fragment[2], fragment[3]]) & 0x7fff_ffff;
            fragment.advance(5);
            self_dependent = dep == head.stream;
        }
        let block = BlockHead { stream: head.stream, end_stream: head.has(frame::END_STREAM), self_dependent };
        if head.has(frame::END_HEADERS) {
            self.header_block(block, &fragment)
        } else {
            self.block = Some(Block { head: block, bytes: fragment.to_vec() });
            Ok(())
        }
    }

    fn continuation(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if payload.is_empty() && !head.has(frame::END_HEADERS) {
            self.spend_budget()?;
        }
        let limit = self.limits.max_header_list + 1024;
        let Some(block) = self.block.as_mut() else { return Err(ConnError(Reason::Protocol)) };
        if block.bytes.len() + payload.len() > limit {
            // A block that never ends (CONTINUATION flood).
            return Err(ConnError(Reason::EnhanceYourCalm));
        }
        block.bytes.extend_from_slice(payload);
        if head.has(frame::END_HEADERS)
            && let Some(block) = self.block.take()
        {
            return self.header_block(block.head, &block.bytes);
        }
        Ok(())
    }

    fn decode(&mut self, block: &[u8], fields: &mut Fields) -> Result<(), ConnError> {
        self.decoder.decode(block, |n, v| fields.field(n, v)).map_err(|_| ConnError(Reason::Compression))
    }

    /// A whole header block: a request, or a request's trailers.
    fn header_block(&mut self, block: BlockHead, bytes: &[u8]) -> Result<(), ConnError> {
        let id = block.stream;
        if id <= self.streams.last() {
            return self.trailers(block, bytes);
        }
        let mut fields = Fields::new(false, self.limits.max_header_list, self.limits.max_fields);
        self.decode(bytes, &mut fields)?;
        self.streams.saw(id);
        if block.self_dependent || self.goaway_sent {
            // A stream that depends on itself; or one past the last
            // stream GOAWAY promised to serve.
            let why = if block.self_dependent { Reason::Protocol } else { Reason::RefusedStream };
            self.streams.remember_closed(id);
            frame::put_rst(&mut self.out, id, why);
            return Ok(());
        }
        let content_length = fields.content_length;
        let end = block.end_stream;
        let stream =
            Stream::new(id, self.send.initial_window(), i64::from(self.limits.stream_window), content_length, end);
        let Some(slot) = self.streams.insert(stream) else {
            self.streams.remember_closed(id);
            frame::put_rst(&mut self.out, id, Reason::RefusedStream);
            return self.spend_budget();
        };
        match fields.into_request(()) {
            Ok(req) if req.method() == Method::CONNECT => {
                self.events.push_back(Event::Refused(StatusCode::METHOD_NOT_ALLOWED));
                self.respond_directly(slot, StatusCode::METHOD_NOT_ALLOWED);
            }
            Ok(_) if end && content_length.is_some_and(|cl| cl > 0) => self.reset(slot, Reason::Protocol),
            Ok(request) => self.events.push_back(Event::Request { slot, request, end, content_length }),
            Err(Refused::TooLarge) => {
                let status = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
                self.events.push_back(Event::Refused(status));
                self.respond_directly(slot, status);
            }
            Err(Refused::Malformed) => self.reset(slot, Reason::Protocol),
        }
        Ok(())
    }

    /// A header block on a stream opened before: the request's trailers.
    fn trailers(&mut self, block: BlockHead, bytes: &[u8]) -> Result<(), ConnError> {
        let id = block.stream;
        let Some(slot) = self.streams.slot_of(id) else {
            // Decoded all the same: the decoder's table must follow.
            self.decode(bytes, &mut Fields::new(true, usize::MAX, usize::MAX))?;
            return Err(ConnError(if self.streams.was_closed(id) { Reason::StreamClosed } else { Reason::Protocol }));
        };
        let mut fields = Fields::new(true, self.limits.max_header_list, self.limits.max_fields);
        self.decode(bytes, &mut fields)?;
        let s = self.stream(slot);
        if s.remote_closed {
            self.reset(slot, Reason::StreamClosed);
            return Ok(());
        }
        let short = s.content_length.is_some_and(|cl| s.received != cl);
        if !block.end_stream || short {
            self.reset(slot, Reason::Protocol);
            return Ok(());
        }
        let Ok(trailers) = fields.into_trailers() else {
            self.reset(slot, Reason::Protocol);
            return Ok(());
        };
        self.stream(slot).remote_closed = true;
        self.events.push_back(Event::End { slot, trailers: Some(trailers) });
        self.maybe_close(slot);
        Ok(())
    }

    fn rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream == 0 || head.stream > self.streams.last() {
            return Err(ConnError(Reason::Protocol));
        }
        if payload.len() != 4 {
            return Err(ConnError(Reason::FrameSize));
        }
        if let Some(slot) = self.streams.slot_of(head.stream) {
            let unfinished = !self.stream(slot).local_closed;
            self.close(slot);
            if unfinished {
                self.spend_budget()?;
            }
        }
        Ok(())
    }

    fn settings(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream != 0 {
            return Err(ConnError(Reason::Protocol));
        }
        if head.has(frame::ACK) {
            return if payload.is_empty() { Ok(()) } else { Err(ConnError(Reason::FrameSize)) };
        }
        if !payload.len().is_multiple_of(6) {
            return Err(ConnError(Reason::FrameSize));
        }
        for s in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match id {
                frame::SETTINGS_ENABLE_PUSH if value > 1 => return Err(ConnError(Reason::Protocol)),
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    let events = &mut self.events;
                    self.send.set_initial_window(value, &mut self.streams, |slot| {
                        events.push_back(Event::Wake { slot });
                    })?;
                }
                frame::SETTINGS_MAX_FRAME_SIZE => self.send.set_max_frame(value)?,
                frame::SETTINGS_HEADER_TABLE_SIZE => self.send.set_table_size(value),
                // The server pushes nothing, and the rest
                // bound what the client receives from us only.
                _ => {}
            }
        }
        frame::put_settings_ack(&mut self.out);
        Ok(())
    }

    fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if payload.len() != 4 {
            return Err(ConnError(Reason::FrameSize));
        }
        let inc = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        if head.stream == 0 {
            let events = &mut self.events;
            self.send.conn_update(inc, |slot| events.push_back(Event::Wake { slot }))?;
            return Ok(());
        }
        if head.stream > self.streams.last() {
            return Err(ConnError(Reason::Protocol));
        }
        let Some(slot) = self.streams.slot_of(head.stream) else { return Ok(()) };
        let Some(s) = self.streams.get_mut(slot) else { return Ok(()) };
        match self.send.stream_update(s, inc) {
            Ok(()) => self.events.push_back(Event::Wake { slot }),
            Err(why) => self.reset(slot, why),
        }
        Ok(())
    }

    fn spend_budget(&mut self) -> Result<(), ConnError> {
        self.budget -= 1;
        if self.budget <= 0 { Err(ConnError(Reason::EnhanceYourCalm)) } else { Ok(()) }
    }

    // ---- output ----

    /// The response's head; `end`: it has no body.
    pub fn send_response(&mut self, slot: usize, status: StatusCode, headers: &HeaderMap, end: bool) {
        let Some(s) = self.streams.get_mut(slot) else { return };
        s.local_closed = end;
        self.send.fields(&mut self.out, s.id, Some(status), headers, end);
    }

    /// Whether the response has data, trailers or its end not yet sent.
    pub fn has_pending(&self, slot: usize) -> bool {
        self.streams.get(slot).is_some_and(Stream::has_pending)
    }

    /// Response data to send, and whether the body ends with it; sent by
    /// [`Connection::send_pending`] as the windows allow.
    pub fn queue_data(&mut self, slot: usize, data: Bytes, end: bool) {
        let Some(s) = self.streams.get_mut(slot) else { return };
        s.pending = data;
        s.pending_end = end;
    }

    /// The response body ended with these trailers.
    pub fn queue_trailers(&mut self, slot: usize, trailers: HeaderMap) {
        let Some(s) = self.streams.get_mut(slot) else { return };
        s.pending_trailers = Some(trailers);
    }

    /// The response body ended.
    pub fn queue_end(&mut self, slot: usize) {
        let Some(s) = self.streams.get_mut(slot) else { return };
        s.pending_end = true;
    }

    /// Sends what the windows allow of a stream's pending data, then its
    /// end.
    pub fn send_pending(&mut self, slot: usize) -> Sent {
        let Some(s) = self.streams.get_mut(slot) else { return Sent::Ended };
        self.send.pending(&mut self.out, slot, s)
    }

    /// The reader of the stream's request body took `taken` bytes: they go
    /// back to the client's windows, a stream's in updates of at least
    /// half its window.
    pub fn released(&mut self, slot: usize, taken: usize) {
        let window = i64::from(self.limits.stream_window);
        let Some(s) = self.streams.get_mut(slot) else { return };
        self.conn_released += taken;
        s.unreleased = s.unreleased.saturating_sub(taken);
        s.unacked += taken as i64;
        if s.unacked >= window / 2 && !s.remote_closed {
            frame::put_window_update(&mut self.out, s.id, s.unacked as u32);
            s.recv_window += s.unacked;
            s.unacked = 0;
        }
    }

    /// Gives request body bytes taken back to the connection's window, in
    /// updates of at least a quarter of it.
    pub fn release_conn_window(&mut self) {
        let window = i64::from(self.limits.conn_window);
        if self.conn_released > 0 && (self.conn_released as i64) >= window / 4 && !self.read_done {
            frame::put_window_update(&mut self.out, 0, self.conn_released as u32);
            self.conn_recv_window += self.conn_released as i64;
            self.conn_released = 0;
        }
    }

    /// A direct answer with no body: 405 for CONNECT, 431 for a request
    /// over the header limits.
    fn respond_directly(&mut self, slot: usize, status: StatusCode) {
        self.send_response(slot, status, &HeaderMap::new(), true);
        self.maybe_close(slot);
    }

    /// Frees a stream once both sides are done; a response that ended
    /// before the request body tells the client to stop sending.
    pub fn maybe_close(&mut self, slot: usize) {
        let Some(s) = self.streams.get(slot) else { return };
        if !s.local_closed {
            return;
        }
        if !s.remote_closed {
            frame::put_rst(&mut self.out, s.id, Reason::NoError);
        }
        self.budget = (self.budget + 1).min(RESET_BUDGET);
        self.close(slot);
    }

    fn close(&mut self, slot: usize) {
        let Some(s) = self.streams.remove(slot) else { return };
        // Bytes the stream received and not given back yet, taken or not.
        self.conn_released += s.unreleased;
        self.events.push_back(Event::Closed { slot });
    }

    /// Resets the stream in `slot` (a stream error, or a response that
    /// broke off).
    pub fn reset(&mut self, slot: usize, why: Reason) {
        let Some(s) = self.streams.get(slot) else { return };
        frame::put_rst(&mut self.out, s.id, why);
        self.close(slot);
    }

    fn stream_error(&mut self, id: u32, why: Reason) {
        match self.streams.slot_of(id) {
            Some(slot) => self.reset(slot, why),
            None => {
                // A stream the client has not opened (a bad PRIORITY frame
                // on it) is closed by the reset: it can never open later.
                // Found by the h2_conn fuzz target.
                if id % 2 == 1 && id > self.streams.last() {
                    self.streams.saw(id);
                }
                self.streams.remember_closed(id);
                frame::put_rst(&mut self.out, id, why);
            }
        }
    }

    /// GOAWAY, once: streams open go on, new ones are refused.
    pub fn go_away(&mut self, why: Reason) {
        if !self.goaway_sent {
            self.goaway_sent = true;
            frame::put_goaway(&mut self.out, self.streams.last(), why);
        }
    }

    fn connection_error(&mut self, why: Reason) {
        self.go_away(why);
        self.read_done = true;
        self.drop_streams();
    }

    fn drop_streams(&mut self) {
        for slot in 0..self.streams.slots() {
            self.close(slot);
        }
    }
}
