//! X25519 (RFC 7748) in eight lanes: up to eight scalar multiplications at
//! once, each with its own scalar and its own point, on the Montgomery
//! ladder with per-lane constant-time swaps (mask blends). The ladder runs
//! all 255 steps in every lane; no branch or address depends on a scalar.
//!
//! Key generation can run the same ladder on the base point u = 9, so one
//! batch can mix key generations and shared secrets; [`public_batch`] makes
//! public keys alone by a fixed-base comb (`base.rs`), 2.2–2.6 times as
//! many a second as the ladder (an Intel Xeon with IFMA). A lane whose
//! result is zero (the peer sent a point of small order) reports
//! [`LowOrder`], as BoringSSL's `X25519` refuses it.

#![allow(unsafe_code)]

mod base;
mod field;
#[cfg(test)]
mod tests;

use core::arch::x86_64::__mmask8;

use zeroize::Zeroize;

use crate::engine::available;
use crate::ifma::{LANES, pack, to_lanes, wipe};
use field::{Fe, add, cswap, freeze, invert, mul, mul_small, sqr, sub};

/// The base point's u-coordinate, as an X25519 input: `x25519(k, BASE)`
/// is the public key of `k`.
pub const BASE: [u8; 32] = {
    let mut b = [0u8; 32];
    b[0] = 9;
    b
};

/// The shared secret came out zero: the peer's point has small order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowOrder;

/// One scalar multiplication of a batch.
pub struct X25519Op<'a> {
    /// The private scalar (clamped here, as RFC 7748 says).
    pub scalar: &'a [u8; 32],
    /// The peer's public key, or [`BASE`] for key generation.
    pub point: &'a [u8; 32],
    pub out: &'a mut [u8; 32],
}

/// Runs up to [`LANES`] X25519 operations at once. Panics if the CPU has no
/// AVX-512 IFMA ([`available`]) or more than eight operations are passed.
pub fn x25519_batch(ops: &mut [X25519Op<'_>]) -> [Result<(), LowOrder>; LANES] {
    assert!(available(), "the IFMA engine was called on a CPU without AVX-512 IFMA");
    assert!(ops.len() <= LANES, "at most {LANES} operations per batch");
    let mut scalars = [[0u8; 32]; LANES];
    let mut points = [BASE; LANES];
    for (l, op) in ops.iter().enumerate() {
        scalars[l] = clamp(op.scalar);
        points[l] = *op.point;
    }
    let mut limbs = [[0u64; 5]; LANES];
    // SAFETY: `available()` was checked above, so the CPU has AVX-512F and
    // IFMA, the only requirement of this `#[target_feature]` function.
    unsafe { ladder(&scalars, &points, &mut limbs) };
    scalars.zeroize();
    let mut results = [Ok(()); LANES];
    for (l, op) in ops.iter_mut().enumerate() {
        *op.out = field::to_bytes(&limbs[l]);
        // Constant time over the bytes, as BoringSSL checks.
        let any = op.out.iter().fold(0u8, |acc, b| acc | b);
        if any == 0 {
            results[l] = Err(LowOrder);
        }
    }
    limbs.zeroize();
    results
}

/// One key generation of a [`public_batch`].
pub struct KeygenOp<'a> {
    /// The private scalar (clamped here, as RFC 7748 says).
    pub scalar: &'a [u8; 32],
    /// Its public key, `x25519(scalar, BASE)`.
    pub out: &'a mut [u8; 32],
}

/// A public key failed its check (the point off the curve): a fault in the
/// lanes. The output holds nothing to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCurve;

/// Computes up to [`LANES`] public keys at once by the fixed-base comb.
/// Panics if the CPU has no AVX-512 IFMA ([`available`]) or more than eight
/// operations are passed.
pub fn public_batch(ops: &mut [KeygenOp<'_>]) -> [Result<(), OffCurve>; LANES] {
    assert!(available(), "the IFMA engine was called on a CPU without AVX-512 IFMA");
    assert!(ops.len() <= LANES, "at most {LANES} operations per batch");
    let mut scalars = [[0u8; 32]; LANES];
    for (l, op) in ops.iter().enumerate() {
        scalars[l] = clamp(op.scalar);
    }
    let mut limbs = [[0u64; 5]; LANES];
    // SAFETY: `available()` was checked above, so the CPU has AVX-512F and
    // IFMA, the only requirement of this `#[target_feature]` function.
    let ok = unsafe { base::public_keys(&scalars, &mut limbs) };
    scalars.zeroize();
    let mut results = [Ok(()); LANES];
    for (l, op) in ops.iter_mut().enumerate() {
        *op.out = field::to_bytes(&limbs[l]);
        if ok & (1 << l) == 0 {
            op.out.zeroize();
            results[l] = Err(OffCurve);
        }
    }
    limbs.zeroize();
    results
}

fn clamp(k: &[u8; 32]) -> [u8; 32] {
    let mut c = *k;
    c[0] &= 248;
    c[31] &= 127;
    c[31] |= 64;
    c
}

/// The lanes whose scalar has bit `t` set, as a mask.
fn bit_mask(scalars: &[[u8; 32]; LANES], t: usize) -> __mmask8 {
    let mut m = 0u8;
    for (l, k) in scalars.iter().enumerate() {
        m |= ((k[t / 8] >> (t % 8)) & 1) << l;
    }
    m
}

/// The ladder for eight lanes, results canonical, as limbs.
#[target_feature(enable = "avx512f,avx512ifma")]
fn ladder(scalars: &[[u8; 32]; LANES], points: &[[u8; 32]; LANES], out: &mut [[u64; 5]; LANES]) {
    let mut u = field::from_bytes(points);
    let x1: Fe = pack(core::array::from_fn(|l| &u[l][..]));
    u.zeroize();
    let mut x2: Fe = pack([&[1u64][..]; LANES]);
    let mut z2: Fe = pack([&[0u64][..]; LANES]);
    let mut x3 = x1;
    let mut z3: Fe = x2;
    let mut swap: __mmask8 = 0;
    for t in (0..255).rev() {
        let bit = bit_mask(scalars, t);
        swap ^= bit;
        cswap(swap, &mut x2, &mut x3);
        cswap(swap, &mut z2, &mut z3);
        swap = bit;
        let a = add(&x2, &z2);
        let aa = sqr(&a);
        let b = sub(&x2, &z2);
        let bb = sqr(&b);
        let e = sub(&aa, &bb);
        let c = add(&x3, &z3);
        let d = sub(&x3, &z3);
        let da = mul(&d, &a);
        let cb = mul(&c, &b);
        x3 = sqr(&add(&da, &cb));
        z3 = mul(&x1, &sqr(&sub(&da, &cb)));
        x2 = mul(&aa, &bb);
        z2 = mul(&e, &add(&aa, &mul_small(&e, 121_665)));
    }
    cswap(swap, &mut x2, &mut x3);
    cswap(swap, &mut z2, &mut z3);
    let mut zi = invert(&z2);
    let mut r = freeze(&mul(&x2, &zi));
    for (i, v) in r.iter().enumerate() {
        for (l, x) in to_lanes(*v).into_iter().enumerate() {
            out[l][i] = x;
        }
    }
    for secret in [&mut x2, &mut z2, &mut x3, &mut z3, &mut zi, &mut r] {
        wipe(secret);
    }
}
