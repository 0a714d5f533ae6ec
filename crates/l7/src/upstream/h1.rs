//! HTTP/1.1 to upstreams, driven inside the request's own task: the
//! task writes the request (and its body, while the response is awaited,
//! so an upstream that answers early is heard) and reads the response head
//! itself ([`crate::h1::response`] parses it), and the response body
//! ([`H1Body`]) reads straight from the upstream socket. At the end of a
//! reusable response the connection goes back to the worker's pool. No
//! task per connection and no channels between the request and its
//! connection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use crate::spare::{self, Spares};
use bytes::{Bytes, BytesMut};
use http::Method;
use http::header;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::deadline::{expired, set_deadline};
use crate::h1::chunked::{ChunkedDecoder, Decoded, put_chunk_size};
use crate::h1::response::{Parsed, ResponseFraming, ResponseHead, parse_response};
use crate::h1::write::encode_request_head;
use crate::h1::{Framing, Span};
use crate::upstream::connect::{ConnPool, H1Conn, KeepIdle};
use crate::{BoxError, ClientBodyError};

/// Largest response head accepted from an upstream.
const MAX_HEAD: usize = 64 * 1024;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// A reused connection turned out closed before any response byte:
    /// the request may be sent again on a new connection.
    #[error("the pooled connection was closed before it answered")]
    Stale,
    #[error("{0}")]
    Io(io::Error),
    /// The upstream's response was malformed.
    #[error("malformed response: {0}")]
    BadResponse(&'static str),
    /// The client's request body failed (too large, malformed, cut off).
    #[error("the client's body: {0}")]
    ClientBody(ClientBodyError),
    /// No response head within the response timeout.
    #[error("no response head within the response timeout")]
    Timeout,
}

/// How to send a request: its serialised head and how its body goes.
pub struct Outgoing {
    /// From the worker's spare buffers, and back to them when dropped.
    pub head: Vec<u8>,
    /// The body is sent chunked (it has no Content-Length).
    pub chunked: bool,
    /// A HEAD request: the response has no body whatever it says.
    pub is_head: bool,
}

thread_local! {
    static HEAD_POOL: spare::Pool = const { std::cell::RefCell::new(Vec::new()) };
}
/// Spare request-head buffers per worker, so serialising a head does not
/// allocate once the first few requests have run; an unusually large head
/// is not kept.
static HEAD_BUFFERS: Spares = Spares { pool: &HEAD_POOL, keep: 64, largest: 16 * 1024 };

impl Outgoing {
    /// Serialises `parts`; `has_body` says whether a body follows.
    pub fn new(parts: &http::request::Parts, has_body: bool) -> Self {
        let chunked = has_body && !parts.headers.contains_key(header::CONTENT_LENGTH);
        let mut head = HEAD_BUFFERS.take().unwrap_or_default();
        encode_request_head(parts, chunked, &mut head);
        Outgoing { head, chunked, is_head: parts.method == Method::HEAD }
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        HEAD_BUFFERS.give(std::mem::take(&mut self.head));
    }
}

