//! AVX-512 IFMA kernels: eight independent big numbers, one per 64-bit lane.
//!
//! A number of `N` limbs is `[V; N]`, limb-major: `a[i]` holds limb `i` (52 bits,
//! least significant first) of all eight lanes. Each lane may use its own
//! modulus, so one batch can mix keys of one size.
//!
//! Montgomery arithmetic uses R = 2^(52·N). Every modulus `m` here satisfies
//! 4·m < R, which lets "almost Montgomery" results stay below 2·m without a final
//! subtraction: the inputs and outputs of [`amm`] and [`sqr`] are below 2·m, and
//! only [`sub_cond`] brings a value into [0, m). Nothing branches on or indexes
//! memory by a secret: loops run over public limb counts, table reads touch every
//! entry ([`select`]), and per-lane choices are mask blends.
//!
//! Every kernel is a safe function with `#[target_feature]`; the crate calls
//! them only after checking the CPU at run time (see `lib.rs`).

#![allow(unsafe_code)]

use core::arch::x86_64::*;

pub(crate) type V = __m512i;
pub(crate) const LANES: usize = 8;
const MASK52: i64 = (1 << 52) - 1;

/// Eight lane values into one vector.
#[inline]
pub(crate) fn from_lanes(x: [u64; LANES]) -> V {
    // SAFETY: `[u64; 8]` and `__m512i` are both 64 bytes of plain integers; every
    // bit pattern is valid for both, and transmute copies by value.
    unsafe { core::mem::transmute::<[u64; LANES], V>(x) }
}

/// One vector into its eight lane values.
#[inline]
pub(crate) fn to_lanes(v: V) -> [u64; LANES] {
    // SAFETY: as in `from_lanes`, the other way round.
    unsafe { core::mem::transmute::<V, [u64; LANES]>(v) }
}

#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn zero() -> V {
    _mm512_setzero_si512()
}

#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn lo(acc: V, a: V, b: V) -> V {
    _mm512_madd52lo_epu64(acc, a, b)
}

#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn hi(acc: V, a: V, b: V) -> V {
    _mm512_madd52hi_epu64(acc, a, b)
}

/// Propagates carries so that every limb is below 2^52. Limbs may be signed
/// (after a subtraction) as long as the whole value is non-negative and fits.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn normalize<const N: usize>(a: &mut [V; N]) {
    let mask = _mm512_set1_epi64(MASK52);
    let mut carry = zero();
    for x in a.iter_mut() {
        let t = _mm512_add_epi64(*x, carry);
        carry = _mm512_srai_epi64::<52>(t);
        *x = _mm512_and_si512(t, mask);
    }
}

/// Almost Montgomery multiplication: a·b·R⁻¹ mod m, below 2·m when a·b < 4·m².
///
/// Operand scanning with the reduction interleaved. The accumulator is a window
/// of `N + 1` limbs that slides down one limb per step, so with the inner loops
/// unrolled it lives in registers; each limb of `a` and `m` is loaded once per
/// step and feeds both the low and the high half product (zmm loads, not
/// multiplies, are the scarce resource).
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn amm<const N: usize>(a: &[V; N], b: &[V; N], m: &[V; N], k0: V) -> [V; N] {
    let mut acc = [zero(); N];
    let mut top = zero();
    for &bi in b.iter() {
        mac_row(&mut acc, &mut top, a, bi);
        let y = lo(zero(), acc[0], k0);
        // Add m·y and slide the window down one limb in the same pass: acc[0]
        // becomes a multiple of 2^52 and leaves, keeping only its carry.
        let carry = _mm512_srli_epi64::<52>(lo(acc[0], m[0], y));
        for j in 1..N {
            acc[j - 1] = hi(lo(acc[j], m[j], y), m[j - 1], y);
        }
        acc[N - 1] = hi(top, m[N - 1], y);
        top = zero();
        acc[0] = _mm512_add_epi64(acc[0], carry);
    }
    normalize(&mut acc);
    acc
}

/// window += x·s, where `acc` is limbs 0..N of the window and `top` limb N.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
fn mac_row<const N: usize>(acc: &mut [V; N], top: &mut V, x: &[V; N], s: V) {
    for j in 0..N - 1 {
        let xj = x[j];
        acc[j] = lo(acc[j], xj, s);
        acc[j + 1] = hi(acc[j + 1], xj, s);
    }
    acc[N - 1] = lo(acc[N - 1], x[N - 1], s);
    *top = hi(*top, x[N - 1], s);
}

