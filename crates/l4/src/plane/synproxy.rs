//! A core's SYN proxy (DPVS's design): under a flood of SYNs, a NAT or FNAT
//! TCP service answers them itself with SYN cookies and opens no session;
//! a client's ACK that returns a good cookie opens the session, and the
//! client's ACK becomes the SYN to the real server; the real server's
//! SYN-ACK becomes the ACK that completes its handshake (carrying the data
//! the client sent meanwhile, if any); from then on sequence numbers from
//! the real server, and acknowledgments to it, are shifted by the
//! difference of the two initial sequence numbers.
//!
//! `Auto` turns on when a core sees more than the threshold of SYNs for a
//! service in one tick, and stays on for [`HOLD`] ticks after the last
//! such tick; ACKs are checked for cookies while cookies made then can
//! still be good.

use std::collections::HashMap;
use std::net::IpAddr;

use gatehouse_config::{L4Mode, SynProxyMode};

use super::family::Family;
use super::sessions::Sessions;
use super::{Buf, DropReason, Plane, Service, Verdict};
use crate::rewrite::set_macs;
use crate::rewrite::{Segment, shift32, write};
use crate::session::{PROXIED, State};
use crate::synproxy::{self as sp, Ends};
use gatehouse_wire::field::tcp;
use gatehouse_wire::packet::{Ip, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN};

/// Ticks `Auto` stays on after the SYN rate was last above the threshold.
pub const HOLD: u32 = 10;
/// Data segments kept per core for connections still opening.
const PARKED_MAX: usize = 4096;

#[derive(Clone, Copy, Default)]
struct Rate {
    tick: u32,
    count: u32,
    /// On until this tick (`Auto`); 0: never on.
    until: u32,
}

/// What the proxy keeps per core.
#[derive(Default)]
pub struct ProxyState {
    /// By session: the cookie while the real server's handshake is under
    /// way, then the sequence-number shift. Grown to the table's size on
    /// first use.
    deltas4: Vec<u32>,
    deltas6: Vec<u32>,
    /// The first data a client sent before its real server answered, by
    /// (family, session).
    parked: HashMap<(bool, u32), Vec<u8>>,
    rates: Vec<Rate>,
}

impl ProxyState {
    fn deltas<A: Family>(&mut self, cap: usize) -> &mut Vec<u32> {
        let d = if A::V6 { &mut self.deltas6 } else { &mut self.deltas4 };
        if d.len() < cap {
            d.resize(cap, 0);
        }
        d
    }
}

fn be32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4).map_or(0, |x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
}

/// The segment's payload, past its header.
fn payload<'a>(frame: &'a [u8], ip: &Ip) -> &'a [u8] {
    let hl = frame.get(ip.l4 + tcp::DATA_OFF).map_or(20, |b| usize::from(b >> 4) * 4);
    frame.get(ip.l4 + hl..ip.end).unwrap_or(&[])
}

impl ProxyState {
    /// The proxy's state in `slot`, made on first use.
    pub(super) fn of(slot: &mut Option<Box<ProxyState>>) -> &mut ProxyState {
        slot.get_or_insert_with(Box::default)
    }

    /// Counts a SYN for `svc` (one with no session) and says whether the
    /// service answers SYNs with cookies now.
    pub(super) fn syn_proxy_on(&mut self, service: &Service, svc: u16, now: u32) -> bool {
        match service.syn_proxy {
            SynProxyMode::Off => false,
            SynProxyMode::Always => true,
            SynProxyMode::Auto => {
                let p = self;
                if p.rates.len() <= usize::from(svc) {
                    p.rates.resize(usize::from(svc) + 1, Rate::default());
                }
                let r = &mut p.rates[usize::from(svc)];
                if r.tick != now {
                    r.tick = now;
                    r.count = 0;
                }
                r.count += 1;
                if r.count > service.syn_threshold {
                    r.until = now.saturating_add(HOLD);
                }
                now < r.until
            }
        }
    }

    /// Whether an ACK without a session may return one of our cookies.
    fn cookies_recent(&self, service: &Service, svc: u16, now: u32) -> bool {
        match service.syn_proxy {
            SynProxyMode::Off => false,
            SynProxyMode::Always => true,
            SynProxyMode::Auto => self
                .rates
                .get(usize::from(svc))
                .is_some_and(|r| r.until != 0 && now < r.until.saturating_add(2 * sp::STEP)),
        }
    }

