//! Asynchronous TLS private-key operations.
//!
//! A [`Provider`] signs and decrypts with one private key. Two engines exist:
//! `boring` computes each operation at once inside the handshake; `mb` pads the
//! message, queues the raw RSA operation in the worker's [`batcher`] and lets
//! the handshake resume when the eight-lane AVX-512 IFMA engine (`mbx`) has
//! computed its batch. [`KeyMethod`] plugs a provider into BoringSSL through
//! `AsyncPrivateKeyMethod`. Every RSA result is checked with the public key
//! before it is used, on both paths.

pub mod batcher;
pub mod padding;
pub mod share;
pub mod stats;

use std::fmt;
use std::sync::Arc;

use boring::bn::BigNum;
use boring::ec::EcKey;
use boring::ecdsa::EcdsaSig;
use boring::nid::Nid;
use boring::pkey::{PKey, Private};
use boring::rsa::{Padding, Rsa};
use boring::ssl::{
    AsyncPrivateKeyMethod, AsyncPrivateKeyMethodError, BoxPrivateKeyMethodFuture, SslRef, SslSignatureAlgorithm,
};
use gatehouse_config::KeyProvider;
use gatehouse_mbx as mbx;
use zeroize::Zeroize;

pub use padding::Hash;

/// Why a private-key operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// The signature scheme does not fit this key.
    Algorithm(String),
    /// The key is too small for the encoding.
    KeyTooSmall,
    /// BoringSSL reported an error in the named step.
    Crypto(&'static str),
    /// The multi-buffer engine refused the operation.
    Engine(mbx::OpError),
    /// The result failed the public-key check and was discarded.
    Fault,
    /// The worker dropped the operation (shutting down).
    Dropped,
    /// The client's X25519 point has small order (the shared secret is zero).
    LowOrder,
    /// The client's key share is not of the group's length or form.
    PeerShare,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Algorithm(a) => write!(f, "signature algorithm {a} does not fit the key"),
            Error::KeyTooSmall => f.write_str("key too small for the encoding"),
            Error::Crypto(step) => write!(f, "BoringSSL failed in {step}"),
            Error::Engine(e) => write!(f, "multi-buffer engine: {e}"),
            Error::Fault => f.write_str("result failed the public-key check"),
            Error::Dropped => f.write_str("operation dropped"),
            Error::LowOrder => f.write_str("the client's X25519 point has small order"),
            Error::PeerShare => f.write_str("the client's key share is malformed"),
        }
    }
}

impl std::error::Error for Error {}

/// Why a private key cannot serve on the engine asked for. The config
/// check reports it against the certificate; the key is not used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("key_provider mb needs AVX-512 IFMA, which this CPU lacks: use auto or boring")]
    NoIfma,
    #[error("not an RSA key")]
    NotRsa,
    #[error("not an ECDSA P-256 key: the multi-buffer engine signs with P-256 only")]
    NotEcdsaP256,
    #[error("the key has no {0}: the multi-buffer engine needs the CRT parameters")]
    MissingPart(&'static str),
    #[error("the multi-buffer engine cannot take this key: {0}")]
    Engine(#[from] mbx::KeyError),
    #[error("the key's self-test could not make its test message: {0}")]
    TestMessage(boring::error::ErrorStack),
    #[error("the key's self-test failed on {engine}: {error}")]
    SelfTest { engine: &'static str, error: Error },
    #[error("the key's self-test on mb gave another result than BoringSSL")]
    SelfTestMismatch,
}

/// The engine that runs a key's RSA operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Boring,
    Mb,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Boring => "boring",
            Engine::Mb => "mb",
        }
    }
}

/// Resolves a configured provider on this CPU: `auto` takes `mb` when the CPU
/// has AVX-512 IFMA; an explicit `mb` without it is an error.
pub fn resolve(choice: KeyProvider) -> Result<Engine, KeyError> {
    let ifma = mbx::available();
    match choice {
        KeyProvider::Boring => Ok(Engine::Boring),
        KeyProvider::Mb if ifma => Ok(Engine::Mb),
        KeyProvider::Mb => Err(KeyError::NoIfma),
        KeyProvider::Auto if ifma => Ok(Engine::Mb),
        KeyProvider::Auto => Ok(Engine::Boring),
    }
}

