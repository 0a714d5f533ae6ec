//! The HTTP/1 codec, without I/O: request heads (what Gatehouse's own
//! server takes), response heads (from upstreams, strict as a proxy's parser
//! must be), chunked framing, and writing heads and fields. The server's and
//! the client's I/O loops (`downstream::h1`, `upstream::h1`) sit on top; every parser
//! here is tested on every prefix of its inputs and on mutated inputs.
//!
//! Beside them, the field rules both directions share: hop-by-hop fields and
//! Connection options.

pub mod chunked;
pub mod request;
pub mod response;
pub mod scan;
pub mod write;

use http::header::HeaderName;

/// (name start, name end, value start, value end) of one header field in a
/// head's bytes: fields stay where they arrived, and are copied out only
/// when a header map needs them.
pub type Span = (u32, u32, u32, u32);

/// How a message body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    Length(u64),
    Chunked,
    /// Until the sender closes the connection (responses only).
    Close,
}

/// Bytes read from a client at a time: request heads are small, and a
/// connection keeps this buffer while it idles.
pub const CLIENT_READ_CHUNK: usize = 8 * 1024;
/// Bytes read from an upstream at a time to begin with: a response head
/// and a small body, a TLS record's worth for the client side.
pub const UPSTREAM_READ_CHUNK: usize = 16 * 1024;
/// Bytes read from an upstream at a time at most: a connection whose reads
/// fill their buffer (a large body already waiting in the socket) doubles
/// its read size up to this, so a 64 KiB response crosses in one or two
/// reads rather than five.
pub const UPSTREAM_READ_MAX: usize = 64 * 1024;

pub use gatehouse_plane::health::status_code as response_status;

pub static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
pub static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The hop-by-hop headers of RFC 9110 §7.6.1 (and the old Proxy-Connection
/// and Keep-Alive), by position in a bit set.
pub const HOP_CONNECTION: u8 = 1;
pub const HOP_TE: u8 = 2;
pub const HOP_TRAILER: u8 = 4;
pub const HOP_TRANSFER_ENCODING: u8 = 8;
pub const HOP_UPGRADE: u8 = 16;
pub const HOP_KEEP_ALIVE: u8 = 32;
pub const HOP_PROXY_CONNECTION: u8 = 64;

/// The hop-by-hop bit of a field name as it arrived (any case), 0 for an
/// end-to-end field. One table for parsed heads and header maps alike.
// Inlined: a length test or two at each call site on the request path.
#[inline(always)]
pub fn hop_by_hop_name(name: &[u8]) -> u8 {
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    match name.len() {
        2 if is(b"te") => HOP_TE,
        7 if is(b"trailer") => HOP_TRAILER,
        7 if is(b"upgrade") => HOP_UPGRADE,
        10 if is(b"connection") => HOP_CONNECTION,
        10 if is(b"keep-alive") => HOP_KEEP_ALIVE,
        16 if is(b"proxy-connection") => HOP_PROXY_CONNECTION,
        17 if is(b"transfer-encoding") => HOP_TRANSFER_ENCODING,
        _ => 0,
    }
}

/// [`hop_by_hop_name`] of a header map's name.
pub fn hop_by_hop_bit(k: &HeaderName) -> u8 {
    hop_by_hop_name(k.as_str().as_bytes())
}

/// The comma-separated tokens of a Connection header value, trimmed.
pub fn connection_tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii)
}

/// Whether a Connection value carries the `close` option.
#[inline]
pub fn says_close(value: &[u8]) -> bool {
    connection_tokens(value).any(|t| t.eq_ignore_ascii_case(b"close"))
}

/// Whether a Connection token is one of the `close`, `keep-alive` and
/// `upgrade` options rather than the name of a hop-by-hop field.
pub fn is_connection_option(token: &[u8]) -> bool {
    [&b"close"[..], b"keep-alive", b"upgrade"].iter().any(|o| token.eq_ignore_ascii_case(o))
}

/// The header a Connection token names as hop-by-hop: any valid name but
/// the options.
pub fn connection_listed_name(token: &[u8]) -> Option<HeaderName> {
    if is_connection_option(token) { None } else { HeaderName::from_bytes(token).ok() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    #[test]
    fn hop_by_hop_names_by_bytes_and_by_header_name_agree() {
        for name in [
            "connection",
            "Connection",
            "TE",
            "te",
            "trailer",
            "Transfer-Encoding",
            "upgrade",
            "Keep-Alive",
            "proxy-connection",
            "content-length",
            "x-te",
            "tea",
            "host",
            "upgrade-insecure-requests",
        ] {
            let parsed = HeaderName::from_bytes(name.as_bytes()).expect("name");
            assert_eq!(hop_by_hop_name(name.as_bytes()), hop_by_hop_bit(&parsed), "{name}");
        }
        let bits: Vec<u8> =
            [header::CONNECTION, header::TE, header::TRAILER, header::TRANSFER_ENCODING, header::UPGRADE]
                .iter()
                .chain([&KEEP_ALIVE, &PROXY_CONNECTION])
                .map(hop_by_hop_bit)
                .collect();
        assert_eq!(bits, [1, 2, 4, 8, 16, 32, 64], "one bit each, the seven of RFC 9110 and the old two");
        assert_eq!(hop_by_hop_bit(&header::CONTENT_LENGTH), 0);
    }

    #[test]
    fn status_lines() {
        assert_eq!(response_status(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(response_status(b"HTTP/1.0 503 Busy"), Some(503));
        assert_eq!(response_status(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), Some(431));
        assert_eq!(response_status(b"HTTP/2 200"), None);
        assert_eq!(response_status(b"SSH-2.0-OpenSSH"), None);
        assert_eq!(response_status(b"HTTP/1.1 2x0 OK"), None);
        assert_eq!(response_status(b"HTTP/1.1 4"), None);
        assert_eq!(response_status(b"0\r\n\r\n"), None);
    }

    #[test]
    fn connection_tokens_and_the_names_they_list() {
        let tokens: Vec<&[u8]> = connection_tokens(b"keep-alive , X-Secret,Upgrade,close,").collect();
        assert_eq!(tokens, [&b"keep-alive"[..], b"X-Secret", b"Upgrade", b"close", b""]);
        let named: Vec<HeaderName> = tokens.into_iter().filter_map(connection_listed_name).collect();
        assert_eq!(named, [HeaderName::from_static("x-secret")]);
    }
}
