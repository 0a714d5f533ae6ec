//! A fixed, portable 64-bit hash for scheduling keys.
//!
//! Scheduling hashes must be the same on every node and every build (several
//! Gatehouse nodes behind ECMP must send one client to one backend), so they
//! cannot use `std`'s randomly seeded hasher. FNV-1a over the bytes, then the
//! MurmurHash3 64-bit finaliser to spread FNV's weak low bits. Not for
//! anything adversarial: a client choosing its own key only chooses its own
//! backend.

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Hashes `bytes` with a `seed` (different seeds give independent hashes).
pub fn hash64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    fmix64(h)
}

/// MurmurHash3's finaliser: every input bit affects every output bit.
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values_never_change() {
        // These pin the hash: changing it would move every client of every
        // deployment to another backend on upgrade.
        assert_eq!(hash64(0, b""), fmix64(FNV_OFFSET));
        assert_eq!(hash64(0, b"a"), fmix64((FNV_OFFSET ^ 0x61).wrapping_mul(FNV_PRIME)));
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
    }

    #[test]
    fn seeds_give_different_hashes() {
        assert_ne!(hash64(1, b"10.0.0.1"), hash64(2, b"10.0.0.1"));
        assert_ne!(hash64(1, b"10.0.0.1"), hash64(1, b"10.0.0.2"));
    }
}
