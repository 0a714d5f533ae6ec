//! RSA private keys prepared for the multi-buffer engine, and the batch call.

use std::fmt;

use zeroize::Zeroize;

use crate::bn::{LIMB_BITS, bit_len, limbs_from_be, mont_k0, mont_rr, words_from_be};
use crate::engine::{self, Fault};
use crate::ifma::LANES;

/// Operations in one batch, one per 64-bit lane of a 512-bit register.
pub const BATCH: usize = LANES;

/// The modulus sizes the engine handles. One batch holds keys of one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyClass {
    Rsa2048,
    Rsa3072,
    Rsa4096,
}

impl KeyClass {
    fn from_bits(bits: usize) -> Option<Self> {
        match bits {
            2048 => Some(Self::Rsa2048),
            3072 => Some(Self::Rsa3072),
            4096 => Some(Self::Rsa4096),
            _ => None,
        }
    }

    /// Modulus size in bits.
    pub fn bits(self) -> usize {
        match self {
            Self::Rsa2048 => 2048,
            Self::Rsa3072 => 3072,
            Self::Rsa4096 => 4096,
        }
    }

    /// 52-bit limbs per prime: the smallest count with 4·p < 2^(52·limbs).
    pub(crate) fn prime_limbs(self) -> usize {
        match self {
            Self::Rsa2048 => 20,
            Self::Rsa3072 => 30,
            Self::Rsa4096 => 40,
        }
    }

    /// 52-bit limbs for the modulus and the input/output values.
    pub(crate) fn modulus_limbs(self) -> usize {
        2 * self.prime_limbs()
    }
}

/// The big-endian components of an RSA private key, as BoringSSL and OpenSSL
/// hand them out (`n`, `e`, `p`, `q`, `dmp1`, `dmq1`, `iqmp`).
pub struct Components<'a> {
    pub n: &'a [u8],
    pub e: &'a [u8],
    pub p: &'a [u8],
    pub q: &'a [u8],
    pub dp: &'a [u8],
    pub dq: &'a [u8],
    pub qinv: &'a [u8],
}

/// Why a key cannot use the engine (the caller falls back to single operations).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyError {
    /// Only e = 65537 is supported (the public-key check is specialised for it).
    Exponent,
    /// The modulus is not 2048, 3072 or 4096 bits.
    Size(usize),
    /// A component is out of the range the arithmetic needs.
    Component(&'static str),
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exponent => f.write_str("public exponent is not 65537"),
            Self::Size(bits) => write!(f, "{bits}-bit modulus (2048, 3072 or 4096 supported)"),
            Self::Component(what) => write!(f, "key component {what} out of range"),
        }
    }
}

impl std::error::Error for KeyError {}

/// Why one operation of a batch failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpError {
    /// This CPU has no AVX-512 IFMA.
    Unsupported,
    /// The input is not as long as the modulus.
    InputLength { expected: usize, got: usize },
    /// The input, as a number, is not below the modulus.
    InputTooLarge,
    /// The output buffer is not as long as the modulus.
    OutputLength { expected: usize, got: usize },
    /// The key is of another class than the batch's first key.
    MixedBatch,
    /// More than [`BATCH`] operations were passed.
    BatchFull,
    /// The result failed the public-key check and was discarded.
    Fault,
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported => f.write_str("CPU has no AVX-512 IFMA"),
            Self::InputLength { expected, got } => {
                write!(f, "input is {got} bytes, the modulus {expected}")
            }
            Self::InputTooLarge => f.write_str("input is not below the modulus"),
            Self::OutputLength { expected, got } => {
                write!(f, "output buffer is {got} bytes, the modulus {expected}")
            }
            Self::MixedBatch => f.write_str("key size differs from the batch's"),
            Self::BatchFull => write!(f, "more than {BATCH} operations in one batch"),
            Self::Fault => f.write_str("result failed the public-key check"),
        }
    }
}

impl std::error::Error for OpError {}

/// One prime of a key with its Montgomery constants and CRT exponent.
pub(crate) struct Prime {
    /// The prime, 52-bit limbs.
    pub(crate) m: Vec<u64>,
    /// −m⁻¹ mod 2^52.
    pub(crate) k0: u64,
    /// R² mod m.
    pub(crate) rr: Vec<u64>,
    /// d mod (m − 1), 64-bit words.
    pub(crate) exp: Vec<u64>,
    /// Bit length of the prime (public).
    pub(crate) bits: usize,
}

impl Prime {
    fn new(m: &[u8], exp: &[u8], limbs: usize, name: &'static str) -> Result<Self, KeyError> {
        let bits = bit_len(m);
        // 4·m < R and an odd modulus are what the Montgomery arithmetic needs.
        if bits + 2 > LIMB_BITS * limbs || bits < 2 || m.last().is_none_or(|b| b & 1 == 0) {
            return Err(KeyError::Component(name));
        }
        if bit_len(exp) > bits {
            return Err(KeyError::Component(if name == "p" { "dp" } else { "dq" }));
        }
        let m = limbs_from_be(m, limbs).ok_or(KeyError::Component(name))?;
        Ok(Self { k0: mont_k0(m[0]), rr: mont_rr(&m), m, exp: words_from_be(exp), bits })
    }
}

impl Drop for Prime {
    fn drop(&mut self) {
        self.m.zeroize();
        self.k0.zeroize();
        self.rr.zeroize();
        self.exp.zeroize();
    }
}

