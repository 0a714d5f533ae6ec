//! Batch counters, kept per worker thread and summed when read, so the
//! handshake path touches no shared cache line.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gatehouse_mbx::{BATCH, KeyClass};

/// Upper bounds (µs) of the queue-delay histogram buckets; the last is +Inf.
pub const DELAY_BUCKETS_US: [u64; 8] = [10, 50, 100, 250, 500, 1000, 2500, 10000];

#[derive(Default)]
struct Counters {
    /// Batches run by the multi-buffer engine, by size (index = lanes − 1),
    /// per kind of key ([`KEYS`]).
    mb_batches: [[AtomicU64; MAX_OPS]; KEYS.len()],
    /// Operations run one by one because their batch was below break-even.
    single_ops: [AtomicU64; KEYS.len()],
    delay: [AtomicU64; DELAY_BUCKETS_US.len() + 1],
    delay_sum_us: AtomicU64,
    faults: AtomicU64,
    timer_flushes: AtomicU64,
    /// The server's TLS key shares, `[engine][group]` ([`SHARE_ENGINES`];
    /// [`GROUPS`], then any other group).
    key_shares: [[AtomicU64; GROUPS.len() + 1]; SHARE_ENGINES.len()],
}

/// The kinds of key whose operations the batcher queues: the RSA sizes in
/// [`KeyClass::ALL`] order, then X25519 (counted in scalar multiplications,
/// two a key share: its public key and its secret), ECDSA P-256 signatures and ML-KEM-768 encapsulations
/// (the X25519MLKEM768 shares of one batch of X25519 lanes).
pub const KEYS: [&str; 6] = ["rsa2048", "rsa3072", "rsa4096", "x25519", "ecdsa-p256", "mlkem768"];

/// The most operations a batch of any kind holds: a batch of eight X25519
/// key shares is sixteen scalar multiplications.
pub const MAX_OPS: usize = 2 * BATCH;

/// The most operations a batch of each of [`KEYS`] holds.
pub const MAX_BATCH: [usize; KEYS.len()] = [BATCH, BATCH, BATCH, MAX_OPS, BATCH, BATCH];

/// [`KEYS`]' index of X25519.
pub(crate) const X25519: usize = 3;
/// [`KEYS`]' index of ECDSA P-256.
pub(crate) const ECDSA_P256: usize = 4;
/// [`KEYS`]' index of ML-KEM-768.
pub(crate) const MLKEM768: usize = 5;

/// The key-exchange groups counted by name (TLS `NamedGroup` code points);
/// any other is counted as `other`.
pub const GROUPS: [(u16, &str); 5] = [
    (0x001d, "X25519"),
    (0x11ec, "X25519MLKEM768"),
    (0x0017, "P-256"),
    (0x0018, "P-384"),
    (0x6399, "X25519Kyber768Draft00"),
];

/// Where a share was made, in [`Snapshot::key_shares`]' order.
pub const SHARE_ENGINES: [crate::Shares; 3] = [crate::Shares::Boring, crate::Shares::Lanes, crate::Shares::Kem];

/// The name [`Snapshot::key_shares`] counts `group` under.
pub fn group_name(index: usize) -> &'static str {
    GROUPS.get(index).map_or("other", |g| g.1)
}

static ALL: Mutex<Vec<Arc<Counters>>> = Mutex::new(Vec::new());

thread_local! {
    static MINE: Arc<Counters> = {
        let c = Arc::new(Counters::default());
        if let Ok(mut all) = ALL.lock() {
            all.push(c.clone());
        }
        c
    };
}

fn bump(a: &AtomicU64, by: u64) {
    // Only this thread writes its counters: a plain load and store suffice.
    a.store(a.load(Relaxed).wrapping_add(by), Relaxed);
}

pub(crate) fn record_batch(class: KeyClass, ops: usize, mb: bool) {
    record_batch_of(class.index(), ops, mb);
}

/// Counts a batch of `lanes` operations of the key kind `k` ([`KEYS`]).
pub(crate) fn record_batch_of(k: usize, ops: usize, mb: bool) {
    MINE.with(|c| {
        if mb {
            if let Some(slot) = c.mb_batches[k].get(ops.saturating_sub(1)) {
                bump(slot, 1);
            }
        } else {
            bump(&c.single_ops[k], ops as u64);
        }
    });
}

