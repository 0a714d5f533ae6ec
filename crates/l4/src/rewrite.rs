//! In-place rewrites for the forwarding modes (NAT and FNAT change addresses
//! and ports; every mode changes MAC addresses), with checksums updated
//! incrementally from the words that changed rather than recomputed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use gatehouse_wire::be::{get16, put16};
use gatehouse_wire::checksum::{self, update, update16};
use gatehouse_wire::field::{ethernet, icmp, ipv4, ipv6, tcp, udp};
use gatehouse_wire::packet::{Ip, PROTO_ICMP, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

/// Where a transport protocol keeps its checksum, relative to its header.
fn l4_checksum_at(proto: u8) -> Option<usize> {
    match proto {
        PROTO_TCP => Some(tcp::CHECKSUM),
        PROTO_UDP => Some(udp::CHECKSUM),
        _ => None,
    }
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
    let at = ip.l3 + if src { ipv4::SRC } else { ipv4::DST };
    let old: [u8; 4] = [frame[at], frame[at + 1], frame[at + 2], frame[at + 3]];
    let new = new.octets();
    frame[at..at + 4].copy_from_slice(&new);
    let hc = get16(frame, ip.l3 + ipv4::CHECKSUM);
    put16(frame, ip.l3 + ipv4::CHECKSUM, update(hc, &old, &new));
    adjust_l4(frame, ip, &old, &new);
}

/// Sets the IPv6 source (`src`) or destination address (IPv6 has no header
/// checksum; the transport one covers the addresses).
pub fn set_ipv6_addr(frame: &mut [u8], ip: &Ip, src: bool, new: Ipv6Addr) {
    let at = ip.l3 + if src { ipv6::SRC } else { ipv6::DST };
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
        let at = ip.l4 + icmp::IDENT;
        let old = get16(frame, at);
        put16(frame, at, new);
        let hc = get16(frame, ip.l4 + icmp::CHECKSUM);
        put16(frame, ip.l4 + icmp::CHECKSUM, update16(hc, old, new));
        return;
    }
    // TCP and UDP keep their ports at the same places.
    let at = ip.l4 + if src { tcp::SRC_PORT } else { tcp::DST_PORT };
    let old = get16(frame, at);
    put16(frame, at, new);
    adjust_l4(frame, ip, &old.to_be_bytes(), &new.to_be_bytes());
}

/// Sets the Ethernet destination and source addresses.
pub fn set_macs(frame: &mut [u8], dst: [u8; 6], src: [u8; 6]) {
    // Every frame the plane parsed has its Ethernet header.
    if let Some(h) = frame.first_chunk_mut::<{ ethernet::ADDRS_LEN }>() {
        h[ethernet::DST..ethernet::SRC].copy_from_slice(&dst);
        h[ethernet::SRC..].copy_from_slice(&src);
    }
}

