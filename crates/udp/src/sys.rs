//! The system calls of UDP datagram I/O beyond std and socket2:
//! `recvmmsg`/`sendmmsg` batches with UDP GSO and GRO and each datagram's
//! destination address (packet info), and `poll`. Every `unsafe` block of
//! the crate is here.
#![allow(unsafe_code)]

use std::io;
use std::mem::{MaybeUninit, size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;

/// Datagrams per `recvmmsg`/`sendmmsg` call at most.
pub const BATCH: usize = 64;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// The first `n` of `slots`, zeroed, as values: a call sets up only the
/// entries it uses (zeroing all [`BATCH`] headers, addresses and control
/// buffers was about 19 KB a call, for sends that mostly carry one).
///
/// # Safety
///
/// All-zero bytes must be a valid `T`: a plain C struct, or an array of
/// integers.
unsafe fn zeroed_prefix<T>(slots: &mut [MaybeUninit<T>], n: usize) -> &mut [T] {
    let slots = &mut slots[..n];
    for s in slots.iter_mut() {
        // SAFETY: the caller's promise: all-zero is a valid T.
        s.write(unsafe { zeroed() });
    }
    // SAFETY: each of the `n` slots was written just above, and
    // MaybeUninit<T> has T's layout.
    unsafe { std::slice::from_raw_parts_mut(slots.as_mut_ptr().cast::<T>(), n) }
}

/// Room for a batch's message headers, socket addresses and control
/// buffers, of which a call sets up only the entries it uses.
struct BatchRoom {
    names: [MaybeUninit<libc::sockaddr_storage>; BATCH],
    msgs: [MaybeUninit<libc::mmsghdr>; BATCH],
    controls: [MaybeUninit<[u64; CMSG_ROOM / 8]>; BATCH],
}

type Entries<'a> = (&'a mut [libc::sockaddr_storage], &'a mut [libc::mmsghdr], &'a mut [[u64; CMSG_ROOM / 8]]);

impl BatchRoom {
    fn new() -> BatchRoom {
        BatchRoom {
            names: [const { MaybeUninit::uninit() }; BATCH],
            msgs: [const { MaybeUninit::uninit() }; BATCH],
            controls: [const { MaybeUninit::uninit() }; BATCH],
        }
    }

    /// The first `n` of each, zeroed.
    fn zeroed(&mut self, n: usize) -> Entries<'_> {
        // SAFETY: sockaddr_storage and mmsghdr are plain C structs, the
        // control buffers arrays of integers.
        unsafe {
            (zeroed_prefix(&mut self.names, n), zeroed_prefix(&mut self.msgs, n), zeroed_prefix(&mut self.controls, n))
        }
    }
}

/// A socket address as the kernel takes it; on an IPv6 socket (`v6`) an
/// IPv4 address is written IPv4-mapped.
fn to_raw(addr: &SocketAddr, v6: bool, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    let mapped;
    let addr = match addr {
        SocketAddr::V4(a) if v6 => {
            mapped = SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0));
            &mapped
        }
        a => a,
    };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            unsafe { std::ptr::write((out as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((out as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// The address the kernel wrote; IPv4-mapped IPv6 addresses come back as
/// IPv4 (a dual-stack socket reports IPv4 peers that way).
fn from_raw(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(s as *const libc::sockaddr_storage).cast() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 = unsafe { &*(s as *const libc::sockaddr_storage).cast() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(ip, port, sin6.sin6_flowinfo, sin6.sin6_scope_id)),
            })
        }
        _ => None,
    }
}

const SOL_UDP: libc::c_int = 17;
const IPV6_RECVPKTINFO: libc::c_int = 49;
const IPV6_PKTINFO: libc::c_int = 50;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Room for the control messages of one datagram: UDP GRO's or GSO's
/// (an int or a u16), IPV6_PKTINFO (20 bytes) and a traffic class (an
/// int), each with its header.
const CMSG_ROOM: usize = 104;

/// Asks the kernel to hand over runs of datagrams of one flow as one
/// buffer (UDP GRO; [`recv_batch`] reports the segment size). False where
/// the kernel does not have it.
pub fn enable_udp_gro(fd: RawFd) -> bool {
    let one: libc::c_int = 1;
    // SAFETY: setsockopt reads one int from a live local.
    let r = unsafe {
        libc::setsockopt(fd, SOL_UDP, UDP_GRO, (&one as *const libc::c_int).cast(), size_of::<libc::c_int>() as _)
    };
    r == 0
}

/// Asks the kernel for each datagram's destination address, so that
/// replies can leave from it: `IPV6_RECVPKTINFO` on an IPv6 socket (`v6`;
/// IPv4 destinations come IPv4-mapped on a dual-stack one), `IP_PKTINFO`
/// on an IPv4 one. False where it cannot.
pub fn enable_pktinfo(fd: RawFd, v6: bool) -> bool {
    let one: libc::c_int = 1;
    let (level, name) = if v6 { (libc::IPPROTO_IPV6, IPV6_RECVPKTINFO) } else { (libc::IPPROTO_IP, libc::IP_PKTINFO) };
    // SAFETY: setsockopt reads one int from a live local.
    let r = unsafe {
        libc::setsockopt(fd, level, name, (&one as *const libc::c_int).cast(), size_of::<libc::c_int>() as _)
    };
    r == 0
}

/// What [`recv_batch`] got in one buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Got {
    /// Bytes in the buffer (0: truncated, to be dropped).
    pub len: usize,
    pub from: Option<SocketAddr>,
    /// With UDP GRO: the buffer holds datagrams of this size, the last
    /// possibly shorter. 0: one datagram.
    pub segment: usize,
    /// The local address it was sent to (with [`enable_pktinfo`]).
    pub to: Option<IpAddr>,
}

