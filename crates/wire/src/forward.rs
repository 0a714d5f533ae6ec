//! What a router does to an IP packet it forwards (RFC 1812, RFC 8200):
//! checks the header it relies on, lowers the TTL or hop limit, answers
//! with ICMP when it cannot forward (time exceeded, fragmentation needed,
//! packet too big), and cuts an IPv4 packet that may be fragmented into
//! fragments that fit. Bare IP packets in, bare IP packets out: the link
//! layer is the caller's.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::field::{icmp, ipv4, ipv6};
use crate::packet::{PROTO_ICMP, PROTO_ICMPV6};

/// Why a packet cannot be forwarded as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not IPv4 or IPv6, a header cut short, a length that does not fit
    /// the bytes there, or a wrong IPv4 header checksum.
    Malformed,
    /// The TTL or hop limit ran out here.
    TimeExceeded,
    /// Larger than the link's MTU and may not be fragmented (IPv4 with DF,
    /// or IPv6): the sender is told the MTU.
    TooBig,
}

/// The facts of a forwardable packet's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub v6: bool,
    /// The packet's length by its header (the bytes after it are padding).
    pub len: usize,
    /// IPv4's header length (options included); 40 for IPv6.
    pub header_len: usize,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IPv4's don't-fragment bit (IPv6: always set).
    pub dont_fragment: bool,
    /// The ECN bits of the traffic class.
    pub ecn: u8,
}

/// Reads and checks the header of the packet at the start of `bytes`
/// (which may carry padding after it).
pub fn header(bytes: &[u8]) -> Result<Header, Refusal> {
    match bytes.first().map(|b| b >> 4) {
        Some(4) => {
            let h = bytes.get(..ipv4::MIN_HEADER_LEN).ok_or(Refusal::Malformed)?;
            let header_len = usize::from(h[ipv4::VER_IHL] & 0x0f) * 4;
            let len = usize::from(u16::from_be_bytes([h[ipv4::TOTAL_LEN], h[ipv4::TOTAL_LEN + 1]]));
            if header_len < ipv4::MIN_HEADER_LEN || len < header_len || len > bytes.len() {
                return Err(Refusal::Malformed);
            }
            if checksum::fold(checksum::sum_ne(&bytes[..header_len])) != 0xffff {
                return Err(Refusal::Malformed);
            }
            let four = |at: usize| IpAddr::from([h[at], h[at + 1], h[at + 2], h[at + 3]]);
            Ok(Header {
                v6: false,
                len,
                header_len,
                src: four(ipv4::SRC),
                dst: four(ipv4::DST),
                dont_fragment: h[ipv4::FLAGS_FRAG] & 0x40 != 0,
                ecn: h[1] & 0x03,
            })
        }
        Some(6) => {
            let h = bytes.get(..ipv6::HEADER_LEN).ok_or(Refusal::Malformed)?;
            let payload = usize::from(u16::from_be_bytes([h[ipv6::PAYLOAD_LEN], h[ipv6::PAYLOAD_LEN + 1]]));
            let len = ipv6::HEADER_LEN + payload;
            if len > bytes.len() {
                return Err(Refusal::Malformed);
            }
            let sixteen = |at: usize| {
                let mut a = [0u8; 16];
                a.copy_from_slice(&h[at..at + 16]);
                IpAddr::from(a)
            };
            Ok(Header {
                v6: true,
                len,
                header_len: ipv6::HEADER_LEN,
                src: sixteen(ipv6::SRC),
                dst: sixteen(ipv6::DST),
                dont_fragment: true,
                ecn: (h[1] >> 4) & 0x03,
            })
        }
        _ => Err(Refusal::Malformed),
    }
}