/// Where the TLS 1.3 key shares of a certificate's handshakes are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shares {
    /// X25519 and X25519MLKEM768 in the worker's IFMA lanes, batched
    /// ([`share::start`]): the provider resolved to `mb`.
    Lanes,
    /// X25519MLKEM768 at once, its ML-KEM-768 half in this CPU's vector
    /// kernels (`mbx::mlkem`: AVX2 on a CPU without AVX-512) and its X25519
    /// half in BoringSSL ([`share::compute_now`]); other groups in
    /// BoringSSL: `auto` on a CPU without IFMA.
    Kem,
    /// Every share in BoringSSL's handshake: `boring`, or a CPU without AVX2.
    Boring,
}

impl Shares {
    /// Where shares go for a provider `choice` that resolved to `engine`.
    pub fn place(choice: KeyProvider, engine: Engine) -> Shares {
        match (engine, choice) {
            (Engine::Mb, _) => Shares::Lanes,
            (Engine::Boring, KeyProvider::Auto) if mbx::mlkem::available() => Shares::Kem,
            (Engine::Boring, _) => Shares::Boring,
        }
    }

    /// The vector kernels of [`Shares::Kem`] on this CPU: `"avx2"` or
    /// `"avx512"` (`"-"`: none).
    pub fn kernels() -> &'static str {
        mbx::mlkem::engine().unwrap_or("-")
    }

    /// The `engine` label of `gatehouse_tls_key_shares_total` for a share
    /// made here and taken by BoringSSL ([`Shares::Boring`]: one it made).
    pub fn name(self) -> &'static str {
        match self {
            Shares::Lanes => "mb",
            Shares::Kem => "simd",
            Shares::Boring => "boring",
        }
    }
}

/// A TLS signature scheme for an RSA key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RsaScheme {
    Pkcs1(Hash),
    Pss(Hash),
}

impl RsaScheme {
    pub fn from_tls(alg: SslSignatureAlgorithm) -> Option<Self> {
        Some(match alg {
            SslSignatureAlgorithm::RSA_PKCS1_SHA1 => RsaScheme::Pkcs1(Hash::Sha1),
            SslSignatureAlgorithm::RSA_PKCS1_SHA256 => RsaScheme::Pkcs1(Hash::Sha256),
            SslSignatureAlgorithm::RSA_PKCS1_SHA384 => RsaScheme::Pkcs1(Hash::Sha384),
            SslSignatureAlgorithm::RSA_PKCS1_SHA512 => RsaScheme::Pkcs1(Hash::Sha512),
            SslSignatureAlgorithm::RSA_PSS_RSAE_SHA256 => RsaScheme::Pss(Hash::Sha256),
            SslSignatureAlgorithm::RSA_PSS_RSAE_SHA384 => RsaScheme::Pss(Hash::Sha384),
            SslSignatureAlgorithm::RSA_PSS_RSAE_SHA512 => RsaScheme::Pss(Hash::Sha512),
            _ => return None,
        })
    }
}

/// An RSA private key with, when the engine supports it, its multi-buffer form.
pub struct RsaKey {
    rsa: Rsa<Private>,
    mb: Option<mbx::RsaKey>,
    bits: usize,
}

impl RsaKey {
    /// Prepares `pkey` (which must be RSA) for `engine`. With `mb`, a key the
    /// engine cannot take (exponent other than 65537, size other than 2048,
    /// 3072 or 4096) stays on BoringSSL, and the returned note says why.
    pub fn new(pkey: &PKey<Private>, engine: Engine) -> Result<(Self, Option<String>), KeyError> {
        let rsa = pkey.rsa().map_err(|_| KeyError::NotRsa)?;
        let bits = rsa.n().num_bits() as usize;
        let mut note = None;
        let mb = match engine {
            Engine::Boring => None,
            Engine::Mb => match mb_form(&rsa) {
                Ok(k) => Some(k),
                Err(e) => {
                    note = Some(format!("{e}: this key's operations stay on boring"));
                    None
                }
            },
        };
        let key = RsaKey { rsa, mb, bits };
        // A self-test through the chosen path before the key serves anyone.
        key.self_test()?;
        Ok((key, note))
    }

    pub fn engine(&self) -> Engine {
        if self.mb.is_some() { Engine::Mb } else { Engine::Boring }
    }

