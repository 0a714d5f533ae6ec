//! AVX2 kernels of ML-KEM's polynomial arithmetic, for CPUs without the
//! AVX-512 of `simd` (Zen 1 to 3; Intel from Haswell to Cascade Lake,
//! whose AVX-512 lacks VBMI): the transform and its inverse on 16
//! coefficients per register, ByteDecode₁₂ and SampleNTT's rejection
//! sampling 16 candidates at a time, the base-case products on 16-bit
//! lanes, and K-PKE.Encrypt built on them (the rest of `poly::encrypt`
//! vectorized by the compiler for AVX2).
//!
//! Each computes exactly what the plain code in [`super::poly`] does (the
//! same Montgomery and Barrett steps, coefficient by coefficient; the
//! tests compare them bit for bit). A polynomial is sixteen registers.
//! The layers of the transform whose butterflies span 16 coefficients or
//! more pair whole registers; the three below (8, 4, 2) pair parts of a
//! register pair, gathered into a "low" and a "high" register by one
//! shuffle each (128-bit halves, 64-bit words, 32-bit words) — shuffles
//! that, applied again, put the coefficients back.
//!
//! `unsafe` is the intrinsics' (loads and stores through raw pointers)
//! and the calls into `#[target_feature]` code from the safe wrappers,
//! which take an `Avx2`: proof that the CPU check passed.

#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::Avx2;
use super::poly::{self, BARRETT_V, INV_SCALE, K, N, Poly, Q, QINV, ZETAS};

/// Spans of the in-register layers (index 0..3).
const SPANS: [usize; 3] = [8, 4, 2];

/// Which coefficient of a register pair x ‖ y (0..32) lane `i` of the low
/// register holds after [`gather`] for span `span`; the high register's
/// lane `i` holds the one `span` further.
const fn low_coefficient(span: usize, i: usize) -> usize {
    match span {
        // 128-bit halves: x's low half, then y's.
        8 => (i / 8) * 16 + i % 8,
        // 64-bit words: per half h, x's word 2h, then y's word 2h.
        4 => {
            let (h, j) = (i / 8, i % 8);
            (j / 4) * 16 + 8 * h + j % 4
        }
        // 32-bit words: x's even words in even places, y's in odd.
        _ => {
            let (d, e) = (i / 2, i % 2);
            (d % 2) * 16 + 2 * (d - d % 2) + e
        }
    }
}

/// The twiddle of each low lane, for span index `s`, register pair `m`
/// (coefficients 32m..32m+32), forward or inverse.
const fn twiddles(s: usize, m: usize, inverse: bool) -> [i16; 16] {
    let len = SPANS[s];
    let blocks = 128 / len;
    let mut z = [0i16; 16];
    let mut i = 0;
    while i < 16 {
        let block = (32 * m + low_coefficient(len, i)) / (2 * len);
        let k = if inverse { blocks + blocks - 1 - block } else { blocks + block };
        z[i] = ZETAS[k];
        i += 1;
    }
    z
}

const fn twiddle_table(inverse: bool) -> [[[i16; 16]; 8]; 3] {
    let mut t = [[[0i16; 16]; 8]; 3];
    let mut s = 0;
    while s < 3 {
        let mut m = 0;
        while m < 8 {
            t[s][m] = twiddles(s, m, inverse);
            m += 1;
        }
        s += 1;
    }
    t
}

const FORWARD: [[[i16; 16]; 8]; 3] = twiddle_table(false);
const INVERSE: [[[i16; 16]; 8]; 3] = twiddle_table(true);

lane_arithmetic! {
    features: "avx2", register: __m256i, lanes: 16, regs: 16,
    loadu: _mm256_loadu_si256, storeu: _mm256_storeu_si256, set1: _mm256_set1_epi16,
    add: _mm256_add_epi16, sub: _mm256_sub_epi16, mulhi: _mm256_mulhi_epi16, mullo: _mm256_mullo_epi16,
    srai: _mm256_srai_epi16
}

/// The low and high registers of span index `s` from the pair (x, y), as
/// [`low_coefficient`] lays them out; applied to (low, high) it gives the
/// pair back.
#[inline]
#[target_feature(enable = "avx2")]
fn gather(x: V, y: V, s: usize) -> (V, V) {
    match s {
        0 => (_mm256_permute2x128_si256::<0x20>(x, y), _mm256_permute2x128_si256::<0x31>(x, y)),
        1 => (_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y)),
        _ => (
            _mm256_blend_epi32::<0xaa>(x, _mm256_slli_epi64::<32>(y)),
            _mm256_blend_epi32::<0xaa>(_mm256_srli_epi64::<32>(x), y),
        ),
    }
}

