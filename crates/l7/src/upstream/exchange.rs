//! One exchange with an upstream: an endpoint picked, a connection
//! checked out of the worker's pool (or made), the request sent and the
//! response head awaited. A connect failure is retried once on another
//! endpoint; a pooled connection found closed before it answered is
//! replaced.

use std::time::Instant;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::client::conn::http2;

use crate::ClientBodyError;
use crate::accesslog::reason;
use crate::completion::Exchange;
use crate::downstream::conn::ConnState;
use crate::h1::response::{ResponseFraming, ResponseHead};
use crate::refusal::Refusal;
use crate::snapshot::CompiledUpstream;
use crate::upstream::connect::{ConnectError, H1Conn, Sender, UpstreamBody, connect};
use crate::upstream::h1::{self as h1client, ExchangeError, Outgoing};
use crate::upstream::pool::{PoolEndpoint, UpstreamPool};
use gatehouse_config::UpstreamProtocol;

pub(crate) fn connect_refusal(e: &ConnectError) -> Refusal {
    match e {
        ConnectError::Timeout => Refusal::ConnectTimeout,
        ConnectError::Failed(_) | ConnectError::Handshake(_) => Refusal::ConnectFailed,
    }
}

/// A response head from an upstream, with what its body needs.
pub(crate) enum Upstreamed {
    H1(ResponseHead, ResponseFraming, H1Conn),
    H2(Response<Incoming>),
}

/// Sends the request to an endpoint and waits for the response head. A
/// connect failure is retried once on another endpoint; a pooled
/// connection found closed before it answered is replaced at once (only
/// requests without a body, which can be sent again as they are).
pub(crate) async fn exchange(
    upstream: &CompiledUpstream,
    hash: Option<u64>,
    request: Request<UpstreamBody>,
    conn: &ConnState,
    upgrade: bool,
    ex: &mut Exchange,
) -> Result<Upstreamed, Refusal> {
    let pool = &upstream.pool;
    let mut exclude = None;
    let mut last = Refusal::NoHealthyEndpoint;
    // One clock reading serves the pool's idle check, the upstream timing
    // and the response deadline, unless a connect comes in between.
    let mut now = Instant::now();
    for _attempt in 0..2 {
        let Some(i) = pool.pick(hash, exclude) else { break };
        let ep = &pool.endpoints[i];
        let sender = match checkout(pool, ep, conn, upgrade, now).await {
            Ok((s, connected)) => {
                if connected {
                    upstream.metrics.connection_opened(conn.worker.id);
                    now = Instant::now();
                } else {
                    upstream.metrics.connection_reused(conn.worker.id);
                }
                s
            }
            Err(e) => {
                tracing::debug!(upstream = %pool.cfg.name, endpoint = %ep.addr, "connect failed: {e}");
                if ep.health.connect_failed(&pool.cfg.passive) {
                    tracing::warn!(upstream = %pool.cfg.name, endpoint = %ep.addr, "endpoint ejected after consecutive connect failures");
                }
                last = connect_refusal(&e);
                exclude = Some(i);
                now = Instant::now();
                continue;
            }
        };
        ep.health.request_started(conn.worker.id);
        ex.endpoint = Some((ep.addr, ep.health.clone()));
        ex.upstream_start = Some(now);
        return match sender {
            Sender::H1(h1) => exchange_h1(upstream, ep, h1, request, conn, now).await,
            // Boxed: only h2c pools take this path, and its state (2 KB)
            // would otherwise be part of every request's future.
            Sender::H2(h2) => Box::pin(exchange_h2(upstream, ep, h2, request, conn)).await,
        };
    }
    Err(last)
}

