//! Router mode on real NICs: the XDP programs attached, one AF_XDP socket
//! per queue on each side, what the workers share (the router's view of
//! both sides, published whole; their counters), and the control
//! thread's share of the work (the view read again from the kernel,
//! neighbours resolved, the programs' maps kept in line with the peers).

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use gatehouse_link::nexthop::{self, NextHops};
use gatehouse_link::{netlink, xsk};
use gatehouse_plane::listeners::{Listeners, TAKEOVER_BIND_WAIT, XdpHandover, XdpSocket};

use super::handover::{Frames, Takeover};

use super::lan_tx::LanTx;
use super::steer::{Nic, Steering, Wanted};
use super::{Counts, Router, Side};

/// How often the control thread reads routes, neighbours and addresses
/// again, and the peers' allowed IPs for the steering maps.
const REFRESH: Duration = Duration::from_secs(1);

/// One worker's sockets: a queue of the LAN NIC and the same queue of the
/// WAN NIC, and where the LAN socket copies, the LAN sender that
/// coalesces ([`super::lan_tx`]).
pub struct Lane {
    pub lan: xsk::Socket,
    pub wan: xsk::Socket,
    pub lan_tx: Option<LanTx>,
}

/// What router mode's threads share.
pub struct RouterShared {
    pub lan: String,
    pub wan: String,
    pub lan_index: u32,
    pub wan_index: u32,
    pub view: ArcSwap<Router>,
    /// The programs, loaded at once and attached by [`RouterShared::attach`]
    /// (or swapped in behind a predecessor's links ahead of it).
    steering: Mutex<Option<Steering>>,
    /// Each worker's counters, as it last published them.
    pub counts: Vec<Mutex<Counts>>,
    /// Neighbours the workers could not find, to be resolved.
    pub resolve: Mutex<HashSet<(Nic, IpAddr)>>,
    /// When the view was last read.
    refreshed: Mutex<Instant>,
    /// Whether XDP runs in native mode on each NIC, and the sockets in
    /// zero-copy mode (once attached).
    modes: Mutex<([bool; 2], bool)>,
    /// What a takeover brought, until the start uses it.
    takeover: Mutex<Takeover>,
    /// Where the links and sockets are recorded for the next takeover.
    listeners: Arc<Listeners>,
    /// The frames each worker's sockets held unused when it stopped, for
    /// a process taking over ([`super::handover`]).
    pub(super) exported: Mutex<Vec<Frames>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why router mode could not start, and the config field at fault.
#[derive(Debug)]
pub struct OpenError {
    pub field: &'static str,
    pub message: String,
}

/// A NIC's side as the kernel has it now: MAC, first global address of
/// each family, routes and neighbours.
fn read_side(name: &str, index: u32) -> Side {
    let mac = xsk::mac_of(name).unwrap_or_default();
    let addrs = netlink::addresses(index).unwrap_or_default();
    let v4 = addrs.iter().find_map(|(a, _)| match a {
        IpAddr::V4(a) => Some(*a),
        IpAddr::V6(_) => None,
    });
    let v6 = addrs.iter().find_map(|(a, _)| match a {
        // Link-local addresses are not what a tunnel or an ICMP error leaves from.
        IpAddr::V6(a) if a.segments()[0] & 0xffc0 != 0xfe80 => Some(*a),
        _ => None,
    });
    let hops = NextHops::read(name, index).unwrap_or_default();
    Side { mac, v4, v6, hops: Arc::new(hops) }
}

fn view(lan: (&str, u32), wan: (&str, u32), port: u16, mtu: u32) -> Router {
    Router { lan: read_side(lan.0, lan.1), wan: read_side(wan.0, wan.1), port, mtu: mtu as usize }
}

/// What the programs must steer now: the peers' allowed IPs, the host's
/// addresses on both NICs, the port.
fn wanted(r: &RouterShared, allowed: &[(IpAddr, u8)], port: u16) -> Wanted {
    let mut host: Vec<IpAddr> = Vec::new();
    for index in [r.lan_index, r.wan_index] {
        host.extend(netlink::addresses(index).unwrap_or_default().into_iter().map(|(a, _)| a));
    }
    Wanted::new(allowed, &host, port)
}

/// What a refresh needs to know of the interface: its port and MTU now,
/// and the peers' allowed IPs (asked only when a refresh is due).
pub struct Now<'a> {
    pub name: &'a str,
    pub port: u16,
    pub mtu: u32,
    pub allowed: &'a dyn Fn() -> Vec<(IpAddr, u8)>,
}

