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
use hyper::body::Body;
use hyper_util::rt::TokioIo;

use crate::ClientBodyError;
use crate::accesslog::reason;
use crate::body::{AnyBody, ClientBody, RequestBody, ResponseBody, empty, empty_upstream, full};
use crate::completion::{Completion, Exchange};
use crate::downstream::conn::ConnState;
use crate::h1::{
    HOP_CONNECTION, HOP_KEEP_ALIVE, HOP_PROXY_CONNECTION, HOP_TE, HOP_TRAILER, HOP_TRANSFER_ENCODING, HOP_UPGRADE,
    KEEP_ALIVE, PROXY_CONNECTION, connection_listed_name, connection_tokens, hop_by_hop_bit,
};
use crate::refusal::Refusal;
use crate::router::normalize_host;
use crate::snapshot::{Action, DirectAnswer, Snapshot};
use crate::upstream::connect::H1Conn;
use crate::upstream::connect::{KeepIdle, UpstreamBody};
use crate::upstream::exchange::{Upstreamed, exchange};
use crate::upstream::h1::H1Body;
use crate::upstream::pool::UpstreamPool;
use gatehouse_config::UpstreamProtocol;

fn protocol_name(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        _ => "HTTP/3",
    }
}

/// On a listener that serves HTTP/3 too, a TCP response says so
/// (`Alt-Svc`, RFC 7838), unless the upstream advertised something itself.
fn advertise_http3(resp: &mut Response<AnyBody>, snap: &Snapshot, listener: usize) {
    let Some(alt) = snap.listeners.get(listener).and_then(|l| l.alt_svc.as_ref()) else { return };
    let upstream_said = resp.headers().contains_key(header::ALT_SVC)
        || resp.body().raw_head().is_some_and(|h| h.field_lines().any(|(n, _, _)| n.eq_ignore_ascii_case(b"alt-svc")));
    if !upstream_said {
        resp.headers_mut().insert(header::ALT_SVC, alt.clone());
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

/// [`handle`]'s future, boxed for a connection that keeps many of them.
/// The future has room for every state of an exchange (about 4 KB), and
/// `Box::pin(handle(..))` builds all of it on the stack and copies it into
/// the box, for every request. Here the box comes first, so the compiler
/// can make the future in it, writing only the request and the state (as
/// it does today: the release binary has no such copy; a compiler that
/// stopped doing so would cost the copy again, not correctness).
pub fn handle_boxed(
    req: Request<ClientBody>,
    conn: Arc<ConnState>,
    writer: HeadWriter,
) -> std::pin::Pin<Box<impl Future<Output = Result<Response<ResponseBody>, Infallible>> + Send + use<>>> {
    Box::into_pin(Box::write(Box::new_uninit(), handle(req, conn, writer)))
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
    let http3 = req.version() == Version::HTTP_3;
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
    if !http3 {
        advertise_http3(&mut resp, &snap, conn.listener);
    }
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
        Some(conn.client_ip())
    } else {
        let mut v: Vec<u8> = Vec::with_capacity(64);
        for value in prior {
            v.extend_from_slice(value.as_bytes());
            v.extend_from_slice(b", ");
        }
        let mut text = [0u8; crate::filters::ADDRESS_TEXT];
        v.extend_from_slice(crate::filters::address_text(conn.client.ip(), &mut text));
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
