//! AVX-512 kernels of ML-KEM's polynomial arithmetic: the transform and
//! its inverse on 32 coefficients per register, the base-case products
//! on 32 coefficient pairs per register, SampleNTT's rejection sampling
//! with a compressing store, and K-PKE.Encrypt built on them (the rest of
//! its arithmetic vectorized by the compiler).
//!
//! Each computes exactly what the plain code in [`super::poly`] does (the
//! same Montgomery and Barrett steps, coefficient by coefficient; the
//! tests compare them bit for bit). A polynomial is eight registers of 32
//! coefficients. The layers of the transform whose butterflies span 32
//! coefficients or more pair whole registers; the four below pair lanes
//! of a register pair, gathered into a "low" and a "high" register by one
//! two-source permutation each (`vpermt2w`) and scattered back after.
//!
//! `unsafe` is the intrinsics' (loads and stores through raw pointers)
//! and the calls into `#[target_feature]` code from the safe wrappers,
//! which take a `Cpu`: proof that the CPU check ([`super::available`])
//! passed.

#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::Avx512;
use super::poly::{self, BARRETT_V, INV_SCALE, K, N, Poly, Q, QINV, ZETAS};

/// For a layer of butterflies of span `len` (2 to 16) on 64 coefficients
/// (two registers, a ‖ b): which of the 64 each lane of the low and of
/// the high register takes, and for the way back, which lane of low ‖ high
/// each of the 64 comes from.
const fn gather(len: usize) -> ([i16; 32], [i16; 32]) {
    let mut lo = [0i16; 32];
    let mut hi = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        let p = (i / len) * 2 * len + i % len;
        lo[i] = p as i16;
        hi[i] = (p + len) as i16;
        i += 1;
    }
    (lo, hi)
}

const fn scatter(len: usize) -> ([i16; 32], [i16; 32]) {
    let mut back = [[0i16; 32]; 2];
    let mut p = 0;
    while p < 64 {
        let block = p / (2 * len);
        let off = p % (2 * len);
        // Lanes 0..32 of the permutation's first source are low's, 32..64 high's.
        let from = if off < len { block * len + off } else { 32 + block * len + off - len };
        back[p / 32][p % 32] = from as i16;
        p += 1;
    }
    (back[0], back[1])
}

/// Per span 16, 8, 4, 2 (index 0..4): the gather and scatter indices.
const SPANS: [usize; 4] = [16, 8, 4, 2];
const GATHER: [([i16; 32], [i16; 32]); 4] = [gather(16), gather(8), gather(4), gather(2)];
const SCATTER: [([i16; 32], [i16; 32]); 4] = [scatter(16), scatter(8), scatter(4), scatter(2)];

/// The twiddle of each low lane, for span index `s`, register pair `m`
/// (coefficients 64m..64m+64), forward (`inverse` false) or inverse.
const fn twiddles(s: usize, m: usize, inverse: bool) -> [i16; 32] {
    let len = SPANS[s];
    let blocks = 128 / len;
    let mut z = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        let block = (64 * m + (i / len) * 2 * len) / (2 * len);
        let k = if inverse { blocks + blocks - 1 - block } else { blocks + block };
        z[i] = ZETAS[k];
        i += 1;
    }
    z
}

const fn twiddle_table(inverse: bool) -> [[[i16; 32]; 4]; 4] {
    let mut t = [[[0i16; 32]; 4]; 4];
    let mut s = 0;
    while s < 4 {
        let mut m = 0;
        while m < 4 {
            t[s][m] = twiddles(s, m, inverse);
            m += 1;
        }
        s += 1;
    }
    t
}

const FORWARD: [[[i16; 32]; 4]; 4] = twiddle_table(false);
const INVERSE: [[[i16; 32]; 4]; 4] = twiddle_table(true);

lane_arithmetic! {
    features: "avx512f,avx512bw", register: __m512i, lanes: 32, regs: 8,
    loadu: _mm512_loadu_si512, storeu: _mm512_storeu_si512, set1: _mm512_set1_epi16,
    add: _mm512_add_epi16, sub: _mm512_sub_epi16, mulhi: _mm512_mulhi_epi16, mullo: _mm512_mullo_epi16,
    srai: _mm512_srai_epi16
}

/// A layer of span below 32 on the register pair (x, y).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn small_layer(x: &mut V, y: &mut V, s: usize, z: &[i16; 32], inverse: bool) {
    let (gl, gh) = (vec(&GATHER[s].0), vec(&GATHER[s].1));
    let lo = _mm512_permutex2var_epi16(*x, gl, *y);
    let hi = _mm512_permutex2var_epi16(*x, gh, *y);
    let (lo, hi) = if inverse { gs(lo, hi, vec(z)) } else { ct(lo, hi, vec(z)) };
    *x = _mm512_permutex2var_epi16(lo, vec(&SCATTER[s].0), hi);
    *y = _mm512_permutex2var_epi16(lo, vec(&SCATTER[s].1), hi);
}

