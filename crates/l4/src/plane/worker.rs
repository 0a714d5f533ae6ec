//! One core's pipeline. Each frame is parsed and classified (to a service,
//! as a reply of a NAT session, to an FNAT local port, or not for the
//! plane), and its session key hashed, for the whole vector first; then the
//! lookups run software-pipelined (see [`Worker::process`]), each packet
//! finished as soon as its session record is at hand: a new session
//! scheduled for a first packet, the rewrite for its mode, the verdict.

use std::net::{IpAddr, Ipv4Addr};

use gatehouse_balance::{Backends, LeastConnections, RoundRobin, SmoothWeighted};
use gatehouse_config::{L4Mode, L4Scheduler};

use super::family::{Family, Tables};
use super::fnat::{PortPool, release};
use super::{Buf, Counters, DropReason, Endpoint, Plane, Real, Service, ServiceCounters, VECTOR, Verdict, addr_key};
use crate::encap::{Outer, Tunnel, encapsulate};
use crate::rewrite;
use crate::session::{Key, PROXIED, REVERSE, Session, State, Table};
use gatehouse_wire::packet::{self, Ip, PROTO_TCP, PROTO_UDP, Parsed, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

fn sched_for(s: L4Scheduler) -> Sched {
    match s {
        L4Scheduler::Rr => Sched::Rr(RoundRobin::default()),
        L4Scheduler::Wrr => Sched::Wrr(SmoothWeighted::default()),
        L4Scheduler::Wlc => Sched::Wlc(LeastConnections::default()),
        L4Scheduler::Maglev => Sched::Maglev,
    }
}

enum Sched {
    Rr(RoundRobin),
    Wrr(SmoothWeighted),
    Wlc(LeastConnections),
    Maglev,
}

struct View<'a> {
    reals: &'a [Real],
    active: &'a [u64],
}

impl Backends for View<'_> {
    fn len(&self) -> usize {
        self.reals.len()
    }
    fn weight(&self, i: usize) -> u32 {
        self.reals[i].weight
    }
    fn available(&self, i: usize) -> bool {
        self.reals[i].up
    }
    fn load(&self, i: usize) -> u64 {
        self.active.get(i).copied().unwrap_or(0)
    }
}

/// What the stages learn about one frame. The IP packet's details, when
/// it is one, are in the record beside it (`Worker::ips`).
#[derive(Clone, Copy)]
enum Class {
    Done(Verdict),
    /// From a client to service `svc`.
    ToService {
        svc: u16,
    },
    /// A NAT reply from real `real` of service `svc`.
    FromReal {
        svc: u16,
        real: u16,
    },
    /// An FNAT reply to local address `local`, port `port`.
    ToLocal {
        local: u16,
        port: u16,
    },
    /// An ARP request for an address of ours (the ARP header's offset).
    ArpFor {
        at: usize,
        addr: Ipv4Addr,
    },
    /// A neighbour solicitation for an address of ours.
    NdFor {
        addr: std::net::Ipv6Addr,
    },
    /// An ICMP error quoting a packet of one of our sessions.
    IcmpError,
    /// From an inside host of SNAT rule `rule` to the outside.
    Outbound {
        rule: u16,
    },
}

impl Class {
    /// Whether the packet goes to the IPv6 session table (packets of
    /// sessions only; everything else is handled with the IPv4 one).
    fn is_v6(&self, ip: &Ip) -> bool {
        matches!(
            self,
            Class::ToService { .. } | Class::FromReal { .. } | Class::ToLocal { .. } | Class::Outbound { .. }
        ) && ip.flow.src.is_ipv6()
    }
}

/// One core's state.
pub struct Worker {
    pub core: u16,
    pub(super) tables: Tables,
    pub(super) ports: Vec<PortPool>,
    scheds: Vec<Sched>,
    pub counters: Counters,
    scratch: Vec<u8>,
    classes: Vec<Class>,
    /// The IP details of each frame of the vector, parsed in place.
    ips: Vec<Ip>,
    probes: Vec<Probe>,
    /// By frame of the last vector: the neighbour a forwarded frame must
    /// go to when it is not its (outer) destination address: the real
    /// server in DR mode, whose packets keep the VIP as destination.
    pub next_hops: Vec<Option<IpAddr>>,
    hop: Option<IpAddr>,
    /// Session sync with the peer balancer, when on.
    pub(super) sync: Option<Box<super::sync::SyncOut>>,
    /// The SYN proxy's state, once a service used it.
    pub(super) proxy: Option<Box<super::synproxy::ProxyState>>,
}

