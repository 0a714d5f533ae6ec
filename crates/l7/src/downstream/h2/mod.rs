//! Gatehouse's own HTTP/2 server: one client connection, served by one
//! task. It serves clients that chose `h2` by ALPN and cleartext clients
//! that open with the HTTP/2 preface; requests go to
//! [`crate::proxy::handle`] like every other.
//!
//! The task reads frames, runs each stream's request ([`proxy::handle`])
//! and response body as futures it polls itself, and writes every frame
//! that is ready in one write: the responses of many streams share TLS
//! records and sends, with no task, channel or lock per stream. Each
//! stream slot has its own waker, which marks the slot ready and wakes the
//! task, so a wake polls only the streams that have something to do.
//!
//! Input is read only while the output queued stays under
//! [`OUTPUT_HIGH`], so a client that sends without reading (PING or
//! SETTINGS floods) stops being read. Streams the client opens and resets
//! before they finish, and streams refused for concurrency, draw on a
//! budget that finished responses refill; an empty budget ends the
//! connection with ENHANCE_YOUR_CALM (rapid reset, CVE-2023-44487). A
//! header block is bounded while it is gathered (CONTINUATION floods) and
//! while it is decoded (HPACK bombs: see [`super::request`]).

mod output;
pub mod recv;

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::task::AtomicWaker;
use http::{HeaderMap, Method, Response, StatusCode};
use hyper::body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use self::output::Output;
use crate::accesslog::reason;
use crate::body::ClientBody;
use crate::body::ResponseBody;
use crate::downstream::conn::{ClientIo, ConnState};
use crate::h1::hop_by_hop_bit;
use crate::h2::CONNECTION_SPECIFIC;
use crate::h2::frame::{self, Head, Reason};
use crate::h2::hpack::{self, Decoder, Encoder};
use crate::h2::request::{Fields, Refused};
use crate::proxy::{self, HeadWriter};

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
    pub stall_timeout: std::time::Duration,
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

/// Output queued past which the client is not read until it takes some.
const OUTPUT_HIGH: usize = 256 * 1024;
/// Bytes read at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Cancelled and refused streams allowed beyond those finished.
const RESET_BUDGET: i64 = 200;
/// Closed stream ids remembered, to tell a HEADERS on a closed stream
/// (STREAM_CLOSED) from one on a stream never opened (PROTOCOL_ERROR).
const CLOSED_REMEMBERED: usize = 64;

type Handling = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, std::convert::Infallible>> + Send>>;

// A response body sits in its slot as it is: slots are made only as the
// client opens streams and are reused, so its size is paid once per slot,
// where a box would be an allocation per response.
#[allow(clippy::large_enum_variant)]
enum Task {
    Handling(Handling),
    Sending(ResponseBody),
    Done,
}

struct Stream {
    id: u32,
    task: Task,
    /// The client ended its side (END_STREAM), or it will send nothing
    /// more that matters.
    remote_closed: bool,
    /// The response ended (END_STREAM or RST_STREAM sent).
    local_closed: bool,
    send_window: i64,
    /// Response data not yet sent for want of window, and whether the body
    /// ended with it.
    pending: Bytes,
    pending_end: bool,
    pending_trailers: Option<HeaderMap>,
    /// Request body.
    body: Option<recv::Sender>,
    recv_window: i64,
    /// Request body bytes taken and not yet given back to its window.
    unacked: i64,
    /// Request body bytes received and not yet given back to the
    /// connection's window: given back as they are taken, and all at
    /// once when the stream closes (a response that ends before its
    /// request body leaves bytes no one will take).
    unreleased: usize,
    content_length: Option<u64>,
    received: u64,
}

/// Which slots' wakers fired since the connection last looked.
struct ReadySet {
    bits: Box<[AtomicU64]>,
    task: AtomicWaker,
}

struct SlotWaker {
    set: Arc<ReadySet>,
    slot: usize,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.set.bits[self.slot / 64].fetch_or(1 << (self.slot % 64), Ordering::AcqRel);
        self.set.task.wake();
    }
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