/// Montgomery reduction of a `W = 2·N` limb value T < m·R: T·R⁻¹ mod m, below
/// 2·m. The limbs of T may exceed 52 bits (up to 2^60). Like [`amm`], it keeps a
/// window of `N + 1` limbs in registers and slides it one limb per step.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn redc<const N: usize, const W: usize>(t: &[V; W], m: &[V; N], k0: V) -> [V; N] {
    const { assert!(W == 2 * N) };
    let mut acc: [V; N] = core::array::from_fn(|j| t[j]);
    let mut top = t[N];
    for i in 0..N {
        let y = lo(zero(), acc[0], k0);
        let carry = _mm512_srli_epi64::<52>(lo(acc[0], m[0], y));
        for j in 1..N {
            acc[j - 1] = hi(lo(acc[j], m[j], y), m[j - 1], y);
        }
        acc[N - 1] = hi(top, m[N - 1], y);
        top = if i + N + 1 < W { t[i + N + 1] } else { zero() };
        acc[0] = _mm512_add_epi64(acc[0], carry);
    }
    normalize(&mut acc);
    acc
}

/// Almost Montgomery squaring: a²·R⁻¹ mod m, below 2·m for a < 2·m. The square
/// is formed column by column with each cross product a_i·a_j (i < j) computed
/// once and doubled, about half the multiplications of a general product, then
/// reduced by [`redc`]: 3·N² + N multiplications where [`amm`] needs 4·N².
/// The double-width square goes to the caller's scratch `t`, which the caller
/// wipes once when its exponentiation ends rather than once per squaring.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn sqr<const N: usize, const W: usize>(a: &[V; N], m: &[V; N], k0: V, t: &mut [V; W]) -> [V; N] {
    const { assert!(W == 2 * N) };
    t[0] = zero();
    t[W - 1] = zero();
    // Column k collects the low halves of the pairs with i + j = k and the high
    // halves of the pairs with i + j = k − 1. Two accumulators of each kind
    // (pairs taken two at a time) halve the dependency chains.
    let mut carry_in = zero();
    for k in 1..W - 2 {
        let first = k.saturating_sub(N - 1);
        let last = (k - 1) / 2;
        let (mut low0, mut low1, mut high0, mut high1) = (zero(), zero(), zero(), zero());
        let mut i = first;
        while i < last {
            let (x0, y0, x1, y1) = (a[i], a[k - i], a[i + 1], a[k - i - 1]);
            low0 = lo(low0, x0, y0);
            high0 = hi(high0, x0, y0);
            low1 = lo(low1, x1, y1);
            high1 = hi(high1, x1, y1);
            i += 2;
        }
        if i == last {
            low0 = lo(low0, a[i], a[k - i]);
            high0 = hi(high0, a[i], a[k - i]);
        }
        t[k] = _mm512_add_epi64(_mm512_add_epi64(low0, low1), carry_in);
        carry_in = _mm512_add_epi64(high0, high1);
    }
    t[W - 2] = carry_in;
    for i in 0..N {
        t[2 * i] = lo(_mm512_add_epi64(t[2 * i], t[2 * i]), a[i], a[i]);
        t[2 * i + 1] = hi(_mm512_add_epi64(t[2 * i + 1], t[2 * i + 1]), a[i], a[i]);
    }
    redc::<N, W>(t, m, k0)
}

/// The plain product a·b, `W = 2·N` limbs, normalized.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn mul_wide<const N: usize, const W: usize>(a: &[V; N], b: &[V; N]) -> [V; W] {
    const { assert!(W == 2 * N) };
    let mut t = [zero(); W];
    for (i, &bi) in b.iter().enumerate() {
        for j in 0..N {
            t[i + j] = lo(t[i + j], a[j], bi);
            t[i + j + 1] = hi(t[i + j + 1], a[j], bi);
        }
    }
    normalize(&mut t);
    t
}

/// x mod m for normalized 0 ≤ x < 2·m, per lane, without branches.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn sub_cond<const N: usize>(x: &[V; N], m: &[V; N]) -> [V; N] {
    let mask = _mm512_set1_epi64(MASK52);
    let mut d = [zero(); N];
    let mut borrow = zero();
    for j in 0..N {
        let t = _mm512_add_epi64(_mm512_sub_epi64(x[j], m[j]), borrow);
        borrow = _mm512_srai_epi64::<52>(t);
        d[j] = _mm512_and_si512(t, mask);
    }
    // No borrow out: x ≥ m, take the difference.
    let ge = _mm512_cmpeq_epi64_mask(borrow, zero());
    let mut r = [zero(); N];
    for j in 0..N {
        r[j] = _mm512_mask_blend_epi64(ge, x[j], d[j]);
    }
    r
}

/// a + 2·m − b, normalized; for a, b < 2·m the result lies in (0, 4·m).
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn add_2m_sub<const N: usize>(a: &[V; N], b: &[V; N], m: &[V; N]) -> [V; N] {
    let mut r = [zero(); N];
    for j in 0..N {
        let twice = _mm512_add_epi64(m[j], m[j]);
        r[j] = _mm512_sub_epi64(_mm512_add_epi64(a[j], twice), b[j]);
    }
    normalize(&mut r);
    r
}

