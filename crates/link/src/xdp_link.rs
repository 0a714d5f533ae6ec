//! XDP programs attached through BPF links (`BPF_LINK_CREATE`, kernel
//! 5.9 on), which a process can hand to the one that replaces it.
//!
//! A program attached through netlink is the interface's until someone
//! detaches it, and detaching and attaching again is slow on some drivers
//! (veth: tens of milliseconds each), during which the interface steers
//! nothing. A link is a descriptor: the program stays attached while any
//! process holds one, and `BPF_LINK_UPDATE` swaps the program behind it in
//! one step. So a process taking over receives its predecessor's link with
//! the listening sockets, prepares its own program and maps while the old
//! program still runs, and swaps: the interface is never without one.
//!
//! The two `bpf(2)` calls are this module's only `unsafe`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `bpf(2)` commands and values (`include/uapi/linux/bpf.h`).
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_LINK_UPDATE: libc::c_int = 29;
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_SKB_MODE`, `XDP_FLAGS_DRV_MODE` (`include/uapi/linux/if_link.h`).
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// Where the driver runs the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// In the driver, before a socket buffer exists (native XDP).
    Driver,
    /// In the kernel's generic path, on socket buffers.
    Generic,
}

/// The `link_create` member of `union bpf_attr`, zero-padded: the kernel
/// wants every byte past the fields it reads to be zero.
#[repr(C)]
#[derive(Default)]
struct LinkCreate {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    rest: [u32; 12],
}

/// The `link_update` member of `union bpf_attr`, zero-padded.
#[repr(C)]
#[derive(Default)]
struct LinkUpdate {
    link_fd: u32,
    new_prog_fd: u32,
    flags: u32,
    old_prog_fd: u32,
    rest: [u32; 12],
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    // A descriptor the process holds is never negative.
    fd.as_raw_fd() as u32
}

/// Attaches XDP program `prog` to interface `ifindex` through a new link.
/// Fails (`EINVAL`) on a kernel without XDP links, and (`EBUSY`) where a
/// program is attached already (through netlink or another link).
pub fn attach(prog: BorrowedFd<'_>, ifindex: u32, mode: Mode) -> io::Result<OwnedFd> {
    let flags = match mode {
        Mode::Driver => XDP_FLAGS_DRV_MODE,
        Mode::Generic => XDP_FLAGS_SKB_MODE,
    };
    let attr = LinkCreate {
        prog_fd: fd_u32(prog),
        target_ifindex: ifindex,
        attach_type: BPF_XDP,
        flags,
        ..Default::default()
    };
    // SAFETY: `attr` is a live, initialised `bpf_attr` prefix of the size
    // passed, which the kernel only reads; it returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_LINK_CREATE, &attr as *const LinkCreate, std::mem::size_of::<LinkCreate>())
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just installed `fd` in our table for this link;
    // nothing else in the process knows it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A link made by [`attach_best`]: its mode, and why the driver refused
/// to run the program itself, where it did.
pub struct Attached {
    pub link: OwnedFd,
    pub mode: Mode,
    pub driver_refused: Option<io::Error>,
}

/// Attaches `prog` to `ifindex` through a new link in driver mode, or in
/// generic mode where the driver refuses. The error is generic mode's
/// (`EINVAL` on a kernel without XDP links: the caller attaches through
/// netlink then).
pub fn attach_best(prog: BorrowedFd<'_>, ifindex: u32) -> io::Result<Attached> {
    match attach(prog, ifindex, Mode::Driver) {
        Ok(link) => Ok(Attached { link, mode: Mode::Driver, driver_refused: None }),
        Err(refused) => attach(prog, ifindex, Mode::Generic).map(|link| Attached {
            link,
            mode: Mode::Generic,
            driver_refused: Some(refused),
        }),
    }
}

/// Puts program `prog` behind `link` in one step: every packet the
/// interface receives from then on runs `prog`, none runs neither.
pub fn replace(link: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    let attr = LinkUpdate { link_fd: fd_u32(link), new_prog_fd: fd_u32(prog), ..Default::default() };
    // SAFETY: as in `attach`: a live `bpf_attr` prefix the kernel reads.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_LINK_UPDATE, &attr as *const LinkUpdate, std::mem::size_of::<LinkUpdate>())
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn the_attributes_have_the_kernels_layout() {
        // link_create: prog_fd, target_ifindex, attach_type, flags at 0, 4,
        // 8, 12; link_update: link_fd, new_prog_fd, flags, old_prog_fd.
        assert_eq!(std::mem::offset_of!(LinkCreate, attach_type), 8);
        assert_eq!(std::mem::offset_of!(LinkCreate, flags), 12);
        assert_eq!(std::mem::offset_of!(LinkUpdate, flags), 8);
        assert_eq!(std::mem::size_of::<LinkCreate>(), 64);
        assert_eq!(std::mem::size_of::<LinkUpdate>(), 64);
    }

    #[test]
    fn a_descriptor_that_is_no_program_is_refused() {
        // stdin is no BPF program: the kernel says so, nothing is attached.
        let not_a_program = std::io::stdin();
        let e = attach(not_a_program.as_fd(), 1, Mode::Generic).expect_err("not a program");
        assert!(matches!(e.raw_os_error(), Some(libc::EBADF | libc::EINVAL | libc::EPERM)), "{e}");
    }
}
