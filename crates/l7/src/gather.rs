//! A TLS client's socket, with the records of a large response gathered
//! into one send.
//!
//! BoringSSL seals at most 16 KiB of plaintext into a record and hands
//! each record to its transport on its own, so a 64 KiB response went out
//! as four `sendto` calls, four TCP segments and four wake-ups of the
//! client. [`Gather`] sits under the TLS stream and keeps large writes
//! (whole records) until the writer flushes or [`SEND_AT`] bytes wait;
//! then they go out in one send. Small writes with nothing gathered pass
//! straight through, so a small response costs no copy.
//!
//! Whoever writes through it must flush before waiting for anything else,
//! as with any buffered writer: Gatehouse's HTTP/1.1 and HTTP/2 servers
//! do, hyper flushes after every write, and BoringSSL flushes each
//! handshake flight and fatal alert. Shutdown sends what is gathered first.
//!
//! HTTP/2 connections turn it off ([`Gather::pass_through`]): their output
//! writes many streams' frames at once already, and gathering their
//! records as well measured worse.
//!
//! A connection's last bytes ([`LastWrites`]: the response before a
//! close and the TLS close_notify alert) are all gathered and sent with
//! `MSG_MORE`, so that the FIN of the shutdown that follows leaves with
//! them: one TCP segment where there were three (response, alert, FIN),
//! each of which the sender's CPU also receives on loopback. A full TLS
//! handshake with one request and a close took about 9% less CPU (94
//! against 85 CPU-µs on Zen 5, docs/BENCHMARKS.md).

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

use crate::spare::{self, Spares};

/// Writes at least this large are gathered: whole records, or most of one.
const GATHER_FROM: usize = 4 * 1024;
/// Gathered bytes are sent once this many wait, flush or not: four full
/// records, what the kernel's loopback and GSO take as one segment.
pub const SEND_AT: usize = 64 * 1024;
/// A record's plaintext and its sealing overhead, with room to spare.
const RECORD_MAX: usize = 16 * 1024 + 512;
thread_local! {
    static POOL: spare::Pool = const { RefCell::new(Vec::new()) };
}
/// Gather buffers a worker keeps for the next large response.
static SPARE: Spares = Spares { pool: &POOL, keep: 8, largest: SEND_AT + RECORD_MAX };

pub struct Gather<T> {
    inner: T,
    /// Gathered bytes; `sent` of them are written. Empty with no capacity
    /// while nothing is gathered: an idle connection holds no buffer.
    out: Vec<u8>,
    sent: usize,
    /// Every write goes straight to the socket.
    pass_through: bool,
    /// The connection's last bytes: every write is gathered, and sent
    /// with what follows ([`LastWrites`]).
    last: bool,
}

/// A socket that can take bytes to send together with what follows:
/// `MSG_MORE`, so that a shutdown right after puts its FIN in the same
/// segment. What is taken is sent at the latest when the socket shuts
/// down or closes.
pub trait WriteMore: AsyncWrite {
    fn poll_write_more(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write(cx, buf)
    }
}

impl WriteMore for TcpStream {
    fn poll_write_more(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        loop {
            ready!(this.poll_write_ready(cx))?;
            let sent = this.try_io(Interest::WRITABLE, || {
                socket2::SockRef::from(&*this).send_with_flags(buf, libc::MSG_MORE | libc::MSG_NOSIGNAL)
            });
            match sent {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return Poll::Ready(other),
            }
        }
    }
}

/// A client connection's stream that can be told that what is written
/// next is the last of it: the response before a close. Then the
/// response, the TLS alert and the FIN leave in one segment ([`Gather`]).
pub trait LastWrites {
    fn last_writes(&mut self) {}
}

/// Cleartext: the response is one write, and the FIN follows it.
impl LastWrites for TcpStream {}

impl<T> LastWrites for tokio_boring::SslStream<crate::idle::ReadAhead<Gather<T>>> {
    fn last_writes(&mut self) {
        self.get_mut().get_mut().last = true;
    }
}

impl<T> Gather<T> {
    pub fn new(inner: T) -> Self {
        Gather { inner, out: Vec::new(), sent: 0, pass_through: false, last: false }
    }

    /// Stops gathering (nothing is gathered yet): for HTTP/2, whose
    /// output already writes the frames of many streams at once. Its
    /// records gathered as well cost 6–10% more CPU a request in A/B runs
    /// of 64 KiB responses (docs/BENCHMARKS.md, 2026-11-24).
    pub fn pass_through(&mut self) {
        self.pass_through = true;
    }

