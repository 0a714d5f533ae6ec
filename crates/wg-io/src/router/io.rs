//! A router-mode worker: one queue of each NIC. A vector from the LAN
//! socket is sealed in its frames and copied into the WAN socket's; a
//! vector from the WAN socket is opened in its frames and copied into the
//! LAN socket's. The worker also reads the interface's kernel UDP socket,
//! where what the XDP program leaves to the kernel arrives (outer
//! fragments the kernel reassembled, queues without a socket): handshakes
//! go to the control thread, transport data through the same open path.
//!
//! Sealed datagrams leave through that kernel socket instead of the WAN's
//! AF_XDP socket when the latter runs in copy mode (veth, and drivers
//! without zero-copy AF_XDP): there every AF_XDP frame sent costs the
//! kernel a socket buffer of its own anyway, where one UDP GSO send of a
//! run of datagrams to one peer costs it one (`worker::send`, as TUN mode
//! sends). The datagrams are the ones the pipeline framed, with their
//! destination and ECN bits read back from the headers it wrote.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gatehouse_link::xsk::{self, Desc, Socket};
use gatehouse_udp::{self as udp, Got};
use gatehouse_wg::messages::transport::DATA;
use gatehouse_wire::field::{ethernet, ipv4, ipv6, udp as udpf};
use gatehouse_wire::packet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_UDP};

use super::handover::Frames;
use super::lan_tx::LanTx;
use super::pipeline::{WanSender, open_vector, seal_vector};
use super::runtime::{Lane, RouterShared};
use super::steer::Nic;
use super::{Counts, Extra, Fate, Frame, Router, VECTOR};
use crate::shared::{Counters, Shared};
use crate::worker::{Outbound, hand_over, send, send_all};

/// Wake-ups closer together than this mean frames are streaming in.
const HOT: Duration = Duration::from_micros(200);
/// How long a streaming worker lets frames gather before reading (at most
/// the latency it adds; the rings hold thousands of frames): from the
/// shortest, doubled while reads find less than half a vector and halved
/// when they find a whole one, as a NIC's adaptive interrupt moderation
/// does: under a steady stream it settles where a read fills half a
/// vector or more (two or more groups of the sixteen AEAD lanes), within
/// the same bound on the latency it adds. Every read ends in a send of its
/// own, and each send costs the kernel a transmit and a wake-up of the
/// receiver.
const LINGER_MIN: Duration = Duration::from_micros(50);
const LINGER_MAX: Duration = Duration::from_micros(200);
/// How often a worker publishes its counters.
const PUBLISH: Duration = Duration::from_millis(100);
/// Datagrams read from the kernel socket per turn.
const KERNEL_BATCH: usize = 16;
/// Room for a datagram the kernel delivered, framed.
const KERNEL_BUFFER: usize = 2048;

struct Worker<'a> {
    sh: &'a Shared,
    /// The interface's kernel UDP socket of this worker.
    socket: &'a std::net::UdpSocket,
    /// Whether that socket may still send with UDP GSO.
    gso: bool,
    /// What `worker::send` counts: its errors go on to `counters`; what
    /// it sent is counted as sealed already.
    kernel_sends: Counters,
    rt: &'a RouterShared,
    counters: &'a Counters,
    index: usize,
    lane: Lane,
    descs: Vec<Desc>,
    fates: Vec<Fate>,
    extra: Extra,
    counts: Counts,
    /// What was last added to the shared atomics (they take differences).
    published: Counts,
    kernel: Vec<Vec<u8>>,
    got: Vec<Got>,
}

