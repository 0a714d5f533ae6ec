//! Poly1305 in four AVX2 lanes: the IFMA kernel's twin for CPUs without
//! AVX-512 IFMA. Numbers are five limbs of radix 2^26, one message per
//! 64-bit lane; `vpmuludq` multiplies the low 32 bits of each lane, so a
//! product of a limb (below 2^28 after the block is added) and a key limb
//! (below 2^29 times 5) stays below 2^57, and five of them below 2^60.
//! What wraps past 2^130 comes back times 5. Each lane has its own key and
//! length; a lane whose message has ended keeps its accumulator through a
//! blend. `S` sets of four lanes step side by side, so that one set's
//! multiply-and-carry chain does not leave the multiplier idle. The final
//! reduction and the addition of `s` are the parent's, branch-free.
//!
//! `unsafe` is the kernel's: intrinsics behind the caller's run-time CPU
//! check, unaligned 16-byte loads of blocks the caller vouches for, and
//! lane values through plain arrays.

#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::{MASK44, PolyJob, finish, le64};

/// Messages per set of lanes.
pub const LANES: usize = 4;

const M26: u64 = (1 << 26) - 1;

/// Sixteen zero bytes: the block an idle lane reads.
static ZERO: [u8; 16] = [0; 16];

/// `r` (clamped) in radix 2^26.
fn r26(key: &[u8; 32]) -> [u64; 5] {
    let lo = le64(&key[0..8]) & 0x0fff_fffc_0fff_ffff;
    let hi = le64(&key[8..16]) & 0x0fff_fffc_0fff_fffc;
    [lo & M26, (lo >> 26) & M26, ((lo >> 52) | (hi << 12)) & M26, (hi >> 14) & M26, hi >> 40]
}

fn to_vec(x: [u64; LANES]) -> __m256i {
    // SAFETY: `[u64; 4]` and `__m256i` are 32 bytes of plain integers;
    // every bit pattern is valid for both.
    unsafe { core::mem::transmute::<[u64; LANES], __m256i>(x) }
}

fn from_vec(v: __m256i) -> [u64; LANES] {
    // SAFETY: as in `to_vec`, the other way round.
    unsafe { core::mem::transmute::<__m256i, [u64; LANES]>(v) }
}

/// A set's keys as vectors: r, and 5·r for limbs 1 to 4.
struct Key4 {
    r: [__m256i; 5],
    r5: [__m256i; 5],
}

/// h = (h + n) · r mod 2^130 − 5, partly reduced (limbs below 2^26 but
/// limb 1, below 2^27), in every lane whose `active` is all ones.
#[target_feature(enable = "avx2")]
#[inline]
fn step(h: &mut [__m256i; 5], n: [__m256i; 5], k: &Key4, active: __m256i) {
    let a: [__m256i; 5] = std::array::from_fn(|i| _mm256_add_epi64(h[i], n[i]));
    let (r, r5) = (&k.r, &k.r5);
    let m = |x: __m256i, y: __m256i| _mm256_mul_epu32(x, y);
    let sum = |p: [__m256i; 5]| {
        _mm256_add_epi64(_mm256_add_epi64(_mm256_add_epi64(p[0], p[1]), p[2]), _mm256_add_epi64(p[3], p[4]))
    };
    let d0 = sum([m(a[0], r[0]), m(a[1], r5[4]), m(a[2], r5[3]), m(a[3], r5[2]), m(a[4], r5[1])]);
    let d1 = sum([m(a[0], r[1]), m(a[1], r[0]), m(a[2], r5[4]), m(a[3], r5[3]), m(a[4], r5[2])]);
    let d2 = sum([m(a[0], r[2]), m(a[1], r[1]), m(a[2], r[0]), m(a[3], r5[4]), m(a[4], r5[3])]);
    let d3 = sum([m(a[0], r[3]), m(a[1], r[2]), m(a[2], r[1]), m(a[3], r[0]), m(a[4], r5[4])]);
    let d4 = sum([m(a[0], r[4]), m(a[1], r[3]), m(a[2], r[2]), m(a[3], r[1]), m(a[4], r[0])]);
    let mask = _mm256_set1_epi64x(M26 as i64);
    let c = _mm256_srli_epi64::<26>(d0);
    let x0 = _mm256_and_si256(d0, mask);
    let d1 = _mm256_add_epi64(d1, c);
    let c = _mm256_srli_epi64::<26>(d1);
    let x1 = _mm256_and_si256(d1, mask);
    let d2 = _mm256_add_epi64(d2, c);
    let c = _mm256_srli_epi64::<26>(d2);
    let x2 = _mm256_and_si256(d2, mask);
    let d3 = _mm256_add_epi64(d3, c);
    let c = _mm256_srli_epi64::<26>(d3);
    let x3 = _mm256_and_si256(d3, mask);
    let d4 = _mm256_add_epi64(d4, c);
    let c = _mm256_srli_epi64::<26>(d4);
    let x4 = _mm256_and_si256(d4, mask);
    // c · 5 = (c << 2) + c.
    let t = _mm256_add_epi64(x0, _mm256_add_epi64(_mm256_slli_epi64::<2>(c), c));
    let x0 = _mm256_and_si256(t, mask);
    let x1 = _mm256_add_epi64(x1, _mm256_srli_epi64::<26>(t));
    for (h, x) in h.iter_mut().zip([x0, x1, x2, x3, x4]) {
        *h = _mm256_blendv_epi8(*h, x, active);
    }
}

