//! ICMP errors about a session's packets (fragmentation needed or packet
//! too big, unreachable, time exceeded), sent back where the packet came
//! from with addresses, ports and checksums translated.

use std::net::IpAddr;

use gatehouse_config::L4Mode;

use super::family::Family;
use super::forward::Forwarder;
use super::sessions::Sessions;
use super::{Buf, DropReason, Endpoint, Plane, Verdict};
use crate::rewrite;
use crate::session::{Key, REVERSE};
use gatehouse_wire::field::{icmp, ipv4, tcp};
use gatehouse_wire::packet::{self, Ip};

/// An ICMP error about a packet of a session (fragmentation needed /
/// packet too big, unreachable, time exceeded) goes where the packet came
/// from: to the real server when a client's side reports it (the quoted
/// packet went from the VIP to the client), to the client when a real
/// server reports it (NAT and FNAT). In NAT and FNAT the outer and
/// quoted addresses and ports are translated back and the quoted IP
/// header and ICMP checksums recomputed; in DR and tunnel modes the
/// message goes to the real server unchanged (it sent the packet, with
/// the VIP as source, and needs the path MTU).
pub(super) fn error<A: Family>(
    ss: &Sessions,
    fwd: &mut Forwarder,
    plane: &Plane,
    buf: &mut Buf<'_>,
    ip: &Ip,
) -> Verdict {
    let Some(q) = packet::quoted(buf.frame(), ip) else { return Verdict::Pass };
    // Client side: the quoted packet left the VIP toward the client.
    if let Some(&svc) = plane.by_vip.get(&Endpoint::new(q.src, q.sport, q.proto)) {
        let key = Key { addr: A::of(q.dst), port: q.dport, context: svc };
        let Some(idx) = A::table(&ss.tables).find(&key) else { return Verdict::Drop(DropReason::NoSession) };
        let s = *A::table(&ss.tables).get(idx);
        let service = &plane.services[usize::from(svc)];
        let Some(real) = service.reals.get(usize::from(s.real)) else {
            return Verdict::Drop(DropReason::NoSession);
        };
        return match service.mode {
            L4Mode::Nat | L4Mode::Fnat => {
                let local =
                    (service.mode == L4Mode::Fnat).then(|| (plane.local_addrs[usize::from(s.local)], s.local_port));
                // Outer: to the real server (from the local address in FNAT);
                // quoted: as the real server sent it.
                if !icmp_translate(
                    buf.frame_mut(),
                    ip,
                    local.map(|l| l.0),
                    Some(real.addr),
                    Some((real.addr, real.port)),
                    local,
                ) {
                    return Verdict::Drop(DropReason::Unsupported);
                }
                rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
            _ => fwd.toward_real(plane, service, &s, ip, buf),
        };
    }
    // Server side, NAT: the quoted packet went from the client to the real server.
    if let Some(&(svc, real_idx)) = plane.by_real.get(&Endpoint::new(q.dst, q.dport, q.proto)) {
        let key = Key { addr: A::of(q.src), port: q.sport, context: REVERSE | real_idx };
        if A::table(&ss.tables).find(&key).is_some() {
            let service = &plane.services[usize::from(svc)];
            if !icmp_translate(buf.frame_mut(), ip, Some(service.vip), None, None, Some((service.vip, service.port))) {
                return Verdict::Drop(DropReason::Unsupported);
            }
            rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
            return Verdict::Forward;
        }
    }
    // Server side, FNAT: the quoted packet left one of our local addresses.
    if let Some(local) = plane.local_addrs.iter().position(|a| *a == q.src)
        && let Some(idx) = ss.port_owner(local, q.sport)
        && (idx as usize) < A::table(&ss.tables).capacity()
    {
        let s = *A::table(&ss.tables).get(idx);
        let Some(service) = plane.services.get(usize::from(s.service)) else {
            return Verdict::Drop(DropReason::NoSession);
        };
        let client = s.client.ip();
        if !icmp_translate(
            buf.frame_mut(),
            ip,
            Some(service.vip),
            Some(client),
            Some((client, s.client_port)),
            Some((service.vip, service.port)),
        ) {
            return Verdict::Drop(DropReason::Unsupported);
        }
        rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
        return Verdict::Forward;
    }
    Verdict::Pass
}

/// Rewrites an IPv4 ICMP error: the outer source/destination addresses, and
/// the quoted packet's source and destination (address, port); then the
/// checksums of the outer header, the quoted header and the ICMP message.
/// IPv6 messages are left alone (false).
fn icmp_translate(
    frame: &mut [u8],
    ip: &Ip,
    outer_src: Option<IpAddr>,
    outer_dst: Option<IpAddr>,
    inner_src: Option<(IpAddr, u16)>,
    inner_dst: Option<(IpAddr, u16)>,
) -> bool {
    if !ip.flow.src.is_ipv4() {
        return false;
    }
    let v4 = |a: IpAddr| match a {
        IpAddr::V4(a) => Some(a.octets()),
        IpAddr::V6(_) => None,
    };
    let l3 = ip.l3;
    for (at, a) in [(l3 + ipv4::SRC, outer_src), (l3 + ipv4::DST, outer_dst)] {
        if let Some(a) = a {
            let Some(o) = v4(a) else { return false };
            frame[at..at + 4].copy_from_slice(&o);
        }
    }
    if !rewrite::decrement_ttl(frame, ip) {
        return false;
    }
    // A header's checksum, recomputed over `range` with its field at `at`.
    let resum = |frame: &mut [u8], at: usize, range: std::ops::Range<usize>| {
        frame[at..at + 2].copy_from_slice(&[0, 0]);
        let c = gatehouse_wire::checksum::checksum(&frame[range]);
        frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    };
    let ihl = usize::from(frame[l3 + ipv4::VER_IHL] & 0x0f) * 4;
    resum(frame, l3 + ipv4::CHECKSUM, l3..l3 + ihl);
    // The quoted packet: its IP header right after the ICMP header, then at
    // least its ports (the same places in TCP and UDP).
    let q = ip.l4 + icmp::HEADER_LEN;
    let Some(&first) = frame.get(q + ipv4::VER_IHL) else { return false };
    let qihl = usize::from(first & 0x0f) * 4;
    let ports_end = q + qihl + tcp::DST_PORT + 2;
    if qihl < ipv4::MIN_HEADER_LEN || frame.len() < ports_end || ip.end < ports_end {
        return false;
    }
    let quoted =
        [(q + ipv4::SRC, q + qihl + tcp::SRC_PORT, inner_src), (q + ipv4::DST, q + qihl + tcp::DST_PORT, inner_dst)];
    for (at, port_at, change) in quoted {
        if let Some((a, p)) = change {
            let Some(o) = v4(a) else { return false };
            frame[at..at + 4].copy_from_slice(&o);
            frame[port_at..port_at + 2].copy_from_slice(&p.to_be_bytes());
        }
    }
    resum(frame, q + ipv4::CHECKSUM, q..q + qihl);
    resum(frame, ip.l4 + icmp::CHECKSUM, ip.l4..ip.end);
    true
}
