//! The request path: route, filters, then a direct answer or a proxied
//! exchange with one upstream endpoint, streamed both ways.
//!
//! Every way a request can fail is a [`Refusal`], which decides the status
//! code and the access log's reason code in one place.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::{Body, Incoming};
use hyper_util::rt::TokioIo;

use crate::ClientBodyError;
use crate::accesslog::reason;
use crate::body::{AnyBody, ClientBody, RequestBody, ResponseBody, empty, empty_upstream, full};
use crate::completion::{Completion, Exchange};
use crate::conn::ConnState;
use crate::h1::response::{ResponseFraming, ResponseHead};
use crate::h1::{
    HOP_CONNECTION, HOP_KEEP_ALIVE, HOP_PROXY_CONNECTION, HOP_TE, HOP_TRAILER, HOP_TRANSFER_ENCODING, HOP_UPGRADE,
    KEEP_ALIVE, PROXY_CONNECTION, connection_listed_name, connection_tokens, hop_by_hop_bit,
};
use crate::h1client::{self, ExchangeError, H1Body, Outgoing};
use crate::router::normalize_host;
use crate::snapshot::{Action, CompiledUpstream, DirectAnswer, Snapshot};
use crate::upstream::H1Conn;
use crate::upstream::{ConnectError, KeepIdle, PoolEndpoint, Sender, UpstreamBody, UpstreamPool, connect};
use gatehouse_config::UpstreamProtocol;
use hyper::client::conn::http2;

/// Why a request was answered by Gatehouse itself rather than an upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    BadRequest(&'static str),
    NoRoute,
    Forbidden,
    RateLimited {
        retry_after: u64,
    },
    BodyTooLarge,
    ClientTimeout,
    NoHealthyEndpoint,
    ConnectFailed,
    ConnectTimeout,
    UpstreamTimeout,
    UpstreamError,
    /// An Upgrade (WebSocket) to a pool spoken to over HTTP/2.
    UpgradeUnsupported,
}

impl Refusal {
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            Refusal::NoRoute => StatusCode::NOT_FOUND,
            Refusal::Forbidden => StatusCode::FORBIDDEN,
            Refusal::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refusal::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::ClientTimeout => StatusCode::REQUEST_TIMEOUT,
            Refusal::NoHealthyEndpoint => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::ConnectFailed | Refusal::UpstreamError | Refusal::UpgradeUnsupported => StatusCode::BAD_GATEWAY,
            Refusal::ConnectTimeout | Refusal::UpstreamTimeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    pub fn reason(self) -> &'static str {
        match self {
            Refusal::BadRequest(why) => why,
            Refusal::NoRoute => reason::NO_ROUTE,
            Refusal::Forbidden => reason::ACL_DENIED,
            Refusal::RateLimited { .. } => reason::RATE_LIMITED,
            Refusal::BodyTooLarge => reason::BODY_TOO_LARGE,
            Refusal::ClientTimeout => reason::CLIENT_TIMEOUT,
            Refusal::NoHealthyEndpoint => reason::NO_HEALTHY_ENDPOINT,
            Refusal::ConnectFailed => reason::CONNECT_FAILED,
            Refusal::ConnectTimeout => reason::CONNECT_TIMEOUT,
            Refusal::UpstreamTimeout => reason::UPSTREAM_TIMEOUT,
            Refusal::UpstreamError => reason::UPSTREAM_ERROR,
            Refusal::UpgradeUnsupported => reason::UPGRADE_UNSUPPORTED,
        }
    }

    pub fn response(self) -> Response<AnyBody> {
        let status = self.status();
        let text = format!("{} {}\n", status.as_u16(), status.canonical_reason().unwrap_or(""));
        let mut resp = Response::new(full(text));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Refusal::RateLimited { retry_after } = self {
            h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        }
        if matches!(self, Refusal::BadRequest(_) | Refusal::ClientTimeout | Refusal::BodyTooLarge) {
            // The rest of this connection's byte stream can't be trusted.
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

fn protocol_name(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        _ => "HTTP/3.0",
    }
}

/// Who writes the response head to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadWriter {
    /// Gatehouse's own HTTP/1.1 server. It writes an HTTP/1.1 upstream's
    /// fields as they arrived, so they are not made into a header map:
    /// the response body carries them ([`ResponseBody::raw_head`]).
    Own,
    /// From the response's header map (hyper's HTTP/1.1 server, and
    /// Gatehouse's own HTTP/2 server).
    Map,
}

