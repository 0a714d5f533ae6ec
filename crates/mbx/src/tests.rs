//! The engine against BoringSSL's raw RSA (`RSA_NO_PADDING`) on random keys and
//! inputs, in batches of every size with mixed keys, plus fault injection.

use boring::bn::BigNum;
use boring::pkey::Private;
use boring::rsa::{Padding, Rsa};

use crate::{
    BATCH, Components, Fault, KeyError, Op, OpError, RsaKey, available, private_batch, private_batch_with_fault,
};

fn prepare(rsa: &Rsa<Private>) -> RsaKey {
    let part = |b: Option<&boring::bn::BigNumRef>| b.expect("CRT part").to_vec();
    let (p, q) = (part(rsa.p()), part(rsa.q()));
    let (dp, dq, qinv) = (part(rsa.dmp1()), part(rsa.dmq1()), part(rsa.iqmp()));
    let (n, e) = (rsa.n().to_vec(), rsa.e().to_vec());
    RsaKey::new(&Components { n: &n, e: &e, p: &p, q: &q, dp: &dp, dq: &dq, qinv: &qinv }).expect("key prepares")
}

/// A random value below n, sometimes with leading zero bytes or tiny.
fn random_input(rsa: &Rsa<Private>) -> Vec<u8> {
    let size = rsa.size() as usize;
    let n = rsa.n().to_vec();
    loop {
        let mut x: Vec<u8> = (0..size).map(|_| fastrand::u8(..)).collect();
        match fastrand::u8(..8) {
            0 => x[..size / 2].fill(0),
            1 => {
                x.fill(0);
                x[size - 1] = fastrand::u8(..);
            }
            2 => x[0] = n[0], // near the modulus
            _ => {}
        }
        if x < n {
            return x;
        }
    }
}

/// One operation per input, the i-th with the i-th key.
fn batch<'a>(keys: impl Iterator<Item = &'a RsaKey>, inputs: &'a [Vec<u8>], outputs: &'a mut [Vec<u8>]) -> Vec<Op<'a>> {
    keys.zip(inputs).zip(outputs).map(|((key, input), output)| Op { key, input, output }).collect()
}

fn reference(rsa: &Rsa<Private>, input: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; rsa.size() as usize];
    let len = rsa.private_decrypt(input, &mut out, Padding::NONE).expect("boring raw RSA");
    assert_eq!(len, out.len());
    out
}

fn check_size(bits: u32, keys: usize, messages: usize) {
    if !available() {
        eprintln!("no AVX-512 IFMA on this CPU: engine test skipped");
        return;
    }
    let rsas: Vec<Rsa<Private>> = (0..keys).map(|_| Rsa::generate(bits).expect("keygen")).collect();
    let prepared: Vec<RsaKey> = rsas.iter().map(prepare).collect();
    let mut done = vec![0usize; keys];
    let mut batch_size = 1;
    while done.iter().any(|&d| d < messages) {
        let picks: Vec<usize> = (0..batch_size).map(|_| fastrand::usize(..keys)).collect();
        let inputs: Vec<Vec<u8>> = picks.iter().map(|&k| random_input(&rsas[k])).collect();
        let mut outputs = vec![vec![0u8; bits as usize / 8]; batch_size];
        let mut ops = batch(picks.iter().map(|&k| &prepared[k]), &inputs, &mut outputs);
        let results = private_batch(&mut ops);
        for (i, &k) in picks.iter().enumerate() {
            assert_eq!(results[i], Ok(()), "rsa{bits} key {k} batch of {batch_size}");
            assert_eq!(outputs[i], reference(&rsas[k], &inputs[i]), "rsa{bits} key {k} lane {i}");
            done[k] += 1;
        }
        batch_size = batch_size % BATCH + 1;
    }
}

#[test]
fn rsa2048_matches_boringssl() {
    check_size(2048, 4, 1000);
}

#[test]
fn rsa3072_matches_boringssl() {
    check_size(3072, 3, 1000);
}

