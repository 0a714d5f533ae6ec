//! The L4 plane's section.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Endpoint, HealthCheck};

use crate::decode::{Ctx, Decode, MapReader, Named, decode_enum};
use crate::yaml::Node;

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
    /// Active/standby with a peer balancer (keepalived sets the role).
    pub ha: Option<L4Ha>,
    /// Real servers (or any inside host) reaching the outside through the
    /// balancer.
    pub snat: Vec<L4Snat>,
}

/// `l4.snat[]`: hosts of `sources` going out from `addresses`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct L4Snat {
    pub name: String,
    pub sources: Vec<ipnet::IpNet>,
    /// Addresses the balancer owns (and announces) to go out from.
    pub addresses: Vec<std::net::IpAddr>,
    /// The ports they go out from, `first..=last` (default 1024-65535).
    pub ports: PortRange,
    pub timeouts: L4Timeouts,
}

/// `"1024-65535"`: a range of ports, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange { first: 1024, last: u16::MAX }
    }
}

impl Decode for PortRange {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let text = node.scalar().unwrap_or("");
        let parsed = text.split_once('-').and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
        match parsed {
            Some((first, last)) if first >= 1 && first <= last => Some(PortRange { first, last }),
            _ => {
                ctx.error(Some(node.line), format!("expected a port range such as 1024-65535, found {text:?}"));
                None
            }
        }
    }
}

impl Decode for L4Snat {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let s = L4Snat {
            name: m.req(ctx, "name"),
            sources: m.req(ctx, "sources"),
            addresses: m.req(ctx, "addresses"),
            ports: m.or(ctx, "ports", PortRange::default()),
            timeouts: m.or(ctx, "timeouts", L4Timeouts::default()),
        };
        m.finish(ctx);
        Some(s)
    }
}

/// A balancer's role in an active/standby pair, as VRRP names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HaRole {
    /// Owns the VIPs and FNAT local addresses: answers for them.
    Master,
    /// Answers nothing for them; keeps the master's sessions apart, ready.
    #[default]
    Backup,
    /// Out of service (keepalived's FAULT): as a backup.
    Fault,
}

impl HaRole {
    pub const ALL: [HaRole; 3] = [HaRole::Master, HaRole::Backup, HaRole::Fault];

    pub fn name(self) -> &'static str {
        match self {
            HaRole::Master => "master",
            HaRole::Backup => "backup",
            HaRole::Fault => "fault",
        }
    }

    /// `master`, `BACKUP`, ... (keepalived writes them upper-case).
    pub fn parse(s: &str) -> Option<HaRole> {
        HaRole::ALL.into_iter().find(|r| r.name().eq_ignore_ascii_case(s.trim()))
    }
}

impl Decode for HaRole {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(node, ctx, &[("master", HaRole::Master), ("backup", HaRole::Backup), ("fault", HaRole::Fault)])
    }
}

/// `l4.ha`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct L4Ha {
    /// The role at start, until keepalived's notify (`gatehouse ha`, or
    /// `PUT /ha`) says otherwise. Default backup: a node answers for the
    /// VIPs only once told it is the master.
    pub initial: HaRole,
    /// Gratuitous ARPs (IPv4) and unsolicited neighbour advertisements
    /// (IPv6) sent for each owned address on becoming master. Default 3.
    pub announce: u32,
    pub sync: Option<L4Sync>,
}

/// `l4.ha.sync`: sessions sent to the peer balancer over UDP.
#[derive(Debug, Clone, PartialEq)]
pub struct L4Sync {
    /// Where this node receives the peer's sessions (an address of its own).
    pub listen: SocketAddr,
    /// The peer's `listen`.
    pub peer: SocketAddr,
    /// The shared key that authenticates every message (32 bytes, base64).
    pub key: super::KeySource,
    /// This node's id in the pair (1-255); messages from the same id are
    /// refused. Default: the last byte of `listen`'s address.
    pub node_id: Option<u8>,
    /// Sessions sent per second at most (new, changed and refreshed alike).
    pub max_rate: u32,
    /// Each long-lived session is sent again within this period, so the
    /// peer's copy never expires while it lives.
    pub refresh: Duration,
}