/// Lowers the TTL (IPv4, its checksum updated) or hop limit (IPv6) of the
/// packet `h` describes; refuses one that would leave with none.
pub fn lower_ttl(packet: &mut [u8], h: &Header) -> Result<(), Refusal> {
    let at = if h.v6 { ipv6::HOP_LIMIT } else { ipv4::TTL };
    let ttl = *packet.get(at).ok_or(Refusal::Malformed)?;
    if ttl <= 1 {
        return Err(Refusal::TimeExceeded);
    }
    packet[at] = ttl - 1;
    if !h.v6 {
        // TTL is the high byte of the word it shares with the protocol.
        let old = u16::from_be_bytes([ttl, packet[ipv4::PROTOCOL]]);
        let new = u16::from_be_bytes([ttl - 1, packet[ipv4::PROTOCOL]]);
        let hc = u16::from_be_bytes([packet[ipv4::CHECKSUM], packet[ipv4::CHECKSUM + 1]]);
        packet[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&checksum::update16(hc, old, new).to_be_bytes());
    }
    Ok(())
}

/// Marks congestion experienced on a packet whose sender is ECN-capable,
/// as a tunnel's egress does when the outer packet was marked (RFC 6040).
/// Returns false for a packet that is not ECN-capable (to be dropped).
pub fn mark_congestion(packet: &mut [u8], h: &Header) -> bool {
    if h.ecn == 0 {
        return false;
    }
    if h.v6 {
        packet[1] |= 0x03 << 4;
    } else {
        let old = u16::from_be_bytes([packet[0], packet[1]]);
        packet[1] |= 0x03;
        let new = u16::from_be_bytes([packet[0], packet[1]]);
        let hc = u16::from_be_bytes([packet[ipv4::CHECKSUM], packet[ipv4::CHECKSUM + 1]]);
        packet[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&checksum::update16(hc, old, new).to_be_bytes());
    }
    true
}

/// The largest ICMP error, as RFC 1812 (4.3.2.3) and RFC 4443 (2.4 (c))
/// bound them: as much of the offending packet as fits.
const ICMP4_MAX: usize = 576;
const ICMP6_MAX: usize = 1280;

/// What an ICMP error says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// TTL or hop limit exceeded in transit.
    TimeExceeded,
    /// Fragmentation needed (IPv4) or packet too big (IPv6), with the MTU
    /// the packet must fit.
    TooBig { mtu: u16 },
}

