//! ECDSA P-256 signing in eight lanes, in two halves.
//!
//! The nonce's half needs neither key nor message: k·G by a fixed-base
//! comb (43 windows of 6 bits, the nonce recoded into signed digits in
//! [−32, 32]; a table of j·64^i·G read whole for every window, so no
//! address depends on a nonce), one inversion mod p for the
//! affine x, so r = x mod n, and one mod n for k⁻¹, all by the crate's
//! IFMA Montgomery kernels. [`presign_batch`] does it for eight nonces at
//! once, and [`presign_rows`] for rows of eight that share their two
//! inversions, ahead of the signatures that will take them (as OpenSSL's
//! `ECDSA_sign_setup` lets a caller precompute k⁻¹ and r). Nonces are
//! uniform in [1, n − 1] from BoringSSL's generator (rejection sampling:
//! a rejection reveals only a discarded value). A [`Presignature`] serves
//! one signature: it is moved into it, never copied, and zeroed on drop.
//!
//! The signature's half, [`finish_batch`], is s = k⁻¹·(e + r·d) mod n:
//! five products in the lanes, a fraction of a microsecond. Before a
//! signature leaves, each lane is checked: k·G lies on the curve and Z
//! times its inverse is one (when the nonce was made), r ≠ 0, s ≠ 0, and
//! s·k ≡ e + r·d (mod n), so a fault in the point, the inversions or the
//! last products yields an error, never a wrong signature. [`sign_batch`]
//! runs both halves at once.

#![allow(unsafe_code)]

mod curve;
#[cfg(test)]
mod tests;

use core::arch::x86_64::*;

use zeroize::{Zeroize, Zeroizing};

use crate::bn::{limbs_from_be, limbs_to_be, window, words_from_be};
use crate::engine::available;
use crate::ifma::{LANES, V, blend, from_lanes, mod_exp, pack, splat, sub_cond, unpack, wipe};
use curve::{ENTRIES, Fe, Jacobian, Lanes, WINDOW_BITS, WINDOWS, add_affine, consts, on_curve};

/// A P-256 private key prepared for the lanes: d·R mod n.
pub struct P256Key {
    d_r: Zeroizing<[u64; 5]>,
}

/// Why a key cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadKey;

impl P256Key {
    /// From the private scalar, 32 big-endian bytes, 0 < d < n.
    pub fn new(d: &[u8; 32]) -> Result<Self, BadKey> {
        if d.iter().all(|&b| b == 0) || *d >= consts().n_be {
            return Err(BadKey);
        }
        Ok(P256Key { d_r: Zeroizing::new(curve::to_mont_scalar(d, curve::N)) })
    }
}

/// One signature of a batch: `out` gets r ‖ s, 32 big-endian bytes each.
pub struct SignOp<'a> {
    pub key: &'a P256Key,
    /// The message's SHA-256 digest.
    pub digest: &'a [u8; 32],
    pub out: &'a mut [u8; 64],
}

/// A lane failed its check (a fault, or a zero r or s): no signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignFault;

/// A test hook: corrupts one lane's k·G before the checks.
#[derive(Clone, Copy, Debug)]
pub struct PointFault {
    pub lane: usize,
}

/// A test hook: corrupts, before the checks, the s of every signature
/// whose nonce came from this lane of its [`presign_batch`].
#[derive(Clone, Copy, Debug)]
pub struct FinishFault {
    pub lane: usize,
}

/// The nonce's half of one signature, with any key and any message:
/// r = (k·G).x mod n, and k⁻¹ and k mod n. Not `Clone`: a nonce signs once.
pub struct Presignature {
    /// r, in 52-bit limbs (public once the signature leaves).
    r: [u64; 5],
    /// k⁻¹·R and k·R mod n.
    kinv_m: Zeroizing<[u64; 5]>,
    k_m: Zeroizing<[u64; 5]>,
    /// The lane of its batch (for [`FinishFault`]).
    lane: usize,
}

/// One signature from a presignature: `out` gets r ‖ s.
pub struct FinishOp<'a> {
    pub presignature: Presignature,
    pub key: &'a P256Key,
    /// The message's SHA-256 digest.
    pub digest: &'a [u8; 32],
    pub out: &'a mut [u8; 64],
}

