//! The lanes against RFC 7748's vectors and against BoringSSL's X25519 on
//! random scalars and points, in batches of every size.

use boring::derive::Deriver;
use boring::pkey::{PKey, Private, Public};

use super::{BASE, KeygenOp, LowOrder, X25519Op, public_batch, x25519_batch};
use crate::available;

fn hex32(s: &str) -> [u8; 32] {
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex");
    }
    out
}

/// One operation through the lanes, alone in its batch.
fn one(scalar: &[u8; 32], point: &[u8; 32]) -> Result<[u8; 32], LowOrder> {
    let mut out = [0u8; 32];
    let r = x25519_batch(&mut [X25519Op { scalar, point, out: &mut out }]);
    r[0].map(|()| out)
}

fn boring_private(k: &[u8; 32]) -> PKey<Private> {
    // PKCS #8 wrapping of a raw X25519 private key (RFC 8410).
    let mut der = hex_vec("302e020100300506032b656e04220420");
    der.extend_from_slice(k);
    PKey::private_key_from_der(&der).expect("X25519 private key")
}

fn boring_public(u: &[u8; 32]) -> PKey<Public> {
    let mut der = hex_vec("302a300506032b656e032100");
    der.extend_from_slice(u);
    PKey::public_key_from_der(&der).expect("X25519 public key")
}

fn hex_vec(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex")).collect()
}

/// BoringSSL's X25519(k, u); None where it refuses (zero result).
fn reference(k: &[u8; 32], u: &[u8; 32]) -> Option<[u8; 32]> {
    let private = boring_private(k);
    let public = boring_public(u);
    let mut d = Deriver::new(&private).expect("deriver");
    d.set_peer(&public).expect("peer");
    let v = d.derive_to_vec().ok()?;
    v.try_into().ok()
}

fn random32() -> [u8; 32] {
    core::array::from_fn(|_| fastrand::u8(..))
}

#[test]
fn rfc7748_vectors() {
    if !available() {
        eprintln!("skipped: no AVX-512 IFMA on this CPU");
        return;
    }
    let cases = [
        (
            "a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
            "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
            "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552",
        ),
        (
            "4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
            "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
            "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957",
        ),
        // Section 6.1: Alice's and Bob's public keys, and their shared secret.
        (
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
            "0900000000000000000000000000000000000000000000000000000000000000",
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a",
        ),
        (
            "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb",
            "0900000000000000000000000000000000000000000000000000000000000000",
            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f",
        ),
        (
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f",
            "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742",
        ),
    ];
    for (k, u, want) in cases {
        assert_eq!(one(&hex32(k), &hex32(u)), Ok(hex32(want)), "k={k} u={u}");
    }
}

#[test]
fn rfc7748_iterated() {
    if !available() {
        return;
    }
    // k = u = 9; then u ← k, k ← X25519(k, u), 1,000 times.
    let (mut k, mut u) = (BASE, BASE);
    for i in 1..=1000 {
        let r = one(&k, &u).expect("nonzero");
        u = k;
        k = r;
        if i == 1 {
            assert_eq!(k, hex32("422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079"));
        }
    }
    assert_eq!(k, hex32("684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51"));
}

#[test]
fn random_batches_match_boringssl() {
    if !available() {
        return;
    }
    for round in 0..300 {
        let n = 1 + round % 8;
        let scalars: Vec<[u8; 32]> = (0..n).map(|_| random32()).collect();
        let points: Vec<[u8; 32]> = (0..n)
            .map(|i| match (round + i) % 5 {
                0 => BASE,
                // Bit 255 set: ignored by both.
                1 => {
                    let mut u = random32();
                    u[31] |= 0x80;
                    u
                }
                // Non-canonical: p ≤ u < 2^255.
                2 => {
                    let mut u = [0xff; 32];
                    u[0] = 0xed + fastrand::u8(..0x12);
                    u[31] = 0x7f;
                    u
                }
                _ => random32(),
            })
            .collect();
        let mut outs = vec![[0u8; 32]; n];
        let mut ops: Vec<X25519Op<'_>> = scalars
            .iter()
            .zip(&points)
            .zip(outs.iter_mut())
            .map(|((scalar, point), out)| X25519Op { scalar, point, out })
            .collect();
        let results = x25519_batch(&mut ops);
        for i in 0..n {
            match reference(&scalars[i], &points[i]) {
                Some(want) => {
                    assert_eq!(results[i], Ok(()), "round {round} lane {i}");
                    assert_eq!(outs[i], want, "round {round} lane {i}");
                }
                None => assert_eq!(results[i], Err(LowOrder), "round {round} lane {i}"),
            }
        }
    }
}