impl RouterShared {
    /// Finds both NICs and their common queues (a worker each); attaches
    /// nothing yet ([`RouterShared::attach`] does, at once or, in a
    /// takeover, once the process before has let go of the NICs).
    pub fn new(
        cfg: &gatehouse_config::WgRouter,
        port: u16,
        mtu: u32,
        workers: usize,
        listeners: Arc<Listeners>,
    ) -> Result<RouterShared, OpenError> {
        let index = |field: &'static str, name: &str| {
            netlink::ifindex(name).map_err(|e| OpenError { field, message: format!("no interface {name:?}: {e}") })
        };
        let lan_index = index("router.lan", &cfg.lan)?;
        let wan_index = index("router.wan", &cfg.wan)?;
        let (lq, wq) = (xsk::rx_queues(&cfg.lan), xsk::rx_queues(&cfg.wan));
        let queues = lq.min(wq);
        if lq != wq || queues as usize > workers.max(1) {
            tracing::warn!(
                lan = %cfg.lan, wan = %cfg.wan, lan_queues = lq, wan_queues = wq,
                "router mode takes queues 0..{queues} of each NIC; traffic the NICs spread to other queues goes to the kernel (set equal queue counts with ethtool -L)"
            );
        }
        let view = view((&cfg.lan, lan_index), (&cfg.wan, wan_index), port, mtu);
        let steering =
            Steering::load().map_err(|e| OpenError { field: "router", message: format!("cannot load XDP: {e}") })?;
        Ok(RouterShared {
            lan: cfg.lan.clone(),
            wan: cfg.wan.clone(),
            lan_index,
            wan_index,
            view: ArcSwap::from_pointee(view),
            steering: Mutex::new(Some(steering)),
            counts: (0..queues).map(|_| Mutex::new(Counts::default())).collect(),
            resolve: Mutex::new(HashSet::new()),
            refreshed: Mutex::new(Instant::now() - REFRESH),
            modes: Mutex::new(([false; 2], false)),
            takeover: Mutex::new(Takeover::default()),
            listeners,
            exported: Mutex::new(Vec::new()),
        })
    }

    /// Workers (and queue pairs) this router runs.
    pub fn queues(&self) -> usize {
        self.counts.len()
    }

    /// Opens a socket on every queue pair, fills the programs' maps, and
    /// only then attaches the programs: no frame is steered before there
    /// is a socket and a rule for it. Taking over, the predecessor's
    /// sockets are adopted instead, behind the programs swapped in ahead
    /// ([`RouterShared::prepare_takeover`]); where they cannot be, this
    /// process opens its own once the kernel lets the queues go.
    pub fn attach(&self, it: &Now<'_>) -> Result<Vec<Lane>, OpenError> {
        let mut guard = lock(&self.steering);
        let steering =
            guard.as_mut().ok_or(OpenError { field: "router", message: "XDP programs not loaded".into() })?;
        let map_err = |e: super::steer::SteerError| OpenError { field: "router", message: e.to_string() };
        let mut tk = std::mem::take(&mut *lock(&self.takeover));
        let adopted = tk.adopt(self.queues(), [&self.lan, &self.wan]);
        let handed = tk.handed;
        // What was not adopted lets go of the predecessor's sockets and
        // links (the programs behind them leave with the last holder).
        drop(tk);
        let pairs = match adopted {
            Some(pairs) => {
                tracing::info!(lan = %self.lan, wan = %self.wan, "AF_XDP sockets adopted from the previous process");
                pairs
            }
            None => {
                steering.let_go();
                let busy_wait = if handed { TAKEOVER_BIND_WAIT } else { Duration::ZERO };
                let mut pairs = Vec::new();
                for q in 0..self.queues() as u32 {
                    let mut open = |nic: Nic, name: &str, ifindex: u32| {
                        let field = if nic == Nic::Lan { "router.lan" } else { "router.wan" };
                        let cfg = xsk::Config { busy_wait, ..xsk::Config::default() };
                        let s = xsk::Socket::open(ifindex, q, cfg).map_err(|e| OpenError {
                            field,
                            message: format!("cannot open an AF_XDP socket on {name} queue {q}: {e}"),
                        })?;
                        steering.set_socket(nic, q, s.fd()).map_err(|e| OpenError { field, message: e.to_string() })?;
                        Ok::<xsk::Socket, OpenError>(s)
                    };
                    pairs
                        .push((open(Nic::Lan, &self.lan, self.lan_index)?, open(Nic::Wan, &self.wan, self.wan_index)?));
                }
                pairs
            }
        };
        let steered = steering.update(&wanted(self, &(it.allowed)(), it.port)).and_then(|()| {
            if steering.attached() {
                Ok(())
            } else {
                steering.attach((&self.lan, self.lan_index), (&self.wan, self.wan_index))
            }
        });
        if let Err(e) = steered {
            // Programs swapped in ahead would steer to sockets nobody
            // reads: the NICs go back to the kernel instead.
            steering.let_go();
            return Err(map_err(e));
        }
        self.record(steering, &pairs);
        let zero_copy = pairs.iter().all(|(l, w)| l.zero_copy && w.zero_copy);
        *lock(&self.modes) = (steering.native, zero_copy);
        drop(guard);
        *lock(&self.refreshed) = Instant::now() - REFRESH;
        Ok(pairs
            .into_iter()
            .map(|(lan, wan)| {
                let lan_tx = if lan.zero_copy {
                    None
                } else {
                    LanTx::open(self.lan_index)
                        .map_err(
                            |e| tracing::warn!(lan = %self.lan, "no AF_PACKET sender ({e}): frames go out by AF_XDP"),
                        )
                        .ok()
                };
                Lane { lan, wan, lan_tx }
            })
            .collect())
    }

    /// The control thread's turn: neighbours asked for are solicited, and
    /// every [`REFRESH`] (or at once when `now_too`) the view and the
    /// steering maps are brought in line with the kernel and the device.
    pub fn refresh(&self, it: &Now<'_>, now_too: bool) {
        let asked: Vec<(Nic, IpAddr)> = lock(&self.resolve).drain().collect();
        for (nic, addr) in &asked {
            let name = if *nic == Nic::Lan { &self.lan } else { &self.wan };
            if let Err(e) = nexthop::solicit(*addr, name) {
                tracing::debug!(interface = %name, %addr, "cannot solicit the neighbour: {e}");
            }
        }
        let mut at = lock(&self.refreshed);
        if !now_too && asked.is_empty() && at.elapsed() < REFRESH {
            return;
        }
        *at = Instant::now();
        drop(at);
        let (port, mtu) = (it.port, it.mtu);
        let fresh = view((&self.lan, self.lan_index), (&self.wan, self.wan_index), port, mtu);
        // Published only when it changed: the workers keep their copy.
        if fresh != **self.view.load() {
            self.view.store(Arc::new(fresh));
        }
        let want = wanted(self, &(it.allowed)(), port);
        if let Some(steering) = lock(&self.steering).as_mut()
            && let Err(e) = steering.update(&want)
        {
            tracing::error!(interface = %it.name, "router steering maps: {e}");
        }
    }

    /// Every worker's counters summed.
    pub fn totals(&self) -> Counts {
        let mut t = Counts::default();
        for c in &self.counts {
            let c = lock(c);
            t.lan_rx += c.lan_rx;
            t.sealed += c.sealed;
            t.wan_rx += c.wan_rx;
            t.opened += c.opened;
            t.icmp += c.icmp;
            t.fragments += c.fragments;
            t.super_frames += c.super_frames;
            t.coalesced += c.coalesced;
            for (a, b) in t.drops.iter_mut().zip(c.drops) {
                *a += b;
            }
            for (a, b) in t.device.iter_mut().zip(c.device) {
                *a += b;
            }
        }
        t
    }
}

