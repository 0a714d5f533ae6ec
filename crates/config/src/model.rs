//! The typed config model. Every field's meaning and default is documented
//! here and in docs/CONFIG.md; keep the two in step.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::decode::{Ctx, Decode, MapReader, decode_enum};
use crate::yaml::Node;

/// The whole config file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Worker threads, each with its own runtime and SO_REUSEPORT sockets.
    /// 0 (the default) means one per CPU core.
    pub workers: usize,
    /// Where generated state lives (self-signed certificates). Relative paths
    /// are relative to the config file's directory. Default `data`.
    pub data_dir: String,
    /// On SIGTERM/SIGINT, how long requests in flight may take to finish
    /// before the process exits anyway. Default 30s.
    pub shutdown_timeout: Duration,
    pub access_log: AccessLog,
    pub http: HttpSettings,
    pub key_ops: KeyOps,
    /// The admin listener (metrics, status, the API); none when absent.
    pub admin: Option<Admin>,
    /// Where routes, upstreams and certificates live: this file (default),
    /// or etcd, shared by a cluster of nodes.
    pub store: Store,
    /// The L4 packet load balancer; off when absent.
    pub l4: Option<L4>,
    pub listeners: Vec<Listener>,
    pub certificates: Vec<Certificate>,
    pub upstreams: Vec<Upstream>,
    pub routes: Vec<Route>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            workers: 0,
            data_dir: "data".into(),
            shutdown_timeout: Duration::from_secs(30),
            access_log: AccessLog::default(),
            http: HttpSettings::default(),
            key_ops: KeyOps::default(),
            admin: None,
            store: Store::File,
            l4: None,
            listeners: Vec::new(),
            certificates: Vec::new(),
            upstreams: Vec::new(),
            routes: Vec::new(),
        }
    }
}

/// How TLS private-key operations are batched (see `key_provider`).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyOps {
    /// Longest time a queued RSA operation waits for its batch to fill while
    /// the worker is busy. An idle worker runs the batch at once. Default 1ms.
    pub max_delay: Duration,
}

impl Default for KeyOps {
    fn default() -> Self {
        KeyOps { max_delay: Duration::from_millis(1) }
    }
}

impl Decode for KeyOps {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let k = KeyOps { max_delay: m.or(ctx, "max_delay", KeyOps::default().max_delay) };
        m.finish(ctx);
        Some(k)
    }
}

/// The admin listener: Prometheus metrics, status and the admin API, on an
/// address of its own (never a traffic listener's).
#[derive(Debug, Clone, PartialEq)]
pub struct Admin {
    /// Default 127.0.0.1:9180.
    pub address: SocketAddr,
    /// The key clients send in `X-API-KEY`. Without one, only the read-only
    /// paths (`/metrics`, `/status`) answer.
    pub api_key: Option<String>,
    /// Client networks allowed to connect; empty means any.
    pub allow: Vec<IpNet>,
    /// Whether `/metrics` and `/status` need the key too. Default false.
    pub read_requires_key: bool,
}

impl Admin {
    pub const DEFAULT_ADDRESS: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9180);
}

impl Decode for Admin {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let a = Admin {
            address: m.or(ctx, "address", Admin::DEFAULT_ADDRESS),
            api_key: m.opt(ctx, "api_key"),
            allow: m.or(ctx, "allow", Vec::new()),
            read_requires_key: m.or(ctx, "read_requires_key", false),
        };
        m.finish(ctx);
        Some(a)
    }
}

/// Where the shared resources (routes, upstreams, certificates) live.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Store {
    /// In this config file; admin API changes are written back to it.
    #[default]
    File,
    /// In etcd, under a key prefix: every node reads and watches them there,
    /// and admin API changes go there. The rest of the config stays in the file.
    Etcd(EtcdStore),
}

#[derive(Debug, Clone, PartialEq)]
pub struct EtcdStore {
    /// Client URLs, e.g. `http://10.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Key prefix; resources are `PREFIX/routes/NAME` and so on. Default `/gatehouse`.
    pub prefix: String,
    /// Connect and request timeout. Default 5s.
    pub timeout: Duration,
}

