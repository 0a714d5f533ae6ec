//! Arithmetic modulo p = 2^255 − 19 in eight lanes, radix 2^52.
//!
//! An element is five limbs, least significant first, each a vector of eight
//! lanes ([`Fe`]). Between operations every element is *carried*: limbs 0–3
//! below 2^52 and limb 4 below 2^48, so the value is below 2^256 but not
//! necessarily below p. That is what the IFMA multiplier needs (it reads only
//! the low 52 bits of each operand), and only [`freeze`] brings a value into
//! [0, p), once, at the end.
//!
//! Reduction: 2^260 ≡ 2^5·19 = 608 (mod p) folds the high half of a product
//! onto the low half; [`carry`] then folds bits 255 and up of limb 4 with
//! 2^255 ≡ 19 before it propagates carries upwards, so the chain never wraps
//! around and every limb ends in range. Nothing branches on or indexes by a
//! lane's value.

use core::arch::x86_64::*;

use crate::ifma::{V, hi, lo, zero};

/// A field element in eight lanes.
pub(crate) type Fe = [V; 5];

const MASK52: i64 = (1 << 52) - 1;
const MASK47: i64 = (1 << 47) - 1;

/// 4·p, limb by limb, each limb above any carried limb of the same position:
/// what [`sub`] adds so that no limb goes negative.
const FOUR_P: [i64; 5] = [(1 << 54) - 76, (1 << 54) - 4, (1 << 54) - 4, (1 << 54) - 4, (1 << 49) - 4];

#[inline]
#[target_feature(enable = "avx512f")]
fn splat(x: i64) -> V {
    _mm512_set1_epi64(x)
}

/// Carries an element whose limbs are non-negative and below 2^60 into the
/// carried form (limbs 0–3 below 2^52, limb 4 below 2^48), same value mod p.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn carry(mut r: [V; 5]) -> Fe {
    let mask = splat(MASK52);
    // Bits 255 and up of limb 4 come back as ·19 at the bottom first, so the
    // upward chain below ends in limb 4 without wrapping.
    let top = _mm512_srli_epi64::<47>(r[4]);
    r[4] = _mm512_and_si512(r[4], splat(MASK47));
    r[0] = lo(r[0], top, splat(19));
    for i in 0..4 {
        let c = _mm512_srli_epi64::<52>(r[i]);
        r[i] = _mm512_and_si512(r[i], mask);
        r[i + 1] = _mm512_add_epi64(r[i + 1], c);
    }
    r
}

/// Folds a ten-limb product (each limb below 2^57) to five carried limbs.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
fn reduce(t: [V; 10]) -> Fe {
    let mask = splat(MASK52);
    let k = splat(608);
    let mut r = [t[0], t[1], t[2], t[3], t[4]];
    // Limb 5 + i weighs 2^260 · 2^(52·i) ≡ 608 · 2^(52·i). Split it into its
    // low 52 bits h (a valid IFMA operand) and the rest c (small): h·608 lands
    // on limbs i and i + 1, c·608 on limb i + 1.
    let mut spill = zero();
    for i in 0..5 {
        let h = _mm512_and_si512(t[5 + i], mask);
        let c = _mm512_srli_epi64::<52>(t[5 + i]);
        r[i] = lo(r[i], h, k);
        if i < 4 {
            r[i + 1] = lo(hi(r[i + 1], h, k), c, k);
        } else {
            spill = lo(hi(spill, h, k), c, k);
        }
    }
    // What spilled past limb 4 weighs 2^260 again: below 2^16, once more ·608.
    r[0] = lo(r[0], spill, k);
    carry(r)
}

/// a·b.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn mul(a: &Fe, b: &Fe) -> Fe {
    // Two accumulators per column, low and high halves, to halve the chains.
    let mut l = [zero(); 10];
    let mut h = [zero(); 10];
    for i in 0..5 {
        for j in 0..5 {
            l[i + j] = lo(l[i + j], a[j], b[i]);
            h[i + j + 1] = hi(h[i + j + 1], a[j], b[i]);
        }
    }
    reduce(core::array::from_fn(|k| _mm512_add_epi64(l[k], h[k])))
}

/// a².
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn sqr(a: &Fe) -> Fe {
    // Each cross product once, then doubled, then the squares of the limbs.
    let mut t = [zero(); 10];
    for i in 0..5 {
        for j in i + 1..5 {
            t[i + j] = lo(t[i + j], a[i], a[j]);
            t[i + j + 1] = hi(t[i + j + 1], a[i], a[j]);
        }
    }
    for x in t.iter_mut() {
        *x = _mm512_add_epi64(*x, *x);
    }
    for i in 0..5 {
        t[2 * i] = lo(t[2 * i], a[i], a[i]);
        t[2 * i + 1] = hi(t[2 * i + 1], a[i], a[i]);
    }
    reduce(t)
}

