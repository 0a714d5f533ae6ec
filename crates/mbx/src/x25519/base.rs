//! X25519 key generation in eight lanes by a fixed-base comb: a·B on the
//! twisted Edwards form of the curve (edwards25519: the same group, the
//! base point that maps to u = 9), then the Montgomery u = (Z + Y)/(Z − Y).
//!
//! The scalar is written in 64 signed base-16 digits (−8..=8); a table
//! holds j·256^i·B for j = 1..=8 and i = 0..32 as affine (y + x, y − x,
//! 2d·x·y). The odd digits are added first, the sum multiplied by 16 (four
//! doublings), then the even digits: 64 mixed additions of seven products
//! each, four doublings and one inversion, about a third of the ladder's
//! 255 steps. Every window reads all eight entries of its row and keeps the
//! lane's by mask, and a negative digit negates by mask: no branch or
//! address depends on a scalar. The extended-coordinate formulas are
//! complete on this curve, so the identity needs no special case.
//!
//! Before a public key leaves, each lane's point is checked on the curve
//! (−X² + Y² = Z² + d·T² and X·Y = Z·T): a fault yields an error, never a
//! wrong key.

use std::sync::OnceLock;

use core::arch::x86_64::*;

use zeroize::Zeroize;

use super::field::{self, Fe, add, freeze, invert, mul, sqr, sub};
use crate::ifma::{LANES, V, blend, eq_mask, from_lanes, one, splat, unpack, wipe, zero};

const ROWS: usize = 32;
const ENTRIES: usize = 8;

/// An affine point as the table keeps it: (y + x, y − x, 2d·x·y), each
/// canonical, five limbs.
type Entry = [[u64; 5]; 3];

/// edwards25519's constants (RFC 8032, section 5.1), big-endian hex.
const D_HEX: &str = "52036cee2b6ffe738cc740797779e89800700a4d4141d8ab75eb4dca135978a3";
const BASE_X_HEX: &str = "216936d3cd6e53fec0a4e231fdd6dc5c692cc7609525a7b2c9562d608f25d51a";
const BASE_Y_HEX: &str = "6666666666666666666666666666666666666666666666666666666666666658";

struct Table {
    d: [u64; 5],
    rows: Vec<[Entry; ENTRIES]>,
}

/// An extended point (X : Y : Z : T), x = X/Z, y = Y/Z, x·y = T/Z.
#[derive(Clone, Copy)]
struct P3 {
    x: Fe,
    y: Fe,
    z: Fe,
    t: Fe,
}

/// An affine point ready for a mixed addition.
#[derive(Clone, Copy)]
struct Precomp {
    ypx: Fe,
    ymx: Fe,
    xy2d: Fe,
}

fn limbs(be_hex: &str) -> [u64; 5] {
    let mut le = [0u8; 32];
    for (i, b) in le.iter_mut().enumerate() {
        let at = 2 * (31 - i);
        *b = u8::from_str_radix(&be_hex[at..at + 2], 16).unwrap_or(0);
    }
    field::from_bytes(&[le; LANES])[0]
}

#[inline]
#[target_feature(enable = "avx512f")]
fn identity() -> P3 {
    P3 { x: [zero(); 5], y: one(), z: one(), t: [zero(); 5] }
}

/// (X', Y', Z', T') of a completed point, to extended coordinates.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
fn completed(x: &Fe, y: &Fe, z: &Fe, t: &Fe) -> P3 {
    P3 { x: mul(x, t), y: mul(y, z), z: mul(z, t), t: mul(x, y) }
}

/// p + q, q affine (seven products).
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
fn madd(p: &P3, q: &Precomp) -> P3 {
    let a = mul(&add(&p.y, &p.x), &q.ypx);
    let b = mul(&sub(&p.y, &p.x), &q.ymx);
    let c = mul(&q.xy2d, &p.t);
    let d = add(&p.z, &p.z);
    completed(&sub(&a, &b), &add(&a, &b), &add(&d, &c), &sub(&d, &c))
}

