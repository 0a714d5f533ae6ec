//! The TLS 1.3 key share made ahead of BoringSSL and handed to it as a
//! handshake hint (see `gatehouse_keyops::share`): in the worker's IFMA
//! lanes, or for X25519MLKEM768 on a CPU without them, at once with the
//! ML-KEM-768 half in Gatehouse's vector kernels.
//!
//! The listener's certificate-selection callback, which runs before
//! BoringSSL processes the ClientHello, starts the share when the chosen
//! certificate's key provider resolves to `mb`, and the handshake waits
//! (BoringSSL's "pending certificate") until the batch has run: on TCP
//! through BoringSSL's asynchronous callback, on QUIC through [`drive`].
//! Under `auto` without IFMA the callback computes the share itself
//! ([`compute_now`]). A TLS 1.2 handshake over X25519 gets its ECDHE key
//! pair the same way, made ahead in the lanes ([`tls12_ecdhe`]). When the
//! handshake ends, [`engine_used`] tells whether BoringSSL took the hint,
//! for `gatehouse_tls_key_shares_total`.

use std::future::Future;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll, Waker};

use boring::ex_data::Index;
use boring::ssl::{
    AsyncSelectCertError, BoxSelectCertFinish, BoxSelectCertFuture, ClientHello, ExtensionType, SelectCertError, Ssl,
    SslContext, SslRef, SslVersion,
};
use gatehouse_keyops::share::{self, Hint, Share};
use gatehouse_keyops::{Error, Shares};

/// Per connection: the group whose share (or TLS 1.2 ECDHE key pair) was
/// hinted, where it was made, and whether it was for TLS 1.2.
type Hinted = (u16, Shares, bool);

fn hinted_index() -> Index<Ssl, Hinted> {
    static INDEX: OnceLock<Index<Ssl, Hinted>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("BoringSSL allocates an ex_data index"))
}

/// Whether the client lists TLS 1.3 in its `supported_versions`.
pub fn offers_tls13(hello: &ClientHello<'_>) -> bool {
    hello
        .get_extension(ExtensionType::SUPPORTED_VERSIONS)
        .is_some_and(|v| v.len() > 1 && v[1..].chunks_exact(2).any(|c| c == [0x03, 0x04]))
}

/// The share to compute for this ClientHello, if BoringSSL will do TLS 1.3
/// with X25519 or X25519MLKEM768 and the client sent that share.
pub fn start(hello: &ClientHello<'_>) -> Option<impl Future<Output = Result<Share, Error>> + Send + use<>> {
    let (group, peer) = predicted_share(hello)?;
    share::start(group, peer)
}

/// The share for this ClientHello made at once (`Shares::Kem`), if
/// BoringSSL will do TLS 1.3 with X25519MLKEM768 and the client sent it.
pub fn compute_now(hello: &ClientHello<'_>) -> Option<Share> {
    let (group, peer) = predicted_share(hello)?;
    let share = share::compute_now(group, peer);
    if share.is_none() && group == share::X25519_MLKEM768 {
        tracing::debug!("X25519MLKEM768 share left to BoringSSL");
    }
    share
}

/// An X25519 key pair made ahead in the lanes, if BoringSSL will do TLS 1.2
/// with ECDHE over X25519: the client does not offer TLS 1.3 (or the
/// listener stops at 1.2) and lists X25519 before the other groups of the
/// server's preference.
pub fn tls12_ecdhe(hello: &ClientHello<'_>) -> Option<Hint> {
    if offers_tls13(hello) && hello.ssl().max_proto_version() == Some(SslVersion::TLS1_3) {
        return None;
    }
    share::ecdhe(share::predict_tls12(hello.get_extension(ExtensionType::SUPPORTED_GROUPS)?)?)
}

/// The group BoringSSL will pick and the client's share of it, for a
/// TLS 1.3 handshake.
fn predicted_share<'h>(hello: &'h ClientHello<'_>) -> Option<(u16, &'h [u8])> {
    if !offers_tls13(hello) || hello.ssl().max_proto_version() != Some(SslVersion::TLS1_3) {
        return None;
    }
    let group = share::predict(hello.get_extension(ExtensionType::SUPPORTED_GROUPS)?)?;
    Some((group, share::client_share(hello.get_extension(ExtensionType::KEY_SHARE)?, group)?))
}

