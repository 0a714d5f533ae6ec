//! Small HTTP/1 helpers shared by the I/O wrapper, the proxy, the upstream
//! client and health checks.

use http::header::{self, HeaderName};

/// The status code of an HTTP/1.x response head at the start of `buf`
/// (`HTTP/1.1 200 ...`), or `None` if `buf` does not start with one.
pub fn response_status(buf: &[u8]) -> Option<u16> {
    let rest = buf.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5)?;
    if rest.get(1) != Some(&b' ') || !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(code.iter().fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0')))
}

pub static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
pub static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The hop-by-hop headers of RFC 9110 §7.6.1 (and the old Proxy-Connection
/// and Keep-Alive), by position in a bit set.
pub fn hop_by_hop_bit(k: &HeaderName) -> u8 {
    if k == header::CONNECTION {
        1
    } else if k == header::TE {
        2
    } else if k == header::TRAILER {
        4
    } else if k == header::TRANSFER_ENCODING {
        8
    } else if k == header::UPGRADE {
        16
    } else if *k == KEEP_ALIVE {
        32
    } else if *k == PROXY_CONNECTION {
        64
    } else {
        0
    }
}

pub const HOP_CONNECTION: u8 = 1;
pub const HOP_TRANSFER_ENCODING: u8 = 8;

/// [`hop_by_hop_bit`] for a field name as it arrived (any case), without
/// making a `HeaderName` of it.
pub fn hop_by_hop_name(name: &[u8]) -> u8 {
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    match name.len() {
        2 if is(b"te") => 2,
        7 if is(b"trailer") => 4,
        7 if is(b"upgrade") => 16,
        10 if is(b"connection") => HOP_CONNECTION,
        10 if is(b"keep-alive") => 32,
        16 if is(b"proxy-connection") => 64,
        17 if is(b"transfer-encoding") => HOP_TRANSFER_ENCODING,
        _ => 0,
    }
}

/// The comma-separated tokens of a Connection header value, trimmed.
pub fn connection_tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii)
}

/// The header a Connection token names as hop-by-hop: any valid name but
/// the `close`, `keep-alive` and `upgrade` options.
pub fn connection_listed_name(token: &[u8]) -> Option<HeaderName> {
    let option = [&b"close"[..], b"keep-alive", b"upgrade"].iter().any(|o| token.eq_ignore_ascii_case(o));
    if option { None } else { HeaderName::from_bytes(token).ok() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_names_by_bytes_and_by_header_name_agree() {
        for name in [
            "connection", "Connection", "TE", "te", "trailer", "Transfer-Encoding", "upgrade", "Keep-Alive",
            "proxy-connection", "content-length", "x-te", "tea", "host", "upgrade-insecure-requests",
        ] {
            let parsed = HeaderName::from_bytes(name.as_bytes()).expect("name");
            assert_eq!(hop_by_hop_name(name.as_bytes()), hop_by_hop_bit(&parsed), "{name}");
        }
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
