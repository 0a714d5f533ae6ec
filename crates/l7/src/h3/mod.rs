//! HTTP/3 (RFC 9114) without I/O: frames, QPACK without a dynamic table,
//! and what each kind of stream may carry. QUIC is quiche's; the driver
//! that runs a connection's streams over it is
//! [`crate::downstream::h3`].

pub mod frame;
pub mod priority;
pub mod qpack;
pub mod stream;
