//! Maglev consistent hashing (Eisenbud et al., NSDI 2016).
//!
//! Each backend walks its own permutation of the table slots (from an offset
//! and a skip derived from its name) and claims the first free slot it finds,
//! in turns, until the table is full. The result: every backend owns close to
//! `weight / total` of the slots, and removing one of N backends moves only
//! about 1/N of the keys. The table is built off the fast path (the control
//! plane) and then only read: a lookup is one hash and one array index.
//!
//! Unavailable backends are handled at lookup time without a rebuild: a key
//! whose slot belongs to an unavailable backend probes further slots in a
//! fixed, key-dependent order until it finds an available one. Keys of
//! healthy backends never move; keys of the failed one spread over the rest.

use crate::Backends;
use crate::hash::hash64;

/// The default table size: a prime well above 100 × any realistic pool size,
/// which keeps each backend's share within about 1% of its weight.
pub const DEFAULT_TABLE_SIZE: usize = 65_537;

const SEED_OFFSET: u64 = 0x6d61_676c_6576_3031; // "maglev01"
const SEED_SKIP: u64 = 0x6d61_676c_6576_3032; // "maglev02"
const SEED_PROBE: u64 = 0x6d61_676c_6576_3033; // "maglev03"

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaglevTable {
    slots: Vec<u32>,
}

/// Errors building a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaglevError {
    /// The table size must be prime for every skip to visit every slot.
    SizeNotPrime(usize),
    /// No backend has a weight above zero.
    NoBackends,
    /// More backends than slots.
    TooManyBackends,
}

impl std::fmt::Display for MaglevError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MaglevError::SizeNotPrime(n) => write!(f, "Maglev table size {n} is not prime"),
            MaglevError::NoBackends => write!(f, "no backend with a weight above 0"),
            MaglevError::TooManyBackends => write!(f, "more backends than table slots"),
        }
    }
}

impl std::error::Error for MaglevError {}

pub fn is_prime(n: usize) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

impl MaglevTable {
    /// Builds a table of `size` slots (a prime) for backends identified by
    /// stable names (for example `10.0.0.1:80`) with weights. Backends of
    /// weight 0 get no slots. The result depends only on the names, weights
    /// and order, so every node computes the same table.
    pub fn build<N: AsRef<[u8]>>(backends: &[(N, u32)], size: usize) -> Result<Self, MaglevError> {
        if !is_prime(size) {
            return Err(MaglevError::SizeNotPrime(size));
        }
        let max_weight = backends.iter().map(|(_, w)| *w).max().unwrap_or(0);
        if max_weight == 0 {
            return Err(MaglevError::NoBackends);
        }
        if backends.len() > size {
            return Err(MaglevError::TooManyBackends);
        }
        let m = size as u64;
        // (offset, skip, next index into the permutation)
        let mut perm: Vec<(u64, u64, u64)> = backends
            .iter()
            .map(|(name, _)| {
                let name = name.as_ref();
                let offset = hash64(SEED_OFFSET, name) % m;
                let skip = hash64(SEED_SKIP, name) % (m - 1) + 1;
                (offset, skip, 0)
            })
            .collect();
        const EMPTY: u32 = u32::MAX;
        let mut slots = vec![EMPTY; size];
        // Weighted turns: each round a backend earns weight/max_weight of a
        // turn and takes a slot whenever it holds a whole one.
        let mut credit = vec![0u64; backends.len()];
        let mut filled = 0usize;
        while filled < size {
            for (i, (_, w)) in backends.iter().enumerate() {
                if *w == 0 {
                    continue;
                }
                credit[i] += u64::from(*w);
                if credit[i] < u64::from(max_weight) {
                    continue;
                }
                credit[i] -= u64::from(max_weight);
                let (offset, skip, next) = &mut perm[i];
                loop {
                    let slot = ((*offset + *next * *skip) % m) as usize;
                    *next += 1;
                    if slots[slot] == EMPTY {
                        slots[slot] = i as u32;
                        filled += 1;
                        break;
                    }
                }
                if filled == size {
                    break;
                }
            }
        }
        Ok(MaglevTable { slots })
    }

    pub fn size(&self) -> usize {
        self.slots.len()
    }

    /// The backend owning the slot of `hash`, available or not.
    pub fn owner(&self, hash: u64) -> usize {
        self.slots[(hash % self.slots.len() as u64) as usize] as usize
    }