/// A layer of span below 16 on the register pair (x, y).
#[inline]
#[target_feature(enable = "avx2")]
fn small_layer(x: &mut V, y: &mut V, s: usize, z: &[i16; 16], inverse: bool) {
    let (lo, hi) = gather(*x, *y, s);
    let (lo, hi) = if inverse { gs(lo, hi, vec(z)) } else { ct(lo, hi, vec(z)) };
    (*x, *y) = gather(lo, hi, s);
}

/// The forward transform, as [`Poly::ntt`].
#[target_feature(enable = "avx2")]
fn ntt(p: &mut Poly) {
    let mut v = load(p);
    let z = |k: usize| _mm256_set1_epi16(ZETAS[k]);
    // Spans 128, 64, 32, 16: whole registers.
    for i in 0..8 {
        (v[i], v[i + 8]) = ct(v[i], v[i + 8], z(1));
    }
    for (base, k) in [(0, 2), (8, 3)] {
        for i in base..base + 4 {
            (v[i], v[i + 4]) = ct(v[i], v[i + 4], z(k));
        }
    }
    for b in 0..4 {
        for i in 4 * b..4 * b + 2 {
            (v[i], v[i + 2]) = ct(v[i], v[i + 2], z(4 + b));
        }
    }
    for m in 0..8 {
        (v[2 * m], v[2 * m + 1]) = ct(v[2 * m], v[2 * m + 1], z(8 + m));
    }
    for (s, twiddles) in FORWARD.iter().enumerate() {
        for (m, z) in twiddles.iter().enumerate() {
            let (x, y) = v.split_at_mut(2 * m + 1);
            small_layer(&mut x[2 * m], &mut y[0], s, z, false);
        }
    }
    store(p, v.map(|x| barrett(x)));
}

/// The inverse transform times R, as [`Poly::inv_ntt`].
#[target_feature(enable = "avx2")]
fn inv_ntt(p: &mut Poly) {
    let mut v = load(p);
    let z = |k: usize| _mm256_set1_epi16(ZETAS[k]);
    for s in (0..3).rev() {
        for m in 0..8 {
            let (x, y) = v.split_at_mut(2 * m + 1);
            small_layer(&mut x[2 * m], &mut y[0], s, &INVERSE[s][m], true);
        }
    }
    for m in 0..8 {
        (v[2 * m], v[2 * m + 1]) = gs(v[2 * m], v[2 * m + 1], z(15 - m));
    }
    for b in 0..4 {
        for i in 4 * b..4 * b + 2 {
            (v[i], v[i + 2]) = gs(v[i], v[i + 2], z(7 - b));
        }
    }
    for (base, k) in [(0, 3), (8, 2)] {
        for i in base..base + 4 {
            (v[i], v[i + 4]) = gs(v[i], v[i + 4], z(k));
        }
    }
    for i in 0..8 {
        (v[i], v[i + 8]) = gs(v[i], v[i + 8], z(1));
    }
    let f = _mm256_set1_epi16(INV_SCALE);
    let fq = qinv(f);
    store(p, v.map(|x| fqmul(x, f, fq)));
}

/// Per 128-bit half, the byte pairs holding each of its eight candidates'
/// 16-bit window (candidate 2t is bytes 3t, 3t+1; candidate 2t+1 bytes
/// 3t+1, 3t+2). The high half's bytes are loaded from 4 bytes earlier.
const WINDOWS: [u8; 32] = {
    let mut w = [0u8; 32];
    let mut half = 0;
    while half < 2 {
        let mut k = 0;
        while k < 8 {
            let first = 3 * (k / 2) + (k % 2) + 4 * half;
            w[16 * half + 2 * k] = first as u8;
            w[16 * half + 2 * k + 1] = (first + 1) as u8;
            k += 1;
        }
        half += 1;
    }
    w
};

/// For each 8-bit mask of kept lanes, the byte shuffle that packs the kept
/// 16-bit lanes of a 128-bit half to its front, in order.
const PACK: [[u8; 16]; 256] = {
    let mut t = [[0x80u8; 16]; 256];
    let mut mask = 0;
    while mask < 256 {
        let mut at = 0;
        let mut lane = 0;
        while lane < 8 {
            if mask & (1 << lane) != 0 {
                t[mask][2 * at] = 2 * lane as u8;
                t[mask][2 * at + 1] = 2 * lane as u8 + 1;
                at += 1;
            }
            lane += 1;
        }
        mask += 1;
    }
    t
};

/// 16 twelve-bit values from 24 bytes (FIPS 203's ByteDecode₁₂ layout),
/// one per 16-bit lane.
#[inline]
#[target_feature(enable = "avx2")]
fn unpack12(chunk: &[u8; 24], windows: V) -> V {
    // SAFETY: bytes 0..16 and 8..24 of the 24.
    let (lo, hi) = unsafe { (_mm_loadu_si128(chunk.as_ptr().cast()), _mm_loadu_si128(chunk.as_ptr().add(8).cast())) };
    let words = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), windows);
    // Even lanes keep their low 12 bits, odd lanes their high 12.
    _mm256_blend_epi16::<0xaa>(_mm256_and_si256(words, _mm256_set1_epi16(0x0fff)), _mm256_srli_epi16::<4>(words))
}

