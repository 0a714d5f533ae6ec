//! quiche's stream buffers as [`Bytes`], so that a response body's chunks
//! from the upstream go into a stream's send queue without a copy
//! (`quiche::Connection::stream_send_zc`): quiche then copies them only
//! into packets, where its default buffers took a copy first. Small
//! chunks are copied once ([`compact`]), as quiche's buffers did.

use bytes::Bytes;

/// The QUIC connections of the HTTP/3 server.
pub type Quic = quiche::Connection<BytesBufs>;

/// Body chunks from this size on are handed to quiche as they are.
const ZERO_COPY_FROM: usize = 4096;

/// A body chunk as the stream's queue should hold it: itself from
/// [`ZERO_COPY_FROM`] bytes on, else a copy of its own. A chunk shares its
/// allocation with the upstream connection's read buffer (16 KiB), which
/// quiche would hold until the client acknowledged a few bytes of it.
pub fn compact(chunk: Bytes) -> Bytes {
    if chunk.len() >= ZERO_COPY_FROM { chunk } else { Bytes::copy_from_slice(&chunk) }
}

#[derive(Clone, Debug, Default)]
pub struct BytesBufs;

impl quiche::BufFactory for BytesBufs {
    type Buf = Bytes;
    type DgramBuf = Vec<u8>;

    fn buf_from_slice(buf: &[u8]) -> Bytes {
        Bytes::copy_from_slice(buf)
    }

    fn dgram_buf_from_slice(buf: &[u8]) -> Vec<u8> {
        buf.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_chunks_are_copied_out_of_their_buffer_and_large_ones_kept() {
        let buffer = Bytes::from(vec![7u8; 16 * 1024]);
        let small = compact(buffer.slice(..64));
        assert_eq!(&small[..], &[7u8; 64][..]);
        assert!(!std::ptr::eq(small.as_ptr(), buffer.as_ptr()), "a copy of its own");
        let large = compact(buffer.slice(..ZERO_COPY_FROM));
        assert!(std::ptr::eq(large.as_ptr(), buffer.as_ptr()), "the same bytes");
    }
}