/// Decrements the IPv4 TTL or IPv6 hop limit; false when it reaches zero
/// (the packet must be dropped, and an ICMP time exceeded may be sent).
pub fn decrement_ttl(frame: &mut [u8], ip: &Ip) -> bool {
    let v4 = ip.flow.src.is_ipv4();
    let at = ip.l3 + if v4 { ipv4::TTL } else { ipv6::HOP_LIMIT };
    let ttl = frame[at];
    if ttl <= 1 {
        return false;
    }
    frame[at] = ttl - 1;
    if v4 {
        // TTL is the high byte of the word it shares with the protocol.
        let old = u16::from_be_bytes([ttl, frame[at + 1]]);
        let new = u16::from_be_bytes([ttl - 1, frame[at + 1]]);
        let hc = get16(frame, ip.l3 + ipv4::CHECKSUM);
        put16(frame, ip.l3 + ipv4::CHECKSUM, update16(hc, old, new));
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
    let (l3, l4) = (ip.l3, ip.l4);
    if l4 < l3 + ipv4::MIN_HEADER_LEN || l4 > frame.len() {
        return false;
    }
    let (head, seg) = frame.split_at_mut(l4);
    let (Some(h), Some(ports)) = (head[l3..].first_chunk_mut::<{ ipv4::MIN_HEADER_LEN }>(), seg.first_chunk_mut::<4>())
    else {
        return false;
    };
    let ttl = h[ipv4::TTL];
    if ttl <= 1 {
        return false;
    }
    // The deltas (+ ~old + new per 16-bit word) are summed over the words
    // as they lie in memory, and the checksums read and written the same
    // way: ones'-complement sums do not depend on the byte order they are
    // taken in (RFC 1071, 2(B)), so no word is byte-swapped.
    let word = |b: [u8; 2]| u64::from(u16::from_ne_bytes(b));
    // TTL is the high byte of the word it shares with the protocol.
    let proto = h[ipv4::PROTOCOL];
    let mut ip_delta = word([!ttl, !proto]) + word([ttl - 1, proto]);
    let mut l4_delta = 0u64;
    h[ipv4::TTL] = ttl - 1;
    if let Some((addr, port)) = src {
        let (ip_d, l4_d) = replace_endpoint::<{ ipv4::SRC }, { tcp::SRC_PORT }>(h, ports, addr, port);
        ip_delta += ip_d;
        l4_delta += l4_d;
    }
    if let Some((addr, port)) = dst {
        let (ip_d, l4_d) = replace_endpoint::<{ ipv4::DST }, { tcp::DST_PORT }>(h, ports, addr, port);
        ip_delta += ip_d;
        l4_delta += l4_d;
    }
    const SUM: usize = ipv4::CHECKSUM;
    let hc = word([!h[SUM], !h[SUM + 1]]);
    h[SUM..SUM + 2].copy_from_slice(&(!checksum::fold(hc + ip_delta)).to_ne_bytes());
    if let Some(at) = l4_checksum_at(ip.flow.proto)
        && let Some(sum) = seg.get_mut(at..at + 2)
    {
        let hc = u16::from_ne_bytes([sum[0], sum[1]]);
        // A UDP checksum of zero means "none" and stays so; a computed
        // zero goes out as 0xffff (both read the same in either byte order).
        if !(ip.flow.proto == PROTO_UDP && hc == 0) {
            let mut c = !checksum::fold(u64::from(!hc) + l4_delta);
            if ip.flow.proto == PROTO_UDP && c == 0 {
                c = 0xffff;
            }
            sum.copy_from_slice(&c.to_ne_bytes());
        }
    }
    true
}

/// Writes `addr` at offset `A` of an IPv4 header and `port` at offset `P` of
/// the transport header after it; returns the changes to the IP and the
/// transport checksums (+ ~old + new per 16-bit word, words in memory
/// order, as [`nat_v4`] sums them). Offsets as constants: no bounds checks.
#[inline(always)]
fn replace_endpoint<const A: usize, const P: usize>(
    h: &mut [u8; ipv4::MIN_HEADER_LEN],
    ports: &mut [u8; 4],
    addr: Ipv4Addr,
    port: u16,
) -> (u64, u64) {
    let word = |b: [u8; 2]| u64::from(u16::from_ne_bytes(b));
    let (new, port) = (addr.octets(), port.to_be_bytes());
    let d = word([!h[A], !h[A + 1]]) + word([!h[A + 2], !h[A + 3]]) + word([new[0], new[1]]) + word([new[2], new[3]]);
    let l4 = d + word([!ports[P], !ports[P + 1]]) + word(port);
    h[A..A + 4].copy_from_slice(&new);
    ports[P..P + 2].copy_from_slice(&port);
    (d, l4)
}

/// Turns a TCP segment into the reset that answers it, in place, and
/// returns the new frame length: addresses, ports and MACs swapped; IP
/// options, extension headers, TCP options and data dropped. Sequence
/// numbers as RFC 9293 (3.10.7.1) answers a segment for no connection: to a
/// segment with ACK, `<SEQ=SEG.ACK><CTL=RST>`; otherwise
/// `<SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>`. `None` for anything but TCP.
pub fn tcp_reset(frame: &mut [u8], ip: &Ip) -> Option<usize> {
    if ip.flow.proto != PROTO_TCP || ip.end < ip.l4 + tcp::MIN_HEADER_LEN || frame.len() < ip.end {
        return None;
    }
    let seg = &frame[ip.l4..ip.end];
    let be32 = |at: usize| u32::from_be_bytes([seg[at], seg[at + 1], seg[at + 2], seg[at + 3]]);
    let (seq, ack, flags) = (be32(tcp::SEQ), be32(tcp::ACK), seg[tcp::FLAGS]);
    let data = seg.len().saturating_sub(usize::from(seg[tcp::DATA_OFF] >> 4) * 4);
    let (r_seq, r_ack, r_flags) = if flags & TCP_ACK != 0 {
        (ack, 0, TCP_RST)
    } else {
        let len = data as u32 + u32::from(flags & TCP_SYN != 0) + u32::from(flags & TCP_FIN != 0);
        (0, seq.wrapping_add(len), TCP_RST | TCP_ACK)
    };
    // Back where it came from: addresses and ports swapped.
    let reset = Segment {
        src: ip.flow.dst,
        dst: ip.flow.src,
        sport: ip.flow.dport,
        dport: ip.flow.sport,
        seq: r_seq,
        ack: r_ack,
        flags: r_flags,
        window: 0,
        mss: None,
    };
    let end = write(frame, ip.l3, &reset, &[])?;
    let (dst, src) = (frame.get(ethernet::DST..)?.first_chunk()?, frame.get(ethernet::SRC..)?.first_chunk()?);
    let (dst, src) = (*dst, *src);
    set_macs(frame, src, dst);
    Some(end)
}

/// A TCP segment to write.
#[derive(Clone, Copy, Debug)]
pub struct Segment {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    /// An MSS option (for SYNs and SYN-ACKs).
    pub mss: Option<u16>,
}

/// Writes `s` with `data` as an IP packet at `frame[l3..]` (the Ethernet
/// header before it stays; the caller sets its addresses); returns the end
/// of the packet, or None if the frame is too small or the families differ.
/// Checksums are computed whole.
pub fn write(frame: &mut [u8], l3: usize, s: &Segment, data: &[u8]) -> Option<usize> {
    let hl = tcp::MIN_HEADER_LEN + if s.mss.is_some() { 4 } else { 0 };
    let tcp_len = hl + data.len();
    let (ip_len, pseudo) = match (s.src, s.dst) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            (ipv4::MIN_HEADER_LEN, checksum::pseudo_v4(a.octets(), b.octets(), PROTO_TCP, tcp_len as u16))
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            (ipv6::HEADER_LEN, checksum::pseudo_v6(a.octets(), b.octets(), PROTO_TCP, tcp_len as u32))
        }
        _ => return None,
    };
    let end = l3 + ip_len + tcp_len;
    let out = frame.get_mut(l3..end)?;
    let (h, t) = out.split_at_mut(ip_len);
    match (s.src, s.dst) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            h[ipv4::VER_IHL] = 0x45;
            h[ipv4::VER_IHL + 1] = 0;
            h[ipv4::TOTAL_LEN..ipv4::TOTAL_LEN + 2].copy_from_slice(&((ip_len + tcp_len) as u16).to_be_bytes());
            h[ipv4::ID..ipv4::ID + 2].copy_from_slice(&[0, 0]);
            // Don't fragment.
            h[ipv4::FLAGS_FRAG..ipv4::FLAGS_FRAG + 2].copy_from_slice(&[0x40, 0]);
            h[ipv4::TTL] = 64;
            h[ipv4::PROTOCOL] = PROTO_TCP;
            h[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&[0, 0]);
            h[ipv4::SRC..ipv4::SRC + 4].copy_from_slice(&a.octets());
            h[ipv4::DST..ipv4::DST + 4].copy_from_slice(&b.octets());
            let c = checksum::checksum(h);
            h[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            h[ipv6::VER_TC_FLOW..ipv6::PAYLOAD_LEN].copy_from_slice(&[0x60, 0, 0, 0]);
            h[ipv6::PAYLOAD_LEN..ipv6::NEXT_HEADER].copy_from_slice(&(tcp_len as u16).to_be_bytes());
            h[ipv6::NEXT_HEADER] = PROTO_TCP;
            h[ipv6::HOP_LIMIT] = 64;
            h[ipv6::SRC..ipv6::DST].copy_from_slice(&a.octets());
            h[ipv6::DST..ipv6::HEADER_LEN].copy_from_slice(&b.octets());
        }
        _ => return None,
    }
    t[tcp::SRC_PORT..tcp::SRC_PORT + 2].copy_from_slice(&s.sport.to_be_bytes());
    t[tcp::DST_PORT..tcp::DST_PORT + 2].copy_from_slice(&s.dport.to_be_bytes());
    t[tcp::SEQ..tcp::SEQ + 4].copy_from_slice(&s.seq.to_be_bytes());
    t[tcp::ACK..tcp::ACK + 4].copy_from_slice(&s.ack.to_be_bytes());
    t[tcp::DATA_OFF] = ((hl / 4) as u8) << 4;
    t[tcp::FLAGS] = s.flags;
    t[tcp::WINDOW..tcp::WINDOW + 2].copy_from_slice(&s.window.to_be_bytes());
    t[tcp::CHECKSUM..tcp::CHECKSUM + 4].copy_from_slice(&[0, 0, 0, 0]);
    if let Some(m) = s.mss {
        let [hi, lo] = m.to_be_bytes();
        t[tcp::MIN_HEADER_LEN..hl].copy_from_slice(&[2, 4, hi, lo]);
    }
    t[hl..].copy_from_slice(data);
    let c = !checksum::fold(checksum::add(pseudo, t));
    t[tcp::CHECKSUM..tcp::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
    Some(end)
}

