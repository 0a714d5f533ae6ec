//! BPF_PROG_TEST_RUN with live frames (Linux 5.18 and later): the kernel
//! runs an XDP program `repeat` times on copies of one frame and sends
//! what the program returns XDP_TX for out of the given interface. The
//! fastest packet source the kernel has, used by the benchmarks' generator.
//!
//! `unsafe` here: the bpf(2) system call and its attribute block.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

/// The `test` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct TestAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// `struct xdp_md` as the context passed in.
#[repr(C)]
#[derive(Default)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

/// Runs XDP program `prog` `repeat` times on `frame` as if received on
/// `ifindex` queue 0, frames handed out in batches of `batch` (at most 256).
pub fn run_live(prog: RawFd, frame: &[u8], ifindex: u32, repeat: u32, batch: u32) -> io::Result<()> {
    let ctx = XdpMd { data: 0, data_end: frame.len() as u32, ingress_ifindex: ifindex, ..XdpMd::default() };
    let mut attr = TestAttr {
        prog_fd: prog as u32,
        data_size_in: frame.len() as u32,
        data_in: frame.as_ptr() as u64,
        repeat,
        ctx_size_in: size_of::<XdpMd>() as u32,
        ctx_in: (&ctx as *const XdpMd) as u64,
        flags: BPF_F_TEST_XDP_LIVE_FRAMES,
        batch_size: batch.min(256),
        ..TestAttr::default()
    };
    // SAFETY: bpf(2) reads `size_of::<TestAttr>()` bytes of `attr` and may
    // write its result fields back (hence `&mut`); through it, it reads
    // `frame` (data_size_in bytes) and `ctx` (ctx_size_in bytes), both alive
    // for the call. No output buffers are given.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_PROG_TEST_RUN, &mut attr as *mut TestAttr, size_of::<TestAttr>() as u32)
    };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}
