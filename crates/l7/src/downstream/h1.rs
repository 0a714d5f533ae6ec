//! Gatehouse's own HTTP/1.1 server loop: it reads a request head, takes
//! the simple shape ([`crate::h1::request`]), hands the request to
//! [`crate::proxy::handle`] (the same entry point hyper's server calls),
//! and writes the response head and body itself, gathering a small body
//! into the head's write. A request of any other shape hands the
//! connection, with the bytes read so far, to hyper, which serves the rest
//! of it (and answers 400 or 431 to heads it refuses). The HTTP/2 preface
//! hands it to Gatehouse's HTTP/2 server ([`crate::downstream::h2`]).
//!
//! Timeouts (408 for a slow head, the idle timeout) come from the
//! [`ClientIo`] this reads through, as they do under hyper.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, Response};
use hyper::body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;

use crate::accesslog::reason;
use crate::body::ClientBody;
use crate::body::ResponseBody;
use crate::downstream::conn::{ClientIo, ConnState};
use crate::h1::chunked::put_chunk_size;
use crate::h1::request::{Parse, RequestHead, build_request, parse_head};
use crate::h1::{CLIENT_READ_CHUNK, Framing, Span, write};
use crate::idle::read_into;
use crate::proxy::{self, HeadWriter};
use crate::spare::{self, Spares};

pub type ClientStream<T> = Pin<Box<ClientIo<T>>>;

/// How the loop ended.
pub enum Served<T> {
    /// The connection is done (closed by either side, or after an error).
    Closed,
    /// hyper (or, after the HTTP/2 preface, Gatehouse's HTTP/2 server)
    /// takes the connection from here; these bytes, read but not consumed,
    /// come first.
    Handover(ClientStream<T>, Bytes),
}

/// Body bytes gathered with the head into one write.
const GATHER_UP_TO: usize = 16 * 1024;

const RESPONSE_400: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: 16\r\nconnection: close\r\n\r\n400 Bad Request\n";

async fn read_more<T>(io: &mut ClientStream<T>, buf: &mut BytesMut) -> std::io::Result<usize>
where
    T: AsyncRead + AsyncWrite,
{
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(CLIENT_READ_CHUNK);
    }
    io.read_buf(buf).await
}

/// Serves requests on one HTTP/1.x connection until it closes or a
/// request needs hyper. `drain` is the process's draining signal: once it
/// is set, the next response says `Connection: close`, and a connection
/// with no request within `grace` is closed.
pub async fn serve<T>(
    mut io: ClientStream<T>,
    state: Arc<ConnState>,
    max_head: usize,
    max_headers: usize,
    drain: &mut watch::Receiver<bool>,
    grace: Duration,
) -> Served<T>
where
    T: AsyncRead + AsyncWrite,
{
    io.as_mut().stop_scanning();
    // Empty while the connection is idle: see `crate::idle`.
    let mut buf = BytesMut::new();
    let mut draining = false;
    // Registered once for the connection's life, not per request.
    let drained = drain.wait_for(|d| *d);
    tokio::pin!(drained);
    loop {
        let (head, req) = loop {
            if !buf.is_empty() {
                if io.is_h2() {
                    return handover(io, buf);
                }
                match take_head(&mut buf, max_head, max_headers) {
                    Taken::Simple(head, req) => break (head, req),
                    Taken::Other => return handover(io, buf),
                    Taken::Partial if buf.len() >= max_head => return handover(io, buf),
                    Taken::Partial => {}
                }
            }
            let read = if !buf.is_empty() {
                read_more(&mut io, &mut buf).await
            } else if draining {
                match Box::pin(tokio::time::timeout(grace, read_into(io.as_mut(), &mut buf))).await {
                    Ok(r) => r,
                    Err(_) => return close(io).await,
                }
            } else {
                tokio::select! {
                    biased;
                    r = read_into(io.as_mut(), &mut buf) => r,
                    _ = &mut drained => {
                        draining = true;
                        state.closing.store(true, Ordering::Relaxed);
                        continue;
                    }
                }
            };
            match read {
                Ok(0) | Err(_) => return Served::Closed,
                Ok(_) => {}
            }
        };
        if buf.is_empty() {
            // What was read is all in the request: let its memory go with it.
            buf = BytesMut::new();
        }
        let Some(req) = req else {
            state.log_rejected(400, reason::BAD_REQUEST);
            let _ = io.write_all(RESPONSE_400).await;
            return close(io).await;
        };
        io.as_mut().begin_request();
        let (is_head, client_close) = (head.method == Method::HEAD, head.close);
        // Boxed: the request's future is kilobytes, and inline it would
        // make every idle connection's task that large.
        if !Box::pin(answer(&mut io, req, &state, is_head, client_close)).await {
            return close(io).await;
        }
    }
}