/// A packet's session-table lookup: its key's hash, the family's table,
/// and whether it has one at all (only packets from clients and NAT
/// replies are looked up by key).
#[derive(Clone, Copy)]
struct Probe {
    hash: u64,
    v6: bool,
    indexed: bool,
}

impl Worker {
    /// A worker for up to `capacity` sessions of each family.
    pub fn new(plane: &Plane, core: u16, capacity: usize, seed: u64) -> Worker {
        Self::with_capacities(plane, core, capacity, capacity.div_ceil(16).max(1024), seed)
    }

    pub fn with_capacities(plane: &Plane, core: u16, v4: usize, v6: usize, seed: u64) -> Worker {
        let scheds = plane.services.iter().map(|s| sched_for(s.scheduler)).collect();
        let counters = Counters {
            services: plane
                .services
                .iter()
                .map(|s| ServiceCounters {
                    per_real_packets: vec![0; s.reals.len()],
                    per_real_active: vec![0; s.reals.len()],
                    ..Default::default()
                })
                .collect(),
            ..Counters::default()
        };
        Worker {
            core,
            tables: Tables { v4: Table::new(v4, seed), v6: Table::new(v6, seed.rotate_left(17)) },
            ports: plane.local_ports.iter().map(|&range| PortPool::new(core, plane.cores, range)).collect(),
            scheds,
            counters,
            scratch: Vec::with_capacity(2048),
            classes: Vec::with_capacity(VECTOR),
            ips: Vec::with_capacity(VECTOR),
            probes: Vec::with_capacity(VECTOR),
            next_hops: Vec::with_capacity(VECTOR),
            hop: None,
            sync: None,
            proxy: None,
        }
    }

    /// Takes a new plane whose services and real servers extend this
    /// worker's (appended at the end, the ones before unchanged: see
    /// [`Plane::extends`]): the session tables are kept, counters and
    /// schedulers grow.
    pub fn adopt(&mut self, plane: &Plane) {
        for (i, s) in plane.services.iter().enumerate() {
            if i == self.scheds.len() {
                self.scheds.push(sched_for(s.scheduler));
                self.counters.services.push(ServiceCounters::default());
            }
            let c = &mut self.counters.services[i];
            c.per_real_packets.resize(s.reals.len().max(c.per_real_packets.len()), 0);
            c.per_real_active.resize(s.reals.len().max(c.per_real_active.len()), 0);
        }
    }

    pub fn sessions(&self) -> usize {
        self.tables.v4.len() + self.tables.v6.len()
    }

    /// Bytes held by this core's session tables.
    pub fn table_bytes(&self) -> usize {
        self.tables.v4.memory_bytes() + self.tables.v6.memory_bytes()
    }

    /// Classifies a frame, an IP packet's details into `ip`.
    fn classify(plane: &Plane, buf: &Buf<'_>, ip: &mut Ip) -> Class {
        match packet::parse_into(buf.frame(), plane.checks, ip) {
            Ok(Parsed::Ip) => {}
            Ok(Parsed::Arp(arp)) if arp.op == 1 && plane.owned.contains(&IpAddr::V4(arp.target_ip)) => {
                let at = packet::ethernet(buf.frame()).map_or(14, |e| e.3);
                return Class::ArpFor { at, addr: arp.target_ip };
            }
            Ok(Parsed::Arp(_) | Parsed::Other) => return Class::Done(Verdict::Pass),
            Err(m) => return Class::Done(Verdict::Drop(DropReason::Malformed(m))),
        }
        let ip: &Ip = ip;
        let f = &ip.flow;
        if f.proto == gatehouse_wire::packet::PROTO_ICMPV6
            && ip.icmp.is_some_and(|i| i.kind == crate::neighbour::ND_SOLICIT)
            && let Some(t) = crate::neighbour::solicited_target(buf.frame(), ip)
            && plane.owned.contains(&IpAddr::V6(t))
        {
            return Class::NdFor { addr: t };
        }
        if let Some(icmp) = ip.icmp
            && icmp.quoted
        {
            return Class::IcmpError;
        }
        if !matches!(f.proto, PROTO_TCP | PROTO_UDP) {
            return Class::Done(if plane.by_vip.is_empty() {
                Verdict::Pass
            } else {
                Verdict::Drop(DropReason::Unsupported)
            });
        }
        if let Some(&svc) = plane.by_vip.get(&Endpoint::new(f.dst, f.dport, f.proto)) {
            return Class::ToService { svc };
        }
        if let Some(local) = plane.local_addrs.iter().position(|a| *a == f.dst) {
            return Class::ToLocal { local: local as u16, port: f.dport };
        }
        if let Some(&(svc, real)) = plane.by_real.get(&Endpoint::new(f.src, f.sport, f.proto)) {
            return Class::FromReal { svc, real };
        }
        if let Some(rule) = plane.snat_rule(f.src) {
            return Class::Outbound { rule };
        }
        Class::Done(Verdict::Pass)
    }