/// Signs up to eight digests at once: eight presignatures, then the
/// signatures. Panics without AVX-512 IFMA or with more than eight
/// operations.
pub fn sign_batch(ops: &mut [SignOp<'_>]) -> [Result<(), SignFault>; LANES] {
    sign_batch_with_fault(ops, None)
}

/// [`sign_batch`] with a test fault.
pub fn sign_batch_with_fault(ops: &mut [SignOp<'_>], fault: Option<PointFault>) -> [Result<(), SignFault>; LANES] {
    assert!(ops.len() <= LANES, "at most {LANES} operations per batch");
    let mut results = [Err(SignFault); LANES];
    let mut lanes: Vec<(usize, FinishOp<'_>)> = Vec::with_capacity(ops.len());
    for ((l, op), pre) in ops.iter_mut().enumerate().zip(presign_batch_with_fault(fault)) {
        if let Ok(presignature) = pre {
            lanes.push((l, FinishOp { presignature, key: op.key, digest: op.digest, out: &mut *op.out }));
        }
    }
    let (index, mut finish): (Vec<usize>, Vec<FinishOp<'_>>) = lanes.into_iter().unzip();
    for (l, r) in index.into_iter().zip(finish_batch(&mut finish, None)) {
        results[l] = r;
    }
    results
}

/// Eight presignatures, each from a fresh nonce; a lane that fails its
/// checks (k·G on the curve, r ≠ 0) gives an error instead. Panics
/// without AVX-512 IFMA.
pub fn presign_batch() -> [Result<Presignature, SignFault>; LANES] {
    presign_batch_with_fault(None)
}

/// [`presign_batch`] with a test fault.
pub fn presign_batch_with_fault(fault: Option<PointFault>) -> [Result<Presignature, SignFault>; LANES] {
    let mut made = presign_rows_with_fault(1, fault).into_iter();
    core::array::from_fn(|_| made.next().unwrap_or(Err(SignFault)))
}

/// How many rows of eight presignatures [`presign_rows`] makes at once
/// when a worker fills its pool: 32 presignatures share one inversion mod
/// p and one mod n, which made half the work of a row of eight alone.
pub const POOL_ROWS: usize = 4;

/// `rows` rows of eight presignatures (8·`rows` in all, row by row), each
/// from a fresh nonce; a lane that fails its checks (k·G on the curve, its
/// Z's inverse, r ≠ 0) gives an error instead. The rows share their two
/// inversions (Montgomery's trick, lane by lane): a row costs its comb and
/// six products for its share of them. Panics without AVX-512 IFMA.
pub fn presign_rows(rows: usize) -> Vec<Result<Presignature, SignFault>> {
    presign_rows_with_fault(rows, None)
}

/// [`presign_rows`] with a test fault; its lane counts across the rows
/// (row `lane / 8`).
pub fn presign_rows_with_fault(rows: usize, fault: Option<PointFault>) -> Vec<Result<Presignature, SignFault>> {
    let c = consts();
    let n = c.n_be;
    // All the nonces from one call to the generator; the rare one out of
    // range is drawn again alone.
    let mut nonces = Zeroizing::new(vec![[0u8; 32]; rows * LANES]);
    let failed = || (0..rows * LANES).map(|_| Err(SignFault)).collect();
    if boring::rand::rand_bytes(nonces.as_flattened_mut()).is_err() {
        return failed();
    }
    for k in nonces.iter_mut() {
        while k.iter().all(|&b| b == 0) || *k >= n {
            if boring::rand::rand_bytes(k).is_err() {
                return failed();
            }
        }
    }
    presign_from(c, &nonces, fault)
}

/// Presignatures from `nonces` (in [1, n − 1]), row by row of eight.
/// Panics without AVX-512 IFMA.
fn presign_from(
    c: &curve::Consts,
    nonces: &[[u8; 32]],
    fault: Option<PointFault>,
) -> Vec<Result<Presignature, SignFault>> {
    assert!(available(), "the IFMA engine was called on a CPU without AVX-512 IFMA");
    let rows = nonces.len() / LANES;
    // The nonces as 64-bit words (for the comb's windows) and as 52-bit
    // limbs (for the arithmetic mod n), a row of lanes at a time.
    let mut ks = Zeroizing::new(vec![[[0u64; 4]; LANES]; rows]);
    let mut k_limbs = Zeroizing::new(vec![[[0u64; 5]; LANES]; rows]);
    for (i, k) in nonces.iter().enumerate() {
        let (row, l) = (i / LANES, i % LANES);
        let mut w = words_from_be(k);
        ks[row][l] = core::array::from_fn(|j| w[j]);
        w.zeroize();
        let mut limbs = limbs_from_be(k, 5).unwrap_or_default();
        k_limbs[row][l] = core::array::from_fn(|j| limbs.get(j).copied().unwrap_or(0));
        limbs.zeroize();
    }
    let mut out = RowsOut {
        r: vec![[[0u64; 5]; LANES]; rows],
        kinv: Zeroizing::new(vec![[[0u64; 5]; LANES]; rows]),
        k_m: Zeroizing::new(vec![[[0u64; 5]; LANES]; rows]),
        ok: vec![0u8; rows],
    };
    // SAFETY: `available()` was asserted at the top of this function, so
    // the CPU has AVX-512F and IFMA, the only requirement of this
    // `#[target_feature]` function.
    unsafe { presign_lanes(c, &ks, &k_limbs, &mut out, fault) };
    (0..rows * LANES)
        .map(|i| {
            let (row, l) = (i / LANES, i % LANES);
            if out.ok[row] & (1 << l) == 0 {
                return Err(SignFault);
            }
            Ok(Presignature {
                r: out.r[row][l],
                kinv_m: Zeroizing::new(out.kinv[row][l]),
                k_m: Zeroizing::new(out.k_m[row][l]),
                lane: l,
            })
        })
        .collect()
}

/// Signs up to eight digests from their presignatures at once. Panics
/// without AVX-512 IFMA or with more than eight operations.
pub fn finish_batch(ops: &mut [FinishOp<'_>], fault: Option<FinishFault>) -> [Result<(), SignFault>; LANES] {
    assert!(available(), "the IFMA engine was called on a CPU without AVX-512 IFMA");
    assert!(ops.len() <= LANES, "at most {LANES} operations per batch");
    let empty = [0u64; 5];
    let lanes = FinishLanes {
        r: core::array::from_fn(|l| ops.get(l).map_or(&empty[..], |o| &o.presignature.r[..])),
        kinv_m: core::array::from_fn(|l| ops.get(l).map_or(&empty[..], |o| &o.presignature.kinv_m[..])),
        k_m: core::array::from_fn(|l| ops.get(l).map_or(&empty[..], |o| &o.presignature.k_m[..])),
        d_r: core::array::from_fn(|l| ops.get(l).map_or(&empty[..], |o| &o.key.d_r[..])),
    };
    let digests: [[u64; 5]; LANES] = core::array::from_fn(|l| {
        let v = ops.get(l).and_then(|o| limbs_from_be(o.digest, 5)).unwrap_or_default();
        core::array::from_fn(|i| v.get(i).copied().unwrap_or(0))
    });
    let faulty = fault.map_or(0u8, |f| {
        ops.iter().enumerate().filter(|(_, o)| o.presignature.lane == f.lane).fold(0, |m, (l, _)| m | 1 << l)
    });
    let mut ss = [[0u64; 5]; LANES];
    // SAFETY: `available()` was asserted at the top of this function, so
    // the CPU has AVX-512F and IFMA, all `finish8` needs.
    let ok = unsafe { finish8(consts(), &lanes, &digests, &mut ss, faulty) };
    let mut results = [Err(SignFault); LANES];
    for (l, op) in ops.iter_mut().enumerate() {
        if ok & (1 << l) != 0 {
            let (r, s) = op.out.split_at_mut(32);
            limbs_to_be(&op.presignature.r, r);
            limbs_to_be(&ss[l], s);
            results[l] = Ok(());
        }
    }
    results
}

/// Per lane, the comb table's entry `digit` (1..=32) of window `i`; zero
/// where the digit is 0. Reads every entry.
#[inline]
#[target_feature(enable = "avx512f")]
fn select(row: &[[[u64; 5]; 2]; ENTRIES], digits: V) -> (Fe, Fe) {
    let mut x = [_mm512_setzero_si512(); 5];
    let mut y = [_mm512_setzero_si512(); 5];
    for (j, entry) in row.iter().enumerate() {
        let hit = _mm512_cmpeq_epi64_mask(digits, _mm512_set1_epi64(j as i64 + 1));
        for i in 0..5 {
            x[i] = _mm512_mask_blend_epi64(hit, x[i], _mm512_set1_epi64(entry[0][i] as i64));
            y[i] = _mm512_mask_blend_epi64(hit, y[i], _mm512_set1_epi64(entry[1][i] as i64));
        }
    }
    (x, y)
}

/// Digit `i` of `k`'s signed recoding in windows of [`WINDOW_BITS`] bits
/// (Booth's: k = Σ dᵢ·64^i, dᵢ in [−32, 32]) as (|dᵢ|, 1 if dᵢ < 0),
/// without a branch or an address that depends on k. A window's digit is
/// its bits plus the top bit of the window below, less 64 when its own
/// top bit is set (which the window above then carries).
fn booth_digit(k: &[u64; 4], i: usize) -> (u64, u64) {
    const W: usize = WINDOW_BITS;
    let bits = if i == 0 { window(k, 0, W) << 1 } else { window(k, W * i - 1, W + 1) };
    let negative = (bits >> W) & 1;
    let mask = negative.wrapping_neg();
    let d = (((1 << (W + 1)) - 1 - bits) & mask) | (bits & !mask);
    ((d >> 1) + (d & 1), negative)
}

/// k·G for eight nonces. The partial sums of the signed digits never
/// meet the next entry or its negative (each is smaller than 64^i in
/// magnitude, the entry at least 64^i, and k < n), so the additions need
/// no doubling case.
#[target_feature(enable = "avx512f,avx512ifma")]
fn base_mul(c: &curve::Consts, f: &Lanes, ks: &[[u64; 4]; LANES]) -> Jacobian {
    let one = f.one_r;
    let zero5 = [_mm512_setzero_si512(); 5];
    let mut acc = Jacobian { x: one, y: one, z: one };
    let mut infinite: __mmask8 = 0xff;
    for (i, row) in c.table.iter().enumerate().take(WINDOWS) {
        let recoded: [(u64, u64); LANES] = core::array::from_fn(|l| booth_digit(&ks[l], i));
        let digits = from_lanes(core::array::from_fn(|l| recoded[l].0));
        let negative = _mm512_cmpneq_epi64_mask(from_lanes(core::array::from_fn(|l| recoded[l].1)), zero5[0]);
        let (x2, y2) = select(row, digits);
        let y2 = blend(negative, &y2, &f.sub(&zero5, &y2));
        let sum = add_affine(f, &acc, &x2, &y2);
        let zero = _mm512_cmpeq_epi64_mask(digits, _mm512_setzero_si512());
        // Digit 0: keep; at infinity: take the entry; else: the sum.
        let fresh = infinite & !zero;
        let mut next =
            Jacobian { x: blend(fresh, &sum.x, &x2), y: blend(fresh, &sum.y, &y2), z: blend(fresh, &sum.z, &one) };
        next = Jacobian {
            x: blend(zero, &next.x, &acc.x),
            y: blend(zero, &next.y, &acc.y),
            z: blend(zero, &next.z, &acc.z),
        };
        acc = next;
        infinite &= zero;
    }
    acc
}

/// What [`presign_lanes`] gives per row of lanes: r, k⁻¹·R and k·R mod
/// n, and the mask of lanes that passed their checks.
struct RowsOut {
    r: Vec<[[u64; 5]; LANES]>,
    kinv: Zeroizing<Vec<[[u64; 5]; LANES]>>,
    k_m: Zeroizing<Vec<[[u64; 5]; LANES]>>,
    ok: Vec<u8>,
}

/// The nonce's half for rows of eight nonces (`ks` as 64-bit words,
/// `k_limbs` as limbs): per lane r, k⁻¹·R and k·R mod n, and whether
/// its k·G lies on the curve, its Z times its inverse is one and its r
/// is not zero. A wrong inverse of Z would give a wrong r, which no later
/// check could see: hence its own check.
#[target_feature(enable = "avx512f,avx512ifma")]
fn presign_lanes(
    c: &curve::Consts,
    ks: &[[[u64; 4]; LANES]],
    k_limbs: &[[[u64; 5]; LANES]],
    out: &mut RowsOut,
    fault: Option<PointFault>,
) {
    let fp = Lanes::of(&c.p);
    let fq = Lanes::of(&c.n);
    let b_r = splat(&c.b_r);
    let mut points = Vec::with_capacity(ks.len());
    for (row, k) in ks.iter().enumerate() {
        let mut pt = base_mul(c, &fp, k);
        if let Some(f) = fault
            && f.lane / LANES == row
        {
            let mut flip = [0u64; LANES];
            flip[f.lane % LANES] = 1 << 9;
            pt.x[2] = _mm512_xor_si512(pt.x[2], from_lanes(flip));
        }
        out.ok[row] = on_curve(&fp, &pt, &b_r);
        points.push(pt);
    }

    // x = X / Z², then r = x mod n.
    let zs: Vec<Fe> = points.iter().map(|p| p.z).collect();
    let zinv = invert_all(&fp, &c.p, &zs);
    for (row, (pt, zinv)) in points.iter().zip(&zinv).enumerate() {
        let x = fp.leave_mont(&fp.mul(&pt.x, &fp.sqr(zinv)));
        let r = sub_cond(&x, &fq.m);
        out.ok[row] &= fp.eq(&fp.mul(zinv, &pt.z), &fp.one_r);
        out.ok[row] &= !crate::ifma::eq_mask(&r, &[_mm512_setzero_si512(); 5]);
        unpack(&r, &mut out.r[row]);
    }

    let mut k_m: Vec<Fe> = k_limbs
        .iter()
        .map(|row| {
            let mut k: Fe = pack(core::array::from_fn(|l| &row[l][..]));
            let k_m = fq.to_mont(&k);
            wipe(&mut k);
            k_m
        })
        .collect();
    let mut kinv_m = invert_all(&fq, &c.n, &k_m);
    for (row, (k, kinv)) in k_m.iter_mut().zip(kinv_m.iter_mut()).enumerate() {
        unpack(kinv, &mut out.kinv[row]);
        unpack(k, &mut out.k_m[row]);
        wipe(k);
        wipe(kinv);
    }
}

/// x⁻¹·R for every x·R of `xs` mod `m`, lane by lane, by Montgomery's
/// trick: the running products x₀·…·xᵢ, one inversion of the last
/// (x^(m−2), a fixed chain of products), then two products an element on
/// the way back. A zero x makes every inverse of its lane zero, which the
/// callers' checks refuse. The running products of secret values are
/// wiped.
#[target_feature(enable = "avx512f,avx512ifma")]
fn invert_all(f: &Lanes, m: &curve::Modulus, xs: &[Fe]) -> Vec<Fe> {
    let mut prefix: Vec<Fe> = Vec::with_capacity(xs.len());
    for x in xs {
        let next = match prefix.last() {
            Some(p) => f.mul(p, x),
            None => *x,
        };
        prefix.push(next);
    }
    let Some(last) = prefix.last() else { return Vec::new() };
    let exp = |pos: usize| _mm512_set1_epi64(window(&m.inv_exp, pos, 4) as i64);
    let mut inv = mod_exp::<5, 10, 16>(last, &f.one_r, 256, exp, &f.m, f.k0);
    let mut out = vec![[_mm512_setzero_si512(); 5]; xs.len()];
    for i in (1..xs.len()).rev() {
        out[i] = f.mul(&inv, &prefix[i - 1]);
        inv = f.mul(&inv, &xs[i]);
    }
    out[0] = inv;
    wipe(&mut inv);
    for p in prefix.iter_mut() {
        wipe(p);
    }
    out
}

/// A finish batch's inputs per lane, as limbs: the presignatures' r,
/// k⁻¹·R and k·R, and the keys' d·R mod n.
struct FinishLanes<'a> {
    r: [&'a [u64]; LANES],
    kinv_m: [&'a [u64]; LANES],
    k_m: [&'a [u64]; LANES],
    d_r: [&'a [u64]; LANES],
}

/// s = k⁻¹·(e + r·d) mod n for eight lanes, all in Montgomery form; the
/// lanes in `faulty` get a corrupted s (a test hook). Returns the mask of
/// lanes whose s is not zero and passes s·k ≡ e + r·d.
#[target_feature(enable = "avx512f,avx512ifma")]
fn finish8(
    c: &curve::Consts,
    lanes: &FinishLanes<'_>,
    digests: &[[u64; 5]; LANES],
    s_out: &mut [[u64; 5]; LANES],
    faulty: u8,
) -> u8 {
    let fq = Lanes::of(&c.n);
    let r: Fe = pack(lanes.r);
    let mut k_m: Fe = pack(lanes.k_m);
    let mut kinv_m: Fe = pack(lanes.kinv_m);
    let mut d_m: Fe = pack(lanes.d_r);
    let e: Fe = pack(core::array::from_fn(|l| &digests[l][..]));
    let e_m = fq.to_mont(&e);
    let r_m = fq.to_mont(&r);
    let mut t = fq.add(&e_m, &fq.mul(&r_m, &d_m));
    let mut s_m = fq.mul(&kinv_m, &t);
    if faulty != 0 {
        s_m[1] = _mm512_mask_xor_epi64(s_m[1], faulty, s_m[1], _mm512_set1_epi64(1 << 7));
    }
    let s = fq.leave_mont(&s_m);
    // s·k ≡ e + r·d: catches a fault in the inversion or the products.
    let mut ok = fq.eq(&fq.mul(&s_m, &k_m), &t);
    let zero = [_mm512_setzero_si512(); 5];
    ok &= !crate::ifma::eq_mask(&r, &zero) & !crate::ifma::eq_mask(&s, &zero);
    unpack(&s, s_out);
    for secret in [&mut k_m, &mut kinv_m, &mut d_m, &mut t, &mut s_m] {
        wipe(secret);
    }
    ok
}