impl RouterShared {
    /// A process taking over, while the previous one still routes: puts
    /// this process's programs behind the previous one's links (`lan`,
    /// `wan`), their maps made for `it` and the previous process's sockets
    /// in their socket maps. Where that cannot be, the start attaches anew.
    pub fn prepare_takeover(&self, it: &Now<'_>, lan: Option<XdpHandover>, wan: Option<XdpHandover>) {
        let handed = lan.is_some() || wan.is_some();
        let prepared = match (lan, wan) {
            (Some(lan), Some(wan)) => self.swap_in_ahead(it, lan, wan),
            _ => None,
        };
        let mut tk = lock(&self.takeover);
        tk.handed = handed;
        tk.prepared = prepared;
    }

    /// [`RouterShared::prepare_takeover`]'s work: the predecessor's
    /// sockets of both sides, if this process's programs went behind both
    /// its links.
    fn swap_in_ahead(&self, it: &Now<'_>, lan: XdpHandover, wan: XdpHandover) -> Option<[Vec<XdpSocket>; 2]> {
        let mut guard = lock(&self.steering);
        let steering = guard.as_mut()?;
        let queues = self.queues();
        if lan.sockets.len() != queues || wan.sockets.len() != queues {
            tracing::warn!(
                interface = %it.name,
                "takeover: the previous process had other queues; the XDP programs wait for it to let the NICs go"
            );
            return None;
        }
        let made = [(Nic::Lan, &lan), (Nic::Wan, &wan)]
            .into_iter()
            .flat_map(|(nic, x)| x.sockets.iter().map(move |s| (nic, s)))
            .try_for_each(|(nic, s)| steering.set_socket(nic, s.queue, s.socket.as_raw_fd()))
            .and_then(|()| steering.update(&wanted(self, &(it.allowed)(), it.port)));
        let swapped = made.map_err(|e| e.to_string()).and_then(|()| {
            for (nic, x) in [(Nic::Lan, &lan), (Nic::Wan, &wan)] {
                let link = x.link.try_clone().map_err(|e| e.to_string())?;
                steering.replace(nic, link, x.native.unwrap_or(false)).map_err(|(e, _)| e.to_string())?;
            }
            Ok(())
        });
        match swapped {
            Ok(()) => {
                tracing::info!(
                    interface = %it.name,
                    "XDP programs swapped in behind the previous process's links; its sockets serve on"
                );
                Some([lan.sockets, wan.sockets])
            }
            Err(e) => {
                tracing::warn!(interface = %it.name, "takeover: the XDP programs wait for the previous process: {e}");
                None
            }
        }
    }

