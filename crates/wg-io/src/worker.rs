//! A data-path worker: its own TUN queue and its own socket on the shared
//! port. Packets from the tunnel are read in batches straight after the
//! room for a transport header, planned under the device's lock (peer,
//! counter, key), sealed in place all at once by the batched AEAD, and
//! sent with one `sendmmsg`, runs of equal-sized datagrams to one peer as
//! one UDP GSO message. Datagrams come in with one `recvmmsg`, runs of one
//! flow as one UDP GRO buffer; transport data is planned under the lock,
//! opened in place all at once, checked under the lock again (replay
//! window, allowed IPs) and written to the tunnel from where it landed.
//! Handshake messages go to the control thread. Nothing is copied on the
//! way.

use std::fs::File;
use std::io::{ErrorKind, IoSlice, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use gatehouse_mbx::aead::{OpenJob, SealJob, TAG_LEN, open_batch, seal_batch};
use gatehouse_wg::device::{DropReason, Inbound, OpenPlan, Received, SealPlan, Transmit};
use gatehouse_wg::messages::{TRANSPORT, transport::DATA};
use gatehouse_wg::transport::{TransportError, padded_len, padded_within};

use crate::shared::{Counters, Shared, Sticky};
use gatehouse_udp::{self as udp, BATCH, GSO_SEGMENTS, Got, Outgoing};
use gatehouse_wire::offload::{self, VNET_HDR_LEN, VnetHdr};

/// One packet from the tunnel: its buffer holds the packet at [`DATA`],
/// then the whole transport message once sealed.
struct Slot {
    buf: Vec<u8>,
    /// Bytes of the packet, then of the transport message.
    len: usize,
    seal: Option<SealPlan>,
}

/// Receive buffers: each takes one datagram, or a UDP GRO run of them.
const RX_BUFFERS: usize = 32;
/// Bytes of a receive buffer: the largest GRO run the kernel makes.
const RX_BUFFER: usize = 65_536;
/// Bytes at most in one UDP GSO send.
const GSO_BYTES: usize = 65_000;
/// Bytes of the largest packet TUN hands over or takes (a GSO super-packet).
const SUPER: usize = 65_535;
/// The longest headers `offload::flow` coalesces behind: IPv6's and TCP's
/// with the most options.
const GRO_HEADERS: usize = 40 + 60;
/// Segments at most in one super-packet toward the tunnel.
const GRO_SEGMENTS: usize = 64;

/// One datagram inside a receive buffer.
struct Datagram {
    buffer: usize,
    at: Range<usize>,
    from: SocketAddr,
    /// The local address it came to.
    local: Option<IpAddr>,
    open: Option<OpenPlan>,
    /// Opened and accepted: the packet's length, to go to the tunnel.
    deliver: Option<usize>,
}

struct Worker<'a> {
    sh: &'a Shared,
    counters: &'a Counters,
    fd: i32,
    tun: File,
    slots: Vec<Slot>,
    rx: Vec<Vec<u8>>,
    got: [Got; RX_BUFFERS],
    datagrams: Vec<Datagram>,
    /// Datagrams the device made (handshakes, keepalives).
    out: Vec<Transmit>,
    /// UDP GSO works on this socket (off for good after the kernel refuses it).
    gso: bool,
    /// Where a packet from the tunnel lands, virtio header first.
    stage: Vec<u8>,
    /// Where a super-packet's virtio-net header and headers are made.
    gro: Vec<u8>,
    /// Bytes of a slot's buffer.
    slot_cap: usize,
}

