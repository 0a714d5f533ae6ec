//! A data-path worker: its own TUN queue and its own socket on the shared
//! port. Packets from the tunnel are read in batches straight after the
//! room for a transport header, planned under the device's lock (peer,
//! counter, key), sealed in place all at once by the batched AEAD, and
//! sent with one `sendmmsg`. Datagrams come in with one `recvmmsg`,
//! transport data is planned under the lock, opened in place all at once,
//! checked under the lock again (replay window, allowed IPs) and written
//! to the tunnel from where it was received. Handshake messages go to the
//! control thread. Nothing is copied on the way.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use gatehouse_mbx::aead::{OpenJob, SealJob, TAG_LEN, open_batch, seal_batch};
use gatehouse_wg::device::{DropReason, Inbound, OpenPlan, Received, SealPlan, Transmit};
use gatehouse_wg::messages::{TRANSPORT, transport::DATA};
use gatehouse_wg::transport::TransportError;
use gatehouse_wg::transport::padded_len;

use crate::interface::{Counters, Shared};
use crate::sys::{self, BATCH};

/// One packet's place in a batch: its buffer holds a transport message
/// (header, data padded to 16, tag), or the packet at [`DATA`] before
/// sealing.
struct Slot {
    buf: Vec<u8>,
    /// Bytes of the packet (from the tunnel) or the datagram (from the
    /// network); after opening, of the packet inside.
    len: usize,
    from: Option<SocketAddr>,
    seal: Option<SealPlan>,
    open: Option<OpenPlan>,
    /// Opened and accepted: to be written to the tunnel.
    deliver: bool,
}

struct Slots(Vec<Slot>);

impl Slots {
    fn new(mtu: u32) -> Slots {
        let cap = DATA + padded_len(mtu as usize) + TAG_LEN;
        Slots(
            (0..BATCH)
                .map(|_| Slot { buf: vec![0u8; cap], len: 0, from: None, seal: None, open: None, deliver: false })
                .collect(),
        )
    }
}

pub fn run(sh: Arc<Shared>, index: usize, mut tun: File) {
    let socket = sh.sockets[index].clone();
    let counters = &sh.counters[index];
    let wake = sh.wake[index].as_raw_fd();
    let fds = [tun.as_raw_fd(), socket.as_raw_fd(), wake];
    let mut slots = Slots::new(sh.buffer_mtu);
    let mut out: Vec<Transmit> = Vec::new();
    let mut ready = [false; 3];
    while !sh.stop.load(Ordering::Relaxed) {
        if let Err(e) = sys::poll_readable(&fds, 1000, &mut ready) {
            tracing::error!(interface = %sh.name, "poll: {e}");
            return;
        }
        // Each side a batch per turn, so neither starves the other.
        if ready[0] {
            from_tunnel(&sh, &mut tun, socket.as_raw_fd(), &mut slots, &mut out, counters);
            sh.send_all(&socket, &mut out, counters);
        }
        if ready[1] {
            from_network(&sh, &mut tun, socket.as_raw_fd(), &mut slots, &mut out, counters);
            sh.send_all(&socket, &mut out, counters);
        }
    }
}

