//! Providers against BoringSSL: PKCS#1 v1.5 signatures byte for byte, PSS
//! signatures verified, raw decryptions equal; and the batcher's triggers.

use std::sync::Arc;

use boring::hash::MessageDigest;
use boring::pkey::{PKey, Private};
use boring::rsa::{Padding, Rsa};
use boring::sign::{RsaPssSaltlen, Signer, Verifier};
use boring::ssl::SslSignatureAlgorithm as Alg;

use crate::{Engine, Provider, RsaKey, RsaProvider, batcher, share, stats};

fn rsa_key(bits: u32) -> PKey<Private> {
    PKey::from_rsa(Rsa::generate(bits).expect("keygen")).expect("pkey")
}

fn engines() -> Vec<Engine> {
    if gatehouse_mbx::available() { vec![Engine::Boring, Engine::Mb] } else { vec![Engine::Boring] }
}

/// A worker's runtime as the L7 plane builds it: the batcher runs when
/// the thread parks, and its timer task bounds every wait.
fn runtime() -> tokio::runtime::Runtime {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .on_thread_park(batcher::on_idle)
        .build()
        .expect("runtime");
    rt.spawn(batcher::run_timer());
    rt
}

/// A TLS signature scheme, its digest, and whether it is PSS.
type Scheme = (Alg, fn() -> MessageDigest, bool);

const SCHEMES: [Scheme; 7] = [
    (Alg::RSA_PKCS1_SHA1, MessageDigest::sha1, false),
    (Alg::RSA_PKCS1_SHA256, MessageDigest::sha256, false),
    (Alg::RSA_PKCS1_SHA384, MessageDigest::sha384, false),
    (Alg::RSA_PKCS1_SHA512, MessageDigest::sha512, false),
    (Alg::RSA_PSS_RSAE_SHA256, MessageDigest::sha256, true),
    (Alg::RSA_PSS_RSAE_SHA384, MessageDigest::sha384, true),
    (Alg::RSA_PSS_RSAE_SHA512, MessageDigest::sha512, true),
];

#[test]
fn signatures_and_decryptions_match_boringssl() {
    let rt = runtime();
    for bits in [2048u32, 3072, 4096] {
        let pkey = rsa_key(bits);
        for engine in engines() {
            let (key, note) = RsaKey::new(&pkey, engine).expect("key");
            assert_eq!(note, None);
            assert_eq!(key.engine(), engine);
            let provider = Arc::new(RsaProvider::new(key));
            // Many operations in flight at once, so the batcher fills batches.
            let mut jobs = Vec::new();
            for round in 0..24 {
                let (alg, md, pss) = SCHEMES[round % SCHEMES.len()];
                let msg: Vec<u8> = (0..fastrand::usize(1..300)).map(|_| fastrand::u8(..)).collect();
                jobs.push((alg, md, pss, msg.clone(), provider.sign(alg, &msg)));
            }
            for (alg, md, pss, msg, op) in jobs {
                let sig = rt.block_on(op.wait()).expect("sign");
                let mut v = Verifier::new(md(), &pkey).expect("verifier");
                if pss {
                    v.set_rsa_padding(Padding::PKCS1_PSS).expect("pss");
                    v.set_rsa_pss_saltlen(RsaPssSaltlen::DIGEST_LENGTH).expect("salt");
                } else {
                    let mut s = Signer::new(md(), &pkey).expect("signer");
                    s.update(&msg).expect("update");
                    assert_eq!(sig, s.sign_to_vec().expect("sign"), "{engine:?} {alg:?} rsa{bits}");
                }
                v.update(&msg).expect("update");
                assert!(v.verify(&sig).expect("verify"), "{engine:?} {alg:?} rsa{bits} verifies");
            }
            let rsa = pkey.rsa().expect("rsa");
            for _ in 0..10 {
                let secret: Vec<u8> = (0..48).map(|_| fastrand::u8(..)).collect();
                let mut ct = vec![0u8; rsa.size() as usize];
                rsa.public_encrypt(&secret, &mut ct, Padding::PKCS1).expect("encrypt");
                let raw = rt.block_on(provider.decrypt(&ct).wait()).expect("decrypt");
                let mut expect = vec![0u8; rsa.size() as usize];
                rsa.private_decrypt(&ct, &mut expect, Padding::NONE).expect("reference");
                assert_eq!(raw, expect, "{engine:?} rsa{bits} raw decryption");
                assert!(raw.ends_with(&secret));
            }
        }
    }
}