pub fn run(sh: Arc<Shared>, index: usize, tun: File) {
    let socket = sh.sockets[index].clone();
    let wake = sh.wake[index].as_raw_fd();
    let cap = DATA + padded_len(sh.buffer_mtu as usize) + TAG_LEN;
    let mut w = Worker {
        sh: &sh,
        counters: &sh.counters[index],
        fd: socket.as_raw_fd(),
        tun,
        slots: (0..BATCH).map(|_| Slot { buf: vec![0u8; cap], len: 0, seal: None }).collect(),
        rx: (0..RX_BUFFERS).map(|_| vec![0u8; RX_BUFFER]).collect(),
        got: [Got::default(); RX_BUFFERS],
        datagrams: Vec::with_capacity(BATCH),
        out: Vec::new(),
        gso: true,
        stage: vec![0u8; VNET_HDR_LEN + SUPER],
        gro: vec![0u8; VNET_HDR_LEN + GRO_HEADERS],
        slot_cap: cap,
    };
    udp::enable_udp_gro(w.fd);
    udp::enable_pktinfo(w.fd, sh.v6);
    let fds = [w.tun.as_raw_fd(), w.fd, wake];
    let mut ready = [false; 3];
    // While a side filled its batch, more is likely waiting: both are read
    // again without asking poll (a read that finds nothing costs less).
    let mut busy = false;
    while !sh.stop.load(Ordering::Relaxed) {
        if busy {
            ready = [true, true, false];
        } else if let Err(e) = udp::poll_readable(&fds, 1000, &mut ready) {
            tracing::error!(interface = %sh.name, "poll: {e}");
            return;
        }
        busy = false;
        // Each side a batch per turn, so neither starves the other.
        if ready[0] {
            busy |= w.tunnel_to_network() >= BATCH;
            send_all(&sh, &socket, &mut w.out, w.counters);
        }
        if ready[1] {
            busy |= w.network_to_tunnel() >= RX_BUFFERS;
            send_all(&sh, &socket, &mut w.out, w.counters);
        }
    }
}

