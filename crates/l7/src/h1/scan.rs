//! A scanner for HTTP/1 request heads arriving in pieces: it raises the
//! flags of heads a proxy must not pass on as they are (Content-Length with
//! Transfer-Encoding, Content-Length twice), looking at header names only,
//! without parsing the head or holding its bytes.

/// Flags the head scanner raises for the next request.
pub const FLAG_CL_AND_TE: u8 = 1;
pub const FLAG_DUPLICATE_CL: u8 = 2;

/// Finds Content-Length and Transfer-Encoding header lines in an HTTP/1
/// request head arriving in pieces. Only names are compared, case-blind.
#[derive(Debug, Default)]
pub struct HeadScanner {
    /// The first bytes of the current line (enough for the longest name).
    line: [u8; 18],
    line_len: usize,
    /// Bytes of the current line seen so far (beyond `line` too).
    line_pos: usize,
    lines: usize,
    content_length: u32,
    transfer_encoding: bool,
    done: bool,
}

impl HeadScanner {
    pub fn reset(&mut self) {
        *self = HeadScanner::default();
    }

    fn finish(&mut self) -> u8 {
        self.done = true;
        let mut flags = 0;
        if self.transfer_encoding && self.content_length > 0 {
            flags |= FLAG_CL_AND_TE;
        }
        if self.content_length > 1 {
            flags |= FLAG_DUPLICATE_CL;
        }
        flags
    }

    /// Feeds bytes; returns the flags once the head's blank line is seen.
    /// Only the first bytes of each line are looked at; the rest of a line
    /// is skipped with memchr.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<u8> {
        if self.done {
            return None;
        }
        let mut rest = bytes;
        loop {
            let newline = memchr::memchr(b'\n', rest);
            if self.line_pos == 0
                && let Some(i) = newline
            {
                // The usual case: a whole line in this read. Its name is
                // compared where it lies, without the copy below.
                let line = &rest[..i];
                rest = &rest[i + 1..];
                if line.is_empty() || line == b"\r" {
                    if self.lines > 0 {
                        return Some(self.finish());
                    }
                    continue;
                }
                if self.lines > 0 {
                    if line.get(..15).is_some_and(|n| n.eq_ignore_ascii_case(b"content-length:")) {
                        self.content_length += 1;
                    } else if line.get(..18).is_some_and(|n| n.eq_ignore_ascii_case(b"transfer-encoding:")) {
                        self.transfer_encoding = true;
                    }
                }
                self.lines += 1;
                continue;
            }
            let segment = &rest[..newline.unwrap_or(rest.len())];
            let from = self.line_len;
            let take = segment.len().min(self.line.len() - from);
            if take > 0 {
                let added = &mut self.line[from..from + take];
                added.copy_from_slice(&segment[..take]);
                added.make_ascii_lowercase();
                self.line_len += take;
                // A name ends at the line's first colon. A colon found here
                // after an earlier one leaves a prefix that holds a colon,
                // which neither name does, so nothing is counted twice.
                if self.lines > 0
                    && let Some(colon) = memchr::memchr(b':', &self.line[from..self.line_len])
                {
                    let name = &self.line[..from + colon + 1];
                    if name == b"content-length:" {
                        self.content_length += 1;
                    } else if name == b"transfer-encoding:" {
                        self.transfer_encoding = true;
                    }
                }
            }
            self.line_pos += segment.len();
            let i = newline?;
            rest = &rest[i + 1..];
            let blank = self.line_pos == 0 || (self.line_pos == 1 && self.line[0] == b'\r');
            if blank && self.lines > 0 {
                return Some(self.finish());
            }
            if !blank {
                self.lines += 1;
            }
            self.line_len = 0;
            self.line_pos = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all_splits(head: &[u8]) -> Option<u8> {
        let mut whole = HeadScanner::default();
        let expected = whole.feed(head);
        // The result must not depend on how the bytes arrive.
        for split in 0..head.len() {
            let mut s = HeadScanner::default();
            let a = s.feed(&head[..split]);
            let b = s.feed(&head[split..]);
            assert_eq!(a.or(b), expected, "split at {split}");
        }
        expected
    }

    #[test]
    fn plain_heads_raise_nothing() {
        assert_eq!(scan_all_splits(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"), Some(0));
        assert_eq!(scan_all_splits(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"), Some(0));
        assert_eq!(scan_all_splits(b"POST / HTTP/1.1\nTransfer-Encoding: chunked\n\n"), Some(0));
    }

    #[test]
    fn smuggling_shapes_are_flagged() {
        assert_eq!(
            scan_all_splits(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Some(FLAG_CL_AND_TE)
        );
        assert_eq!(
            scan_all_splits(b"POST / HTTP/1.1\r\nTRANSFER-ENCODING: chunked\r\ncontent-LENGTH: 5\r\n\r\n"),
            Some(FLAG_CL_AND_TE)
        );
        assert_eq!(
            scan_all_splits(b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"),
            Some(FLAG_DUPLICATE_CL)
        );
    }

    #[test]
    fn names_inside_values_or_the_request_line_do_not_count() {
        assert_eq!(scan_all_splits(b"GET /content-length: HTTP/1.1\r\nX-A: transfer-encoding: x\r\n\r\n"), Some(0));
    }

    #[test]
    fn only_the_name_before_the_first_colon_counts() {
        assert_eq!(scan_all_splits(b"POST / HTTP/1.1\r\nContent-Length: 5:\r\nX:content-length: 1\r\n\r\n"), Some(0));
        assert_eq!(scan_all_splits(b"POST / HTTP/1.1\r\nContent-Length:5\r\nContent-length :5\r\n\r\n"), Some(0));
    }

    #[test]
    fn an_unfinished_head_reports_nothing() {
        let mut s = HeadScanner::default();
        assert_eq!(s.feed(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
    }
}