#[test]
fn batcher_fills_batches_and_flushes_a_lone_operation_when_idle() {
    if !gatehouse_mbx::available() {
        return;
    }
    let rt = runtime();
    let pkey = rsa_key(2048);
    let provider = Arc::new(RsaProvider::new(RsaKey::new(&pkey, Engine::Mb).expect("key").0));
    // This thread's counters: the other tests, on other threads, sign too.
    let before = stats::this_thread();
    // Eight at once: the eighth submission runs the batch inline.
    let ops: Vec<_> = (0..8).map(|i| provider.sign(Alg::RSA_PKCS1_SHA256, &[i])).collect();
    let after_eight = stats::this_thread();
    assert_eq!(after_eight.mb_batches[0][7], before.mb_batches[0][7] + 1, "a full batch ran at once");
    for op in ops {
        rt.block_on(op.wait()).expect("sign");
    }
    // One alone: below break-even, run when the worker parks, not by a timer.
    let started = std::time::Instant::now();
    rt.block_on(provider.sign(Alg::RSA_PKCS1_SHA256, b"lone").wait()).expect("sign");
    assert!(started.elapsed() < std::time::Duration::from_millis(500));
    let after = stats::this_thread();
    assert_eq!(after.single_ops[0], after_eight.single_ops[0] + 1);
    assert_eq!(after.timer_flushes, after_eight.timer_flushes);
}

#[test]
fn unsupported_keys_stay_on_boring_with_a_note() {
    let rsa = Rsa::generate_with_e(2048, &boring::bn::BigNum::from_u32(3).expect("bn")).expect("keygen");
    let pkey = PKey::from_rsa(rsa).expect("pkey");
    let (key, note) = RsaKey::new(&pkey, Engine::Mb).expect("key");
    assert_eq!(key.engine(), Engine::Boring);
    if gatehouse_mbx::available() {
        assert!(note.expect("note").contains("65537"));
    }
}

/// A client's X25519 key as BoringSSL makes it: the key and its public value.
pub(crate) fn x25519_client() -> (PKey<Private>, [u8; 32]) {
    let key = PKey::generate(boring::pkey::Id::X25519).expect("key");
    let mut public = [0u8; 32];
    key.raw_public_key(&mut public).expect("raw");
    (key, public)
}

/// What the client derives from the server's public value.
pub(crate) fn client_secret(client: &PKey<Private>, server_public: &[u8]) -> Vec<u8> {
    let der = share::x25519_spki(server_public.try_into().expect("a 32-byte public value"));
    let peer = PKey::public_key_from_der(&der).expect("server public");
    let mut d = boring::derive::Deriver::new(client).expect("deriver");
    d.set_peer(&peer).expect("peer");
    d.derive_to_vec().expect("derive")
}

#[test]
fn x25519_shares_agree_with_the_clients_boringssl() {
    if !gatehouse_mbx::available() {
        return;
    }
    let rt = runtime();
    let before = stats::this_thread();
    // The first share of a quiet worker runs alone, at once; the next eight
    // fill a batch (their public keys by the comb, their secrets in one
    // batch of the ladder) and run at once.
    let clients: Vec<_> = (0..9).map(|_| x25519_client()).collect();
    let pending: Vec<_> =
        clients.iter().map(|(_, public)| share::start(share::X25519, public).expect("X25519 share")).collect();
    let after = stats::this_thread();
    assert_eq!(after.mb_batches[stats::X25519][15], before.mb_batches[stats::X25519][15] + 1, "a full batch");
    for ((client, _), fut) in clients.iter().zip(pending) {
        let s = rt.block_on(fut).expect("share");
        assert_eq!(s.group, share::X25519);
        assert_eq!(client_secret(client, &s.ciphertext), *s.secret);
    }
    assert_eq!(stats::this_thread().mb_batches[stats::X25519][1], before.mb_batches[stats::X25519][1] + 1);
}

/// A worker for the tests of waiting, and a client's public key; `None`
/// without IFMA. The timer's bound leaves the worker room to park before
/// a wait ends, however slow the machine (every other test passes with
/// any bound).
fn waiting_worker() -> Option<(tokio::runtime::Runtime, [u8; 32])> {
    if !gatehouse_mbx::available() {
        return None;
    }
    batcher::set_max_delay(std::time::Duration::from_millis(100));
    Some((runtime(), x25519_client().1))
}

/// Two shares 200 µs apart: the worker parks in between, and a patient
/// queue leaves the first for the second to join.
fn two_shares_apart<F>(rt: &tokio::runtime::Runtime, share: impl Fn() -> F)
where
    F: std::future::Future<Output = Result<share::Share, crate::Error>>,
{
    rt.block_on(async {
        let first = share();
        tokio::time::sleep(std::time::Duration::from_micros(200)).await;
        let second = share();
        first.await.expect("share");
        second.await.expect("share");
    });
}

