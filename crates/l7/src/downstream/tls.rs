//! TLS termination: certificates, per-listener acceptors, SNI selection.
//!
//! Each HTTPS listener gets one `SslAcceptor` per snapshot plus one full
//! `SslContext` per certificate, all built by [`configure`] so that the
//! listener's settings (versions, ciphers, ALPN, tickets) hold whichever
//! certificate is picked. The select-certificate callback, which runs before
//! BoringSSL processes the ClientHello, looks the SNI name up in an immutable
//! [`CertTable`] and switches the connection to that certificate's context.
//! When a name has both an ECDSA and an RSA certificate, ECDSA is chosen if
//! the client offers an ECDSA signature algorithm (and, for TLS 1.2 only
//! clients, an ECDHE-ECDSA cipher suite).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use boring::asn1::{Asn1Integer, Asn1Time};
use boring::bn::BigNum;
use boring::ec::{EcGroup, EcKey};
use boring::hash::MessageDigest;
use boring::nid::Nid;
use boring::pkey::{Id, PKey, Private};
use boring::ssl::{
    AlpnError, ClientHello, ExtensionType, NameType, SslAcceptor, SslContext, SslContextBuilder, SslMethod, SslOptions,
    SslSessionCacheMode, SslVersion, select_next_proto,
};
use boring::x509::extension::{BasicConstraints, ExtendedKeyUsage, SubjectAlternativeName};
use boring::x509::{X509, X509NameBuilder};
use gatehouse_config::{Certificate, FieldError, KeyProvider, ListenerTls, TlsVersion};
use gatehouse_keyops::share::Hint;
use gatehouse_keyops::{EcdsaKey, EcdsaProvider, Engine, KeyMethod, Provider, RsaKey, RsaProvider, Shares};

use super::key_share;

/// A certificate and key loaded from disk, checked to belong together.
#[derive(Clone)]
pub struct LoadedCert {
    pub name: String,
    pub chain: Vec<X509>,
    pub key: PKey<Private>,
    pub sni: Vec<String>,
    pub is_ecdsa: bool,
    /// The leaf certificate's notAfter, Unix seconds.
    pub not_after: i64,
    /// For keys on the multi-buffer engine (RSA, ECDSA P-256): the asynchronous key method.
    /// `None`: BoringSSL uses the key directly.
    pub provider: Option<Arc<dyn Provider>>,
    /// Where the TLS 1.3 key shares of handshakes with this certificate are
    /// computed: `key_provider` resolved on this CPU.
    pub shares: Shares,
}

/// Loads (or for `self_signed`, generates on first use) every certificate.
/// Every problem is an error at its field (`certificates[2].key`).
/// `generate` is false for `gatehouse check`, which must not write files.
pub fn load_certificates(
    certs: &[Certificate],
    base_dir: &Path,
    data_dir: &Path,
    generate: bool,
) -> Result<Vec<LoadedCert>, Vec<FieldError>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, c) in certs.iter().enumerate() {
        let path = |field: &str| format!("certificates[{i}].{field}");
        let mut error =
            |field: &str, message: String| errors.push(FieldError { path: path(field), message, line: None });
        let (cert_file, key_file) = if c.self_signed {
            let cert_file = data_dir.join(format!("{}.crt", c.name));
            let key_file = data_dir.join(format!("{}.key", c.name));
            if !cert_file.exists() || !key_file.exists() {
                if !generate {
                    continue; // made at start-up; nothing to check yet
                }
                if let Err(e) = write_self_signed(&c.sni, &cert_file, &key_file) {
                    let why = format!("cannot create a self-signed certificate in {}: {e}", data_dir.display());
                    error("self_signed", why);
                    continue;
                }
            }
            (Pem::File(cert_file), Pem::File(key_file))
        } else {
            let (Some(cert), Some(key)) = (&c.cert, &c.key) else { continue };
            (Pem::of(base_dir, cert), Pem::of(base_dir, key))
        };
        match load_pair(&cert_file, &key_file) {
            Ok((chain, key)) => {
                let is_ecdsa = key.id() == Id::EC;
                if !is_ecdsa && key.id() != Id::RSA {
                    error("key", "expected an RSA or ECDSA private key".into());
                    continue;
                }
                let (provider, shares) = match key_provider(c, &key, is_ecdsa) {
                    Ok(p) => p,
                    Err(e) => {
                        error("key_provider", e.to_string());
                        continue;
                    }
                };
                let not_after = chain.first().map_or(0, |leaf| unix_seconds(leaf.not_after()));
                out.push(LoadedCert {
                    name: c.name.clone(),
                    chain,
                    key,
                    sni: c.sni.clone(),
                    is_ecdsa,
                    not_after,
                    provider,
                    shares,
                });
            }
            Err((field, msg)) => error(field, msg),
        }
    }
    if errors.is_empty() { Ok(out) } else { Err(errors) }
}

