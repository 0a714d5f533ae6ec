//! The L4 plane's data path over a vector of frames (IPv4 and IPv6): a
//! [`Worker`] takes the frames one receive batch brought and returns a
//! verdict for each, rewriting forwarded frames in place.
//!
//! The [`Plane`] (services, real servers, Maglev tables) is built off the
//! fast path and shared read-only; a [`Worker`] (session table, FNAT ports,
//! scheduler cursors, counters) belongs to one core and is never locked.
//!
//! - `worker`: the per-core pipeline: classify, hash, look up
//!   (software-pipelined), finish each packet by its class;
//! - `sessions`: a core's sessions and what they hold (tables, port pools,
//!   schedulers, counters, the sync queue), which every feature works on;
//! - `family`: the session tables of both address families;
//! - `forward`: a client's packet sent on by the service's mode;
//! - `snat_rules` and `snat`: SNAT's rules and keys, and its packet path;
//! - `synproxy`: SYN cookies and the proxied handshake;
//! - `icmp`: ICMP errors about a session's packets, sent back where the
//!   packet came from;
//! - `sync`: the records a core queues for the peer balancer;
//! - `fnat`: each core's FNAT local ports;
//! - `counters`: what a core counts, drop reasons among them.
//!
//! The features take the session state they need ([`sessions`]), never
//! the worker: the worker calls them, and nothing calls back into it.

mod counters;
mod family;
mod fnat;
mod forward;
mod icmp;
mod sessions;
mod snat;
mod snat_rules;
mod sync;
mod synproxy;
#[cfg(test)]
mod tests;
mod worker;

use std::collections::HashMap;
use std::net::IpAddr;

use gatehouse_balance::MaglevTable;
use gatehouse_config::{L4Mode, L4Scheduler};

pub use counters::{Counters, DROP_KINDS, DropReason, ServiceCounters, SnatCounters};
pub use snat_rules::{SNAT, SnatRule, in_prefix, is_snat, prefix};
pub use sync::{CommitError, SyncOut};
pub use worker::Worker;

use gatehouse_wire::packet::{Checks, PROTO_TCP, PROTO_UDP};

/// Frames per vector, at most.
pub const VECTOR: usize = 256;
/// Maglev table size (prime).
pub const MAGLEV_SIZE: usize = 65537;

/// A small, fast hasher for the plane's lookups by address and port. Its
/// maps hold only configured services and servers, so keys an attacker picks
/// can only miss, never pile up in one chain.
#[derive(Clone, Copy, Default)]
pub struct FastHash;

pub struct FastHasher(u64);

impl std::hash::BuildHasher for FastHash {
    type Hasher = FastHasher;
    fn build_hasher(&self) -> FastHasher {
        FastHasher(0)
    }
}

impl std::hash::Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, x: u8) {
        self.write_u64(u64::from(x));
    }
    fn write_u16(&mut self, x: u16) {
        self.write_u64(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_u128(&mut self, x: u128) {
        self.write_u64(x as u64);
        self.write_u64((x >> 64) as u64);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// What to do with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send it (rewritten in place; `head`/`len` of its buffer may have moved).
    Forward,
    /// Not for the plane: give it to the kernel.
    Pass,
    Drop(DropReason),
}

/// One frame in a buffer with headroom (for tunnel headers).
pub struct Buf<'a> {
    pub mem: &'a mut [u8],
    pub head: usize,
    pub len: usize,
}

impl Buf<'_> {
    pub fn frame(&self) -> &[u8] {
        &self.mem[self.head..self.head + self.len]
    }

    pub fn frame_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.head..self.head + self.len]
    }
}

pub struct Real {
    pub addr: IpAddr,
    pub port: u16,
    pub weight: u32,
    pub up: bool,
}

