//! The L4 plane, I/O-free: zero-copy views of Ethernet, ARP, IPv4, IPv6,
//! TCP, UDP and ICMP; checksums with incremental updates; and (as it grows)
//! the vector pipeline, the session table and the forwarding modes. The I/O
//! backends (AF_XDP, AF_PACKET, the in-memory generator) live in `l4-io`.

// `unsafe` only in the named module `prefetch` (a cache hint).
#![deny(unsafe_code)]

pub mod bench;
pub mod checksum;
pub mod encap;
pub mod field;
mod fuzz;
pub mod neighbour;
pub mod packet;
pub mod plane;
mod prefetch;
pub mod rewrite;
pub mod session;
pub mod sync;
pub mod synproxy;
