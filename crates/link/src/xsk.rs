//! AF_XDP sockets: the UMEM (one memory area cut into 2 KiB frames shared
//! with the kernel) and its four single-producer single-consumer rings.
//! The only `unsafe` of the AF_XDP path lives here; everything above works
//! on safe slices of the UMEM.
//!
//! Frame life cycle: a free frame is posted on the fill ring; the kernel
//! writes a received packet into it and hands it back on the rx ring; the
//! plane rewrites it in place and it is posted on the tx ring (same frame,
//! no copy) or dropped (straight back to the fill ring); a transmitted frame
//! comes back on the completion ring and goes to the fill ring again.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// Bytes per UMEM frame.
pub const FRAME_SIZE: usize = 2048;
/// The kernel puts received data this far into a frame (XDP_PACKET_HEADROOM):
/// room for tunnel headers in front.
pub const RX_HEADROOM: usize = 256;

/// A packet descriptor of the rx and tx rings.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Desc {
    /// Offset of the packet's first byte in the UMEM.
    pub addr: u64,
    pub len: u32,
    pub options: u32,
}

/// An mmap'ed region, unmapped on drop.
struct Mapping {
    ptr: NonNull<libc::c_void>,
    len: usize,
}

impl Mapping {
    fn new(len: usize, fd: Option<(RawFd, libc::off_t)>) -> io::Result<Mapping> {
        let (flags, fd, off) = match fd {
            Some((fd, off)) => (libc::MAP_SHARED | libc::MAP_POPULATE, fd, off),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1, 0),
        };
        // SAFETY: a fresh mapping chosen by the kernel (addr NULL); nothing
        // else refers to it until this function returns it.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, off) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        NonNull::new(ptr).map(|ptr| Mapping { ptr, len }).ok_or_else(|| io::Error::other("mmap returned NULL"))
    }
}

// SAFETY: a Mapping is plain memory owned by whoever holds it; access goes
// through &/&mut of its owner.
unsafe impl Send for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the region was mapped by `Mapping::new` with this length and
        // no reference into it outlives the Mapping (borrows are tied to it).
        unsafe { libc::munmap(self.ptr.as_ptr(), self.len) };
    }
}

/// One ring: producer and consumer indices, flags and `size` entries of `T`.
struct Ring<T> {
    /// Keeps the ring mapped (the pointers below point into it).
    _map: Mapping,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    flags: *const AtomicU32,
    entries: *mut T,
    mask: u32,
}

impl<T: Copy> Ring<T> {
    fn map(fd: RawFd, off: &libc::xdp_ring_offset, size: u32, pgoff: libc::off_t) -> io::Result<Ring<T>> {
        let len = off.desc as usize + size as usize * size_of::<T>();
        let map = Mapping::new(len, Some((fd, pgoff)))?;
        let base = map.ptr.as_ptr().cast::<u8>();
        // SAFETY: the kernel's offsets lie inside the mapping it sized for
        // this ring (checked by `len` above for the entries); the indices are
        // u32 the kernel updates atomically, hence the AtomicU32 views.
        unsafe {
            Ok(Ring {
                producer: base.add(off.producer as usize).cast(),
                consumer: base.add(off.consumer as usize).cast(),
                flags: base.add(off.flags as usize).cast(),
                entries: base.add(off.desc as usize).cast(),
                mask: size - 1,
                _map: map,
            })
        }
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: points into `self.map`, alive as long as `self`.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }

