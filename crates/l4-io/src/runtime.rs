//! The running L4 plane: per interface, one worker thread per receive
//! queue (AF_XDP) or one worker (AF_PACKET), each with its own session
//! table; and a control thread that keeps next hops, health and the XDP
//! maps current and publishes new planes, which workers pick up between
//! vectors without locks.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use gatehouse_config::{L4, L4Io, L4Mode};
use gatehouse_l4::plane::{Buf, Counters, Plane, Service, VECTOR, Verdict, Worker};

use crate::ha::Ha;
use crate::nexthop::{Miss, NextHops};
use crate::steer::{Steering, Wanted};
use crate::xsk;

/// Session timeouts count in ticks of this.
pub const TICK: Duration = Duration::from_secs(1);
/// How often the control thread looks at neighbours, routes and health.
const CONTROL_PERIOD: Duration = Duration::from_millis(200);
/// How often a worker publishes its counters.
const PUBLISH_PERIOD: Duration = Duration::from_millis(100);

/// Whether a real server (service name, address) is healthy.
pub type HealthFn = Arc<dyn Fn(&str, SocketAddr) -> bool + Send + Sync>;

/// Per-worker figures beyond the plane's own counters.
#[derive(Clone, Debug, Default)]
pub struct IoCounters {
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Forwarded frames whose next hop's MAC is not known yet.
    pub no_neighbour: u64,
    pub no_route: u64,
    /// The transmit ring was full.
    pub tx_full: u64,
}

#[derive(Clone, Debug, Default)]
pub struct WorkerStats {
    pub interface: String,
    pub queue: u32,
    pub counters: Counters,
    pub io: IoCounters,
    pub sessions: usize,
}

struct Port {
    name: String,
    ifindex: u32,
    mac: [u8; 6],
    workers: u16,
    plane: ArcSwap<Plane>,
    hops: ArcSwap<NextHops>,
    misses: Mutex<Vec<IpAddr>>,
    /// The XDP program (AF_XDP only); taken out (detached) by `stop`.
    steering: Mutex<Option<Steering>>,
}

struct Shared {
    ports: Vec<Arc<Port>>,
    stats: Vec<Mutex<WorkerStats>>,
    stop: AtomicBool,
    cfg: Mutex<L4>,
    health: HealthFn,
    /// Active/standby, when `l4.ha` is configured.
    ha: Option<Arc<Ha>>,
    /// A second round of announcements after a promotion.
    reannounce: Mutex<Option<Instant>>,
}

impl Shared {
    /// Whether this node answers for its VIPs and local addresses now.
    fn owns(&self) -> bool {
        self.ha.as_ref().is_none_or(|h| h.is_master())
    }
}

/// How the runtime starts its active/standby part.
pub struct HaStart {
    pub role: gatehouse_config::HaRole,
    /// The sync key, read from the config or its file.
    pub key: Option<gatehouse_l4::sync::Key>,
}

/// The L4 plane of `gatehouse run`. Stops its threads when dropped.
pub struct L4Runtime {
    shared: Arc<Shared>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The backend in use: "af_xdp" or "af_packet".
    pub backend: &'static str,
}

/// An attribute of network interface `iface` from sysfs
/// (`/sys/class/net/IFACE/FILE`), trimmed.
pub fn sys(iface: &str, file: &str) -> Result<String, String> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/{file}"))
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("interface {iface}: {e}"))
}

/// `02:00:0a:ff:00:01` as bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let v: Vec<u8> = s.split(':').map(|h| u8::from_str_radix(h, 16)).collect::<Result<_, _>>().ok()?;
    <[u8; 6]>::try_from(v).ok()
}

fn rx_queues(iface: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{iface}/queues"))
        .map(|d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("rx-")).count() as u32)
        .unwrap_or(1)
        .max(1)
}

/// The host's addresses (every interface: a NAT reply to any of them is
/// the host's own traffic).
fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            if let Some(sa) = a.address {
                if let Some(v4) = sa.as_sockaddr_in() {
                    out.push(IpAddr::V4(v4.ip()));
                } else if let Some(v6) = sa.as_sockaddr_in6() {
                    out.push(IpAddr::V6(v6.ip()));
                }
            }
        }
    }
    out
}

