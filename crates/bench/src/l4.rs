//! `gatehouse bench l4`: the pipeline fed by an in-memory generator, one
//! core, no I/O: new sessions per second while the table fills, then packets
//! per second of established flows picked at random from the table, and the
//! memory the sessions took (resident set growth per session).
//!
//! The generator writes each vector's frames (a template with the flow's
//! client address and port patched in, checksums updated) outside the timed
//! region; only [`Worker::process`] is timed.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use gatehouse_config::{L4Mode, L4Scheduler};

use gatehouse_l4::plane::{Buf, Plane, Real, Service, VECTOR, Verdict, Worker};
use gatehouse_l4::rewrite;
use gatehouse_wire::checksum;
#[cfg(test)]
use gatehouse_wire::packet::PROTO_UDP;
use gatehouse_wire::packet::{self, Checks, ETHERTYPE_IPV4, Frame, Ip, PROTO_TCP, TCP_ACK, TCP_SYN, build};

pub struct Case {
    pub mode: L4Mode,
    pub proto: u8,
    pub sessions: usize,
    /// With session sync on, as a master runs it: sessions queued for the
    /// peer as they change, the table walked to send established ones
    /// again within [`REFRESH`], the queue emptied each vector (the sync
    /// thread's work, on another core, is measured on its own).
    pub sync: bool,
}

/// The walk's period in the sync case (the config's default).
pub const REFRESH: Duration = Duration::from_secs(30);

pub struct Result {
    pub mode: &'static str,
    pub proto: &'static str,
    pub sessions: usize,
    pub mpps: f64,
    pub new_sessions_per_sec: f64,
    pub bytes_per_session: f64,
    /// Frames not forwarded (should be 0).
    pub not_forwarded: u64,
    /// The sync case: sessions queued for the peer while established
    /// traffic ran.
    pub synced: Option<u64>,
}

impl std::fmt::Display for Result {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "l4 mode={} proto={} sessions={} sync={} mpps={:.2} new_sessions_per_sec={:.0} bytes_per_session={:.1}",
            self.mode,
            self.proto,
            self.sessions,
            if self.synced.is_some() { "on" } else { "off" },
            self.mpps,
            self.new_sessions_per_sec,
            self.bytes_per_session
        )?;
        if let Some(n) = self.synced {
            write!(f, " synced={n}")?;
        }
        Ok(())
    }
}

/// `gatehouse bench l4 --sync-channel`: what one core of the sync thread
/// does per session: seal (records into MACed datagrams) on the master,
/// open (MAC, replay and record checks) and commit into a worker's table on
/// the standby.
pub struct ChannelResult {
    pub sealed_per_sec: f64,
    pub opened_per_sec: f64,
    pub committed_per_sec: f64,
}

impl std::fmt::Display for ChannelResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "l4-sync sealed_per_sec={:.0} opened_per_sec={:.0} committed_per_sec={:.0}",
            self.sealed_per_sec, self.opened_per_sec, self.committed_per_sec
        )
    }
}

/// `gatehouse bench l4 --syn-flood`: SYNs from ever new client ports to an
/// FNAT service with `syn_proxy: always`, each answered with a SYN-ACK
/// carrying a cookie (no session); returns cookies answered per second of
/// the pipeline's time, and the sessions left in the table (0).
pub fn syn_flood(time: Duration) -> (f64, usize) {
    let case = Case { mode: L4Mode::Fnat, proto: PROTO_TCP, sessions: 1 << 20, sync: false };
    let mut plane = plane_for(&case);
    plane.services[0].syn_proxy = gatehouse_config::SynProxyMode::Always;
    let mut worker = Worker::with_capacities(&plane, 0, 1 << 16, 1024, 3);
    let mut frames = Gen::new(PROTO_TCP, TCP_SYN);
    let mut verdicts = Vec::with_capacity(VECTOR);
    let mut flows = Vec::with_capacity(VECTOR);
    let (mut busy, mut answered, mut next) = (Duration::ZERO, 0u64, 0usize);
    let start = Instant::now();
    while start.elapsed() < time {
        flows.clear();
        flows.extend(next..next + VECTOR);
        next += VECTOR;
        let mut bufs = frames.fill(&flows);
        let t = Instant::now();
        worker.process(&plane, &mut bufs, &mut verdicts, 0);
        busy += t.elapsed();
        answered += verdicts.iter().filter(|v| **v == Verdict::Forward).count() as u64;
    }
    (answered as f64 / busy.as_secs_f64().max(1e-9), worker.sessions())
}

