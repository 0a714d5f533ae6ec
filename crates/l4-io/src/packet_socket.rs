//! AF_PACKET: the fallback when AF_XDP cannot be had (an old kernel, no
//! BPF rights). The kernel hands the plane a copy of every frame of the
//! interface and keeps its own, so only what the plane wants is processed
//! ([`crate::steer::wants`], the XDP program's choice made in user space);
//! one system call per frame, so much slower than AF_XDP, but the same
//! pipeline. The only `unsafe` of this path lives here (and the socket's
//! opening in `gatehouse_link::packet_tx`).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

const ETH_P_ALL: u16 = 0x0003;
/// Do not hand back frames this socket sent.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;

pub struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    pub fn open(ifindex: u32) -> io::Result<PacketSocket> {
        let fd = gatehouse_link::packet_tx::open_packet_socket(ifindex, ETH_P_ALL, &[(PACKET_IGNORE_OUTGOING, 1)])?;
        Ok(PacketSocket { fd })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// One received frame into `buf`; None when there is none now.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: `buf` is writable for its length.
        let n =
            unsafe { libc::recv(self.fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_TRUNC) };
        // A frame longer than the buffer is cut: drop it (MSG_TRUNC gives its real length).
        (n > 0 && (n as usize) <= buf.len()).then_some(n as usize)
    }

    pub fn send(&self, frame: &[u8]) -> bool {
        // SAFETY: `frame` is readable for its length.
        unsafe { libc::send(self.fd(), frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT) >= 0 }
    }

    pub fn wait(&self, timeout_ms: i32) {
        let mut p = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, timeout_ms) };
    }
}
