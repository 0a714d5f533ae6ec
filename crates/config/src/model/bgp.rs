//! The `bgp` section: which BGP daemon announces this node's VIPs, how to
//! reach it, and what it tells its neighbours. Gatehouse speaks no BGP of
//! its own: it holds an interface whose addresses are the VIPs to announce
//! (the daemon's `direct` protocol exports them), writes the daemon's
//! protocols for the neighbours into a file of its own, and asks the daemon
//! to read it.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use crate::decode::{Ctx, Decode, MapReader};
use crate::yaml::Node;

/// `bgp`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bgp {
    pub daemon: BgpDaemon,
    /// The daemon's control socket. Default `/run/bird/bird.ctl`.
    pub socket: String,
    /// The file Gatehouse writes the daemon's protocols into; the daemon's
    /// own config includes it. Default `/etc/bird/gatehouse.conf`.
    pub include: String,
    /// The TUN interface whose addresses are the announced VIPs: it exists
    /// only while Gatehouse holds it open, so the routes leave with the
    /// process. Default `gh-vip`.
    pub interface: String,
    /// This node's AS number.
    pub asn: u32,
    /// The BGP router ID; default: the daemon's own.
    pub router_id: Option<Ipv4Addr>,
    /// The hold time offered to neighbours (keepalives at a third of it):
    /// how long a router keeps a dead node's routes without BFD. Default 9s.
    pub hold_time: Duration,
    /// On SIGTERM: how long the node keeps serving after withdrawing its
    /// routes, for the routers to converge, before it stops accepting.
    /// Default 3s.
    pub drain_delay: Duration,
    /// Attributes of every announced route, unless a `vips` entry says
    /// otherwise.
    pub attributes: RouteAttributes,
    pub neighbors: Vec<BgpNeighbor>,
    /// Per-VIP attributes, e.g. a higher MED where this node is a backup.
    pub vips: Vec<BgpVip>,
}

/// The BGP daemon Gatehouse drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BgpDaemon {
    /// BIRD 2: VIPs exported from the held interface by its `direct`
    /// protocol (the kernel withdraws them when the process dies), BFD
    /// built in, configured and queried through its control socket.
    #[default]
    Bird,
}

/// MED, local preference and communities of announced routes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RouteAttributes {
    /// MULTI_EXIT_DISC: lower is preferred by the neighbour's AS.
    pub med: Option<u32>,
    /// LOCAL_PREF, for neighbours in this node's own AS: higher is preferred.
    pub local_pref: Option<u32>,
    pub communities: Vec<Community>,
}

/// A BGP community: `ASN:VALUE` (RFC 1997) or `ASN:VALUE:VALUE` (large,
/// RFC 8092).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Community {
    Standard(u16, u16),
    Large(u32, u32, u32),
}

impl std::fmt::Display for Community {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Community::Standard(a, b) => write!(f, "{a}:{b}"),
            Community::Large(a, b, c) => write!(f, "{a}:{b}:{c}"),
        }
    }
}

impl Community {
    pub fn parse(s: &str) -> Option<Community> {
        let parts: Vec<&str> = s.trim().split(':').collect();
        match parts[..] {
            [a, b] => Some(Community::Standard(a.parse().ok()?, b.parse().ok()?)),
            [a, b, c] => Some(Community::Large(a.parse().ok()?, b.parse().ok()?, c.parse().ok()?)),
            _ => None,
        }
    }
}

/// `bgp.neighbors[]`: a router this node peers with.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BgpNeighbor {
    /// Names the daemon's protocol (`gatehouse_NAME`): letters, digits, `_`.
    pub name: String,
    pub address: Option<IpAddr>,
    pub asn: u32,
    /// The source address of the session; default: the daemon chooses.
    pub local_address: Option<IpAddr>,
    /// Bidirectional forwarding detection: the router drops this node's
    /// routes within a second of its link or host failing.
    pub bfd: bool,
    /// TCP MD5 password of the session.
    pub password: Option<String>,
    /// eBGP to a neighbour more than one hop away: the TTL.
    pub multihop: Option<u8>,
}