/// An ASN.1 time as Unix seconds (0 if it cannot be read).
fn unix_seconds(t: &boring::asn1::Asn1TimeRef) -> i64 {
    let Ok(epoch) = Asn1Time::from_unix(0) else { return 0 };
    epoch.diff(t).map_or(0, |d| i64::from(d.days) * 86_400 + i64::from(d.secs))
}

/// The engine for a certificate's key: `None` keeps BoringSSL's own signing
/// (ECDSA keys, and RSA on `boring`); RSA on `mb` gets a batched provider.
/// And where its handshakes' key shares are made.
fn key_provider(
    c: &Certificate,
    key: &PKey<Private>,
    is_ecdsa: bool,
) -> Result<(Option<Arc<dyn Provider>>, Shares), TlsError> {
    let engine = gatehouse_keyops::resolve(c.key_provider)?;
    let shares = Shares::place(c.key_provider, engine);
    match shares {
        Shares::Lanes => tracing::info!(
            certificate = %c.name,
            "TLS 1.3 X25519 and X25519MLKEM768 key shares in AVX-512 IFMA lanes, batched per worker"
        ),
        Shares::Kem => tracing::info!(
            certificate = %c.name,
            kernels = Shares::kernels(),
            "TLS 1.3 X25519MLKEM768 key shares: ML-KEM-768 in Gatehouse's vector kernels, X25519 in BoringSSL"
        ),
        Shares::Boring => {}
    }
    Ok((signer(c, key, is_ecdsa, engine)?, shares))
}

fn signer(
    c: &Certificate,
    key: &PKey<Private>,
    is_ecdsa: bool,
    engine: Engine,
) -> Result<Option<Arc<dyn Provider>>, TlsError> {
    if engine == Engine::Boring {
        let why = match c.key_provider {
            KeyProvider::Auto => "key_provider auto: this CPU has no AVX-512 IFMA",
            _ => "key_provider boring",
        };
        tracing::info!(
            certificate = %c.name,
            provider = "boring",
            "{} key on BoringSSL, one operation at a time ({why})",
            if is_ecdsa { "ECDSA" } else { "RSA" },
        );
        return Ok(None);
    }
    if is_ecdsa {
        return match EcdsaKey::new(key, engine) {
            Ok(k) => {
                tracing::info!(
                    certificate = %c.name,
                    provider = "mb",
                    "ECDSA P-256 key on mb (AVX-512 IFMA multi-buffer, batched per worker)"
                );
                Ok(Some(Arc::new(EcdsaProvider::new(k))))
            }
            Err(gatehouse_keyops::KeyError::NotEcdsaP256) => {
                tracing::warn!(certificate = %c.name, "not a P-256 key: its signatures stay on boring");
                Ok(None)
            }
            Err(e) => Err(e.into()),
        };
    }
    let (rsa, note) = RsaKey::new(key, engine)?;
    if let Some(note) = note {
        tracing::warn!(certificate = %c.name, "{note}");
    }
    tracing::info!(
        certificate = %c.name,
        provider = rsa.engine().name(),
        "RSA-{} key on {} ({})",
        rsa.bits(),
        rsa.engine().name(),
        if rsa.engine() == Engine::Mb { "AVX-512 IFMA multi-buffer, batched per worker" } else { "one operation at a time" }
    );
    if rsa.engine() == Engine::Boring {
        return Ok(None);
    }
    Ok(Some(Arc::new(RsaProvider::new(rsa))))
}

