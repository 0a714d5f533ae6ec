//! Opening a TUN interface: `/dev/net/tun` and its `TUNSETIFF` ioctl.
//! Every `unsafe` block of the crate is here.
#![allow(unsafe_code)]

use std::io;
use std::mem::zeroed;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;

/// How a TUN queue is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One of several queues of a data-path interface: every packet behind
    /// a virtio-net header, checksum and TCP (and, where the kernel has it,
    /// UDP) segmentation offload on, so the kernel hands over super-packets
    /// of up to 64 KiB.
    Offloaded,
    /// A queue that nobody reads (an announcer's VIP holder): the interface
    /// lives while a holder's queue is open, so a process taking over opens
    /// its own before its predecessor's closes.
    Holder,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// Opens a queue of the TUN interface `name` (made if it does not exist),
/// non-blocking, carrying IP packets without a packet-information header.
/// A non-persistent interface goes away with the last of its descriptors.
pub fn open(name: &str, kind: Kind) -> io::Result<OwnedFd> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "interface name of 1 to 15 bytes"));
    }
    // SAFETY: a NUL-terminated constant path; the returned descriptor is
    // checked and owned at once.
    let fd = cvt(unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC) })?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all zeros is a valid value.
    let mut req: libc::ifreq = unsafe { zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = match kind {
        Kind::Offloaded => IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE | IFF_VNET_HDR,
        Kind::Holder => IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE,
    };
    // SAFETY: TUNSETIFF reads and writes an ifreq, which `req` is, alive
    // for the call.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req as *mut libc::ifreq) })?;
    if kind == Kind::Holder {
        return Ok(fd);
    }
    let tso = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
    for offloads in [tso | TUN_F_USO4 | TUN_F_USO6, tso] {
        // SAFETY: TUNSETOFFLOAD takes its flags by value.
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD, offloads as libc::c_ulong) } == 0 {
            return Ok(fd);
        }
    }
    Err(io::Error::last_os_error())
}
