//! HTTP/1.1 to upstreams, driven inside the request's own task.
//!
//! hyper's client runs each upstream connection as a separate task and
//! hands requests, responses and body chunks across channels; measured on
//! the proxy path, that hand-off was most of the CPU Gatehouse spent above
//! HAProxy per request (docs/BENCHMARKS.md). Here the request's task writes
//! the request and reads the response head itself, and the response body
//! reads straight from the upstream socket; at the end of a reusable
//! response the connection goes back to the worker's pool.
//!
//! The response parser is strict, as a proxy's must be: a response whose
//! length is ambiguous (Content-Length with Transfer-Encoding, differing
//! Content-Lengths) or malformed is refused, and its connection is never
//! reused.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;
use crate::deadline::{expired, set_deadline};
use crate::h1::{
    HOP_CONNECTION, HOP_TRANSFER_ENCODING, connection_tokens, hop_by_hop_name, is_connection_option, put_chunk_size,
};
use crate::upstream::{ConnPool, KeepIdle};

/// Largest response head accepted from an upstream.
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
const READ_CHUNK: usize = 16 * 1024;

/// An open HTTP/1.1 connection to an upstream endpoint.
pub struct H1Conn {
    pub(crate) io: TcpStream,
    /// Bytes read but not consumed yet.
    pub(crate) buf: BytesMut,
    pub addr: SocketAddr,
    /// Has carried an exchange before (a failure may be a stale close).
    pub reused: bool,
    /// The response timer, kept for the connection's life and re-armed
    /// lazily: an exchange only moves a deadline, so the timer wheel is
    /// touched about once per timeout period, not once per request.
    timer: Pin<Box<Sleep>>,
    /// Span list for response heads, lent to each [`ResponseHead`] and
    /// given back, so parsing a head allocates nothing.
    fields: Vec<Span>,
}