async fn exchange_h1(
    upstream: &CompiledUpstream,
    ep: &PoolEndpoint,
    mut h1: H1Conn,
    request: Request<UpstreamBody>,
    conn: &ConnState,
    mut sent_at: Instant,
) -> Result<Upstreamed, Refusal> {
    let pool = &upstream.pool;
    let (parts, body) = request.into_parts();
    let out = Outgoing::new(&parts, !body.is_end_stream());
    let mut body = (!body.is_end_stream()).then_some(body);
    let mut stale_retries = 0;
    loop {
        match h1client::exchange(&mut h1, &out, body.as_mut(), sent_at + pool.cfg.response_timeout).await {
            Ok((resp, framing)) => return Ok(Upstreamed::H1(resp, framing, h1)),
            Err(ExchangeError::Stale) if stale_retries < 2 => {
                stale_retries += 1;
                h1 = match connect(ep.addr, pool.cfg.connect_timeout, UpstreamProtocol::Http1).await {
                    Ok(Sender::H1(c)) => c,
                    Ok(Sender::H2(_)) => return Err(Refusal::UpstreamError),
                    Err(e) => return Err(connect_refusal(&e)),
                };
                upstream.metrics.connection_opened(conn.worker.id);
                sent_at = Instant::now();
            }
            Err(ExchangeError::Timeout) => return Err(Refusal::UpstreamTimeout),
            Err(ExchangeError::ClientBody(ClientBodyError::TooLarge)) => return Err(Refusal::BodyTooLarge),
            Err(ExchangeError::ClientBody(ClientBodyError::Read(_))) => {
                return Err(Refusal::BadRequest(reason::CLIENT_BODY_ERROR));
            }
            Err(e) => {
                tracing::debug!(upstream = %pool.cfg.name, endpoint = %ep.addr, "upstream exchange failed: {e}");
                return Err(Refusal::UpstreamError);
            }
        }
    }
}

async fn exchange_h2(
    upstream: &CompiledUpstream,
    ep: &PoolEndpoint,
    mut h2: http2::SendRequest<UpstreamBody>,
    mut request: Request<UpstreamBody>,
    conn: &ConnState,
) -> Result<Upstreamed, Refusal> {
    let pool = &upstream.pool;
    let mut stale_retries = 0;
    loop {
        match tokio::time::timeout(pool.cfg.response_timeout, h2.try_send_request(request)).await {
            Err(_) => return Err(Refusal::UpstreamTimeout),
            Ok(Ok(resp)) => return Ok(Upstreamed::H2(resp)),
            Ok(Err(mut e)) => {
                // Not written at all: the shared connection had closed.
                stale_retries += 1;
                let Some(unsent) = e.take_message().filter(|_| stale_retries <= 2) else {
                    let err = e.into_error();
                    tracing::debug!(upstream = %pool.cfg.name, endpoint = %ep.addr, "upstream exchange failed: {err:?}");
                    // hyper's HTTP/2 client carries the body's error as its source.
                    let too_large = std::error::Error::source(&err)
                        .and_then(|s| s.downcast_ref::<ClientBodyError>())
                        .is_some_and(|e| matches!(e, ClientBodyError::TooLarge));
                    return Err(if too_large { Refusal::BodyTooLarge } else { Refusal::UpstreamError });
                };
                request = unsent;
                let fresh = connect(ep.addr, pool.cfg.connect_timeout, UpstreamProtocol::H2c).await;
                h2 = match fresh {
                    Ok(s @ Sender::H2(_)) => {
                        upstream.metrics.connection_opened(conn.worker.id);
                        conn.worker.conns.share_h2(ep.addr, &s);
                        let Sender::H2(h2) = s else { return Err(Refusal::UpstreamError) };
                        h2
                    }
                    Ok(Sender::H1(_)) => return Err(Refusal::UpstreamError),
                    Err(e) => return Err(connect_refusal(&e)),
                };
            }
        }
    }
}

/// A connection to `ep`: a pooled one if one is idle and usable (`now`
/// judges its idle age), else a new one (then `true`).
async fn checkout(
    pool: &UpstreamPool,
    ep: &PoolEndpoint,
    conn: &ConnState,
    upgrade: bool,
    now: Instant,
) -> Result<(Sender, bool), ConnectError> {
    let protocol = pool.cfg.protocol;
    let reuse = match protocol {
        UpstreamProtocol::H2c => conn.worker.conns.shared_h2(ep.addr),
        UpstreamProtocol::Http1 if !upgrade => conn.worker.conns.take(ep.addr, now).map(Sender::H1),
        UpstreamProtocol::Http1 => None,
    };
    if let Some(s) = reuse {
        return Ok((s, false));
    }
    let s = connect(ep.addr, pool.cfg.connect_timeout, protocol).await?;
    ep.health.connect_succeeded();
    conn.worker.conns.share_h2(ep.addr, &s);
    Ok((s, true))
}
