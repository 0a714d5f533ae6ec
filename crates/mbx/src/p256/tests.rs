//! Signatures from the lanes verified by BoringSSL, for random keys and
//! digests in batches of every size; faults caught.

use boring::bn::BigNumContext;
use boring::ec::{EcGroup, EcKey};
use boring::ecdsa::EcdsaSig;
use boring::nid::Nid;
use boring::pkey::Private;

use super::{
    FinishFault, FinishOp, P256Key, PointFault, SignFault, SignOp, presign_batch, presign_batch_with_fault,
    presign_rows, presign_rows_with_fault, sign_batch, sign_batch_with_fault,
};
use crate::available;

fn key() -> (EcKey<Private>, P256Key) {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("group");
    let k = EcKey::generate(&group).expect("key");
    let d: [u8; 32] = k.private_key().to_vec_padded(32).expect("d").try_into().expect("32");
    let mb = P256Key::new(&d).expect("prepared");
    (k, mb)
}

fn verifies(k: &EcKey<Private>, digest: &[u8; 32], sig: &[u8; 64]) -> bool {
    let r = boring::bn::BigNum::from_slice(&sig[..32]).expect("r");
    let s = boring::bn::BigNum::from_slice(&sig[32..]).expect("s");
    let sig = EcdsaSig::from_private_components(r, s).expect("sig");
    sig.verify(digest, k).expect("verify runs")
}

#[test]
fn random_batches_verify_with_boringssl() {
    if !available() {
        eprintln!("skipped: no AVX-512 IFMA on this CPU");
        return;
    }
    let keys: Vec<_> = (0..8).map(|_| key()).collect();
    for round in 0..120 {
        let n = 1 + round % 8;
        let digests: Vec<[u8; 32]> = (0..n)
            .map(|i| match (round + i) % 4 {
                0 => [0xff; 32], // above n
                1 => [0; 32],
                _ => core::array::from_fn(|_| fastrand::u8(..)),
            })
            .collect();
        let mut outs = vec![[0u8; 64]; n];
        let mut ops: Vec<SignOp<'_>> = digests
            .iter()
            .zip(outs.iter_mut())
            .enumerate()
            .map(|(i, (digest, out))| SignOp { key: &keys[(round + i) % 8].1, digest, out })
            .collect();
        let results = sign_batch(&mut ops);
        for i in 0..n {
            assert_eq!(results[i], Ok(()), "round {round} lane {i}");
            assert!(verifies(&keys[(round + i) % 8].0, &digests[i], &outs[i]), "round {round} lane {i}");
        }
    }
    let _ = BigNumContext::new();
}

#[test]
fn a_faulty_lane_gives_no_signature_and_the_others_verify() {
    if !available() {
        return;
    }
    let (k, mb) = key();
    let digests: Vec<[u8; 32]> = (0..8).map(|_| core::array::from_fn(|_| fastrand::u8(..))).collect();
    let mut outs = vec![[0u8; 64]; 8];
    let mut ops: Vec<SignOp<'_>> =
        digests.iter().zip(outs.iter_mut()).map(|(digest, out)| SignOp { key: &mb, digest, out }).collect();
    let results = sign_batch_with_fault(&mut ops, Some(PointFault { lane: 5 }));
    for i in 0..8 {
        if i == 5 {
            assert_eq!(results[i], Err(SignFault));
        } else {
            assert_eq!(results[i], Ok(()));
            assert!(verifies(&k, &digests[i], &outs[i]));
        }
    }
}

