//! Gatehouse's own HTTP/1.1 server for the requests that make up nearly all
//! of an edge's traffic: a complete head, HTTP/1.1, no body, no upgrade.
//!
//! hyper's server is general: it reads ahead while a request runs (and so
//! cannot reuse its read buffer, allocating a new one per request), builds
//! and encodes through layers meant for every case. Measured on the proxy
//! path, that generality was the largest user-space cost left per request
//! (docs/BENCHMARKS.md). This loop reads a head, parses it strictly with
//! httparse, hands the request to the same [`crate::proxy::handle`] hyper
//! uses, and writes the response head and body itself.
//!
//! Anything else is handed to hyper with the bytes read so far, and hyper
//! serves the rest of the connection: a request with a body (Content-Length
//! or Transfer-Encoding), `Expect`, an `Upgrade`, HTTP/1.0, CONNECT, a head
//! httparse refuses or that is too large or has too many fields (hyper then
//! answers 400 or 431 as before), and the HTTP/2 preface. So every rule
//! about bodies, smuggling shapes and malformed heads keeps one home.
//!
//! Timeouts (408 for a slow head, the idle timeout) come from the
//! [`ClientIo`] this reads through, as they do under hyper.

use std::future::poll_fn;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use hyper::body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;

use crate::accesslog::reason;
use crate::body::ResponseBody;
use crate::conn::{ClientIo, ConnState};
use crate::h1::{HOP_CONNECTION, HOP_TRANSFER_ENCODING, HOP_UPGRADE, hop_by_hop_name, put_chunk_size, says_close};
use crate::proxy::ClientBody;

pub type ClientStream<T> = Pin<Box<ClientIo<T>>>;

/// How the loop ended.
pub enum Served<T> {
    /// The connection is done (closed by either side, or after an error).
    Closed,
    /// hyper takes the connection from here; these bytes, read but not
    /// consumed, come first.
    Handover(ClientStream<T>, Bytes),
}

/// Bytes read at a time.
const READ_CHUNK: usize = 8 * 1024;
/// Header slots for httparse; a head with more fields than this (or than
/// `max_headers`) goes to hyper, which answers 431.
const HEADER_SLOTS: usize = 128;
/// Body bytes gathered with the head into one write.
const GATHER_UP_TO: usize = 16 * 1024;
/// The write buffer a connection keeps between responses.
const SMALL_WRITE_BUFFER: usize = 2048;

const RESPONSE_400: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: 16\r\nconnection: close\r\n\r\n400 Bad Request\n";

/// Where a request head's pieces lie in the buffer, found while it is
/// borrowed by the parser.
struct Head {
    len: usize,
    method: Method,
    path: (usize, usize),
    fields: usize,
    /// The client said `Connection: close`.
    close: bool,
}

/// (name start, name end, value start, value end) of one header field.
type Span = (u32, u32, u32, u32);

enum Parse {
    Partial,
    Simple(Head),
    /// Not for this loop: hyper takes it.
    Other,
}

/// Parses a request head at the start of `buf`. Only the simple shape is
/// taken (see the module docs); `spans` receives its fields (a vector
/// kept per connection, so no per-request array is zeroed).
fn parse_head(buf: &[u8], max_headers: usize, spans: &mut Vec<Span>) -> Parse {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; HEADER_SLOTS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut slots[..max_headers.min(HEADER_SLOTS)]) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parse::Partial,
        Err(_) => return Parse::Other,
    };
    let (Some(1), Some(method), Some(path)) = (req.version, req.method, req.path) else { return Parse::Other };
    let method = match method {
        "GET" => Method::GET,
        "HEAD" => Method::HEAD,
        "CONNECT" => return Parse::Other,
        other => match Method::from_bytes(other.as_bytes()) {
            Ok(m) => m,
            Err(_) => return Parse::Other,
        },
    };
    let base = buf.as_ptr() as usize;
    let mut close = false;
    spans.clear();
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        let other = match name.len() {
            14 => name.eq_ignore_ascii_case(b"content-length"),
            6 => name.eq_ignore_ascii_case(b"expect"),
            _ => match hop_by_hop_name(name) {
                HOP_TRANSFER_ENCODING | HOP_UPGRADE => true,
                HOP_CONNECTION => {
                    close |= says_close(h.value);
                    false
                }
                _ => false,
            },
        };
        if other {
            return Parse::Other;
        }
        let n = name.as_ptr() as usize - base;
        let v = h.value.as_ptr() as usize - base;
        spans.push((n as u32, (n + name.len()) as u32, v as u32, (v + h.value.len()) as u32));
    }
    let p = path.as_ptr() as usize - base;
    Parse::Simple(Head { len, method, path: (p, p + path.len()), fields: req.headers.len(), close })
}

