//! One QUIC connection and its HTTP/3 requests, driven by one task.
//!
//! The task owns quiche's connection and Gatehouse's HTTP/3 layer over it
//! ([`Http3`]). Datagrams come from the endpoint through its inbox;
//! packets go out from the task itself, a connection's run of equal-sized
//! packets as one UDP GSO send. As the HTTP/2 server does, the task polls
//! each stream's request (`proxy::handle`) and response body as futures
//! of its own, with a waker per stream slot ([`ReadySet`]), and hands
//! request bodies to their readers through `recv` ([`read`]), reading
//! from quiche only as fast as the upstream takes them: quiche's flow
//! control then holds the client back.

use std::future::{Future, poll_fn};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response};
use hyper::body::Body;
use rustc_hash::FxHashMap;

#[cfg(test)]
mod cid_tests;
mod read;
mod report;

use super::http3::{Fault, Http3, Unsent};
use super::inbox::Receiver;
use super::io::MAX_DATAGRAM;
use super::io::{Datagram, Endpoint, Io, send_scratch};
use super::listener::QuicListener;
use super::pace::{Pacer, Window};
use super::room::Waiting;
use super::stream_buf::{Quic, compact};
use crate::body::ResponseBody;
use crate::context::Worker;
use crate::downstream::conn::{ConnState, Open};
use crate::downstream::ready::ReadySet;
use crate::downstream::recv;
use crate::downstream::tls::quic_handshake;
use crate::metrics::HandshakeResult;

use crate::h3::frame::code;

/// Request body bytes read from quiche and not yet taken by the upstream,
/// past which the stream is not read (quiche's window then fills and the
/// client waits).
const BODY_AHEAD: usize = 256 * 1024;
/// Response bodies of a known length up to this many bytes go out with
/// their head when all of them came with it (`Http3::send_whole`).
const WHOLE_WITH_HEAD: u64 = 4096;
/// Datagrams received in one poll before the task looks at its streams.
const INPUT_PER_POLL: usize = 64;

type Handling = Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, std::convert::Infallible>> + Send>>;

/// A stream's work. The response lives in a box of its own from the
/// moment the handler gives it, so that a slot stays small (a response
/// with its upstream body is about 670 bytes) and its steps move a pointer,
/// not the response. HTTP/2's server keeps its body inline instead: its
/// slots live as long as the connection, so their size is paid once, where
/// these are freed whenever the connection has no request and made again.
enum Task {
    Handling(Handling),
    /// A response whose head quiche could not take yet.
    Head(Box<Response<ResponseBody>>),
    /// A response whose head is sent: its body is.
    Sending(Box<Response<ResponseBody>>),
    /// Body sent; trailers waiting for room.
    Trailers(Box<HeaderMap>),
    Done,
}

struct Slot {
    stream: u64,
    task: Task,
    /// The request body's sending side, while the body is open.
    body: Option<recv::Sender>,
    /// Body bytes handed to the reader and not yet taken.
    ahead: usize,
    /// quiche holds body bytes not read yet.
    unread: bool,
    /// A chunk of the response body quiche took only part of.
    pending: Option<(Bytes, bool)>,
    waker: Waker,
}

/// What the endpoint gives a new connection.
pub struct Start {
    pub quic: Quic,
    pub rx: Receiver<Datagram>,
    pub io: Arc<Io>,
    pub endpoint: Arc<Endpoint>,
    pub listener: Arc<QuicListener>,
    pub worker: Arc<Worker>,
    pub open: Open,
    pub peer: SocketAddr,
    pub listener_index: usize,
    pub listener_name: Arc<str>,
    /// Connection IDs routed to this connection so far.
    pub cids: Vec<Vec<u8>>,
}