impl Decode for Store {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let kind: String = m.or(ctx, "type", "file".to_string());
        let store = match kind.as_str() {
            "file" => Store::File,
            "etcd" => Store::Etcd(EtcdStore {
                endpoints: m.req(ctx, "endpoints"),
                prefix: m.or(ctx, "prefix", "/gatehouse".to_string()),
                timeout: m.or(ctx, "timeout", Duration::from_secs(5)),
            }),
            other => {
                ctx.error_at("type", Some(m.line_of("type")), format!("expected file or etcd, found {other:?}"));
                Store::File
            }
        };
        m.finish(ctx);
        Some(store)
    }
}

/// Which engine computes a certificate's RSA private-key operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyProvider {
    /// `mb` when the CPU has AVX-512 IFMA, else `boring`.
    #[default]
    Auto,
    /// Multi-buffer: operations queued per worker and computed eight at a time.
    Mb,
    /// BoringSSL, one operation at a time inside the handshake.
    Boring,
}

impl Decode for KeyProvider {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("auto", KeyProvider::Auto), ("mb", KeyProvider::Mb), ("boring", KeyProvider::Boring)])
    }
}

/// Where access log lines go.
#[derive(Debug, Clone, PartialEq)]
pub enum AccessLogTarget {
    Off,
    Stdout,
    File(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct AccessLog {
    /// `stdout` (default), `off`, or a file path (appended to).
    pub target: AccessLogTarget,
}

impl Default for AccessLog {
    fn default() -> Self {
        AccessLog { target: AccessLogTarget::Stdout }
    }
}

/// Limits and client-side timeouts, for all listeners.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSettings {
    /// Largest request head (request line and headers) in bytes; over it: 431.
    pub max_header_bytes: usize,
    /// Most request headers; over it: 431.
    pub max_headers: usize,
    /// Largest request body in bytes; over it: 413.
    pub max_body_bytes: u64,
    /// Time a client has to send a complete request head; then 408.
    pub client_header_timeout: Duration,
    /// Time an idle keep-alive client connection is kept open.
    pub client_idle_timeout: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            max_body_bytes: 10 * 1024 * 1024,
            client_header_timeout: Duration::from_secs(10),
            client_idle_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    Http,
    Https,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Listener {
    pub name: String,
    pub address: Option<SocketAddr>,
    pub protocol: Protocol,
    /// Required for `https`, refused for `http`.
    pub tls: Option<ListenerTls>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum TlsVersion {
    #[default]
    Tls12,
    Tls13,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerTls {
    /// Lowest TLS version accepted: `"1.2"` (default) or `"1.3"`.
    pub min_version: TlsVersion,
    /// Highest TLS version accepted: `"1.3"` (default) or `"1.2"`.
    pub max_version: TlsVersion,
    /// OpenSSL-style cipher list for TLS 1.2 (TLS 1.3 suites are fixed by
    /// BoringSSL). Default: BoringSSL's default list.
    pub ciphers: Option<String>,
    /// Session tickets and the session cache. On by default; benchmarks of
    /// full handshakes turn it off.
    pub session_resumption: bool,
    /// Certificate used when the client's SNI matches no certificate, or it
    /// sends none. Default: the first certificate.
    pub default_certificate: Option<String>,
    /// ALPN protocols offered, in order of preference. Default `[h2, http/1.1]`.
    pub alpn: Vec<String>,
}

impl Default for ListenerTls {
    fn default() -> Self {
        ListenerTls {
            min_version: TlsVersion::Tls12,
            max_version: TlsVersion::Tls13,
            ciphers: None,
            session_resumption: true,
            default_certificate: None,
            alpn: vec!["h2".into(), "http/1.1".into()],
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Certificate {
    pub name: String,
    /// PEM file with the leaf certificate first, then its chain.
    pub cert: Option<String>,
    /// PEM file with the private key (RSA or ECDSA).
    pub key: Option<String>,
    /// Generate a self-signed ECDSA P-256 certificate for the `sni` names into
    /// `data_dir` on first start, and reuse it after.
    pub self_signed: bool,
    /// Server names this certificate answers: exact (`api.example.com`) or a
    /// leading wildcard (`*.example.com`, one label). A name may carry both an
    /// RSA and an ECDSA certificate; ECDSA is used when the client supports it.
    pub sni: Vec<String>,
    /// Engine for RSA private-key operations: `auto` (default), `mb` or
    /// `boring`. ECDSA keys always sign inline in BoringSSL.
    pub key_provider: KeyProvider,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    WeightedRoundRobin,
    LeastConnections,
    Maglev,
}

/// What Maglev hashes on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum HashKey {
    #[default]
    ClientIp,
    Header(String),
    Cookie(String),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Endpoint {
    pub address: Option<SocketAddr>,
    /// Relative weight, default 1. 0 drains the endpoint (no new requests).
    pub weight: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealthCheckKind {
    #[default]
    Http,
    Tcp,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheck {
    pub kind: HealthCheckKind,
    /// Path of the HTTP GET. Default `/`.
    pub path: String,
    /// Host header of the HTTP GET. Default: the endpoint's address.
    pub host: Option<String>,
    /// Status that counts as healthy. Default 200.
    pub expect_status: u16,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive successes that bring an endpoint back. Default 2.
    pub rise: u32,
    /// Consecutive failures that take it out. Default 3.
    pub fall: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            kind: HealthCheckKind::Http,
            path: "/".into(),
            host: None,
            expect_status: 200,
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            rise: 2,
            fall: 3,
        }
    }
}

/// Passive ejection: an endpoint whose connects keep failing is taken out of
/// rotation for a while without waiting for the active check.
#[derive(Debug, Clone, PartialEq)]
pub struct PassiveHealth {
    /// Consecutive connect failures that eject an endpoint. 0 disables. Default 5.
    pub consecutive_failures: u32,
    /// How long an ejected endpoint stays out (unless an active check
    /// re-admits it sooner). Default 30s.
    pub ejection_time: Duration,
}

impl Default for PassiveHealth {
    fn default() -> Self {
        PassiveHealth { consecutive_failures: 5, ejection_time: Duration::from_secs(30) }
    }
}

/// How Gatehouse speaks to an upstream's endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UpstreamProtocol {
    /// HTTP/1.1 with a keep-alive pool per endpoint per worker.
    #[default]
    Http1,
    /// Cleartext HTTP/2 with prior knowledge: one multiplexed connection per
    /// endpoint per worker; request and response trailers pass through
    /// (gRPC needs this).
    H2c,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Upstream {
    pub name: String,
    pub protocol: UpstreamProtocol,
    pub balance: Balance,
    pub hash_key: HashKey,
    pub endpoints: Vec<Endpoint>,
    pub health_check: Option<HealthCheck>,
    pub passive: PassiveHealth,
    pub connect_timeout: Duration,
    /// Time from the request sent to the response head received; then 504.
    pub response_timeout: Duration,
    /// Most idle keep-alive connections kept per endpoint per worker; 0
    /// keeps none. `None` (the default): no count cap. The pool then holds
    /// as many as the busiest moment needed, reused newest first, so the
    /// ones the load no longer needs stay unused and are closed by
    /// `idle_timeout`: a pool capped by a small count closes and reopens a
    /// connection per request once concurrency passes the cap.
    pub max_idle_per_endpoint: Option<usize>,
    /// An idle pooled connection unused for this long is closed. Default 60s.
    pub idle_timeout: Duration,
}

impl Default for Upstream {
    fn default() -> Self {
        Upstream {
            name: String::new(),
            protocol: UpstreamProtocol::Http1,
            balance: Balance::RoundRobin,
            hash_key: HashKey::ClientIp,
            endpoints: Vec::new(),
            health_check: None,
            passive: PassiveHealth::default(),
            connect_timeout: Duration::from_secs(3),
            response_timeout: Duration::from_secs(30),
            max_idle_per_endpoint: None,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeaderMatch {
    pub name: String,
    /// Exact value; absent means "header present with any value".
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteMatch {
    /// Exact names or `*.suffix` wildcards. Empty matches any host.
    pub hosts: Vec<String>,
    /// Exact path (without the query string).
    pub path: Option<String>,
    /// Path prefix. Default `/` when neither `path` nor `path_prefix` is set.
    pub path_prefix: Option<String>,
    /// Methods; empty matches any.
    pub methods: Vec<String>,
    /// Every listed header must match.
    pub headers: Vec<HeaderMatch>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct DirectResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Canary {
    pub upstream: String,
    /// Percent of requests (0-100) sent to the canary pool.
    pub weight: u32,
    /// Requests carrying this header always go to the canary pool.
    pub header: Option<HeaderMatch>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct RateLimit {
    /// Requests per second per client address (the token refill rate).
    pub rate: f64,
    /// Bucket size: requests a client may send at once. Default: rate rounded up.
    pub burst: u32,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Route {
    pub name: String,
    /// Listeners this route serves; empty means all.
    pub listeners: Vec<String>,
    pub matches: RouteMatch,
    pub upstream: Option<String>,
    pub direct_response: Option<DirectResponse>,
    pub canary: Option<Canary>,
    /// If non-empty, only these client networks may use the route (else 403).
    pub allow: Vec<IpNet>,
    /// Client networks refused with 403. Deny wins over allow.
    pub deny: Vec<IpNet>,
    pub rate_limit: Option<RateLimit>,
}

// ----- decoding -----

impl Decode for Config {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let c = Config {
            workers: m.or(ctx, "workers", 0),
            data_dir: m.or(ctx, "data_dir", "data".to_string()),
            shutdown_timeout: m.or(ctx, "shutdown_timeout", Duration::from_secs(30)),
            access_log: m.or(ctx, "access_log", AccessLog::default()),
            http: m.or(ctx, "http", HttpSettings::default()),
            key_ops: m.or(ctx, "key_ops", KeyOps::default()),
            admin: m.opt(ctx, "admin"),
            store: m.or(ctx, "store", Store::File),
            l4: m.opt(ctx, "l4"),
            listeners: m.or(ctx, "listeners", Vec::new()),
            certificates: m.or(ctx, "certificates", Vec::new()),
            upstreams: m.or(ctx, "upstreams", Vec::new()),
            routes: m.or(ctx, "routes", Vec::new()),
        };
        m.finish(ctx);
        Some(c)
    }
}

impl Decode for AccessLog {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let path: String = m.or(ctx, "path", "stdout".to_string());
        m.finish(ctx);
        let target = match path.as_str() {
            "stdout" | "-" => AccessLogTarget::Stdout,
            "off" => AccessLogTarget::Off,
            _ => AccessLogTarget::File(path),
        };
        Some(AccessLog { target })
    }
}

impl Decode for HttpSettings {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = HttpSettings::default();
        let mut m = MapReader::new(node, ctx)?;
        let s = HttpSettings {
            max_header_bytes: m.or(ctx, "max_header_bytes", d.max_header_bytes),
            max_headers: m.or(ctx, "max_headers", d.max_headers),
            max_body_bytes: m.or(ctx, "max_body_bytes", d.max_body_bytes),
            client_header_timeout: m.or(ctx, "client_header_timeout", d.client_header_timeout),
            client_idle_timeout: m.or(ctx, "client_idle_timeout", d.client_idle_timeout),
        };
        m.finish(ctx);
        Some(s)
    }
}

impl Decode for Protocol {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("http", Protocol::Http), ("https", Protocol::Https)])
    }
}

impl Decode for TlsVersion {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("1.2", TlsVersion::Tls12), ("1.3", TlsVersion::Tls13)])
    }
}

impl Decode for Listener {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let l = Listener {
            name: m.req(ctx, "name"),
            address: m.req::<Option<SocketAddr>>(ctx, "address"),
            protocol: m.or(ctx, "protocol", Protocol::Http),
            tls: m.opt(ctx, "tls"),
        };
        m.finish(ctx);
        Some(l)
    }
}

impl Decode for ListenerTls {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = ListenerTls::default();
        let mut m = MapReader::new(node, ctx)?;
        let t = ListenerTls {
            min_version: m.or(ctx, "min_version", d.min_version),
            max_version: m.or(ctx, "max_version", d.max_version),
            ciphers: m.opt(ctx, "ciphers"),
            session_resumption: m.or(ctx, "session_resumption", d.session_resumption),
            default_certificate: m.opt(ctx, "default_certificate"),
            alpn: m.or(ctx, "alpn", d.alpn),
        };
        m.finish(ctx);
        Some(t)
    }
}

impl Decode for Certificate {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let c = Certificate {
            name: m.req(ctx, "name"),
            cert: m.opt(ctx, "cert"),
            key: m.opt(ctx, "key"),
            self_signed: m.or(ctx, "self_signed", false),
            sni: m.or(ctx, "sni", Vec::new()),
            key_provider: m.or(ctx, "key_provider", KeyProvider::Auto),
        };
        m.finish(ctx);
        Some(c)
    }
}

impl Decode for UpstreamProtocol {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("http1", UpstreamProtocol::Http1), ("h2c", UpstreamProtocol::H2c)])
    }
}