/// The forward transform, as [`Poly::ntt`].
#[target_feature(enable = "avx512f,avx512bw")]
fn ntt(p: &mut Poly) {
    let mut v = load(p);
    let z = |k: usize| _mm512_set1_epi16(ZETAS[k]);
    // Spans 128, 64, 32: whole registers.
    for i in 0..4 {
        (v[i], v[i + 4]) = ct(v[i], v[i + 4], z(1));
    }
    for (base, k) in [(0, 2), (4, 3)] {
        for i in base..base + 2 {
            (v[i], v[i + 2]) = ct(v[i], v[i + 2], z(k));
        }
    }
    for m in 0..4 {
        (v[2 * m], v[2 * m + 1]) = ct(v[2 * m], v[2 * m + 1], z(4 + m));
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
#[target_feature(enable = "avx512f,avx512bw")]
fn inv_ntt(p: &mut Poly) {
    let mut v = load(p);
    let z = |k: usize| _mm512_set1_epi16(ZETAS[k]);
    for s in (0..4).rev() {
        for m in 0..4 {
            let (x, y) = v.split_at_mut(2 * m + 1);
            small_layer(&mut x[2 * m], &mut y[0], s, &INVERSE[s][m], true);
        }
    }
    for m in 0..4 {
        (v[2 * m], v[2 * m + 1]) = gs(v[2 * m], v[2 * m + 1], z(7 - m));
    }
    for (base, k) in [(0, 3), (4, 2)] {
        for i in base..base + 2 {
            (v[i], v[i + 2]) = gs(v[i], v[i + 2], z(k));
        }
    }
    for i in 0..4 {
        (v[i], v[i + 4]) = gs(v[i], v[i + 4], z(1));
    }
    let f = _mm512_set1_epi16(INV_SCALE);
    let fq = qinv(f);
    store(p, v.map(|x| fqmul(x, f, fq)));
}

/// Byte offsets, within 48 bytes, of each of 32 candidates' 16-bit window:
/// candidate 2t is bytes 3t, 3t+1; candidate 2t+1 bytes 3t+1, 3t+2.
const WINDOWS: [u8; 64] = {
    let mut w = [0u8; 64];
    let mut k = 0;
    while k < 32 {
        let first = 3 * (k / 2) + (k % 2);
        w[2 * k] = first as u8;
        w[2 * k + 1] = (first + 1) as u8;
        k += 1;
    }
    w
};

/// 32 twelve-bit values from 48 bytes (FIPS 203's ByteDecode₁₂ layout:
/// value 2t is bytes 3t and the low half of 3t+1, value 2t+1 the high
/// half of 3t+1 and byte 3t+2), one per 16-bit lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn unpack12(chunk: &[u8], windows: V, shifts: V, mask12: V) -> V {
    debug_assert_eq!(chunk.len(), 48);
    // SAFETY: a masked load of the chunk's 48 bytes, reading nothing past it.
    let bytes = unsafe { _mm512_maskz_loadu_epi8(0x0000_ffff_ffff_ffff, chunk.as_ptr().cast()) };
    let words = _mm512_permutexvar_epi8(windows, bytes);
    _mm512_and_si512(_mm512_srlv_epi16(words, shifts), mask12)
}

/// ByteDecode₁₂ of 384 bytes as [`Poly::decode12`]: `None` if a value is
/// not below q.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
fn decode12_kernel(bytes: &[u8; 384]) -> Option<Poly> {
    // SAFETY: `WINDOWS` is 64 readable bytes.
    let windows = unsafe { _mm512_loadu_epi8(WINDOWS.as_ptr().cast()) };
    let (shifts, mask12) = (_mm512_set1_epi32(0x0004_0000), _mm512_set1_epi16(0x0fff));
    let mut p = Poly::default();
    let mut bad = 0u32;
    for (i, chunk) in bytes.chunks_exact(48).enumerate() {
        let d = unpack12(chunk, windows, shifts, mask12);
        bad |= _mm512_cmpge_epu16_mask(d, _mm512_set1_epi16(Q));
        // SAFETY: chunk i fills coefficients 32i..32i+32 of 256.
        unsafe { _mm512_storeu_si512(p.0.as_mut_ptr().add(32 * i).cast(), d) };
    }
    (bad == 0).then_some(p)
}

/// SampleNTT as [`super::poly::sample_ntt`]: 32 candidates from each 48
/// bytes, those below q stored in order by one compressing store. The
/// stream is public (the matrix seed's), so its rejections may show.
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vbmi2")]
fn sample_ntt(stream: &[u8], out: &mut Poly) -> usize {
    // Room for a last store of 32 past the 256 wanted.
    let mut buf = [0i16; N + 32];
    let mut n = 0;
    // SAFETY: `WINDOWS` is 64 readable bytes.
    let windows = unsafe { _mm512_loadu_epi8(WINDOWS.as_ptr().cast()) };
    let shifts = _mm512_set1_epi32(0x0004_0000); // 0 for even lanes, 4 for odd
    let mask12 = _mm512_set1_epi16(0x0fff);
    let q = _mm512_set1_epi16(Q);
    for chunk in stream.chunks_exact(48) {
        if n >= N {
            break;
        }
        let d = unpack12(chunk, windows, shifts, mask12);
        let keep = _mm512_cmplt_epu16_mask(d, q);
        // Compressed in a register, then stored whole (a compressing store
        // to memory is slow on Zen 4).
        let kept = _mm512_maskz_compress_epi16(keep, d);
        // SAFETY: n < 256 here and `buf` has 288 entries, so the 32 lanes
        // stored stay inside it.
        unsafe { _mm512_storeu_si512(buf.as_mut_ptr().add(n).cast(), kept) };
        n += keep.count_ones() as usize;
    }
    // A tail shorter than 48 bytes: candidate by candidate.
    n = poly::sample_tail(&stream[stream.len() / 48 * 48..], &mut buf, n);
    out.0.copy_from_slice(&buf[..N]);
    n.min(N)
}

/// For a register pair's 32 coefficient pairs (coefficients 2p and 2p + 1
/// of x ‖ y): the permutation indices that gather each pair's first and
/// its second coefficient into lane p, and the two that interleave them
/// back into x and y.
const PAIR_FIRST: [i16; 32] = {
    let mut t = [0i16; 32];
    let mut p = 0;
    while p < 32 {
        t[p] = 2 * p as i16;
        p += 1;
    }
    t
};
const PAIR_SECOND: [i16; 32] = {
    let mut t = PAIR_FIRST;
    let mut p = 0;
    while p < 32 {
        t[p] += 1;
        p += 1;
    }
    t
};
const fn pair_join(half: usize) -> [i16; 32] {
    let mut t = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        // Coefficient 32·half + i is pair 16·half + i/2's first (from the
        // first source) or second (lanes 32.. of the second source).
        let pair = 16 * half + i / 2;
        t[i] = if i % 2 == 0 { pair as i16 } else { 32 + pair as i16 };
        i += 1;
    }
    t
}
const PAIR_JOIN: [[i16; 32]; 2] = [pair_join(0), pair_join(1)];