/// An RSA private key ready for [`private_batch`].
pub struct RsaKey {
    class: KeyClass,
    /// Modulus length in bytes: the length of every input and output.
    size: usize,
    /// The modulus, big-endian without leading zeros (`size` bytes).
    n_be: Vec<u8>,
    /// The modulus, 52-bit limbs.
    pub(crate) n: Vec<u64>,
    pub(crate) n_k0: u64,
    pub(crate) n_rr: Vec<u64>,
    pub(crate) p: Prime,
    pub(crate) q: Prime,
    /// q⁻¹ mod p, 52-bit limbs.
    pub(crate) qinv: Vec<u64>,
}

impl RsaKey {
    /// Prepares a key: checks the exponent and sizes and computes the constants.
    pub fn new(c: &Components<'_>) -> Result<Self, KeyError> {
        if strip_zeros(c.e) != [1, 0, 1] {
            return Err(KeyError::Exponent);
        }
        let bits = bit_len(c.n);
        let class = KeyClass::from_bits(bits).ok_or(KeyError::Size(bits))?;
        let limbs = class.prime_limbs();
        if c.n.last().is_none_or(|b| b & 1 == 0) {
            return Err(KeyError::Component("n"));
        }
        let n = limbs_from_be(c.n, class.modulus_limbs()).ok_or(KeyError::Component("n"))?;
        let p = Prime::new(c.p, c.dp, limbs, "p")?;
        let q = Prime::new(c.q, c.dq, limbs, "q")?;
        if bit_len(c.qinv) > p.bits {
            return Err(KeyError::Component("qinv"));
        }
        let qinv = limbs_from_be(c.qinv, limbs).ok_or(KeyError::Component("qinv"))?;
        Ok(Self {
            class,
            size: bits / 8,
            n_be: strip_zeros(c.n).to_vec(),
            n_k0: mont_k0(n[0]),
            n_rr: mont_rr(&n),
            n,
            p,
            q,
            qinv,
        })
    }

    pub fn class(&self) -> KeyClass {
        self.class
    }

    /// Modulus length in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl Drop for RsaKey {
    fn drop(&mut self) {
        self.qinv.zeroize();
    }
}

impl fmt::Debug for RsaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RsaKey").field("class", &self.class).finish_non_exhaustive()
    }
}

/// One private-key operation: `output = input^d mod n`, both as long as the modulus.
pub struct Op<'a> {
    pub key: &'a RsaKey,
    pub input: &'a [u8],
    pub output: &'a mut [u8],
}

/// Runs up to [`BATCH`] raw RSA private operations at once (the caller pads for
/// signatures and unpads after decryption). Keys may differ but must share a
/// class. Result `i` belongs to `ops[i]`; a failed operation leaves its output
/// zeroed, and a result that fails the public-key check is never written.
pub fn private_batch(ops: &mut [Op<'_>]) -> Vec<Result<(), OpError>> {
    private_batch_with_fault(ops, None)
}

/// [`private_batch`] with a fault injected into one lane's result before the
/// public-key check, to test that the check catches it.
#[doc(hidden)]
pub fn private_batch_with_fault(ops: &mut [Op<'_>], fault: Option<Fault>) -> Vec<Result<(), OpError>> {
    let mut results: Vec<Result<(), OpError>> = Vec::with_capacity(ops.len());
    let Some(class) = ops.first().map(|op| op.key.class) else {
        return results;
    };
    let limbs = class.modulus_limbs();
    let supported = engine::available();
    let mut lanes: Vec<usize> = Vec::with_capacity(BATCH);
    let mut keys: Vec<&RsaKey> = Vec::with_capacity(BATCH);
    let mut inputs: Vec<Vec<u64>> = Vec::with_capacity(BATCH);
    let mut outputs: Vec<&mut [u8]> = Vec::with_capacity(BATCH);
    for (i, op) in ops.iter_mut().enumerate() {
        op.output.fill(0);
        let size = op.key.size;
        let checked = if !supported {
            Err(OpError::Unsupported)
        } else if i >= BATCH {
            Err(OpError::BatchFull)
        } else if op.key.class != class {
            Err(OpError::MixedBatch)
        } else if op.input.len() != size {
            Err(OpError::InputLength { expected: size, got: op.input.len() })
        } else if op.output.len() != size {
            Err(OpError::OutputLength { expected: size, got: op.output.len() })
        } else if op.input >= op.key.n_be.as_slice() {
            Err(OpError::InputTooLarge)
        } else {
            limbs_from_be(op.input, limbs).ok_or(OpError::InputTooLarge)
        };
        match checked {
            Ok(limbs) => {
                lanes.push(i);
                keys.push(op.key);
                inputs.push(limbs);
                outputs.push(&mut *op.output);
                results.push(Ok(()));
            }
            Err(e) => results.push(Err(e)),
        }
    }
    if lanes.is_empty() {
        return results;
    }
    let input_refs: Vec<&[u64]> = inputs.iter().map(Vec::as_slice).collect();
    let ok = engine::run(class, &keys, &input_refs, &mut outputs, fault);
    for (lane, &i) in lanes.iter().enumerate() {
        if ok & (1 << lane) == 0 {
            results[i] = Err(OpError::Fault);
        }
    }
    results
}

/// A big-endian number without its leading zero bytes.
fn strip_zeros(x: &[u8]) -> &[u8] {
    let first = x.iter().position(|&b| b != 0).unwrap_or(x.len());
    &x[first..]
}
