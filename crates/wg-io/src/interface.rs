//! One WireGuard interface at work: its TUN queues and UDP sockets, its
//! device (peers, sessions, timers) behind a lock, one data-path worker per
//! queue, a control thread for handshakes and timers, and the UAPI socket.
//! A new config is applied peer by peer, so sessions of peers that did not
//! change go on.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use gatehouse_config::WgPeer;
use gatehouse_wg::crypto::StaticSecret;
use gatehouse_wg::device::{Device, DropReason, PeerId};
use ipnet::IpNet;
use rand_core::OsRng;
use socket2::{Domain, Protocol, Socket, Type};

use crate::netlink;
use crate::sys;

/// Handshake messages waiting for the control thread at most; past an
/// eighth of it the device asks for cookies (as wireguard-go does).
pub const HANDSHAKE_QUEUE: usize = 1024;

/// An interface's config with its keys read.
#[derive(Clone, PartialEq, Debug)]
pub struct Settings {
    pub name: String,
    pub secret: gatehouse_config::WgSecret,
    pub public: [u8; 32],
    pub listen_port: u16,
    pub addresses: Vec<(IpAddr, u8)>,
    pub mtu: u32,
    pub fwmark: u32,
    pub routes: bool,
    pub peers: Vec<WgPeer>,
}

/// Counters of one worker (or of the control thread), summed when read.
#[derive(Default)]
pub struct Counters {
    pub rx_datagrams: AtomicU64,
    pub tx_datagrams: AtomicU64,
    pub tun_rx_packets: AtomicU64,
    pub tun_tx_packets: AtomicU64,
    /// Datagrams the kernel would not take, or TUN writes that failed.
    pub tx_errors: AtomicU64,
    /// Handshake messages dropped because the control thread's queue was full.
    pub handshake_queue_full: AtomicU64,
    /// Packets from the tunnel whose headers did not match their offload
    /// description (or too long for the MTU).
    pub tun_malformed: AtomicU64,
    /// By [`DropReason::index`].
    pub drops: [AtomicU64; DROP_SLOTS],
}

pub const DROP_SLOTS: usize = DropReason::NAMES.len();