impl Decode for Balance {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(
            node,
            ctx,
            &[
                ("round_robin", Balance::RoundRobin),
                ("weighted_round_robin", Balance::WeightedRoundRobin),
                ("least_connections", Balance::LeastConnections),
                ("maglev", Balance::Maglev),
            ],
        )
    }
}

/// `client_ip`, `header:NAME` or `cookie:NAME`.
impl Decode for HashKey {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let text = node.scalar().unwrap_or("");
        let parsed = match text.split_once(':') {
            None if text == "client_ip" => Some(HashKey::ClientIp),
            Some(("header", name)) if !name.is_empty() => Some(HashKey::Header(name.to_ascii_lowercase())),
            Some(("cookie", name)) if !name.is_empty() => Some(HashKey::Cookie(name.to_string())),
            _ => None,
        };
        if parsed.is_none() {
            ctx.error(Some(node.line), format!("expected client_ip, header:NAME or cookie:NAME, found {text:?}"));
        }
        parsed
    }
}

impl Decode for Endpoint {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        // Shorthand: a bare address string.
        if node.scalar().is_some() {
            return SocketAddr::decode(node, ctx).map(|a| Endpoint { address: Some(a), weight: 1 });
        }
        let mut m = MapReader::new(node, ctx)?;
        let e = Endpoint { address: m.req::<Option<SocketAddr>>(ctx, "address"), weight: m.or(ctx, "weight", 1) };
        m.finish(ctx);
        Some(e)
    }
}