/// 2·p.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
fn dbl(p: &P3) -> P3 {
    let xx = sqr(&p.x);
    let yy = sqr(&p.y);
    let zz2 = {
        let zz = sqr(&p.z);
        add(&zz, &zz)
    };
    let s = sqr(&add(&p.x, &p.y));
    let sum = add(&yy, &xx);
    let diff = sub(&yy, &xx);
    completed(&sub(&s, &sum), &sum, &diff, &sub(&zz2, &diff))
}

/// The affine form of p, for the table (public points only).
#[target_feature(enable = "avx512f,avx512ifma")]
fn precomp(p: &P3, d2: &Fe) -> Precomp {
    let zi = invert(&p.z);
    let x = mul(&p.x, &zi);
    let y = mul(&p.y, &zi);
    Precomp { ypx: freeze(&add(&y, &x)), ymx: freeze(&sub(&y, &x)), xy2d: freeze(&mul(&mul(&x, &y), d2)) }
}

/// Row i of the table is j·256^i·B for j = 1..=8: lane j − 1 adds the
/// row's base j times. Public values only; built once, with the lanes.
#[target_feature(enable = "avx512f,avx512ifma")]
fn build() -> Table {
    let d = freeze(&splat(&limbs(D_HEX)));
    let d2 = freeze(&add(&d, &d));
    let (bx, by) = (splat(&limbs(BASE_X_HEX)), splat(&limbs(BASE_Y_HEX)));
    let mut base_p3 = P3 { x: bx, y: by, z: one(), t: mul(&bx, &by) };
    let mut rows = Vec::with_capacity(ROWS);
    for _ in 0..ROWS {
        let base = precomp(&base_p3, &d2);
        let mut acc = identity();
        for s in 0..ENTRIES {
            let next = madd(&acc, &base);
            // Lanes l ≥ s add once more.
            let more: __mmask8 = 0xffu8 << s;
            acc = P3 {
                x: blend(more, &acc.x, &next.x),
                y: blend(more, &acc.y, &next.y),
                z: blend(more, &acc.z, &next.z),
                t: blend(more, &acc.t, &next.t),
            };
        }
        let entries = precomp(&acc, &d2);
        let mut parts = [[[0u64; 5]; LANES]; 3];
        unpack(&entries.ypx, &mut parts[0]);
        unpack(&entries.ymx, &mut parts[1]);
        unpack(&entries.xy2d, &mut parts[2]);
        rows.push(core::array::from_fn(|j| [parts[0][j], parts[1][j], parts[2][j]]));
        for _ in 0..8 {
            base_p3 = dbl(&base_p3);
        }
    }
    let mut out = [[0u64; 5]; LANES];
    unpack(&d, &mut out);
    Table { d: out[0], rows }
}

fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    // SAFETY: only reached from `public_keys`, whose callers checked that
    // the CPU has AVX-512F and IFMA, all `build` needs.
    T.get_or_init(|| unsafe { build() })
}

/// The scalar's 64 signed base-16 digits, each in −8..=8 (the top one in
/// 0..=8: a clamped scalar is below 2^255). Arithmetic only, no branch.
fn digits(a: &[u8; 32]) -> [i8; 64] {
    let mut e = [0i8; 64];
    for (i, b) in a.iter().enumerate() {
        e[2 * i] = (b & 15) as i8;
        e[2 * i + 1] = (b >> 4) as i8;
    }
    let mut carry = 0i8;
    for x in e.iter_mut().take(63) {
        *x += carry;
        carry = (*x + 8) >> 4;
        *x -= carry << 4;
    }
    e[63] += carry;
    e
}