#[test]
fn key_pairs_agree_with_boringssl_keys() {
    if !available() {
        return;
    }
    for _ in 0..50 {
        let a = PKey::generate(boring::pkey::Id::X25519).expect("key");
        let b = PKey::generate(boring::pkey::Id::X25519).expect("key");
        let raw = |k: &PKey<Private>| {
            let mut s = [0u8; 32];
            k.raw_private_key(&mut s).expect("raw");
            s
        };
        let public = |k: &PKey<Private>| {
            let mut p = [0u8; 32];
            k.raw_public_key(&mut p).expect("raw");
            p
        };
        assert_eq!(one(&raw(&a), &BASE), Ok(public(&a)));
        let mut d = Deriver::new(&a).expect("deriver");
        d.set_peer(&b).expect("peer");
        let shared = d.derive_to_vec().expect("derive");
        assert_eq!(one(&raw(&a), &public(&b)).expect("nonzero")[..], shared[..]);
    }
}

#[test]
fn small_order_points_are_refused_in_their_lane_only() {
    if !available() {
        return;
    }
    // u = 0 and u = 1 have small order; the other lanes go on.
    let zero = [0u8; 32];
    let mut one_u = [0u8; 32];
    one_u[0] = 1;
    let k = random32();
    let good = random32();
    let mut outs = [[0u8; 32]; 3];
    let [o0, o1, o2] = &mut outs;
    let r = x25519_batch(&mut [
        X25519Op { scalar: &k, point: &zero, out: o0 },
        X25519Op { scalar: &k, point: &good, out: o1 },
        X25519Op { scalar: &k, point: &one_u, out: o2 },
    ]);
    assert_eq!(&r[..3], &[Err(LowOrder), Ok(()), Err(LowOrder)]);
    assert_eq!(Some(outs[1]), reference(&k, &good));
    assert_eq!(reference(&k, &zero), None, "BoringSSL refuses it too");
}

/// Public keys by the fixed-base comb, one batch.
fn publics(scalars: &[[u8; 32]]) -> Vec<[u8; 32]> {
    let mut outs = vec![[0u8; 32]; scalars.len()];
    let mut ops: Vec<KeygenOp<'_>> =
        scalars.iter().zip(outs.iter_mut()).map(|(scalar, out)| KeygenOp { scalar, out }).collect();
    let results = public_batch(&mut ops);
    assert!(results[..scalars.len()].iter().all(|r| r.is_ok()), "{results:?}");
    outs
}

#[test]
fn fixed_base_public_keys_match_rfc7748() {
    if !available() {
        return;
    }
    // Section 6.1: Alice's and Bob's private and public keys.
    let alice = hex32("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
    let bob = hex32("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
    assert_eq!(
        publics(&[alice, bob]),
        [
            hex32("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"),
            hex32("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"),
        ]
    );
}

#[test]
fn fixed_base_public_keys_match_boringssl_and_the_ladder() {
    if !available() {
        return;
    }
    for round in 0..400 {
        let n = 1 + round % 8;
        let scalars: Vec<[u8; 32]> = (0..n)
            .map(|i| match (round + i) % 7 {
                // Clamping makes these the smallest and the largest scalars.
                0 => [0u8; 32],
                1 => [0xff; 32],
                // Digits at the recoding's edges: all 8s, all 7s.
                2 => [0x88; 32],
                3 => [0x77; 32],
                _ => random32(),
            })
            .collect();
        let got = publics(&scalars);
        for (i, k) in scalars.iter().enumerate() {
            let mut want = [0u8; 32];
            boring_private(k).raw_public_key(&mut want).expect("raw public key");
            assert_eq!(got[i], want, "round {round} lane {i}: BoringSSL");
            assert_eq!(Ok(got[i]), one(k, &BASE), "round {round} lane {i}: the ladder");
        }
    }
}

#[test]
fn the_curve_check_tells_a_point_off_the_curve() {
    if !available() {
        return;
    }
    assert_eq!(super::base::curve_check_tells(), (true, true));
}
