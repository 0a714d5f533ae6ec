//! ECDSA P-256 signing in eight lanes, in two halves.
//!
//! The nonce's half needs neither key nor message: k·G by a fixed-base
//! comb (64 windows of 4 bits, a table of j·16^i·G read whole for every
//! window, so no address depends on a nonce), one inversion mod p for the
//! affine x, so r = x mod n, and one mod n for k⁻¹, all by the crate's
//! IFMA Montgomery kernels. [`presign_batch`] does it for eight nonces at
//! once, ahead of the signatures that will take them (as OpenSSL's
//! `ECDSA_sign_setup` lets a caller precompute k⁻¹ and r). Nonces are
//! uniform in [1, n − 1] from BoringSSL's generator (rejection sampling:
//! a rejection reveals only a discarded value). A [`Presignature`] serves
//! one signature: it is moved into it, never copied, and zeroed on drop.
//!
//! The signature's half, [`finish_batch`], is s = k⁻¹·(e + r·d) mod n:
//! five products in the lanes, a fraction of a microsecond. Before a
//! signature leaves, each lane is checked: k·G lies on the curve (when the
//! nonce was made), r ≠ 0, s ≠ 0, and s·k ≡ e + r·d (mod n), so a fault in
//! the point, the inversion or the last products yields an error, never a
//! wrong signature. [`sign_batch`] runs both halves at once.

#![allow(unsafe_code)]

mod curve;
#[cfg(test)]
mod tests;

use core::arch::x86_64::*;

use zeroize::{Zeroize, Zeroizing};

use crate::bn::{limbs_from_be, limbs_to_be, window, words_from_be};
use crate::engine::available;
use crate::ifma::{LANES, V, blend, from_lanes, mod_exp, pack, splat, sub_cond, unpack, wipe};
use curve::{ENTRIES, Fe, Jacobian, Lanes, WINDOWS, add_affine, consts, on_curve};

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
    assert!(available(), "the IFMA engine was called on a CPU without AVX-512 IFMA");
    let c = consts();
    let mut nonces = Zeroizing::new([[0u8; 32]; LANES]);
    let n = c.n_be;
    for k in nonces.iter_mut() {
        loop {
            if boring::rand::rand_bytes(k).is_err() {
                return core::array::from_fn(|_| Err(SignFault));
            }
            if k.iter().any(|&b| b != 0) && *k < n {
                break;
            }
        }
    }
    // The nonces as 64-bit words (for the comb's windows) and as 52-bit
    // limbs (for the arithmetic mod n).
    let mut ks = Zeroizing::new([[0u64; 4]; LANES]);
    let mut k_limbs = Zeroizing::new([[0u64; 5]; LANES]);
    for (l, k) in nonces.iter().enumerate() {
        let mut w = words_from_be(k);
        ks[l] = core::array::from_fn(|i| w[i]);
        w.zeroize();
        let mut limbs = limbs_from_be(k, 5).unwrap_or_default();
        k_limbs[l] = core::array::from_fn(|i| limbs.get(i).copied().unwrap_or(0));
        limbs.zeroize();
    }
    let mut rs = [[0u64; 5]; LANES];
    let mut kinv = Zeroizing::new([[0u64; 5]; LANES]);
    let mut k_m = Zeroizing::new([[0u64; 5]; LANES]);
    // SAFETY: `available()` was checked above, so the CPU has AVX-512F and
    // IFMA, the only requirement of this `#[target_feature]` function.
    let ok = unsafe { presign8(c, &ks, &k_limbs, &mut rs, &mut kinv, &mut k_m, fault) };
    core::array::from_fn(|l| {
        if ok & (1 << l) == 0 {
            return Err(SignFault);
        }
        Ok(Presignature { r: rs[l], kinv_m: Zeroizing::new(kinv[l]), k_m: Zeroizing::new(k_m[l]), lane: l })
    })
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
    // SAFETY: as in `presign_batch_with_fault`.
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

/// Per lane, the comb table's entry `digit` (1..=15) of window `i`; zero
/// where the digit is 0. Reads all fifteen entries.
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

/// k·G for eight nonces.
#[target_feature(enable = "avx512f,avx512ifma")]
fn base_mul(c: &curve::Consts, f: &Lanes, ks: &[[u64; 4]; LANES]) -> Jacobian {
    let one = f.one_r;
    let mut acc = Jacobian { x: one, y: one, z: one };
    let mut infinite: __mmask8 = 0xff;
    for (i, row) in c.table.iter().enumerate().take(WINDOWS) {
        let digits = from_lanes(core::array::from_fn(|l| window(&ks[l], 4 * i, 4)));
        let (x2, y2) = select(row, digits);
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

/// The nonce's half for eight nonces (`ks` as 64-bit words, `k_limbs`
/// as limbs): r, k⁻¹·R and k·R mod n per lane; returns the mask of lanes
/// whose k·G lies on the curve and whose r is not zero.
#[target_feature(enable = "avx512f,avx512ifma")]
fn presign8(
    c: &curve::Consts,
    ks: &[[u64; 4]; LANES],
    k_limbs: &[[u64; 5]; LANES],
    r_out: &mut [[u64; 5]; LANES],
    kinv_out: &mut [[u64; 5]; LANES],
    k_out: &mut [[u64; 5]; LANES],
    fault: Option<PointFault>,
) -> u8 {
    let fp = Lanes::of(&c.p);
    let fq = Lanes::of(&c.n);
    let mut pt = base_mul(c, &fp, ks);
    if let Some(f) = fault
        && f.lane < LANES
    {
        let mut flip = [0u64; LANES];
        flip[f.lane] = 1 << 9;
        pt.x[2] = _mm512_xor_si512(pt.x[2], from_lanes(flip));
    }
    let mut ok = on_curve(&fp, &pt, &splat(&c.b_r));

    // x = X / Z², then r = x mod n.
    let p_exp = |pos: usize| _mm512_set1_epi64(window(&c.p.inv_exp, pos, 4) as i64);
    let zinv = mod_exp::<5, 10, 16>(&pt.z, &fp.one_r, 256, p_exp, &fp.m, fp.k0);
    let x = fp.leave_mont(&fp.mul(&pt.x, &fp.sqr(&zinv)));
    let r = sub_cond(&x, &fq.m);
    ok &= !crate::ifma::eq_mask(&r, &[_mm512_setzero_si512(); 5]);

    let mut k: Fe = pack(core::array::from_fn(|l| &k_limbs[l][..]));
    let mut k_m = fq.to_mont(&k);
    let n_exp = |pos: usize| _mm512_set1_epi64(window(&c.n.inv_exp, pos, 4) as i64);
    let mut kinv_m = mod_exp::<5, 10, 16>(&k_m, &fq.one_r, 256, n_exp, &fq.m, fq.k0);
    unpack(&r, r_out);
    unpack(&kinv_m, kinv_out);
    unpack(&k_m, k_out);
    for secret in [&mut k, &mut k_m, &mut kinv_m] {
        wipe(secret);
    }
    ok
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