/// Per lane, digit·(row's point): all eight entries read, the lane's kept.
#[inline]
#[target_feature(enable = "avx512f,avx512ifma")]
fn select(row: &[Entry; ENTRIES], digit: V) -> Precomp {
    let magnitude = _mm512_abs_epi64(digit);
    let negative = _mm512_cmplt_epi64_mask(digit, _mm512_setzero_si512());
    let mut t = Precomp { ypx: one(), ymx: one(), xy2d: [zero(); 5] };
    for (j, entry) in row.iter().enumerate() {
        let hit = _mm512_cmpeq_epi64_mask(magnitude, _mm512_set1_epi64(j as i64 + 1));
        t.ypx = blend(hit, &t.ypx, &splat(&entry[0]));
        t.ymx = blend(hit, &t.ymx, &splat(&entry[1]));
        t.xy2d = blend(hit, &t.xy2d, &splat(&entry[2]));
    }
    // −(x, y) = (−x, y): y + x and y − x trade places, x·y changes sign.
    let neg_xy2d = sub(&[zero(); 5], &t.xy2d);
    Precomp {
        ypx: blend(negative, &t.ypx, &t.ymx),
        ymx: blend(negative, &t.ymx, &t.ypx),
        xy2d: blend(negative, &t.xy2d, &neg_xy2d),
    }
}

/// The lanes whose extended point lies on the curve, as a mask.
#[target_feature(enable = "avx512f,avx512ifma")]
fn on_curve(p: &P3, d: &Fe) -> __mmask8 {
    let lhs = freeze(&sub(&sqr(&p.y), &sqr(&p.x)));
    let rhs = freeze(&add(&sqr(&p.z), &mul(d, &sqr(&p.t))));
    let xy = freeze(&mul(&p.x, &p.y));
    let zt = freeze(&mul(&p.z, &p.t));
    eq_mask(&lhs, &rhs) & eq_mask(&xy, &zt)
}

/// u-coordinates of a·B for eight clamped scalars, canonical limbs, and
/// the mask of lanes whose point passed the curve check.
#[target_feature(enable = "avx512f,avx512ifma")]
pub(super) fn public_keys(scalars: &[[u8; 32]; LANES], out: &mut [[u64; 5]; LANES]) -> u8 {
    let t = table();
    let mut e: [[i8; 64]; LANES] = core::array::from_fn(|l| digits(&scalars[l]));
    let digit = |e: &[[i8; 64]; LANES], k: usize| from_lanes(core::array::from_fn(|l| e[l][k] as i64 as u64));
    let mut h = identity();
    for (i, row) in t.rows.iter().enumerate() {
        let mut q = select(row, digit(&e, 2 * i + 1));
        h = madd(&h, &q);
        wipe(&mut q.ypx);
        wipe(&mut q.ymx);
        wipe(&mut q.xy2d);
    }
    for _ in 0..4 {
        h = dbl(&h);
    }
    for (i, row) in t.rows.iter().enumerate() {
        let mut q = select(row, digit(&e, 2 * i));
        h = madd(&h, &q);
        wipe(&mut q.ypx);
        wipe(&mut q.ymx);
        wipe(&mut q.xy2d);
    }
    e.zeroize();
    let ok = on_curve(&h, &splat(&t.d));
    let mut u = freeze(&mul(&add(&h.z, &h.y), &invert(&sub(&h.z, &h.y))));
    unpack(&u, out);
    for secret in [&mut h.x, &mut h.y, &mut h.z, &mut h.t, &mut u] {
        wipe(secret);
    }
    ok
}

/// Whether the base point passes the curve check and the point with its
/// y one higher fails it, for the tests.
#[cfg(test)]
pub(super) fn curve_check_tells() -> (bool, bool) {
    // SAFETY: the tests call this only where `available()` holds.
    unsafe {
        let d = splat(&table().d);
        let (bx, by) = (splat(&limbs(BASE_X_HEX)), splat(&limbs(BASE_Y_HEX)));
        let b = P3 { x: bx, y: by, z: one(), t: mul(&bx, &by) };
        let by1 = add(&by, &one());
        let off = P3 { x: bx, y: by1, z: one(), t: mul(&bx, &by1) };
        (on_curve(&b, &d) == 0xff, on_curve(&off, &d) == 0)
    }
}
