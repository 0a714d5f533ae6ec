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

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http::{Method, Response};
use hyper::body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::accesslog::reason;
use crate::body::ClientBody;
use crate::body::ResponseBody;
use crate::downstream::conn::{ClientStream, ConnState, Open};
use crate::downstream::handover::{DRAIN_IDLE_GRACE, handed_over};
use crate::gather::LastWrites;
use crate::h1::chunked::put_chunk_size;
use crate::h1::request::{Parse, RequestHead, build_request, parse_head};
use crate::h1::{CLIENT_READ_CHUNK, Framing, Span, write};
use crate::idle::{poll_read_fresh, read_fresh};
use crate::proxy::{self, HeadWriter};
use crate::spare::{self, Spares};

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

/// Serves requests on one HTTP/1.x connection until it closes, then
/// hands it to [`handed_over`] if a request needs hyper or the client
/// sent the HTTP/2 preface. Once the process drains, the next response
/// says `Connection: close`, and an idle connection with no request within
/// [`DRAIN_IDLE_GRACE`] is closed. `open` counts the connection open until
/// this ends. `alpn_h2`: `Some(false)` on TLS, `None` on cleartext.
///
/// Between requests this holds the connection, `open` and a drain wait,
/// nothing else: every other step is in [`exchange`] or after the
/// handover, boxed, so the connection's task (as large as its largest
/// state, and keeping room for its arguments all its life) stays small
/// while it is idle (`docs/ARCHITECTURE.md`, idle connections). It is an
/// `async` block rather than an `async fn` because a function's arguments
/// would be kept twice.
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub fn serve<T>(mut io: ClientStream<T>, open: Open, alpn_h2: Option<bool>) -> impl Future<Output = ()> + Send
where
    T: AsyncRead + AsyncWrite + LastWrites + Send + Unpin + 'static,
{
    async move {
        io.as_mut().stop_scanning();
        // Made once for the connection's life, before the flag is read.
        let drained = open.worker.shared.drained(open.worker.id);
        tokio::pin!(drained);
        let mut draining = open.worker.shared.is_draining();
        let unread = loop {
            let step = {
                // Scoped: nothing of the wait outlives it but the step.
                let woke = if draining {
                    Woke::Drain
                } else {
                    poll_fn(|cx| {
                        if let Poll::Ready(read) = poll_read_fresh(io.as_mut(), cx) {
                            return Poll::Ready(match read {
                                Ok(bytes) if !bytes.is_empty() => Woke::Read(bytes),
                                _ => Woke::Gone,
                            });
                        }
                        drained.as_mut().poll(cx).map(|()| Woke::Drain)
                    })
                    .await
                };
                match woke {
                    Woke::Read(first) => Box::pin(exchange(&mut io, Some(first))),
                    Woke::Drain => {
                        draining = true;
                        Box::pin(exchange(&mut io, None))
                    }
                    Woke::Gone => return,
                }
            };
            match step.await {
                Next::Idle => {}
                Next::Closed => return,
                Next::Handover(unread) => break unread,
            }
        };
        io.as_mut().scan_from(&unread);
        handed_over(io, unread.freeze(), alpn_h2).await;
    }
}

/// What ended an idle wait.
enum Woke {
    /// The first bytes of a request.
    Read(BytesMut),
    /// The process drains.
    Drain,
    /// The client closed, or the connection failed or timed out.
    Gone,
}

/// What the connection does after an [`exchange`].
enum Next {
    /// Every byte read is answered: wait for the next request.
    Idle,
    /// Closed (by the client, or here after an answer that said so or a
    /// failed write).
    Closed,
    /// hyper (or the HTTP/2 server) takes it, these bytes first.
    Handover(BytesMut),
}

/// Reads the rest of a request head that began with `first`, answers it,
/// and goes on while pipelined requests follow. `None`: the process
/// drains; the client has [`DRAIN_IDLE_GRACE`] to begin a request.
async fn exchange<T>(io: &mut ClientStream<T>, first: Option<BytesMut>) -> Next
where
    T: AsyncRead + AsyncWrite + LastWrites + Unpin,
{
    let state = io.state().clone();
    let (max_head, max_headers) = {
        let snap = state.worker.shared.snapshot.load();
        (snap.http.max_header_bytes, snap.http.max_headers)
    };
    let mut buf = match first {
        Some(bytes) => bytes,
        None => {
            state.closing.store(true, Ordering::Relaxed);
            match tokio::time::timeout(DRAIN_IDLE_GRACE, read_fresh(io.as_mut())).await {
                Ok(Ok(bytes)) if !bytes.is_empty() => bytes,
                Ok(_) => return Next::Closed,
                Err(_) => return close(io).await,
            }
        }
    };
    loop {
        if io.is_h2() {
            return Next::Handover(buf);
        }
        let (head, req) = match take_head(&mut buf, max_head, max_headers) {
            Taken::Simple(head, req) => (head, req),
            Taken::Other => return Next::Handover(buf),
            Taken::Partial if buf.len() >= max_head => return Next::Handover(buf),
            Taken::Partial => match read_more(io, &mut buf).await {
                Ok(0) | Err(_) => return Next::Closed,
                Ok(_) => continue,
            },
        };
        let Some(req) = req else {
            state.log_rejected(400, reason::BAD_REQUEST);
            io.as_mut().last_writes();
            let _ = io.write_all(RESPONSE_400).await;
            return close(io).await;
        };
        io.as_mut().begin_request();
        if !answer(io, req, &state, head.method == Method::HEAD, head.close).await {
            return close(io).await;
        }
        if buf.is_empty() {
            return Next::Idle;
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
    T: AsyncRead + AsyncWrite + LastWrites + Unpin,
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

async fn close<T: AsyncRead + AsyncWrite>(io: &mut ClientStream<T>) -> Next {
    let _ = io.shutdown().await;
    Next::Closed
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
    T: AsyncRead + AsyncWrite + LastWrites + Unpin,
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
    if !keep {
        io.as_mut().last_writes();
    }
    if !out.is_empty() && io.write_all(out).await.is_err() {
        return false;
    }
    // The close that follows sends what is left (the shutdown flushes).
    keep && io.flush().await.is_ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    fn future_size<A, B, C, R>(_f: impl FnOnce(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// A cleartext connection's task is this future: while the connection
    /// is idle, the task is all it holds but its `ClientIo` and state.
    #[test]
    fn an_idle_connections_task_stays_small() {
        let size = future_size(serve::<tokio::net::TcpStream>);
        eprintln!("serve: {size} bytes");
        assert!(size <= 160, "the idle task's future is {size} bytes");
    }
}
