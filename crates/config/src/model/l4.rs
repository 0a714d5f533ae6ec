//! The L4 plane's section.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Endpoint, HealthCheck};

use crate::decode::{Ctx, Decode, MapReader, decode_enum};
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
