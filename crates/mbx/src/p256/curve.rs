//! P-256 arithmetic in eight lanes: the field (mod p) and the scalars
//! (mod n) in Montgomery form with R = 2^260 on the crate's IFMA kernels,
//! Jacobian points, and the fixed-base comb table.
//!
//! Field and scalar values are five 52-bit limbs, almost reduced (below
//! twice the modulus) between operations, as [`amm`] keeps them.

use std::sync::OnceLock;

use zeroize::Zeroize;

use boring::bn::{BigNum, BigNumContext};
use boring::ec::{EcGroup, EcPoint};
use boring::nid::Nid;
use core::arch::x86_64::*;

use crate::bn::{limbs_from_be, mont_k0, mont_rr};
use crate::ifma::{V, add_2m_sub, amm, eq_mask, normalize, splat, sqr, sub_cond};

pub(crate) type Fe = [V; 5];

pub(crate) const P: &str = "ffffffff00000001000000000000000000000000ffffffffffffffffffffffff";
pub(crate) const N: &str = "ffffffff00000000ffffffffffffffffbce6faada7179e84f3b9cac2fc632551";
const B: &str = "5ac635d8aa3a93e7b3ebbd55769886bc651d06b0cc53b0f63bce3c3e27d2604b";

/// Bits of a window of the comb: a nonce's signed digits (Booth's
/// recoding) lie in [−32, 32].
pub(crate) const WINDOW_BITS: usize = 6;
/// Windows of the comb: 43 of 6 bits cover 257 bits, the 256 of a nonce
/// and the carry of its last digit.
pub(crate) const WINDOWS: usize = 43;
/// Table entries per window: j·64^i·G for j = 1..=32 (a negative digit
/// takes its entry's negative).
pub(crate) const ENTRIES: usize = 32;

/// The constants of one modulus, as scalars.
pub(crate) struct Modulus {
    pub m: [u64; 5],
    pub twice: [u64; 5],
    pub k0: u64,
    pub rr: [u64; 5],
    /// R mod m (one, in Montgomery form).
    pub one_r: [u64; 5],
    /// m − 2 as little-endian 64-bit words: the exponent of an inversion.
    pub inv_exp: [u64; 4],
}

/// The scalar constants and the comb table, made once.
pub(crate) struct Consts {
    /// n, big-endian: what keys and nonces are compared with.
    pub n_be: [u8; 32],
    pub p: Modulus,
    pub n: Modulus,
    /// b·R mod p.
    pub b_r: [u64; 5],
    /// `table[i][j − 1]` = (x, y)·R mod p of j·64^i·G.
    pub table: Vec<[[[u64; 5]; 2]; ENTRIES]>,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0)).collect()
}

fn limbs5(be: &[u8]) -> [u64; 5] {
    let mut v = limbs_from_be(be, 5).unwrap_or_default();
    let out = core::array::from_fn(|i| v.get(i).copied().unwrap_or(0));
    v.zeroize();
    out
}

fn words4(be: &[u8]) -> [u64; 4] {
    let w = crate::bn::words_from_be(be);
    core::array::from_fn(|i| w.get(i).copied().unwrap_or(0))
}

fn modulus(hex_m: &str) -> Modulus {
    let be = hex(hex_m);
    let m = limbs5(&be);
    let mut twice = [0u64; 5];
    let mut carry = 0u64;
    for i in 0..5 {
        let t = (m[i] << 1) | carry;
        carry = t >> 52;
        twice[i] = t & ((1 << 52) - 1);
    }
    let rr_v = mont_rr(&m);
    let rr: [u64; 5] = core::array::from_fn(|i| rr_v[i]);
    // R mod m = (R² mod m)·R⁻¹ … computed in scalar: 2^260 mod m by doubling.
    let one_r = pow2_mod(&be, 260);
    let mut e = BigNum::from_slice(&be).expect("modulus");
    let two = BigNum::from_u32(2).expect("two");
    let mut e2 = BigNum::new().expect("bn");
    e2.checked_sub(&e, &two).expect("m − 2");
    e = e2;
    Modulus { m, twice, k0: mont_k0(m[0]), rr, one_r, inv_exp: words4(&e.to_vec_padded(32).expect("32 bytes")) }
}

/// 2^k mod m, as limbs.
fn pow2_mod(m_be: &[u8], k: i32) -> [u64; 5] {
    let m = BigNum::from_slice(m_be).expect("modulus");
    let mut ctx = BigNumContext::new().expect("ctx");
    let one = BigNum::from_u32(1).expect("one");
    let mut x = BigNum::new().expect("bn");
    x.lshift(&one, k).expect("shift");
    let mut r = BigNum::new().expect("bn");
    r.nnmod(&x, &m, &mut ctx).expect("mod");
    limbs5(&r.to_vec_padded(33).expect("fits"))
}

/// x·R mod m for big-endian x.
pub(crate) fn to_mont_scalar(x_be: &[u8], m_hex: &str) -> [u64; 5] {
    let m = BigNum::from_slice(&hex(m_hex)).expect("modulus");
    let mut ctx = BigNumContext::new().expect("ctx");
    // x may be a private key: every copy is cleared before it is freed.
    let mut x = BigNum::from_slice(x_be).expect("x");
    let mut shifted = BigNum::new().expect("bn");
    shifted.lshift(&x, 260).expect("shift");
    let mut r = BigNum::new().expect("bn");
    r.nnmod(&shifted, &m, &mut ctx).expect("mod");
    let mut bytes = r.to_vec_padded(33).expect("fits");
    let out = limbs5(&bytes);
    bytes.zeroize();
    for b in [&mut x, &mut shifted, &mut r] {
        b.clear();
    }
    out
}

