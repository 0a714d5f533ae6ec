//! Response heads from upstreams, parsed as strictly as a proxy must: a
//! response whose length is ambiguous (Content-Length with
//! Transfer-Encoding, differing Content-Lengths) or that is malformed is
//! refused, and its connection is never reused. Hop-by-hop fields are left
//! out (but for a 101's); the rest stay spans of the head's bytes.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version};

use super::{
    Framing, HOP_CONNECTION, HOP_TRANSFER_ENCODING, Span, connection_tokens, hop_by_hop_name, is_connection_option,
};

/// Most fields a response head may have.
const MAX_HEADERS: usize = 128;

/// The body framing of a response and whether its connection can be reused.
#[derive(Debug, Clone, Copy)]
pub struct ResponseFraming {
    pub framing: Framing,
    pub reusable: bool,
}

/// What a response head at the start of a buffer is.
pub enum Parsed {
    /// The final response: its head (taken off the buffer) and framing.
    Final(ResponseHead, ResponseFraming),
    /// A 1xx other than 101, taken off the buffer and dropped.
    Interim,
    /// Not all of it has arrived.
    Partial,
}

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

    /// Takes the span list back (for the connection it was lent by).
    pub fn take_fields(&mut self) -> Vec<Span> {
        std::mem::take(&mut self.fields)
    }
}

/// Parses a response head at the start of `buf`; the kept fields' spans
/// go into `fields` (cleared first), which the head then holds.
pub fn parse_response(
    buf: &mut BytesMut,
    is_head_request: bool,
    fields: &mut Vec<Span>,
) -> Result<Parsed, &'static str> {
    // Left uninitialised: httparse writes only the headers it finds.
    let mut headers = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut r, buf, &mut headers) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(httparse::Error::TooManyHeaders) => return Err("too many response headers"),
        Err(_) => return Err("malformed response head"),
    };
    let code = r.code.ok_or("no status")?;
    let status = StatusCode::from_u16(code).map_err(|_| "invalid status")?;
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
            let n = parse_content_length(value).ok_or("invalid content-length")?;
            if content_length.is_some_and(|prev| prev != n) {
                return Err("conflicting content-length");
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
            (Some(_), Some(_)) => return Err("both content-length and transfer-encoding"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

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
                Err(why) => return Err(why),
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
    fn every_prefix_of_a_response_head_is_partial() {
        let head = b"HTTP/1.1 200 OK\r\nServer: t\r\nConnection: X-A\r\nX-A: 1\r\nContent-Length: 2\r\n\r\nok";
        let end = head.len() - 2;
        for cut in 0..end {
            let mut buf = BytesMut::from(&head[..cut]);
            assert!(matches!(parse_response(&mut buf, false, &mut Vec::new()), Ok(Parsed::Partial)), "{cut}");
            assert_eq!(buf.len(), cut, "nothing taken from a partial head");
        }
        let (r, f, used) = parse(head, false).expect("whole");
        assert_eq!((r.status(), f.framing, used), (StatusCode::OK, Framing::Length(2), end));
    }
}