/// Runs worker `index` until the interface stops.
pub fn run(sh: Arc<Shared>, index: usize, lane: Lane) {
    let Some(rt) = sh.router.as_ref() else { return };
    let socket = sh.sockets[index.min(sh.sockets.len() - 1)].clone();
    let mut w = Worker {
        sh: &sh,
        socket: &socket,
        gso: true,
        kernel_sends: Counters::default(),
        rt,
        counters: &sh.counters[index],
        index,
        lane,
        descs: Vec::with_capacity(VECTOR),
        fates: Vec::with_capacity(VECTOR),
        extra: Extra::default(),
        counts: Counts::default(),
        published: Counts::default(),
        kernel: (0..KERNEL_BATCH).map(|_| vec![0u8; KERNEL_BUFFER]).collect(),
        got: vec![Got::default(); KERNEL_BATCH],
    };
    udp::enable_pktinfo(socket.as_raw_fd(), sh.v6);
    let fds = [w.lane.lan.fd(), w.lane.wan.fd(), socket.as_raw_fd(), sh.wake[index].as_raw_fd()];
    let mut ready = [false; 4];
    // A full vector came: more is waiting, read again at once.
    let mut busy = false;
    // Frames keep coming close together: let a few gather before the next
    // read, as a NIC's interrupt moderation does, rather than wake per frame.
    let mut linger = false;
    let mut linger_for = LINGER_MIN;
    let mut last_wake = Instant::now() - HOT;
    let mut last_publish = Instant::now();
    while !sh.stop.load(Ordering::Relaxed) {
        if busy {
            ready = [true, true, false, false];
        } else if linger {
            std::thread::sleep(linger_for);
            ready = [true, true, false, false];
        } else {
            // Frames sent may come back to be reused while nothing arrives.
            w.lane.lan.refill();
            w.lane.wan.refill();
            if let Err(e) = udp::poll_readable(&fds, 100, &mut ready) {
                tracing::error!(interface = %sh.name, "poll: {e}");
                return;
            }
            // A wake-up soon after the last: the frame that woke us has
            // company on its way; a lone one is read at once.
            linger = last_wake.elapsed() < HOT;
            last_wake = Instant::now();
            if linger && (ready[0] || ready[1]) {
                std::thread::sleep(linger_for);
                ready[0] = true;
                ready[1] = true;
            }
        }
        let view = rt.view.load();
        let (lan, wan) =
            (if ready[0] { w.side(&view, Nic::Lan) } else { 0 }, if ready[1] { w.side(&view, Nic::Wan) } else { 0 });
        busy = lan >= VECTOR || wan >= VECTOR;
        if linger && lan + wan > 0 {
            linger_for = next_linger(linger_for, lan.max(wan));
            last_wake = Instant::now();
            // Lingering again pays only if frames came while this vector
            // was worked on: after a burst the next linger would find
            // nothing and cost a wake-up for it (tens of µs of CPU in a
            // VM); a frame that comes later wakes the poll, hot, and
            // lingers then.
            linger = w.lane.lan.has_rx() || w.lane.wan.has_rx();
        } else {
            linger = false;
        }
        if ready[2] {
            w.kernel_socket(&view, &socket);
        }
        send_all(&sh, &socket, &mut w.extra.transmits, w.counters);
        if last_publish.elapsed() >= PUBLISH {
            last_publish = Instant::now();
            w.publish();
        }
    }
    w.publish();
    // For a process taking over, which adopts the sockets: the frames
    // that are in no ring.
    let queue = index as u32;
    let mut exported = super::runtime::lock(&rt.exported);
    exported.push(Frames { nic: Nic::Lan, queue, free: w.lane.lan.free_frames().to_vec() });
    exported.push(Frames { nic: Nic::Wan, queue, free: w.lane.wan.free_frames().to_vec() });
}

/// The next linger after one whose read found `frames` on the busier side.
pub(super) fn next_linger(now: Duration, frames: usize) -> Duration {
    if frames < VECTOR / 2 {
        (now * 2).min(LINGER_MAX)
    } else if frames >= VECTOR {
        (now / 2).max(LINGER_MIN)
    } else {
        now
    }
}

/// Bytes of outer headers at most that sealing writes in front of a
/// frame's inner packet (Ethernet, IPv6, UDP and the transport header,
/// less the inner Ethernet header they replace).
const OUTER_IN_FRONT: usize = ethernet::HEADER_LEN + ipv6::HEADER_LEN + udpf::HEADER_LEN + DATA - ethernet::HEADER_LEN;

