//! Keccak-f[1600] in eight lanes of AVX-512 (four of AVX2 on CPUs without
//! it), and the SHA-3 sponges ML-KEM uses (SHA3-256, SHA3-512, SHAKE128,
//! SHAKE256) run as jobs in them.
//!
//! The state is word-major: `state[w][l]` is word `w` (of 25) of lane `l`,
//! so one register holds one word of all the lanes' sponges. A round
//! takes 25 rotates, about 30 three-input logic operations (`vpternlogq`)
//! and a few XORs for all eight, where one sponge alone would take about
//! 150 scalar operations. [`run`] keeps the lanes busy: each lane has a
//! job (a sponge, its input, its output) and takes the next as soon as it
//! is done, so jobs of different sponges and lengths share permutations
//! (the 1184-byte key hashes of ML-KEM run beside its matrix streams).
//!
//! `unsafe` is the kernels': intrinsics behind the run-time CPU check
//! (`super::Cpu::detect`).

#![allow(unsafe_code)]

use core::arch::x86_64::*;

use zeroize::Zeroize;

use super::Cpu;

/// Sponges run together by each kernel: eight in AVX-512, four in AVX2.
const LANES_512: usize = 8;
const LANES_256: usize = 4;

/// `L` sponge states, word-major.
type State<const L: usize> = [[u64; L]; 25];

/// The round constants, from the degree-8 LFSR of the Keccak reference.
const RC: [u64; 24] = {
    let mut rc = [0u64; 24];
    let mut r: u8 = 1;
    let mut round = 0;
    while round < 24 {
        let mut j = 0;
        while j < 7 {
            if r & 1 != 0 {
                rc[round] ^= 1u64 << ((1u32 << j) - 1);
            }
            r = if r & 0x80 != 0 { (r << 1) ^ 0x71 } else { r << 1 };
            j += 1;
        }
        round += 1;
    }
    rc
};

/// ρ and π: for each row of the new state, the word of the old state that
/// each of its five places takes and by how much it is rotated (word
/// x + 5y goes to place y + 5·((2x + 3y) mod 5); the rotations from the
/// reference's (t + 1)(t + 2)/2 walk).
const PI_RHO: [[(usize, u32); 5]; 5] = [
    [(0, 0), (6, 44), (12, 43), (18, 21), (24, 14)],
    [(3, 28), (9, 20), (10, 3), (16, 45), (22, 61)],
    [(1, 1), (7, 6), (13, 25), (19, 8), (20, 18)],
    [(4, 27), (5, 36), (11, 10), (17, 15), (23, 56)],
    [(2, 62), (8, 55), (14, 39), (15, 41), (21, 2)],
];

/// The 24 rounds on 25 words, each word a register of every lane's word,
/// in the operations a kernel gives: `xor3` (of three), `xor`, `rol` (by a
/// constant, once inlined), `chi` (a ^ (!b & c)) and `splat` (a constant
/// in every lane). Inlined into each kernel, so compiled with its features.
#[inline(always)]
fn rounds<W: Copy>(
    a: &mut [W; 25],
    xor3: impl Fn(W, W, W) -> W,
    xor: impl Fn(W, W) -> W,
    rol: impl Fn(W, u32) -> W,
    chi: impl Fn(W, W, W) -> W,
    splat: impl Fn(u64) -> W,
) {
    for rc in RC {
        // θ: each column's parity, folded into its two neighbours.
        let c: [W; 5] = core::array::from_fn(|x| xor3(xor3(a[x], a[x + 5], a[x + 10]), a[x + 15], a[x + 20]));
        let d: [W; 5] = core::array::from_fn(|x| xor(c[(x + 4) % 5], rol(c[(x + 1) % 5], 1)));
        // ρ, π and χ a row of the new state at a time, so that only one
        // row's five rotated words live at once (fewer spills in AVX2's
        // sixteen registers): row y's word x is b[x] ^ (!b[x+1] & b[x+2]).
        let mut e = *a;
        for (y, row) in PI_RHO.iter().enumerate() {
            let b: [W; 5] = core::array::from_fn(|x| {
                let (w, r) = row[x];
                let v = xor(a[w], d[w % 5]);
                if r == 0 { v } else { rol(v, r) }
            });
            for x in 0..5 {
                e[5 * y + x] = chi(b[x], b[(x + 1) % 5], b[(x + 2) % 5]);
            }
        }
        *a = e;
        // ι.
        a[0] = xor(a[0], splat(rc));
    }
}