impl Decode for HealthCheckKind {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("http", HealthCheckKind::Http), ("tcp", HealthCheckKind::Tcp)])
    }
}

impl Decode for HealthCheck {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = HealthCheck::default();
        let mut m = MapReader::new(node, ctx)?;
        let h = HealthCheck {
            kind: m.or(ctx, "type", d.kind),
            path: m.or(ctx, "path", d.path),
            host: m.opt(ctx, "host"),
            expect_status: m.or(ctx, "expect_status", d.expect_status),
            interval: m.or(ctx, "interval", d.interval),
            timeout: m.or(ctx, "timeout", d.timeout),
            rise: m.or(ctx, "rise", d.rise),
            fall: m.or(ctx, "fall", d.fall),
        };
        m.finish(ctx);
        Some(h)
    }
}

impl Decode for PassiveHealth {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = PassiveHealth::default();
        let mut m = MapReader::new(node, ctx)?;
        let p = PassiveHealth {
            consecutive_failures: m.or(ctx, "consecutive_failures", d.consecutive_failures),
            ejection_time: m.or(ctx, "ejection_time", d.ejection_time),
        };
        m.finish(ctx);
        Some(p)
    }
}

impl Decode for Upstream {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = Upstream::default();
        let mut m = MapReader::new(node, ctx)?;
        let u = Upstream {
            name: m.req(ctx, "name"),
            protocol: m.or(ctx, "protocol", d.protocol),
            balance: m.or(ctx, "balance", d.balance),
            hash_key: m.or(ctx, "hash_key", d.hash_key),
            endpoints: m.req(ctx, "endpoints"),
            health_check: m.opt(ctx, "health_check"),
            passive: m.or(ctx, "passive", d.passive),
            connect_timeout: m.or(ctx, "connect_timeout", d.connect_timeout),
            response_timeout: m.or(ctx, "response_timeout", d.response_timeout),
            max_idle_per_endpoint: m.opt(ctx, "max_idle_per_endpoint"),
            idle_timeout: m.or(ctx, "idle_timeout", d.idle_timeout),
        };
        m.finish(ctx);
        Some(u)
    }
}

