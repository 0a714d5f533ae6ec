//! Polynomials of ML-KEM (FIPS 203): 256 coefficients modulo q = 3329,
//! the number-theoretic transform, sampling and the byte encodings.
//!
//! Coefficients are `i16` in Montgomery arithmetic (R = 2^16) with lazy
//! reduction, as in the Kyber reference: [`mont`] maps a product below
//! q·2^15 to (−q, q), [`barrett`] any `i16` to about (−q/2, q/2]. The
//! transform's twiddles carry the factor R, so a forward transform leaves
//! values in the normal domain, a base-case product adds a factor R⁻¹ and
//! the inverse transform's final scaling by R²/128 takes it away again.
//!
//! Nothing here branches on or indexes memory by a coefficient, except
//! [`sample_ntt`], which reads the public matrix seed only.
//!
//! The transforms and the sampling here are the plain forms of the
//! AVX-512 kernels in `simd`, which the tests hold to them; the rest runs
//! as written, compiled for AVX-512 inside `simd::encrypt`.

pub(crate) const N: usize = 256;
/// ML-KEM-768's rank.
pub(crate) const K: usize = 3;
pub(crate) const Q: i16 = 3329;
/// q⁻¹ mod 2^16, as a signed 16-bit value.
pub(crate) const QINV: i16 = -3327;

#[derive(Clone, Copy)]
pub(crate) struct Poly(pub(crate) [i16; N]);

/// Zeroed by `Zeroize` as its default, all zeroes.
impl zeroize::DefaultIsZeroes for Poly {}

impl Default for Poly {
    fn default() -> Self {
        Poly([0; N])
    }
}

/// a·R⁻¹ mod q, in (−q, q), for |a| < q·2^15: what [`fqmul`] computes
/// for a product (the tests check the two agree).
#[cfg(test)]
fn mont(a: i32) -> i16 {
    let t = (a as i16).wrapping_mul(QINV);
    ((a - i32::from(t) * i32::from(Q)) >> 16) as i16
}

/// a·b·R⁻¹ mod q, as [`mont`] of the product, in the form vector units
/// take (high and low halves of 16-bit products: `vpmulhw`, `vpmullw`).
#[inline(always)]
fn fqmul(a: i16, b: i16) -> i16 {
    let p = i32::from(a) * i32::from(b);
    let t = (p as i16).wrapping_mul(QINV);
    ((p >> 16) as i16).wrapping_sub(((i32::from(t) * i32::from(Q)) >> 16) as i16)
}

/// ⌊(2^26 + q/2)/q⌋, Barrett's constant.
pub(crate) const BARRETT_V: i16 = (((1 << 26) + Q as i32 / 2) / Q as i32) as i16;

/// a mod q, centred: in [−(q−1)/2, (q−1)/2].
#[inline(always)]
fn barrett(a: i16) -> i16 {
    let t = ((i32::from(BARRETT_V) * i32::from(a) + (1 << 25)) >> 26) as i16;
    a.wrapping_sub(t.wrapping_mul(Q))
}

/// x·y mod q for the tables, at compile time.
const fn mulmod(x: i32, y: i32) -> i32 {
    (x * y) % Q as i32
}

const fn bitrev7(i: usize) -> usize {
    ((i as u8).reverse_bits() >> 1) as usize
}

/// ζ^bitrev7(i) · R mod q for ζ = 17, centred: the twiddles of layer after
/// layer (index 1..128; the last 64 serve the base-case products too).
pub(crate) const ZETAS: [i16; 128] = {
    let mut z = [0i16; 128];
    let mut i = 0;
    while i < 128 {
        let mut p = 1i32;
        let mut e = 0;
        while e < bitrev7(i) {
            p = mulmod(p, 17);
            e += 1;
        }
        let r = mulmod(p, (1 << 16) % Q as i32);
        z[i] = if r > Q as i32 / 2 { (r - Q as i32) as i16 } else { r as i16 };
        i += 1;
    }
    z
};

/// R²/128 mod q: the inverse transform's final factor (1/128 and back
/// into the normal domain after a base-case product).
pub(crate) const INV_SCALE: i16 = 1441;

