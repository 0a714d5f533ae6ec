//! ChaCha20 in eight AVX2 lanes: the sixteen-lane kernel's twin for CPUs
//! without AVX-512 (AMD Zen 1–3, Intel before Skylake-SP). One 32-bit lane
//! of each 256-bit register per packet, each with its own key, nonce and
//! counter; lanes whose data has ended keep computing and are discarded, so
//! the work depends only on the lengths.
//!
//! `unsafe` is the kernel's: intrinsics behind the caller's run-time CPU
//! check, unaligned loads and stores of whole 32-byte halves of a block,
//! and lane values through plain arrays.

#![allow(unsafe_code)]

use core::arch::x86_64::*;

use super::{ChaChaJob, state};

/// Packets per AVX2 group.
pub const LANES: usize = 8;

/// Left rotations of every 32-bit word: 16 and 8 as byte shuffles, 12
/// and 7 as two shifts and an or.
#[inline]
#[target_feature(enable = "avx2")]
fn rotl(v: __m256i, n: u32) -> __m256i {
    match n {
        16 => _mm256_shuffle_epi8(
            v,
            _mm256_set_epi8(
                13, 12, 15, 14, 9, 8, 11, 10, 5, 4, 7, 6, 1, 0, 3, 2, 13, 12, 15, 14, 9, 8, 11, 10, 5, 4, 7, 6, 1, 0,
                3, 2,
            ),
        ),
        8 => _mm256_shuffle_epi8(
            v,
            _mm256_set_epi8(
                14, 13, 12, 15, 10, 9, 8, 11, 6, 5, 4, 7, 2, 1, 0, 3, 14, 13, 12, 15, 10, 9, 8, 11, 6, 5, 4, 7, 2, 1,
                0, 3,
            ),
        ),
        12 => _mm256_or_si256(_mm256_slli_epi32::<12>(v), _mm256_srli_epi32::<20>(v)),
        _ => _mm256_or_si256(_mm256_slli_epi32::<7>(v), _mm256_srli_epi32::<25>(v)),
    }
}

#[inline]
#[target_feature(enable = "avx2")]
fn qr(x: &mut [__m256i; 16], a: usize, b: usize, c: usize, d: usize) {
    x[a] = _mm256_add_epi32(x[a], x[b]);
    x[d] = rotl(_mm256_xor_si256(x[d], x[a]), 16);
    x[c] = _mm256_add_epi32(x[c], x[d]);
    x[b] = rotl(_mm256_xor_si256(x[b], x[c]), 12);
    x[a] = _mm256_add_epi32(x[a], x[b]);
    x[d] = rotl(_mm256_xor_si256(x[d], x[a]), 8);
    x[c] = _mm256_add_epi32(x[c], x[d]);
    x[b] = rotl(_mm256_xor_si256(x[b], x[c]), 7);
}

fn lanes_to_vec(x: [u32; LANES]) -> __m256i {
    // SAFETY: `[u32; 8]` and `__m256i` are both 32 bytes of plain integers;
    // every bit pattern is valid for both.
    unsafe { core::mem::transmute::<[u32; LANES], __m256i>(x) }
}

fn vec_to_lanes(v: __m256i) -> [u32; LANES] {
    // SAFETY: as in `lanes_to_vec`, the other way round.
    unsafe { core::mem::transmute::<__m256i, [u32; LANES]>(v) }
}

/// Word-major to lane-major for eight words: `x[w]` holds word `w` of
/// eight blocks; the result's vector `j` holds those eight words of block
/// `j`, in order. Interleaves 32-bit, then 64-bit elements within each
/// 128-bit half, then pairs the halves.
#[inline]
#[target_feature(enable = "avx2")]
fn transpose(x: &[__m256i]) -> [__m256i; LANES] {
    let a: [__m256i; LANES] = std::array::from_fn(|i| {
        let (p, q) = (x[i & !1], x[i | 1]);
        if i % 2 == 0 { _mm256_unpacklo_epi32(p, q) } else { _mm256_unpackhi_epi32(p, q) }
    });
    // b[4g + m], half H: words 4g..4g+3 of block 4H + m.
    let b: [__m256i; LANES] = std::array::from_fn(|i| {
        let (g, m) = (i / 4, i % 4);
        let (p, q) = (a[4 * g + (m >> 1)], a[4 * g + 2 + (m >> 1)]);
        if m % 2 == 0 { _mm256_unpacklo_epi64(p, q) } else { _mm256_unpackhi_epi64(p, q) }
    });
    let mut out = [_mm256_setzero_si256(); LANES];
    for m in 0..4 {
        out[m] = _mm256_permute2x128_si256::<0x20>(b[m], b[4 + m]);
        out[4 + m] = _mm256_permute2x128_si256::<0x31>(b[m], b[4 + m]);
    }
    out
}

