//! Poly1305 (RFC 8439) across packets: eight independent messages at once,
//! one per 64-bit lane, with the AVX-512 IFMA multiplier (four at once in
//! AVX2 on CPUs without it: [`avx2`]). Numbers are three
//! limbs of radix 2^44 (44 + 44 + 42 bits for 2^130 - 5); a product's
//! partial sums are split at 52 bits by the instructions themselves and
//! folded back with 2^132 = 20 (mod p). Each lane has its own key and
//! length; a lane whose message has ended keeps its accumulator through a
//! mask blend. The final reduction and the addition of `s` run per lane
//! without branches on secrets. The portable version computes the same in
//! the same radix with 128-bit products.
//!
//! `unsafe` is the IFMA kernel's: intrinsics behind a run-time CPU check,
//! and lane values through plain arrays.

#![allow(unsafe_code)]

use core::arch::x86_64::*;

pub(crate) mod avx2;

/// Messages per IFMA batch.
pub const POLY_LANES: usize = 8;

const MASK44: u64 = (1 << 44) - 1;
const MASK42: u64 = (1 << 42) - 1;

/// What a tag covers.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    /// A message as it is (RFC 8439 section 2.5).
    Raw(&'a [u8]),
    /// The AEAD's MAC data (section 2.8): the associated data and the
    /// ciphertext, each zero-padded to 16 bytes, then both lengths.
    Aead { aad: &'a [u8], ct: &'a [u8] },
}

impl Input<'_> {
    fn blocks(&self) -> usize {
        match self {
            Input::Raw(m) => m.len().div_ceil(16),
            Input::Aead { aad, ct } => aad.len().div_ceil(16) + ct.len().div_ceil(16) + 1,
        }
    }

    /// Block `i` when it is 16 bytes of the data as they are (with 2^128
    /// added): the common case, which the kernel loads with a gather.
    fn whole(&self, i: usize) -> Option<&[u8; 16]> {
        let (seg, k) = match *self {
            Input::Raw(m) => (m, i),
            Input::Aead { aad, ct } => {
                let a = aad.len().div_ceil(16);
                if i < a { (aad, i) } else { (ct, i - a) }
            }
        };
        seg.get(k * 16..)?.first_chunk::<16>()
    }

    /// Where the blocks start that are whole and contiguous from block 0,
    /// and how many there are: what the kernel loads without looking at
    /// each lane.
    fn leading(&self) -> (*const u8, usize) {
        let seg = match *self {
            Input::Raw(m) => m,
            Input::Aead { aad: [], ct } => ct,
            Input::Aead { aad, .. } => aad,
        };
        (seg.as_ptr(), seg.len() / 16)
    }

    /// Block `i` as limbs, or `None` past the end.
    fn block(&self, i: usize) -> Option<[u64; 3]> {
        self.padded(i).map(|(b, top)| limbs_of(&b, top))
    }

    /// Block `i` as 16 bytes and the bit above them (2^128): a whole block
    /// with the bit set; a message's last part padded with a 1 byte and the
    /// bit clear; the AEAD's parts zero-padded and its length block, with
    /// the bit set. `None` past the end.
    fn padded(&self, i: usize) -> Option<([u8; 16], u64)> {
        match *self {
            Input::Raw(m) => {
                let start = i * 16;
                if start >= m.len() {
                    return None;
                }
                let chunk = &m[start..m.len().min(start + 16)];
                let mut b = [0u8; 17];
                b[..chunk.len()].copy_from_slice(chunk);
                b[chunk.len()] = 1;
                let mut block = [0u8; 16];
                block.copy_from_slice(&b[..16]);
                Some((block, u64::from(b[16])))
            }
            Input::Aead { aad, ct } => {
                let (a, c) = (aad.len().div_ceil(16), ct.len().div_ceil(16));
                let padded = |seg: &[u8], k: usize| {
                    let chunk = &seg[k * 16..seg.len().min(k * 16 + 16)];
                    let mut b = [0u8; 16];
                    b[..chunk.len()].copy_from_slice(chunk);
                    b
                };
                let b = if i < a {
                    padded(aad, i)
                } else if i < a + c {
                    padded(ct, i - a)
                } else if i == a + c {
                    let mut b = [0u8; 16];
                    b[..8].copy_from_slice(&(aad.len() as u64).to_le_bytes());
                    b[8..].copy_from_slice(&(ct.len() as u64).to_le_bytes());
                    b
                } else {
                    return None;
                };
                Some((b, 1))
            }
        }
    }
}