impl Poly {
    /// The forward transform (FIPS 203 Algorithm 9), coefficients of
    /// magnitude below q in, below q after a final reduction.
    /// The plain form of `simd::ntt`, which the tests hold it to.
    #[cfg(test)]
    pub(crate) fn ntt(&mut self) {
        let f = &mut self.0;
        let mut k = 1;
        let mut len = 128;
        while len >= 2 {
            for start in (0..N).step_by(2 * len) {
                let zeta = ZETAS[k];
                k += 1;
                let (lo, hi) = f[start..start + 2 * len].split_at_mut(len);
                for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                    let t = fqmul(zeta, *b);
                    *b = *a - t;
                    *a += t;
                }
            }
            len /= 2;
        }
        self.reduce();
    }

    /// The inverse transform (Algorithm 10) times R: undoes [`Self::ntt`]
    /// of a base-case product. The plain form of `simd::inv_ntt`.
    #[cfg(test)]
    pub(crate) fn inv_ntt(&mut self) {
        let f = &mut self.0;
        let mut k = 127;
        let mut len = 2;
        while len <= 128 {
            for start in (0..N).step_by(2 * len) {
                let zeta = ZETAS[k];
                k -= 1;
                let (lo, hi) = f[start..start + 2 * len].split_at_mut(len);
                for (a, b) in lo.iter_mut().zip(hi.iter_mut()) {
                    let t = *a;
                    *a = barrett(t + *b);
                    *b = fqmul(zeta, *b - t);
                }
            }
            len *= 2;
        }
        for c in f.iter_mut() {
            *c = fqmul(*c, INV_SCALE);
        }
    }

    /// Adds the base-case product of `a` and `b` (in the transform's
    /// domain; Algorithm 11) times R⁻¹ to `self`.
    #[inline(always)]
    pub(crate) fn add_product(&mut self, a: &Poly, b: &Poly) {
        for i in 0..64 {
            let zeta = ZETAS[64 + i];
            for (j, z) in [(4 * i, zeta), (4 * i + 2, -zeta)] {
                let (a0, a1, b0, b1) = (a.0[j], a.0[j + 1], b.0[j], b.0[j + 1]);
                self.0[j] += fqmul(fqmul(a1, b1), z) + fqmul(a0, b0);
                self.0[j + 1] += fqmul(a0, b1) + fqmul(a1, b0);
            }
        }
    }

    #[inline(always)]
    pub(crate) fn add(&mut self, other: &Poly) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += *b;
        }
    }

    #[inline(always)]
    pub(crate) fn reduce(&mut self) {
        for c in self.0.iter_mut() {
            *c = barrett(*c);
        }
    }

    /// Coefficients into [0, q) without a branch (reduced first: a sum of
    /// reduced polynomials may come in).
    #[inline(always)]
    fn canonical(&self) -> [u16; N] {
        core::array::from_fn(|i| {
            let c = barrett(self.0[i]);
            (c + ((c >> 15) & Q)) as u16
        })
    }

    /// SamplePolyCBD with η = 2 (Algorithm 8) from 128 bytes of PRF output.
    #[inline(always)]
    pub(crate) fn cbd2(bytes: &[u8; 128]) -> Poly {
        let mut p = Poly::default();
        for (i, chunk) in bytes.chunks_exact(4).enumerate() {
            let t = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            // Each 2-bit field's two bits summed.
            let d = (t & 0x5555_5555) + ((t >> 1) & 0x5555_5555);
            for j in 0..8 {
                let a = ((d >> (4 * j)) & 3) as i16;
                let b = ((d >> (4 * j + 2)) & 3) as i16;
                p.0[8 * i + j] = a - b;
            }
        }
        p
    }

    /// Decompress₁ of a 32-byte message: bit i becomes ⌈q/2⌋ or 0.
    #[inline(always)]
    pub(crate) fn from_message(m: &[u8; 32]) -> Poly {
        let mut p = Poly::default();
        for (i, c) in p.0.iter_mut().enumerate() {
            let bit = i16::from((m[i / 8] >> (i % 8)) & 1);
            *c = -bit & ((Q + 1) / 2);
        }
        p
    }

    /// ByteDecode₁₂ of 384 bytes; `None` if a value is not below q (the
    /// modulus check of an encapsulation key, FIPS 203 §7.2). The plain
    /// form of `simd::decode12`.
    #[cfg(test)]
    pub(crate) fn decode12(bytes: &[u8]) -> Option<Poly> {
        let mut p = Poly::default();
        let mut bad = 0u16;
        for (i, b) in bytes.chunks_exact(3).enumerate() {
            let x = u16::from(b[0]) | (u16::from(b[1] & 0x0f) << 8);
            let y = u16::from(b[1] >> 4) | (u16::from(b[2]) << 4);
            bad |= (x >= Q as u16) as u16 | (y >= Q as u16) as u16;
            p.0[2 * i] = x as i16;
            p.0[2 * i + 1] = y as i16;
        }
        (bad == 0).then_some(p)
    }

    /// Compress₁₀ and ByteEncode₁₀ into 320 bytes.
    #[inline(always)]
    pub(crate) fn compress10(&self, out: &mut [u8]) {
        let c = self.canonical();
        for (four, o) in c.chunks_exact(4).zip(out.chunks_exact_mut(5)) {
            let v: [u64; 4] = core::array::from_fn(|i| compress(four[i], 10));
            let w = v[0] | v[1] << 10 | v[2] << 20 | v[3] << 30;
            o.copy_from_slice(&w.to_le_bytes()[..5]);
        }
    }

    /// Compress₄ and ByteEncode₄ into 128 bytes.
    #[inline(always)]
    pub(crate) fn compress4(&self, out: &mut [u8]) {
        let c = self.canonical();
        for (two, o) in c.chunks_exact(2).zip(out.iter_mut()) {
            *o = (compress(two[0], 4) | compress(two[1], 4) << 4) as u8;
        }
    }
}