/// Measures the sync channel on `sessions` FNAT sessions.
pub fn sync_channel(sessions: usize) -> ChannelResult {
    use gatehouse_l4::sync::{Key, Kind, MAX_RECORDS, Receiver, Record, Sender};
    let case = Case { mode: L4Mode::Fnat, proto: PROTO_TCP, sessions, sync: true };
    let plane = plane_for(&case);
    // The master's sessions, as records.
    let mut master = Worker::with_capacities(&plane, 0, sessions, 1024, 1);
    master.enable_sync(sessions, Duration::from_secs(1));
    let mut verdicts = Vec::with_capacity(VECTOR);
    let mut flows = Vec::with_capacity(VECTOR);
    for flags in [TCP_SYN, TCP_ACK] {
        let mut frames = Gen::new(PROTO_TCP, flags);
        let mut next = 0;
        while next < sessions {
            flows.clear();
            flows.extend(next..(next + VECTOR).min(sessions));
            next += flows.len();
            let mut bufs = frames.fill(&flows);
            master.process(&plane, &mut bufs, &mut verdicts, 0);
        }
    }
    let records: Vec<Record> = master.sync_out().map(|o| std::mem::take(&mut o.records)).unwrap_or_default();
    let key = Key::new(&[9; 32]);
    let mut sender = Sender::new(key.clone(), 1, 1);
    let mut datagrams = Vec::with_capacity(records.len().div_ceil(MAX_RECORDS));
    let t = Instant::now();
    for chunk in records.chunks(MAX_RECORDS) {
        let mut d = Vec::with_capacity(gatehouse_l4::sync::MAX_DATAGRAM);
        sender.seal(Kind::Sessions, chunk, &mut d);
        datagrams.push(d);
    }
    let sealed = t.elapsed();
    let mut receiver = Receiver::new(key, 2);
    let mut opened = Vec::with_capacity(records.len());
    let t = Instant::now();
    for d in &datagrams {
        if let Ok(m) = receiver.open(d) {
            opened.extend(m.records);
        }
    }
    let open_time = t.elapsed();
    let mut standby = Worker::with_capacities(&plane, 0, sessions, 1024, 2);
    let t = Instant::now();
    let committed = opened.iter().filter(|r| standby.commit(&plane, r, 0).is_ok()).count();
    let commit_time = t.elapsed();
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    ChannelResult {
        sealed_per_sec: rate(records.len(), sealed),
        opened_per_sec: rate(opened.len(), open_time),
        committed_per_sec: rate(committed, commit_time),
    }
}

pub fn mode_name(m: L4Mode) -> &'static str {
    match m {
        L4Mode::Nat => "nat",
        L4Mode::Fnat => "fnat",
        L4Mode::Dr => "dr",
        L4Mode::Ipip => "ipip",
        L4Mode::Gue => "gue",
    }
}

const VIP: [u8; 4] = [10, 0, 0, 100];
const HEADROOM: usize = 128;
const FRAME_ROOM: usize = 2048;

