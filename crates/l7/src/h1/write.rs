//! Writing heads: a request head to an upstream, and a response head to a
//! client (status line, the fields, then the framing fields this server
//! decides).

use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, StatusCode};

use super::response::ResponseHead;
use super::{Framing, HOP_CONNECTION, HOP_TRANSFER_ENCODING, hop_by_hop_name, says_close};

/// Serialises a request head. `chunked`: the body is sent chunked.
pub fn encode_request_head(req: &http::request::Parts, chunked: bool, out: &mut Vec<u8>) {
    out.reserve(256);
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.extend_from_slice(b" ");
    // Origin form: a target in absolute form with no path
    // (`http://a.test?q`) still starts with `/`. Found by the h1_request
    // fuzz target: `?q` went out as the request target.
    let path = req.uri.path();
    out.extend_from_slice(if path.is_empty() { b"/" } else { path.as_bytes() });
    if let Some(q) = req.uri.query() {
        out.push(b'?');
        out.extend_from_slice(q.as_bytes());
    }
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

/// Writes a response head to `out` (cleared first): the status line, an
/// HTTP/1.1 upstream's fields as they came (`raw`), then `headers`, then
/// what this server decides: the framing (`Content-Length` when the body's
/// length is known, as `exact` or as declared, else chunked), `Date`, and
/// `Connection: close` when the connection ends after this response.
/// Returns the body's framing and whether the connection stays open.
pub fn response_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    raw: Option<&ResponseHead>,
    headers: &HeaderMap,
    is_head: bool,
    client_close: bool,
    exact: Option<u64>,
) -> (Framing, bool) {
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
    if let Some(raw) = raw {
        for (name, value, line) in raw.field_lines() {
            fields.put_line(name, value, line);
        }
    }
    for (name, value) in headers {
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
            && let Some(n) = exact
            && n > 0
        {
            put_field(out, b"content-length", itoa::Buffer::new().format(n).as_bytes());
        }
        Framing::Empty
    } else if let Some(n) = exact.or(declared) {
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
    (framing, keep)
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

    #[test]
    fn request_heads_are_serialised() {
        let (parts, ()) = Request::post("/a?b=1")
            .header("host", "x")
            .header("content-length", "3")
            .body(())
            .expect("req")
            .into_parts();
        let mut out = Vec::new();
        encode_request_head(&parts, false, &mut out);
        assert_eq!(&out[..], b"POST /a?b=1 HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\n");
        let (parts, ()) = Request::put("/").body(()).expect("req").into_parts();
        out.clear();
        encode_request_head(&parts, true, &mut out);
        assert_eq!(&out[..], b"PUT / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n");
    }

    #[test]
    fn the_date_is_an_http_date() {
        let mut d = CachedDate { second: 0, text: [0; 29] };
        let text = String::from_utf8(d.now().to_vec()).expect("ascii");
        assert!(httpdate::parse_http_date(&text).is_ok(), "{text}");
    }

    fn head_text(
        status: u16,
        headers: &[(&str, &str)],
        is_head: bool,
        close: bool,
        exact: Option<u64>,
    ) -> (String, Framing, bool) {
        let mut map = HeaderMap::new();
        for (n, v) in headers {
            map.append(http::HeaderName::from_bytes(n.as_bytes()).expect("name"), v.parse().expect("value"));
        }
        let mut out = Vec::new();
        let status = StatusCode::from_u16(status).expect("status");
        let (framing, keep) = response_head(&mut out, status, None, &map, is_head, close, exact);
        (String::from_utf8(out).expect("ascii"), framing, keep)
    }

    #[test]
    fn response_heads_carry_the_framing_this_server_chose() {
        let (t, f, keep) =
            head_text(200, &[("x-a", "1"), ("transfer-encoding", "gzip, chunked")], false, false, Some(5));
        assert!(t.starts_with("HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\ndate: "), "{t}");
        assert!(t.ends_with("\r\n\r\n") && !t.contains("transfer-encoding"), "{t}");
        assert_eq!((f, keep), (Framing::Length(5), true));
        let (t, f, _) = head_text(200, &[("content-length", "7")], false, false, None);
        assert!(t.contains("content-length: 7\r\n") && t.matches("content-length").count() == 1, "{t}");
        assert_eq!(f, Framing::Length(7));
        let (t, f, _) = head_text(200, &[], false, false, None);
        assert!(t.contains("transfer-encoding: chunked\r\n"), "{t}");
        assert_eq!(f, Framing::Chunked);
        let (t, f, keep) = head_text(204, &[("connection", "close")], false, false, None);
        assert_eq!((f, keep), (Framing::Empty, false));
        assert_eq!(t.matches("connection").count(), 1, "{t}");
        let (t, f, _) = head_text(200, &[], true, false, Some(10));
        assert!(t.contains("content-length: 10\r\n"), "a HEAD response says the GET's length: {t}");
        assert_eq!(f, Framing::Empty);
        let (t, _, keep) = head_text(200, &[("date", "x")], false, true, Some(0));
        assert!(!keep && t.contains("connection: close\r\n") && t.matches("date").count() == 1, "{t}");
    }
}