#[test]
fn rsa4096_matches_boringssl() {
    check_size(4096, 3, 1000);
}

#[test]
fn fault_in_one_lane_is_caught_and_the_others_succeed() {
    if !available() {
        return;
    }
    let rsa = Rsa::generate(2048).expect("keygen");
    let key = prepare(&rsa);
    for lane in 0..BATCH {
        let inputs: Vec<Vec<u8>> = (0..BATCH).map(|_| random_input(&rsa)).collect();
        let mut outputs = vec![vec![0xaau8; 256]; BATCH];
        let mut ops = batch(std::iter::repeat(&key), &inputs, &mut outputs);
        let limb = fastrand::usize(..40);
        let results = private_batch_with_fault(&mut ops, Some(Fault { lane, limb }));
        for i in 0..BATCH {
            if i == lane {
                assert_eq!(results[i], Err(OpError::Fault));
                assert!(outputs[i].iter().all(|&b| b == 0), "nothing of a faulty result leaves");
            } else {
                assert_eq!(results[i], Ok(()));
                assert_eq!(outputs[i], reference(&rsa, &inputs[i]));
            }
        }
    }
}

#[test]
fn bad_inputs_get_errors_and_do_not_disturb_the_batch() {
    if !available() {
        return;
    }
    let rsa = Rsa::generate(2048).expect("keygen");
    let key = prepare(&rsa);
    let other = prepare(&Rsa::generate(3072).expect("keygen"));
    let good = random_input(&rsa);
    let n = rsa.n().to_vec();
    let short = vec![1u8; 255];
    let mut o = [[0u8; 256], [0u8; 256], [0u8; 256], [0u8; 256]];
    let mut o3 = [0u8; 384];
    let [o0, o1, o2, o4] = &mut o;
    let mut ops = vec![
        Op { key: &key, input: &good, output: o0 },
        Op { key: &key, input: &n, output: o1 },
        Op { key: &key, input: &short, output: o2 },
        Op { key: &other, input: &good, output: &mut o3 },
        Op { key: &key, input: &good, output: o4 },
    ];
    let results = private_batch(&mut ops);
    assert_eq!(results[0], Ok(()));
    assert_eq!(results[1], Err(OpError::InputTooLarge));
    assert_eq!(results[2], Err(OpError::InputLength { expected: 256, got: 255 }));
    assert_eq!(results[3], Err(OpError::MixedBatch));
    assert_eq!(results[4], Ok(()));
    let expect = reference(&rsa, &good);
    assert_eq!(o[0].to_vec(), expect);
    assert_eq!(o[3].to_vec(), expect);
}

#[test]
fn unsupported_keys_are_refused() {
    let rsa = Rsa::generate_with_e(2048, &BigNum::from_u32(3).expect("bn")).expect("keygen");
    let part = |b: Option<&boring::bn::BigNumRef>| b.expect("CRT part").to_vec();
    let (n, e, p, q) = (rsa.n().to_vec(), rsa.e().to_vec(), part(rsa.p()), part(rsa.q()));
    let (dp, dq, qinv) = (part(rsa.dmp1()), part(rsa.dmq1()), part(rsa.iqmp()));
    let c = Components { n: &n, e: &e, p: &p, q: &q, dp: &dp, dq: &dq, qinv: &qinv };
    assert_eq!(RsaKey::new(&c).err(), Some(KeyError::Exponent));
    let small = Rsa::generate(1024).expect("keygen");
    let (n, e, p, q) = (small.n().to_vec(), small.e().to_vec(), part(small.p()), part(small.q()));
    let (dp, dq, qinv) = (part(small.dmp1()), part(small.dmq1()), part(small.iqmp()));
    let c = Components { n: &n, e: &e, p: &p, q: &q, dp: &dp, dq: &dq, qinv: &qinv };
    assert_eq!(RsaKey::new(&c).err(), Some(KeyError::Size(1024)));
}
