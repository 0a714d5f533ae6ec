//! The L4 plane, I/O-free: the vector pipeline, the session table, the
//! forwarding modes (rewrites, encapsulation, SNAT, SYN proxy) and session
//! sync. Packet views and checksums come from `gatehouse-wire`, the ground
//! floor it shares with the WireGuard plane; the I/O backends (AF_XDP,
//! AF_PACKET) live in `l4-io`.

// `unsafe` only in the named module `prefetch` (a cache hint).
#![deny(unsafe_code)]

pub mod encap;
pub mod neighbour;
pub mod plane;
mod prefetch;
pub mod rewrite;
pub mod session;
pub mod sync;
pub mod synproxy;