/// Compress_d(x) = ⌈2^d·x/q⌋ mod 2^d for x in [0, q), with a multiply and
/// a shift in place of the division (exact for every such x; see tests).
#[inline(always)]
fn compress(x: u16, d: u32) -> u64 {
    // ⌊n/q⌋ = ⌊n·M / 2^35⌋ with M = ⌈2^35/q⌉, for n < 2^22.
    const M: u64 = (1u64 << 35).div_ceil(Q as u64);
    let n = (u64::from(x) << d) + (Q as u64) / 2;
    ((n * M) >> 35) & ((1 << d) - 1)
}

/// SampleNTT's candidates of `tail` (a stream's last bytes, fewer than a
/// kernel takes at once) one by one into `buf` from `n` on; the new count.
pub(crate) fn sample_tail(tail: &[u8], buf: &mut [i16], mut n: usize) -> usize {
    for b in tail.chunks_exact(3) {
        for d in [u16::from(b[0]) | (u16::from(b[1] & 0x0f) << 8), u16::from(b[1] >> 4) | (u16::from(b[2]) << 4)] {
            if d < Q as u16 && n < N {
                buf[n] = d as i16;
                n += 1;
            }
        }
    }
    n
}

/// The transforms of a kernel, for [`encrypt`].
pub(crate) trait Transform: Copy {
    fn ntt(self, p: &mut Poly);
    fn inv_ntt(self, p: &mut Poly);

    /// Σ a[j]∘b[j], the base-case products (times R⁻¹) summed, as
    /// [`Poly::add_product`] adds them up from zero.
    #[inline(always)]
    fn dot(self, a: [&Poly; K], b: &[Poly; K]) -> Poly {
        let mut sum = Poly::default();
        for (aj, bj) in a.into_iter().zip(b) {
            sum.add_product(aj, bj);
        }
        sum
    }
}

/// K-PKE.Encrypt (FIPS 203 Algorithm 14) with the matrix expanded and the
/// noise bytes drawn: u = NTT⁻¹(Âᵀ∘r̂) + e₁, v = NTT⁻¹(t̂ᵀ∘r̂) + e₂ + μ.
/// Inlined into each kernel's target-feature function, so that the
/// arithmetic here is vectorized for its CPU.
#[inline(always)]
pub(crate) fn encrypt(
    x: impl Transform,
    t: &[Poly; K],
    matrix: &[Poly],
    m: &[u8; 32],
    coins: &[[u8; 128]],
    out: &mut [u8; 1088],
) {
    use zeroize::Zeroize;
    let mut r = [Poly::default(); K];
    for (p, bytes) in r.iter_mut().zip(&coins[..K]) {
        *p = Poly::cbd2(bytes);
        x.ntt(p);
    }
    let (c1, c2) = out.split_at_mut(K * 320);
    for (i, chunk) in c1.chunks_exact_mut(320).enumerate() {
        let mut u = x.dot(core::array::from_fn(|j| &matrix[i * K + j]), &r);
        u.reduce();
        x.inv_ntt(&mut u);
        let mut e1 = Poly::cbd2(&coins[K + i]);
        u.add(&e1);
        u.compress10(chunk);
        u.zeroize();
        e1.zeroize();
    }
    let mut v = x.dot(core::array::from_fn(|j| &t[j]), &r);
    v.reduce();
    x.inv_ntt(&mut v);
    let mut e2 = Poly::cbd2(&coins[2 * K]);
    let mut mu = Poly::from_message(m);
    v.add(&e2);
    v.add(&mu);
    v.compress4(c2);
    r.zeroize();
    v.zeroize();
    e2.zeroize();
    mu.zeroize();
}