/// Installs the certificate's private key: directly, or through its provider.
fn install_key(b: &mut SslContextBuilder, cert: &LoadedCert) -> Result<(), TlsError> {
    match &cert.provider {
        Some(p) => b.set_async_private_key_method(KeyMethod::new(p.clone())),
        None => {
            b.set_private_key(&cert.key).map_err(tls_err)?;
            b.check_private_key().map_err(tls_err)?;
        }
    }
    Ok(())
}

/// A failed load: the field at fault (`cert` or `key`) and why.
type LoadError = (&'static str, String);

/// Where a certificate's or key's PEM comes from: a file, or the config value
/// itself when it starts with `-----BEGIN` (how the admin API sends them).
enum Pem {
    File(PathBuf),
    Inline(String),
}

impl Pem {
    fn of(base_dir: &Path, value: &str) -> Pem {
        if value.trim_start().starts_with("-----BEGIN") {
            Pem::Inline(value.to_string())
        } else {
            Pem::File(gatehouse_plane::resolve(base_dir, value))
        }
    }

    fn describe(&self) -> String {
        match self {
            Pem::File(p) => p.display().to_string(),
            Pem::Inline(_) => "the inline PEM".into(),
        }
    }

    fn read(&self, field: &'static str) -> Result<Vec<u8>, LoadError> {
        match self {
            Pem::File(p) => std::fs::read(p).map_err(|e| (field, format!("cannot read {}: {e}", p.display()))),
            Pem::Inline(text) => Ok(text.as_bytes().to_vec()),
        }
    }
}

fn load_pair(cert_src: &Pem, key_src: &Pem) -> Result<(Vec<X509>, PKey<Private>), LoadError> {
    let cert_pem = cert_src.read("cert")?;
    let chain = X509::stack_from_pem(&cert_pem)
        .ok()
        .filter(|c| !c.is_empty())
        .ok_or(("cert", format!("{} holds no PEM certificate", cert_src.describe())))?;
    let key_pem = key_src.read("key")?;
    let key = PKey::private_key_from_pem(&key_pem)
        .map_err(|_| ("key", format!("{} holds no PEM private key", key_src.describe())))?;
    let matches = chain[0].public_key().map(|pk| pk.public_eq(&key)).unwrap_or(false);
    if !matches {
        return Err((
            "key",
            format!("{} does not belong to the certificate in {}", key_src.describe(), cert_src.describe()),
        ));
    }
    Ok((chain, key))
}

/// Writes a self-signed ECDSA P-256 certificate for `names`, valid one year.
pub fn write_self_signed(names: &[String], cert_file: &Path, key_file: &Path) -> Result<(), TlsError> {
    let err = tls_err;
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).map_err(err)?;
    let key = PKey::from_ec_key(EcKey::generate(&group).map_err(err)?).map_err(err)?;
    let mut name = X509NameBuilder::new().map_err(err)?;
    let cn = names.first().map_or("gatehouse", String::as_str);
    name.append_entry_by_nid(Nid::COMMONNAME, cn).map_err(err)?;
    name.append_entry_by_nid(Nid::ORGANIZATIONNAME, "Gatehouse self-signed").map_err(err)?;
    let name = name.build();
    let mut b = X509::builder().map_err(err)?;
    b.set_version(2).map_err(err)?;
    let mut serial = BigNum::new().map_err(err)?;
    serial.rand(127, boring::bn::MsbOption::MAYBE_ZERO, false).map_err(err)?;
    let serial: Asn1Integer = serial.to_asn1_integer().map_err(err)?;
    b.set_serial_number(&serial).map_err(err)?;
    b.set_subject_name(&name).map_err(err)?;
    b.set_issuer_name(&name).map_err(err)?;
    let not_before = Asn1Time::days_from_now(0).map_err(err)?;
    let not_after = Asn1Time::days_from_now(365).map_err(err)?;
    b.set_not_before(&not_before).map_err(err)?;
    b.set_not_after(&not_after).map_err(err)?;
    b.set_pubkey(&key).map_err(err)?;
    let mut san = SubjectAlternativeName::new();
    for n in names {
        san.dns(n);
    }
    let san = san.build(&b.x509v3_context(None, None)).map_err(err)?;
    b.append_extension(&san).map_err(err)?;
    let constraints = BasicConstraints::new().build().map_err(err)?;
    b.append_extension(&constraints).map_err(err)?;
    let usage = ExtendedKeyUsage::new().server_auth().build().map_err(err)?;
    b.append_extension(&usage).map_err(err)?;
    b.sign(&key, MessageDigest::sha256()).map_err(err)?;
    let cert = b.build();
    if let Some(dir) = cert_file.parent() {
        std::fs::create_dir_all(dir).map_err(|source| TlsError::Write { path: dir.to_path_buf(), source })?;
    }
    let key_pem = key.private_key_to_pem_pkcs8().map_err(err)?;
    write_private(key_file, &key_pem).map_err(|source| TlsError::Write { path: key_file.to_path_buf(), source })?;
    std::fs::write(cert_file, cert.to_pem().map_err(err)?)
        .map_err(|source| TlsError::Write { path: cert_file.to_path_buf(), source })?;
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(path)?;
    f.write_all(bytes)
}

