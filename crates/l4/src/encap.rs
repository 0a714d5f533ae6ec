//! Tunnel modes: the client's packet, untouched, inside a new IP header to
//! the real server, which decapsulates it and answers the client directly
//! (like DR, across L3 networks).
//!
//! - IP-in-IP: outer IPv4 (protocol 4 for an IPv4 packet, 41 for IPv6) or
//!   outer IPv6 (next header 4 or 41), RFC 2003 and RFC 2473.
//! - GUE variant 1 (draft-ietf-intarea-gue): outer IP, then UDP whose payload
//!   is the inner packet itself (its first bits, 01, name the variant); the
//!   UDP source port carries a hash of the inner flow so that ECMP and RSS on
//!   the way spread tunnels as they would spread the flows.

use std::net::IpAddr;

use gatehouse_wire::checksum;
use gatehouse_wire::field::{ethernet, ipv4, udp};
use gatehouse_wire::packet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_UDP};

const PROTO_IPIP: u8 = 4;
const PROTO_IPV6_IN: u8 = 41;

/// How to reach a real server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tunnel {
    Ipip,
    /// GUE with this UDP destination port.
    Gue {
        port: u16,
    },
}

/// The outer header's fields.
#[derive(Clone, Copy, Debug)]
pub struct Outer {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ttl: u8,
    /// IPv4 identification of the outer header.
    pub id: u16,
    /// Hash of the inner flow, for the GUE source port.
    pub flow_hash: u32,
}

/// Why a packet cannot be tunnelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncapError {
    /// Outer source and destination of different families.
    MixedFamilies,
    /// The result would exceed 65,535 bytes of IP packet.
    TooLong,
}

/// Writes to `out` an Ethernet frame (MACs from `frame`, to be set for the
/// next hop) carrying `inner`, the IP packet of `frame` (from its `l3` to its
/// `end`), inside the tunnel's headers.
pub fn encapsulate(
    frame: &[u8],
    l3: usize,
    end: usize,
    tunnel: Tunnel,
    outer: &Outer,
    out: &mut Vec<u8>,
) -> Result<(), EncapError> {
    let inner = &frame[l3..end];
    let inner_v4 = inner.first().is_some_and(|b| b >> 4 == 4);
    let inner_proto = if inner_v4 { PROTO_IPIP } else { PROTO_IPV6_IN };
    let (proto, extra) = match tunnel {
        Tunnel::Ipip => (inner_proto, 0),
        Tunnel::Gue { .. } => (PROTO_UDP, udp::HEADER_LEN),
    };
    // The inner packet's DSCP and ECN carry over: IPv4's second byte, or
    // the traffic class across IPv6's first two.
    let class = match inner {
        [_, tos, ..] if inner_v4 => *tos,
        [a, b, ..] => (u16::from_be_bytes([*a, *b]) >> 4) as u8,
        _ => 0,
    };
    out.clear();
    out.extend_from_slice(&frame[..ethernet::ADDRS_LEN]);
    match (outer.src, outer.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            let total = ipv4::MIN_HEADER_LEN + extra + inner.len();
            let total = u16::try_from(total).map_err(|_| EncapError::TooLong)?;
            out.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            let ip_at = out.len();
            // An inner IPv4 packet's DF carries over too.
            let df = if inner_v4 { inner.get(ipv4::FLAGS_FRAG).map_or(0, |f| f & 0x40) } else { 0 };
            out.extend_from_slice(&[0x45, class]);
            out.extend_from_slice(&total.to_be_bytes());
            out.extend_from_slice(&outer.id.to_be_bytes());
            out.extend_from_slice(&[df, 0, outer.ttl, proto, 0, 0]);
            out.extend_from_slice(&src.octets());
            out.extend_from_slice(&dst.octets());
            let c = checksum::checksum(&out[ip_at..ip_at + ipv4::MIN_HEADER_LEN]);
            out[ip_at + ipv4::CHECKSUM..][..2].copy_from_slice(&c.to_be_bytes());
            if let Tunnel::Gue { port } = tunnel {
                // Over IPv4 the UDP checksum may be zero (none): the inner
                // packet has its own.
                udp_header(out, outer.flow_hash, port, inner.len(), 0);
            }
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            let payload = u16::try_from(extra + inner.len()).map_err(|_| EncapError::TooLong)?;
            out.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            out.extend_from_slice(&[0x60 | (class >> 4), class << 4, 0, 0]);
            out.extend_from_slice(&payload.to_be_bytes());
            out.extend_from_slice(&[proto, outer.ttl]);
            out.extend_from_slice(&src.octets());
            out.extend_from_slice(&dst.octets());
            if let Tunnel::Gue { port } = tunnel {
                // Over IPv6 the UDP checksum is required.
                let udp_len = udp::HEADER_LEN + inner.len();
                let sport = gue_source_port(outer.flow_hash);
                let mut sum = checksum::pseudo_v6(src.octets(), dst.octets(), PROTO_UDP, udp_len as u32);
                sum += u64::from(sport) + u64::from(port) + udp_len as u64;
                let mut c = !checksum::fold(checksum::add(sum, inner));
                if c == 0 {
                    c = 0xffff;
                }
                udp_header(out, outer.flow_hash, port, inner.len(), c);
            }
        }
        _ => return Err(EncapError::MixedFamilies),
    }
    out.extend_from_slice(inner);
    Ok(())
}

