//! A compiled, immutable config: what workers read on every request.
//!
//! [`Snapshot::build`] turns a validated [`Config`] into routers, pools, TLS
//! acceptors and filters, or fails with field-path errors and changes
//! nothing. The live snapshot is swapped whole (arc-swap); a request holds
//! the snapshot it started with until it ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use gatehouse_config::{Config, FieldError, HttpSettings, Protocol};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::downstream::h3::QuicListener;
use crate::downstream::tls::{ListenerTlsState, build_listener_tls, load_certificates};
use crate::filters::{Acl, CanarySplit, RateLimiter, RateLimiters};
use crate::metrics::{ListenerMetrics, Metrics, RouteMetrics, UpstreamMetrics};
use crate::router::Router;
use crate::upstream::pool::UpstreamPool;
use gatehouse_plane::health::HealthRegistry;
use gatehouse_plane::resolve;

pub struct ListenerSnap {
    pub name: Arc<str>,
    pub address: std::net::SocketAddr,
    pub protocol: Protocol,
    pub tls: Option<ListenerTlsState>,
    /// The HTTP/3 side, with `http3: true`.
    pub quic: Option<Arc<QuicListener>>,
    /// `Alt-Svc` for the TCP side's responses, with `http3: true`.
    pub alt_svc: Option<HeaderValue>,
    pub metrics: Arc<ListenerMetrics>,
}

/// A compiled direct response.
pub struct DirectAnswer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

pub enum Action {
    Direct(DirectAnswer),
    Proxy { pool: usize, canary: Option<CanarySplit> },
}

pub struct CompiledRoute {
    pub name: Arc<str>,
    pub acl: Acl,
    pub rate_limit: Option<Arc<RateLimiter>>,
    pub action: Action,
    pub metrics: Arc<RouteMetrics>,
}

pub struct CompiledUpstream {
    pub name: Arc<str>,
    pub pool: UpstreamPool,
    pub metrics: Arc<UpstreamMetrics>,
}

pub struct Snapshot {
    pub config: Arc<Config>,
    pub http: HttpSettings,
    pub listeners: Vec<ListenerSnap>,
    pub router: Router,
    pub routes: Vec<CompiledRoute>,
    pub upstreams: Vec<CompiledUpstream>,
    /// (name, notAfter as Unix seconds) of every certificate.
    pub certificates: Vec<(String, i64)>,
}

/// State that outlives snapshots and what a build needs to know.
pub struct BuildContext<'a> {
    /// Relative paths in the config are relative to this directory.
    pub base_dir: &'a Path,
    pub health: &'a HealthRegistry,
    pub limiters: &'a RateLimiters,
    pub metrics: &'a Metrics,
    /// Write self-signed certificates that don't exist yet (false for `check`).
    pub generate_certs: bool,
}

impl BuildContext<'_> {
    pub fn data_dir(&self, cfg: &Config) -> PathBuf {
        resolve(self.base_dir, &cfg.data_dir)
    }
}

fn field_error(path: String, message: String) -> FieldError {
    FieldError { path, message, line: None }
}