/// The permutation on eight states at once, one 512-bit register a word:
/// a round is 25 rotates, about 30 three-input logic operations
/// (`vpternlogq`: 0x96 is a three-way XOR, 0xd2 is χ) and a few XORs.
#[target_feature(enable = "avx512f")]
fn permute_avx512(state: &mut State<LANES_512>) {
    // SAFETY (both): each word is 64 bytes, read and written unaligned.
    let mut a: [__m512i; 25] = core::array::from_fn(|w| unsafe { _mm512_loadu_si512(state[w].as_ptr().cast()) });
    rounds(
        &mut a,
        |x, y, z| _mm512_ternarylogic_epi64::<0x96>(x, y, z),
        |x, y| _mm512_xor_si512(x, y),
        |x, n| _mm512_rolv_epi64(x, _mm512_set1_epi64(i64::from(n))),
        |x, y, z| _mm512_ternarylogic_epi64::<0xd2>(x, y, z),
        |c| _mm512_set1_epi64(c as i64),
    );
    for (w, v) in state.iter_mut().zip(a) {
        unsafe { _mm512_storeu_si512(w.as_mut_ptr().cast(), v) };
    }
}

/// The permutation on four states at once in AVX2 (CPUs without
/// AVX-512): rotates as two shifts and an OR, χ as an AND-NOT and an XOR.
#[target_feature(enable = "avx2")]
fn permute_avx2(state: &mut State<LANES_256>) {
    // SAFETY (both): each word is 32 bytes, read and written unaligned.
    let mut a: [__m256i; 25] = core::array::from_fn(|w| unsafe { _mm256_loadu_si256(state[w].as_ptr().cast()) });
    rounds(
        &mut a,
        |x, y, z| _mm256_xor_si256(_mm256_xor_si256(x, y), z),
        |x, y| _mm256_xor_si256(x, y),
        |x, n| {
            let (l, r) = (_mm_cvtsi32_si128(n as i32), _mm_cvtsi32_si128(64 - n as i32));
            _mm256_or_si256(_mm256_sll_epi64(x, l), _mm256_srl_epi64(x, r))
        },
        |x, y, z| _mm256_xor_si256(x, _mm256_andnot_si256(y, z)),
        |c| _mm256_set1_epi64x(c as i64),
    );
    for (w, v) in state.iter_mut().zip(a) {
        unsafe { _mm256_storeu_si256(w.as_mut_ptr().cast(), v) };
    }
}

/// A SHA-3 sponge: its rate in bytes and the padding's first byte (the
/// domain bits: 0x06 for SHA3-*, 0x1f for SHAKE*).
#[derive(Clone, Copy)]
pub(crate) struct Sponge {
    rate: usize,
    pad: u8,
}

pub(crate) const SHA3_256: Sponge = Sponge { rate: 136, pad: 0x06 };
pub(crate) const SHA3_512: Sponge = Sponge { rate: 72, pad: 0x06 };
pub(crate) const SHAKE128: Sponge = Sponge { rate: 168, pad: 0x1f };
pub(crate) const SHAKE256: Sponge = Sponge { rate: 136, pad: 0x1f };

/// One hash to compute: a sponge, its input and where its output goes.
pub(crate) struct Job<'a> {
    pub(crate) sponge: Sponge,
    pub(crate) input: &'a [u8],
    pub(crate) output: &'a mut [u8],
}

/// Where a lane stands in its job: absorbing block `next` of `blocks`
/// (the last one padded), or squeezing from byte `at` of its output.
#[derive(Clone, Copy)]
enum Step {
    Idle,
    Absorb { job: usize, next: usize, blocks: usize },
    Squeeze { job: usize, at: usize },
}

