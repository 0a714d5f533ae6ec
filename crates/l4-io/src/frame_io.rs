//! One interface for the two ways a worker gets frames and sends them
//! (quinn-udp's pattern: one socket trait, a backend per platform
//! facility). AF_XDP hands over frames in place in its UMEM and sends them
//! from there; AF_PACKET copies each frame in and out, and reads only the
//! frames the plane wants (the kernel keeps its own copy of the rest).

use std::time::Instant;

use gatehouse_l4::plane::{Buf, VECTOR};

use crate::control::wanted;
use crate::packet_socket::PacketSocket;
use crate::shared::{CONTROL_PERIOD, IoCounters, Shared};
use crate::steer::Wanted;
use gatehouse_link::xsk;

/// A worker's frames in and out, a vector at a time.
pub(crate) trait FrameIo {
    /// Takes in a vector of frames (at most [`VECTOR`]); returns how many.
    fn receive(&mut self, shared: &Shared) -> usize;

    /// The frames received, as the pipeline's buffers.
    fn frames(&mut self) -> Vec<Buf<'_>>;

    /// Sends the frames marked in `send` (each's start and length after
    /// the pipeline, by `done`) and gives every frame's room back.
    fn transmit(&mut self, done: &[(usize, usize)], send: &[bool], io: &mut IoCounters);

    /// Waits up to `timeout_ms` for frames.
    fn wait(&self, timeout_ms: i32);

    /// The frames an AF_XDP socket holds unused (none for other sockets):
    /// a process adopting the socket may use them.
    fn free_frames(&self) -> Option<Vec<u64>> {
        None
    }
}

/// An AF_XDP socket: frames in place in the UMEM.
pub(crate) struct XdpIo {
    sock: Box<xsk::Socket>,
    descs: Vec<xsk::Desc>,
    tx: Vec<xsk::Desc>,
    recycle: Vec<u64>,
}

impl XdpIo {
    pub(crate) fn new(sock: Box<xsk::Socket>) -> XdpIo {
        XdpIo {
            sock,
            descs: Vec::with_capacity(VECTOR),
            tx: Vec::with_capacity(VECTOR),
            recycle: Vec::with_capacity(VECTOR),
        }
    }
}

impl FrameIo for XdpIo {
    fn receive(&mut self, _shared: &Shared) -> usize {
        self.sock.refill();
        self.descs.clear();
        self.sock.recv(&mut self.descs, VECTOR)
    }

    fn frames(&mut self) -> Vec<Buf<'_>> {
        let descs = &self.descs;
        match self.sock.frames(descs) {
            Some(frames) => frames
                .into_iter()
                .zip(descs)
                .map(|(mem, d)| Buf { mem, head: (d.addr - xsk::frame_of(d.addr)) as usize, len: d.len as usize })
                .collect(),
            // Descriptors outside the UMEM: nothing to process, every
            // frame goes back to the fill ring.
            None => Vec::new(),
        }
    }

    fn transmit(&mut self, done: &[(usize, usize)], send: &[bool], io: &mut IoCounters) {
        self.tx.clear();
        self.recycle.clear();
        if done.len() != self.descs.len() {
            self.recycle.extend(self.descs.iter().map(|d| d.addr));
        } else {
            for ((&(head, len), d), &ok) in done.iter().zip(&self.descs).zip(send) {
                if ok {
                    self.tx.push(xsk::Desc { addr: xsk::frame_of(d.addr) + head as u64, len: len as u32, options: 0 });
                } else {
                    self.recycle.push(d.addr);
                }
            }
        }
        for &a in &self.recycle {
            self.sock.recycle(a);
        }
        let sent = self.sock.send(&self.tx);
        io.tx_packets += sent as u64;
        io.tx_full += (self.tx.len() - sent) as u64;
    }

    fn wait(&self, timeout_ms: i32) {
        self.sock.wait(timeout_ms);
    }

    fn free_frames(&self) -> Option<Vec<u64>> {
        Some(self.sock.free_frames().to_vec())
    }
}

/// An AF_PACKET socket: frames copied into a vector's worth of memory.
pub(crate) struct PacketIo {
    sock: PacketSocket,
    mem: Vec<u8>,
    lens: Vec<usize>,
    /// What the plane takes, as the steering program would decide it,
    /// read again from the config every [`CONTROL_PERIOD`].
    want: Wanted,
    want_at: Instant,
}

impl PacketIo {
    pub(crate) fn new(sock: PacketSocket, shared: &Shared) -> PacketIo {
        PacketIo {
            sock,
            mem: vec![0u8; VECTOR * xsk::FRAME_SIZE],
            lens: Vec::with_capacity(VECTOR),
            want: wanted(&shared.cfg.lock().unwrap_or_else(|e| e.into_inner()), shared.owns()),
            want_at: Instant::now(),
        }
    }
}

impl FrameIo for PacketIo {
    fn receive(&mut self, shared: &Shared) -> usize {
        if self.want_at.elapsed() > CONTROL_PERIOD {
            self.want = wanted(&shared.cfg.lock().unwrap_or_else(|e| e.into_inner()), shared.owns());
            self.want_at = Instant::now();
        }
        self.lens.clear();
        // Frames the plane does not want are the kernel's (it has its own
        // copy); a bounded number are read per vector.
        for _ in 0..4 * VECTOR {
            let k = self.lens.len();
            let room = &mut self.mem[k * xsk::FRAME_SIZE + xsk::RX_HEADROOM..(k + 1) * xsk::FRAME_SIZE];
            match self.sock.recv(room) {
                Some(n) if crate::steer::wants(&room[..n], &self.want) => self.lens.push(n),
                Some(_) => {}
                None => break,
            }
            if self.lens.len() == VECTOR {
                break;
            }
        }
        self.lens.len()
    }

    fn frames(&mut self) -> Vec<Buf<'_>> {
        self.mem
            .chunks_exact_mut(xsk::FRAME_SIZE)
            .zip(&self.lens)
            .map(|(mem, &len)| Buf { mem, head: xsk::RX_HEADROOM, len })
            .collect()
    }

    fn transmit(&mut self, done: &[(usize, usize)], send: &[bool], io: &mut IoCounters) {
        for (k, (&(head, len), &ok)) in done.iter().zip(send).enumerate() {
            let frame = &self.mem[k * xsk::FRAME_SIZE..(k + 1) * xsk::FRAME_SIZE];
            if ok && frame.get(head..head + len).is_some_and(|f| self.sock.send(f)) {
                io.tx_packets += 1;
            }
        }
    }

    fn wait(&self, timeout_ms: i32) {
        self.sock.wait(timeout_ms);
    }
}
