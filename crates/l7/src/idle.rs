//! An idle client connection holds no buffer. Between requests a
//! connection waits to read with nothing allocated: a read goes through
//! the worker's scratch buffer, and only the bytes that came are copied
//! into memory of the connection's own ([`poll_read_into`]). Under TLS,
//! [`ReadAhead`] does the same for the records BoringSSL reads: what one
//! socket read brings beyond the record header asked for is kept in a
//! buffer borrowed from the worker's spares and given back once read.
//! This is how HAProxy and NGINX keep an idle keep-alive connection to a
//! few hundred bytes (docs/BENCHMARKS.md, idle connections).

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::spare::{self, Spares};

/// The most one scratch read takes.
const SCRATCH: usize = 16 * 1024;

thread_local! {
    static SCRATCH_BUF: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH].into_boxed_slice());
}

/// Reads what `io` has into `buf` (appended), holding nothing while it
/// waits: the read lands in the worker's scratch buffer first. `Ok(0)`:
/// the end of the stream.
pub fn poll_read_into<R: AsyncRead + ?Sized>(
    io: Pin<&mut R>,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    SCRATCH_BUF.with_borrow_mut(|scratch| {
        let mut rb = ReadBuf::new(&mut scratch[..]);
        match io.poll_read(cx, &mut rb) {
            Poll::Ready(Ok(())) => {
                let n = rb.filled().len();
                buf.extend_from_slice(rb.filled());
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    })
}

/// Reads what `io` has into memory of its own, sized to it, holding
/// nothing while it waits: an empty buffer is the end of the stream.
pub fn poll_read_fresh<R: AsyncRead + ?Sized>(io: Pin<&mut R>, cx: &mut Context<'_>) -> Poll<io::Result<BytesMut>> {
    let mut buf = BytesMut::new();
    poll_read_into(io, cx, &mut buf).map_ok(|_| buf)
}

/// [`poll_read_fresh`] as a future.
pub async fn read_fresh<R: AsyncRead + ?Sized>(mut io: Pin<&mut R>) -> io::Result<BytesMut> {
    std::future::poll_fn(|cx| poll_read_fresh(io.as_mut(), cx)).await
}

/// Bytes read from a TLS client's socket at a time.
const READ_AHEAD: usize = 4096;
thread_local! {
    static POOL: spare::Pool = const { RefCell::new(Vec::new()) };
}
/// Read-ahead buffers a worker keeps: one per connection reading a record
/// at this moment is the most it needs.
static SPARE: Spares = Spares { pool: &POOL, keep: 64, largest: READ_AHEAD };

/// A reader under TLS: BoringSSL reads a record as two reads, its 5-byte
/// header then its body, and a small buffer under it turns a flight of
/// records that arrived together into one `recvfrom`. Reads as large as
/// the buffer (bulk request bodies) bypass it. The buffer is borrowed
/// while it holds bytes not yet read, and given back when empty, so an
/// idle connection holds none. Writes pass through.
pub struct ReadAhead<T> {
    inner: T,
    /// `buf[pos..filled]` is read from the socket and not yet taken.
    buf: Vec<u8>,
    pos: usize,
    filled: usize,
}

impl<T> ReadAhead<T> {
    pub fn new(inner: T) -> Self {
        ReadAhead { inner, buf: Vec::new(), pos: 0, filled: 0 }
    }

    pub fn get_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    #[cfg(test)]
    fn holds(&self) -> usize {
        self.buf.capacity()
    }

    fn give_back(&mut self) {
        self.pos = 0;
        self.filled = 0;
        SPARE.give_as_is(std::mem::take(&mut self.buf));
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ReadAhead<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pos == this.filled {
            if out.remaining() >= READ_AHEAD {
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            // A spare comes back at its full length: zeroed once, when made.
            let mut buf = SPARE.take().unwrap_or_default();
            buf.resize(READ_AHEAD, 0);
            let mut rb = ReadBuf::new(&mut buf);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    this.buf = buf;
                    this.pos = 0;
                    this.filled = n;
                }
                other => {
                    SPARE.give_as_is(buf);
                    return other;
                }
            }
        }
        let n = (this.filled - this.pos).min(out.remaining());
        out.put_slice(&this.buf[this.pos..this.pos + n]);
        this.pos += n;
        if this.pos == this.filled {
            this.give_back();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ReadAhead<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T> Drop for ReadAhead<T> {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn records_read_in_pieces_hold_the_buffer_only_while_bytes_wait() {
        let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        let (mut tx, rx) = tokio::io::duplex(64 * 1024);
        tokio::io::AsyncWriteExt::write_all(&mut tx, &data).await.expect("write");
        let mut r = ReadAhead::new(rx);
        assert_eq!(r.holds(), 0, "nothing held before a read");
        let mut head = [0u8; 5];
        r.read_exact(&mut head).await.expect("header");
        assert_eq!(head, data[..5]);
        assert!(r.holds() >= READ_AHEAD, "the rest of the read waits in a borrowed buffer");
        let mut rest = vec![0u8; data.len() - 5];
        r.read_exact(&mut rest).await.expect("rest");
        assert_eq!(rest, data[5..]);
        assert_eq!(r.holds(), 0, "given back once read");
        // A large read bypasses the buffer.
        tokio::io::AsyncWriteExt::write_all(&mut tx, &data).await.expect("write");
        let mut big = vec![0u8; READ_AHEAD];
        let n = r.read(&mut big).await.expect("read");
        assert_eq!(&big[..n], &data[..n]);
        assert_eq!(r.holds(), 0);
    }

    #[tokio::test]
    async fn a_fresh_read_holds_what_came_only() {
        let (mut tx, mut rx) = tokio::io::duplex(64 * 1024);
        tokio::io::AsyncWriteExt::write_all(&mut tx, b"GET / HTTP/1.1\r\n\r\n").await.expect("write");
        let buf = read_fresh(Pin::new(&mut rx)).await.expect("read");
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n\r\n");
        assert!(buf.capacity() < 1024, "sized to what came, not to a read chunk");
        let mut more = BytesMut::new();
        tokio::io::AsyncWriteExt::write_all(&mut tx, b"abc").await.expect("write");
        let n = std::future::poll_fn(|cx| poll_read_into(Pin::new(&mut rx), cx, &mut more)).await.expect("read");
        assert_eq!((n, &more[..]), (3, &b"abc"[..]), "appended");
        drop(tx);
        assert!(read_fresh(Pin::new(&mut rx)).await.expect("eof").is_empty());
    }
}
