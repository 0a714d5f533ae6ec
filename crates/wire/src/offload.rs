//! TUN offloads: the virtio-net header the kernel puts before every packet
//! of an `IFF_VNET_HDR` interface, and the work the kernel hands over with
//! it. A TCP (or UDP) super-packet of up to 64 KiB read from the tunnel is
//! cut here into packets of one segment each, with their headers and
//! checksums made right; a packet whose checksum the kernel left partial
//! gets it completed. Going the other way, consecutive TCP segments of one
//! flow are coalesced into one super-packet (GRO), so that the kernel's
//! stack sees one packet for many.

use crate::be::{get16, get32, put16, put32};
use crate::checksum;
use crate::field::{ipv4, ipv6, tcp, udp};
use crate::ip::pseudo_header;
use crate::packet::{PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, TCP_URG};

/// Bytes of `struct virtio_net_hdr`.
pub const VNET_HDR_LEN: usize = 10;

pub const F_NEEDS_CSUM: u8 = 1;
pub const F_DATA_VALID: u8 = 2;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_UDP_L4: u8 = 5;
pub const GSO_ECN: u8 = 0x80;

/// `struct virtio_net_hdr`, in the host's byte order (as TUN uses it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8]) -> Option<VnetHdr> {
        let b = b.get(..VNET_HDR_LEN)?;
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    pub fn write(&self, out: &mut [u8]) {
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }
}

/// Why a packet from the tunnel could not be cut into segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitError {
    /// Headers cut short, or fields that do not add up.
    Malformed,
    /// A GSO type this plane did not ask for.
    Unsupported,
}

/// How a packet read from the tunnel becomes packets of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    v6: bool,
    proto: u8,
    /// Where the TCP or UDP header starts, and where the payload does.
    l4: usize,
    payload: usize,
    /// Payload bytes per segment (the whole payload when not GSO).
    mss: usize,
    pub segments: usize,
    gso: bool,
}

impl Split {
    /// Bytes segment `i` takes.
    pub fn segment_len(&self, pkt_len: usize, i: usize) -> usize {
        let left = pkt_len - self.payload - i * self.mss;
        self.payload + left.min(self.mss)
    }
}

/// Reads `pkt`'s headers as the virtio header describes it.
pub fn plan(hdr: &VnetHdr, pkt: &[u8]) -> Result<Split, SplitError> {
    let gso = hdr.gso_type & !GSO_ECN;
    if gso == GSO_NONE {
        return Ok(Split {
            v6: false,
            proto: 0,
            l4: 0,
            payload: pkt.len(),
            mss: pkt.len().max(1),
            segments: 1,
            gso: false,
        });
    }
    let (v6, proto, l4) = match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= ipv4::MIN_HEADER_LEN => {
            let ihl = usize::from(pkt[ipv4::VER_IHL] & 15) * 4;
            (false, pkt[ipv4::PROTOCOL], ihl)
        }
        Some(6) if pkt.len() >= ipv6::HEADER_LEN => (true, pkt[ipv6::NEXT_HEADER], ipv6::HEADER_LEN),
        _ => return Err(SplitError::Malformed),
    };
    let want = match gso {
        GSO_TCPV4 if !v6 => PROTO_TCP,
        GSO_TCPV6 if v6 => PROTO_TCP,
        GSO_UDP_L4 => PROTO_UDP,
        _ => return Err(SplitError::Unsupported),
    };
    if proto != want || l4 < ipv4::MIN_HEADER_LEN {
        return Err(SplitError::Malformed);
    }
    let l4_len = match proto {
        PROTO_TCP => usize::from(*pkt.get(l4 + tcp::DATA_OFF).ok_or(SplitError::Malformed)? >> 4) * 4,
        _ => udp::HEADER_LEN,
    };
    let payload = l4 + l4_len;
    let mss = usize::from(hdr.gso_size);
    if l4_len < udp::HEADER_LEN || payload > pkt.len() || mss == 0 {
        return Err(SplitError::Malformed);
    }
    let segments = (pkt.len() - payload).div_ceil(mss).max(1);
    Ok(Split { v6, proto, l4, payload, mss, segments, gso: true })
}

/// The TCP or UDP checksum of `pkt` (an IP packet with its L4 header at
/// `l4`), written into it.
fn l4_checksum(pkt: &mut [u8], v6: bool, proto: u8, l4: usize) {
    let len = pkt.len() - l4;
    let field = l4 + if proto == PROTO_TCP { tcp::CHECKSUM } else { udp::CHECKSUM };
    pkt[field..field + 2].fill(0);
    let pseudo = pseudo_header(pkt, v6, proto, len);
    let mut sum = !checksum::fold(checksum::add(pseudo, &pkt[l4..]));
    if proto == PROTO_UDP && sum == 0 {
        sum = 0xffff;
    }
    put16(pkt, field, sum);
}