    fn key<A: Family>(c: &Class, ip: &Ip) -> Option<Key<A>> {
        match *c {
            Class::ToService { svc } => Some(Key { addr: A::of(ip.flow.src), port: ip.flow.sport, context: svc }),
            Class::FromReal { real, .. } => {
                Some(Key { addr: A::of(ip.flow.dst), port: ip.flow.dport, context: REVERSE | real })
            }
            Class::Outbound { rule } => Some(super::snat::snat_key::<A>(rule, ip)),
            _ => None,
        }
    }

    fn hash_of<A: Family>(&self, c: &Class, ip: &Ip) -> u64 {
        Self::key::<A>(c, ip).map_or(0, |k| A::table(&self.tables).hash(&k))
    }

    /// What the later stages need to know of a packet's class, worked out
    /// once.
    fn probe(&self, c: &Class, ip: &Ip) -> Probe {
        let v6 = c.is_v6(ip);
        let indexed = matches!(c, Class::ToService { .. } | Class::FromReal { .. } | Class::Outbound { .. });
        let hash = match (indexed, v6) {
            (false, _) => 0,
            (true, false) => self.hash_of::<u32>(c, ip),
            (true, true) => self.hash_of::<u128>(c, ip),
        };
        Probe { hash, v6, indexed }
    }

    /// Asks for the index bucket (or, with `record`, the session record)
    /// that a packet's lookup will read.
    fn prefetch(&self, p: Probe, record: bool) {
        match (p.indexed, p.v6, record) {
            (false, ..) => {}
            (true, false, false) => self.tables.v4.prefetch_bucket(p.hash),
            (true, false, true) => self.tables.v4.prefetch_record(p.hash),
            (true, true, false) => self.tables.v6.prefetch_bucket(p.hash),
            (true, true, true) => self.tables.v6.prefetch_record(p.hash),
        }
    }

    fn lookup<A: Family>(&self, c: &Class, ip: &Ip, h: u64) -> Option<u32> {
        if let Class::ToLocal { local, port } = *c {
            return self.port_owner(usize::from(local), port);
        }
        Self::key::<A>(c, ip).and_then(|k| A::table(&self.tables).find_hashed(&k, h))
    }

    /// The session holding FNAT local address `local`'s port `port`.
    pub(super) fn port_owner(&self, local: usize, port: u16) -> Option<u32> {
        self.ports.get(local).and_then(|p| p.owner.get(usize::from(port)).copied()).filter(|&o| o != 0).map(|o| o - 1)
    }

    /// Ends a session before its time: out of the table, its port freed.
    pub(super) fn end<A: Family>(&mut self, plane: &Plane, idx: u32) {
        let s = *A::table(&self.tables).get(idx);
        let nat = plane.services.get(usize::from(s.service)).is_some_and(|x| x.mode == L4Mode::Nat);
        A::table_mut(&mut self.tables).remove(idx, nat);
        release(&mut self.ports, &mut self.counters, &s);
    }

    /// A packet of a session whose real server went down under
    /// `on_server_down: reset`: a TCP sender gets a reset (an RST itself is
    /// just dropped). A packet from the client ends the session. One from
    /// the server leaves it, closing, for the client's next packet to be
    /// answered with its own reset: the client must learn too, and its next
    /// segment would otherwise find no session and be dropped unanswered.
    fn reset<A: Family>(&mut self, plane: &Plane, idx: u32, buf: &mut Buf<'_>, ip: &Ip, from_client: bool) -> Verdict {
        let svc = A::table(&self.tables).get(idx).service;
        if from_client {
            self.end::<A>(plane, idx);
        } else {
            let s = A::table_mut(&mut self.tables).get_mut(idx);
            s.state = State::Closing;
        }
        if ip.tcp_flags & TCP_RST == 0
            && let Some(n) = rewrite::tcp_reset(buf.frame_mut(), ip)
        {
            buf.len = n;
            if let Some(sc) = self.counters.services.get_mut(usize::from(svc)) {
                sc.resets += 1;
            }
            return Verdict::Forward;
        }
        Verdict::Drop(DropReason::NoHealthyServer)
    }