/// Reads a byte of each frame's first cache line (and, for sealing, of the
/// lines in front of it, where the outer headers go), all before any frame
/// is worked on. The kernel wrote the frames on another CPU, and the lines
/// in front of them last held a packet long ago: taken one frame after
/// another, each first touch waited out its own miss (on a 2-core Xeon VM,
/// 71% of this function's own samples sat on the first read of a frame's
/// EtherType, and 79% of `frame_outer`'s on its first read of the outer
/// header). Loads with nothing between them overlap their misses.
fn warm(frames: &[Frame<'_>], from: Nic) {
    let mut x = 0u8;
    for f in frames {
        x ^= f.mem.get(f.head).copied().unwrap_or(0);
        if from == Nic::Lan {
            x ^= f.mem.get(f.head.saturating_sub(OUTER_IN_FRONT)).copied().unwrap_or(0);
            x ^= f.mem.get(f.head.saturating_sub(1)).copied().unwrap_or(0);
        }
    }
    std::hint::black_box(x);
}

impl Worker<'_> {
    /// Takes a vector from one side's socket through its path and out of
    /// the other side's; returns how many frames came.
    fn side(&mut self, view: &Router, from: Nic) -> usize {
        let lan_tx = &mut self.lane.lan_tx;
        let (rx, tx) = match from {
            Nic::Lan => (&mut self.lane.lan, &mut self.lane.wan),
            Nic::Wan => (&mut self.lane.wan, &mut self.lane.lan),
        };
        rx.refill();
        self.descs.clear();
        let n = rx.recv(&mut self.descs, VECTOR);
        if n == 0 {
            return 0;
        }
        self.extra.clear_vector();
        let now = Instant::now();
        if let Some(mems) = rx.frames(&self.descs) {
            let mut frames: Vec<Frame<'_>> = mems
                .into_iter()
                .zip(&self.descs)
                .map(|(mem, d)| Frame { mem, head: (d.addr - xsk::frame_of(d.addr)) as usize, len: d.len as usize })
                .collect();
            warm(&frames, from);
            match from {
                Nic::Lan => seal_vector(
                    view,
                    if tx.zero_copy { WanSender::Frames } else { WanSender::Kernel },
                    &self.sh.device,
                    &mut frames,
                    &mut self.fates,
                    &mut self.extra,
                    &mut self.counts,
                    now,
                ),
                Nic::Wan => open_vector(
                    view,
                    &self.sh.device,
                    &mut frames,
                    &mut self.fates,
                    &mut self.extra,
                    &mut self.counts,
                    now,
                ),
            }
            let out = sent(&frames, &self.fates);
            match from {
                Nic::Lan if !tx.zero_copy => {
                    let datagrams: Vec<Outbound<'_>> = out.iter().filter_map(|f| datagram_of(f)).collect();
                    let mut lost = (out.len() - datagrams.len()) as u64;
                    let (fd, c) = (self.socket.as_raw_fd(), &self.kernel_sends);
                    send(fd, self.sh.v6, &mut self.gso, &datagrams, c, &self.sh.sticky);
                    lost += c.tx_errors.swap(0, Ordering::Relaxed);
                    c.tx_datagrams.store(0, Ordering::Relaxed);
                    if lost > 0 {
                        self.counters.tx_errors.fetch_add(lost, Ordering::Relaxed);
                    }
                }
                Nic::Lan => copy_out(tx, &out, self.counters),
                Nic::Wan => to_lan(tx, lan_tx, &out, self.counters),
            }
        }
        for d in &self.descs {
            rx.recycle(d.addr);
        }
        self.finish_extra();
        n
    }

    /// Sends and hands over what a vector left besides its frames.
    fn finish_extra(&mut self) {
        let lan: Vec<&[u8]> = self.extra.to_lan.iter().map(Vec::as_slice).collect();
        to_lan(&mut self.lane.lan, &mut self.lane.lan_tx, &lan, self.counters);
        let to_wan: Vec<&[u8]> = self.extra.to_wan.iter().map(Vec::as_slice).collect();
        copy_out(&mut self.lane.wan, &to_wan, self.counters);
        for (datagram, from, local) in self.extra.handshakes.drain(..) {
            hand_over(self.sh, &datagram, from, local, self.counters);
        }
        if !self.extra.resolve_lan.is_empty() || !self.extra.resolve_wan.is_empty() {
            let mut r = self.rt.resolve.lock().unwrap_or_else(|e| e.into_inner());
            r.extend(self.extra.resolve_lan.drain(..).map(|a| (Nic::Lan, a)));
            r.extend(self.extra.resolve_wan.drain(..).map(|a| (Nic::Wan, a)));
        }
    }

    /// Datagrams the kernel delivered to the port (not steered): framed
    /// as the WAN would have handed them over, and opened the same way.
    fn kernel_socket(&mut self, view: &Router, socket: &std::net::UdpSocket) {
        let n = {
            let mut bufs: Vec<&mut [u8]> = self.kernel.iter_mut().map(|b| &mut b[256..]).collect();
            udp::recv_batch(socket.as_raw_fd(), &mut bufs, &mut self.got).unwrap_or(0)
        };
        if n == 0 {
            return;
        }
        let mut lens = Vec::with_capacity(n);
        for (buf, got) in self.kernel.iter_mut().zip(&self.got).take(n) {
            // One datagram per buffer (no GRO on this socket).
            let (Some(from), Some(to)) = (got.from, got.to) else {
                lens.push(None);
                continue;
            };
            lens.push(frame_datagram(buf, got.len, from, SocketAddr::new(to, view.port)));
        }
        self.extra.clear_vector();
        let mut frames: Vec<Frame<'_>> = self
            .kernel
            .iter_mut()
            .zip(&lens)
            .filter_map(|(b, l)| l.map(|(head, len)| Frame { mem: &mut b[..], head, len }))
            .collect();
        open_vector(
            view,
            &self.sh.device,
            &mut frames,
            &mut self.fates,
            &mut self.extra,
            &mut self.counts,
            Instant::now(),
        );
        to_lan(&mut self.lane.lan, &mut self.lane.lan_tx, &sent(&frames, &self.fates), self.counters);
        self.finish_extra();
    }

    /// Adds what changed since the last time to the interface's shared
    /// counters (metrics read those) and publishes the whole set.
    fn publish(&mut self) {
        if let Some(t) = &self.lane.lan_tx {
            (self.counts.super_frames, self.counts.coalesced) = (t.super_frames, t.coalesced);
        }
        let (c, p) = (&self.counts, &self.published);
        self.counters.rx_datagrams.fetch_add(c.wan_rx - p.wan_rx, Ordering::Relaxed);
        self.counters.tx_datagrams.fetch_add(c.sealed - p.sealed, Ordering::Relaxed);
        self.counters.tun_rx_packets.fetch_add(c.lan_rx - p.lan_rx, Ordering::Relaxed);
        self.counters.tun_tx_packets.fetch_add(c.opened - p.opened, Ordering::Relaxed);
        for (slot, (now, was)) in c.device.iter().zip(p.device).enumerate() {
            if *now > was {
                self.counters.drops[slot].fetch_add(now - was, Ordering::Relaxed);
            }
        }
        self.published = c.clone();
        if let Some(slot) = self.rt.counts.get(self.index) {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = c.clone();
        }
    }
}