/// Receives up to `bufs.len()` (at most [`BATCH`]) buffers without
/// waiting. Returns how many.
pub fn recv_batch(fd: RawFd, bufs: &mut [&mut [u8]], got: &mut [Got]) -> io::Result<usize> {
    let n = bufs.len().min(BATCH).min(got.len());
    let mut room = BatchRoom::new();
    let (names, msgs, controls) = room.zeroed(n);
    let mut iovs: [MaybeUninit<libc::iovec>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
    for i in 0..n {
        iovs[i].write(libc::iovec { iov_base: bufs[i].as_mut_ptr().cast(), iov_len: bufs[i].len() });
        let hdr = &mut msgs[i].msg_hdr;
        hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
        hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        hdr.msg_iov = iovs[i].as_mut_ptr();
        hdr.msg_iovlen = 1;
        hdr.msg_control = controls[i].as_mut_ptr().cast();
        hdr.msg_controllen = CMSG_ROOM;
    }
    // SAFETY: the first `n` headers point at `n` live buffers (each its
    // own, borrowed mutably for the call), their name storage and their
    // control buffers (8-byte aligned, CMSG_ROOM bytes).
    let r =
        unsafe { libc::recvmmsg(fd, msgs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT, std::ptr::null_mut()) };
    let r = cvt(r)? as usize;
    for i in 0..r {
        let truncated = msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
        let len = if truncated { 0 } else { msgs[i].msg_len as usize };
        let (segment, to) = control_data(&msgs[i].msg_hdr);
        got[i] = Got { len, from: from_raw(&names[i]), segment, to };
    }
    Ok(r)
}

/// The UDP GRO segment size and the destination address in a received
/// message's control data.
fn control_data(hdr: &libc::msghdr) -> (usize, Option<IpAddr>) {
    let (mut segment, mut to) = (0, None);
    // SAFETY: the CMSG macros walk the control buffer the kernel filled,
    // within msg_controllen; a (SOL_UDP, UDP_GRO) message holds an int, an
    // (IPPROTO_IPV6, IPV6_PKTINFO) one an in6_pktinfo and an (IPPROTO_IP,
    // IP_PKTINFO) one an in_pktinfo, each read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (SOL_UDP, UDP_GRO) => {
                    segment = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int).max(0) as usize;
                }
                (libc::IPPROTO_IPV6, IPV6_PKTINFO) => {
                    let info = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::in6_pktinfo);
                    let ip = Ipv6Addr::from(info.ipi6_addr.s6_addr);
                    to = Some(ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4));
                }
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    let info = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::in_pktinfo);
                    to = Some(IpAddr::V4(Ipv4Addr::from(info.ipi_addr.s_addr.to_ne_bytes())));
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    (segment, to)
}

/// One message to send: datagrams to one destination. With more than one
/// part, every part but the last must be `parts[0].len()` long (the last
/// may be shorter), and they go as one UDP GSO send.
pub struct Outgoing<'a> {
    pub parts: &'a [&'a [u8]],
    pub to: SocketAddr,
    /// The local address to send from (on a dual-stack socket); `None`:
    /// the route's.
    pub from: Option<IpAddr>,
    /// The ECN bits of the IP header (RFC 3168: 0 Not-ECT, 1 and 2 ECT,
    /// 3 CE); 0 leaves the socket's own.
    pub ecn: u8,
}

/// Datagrams at most in one UDP GSO send.
pub const GSO_SEGMENTS: usize = 64;