/// A certificate's context, and where its handshakes' key shares are made.
type CertCtx = (SslContext, Shares);

/// The RSA and/or ECDSA context serving one name.
#[derive(Clone, Default)]
struct CertPair {
    ecdsa: Option<CertCtx>,
    rsa: Option<CertCtx>,
}

impl CertPair {
    fn set(&mut self, ecdsa: bool, ctx: CertCtx) {
        if ecdsa { self.ecdsa = Some(ctx) } else { self.rsa = Some(ctx) }
    }

    fn choose(&self, ecdsa_ok: bool) -> Option<&CertCtx> {
        match (&self.ecdsa, &self.rsa) {
            (Some(e), Some(r)) => Some(if ecdsa_ok { e } else { r }),
            (Some(e), None) => Some(e),
            (None, r) => r.as_ref(),
        }
    }
}

/// SNI name → certificate contexts, for one listener. Immutable once built.
#[derive(Default)]
pub struct CertTable {
    exact: HashMap<String, CertPair>,
    /// Key: the part after `*.`; matches exactly one more label.
    wildcard: HashMap<String, CertPair>,
    default: CertPair,
}

impl CertTable {
    fn lookup(&self, sni: Option<&str>) -> &CertPair {
        let Some(name) = sni else { return &self.default };
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(p) = self.exact.get(&name) {
            return p;
        }
        if let Some((_, parent)) = name.split_once('.')
            && let Some(p) = self.wildcard.get(parent)
        {
            return p;
        }
        &self.default
    }
}

/// What an HTTPS listener needs at accept time.
pub struct ListenerTlsState {
    pub acceptor: SslAcceptor,
}

