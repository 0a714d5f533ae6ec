//! Zero-copy views of a frame: Ethernet (with one optional 802.1Q tag), ARP,
//! IPv4, IPv6 (with its extension headers), TCP, UDP, ICMP and ICMPv6.
//!
//! [`parse`] reads a frame once, checks every length and checksum it relies
//! on, and returns what the pipeline needs (offsets, addresses, ports, TCP
//! flags, the flow an ICMP error is about) or the reason the frame must be
//! dropped. It never panics and never reads past the frame: every access goes
//! through a bounds-checked slice.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::field::{arp, ethernet, icmp, ipv4, ipv6, tcp, udp};

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const ETHERTYPE_VLAN: u16 = 0x8100;
pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
/// ECN echo and congestion window reduced (RFC 3168).
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;

/// Why a frame is dropped (each counted separately by the plane).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Malformed {
    /// A header does not fit in the frame.
    Truncated,
    /// IPv4 version field not 4 (or IPv6 not 6) for its ethertype.
    BadVersion,
    /// IPv4 header length below 20 bytes or beyond the packet.
    BadHeaderLength,
    /// The IP length field disagrees with the frame.
    BadTotalLength,
    BadIpChecksum,
    /// A fragment: the plane does not reassemble.
    Fragment,
    /// TCP data offset below 5 words or beyond the segment.
    BadTcpHeader,
    /// Flag combinations no real stack sends (SYN+FIN, SYN+RST, none at all,
    /// FIN/PSH/URG without ACK).
    BadTcpFlags,
    /// UDP length field disagrees with the IP payload.
    BadUdpLength,
    /// TCP, UDP or ICMP checksum wrong.
    BadL4Checksum,
    /// IPv6 extension headers too long, or a chain this plane does not follow.
    BadExtensionHeader,
    /// An ARP packet that is not Ethernet/IPv4.
    BadArp,
}

impl Malformed {
    pub const ALL: [Malformed; 12] = [
        Malformed::Truncated,
        Malformed::BadVersion,
        Malformed::BadHeaderLength,
        Malformed::BadTotalLength,
        Malformed::BadIpChecksum,
        Malformed::Fragment,
        Malformed::BadTcpHeader,
        Malformed::BadTcpFlags,
        Malformed::BadUdpLength,
        Malformed::BadL4Checksum,
        Malformed::BadExtensionHeader,
        Malformed::BadArp,
    ];

    /// A stable short name, for counters and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Malformed::Truncated => "truncated",
            Malformed::BadVersion => "bad_version",
            Malformed::BadHeaderLength => "bad_header_length",
            Malformed::BadTotalLength => "bad_total_length",
            Malformed::BadIpChecksum => "bad_ip_checksum",
            Malformed::Fragment => "fragment",
            Malformed::BadTcpHeader => "bad_tcp_header",
            Malformed::BadTcpFlags => "bad_tcp_flags",
            Malformed::BadUdpLength => "bad_udp_length",
            Malformed::BadL4Checksum => "bad_l4_checksum",
            Malformed::BadExtensionHeader => "bad_extension_header",
            Malformed::BadArp => "bad_arp",
        }
    }
}

/// The flow a transport header or an ICMP error's quoted packet names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Flow {
    pub proto: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub sport: u16,
    pub dport: u16,
}

/// An ICMP message: its type and code, and for errors (destination
/// unreachable, fragmentation needed / packet too big, time exceeded,
/// parameter problem) the flow of the packet it quotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Icmp {
    pub kind: u8,
    pub code: u8,
    /// Echo identifier (requests and replies), which NAT treats as a port.
    pub ident: u16,
    /// An error whose quoted packet names a flow ([`quoted`] reads it).
    pub quoted: bool,
}

/// What the pipeline needs from an IP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ip {
    /// Offset of the IP header in the frame.
    pub l3: usize,
    /// Offset of the transport header.
    pub l4: usize,
    /// End of the IP packet (frames may carry padding after it).
    pub end: usize,
    pub ttl: u8,
    pub flow: Flow,
    /// TCP flags (0 for other protocols).
    pub tcp_flags: u8,
    pub icmp: Option<Icmp>,
}