    /// Modulus length in bytes.
    pub fn size(&self) -> usize {
        self.bits.div_ceil(8)
    }

    pub fn bits(&self) -> usize {
        self.bits
    }

    pub(crate) fn mb_class(&self) -> Option<mbx::KeyClass> {
        self.mb.as_ref().map(mbx::RsaKey::class)
    }

    /// The key in the IFMA engine's form (radix 2^52, CRT), when the engine
    /// can take it: what a batch of lanes signs with.
    pub fn mb_key(&self) -> Option<&mbx::RsaKey> {
        self.mb.as_ref()
    }

    /// The encoded block for a signature with `scheme` over `msg`.
    pub fn encode(&self, scheme: RsaScheme, msg: &[u8]) -> Result<Vec<u8>, Error> {
        match scheme {
            RsaScheme::Pkcs1(h) => padding::pkcs1(h, msg, self.size()),
            RsaScheme::Pss(h) => {
                let mut salt = vec![0u8; h.output_len()];
                boring::rand::rand_bytes(&mut salt).map_err(|_| Error::Crypto("rand"))?;
                padding::pss(h, msg, self.bits, self.size(), &salt)
            }
        }
    }

    /// input^d mod n in BoringSSL, checked with the public key.
    pub fn private_single(&self, input: &[u8]) -> Result<Vec<u8>, Error> {
        let mut out = vec![0u8; self.size()];
        let len = self
            .rsa
            .private_decrypt(input, &mut out, Padding::NONE)
            .map_err(|_| Error::Crypto("RSA private operation"))?;
        out.truncate(len);
        if !self.public_check(&out, input) {
            out.zeroize();
            return Err(Error::Fault);
        }
        Ok(out)
    }

    fn public_check(&self, result: &[u8], input: &[u8]) -> bool {
        let mut back = vec![0u8; self.size()];
        match self.rsa.public_encrypt(result, &mut back, Padding::NONE) {
            Ok(len) => back[..len] == *input,
            Err(_) => false,
        }
    }

    fn self_test(&self) -> Result<(), KeyError> {
        let mut msg = [0u8; 32];
        boring::rand::rand_bytes(&mut msg).map_err(KeyError::TestMessage)?;
        let on_boring = |error| KeyError::SelfTest { engine: "boring", error };
        let em = self.encode(RsaScheme::Pkcs1(Hash::Sha256), &msg).map_err(on_boring)?;
        let single = self.private_single(&em).map_err(on_boring)?;
        if let Some(k) = &self.mb {
            let mut out = vec![0u8; self.size()];
            let r = mbx::private_batch(&mut [mbx::Op { key: k, input: &em, output: &mut out }]);
            match r.first() {
                Some(Ok(())) if out == single => {}
                Some(Err(e)) => return Err(KeyError::SelfTest { engine: "mb", error: Error::Engine(*e) }),
                _ => return Err(KeyError::SelfTestMismatch),
            }
        }
        Ok(())
    }
}

fn mb_form(rsa: &Rsa<Private>) -> Result<mbx::RsaKey, KeyError> {
    let part = |b: Option<&boring::bn::BigNumRef>, name: &'static str| {
        b.map(|b| b.to_vec()).ok_or(KeyError::MissingPart(name))
    };
    let (n, e) = (rsa.n().to_vec(), rsa.e().to_vec());
    let mut p = part(rsa.p(), "p")?;
    let mut q = part(rsa.q(), "q")?;
    let mut dp = part(rsa.dmp1(), "dmp1")?;
    let mut dq = part(rsa.dmq1(), "dmq1")?;
    let mut qinv = part(rsa.iqmp(), "iqmp")?;
    let key = mbx::RsaKey::new(&mbx::Components { n: &n, e: &e, p: &p, q: &q, dp: &dp, dq: &dq, qinv: &qinv });
    for secret in [&mut p, &mut q, &mut dp, &mut dq, &mut qinv] {
        secret.zeroize();
    }
    Ok(key?)
}

/// A finished or queued private-key operation.
pub enum KeyOp {
    Ready(Result<Vec<u8>, Error>),
    Queued(tokio::sync::oneshot::Receiver<Result<Vec<u8>, Error>>),
}