/// XORs 32 bytes of keystream into `half` when it is whole, else byte by
/// byte into what there is.
#[inline]
#[target_feature(enable = "avx2")]
fn xor_half(half: &mut [u8], ks: __m256i) {
    if let Some(whole) = half.first_chunk_mut::<32>() {
        let p = whole.as_mut_ptr().cast::<__m256i>();
        // SAFETY: `whole` is 32 writable bytes; the unaligned load and
        // store read and write exactly those.
        unsafe { _mm256_storeu_si256(p, _mm256_xor_si256(_mm256_loadu_si256(p), ks)) };
    } else {
        let ks = vec_to_lanes(ks);
        for (w, bytes) in half.chunks_mut(4).enumerate() {
            for (d, k) in bytes.iter_mut().zip(ks[w].to_le_bytes()) {
                *d ^= k;
            }
        }
    }
}

/// Up to eight jobs, one per lane: state word `w` of every lane in vector
/// `w`. Lanes without a job run on zeros and are discarded.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
pub fn xor8(jobs: &mut [ChaChaJob<'_>]) {
    let states: [[u32; 16]; LANES] =
        std::array::from_fn(|j| jobs.get(j).map_or([0; 16], |job| state(job.key, job.nonce, job.counter)));
    // Lane-major rows to word-major vectors: the same transpose, which is
    // its own inverse.
    let row = |j: usize, half: usize| lanes_to_vec(std::array::from_fn(|w| states[j][8 * half + w]));
    let lo = transpose(&std::array::from_fn::<_, LANES, _>(|j| row(j, 0)));
    let hi = transpose(&std::array::from_fn::<_, LANES, _>(|j| row(j, 1)));
    let mut s: [__m256i; 16] = std::array::from_fn(|w| if w < 8 { lo[w] } else { hi[w - 8] });
    let blocks = jobs.iter().map(|j| j.data.len().div_ceil(64)).max().unwrap_or(0);
    let one = _mm256_set1_epi32(1);
    for b in 0..blocks {
        let mut x = s;
        for _ in 0..10 {
            double_round!(qr, x);
        }
        for w in 0..16 {
            x[w] = _mm256_add_epi32(x[w], s[w]);
        }
        let (lo, hi) = (transpose(&x[..8]), transpose(&x[8..]));
        for (j, job) in jobs.iter_mut().enumerate().take(LANES) {
            let Some(chunk) = job.data.get_mut(b * 64..) else { continue };
            let (first, second) = chunk.split_at_mut(chunk.len().min(32));
            xor_half(first, lo[j]);
            let n = second.len().min(32);
            xor_half(&mut second[..n], hi[j]);
        }
        s[12] = _mm256_add_epi32(s[12], one);
    }
}

#[cfg(test)]
mod tests {
    use super::super::xor_portable;
    use super::*;

    #[test]
    fn part_empty_groups_match_the_portable_function() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        let mut rng = fastrand::Rng::with_seed(0xa2c8);
        for round in 0..20 {
            for n in 1..=LANES {
                let keys: Vec<[u8; 32]> = (0..n).map(|_| std::array::from_fn(|_| rng.u8(..))).collect();
                let nonces: Vec<[u8; 12]> = (0..n).map(|_| std::array::from_fn(|_| rng.u8(..))).collect();
                // Counters near the 32-bit wrap, as a long packet may meet it.
                let counter = if round % 4 == 0 { u32::MAX - 1 } else { rng.u32(..) };
                let datas: Vec<Vec<u8>> =
                    (0..n).map(|_| (0..rng.usize(0..=1500)).map(|_| rng.u8(..)).collect()).collect();
                let mut batch = datas.clone();
                let mut jobs: Vec<ChaChaJob<'_>> = batch
                    .iter_mut()
                    .enumerate()
                    .map(|(i, d)| ChaChaJob { key: &keys[i], nonce: &nonces[i], counter, data: d })
                    .collect();
                // SAFETY: AVX2 is present (checked above).
                unsafe { xor8(&mut jobs) };
                for i in 0..n {
                    let mut one = datas[i].clone();
                    xor_portable(&mut ChaChaJob { key: &keys[i], nonce: &nonces[i], counter, data: &mut one });
                    assert_eq!(batch[i], one, "round {round}, group of {n}, job {i}, {} bytes", datas[i].len());
                }
            }
        }
    }
}