impl Ip {
    /// A record to parse into.
    pub const EMPTY: Ip = Ip {
        l3: 0,
        l4: 0,
        end: 0,
        ttl: 0,
        flow: Flow {
            proto: 0,
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            sport: 0,
            dport: 0,
        },
        tcp_flags: 0,
        icmp: None,
    };
}

/// An ARP request or reply (Ethernet, IPv4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    pub op: u16,
    pub sender_mac: [u8; 6],
    pub sender_ip: Ipv4Addr,
    pub target_mac: [u8; 6],
    pub target_ip: Ipv4Addr,
}

/// A parsed frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    Ip(Ip),
    Arp(Arp),
    /// Another ethertype, or an IP protocol the plane does not handle: not
    /// malformed, just not ours (the XDP program passes such frames to the
    /// kernel).
    Other,
}

/// What [`parse_into`] found; an IP packet's details went into the record
/// it was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parsed {
    Ip,
    Arp(Arp),
    /// As [`Frame::Other`].
    Other,
}

/// Whether checksums of transport headers are verified (IPv4 header
/// checksums always are). A NIC that verified them already lets the plane
/// skip the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checks {
    pub l4_checksums: bool,
}

impl Default for Checks {
    fn default() -> Self {
        Checks { l4_checksums: true }
    }
}

fn be16(b: &[u8], at: usize) -> Result<u16, Malformed> {
    match b.get(at..at + 2) {
        Some(&[x, y]) => Ok(u16::from_be_bytes([x, y])),
        _ => Err(Malformed::Truncated),
    }
}

fn bytes<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], Malformed> {
    b.get(at..at + N).and_then(|s| <[u8; N]>::try_from(s).ok()).ok_or(Malformed::Truncated)
}

fn byte(b: &[u8], at: usize) -> Result<u8, Malformed> {
    b.get(at).copied().ok_or(Malformed::Truncated)
}

/// The destination MAC, source MAC and the ethertype after an optional
/// 802.1Q tag; and where the payload starts.
pub fn ethernet(frame: &[u8]) -> Result<([u8; 6], [u8; 6], u16, usize), Malformed> {
    let dst = bytes::<6>(frame, ethernet::DST)?;
    let src = bytes::<6>(frame, ethernet::SRC)?;
    let (ethertype, off) = ethertype(frame)?;
    Ok((dst, src, ethertype, off))
}

/// The ethertype after an optional 802.1Q tag, and where the payload starts.
#[inline(always)]
fn ethertype(frame: &[u8]) -> Result<(u16, usize), Malformed> {
    let ethertype = be16(frame, ethernet::ETHERTYPE)?;
    if ethertype == ETHERTYPE_VLAN {
        let inner = be16(frame, ethernet::ETHERTYPE + ethernet::VLAN_TAG_LEN)?;
        return Ok((inner, ethernet::HEADER_LEN + ethernet::VLAN_TAG_LEN));
    }
    Ok((ethertype, ethernet::HEADER_LEN))
}

/// Parses a frame.
pub fn parse(frame: &[u8], checks: Checks) -> Result<Frame, Malformed> {
    let mut ip = Ip::EMPTY;
    Ok(match parse_into(frame, checks, &mut ip)? {
        Parsed::Ip => Frame::Ip(ip),
        Parsed::Arp(arp) => Frame::Arp(arp),
        Parsed::Other => Frame::Other,
    })
}

/// Parses a frame, an IP packet's details straight into `ip` (the data
/// plane's per-packet record, which is then never copied); `ip` holds
/// nothing meaningful unless the answer is [`Parsed::Ip`].
#[inline]
pub fn parse_into(frame: &[u8], checks: Checks, ip: &mut Ip) -> Result<Parsed, Malformed> {
    let (ethertype, off) = ethertype(frame)?;
    let handled = match ethertype {
        ETHERTYPE_IPV4 => ipv4(frame, off, checks, false, ip)?,
        ETHERTYPE_IPV6 => ipv6(frame, off, checks, false, ip)?,
        ETHERTYPE_ARP => return arp(frame, off).map(Parsed::Arp),
        _ => false,
    };
    Ok(if handled { Parsed::Ip } else { Parsed::Other })
}

