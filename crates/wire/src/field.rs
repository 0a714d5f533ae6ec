//! Where each header field sits, counted from the first byte of its header
//! (the way smoltcp's `wire` modules name them): parsers and rewriters index
//! frames by these names, not by bare numbers. Fields are big-endian.

/// Ethernet II.
pub mod ethernet {
    pub const DST: usize = 0;
    pub const SRC: usize = 6;
    pub const ETHERTYPE: usize = 12;
    /// Destination and source addresses together.
    pub const ADDRS_LEN: usize = 12;
    pub const HEADER_LEN: usize = 14;
    /// An 802.1Q tag sits before the ethertype, which moves by this much.
    pub const VLAN_TAG_LEN: usize = 4;
}

/// ARP for IPv4 over Ethernet (RFC 826).
pub mod arp {
    pub const HW_TYPE: usize = 0;
    pub const PROTO_TYPE: usize = 2;
    pub const HW_LEN: usize = 4;
    pub const PROTO_LEN: usize = 5;
    pub const OPER: usize = 6;
    pub const SENDER_MAC: usize = 8;
    pub const SENDER_IP: usize = 14;
    pub const TARGET_MAC: usize = 18;
    pub const TARGET_IP: usize = 24;
    pub const LEN: usize = 28;
}

/// IPv4 (RFC 791).
pub mod ipv4 {
    /// Version (high nibble) and header length in words (low nibble).
    pub const VER_IHL: usize = 0;
    pub const TOTAL_LEN: usize = 2;
    pub const ID: usize = 4;
    /// Flags (high 3 bits) and fragment offset.
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
    /// Without options.
    pub const MIN_HEADER_LEN: usize = 20;
}

/// IPv6 (RFC 8200).
pub mod ipv6 {
    /// Version (high nibble), traffic class, flow label.
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
    pub const HEADER_LEN: usize = 40;

    /// An extension header (hop-by-hop, routing, destination options).
    pub mod ext {
        pub const NEXT_HEADER: usize = 0;
        /// Length in 8-byte units, not counting the first eight.
        pub const LEN: usize = 1;
    }
}

/// TCP (RFC 9293).
pub mod tcp {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ: usize = 4;
    pub const ACK: usize = 8;
    /// Data offset in words (high nibble).
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: usize = 14;
    pub const CHECKSUM: usize = 16;
    /// Without options.
    pub const MIN_HEADER_LEN: usize = 20;
}

/// UDP (RFC 768).
pub mod udp {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
    pub const HEADER_LEN: usize = 8;
}

/// ICMP and ICMPv6 (RFC 792, RFC 4443).
pub mod icmp {
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
    /// Echo request and reply: the identifier (what NAT treats as a port).
    pub const IDENT: usize = 4;
    /// Type, code, checksum and four bytes more; an error's quoted packet
    /// follows.
    pub const HEADER_LEN: usize = 8;
}

/// Neighbour solicitation and advertisement (RFC 4861), after the ICMPv6
/// type, code and checksum.
pub mod nd {
    /// Advertisement flags: router, solicited, override (high bits).
    pub const FLAGS: usize = 4;
    pub const TARGET: usize = 8;
    /// Options (here: the target link-layer address) follow the target.
    pub const OPTIONS: usize = 24;
}