impl H1Conn {
    pub fn new(io: TcpStream, addr: SocketAddr) -> Self {
        let timer = Box::pin(tokio::time::sleep(Duration::from_secs(24 * 3600)));
        H1Conn {
            io,
            buf: BytesMut::with_capacity(READ_CHUNK),
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
    }

    /// Reads more bytes into the buffer; Ok(0) at end of stream.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(READ_CHUNK);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }

    pub fn into_parts(self) -> (TcpStream, BytesMut) {
        (self.io, self.buf)
    }
}

/// Why an exchange failed.
#[derive(Debug)]
pub enum ExchangeError {
    /// A reused connection turned out closed before any response byte:
    /// the request may be sent again on a new connection.
    Stale,
    Io(io::Error),
    /// The upstream's response was malformed.
    BadResponse(&'static str),
    /// The client's request body failed (too large, malformed, cut off).
    ClientBody(BoxError),
    /// No response head within the response timeout.
    Timeout,
}

/// How a message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// Serialises a request head. `chunked`: the body is sent chunked.
fn encode_head(req: &http::request::Parts, chunked: bool, out: &mut Vec<u8>) {
    out.reserve(256);
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.extend_from_slice(b" ");
    out.extend_from_slice(req.uri.path_and_query().map_or("/", |pq| pq.as_str()).as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &req.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    out.extend_from_slice(b"\r\n");
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

/// Spare request-head buffers per worker, so serialising a head does not
/// allocate once the first few requests have run.
const SPARE_HEADS: usize = 64;

thread_local! {
    static HEAD_BUFFERS: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Outgoing {
    /// Serialises `parts`; `has_body` says whether a body follows.
    pub fn new(parts: &http::request::Parts, has_body: bool) -> Self {
        let chunked = has_body && !parts.headers.contains_key(header::CONTENT_LENGTH);
        let mut head = HEAD_BUFFERS.with_borrow_mut(Vec::pop).unwrap_or_default();
        encode_head(parts, chunked, &mut head);
        Outgoing { head, chunked, is_head: parts.method == Method::HEAD }
    }
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        let mut head = std::mem::take(&mut self.head);
        // An unusually large head is not kept.
        if head.capacity() <= 16 * 1024 {
            head.clear();
            HEAD_BUFFERS.with_borrow_mut(|spare| {
                if spare.len() < SPARE_HEADS {
                    spare.push(head);
                }
            });
        }
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
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
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
    let read_head = read_response_head(&mut rd, buf, &mut conn.fields, out.is_head);
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

/// The body framing of a response and whether its connection can be reused.
#[derive(Debug, Clone, Copy)]
pub struct ResponseFraming {
    framing: Framing,
    pub reusable: bool,
}

async fn write_body<W, B>(wr: &mut W, body: &mut B, chunked: bool) -> Result<(), ExchangeError>
where
    W: AsyncWrite + Unpin,
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
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
    fields: &mut Vec<Span>,
    is_head_request: bool,
) -> Result<(ResponseHead, ResponseFraming), HeadError> {
    use tokio::io::AsyncReadExt;
    loop {
        if !buf.is_empty() {
            match parse_response(buf, is_head_request, fields)? {
                Parsed::Final(resp, framing) => return Ok((resp, framing)),
                Parsed::Interim => continue, // 100 Continue and the like: skip
                Parsed::Partial => {}
            }
        }
        if buf.len() >= MAX_HEAD {
            return Err(HeadError::Bad("response head too large"));
        }
        buf.reserve(READ_CHUNK);
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

enum Parsed {
    Final(ResponseHead, ResponseFraming),
    Interim,
    Partial,
}

/// (name start, name end, value start, value end) of one header field in
/// a head's bytes.
pub type Span = (u32, u32, u32, u32);

/// A response head from an upstream: its status line and its fields as
/// they arrived, less the hop-by-hop ones (those of RFC 9110 §7.6.1 and the
/// names Connection lists; a 101 keeps them, since the client needs its
/// Upgrade and Connection). The fields stay spans of the head's bytes:
/// Gatehouse's own HTTP/1.1 server writes them out as they are, and
/// [`ResponseHead::header_map`] makes hyper's map from them.
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    bytes: Bytes,
    /// The upstream connection's span list, lent for this response.
    fields: Vec<Span>,
}

impl ResponseHead {
    /// The fields with each one's text as it arrived, from its name to the
    /// end of its value (`name: value`, whatever the spacing).
    pub fn field_lines(&self) -> impl Iterator<Item = (&[u8], &[u8], &[u8])> {
        self.fields.iter().map(|&(n0, n1, v0, v1)| {
            let b = &self.bytes;
            (&b[n0 as usize..n1 as usize], &b[v0 as usize..v1 as usize], &b[n0 as usize..v1 as usize])
        })
    }

    /// The fields as a header map (values share the head's bytes). Every
    /// field was checked when the head was parsed.
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.fields.len());
        for &(n0, n1, v0, v1) in &self.fields {
            let name = HeaderName::from_bytes(&self.bytes[n0 as usize..n1 as usize]);
            let value = HeaderValue::from_maybe_shared(self.bytes.slice(v0 as usize..v1 as usize));
            if let (Ok(name), Ok(value)) = (name, value) {
                map.append(name, value);
            }
        }
        map
    }

    /// Gives the span list back to the connection it came from.
    pub fn return_fields(&mut self, conn: &mut H1Conn) {
        conn.fields = std::mem::take(&mut self.fields);
    }
}

/// Parses a response head at the start of `buf`; the kept fields' spans
/// go into `fields` (cleared first), which the head then holds.
fn parse_response(buf: &mut BytesMut, is_head_request: bool, fields: &mut Vec<Span>) -> Result<Parsed, HeadError> {
    // Left uninitialised: httparse writes only the headers it finds.
    let mut headers = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut r, buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::Bad("too many response headers")),
        Err(_) => return Err(HeadError::Bad("malformed response head")),
    };
    let code = r.code.ok_or(HeadError::Bad("no status"))?;
    let status = StatusCode::from_u16(code).map_err(|_| HeadError::Bad("invalid status"))?;
    let version = if r.version == Some(1) { Version::HTTP_11 } else { Version::HTTP_10 };
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        buf.advance(len);
        return Ok(Parsed::Interim);
    }
    let keep_hop_by_hop = status == StatusCode::SWITCHING_PROTOCOLS;
    let base = buf.as_ptr() as usize;
    let mut content_length: Option<u64> = None;
    let mut transfer_encoding: Option<bool> = None; // Some(last coding is chunked)
    let mut close = version == Version::HTTP_10;
    // Other fields Connection names as hop-by-hop (a rare shape: the list
    // is allocated only then).
    let mut listed: Vec<&[u8]> = Vec::new();
    fields.clear();
    for h in r.headers.iter() {
        let (name, value) = (h.name.as_bytes(), h.value);
        // httparse has checked the name is a token and the value holds only
        // HTAB, SP, visible ASCII and obs-text: what a header map takes.
        let hop = hop_by_hop_name(name);
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_content_length(value).ok_or(HeadError::Bad("invalid content-length"))?;
            if content_length.is_some_and(|prev| prev != n) {
                return Err(HeadError::Bad("conflicting content-length"));
            }
            content_length = Some(n);
        } else if hop == HOP_TRANSFER_ENCODING {
            let last = value.rsplit(|&b| b == b',').next().unwrap_or(b"").trim_ascii();
            transfer_encoding = Some(last.eq_ignore_ascii_case(b"chunked"));
        } else if hop == HOP_CONNECTION {
            for token in connection_tokens(value) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    if version == Version::HTTP_10 {
                        close = false;
                    }
                } else if !is_connection_option(token) {
                    listed.push(token);
                }
            }
        }
        if !keep_hop_by_hop && hop != 0 {
            continue;
        }
        let n = name.as_ptr() as usize - base;
        let v = value.as_ptr() as usize - base;
        fields.push((n as u32, (n + name.len()) as u32, v as u32, (v + value.len()) as u32));
    }
    if !listed.is_empty() && !keep_hop_by_hop {
        // Drop the fields Connection lists (their names compared
        // case-blind, as header names are).
        let head = &buf[..len];
        fields.retain(|&(n0, n1, _, _)| {
            let name = &head[n0 as usize..n1 as usize];
            !listed.iter().any(|t| t.eq_ignore_ascii_case(name))
        });
    }
    let no_body = is_head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let framing = if status == StatusCode::SWITCHING_PROTOCOLS {
        ResponseFraming { framing: Framing::Empty, reusable: false }
    } else if no_body {
        ResponseFraming { framing: Framing::Empty, reusable: !close }
    } else {
        match (transfer_encoding, content_length) {
            (Some(_), Some(_)) => return Err(HeadError::Bad("both content-length and transfer-encoding")),
            (Some(true), None) => ResponseFraming { framing: Framing::Chunked, reusable: !close },
            (Some(false), None) => ResponseFraming { framing: Framing::Close, reusable: false },
            (None, Some(0)) => ResponseFraming { framing: Framing::Empty, reusable: !close },
            (None, Some(n)) => ResponseFraming { framing: Framing::Length(n), reusable: !close },
            (None, None) => ResponseFraming { framing: Framing::Close, reusable: false },
        }
    };
    let bytes = buf.split_to(len).freeze();
    Ok(Parsed::Final(ResponseHead { status, version, bytes, fields: std::mem::take(fields) }, framing))
}