/// The bytes of every frame the pipeline marked to send, in order.
fn sent<'f>(frames: &'f [Frame<'_>], fates: &[Fate]) -> Vec<&'f [u8]> {
    frames
        .iter()
        .zip(fates)
        .filter_map(|(f, fate)| match *fate {
            Fate::Send { head, len } => f.mem.get(head..head + len),
            _ => None,
        })
        .collect()
}

/// The UDP payload of a frame the seal path made (Ethernet, IPv4 without
/// options or IPv6 without extension headers, UDP), its destination and
/// the ECN bits of its IP header.
pub fn datagram_of(frame: &[u8]) -> Option<Outbound<'_>> {
    let ether = u16::from_be_bytes(frame.get(ethernet::ETHERTYPE..ethernet::ETHERTYPE + 2)?.try_into().ok()?);
    let ip = frame.get(ethernet::HEADER_LEN..)?;
    let (dst, ecn, at): (IpAddr, u8, usize) = match ether {
        ETHERTYPE_IPV4 if ip.len() >= ipv4::MIN_HEADER_LEN && ip[0] == 0x45 && ip[ipv4::PROTOCOL] == PROTO_UDP => {
            let d: [u8; 4] = ip[ipv4::DST..ipv4::DST + 4].try_into().ok()?;
            (d.into(), ip[1] & 3, ipv4::MIN_HEADER_LEN)
        }
        ETHERTYPE_IPV6 if ip.len() >= ipv6::HEADER_LEN && ip[0] >> 4 == 6 && ip[ipv6::NEXT_HEADER] == PROTO_UDP => {
            let d: [u8; 16] = ip[ipv6::DST..ipv6::DST + 16].try_into().ok()?;
            (d.into(), (ip[1] >> 4) & 3, ipv6::HEADER_LEN)
        }
        _ => return None,
    };
    let u = ip.get(at..at + udpf::HEADER_LEN)?;
    let port = u16::from_be_bytes([u[udpf::DST_PORT], u[udpf::DST_PORT + 1]]);
    let len = usize::from(u16::from_be_bytes([u[udpf::LENGTH], u[udpf::LENGTH + 1]]));
    let payload = ip.get(at + udpf::HEADER_LEN..at + len.max(udpf::HEADER_LEN))?;
    Some((payload, SocketAddr::new(dst, port), ecn))
}

