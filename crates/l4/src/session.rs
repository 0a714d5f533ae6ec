//! A per-core session table: compact session records in one array, and an
//! index of cache-line buckets pointing at them, each session indexed by
//! both directions.
//!
//! A key is (address, port, context): the client's address and port and the
//! service for packets from the client; the client's address and port and
//! the real server (with the reverse bit) for NAT replies. FNAT replies need
//! no hashing at all: the local port they come back to was allocated by this
//! core and maps straight to the session.
//!
//! Index buckets are 64 bytes: seven slots of a 32-bit signature (hash bits
//! the bucket number does not use) and a 32-bit session number, and a count
//! of the entries that had to go on to a later bucket because this one was
//! full (as in Facebook's F14 tables). A lookup reads one bucket (rarely
//! more: linear probing over buckets), compares signatures, checks the one
//! candidate against its record, and stops at a bucket nothing overflowed
//! from: removal just empties a slot, with no tombstones to pile up under
//! churn. The seed is random per table, so crafted keys cannot aim at one
//! bucket.
//!
//! No locks, no atomics: one core owns the table.

/// An address type: `u32` for IPv4 tables, `u128` for IPv6.
pub trait Addr: Copy + Eq + Default + std::fmt::Debug {
    fn mix(self) -> u64;
}

impl Addr for u32 {
    fn mix(self) -> u64 {
        u64::from(self)
    }
}

impl Addr for u128 {
    fn mix(self) -> u64 {
        (self as u64) ^ ((self >> 64) as u64).rotate_left(29)
    }
}

/// TCP progress, for the timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum State {
    /// A SYN seen, not yet an answer.
    #[default]
    SynSent = 0,
    Established = 1,
    /// A FIN or RST seen: the session is ending.
    Closing = 2,
    /// UDP (and ICMP): no states, one timeout.
    Datagram = 3,
}

/// One session (20 bytes for IPv4, 32 for IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Session<A: Addr> {
    pub client: A,
    pub client_port: u16,
    pub service: u16,
    pub real: u16,
    /// FNAT: index of the local address, and the local port (this core's).
    pub local: u16,
    pub local_port: u16,
    pub state: State,
    /// [`COPY`], [`PROXIED`].
    pub flags: u8,
    /// When it expires, in the plane's coarse clock ticks.
    pub expires: u32,
}

/// Session flag: a copy committed from the peer balancer's sync to a core
/// that may never see its packets: it owns no FNAT port and is not counted.
pub const COPY: u8 = 1;
/// Session flag: a connection opened by the SYN proxy, whose sequence
/// numbers are translated (see `plane::synproxy`).
pub const PROXIED: u8 = 2;

/// Marks a reverse-direction key's context.
pub const REVERSE: u16 = 0x8000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Key<A: Addr> {
    pub addr: A,
    pub port: u16,
    /// The service (forward) or `REVERSE | real server` (NAT replies).
    pub context: u16,
}

impl<A: Addr> Session<A> {
    pub fn forward_key(&self) -> Key<A> {
        Key { addr: self.client, port: self.client_port, context: self.service }
    }

    pub fn reverse_key(&self) -> Key<A> {
        Key { addr: self.client, port: self.client_port, context: REVERSE | self.real }
    }
}

const SLOTS: usize = 7;
const EMPTY: u32 = 0;
/// Buckets probed before a key is declared absent (or the table full).
const MAX_PROBE: usize = 64;

#[derive(Clone, Copy, Default)]
struct Slot {
    sig: u32,
    /// Session number + 1, or `EMPTY`.
    entry: u32,
}

#[derive(Clone, Copy, Default)]
#[repr(align(64))]
struct Bucket {
    slots: [Slot; SLOTS],
    /// Entries whose probe passed this bucket because it was full.
    overflow: u32,
}

/// Why a session could not be created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// Every session record is in use.
    Sessions,
    /// The index around this key's bucket is full.
    Index,
}