struct Conn {
    /// Counts the connection open until it is dropped.
    _open: Open,
    quic: Quic,
    h3: Option<Http3>,
    /// Request streams whose data came in 0-RTT packets (replayable),
    /// until their head is read.
    early: Vec<u64>,
    rx: Receiver<Datagram>,
    io: Arc<Io>,
    endpoint: Arc<Endpoint>,
    listener: Arc<QuicListener>,
    worker: Arc<Worker>,
    state: Option<Arc<ConnState>>,
    peer: SocketAddr,
    listener_index: usize,
    listener_name: Arc<str>,
    cids: Vec<Vec<u8>>,
    slots: Vec<Option<Slot>>,
    /// The most slots the connection held at once in its last busy spell:
    /// the room the next one starts with, in one allocation rather than
    /// a vector (and a map) grown step by step.
    busiest: usize,
    /// By stream ID (FxHash: quiche admits only IDs within the stream
    /// limit, so a client cannot pile IDs into one bucket).
    by_stream: FxHashMap<u64, usize>,
    ready: Arc<ReadySet>,
    /// Slots whose stream had no room for what they had to send.
    blocked: Waiting,
    /// The slots to poll, kept for its room.
    marked: Vec<usize>,
    /// Wakes the task for quiche's timers and for the pacer.
    timer: Pin<Box<tokio::time::Sleep>>,
    /// When quiche's next timer is due, as last asked.
    quic_due: Option<std::time::Instant>,
    pacer: Pacer,
    /// When the pacer lets the next packet go, if it held one back.
    paced: Option<std::time::Instant>,
    drain: Pin<Box<dyn Future<Output = ()> + Send>>,
    draining: bool,
    /// Packets quiche made that the socket did not take yet.
    unsent: Vec<(Vec<u8>, SocketAddr, SocketAddr)>,
    handshake_counted: bool,
    /// Tells the worker's batcher a handshake is under way, until it ends.
    batching: Option<gatehouse_keyops::batcher::Handshake>,
    /// The handshake's version and cipher, once it is done.
    tls_info: (&'static str, &'static str),
    /// Room for the IDs of the streams quiche has data for.
    readable: Vec<u64>,
    /// Highest client stream seen, for GOAWAY.
    last_stream: Option<u64>,
    /// Streams whose whole response is with quiche, until the client has
    /// it: a drain closes the connection only then, as a close drops
    /// what quiche has not delivered.
    sent: Vec<u64>,
    /// quiche's counters as last added to the listener's metrics, and when.
    reported: crate::metrics::QuicCounts,
    reported_at: std::time::Instant,
}

/// The connection's task. Its state is boxed and made before the task
/// starts: an `async fn` would keep its argument twice over (as the
/// argument and as the local it is moved into) beside the state made from
/// it, three copies of quiche's connection (about 8 KB each) in every
/// task's memory for the connection's whole life.
pub fn run(start: Start) -> impl Future<Output = ()> + Send {
    let mut conn = Box::new(Conn::new(start));
    async move {
        poll_fn(|cx| quic_handshake::with(cx.waker(), || conn.poll(cx))).await;
        conn.finish();
    }
}

impl Conn {
    fn new(start: Start) -> Conn {
        let max_slots = start.listener.max_streams as usize + 16;
        let shared = start.worker.shared.clone();
        let id = start.worker.id;
        let drain = Box::pin(async move {
            let notified = shared.drained(id);
            if shared.is_draining() {
                return;
            }
            notified.await;
        });
        start.endpoint.handshakes.fetch_add(1, Ordering::Relaxed);
        Conn {
            _open: start.open,
            quic: start.quic,
            h3: None,
            early: Vec::new(),
            rx: start.rx,
            io: start.io,
            endpoint: start.endpoint,
            listener: start.listener,
            worker: start.worker,
            state: None,
            peer: start.peer,
            listener_index: start.listener_index,
            listener_name: start.listener_name,
            cids: start.cids,
            slots: Vec::new(),
            busiest: 0,
            by_stream: FxHashMap::default(),
            ready: ReadySet::new(max_slots),
            blocked: Waiting::default(),
            marked: Vec::new(),
            timer: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
            quic_due: None,
            pacer: Pacer::default(),
            paced: None,
            drain,
            draining: false,
            unsent: Vec::new(),
            handshake_counted: false,
            batching: Some(gatehouse_keyops::batcher::handshake_begins()),
            tls_info: ("TLSv1.3", "-"),
            readable: Vec::new(),
            last_stream: None,
            sent: Vec::new(),
            reported: [0; 6],
            reported_at: std::time::Instant::now(),
        }
    }
}

