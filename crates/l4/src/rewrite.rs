//! In-place rewrites for the forwarding modes (NAT and FNAT change addresses
//! and ports; every mode changes MAC addresses), with checksums updated
//! incrementally from the words that changed rather than recomputed.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::checksum::{self, update, update16};
use crate::packet::{Ip, PROTO_ICMP, PROTO_TCP, PROTO_UDP};

/// Where a transport protocol keeps its checksum, relative to its header.
fn l4_checksum_at(proto: u8) -> Option<usize> {
    match proto {
        PROTO_TCP => Some(16),
        PROTO_UDP => Some(6),
        _ => None,
    }
}

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Adjusts the transport checksum for `old` → `new` bytes of the pseudo-header
/// or header. A UDP checksum of zero over IPv4 means "none" and stays zero; a
/// computed zero is sent as 0xffff (RFC 768).
fn adjust_l4(frame: &mut [u8], ip: &Ip, old: &[u8], new: &[u8]) {
    let Some(at) = l4_checksum_at(ip.flow.proto).map(|o| ip.l4 + o) else { return };
    let hc = get16(frame, at);
    if ip.flow.proto == PROTO_UDP && hc == 0 && ip.flow.src.is_ipv4() {
        return;
    }
    let mut c = update(hc, old, new);
    if ip.flow.proto == PROTO_UDP && c == 0 {
        c = 0xffff;
    }
    put16(frame, at, c);
}

/// Sets the IPv4 source (`src`) or destination address.
pub fn set_ipv4_addr(frame: &mut [u8], ip: &Ip, src: bool, new: Ipv4Addr) {
    let at = ip.l3 + if src { 12 } else { 16 };
    let old: [u8; 4] = [frame[at], frame[at + 1], frame[at + 2], frame[at + 3]];
    let new = new.octets();
    frame[at..at + 4].copy_from_slice(&new);
    let hc = get16(frame, ip.l3 + 10);
    put16(frame, ip.l3 + 10, update(hc, &old, &new));
    adjust_l4(frame, ip, &old, &new);
}

/// Sets the IPv6 source (`src`) or destination address (IPv6 has no header
/// checksum; the transport one covers the addresses).
pub fn set_ipv6_addr(frame: &mut [u8], ip: &Ip, src: bool, new: Ipv6Addr) {
    let at = ip.l3 + if src { 8 } else { 24 };
    let mut old = [0u8; 16];
    old.copy_from_slice(&frame[at..at + 16]);
    let new = new.octets();
    frame[at..at + 16].copy_from_slice(&new);
    adjust_l4(frame, ip, &old, &new);
}

/// Sets the TCP or UDP source (`src`) or destination port; for ICMP echo,
/// the identifier (NAT treats it as the port).
pub fn set_port(frame: &mut [u8], ip: &Ip, src: bool, new: u16) {
    if ip.flow.proto == PROTO_ICMP {
        let at = ip.l4 + 4;
        let old = get16(frame, at);
        put16(frame, at, new);
        let hc = get16(frame, ip.l4 + 2);
        put16(frame, ip.l4 + 2, update16(hc, old, new));
        return;
    }
    let at = ip.l4 + if src { 0 } else { 2 };
    let old = get16(frame, at);
    put16(frame, at, new);
    adjust_l4(frame, ip, &old.to_be_bytes(), &new.to_be_bytes());
}

/// Sets the Ethernet destination and source addresses.
pub fn set_macs(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
}

/// Decrements the IPv4 TTL or IPv6 hop limit; false when it reaches zero
/// (the packet must be dropped, and an ICMP time exceeded may be sent).
pub fn decrement_ttl(frame: &mut [u8], ip: &Ip) -> bool {
    let v4 = ip.flow.src.is_ipv4();
    let at = ip.l3 + if v4 { 8 } else { 7 };
    let ttl = frame[at];
    if ttl <= 1 {
        return false;
    }
    frame[at] = ttl - 1;
    if v4 {
        // TTL is the high byte of the word it shares with the protocol.
        let old = u16::from_be_bytes([ttl, frame[at + 1]]);
        let new = u16::from_be_bytes([ttl - 1, frame[at + 1]]);
        let hc = get16(frame, ip.l3 + 10);
        put16(frame, ip.l3 + 10, update16(hc, old, new));
    }
    true
}