pub struct Table<A: Addr> {
    buckets: Vec<Bucket>,
    sessions: Vec<Session<A>>,
    /// Which records are in use.
    live: Vec<bool>,
    free: Vec<u32>,
    len: usize,
    seed: u64,
    /// Where the incremental expiry sweep goes on.
    sweep_at: usize,
}

impl<A: Addr> Table<A> {
    /// A table for up to `capacity` sessions: two index entries each, the
    /// index at most 65% full.
    pub fn new(capacity: usize, seed: u64) -> Table<A> {
        let capacity = capacity.max(1);
        let buckets = (capacity * 2 * 100).div_ceil(SLOTS * 65).max(2);
        Table {
            buckets: crate::prefetch::huge_vec(buckets, Bucket::default()),
            sessions: crate::prefetch::huge_vec(capacity, Session::default()),
            live: vec![false; capacity],
            free: (0..capacity as u32).rev().collect(),
            len: 0,
            seed: seed | 1,
            sweep_at: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.sessions.len()
    }

    /// Bytes this table holds (records, liveness and index), for the
    /// bytes-per-session figure.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
            + self.sessions.len() * (std::mem::size_of::<Session<A>>() + 1 + 4)
    }

    pub fn hash(&self, k: &Key<A>) -> u64 {
        let x = k.addr.mix() ^ (u64::from(k.port) << 48) ^ (u64::from(k.context) << 32) ^ self.seed;
        // A 64-bit finalizer (the murmur3 one): every input bit moves every
        // output bit.
        let mut h = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }

    /// The low half of the hash; the bucket comes from the high half.
    fn sig(h: u64) -> u32 {
        h as u32
    }

    /// The home bucket: the hash scaled to the bucket count (no power-of-two
    /// rounding, so the index is sized to what it holds).
    fn home(&self, h: u64) -> usize {
        ((u128::from(h) * self.buckets.len() as u128) >> 64) as usize
    }

    fn next(&self, b: usize) -> usize {
        if b + 1 == self.buckets.len() { 0 } else { b + 1 }
    }

    fn matches(&self, entry: u32, k: &Key<A>) -> bool {
        let Some(s) = self.sessions.get((entry - 1) as usize) else { return false };
        if k.context & REVERSE != 0 { s.reverse_key() == *k } else { s.forward_key() == *k }
    }

    /// The session a key names, with its hash already computed.
    pub fn find_hashed(&self, k: &Key<A>, h: u64) -> Option<u32> {
        let sig = Self::sig(h);
        let mut b = self.home(h);
        for _ in 0..MAX_PROBE {
            let bucket = &self.buckets[b];
            for slot in &bucket.slots {
                if slot.sig == sig && slot.entry != EMPTY && self.matches(slot.entry, k) {
                    return Some(slot.entry - 1);
                }
            }
            // Nothing went on from here: the key is not further along.
            if bucket.overflow == 0 {
                return None;
            }
            b = self.next(b);
        }
        None
    }

    /// Issues the load of a key's home bucket (stage one of a lookup).
    pub fn prefetch_bucket(&self, h: u64) {
        crate::prefetch::prefetch(&self.buckets[self.home(h)]);
    }

    /// Issues the load of the record a key's signature points at in its home
    /// bucket (stage two, once the bucket has arrived).
    pub fn prefetch_record(&self, h: u64) {
        let sig = Self::sig(h);
        if let Some(slot) = self.buckets[self.home(h)].slots.iter().find(|s| s.sig == sig && s.entry != EMPTY)
            && let Some(rec) = self.sessions.get((slot.entry - 1) as usize)
        {
            crate::prefetch::prefetch(rec);
        }
    }

    pub fn find(&self, k: &Key<A>) -> Option<u32> {
        self.find_hashed(k, self.hash(k))
    }

    pub fn get(&self, idx: u32) -> &Session<A> {
        &self.sessions[idx as usize]
    }

