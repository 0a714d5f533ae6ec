//! TLS 1.3 key shares computed ahead of BoringSSL, for its handshake hints.
//!
//! BoringSSL has no hook for the key exchange, but it takes *handshake
//! hints*: a server share (the "ciphertext") and the shared secret it
//! would have computed, used when the group it picks is the hint's
//! (`ssl/tls13_server.cc`, `resolve_ecdhe_secret`). Before the handshake
//! runs, the certificate-selection callback reads the ClientHello, predicts
//! the group as BoringSSL will pick it ([`predict`]), and [`start`]s the
//! share: X25519 in the worker's lanes, and for X25519MLKEM768 the X25519
//! half in lanes and the ML-KEM-768 encapsulation in the same batch's
//! Keccak lanes (`mbx::mlkem`; in BoringSSL on a CPU without the AVX-512
//! they need). A hint that does not apply costs its computation, never a
//! handshake.
//!
//! TLS 1.2 has no key share to hint, but BoringSSL takes the server's
//! ECDHE key pair as a hint (`ssl/handshake_server.cc`, the
//! ServerKeyExchange): for X25519, one made ahead in the worker's lanes
//! ([`ecdhe`]). The shared secret stays BoringSSL's.

use std::future::Future;

use boring::derive::Deriver;
use boring::mlkem::{Algorithm, MlKemPublicKey};
use boring::pkey::{Id, PKey};
use zeroize::Zeroizing;

use gatehouse_mbx as mbx;

use crate::{Error, batcher};

/// TLS `NamedGroup` code points of the groups computed here.
pub const X25519: u16 = 0x001d;
pub const X25519_MLKEM768: u16 = 0x11ec;

/// BoringSSL's default server preference (`ssl/ssl_key_share.cc`), which
/// Gatehouse keeps, and with `SSL_OP_CIPHER_SERVER_PREFERENCE` the order
/// in which it picks.
const SERVER_PREFERENCE: [u16; 4] = [X25519_MLKEM768, X25519, 0x0017, 0x0018];

/// The server's share and the shared secret, as BoringSSL would make them.
pub struct Share {
    pub group: u16,
    pub ciphertext: Vec<u8>,
    pub secret: Zeroizing<Vec<u8>>,
}

/// The group BoringSSL will pick for a TLS 1.3 handshake, from the client's
/// `supported_groups` extension body: the first of the server's preference
/// the client lists.
pub fn predict(supported_groups: &[u8]) -> Option<u16> {
    first_offered(supported_groups, |_| true)
}

/// The first group of the server's preference that `allowed` passes and
/// the client lists in `supported_groups` (the extension body).
fn first_offered(supported_groups: &[u8], allowed: impl Fn(u16) -> bool) -> Option<u16> {
    let list = supported_groups.get(2..)?;
    let offered = |g: u16| list.chunks_exact(2).any(|c| c == g.to_be_bytes());
    SERVER_PREFERENCE.into_iter().find(|&g| allowed(g) && offered(g))
}

/// The group BoringSSL will pick for a TLS 1.2 ECDHE handshake: the first
/// of the server's preference the client lists, without the groups only
/// TLS 1.3 has.
pub fn predict_tls12(supported_groups: &[u8]) -> Option<u16> {
    first_offered(supported_groups, |g| g != X25519_MLKEM768)
}

/// A handshake hint for BoringSSL: a TLS 1.3 key share, or a TLS 1.2
/// ECDHE key pair.
pub enum Hint {
    Share(Share),
    Ecdhe { group: u16, pair: batcher::EcdhePair },
}

impl Hint {
    pub fn group(&self) -> u16 {
        match self {
            Hint::Share(s) => s.group,
            Hint::Ecdhe { group, .. } => *group,
        }
    }

    /// Whether BoringSSL uses it in TLS 1.2 (else in TLS 1.3).
    pub fn tls12(&self) -> bool {
        matches!(self, Hint::Ecdhe { .. })
    }