/// `bgp.vips[]`: attributes of one announced VIP.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BgpVip {
    pub address: Option<IpAddr>,
    pub attributes: RouteAttributes,
}

impl Default for Bgp {
    fn default() -> Self {
        Bgp {
            daemon: BgpDaemon::Bird,
            socket: "/run/bird/bird.ctl".into(),
            include: "/etc/bird/gatehouse.conf".into(),
            interface: "gh-vip".into(),
            asn: 0,
            router_id: None,
            hold_time: Duration::from_secs(9),
            drain_delay: Duration::from_secs(3),
            attributes: RouteAttributes::default(),
            neighbors: Vec::new(),
            vips: Vec::new(),
        }
    }
}

impl Decode for BgpDaemon {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar() {
            Some("bird") => Some(BgpDaemon::Bird),
            Some("gobgp") => {
                ctx.error(
                    Some(node.line),
                    "expected bird: GoBGP keeps routes added through its API after the process that \
                     added them dies, and has no BFD, so Gatehouse drives BIRD 2",
                );
                None
            }
            other => {
                ctx.error(Some(node.line), format!("expected bird, found {:?}", other.unwrap_or("")));
                None
            }
        }
    }
}

impl Decode for Community {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let text = node.scalar().unwrap_or("");
        let c = Community::parse(text);
        if c.is_none() {
            ctx.error(
                Some(node.line),
                format!(
                    "expected a community ASN:VALUE (16-bit each) or ASN:VALUE:VALUE (32-bit each), found {text:?}"
                ),
            );
        }
        c
    }
}

impl RouteAttributes {
    fn read(m: &mut MapReader<'_>, ctx: &mut Ctx) -> RouteAttributes {
        RouteAttributes {
            med: m.opt(ctx, "med"),
            local_pref: m.opt(ctx, "local_pref"),
            communities: m.or(ctx, "communities", Vec::new()),
        }
    }
}

impl Decode for Bgp {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let d = Bgp::default();
        let mut m = MapReader::new(node, ctx)?;
        let b = Bgp {
            daemon: m.or(ctx, "daemon", d.daemon),
            socket: m.or(ctx, "socket", d.socket),
            include: m.or(ctx, "include", d.include),
            interface: m.or(ctx, "interface", d.interface),
            asn: m.req(ctx, "asn"),
            router_id: m.opt(ctx, "router_id"),
            hold_time: m.or(ctx, "hold_time", d.hold_time),
            drain_delay: m.or(ctx, "drain_delay", d.drain_delay),
            attributes: RouteAttributes::read(&mut m, ctx),
            neighbors: m.or(ctx, "neighbors", Vec::new()),
            vips: m.or(ctx, "vips", Vec::new()),
        };
        m.finish(ctx);
        Some(b)
    }
}

impl Decode for BgpNeighbor {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let n = BgpNeighbor {
            name: m.req(ctx, "name"),
            address: m.req::<Option<IpAddr>>(ctx, "address"),
            asn: m.req(ctx, "asn"),
            local_address: m.opt(ctx, "local_address"),
            bfd: m.or(ctx, "bfd", false),
            password: m.opt(ctx, "password"),
            multihop: m.opt(ctx, "multihop"),
        };
        m.finish(ctx);
        Some(n)
    }
}

impl Decode for BgpVip {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let v =
            BgpVip { address: m.req::<Option<IpAddr>>(ctx, "address"), attributes: RouteAttributes::read(&mut m, ctx) };
        m.finish(ctx);
        Some(v)
    }
}

