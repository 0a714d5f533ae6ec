//! ChaCha20 (RFC 8439) across packets: sixteen independent keystreams at
//! once, one per 32-bit lane of AVX-512 registers, each lane with its own
//! key, nonce and counter, so a batch may mix packets of different sessions
//! and lengths. Lanes whose data has ended keep computing (their output is
//! discarded): the work depends only on the lengths, never on a key or the
//! data. Without AVX-512, eight lanes of AVX2 ([`avx2`]) do the same; for
//! the lanes left over, the portable block function below, one block at a
//! time.
//!
//! `unsafe` is the AVX-512 kernel's: intrinsics behind a run-time CPU
//! check, and lane transposition through plain arrays.

#![allow(unsafe_code)]

use core::arch::x86_64::*;

/// Packets per AVX-512 batch.
pub const CHACHA_LANES: usize = 16;

const SIGMA: [u32; 4] = [0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574];

/// A double round: four quarter rounds on the columns, four on the
/// diagonals (RFC 8439 section 2.3); ten make ChaCha20. A macro, not a
/// loop over an index table: the indices must stay constants for the
/// state to live in registers (a table loop measured 40% slower).
macro_rules! double_round {
    ($quarter:ident, $x:ident) => {
        $quarter(&mut $x, 0, 4, 8, 12);
        $quarter(&mut $x, 1, 5, 9, 13);
        $quarter(&mut $x, 2, 6, 10, 14);
        $quarter(&mut $x, 3, 7, 11, 15);
        $quarter(&mut $x, 0, 5, 10, 15);
        $quarter(&mut $x, 1, 6, 11, 12);
        $quarter(&mut $x, 2, 7, 8, 13);
        $quarter(&mut $x, 3, 4, 9, 14);
    };
}

pub(crate) mod avx2;

/// One packet's keystream job: XOR the keystream of (`key`, `nonce`),
/// starting at block `counter`, into `data`.
pub struct ChaChaJob<'a> {
    pub key: &'a [u8; 32],
    pub nonce: &'a [u8; 12],
    pub counter: u32,
    pub data: &'a mut [u8],
}

fn words<const N: usize>(b: &[u8]) -> [u32; N] {
    std::array::from_fn(|i| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]))
}

/// The initial state of a block.
fn state(key: &[u8; 32], nonce: &[u8; 12], counter: u32) -> [u32; 16] {
    let k: [u32; 8] = words(key);
    let n: [u32; 3] = words(nonce);
    [SIGMA[0], SIGMA[1], SIGMA[2], SIGMA[3], k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], counter, n[0], n[1], n[2]]
}

fn quarter(x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
    x[a] = x[a].wrapping_add(x[b]);
    x[d] = (x[d] ^ x[a]).rotate_left(16);
    x[c] = x[c].wrapping_add(x[d]);
    x[b] = (x[b] ^ x[c]).rotate_left(12);
    x[a] = x[a].wrapping_add(x[b]);
    x[d] = (x[d] ^ x[a]).rotate_left(8);
    x[c] = x[c].wrapping_add(x[d]);
    x[b] = (x[b] ^ x[c]).rotate_left(7);
}

/// The ChaCha20 block function, portable.
pub fn block(key: &[u8; 32], nonce: &[u8; 12], counter: u32) -> [u8; 64] {
    let s = state(key, nonce, counter);
    let mut x = s;
    for _ in 0..10 {
        double_round!(quarter, x);
    }
    let mut out = [0u8; 64];
    for i in 0..16 {
        out[4 * i..4 * i + 4].copy_from_slice(&x[i].wrapping_add(s[i]).to_le_bytes());
    }
    out
}

/// XORs a job's keystream into its data, one block at a time.
pub fn xor_portable(job: &mut ChaChaJob<'_>) {
    for (i, chunk) in job.data.chunks_mut(64).enumerate() {
        let ks = block(job.key, job.nonce, job.counter.wrapping_add(i as u32));
        for (d, k) in chunk.iter_mut().zip(ks) {
            *d ^= k;
        }
    }
}