pub(crate) fn record_queue_delay(d: Duration) {
    let us = d.as_micros().min(u128::from(u64::MAX)) as u64;
    let bucket = DELAY_BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(DELAY_BUCKETS_US.len());
    MINE.with(|c| {
        bump(&c.delay[bucket], 1);
        bump(&c.delay_sum_us, us);
    });
}

pub(crate) fn record_fault() {
    MINE.with(|c| bump(&c.faults, 1));
}

pub(crate) fn record_timer_flush() {
    MINE.with(|c| bump(&c.timer_flushes, 1));
}

/// Counts the server's key share of a finished handshake: its group (a TLS
/// `NamedGroup` code point) and the engine that computed it.
pub fn record_key_share(group: u16, engine: crate::Shares) {
    let g = GROUPS.iter().position(|&(id, _)| id == group).unwrap_or(GROUPS.len());
    let e = SHARE_ENGINES.iter().position(|&x| x == engine).unwrap_or(0);
    MINE.with(|c| bump(&c.key_shares[e][g], 1));
}

/// Counters summed: over all workers ([`snapshot`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// `[kind][lanes − 1]`: multi-buffer batches of each size, per [`KEYS`].
    pub mb_batches: [[u64; MAX_OPS]; KEYS.len()],
    pub single_ops: [u64; KEYS.len()],
    /// Queue-delay histogram, non-cumulative, buckets of [`DELAY_BUCKETS_US`] then +Inf.
    pub delay: [u64; DELAY_BUCKETS_US.len() + 1],
    pub delay_sum_us: u64,
    pub faults: u64,
    pub timer_flushes: u64,
    /// `[engine][group]`: engines as [`SHARE_ENGINES`] orders them, groups
    /// as [`group_name`] names them.
    pub key_shares: [[u64; GROUPS.len() + 1]; SHARE_ENGINES.len()],
}

pub fn snapshot() -> Snapshot {
    let mut s = Snapshot::default();
    let Ok(all) = ALL.lock() else { return s };
    for c in all.iter() {
        s.add(c);
    }
    s
}

/// The calling thread's counters alone, for a test that must not see what
/// other tests sign on their threads meanwhile.
#[cfg(test)]
pub(crate) fn this_thread() -> Snapshot {
    let mut s = Snapshot::default();
    MINE.with(|c| s.add(c));
    s
}

impl Snapshot {
    fn add(&mut self, c: &Counters) {
        for k in 0..KEYS.len() {
            for (dst, src) in self.mb_batches[k].iter_mut().zip(&c.mb_batches[k]) {
                *dst += src.load(Relaxed);
            }
            self.single_ops[k] += c.single_ops[k].load(Relaxed);
        }
        for (dst, src) in self.delay.iter_mut().zip(&c.delay) {
            *dst += src.load(Relaxed);
        }
        self.delay_sum_us += c.delay_sum_us.load(Relaxed);
        self.faults += c.faults.load(Relaxed);
        self.timer_flushes += c.timer_flushes.load(Relaxed);
        for (dst, src) in self.key_shares.iter_mut().zip(&c.key_shares) {
            for (d, s) in dst.iter_mut().zip(src) {
                *d += s.load(Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shares;

    #[test]
    fn key_shares_are_counted_by_group_and_engine() {
        let before = this_thread();
        record_key_share(0x11ec, Shares::Boring);
        record_key_share(0x11ec, Shares::Boring);
        record_key_share(0x001d, Shares::Lanes);
        record_key_share(0x11ec, Shares::Kem);
        record_key_share(0x0019, Shares::Boring); // P-521: not named
        let after = this_thread();
        let grew = |e: usize, g: usize| after.key_shares[e][g] - before.key_shares[e][g];
        assert_eq!(group_name(1), "X25519MLKEM768");
        assert_eq!(grew(0, 1), 2);
        assert_eq!((group_name(0), grew(1, 0), grew(0, 0)), ("X25519", 1, 0));
        assert_eq!((group_name(GROUPS.len()), grew(0, GROUPS.len())), ("other", 1));
        assert_eq!((SHARE_ENGINES[2].name(), grew(2, 1), grew(2, 0)), ("simd", 1, 0));
        assert_eq!((SHARE_ENGINES[0].name(), SHARE_ENGINES[1].name()), ("boring", "mb"));
    }
}