fn build_plane(cfg: &L4, health: &HealthFn, mac: [u8; 6], workers: u16) -> Plane {
    let names: Vec<&str> = cfg.services.iter().map(|s| s.name.as_str()).collect();
    let reals: Vec<Vec<Option<SocketAddr>>> =
        cfg.services.iter().map(|s| s.real_servers.iter().map(|r| r.address).collect()).collect();
    let up = |i: usize, j: usize| reals[i][j].is_none_or(|a| health(names[i], a));
    let services = Service::from_config(cfg, TICK, &up);
    let ticks = |d: Duration| (d.as_millis() / TICK.as_millis()).clamp(1, u128::from(u32::MAX)) as u32;
    let snat = cfg
        .snat
        .iter()
        .map(|r| {
            let nets: Vec<(IpAddr, u8)> = r.sources.iter().map(|n| (n.addr(), n.prefix_len())).collect();
            let t = &r.timeouts;
            let timeouts = [ticks(t.tcp_syn), ticks(t.tcp_established), ticks(t.tcp_fin), ticks(t.udp)];
            let rule = gatehouse_l4::plane::SnatRule::new(r.name.clone(), &nets, timeouts);
            (rule, r.addresses.clone(), (r.ports.first, r.ports.last))
        })
        .collect();
    // The next hop's MAC is put in per frame by the worker.
    let mut plane = Plane::new(services, cfg.local_addresses.clone(), mac, [0; 6], workers).with_snat(snat);
    plane.syn_secret = syn_secret();
    plane
}

/// The SYN cookies' secret: random once per process (every plane keeps it,
/// so cookies in flight stay good across reloads).
fn syn_secret() -> [u64; 2] {
    static SECRET: std::sync::OnceLock<[u64; 2]> = std::sync::OnceLock::new();
    *SECRET.get_or_init(|| {
        use std::io::Read;
        let mut b = [0u8; 16];
        if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
            tracing::warn!("no /dev/urandom: SYN cookies use a weaker secret");
            b[..8].copy_from_slice(&fastrand::u64(..).to_le_bytes());
            b[8..].copy_from_slice(&(std::process::id() as u64 ^ fastrand::u64(..)).to_le_bytes());
        }
        [
            u64::from_le_bytes(b[..8].try_into().unwrap_or_default()),
            u64::from_le_bytes(b[8..].try_into().unwrap_or_default()),
        ]
    })
}

/// What the steering takes for the plane; nothing of the VIPs and local
/// addresses unless `owns` (a standby answers nothing for them).
fn wanted(cfg: &L4, owns: bool) -> Wanted {
    let mut w =
        Wanted { host: host_addresses().into_iter().map(crate::steer::addr_key).collect(), ..Default::default() };
    if !owns {
        return w;
    }
    for s in &cfg.services {
        if let Some(a) = s.address {
            w.owned.insert(crate::steer::addr_key(a.ip()));
        }
        if s.mode == L4Mode::Nat {
            let proto = if s.protocol == gatehouse_config::L4Protocol::Tcp { 6 } else { 17 };
            for r in s.real_servers.iter().filter_map(|r| r.address) {
                w.reals.insert(crate::steer::real_key(r.ip(), r.port(), proto));
            }
        }
    }
    for a in cfg.local_addresses.iter().chain(cfg.snat.iter().flat_map(|r| &r.addresses)) {
        w.owned.insert(crate::steer::addr_key(*a));
    }
    w.snat =
        cfg.snat.iter().flat_map(|r| &r.sources).map(|n| crate::steer::net_key(n.addr(), n.prefix_len())).collect();
    w
}

/// The addresses a master announces: VIPs and FNAT local addresses.
fn owned_addresses(cfg: &L4) -> Vec<IpAddr> {
    let mut v: Vec<IpAddr> = cfg
        .services
        .iter()
        .filter_map(|s| s.address.map(|a| a.ip()))
        .chain(cfg.local_addresses.iter().copied())
        .chain(cfg.snat.iter().flat_map(|r| r.addresses.iter().copied()))
        .collect();
    v.sort();
    v.dedup();
    v
}

