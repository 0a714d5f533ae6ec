//! The admin listener: Prometheus metrics at `/metrics`, a JSON `/status`,
//! `/stats` (both in one document, for the dashboard), the admin API, and
//! the dashboard at `/ui/`, on an address of its own.
//!
//! It runs on the control thread, never on a worker. Access: an optional
//! allow-list of client networks (else 403), and the key in `X-API-KEY`
//! (else 401), which every path needs except the read-only `/metrics`,
//! `/status` and `/stats` (unless `admin.read_requires_key`) and the
//! dashboard's static files. The settings are read from the live config on
//! every request, so a reload rotates the key.

#![forbid(unsafe_code)]
// An early return of a whole response is the natural error here, and this
// is the admin path, not the request path: its size does not matter.
#![allow(clippy::result_large_err)]

mod api;
mod ui;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use gatehouse_config::Admin;
use gatehouse_node::Node;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

pub(crate) type Body = Full<Bytes>;

/// The API's description, checked in at docs/openapi.json.
const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// Serves the admin API on `std_listener` (bound, or handed over, by the
/// node's start-up); returns the server to run on the control runtime.
pub fn start(
    node: Arc<Node>,
    std_listener: std::net::TcpListener,
) -> std::io::Result<Pin<Box<dyn Future<Output = ()> + Send>>> {
    std_listener.set_nonblocking(true)?;
    Ok(Box::pin(async move {
        let listener = match tokio::net::TcpListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("admin listener: {e}");
                return;
            }
        };
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("admin accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let node = node.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let node = node.clone();
                    async move { Ok::<_, Infallible>(handle(req, peer, &node).await) }
                });
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new()).header_read_timeout(std::time::Duration::from_secs(10));
                let _ = b.serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    }))
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{body:#}\n"))));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// JSON without indentation, for what is polled.
fn compact_json(body: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// 405, naming the methods `Allow` lists.
pub(crate) fn not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = error(StatusCode::METHOD_NOT_ALLOWED, format!("allowed methods: {allow}"));
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

/// An error in the shape APISIX's Admin API uses.
pub(crate) fn error(status: StatusCode, msg: impl Into<String>) -> Response<Body> {
    json_response(status, &json!({ "error_msg": msg.into() }))
}

/// What a request may do, from its address and key.
enum Access {
    Denied(Response<Body>),
    /// Read-only paths only.
    Read,
    /// Everything.
    Full,
}

fn access(req: &Request<Incoming>, peer: SocketAddr, cfg: &Admin) -> Access {
    let ip = match peer.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    };
    if !cfg.allow.is_empty() && !cfg.allow.iter().any(|net| net.contains(&ip)) {
        return Access::Denied(error(StatusCode::FORBIDDEN, format!("{ip} is not in admin.allow")));
    }
    let sent = req.headers().get("x-api-key");
    match (&cfg.api_key, sent) {
        (Some(key), Some(sent)) if bool::from(key.as_bytes().ct_eq(sent.as_bytes())) => Access::Full,
        (Some(_), Some(_)) => Access::Denied(error(StatusCode::UNAUTHORIZED, "wrong X-API-KEY")),
        _ => Access::Read,
    }
}

async fn handle(req: Request<Incoming>, peer: SocketAddr, node: &Node) -> Response<Body> {
    let cfg = match node.running().config.admin.clone() {
        Some(c) => c,
        None => return error(StatusCode::SERVICE_UNAVAILABLE, "the admin section was removed from the config"),
    };
    let level = match access(&req, peer, &cfg) {
        Access::Denied(r) => return r,
        l => l,
    };
    let path = req.uri().path();
    // The dashboard's files hold nothing secret: with `read_requires_key`
    // the page asks for the key before it reads anything.
    if path == "/" || path == "/ui" || path.starts_with("/ui/") {
        return ui::serve(req.method(), path, req.headers().get(header::IF_NONE_MATCH));
    }
    let read_only = matches!(path, "/metrics" | "/status" | "/stats");
    let allowed = match level {
        Access::Full => true,
        Access::Read => read_only && !cfg.read_requires_key,
        Access::Denied(_) => false,
    };
    if !allowed {
        let msg = if cfg.api_key.is_none() {
            "this path needs admin.api_key to be set in the config, and that key in X-API-KEY"
        } else {
            "missing X-API-KEY"
        };
        return error(StatusCode::UNAUTHORIZED, msg);
    }
    let get_only = |f: &dyn Fn() -> Response<Body>| {
        if req.method() == Method::GET || req.method() == Method::HEAD { f() } else { not_allowed("GET, HEAD") }
    };
    match path {
        "/metrics" => get_only(&|| {
            let mut r = Response::new(Full::new(Bytes::from(node.scrape())));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
            r
        }),
        "/status" => get_only(&|| json_response(StatusCode::OK, &node.status())),
        "/stats" => get_only(&|| {
            let mut r = compact_json(&node.stats());
            r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }),
        "/config" => api::config(req, node).await,
        "/config/reload" => api::reload(req, node),
        "/ha" => api::ha(req, node).await,
        "/drain" => api::drain(req, node),
        "/openapi.json" => get_only(&|| {
            let mut r = Response::new(Full::new(Bytes::from_static(OPENAPI.as_bytes())));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }),
        _ if path.starts_with("/wireguard/") => {
            // /wireguard/interfaces/IFACE/peers[/NAME]
            let owned = path.to_string();
            let parts: Vec<&str> = owned.trim_start_matches('/').split('/').collect();
            match parts.as_slice() {
                ["wireguard", "interfaces", iface, "peers"] if valid_name(iface) => {
                    api::resource(req, node, gatehouse_config::doc::PEERS, Some(iface), None).await
                }
                ["wireguard", "interfaces", iface, "peers", n] if valid_name(iface) && valid_name(n) => {
                    let n = n.to_string();
                    api::resource(req, node, gatehouse_config::doc::PEERS, Some(iface), Some(n)).await
                }
                ["wireguard", "interfaces", _, "peers", ..] => error(
                    StatusCode::BAD_REQUEST,
                    "interface and peer names are 1 to 128 letters, digits, '-', '_' or '.'".to_string(),
                ),
                _ => error(StatusCode::NOT_FOUND, format!("no admin resource at {path}")),
            }
        }
        _ => {
            let mut parts = path.trim_start_matches('/').splitn(2, '/');
            let kind = parts.next().and_then(|k| gatehouse_config::doc::KINDS.iter().copied().find(|x| *x == k));
            let name = parts.next().map(str::to_string);
            match (kind, name.as_deref()) {
                (Some(kind), None) => api::resource(req, node, kind, None, None).await,
                (Some(kind), Some(n)) if valid_name(n) => api::resource(req, node, kind, None, name).await,
                (Some(_), Some(n)) => error(
                    StatusCode::BAD_REQUEST,
                    format!("{n:?}: a name is 1 to 128 letters, digits, '-', '_' or '.'"),
                ),
                _ => error(StatusCode::NOT_FOUND, format!("no admin resource at {path}")),
            }
        }
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 128 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}
