//! The vector pipeline (IPv4 and IPv6): a worker takes a vector of frames and
//! returns a verdict for each, rewriting forwarded frames in place.
//!
//! Stages run over the whole vector, one after the other: parse every frame;
//! classify each (to a service, or as a reply from a real server); hash every
//! session key; look every key up; create sessions for the misses that may
//! start one (scheduling a real server); rewrite. Doing each step for all
//! packets before the next lets the CPU overlap the table's cache misses of
//! different packets instead of waiting for each in turn.
//!
//! The [`Plane`] (services, real servers, Maglev tables) is built off the
//! fast path and shared read-only; a [`Worker`] (session table, FNAT ports,
//! scheduler cursors, counters) belongs to one core and is never locked.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};

use gatehouse_balance::{Backends, LeastConnections, MaglevTable, RoundRobin, SmoothWeighted};
use gatehouse_config::{L4Mode, L4Scheduler};

use crate::encap::{Outer, Tunnel, encapsulate};
use crate::packet::{self, Checks, Ip, Malformed, PROTO_TCP, PROTO_UDP, Parsed, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN};
use crate::rewrite;
use crate::session::{Key, REVERSE, Session, State, Table};

/// Frames per vector, at most.
pub const VECTOR: usize = 256;
/// Maglev table size (prime).
pub const MAGLEV_SIZE: usize = 65537;
/// First FNAT source port; below are left to the host.
const FNAT_FIRST_PORT: u16 = 1024;

/// Why a frame was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Drop {
    Malformed(Malformed),
    /// Addressed to no service (and not a reply of a session).
    NoService,
    /// A TCP segment other than SYN for a session this core does not have.
    NoSession,
    NoHealthyServer,
    TableFull,
    /// FNAT: no free local port on this core.
    PortsExhausted,
    TtlExceeded,
    /// ICMP, or a change of address family, which this pipeline does not do.
    Unsupported,
}

impl Drop {
    /// Every reason, in counter order.
    pub fn all() -> impl Iterator<Item = Drop> {
        Malformed::ALL.into_iter().map(Drop::Malformed).chain([
            Drop::NoService,
            Drop::NoSession,
            Drop::NoHealthyServer,
            Drop::TableFull,
            Drop::PortsExhausted,
            Drop::TtlExceeded,
            Drop::Unsupported,
        ])
    }

    /// Its slot in [`Counters::drops`].
    pub fn index(self) -> usize {
        let base = Malformed::ALL.len();
        match self {
            Drop::Malformed(m) => Malformed::ALL.iter().position(|x| *x == m).unwrap_or(0),
            Drop::NoService => base,
            Drop::NoSession => base + 1,
            Drop::NoHealthyServer => base + 2,
            Drop::TableFull => base + 3,
            Drop::PortsExhausted => base + 4,
            Drop::TtlExceeded => base + 5,
            Drop::Unsupported => base + 6,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Drop::Malformed(m) => m.name(),
            Drop::NoService => "no_service",
            Drop::NoSession => "no_session",
            Drop::NoHealthyServer => "no_healthy_server",
            Drop::TableFull => "table_full",
            Drop::PortsExhausted => "ports_exhausted",
            Drop::TtlExceeded => "ttl_exceeded",
            Drop::Unsupported => "unsupported",
        }
    }
}

/// Drop reasons counted.
pub const DROP_KINDS: usize = Malformed::ALL.len() + 7;

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
    Drop(Drop),
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
}

/// The shared, read-only part: services and where things are.
pub struct Plane {
    pub services: Vec<Service>,
    by_vip: HashMap<Endpoint, u16, FastHash>,
    /// NAT replies come from (real address, port, protocol) of a NAT service.
    by_real: HashMap<Endpoint, (u16, u16), FastHash>,
    pub local_addrs: Vec<IpAddr>,
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
            local_addrs,
            owned,
            mac,
            next_hop_mac,
            cores: cores.max(1),
            checks: Checks::default(),
            resetting,
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
                })
            })
            .collect()
    }
}

fn sched_for(s: L4Scheduler) -> Sched {
    match s {
        L4Scheduler::Rr => Sched::Rr(RoundRobin::default()),
        L4Scheduler::Wrr => Sched::Wrr(SmoothWeighted::default()),
        L4Scheduler::Wlc => Sched::Wlc(LeastConnections::default()),
        L4Scheduler::Maglev => Sched::Maglev,
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

/// Per-service and per-real-server counters of one core.
#[derive(Clone, Debug, Default)]
pub struct ServiceCounters {
    pub packets: u64,
    pub bytes: u64,
    pub sessions_total: u64,
    pub sessions_active: u64,
    /// TCP resets sent for sessions of a real server that went down.
    pub resets: u64,
    pub per_real_packets: Vec<u64>,
    pub per_real_active: Vec<u64>,
}

#[derive(Clone, Debug)]
pub struct Counters {
    pub services: Vec<ServiceCounters>,
    /// By [`Drop::index`].
    pub drops: [u64; DROP_KINDS],
    pub passed: u64,
    /// ARP and neighbour discovery answers sent.
    pub answered: u64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters { services: Vec::new(), drops: [0; DROP_KINDS], passed: 0, answered: 0 }
    }
}

impl Counters {
    pub fn dropped(&self, d: Drop) -> u64 {
        self.drops[d.index()]
    }
}

enum Sched {
    Rr(RoundRobin),
    Wrr(SmoothWeighted),
    Wlc(LeastConnections),
    Maglev,
}

struct View<'a> {
    reals: &'a [Real],
    active: &'a [u64],
}

impl Backends for View<'_> {
    fn len(&self) -> usize {
        self.reals.len()
    }
    fn weight(&self, i: usize) -> u32 {
        self.reals[i].weight
    }
    fn available(&self, i: usize) -> bool {
        self.reals[i].up
    }
    fn load(&self, i: usize) -> u64 {
        self.active.get(i).copied().unwrap_or(0)
    }
}

/// Free FNAT ports of one local address on this core: the ports `p` with
/// `p % cores == core`, so that the XDP program can steer replies (by their
/// destination port) to the core that owns the session.
struct PortPool {
    free: Vec<u16>,
    /// Session number + 1 by port; 0: free.
    owner: Vec<u32>,
}

impl PortPool {
    fn new(core: u16, cores: u16) -> PortPool {
        let free = (FNAT_FIRST_PORT..=u16::MAX).rev().filter(|p| p % cores == core).collect();
        PortPool { free, owner: vec![0; 65536] }
    }
}

/// What the stages learn about one frame. The IP packet's details, when
/// it is one, are in the record beside it (`Worker::ips`).
#[derive(Clone, Copy)]
enum Class {
    Done(Verdict),
    /// From a client to service `svc`.
    ToService {
        svc: u16,
    },
    /// A NAT reply from real `real` of service `svc`.
    FromReal {
        svc: u16,
        real: u16,
    },
    /// An FNAT reply to local address `local`, port `port`.
    ToLocal {
        local: u16,
        port: u16,
    },
    /// An ARP request for an address of ours (the ARP header's offset).
    ArpFor {
        at: usize,
        addr: Ipv4Addr,
    },
    /// A neighbour solicitation for an address of ours.
    NdFor {
        addr: std::net::Ipv6Addr,
    },
    /// An ICMP error quoting a packet of one of our sessions.
    IcmpError,
}

impl Class {
    /// Whether the packet goes to the IPv6 session table (packets of
    /// sessions only; everything else is handled with the IPv4 one).
    fn is_v6(&self, ip: &Ip) -> bool {
        matches!(self, Class::ToService { .. } | Class::FromReal { .. } | Class::ToLocal { .. })
            && ip.flow.src.is_ipv6()
    }
}

/// An address family's session table and conversions.
pub trait Family: crate::session::Addr {
    fn of(ip: IpAddr) -> Self;
    fn ip(self) -> IpAddr;
    fn table(w: &Worker) -> &Table<Self>;
    fn table_mut(w: &mut Worker) -> &mut Table<Self>;
}

impl Family for u32 {
    fn of(ip: IpAddr) -> u32 {
        match ip {
            IpAddr::V4(a) => u32::from(a),
            IpAddr::V6(_) => 0,
        }
    }
    fn ip(self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(self))
    }
    fn table(w: &Worker) -> &Table<u32> {
        &w.t4
    }
    fn table_mut(w: &mut Worker) -> &mut Table<u32> {
        &mut w.t4
    }
}

impl Family for u128 {
    fn of(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V6(a) => u128::from(a),
            IpAddr::V4(_) => 0,
        }
    }
    fn ip(self) -> IpAddr {
        IpAddr::V6(std::net::Ipv6Addr::from(self))
    }
    fn table(w: &Worker) -> &Table<u128> {
        &w.t6
    }
    fn table_mut(w: &mut Worker) -> &mut Table<u128> {
        &mut w.t6
    }
}