    fn needs_wakeup(&self) -> bool {
        // SAFETY: as for `producer`.
        unsafe { &*self.flags }.load(Ordering::Relaxed) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Producer side: appends as many of `items` as fit; returns how many.
    fn push(&mut self, items: &[T]) -> usize {
        let prod = self.producer().load(Ordering::Relaxed);
        let cons = self.consumer().load(Ordering::Acquire);
        let free = (self.mask + 1) - prod.wrapping_sub(cons);
        let n = items.len().min(free as usize);
        for (k, item) in items[..n].iter().enumerate() {
            let slot = prod.wrapping_add(k as u32) & self.mask;
            // SAFETY: slot <= mask < ring size: inside the entries array; the
            // slot is ours (between producer and consumer + size) until the
            // producer index below is published.
            unsafe { self.entries.add(slot as usize).write(*item) };
        }
        self.producer().store(prod.wrapping_add(n as u32), Ordering::Release);
        n
    }

    /// Entries the producer may still add (only grows while we do not
    /// produce: the other side only consumes).
    fn room(&self) -> usize {
        ((self.mask + 1) - self.pending()) as usize
    }

    /// Entries produced and not yet consumed.
    fn pending(&self) -> u32 {
        self.producer().load(Ordering::Relaxed).wrapping_sub(self.consumer().load(Ordering::Acquire))
    }

    /// Consumer side: takes up to `max` entries into `out`; returns how many.
    fn pop(&mut self, out: &mut Vec<T>, max: usize) -> usize {
        let cons = self.consumer().load(Ordering::Relaxed);
        let prod = self.producer().load(Ordering::Acquire);
        let n = (prod.wrapping_sub(cons) as usize).min(max);
        for k in 0..n {
            let slot = cons.wrapping_add(k as u32) & self.mask;
            // SAFETY: slot inside the entries array; the kernel published it
            // (Acquire on the producer index) and will not reuse it until the
            // consumer index below moves past it.
            out.push(unsafe { self.entries.add(slot as usize).read() });
        }
        self.consumer().store(cons.wrapping_add(n as u32), Ordering::Release);
        n
    }
}

// SAFETY: the raw pointers point into mappings owned by the ring itself; a
// ring is used by one thread at a time (&mut self for every operation).
unsafe impl<T: Send> Send for Ring<T> {}

/// Sizes of an AF_XDP socket.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// UMEM frames (power of two).
    pub frames: u32,
    /// Entries of each ring (power of two).
    pub ring: u32,
    /// How long to keep trying to bind while the queue is another socket's
    /// (`EBUSY`): a process taking over waits for its predecessor's sockets
    /// to let go, which the kernel finishes a few milliseconds after they
    /// close. Zero: fail at once.
    pub busy_wait: std::time::Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config { frames: 4096, ring: 2048, busy_wait: std::time::Duration::ZERO }
    }
}

/// How often a bind is tried again while the queue is busy.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_millis(1);

/// An AF_XDP socket bound to one queue of one interface, with its own UMEM.
pub struct Socket {
    // Field order is drop order: rings and UMEM are unmapped before the
    // socket closes.
    fill: Ring<u64>,
    comp: Ring<u64>,
    rx: Ring<Desc>,
    tx: Ring<Desc>,
    umem: Mapping,
    fd: OwnedFd,
    /// The UMEM's memory (a memfd), which a successor maps to adopt the
    /// socket.
    umem_fd: OwnedFd,
    frames: u32,
    ring: u32,
    /// Frames owned by user space and not in use.
    free: Vec<u64>,
    /// Scratch for completions.
    done: Vec<u64>,
    pub zero_copy: bool,
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live T and its size is passed with it.
    check(unsafe {
        libc::setsockopt(fd, libc::SOL_XDP, opt, (value as *const T).cast(), size_of::<T>() as libc::socklen_t)
    })
}

/// What a process hands a successor of one socket: the socket itself,
/// its UMEM's memory and their sizes. With the frames the old process
/// held free when it stopped, the successor adopts the socket
/// ([`Socket::adopt`]): same queue binding, same rings, packets that came
/// meanwhile waiting in them.
pub struct Handed {
    pub socket: OwnedFd,
    pub umem: OwnedFd,
    pub frames: u32,
    pub ring: u32,
}

/// The UMEM's memory: a memfd mapped shared, so a successor can map the
/// same pages.
fn umem_memory(len: usize) -> io::Result<(OwnedFd, Mapping)> {
    // SAFETY: memfd_create(2) with a NUL-terminated name; returns a new
    // descriptor or -1.
    let raw = unsafe { libc::memfd_create(c"gatehouse-umem".as_ptr(), libc::MFD_CLOEXEC) };
    check(raw)?;
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate(2) on our descriptor.
    check(unsafe { libc::ftruncate(raw, len as libc::off_t) })?;
    let map = Mapping::new(len, Some((raw, 0)))?;
    Ok((fd, map))
}