/// Four blocks, one per lane, from 16 bytes at each address, as limbs with
/// `top` (2^128, per lane: 1 or 0) added.
///
/// # Safety
/// Every address points to 16 readable bytes.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load(at: [*const u8; LANES], top: __m256i) -> [__m256i; 5] {
    // SAFETY: the caller's; unaligned loads of 16 bytes each.
    let m: [__m128i; LANES] = std::array::from_fn(|j| unsafe { _mm_loadu_si128(at[j].cast::<__m128i>()) });
    let p = _mm256_set_m128i(m[2], m[0]);
    let q = _mm256_set_m128i(m[3], m[1]);
    let (lo, hi) = (_mm256_unpacklo_epi64(p, q), _mm256_unpackhi_epi64(p, q));
    let mask = _mm256_set1_epi64x(M26 as i64);
    [
        _mm256_and_si256(lo, mask),
        _mm256_and_si256(_mm256_srli_epi64::<26>(lo), mask),
        _mm256_and_si256(_mm256_or_si256(_mm256_srli_epi64::<52>(lo), _mm256_slli_epi64::<12>(hi)), mask),
        _mm256_and_si256(_mm256_srli_epi64::<14>(hi), mask),
        _mm256_or_si256(_mm256_srli_epi64::<40>(hi), _mm256_slli_epi64::<24>(top)),
    ]
}

/// Radix 2^26 to the parent's radix 2^44 (limbs need not be reduced: the
/// parent's `finish` carries them fully).
fn to_radix44(h: [u64; 5]) -> [u64; 3] {
    let t = h[0] + (h[1] << 26);
    let l0 = t & MASK44;
    let t = (t >> 44) + (h[2] << 8) + (h[3] << 34);
    let l1 = t & MASK44;
    let l2 = (t >> 44) + (h[4] << 16);
    [l0, l1, l2]
}