impl Decode for HeaderMatch {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let name: String = m.req(ctx, "name");
        let h = HeaderMatch { name: name.to_ascii_lowercase(), value: m.opt(ctx, "value") };
        m.finish(ctx);
        Some(h)
    }
}

impl Decode for RouteMatch {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let r = RouteMatch {
            hosts: m.or(ctx, "hosts", Vec::new()),
            path: m.opt(ctx, "path"),
            path_prefix: m.opt(ctx, "path_prefix"),
            methods: m.or(ctx, "methods", Vec::new()),
            headers: m.or(ctx, "headers", Vec::new()),
        };
        m.finish(ctx);
        Some(r)
    }
}

impl Decode for DirectResponse {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let r = DirectResponse {
            status: m.or(ctx, "status", 200),
            headers: m.or(ctx, "headers", Vec::new()),
            body: m.or(ctx, "body", String::new()),
        };
        m.finish(ctx);
        Some(r)
    }
}

impl Decode for Canary {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let c =
            Canary { upstream: m.req(ctx, "upstream"), weight: m.or(ctx, "weight", 0), header: m.opt(ctx, "header") };
        m.finish(ctx);
        Some(c)
    }
}

impl Decode for RateLimit {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let rate: f64 = m.req(ctx, "rate");
        let default_burst = rate.ceil().max(1.0) as u32;
        let r = RateLimit { rate, burst: m.or(ctx, "burst", default_burst) };
        m.finish(ctx);
        Some(r)
    }
}