/// The entry point for every request of every client.
pub async fn handle(
    req: Request<ClientBody>,
    conn: Arc<ConnState>,
    writer: HeadWriter,
) -> Result<Response<ResponseBody>, Infallible> {
    conn.in_flight.fetch_add(1, Ordering::Relaxed);
    conn.requests.fetch_add(1, Ordering::Relaxed);
    // A request dropped before it has a response (its client reset the
    // HTTP/2 stream) is no longer in flight; once it has one, the
    // response body's completion says when it ends.
    struct Unanswered<'a>(&'a ConnState);
    impl Drop for Unanswered<'_> {
        fn drop(&mut self) {
            self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let unanswered = Unanswered(&conn);
    let snap = conn.worker.shared.snapshot.load_full();
    let http1 = req.version() <= Version::HTTP_11;
    // What only the log line needs is copied only when there is a log.
    let logging = conn.worker.shared.access_log.is_on();
    let mut ex = Exchange {
        logging,
        start: Instant::now(),
        time: logging.then(SystemTime::now),
        method: if logging { req.method().as_str().to_owned() } else { String::new() },
        path: if logging { req.uri().path().to_owned() } else { String::new() },
        protocol: protocol_name(req.version()),
        host: String::new(),
        route: None,
        upstream: None,
        endpoint: None,
        upstream_start: None,
        upstream_elapsed: None,
        route_idx: None,
        pool_idx: None,
        bytes_in: None,
        reason: reason::OK,
    };
    let resp = match process(req, &snap, &conn, &mut ex, writer).await {
        Ok(resp) => resp,
        Err(refusal) => {
            ex.reason = refusal.reason();
            refusal.response()
        }
    };
    if let Some(t) = ex.upstream_start {
        ex.upstream_elapsed = Some(t.elapsed());
    }
    let mut resp = resp;
    // A 101 keeps its own Connection header; HTTP/2 has none (GOAWAY does this).
    if conn.closing.load(Ordering::Relaxed) && http1 && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    std::mem::forget(unanswered);
    let completion = Completion { status: resp.status().as_u16(), ex, conn, snap };
    Ok(resp.map(|b| ResponseBody::new(b, completion)))
}