/// The constants and the table, computed on first use with BoringSSL's
/// P-256 (public values only: multiples of the generator).
pub(crate) fn consts() -> &'static Consts {
    static C: OnceLock<Consts> = OnceLock::new();
    C.get_or_init(|| {
        let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("P-256");
        let mut ctx = BigNumContext::new().expect("ctx");
        let mut table = Vec::with_capacity(WINDOWS);
        for i in 0..WINDOWS {
            let row: [[[u64; 5]; 2]; ENTRIES] = core::array::from_fn(|j| {
                let mut k = BigNum::from_u32(j as u32 + 1).expect("j");
                let mut shifted = BigNum::new().expect("bn");
                shifted.lshift(&k, (WINDOW_BITS * i) as i32).expect("shift");
                k = shifted;
                let mut pt = EcPoint::new(&group).expect("point");
                pt.mul_generator(&group, &k, &mut ctx).expect("j·64^i·G");
                let (mut x, mut y) = (BigNum::new().expect("x"), BigNum::new().expect("y"));
                pt.affine_coordinates_gfp(&group, &mut x, &mut y, &mut ctx).expect("affine");
                let xb = x.to_vec_padded(32).expect("x bytes");
                let yb = y.to_vec_padded(32).expect("y bytes");
                [to_mont_scalar(&xb, P), to_mont_scalar(&yb, P)]
            });
            table.push(row);
        }
        let mut n_be = [0u8; 32];
        n_be.copy_from_slice(&hex(N));
        Consts { n_be, p: modulus(P), n: modulus(N), b_r: to_mont_scalar(&hex(B), P), table }
    })
}

/// A modulus's constants as vectors, for one batch.
pub(crate) struct Lanes {
    pub m: Fe,
    pub twice: Fe,
    pub k0: V,
    pub rr: Fe,
    pub one_r: Fe,
}

impl Lanes {
    #[target_feature(enable = "avx512f")]
    pub(crate) fn of(m: &Modulus) -> Self {
        Lanes {
            m: splat(&m.m),
            twice: splat(&m.twice),
            k0: _mm512_set1_epi64(m.k0 as i64),
            rr: splat(&m.rr),
            one_r: splat(&m.one_r),
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    pub(crate) fn mul(&self, a: &Fe, b: &Fe) -> Fe {
        amm(a, b, &self.m, self.k0)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    pub(crate) fn sqr(&self, a: &Fe) -> Fe {
        let mut t = [_mm512_setzero_si512(); 10];
        sqr::<5, 10>(a, &self.m, self.k0, &mut t)
    }

    /// a + b, below 2·m.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn add(&self, a: &Fe, b: &Fe) -> Fe {
        let mut t: Fe = core::array::from_fn(|i| _mm512_add_epi64(a[i], b[i]));
        normalize(&mut t);
        sub_cond(&t, &self.twice)
    }

    /// a − b, below 2·m.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn sub(&self, a: &Fe, b: &Fe) -> Fe {
        sub_cond(&add_2m_sub(a, b, &self.m), &self.twice)
    }

    /// Into Montgomery form (x < 2·m).
    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    pub(crate) fn to_mont(&self, x: &Fe) -> Fe {
        amm(x, &self.rr, &self.m, self.k0)
    }

    /// Out of Montgomery form, fully reduced.
    #[inline]
    #[target_feature(enable = "avx512f,avx512ifma")]
    pub(crate) fn leave_mont(&self, x: &Fe) -> Fe {
        let mut one = [_mm512_setzero_si512(); 5];
        one[0] = _mm512_set1_epi64(1);
        sub_cond(&amm(x, &one, &self.m, self.k0), &self.m)
    }

    /// Lanes where a ≡ b (both below 2·m).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn eq(&self, a: &Fe, b: &Fe) -> u8 {
        eq_mask(&sub_cond(a, &self.m), &sub_cond(b, &self.m))
    }
}

/// A point in Jacobian coordinates, Montgomery form.
#[derive(Clone, Copy)]
pub(crate) struct Jacobian {
    pub x: Fe,
    pub y: Fe,
    pub z: Fe,
}

/// (X1, Y1, Z1) + (x2, y2, 1) for distinct points, neither at infinity
/// (8M + 3S).
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn add_affine(f: &Lanes, a: &Jacobian, x2: &Fe, y2: &Fe) -> Jacobian {
    let z1z1 = f.sqr(&a.z);
    let z1c = f.mul(&z1z1, &a.z);
    let h = f.sub(&f.mul(x2, &z1z1), &a.x);
    let r = f.sub(&f.mul(y2, &z1c), &a.y);
    let z = f.mul(&a.z, &h);
    let hh = f.sqr(&h);
    let hhh = f.mul(&hh, &h);
    let v = f.mul(&a.x, &hh);
    let x = f.sub(&f.sub(&f.sqr(&r), &hhh), &f.add(&v, &v));
    let y = f.sub(&f.mul(&r, &f.sub(&v, &x)), &f.mul(&a.y, &hhh));
    Jacobian { x, y, z }
}

/// The lanes whose point satisfies Y² = X³ − 3·X·Z⁴ + b·Z⁶.
#[target_feature(enable = "avx512f,avx512ifma")]
pub(crate) fn on_curve(f: &Lanes, pt: &Jacobian, b_r: &Fe) -> u8 {
    let z2 = f.sqr(&pt.z);
    let z4 = f.sqr(&z2);
    let z6 = f.mul(&z4, &z2);
    let three_z4 = f.add(&f.add(&z4, &z4), &z4);
    let rhs = f.add(&f.mul(&pt.x, &f.sub(&f.sqr(&pt.x), &three_z4)), &f.mul(b_r, &z6));
    f.eq(&f.sqr(&pt.y), &rhs)
}
