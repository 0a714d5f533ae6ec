//! A request's header block, field by field, into an `http::Request`,
//! with the checks RFC 9113 8.2 and 8.3 make on what a client sends:
//! pseudo-header fields once each, before the others, only the request
//! ones; lower-case field names of token characters; no connection-specific
//! fields; `te` only as `trailers`; values without CR, LF or NUL. A request
//! that breaks one is malformed (a stream error of type PROTOCOL_ERROR);
//! one over the size limits is answered 431. Cookie fields split across
//! several lines are joined with "; " (RFC 9113 8.2.3), as HTTP/1.1 needs.

use http::header::{COOKIE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};

use super::CONNECTION_SPECIFIC;
use crate::h1::{HOP_TE, hop_by_hop_name};

/// What went wrong with a header block, once decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// A stream error of type PROTOCOL_ERROR.
    Malformed,
    /// Over `max_header_list` bytes or `max_fields` fields: 431.
    TooLarge,
}

/// Collects one header block's fields.
pub struct Fields {
    trailers: bool,
    max_list: usize,
    max_fields: usize,
    list_size: usize,
    count: usize,
    refused: Option<Refused>,
    regular_seen: bool,
    method: Option<Method>,
    scheme: Option<Vec<u8>>,
    authority: Option<Vec<u8>>,
    path: Option<Vec<u8>>,
    pub content_length: Option<u64>,
    headers: HeaderMap,
    cookie: Vec<u8>,
}

