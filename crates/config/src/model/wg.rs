//! The WireGuard plane's section.

use std::net::IpAddr;
use std::time::Duration;

use base64::Engine as _;
use ipnet::IpNet;
use zeroize::Zeroizing;

use crate::decode::{Ctx, Decode, MapReader, Named};
use crate::yaml::{Node, Value};

/// `wireguard`: VPN interfaces served by the WireGuard plane.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WireGuard {
    pub interfaces: Vec<WgInterface>,
}

/// A WireGuard public key (32 bytes, base64 in the config as `wg` prints it).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WgPublicKey(pub [u8; 32]);

impl WgPublicKey {
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.0)
    }
}

impl std::fmt::Debug for WgPublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_base64())
    }
}

/// A private or pre-shared key: zeroed on drop, never printed.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct WgSecret(pub Zeroizing<[u8; 32]>);

impl std::fmt::Debug for WgSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(secret)")
    }
}

/// Decodes a 32-byte key written in base64; `None` if it is not one.
pub fn decode_key(text: &str) -> Option<Zeroizing<[u8; 32]>> {
    let mut out = Zeroizing::new([0u8; 32]);
    let mut buf = Zeroizing::new([0u8; 33]);
    let n = base64::engine::general_purpose::STANDARD.decode_slice(text.trim(), &mut buf[..]).ok()?;
    if n != 32 {
        return None;
    }
    out.copy_from_slice(&buf[..32]);
    Some(out)
}

const KEY_EXPECTED: &str = "a WireGuard key (32 bytes in base64, as `wg genkey` and `wg pubkey` print)";

impl Decode for WgPublicKey {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar().and_then(decode_key) {
            Some(k) if *k == [0; 32] => {
                ctx.error(Some(node.line), "is all zeroes: not a public key");
                None
            }
            Some(k) => Some(WgPublicKey(*k)),
            None => {
                ctx.error(Some(node.line), format!("expected {KEY_EXPECTED}"));
                None
            }
        }
    }
}

impl Decode for WgSecret {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar().and_then(decode_key) {
            Some(k) => Some(WgSecret(k)),
            // The text is not echoed: it may be a mistyped secret.
            None => {
                ctx.error(Some(node.line), format!("expected {KEY_EXPECTED}"));
                None
            }
        }
    }
}

/// An address of the interface with its prefix length (not truncated:
/// `10.0.0.1/24` is the address 10.0.0.1 on the network 10.0.0.0/24).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceAddress {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Decode for InterfaceAddress {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let text = node.scalar().unwrap_or("");
        let parsed = match text.parse::<IpNet>() {
            Ok(n) => Some(InterfaceAddress { addr: n.addr(), prefix: n.prefix_len() }),
            Err(_) => {
                text.parse::<IpAddr>().ok().map(|a| InterfaceAddress { addr: a, prefix: IpNet::from(a).prefix_len() })
            }
        };
        if parsed.is_none() {
            ctx.error(
                Some(node.line),
                format!("expected an address with a prefix length such as 10.0.0.1/24, found {text:?}"),
            );
        }
        parsed
    }
}

/// Where a private key comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum KeySource {
    Inline(WgSecret),
    /// A file holding the key in base64 (as `wg genkey` writes it); relative
    /// to the config file's directory. Read on every load.
    File(String),
}

impl KeySource {
    /// The key under `name` (inline) or `name_file` (a file): exactly one
    /// of them is required.
    pub fn read(m: &mut MapReader<'_>, ctx: &mut Ctx, name: &str) -> KeySource {
        let file = format!("{name}_file");
        match (m.has(name), m.has(&file)) {
            (true, false) => KeySource::Inline(m.req(ctx, name)),
            (false, true) => KeySource::File(m.req(ctx, &file)),
            (both, _) => {
                let _ = m.opt::<WgSecret>(ctx, name);
                let _ = m.opt::<String>(ctx, &file);
                let msg = if both { format!("give {name} or {file}, not both") } else { "is required".to_string() };
                ctx.error_at(name, Some(m.line_of(name)), msg);
                KeySource::default()
            }
        }
    }
}

impl Default for KeySource {
    fn default() -> Self {
        KeySource::Inline(WgSecret::default())
    }
}

/// How an interface meets the packets it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WgMode {
    /// A TUN interface: the host routes packets into the tunnel (hosts,
    /// road warriors, anything the kernel's stack should see).
    #[default]
    Tun,
    /// A router between a LAN NIC and a WAN NIC on AF_XDP: packets to the
    /// peers' allowed IPs are taken off the LAN and sealed out of the WAN,
    /// the tunnel's datagrams taken off the WAN and opened onto the LAN,
    /// with no TUN interface and no kernel stack on the way. Everything
    /// else on both NICs stays the kernel's.
    Router,
}