/// Why a listener's TLS contexts or a certificate could not be made. The
/// config check reports it at the listener or certificate it is about.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("BoringSSL refused it: {0}")]
    Boring(#[from] boring::error::ErrorStack),
    #[error("no usable cipher in {0:?}")]
    Ciphers(String),
    #[error("no certificate available for this listener")]
    NoCertificate,
    #[error(transparent)]
    Key(#[from] gatehouse_keyops::KeyError),
    #[error("QUIC: {0}")]
    Quic(String),
    #[error("cannot write {path}: {source}")]
    Write { path: std::path::PathBuf, source: std::io::Error },
}

fn tls_err(e: boring::error::ErrorStack) -> TlsError {
    TlsError::Boring(e)
}

/// Wire form of the ALPN list: length-prefixed names.
fn alpn_wire(alpn: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in alpn {
        out.push(p.len() as u8);
        out.extend_from_slice(p.as_bytes());
    }
    out
}

/// Applies a listener's TLS settings to a context builder. Every context of
/// a listener goes through here, so a switched-to context behaves the same.
fn configure(b: &mut SslContextBuilder, tls: &ListenerTls) -> Result<(), TlsError> {
    let version = |v: TlsVersion| match v {
        TlsVersion::Tls12 => SslVersion::TLS1_2,
        TlsVersion::Tls13 => SslVersion::TLS1_3,
    };
    b.set_min_proto_version(Some(version(tls.min_version))).map_err(tls_err)?;
    b.set_max_proto_version(Some(version(tls.max_version))).map_err(tls_err)?;
    if let Some(ciphers) = &tls.ciphers {
        b.set_cipher_list(ciphers).map_err(|_| TlsError::Ciphers(ciphers.clone()))?;
    }
    // TLS 1.3 suites: the listener's own order, or Go's (AES-128-GCM first
    // where the CPU has AES instructions; [`base_context`] gives a client
    // that lists ChaCha20-Poly1305 first its own order back).
    let ids: Vec<u16> = match &tls.tls13_ciphers[..] {
        [] if crate::ssl_ffi::aes_hardware() => GO_TLS13_ORDER.to_vec(),
        [] => Vec::new(),
        own => own.iter().map(|c| c.id()).collect(),
    };
    if !ids.is_empty() && !crate::ssl_ffi::set_tls13_ciphers(b, &ids) {
        return Err(TlsError::Ciphers(format!("{ids:04x?}")));
    }
    if tls.session_resumption {
        b.set_session_cache_mode(SslSessionCacheMode::SERVER);
        b.set_session_id_context(b"gatehouse").map_err(tls_err)?;
    } else {
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_options(SslOptions::NO_TICKET);
    }
    b.set_options(SslOptions::CIPHER_SERVER_PREFERENCE);
    let wire: Arc<[u8]> = alpn_wire(&tls.alpn).into();
    b.set_alpn_select_callback(move |_, client| {
        // The client's list outlives the callback, our list is ours: copy the
        // chosen name's position from the client's list.
        match select_next_proto(&wire, client) {
            Some(chosen) => find_in(client, chosen).ok_or(AlpnError::NOACK),
            None => Err(AlpnError::NOACK),
        }
    });
    Ok(())
}

/// Returns the slice of `client` equal to `chosen` (both are ALPN names).
fn find_in<'a>(client: &'a [u8], chosen: &[u8]) -> Option<&'a [u8]> {
    let mut rest = client;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len);
        if tail.len() < len {
            return None;
        }
        let (name, next) = tail.split_at(len);
        if name == chosen {
            return Some(name);
        }
        rest = next;
    }
    None
}

/// Which side of a listener a context serves: TCP, or QUIC with or
/// without 0-RTT.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Tcp,
    Quic { early_data: bool },
}

fn cert_context(tls: &ListenerTls, cert: &LoadedCert, side: Side) -> Result<SslContext, TlsError> {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).map_err(tls_err)?;
    configure(&mut b, tls)?;
    if let Side::Quic { early_data } = side {
        quic_handshake::report_done(&mut b);
        if early_data {
            crate::ssl_ffi::enable_early_data(&mut b);
        }
    }
    b.set_certificate(&cert.chain[0]).map_err(tls_err)?;
    for extra in &cert.chain[1..] {
        b.add_extra_chain_cert(extra.clone()).map_err(tls_err)?;
    }
    install_key(&mut b, cert)?;
    Ok(b.build().into_context())
}

/// A listener's SNI table, and the certificate its base context carries
/// so that a handshake the callback leaves alone still has one.
fn cert_table<'a>(
    tls: &ListenerTls,
    certs: &'a [LoadedCert],
    side: Side,
) -> Result<(CertTable, &'a LoadedCert), TlsError> {
    let default_name = tls.default_certificate.as_deref().or(certs.first().map(|c| c.name.as_str()));
    let default_cert = certs.iter().find(|c| Some(c.name.as_str()) == default_name).ok_or(TlsError::NoCertificate)?;
    let mut table = CertTable::default();
    for cert in certs {
        let ctx = (cert_context(tls, cert, side)?, cert.shares);
        for name in &cert.sni {
            let name = name.to_ascii_lowercase();
            let slot = match name.strip_prefix("*.") {
                Some(parent) => table.wildcard.entry(parent.to_string()).or_default(),
                None => table.exact.entry(name).or_default(),
            };
            slot.set(cert.is_ecdsa, ctx.clone());
        }
        if cert.name == default_cert.name {
            table.default.set(cert.is_ecdsa, ctx);
        }
    }
    Ok((table, default_cert))
}

