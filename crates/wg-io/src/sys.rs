//! The system calls the WireGuard plane makes beyond std, socket2,
//! [`gatehouse_udp`] (its datagram batches) and [`gatehouse_link`] (TUN,
//! rtnetlink): an eventfd to wake a worker. Every `unsafe` block of the
//! crate is here.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// An eventfd: one thread wakes another's `poll`.
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: no pointers; the descriptor is checked and owned at once.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