/// a² applied n times.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn sqr_n(a: &Fe, n: usize) -> Fe {
    let mut r = *a;
    for _ in 0..n {
        r = sqr(&r);
    }
    r
}

/// a·k for a small constant k (below 2^20).
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn mul_small(a: &Fe, k: i64) -> Fe {
    let kv = splat(k);
    let mut r = [zero(); 5];
    let mut spill = zero();
    for i in 0..5 {
        r[i] = lo(r[i], a[i], kv);
        if i < 4 {
            r[i + 1] = hi(r[i + 1], a[i], kv);
        } else {
            spill = hi(spill, a[i], kv);
        }
    }
    r[0] = lo(r[0], spill, splat(608));
    carry(r)
}

/// a + b.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn add(a: &Fe, b: &Fe) -> Fe {
    carry(core::array::from_fn(|i| _mm512_add_epi64(a[i], b[i])))
}

/// a − b (as a + 4·p − b, so that no limb goes negative).
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn sub(a: &Fe, b: &Fe) -> Fe {
    carry(core::array::from_fn(|i| _mm512_sub_epi64(_mm512_add_epi64(a[i], splat(FOUR_P[i])), b[i])))
}

/// Per lane, (a, b) or, where `swap` has the lane's bit, (b, a).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn cswap(swap: __mmask8, a: &mut Fe, b: &mut Fe) {
    for i in 0..5 {
        let (x, y) = (a[i], b[i]);
        a[i] = _mm512_mask_blend_epi64(swap, x, y);
        b[i] = _mm512_mask_blend_epi64(swap, y, x);
    }
}

/// z^(p−2) = z⁻¹ (and 0 for 0), by the usual chain of 254 squarings and 11
/// multiplications.
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn invert(z: &Fe) -> Fe {
    let z2 = sqr(z);
    let z9 = mul(&sqr_n(&z2, 2), z);
    let z11 = mul(&z9, &z2);
    let z_5_0 = mul(&sqr(&z11), &z9); // z^(2^5 − 1)
    let z_10_0 = mul(&sqr_n(&z_5_0, 5), &z_5_0);
    let z_20_0 = mul(&sqr_n(&z_10_0, 10), &z_10_0);
    let z_40_0 = mul(&sqr_n(&z_20_0, 20), &z_20_0);
    let z_50_0 = mul(&sqr_n(&z_40_0, 10), &z_10_0);
    let z_100_0 = mul(&sqr_n(&z_50_0, 50), &z_50_0);
    let z_200_0 = mul(&sqr_n(&z_100_0, 100), &z_100_0);
    let z_250_0 = mul(&sqr_n(&z_200_0, 50), &z_50_0);
    mul(&sqr_n(&z_250_0, 5), &z11) // z^(2^255 − 21)
}

/// The canonical value in [0, p) of a carried element.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn freeze(a: &Fe) -> Fe {
    let mask = splat(MASK52);
    let chain = |mut r: [V; 5]| {
        for i in 0..4 {
            let c = _mm512_srli_epi64::<52>(r[i]);
            r[i] = _mm512_and_si512(r[i], mask);
            r[i + 1] = _mm512_add_epi64(r[i + 1], c);
        }
        r
    };
    // v < 2^255 + 19 after one more fold of bit 255.
    let v = carry(*a);
    // v ≥ p exactly when v + 19 reaches 2^255.
    let mut probe = v;
    probe[0] = _mm512_add_epi64(probe[0], splat(19));
    let q = _mm512_srli_epi64::<47>(chain(probe)[4]);
    let mut r = v;
    r[0] = lo(r[0], q, splat(19));
    let mut r = chain(r);
    r[4] = _mm512_and_si512(r[4], splat(MASK47));
    r
}

/// Lane values (little-endian 32-byte strings, bit 255 ignored) as an element.
#[inline]
pub(crate) fn from_bytes(lanes: &[[u8; 32]; 8]) -> [[u64; 5]; 8] {
    lanes.map(|b| {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[8 * i..8 * i + 8]);
            u64::from_le_bytes(w)
        };
        let w = [word(0), word(1), word(2), word(3) & ((1 << 63) - 1)];
        let m = (1u64 << 52) - 1;
        [
            w[0] & m,
            ((w[0] >> 52) | (w[1] << 12)) & m,
            ((w[1] >> 40) | (w[2] << 24)) & m,
            ((w[2] >> 28) | (w[3] << 36)) & m,
            w[3] >> 16,
        ]
    })
}

/// A canonical element's lane values as little-endian 32-byte strings.
#[inline]
pub(crate) fn to_bytes(limbs: &[u64; 5]) -> [u8; 32] {
    let w = [
        limbs[0] | (limbs[1] << 52),
        (limbs[1] >> 12) | (limbs[2] << 40),
        (limbs[2] >> 24) | (limbs[3] << 28),
        (limbs[3] >> 36) | (limbs[4] << 16),
    ];
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(8).zip(w) {
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    out
}