impl KeyOp {
    pub async fn wait(self) -> Result<Vec<u8>, Error> {
        match self {
            KeyOp::Ready(r) => r,
            KeyOp::Queued(rx) => rx.await.unwrap_or(Err(Error::Dropped)),
        }
    }
}

/// Private-key operations for TLS: signatures over a handshake transcript and
/// TLS 1.2 RSA key-exchange decryption (raw: BoringSSL removes the padding, in
/// constant time).
pub trait Provider: Send + Sync + 'static {
    fn engine(&self) -> Engine;
    fn sign(&self, alg: SslSignatureAlgorithm, msg: &[u8]) -> KeyOp;
    fn decrypt(&self, ciphertext: &[u8]) -> KeyOp;
}

/// RSA through either engine: the `mb` form queues in the worker's batcher.
pub struct RsaProvider {
    key: Arc<RsaKey>,
}

impl RsaProvider {
    pub fn new(key: RsaKey) -> Self {
        RsaProvider { key: Arc::new(key) }
    }

    fn private(&self, block: Vec<u8>) -> KeyOp {
        match self.key.mb_class() {
            Some(class) => KeyOp::Queued(batcher::submit(class, self.key.clone(), block)),
            None => KeyOp::Ready(self.key.private_single(&block)),
        }
    }
}

impl Provider for RsaProvider {
    fn engine(&self) -> Engine {
        self.key.engine()
    }

    fn sign(&self, alg: SslSignatureAlgorithm, msg: &[u8]) -> KeyOp {
        let Some(scheme) = RsaScheme::from_tls(alg) else {
            return KeyOp::Ready(Err(Error::Algorithm(format!("{alg:?}"))));
        };
        match self.key.encode(scheme, msg) {
            Ok(block) => self.private(block),
            Err(e) => KeyOp::Ready(Err(e)),
        }
    }

    fn decrypt(&self, ciphertext: &[u8]) -> KeyOp {
        if ciphertext.len() != self.key.size() {
            return KeyOp::Ready(Err(Error::Crypto("ciphertext length")));
        }
        self.private(ciphertext.to_vec())
    }
}

/// An ECDSA P-256 private key, with its lane form when the engine is `mb`.
pub struct EcdsaKey {
    ec: EcKey<Private>,
    lanes: Option<mbx::p256::P256Key>,
}

impl EcdsaKey {
    /// Prepares `pkey` (which must be a P-256 key) for `engine`, with a
    /// self-test: a signature through the chosen path verified by BoringSSL.
    pub fn new(pkey: &PKey<Private>, engine: Engine) -> Result<Self, KeyError> {
        let ec = pkey.ec_key().map_err(|_| KeyError::NotEcdsaP256)?;
        if ec.group().curve_name() != Some(Nid::X9_62_PRIME256V1) {
            return Err(KeyError::NotEcdsaP256);
        }
        let lanes = match engine {
            Engine::Boring => None,
            Engine::Mb => {
                let mut d = ec.private_key().to_vec_padded(32).map_err(|_| KeyError::NotEcdsaP256)?;
                let key = <&[u8; 32]>::try_from(&d[..]).ok().and_then(|d| mbx::p256::P256Key::new(d).ok());
                d.zeroize();
                Some(key.ok_or(KeyError::NotEcdsaP256)?)
            }
        };
        let key = EcdsaKey { ec, lanes };
        key.self_test()?;
        Ok(key)
    }

    pub fn engine(&self) -> Engine {
        if self.lanes.is_some() { Engine::Mb } else { Engine::Boring }
    }

    /// One signature in BoringSSL, DER-encoded.
    pub fn sign_single(&self, digest: &[u8; 32]) -> Result<Vec<u8>, Error> {
        EcdsaSig::sign(digest, &self.ec).and_then(|s| s.to_der()).map_err(|_| Error::Crypto("ECDSA sign"))
    }

    fn verify(&self, digest: &[u8; 32], der: &[u8]) -> bool {
        EcdsaSig::from_der(der).and_then(|s| s.verify(digest, &self.ec)).unwrap_or(false)
    }

