//! The running L4 plane: per interface, one worker thread per receive
//! queue (AF_XDP) or one worker (AF_PACKET), each with its own session
//! table; and a control thread that keeps next hops, health and the XDP
//! maps current and publishes new planes, which workers pick up between
//! vectors without locks.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use gatehouse_config::{L4, L4Io};

use crate::control::{announce, build_plane, publish, publish_steering, wanted};
use crate::frame_io::{PacketIo, XdpIo};
use crate::ha::Ha;
use crate::shared::{HealthFn, Port, Shared, WorkerStats};
use crate::steer::{Loaded, Steering, Wanted};
use crate::takeover::Handover;
use gatehouse_link::nexthop::NextHops;
use gatehouse_link::xsk;
use gatehouse_plane::listeners::{TAKEOVER_BIND_WAIT, XdpHandover, adopt_xdp_sockets};

/// How the runtime starts its active/standby part.
pub struct HaStart {
    pub role: gatehouse_config::HaRole,
    /// The sync key, read from the config or its file.
    pub key: Option<gatehouse_l4::sync::Key>,
}

/// The L4 plane of `gatehouse run`. Stops its threads when dropped.
pub struct L4Runtime {
    shared: Arc<Shared>,
    /// The workers, which hold the AF_XDP sockets.
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The sync and control threads.
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The backend in use: "af_xdp" or "af_packet".
    pub backend: &'static str,
    /// What a takeover hands on, until the plane records it.
    xdp: Mutex<Vec<(String, XdpHandover)>>,
}

/// An attribute of network interface `iface` from sysfs
/// (`/sys/class/net/IFACE/FILE`), trimmed.
pub fn sys(iface: &str, file: &str) -> Result<String, InterfaceError> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/{file}"))
        .map(|s| s.trim().to_string())
        .map_err(|source| InterfaceError::Read { interface: iface.to_string(), file: file.to_string(), source })
}

/// Why an interface could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InterfaceError {
    #[error("interface {interface}: cannot read its {file}: {source}")]
    Read { interface: String, file: String, source: std::io::Error },
    #[error("interface {0}: no index")]
    NoIndex(String),
    #[error("interface {0}: no MAC address")]
    NoMac(String),
    #[error(transparent)]
    Steering(#[from] crate::steer::SteerError),
    #[error("AF_XDP socket on queue {queue}: {source}")]
    Socket { queue: u32, source: std::io::Error },
}