enum Backend {
    Xdp(Box<xsk::Socket>),
    Packet(crate::packet_socket::PacketSocket),
}

/// Why the L4 plane could not start.
#[derive(Debug)]
pub struct StartError {
    /// The config field at fault (`l4.interfaces[0]`), when one is.
    pub path: Option<String>,
    pub message: String,
}

impl StartError {
    fn at(path: String, message: String) -> Self {
        StartError { path: Some(path), message }
    }

    fn host(message: String) -> Self {
        StartError { path: None, message }
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{p}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for StartError {}

impl L4Runtime {
    /// Opens every interface of `cfg` and starts the workers. With
    /// `fallback` false, `io: auto` does not settle for AF_PACKET when
    /// AF_XDP fails (a process being taken over may still hold the XDP
    /// program: the caller tries again).
    pub fn start(cfg: &L4, health: HealthFn, fallback: bool, ha: Option<HaStart>) -> Result<L4Runtime, StartError> {
        let mut ports = Vec::new();
        let mut backends: Vec<(usize, u32, Backend)> = Vec::new();
        let mut backend_name = "af_xdp";
        let owns = ha.as_ref().is_none_or(|h| h.role == gatehouse_config::HaRole::Master);
        let w = wanted(cfg, owns);
        for (pi, name) in cfg.interfaces.iter().enumerate() {
            let at = || format!("l4.interfaces[{pi}]");
            let ifindex: u32 = sys(name, "ifindex")
                .and_then(|i| i.parse().map_err(|_| format!("interface {name}: no index")))
                .map_err(|e| StartError::at(at(), e))?;
            let mac = sys(name, "address")
                .and_then(|a| parse_mac(&a).ok_or_else(|| format!("interface {name}: no MAC address")))
                .map_err(|e| StartError::at(at(), e))?;
            let mut steering = None;
            let mut sockets = Vec::new();
            if cfg.io != L4Io::AfPacket {
                match open_xdp(name, ifindex, &w) {
                    Ok((s, socks)) => {
                        steering = Some(s);
                        sockets = socks;
                    }
                    Err(e) if cfg.io == L4Io::Auto && fallback => {
                        tracing::warn!(interface = %name, "AF_XDP unavailable ({e}); falling back to AF_PACKET");
                    }
                    Err(e) => return Err(StartError::at(at(), format!("({name}) AF_XDP: {e}"))),
                }
            }
            let queues = if sockets.is_empty() {
                backend_name = "af_packet";
                let s = crate::packet_socket::PacketSocket::open(ifindex)
                    .map_err(|e| StartError::at(at(), format!("({name}) AF_PACKET: {e}")))?;
                backends.push((pi, 0, Backend::Packet(s)));
                1
            } else {
                let n = sockets.len() as u32;
                for (q, s) in sockets.into_iter().enumerate() {
                    backends.push((pi, q as u32, Backend::Xdp(Box::new(s))));
                }
                n
            };
            let plane = build_plane(cfg, &health, mac, queues as u16);
            let hops = NextHops::read(name, ifindex).unwrap_or_default();
            ports.push(Arc::new(Port {
                name: name.clone(),
                ifindex,
                mac,
                workers: queues as u16,
                plane: ArcSwap::from_pointee(plane),
                hops: ArcSwap::from_pointee(hops),
                misses: Mutex::new(Vec::new()),
                steering: Mutex::new(steering),
            }));
            tracing::info!(interface = %name, queues, backend = backend_name, "L4 plane attached");
        }
        let ha = match (ha, &cfg.ha) {
            (Some(h), Some(c)) => {
                let sync = c.sync.clone().zip(h.key);
                // The peer's sessions: as many as all of its workers hold.
                let cache = cfg.max_sessions.saturating_mul(backends.len().max(1));
                Some(Arc::new(Ha::new(h.role, c.announce, sync, backends.len(), cache)))
            }
            _ => None,
        };
        let shared = Arc::new(Shared {
            ha,
            reannounce: Mutex::new(None),
            stats: backends
                .iter()
                .map(|(pi, q, _)| {
                    Mutex::new(WorkerStats { interface: ports[*pi].name.clone(), queue: *q, ..Default::default() })
                })
                .collect(),
            ports,
            stop: AtomicBool::new(false),
            cfg: Mutex::new(cfg.clone()),
            health,
        });
        let mut threads = Vec::new();
        for (slot, (pi, q, backend)) in backends.into_iter().enumerate() {
            let (shared, port) = (shared.clone(), shared.ports[pi].clone());
            let capacity = cfg.max_sessions;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("l4-{}-{q}", port.name))
                    .spawn(move || worker_loop(&shared, &port, q, slot, backend, capacity))
                    .map_err(|e| StartError::host(format!("cannot start an L4 worker: {e}")))?,
            );
        }
        if shared.ha.as_ref().is_some_and(|h| h.sync.is_some()) {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("l4-sync".into())
                    .spawn(move || {
                        if let Some(ha) = &s.ha {
                            crate::ha::sync_loop(ha, &s.stop);
                        }
                    })
                    .map_err(|e| StartError::host(format!("cannot start the L4 sync thread: {e}")))?,
            );
        }
        if shared.owns() && shared.ha.is_some() {
            announce(&shared, &cfg.clone());
        }
        let control = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("l4-control".into())
                .spawn(move || control_loop(&control))
                .map_err(|e| StartError::host(format!("cannot start the L4 control thread: {e}")))?,
        );
        Ok(L4Runtime { shared, threads: Mutex::new(threads), backend: backend_name })
    }

    /// A new `l4` section (same interfaces): publishes new planes and XDP
    /// maps. Sessions survive unless the services' shape changed.
    pub fn update(&self, cfg: &L4) {
        let mut cur = self.shared.cfg.lock().unwrap_or_else(|e| e.into_inner());
        if cur.interfaces != cfg.interfaces || cur.io != cfg.io || cur.max_sessions != cfg.max_sessions {
            tracing::warn!("l4.interfaces, l4.io and l4.max_sessions take effect at the next start");
        }
        if cur.ha != cfg.ha {
            tracing::warn!("l4.ha takes effect at the next start");
        }
        // Sessions survive when the new plane extends the old (see
        // `Plane::extends`); the workers check that themselves.
        let keep_ifaces = cur.interfaces.clone();
        *cur = L4 { interfaces: keep_ifaces, io: cur.io, max_sessions: cur.max_sessions, ..cfg.clone() };
        publish(&self.shared, &cur);
    }

    /// Whether every worker, sync and control thread still runs.
    pub fn alive(&self) -> bool {
        self.threads.lock().unwrap_or_else(|e| e.into_inner()).iter().all(|t| !t.is_finished())
    }

    /// The active/standby part, when `l4.ha` is configured.
    pub fn ha(&self) -> Option<&Ha> {
        self.shared.ha.as_deref()
    }

    /// keepalived's notify: becomes master (takes the addresses, commits the
    /// peer's sessions, announces) or backup/fault (lets them go).
    pub fn set_role(&self, role: gatehouse_config::HaRole) {
        let Some(ha) = &self.shared.ha else { return };
        let old = ha.set_role(role);
        if old == role {
            return;
        }
        let cfg = self.shared.cfg.lock().unwrap_or_else(|e| e.into_inner()).clone();
        publish_steering(&self.shared, &cfg);
        tracing::info!(from = old.name(), to = role.name(), "L4 high-availability role changed");
        if role == gatehouse_config::HaRole::Master {
            announce(&self.shared, &cfg);
            *self.shared.reannounce.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(Instant::now() + Duration::from_secs(1));
        }
    }

    /// Every worker's latest counters.
    pub fn stats(&self) -> Vec<WorkerStats> {
        self.shared.stats.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).clone()).collect()
    }

    /// SNAT rule names, in counter order.
    pub fn snat_rules(&self) -> Vec<String> {
        self.shared.cfg.lock().unwrap_or_else(|e| e.into_inner()).snat.iter().map(|r| r.name.clone()).collect()
    }

    /// Service names and real-server addresses, in counter order.
    pub fn layout(&self) -> Vec<(String, Vec<SocketAddr>)> {
        let cfg = self.shared.cfg.lock().unwrap_or_else(|e| e.into_inner());
        cfg.services
            .iter()
            .map(|s| (s.name.clone(), s.real_servers.iter().filter_map(|r| r.address).collect()))
            .collect()
    }
}

