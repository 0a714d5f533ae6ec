//! The TLS 1.3 key share in the worker's IFMA lanes, handed to BoringSSL as
//! a handshake hint (see `gatehouse_keyops::share`).
//!
//! The listener's certificate-selection callback, which runs before
//! BoringSSL processes the ClientHello, starts the share when the chosen
//! certificate's key provider resolves to `mb`, and the handshake waits
//! (BoringSSL's "pending certificate") until the batch has run. When the
//! handshake ends, [`engine_used`] tells whether BoringSSL took the hint,
//! for `gatehouse_tls_key_shares_total`.

use std::future::Future;
use std::sync::OnceLock;

use boring::ex_data::Index;
use boring::ssl::{
    AsyncSelectCertError, BoxSelectCertFinish, BoxSelectCertFuture, ClientHello, ExtensionType, Ssl, SslContext,
    SslRef, SslVersion,
};
use gatehouse_keyops::share::{self, Share};
use gatehouse_keyops::{Engine, Error};

/// Per connection: the group whose share was hinted.
fn hinted_index() -> Index<Ssl, u16> {
    static INDEX: OnceLock<Index<Ssl, u16>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("BoringSSL allocates an ex_data index"))
}

/// The share to compute for this ClientHello, if BoringSSL will do TLS 1.3
/// with X25519 or X25519MLKEM768 and the client sent that share.
pub fn start(hello: &ClientHello<'_>) -> Option<impl Future<Output = Result<Share, Error>> + Send + use<>> {
    let tls13 = hello
        .get_extension(ExtensionType::SUPPORTED_VERSIONS)
        .is_some_and(|v| v.len() > 1 && v[1..].chunks_exact(2).any(|c| c == [0x03, 0x04]));
    if !tls13 || hello.ssl().max_proto_version() != Some(SslVersion::TLS1_3) {
        return None;
    }
    let group = share::predict(hello.get_extension(ExtensionType::SUPPORTED_GROUPS)?)?;
    let peer = share::client_share(hello.get_extension(ExtensionType::KEY_SHARE)?, group)?;
    share::start(group, peer)
}

/// The callback's future: waits for the share (if one was started), then
/// switches the handshake to its certificate's context `ctx` and hands
/// BoringSSL the share. A share that failed (a small-order point, a
/// dropped batch) leaves the computation to BoringSSL.
pub fn finish(
    job: Option<impl Future<Output = Result<Share, Error>> + Send + 'static>,
    ctx: Option<SslContext>,
) -> BoxSelectCertFuture {
    Box::pin(async move {
        let share = match job {
            Some(f) => f.await.inspect_err(|e| tracing::debug!(error = %e, "key share left to BoringSSL")).ok(),
            None => None,
        };
        let finish: BoxSelectCertFinish = Box::new(move |mut hello: ClientHello<'_>| {
            super::tls::switch_to(hello.ssl_mut(), ctx.as_ref()).ok_or(AsyncSelectCertError)?;
            if let Some(s) = share {
                apply(hello.ssl_mut(), &s)?;
            }
            Ok(())
        });
        Ok(finish)
    })
}

fn apply(ssl: &mut SslRef, s: &Share) -> Result<(), AsyncSelectCertError> {
    if !crate::ssl_ffi::set_handshake_hints(ssl, &s.hints_der()) {
        // BoringSSL parses what share.rs writes; if it ever refuses, the
        // handshake goes on without the hint.
        tracing::warn!(group = s.group, "BoringSSL refused the key-share hint");
        return Ok(());
    }
    ssl.set_ex_data(hinted_index(), s.group);
    Ok(())
}

/// Which engine computed a finished handshake's key share: the lanes when
/// BoringSSL used the hint (TLS 1.3, the hinted group).
pub fn engine_used(ssl: &SslRef) -> Engine {
    let hinted = ssl.ex_data(hinted_index()).copied();
    if hinted.is_some() && hinted == ssl.curve() && ssl.version2() == Some(SslVersion::TLS1_3) {
        Engine::Mb
    } else {
        Engine::Boring
    }
}