/// Presignatures made ahead sign with any key and any digest, in finish
/// batches of every size, mixed from several presign batches.
#[test]
fn presignatures_sign_with_any_key_in_batches_of_any_size() {
    if !available() {
        return;
    }
    let keys: Vec<_> = (0..3).map(|_| key()).collect();
    let mut pool: Vec<_> = (0..9).flat_map(|_| presign_batch()).map(|p| p.expect("a sound lane")).collect();
    assert_eq!(pool.len(), 72);
    let mut n = 1;
    while !pool.is_empty() {
        let take = n.min(pool.len());
        let digests: Vec<[u8; 32]> = (0..take).map(|_| core::array::from_fn(|_| fastrand::u8(..))).collect();
        let mut outs = vec![[0u8; 64]; take];
        let mut ops: Vec<FinishOp<'_>> = pool
            .drain(..take)
            .zip(digests.iter().zip(outs.iter_mut()))
            .enumerate()
            .map(|(i, (presignature, (digest, out)))| FinishOp { presignature, key: &keys[i % 3].1, digest, out })
            .collect();
        let results = super::finish_batch(&mut ops, None);
        drop(ops);
        for i in 0..take {
            assert_eq!(results[i], Ok(()), "batch of {take}, lane {i}");
            assert!(verifies(&keys[i % 3].0, &digests[i], &outs[i]), "batch of {take}, lane {i}");
        }
        // Two signatures never share a nonce, so never an r.
        for i in 1..take {
            assert_ne!(outs[i][..32], outs[0][..32]);
        }
        n = n % 8 + 1;
    }
}

/// A nonce whose point fails its check gives no presignature; a finish
/// fault fails only the signatures whose nonce came from that lane.
#[test]
fn faulty_presignatures_and_finishes_fail_alone() {
    if !available() {
        return;
    }
    let faulted = presign_batch_with_fault(Some(PointFault { lane: 2 }));
    for (l, p) in faulted.iter().enumerate() {
        assert_eq!(p.is_err(), l == 2, "lane {l}");
    }
    let (k, mb) = key();
    let digests: Vec<[u8; 32]> = (0..8).map(|_| core::array::from_fn(|_| fastrand::u8(..))).collect();
    let mut outs = vec![[0u8; 64]; 8];
    // The batch's presignatures in reverse, so lane 3's lands in slot 4.
    let mut ops: Vec<FinishOp<'_>> = presign_batch()
        .into_iter()
        .rev()
        .zip(digests.iter().zip(outs.iter_mut()))
        .map(|(p, (digest, out))| FinishOp { presignature: p.expect("sound"), key: &mb, digest, out })
        .collect();
    let results = super::finish_batch(&mut ops, Some(FinishFault { lane: 3 }));
    drop(ops);
    for i in 0..8 {
        if i == 4 {
            assert_eq!(results[i], Err(SignFault));
        } else {
            assert_eq!(results[i], Ok(()), "slot {i}");
            assert!(verifies(&k, &digests[i], &outs[i]));
        }
    }
}

/// Rows that share their inversions give presignatures as sound as a
/// row alone: every one signs and verifies, no two share a nonce, and a
/// faulty lane in one row fails alone.
#[test]
fn rows_sharing_their_inversions_sign_and_fail_alone() {
    if !available() {
        return;
    }
    let (k, mb) = key();
    for rows in [1, 2, 3, super::POOL_ROWS] {
        let faulty = (rows > 1).then_some(8 * (rows - 1) + 6);
        let made = presign_rows_with_fault(rows, faulty.map(|lane| PointFault { lane }));
        assert_eq!(made.len(), 8 * rows);
        let mut rs = std::collections::HashSet::new();
        for (i, p) in made.into_iter().enumerate() {
            if Some(i) == faulty {
                assert!(p.is_err(), "rows {rows}: the faulty lane {i} is refused");
                continue;
            }
            let digest: [u8; 32] = core::array::from_fn(|_| fastrand::u8(..));
            let mut out = [0u8; 64];
            let mut op =
                [FinishOp { presignature: p.expect("a sound lane"), key: &mb, digest: &digest, out: &mut out }];
            assert_eq!(super::finish_batch(&mut op, None)[0], Ok(()), "rows {rows}, lane {i}");
            drop(op);
            assert!(verifies(&k, &digest, &out), "rows {rows}, lane {i}");
            assert!(rs.insert(out[..32].to_vec()), "rows {rows}: a nonce signs once");
        }
    }
    assert!(presign_rows(0).is_empty());
}

