//! Connections to upstream endpoints: connecting (HTTP/1.1, or HTTP/2
//! over cleartext), and each worker's keep-alive pool of idle HTTP/1.1
//! connections and shared HTTP/2 ones.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use gatehouse_config::{Upstream, UpstreamProtocol};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustc_hash::FxHashMap;
use tokio::net::TcpStream;
use tokio::time::Sleep;

use crate::ClientBodyError;
use crate::h1::{Span, UPSTREAM_READ_CHUNK, UPSTREAM_READ_MAX};

pub type UpstreamBody = UnsyncBoxBody<Bytes, ClientBodyError>;

/// An open HTTP/1.1 connection to an upstream endpoint.
pub struct H1Conn {
    pub(crate) io: TcpStream,
    /// Bytes read but not consumed yet.
    pub(crate) buf: BytesMut,
    /// Bytes to make room for when the buffer is full: from
    /// [`UPSTREAM_READ_CHUNK`], doubled by every read that fills the room
    /// it had, up to [`UPSTREAM_READ_MAX`]; back to the start when the
    /// connection idles.
    pub(crate) read_size: usize,
    pub addr: SocketAddr,
    /// Has carried an exchange before (a failure may be a stale close).
    pub reused: bool,
    /// The response timer, kept for the connection's life and re-armed
    /// lazily: an exchange only moves a deadline, so the timer wheel is
    /// touched about once per timeout period, not once per request.
    pub(crate) timer: Pin<Box<Sleep>>,
    /// Span list for response heads, lent to each [`ResponseHead`] and
    /// given back, so parsing a head allocates nothing.
    pub(crate) fields: Vec<Span>,
}

impl H1Conn {
    pub fn new(io: TcpStream, addr: SocketAddr) -> Self {
        let timer = Box::pin(tokio::time::sleep(Duration::from_secs(24 * 3600)));
        H1Conn {
            io,
            buf: BytesMut::with_capacity(UPSTREAM_READ_CHUNK),
            read_size: UPSTREAM_READ_CHUNK,
            addr,
            reused: false,
            timer,
            fields: Vec::with_capacity(16),
        }
    }

    /// Whether an idle connection can take a request: the reactor has seen
    /// nothing on it (an upstream that closed it, or sent stray bytes, made
    /// it readable). No system call.
    pub fn idle_usable(&self) -> bool {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        self.buf.is_empty() && self.io.poll_read_ready(&mut cx).is_pending()
    }

    /// Frees an empty read buffer: the next read takes a new one. The
    /// pool's sweep calls this for every connection it finds idle, so a
    /// pool that grew to a burst's size holds sockets, not 16 KiB buffers,
    /// while connections in steady use keep theirs (a buffer freed at every
    /// release cost about 400 instructions per request: the response head
    /// still shares it then, so the next read had to allocate).
    pub fn shed_buffer(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            self.buf = BytesMut::new();
        }
        self.read_size = UPSTREAM_READ_CHUNK;
    }

    /// Reads more bytes into the buffer; Ok(0) at end of stream.
    pub(crate) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(self.read_size);
        }
        let room = self.buf.capacity() - self.buf.len();
        let read = ready!(tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf));
        if matches!(read, Ok(n) if n == room) {
            self.read_size = (self.read_size * 2).min(UPSTREAM_READ_MAX);
        }
        Poll::Ready(read)
    }

    pub fn into_parts(self) -> (TcpStream, BytesMut) {
        (self.io, self.buf)
    }
}

/// A connection that can carry a request to an endpoint.
pub enum Sender {
    /// Ours alone for one exchange (see `h1client`).
    H1(H1Conn),
    /// Shared: an HTTP/2 connection carries many requests at once.
    H2(http2::SendRequest<UpstreamBody>),
}

/// Why no connection could be had.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("no connection within the connect timeout")]
    Timeout,
    #[error("connect: {0}")]
    Failed(std::io::Error),
    #[error("HTTP/2 handshake: {0}")]
    Handshake(hyper::Error),
}

/// How many idle connections an upstream keeps per endpoint per worker,
/// and for how long. Eight bytes: every response body from an HTTP/1.1
/// upstream carries one.
#[derive(Clone, Copy, Debug)]
pub struct KeepIdle {
    /// `u32::MAX` unless the config sets a cap; 0 keeps none.
    pub max: u32,
    pub timeout_ms: u32,
}

impl KeepIdle {
    pub fn of(cfg: &Upstream) -> Self {
        KeepIdle {
            max: cfg.max_idle_per_endpoint.map_or(u32::MAX, |m| u32::try_from(m).unwrap_or(u32::MAX)),
            timeout_ms: u32::try_from(cfg.idle_timeout.as_millis()).unwrap_or(u32::MAX),
        }
    }
}

struct Idle {
    conn: H1Conn,
    /// Closed at this moment if still unused.
    expires: Instant,
}

