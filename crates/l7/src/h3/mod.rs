//! HTTP/3 (RFC 9114) without I/O: frames, QPACK with the client's dynamic
//! table, and what each kind of stream may carry. QUIC is quiche's; the driver
//! that runs a connection's streams over it is
//! [`crate::downstream::h3`].

pub mod frame;
pub mod priority;
pub mod qpack;
mod qpack_prim;
pub mod qpack_table;
pub mod stream;
