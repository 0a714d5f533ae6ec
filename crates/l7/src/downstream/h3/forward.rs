//! HTTP/3 across a takeover (binary upgrade). A QUIC connection's state
//! lives in the process that made it and cannot move, so established
//! connections stay with the old process until they finish (it sends them
//! GOAWAY as it drains), while the new process serves every new one:
//!
//! - The new process receives the old one's UDP sockets themselves (the
//!   same kernel sockets, so no client's packets move between sockets) and
//!   a Unix datagram socket per listener, and reads the UDP sockets from
//!   then on. The old process stops reading them once the new one says it
//!   is ready, and keeps sending on them (same address and port).
//! - A datagram the new process cannot place (a short-header, Handshake or
//!   0-RTT packet for a connection ID it does not know) goes to the old
//!   process over the Unix socket, with its addresses, instead of drawing
//!   a stateless reset; the old process hands it to the worker its
//!   connection ID names, as if read from the wire. What the old process
//!   does not know either gets the stateless reset there.
//! - Once the old process has exited, sends fail and the new process
//!   answers such datagrams itself.
//!
//! Handshakes in progress at the moment of the takeover may fail (their
//! next Initial reaches the new process, which starts over); the client
//! retries, as after a lost packet.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gatehouse_plane::listeners::QuicHandover;
use tokio::sync::{mpsc, watch};

use super::cid::{CID_LEN, worker_of};
use super::io::Datagram;

const ADDR_LEN: usize = 1 + 16 + 2;

/// One HTTP/3 listener's takeover state, shared by its workers.
pub struct Forward {
    /// The previous process's socket, while it lives.
    predecessor: Option<UnixDatagram>,
    gone: AtomicBool,
    /// Each worker's hand-off channel, for datagrams a successor forwards.
    peers: Arc<[mpsc::Sender<Datagram>]>,
    /// Set once a successor reads the UDP sockets.
    handed: watch::Sender<bool>,
}

impl Forward {
    pub fn new(predecessor: Option<UnixDatagram>, peers: Arc<[mpsc::Sender<Datagram>]>) -> Forward {
        Forward { predecessor, gone: AtomicBool::new(false), peers, handed: watch::Sender::new(false) }
    }

    /// Becomes true when a successor takes the sockets over.
    pub fn handed(&self) -> watch::Receiver<bool> {
        self.handed.subscribe()
    }

    /// Sends a datagram of a connection this process does not know to the
    /// previous process. False if there is none (any more): the caller
    /// answers it.
    pub fn to_predecessor(&self, d: &Datagram) -> bool {
        let Some(p) = &self.predecessor else { return false };
        if self.gone.load(Ordering::Relaxed) {
            return false;
        }
        match p.send(&encode(d)) {
            Ok(_) => true,
            // Its buffer is full: the datagram is lost, as on a busy link,
            // but the connection is still the old process's.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
            // It has exited.
            Err(_) => {
                self.gone.store(true, Ordering::Relaxed);
                false
            }
        }
    }
}

impl QuicHandover for Forward {
    fn forwarded(&self, message: &[u8]) {
        let Some(mut d) = decode(message) else { return };
        let worker = match quiche::Header::from_slice(&mut d.data, CID_LEN) {
            Ok(h) => worker_of(&h.dcid).filter(|&w| w < self.peers.len()).unwrap_or(0),
            Err(_) => return,
        };
        // Full: lost, as a full socket buffer would lose it.
        let _ = self.peers[worker].try_send(d);
    }

    fn handed_over(&self) {
        self.handed.send_replace(true);
    }
}