/// Whether this CPU runs the 16-lane kernel.
pub fn avx512_available() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// Whether this CPU runs a lane kernel: sixteen lanes of AVX-512 or eight
/// of AVX2.
pub fn lanes_available() -> bool {
    avx512_available() || is_x86_feature_detected!("avx2")
}

/// Packets per group of the kernel this CPU runs (0 without one).
pub fn group_lanes() -> usize {
    if avx512_available() {
        CHACHA_LANES
    } else if lanes_available() {
        avx2::LANES
    } else {
        0
    }
}

/// XORs every job's keystream into its data: sixteen jobs at a time on
/// AVX-512 (eight on AVX2), and the jobs left over in one part-empty group
/// when that costs less than running them one by one; without either, all
/// one by one.
pub fn chacha20_xor_batch(jobs: &mut [ChaChaJob<'_>]) {
    let wide = avx512_available();
    let lanes = group_lanes();
    if lanes == 0 {
        jobs.iter_mut().for_each(xor_portable);
        return;
    }
    let whole = jobs.len() / lanes * lanes;
    let (full, rest) = jobs.split_at_mut(whole);
    for group in full.chunks_exact_mut(lanes) {
        run_group(group, wide);
    }
    if rest.is_empty() {
        return;
    }
    // A part-empty group: its jobs cut into pieces that fill the idle
    // lanes, so that it takes as few steps as the blocks allow.
    let mut slots: [ChaChaJob<'_>; CHACHA_LANES] = std::array::from_fn(|_| idle_job());
    let pieces = fill_lanes(rest, &mut slots[..lanes]);
    if group_is_cheaper(pieces, wide) {
        run_group(pieces, wide);
    } else {
        pieces.iter_mut().for_each(xor_portable);
    }
}

/// An empty job: what a slot holds until a piece takes it.
fn idle_job() -> ChaChaJob<'static> {
    static KEY: [u8; 32] = [0; 32];
    static NONCE: [u8; 12] = [0; 12];
    ChaChaJob { key: &KEY, nonce: &NONCE, counter: 0, data: &mut [] }
}

/// One group of at most `group_lanes()` jobs in the kernel this CPU runs.
fn run_group(group: &mut [ChaChaJob<'_>], wide: bool) {
    if wide {
        // SAFETY: the CPU has AVX-512F (the caller checked), which is all
        // the kernel's target features ask for.
        unsafe { xor16(group) };
    } else {
        // SAFETY: the caller found AVX2, the kernel's one feature.
        unsafe { avx2::xor8(group) };
    }
}

/// Fewer jobs than `slots` (one a lane), cut into at most that many pieces
/// of at most `steps` blocks each, `steps` the fewest for which that is
/// possible: a piece is its job's keystream from a later block, so the
/// lanes a group would leave idle take part of a longer job's blocks. One
/// job of 23 blocks (a 1,420-byte packet) runs in two steps of sixteen
/// lanes instead of 23 steps of one. Cut by lengths only; the pieces are
/// the slots returned.
fn fill_lanes<'s, 'j>(jobs: &'j mut [ChaChaJob<'_>], slots: &'s mut [ChaChaJob<'j>]) -> &'s mut [ChaChaJob<'j>] {
    let lanes = slots.len();
    let blocks = |j: &ChaChaJob<'_>| j.data.len().div_ceil(64);
    let total: usize = jobs.iter().map(blocks).sum();
    let longest = jobs.iter().map(blocks).max().unwrap_or(0).max(1);
    let mut steps = total.div_ceil(lanes).max(1);
    while steps < longest && jobs.iter().map(|j| blocks(j).div_ceil(steps)).sum::<usize>() > lanes {
        steps += 1;
    }
    let mut n = 0;
    for job in jobs.iter_mut() {
        for (k, data) in job.data.chunks_mut(steps * 64).enumerate() {
            let piece = ChaChaJob {
                key: job.key,
                nonce: job.nonce,
                counter: job.counter.wrapping_add((k * steps) as u32),
                data,
            };
            // At most `lanes` pieces: `steps` was chosen so (at `longest`,
            // one piece a job, and there are fewer jobs than lanes). A piece
            // past them would still be done, one block at a time.
            match slots.get_mut(n) {
                Some(slot) => {
                    *slot = piece;
                    n += 1;
                }
                None => xor_portable(&mut { piece }),
            }
        }
    }
    &mut slots[..n]
}

