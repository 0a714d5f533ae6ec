//! Scalar big-number helpers for key preparation and format conversion: radix
//! 2^52 limbs (least significant first) to and from big-endian bytes, the
//! Montgomery constants. Constant time in the values: loops run over public
//! lengths and choices are masks.

use zeroize::Zeroize;

pub(crate) const LIMB_BITS: usize = 52;
const MASK52: u64 = (1 << 52) - 1;

/// Big-endian bytes into `limbs` 52-bit limbs; `None` when the value does not fit.
pub(crate) fn limbs_from_be(bytes: &[u8], limbs: usize) -> Option<Vec<u64>> {
    let mut out = vec![0u64; limbs];
    let mut acc: u128 = 0;
    let mut have = 0usize;
    let mut i = 0usize;
    let mut overflow = 0u64;
    for &b in bytes.iter().rev() {
        acc |= u128::from(b) << have;
        have += 8;
        if have >= LIMB_BITS {
            match out.get_mut(i) {
                Some(slot) => *slot = (acc as u64) & MASK52,
                None => overflow |= (acc as u64) & MASK52,
            }
            i += 1;
            acc >>= LIMB_BITS;
            have -= LIMB_BITS;
        }
    }
    match out.get_mut(i) {
        Some(slot) => *slot = acc as u64,
        None => overflow |= acc as u64,
    }
    acc.zeroize();
    if overflow != 0 {
        out.zeroize();
        return None;
    }
    Some(out)
}

/// 52-bit limbs into exactly `out.len()` big-endian bytes (the value must fit).
pub(crate) fn limbs_to_be(limbs: &[u64], out: &mut [u8]) {
    let mut acc: u128 = 0;
    let mut have = 0usize;
    let mut next = limbs.iter();
    for slot in out.iter_mut().rev() {
        if have < 8 {
            let limb = next.next().copied().unwrap_or(0);
            acc |= u128::from(limb) << have;
            have += LIMB_BITS;
        }
        *slot = acc as u8;
        acc >>= 8;
        have -= 8;
    }
    acc.zeroize();
}

/// Big-endian bytes into little-endian 64-bit words.
pub(crate) fn words_from_be(bytes: &[u8]) -> Vec<u64> {
    let mut out = vec![0u64; bytes.len().div_ceil(8)];
    for (k, &b) in bytes.iter().rev().enumerate() {
        out[k / 8] |= u64::from(b) << (8 * (k % 8));
    }
    out
}

/// `width` bits of `words` starting at bit `pos` (public); constant time in the words.
pub(crate) fn window(words: &[u64], pos: usize, width: usize) -> u64 {
    let i = pos / 64;
    let lo = words.get(i).copied().unwrap_or(0);
    let hi = words.get(i + 1).copied().unwrap_or(0);
    let both = (u128::from(hi) << 64) | u128::from(lo);
    ((both >> (pos % 64)) as u64) & ((1u64 << width) - 1)
}

/// Number of significant bits of a big-endian value (public lengths only).
pub(crate) fn bit_len(bytes: &[u8]) -> usize {
    match bytes.iter().position(|&b| b != 0) {
        Some(i) => (bytes.len() - i) * 8 - bytes[i].leading_zeros() as usize,
        None => 0,
    }
}

/// −m⁻¹ mod 2^52 for odd m0 (Newton's iteration doubles the correct bits).
pub(crate) fn mont_k0(m0: u64) -> u64 {
    let mut inv: u64 = 1;
    for _ in 0..6 {
        inv = inv.wrapping_mul(2u64.wrapping_sub(m0.wrapping_mul(inv)));
    }
    inv.wrapping_neg() & MASK52
}

/// R² mod m for R = 2^(52·len), by doubling with a masked subtraction; m must be
/// odd, normalized, and below R/4.
pub(crate) fn mont_rr(m: &[u64]) -> Vec<u64> {
    let n = m.len();
    let mut x = vec![0u64; n];
    let mut d = vec![0u64; n];
    x[0] = 1;
    for _ in 0..2 * LIMB_BITS * n {
        // x = 2x, then x - m if that does not borrow.
        let mut carry = 0u64;
        for limb in x.iter_mut() {
            let t = (*limb << 1) | carry;
            carry = t >> LIMB_BITS;
            *limb = t & MASK52;
        }
        let mut borrow = 0i64;
        for j in 0..n {
            let t = x[j] as i64 - m[j] as i64 + borrow;
            borrow = t >> LIMB_BITS;
            d[j] = (t as u64) & MASK52;
        }
        // carry out of the doubling is zero because 2x < 2m < R.
        let keep_x = borrow as u64; // all ones when x < m
        for j in 0..n {
            x[j] = (x[j] & keep_x) | (d[j] & !keep_x);
        }
    }
    d.zeroize();
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_limbs_round_trip() {
        for len in [1usize, 7, 13, 64, 255, 256, 384, 512] {
            let bytes: Vec<u8> = (0..len).map(|_| fastrand::u8(..)).collect();
            let limbs = limbs_from_be(&bytes, (len * 8).div_ceil(52)).expect("fits");
            assert!(limbs.iter().all(|&l| l < 1 << 52));
            let mut back = vec![0u8; len];
            limbs_to_be(&limbs, &mut back);
            assert_eq!(back, bytes);
        }
        assert!(limbs_from_be(&[1; 14], 2).is_none());
        assert_eq!(limbs_from_be(&[0, 0, 0, 5], 1), Some(vec![5]));
    }

    #[test]
    fn k0_inverts() {
        for _ in 0..1000 {
            let m = fastrand::u64(..) | 1;
            let k0 = mont_k0(m & MASK52);
            assert_eq!(m.wrapping_mul(k0) & MASK52, MASK52, "m·k0 ≡ −1");
        }
    }

    #[test]
    fn windows_and_lengths() {
        let w = words_from_be(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0xff]);
        assert_eq!(w, vec![0xff, 0x80]);
        assert_eq!(window(&w, 0, 5), 0x1f);
        assert_eq!(window(&w, 5, 5), 0x7);
        assert_eq!(window(&w, 68, 5), 0x8);
        assert_eq!(window(&w, 200, 5), 0);
        assert_eq!(bit_len(&[0, 0, 1, 0]), 9);
        assert_eq!(bit_len(&[0x80]), 8);
        assert_eq!(bit_len(&[0, 0]), 0);
    }
}
