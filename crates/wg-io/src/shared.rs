//! What an interface's threads share: its settings, the device behind
//! its lock, the peers' names and endpoints, the sockets, the counters
//! each thread keeps, and the sticky source addresses. The data-path
//! workers, the control thread and the UAPI server all work on it; it
//! starts none of them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use gatehouse_config::WgPeer;
use gatehouse_wg::device::{Device, DropReason, PeerId};
use rand_core::OsRng;

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
    /// Router mode's NICs; None: TUN mode.
    pub router: Option<gatehouse_config::WgRouter>,
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
    /// One per worker, then the UAPI thread's: written to wake them.
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
    /// Router mode's state; None in TUN mode.
    pub router: Option<crate::router::runtime::RouterShared>,
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

    /// Router mode: the view and the steering maps brought in line with
    /// the kernel and the peers, when due (at once with `now_too`).
    pub fn refresh_router(&self, now_too: bool) {
        self.with_router(|r, now| r.refresh(now, now_too));
    }

    /// Router mode: the sockets opened and the programs attached.
    pub fn attach_router(&self) -> Result<Vec<crate::router::runtime::Lane>, crate::router::runtime::OpenError> {
        self.with_router(|r, now| r.attach(now)).unwrap_or_else(|| Ok(Vec::new()))
    }

    /// Router mode, taking over: the programs swapped in behind the
    /// previous process's links (LAN, WAN), sending to its sockets.
    pub fn prepare_router_takeover(
        &self,
        lan: Option<gatehouse_plane::listeners::XdpHandover>,
        wan: Option<gatehouse_plane::listeners::XdpHandover>,
    ) {
        self.with_router(|r, now| r.prepare_takeover(now, lan, wan));
    }

    /// `f` on router mode's state with what it needs to know of the
    /// interface now; `None` in TUN mode.
    fn with_router<T>(
        &self,
        f: impl FnOnce(&crate::router::runtime::RouterShared, &crate::router::runtime::Now<'_>) -> T,
    ) -> Option<T> {
        let r = self.router.as_ref()?;
        let allowed = || self.allowed_ips();
        let (port, mtu) = self.port_mtu();
        Some(f(r, &crate::router::runtime::Now { name: &self.name, port, mtu, allowed: &allowed }))
    }

    fn port_mtu(&self) -> (u16, u32) {
        let s = self.settings();
        (s.listen_port, s.mtu)
    }

    /// Every peer's allowed IPs.
    fn allowed_ips(&self) -> Vec<(IpAddr, u8)> {
        let dev = self.device();
        let ids: Vec<PeerId> = dev.peer_ids().collect();
        ids.into_iter().filter_map(|id| dev.peer_info(id)).flat_map(|p| p.allowed_ips).collect()
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

/// Where workers put handshake messages for the control thread: datagram,
/// source, and the local address it reached.
pub type HandshakeQueue = Receiver<(Vec<u8>, SocketAddr, Option<IpAddr>)>;

/// Resolves an endpoint written in the config (an address, or a name).
pub fn resolve_endpoint(text: &str) -> Option<SocketAddr> {
    if let Ok(a) = text.parse::<SocketAddr>() {
        return Some(a);
    }
    let addrs: Vec<SocketAddr> = text.to_socket_addrs().ok()?.collect();
    // IPv4 first, as wg does.
    addrs.iter().find(|a| a.is_ipv4()).or(addrs.first()).copied()
}
