//! A send-only AF_PACKET socket on one interface whose frames carry a
//! virtio-net header, so that one frame may be a TCP or UDP super-frame
//! the kernel segments (GSO) or hands whole to a device that takes it so
//! (veth, and NICs with TSO/USO). Router mode sends its LAN side through
//! it where AF_XDP runs in copy mode, which costs a socket buffer per
//! frame. Every `unsafe` block of it is here.
#![allow(unsafe_code)]

use std::io;
use std::mem::zeroed;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
/// Frames at most in one `sendmmsg`.
pub const BATCH: usize = 64;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(rc) }
}

/// An AF_PACKET raw socket bound to interface `ifindex` for `protocol`
/// (an ethertype in host order; 0 receives nothing), non-blocking, with
/// each `(option, value)` of `SOL_PACKET` set first.
pub fn open_packet_socket(ifindex: u32, protocol: u16, options: &[(libc::c_int, libc::c_int)]) -> io::Result<OwnedFd> {
    let proto = protocol.to_be();
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let raw = check(unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            libc::c_int::from(proto),
        )
    })?;
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    for &(opt, value) in options {
        // SAFETY: an int option, its size passed with it.
        check(unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_PACKET,
                opt,
                (&value as *const libc::c_int).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        })?;
    }
    // SAFETY: all-zero is a valid sockaddr_ll (plain integers).
    let mut sa: libc::sockaddr_ll = unsafe { zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = proto;
    sa.sll_ifindex = ifindex as i32;
    // SAFETY: a valid sockaddr_ll of the length passed.
    check(unsafe {
        libc::bind(raw, (&sa as *const libc::sockaddr_ll).cast(), size_of::<libc::sockaddr_ll>() as libc::socklen_t)
    })?;
    Ok(fd)
}

pub struct PacketTx {
    fd: OwnedFd,
}

impl PacketTx {
    /// A socket that sends on interface `ifindex` and receives nothing
    /// (protocol 0), past the queueing discipline as AF_XDP is.
    pub fn open(ifindex: u32) -> io::Result<PacketTx> {
        Ok(PacketTx { fd: open_packet_socket(ifindex, 0, &[(PACKET_VNET_HDR, 1), (PACKET_QDISC_BYPASS, 1)])? })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends frames without waiting, each made of its parts (a virtio-net
    /// header first, then the Ethernet frame), at most [`BATCH`]; returns
    /// how many went (the kernel may take fewer).
    pub fn send(&self, frames: &[&[&[u8]]]) -> io::Result<usize> {
        let n = frames.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut iovs: Vec<libc::iovec> = frames[..n]
            .iter()
            .flat_map(|f| f.iter())
            .map(|p| libc::iovec { iov_base: p.as_ptr() as *mut libc::c_void, iov_len: p.len() })
            .collect();
        // SAFETY: a plain C struct; zeroed is valid.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        let mut at = 0;
        for (m, f) in msgs.iter_mut().zip(&frames[..n]) {
            m.msg_hdr.msg_iov = iovs[at..].as_mut_ptr();
            m.msg_hdr.msg_iovlen = f.len();
            at += f.len();
        }
        // SAFETY: the first `n` headers point at iovecs (alive, unmoved)
        // of buffers the kernel only reads; no address (the socket is
        // bound) and no control data.
        let r = unsafe { libc::sendmmsg(self.fd(), msgs.as_mut_ptr(), n as libc::c_uint, libc::MSG_DONTWAIT) };
        check(r).map(|k| k as usize)
    }
}