    /// The backend for `hash` among the available ones: the slot's owner if
    /// available, else the first available owner along a probe sequence
    /// derived from the hash. `None` if no backend is available.
    pub fn pick(&self, hash: u64, b: &impl Backends) -> Option<usize> {
        let first = self.owner(hash);
        if first < b.len() && b.available(first) {
            return Some(first);
        }
        let m = self.slots.len() as u64;
        let start = hash % m;
        let step = hash64(SEED_PROBE, &hash.to_le_bytes()) % (m - 1) + 1;
        // Every backend owns at least one slot in a sane table, so a bounded
        // walk finds an available one quickly when any exists.
        for k in 1..m.min(4096) {
            let i = self.slots[((start + k * step) % m) as usize] as usize;
            if i < b.len() && b.available(i) {
                return Some(i);
            }
        }
        (0..b.len()).find(|&i| b.available(i) && b.weight(i) > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Pool;

    fn names(n: usize) -> Vec<(String, u32)> {
        (0..n).map(|i| (format!("10.0.0.{i}:80"), 1)).collect()
    }

    #[test]
    fn sizes_must_be_prime() {
        assert_eq!(MaglevTable::build(&names(3), 65_536), Err(MaglevError::SizeNotPrime(65_536)));
        assert!(MaglevTable::build(&names(3), 65_537).is_ok());
        assert_eq!(MaglevTable::build(&[("a", 0)], 7), Err(MaglevError::NoBackends));
    }

    #[test]
    fn shares_are_close_to_equal() {
        let t = MaglevTable::build(&names(7), DEFAULT_TABLE_SIZE).expect("table");
        let mut counts = [0usize; 7];
        for &s in &t.slots {
            counts[s as usize] += 1;
        }
        let fair = DEFAULT_TABLE_SIZE / 7;
        for c in counts {
            assert!(c.abs_diff(fair) <= fair / 100 + 1, "{counts:?}");
        }
    }

    #[test]
    fn shares_follow_weights() {
        let backends = [("a", 1u32), ("b", 2), ("c", 5)];
        let t = MaglevTable::build(&backends, DEFAULT_TABLE_SIZE).expect("table");
        let mut counts = [0usize; 3];
        for &s in &t.slots {
            counts[s as usize] += 1;
        }
        for (i, w) in [1usize, 2, 5].iter().enumerate() {
            let want = DEFAULT_TABLE_SIZE * w / 8;
            assert!(counts[i].abs_diff(want) <= want / 50, "{counts:?}");
        }
    }

    #[test]
    fn the_same_input_gives_the_same_table() {
        let a = MaglevTable::build(&names(5), 251).expect("table");
        let b = MaglevTable::build(&names(5), 251).expect("table");
        assert_eq!(a, b);
    }

    #[test]
    fn removing_one_of_n_moves_about_one_nth_of_keys() {
        let n = 10;
        let all = names(n);
        let before = MaglevTable::build(&all, DEFAULT_TABLE_SIZE).expect("table");
        let fewer: Vec<_> = all[..n - 1].to_vec();
        let after = MaglevTable::build(&fewer, DEFAULT_TABLE_SIZE).expect("table");
        let keys = 100_000u64;
        let mut moved = 0;
        for k in 0..keys {
            let h = hash64(7, &k.to_le_bytes());
            let (a, b) = (before.owner(h), after.owner(h));
            if a != b {
                moved += 1;
            }
        }
        // Keys of the removed backend (1/N) must move; Maglev promises little
        // more than that.
        let frac = moved as f64 / keys as f64;
        assert!((0.09..=0.13).contains(&frac), "moved {frac}");
    }

    #[test]
    fn unavailable_backends_move_only_their_own_keys() {
        let t = MaglevTable::build(&names(4), DEFAULT_TABLE_SIZE).expect("table");
        let mut pool = Pool::new(&[1, 1, 1, 1]);
        let before: Vec<_> = (0..20_000u64).map(|k| t.pick(hash64(1, &k.to_le_bytes()), &pool)).collect();
        pool.down[2] = true;
        let mut spread = [0usize; 4];
        for (k, old) in before.iter().enumerate() {
            let new = t.pick(hash64(1, &(k as u64).to_le_bytes()), &pool).expect("some");
            assert_ne!(new, 2);
            if *old == Some(2) {
                spread[new] += 1;
            } else {
                assert_eq!(Some(new), *old, "a key of a healthy backend moved");
            }
        }
        // The failed backend's keys spread over all three survivors.
        assert!(spread.iter().enumerate().all(|(i, &c)| i == 2 || c > 1000), "{spread:?}");
        pool.down = vec![true; 4];
        assert_eq!(t.pick(12345, &pool), None);
    }
}
