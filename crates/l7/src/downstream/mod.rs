//! The client side: connections accepted, TLS terminated, and the servers
//! that turn a connection's bytes into requests for [`crate::proxy`].
//!
//! - [`accept`]: each worker's runtime, its listeners and accept loops,
//!   and the choice of server for a connection (ALPN, the HTTP/2 preface);
//! - [`conn`]: a client connection's I/O and per-connection state;
//! - [`tls`]: certificates and the listeners' TLS contexts (SNI, ECDSA and
//!   RSA for the same name, the batched key provider);
//! - [`h1`]: Gatehouse's own HTTP/1.1 server (hyper serves requests with
//!   bodies);
//! - [`h2`]: Gatehouse's own HTTP/2 server;
//! - [`h3`]: HTTP/3 over QUIC (quiche), on UDP sockets of its own and the
//!   same certificates;
//! - [`handover`]: what serves a connection after the HTTP/1.1 server
//!   hands it over (HTTP/2, hyper), and the drain of either;
//! - [`ready`] and [`recv`]: what the multiplexed servers (HTTP/2,
//!   HTTP/3) share: per-stream wakers, and request bodies handed to the
//!   upstream with flow control.

pub mod accept;
pub mod conn;
pub mod h1;
pub mod h2;
pub mod h3;
pub mod handover;
pub mod key_share;
pub mod ready;
pub mod recv;
pub mod tls;
