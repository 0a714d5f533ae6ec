//! A connection's output: frames queued as they are made (by
//! [`crate::h2::conn::Connection`], in the buffer each call takes),
//! written out in as few writes as the client's socket takes, and small writes put off
//! once so that the answers of streams finishing close together share a
//! TLS record and a send.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

use crate::spare::{self, Spares};

/// The most plaintext one TLS record carries (RFC 8446 5.1).
const TLS_RECORD: usize = 16 * 1024;
/// Writes not put off after whole records went out.
const STREAMED_WRITES: u8 = 64;

thread_local! {
    static POOL: spare::Pool = const { std::cell::RefCell::new(Vec::new()) };
}
/// Output buffers a worker keeps for the connections writing at this
/// moment; an idle connection gives its own back.
static SPARE: Spares = Spares { pool: &POOL, keep: 64, largest: 4 * TLS_RECORD };

/// A buffer to queue frames in: a spare one, if the worker has one.
pub fn take_spare() -> Vec<u8> {
    SPARE.take().unwrap_or_default()
}

/// A buffer no longer needed, for another connection.
pub fn give_back(buf: Vec<u8>) {
    SPARE.give(buf);
}

#[derive(Default)]
pub struct Output {
    /// Frames being written, left alone until written: TLS retries a write
    /// with the same bytes at the same address.
    writing: Vec<u8>,
    written: usize,
    /// The last small write was put off.
    put_off: bool,
    /// Writes left before small ones are put off again, after whole
    /// records went out.
    streamed: u8,
    /// Written, and the flush that sends it on has not finished (the
    /// TLS socket under it gathers records; see `crate::gather`).
    unflushed: bool,
}

impl Output {
    /// Bytes queued (`buf`: the frames queued since the last write
    /// began) or being written.
    pub fn queued(&self, buf: &[u8]) -> usize {
        buf.len() + self.writing.len() - self.written + usize::from(self.unflushed)
    }

    /// Whether to put off writing what is queued, while `more_may_come`
    /// (streams are open). Many streams finishing close together each wake
    /// the connection; a small write put off until the runtime has looked
    /// for I/O once more takes the answers finished meanwhile into the same
    /// record and send, as HAProxy's one send per loop does. Only once in a
    /// row, only under a record, and not while the connection streams whole
    /// records (large responses fill records without waiting; waiting only
    /// adds latency).
    pub fn put_off(&mut self, buf: &[u8], more_may_come: bool) -> bool {
        let small = !buf.is_empty() && self.written == self.writing.len() && buf.len() < TLS_RECORD;
        if small && more_may_come && !self.put_off && self.streamed == 0 {
            self.put_off = true;
            return true;
        }
        if !buf.is_empty() {
            self.put_off = false;
            if buf.len() >= TLS_RECORD {
                self.streamed = STREAMED_WRITES;
            } else {
                self.streamed = self.streamed.saturating_sub(1);
            }
        }
        false
    }