#[inline]
#[target_feature(enable = "avx2")]
fn windows() -> V {
    // SAFETY: `WINDOWS` is 32 readable bytes.
    unsafe { _mm256_loadu_si256(WINDOWS.as_ptr().cast()) }
}

/// ByteDecode₁₂ of 384 bytes as `Poly::decode12`: `None` if a value is
/// not below q.
#[target_feature(enable = "avx2")]
fn decode12_kernel(bytes: &[u8; 384]) -> Option<Poly> {
    let w = windows();
    let mut p = Poly::default();
    let mut bad = _mm256_setzero_si256();
    for (i, chunk) in bytes.as_chunks::<24>().0.iter().enumerate() {
        let d = unpack12(chunk, w);
        bad = _mm256_or_si256(bad, _mm256_cmpgt_epi16(d, _mm256_set1_epi16(Q - 1)));
        // SAFETY: chunk i fills coefficients 16i..16i+16 of 256.
        unsafe { _mm256_storeu_si256(p.0.as_mut_ptr().add(16 * i).cast(), d) };
    }
    (_mm256_testz_si256(bad, bad) == 1).then_some(p)
}

/// SampleNTT as `poly::sample_ntt`: 16 candidates from each 24 bytes,
/// those below q packed to the front of each half by a table shuffle and
/// stored whole. The stream is public (the matrix seed's), so its
/// rejections may show.
#[target_feature(enable = "avx2")]
fn sample_ntt(stream: &[u8], out: &mut Poly) -> usize {
    // Room for two stores of 8 past the 256 wanted.
    let mut buf = [0i16; N + 16];
    let mut n = 0;
    let w = windows();
    let q = _mm256_set1_epi16(Q);
    let (chunks, tail) = stream.as_chunks::<24>();
    for chunk in chunks {
        if n >= N {
            break;
        }
        let d = unpack12(chunk, w);
        let keep = _mm256_cmpgt_epi16(q, d);
        let bits = _mm256_movemask_epi8(_mm256_packs_epi16(keep, keep)) as u32;
        for (half, mask) in
            [(_mm256_castsi256_si128(d), bits & 0xff), (_mm256_extracti128_si256::<1>(d), (bits >> 16) & 0xff)]
        {
            // SAFETY: `PACK[mask]` is 16 readable bytes.
            let pack = unsafe { _mm_loadu_si128(PACK[mask as usize].as_ptr().cast()) };
            // SAFETY: n < 256 + 8 here and `buf` has 272 entries, so the 8
            // lanes stored stay inside it.
            unsafe { _mm_storeu_si128(buf.as_mut_ptr().add(n).cast(), _mm_shuffle_epi8(half, pack)) };
            n += mask.count_ones() as usize;
        }
    }
    // A tail shorter than 24 bytes: candidate by candidate.
    n = poly::sample_tail(tail, &mut buf, n);
    out.0.copy_from_slice(&buf[..N]);
    n.min(N)
}

/// Per 128-bit half, the bytes that put a register's even coefficients
/// (the first of each base-case pair) in its low eight bytes and the odd
/// ones in its high eight; and the way back.
const SPLIT: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut k = 0;
    while k < 4 {
        // Word k of the low eight bytes is word 2k; word 4 + k is 2k + 1.
        let mut half = 0;
        while half < 32 {
            t[half + 2 * k] = 4 * k as u8;
            t[half + 2 * k + 1] = 4 * k as u8 + 1;
            t[half + 8 + 2 * k] = 4 * k as u8 + 2;
            t[half + 8 + 2 * k + 1] = 4 * k as u8 + 3;
            half += 16;
        }
        k += 1;
    }
    t
};

const JOIN: [u8; 32] = {
    let mut t = [0u8; 32];
    let mut k = 0;
    while k < 8 {
        // Word k comes from the evens' word k/2 or the odds' (bytes 8..).
        let from = if k % 2 == 0 { 2 * (k / 2) } else { 8 + 2 * (k / 2) };
        t[2 * k] = from as u8;
        t[2 * k + 1] = from as u8 + 1;
        t[16 + 2 * k] = from as u8;
        t[16 + 2 * k + 1] = from as u8 + 1;
        k += 1;
    }
    t
};

