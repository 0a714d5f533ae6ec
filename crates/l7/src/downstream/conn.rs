//! One client connection: its shared state and the I/O wrapper every HTTP
//! server (Gatehouse's and hyper's) reads through.
//!
//! [`ClientIo`] does three things hyper does not do the way an edge proxy
//! must:
//! - **408 on a slow request head.** Once the first byte of a request head
//!   arrives, the client has `client_header_timeout` to finish it; then it
//!   gets `408 Request Timeout` and the connection closes. (hyper's own
//!   header timeout closes without an answer.)
//! - **Idle timeout.** A connection with no request in flight and no bytes
//!   for `client_idle_timeout` is closed quietly.
//! - **Ambiguous framing.** hyper accepts a request with both
//!   Content-Length and Transfer-Encoding (it drops Content-Length, as
//!   RFC 9112 permits) and identical duplicate Content-Length headers. A
//!   proxy that lets such requests through invites request smuggling
//!   against whatever sits behind it, so the wrapper scans each HTTP/1 head
//!   for those header names and flags the request; the proxy answers 400.
//!
//! Timers and the scan apply only while no request is in flight, i.e. while
//! the bytes read can only be a request head.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::accesslog::{LogRecord, reason};
use crate::context::Worker;
use crate::deadline::{expired, set_deadline};
use crate::h1::response_status;
use crate::h1::scan::HeadScanner;
use crate::metrics::ListenerMetrics;

/// State shared by a connection's I/O wrapper and its requests.
pub struct ConnState {
    pub client: SocketAddr,
    pub listener: usize,
    pub listener_name: Arc<str>,
    pub tls: Option<(&'static str, &'static str)>,
    pub is_h2: bool,
    pub worker: Arc<Worker>,
    /// Requests whose response has not finished yet.
    pub in_flight: AtomicU32,
    /// Requests handed to the service so far.
    pub requests: AtomicU32,
    pub head_flags: AtomicU8,
    /// Set when the process drains: the next HTTP/1 response says
    /// `Connection: close`, so a busy keep-alive connection ends cleanly
    /// after a complete exchange instead of being cut between requests.
    pub closing: std::sync::atomic::AtomicBool,
}

/// A client connection's reader, boxed: it moves from one server to the
/// next (Gatehouse's HTTP/1.1 server, then hyper or the HTTP/2 server).
pub type ClientStream<T> = Pin<Box<ClientIo<T>>>;

/// A connection counted open, on its worker and on its listener, until
/// this drops with the connection's task.
pub struct Open {
    pub worker: Arc<Worker>,
    pub listener: Arc<ListenerMetrics>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.listener.closed(self.worker.id);
        self.worker.shared.metrics.connection_closed(self.worker.id);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Between requests: waiting for a first byte.
    Idle,
    /// A head has started and must finish before the deadline.
    Head,
    /// Writing the 408 answer; then end of stream.
    Answering408(u32),
    Closed,
}

/// A timeout in whole milliseconds (up to 49 days), half a `Duration`'s size.
#[derive(Clone, Copy)]
struct Millis(u32);

impl Millis {
    fn of(d: Duration) -> Millis {
        Millis(u32::try_from(d.as_millis()).unwrap_or(u32::MAX))
    }

    fn get(self) -> Duration {
        Duration::from_millis(u64::from(self.0))
    }
}

const RESPONSE_408: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\ncontent-length: 20\r\nconnection: close\r\n\r\n408 Request Timeout\n";

pin_project_lite::pin_project! {
    pub struct ClientIo<T> {
        #[pin]
        inner: T,
        // Armed at or before `deadline`; re-armed lazily when it fires
        // early, so activity costs a field write, not a timer-wheel update.
        #[pin]
        timer: Sleep,
        deadline: Instant,
        state: Arc<ConnState>,
        mode: Mode,
        busy: bool,
        h2: bool,
        // Milliseconds, as `Millis`: the struct is in every connection.
        header_timeout: Millis,
        idle_timeout: Millis,
        scan: HeadScanner,
        // Off while Gatehouse's own HTTP/1.1 server reads: it checks each
        // head whole, and hands hyper the head it does not take to scan.
        scanning: bool,
        // `state.requests` when the current head started: if a response goes
        // out while it is unchanged, hyper answered the head itself (400,
        // 431) and the service never saw it, so we log it here.
        head_requests: u32,
        rejection_logged: bool,
    }
}