/// The base-case ζ of each pair lane of register pair m (coefficients
/// 64m..64m + 64): pair P = 32m + p takes ζ^(2·bitrev7(P/2)+1), negated
/// for odd P (FIPS 203 Algorithm 11's γ), as [`Poly::add_product`].
const PAIR_ZETAS: [[i16; 32]; 4] = {
    let mut t = [[0i16; 32]; 4];
    let mut m = 0;
    while m < 4 {
        let mut p = 0;
        while p < 32 {
            let pair = 32 * m + p;
            let z = ZETAS[64 + pair / 2];
            t[m][p] = if pair % 2 == 0 { z } else { -z };
            p += 1;
        }
        m += 1;
    }
    t
};

/// Σ a[j]∘b[j] as `Transform::dot` (Algorithm 11 on pairs, summed): per
/// register pair, the 32 coefficient pairs gathered into first and second
/// coefficients, five Montgomery products a pair, interleaved back after.
#[target_feature(enable = "avx512f,avx512bw")]
fn dot_kernel(a: [&Poly; K], b: &[Poly; K]) -> Poly {
    let (first, second) = (vec(&PAIR_FIRST), vec(&PAIR_SECOND));
    let join = [vec(&PAIR_JOIN[0]), vec(&PAIR_JOIN[1])];
    let (va, vb) = (a.map(|p| load(p)), b.each_ref().map(|p| load(p)));
    let mut out = [_mm512_setzero_si512(); 8];
    for m in 0..4 {
        let z = vec(&PAIR_ZETAS[m]);
        let zq = qinv(z);
        let (mut c0, mut c1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
        for j in 0..K {
            let split = |v: &[V; 8]| {
                let (x, y) = (v[2 * m], v[2 * m + 1]);
                (_mm512_permutex2var_epi16(x, first, y), _mm512_permutex2var_epi16(x, second, y))
            };
            let ((a0, a1), (b0, b1)) = (split(&va[j]), split(&vb[j]));
            let (one, two) = pair_product(a0, a1, b0, b1, z, zq);
            (c0, c1) = (_mm512_add_epi16(c0, one), _mm512_add_epi16(c1, two));
        }
        out[2 * m] = _mm512_permutex2var_epi16(c0, join[0], c1);
        out[2 * m + 1] = _mm512_permutex2var_epi16(c0, join[1], c1);
    }
    let mut sum = Poly::default();
    store(&mut sum, out);
    sum
}

entry_points! { proof: Avx512, features: "avx2,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2", dot: dot_kernel }

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mlkem::poly::check;

    #[test]
    fn the_kernels_match_the_plain_code() {
        let Some(cpu) = Avx512::detect() else { return };
        // SAFETY (all four): an `Avx512` was made, so the CPU has the features.
        check::transforms(11, |p| unsafe { ntt(p) }, |p| unsafe { inv_ntt(p) });
        check::decoding(13, |b| decode12(cpu, b));
        check::sampling(12, |s, p| unsafe { sample_ntt(s, p) });
        check::products(14, |a, b| unsafe { dot_kernel(a, b) });
    }
}