fn put_addr(out: &mut Vec<u8>, a: SocketAddr) {
    let (family, ip) = match a.ip() {
        IpAddr::V4(v4) => (4u8, v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => (6u8, v6),
    };
    out.push(family);
    out.extend_from_slice(&ip.octets());
    out.extend_from_slice(&a.port().to_be_bytes());
}

fn get_addr(b: &[u8]) -> Option<SocketAddr> {
    let ip6 = Ipv6Addr::from(<[u8; 16]>::try_from(b.get(1..17)?).ok()?);
    let port = u16::from_be_bytes([*b.get(17)?, *b.get(18)?]);
    let ip = match b.first()? {
        4 => IpAddr::V4(ip6.to_ipv4_mapped()?),
        6 => IpAddr::V6(ip6),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// A forwarded datagram: the client's address, ours, then the bytes.
fn encode(d: &Datagram) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 * ADDR_LEN + d.data.len());
    put_addr(&mut out, d.from);
    put_addr(&mut out, d.to);
    out.extend_from_slice(&d.data);
    out
}

fn decode(m: &[u8]) -> Option<Datagram> {
    let from = get_addr(m.get(..ADDR_LEN)?)?;
    let to = get_addr(m.get(ADDR_LEN..2 * ADDR_LEN)?)?;
    Some(Datagram { data: m[2 * ADDR_LEN..].to_vec(), from, to })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_crosses_with_its_addresses() {
        for (from, to) in [("10.0.0.1:4433", "192.0.2.7:443"), ("[2001:db8::1]:5000", "[::1]:443")] {
            let d = Datagram {
                data: vec![0x40, 1, 2, 3],
                from: from.parse().expect("addr"),
                to: to.parse().expect("addr"),
            };
            let back = decode(&encode(&d)).expect("decodes");
            assert_eq!((back.from, back.to, back.data), (d.from, d.to, d.data));
        }
        assert!(decode(&[4, 0, 0]).is_none());
        let mut bad = encode(&Datagram {
            data: vec![],
            from: "10.0.0.1:1".parse().expect("addr"),
            to: "10.0.0.2:2".parse().expect("addr"),
        });
        bad[0] = 9;
        assert!(decode(&bad).is_none());
    }

    #[test]
    fn forwarded_datagrams_reach_the_worker_their_cid_names() {
        let (tx0, mut rx0) = mpsc::channel(4);
        let (tx1, mut rx1) = mpsc::channel(4);
        let f = Forward::new(None, vec![tx0, tx1].into());
        // A short-header packet to a connection ID naming worker 1.
        let mut pkt = vec![0x40];
        pkt.extend_from_slice(&[1u8; CID_LEN]);
        pkt.extend_from_slice(&[0u8; 24]);
        let d = Datagram {
            data: pkt,
            from: "127.0.0.1:5000".parse().expect("addr"),
            to: "127.0.0.1:443".parse().expect("addr"),
        };
        f.forwarded(&encode(&d));
        let got = rx1.try_recv().expect("worker 1 has it");
        assert_eq!(got.from, d.from);
        assert!(rx0.try_recv().is_err());
        // No predecessor: the caller answers.
        assert!(!f.to_predecessor(&got));
    }

    #[test]
    fn a_predecessor_that_exited_is_not_tried_again() {
        let (ours, theirs) = UnixDatagram::pair().expect("pair");
        ours.set_nonblocking(true).expect("nonblocking");
        let (tx, _rx) = mpsc::channel(1);
        let f = Forward::new(Some(ours), vec![tx].into());
        let d = Datagram {
            data: vec![0x40; 30],
            from: "127.0.0.1:1".parse().expect("addr"),
            to: "127.0.0.1:2".parse().expect("addr"),
        };
        assert!(f.to_predecessor(&d));
        let mut buf = [0u8; 128];
        let n = theirs.recv(&mut buf).expect("forwarded");
        assert_eq!(decode(&buf[..n]).expect("decodes").data, d.data);
        drop(theirs);
        assert!(!f.to_predecessor(&d));
        assert!(!f.to_predecessor(&d));
    }

    #[test]
    fn a_successor_taking_over_is_announced() {
        let (tx, _rx) = mpsc::channel(1);
        let f = Forward::new(None, vec![tx].into());
        let rx = f.handed();
        assert!(!*rx.borrow());
        f.handed_over();
        assert!(*rx.borrow());
    }
}