/// The request a head describes; `None` if a field or the target is not
/// valid HTTP (the client gets 400).
fn build_request(head: &Head, bytes: &Bytes, spans: &[Span]) -> Option<Request<ClientBody>> {
    let uri = Uri::from_maybe_shared(bytes.slice(head.path.0..head.path.1)).ok()?;
    // Room for the X-Forwarded-* fields the proxy adds, so they do not
    // make the map grow and rehash.
    let mut headers = HeaderMap::with_capacity(head.fields + 3);
    for &(n0, n1, v0, v1) in spans {
        let name = HeaderName::from_bytes(&bytes[n0 as usize..n1 as usize]).ok()?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(v0 as usize..v1 as usize)).ok()?;
        headers.append(name, value);
    }
    let mut req = Request::new(ClientBody::Empty);
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    Some(req)
}

async fn read_more<T>(io: &mut ClientStream<T>, buf: &mut BytesMut) -> std::io::Result<usize>
where
    T: AsyncRead + AsyncWrite,
{
    if buf.capacity() - buf.len() < 1024 {
        buf.reserve(READ_CHUNK);
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
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    let mut out: Vec<u8> = Vec::with_capacity(SMALL_WRITE_BUFFER);
    let mut spans: Vec<Span> = Vec::with_capacity(16);
    let mut draining = false;
    // Registered once for the connection's life, not per request.
    let drained = drain.wait_for(|d| *d);
    tokio::pin!(drained);
    loop {
        let head = loop {
            if !buf.is_empty() {
                if io.is_h2() {
                    return handover(io, buf);
                }
                match parse_head(&buf, max_headers, &mut spans) {
                    Parse::Simple(head) => break head,
                    Parse::Other => return handover(io, buf),
                    Parse::Partial if buf.len() >= max_head => return handover(io, buf),
                    Parse::Partial => {}
                }
            }
            let read = if !buf.is_empty() {
                read_more(&mut io, &mut buf).await
            } else if draining {
                match tokio::time::timeout(grace, read_more(&mut io, &mut buf)).await {
                    Ok(r) => r,
                    Err(_) => return close(io).await,
                }
            } else {
                tokio::select! {
                    biased;
                    r = read_more(&mut io, &mut buf) => r,
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
        let bytes = buf.split_to(head.len).freeze();
        let Some(req) = build_request(&head, &bytes, &spans) else {
            state.log_rejected(400, reason::BAD_REQUEST);
            let _ = io.write_all(RESPONSE_400).await;
            return close(io).await;
        };
        drop(bytes);
        io.as_mut().begin_request();
        let is_head = head.method == Method::HEAD;
        let Ok(resp) = crate::proxy::handle(req, state.clone()).await;
        if !write_response(&mut io, resp, is_head, head.close, &mut out).await {
            return close(io).await;
        }
        // A large body gathered with its head grew the write buffer; an
        // idle keep-alive connection does not hold on to it.
        if out.capacity() > SMALL_WRITE_BUFFER {
            out = Vec::with_capacity(SMALL_WRITE_BUFFER);
        }
    }
}

fn handover<T: AsyncRead + AsyncWrite>(mut io: ClientStream<T>, unread: BytesMut) -> Served<T> {
    io.as_mut().scan_from(&unread);
    Served::Handover(io, unread.freeze())
}

async fn close<T: AsyncRead + AsyncWrite>(mut io: ClientStream<T>) -> Served<T> {
    let _ = io.shutdown().await;
    Served::Closed
}

/// How the response body is delimited on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
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
    let status = parts.status;
    let mut keep = !client_close && status != StatusCode::SWITCHING_PROTOCOLS;
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let bodiless =
        is_head || status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    let mut fields =
        FieldWriter { out, bodiless, declared: None, has_length: false, has_date: false, says_close: false };
    // An HTTP/1.1 upstream's fields as they came, then any the proxy added.
    if let Some(raw) = body.raw_head() {
        for (name, value, line) in raw.field_lines() {
            fields.put_line(name, value, line);
        }
    }
    for (name, value) in &parts.headers {
        fields.put(name.as_str().as_bytes(), value.as_bytes());
    }
    let FieldWriter { out, declared, has_length, has_date, says_close, .. } = fields;
    if says_close {
        keep = false;
    }
    let framing = if bodiless {
        // A response to HEAD says the length the GET would have had, when
        // it is known.
        if is_head
            && !status.is_informational()
            && !has_length
            && let Some(n) = body.size_hint().exact()
            && n > 0
        {
            put_field(out, b"content-length", itoa::Buffer::new().format(n).as_bytes());
        }
        Framing::None
    } else if let Some(n) = body.size_hint().exact().or(declared) {
        put_field(out, b"content-length", itoa::Buffer::new().format(n).as_bytes());
        Framing::Length(n)
    } else {
        put_field(out, b"transfer-encoding", b"chunked");
        Framing::Chunked
    };
    if !has_date {
        DATE.with_borrow_mut(|d| put_field(out, b"date", d.now()));
    }
    if !keep && !says_close {
        put_field(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");

    if framing == Framing::None {
        drop(body);
    } else {
        let mut sent: u64 = 0;
        loop {
            let frame = match poll_now(&mut body) {
                Some(f) => f,
                None => {
                    if !out.is_empty() {
                        if io.write_all(out).await.is_err() {
                            return false;
                        }
                        out.clear();
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
fn poll_now(body: &mut ResponseBody) -> Option<Option<Result<hyper::body::Frame<Bytes>, crate::body::BoxError>>> {
    let waker = futures_util::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Ready(f) => Some(f),
        Poll::Pending => None,
    }
}

/// Writes a response's fields, noting those that decide its framing.
struct FieldWriter<'a> {
    out: &'a mut Vec<u8>,
    bodiless: bool,
    /// A Content-Length a response with a body declared.
    declared: Option<u64>,
    /// A bodiless response came with its Content-Length.
    has_length: bool,
    has_date: bool,
    says_close: bool,
}

impl FieldWriter<'_> {
    fn put(&mut self, name: &[u8], value: &[u8]) {
        if self.note(name, value) {
            put_field(self.out, name, value);
        }
    }

    /// A field as it arrived: `line` is its text from the name to the end
    /// of the value, written in one piece.
    fn put_line(&mut self, name: &[u8], value: &[u8], line: &[u8]) {
        if self.note(name, value) {
            self.out.extend_from_slice(line);
            self.out.extend_from_slice(b"\r\n");
        }
    }

    /// Notes what a field says about framing; whether to write it.
    fn note(&mut self, name: &[u8], value: &[u8]) -> bool {
        match name.len() {
            // A bodiless response keeps the length it describes (HEAD);
            // otherwise the length written is the body's own.
            14 if name.eq_ignore_ascii_case(b"content-length") => {
                if !self.bodiless {
                    self.declared = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                    return false;
                }
                self.has_length = true;
            }
            4 if name.eq_ignore_ascii_case(b"date") => self.has_date = true,
            _ => match hop_by_hop_name(name) {
                HOP_TRANSFER_ENCODING => return false, // the framing is this server's
                HOP_CONNECTION => self.says_close |= says_close(value),
                _ => {}
            },
        }
        true
    }
}

fn put_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The `Date` value, formatted once a second per worker.
struct CachedDate {
    second: u64,
    text: [u8; 29],
}

impl CachedDate {
    fn now(&mut self) -> &[u8] {
        let now = SystemTime::now();
        let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if second != self.second {
            self.second = second;
            let text = httpdate::fmt_http_date(now);
            if text.len() == self.text.len() {
                self.text.copy_from_slice(text.as_bytes());
            }
        }
        &self.text
    }
}

thread_local! {
    static DATE: std::cell::RefCell<CachedDate> =
        const { std::cell::RefCell::new(CachedDate { second: 0, text: *b"Thu, 01 Jan 1970 00:00:00 GMT" }) };
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn parse(head: &[u8]) -> Parse {
        parse_head(head, 100, &mut Vec::new())
    }

    fn simple(head: &[u8]) -> Option<Request<ClientBody>> {
        let mut spans = Vec::new();
        let Parse::Simple(h) = parse_head(head, 100, &mut spans) else { return None };
        let bytes = Bytes::copy_from_slice(&head[..h.len]);
        build_request(&h, &bytes, &spans)
    }

    #[test]
    fn a_bodiless_http11_request_is_served_here() {
        let req = simple(b"GET /a?b=1 HTTP/1.1\r\nHost: x.test\r\nX-A: 1\r\nX-A: 2\r\n\r\n").expect("simple");
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.uri().path_and_query().map(|p| p.as_str()), Some("/a?b=1"));
        assert_eq!(req.headers().get("host").map(|v| v.as_bytes()), Some(&b"x.test"[..]));
        assert_eq!(req.headers().get_all("x-a").iter().count(), 2);
        let Parse::Simple(h) = parse(b"DELETE / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\nGET") else {
            panic!("simple")
        };
        assert!(h.close);
        assert_eq!(h.len, 52);
    }

    #[test]
    fn everything_else_goes_to_hyper() {
        for head in [
            &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"[..],
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
            b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
            b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        ] {
            assert!(matches!(parse(head), Parse::Other), "{}", String::from_utf8_lossy(head));
        }
        assert!(matches!(parse(b"GET / HTTP/1.1\r\nHost: a\r\n"), Parse::Partial));
        let many: Vec<u8> = [&b"GET / HTTP/1.1\r\n"[..], &b"X: 1\r\n".repeat(101), b"\r\n"].concat();
        assert!(matches!(parse(&many), Parse::Other));
    }

    /// Bytes that matter to a head's syntax, for the mutations below.
    const INTERESTING: &[u8] = b":\r\n \t\x00\x7f\x80\xff/?%Hh-";

    /// A seed head changed at random: bytes flipped, interesting bytes put
    /// in, cut short, or spliced with another seed.
    pub(crate) fn mutate(rng: &mut fastrand::Rng, seeds: &[&[u8]]) -> Vec<u8> {
        let mut v = seeds[rng.usize(..seeds.len())].to_vec();
        for _ in 0..rng.usize(1..4) {
            if v.is_empty() {
                break;
            }
            let i = rng.usize(..v.len());
            match rng.u8(..5) {
                0 => v[i] ^= 1 << rng.u8(..8),
                1 => v[i] = INTERESTING[rng.usize(..INTERESTING.len())],
                2 => v.insert(i, INTERESTING[rng.usize(..INTERESTING.len())]),
                3 => v.truncate(i),
                _ => {
                    let other = seeds[rng.usize(..seeds.len())];
                    let j = rng.usize(..=other.len());
                    v.truncate(i);
                    v.extend_from_slice(&other[j..]);
                }
            }
        }
        v
    }

    /// Runs `check` on 50,000 mutations of `seeds` (a fixed sequence for
    /// `seed`); returns how many it accepted.
    pub(crate) fn fuzz_heads(seeds: &[&[u8]], seed: u64, mut check: impl FnMut(&[u8]) -> bool) -> usize {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..50_000).filter(|_| check(&mutate(&mut rng, seeds))).count()
    }

    #[test]
    fn mutated_heads_never_panic_and_taken_ones_are_whole() {
        let seeds: [&[u8]; 6] = [
            b"GET /a?b=1 HTTP/1.1\r\nHost: x.test\r\nUser-Agent: t\r\nAccept: */*\r\n\r\n",
            b"HEAD / HTTP/1.1\r\nhost: a\r\nConnection: keep-alive, close\r\nX-Empty:\r\n\r\n",
            b"DELETE http://x.test:8080/p HTTP/1.1\nHost: x.test\n\n",
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\nX-Obs: caf\xc3\xa9\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
            b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        ];
        let taken = fuzz_heads(&seeds, 0x6a7e_4005e, |head| {
            let mut spans = Vec::new();
            let Parse::Simple(h) = parse_head(head, 100, &mut spans) else { return false };
            assert!(h.len <= head.len() && h.path.1 <= h.len && spans.len() == h.fields);
            for &(n0, n1, v0, v1) in &spans {
                assert!(n0 < n1 && n1 <= v0 && v0 <= v1 && v1 as usize <= h.len, "{:?}", String::from_utf8_lossy(head));
                let name = &head[n0 as usize..n1 as usize];
                for other in [&b"content-length"[..], b"transfer-encoding", b"upgrade", b"expect"] {
                    assert!(!name.eq_ignore_ascii_case(other), "{:?}", String::from_utf8_lossy(head));
                }
            }
            // What httparse takes, the header map takes too, except a
            // target that is not a URI (the client then gets 400).
            let bytes = Bytes::copy_from_slice(&head[..h.len]);
            let req = build_request(&h, &bytes, &spans);
            req.is_some_and(|req| req.headers().len() == h.fields)
        });
        assert!(taken > 1_000, "only {taken} mutated heads were taken whole");
    }

    #[test]
    fn the_date_is_an_http_date() {
        let mut d = CachedDate { second: 0, text: [0; 29] };
        let text = String::from_utf8(d.now().to_vec()).expect("ascii");
        assert!(httpdate::parse_http_date(&text).is_ok(), "{text}");
    }
}