async fn process(
    mut req: Request<ClientBody>,
    snap: &Snapshot,
    conn: &Arc<ConnState>,
    ex: &mut Exchange,
    writer: HeadWriter,
) -> Result<Response<AnyBody>, Refusal> {
    if conn.head_flags.swap(0, Ordering::Relaxed) != 0 {
        return Err(Refusal::BadRequest(reason::AMBIGUOUS_LENGTH));
    }
    let authority = authority(&req)?;
    let host = normalize_host(authority.to_str().unwrap_or(""));
    if ex.logging {
        ex.host = host.clone().into_owned();
    }
    let route_idx = snap
        .router
        .find(conn.listener, &host, req.method(), req.uri().path(), req.headers())
        .ok_or(Refusal::NoRoute)?;
    let route = &snap.routes[route_idx];
    ex.route_idx = Some(route_idx);
    if ex.logging {
        ex.route = Some(route.name.clone());
    }

    let ip = conn.client.ip();
    if !route.acl.admits(ip) {
        return Err(Refusal::Forbidden);
    }
    if let Some(limiter) = &route.rate_limit {
        limiter.check(ip, Instant::now()).map_err(|retry_after| Refusal::RateLimited { retry_after })?;
    }
    let (pool_idx, canary) = match &route.action {
        Action::Direct(d) => return Ok(d.response()),
        Action::Proxy { pool, canary } => (*pool, canary),
    };

    let max_body = snap.http.max_body_bytes;
    if content_length(req.headers()).is_some_and(|len| len > max_body) {
        return Err(Refusal::BodyTooLarge);
    }
    let pool_idx = match canary {
        Some(c) if c.wants(req.headers()) => c.pool,
        _ => pool_idx,
    };
    let pool = &snap.upstreams[pool_idx];
    ex.pool_idx = Some(pool_idx);
    if ex.logging {
        ex.upstream = Some(pool.name.clone());
    }

    let upgrade = wants_upgrade(&req);
    if upgrade && pool.pool.cfg.protocol == UpstreamProtocol::H2c {
        return Err(Refusal::UpgradeUnsupported);
    }
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let hash = pool.pool.request_hash(req.headers(), ip);
    let (mut parts, body) = req.into_parts();
    let raw_fields = writer == HeadWriter::Own;
    let body: UpstreamBody = match body {
        body if !body.is_end_stream() => {
            let seen = Arc::new(AtomicU64::new(0));
            ex.bytes_in = Some(seen.clone());
            let read = RequestBody::read_ahead(body, max_body, seen);
            match tokio::time::timeout(snap.http.client_header_timeout, read).await {
                Err(_) => return Err(Refusal::ClientTimeout),
                Ok(Err(ClientBodyError::TooLarge)) => return Err(Refusal::BodyTooLarge),
                Ok(Err(ClientBodyError::Read(_))) => return Err(Refusal::BadRequest(reason::CLIENT_BODY_ERROR)),
                Ok(Ok(b)) => b.boxed_unsync(),
            }
        }
        _ => empty_upstream(),
    };
    rewrite_request(&mut parts, conn, &authority, upgrade);
    if pool.pool.cfg.protocol == UpstreamProtocol::H2c {
        to_http2(&mut parts);
    }
    let request = Request::from_parts(parts, body);

    let upstreamed = exchange(pool, hash, request, conn, upgrade, ex).await?;
    Ok(relay_response(upstreamed, &pool.pool, conn, client_upgrade, raw_fields))
}

/// The authority the client addressed: the request target's (absolute
/// form, or HTTP/2's :authority), else the one Host header. A header value
/// is cloned by reference count, not copied.
fn authority(req: &Request<ClientBody>) -> Result<HeaderValue, Refusal> {
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host_header = hosts.next();
    if hosts.next().is_some() {
        return Err(Refusal::BadRequest(reason::BAD_REQUEST));
    }
    if let Some(a) = req.uri().authority() {
        return HeaderValue::from_str(a.as_str()).map_err(|_| Refusal::BadRequest(reason::BAD_REQUEST));
    }
    match host_header {
        Some(h) if !h.is_empty() && h.to_str().is_ok() => Ok(h.clone()),
        Some(_) => Err(Refusal::BadRequest(reason::MISSING_HOST)),
        None if req.version() == Version::HTTP_10 => Ok(HeaderValue::from_static("")),
        None => Err(Refusal::BadRequest(reason::MISSING_HOST)),
    }
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

fn connection_has(h: &HeaderMap, token: &str) -> bool {
    h.get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| connection_tokens(v.as_bytes()))
        .any(|t| t.eq_ignore_ascii_case(token.as_bytes()))
}

fn wants_upgrade(req: &Request<ClientBody>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && connection_has(req.headers(), "upgrade")
}