fn arp(frame: &[u8], off: usize) -> Result<Arp, Malformed> {
    let b = frame.get(off..).ok_or(Malformed::Truncated)?;
    if b.len() < arp::LEN {
        return Err(Malformed::Truncated);
    }
    // Ethernet (1), IPv4 (0x0800), 6-byte and 4-byte addresses.
    if be16(b, arp::HW_TYPE)? != 1
        || be16(b, arp::PROTO_TYPE)? != ETHERTYPE_IPV4
        || b[arp::HW_LEN] != 6
        || b[arp::PROTO_LEN] != 4
    {
        return Err(Malformed::BadArp);
    }
    Ok(Arp {
        op: be16(b, arp::OPER)?,
        sender_mac: bytes(b, arp::SENDER_MAC)?,
        sender_ip: Ipv4Addr::from(bytes::<4>(b, arp::SENDER_IP)?),
        target_mac: bytes(b, arp::TARGET_MAC)?,
        target_ip: Ipv4Addr::from(bytes::<4>(b, arp::TARGET_IP)?),
    })
}

/// The flow of the packet the ICMP error `ip` (parsed from `frame`)
/// quotes. Kept out of [`Ip`], whose copies every packet pays for; read
/// again only for the few errors.
pub fn quoted(frame: &[u8], ip: &Ip) -> Option<Flow> {
    let end = frame.get(..ip.end)?;
    ip.icmp.filter(|i| i.quoted)?;
    quoted_flow(end, ip.l4 + icmp::HEADER_LEN, ip.flow.proto)
}

/// The flow of the packet an ICMP error quotes at `inner` (its IP header
/// and at least 8 bytes). Out of line: it would make the parsers recursive.
#[inline(never)]
fn quoted_flow(frame: &[u8], inner: usize, proto: u8) -> Option<Flow> {
    let checks = Checks { l4_checksums: false };
    let mut q = Ip::EMPTY;
    let parsed = if proto == PROTO_ICMP {
        ipv4(frame, inner, checks, true, &mut q)
    } else {
        ipv6(frame, inner, checks, true, &mut q)
    };
    parsed.ok().filter(|&handled| handled).map(|_| q.flow)
}

/// An IPv4 packet at `off`. `quoted`: inside an ICMP error, where the packet
/// is cut short after its first transport bytes and its lengths describe the
/// original, so only what is present is checked. `Ok(false)`: a protocol
/// the plane does not handle. What it finds goes into `ip`.
#[inline(always)]
fn ipv4(frame: &[u8], off: usize, checks: Checks, quoted: bool, ip: &mut Ip) -> Result<bool, Malformed> {
    let b = frame.get(off..).ok_or(Malformed::Truncated)?;
    let first = byte(b, ipv4::VER_IHL)?;
    if first >> 4 != 4 {
        return Err(Malformed::BadVersion);
    }
    let ihl = usize::from(first & 0x0f) * 4;
    if ihl < ipv4::MIN_HEADER_LEN {
        return Err(Malformed::BadHeaderLength);
    }
    if b.len() < ihl {
        return Err(if b.len() < ipv4::MIN_HEADER_LEN { Malformed::Truncated } else { Malformed::BadHeaderLength });
    }
    let total = usize::from(be16(b, ipv4::TOTAL_LEN)?);
    let end = if quoted {
        b.len()
    } else {
        if total < ihl || total > b.len() {
            return Err(Malformed::BadTotalLength);
        }
        // Twenty bytes without options: a sum the compiler unrolls.
        let sum = match b.first_chunk::<{ ipv4::MIN_HEADER_LEN }>() {
            Some(h) if ihl == ipv4::MIN_HEADER_LEN => checksum::sum_ne(h),
            _ => checksum::sum_ne(&b[..ihl]),
        };
        if checksum::fold(sum) != 0xffff {
            return Err(Malformed::BadIpChecksum);
        }
        total
    };
    let frag = be16(b, ipv4::FLAGS_FRAG)?;
    // More fragments, or a non-zero offset: a fragment.
    if frag & 0x3fff != 0 {
        return Err(Malformed::Fragment);
    }
    let src = Ipv4Addr::from(bytes::<4>(b, ipv4::SRC)?);
    let dst = Ipv4Addr::from(bytes::<4>(b, ipv4::DST)?);
    let proto = b[ipv4::PROTOCOL];
    let pseudo = checksum::sum_ne(&src.octets()) + checksum::sum_ne(&dst.octets());
    transport(
        frame,
        off,
        off + ihl,
        off + end,
        b[ipv4::TTL],
        proto,
        IpAddr::V4(src),
        IpAddr::V4(dst),
        checks,
        quoted,
        pseudo,
        ip,
    )
}