/// Writes segment `i` of `pkt` into `out` (at least
/// [`Split::segment_len`] bytes); returns its length. Without GSO the
/// packet is copied, its partial checksum completed if the header says so.
pub fn write_segment(hdr: &VnetHdr, s: &Split, pkt: &[u8], i: usize, out: &mut [u8]) -> usize {
    let len = s.segment_len(pkt.len(), i);
    if !s.gso {
        out[..len].copy_from_slice(pkt);
        let (start, off) = (usize::from(hdr.csum_start), usize::from(hdr.csum_offset));
        if hdr.flags & F_NEEDS_CSUM != 0 && start + off + 2 <= len {
            // The field holds the pseudo-header's sum: the rest is added.
            let sum = checksum::checksum(&out[start..len]);
            put16(out, start + off, sum);
        }
        return len;
    }
    let from = s.payload + i * s.mss;
    let chunk = len - s.payload;
    out[..s.payload].copy_from_slice(&pkt[..s.payload]);
    out[s.payload..len].copy_from_slice(&pkt[from..from + chunk]);
    let o = &mut out[..len];
    if s.v6 {
        put16(o, ipv6::PAYLOAD_LEN, (len - ipv6::HEADER_LEN) as u16);
    } else {
        put16(o, ipv4::TOTAL_LEN, len as u16);
        let id = get16(o, ipv4::ID).wrapping_add(i as u16);
        put16(o, ipv4::ID, id);
        put16(o, ipv4::CHECKSUM, 0);
        let c = checksum::checksum(&o[..s.l4]);
        put16(o, ipv4::CHECKSUM, c);
    }
    if s.proto == PROTO_TCP {
        let seq = get32(o, s.l4 + tcp::SEQ);
        put32(o, s.l4 + tcp::SEQ, seq.wrapping_add((i * s.mss) as u32));
        let flags = s.l4 + tcp::FLAGS;
        if i + 1 < s.segments {
            o[flags] &= !(TCP_FIN | TCP_PSH); // the last segment's
        }
        if i > 0 {
            o[flags] &= !TCP_CWR; // the first segment's
        }
    } else {
        put16(o, s.l4 + udp::LENGTH, (len - s.l4) as u16);
    }
    l4_checksum(o, s.v6, s.proto, s.l4);
    len
}

/// What GRO needs to know of a packet going to the tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// The IP and TCP (or UDP) headers' bytes, and where the L4 header starts.
    pub headers: usize,
    l4: usize,
    v6: bool,
    proto: u8,
    /// TCP only: the sequence number and flags.
    seq: u32,
    flags: u8,
    payload: usize,
}

impl Flow {
    pub fn payload(&self) -> usize {
        self.payload
    }

    pub fn flags(&self) -> u8 {
        self.flags
    }
}

/// A packet GRO may coalesce: plain IPv4 (no options, not a fragment) or
/// IPv6 (no extension headers) carrying some payload over UDP, or over
/// TCP with ACK set and none of SYN, FIN, RST, URG, CWR, ECE. `None` for
/// anything else.
pub fn flow(pkt: &[u8]) -> Option<Flow> {
    let (v6, l4, proto) = match pkt.first()? >> 4 {
        4 if pkt.len() >= ipv4::MIN_HEADER_LEN + udp::HEADER_LEN && pkt[ipv4::VER_IHL] == 0x45 => {
            // Not a fragment (MF clear, offset zero) and as long as it says.
            if get16(pkt, ipv4::FLAGS_FRAG) & 0x3fff != 0 || usize::from(get16(pkt, ipv4::TOTAL_LEN)) != pkt.len() {
                return None;
            }
            (false, ipv4::MIN_HEADER_LEN, pkt[ipv4::PROTOCOL])
        }
        6 if pkt.len() >= ipv6::HEADER_LEN + udp::HEADER_LEN
            && usize::from(get16(pkt, ipv6::PAYLOAD_LEN)) + ipv6::HEADER_LEN == pkt.len() =>
        {
            (true, ipv6::HEADER_LEN, pkt[ipv6::NEXT_HEADER])
        }
        _ => return None,
    };
    match proto {
        PROTO_UDP => {
            let headers = l4 + udp::HEADER_LEN;
            if headers >= pkt.len() || usize::from(get16(pkt, l4 + udp::LENGTH)) != pkt.len() - l4 {
                return None;
            }
            Some(Flow { headers, l4, v6, proto, seq: 0, flags: 0, payload: pkt.len() - headers })
        }
        PROTO_TCP if pkt.len() >= l4 + tcp::MIN_HEADER_LEN => {
            let thl = usize::from(pkt[l4 + tcp::DATA_OFF] >> 4) * 4;
            let flags = pkt[l4 + tcp::FLAGS];
            let headers = l4 + thl;
            let refused = TCP_CWR | TCP_ECE | TCP_URG | TCP_RST | TCP_SYN | TCP_FIN;
            if thl < tcp::MIN_HEADER_LEN || headers >= pkt.len() || flags & TCP_ACK == 0 || flags & refused != 0 {
                return None;
            }
            let seq = get32(pkt, l4 + tcp::SEQ);
            Some(Flow { headers, l4, v6, proto, seq, flags, payload: pkt.len() - headers })
        }
        _ => None,
    }
}

