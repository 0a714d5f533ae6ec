//! A core's sessions and what they hold: the session tables of both
//! families, the FNAT and SNAT port pools, the schedulers that pick a
//! session's real server, the core's counters, and the queue of sessions
//! for the peer balancer. Every feature of the pipeline (services, SNAT,
//! the SYN proxy, ICMP errors, sync) creates, tracks and ends sessions
//! through this state; none of them needs the worker that runs them.

use std::net::IpAddr;

use gatehouse_balance::{Backends, LeastConnections, RoundRobin, SmoothWeighted};
use gatehouse_config::{L4Mode, L4Scheduler};

use super::counters::{Counters, ServiceCounters};
use super::family::{Family, Tables};
use super::fnat::{PortPool, release};
use super::snat_rules::{snat_key, snat_key_for};
use super::sync::{CommitError, SyncOut, push_record};
use super::{DropReason, Endpoint, Plane, Real, addr_key};
use crate::session::{Session, State, Table};
use crate::sync::Record;
use gatehouse_wire::packet::{self, Ip, PROTO_TCP, TCP_ACK, TCP_FIN, TCP_RST};

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

/// One core's sessions.
pub(super) struct Sessions {
    pub(super) core: u16,
    pub(super) tables: Tables,
    pub(super) ports: Vec<PortPool>,
    scheds: Vec<Sched>,
    pub(super) counters: Counters,
    /// Session sync with the peer balancer, when on.
    sync: Option<Box<SyncOut>>,
}

impl Sessions {
    pub(super) fn new(plane: &Plane, core: u16, v4: usize, v6: usize, seed: u64) -> Sessions {
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
        Sessions {
            core,
            tables: Tables { v4: Table::new(v4, seed), v6: Table::new(v6, seed.rotate_left(17)) },
            ports: plane.local_ports.iter().map(|&range| PortPool::new(core, plane.cores, range)).collect(),
            scheds,
            counters,
            sync: None,
        }
    }

