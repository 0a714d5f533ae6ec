//! The L4 runtime's control side: planes built from the config and
//! published to the workers, the XDP maps kept to what the config and the
//! role want, owned addresses announced, and the control thread that
//! follows health and next hops.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gatehouse_config::{L4, L4Mode};
use gatehouse_l4::plane::{Plane, Service};

use crate::shared::{CONTROL_PERIOD, HealthFn, Shared, TICK};
use crate::steer::Wanted;
use gatehouse_link::nexthop::NextHops;

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

pub(crate) fn build_plane(cfg: &L4, health: &HealthFn, mac: [u8; 6], workers: u16) -> Plane {
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
pub(crate) fn wanted(cfg: &L4, owns: bool) -> Wanted {
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
pub(crate) fn owned_addresses(cfg: &L4) -> Vec<IpAddr> {
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

/// Publishes planes for `cfg` on every port (health read now).
pub(crate) fn publish(shared: &Shared, cfg: &L4) {
    for port in &shared.ports {
        let plane = build_plane(cfg, &shared.health, port.mac, port.workers);
        port.plane.store(Arc::new(plane));
    }
    publish_steering(shared, cfg);
}

/// Makes the XDP maps what `cfg` and the role want.
pub(crate) fn publish_steering(shared: &Shared, cfg: &L4) {
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
pub(crate) fn announce(shared: &Shared, cfg: &L4) {
    let Some(ha) = &shared.ha else { return };
    let addrs = owned_addresses(cfg);
    for port in &shared.ports {
        match crate::ha::announce(port.ifindex, port.mac, &addrs, ha.announce) {
            Ok(n) => tracing::info!(interface = %port.name, frames = n, "announced the owned addresses"),
            Err(e) => tracing::warn!(interface = %port.name, "cannot announce the owned addresses: {e}"),
        }
    }
}

/// The control thread: announcements due after a promotion, health
/// changes republished, next hops kept current, unresolved ones solicited.
pub(crate) fn run(shared: &Shared) {
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
                if let Err(e) = gatehouse_link::nexthop::solicit(addr, &port.name) {
                    tracing::debug!(interface = %port.name, %addr, "resolving: {e}");
                }
            }
        }
        solicited.retain(|_, t| t.elapsed() < Duration::from_secs(10));
    }
}