/// Nonces at the edges of the signed recoding (every digit at its
/// largest, the last window's carry, n − 1, small ones) give points that
/// sign: a wrong k·G would give an r that does not verify.
#[test]
fn nonces_at_the_edges_of_the_comb_sign() {
    if !available() {
        return;
    }
    let c = super::curve::consts();
    let n = boring::bn::BigNum::from_slice(&c.n_be).expect("n");
    let from_hex = |h: &str| boring::bn::BigNum::from_hex_str(h).expect("hex").to_vec_padded(32).expect("32");
    let minus = |k: u32| {
        let mut v = boring::bn::BigNum::new().expect("bn");
        v.checked_sub(&n, &boring::bn::BigNum::from_u32(k).expect("k")).expect("n − k");
        v.to_vec_padded(32).expect("32")
    };
    let edges: Vec<Vec<u8>> = vec![
        from_hex("1"),
        from_hex("2"),
        from_hex("20"),
        from_hex("21"),
        from_hex("3f"),
        from_hex("40"),
        from_hex("7e0"),
        minus(1),
        minus(2),
        minus(32),
        // Every window's top bit set, so every digit negative but the last.
        from_hex("fbefbefbefbefbefbefbefbefbefbefbefbefbefbefbefbefbefbefbefbefbe"),
        from_hex("8208208208208208208208208208208208208208208208208208208208208208"),
        from_hex("f000000000000000000000000000000000000000000000000000000000000000"),
        from_hex("efffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"),
        from_hex("7fffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"),
        from_hex("ffffffff00000000fffffffffffffffeffffffffffffffffffffffffffffffff"),
    ];
    let (k, mb) = key();
    for chunk in edges.chunks(8) {
        let mut nonces: Vec<[u8; 32]> = chunk.iter().map(|e| e.as_slice().try_into().expect("32")).collect();
        nonces.resize(8, nonces[0]);
        for (i, p) in super::presign_from(c, &nonces, None).into_iter().enumerate() {
            let digest: [u8; 32] = core::array::from_fn(|_| fastrand::u8(..));
            let mut out = [0u8; 64];
            let mut op =
                [FinishOp { presignature: p.expect("a sound lane"), key: &mb, digest: &digest, out: &mut out }];
            assert_eq!(super::finish_batch(&mut op, None)[0], Ok(()));
            drop(op);
            assert!(verifies(&k, &digest, &out), "nonce {:02x?}", nonces[i]);
        }
    }
}

/// Booth's digits put back together give the scalar.
#[test]
fn signed_digits_sum_to_the_scalar() {
    for round in 0..2000 {
        let k: [u64; 4] = match round {
            0 => [0; 4],
            1 => [u64::MAX; 4],
            _ => core::array::from_fn(|_| fastrand::u64(..)),
        };
        // Σ dᵢ·64^i, in 64-bit words with a signed carry.
        let mut sum = [0i128; 6];
        for i in 0..super::WINDOWS {
            let (mag, neg) = super::booth_digit(&k, i);
            assert!(mag <= 32 && neg <= 1);
            let d = if neg == 1 { -(mag as i128) } else { mag as i128 };
            let bit = super::WINDOW_BITS * i;
            sum[bit / 64] += d << (bit % 64);
        }
        let mut carry = 0i128;
        let mut words = [0u64; 6];
        for (w, s) in words.iter_mut().zip(sum) {
            let t = s + carry;
            *w = t as u64;
            carry = t >> 64;
        }
        assert_eq!(carry, 0);
        assert_eq!(&words[..4], &k[..], "round {round}");
        assert_eq!(&words[4..], &[0, 0]);
    }
}

#[test]
fn keys_out_of_range_are_refused() {
    assert!(P256Key::new(&[0; 32]).is_err());
    assert!(P256Key::new(&[0xff; 32]).is_err());
    let mut one = [0u8; 32];
    one[31] = 1;
    assert!(P256Key::new(&one).is_ok());
}