impl L4Runtime {
    /// Stops the workers and detaches the XDP programs, giving the
    /// interfaces back to the kernel (and to a process taking over).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
        for port in &self.shared.ports {
            drop(port.steering.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
    }
}

impl Drop for L4Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

fn open_xdp(name: &str, ifindex: u32, w: &Wanted) -> Result<(Steering, Vec<xsk::Socket>), String> {
    let mut steering = Steering::attach(name)?;
    let mut sockets = Vec::new();
    for q in 0..rx_queues(name) {
        let s = xsk::Socket::open(ifindex, q, xsk::Config::default())
            .map_err(|e| format!("AF_XDP socket on queue {q}: {e}"))?;
        steering.set_socket(q, s.fd())?;
        sockets.push(s);
    }
    // Only now, with a socket on every queue, does traffic get steered.
    steering.update(w)?;
    Ok((steering, sockets))
}

/// Publishes planes for `cfg` on every port (health read now).
fn publish(shared: &Shared, cfg: &L4) {
    for port in &shared.ports {
        let plane = build_plane(cfg, &shared.health, port.mac, port.workers);
        port.plane.store(Arc::new(plane));
    }
    publish_steering(shared, cfg);
}

/// Makes the XDP maps what `cfg` and the role want.
fn publish_steering(shared: &Shared, cfg: &L4) {
    let w = wanted(cfg, shared.owns());
    for port in &shared.ports {
        if let Some(s) = port.steering.lock().unwrap_or_else(|e| e.into_inner()).as_mut()
            && let Err(e) = s.update(&w)
        {
            tracing::warn!(interface = %port.name, "updating the XDP maps: {e}");
        }
    }
}

/// Gratuitous ARPs and unsolicited neighbour advertisements for every
/// owned address on every interface.
fn announce(shared: &Shared, cfg: &L4) {
    let Some(ha) = &shared.ha else { return };
    let addrs = owned_addresses(cfg);
    for port in &shared.ports {
        match crate::ha::announce(port.ifindex, port.mac, &addrs, ha.announce) {
            Ok(n) => tracing::info!(interface = %port.name, frames = n, "announced the owned addresses"),
            Err(e) => tracing::warn!(interface = %port.name, "cannot announce the owned addresses: {e}"),
        }
    }
}

fn control_loop(shared: &Shared) {
    let mut solicited: HashMap<IpAddr, Instant> = HashMap::new();
    let mut last_up: Vec<bool> = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(CONTROL_PERIOD);
        let cfg = shared.cfg.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let due = {
            let mut r = shared.reannounce.lock().unwrap_or_else(|e| e.into_inner());
            let due = r.is_some_and(|t| Instant::now() >= t);
            if due {
                *r = None;
            }
            due
        };
        if due && shared.owns() {
            announce(shared, &cfg);
        }
        // Health: republish when any real server changed state.
        let up: Vec<bool> = cfg
            .services
            .iter()
            .flat_map(|s| s.real_servers.iter().map(move |r| r.address.is_none_or(|a| (shared.health)(&s.name, a))))
            .collect();
        if up != last_up {
            if !last_up.is_empty() {
                publish(shared, &cfg);
            }
            last_up = up;
        }
        for port in &shared.ports {
            match NextHops::read(&port.name, port.ifindex) {
                Ok(hops) if hops != **port.hops.load() => port.hops.store(Arc::new(hops)),
                Ok(_) => {}
                Err(e) => tracing::debug!(interface = %port.name, "reading neighbours: {e}"),
            }
            let misses = std::mem::take(&mut *port.misses.lock().unwrap_or_else(|e| e.into_inner()));
            for addr in misses {
                let now = Instant::now();
                if solicited.get(&addr).is_some_and(|t| now.duration_since(*t) < Duration::from_secs(1)) {
                    continue;
                }
                solicited.insert(addr, now);
                if let Err(e) = crate::nexthop::solicit(addr, &port.name) {
                    tracing::debug!(interface = %port.name, %addr, "resolving: {e}");
                }
            }
        }
        solicited.retain(|_, t| t.elapsed() < Duration::from_secs(10));
    }
}