    /// An ACK to service `svc` with no session: if the service has sent
    /// cookies lately and this one is good, opens the session and turns the
    /// ACK into the SYN to the real server. None: not a cookie's case.
    pub(super) fn cookie_ack<A: Family>(
        &mut self,
        ss: &mut Sessions,
        plane: &Plane,
        svc: u16,
        buf: &mut Buf<'_>,
        ip: &Ip,
        now: u32,
    ) -> Option<Verdict> {
        let service = &plane.services[usize::from(svc)];
        if ip.tcp_flags & (TCP_SYN | TCP_RST | TCP_FIN | TCP_ACK) != TCP_ACK || !self.cookies_recent(service, svc, now)
        {
            return None;
        }
        let (seq, ack, window) = {
            let seg = buf.frame().get(ip.l4..ip.end).unwrap_or(&[]);
            let w = seg.get(tcp::WINDOW..tcp::WINDOW + 2).map_or(0, |b| u16::from_be_bytes([b[0], b[1]]));
            (be32(seg, tcp::SEQ), be32(seg, tcp::ACK), w)
        };
        let (isn, cookie) = (seq.wrapping_sub(1), ack.wrapping_sub(1));
        let ends = Ends { client: ip.flow.src, client_port: ip.flow.sport, vip: ip.flow.dst, vip_port: ip.flow.dport };
        let Some(mss) = sp::check(plane.syn_secret, now, &ends, isn, cookie) else {
            if let Some(c) = ss.counters.services.get_mut(usize::from(svc)) {
                c.syn_cookies_failed += 1;
            }
            return Some(Verdict::Drop(DropReason::BadCookie));
        };
        if let Some(c) = ss.counters.services.get_mut(usize::from(svc)) {
            c.syn_cookies_valid += 1;
        }
        let idx = match ss.create::<A>(plane, svc, ip, now) {
            Ok(i) => i,
            Err(d) => return Some(Verdict::Drop(d)),
        };
        let cap = A::table(&ss.tables).capacity();
        let data = payload(buf.frame(), ip).to_vec();
        let p = &mut *self;
        p.deltas::<A>(cap)[idx as usize] = cookie;
        if !data.is_empty() && p.parked.len() < PARKED_MAX {
            p.parked.insert((A::V6, idx), data);
        }
        let s = *A::table(&ss.tables).get(idx);
        A::table_mut(&mut ss.tables).get_mut(idx).flags |= PROXIED;
        let real = service.reals.get(usize::from(s.real))?;
        let (src, sport) = Self::real_side_source(plane, service, &s, ip)?;
        let syn = Segment {
            src,
            dst: real.addr,
            sport,
            dport: real.port,
            seq: isn,
            ack: 0,
            flags: TCP_SYN,
            window,
            mss: Some(mss),
        };
        let Some(n) = write_at(buf, ip, &syn, &[]) else { return Some(Verdict::Drop(DropReason::Unsupported)) };
        buf.len = n;
        set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
        if let Some(c) = ss.counters.services.get_mut(usize::from(svc)) {
            c.packets += 1;
            c.bytes += n as u64;
            if let Some(p) = c.per_real_packets.get_mut(usize::from(s.real)) {
                *p += 1;
            }
        }
        Some(Verdict::Forward)
    }

    /// Where a session's packets to its real server come from: the client
    /// (NAT) or the FNAT local address and port.
    fn real_side_source<A: Family>(
        plane: &Plane,
        service: &Service,
        s: &crate::session::Session<A>,
        ip: &Ip,
    ) -> Option<(IpAddr, u16)> {
        match service.mode {
            L4Mode::Fnat => plane.local_addrs.get(usize::from(s.local)).map(|a| (*a, s.local_port)),
            _ => Some((ip.flow.src, ip.flow.sport)),
        }
    }

    /// A client's segment of a proxied session (the caller has checked it
    /// is one): while the real server's
    /// handshake is under way it is dropped (the first data kept, an RST
    /// ending the session); after, None: it goes on as usual, and
    /// [`ProxyState::proxied_out`] shifts its acknowledgment.
    pub(super) fn proxied_in<A: Family>(
        &mut self,
        ss: &mut Sessions,
        plane: &Plane,
        idx: u32,
        buf: &Buf<'_>,
        ip: &Ip,
    ) -> Option<Verdict> {
        if A::table(&ss.tables).get(idx).state != State::SynSent {
            return None;
        }
        if ip.tcp_flags & TCP_RST != 0 {
            ss.end::<A>(plane, idx);
            self.parked.remove(&(A::V6, idx));
            return Some(Verdict::Drop(DropReason::SynProxyPending));
        }
        let data = payload(buf.frame(), ip);
        let p = &mut *self;
        if !data.is_empty() && p.parked.len() < PARKED_MAX && !p.parked.contains_key(&(A::V6, idx)) {
            p.parked.insert((A::V6, idx), data.to_vec());
        }
        Some(Verdict::Drop(DropReason::SynProxyPending))
    }

    /// After a proxied session's segment was rewritten toward its real
    /// server: its acknowledgment into the server's numbers.
    pub(super) fn proxied_out<A: Family>(&mut self, ss: &Sessions, idx: u32, buf: &mut Buf<'_>, ip: &Ip) {
        if ip.tcp_flags & TCP_ACK == 0 {
            return;
        }
        let cap = A::table(&ss.tables).capacity();
        let d = self.deltas::<A>(cap)[idx as usize];
        let l4 = buf.head + ip.l4;
        shift32(buf.mem, l4, tcp::ACK, d);
    }

