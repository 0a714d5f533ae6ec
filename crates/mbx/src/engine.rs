//! The eight-lane RSA private operation (CRT), ending with the public-key check.
//!
//! This module holds the crate's one call into `#[target_feature]` code from a
//! context without it, after the run-time CPU check.

#![allow(unsafe_code)]

use zeroize::Zeroize;

use crate::bn::{limbs_to_be, window};
use crate::ifma::{
    LANES, V, add_2m_sub, add_low, amm, eq_mask, from_lanes, mod_exp, mul_wide, one, pack, redc, sub_cond, unpack, wipe,
};
use crate::rsa::{KeyClass, Prime, RsaKey};

/// A test hook: flips one bit of one limb of one lane's result before the
/// public-key check, as a hardware fault or a bug would.
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    pub lane: usize,
    pub limb: usize,
}

/// True when this CPU runs the IFMA kernels.
pub fn available() -> bool {
    std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512ifma")
}

/// Runs the private operation for up to eight lanes of one class. `inputs[l]` is
/// lane l's input as 52-bit limbs (at least the class's modulus limbs long).
/// Returns the mask of lanes whose result passed the public-key check; only
/// those results are written, as big-endian bytes, to `outputs[l]`.
pub(crate) fn run(
    class: KeyClass,
    keys: &[&RsaKey],
    inputs: &[&[u64]],
    outputs: &mut [&mut [u8]],
    fault: Option<Fault>,
) -> u8 {
    assert!(available(), "the IFMA engine was called on a CPU without AVX-512 IFMA");
    assert!(!keys.is_empty() && keys.len() <= LANES && keys.len() == inputs.len());
    assert_eq!(outputs.len(), keys.len());
    let keys: [&RsaKey; LANES] = core::array::from_fn(|l| keys[l.min(keys.len() - 1)]);
    let inputs: [&[u64]; LANES] = core::array::from_fn(|l| inputs[l.min(inputs.len() - 1)]);
    // SAFETY: `available()` was checked above, so the CPU has AVX-512F and IFMA,
    // the only requirement of these `#[target_feature]` functions.
    unsafe {
        match class {
            // Windows (table sizes) measured per size: 4 bits (16) for
            // 1024-bit primes, where reading a 32-entry table in full costs
            // more than the extra multiplications save; 5 bits above.
            KeyClass::Rsa2048 => crt::<20, 40, 16>(&keys, &inputs, outputs, fault),
            KeyClass::Rsa3072 => crt::<30, 60, 32>(&keys, &inputs, outputs, fault),
            KeyClass::Rsa4096 => crt::<40, 80, 32>(&keys, &inputs, outputs, fault),
        }
    }
}

fn k0s(primes: [&Prime; LANES]) -> V {
    from_lanes(core::array::from_fn(|l| primes[l].k0))
}

/// s = c^d mod n for eight lanes, by CRT, then the check s^65537 ≡ c (mod n).
#[target_feature(enable = "avx512f,avx512ifma")]
fn crt<const N: usize, const W: usize, const T: usize>(
    keys: &[&RsaKey; LANES],
    inputs: &[&[u64]; LANES],
    outputs: &mut [&mut [u8]],
    fault: Option<Fault>,
) -> u8 {
    let c: [V; W] = pack(*inputs);
    let p_side: [&Prime; LANES] = core::array::from_fn(|l| &keys[l].p);
    let q_side: [&Prime; LANES] = core::array::from_fn(|l| &keys[l].q);
    let unit = one::<N>();

    // c^dp mod p and c^dq mod q, both kept in Montgomery form (·R) for now.
    let mut p: [V; N] = pack(p_side.map(|k| k.m.as_slice()));
    let kp = k0s(p_side);
    let mut rrp: [V; N] = pack(p_side.map(|k| k.rr.as_slice()));
    let mut x1 = exp_half::<N, W, T>(&c, &p, kp, &rrp, p_side);
    let mut q: [V; N] = pack(q_side.map(|k| k.m.as_slice()));
    let kq = k0s(q_side);
    let mut rrq: [V; N] = pack(q_side.map(|k| k.rr.as_slice()));
    let mut x2 = exp_half::<N, W, T>(&c, &q, kq, &rrq, q_side);

    // Garner: h = (m1 − m2)·qinv mod p, s = m2 + q·h.
    let mut m2 = sub_cond(&amm(&x2, &unit, &q, kq), &q);
    let mut m2p = amm(&m2, &rrp, &p, kp);
    let mut diff = add_2m_sub(&x1, &m2p, &p);
    let mut qinv: [V; N] = pack(keys.map(|k| k.qinv.as_slice()));
    let mut h = sub_cond(&amm(&diff, &qinv, &p, kp), &p);
    let mut s = mul_wide::<N, W>(&q, &h);
    add_low(&mut s, &m2);
    for secret in [&mut p, &mut q, &mut rrp, &mut rrq, &mut x1, &mut x2, &mut m2, &mut m2p] {
        wipe(secret);
    }
    for secret in [&mut diff, &mut qinv, &mut h] {
        wipe(secret);
    }

    if let Some(f) = fault
        && f.lane < LANES
        && f.limb < W
    {
        let mut flip = [0u64; LANES];
        flip[f.lane] = 1 << 7;
        s[f.limb] = core::arch::x86_64::_mm512_xor_si512(s[f.limb], from_lanes(flip));
    }

    // The public-key check: s^65537 mod n must give back c.
    let n: [V; W] = pack(keys.map(|k| k.n.as_slice()));
    let kn = from_lanes(core::array::from_fn(|l| keys[l].n_k0));
    let rrn: [V; W] = pack(keys.map(|k| k.n_rr.as_slice()));
    let sr = amm(&s, &rrn, &n, kn);
    let mut t = sr;
    for _ in 0..16 {
        t = amm(&t, &t, &n, kn);
    }
    t = amm(&t, &sr, &n, kn);
    t = sub_cond(&amm(&t, &one::<W>(), &n, kn), &n);
    let ok = eq_mask(&t, &c);

    let mut lanes = [[0u64; W]; LANES];
    unpack(&s, &mut lanes);
    for (l, (lane, out)) in lanes.iter_mut().zip(outputs.iter_mut()).enumerate() {
        if ok & (1 << l) != 0 {
            limbs_to_be(lane, out);
        }
        lane.zeroize();
    }
    ok
}

/// c^d · R mod m for one prime of each lane (almost reduced).
#[target_feature(enable = "avx512f,avx512ifma")]
fn exp_half<const N: usize, const W: usize, const T: usize>(
    c: &[V; W],
    m: &[V; N],
    k0: V,
    rr: &[V; N],
    primes: [&Prime; LANES],
) -> [V; N] {
    // c·R⁻¹ (reduction of the double-width input), then ·R³·R⁻¹ gives c·R.
    let mut rrr = amm(rr, rr, m, k0);
    let mut cr = amm(&redc::<N, W>(c, m, k0), &rrr, m, k0);
    let mut one_r = amm(rr, &one::<N>(), m, k0);
    let bits = primes.iter().map(|k| k.bits).max().unwrap_or(0);
    let win = T.trailing_zeros() as usize;
    let x = mod_exp::<N, W, T>(
        &cr,
        &one_r,
        bits,
        |pos| from_lanes(core::array::from_fn(|l| window(&primes[l].exp, pos, win))),
        m,
        k0,
    );
    wipe(&mut rrr);
    wipe(&mut cr);
    wipe(&mut one_r);
    x
}