/// The ICMP or ICMPv6 error a router at `from` sends to the source of
/// `offending` (a packet `h` describes), quoting as much of it as the
/// protocol allows. None when `from` is of the other family, or when the
/// offending packet was itself an ICMP error (never answered, RFC 1812
/// 4.3.2.7) or not the first fragment.
pub fn icmp_error(offending: &[u8], h: &Header, from: IpAddr, what: Error) -> Option<Vec<u8>> {
    let offending = &offending[..h.len];
    match (from, h.src) {
        (IpAddr::V4(from), IpAddr::V4(to)) => {
            let fragment = u16::from_be_bytes([offending[ipv4::FLAGS_FRAG], offending[ipv4::FLAGS_FRAG + 1]]) & 0x1fff;
            if fragment != 0 || is_icmp_error(offending, h) {
                return None;
            }
            let (kind, code, rest) = match what {
                Error::TimeExceeded => (11u8, 0u8, 0u32),
                Error::TooBig { mtu } => (3, 4, u32::from(mtu)),
            };
            let quoted = &offending[..offending.len().min(ICMP4_MAX - ipv4::MIN_HEADER_LEN - icmp::HEADER_LEN)];
            let mut m = Vec::with_capacity(icmp::HEADER_LEN + quoted.len());
            m.extend_from_slice(&[kind, code, 0, 0]);
            m.extend_from_slice(&rest.to_be_bytes());
            m.extend_from_slice(quoted);
            let c = checksum::checksum(&m);
            m[icmp::CHECKSUM..icmp::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
            Some(ipv4_packet(from, to, PROTO_ICMP, &m))
        }
        (IpAddr::V6(from), IpAddr::V6(to)) => {
            if is_icmp_error(offending, h) {
                return None;
            }
            let (kind, rest) = match what {
                Error::TimeExceeded => (3u8, 0u32),
                Error::TooBig { mtu } => (2, u32::from(mtu)),
            };
            let quoted = &offending[..offending.len().min(ICMP6_MAX - ipv6::HEADER_LEN - icmp::HEADER_LEN)];
            let mut m = Vec::with_capacity(icmp::HEADER_LEN + quoted.len());
            m.extend_from_slice(&[kind, 0, 0, 0]);
            m.extend_from_slice(&rest.to_be_bytes());
            m.extend_from_slice(quoted);
            let pseudo = checksum::pseudo_v6(from.octets(), to.octets(), PROTO_ICMPV6, m.len() as u32);
            let c = !checksum::fold(checksum::add(pseudo, &m));
            m[icmp::CHECKSUM..icmp::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
            Some(ipv6_packet(from, to, PROTO_ICMPV6, &m))
        }
        _ => None,
    }
}

/// Whether the packet is an ICMP error (which no error answers).
fn is_icmp_error(packet: &[u8], h: &Header) -> bool {
    if h.v6 {
        // Errors are types 0 to 127.
        packet[ipv6::NEXT_HEADER] == PROTO_ICMPV6 && packet.get(h.header_len).is_none_or(|t| *t < 128)
    } else {
        packet[ipv4::PROTOCOL] == PROTO_ICMP
            && packet.get(h.header_len).is_none_or(|t| matches!(t, 3 | 4 | 5 | 11 | 12))
    }
}

fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, payload: &[u8]) -> Vec<u8> {
    let total = (ipv4::MIN_HEADER_LEN + payload.len()) as u16;
    let mut p = Vec::with_capacity(usize::from(total));
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, 0, 64, proto, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let c = checksum::checksum(&p);
    p[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

fn ipv6_packet(src: Ipv6Addr, dst: Ipv6Addr, next: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(ipv6::HEADER_LEN + payload.len());
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    p.extend_from_slice(&[next, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

/// Cuts an IPv4 packet (DF clear, `h` its header) into fragments of at
/// most `mtu` bytes each, in order (RFC 791): every fragment carries the
/// header (options included), the offset and more-fragments bit set as a
/// piece of the original (itself perhaps a fragment). None when the
/// header leaves no room for eight bytes of data.
pub fn fragment_v4(packet: &[u8], h: &Header, mtu: usize) -> Option<Vec<Vec<u8>>> {
    let hl = h.header_len;
    let step = (mtu.checked_sub(hl)? / 8) * 8;
    if h.v6 || step == 0 {
        return None;
    }
    let header = &packet[..hl];
    let data = &packet[hl..h.len];
    let word = u16::from_be_bytes([header[ipv4::FLAGS_FRAG], header[ipv4::FLAGS_FRAG + 1]]);
    let (base, more) = (word & 0x1fff, word & 0x2000 != 0);
    let mut out = Vec::with_capacity(data.len().div_ceil(step));
    for (k, piece) in data.chunks(step).enumerate() {
        let last = (k + 1) * step >= data.len();
        let mut f = Vec::with_capacity(hl + piece.len());
        f.extend_from_slice(header);
        f.extend_from_slice(piece);
        let offset = base + (k * step / 8) as u16;
        let flags = if last && !more { 0 } else { 0x2000 };
        f[ipv4::FLAGS_FRAG..ipv4::FLAGS_FRAG + 2].copy_from_slice(&(offset | flags).to_be_bytes());
        let total = f.len() as u16;
        f[ipv4::TOTAL_LEN..ipv4::TOTAL_LEN + 2].copy_from_slice(&total.to_be_bytes());
        f[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].fill(0);
        let c = checksum::checksum(&f[..hl]);
        f[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
        out.push(f);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::build;

    fn v4(len: usize, df: bool) -> Vec<u8> {
        let mut p = build::ipv4([10, 1, 0, 5], [10, 2, 0, 9], 17, &vec![7u8; len - 20]);
        if !df {
            p[ipv4::FLAGS_FRAG] = 0;
            p[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].fill(0);
            let c = checksum::checksum(&p[..20]);
            p[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
        }
        p
    }

    #[test]
    fn headers_are_checked() {
        let mut p = v4(100, true);
        p.extend_from_slice(&[0; 12]); // padding after the packet
        let h = header(&p).expect("valid");
        assert_eq!((h.len, h.header_len, h.dont_fragment, h.v6), (100, 20, true, false));
        assert_eq!(header(&p[..99]), Err(Refusal::Malformed), "cut short");
        p[ipv4::TTL] ^= 1;
        assert_eq!(header(&p), Err(Refusal::Malformed), "bad checksum");
        assert_eq!(header(&[0x50; 40]), Err(Refusal::Malformed));
        let six = build::ipv6([1; 16], [2; 16], 17, &[0; 30]);
        let h = header(&six).expect("valid");
        assert_eq!((h.len, h.v6), (70, true));
        assert_eq!(header(&six[..69]), Err(Refusal::Malformed));
    }

    #[test]
    fn ttl_goes_down_and_the_checksum_stays_right() {
        let mut p = v4(60, true);
        let h = header(&p).expect("valid");
        lower_ttl(&mut p, &h).expect("64 left");
        assert_eq!(p[ipv4::TTL], 63);
        assert_eq!(checksum::checksum(&p[..20]), 0, "header checksum still holds");
        p[ipv4::TTL] = 1;
        p[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].fill(0);
        let c = checksum::checksum(&p[..20]);
        p[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
        assert_eq!(lower_ttl(&mut p, &h), Err(Refusal::TimeExceeded));
        let mut six = build::ipv6([1; 16], [2; 16], 17, &[0; 30]);
        let h = header(&six).expect("valid");
        lower_ttl(&mut six, &h).expect("64 left");
        assert_eq!(six[ipv6::HOP_LIMIT], 63);
    }

    #[test]
    fn icmp_errors_quote_the_packet_and_check_out() {
        let p = v4(1400, true);
        let h = header(&p).expect("valid");
        let e = icmp_error(&p, &h, IpAddr::from([10, 1, 0, 1]), Error::TooBig { mtu: 1420 }).expect("an error");
        let eh = header(&e).expect("a valid packet");
        assert_eq!((eh.len, eh.src, eh.dst), (576, IpAddr::from([10, 1, 0, 1]), IpAddr::from([10, 1, 0, 5])));
        let m = &e[20..];
        assert_eq!((m[0], m[1], u16::from_be_bytes([m[6], m[7]])), (3, 4, 1420));
        assert_eq!(checksum::checksum(m), 0);
        assert_eq!(&m[8..], &p[..548], "quotes the start of the packet");
        // No error about an error, none across families.
        assert_eq!(icmp_error(&e, &eh, IpAddr::from([10, 2, 0, 1]), Error::TimeExceeded), None);
        assert_eq!(icmp_error(&p, &h, "fd00::1".parse().expect("ip"), Error::TimeExceeded), None);

        let src: Ipv6Addr = "fd00:1::5".parse().expect("ip");
        let six = build::ipv6(src.octets(), [2; 16], 17, &[0; 1400]);
        let h = header(&six).expect("valid");
        let from: Ipv6Addr = "fd00:1::1".parse().expect("ip");
        let e = icmp_error(&six, &h, from.into(), Error::TimeExceeded).expect("an error");
        let eh = header(&e).expect("valid");
        assert_eq!((eh.len, eh.dst), (1280, IpAddr::from(src)));
        let pseudo = checksum::pseudo_v6(from.octets(), src.octets(), PROTO_ICMPV6, 1240);
        assert_eq!(checksum::fold(checksum::add(pseudo, &e[40..])), 0xffff);
        assert_eq!(e[40], 3);
    }

    #[test]
    fn fragments_put_back_together_are_the_packet() {
        let mut p = v4(1500, false);
        for (i, b) in p[20..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let h = header(&p).expect("valid");
        let frags = fragment_v4(&p, &h, 1420).expect("fragments");
        assert_eq!(frags.len(), 2);
        let mut data = Vec::new();
        for (k, f) in frags.iter().enumerate() {
            let fh = header(f).expect("each a valid packet");
            assert!(fh.len <= 1420);
            let word = u16::from_be_bytes([f[6], f[7]]);
            assert_eq!(usize::from(word & 0x1fff) * 8, data.len(), "offset");
            assert_eq!(word & 0x2000 != 0, k == 0, "more fragments on all but the last");
            data.extend_from_slice(&f[20..]);
        }
        assert_eq!(data, &p[20..]);
        assert_eq!(fragment_v4(&p, &h, 27), None, "no room for data");
    }
}