/// Puts the next hop's MAC into a forwarded frame. ARP answers and
/// neighbour advertisements are already addressed to their asker.
fn address_frame(frame: &mut [u8], hint: Option<IpAddr>, hops: &NextHops) -> Result<(), Miss> {
    use gatehouse_wire::field::{ethernet, icmp, ipv4, ipv6};
    use gatehouse_wire::packet::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_ICMPV6};
    let l3 = ethernet::HEADER_LEN;
    let ethertype = match frame.get(ethernet::ETHERTYPE..l3) {
        Some(&[a, b]) => u16::from_be_bytes([a, b]),
        _ => return Err(Miss::NoRoute),
    };
    let field = |at: usize, len: usize| frame.get(l3 + at..l3 + at + len);
    let dst = match ethertype {
        ETHERTYPE_ARP => return Ok(()),
        ETHERTYPE_IPV4 => match field(ipv4::DST, 4).and_then(|b| <[u8; 4]>::try_from(b).ok()) {
            Some(a) => IpAddr::from(a),
            None => return Err(Miss::NoRoute),
        },
        ETHERTYPE_IPV6 => {
            let advert = frame.get(l3 + ipv6::HEADER_LEN + icmp::TYPE) == Some(&gatehouse_l4::neighbour::ND_ADVERT);
            if field(ipv6::NEXT_HEADER, 1) == Some(&[PROTO_ICMPV6]) && advert {
                return Ok(());
            }
            match field(ipv6::DST, 16).and_then(|b| <[u8; 16]>::try_from(b).ok()) {
                Some(a) => IpAddr::from(a),
                None => return Err(Miss::NoRoute),
            }
        }
        _ => return Err(Miss::NoRoute),
    };
    let mac = hops.mac(hint.unwrap_or(dst))?;
    frame[..6].copy_from_slice(&mac);
    Ok(())
}

