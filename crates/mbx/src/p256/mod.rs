//! ECDSA P-256 signing in eight lanes: up to eight signatures at once, each
//! with its own key, digest and nonce.
//!
//! k·G by a fixed-base comb (64 windows of 4 bits, a table of j·16^i·G read
//! whole for every window, so no address depends on a nonce), one inversion
//! mod p for the affine x, one mod n for k⁻¹, all by the crate's IFMA
//! Montgomery kernels. Nonces are uniform in [1, n − 1] from BoringSSL's
//! generator (rejection sampling: a rejection reveals only a discarded
//! value). Before a signature leaves, each lane is checked: k·G lies on the
//! curve, r ≠ 0, s ≠ 0, and s·k ≡ e + r·d (mod n), so a fault in the point,
//! the inversion or the last products yields an error, never a wrong
//! signature.

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

/// Signs up to eight digests at once. Panics without AVX-512 IFMA or with
/// more than eight operations.
pub fn sign_batch(ops: &mut [SignOp<'_>]) -> [Result<(), SignFault>; LANES] {
    sign_batch_with_fault(ops, None)
}

/// [`sign_batch`] with a test fault.
pub fn sign_batch_with_fault(ops: &mut [SignOp<'_>], fault: Option<PointFault>) -> [Result<(), SignFault>; LANES] {
    assert!(available(), "the IFMA engine was called on a CPU without AVX-512 IFMA");
    assert!(ops.len() <= LANES, "at most {LANES} operations per batch");
    let c = consts();
    let mut nonces = Zeroizing::new([[0u8; 32]; LANES]);
    let n = c.n_be;
    for k in nonces.iter_mut().take(ops.len().max(1)) {
        loop {
            if boring::rand::rand_bytes(k).is_err() {
                return [Err(SignFault); LANES];
            }
            if k.iter().any(|&b| b != 0) && *k < n {
                break;
            }
        }
    }
    // The nonces as 64-bit words (for the comb's windows) and as 52-bit
    // limbs (for the arithmetic mod n); the digests as limbs.
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
    let empty = [0u64; 5];
    let d: [&[u64]; LANES] = core::array::from_fn(|l| ops.get(l).map_or(&empty[..], |o| &o.key.d_r[..]));
    let e: [[u64; 5]; LANES] = core::array::from_fn(|l| {
        let v = ops.get(l).and_then(|o| limbs_from_be(o.digest, 5)).unwrap_or_default();
        core::array::from_fn(|i| v.get(i).copied().unwrap_or(0))
    });
    let mut rs = Zeroizing::new([[0u64; 5]; LANES]);
    let mut ss = Zeroizing::new([[0u64; 5]; LANES]);
    // SAFETY: `available()` was checked above, so the CPU has AVX-512F and
    // IFMA, the only requirement of this `#[target_feature]` function.
    let inputs = Inputs { ks: &ks, k_limbs: &k_limbs, d_r: &d, digests: &e };
    let ok = unsafe { sign8(c, &inputs, &mut rs, &mut ss, fault) };
    let mut results = [Err(SignFault); LANES];
    for (l, op) in ops.iter_mut().enumerate() {
        if ok & (1 << l) != 0 {
            let (r, s) = op.out.split_at_mut(32);
            limbs_to_be(&rs[l], r);
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

/// A batch's secrets and digests, per lane: the nonces as 64-bit words
/// (for the comb's windows) and as 52-bit limbs, the keys d·R mod n, the
/// digests as limbs.
#[derive(Clone, Copy)]
struct Inputs<'a> {
    ks: &'a [[u64; 4]; LANES],
    k_limbs: &'a [[u64; 5]; LANES],
    d_r: &'a [&'a [u64]; LANES],
    digests: &'a [[u64; 5]; LANES],
}

/// The signatures of eight lanes; returns the mask of lanes that passed
/// every check.
#[target_feature(enable = "avx512f,avx512ifma")]
fn sign8(
    c: &curve::Consts,
    inputs: &Inputs<'_>,
    r_out: &mut [[u64; 5]; LANES],
    s_out: &mut [[u64; 5]; LANES],
    fault: Option<PointFault>,
) -> u8 {
    let Inputs { ks, k_limbs, d_r, digests } = *inputs;
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

    // s = k⁻¹·(e + r·d) mod n, all in Montgomery form.
    let mut k: Fe = pack(core::array::from_fn(|l| &k_limbs[l][..]));
    let mut k_m = fq.to_mont(&k);
    let n_exp = |pos: usize| _mm512_set1_epi64(window(&c.n.inv_exp, pos, 4) as i64);
    let mut kinv_m = mod_exp::<5, 10, 16>(&k_m, &fq.one_r, 256, n_exp, &fq.m, fq.k0);
    let e: Fe = pack(core::array::from_fn(|l| &digests[l][..]));
    let e_m = fq.to_mont(&e);
    let r_m = fq.to_mont(&r);
    let mut d_m: Fe = pack(*d_r);
    let mut t = fq.add(&e_m, &fq.mul(&r_m, &d_m));
    let s_m = fq.mul(&kinv_m, &t);
    let s = fq.leave_mont(&s_m);
    // s·k ≡ e + r·d: catches a fault in the inversion or the products.
    ok &= fq.eq(&fq.mul(&s_m, &k_m), &t);
    let zero = [_mm512_setzero_si512(); 5];
    ok &= !crate::ifma::eq_mask(&r, &zero) & !crate::ifma::eq_mask(&s, &zero);
    unpack(&r, r_out);
    unpack(&s, s_out);
    for secret in [&mut k, &mut k_m, &mut kinv_m, &mut d_m, &mut t] {
        wipe(secret);
    }
    ok
}
