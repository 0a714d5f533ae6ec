//! Gatehouse's own HTTP/2 server (RFC 9113): frames, HPACK, and the
//! connection loop that runs a connection's streams in its own task. It
//! serves clients that chose `h2` by ALPN and cleartext clients that open
//! with the HTTP/2 preface; requests go to [`crate::proxy::handle`] like
//! every other.

pub mod frame;
pub mod hpack;
mod huffman;
pub mod recv;
pub mod request;
pub mod server;