impl Snapshot {
    pub fn build(cfg: Arc<Config>, cx: &BuildContext<'_>) -> Result<Snapshot, Vec<FieldError>> {
        let mut errors = Vec::new();
        let certs = match load_certificates(&cfg.certificates, cx.base_dir, &cx.data_dir(&cfg), cx.generate_certs) {
            Ok(c) => c,
            Err(errs) => {
                errors.extend(errs);
                Vec::new()
            }
        };

        let mut listeners = Vec::new();
        for (i, l) in cfg.listeners.iter().enumerate() {
            let Some(address) = l.address else { continue };
            let tls = match (l.protocol, errors.is_empty()) {
                (Protocol::Https, true) if !certs.is_empty() => {
                    let settings = l.tls.clone().unwrap_or_default();
                    match build_listener_tls(&settings, &certs) {
                        Ok(t) => Some(t),
                        Err(e) => {
                            errors.push(field_error(format!("listeners[{i}].tls"), e.to_string()));
                            None
                        }
                    }
                }
                _ => None,
            };
            let quic = match (l.http3, &tls) {
                (true, Some(_)) => {
                    let settings = l.tls.clone().unwrap_or_default();
                    match QuicListener::build(&settings, &certs, &cfg.http) {
                        Ok(q) => Some(Arc::new(q)),
                        Err(e) => {
                            errors.push(field_error(format!("listeners[{i}].http3"), e.to_string()));
                            None
                        }
                    }
                }
                _ => None,
            };
            // Clients remember it for a day (RFC 7838 `ma`).
            let alt_svc = quic
                .as_ref()
                .and_then(|_| HeaderValue::from_str(&format!("h3=\":{}\"; ma=86400", address.port())).ok());
            let metrics = cx.metrics.listener(&l.name);
            listeners.push(ListenerSnap {
                name: l.name.as_str().into(),
                address,
                protocol: l.protocol,
                tls,
                quic,
                alt_svc,
                metrics,
            });
        }

        let mut upstreams = Vec::new();
        for (i, u) in cfg.upstreams.iter().enumerate() {
            match UpstreamPool::build(u, cx.health) {
                Ok(pool) => upstreams.push(CompiledUpstream {
                    name: u.name.as_str().into(),
                    pool,
                    metrics: cx.metrics.upstream(&u.name),
                }),
                Err(e) => errors.push(field_error(format!("upstreams[{i}]"), e.to_string())),
            }
        }
        let pool_index = |name: &str| cfg.upstreams.iter().position(|u| u.name == name);

        let mut routes = Vec::new();
        for (i, r) in cfg.routes.iter().enumerate() {
            let action = if let Some(d) = &r.direct_response {
                match direct_answer(d) {
                    Ok(a) => Action::Direct(a),
                    Err(e) => {
                        errors.push(field_error(format!("routes[{i}].direct_response"), e.to_string()));
                        continue;
                    }
                }
            } else {
                let Some(pool) = r.upstream.as_deref().and_then(pool_index) else { continue };
                let canary = r.canary.as_ref().and_then(|c| pool_index(&c.upstream).map(|p| CanarySplit::new(c, p)));
                Action::Proxy { pool, canary }
            };
            routes.push(CompiledRoute {
                name: r.name.as_str().into(),
                acl: Acl::new(&r.allow, &r.deny),
                rate_limit: r.rate_limit.as_ref().map(|rl| cx.limiters.get(&r.name, rl)),
                action,
                metrics: cx.metrics.route(&r.name),
            });
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let router = Router::build(&cfg.routes, &|name| cfg.listeners.iter().position(|l| l.name == name));
        let certificates = certs.iter().map(|c| (c.name.clone(), c.not_after)).collect();
        Ok(Snapshot { http: cfg.http.clone(), config: cfg, listeners, router, routes, upstreams, certificates })
    }

    /// No listeners, no routes: what runs before the first config.
    pub fn empty() -> Snapshot {
        let config = Arc::new(Config::default());
        Snapshot {
            http: config.http.clone(),
            router: Router::build(&[], &|_| None),
            config,
            listeners: Vec::new(),
            routes: Vec::new(),
            upstreams: Vec::new(),
            certificates: Vec::new(),
        }
    }

    pub fn listener_index(&self, name: &str) -> Option<usize> {
        self.listeners.iter().position(|l| &*l.name == name)
    }
}

/// Why a route's direct response cannot be served as written.
#[derive(Debug, thiserror::Error)]
enum DirectError {
    #[error("invalid status {0}: expected 100 to 999")]
    Status(u16),
    #[error("invalid header name {0:?}")]
    HeaderName(String),
    #[error("invalid value for header {0:?}: expected visible ASCII")]
    HeaderValue(String),
}

fn direct_answer(d: &gatehouse_config::DirectResponse) -> Result<DirectAnswer, DirectError> {
    let status = StatusCode::from_u16(d.status).map_err(|_| DirectError::Status(d.status))?;
    let mut headers = HeaderMap::new();
    for (name, value) in &d.headers {
        let n = HeaderName::from_bytes(name.as_bytes()).map_err(|_| DirectError::HeaderName(name.clone()))?;
        let v = HeaderValue::from_str(value).map_err(|_| DirectError::HeaderValue(name.clone()))?;
        headers.append(n, v);
    }
    Ok(DirectAnswer { status, headers, body: Bytes::from(d.body.clone()) })
}