    fn self_test(&self) -> Result<(), KeyError> {
        let mut digest = [0u8; 32];
        boring::rand::rand_bytes(&mut digest).map_err(KeyError::TestMessage)?;
        let single = self.sign_single(&digest).map_err(|error| KeyError::SelfTest { engine: "boring", error })?;
        if !self.verify(&digest, &single) {
            return Err(KeyError::SelfTest { engine: "boring", error: Error::Fault });
        }
        if let Some(k) = &self.lanes {
            let mut out = [0u8; 64];
            let r = mbx::p256::sign_batch(&mut [mbx::p256::SignOp { key: k, digest: &digest, out: &mut out }]);
            let der = match r[0] {
                Ok(()) => ecdsa_der(&out).map_err(|error| KeyError::SelfTest { engine: "mb", error })?,
                Err(_) => return Err(KeyError::SelfTest { engine: "mb", error: Error::Fault }),
            };
            if !self.verify(&digest, &der) {
                return Err(KeyError::SelfTestMismatch);
            }
        }
        Ok(())
    }
}

/// r ‖ s (32 bytes each) as the DER `ECDSA-Sig-Value` TLS carries.
pub(crate) fn ecdsa_der(rs: &[u8; 64]) -> Result<Vec<u8>, Error> {
    let bn = |b: &[u8]| BigNum::from_slice(b);
    let sig = bn(&rs[..32]).and_then(|r| Ok((r, bn(&rs[32..])?)));
    sig.and_then(|(r, s)| EcdsaSig::from_private_components(r, s)?.to_der())
        .map_err(|_| Error::Crypto("ECDSA encoding"))
}

/// ECDSA P-256 through either engine: on `mb` the message's SHA-256 is
/// signed at once from a presignature the worker's batcher made ahead.
pub struct EcdsaProvider {
    key: Arc<EcdsaKey>,
}

impl EcdsaProvider {
    pub fn new(key: EcdsaKey) -> Self {
        EcdsaProvider { key: Arc::new(key) }
    }
}

impl Provider for EcdsaProvider {
    fn engine(&self) -> Engine {
        self.key.engine()
    }

    fn sign(&self, alg: SslSignatureAlgorithm, msg: &[u8]) -> KeyOp {
        if alg != SslSignatureAlgorithm::ECDSA_SECP256R1_SHA256 {
            return KeyOp::Ready(Err(Error::Algorithm(format!("{alg:?}"))));
        }
        let digest = boring::sha::sha256(msg);
        match &self.key.lanes {
            Some(lanes) => KeyOp::Ready(batcher::sign(lanes, &digest)),
            None => KeyOp::Ready(self.key.sign_single(&digest)),
        }
    }

    fn decrypt(&self, _ciphertext: &[u8]) -> KeyOp {
        KeyOp::Ready(Err(Error::Crypto("ECDSA keys cannot decrypt")))
    }
}

/// A provider as BoringSSL's asynchronous private-key method.
pub struct KeyMethod {
    provider: Arc<dyn Provider>,
}

impl KeyMethod {
    pub fn new(provider: Arc<dyn Provider>) -> Self {
        KeyMethod { provider }
    }
}

fn finish(op: KeyOp) -> BoxPrivateKeyMethodFuture {
    Box::pin(async move {
        let result = op.wait().await;
        let finish: boring::ssl::BoxPrivateKeyMethodFinish = Box::new(move |_ssl: &mut SslRef, out: &mut [u8]| {
            let mut bytes = result.map_err(|e| {
                tracing::debug!(error = %e, "private-key operation failed");
                AsyncPrivateKeyMethodError
            })?;
            let len = bytes.len();
            let slot = out.get_mut(..len).ok_or(AsyncPrivateKeyMethodError)?;
            slot.copy_from_slice(&bytes);
            bytes.zeroize();
            Ok(len)
        });
        Ok(finish)
    })
}

impl AsyncPrivateKeyMethod for KeyMethod {
    fn sign(
        &self,
        _ssl: &mut SslRef,
        input: &[u8],
        alg: SslSignatureAlgorithm,
        _output: &mut [u8],
    ) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        Ok(finish(self.provider.sign(alg, input)))
    }

    fn decrypt(
        &self,
        _ssl: &mut SslRef,
        input: &[u8],
        _output: &mut [u8],
    ) -> Result<BoxPrivateKeyMethodFuture, AsyncPrivateKeyMethodError> {
        Ok(finish(self.provider.decrypt(input)))
    }
}

#[cfg(test)]
mod tests;