/// The callback's future: waits for the share (if one was started in the
/// lanes: `job`; `now`, a hint made at once and where), then switches the
/// handshake to its certificate's context `ctx` and hands BoringSSL the
/// hint. A share that failed (a small-order point, a dropped batch) leaves
/// the computation to BoringSSL.
pub fn finish(
    job: Option<impl Future<Output = Result<Share, Error>> + Send + 'static>,
    now: Option<(Hint, Shares)>,
    ctx: Option<SslContext>,
) -> BoxSelectCertFuture {
    Box::pin(async move {
        let share = match job {
            Some(f) => f
                .await
                .inspect_err(|e| tracing::debug!(error = %e, "key share left to BoringSSL"))
                .ok()
                .map(|s| (Hint::Share(s), Shares::Lanes)),
            None => now,
        };
        let finish: BoxSelectCertFinish = Box::new(move |mut hello: ClientHello<'_>| {
            switch_to(hello.ssl_mut(), ctx.as_ref()).ok_or(AsyncSelectCertError)?;
            if let Some((s, place)) = share {
                apply(hello.ssl_mut(), &s, place)?;
            }
            Ok(())
        });
        Ok(finish)
    })
}

/// Switches the handshake to its certificate's context. `None`: BoringSSL
/// refused the switch.
pub fn switch_to(ssl: &mut SslRef, ctx: Option<&SslContext>) -> Option<()> {
    if let Some(ctx) = ctx {
        ssl.set_ssl_context(ctx).ok()?;
    }
    crate::ssl_ffi::shed_handshake_config(ssl);
    Some(())
}

fn apply(ssl: &mut SslRef, h: &Hint, place: Shares) -> Result<(), AsyncSelectCertError> {
    if !crate::ssl_ffi::set_handshake_hints(ssl, &h.hints_der()) {
        // BoringSSL parses what share.rs writes; if it ever refuses, the
        // handshake goes on without the hint.
        tracing::warn!(group = h.group(), "BoringSSL refused the key-share hint");
        return Ok(());
    }
    ssl.set_ex_data(hinted_index(), (h.group(), place, h.tls12()));
    Ok(())
}

/// Drives the selection future where BoringSSL's asynchronous callback
/// cannot (QUIC, whose handshakes quiche runs without a task waker): polls
/// it with `waker`, keeps it on the connection while it is pending, and
/// applies its result when done.
pub fn drive(
    mut hello: ClientHello<'_>,
    waker: &Waker,
    start: impl Fn(&mut ClientHello<'_>) -> BoxSelectCertFuture,
) -> Result<(), SelectCertError> {
    let index = pending_index();
    let held = hello.ssl_mut().ex_data_mut(index).and_then(|m| m.get_mut().ok().and_then(Option::take));
    let mut fut = match held {
        Some(f) => f,
        None => start(&mut hello),
    };
    match fut.as_mut().poll(&mut Context::from_waker(waker)) {
        Poll::Pending => {
            hello.ssl_mut().replace_ex_data(index, Mutex::new(Some(fut)));
            Err(SelectCertError::RETRY)
        }
        Poll::Ready(Ok(finish)) => finish(hello).map_err(|_| SelectCertError::ERROR),
        Poll::Ready(Err(_)) => Err(SelectCertError::ERROR),
    }
}

/// Per QUIC connection: its selection future while it waits (in a mutex
/// only because ex_data must be `Sync`; it is taken with `get_mut`).
type Held = Mutex<Option<BoxSelectCertFuture>>;

fn pending_index() -> Index<Ssl, Held> {
    static INDEX: OnceLock<Index<Ssl, Held>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("BoringSSL allocates an ex_data index"))
}

/// Where a finished handshake's key share (TLS 1.2: its ECDHE key pair)
/// was made: where the hint was when BoringSSL used it (the hinted group
/// and version), else BoringSSL.
pub fn engine_used(ssl: &SslRef) -> Shares {
    let version = |tls12: bool| if tls12 { SslVersion::TLS1_2 } else { SslVersion::TLS1_3 };
    match ssl.ex_data(hinted_index()).copied() {
        Some((group, place, tls12)) if Some(group) == ssl.curve() && ssl.version2() == Some(version(tls12)) => place,
        _ => Shares::Boring,
    }
}