    /// The frames the previous process's sockets held unused, from the
    /// state it handed over.
    pub fn take_frames(&self, frames: Vec<Frames>) {
        lock(&self.takeover).set_frames(frames);
    }

    /// The frames this process's workers held unused when they stopped.
    pub fn exported(&self) -> Vec<Frames> {
        std::mem::take(&mut *lock(&self.exported))
    }

    /// Records the links and sockets in service, so a takeover hands them
    /// on (where the programs were attached through links).
    fn record(&self, steering: &Steering, pairs: &[(xsk::Socket, xsk::Socket)]) {
        for (nic, name) in [(Nic::Lan, &self.lan), (Nic::Wan, &self.wan)] {
            let Some(link) = steering.link(nic) else { continue };
            let sockets: Vec<&xsk::Socket> = pairs.iter().map(|(l, w)| if nic == Nic::Lan { l } else { w }).collect();
            match XdpHandover::of(link, steering.native[nic.index()], &sockets) {
                Ok(x) => self.listeners.record_xdp(name, x),
                Err(e) => tracing::warn!(interface = %name, "a takeover will attach the XDP program anew: {e}"),
            }
        }
    }

    /// The router stopped: the programs leave the NICs (unless a process
    /// that took over holds their links) and nothing is recorded for a
    /// takeover any more.
    pub fn release(&self) {
        self.listeners.forget_xdp(&self.lan);
        self.listeners.forget_xdp(&self.wan);
        drop(lock(&self.steering).take());
    }

