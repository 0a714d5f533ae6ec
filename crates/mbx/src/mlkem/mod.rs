//! ML-KEM-768 encapsulation (FIPS 203) for many keys at once: the server's
//! half of the X25519MLKEM768 key share.
//!
//! Most of an encapsulation is Keccak: hashing the 1184-byte key (H),
//! deriving the shared secret and the coins (G), expanding the key's
//! 3×3 matrix from its seed (nine SHAKE128 streams) and the noise (seven
//! SHAKE256 streams). Every one of those is independent of the others, in
//! one encapsulation and across encapsulations, so they run eight at a
//! time in the lanes of [`keccak`] (four on a CPU with AVX2 but not the
//! AVX-512 it needs): a batch of four handshakes' shares hashes its four
//! keys together, expands 36 matrix entries in five rounds, and so on.
//! The polynomial arithmetic that remains runs per key ([`poly`]), in
//! AVX-512 kernels ([`simd`]) or AVX2 ones ([`avx2`]), each held to the
//! plain code by the tests. [`Cpu`] picks the kernels once per batch.
//!
//! The result is FIPS 203's `ML-KEM.Encaps_internal(ek, m)` byte for byte:
//! checked against BoringSSL's decapsulation on random keys and against
//! BoringSSL's known-answer values. Keys are checked as FIPS 203 §7.2 asks
//! (every coefficient below q); secrets (the message, the coins, the noise)
//! touch no branch or address, and every buffer that held one is zeroed.

/// The arithmetic both polynomial kernels share, written once over a
/// register of 16-bit lanes: `vec` (a table row into a register), `load`
/// and `store` (a polynomial as `regs` registers), the Montgomery product
/// `fqmul` with `qinv`, Barrett's `barrett`, the base-case `pair_product`
/// and the butterflies `ct` (forward) and `gs` (inverse), compiled with `features` from that
/// width's intrinsics. Each does lane by lane what `poly` does to one
/// coefficient (the kernels' tests hold them to it).
macro_rules! lane_arithmetic {
    (features: $f:literal, register: $V:ty, lanes: $lanes:literal, regs: $regs:literal,
     loadu: $loadu:ident, storeu: $storeu:ident, set1: $set1:ident, add: $add:ident, sub: $sub:ident,
     mulhi: $mulhi:ident, mullo: $mullo:ident, srai: $srai:ident) => {
        type V = $V;

        #[inline]
        #[target_feature(enable = $f)]
        fn vec(x: &[i16; $lanes]) -> V {
            // SAFETY: `x` is one register's bytes; the load is unaligned.
            unsafe { $loadu(x.as_ptr().cast()) }
        }

        /// b·ζ·R⁻¹ mod q per lane, with ζ·q⁻¹ mod 2^16 given (`zq`).
        #[inline]
        #[target_feature(enable = $f)]
        fn fqmul(b: V, z: V, zq: V) -> V {
            let hi = $mulhi(b, z);
            let t = $mulhi($mullo(b, zq), $set1(Q));
            $sub(hi, t)
        }

        /// ζ·q⁻¹ mod 2^16 per lane.
        #[inline]
        #[target_feature(enable = $f)]
        fn qinv(z: V) -> V {
            $mullo(z, $set1(QINV))
        }

        #[inline]
        #[target_feature(enable = $f)]
        fn barrett(a: V) -> V {
            let t = $mulhi(a, $set1(BARRETT_V));
            let t = $srai::<10>($add(t, $set1(512)));
            $sub(a, $mullo(t, $set1(Q)))
        }

        #[inline]
        #[target_feature(enable = $f)]
        fn load(p: &Poly) -> [V; $regs] {
            // SAFETY: each load reads one register inside the 512-byte array.
            core::array::from_fn(|i| unsafe { $loadu(p.0.as_ptr().add($lanes * i).cast()) })
        }

        #[inline]
        #[target_feature(enable = $f)]
        fn store(p: &mut Poly, v: [V; $regs]) {
            for (i, x) in v.into_iter().enumerate() {
                // SAFETY: each store writes one register inside the 512-byte array.
                unsafe { $storeu(p.0.as_mut_ptr().add($lanes * i).cast(), x) };
            }
        }

        /// Forward butterfly: (a, b) ← (a + ζb, a − ζb).
        #[inline]
        #[target_feature(enable = $f)]
        fn ct(a: V, b: V, z: V) -> (V, V) {
            let t = fqmul(b, z, qinv(z));
            ($add(a, t), $sub(a, t))
        }

        /// Algorithm 11's base-case product of pairs, lane by lane, times
        /// R⁻¹: (a₀ + a₁X)(b₀ + b₁X) mod X² − ζ = (a₀b₀ + a₁b₁ζ, a₀b₁ + a₁b₀),
        /// with ζ·q⁻¹ mod 2^16 given (`zq`).
        #[inline]
        #[target_feature(enable = $f)]
        fn pair_product(a0: V, a1: V, b0: V, b1: V, z: V, zq: V) -> (V, V) {
            let (b0q, b1q) = (qinv(b0), qinv(b1));
            ($add(fqmul(fqmul(a1, b1, b1q), z, zq), fqmul(a0, b0, b0q)), $add(fqmul(a0, b1, b1q), fqmul(a1, b0, b0q)))
        }

        /// Inverse butterfly: (a, b) ← (barrett(a + b), ζ(b − a)).
        #[inline]
        #[target_feature(enable = $f)]
        fn gs(a: V, b: V, z: V) -> (V, V) {
            let sum = barrett($add(a, b));
            (sum, fqmul($sub(b, a), z, qinv(z)))
        }
    };
}