/// One core's state.
pub struct Worker {
    pub core: u16,
    t4: Table<u32>,
    t6: Table<u128>,
    ports: Vec<PortPool>,
    scheds: Vec<Sched>,
    pub counters: Counters,
    scratch: Vec<u8>,
    classes: Vec<Class>,
    /// The IP details of each frame of the vector, parsed in place.
    ips: Vec<Ip>,
    probes: Vec<Probe>,
    /// By frame of the last vector: the neighbour a forwarded frame must
    /// go to when it is not its (outer) destination address: the real
    /// server in DR mode, whose packets keep the VIP as destination.
    pub next_hops: Vec<Option<IpAddr>>,
    hop: Option<IpAddr>,
}

/// A packet's session-table lookup: its key's hash, the family's table,
/// and whether it has one at all (only packets from clients and NAT
/// replies are looked up by key).
#[derive(Clone, Copy)]
struct Probe {
    hash: u64,
    v6: bool,
    indexed: bool,
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

/// Replaces the source and/or destination (address, port) and decrements the
/// TTL: IPv4 in one fused pass, IPv6 step by step (no header checksum
/// there). False when the TTL runs out.
fn nat(frame: &mut [u8], ip: &Ip, src: Option<(IpAddr, u16)>, dst: Option<(IpAddr, u16)>) -> bool {
    let v4 = |x: Option<(IpAddr, u16)>| match x {
        Some((IpAddr::V4(a), p)) => Ok(Some((a, p))),
        None => Ok(None),
        Some(_) => Err(()),
    };
    if let (Ok(s4), Ok(d4)) = (v4(src), v4(dst))
        && ip.flow.src.is_ipv4()
    {
        return rewrite::nat_v4(frame, ip, s4, d4);
    }
    if !rewrite::decrement_ttl(frame, ip) {
        return false;
    }
    for (is_src, change) in [(false, dst), (true, src)] {
        if let Some((a, p)) = change {
            set_addr(frame, ip, is_src, a);
            rewrite::set_port(frame, ip, is_src, p);
        }
    }
    true
}

fn set_addr(frame: &mut [u8], ip: &Ip, src: bool, a: IpAddr) {
    match a {
        IpAddr::V4(a) => rewrite::set_ipv4_addr(frame, ip, src, a),
        IpAddr::V6(a) => rewrite::set_ipv6_addr(frame, ip, src, a),
    }
}

impl Worker {
    /// A worker for up to `capacity` sessions of each family.
    pub fn new(plane: &Plane, core: u16, capacity: usize, seed: u64) -> Worker {
        Self::with_capacities(plane, core, capacity, capacity.div_ceil(16).max(1024), seed)
    }

    pub fn with_capacities(plane: &Plane, core: u16, v4: usize, v6: usize, seed: u64) -> Worker {
        let scheds = plane.services.iter().map(|s| sched_for(s.scheduler)).collect();
        let counters = Counters {
            services: plane
                .services
                .iter()
                .map(|s| ServiceCounters {
                    per_real_packets: vec![0; s.reals.len()],
                    per_real_active: vec![0; s.reals.len()],
                    ..Default::default()
                })
                .collect(),
            ..Counters::default()
        };
        Worker {
            core,
            t4: Table::new(v4, seed),
            t6: Table::new(v6, seed.rotate_left(17)),
            ports: plane.local_addrs.iter().map(|_| PortPool::new(core, plane.cores)).collect(),
            scheds,
            counters,
            scratch: Vec::with_capacity(2048),
            classes: Vec::with_capacity(VECTOR),
            ips: Vec::with_capacity(VECTOR),
            probes: Vec::with_capacity(VECTOR),
            next_hops: Vec::with_capacity(VECTOR),
            hop: None,
        }
    }

    /// Takes a new plane whose services and real servers extend this
    /// worker's (appended at the end, the ones before unchanged: see
    /// [`Plane::extends`]): the session tables are kept, counters and
    /// schedulers grow.
    pub fn adopt(&mut self, plane: &Plane) {
        for (i, s) in plane.services.iter().enumerate() {
            if i == self.scheds.len() {
                self.scheds.push(sched_for(s.scheduler));
                self.counters.services.push(ServiceCounters::default());
            }
            let c = &mut self.counters.services[i];
            c.per_real_packets.resize(s.reals.len().max(c.per_real_packets.len()), 0);
            c.per_real_active.resize(s.reals.len().max(c.per_real_active.len()), 0);
        }
    }

    pub fn sessions(&self) -> usize {
        self.t4.len() + self.t6.len()
    }

    /// Bytes held by this core's session tables.
    pub fn table_bytes(&self) -> usize {
        self.t4.memory_bytes() + self.t6.memory_bytes()
    }

    /// Classifies a frame, an IP packet's details into `ip`.
    fn classify(plane: &Plane, buf: &Buf<'_>, ip: &mut Ip) -> Class {
        match packet::parse_into(buf.frame(), plane.checks, ip) {
            Ok(Parsed::Ip) => {}
            Ok(Parsed::Arp(arp)) if arp.op == 1 && plane.owned.contains(&IpAddr::V4(arp.target_ip)) => {
                let at = packet::ethernet(buf.frame()).map_or(14, |e| e.3);
                return Class::ArpFor { at, addr: arp.target_ip };
            }
            Ok(Parsed::Arp(_) | Parsed::Other) => return Class::Done(Verdict::Pass),
            Err(m) => return Class::Done(Verdict::Drop(Drop::Malformed(m))),
        }
        let ip: &Ip = ip;
        let f = &ip.flow;
        if f.proto == crate::packet::PROTO_ICMPV6
            && ip.icmp.is_some_and(|i| i.kind == crate::neighbour::ND_SOLICIT)
            && let Some(t) = crate::neighbour::solicited_target(buf.frame(), ip)
            && plane.owned.contains(&IpAddr::V6(t))
        {
            return Class::NdFor { addr: t };
        }
        if let Some(icmp) = ip.icmp
            && icmp.quoted
        {
            return Class::IcmpError;
        }
        if !matches!(f.proto, PROTO_TCP | PROTO_UDP) {
            return Class::Done(if plane.by_vip.is_empty() { Verdict::Pass } else { Verdict::Drop(Drop::Unsupported) });
        }
        if let Some(&svc) = plane.by_vip.get(&Endpoint::new(f.dst, f.dport, f.proto)) {
            return Class::ToService { svc };
        }
        if let Some(local) = plane.local_addrs.iter().position(|a| *a == f.dst) {
            return Class::ToLocal { local: local as u16, port: f.dport };
        }
        if let Some(&(svc, real)) = plane.by_real.get(&Endpoint::new(f.src, f.sport, f.proto)) {
            return Class::FromReal { svc, real };
        }
        Class::Done(Verdict::Pass)
    }

    fn key<A: Family>(c: &Class, ip: &Ip) -> Option<Key<A>> {
        match *c {
            Class::ToService { svc } => Some(Key { addr: A::of(ip.flow.src), port: ip.flow.sport, context: svc }),
            Class::FromReal { real, .. } => {
                Some(Key { addr: A::of(ip.flow.dst), port: ip.flow.dport, context: REVERSE | real })
            }
            _ => None,
        }
    }

    fn hash_of<A: Family>(&self, c: &Class, ip: &Ip) -> u64 {
        Self::key::<A>(c, ip).map_or(0, |k| A::table(self).hash(&k))
    }

    /// What the later stages need to know of a packet's class, worked out
    /// once.
    fn probe(&self, c: &Class, ip: &Ip) -> Probe {
        let v6 = c.is_v6(ip);
        let indexed = matches!(c, Class::ToService { .. } | Class::FromReal { .. });
        let hash = match (indexed, v6) {
            (false, _) => 0,
            (true, false) => self.hash_of::<u32>(c, ip),
            (true, true) => self.hash_of::<u128>(c, ip),
        };
        Probe { hash, v6, indexed }
    }

    /// Asks for the index bucket (or, with `record`, the session record)
    /// that a packet's lookup will read.
    fn prefetch(&self, p: Probe, record: bool) {
        match (p.indexed, p.v6, record) {
            (false, ..) => {}
            (true, false, false) => self.t4.prefetch_bucket(p.hash),
            (true, false, true) => self.t4.prefetch_record(p.hash),
            (true, true, false) => self.t6.prefetch_bucket(p.hash),
            (true, true, true) => self.t6.prefetch_record(p.hash),
        }
    }

    fn lookup<A: Family>(&self, c: &Class, ip: &Ip, h: u64) -> Option<u32> {
        if let Class::ToLocal { local, port } = *c {
            return self.port_owner(usize::from(local), port);
        }
        Self::key::<A>(c, ip).and_then(|k| A::table(self).find_hashed(&k, h))
    }