    /// Puts this process's programs back behind their links, after a
    /// process taking over that swapped its own in gave up.
    pub fn reclaim(&self) {
        let Some(s) = lock(&self.steering).as_mut().map(Steering::reclaim) else { return };
        match s {
            Ok(()) => tracing::info!(lan = %self.lan, wan = %self.wan, "router mode's XDP programs steer again"),
            Err(e) => tracing::error!(lan = %self.lan, wan = %self.wan, "cannot put the XDP programs back: {e}"),
        }
    }
}

impl RouterShared {
    /// What `/status` shows of router mode.
    pub fn status(&self) -> serde_json::Value {
        let t = self.totals();
        let view = self.view.load();
        serde_json::json!({
            "lan": self.lan,
            "wan": self.wan,
            "lan_address": view.lan.v4.map(|a| a.to_string()),
            "wan_address": view.wan.v4.map(|a| a.to_string()),
            "workers": self.counts.len(),
            "xdp": if lock(&self.modes).0.iter().all(|n| *n) { "native" } else { "generic" },
            "zero_copy": lock(&self.modes).1,
            "sealed": t.sealed,
            "opened": t.opened,
        })
    }
}

/// Router mode's own series, for every interface (by name) in that mode.
pub fn metrics(ifaces: &[(&str, &RouterShared)], out: &mut gatehouse_plane::metrics::Exposition) {
    let routers: Vec<(&str, Counts)> = ifaces.iter().map(|(name, r)| (*name, r.totals())).collect();
    if routers.is_empty() {
        return;
    }
    type Series<'a> = (&'a str, &'a str, fn(&Counts) -> u64);
    let series: [Series<'_>; 8] = [
        ("gatehouse_wg_router_lan_rx_frames_total", "Frames router mode took from the LAN NIC.", |c| c.lan_rx),
        ("gatehouse_wg_router_sealed_total", "Packets sealed and sent out of the WAN NIC.", |c| c.sealed),
        ("gatehouse_wg_router_wan_rx_frames_total", "Frames router mode took from the WAN NIC.", |c| c.wan_rx),
        ("gatehouse_wg_router_opened_total", "Packets opened and sent out of the LAN NIC.", |c| c.opened),
        ("gatehouse_wg_router_icmp_total", "ICMP errors router mode sent (time exceeded, too big).", |c| c.icmp),
        ("gatehouse_wg_router_fragments_total", "IPv4 fragments router mode made to fit the tunnel.", |c| c.fragments),
        (
            "gatehouse_wg_router_lan_super_frames_total",
            "Super-frames (runs of one flow, segmented by the kernel) sent to the LAN where AF_XDP copies.",
            |c| c.super_frames,
        ),
        (
            "gatehouse_wg_router_lan_coalesced_frames_total",
            "Opened packets that went to the LAN inside super-frames.",
            |c| c.coalesced,
        ),
    ];
    for (name, help, f) in series {
        out.header(name, "counter", help);
        for (iface, c) in &routers {
            out.sample(name, &[("interface", iface)], f(c));
        }
    }
    let name = "gatehouse_wg_router_drops_total";
    out.header(name, "counter", "Frames router mode dropped before the device saw them, by reason.");
    for (iface, c) in &routers {
        for (reason, n) in super::RouterDrop::NAMES.iter().zip(c.drops) {
            out.sample(name, &[("interface", iface), ("reason", reason)], n);
        }
    }
}