pub struct Service {
    pub name: String,
    pub vip: IpAddr,
    pub port: u16,
    pub proto: u8,
    pub mode: L4Mode,
    pub scheduler: L4Scheduler,
    pub gue_port: u16,
    /// When a real server is down, its sessions end at their next packet,
    /// TCP ones with a reset to the sender (`on_server_down: reset`).
    pub reset_on_down: bool,
    pub reals: Vec<Real>,
    pub maglev: Option<MaglevTable>,
    /// Timeouts in clock ticks, by [`State`].
    pub timeouts: [u32; 4],
    /// When SYNs are answered with cookies (`Off` for what the proxy cannot
    /// serve: UDP, and modes whose replies bypass the balancer).
    pub syn_proxy: gatehouse_config::SynProxyMode,
    /// SYNs per tick, per worker, that turn `Auto` on.
    pub syn_threshold: u32,
}

/// The shared, read-only part: services and where things are.
pub struct Plane {
    pub services: Vec<Service>,
    by_vip: HashMap<Endpoint, u16, FastHash>,
    /// NAT replies come from (real address, port, protocol) of a NAT service.
    by_real: HashMap<Endpoint, (u16, u16), FastHash>,
    /// FNAT local addresses (the first `fnat_locals`), then SNAT addresses.
    pub local_addrs: Vec<IpAddr>,
    /// By local address: the ports it goes out from (`first..=last`).
    pub local_ports: Vec<(u16, u16)>,
    pub fnat_locals: usize,
    /// SNAT rules (`l4.snat`).
    pub snat: Vec<SnatRule>,
    /// Addresses answered for (ARP, neighbour discovery): VIPs and local ones.
    owned: Vec<IpAddr>,
    /// This host's MAC, and the next hop's for everything sent.
    pub mac: [u8; 6],
    pub next_hop_mac: [u8; 6],
    pub cores: u16,
    pub checks: Checks,
    /// Some service resets the sessions of a server that is down, and one
    /// of its servers is: only then do packets look at their server's
    /// health.
    resetting: bool,
    /// The SYN cookies' secret: the I/O layer sets one per process (a new
    /// plane on every reload must keep it, or cookies in flight would fail).
    pub syn_secret: [u64; 2],
}

impl Plane {
    pub fn new(
        mut services: Vec<Service>,
        local_addrs: Vec<IpAddr>,
        mac: [u8; 6],
        next_hop_mac: [u8; 6],
        cores: u16,
    ) -> Plane {
        let mut by_vip = HashMap::with_hasher(FastHash);
        let mut by_real = HashMap::with_hasher(FastHash);
        for (i, s) in services.iter_mut().enumerate() {
            by_vip.insert(Endpoint::new(s.vip, s.port, s.proto), i as u16);
            // Only NAT replies come from a real server's own address (FNAT
            // replies go to a local address; DR and tunnels bypass the
            // balancer). Configs give a NAT real server to one service.
            if s.mode == L4Mode::Nat {
                for (j, r) in s.reals.iter().enumerate() {
                    by_real.entry(Endpoint::new(r.addr, r.port, s.proto)).or_insert((i as u16, j as u16));
                }
            }
            if s.scheduler == L4Scheduler::Maglev && s.maglev.is_none() {
                let names: Vec<(String, u32)> =
                    s.reals.iter().map(|r| (format!("{}:{}", r.addr, r.port), r.weight)).collect();
                s.maglev = MaglevTable::build(&names, MAGLEV_SIZE).ok();
            }
        }
        let mut owned: Vec<IpAddr> = services.iter().map(|s| s.vip).chain(local_addrs.iter().copied()).collect();
        owned.sort();
        owned.dedup();
        let resetting = services.iter().any(|s| s.reset_on_down && s.reals.iter().any(|r| !r.up));
        Plane {
            services,
            by_vip,
            by_real,
            fnat_locals: local_addrs.len(),
            local_ports: vec![fnat::FNAT_PORTS; local_addrs.len()],
            local_addrs,
            snat: Vec::new(),
            owned,
            mac,
            next_hop_mac,
            cores: cores.max(1),
            checks: Checks::default(),
            resetting,
            syn_secret: [fastrand::u64(..), fastrand::u64(..)],
        }
    }
}