    /// Bytes gathered and not yet written to the socket.
    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.out.len() - self.sent
    }
}

impl<T: WriteMore + Unpin> Gather<T> {
    /// Writes everything gathered; then the buffer goes back to the spares.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            let rest = &self.out[self.sent..];
            let inner = Pin::new(&mut self.inner);
            let n = ready!(if self.last { inner.poll_write_more(cx, rest) } else { inner.poll_write(cx, rest) })?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.sent = 0;
        SPARE.give(std::mem::take(&mut self.out));
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Gather<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: WriteMore + Unpin> AsyncWrite for Gather<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // Bounded: a write is taken only while fewer than SEND_AT bytes are
        // gathered, sent or not.
        if this.out.len() >= SEND_AT {
            ready!(this.poll_drain(cx))?;
        }
        if this.out.is_empty() && (buf.len() < GATHER_FROM || this.pass_through) && !this.last {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        if this.out.capacity() == 0 {
            this.out = SPARE.take().unwrap_or_else(|| Vec::with_capacity(SEND_AT + RECORD_MAX));
        }
        this.out.extend_from_slice(buf);
        if this.out.len() >= SEND_AT {
            // The bytes are taken either way; what the socket does not take
            // now goes before the next write, or at the flush.
            if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket that records each write and takes at most `room` bytes
    /// before it is full (then `Pending` until `room` grows).
    #[derive(Default)]
    struct Socket {
        room: usize,
        writes: Vec<Vec<u8>>,
        /// Indices in `writes` of the writes sent with `MSG_MORE`.
        more: Vec<usize>,
        shut: bool,
    }

    impl WriteMore for Socket {
        fn poll_write_more(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            let index = self.writes.len();
            let n = ready!(self.as_mut().poll_write(cx, buf))?;
            self.more.push(index);
            Poll::Ready(Ok(n))
        }
    }

    impl AsyncRead for Socket {
        fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Socket {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
            let n = buf.len().min(self.room);
            if n == 0 {
                return Poll::Pending;
            }
            self.room -= n;
            self.writes.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    fn cx() -> Context<'static> {
        Context::from_waker(futures_util::task::noop_waker_ref())
    }

    fn write(g: &mut Gather<Socket>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(g).poll_write(&mut cx(), buf)
    }

    fn flush(g: &mut Gather<Socket>) -> Poll<io::Result<()>> {
        Pin::new(g).poll_flush(&mut cx())
    }

    fn record(n: usize, fill: u8) -> Vec<u8> {
        vec![fill; n]
    }

    #[test]
    fn records_go_out_in_one_send_at_the_flush() {
        let mut g = Gather::new(Socket { room: usize::MAX, ..Socket::default() });
        let (a, b, c) = (record(16_406, 1), record(16_406, 2), record(9_000, 3));
        for r in [&a, &b, &c] {
            assert!(matches!(write(&mut g, r), Poll::Ready(Ok(n)) if n == r.len()));
        }
        assert!(g.inner.writes.is_empty(), "nothing is sent before the flush");
        assert!(matches!(flush(&mut g), Poll::Ready(Ok(()))));
        assert_eq!(g.inner.writes, vec![[a, b, c].concat()]);
        assert_eq!(g.pending(), 0);
        assert_eq!(g.out.capacity(), 0, "an idle connection keeps no buffer");
    }

    #[test]
    fn small_writes_pass_straight_through() {
        let mut g = Gather::new(Socket { room: usize::MAX, ..Socket::default() });
        assert!(matches!(write(&mut g, b"hello"), Poll::Ready(Ok(5))));
        assert_eq!(g.inner.writes, vec![b"hello".to_vec()]);
        // Behind gathered bytes a small write waits its turn, in order.
        let big = record(8_000, 7);
        assert!(matches!(write(&mut g, &big), Poll::Ready(Ok(_))));
        assert!(matches!(write(&mut g, b"tail"), Poll::Ready(Ok(4))));
        assert!(matches!(flush(&mut g), Poll::Ready(Ok(()))));
        assert_eq!(g.inner.writes, vec![b"hello".to_vec(), [big, b"tail".to_vec()].concat()]);
    }

    #[test]
    fn four_records_are_sent_without_waiting_for_the_flush() {
        let mut g = Gather::new(Socket { room: usize::MAX, ..Socket::default() });
        let records: Vec<Vec<u8>> = (0..5).map(|i| record(16_406, i)).collect();
        for r in &records {
            assert!(matches!(write(&mut g, r), Poll::Ready(Ok(_))));
        }
        assert_eq!(g.inner.writes, vec![records[..4].concat()]);
        assert!(matches!(flush(&mut g), Poll::Ready(Ok(()))));
        assert_eq!(g.inner.writes[1], records[4]);
    }

    #[test]
    fn a_full_socket_holds_writes_back_and_loses_nothing() {
        let mut g = Gather::new(Socket { room: 20_000, ..Socket::default() });
        let records: Vec<Vec<u8>> = (0..9).map(|i| record(16_406, i)).collect();
        let mut taken = 0;
        for r in &records {
            match write(&mut g, r) {
                Poll::Ready(Ok(n)) => {
                    assert_eq!(n, r.len());
                    taken += 1;
                }
                Poll::Pending => break,
                Poll::Ready(Err(e)) => panic!("{e}"),
            }
        }
        assert_eq!(taken, 4, "a fifth record waits while four are unsent");
        assert!(flush(&mut g).is_pending());
        g.inner.room = usize::MAX;
        for r in &records[taken..] {
            assert!(matches!(write(&mut g, r), Poll::Ready(Ok(_))));
        }
        assert!(matches!(flush(&mut g), Poll::Ready(Ok(()))));
        assert_eq!(g.inner.writes.concat(), records.concat());
    }

    #[test]
    fn passing_through_gathers_nothing() {
        let mut g = Gather::new(Socket { room: usize::MAX, ..Socket::default() });
        g.pass_through();
        let records: Vec<Vec<u8>> = (0..3).map(|i| record(16_406, i)).collect();
        for r in &records {
            assert!(matches!(write(&mut g, r), Poll::Ready(Ok(_))));
        }
        assert_eq!(g.inner.writes, records);
        assert_eq!(g.out.capacity(), 0);
    }

    #[test]
    fn shutdown_sends_what_is_gathered_first() {
        let mut g = Gather::new(Socket { room: usize::MAX, ..Socket::default() });
        let r = record(10_000, 9);
        assert!(matches!(write(&mut g, &r), Poll::Ready(Ok(_))));
        assert!(matches!(Pin::new(&mut g).poll_shutdown(&mut cx()), Poll::Ready(Ok(()))));
        assert_eq!(g.inner.writes, vec![r]);
        assert!(g.inner.shut);
    }

    #[test]
    fn the_last_writes_leave_together_and_wait_for_the_shutdown() {
        let mut g = Gather::new(Socket { room: usize::MAX, ..Socket::default() });
        let (response, alert) = (record(122, 1), record(24, 2));
        g.last = true;
        assert!(matches!(write(&mut g, &response), Poll::Ready(Ok(122))));
        assert!(matches!(write(&mut g, &alert), Poll::Ready(Ok(24))));
        assert!(g.inner.writes.is_empty(), "small last writes are gathered too");
        assert!(matches!(flush(&mut g), Poll::Ready(Ok(()))));
        assert_eq!(g.inner.writes, vec![[response, alert].concat()], "one send");
        assert_eq!(g.inner.more, vec![0], "sent to wait for the FIN");
        assert!(matches!(Pin::new(&mut g).poll_shutdown(&mut cx()), Poll::Ready(Ok(()))));
        assert!(g.inner.shut);
        assert_eq!(g.out.capacity(), 0);
    }

    /// The kernel side of `MSG_MORE`: the last bytes and the FIN arrive,
    /// and nothing is lost when the shutdown follows at once.
    #[tokio::test]
    async fn a_tcp_socket_sends_the_last_writes_and_the_fin() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let client = TcpStream::connect(listener.local_addr().expect("address")).await.expect("connects");
        let (server, _) = listener.accept().await.expect("accepts");
        let mut g = Gather::new(server);
        g.last = true;
        g.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.expect("writes");
        g.write_all(b"alert").await.expect("writes");
        g.flush().await.expect("flushes");
        g.shutdown().await.expect("shuts down");
        let mut got = Vec::new();
        let mut client = client;
        client.read_to_end(&mut got).await.expect("reads to the FIN");
        assert_eq!(got, b"HTTP/1.1 200 OK\r\n\r\nalert");
    }
}