/// SampleNTT (Algorithm 7): coefficients below q from a SHAKE128 stream of
/// the public seed, three bytes for two candidates. Returns how many it
/// found (256 when `stream` sufficed). The plain form of
/// `simd::sample_ntt`.
#[cfg(test)]
pub(crate) fn sample_ntt(stream: &[u8], out: &mut Poly) -> usize {
    // Both candidates are stored; only those below q advance the count.
    let mut buf = [0i16; N + 2];
    let mut n = 0;
    for b in stream.chunks_exact(3) {
        if n >= N {
            break;
        }
        let d1 = u16::from(b[0]) | (u16::from(b[1] & 0x0f) << 8);
        let d2 = u16::from(b[1] >> 4) | (u16::from(b[2]) << 4);
        buf[n] = d1 as i16;
        n += usize::from(d1 < Q as u16);
        buf[n] = d2 as i16;
        n += usize::from(d2 < Q as u16);
    }
    out.0.copy_from_slice(&buf[..N]);
    n.min(N)
}

/// The checks each kernel's tests run against the plain code above, on
/// random inputs: the same outputs, bit for bit.
#[cfg(test)]
pub(crate) mod check {
    use super::*;

    /// Both transforms, on inputs as the encryption feeds them: small
    /// noise, or reduced sums.
    pub(crate) fn transforms(seed: u64, ntt: impl Fn(&mut Poly), inv_ntt: impl Fn(&mut Poly)) {
        let mut rng = fastrand::Rng::with_seed(seed);
        for round in 0..2000 {
            let mut p = Poly::default();
            let bound = if round % 2 == 0 { 3 } else { Q / 2 + 1 };
            p.0.iter_mut().for_each(|c| *c = rng.i16(-bound + 1..bound));
            let (mut want, mut got) = (p, p);
            want.ntt();
            ntt(&mut got);
            assert_eq!(want.0, got.0, "forward, round {round}");
            want.inv_ntt();
            inv_ntt(&mut got);
            assert_eq!(want.0, got.0, "inverse, round {round}");
        }
    }

    /// ByteDecode₁₂ with its modulus check: valid encodings, random bytes,
    /// and encodings with one value exactly q.
    pub(crate) fn decoding(seed: u64, decode: impl Fn(&[u8; 384]) -> Option<Poly>) {
        let mut rng = fastrand::Rng::with_seed(seed);
        let encode = |x: u16, y: u16| [x as u8, (x >> 8) as u8 | (y << 4) as u8, (y >> 4) as u8];
        for round in 0..500 {
            let mut bytes = [0u8; 384];
            rng.fill(&mut bytes);
            if round % 2 == 0 {
                for b in bytes.chunks_exact_mut(3) {
                    b.copy_from_slice(&encode(rng.u16(0..Q as u16), rng.u16(0..Q as u16)));
                }
            }
            if round % 4 == 2 {
                let t = rng.usize(..128);
                let pair = if rng.bool() { (Q as u16, 0) } else { (0, Q as u16) };
                bytes[3 * t..3 * t + 3].copy_from_slice(&encode(pair.0, pair.1));
            }
            let want = Poly::decode12(&bytes).map(|p| p.0);
            assert_eq!(want.is_some(), round % 4 == 0, "round {round}");
            assert_eq!(decode(&bytes).map(|p| p.0), want, "round {round}");
        }
    }

    /// Sums of three base-case products, on transformed inputs (below q)
    /// and small ones.
    pub(crate) fn products(seed: u64, dot: impl Fn([&Poly; K], &[Poly; K]) -> Poly) {
        let mut rng = fastrand::Rng::with_seed(seed);
        for round in 0..500 {
            let bound = if round % 2 == 0 { Q } else { 3 };
            let mut random = || {
                let mut p = Poly::default();
                p.0.iter_mut().for_each(|c| *c = rng.i16(-bound + 1..bound));
                p
            };
            let a: [Poly; K] = core::array::from_fn(|_| random());
            let b: [Poly; K] = core::array::from_fn(|_| random());
            let mut want = Poly::default();
            for (x, y) in a.iter().zip(&b) {
                want.add_product(x, y);
            }
            assert_eq!(dot(a.each_ref(), &b).0, want.0, "round {round}");
        }
    }