/// Adds `delta` to the 32-bit field at `at` of the TCP segment at `l4`,
/// keeping its checksum (sequence and acknowledgment numbers of a proxied
/// connection).
pub fn shift32(frame: &mut [u8], l4: usize, at: usize, delta: u32) {
    let Some(b) = frame.get(l4 + at..l4 + at + 4) else { return };
    let old = [b[0], b[1], b[2], b[3]];
    let new = u32::from_be_bytes(old).wrapping_add(delta).to_be_bytes();
    let Some(c) = frame.get(l4 + tcp::CHECKSUM..l4 + tcp::CHECKSUM + 2) else { return };
    let hc = u16::from_be_bytes([c[0], c[1]]);
    let hc = checksum::update(hc, &old, &new);
    frame[l4 + at..l4 + at + 4].copy_from_slice(&new);
    frame[l4 + tcp::CHECKSUM..l4 + tcp::CHECKSUM + 2].copy_from_slice(&hc.to_be_bytes());
}

/// Replaces the source and/or destination (address, port) and decrements the
/// TTL: IPv4 in one fused pass, IPv6 step by step (no header checksum
/// there). False when the TTL runs out.
pub fn nat(frame: &mut [u8], ip: &Ip, src: Option<(IpAddr, u16)>, dst: Option<(IpAddr, u16)>) -> bool {
    let v4 = |x: Option<(IpAddr, u16)>| match x {
        Some((IpAddr::V4(a), p)) => Ok(Some((a, p))),
        None => Ok(None),
        Some(_) => Err(()),
    };
    if let (Ok(s4), Ok(d4)) = (v4(src), v4(dst))
        && ip.flow.src.is_ipv4()
    {
        return nat_v4(frame, ip, s4, d4);
    }
    if !decrement_ttl(frame, ip) {
        return false;
    }
    for (is_src, change) in [(false, dst), (true, src)] {
        if let Some((a, p)) = change {
            set_addr(frame, ip, is_src, a);
            set_port(frame, ip, is_src, p);
        }
    }
    true
}