#[test]
fn a_queue_that_filled_waits_for_company_until_none_comes() {
    let Some((rt, public)) = waiting_worker() else { return };
    let share = || share::start(share::X25519, &public).expect("X25519 share");
    let batches = |lanes: usize| stats::this_thread().mb_batches[stats::X25519][lanes - 1];
    // A full batch (the first share of a quiet worker runs alone, the
    // next eight fill the batch): from now on an idle worker leaves a share
    // for company.
    let full_before = batches(16);
    let full: Vec<_> = (0..9).map(|_| share()).collect();
    assert_eq!(batches(16), full_before + 1);
    for f in full {
        rt.block_on(f).expect("share");
    }
    let (pairs, flushes) = (batches(4), stats::this_thread().timer_flushes);
    // One share queues; the worker parks (the sleep) and leaves it; a
    // second comes and both run together when the timer ends the wait.
    two_shares_apart(&rt, share);
    assert_eq!(batches(4), pairs + 1, "the two shares ran as one batch");
    assert_eq!(stats::this_thread().timer_flushes, flushes + 1);
    // A lone share waits out the timer alone: one wait that brought nobody
    // is no sign yet, the next lone share waits too; after that second
    // empty wait in a row, lone shares run at once, with no timer.
    let (singles, flushes) = (batches(2), stats::this_thread().timer_flushes);
    rt.block_on(share()).expect("share");
    assert_eq!((batches(2), stats::this_thread().timer_flushes), (singles + 1, flushes + 1));
    rt.block_on(share()).expect("share");
    assert_eq!((batches(2), stats::this_thread().timer_flushes), (singles + 2, flushes + 2));
    rt.block_on(share()).expect("share");
    assert_eq!((batches(2), stats::this_thread().timer_flushes), (singles + 3, flushes + 2));
}

#[test]
fn a_wait_that_paid_forgives_an_empty_one() {
    let Some((rt, public)) = waiting_worker() else { return };
    let share = || share::start(share::X25519, &public).expect("X25519 share");
    let batches = |lanes: usize| stats::this_thread().mb_batches[stats::X25519][lanes - 1];
    let flushes = || stats::this_thread().timer_flushes;
    // A full batch makes the queue patient.
    let full: Vec<_> = (0..9).map(|_| share()).collect();
    for f in full {
        rt.block_on(f).expect("share");
    }
    // Empty, paid (two of eight), empty again: no two empty waits in a row,
    // so the queue is still patient and the next lone share waits.
    let f0 = flushes();
    rt.block_on(share()).expect("share");
    two_shares_apart(&rt, share);
    rt.block_on(share()).expect("share");
    let (singles, f1) = (batches(2), flushes());
    assert_eq!(f1, f0 + 3);
    rt.block_on(share()).expect("share");
    assert_eq!((batches(2), flushes()), (singles + 1, f1 + 1), "still waited");
    // That was the second empty wait in a row: now it runs at once.
    rt.block_on(share()).expect("share");
    assert_eq!((batches(2), flushes()), (singles + 2, f1 + 1));
}

#[test]
fn a_patient_queue_of_four_shares_runs_when_the_worker_idles() {
    let Some((rt, public)) = waiting_worker() else { return };
    let share = || share::start(share::X25519, &public).expect("X25519 share");
    let batches = |lanes: usize| stats::this_thread().mb_batches[stats::X25519][lanes - 1];
    // A full batch makes the queue patient.
    let full: Vec<_> = (0..9).map(|_| share()).collect();
    for f in full {
        rt.block_on(f).expect("share");
    }
    // Four shares fill one batch of the ladder: the idle worker runs them
    // rather than hold them for the timer (eight would take the comb).
    let (fours, flushes) = (batches(8), stats::this_thread().timer_flushes);
    let four: Vec<_> = (0..4).map(|_| share()).collect();
    rt.block_on(async {
        for f in four {
            f.await.expect("share");
        }
    });
    assert_eq!((batches(8), stats::this_thread().timer_flushes), (fours + 1, flushes));
}

#[test]
fn handshakes_under_way_make_a_share_wait_until_two_waits_come_out_empty() {
    let Some((rt, public)) = waiting_worker() else { return };
    let share = || share::start(share::X25519, &public).expect("X25519 share");
    let now = || {
        let s = stats::this_thread();
        (s.mb_batches[stats::X25519][1], s.timer_flushes)
    };
    // Two batches' worth of handshakes under way: company is around.
    let under_way: Vec<_> = (0..8).map(|_| batcher::handshake_begins()).collect();
    let (singles, flushes) = now();
    rt.block_on(share()).expect("share"); // the first of a quiet worker runs at once
    assert_eq!(now(), (singles + 1, flushes));
    // The next, soon after: it waits for company, which does not come;
    // and the next once more.
    rt.block_on(share()).expect("share");
    assert_eq!(now(), (singles + 2, flushes + 1), "waited for the timer");
    rt.block_on(share()).expect("share");
    assert_eq!(now(), (singles + 3, flushes + 2), "waited again");
    // Two waits in a row came out empty: the next shares run without waiting.
    rt.block_on(share()).expect("share");
    rt.block_on(share()).expect("share");
    assert_eq!(now(), (singles + 5, flushes + 2));
    drop(under_way);
}

