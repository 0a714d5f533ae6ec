//! UDP datagram I/O for the planes that speak over UDP: WireGuard today,
//! QUIC next. One module, not a copy per plane: each worker binds its own
//! `SO_REUSEPORT` socket ([`bind`]) and moves datagrams in batches of up
//! to [`BATCH`] with `recvmmsg`/`sendmmsg` ([`recv_batch`],
//! [`send_batch`]); a run of equal-sized datagrams to one destination goes
//! as one UDP GSO send, and with UDP GRO ([`enable_udp_gro`]) the kernel
//! hands over a run from one flow as one buffer. With packet info
//! ([`enable_pktinfo`]) each datagram says which local address it was sent
//! to, and the reply leaves from that address, as a client behind a
//! multi-address host expects.
//!
//! `unsafe` is confined to [`sys`].

pub mod sys;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use socket2::{Domain, Protocol, Socket, Type};

pub use sys::{
    BATCH, GSO_SEGMENTS, Got, Outgoing, enable_pktinfo, enable_udp_gro, poll_readable, poll_writable, recv_batch,
    send_batch,
};

/// How a worker's socket is made.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// `SO_MARK` on what the socket sends (0: none), for policy routing.
    pub fwmark: u32,
    /// An IPv6 socket takes IPv6 only (as the TCP listeners do, so `[::]`
    /// and `0.0.0.0` can be listed side by side); otherwise `[::]` is
    /// dual-stack.
    pub v6_only: bool,
}

/// A bound socket and whether it is an IPv6 one (dual-stack when bound to
/// `[::]`), which [`send_batch`] needs to know.
pub struct Bound {
    pub socket: UdpSocket,
    pub v6: bool,
}

/// Binds a non-blocking UDP socket to `addr` with `SO_REUSEPORT`, so every
/// worker binds its own and the kernel spreads flows across them. `[::]`
/// binds dual-stack, and falls back to `0.0.0.0` on a host without IPv6.
pub fn bind(addr: SocketAddr, opts: Options) -> io::Result<Bound> {
    match make(addr, opts) {
        Ok(socket) => Ok(Bound { socket, v6: addr.is_ipv6() }),
        Err(e)
            if e.raw_os_error() == Some(libc::EAFNOSUPPORT)
                && addr.ip() == IpAddr::V6(Ipv6Addr::UNSPECIFIED)
                && !opts.v6_only =>
        {
            let v4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), addr.port());
            make(v4, opts).map(|socket| Bound { socket, v6: false })
        }
        Err(e) => Err(e),
    }
}

fn make(addr: SocketAddr, opts: Options) -> io::Result<UdpSocket> {
    let v6 = addr.is_ipv6();
    let s = Socket::new(if v6 { Domain::IPV6 } else { Domain::IPV4 }, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
    if v6 {
        s.set_only_v6(opts.v6_only)?;
    }
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    // Room for bursts while a worker is busy with a batch.
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
    if opts.fwmark != 0 {
        s.set_mark(opts.fwmark)?;
    }
    s.bind(&addr.into())?;
    Ok(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn workers_bind_one_port_each_with_a_socket_of_their_own() {
        let first = bind("127.0.0.1:0".parse().expect("addr"), Options::default()).expect("binds");
        let port = first.socket.local_addr().expect("addr").port();
        let second = bind(SocketAddr::from(([127, 0, 0, 1], port)), Options::default()).expect("binds again");
        assert!(!first.v6 && !second.v6);
        assert_ne!(first.socket.as_raw_fd(), second.socket.as_raw_fd());
        // A plain socket without SO_REUSEPORT is refused the port.
        assert!(std::net::UdpSocket::bind(("127.0.0.1", port)).is_err());
    }

    #[test]
    fn the_wildcard_ipv6_socket_takes_ipv4_too() {
        let b = bind("[::]:0".parse().expect("addr"), Options::default()).expect("binds");
        assert!(b.v6);
        let port = b.socket.local_addr().expect("addr").port();
        let c = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        c.send_to(b"v4", ("127.0.0.1", port)).expect("sends");
        let mut ready = [false];
        poll_readable(&[b.socket.as_raw_fd()], 1000, &mut ready).expect("polls");
        let mut buf = [0u8; 8];
        let (n, from) = b.socket.recv_from(&mut buf).expect("receives");
        assert_eq!(&buf[..n], b"v4");
        assert_eq!(from.port(), c.local_addr().expect("addr").port());
    }
}