impl Service {
    /// The services of an `l4` config section; timeouts in ticks of
    /// `tick`. `up(service, real)` says whether a real server is healthy.
    pub fn from_config(
        l4: &gatehouse_config::L4,
        tick: std::time::Duration,
        up: &dyn Fn(usize, usize) -> bool,
    ) -> Vec<Service> {
        let ticks =
            |d: std::time::Duration| (d.as_millis() / tick.as_millis().max(1)).clamp(1, u128::from(u32::MAX)) as u32;
        l4.services
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let vip = s.address?;
                let t = &s.timeouts;
                Some(Service {
                    name: s.name.clone(),
                    vip: vip.ip(),
                    port: vip.port(),
                    proto: match s.protocol {
                        gatehouse_config::L4Protocol::Tcp => PROTO_TCP,
                        gatehouse_config::L4Protocol::Udp => PROTO_UDP,
                    },
                    mode: s.mode,
                    scheduler: s.scheduler,
                    gue_port: s.gue_port,
                    reset_on_down: s.on_server_down == gatehouse_config::OnServerDown::Reset,
                    reals: s
                        .real_servers
                        .iter()
                        .enumerate()
                        .filter_map(|(j, r)| {
                            let a = r.address?;
                            Some(Real { addr: a.ip(), port: a.port(), weight: r.weight, up: up(i, j) })
                        })
                        .collect(),
                    maglev: None,
                    // By `State`: SYN sent, established, closing, datagram.
                    timeouts: [ticks(t.tcp_syn), ticks(t.tcp_established), ticks(t.tcp_fin), ticks(t.udp)],
                    syn_proxy: if s.protocol == gatehouse_config::L4Protocol::Tcp
                        && matches!(s.mode, L4Mode::Nat | L4Mode::Fnat)
                    {
                        s.syn_proxy.mode
                    } else {
                        gatehouse_config::SynProxyMode::Off
                    },
                    syn_threshold: (u64::from(s.syn_proxy.threshold) * tick.as_millis() as u64 / 1000).max(1) as u32,
                })
            })
            .collect()
    }
}

impl Plane {
    /// Whether sessions made under `old` stay meaningful under this plane:
    /// every service of `old` is here at the same place with the same
    /// address, protocol and mode, its real servers first and in the same
    /// order (new ones only appended), and the local addresses are the
    /// same. Weights, health and schedulers may differ.
    pub fn extends(&self, old: &Plane) -> bool {
        self.local_addrs == old.local_addrs
            && self.services.len() >= old.services.len()
            && self.services.iter().zip(&old.services).all(|(n, o)| {
                (n.vip, n.port, n.proto, n.mode) == (o.vip, o.port, o.proto, o.mode)
                    && n.reals.len() >= o.reals.len()
                    && n.reals.iter().zip(&o.reals).all(|(a, b)| (a.addr, a.port) == (b.addr, b.port))
            })
    }
}

/// An address as a map key for both families (IPv4 as IPv4-mapped IPv6,
/// `::ffff:a.b.c.d`).
fn addr_key(a: IpAddr) -> u128 {
    match a {
        IpAddr::V4(a) => 0xffff_0000_0000 | u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// (address, port, protocol) as a key of the plane's service and server
/// maps, hashed in one step of [`FastHasher`].
#[derive(Clone, Copy, PartialEq, Eq)]
struct Endpoint {
    addr: u128,
    port: u16,
    proto: u8,
}

impl Endpoint {
    fn new(addr: IpAddr, port: u16, proto: u8) -> Endpoint {
        Endpoint { addr: addr_key(addr), port, proto }
    }
}

impl std::hash::Hash for Endpoint {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        let (lo, hi) = (self.addr as u64, (self.addr >> 64) as u64);
        h.write_u64(lo ^ hi.rotate_left(23) ^ ((u64::from(self.port) << 8 | u64::from(self.proto)) << 40));
    }
}