/// Reads up to a batch of packets from the TUN queue.
fn read_tunnel(tun: &mut File, slots: &mut Slots, counters: &Counters) -> usize {
    let mut n = 0;
    while n < BATCH {
        let slot = &mut slots.0[n];
        let room = slot.buf.len() - DATA - TAG_LEN;
        match tun.read(&mut slot.buf[DATA..DATA + room]) {
            Ok(0) => break,
            Ok(len) => {
                slot.len = len;
                n += 1;
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => break,
            Err(_) => {
                counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                break;
            }
        }
    }
    counters.tun_rx_packets.fetch_add(n as u64, Ordering::Relaxed);
    n
}

fn from_tunnel(sh: &Shared, tun: &mut File, fd: i32, slots: &mut Slots, out: &mut Vec<Transmit>, counters: &Counters) {
    let n = read_tunnel(tun, slots, counters);
    if n == 0 {
        return;
    }
    let now = Instant::now();
    let batch = &mut slots.0[..n];
    {
        let mut dev = sh.device();
        for slot in batch.iter_mut() {
            slot.seal = match dev.plan_seal(&slot.buf[DATA..DATA + slot.len], now, out) {
                Ok(plan) => plan,
                Err(d) => {
                    counters.drop(d);
                    None
                }
            };
        }
    }
    let mut jobs: Vec<SealJob<'_>> = Vec::with_capacity(n);
    for slot in batch.iter_mut() {
        let Some(plan) = &slot.seal else { continue };
        let padded = padded_len(slot.len);
        slot.buf[..DATA].copy_from_slice(&plan.header);
        slot.buf[DATA + slot.len..DATA + padded].fill(0);
        slot.len = DATA + padded + TAG_LEN;
        let (data, tag) = slot.buf[DATA..slot.len].split_at_mut(padded);
        let Ok(tag) = <&mut [u8; TAG_LEN]>::try_from(tag) else { continue };
        jobs.push(SealJob { key: &plan.key.0, counter: plan.counter, data, tag });
    }
    seal_batch(&mut jobs);
    drop(jobs);
    let datagrams: Vec<(&[u8], SocketAddr)> =
        batch.iter().filter_map(|s| s.seal.as_ref().map(|p| (&s.buf[..s.len], p.to))).collect();
    send(fd, sh.v6, &datagrams, counters);
}

/// Sends every datagram, again where the kernel took only some; those it
/// refuses are counted and skipped.
fn send(fd: i32, v6: bool, datagrams: &[(&[u8], SocketAddr)], counters: &Counters) {
    let mut at = 0;
    while at < datagrams.len() {
        match sys::send_batch(fd, v6, &datagrams[at..]) {
            Ok(k) => {
                counters.tx_datagrams.fetch_add(k as u64, Ordering::Relaxed);
                at += k.max(1);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // The socket's buffer is full: wait for room once, briefly.
                let mut ready = [false];
                let _ = sys::poll_writable(fd, 10, &mut ready);
                if !ready[0] {
                    counters.tx_errors.fetch_add((datagrams.len() - at) as u64, Ordering::Relaxed);
                    return;
                }
            }
            Err(_) => {
                // The first one failed (no route, refused): skip it.
                counters.tx_errors.fetch_add(1, Ordering::Relaxed);
                at += 1;
            }
        }
    }
}

fn from_network(sh: &Shared, tun: &mut File, fd: i32, slots: &mut Slots, out: &mut Vec<Transmit>, counters: &Counters) {
    let n = {
        let mut bufs: Vec<&mut [u8]> = slots.0.iter_mut().map(|s| &mut s.buf[..]).collect();
        let mut got = [(0usize, None); BATCH];
        let n = sys::recv_batch(fd, &mut bufs, &mut got).unwrap_or(0);
        for (slot, (len, from)) in slots.0.iter_mut().zip(&got).take(n) {
            (slot.len, slot.from) = (*len, *from);
        }
        n
    };
    if n == 0 {
        return;
    }
    counters.rx_datagrams.fetch_add(n as u64, Ordering::Relaxed);
    let now = Instant::now();
    let batch = &mut slots.0[..n];
    {
        let mut dev = sh.device();
        for slot in batch.iter_mut() {
            slot.open = None;
            slot.deliver = false;
            let Some(src) = slot.from else { continue };
            let datagram = &slot.buf[..slot.len];
            if datagram.first() != Some(&TRANSPORT) {
                // Handshakes cost Diffie-Hellman work: the control thread's.
                hand_over(sh, datagram, src, counters);
                continue;
            }
            match dev.plan_open(datagram, src, now, out) {
                Inbound::Open(plan) => slot.open = Some(plan),
                Inbound::Done(Received::Dropped(d)) => counters.drop(d),
                Inbound::Done(_) => {}
            }
        }
    }
    let mut jobs: Vec<OpenJob<'_>> = Vec::with_capacity(n);
    for slot in batch.iter_mut() {
        let Some(plan) = &slot.open else { continue };
        let (data, tag) = slot.buf[DATA..slot.len].split_at_mut(slot.len - DATA - TAG_LEN);
        let Ok(tag) = <&[u8; TAG_LEN]>::try_from(&*tag) else { continue };
        jobs.push(OpenJob { key: &plan.key.0, counter: plan.counter, data, tag, ok: false });
    }
    open_batch(&mut jobs);
    let opened: Vec<bool> = jobs.iter().map(|j| j.ok).collect();
    drop(jobs);
    {
        let mut dev = sh.device();
        let mut verdicts = opened.into_iter();
        for slot in batch.iter_mut() {
            let (Some(plan), Some(src)) = (&slot.open, slot.from) else { continue };
            if verdicts.next() != Some(true) {
                counters.drop(DropReason::Transport(TransportError::Decrypt));
                continue;
            }
            let plain = &slot.buf[DATA..slot.len - TAG_LEN];
            match dev.finish_open(plan, plain, src, now, out) {
                Received::Packet { len, .. } => {
                    slot.len = DATA + len;
                    slot.deliver = true;
                }
                Received::Dropped(d) => counters.drop(d),
                Received::Control => {}
            }
        }
    }
    for slot in batch.iter().filter(|s| s.deliver) {
        let packet = &slot.buf[DATA..slot.len];
        // A TUN write takes the whole packet or fails.
        match tun.write(packet) {
            Ok(k) if k == packet.len() => counters.tun_tx_packets.fetch_add(1, Ordering::Relaxed),
            _ => counters.tx_errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}

/// Queues a handshake message for the control thread, or drops it when
/// the queue is full (the device is then under load and asks for cookies).
fn hand_over(sh: &Shared, datagram: &[u8], src: SocketAddr, counters: &Counters) {
    sh.queued.fetch_add(1, Ordering::Relaxed);
    if sh.handshakes.try_send((datagram.to_vec(), src)).is_err() {
        sh.queued.fetch_sub(1, Ordering::Relaxed);
        counters.handshake_queue_full.fetch_add(1, Ordering::Relaxed);
    }
}