impl Decode for Route {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let r = Route {
            name: m.req(ctx, "name"),
            listeners: m.or(ctx, "listeners", Vec::new()),
            matches: m.or(ctx, "match", RouteMatch::default()),
            upstream: m.opt(ctx, "upstream"),
            direct_response: m.opt(ctx, "direct_response"),
            canary: m.opt(ctx, "canary"),
            allow: m.or(ctx, "allow", Vec::new()),
            deny: m.or(ctx, "deny", Vec::new()),
            rate_limit: m.opt(ctx, "rate_limit"),
        };
        m.finish(ctx);
        Some(r)
    }
}

// ----- the L4 plane -----

/// `l4`: the packet load balancer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct L4 {
    /// Network interfaces the plane runs on (AF_XDP, one socket per queue).
    pub interfaces: Vec<String>,
    /// Source addresses for FNAT: each connection to a real server gets one
    /// of these and a port allocated by the core that owns the session.
    pub local_addresses: Vec<std::net::IpAddr>,
    pub services: Vec<L4Service>,
    /// Packet I/O backend.
    pub io: L4Io,
    /// Session table capacity of each worker (per address family).
    pub max_sessions: usize,
}

/// How the L4 plane gets its packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L4Io {
    /// AF_XDP, falling back to AF_PACKET (with a warning) when it fails.
    #[default]
    Auto,
    AfXdp,
    AfPacket,
}

