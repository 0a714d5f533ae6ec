//! A worker's UDP socket for one HTTP/3 listener, as its connections
//! share it: what comes in for a connection, and how packets go out (GSO
//! runs, packet info for the source address), and the connection-ID
//! table of the worker's endpoint.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use smallvec::SmallVec;
use tokio::io::Interest;

use super::cid::Keys;
use super::inbox::Sender;

/// Largest UDP payload sent: what a 1,500-byte Ethernet MTU carries over
/// IPv6 (1500 - 40 - 8), quic-go's ceiling too. Path MTU discovery starts
/// at QUIC's 1,200 and probes up to it, so a narrower path (a tunnel, a
/// mobile network) gets what fits.
pub const MAX_DATAGRAM: usize = 1452;

/// A datagram for a connection.
pub struct Datagram {
    pub data: Vec<u8>,
    pub from: SocketAddr,
    pub to: SocketAddr,
}

/// A worker's socket for one listener, shared by its connections.
pub struct Io {
    pub socket: tokio::net::UdpSocket,
    pub v6: bool,
    pub local: SocketAddr,
}

impl Io {
    /// Sends packets `(offset, len, to, from)` made in `buf`: runs of equal
    /// size to one address as one GSO send each. What the socket does not
    /// take now goes to `unsent`.
    pub fn send_packets(
        &self,
        buf: &[u8],
        packets: &[(usize, usize, SocketAddr, SocketAddr)],
        unsent: &mut Vec<(Vec<u8>, SocketAddr, SocketAddr)>,
    ) {
        // Runs for GSO: one destination and source, every packet but the
        // last of the run as long as the first.
        let mut runs: SmallVec<[(usize, usize); gatehouse_udp::GSO_SEGMENTS]> = SmallVec::new();
        let mut i = 0;
        while i < packets.len() {
            let (_, size, to, from) = packets[i];
            let mut j = i + 1;
            while j < packets.len()
                && j - i < gatehouse_udp::GSO_SEGMENTS
                && packets[j].2 == to
                && packets[j].3 == from
                && packets[j - 1].1 == size
            {
                j += 1;
            }
            runs.push((i, j));
            i = j;
        }
        let parts: SmallVec<[&[u8]; gatehouse_udp::GSO_SEGMENTS]> =
            packets.iter().map(|&(at, n, _, _)| &buf[at..at + n]).collect();
        let mut done = 0;
        while done < runs.len() {
            let msgs: SmallVec<[gatehouse_udp::Outgoing<'_>; 8]> = runs[done..]
                .iter()
                .take(gatehouse_udp::BATCH)
                .map(|&(a, b)| gatehouse_udp::Outgoing {
                    parts: &parts[a..b],
                    to: packets[a].2,
                    from: self.source(packets[a].3),
                    ecn: 0,
                })
                .collect();
            let fd = self.socket.as_raw_fd();
            match self.socket.try_io(Interest::WRITABLE, || gatehouse_udp::send_batch(fd, self.v6, &msgs)) {
                Ok(n) if n > 0 => done += n,
                Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                    // Unreachable and the like: these packets are lost, as
                    // on the wire; QUIC sends them again.
                    done += 1;
                }
                _ => break,
            }
        }
        for &(a, b) in &runs[done..] {
            for &(at, n, to, from) in &packets[a..b] {
                unsent.push((buf[at..at + n].to_vec(), to, from));
            }
        }
    }

    /// Sends packets the socket refused before, once it has room.
    pub fn send_owned(&self, cx: &mut Context<'_>, unsent: &mut Vec<(Vec<u8>, SocketAddr, SocketAddr)>) -> Poll<()> {
        while !unsent.is_empty() {
            if self.socket.poll_send_ready(cx).is_pending() {
                return Poll::Pending;
            }
            let (data, to, from) = &unsent[0];
            let msg = [gatehouse_udp::Outgoing { parts: &[&data[..]], to: *to, from: self.source(*from), ecn: 0 }];
            let fd = self.socket.as_raw_fd();
            match self.socket.try_io(Interest::WRITABLE, || gatehouse_udp::send_batch(fd, self.v6, &msg)) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                _ => {
                    unsent.remove(0);
                }
            }
        }
        Poll::Ready(())
    }

    /// The source address to send from: the one the client sent to, when
    /// the socket is bound to a wildcard.
    fn source(&self, from: SocketAddr) -> Option<IpAddr> {
        self.local.ip().is_unspecified().then_some(from.ip()).filter(|ip| !ip.is_unspecified())
    }

    pub fn send_one(&self, data: &[u8], to: SocketAddr, from: SocketAddr) {
        let msg = [gatehouse_udp::Outgoing { parts: &[data], to, from: self.source(from), ecn: 0 }];
        let fd = self.socket.as_raw_fd();
        let _ = self.socket.try_io(Interest::WRITABLE, || gatehouse_udp::send_batch(fd, self.v6, &msg));
    }
}

thread_local! {
    /// Room for one GSO batch of packets, shared by a worker's connections
    /// (a connection fills and sends it without yielding), so an idle
    /// connection holds no send buffer.
    static SEND_SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with the worker's send buffer; `None` if it is in use (does
/// not happen: connections do not nest).
pub fn send_scratch<R>(f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
    SEND_SCRATCH.with(|s| {
        let mut s = s.try_borrow_mut().ok()?;
        if s.is_empty() {
            s.resize(MAX_DATAGRAM * gatehouse_udp::GSO_SEGMENTS, 0);
        }
        Some(f(&mut s))
    })
}

/// One worker's end of an HTTP/3 listener: which connection each
/// connection ID belongs to, and the handshakes in flight.
pub struct Endpoint {
    pub routes: Mutex<HashMap<Vec<u8>, Sender<Datagram>>>,
    pub keys: Arc<Keys>,
    pub handshakes: AtomicUsize,
}

impl Endpoint {
    pub fn routes(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Sender<Datagram>>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn route(&self, cid: Vec<u8>, tx: Sender<Datagram>) {
        self.routes().insert(cid, tx);
    }

    pub fn forget(&self, cid: &[u8]) {
        self.routes().remove(cid);
    }

    /// The channel of the connection that has one of `cids`.
    pub fn sender_of(&self, cids: &[Vec<u8>]) -> Option<Sender<Datagram>> {
        let routes = self.routes();
        cids.iter().find_map(|c| routes.get(c).cloned())
    }
}
