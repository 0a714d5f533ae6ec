//! Small HTTP/1 wire helpers shared by the I/O wrapper and health checks.

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
