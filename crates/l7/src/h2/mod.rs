//! HTTP/2 (RFC 9113) without I/O: frames, HPACK, the request fields'
//! rules and the server connection's state machine ([`conn`]). The
//! driver that owns the socket and runs a connection's streams is
//! [`crate::downstream::h2`].

pub mod conn;
pub mod frame;
pub mod hpack;
pub(crate) mod huffman;
pub mod request;

use crate::h1::{HOP_CONNECTION, HOP_KEEP_ALIVE, HOP_PROXY_CONNECTION, HOP_TRANSFER_ENCODING, HOP_UPGRADE};

/// The fields HTTP/2 does not carry (RFC 9113 8.2.2), as bits of
/// [`crate::h1::hop_by_hop_name`]; `te` is allowed as `trailers` only.
pub const CONNECTION_SPECIFIC: u8 =
    HOP_CONNECTION | HOP_KEEP_ALIVE | HOP_PROXY_CONNECTION | HOP_TRANSFER_ENCODING | HOP_UPGRADE;