pub use gatehouse_link::xsk::parse_mac;
use gatehouse_link::xsk::rx_queues;

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
    /// `handover`: what a process taking over brings (its programs are
    /// used up; its sessions go to the workers once the start succeeds).
    pub fn start(
        cfg: &L4,
        health: HealthFn,
        fallback: bool,
        ha: Option<HaStart>,
        handover: &mut Handover,
    ) -> Result<L4Runtime, StartError> {
        let mut ports = Vec::new();
        let mut backends: Vec<(usize, u32, Backend)> = Vec::new();
        let mut backend_name = "af_xdp";
        let mut xdp = Vec::new();
        let owns = ha.as_ref().is_none_or(|h| h.role == gatehouse_config::HaRole::Master);
        let w = wanted(cfg, owns);
        for (pi, name) in cfg.interfaces.iter().enumerate() {
            let at = || format!("l4.interfaces[{pi}]");
            let ifindex: u32 = sys(name, "ifindex")
                .and_then(|i| i.parse().map_err(|_| InterfaceError::NoIndex(name.clone())))
                .map_err(|e| StartError::at(at(), e.to_string()))?;
            let mac = sys(name, "address")
                .and_then(|a| parse_mac(&a).ok_or_else(|| InterfaceError::NoMac(name.clone())))
                .map_err(|e| StartError::at(at(), e.to_string()))?;
            let mut steering = None;
            let mut sockets = Vec::new();
            if cfg.io != L4Io::AfPacket {
                match open_xdp(name, ifindex, &w, handover) {
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
            if let Some(s) = &steering
                && let Some(link) = s.link()
            {
                match XdpHandover::of(link, s.native, &sockets.iter().collect::<Vec<_>>()) {
                    Ok(x) => xdp.push((name.clone(), x)),
                    Err(e) => tracing::warn!(interface = %name, "a takeover will attach the XDP program anew: {e}"),
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
            export: AtomicBool::new(false),
            exported: Mutex::new(Vec::new()),
            exported_frames: Mutex::new(Vec::new()),
        });
        // Every worker commits them all, then lets go: the last frees them.
        let taken_over = Arc::new(std::mem::take(&mut handover.sessions));
        let mut workers = Vec::new();
        for (slot, (pi, q, backend)) in backends.into_iter().enumerate() {
            let (shared, port, taken_over) = (shared.clone(), shared.ports[pi].clone(), taken_over.clone());
            let capacity = cfg.max_sessions;
            workers.push(
                std::thread::Builder::new()
                    .name(format!("l4-{}-{q}", port.name))
                    .spawn(move || match backend {
                        Backend::Xdp(sock) => {
                            crate::lane::run(&shared, &port, q, slot, XdpIo::new(sock), capacity, taken_over)
                        }
                        Backend::Packet(sock) => crate::lane::run(
                            &shared,
                            &port,
                            q,
                            slot,
                            PacketIo::new(sock, &shared),
                            capacity,
                            taken_over,
                        ),
                    })
                    .map_err(|e| StartError::host(format!("cannot start an L4 worker: {e}")))?,
            );
        }
        let mut threads = Vec::new();
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
                .spawn(move || crate::control::run(&control))
                .map_err(|e| StartError::host(format!("cannot start the L4 control thread: {e}")))?,
        );
        Ok(L4Runtime {
            shared,
            workers: Mutex::new(workers),
            threads: Mutex::new(threads),
            backend: backend_name,
            xdp: Mutex::new(xdp),
        })
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
        let running = |t: &Mutex<Vec<std::thread::JoinHandle<()>>>| {
            t.lock().unwrap_or_else(|e| e.into_inner()).iter().all(|t| !t.is_finished())
        };
        running(&self.workers) && running(&self.threads)
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

    /// What a takeover hands on of each interface steered through an XDP
    /// link: duplicates of the link and of each queue's AF_XDP socket,
    /// taken once (whoever holds them keeps the program on the interface
    /// and the sockets on their queues).
    pub fn take_xdp_handover(&self) -> Vec<(String, XdpHandover)> {
        std::mem::take(&mut *self.xdp.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts this process's programs back behind their links, after a
    /// process that took over gave up.
    pub fn reclaim(&self) {
        for port in &self.shared.ports {
            if let Some(s) = port.steering.lock().unwrap_or_else(|e| e.into_inner()).as_mut()
                && let Err(e) = s.reclaim()
            {
                tracing::error!(interface = %port.name, "cannot put the XDP program back: {e}");
            }
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

    /// Service names and real-server addresses, in counter order, each
    /// with whether the published plane gives it new sessions (the health
    /// it was built with; `None` where no plane holds the server). Health
    /// changes reach the plane at the control thread's next turn.
    pub fn layout(&self) -> Vec<(String, Vec<RealState>)> {
        let plane = self.shared.ports.first().map(|p| p.plane.load_full());
        let in_plane = |name: &str, a: SocketAddr| {
            let service = plane.as_ref()?.services.iter().find(|s| s.name == name)?;
            service.reals.iter().find(|r| r.addr == a.ip() && r.port == a.port()).map(|r| r.up)
        };
        let cfg = self.shared.cfg.lock().unwrap_or_else(|e| e.into_inner());
        cfg.services
            .iter()
            .map(|s| {
                let reals = s.real_servers.iter().filter_map(|r| r.address).map(|a| (a, in_plane(&s.name, a)));
                (s.name.clone(), reals.collect())
            })
            .collect()
    }
}

/// A real server's address, and whether the published plane gives it new
/// sessions (`None`: no plane holds it).
pub type RealState = (SocketAddr, Option<bool>);

impl L4Runtime {
    /// Stops the workers and detaches the XDP programs, giving the
    /// interfaces back to the kernel (and to a process taking over), then
    /// waits for the sync and control threads.
    pub fn stop(&self) {
        self.release_interfaces();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }

    /// The part of [`L4Runtime::stop`] that a process taking over waits
    /// for: the workers, which close the AF_XDP sockets as they end, and
    /// the XDP programs. The control thread, asleep for up to a period,
    /// ends in its own time.
    fn release_interfaces(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let workers = std::mem::take(&mut *self.workers.lock().unwrap_or_else(|e| e.into_inner()));
        for t in workers {
            let _ = t.join();
        }
        for port in &self.shared.ports {
            drop(port.steering.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
    }

    /// Lets the interfaces go as [`L4Runtime::stop`] does (the sync and
    /// control threads are joined by a later `stop`), and returns the
    /// sessions the workers owned, for the process taking over.
    pub fn stop_and_export(&self) -> crate::takeover::HandedOn {
        self.shared.export.store(true, Ordering::Release);
        self.release_interfaces();
        crate::takeover::HandedOn {
            sessions: std::mem::take(&mut *self.shared.exported.lock().unwrap_or_else(|e| e.into_inner())),
            frames: std::mem::take(&mut *self.shared.exported_frames.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }
}

impl Drop for L4Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

fn open_xdp(
    name: &str,
    ifindex: u32,
    w: &Wanted,
    handover: &mut Handover,
) -> Result<(Steering, Vec<xsk::Socket>), InterfaceError> {
    if let Some((mut steering, old)) = handover.prepared.remove(name) {
        // Already behind the link, sending to the previous process's
        // sockets: adopted, with the frames they held unused, they serve
        // on here. Where that cannot be, they close, and this process's own
        // take their places once the kernel lets the queues go.
        let frames = &mut handover.frames;
        let adopted = adopt_xdp_sockets(name, old, rx_queues(name) as usize, |q| frames.remove(&(name.to_string(), q)));
        let sockets = match adopted {
            Some(sockets) => {
                tracing::info!(interface = name, "AF_XDP sockets adopted from the previous process");
                Ok(sockets)
            }
            None => open_sockets(name, ifindex, &mut steering, TAKEOVER_BIND_WAIT),
        };
        let ready = sockets.and_then(|s| {
            steering.update(w)?;
            Ok(s)
        });
        return match ready {
            Ok(sockets) => Ok((steering, sockets)),
            Err(e) => {
                handover.prepared.insert(name.to_string(), (steering, Vec::new()));
                Err(e)
            }
        };
    }
    // Not prepared: the program did not load ahead, or could not go behind
    // the predecessor's link. A link handed over is let go (the program
    // behind it goes with it, the predecessor having let go already), and
    // this process attaches its own, waiting for the queues the
    // predecessor's sockets held.
    let busy_wait = if handover.xdp.remove(name).is_some() { TAKEOVER_BIND_WAIT } else { Duration::ZERO };
    let loaded = match handover.programs.remove(name) {
        Some(l) => l,
        None => Loaded::load()?,
    };
    let mut steering = loaded.attach(name, ifindex)?;
    let sockets = open_sockets(name, ifindex, &mut steering, busy_wait)?;
    // Only now, with a socket on every queue, does traffic get steered.
    steering.update(w)?;
    Ok((steering, sockets))
}

/// What a failed swap leaves for the start: the program, if not attached,
/// and the link, which tells the start that the queues it binds were the
/// predecessor's.
fn keep_for_next_try(handover: &mut Handover, name: &str, steering: Steering, link: OwnedFd) {
    handover.xdp.insert(name.to_string(), XdpHandover { link, native: None, sockets: Vec::new() });
    if let Some(l) = steering.into_loaded() {
        handover.programs.insert(name.to_string(), l);
    }
}

/// An AF_XDP socket on every receive queue of `name`, each registered
/// with the program; a queue still another socket's is tried again for up
/// to `busy_wait`.
fn open_sockets(
    name: &str,
    ifindex: u32,
    steering: &mut Steering,
    busy_wait: Duration,
) -> Result<Vec<xsk::Socket>, InterfaceError> {
    let mut sockets = Vec::new();
    for q in 0..rx_queues(name) {
        let s = xsk::Socket::open(ifindex, q, xsk::Config { busy_wait, ..xsk::Config::default() })
            .map_err(|source| InterfaceError::Socket { queue: q, source })?;
        steering.set_socket(q, s.fd())?;
        sockets.push(s);
    }
    Ok(sockets)
}

/// A process taking over, while the previous one still serves: puts
/// `loaded` behind the previous process's link of interface `name`, with
/// its maps made for `cfg` and the previous process's AF_XDP sockets in
/// its socket map, so that those serve on, and the start adopts them
/// (`handover.prepared`).
/// On failure what is left stays in `handover` for the start: the program
/// (if not attached) and the link.
pub(crate) fn swap_in_ahead(
    name: &str,
    loaded: Loaded,
    xdp: XdpHandover,
    cfg: &L4,
    owns: bool,
    handover: &mut Handover,
) -> Result<(), InterfaceError> {
    let mut steering = loaded.unattached(name);
    let made = xdp.sockets.iter().try_for_each(|s| steering.set_socket(s.queue, s.socket.as_raw_fd()));
    let (e, link) = match made.and_then(|()| steering.update(&wanted(cfg, owns))) {
        Err(e) => (e, xdp.link),
        Ok(()) => match steering.replace(xdp.link, xdp.native) {
            Ok(()) => {
                handover.prepared.insert(name.to_string(), (steering, xdp.sockets));
                return Ok(());
            }
            Err((e, link)) => (e, link),
        },
    };
    keep_for_next_try(handover, name, steering, link);
    Err(e.into())
}
