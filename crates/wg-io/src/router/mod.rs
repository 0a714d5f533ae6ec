//! WireGuard as a router, the way FD.io VPP runs it: frames from a LAN
//! NIC and from a WAN NIC move through a short pipeline in vectors, and
//! the vector is the crypto batch. No TUN device and no kernel stack on
//! the data path.
//!
//! - LAN → WAN ([`pipeline::seal_vector`]): classify (IPv4, IPv6) → check
//!   the header, lower the TTL (ICMP time exceeded when it runs out) →
//!   fit the tunnel's MTU (ICMP fragmentation needed or packet too big;
//!   IPv4 without DF is fragmented) → allowed IPs, longest prefix first, to
//!   a peer and its session, under the device's lock once per vector →
//!   the outer Ethernet, IP (v4 or v6, the peer endpoint's family), UDP
//!   and transport headers written in front of the packet where it lies →
//!   the whole vector sealed at once → UDP checksums → transmit. Where
//!   the kernel's UDP socket sends the datagrams instead (the WAN's AF_XDP
//!   socket copies), it makes its own headers: the next hop's MAC and the
//!   checksums are left out ([`pipeline::WanSender`]).
//! - WAN → LAN ([`pipeline::open_vector`]): classify (our address and
//!   port, not a fragment) → handshake messages to the control thread,
//!   transport data planned under the lock (index, age, replay) → opened
//!   at once → checked under the lock again (replay window, the inner
//!   source against the peer's allowed IPs) → TTL → the LAN next hop's
//!   MAC written over the transport header → transmit.
//!
//! Next-hop MACs come from the kernel's routes and neighbours
//! ([`gatehouse_link::nexthop`]), as the L4 plane resolves them; a miss
//! drops the frame and asks for resolution. The pipeline does no I/O: the
//! caller hands it frames in their memory (an AF_XDP UMEM, or plain
//! buffers in the benchmark and the tests) and sends what it marks.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use gatehouse_link::nexthop::NextHops;
use gatehouse_wg::device::{DropReason, Transmit};

pub mod handover;
pub mod io;
pub mod lan_tx;
pub mod pipeline;
pub mod runtime;
pub mod steer;

/// Frames per vector a worker takes from a ring: four groups of the
/// sixteen-lane ChaCha20, and 1420-byte packets still within L2.
pub const VECTOR: usize = 64;

#[cfg(test)]
mod tests;

/// One side of the router: its NIC's MAC, its addresses, its next hops.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Side {
    pub mac: [u8; 6],
    pub v4: Option<Ipv4Addr>,
    pub v6: Option<Ipv6Addr>,
    pub hops: Arc<NextHops>,
}

impl Side {
    /// This side's address of `a`'s family.
    pub fn address_like(&self, a: IpAddr) -> Option<IpAddr> {
        match a {
            IpAddr::V4(_) => self.v4.map(IpAddr::V4),
            IpAddr::V6(_) => self.v6.map(IpAddr::V6),
        }
    }
}

/// What the pipeline needs to know of the router.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Router {
    pub lan: Side,
    pub wan: Side,
    /// The tunnel's UDP port.
    pub port: u16,
    /// The largest inner packet the tunnel carries (the interface's MTU).
    pub mtu: usize,
}

/// A frame in its memory: the bytes `mem[head..head + len]`, with room
/// before them for headers and after them for padding and a tag.
pub struct Frame<'a> {
    pub mem: &'a mut [u8],
    pub head: usize,
    pub len: usize,
}

/// What became of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Dropped (counted).
    Drop,
    /// Sent on the other side: the bytes `mem[head..head + len]`.
    Send { head: usize, len: usize },
    /// Taken elsewhere: queued for a handshake, or a handshake message for
    /// the control thread.
    Taken,
}

/// Why the router dropped a frame (the device's own reasons are counted
/// by [`DropReason`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouterDrop {
    /// Not IPv4 or IPv6 over Ethernet.
    NotIp,
    /// An IP header that is cut short, too long for its frame, or whose
    /// checksum is wrong.
    Malformed,
    /// The TTL or hop limit ran out (ICMP time exceeded sent).
    TimeExceeded,
    /// Too big for the tunnel and not to be fragmented (ICMP sent).
    TooBig,
    /// A datagram on the WAN side that is not for our address and port.
    NotOurs,
    /// A fragment of an outer datagram (WireGuard's never are).
    OuterFragment,
    /// No room in the frame for the headers, padding and tag.
    NoRoom,
    /// No route, or an unresolved neighbour (resolution asked for).
    NoNextHop,
    /// The WAN side has no address of the peer endpoint's family.
    NoSourceAddress,
    /// The control thread's queue of handshakes was full.
    HandshakeQueueFull,
}

impl RouterDrop {
    pub const NAMES: [&'static str; 10] = [
        "not_ip",
        "malformed",
        "time_exceeded",
        "too_big",
        "not_ours",
        "outer_fragment",
        "no_room",
        "no_next_hop",
        "no_source_address",
        "handshake_queue_full",
    ];

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A worker's counters, kept without atomics on the fast path.
#[derive(Clone, Debug, Default)]
pub struct Counts {
    /// Frames in from the LAN, and sealed toward the WAN.
    pub lan_rx: u64,
    pub sealed: u64,
    /// Frames in from the WAN, and opened toward the LAN.
    pub wan_rx: u64,
    pub opened: u64,
    /// ICMP errors sent, fragments made.
    pub icmp: u64,
    pub fragments: u64,
    /// Super-frames sent to the LAN in copy mode, and the frames in them.
    pub super_frames: u64,
    pub coalesced: u64,
    /// By [`RouterDrop::index`].
    pub drops: [u64; RouterDrop::NAMES.len()],
    /// By [`DropReason::index`].
    pub device: [u64; DropReason::NAMES.len()],
}

impl Counts {
    pub fn drop(&mut self, d: RouterDrop) {
        self.drops[d.index()] += 1;
    }

    pub fn device_drop(&mut self, d: DropReason) {
        self.device[d.index()] += 1;
    }
}

/// What a vector left besides its frames' fates.
#[derive(Default)]
pub struct Extra {
    /// Whole frames made here for the LAN (ICMP errors) and the WAN
    /// (fragments sealed, when a packet had to be cut).
    pub to_lan: Vec<Vec<u8>>,
    pub to_wan: Vec<Vec<u8>>,
    /// Datagrams the device made (handshake initiations, packets that
    /// waited for a session, keepalives): the control socket sends them.
    pub transmits: Vec<Transmit>,
    /// Handshake messages for the control thread: datagram, source, the
    /// local address it came to.
    pub handshakes: Vec<(Vec<u8>, SocketAddr, Option<IpAddr>)>,
    /// Neighbours to resolve, on the LAN side and on the WAN side.
    pub resolve_lan: Vec<IpAddr>,
    pub resolve_wan: Vec<IpAddr>,
}

impl Extra {
    /// Makes room for the next vector's leftovers. The device's datagrams
    /// (`transmits`) stay: the worker sends them once a turn, after both
    /// sides' vectors and the kernel socket's, and `send_all` empties the
    /// list (cleared here, a handshake initiation the LAN side's vector
    /// made was lost whenever the WAN side had a vector in the same turn,
    /// which under two-way traffic is nearly every turn).
    pub fn clear_vector(&mut self) {
        self.to_lan.clear();
        self.to_wan.clear();
        self.handshakes.clear();
        self.resolve_lan.clear();
        self.resolve_wan.clear();
    }
}
