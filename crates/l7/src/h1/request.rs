//! Request heads, as Gatehouse's own HTTP/1.1 server takes them: the
//! shape that makes up nearly all of an edge's traffic (a complete head,
//! HTTP/1.1, no body, no upgrade), parsed strictly with httparse. Anything
//! else is [`Parse::Other`], and hyper's server takes the connection from
//! there: a body (Content-Length or Transfer-Encoding), `Expect`, an
//! `Upgrade`, HTTP/1.0, CONNECT, a head httparse refuses or with too many
//! fields. So every rule about bodies, smuggling shapes and malformed heads
//! keeps one home.

use std::mem::MaybeUninit;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};

use super::{HOP_CONNECTION, HOP_TRANSFER_ENCODING, HOP_UPGRADE, Span, hop_by_hop_name, says_close};

/// Header slots httparse gets; `max_headers` caps them lower.
const HEADER_SLOTS: usize = 128;

/// Where a request head's pieces lie in the buffer, found while it is
/// borrowed by the parser.
pub struct RequestHead {
    pub len: usize,
    pub method: Method,
    pub path: (usize, usize),
    pub fields: usize,
    /// The client said `Connection: close`.
    pub close: bool,
}

/// What a request head at the start of a buffer is.
pub enum Parse {
    /// Not all of it has arrived.
    Partial,
    /// Complete, and of the simple shape.
    Simple(RequestHead),
    /// Anything else: hyper's server takes it.
    Other,
}

/// Parses a request head at the start of `buf`. Only the simple shape is
/// taken (see the module's header); `spans` receives its fields (a vector
/// kept per connection, so no per-request array is zeroed).
pub fn parse_head(buf: &[u8], max_headers: usize, spans: &mut Vec<Span>) -> Parse {
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
    Parse::Simple(RequestHead { len, method, path: (p, p + path.len()), fields: req.headers.len(), close })
}

/// The request a head describes, with `body`; `None` if a field or the
/// target is not valid HTTP (the client gets 400).
pub fn build_request<B>(head: &RequestHead, bytes: &Bytes, spans: &[Span], body: B) -> Option<Request<B>> {
    let uri = Uri::from_maybe_shared(bytes.slice(head.path.0..head.path.1)).ok()?;
    // Room for the X-Forwarded-* fields the proxy adds, so they do not
    // make the map grow and rehash.
    let mut headers = HeaderMap::with_capacity(head.fields + 3);
    for &(n0, n1, v0, v1) in spans {
        let name = HeaderName::from_bytes(&bytes[n0 as usize..n1 as usize]).ok()?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(v0 as usize..v1 as usize)).ok()?;
        headers.append(name, value);
    }
    let mut req = Request::new(body);
    *req.method_mut() = head.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    *req.headers_mut() = headers;
    Some(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &[u8]) -> Parse {
        parse_head(head, 100, &mut Vec::new())
    }

    fn simple(head: &[u8]) -> Option<Request<()>> {
        let mut spans = Vec::new();
        let Parse::Simple(h) = parse_head(head, 100, &mut spans) else { return None };
        let bytes = Bytes::copy_from_slice(&head[..h.len]);
        build_request(&h, &bytes, &spans, ())
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

    #[test]
    fn every_prefix_of_a_head_is_partial() {
        let head = b"GET /a?b=1 HTTP/1.1\r\nHost: x.test\r\nConnection: close\r\nX-A: 1\r\n\r\n";
        for cut in 0..head.len() {
            assert!(matches!(parse(&head[..cut]), Parse::Partial), "prefix of {cut} bytes");
        }
        assert!(matches!(parse(head), Parse::Simple(h) if h.len == head.len() && h.close));
        // A head that goes to hyper says so as soon as its bytes show it, or
        // is partial before: never Simple.
        let other = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
        for cut in 0..=other.len() {
            assert!(!matches!(parse(&other[..cut]), Parse::Simple(_)), "prefix of {cut} bytes");
        }
    }
}