/// A 64-byte frame (with Ethernet padding) from client 0.0.0.0:0 to the VIP.
fn template(proto: u8, flags: u8) -> Vec<u8> {
    let src = [0, 0, 0, 0];
    let pseudo = |len: usize| checksum::pseudo_v4(src, VIP, proto, len as u16);
    let seg = if proto == PROTO_TCP {
        // TCP: 54 bytes of headers; 10 bytes of payload make 64.
        build::tcp(0, 80, flags, &[0u8; 10], pseudo)
    } else {
        // UDP: 42 bytes of headers; 22 bytes of payload make 64.
        build::udp(0, 80, &[0u8; 22], pseudo)
    };
    let mut f = build::eth(ETHERTYPE_IPV4, &build::ipv4(src, VIP, proto, &seg));
    f.resize(64.max(f.len()), 0);
    f
}

/// Client address and port of flow `i`.
fn client(i: usize) -> (Ipv4Addr, u16) {
    let host = 0x0b00_0000u32 + (i / 32768) as u32;
    (Ipv4Addr::from(host), 1024 + (i % 32768) as u16)
}

/// Resident memory of this process in bytes.
fn rss() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<usize>().ok()))
        .map_or(0, |pages| pages * 4096)
}

struct Gen {
    template: Vec<u8>,
    ip: Ip,
    mem: Vec<u8>,
}

impl Gen {
    fn new(proto: u8, flags: u8) -> Gen {
        let template = template(proto, flags);
        let ip = match packet::parse(&template, Checks::default()) {
            Ok(Frame::Ip(ip)) => ip,
            _ => unreachable!("the template is a valid frame"),
        };
        Gen { template, ip, mem: vec![0u8; VECTOR * FRAME_ROOM] }
    }

    /// Writes the frames of `flows` and returns buffers over them.
    fn fill(&mut self, flows: &[usize]) -> Vec<Buf<'_>> {
        let len = self.template.len();
        let mut bufs = Vec::with_capacity(flows.len());
        for (chunk, &flow) in self.mem.chunks_mut(FRAME_ROOM).zip(flows) {
            let frame = &mut chunk[HEADROOM..HEADROOM + len];
            frame.copy_from_slice(&self.template);
            let (addr, port) = client(flow);
            rewrite::set_ipv4_addr(frame, &self.ip, true, addr);
            rewrite::set_port(frame, &self.ip, true, port);
            bufs.push(Buf { mem: chunk, head: HEADROOM, len });
        }
        bufs
    }
}

fn plane_for(case: &Case) -> Plane {
    let port = 80;
    let reals =
        (0..16u8).map(|i| Real { addr: Ipv4Addr::new(10, 0, 1, 1 + i).into(), port, weight: 1, up: true }).collect();
    let service = Service {
        name: "bench".into(),
        vip: VIP.into(),
        port,
        proto: case.proto,
        mode: case.mode,
        scheduler: L4Scheduler::Maglev,
        gue_port: 6080,
        reset_on_down: false,
        reals,
        maglev: None,
        timeouts: [u32::MAX; 4],
        syn_proxy: gatehouse_config::SynProxyMode::Off,
        syn_threshold: u32::MAX,
    };
    // FNAT: enough local addresses for every session's port on one core.
    let locals = if case.mode == L4Mode::Fnat { case.sessions.div_ceil(60_000).max(1) } else { 1 };
    let local_addrs = (0..locals).map(|i| Ipv4Addr::from(0x0a09_0000u32 + i as u32).into()).collect();
    Plane::new(vec![service], local_addrs, [2, 0, 0, 0, 0, 0xaa], [2, 0, 0, 0, 0, 0xbb], 1)
}

