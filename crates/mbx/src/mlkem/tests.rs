//! ML-KEM-768 encapsulation against BoringSSL: its known-answer values,
//! and its decapsulation of our ciphertexts on random keys (which, by the
//! implicit rejection of FIPS 203, agrees only when our ciphertext is the
//! one the decapsulator recomputes, byte for byte).

use boring::mlkem::{Algorithm, MlKemPrivateKey};

use super::*;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn random_key() -> (Vec<u8>, MlKemPrivateKey) {
    let (public, private) = MlKemPrivateKey::generate(Algorithm::MlKem768).expect("ML-KEM key");
    (public.as_bytes().to_vec(), private)
}

fn unhex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits.chunks(2).map(|d| u8::from_str_radix(std::str::from_utf8(d).unwrap_or("00"), 16).unwrap_or(0)).collect()
}

/// Every kernel this CPU runs: AVX-512 where it has it, and AVX2 always.
fn engines() -> Vec<Cpu> {
    [Avx512::detect().map(Cpu::Avx512), Avx2::detect().map(Cpu::Avx2)].into_iter().flatten().collect()
}

fn encap_all(keys: &[&[u8]], entropy: &[[u8; 32]]) -> (Vec<[u8; CIPHERTEXT_BYTES]>, Vec<[u8; 32]>, Vec<bool>) {
    let cpu = Cpu::detect().expect("the callers check the CPU first");
    encap_with(cpu, keys, entropy)
}

fn encap_with(
    cpu: Cpu,
    keys: &[&[u8]],
    entropy: &[[u8; 32]],
) -> (Vec<[u8; CIPHERTEXT_BYTES]>, Vec<[u8; 32]>, Vec<bool>) {
    let mut cts = vec![[0u8; CIPHERTEXT_BYTES]; keys.len()];
    let mut secrets = vec![[0u8; 32]; keys.len()];
    let mut ops: Vec<EncapOp<'_>> = keys
        .iter()
        .zip(entropy)
        .zip(cts.iter_mut().zip(secrets.iter_mut()))
        .map(|((k, m), (ct, ss))| EncapOp { public_key: k, entropy: m, ciphertext: ct, secret: ss })
        .collect();
    let ok = encapsulate_with(cpu, &mut ops).iter().map(Result::is_ok).collect();
    (cts, secrets, ok)
}

/// BoringSSL's FIPS self-test values (`crypto/fipsmodule/mlkem/
/// fips_known_values.inc`): the key from seed c877…6b1a ‖ 0³² (its public
/// half in `kat_public_key.hex`), the encapsulation with the seed's first
/// half as `m`; the ciphertext compared by its SHA-256.
#[test]
fn known_answer() {
    if !available() {
        return;
    }
    let entropy: [u8; 32] = [
        0xc8, 0x77, 0x34, 0x04, 0xb3, 0xe5, 0x3e, 0x31, 0x7b, 0xab, 0x41, 0x08, 0xa8, 0x88, 0x9c, 0x90, 0xbe, 0xfb,
        0x38, 0x0f, 0x63, 0x89, 0x70, 0xbc, 0xdc, 0x33, 0xeb, 0x2d, 0xe2, 0x99, 0x6b, 0x1a,
    ];
    let public = unhex(include_str!("kat_public_key.hex"));
    assert_eq!(hex(&boring::sha::sha256(&public)), "40a37de5196199b91d2b47301c07a3b2e8ddcd0eaaa6ac7ddb4481865f412b97");
    let mut seed = [0u8; 64];
    seed[..32].copy_from_slice(&entropy);
    let private = MlKemPrivateKey::from_seed(Algorithm::MlKem768, &seed).expect("key from seed");
    for cpu in engines() {
        let (cts, secrets, ok) = encap_with(cpu, &[&public], &[entropy]);
        assert_eq!(ok, [true]);
        assert_eq!(
            hex(&boring::sha::sha256(&cts[0])),
            "3c784247cf67d822c995789d6105bd169b3f9aaedba8f6f6312b41d7b1f0d6ef"
        );
        assert_eq!(hex(&secrets[0]), "7d9f1cb4ae04d75fa6575ae0e429b573a974b7a125bdfb8a6e0f19bae116ae81");
        // The seed's private key takes the ciphertext back to the secret.
        assert_eq!(private.decapsulate(&cts[0]).expect("decapsulate"), secrets[0]);
    }
}

/// Random keys in batches of every size up to 19 (so Keccak chunks of
/// eight or four end anywhere), on every kernel the CPU runs: BoringSSL
/// decapsulates each ciphertext to the same secret, a batch gives what
/// each op alone gives, and the kernels give the same bytes.
#[test]
fn boringssl_decapsulates_what_we_encapsulate() {
    if !available() {
        return;
    }
    let mut rng = fastrand::Rng::with_seed(0x6d6c6b656d);
    let mut checked = 0;
    for n in (1..=19).chain([8, 4, 1, 16]) {
        let pairs: Vec<(Vec<u8>, MlKemPrivateKey)> = (0..n).map(|_| random_key()).collect();
        let publics: Vec<&[u8]> = pairs.iter().map(|(p, _)| p.as_slice()).collect();
        let entropy: Vec<[u8; 32]> = (0..n)
            .map(|_| {
                let mut m = [0u8; 32];
                rng.fill(&mut m);
                m
            })
            .collect();
        let mut first = None;
        for cpu in engines() {
            let (cts, secrets, ok) = encap_with(cpu, &publics, &entropy);
            assert!(ok.iter().all(|&x| x));
            for (i, ((_, private), ct)) in pairs.iter().zip(&cts).enumerate() {
                let ss = private.decapsulate(ct).expect("decapsulate");
                assert_eq!(&ss[..], &secrets[i][..], "batch of {n}, op {i}");
                checked += 1;
            }
            let (one_ct, one_ss, _) = encap_with(cpu, &publics[..1], &entropy[..1]);
            assert_eq!((one_ct[0], one_ss[0]), (cts[0], secrets[0]));
            let first = first.get_or_insert_with(|| (cts.clone(), secrets.clone()));
            assert!(first.0 == cts && first.1 == secrets, "the kernels agree, batch of {n}");
        }
    }
    assert!(checked > 200);
}

/// A key with a coefficient not below q fails alone; its batch mates
/// still encapsulate.
#[test]
fn an_invalid_key_fails_alone() {
    if !available() {
        return;
    }
    let (good, private) = random_key();
    assert!(check_public_key(&good));
    let mut bad = good.clone();
    bad[0] = 0xff;
    bad[1] |= 0x0f; // first coefficient 4095
    assert!(!check_public_key(&bad));
    assert!(!check_public_key(&good[..100]));
    let (cts, secrets, ok) = encap_all(&[&good, &bad, &good[..1183], &good], &[[1; 32], [2; 32], [3; 32], [4; 32]]);
    assert_eq!(ok, [true, false, false, true]);
    for i in [0, 3] {
        assert_eq!(&private.decapsulate(&cts[i]).expect("decapsulate")[..], &secrets[i][..]);
    }
    assert_eq!(secrets[1], [0; 32], "nothing written for an invalid key");
}