/// A worker's state: its plane, and the session tables that outlive
/// planes that extend each other.
struct Lane {
    worker: Worker,
    published: Arc<Plane>,
    verdicts: Vec<Verdict>,
    io: IoCounters,
    started: Instant,
    last_publish: Instant,
    capacity: usize,
    queue: u16,
    /// Whether sessions are synced to a peer.
    sync: bool,
    /// The demotions and peer joins seen (see `Ha`).
    demotions: u32,
    resyncs: u32,
    /// The table walk that sends long-lived sessions again: when it last
    /// ran, and the slots it still owes.
    walked: Instant,
    walk_credit: f64,
    /// The last vector was full: the walk waits.
    busy: bool,
}

impl Lane {
    fn new_worker(&self, plane: &Plane) -> Worker {
        let mut w = Worker::new(plane, self.queue, self.capacity, fastrand::u64(..));
        if self.sync {
            w.enable_sync(crate::ha::OUTBOX_CAP, TICK);
        }
        w
    }

    /// Picks up a newly published plane.
    fn refresh(&mut self, port: &Port) {
        let p = port.plane.load();
        if !Arc::ptr_eq(&p, &self.published) {
            let p = p.clone();
            if p.extends(&self.published) {
                self.worker.adopt(&p);
            } else {
                self.worker = self.new_worker(&p);
            }
            self.published = p;
        }
    }

    fn now(&self) -> u32 {
        (self.started.elapsed().as_millis() / TICK.as_millis()) as u32
    }