/// Every address the config marks `announce: true`, with where it is set
/// (`listeners[0]`, `l4.services[2]`), in config order, repeats kept.
pub fn announced_addresses(c: &super::Config) -> Vec<(IpAddr, String)> {
    let listeners = c.listeners.iter().enumerate().filter(|(_, l)| l.announce);
    let mut out: Vec<(IpAddr, String)> =
        listeners.filter_map(|(i, l)| Some((l.address?.ip(), format!("listeners[{i}]")))).collect();
    let services = c.l4.iter().flat_map(|l| l.services.iter().enumerate()).filter(|(_, s)| s.announce);
    out.extend(services.filter_map(|(i, s)| Some((s.address?.ip(), format!("l4.services[{i}]")))));
    out
}

/// Whether `name` can be part of a BIRD symbol.
fn symbol_ok(name: &str) -> bool {
    !name.is_empty() && name.len() <= 32 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The checks of `bgp` and of `announce: true` that need the whole config.
pub(crate) fn validate_bgp(c: &super::Config, ctx: &mut Ctx) {
    let announced = announced_addresses(c);
    for (ip, at) in &announced {
        if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() {
            ctx.error_at(
                &format!("{at}.announce"),
                None,
                format!("needs a unicast address of its own to announce, found {ip} in {at}.address"),
            );
        }
    }
    let Some(b) = &c.bgp else {
        if let Some((_, at)) = announced.first() {
            ctx.error_at(&format!("{at}.announce"), None, "needs a bgp section (the daemon that announces it)");
        }
        return;
    };
    ctx.with_field("bgp", |ctx| {
        if b.asn == 0 {
            ctx.error_at("asn", None, "expected an AS number from 1 to 4294967295");
        }
        if !crate::validate::interface_name_ok(&b.interface) {
            ctx.error_at(
                "interface",
                None,
                format!("expected an interface name of 1 to 15 bytes, found {:?}", b.interface),
            );
        }
        for (field, path) in [("socket", &b.socket), ("include", &b.include)] {
            if !path.starts_with('/') {
                ctx.error_at(field, None, format!("expected an absolute path, found {path:?}"));
            }
        }
        let secs = b.hold_time.as_secs();
        if b.hold_time.subsec_nanos() != 0 || !(3..=65535).contains(&secs) {
            ctx.error_at("hold_time", None, "must be whole seconds from 3s to 65535s (RFC 4271)");
        }
        if b.drain_delay > Duration::from_secs(300) {
            ctx.error_at("drain_delay", None, "must be at most 300s");
        }
        ctx.with_field("neighbors", |ctx| {
            let mut names = std::collections::HashSet::new();
            for (i, n) in b.neighbors.iter().enumerate() {
                ctx.with_index(i, |ctx| {
                    if !symbol_ok(&n.name) {
                        ctx.error_at(
                            "name",
                            None,
                            format!("expected 1 to 32 letters, digits or _, found {:?}", n.name),
                        );
                    } else if !names.insert(n.name.as_str()) {
                        ctx.error_at("name", None, format!("{:?} names another neighbor too", n.name));
                    }
                    if n.asn == 0 {
                        ctx.error_at("asn", None, "expected an AS number from 1 to 4294967295");
                    }
                    if let (Some(a), Some(l)) = (n.address, n.local_address)
                        && a.is_ipv4() != l.is_ipv4()
                    {
                        ctx.error_at("local_address", None, format!("{l} is not of the family of address {a}"));
                    }
                    if n.multihop == Some(0) {
                        ctx.error_at("multihop", None, "must be a TTL from 1 to 255");
                    }
                    if n.password.as_deref().is_some_and(|p| p.contains(['"', '\\', '\n'])) {
                        ctx.error_at("password", None, "must not contain a quote, a backslash or a line break");
                    }
                })
            }
        });
        ctx.with_field("vips", |ctx| {
            let mut seen = std::collections::HashSet::new();
            for (i, v) in b.vips.iter().enumerate() {
                let Some(a) = v.address else { continue };
                ctx.with_index(i, |ctx| {
                    if !announced.iter().any(|(ip, _)| *ip == a) {
                        ctx.error_at(
                            "address",
                            None,
                            format!("{a} is not the address of a listener or L4 service with announce: true"),
                        );
                    } else if !seen.insert(a) {
                        ctx.error_at("address", None, format!("{a} has attributes in another entry too"));
                    }
                })
            }
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communities_parse_both_kinds_and_refuse_the_rest() {
        assert_eq!(Community::parse("65000:100"), Some(Community::Standard(65000, 100)));
        assert_eq!(Community::parse("4200000000:1:2"), Some(Community::Large(4_200_000_000, 1, 2)));
        for bad in ["65536:1", "1", "a:b", "1:2:3:4", ""] {
            assert_eq!(Community::parse(bad), None, "{bad}");
        }
        assert_eq!(Community::Large(1, 2, 3).to_string(), "1:2:3");
    }

    const NODE: &str = r#"
listeners:
  - { name: web, address: "192.0.2.10:80", announce: true }
l4:
  interfaces: [eth0]
  services:
    - { name: dns, address: "192.0.2.53:53", protocol: udp, real_servers: ["10.0.0.5:53"], announce: true }
bgp:
  asn: 65001
  router_id: 10.0.0.2
  communities: ["65001:100"]
  neighbors:
    - { name: tor1, address: 10.0.0.1, asn: 65000, bfd: true }
  vips:
    - { address: 192.0.2.53, med: 50, communities: ["65001:7:8"] }
"#;

    fn errors(text: &str) -> Vec<String> {
        match crate::from_str(text, std::path::Path::new("n.yaml")) {
            Ok(_) => Vec::new(),
            Err(e) => e.errors.iter().map(|e| format!("{}: {}", e.path, e.message)).collect(),
        }
    }

    #[test]
    fn a_node_config_decodes_with_its_announced_addresses() {
        let c = crate::from_str(NODE, std::path::Path::new("n.yaml")).expect("valid");
        let b = c.bgp.as_ref().expect("bgp");
        assert_eq!((b.asn, b.hold_time, b.interface.as_str()), (65001, Duration::from_secs(9), "gh-vip"));
        assert_eq!(b.neighbors[0].address, Some(IpAddr::from([10, 0, 0, 1])));
        assert!(b.neighbors[0].bfd);
        assert_eq!(b.vips[0].attributes.med, Some(50));
        let announced: Vec<String> = announced_addresses(&c).iter().map(|(a, at)| format!("{a} {at}")).collect();
        assert_eq!(announced, ["192.0.2.10 listeners[0]", "192.0.2.53 l4.services[0]"]);
    }

    #[test]
    fn bad_sections_name_the_field_and_what_was_expected() {
        let cases = [
            ("asn: 65001", "asn: 0", "bgp.asn: expected an AS number"),
            ("asn: 65001", "asn: 65001\n  daemon: gobgp", "bgp.daemon: expected bird: GoBGP keeps routes"),
            ("name: tor1,", "name: \"tor 1\",", "bgp.neighbors[0].name: expected 1 to 32 letters"),
            ("address: 10.0.0.1,", "address: 10.0.0.300,", "bgp.neighbors[0].address: expected an IPv4 or IPv6"),
            ("\"65001:100\"", "\"65001:100000\"", "bgp.communities[0]: expected a community"),
            ("address: 192.0.2.53, med", "address: 192.0.2.99, med", "bgp.vips[0].address: 192.0.2.99 is not"),
            ("asn: 65001", "asn: 65001\n  hold_time: 1s", "bgp.hold_time: must be whole seconds"),
            ("192.0.2.10:80", "0.0.0.0:80", "listeners[0].announce: needs a unicast address"),
        ];
        for (from, to, want) in cases {
            let text = NODE.replace(from, &to.replace("\\n", "\n"));
            let got = errors(&text);
            assert!(got.iter().any(|e| e.starts_with(want)), "{want}: got {got:?}");
        }
        let without = NODE.split("bgp:").next().expect("head");
        let got = errors(without);
        assert!(
            got.iter().any(|e| e == "listeners[0].announce: needs a bgp section (the daemon that announces it)"),
            "{got:?}"
        );
    }
}