/// Whether `next` continues `first`'s flow after `so_far` payload bytes
/// of segments of `first`'s size: same addresses and ports, same headers
/// but for lengths, IDs, checksums (and for TCP the sequence, which must
/// follow on; no PSH before the end).
pub fn continues(first: &[u8], f: &Flow, so_far: usize, next: &[u8], n: &Flow) -> bool {
    if n.v6 != f.v6 || n.proto != f.proto || n.headers != f.headers || n.payload > f.payload {
        return false;
    }
    if f.proto == PROTO_TCP && (f.flags & TCP_PSH != 0 || n.seq != f.seq.wrapping_add(so_far as u32)) {
        return false;
    }
    let same = |a: std::ops::Range<usize>| first.get(a.clone()) == next.get(a);
    // IPv6: version, class, flow label; next header, hop limit, addresses.
    // IPv4: TOS; flags, TTL, protocol; addresses. Then the ports.
    let ip = if f.v6 { same(0..4) && same(6..40) } else { same(0..2) && same(6..10) && same(12..20) };
    let l4 = f.l4;
    if f.proto == PROTO_UDP {
        return ip && same(l4..l4 + 4);
    }
    // TCP: ports; ack, offset, flags but PSH; window; options.
    let flags_same = first[l4 + tcp::FLAGS] & !TCP_PSH == next[l4 + tcp::FLAGS] & !TCP_PSH;
    ip && same(l4..l4 + 4)
        && same(l4 + tcp::ACK..l4 + tcp::FLAGS)
        && flags_same
        && same(l4 + tcp::WINDOW..l4 + tcp::CHECKSUM)
        && same(l4 + tcp::MIN_HEADER_LEN..f.headers)
}

/// Makes `out` (holding a first segment and the payloads of the ones
/// that continue it, appended) one super-packet: lengths fixed, the IP
/// checksum made, the TCP or UDP checksum left partial for the kernel,
/// TCP's PSH taken from the last segment; returns its virtio header.
pub fn finish_coalesced(out: &mut [u8], f: &Flow, last_flags: u8) -> VnetHdr {
    let len = out.len();
    finish_headers(out, len, f, last_flags)
}