/// The base-case ζ of each lane of [`split`]'s registers, per block of 32
/// coefficients: pair p (coefficients 2p, 2p + 1) takes ζ^(2·bitrev7(p/2)+1),
/// negated for odd p (FIPS 203 Algorithm 11's γ).
const PAIR_ZETAS: [[i16; 16]; 8] = {
    let mut t = [[0i16; 16]; 8];
    let mut blk = 0;
    while blk < 8 {
        let mut lane = 0;
        while lane < 16 {
            let (h, j) = (lane / 8, lane % 8);
            // The low four of each half are the first register's pairs.
            let pair = 16 * blk + if j < 4 { 4 * h + j } else { 8 + 4 * h + j - 4 };
            let z = ZETAS[64 + pair / 2];
            t[blk][lane] = if pair % 2 == 0 { z } else { -z };
            lane += 1;
        }
        blk += 1;
    }
    t
};

/// A block's two registers (x, y) as the first and the second coefficients
/// of its sixteen pairs, in [`PAIR_ZETAS`]' lane order.
#[inline]
#[target_feature(enable = "avx2")]
fn split(x: V, y: V, pattern: V) -> (V, V) {
    let (x, y) = (_mm256_shuffle_epi8(x, pattern), _mm256_shuffle_epi8(y, pattern));
    (_mm256_unpacklo_epi64(x, y), _mm256_unpackhi_epi64(x, y))
}

/// Σ a[j]∘b[j] as `Transform::dot` (Algorithm 11 on pairs, summed): per
/// block of 32 coefficients, the pairs split into first and second
/// coefficients, five Montgomery products a pair, joined back after.
#[target_feature(enable = "avx2")]
fn dot_kernel(a: [&Poly; K], b: &[Poly; K]) -> Poly {
    // SAFETY (both): the tables are 32 readable bytes each.
    let pattern = unsafe { _mm256_loadu_si256(SPLIT.as_ptr().cast()) };
    let join = unsafe { _mm256_loadu_si256(JOIN.as_ptr().cast()) };
    let (va, vb) = (a.map(|p| load(p)), b.each_ref().map(|p| load(p)));
    let mut out = [_mm256_setzero_si256(); 16];
    for blk in 0..8 {
        let z = vec(&PAIR_ZETAS[blk]);
        let zq = qinv(z);
        let (mut c0, mut c1) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for j in 0..K {
            let (a0, a1) = split(va[j][2 * blk], va[j][2 * blk + 1], pattern);
            let (b0, b1) = split(vb[j][2 * blk], vb[j][2 * blk + 1], pattern);
            let (first, second) = pair_product(a0, a1, b0, b1, z, zq);
            (c0, c1) = (_mm256_add_epi16(c0, first), _mm256_add_epi16(c1, second));
        }
        let (x, y) = (_mm256_unpacklo_epi64(c0, c1), _mm256_unpackhi_epi64(c0, c1));
        out[2 * blk] = _mm256_shuffle_epi8(x, join);
        out[2 * blk + 1] = _mm256_shuffle_epi8(y, join);
    }
    let mut sum = Poly::default();
    store(&mut sum, out);
    sum
}

entry_points! { proof: Avx2, features: "avx2", dot: dot_kernel }

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlkem::poly::check;

    #[test]
    fn the_gathers_pair_what_the_layers_pair_and_undo_themselves() {
        if Avx2::detect().is_none() {
            return;
        }
        let idx: [i16; 32] = core::array::from_fn(|i| i as i16);
        let mut v = Poly::default();
        v.0[..32].copy_from_slice(&idx);
        for (s, &span) in SPANS.iter().enumerate() {
            // SAFETY: AVX2 was checked above.
            let (lo, hi, back) = unsafe {
                let r = load(&v);
                let (lo, hi) = gather(r[0], r[1], s);
                let back = gather(lo, hi, s);
                let mut out = Poly::default();
                let mut regs = load(&out);
                (regs[0], regs[1], regs[2], regs[3]) = (lo, hi, back.0, back.1);
                store(&mut out, regs);
                (out.0[..16].to_vec(), out.0[16..32].to_vec(), out.0[32..64].to_vec())
            };
            for i in 0..16 {
                let c = low_coefficient(span, i);
                assert_eq!(lo[i] as usize, c, "span {span} lane {i}");
                assert_eq!(hi[i] as usize, c + span, "span {span} lane {i}");
                // A butterfly's low element is the first of its block.
                assert!(c % (2 * span) < span);
            }
            assert_eq!(back, idx, "span {span}");
        }
    }

    #[test]
    fn the_kernels_match_the_plain_code() {
        let Some(cpu) = Avx2::detect() else { return };
        // SAFETY (all four): an `Avx2` was made, so the CPU has AVX2.
        check::transforms(21, |p| unsafe { ntt(p) }, |p| unsafe { inv_ntt(p) });
        check::decoding(23, |b| decode12(cpu, b));
        check::sampling(22, |s, p| unsafe { sample_ntt(s, p) });
        check::products(24, |a, b| unsafe { dot_kernel(a, b) });
    }
}