    /// Between vectors (after [`Lane::refresh`]): a demotion empties the tables; the peer's sessions
    /// are committed (before the next vector is looked at); the table walk
    /// goes on (unless the last vector was full, or a peer asked for
    /// everything); queued sessions go to the sync thread.
    fn ha_step(&mut self, shared: &Shared, slot: usize) {
        let Some(ha) = &shared.ha else { return };
        let d = ha.demotions.load(Ordering::Acquire);
        if d != self.demotions {
            self.demotions = d;
            self.worker = self.new_worker(&self.published.clone());
        }
        let Some(sync) = &ha.sync else { return };
        let r = ha.resyncs.load(Ordering::Acquire);
        if r != self.resyncs {
            self.resyncs = r;
            self.worker.start_bulk();
        }
        let now = self.now();
        let slots = self.worker.sync_slots() as f64;
        let elapsed = self.walked.elapsed().as_secs_f64();
        self.walked = Instant::now();
        self.walk_credit = (self.walk_credit + slots * elapsed / sync.cfg.refresh.as_secs_f64()).min(slots);
        let bulk = self.worker.bulk_left() > 0;
        if sync.room() && (bulk || !self.busy) {
            let budget = if bulk { self.walk_credit.max(16_384.0) } else { self.walk_credit } as usize;
            if budget > 0 {
                self.worker.sync_walk(&self.published, now, budget);
                self.walk_credit = (self.walk_credit - budget as f64).max(0.0);
            }
        }
        crate::ha::worker_exchange(sync, slot, &mut self.worker, &self.published, now);
    }