/// Sends frames on the LAN: through the coalescing sender where there is
/// one (the AF_XDP socket copies), else by the AF_XDP socket.
fn to_lan(lan: &mut Socket, lan_tx: &mut Option<LanTx>, frames: &[&[u8]], counters: &Counters) {
    match lan_tx {
        Some(t) => {
            let lost = t.send(frames);
            if lost > 0 {
                counters.tx_errors.fetch_add(lost as u64, Ordering::Relaxed);
            }
        }
        None => copy_out(lan, frames, counters),
    }
}

/// Copies frames into free frames of `tx` and sends them; what finds no
/// free frame is counted as a transmit error.
fn copy_out(tx: &mut Socket, frames: &[&[u8]], counters: &Counters) {
    if frames.is_empty() {
        return;
    }
    let mut next = frames.iter();
    let sent = tx.transmit(frames.len(), |mem| match next.next() {
        Some(f) => {
            let len = f.len().min(mem.len());
            mem[..len].copy_from_slice(&f[..len]);
            len
        }
        None => 0,
    });
    let short = frames.len().saturating_sub(sent);
    if short > 0 {
        counters.tx_errors.fetch_add(short as u64, Ordering::Relaxed);
    }
}

/// Writes Ethernet, IP and UDP headers in front of a datagram that lies at
/// 256 in `buf` (`len` bytes, from `from` to `to`); returns where the
/// frame starts and its length.
fn frame_datagram(buf: &mut [u8], len: usize, from: SocketAddr, to: SocketAddr) -> Option<(usize, usize)> {
    let at = 256;
    let (from, to) = match (from.ip(), to.ip()) {
        // A dual-stack socket reports IPv4 peers as mapped addresses.
        (IpAddr::V6(f), IpAddr::V6(t)) => match (f.to_ipv4_mapped(), t.to_ipv4_mapped()) {
            (Some(f4), Some(t4)) => (SocketAddr::new(f4.into(), from.port()), SocketAddr::new(t4.into(), to.port())),
            _ => (from, to),
        },
        _ => (from, to),
    };
    let v6 = from.is_ipv6();
    let ip_len = if v6 { ipv6::HEADER_LEN } else { ipv4::MIN_HEADER_LEN };
    let head = at - udpf::HEADER_LEN - ip_len - ethernet::HEADER_LEN;
    let udp_len = u16::try_from(udpf::HEADER_LEN + len).ok()?;
    let u = &mut buf[at - udpf::HEADER_LEN..at];
    u[..2].copy_from_slice(&from.port().to_be_bytes());
    u[2..4].copy_from_slice(&to.port().to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    u[6..8].fill(0);
    let ip = &mut buf[at - udpf::HEADER_LEN - ip_len..at - udpf::HEADER_LEN];
    match (from.ip(), to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            ip.copy_from_slice(&[0x45, 0, 0, 0, 0, 0, 0, 0, 64, PROTO_UDP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            ip[ipv4::TOTAL_LEN..ipv4::TOTAL_LEN + 2].copy_from_slice(&(udp_len + 20).to_be_bytes());
            ip[ipv4::SRC..ipv4::SRC + 4].copy_from_slice(&s.octets());
            ip[ipv4::DST..ipv4::DST + 4].copy_from_slice(&d.octets());
            let c = gatehouse_wire::checksum::checksum(ip);
            ip[ipv4::CHECKSUM..ipv4::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            ip.fill(0);
            ip[0] = 0x60;
            ip[ipv6::PAYLOAD_LEN..ipv6::PAYLOAD_LEN + 2].copy_from_slice(&udp_len.to_be_bytes());
            ip[ipv6::NEXT_HEADER] = PROTO_UDP;
            ip[ipv6::HOP_LIMIT] = 64;
            ip[ipv6::SRC..ipv6::SRC + 16].copy_from_slice(&s.octets());
            ip[ipv6::DST..ipv6::DST + 16].copy_from_slice(&d.octets());
        }
        _ => return None,
    }
    let e = &mut buf[head..head + ethernet::HEADER_LEN];
    e[..12].fill(0);
    let kind = if v6 { ETHERTYPE_IPV6 } else { ETHERTYPE_IPV4 };
    e[12..14].copy_from_slice(&kind.to_be_bytes());
    Some((head, at + len - head))
}
