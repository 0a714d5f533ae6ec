//! quiche's stream buffers as [`Bytes`], so that a response body's chunks
//! from the upstream go into a stream's send queue without a copy
//! (`quiche::h3::Connection::send_body_zc`): quiche then copies them only
//! into packets, where its default buffers took a copy first.

use bytes::Bytes;

/// The QUIC connections of the HTTP/3 server.
pub type Quic = quiche::Connection<BytesBufs>;

/// Body chunks from this size on are handed to quiche as they are. A
/// smaller one is copied: a chunk shares its allocation with the upstream
/// connection's read buffer (16 KiB), which quiche would hold until the
/// client acknowledged the data.
pub const ZERO_COPY_FROM: usize = 4096;

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