/// One tag to compute with its one-time key.
pub struct PolyJob<'a> {
    pub key: &'a [u8; 32],
    pub input: Input<'a>,
    pub tag: &'a mut [u8; 16],
}

fn le64(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    u64::from_le_bytes(w)
}

/// `r` (clamped) in radix 2^44.
fn r_limbs(key: &[u8; 32]) -> [u64; 3] {
    let lo = le64(&key[0..8]) & 0x0fff_fffc_0fff_ffff;
    let hi = le64(&key[8..16]) & 0x0fff_fffc_0fff_fffc;
    [lo & MASK44, ((lo >> 44) | (hi << 20)) & MASK44, hi >> 24]
}

/// A 16-byte block and the bit above it (2^128) as limbs.
fn limbs_of(b: &[u8; 16], top: u64) -> [u64; 3] {
    let (lo, hi) = (le64(&b[0..8]), le64(&b[8..16]));
    [lo & MASK44, ((lo >> 44) | (hi << 20)) & MASK44, (hi >> 24) | (top << 40)]
}

/// h·r mod p (partly reduced: limbs below 2^44, 2^44 + 1, 2^42).
fn mul_portable(h: [u64; 3], r: [u64; 3]) -> [u64; 3] {
    let m = |a: u64, b: u64| u128::from(a) * u128::from(b);
    let (r1_20, r2_20) = (r[1] * 20, r[2] * 20);
    let d0 = m(h[0], r[0]) + m(h[1], r2_20) + m(h[2], r1_20);
    let d1 = m(h[0], r[1]) + m(h[1], r[0]) + m(h[2], r2_20);
    let d2 = m(h[0], r[2]) + m(h[1], r[1]) + m(h[2], r[0]);
    let mut out = [0u64; 3];
    let mut c = d0 >> 44;
    out[0] = (d0 as u64) & MASK44;
    let d1 = d1 + c;
    c = d1 >> 44;
    out[1] = (d1 as u64) & MASK44;
    let d2 = d2 + c;
    c = d2 >> 42;
    out[2] = (d2 as u64) & MASK42;
    let t = u128::from(out[0]) + c * 5;
    out[0] = (t as u64) & MASK44;
    out[1] += (t >> 44) as u64;
    out
}

/// The tag from the accumulator: reduced mod p without branches, plus `s`.
fn finish(h: [u64; 3], key: &[u8; 32]) -> [u8; 16] {
    // Carry fully: limbs below 2^44, 2^44, 2^42 (value below 2^130 + small).
    let mut h = h;
    let c = h[1] >> 44;
    h[1] &= MASK44;
    h[2] += c;
    let c = h[2] >> 42;
    h[2] &= MASK42;
    h[0] += c * 5;
    let c = h[0] >> 44;
    h[0] &= MASK44;
    h[1] += c;
    let c = h[1] >> 44;
    h[1] &= MASK44;
    h[2] += c;
    // g = h + 5 - 2^130; use it when it does not borrow.
    let mut g = [0u64; 3];
    let t = h[0] + 5;
    g[0] = t & MASK44;
    let t = h[1] + (t >> 44);
    g[1] = t & MASK44;
    let t = h[2] + (t >> 44);
    g[2] = t & MASK42;
    let use_g = 0u64.wrapping_sub(t >> 42); // all ones when h + 5 >= 2^130
    for i in 0..3 {
        h[i] = (h[i] & !use_g) | (g[i] & use_g);
    }
    let value = u128::from(h[0]) | (u128::from(h[1]) << 44) | (u128::from(h[2]) << 88);
    let s = u128::from_le_bytes(key[16..32].try_into().unwrap_or([0; 16]));
    value.wrapping_add(s).to_le_bytes()
}

/// One tag, portable.
pub fn tag_portable(key: &[u8; 32], input: Input<'_>) -> [u8; 16] {
    let r = r_limbs(key);
    let mut h = [0u64; 3];
    let mut i = 0;
    while let Some(n) = input.block(i) {
        h = mul_portable([h[0] + n[0], h[1] + n[1], h[2] + n[2]], r);
        i += 1;
    }
    finish(h, key)
}

