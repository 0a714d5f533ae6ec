//! HTTP/3 over QUIC (RFC 9000, 9114), on quiche and the same BoringSSL
//! contexts, routes and upstreams as the TCP listeners.
//!
//! **Sockets.** Each worker binds its own `SO_REUSEPORT` UDP socket per
//! HTTP/3 listener ([`gatehouse_udp::bind`], the module the WireGuard plane
//! uses too): datagrams come in batches (`recvmmsg`, UDP GRO) and a
//! connection's packets leave as one UDP GSO send; packet info makes each
//! reply leave from the address the client sent to.
//!
//! **Which worker owns a connection.** The kernel picks a worker's socket
//! by hashing the client's address, so a connection's first packets reach
//! the worker that accepts it. Every connection ID Gatehouse issues names
//! that worker in its first byte ([`cid`]). When a client's address
//! changes (it moved networks, or a NAT rebound its port), its packets may
//! hash to another worker's socket: that worker reads the ID and hands the
//! datagram to the owner over an in-process channel. A hand-off rather
//! than an `SO_REUSEPORT` eBPF program: it needs no BPF loading or
//! privileges, works on any kernel, and costs one channel send only for
//! the packets of connections that moved, which are few; the hash keeps
//! every other packet on its owner.
//!
//! **Paced.** A connection's packets leave at a little more than its
//! congestion window per round trip (`pace.rs`, RFC 9002 7.7), not in
//! bursts of the whole window, which a router's small buffer drops the end
//! of.
//!
//! **Safe by default.** A worker with more than `http.quic.retry_above`
//! handshakes in flight (or every handshake, with `retry_always`) first
//! makes the client prove its address with a Retry token; an Initial with
//! a token that is forged, stale or for another address is counted and
//! refused with INVALID_TOKEN in an Initial packet made without a TLS
//! handshake ([`initial`]). quiche enforces the anti-amplification limit, stream and
//! flow-control limits and the idle timeout; the QPACK table a client may
//! fill is bounded (`qpack_table_capacity`, 4 KB), and a field section's
//! decoding stops once its fields pass `max_header_bytes`, however many
//! table entries it names.
//! Packets for a connection this worker does not know get a stateless
//! reset. 0-RTT is off unless `early_data` is on, and then serves only
//! safe methods, marked `Early-Data: 1` upstream.
//!
//! **Reload and drain.** A reload keeps every connection: the sockets
//! stay, and new connections take the new certificates and routes. On
//! drain, each connection sends GOAWAY, lets its requests finish and
//! closes; its worker's endpoint keeps receiving until the last one has.
pub mod cid;
mod conn;
pub mod forward;
mod http3;
mod inbox;
pub mod initial;
mod io;
mod listener;
mod pace;
mod room;
mod stream_buf;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gatehouse_config::RetryPolicy;
use tokio::io::Interest;
use tokio::sync::mpsc;

use self::cid::{CID_LEN, Keys, worker_of};
use self::forward::Forward;
use self::io::{Datagram, Endpoint, Io, MAX_DATAGRAM};
pub use self::listener::QuicListener;
use crate::context::Worker;
use crate::downstream::conn::Open;
use crate::metrics::QuicDrop as Dropped;

/// Datagrams queued for one connection before more are dropped (as a
/// full socket buffer would).
const CONN_QUEUE: usize = 256;
/// Receive buffers per batch, each room for one GRO run.
const RECV_BUFFERS: usize = 16;
const RECV_BUFFER: usize = 65_536;

/// What the plane gives a worker for one HTTP/3 listener.
pub struct QuicSocket {
    pub socket: std::net::UdpSocket,
    pub v6: bool,
    /// Datagrams other workers hand over to this one.
    pub handoff: mpsc::Receiver<Datagram>,
    /// Every worker's hand-off sender, by worker.
    pub peers: Arc<[mpsc::Sender<Datagram>]>,
    /// The process's token and reset keys.
    pub keys: Arc<Keys>,
    /// The listener's takeover state (see [`forward`]).
    pub forward: Arc<Forward>,
}

/// The sockets a takeover hands on for one HTTP/3 listener: each worker's
/// UDP socket, if the previous process had one, and where to forward its
/// connections' datagrams.
#[derive(Default)]
pub struct Inherit {
    pub sockets: Vec<Option<std::net::UdpSocket>>,
    pub predecessor: Option<std::os::unix::net::UnixDatagram>,
}

