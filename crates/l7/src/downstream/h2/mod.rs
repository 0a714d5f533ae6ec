//! Gatehouse's own HTTP/2 server: one client connection, served by one
//! task. It serves clients that chose `h2` by ALPN and cleartext clients
//! that open with the HTTP/2 preface; requests go to
//! [`crate::proxy::handle`] like every other.
//!
//! This is the driver: the protocol is [`crate::h2::conn::Connection`],
//! which takes the bytes read and gives back frames to write and events.
//! The driver owns the socket, the timer and the streams' work: it runs
//! each stream's request ([`proxy::handle`]) and response body as futures
//! it polls itself, hands request bodies to their readers, and writes
//! every frame that is ready in one write: the responses of many streams
//! share TLS records and sends, with no task, channel or lock per stream.
//! Each stream slot has its own waker, which marks the slot ready and
//! wakes the task, so a wake polls only the streams that have something
//! to do.
//!
//! Input is read only while the output queued stays under
//! [`OUTPUT_HIGH`], so a client that sends without reading (PING or
//! SETTINGS floods) stops being read.

mod output;

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http::{Response, StatusCode};
use hyper::body::Body;
use tokio::io::{AsyncRead, AsyncWrite};

use self::output::Output;
use crate::accesslog::reason;
use crate::body::{ClientBody, ResponseBody};
use crate::downstream::conn::{ClientIo, ConnState};
use crate::downstream::ready::ReadySet;
use crate::downstream::recv;
pub use crate::h2::conn::Limits;
use crate::h2::conn::{Connection, Event, Sent};
use crate::h2::frame::Reason;
use crate::idle::poll_read_into;
use crate::proxy::{self, HeadWriter};

/// Output queued past which the client is not read until it takes some.
const OUTPUT_HIGH: usize = 256 * 1024;

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

/// What the driver holds for a stream slot.
struct Slot {
    task: Task,
    /// The request body's sending side, while the body is open.
    body: Option<recv::Sender>,
    waker: Waker,
}