/// Runs every job, each in a lane of its own, eight lanes to a
/// permutation (four in AVX2): a lane that finishes takes the next job at
/// once, so jobs of any sponge and any length share permutations.
pub(crate) fn run(cpu: Cpu, jobs: &mut [Job<'_>]) {
    match cpu {
        // SAFETY: an `Avx512` exists only where `available()` found AVX-512F.
        Cpu::Avx512(_) => run_lanes::<LANES_512>(jobs, |s| unsafe { permute_avx512(s) }),
        // SAFETY: an `Avx2` exists only where the CPU check found AVX2.
        Cpu::Avx2(_) => run_lanes::<LANES_256>(jobs, |s| unsafe { permute_avx2(s) }),
    }
}

#[inline(always)]
fn run_lanes<const L: usize>(jobs: &mut [Job<'_>], mut permute: impl FnMut(&mut State<L>)) {
    let mut state: State<L> = [[0; L]; 25];
    let mut lanes = [Step::Idle; L];
    let mut queued = 0;
    loop {
        // Idle lanes take the next jobs; absorbing lanes take in a block.
        for (l, step) in lanes.iter_mut().enumerate() {
            if let Step::Idle = step
                && queued < jobs.len()
            {
                state.iter_mut().for_each(|w| w[l] = 0);
                let blocks = jobs[queued].input.len() / jobs[queued].sponge.rate + 1;
                *step = Step::Absorb { job: queued, next: 0, blocks };
                queued += 1;
            }
            if let Step::Absorb { job, next, .. } = *step {
                absorb_block(&mut state, l, &jobs[job], next);
            }
        }
        if lanes.iter().all(|s| matches!(s, Step::Idle)) {
            break;
        }
        permute(&mut state);
        // Lanes past their last block give output.
        for (l, step) in lanes.iter_mut().enumerate() {
            let (job, at) = match *step {
                Step::Idle => continue,
                Step::Absorb { job, next, blocks } if next + 1 < blocks => {
                    *step = Step::Absorb { job, next: next + 1, blocks };
                    continue;
                }
                Step::Absorb { job, .. } => (job, 0),
                Step::Squeeze { job, at } => (job, at),
            };
            let Job { sponge, output, .. } = &mut jobs[job];
            let take = (output.len() - at).min(sponge.rate);
            squeeze_block(&state, l, &mut output[at..at + take]);
            *step = if at + take < output.len() { Step::Squeeze { job, at: at + take } } else { Step::Idle };
        }
    }
    state.zeroize();
}

/// XORs block `b` of the job's input (the last one padded) into lane `l`,
/// word by word: no copy of the input (which may be secret) is made.
#[inline]
fn absorb_block<const L: usize>(state: &mut State<L>, l: usize, job: &Job<'_>, b: usize) {
    let rate = job.sponge.rate;
    let from = b * rate;
    let end = (from + rate).min(job.input.len());
    let mut words = job.input[from..end].chunks_exact(8);
    for (w, word) in (&mut words).enumerate() {
        state[w][l] ^= le64(word);
    }
    if end - from == rate {
        return;
    }
    // The last block: its partial word, then the padding.
    let tail = end - from;
    let mut last = 0u64;
    for (i, &byte) in words.remainder().iter().enumerate() {
        last |= u64::from(byte) << (8 * i);
    }
    last ^= u64::from(job.sponge.pad) << (8 * (tail % 8));
    state[tail / 8][l] ^= last;
    state[rate / 8 - 1][l] ^= 0x80 << 56;
}

/// Copies the first `out.len()` bytes (at most a rate) of lane `l` out.
#[inline]
fn squeeze_block<const L: usize>(state: &State<L>, l: usize, out: &mut [u8]) {
    let last = (out.len() / 8).min(24);
    let mut words = out.chunks_exact_mut(8);
    for (w, chunk) in (&mut words).enumerate() {
        chunk.copy_from_slice(&state[w][l].to_le_bytes());
    }
    let rest = words.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&state[last][l].to_le_bytes()[..n]);
}

impl Sponge {
    /// Hashes each of `inputs` into the output of the same index.
    pub(crate) fn hash_many(self, cpu: Cpu, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) {
        assert_eq!(inputs.len(), outputs.len());
        let mut jobs: Vec<Job<'_>> =
            inputs.iter().zip(outputs.iter_mut()).map(|(input, output)| Job { sponge: self, input, output }).collect();
        run(cpu, &mut jobs);
    }
}

/// Eight bytes, little-endian, from a slice of exactly eight.
#[inline(always)]
fn le64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    u64::from_le_bytes(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn one(s: Sponge, msg: &[u8], out_len: usize) -> Vec<u8> {
        let mut out = vec![0u8; out_len];
        let cpu = Cpu::detect().expect("the callers check the CPU first");
        s.hash_many(cpu, &[msg], &mut [&mut out[..]]);
        out
    }

    #[test]
    fn constants_are_keccaks() {
        assert_eq!(RC[0], 1);
        assert_eq!(RC[1], 0x8082);
        assert_eq!(RC[23], 0x8000_0000_8000_8008);
    }

    #[test]
    fn known_digests() {
        if Cpu::detect().is_none() {
            return;
        }
        assert_eq!(hex(&one(SHA3_256, b"", 32)), "a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a");
        assert_eq!(hex(&one(SHA3_256, b"abc", 32)), "3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532");
        assert_eq!(
            hex(&one(SHA3_512, b"abc", 64)),
            "b751850b1a57168a5693cd924b6b096e08f621827444f70d884f5d0240d2712e\
             10e116e9192af3c91a7ec57647e3934057340b4cf408d5a56592f8274eec53f0"
        );
        assert_eq!(hex(&one(SHAKE128, b"", 16)), "7f9c2ba4e88f827d616045507605853e");
        assert_eq!(hex(&one(SHAKE256, b"", 16)), "46b9dd2b0ba88d13233b3feb743eeb24");
        // Many blocks in, many out (digests from Python's hashlib).
        let long: Vec<u8> = (0..1184).map(|j| (j * 7) as u8).collect();
        assert_eq!(hex(&one(SHA3_256, &long, 32)), "aae48deefd5b39a4c4db3e9a2206c51dc93143139d915069d99c1d786938edf6");
        let seed: Vec<u8> = (0..34).collect();
        assert_eq!(hex(&one(SHAKE128, &seed, 504)[488..]), "29ff7d3b267b841f9b09aec0c57eddd9");
        // Messages of exactly one block: the padding takes a block of its own.
        let block: Vec<u8> = (0..136).collect();
        assert_eq!(hex(&one(SHA3_512, &block[..72], 16)), "5d63f2bbe971a983ac6847480106e4e1");
        assert_eq!(hex(&one(SHAKE256, &block, 200)[184..]), "654c53427abb3932a40afb86b76373e6");
    }

    /// Lanes are independent, messages may span blocks, and outputs of
    /// many blocks match squeezing one lane alone.
    #[test]
    fn lanes_match_one_at_a_time() {
        let Some(cpu) = Cpu::detect() else { return };
        for (s, len, out_len) in [(SHA3_256, 1184, 32), (SHAKE128, 34, 504), (SHAKE256, 33, 128), (SHA3_512, 72, 64)] {
            let msgs: Vec<Vec<u8>> = (0..11).map(|i| (0..len).map(|j| (i * 31 + j * 7) as u8).collect()).collect();
            let mut outs = vec![vec![0u8; out_len]; msgs.len()];
            let ins: Vec<&[u8]> = msgs.iter().map(Vec::as_slice).collect();
            let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
            s.hash_many(cpu, &ins, &mut refs);
            for (m, o) in msgs.iter().zip(&outs) {
                assert_eq!(&one(s, m, out_len), o);
            }
            assert_ne!(outs[0], outs[1]);
        }
    }
}