/// Whether a group of lanes costs less than the portable function for
/// these jobs. Measured on Zen 5: the portable function about 72 ns a
/// block, one step of the sixteen lanes (a block in every lane) about 125
/// ns, so the group wins once the jobs' blocks add up to about twice the
/// longest. On Zen 3, the portable function about 250–390 ns a block and a
/// step of the eight AVX2 lanes about 350–400 ns (timed by hand over
/// 200,000 calls): any two jobs fill a group well enough. The choice
/// depends only on lengths.
fn group_is_cheaper(jobs: &[ChaChaJob<'_>], wide: bool) -> bool {
    let blocks = jobs.iter().map(|j| j.data.len().div_ceil(64));
    let (sum, longest) = blocks.fold((0, 0), |(s, m), b| (s + b, m.max(b)));
    if wide { sum * 72 > longest * 125 + 60 } else { sum * 300 > longest * 380 + 100 }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn rotl(v: __m512i, n: u32) -> __m512i {
    match n {
        16 => _mm512_rol_epi32::<16>(v),
        12 => _mm512_rol_epi32::<12>(v),
        8 => _mm512_rol_epi32::<8>(v),
        _ => _mm512_rol_epi32::<7>(v),
    }
}

#[inline]
#[target_feature(enable = "avx512f")]
fn qr(x: &mut [__m512i; 16], a: usize, b: usize, c: usize, d: usize) {
    x[a] = _mm512_add_epi32(x[a], x[b]);
    x[d] = rotl(_mm512_xor_si512(x[d], x[a]), 16);
    x[c] = _mm512_add_epi32(x[c], x[d]);
    x[b] = rotl(_mm512_xor_si512(x[b], x[c]), 12);
    x[a] = _mm512_add_epi32(x[a], x[b]);
    x[d] = rotl(_mm512_xor_si512(x[d], x[a]), 8);
    x[c] = _mm512_add_epi32(x[c], x[d]);
    x[b] = rotl(_mm512_xor_si512(x[b], x[c]), 7);
}

fn lanes_to_vec(x: [u32; 16]) -> __m512i {
    // SAFETY: `[u32; 16]` and `__m512i` are both 64 bytes of plain integers;
    // every bit pattern is valid for both.
    unsafe { core::mem::transmute::<[u32; 16], __m512i>(x) }
}

fn vec_to_lanes(v: __m512i) -> [u32; 16] {
    // SAFETY: as in `lanes_to_vec`, the other way round.
    unsafe { core::mem::transmute::<__m512i, [u32; 16]>(v) }
}

/// Word-major to lane-major: `x[w]` holds word `w` of sixteen blocks; the
/// result's vector `j` is block `j`, its words in order (its bytes in
/// memory order). Interleaves 32-bit, then 64-bit elements within each
/// 128-bit chunk, then moves the chunks.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose(x: &[__m512i; 16]) -> [__m512i; 16] {
    let a: [__m512i; 16] = std::array::from_fn(|i| {
        let (p, q) = (x[i & !1], x[i | 1]);
        if i % 2 == 0 { _mm512_unpacklo_epi32(p, q) } else { _mm512_unpackhi_epi32(p, q) }
    });
    // b[4g + m], chunk L: words 4g..4g+3 of block 4L + m.
    let b: [__m512i; 16] = std::array::from_fn(|i| {
        let (g, m) = (i / 4, i % 4);
        let (p, q) = (a[4 * g + (m >> 1)], a[4 * g + 2 + (m >> 1)]);
        if m % 2 == 0 { _mm512_unpacklo_epi64(p, q) } else { _mm512_unpackhi_epi64(p, q) }
    });
    let mut out = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        let c0 = _mm512_shuffle_i32x4::<0x88>(b[m], b[4 + m]);
        let c1 = _mm512_shuffle_i32x4::<0xdd>(b[m], b[4 + m]);
        let d0 = _mm512_shuffle_i32x4::<0x88>(b[8 + m], b[12 + m]);
        let d1 = _mm512_shuffle_i32x4::<0xdd>(b[8 + m], b[12 + m]);
        out[m] = _mm512_shuffle_i32x4::<0x88>(c0, d0);
        out[4 + m] = _mm512_shuffle_i32x4::<0x88>(c1, d1);
        out[8 + m] = _mm512_shuffle_i32x4::<0xdd>(c0, d0);
        out[12 + m] = _mm512_shuffle_i32x4::<0xdd>(c1, d1);
    }
    out
}