fn set_addr(frame: &mut [u8], ip: &Ip, src: bool, a: IpAddr) {
    match a {
        IpAddr::V4(a) => set_ipv4_addr(frame, ip, src, a),
        IpAddr::V6(a) => set_ipv6_addr(frame, ip, src, a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_wire::packet::build::*;
    use gatehouse_wire::packet::{Checks, Frame, TCP_ACK, TCP_SYN, parse};

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
        for i in 0..4000 {
            let f0 = match i % 4 {
                0 => tcp4(TCP_SYN, b""),
                1 => tcp4(TCP_ACK, b"payload"),
                2 => udp4(b"dgram"),
                _ => {
                    // UDP without a checksum: it must stay without one.
                    let mut f = udp4(b"no sum");
                    f[40..42].copy_from_slice(&[0, 0]);
                    f
                }
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
            if i % 4 == 3 {
                assert_eq!(&a[40..42], &[0, 0]);
            }
            // Same bytes, or the same checksums in the other zero form.
            if a != b {
                let q = ip(&a); // still valid
                assert_eq!(q.flow, ip(&b).flow);
            }
        }
    }

    #[test]
    fn a_reset_answers_a_segment_as_rfc_9293_says() {
        // With ACK: SEQ = the segment's ACK, flags RST.
        let mut f = tcp4(TCP_ACK, b"some data");
        let ack = 0x0102_0304u32;
        f[42..46].copy_from_slice(&ack.to_be_bytes());
        let c = !gatehouse_wire::checksum::fold(gatehouse_wire::checksum::add(
            gatehouse_wire::checksum::pseudo_v4(C4, V4, gatehouse_wire::packet::PROTO_TCP, 29),
            &{
                let mut seg = f[34..].to_vec();
                seg[16..18].copy_from_slice(&[0, 0]);
                seg
            },
        ));
        f[50..52].copy_from_slice(&c.to_be_bytes());
        let p = ip(&f);
        let n = tcp_reset(&mut f, &p).expect("a TCP segment");
        assert_eq!(n, 14 + 40);
        let q = ip(&f[..n]);
        assert_eq!(
            (q.flow.src, q.flow.dst, q.flow.sport, q.flow.dport),
            (p.flow.dst, p.flow.src, p.flow.dport, p.flow.sport)
        );
        assert_eq!(q.tcp_flags, TCP_RST);
        assert_eq!(&f[38..42], &ack.to_be_bytes());
        assert_eq!(&f[0..6], &[2, 0, 0, 0, 0, 2]);
        // Without ACK: ACK = SEQ + data + SYN, flags RST|ACK.
        let mut f = tcp4(TCP_SYN, b"abc");
        let p = ip(&f);
        let n = tcp_reset(&mut f, &p).expect("a TCP segment");
        let q = ip(&f[..n]);
        assert_eq!(q.tcp_flags, TCP_RST | TCP_ACK);
        assert_eq!(&f[38..42], &[0, 0, 0, 0]);
        assert_eq!(&f[42..46], &(1u32 + 3 + 1).to_be_bytes());
        // IPv6, and nothing but TCP.
        let (a, b) = (
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        );
        let seg = tcp(1234, 80, TCP_ACK, b"x", |len| {
            gatehouse_wire::checksum::pseudo_v6(a, b, gatehouse_wire::packet::PROTO_TCP, len as u32)
        });
        let mut f = eth(gatehouse_wire::packet::ETHERTYPE_IPV6, &ipv6(a, b, gatehouse_wire::packet::PROTO_TCP, &seg));
        let p = ip(&f);
        let n = tcp_reset(&mut f, &p).expect("a TCP segment");
        assert_eq!(n, 14 + 60);
        let q = ip(&f[..n]);
        assert_eq!((q.flow.src, q.flow.dst, q.flow.sport, q.flow.dport), (p.flow.dst, p.flow.src, 80, 1234));
        let mut u = udp4(b"x");
        let p = ip(&u);
        assert_eq!(tcp_reset(&mut u, &p), None);
    }
}