    /// The hints as `SSL_set_handshake_hints` takes them: the key share's
    /// ([`Share::hints_der`]), or `SEQUENCE { [UNIVERSAL 7] SEQUENCE {
    /// INTEGER group, OCTET STRING public key, OCTET STRING private key } }`
    /// (BoringSSL's tag for the ECDHE hint, `ssl/handoff.cc`). Holds the
    /// private key: zeroed on drop.
    pub fn hints_der(&self) -> Zeroizing<Vec<u8>> {
        match self {
            Hint::Share(s) => s.hints_der(),
            Hint::Ecdhe { group, pair } => hints_element(0x27, *group, &pair.public, &pair.private[..]),
        }
    }
}

/// A TLS 1.2 ECDHE key pair for `group` made ahead in this worker's lanes:
/// X25519 only (`None` for another group). Only on a CPU with IFMA.
pub fn ecdhe(group: u16) -> Option<Hint> {
    if group != X25519 || !mbx::available() {
        return None;
    }
    Some(Hint::Ecdhe { group, pair: batcher::ecdhe_pair()? })
}

/// The client's share for `group` in its `key_share` extension body, if it
/// sent one (otherwise BoringSSL asks again with a HelloRetryRequest).
pub fn client_share(key_share: &[u8], group: u16) -> Option<&[u8]> {
    let len = usize::from(u16::from_be_bytes([*key_share.first()?, *key_share.get(1)?]));
    let mut rest = key_share.get(2..2 + len)?;
    while rest.len() >= 4 {
        let g = u16::from_be_bytes([rest[0], rest[1]]);
        let n = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
        let key = rest.get(4..4 + n)?;
        if g == group {
            return Some(key);
        }
        rest = &rest[4 + n..];
    }
    None
}

/// Starts the server's share of `group` against the client's `peer` share,
/// on this worker's batcher. `None` when the group is not one computed here
/// or the client's share is malformed: BoringSSL then handles it (and
/// refuses what is malformed, with the right alert).
pub fn start(group: u16, peer: &[u8]) -> Option<impl Future<Output = Result<Share, Error>> + use<>> {
    let (mlkem, x25519) = match group {
        X25519 => (None, peer),
        X25519_MLKEM768 if peer.len() == mbx::mlkem::PUBLIC_KEY_BYTES + 32 => {
            let (m, x) = peer.split_at(mbx::mlkem::PUBLIC_KEY_BYTES);
            (Some(m), x)
        }
        _ => return None,
    };
    let point: [u8; 32] = x25519.try_into().ok()?;
    // ML-KEM-768 in the batch's Keccak lanes where the CPU has them (every
    // CPU with IFMA does), else in BoringSSL after the lanes. The batch
    // checks the key: one that fails leaves the share to BoringSSL, which
    // refuses it with the right alert.
    let (lanes, boring) = match mlkem {
        Some(m) if mbx::mlkem::available() => (Some(Box::from(m)), None),
        Some(m) => (None, Some(MlKemPublicKey::from_slice(Algorithm::MlKem768, m).ok()?)),
        None => (None, None),
    };
    let pending = batcher::submit_share(point, lanes);
    Some(async move {
        let x = pending.await.unwrap_or(Err(Error::Dropped))?;
        let (mut ciphertext, ss) = match (x.mlkem, boring) {
            (Some(kem), _) => (kem.ciphertext.to_vec(), kem.secret),
            (None, Some(key)) => {
                // After the lanes, so that a share that fails there costs
                // no encapsulation.
                let (ct, ss) = key.encapsulate().map_err(|_| Error::Crypto("ML-KEM-768 encapsulation"))?;
                (ct, Zeroizing::new(ss))
            }
            (None, None) => {
                return Ok(Share { group, ciphertext: x.public.to_vec(), secret: Zeroizing::new(x.secret.to_vec()) });
            }
        };
        ciphertext.extend_from_slice(&x.public);
        let mut secret = Zeroizing::new(Vec::with_capacity(64));
        secret.extend_from_slice(&ss[..]);
        secret.extend_from_slice(&x.secret[..]);
        Ok(Share { group, ciphertext, secret })
    })
}