    /// A real server's segment of a proxied session (the caller has checked
    /// it is one). While its handshake
    /// is under way: its SYN-ACK becomes the ACK that completes it (with the
    /// client's kept data), its RST an RST to the client; anything else is
    /// dropped. After: None, it goes on as usual and
    /// [`ProxyState::proxied_back`] shifts its sequence number.
    pub(super) fn proxied_reply<A: Family>(
        &mut self,
        ss: &mut Sessions,
        plane: &Plane,
        idx: u32,
        buf: &mut Buf<'_>,
        ip: &Ip,
        now: u32,
    ) -> Option<Verdict> {
        let s = *A::table(&ss.tables).get(idx);
        if s.state != State::SynSent {
            return None;
        }
        let service = plane.services.get(usize::from(s.service))?;
        let cap = A::table(&ss.tables).capacity();
        let cookie = self.deltas::<A>(cap)[idx as usize];
        let (seq, ack) = {
            let seg = buf.frame().get(ip.l4..ip.end).unwrap_or(&[]);
            (be32(seg, tcp::SEQ), be32(seg, tcp::ACK))
        };
        if ip.tcp_flags & TCP_RST != 0 {
            let rst = Segment {
                src: service.vip,
                dst: s.client.ip(),
                sport: service.port,
                dport: s.client_port,
                seq: cookie.wrapping_add(1),
                ack: 0,
                flags: TCP_RST,
                window: 0,
                mss: None,
            };
            ss.end::<A>(plane, idx);
            self.parked.remove(&(A::V6, idx));
            let Some(n) = write_at(buf, ip, &rst, &[]) else { return Some(Verdict::Drop(DropReason::Unsupported)) };
            buf.len = n;
            set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
            return Some(Verdict::Forward);
        }
        if ip.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN | TCP_ACK {
            return Some(Verdict::Drop(DropReason::SynProxyPending));
        }
        // The shift from our numbers (the cookie) to the server's.
        let p = &mut *self;
        p.deltas::<A>(cap)[idx as usize] = seq.wrapping_sub(cookie);
        let data = p.parked.remove(&(A::V6, idx)).unwrap_or_default();
        let (src, sport) = match service.mode {
            L4Mode::Fnat => (*plane.local_addrs.get(usize::from(s.local))?, s.local_port),
            _ => (s.client.ip(), s.client_port),
        };
        let done = Segment {
            src,
            dst: ip.flow.src,
            sport,
            dport: ip.flow.sport,
            seq: ack,
            ack: seq.wrapping_add(1),
            flags: if data.is_empty() { TCP_ACK } else { TCP_ACK | TCP_PSH },
            window: 65535,
            mss: None,
        };
        let Some(n) = write_at(buf, ip, &done, &data) else { return Some(Verdict::Drop(DropReason::Unsupported)) };
        buf.len = n;
        set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
        let t = A::table_mut(&mut ss.tables).get_mut(idx);
        t.state = State::Established;
        t.expires = now.saturating_add(service.timeouts[State::Established as usize]);
        Some(Verdict::Forward)
    }

    /// After a proxied session's segment was rewritten toward the client:
    /// its sequence number into the client's (our cookie's) numbers.
    pub(super) fn proxied_back<A: Family>(&mut self, ss: &Sessions, idx: u32, buf: &mut Buf<'_>, ip: &Ip) {
        let cap = A::table(&ss.tables).capacity();
        let d = self.deltas::<A>(cap)[idx as usize];
        let l4 = buf.head + ip.l4;
        shift32(buf.mem, l4, tcp::SEQ, d.wrapping_neg());
    }
}

/// Answers a client's SYN with our SYN-ACK, its sequence number a
/// cookie; no session.
pub(super) fn answer_syn(ss: &mut Sessions, plane: &Plane, svc: u16, buf: &mut Buf<'_>, ip: &Ip, now: u32) -> Verdict {
    let (isn, mss) = {
        let seg = buf.frame().get(ip.l4..ip.end).unwrap_or(&[]);
        (be32(seg, tcp::SEQ), sp::syn_mss(seg))
    };
    let idx = sp::mss_index(mss);
    let ends = Ends { client: ip.flow.src, client_port: ip.flow.sport, vip: ip.flow.dst, vip_port: ip.flow.dport };
    let cookie = sp::make(plane.syn_secret, now, &ends, isn, idx);
    let s = Segment {
        src: ip.flow.dst,
        dst: ip.flow.src,
        sport: ip.flow.dport,
        dport: ip.flow.sport,
        seq: cookie,
        ack: isn.wrapping_add(1),
        flags: TCP_SYN | TCP_ACK,
        window: 65535,
        mss: Some(sp::MSS_TABLE[usize::from(idx)]),
    };
    let Some(n) = write_at(buf, ip, &s, &[]) else { return Verdict::Drop(DropReason::Unsupported) };
    buf.len = n;
    set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
    if let Some(c) = ss.counters.services.get_mut(usize::from(svc)) {
        c.syn_cookies_sent += 1;
    }
    Verdict::Forward
}

/// Writes segment `s` in place of the frame's IP packet, using the room the
/// buffer has past the frame; returns the new frame length.
fn write_at(buf: &mut Buf<'_>, ip: &Ip, s: &Segment, data: &[u8]) -> Option<usize> {
    let room = &mut buf.mem[buf.head..];
    write(room, ip.l3, s, data)
}
