//! A core's side of session sync with the peer balancer: what it sends
//! (sessions when they are established or change state, UDP sessions when
//! they start, and every long-lived one again by a walk over the table),
//! and how a standby's synced sessions are committed into its tables when
//! it becomes the master.

use std::net::IpAddr;

use gatehouse_config::L4Mode;

use super::family::Family;
use super::{Endpoint, Plane, Worker};
use crate::session::{Session, State};
use crate::sync::Record;

/// A core's outgoing sync records and its walk over its tables.
pub struct SyncOut {
    /// Records waiting for the I/O layer to take them.
    pub records: Vec<Record>,
    cap: usize,
    /// Records not queued because the queue was full (the I/O layer was
    /// behind).
    pub dropped: u64,
    /// Milliseconds per tick of the plane clock (records carry seconds).
    tick_ms: u64,
    /// The next record slot of the walk: IPv4 slots, then IPv6 ones.
    cursor: usize,
    /// Slots left in a full pass asked for by a peer that (re)joined.
    bulk_left: usize,
}

/// Why a synced session could not be committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitError {
    /// No service here has its VIP, port and protocol.
    NoService,
    /// The service here has no such real server.
    NoReal,
    /// An FNAT session from a local address this node does not have, or a
    /// mode that differs from this node's.
    NoLocal,
    /// Its FNAT port is held by another session here.
    PortTaken,
    /// The session table is full.
    Full,
}

impl CommitError {
    pub const NAMES: [&'static str; 5] = ["no_service", "no_real", "no_local", "port_taken", "table_full"];

    pub fn index(self) -> usize {
        self as usize
    }
}

impl Worker {
    /// Starts recording sessions for the peer, at most `cap` waiting.
    pub fn enable_sync(&mut self, cap: usize, tick: std::time::Duration) {
        self.sync = Some(Box::new(SyncOut {
            records: Vec::with_capacity(cap.min(4096)),
            cap,
            dropped: 0,
            tick_ms: (tick.as_millis() as u64).max(1),
            cursor: 0,
            bulk_left: 0,
        }));
    }

    pub fn sync_out(&mut self) -> Option<&mut SyncOut> {
        self.sync.as_deref_mut()
    }

    /// Queues session `idx` for the peer (when syncing).
    pub(super) fn export<A: Family>(&mut self, plane: &Plane, idx: u32, now: u32) {
        let s = *A::table(&self.tables).get(idx);
        if let Some(out) = self.sync.as_deref_mut() {
            push_record(out, plane, &s, now);
        }
    }

    /// Record slots a full walk visits.
    pub fn sync_slots(&self) -> usize {
        A4::table(&self.tables).capacity() + A6::table(&self.tables).capacity()
    }

    /// Asks for a full pass over the tables (a peer joined): the next walks
    /// go on until every slot has been visited once.
    pub fn start_bulk(&mut self) {
        let slots = self.sync_slots();
        if let Some(out) = self.sync.as_deref_mut() {
            out.bulk_left = slots;
        }
    }

    /// Slots left in the full pass under way (0: none).
    pub fn bulk_left(&self) -> usize {
        self.sync.as_ref().map_or(0, |o| o.bulk_left)
    }

    /// Visits up to `budget` record slots from where the walk stopped and
    /// queues the established and UDP sessions there for the peer; returns
    /// how many it queued. Walked in full every `refresh`, it keeps the
    /// peer's copies from expiring while the sessions live.
    pub fn sync_walk(&mut self, plane: &Plane, now: u32, budget: usize) -> usize {
        let (n4, n6) = (self.tables.v4.capacity(), self.tables.v6.capacity());
        let Some(out) = self.sync.as_deref_mut() else { return 0 };
        let total = n4 + n6;
        let mut queued = 0;
        for _ in 0..budget.min(total) {
            if out.records.len() >= out.cap {
                break;
            }
            let i = out.cursor;
            out.cursor = if i + 1 >= total { 0 } else { i + 1 };
            out.bulk_left = out.bulk_left.saturating_sub(1);
            let pushed = if i < n4 {
                self.tables.v4.live_at(i).filter(|s| worth_refresh(s)).is_some_and(|s| push_record(out, plane, s, now))
            } else {
                self.tables
                    .v6
                    .live_at(i - n4)
                    .filter(|s| worth_refresh(s))
                    .is_some_and(|s| push_record(out, plane, s, now))
            };
            queued += usize::from(pushed);
        }
        queued
    }

    /// Puts a session synced from the peer into this core's tables (or
    /// refreshes it if it is there). Every core of an interface is given
    /// every session, because the NIC, not the session, decides which core
    /// sees a client's packets. One of them owns it: for FNAT the core that
    /// owns its local port (replies are steered there), else core 0. The
    /// owner holds the port and counts the session; the others keep an
    /// uncounted copy.
    pub fn commit(&mut self, plane: &Plane, r: &Record, now: u32) -> Result<(), CommitError> {
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
            let key = super::snat::snat_key_for(rule, r.proto);
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

/// Sessions a walk sends again: the long-lived ones this core owns.
fn worth_refresh<A: Family>(s: &Session<A>) -> bool {
    // Proxied sessions are not synced: their sequence-number translation
    // is not in the record.
    matches!(s.state, State::Established | State::Datagram)
        && s.flags & (crate::session::COPY | crate::session::PROXIED) == 0
}

type A4 = u32;
type A6 = u128;

/// A session as a record for the peer; false if it names what the plane no
/// longer has, or the queue is full.
fn push_record<A: Family>(out: &mut SyncOut, plane: &Plane, s: &Session<A>, now: u32) -> bool {
    if s.flags & crate::session::PROXIED != 0 {
        return false;
    }
    if out.records.len() >= out.cap {
        out.dropped += 1;
        return false;
    }
    let ttl = (u64::from(s.expires.saturating_sub(now)) * out.tick_ms / 1000).min(u64::from(u32::MAX)) as u32;
    if super::snat::is_snat(s.service) {
        // An SNAT mapping: VIP port 0 marks it; the inside host as the
        // client, the address and port it goes out from as the local ones.
        let Some(&addr) = plane.local_addrs.get(usize::from(s.local)) else { return false };
        out.records.push(Record {
            proto: super::snat::snat_proto(s.service),
            state: s.state,
            ttl,
            client: s.client.ip(),
            client_port: s.client_port,
            vip: addr,
            vip_port: 0,
            real: addr,
            real_port: 0,
            local: Some((addr, s.local_port)),
        });
        return true;
    }
    let Some(svc) = plane.services.get(usize::from(s.service)) else { return false };
    let Some(real) = svc.reals.get(usize::from(s.real)) else { return false };
    let local = match plane.local_addrs.get(usize::from(s.local)) {
        Some(&a) if s.local != u16::MAX => Some((a, s.local_port)),
        _ => None,
    };
    let client: IpAddr = s.client.ip();
    out.records.push(Record {
        proto: svc.proto,
        state: s.state,
        ttl,
        client,
        client_port: s.client_port,
        vip: svc.vip,
        vip_port: svc.port,
        real: real.addr,
        real_port: real.port,
        local,
    });
    true
}
