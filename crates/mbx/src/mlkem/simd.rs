//! AVX-512 kernels of ML-KEM's polynomial arithmetic: the transform and
//! its inverse on 32 coefficients per register, SampleNTT's rejection
//! sampling with a compressing store, and K-PKE.Encrypt built on them
//! (the rest of its arithmetic vectorized by the compiler).
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

use zeroize::Zeroize;

use super::Cpu;
use super::poly::{BARRETT_V, INV_SCALE, K, N, Poly, Q, QINV, ZETAS};

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

type V = __m512i;

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn vec(x: &[i16; 32]) -> V {
    // SAFETY: `x` is 64 readable bytes; the load is unaligned.
    unsafe { _mm512_loadu_si512(x.as_ptr().cast()) }
}

/// b·ζ·R⁻¹ mod q per lane, with ζ·q⁻¹ mod 2^16 given (`zq`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn fqmul(b: V, z: V, zq: V) -> V {
    let hi = _mm512_mulhi_epi16(b, z);
    let t = _mm512_mulhi_epi16(_mm512_mullo_epi16(b, zq), _mm512_set1_epi16(Q));
    _mm512_sub_epi16(hi, t)
}

/// ζ·q⁻¹ mod 2^16 per lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn qinv(z: V) -> V {
    _mm512_mullo_epi16(z, _mm512_set1_epi16(QINV))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn barrett(a: V) -> V {
    let t = _mm512_mulhi_epi16(a, _mm512_set1_epi16(BARRETT_V));
    let t = _mm512_srai_epi16::<10>(_mm512_add_epi16(t, _mm512_set1_epi16(512)));
    _mm512_sub_epi16(a, _mm512_mullo_epi16(t, _mm512_set1_epi16(Q)))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn load(p: &Poly) -> [V; 8] {
    // SAFETY: each load reads 64 bytes inside the 512-byte array.
    core::array::from_fn(|i| unsafe { _mm512_loadu_si512(p.0.as_ptr().add(32 * i).cast()) })
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn store(p: &mut Poly, v: [V; 8]) {
    for (i, x) in v.into_iter().enumerate() {
        // SAFETY: each store writes 64 bytes inside the 512-byte array.
        unsafe { _mm512_storeu_si512(p.0.as_mut_ptr().add(32 * i).cast(), x) };
    }
}

/// Forward butterfly: (a, b) ← (a + ζb, a − ζb).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn ct(a: V, b: V, z: V) -> (V, V) {
    let t = fqmul(b, z, qinv(z));
    (_mm512_add_epi16(a, t), _mm512_sub_epi16(a, t))
}

/// Inverse butterfly: (a, b) ← (barrett(a + b), ζ(b − a)).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn gs(a: V, b: V, z: V) -> (V, V) {
    let sum = barrett(_mm512_add_epi16(a, b));
    (sum, fqmul(_mm512_sub_epi16(b, a), z, qinv(z)))
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
fn decode12_avx512(bytes: &[u8; 384]) -> Option<Poly> {
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

/// [`decode12_avx512`] from code without the target features.
pub(crate) fn decode12(_: Cpu, bytes: &[u8; 384]) -> Option<Poly> {
    // SAFETY: a `Cpu` exists only where `available()` held.
    unsafe { decode12_avx512(bytes) }
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
    let tail = stream.len() / 48 * 48;
    for b in stream[tail..].chunks_exact(3) {
        for d in [u16::from(b[0]) | (u16::from(b[1] & 0x0f) << 8), u16::from(b[1] >> 4) | (u16::from(b[2]) << 4)] {
            if d < Q as u16 && n < N {
                buf[n] = d as i16;
                n += 1;
            }
        }
    }
    out.0.copy_from_slice(&buf[..N]);
    n.min(N)
}

/// [`sample_ntt`] from code without the target features.
pub(crate) fn sample(_: Cpu, stream: &[u8], out: &mut Poly) -> usize {
    // SAFETY: a `Cpu` exists only where `available()` held.
    unsafe { sample_ntt(stream, out) }
}

/// K-PKE.Encrypt into `out`; see [`encrypt_avx512`].
pub(crate) fn encrypt(_: Cpu, t: &[Poly; K], matrix: &[Poly], m: &[u8; 32], coins: &[[u8; 128]], out: &mut [u8; 1088]) {
    // SAFETY: a `Cpu` exists only where `available()` held.
    unsafe { encrypt_avx512(t, matrix, m, coins, out) }
}

/// K-PKE.Encrypt (FIPS 203 Algorithm 14) with the matrix expanded and the
/// noise bytes drawn: u = NTT⁻¹(Âᵀ∘r̂) + e₁, v = NTT⁻¹(t̂ᵀ∘r̂) + e₂ + μ.
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2")]
fn encrypt_avx512(t: &[Poly; K], matrix: &[Poly], m: &[u8; 32], coins: &[[u8; 128]], out: &mut [u8; 1088]) {
    let mut r = [Poly::default(); K];
    for (p, bytes) in r.iter_mut().zip(&coins[..K]) {
        *p = Poly::cbd2(bytes);
        ntt(p);
    }
    let (c1, c2) = out.split_at_mut(K * 320);
    for (i, chunk) in c1.chunks_exact_mut(320).enumerate() {
        let mut u = Poly::default();
        for (j, rj) in r.iter().enumerate() {
            u.add_product(&matrix[i * K + j], rj);
        }
        u.reduce();
        inv_ntt(&mut u);
        let mut e1 = Poly::cbd2(&coins[K + i]);
        u.add(&e1);
        u.compress10(chunk);
        u.zeroize();
        e1.zeroize();
    }
    let mut v = Poly::default();
    for (tj, rj) in t.iter().zip(&r) {
        v.add_product(tj, rj);
    }
    v.reduce();
    inv_ntt(&mut v);
    let mut e2 = Poly::cbd2(&coins[2 * K]);
    let mut mu = Poly::from_message(m);
    v.add(&e2);
    v.add(&mu);
    v.compress4(c2);
    r.zeroize();
    v.zeroize();
    e2.zeroize();
    mu.zeroize();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transforms_match_the_plain_code() {
        if Cpu::detect().is_none() {
            return;
        }
        let mut rng = fastrand::Rng::with_seed(11);
        for round in 0..2000 {
            let mut p = Poly::default();
            // Inputs as the encryption feeds them: small noise, or reduced sums.
            let bound = if round % 2 == 0 { 3 } else { Q / 2 + 1 };
            p.0.iter_mut().for_each(|c| *c = rng.i16(-bound + 1..bound));
            let (mut want, mut got) = (p, p);
            want.ntt();
            // SAFETY: `available()` was checked above.
            unsafe { ntt(&mut got) };
            assert_eq!(want.0, got.0, "forward, round {round}");
            want.inv_ntt();
            // SAFETY: as above.
            unsafe { inv_ntt(&mut got) };
            assert_eq!(want.0, got.0, "inverse, round {round}");
        }
    }

    #[test]
    fn decoding_matches_the_plain_code() {
        let Some(cpu) = Cpu::detect() else { return };
        let mut rng = fastrand::Rng::with_seed(13);
        for round in 0..500 {
            let mut bytes = [0u8; 384];
            rng.fill(&mut bytes);
            // Half the time a valid encoding, as keys are.
            if round % 2 == 0 {
                let mut p = Poly::default();
                p.0.iter_mut().for_each(|c| *c = rng.i16(0..Q));
                for (b, two) in bytes.chunks_exact_mut(3).zip(p.0.chunks_exact(2)) {
                    let (x, y) = (two[0] as u16, two[1] as u16);
                    b.copy_from_slice(&[x as u8, (x >> 8) as u8 | (y << 4) as u8, (y >> 4) as u8]);
                }
            }
            let want = Poly::decode12(&bytes).map(|p| p.0);
            assert_eq!(want.is_some(), round % 2 == 0);
            assert_eq!(decode12(cpu, &bytes).map(|p| p.0), want);
        }
    }

    #[test]
    fn sampling_matches_the_plain_code() {
        if Cpu::detect().is_none() {
            return;
        }
        let mut rng = fastrand::Rng::with_seed(12);
        for len in [504, 168, 480, 510, 840] {
            for _ in 0..200 {
                let mut stream = vec![0u8; len];
                rng.fill(&mut stream);
                // Many values at or above q now and then, to run short.
                if rng.bool() {
                    stream.iter_mut().skip(1).step_by(2).for_each(|b| *b = 0xff);
                }
                let (mut want, mut got) = (Poly::default(), Poly::default());
                let n = super::super::poly::sample_ntt(&stream, &mut want);
                // SAFETY: `available()` was checked above.
                let m = unsafe { sample_ntt(&stream, &mut got) };
                assert_eq!(n, m);
                assert_eq!(want.0[..n], got.0[..n]);
            }
        }
    }
}