/// IPv6 extension headers followed to the transport header.
const EXT_HOP_BY_HOP: u8 = 0;
const EXT_ROUTING: u8 = 43;
const EXT_FRAGMENT: u8 = 44;
const EXT_DEST_OPTS: u8 = 60;
/// More than this many extension headers is treated as hostile.
const MAX_EXTENSIONS: usize = 8;

#[inline(never)]
fn ipv6(frame: &[u8], off: usize, checks: Checks, quoted: bool, ip: &mut Ip) -> Result<bool, Malformed> {
    let b = frame.get(off..).ok_or(Malformed::Truncated)?;
    if b.len() < ipv6::HEADER_LEN {
        return Err(Malformed::Truncated);
    }
    if b[ipv6::VER_TC_FLOW] >> 4 != 6 {
        return Err(Malformed::BadVersion);
    }
    let payload = usize::from(be16(b, ipv6::PAYLOAD_LEN)?);
    let end = if quoted {
        b.len()
    } else {
        if ipv6::HEADER_LEN + payload > b.len() {
            return Err(Malformed::BadTotalLength);
        }
        ipv6::HEADER_LEN + payload
    };
    let src = Ipv6Addr::from(bytes::<16>(b, ipv6::SRC)?);
    let dst = Ipv6Addr::from(bytes::<16>(b, ipv6::DST)?);
    let mut next = b[ipv6::NEXT_HEADER];
    let mut at = ipv6::HEADER_LEN;
    for _ in 0..=MAX_EXTENSIONS {
        match next {
            EXT_HOP_BY_HOP | EXT_ROUTING | EXT_DEST_OPTS => {
                let len = (usize::from(byte(b, at + ipv6::ext::LEN)?) + 1) * 8;
                if at + len > end {
                    return Err(Malformed::BadExtensionHeader);
                }
                next = b[at + ipv6::ext::NEXT_HEADER];
                at += len;
            }
            EXT_FRAGMENT => return Err(Malformed::Fragment),
            _ => {
                let pseudo = checksum::sum_ne(&src.octets()) + checksum::sum_ne(&dst.octets());
                return transport(
                    frame,
                    off,
                    off + at,
                    off + end,
                    b[ipv6::HOP_LIMIT],
                    next,
                    IpAddr::V6(src),
                    IpAddr::V6(dst),
                    checks,
                    quoted,
                    pseudo,
                    ip,
                );
            }
        }
    }
    Err(Malformed::BadExtensionHeader)
}

