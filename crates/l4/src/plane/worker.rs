//! One core's pipeline. Each frame is parsed and classified (to a service,
//! as a reply of a NAT session, to an FNAT local port, or not for the
//! plane), and its session key hashed, for the whole vector first; then the
//! lookups run software-pipelined (see [`Worker::process`]), each packet
//! finished as soon as its session record is at hand: a new session
//! scheduled for a first packet, the rewrite for its mode, the verdict.

use std::net::{IpAddr, Ipv4Addr};

use gatehouse_config::{L4Mode, L4Scheduler, SynProxyMode};

use super::counters::Counters;
use super::family::Family;
use super::forward::Forwarder;
use super::sessions::Sessions;
use super::snat_rules::{is_snat, snat_key};
use super::sync::{CommitError, SyncOut};
use super::synproxy::{self, ProxyState};
use super::{Buf, DropReason, Endpoint, Plane, Service, VECTOR, Verdict, icmp, snat};
use crate::rewrite;
use crate::session::{Key, PROXIED, REVERSE, Session, State};
use crate::sync::Record;
use gatehouse_wire::packet::{self, Ip, PROTO_TCP, PROTO_UDP, Parsed, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};

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

/// One core's pipeline and the sessions it runs.
pub struct Worker {
    pub(super) sessions: Sessions,
    fwd: Forwarder,
    classes: Vec<Class>,
    /// The IP details of each frame of the vector, parsed in place.
    ips: Vec<Ip>,
    probes: Vec<Probe>,
    /// By frame of the last vector: the neighbour a forwarded frame must
    /// go to when it is not its (outer) destination address: the real
    /// server in DR mode, whose packets keep the VIP as destination.
    pub next_hops: Vec<Option<IpAddr>>,
    /// The SYN proxy's state, once a service used it.
    proxy: Option<Box<ProxyState>>,
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
        Worker {
            sessions: Sessions::new(plane, core, v4, v6, seed),
            fwd: Forwarder::new(),
            classes: Vec::with_capacity(VECTOR),
            ips: Vec::with_capacity(VECTOR),
            probes: Vec::with_capacity(VECTOR),
            next_hops: Vec::with_capacity(VECTOR),
            proxy: None,
        }
    }

    /// The core this worker runs on.
    pub fn core(&self) -> u16 {
        self.sessions.core
    }

    /// What this core counted.
    pub fn counters(&self) -> &Counters {
        &self.sessions.counters
    }

    /// Takes a new plane whose services and real servers extend this
    /// worker's (appended at the end, the ones before unchanged: see
    /// [`Plane::extends`]): the session tables are kept, counters and
    /// schedulers grow.
    pub fn adopt(&mut self, plane: &Plane) {
        self.sessions.adopt(plane);
    }

    pub fn sessions(&self) -> usize {
        self.sessions.tables.v4.len() + self.sessions.tables.v6.len()
    }

    /// Bytes held by this core's session tables.
    pub fn table_bytes(&self) -> usize {
        self.sessions.tables.v4.memory_bytes() + self.sessions.tables.v6.memory_bytes()
    }

    /// Starts recording sessions for the peer, at most `cap` waiting.
    pub fn enable_sync(&mut self, cap: usize, tick: std::time::Duration) {
        self.sessions.enable_sync(cap, tick);
    }

    /// The records waiting for the peer, when syncing.
    pub fn sync_out(&mut self) -> Option<&mut SyncOut> {
        self.sessions.sync_out()
    }

    /// Record slots a full walk visits.
    pub fn sync_slots(&self) -> usize {
        self.sessions.sync_slots()
    }

    /// Asks for a full pass over the tables (a peer joined).
    pub fn start_bulk(&mut self) {
        self.sessions.start_bulk();
    }

    /// Slots left in the full pass under way (0: none).
    pub fn bulk_left(&self) -> usize {
        self.sessions.bulk_left()
    }

    /// Visits up to `budget` record slots from where the walk stopped and
    /// queues the established and UDP sessions there for the peer; returns
    /// how many it queued. Walked in full every `refresh`, it keeps the
    /// peer's copies from expiring while the sessions live.
    pub fn sync_walk(&mut self, plane: &Plane, now: u32, budget: usize) -> usize {
        self.sessions.sync_walk(plane, now, budget)
    }

    /// Every session this core owns, as records (a takeover hands them to
    /// the new process, whose workers [`Worker::commit`] them all). Proxied
    /// sessions are left out: their sequence-number translation is not in
    /// a record.
    pub fn export(&self, plane: &Plane, now: u32, out: &mut Vec<Record>) {
        self.sessions.export_all(plane, now, out);
    }

    /// Puts a session synced from the peer into this core's tables (or
    /// refreshes it). Every core of an interface is given every session;
    /// one of them owns it (holds its FNAT port and counts it).
    pub fn commit(&mut self, plane: &Plane, r: &Record, now: u32) -> Result<(), CommitError> {
        self.sessions.commit(plane, r, now)
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
            Class::Outbound { rule } => Some(snat_key::<A>(rule, ip)),
            _ => None,
        }
    }

    fn hash_of<A: Family>(&self, c: &Class, ip: &Ip) -> u64 {
        Self::key::<A>(c, ip).map_or(0, |k| A::table(&self.sessions.tables).hash(&k))
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
            (true, false, false) => self.sessions.tables.v4.prefetch_bucket(p.hash),
            (true, false, true) => self.sessions.tables.v4.prefetch_record(p.hash),
            (true, true, false) => self.sessions.tables.v6.prefetch_bucket(p.hash),
            (true, true, true) => self.sessions.tables.v6.prefetch_record(p.hash),
        }
    }

    fn lookup<A: Family>(&self, c: &Class, ip: &Ip, h: u64) -> Option<u32> {
        if let Class::ToLocal { local, port } = *c {
            return self.sessions.port_owner(usize::from(local), port);
        }
        Self::key::<A>(c, ip).and_then(|k| A::table(&self.sessions.tables).find_hashed(&k, h))
    }

    /// A packet of a session whose real server went down under
    /// `on_server_down: reset`: a TCP sender gets a reset (an RST itself is
    /// just dropped). A packet from the client ends the session. One from
    /// the server leaves it, closing, for the client's next packet to be
    /// answered with its own reset: the client must learn too, and its next
    /// segment would otherwise find no session and be dropped unanswered.
    fn reset<A: Family>(&mut self, plane: &Plane, idx: u32, buf: &mut Buf<'_>, ip: &Ip, from_client: bool) -> Verdict {
        let svc = A::table(&self.sessions.tables).get(idx).service;
        if from_client {
            self.sessions.end::<A>(plane, idx);
        } else {
            let s = A::table_mut(&mut self.sessions.tables).get_mut(idx);
            s.state = State::Closing;
        }
        if ip.tcp_flags & TCP_RST == 0
            && let Some(n) = rewrite::tcp_reset(buf.frame_mut(), ip)
        {
            buf.len = n;
            if let Some(sc) = self.sessions.counters.services.get_mut(usize::from(svc)) {
                sc.resets += 1;
            }
            return Verdict::Forward;
        }
        Verdict::Drop(DropReason::NoHealthyServer)
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
                Verdict::Drop(d) => self.sessions.counters.drops[d.index()] += 1,
                Verdict::Pass => self.sessions.counters.passed += 1,
                Verdict::Forward => {}
            }
            verdicts.push(v);
            self.next_hops.push(self.fwd.hop.take());
        }
        self.classes = classes;
        self.probes = probes;
        self.ips = ips;
        // 6. Expire a slice of each table.
        self.sessions.sweep(plane, now);
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
                    self.sessions.counters.answered += 1;
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
                        self.sessions.counters.answered += 1;
                        Verdict::Forward
                    }
                    None => Verdict::Pass,
                }
            }
            Class::IcmpError => icmp::error::<A>(&self.sessions, &mut self.fwd, plane, buf, ip),
            Class::Outbound { rule } => snat::out::<A>(&mut self.sessions, plane, rule, buf, ip, hit, now),
            Class::ToService { svc } => {
                let service = &plane.services[usize::from(svc)];
                let tcp = service.proto == PROTO_TCP;
                let syn = ip.tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
                let mut found = hit;
                if let Some(idx) = found {
                    if tcp && syn && A::table(&self.sessions.tables).get(idx).state == State::Closing {
                        // A new connection from the port of one that is
                        // ending (clients reuse ports sooner than the session
                        // times out): scheduled afresh, as IPVS does.
                        self.sessions.end::<A>(plane, idx);
                        found = None;
                    } else if self.sessions.server_gone::<A>(plane, idx) {
                        if tcp && !syn {
                            return self.reset::<A>(plane, idx, buf, ip, true);
                        }
                        // A datagram, or a SYN again: to a server that is up.
                        self.sessions.end::<A>(plane, idx);
                        found = None;
                    }
                }
                if let Some(idx) = found
                    && A::table(&self.sessions.tables).get(idx).flags & PROXIED != 0
                    && let Some(v) =
                        ProxyState::of(&mut self.proxy).proxied_in::<A>(&mut self.sessions, plane, idx, buf, ip)
                {
                    return v;
                }
                let idx = match found {
                    Some(idx) => idx,
                    // The proxy's state is made only for a service that uses it.
                    None if tcp
                        && syn
                        && service.syn_proxy != SynProxyMode::Off
                        && ProxyState::of(&mut self.proxy).syn_proxy_on(service, svc, now) =>
                    {
                        return synproxy::answer_syn(&mut self.sessions, plane, svc, buf, ip, now);
                    }
                    None if tcp
                        && !syn
                        && service.syn_proxy != SynProxyMode::Off
                        && let Some(v) = ProxyState::of(&mut self.proxy).cookie_ack::<A>(
                            &mut self.sessions,
                            plane,
                            svc,
                            buf,
                            ip,
                            now,
                        ) =>
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
                        match self.sessions.create::<A>(plane, svc, ip, now) {
                            Ok(idx) if pickup => {
                                // Left as created (SYN sent, its timeout) and
                                // established only at its next packet: a flood
                                // of stray segments holds the table for the
                                // SYN timeout, not the established one.
                                let s = *A::table(&self.sessions.tables).get(idx);
                                return self.forward_to_real::<A>(plane, svc, s, ip, buf);
                            }
                            Ok(idx) => idx,
                            Err(d) => return Verdict::Drop(d),
                        }
                    }
                };
                self.sessions.track::<A>(plane, idx, ip, now);
                let s = *A::table(&self.sessions.tables).get(idx);
                let v = self.forward_to_real::<A>(plane, svc, s, ip, buf);
                if v == Verdict::Forward && s.flags & PROXIED != 0 {
                    ProxyState::of(&mut self.proxy).proxied_out::<A>(&self.sessions, idx, buf, ip);
                }
                v
            }
            Class::FromReal { svc, .. } => {
                let Some(idx) = hit else { return Verdict::Drop(DropReason::NoSession) };
                if self.sessions.server_gone::<A>(plane, idx) {
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
                let (s_client, s_port, s_service) = match self.sessions.session_any(idx, ip.flow.src.is_ipv6()) {
                    Some(x) => x,
                    None => return Verdict::Drop(DropReason::NoSession),
                };
                if is_snat(s_service) {
                    return snat::back::<A>(&mut self.sessions, plane, idx, buf, ip, now);
                }
                let Some(service) = plane.services.get(usize::from(s_service)) else {
                    return Verdict::Drop(DropReason::NoSession);
                };
                if s_client.is_ipv4() != ip.flow.src.is_ipv4() {
                    // Family translation is not done by this pipeline.
                    return Verdict::Drop(DropReason::Unsupported);
                }
                if self.sessions.server_gone::<A>(plane, idx) {
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
        let proxied = A::table(&self.sessions.tables).get(idx).flags & PROXIED != 0;
        if proxied
            && let Some(v) =
                ProxyState::of(&mut self.proxy).proxied_reply::<A>(&mut self.sessions, plane, idx, buf, ip, now)
        {
            return v;
        }
        self.sessions.track::<A>(plane, idx, ip, now);
        let f = buf.frame_mut();
        if !rewrite::nat(f, ip, Some((service.vip, service.port)), to) {
            return Verdict::Drop(DropReason::TtlExceeded);
        }
        rewrite::set_macs(f, plane.next_hop_mac, plane.mac);
        if proxied {
            ProxyState::of(&mut self.proxy).proxied_back::<A>(&self.sessions, idx, buf, ip);
        }
        Verdict::Forward
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
        let sc = &mut self.sessions.counters.services[usize::from(svc)];
        sc.packets += 1;
        sc.bytes += buf.len as u64;
        if let Some(p) = sc.per_real_packets.get_mut(usize::from(s.real)) {
            *p += 1;
        }
        self.fwd.toward_real(plane, &plane.services[usize::from(svc)], &s, ip, buf)
    }
}