/// Sends `msgs_in` (at most [`BATCH`] at a time) without waiting; returns
/// how many messages went (the kernel may take fewer). `v6`: the socket is
/// a dual-stack IPv6 one.
pub fn send_batch(fd: RawFd, v6: bool, msgs_in: &[Outgoing<'_>]) -> io::Result<usize> {
    let n = msgs_in.len().min(BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iovs: Vec<libc::iovec> = Vec::with_capacity(msgs_in[..n].iter().map(|m| m.parts.len()).sum());
    iovs.extend(
        msgs_in[..n]
            .iter()
            .flat_map(|m| m.parts.iter())
            .map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() }),
    );
    let mut room = BatchRoom::new();
    let (names, msgs, controls) = room.zeroed(n);
    let mut at = 0;
    for (i, m) in msgs_in.iter().take(n).enumerate() {
        let len = to_raw(&m.to, v6, &mut names[i]);
        let hdr = &mut msgs[i].msg_hdr;
        hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
        hdr.msg_namelen = len;
        hdr.msg_iov = iovs[at..].as_mut_ptr();
        hdr.msg_iovlen = m.parts.len();
        at += m.parts.len();
        let gso = m.parts.len() > 1;
        // On an IPv6 socket every source is an IPv6 one (IPv4-mapped); an
        // IPv4 socket can only send from an IPv4 address.
        let from = match (m.from, v6) {
            (Some(IpAddr::V4(a)), true) => Some(IpAddr::V6(a.to_ipv6_mapped())),
            (Some(IpAddr::V6(_)), false) => None,
            (from, _) => from,
        };
        let ecn = m.ecn & 3;
        if gso || from.is_some() || ecn != 0 {
            hdr.msg_control = controls[i].as_mut_ptr().cast();
            hdr.msg_controllen = CMSG_ROOM;
            let mut used = 0;
            // SAFETY: the control buffer is CMSG_ROOM bytes, 8-byte aligned:
            // room for a UDP_SEGMENT header and u16, a TOS or traffic-class
            // header and int, and a packet-info header and in6_pktinfo (or
            // the smaller in_pktinfo), written in place one after the other
            // within msg_controllen.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(hdr);
                if gso {
                    (*c).cmsg_level = SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, m.parts[0].len() as u16);
                    used += libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
                    c = libc::CMSG_NXTHDR(hdr, c);
                }
                if ecn != 0 && !c.is_null() {
                    // An IPv4 destination (IPv4-mapped on a dual-stack
                    // socket) takes IP_TOS, an IPv6 one a traffic class.
                    let v4 = match m.to.ip() {
                        IpAddr::V4(_) => true,
                        IpAddr::V6(a) => a.to_ipv4_mapped().is_some(),
                    };
                    (*c).cmsg_level = if v4 { libc::IPPROTO_IP } else { libc::IPPROTO_IPV6 };
                    (*c).cmsg_type = if v4 { libc::IP_TOS } else { libc::IPV6_TCLASS };
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, libc::c_int::from(ecn));
                    used += libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) as usize;
                    c = libc::CMSG_NXTHDR(hdr, c);
                }
                match (from, c.is_null()) {
                    (Some(IpAddr::V6(addr)), false) => {
                        (*c).cmsg_level = libc::IPPROTO_IPV6;
                        (*c).cmsg_type = IPV6_PKTINFO;
                        (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::in6_pktinfo>() as u32) as _;
                        let info =
                            libc::in6_pktinfo { ipi6_addr: libc::in6_addr { s6_addr: addr.octets() }, ipi6_ifindex: 0 };
                        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::in6_pktinfo, info);
                        used += libc::CMSG_SPACE(size_of::<libc::in6_pktinfo>() as u32) as usize;
                    }
                    (Some(IpAddr::V4(addr)), false) => {
                        (*c).cmsg_level = libc::IPPROTO_IP;
                        (*c).cmsg_type = libc::IP_PKTINFO;
                        (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::in_pktinfo>() as u32) as _;
                        let info = libc::in_pktinfo {
                            ipi_ifindex: 0,
                            ipi_spec_dst: libc::in_addr { s_addr: u32::from_ne_bytes(addr.octets()) },
                            ipi_addr: libc::in_addr { s_addr: 0 },
                        };
                        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::in_pktinfo, info);
                        used += libc::CMSG_SPACE(size_of::<libc::in_pktinfo>() as u32) as usize;
                    }
                    _ => {}
                }
            }
            hdr.msg_controllen = used as _;
        }
    }
    // SAFETY: the first `n` headers point at live buffers the kernel only
    // reads (through `iovs`, alive and unmoved), initialised addresses,
    // and control data of the given lengths.
    let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT) };
    Ok(cvt(r)? as usize)
}