/// Makes `b` a listener's base context: its settings, the select-certificate
/// callback that switches each handshake to its certificate's context, and
/// the default certificate. `quic`: the handshake runs under quiche, which
/// does not give BoringSSL's asynchronous key methods the task to wake, so
/// the callback hands them the QUIC connection's ([`quic_handshake`]).
fn base_context(
    b: &mut SslContextBuilder,
    tls: &ListenerTls,
    certs: &[LoadedCert],
    side: Side,
) -> Result<(), TlsError> {
    let (table, default_cert) = cert_table(tls, certs, side)?;
    configure(b, tls)?;
    let quic = side != Side::Tcp;
    if quic {
        quic_handshake::report_done(b);
    }
    let table = Arc::new(table);
    // Go's TLS 1.3 order is on the context ([`configure`]) unless the
    // listener sets its own: a client that lists ChaCha20-Poly1305 first
    // gets the choice back.
    let go_order = tls.tls13_ciphers.is_empty() && crate::ssl_ffi::aes_hardware();
    // Asynchronous: the handshake waits for the key share's batch. The
    // switch to the certificate's context waits too, in the finishing step:
    // BoringSSL calls the callback of the context it is on when it retries,
    // and the certificates' contexts have none.
    let selection = move |hello: &mut ClientHello<'_>| {
        if go_order && !aes_gcm_first(hello.ciphers()) {
            crate::ssl_ffi::tls13_client_order(hello.ssl_mut());
        }
        let chosen = choose(&table, hello).cloned();
        let (job, now) = match &chosen {
            Some((_, Shares::Lanes)) => match key_share::start(hello) {
                Some(job) => (Some(job), None),
                None => (None, key_share::tls12_ecdhe(hello).map(|h| (h, Shares::Lanes))),
            },
            Some((_, Shares::Kem)) => (None, key_share::compute_now(hello).map(|s| (Hint::Share(s), Shares::Kem))),
            _ => (None, None),
        };
        key_share::finish(job, now, chosen.map(|(ctx, _)| ctx))
    };
    if quic {
        // quiche sets no task waker: the QUIC connection's is handed over
        // here, for this future and for the asynchronous key methods.
        b.set_select_certificate_callback(move |mut hello: ClientHello<'_>| {
            let waker = quic_handshake::current_waker();
            hello.ssl_mut().set_task_waker(Some(waker.clone()));
            key_share::drive(hello, &waker, &selection)
        });
    } else {
        b.set_async_select_certificate_callback(move |hello: &mut ClientHello<'_>| Ok(selection(hello)));
    }
    b.set_certificate(&default_cert.chain[0]).map_err(tls_err)?;
    install_key(b, default_cert)?;
    Ok(())
}

/// The certificate for the handshake's SNI name and the client's signature
/// algorithms, and where its key share is made.
fn choose<'t>(table: &'t CertTable, hello: &ClientHello<'_>) -> Option<&'t CertCtx> {
    let sni = hello.servername(NameType::HOST_NAME);
    table.lookup(sni).choose(client_accepts_ecdsa(hello))
}

/// Builds a listener's acceptor and its SNI table.
pub fn build_listener_tls(tls: &ListenerTls, certs: &[LoadedCert]) -> Result<ListenerTlsState, TlsError> {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).map_err(tls_err)?;
    base_context(&mut b, tls, certs, Side::Tcp)?;
    Ok(ListenerTlsState { acceptor: b.build() })
}

/// The TLS context of a listener's HTTP/3 side, for quiche: the same
/// certificates, SNI choice and key engines as its TCP side, TLS 1.3 only
/// (QUIC has no other) and ALPN `h3`.
pub fn build_quic_tls(
    tls: &ListenerTls,
    certs: &[LoadedCert],
    early_data: bool,
) -> Result<SslContextBuilder, TlsError> {
    let quic = ListenerTls {
        min_version: TlsVersion::Tls13,
        max_version: TlsVersion::Tls13,
        alpn: vec!["h3".into()],
        ..tls.clone()
    };
    let mut b = SslContextBuilder::new(SslMethod::tls()).map_err(tls_err)?;
    base_context(&mut b, &quic, certs, Side::Quic { early_data })?;
    Ok(b)
}