impl Worker<'_> {
    /// Reads packets from the TUN queue until a batch's worth of segments
    /// is in the slots (or nothing more waits): super-packets are cut into
    /// segments, partial checksums completed. Returns the slots filled.
    fn read_tunnel(&mut self) -> usize {
        let mut n = 0;
        while n < BATCH {
            let len = match self.tun.read(&mut self.stage) {
                Ok(0) => break,
                Ok(len) => len,
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => break,
                Err(_) => {
                    self.counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            };
            let Some(hdr) = VnetHdr::parse(&self.stage[..len]) else { continue };
            let pkt = &self.stage[VNET_HDR_LEN..len];
            let split = match offload::plan(&hdr, pkt) {
                Ok(s) => s,
                Err(_) => {
                    self.counters.tun_malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            };
            for i in 0..split.segments {
                if split.segment_len(pkt.len(), i) + DATA + TAG_LEN + 15 > self.slot_cap {
                    self.counters.tun_malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if n == self.slots.len() {
                    self.slots.push(Slot { buf: vec![0u8; self.slot_cap], len: 0, seal: None });
                }
                let slot = &mut self.slots[n];
                slot.len = offload::write_segment(&hdr, &split, pkt, i, &mut slot.buf[DATA..]);
                n += 1;
            }
        }
        self.counters.tun_rx_packets.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Returns how many packets were read.
    fn tunnel_to_network(&mut self) -> usize {
        let n = self.read_tunnel();
        if n == 0 {
            return 0;
        }
        let now = Instant::now();
        let batch = &mut self.slots[..n];
        {
            let mut dev = self.sh.device();
            for slot in batch.iter_mut() {
                slot.seal = match dev.plan_seal(&slot.buf[DATA..DATA + slot.len], now, &mut self.out) {
                    Ok(plan) => plan,
                    Err(d) => {
                        self.counters.drop(d);
                        None
                    }
                };
            }
        }
        // Padding stops at the MTU (as the kernel's and wireguard-go's
        // does): a full-sized packet's datagram then fits the path the MTU
        // was chosen for, and is not fragmented.
        let mtu = self.sh.settings().mtu as usize;
        let mut jobs: Vec<SealJob<'_>> = Vec::with_capacity(n);
        for slot in batch.iter_mut() {
            let Some(plan) = &slot.seal else { continue };
            let padded = padded_within(slot.len, mtu);
            slot.buf[..DATA].copy_from_slice(&plan.header);
            slot.buf[DATA + slot.len..DATA + padded].fill(0);
            slot.len = DATA + padded + TAG_LEN;
            let (data, tag) = slot.buf[DATA..slot.len].split_at_mut(padded);
            let Ok(tag) = <&mut [u8; TAG_LEN]>::try_from(tag) else { continue };
            jobs.push(SealJob { key: &plan.key.0, counter: plan.counter, data, tag });
        }
        seal_batch(&mut jobs);
        drop(jobs);
        let datagrams: Vec<Outbound<'_>> =
            batch.iter().filter_map(|s| s.seal.as_ref().map(|p| (&s.buf[..s.len], p.to, 0))).collect();
        send(self.fd, self.sh.v6, &mut self.gso, &datagrams, self.counters, &self.sh.sticky);
        n
    }

    /// Receives a batch, opens its transport data, delivers the packets.
    /// Returns how many buffers were received.
    fn network_to_tunnel(&mut self) -> usize {
        let n = {
            let mut bufs: Vec<&mut [u8]> = self.rx.iter_mut().map(|b| &mut b[..]).collect();
            udp::recv_batch(self.fd, &mut bufs, &mut self.got).unwrap_or(0)
        };
        if n == 0 {
            return 0;
        }
        self.datagrams.clear();
        for (buffer, got) in self.got.iter().enumerate().take(n) {
            let Some(from) = got.from else { continue };
            let step = if got.segment == 0 { got.len.max(1) } else { got.segment };
            let mut at = 0;
            while at < got.len {
                let end = (at + step).min(got.len);
                let local = got.to;
                self.datagrams.push(Datagram { buffer, at: at..end, from, local, open: None, deliver: None });
                at = end;
            }
        }
        self.counters.rx_datagrams.fetch_add(self.datagrams.len() as u64, Ordering::Relaxed);
        let now = Instant::now();
        {
            let mut dev = self.sh.device();
            for d in self.datagrams.iter_mut() {
                let datagram = &self.rx[d.buffer][d.at.clone()];
                if datagram.first() != Some(&TRANSPORT) {
                    // Handshakes cost Diffie-Hellman work: the control thread's.
                    hand_over(self.sh, datagram, d.from, d.local, self.counters);
                    continue;
                }
                match dev.plan_open(datagram, d.from, now, &mut self.out) {
                    Inbound::Open(plan) => d.open = Some(plan),
                    Inbound::Done(Received::Dropped(r)) => self.counters.drop(r),
                    Inbound::Done(_) => {}
                }
            }
        }
        let opened = open_all(&mut self.rx, &self.datagrams);
        {
            let mut dev = self.sh.device();
            let mut verdicts = opened.into_iter();
            // A batch is mostly one flow: the sticky map is told once per
            // change of (remote, local), not per datagram.
            let mut learnt = None;
            for d in self.datagrams.iter_mut() {
                let Some(plan) = &d.open else { continue };
                if verdicts.next() != Some(true) {
                    let decrypt = DropReason::Transport(TransportError::Decrypt);
                    self.counters.drop(decrypt);
                    dev.note_drop(plan.peer, decrypt);
                    continue;
                }
                let plain = &self.rx[d.buffer][d.at.start + DATA..d.at.end - TAG_LEN];
                match dev.finish_open(plan, plain, d.from, now, &mut self.out) {
                    Received::Packet { len, .. } => d.deliver = Some(len),
                    Received::Dropped(r) => {
                        self.counters.drop(r);
                        continue;
                    }
                    Received::Control => {}
                }
                if learnt != Some((d.from, d.local)) {
                    self.sh.sticky.learn(d.from, d.local);
                    learnt = Some((d.from, d.local));
                }
            }
        }
        self.deliver();
        n
    }

    /// Writes the opened packets to the tunnel, in order: runs of TCP
    /// segments of one flow coalesced into one super-packet (GRO), every
    /// other packet where it was opened, behind a virtio header written
    /// over the transport header it no longer needs.
    fn deliver(&mut self) {
        let mut run: Option<Run> = None;
        for k in 0..self.datagrams.len() {
            let Some(len) = self.datagrams[k].deliver else { continue };
            let (buffer, start) = (self.datagrams[k].buffer, self.datagrams[k].at.start + DATA);
            let pkt = &self.rx[buffer][start..start + len];
            let flow = offload::flow(pkt);
            if let (Some(r), Some(f)) = (&mut run, &flow) {
                let first = &self.rx[r.buffer][r.start..r.start + r.len];
                if !r.short
                    && r.parts.len() < GRO_SEGMENTS
                    && r.bytes + f.payload() <= SUPER
                    && offload::continues(first, &r.flow, r.so_far, pkt, f)
                {
                    r.parts.push(k);
                    r.so_far += f.payload();
                    r.bytes += f.payload();
                    r.short = f.payload() < r.flow.payload();
                    r.last_flags = f.flags();
                    continue;
                }
            }
            if let Some(r) = run.take() {
                self.flush(r);
            }
            match flow {
                Some(f) => {
                    run = Some(Run {
                        buffer,
                        start,
                        len,
                        flow: f,
                        parts: vec![k],
                        so_far: f.payload(),
                        bytes: len,
                        short: false,
                        last_flags: f.flags(),
                    });
                }
                None => self.write_one(k),
            }
        }
        if let Some(r) = run.take() {
            self.flush(r);
        }
    }

    /// Writes datagram `k`'s packet as it is.
    fn write_one(&mut self, k: usize) {
        let d = &self.datagrams[k];
        let Some(len) = d.deliver else { return };
        let start = d.at.start + DATA;
        let buf = &mut self.rx[d.buffer];
        VnetHdr::default().write(&mut buf[start - VNET_HDR_LEN..start]);
        let out = &buf[start - VNET_HDR_LEN..start + len];
        let ok = matches!(self.tun.write(out), Ok(k) if k == out.len());
        self.count_write(ok, 1);
    }

    /// Writes a run: one packet as it is, more as one super-packet. Its
    /// virtio-net header and headers are made in `gro`; the payloads stay
    /// where they were opened, and the kernel gathers them (`writev`) in
    /// the one copy it makes anyway.
    fn flush(&mut self, r: Run) {
        if r.parts.len() == 1 {
            return self.write_one(r.parts[0]);
        }
        let headers = r.flow.headers;
        let first = &self.rx[r.buffer][r.start..r.start + r.len];
        let mut pieces = Vec::with_capacity(r.parts.len() + 1);
        pieces.push(&first[headers..]);
        for &k in &r.parts[1..] {
            let d = &self.datagrams[k];
            let (Some(len), start) = (d.deliver, d.at.start + DATA) else { continue };
            pieces.push(&self.rx[d.buffer][start + headers..start + len]);
        }
        let Some(head) = self.gro.get_mut(..VNET_HDR_LEN + headers) else {
            // Longer headers than offload::flow takes: one by one.
            return r.parts.iter().for_each(|&k| self.write_one(k));
        };
        head[VNET_HDR_LEN..].copy_from_slice(&first[..headers]);
        let hdr = offload::finish_headers(&mut head[VNET_HDR_LEN..], r.bytes, &r.flow, r.last_flags);
        hdr.write(&mut head[..VNET_HDR_LEN]);
        let iov: Vec<IoSlice<'_>> = std::iter::once(IoSlice::new(&self.gro[..VNET_HDR_LEN + headers]))
            .chain(pieces.iter().map(|p| IoSlice::new(p)))
            .collect();
        let ok = matches!(self.tun.write_vectored(&iov), Ok(k) if k == VNET_HDR_LEN + r.bytes);
        self.count_write(ok, r.parts.len());
    }

    fn count_write(&self, ok: bool, packets: usize) {
        let c = if ok { &self.counters.tun_tx_packets } else { &self.counters.tx_errors };
        c.fetch_add(packets as u64, Ordering::Relaxed);
    }
}

/// Segments of one TCP flow gathered to go to the tunnel as one.
struct Run {
    /// Where the first segment is.
    buffer: usize,
    start: usize,
    len: usize,
    flow: offload::Flow,
    /// The datagrams whose packets make it, in order.
    parts: Vec<usize>,
    /// Payload bytes so far.
    so_far: usize,
    /// Bytes of the super-packet so far.
    bytes: usize,
    /// The last segment was shorter: nothing may follow it.
    short: bool,
    last_flags: u8,
}

/// Opens, in place and in one batch, every datagram with a plan; returns
/// whether each opened, in order.
fn open_all(rx: &mut [Vec<u8>], datagrams: &[Datagram]) -> Vec<bool> {
    let mut jobs: Vec<OpenJob<'_>> = Vec::with_capacity(datagrams.len());
    let mut next = 0;
    for (b, buf) in rx.iter_mut().enumerate() {
        // This buffer's datagrams, in order: split off one after another.
        let mut rest: &mut [u8] = buf;
        let mut consumed = 0;
        while let Some(d) = datagrams.get(next).filter(|d| d.buffer == b) {
            next += 1;
            let tail = std::mem::take(&mut rest);
            let (_, tail) = tail.split_at_mut(d.at.start - consumed);
            let (this, tail) = tail.split_at_mut(d.at.len());
            rest = tail;
            consumed = d.at.end;
            let Some(plan) = &d.open else { continue };
            let (data, tag) = this[DATA..].split_at_mut(d.at.len() - DATA - TAG_LEN);
            let Ok(tag) = <&[u8; TAG_LEN]>::try_from(&*tag) else { continue };
            jobs.push(OpenJob { key: &plan.key.0, counter: plan.counter, data, tag, ok: false });
        }
    }
    open_batch(&mut jobs);
    jobs.iter().map(|j| j.ok).collect()
}

/// A datagram to send: its bytes, where to, and the ECN bits of its IP
/// header (0: Not-ECT).
pub(crate) type Outbound<'a> = (&'a [u8], SocketAddr, u8);

/// Groups `datagrams` into messages: runs to one destination with the same
/// ECN bits, every datagram but the last of a run as long as the first
/// (UDP GSO), when `gso`; else one message each. Each group: its range,
/// its destination and its ECN bits.
fn group(datagrams: &[Outbound<'_>], gso: bool) -> Vec<(Range<usize>, SocketAddr, u8)> {
    let mut groups: Vec<(Range<usize>, SocketAddr, u8)> = Vec::new();
    let mut bytes = 0;
    for (i, &(d, to, ecn)) in datagrams.iter().enumerate() {
        if let Some((r, gto, gecn)) = groups.last_mut() {
            let first = datagrams[r.start].0.len();
            let last_was_short = datagrams[r.end - 1].0.len() < first;
            if gso
                && *gto == to
                && *gecn == ecn
                && d.len() <= first
                && !last_was_short
                && r.len() < GSO_SEGMENTS
                && bytes + d.len() <= GSO_BYTES
            {
                r.end = i + 1;
                bytes += d.len();
                continue;
            }
        }
        groups.push((i..i + 1, to, ecn));
        bytes = d.len();
    }
    groups
}

/// Sends datagrams the device made (handshakes, keepalives, queued
/// packets) on `socket`, each from its peer's sticky source.
pub(crate) fn send_all(
    sh: &Shared,
    socket: &UdpSocket,
    out: &mut Vec<gatehouse_wg::device::Transmit>,
    counters: &Counters,
) {
    if out.is_empty() {
        return;
    }
    let datagrams: Vec<Outbound<'_>> = out.iter().map(|t| (t.datagram.as_slice(), t.to, 0)).collect();
    let mut gso = false;
    send(socket.as_raw_fd(), sh.v6, &mut gso, &datagrams, counters, &sh.sticky);
    drop(datagrams);
    out.clear();
}

/// Sends every datagram, again where the kernel took only some, each
/// from the local address its peer last reached us at (`sticky`). A GSO
/// message the kernel refuses turns GSO off for the socket and goes as
/// separate datagrams; a source address the kernel refuses (it went away)
/// is forgotten and the datagrams go from the route's; a datagram it
/// refuses is counted and skipped.
pub(crate) fn send(
    fd: i32,
    v6: bool,
    gso: &mut bool,
    datagrams: &[Outbound<'_>],
    counters: &Counters,
    sticky: &Sticky,
) {
    let parts: Vec<&[u8]> = datagrams.iter().map(|(d, _, _)| *d).collect();
    let with_source = |g: Vec<(Range<usize>, SocketAddr, u8)>| -> Vec<Message> {
        g.into_iter().map(|(range, to, ecn)| Message { range, to, ecn, from: sticky.get(to) }).collect()
    };
    let mut groups = with_source(group(datagrams, *gso));
    let mut at = 0;
    while at < groups.len() {
        let msgs: Vec<Outgoing<'_>> = groups[at..]
            .iter()
            .map(|m| Outgoing { parts: &parts[m.range.clone()], to: m.to, from: m.from, ecn: m.ecn })
            .collect();
        match udp::send_batch(fd, v6, &msgs) {
            Ok(k) => {
                let sent: usize = groups[at..at + k].iter().map(|m| m.range.len()).sum();
                counters.tx_datagrams.fetch_add(sent as u64, Ordering::Relaxed);
                at += k.max(1);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // The socket's buffer is full: wait for room once, briefly.
                let mut ready = [false];
                let _ = udp::poll_writable(fd, 10, &mut ready);
                if !ready[0] {
                    let left: usize = groups[at..].iter().map(|m| m.range.len()).sum();
                    counters.tx_errors.fetch_add(left as u64, Ordering::Relaxed);
                    return;
                }
            }
            Err(_) if groups[at].from.is_some() => {
                // The address is gone (or never could be a source here).
                sticky.forget(groups[at].to);
                groups[at].from = None;
            }
            Err(e) if groups[at].range.len() > 1 => {
                // The kernel or the route has no UDP GSO: never again here.
                tracing::info!("UDP GSO refused ({e}); sending datagrams one by one");
                *gso = false;
                let base = groups[at].range.start;
                let rest: Vec<Outbound<'_>> = datagrams[base..].to_vec();
                groups.truncate(at);
                groups.extend(group(&rest, false).into_iter().map(|(r, to, ecn)| Message {
                    range: r.start + base..r.end + base,
                    to,
                    ecn,
                    from: None,
                }));
            }
            Err(_) => {
                // The first one failed (no route, refused): skip it.
                counters.tx_errors.fetch_add(groups[at].range.len() as u64, Ordering::Relaxed);
                at += 1;
            }
        }
    }
}

/// One message of [`send`]: a run of its datagrams, their destination
/// and ECN bits, and the source address to send them from.
struct Message {
    range: Range<usize>,
    to: SocketAddr,
    ecn: u8,
    from: Option<IpAddr>,
}

/// Queues a handshake message for the control thread, or drops it when
/// the queue is full (the device is then under load and asks for cookies).
pub(crate) fn hand_over(sh: &Shared, datagram: &[u8], src: SocketAddr, local: Option<IpAddr>, counters: &Counters) {
    sh.queued.fetch_add(1, Ordering::Relaxed);
    if sh.handshakes.try_send((datagram.to_vec(), src, local)).is_err() {
        sh.queued.fetch_sub(1, Ordering::Relaxed);
        counters.handshake_queue_full.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_to_one_peer_of_one_size_make_one_gso_message() {
        let (p, q): (SocketAddr, SocketAddr) = (([10, 0, 0, 1], 1).into(), ([10, 0, 0, 2], 1).into());
        let big: &'static [u8] = Box::leak(Box::new([0u8; 100]));
        let small: &'static [u8] = Box::leak(Box::new([0u8; 40]));
        let d = |b: &'static [u8], to| (b, to, 0);
        let list = [d(big, p), d(big, p), d(small, p), d(big, p), d(big, q), d(small, q), d(small, q)];
        let g = group(&list, true);
        assert_eq!(g, vec![(0..3, p, 0), (3..4, p, 0), (4..6, q, 0), (6..7, q, 0)]);
        assert_eq!(group(&list, false).len(), 7);
        // ECN bits differ: another message (they are set per message).
        let marked = [(big, p, 0), (big, p, 2), (big, p, 2), (big, p, 0)];
        assert_eq!(group(&marked, true), vec![(0..1, p, 0), (1..3, p, 2), (3..4, p, 0)]);
        let many: Vec<Outbound<'_>> = (0..150).map(|_| (big, p, 0)).collect();
        let g = group(&many, true);
        assert_eq!(g.iter().map(|(r, _, _)| r.len()).collect::<Vec<_>>(), [64, 64, 22]);
    }
}