/// Removes hop-by-hop headers, including those the Connection header
/// names. With `upgrade`, keeps `Upgrade` and answers `Connection:
/// upgrade`. One pass over the names finds which are present, so only
/// those cost a removal.
fn strip_hop_by_hop(h: &mut HeaderMap, upgrade: bool) {
    let present = h.keys().fold(0u8, |acc, k| acc | hop_by_hop_bit(k));
    if present & HOP_CONNECTION != 0 {
        // Names listed in Connection, other than the usual tokens.
        let named: Vec<HeaderName> = h
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| connection_tokens(v.as_bytes()))
            .filter_map(connection_listed_name)
            .collect();
        for name in named {
            h.remove(&name);
        }
    }
    let names: [(u8, &HeaderName); 7] = [
        (HOP_CONNECTION, &header::CONNECTION),
        (HOP_TE, &header::TE),
        (HOP_TRAILER, &header::TRAILER),
        (HOP_TRANSFER_ENCODING, &header::TRANSFER_ENCODING),
        (HOP_UPGRADE, &header::UPGRADE),
        (HOP_KEEP_ALIVE, &KEEP_ALIVE),
        (HOP_PROXY_CONNECTION, &PROXY_CONNECTION),
    ];
    for (bit, name) in names {
        if present & bit != 0 && !(upgrade && bit == HOP_UPGRADE) {
            h.remove(name);
        }
    }
    if upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
}

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

fn rewrite_request(parts: &mut http::request::Parts, conn: &ConnState, authority: &HeaderValue, upgrade: bool) {
    // An authority in the request target (HTTP/2, absolute form) becomes
    // the Host header; otherwise the client's one Host header stays as is.
    let from_target = parts.uri.authority().is_some();
    // Origin form, sharing the path's bytes rather than copying them.
    parts.uri = match parts.uri.path_and_query() {
        Some(pq) => Uri::from(pq.clone()),
        None => Uri::from_static("/"),
    };
    parts.version = Version::HTTP_11;
    let h = &mut parts.headers;
    strip_hop_by_hop(h, upgrade);
    if from_target && !authority.is_empty() {
        h.insert(header::HOST, authority.clone());
    }
    if let Some(host) = h.get(header::HOST).cloned() {
        h.insert(X_FORWARDED_HOST.clone(), host);
    }
    let mut prior = h.get_all(&X_FORWARDED_FOR).iter().peekable();
    let xff = if prior.peek().is_none() {
        Some(conn.client_ip.clone())
    } else {
        let mut v: Vec<u8> = Vec::with_capacity(64);
        for value in prior {
            v.extend_from_slice(value.as_bytes());
            v.extend_from_slice(b", ");
        }
        v.extend_from_slice(conn.client_ip.as_bytes());
        HeaderValue::from_bytes(&v).ok()
    };
    if let Some(v) = xff {
        h.insert(X_FORWARDED_FOR.clone(), v);
    }
    let proto = if conn.tls.is_some() { "https" } else { "http" };
    h.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(proto));
}

/// HTTP/2 carries the host in `:authority` and needs `:scheme`: both come
/// from an absolute request target, so the Host header moves there.
fn to_http2(parts: &mut http::request::Parts) {
    parts.version = Version::HTTP_2;
    let host = parts.headers.remove(header::HOST);
    let authority = host.as_ref().and_then(|h| h.to_str().ok()).and_then(|h| http::uri::Authority::try_from(h).ok());
    let pq = parts.uri.path_and_query().cloned();
    if let (Some(authority), Some(pq)) = (authority, pq) {
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(http::uri::Scheme::HTTP);
        uri.authority = Some(authority);
        uri.path_and_query = Some(pq);
        if let Ok(u) = Uri::from_parts(uri) {
            parts.uri = u;
        }
    }
}

fn connect_refusal(e: &ConnectError) -> Refusal {
    match e {
        ConnectError::Timeout => Refusal::ConnectTimeout,
        ConnectError::Failed(_) | ConnectError::Handshake(_) => Refusal::ConnectFailed,
    }
}

/// A response head from an upstream, with what its body needs.
enum Upstreamed {
    H1(ResponseHead, ResponseFraming, H1Conn),
    H2(Response<Incoming>),
}