    /// The session holding FNAT local address `local`'s port `port`.
    fn port_owner(&self, local: usize, port: u16) -> Option<u32> {
        self.ports.get(local).and_then(|p| p.owner.get(usize::from(port)).copied()).filter(|&o| o != 0).map(|o| o - 1)
    }

    /// Ends a session before its time: out of the table, its port freed.
    fn end<A: Family>(&mut self, plane: &Plane, idx: u32) {
        let s = *A::table(self).get(idx);
        let nat = plane.services.get(usize::from(s.service)).is_some_and(|x| x.mode == L4Mode::Nat);
        A::table_mut(self).remove(idx, nat);
        release(&mut self.ports, &mut self.counters, &s);
    }

    /// A packet of a session whose real server went down under
    /// `on_server_down: reset`: the session ends, and a TCP sender gets a
    /// reset (an RST itself is just dropped).
    fn reset<A: Family>(&mut self, plane: &Plane, idx: u32, buf: &mut Buf<'_>, ip: &Ip) -> Verdict {
        let svc = A::table(self).get(idx).service;
        self.end::<A>(plane, idx);
        if ip.tcp_flags & TCP_RST == 0
            && let Some(n) = rewrite::tcp_reset(buf.frame_mut(), ip)
        {
            buf.len = n;
            if let Some(sc) = self.counters.services.get_mut(usize::from(svc)) {
                sc.resets += 1;
            }
            return Verdict::Forward;
        }
        Verdict::Drop(Drop::NoHealthyServer)
    }

    /// Whether session `idx` is to be reset: its service resets sessions of
    /// servers that are down, and its server is.
    fn server_gone<A: Family>(&self, plane: &Plane, idx: u32) -> bool {
        if !plane.resetting {
            return false;
        }
        let s = A::table(self).get(idx);
        plane
            .services
            .get(usize::from(s.service))
            .is_some_and(|svc| svc.reset_on_down && !svc.reals.get(usize::from(s.real)).is_some_and(|r| r.up))
    }

