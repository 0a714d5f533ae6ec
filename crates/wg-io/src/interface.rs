//! One WireGuard interface at work: it opens its TUN queues and UDP
//! sockets, makes its device (peers, sessions, timers), and starts one
//! data-path worker per queue ([`crate::worker`]), the control thread
//! ([`crate::control`]) and the UAPI socket ([`crate::uapi_server`]), all
//! on the state in [`crate::shared`]. A new config is applied peer by peer,
//! so sessions of peers that did not change go on.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use gatehouse_config::WgPeer;
use gatehouse_udp as udp;
use gatehouse_wg::allowed_ips::BadPrefix;
use gatehouse_wg::crypto::StaticSecret;
use gatehouse_wg::device::{Device, PeerId};
use rand_core::OsRng;

use crate::handover::Handover;
use crate::link::{setup_link, update_link};
use crate::shared::{Counters, HANDSHAKE_QUEUE, HandshakeQueue, PeerMeta, Settings, Shared, Sticky, resolve_endpoint};
use crate::sys;
use gatehouse_link::netlink;

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

/// A thread of an interface could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start a thread: {0}")]
pub struct ThreadError(std::io::Error);

/// A running interface.
pub struct Interface {
    pub shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Made but not yet serving (a takeover waits for the previous
    /// process's sessions): each worker's queues and the handshake queue
    /// the threads will take.
    paused: Option<(Vec<Queues>, HandshakeQueue)>,
    /// Where its sockets and queues are recorded for a takeover.
    handover: Arc<Handover>,
}

/// A data-path worker's queues.
enum Queues {
    Tun(std::fs::File),
    Router(Box<crate::router::runtime::Lane>),
}

fn wall_now() -> Duration {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

/// Adds a configured peer to the device.
fn add_peer(dev: &mut Device<OsRng>, meta: &mut HashMap<PeerId, PeerMeta>, p: &WgPeer) -> Result<PeerId, BadPrefix> {
    let allowed: Vec<(IpAddr, u8)> = p.allowed_ips.iter().map(|n| (n.addr(), n.prefix_len())).collect();
    let endpoint = p.endpoint.as_deref().and_then(resolve_endpoint);
    let keepalive = p.persistent_keepalive.map(|d| d.as_secs() as u16);
    let psk = p.preshared_key.as_ref().map(|k| *k.0);
    let id = dev.add_peer(p.public_key.0, psk, endpoint, keepalive, &allowed)?;
    let resolved = endpoint.map(|_| Instant::now());
    meta.insert(id, PeerMeta { name: p.name.clone(), endpoint: p.endpoint.clone(), last_resolved: resolved });
    Ok(id)
}

impl Interface {
    /// Makes the interface and starts its threads: `workers` TUN queues
    /// and sockets. `paused`: made, but nothing read or sent until
    /// [`Interface::resume`] (meanwhile the kernel queues what comes).
    /// Its sockets and queues (in router mode its XDP links and AF_XDP
    /// sockets too) are recorded in `handover` for a takeover, and a paused
    /// start takes the previous process's from there.
    pub fn start(
        settings: Settings,
        workers: usize,
        paused: bool,
        handover: &Arc<Handover>,
    ) -> Result<Interface, StartError> {
        let mut workers = workers.max(1);
        let mut queues = Vec::with_capacity(workers);
        let mut router = None;
        // Taking over: the previous process's TUN queues and sockets, where
        // it has them for this interface and port.
        let (old_tun, old_udp) = match paused {
            true => (handover.take_tun(&settings.name), handover.take_udp(&settings.name)),
            false => (Vec::new(), Vec::new()),
        };
        // Only sockets as this config would bind them: its port (any, for
        // port 0) and its firewall mark.
        let as_configured = |s: &UdpSocket| {
            s.local_addr().is_ok_and(|a| settings.listen_port == 0 || a.port() == settings.listen_port)
                && socket2::SockRef::from(s).mark().is_ok_and(|m| m == settings.fwmark)
        };
        let old_udp: Vec<UdpSocket> = old_udp.into_iter().filter(as_configured).collect();
        if !old_udp.is_empty() || !old_tun.is_empty() {
            tracing::info!(
                interface = %settings.name,
                sockets = old_udp.len(),
                tun_queues = old_tun.len(),
                "taking over the previous process's UDP sockets and TUN queues"
            );
        }
        let mut old_udp = old_udp.into_iter();
        let ifindex = match &settings.router {
            None => {
                let mut old_tun = old_tun.into_iter();
                for _ in 0..workers {
                    let file = match old_tun.next() {
                        Some(f) => f,
                        None => std::fs::File::from(
                            gatehouse_link::tun::open(&settings.name, gatehouse_link::tun::Kind::Offloaded).map_err(
                                |e| {
                                    StartError::at(
                                        "name",
                                        format!("cannot open TUN interface {:?}: {e}", settings.name),
                                    )
                                },
                            )?,
                        ),
                    };
                    queues.push(Queues::Tun(file));
                }
                netlink::ifindex(&settings.name).map_err(|e| StartError::at("name", e.to_string()))?
            }
            Some(nics) => {
                let r = crate::router::runtime::RouterShared::new(
                    nics,
                    settings.listen_port,
                    settings.mtu,
                    workers,
                    handover.listeners.clone(),
                )
                .map_err(|e| StartError::at(e.field, e.message))?;
                workers = r.queues();
                router = Some(r);
                0
            }
        };
        let mut sockets = Vec::with_capacity(workers);
        let mut v6 = true;
        let mut port = settings.listen_port;
        for _ in 0..workers {
            if let Some(s) = old_udp.next() {
                let at = s.local_addr().map_err(|e| StartError::at("listen_port", e.to_string()))?;
                (port, v6) = (at.port(), at.is_ipv6());
                sockets.push(Arc::new(s));
                continue;
            }
            let any = SocketAddr::new(IpAddr::from([0u16; 8]), port);
            let udp::Bound { socket: s, v6: is_v6 } =
                udp::bind(any, udp::Options { fwmark: settings.fwmark, v6_only: false })
                    .map_err(|e| StartError::at("listen_port", format!("cannot bind UDP port {port}: {e}")))?;
            // Port 0: the first socket's random port for all of them.
            port = s.local_addr().map(|a| a.port()).unwrap_or(port);
            v6 = is_v6;
            sockets.push(Arc::new(s));
        }
        let mut settings = settings;
        settings.listen_port = port;
        if router.is_none() {
            setup_link(ifindex, &settings).map_err(|e| StartError::at("addresses", e.to_string()))?;
        }

        let mut dev = Device::new(StaticSecret::from_bytes(*settings.secret.0), Instant::now(), wall_now(), OsRng);
        dev.set_mtu(settings.mtu as usize);
        let mut meta = HashMap::new();
        for p in &settings.peers {
            add_peer(&mut dev, &mut meta, p).map_err(|e| StartError::at("peers", e.to_string()))?;
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(HANDSHAKE_QUEUE);
        // One per worker, and the UAPI thread's last.
        let mut wake = Vec::new();
        for _ in 0..=workers {
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
            router,
        });
        // Router mode attaches to the NICs now, so that errors show here; a
        // takeover puts its programs behind the previous process's links
        // now, and adopts its sockets once it has let go of them (resume).
        if let Some(r) = shared.router.as_ref().filter(|_| paused) {
            shared.prepare_router_takeover(handover.take_xdp(&r.lan), handover.take_xdp(&r.wan));
        }
        if shared.router.is_some() && !paused {
            let lanes = shared.attach_router().map_err(|e| StartError::at(e.field, e.message))?;
            queues.extend(lanes.into_iter().map(|l| Queues::Router(Box::new(l))));
        }
        let tun: Vec<&std::fs::File> = queues
            .iter()
            .filter_map(|q| match q {
                Queues::Tun(f) => Some(f),
                Queues::Router(_) => None,
            })
            .collect();
        handover.record(&shared.name, &shared.sockets, &tun);
        let mut i = Interface { shared, threads: Vec::new(), paused: Some((queues, rx)), handover: handover.clone() };
        if !paused && let Err(e) = i.resume() {
            // Nothing of an interface that did not start goes to a takeover.
            handover.forget(&i.shared.name);
            return Err(StartError { field: None, message: e.to_string() });
        }
        Ok(i)
    }

    /// Starts the threads of an interface made paused (else nothing).
    pub fn resume(&mut self) -> Result<(), ThreadError> {
        let Some((mut queues, rx)) = self.paused.take() else { return Ok(()) };
        let shared = &self.shared;
        if shared.router.is_some() && queues.is_empty() {
            match shared.attach_router() {
                Ok(lanes) => queues.extend(lanes.into_iter().map(|l| Queues::Router(Box::new(l)))),
                Err(e) => tracing::error!(interface = %shared.name, "{}: {}", e.field, e.message),
            }
        }
        let spawn_err = ThreadError;
        tracing::info!(interface = %shared.name, aead = gatehouse_mbx::aead::engine(), "packet AEAD");
        for (i, q) in queues.into_iter().enumerate() {
            let sh = shared.clone();
            let name = format!("wg-{}-{i}", shared.name);
            let work = move || match q {
                Queues::Tun(tun) => crate::worker::run(sh, i, tun),
                Queues::Router(lane) => crate::router::io::run(sh, i, *lane),
            };
            self.threads.push(std::thread::Builder::new().name(name).spawn(work).map_err(spawn_err)?);
        }
        let sh = shared.clone();
        self.threads.push(
            std::thread::Builder::new()
                .name(format!("wg-{}-ctl", shared.name))
                .spawn(move || crate::control::run(sh, rx))
                .map_err(spawn_err)?,
        );
        match crate::uapi_server::listen(shared.clone()) {
            Ok(t) => self.threads.push(t),
            Err(e) => tracing::warn!(interface = %shared.name, "no UAPI socket (wg show will not see it): {e}"),
        }
        Ok(())
    }

    /// Stops the interface and returns its live sessions for the process
    /// taking this one's place ([`gatehouse_wg::device::Device::export_sessions`]),
    /// and in router mode the frames its sockets held unused.
    pub fn stop_and_export(self) -> (gatehouse_wg::handoff::Buffer, Vec<crate::router::handover::Frames>) {
        let shared = self.shared.clone();
        self.stop();
        let frames = shared.router.as_ref().map(|r| r.exported()).unwrap_or_default();
        (shared.device().export_sessions(Instant::now()), frames)
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
        sh.device().set_mtu(applied.mtu as usize);
        applied.listen_port = old.listen_port;
        if sh.router.is_none()
            && let Err(e) = update_link(sh.ifindex, &old, &applied)
        {
            tracing::error!(interface = %sh.name, "{e}");
        }
        *sh.settings() = applied;
        sh.refresh_router(true);
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
        if let Some(r) = &self.shared.router {
            r.release();
        }
        self.handover.forget(&self.shared.name);
        crate::uapi_server::remove(&self.shared.name);
    }
}