/// The transport header at `l4` of an IP packet ending at `end`; `pseudo`
/// is the pseudo-header's addresses summed in memory order
/// ([`checksum::sum_ne`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn transport(
    frame: &[u8],
    l3: usize,
    l4: usize,
    end: usize,
    ttl: u8,
    proto: u8,
    src: IpAddr,
    dst: IpAddr,
    checks: Checks,
    quoted: bool,
    pseudo: u64,
    ip: &mut Ip,
) -> Result<bool, Malformed> {
    let seg = frame.get(l4..end).ok_or(Malformed::Truncated)?;
    let verify = checks.l4_checksums && !quoted;
    let sum_ok = |with_pseudo: bool| {
        // All in memory order: a valid sum folds to 0xffff either way.
        let head = if with_pseudo { pseudo + checksum::pseudo_tail_ne(proto, seg.len() as u32) } else { 0 };
        checksum::fold(head + checksum::sum_ne(seg)) == 0xffff
    };
    *ip = Ip { l3, l4, end, ttl, flow: Flow { proto, src, dst, sport: 0, dport: 0 }, tcp_flags: 0, icmp: None };
    match proto {
        PROTO_TCP => {
            ip.flow.sport = be16(seg, tcp::SRC_PORT)?;
            ip.flow.dport = be16(seg, tcp::DST_PORT)?;
            if quoted {
                return Ok(true);
            }
            let doff = usize::from(byte(seg, tcp::DATA_OFF)? >> 4) * 4;
            if doff < tcp::MIN_HEADER_LEN || doff > seg.len() {
                let short = seg.len() < tcp::MIN_HEADER_LEN;
                return Err(if short { Malformed::Truncated } else { Malformed::BadTcpHeader });
            }
            let flags = seg[tcp::FLAGS] & 0x3f;
            let bad = flags & (TCP_SYN | TCP_FIN) == (TCP_SYN | TCP_FIN)
                || flags & (TCP_SYN | TCP_RST) == (TCP_SYN | TCP_RST)
                || flags == 0
                || (flags & (TCP_FIN | TCP_PSH | TCP_URG) != 0 && flags & TCP_ACK == 0);
            if bad {
                return Err(Malformed::BadTcpFlags);
            }
            if verify && !sum_ok(true) {
                return Err(Malformed::BadL4Checksum);
            }
            ip.tcp_flags = flags;
        }
        PROTO_UDP => {
            ip.flow.sport = be16(seg, udp::SRC_PORT)?;
            ip.flow.dport = be16(seg, udp::DST_PORT)?;
            if quoted {
                return Ok(true);
            }
            let len = usize::from(be16(seg, udp::LENGTH)?);
            if len < udp::HEADER_LEN || len != seg.len() {
                return Err(Malformed::BadUdpLength);
            }
            // Zero means "no checksum" over IPv4; IPv6 requires one.
            let sum = be16(seg, udp::CHECKSUM)?;
            let optional = src.is_ipv4() && sum == 0;
            if verify && !optional && !sum_ok(true) {
                return Err(Malformed::BadL4Checksum);
            }
        }
        PROTO_ICMP | PROTO_ICMPV6 => {
            if proto == PROTO_ICMP && src.is_ipv6() || proto == PROTO_ICMPV6 && src.is_ipv4() {
                return Ok(false);
            }
            let kind = byte(seg, icmp::TYPE)?;
            let code = byte(seg, icmp::CODE)?;
            if quoted {
                return Ok(true);
            }
            if seg.len() < icmp::HEADER_LEN {
                return Err(Malformed::Truncated);
            }
            // ICMPv4 sums the message alone; ICMPv6 adds the pseudo-header.
            if verify && !sum_ok(proto == PROTO_ICMPV6) {
                return Err(Malformed::BadL4Checksum);
            }
            let is_error = if proto == PROTO_ICMP { matches!(kind, 3 | 11 | 12) } else { (1..=4).contains(&kind) };
            let is_echo = if proto == PROTO_ICMP { matches!(kind, 0 | 8) } else { matches!(kind, 128 | 129) };
            let quoted = is_error && quoted_flow(&frame[..end], l4 + icmp::HEADER_LEN, proto).is_some();
            let ident = if is_echo { be16(seg, icmp::IDENT)? } else { 0 };
            ip.icmp = Some(Icmp { kind, code, ident, quoted });
            if is_echo {
                ip.flow.sport = ident;
                ip.flow.dport = ident;
            }
        }
        _ => return Ok(false),
    }
    Ok(true)
}