    pub fn get_mut(&mut self, idx: u32) -> &mut Session<A> {
        &mut self.sessions[idx as usize]
    }

    /// One entry more (`add`) or fewer lives beyond each of the `steps`
    /// buckets from `home` on.
    fn count_overflow(&mut self, home: usize, steps: usize, add: bool) {
        let mut p = home;
        for _ in 0..steps {
            let o = &mut self.buckets[p].overflow;
            *o = if add { *o + 1 } else { o.saturating_sub(1) };
            p = self.next(p);
        }
    }

    fn index_insert(&mut self, k: &Key<A>, entry: u32) -> bool {
        let h = self.hash(k);
        let sig = Self::sig(h);
        let home = self.home(h);
        let mut b = home;
        for step in 0..MAX_PROBE {
            if let Some(slot) = self.buckets[b].slots.iter_mut().find(|s| s.entry == EMPTY) {
                *slot = Slot { sig, entry };
                // Every full bucket passed on the way now has one more
                // entry beyond it.
                self.count_overflow(home, step, true);
                return true;
            }
            b = self.next(b);
        }
        false
    }

    fn index_remove(&mut self, k: &Key<A>, entry: u32) {
        let h = self.hash(k);
        let home = self.home(h);
        let mut b = home;
        for step in 0..MAX_PROBE {
            if let Some(slot) = self.buckets[b].slots.iter_mut().find(|s| s.entry == entry) {
                *slot = Slot::default();
                self.count_overflow(home, step, false);
                return;
            }
            b = self.next(b);
        }
    }

    /// Adds a session under both its keys; `reverse` false for modes whose
    /// replies need no index (FNAT, DR, tunnels).
    pub fn insert(&mut self, s: Session<A>, reverse: bool) -> Result<u32, Full> {
        let idx = self.free.pop().ok_or(Full::Sessions)?;
        self.sessions[idx as usize] = s;
        let entry = idx + 1;
        if !self.index_insert(&s.forward_key(), entry) {
            self.free.push(idx);
            return Err(Full::Index);
        }
        if reverse && !self.index_insert(&s.reverse_key(), entry) {
            self.index_remove(&s.forward_key(), entry);
            self.free.push(idx);
            return Err(Full::Index);
        }
        self.live[idx as usize] = true;
        self.len += 1;
        Ok(idx)
    }

    /// Removes a session (both keys); `reverse` as it was inserted.
    pub fn remove(&mut self, idx: u32, reverse: bool) {
        if !self.live.get(idx as usize).copied().unwrap_or(false) {
            return;
        }
        let s = self.sessions[idx as usize];
        self.index_remove(&s.forward_key(), idx + 1);
        if reverse {
            self.index_remove(&s.reverse_key(), idx + 1);
        }
        self.live[idx as usize] = false;
        self.free.push(idx);
        self.len -= 1;
    }

    /// The session in record `i`, if one lives there (for walks over the
    /// whole table).
    pub fn live_at(&self, i: usize) -> Option<&Session<A>> {
        self.live.get(i).copied().unwrap_or(false).then(|| &self.sessions[i])
    }