/// [`finish_coalesced`] for a super-packet whose payloads are not behind
/// its headers (a sender that gathers them from where they lie): `out`
/// holds the first segment's headers (`f.headers` bytes at least), `len`
/// is the whole super-packet's length, payloads included.
pub fn finish_headers(out: &mut [u8], len: usize, f: &Flow, last_flags: u8) -> VnetHdr {
    if f.v6 {
        put16(out, ipv6::PAYLOAD_LEN, (len - ipv6::HEADER_LEN) as u16);
    } else {
        put16(out, ipv4::TOTAL_LEN, len as u16);
        put16(out, ipv4::CHECKSUM, 0);
        let c = checksum::checksum(&out[..ipv4::MIN_HEADER_LEN]);
        put16(out, ipv4::CHECKSUM, c);
    }
    let l4_len = len - f.l4;
    let field = if f.proto == PROTO_TCP {
        out[f.l4 + tcp::FLAGS] |= last_flags & TCP_PSH;
        tcp::CHECKSUM
    } else {
        put16(out, f.l4 + udp::LENGTH, l4_len as u16);
        udp::CHECKSUM
    };
    // CHECKSUM_PARTIAL: the field holds the pseudo-header's sum.
    let pseudo = pseudo_header(out, f.v6, f.proto, l4_len);
    put16(out, f.l4 + field, checksum::fold(pseudo));
    let gso_type = match (f.proto, f.v6) {
        (PROTO_UDP, _) => GSO_UDP_L4,
        (_, true) => GSO_TCPV6,
        _ => GSO_TCPV4,
    };
    VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type,
        hdr_len: f.headers as u16,
        gso_size: f.payload as u16,
        csum_start: f.l4 as u16,
        csum_offset: field as u16,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 or IPv6 TCP packet with `payload` bytes and a right checksum.
    fn tcp_packet(v6: bool, seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = if v6 {
            let mut h = vec![0x60, 0, 0, 0, 0, 0, PROTO_TCP, 64];
            h.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
            h.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            h
        } else {
            vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, PROTO_TCP, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]
        };
        let l4 = p.len();
        p.extend_from_slice(&[0x9c, 0x40, 0, 80]);
        p.extend_from_slice(&seq.to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, 7, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        p.extend_from_slice(payload);
        let len = p.len();
        if v6 {
            put16(&mut p, 4, (len - 40) as u16);
        } else {
            put16(&mut p, 2, len as u16);
            let c = checksum::checksum(&p[..20]);
            put16(&mut p, 10, c);
        }
        l4_checksum(&mut p, v6, PROTO_TCP, l4);
        p
    }

    fn valid(p: &[u8], v6: bool) -> bool {
        let l4 = if v6 { 40 } else { 20 };
        let mut q = p.to_vec();
        l4_checksum(&mut q, v6, PROTO_TCP, l4);
        let ip_ok = v6 || checksum::checksum(&p[..20]) == 0;
        q == p && ip_ok
    }

    #[test]
    fn a_tso_super_packet_splits_into_valid_segments_and_coalesces_back() {
        for v6 in [false, true] {
            let payload: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
            let sup = tcp_packet(v6, 1000, 0x18, &payload); // ACK|PSH
            let hdr = VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
                gso_size: 1400,
                ..Default::default()
            };
            let s = plan(&hdr, &sup).expect("plans");
            assert_eq!(s.segments, 4);
            let mut segs = Vec::new();
            for i in 0..s.segments {
                let mut out = vec![0u8; 2000];
                let n = write_segment(&hdr, &s, &sup, i, &mut out);
                out.truncate(n);
                assert!(valid(&out, v6), "segment {i} has a wrong checksum");
                let want = tcp_packet(
                    v6,
                    1000 + 1400 * i as u32,
                    if i == 3 { 0x18 } else { 0x10 },
                    &payload[i * 1400..(i * 1400 + 1400).min(5000)],
                );
                if !v6 {
                    // IDs count up (and so the IP checksums differ);
                    // everything else as built by hand.
                    assert_eq!(get16(&out, 4), 0x1234 + i as u16);
                    assert_eq!((&out[..4], &out[6..10], &out[12..]), (&want[..4], &want[6..10], &want[12..]));
                } else {
                    assert_eq!(out, want);
                }
                segs.push(out);
            }
            // GRO: the four segments make the super-packet again.
            let first = flow(&segs[0]).expect("coalescable");
            let mut out = segs[0].clone();
            let mut so_far = first.payload();
            let mut last = first.flags();
            for seg in &segs[1..] {
                let f = flow(seg).expect("coalescable");
                assert!(continues(&segs[0], &first, so_far, seg, &f));
                out.extend_from_slice(&seg[first.headers..]);
                so_far += f.payload();
                last = f.flags();
            }
            let vh = finish_coalesced(&mut out, &first, last);
            assert_eq!((vh.gso_size, vh.hdr_len), (1400, first.headers as u16));
            // Completing the partial checksum gives the original packet.
            let mut done = out.clone();
            let l4 = first.headers - 20;
            let c = checksum::checksum(&done[l4..]);
            put16(&mut done, l4 + 16, c);
            if v6 {
                assert_eq!(done, sup);
            } else {
                assert_eq!(done[6..], sup[6..]);
            }
            // A gap in the sequence, or another flow, does not continue it.
            let gap = tcp_packet(v6, 1000 + 1400 * 5, 0x10, &payload[..1400]);
            let g = flow(&gap).expect("flow");
            assert!(!continues(&segs[0], &first, 1400, &gap, &g));
            let mut other = segs[1].clone();
            other[if v6 { 41 } else { 21 }] ^= 1;
            let o = flow(&other).expect("flow");
            assert!(!continues(&segs[0], &first, 1400, &other, &o));
        }
    }

    #[test]
    fn a_partial_checksum_is_completed_and_bad_headers_are_refused() {
        let mut p = tcp_packet(false, 5, 0x10, b"hello");
        let good = p.clone();
        // As the kernel hands it over: the pseudo-header's sum in the field.
        let tcp_len = p.len() - 20;
        let pseudo = checksum::fold(checksum::pseudo_v4([10, 0, 0, 1], [10, 0, 0, 2], PROTO_TCP, tcp_len as u16));
        put16(&mut p, 36, pseudo);
        let hdr = VnetHdr { flags: F_NEEDS_CSUM, csum_start: 20, csum_offset: 16, ..Default::default() };
        let s = plan(&hdr, &p).expect("plans");
        let mut out = vec![0u8; 100];
        let n = write_segment(&hdr, &s, &p, 0, &mut out);
        assert_eq!(&out[..n], &good[..]);
        let tso = VnetHdr { gso_type: GSO_TCPV4, gso_size: 100, ..Default::default() };
        assert_eq!(plan(&tso, &p[..30]), Err(SplitError::Malformed));
        assert_eq!(
            plan(&VnetHdr { gso_type: 3, gso_size: 100, ..Default::default() }, &p),
            Err(SplitError::Unsupported)
        );
        assert_eq!(
            plan(&VnetHdr { gso_type: GSO_TCPV6, gso_size: 100, ..Default::default() }, &p),
            Err(SplitError::Unsupported)
        );
        // SYN, FIN and RST segments are never coalesced.
        for flags in [0x02, 0x11, 0x14] {
            assert_eq!(flow(&tcp_packet(false, 5, flags, b"x")), None);
        }
        assert_eq!(flow(&tcp_packet(false, 5, 0x10, b"")), None, "a pure ACK");
    }

    fn udp_packet(payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, PROTO_UDP, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        p.extend_from_slice(&[0x9c, 0x40, 0, 7, 0, 0, 0, 0]);
        p.extend_from_slice(payload);
        let len = p.len();
        put16(&mut p, 2, len as u16);
        put16(&mut p, 24, (len - 20) as u16);
        let c = checksum::checksum(&p[..20]);
        put16(&mut p, 10, c);
        l4_checksum(&mut p, false, PROTO_UDP, 20);
        p
    }

    #[test]
    fn headers_alone_finish_as_the_whole_super_packet_does() {
        for v6 in [false, true] {
            let pkts: Vec<Vec<u8>> = (0..3u32)
                .map(|i| tcp_packet(v6, 1000 + i * 100, if i == 2 { 0x18 } else { 0x10 }, &[i as u8; 100]))
                .collect();
            let first = flow(&pkts[0]).expect("a TCP flow");
            let mut whole = pkts[0].clone();
            for p in &pkts[1..] {
                whole.extend_from_slice(&p[first.headers..]);
            }
            let mut head = pkts[0][..first.headers].to_vec();
            let last = pkts[2][first.l4 + tcp::FLAGS];
            let a = finish_coalesced(&mut whole, &first, last);
            let b = finish_headers(&mut head, whole.len(), &first, last);
            assert_eq!(a, b);
            assert_eq!(&head[..], &whole[..first.headers]);
            assert_eq!(head[first.l4 + tcp::FLAGS] & TCP_PSH, TCP_PSH, "PSH from the last segment");
        }
    }

    #[test]
    fn udp_datagrams_of_one_flow_coalesce_and_split_back() {
        let sizes = [64usize, 64, 64, 30];
        let pkts: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, n)| udp_packet(&vec![i as u8; *n])).collect();
        let first = flow(&pkts[0]).expect("a UDP flow");
        let mut out = pkts[0].clone();
        let mut so_far = first.payload();
        for p in &pkts[1..] {
            let f = flow(p).expect("a UDP flow");
            assert!(continues(&pkts[0], &first, so_far, p, &f));
            out.extend_from_slice(&p[first.headers..]);
            so_far += f.payload();
        }
        // A bigger datagram, or another port, does not continue it.
        let big = udp_packet(&[9; 100]);
        assert!(!continues(&pkts[0], &first, so_far, &big, &flow(&big).expect("flow")));
        let hdr = finish_coalesced(&mut out, &first, 0);
        assert_eq!((hdr.gso_type, hdr.gso_size, hdr.csum_offset), (GSO_UDP_L4, 64, 6));
        // Completing the checksum as the kernel would, then cutting it as
        // the kernel would: the datagrams come back.
        let c = checksum::checksum(&out[20..]);
        put16(&mut out, 26, c);
        let s = plan(&hdr, &out).expect("plans");
        assert_eq!(s.segments, 4);
        for (i, want) in pkts.iter().enumerate() {
            let mut seg = vec![0u8; 200];
            let n = write_segment(&hdr, &s, &out, i, &mut seg);
            assert_eq!((&seg[..4], &seg[6..10], &seg[12..n]), (&want[..4], &want[6..10], &want[12..]), "datagram {i}");
        }
    }
}