/// A kernel module's safe entry points, for the proof type `$proof` that
/// its CPU check passed: `decode12`, `sample` and `encrypt` (with
/// [`poly::encrypt`] compiled under `$features`), and its transforms (and
/// its base-case products, if it has a `dot` of its own) as a
/// [`poly::Transform`], over the module's `decode12_kernel`, `sample_ntt`,
/// `ntt` and `inv_ntt`.
macro_rules! entry_points {
    (proof: $proof:ident, features: $f:literal $(, dot: $dot:ident)?) => {
        /// ByteDecode₁₂ (with the modulus check) from code without the target features.
        pub(crate) fn decode12(_: $proof, bytes: &[u8; 384]) -> Option<Poly> {
            // SAFETY: the proof exists only where its CPU check held.
            unsafe { decode12_kernel(bytes) }
        }

        /// SampleNTT from code without the target features.
        pub(crate) fn sample(_: $proof, stream: &[u8], out: &mut Poly) -> usize {
            // SAFETY: as above.
            unsafe { sample_ntt(stream, out) }
        }

        /// K-PKE.Encrypt into `out` ([`poly::encrypt`] on these transforms).
        pub(crate) fn encrypt(
            x: $proof,
            t: &[Poly; K],
            matrix: &[Poly],
            m: &[u8; 32],
            coins: &[[u8; 128]],
            out: &mut [u8; 1088],
        ) {
            /// The rest of K-PKE.Encrypt's arithmetic vectorized by the compiler.
            #[target_feature(enable = $f)]
            fn kernel(
                x: $proof,
                t: &[Poly; K],
                matrix: &[Poly],
                m: &[u8; 32],
                coins: &[[u8; 128]],
                out: &mut [u8; 1088],
            ) {
                poly::encrypt(x, t, matrix, m, coins, out);
            }
            // SAFETY: as above.
            unsafe { kernel(x, t, matrix, m, coins, out) }
        }

        impl poly::Transform for $proof {
            #[inline(always)]
            fn ntt(self, p: &mut Poly) {
                // SAFETY: as above.
                unsafe { ntt(p) }
            }

            #[inline(always)]
            fn inv_ntt(self, p: &mut Poly) {
                // SAFETY: as above.
                unsafe { inv_ntt(p) }
            }

            $(
            #[inline(always)]
            fn dot(self, a: [&Poly; K], b: &[Poly; K]) -> Poly {
                // SAFETY: as above.
                unsafe { $dot(a, b) }
            }
            )?
        }
    };
}

mod avx2;
mod keccak;
mod poly;
mod simd;
#[cfg(test)]
mod tests;

use zeroize::Zeroizing;

use keccak::{SHA3_256, SHA3_512, SHAKE128, SHAKE256};
use poly::{K, N, Poly};

/// The encapsulation key: three polynomials of 384 bytes and a 32-byte seed.
pub const PUBLIC_KEY_BYTES: usize = 1184;
/// The ciphertext: three polynomials compressed to 10 bits, one to 4.
pub const CIPHERTEXT_BYTES: usize = 1088;
pub const SECRET_BYTES: usize = 32;

const POLY_BYTES: usize = 384;
/// SHAKE128 output read at first per matrix entry: three blocks, which
/// give 256 values below q but for about one entry in a hundred.
const MATRIX_STREAM: usize = 3 * 168;

/// True when this CPU runs the kernels: AVX-512 F, BW, VBMI and VBMI2
/// (Zen 4 and later, Intel since Ice Lake), or else AVX2 (Zen 1 to 3,
/// Intel since Haswell, Skylake's AVX-512 without VBMI included).
pub fn available() -> bool {
    Cpu::detect().is_some()
}