/// Sends a request on `conn` and reads the response head. The body is
/// written while the response is awaited, so an upstream that answers
/// early (say 413) is heard; its connection is then not reused.
pub async fn exchange<B>(
    conn: &mut H1Conn,
    out: &Outgoing,
    body: Option<&mut B>,
    head_deadline: std::time::Instant,
) -> Result<(ResponseHead, ResponseFraming), ExchangeError>
where
    B: Body<Data = Bytes, Error = ClientBodyError> + Unpin,
{
    let has_body = body.is_some();
    let reused = conn.reused;
    conn.reused = true;
    if let Err(e) = conn.io.write_all(&out.head).await {
        return Err(if reused && !has_body { ExchangeError::Stale } else { ExchangeError::Io(e) });
    }

    let mut deadline = conn.timer.deadline();
    set_deadline(conn.timer.as_mut(), &mut deadline, Instant::from_std(head_deadline));
    let timer = &mut conn.timer;
    let expired =
        std::future::poll_fn(|cx| if expired(timer.as_mut(), deadline, cx) { Poll::Ready(()) } else { Poll::Pending });
    let (mut rd, mut wr) = conn.io.split();
    let buf = &mut conn.buf;
    let chunked = out.chunked;
    let send_body = async move {
        match body {
            Some(body) => write_body(&mut wr, body, chunked).await,
            None => Ok(()),
        }
    };
    let read_head = read_response_head(&mut rd, buf, conn.read_size, &mut conn.fields, out.is_head);
    tokio::pin!(send_body, read_head, expired);
    let mut body_done = !has_body;
    let result = loop {
        tokio::select! {
            // In order: no random draw per poll, and a response that is
            // already there is taken without polling the timer.
            biased;
            sent = &mut send_body, if !body_done => {
                sent?;
                body_done = true;
            }
            head = &mut read_head => break Ok(head),
            () = &mut expired => break Err(()),
        }
    };
    let (resp, mut framing) = match result {
        Err(_) => return Err(ExchangeError::Timeout),
        Ok(Err(HeadError::ClosedEarly | HeadError::Io(_))) if reused && !has_body => return Err(ExchangeError::Stale),
        Ok(Err(HeadError::ClosedEarly)) => return Err(ExchangeError::BadResponse("closed before a response")),
        Ok(Err(HeadError::Io(e))) => return Err(ExchangeError::Io(e)),
        Ok(Err(HeadError::Bad(why))) => return Err(ExchangeError::BadResponse(why)),
        Ok(Ok(r)) => r,
    };
    if !body_done {
        // The upstream answered before taking the whole body: the rest of
        // the request would be read as the next request. Never reuse.
        framing.reusable = false;
    }
    Ok((resp, framing))
}

async fn write_body<W, B>(wr: &mut W, body: &mut B, chunked: bool) -> Result<(), ExchangeError>
where
    W: AsyncWrite + Unpin,
    B: Body<Data = Bytes, Error = ClientBodyError> + Unpin,
{
    use http_body_util::BodyExt;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(ExchangeError::ClientBody)?;
        let Ok(data) = frame.into_data() else { continue }; // trailers: not sent on HTTP/1.1
        if data.is_empty() {
            continue;
        }
        if chunked {
            let mut out = Vec::with_capacity(data.len() + 16);
            put_chunk_size(&mut out, data.len());
            out.extend_from_slice(&data);
            out.extend_from_slice(b"\r\n");
            wr.write_all(&out).await.map_err(ExchangeError::Io)?;
        } else {
            wr.write_all(&data).await.map_err(ExchangeError::Io)?;
        }
    }
    if chunked {
        wr.write_all(b"0\r\n\r\n").await.map_err(ExchangeError::Io)?;
    }
    Ok(())
}

enum HeadError {
    /// End of stream before any byte of a response.
    ClosedEarly,
    Io(io::Error),
    Bad(&'static str),
}

async fn read_response_head<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    read_size: usize,
    fields: &mut Vec<Span>,
    is_head_request: bool,
) -> Result<(ResponseHead, ResponseFraming), HeadError> {
    use tokio::io::AsyncReadExt;
    loop {
        if !buf.is_empty() {
            match parse_response(buf, is_head_request, fields).map_err(HeadError::Bad)? {
                Parsed::Final(resp, framing) => return Ok((resp, framing)),
                Parsed::Interim => continue, // 100 Continue and the like: skip
                Parsed::Partial => {}
            }
        }
        if buf.len() >= MAX_HEAD {
            return Err(HeadError::Bad("response head too large"));
        }
        buf.reserve(read_size);
        let was_empty = buf.is_empty();
        let n = rd.read_buf(buf).await.map_err(HeadError::Io)?;
        if n == 0 {
            return Err(if was_empty {
                HeadError::ClosedEarly
            } else {
                HeadError::Bad("closed inside the response head")
            });
        }
    }
}

#[derive(Debug)]
enum Reading {
    Length(u64),
    Chunked(ChunkedDecoder),
    Close,
    Done,
}

