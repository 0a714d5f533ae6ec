//! The router's two vector paths (see the module above): LAN frames
//! sealed into WAN datagrams, WAN datagrams opened into LAN frames, in
//! place. Each stage runs over the whole vector before the next; the
//! device's lock is taken once per stage that needs it, and the AEAD runs
//! once per vector.

use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Instant;

use gatehouse_link::nexthop::{Miss, NextHops};
use gatehouse_mbx::aead::{OpenJob, SealJob, TAG_LEN, open_batch, seal_batch};
use gatehouse_wg::device::{Device, Inbound, OpenPlan, Received, SealPlan};
use gatehouse_wg::messages::{TRANSPORT, transport::DATA};
use gatehouse_wire::checksum;
use gatehouse_wire::field::{ethernet, ipv4, ipv6, udp};
use gatehouse_wire::forward::{self, Error as IcmpError, Header, Refusal};
use gatehouse_wire::packet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_UDP};
use rand_core::CryptoRngCore;

use super::{Counts, Extra, Fate, Frame, Router, RouterDrop};

/// Room before a packet the pipeline makes (fragments): the largest
/// outer header, rounded up.
const HEADROOM: usize = 128;

use gatehouse_wg::transport::padded_within as padded_len;

/// Outer headers in front of a sealed packet: Ethernet, IP, UDP and the
/// transport message's 16 bytes.
fn outer_len(v6: bool) -> usize {
    ethernet::HEADER_LEN + if v6 { ipv6::HEADER_LEN } else { ipv4::MIN_HEADER_LEN } + udp::HEADER_LEN + DATA
}

fn ethertype(frame: &[u8]) -> Option<u16> {
    let b = frame.get(ethernet::ETHERTYPE..ethernet::HEADER_LEN)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// Writes an Ethernet header at the start of `to`.
fn write_ethernet(to: &mut [u8], dst: [u8; 6], src: [u8; 6], v6: bool) {
    to[ethernet::DST..ethernet::DST + 6].copy_from_slice(&dst);
    to[ethernet::SRC..ethernet::SRC + 6].copy_from_slice(&src);
    let kind = if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 };
    to[ethernet::ETHERTYPE..ethernet::HEADER_LEN].copy_from_slice(&kind.to_be_bytes());
}

/// The MAC toward `dst` on a side, or the miss recorded for resolution.
fn next_hop(hops: &NextHops, dst: IpAddr, resolve: &mut Vec<IpAddr>) -> Option<[u8; 6]> {
    match hops.mac(dst) {
        Ok(mac) => Some(mac),
        Err(Miss::Unresolved(a)) => {
            if !resolve.contains(&a) {
                resolve.push(a);
            }
            None
        }
        Err(Miss::NoRoute) => None,
    }
}

/// The last next hop a vector looked up. A vector's packets mostly go to
/// one destination, and each lookup walks the routes and hashes into the
/// neighbour table (SipHash: traffic can fill it): with TCP opened at a
/// site gateway, 1.5% of its CPU's samples.
#[derive(Default)]
struct LastHop(Option<(IpAddr, [u8; 6])>);

impl LastHop {
    fn mac(&mut self, hops: &NextHops, dst: IpAddr, resolve: &mut Vec<IpAddr>) -> Option<[u8; 6]> {
        if let Some((d, mac)) = self.0
            && d == dst
        {
            return Some(mac);
        }
        let mac = next_hop(hops, dst, resolve)?;
        self.0 = Some((dst, mac));
        Some(mac)
    }
}

/// An ICMP error about a LAN packet, sent back to the LAN host it came
/// from (`sender`: its frame's source MAC), from the router's LAN address.
fn answer_lan(r: &Router, sender: [u8; 6], packet: &[u8], h: &Header, what: IcmpError, extra: &mut Extra) -> bool {
    let Some(from) = r.lan.address_like(h.src) else { return false };
    let Some(icmp) = forward::icmp_error(packet, h, from, what) else { return false };
    let mut f = vec![0u8; ethernet::HEADER_LEN + icmp.len()];
    write_ethernet(&mut f, sender, r.lan.mac, h.v6);
    f[ethernet::HEADER_LEN..].copy_from_slice(&icmp);
    extra.to_lan.push(f);
    true
}