/// Whether this CPU runs the eight-lane kernel.
pub fn ifma_available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512ifma")
}

/// Computes every job's tag: sixteen at a time with IFMA (two chains of
/// eight lanes; the last group with lanes to spare), eight at a time with
/// AVX2 (two sets of four), or one by one without either.
pub fn poly1305_batch(jobs: &mut [PolyJob<'_>]) {
    if ifma_available() {
        let whole = jobs.len() / (2 * POLY_LANES) * (2 * POLY_LANES);
        let (full, rest) = jobs.split_at_mut(whole);
        for group in full.chunks_exact_mut(2 * POLY_LANES) {
            // SAFETY: the CPU has AVX-512F and IFMA (checked above), the
            // kernel's target features.
            unsafe { tags::<2>(group) };
        }
        if rest.is_empty() {
            return;
        }
        if spread_is_cheaper(rest) {
            for job in rest {
                // SAFETY: as above.
                *job.tag = unsafe { tag_spread(job.key, job.input) };
            }
        } else {
            // SAFETY: as above.
            unsafe { if rest.len() > POLY_LANES { tags::<2>(rest) } else { tags::<1>(rest) } }
        }
        return;
    }
    if is_x86_feature_detected!("avx2") {
        for group in jobs.chunks_mut(2 * avx2::LANES) {
            // SAFETY: the CPU has AVX2 (checked above), the kernel's one
            // target feature.
            unsafe { if group.len() > avx2::LANES { avx2::tags::<2>(group) } else { avx2::tags::<1>(group) } }
        }
        return;
    }
    for job in jobs {
        *job.tag = tag_portable(job.key, job.input);
    }
}

fn to_vec(x: [u64; POLY_LANES]) -> __m512i {
    // SAFETY: `[u64; 8]` and `__m512i` are 64 bytes of plain integers; every
    // bit pattern is valid for both.
    unsafe { core::mem::transmute::<[u64; POLY_LANES], __m512i>(x) }
}

fn from_vec(v: __m512i) -> [u64; POLY_LANES] {
    // SAFETY: as in `to_vec`, the other way round.
    unsafe { core::mem::transmute::<__m512i, [u64; POLY_LANES]>(v) }
}

/// The key's limbs as vectors: r, and r1 and r2 times 20 (what wraps
/// past 2^130 comes back times 5, and the radix adds a factor of 4).
struct Key8 {
    r: [__m512i; 3],
    r1_20: __m512i,
    r2_20: __m512i,
}

impl Key8 {
    /// Lane j's multiplier from `r[j]`, its limbs below 2^52.
    fn new(r: [[u64; 3]; POLY_LANES]) -> Key8 {
        Key8 {
            r: std::array::from_fn(|k| to_vec(std::array::from_fn(|j| r[j][k]))),
            r1_20: to_vec(std::array::from_fn(|j| r[j][1] * 20)),
            r2_20: to_vec(std::array::from_fn(|j| r[j][2] * 20)),
        }
    }
}

/// h = (h + n) * r mod 2^130 - 5, partly reduced, in every lane of `active`.
#[target_feature(enable = "avx512f,avx512ifma")]
#[inline]
fn step(h: &mut [__m512i; 3], n: [__m512i; 3], k: &Key8, active: __mmask8) {
    let (r, r1_20, r2_20) = (&k.r, k.r1_20, k.r2_20);
    let mask44 = _mm512_set1_epi64(MASK44 as i64);
    let mask42 = _mm512_set1_epi64(MASK42 as i64);
    let zero = _mm512_setzero_si512();
    let a: [__m512i; 3] = std::array::from_fn(|i| _mm512_add_epi64(h[i], n[i]));
    // Partial sums of the 52-bit product halves at each 44-bit weight:
    // lo halves stay, hi halves (weight 2^52 = 2^44 * 2^8) move one
    // limb up, shifted by 8; what passes limb 2 comes back times 20.
    let lo0 =
        _mm512_madd52lo_epu64(_mm512_madd52lo_epu64(_mm512_madd52lo_epu64(zero, a[0], r[0]), a[1], r2_20), a[2], r1_20);
    let hi0 =
        _mm512_madd52hi_epu64(_mm512_madd52hi_epu64(_mm512_madd52hi_epu64(zero, a[0], r[0]), a[1], r2_20), a[2], r1_20);
    let lo1 =
        _mm512_madd52lo_epu64(_mm512_madd52lo_epu64(_mm512_madd52lo_epu64(zero, a[0], r[1]), a[1], r[0]), a[2], r2_20);
    let hi1 =
        _mm512_madd52hi_epu64(_mm512_madd52hi_epu64(_mm512_madd52hi_epu64(zero, a[0], r[1]), a[1], r[0]), a[2], r2_20);
    let lo2 =
        _mm512_madd52lo_epu64(_mm512_madd52lo_epu64(_mm512_madd52lo_epu64(zero, a[0], r[2]), a[1], r[1]), a[2], r[0]);
    let hi2 =
        _mm512_madd52hi_epu64(_mm512_madd52hi_epu64(_mm512_madd52hi_epu64(zero, a[0], r[2]), a[1], r[1]), a[2], r[0]);
    // hi2 * 20 * 2^8 = hi2 * 5120 = (hi2 << 12) + (hi2 << 10). Rotates,
    // not shifts (the same here: hi2 and c stay below 2^44): LLVM turns
    // two shifts and an add into a 64-bit multiply, which AVX-512F has
    // only as two `vpmuludq` and more, on this chain's critical path.
    let d0 = _mm512_add_epi64(lo0, _mm512_add_epi64(_mm512_rol_epi64::<12>(hi2), _mm512_rol_epi64::<10>(hi2)));
    let d1 = _mm512_add_epi64(lo1, _mm512_slli_epi64::<8>(hi0));
    let d2 = _mm512_add_epi64(lo2, _mm512_slli_epi64::<8>(hi1));
    let c = _mm512_srli_epi64::<44>(d0);
    let x0 = _mm512_and_si512(d0, mask44);
    let d1 = _mm512_add_epi64(d1, c);
    let c = _mm512_srli_epi64::<44>(d1);
    let x1 = _mm512_and_si512(d1, mask44);
    let d2 = _mm512_add_epi64(d2, c);
    let c = _mm512_srli_epi64::<42>(d2);
    let x2 = _mm512_and_si512(d2, mask42);
    // c * 5 = (c << 2) + c.
    let t = _mm512_add_epi64(x0, _mm512_add_epi64(_mm512_rol_epi64::<2>(c), c));
    let x0 = _mm512_and_si512(t, mask44);
    let x1 = _mm512_add_epi64(x1, _mm512_srli_epi64::<44>(t));
    h[0] = _mm512_mask_blend_epi64(active, h[0], x0);
    h[1] = _mm512_mask_blend_epi64(active, h[1], x1);
    h[2] = _mm512_mask_blend_epi64(active, h[2], x2);
}

/// Whole blocks gathered at the addresses in `at` (16 bytes each, lanes in
/// `whole`), as limbs with 2^128 added.
///
/// # Safety
/// Every lane in `whole` holds the address of 16 readable bytes.
#[target_feature(enable = "avx512f,avx512ifma")]
#[inline]
unsafe fn gather_blocks(at: __m512i, whole: __mmask8) -> [__m512i; 3] {
    let zero = _mm512_setzero_si512();
    // SAFETY: the caller's: masked-off lanes read nothing.
    let (lo, hi) = unsafe {
        (
            _mm512_mask_i64gather_epi64::<1>(zero, whole, at, core::ptr::null()),
            _mm512_mask_i64gather_epi64::<1>(
                zero,
                whole,
                _mm512_add_epi64(at, _mm512_set1_epi64(8)),
                core::ptr::null(),
            ),
        )
    };
    limbs(lo, hi)
}

/// Whether a part-empty group's messages cost less one at a time across
/// the lanes ([`tag_spread`]) than one a lane: the lanes take as many
/// steps as the longest message has blocks; spread, a message takes an
/// eighth of its blocks' steps and about eight more for its powers of r,
/// its first blocks and the final sum. Decided by lengths only.
fn spread_is_cheaper(jobs: &[PolyJob<'_>]) -> bool {
    let longest = jobs.iter().map(|j| j.input.blocks()).max().unwrap_or(0);
    let spread: usize = jobs.iter().map(|j| j.input.blocks() / POLY_LANES + 8).sum();
    spread < longest
}

/// One message's tag with its blocks across the eight lanes. Its first
/// `n mod 8` blocks (n blocks in all) run in the portable code; lane j
/// then takes blocks j, j + 8, j + 16, … of the rest, multiplying by r^8
/// after each and by r^(8 - j) after its last, so that every block ends
/// up multiplied by r to the power of its distance from the end, as the
/// one-at-a-time rule has it; the head's sum starts lane 0. The lanes'
/// sums added are the tag's accumulator.
#[target_feature(enable = "avx512f,avx512ifma")]
fn tag_spread(key: &[u8; 32], input: Input<'_>) -> [u8; 16] {
    let r = r_limbs(key);
    let n = input.blocks();
    let head = n % POLY_LANES;
    let mut h0 = [0u64; 3];
    for i in 0..head {
        if let Some(b) = input.block(i) {
            h0 = mul_portable([h0[0] + b[0], h0[1] + b[1], h0[2] + b[2]], r);
        }
    }
    let chunks = n / POLY_LANES;
    if chunks == 0 {
        return finish(h0, key);
    }
    // r, r^2, …, r^8, partly reduced (limbs below 2^44, 2^44 + 1, 2^42:
    // the kernel's bounds hold for them as for r).
    let mut powers = [r; POLY_LANES];
    for k in 1..POLY_LANES {
        powers[k] = mul_portable(powers[k - 1], r);
    }
    let middle = Key8::new([powers[POLY_LANES - 1]; POLY_LANES]);
    let last = Key8::new(std::array::from_fn(|j| powers[POLY_LANES - 1 - j]));
    let zero = _mm512_setzero_si512();
    let mut h: [__m512i; 3] = std::array::from_fn(|k| _mm512_mask_set1_epi64(zero, 1, h0[k] as i64));
    let (start, contiguous) = input.leading();
    let lo_index = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0);
    let hi_index = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
    for c in 0..chunks {
        let first = head + c * POLY_LANES;
        let blocks = if first + POLY_LANES <= contiguous {
            // SAFETY: blocks `first..first + 8` are whole and contiguous
            // from `start` (`leading`): 128 readable bytes there.
            let (v0, v1) = unsafe {
                let at = start.add(16 * first);
                (_mm512_loadu_si512(at.cast()), _mm512_loadu_si512(at.add(64).cast()))
            };
            limbs(_mm512_permutex2var_epi64(v0, lo_index, v1), _mm512_permutex2var_epi64(v0, hi_index, v1))
        } else {
            let each: [[u64; 3]; POLY_LANES] = std::array::from_fn(|j| input.block(first + j).unwrap_or([0; 3]));
            std::array::from_fn(|k| to_vec(std::array::from_fn(|j| each[j][k])))
        };
        step(&mut h, blocks, if c + 1 == chunks { &last } else { &middle }, 0xff);
    }
    let lanes: [[u64; POLY_LANES]; 3] = std::array::from_fn(|k| from_vec(h[k]));
    // Eight sums of limbs below 2^45: below 2^48, reduced by a product with 1.
    let sum: [u64; 3] = std::array::from_fn(|k| lanes[k].iter().sum());
    finish(mul_portable(sum, [1, 0, 0]), key)
}

/// Sixty-four zero bytes: what an idle lane loads.
static ZERO64: [u8; 64] = [0; 64];

/// Four blocks of each of eight lanes, loaded whole (64 bytes at each
/// address in `at`) and transposed: the result's entry k is block k of
/// every lane as limbs, with 2^128 added: 8 loads and 24 shuffles for
/// four steps, where [`gather_blocks`] takes two gathers a step (on an
/// Intel Xeon, family 6 model 207, about 30% of this kernel's samples sat
/// on the instructions waiting for them). A lane's row of eight quadwords
/// (lo and hi of each block) becomes eight columns in three rounds of
/// shuffles: 64-bit pairs, then 128-bit chunks twice.
///
/// # Safety
/// Every address in `at` has 64 readable bytes.
#[target_feature(enable = "avx512f,avx512ifma")]
#[inline]
unsafe fn load4(at: [*const u8; POLY_LANES]) -> [[__m512i; 3]; 4] {
    // SAFETY: the caller's: 64 readable bytes at each address.
    let v: [__m512i; POLY_LANES] = std::array::from_fn(|j| unsafe { _mm512_loadu_si512(at[j].cast()) });
    // t[2p] = lo quadwords of rows 2p, 2p+1 pairwise; t[2p+1] = hi ones:
    // 128-bit chunk k of either holds block k of both rows.
    let t: [__m512i; POLY_LANES] = std::array::from_fn(|i| {
        let (a, b) = (v[i & !1], v[i | 1]);
        if i % 2 == 0 { _mm512_unpacklo_epi64(a, b) } else { _mm512_unpackhi_epi64(a, b) }
    });
    // For the lo (h = 0) and hi (h = 1) halves: a 4x4 transpose of the
    // chunks of t[h], t[2+h], t[4+h], t[6+h].
    let half = |h: usize| -> [__m512i; 4] {
        let u0 = _mm512_shuffle_i64x2::<0x88>(t[h], t[2 + h]);
        let u1 = _mm512_shuffle_i64x2::<0xdd>(t[h], t[2 + h]);
        let u2 = _mm512_shuffle_i64x2::<0x88>(t[4 + h], t[6 + h]);
        let u3 = _mm512_shuffle_i64x2::<0xdd>(t[4 + h], t[6 + h]);
        [
            _mm512_shuffle_i64x2::<0x88>(u0, u2),
            _mm512_shuffle_i64x2::<0x88>(u1, u3),
            _mm512_shuffle_i64x2::<0xdd>(u0, u2),
            _mm512_shuffle_i64x2::<0xdd>(u1, u3),
        ]
    };
    let (lo, hi) = (half(0), half(1));
    std::array::from_fn(|k| limbs(lo[k], hi[k]))
}

/// A block's two 64-bit halves in every lane as limbs, with 2^128 added.
#[target_feature(enable = "avx512f,avx512ifma")]
#[inline]
fn limbs(lo: __m512i, hi: __m512i) -> [__m512i; 3] {
    let mask44 = _mm512_set1_epi64(MASK44 as i64);
    let g0 = _mm512_and_si512(lo, mask44);
    let g1 = _mm512_and_si512(_mm512_or_si512(_mm512_srli_epi64::<44>(lo), _mm512_slli_epi64::<20>(hi)), mask44);
    let g2 = _mm512_or_si512(_mm512_srli_epi64::<24>(hi), _mm512_set1_epi64(1 << 40));
    [g0, g1, g2]
}

/// Up to `8·S` tags; lanes past `jobs.len()` idle. Each set of eight lanes
/// is one dependent chain of multiply, accumulate and carry per block, so
/// one set leaves the multiplier waiting on its own latency: `S` sets are
/// stepped side by side in one loop to fill it.
#[target_feature(enable = "avx512f,avx512ifma")]
fn tags<const S: usize>(jobs: &mut [PolyJob<'_>]) {
    let lanes = jobs.len().min(S * POLY_LANES);
    let job = |j: usize| jobs.get(j).filter(|_| j < lanes);
    let present: [__mmask8; S] = std::array::from_fn(|s| {
        let n = lanes.saturating_sub(s * POLY_LANES).min(POLY_LANES);
        ((1u16 << n) - 1) as u8
    });
    let keys: [Key8; S] = std::array::from_fn(|s| {
        Key8::new(std::array::from_fn(|j| job(s * POLY_LANES + j).map_or([0; 3], |job| r_limbs(job.key))))
    });
    let zero = _mm512_setzero_si512();
    let mut h = [[zero; 3]; S];
    let blocks = jobs.iter().take(lanes).map(|j| j.input.blocks()).max().unwrap_or(0);
    // First the blocks every lane has whole, at addresses that step by 16:
    // no look at each lane per block.
    let leading: [[(*const u8, usize); POLY_LANES]; S] = std::array::from_fn(|s| {
        std::array::from_fn(|j| job(s * POLY_LANES + j).map_or((core::ptr::null(), 0), |job| job.input.leading()))
    });
    let common = leading.iter().flatten().take(lanes).map(|l| l.1).min().unwrap_or(0);
    // Four at a time, loaded whole; idle lanes load zeros.
    let mut done = 0;
    while done + 4 <= common {
        let blocks: [[[__m512i; 3]; 4]; S] = std::array::from_fn(|s| {
            let at: [*const u8; POLY_LANES] = std::array::from_fn(|j| {
                if present[s] & (1 << j) != 0 { leading[s][j].0.wrapping_add(16 * done) } else { ZERO64.as_ptr() }
            });
            // SAFETY: blocks done..done + 4 < `common` of every present
            // lane are whole, 64 readable bytes at its segment's start
            // plus 16 done, borrowed for this call; idle lanes read ZERO64.
            unsafe { load4(at) }
        });
        // The S chains side by side, a block of each at a time.
        for k in 0..4 {
            for ((h, b), (key, &active)) in h.iter_mut().zip(&blocks).zip(keys.iter().zip(&present)) {
                step(h, b[k], key, active);
            }
        }
        done += 4;
    }
    let mut at: [__m512i; S] =
        std::array::from_fn(|s| to_vec(std::array::from_fn(|j| leading[s][j].0.wrapping_add(16 * done) as u64)));
    let sixteen = _mm512_set1_epi64(16);
    for _ in done..common {
        for s in 0..S {
            // SAFETY: block i < `common` of every present lane is whole: 16
            // readable bytes at its segment's start plus 16 i, borrowed for
            // this call; idle lanes are masked off.
            let n = unsafe { gather_blocks(at[s], present[s]) };
            step(&mut h[s], n, &keys[s], present[s]);
            at[s] = _mm512_add_epi64(at[s], sixteen);
        }
    }
    // Then the rest lane by lane: whole blocks by address, padded and
    // length blocks as limbs, made one by one.
    for i in common..blocks {
        for s in 0..S {
            let mut addr = [0u64; POLY_LANES];
            let mut whole: u8 = 0;
            let mut n = [[0u64; POLY_LANES]; 3];
            let mut made: u8 = 0;
            for j in 0..POLY_LANES {
                let Some(job) = job(s * POLY_LANES + j) else { break };
                if let Some(b) = job.input.whole(i) {
                    addr[j] = b.as_ptr() as u64;
                    whole |= 1 << j;
                } else if let Some(b) = job.input.block(i) {
                    made |= 1 << j;
                    for k in 0..3 {
                        n[k][j] = b[k];
                    }
                }
            }
            // SAFETY: each lane in `whole` holds the address of 16 readable
            // bytes of its job's input, borrowed for this call.
            let g = unsafe { gather_blocks(to_vec(addr), whole) };
            let nv: [__m512i; 3] = std::array::from_fn(|k| _mm512_mask_blend_epi64(made, g[k], to_vec(n[k])));
            step(&mut h[s], nv, &keys[s], whole | made);
        }
    }
    for (s, h) in h.iter().enumerate() {
        let limbs: [[u64; POLY_LANES]; 3] = std::array::from_fn(|k| from_vec(h[k]));
        for (j, job) in jobs.iter_mut().skip(s * POLY_LANES).take(POLY_LANES).enumerate() {
            *job.tag = finish([limbs[0][j], limbs[1][j], limbs[2][j]], job.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use poly1305::universal_hash::KeyInit;

    fn reference(key: &[u8; 32], msg: &[u8]) -> [u8; 16] {
        poly1305::Poly1305::new(key.into()).compute_unpadded(msg).into()
    }

    #[test]
    fn rfc_8439_vector() {
        // Section 2.5.2.
        let key: [u8; 32] = [
            0x85, 0xd6, 0xbe, 0x78, 0x57, 0x55, 0x6d, 0x33, 0x7f, 0x44, 0x52, 0xfe, 0x42, 0xd5, 0x06, 0xa8, 0x01, 0x03,
            0x80, 0x8a, 0xfb, 0x0d, 0xb2, 0xfd, 0x4a, 0xbf, 0xf6, 0xaf, 0x41, 0x49, 0xf5, 0x1b,
        ];
        let want = [0xa8, 0x06, 0x1d, 0xc1, 0x30, 0x51, 0x36, 0xc6, 0xc2, 0x2b, 0x8b, 0xaf, 0x0c, 0x01, 0x27, 0xa9];
        let msg = Input::Raw(b"Cryptographic Forum Research Group");
        assert_eq!(tag_portable(&key, msg), want);
        let mut tags = [[0u8; 16]; 9];
        let mut jobs: Vec<PolyJob<'_>> = tags.iter_mut().map(|t| PolyJob { key: &key, input: msg, tag: t }).collect();
        poly1305_batch(&mut jobs);
        assert!(tags.iter().all(|t| *t == want));
    }

    #[test]
    fn a_message_spread_across_the_lanes_matches_the_portable_tag() {
        if !ifma_available() {
            return;
        }
        // Every length to 40 blocks and some beyond, as a plain message
        // and as the AEAD's input (with and without associated data, whose
        // blocks are then not contiguous with the ciphertext's).
        let mut rng = fastrand::Rng::with_seed(0x5bead);
        let lens: Vec<usize> = (0..=640).chain((0..40).map(|_| rng.usize(641..=4000))).collect();
        for len in lens {
            let key: [u8; 32] = if len % 7 == 0 { [0xff; 32] } else { std::array::from_fn(|_| rng.u8(..)) };
            let msg: Vec<u8> = (0..len).map(|_| if len % 5 == 0 { 0xff } else { rng.u8(..) }).collect();
            let aad: Vec<u8> = (0..len % 37).map(|_| rng.u8(..)).collect();
            for input in [Input::Raw(&msg), Input::Aead { aad: &[], ct: &msg }, Input::Aead { aad: &aad, ct: &msg }] {
                // SAFETY: the CPU has AVX-512F and IFMA (checked above).
                let spread = unsafe { tag_spread(&key, input) };
                assert_eq!(spread, tag_portable(&key, input), "{len} bytes, {} blocks", input.blocks());
            }
            assert_eq!(tag_portable(&key, Input::Raw(&msg)), reference(&key, &msg));
        }
    }

    /// Tags of `keys` over `msgs` from the batch, against the reference.
    fn check_batch(keys: &[[u8; 32]], msgs: &[Vec<u8>]) {
        let mut tags = vec![[0u8; 16]; keys.len()];
        let mut jobs: Vec<PolyJob<'_>> = tags
            .iter_mut()
            .enumerate()
            .map(|(i, t)| PolyJob { key: &keys[i], input: Input::Raw(&msgs[i]), tag: t })
            .collect();
        poly1305_batch(&mut jobs);
        for i in 0..keys.len() {
            let want = reference(&keys[i], &msgs[i]);
            assert_eq!(tags[i], want, "job {i} of {}, {} bytes", keys.len(), msgs[i].len());
            assert_eq!(tag_portable(&keys[i], Input::Raw(&msgs[i])), want);
        }
    }

    #[test]
    fn long_messages_loaded_four_blocks_at_a_time_match_the_reference() {
        // Every message at least four blocks long, so that the kernel loads
        // whole rows and transposes them; every count of lanes, idle ones
        // included, in one chain and in two.
        let mut rng = fastrand::Rng::with_seed(0x4b10c);
        for n in 1..=2 * POLY_LANES {
            let keys: Vec<[u8; 32]> = (0..n).map(|_| std::array::from_fn(|_| rng.u8(..))).collect();
            let msgs: Vec<Vec<u8>> = (0..n).map(|_| (0..rng.usize(64..=1500)).map(|_| rng.u8(..)).collect()).collect();
            check_batch(&keys, &msgs);
        }
    }

    #[test]
    fn batches_match_the_reference_on_random_keys_and_lengths() {
        let mut rng = fastrand::Rng::with_seed(0x9011);
        for _ in 0..80 {
            let n = rng.usize(1..=20);
            let keys: Vec<[u8; 32]> = (0..n)
                .map(|_| {
                    // Some keys at the edges: r and s all ones.
                    if rng.u8(..8) == 0 { [0xff; 32] } else { std::array::from_fn(|_| rng.u8(..)) }
                })
                .collect();
            let msgs: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let len = rng.usize(0..=2048);
                    let fill = rng.u8(..4);
                    (0..len).map(|_| if fill == 0 { 0xff } else { rng.u8(..) }).collect()
                })
                .collect();
            check_batch(&keys, &msgs);
        }
    }
}