impl Counters {
    pub fn drop(&self, d: DropReason) {
        self.drops[d.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// A peer as configured: its name and the endpoint text to resolve again.
#[derive(Clone)]
pub struct PeerMeta {
    pub name: String,
    pub endpoint: Option<String>,
    pub last_resolved: Option<Instant>,
}

/// What the threads of an interface share.
pub struct Shared {
    pub name: String,
    pub device: Mutex<Device<OsRng>>,
    /// By peer id.
    pub meta: Mutex<HashMap<PeerId, PeerMeta>>,
    pub settings: Mutex<Settings>,
    pub stop: AtomicBool,
    /// One per worker: written to wake them.
    pub wake: Vec<OwnedFd>,
    /// One per worker, then the control thread's.
    pub counters: Vec<Counters>,
    /// Handshake messages for the control thread: the datagram, its
    /// source, and the local address it came to.
    pub handshakes: SyncSender<(Vec<u8>, SocketAddr, Option<IpAddr>)>,
    /// The local address each remote endpoint last reached us at.
    pub sticky: Sticky,
    pub queued: AtomicUsize,
    /// The UDP sockets, one per worker (SO_REUSEPORT on one port).
    pub sockets: Vec<Arc<UdpSocket>>,
    /// The sockets are dual-stack IPv6 ones.
    pub v6: bool,
    pub ifindex: u32,
    /// Bytes of each packet buffer: the MTU the buffers were sized for.
    pub buffer_mtu: u32,
    pub started: Instant,
}

impl Shared {
    pub fn device(&self) -> MutexGuard<'_, Device<OsRng>> {
        self.device.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn meta(&self) -> MutexGuard<'_, HashMap<PeerId, PeerMeta>> {
        self.meta.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn settings(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends datagrams the device made (handshakes, keepalives, queued
    /// packets) on `socket`, each from its peer's sticky source.
    pub fn send_all(&self, socket: &UdpSocket, out: &mut Vec<gatehouse_wg::device::Transmit>, counters: &Counters) {
        if out.is_empty() {
            return;
        }
        let datagrams: Vec<(&[u8], SocketAddr)> = out.iter().map(|t| (t.datagram.as_slice(), t.to)).collect();
        let mut gso = false;
        crate::worker::send(socket.as_raw_fd(), self.v6, &mut gso, &datagrams, counters, &self.sticky);
        drop(datagrams);
        out.clear();
    }
}

/// Where each remote endpoint last reached us (the local address of its
/// authenticated datagrams), so that replies leave from that address: a
/// host with several addresses answers from the one the peer knows.
#[derive(Default)]
pub struct Sticky(Mutex<HashMap<SocketAddr, IpAddr>>);

impl Sticky {
    fn map(&self) -> MutexGuard<'_, HashMap<SocketAddr, IpAddr>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, remote: SocketAddr) -> Option<IpAddr> {
        self.map().get(&remote).copied()
    }

    pub fn learn(&self, remote: SocketAddr, local: Option<IpAddr>) {
        let Some(local) = local else { return };
        let mut m = self.map();
        if m.get(&remote) != Some(&local) {
            // Bounded by the peers' roaming; kept small all the same.
            if m.len() >= 65_536 {
                m.clear();
            }
            m.insert(remote, local);
        }
    }

    pub fn forget(&self, remote: SocketAddr) {
        self.map().remove(&remote);
    }
}

/// Why an interface could not start.
#[derive(Debug)]
pub struct StartError {
    /// The field of `wireguard.interfaces[i]` at fault, if one is.
    pub field: Option<&'static str>,
    pub message: String,
}

impl StartError {
    fn at(field: &'static str, message: impl Into<String>) -> StartError {
        StartError { field: Some(field), message: message.into() }
    }
}

/// A running interface.
pub struct Interface {
    pub shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Made but not yet serving (a takeover waits for the previous
    /// process's sessions): the TUN queues and the handshake queue the
    /// threads will take.
    paused: Option<(Vec<std::fs::File>, HandshakeQueue)>,
}

/// Where workers put handshake messages for the control thread: datagram,
/// source, and the local address it reached.
type HandshakeQueue = Receiver<(Vec<u8>, SocketAddr, Option<IpAddr>)>;

fn udp_socket(port: u16, fwmark: u32) -> std::io::Result<(UdpSocket, bool)> {
    let make = |v6: bool| -> std::io::Result<UdpSocket> {
        let (domain, any): (Domain, IpAddr) =
            if v6 { (Domain::IPV6, IpAddr::from([0u16; 8])) } else { (Domain::IPV4, IpAddr::from([0u8; 4])) };
        let s = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
        if v6 {
            s.set_only_v6(false)?;
        }
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        // Room for bursts while a worker is busy with a batch.
        let _ = s.set_recv_buffer_size(4 << 20);
        let _ = s.set_send_buffer_size(4 << 20);
        if fwmark != 0 {
            s.set_mark(fwmark)?;
        }
        s.bind(&SocketAddr::new(any, port).into())?;
        Ok(s.into())
    };
    match make(true) {
        Ok(s) => Ok((s, true)),
        // A host without IPv6.
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => make(false).map(|s| (s, false)),
        Err(e) => Err(e),
    }
}

/// Resolves an endpoint written in the config (an address, or a name).
pub fn resolve_endpoint(text: &str) -> Option<SocketAddr> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Some(a);
    }
    let addrs: Vec<SocketAddr> = text.to_socket_addrs().ok()?.collect();
    // IPv4 first, as wg does.
    addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied()
}

fn wall_now() -> Duration {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

/// Adds a configured peer to the device.
fn add_peer(dev: &mut Device<OsRng>, meta: &mut HashMap<PeerId, PeerMeta>, p: &WgPeer) -> Result<PeerId, String> {
    let allowed: Vec<(IpAddr, u8)> = p.allowed_ips.iter().map(|n| (n.addr(), n.prefix_len())).collect();
    let endpoint = p.endpoint.as_deref().and_then(resolve_endpoint);
    let keepalive = p.persistent_keepalive.map(|d| d.as_secs() as u16);
    let psk = p.preshared_key.as_ref().map(|k| *k.0);
    let id = dev.add_peer(p.public_key.0, psk, endpoint, keepalive, &allowed).map_err(|e| format!("{e:?}"))?;
    let resolved = endpoint.map(|_| Instant::now());
    meta.insert(id, PeerMeta { name: p.name.clone(), endpoint: p.endpoint.clone(), last_resolved: resolved });
    Ok(id)
}

impl Interface {
    /// Makes the interface and starts its threads: `workers` TUN queues
    /// and sockets. `paused`: made, but nothing read or sent until
    /// [`Interface::resume`] (meanwhile the kernel queues what comes).
    pub fn start(settings: Settings, workers: usize, paused: bool) -> Result<Interface, StartError> {
        let workers = workers.max(1);
        let mut tuns = Vec::with_capacity(workers);
        for _ in 0..workers {
            let fd = sys::open_tun(&settings.name)
                .map_err(|e| StartError::at("name", format!("cannot open TUN interface {:?}: {e}", settings.name)))?;
            tuns.push(std::fs::File::from(fd));
        }
        let ifindex = netlink::ifindex(&settings.name).map_err(|e| StartError::at("name", e.to_string()))?;
        let mut sockets = Vec::with_capacity(workers);
        let mut v6 = true;
        let mut port = settings.listen_port;
        for _ in 0..workers {
            let (s, is_v6) = udp_socket(port, settings.fwmark)
                .map_err(|e| StartError::at("listen_port", format!("cannot bind UDP port {port}: {e}")))?;
            // Port 0: the first socket's random port for all of them.
            port = s.local_addr().map(|a| a.port()).unwrap_or(port);
            v6 = is_v6;
            sockets.push(Arc::new(s));
        }
        let mut settings = settings;
        settings.listen_port = port;
        setup_link(ifindex, &settings).map_err(|e| StartError::at("addresses", e))?;

        let mut dev = Device::new(StaticSecret::from_bytes(*settings.secret.0), Instant::now(), wall_now(), OsRng);
        let mut meta = HashMap::new();
        for p in &settings.peers {
            add_peer(&mut dev, &mut meta, p).map_err(|e| StartError::at("peers", e))?;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(HANDSHAKE_QUEUE);
        let mut wake = Vec::new();
        for _ in 0..workers {
            wake.push(sys::eventfd().map_err(|e| StartError { field: None, message: format!("eventfd: {e}") })?);
        }
        let buffer_mtu = settings.mtu.max(1500);
        let shared = Arc::new(Shared {
            name: settings.name.clone(),
            device: Mutex::new(dev),
            meta: Mutex::new(meta),
            settings: Mutex::new(settings),
            stop: AtomicBool::new(false),
            wake,
            counters: (0..=workers).map(|_| Counters::default()).collect(),
            handshakes: tx,
            sticky: Sticky::default(),
            queued: AtomicUsize::new(0),
            sockets,
            v6,
            ifindex,
            buffer_mtu,
            started: Instant::now(),
        });
        let mut i = Interface { shared, threads: Vec::new(), paused: Some((tuns, rx)) };
        if !paused {
            i.resume().map_err(|message| StartError { field: None, message })?;
        }
        Ok(i)
    }

    /// Starts the threads of an interface made paused (else nothing).
    pub fn resume(&mut self) -> Result<(), String> {
        let Some((tuns, rx)) = self.paused.take() else { return Ok(()) };
        let shared = &self.shared;
        let spawn_err = |e: std::io::Error| format!("cannot start a thread: {e}");
        for (i, tun) in tuns.into_iter().enumerate() {
            let sh = shared.clone();
            let name = format!("wg-{}-{i}", shared.name);
            self.threads.push(
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || crate::worker::run(sh, i, tun))
                    .map_err(spawn_err)?,
            );
        }
        let sh = shared.clone();
        self.threads.push(
            std::thread::Builder::new()
                .name(format!("wg-{}-ctl", shared.name))
                .spawn(move || control(sh, rx))
                .map_err(spawn_err)?,
        );
        match crate::uapi_server::listen(shared.clone()) {
            Ok(t) => self.threads.push(t),
            Err(e) => tracing::warn!(interface = %shared.name, "no UAPI socket (wg show will not see it): {e}"),
        }
        Ok(())
    }

    /// Stops the interface and returns its live sessions for the process
    /// taking this one's place ([`gatehouse_wg::device::Device::export_sessions`]).
    pub fn stop_and_export(self) -> gatehouse_wg::handoff::Buffer {
        let shared = self.shared.clone();
        self.stop();
        shared.device().export_sessions(Instant::now())
    }

    /// Applies a changed config with the same key and port: peers added,
    /// removed and updated, addresses, MTU and routes brought in line.
    /// Peers whose keys did not change keep their sessions.
    pub fn update(&self, new: Settings) {
        let sh = &self.shared;
        let old = sh.settings().clone();
        let mut dev = sh.device();
        let mut meta = sh.meta();
        // Every peer the device has that the config does not name goes
        // (including peers added with `wg set`).
        let wanted: HashMap<[u8; 32], &WgPeer> = new.peers.iter().map(|p| (p.public_key.0, p)).collect();
        let ids: Vec<PeerId> = dev.peer_ids().collect();
        for id in ids {
            let Some(info) = dev.peer_info(id) else { continue };
            match wanted.get(&info.public) {
                None => {
                    dev.remove_peer(id);
                    meta.remove(&id);
                }
                Some(p) => {
                    let allowed: Vec<(IpAddr, u8)> = p.allowed_ips.iter().map(|n| (n.addr(), n.prefix_len())).collect();
                    let _ = dev.set_allowed_ips(id, true, &allowed);
                    dev.set_psk(id, p.preshared_key.as_ref().map(|k| *k.0));
                    dev.set_persistent_keepalive(id, p.persistent_keepalive.map(|d| d.as_secs() as u16));
                    let was = old.peers.iter().find(|o| o.public_key == p.public_key).and_then(|o| o.endpoint.clone());
                    if was != p.endpoint
                        && let Some(e) = p.endpoint.as_deref().and_then(resolve_endpoint)
                    {
                        dev.set_endpoint(id, e);
                    }
                    meta.insert(
                        id,
                        PeerMeta {
                            name: p.name.clone(),
                            endpoint: p.endpoint.clone(),
                            last_resolved: Some(Instant::now()),
                        },
                    );
                }
            }
        }
        for p in &new.peers {
            if dev.peer_by_key(&p.public_key.0).is_none()
                && let Err(e) = add_peer(&mut dev, &mut meta, p)
            {
                tracing::error!(interface = %sh.name, peer = %p.name, "peer not added: {e}");
            }
        }
        drop((dev, meta));
        if new.mtu > sh.buffer_mtu {
            tracing::warn!(interface = %sh.name, mtu = new.mtu, "an MTU above {} takes effect at the next start", sh.buffer_mtu);
        }
        let mut applied = new.clone();
        applied.mtu = new.mtu.min(sh.buffer_mtu);
        applied.listen_port = old.listen_port;
        if let Err(e) = update_link(sh.ifindex, &old, &applied) {
            tracing::error!(interface = %sh.name, "{e}");
        }
        *sh.settings() = applied;
    }

    /// Stops every thread; the TUN interface goes with its last queue.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for w in &self.shared.wake {
            let _ = nix::unistd::write(w, &1u64.to_ne_bytes());
        }
        // Wakes the control thread at once rather than at its next tick: a
        // takeover waits for this stop before the new process may serve.
        let _ = self.shared.handshakes.try_send((Vec::new(), SocketAddr::from(([0, 0, 0, 0], 0)), None));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        crate::uapi_server::remove(&self.shared.name);
    }
}

/// Every peer's allowed prefixes, each once, in order (the config holds
/// them as network addresses).
fn allowed_prefixes(s: &Settings) -> Vec<IpNet> {
    let mut r: Vec<IpNet> = s.peers.iter().flat_map(|p| p.allowed_ips.iter().copied()).collect();
    r.sort();
    r.dedup();
    r
}

fn routes_of(s: &Settings) -> Vec<(IpAddr, u8)> {
    if !s.routes {
        return Vec::new();
    }
    allowed_prefixes(s).iter().map(|n| (n.addr(), n.prefix_len())).collect()
}

/// The peers' prefixes outside every network of the interface's own
/// addresses: networks behind the peers (sites), which hosts other than
/// this one reach through it only if it forwards IP packets. Default
/// routes are left out: a host sending everything to a peer is its client.
pub fn networks_behind_peers(s: &Settings) -> Vec<IpNet> {
    let own: Vec<IpNet> = s.addresses.iter().filter_map(|&(a, len)| IpNet::new(a, len).ok()).collect();
    allowed_prefixes(s).into_iter().filter(|n| n.prefix_len() > 0 && !inside_any(&own, n)).collect()
}

/// Whether `n` lies inside one of `nets` (of its own family).
fn inside_any(nets: &[IpNet], n: &IpNet) -> bool {
    nets.iter().any(|o| o.contains(n))
}

/// The link up with its MTU, addresses and routes.
fn setup_link(index: u32, s: &Settings) -> Result<(), String> {
    netlink::link_up(index, s.mtu).map_err(|e| format!("cannot bring {} up with MTU {}: {e}", s.name, s.mtu))?;
    for (a, p) in &s.addresses {
        netlink::add_address(index, *a, *p).map_err(|e| format!("cannot add {a}/{p} to {}: {e}", s.name))?;
    }
    for (net, len) in routes_of(s) {
        netlink::add_route(index, net, len).map_err(|e| format!("cannot route {net}/{len} into {}: {e}", s.name))?;
    }
    Ok(())
}

fn update_link(index: u32, old: &Settings, new: &Settings) -> Result<(), String> {
    if old.mtu != new.mtu {
        netlink::link_up(index, new.mtu).map_err(|e| format!("MTU {}: {e}", new.mtu))?;
    }
    for (a, p) in old.addresses.iter().filter(|a| !new.addresses.contains(a)) {
        netlink::del_address(index, *a, *p).map_err(|e| format!("cannot remove {a}/{p}: {e}"))?;
    }
    for (a, p) in new.addresses.iter().filter(|a| !old.addresses.contains(a)) {
        netlink::add_address(index, *a, *p).map_err(|e| format!("cannot add {a}/{p}: {e}"))?;
    }
    let (was, now) = (routes_of(old), routes_of(new));
    for (net, len) in was.iter().filter(|r| !now.contains(r)) {
        netlink::del_route(index, *net, *len).map_err(|e| format!("cannot remove the route to {net}/{len}: {e}"))?;
    }
    for (net, len) in now.iter().filter(|r| !was.contains(r)) {
        netlink::add_route(index, *net, *len).map_err(|e| format!("cannot route {net}/{len}: {e}"))?;
    }
    Ok(())
}

/// How often the control thread runs the protocol's timers.
const TICK: Duration = Duration::from_millis(100);
/// A named endpoint is resolved again this often while the peer has not
/// completed a handshake for [`RESOLVE_AFTER`].
const RESOLVE_EVERY: Duration = Duration::from_secs(30);
const RESOLVE_AFTER: Duration = Duration::from_secs(135);

/// The control thread: handshake messages from the workers, the timers,
/// endpoint names resolved again.
fn control(sh: Arc<Shared>, rx: HandshakeQueue) {
    let counters = &sh.counters[sh.counters.len() - 1];
    let Some(socket) = sh.sockets.first().cloned() else { return };
    let mut out = Vec::new();
    let mut last_tick = Instant::now();
    while !sh.stop.load(Ordering::Relaxed) {
        let wait = TICK.saturating_sub(last_tick.elapsed());
        match rx.recv_timeout(wait) {
            Ok(_) if sh.stop.load(Ordering::Relaxed) => return,
            Ok((datagram, src, local)) => {
                let backlog = sh.queued.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
                let mut dev = sh.device();
                dev.set_under_load(backlog >= HANDSHAKE_QUEUE / 8);
                if let gatehouse_wg::device::Inbound::Done(gatehouse_wg::device::Received::Dropped(d)) =
                    dev.plan_open(&datagram, src, Instant::now(), &mut out)
                {
                    counters.drop(d);
                }
                drop(dev);
                // A handshake that went through (a response to send, or
                // data after a response) proves the source: later replies
                // leave from the address it reached. A cookie reply proves
                // nothing.
                if out.iter().any(|t| t.to == src && matches!(t.datagram.first(), Some(2 | 4))) {
                    sh.sticky.learn(src, local);
                }
                sh.send_all(&socket, &mut out, counters);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            let dropped = sh.device().tick(last_tick, &mut out);
            for (_, d) in dropped {
                counters.drop(d);
            }
            sh.send_all(&socket, &mut out, counters);
            resolve_again(&sh, last_tick);
        }
    }
}

/// Named endpoints of peers not heard from lately, resolved again.
fn resolve_again(sh: &Shared, now: Instant) {
    let due: Vec<(PeerId, String)> = sh
        .meta()
        .iter_mut()
        .filter(|(_, m)| m.endpoint.as_deref().is_some_and(|e| e.parse::<SocketAddr>().is_err()))
        .filter(|(_, m)| m.last_resolved.is_none_or(|t| now.saturating_duration_since(t) >= RESOLVE_EVERY))
        .map(|(id, m)| {
            m.last_resolved = Some(now);
            (*id, m.endpoint.clone().unwrap_or_default())
        })
        .collect();
    for (id, name) in due {
        let quiet = sh.device().last_handshake(id).is_none_or(|t| now.saturating_duration_since(t) >= RESOLVE_AFTER);
        if quiet && let Some(addr) = resolve_endpoint(&name) {
            sh.device().set_endpoint(id, addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_config::{WgPeer, WgPublicKey, WgSecret};

    fn peer(n: u8, allowed: &[&str]) -> WgPeer {
        WgPeer {
            name: format!("p{n}"),
            public_key: WgPublicKey([n; 32]),
            preshared_key: None,
            endpoint: None,
            allowed_ips: allowed.iter().map(|a| a.parse().expect("a prefix")).collect(),
            persistent_keepalive: None,
        }
    }

    #[test]
    fn networks_behind_peers_are_those_outside_the_interface_s_own() {
        let s = Settings {
            name: "wg0".into(),
            secret: WgSecret(zeroize::Zeroizing::new([1; 32])),
            public: [2; 32],
            listen_port: 51820,
            addresses: vec![("10.9.0.1".parse().expect("ip"), 24), ("fd09::1".parse().expect("ip"), 64)],
            mtu: 1420,
            fwmark: 0,
            routes: true,
            peers: vec![
                peer(1, &["10.9.0.2/32", "fd09::2/128", "192.168.2.0/24", "10.9.0.0/16"]),
                peer(2, &["10.9.0.3/32", "2001:db8:5::/48", "192.168.2.0/24"]),
                peer(3, &["0.0.0.0/0", "::/0"]),
            ],
        };
        let nets: Vec<String> = networks_behind_peers(&s).iter().map(IpNet::to_string).collect();
        // 10.9.0.0/16 is wider than the interface's /24: a site too.
        assert_eq!(nets, ["10.9.0.0/16", "192.168.2.0/24", "2001:db8:5::/48"]);
        let none = Settings { peers: vec![peer(1, &["10.9.0.2/32", "fd09::2/128"])], ..s.clone() };
        assert!(networks_behind_peers(&none).is_empty());
        let net = |t: &str| t.parse::<IpNet>().expect("a prefix");
        assert!(inside_any(&[net("1.2.3.4/0")], &net("0.0.0.0/0")));
        assert!(!inside_any(&[net("fd09::/0")], &net("10.0.0.0/8")));
    }
}