/// Makes one socket per worker for an HTTP/3 listener at `addr`, or takes
/// the previous process's.
pub fn bind_workers(
    addr: SocketAddr,
    workers: usize,
    keys: &Arc<Keys>,
    inherit: Inherit,
) -> std::io::Result<Vec<QuicSocket>> {
    let mut senders = Vec::with_capacity(workers);
    let mut receivers = Vec::with_capacity(workers);
    for _ in 0..workers {
        let (tx, rx) = mpsc::channel(4096);
        senders.push(tx);
        receivers.push(rx);
    }
    let peers: Arc<[mpsc::Sender<Datagram>]> = senders.into();
    let forward = Arc::new(Forward::new(inherit.predecessor, peers.clone()));
    let mut inherited = inherit.sockets.into_iter();
    let opts = gatehouse_udp::Options { v6_only: true, ..Default::default() };
    receivers
        .into_iter()
        .map(|handoff| {
            let (socket, v6) = match inherited.next().flatten() {
                Some(s) => {
                    let v6 = s.local_addr()?.is_ipv6();
                    (s, v6)
                }
                None => {
                    let b = gatehouse_udp::bind(addr, opts)?;
                    (b.socket, b.v6)
                }
            };
            Ok(QuicSocket { socket, v6, handoff, peers: peers.clone(), keys: keys.clone(), forward: forward.clone() })
        })
        .collect()
}

/// Serves one HTTP/3 listener on one worker until `stop` fires and its
/// connections have all closed.
pub async fn serve(
    sock: QuicSocket,
    name: Arc<str>,
    worker: Arc<Worker>,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let fd = sock.socket.as_raw_fd();
    let _ = gatehouse_udp::enable_udp_gro(fd);
    let pktinfo = gatehouse_udp::enable_pktinfo(fd, sock.v6);
    let local = match sock.socket.local_addr() {
        Ok(a) => a,
        Err(e) => return tracing::error!(listener = %name, "HTTP/3 socket has no address: {e}"),
    };
    let socket = match tokio::net::UdpSocket::from_std(sock.socket) {
        Ok(s) => s,
        Err(e) => return tracing::error!(listener = %name, "cannot register HTTP/3 socket: {e}"),
    };
    let io = Arc::new(Io { socket, v6: sock.v6, local });
    let endpoint =
        Arc::new(Endpoint { routes: Mutex::new(HashMap::new()), keys: sock.keys, handshakes: AtomicUsize::new(0) });
    let mut handed = sock.forward.handed();
    let mut reading = !*handed.borrow();
    let mut ep = EndpointLoop {
        io,
        endpoint,
        name,
        worker,
        peers: sock.peers,
        forward: sock.forward,
        pktinfo,
        draining: false,
        bufs: (0..RECV_BUFFERS).map(|_| vec![0u8; RECV_BUFFER]).collect(),
        out: vec![0u8; MAX_DATAGRAM],
    };
    let mut handoff = sock.handoff;
    loop {
        tokio::select! {
            ready = ep.io.socket.readable(), if reading => {
                if ready.is_ok() {
                    ep.receive();
                }
            }
            // A successor reads the socket now; what it cannot place of
            // ours comes through the hand-off channel.
            changed = handed.changed(), if reading => {
                reading = changed.is_ok() && !*handed.borrow();
                if !reading {
                    tracing::info!(listener = %ep.name, worker = ep.worker.id, "HTTP/3 socket handed over");
                }
            }
            Some(d) = handoff.recv() => ep.dispatch(d, true),
            _ = &mut stop, if !ep.draining => {
                ep.draining = true;
            }
            _ = tokio::time::sleep(std::time::Duration::from_millis(200)), if ep.draining => {}
        }
        if ep.draining && ep.endpoint.routes().is_empty() {
            return;
        }
    }
}

struct EndpointLoop {
    io: Arc<Io>,
    endpoint: Arc<Endpoint>,
    name: Arc<str>,
    worker: Arc<Worker>,
    peers: Arc<[mpsc::Sender<Datagram>]>,
    forward: Arc<Forward>,
    pktinfo: bool,
    draining: bool,
    bufs: Vec<Vec<u8>>,
    out: Vec<u8>,
}