/// One worker's upstream connections: idle HTTP/1.1 ones, and the one
/// shared HTTP/2 connection per h2c endpoint. Keyed by endpoint address
/// with FxHash: the keys come from the config, not from clients, and
/// SipHash cost about 460 instructions per request over the two lookups.
///
/// The idle list of an endpoint is a stack: a request takes the connection
/// that went idle last. So the pool follows the load without a count cap:
/// it grows to what the busiest moment had in use, and when the load falls
/// the connections it no longer needs sink to the bottom, stay unused and
/// are closed when their idle timeout passes. A connection found idle by
/// the sweep gives up its read buffer (see [`H1Conn::shed_buffer`]), so
/// the memory a grown pool keeps is the socket and a few hundred bytes per
/// connection.
#[derive(Default)]
pub struct ConnPool {
    idle: Mutex<FxHashMap<SocketAddr, VecDeque<Idle>>>,
    h2: Mutex<FxHashMap<SocketAddr, http2::SendRequest<UpstreamBody>>>,
}

impl ConnPool {
    /// The shared HTTP/2 connection to `addr`, if it is still open.
    pub fn shared_h2(&self, addr: SocketAddr) -> Option<Sender> {
        let mut map = self.h2.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&addr) {
            Some(s) if !s.is_closed() => Some(Sender::H2(s.clone())),
            Some(_) => {
                map.remove(&addr);
                None
            }
            None => None,
        }
    }

    pub fn share_h2(&self, addr: SocketAddr, sender: &Sender) {
        if let Sender::H2(s) = sender {
            self.h2.lock().unwrap_or_else(|e| e.into_inner()).insert(addr, s.clone());
        }
    }

    /// The idle HTTP/1.1 connection to `addr` that went idle last, if one
    /// can take a request at `now`. Closed and expired ones are dropped on
    /// the way.
    pub fn take(&self, addr: SocketAddr, now: Instant) -> Option<H1Conn> {
        let mut map = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = map.get_mut(&addr)?;
        while let Some(idle) = list.pop_back() {
            if now < idle.expires && idle.conn.idle_usable() {
                return Some(idle.conn);
            }
        }
        None
    }

    /// Keeps a connection whose last response was read to its end. Past an
    /// explicit cap the connection idle longest is closed.
    pub fn put_h1(&self, conn: H1Conn, keep: KeepIdle) {
        if keep.max == 0 {
            return;
        }
        let expires = Instant::now() + Duration::from_millis(u64::from(keep.timeout_ms));
        let mut map = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = map.entry(conn.addr).or_default();
        if list.len() >= keep.max as usize {
            list.pop_front();
        }
        list.push_back(Idle { conn, expires });
    }

    /// Closes idle connections whose timeout passed or that the upstream
    /// closed, frees the read buffers of the others, and forgets closed
    /// HTTP/2 connections.
    pub fn sweep(&self, now: Instant) {
        let mut map = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, list| {
            list.retain_mut(|i| {
                i.conn.shed_buffer();
                now < i.expires && i.conn.idle_usable()
            });
            !list.is_empty()
        });
        self.h2.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, s| !s.is_closed());
    }

    #[cfg(test)]
    fn idle_count(&self, addr: SocketAddr) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).get(&addr).map_or(0, VecDeque::len)
    }
}

/// Opens a new connection to `addr`, HTTP/1.1 or (h2c) HTTP/2.
///
/// The future is boxed: connecting is rare next to reusing a pooled
/// connection, and its state (over a kilobyte) would otherwise be part of
/// every request's future, which hyper moves into place once per request.
pub fn connect(
    addr: SocketAddr,
    timeout: Duration,
    protocol: UpstreamProtocol,
) -> Pin<Box<impl Future<Output = Result<Sender, ConnectError>>>> {
    Box::pin(connect_unboxed(addr, timeout, protocol))
}

