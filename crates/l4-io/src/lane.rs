//! A worker of the L4 runtime: its lane (the worker's pipeline and
//! session tables, the plane it runs, its counters and sync work) and the
//! loop that moves vectors of frames through it from any [`FrameIo`].

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gatehouse_l4::plane::{Buf, Plane, VECTOR, Verdict, Worker};
use gatehouse_l4::sync::Record;

use crate::frame_io::FrameIo;
use crate::shared::{IoCounters, Port, Shared, TICK};
use gatehouse_link::nexthop::{Miss, NextHops};

/// How long an idle worker waits for frames before it looks again.
const IDLE_WAIT_MS: i32 = 10;
/// How often a worker publishes its counters.
const PUBLISH_PERIOD: Duration = Duration::from_millis(100);

/// Puts the next hop's MAC into a forwarded frame. ARP answers and
/// neighbour advertisements are already addressed to their asker.
fn address_frame(frame: &mut [u8], hint: Option<IpAddr>, hops: &NextHops) -> Result<(), Miss> {
    use gatehouse_wire::field::{ethernet, icmp, ipv4, ipv6};
    use gatehouse_wire::packet::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_ICMPV6};
    let l3 = ethernet::HEADER_LEN;
    let ethertype = match frame.get(ethernet::ETHERTYPE..l3) {
        Some(&[a, b]) => u16::from_be_bytes([a, b]),
        _ => return Err(Miss::NoRoute),
    };
    let field = |at: usize, len: usize| frame.get(l3 + at..l3 + at + len);
    let dst = match ethertype {
        ETHERTYPE_ARP => return Ok(()),
        ETHERTYPE_IPV4 => match field(ipv4::DST, 4).and_then(|b| <[u8; 4]>::try_from(b).ok()) {
            Some(a) => IpAddr::from(a),
            None => return Err(Miss::NoRoute),
        },
        ETHERTYPE_IPV6 => {
            let advert = frame.get(l3 + ipv6::HEADER_LEN + icmp::TYPE) == Some(&gatehouse_l4::neighbour::ND_ADVERT);
            if field(ipv6::NEXT_HEADER, 1) == Some(&[PROTO_ICMPV6]) && advert {
                return Ok(());
            }
            match field(ipv6::DST, 16).and_then(|b| <[u8; 16]>::try_from(b).ok()) {
                Some(a) => IpAddr::from(a),
                None => return Err(Miss::NoRoute),
            }
        }
        _ => return Err(Miss::NoRoute),
    };
    let mac = hops.mac(hint.unwrap_or(dst))?;
    frame[..6].copy_from_slice(&mac);
    Ok(())
}

/// A worker's state: its plane, and the session tables that outlive
/// planes that extend each other.
struct Lane {
    worker: Worker,
    published: Arc<Plane>,
    verdicts: Vec<Verdict>,
    io: IoCounters,
    started: Instant,
    last_publish: Instant,
    capacity: usize,
    queue: u16,
    /// Whether sessions are synced to a peer.
    sync: bool,
    /// The demotions and peer joins seen (see `Ha`).
    demotions: u32,
    resyncs: u32,
    /// The table walk that sends long-lived sessions again: when it last
    /// ran, and the slots it still owes.
    walked: Instant,
    walk_credit: f64,
    /// The last vector was full: the walk waits.
    busy: bool,
}

/// A worker with empty tables (a million sessions by default: tens of
/// megabytes to fill, so made once at the start).
fn new_worker(plane: &Plane, queue: u16, capacity: usize, sync: bool) -> Worker {
    let mut w = Worker::new(plane, queue, capacity, fastrand::u64(..));
    if sync {
        w.enable_sync(crate::ha::OUTBOX_CAP, TICK);
    }
    w
}

impl Lane {
    fn new_worker(&self, plane: &Plane) -> Worker {
        new_worker(plane, self.queue, self.capacity, self.sync)
    }

    /// Picks up a newly published plane.
    fn refresh(&mut self, port: &Port) {
        let p = port.plane.load();
        if !Arc::ptr_eq(&p, &self.published) {
            let p = p.clone();
            if p.extends(&self.published) {
                self.worker.adopt(&p);
            } else {
                self.worker = self.new_worker(&p);
            }
            self.published = p;
        }
    }

    fn now(&self) -> u32 {
        (self.started.elapsed().as_millis() / TICK.as_millis()) as u32
    }

    /// Between vectors (after [`Lane::refresh`]): a demotion empties the tables; the peer's sessions
    /// are committed (before the next vector is looked at); the table walk
    /// goes on (unless the last vector was full, or a peer asked for
    /// everything); queued sessions go to the sync thread.
    fn ha_step(&mut self, shared: &Shared, slot: usize) {
        let Some(ha) = &shared.ha else { return };
        let d = ha.demotions.load(Ordering::Acquire);
        if d != self.demotions {
            self.demotions = d;
            self.worker = self.new_worker(&self.published.clone());
        }
        let Some(sync) = &ha.sync else { return };
        let r = ha.resyncs.load(Ordering::Acquire);
        if r != self.resyncs {
            self.resyncs = r;
            self.worker.start_bulk();
        }
        let now = self.now();
        let slots = self.worker.sync_slots() as f64;
        let elapsed = self.walked.elapsed().as_secs_f64();
        self.walked = Instant::now();
        self.walk_credit = (self.walk_credit + slots * elapsed / sync.cfg.refresh.as_secs_f64()).min(slots);
        let bulk = self.worker.bulk_left() > 0;
        if sync.room() && (bulk || !self.busy) {
            let budget = if bulk { self.walk_credit.max(16_384.0) } else { self.walk_credit } as usize;
            if budget > 0 {
                self.worker.sync_walk(&self.published, now, budget);
                self.walk_credit = (self.walk_credit - budget as f64).max(0.0);
            }
        }
        crate::ha::worker_exchange(sync, slot, &mut self.worker, &self.published, now);
    }