    /// Processes one vector of frames at clock tick `now`.
    pub fn process(&mut self, plane: &Plane, bufs: &mut [Buf<'_>], verdicts: &mut Vec<Verdict>, now: u32) {
        verdicts.clear();
        self.next_hops.clear();
        // The records are borrowed by the stages below while they change
        // the worker: out of it meanwhile (no copy of a record per stage).
        let mut classes = std::mem::take(&mut self.classes);
        let mut probes = std::mem::take(&mut self.probes);
        let mut ips = std::mem::take(&mut self.ips);
        if ips.len() < bufs.len() {
            ips.resize(bufs.len(), Ip::EMPTY);
        }
        // 1. Parse (into the records, in place) and classify; 2. hash every
        // key.
        classes.clear();
        probes.clear();
        classes.extend(bufs.iter().zip(ips.iter_mut()).map(|(b, ip)| Self::classify(plane, b, ip)));
        probes.extend(classes.iter().zip(&ips).map(|(c, ip)| self.probe(c, ip)));
        // 3. Look every key up and 4. finish its packet (a session for a
        // miss, the rewrite), software-pipelined: packet i's bucket is asked
        // for, then the record of packet i - AHEAD (whose bucket has arrived
        // meanwhile), then packet i - 2·AHEAD is looked up and finished (its
        // record has arrived, and is used while it is still close). The
        // misses of a few dozen packets overlap, no more than the core can
        // keep in flight. A packet is looked up after the packets before it
        // are finished: it sees the sessions they created or ended (two
        // packets of a new flow in one vector make one session).
        const AHEAD: usize = 8;
        let n = classes.len();
        for i in 0..n + 2 * AHEAD {
            if let Some(&p) = probes.get(i) {
                self.prefetch(p, false);
            }
            if let Some(j) = i.checked_sub(AHEAD)
                && let Some(&p) = probes.get(j)
            {
                self.prefetch(p, true);
            }
            let Some(j) = i.checked_sub(2 * AHEAD) else { continue };
            let (Some(c), Some(&p), Some(ip), Some(buf)) = (classes.get(j), probes.get(j), ips.get(j), bufs.get_mut(j))
            else {
                continue;
            };
            let v6 = p.v6;
            let hit = if v6 { self.lookup::<u128>(c, ip, p.hash) } else { self.lookup::<u32>(c, ip, p.hash) };
            let v = if v6 {
                self.finish::<u128>(plane, buf, c, ip, hit, now)
            } else {
                self.finish::<u32>(plane, buf, c, ip, hit, now)
            };
            match v {
                Verdict::Drop(d) => self.counters.drops[d.index()] += 1,
                Verdict::Pass => self.counters.passed += 1,
                Verdict::Forward => {}
            }
            verdicts.push(v);
            self.next_hops.push(self.hop.take());
        }
        self.classes = classes;
        self.probes = probes;
        self.ips = ips;
        // 6. Expire a slice of each table.
        let is_nat = |svc: u16| plane.services.get(usize::from(svc)).is_some_and(|s| s.mode == L4Mode::Nat);
        let (ports, counters) = (&mut self.ports, &mut self.counters);
        self.t4.sweep(now, 64, |s| is_nat(s.service), |_, s| release(ports, counters, s));
        self.t6.sweep(now, 16, |s| is_nat(s.service), |_, s| release(ports, counters, s));
    }

    /// Finishes a frame of class `c` (and IP details `ip`, for the classes
    /// of IP packets), `hit` being its session if the lookup found one.
    fn finish<A: Family>(
        &mut self,
        plane: &Plane,
        buf: &mut Buf<'_>,
        c: &Class,
        ip: &Ip,
        hit: Option<u32>,
        now: u32,
    ) -> Verdict {
        match *c {
            Class::Done(v) => v,
            Class::ArpFor { at, addr } => {
                if crate::neighbour::arp_reply(buf.frame_mut(), at, addr, plane.mac) {
                    self.counters.answered += 1;
                    Verdict::Forward
                } else {
                    Verdict::Pass
                }
            }
            Class::NdFor { addr } => {
                let request = buf.frame().to_vec();
                let room = buf.mem.len() - buf.head;
                match crate::neighbour::nd_advert(
                    &request,
                    ip,
                    addr,
                    plane.mac,
                    &mut buf.mem[buf.head..buf.head + room],
                ) {
                    Some(n) => {
                        buf.len = n;
                        self.counters.answered += 1;
                        Verdict::Forward
                    }
                    None => Verdict::Pass,
                }
            }
            Class::IcmpError => self.icmp_error::<A>(plane, buf, ip),
            Class::ToService { svc } => {
                let service = &plane.services[usize::from(svc)];
                let tcp = service.proto == PROTO_TCP;
                let syn = ip.tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
                let mut found = hit;
                if let Some(idx) = found {
                    if tcp && syn && A::table(self).get(idx).state == State::Closing {
                        // A new connection from the port of one that is
                        // ending (clients reuse ports sooner than the session
                        // times out): scheduled afresh, as IPVS does.
                        self.end::<A>(plane, idx);
                        found = None;
                    } else if self.server_gone::<A>(plane, idx) {
                        if tcp && !syn {
                            return self.reset::<A>(plane, idx, buf, ip);
                        }
                        // A datagram, or a SYN again: to a server that is up.
                        self.end::<A>(plane, idx);
                        found = None;
                    }
                }
                let idx = match found {
                    Some(idx) => idx,
                    None => {
                        // Only a SYN (or a datagram) starts a session; with
                        // Maglev, where the server follows from the flow
                        // alone, any segment but an RST picks its connection
                        // up (after a restart, or from another balancer),
                        // unless FNAT's source port (chosen per process)
                        // would differ.
                        let pickup = tcp
                            && ip.tcp_flags & (TCP_RST | TCP_SYN) == 0
                            && service.scheduler == L4Scheduler::Maglev
                            && service.mode != L4Mode::Fnat;
                        if tcp && ip.tcp_flags & (TCP_SYN | TCP_ACK) != TCP_SYN && !pickup {
                            return Verdict::Drop(Drop::NoSession);
                        }
                        match self.create::<A>(plane, svc, ip, now) {
                            Ok(idx) if pickup => {
                                // Left as created (SYN sent, its timeout) and
                                // established only at its next packet: a flood
                                // of stray segments holds the table for the
                                // SYN timeout, not the established one.
                                let s = *A::table(self).get(idx);
                                return self.forward_to_real::<A>(plane, svc, s, ip, buf);
                            }
                            Ok(idx) => idx,
                            Err(d) => return Verdict::Drop(d),
                        }
                    }
                };
                self.track::<A>(plane, idx, ip, now);
                let s = *A::table(self).get(idx);
                self.forward_to_real::<A>(plane, svc, s, ip, buf)
            }
            Class::FromReal { svc, .. } => {
                let Some(idx) = hit else { return Verdict::Drop(Drop::NoSession) };
                if self.server_gone::<A>(plane, idx) {
                    return self.reset::<A>(plane, idx, buf, ip);
                }
                self.track::<A>(plane, idx, ip, now);
                let service = &plane.services[usize::from(svc)];
                let f = buf.frame_mut();
                if !nat(f, ip, Some((service.vip, service.port)), None) {
                    return Verdict::Drop(Drop::TtlExceeded);
                }
                rewrite::set_macs(f, plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
            Class::ToLocal { .. } => {
                let Some(idx) = hit else { return Verdict::Drop(Drop::NoSession) };
                // The port table is shared by the families: the session is in
                // the table of the client's family, which may differ from the
                // reply's (an IPv6 VIP in front of IPv4 servers).
                let (s_client, s_port, s_service) = match self.session_any(idx, ip.flow.src.is_ipv6()) {
                    Some(x) => x,
                    None => return Verdict::Drop(Drop::NoSession),
                };
                let Some(service) = plane.services.get(usize::from(s_service)) else {
                    return Verdict::Drop(Drop::NoSession);
                };
                if s_client.is_ipv4() != ip.flow.src.is_ipv4() {
                    // Family translation is not done by this pipeline.
                    return Verdict::Drop(Drop::Unsupported);
                }
                if self.server_gone::<A>(plane, idx) {
                    return self.reset::<A>(plane, idx, buf, ip);
                }
                self.track::<A>(plane, idx, ip, now);
                let f = buf.frame_mut();
                if !nat(f, ip, Some((service.vip, service.port)), Some((s_client, s_port))) {
                    return Verdict::Drop(Drop::TtlExceeded);
                }
                rewrite::set_macs(f, plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
        }
    }

    /// An ICMP error about a packet of a session (fragmentation needed /
    /// packet too big, unreachable, time exceeded) goes where the packet came
    /// from: to the real server when a client's side reports it (the quoted
    /// packet went from the VIP to the client), to the client when a real
    /// server reports it (NAT and FNAT). In NAT and FNAT the outer and
    /// quoted addresses and ports are translated back and the quoted IP
    /// header and ICMP checksums recomputed; in DR and tunnel modes the
    /// message goes to the real server unchanged (it sent the packet, with
    /// the VIP as source, and needs the path MTU).
    fn icmp_error<A: Family>(&mut self, plane: &Plane, buf: &mut Buf<'_>, ip: &Ip) -> Verdict {
        let Some(q) = packet::quoted(buf.frame(), ip) else { return Verdict::Pass };
        // Client side: the quoted packet left the VIP toward the client.
        if let Some(&svc) = plane.by_vip.get(&Endpoint::new(q.src, q.sport, q.proto)) {
            let key = Key { addr: A::of(q.dst), port: q.dport, context: svc };
            let Some(idx) = A::table(self).find(&key) else { return Verdict::Drop(Drop::NoSession) };
            let s = *A::table(self).get(idx);
            let service = &plane.services[usize::from(svc)];
            let Some(real) = service.reals.get(usize::from(s.real)) else { return Verdict::Drop(Drop::NoSession) };
            return match service.mode {
                L4Mode::Nat | L4Mode::Fnat => {
                    let local =
                        (service.mode == L4Mode::Fnat).then(|| (plane.local_addrs[usize::from(s.local)], s.local_port));
                    // Outer: to the real server (from the local address in FNAT);
                    // quoted: as the real server sent it.
                    if !icmp_translate(
                        buf.frame_mut(),
                        ip,
                        local.map(|l| l.0),
                        Some(real.addr),
                        Some((real.addr, real.port)),
                        local,
                    ) {
                        return Verdict::Drop(Drop::Unsupported);
                    }
                    rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
                    Verdict::Forward
                }
                _ => self.toward_real(plane, service, &s, ip, buf),
            };
        }
        // Server side, NAT: the quoted packet went from the client to the real server.
        if let Some(&(svc, real_idx)) = plane.by_real.get(&Endpoint::new(q.dst, q.dport, q.proto)) {
            let key = Key { addr: A::of(q.src), port: q.sport, context: REVERSE | real_idx };
            if A::table(self).find(&key).is_some() {
                let service = &plane.services[usize::from(svc)];
                if !icmp_translate(
                    buf.frame_mut(),
                    ip,
                    Some(service.vip),
                    None,
                    None,
                    Some((service.vip, service.port)),
                ) {
                    return Verdict::Drop(Drop::Unsupported);
                }
                rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
                return Verdict::Forward;
            }
        }
        // Server side, FNAT: the quoted packet left one of our local addresses.
        if let Some(local) = plane.local_addrs.iter().position(|a| *a == q.src)
            && let Some(idx) = self.port_owner(local, q.sport)
            && (idx as usize) < A::table(self).capacity()
        {
            let s = *A::table(self).get(idx);
            let Some(service) = plane.services.get(usize::from(s.service)) else {
                return Verdict::Drop(Drop::NoSession);
            };
            let client = s.client.ip();
            if !icmp_translate(
                buf.frame_mut(),
                ip,
                Some(service.vip),
                Some(client),
                Some((client, s.client_port)),
                Some((service.vip, service.port)),
            ) {
                return Verdict::Drop(Drop::Unsupported);
            }
            rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
            return Verdict::Forward;
        }
        Verdict::Pass
    }

    /// The client, client port and service of session `idx` in the table of
    /// the given family.
    fn session_any(&self, idx: u32, v6: bool) -> Option<(IpAddr, u16, u16)> {
        if v6 {
            (idx < self.t6.capacity() as u32).then(|| {
                let s = self.t6.get(idx);
                (s.client.ip(), s.client_port, s.service)
            })
        } else {
            (idx < self.t4.capacity() as u32).then(|| {
                let s = self.t4.get(idx);
                (s.client.ip(), s.client_port, s.service)
            })
        }
    }

    /// Picks a real server and records the session.
    fn create<A: Family>(&mut self, plane: &Plane, svc: u16, ip: &Ip, now: u32) -> Result<u32, Drop> {
        let service = &plane.services[usize::from(svc)];
        let sc = &self.counters.services[usize::from(svc)];
        let view = View { reals: &service.reals, active: &sc.per_real_active };
        let real = match &mut self.scheds[usize::from(svc)] {
            Sched::Rr(s) => s.pick(&view),
            Sched::Wrr(s) => s.pick(&view),
            Sched::Wlc(s) => s.pick(&view),
            Sched::Maglev => service.maglev.as_ref().and_then(|m| m.pick(flow_hash(&ip.flow), &view)),
        }
        .ok_or(Drop::NoHealthyServer)? as u16;
        // NAT and FNAT rewrite addresses in place: no family change.
        if matches!(service.mode, L4Mode::Nat | L4Mode::Fnat)
            && service.reals[usize::from(real)].addr.is_ipv4() != ip.flow.src.is_ipv4()
        {
            return Err(Drop::Unsupported);
        }
        let state = if service.proto == PROTO_TCP { State::SynSent } else { State::Datagram };
        let mut s = Session {
            client: A::of(ip.flow.src),
            client_port: ip.flow.sport,
            service: svc,
            real,
            local: u16::MAX,
            local_port: 0,
            state,
            expires: now.saturating_add(service.timeouts[state as usize]),
        };
        if service.mode == L4Mode::Fnat {
            // A local address of the real server's family with a free port on this core.
            let real_v4 = service.reals[usize::from(real)].addr.is_ipv4();
            let local = (0..self.ports.len())
                .find(|&l| plane.local_addrs[l].is_ipv4() == real_v4 && !self.ports[l].free.is_empty())
                .ok_or(Drop::PortsExhausted)?;
            let port = self.ports[local].free.pop().ok_or(Drop::PortsExhausted)?;
            s.local = local as u16;
            s.local_port = port;
        }
        let idx = match A::table_mut(self).insert(s, service.mode == L4Mode::Nat) {
            Ok(idx) => idx,
            Err(_) => {
                if s.local != u16::MAX {
                    self.ports[usize::from(s.local)].free.push(s.local_port);
                }
                return Err(Drop::TableFull);
            }
        };
        if s.local != u16::MAX {
            self.ports[usize::from(s.local)].owner[usize::from(s.local_port)] = idx + 1;
        }
        let sc = &mut self.counters.services[usize::from(svc)];
        sc.sessions_total += 1;
        sc.sessions_active += 1;
        if let Some(a) = sc.per_real_active.get_mut(usize::from(real)) {
            *a += 1;
        }
        Ok(idx)
    }

    /// TCP state and expiry from a packet of the session.
    ///
    /// The record is written only when something changed: most packets of
    /// a flow arrive within one tick of the coarse clock, and a record left
    /// clean is not written back to memory when the cache evicts it (with
    /// millions of sessions, nearly every record read is a miss).
    fn track<A: Family>(&mut self, plane: &Plane, idx: u32, ip: &Ip, now: u32) {
        let s = A::table_mut(self).get_mut(idx);
        let mut state = s.state;
        if ip.flow.proto == PROTO_TCP {
            let f = ip.tcp_flags;
            if f & (TCP_FIN | TCP_RST) != 0 {
                state = State::Closing;
            } else if state == State::SynSent && f & TCP_ACK != 0 {
                state = State::Established;
            }
        }
        let timeout = plane.services.get(usize::from(s.service)).map_or(0, |svc| svc.timeouts[state as usize]);
        let expires = now.saturating_add(timeout);
        if state != s.state || expires != s.expires {
            s.state = state;
            s.expires = expires;
        }
    }

    /// Counts a client's packet and sends it on toward its real server.
    fn forward_to_real<A: Family>(
        &mut self,
        plane: &Plane,
        svc: u16,
        s: Session<A>,
        ip: &Ip,
        buf: &mut Buf<'_>,
    ) -> Verdict {
        let sc = &mut self.counters.services[usize::from(svc)];
        sc.packets += 1;
        sc.bytes += buf.len as u64;
        if let Some(p) = sc.per_real_packets.get_mut(usize::from(s.real)) {
            *p += 1;
        }
        self.toward_real(plane, &plane.services[usize::from(svc)], &s, ip, buf)
    }

    /// Rewrites a client's packet toward its real server.
    fn toward_real<A: Family>(
        &mut self,
        plane: &Plane,
        service: &Service,
        s: &Session<A>,
        ip: &Ip,
        buf: &mut Buf<'_>,
    ) -> Verdict {
        let Some(real) = service.reals.get(usize::from(s.real)) else { return Verdict::Drop(Drop::NoHealthyServer) };
        match service.mode {
            L4Mode::Nat | L4Mode::Fnat => {
                let fnat = service.mode == L4Mode::Fnat;
                let local = || plane.local_addrs.get(usize::from(s.local)).copied();
                let f = buf.frame_mut();
                let done = match (real.addr, ip.flow.src) {
                    // The common case straight to the fused rewrite.
                    (IpAddr::V4(to), IpAddr::V4(_)) => {
                        let src = match local() {
                            Some(IpAddr::V4(l)) if fnat => Some((l, s.local_port)),
                            _ if fnat => return Verdict::Drop(Drop::Unsupported),
                            _ => None,
                        };
                        rewrite::nat_v4(f, ip, src, Some((to, real.port)))
                    }
                    (IpAddr::V6(_), IpAddr::V6(_)) => {
                        let src = match local() {
                            Some(l @ IpAddr::V6(_)) if fnat => Some((l, s.local_port)),
                            _ if fnat => return Verdict::Drop(Drop::Unsupported),
                            _ => None,
                        };
                        nat(f, ip, src, Some((real.addr, real.port)))
                    }
                    // Across families would need header translation.
                    _ => return Verdict::Drop(Drop::Unsupported),
                };
                if !done {
                    return Verdict::Drop(Drop::TtlExceeded);
                }
                rewrite::set_macs(f, plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
            // Only the MAC changes: the real server owns the VIP too; the
            // I/O layer puts its MAC in (from `next_hops`).
            L4Mode::Dr => {
                self.hop = Some(real.addr);
                rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
            L4Mode::Ipip | L4Mode::Gue => {
                let tunnel =
                    if service.mode == L4Mode::Ipip { Tunnel::Ipip } else { Tunnel::Gue { port: service.gue_port } };
                // The outer source: a local address of the real server's family.
                let Some(src) = plane.local_addrs.iter().find(|a| a.is_ipv4() == real.addr.is_ipv4()) else {
                    return Verdict::Drop(Drop::Unsupported);
                };
                let outer = Outer {
                    src: *src,
                    dst: real.addr,
                    ttl: 64,
                    id: 0,
                    flow_hash: (s.client.mix() as u32 ^ u32::from(s.client_port)).wrapping_mul(0x9e37_79b9),
                };
                let frame_start = buf.head;
                if encapsulate(buf.frame(), ip.l3, ip.end, tunnel, &outer, &mut self.scratch).is_err() {
                    return Verdict::Drop(Drop::Unsupported);
                }
                let grow = self.scratch.len().saturating_sub(buf.len);
                if grow > frame_start {
                    // No headroom for the tunnel header.
                    return Verdict::Drop(Drop::Unsupported);
                }
                buf.head = frame_start - grow;
                buf.len = self.scratch.len();
                let (h, l) = (buf.head, buf.len);
                buf.mem[h..h + l].copy_from_slice(&self.scratch);
                rewrite::set_macs(buf.frame_mut(), plane.next_hop_mac, plane.mac);
                Verdict::Forward
            }
        }
    }
}

/// Rewrites an IPv4 ICMP error: the outer source/destination addresses, and
/// the quoted packet's source and destination (address, port); then the
/// checksums of the outer header, the quoted header and the ICMP message.
/// IPv6 messages are left alone (false).
fn icmp_translate(
    frame: &mut [u8],
    ip: &Ip,
    outer_src: Option<IpAddr>,
    outer_dst: Option<IpAddr>,
    inner_src: Option<(IpAddr, u16)>,
    inner_dst: Option<(IpAddr, u16)>,
) -> bool {
    if !ip.flow.src.is_ipv4() {
        return false;
    }
    let v4 = |a: IpAddr| match a {
        IpAddr::V4(a) => Some(a.octets()),
        IpAddr::V6(_) => None,
    };
    let l3 = ip.l3;
    for (at, a) in [(l3 + 12, outer_src), (l3 + 16, outer_dst)] {
        if let Some(a) = a {
            let Some(o) = v4(a) else { return false };
            frame[at..at + 4].copy_from_slice(&o);
        }
    }
    if !rewrite::decrement_ttl(frame, ip) {
        return false;
    }
    let ihl = usize::from(frame[l3] & 0x0f) * 4;
    frame[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    let c = crate::checksum::checksum(&frame[l3..l3 + ihl]);
    frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
    // The quoted packet: its IP header right after the 8-byte ICMP header.
    let q = ip.l4 + 8;
    let Some(&first) = frame.get(q) else { return false };
    let qihl = usize::from(first & 0x0f) * 4;
    if qihl < 20 || frame.len() < q + qihl + 4 || ip.end < q + qihl + 4 {
        return false;
    }
    for (at, port_at, change) in [(q + 12, q + qihl, inner_src), (q + 16, q + qihl + 2, inner_dst)] {
        if let Some((a, p)) = change {
            let Some(o) = v4(a) else { return false };
            frame[at..at + 4].copy_from_slice(&o);
            frame[port_at..port_at + 2].copy_from_slice(&p.to_be_bytes());
        }
    }
    frame[q + 10..q + 12].copy_from_slice(&[0, 0]);
    let c = crate::checksum::checksum(&frame[q..q + qihl]);
    frame[q + 10..q + 12].copy_from_slice(&c.to_be_bytes());
    let m = ip.l4;
    frame[m + 2..m + 4].copy_from_slice(&[0, 0]);
    let c = crate::checksum::checksum(&frame[m..ip.end]);
    frame[m + 2..m + 4].copy_from_slice(&c.to_be_bytes());
    true
}

/// The Maglev key of a flow: its 5-tuple, hashed the same way by every
/// worker of every Gatehouse, so that a flow lands on the same real server
/// whichever balancer (behind ECMP) or process (after a restart) sees it.
fn flow_hash(f: &packet::Flow) -> u64 {
    use gatehouse_balance::hash::fmix64;
    let (s, d) = (addr_key(f.src), addr_key(f.dst));
    let ports = u64::from(f.sport) << 32 | u64::from(f.dport) << 16 | u64::from(f.proto);
    [(s >> 64) as u64, s as u64, (d >> 64) as u64, d as u64, ports]
        .iter()
        .fold(0x5bd1_e995_1b87_3593, |h, &w| fmix64(h ^ w))
}

/// Frees what an ended session held.
fn release<A: crate::session::Addr>(ports: &mut [PortPool], counters: &mut Counters, s: &Session<A>) {
    if s.local != u16::MAX
        && let Some(p) = ports.get_mut(usize::from(s.local))
    {
        p.owner[usize::from(s.local_port)] = 0;
        p.free.push(s.local_port);
    }
    if let Some(sc) = counters.services.get_mut(usize::from(s.service)) {
        sc.sessions_active = sc.sessions_active.saturating_sub(1);
        if let Some(a) = sc.per_real_active.get_mut(usize::from(s.real)) {
            *a = a.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum;
    use crate::packet::build;
    use crate::packet::{ETHERTYPE_IPV4, TCP_PSH};

    const CLIENT: [u8; 4] = [10, 0, 0, 1];
    const VIP: [u8; 4] = [10, 0, 0, 100];
    const LOCAL: [u8; 4] = [10, 0, 9, 1];
    const MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xaa];
    const HOP: [u8; 6] = [2, 0, 0, 0, 0, 0xbb];

    fn service(mode: L4Mode, scheduler: L4Scheduler, proto: u8) -> Service {
        Service {
            name: "s".into(),
            vip: VIP.into(),
            port: 80,
            proto,
            mode,
            scheduler,
            gue_port: 6080,
            reset_on_down: false,
            reals: vec![
                Real {
                    addr: Ipv4Addr::new(10, 0, 1, 1).into(),
                    port: if matches!(mode, L4Mode::Nat | L4Mode::Fnat) { 8080 } else { 80 },
                    weight: 1,
                    up: true,
                },
                Real {
                    addr: Ipv4Addr::new(10, 0, 1, 2).into(),
                    port: if matches!(mode, L4Mode::Nat | L4Mode::Fnat) { 8080 } else { 80 },
                    weight: 3,
                    up: true,
                },
            ],
            maglev: None,
            timeouts: [10, 900, 30, 60],
        }
    }

    fn tcp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, flags: u8) -> Vec<u8> {
        let seg = build::tcp(sport, dport, flags, b"", |len| checksum::pseudo_v4(src, dst, PROTO_TCP, len as u16));
        build::eth(ETHERTYPE_IPV4, &build::ipv4(src, dst, PROTO_TCP, &seg))
    }

    /// Runs one frame through the worker with 64 bytes of headroom.
    fn run(w: &mut Worker, plane: &Plane, frame: &[u8], now: u32) -> (Verdict, Vec<u8>) {
        let mut mem = vec![0u8; 64 + frame.len() + 64];
        mem[64..64 + frame.len()].copy_from_slice(frame);
        let mut bufs = [Buf { mem: &mut mem, head: 64, len: frame.len() }];
        let mut verdicts = Vec::new();
        w.process(plane, &mut bufs, &mut verdicts, now);
        (verdicts[0], bufs[0].frame().to_vec())
    }

    fn flow(frame: &[u8]) -> crate::packet::Flow {
        match packet::parse(frame, Checks::default()) {
            Ok(packet::Frame::Ip(ip)) => ip.flow,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nat_rewrites_both_ways_and_keeps_the_session() {
        let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP)], vec![], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 1024, 1);
        let (v, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
        assert_eq!(v, Verdict::Forward);
        let f = flow(&out); // the parser checks every checksum
        assert_eq!((f.src, f.sport), (IpAddr::from(CLIENT), 40000));
        let real = f.dst;
        assert_eq!(f.dport, 8080);
        assert_eq!(&out[..12], &[HOP, MAC].concat()[..]);
        // The same flow sticks to its server.
        let (_, again) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH), 1);
        assert_eq!(flow(&again).dst, real);
        // The reply from the real server goes back as the VIP.
        let real4 = match real {
            IpAddr::V4(a) => a.octets(),
            IpAddr::V6(_) => unreachable!(),
        };
        let (v, back) = run(&mut w, &plane, &tcp(real4, 8080, CLIENT, 40000, TCP_SYN | TCP_ACK), 2);
        assert_eq!(v, Verdict::Forward);
        let b = flow(&back);
        assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
        assert_eq!(w.sessions(), 1);
        assert_eq!(w.counters.services[0].sessions_total, 1);
    }

    #[test]
    fn fnat_uses_this_cores_ports_and_maps_replies_back() {
        let plane = Plane::new(
            vec![service(L4Mode::Fnat, L4Scheduler::Wrr, PROTO_TCP)],
            vec![IpAddr::from(LOCAL)],
            MAC,
            HOP,
            4,
        );
        let mut w = Worker::new(&plane, 3, 1024, 1);
        let (v, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
        assert_eq!(v, Verdict::Forward);
        let f = flow(&out);
        assert_eq!(f.src, IpAddr::from(LOCAL));
        assert_eq!(f.sport % 4, 3, "a port of core 3");
        let real4 = match f.dst {
            IpAddr::V4(a) => a.octets(),
            IpAddr::V6(_) => unreachable!(),
        };
        let (v, back) = run(&mut w, &plane, &tcp(real4, 8080, LOCAL, f.sport, TCP_SYN | TCP_ACK), 1);
        assert_eq!(v, Verdict::Forward);
        let b = flow(&back);
        assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
        // An unknown local port is not a session.
        let (v, _) = run(&mut w, &plane, &tcp(real4, 8080, LOCAL, f.sport + 4, TCP_ACK), 1);
        assert_eq!(v, Verdict::Drop(Drop::NoSession));
    }

    #[test]
    fn dr_changes_only_the_macs_and_tunnels_wrap_the_packet() {
        let plane = Plane::new(
            vec![service(L4Mode::Dr, L4Scheduler::Maglev, PROTO_TCP)],
            vec![IpAddr::from(LOCAL)],
            MAC,
            HOP,
            1,
        );
        let mut w = Worker::new(&plane, 0, 1024, 1);
        let syn = tcp(CLIENT, 40000, VIP, 80, TCP_SYN);
        let (v, out) = run(&mut w, &plane, &syn, 0);
        assert_eq!(v, Verdict::Forward);
        assert_eq!(&out[12..], &syn[12..]);
        assert_eq!(&out[..12], &[HOP, MAC].concat()[..]);

        for (mode, proto, extra) in [(L4Mode::Ipip, 4u8, 20usize), (L4Mode::Gue, PROTO_UDP, 28)] {
            let plane =
                Plane::new(vec![service(mode, L4Scheduler::Maglev, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
            let mut w = Worker::new(&plane, 0, 1024, 1);
            let (v, out) = run(&mut w, &plane, &syn, 0);
            assert_eq!(v, Verdict::Forward);
            assert_eq!(out.len(), syn.len() + extra);
            assert_eq!(out[14 + 9], proto);
            assert_eq!(&out[14 + 12..14 + 16], &LOCAL);
            assert_eq!(&out[14 + extra..], &syn[14..], "the inner packet is unchanged");
        }
    }

    #[test]
    fn what_cannot_be_served_is_dropped_and_counted() {
        let mut svc = service(L4Mode::Nat, L4Scheduler::Wlc, PROTO_TCP);
        let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 2, 1);
        // A mid-stream segment without a session.
        assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 1, VIP, 80, TCP_ACK), 0).0, Verdict::Drop(Drop::NoSession));
        // Malformed: truncated.
        let syn = tcp(CLIENT, 2, VIP, 80, TCP_SYN);
        assert_eq!(run(&mut w, &plane, &syn[..30], 0).0, Verdict::Drop(Drop::Malformed(Malformed::Truncated)));
        // A full table.
        assert_eq!(run(&mut w, &plane, &syn, 0).0, Verdict::Forward);
        assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 3, VIP, 80, TCP_SYN), 0).0, Verdict::Forward);
        assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 4, VIP, 80, TCP_SYN), 0).0, Verdict::Drop(Drop::TableFull));
        // Not for a service: to the kernel.
        assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 5, [10, 0, 0, 7], 22, TCP_SYN), 0).0, Verdict::Pass);
        assert_eq!(w.counters.dropped(Drop::NoSession), 1);
        assert_eq!(w.counters.dropped(Drop::TableFull), 1);
        assert_eq!(w.counters.dropped(Drop::Malformed(Malformed::Truncated)), 1);
        // Every reason has its own slot.
        let slots: std::collections::HashSet<usize> = Drop::all().map(Drop::index).collect();
        assert_eq!(slots.len(), DROP_KINDS);
        assert!(slots.iter().all(|&i| i < DROP_KINDS));
        // No healthy server.
        svc = service(L4Mode::Nat, L4Scheduler::Wrr, PROTO_TCP);
        for r in &mut svc.reals {
            r.up = false;
        }
        let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 16, 1);
        assert_eq!(run(&mut w, &plane, &syn, 0).0, Verdict::Drop(Drop::NoHealthyServer));
    }

    #[test]
    fn sessions_expire_by_state_and_free_their_ports() {
        let plane =
            Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Rr, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 64, 1);
        run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
        assert_eq!(w.sessions(), 1);
        // A SYN-only session times out after 10 ticks (the sweep runs per vector).
        run(&mut w, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 22, TCP_SYN), 5);
        assert_eq!(w.sessions(), 1);
        run(&mut w, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 22, TCP_SYN), 11);
        assert_eq!(w.sessions(), 0);
        assert_eq!(w.counters.services[0].sessions_active, 0);
        let free = w.ports[0].free.len();
        assert_eq!(free, 65536 - 1024);
    }

    #[test]
    fn weights_split_new_sessions() {
        let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Wrr, PROTO_TCP)], vec![], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 10_000, 1);
        for port in 0..4000u16 {
            run(&mut w, &plane, &tcp(CLIENT, 10_000 + port, VIP, 80, TCP_SYN), 0);
        }
        let per = &w.counters.services[0].per_real_active;
        assert_eq!(per, &vec![1000, 3000]);
    }

    fn tcp6(src: [u8; 16], sport: u16, dst: [u8; 16], dport: u16, flags: u8) -> Vec<u8> {
        let seg = build::tcp(sport, dport, flags, b"", |len| checksum::pseudo_v6(src, dst, PROTO_TCP, len as u32));
        build::eth(crate::packet::ETHERTYPE_IPV6, &build::ipv6(src, dst, PROTO_TCP, &seg))
    }

    fn v6(last: u8) -> [u8; 16] {
        let mut a = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        a[15] = last;
        a
    }

    #[test]
    fn ipv6_services_in_nat_and_fnat() {
        for mode in [L4Mode::Nat, L4Mode::Fnat] {
            let mut svc = service(mode, L4Scheduler::Rr, PROTO_TCP);
            svc.vip = IpAddr::from(v6(100));
            for (i, r) in svc.reals.iter_mut().enumerate() {
                r.addr = IpAddr::from(v6(10 + i as u8));
            }
            let local = IpAddr::from(v6(200));
            let plane = Plane::new(vec![svc], vec![IpAddr::from(LOCAL), local], MAC, HOP, 1);
            let mut w = Worker::new(&plane, 0, 1024, 1);
            let (v, out) = run(&mut w, &plane, &tcp6(v6(1), 40000, v6(100), 80, TCP_SYN), 0);
            assert_eq!(v, Verdict::Forward, "{mode:?}");
            let f = flow(&out);
            assert_eq!(f.dport, 8080);
            let real = match f.dst {
                IpAddr::V6(a) => a.octets(),
                IpAddr::V4(_) => unreachable!(),
            };
            let (reply_dst, reply_port) = if mode == L4Mode::Fnat {
                assert_eq!(f.src, local, "an IPv6 local address for IPv6 servers");
                (v6(200), f.sport)
            } else {
                assert_eq!(f.src, IpAddr::from(v6(1)));
                (v6(1), 40000)
            };
            let (v, back) = run(&mut w, &plane, &tcp6(real, 8080, reply_dst, reply_port, TCP_SYN | TCP_ACK), 1);
            assert_eq!(v, Verdict::Forward, "{mode:?} reply");
            let b = flow(&back);
            assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(v6(100)), 80, IpAddr::from(v6(1)), 40000));
            assert_eq!(w.sessions(), 1);
        }
        // An IPv6 VIP in front of IPv4 servers in NAT mode: no translation.
        let mut svc = service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP);
        svc.vip = IpAddr::from(v6(100));
        let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 16, 1);
        assert_eq!(run(&mut w, &plane, &tcp6(v6(1), 1, v6(100), 80, TCP_SYN), 0).0, Verdict::Drop(Drop::Unsupported));
        assert_eq!(w.sessions(), 0);
    }

    #[test]
    fn arp_and_neighbour_discovery_for_our_addresses_are_answered() {
        let mut svc6 = service(L4Mode::Dr, L4Scheduler::Rr, PROTO_TCP);
        svc6.vip = IpAddr::from(v6(100));
        let plane = Plane::new(
            vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP), svc6],
            vec![IpAddr::from(LOCAL)],
            MAC,
            HOP,
            1,
        );
        let mut w = Worker::new(&plane, 0, 16, 1);
        let arp = |target: [u8; 4]| {
            let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 9, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0];
            a.extend_from_slice(&target);
            build::eth(crate::packet::ETHERTYPE_ARP, &a)
        };
        for target in [VIP, LOCAL] {
            let (v, out) = run(&mut w, &plane, &arp(target), 0);
            assert_eq!(v, Verdict::Forward);
            assert_eq!(&out[14 + 6..14 + 8], &[0, 2], "an ARP reply");
            assert_eq!(&out[14 + 8..14 + 14], &MAC);
        }
        assert_eq!(run(&mut w, &plane, &arp([10, 0, 0, 55]), 0).0, Verdict::Pass, "not ours");
        // A solicitation for the IPv6 VIP.
        let snm = std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0x100).octets();
        let mut ns = vec![crate::neighbour::ND_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
        ns.extend_from_slice(&v6(100));
        let c = !checksum::fold(checksum::add(
            checksum::pseudo_v6(v6(1), snm, crate::packet::PROTO_ICMPV6, ns.len() as u32),
            &ns,
        ));
        ns[2..4].copy_from_slice(&c.to_be_bytes());
        let f = build::eth(crate::packet::ETHERTYPE_IPV6, &build::ipv6(v6(1), snm, crate::packet::PROTO_ICMPV6, &ns));
        let (v, out) = run(&mut w, &plane, &f, 0);
        assert_eq!(v, Verdict::Forward);
        assert_eq!(out.len(), crate::neighbour::ND_ADVERT_LEN);
        assert_eq!(out[14 + 40], crate::neighbour::ND_ADVERT);
        assert_eq!(w.counters.answered, 3);
    }

    /// An ICMPv4 error from `from` to `to`, quoting `quoted` (an IP packet's
    /// first bytes).
    fn icmp_error(from: [u8; 4], to: [u8; 4], kind: u8, code: u8, quoted: &[u8]) -> Vec<u8> {
        let mut m = vec![kind, code, 0, 0, 0, 0, 0x05, 0xdc];
        m.extend_from_slice(quoted);
        let c = checksum::checksum(&m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        build::eth(ETHERTYPE_IPV4, &build::ipv4(from, to, crate::packet::PROTO_ICMP, &m))
    }

    fn quoted(frame: &[u8]) -> crate::packet::Flow {
        match packet::parse(frame, Checks::default()) {
            Ok(packet::Frame::Ip(ip)) => packet::quoted(frame, &ip).expect("an error quoting a flow"),
            other => panic!("{other:?}"),
        }
    }

    /// An error translated for the client: from the VIP, about the client's
    /// packet to the VIP.
    fn assert_back_at_the_client(out: &[u8]) {
        let f = flow(out);
        assert_eq!((f.src, f.dst), (IpAddr::from(VIP), IpAddr::from(CLIENT)));
        let q = quoted(out);
        assert_eq!((q.src, q.sport, q.dst, q.dport), (IpAddr::from(CLIENT), 40000, IpAddr::from(VIP), 80));
    }

    #[test]
    fn icmp_errors_go_back_to_where_their_packet_came_from() {
        const ROUTER: [u8; 4] = [192, 0, 2, 1];
        // NAT: a router on the client's side says the VIP's packet to the
        // client was too big; the real server gets it, translated.
        let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP)], vec![], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 64, 1);
        let (_, to_real) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
        let real = flow(&to_real).dst;
        let real4 = match real {
            IpAddr::V4(a) => a.octets(),
            IpAddr::V6(_) => unreachable!(),
        };
        let sent = tcp(VIP, 80, CLIENT, 40000, TCP_ACK);
        let (v, out) = run(&mut w, &plane, &icmp_error(ROUTER, VIP, 3, 4, &sent[14..14 + 28]), 1);
        assert_eq!(v, Verdict::Forward);
        let f = flow(&out); // outer and ICMP checksums verified by the parser
        assert_eq!((f.src, f.dst), (IpAddr::from(ROUTER), real));
        let q = quoted(&out);
        assert_eq!((q.src, q.sport, q.dst, q.dport), (real, 8080, IpAddr::from(CLIENT), 40000));
        assert_eq!(crate::checksum::checksum(&out[14 + 20 + 8..14 + 20 + 8 + 20]), 0, "the quoted header's checksum");
        // NAT, server side: the real server says the client's port is
        // unreachable; the client gets it as coming from the VIP.
        let sent_to_real = tcp(CLIENT, 40000, real4, 8080, TCP_ACK);
        let (v, out) = run(&mut w, &plane, &icmp_error(real4, CLIENT, 3, 3, &sent_to_real[14..14 + 28]), 1);
        assert_eq!(v, Verdict::Forward);
        assert_back_at_the_client(&out);
        // An error about no session of ours is dropped, not forwarded.
        let stranger = tcp(VIP, 80, [10, 0, 0, 99], 1, TCP_ACK);
        assert_eq!(
            run(&mut w, &plane, &icmp_error(ROUTER, VIP, 3, 4, &stranger[14..14 + 28]), 1).0,
            Verdict::Drop(Drop::NoSession)
        );

        // DR: the real server sent with the VIP as source; the error comes to
        // the balancer and goes to that server unchanged (path MTU discovery).
        let plane = Plane::new(vec![service(L4Mode::Dr, L4Scheduler::Rr, PROTO_TCP)], vec![], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 64, 1);
        run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
        let err = icmp_error(ROUTER, VIP, 3, 4, &sent[14..14 + 28]);
        let (v, out) = run(&mut w, &plane, &err, 1);
        assert_eq!(v, Verdict::Forward);
        assert_eq!(&out[12..], &err[12..]);
        assert_eq!(&out[..12], &[HOP, MAC].concat()[..]);

        // FNAT, server side: the quoted packet left our local address.
        let plane =
            Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Rr, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 64, 1);
        let (_, to_real) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
        let f = flow(&to_real);
        let real4 = match f.dst {
            IpAddr::V4(a) => a.octets(),
            IpAddr::V6(_) => unreachable!(),
        };
        let sent_to_real = tcp(LOCAL, f.sport, real4, 8080, TCP_ACK);
        let (v, out) = run(&mut w, &plane, &icmp_error(real4, LOCAL, 3, 3, &sent_to_real[14..14 + 28]), 1);
        assert_eq!(v, Verdict::Forward);
        assert_back_at_the_client(&out);
    }

    fn octets(a: IpAddr) -> [u8; 4] {
        match a {
            IpAddr::V4(a) => a.octets(),
            IpAddr::V6(_) => unreachable!(),
        }
    }

    #[test]
    fn a_syn_on_the_port_of_an_ending_connection_is_a_new_session() {
        let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP)], vec![], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 1024, 1);
        let (_, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
        let first = flow(&out).dst;
        run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK), 0);
        // A retransmitted SYN of a live connection keeps its session.
        assert_eq!(flow(&run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0).1).dst, first);
        run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_FIN | TCP_ACK), 1);
        // Round robin: the new connection goes to the other server.
        let (v, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 2);
        assert_eq!(v, Verdict::Forward);
        assert_ne!(flow(&out).dst, first);
        let c = &w.counters.services[0];
        assert_eq!((c.sessions_total, c.sessions_active, w.sessions()), (2, 1, 1));
    }

    #[test]
    fn packets_of_a_new_flow_in_one_vector_make_one_session() {
        let plane =
            Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Rr, PROTO_UDP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 1024, 1);
        let seg = build::udp(5000, 80, b"q", |len| checksum::pseudo_v4(CLIENT, VIP, PROTO_UDP, len as u16));
        let frame = build::eth(ETHERTYPE_IPV4, &build::ipv4(CLIENT, VIP, PROTO_UDP, &seg));
        let mut mems: Vec<Vec<u8>> = (0..8).map(|_| frame.clone()).collect();
        let mut bufs: Vec<Buf<'_>> = mems.iter_mut().map(|m| Buf { len: m.len(), mem: m, head: 0 }).collect();
        let mut verdicts = Vec::new();
        w.process(&plane, &mut bufs, &mut verdicts, 0);
        assert!(verdicts.iter().all(|v| *v == Verdict::Forward));
        let flows: std::collections::HashSet<_> = bufs.iter().map(|b| flow(b.frame())).collect();
        assert_eq!(flows.len(), 1, "one server, one local port: {flows:?}");
        assert_eq!((w.sessions(), w.counters.services[0].sessions_total), (1, 1));
    }

    /// A NAT or FNAT TCP session to the first server, established.
    fn established(mode: L4Mode, reset: bool) -> (Plane, Worker, [u8; 4], crate::packet::Flow) {
        let mut svc = service(mode, L4Scheduler::Rr, PROTO_TCP);
        svc.reset_on_down = reset;
        let plane = Plane::new(vec![svc], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 1024, 1);
        let (_, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
        let to_real = flow(&out);
        run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK), 0);
        (plane, w, octets(to_real.dst), to_real)
    }

    /// The same plane with the given server's health.
    fn with_health(plane: &Plane, real: [u8; 4], up: bool) -> Plane {
        let mut svc = service(plane.services[0].mode, L4Scheduler::Rr, PROTO_TCP);
        svc.reset_on_down = plane.services[0].reset_on_down;
        for r in &mut svc.reals {
            if r.addr == IpAddr::from(real) {
                r.up = up;
            }
        }
        Plane::new(vec![svc], plane.local_addrs.clone(), MAC, HOP, 1)
    }

    #[test]
    fn sessions_of_a_server_that_went_down_are_kept_or_reset() {
        // keep: the session goes on to its server.
        let (plane, mut w, real, _) = established(L4Mode::Nat, false);
        let down = with_health(&plane, real, false);
        assert!(down.extends(&plane));
        w.adopt(&down);
        let (v, out) = run(&mut w, &down, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH), 1);
        assert_eq!((v, flow(&out).dst), (Verdict::Forward, IpAddr::from(real)));

        // reset: the client's next segment is answered with an RST from
        // the VIP (SEQ = its ACK), and the session is gone.
        for mode in [L4Mode::Nat, L4Mode::Fnat] {
            let (plane, mut w, real, to_real) = established(mode, true);
            let down = with_health(&plane, real, false);
            w.adopt(&down);
            let seg = tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH);
            let (v, out) = run(&mut w, &down, &seg, 1);
            assert_eq!(v, Verdict::Forward, "{mode:?}");
            let f = flow(&out);
            assert_eq!((f.src, f.sport, f.dst, f.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
            assert_eq!(out[14 + 33], TCP_RST);
            assert_eq!(out[38..42], seg[42..46], "SEQ = the segment's ACK");
            assert_eq!(out.len(), 14 + 40);
            let c = &w.counters.services[0];
            assert_eq!((c.resets, c.sessions_active, w.sessions()), (1, 0, 0), "{mode:?}");
            // The connection is gone; a new one goes to the server that is up.
            assert_eq!(run(&mut w, &down, &seg, 1).0, Verdict::Drop(Drop::NoSession));
            let (_, out) = run(&mut w, &down, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 1);
            assert_ne!(flow(&out).dst, IpAddr::from(real));

            // From the server's side, a packet of such a session gets the RST.
            let (plane, mut w, real, to_real2) = established(mode, true);
            assert_eq!(to_real, to_real2);
            let down = with_health(&plane, real, false);
            w.adopt(&down);
            let reply = tcp(real, to_real.dport, octets(to_real.src), to_real.sport, TCP_ACK);
            let (v, out) = run(&mut w, &down, &reply, 1);
            assert_eq!(v, Verdict::Forward);
            let f = flow(&out);
            assert_eq!((f.src, f.dst, f.dport), (to_real.src, IpAddr::from(real), to_real.dport));
            assert_eq!(out[14 + 33], TCP_RST);
            assert_eq!(w.sessions(), 0);
        }
    }

    #[test]
    fn maglev_picks_the_same_server_in_every_worker_and_picks_connections_up() {
        let mut svc = service(L4Mode::Nat, L4Scheduler::Maglev, PROTO_TCP);
        svc.reals.push(Real { addr: Ipv4Addr::new(10, 0, 1, 3).into(), port: 8080, weight: 1, up: true });
        let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
        // Two workers with different table seeds (two processes, or two
        // balancers behind ECMP) agree on every flow.
        let mut a = Worker::new(&plane, 0, 4096, 1);
        let mut b = Worker::new(&plane, 0, 4096, 99);
        let mut used = std::collections::HashSet::new();
        for port in 0..300u16 {
            let syn = tcp(CLIENT, 20000 + port, VIP, 80, TCP_SYN);
            let ra = flow(&run(&mut a, &plane, &syn, 0).1).dst;
            let rb = flow(&run(&mut b, &plane, &syn, 0).1).dst;
            assert_eq!(ra, rb);
            used.insert(ra);
        }
        assert_eq!(used.len(), 3);
        // A mid-connection segment the worker has no session for (it was
        // set up elsewhere) goes where the SYN went.
        let mut c = Worker::new(&plane, 0, 4096, 7);
        for port in 0..300u16 {
            let want = flow(&run(&mut a, &plane, &tcp(CLIENT, 20000 + port, VIP, 80, TCP_ACK), 1).1).dst;
            let (v, out) = run(&mut c, &plane, &tcp(CLIENT, 20000 + port, VIP, 80, TCP_ACK | TCP_PSH), 1);
            assert_eq!((v, flow(&out).dst), (Verdict::Forward, want));
        }
        // Picked up sessions hold the SYN timeout until their next packet.
        run(&mut c, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 22, TCP_SYN), 12);
        for _ in 0..200 {
            run(&mut c, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 22, TCP_SYN), 12);
        }
        assert_eq!(c.sessions(), 0);
        // An RST starts nothing; nor does FNAT (its source port is per process).
        assert_eq!(run(&mut c, &plane, &tcp(CLIENT, 5, VIP, 80, TCP_RST), 13).0, Verdict::Drop(Drop::NoSession));
        let plane = Plane::new(
            vec![service(L4Mode::Fnat, L4Scheduler::Maglev, PROTO_TCP)],
            vec![IpAddr::from(LOCAL)],
            MAC,
            HOP,
            1,
        );
        let mut w = Worker::new(&plane, 0, 64, 1);
        assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 5, VIP, 80, TCP_ACK), 0).0, Verdict::Drop(Drop::NoSession));
    }
}