    /// Grows the schedulers and counters for a plane whose services and
    /// real servers extend the ones before (see [`Plane::extends`]).
    pub(super) fn adopt(&mut self, plane: &Plane) {
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

    /// Expires a slice of each table.
    pub(super) fn sweep(&mut self, plane: &Plane, now: u32) {
        let is_nat = |svc: u16| plane.services.get(usize::from(svc)).is_some_and(|s| s.mode == L4Mode::Nat);
        let (ports, counters) = (&mut self.ports, &mut self.counters);
        self.tables.v4.sweep(now, 64, |s| is_nat(s.service), |_, s| release(ports, counters, s));
        self.tables.v6.sweep(now, 16, |s| is_nat(s.service), |_, s| release(ports, counters, s));
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

    /// Whether session `idx` is to be reset: its service resets sessions of
    /// servers that are down, and its server is.
    pub(super) fn server_gone<A: Family>(&self, plane: &Plane, idx: u32) -> bool {
        if !plane.resetting {
            return false;
        }
        let s = A::table(&self.tables).get(idx);
        plane
            .services
            .get(usize::from(s.service))
            .is_some_and(|svc| svc.reset_on_down && !svc.reals.get(usize::from(s.real)).is_some_and(|r| r.up))
    }

    /// The client, client port and service of session `idx` in the table of
    /// the given family.
    pub(super) fn session_any(&self, idx: u32, v6: bool) -> Option<(IpAddr, u16, u16)> {
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
                .find(|&l| plane.local_addrs[l].is_ipv4() == real_v4 && self.ports[l].has_free())
                .ok_or(DropReason::PortsExhausted)?;
            let port = self.ports[local].take().ok_or(DropReason::PortsExhausted)?;
            s.local = local as u16;
            s.local_port = port;
        }
        let idx = match A::table_mut(&mut self.tables).insert(s, service.mode == L4Mode::Nat) {
            Ok(idx) => idx,
            Err(_) => {
                if s.local != u16::MAX {
                    self.ports[usize::from(s.local)].put_back(s.local_port);
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

    /// Queues session `idx` for the peer (when syncing).
    pub(super) fn export<A: Family>(&mut self, plane: &Plane, idx: u32, now: u32) {
        let s = *A::table(&self.tables).get(idx);
        if let Some(out) = self.sync.as_deref_mut() {
            push_record(out, plane, &s, now);
        }
    }

    /// A new mapping: an address of the rule in the packet's family with a
    /// free port on this core.
    pub(super) fn snat_map<A: Family>(
        &mut self,
        plane: &Plane,
        rule: u16,
        ip: &Ip,
        now: u32,
    ) -> Result<u32, DropReason> {
        let r = plane.snat.get(usize::from(rule)).ok_or(DropReason::NoService)?;
        let v4 = ip.flow.src.is_ipv4();
        let local = r
            .addrs
            .iter()
            .map(|&l| usize::from(l))
            .find(|&l| {
                plane.local_addrs.get(l).is_some_and(|a| a.is_ipv4() == v4)
                    && self.ports.get(l).is_some_and(|p| p.has_free())
            })
            .ok_or(DropReason::PortsExhausted)?;
        let port = self.ports[local].take().ok_or(DropReason::PortsExhausted)?;
        let key = snat_key::<A>(rule, ip);
        let state = if ip.flow.proto == PROTO_TCP { State::SynSent } else { State::Datagram };
        let s = Session {
            client: key.addr,
            client_port: key.port,
            service: key.context,
            real: 0,
            local: local as u16,
            local_port: port,
            state,
            flags: 0,
            expires: now.saturating_add(r.timeouts[state as usize]),
        };
        let idx = match A::table_mut(&mut self.tables).insert(s, false) {
            Ok(i) => i,
            Err(_) => {
                self.ports[local].put_back(port);
                return Err(DropReason::TableFull);
            }
        };
        self.ports[local].owner[usize::from(port)] = idx + 1;
        self.counters.snat_mut(rule).sessions_total += 1;
        // Synced as services' sessions are: UDP at once, TCP once established.
        if state == State::Datagram {
            self.export::<A>(plane, idx, now);
        }
        Ok(idx)
    }
}

/// Session sync: the queue for the peer and synced sessions committed here.
impl Sessions {
    /// Starts recording sessions for the peer, at most `cap` waiting.
    pub(super) fn enable_sync(&mut self, cap: usize, tick: std::time::Duration) {
        self.sync = Some(Box::new(SyncOut::new(cap, tick)));
    }

    pub(super) fn sync_out(&mut self) -> Option<&mut SyncOut> {
        self.sync.as_deref_mut()
    }

    /// Record slots a full walk visits.
    pub(super) fn sync_slots(&self) -> usize {
        self.tables.v4.capacity() + self.tables.v6.capacity()
    }

    /// Asks for a full pass over the tables (a peer joined): the next walks
    /// go on until every slot has been visited once.
    pub(super) fn start_bulk(&mut self) {
        let slots = self.sync_slots();
        if let Some(out) = self.sync.as_deref_mut() {
            out.bulk_left = slots;
        }
    }

    /// Slots left in the full pass under way (0: none).
    pub(super) fn bulk_left(&self) -> usize {
        self.sync.as_ref().map_or(0, |o| o.bulk_left)
    }

    /// Visits up to `budget` record slots from where the walk stopped and
    /// queues the established and UDP sessions there for the peer; returns
    /// how many it queued. Walked in full every `refresh`, it keeps the
    /// peer's copies from expiring while the sessions live.
    pub(super) fn sync_walk(&mut self, plane: &Plane, now: u32, budget: usize) -> usize {
        let Some(out) = self.sync.as_deref_mut() else { return 0 };
        out.walk(&self.tables, plane, now, budget)
    }

    /// The sessions this core owns, as records for the process that takes
    /// over from this one.
    pub(super) fn export_all(&self, plane: &Plane, now: u32, out: &mut Vec<Record>) {
        let tick_ms = self.sync.as_ref().map_or(1000, |o| o.tick_ms);
        super::sync::export(&self.tables, plane, now, tick_ms, out);
    }

    /// Puts a session synced from the peer into this core's tables (or
    /// refreshes it if it is there). Every core of an interface is given
    /// every session, because the NIC, not the session, decides which core
    /// sees a client's packets. One of them owns it: for FNAT the core that
    /// owns its local port (replies are steered there), else core 0. The
    /// owner holds the port and counts the session; the others keep an
    /// uncounted copy.
    pub(super) fn commit(&mut self, plane: &Plane, r: &Record, now: u32) -> Result<(), CommitError> {
        if r.client.is_ipv4() { self.commit_in::<u32>(plane, r, now) } else { self.commit_in::<u128>(plane, r, now) }
    }

    fn commit_in<A: Family>(&mut self, plane: &Plane, r: &Record, now: u32) -> Result<(), CommitError> {
        let (svc, real, local, local_port, nat) = if r.vip_port == 0 {
            // An SNAT mapping (see `push_record`).
            let rule = plane.snat_rule(r.client).ok_or(CommitError::NoService)?;
            let (a, p) = r.local.ok_or(CommitError::NoLocal)?;
            let local = plane.local_addrs.iter().position(|x| *x == a).ok_or(CommitError::NoLocal)? as u16;
            if !plane.snat[usize::from(rule)].addrs.contains(&local) {
                return Err(CommitError::NoLocal);
            }
            let key = snat_key_for(rule, r.proto);
            (key, 0, local, p, false)
        } else {
            let svc = *plane.by_vip.get(&Endpoint::new(r.vip, r.vip_port, r.proto)).ok_or(CommitError::NoService)?;
            let service = &plane.services[usize::from(svc)];
            let real = service
                .reals
                .iter()
                .position(|x| x.addr == r.real && x.port == r.real_port)
                .ok_or(CommitError::NoReal)? as u16;
            let (local, local_port) = match (service.mode, r.local) {
                (L4Mode::Fnat, Some((a, p))) => {
                    (plane.local_addrs.iter().position(|x| *x == a).ok_or(CommitError::NoLocal)? as u16, p)
                }
                (L4Mode::Fnat, None) | (_, Some(_)) => return Err(CommitError::NoLocal),
                _ => (u16::MAX, 0),
            };
            (svc, real, local, local_port, service.mode == L4Mode::Nat)
        };
        // FNAT replies come to the core that owns the port; for the other
        // modes one core counts the session.
        let owner = if local == u16::MAX { self.core == 0 } else { local_port % plane.cores == self.core };
        let out = self.sync.as_ref().map_or(1000, |o| o.tick_ms);
        let ticks = (u64::from(r.ttl) * 1000 / out).min(u64::from(plane.timeouts_of(svc)[r.state as usize])) as u32;
        let s = Session {
            client: A::of(r.client),
            client_port: r.client_port,
            service: svc,
            real,
            local,
            local_port,
            state: r.state,
            flags: if owner { 0 } else { crate::session::COPY },
            expires: now.saturating_add(ticks),
        };
        if let Some(idx) = A::table(&self.tables).find(&s.forward_key()) {
            let cur = A::table_mut(&mut self.tables).get_mut(idx);
            if (cur.real, cur.local, cur.local_port) == (s.real, s.local, s.local_port) {
                cur.state = s.state;
                cur.expires = cur.expires.max(s.expires);
                return Ok(());
            }
            // The peer moved it (its client reused the port): the newer wins.
            self.end::<A>(plane, idx);
        }
        let copy = s.flags & crate::session::COPY != 0;
        let port_slot = (!copy && local != u16::MAX).then(|| (usize::from(local), usize::from(local_port)));
        if let Some((l, p)) = port_slot
            && self.ports.get(l).is_some_and(|pool| pool.owner[p] != 0)
        {
            return Err(CommitError::PortTaken);
        }
        let idx = A::table_mut(&mut self.tables).insert(s, nat).map_err(|_| CommitError::Full)?;
        if let Some((l, p)) = port_slot
            && let Some(pool) = self.ports.get_mut(l)
        {
            pool.owner[p] = idx + 1;
        }
        if !copy && let Some(sc) = self.counters.services.get_mut(usize::from(svc)) {
            sc.sessions_active += 1;
            if let Some(a) = sc.per_real_active.get_mut(usize::from(real)) {
                *a += 1;
            }
        }
        Ok(())
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
