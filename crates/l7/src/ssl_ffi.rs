//! What the L7 plane asks of BoringSSL that the `boring` crate does not
//! wrap. Every `unsafe` block of the crate is here.
#![allow(unsafe_code)]

use boring::ssl::SslRef;
use foreign_types::ForeignTypeRef;

/// Lets BoringSSL free the handshake's copy of the configuration (the
/// certificate slots, the cipher, group and ALPN lists) once the
/// handshake is done: a server never renegotiates, and nothing reads that
/// configuration after the handshake. An idle TLS connection holds about
/// 1.3 KB less (docs/BENCHMARKS.md). Called before the handshake ends: the
/// shedding happens at its end.
pub fn shed_handshake_config(ssl: &mut SslRef) {
    // SAFETY: `ssl` is a live SSL, borrowed mutably for the call;
    // SSL_set_shed_handshake_config only sets a flag in its configuration
    // (and does nothing if that is already gone).
    unsafe { boring_sys::SSL_set_shed_handshake_config(ssl.as_ptr(), 1) }
}

/// Lets a context's handshakes take 0-RTT data (QUIC with `early_data`).
/// BoringSSL reads the flag from the context a handshake switches to by
/// SNI, so every certificate's context needs it, not only the base one.
pub fn enable_early_data(ctx: &mut boring::ssl::SslContextBuilder) {
    // SAFETY: `ctx` is a live SSL_CTX, borrowed mutably for the call;
    // SSL_CTX_set_early_data_enabled only sets a flag on it.
    unsafe { boring_sys::SSL_CTX_set_early_data_enabled(ctx.as_ptr(), 1) }
}

/// Hands BoringSSL handshake hints (`SSL_set_handshake_hints`, in its
/// serialized form): here, the server's key share computed in lanes. Only
/// during the handshake (the certificate-selection callback); BoringSSL
/// copies the bytes. False if it refused them.
pub fn set_handshake_hints(ssl: &mut SslRef, hints: &[u8]) -> bool {
    // SAFETY: `ssl` is a live SSL borrowed mutably for the call; `hints`
    // is a valid slice for its length, which BoringSSL reads and copies
    // before returning.
    unsafe { boring_sys::SSL_set_handshake_hints(ssl.as_ptr(), hints.as_ptr(), hints.len()) == 1 }
}

/// Whether BoringSSL runs AES-GCM in hardware on this CPU (AES-NI and
/// carry-less multiplication on x86).
pub fn aes_hardware() -> bool {
    // SAFETY: EVP_has_aes_hardware takes nothing and reads BoringSSL's CPU
    // capability flags, which the library sets up before any SSL exists.
    unsafe { boring_sys::EVP_has_aes_hardware() == 1 }
}

/// A context's TLS 1.3 suites, in the server's strict order of preference
/// (code points BoringSSL knows: 0x1301–0x1303). False if it refused them.
pub fn set_tls13_ciphers(ctx: &mut boring::ssl::SslContextBuilder, ids: &[u16]) -> bool {
    // SAFETY: `ctx` is a live SSL_CTX borrowed mutably for the call; `ids`
    // is a valid slice for its length, which BoringSSL checks and copies; a
    // null flags pointer means no equal-preference groups.
    unsafe { boring_sys::SSL_CTX_set1_tls13_ciphers(ctx.as_ptr(), ids.as_ptr(), std::ptr::null(), ids.len()) == 1 }
}

/// Gives this handshake BoringSSL's default TLS 1.3 order back, which
/// leaves the choice among the suites to the client. Only before BoringSSL
/// picks the suite (the certificate-selection callback).
pub fn tls13_client_order(ssl: &mut SslRef) {
    // SAFETY: `ssl` is a live SSL borrowed mutably for the call; with no
    // suites BoringSSL reads neither pointer and installs its default list.
    unsafe { boring_sys::SSL_set1_tls13_ciphers(ssl.as_ptr(), std::ptr::null(), std::ptr::null(), 0) };
}
