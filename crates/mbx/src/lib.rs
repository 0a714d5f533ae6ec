//! Multi-buffer crypto on AVX-512: RSA, eight private-key operations at
//! once, one per 64-bit lane, with radix 2^52 limbs and the IFMA
//! instructions (`vpmadd52luq`/`vpmadd52huq`); and ChaCha20 across sixteen
//! packets at once ([`chacha`]) and Poly1305 across eight ([`poly1305`]),
//! together the ChaCha20-Poly1305 AEAD as WireGuard uses it ([`aead`]);
//! X25519 and ECDSA P-256 in IFMA lanes ([`x25519`], [`p256`]); and
//! ML-KEM-768 encapsulation with SHA-3 in eight Keccak lanes ([`mlkem`]; on
//! CPUs without AVX-512, four lanes of AVX2).
//!
//! The private operation uses the CRT, fixed-window exponentiation with
//! constant-time table reads and almost Montgomery multiplication; every result
//! is checked with the public key (e = 65537) before it leaves, so a fault in
//! the computation never produces a wrong signature. Pure compute: no I/O, no
//! threads, no allocation on the arithmetic path.
//!
//! ```no_run
//! # fn demo(key: &gatehouse_mbx::RsaKey, msgs: &[Vec<u8>]) {
//! use gatehouse_mbx::{Op, private_batch};
//! let mut outs = vec![vec![0u8; key.size()]; msgs.len()];
//! let mut ops: Vec<Op> = msgs.iter().zip(outs.iter_mut())
//!     .map(|(m, o)| Op { key, input: m, output: o }).collect();
//! let results = private_batch(&mut ops);
//! # }
//! ```

#[cfg(not(target_arch = "x86_64"))]
compile_error!("gatehouse-mbx needs x86_64 (AVX-512 IFMA); other targets use the BoringSSL provider");

pub mod aead;
mod batch;
mod bn;
pub mod chacha;
mod engine;
mod ifma;
pub mod mlkem;
pub mod p256;
pub mod poly1305;
mod rsa;
pub mod x25519;

pub use batch::{BATCH, Op, OpError, private_batch, private_batch_with_fault};
pub use engine::{Fault, available};
pub use rsa::{Components, KeyClass, KeyError, RsaKey};

#[cfg(test)]
mod tests;
