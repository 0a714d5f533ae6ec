//! A core's side of session sync with the peer balancer: what it sends
//! (sessions when they are established or change state, UDP sessions when
//! they start, and every long-lived one again by a walk over the table),
//! and how a standby's synced sessions are committed into its tables when
//! it becomes the master.

use super::Plane;
use super::family::{Family, Tables};
use crate::session::{Session, State};
use crate::sync::Record;

/// A core's outgoing sync records and its walk over its tables.
pub struct SyncOut {
    /// Records waiting for the I/O layer to take them.
    pub records: Vec<Record>,
    pub(super) cap: usize,
    /// Records not queued because the queue was full (the I/O layer was
    /// behind).
    pub dropped: u64,
    /// Milliseconds per tick of the plane clock (records carry seconds).
    pub(super) tick_ms: u64,
    /// The next record slot of the walk: IPv4 slots, then IPv6 ones.
    cursor: usize,
    /// Slots left in a full pass asked for by a peer that (re)joined.
    pub(super) bulk_left: usize,
}

impl SyncOut {
    /// A queue of at most `cap` records, for a plane clock ticking every `tick`.
    pub(super) fn new(cap: usize, tick: std::time::Duration) -> SyncOut {
        SyncOut {
            records: Vec::with_capacity(cap.min(4096)),
            cap,
            dropped: 0,
            tick_ms: (tick.as_millis() as u64).max(1),
            cursor: 0,
            bulk_left: 0,
        }
    }

    /// Visits up to `budget` record slots of `tables` from where the walk
    /// stopped and queues the established and UDP sessions there for the
    /// peer; returns how many it queued.
    pub(super) fn walk(&mut self, tables: &Tables, plane: &Plane, now: u32, budget: usize) -> usize {
        let (n4, n6) = (tables.v4.capacity(), tables.v6.capacity());
        let total = n4 + n6;
        let mut queued = 0;
        for _ in 0..budget.min(total) {
            if self.records.len() >= self.cap {
                break;
            }
            let i = self.cursor;
            self.cursor = if i + 1 >= total { 0 } else { i + 1 };
            self.bulk_left = self.bulk_left.saturating_sub(1);
            let pushed = if i < n4 {
                tables.v4.live_at(i).filter(|s| worth_refresh(s)).is_some_and(|s| push_record(self, plane, s, now))
            } else {
                tables.v6.live_at(i - n4).filter(|s| worth_refresh(s)).is_some_and(|s| push_record(self, plane, s, now))
            };
            queued += usize::from(pushed);
        }
        queued
    }
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

/// Sessions a walk sends again: the long-lived ones this core owns.
fn worth_refresh<A: Family>(s: &Session<A>) -> bool {
    // Proxied sessions are not synced: their sequence-number translation
    // is not in the record.
    matches!(s.state, State::Established | State::Datagram)
        && s.flags & (crate::session::COPY | crate::session::PROXIED) == 0
}

/// A session as a record for the peer; false if it names what the plane no
/// longer has, or the queue is full.
pub(super) fn push_record<A: Family>(out: &mut SyncOut, plane: &Plane, s: &Session<A>, now: u32) -> bool {
    if out.records.len() >= out.cap {
        out.dropped += 1;
        return false;
    }
    match record_of(plane, s, now, out.tick_ms) {
        Some(r) => {
            out.records.push(r);
            true
        }
        None => false,
    }
}

/// Every session of `tables` that this core owns, as records, into `out`
/// (a takeover: the new process commits them before its first packet).
/// Copies of other cores' sessions are theirs to export; proxied sessions
/// cannot be carried (their sequence-number translation is not in a
/// record).
pub(super) fn export(tables: &Tables, plane: &Plane, now: u32, tick_ms: u64, out: &mut Vec<Record>) {
    fn all<A: Family>(t: &crate::session::Table<A>, plane: &Plane, now: u32, tick_ms: u64, out: &mut Vec<Record>) {
        for i in 0..t.capacity() {
            if let Some(s) = t.live_at(i).filter(|s| s.flags & crate::session::COPY == 0) {
                out.extend(record_of(plane, s, now, tick_ms));
            }
        }
    }
    all(&tables.v4, plane, now, tick_ms, out);
    all(&tables.v6, plane, now, tick_ms, out);
}

/// A session as a record, naming everything by address; `None` if it
/// names what the plane no longer has, or is proxied.
fn record_of<A: Family>(plane: &Plane, s: &Session<A>, now: u32, tick_ms: u64) -> Option<Record> {
    if s.flags & crate::session::PROXIED != 0 {
        return None;
    }
    let ttl = (u64::from(s.expires.saturating_sub(now)) * tick_ms / 1000).min(u64::from(u32::MAX)) as u32;
    if super::snat_rules::is_snat(s.service) {
        // An SNAT mapping: VIP port 0 marks it; the inside host as the
        // client, the address and port it goes out from as the local ones.
        let &addr = plane.local_addrs.get(usize::from(s.local))?;
        return Some(Record {
            proto: super::snat_rules::snat_proto(s.service),
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
    }
    let svc = plane.services.get(usize::from(s.service))?;
    let real = svc.reals.get(usize::from(s.real))?;
    let local = match plane.local_addrs.get(usize::from(s.local)) {
        Some(&a) if s.local != u16::MAX => Some((a, s.local_port)),
        _ => None,
    };
    Some(Record {
        proto: svc.proto,
        state: s.state,
        ttl,
        client: s.client.ip(),
        client_port: s.client_port,
        vip: svc.vip,
        vip_port: svc.port,
        real: real.addr,
        real_port: real.port,
        local,
    })
}