fn is_tchar_lower(b: u8) -> bool {
    matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`' | b'|' | b'~')
}

impl Fields {
    pub fn new(trailers: bool, max_list: usize, max_fields: usize) -> Self {
        Fields {
            trailers,
            max_list,
            max_fields,
            list_size: 0,
            count: 0,
            refused: None,
            regular_seen: false,
            method: None,
            scheme: None,
            authority: None,
            path: None,
            content_length: None,
            headers: HeaderMap::new(),
            cookie: Vec::new(),
        }
    }

    fn refuse(&mut self, why: Refused) {
        // Malformed wins: it is a protocol error whatever the size.
        if self.refused != Some(Refused::Malformed) {
            self.refused = Some(why);
        }
    }

    /// Whether the fields so far are refused (too many, too large or
    /// malformed): the rest of the block changes nothing.
    pub fn is_refused(&self) -> bool {
        self.refused.is_some()
    }

    /// One decoded field. Nothing is kept once the block is refused, so a
    /// block that decodes to megabytes costs nothing more than its bytes.
    pub fn field(&mut self, name: &[u8], value: &[u8]) {
        self.list_size += name.len() + value.len() + 32;
        self.count += 1;
        if self.list_size > self.max_list || self.count > self.max_fields {
            self.refuse(Refused::TooLarge);
        }
        if self.refused.is_some() {
            return;
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            if self.regular_seen || self.trailers {
                return self.refuse(Refused::Malformed);
            }
            let slot = match pseudo {
                b"method" => {
                    if self.method.is_some() {
                        return self.refuse(Refused::Malformed);
                    }
                    match Method::from_bytes(value) {
                        Ok(m) => self.method = Some(m),
                        Err(_) => self.refuse(Refused::Malformed),
                    }
                    return;
                }
                b"scheme" => &mut self.scheme,
                b"authority" => &mut self.authority,
                b"path" => &mut self.path,
                _ => return self.refuse(Refused::Malformed),
            };
            if slot.is_some() {
                return self.refuse(Refused::Malformed);
            }
            *slot = Some(value.to_vec());
            return;
        }
        self.regular_seen = true;
        if name.is_empty() || !name.iter().all(|&b| is_tchar_lower(b)) {
            return self.refuse(Refused::Malformed);
        }
        match hop_by_hop_name(name) {
            bit if bit & CONNECTION_SPECIFIC != 0 => return self.refuse(Refused::Malformed),
            HOP_TE if value != b"trailers" => return self.refuse(Refused::Malformed),
            _ => {}
        }
        let Ok(value) = HeaderValue::from_bytes(value) else {
            return self.refuse(Refused::Malformed);
        };
        if name == b"content-length" {
            let parsed = value.to_str().ok().filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
            match parsed.and_then(|s| s.parse::<u64>().ok()) {
                Some(n) if self.content_length.is_none_or(|c| c == n) => self.content_length = Some(n),
                _ => return self.refuse(Refused::Malformed),
            }
        }
        if name == b"cookie" {
            if !self.cookie.is_empty() {
                self.cookie.extend_from_slice(b"; ");
            }
            self.cookie.extend_from_slice(value.as_bytes());
            return;
        }
        match HeaderName::from_bytes(name) {
            Ok(n) => {
                self.headers.append(n, value);
            }
            Err(_) => self.refuse(Refused::Malformed),
        }
    }

    fn finish_headers(&mut self) -> Result<(), Refused> {
        if let Some(why) = self.refused {
            return Err(why);
        }
        if !self.cookie.is_empty() {
            let v = HeaderValue::from_bytes(&self.cookie).map_err(|_| Refused::Malformed)?;
            self.headers.insert(COOKIE, v);
        }
        Ok(())
    }

    /// The request line and fields, once the block is whole.
    pub fn into_request<B>(mut self, body: B) -> Result<Request<B>, Refused> {
        self.finish_headers()?;
        let method = self.method.take().ok_or(Refused::Malformed)?;
        let mut uri = Uri::builder();
        if method == Method::CONNECT {
            // Tunnels are not proxied: CONNECT is refused by the caller; here
            // it needs only its authority (RFC 9113 8.5).
            if self.scheme.is_some() || self.path.is_some() {
                return Err(Refused::Malformed);
            }
            uri = uri.authority(self.authority.take().ok_or(Refused::Malformed)?);
        } else {
            let scheme = self.scheme.take().ok_or(Refused::Malformed)?;
            let path = self.path.take().filter(|p| !p.is_empty()).ok_or(Refused::Malformed)?;
            if path[0] != b'/' && !(path == b"*" && method == Method::OPTIONS) {
                return Err(Refused::Malformed);
            }
            if let Some(a) = self.authority.take() {
                uri = uri.scheme(scheme.as_slice()).authority(a);
            }
            uri = uri.path_and_query(path);
        }
        let uri = uri.build().map_err(|_| Refused::Malformed)?;
        let mut req = Request::new(body);
        *req.method_mut() = method;
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_2;
        *req.headers_mut() = self.headers;
        Ok(req)
    }

    /// The fields of a trailers block.
    pub fn into_trailers(mut self) -> Result<HeaderMap, Refused> {
        self.finish_headers()?;
        Ok(self.headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(fields: &[(&str, &str)]) -> Result<Request<()>, Refused> {
        let mut f = Fields::new(false, 64 * 1024, 100);
        for (n, v) in fields {
            f.field(n.as_bytes(), v.as_bytes());
        }
        f.into_request(())
    }

    const BASE: [(&str, &str); 4] =
        [(":method", "GET"), (":scheme", "https"), (":path", "/a?b=1"), (":authority", "a.test")];

    #[test]
    fn a_well_formed_request() {
        let mut fields = BASE.to_vec();
        fields.extend([("cookie", "a=1"), ("x-b", "2"), ("cookie", "c=3"), ("te", "trailers")]);
        let req = request(&fields).expect("well formed");
        assert_eq!(req.method(), Method::GET);
        assert_eq!(req.uri().to_string(), "https://a.test/a?b=1");
        assert_eq!(req.headers()["cookie"], "a=1; c=3");
        assert_eq!(req.headers()["x-b"], "2");
        assert_eq!(req.version(), Version::HTTP_2);
    }

    #[test]
    fn malformed_requests() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut f = BASE.to_vec();
            f.extend_from_slice(extra);
            f
        };
        let cases: Vec<Vec<(&str, &str)>> = vec![
            vec![(":method", "GET"), (":scheme", "https"), (":authority", "a")],
            vec![(":method", "GET"), (":scheme", "https"), (":path", ""), (":authority", "a")],
            vec![(":scheme", "https"), (":path", "/"), (":authority", "a")],
            vec![(":method", "GET"), (":path", "/"), (":authority", "a")],
            vec![(":method", "GET"), (":method", "GET"), (":scheme", "https"), (":path", "/")],
            vec![(":method", "GET"), (":scheme", "https"), ("x-a", "1"), (":path", "/")],
            with(&[(":status", "200")]),
            with(&[(":foo", "x")]),
            with(&[("X-Upper", "1")]),
            with(&[("connection", "close")]),
            with(&[("keep-alive", "1")]),
            with(&[("proxy-connection", "1")]),
            with(&[("transfer-encoding", "chunked")]),
            with(&[("upgrade", "websocket")]),
            with(&[("te", "gzip")]),
            with(&[("x-a", "b\r\nx: y")]),
            with(&[("x-a", "b\nc")]),
            with(&[("x-a", "b\0c")]),
            with(&[("x:a", "b")]),
            with(&[("x a", "b")]),
            with(&[("content-length", "1x")]),
            with(&[("content-length", "1"), ("content-length", "2")]),
            vec![(":method", "GET"), (":scheme", "https"), (":path", "/a b"), (":authority", "a")],
            vec![(":method", "GET"), (":scheme", "https"), (":path", "a"), (":authority", "a")],
            vec![(":method", "CONNECT"), (":scheme", "https"), (":path", "/"), (":authority", "a")],
        ];
        for c in cases {
            assert_eq!(request(&c).err(), Some(Refused::Malformed), "{c:?}");
        }
    }

    #[test]
    fn over_the_limits_is_431_and_keeps_nothing() {
        let mut f = Fields::new(false, 1000, 100);
        for (n, v) in BASE {
            f.field(n.as_bytes(), v.as_bytes());
        }
        let big = vec![b'a'; 4000];
        for _ in 0..1000 {
            f.field(b"x-big", &big);
        }
        assert!(f.headers.is_empty());
        assert_eq!(f.into_request(()).err(), Some(Refused::TooLarge));
        let mut f = Fields::new(false, 64 * 1024, 5);
        for (n, v) in BASE {
            f.field(n.as_bytes(), v.as_bytes());
        }
        f.field(b"a", b"1");
        f.field(b"b", b"1");
        assert_eq!(f.into_request(()).err(), Some(Refused::TooLarge));
    }

    #[test]
    fn trailers_take_no_pseudo_headers() {
        let mut f = Fields::new(true, 64 * 1024, 100);
        f.field(b"grpc-status", b"0");
        assert_eq!(f.into_trailers().expect("trailers")["grpc-status"], "0");
        let mut f = Fields::new(true, 64 * 1024, 100);
        f.field(b":path", b"/");
        assert_eq!(f.into_trailers().err(), Some(Refused::Malformed));
    }
}