impl Default for L4Sync {
    fn default() -> Self {
        let any = SocketAddr::from(([0, 0, 0, 0], 0));
        L4Sync {
            listen: any,
            peer: any,
            key: super::KeySource::default(),
            node_id: None,
            max_rate: 200_000,
            refresh: Duration::from_secs(30),
        }
    }
}

impl L4Sync {
    /// The node id in use: `node_id`, or the last byte of `listen`.
    pub fn node(&self) -> u8 {
        self.node_id.unwrap_or(match self.listen.ip() {
            std::net::IpAddr::V4(a) => a.octets()[3],
            std::net::IpAddr::V6(a) => a.octets()[15],
        })
    }
}

impl Decode for L4Ha {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let h = L4Ha {
            initial: m.or(ctx, "initial", HaRole::Backup),
            announce: m.or(ctx, "announce", 3),
            sync: m.opt(ctx, "sync"),
        };
        m.finish(ctx);
        Some(h)
    }
}

impl Decode for L4Sync {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let key = super::KeySource::read(&mut m, ctx, "key");
        let d = L4Sync::default();
        let s = L4Sync {
            listen: m.req::<Option<SocketAddr>>(ctx, "listen").unwrap_or(d.listen),
            peer: m.req::<Option<SocketAddr>>(ctx, "peer").unwrap_or(d.peer),
            key,
            node_id: m.opt(ctx, "node_id"),
            max_rate: m.or(ctx, "max_rate", d.max_rate),
            refresh: m.or(ctx, "refresh", d.refresh),
        };
        m.finish(ctx);
        Some(s)
    }
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
    pub syn_proxy: SynProxy,
    /// Announce the VIP as a /32 or /128 through `bgp` while a real server
    /// is healthy (and, with `ha`, while this node is the master).
    pub announce: bool,
}

/// When a TCP service answers SYNs itself with SYN cookies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SynProxyMode {
    Off,
    /// When a worker sees more than `threshold` SYNs a second for the
    /// service, for at least 10 seconds after.
    #[default]
    Auto,
    Always,
}

/// `l4.services[].syn_proxy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SynProxy {
    pub mode: SynProxyMode,
    /// SYNs per second, per worker, that turn `auto` on.
    pub threshold: u32,
}

impl Default for SynProxy {
    fn default() -> Self {
        SynProxy { mode: SynProxyMode::Auto, threshold: 20_000 }
    }
}

impl Decode for SynProxyMode {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        decode_enum(
            node,
            ctx,
            &[("off", SynProxyMode::Off), ("auto", SynProxyMode::Auto), ("always", SynProxyMode::Always)],
        )
    }
}

impl Decode for SynProxy {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = SynProxy::default();
        let mut m = MapReader::new(node, ctx)?;
        let s = SynProxy { mode: m.or(ctx, "mode", d.mode), threshold: m.or(ctx, "threshold", d.threshold) };
        m.finish(ctx);
        Some(s)
    }
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
            ha: m.opt(ctx, "ha"),
            snat: m.or(ctx, "snat", Vec::new()),
        };
        m.finish(ctx);
        Some(l)
    }
}

impl Named for L4Protocol {
    const NAMES: &'static [(&'static str, Self)] = &[("tcp", L4Protocol::Tcp), ("udp", L4Protocol::Udp)];
}

impl Named for L4Scheduler {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("rr", L4Scheduler::Rr),
        ("wrr", L4Scheduler::Wrr),
        ("wlc", L4Scheduler::Wlc),
        ("maglev", L4Scheduler::Maglev),
    ];
}

impl Named for L4Mode {
    const NAMES: &'static [(&'static str, Self)] = &[
        ("nat", L4Mode::Nat),
        ("fnat", L4Mode::Fnat),
        ("dr", L4Mode::Dr),
        ("ipip", L4Mode::Ipip),
        ("gue", L4Mode::Gue),
    ];
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
            syn_proxy: m.opt(ctx, "syn_proxy").unwrap_or_default(),
            announce: m.or(ctx, "announce", false),
        };
        m.finish(ctx);
        Some(s)
    }
}
