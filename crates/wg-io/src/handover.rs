//! What a WireGuard interface hands on across a binary upgrade
//! (`--takeover`) besides its sessions: the kernel objects its workers
//! read, so that what waits in them is not lost. Each worker's UDP socket
//! and, in TUN mode, each TUN queue go to the new process as they are: the
//! old process reads them until it stops, and the new one from when it
//! resumes, and packets that come in between wait in the same queues (new
//! sockets and queues of its own would take a share of the traffic while
//! the new process is still paused, and the old ones' queues would be
//! dropped with them). In router mode the XDP links and AF_XDP sockets of
//! both NICs go too ([`crate::router::handover`]).
//!
//! The descriptors travel with the listening sockets
//! (`gatehouse_plane::listeners`, under `wireguard/NAME/udp` and
//! `wireguard/NAME/tun`); each interface records duplicates of its own
//! when it starts and forgets them when it stops.

use std::collections::HashMap;
use std::fs::File;
use std::net::UdpSocket;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use gatehouse_plane::listeners::{Listeners, XdpHandover};

use crate::shared::Settings;

fn udp_key(interface: &str) -> String {
    format!("wireguard/{interface}/udp")
}

fn tun_key(interface: &str) -> String {
    format!("wireguard/{interface}/tun")
}

/// Where the interfaces record what a takeover hands on, and what the
/// previous process handed over until an interface takes it.
pub struct Handover {
    pub listeners: Arc<Listeners>,
    /// XDP state by NIC.
    xdp: Mutex<HashMap<String, XdpHandover>>,
    /// UDP sockets and TUN queues by key.
    fds: Mutex<HashMap<String, Vec<OwnedFd>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Handover {
    pub fn new(listeners: Arc<Listeners>) -> Handover {
        Handover { listeners, xdp: Mutex::new(HashMap::new()), fds: Mutex::new(HashMap::new()) }
    }

    /// Takes what the previous process handed over of the interfaces in
    /// `wanted`, before the node closes what no plane took.
    pub fn take_inherited(&self, wanted: &[Settings]) {
        let (mut xdp, mut fds) = (lock(&self.xdp), lock(&self.fds));
        for w in wanted {
            for key in [udp_key(&w.name), tun_key(&w.name)] {
                if let Some(f) = self.listeners.take_fds(&key) {
                    fds.insert(key, f);
                }
            }
            for nic in w.router.iter().flat_map(|r| [&r.lan, &r.wan]) {
                if let Some(x) = self.listeners.take_xdp(nic) {
                    xdp.insert(nic.clone(), x);
                }
            }
        }
    }

    /// Closes what no interface took: a program no process holds leaves
    /// its NIC rather than steer to sockets nobody reads.
    pub fn clear(&self) {
        lock(&self.xdp).clear();
        lock(&self.fds).clear();
    }

    /// The previous process's XDP state of NIC `nic`.
    pub fn take_xdp(&self, nic: &str) -> Option<XdpHandover> {
        lock(&self.xdp).remove(nic)
    }

    /// The previous process's UDP sockets of `interface`, by worker.
    pub fn take_udp(&self, interface: &str) -> Vec<UdpSocket> {
        lock(&self.fds).remove(&udp_key(interface)).unwrap_or_default().into_iter().map(UdpSocket::from).collect()
    }

    /// The previous process's TUN queues of `interface`, by worker.
    pub fn take_tun(&self, interface: &str) -> Vec<File> {
        lock(&self.fds).remove(&tun_key(interface)).unwrap_or_default().into_iter().map(File::from).collect()
    }

    /// Records duplicates of `interface`'s sockets and TUN queues for the
    /// next takeover (none recorded where one cannot be duplicated: the
    /// next process then opens its own).
    pub fn record(&self, interface: &str, sockets: &[Arc<UdpSocket>], tun: &[&File]) {
        let udp: std::io::Result<Vec<OwnedFd>> = sockets.iter().map(|s| s.try_clone().map(OwnedFd::from)).collect();
        let queues: std::io::Result<Vec<OwnedFd>> = tun.iter().map(|f| f.try_clone().map(OwnedFd::from)).collect();
        match (udp, queues) {
            (Ok(udp), Ok(queues)) => {
                self.listeners.record_fds(&udp_key(interface), udp);
                if !queues.is_empty() {
                    self.listeners.record_fds(&tun_key(interface), queues);
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(interface, "a takeover will open new sockets and queues: {e}");
            }
        }
    }

    /// The interface stopped: nothing of it goes to a takeover any more
    /// (this process's duplicates close, and the port and the queues with
    /// the last of them).
    pub fn forget(&self, interface: &str) {
        self.listeners.forget_fds(&udp_key(interface));
        self.listeners.forget_fds(&tun_key(interface));
    }
}