    /// Runs the pipeline over `bufs`; returns, per frame, whether to send it.
    fn process(&mut self, port: &Port, bufs: &mut [Buf<'_>], send: &mut Vec<bool>) {
        let now = self.now();
        self.busy = bufs.len() >= VECTOR;
        self.io.rx_packets += bufs.len() as u64;
        self.worker.process(&self.published, bufs, &mut self.verdicts, now);
        let hops = port.hops.load();
        send.clear();
        for (i, b) in bufs.iter_mut().enumerate() {
            let ok = self.verdicts[i] == Verdict::Forward
                && match address_frame(b.frame_mut(), self.worker.next_hops[i], &hops) {
                    Ok(()) => true,
                    Err(Miss::Unresolved(a)) => {
                        self.io.no_neighbour += 1;
                        if let Ok(mut m) = port.misses.try_lock()
                            && m.len() < 64
                            && !m.contains(&a)
                        {
                            m.push(a);
                        }
                        false
                    }
                    Err(Miss::NoRoute) => {
                        self.io.no_route += 1;
                        false
                    }
                };
            send.push(ok);
        }
    }

    fn publish_stats(&mut self, shared: &Shared, slot: usize) {
        if self.last_publish.elapsed() < PUBLISH_PERIOD {
            return;
        }
        self.last_publish = Instant::now();
        let mut s = shared.stats[slot].lock().unwrap_or_else(|e| e.into_inner());
        s.counters = self.worker.counters().clone();
        s.io = self.io.clone();
        s.sessions = self.worker.sessions();
    }
}

fn worker_loop(shared: &Shared, port: &Port, queue: u32, slot: usize, backend: Backend, capacity: usize) {
    let published = port.plane.load_full();
    let ha = shared.ha.as_deref();
    let mut lane = Lane {
        worker: Worker::new(&published, queue as u16, capacity, 0),
        published: published.clone(),
        verdicts: Vec::with_capacity(VECTOR),
        io: IoCounters::default(),
        started: Instant::now(),
        last_publish: Instant::now(),
        capacity,
        queue: queue as u16,
        sync: ha.is_some_and(|h| h.sync.is_some()),
        demotions: ha.map_or(0, |h| h.demotions.load(Ordering::Acquire)),
        resyncs: ha.map_or(0, |h| h.resyncs.load(Ordering::Acquire)),
        walked: Instant::now(),
        walk_credit: 0.0,
        busy: false,
    };
    lane.worker = lane.new_worker(&published);
    let mut send = Vec::with_capacity(VECTOR);
    match backend {
        Backend::Xdp(mut sock) => {
            let mut descs = Vec::with_capacity(VECTOR);
            let mut tx = Vec::with_capacity(VECTOR);
            let mut recycle = Vec::with_capacity(VECTOR);
            while !shared.stop.load(Ordering::Relaxed) {
                sock.refill();
                lane.publish_stats(shared, slot);
                descs.clear();
                if sock.recv(&mut descs, VECTOR) == 0 {
                    lane.busy = false;
                    lane.refresh(port);
                    lane.ha_step(shared, slot);
                    sock.wait(if lane.sync { 10 } else { 50 });
                    continue;
                }
                lane.refresh(port);
                lane.ha_step(shared, slot);
                tx.clear();
                recycle.clear();
                match sock.frames(&descs) {
                    Some(frames) => {
                        let mut bufs: Vec<Buf<'_>> = frames
                            .into_iter()
                            .zip(&descs)
                            .map(|(mem, d)| Buf {
                                mem,
                                head: (d.addr - xsk::frame_of(d.addr)) as usize,
                                len: d.len as usize,
                            })
                            .collect();
                        lane.process(port, &mut bufs, &mut send);
                        for ((b, d), &ok) in bufs.iter().zip(&descs).zip(&send) {
                            if ok {
                                tx.push(xsk::Desc {
                                    addr: xsk::frame_of(d.addr) + b.head as u64,
                                    len: b.len as u32,
                                    options: 0,
                                });
                            } else {
                                recycle.push(d.addr);
                            }
                        }
                    }
                    None => recycle.extend(descs.iter().map(|d| d.addr)),
                }
                for &a in &recycle {
                    sock.recycle(a);
                }
                let sent = sock.send(&tx);
                lane.io.tx_packets += sent as u64;
                lane.io.tx_full += (tx.len() - sent) as u64;
            }
        }
        Backend::Packet(sock) => {
            let mut want = wanted(&shared.cfg.lock().unwrap_or_else(|e| e.into_inner()), shared.owns());
            let mut want_at = Instant::now();
            let mut mem = vec![0u8; VECTOR * xsk::FRAME_SIZE];
            let mut lens = Vec::with_capacity(VECTOR);
            while !shared.stop.load(Ordering::Relaxed) {
                lane.publish_stats(shared, slot);
                if want_at.elapsed() > CONTROL_PERIOD {
                    want = wanted(&shared.cfg.lock().unwrap_or_else(|e| e.into_inner()), shared.owns());
                    want_at = Instant::now();
                }
                lens.clear();
                // Frames the plane does not want are the kernel's (it has
                // its own copy); a bounded number are read per vector.
                for _ in 0..4 * VECTOR {
                    let k = lens.len();
                    let room = &mut mem[k * xsk::FRAME_SIZE + xsk::RX_HEADROOM..(k + 1) * xsk::FRAME_SIZE];
                    match sock.recv(room) {
                        Some(n) if crate::steer::wants(&room[..n], &want) => lens.push(n),
                        Some(_) => {}
                        None => break,
                    }
                    if lens.len() == VECTOR {
                        break;
                    }
                }
                if lens.is_empty() {
                    lane.busy = false;
                    lane.refresh(port);
                    lane.ha_step(shared, slot);
                    sock.wait(if lane.sync { 10 } else { 50 });
                    continue;
                }
                lane.refresh(port);
                lane.ha_step(shared, slot);
                let mut bufs: Vec<Buf<'_>> = mem
                    .chunks_exact_mut(xsk::FRAME_SIZE)
                    .zip(&lens)
                    .map(|(mem, &len)| Buf { mem, head: xsk::RX_HEADROOM, len })
                    .collect();
                lane.process(port, &mut bufs, &mut send);
                for (b, &ok) in bufs.iter().zip(&send) {
                    if ok && sock.send(b.frame()) {
                        lane.io.tx_packets += 1;
                    }
                }
            }
        }
    }
}