/// Waits until one of `fds` is readable or `timeout_ms` passes; `ready`
/// says which are. EINTR counts as nothing ready.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32, ready: &mut [bool]) -> io::Result<()> {
    let mut p: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `p` is a live array of `p.len()` pollfd.
    let r = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            ready.iter_mut().for_each(|r| *r = false);
            return Ok(());
        }
        return Err(e);
    }
    for (r, q) in ready.iter_mut().zip(&p) {
        *r = q.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0;
    }
    Ok(())
}

/// Waits until `fd` can take more or `timeout_ms` passes.
pub fn poll_writable(fd: RawFd, timeout_ms: i32, ready: &mut [bool; 1]) -> io::Result<()> {
    let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    ready[0] = r > 0 && p.revents & libc::POLLOUT != 0;
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn batches_go_out_and_come_back_with_their_sources() {
        // A dual-stack IPv6 sender reaches an IPv4 socket (IPv4-mapped).
        let a = std::net::UdpSocket::bind("[::]:0").expect("bind");
        let b = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let to = b.local_addr().expect("addr");
        let from = SocketAddr::from(([127, 0, 0, 1], a.local_addr().expect("addr").port()));
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 100 + usize::from(i)]).collect();
        let parts: Vec<[&[u8]; 1]> = payloads.iter().map(|p| [p.as_slice()]).collect();
        let out: Vec<Outgoing<'_>> = parts.iter().map(|p| Outgoing { parts: p, to, from: None, ecn: 0 }).collect();
        assert_eq!(send_batch(a.as_raw_fd(), true, &out).expect("sends"), 10);
        let mut ready = [false];
        poll_readable(&[b.as_raw_fd()], 1000, &mut ready).expect("polls");
        assert!(ready[0]);
        let mut store = vec![[0u8; 2048]; 16];
        let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
        let mut got = [Got::default(); 16];
        let mut n = 0;
        while n < 10 {
            n += recv_batch(b.as_raw_fd(), &mut bufs[n..], &mut got[n..]).expect("receives");
        }
        for i in 0..10 {
            assert_eq!(got[i], Got { len: 100 + i, from: Some(from), segment: 0, to: None });
            assert_eq!(bufs[i][..got[i].len], payloads[i][..]);
        }
        assert_eq!(
            recv_batch(b.as_raw_fd(), &mut bufs, &mut got).map_err(|e| e.kind()),
            Err(io::ErrorKind::WouldBlock)
        );
    }

    /// The TOS byte (IPv4) or traffic class (IPv6) a datagram arrived
    /// with, read with IP_RECVTOS / IPV6_RECVTCLASS.
    fn received_tos(fd: RawFd, v6: bool) -> u8 {
        let mut buf = [0u8; 64];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut control = [0u64; 8];
        // SAFETY: a plain C struct; zeroed is valid.
        let mut hdr: libc::msghdr = unsafe { zeroed() };
        hdr.msg_iov = &mut iov;
        hdr.msg_iovlen = 1;
        hdr.msg_control = control.as_mut_ptr().cast();
        hdr.msg_controllen = size_of_val(&control);
        // SAFETY: the header points at live buffers of the given lengths.
        assert!(unsafe { libc::recvmsg(fd, &mut hdr, 0) } > 0);
        // SAFETY: the kernel wrote well-formed control messages within
        // msg_controllen; IP_TOS carries a byte, IPV6_TCLASS an int.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&hdr);
            assert!(!c.is_null(), "no TOS control message");
            if v6 { *(libc::CMSG_DATA(c) as *const libc::c_int) as u8 } else { *libc::CMSG_DATA(c) }
        }
    }

    #[test]
    fn ecn_bits_go_out_in_the_ip_header() {
        for (bind, to_ip, v6) in [("127.0.0.1:0", "127.0.0.1", false), ("[::1]:0", "::1", true)] {
            let Ok(b) = std::net::UdpSocket::bind(bind) else { continue };
            let one: libc::c_int = 1;
            let (level, opt) =
                if v6 { (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS) } else { (libc::IPPROTO_IP, libc::IP_RECVTOS) };
            // SAFETY: an int option of the right size.
            let r = unsafe { libc::setsockopt(b.as_raw_fd(), level, opt, (&one as *const libc::c_int).cast(), 4) };
            assert_eq!(r, 0);
            let to = SocketAddr::new(to_ip.parse().expect("address"), b.local_addr().expect("addr").port());
            let a = std::net::UdpSocket::bind(if v6 { "[::]:0" } else { "0.0.0.0:0" }).expect("bind");
            for ecn in [1u8, 2, 3] {
                let parts: [&[u8]; 2] = [&[7u8; 50], &[8u8; 50]];
                let out = [Outgoing { parts: &parts, to, from: None, ecn }];
                assert_eq!(send_batch(a.as_raw_fd(), v6, &out).expect("sends"), 1);
                assert_eq!(received_tos(b.as_raw_fd(), v6) & 3, ecn);
                assert_eq!(received_tos(b.as_raw_fd(), v6) & 3, ecn, "every segment of a GSO send");
            }
        }
    }

    #[test]
    fn a_gso_send_arrives_as_datagrams_or_as_one_gro_buffer() {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let plain = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let gro = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let on = enable_udp_gro(gro.as_raw_fd());
        let seg: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; if i == 4 { 40 } else { 100 }]).collect();
        let parts: Vec<&[u8]> = seg.iter().map(|s| s.as_slice()).collect();
        for to in [plain.local_addr().expect("addr"), gro.local_addr().expect("addr")] {
            let out = [Outgoing { parts: &parts, to, from: None, ecn: 0 }];
            assert_eq!(send_batch(a.as_raw_fd(), false, &out).expect("a GSO send"), 1);
        }
        // Without GRO: five datagrams as sent.
        let mut store = vec![[0u8; 4096]; 8];
        let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
        let mut got = [Got::default(); 8];
        let mut ready = [false];
        poll_readable(&[plain.as_raw_fd()], 1000, &mut ready).expect("polls");
        let n = recv_batch(plain.as_raw_fd(), &mut bufs, &mut got).expect("receives");
        assert_eq!(got[..n].iter().map(|g| g.len).collect::<Vec<_>>(), [100, 100, 100, 100, 40]);
        // With GRO (on loopback the kernel may or may not coalesce): the
        // same bytes, in one buffer marked with the segment size or apart.
        poll_readable(&[gro.as_raw_fd()], 1000, &mut ready).expect("polls");
        let mut bytes = Vec::new();
        let mut total = 0;
        while total < 440 {
            let n = recv_batch(gro.as_raw_fd(), &mut bufs, &mut got).unwrap_or(0);
            for i in 0..n {
                assert!(got[i].segment == 0 || (on && got[i].segment == 100), "{:?}", got[i]);
                bytes.extend_from_slice(&bufs[i][..got[i].len]);
                total += got[i].len;
            }
        }
        assert_eq!(bytes, seg.concat());
    }

    /// A socket bound to the wildcard `bind` (IPv6 dual-stack or IPv4)
    /// learns that a datagram was sent to `dest`, a second loopback
    /// address (loopback answers for all of 127/8), and its answer leaves
    /// from `dest`, not from the route's 127.0.0.1.
    fn answers_from_the_address_it_was_sent_to(bind: &str, v6: bool, dest: [u8; 4]) {
        let a = std::net::UdpSocket::bind(bind).expect("bind");
        assert!(enable_pktinfo(a.as_raw_fd(), v6));
        let port = a.local_addr().expect("addr").port();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        b.send_to(b"hello", (Ipv4Addr::from(dest), port)).expect("sends");
        let mut store = [[0u8; 64]; 1];
        let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|b| &mut b[..]).collect();
        let mut got = [Got::default(); 1];
        let mut ready = [false];
        poll_readable(&[a.as_raw_fd()], 1000, &mut ready).expect("polls");
        assert_eq!(recv_batch(a.as_raw_fd(), &mut bufs, &mut got).expect("receives"), 1);
        assert_eq!(got[0].to, Some(IpAddr::from(dest)));
        let from_b = b.local_addr().expect("addr");
        assert_eq!(got[0].from, Some(from_b));
        let parts: [&[u8]; 1] = [b"back"];
        let out = [Outgoing { parts: &parts, to: from_b, from: got[0].to, ecn: 0 }];
        assert_eq!(send_batch(a.as_raw_fd(), v6, &out).expect("sends"), 1);
        let mut buf = [0u8; 16];
        let (n, src) = b.recv_from(&mut buf).expect("receives");
        assert_eq!((&buf[..n], src), (&b"back"[..], SocketAddr::from((dest, port))));
    }

    #[test]
    fn a_dual_stack_socket_answers_from_the_address_it_was_sent_to() {
        answers_from_the_address_it_was_sent_to("[::]:0", true, [127, 0, 0, 2]);
    }

    #[test]
    fn an_ipv4_socket_answers_from_the_address_it_was_sent_to() {
        answers_from_the_address_it_was_sent_to("0.0.0.0:0", false, [127, 0, 0, 3]);
    }
}