async fn connect_unboxed(
    addr: SocketAddr,
    timeout: Duration,
    protocol: UpstreamProtocol,
) -> Result<Sender, ConnectError> {
    let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Err(_) => return Err(ConnectError::Timeout),
        Ok(Err(e)) => return Err(ConnectError::Failed(e)),
        Ok(Ok(s)) => s,
    };
    let _ = stream.set_nodelay(true);
    match protocol {
        UpstreamProtocol::Http1 => Ok(Sender::H1(H1Conn::new(stream, addr))),
        UpstreamProtocol::H2c => {
            let (sender, conn) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(TokioIo::new(stream))
                .await
                .map_err(ConnectError::Handshake)?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(Sender::H2(sender))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` connections to a listener that accepts and keeps them open.
    async fn open(n: usize) -> (Vec<H1Conn>, Vec<TcpStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (mut conns, mut accepted) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let stream = TcpStream::connect(addr).await.expect("connect");
            accepted.push(listener.accept().await.expect("accept").0);
            conns.push(H1Conn::new(stream, addr));
        }
        (conns, accepted)
    }

    /// Each connection's own port: tells which one the pool hands back.
    fn local_ports(conns: &[H1Conn]) -> Vec<u16> {
        conns.iter().map(|c| c.io.local_addr().expect("local").port()).collect()
    }

    fn local_port(conn: H1Conn) -> u16 {
        conn.into_parts().0.local_addr().expect("local").port()
    }

    const FOREVER: KeepIdle = KeepIdle { max: u32::MAX, timeout_ms: 3_600_000 };

    #[tokio::test(flavor = "current_thread")]
    async fn pool_without_a_cap_keeps_every_connection_a_burst_needed() {
        let pool = ConnPool::default();
        let (conns, _peers) = open(300).await;
        let addr = conns[0].addr;
        let ports = local_ports(&conns);
        for c in conns {
            pool.put_h1(c, FOREVER);
        }
        // The default keeps them all: none is closed to make room.
        assert_eq!(pool.idle_count(addr), 300);
        // Newest first: the connections the load no longer needs are the
        // ones left at the bottom to idle out.
        let now = Instant::now();
        assert_eq!(pool.take(addr, now).map(local_port), Some(ports[299]));
        assert_eq!(pool.take(addr, now).map(local_port), Some(ports[298]));
        assert_eq!(pool.idle_count(addr), 298);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_explicit_cap_closes_the_connection_idle_longest() {
        let pool = ConnPool::default();
        let (conns, _peers) = open(3).await;
        let addr = conns[0].addr;
        let ports = local_ports(&conns);
        for c in conns {
            pool.put_h1(c, KeepIdle { max: 2, ..FOREVER });
        }
        assert_eq!(pool.idle_count(addr), 2);
        let now = Instant::now();
        assert_eq!(pool.take(addr, now).map(local_port), Some(ports[2]));
        assert_eq!(pool.take(addr, now).map(local_port), Some(ports[1]));
        assert!(pool.take(addr, now).is_none());

        let (conns, _peers) = open(1).await;
        pool.put_h1(conns.into_iter().next().expect("one"), KeepIdle { max: 0, ..FOREVER });
        assert_eq!(pool.idle_count(addr), 0, "max 0 keeps nothing");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn idle_connections_expire_and_hold_no_read_buffer() {
        let pool = ConnPool::default();
        let (conns, _peers) = open(2).await;
        let addr = conns[0].addr;
        let mut it = conns.into_iter();
        let short = KeepIdle { max: u32::MAX, timeout_ms: 50 };
        pool.put_h1(it.next().expect("first"), short);
        pool.put_h1(it.next().expect("second"), FOREVER);
        // The sweep closes the one whose timeout passed, and only it, and
        // frees the read buffer of the one it keeps.
        pool.sweep(Instant::now() + Duration::from_millis(100));
        assert_eq!(pool.idle_count(addr), 1);
        {
            let map = pool.idle.lock().expect("lock");
            assert!(map[&addr].iter().all(|i| i.conn.buf.capacity() == 0), "an idle connection keeps its read buffer");
        }
        // A take at a moment past every timeout finds nothing usable.
        assert!(pool.take(addr, Instant::now() + Duration::from_secs(7200)).is_none());
        assert_eq!(pool.idle_count(addr), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn reads_grow_while_they_fill_their_room_and_start_small_again_when_idle() {
        use tokio::io::AsyncWriteExt;
        let (conns, mut peers) = open(1).await;
        let mut conn = conns.into_iter().next().expect("one");
        let mut peer = peers.pop().expect("peer");
        // A body already waiting, larger than every read: each read fills
        // the room it had.
        let body = vec![7u8; 256 * 1024];
        let writer = tokio::spawn(async move {
            peer.write_all(&body).await.expect("write");
            peer
        });
        let (mut total, mut largest, mut reads) = (0, 0, 0);
        while total < 256 * 1024 {
            // Let the sender fill the socket, as a waiting response does.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let n = std::future::poll_fn(|cx| conn.poll_fill(cx)).await.expect("read");
            assert!(n > 0);
            // The body takes what was read, as `H1Body` does.
            drop(conn.buf.split().freeze());
            (total, largest, reads) = (total + n, largest.max(n), reads + 1);
        }
        assert!(largest > UPSTREAM_READ_CHUNK, "reads stayed at {largest} bytes");
        assert!(reads < 256 * 1024 / UPSTREAM_READ_CHUNK, "{reads} reads for 256 KiB");
        assert_eq!(conn.read_size, UPSTREAM_READ_MAX);
        let _peer = writer.await.expect("writer");
        // Idle, it gives back its buffer and starts small again.
        conn.shed_buffer();
        assert_eq!((conn.buf.capacity(), conn.read_size), (0, UPSTREAM_READ_CHUNK));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_the_upstream_closed_is_not_taken() {
        let pool = ConnPool::default();
        let (conns, peers) = open(1).await;
        let addr = conns[0].addr;
        pool.put_h1(conns.into_iter().next().expect("one"), FOREVER);
        drop(peers);
        // Let the reactor see the FIN.
        for _ in 0..50 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            pool.sweep(Instant::now());
            if pool.idle_count(addr) == 0 {
                break;
            }
        }
        assert_eq!(pool.idle_count(addr), 0);
        assert!(pool.take(addr, Instant::now()).is_none());
    }
}
