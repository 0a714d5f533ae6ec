//! Listening sockets, for every plane that accepts connections: one
//! SO_REUSEPORT socket per worker and address, taken from the previous
//! process on a takeover when it had one, and recorded (a duplicate of
//! each) for the next takeover. The XDP links and AF_XDP sockets of the
//! interfaces the L4 plane and WireGuard's router mode steer travel the
//! same way, by interface (an interface runs one program): the new
//! process swaps its program in behind each link and adopts the sockets.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, MutexGuard};

use gatehouse_link::xsk;
use socket2::{Domain, Socket, Type};

/// A listening socket's identity: (listener name, address, worker).
pub type SocketKey = (String, SocketAddr, usize);

/// A QUIC listener's part in a takeover. Its connections cannot move to
/// the new process, so they stay in the old one until they finish: the new
/// process reads the UDP sockets from then on and forwards to the old one
/// the datagrams of connections it does not know, over a Unix datagram
/// socket made for the takeover.
pub trait QuicHandover: Send + Sync {
    /// A datagram the new process forwarded (its own encoding, from
    /// `gatehouse-l7`).
    fn forwarded(&self, message: &[u8]);
    /// The new process reads the UDP sockets now: this one stops reading
    /// them (it still sends on them, from the same address and port).
    fn handed_over(&self);
}

/// Listening sockets received from the previous process.
#[derive(Default)]
pub struct Inherited {
    sockets: HashMap<SocketKey, TcpListener>,
    admin: Option<(SocketAddr, TcpListener)>,
    udp: HashMap<SocketKey, UdpSocket>,
    /// Per QUIC listener: where to forward its predecessor's datagrams.
    forward: HashMap<(String, SocketAddr), UnixDatagram>,
    /// The XDP programs' links and sockets, by interface.
    xdp: HashMap<String, XdpHandover>,
    /// Other descriptors a plane hands on as they are, by its key.
    fds: HashMap<String, Vec<OwnedFd>>,
}

/// What a takeover hands on of an interface a plane steers with XDP:
/// the link its program is attached through, and the AF_XDP socket of
/// each receive queue with its UMEM (the successor's program sends to them
/// while the old process still serves, and the successor adopts them once
/// it stops).
pub struct XdpHandover {
    pub link: OwnedFd,
    /// Whether the link runs its program in the driver (native XDP);
    /// `None` where the process before did not say.
    pub native: Option<bool>,
    pub sockets: Vec<XdpSocket>,
}

/// One receive queue's AF_XDP socket, its UMEM's memory and their sizes.
pub struct XdpSocket {
    pub queue: u32,
    pub socket: OwnedFd,
    pub umem: OwnedFd,
    pub frames: u32,
    pub ring: u32,
}