/// The X25519MLKEM768 share computed at once, without the batcher (for
/// [`crate::Shares::Kem`]): the ML-KEM-768 encapsulation in this CPU's
/// vector kernels, the X25519 half in BoringSSL. BoringSSL's own ML-KEM is
/// the larger part of a post-quantum handshake's extra cost on a CPU
/// without AVX-512 (docs/BENCHMARKS.md). `None` for another group, a CPU
/// without the kernels, or a malformed or small-order client share:
/// BoringSSL then handles it (and refuses what is malformed, with the
/// right alert).
pub fn compute_now(group: u16, peer: &[u8]) -> Option<Share> {
    if group != X25519_MLKEM768 || peer.len() != mbx::mlkem::PUBLIC_KEY_BYTES + 32 || !mbx::mlkem::available() {
        return None;
    }
    let (kem_key, x_peer) = peer.split_at(mbx::mlkem::PUBLIC_KEY_BYTES);
    let mut entropy = Zeroizing::new([0u8; 32]);
    boring::rand::rand_bytes(&mut entropy[..]).ok()?;
    let mut ciphertext = vec![0u8; mbx::mlkem::CIPHERTEXT_BYTES + 32];
    let mut secret = Zeroizing::new(vec![0u8; 64]);
    {
        let (ct, _) = ciphertext.split_at_mut(mbx::mlkem::CIPHERTEXT_BYTES);
        let (ss, _) = secret.split_at_mut(mbx::mlkem::SECRET_BYTES);
        let mut op = [mbx::mlkem::EncapOp {
            public_key: kem_key,
            entropy: &entropy,
            ciphertext: ct.try_into().ok()?,
            secret: ss.try_into().ok()?,
        }];
        mbx::mlkem::encapsulate_batch(&mut op).first()?.ok()?;
    }
    // X25519 as BoringSSL's own share makes it; the derivation refuses a
    // small-order point (an all-zero secret).
    let key = PKey::generate(Id::X25519).ok()?;
    let public = key.raw_public_key(&mut ciphertext[mbx::mlkem::CIPHERTEXT_BYTES..]).ok()?;
    let theirs = PKey::public_key_from_der(&x25519_spki(x_peer.try_into().ok()?)).ok()?;
    let mut deriver = Deriver::new(&key).ok()?;
    deriver.set_peer(&theirs).ok()?;
    let n = deriver.derive(&mut secret[mbx::mlkem::SECRET_BYTES..]).ok()?;
    (public.len() == 32 && n == 32).then_some(Share { group, ciphertext, secret })
}

/// An X25519 public key as a SubjectPublicKeyInfo (RFC 8410), the form
/// in which `boring` takes a peer's raw key.
pub(crate) fn x25519_spki(key: &[u8; 32]) -> [u8; 44] {
    const PREFIX: [u8; 12] = [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x03, 0x21, 0x00];
    let mut der = [0u8; 44];
    der[..12].copy_from_slice(&PREFIX);
    der[12..].copy_from_slice(key);
    der
}

impl Share {
    /// The hints in BoringSSL's serialized form (`ssl/handoff.cc`):
    /// `SEQUENCE { [1] IMPLICIT SEQUENCE { INTEGER group, OCTET STRING
    /// ciphertext, OCTET STRING secret } }`. Holds the secret: zeroed on drop.
    pub fn hints_der(&self) -> Zeroizing<Vec<u8>> {
        hints_element(0xa1, self.group, &self.ciphertext, &self.secret)
    }
}

/// A hints SEQUENCE holding one element `tag`: the group, then two octet
/// strings (the public part, then the secret).
/// Written once into one buffer, its lengths known ahead: the secret is
/// copied once and zeroed once.
fn hints_element(tag: u8, group: u16, public: &[u8], secret: &[u8]) -> Zeroizing<Vec<u8>> {
    let group = integer(group);
    let inner = der_len(group.len()) + der_len(public.len()) + der_len(secret.len());
    let mut out = Zeroizing::new(Vec::with_capacity(der_len(der_len(inner))));
    header(&mut out, 0x30, der_len(inner));
    header(&mut out, tag, inner);
    der(&mut out, 0x02, &group);
    der(&mut out, 0x04, public);
    der(&mut out, 0x04, secret);
    out
}

/// Bytes of a DER element with `n` content bytes.
fn der_len(n: usize) -> usize {
    n + if n < 0x80 {
        2
    } else if n < 0x100 {
        3
    } else {
        4
    }
}

/// A DER INTEGER's content octets for a non-negative u16.
fn integer(v: u16) -> Vec<u8> {
    let b = v.to_be_bytes();
    let mut out = if b[0] == 0 { vec![b[1]] } else { b.to_vec() };
    if out[0] & 0x80 != 0 {
        out.insert(0, 0);
    }
    out
}

