//! RSA private keys prepared for the multi-buffer engine: the key classes,
//! the components as libraries hand them out, and the Montgomery constants
//! each key needs. The batch call that runs them is in `batch`.

use std::fmt;

use zeroize::Zeroize;

use crate::bn::{LIMB_BITS, bit_len, limbs_from_be, mont_k0, mont_rr, words_from_be};

/// The modulus sizes the engine handles. One batch holds keys of one class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyClass {
    Rsa2048,
    Rsa3072,
    Rsa4096,
}

impl KeyClass {
    /// Every class, in [`KeyClass::index`] order.
    pub const ALL: [KeyClass; 3] = [Self::Rsa2048, Self::Rsa3072, Self::Rsa4096];

    /// This class's place in [`KeyClass::ALL`]: what per-class queues and
    /// counters are indexed by.
    pub fn index(self) -> usize {
        match self {
            Self::Rsa2048 => 0,
            Self::Rsa3072 => 1,
            Self::Rsa4096 => 2,
        }
    }

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

/// An RSA private key ready for [`crate::private_batch`].
pub struct RsaKey {
    class: KeyClass,
    /// Modulus length in bytes: the length of every input and output.
    size: usize,
    /// The modulus, big-endian without leading zeros (`size` bytes).
    pub(crate) n_be: Vec<u8>,
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

/// A big-endian number without its leading zero bytes.
fn strip_zeros(x: &[u8]) -> &[u8] {
    let first = x.iter().position(|&b| b != 0).unwrap_or(x.len());
    &x[first..]
}