/// Sends the request to an endpoint and waits for the response head. A
/// connect failure is retried once on another endpoint; a pooled
/// connection found closed before it answered is replaced at once (only
/// requests without a body, which can be sent again as they are).
async fn exchange(
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
                tracing::debug!(upstream = %pool.cfg.name, endpoint = %ep.addr, "upstream exchange failed: {e:?}");
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

/// The client's response to an upstream's: for an HTTP/1.1 upstream,
/// `raw_fields` leaves the fields in the body's [`ResponseHead`] for
/// Gatehouse's own server to write, instead of making a header map.
fn relay_response(
    upstreamed: Upstreamed,
    pool: &UpstreamPool,
    conn: &ConnState,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    raw_fields: bool,
) -> Response<AnyBody> {
    match upstreamed {
        Upstreamed::H1(mut head, framing, mut h1) => {
            let mut resp = Response::new(());
            *resp.status_mut() = head.status;
            *resp.version_mut() = head.version;
            let raw = if raw_fields && head.status != StatusCode::SWITCHING_PROTOCOLS {
                Some(head)
            } else {
                *resp.headers_mut() = head.header_map();
                h1.fields = head.take_fields();
                None
            };
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                if let Some(client_side) = client_upgrade {
                    tokio::spawn(bridge(client_side, h1));
                    return resp.map(|()| empty());
                }
                // A 101 the client did not ask for: the upstream client
                // kept its hop-by-hop headers for an upgrade; none is made.
                strip_hop_by_hop(resp.headers_mut(), false);
            }
            // The upstream client has already left out the hop-by-hop headers.
            resp.map(|()| {
                AnyBody::H1(H1Body::new(h1, framing, raw, conn.worker.conns.clone(), KeepIdle::of(&pool.cfg)))
            })
        }
        Upstreamed::H2(mut resp) => {
            strip_hop_by_hop(resp.headers_mut(), false);
            resp.map(AnyBody::H2)
        }
    }
}

/// Joins an upgraded client connection (WebSocket and the like) to the
/// upstream socket, bytes both ways, until either side closes.
async fn bridge(client_side: hyper::upgrade::OnUpgrade, upstream: H1Conn) {
    use tokio::io::AsyncWriteExt;
    let Ok(client) = client_side.await else { return };
    let mut client = TokioIo::new(client);
    let (mut upstream, early) = upstream.into_parts();
    // Bytes the upstream sent right after its 101 belong to the client.
    if !early.is_empty() && client.write_all(&early).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

impl DirectAnswer {
    pub fn response(&self) -> Response<AnyBody> {
        let mut resp = Response::new(full(self.body.clone()));
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers.clone();
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_go() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "keep-alive, X-Secret".parse().expect("v"));
        h.insert("x-secret", "1".parse().expect("v"));
        h.insert("keep-alive", "timeout=5".parse().expect("v"));
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().expect("v"));
        h.insert("x-kept", "1".parse().expect("v"));
        strip_hop_by_hop(&mut h, false);
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["x-kept"]);
    }

    #[test]
    fn upgrades_keep_their_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "Upgrade".parse().expect("v"));
        h.insert(header::UPGRADE, "websocket".parse().expect("v"));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h.get(header::UPGRADE).map(|v| v.as_bytes()), Some(&b"websocket"[..]));
        assert_eq!(h.get(header::CONNECTION).map(|v| v.as_bytes()), Some(&b"upgrade"[..]));
    }

    #[test]
    fn http2_requests_carry_the_host_as_authority() {
        let (mut parts, ()) =
            Request::get("/a?b=1").header("host", "api.test:8080").body(()).expect("req").into_parts();
        to_http2(&mut parts);
        assert_eq!(parts.version, Version::HTTP_2);
        assert_eq!(parts.uri.to_string(), "http://api.test:8080/a?b=1");
        assert!(parts.headers.get(header::HOST).is_none());
    }

    #[test]
    fn refusals_map_to_statuses() {
        assert_eq!(Refusal::NoHealthyEndpoint.status(), 503);
        assert_eq!(Refusal::ConnectFailed.status(), 502);
        assert_eq!(Refusal::UpstreamTimeout.status(), 504);
        let r = Refusal::RateLimited { retry_after: 3 }.response();
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers().get(header::RETRY_AFTER).map(|v| v.as_bytes()), Some(&b"3"[..]));
    }
}
