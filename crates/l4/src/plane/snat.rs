//! SNAT's packet path: an inside host's packet to the outside gets its
//! mapping (made for a first SYN or datagram) and leaves from the rule's
//! address and port; a reply to that address and port goes back to the
//! inside host. The rules and the mappings' keys are in `snat_rules`.

use super::family::Family;
use super::sessions::Sessions;
use super::snat_rules::{RULE_MASK, SNAT_TCP};
use super::{Buf, DropReason, Plane, Verdict};
use crate::rewrite;
use gatehouse_wire::packet::{Ip, PROTO_TCP, TCP_ACK, TCP_RST, TCP_SYN};

/// A packet from an inside host of `rule` to the outside: its mapping
/// (made for a first SYN or datagram), then its source rewritten.
pub(super) fn out<A: Family>(
    ss: &mut Sessions,
    plane: &Plane,
    rule: u16,
    buf: &mut Buf<'_>,
    ip: &Ip,
    hit: Option<u32>,
    now: u32,
) -> Verdict {
    let tcp = ip.flow.proto == PROTO_TCP;
    let idx = match hit {
        Some(i) => i,
        None => {
            if tcp && ip.tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST) != TCP_SYN {
                return Verdict::Drop(DropReason::NoSession);
            }
            match ss.snat_map::<A>(plane, rule, ip, now) {
                Ok(i) => i,
                Err(d) => return Verdict::Drop(d),
            }
        }
    };
    ss.track::<A>(plane, idx, ip, now);
    let s = *A::table(&ss.tables).get(idx);
    let Some(&out) = plane.local_addrs.get(usize::from(s.local)) else {
        return Verdict::Drop(DropReason::NoSession);
    };
    if out.is_ipv4() != ip.flow.src.is_ipv4() {
        return Verdict::Drop(DropReason::Unsupported);
    }
    if !rewrite::nat(buf.frame_mut(), ip, Some((out, s.local_port)), None) {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
    let c = ss.counters.snat_mut(rule);
    c.packets_out += 1;
    Verdict::Forward
}

/// A reply from the outside to an SNAT address and port: back to the
/// inside host.
pub(super) fn back<A: Family>(
    ss: &mut Sessions,
    plane: &Plane,
    idx: u32,
    buf: &mut Buf<'_>,
    ip: &Ip,
    now: u32,
) -> Verdict {
    let s = *A::table(&ss.tables).get(idx);
    if (ip.flow.proto == PROTO_TCP) != (s.service & SNAT_TCP != 0) {
        return Verdict::Drop(DropReason::NoSession);
    }
    ss.track::<A>(plane, idx, ip, now);
    let inside = s.client.ip();
    if inside.is_ipv4() != ip.flow.dst.is_ipv4() {
        return Verdict::Drop(DropReason::Unsupported);
    }
    if !rewrite::nat(buf.frame_mut(), ip, None, Some((inside, s.client_port))) {
        return Verdict::Drop(DropReason::TtlExceeded);
    }
    rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
    ss.counters.snat_mut(s.service & RULE_MASK).packets_in += 1;
    Verdict::Forward
}
