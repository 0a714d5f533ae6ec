//! Chunked transfer coding (RFC 9112 §7.1): the decoder for bodies read,
//! and the size line for bodies written.

use bytes::{Buf, Bytes, BytesMut};

/// Writes a chunk-size line (`1a2b\r\n`, lowercase hex) for a chunk of
/// `len` bytes.
pub fn put_chunk_size(out: &mut Vec<u8>, len: usize) {
    let digits = (usize::BITS - len.leading_zeros()).div_ceil(4).max(1);
    for i in (0..digits).rev() {
        out.push(b"0123456789abcdef"[(len >> (i * 4)) & 0xf]);
    }
    out.extend_from_slice(b"\r\n");
}

/// Longest chunk-size line (digits and extensions), CR included.
pub const MAX_SIZE_LINE: usize = 1024;
/// Longest trailer line, CR included.
pub const MAX_TRAILER_LINE: usize = 8192;
const SIZE_LINE_TOO_LONG: &str = "chunk size line too long";
const TRAILER_TOO_LONG: &str = "trailer line too long";

/// Strict chunked-body decoder state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a size line.
    Size,
    /// `n` bytes of chunk data left.
    Data(u64),
    /// The CRLF after chunk data.
    DataEnd,
    /// Trailer lines after the last chunk, until an empty line.
    Trailers,
    Done,
}

/// What the decoder got from the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    Data(Bytes),
    NeedMore,
    End,
}

/// A strict decoder of a chunked body (RFC 9112 §7.1): sizes in hex with
/// extensions ignored, CRLF required after the size line and the data,
/// trailers read and dropped.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: Chunk,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder { state: Chunk::Size }
    }
}

impl ChunkedDecoder {
    /// Takes what it can from the front of `buf`: data, the end, or a
    /// request for more bytes.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, &'static str> {
        loop {
            match self.state {
                Chunk::Size => {
                    // The limit holds however the line arrives: in one read
                    // or in several.
                    let Some(eol) = buf.iter().position(|&b| b == b'\n') else {
                        return if buf.len() > MAX_SIZE_LINE { Err(SIZE_LINE_TOO_LONG) } else { Ok(Decoded::NeedMore) };
                    };
                    if eol > MAX_SIZE_LINE {
                        return Err(SIZE_LINE_TOO_LONG);
                    }
                    let line = &buf[..eol];
                    let line = line.strip_suffix(b"\r").ok_or("chunk size line without CR")?;
                    let digits = line.split(|&b| b == b';').next().unwrap_or(b"").trim_ascii_end();
                    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
                        return Err("invalid chunk size");
                    }
                    let size = u64::from_str_radix(std::str::from_utf8(digits).map_err(|_| "invalid chunk size")?, 16)
                        .map_err(|_| "invalid chunk size")?;
                    buf.advance(eol + 1);
                    self.state = if size == 0 { Chunk::Trailers } else { Chunk::Data(size) };
                }
                Chunk::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = left.min(buf.len() as u64) as usize;
                    let data = buf.split_to(n).freeze();
                    self.state = if left == n as u64 { Chunk::DataEnd } else { Chunk::Data(left - n as u64) };
                    return Ok(Decoded::Data(data));
                }
                Chunk::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err("chunk data not followed by CRLF");
                    }
                    buf.advance(2);
                    self.state = Chunk::Size;
                }
                Chunk::Trailers => {
                    let Some(eol) = buf.iter().position(|&b| b == b'\n') else {
                        return if buf.len() > MAX_TRAILER_LINE {
                            Err(TRAILER_TOO_LONG)
                        } else {
                            Ok(Decoded::NeedMore)
                        };
                    };
                    if eol > MAX_TRAILER_LINE {
                        return Err(TRAILER_TOO_LONG);
                    }
                    let empty = eol == 0 || (eol == 1 && buf[0] == b'\r');
                    buf.advance(eol + 1);
                    if empty {
                        self.state = Chunk::Done;
                    }
                }
                Chunk::Done => return Ok(Decoded::End),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(input: &[u8], split: usize) -> Result<Vec<u8>, &'static str> {
        let mut dec = ChunkedDecoder::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for part in [&input[..split], &input[split..]] {
            buf.extend_from_slice(part);
            loop {
                match dec.decode(&mut buf)? {
                    Decoded::Data(d) => out.extend_from_slice(&d),
                    Decoded::NeedMore => break,
                    Decoded::End => return Ok(out),
                }
            }
        }
        Err("incomplete")
    }

    #[test]
    fn chunked_bodies_decode_however_they_arrive() {
        let input = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for split in 0..=input.len() {
            assert_eq!(decode_all(input, split).as_deref(), Ok(&b"hello  world"[..]), "split {split}");
        }
    }

    #[test]
    fn malformed_chunks_are_refused() {
        for bad in
            [&b"zz\r\nhello\r\n0\r\n\r\n"[..], b"5\r\nhelloXX0\r\n\r\n", b"5\nhello\r\n0\r\n\r\n", b"\r\n", b"-1\r\n"]
        {
            assert!(decode_all(bad, bad.len()).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(decode_all(b"fffffffffffffffff\r\n", 19).is_err(), "size overflow");
    }

    /// Found writing the h1_chunked fuzz target: a long size line was refused
    /// when it came in two reads and taken when it came in one.
    #[test]
    fn line_limits_hold_however_the_line_arrives() {
        let long_ext = [&b"5;"[..], &[b'x'; MAX_SIZE_LINE], b"\r\nhello\r\n0\r\n\r\n"].concat();
        let long_trailer = [&b"0\r\nx: "[..], &[b'y'; MAX_TRAILER_LINE], b"\r\n\r\n"].concat();
        for input in [long_ext, long_trailer] {
            for split in [input.len(), 600, 2000] {
                assert!(decode_all(&input, split.min(input.len())).is_err(), "split {split}");
            }
        }
    }

    #[test]
    fn chunk_sizes_are_lowercase_hex() {
        for (len, text) in [(0usize, "0"), (1, "1"), (15, "f"), (16, "10"), (0x1a2b, "1a2b")] {
            let mut out = Vec::new();
            put_chunk_size(&mut out, len);
            assert_eq!(out, format!("{text}\r\n").into_bytes());
        }
    }

    #[test]
    fn every_prefix_asks_for_more_and_never_ends_early() {
        let input = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for cut in 0..input.len() {
            assert_eq!(decode_all(&input[..cut], cut), Err("incomplete"), "prefix of {cut} bytes");
        }
    }
}
