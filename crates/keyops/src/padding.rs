//! RSA signature encodings (RFC 8017): EMSA-PKCS1-v1_5 and EMSA-PSS with MGF1.
//! The result is the block the raw private operation exponentiates.

use boring::hash::{MessageDigest, hash};

use crate::Error;

/// The hash of a TLS signature scheme, with its DigestInfo prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha1,
    Sha256,
    Sha384,
    Sha512,
}

impl Hash {
    pub fn digest(self) -> MessageDigest {
        match self {
            Hash::Sha1 => MessageDigest::sha1(),
            Hash::Sha256 => MessageDigest::sha256(),
            Hash::Sha384 => MessageDigest::sha384(),
            Hash::Sha512 => MessageDigest::sha512(),
        }
    }

    pub fn output_len(self) -> usize {
        match self {
            Hash::Sha1 => 20,
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// DER of DigestInfo up to the digest bytes (RFC 8017, section 9.2, note 1).
    fn digest_info_prefix(self) -> &'static [u8] {
        match self {
            Hash::Sha1 => &[0x30, 0x21, 0x30, 0x09, 0x06, 0x05, 0x2b, 0x0e, 0x03, 0x02, 0x1a, 0x05, 0x00, 0x04, 0x14],
            Hash::Sha256 => &[
                0x30, 0x31, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00,
                0x04, 0x20,
            ],
            Hash::Sha384 => &[
                0x30, 0x41, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x05, 0x00,
                0x04, 0x30,
            ],
            Hash::Sha512 => &[
                0x30, 0x51, 0x30, 0x0d, 0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x03, 0x05, 0x00,
                0x04, 0x40,
            ],
        }
    }

    fn of(self, data: &[u8]) -> Result<Vec<u8>, Error> {
        hash(self.digest(), data).map(|d| d.to_vec()).map_err(|_| Error::Crypto("hash"))
    }
}

/// EMSA-PKCS1-v1_5: `00 01 FF…FF 00 DigestInfo(H(msg))`, `k` bytes long.
pub fn pkcs1(hash: Hash, msg: &[u8], k: usize) -> Result<Vec<u8>, Error> {
    let prefix = hash.digest_info_prefix();
    let t_len = prefix.len() + hash.output_len();
    if k < t_len + 11 {
        return Err(Error::KeyTooSmall);
    }
    let mut em = vec![0xffu8; k];
    em[0] = 0;
    em[1] = 1;
    let t_start = k - t_len;
    em[t_start - 1] = 0;
    em[t_start..t_start + prefix.len()].copy_from_slice(prefix);
    em[t_start + prefix.len()..].copy_from_slice(&hash.of(msg)?);
    Ok(em)
}

/// EMSA-PSS with MGF1 over the same hash and a salt as long as the hash (what
/// TLS 1.3 requires), for a modulus of `mod_bits` bits; returns `k` bytes.
pub fn pss(hash: Hash, msg: &[u8], mod_bits: usize, k: usize, salt: &[u8]) -> Result<Vec<u8>, Error> {
    let h_len = hash.output_len();
    let em_bits = mod_bits - 1;
    let em_len = em_bits.div_ceil(8);
    if em_len < h_len + salt.len() + 2 || em_len > k {
        return Err(Error::KeyTooSmall);
    }
    let m_hash = hash.of(msg)?;
    let mut m_prime = vec![0u8; 8];
    m_prime.extend_from_slice(&m_hash);
    m_prime.extend_from_slice(salt);
    let h = hash.of(&m_prime)?;
    let db_len = em_len - h_len - 1;
    let mut db = vec![0u8; db_len];
    db[db_len - salt.len() - 1] = 0x01;
    db[db_len - salt.len()..].copy_from_slice(salt);
    let mask = mgf1(hash, &h, db_len)?;
    for (d, m) in db.iter_mut().zip(mask) {
        *d ^= m;
    }
    db[0] &= 0xffu8 >> (8 * em_len - em_bits);
    // The block is k bytes: a leading zero when em_len < k.
    let mut em = vec![0u8; k - em_len];
    em.extend_from_slice(&db);
    em.extend_from_slice(&h);
    em.push(0xbc);
    Ok(em)
}

fn mgf1(hash: Hash, seed: &[u8], len: usize) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(len + hash.output_len());
    let mut counter: u32 = 0;
    while out.len() < len {
        let mut input = seed.to_vec();
        input.extend_from_slice(&counter.to_be_bytes());
        out.extend_from_slice(&hash.of(&input)?);
        counter += 1;
    }
    out.truncate(len);
    Ok(out)
}