pub mod build {
    //! Frames with correct checksums, built by hand: for the tests, the
    //! generators of `gatehouse bench l4` and `l4-wire`, and the resets the
    //! plane answers with (rare enough to allocate).
    use super::*;

    pub fn eth(ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    pub fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
        let total = (20 + l4.len()) as u16;
        let mut h = vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, proto, 0, 0];
        h[ipv4::TOTAL_LEN..][..2].copy_from_slice(&total.to_be_bytes());
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        let c = checksum::checksum(&h);
        h[ipv4::CHECKSUM..][..2].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(l4);
        h
    }

    pub fn ipv6(src: [u8; 16], dst: [u8; 16], next: u8, payload: &[u8]) -> Vec<u8> {
        let mut h = vec![0x60, 0, 0, 0];
        h.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        h.push(next);
        h.push(64);
        h.extend_from_slice(&src);
        h.extend_from_slice(&dst);
        h.extend_from_slice(payload);
        h
    }

    /// A TCP segment with its checksum for the given pseudo-header sum
    /// (sequence number 1, window 65535).
    pub fn tcp(sport: u16, dport: u16, flags: u8, data: &[u8], pseudo: impl Fn(usize) -> u64) -> Vec<u8> {
        tcp_segment(sport, dport, 1, 0, flags, 0xffff, data, pseudo)
    }

    /// A TCP segment with the given sequence and acknowledgment numbers and
    /// window.
    #[allow(clippy::too_many_arguments)]
    pub fn tcp_segment(
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        flags: u8,
        window: u16,
        data: &[u8],
        pseudo: impl Fn(usize) -> u64,
    ) -> Vec<u8> {
        let mut s = Vec::new();
        s.extend_from_slice(&sport.to_be_bytes());
        s.extend_from_slice(&dport.to_be_bytes());
        s.extend_from_slice(&seq.to_be_bytes());
        s.extend_from_slice(&ack.to_be_bytes());
        s.push(5 << 4);
        s.push(flags);
        s.extend_from_slice(&window.to_be_bytes());
        s.extend_from_slice(&[0, 0, 0, 0]);
        s.extend_from_slice(data);
        let c = !checksum::fold(checksum::add(pseudo(s.len()), &s));
        s[tcp::CHECKSUM..][..2].copy_from_slice(&c.to_be_bytes());
        s
    }

    pub fn udp(sport: u16, dport: u16, data: &[u8], pseudo: impl Fn(usize) -> u64) -> Vec<u8> {
        let mut s = Vec::new();
        s.extend_from_slice(&sport.to_be_bytes());
        s.extend_from_slice(&dport.to_be_bytes());
        s.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
        s.extend_from_slice(&[0, 0]);
        s.extend_from_slice(data);
        let c = !checksum::fold(checksum::add(pseudo(s.len()), &s));
        s[udp::CHECKSUM..][..2].copy_from_slice(&c.to_be_bytes());
        s
    }

    pub const C4: [u8; 4] = [10, 0, 0, 1];
    pub const V4: [u8; 4] = [10, 0, 0, 100];

    pub fn tcp4(flags: u8, data: &[u8]) -> Vec<u8> {
        let seg = tcp(40000, 80, flags, data, |len| checksum::pseudo_v4(C4, V4, PROTO_TCP, len as u16));
        eth(ETHERTYPE_IPV4, &ipv4(C4, V4, PROTO_TCP, &seg))
    }

    pub fn udp4(data: &[u8]) -> Vec<u8> {
        let seg = udp(5353, 53, data, |len| checksum::pseudo_v4(C4, V4, PROTO_UDP, len as u16));
        eth(ETHERTYPE_IPV4, &ipv4(C4, V4, PROTO_UDP, &seg))
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    const ALL: Checks = Checks { l4_checksums: true };

    fn ip(frame: &[u8]) -> Ip {
        match parse(frame, ALL) {
            Ok(Frame::Ip(ip)) => ip,
            other => panic!("not an IP packet: {other:?}"),
        }
    }

    #[test]
    fn tcp_and_udp_over_ipv4() {
        let f = tcp4(TCP_SYN, b"");
        let p = ip(&f);
        assert_eq!((p.l3, p.l4, p.end), (14, 34, 54));
        assert_eq!(
            p.flow,
            Flow { proto: PROTO_TCP, src: IpAddr::from(C4), dst: IpAddr::from(V4), sport: 40000, dport: 80 }
        );
        assert_eq!(p.tcp_flags, TCP_SYN);
        let f = udp4(b"hello");
        let p = ip(&f);
        assert_eq!((p.flow.proto, p.flow.sport, p.flow.dport), (PROTO_UDP, 5353, 53));
        // Ethernet padding after the IP packet is not part of it.
        let mut padded = tcp4(TCP_ACK, b"");
        padded.extend_from_slice(&[0; 6]);
        assert_eq!(ip(&padded).end, 54);
    }

    #[test]
    fn tcp_over_ipv6_with_an_extension_header() {
        let (s, d) = (
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        );
        let seg = build::tcp(1234, 443, TCP_SYN, b"", |len| checksum::pseudo_v6(s, d, PROTO_TCP, len as u32));
        // A destination-options header (8 bytes) before TCP.
        let mut payload = vec![PROTO_TCP, 0, 1, 4, 0, 0, 0, 0];
        payload.extend_from_slice(&seg);
        let f = eth(ETHERTYPE_IPV6, &build::ipv6(s, d, EXT_DEST_OPTS, &payload));
        let p = ip(&f);
        assert_eq!(p.l4, 14 + 40 + 8);
        assert_eq!((p.flow.sport, p.flow.dport), (1234, 443));
        assert_eq!(p.flow.dst, IpAddr::from(d));
    }

    #[test]
    fn arp_and_other_ethertypes() {
        let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1];
        a.extend_from_slice(&[2, 0, 0, 0, 0, 9]);
        a.extend_from_slice(&[10, 0, 0, 1]);
        a.extend_from_slice(&[0; 6]);
        a.extend_from_slice(&[10, 0, 0, 100]);
        let f = eth(ETHERTYPE_ARP, &a);
        match parse(&f, ALL) {
            Ok(Frame::Arp(arp)) => {
                assert_eq!(arp.op, 1);
                assert_eq!(arp.target_ip, Ipv4Addr::new(10, 0, 0, 100));
                assert_eq!(arp.sender_mac, [2, 0, 0, 0, 0, 9]);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse(&eth(0x88cc, &[0; 40]), ALL), Ok(Frame::Other));
        // A VLAN tag is skipped.
        let inner = tcp4(TCP_SYN, b"");
        let mut tagged = inner[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        tagged.extend_from_slice(&inner[12..]);
        assert_eq!(ip(&tagged).l3, 18);
    }

    #[test]
    fn malformed_frames_are_named() {
        let good = tcp4(TCP_SYN, b"");
        let case = |f: &[u8]| parse(f, ALL).err();
        assert_eq!(case(&good[..20]), Some(Malformed::Truncated));
        let mut v = good.clone();
        v[14] = 0x65;
        assert_eq!(case(&v), Some(Malformed::BadVersion));
        let mut v = good.clone();
        v[14] = 0x44;
        assert_eq!(case(&v), Some(Malformed::BadHeaderLength));
        let mut v = good.clone();
        v[17] = 200; // total length beyond the frame
        assert_eq!(case(&v), Some(Malformed::BadTotalLength));
        let mut v = good.clone();
        v[22] = 63; // TTL changed, header checksum not
        assert_eq!(case(&v), Some(Malformed::BadIpChecksum));
        let mut v = good.clone();
        v[47] ^= 0x01; // SYN+FIN (the checksum no longer matters: flags are checked first)
        assert_eq!(case(&v), Some(Malformed::BadTcpFlags));
        let mut v = good.clone();
        v[46] = 0x40; // data offset 16 bytes
        assert_eq!(case(&v), Some(Malformed::BadTcpHeader));
        let mut v = good.clone();
        v[53] ^= 0xff; // urgent pointer: the checksum breaks
        assert_eq!(case(&v), Some(Malformed::BadL4Checksum));
        assert_eq!(parse(&v, Checks { l4_checksums: false }).map(|_| ()), Ok(()));
        let mut v = udp4(b"hello");
        v[38..40].copy_from_slice(&20u16.to_be_bytes());
        assert_eq!(case(&v), Some(Malformed::BadUdpLength));
        for (flags, frag) in [(0x20u8, 0u8), (0x00, 0x10)] {
            // More fragments, or an offset: dropped as a fragment. (Fix the
            // header checksum so the fragment test is what fails.)
            let mut v = good.clone();
            v[20] = flags;
            v[21] = frag;
            v[24] = 0;
            v[25] = 0;
            let c = checksum::checksum(&v[14..34]);
            v[24..26].copy_from_slice(&c.to_be_bytes());
            assert_eq!(case(&v), Some(Malformed::Fragment));
        }
    }

    #[test]
    fn an_icmp_error_names_the_flow_it_quotes() {
        // Fragmentation needed, quoting the start of a packet the VIP sent back.
        let inner = build::ipv4(V4, C4, PROTO_TCP, &[0, 80, 0x9c, 0x40, 0, 0, 0, 1]);
        let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc];
        icmp.extend_from_slice(&inner);
        let c = checksum::checksum(&icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        let f = eth(ETHERTYPE_IPV4, &build::ipv4([192, 0, 2, 1], V4, PROTO_ICMP, &icmp));
        let p = ip(&f);
        let i = p.icmp.expect("icmp");
        assert_eq!((i.kind, i.code), (3, 4));
        assert!(i.quoted);
        assert_eq!(
            quoted(&f, &p),
            Some(Flow { proto: PROTO_TCP, src: IpAddr::from(V4), dst: IpAddr::from(C4), sport: 80, dport: 40000 })
        );
    }

    #[test]
    fn only_an_icmp_error_quotes_a_flow() {
        let t = tcp4(TCP_ACK, b"x");
        assert_eq!(quoted(&t, &ip(&t)), None);
        // An echo request (type 8) is ICMP but quotes nothing.
        let mut echo = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
        let c = checksum::checksum(&echo);
        echo[2..4].copy_from_slice(&c.to_be_bytes());
        let f = eth(ETHERTYPE_IPV4, &build::ipv4(C4, V4, PROTO_ICMP, &echo));
        let p = ip(&f);
        assert_eq!(p.icmp.map(|i| (i.kind, i.quoted)), Some((8, false)));
        assert_eq!(quoted(&f, &p), None);
    }

    #[test]
    fn parse_into_fills_the_record_parse_returns() {
        for f in [tcp4(TCP_SYN, b""), udp4(b"dgram")] {
            let mut into = Ip::EMPTY;
            assert_eq!(parse_into(&f, ALL, &mut into), Ok(Parsed::Ip));
            assert_eq!(into, ip(&f));
        }
        let mut into = Ip::EMPTY;
        assert_eq!(parse_into(&eth(0x88cc, &[0; 40]), ALL, &mut into), Ok(Parsed::Other));
    }

    #[test]
    fn random_mutations_never_panic_and_keep_offsets_consistent() {
        // Byte flips and truncations of valid frames: parse must return, and
        // a frame it accepts must still have consistent offsets.
        let seeds = [tcp4(TCP_SYN, b""), tcp4(TCP_ACK | TCP_PSH, b"GET / HTTP/1.1\r\n\r\n"), udp4(b"dns?")];
        let mut rng = fastrand::Rng::with_seed(42);
        for _ in 0..200_000 {
            let mut f = seeds[rng.usize(..seeds.len())].clone();
            for _ in 0..rng.usize(1..4) {
                let at = rng.usize(..f.len());
                f[at] = rng.u8(..);
            }
            if rng.bool() {
                f.truncate(rng.usize(..=f.len()));
            }
            if let Ok(Frame::Ip(p)) = parse(&f, ALL) {
                assert!(p.l3 < p.l4 && p.l4 <= p.end && p.end <= f.len());
            }
        }
    }
}