/// Measures one case for about `time` of established traffic.
pub fn run(case: &Case, time: Duration) -> Result {
    let plane = plane_for(case);
    let before = rss();
    // IPv4 flows only: the IPv6 table is kept at its minimum.
    let mut worker = Worker::with_capacities(&plane, 0, case.sessions, 1024, 0x5eed);
    if case.sync {
        worker.enable_sync(65_536, Duration::from_secs(1));
    }
    let mut verdicts = Vec::with_capacity(VECTOR);
    let mut not_forwarded = 0u64;
    let count = |v: &[Verdict]| v.iter().filter(|v| **v != Verdict::Forward).count() as u64;

    // New sessions: every flow once, in vectors.
    let first = if case.proto == PROTO_TCP { TCP_SYN } else { 0 };
    let mut frames = Gen::new(case.proto, first);
    let mut busy = Duration::ZERO;
    let mut flows = Vec::with_capacity(VECTOR);
    let mut next = 0;
    while next < case.sessions {
        flows.clear();
        flows.extend(next..(next + VECTOR).min(case.sessions));
        next += flows.len();
        let mut bufs = frames.fill(&flows);
        let t = Instant::now();
        worker.process(&plane, &mut bufs, &mut verdicts, 0);
        busy += t.elapsed();
        not_forwarded += count(&verdicts);
    }
    let new_sessions_per_sec = case.sessions as f64 / busy.as_secs_f64().max(1e-9);
    let bytes_per_session = rss().saturating_sub(before) as f64 / case.sessions.max(1) as f64;

    // Established: flows picked at random from the table.
    let later = if case.proto == PROTO_TCP { TCP_ACK } else { 0 };
    let mut frames = Gen::new(case.proto, later);
    let mut rng = fastrand::Rng::with_seed(1);
    let mut busy = Duration::ZERO;
    let mut packets = 0u64;
    let mut synced = 0u64;
    let mut credit = 0.0f64;
    let start = Instant::now();
    while start.elapsed() < time {
        flows.clear();
        flows.extend((0..VECTOR).map(|_| rng.usize(..case.sessions.max(1))));
        let mut bufs = frames.fill(&flows);
        let t = Instant::now();
        worker.process(&plane, &mut bufs, &mut verdicts, 0);
        if case.sync {
            // The runtime's share between vectors: the walk at its pace
            // (by the time spent forwarding), the queue handed over.
            credit += worker.sync_slots() as f64 * t.elapsed().as_secs_f64() / REFRESH.as_secs_f64();
            let n = credit as usize;
            credit -= n as f64;
            worker.sync_walk(&plane, 0, n);
            if let Some(out) = worker.sync_out() {
                synced += out.records.len() as u64;
                out.records.clear();
            }
        }
        busy += t.elapsed();
        packets += verdicts.len() as u64;
        not_forwarded += count(&verdicts);
    }
    Result {
        mode: mode_name(case.mode),
        proto: if case.proto == PROTO_TCP { "tcp" } else { "udp" },
        sessions: case.sessions,
        mpps: packets as f64 / busy.as_secs_f64().max(1e-9) / 1e6,
        new_sessions_per_sec,
        bytes_per_session,
        not_forwarded,
        synced: case.sync.then_some(synced),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_run_forwards_everything() {
        for mode in [L4Mode::Nat, L4Mode::Fnat, L4Mode::Dr, L4Mode::Ipip, L4Mode::Gue] {
            for proto in [PROTO_TCP, PROTO_UDP] {
                let r =
                    run(&Case { mode, proto, sessions: 5000, sync: mode == L4Mode::Fnat }, Duration::from_millis(20));
                assert_eq!(r.not_forwarded, 0, "{r}");
                assert!(r.mpps > 0.0 && r.new_sessions_per_sec > 0.0, "{r}");
            }
        }
    }

    #[test]
    fn the_sync_channel_carries_every_session() {
        let r = sync_channel(3000);
        assert!(r.sealed_per_sec > 0.0 && r.opened_per_sec > 0.0 && r.committed_per_sec > 0.0, "{r}");
    }

    #[test]
    fn a_syn_flood_is_answered_without_sessions() {
        let (rate, sessions) = syn_flood(Duration::from_millis(20));
        assert!(rate > 0.0);
        assert_eq!(sessions, 0);
    }

    #[test]
    fn the_template_is_64_bytes() {
        assert_eq!(template(PROTO_TCP, TCP_SYN).len(), 64);
        assert_eq!(template(PROTO_UDP, 0).len(), 64);
    }
}
