//! Packet I/O for the L4 plane: AF_XDP sockets fed by an XDP steering
//! program (AF_PACKET when AF_XDP cannot be had), next-hop resolution
//! from the host's routes and neighbours, and the worker and control
//! threads that run [`gatehouse_l4::plane`] on real interfaces.
//!
//! `unsafe` is confined to [`xsk`] (AF_XDP rings and UMEM) and
//! [`packet_socket`] (AF_PACKET system calls).

pub mod ha;
pub mod nexthop;
pub mod packet_socket;
pub mod runtime;
pub mod service;
pub mod steer;
pub mod xsk;

pub use runtime::{HaStart, HealthFn, L4Runtime, WorkerStats};
pub use service::L4;