impl EndpointLoop {
    fn receive(&mut self) {
        let fd = self.io.socket.as_raw_fd();
        let mut got = [gatehouse_udp::Got::default(); RECV_BUFFERS];
        loop {
            let mut bufs: Vec<&mut [u8]> = self.bufs.iter_mut().map(|b| &mut b[..]).collect();
            let n = match self
                .io
                .socket
                .try_io(Interest::READABLE, || gatehouse_udp::recv_batch(fd, &mut bufs, &mut got))
            {
                Ok(n) => n,
                Err(_) => return,
            };
            for (i, g) in got.iter().enumerate().take(n) {
                let Some(from) = g.from else { continue };
                let to = match (self.pktinfo, g.to) {
                    (true, Some(ip)) => SocketAddr::new(ip, self.io.local.port()),
                    _ => self.io.local,
                };
                // A GRO run holds datagrams of `segment` bytes, the last
                // possibly shorter; each is copied out once, for its
                // connection to decrypt in place.
                let seg = if g.segment == 0 { g.len.max(1) } else { g.segment };
                for at in (0..g.len).step_by(seg) {
                    let data = self.bufs[i][at..(at + seg).min(g.len)].to_vec();
                    self.dispatch(Datagram { data, from, to }, false);
                }
            }
            if n < RECV_BUFFERS {
                return;
            }
        }
    }

    fn dropped(&self, why: Dropped) {
        self.worker.shared.metrics.quic_dropped(self.worker.id, why);
    }

    /// One datagram to its connection, a new connection, another worker,
    /// or a reply made here (version negotiation, Retry, reset).
    fn dispatch(&mut self, mut d: Datagram, handed: bool) {
        let hdr = match quiche::Header::from_slice(&mut d.data, CID_LEN) {
            Ok(h) => h,
            Err(_) => return self.dropped(Dropped::Malformed),
        };
        let tx = self.endpoint.routes().get(&hdr.dcid[..]).cloned();
        if let Some(tx) = tx {
            if tx.try_send(d).is_err() {
                self.dropped(Dropped::QueueFull);
            }
            return;
        }
        match hdr.ty {
            quiche::Type::Short => {
                let owner = worker_of(&hdr.dcid);
                match owner {
                    Some(w) if w != self.worker.id && w < self.peers.len() && !handed => {
                        if self.peers[w].try_send(d).is_err() {
                            self.dropped(Dropped::QueueFull);
                        }
                    }
                    // Not ours: the previous process's, while it lives.
                    _ if self.forward.to_predecessor(&d) => {}
                    _ => {
                        let dcid = hdr.dcid.to_vec();
                        self.stateless_reset(&dcid, d.data.len(), d.from, d.to);
                    }
                }
            }
            quiche::Type::Initial => {
                let (scid, dcid, token, version) =
                    (hdr.scid.to_vec(), hdr.dcid.to_vec(), hdr.token.clone().unwrap_or_default(), hdr.version);
                self.initial(d, &scid, &dcid, &token, version);
            }
            // Handshake and 0-RTT packets of a connection not (or no
            // longer) here: perhaps the previous process's.
            _ if self.forward.to_predecessor(&d) => {}
            _ => self.dropped(Dropped::UnknownConnection),
        }
    }

    /// A client's first packet: version negotiation, Retry, or a new
    /// connection.
    fn initial(&mut self, d: Datagram, scid: &[u8], dcid: &[u8], token: &[u8], version: u32) {
        if self.draining {
            return;
        }
        let (peer_scid, peer_dcid) = (quiche::ConnectionId::from_ref(scid), quiche::ConnectionId::from_ref(dcid));
        if !quiche::version_is_supported(version) {
            if let Ok(n) = quiche::negotiate_version(&peer_scid, &peer_dcid, &mut self.out) {
                self.io.send_one(&self.out[..n], d.from, d.to);
            }
            return;
        }
        // A client's Initial is padded to 1200 bytes (RFC 9000 14.1): a
        // shorter one could make us amplify a spoofed source.
        if d.data.len() < 1200 {
            return self.dropped(Dropped::Malformed);
        }
        let Some(listener) = self.listener() else { return };
        let validate = match listener.0.retry {
            RetryPolicy::Always => true,
            RetryPolicy::Above(n) => self.endpoint.handshakes.load(Ordering::Relaxed) >= n as usize,
        };
        let keys = self.endpoint.keys.clone();
        let (scid, odcid) = if token.is_empty() {
            if validate {
                let new = keys.new_cid(self.worker.id);
                let t = keys.retry_token(&d.from, dcid);
                let new_scid = quiche::ConnectionId::from_ref(&new);
                if let Ok(n) = quiche::retry(&peer_scid, &peer_dcid, &new_scid, &t, version, &mut self.out) {
                    self.io.send_one(&self.out[..n], d.from, d.to);
                }
                return;
            }
            (keys.new_cid(self.worker.id).to_vec(), None)
        } else {
            match keys.check_token(token, &d.from) {
                // The client came back with our Retry: the ID it now
                // sends to is the one the Retry gave it.
                Some(odcid) => (dcid.to_vec(), Some(odcid.to_vec())),
                // A forged, stale or misaddressed token while addresses
                // must be proven: the attempt is closed with INVALID_TOKEN
                // (RFC 9000 8.1.2) without a handshake, and counted.
                None if validate => return self.invalid_token(&d, scid, dcid, version),
                // Not ours to check (another server's NEW_TOKEN): as if
                // the client had none.
                None => (keys.new_cid(self.worker.id).to_vec(), None),
            }
        };
        self.accept(d, listener, &scid, odcid.as_deref(), dcid);
    }