/// The offsets of the socket's rings in its mmap regions.
fn mmap_offsets(raw: RawFd) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: all-zero is a valid xdp_mmap_offsets (plain integers).
    let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
    // SAFETY: `off` is writable for `len` bytes; the kernel fills it.
    check(unsafe {
        libc::getsockopt(
            raw,
            libc::SOL_XDP,
            libc::XDP_MMAP_OFFSETS,
            (&mut off as *mut libc::xdp_mmap_offsets).cast(),
            &mut len,
        )
    })?;
    if len as usize != size_of::<libc::xdp_mmap_offsets>() {
        return Err(io::Error::other("kernel without AF_XDP ring flags (needs Linux 5.4 or later)"));
    }
    Ok(off)
}

/// Binds `fd` to (`ifindex`, `queue`): zero-copy when the driver offers
/// it, copy mode otherwise. Ok(whether zero-copy).
fn bind(fd: RawFd, ifindex: u32, queue: u32) -> io::Result<bool> {
    let mut bound = Err(io::Error::other("not bound"));
    for flags in [libc::XDP_USE_NEED_WAKEUP | libc::XDP_ZEROCOPY, libc::XDP_USE_NEED_WAKEUP | libc::XDP_COPY] {
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `sa` is a valid sockaddr_xdp of the length passed.
        bound = check(unsafe {
            libc::bind(
                fd,
                (&sa as *const libc::sockaddr_xdp).cast(),
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        });
        if bound.is_ok() {
            return Ok(flags & libc::XDP_ZEROCOPY != 0);
        }
    }
    bound.map(|()| false)
}

impl Socket {
    /// Creates the socket, registers a UMEM, maps the rings and binds to
    /// (`ifindex`, `queue`). Zero-copy when the driver offers it, copy mode
    /// otherwise (veth).
    pub fn open(ifindex: u32, queue: u32, cfg: Config) -> io::Result<Socket> {
        if !cfg.frames.is_power_of_two() || !cfg.ring.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "AF_XDP frames and ring sizes must be powers of two",
            ));
        }
        // SAFETY: plain socket(2); the fd is owned at once.
        let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        check(raw)?;
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let (umem_fd, umem) = umem_memory(cfg.frames as usize * FRAME_SIZE)?;
        let reg = libc::xdp_umem_reg {
            addr: umem.ptr.as_ptr() as u64,
            len: umem.len as u64,
            chunk_size: FRAME_SIZE as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(raw, libc::XDP_UMEM_REG, &reg)?;
        for opt in [libc::XDP_UMEM_FILL_RING, libc::XDP_UMEM_COMPLETION_RING, libc::XDP_RX_RING, libc::XDP_TX_RING] {
            setsockopt(raw, opt, &cfg.ring)?;
        }
        let off = mmap_offsets(raw)?;
        let fill = Ring::map(raw, &off.fr, cfg.ring, libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t)?;
        let comp = Ring::map(raw, &off.cr, cfg.ring, libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t)?;
        let rx = Ring::map(raw, &off.rx, cfg.ring, libc::XDP_PGOFF_RX_RING)?;
        let tx = Ring::map(raw, &off.tx, cfg.ring, libc::XDP_PGOFF_TX_RING)?;
        let deadline = std::time::Instant::now() + cfg.busy_wait;
        let zero_copy = loop {
            match bind(raw, ifindex, queue) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(BUSY_RETRY);
                }
                other => break other?,
            }
        };
        if !zero_copy {
            // Copy mode sends 32 frames per kick unless told otherwise
            // (XDP_MAX_TX_SKB_BUDGET, Linux 6.17+): a bigger batch per
            // system call, and fewer wake-ups of whoever receives them.
            const XDP_MAX_TX_SKB_BUDGET: libc::c_int = 9;
            let _ = setsockopt(raw, XDP_MAX_TX_SKB_BUDGET, &(cfg.ring.min(256)));
        }
        let mut s = Socket {
            fill,
            comp,
            rx,
            tx,
            umem,
            fd,
            umem_fd,
            frames: cfg.frames,
            ring: cfg.ring,
            free: Vec::new(),
            done: Vec::new(),
            zero_copy,
        };
        s.free = (0..u64::from(cfg.frames)).map(|i| i * FRAME_SIZE as u64).collect();
        // Half the frames wait for packets; the rest are spare for tx backlog.
        let posted = s.fill.push(&s.free[s.free.len() / 2..]);
        s.free.truncate(s.free.len() - posted);
        Ok(s)
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Duplicates of the socket and its UMEM, for a process taking over.
    pub fn hand(&self) -> io::Result<Handed> {
        Ok(Handed {
            socket: self.fd.try_clone()?,
            umem: self.umem_fd.try_clone()?,
            frames: self.frames,
            ring: self.ring,
        })
    }

    /// The frames user space holds unused: what a successor adopting the
    /// socket may use (the rest are in the rings, or the kernel's).
    pub fn free_frames(&self) -> &[u64] {
        &self.free
    }

    /// Takes over a predecessor's socket (`h`), once the predecessor has
    /// stopped using it: maps its rings and UMEM; `free` are the frames it
    /// held unused. Packets it left in the receive ring, and those that
    /// came since, are received next; frames it queued for sending go out.
    pub fn adopt(h: Handed, free: Vec<u64>) -> io::Result<Socket> {
        let frames_ok = h.frames.is_power_of_two() && h.ring.is_power_of_two() && h.frames <= 1 << 20;
        let len = h.frames as usize * FRAME_SIZE;
        if !frames_ok
            || free.len() > h.frames as usize
            || free.iter().any(|&a| a % FRAME_SIZE as u64 != 0 || a as usize >= len)
        {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "the socket handed over does not add up"));
        }
        let raw = h.socket.as_raw_fd();
        let off = mmap_offsets(raw)?;
        let umem = Mapping::new(len, Some((h.umem.as_raw_fd(), 0)))?;
        let fill = Ring::map(raw, &off.fr, h.ring, libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t)?;
        let comp = Ring::map(raw, &off.cr, h.ring, libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t)?;
        let rx = Ring::map(raw, &off.rx, h.ring, libc::XDP_PGOFF_RX_RING)?;
        let tx = Ring::map(raw, &off.tx, h.ring, libc::XDP_PGOFF_TX_RING)?;
        let mut opts = libc::xdp_options { flags: 0 };
        let mut olen = size_of::<libc::xdp_options>() as libc::socklen_t;
        // SAFETY: `opts` is writable for `olen` bytes; the kernel fills it.
        check(unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_XDP,
                libc::XDP_OPTIONS,
                (&mut opts as *mut libc::xdp_options).cast(),
                &mut olen,
            )
        })?;
        Ok(Socket {
            fill,
            comp,
            rx,
            tx,
            umem,
            fd: h.socket,
            umem_fd: h.umem,
            frames: h.frames,
            ring: h.ring,
            free,
            done: Vec::new(),
            zero_copy: opts.flags & libc::XDP_OPTIONS_ZEROCOPY != 0,
        })
    }

    /// Mutable views of the frames of received packets `descs`, in order:
    /// the whole 2 KiB frame of each (the packet sits at
    /// `addr - frame_of(addr)`). None if two descriptors share a frame.
    pub fn frames(&mut self, descs: &[Desc]) -> Option<Vec<&mut [u8]>> {
        let mut starts: Vec<u64> = descs.iter().map(|d| frame_of(d.addr)).collect();
        starts.sort_unstable();
        if starts.windows(2).any(|w| w[0] == w[1])
            || starts.last().is_some_and(|&s| s as usize + FRAME_SIZE > self.umem.len)
        {
            return None;
        }
        let base = self.umem.ptr.as_ptr().cast::<u8>();
        Some(
            descs
                .iter()
                .map(|d| {
                    // SAFETY: the frame lies inside the UMEM (checked above);
                    // frames of distinct descriptors do not overlap (checked
                    // above), so the slices are disjoint; a received frame
                    // belongs to user space until it is posted again, which
                    // needs `&mut self`, so not while these borrows live.
                    unsafe { std::slice::from_raw_parts_mut(base.add(frame_of(d.addr) as usize), FRAME_SIZE) }
                })
                .collect(),
        )
    }

    /// Received packets, up to `max`, appended to `out`.
    pub fn recv(&mut self, out: &mut Vec<Desc>, max: usize) -> usize {
        self.rx.pop(out, max)
    }

    /// Whether received packets wait to be taken (a look at the ring's
    /// indices, no system call).
    pub fn has_rx(&self) -> bool {
        self.rx.pending() > 0
    }

    /// Queues packets for transmission; those that do not fit are recycled
    /// (dropped). Returns how many were queued.
    pub fn send(&mut self, descs: &[Desc]) -> usize {
        let n = self.tx.push(descs);
        for d in &descs[n..] {
            self.free.push(frame_of(d.addr));
        }
        if n > 0 && self.zero_copy && self.tx.needs_wakeup() {
            self.kick();
        } else if n > 0 && !self.zero_copy {
            // In copy mode each kick sends a bounded batch (32 frames by
            // default) then returns: kick until the ring is drained or the
            // device stops taking frames.
            for _ in 0..=self.tx.pending() / 16 {
                if !self.kick() || self.tx.pending() == 0 {
                    break;
                }
            }
        }
        n
    }

    /// The sendto(2) with no data that makes the kernel transmit the tx
    /// ring; false when it could not take more now.
    fn kick(&self) -> bool {
        // SAFETY: sendto(2) with no buffer and no address.
        let rc = unsafe { libc::sendto(self.fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT, std::ptr::null(), 0) };
        rc >= 0 || matches!(io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN))
    }

    /// Collects the frames the kernel has transmitted, posting none for
    /// receiving (for a socket that only sends).
    pub fn reclaim(&mut self) {
        self.done.clear();
        let cap = self.done.capacity().max(256);
        self.comp.pop(&mut self.done, cap);
        self.free.extend(self.done.iter().map(|&a| frame_of(a)));
    }

    /// Sends up to `n` packets, each written by `write` into a free frame
    /// (it returns the packet's length); returns how many were queued.
    pub fn transmit(&mut self, n: usize, mut write: impl FnMut(&mut [u8]) -> usize) -> usize {
        let k = n.min(self.free.len());
        let base = self.umem.ptr.as_ptr().cast::<u8>();
        let mut descs = Vec::with_capacity(k);
        for addr in self.free.drain(self.free.len() - k..) {
            // SAFETY: free frames are whole frames inside the UMEM that
            // neither the kernel nor any other slice holds; this slice is
            // dropped before the next is made and before the frame is
            // handed to the kernel below.
            let frame = unsafe { std::slice::from_raw_parts_mut(base.add(addr as usize), FRAME_SIZE) };
            let len = write(frame).min(FRAME_SIZE);
            descs.push(Desc { addr, len: len as u32, options: 0 });
        }
        self.send(&descs)
    }

    /// Gives a frame back (a dropped packet).
    pub fn recycle(&mut self, addr: u64) {
        self.free.push(frame_of(addr));
    }

    /// Collects transmitted frames and refills the fill ring; wakes the
    /// kernel's receive path when it asks to be.
    pub fn refill(&mut self) {
        self.done.clear();
        let cap = self.done.capacity().max(256);
        self.comp.pop(&mut self.done, cap);
        self.free.extend(self.done.iter().map(|&a| frame_of(a)));
        // From the tail of the free list: nothing left behind moves (a
        // socket that also sends keeps thousands of free frames).
        let start = self.free.len() - self.fill.room().min(self.free.len());
        let posted = self.fill.push(&self.free[start..]);
        self.free.drain(start..start + posted);
        if self.fill.needs_wakeup() {
            // SAFETY: recvfrom(2) with no buffer: the wake-up of the rx path.
            unsafe {
                libc::recvfrom(
                    self.fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
    }

    /// Waits up to `timeout_ms` for received packets.
    pub fn wait(&self, timeout_ms: i32) {
        let mut p = libc::pollfd { fd: self.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, timeout_ms) };
    }
}

/// How many receive queues interface `name` has (a socket per queue
/// takes all its traffic; at least 1).
pub fn rx_queues(name: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{name}/queues"))
        .map(|d| d.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("rx-")).count() as u32)
        .unwrap_or(1)
        .max(1)
}

/// `02:00:0a:ff:00:01` as bytes.
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let v: Vec<u8> = s.split(':').map(|h| u8::from_str_radix(h, 16)).collect::<Result<_, _>>().ok()?;
    <[u8; 6]>::try_from(v).ok()
}

/// The MAC address of interface `name`, as the kernel reports it.
pub fn mac_of(name: &str) -> Option<[u8; 6]> {
    parse_mac(std::fs::read_to_string(format!("/sys/class/net/{name}/address")).ok()?.trim())
}

/// The start of the frame holding UMEM offset `addr`.
pub fn frame_of(addr: u64) -> u64 {
    addr & !(FRAME_SIZE as u64 - 1)
}