/// What a QUIC handshake running under quiche on this thread needs from
/// BoringSSL's callbacks, which quiche does not expose: the connection's
/// waker for the asynchronous key methods (the batched RSA engine wakes it
/// when a key operation completes, and quiche resumes the handshake on the
/// connection's next send), and the version and cipher of a handshake
/// just done, for the counters.
pub mod quic_handshake {
    use std::cell::{Cell, RefCell};
    use std::task::Waker;

    use boring::ssl::{SslContextBuilder, SslInfoCallbackMode};

    thread_local! {
        static WAKER: RefCell<Option<Waker>> = const { RefCell::new(None) };
        static DONE: Cell<Option<(&'static str, &'static str)>> = const { Cell::new(None) };
    }

    /// Runs `f` (which drives quiche) with `waker` as the connection's.
    pub fn with<R>(waker: &Waker, f: impl FnOnce() -> R) -> R {
        WAKER.with(|c| *c.borrow_mut() = Some(waker.clone()));
        let r = f();
        WAKER.with(|c| *c.borrow_mut() = None);
        r
    }

    /// The current connection's waker; outside [`with`] (which does not
    /// happen) a no-op one, and the handshake resumes on the next packet
    /// or timer.
    pub fn current_waker() -> Waker {
        WAKER.with(|c| c.borrow().clone()).unwrap_or_else(|| Waker::noop().clone())
    }

    /// The version and cipher of the handshake that completed on this
    /// thread since the last call.
    pub fn take_done() -> Option<(&'static str, &'static str)> {
        DONE.with(Cell::take)
    }

    /// On a handshake's end: its key share counted, its version and cipher
    /// kept for [`take_done`].
    pub(super) fn report_done(b: &mut SslContextBuilder) {
        b.set_info_callback(|ssl, mode, _| {
            if mode != SslInfoCallbackMode::HANDSHAKE_DONE {
                return;
            }
            if let Some(group) = ssl.curve() {
                gatehouse_keyops::stats::record_key_share(group, crate::downstream::key_share::engine_used(ssl));
            }
            let cipher = ssl.current_cipher().map_or("-", |c| c.name());
            DONE.with(|d| d.set(Some((ssl.version_str(), cipher))));
        });
    }
}

/// Whether the ClientHello lets us answer with an ECDSA P-256 certificate.
fn client_accepts_ecdsa(hello: &ClientHello<'_>) -> bool {
    let Some(sigalgs) = hello.get_extension(ExtensionType::SIGNATURE_ALGORITHMS) else {
        // No extension: TLS 1.2 defaults to SHA-1 pairs of the suite's kind.
        return offers_ecdsa_suite(hello.ciphers());
    };
    if sigalgs.len() < 2 {
        return false;
    }
    let list = &sigalgs[2..];
    let tls13_only = list.chunks_exact(2).any(|c| c == [0x04, 0x03]);
    // ecdsa_secp256r1_sha256 (0x0403) is the TLS 1.3 name; in TLS 1.2 any
    // (hash, ecdsa=3) pair works with a P-256 key.
    let any_ecdsa = list.chunks_exact(2).any(|c| c[1] == 0x03);
    if key_share::offers_tls13(hello) { tls13_only } else { any_ecdsa && offers_ecdsa_suite(hello.ciphers()) }
}

/// TLS 1.3 suites in Go's server order on a CPU with AES instructions:
/// AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305.
const GO_TLS13_ORDER: [u16; 3] = [0x1301, 0x1302, 0x1303];