/// A response body read straight from the upstream connection. When it
/// has been read to its end and the connection is reusable, the connection
/// goes back to the worker's pool.
pub struct H1Body {
    conn: Option<H1Conn>,
    /// The response's fields, when Gatehouse's own server writes them.
    raw: Option<ResponseHead>,
    reading: Reading,
    reusable: bool,
    pool: Arc<ConnPool>,
    keep: KeepIdle,
}

impl H1Body {
    pub fn new(
        conn: H1Conn,
        framing: ResponseFraming,
        raw: Option<ResponseHead>,
        pool: Arc<ConnPool>,
        keep: KeepIdle,
    ) -> Self {
        let reading = match framing.framing {
            Framing::Empty => Reading::Done,
            Framing::Length(n) => Reading::Length(n),
            Framing::Chunked => Reading::Chunked(ChunkedDecoder::default()),
            Framing::Close => Reading::Close,
        };
        let mut body = H1Body { conn: Some(conn), raw, reading, reusable: framing.reusable, pool, keep };
        // With fields still to be written, the connection (which owns
        // their span list) goes back at the first poll or when dropped.
        if matches!(body.reading, Reading::Done) && body.raw.is_none() {
            body.release();
        }
        body
    }

    /// The response's fields, if they were left for the caller to write.
    pub fn raw_head(&self) -> Option<&ResponseHead> {
        self.raw.as_ref()
    }

    /// The body is complete: keep the connection if it can carry another
    /// exchange (nothing left over in its buffer).
    fn release(&mut self) {
        if let Some(mut conn) = self.conn.take()
            && self.reusable
            && conn.buf.is_empty()
        {
            if let Some(raw) = self.raw.as_mut() {
                conn.fields = raw.take_fields();
            }
            self.pool.put_h1(conn, self.keep);
        }
    }
}

impl Drop for H1Body {
    fn drop(&mut self) {
        // A body with nothing to read that was never polled (a response
        // to HEAD, a 204) still gives its connection back.
        if matches!(self.reading, Reading::Done) {
            self.release();
        }
    }
}

fn io_err(why: &'static str) -> BoxError {
    Box::new(io::Error::new(io::ErrorKind::InvalidData, why))
}

impl Body for H1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            match &mut this.reading {
                Reading::Done => {
                    this.release();
                    return Poll::Ready(None);
                }
                Reading::Length(left) => {
                    if !conn.buf.is_empty() {
                        let n = (*left).min(conn.buf.len() as u64) as usize;
                        let data = conn.buf.split_to(n).freeze();
                        *left -= n as u64;
                        if *left == 0 {
                            this.reading = Reading::Done;
                            this.release();
                        }
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
                Reading::Chunked(dec) => match dec.decode(&mut conn.buf) {
                    Err(why) => {
                        this.conn = None;
                        return Poll::Ready(Some(Err(io_err(why))));
                    }
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                    Ok(Decoded::End) => {
                        this.reading = Reading::Done;
                        continue;
                    }
                    Ok(Decoded::NeedMore) => {}
                },
                Reading::Close => {
                    if !conn.buf.is_empty() {
                        let data = conn.buf.split().freeze();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                }
            }
            // Need more bytes from the upstream.
            let Some(conn) = this.conn.as_mut() else { return Poll::Ready(None) };
            match ready!(conn.poll_fill(cx)) {
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(Box::new(e))));
                }
                Ok(0) => {
                    if matches!(this.reading, Reading::Close) {
                        this.conn = None;
                        this.reading = Reading::Done;
                        return Poll::Ready(None);
                    }
                    this.conn = None;
                    return Poll::Ready(Some(Err(io_err("upstream closed inside the response body"))));
                }
                Ok(_) => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.reading, Reading::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.reading {
            Reading::Length(n) => SizeHint::with_exact(n),
            Reading::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    #[test]
    fn request_head_buffers_are_reused_whole() {
        let (long, ()) = Request::get("/a-long-path").header("x-a", "1").body(()).expect("req").into_parts();
        let (short, ()) = Request::get("/").body(()).expect("req").into_parts();
        drop(Outgoing::new(&long, false));
        assert_eq!(Outgoing::new(&short, false).head, b"GET / HTTP/1.1\r\n\r\n");
    }
}
