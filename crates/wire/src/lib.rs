//! The ground floor of Gatehouse's packet planes (smoltcp's `wire`): what
//! every plane that touches packets needs and none may own. Checksums with
//! incremental updates, where each header field sits, zero-copy views of
//! Ethernet, ARP, IPv4, IPv6, TCP, UDP and ICMP frames, bare IP packets as
//! a tunnel carries them, what a router does to a packet it forwards
//! (TTL, ICMP errors, IPv4 fragments), and the TUN offloads (the virtio-net header, GSO
//! split, GRO coalescing).
//!
//! It does no I/O and depends on no other Gatehouse crate: the L4 plane and
//! the WireGuard plane both build on it, never on each other.

#![forbid(unsafe_code)]

pub mod be;
pub mod checksum;
pub mod field;
pub mod forward;
pub mod ip;
pub mod offload;
pub mod packet;