    /// Refuses an Initial with a bad token: a CONNECTION_CLOSE in an
    /// Initial packet, far smaller than the client's padded Initial, so
    /// it amplifies nothing.
    fn invalid_token(&mut self, d: &Datagram, client_scid: &[u8], client_dcid: &[u8], version: u32) {
        self.dropped(Dropped::BadToken);
        if version != initial::VERSION_1 {
            return;
        }
        let ours = self.endpoint.keys.new_cid(self.worker.id);
        if let Some(pkt) =
            initial::close_packet(client_dcid, client_scid, &ours, initial::INVALID_TOKEN, b"invalid token")
        {
            self.io.send_one(&pkt, d.from, d.to);
        }
    }

    fn listener(&self) -> Option<(Arc<QuicListener>, usize)> {
        let snap = self.worker.shared.snapshot.load();
        let index = snap.listener_index(&self.name)?;
        Some((snap.listeners[index].quic.clone()?, index))
    }

    fn accept(
        &mut self,
        d: Datagram,
        (listener, index): (Arc<QuicListener>, usize),
        scid: &[u8],
        odcid: Option<&[u8]>,
        client_dcid: &[u8],
    ) {
        let keys = &self.endpoint.keys;
        let quic = {
            let mut config = listener.config();
            config.set_stateless_reset_token(Some(keys.reset_token(scid)));
            let scid = quiche::ConnectionId::from_ref(scid);
            let odcid = odcid.map(quiche::ConnectionId::from_ref);
            quiche::accept_with_buf_factory(&scid, odcid.as_ref(), d.to, d.from, &mut config)
        };
        let quic = match quic {
            Ok(q) => q,
            Err(_) => return self.dropped(Dropped::Malformed),
        };
        let snap = self.worker.shared.snapshot.load();
        let Some(l) = snap.listeners.get(index) else { return };
        self.worker.shared.metrics.connection_opened(self.worker.id);
        l.metrics.accepted(self.worker.id);
        let open = Open { worker: self.worker.clone(), listener: l.metrics.clone() };
        drop(snap);
        let (tx, rx) = inbox::inbox(CONN_QUEUE);
        let mut cids = vec![scid.to_vec()];
        if odcid.is_none() && client_dcid != scid {
            // Until it hears our ID, the client sends to the one it chose.
            cids.push(client_dcid.to_vec());
        }
        for c in &cids {
            self.endpoint.route(c.clone(), tx.clone());
        }
        let peer = d.from;
        let _ = tx.try_send(d);
        let start = conn::Start {
            quic,
            rx,
            io: self.io.clone(),
            endpoint: self.endpoint.clone(),
            listener,
            worker: self.worker.clone(),
            open,
            peer,
            listener_index: index,
            listener_name: self.name.clone(),
            cids,
        };
        tokio::spawn(conn::run(start));
    }

    /// A stateless reset for a packet to a connection ID of ours that no
    /// connection has (RFC 9000 10.3): shorter than what triggered it, so
    /// two endpoints cannot loop, and never for a packet too short to be
    /// told from one.
    fn stateless_reset(&mut self, dcid: &[u8], len: usize, to: SocketAddr, from: SocketAddr) {
        self.dropped(Dropped::UnknownConnection);
        if worker_of(dcid).is_none() || len < 22 {
            return;
        }
        let size = (len - 1).min(43);
        let mut pkt = vec![0u8; size];
        if boring::rand::rand_bytes(&mut pkt[..size - 16]).is_err() {
            return;
        }
        pkt[0] = (pkt[0] & 0x3f) | 0x40;
        let token = self.endpoint.keys.reset_token(dcid).to_be_bytes();
        pkt[size - 16..].copy_from_slice(&token);
        self.io.send_one(&pkt, to, from);
    }
}
