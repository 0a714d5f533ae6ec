//! `gatehouse bench keyops`: private-key operations per second on one core,
//! for each engine and key size, with the break-even batch size they imply.

use std::time::{Duration, Instant};

use boring::derive::Deriver;
use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{Id, PKey};
use boring::rsa::Rsa;
use boring::sign::Signer;
use gatehouse_mbx as mbx;

use gatehouse_keyops::{Engine, Hash, RsaKey, RsaScheme};

/// One measured engine and key.
#[derive(Clone, Debug)]
pub struct Result {
    pub engine: &'static str,
    pub key: String,
    pub ops_per_sec: f64,
}

impl std::fmt::Display for Result {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "keyops engine={} key={} ops_per_sec={:.0}", self.engine, self.key, self.ops_per_sec)
    }
}

/// Runs `op` (doing `per_call` operations each time) for about `time`.
fn measure(time: Duration, per_call: usize, mut op: impl FnMut() -> bool) -> Option<f64> {
    // One untimed call warms caches and the CPU's vector unit.
    if !op() {
        return None;
    }
    let start = Instant::now();
    let mut ops = 0usize;
    while start.elapsed() < time {
        if !op() {
            return None;
        }
        ops += per_call;
    }
    Some(ops as f64 / start.elapsed().as_secs_f64())
}

/// One SHA-256 signature by BoringSSL, as a handshake without a provider makes.
fn boring_sign(pkey: &PKey<boring::pkey::Private>, msg: &[u8]) -> bool {
    Signer::new(MessageDigest::sha256(), pkey)
        .and_then(|mut s| {
            s.update(msg)?;
            s.sign_to_vec()
        })
        .is_ok()
}

/// Measures every engine on every key size; `report` gets each line as it comes.
pub fn run(time: Duration, sizes: &[u32], mut report: impl FnMut(&Result)) -> Vec<Result> {
    let mut out = Vec::new();
    let msg = b"gatehouse keyops benchmark: the handshake transcript hash stands here";
    for &bits in sizes {
        let Ok(pkey) = Rsa::generate(bits).and_then(PKey::from_rsa) else { continue };
        let name = format!("rsa{bits}");
        // boring: BoringSSL signs as it does for a key without a provider.
        let boring = measure(time, 1, || boring_sign(&pkey, msg));
        if let Some(v) = boring {
            let r = Result { engine: "boring", key: name.clone(), ops_per_sec: v };
            report(&r);
            out.push(r);
        }
        if !mbx::available() {
            continue;
        }
        let Ok((key, None)) = RsaKey::new(&pkey, Engine::Mb) else { continue };
        let Some(mbk) = key.mb_key() else { continue };
        let mut outputs = vec![vec![0u8; key.size()]; mbx::BATCH];
        let mb = measure(time, mbx::BATCH, || {
            let blocks: Vec<Vec<u8>> =
                (0..mbx::BATCH).filter_map(|_| key.encode(RsaScheme::Pkcs1(Hash::Sha256), msg).ok()).collect();
            let mut ops: Vec<mbx::Op<'_>> =
                blocks.iter().zip(outputs.iter_mut()).map(|(b, o)| mbx::Op { key: mbk, input: b, output: o }).collect();
            ops.len() == mbx::BATCH && mbx::private_batch(&mut ops).iter().all(|r| r.is_ok())
        });
        if let Some(v) = mb {
            let r = Result { engine: "mb", key: name.clone(), ops_per_sec: v };
            report(&r);
            out.push(r);
        }
    }
    x25519(time, &mut report, &mut out);
    mlkem768(time, &mut report, &mut out);
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1);
    if let Ok(pkey) = group.and_then(|g| EcKey::generate(&g)).and_then(PKey::from_ec_key) {
        let ecdsa = measure(time, 1, || boring_sign(&pkey, msg));
        if let Some(v) = ecdsa {
            let r = Result { engine: "boring", key: "ecdsa-p256".into(), ops_per_sec: v };
            report(&r);
            out.push(r);
        }
        // The lanes as a worker signs: presignatures made rows at a time
        // (as an idle worker refills its pool), then each signature
        // finished alone from one, with its message's SHA-256.
        let d = pkey.ec_key().ok().and_then(|k| k.private_key().to_vec_padded(32).ok());
        let key = d.and_then(|d| <[u8; 32]>::try_from(d).ok()).and_then(|d| mbx::p256::P256Key::new(&d).ok());
        if let (true, Some(key)) = (mbx::available(), key) {
            let rows = mbx::p256::POOL_ROWS;
            let mb = measure(time, rows * mbx::BATCH, || {
                mbx::p256::presign_rows(rows).into_iter().all(|p| {
                    let Ok(presignature) = p else { return false };
                    let digest = boring::sha::sha256(msg);
                    let mut out = [0u8; 64];
                    let mut op = [mbx::p256::FinishOp { presignature, key: &key, digest: &digest, out: &mut out }];
                    mbx::p256::finish_batch(&mut op, None)[0].is_ok()
                })
            });
            if let Some(v) = mb {
                let r = Result { engine: "mb", key: "ecdsa-p256".into(), ops_per_sec: v };
                report(&r);
                out.push(r);
            }
        }
    }
    out
}