    /// SampleNTT on streams of many lengths, some with many values at or
    /// above q so that they run short.
    pub(crate) fn sampling(seed: u64, sample: impl Fn(&[u8], &mut Poly) -> usize) {
        let mut rng = fastrand::Rng::with_seed(seed);
        for len in [504, 168, 480, 510, 840, 24, 27] {
            for _ in 0..200 {
                let mut stream = vec![0u8; len];
                rng.fill(&mut stream);
                if rng.bool() {
                    stream.iter_mut().skip(1).step_by(2).for_each(|b| *b = 0xff);
                }
                let (mut want, mut got) = (Poly::default(), Poly::default());
                let n = sample_ntt(&stream, &mut want);
                assert_eq!(n, sample(&stream, &mut got), "length {len}");
                assert_eq!(want.0[..n], got.0[..n]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transform's definition (FIPS 203 §4.3), straight from ζ = 17.
    fn naive_ntt(f: &[i64; N]) -> [i64; N] {
        let q = i64::from(Q);
        let pow = |mut b: i64, mut e: usize| {
            let mut r = 1;
            while e > 0 {
                if e & 1 == 1 {
                    r = r * b % q;
                }
                b = b * b % q;
                e >>= 1;
            }
            r
        };
        let mut out = [0i64; N];
        for i in 0..128 {
            let z = pow(17, 2 * bitrev7(i) + 1);
            for j in 0..128 {
                let w = pow(z, j);
                out[2 * i] = (out[2 * i] + f[2 * j] * w) % q;
                out[2 * i + 1] = (out[2 * i + 1] + f[2 * j + 1] * w) % q;
            }
        }
        out
    }

    fn modq(x: i16) -> i64 {
        i64::from(x).rem_euclid(i64::from(Q))
    }

    #[test]
    fn the_transform_matches_its_definition_and_inverts() {
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20 {
            let mut p = Poly::default();
            p.0.iter_mut().for_each(|c| *c = rng.i16(-Q + 1..Q));
            let want = naive_ntt(&core::array::from_fn(|i| modq(p.0[i])));
            let orig = p;
            p.ntt();
            assert!(p.0.iter().zip(want).all(|(&a, b)| modq(a) == b));
            // Inverse after a product by the transform of 1 (R⁻¹ each time)
            // gives the input back.
            let mut one = Poly::default();
            one.0[0] = 1;
            one.ntt();
            let mut prod = Poly::default();
            prod.add_product(&p, &one);
            prod.reduce();
            // prod = p·R⁻¹, the factor the inverse takes away.
            prod.inv_ntt();
            assert!(prod.0.iter().zip(orig.0).all(|(&a, b)| modq(a) == modq(b)));
        }
    }

    #[test]
    fn compression_is_exact() {
        for d in [1, 4, 10, 11] {
            for x in 0..Q as u16 {
                let want = ((u64::from(x) << d) * 2 + Q as u64) / (2 * Q as u64) % (1 << d);
                assert_eq!(compress(x, d), want, "x={x} d={d}");
            }
        }
    }

    #[test]
    fn reductions_stay_in_range() {
        for a in i16::MIN..=i16::MAX {
            let r = barrett(a);
            assert!(r.abs() <= Q / 2 && modq(r) == modq(a), "barrett({a})");
        }
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..100_000 {
            let a = rng.i32(-(i32::from(Q) << 15) + 1..i32::from(Q) << 15);
            let r = mont(a);
            assert!(r.abs() < Q);
            let (x, y) = (rng.i16(..), rng.i16(-Q..Q));
            assert_eq!(fqmul(x, y), mont(i32::from(x) * i32::from(y)));
            assert_eq!((i64::from(r) << 16).rem_euclid(3329), i64::from(a).rem_euclid(3329));
        }
    }

    #[test]
    fn decoding_refuses_values_not_below_q() {
        let mut bytes = [0u8; 384];
        assert!(Poly::decode12(&bytes).is_some());
        bytes[0] = 0x01;
        bytes[1] = 0x0d; // 0xd01 = 3329
        assert!(Poly::decode12(&bytes).is_none());
        bytes[0] = 0x00; // 3328
        assert!(Poly::decode12(&bytes).is_some());
    }
}