impl<T> ClientIo<T> {
    pub fn new(inner: T, state: Arc<ConnState>, header_timeout: Duration, idle_timeout: Duration) -> Self {
        let h2 = state.is_h2;
        // A new connection gets the header timeout to send anything.
        let deadline = Instant::now() + header_timeout;
        ClientIo {
            inner,
            timer: tokio::time::sleep_until(deadline),
            deadline,
            state,
            mode: Mode::Idle,
            busy: false,
            h2,
            header_timeout: Millis::of(header_timeout),
            idle_timeout: Millis::of(idle_timeout),
            scan: HeadScanner::default(),
            scanning: true,
            head_requests: 0,
            rejection_logged: false,
        }
    }
}

impl<T> ClientIo<T> {
    pub fn state(&self) -> &Arc<ConnState> {
        &self.state
    }

    /// Whether the client opened with the HTTP/2 connection preface.
    pub fn is_h2(&self) -> bool {
        self.h2
    }

    /// Heads are checked by the reader itself from now on: no scanning.
    pub fn stop_scanning(self: Pin<&mut Self>) {
        *self.project().scanning = false;
    }

    /// Scanning resumes with `head`, the start of a request head read while
    /// it was off (what the reader hands to hyper), then the bytes read
    /// after it.
    pub fn scan_from(self: Pin<&mut Self>, head: &[u8]) {
        let this = self.project();
        *this.scanning = true;
        this.scan.reset();
        if let Some(flags) = this.scan.feed(head)
            && flags != 0
        {
            this.state.head_flags.fetch_or(flags, Ordering::Relaxed);
        }
    }

    /// A request is in flight: when the next read finds none, the idle
    /// timeout begins (as it does when hyper reads while a request runs).
    pub fn begin_request(self: Pin<&mut Self>) {
        *self.project().busy = true;
    }

    /// What is written next is the connection's last: the response before
    /// a close ([`crate::gather::LastWrites`]).
    pub fn last_writes(self: Pin<&mut Self>)
    where
        T: crate::gather::LastWrites + Unpin,
    {
        self.project().inner.get_mut().last_writes();
    }
}