#[test]
fn x25519mlkem768_shares_decapsulate_to_the_same_secret() {
    use boring::mlkem::{Algorithm, MlKemPrivateKey};
    if !gatehouse_mbx::available() {
        return;
    }
    let rt = runtime();
    let (x_key, x_public) = x25519_client();
    let (m_public, m_private) = MlKemPrivateKey::generate(Algorithm::MlKem768).expect("ML-KEM key");
    let mut peer = m_public.as_bytes().to_vec();
    peer.extend_from_slice(&x_public);
    let s = rt.block_on(share::start(share::X25519_MLKEM768, &peer).expect("hybrid share")).expect("share");
    assert_eq!(s.ciphertext.len(), 1088 + 32);
    assert_eq!(s.secret.len(), 64);
    let ss = m_private.decapsulate(&s.ciphertext[..1088]).expect("decapsulate");
    assert_eq!(&s.secret[..32], &ss[..]);
    assert_eq!(client_secret(&x_key, &s.ciphertext[1088..]), &s.secret[32..]);
    // Malformed or foreign shares are left to BoringSSL.
    assert!(share::start(share::X25519_MLKEM768, &peer[..1000]).is_none());
    assert!(share::start(share::X25519, &peer).is_none());
    assert!(share::start(0x0017, &x_public).is_none());
}

#[test]
fn a_small_order_point_fails_only_its_own_share() {
    if !gatehouse_mbx::available() {
        return;
    }
    let rt = runtime();
    let (client, public) = x25519_client();
    let bad = share::start(share::X25519, &[0u8; 32]).expect("queued");
    let good = share::start(share::X25519, &public).expect("queued");
    assert!(matches!(rt.block_on(bad), Err(crate::Error::LowOrder)));
    let s = rt.block_on(good).expect("share");
    assert_eq!(client_secret(&client, &s.ciphertext), *s.secret);
}

#[test]
fn ecdsa_on_mb_signs_at_once_from_presignatures_made_in_full_batches() {
    use boring::ec::{EcGroup, EcKey};
    use boring::nid::Nid;
    if !gatehouse_mbx::available() {
        return;
    }
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).expect("group");
    let pkey = PKey::from_ec_key(EcKey::generate(&group).expect("key")).expect("pkey");
    let provider = crate::EcdsaProvider::new(crate::EcdsaKey::new(&pkey, Engine::Mb).expect("key"));
    assert_eq!(provider.engine(), Engine::Mb);
    let k = stats::ECDSA_P256;
    let msgs: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i; 100]).collect();
    let full = |t: &stats::Snapshot| t.mb_batches[k][7];
    // Sixteen signatures, each ready at once: the first finds no
    // presignature and makes eight, the ninth eight more; none queues
    // and none goes to BoringSSL.
    let before = stats::this_thread();
    let mut rs = std::collections::HashSet::new();
    for m in &msgs {
        let crate::KeyOp::Ready(sig) = provider.sign(Alg::ECDSA_SECP256R1_SHA256, m) else {
            panic!("an ECDSA signature on mb is ready at once")
        };
        let sig = sig.expect("signature");
        let mut v = Verifier::new(MessageDigest::sha256(), &pkey).expect("verifier");
        v.update(m).expect("update");
        assert!(v.verify(&sig).expect("verify"), "a valid DER signature");
        let parsed = boring::ecdsa::EcdsaSig::from_der(&sig).expect("DER");
        assert!(rs.insert(parsed.r().to_vec()), "a nonce signs once");
    }
    let after = stats::this_thread();
    assert_eq!(full(&after), full(&before) + 2);
    assert_eq!(after.single_ops[k], before.single_ops[k]);
    // An idle worker that signs refills its pool, rows of eight at once,
    // then stops.
    batcher::on_idle();
    batcher::on_idle();
    batcher::on_idle();
    assert_eq!(full(&stats::this_thread()), full(&after) + gatehouse_mbx::p256::POOL_ROWS as u64);
    assert!(matches!(
        provider.sign(Alg::ECDSA_SECP384R1_SHA384, b"x"),
        crate::KeyOp::Ready(Err(crate::Error::Algorithm(_)))
    ));
}