/// Appends tag, definite length and content.
fn der(out: &mut Vec<u8>, tag: u8, content: &[u8]) {
    header(out, tag, content.len());
    out.extend_from_slice(content);
}

/// Appends tag and definite length `n` (below 2^16).
fn header(out: &mut Vec<u8>, tag: u8, n: usize) {
    out.push(tag);
    if n < 0x80 {
        out.push(n as u8);
    } else if n < 0x100 {
        out.extend_from_slice(&[0x81, n as u8]);
    } else {
        out.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_group_is_predicted_in_server_preference() {
        let list = |gs: &[u16]| {
            let mut v = ((gs.len() * 2) as u16).to_be_bytes().to_vec();
            gs.iter().for_each(|g| v.extend_from_slice(&g.to_be_bytes()));
            v
        };
        assert_eq!(predict(&list(&[0x001d, 0x11ec, 0x0017])), Some(X25519_MLKEM768));
        assert_eq!(predict(&list(&[0x0017, 0x001d])), Some(X25519));
        assert_eq!(predict(&list(&[0x0018, 0x0017])), Some(0x0017));
        assert_eq!(predict(&list(&[0x0019])), None);
        assert_eq!(predict(&[0x00]), None);
        // TLS 1.2 has no hybrid group.
        assert_eq!(predict_tls12(&list(&[0x11ec, 0x0017, 0x001d])), Some(X25519));
        assert_eq!(predict_tls12(&list(&[0x11ec, 0x0017])), Some(0x0017));
        assert_eq!(predict_tls12(&list(&[0x11ec])), None);
    }

    #[test]
    fn the_clients_share_is_found_by_group() {
        let mut ext = vec![0, 0];
        for (g, len) in [(0x11ecu16, 1216usize), (0x001d, 32)] {
            ext.extend_from_slice(&g.to_be_bytes());
            ext.extend_from_slice(&(len as u16).to_be_bytes());
            ext.extend(std::iter::repeat_n(g as u8, len));
        }
        let total = (ext.len() - 2) as u16;
        ext[..2].copy_from_slice(&total.to_be_bytes());
        assert_eq!(client_share(&ext, X25519).map(<[u8]>::len), Some(32));
        assert_eq!(client_share(&ext, X25519_MLKEM768).map(<[u8]>::len), Some(1216));
        assert_eq!(client_share(&ext, 0x0017), None);
        assert_eq!(client_share(&ext[..40], X25519), None, "truncated");
    }

    #[test]
    fn hints_encode_as_boringssl_parses_them() {
        let share = Share { group: X25519, ciphertext: vec![7; 32], secret: Zeroizing::new(vec![9; 32]) };
        let der = share.hints_der();
        let mut want = vec![0x30, 0x49, 0xa1, 0x47, 0x02, 0x01, 0x1d, 0x04, 0x20];
        want.extend([7; 32]);
        want.extend([0x04, 0x20]);
        want.extend([9; 32]);
        assert_eq!(&der[..], &want[..]);
        let big = Share { group: X25519_MLKEM768, ciphertext: vec![1; 1120], secret: Zeroizing::new(vec![2; 64]) };
        let der = big.hints_der();
        // 0x11ec as a DER INTEGER, lengths in long form.
        // Inner: 4 + (4 + 1120) + (2 + 64) = 1194 octets; the hint 1198.
        assert_eq!(&der[..4], &[0x30, 0x82, 0x04, 0xae]);
        assert_eq!(&der[4..8], &[0xa1, 0x82, 0x04, 0xaa]);
        assert_eq!(&der[8..12], &[0x02, 0x02, 0x11, 0xec]);
        assert_eq!(der.len(), 4 + 4 + 4 + 4 + 1120 + 2 + 64);
        let pair = batcher::EcdhePair { public: [3; 32], private: Zeroizing::new([4; 32]) };
        let der = Hint::Ecdhe { group: X25519, pair }.hints_der();
        let mut want = vec![0x30, 0x49, 0x27, 0x47, 0x02, 0x01, 0x1d, 0x04, 0x20];
        want.extend([3; 32]);
        want.extend([0x04, 0x20]);
        want.extend([4; 32]);
        assert_eq!(&der[..], &want[..]);
    }

    /// A key pair made ahead is one BoringSSL agrees with: its public key
    /// is X25519 of its private key, and the two sides' secrets match.
    #[test]
    fn ecdhe_pairs_made_ahead_are_x25519_key_pairs() {
        if !mbx::available() {
            return;
        }
        assert!(ecdhe(0x0017).is_none());
        for _ in 0..20 {
            let Some(Hint::Ecdhe { group, pair }) = ecdhe(X25519) else { panic!("a key pair") };
            assert_eq!(group, X25519);
            // PKCS #8 of an X25519 private key (RFC 8410).
            let mut pkcs8 =
                vec![0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x6e, 0x04, 0x22, 0x04, 0x20];
            pkcs8.extend_from_slice(&pair.private[..]);
            let ours = PKey::private_key_from_der(&pkcs8).expect("X25519 key");
            let mut public = [0u8; 32];
            assert_eq!(ours.raw_public_key(&mut public).expect("public").len(), 32);
            assert_eq!(public, pair.public);
            let client = PKey::generate(Id::X25519).expect("client key");
            let mut client_public = [0u8; 32];
            client.raw_public_key(&mut client_public).expect("public");
            let secret = |mine: &PKey<boring::pkey::Private>, theirs: &[u8; 32]| {
                let peer = PKey::public_key_from_der(&x25519_spki(theirs)).expect("peer");
                let mut d = Deriver::new(mine).expect("deriver");
                d.set_peer(&peer).expect("peer");
                d.derive_to_vec().expect("secret")
            };
            assert_eq!(secret(&ours, &client_public), secret(&client, &pair.public));
        }
    }

    /// The client's side of X25519MLKEM768 takes the share made at once
    /// to the same secret: its ML-KEM key decapsulates the ciphertext, its
    /// X25519 key agrees with the server's public half.
    #[test]
    fn a_share_made_at_once_is_the_one_the_client_agrees_on() {
        use boring::mlkem::MlKemPrivateKey;
        if !mbx::mlkem::available() {
            return;
        }
        for _ in 0..20 {
            let (kem_public, kem_private) = MlKemPrivateKey::generate(Algorithm::MlKem768).expect("ML-KEM key");
            let (x_private, x_public) = crate::tests::x25519_client();
            let mut peer = kem_public.as_bytes().to_vec();
            peer.extend_from_slice(&x_public);
            let share = compute_now(X25519_MLKEM768, &peer).expect("share");
            assert_eq!((share.group, share.ciphertext.len(), share.secret.len()), (X25519_MLKEM768, 1120, 64));
            let (ct, server_x) = share.ciphertext.split_at(mbx::mlkem::CIPHERTEXT_BYTES);
            assert_eq!(&kem_private.decapsulate(ct).expect("decapsulate")[..], &share.secret[..32]);
            assert_eq!(crate::tests::client_secret(&x_private, server_x), &share.secret[32..]);
        }
    }

    /// What the at-once share leaves to BoringSSL: another group, a share
    /// of the wrong length, an ML-KEM key with a coefficient not below q,
    /// and a small-order X25519 point (an all-zero secret).
    #[test]
    fn shares_made_at_once_refuse_what_boringssl_should_refuse() {
        if !mbx::mlkem::available() {
            return;
        }
        let (kem_public, _) = boring::mlkem::MlKemPrivateKey::generate(Algorithm::MlKem768).expect("ML-KEM key");
        let mut peer = kem_public.as_bytes().to_vec();
        peer.extend_from_slice(&crate::tests::x25519_client().1);
        assert!(compute_now(X25519_MLKEM768, &peer).is_some());
        assert!(compute_now(X25519, &peer[1184..]).is_none());
        assert!(compute_now(X25519_MLKEM768, &peer[..1215]).is_none());
        let mut bad_kem = peer.clone();
        bad_kem[0] = 0xff;
        bad_kem[1] |= 0x0f;
        assert!(compute_now(X25519_MLKEM768, &bad_kem).is_none());
        let mut low_order = peer.clone();
        low_order[1184..].fill(0);
        assert!(compute_now(X25519_MLKEM768, &low_order).is_none());
    }
}