impl Conn {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.ready.task.register(cx.waker());
        loop {
            let mut progress = false;
            let mut input = 0;
            while input < INPUT_PER_POLL {
                match self.rx.poll_recv(cx) {
                    Poll::Ready(Some(mut d)) => {
                        let info = quiche::RecvInfo { from: d.from, to: d.to };
                        // A packet quiche refuses is dropped; the
                        // connection's own errors close it in quiche.
                        let _ = self.quic.recv(&mut d.data, info);
                        input += 1;
                        if self.quic.is_in_early_data() {
                            // Packet by packet: the one that ends the
                            // handshake may come in the same batch, and
                            // what came before it is still 0-RTT data.
                            for id in self.quic.readable() {
                                if !self.early.contains(&id) {
                                    self.early.push(id);
                                }
                            }
                        }
                    }
                    // The endpoint stopped: nothing more will arrive.
                    Poll::Ready(None) => {
                        let _ = self.quic.close(false, 0, b"");
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            if input > 0 {
                progress = true;
                // Acknowledgements and window updates came.
                self.blocked.room();
            }
            if self.timer.as_mut().poll(cx).is_ready() {
                // A wake-up for the pacer alone leaves quiche's timers be.
                if self.paced.is_none() || self.quic_due.is_some_and(|t| t <= std::time::Instant::now()) {
                    self.quic.on_timeout();
                    // Packets declared lost leave the congestion window.
                    self.blocked.room();
                }
                progress = true;
            }
            if !self.draining && self.drain.as_mut().poll(cx).is_ready() {
                self.draining = true;
                self.start_drain();
                progress = true;
            }
            if self.quic.is_established() && !self.handshake_counted {
                self.established();
            }
            // Requests may come in 0-RTT data, before the handshake ends
            // (when `early_data` lets them).
            if self.h3.is_none() && (self.quic.is_established() || self.quic.is_in_early_data()) {
                self.start_http3();
            }
            if self.h3.is_some() {
                self.events();
                self.poll_streams();
                if self.draining && self.by_stream.is_empty() && !self.quic.is_closed() && self.all_delivered() {
                    let _ = self.quic.close(true, code::NO_ERROR, b"");
                }
            }
            self.new_cids();
            match self.flush(cx) {
                Poll::Ready(sent) => progress |= sent,
                Poll::Pending => {}
            }
            if self.quic.is_closed() {
                return Poll::Ready(());
            }
            let now = tokio::time::Instant::now();
            let mut deadline = now + self.quic.timeout().map_or(Duration::from_secs(3600), |t| t);
            self.quic_due = Some(deadline.into_std());
            if let Some(paced) = self.paced {
                deadline = deadline.min(tokio::time::Instant::from_std(paced));
            }
            self.timer.as_mut().reset(deadline);
            if !progress && !self.ready.any() {
                self.report();
                // Armed: the timer, the channel and the slots' wakers.
                if self.timer.as_mut().poll(cx).is_ready() {
                    continue;
                }
                return Poll::Pending;
            }
        }
    }

    /// Whether every response handed to quiche has reached the client.
    fn all_delivered(&mut self) -> bool {
        // quiche forgets a stream once the client has acknowledged all of
        // it; a stream still there still has something on its way.
        let quic = &mut self.quic;
        self.sent.retain(|&id| quic.stream_capacity(id).is_ok());
        self.sent.is_empty()
    }

    /// The handshake is done: counted, its version and cipher kept.
    fn established(&mut self) {
        self.handshake_counted = true;
        self.batching = None;
        self.endpoint.handshakes.fetch_sub(1, Ordering::Relaxed);
        let info = quic_handshake::take_done().unwrap_or(("TLSv1.3", "-"));
        if let Some(l) = self.listener_metrics() {
            l.handshake(self.worker.id, info.0, info.1, HandshakeResult::Ok);
        }
        self.tls_info = info;
    }

    /// The HTTP/3 layer, and the state its requests share.
    fn start_http3(&mut self) {
        let info = self.tls_info;
        self.state = Some(Arc::new(ConnState {
            client: self.peer,
            listener: self.listener_index,
            listener_name: self.listener_name.clone(),
            tls: Some(info),
            is_h2: false,
            worker: self.worker.clone(),
            in_flight: AtomicU32::new(0),
            requests: AtomicU32::new(0),
            head_flags: AtomicU8::new(0),
            closing: AtomicBool::new(false),
        }));
        match Http3::start(&mut self.quic, self.listener.max_head, self.listener.qpack) {
            Ok(h3) => self.h3 = Some(h3),
            Err(Fault::Connection(c) | Fault::Stream(c)) => {
                let _ = self.quic.close(true, c, b"");
            }
        }
    }

    fn listener_metrics(&self) -> Option<Arc<crate::metrics::ListenerMetrics>> {
        let snap = self.worker.shared.snapshot.load();
        snap.listeners.get(self.listener_index).filter(|l| *l.name == *self.listener_name).map(|l| l.metrics.clone())
    }

    /// Spare connection IDs for the client to move to (RFC 9000 5.1.1),
    /// each naming this worker, and retired ones forgotten.
    fn new_cids(&mut self) {
        if !self.quic.is_established() {
            return;
        }
        while let Some(old) = self.quic.retired_scid_next() {
            self.cids.retain(|c| c[..] != old[..]);
            self.endpoint.forget(&old);
        }
        while self.quic.scids_left() > 0 {
            let cid = self.endpoint.keys.new_cid(self.worker.id);
            let token = self.endpoint.keys.reset_token(&cid);
            let id = quiche::ConnectionId::from_ref(&cid);
            if self.quic.new_scid(&id, token, false).is_err() {
                break;
            }
            if let Some(tx) = self.endpoint.sender_of(&self.cids) {
                self.endpoint.route(cid.to_vec(), tx);
            }
            self.cids.push(cid.to_vec());
        }
    }

    /// GOAWAY: requests already started finish; no new one starts; the
    /// connection closes once the last response is sent.
    fn start_drain(&mut self) {
        if let Some(state) = &self.state {
            state.closing.store(true, Ordering::Relaxed);
        }
        match &mut self.h3 {
            Some(h3) => {
                let next = self.last_stream.map_or(0, |s| s + 4);
                h3.send_goaway(&mut self.quic, next);
            }
            None => {
                let _ = self.quic.close(true, code::NO_ERROR, b"");
            }
        }
    }

    fn finish(&mut self) {
        let st = self.quic.stats();
        tracing::debug!(
            peer = %self.peer,
            sent = st.sent,
            sent_bytes = st.sent_bytes,
            recv = st.recv,
            lost = st.lost,
            spurious_lost = st.spurious_lost,
            retrans = st.retrans,
            "QUIC connection closed"
        );
        self.report_close();
        if !self.handshake_counted {
            self.endpoint.handshakes.fetch_sub(1, Ordering::Relaxed);
            let result = if self.quic.is_timed_out() { HandshakeResult::Timeout } else { HandshakeResult::Failed };
            if let Some(l) = self.listener_metrics() {
                l.handshake(self.worker.id, "-", "-", result);
            }
        }
        for cid in &self.cids {
            self.endpoint.forget(cid);
        }
    }

    // ---- streams ----

    fn poll_streams(&mut self) {
        let mut order = std::mem::take(&mut self.marked);
        self.blocked.release(&mut order);
        self.ready.drain(|slot| order.push(slot));
        for slot in order.drain(..) {
            if self.slots.get(slot).is_none_or(Option::is_none) {
                continue;
            }
            self.read_body(slot);
            // A slot still waiting for room stays behind the ones before it.
            if self.blocked.is_waiting(slot) {
                continue;
            }
            if self.no_room(slot) {
                // Its turn comes again with the next room, cheaply: most
                // of those still waiting find the connection's window as
                // full as the one before them found it.
                self.blocked.block(slot);
                continue;
            }
            self.poll_stream(slot);
        }
        self.marked = order;
    }

    /// Whether the slot's next step is to send something and quiche has
    /// no room for any of it.
    fn no_room(&mut self, slot: usize) -> bool {
        let Some(s) = self.slots.get(slot).and_then(Option::as_ref) else { return false };
        let sends = match &s.task {
            Task::Head(_) | Task::Trailers(_) => true,
            // An empty chunk that ends the stream needs no room.
            Task::Sending(_) => s.pending.as_ref().is_some_and(|(data, _)| !data.is_empty()),
            Task::Handling(_) | Task::Done => false,
        };
        sends && matches!(self.quic.stream_capacity(s.stream), Ok(0))
    }

    fn poll_stream(&mut self, slot: usize) {
        let Some(h3) = self.h3.as_mut() else { return };
        let Some(s) = self.slots.get_mut(slot).and_then(Option::as_mut) else { return };
        let waker = s.waker.clone();
        let mut cx = Context::from_waker(&waker);
        let quic = &mut self.quic;
        let stream = s.stream;
        let outcome = loop {
            match &mut s.task {
                Task::Done => break Outcome::Done,
                Task::Handling(fut) => {
                    let Poll::Ready(Ok(resp)) = fut.as_mut().poll(&mut cx) else { break Outcome::Waiting };
                    s.task = Task::Head(Box::new(resp));
                }
                Task::Head(resp) => {
                    // A small body whose length is known may be all here
                    // already (it came with the upstream's head): then it
                    // goes with the head, in one write to quiche.
                    let small = resp.body().size_hint().exact().is_some_and(|n| (1..=WHOLE_WITH_HEAD).contains(&n));
                    if small && s.pending.is_none() {
                        match next_chunk(resp.body_mut(), &mut cx, &mut s.pending, true) {
                            Next::Pending | Next::Stored => {}
                            // Trailers before the bytes its length
                            // promised: the upstream's framing broke.
                            Next::Trailers(_) | Next::Broken => break Outcome::Reset(code::INTERNAL_ERROR),
                        }
                    }
                    let (sent, end) = match &s.pending {
                        Some((body, true)) => (h3.send_whole(quic, stream, resp.status(), resp.headers(), body), true),
                        _ => {
                            let end = resp.body().is_end_stream();
                            (h3.send_head(quic, stream, resp.status(), resp.headers(), end), end)
                        }
                    };
                    match sent {
                        Ok(()) => {
                            let Task::Head(mut resp) = std::mem::replace(&mut s.task, Task::Done) else {
                                break Outcome::Done;
                            };
                            if end {
                                s.pending = None;
                            } else {
                                // The fields are sent: let them go now
                                // rather than with the body.
                                drop(std::mem::take(resp.headers_mut()));
                                s.task = Task::Sending(resp);
                            }
                        }
                        Err(Unsent::Blocked) => break Outcome::Blocked,
                        Err(Unsent::Failed) => break Outcome::Reset(code::INTERNAL_ERROR),
                    }
                }
                Task::Trailers(t) => match h3.send_trailers(quic, stream, t) {
                    Ok(()) => s.task = Task::Done,
                    Err(Unsent::Blocked) => break Outcome::Blocked,
                    Err(Unsent::Failed) => break Outcome::Reset(code::INTERNAL_ERROR),
                },
                Task::Sending(resp) => {
                    if let Some((data, fin)) = &mut s.pending {
                        // The chunk goes into the stream's queue as it is;
                        // what quiche does not take stays in `data`.
                        match h3.send_data(quic, stream, data, *fin) {
                            Ok(true) => {
                                let fin = *fin;
                                s.pending = None;
                                if fin {
                                    s.task = Task::Done;
                                }
                                continue;
                            }
                            Ok(false) | Err(Unsent::Blocked) => break Outcome::Blocked,
                            Err(Unsent::Failed) => break Outcome::Reset(code::INTERNAL_ERROR),
                        }
                    }
                    match next_chunk(resp.body_mut(), &mut cx, &mut s.pending, false) {
                        Next::Pending => break Outcome::Waiting,
                        Next::Stored => {}
                        Next::Trailers(t) => s.task = Task::Trailers(Box::new(t)),
                        // The upstream broke off: the client must not take
                        // a cut-off body for a whole one.
                        Next::Broken => break Outcome::Reset(code::INTERNAL_ERROR),
                    }
                }
            }
        };
        match outcome {
            Outcome::Waiting => {}
            Outcome::Blocked => {
                // Told again when room comes with the client's next packets.
                let _ = quic.stream_writable(stream, 1);
                self.blocked.block(slot);
            }
            Outcome::Reset(code) => {
                self.reset(stream, code);
                self.free(slot);
            }
            Outcome::Done => {
                // The response is whole: a body the client is still
                // sending is not needed any more (RFC 9114 4.1).
                let body_open = s.body.is_some();
                if body_open {
                    let _ = quic.stream_shutdown(stream, quiche::Shutdown::Read, code::NO_ERROR);
                }
                self.free(slot);
                self.sent.push(stream);
                if self.sent.len() > 64 {
                    self.all_delivered();
                }
            }
        }
    }

    // ---- output ----

    /// Sends what quiche has to send. Ready(true): something went out.
    fn flush(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let mut sent = false;
        let window = window(&self.quic);
        let now = std::time::Instant::now();
        self.paced = None;
        loop {
            if !self.unsent.is_empty() {
                match self.io.send_owned(cx, &mut self.unsent) {
                    Poll::Ready(()) => sent = true,
                    Poll::Pending => return Poll::Pending,
                }
                if !self.unsent.is_empty() {
                    continue;
                }
            }
            let more = send_scratch(|buf| {
                let mut packets: smallvec::SmallVec<[_; gatehouse_udp::GSO_SEGMENTS]> = smallvec::SmallVec::new();
                let mut at = 0;
                while at + MAX_DATAGRAM <= buf.len() && packets.len() < gatehouse_udp::GSO_SEGMENTS {
                    if let Some(next) = self.pacer.wait_until(&window, now) {
                        self.paced = Some(next);
                        // Held back, not out of data: the window may grow
                        // with the ACKs that come meanwhile, as it does
                        // when send() runs dry (RFC 9002 7.8).
                        self.quic.on_pacing_delay();
                        break;
                    }
                    // The burst leaves in one write: one clock read for it.
                    match self.quic.send_at(&mut buf[at..at + MAX_DATAGRAM], now) {
                        Ok((n, info)) => {
                            self.pacer.on_sent(&window, now, n as u64);
                            packets.push((at, n, info.to, info.from));
                            at += n;
                        }
                        Err(quiche::Error::Done) => break,
                        Err(_) => {
                            let _ = self.quic.close(false, 0x1, b"");
                            break;
                        }
                    }
                }
                if packets.is_empty() {
                    return None;
                }
                let full = packets.len() == gatehouse_udp::GSO_SEGMENTS;
                self.io.send_packets(buf, &packets, &mut self.unsent);
                Some(full || !self.unsent.is_empty())
            });
            match more.flatten() {
                Some(more) => {
                    sent = true;
                    if !more {
                        return Poll::Ready(sent);
                    }
                }
                None => return Poll::Ready(sent),
            }
        }
    }
}

/// What the pacer needs of the active path.
fn window(quic: &Quic) -> Window {
    match quic.path_stats().find(|p| p.active) {
        Some(p) => Window {
            cwnd: p.cwnd as u64,
            srtt: p.min_rtt.map(|_| p.rtt),
            mtu: p.pmtu as u64,
            // quiche notes its first exit from slow start, not whether a
            // later one (after persistent congestion) is under way.
            slow_start: p.startup_exit.is_none(),
        },
        None => Window { cwnd: 0, srtt: None, mtu: MAX_DATAGRAM as u64, slow_start: true },
    }
}

/// What a response body gave.
enum Next {
    Pending,
    /// Data (or the body's end) into the slot's `pending`, or nothing.
    Stored,
    Trailers(HeaderMap),
    /// The upstream broke off.
    Broken,
}

/// The body's next frame: data goes into `pending` with whether it ends
/// the body, compacted ([`compact`]) as quiche's queue will hold it, but
/// for a body's last data when `last_whole` (it goes out with the head,
/// copied by [`Http3::send_whole`]).
fn next_chunk(
    body: &mut ResponseBody,
    cx: &mut Context<'_>,
    pending: &mut Option<(Bytes, bool)>,
    last_whole: bool,
) -> Next {
    match Pin::new(&mut *body).poll_frame(cx) {
        Poll::Pending => Next::Pending,
        Poll::Ready(None) => {
            *pending = Some((Bytes::new(), true));
            Next::Stored
        }
        Poll::Ready(Some(Ok(f))) => match f.into_data() {
            Ok(d) => {
                let end = body.is_end_stream();
                if !d.is_empty() || end {
                    *pending = Some((if end && last_whole { d } else { compact(d) }, end));
                }
                Next::Stored
            }
            Err(f) => f.into_trailers().map_or(Next::Stored, Next::Trailers),
        },
        Poll::Ready(Some(Err(_))) => Next::Broken,
    }
}

enum Outcome {
    /// The stream's future is pending; its waker will say when.
    Waiting,
    /// The stream has no room: try again when the client gives some.
    Blocked,
    Reset(u64),
    Done,
}

#[cfg(test)]
mod size_tests {
    use super::{Slot, Task};

    /// A slot moves when it is made, taken and freed, and its vector is
    /// copied when it grows: it holds the response by pointer.
    #[test]
    fn a_slot_holds_its_response_by_pointer() {
        let response = std::mem::size_of::<http::Response<crate::body::ResponseBody>>();
        assert!(size_of::<Task>() <= 24, "Task is {} bytes", size_of::<Task>());
        assert!(size_of::<Slot>() * 4 < response, "Slot is {} bytes", size_of::<Slot>());
    }
}