fn parse_content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Strict chunked-body decoder state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a size line.
    Size,
    /// `n` bytes of chunk data left.
    Data(u64),
    /// The CRLF after chunk data.
    DataEnd,
    /// Trailer lines after the last chunk, until an empty line.
    Trailers,
    Done,
}

/// What the decoder got from the buffer.
#[derive(Debug, PartialEq, Eq)]
enum Decoded {
    Data(Bytes),
    NeedMore,
    End,
}

#[derive(Debug)]
struct ChunkedDecoder {
    state: Chunk,
}

impl ChunkedDecoder {
    fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, &'static str> {
        loop {
            match self.state {
                Chunk::Size => {
                    let Some(eol) = buf.iter().position(|&b| b == b'\n') else {
                        return if buf.len() > 1024 { Err("chunk size line too long") } else { Ok(Decoded::NeedMore) };
                    };
                    let line = &buf[..eol];
                    let line = line.strip_suffix(b"\r").ok_or("chunk size line without CR")?;
                    let digits = line.split(|&b| b == b';').next().unwrap_or(b"").trim_ascii_end();
                    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
                        return Err("invalid chunk size");
                    }
                    let size = u64::from_str_radix(std::str::from_utf8(digits).map_err(|_| "invalid chunk size")?, 16)
                        .map_err(|_| "invalid chunk size")?;
                    buf.advance(eol + 1);
                    self.state = if size == 0 { Chunk::Trailers } else { Chunk::Data(size) };
                }
                Chunk::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = left.min(buf.len() as u64) as usize;
                    let data = buf.split_to(n).freeze();
                    self.state = if left == n as u64 { Chunk::DataEnd } else { Chunk::Data(left - n as u64) };
                    return Ok(Decoded::Data(data));
                }
                Chunk::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err("chunk data not followed by CRLF");
                    }
                    buf.advance(2);
                    self.state = Chunk::Size;
                }
                Chunk::Trailers => {
                    let Some(eol) = buf.iter().position(|&b| b == b'\n') else {
                        return if buf.len() > 8192 { Err("trailers too long") } else { Ok(Decoded::NeedMore) };
                    };
                    let empty = eol == 0 || (eol == 1 && buf[0] == b'\r');
                    buf.advance(eol + 1);
                    if empty {
                        self.state = Chunk::Done;
                    }
                }
                Chunk::Done => return Ok(Decoded::End),
            }
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
            Framing::Chunked => Reading::Chunked(ChunkedDecoder { state: Chunk::Size }),
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
                raw.return_fields(&mut conn);
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

    fn decode_all(input: &[u8], split: usize) -> Result<Vec<u8>, &'static str> {
        let mut dec = ChunkedDecoder { state: Chunk::Size };
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for part in [&input[..split], &input[split..]] {
            buf.extend_from_slice(part);
            loop {
                match dec.decode(&mut buf)? {
                    Decoded::Data(d) => out.extend_from_slice(&d),
                    Decoded::NeedMore => break,
                    Decoded::End => return Ok(out),
                }
            }
        }
        Err("incomplete")
    }

    #[test]
    fn chunked_bodies_decode_however_they_arrive() {
        let input = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for split in 0..=input.len() {
            assert_eq!(decode_all(input, split).as_deref(), Ok(&b"hello  world"[..]), "split {split}");
        }
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for bad in
            [&b"zz\r\nhello\r\n0\r\n\r\n"[..], b"5\r\nhelloXX0\r\n\r\n", b"5\nhello\r\n0\r\n\r\n", b"\r\n", b"-1\r\n"]
        {
            assert!(decode_all(bad, bad.len()).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(decode_all(b"fffffffffffffffff\r\n", 19).is_err(), "size overflow");
    }

    fn parse(head: &[u8], is_head: bool) -> Result<(http::Response<()>, ResponseFraming, usize), &'static str> {
        let mut buf = BytesMut::from(head);
        let before = buf.len();
        let mut fields = Vec::new();
        loop {
            match parse_response(&mut buf, is_head, &mut fields) {
                Ok(Parsed::Final(h, f)) => {
                    // The fields as written raw and as a header map agree.
                    let map = h.header_map();
                    assert_eq!(h.field_lines().count(), map.len());
                    for (name, value, line) in h.field_lines() {
                        assert!(line.starts_with(name) && line.ends_with(value) && line[name.len()] == b':');
                        let name = std::str::from_utf8(name).expect("ascii");
                        assert!(map.get_all(name).iter().any(|v| v.as_bytes() == value), "{name}");
                    }
                    let mut r = http::Response::new(());
                    *r.status_mut() = h.status;
                    *r.headers_mut() = map;
                    return Ok((r, f, before - buf.len()));
                }
                Ok(Parsed::Interim) => continue,
                Ok(Parsed::Partial) => return Err("partial"),
                Err(HeadError::Bad(why)) => return Err(why),
                Err(_) => return Err("io"),
            }
        }
    }

    #[test]
    fn hop_by_hop_response_headers_are_left_out_except_in_a_101() {
        let head = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Secret\r\nKeep-Alive: timeout=5\r\nX-Secret: 1\r\n\
            Proxy-Connection: x\r\nTrailer: x\r\nTransfer-Encoding: chunked\r\nX-Kept: 2\r\n\r\n";
        let (r, f, _) = parse(head, false).expect("ok");
        assert_eq!(f.framing, Framing::Chunked);
        let names: Vec<&str> = r.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-kept"]);
        let (r, _, _) =
            parse(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", false)
                .expect("ok");
        assert_eq!(r.headers().get(header::UPGRADE).map(|v| v.as_bytes()), Some(&b"websocket"[..]));
        assert_eq!(r.headers().get(header::CONNECTION).map(|v| v.as_bytes()), Some(&b"Upgrade"[..]));
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        let (r, f, _) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false).expect("ok");
        assert_eq!((r.status(), f.framing, f.reusable), (StatusCode::OK, Framing::Length(5), true));
        let (_, f, _) = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", false).expect("ok");
        assert_eq!(f.framing, Framing::Chunked);
        let (_, f, _) = parse(b"HTTP/1.1 200 OK\r\n\r\n", false).expect("ok");
        assert_eq!((f.framing, f.reusable), (Framing::Close, false));
        let (_, f, _) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n", false).expect("ok");
        assert!(!f.reusable);
        let (_, f, _) = parse(b"HTTP/1.1 204 No Content\r\n\r\n", false).expect("ok");
        assert_eq!(f.framing, Framing::Empty);
        let (_, f, _) = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", true).expect("ok");
        assert_eq!(f.framing, Framing::Empty, "HEAD responses have no body");
        let (_, f, _) = parse(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false).expect("ok");
        assert!(!f.reusable, "HTTP/1.0 closes by default");
        let (r, _, used) =
            parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", false)
                .expect("ok");
        assert_eq!((r.status(), used), (StatusCode::CREATED, 68));
    }

    #[test]
    fn mutated_response_heads_never_panic_and_kept_fields_are_valid() {
        let seeds: [&[u8]; 5] = [
            b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 23 Nov 2026 10:00:00 GMT\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: X-A, close\r\nX-A: 1\r\nKeep-Alive: t=5\r\n\r\n",
            b"HTTP/1.0 404 Not Found\nX-Obs: caf\xc3\xa9\nX-Empty:\n\n",
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nTE: x\r\n\r\n",
        ];
        let parsed = crate::h1server::tests::fuzz_heads(&seeds, 0x6a7e_4005f, |input| {
            let mut buf = BytesMut::from(input);
            let mut fields = Vec::new();
            let head = loop {
                match parse_response(&mut buf, false, &mut fields) {
                    Ok(Parsed::Final(h, _)) => break Some(h),
                    Ok(Parsed::Interim) => continue,
                    _ => break None,
                }
            };
            let Some(head) = head else { return false };
            // Every field written raw to a client is one a header map takes
            // (the map is what hyper's clients get), and none is hop-by-hop
            // outside a 101.
            assert_eq!(head.header_map().len(), head.field_lines().count(), "{:?}", String::from_utf8_lossy(input));
            for (name, value, line) in head.field_lines() {
                assert!(line.starts_with(name) && line.ends_with(value));
                if head.status != StatusCode::SWITCHING_PROTOCOLS {
                    assert_eq!(hop_by_hop_name(name), 0, "{:?}", String::from_utf8_lossy(input));
                }
            }
            true
        });
        assert!(parsed > 1_000, "only {parsed} mutated heads parsed");
    }

    #[test]
    fn fields_connection_lists_go_whatever_their_case() {
        let head = b"HTTP/1.1 200 OK\r\nConnection: X-Secret, keep-alive\r\nx-secret: 1\r\nX-SECRET: 2\r\nX-Kept: 3\r\nContent-Length: 0\r\n\r\n";
        let (r, _, _) = parse(head, false).expect("ok");
        let names: Vec<&str> = r.headers().keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-kept", "content-length"]);
        assert!(parse(b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\n\r\n", false).is_err(), "DEL in a value");
    }

    #[test]
    fn ambiguous_or_malformed_responses_are_refused() {
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n",
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"SSH-2.0\r\n\r\n",
        ] {
            assert!(parse(bad, false).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn request_heads_are_serialised() {
        let (parts, ()) = Request::post("/a?b=1")
            .header("host", "x")
            .header("content-length", "3")
            .body(())
            .expect("req")
            .into_parts();
        let mut out = Vec::new();
        encode_head(&parts, false, &mut out);
        assert_eq!(&out[..], b"POST /a?b=1 HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\n");
        let (parts, ()) = Request::put("/").body(()).expect("req").into_parts();
        out.clear();
        encode_head(&parts, true, &mut out);
        assert_eq!(&out[..], b"PUT / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n");
        // Buffers are reused: a head written after a longer one is whole.
        let (long, ()) = Request::get("/a-long-path").header("x-a", "1").body(()).expect("req").into_parts();
        let (short, ()) = Request::get("/").body(()).expect("req").into_parts();
        drop(Outgoing::new(&long, false));
        assert_eq!(Outgoing::new(&short, false).head, b"GET / HTTP/1.1\r\n\r\n");
    }
}