/// X25519: BoringSSL's key generation (its fixed-base tables) and shared
/// secret, one at a time, against the lanes: the fixed-base comb for key
/// generation, the ladder for the shared secret.
fn x25519(time: Duration, report: &mut impl FnMut(&Result), out: &mut Vec<Result>) {
    let mut push = |engine, key: &str, v: Option<f64>| {
        if let Some(v) = v {
            let r = Result { engine, key: key.into(), ops_per_sec: v };
            report(&r);
            out.push(r);
        }
    };
    let (Ok(a), Ok(b)) = (PKey::generate(Id::X25519), PKey::generate(Id::X25519)) else { return };
    push("boring", "x25519-keygen", measure(time, 1, || PKey::generate(Id::X25519).is_ok()));
    push(
        "boring",
        "x25519",
        measure(time, 1, || {
            let Ok(mut d) = Deriver::new(&a) else { return false };
            d.set_peer(&b).is_ok() && d.derive_to_vec().is_ok_and(|s| s.len() == 32)
        }),
    );
    if !mbx::available() {
        return;
    }
    let mut peer = [0u8; 32];
    if b.raw_public_key(&mut peer).is_err() {
        return;
    }
    let mut scalars = [[0u8; 32]; mbx::BATCH];
    let mut outs = [[0u8; 32]; mbx::BATCH];
    // Fresh scalars for every batch, as handshakes bring them.
    let fresh = |scalars: &mut [[u8; 32]; mbx::BATCH]| scalars.iter_mut().all(|s| boring::rand::rand_bytes(s).is_ok());
    let shared = measure(time, mbx::BATCH, || {
        if !fresh(&mut scalars) {
            return false;
        }
        let mut ops: Vec<mbx::x25519::X25519Op<'_>> = scalars
            .iter()
            .zip(outs.iter_mut())
            .map(|(scalar, out)| mbx::x25519::X25519Op { scalar, point: &peer, out })
            .collect();
        mbx::x25519::x25519_batch(&mut ops).iter().all(|r| r.is_ok())
    });
    let keygen = measure(time, mbx::BATCH, || {
        if !fresh(&mut scalars) {
            return false;
        }
        let mut ops: Vec<mbx::x25519::KeygenOp<'_>> =
            scalars.iter().zip(outs.iter_mut()).map(|(scalar, out)| mbx::x25519::KeygenOp { scalar, out }).collect();
        mbx::x25519::public_batch(&mut ops).iter().all(|r| r.is_ok())
    });
    push("mb", "x25519-keygen", keygen);
    push("mb", "x25519", shared);
}

/// ML-KEM-768 encapsulation as a TLS server makes it for a client's key
/// share: BoringSSL parses the key (expanding its matrix) and encapsulates,
/// one at a time; the lanes take a batch of one (a lone handshake) and of
/// four (a full batch of X25519MLKEM768 shares).
fn mlkem768(time: Duration, report: &mut impl FnMut(&Result), out: &mut Vec<Result>) {
    use boring::mlkem::{Algorithm, MlKemPrivateKey, MlKemPublicKey};
    let Ok((public, _)) = MlKemPrivateKey::generate(Algorithm::MlKem768) else { return };
    let key = public.as_bytes().to_vec();
    let mut push = |engine, name: &str, v: Option<f64>| {
        if let Some(v) = v {
            let r = Result { engine, key: name.into(), ops_per_sec: v };
            report(&r);
            out.push(r);
        }
    };
    push(
        "boring",
        "mlkem768",
        measure(time, 1, || {
            MlKemPublicKey::from_slice(Algorithm::MlKem768, &key).and_then(|k| k.encapsulate()).is_ok()
        }),
    );
    if !mbx::mlkem::available() {
        return;
    }
    for (n, name) in [(1, "mlkem768-x1"), (4, "mlkem768")] {
        let mut entropy = vec![[0u8; 32]; n];
        let mut cts = vec![[0u8; mbx::mlkem::CIPHERTEXT_BYTES]; n];
        let mut secrets = vec![[0u8; 32]; n];
        let v = measure(time, n, || {
            if entropy.iter_mut().any(|m| boring::rand::rand_bytes(m).is_err()) {
                return false;
            }
            let mut ops: Vec<mbx::mlkem::EncapOp<'_>> = entropy
                .iter()
                .zip(cts.iter_mut().zip(secrets.iter_mut()))
                .map(|(m, (ciphertext, secret))| mbx::mlkem::EncapOp {
                    public_key: &key,
                    entropy: m,
                    ciphertext,
                    secret,
                })
                .collect();
            mbx::mlkem::encapsulate_batch(&mut ops).iter().all(|r| r.is_ok())
        });
        push("mb", name, v);
    }
}

/// The batch size from which one multi-buffer batch costs less than running
/// its operations one by one: batch time over single-op time, rounded up.
pub fn break_even(results: &[Result], key: &str) -> Option<f64> {
    let get = |engine| results.iter().find(|r| r.engine == engine && r.key == key).map(|r| r.ops_per_sec);
    let (boring, mb) = (get("boring")?, get("mb")?);
    Some((mbx::BATCH as f64 / mb) / (1.0 / boring))
}