/// The NAT rewrite of an IPv4 packet in one pass: TTL decremented, source
/// and/or destination address and port replaced, each checksum (IP header,
/// TCP/UDP) adjusted once by the sum of all its changed words. The same bytes
/// as [`decrement_ttl`], [`set_ipv4_addr`] and [`set_port`] one after the
/// other (checked in the tests), in about a third of the work. False (and the
/// frame untouched) when the TTL runs out.
pub fn nat_v4(frame: &mut [u8], ip: &Ip, src: Option<(Ipv4Addr, u16)>, dst: Option<(Ipv4Addr, u16)>) -> bool {
    let l3 = ip.l3;
    let ttl = frame[l3 + 8];
    if ttl <= 1 {
        return false;
    }
    // Ones'-complement deltas: + ~old + new per 16-bit word.
    let word = |b: &[u8], at: usize| u64::from(u16::from_be_bytes([b[at], b[at + 1]]));
    let mut ip_delta = u64::from(!(word(frame, l3 + 8) as u16)) + (word(frame, l3 + 8) - 0x100);
    let mut l4_delta = 0u64;
    frame[l3 + 8] = ttl - 1;
    let l4_sum = l4_checksum_at(ip.flow.proto).map(|o| ip.l4 + o);
    for (is_src, change) in [(true, src), (false, dst)] {
        let Some((addr, port)) = change else { continue };
        let a = l3 + if is_src { 12 } else { 16 };
        let new = addr.octets();
        for k in [0, 2] {
            let old = word(frame, a + k);
            let nw = u64::from(u16::from_be_bytes([new[k], new[k + 1]]));
            let d = u64::from(!(old as u16)) + nw;
            ip_delta += d;
            l4_delta += d;
        }
        frame[a..a + 4].copy_from_slice(&new);
        let p = ip.l4 + if is_src { 0 } else { 2 };
        let old = word(frame, p);
        l4_delta += u64::from(!(old as u16)) + u64::from(port);
        put16(frame, p, port);
    }
    let hc = get16(frame, l3 + 10);
    put16(frame, l3 + 10, !checksum::fold(u64::from(!hc) + ip_delta));
    if let Some(at) = l4_sum {
        let hc = get16(frame, at);
        let udp_none = ip.flow.proto == PROTO_UDP && hc == 0;
        if !udp_none {
            let mut c = !checksum::fold(u64::from(!hc) + l4_delta);
            if ip.flow.proto == PROTO_UDP && c == 0 {
                c = 0xffff;
            }
            put16(frame, at, c);
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::build::*;
    use crate::packet::{Checks, Frame, TCP_ACK, TCP_SYN, parse};

    fn ip(frame: &[u8]) -> Ip {
        match parse(frame, Checks::default()) {
            Ok(Frame::Ip(ip)) => ip,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nat_rewrites_keep_every_checksum_valid() {
        let mut rng = fastrand::Rng::with_seed(5);
        for i in 0..500 {
            let mut f = match i % 3 {
                0 => tcp4(TCP_SYN, b""),
                1 => tcp4(TCP_ACK, b"some payload bytes"),
                _ => udp4(b"datagram"),
            };
            let p = ip(&f);
            let (a, b) = (Ipv4Addr::from(rng.u32(..)), Ipv4Addr::from(rng.u32(..)));
            let (sp, dp) = (rng.u16(..), rng.u16(..));
            set_ipv4_addr(&mut f, &p, false, a);
            set_ipv4_addr(&mut f, &p, true, b);
            set_port(&mut f, &p, false, dp);
            set_port(&mut f, &p, true, sp);
            assert!(decrement_ttl(&mut f, &p));
            // The parser verifies the IPv4 header and transport checksums.
            let q = ip(&f);
            assert_eq!((q.flow.src, q.flow.dst, q.flow.sport, q.flow.dport), (b.into(), a.into(), sp, dp));
            assert_eq!(q.ttl, 63);
        }
    }

    #[test]
    fn a_udp_packet_without_checksum_keeps_none() {
        let mut f = udp4(b"x");
        f[40..42].copy_from_slice(&[0, 0]);
        let p = ip(&f);
        set_ipv4_addr(&mut f, &p, false, Ipv4Addr::new(192, 168, 1, 1));
        assert_eq!(&f[40..42], &[0, 0]);
        assert!(matches!(parse(&f, Checks::default()), Ok(Frame::Ip(_))));
    }

    #[test]
    fn ttl_one_is_not_forwarded() {
        let mut f = tcp4(TCP_SYN, b"");
        f[22] = 1;
        let p = ip(&{
            let mut g = f.clone();
            g[22] = 64;
            g
        });
        assert!(!decrement_ttl(&mut f, &p));
    }

    #[test]
    fn the_fused_nat_rewrite_equals_the_steps() {
        let mut rng = fastrand::Rng::with_seed(21);
        for i in 0..3000 {
            let f0 = match i % 3 {
                0 => tcp4(TCP_SYN, b""),
                1 => tcp4(TCP_ACK, b"payload"),
                _ => udp4(b"dgram"),
            };
            let p = ip(&f0);
            let src = rng.bool().then(|| (Ipv4Addr::from(rng.u32(..)), rng.u16(..)));
            let dst = rng.bool().then(|| (Ipv4Addr::from(rng.u32(..)), rng.u16(..)));
            let mut a = f0.clone();
            assert!(nat_v4(&mut a, &p, src, dst));
            let mut b = f0.clone();
            assert!(decrement_ttl(&mut b, &p));
            if let Some((addr, port)) = dst {
                set_ipv4_addr(&mut b, &p, false, addr);
                set_port(&mut b, &p, false, port);
            }
            if let Some((addr, port)) = src {
                set_ipv4_addr(&mut b, &p, true, addr);
                set_port(&mut b, &p, true, port);
            }
            // Same bytes, or the same checksums in the other zero form.
            if a != b {
                let q = ip(&a); // still valid
                assert_eq!(q.flow, ip(&b).flow);
            }
        }
    }
}