impl<T: AsyncRead + AsyncWrite> AsyncRead for ClientIo<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let mut this = self.project();
        if let Mode::Answering408(written) = *this.mode {
            let mut pos = written as usize;
            while pos < RESPONSE_408.len() {
                match ready!(this.inner.as_mut().poll_write(cx, &RESPONSE_408[pos..])) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => pos += n,
                }
                // The answer is 114 bytes.
                *this.mode = Mode::Answering408(pos as u32);
            }
            let _ = ready!(this.inner.as_mut().poll_flush(cx));
            *this.mode = Mode::Closed;
        }
        if *this.mode == Mode::Closed {
            return Poll::Ready(Ok(())); // end of stream for hyper
        }

        if this.state.in_flight.load(Ordering::Relaxed) > 0 {
            *this.busy = true;
            return this.inner.poll_read(cx, buf);
        }
        if std::mem::take(this.busy) {
            // The last response just finished: the keep-alive wait begins.
            *this.mode = Mode::Idle;
            set_deadline(this.timer.as_mut(), this.deadline, Instant::now() + this.idle_timeout.get());
        }
        if expired(this.timer.as_mut(), *this.deadline, cx) {
            if *this.mode == Mode::Head && !*this.h2 {
                *this.mode = Mode::Answering408(0);
                this.state.log_rejected(408, reason::CLIENT_TIMEOUT);
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            *this.mode = Mode::Closed;
            return Poll::Ready(Ok(()));
        }

        let before = buf.filled().len();
        ready!(this.inner.poll_read(cx, buf))?;
        let new = &buf.filled()[before..];
        if new.is_empty() {
            return Poll::Ready(Ok(()));
        }
        if *this.h2 {
            // HTTP/2: frames between requests only keep the connection alive.
            set_deadline(this.timer.as_mut(), this.deadline, Instant::now() + this.idle_timeout.get());
        } else {
            if *this.mode == Mode::Idle {
                if new.starts_with(b"PRI * HTTP/2.0") {
                    *this.h2 = true; // cleartext HTTP/2 with prior knowledge
                    return Poll::Ready(Ok(()));
                }
                *this.mode = Mode::Head;
                *this.head_requests = this.state.requests.load(Ordering::Relaxed);
                *this.rejection_logged = false;
                this.scan.reset();
                set_deadline(this.timer.as_mut(), this.deadline, Instant::now() + this.header_timeout.get());
            }
            if *this.scanning
                && let Some(flags) = this.scan.feed(new)
                && flags != 0
            {
                this.state.head_flags.fetch_or(flags, Ordering::Relaxed);
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite> AsyncWrite for ClientIo<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        note_rejection(this.state, *this.mode, *this.h2, *this.head_requests, this.rejection_logged, buf);
        this.inner.poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            note_rejection(this.state, *this.mode, *this.h2, *this.head_requests, this.rejection_logged, first);
        }
        write_coalesced(this.inner, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Vectored writes up to this size are copied into one buffer and written
/// with a single contiguous write.
const COALESCE_WRITES_UP_TO: usize = 4096;

/// hyper hands a response over as its head and its body in separate
/// slices. A small response goes out through one contiguous write (send)
/// rather than writev: the kernel's writev path imports and walks an iovec
/// array, which costs more than copying a few hundred bytes here. Larger
/// writes keep the vectored call and its zero copy.
fn write_coalesced<W: AsyncWrite>(
    inner: Pin<&mut W>,
    cx: &mut Context<'_>,
    bufs: &[std::io::IoSlice<'_>],
) -> Poll<std::io::Result<usize>> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    if bufs.len() > 1 && total <= COALESCE_WRITES_UP_TO {
        return COALESCE.with_borrow_mut(|scratch| {
            scratch.clear();
            for b in bufs {
                scratch.extend_from_slice(b);
            }
            inner.poll_write(cx, scratch)
        });
    }
    inner.poll_write_vectored(cx, bufs)
}

thread_local! {
    /// The worker's scratch buffer for coalesced writes: filled and written
    /// within one call, so one per thread serves every connection.
    static COALESCE: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(COALESCE_WRITES_UP_TO));
}

/// Logs a response that hyper wrote for a head the service never saw.
fn note_rejection(state: &ConnState, mode: Mode, h2: bool, head_requests: u32, logged: &mut bool, buf: &[u8]) {
    if mode == Mode::Head
        && !h2
        && !*logged
        && state.requests.load(Ordering::Relaxed) == head_requests
        && let Some(status) = response_status(buf)
    {
        *logged = true;
        let why = if status == 431 { reason::HEAD_TOO_LARGE } else { reason::BAD_REQUEST };
        state.log_rejected(status, why);
    }
}

impl ConnState {
    /// The client's address as an X-Forwarded-For value. Made per request,
    /// not kept: an idle connection holds the address only.
    pub fn client_ip(&self) -> http::HeaderValue {
        crate::filters::address_value(self.client.ip())
    }

    /// An access log line for a request refused before it had a route.
    pub fn log_rejected(&self, status: u16, why: &'static str) {
        let log = &self.worker.shared.access_log;
        if !log.is_on() {
            return;
        }
        log.send(LogRecord {
            time: std::time::SystemTime::now(),
            client: self.client,
            listener: self.listener_name.clone(),
            method: String::new(),
            host: String::new(),
            path: String::new(),
            protocol: "HTTP/1.1",
            status,
            bytes_in: 0,
            bytes_out: 0,
            duration_ms: 0.0,
            upstream_ms: None,
            route: None,
            upstream: None,
            endpoint: None,
            tls_version: self.tls.map(|t| t.0),
            tls_cipher: self.tls.map(|t| t.1),
            reason: why,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each write call: (vectored, bytes).
    #[derive(Default)]
    struct Recorder {
        calls: Vec<(bool, Vec<u8>)>,
        /// Accept at most this many bytes per call.
        limit: usize,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.limit);
            self.calls.push((false, buf[..n].to_vec()));
            Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[std::io::IoSlice<'_>],
        ) -> Poll<std::io::Result<usize>> {
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = all.len().min(self.limit);
            self.calls.push((true, all[..n].to_vec()));
            Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn write_once(limit: usize, bufs: &[&[u8]]) -> (usize, Vec<(bool, Vec<u8>)>) {
        let mut w = Recorder { limit, ..Recorder::default() };
        let slices: Vec<std::io::IoSlice<'_>> = bufs.iter().map(|b| std::io::IoSlice::new(b)).collect();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let Poll::Ready(Ok(n)) = write_coalesced(Pin::new(&mut w), &mut cx, &slices) else {
            panic!("write did not complete")
        };
        (n, w.calls)
    }

    #[test]
    fn small_vectored_writes_go_out_as_one_contiguous_write() {
        let head = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n";
        let (n, calls) = write_once(usize::MAX, &[head, b"hello"]);
        assert_eq!(n, head.len() + 5);
        assert_eq!(calls, vec![(false, [&head[..], b"hello"].concat())]);
        // A short write reports the bytes taken across the slices.
        let (n, calls) = write_once(head.len() + 2, &[head, b"hello"]);
        assert_eq!(n, head.len() + 2);
        assert_eq!(calls[0].1, [&head[..], b"he"].concat());
        // One slice, or more than the threshold, stays as it was.
        assert!(write_once(usize::MAX, &[head]).1[0].0);
        let big = vec![7u8; COALESCE_WRITES_UP_TO];
        let (n, calls) = write_once(usize::MAX, &[head, &big]);
        assert_eq!((n, calls.len(), calls[0].0), (head.len() + big.len(), 1, true));
    }
}