    /// Runs the pipeline over `bufs`; returns, per frame, whether to send it.
    fn process(&mut self, port: &Port, bufs: &mut [Buf<'_>], send: &mut Vec<bool>) {
        let now = self.now();
        self.busy = bufs.len() >= VECTOR;
        self.io.rx_packets += bufs.len() as u64;
        self.worker.process(&self.published, bufs, &mut self.verdicts, now);
        let hops = port.hops.load();
        send.clear();
        for (i, b) in bufs.iter_mut().enumerate() {
            let ok = self.verdicts[i] == Verdict::Forward
                && match address_frame(b.frame_mut(), self.worker.next_hops[i], &hops) {
                    Ok(()) => true,
                    Err(Miss::Unresolved(a)) => {
                        self.io.no_neighbour += 1;
                        if let Ok(mut m) = port.misses.try_lock()
                            && m.len() < 64
                            && !m.contains(&a)
                        {
                            m.push(a);
                        }
                        false
                    }
                    Err(Miss::NoRoute) => {
                        self.io.no_route += 1;
                        false
                    }
                };
            send.push(ok);
        }
    }

    /// Commits the sessions the process taken over handed on, before the
    /// first frame (every worker all of them, as a promoted standby does:
    /// the NIC decides which core sees a flow).
    fn take_over(&mut self, taken_over: &[Record], port: &Port, slot: usize) {
        if taken_over.is_empty() {
            return;
        }
        let now = self.now();
        let (mut ok, mut failed) = (0usize, 0usize);
        for r in taken_over {
            match self.worker.commit(&self.published, r, now) {
                Ok(()) => ok += 1,
                Err(_) => failed += 1,
            }
        }
        if slot == 0 {
            tracing::info!(interface = %port.name, committed = ok, not_here = failed, "L4 sessions taken over");
        }
    }

    fn publish_stats(&mut self, shared: &Shared, slot: usize) {
        if self.last_publish.elapsed() < PUBLISH_PERIOD {
            return;
        }
        self.last_publish = Instant::now();
        let mut s = shared.stats[slot].lock().unwrap_or_else(|e| e.into_inner());
        s.counters = self.worker.counters().clone();
        s.io = self.io.clone();
        s.sessions = self.worker.sessions();
    }
}

/// A worker thread: vectors of frames from `io` through the pipeline and
/// back out, the plane refreshed and the sync work done between them.
/// `taken_over`: the sessions a process taken over handed on, committed
/// before the first frame and then let go.
pub(crate) fn run<I: FrameIo>(
    shared: &Shared,
    port: &Port,
    queue: u32,
    slot: usize,
    mut io: I,
    capacity: usize,
    taken_over: Arc<Vec<Record>>,
) {
    let published = port.plane.load_full();
    let ha = shared.ha.as_deref();
    let sync = ha.is_some_and(|h| h.sync.is_some());
    let mut lane = Lane {
        worker: new_worker(&published, queue as u16, capacity, sync),
        published: published.clone(),
        verdicts: Vec::with_capacity(VECTOR),
        io: IoCounters::default(),
        started: Instant::now(),
        last_publish: Instant::now(),
        capacity,
        queue: queue as u16,
        sync,
        demotions: ha.map_or(0, |h| h.demotions.load(Ordering::Acquire)),
        resyncs: ha.map_or(0, |h| h.resyncs.load(Ordering::Acquire)),
        walked: Instant::now(),
        walk_credit: 0.0,
        busy: false,
    };
    lane.take_over(&taken_over, port, slot);
    drop(taken_over);
    let mut send = Vec::with_capacity(VECTOR);
    let mut done = Vec::with_capacity(VECTOR);
    while !shared.stop.load(Ordering::Relaxed) {
        lane.publish_stats(shared, slot);
        if io.receive(shared) == 0 {
            lane.busy = false;
            lane.refresh(port);
            lane.ha_step(shared, slot);
            // Short enough that a stop (a takeover waits for it) or the
            // sync work is never long behind; a hundred wake-ups a second
            // cost an idle worker well under 0.1% of a core.
            io.wait(IDLE_WAIT_MS);
            continue;
        }
        lane.refresh(port);
        lane.ha_step(shared, slot);
        let mut bufs = io.frames();
        lane.process(port, &mut bufs, &mut send);
        done.clear();
        done.extend(bufs.iter().map(|b| (b.head, b.len)));
        drop(bufs);
        io.transmit(&done, &send, &mut lane.io);
    }
    if shared.export.load(Ordering::Acquire) {
        let mut out = Vec::new();
        lane.worker.export(&lane.published, lane.now(), &mut out);
        shared.exported.lock().unwrap_or_else(|e| e.into_inner()).extend(out);
        if let Some(free) = io.free_frames() {
            let frames = crate::takeover::Frames { interface: port.name.clone(), queue, free };
            shared.exported_frames.lock().unwrap_or_else(|e| e.into_inner()).push(frames);
        }
    }
}