    /// Whether session `idx` is to be reset: its service resets sessions of
    /// servers that are down, and its server is.
    fn server_gone<A: Family>(&self, plane: &Plane, idx: u32) -> bool {
        if !plane.resetting {
            return false;
        }
        let s = A::table(&self.tables).get(idx);
        plane
            .services
            .get(usize::from(s.service))
            .is_some_and(|svc| svc.reset_on_down && !svc.reals.get(usize::from(s.real)).is_some_and(|r| r.up))
    }

    /// Processes one vector of frames at clock tick `now`.
    pub fn process(&mut self, plane: &Plane, bufs: &mut [Buf<'_>], verdicts: &mut Vec<Verdict>, now: u32) {
        verdicts.clear();
        self.next_hops.clear();
        // The records are borrowed by the stages below while they change
        // the worker: out of it meanwhile (no copy of a record per stage).
        let mut classes = std::mem::take(&mut self.classes);
        let mut probes = std::mem::take(&mut self.probes);
        let mut ips = std::mem::take(&mut self.ips);
        if ips.len() < bufs.len() {
            ips.resize(bufs.len(), Ip::EMPTY);
        }
        // 1. Parse (into the records, in place) and classify; 2. hash every
        // key.
        classes.clear();
        probes.clear();
        classes.extend(bufs.iter().zip(ips.iter_mut()).map(|(b, ip)| Self::classify(plane, b, ip)));
        probes.extend(classes.iter().zip(&ips).map(|(c, ip)| self.probe(c, ip)));
        // 3. Look every key up and 4. finish its packet (a session for a
        // miss, the rewrite), software-pipelined: packet i's bucket is asked
        // for, then the record of packet i - AHEAD (whose bucket has arrived
        // meanwhile), then packet i - 2·AHEAD is looked up and finished (its
        // record has arrived, and is used while it is still close). The
        // misses of a few dozen packets overlap, no more than the core can
        // keep in flight. A packet is looked up after the packets before it
        // are finished: it sees the sessions they created or ended (two
        // packets of a new flow in one vector make one session).
        const AHEAD: usize = 8;
        let n = classes.len();
        for i in 0..n + 2 * AHEAD {
            if let Some(&p) = probes.get(i) {
                self.prefetch(p, false);
            }
            if let Some(j) = i.checked_sub(AHEAD)
                && let Some(&p) = probes.get(j)
            {
                self.prefetch(p, true);
            }
            let Some(j) = i.checked_sub(2 * AHEAD) else { continue };
            let (Some(c), Some(&p), Some(ip), Some(buf)) = (classes.get(j), probes.get(j), ips.get(j), bufs.get_mut(j))
            else {
                continue;
            };
            let v6 = p.v6;
            let hit = if v6 { self.lookup::<u128>(c, ip, p.hash) } else { self.lookup::<u32>(c, ip, p.hash) };
            let v = if v6 {
                self.finish::<u128>(plane, buf, c, ip, hit, now)
            } else {
                self.finish::<u32>(plane, buf, c, ip, hit, now)
            };
            match v {
                Verdict::Drop(d) => self.counters.drops[d.index()] += 1,
                Verdict::Pass => self.counters.passed += 1,
                Verdict::Forward => {}
            }
            verdicts.push(v);
            self.next_hops.push(self.hop.take());
        }
        self.classes = classes;
        self.probes = probes;
        self.ips = ips;
        // 6. Expire a slice of each table.
        let is_nat = |svc: u16| plane.services.get(usize::from(svc)).is_some_and(|s| s.mode == L4Mode::Nat);
        let (ports, counters) = (&mut self.ports, &mut self.counters);
        self.tables.v4.sweep(now, 64, |s| is_nat(s.service), |_, s| release(ports, counters, s));
        self.tables.v6.sweep(now, 16, |s| is_nat(s.service), |_, s| release(ports, counters, s));
    }

    /// Finishes a frame of class `c` (and IP details `ip`, for the classes
    /// of IP packets), `hit` being its session if the lookup found one.
    fn finish<A: Family>(
        &mut self,
        plane: &Plane,
        buf: &mut Buf<'_>,
        c: &Class,
        ip: &Ip,
        hit: Option<u32>,
        now: u32,
    ) -> Verdict {
        match *c {
            Class::Done(v) => v,
            Class::ArpFor { at, addr } => {
                if crate::neighbour::arp_reply(buf.frame_mut(), at, addr, plane.mac) {
                    self.counters.answered += 1;
                    Verdict::Forward
                } else {
                    Verdict::Pass
                }
            }
            Class::NdFor { addr } => {
                let request = buf.frame().to_vec();
                let room = buf.mem.len() - buf.head;
                match crate::neighbour::nd_advert(
                    &request,
                    ip,
                    addr,
                    plane.mac,
                    &mut buf.mem[buf.head..buf.head + room],
                ) {
                    Some(n) => {
                        buf.len = n;
                        self.counters.answered += 1;
                        Verdict::Forward
                    }
                    None => Verdict::Pass,
                }
            }
            Class::IcmpError => self.icmp_error::<A>(plane, buf, ip),
            Class::Outbound { rule } => self.snat_out::<A>(plane, rule, buf, ip, hit, now),
            Class::ToService { svc } => {
                let service = &plane.services[usize::from(svc)];
                let tcp = service.proto == PROTO_TCP;
                let syn = ip.tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
                let mut found = hit;
                if let Some(idx) = found {
                    if tcp && syn && A::table(&self.tables).get(idx).state == State::Closing {
                        // A new connection from the port of one that is
                        // ending (clients reuse ports sooner than the session
                        // times out): scheduled afresh, as IPVS does.
                        self.end::<A>(plane, idx);
                        found = None;
                    } else if self.server_gone::<A>(plane, idx) {
                        if tcp && !syn {
                            return self.reset::<A>(plane, idx, buf, ip, true);
                        }
                        // A datagram, or a SYN again: to a server that is up.
                        self.end::<A>(plane, idx);
                        found = None;
                    }
                }
                if let Some(idx) = found
                    && A::table(&self.tables).get(idx).flags & PROXIED != 0
                    && let Some(v) = self.proxied_in::<A>(plane, idx, buf, ip)
                {
                    return v;
                }
                let idx = match found {
                    Some(idx) => idx,
                    None if tcp && syn && self.syn_proxy_on(service, svc, now) => {
                        return self.answer_syn(plane, svc, buf, ip, now);
                    }
                    None if tcp
                        && !syn
                        && let Some(v) = self.cookie_ack::<A>(plane, svc, buf, ip, now) =>
                    {
                        return v;
                    }
                    None => {
                        // Only a SYN (or a datagram) starts a session; with
                        // Maglev, where the server follows from the flow
                        // alone, any segment but an RST picks its connection
                        // up (after a restart, or from another balancer),
                        // unless FNAT's source port (chosen per process)
                        // would differ.
                        let pickup = tcp
                            && ip.tcp_flags & (TCP_RST | TCP_SYN) == 0
                            && service.scheduler == L4Scheduler::Maglev
                            && service.mode != L4Mode::Fnat;
                        if tcp && ip.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN && !pickup {
                            return Verdict::Drop(DropReason::NoSession);
                        }
                        match self.create::<A>(plane, svc, ip, now) {
                            Ok(idx) if pickup => {
                                // Left as created (SYN sent, its timeout) and
                                // established only at its next packet: a flood
                                // of stray segments holds the table for the
                                // SYN timeout, not the established one.
                                let s = *A::table(&self.tables).get(idx);
                                return self.forward_to_real::<A>(plane, svc, s, ip, buf);
                            }
                            Ok(idx) => idx,
                            Err(d) => return Verdict::Drop(d),
                        }
                    }
                };
                self.track::<A>(plane, idx, ip, now);
                let s = *A::table(&self.tables).get(idx);
                let v = self.forward_to_real::<A>(plane, svc, s, ip, buf);
                if v == Verdict::Forward && s.flags & PROXIED != 0 {
                    self.proxied_out::<A>(idx, buf, ip);
                }
                v
            }
            Class::FromReal { svc, .. } => {
                let Some(idx) = hit else { return Verdict::Drop(DropReason::NoSession) };
                if self.server_gone::<A>(plane, idx) {
                    return self.reset::<A>(plane, idx, buf, ip, false);
                }
                let service = &plane.services[usize::from(svc)];
                self.back_to_client::<A>(plane, service, idx, buf, ip, now, None)
            }
            Class::ToLocal { .. } => {
                let Some(idx) = hit else { return Verdict::Drop(DropReason::NoSession) };
                // The port table is shared by the families: the session is in
                // the table of the client's family, which may differ from the
                // reply's (an IPv6 VIP in front of IPv4 servers).
                let (s_client, s_port, s_service) = match self.session_any(idx, ip.flow.src.is_ipv6()) {
                    Some(x) => x,
                    None => return Verdict::Drop(DropReason::NoSession),
                };
                if super::snat::is_snat(s_service) {
                    return self.snat_back::<A>(plane, idx, buf, ip, now);
                }
                let Some(service) = plane.services.get(usize::from(s_service)) else {
                    return Verdict::Drop(DropReason::NoSession);
                };
                if s_client.is_ipv4() != ip.flow.src.is_ipv4() {
                    // Family translation is not done by this pipeline.
                    return Verdict::Drop(DropReason::Unsupported);
                }
                if self.server_gone::<A>(plane, idx) {
                    return self.reset::<A>(plane, idx, buf, ip, false);
                }
                self.back_to_client::<A>(plane, service, idx, buf, ip, now, Some((s_client, s_port)))
            }
        }
    }

    /// A real server's packet of session `idx` on its way back (NAT and
    /// FNAT replies): a proxied session's handshake is the SYN proxy's;
    /// otherwise the session is tracked and the packet rewritten to come
    /// from the VIP (and go to `to`, for FNAT), its sequence number shifted
    /// for a proxied session.
    #[allow(clippy::too_many_arguments)]
    fn back_to_client<A: Family>(
        &mut self,
        plane: &Plane,
        service: &Service,
        idx: u32,
        buf: &mut Buf<'_>,
        ip: &Ip,
        now: u32,
        to: Option<(IpAddr, u16)>,
    ) -> Verdict {
        let proxied = A::table(&self.tables).get(idx).flags & PROXIED != 0;
        if proxied && let Some(v) = self.proxied_reply::<A>(plane, idx, buf, ip, now) {
            return v;
        }
        self.track::<A>(plane, idx, ip, now);
        let f = buf.frame_mut();
        if !rewrite::nat(f, ip, Some((service.vip, service.port)), to) {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        rewrite::set_macs(f, plane.next_hop_mac, plane.mac);
        if proxied {
            self.proxied_back::<A>(idx, buf, ip);
        }
        Verdict::Forward
    }

    /// The client, client port and service of session `idx` in the table of
    /// the given family.
    fn session_any(&self, idx: u32, v6: bool) -> Option<(IpAddr, u16, u16)> {
        if v6 {
            (idx < self.tables.v6.capacity() as u32).then(|| {
                let s = self.tables.v6.get(idx);
                (s.client.ip(), s.client_port, s.service)
            })
        } else {
            (idx < self.tables.v4.capacity() as u32).then(|| {
                let s = self.tables.v4.get(idx);
                (s.client.ip(), s.client_port, s.service)
            })
        }
    }

    /// Picks a real server and records the session.
    pub(super) fn create<A: Family>(&mut self, plane: &Plane, svc: u16, ip: &Ip, now: u32) -> Result<u32, DropReason> {
        let service = &plane.services[usize::from(svc)];
        let sc = &self.counters.services[usize::from(svc)];
        let view = View { reals: &service.reals, active: &sc.per_real_active };
        let real = match &mut self.scheds[usize::from(svc)] {
            Sched::Rr(s) => s.pick(&view),
            Sched::Wrr(s) => s.pick(&view),
            Sched::Wlc(s) => s.pick(&view),
            Sched::Maglev => service.maglev.as_ref().and_then(|m| m.pick(flow_hash(&ip.flow), &view)),
        }
        .ok_or(DropReason::NoHealthyServer)? as u16;
        // NAT and FNAT rewrite addresses in place: no family change.
        if matches!(service.mode, L4Mode::Nat | L4Mode::Fnat)
            && service.reals[usize::from(real)].addr.is_ipv4() != ip.flow.src.is_ipv4()
        {
            return Err(DropReason::Unsupported);
        }
        let state = if service.proto == PROTO_TCP { State::SynSent } else { State::Datagram };
        let mut s = Session {
            client: A::of(ip.flow.src),
            client_port: ip.flow.sport,
            service: svc,
            real,
            local: u16::MAX,
            local_port: 0,
            state,
            flags: 0,
            expires: now.saturating_add(service.timeouts[state as usize]),
        };
        if service.mode == L4Mode::Fnat {
            // A local address of the real server's family with a free port on this core.
            let real_v4 = service.reals[usize::from(real)].addr.is_ipv4();
            let local = (0..plane.fnat_locals.min(self.ports.len()))
                .find(|&l| plane.local_addrs[l].is_ipv4() == real_v4 && !self.ports[l].free.is_empty())
                .ok_or(DropReason::PortsExhausted)?;
            let port = self.ports[local].take().ok_or(DropReason::PortsExhausted)?;
            s.local = local as u16;
            s.local_port = port;
        }
        let idx = match A::table_mut(&mut self.tables).insert(s, service.mode == L4Mode::Nat) {
            Ok(idx) => idx,
            Err(_) => {
                if s.local != u16::MAX {
                    self.ports[usize::from(s.local)].free.push(s.local_port);
                }
                return Err(DropReason::TableFull);
            }
        };
        if s.local != u16::MAX {
            self.ports[usize::from(s.local)].owner[usize::from(s.local_port)] = idx + 1;
        }
        let sc = &mut self.counters.services[usize::from(svc)];
        sc.sessions_total += 1;
        sc.sessions_active += 1;
        if let Some(a) = sc.per_real_active.get_mut(usize::from(real)) {
            *a += 1;
        }
        // TCP sessions go to the peer once established (a SYN flood is not
        // synced); datagram sessions at once.
        if state == State::Datagram {
            self.export::<A>(plane, idx, now);
        }
        Ok(idx)
    }

    /// TCP state and expiry from a packet of the session.
    ///
    /// The record is written only when something changed: most packets of
    /// a flow arrive within one tick of the coarse clock, and a record left
    /// clean is not written back to memory when the cache evicts it (with
    /// millions of sessions, nearly every record read is a miss).
    pub(super) fn track<A: Family>(&mut self, plane: &Plane, idx: u32, ip: &Ip, now: u32) {
        let s = A::table_mut(&mut self.tables).get_mut(idx);
        let mut state = s.state;
        if ip.flow.proto == PROTO_TCP {
            let f = ip.tcp_flags;
            if f & (TCP_FIN | TCP_RST) != 0 {
                state = State::Closing;
            } else if state == State::SynSent && f & TCP_ACK != 0 {
                state = State::Established;
            }
        }
        let timeout = plane.timeouts_of(s.service)[state as usize];
        let expires = now.saturating_add(timeout);
        if state != s.state || expires != s.expires {
            let changed = state != s.state;
            s.state = state;
            s.expires = expires;
            if changed && self.sync.is_some() {
                self.export::<A>(plane, idx, now);
            }
        }
    }

    /// Counts a client's packet and sends it on toward its real server.
    fn forward_to_real<A: Family>(
        &mut self,
        plane: &Plane,
        svc: u16,
        s: Session<A>,
        ip: &Ip,
        buf: &mut Buf<'_>,
    ) -> Verdict {
        let sc = &mut self.counters.services[usize::from(svc)];
        sc.packets += 1;
        sc.bytes += buf.len as u64;
        if let Some(p) = sc.per_real_packets.get_mut(usize::from(s.real)) {
            *p += 1;
        }
        self.toward_real(plane, &plane.services[usize::from(svc)], &s, ip, buf)
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

/// The Maglev key of a flow: its 5-tuple, hashed the same way by every
/// worker of every Gatehouse, so that a flow lands on the same real server
/// whichever balancer (behind ECMP) or process (after a restart) sees it.
fn flow_hash(f: &packet::Flow) -> u64 {
    use gatehouse_balance::hash::fmix64;
    let (s, d) = (addr_key(f.src), addr_key(f.dst));
    let ports = u64::from(f.sport) << 32 | u64::from(f.dport) << 16 | u64::from(f.proto);
    [(s >> 64) as u64, s as u64, (d >> 64) as u64, d as u64, ports]
        .iter()
        .fold(0x5bd1_e995_1b87_3593, |h, &w| fmix64(h ^ w))
}
