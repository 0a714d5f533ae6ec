//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Sums are kept unfolded in a `u64` while adding (eight bytes at a time),
//! folded to 16 bits at the end. A rewrite of an address or port does
//! not recompute a checksum over the packet: it adjusts it by the difference
//! of the old and new 16-bit words, `HC' = ~(~HC + ~m + m')`.

/// Adds `data` (as big-endian 16-bit words, an odd last byte padded with
/// zero) to a running sum.
///
/// The words are summed as they lie in memory ([`sum_ne`]) and the folded
/// result byte-swapped once: ones'-complement addition commutes with
/// swapping the bytes of every word (RFC 1071, 2(B)).
#[inline(always)]
pub fn add(sum: u64, data: &[u8]) -> u64 {
    sum + u64::from(u16::from_be(fold(sum_ne(data))))
}

/// The unfolded sum of `data`'s 16-bit words as they lie in memory (native
/// byte order; an odd last byte padded with a zero byte after it). Sums in
/// this order fold to the byte-swapped checksum on a little-endian machine:
/// a verification (`fold(..) == 0xffff`, the same value either way) needs
/// no swap at all. Eight bytes a step, then the tail in at most three
/// steps, with no loop over it.
#[inline(always)]
pub fn sum_ne(data: &[u8]) -> u64 {
    let mut native = 0u64;
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        // The two 32-bit halves: no carry can be lost in a u64 for any
        // packet shorter than 2^32 words.
        native += (w >> 32) + (w & 0xffff_ffff);
    }
    let mut rest = chunks.remainder();
    if let [a, b, c, d, tail @ ..] = rest {
        native += u64::from(u32::from_ne_bytes([*a, *b, *c, *d]));
        rest = tail;
    }
    if let [a, b, tail @ ..] = rest {
        native += u64::from(u16::from_ne_bytes([*a, *b]));
        rest = tail;
    }
    if let [last] = rest {
        native += u64::from(u16::from_ne_bytes([*last, 0]));
    }
    native
}

/// A pseudo-header's protocol and length, in memory order as [`sum_ne`]
/// adds: the protocol byte after a zero byte, the length as the big-endian
/// 32-bit field of IPv6 (whose low half is IPv4's 16-bit field).
#[inline(always)]
pub fn pseudo_tail_ne(proto: u8, len: u32) -> u64 {
    u64::from(u16::from_ne_bytes([0, proto])) + u64::from(u32::from_ne_bytes(len.to_be_bytes()))
}

/// Folds a running sum to 16 bits (ones' complement addition).
#[inline]
pub fn fold(sum: u64) -> u16 {
    // 64 → 33 → 32 bits, then 32 → 17 → 16: four steps whatever the sum.
    let s = (sum & 0xffff_ffff) + (sum >> 32);
    let s = (s & 0xffff_ffff) + (s >> 32);
    let s = (s & 0xffff) + (s >> 16);
    let s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// The checksum of `data`: the complement of its folded sum.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(add(0, data))
}

/// The IPv4 pseudo-header's contribution to a TCP or UDP checksum.
#[inline]
pub fn pseudo_v4(src: [u8; 4], dst: [u8; 4], proto: u8, len: u16) -> u64 {
    let words = |a: [u8; 4]| {
        let x = u32::from_be_bytes(a);
        u64::from(x >> 16) + u64::from(x & 0xffff)
    };
    words(src) + words(dst) + u64::from(proto) + u64::from(len)
}

/// The IPv6 pseudo-header's contribution (RFC 8200, section 8.1).
pub fn pseudo_v6(src: [u8; 16], dst: [u8; 16], proto: u8, len: u32) -> u64 {
    add(add(0, &src), &dst) + u64::from(proto) + u64::from(len >> 16) + u64::from(len & 0xffff)
}

/// Updates checksum `hc` for a 16-bit word changing from `old` to `new`.
pub fn update16(hc: u16, old: u16, new: u16) -> u16 {
    // RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')
    !fold(u64::from(!hc) + u64::from(!old) + u64::from(new))
}

/// Updates checksum `hc` for bytes changing from `old` to `new` (equal
/// lengths, an even number of bytes, aligned to 16-bit words in the summed data).
pub fn update(hc: u16, old: &[u8], new: &[u8]) -> u16 {
    debug_assert_eq!(old.len(), new.len());
    let mut sum = u64::from(!hc);
    for (o, n) in old.chunks_exact(2).zip(new.chunks_exact(2)) {
        sum += u64::from(!u16::from_be_bytes([o[0], o[1]])) + u64::from(u16::from_be_bytes([n[0], n[1]]));
    }
    !fold(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain definition, sixteen bits at a time.
    fn reference(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for p in data.chunks(2) {
            let w = if p.len() == 2 { u16::from_be_bytes([p[0], p[1]]) } else { u16::from(p[0]) << 8 };
            sum += u32::from(w);
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071, section 3: the sum of these words is 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(add(0, &data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn matches_the_plain_definition_on_random_data() {
        let mut rng = fastrand::Rng::with_seed(7);
        for len in 0..300 {
            let data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            assert_eq!(checksum(&data), reference(&data), "len {len}");
        }
    }

    #[test]
    fn a_verification_in_memory_order_agrees_with_the_big_endian_sum() {
        let mut rng = fastrand::Rng::with_seed(5);
        for len in 8..200usize {
            let (src, dst, proto) = (rng.u32(..).to_be_bytes(), rng.u32(..).to_be_bytes(), rng.u8(..));
            let mut seg: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            seg[6..8].copy_from_slice(&[0, 0]);
            let c = !fold(add(pseudo_v4(src, dst, proto, len as u16), &seg));
            seg[6..8].copy_from_slice(&c.to_be_bytes());
            let verify = |seg: &[u8]| {
                fold(sum_ne(&src) + sum_ne(&dst) + pseudo_tail_ne(proto, seg.len() as u32) + sum_ne(seg)) == 0xffff
            };
            assert!(verify(&seg), "len {len}");
            let at = rng.usize(..len);
            seg[at] ^= 1 << rng.u8(..8);
            assert!(!verify(&seg), "len {len}: a flipped bit passed");
        }
    }

    #[test]
    fn incremental_updates_equal_a_full_recomputation() {
        let mut rng = fastrand::Rng::with_seed(11);
        for _ in 0..2000 {
            let len = 2 * rng.usize(4..200);
            let mut data: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            let hc = checksum(&data);
            let at = 2 * rng.usize(0..len / 2 - 1);
            let width = if rng.bool() { 2 } else { 4 };
            let at = at.min(len - width);
            let old = data[at..at + width].to_vec();
            let new: Vec<u8> = (0..width).map(|_| rng.u8(..)).collect();
            data[at..at + width].copy_from_slice(&new);
            let updated = if width == 2 {
                update16(hc, u16::from_be_bytes([old[0], old[1]]), u16::from_be_bytes([new[0], new[1]]))
            } else {
                update(hc, &old, &new)
            };
            // 0x0000 and 0xffff are the same value in ones' complement.
            let full = checksum(&data);
            assert!(
                updated == full || (updated == 0xffff && full == 0) || (updated == 0 && full == 0xffff),
                "{updated:#x} vs {full:#x}"
            );
        }
    }
}
