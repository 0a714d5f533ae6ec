//! The L7 plane's sections: HTTP settings, listeners, certificates,
//! upstreams and routes.

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

use crate::decode::{Ctx, Decode, MapReader, Named, decode_enum};
use crate::yaml::Node;

use super::KeyProvider;

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
    /// Time an idle keep-alive client connection is kept open; also how
    /// long an HTTP/2 client may leave its responses unread or without a
    /// flow-control window before its connection is closed.
    pub client_idle_timeout: Duration,
    /// QUIC, for listeners with `http3: true`.
    pub quic: QuicSettings,
}

/// When a QUIC handshake must first prove the client's address with a
/// Retry round trip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryPolicy {
    /// Once a worker has this many handshakes in flight (a flood of
    /// Initials from spoofed addresses looks like that).
    Above(u32),
    /// Every handshake.
    Always,
}

/// QUIC transport limits and defenses. The defaults are what a public edge
/// runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct QuicSettings {
    /// `retry: always`, or `retry_above: N` handshakes in flight per worker
    /// (default 64).
    pub retry: RetryPolicy,
    /// Streams a client may have open at once (requests in flight).
    pub max_streams: u64,
    /// Bytes a client may send on one stream before Gatehouse reads them.
    pub stream_window: u64,
    /// Bytes a client may send on a connection before Gatehouse reads them.
    pub connection_window: u64,
    /// 0-RTT requests: off by default; when on, only safe methods are
    /// served from early data, with `Early-Data: 1` passed upstream.
    pub early_data: bool,
    /// Bytes of QPACK dynamic table a client's encoder may fill per
    /// connection (0: none, every field spelled out or from the static
    /// table).
    pub qpack_table_capacity: usize,
    /// Request streams that may wait at once for table entries the
    /// client's encoder stream has not brought yet.
    pub qpack_blocked_streams: usize,
}

impl Default for QuicSettings {
    fn default() -> Self {
        QuicSettings {
            retry: RetryPolicy::Above(64),
            max_streams: 100,
            stream_window: 1 << 20,
            connection_window: 16 << 20,
            early_data: false,
            qpack_table_capacity: 4096,
            qpack_blocked_streams: 16,
        }
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            max_body_bytes: 10 * 1024 * 1024,
            client_header_timeout: Duration::from_secs(10),
            client_idle_timeout: Duration::from_secs(60),
            quic: QuicSettings::default(),
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
    /// Also serve HTTP/3 over QUIC on the same port over UDP (https only),
    /// advertised to TCP clients with `Alt-Svc`.
    pub http3: bool,
    /// Announce the address as a /32 or /128 through `bgp` while a route of
    /// this listener has a healthy upstream endpoint (or answers directly).
    pub announce: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum TlsVersion {
    #[default]
    Tls12,
    Tls13,
}

/// A TLS 1.3 cipher suite, by its IANA name (as OpenSSL's `-ciphersuites`
/// and HAProxy's `ciphersuites` spell it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls13Cipher {
    Aes128GcmSha256,
    Aes256GcmSha384,
    Chacha20Poly1305Sha256,
}

impl Tls13Cipher {
    /// The suite's code point.
    pub fn id(self) -> u16 {
        match self {
            Tls13Cipher::Aes128GcmSha256 => 0x1301,
            Tls13Cipher::Aes256GcmSha384 => 0x1302,
            Tls13Cipher::Chacha20Poly1305Sha256 => 0x1303,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ListenerTls {
    /// Lowest TLS version accepted: `"1.2"` (default) or `"1.3"`.
    pub min_version: TlsVersion,
    /// Highest TLS version accepted: `"1.3"` (default) or `"1.2"`.
    pub max_version: TlsVersion,
    /// OpenSSL-style cipher list for TLS 1.2. Default: BoringSSL's default
    /// list.
    pub ciphers: Option<String>,
    /// The TLS 1.3 suites offered, in the server's order of preference.
    /// Empty (the default): all three, chosen per client as Go's
    /// crypto/tls chooses them (AES-128-GCM for a client that lists AES-GCM
    /// first, ChaCha20-Poly1305 for one that lists it first).
    pub tls13_ciphers: Vec<Tls13Cipher>,
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
            tls13_ciphers: Vec::new(),
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
            quic: m.or(ctx, "quic", d.quic),
        };
        m.finish(ctx);
        Some(s)
    }
}

impl Decode for QuicSettings {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = QuicSettings::default();
        let mut m = MapReader::new(node, ctx)?;
        let always: bool = m.or(ctx, "retry_always", false);
        let above: u32 = m.or(ctx, "retry_above", 64);
        let s = QuicSettings {
            retry: if always { RetryPolicy::Always } else { RetryPolicy::Above(above) },
            max_streams: m.or(ctx, "max_streams", d.max_streams),
            stream_window: m.or(ctx, "stream_window", d.stream_window),
            connection_window: m.or(ctx, "connection_window", d.connection_window),
            early_data: m.or(ctx, "early_data", d.early_data),
            qpack_table_capacity: m.or(ctx, "qpack_table_capacity", d.qpack_table_capacity),
            qpack_blocked_streams: m.or(ctx, "qpack_blocked_streams", d.qpack_blocked_streams),
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

impl Decode for Tls13Cipher {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(
            node,
            ctx,
            &[
                ("TLS_AES_128_GCM_SHA256", Tls13Cipher::Aes128GcmSha256),
                ("TLS_AES_256_GCM_SHA384", Tls13Cipher::Aes256GcmSha384),
                ("TLS_CHACHA20_POLY1305_SHA256", Tls13Cipher::Chacha20Poly1305Sha256),
            ],
        )
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
            http3: m.or(ctx, "http3", false),
            announce: m.or(ctx, "announce", false),
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
            tls13_ciphers: m.or(ctx, "tls13_ciphers", d.tls13_ciphers),
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

impl Named for Balance {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("round_robin", Balance::RoundRobin),
        ("weighted_round_robin", Balance::WeightedRoundRobin),
        ("least_connections", Balance::LeastConnections),
        ("maglev", Balance::Maglev),
    ];
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

impl Named for HealthCheckKind {
    const NAMES: &'static [(&'static str, Self)] = &[("http", HealthCheckKind::Http), ("tcp", HealthCheckKind::Tcp)];
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