struct Conn<T> {
    io: Pin<Box<ClientIo<T>>>,
    state: Arc<ConnState>,
    limits: Limits,
    input: BytesMut,
    preface_done: bool,
    settings_seen: bool,
    out: Output,
    decoder: Decoder,
    encoder: Encoder,
    block: Option<Block>,
    peer_max_frame: usize,
    peer_initial_window: i64,
    conn_send_window: i64,
    conn_recv_window: i64,
    /// Request body bytes taken (or dropped) and not yet given back to the
    /// connection's window.
    conn_released: usize,
    slots: Vec<Option<Stream>>,
    /// Each slot's stream id (0: free), apart so a lookup scans 1 KiB.
    ids: Vec<u32>,
    wakers: Vec<Option<Waker>>,
    free: Vec<usize>,
    open: usize,
    ready: Arc<ReadySet>,
    /// Slots with data waiting for the connection's send window.
    conn_blocked: Vec<usize>,
    /// Slots to poll again once output drains.
    deferred: Vec<usize>,
    last_stream: u32,
    closed: VecDeque<u32>,
    budget: i64,
    goaway_sent: bool,
    /// A stream waits for the client to open a window.
    window_wait: bool,
    /// The client opened a window since the last poll.
    window_opened: bool,
    /// Armed while the client owes us reading or a window: when it last
    /// moved, plus the stall timeout. The timer is moved lazily: it is
    /// re-armed when it fires before the deadline.
    stall_deadline: Option<tokio::time::Instant>,
    stall: Pin<Box<tokio::time::Sleep>>,
    /// After a connection error or the end of input: nothing more is read.
    read_done: bool,
    peer_goaway: bool,
}

/// Serves an HTTP/2 connection to its end. `prefix`: bytes already read
/// (on cleartext, the preface that told HTTP/2 from HTTP/1.1).
pub async fn serve<T>(
    io: Pin<Box<ClientIo<T>>>,
    prefix: Bytes,
    state: Arc<ConnState>,
    limits: Limits,
    drain: &mut tokio::sync::watch::Receiver<bool>,
) where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let mut conn = Conn::new(io, prefix, state, limits);
    tokio::select! {
        _ = conn.run() => return,
        _ = drain.wait_for(|d| *d) => {}
    }
    conn.go_away(Reason::NoError);
    conn.run().await;
}

/// Why [`Conn::poll`] returned.
enum Step {
    Done,
    /// Write after the runtime has looked for I/O once more.
    PutOffWrite,
}

impl<T: AsyncRead + AsyncWrite> Conn<T> {
    fn new(io: Pin<Box<ClientIo<T>>>, prefix: Bytes, state: Arc<ConnState>, limits: Limits) -> Self {
        let words = limits.max_concurrent.div_ceil(64);
        let mut out = Output::default();
        frame::put_settings(
            &mut out.buf,
            &[
                (frame::SETTINGS_ENABLE_PUSH, 0),
                (frame::SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent as u32),
                (frame::SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window),
                (frame::SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list as u32),
            ],
        );
        let conn_extra = limits.conn_window.saturating_sub(frame::DEFAULT_WINDOW as u32);
        if conn_extra > 0 {
            frame::put_window_update(&mut out.buf, 0, conn_extra);
        }
        let mut input = BytesMut::with_capacity(READ_CHUNK);
        input.extend_from_slice(&prefix);
        Conn {
            io,
            state,
            limits,
            input,
            preface_done: false,
            settings_seen: false,
            out,
            decoder: Decoder::default(),
            encoder: Encoder::default(),
            block: None,
            peer_max_frame: frame::DEFAULT_MAX_FRAME,
            peer_initial_window: frame::DEFAULT_WINDOW,
            conn_send_window: frame::DEFAULT_WINDOW,
            conn_recv_window: frame::DEFAULT_WINDOW + i64::from(conn_extra),
            conn_released: 0,
            slots: Vec::new(),
            ids: Vec::new(),
            wakers: Vec::new(),
            free: Vec::new(),
            open: 0,
            ready: Arc::new(ReadySet {
                bits: (0..words).map(|_| AtomicU64::new(0)).collect(),
                task: AtomicWaker::new(),
            }),
            conn_blocked: Vec::new(),
            deferred: Vec::new(),
            last_stream: 0,
            closed: VecDeque::with_capacity(CLOSED_REMEMBERED),
            budget: RESET_BUDGET,
            goaway_sent: false,
            window_wait: false,
            window_opened: false,
            stall_deadline: None,
            stall: Box::pin(tokio::time::sleep(limits.stall_timeout)),
            read_done: false,
            peer_goaway: false,
        }
    }

    fn queued(&self) -> usize {
        self.out.queued()
    }