impl Decode for L4Io {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("auto", L4Io::Auto), ("af_xdp", L4Io::AfXdp), ("af_packet", L4Io::AfPacket)])
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum L4Protocol {
    #[default]
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L4Scheduler {
    /// Round robin (weights ignored).
    Rr,
    /// Smooth weighted round robin.
    #[default]
    Wrr,
    /// Weighted least connections.
    Wlc,
    /// Maglev consistent hashing of the client address and port.
    Maglev,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L4Mode {
    /// Destination NAT; replies must come back through the balancer.
    #[default]
    Nat,
    /// Full NAT: source rewritten to a local address too, so replies come
    /// back by routing alone.
    Fnat,
    /// Direct routing: only the MAC changes; the VIP sits on the real
    /// servers' loopback and they answer the client directly.
    Dr,
    /// IP-in-IP tunnel to the real server, which answers directly.
    Ipip,
    /// GUE (variant 1, UDP) tunnel to the real server.
    Gue,
}

/// What happens to a real server's sessions when its health check fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnServerDown {
    /// They go on until they end or time out; new sessions avoid it.
    #[default]
    Keep,
    /// TCP sessions are reset and all are forgotten.
    Reset,
}

#[derive(Debug, Clone, PartialEq)]
pub struct L4Timeouts {
    pub tcp_syn: Duration,
    pub tcp_established: Duration,
    pub tcp_fin: Duration,
    pub udp: Duration,
}

impl Default for L4Timeouts {
    fn default() -> Self {
        L4Timeouts {
            tcp_syn: Duration::from_secs(10),
            tcp_established: Duration::from_secs(900),
            tcp_fin: Duration::from_secs(30),
            udp: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct L4Service {
    pub name: String,
    /// The virtual address and port.
    pub address: Option<SocketAddr>,
    pub protocol: L4Protocol,
    pub scheduler: L4Scheduler,
    pub mode: L4Mode,
    /// UDP destination port of the GUE tunnel.
    pub gue_port: u16,
    pub real_servers: Vec<Endpoint>,
    pub timeouts: L4Timeouts,
    pub health_check: Option<HealthCheck>,
    pub on_server_down: OnServerDown,
}

impl Decode for L4 {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let l = L4 {
            interfaces: m.or(ctx, "interfaces", Vec::new()),
            local_addresses: m.or(ctx, "local_addresses", Vec::new()),
            services: m.or(ctx, "services", Vec::new()),
            io: m.or(ctx, "io", L4Io::Auto),
            max_sessions: m.or(ctx, "max_sessions", 1 << 20),
        };
        m.finish(ctx);
        Some(l)
    }
}

impl Decode for L4Protocol {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("tcp", L4Protocol::Tcp), ("udp", L4Protocol::Udp)])
    }
}

impl Decode for L4Scheduler {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(
            node,
            ctx,
            &[
                ("rr", L4Scheduler::Rr),
                ("wrr", L4Scheduler::Wrr),
                ("wlc", L4Scheduler::Wlc),
                ("maglev", L4Scheduler::Maglev),
            ],
        )
    }
}

impl Decode for L4Mode {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(
            node,
            ctx,
            &[
                ("nat", L4Mode::Nat),
                ("fnat", L4Mode::Fnat),
                ("dr", L4Mode::Dr),
                ("ipip", L4Mode::Ipip),
                ("gue", L4Mode::Gue),
            ],
        )
    }
}

impl Decode for OnServerDown {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("keep", OnServerDown::Keep), ("reset", OnServerDown::Reset)])
    }
}

impl Decode for L4Timeouts {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = L4Timeouts::default();
        let mut m = MapReader::new(node, ctx)?;
        let t = L4Timeouts {
            tcp_syn: m.or(ctx, "tcp_syn", d.tcp_syn),
            tcp_established: m.or(ctx, "tcp_established", d.tcp_established),
            tcp_fin: m.or(ctx, "tcp_fin", d.tcp_fin),
            udp: m.or(ctx, "udp", d.udp),
        };
        m.finish(ctx);
        Some(t)
    }
}

impl Decode for L4Service {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let s = L4Service {
            name: m.req(ctx, "name"),
            address: m.req::<Option<SocketAddr>>(ctx, "address"),
            protocol: m.or(ctx, "protocol", L4Protocol::Tcp),
            scheduler: m.or(ctx, "scheduler", L4Scheduler::Wrr),
            mode: m.or(ctx, "mode", L4Mode::Nat),
            gue_port: m.or(ctx, "gue_port", 6080),
            real_servers: m.req(ctx, "real_servers"),
            timeouts: m.or(ctx, "timeouts", L4Timeouts::default()),
            health_check: m.opt(ctx, "health_check"),
            on_server_down: m.or(ctx, "on_server_down", OnServerDown::Keep),
        };
        m.finish(ctx);
        Some(s)
    }
}