/// Up to `4·S` tags; lanes past `jobs.len()` idle.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub fn tags<const S: usize>(jobs: &mut [PolyJob<'_>]) {
    let lanes = jobs.len().min(S * LANES);
    let job = |j: usize| jobs.get(j).filter(|_| j < lanes);
    let keys: [Key4; S] = std::array::from_fn(|s| {
        let rs: [[u64; 5]; LANES] = std::array::from_fn(|j| job(s * LANES + j).map_or([0; 5], |job| r26(job.key)));
        Key4 {
            r: std::array::from_fn(|k| to_vec(std::array::from_fn(|j| rs[j][k]))),
            r5: std::array::from_fn(|k| to_vec(std::array::from_fn(|j| rs[j][k] * 5))),
        }
    });
    let zero = _mm256_setzero_si256();
    let ones = _mm256_set1_epi64x(1);
    let mut h = [[zero; 5]; S];
    let blocks = jobs.iter().take(lanes).map(|j| j.input.blocks()).max().unwrap_or(0);
    let present: [__m256i; S] = std::array::from_fn(|s| {
        to_vec(std::array::from_fn(|j| if job(s * LANES + j).is_some() { u64::MAX } else { 0 }))
    });
    // First the blocks every lane has whole, at addresses that step by 16:
    // no look at each lane per block.
    let leading: [[(*const u8, usize); LANES]; S] = std::array::from_fn(|s| {
        std::array::from_fn(|j| job(s * LANES + j).map_or((ZERO.as_ptr(), usize::MAX), |job| job.input.leading()))
    });
    let common = leading.iter().flatten().map(|l| l.1).min().unwrap_or(0).min(blocks);
    // Each present lane steps 16 bytes a block; an idle lane stays on `ZERO`.
    let stride: [[usize; LANES]; S] =
        std::array::from_fn(|s| std::array::from_fn(|j| if job(s * LANES + j).is_some() { 16 } else { 0 }));
    for i in 0..common {
        for s in 0..S {
            let at: [*const u8; LANES] = std::array::from_fn(|j| leading[s][j].0.wrapping_add(stride[s][j] * i));
            // SAFETY: block i < `common` of every present lane is whole: 16
            // readable bytes at its segment's start plus 16 i, borrowed for
            // this call; idle lanes read `ZERO`.
            let n = unsafe { load(at, ones) };
            step(&mut h[s], n, &keys[s], present[s]);
        }
    }
    // Then the rest lane by lane: whole blocks by address, padded and
    // length blocks copied out one by one.
    let mut made = [[0u8; 16]; LANES];
    for i in common..blocks {
        for s in 0..S {
            let mut at = [ZERO.as_ptr(); LANES];
            let mut top = [0u64; LANES];
            let mut active = [0u64; LANES];
            for j in 0..LANES {
                let Some(job) = job(s * LANES + j) else { break };
                if let Some(b) = job.input.whole(i) {
                    at[j] = b.as_ptr();
                    (top[j], active[j]) = (1, u64::MAX);
                } else if let Some((b, t)) = job.input.padded(i) {
                    made[j] = b;
                    at[j] = made[j].as_ptr();
                    (top[j], active[j]) = (t, u64::MAX);
                }
            }
            // SAFETY: each address is 16 readable bytes: a whole block of its
            // job's input, borrowed for this call, one of `made`, or `ZERO`.
            let n = unsafe { load(at, to_vec(top)) };
            step(&mut h[s], n, &keys[s], to_vec(active));
        }
    }
    for (s, h) in h.iter().enumerate() {
        let limbs: [[u64; LANES]; 5] = std::array::from_fn(|k| from_vec(h[k]));
        for (j, job) in jobs.iter_mut().skip(s * LANES).take(LANES).enumerate() {
            *job.tag = finish(to_radix44(std::array::from_fn(|k| limbs[k][j])), job.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Input, tag_portable};
    use super::*;

    #[test]
    fn sets_match_the_portable_tag_on_random_keys_and_lengths() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = fastrand::Rng::with_seed(0x26a2);
        for round in 0..200 {
            let n = rng.usize(1..=2 * LANES);
            let keys: Vec<[u8; 32]> = (0..n)
                .map(|_| if rng.u8(..8) == 0 { [0xff; 32] } else { std::array::from_fn(|_| rng.u8(..)) })
                .collect();
            let msgs: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let len = if rng.bool() { rng.usize(0..=96) } else { rng.usize(0..=1600) };
                    let fill = rng.u8(..4);
                    (0..len).map(|_| if fill == 0 { 0xff } else { rng.u8(..) }).collect()
                })
                .collect();
            let aad: Vec<u8> = (0..rng.usize(0..=40)).map(|_| rng.u8(..)).collect();
            let aead = rng.bool();
            let input = |i: usize| if aead { Input::Aead { aad: &aad, ct: &msgs[i] } } else { Input::Raw(&msgs[i]) };
            let mut out = vec![[0u8; 16]; n];
            let mut jobs: Vec<PolyJob<'_>> =
                out.iter_mut().enumerate().map(|(i, t)| PolyJob { key: &keys[i], input: input(i), tag: t }).collect();
            // SAFETY: AVX2 is present (checked above).
            unsafe { if n > LANES { tags::<2>(&mut jobs) } else { tags::<1>(&mut jobs) } };
            for i in 0..n {
                assert_eq!(out[i], tag_portable(&keys[i], input(i)), "round {round}, job {i} of {n}, aead {aead}");
            }
        }
    }
}