/// A packet planned for sealing: its frame, where the packet starts, its
/// header.
struct Planned {
    frame: usize,
    at: usize,
    header: Header,
    plan: Option<SealPlan>,
    /// Where the outer headers start, once written.
    head: usize,
}

/// What sends the sealed packets on to the WAN, and so what of their
/// outer headers must be made here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WanSender {
    /// The WAN's AF_XDP socket sends the frames as they are: every header
    /// whole, with its checksum, behind the next hop's MAC.
    Frames,
    /// The kernel's UDP socket sends the datagrams (where the WAN's AF_XDP
    /// socket copies; `io::datagram_of` reads their destination, ECN bits
    /// and length back from the headers). The kernel writes IP and UDP
    /// headers of its own and finds the next hop itself, so the MAC and the
    /// checksums are not made here (the MAC's lookup and the UDP checksum
    /// were 6% of the gateway's samples with 64-byte packets, and a
    /// neighbour the kernel could have found dropped the packet).
    Kernel,
}

/// Seals a vector of LAN frames toward the WAN. `fates` gets one entry
/// per frame; frames made here (ICMP errors, sealed fragments) and the
/// device's own datagrams go to `extra`. Fragments go out by the WAN's
/// AF_XDP socket whatever `sender` is, and are framed whole.
#[allow(clippy::too_many_arguments)]
pub fn seal_vector<R: CryptoRngCore>(
    r: &Router,
    sender: WanSender,
    dev: &Mutex<Device<R>>,
    frames: &mut [Frame<'_>],
    fates: &mut Vec<Fate>,
    extra: &mut Extra,
    counts: &mut Counts,
    now: Instant,
) {
    fates.clear();
    fates.resize(frames.len(), Fate::Drop);
    counts.lan_rx += frames.len() as u64;
    let mut planned = Vec::with_capacity(frames.len());
    // Fragments made here, each in a buffer of its own, with its frame's length.
    let mut fragments: Vec<(Vec<u8>, usize)> = Vec::new();
    for (i, f) in frames.iter_mut().enumerate() {
        let frame = &mut f.mem[f.head..f.head + f.len];
        let v6 = match ethertype(frame) {
            Some(ETHERTYPE_IPV4) => false,
            Some(ETHERTYPE_IPV6) => true,
            _ => {
                counts.drop(RouterDrop::NotIp);
                continue;
            }
        };
        let mut sender = [0u8; 6];
        sender.copy_from_slice(&frame[ethernet::SRC..ethernet::SRC + 6]);
        let packet = &mut frame[ethernet::HEADER_LEN..];
        let h = match forward::header(packet) {
            Ok(h) if h.v6 == v6 => h,
            _ => {
                counts.drop(RouterDrop::Malformed);
                continue;
            }
        };
        if forward::lower_ttl(packet, &h).is_err() {
            counts.icmp += u64::from(answer_lan(r, sender, packet, &h, IcmpError::TimeExceeded, extra));
            counts.drop(RouterDrop::TimeExceeded);
            continue;
        }
        if h.len > r.mtu {
            if !h.dont_fragment
                && let Some(pieces) = forward::fragment_v4(packet, &h, r.mtu)
            {
                counts.fragments += pieces.len() as u64;
                fragments.extend(pieces.into_iter().map(|p| {
                    let mut b = vec![0u8; HEADROOM + ethernet::HEADER_LEN + padded_len(p.len(), r.mtu) + TAG_LEN];
                    b[HEADROOM + ethernet::HEADER_LEN..][..p.len()].copy_from_slice(&p);
                    (b, ethernet::HEADER_LEN + p.len())
                }));
                fates[i] = Fate::Taken;
                continue;
            }
            let mtu = u16::try_from(r.mtu).unwrap_or(u16::MAX);
            counts.icmp += u64::from(answer_lan(r, sender, packet, &h, IcmpError::TooBig { mtu }, extra));
            counts.drop(RouterDrop::TooBig);
            continue;
        }
        planned.push(Planned { frame: i, at: f.head + ethernet::HEADER_LEN, header: h, plan: None, head: 0 });
    }
    seal_planned(r, sender, dev, frames, &mut planned, fates, extra, counts, now);
    if fragments.is_empty() {
        return;
    }
    // The fragments go the same way, in buffers of their own.
    let mut own: Vec<Frame<'_>> =
        fragments.iter_mut().map(|(b, len)| Frame { mem: &mut b[..], head: HEADROOM, len: *len }).collect();
    let mut planned = Vec::with_capacity(own.len());
    for (i, f) in own.iter().enumerate() {
        let at = f.head + ethernet::HEADER_LEN;
        if let Ok(h) = forward::header(&f.mem[at..]) {
            planned.push(Planned { frame: i, at, header: h, plan: None, head: 0 });
        }
    }
    let mut own_fates = Vec::new();
    own_fates.resize(own.len(), Fate::Drop);
    seal_planned(r, WanSender::Frames, dev, &mut own, &mut planned, &mut own_fates, extra, counts, now);
    for (f, fate) in own.iter().zip(&own_fates) {
        if let Fate::Send { head, len } = *fate {
            extra.to_wan.push(f.mem[head..head + len].to_vec());
        }
    }
}

/// Plans, frames, seals and checksums packets that are ready to go.
#[allow(clippy::too_many_arguments)]
fn seal_planned<R: CryptoRngCore>(
    r: &Router,
    sender: WanSender,
    dev: &Mutex<Device<R>>,
    frames: &mut [Frame<'_>],
    planned: &mut [Planned],
    fates: &mut [Fate],
    extra: &mut Extra,
    counts: &mut Counts,
    now: Instant,
) {
    if planned.is_empty() {
        return;
    }
    {
        let mut dev = dev.lock().unwrap_or_else(|e| e.into_inner());
        for p in planned.iter_mut() {
            let f = &frames[p.frame];
            match dev.plan_seal(&f.mem[p.at..p.at + p.header.len], now, &mut extra.transmits) {
                Ok(Some(plan)) => p.plan = Some(plan),
                Ok(None) => fates[p.frame] = Fate::Taken,
                Err(d) => counts.device_drop(d),
            }
        }
    }
    let mut hop = LastHop::default();
    for p in planned.iter_mut() {
        let Some(plan) = &p.plan else { continue };
        match frame_outer(r, sender, &mut hop, &mut frames[p.frame], p.at, &p.header, plan, extra, counts) {
            Some(head) => p.head = head,
            None => p.plan = None,
        }
    }
    let mut jobs: Vec<SealJob<'_>> = Vec::with_capacity(planned.len());
    // Each job borrows its own frame: walk the frames and the plans (in
    // frame order) together.
    let mut next = planned.iter().filter(|p| p.plan.is_some()).peekable();
    for (i, f) in frames.iter_mut().enumerate() {
        let Some(p) = next.next_if(|p| p.frame == i) else { continue };
        let Some(plan) = &p.plan else { continue };
        let padded = padded_len(p.header.len, r.mtu);
        let (data, rest) = f.mem[p.at..].split_at_mut(padded);
        let Some(tag) = rest.get_mut(..TAG_LEN).and_then(|t| <&mut [u8; TAG_LEN]>::try_from(t).ok()) else {
            continue;
        };
        jobs.push(SealJob { key: &plan.key.0, counter: plan.counter, data, tag });
    }
    seal_batch(&mut jobs);
    drop(jobs);
    for p in planned.iter() {
        let Some(plan) = &p.plan else { continue };
        let f = &mut frames[p.frame];
        let end = p.at + padded_len(p.header.len, r.mtu) + TAG_LEN;
        if sender == WanSender::Frames {
            udp_checksum(&mut f.mem[p.head + ethernet::HEADER_LEN..end], plan.to.is_ipv6());
        }
        fates[p.frame] = Fate::Send { head: p.head, len: end - p.head };
        counts.sealed += 1;
    }
}

/// Writes the outer headers in front of a planned packet (at `at`) and
/// pads it; returns where the frame now starts, or None (counted) when it
/// cannot go. For the kernel's socket, without the next hop's MAC and the
/// IPv4 header's checksum.
#[allow(clippy::too_many_arguments)]
fn frame_outer(
    r: &Router,
    sender: WanSender,
    hop: &mut LastHop,
    f: &mut Frame<'_>,
    at: usize,
    header: &Header,
    plan: &SealPlan,
    extra: &mut Extra,
    counts: &mut Counts,
) -> Option<usize> {
    let to = plan.to;
    let v6 = to.is_ipv6();
    let Some(src) = r.wan.address_like(to.ip()) else {
        counts.drop(RouterDrop::NoSourceAddress);
        return None;
    };
    let mac = match sender {
        WanSender::Kernel => [0; 6],
        WanSender::Frames => match hop.mac(&r.wan.hops, to.ip(), &mut extra.resolve_wan) {
            Some(mac) => mac,
            None => {
                counts.drop(RouterDrop::NoNextHop);
                return None;
            }
        },
    };
    let outer = outer_len(v6);
    let padded = padded_len(header.len, r.mtu);
    if at < outer || at + padded + TAG_LEN > f.mem.len() {
        counts.drop(RouterDrop::NoRoom);
        return None;
    }
    let head = at - outer;
    f.mem[at + header.len..at + padded].fill(0);
    let datagram = DATA + padded + TAG_LEN;
    let m = &mut f.mem[head..at];
    write_ethernet(m, mac, r.wan.mac, v6);
    let ip = &mut m[ethernet::HEADER_LEN..];
    let ip_len = if v6 { ipv6::HEADER_LEN } else { ipv4::MIN_HEADER_LEN };
    // RFC 6040's normal mode: the outer packet carries the inner ECN bits.
    let ecn = header.ecn;
    match (src, to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = (ip_len + udp::HEADER_LEN + datagram) as u16;
            let id = (plan.counter as u16).to_be_bytes();
            let h = &mut ip[..ip_len];
            h.copy_from_slice(&[0x45, ecn, 0, 0, id[0], id[1], 0, 0, 64, PROTO_UDP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            h[ipv4::TOTAL_LEN..ipv4::TOTAL_LEN + 2].copy_from_slice(&total.to_be_bytes());
            h[ipv4::SRC..ipv4::SRC + 4].copy_from_slice(&s.octets());
            h[ipv4::DST..ipv4::DST + 4].copy_from_slice(&d.octets());
            if sender == WanSender::Frames {
                let c = checksum::checksum(h);
                h[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
            }
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let h = &mut ip[..ip_len];
            h[..4].copy_from_slice(&[0x60 | (ecn >> 2), ecn << 4, 0, 0]);
            h[ipv6::PAYLOAD_LEN..ipv6::PAYLOAD_LEN + 2]
                .copy_from_slice(&((udp::HEADER_LEN + datagram) as u16).to_be_bytes());
            h[ipv6::NEXT_HEADER] = PROTO_UDP;
            h[ipv6::HOP_LIMIT] = 64;
            h[ipv6::SRC..ipv6::SRC + 16].copy_from_slice(&s.octets());
            h[ipv6::DST..ipv6::DST + 16].copy_from_slice(&d.octets());
        }
        _ => {
            counts.drop(RouterDrop::NoSourceAddress);
            return None;
        }
    }
    let u = &mut ip[ip_len..ip_len + udp::HEADER_LEN];
    u[udp::SRC_PORT..udp::SRC_PORT + 2].copy_from_slice(&r.port.to_be_bytes());
    u[udp::DST_PORT..udp::DST_PORT + 2].copy_from_slice(&to.port().to_be_bytes());
    u[udp::LENGTH..udp::LENGTH + 2].copy_from_slice(&((udp::HEADER_LEN + datagram) as u16).to_be_bytes());
    u[udp::CHECKSUM..udp::CHECKSUM + 2].fill(0);
    ip[ip_len + udp::HEADER_LEN..].copy_from_slice(&plan.header);
    Some(head)
}

/// Fills in the UDP checksum of an IP packet this pipeline framed (no
/// IPv4 options, no IPv6 extension headers).
fn udp_checksum(packet: &mut [u8], v6: bool) {
    let (ip_len, pseudo) = if v6 {
        let (s, d) = (&packet[ipv6::SRC..ipv6::SRC + 16], &packet[ipv6::DST..ipv6::DST + 16]);
        let len = (packet.len() - ipv6::HEADER_LEN) as u32;
        (ipv6::HEADER_LEN, checksum::add(checksum::add(0, s), d) + u64::from(PROTO_UDP) + u64::from(len))
    } else {
        let mut s = [0u8; 4];
        let mut d = [0u8; 4];
        s.copy_from_slice(&packet[ipv4::SRC..ipv4::SRC + 4]);
        d.copy_from_slice(&packet[ipv4::DST..ipv4::DST + 4]);
        let len = (packet.len() - ipv4::MIN_HEADER_LEN) as u16;
        (ipv4::MIN_HEADER_LEN, checksum::pseudo_v4(s, d, PROTO_UDP, len))
    };
    let seg = &mut packet[ip_len..];
    let c = match !checksum::fold(checksum::add(pseudo, seg)) {
        // A computed zero goes as all ones (zero means "none" in IPv4).
        0 => 0xffff,
        c => c,
    };
    seg[udp::CHECKSUM..udp::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
}

/// A transport message found in a WAN frame.
struct Incoming {
    frame: usize,
    /// The datagram's bytes in the frame's memory.
    at: usize,
    len: usize,
    from: SocketAddr,
    /// The outer packet's ECN bits.
    ecn: u8,
    plan: Option<OpenPlan>,
}

/// Where the UDP datagram of a WAN frame lies, if it is one for us.
fn classify_wan(r: &Router, frame: &[u8]) -> Result<(usize, usize, SocketAddr, IpAddr, u8), RouterDrop> {
    let v6 = match ethertype(frame) {
        Some(ETHERTYPE_IPV4) => false,
        Some(ETHERTYPE_IPV6) => true,
        _ => return Err(RouterDrop::NotIp),
    };
    let packet = &frame[ethernet::HEADER_LEN..];
    let h = match forward::header(packet) {
        Ok(h) if h.v6 == v6 => h,
        _ => return Err(RouterDrop::Malformed),
    };
    let ours = r.wan.address_like(h.dst) == Some(h.dst);
    let proto = if v6 { packet[ipv6::NEXT_HEADER] } else { packet[ipv4::PROTOCOL] };
    if !v6 && u16::from_be_bytes([packet[ipv4::FLAGS_FRAG], packet[ipv4::FLAGS_FRAG + 1]]) & 0x3fff != 0 {
        return Err(RouterDrop::OuterFragment);
    }
    if !ours || proto != PROTO_UDP {
        return Err(RouterDrop::NotOurs);
    }
    let u = packet.get(h.header_len..h.header_len + udp::HEADER_LEN).ok_or(RouterDrop::Malformed)?;
    let word = |at: usize| u16::from_be_bytes([u[at], u[at + 1]]);
    if word(udp::DST_PORT) != r.port {
        return Err(RouterDrop::NotOurs);
    }
    let ulen = usize::from(word(udp::LENGTH));
    if ulen < udp::HEADER_LEN || h.header_len + ulen > h.len {
        return Err(RouterDrop::Malformed);
    }
    let at = ethernet::HEADER_LEN + h.header_len + udp::HEADER_LEN;
    Ok((at, ulen - udp::HEADER_LEN, SocketAddr::new(h.src, word(udp::SRC_PORT)), h.dst, h.ecn))
}

/// Opens a vector of WAN frames toward the LAN. `fates` gets one entry
/// per frame; handshake messages, the device's datagrams and ICMP errors
/// for the tunnel go to `extra`.
#[allow(clippy::too_many_arguments)]
pub fn open_vector<R: CryptoRngCore>(
    r: &Router,
    dev: &Mutex<Device<R>>,
    frames: &mut [Frame<'_>],
    fates: &mut Vec<Fate>,
    extra: &mut Extra,
    counts: &mut Counts,
    now: Instant,
) {
    fates.clear();
    fates.resize(frames.len(), Fate::Drop);
    counts.wan_rx += frames.len() as u64;
    let mut incoming = Vec::with_capacity(frames.len());
    for (i, f) in frames.iter().enumerate() {
        let frame = &f.mem[f.head..f.head + f.len];
        let (at, len, from, local, ecn) = match classify_wan(r, frame) {
            Ok(c) => c,
            Err(d) => {
                counts.drop(d);
                continue;
            }
        };
        let datagram = &frame[at..at + len];
        if datagram.first() != Some(&TRANSPORT) {
            // Handshakes cost Diffie-Hellman work: the control thread's.
            extra.handshakes.push((datagram.to_vec(), from, Some(local)));
            fates[i] = Fate::Taken;
            continue;
        }
        incoming.push(Incoming { frame: i, at: f.head + at, len, from, ecn, plan: None });
    }
    if incoming.is_empty() {
        return;
    }
    {
        let mut dev = dev.lock().unwrap_or_else(|e| e.into_inner());
        for m in incoming.iter_mut() {
            let datagram = &frames[m.frame].mem[m.at..m.at + m.len];
            match dev.plan_open(datagram, m.from, now, &mut extra.transmits) {
                Inbound::Open(plan) => m.plan = Some(plan),
                Inbound::Done(Received::Dropped(d)) => counts.device_drop(d),
                Inbound::Done(_) => fates[m.frame] = Fate::Taken,
            }
        }
    }
    let mut jobs: Vec<OpenJob<'_>> = Vec::with_capacity(incoming.len());
    let mut next = incoming.iter().filter(|m| m.plan.is_some()).peekable();
    for (i, f) in frames.iter_mut().enumerate() {
        let Some(m) = next.next_if(|m| m.frame == i) else { continue };
        let Some(plan) = &m.plan else { continue };
        // plan_open parsed it: at least a header and a tag.
        let Some(sealed) = f.mem.get_mut(m.at + DATA..m.at + m.len) else { continue };
        let (data, tag) = sealed.split_at_mut(m.len - DATA - TAG_LEN);
        let Ok(tag) = <&[u8; TAG_LEN]>::try_from(&*tag) else { continue };
        jobs.push(OpenJob { key: &plan.key.0, counter: plan.counter, data, tag, ok: false });
    }
    open_batch(&mut jobs);
    let opened: Vec<bool> = jobs.iter().map(|j| j.ok).collect();
    drop(jobs);
    let mut expired = Vec::new();
    let mut hop = LastHop::default();
    {
        let mut verdicts = opened.into_iter();
        let mut dev = dev.lock().unwrap_or_else(|e| e.into_inner());
        for m in incoming.iter() {
            let Some(plan) = &m.plan else { continue };
            if verdicts.next() != Some(true) {
                let decrypt =
                    gatehouse_wg::device::DropReason::Transport(gatehouse_wg::transport::TransportError::Decrypt);
                counts.device_drop(decrypt);
                dev.note_drop(plan.peer, decrypt);
                continue;
            }
            let f = &mut frames[m.frame];
            let plain = &f.mem[m.at + DATA..m.at + m.len - TAG_LEN];
            let len = match dev.finish_open(plan, plain, m.from, now, &mut extra.transmits) {
                Received::Packet { len, .. } => len,
                Received::Dropped(d) => {
                    counts.device_drop(d);
                    continue;
                }
                Received::Control => {
                    fates[m.frame] = Fate::Taken;
                    continue;
                }
            };
            let at = m.at + DATA;
            let packet = &mut f.mem[at..at + len];
            let h = match forward::header(packet) {
                Ok(h) => h,
                Err(_) => {
                    counts.drop(RouterDrop::Malformed);
                    continue;
                }
            };
            if m.ecn == 3 {
                forward::mark_congestion(packet, &h);
            }
            if let Err(Refusal::TimeExceeded) = forward::lower_ttl(packet, &h) {
                if let Some(from) = r.lan.address_like(h.src)
                    && let Some(icmp) = forward::icmp_error(packet, &h, from, IcmpError::TimeExceeded)
                {
                    expired.push(icmp);
                }
                counts.drop(RouterDrop::TimeExceeded);
                continue;
            }
            let Some(mac) = hop.mac(&r.lan.hops, h.dst, &mut extra.resolve_lan) else {
                counts.drop(RouterDrop::NoNextHop);
                continue;
            };
            let head = at - ethernet::HEADER_LEN;
            write_ethernet(&mut f.mem[head..at], mac, r.lan.mac, h.v6);
            fates[m.frame] = Fate::Send { head, len: ethernet::HEADER_LEN + h.len };
            counts.opened += 1;
        }
        // Time exceeded goes back through the tunnel to the sender.
        for icmp in expired {
            if dev.send(&icmp, now, &mut extra.transmits).is_ok() {
                counts.icmp += 1;
            }
        }
    }
}