/// The kernels this CPU runs: `"avx512"`, `"avx2"`, or `None`.
pub fn engine() -> Option<&'static str> {
    Cpu::detect().map(|cpu| match cpu {
        Cpu::Avx512(_) => "avx512",
        Cpu::Avx2(_) => "avx2",
    })
}

/// Proof that the CPU has the AVX-512 of [`available`].
#[derive(Clone, Copy)]
struct Avx512(());
/// Proof that the CPU has AVX2.
#[derive(Clone, Copy)]
struct Avx2(());

impl Avx512 {
    fn detect() -> Option<Self> {
        let all = std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vbmi")
            && std::is_x86_feature_detected!("avx512vbmi2");
        all.then_some(Avx512(()))
    }
}

impl Avx2 {
    fn detect() -> Option<Self> {
        std::is_x86_feature_detected!("avx2").then_some(Avx2(()))
    }
}

/// The kernels a batch runs, made once per batch: the proof each kernel's
/// safe wrapper takes to skip the CPU check. Only [`Cpu::detect`] (and
/// the proofs' own `detect`) make one.
#[derive(Clone, Copy)]
enum Cpu {
    Avx512(Avx512),
    Avx2(Avx2),
}

impl Cpu {
    fn detect() -> Option<Cpu> {
        Avx512::detect().map(Cpu::Avx512).or_else(|| Avx2::detect().map(Cpu::Avx2))
    }

    fn decode12(self, bytes: &[u8; POLY_BYTES]) -> Option<Poly> {
        match self {
            Cpu::Avx512(x) => simd::decode12(x, bytes),
            Cpu::Avx2(x) => avx2::decode12(x, bytes),
        }
    }

    fn sample(self, stream: &[u8], out: &mut Poly) -> usize {
        match self {
            Cpu::Avx512(x) => simd::sample(x, stream, out),
            Cpu::Avx2(x) => avx2::sample(x, stream, out),
        }
    }

    fn encrypt(self, t: &[Poly; K], matrix: &[Poly], m: &[u8; 32], coins: &[[u8; 128]], out: &mut [u8; 1088]) {
        match self {
            Cpu::Avx512(x) => simd::encrypt(x, t, matrix, m, coins, out),
            Cpu::Avx2(x) => avx2::encrypt(x, t, matrix, m, coins, out),
        }
    }
}

/// Whether `key` is an ML-KEM-768 encapsulation key: its length, and each
/// coefficient below q (the check that the key re-encodes to itself),
/// as [`encapsulate_batch`] checks each key.
#[cfg(test)]
fn check_public_key(key: &[u8]) -> bool {
    Cpu::detect().is_some_and(|cpu| decode_key(cpu, key).is_some())
}

/// One encapsulation of a batch.
pub struct EncapOp<'a> {
    /// The peer's encapsulation key.
    pub public_key: &'a [u8],
    /// 32 random bytes (FIPS 203's `m`), from a cryptographic generator.
    pub entropy: &'a [u8; 32],
    pub ciphertext: &'a mut [u8; CIPHERTEXT_BYTES],
    pub secret: &'a mut [u8; SECRET_BYTES],
}

/// The encapsulation key is not one: wrong length, or a coefficient not
/// below q (FIPS 203's modulus check).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InvalidKey;

/// A decoded key: t̂ and the matrix seed.
struct Key {
    t: [Poly; K],
    rho: [u8; 32],
}

/// The key decoded, if it is one (its length and the modulus check).
fn decode_key(cpu: Cpu, key: &[u8]) -> Option<Key> {
    let (polys, rho) = key.split_at_checked(K * POLY_BYTES)?;
    let mut t = [Poly::default(); K];
    for (p, bytes) in t.iter_mut().zip(polys.chunks_exact(POLY_BYTES)) {
        *p = cpu.decode12(bytes.try_into().ok()?)?;
    }
    Some(Key { t, rho: rho.try_into().ok()? })
}