    /// Looks at up to `budget` records from where the last sweep stopped and
    /// hands each expired one (`expires < now`) to `expired` before removing
    /// it. Called once per vector, it spreads expiry over time with no timer
    /// per session.
    pub fn sweep(
        &mut self,
        now: u32,
        budget: usize,
        reverse: impl Fn(&Session<A>) -> bool,
        mut expired: impl FnMut(u32, &Session<A>),
    ) {
        let n = self.sessions.len();
        for _ in 0..budget.min(n) {
            let i = self.sweep_at;
            self.sweep_at = if i + 1 == n { 0 } else { i + 1 };
            if self.live[i] && self.sessions[i].expires < now {
                let s = self.sessions[i];
                expired(i as u32, &s);
                self.remove(i as u32, reverse(&s));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn session(rng: &mut fastrand::Rng) -> Session<u32> {
        Session {
            client: rng.u32(..),
            client_port: rng.u16(..),
            service: rng.u16(..8),
            real: rng.u16(..64),
            local: 0,
            local_port: 0,
            state: State::Established,
            flags: 0,
            expires: rng.u32(..1000),
        }
    }

    #[test]
    fn records_are_compact() {
        assert_eq!(std::mem::size_of::<Session<u32>>(), 20);
        assert_eq!(std::mem::size_of::<Session<u128>>(), 32);
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        let t: Table<u32> = Table::new(1 << 20, 1);
        let per = t.memory_bytes() as f64 / t.capacity() as f64;
        assert!(per <= 64.0, "{per} bytes per session");
    }

    #[test]
    fn behaves_like_a_map_under_random_inserts_and_removes() {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut t: Table<u32> = Table::new(4096, rng.u64(..));
        let mut model: HashMap<(u32, u16, u16), u32> = HashMap::new();
        for _ in 0..200_000 {
            if rng.u8(..) < 140 || model.is_empty() {
                let s = session(&mut rng);
                let key = (s.client, s.client_port, s.service);
                if model.contains_key(&key) {
                    continue;
                }
                match t.insert(s, true) {
                    Ok(idx) => {
                        model.insert(key, idx);
                    }
                    Err(Full::Sessions) => assert_eq!(model.len(), 4096),
                    Err(Full::Index) => panic!("index full at {} of 4096", model.len()),
                }
            } else {
                let (&key, &idx) = model.iter().nth(rng.usize(..model.len())).expect("non-empty");
                t.remove(idx, true);
                model.remove(&key);
            }
            assert_eq!(t.len(), model.len());
        }
        for (&(client, port, service), &idx) in &model {
            let s = *t.get(idx);
            assert_eq!(t.find(&Key { addr: client, port, context: service }), Some(idx));
            assert_eq!(t.find(&s.reverse_key()), Some(idx));
        }
        // Keys never inserted are not found.
        for _ in 0..10_000 {
            let s = session(&mut rng);
            if !model.contains_key(&(s.client, s.client_port, s.service)) {
                assert_eq!(t.find(&s.forward_key()), None);
            }
        }
    }

    #[test]
    fn a_full_table_refuses_and_recovers() {
        let mut rng = fastrand::Rng::with_seed(9);
        let mut t: Table<u128> = Table::new(1000, 77);
        let mut ids = Vec::new();
        loop {
            let s = Session { client: u128::from(rng.u64(..)) << 64, client_port: rng.u16(..), ..Session::default() };
            match t.insert(s, true) {
                Ok(i) => ids.push(i),
                Err(e) => {
                    assert_eq!(e, Full::Sessions);
                    break;
                }
            }
        }
        assert_eq!(t.len(), 1000);
        for i in ids.drain(..500) {
            t.remove(i, true);
        }
        assert_eq!(t.len(), 500);
        assert!(t.insert(Session { client: 5, ..Session::default() }, true).is_ok());
    }

    #[test]
    fn the_sweep_expires_only_what_is_due() {
        let mut t: Table<u32> = Table::new(100, 5);
        for i in 0..100u32 {
            let s = Session { client: i, client_port: 1, expires: i, ..Session::default() };
            t.insert(s, false).expect("room");
        }
        let mut gone = Vec::new();
        t.sweep(50, 100, |_| false, |_, s| gone.push(s.client));
        gone.sort_unstable();
        assert_eq!(gone, (0..50).collect::<Vec<_>>());
        assert_eq!(t.len(), 50);
        // A budget spreads the work: two half sweeps do what one whole did.
        let mut n = 0;
        t.sweep(80, 50, |_| false, |_, _| n += 1);
        t.sweep(80, 50, |_| false, |_, _| n += 1);
        assert_eq!(n, 30);
    }
}