/// Up to sixteen jobs, one per lane: state word `w` of every lane in
/// vector `w`. Lanes without a job run on zeros and are discarded.
#[target_feature(enable = "avx512f")]
fn xor16(jobs: &mut [ChaChaJob<'_>]) {
    let states: [[u32; 16]; CHACHA_LANES] =
        std::array::from_fn(|j| jobs.get(j).map_or([0; 16], |job| state(job.key, job.nonce, job.counter)));
    let mut s: [__m512i; 16] = std::array::from_fn(|w| lanes_to_vec(std::array::from_fn(|j| states[j][w])));
    let blocks = jobs.iter().map(|j| j.data.len().div_ceil(64)).max().unwrap_or(0);
    let one = _mm512_set1_epi32(1);
    for b in 0..blocks {
        let mut x = s;
        for _ in 0..10 {
            double_round!(qr, x);
        }
        for w in 0..16 {
            x[w] = _mm512_add_epi32(x[w], s[w]);
        }
        let blocks16 = transpose(&x);
        for (job, ks) in jobs.iter_mut().zip(blocks16) {
            let Some(chunk) = job.data.get_mut(b * 64..) else { continue };
            if let Some(whole) = chunk.first_chunk_mut::<64>() {
                let p = whole.as_mut_ptr().cast::<__m512i>();
                // SAFETY: `whole` is 64 writable bytes; the unaligned load
                // and store read and write exactly those.
                unsafe { _mm512_storeu_si512(p, _mm512_xor_si512(_mm512_loadu_si512(p), ks)) };
            } else {
                let ks: [u32; 16] = vec_to_lanes(ks);
                for (w, bytes) in chunk.chunks_mut(4).enumerate() {
                    for (d, k) in bytes.iter_mut().zip(ks[w].to_le_bytes()) {
                        *d ^= k;
                    }
                }
            }
        }
        s[12] = _mm512_add_epi32(s[12], one);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    #[test]
    fn rfc_8439_block_and_encryption_vectors() {
        // Section 2.3.2: the block function.
        let key: [u8; 32] = std::array::from_fn(|i| i as u8);
        let nonce: [u8; 12] = hex("000000090000004a00000000").try_into().expect("12");
        let out = block(&key, &nonce, 1);
        assert_eq!(&out[..16], &hex("10f1e7e4d13b5915500fdd1fa32071c4")[..]);
        // Section 2.4.2: encryption from counter 1.
        let nonce: [u8; 12] = hex("000000000000004a00000000").try_into().expect("12");
        let mut text = b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.".to_vec();
        let mut jobs = [ChaChaJob { key: &key, nonce: &nonce, counter: 1, data: &mut text }];
        chacha20_xor_batch(&mut jobs);
        assert_eq!(&text[..16], &hex("6e2e359a2568f98041ba0728dd0d6981")[..]);
        assert_eq!(&text[text.len() - 2..], &hex("874d")[..]);
    }

    #[test]
    fn part_empty_groups_match_the_portable_function() {
        if !avx512_available() {
            return;
        }
        let mut rng = fastrand::Rng::with_seed(0x9a27);
        for n in 1..=CHACHA_LANES {
            let keys: Vec<[u8; 32]> = (0..n).map(|_| std::array::from_fn(|_| rng.u8(..))).collect();
            let nonce: [u8; 12] = std::array::from_fn(|_| rng.u8(..));
            let datas: Vec<Vec<u8>> = (0..n).map(|_| (0..rng.usize(0..=1500)).map(|_| rng.u8(..)).collect()).collect();
            let mut batch = datas.clone();
            let mut jobs: Vec<ChaChaJob<'_>> = batch
                .iter_mut()
                .zip(&keys)
                .map(|(d, key)| ChaChaJob { key, nonce: &nonce, counter: 1, data: d })
                .collect();
            // SAFETY: AVX-512F is present (checked above).
            unsafe { xor16(&mut jobs) };
            for i in 0..n {
                let mut one = datas[i].clone();
                xor_portable(&mut ChaChaJob { key: &keys[i], nonce: &nonce, counter: 1, data: &mut one });
                assert_eq!(batch[i], one, "group of {n}, job {i}");
            }
        }
    }

    /// `n` jobs of random keys, nonces and counters (some wrapping within
    /// the job), of lengths from `lens`, through the batch against the
    /// portable function; with `cut`, the part-empty group is checked to be
    /// cut into no more pieces than lanes.
    fn check_batch(rng: &mut fastrand::Rng, n: usize, lens: std::ops::RangeInclusive<usize>, cut: bool) {
        let keys: Vec<[u8; 32]> = (0..n).map(|_| std::array::from_fn(|_| rng.u8(..))).collect();
        let nonces: Vec<[u8; 12]> = (0..n).map(|_| std::array::from_fn(|_| rng.u8(..))).collect();
        let counters: Vec<u32> = (0..n).map(|_| if rng.bool() { rng.u32(..) } else { u32::MAX - 3 }).collect();
        let datas: Vec<Vec<u8>> = (0..n).map(|_| (0..rng.usize(lens.clone())).map(|_| rng.u8(..)).collect()).collect();
        let mut batch = datas.clone();
        let mut jobs: Vec<ChaChaJob<'_>> = batch
            .iter_mut()
            .enumerate()
            .map(|(i, d)| ChaChaJob { key: &keys[i], nonce: &nonces[i], counter: counters[i], data: d })
            .collect();
        if cut {
            // Every byte in exactly one piece, each piece's counter its
            // job's plus the blocks before it.
            let mut slots: [ChaChaJob<'_>; CHACHA_LANES] = std::array::from_fn(|_| idle_job());
            let pieces = fill_lanes(&mut jobs, &mut slots);
            let bytes: usize = pieces.iter().map(|p| p.data.len()).sum();
            assert_eq!(bytes, datas.iter().map(Vec::len).sum::<usize>(), "{n} jobs");
        }
        chacha20_xor_batch(&mut jobs);
        for i in 0..n {
            let mut one = datas[i].clone();
            xor_portable(&mut ChaChaJob { key: &keys[i], nonce: &nonces[i], counter: counters[i], data: &mut one });
            assert_eq!(batch[i], one, "job {i} of {n}, {} bytes", datas[i].len());
        }
    }

    #[test]
    fn few_long_jobs_cut_into_pieces_match_the_portable_function() {
        // Fewer jobs than lanes, each long enough to be cut across the idle
        // lanes.
        let mut rng = fastrand::Rng::with_seed(0x5b11);
        for n in 1..CHACHA_LANES {
            check_batch(&mut rng, n, 65..=3000, true);
        }
    }

    #[test]
    fn batches_of_mixed_keys_and_lengths_match_the_portable_function() {
        let mut rng = fastrand::Rng::with_seed(0xc4ac4a);
        for _ in 0..60 {
            let n = rng.usize(1..=40);
            check_batch(&mut rng, n, 0..=2048, false);
        }
    }
}