/// Encapsulates to each op's key, any number at once. Panics on a CPU
/// without the AVX2 or AVX-512 of [`available`].
pub fn encapsulate_batch(ops: &mut [EncapOp<'_>]) -> Vec<Result<(), InvalidKey>> {
    let Some(cpu) = Cpu::detect() else { panic!("ML-KEM lanes called on a CPU without AVX2") };
    encapsulate_with(cpu, ops)
}

fn encapsulate_with(cpu: Cpu, ops: &mut [EncapOp<'_>]) -> Vec<Result<(), InvalidKey>> {
    let keys: Vec<Option<Key>> = ops.iter().map(|op| decode_key(cpu, op.public_key)).collect();
    // The ops with a key, and their keys.
    let live: Vec<(usize, &Key)> = keys.iter().enumerate().filter_map(|(i, k)| Some((i, k.as_ref()?))).collect();
    let n = live.len();

    // H(ek) and Â's entries (public; entry (i, j) of u_i's sum from
    // SHAKE128(ρ ‖ i ‖ j)) in one run: the long hashes of the keys first,
    // the matrix streams filling the other lanes meanwhile.
    let seeds: Vec<[u8; 34]> = live
        .iter()
        .flat_map(|&(_, key)| {
            (0..K * K).map(move |e| {
                let mut s = [0u8; 34];
                s[..32].copy_from_slice(&key.rho);
                s[32] = (e / K) as u8;
                s[33] = (e % K) as u8;
                s
            })
        })
        .collect();
    let mut streams = vec![[0u8; MATRIX_STREAM]; seeds.len()];
    let mut hashes = vec![[0u8; 32]; n];
    {
        let keys = live.iter().zip(hashes.iter_mut()).map(|(&(i, _), h)| keccak::Job {
            sponge: SHA3_256,
            input: ops[i].public_key,
            output: &mut h[..],
        });
        let matrix = seeds.iter().zip(streams.iter_mut()).map(|(seed, stream)| keccak::Job {
            sponge: SHAKE128,
            input: seed,
            output: &mut stream[..],
        });
        keccak::run(cpu, &mut keys.chain(matrix).collect::<Vec<_>>());
    }
    let mut matrix = vec![Poly::default(); seeds.len()];
    for ((entry, stream), seed) in matrix.iter_mut().zip(&streams).zip(&seeds) {
        if cpu.sample(stream, entry) < N {
            sample_long(cpu, seed, entry);
        }
    }

    // (K, r) = G(m ‖ H(ek)).
    let mut g_in = Zeroizing::new(vec![[0u8; 64]; n]);
    for ((g, h), &(i, _)) in g_in.iter_mut().zip(&hashes).zip(&live) {
        g[..32].copy_from_slice(ops[i].entropy);
        g[32..].copy_from_slice(h);
    }
    let mut g_out = Zeroizing::new(vec![[0u8; 64]; n]);
    hash(cpu, SHA3_512, &g_in, &mut g_out);

    // The noise: r (3), e₁ (3), e₂ from SHAKE256(r ‖ N), N = 0..7.
    let prf_in: Zeroizing<Vec<[u8; 33]>> = Zeroizing::new(
        g_out
            .iter()
            .flat_map(|g| {
                (0..2 * K + 1).map(move |nonce| {
                    let mut s = [0u8; 33];
                    s[..32].copy_from_slice(&g[32..]);
                    s[32] = nonce as u8;
                    s
                })
            })
            .collect(),
    );
    let mut noise = Zeroizing::new(vec![[0u8; 128]; prf_in.len()]);
    hash(cpu, SHAKE256, &prf_in, &mut noise);

    for (slot, &(i, key)) in live.iter().enumerate() {
        let op = &mut ops[i];
        let coins = &noise[slot * (2 * K + 1)..(slot + 1) * (2 * K + 1)];
        cpu.encrypt(&key.t, &matrix[slot * K * K..(slot + 1) * K * K], op.entropy, coins, op.ciphertext);
        op.secret.copy_from_slice(&g_out[slot][..32]);
    }
    keys.iter().map(|k| if k.is_some() { Ok(()) } else { Err(InvalidKey) }).collect()
}

/// The same sponge over equal-length inputs into equal-length outputs.
fn hash<const I: usize, const O: usize>(cpu: Cpu, s: keccak::Sponge, inputs: &[[u8; I]], outputs: &mut [[u8; O]]) {
    let ins: Vec<&[u8]> = inputs.iter().map(|x| &x[..]).collect();
    let mut outs: Vec<&mut [u8]> = outputs.iter_mut().map(|x| &mut x[..]).collect();
    s.hash_many(cpu, &ins, &mut outs);
}

/// A matrix entry whose first blocks held too few values below q: read
/// the stream further (public data, so the extra time tells nothing).
fn sample_long(cpu: Cpu, seed: &[u8; 34], entry: &mut Poly) {
    let mut len = MATRIX_STREAM;
    loop {
        len += 2 * 168;
        let mut stream = vec![0u8; len];
        SHAKE128.hash_many(cpu, &[seed], &mut [&mut stream[..]]);
        if cpu.sample(&stream, entry) == N {
            return;
        }
    }
}