struct Conn<T> {
    io: Pin<Box<ClientIo<T>>>,
    state: Arc<ConnState>,
    proto: Connection,
    input: BytesMut,
    out: Output,
    slots: Vec<Slot>,
    ready: Arc<ReadySet>,
    /// Slots to poll again once output drains.
    deferred: Vec<usize>,
    /// The slots taken from `ready` to poll, kept for its room.
    marked: Vec<usize>,
    /// The stall timer, armed while the client owes us reading or a
    /// window. It is moved lazily: re-armed when it fires before the
    /// deadline.
    stall: Pin<Box<tokio::time::Sleep>>,
    stall_armed: bool,
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
        let input = BytesMut::from(&prefix[..]);
        Conn {
            io,
            state,
            proto: Connection::new(limits),
            input,
            out: Output::default(),
            slots: Vec::new(),
            ready: ReadySet::new(limits.max_concurrent),
            deferred: Vec::new(),
            marked: Vec::new(),
            stall: Box::pin(tokio::time::sleep(limits.stall_timeout)),
            stall_armed: false,
        }
    }

    /// Waiting with nothing to read or write: the buffers go back to the
    /// worker, so an idle connection holds none (see `crate::idle`).
    fn let_go(&mut self) {
        if self.input.is_empty() {
            self.input = BytesMut::new();
        }
        if self.proto.output().is_empty() {
            output::give_back(std::mem::take(self.proto.output()));
        }
    }

    fn queued(&mut self) -> usize {
        self.out.queued(self.proto.output())
    }

    fn go_away(&mut self, why: Reason) {
        self.proto.go_away(why);
    }

    async fn run(&mut self) {
        while let Step::PutOffWrite = poll_fn(|cx| self.poll(cx)).await {
            tokio::task::yield_now().await;
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        self.ready.task.register(cx.waker());
        if self.proto.output().capacity() == 0 {
            *self.proto.output() = output::take_spare();
        }
        if self.proto.awaiting_preface() && !self.input.is_empty() {
            // Bytes read before this server took the connection (the
            // cleartext preface and what came with it).
            self.receive();
        }
        loop {
            let mut progress = false;
            // Everything the client sent first: a stream it reset in the
            // same read is never started.
            while !self.proto.read_done() && self.queued() < OUTPUT_HIGH {
                let read = match poll_read_into(self.io.as_mut(), cx, &mut self.input) {
                    Poll::Ready(r) => r,
                    Poll::Pending => break,
                };
                match read {
                    Ok(0) | Err(_) => {
                        self.proto.peer_gone();
                        self.events();
                    }
                    Ok(_) => self.receive(),
                }
                progress = true;
            }
            if !self.proto.read_done() {
                self.poll_streams();
            }
            self.proto.release_conn_window();
            let more_may_come = self.proto.open_streams() > 0;
            if !self.proto.read_done() && self.out.put_off(self.proto.output(), more_may_come) {
                return Poll::Ready(Step::PutOffWrite);
            }
            let wrote = match self.out.poll_write(self.proto.output(), self.io.as_mut(), cx) {
                Poll::Ready(Err(())) => return Poll::Ready(Step::Done),
                Poll::Ready(Ok(wrote)) => wrote,
                Poll::Pending => false,
            };
            progress |= wrote;
            if self.stalled(cx, wrote) {
                // The client stopped taking what it asked for.
                self.proto.peer_gone();
                self.events();
                return Poll::Ready(Step::Done);
            }
            if self.queued() == 0 && self.proto.finished() {
                let _ = self.io.as_mut().poll_shutdown(cx);
                return Poll::Ready(Step::Done);
            }
            if !progress && !self.any_ready() {
                self.let_go();
                return Poll::Pending;
            }
        }
    }

    /// Whether the client has owed us reading or a window for the stall
    /// timeout. `moved`: bytes went out in this poll.
    fn stalled(&mut self, cx: &mut Context<'_>, moved: bool) -> bool {
        use tokio::time::Instant;
        let queued = self.queued();
        let Some(deadline) = self.proto.stall_deadline(|| Instant::now().into_std(), queued, moved) else {
            self.stall_armed = false;
            return false;
        };
        let deadline = Instant::from_std(deadline);
        if !self.stall_armed {
            self.stall.as_mut().reset(deadline);
            self.stall_armed = true;
        }
        while self.stall.as_mut().poll(cx).is_ready() {
            if Instant::now() >= deadline {
                return true;
            }
            self.stall.as_mut().reset(deadline);
        }
        false
    }

    fn any_ready(&mut self) -> bool {
        (!self.deferred.is_empty() && self.queued() < OUTPUT_HIGH) || self.ready.any()
    }

    /// The bytes read go through the protocol, and what it says to do is
    /// done.
    fn receive(&mut self) {
        self.proto.receive(&mut self.input);
        self.events();
    }

    // ---- events ----

    fn events(&mut self) {
        while let Some(event) = self.proto.poll_event() {
            match event {
                Event::Request { slot, request, end, content_length } => self.start(slot, request, end, content_length),
                Event::Refused(status) => {
                    let why = if status == StatusCode::METHOD_NOT_ALLOWED {
                        reason::BAD_REQUEST
                    } else {
                        reason::HEAD_TOO_LARGE
                    };
                    self.state.log_rejected(status.as_u16(), why);
                }
                Event::Data { slot, data } => {
                    if let Some(body) = self.slots.get(slot).and_then(|s| s.body.as_ref()) {
                        body.data(data);
                    }
                }
                Event::End { slot, trailers } => {
                    if let Some(body) = self.slots.get_mut(slot).and_then(|s| s.body.take()) {
                        body.end(trailers);
                    }
                }
                Event::Closed { slot } => {
                    if let Some(s) = self.slots.get_mut(slot) {
                        // The request's work stops here; a body not
                        // ended fails for its reader.
                        s.task = Task::Done;
                        s.body = None;
                    }
                }
                Event::Wake { slot } => self.ready.mark(slot),
            }
        }
    }

    /// A new stream's request starts on its way to the upstream.
    fn start(&mut self, slot: usize, request: http::Request<()>, end: bool, content_length: Option<u64>) {
        while self.slots.len() <= slot {
            let waker = self.ready.waker(self.slots.len());
            self.slots.push(Slot { task: Task::Done, body: None, waker });
        }
        let s = &mut self.slots[slot];
        let (sender, body) = if end {
            (None, ClientBody::None)
        } else {
            let (tx, rx) = recv::channel(s.waker.clone(), content_length);
            (Some(tx), ClientBody::Stream(rx))
        };
        s.body = sender;
        let request = request.map(|()| body);
        s.task = Task::Handling(proxy::handle_boxed(request, self.state.clone(), HeadWriter::Map));
        self.ready.mark(slot);
    }

    // ---- streams ----

    fn poll_streams(&mut self) {
        if self.queued() < OUTPUT_HIGH {
            for slot in std::mem::take(&mut self.deferred) {
                self.ready.mark(slot);
            }
        }
        let mut marked = std::mem::take(&mut self.marked);
        self.ready.drain(|slot| marked.push(slot));
        for slot in marked.drain(..) {
            if self.proto.is_open(slot) && slot < self.slots.len() {
                self.poll_stream(slot);
                self.events();
            }
        }
        self.marked = marked;
    }

    fn poll_stream(&mut self, slot: usize) {
        let waker = self.slots[slot].waker.clone();
        let mut cx = Context::from_waker(&waker);
        loop {
            if self.queued() >= OUTPUT_HIGH {
                self.deferred.push(slot);
                break;
            }
            let proto = &mut self.proto;
            let s = &mut self.slots[slot];
            match &mut s.task {
                Task::Done => break,
                Task::Handling(fut) => {
                    let Poll::Ready(Ok(resp)) = fut.as_mut().poll(&mut cx) else { break };
                    let (parts, body) = resp.into_parts();
                    let end = body.is_end_stream();
                    s.task = if end { Task::Done } else { Task::Sending(body) };
                    proto.send_response(slot, parts.status, &parts.headers, end);
                }
                Task::Sending(body) => {
                    if proto.has_pending(slot) {
                        match proto.send_pending(slot) {
                            Sent::More => continue,
                            Sent::Ended => {
                                s.task = Task::Done;
                                continue;
                            }
                            Sent::Waiting => break,
                        }
                    }
                    match Pin::new(&mut *body).poll_frame(&mut cx) {
                        Poll::Pending => break,
                        Poll::Ready(None) => proto.queue_end(slot),
                        Poll::Ready(Some(Ok(f))) => match f.into_data() {
                            Ok(d) => {
                                let end = body.is_end_stream();
                                proto.queue_data(slot, d, end);
                            }
                            Err(f) => {
                                if let Ok(t) = f.into_trailers() {
                                    proto.queue_trailers(slot, t);
                                }
                            }
                        },
                        Poll::Ready(Some(Err(_))) => {
                            // The upstream broke off: the client must not
                            // take a cut-off body for a whole one.
                            proto.reset(slot, Reason::Internal);
                            return;
                        }
                    }
                }
            }
        }
        let taken = self.slots[slot].body.as_ref().map_or(0, recv::Sender::take_released);
        self.proto.released(slot, taken);
        self.proto.maybe_close(slot);
    }
}
