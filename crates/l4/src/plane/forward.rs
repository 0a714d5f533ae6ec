//! Sending a client's packet on to its real server, by the service's
//! forwarding mode: NAT and FNAT rewrite addresses and ports, DR changes
//! only the MAC (the next hop is the real server), IPIP and GUE wrap the
//! packet in a tunnel header.

use std::net::IpAddr;

use gatehouse_config::L4Mode;

use super::family::Family;
use super::{Buf, DropReason, Plane, Service, Verdict};
use crate::encap::{Outer, Tunnel, encapsulate};
use crate::rewrite;
use crate::session::Session;
use gatehouse_wire::packet::Ip;

/// What forwarding a packet needs beyond the packet: room to build a
/// tunnelled frame, and the next hop of the last packet sent (DR).
pub(super) struct Forwarder {
    scratch: Vec<u8>,
    /// The neighbour the last forwarded frame must go to when it is not
    /// its (outer) destination address: the real server in DR mode.
    pub(super) hop: Option<IpAddr>,
}

impl Forwarder {
    pub(super) fn new() -> Forwarder {
        Forwarder { scratch: Vec::with_capacity(2048), hop: None }
    }

    /// Rewrites a client's packet toward its real server.
    pub(super) fn toward_real<A: Family>(
        &mut self,
        plane: &Plane,
        service: &Service,
        s: &Session<A>,
        ip: &Ip,
        buf: &mut Buf<'_>,
    ) -> Verdict {
        let Some(real) = service.reals.get(usize::from(s.real)) else {
            return Verdict::Drop(DropReason::NoHealthyServer);
        };
        match service.mode {
            L4Mode::Nat | L4Mode::Fnat => {
                let fnat = service.mode == L4Mode::Fnat;
                let local = || plane.local_addrs.get(usize::from(s.local)).copied();
                let f = buf.frame_mut();
                let done = match (real.addr, ip.flow.src) {
                    // The common case straight to the fused rewrite.
                    (IpAddr::V4(to), IpAddr::V4(_)) => {
                        let src = match local() {
                            Some(IpAddr::V4(l)) if fnat => Some((l, s.local_port)),
                            _ if fnat => return Verdict::Drop(DropReason::Unsupported),
                            _ => None,
                        };
                        rewrite::nat_v4(f, ip, src, Some((to, real.port)))
                    }
                    (IpAddr::V6(_), IpAddr::V6(_)) => {
                        let src = match local() {
                            Some(l @ IpAddr::V6(_)) if fnat => Some((l, s.local_port)),
                            _ if fnat => return Verdict::Drop(DropReason::Unsupported),
                            _ => None,
                        };
                        rewrite::nat(f, ip, src, Some((real.addr, real.port)))
                    }
                    // Across families would need header translation.
                    _ => return Verdict::Drop(DropReason::Unsupported),
                };
                if !done {
                    return Verdict::Drop(DropReason::TtlExceeded);
                }
                rewrite::set_macs(f, plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
            // Only the MAC changes: the real server owns the VIP too; the
            // I/O layer puts its MAC in (from `next_hops`).
            L4Mode::Dr => {
                self.hop = Some(real.addr);
                rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
            L4Mode::Ipip | L4Mode::Gue => {
                let tunnel =
                    if service.mode == L4Mode::Ipip { Tunnel::Ipip } else { Tunnel::Gue { port: service.gue_port } };
                // The outer source: a local address of the real server's family.
                let Some(src) =
                    plane.local_addrs[..plane.fnat_locals].iter().find(|a| a.is_ipv4() == real.addr.is_ipv4())
                else {
                    return Verdict::Drop(DropReason::Unsupported);
                };
                let outer = Outer {
                    src: *src,
                    dst: real.addr,
                    ttl: 64,
                    id: 0,
                    flow_hash: (s.client.mix() as u32 ^ u32::from(s.client_port)).wrapping_mul(0x9e37_79b9),
                };
                let frame_start = buf.head;
                if encapsulate(buf.frame(), ip.l3, ip.end, tunnel, &outer, &mut self.scratch).is_err() {
                    return Verdict::Drop(DropReason::Unsupported);
                }
                let grow = self.scratch.len().saturating_sub(buf.len);
                if grow > frame_start {
                    // No headroom for the tunnel header.
                    return Verdict::Drop(DropReason::Unsupported);
                }
                buf.head = frame_start - grow;
                buf.len = self.scratch.len();
                let (h, l) = (buf.head, buf.len);
                buf.mem[h..h + l].copy_from_slice(&self.scratch);
                rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
        }
    }
}