/// Source ports from the ephemeral range, chosen by the flow's hash.
fn gue_source_port(hash: u32) -> u16 {
    0xc000 | (hash as u16 & 0x3fff)
}

fn udp_header(out: &mut Vec<u8>, hash: u32, port: u16, inner_len: usize, sum: u16) {
    out.extend_from_slice(&gue_source_port(hash).to_be_bytes());
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(&((udp::HEADER_LEN + inner_len) as u16).to_be_bytes());
    out.extend_from_slice(&sum.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_wire::packet::build::*;
    use gatehouse_wire::packet::{Checks, Frame, TCP_SYN, parse};
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn outer4() -> Outer {
        Outer {
            src: Ipv4Addr::new(192, 0, 2, 10).into(),
            dst: Ipv4Addr::new(198, 51, 100, 7).into(),
            ttl: 64,
            id: 0x0102,
            flow_hash: 0xdead_beef,
        }
    }

    #[test]
    fn ipip_over_ipv4_byte_for_byte() {
        let frame = tcp4(TCP_SYN, b"");
        let mut out = Vec::new();
        encapsulate(&frame, 14, frame.len(), Tunnel::Ipip, &outer4(), &mut out).expect("encap");
        let inner = &frame[14..];
        let mut want = frame[..12].to_vec();
        want.extend_from_slice(&[0x08, 0x00]);
        // Version/IHL, TOS (inner's), total length 20 + 40, id, DF copied
        // from the inner header (0x40), TTL 64, protocol 4, checksum, addresses.
        let mut ip = vec![0x45, 0x00, 0x00, 60, 0x01, 0x02, 0x40, 0x00, 64, 4, 0, 0, 192, 0, 2, 10, 198, 51, 100, 7];
        let c = checksum::checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        want.extend_from_slice(&ip);
        want.extend_from_slice(inner);
        assert_eq!(out, want);
        // The outer packet parses as IPv4 protocol 4 with a valid header checksum.
        assert!(matches!(parse(&out, Checks::default()), Ok(Frame::Other)));
    }

    #[test]
    fn gue_over_ipv4_byte_for_byte() {
        let frame = udp4(b"payload");
        let mut out = Vec::new();
        encapsulate(&frame, 14, frame.len(), Tunnel::Gue { port: 6080 }, &outer4(), &mut out).expect("encap");
        let inner = &frame[14..];
        let total = 20 + 8 + inner.len();
        let mut ip = vec![0x45, 0x00, 0, 0, 0x01, 0x02, 0x40, 0x00, 64, 17, 0, 0, 192, 0, 2, 10, 198, 51, 100, 7];
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        let c = checksum::checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut want = frame[..12].to_vec();
        want.extend_from_slice(&[0x08, 0x00]);
        want.extend_from_slice(&ip);
        // Source port 0xc000 | (0xbeef & 0x3fff) = 0xfeef, destination 6080,
        // length, checksum zero (none) over IPv4.
        want.extend_from_slice(&[0xfe, 0xef, 0x17, 0xc0]);
        want.extend_from_slice(&((8 + inner.len()) as u16).to_be_bytes());
        want.extend_from_slice(&[0, 0]);
        want.extend_from_slice(inner);
        assert_eq!(out, want);
        // And it parses as UDP to port 6080 whose payload starts with 0b01 (variant 1).
        match parse(&out, Checks::default()) {
            Ok(Frame::Ip(p)) => {
                assert_eq!((p.flow.proto, p.flow.dport), (17, 6080));
                assert_eq!(out[p.l4 + 8] >> 6, 0b01);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gue_over_ipv6_has_a_valid_udp_checksum() {
        let frame = tcp4(TCP_SYN, b"");
        let outer = Outer {
            src: "2001:db8::10".parse::<Ipv6Addr>().expect("v6").into(),
            dst: "2001:db8::7".parse::<Ipv6Addr>().expect("v6").into(),
            ..outer4()
        };
        let mut out = Vec::new();
        encapsulate(&frame, 14, frame.len(), Tunnel::Gue { port: 6080 }, &outer, &mut out).expect("encap");
        // The parser verifies the UDP checksum over the IPv6 pseudo-header.
        match parse(&out, Checks::default()) {
            Ok(Frame::Ip(p)) => {
                assert_eq!(p.flow.proto, 17);
                assert_eq!(&out[p.l4 + 8..], &frame[14..]);
            }
            other => panic!("{other:?}"),
        }
        let mut v6 = Vec::new();
        encapsulate(&frame, 14, frame.len(), Tunnel::Ipip, &outer, &mut v6).expect("encap");
        assert_eq!(v6[12..14], [0x86, 0xdd]);
        assert_eq!(v6[14 + 6], 4, "next header: IPv4");
        assert_eq!(&v6[14 + 40..], &frame[14..]);
    }

    #[test]
    fn mixed_families_are_refused() {
        let frame = tcp4(TCP_SYN, b"");
        let outer = Outer { dst: "2001:db8::7".parse::<Ipv6Addr>().expect("v6").into(), ..outer4() };
        assert_eq!(
            encapsulate(&frame, 14, frame.len(), Tunnel::Ipip, &outer, &mut Vec::new()),
            Err(EncapError::MixedFamilies)
        );
    }
}