    async fn run(&mut self) {
        while let Step::PutOffWrite = poll_fn(|cx| self.poll(cx)).await {
            tokio::task::yield_now().await;
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        self.ready.task.register(cx.waker());
        if !self.preface_done && !self.input.is_empty() {
            // Bytes read before this server took the connection (the
            // cleartext preface and what came with it).
            if let Err(ConnError(why)) = self.process_input() {
                self.connection_error(why);
            }
        }
        loop {
            let mut progress = false;
            // Everything the client sent first: a stream it reset in the
            // same read is never started.
            while !self.read_done && self.queued() < OUTPUT_HIGH {
                if self.input.capacity() - self.input.len() < READ_CHUNK / 2 {
                    self.input.reserve(READ_CHUNK);
                }
                let read = match tokio_util::io::poll_read_buf(self.io.as_mut(), cx, &mut self.input) {
                    Poll::Ready(r) => r,
                    Poll::Pending => break,
                };
                match read {
                    Ok(0) | Err(_) => {
                        // The client is gone, or idled out (then GOAWAY
                        // says so, if it still listens); nothing it asked
                        // for can reach it.
                        self.go_away(Reason::NoError);
                        self.read_done = true;
                        self.drop_streams();
                    }
                    Ok(_) => {
                        if let Err(ConnError(why)) = self.process_input() {
                            self.connection_error(why);
                        }
                    }
                }
                progress = true;
            }
            if !self.read_done {
                self.poll_streams();
            }
            self.release_conn_window();
            if !self.read_done && self.out.put_off(self.open > 0) {
                return Poll::Ready(Step::PutOffWrite);
            }
            let wrote = match self.out.poll_write(self.io.as_mut(), cx) {
                Poll::Ready(Err(())) => return Poll::Ready(Step::Done),
                Poll::Ready(Ok(wrote)) => wrote,
                Poll::Pending => false,
            };
            progress |= wrote;
            if self.stalled(cx, wrote) {
                // The client stopped taking what it asked for.
                self.read_done = true;
                self.drop_streams();
                return Poll::Ready(Step::Done);
            }
            if self.queued() == 0 && self.finished() {
                let _ = self.io.as_mut().poll_shutdown(cx);
                return Poll::Ready(Step::Done);
            }
            if !progress && !self.any_ready() {
                return Poll::Pending;
            }
        }
    }

    /// Whether the client has owed us reading or a window for the stall
    /// timeout. `moved`: bytes went out in this poll.
    fn stalled(&mut self, cx: &mut Context<'_>, moved: bool) -> bool {
        use tokio::time::Instant;
        let waiting = self.queued() > 0 || self.window_wait;
        let moved = moved || std::mem::take(&mut self.window_opened);
        if !waiting {
            self.stall_deadline = None;
            return false;
        }
        if moved || self.stall_deadline.is_none() {
            let deadline = Instant::now() + self.limits.stall_timeout;
            if self.stall_deadline.is_none() {
                self.stall.as_mut().reset(deadline);
            }
            self.stall_deadline = Some(deadline);
        }
        let Some(deadline) = self.stall_deadline else { return false };
        while self.stall.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                return true;
            }
            self.stall.as_mut().reset(deadline);
        }
        false
    }

    /// Whether the connection has nothing left to do.
    fn finished(&self) -> bool {
        self.read_done || ((self.goaway_sent || self.peer_goaway) && self.open == 0)
    }

    fn any_ready(&self) -> bool {
        (!self.deferred.is_empty() && self.queued() < OUTPUT_HIGH)
            || self.ready.bits.iter().any(|w| w.load(Ordering::Acquire) != 0)
    }

    // ---- input ----

    fn process_input(&mut self) -> Result<(), ConnError> {
        if !self.preface_done {
            let n = self.input.len().min(frame::PREFACE.len());
            if self.input[..n] != frame::PREFACE[..n] {
                return Err(ConnError(Reason::Protocol));
            }
            if n < frame::PREFACE.len() {
                return Ok(());
            }
            self.input.advance(n);
            self.preface_done = true;
        }
        while !self.read_done {
            let Some(head) = Head::parse(&self.input) else { return Ok(()) };
            if head.len > frame::DEFAULT_MAX_FRAME {
                return Err(ConnError(Reason::FrameSize));
            }
            if self.input.len() < frame::HEADER_LEN + head.len {
                return Ok(());
            }
            self.input.advance(frame::HEADER_LEN);
            let payload = self.input.split_to(head.len).freeze();
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
                    frame::put_ping_ack(&mut self.out.buf, &payload);
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

    fn slot_of(&self, id: u32) -> Option<usize> {
        if id == 0 || id > self.last_stream {
            return None;
        }
        self.ids.iter().position(|&i| i == id)
    }

    fn stream(&mut self, slot: usize) -> &mut Stream {
        match &mut self.slots[slot] {
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
        if head.stream == 0 || head.stream > self.last_stream {
            return Err(ConnError(Reason::Protocol));
        }
        let len = head.len as i64;
        if len > self.conn_recv_window {
            return Err(ConnError(Reason::FlowControl));
        }
        self.conn_recv_window -= len;
        let data = Self::unpad(&head, payload)?;
        let Some(slot) = self.slot_of(head.stream) else {
            // A closed stream: its bytes go back to the connection's window.
            self.conn_released += head.len;
            self.stream_error(head.stream, Reason::StreamClosed);
            return Ok(());
        };
        // Padding is never taken by anyone: given back at once.
        self.conn_released += head.len - data.len();
        let end = head.has(frame::END_STREAM);
        let s = self.stream(slot);
        if s.remote_closed || s.body.is_none() {
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
        if let Some(body) = &s.body {
            if !data.is_empty() {
                body.data(data);
            }
            if end {
                body.end(None);
            }
        }
        if end {
            s.remote_closed = true;
            s.body = None;
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
        if id <= self.last_stream {
            let Some(slot) = self.slot_of(id) else {
                self.decode(bytes, &mut Fields::new(true, usize::MAX, usize::MAX))?;
                return Err(ConnError(if self.closed.contains(&id) { Reason::StreamClosed } else { Reason::Protocol }));
            };
            let mut fields = Fields::new(true, self.limits.max_header_list, self.limits.max_fields);
            self.decode(bytes, &mut fields)?;
            let s = self.stream(slot);
            if s.remote_closed {
                self.stream_error(id, Reason::StreamClosed);
                return Ok(());
            }
            let short = s.content_length.is_some_and(|cl| s.received != cl);
            if !block.end_stream || short {
                self.stream_error(id, Reason::Protocol);
                return Ok(());
            }
            let trailers = match fields.into_trailers() {
                Ok(t) => t,
                Err(_) => {
                    self.stream_error(id, Reason::Protocol);
                    return Ok(());
                }
            };
            let s = self.stream(slot);
            if let Some(body) = s.body.take() {
                body.end(Some(trailers));
            }
            s.remote_closed = true;
            self.maybe_close(slot);
            return Ok(());
        }

        // A new stream.
        let mut fields = Fields::new(false, self.limits.max_header_list, self.limits.max_fields);
        self.decode(bytes, &mut fields)?;
        self.last_stream = id;
        if block.self_dependent {
            self.remember_closed(id);
            frame::put_rst(&mut self.out.buf, id, Reason::Protocol);
            return Ok(());
        }
        if self.goaway_sent {
            // Past the last stream GOAWAY promised to serve.
            self.remember_closed(id);
            frame::put_rst(&mut self.out.buf, id, Reason::RefusedStream);
            return Ok(());
        }
        let Some(slot) = self.free.pop().or_else(|| self.new_slot()) else {
            self.remember_closed(id);
            frame::put_rst(&mut self.out.buf, id, Reason::RefusedStream);
            return self.spend_budget();
        };
        let waker = self.wakers[slot]
            .get_or_insert_with(|| Waker::from(Arc::new(SlotWaker { set: self.ready.clone(), slot })))
            .clone();
        let content_length = fields.content_length;
        let end = block.end_stream;
        let (sender, body) = if end {
            (None, ClientBody::None)
        } else {
            let (tx, rx) = recv::channel(waker.clone(), content_length);
            (Some(tx), ClientBody::H2(rx))
        };
        let mut stream = Stream {
            id,
            task: Task::Done,
            remote_closed: end,
            local_closed: false,
            send_window: self.peer_initial_window,
            pending: Bytes::new(),
            pending_end: false,
            pending_trailers: None,
            body: sender,
            recv_window: i64::from(self.limits.stream_window),
            unacked: 0,
            unreleased: 0,
            content_length,
            received: 0,
        };
        self.slots[slot] = None;
        self.ids[slot] = id;
        self.open += 1;
        match fields.into_request(body) {
            Ok(req) if req.method() == Method::CONNECT => {
                self.slots[slot] = Some(stream);
                self.state.log_rejected(405, reason::BAD_REQUEST);
                self.respond_directly(slot, StatusCode::METHOD_NOT_ALLOWED);
            }
            Ok(req) if end && content_length.is_some_and(|cl| cl > 0) => {
                drop(req);
                self.slots[slot] = Some(stream);
                self.stream_error_at(slot, Reason::Protocol);
            }
            Ok(req) => {
                stream.task = Task::Handling(Box::pin(proxy::handle(req, self.state.clone(), HeadWriter::Map)));
                self.slots[slot] = Some(stream);
                self.mark_ready(slot);
            }
            Err(Refused::TooLarge) => {
                self.slots[slot] = Some(stream);
                self.state.log_rejected(431, reason::HEAD_TOO_LARGE);
                self.respond_directly(slot, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
            }
            Err(Refused::Malformed) => {
                self.slots[slot] = Some(stream);
                self.stream_error_at(slot, Reason::Protocol);
            }
        }
        Ok(())
    }

    fn rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if head.stream == 0 || head.stream > self.last_stream {
            return Err(ConnError(Reason::Protocol));
        }
        if payload.len() != 4 {
            return Err(ConnError(Reason::FrameSize));
        }
        if let Some(slot) = self.slot_of(head.stream) {
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
                    let value = i64::from(value);
                    if value > frame::MAX_WINDOW {
                        return Err(ConnError(Reason::FlowControl));
                    }
                    let delta = value - self.peer_initial_window;
                    self.peer_initial_window = value;
                    for slot in 0..self.slots.len() {
                        let Some(s) = &mut self.slots[slot] else { continue };
                        s.send_window += delta;
                        if s.send_window > frame::MAX_WINDOW {
                            return Err(ConnError(Reason::FlowControl));
                        }
                        if delta > 0 {
                            self.mark_ready(slot);
                            self.window_opened();
                        }
                    }
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(16_384..=16_777_215).contains(&value) {
                        return Err(ConnError(Reason::Protocol));
                    }
                    self.peer_max_frame = value as usize;
                }
                frame::SETTINGS_HEADER_TABLE_SIZE => self.encoder.set_peer_table_size(value as usize),
                // The server pushes nothing, and the rest
                // bound what the client receives from us only.
                _ => {}
            }
        }
        frame::put_settings_ack(&mut self.out.buf);
        Ok(())
    }

    fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<(), ConnError> {
        if payload.len() != 4 {
            return Err(ConnError(Reason::FrameSize));
        }
        let inc = i64::from(u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff);
        if head.stream == 0 {
            if inc == 0 {
                return Err(ConnError(Reason::Protocol));
            }
            self.conn_send_window += inc;
            if self.conn_send_window > frame::MAX_WINDOW {
                return Err(ConnError(Reason::FlowControl));
            }
            for slot in std::mem::take(&mut self.conn_blocked) {
                self.mark_ready(slot);
            }
            self.window_opened();
            return Ok(());
        }
        if head.stream > self.last_stream {
            return Err(ConnError(Reason::Protocol));
        }
        let Some(slot) = self.slot_of(head.stream) else { return Ok(()) };
        if inc == 0 {
            self.stream_error_at(slot, Reason::Protocol);
            return Ok(());
        }
        let s = self.stream(slot);
        s.send_window += inc;
        if s.send_window > frame::MAX_WINDOW {
            self.stream_error_at(slot, Reason::FlowControl);
            return Ok(());
        }
        self.mark_ready(slot);
        self.window_opened();
        Ok(())
    }

    /// Streams held for a window go again (and set `window_wait` again
    /// if still held).
    fn window_opened(&mut self) {
        self.window_wait = false;
        self.window_opened = true;
    }

    fn spend_budget(&mut self) -> Result<(), ConnError> {
        self.budget -= 1;
        if self.budget <= 0 { Err(ConnError(Reason::EnhanceYourCalm)) } else { Ok(()) }
    }

    // ---- streams ----

    fn mark_ready(&self, slot: usize) {
        self.ready.bits[slot / 64].fetch_or(1 << (slot % 64), Ordering::AcqRel);
    }

    fn poll_streams(&mut self) {
        if self.queued() < OUTPUT_HIGH {
            for slot in std::mem::take(&mut self.deferred) {
                self.mark_ready(slot);
            }
        }
        for w in 0..self.ready.bits.len() {
            let mut bits = self.ready.bits[w].swap(0, Ordering::AcqRel);
            while bits != 0 {
                let slot = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if self.slots.get(slot).is_some_and(Option::is_some) {
                    self.poll_stream(slot);
                }
            }
        }
    }

    fn poll_stream(&mut self, slot: usize) {
        let Some(waker) = self.wakers[slot].clone() else { return };
        let mut cx = Context::from_waker(&waker);
        loop {
            if self.queued() >= OUTPUT_HIGH {
                self.deferred.push(slot);
                break;
            }
            let Some(s) = &mut self.slots[slot] else { break };
            match &mut s.task {
                Task::Done => break,
                Task::Handling(fut) => {
                    let Poll::Ready(Ok(resp)) = fut.as_mut().poll(&mut cx) else { break };
                    let (parts, body) = resp.into_parts();
                    let end = body.is_end_stream();
                    let id = s.id;
                    s.task = if end { Task::Done } else { Task::Sending(body) };
                    s.local_closed = end;
                    write_fields(
                        &mut self.out.buf,
                        &mut self.encoder,
                        (id, Some(parts.status)),
                        &parts.headers,
                        end,
                        self.peer_max_frame,
                    );
                }
                Task::Sending(body) => {
                    if !s.pending.is_empty() || s.pending_end || s.pending_trailers.is_some() {
                        if self.send_pending(slot) {
                            continue;
                        }
                        break;
                    }
                    match Pin::new(&mut *body).poll_frame(&mut cx) {
                        Poll::Pending => break,
                        Poll::Ready(None) => s.pending_end = true,
                        Poll::Ready(Some(Ok(f))) => match f.into_data() {
                            Ok(d) => {
                                s.pending_end = body.is_end_stream();
                                s.pending = d;
                            }
                            Err(f) => {
                                if let Ok(t) = f.into_trailers() {
                                    s.pending_trailers = Some(t);
                                }
                            }
                        },
                        Poll::Ready(Some(Err(_))) => {
                            // The upstream broke off: the client must not
                            // take a cut-off body for a whole one.
                            self.stream_error_at(slot, Reason::Internal);
                            return;
                        }
                    }
                }
            }
        }
        self.release_stream_window(slot);
        self.maybe_close(slot);
    }

    /// Sends what the windows allow of a stream's pending data, then its
    /// end. `false`: it waits for a window.
    fn send_pending(&mut self, slot: usize) -> bool {
        let max_frame = self.peer_max_frame;
        let Some(s) = &mut self.slots[slot] else { return false };
        while !s.pending.is_empty() {
            let allowed = s.send_window.min(self.conn_send_window);
            if allowed <= 0 {
                self.window_wait = true;
                if self.conn_send_window <= 0 {
                    self.conn_blocked.push(slot);
                }
                return false;
            }
            let n = (allowed as usize).min(max_frame).min(s.pending.len());
            let chunk = s.pending.split_to(n);
            let end = s.pending.is_empty() && s.pending_end && s.pending_trailers.is_none();
            frame::put_data(&mut self.out.buf, s.id, &chunk, end);
            s.send_window -= n as i64;
            self.conn_send_window -= n as i64;
            if end {
                s.pending_end = false;
                s.local_closed = true;
                s.task = Task::Done;
                return true;
            }
        }
        if let Some(t) = s.pending_trailers.take() {
            write_fields(&mut self.out.buf, &mut self.encoder, (s.id, None), &t, true, max_frame);
            s.local_closed = true;
            s.task = Task::Done;
        } else if s.pending_end {
            frame::put_data(&mut self.out.buf, s.id, &[], true);
            s.pending_end = false;
            s.local_closed = true;
            s.task = Task::Done;
        }
        true
    }

    /// Request body bytes the upstream took go back to the client's
    /// windows, in updates of at least half a window.
    fn release_stream_window(&mut self, slot: usize) {
        let window = i64::from(self.limits.stream_window);
        let Some(s) = &mut self.slots[slot] else { return };
        let Some(body) = &s.body else { return };
        let taken = body.take_released();
        self.conn_released += taken;
        s.unreleased = s.unreleased.saturating_sub(taken);
        s.unacked += taken as i64;
        if s.unacked >= window / 2 && !s.remote_closed {
            frame::put_window_update(&mut self.out.buf, s.id, s.unacked as u32);
            s.recv_window += s.unacked;
            s.unacked = 0;
        }
    }

    fn release_conn_window(&mut self) {
        let window = i64::from(self.limits.conn_window);
        if self.conn_released > 0 && (self.conn_released as i64) >= window / 4 && !self.read_done {
            frame::put_window_update(&mut self.out.buf, 0, self.conn_released as u32);
            self.conn_recv_window += self.conn_released as i64;
            self.conn_released = 0;
        }
    }

    /// A direct answer with no body: 405 for CONNECT, 431 for a request
    /// over the header limits.
    fn respond_directly(&mut self, slot: usize, status: StatusCode) {
        let max_frame = self.peer_max_frame;
        let s = self.stream(slot);
        let id = s.id;
        s.local_closed = true;
        write_fields(&mut self.out.buf, &mut self.encoder, (id, Some(status)), &HeaderMap::new(), true, max_frame);
        self.maybe_close(slot);
    }

    /// Frees a stream once both sides are done; a response that ended
    /// before the request body tells the client to stop sending.
    fn maybe_close(&mut self, slot: usize) {
        let Some(s) = &self.slots[slot] else { return };
        if !s.local_closed {
            return;
        }
        if !s.remote_closed {
            frame::put_rst(&mut self.out.buf, s.id, Reason::NoError);
        }
        self.budget = (self.budget + 1).min(RESET_BUDGET);
        self.close(slot);
    }

    fn close(&mut self, slot: usize) {
        let Some(s) = self.slots[slot].take() else { return };
        self.ids[slot] = 0;
        // Bytes the stream received and not given back yet, taken or not.
        self.conn_released += s.unreleased;
        self.open -= 1;
        self.free.push(slot);
        self.remember_closed(s.id);
        drop(s);
    }

    /// A slot more, while under the concurrency limit: a connection holds
    /// as many as it has had streams open at once.
    fn new_slot(&mut self) -> Option<usize> {
        let slot = self.slots.len();
        if slot >= self.limits.max_concurrent {
            return None;
        }
        self.slots.push(None);
        self.ids.push(0);
        self.wakers.push(None);
        Some(slot)
    }

    fn remember_closed(&mut self, id: u32) {
        if self.closed.len() == CLOSED_REMEMBERED {
            self.closed.pop_front();
        }
        self.closed.push_back(id);
    }

    fn stream_error_at(&mut self, slot: usize, why: Reason) {
        let id = self.stream(slot).id;
        frame::put_rst(&mut self.out.buf, id, why);
        self.close(slot);
    }

    fn stream_error(&mut self, id: u32, why: Reason) {
        match self.slot_of(id) {
            Some(slot) => self.stream_error_at(slot, why),
            None => frame::put_rst(&mut self.out.buf, id, why),
        }
    }

    fn go_away(&mut self, why: Reason) {
        if !self.goaway_sent {
            self.goaway_sent = true;
            frame::put_goaway(&mut self.out.buf, self.last_stream, why);
        }
    }

    fn connection_error(&mut self, why: Reason) {
        self.go_away(why);
        self.read_done = true;
        self.drop_streams();
    }

    fn drop_streams(&mut self) {
        for slot in 0..self.slots.len() {
            self.close(slot);
        }
    }
}

/// A response head (`status`) or trailers (`None`) as HEADERS and, past
/// the client's frame size, CONTINUATION frames. Fields that mean
/// something only to one HTTP/1.1 connection are left out: responses made
/// here may carry `Connection: close`.
fn write_fields(
    out: &mut Vec<u8>,
    encoder: &mut Encoder,
    (id, status): (u32, Option<StatusCode>),
    fields: &HeaderMap,
    end: bool,
    max_frame: usize,
) {
    BLOCK.with_borrow_mut(|block| {
        block.clear();
        encoder.begin_block(block);
        if let Some(status) = status {
            hpack::encode_status(block, status.as_u16());
        }
        for (name, value) in fields {
            if hop_by_hop_bit(name) & CONNECTION_SPECIFIC == 0 {
                encoder.field(block, name.as_str(), value.as_bytes());
            }
        }
        frame::put_headers(out, id, block, end, max_frame);
    });
}

thread_local! {
    /// The worker's scratch buffer for one header block.
    static BLOCK: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