/// Whether the client's first choice among the TLS 1.3 suites is AES-GCM
/// (either size). Such a client gets AES-128-GCM with SHA-256 where the
/// CPU has AES instructions, as Go's crypto/tls (Caddy) serves it: OpenSSL
/// clients (curl, Python, Node.js, wrk) list AES-256-GCM with SHA-384
/// first, and BoringSSL's SHA-512 has no vector path on AMD CPUs, where
/// it was 11% of a handshake's CPU (docs/BENCHMARKS.md). A client that
/// puts ChaCha20-Poly1305 first (a phone without AES instructions) keeps
/// its choice, and one that offers only AES-256-GCM gets it.
fn aes_gcm_first(ciphers: &[u8]) -> bool {
    ciphers
        .chunks_exact(2)
        .find_map(|c| match c {
            [0x13, 0x01] | [0x13, 0x02] => Some(true),
            [0x13, 0x03] => Some(false),
            _ => None,
        })
        .unwrap_or(false)
}

fn offers_ecdsa_suite(ciphers: &[u8]) -> bool {
    const ECDSA_SUITES: [[u8; 2]; 6] =
        [[0xc0, 0x2b], [0xc0, 0x2c], [0xcc, 0xa9], [0xc0, 0x09], [0xc0, 0x0a], [0xc0, 0x23]];
    ciphers.chunks_exact(2).any(|c| ECDSA_SUITES.iter().any(|s| s == c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_tls13_suite_the_client_lists_decides() {
        // OpenSSL's default: AES-256-GCM, ChaCha20, AES-128-GCM (GREASE and
        // TLS 1.2 suites around them are skipped).
        assert!(aes_gcm_first(&[0x0a, 0x0a, 0x13, 0x02, 0x13, 0x03, 0x13, 0x01, 0xc0, 0x2c]));
        assert!(aes_gcm_first(&[0x13, 0x01, 0x13, 0x03]));
        assert!(!aes_gcm_first(&[0xc0, 0x2b, 0x13, 0x03, 0x13, 0x01]), "ChaCha20 first");
        assert!(!aes_gcm_first(&[0xc0, 0x2b, 0xc0, 0x2c]), "TLS 1.2 only");
        assert!(!aes_gcm_first(&[0x13]), "odd length");
    }

    #[test]
    fn alpn_lists_are_matched_by_name() {
        let client = b"\x02h2\x08http/1.1";
        assert_eq!(find_in(client, b"http/1.1"), Some(&b"http/1.1"[..]));
        assert_eq!(find_in(client, b"h3"), None);
        assert_eq!(find_in(b"\x05h2", b"h2"), None, "truncated list");
        assert_eq!(alpn_wire(&["h2".into(), "http/1.1".into()]), client.to_vec());
    }

    #[test]
    fn self_signed_certificates_load_back() {
        let dir = std::env::temp_dir().join(format!("gh-tls-{}", std::process::id()));
        let names = vec!["localhost".to_string(), "*.example.test".to_string()];
        let certs = [Certificate { name: "local".into(), self_signed: true, sni: names.clone(), ..Default::default() }];
        let loaded = load_certificates(&certs, &dir, &dir, true).expect("generated");
        assert!(loaded[0].is_ecdsa);
        let first = std::fs::read(dir.join("local.crt")).expect("written");
        // A second start reuses the files.
        let again = load_certificates(&certs, &dir, &dir, true).expect("loaded");
        assert_eq!(std::fs::read(dir.join("local.crt")).expect("kept"), first);
        let sans: Vec<String> = again[0].chain[0]
            .subject_alt_names()
            .expect("san")
            .iter()
            .filter_map(|n| n.dnsname().map(str::to_string))
            .collect();
        assert_eq!(sans, names);
        let tls = ListenerTls::default();
        assert!(build_listener_tls(&tls, &again).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn mismatched_key_is_refused_with_the_field() {
        let dir = std::env::temp_dir().join(format!("gh-tls-mm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        write_self_signed(&["a.test".into()], &dir.join("a.crt"), &dir.join("a.key")).expect("a");
        write_self_signed(&["b.test".into()], &dir.join("b.crt"), &dir.join("b.key")).expect("b");
        let certs = [Certificate {
            name: "x".into(),
            cert: Some("a.crt".into()),
            key: Some("b.key".into()),
            ..Default::default()
        }];
        let errs = load_certificates(&certs, &dir, &dir, false).err().expect("refused");
        assert_eq!(errs[0].path, "certificates[0].key");
        assert!(errs[0].message.contains("does not belong"), "{}", errs[0].message);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