/// Adds the `N`-limb `b` into the low limbs of the `W`-limb `a`, normalized.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn add_low<const N: usize, const W: usize>(a: &mut [V; W], b: &[V; N]) {
    const { assert!(W >= N) };
    for j in 0..N {
        a[j] = _mm512_add_epi64(a[j], b[j]);
    }
    normalize(a);
}

/// Per lane, `table[idx[lane]]`, reading every entry so that the memory access
/// pattern does not depend on the (secret) indices.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn select<const N: usize, const T: usize>(table: &[[V; N]; T], idx: V) -> [V; N] {
    let mut r = [zero(); N];
    for (k, entry) in table.iter().enumerate() {
        let hit = _mm512_cmpeq_epi64_mask(idx, _mm512_set1_epi64(k as i64));
        for j in 0..N {
            r[j] = _mm512_mask_blend_epi64(hit, r[j], entry[j]);
        }
    }
    r
}

/// The lanes in which a and b are equal, as a bit mask.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn eq_mask<const N: usize>(a: &[V; N], b: &[V; N]) -> u8 {
    let mut diff = zero();
    for j in 0..N {
        diff = _mm512_or_si512(diff, _mm512_xor_si512(a[j], b[j]));
    }
    _mm512_cmpeq_epi64_mask(diff, zero())
}

/// The same limbs in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn splat<const N: usize>(x: &[u64; N]) -> [V; N] {
    core::array::from_fn(|i| _mm512_set1_epi64(x[i] as i64))
}

/// Per lane, `a`, or `b` where `mask` has the lane's bit.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn blend<const N: usize>(mask: __mmask8, a: &[V; N], b: &[V; N]) -> [V; N] {
    core::array::from_fn(|i| _mm512_mask_blend_epi64(mask, a[i], b[i]))
}

/// The number 1 in every lane.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn one<const N: usize>() -> [V; N] {
    let mut r = [zero(); N];
    r[0] = _mm512_set1_epi64(1);
    r
}

/// Overwrites secret intermediate values; `black_box` keeps the stores alive.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn wipe<const N: usize>(a: &mut [V; N]) {
    for x in a.iter_mut() {
        *x = zero();
    }
    core::hint::black_box(a);
}

/// `base^exp · R mod m` (almost reduced) from `base_r = base·R mod m`, with a
/// fixed window of `log2(T)` bits (a table of `T` powers). `windows(pos)`
/// gives the per-lane exponent bits `[pos, pos + log2(T))`; `bits` (public)
/// is the exponent length.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn mod_exp<const N: usize, const W: usize, const T: usize>(
    base_r: &[V; N],
    one_r: &[V; N],
    bits: usize,
    windows: impl Fn(usize) -> V,
    m: &[V; N],
    k0: V,
) -> [V; N] {
    const { assert!(T.is_power_of_two() && T >= 4) };
    let window = T.trailing_zeros() as usize;
    let mut scratch = [zero(); W];
    let mut table = [[zero(); N]; T];
    table[0] = *one_r;
    table[1] = *base_r;
    for k in 2..T {
        table[k] = if k % 2 == 0 {
            sqr::<N, W>(&table[k / 2], m, k0, &mut scratch)
        } else {
            amm(&table[k - 1], base_r, m, k0)
        };
    }
    let count = bits.div_ceil(window).max(1);
    let mut acc = select(&table, windows((count - 1) * window));
    for w in (0..count - 1).rev() {
        for _ in 0..window {
            acc = sqr::<N, W>(&acc, m, k0, &mut scratch);
        }
        let mut factor = select(&table, windows(w * window));
        acc = amm(&acc, &factor, m, k0);
        wipe(&mut factor);
    }
    for entry in table.iter_mut() {
        wipe(entry);
    }
    wipe(&mut scratch);
    acc
}

/// Packs per-lane limb arrays into limb-major vectors.
#[inline]
pub(crate) fn pack<const N: usize>(lanes: [&[u64]; LANES]) -> [V; N] {
    core::array::from_fn(|i| from_lanes(core::array::from_fn(|l| lanes[l].get(i).copied().unwrap_or(0))))
}

/// The per-lane limbs of `a`, written into `out[lane]`.
#[inline]
pub(crate) fn unpack<const N: usize>(a: &[V; N], out: &mut [[u64; N]; LANES]) {
    for (i, v) in a.iter().enumerate() {
        for (l, x) in to_lanes(*v).into_iter().enumerate() {
            out[l][i] = x;
        }
    }
}