impl XdpHandover {
    /// Duplicates of `link` and of `sockets`, the socket of each receive
    /// queue in order, for the next takeover.
    pub fn of(link: BorrowedFd<'_>, native: bool, sockets: &[&xsk::Socket]) -> std::io::Result<XdpHandover> {
        let sockets = sockets
            .iter()
            .enumerate()
            .map(|(q, s)| {
                let h = s.hand()?;
                Ok(XdpSocket { queue: q as u32, socket: h.socket, umem: h.umem, frames: h.frames, ring: h.ring })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(XdpHandover { link: link.try_clone_to_owned()?, native: Some(native), sockets })
    }

    fn try_clone(&self) -> std::io::Result<XdpHandover> {
        let sockets = self
            .sockets
            .iter()
            .map(|s| {
                Ok(XdpSocket {
                    queue: s.queue,
                    socket: s.socket.try_clone()?,
                    umem: s.umem.try_clone()?,
                    frames: s.frames,
                    ring: s.ring,
                })
            })
            .collect::<std::io::Result<_>>()?;
        Ok(XdpHandover { link: self.link.try_clone()?, native: self.native, sockets })
    }
}

impl XdpSocket {
    /// The socket as `xsk::Socket::adopt` takes it.
    pub fn into_handed(self) -> xsk::Handed {
        xsk::Handed { socket: self.socket, umem: self.umem, frames: self.frames, ring: self.ring }
    }
}

/// How long a process taking over waits for each receive queue its
/// predecessor's AF_XDP socket held, where it binds its own instead of
/// adopting that socket: the kernel lets a queue go some milliseconds after
/// the socket closes (10–25 ms on veth).
pub const TAKEOVER_BIND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The previous process's AF_XDP sockets of `interface`, adopted: one for
/// each of its `queues` receive queues, with the frames `free` gives for
/// that queue (those it held unused). `None`, and those adopted closed,
/// unless every queue's can be.
pub fn adopt_xdp_sockets(
    interface: &str,
    mut sockets: Vec<XdpSocket>,
    queues: usize,
    mut free: impl FnMut(u32) -> Option<Vec<u64>>,
) -> Option<Vec<xsk::Socket>> {
    sockets.sort_by_key(|s| s.queue);
    if sockets.len() != queues || sockets.iter().enumerate().any(|(q, s)| s.queue as usize != q) {
        return None;
    }
    sockets
        .into_iter()
        .map(|s| {
            let queue = s.queue;
            let frames = free(queue)?;
            xsk::Socket::adopt(s.into_handed(), frames)
                .map_err(|e| tracing::warn!(interface, queue, "the previous process's AF_XDP socket: {e}"))
                .ok()
        })
        .collect()
}

impl Inherited {
    /// A socket received for worker `worker` of listener `name` on `addr`.
    pub fn insert(&mut self, name: String, addr: SocketAddr, worker: usize, socket: TcpListener) {
        self.sockets.insert((name, addr, worker), socket);
    }

    /// The admin listener's socket, received.
    pub fn set_admin(&mut self, addr: SocketAddr, socket: TcpListener) {
        self.admin = Some((addr, socket));
    }

    /// The socket worker `worker` used for listener `name` on `addr`, if the
    /// previous process had one.
    pub fn take(&mut self, name: &str, addr: SocketAddr, worker: usize) -> Option<TcpListener> {
        self.sockets.remove(&(name.to_string(), addr, worker))
    }

    pub fn take_admin(&mut self, addr: SocketAddr) -> Option<TcpListener> {
        match self.admin.take() {
            Some((a, l)) if a == addr => Some(l),
            other => {
                self.admin = other;
                None
            }
        }
    }

    /// Worker `worker`'s UDP socket for QUIC listener `name` on `addr`.
    pub fn insert_udp(&mut self, name: String, addr: SocketAddr, worker: usize, socket: UdpSocket) {
        self.udp.insert((name, addr, worker), socket);
    }

    /// The socket on which to forward the previous process's QUIC
    /// datagrams for listener `name` on `addr`.
    pub fn insert_forward(&mut self, name: String, addr: SocketAddr, socket: UnixDatagram) {
        self.forward.insert((name, addr), socket);
    }

    pub fn take_udp(&mut self, name: &str, addr: SocketAddr, worker: usize) -> Option<UdpSocket> {
        self.udp.remove(&(name.to_string(), addr, worker))
    }

    pub fn take_forward(&mut self, name: &str, addr: SocketAddr) -> Option<UnixDatagram> {
        self.forward.remove(&(name.to_string(), addr))
    }

    /// The XDP link through which the previous process attached its
    /// program to `interface`, and its sockets.
    pub fn insert_xdp(&mut self, interface: String, xdp: XdpHandover) {
        self.xdp.insert(interface, xdp);
    }

    /// The XDP state handed over of `interface`, taken once.
    pub fn take_xdp(&mut self, interface: &str) -> Option<XdpHandover> {
        self.xdp.remove(interface)
    }

    /// A plane's descriptors under `key` (see [`Registry::add_fds`]).
    pub fn insert_fds(&mut self, key: String, fds: Vec<OwnedFd>) {
        self.fds.insert(key, fds);
    }

    /// The descriptors handed over under `key`, taken once.
    pub fn take_fds(&mut self, key: &str) -> Option<Vec<OwnedFd>> {
        self.fds.remove(key)
    }

    /// Sockets the new config does not use (closed when dropped).
    pub fn leftover(&self) -> usize {
        self.sockets.len() + usize::from(self.admin.is_some()) + self.udp.len() + self.forward.len()
    }
}

/// The old process's side: every listening socket this process holds (a
/// duplicate of each worker's), ready to hand over.
#[derive(Default)]
pub struct Registry {
    sockets: Vec<(SocketKey, TcpListener)>,
    quic: Vec<QuicDuplicates>,
    /// The XDP links and sockets in service, by interface.
    xdp: Vec<(String, XdpHandover)>,
    /// Other descriptors planes hand on as they are, by key.
    fds: Vec<(String, Vec<OwnedFd>)>,
}

/// What a takeover hands on of one QUIC listener.
pub struct QuicDuplicates {
    pub name: String,
    pub addr: SocketAddr,
    /// Each worker's UDP socket, by worker.
    pub sockets: Vec<(usize, UdpSocket)>,
    pub handover: Arc<dyn QuicHandover>,
}

impl Registry {
    pub fn add(&mut self, name: &str, addr: SocketAddr, worker: usize, socket: &TcpListener) -> std::io::Result<()> {
        self.sockets.push(((name.to_string(), addr, worker), socket.try_clone()?));
        Ok(())
    }

    /// Closes this process's duplicates (draining: the listening sockets must
    /// close once the workers drop theirs, or handed over already).
    pub fn clear(&mut self) {
        self.sockets.clear();
        self.quic.clear();
        self.xdp.clear();
        self.fds.clear();
    }

    pub fn remove(&mut self, name: &str, addr: SocketAddr) {
        self.sockets.retain(|((n, a, _), _)| !(n == name && *a == addr));
    }

    /// A QUIC listener's UDP sockets (one per worker) and its handover.
    pub fn add_quic(
        &mut self,
        name: &str,
        addr: SocketAddr,
        sockets: &[&UdpSocket],
        handover: Arc<dyn QuicHandover>,
    ) -> std::io::Result<()> {
        let sockets =
            sockets.iter().enumerate().map(|(w, s)| Ok((w, s.try_clone()?))).collect::<std::io::Result<_>>()?;
        self.quic.push(QuicDuplicates { name: name.to_string(), addr, sockets, handover });
        Ok(())
    }

    pub fn remove_quic(&mut self, name: &str, addr: SocketAddr) {
        self.quic.retain(|q| !(q.name == name && q.addr == addr));
    }

    /// A duplicate of every QUIC listener's sockets, with its handover.
    pub fn quic_duplicates(&self) -> std::io::Result<Vec<QuicDuplicates>> {
        self.quic
            .iter()
            .map(|q| {
                let sockets =
                    q.sockets.iter().map(|(w, s)| Ok((*w, s.try_clone()?))).collect::<std::io::Result<_>>()?;
                Ok(QuicDuplicates { name: q.name.clone(), addr: q.addr, sockets, handover: q.handover.clone() })
            })
            .collect()
    }

    /// The XDP state of `interface`, in place of any before.
    pub fn add_xdp(&mut self, interface: &str, xdp: XdpHandover) {
        self.xdp.retain(|(i, _)| i != interface);
        self.xdp.push((interface.to_string(), xdp));
    }

    /// A duplicate of every interface's XDP state.
    pub fn xdp_duplicates(&self) -> std::io::Result<Vec<(String, XdpHandover)>> {
        self.xdp.iter().map(|(i, x)| Ok((i.clone(), x.try_clone()?))).collect()
    }

    /// Descriptors a plane hands on as they are under `key` (in place of
    /// any before): the same kernel objects go to the process taking over,
    /// so what waits in them is not lost (a WireGuard interface's UDP
    /// sockets and TUN queues, by worker).
    pub fn add_fds(&mut self, key: &str, fds: Vec<OwnedFd>) {
        self.fds.retain(|(k, _)| k != key);
        self.fds.push((key.to_string(), fds));
    }

    /// A duplicate of every plane's descriptors, by key.
    pub fn fds_duplicates(&self) -> std::io::Result<Vec<(String, Vec<OwnedFd>)>> {
        self.fds
            .iter()
            .map(|(k, fds)| Ok((k.clone(), fds.iter().map(OwnedFd::try_clone).collect::<std::io::Result<_>>()?)))
            .collect()
    }

    /// A duplicate of every socket, with its (listener, address, worker).
    pub fn duplicates(&self) -> std::io::Result<Vec<(SocketKey, TcpListener)>> {
        self.sockets.iter().map(|(k, s)| Ok((k.clone(), s.try_clone()?))).collect()
    }
}

/// The process's listening sockets.
#[derive(Default)]
pub struct Listeners {
    /// What the previous process handed over and nothing has used yet.
    inherited: Mutex<Option<Inherited>>,
    /// Every socket in service, for the next takeover.
    registry: Mutex<Registry>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Listeners {
    /// With what a previous process handed over, if it did.
    pub fn new(inherited: Option<Inherited>) -> Self {
        Listeners { inherited: Mutex::new(inherited), registry: Mutex::new(Registry::default()) }
    }

    /// Worker `worker`'s socket for listener `name` on `addr`: the one the
    /// previous process used, else a new one. Not yet recorded for handover
    /// (see [`Listeners::record`]).
    pub fn bind(&self, name: &str, addr: SocketAddr, worker: usize) -> std::io::Result<TcpListener> {
        if let Some(s) = lock(&self.inherited).as_mut().and_then(|i| i.take(name, addr, worker)) {
            return Ok(s);
        }
        bind_reuseport(addr)
    }

    /// Records a socket now in service, so a takeover hands it on.
    pub fn record(&self, name: &str, addr: SocketAddr, worker: usize, socket: &TcpListener) -> std::io::Result<()> {
        lock(&self.registry).add(name, addr, worker, socket)
    }

    /// Forgets the sockets of a listener that closed.
    pub fn forget(&self, name: &str, addr: SocketAddr) {
        lock(&self.registry).remove(name, addr);
    }

    /// Worker `worker`'s UDP socket for QUIC listener `name` on `addr`, if
    /// the previous process handed one over (else the caller binds one).
    pub fn inherited_udp(&self, name: &str, addr: SocketAddr, worker: usize) -> Option<UdpSocket> {
        lock(&self.inherited).as_mut().and_then(|i| i.take_udp(name, addr, worker))
    }

    /// Where to forward the previous process's datagrams of QUIC listener
    /// `name` on `addr`, if it handed such a socket over.
    pub fn inherited_forward(&self, name: &str, addr: SocketAddr) -> Option<UnixDatagram> {
        lock(&self.inherited).as_mut().and_then(|i| i.take_forward(name, addr))
    }

    /// Records a QUIC listener's sockets now in service, so a takeover
    /// hands them on.
    pub fn record_quic(
        &self,
        name: &str,
        addr: SocketAddr,
        sockets: &[&UdpSocket],
        handover: Arc<dyn QuicHandover>,
    ) -> std::io::Result<()> {
        lock(&self.registry).add_quic(name, addr, sockets, handover)
    }

    /// Forgets the sockets of a QUIC listener that closed.
    pub fn forget_quic(&self, name: &str, addr: SocketAddr) {
        lock(&self.registry).remove_quic(name, addr);
    }

    /// Records the XDP state of `interface`, so a takeover hands it on.
    /// The registry holds these descriptors: they keep the program on the
    /// interface and the sockets on their queues until forgotten.
    pub fn record_xdp(&self, interface: &str, xdp: XdpHandover) {
        lock(&self.registry).add_xdp(interface, xdp);
    }

    /// Forgets the XDP state of `interface` (its plane stopped steering
    /// it: it goes back to the kernel, or to the process taking over).
    pub fn forget_xdp(&self, interface: &str) {
        lock(&self.registry).xdp.retain(|(i, _)| i != interface);
    }

    /// The XDP state the previous process handed over of `interface`,
    /// taken once, by the plane that steers it now. A plane takes what it
    /// wants before the node closes what is left; what closes detaches a
    /// program no process holds any more.
    pub fn take_xdp(&self, interface: &str) -> Option<XdpHandover> {
        lock(&self.inherited).as_mut().and_then(|i| i.take_xdp(interface))
    }

    /// Records descriptors a plane hands on as they are (see
    /// [`Registry::add_fds`]); they stay open until forgotten.
    pub fn record_fds(&self, key: &str, fds: Vec<OwnedFd>) {
        lock(&self.registry).add_fds(key, fds);
    }

    /// Forgets the descriptors recorded under `key` (closing this
    /// process's duplicates).
    pub fn forget_fds(&self, key: &str) {
        lock(&self.registry).fds.retain(|(k, _)| k != key);
    }

    /// The descriptors the previous process handed over under `key`,
    /// taken once, before the node closes what no plane took.
    pub fn take_fds(&self, key: &str) -> Option<Vec<OwnedFd>> {
        lock(&self.inherited).as_mut().and_then(|i| i.take_fds(key))
    }

    /// Closes every recorded duplicate (the drain).
    pub fn clear(&self) {
        lock(&self.registry).clear();
    }

    pub fn take_admin(&self, addr: SocketAddr) -> Option<TcpListener> {
        lock(&self.inherited).as_mut().and_then(|i| i.take_admin(addr))
    }

    /// Closes what was handed over but not used; returns how many.
    pub fn close_inherited(&self) -> usize {
        lock(&self.inherited).take().map_or(0, |i| i.leftover())
    }

    /// The sockets in service, for a takeover.
    pub fn registry(&self) -> &Mutex<Registry> {
        &self.registry
    }
}

/// Binds a listening socket with SO_REUSEPORT, so every worker can bind its
/// own on the same address.
pub fn bind_reuseport(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// Binds a listening socket without SO_REUSEPORT (the admin listener: one
/// process at a time; a takeover passes the socket itself).
pub fn bind_exclusive(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket(queue: u32) -> XdpSocket {
        let (a, b) = UnixDatagram::pair().expect("pair");
        XdpSocket { queue, socket: a.into(), umem: b.into(), frames: 4096, ring: 2048 }
    }

    #[test]
    fn sockets_are_adopted_only_one_for_each_queue() {
        let mut asked = Vec::new();
        // One socket short, or two for one queue and none for the other:
        // nothing is adopted, and no queue's frames are taken.
        for sockets in [vec![socket(0)], vec![socket(1), socket(1)]] {
            let got = adopt_xdp_sockets("eth0", sockets, 2, |q| {
                asked.push(q);
                Some(Vec::new())
            });
            assert!(got.is_none());
        }
        assert!(asked.is_empty(), "{asked:?}");
        // In any order, but a queue without its frames: none either.
        let got = adopt_xdp_sockets("eth0", vec![socket(1), socket(0)], 2, |q| {
            asked.push(q);
            None
        });
        assert!(got.is_none());
        assert_eq!(asked, vec![0], "queues in order, and none after the first missing");
    }
}
