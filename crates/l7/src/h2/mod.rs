//! Gatehouse's own HTTP/2 server (RFC 9113): frames, HPACK, and the
//! connection loop that runs a connection's streams in its own task. It
//! serves clients that chose `h2` by ALPN and cleartext clients that open
//! with the HTTP/2 preface; requests go to [`crate::proxy::handle`] like
//! every other.

pub mod frame;
pub mod hpack;
mod huffman;
mod output;
pub mod recv;
pub mod request;
pub mod server;

use crate::h1::{HOP_CONNECTION, HOP_KEEP_ALIVE, HOP_PROXY_CONNECTION, HOP_TRANSFER_ENCODING, HOP_UPGRADE};

/// The fields HTTP/2 does not carry (RFC 9113 8.2.2), as bits of
/// [`crate::h1::hop_by_hop_name`]; `te` is allowed as `trailers` only.
pub const CONNECTION_SPECIFIC: u8 =
    HOP_CONNECTION | HOP_KEEP_ALIVE | HOP_PROXY_CONNECTION | HOP_TRANSFER_ENCODING | HOP_UPGRADE;