impl Named for WgMode {
    const NAMES: &'static [(&'static str, Self)] = &[("tun", WgMode::Tun), ("router", WgMode::Router)];
}

/// `wireguard.interfaces[].router`: the NICs of router mode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WgRouter {
    /// The site's side: packets to the peers' allowed IPs come in here,
    /// opened packets go out here.
    pub lan: String,
    /// The tunnel's side: the UDP port's datagrams come in here and sealed
    /// ones go out here.
    pub wan: String,
}

impl Decode for WgRouter {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let r = WgRouter { lan: m.req(ctx, "lan"), wan: m.req(ctx, "wan") };
        m.finish(ctx);
        Some(r)
    }
}

/// `wireguard.interfaces[]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WgInterface {
    /// The TUN interface's name (at most 15 bytes); also the UAPI socket's
    /// (in router mode only the UAPI socket's and the metrics').
    pub name: String,
    /// `tun` (default) or `router`.
    pub mode: WgMode,
    /// Router mode's NICs (required in that mode, refused in the other).
    pub router: Option<WgRouter>,
    pub private_key: KeySource,
    /// UDP port for every address; default 51820.
    pub listen_port: u16,
    /// Addresses given to the interface (with their connected routes).
    pub addresses: Vec<InterfaceAddress>,
    /// Default 1420: a 1500-byte path less the IPv6 and WireGuard overhead.
    pub mtu: u32,
    /// `SO_MARK` on the UDP sockets (0: none), to keep the tunnel's own
    /// packets out of routes that point into the tunnel.
    pub fwmark: u32,
    /// Whether the plane adds a route into the tunnel for every peer's
    /// allowed IPs (as wg-quick does). Default true.
    pub routes: bool,
    pub peers: Vec<WgPeer>,
}

/// `wireguard.interfaces[].peers[]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WgPeer {
    /// A label for metrics, status and the admin API; default the public
    /// key's first 8 characters.
    pub name: String,
    pub public_key: WgPublicKey,
    pub preshared_key: Option<WgSecret>,
    /// `host:port` or `IP:port`; a name is resolved again while no
    /// handshake has come from the peer. None: the peer must call first.
    pub endpoint: Option<String>,
    pub allowed_ips: Vec<IpNet>,
    /// Keepalive interval (none when absent or 0).
    pub persistent_keepalive: Option<Duration>,
}

impl Decode for WireGuard {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let w = WireGuard { interfaces: m.or(ctx, "interfaces", Vec::new()) };
        m.finish(ctx);
        Some(w)
    }
}

impl Decode for WgInterface {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let private_key = KeySource::read(&mut m, ctx, "private_key");
        let i = WgInterface {
            name: m.req(ctx, "name"),
            mode: m.or(ctx, "mode", WgMode::Tun),
            router: m.opt(ctx, "router"),
            private_key,
            listen_port: m.or(ctx, "listen_port", 51820),
            addresses: m.or(ctx, "addresses", Vec::new()),
            mtu: m.or(ctx, "mtu", 1420),
            fwmark: m.or(ctx, "fwmark", 0),
            routes: m.or(ctx, "routes", true),
            peers: m.or(ctx, "peers", Vec::new()),
        };
        m.finish(ctx);
        Some(i)
    }
}

impl Decode for WgPeer {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let mut m = MapReader::new(node, ctx)?;
        let public_key: WgPublicKey = m.req(ctx, "public_key");
        let name = m.opt(ctx, "name").unwrap_or_else(|| public_key.to_base64().chars().take(8).collect());
        let p = WgPeer {
            name,
            public_key,
            preshared_key: m.opt(ctx, "preshared_key"),
            endpoint: m.opt(ctx, "endpoint"),
            allowed_ips: m.or(ctx, "allowed_ips", Vec::new()),
            persistent_keepalive: m.opt::<Keepalive>(ctx, "persistent_keepalive").and_then(|k| k.0),
        };
        m.finish(ctx);
        Some(p)
    }
}

/// A keepalive interval: a duration, or whole seconds as `wg` takes it;
/// 0 or `off` for none.
struct Keepalive(Option<Duration>);

impl Decode for Keepalive {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let text = node.scalar().unwrap_or("");
        let d = match text {
            "off" | "0" => Some(Duration::ZERO),
            t => t.parse::<u16>().ok().map(|s| Duration::from_secs(u64::from(s))).or_else(|| {
                if matches!(node.value, Value::Scalar { .. }) { crate::decode::parse_duration(t) } else { None }
            }),
        };
        match d {
            Some(d) if d.is_zero() => Some(Keepalive(None)),
            Some(d) if d <= Duration::from_secs(65535) && d.subsec_nanos() == 0 => Some(Keepalive(Some(d))),
            _ => {
                ctx.error(
                    Some(node.line),
                    format!("expected whole seconds from 1 to 65535 (such as 25 or 25s), or off; found {text:?}"),
                );
                None
            }
        }
    }
}
