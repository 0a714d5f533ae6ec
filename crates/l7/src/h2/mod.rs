//! The HTTP/2 codec (RFC 9113), without I/O: frames, HPACK and the
//! request fields' rules. The server that runs a connection's streams is
//! [`crate::downstream::h2`].

pub mod frame;
pub mod hpack;
mod huffman;
pub mod request;

use crate::h1::{HOP_CONNECTION, HOP_KEEP_ALIVE, HOP_PROXY_CONNECTION, HOP_TRANSFER_ENCODING, HOP_UPGRADE};

/// The fields HTTP/2 does not carry (RFC 9113 8.2.2), as bits of
/// [`crate::h1::hop_by_hop_name`]; `te` is allowed as `trailers` only.
pub const CONNECTION_SPECIFIC: u8 =
    HOP_CONNECTION | HOP_KEEP_ALIVE | HOP_PROXY_CONNECTION | HOP_TRANSFER_ENCODING | HOP_UPGRADE;