    /// Writes what is queued in `buf`, which it leaves empty. `Ok(true)`:
    /// something went out; `Err`: the client is gone.
    pub fn poll_write<W: AsyncWrite + ?Sized>(
        &mut self,
        buf: &mut Vec<u8>,
        mut io: Pin<&mut W>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<bool, ()>> {
        let mut wrote = false;
        loop {
            if self.written == self.writing.len() {
                if buf.is_empty() {
                    break;
                }
                self.writing.clear();
                self.written = 0;
                std::mem::swap(&mut self.writing, buf);
                if buf.capacity() == 0 {
                    *buf = take_spare();
                }
            }
            match io.as_mut().poll_write(cx, &self.writing[self.written..]) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Err(())),
                Poll::Ready(Ok(n)) => {
                    self.written += n;
                    wrote = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        self.unflushed |= wrote;
        if self.unflushed {
            match io.as_mut().poll_flush(cx) {
                Poll::Ready(Err(_)) => return Poll::Ready(Err(())),
                Poll::Ready(Ok(())) => self.unflushed = false,
                // The socket's readiness wakes the connection, which calls
                // this again.
                Poll::Pending => {}
            }
        }
        if self.written == self.writing.len() && self.writing.capacity() > 0 {
            // All written: the buffer goes back to the worker.
            self.written = 0;
            give_back(std::mem::take(&mut self.writing));
        }
        Poll::Ready(Ok(wrote))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each write; takes at most `limit` bytes of one.
    #[derive(Default)]
    struct Recorder {
        limit: usize,
        calls: Vec<Vec<u8>>,
        /// Flushes that come back `Pending` before one finishes.
        flush_pending: usize,
        flushes: usize,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.limit);
            self.calls.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            self.flushes += 1;
            if self.flush_pending > 0 {
                self.flush_pending -= 1;
                return Poll::Pending;
            }
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// An output and the frames queued for it.
    #[derive(Default)]
    struct Queue {
        out: Output,
        buf: Vec<u8>,
    }

    impl Queue {
        fn queued(&self) -> usize {
            self.out.queued(&self.buf)
        }

        fn put_off(&mut self, more_may_come: bool) -> bool {
            self.out.put_off(&self.buf, more_may_come)
        }
    }

    fn write(q: &mut Queue, w: &mut Recorder) -> bool {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let Poll::Ready(Ok(wrote)) = q.out.poll_write(&mut q.buf, Pin::new(w), &mut cx) else {
            panic!("pending or failed")
        };
        wrote
    }

    #[test]
    fn frames_of_many_streams_go_out_as_one_write() {
        let mut w = Recorder { limit: usize::MAX, ..Recorder::default() };
        let mut out = Queue::default();
        let head = [0u8, 0x10, 0, 0, 0, 0, 0, 0, 1];
        let payload = vec![3u8; 4096];
        for _ in 0..3 {
            out.buf.extend_from_slice(&head);
            out.buf.extend_from_slice(&payload);
        }
        assert!(write(&mut out, &mut w));
        assert_eq!(w.calls.len(), 1);
        assert_eq!(w.calls[0].len(), 3 * (head.len() + payload.len()));
        assert_eq!(out.queued(), 0);
        assert!(!write(&mut out, &mut w), "nothing queued, nothing written");
    }

    #[test]
    fn a_small_write_is_put_off_once() {
        let mut w = Recorder { limit: usize::MAX, ..Recorder::default() };
        let mut out = Queue::default();
        out.buf.extend_from_slice(b"frames");
        // Put off: nothing written.
        assert!(out.put_off(true));
        // More frames meanwhile; the next time they all go at once.
        out.buf.extend_from_slice(b" and more");
        assert!(!out.put_off(true));
        write(&mut out, &mut w);
        assert_eq!(w.calls, [b"frames and more".to_vec()]);
        // Nothing queued, or no stream left to answer: never put off.
        assert!(!out.put_off(true));
        out.buf.extend_from_slice(b"last");
        assert!(!out.put_off(false));
        write(&mut out, &mut w);
        // A record's worth is never put off, nor are the writes of a
        // connection that sent records lately.
        out.buf.extend_from_slice(&vec![1u8; TLS_RECORD]);
        assert!(!out.put_off(true));
        write(&mut out, &mut w);
        out.buf.extend_from_slice(b"tail");
        assert!(!out.put_off(true));
        assert_eq!(out.out.streamed, STREAMED_WRITES - 1);
    }

    #[test]
    fn a_flush_left_pending_is_finished_by_the_next_call() {
        // The socket under TLS gathers records and sends them at the
        // flush; a full socket leaves that flush pending.
        let mut w = Recorder { limit: usize::MAX, flush_pending: 1, ..Recorder::default() };
        let mut out = Queue::default();
        out.buf.extend_from_slice(b"last frames");
        assert!(write(&mut out, &mut w));
        assert_eq!((w.flushes, out.queued()), (1, 1), "unsent until the flush finishes");
        // Woken when the socket has room, with nothing new to write.
        assert!(!write(&mut out, &mut w));
        assert_eq!((w.flushes, out.queued()), (2, 0));
        assert!(!write(&mut out, &mut w));
        assert_eq!(w.flushes, 2, "no flush once it finished");
    }

    #[test]
    fn a_write_that_is_cut_short_resumes_where_it_stopped() {
        let mut w = Recorder { limit: 5, ..Recorder::default() };
        let mut out = Queue::default();
        out.buf.extend_from_slice(b"0123456789ab");
        write(&mut out, &mut w);
        let written: Vec<u8> = w.calls.concat();
        assert_eq!(written, b"0123456789ab");
        assert_eq!(w.calls.len(), 3);
        assert_eq!(out.queued(), 0);
    }
}
