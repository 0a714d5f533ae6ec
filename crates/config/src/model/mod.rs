//! The typed config model. Every field's meaning and default is documented
//! here and in docs/CONFIG.md; keep the two in step.

mod bgp;
mod http;
mod l4;
mod wg;

use std::net::SocketAddr;
use std::time::Duration;

use ipnet::IpNet;

pub use bgp::*;
pub use http::*;
pub use l4::*;
pub use wg::*;

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
    /// The WireGuard VPN plane; off when absent.
    pub wireguard: Option<WireGuard>,
    /// VIPs announced to routers through a BGP daemon; none when absent.
    pub bgp: Option<Bgp>,
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
            wireguard: None,
            bgp: None,
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
            wireguard: m.opt(ctx, "wireguard"),
            bgp: m.opt(ctx, "bgp"),
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
