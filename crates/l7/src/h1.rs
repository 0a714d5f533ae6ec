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

#[cfg(test)]
mod tests {
    use super::*;

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
}