/// Runs a request and writes its response; returns whether the connection
/// stays open. The write buffer is the worker's, given back after: an
/// idle keep-alive connection holds none.
async fn answer<T>(
    io: &mut ClientStream<T>,
    req: http::Request<ClientBody>,
    state: &Arc<ConnState>,
    is_head: bool,
    client_close: bool,
) -> bool
where
    T: AsyncRead + AsyncWrite,
{
    let Ok(resp) = proxy::handle(req, state.clone(), HeadWriter::Own).await;
    let mut out = OUT_SPARE.take().unwrap_or_default();
    let keep = write_response(io, resp, is_head, client_close, &mut out).await;
    OUT_SPARE.give(out);
    keep
}

/// What [`take_head`] found. A return value only, never kept: its size
/// costs nothing.
#[allow(clippy::large_enum_variant)]
enum Taken {
    Partial,
    Other,
    Simple(RequestHead, Option<http::Request<ClientBody>>),
}

/// Parses the head at the start of `buf` and, when it is of the simple
/// shape and within `max_head` bytes, takes it out of `buf` as a request
/// (`None`: refused, 400); a larger head goes to hyper, which answers 431.
/// The field positions are the worker's scratch, used only here.
fn take_head(buf: &mut BytesMut, max_head: usize, max_headers: usize) -> Taken {
    SPANS.with_borrow_mut(|spans| match parse_head(buf, max_headers, spans) {
        Parse::Simple(head) if head.len > max_head => Taken::Other,
        Parse::Simple(head) => {
            let bytes = buf.split_to(head.len).freeze();
            let req = build_request(&head, &bytes, spans, ClientBody::None);
            Taken::Simple(head, req)
        }
        Parse::Other => Taken::Other,
        Parse::Partial => Taken::Partial,
    })
}

thread_local! {
    static SPANS: std::cell::RefCell<Vec<Span>> = const { std::cell::RefCell::new(Vec::new()) };
    static OUT_POOL: spare::Pool = const { std::cell::RefCell::new(Vec::new()) };
}
/// Write buffers a worker keeps for the responses it is writing.
static OUT_SPARE: Spares = Spares { pool: &OUT_POOL, keep: 64, largest: 2 * GATHER_UP_TO };

fn handover<T: AsyncRead + AsyncWrite>(mut io: ClientStream<T>, unread: BytesMut) -> Served<T> {
    io.as_mut().scan_from(&unread);
    Served::Handover(io, unread.freeze())
}

async fn close<T: AsyncRead + AsyncWrite>(mut io: ClientStream<T>) -> Served<T> {
    let _ = Box::pin(io.shutdown()).await;
    Served::Closed
}

/// Writes a response; returns whether the connection stays open.
async fn write_response<T>(
    io: &mut ClientStream<T>,
    resp: Response<ResponseBody>,
    is_head: bool,
    client_close: bool,
    out: &mut Vec<u8>,
) -> bool
where
    T: AsyncRead + AsyncWrite,
{
    let (parts, mut body) = resp.into_parts();
    let exact = body.size_hint().exact();
    let (framing, mut keep) =
        write::response_head(out, parts.status, body.raw_head(), &parts.headers, is_head, client_close, exact);
    if framing == Framing::Empty {
        drop(body);
    } else {
        let mut sent: u64 = 0;
        loop {
            let frame = match poll_now(&mut body) {
                Some(f) => f,
                None => {
                    // What is written goes out before the wait for more.
                    if !out.is_empty() {
                        if io.write_all(out).await.is_err() {
                            return false;
                        }
                        out.clear();
                    }
                    if io.flush().await.is_err() {
                        return false;
                    }
                    poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
                }
            };
            let data = match frame {
                None => break,
                // The upstream broke off: so does the client's response.
                Some(Err(_)) => return false,
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) if !d.is_empty() => d,
                    _ => continue, // trailers are not sent on HTTP/1.1
                },
            };
            sent += data.len() as u64;
            if let Framing::Length(n) = framing
                && sent > n
            {
                return false; // more than was declared
            }
            if framing == Framing::Chunked {
                put_chunk_size(out, data.len());
            }
            if out.len() + data.len() <= GATHER_UP_TO {
                out.extend_from_slice(&data);
            } else {
                if !out.is_empty() {
                    if io.write_all(out).await.is_err() {
                        return false;
                    }
                    out.clear();
                }
                if io.write_all(&data).await.is_err() {
                    return false;
                }
            }
            if framing == Framing::Chunked {
                out.extend_from_slice(b"\r\n");
            }
        }
        match framing {
            Framing::Chunked => out.extend_from_slice(b"0\r\n\r\n"),
            Framing::Length(n) if sent < n => keep = false,
            _ => {}
        }
    }
    if !out.is_empty() && io.write_all(out).await.is_err() {
        return false;
    }
    io.flush().await.is_ok() && keep
}

/// Polls the body once without waiting: `None` if it has nothing yet.
fn poll_now(body: &mut ResponseBody) -> Option<Option<Result<hyper::body::Frame<Bytes>, crate::BoxError>>> {
    let waker = futures_util::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Ready(f) => Some(f),
        Poll::Pending => None,
    }
}

/// A client stream with bytes already read put back in front: how hyper
/// gets a connection this server hands over.
pub struct Rewound<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewound<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Rewound { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let taken = self.prefix.split_to(n);
            buf.put_slice(&taken);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewound<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
