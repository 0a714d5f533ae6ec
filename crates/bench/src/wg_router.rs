//! `gatehouse bench wg-router`: WireGuard's router mode fed from memory
//! on one core, as `bench l4` feeds the L4 pipeline. The router under
//! test has 1 or many peers, each a remote site (its own device, its
//! session up); LAN frames go round-robin to the peers' networks through
//! the seal path, and datagrams the peers sealed come in through the open
//! path. Only the pipeline is timed: copying frames into place (what the
//! NIC's DMA does) and the peers' sealing are not.
//!
//! `size` is the clear frame's length on the LAN (Ethernet header
//! included), as VPP's WireGuard figures count it; Gbit/s are of those
//! frames. Cycles per packet are the time per packet at the clock the
//! kernel reports (`cpu MHz`), which on a VM is its TSC rate.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatehouse_link::nexthop::{NextHops, Route};
use gatehouse_wg::crypto::StaticSecret;
use gatehouse_wg::device::{Device, Received};
use gatehouse_wg_io::router::pipeline::{WanSender, open_vector, seal_vector};
use gatehouse_wg_io::router::{Counts, Extra, Frame, Router, Side};
use gatehouse_wire::checksum;
use gatehouse_wire::packet::build;
use rand_core::OsRng;

use crate::BenchError;

const PORT: u16 = 51820;
const WAN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];
const LAN_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const GATEWAY_MAC: [u8; 6] = [2, 0, 0, 0, 0xee, 1];
const HOST_MAC: [u8; 6] = [2, 0, 0, 0, 0xee, 2];
const WAN: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const LAN_HOST: [u8; 4] = [10, 1, 0, 5];
/// Frame buffers as AF_XDP lays them out: 2 KiB, data at 256.
const FRAME: usize = 2048;
const HEADROOM: usize = 256;
/// Bytes of sealed datagrams the peers make ahead of the open path's
/// timed runs: at 66 bytes, some 400,000 datagrams.
const POOL_BYTES: usize = 64 << 20;
const EPOCH: Duration = Duration::from_secs(1_700_000_000);

/// One measurement.
pub struct Row {
    pub dir: &'static str,
    pub size: usize,
    pub peers: usize,
    pub pps: f64,
    pub cycles: f64,
}

impl Row {
    pub fn gbps(&self) -> f64 {
        self.pps * self.size as f64 * 8.0 / 1e9
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wgrouter dir={} size={} peers={} pps={:.0} gbps={:.2} cycles_per_packet={:.0}",
            self.dir,
            self.size,
            self.peers,
            self.pps,
            self.gbps(),
            self.cycles
        )
    }
}

/// Peer `k`'s LAN (a /24 in 172.16.0.0/12) and its endpoint (in
/// 198.18.0.0/15, behind the WAN's gateway).
fn peer_net(k: usize) -> [u8; 4] {
    [172, 16 + (k >> 8) as u8, k as u8, 0]
}

fn peer_endpoint(k: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::from([198, 18 + (k >> 16) as u8, (k >> 8) as u8, k as u8]), PORT)
}

fn udp4(src: [u8; 4], dst: [u8; 4], payload: usize) -> Vec<u8> {
    let data = vec![0x5au8; payload];
    let seg = build::udp(4000, 5000, &data, |len| checksum::pseudo_v4(src, dst, 17, len as u16));
    build::ipv4(src, dst, 17, &seg)
}

/// The router under test and its peers, every session up.
struct Lab {
    router: Router,
    dev: Mutex<Device<OsRng>>,
    peers: Vec<Device<OsRng>>,
}

fn lab(peers: usize) -> Result<Lab, BenchError> {
    let now = Instant::now();
    let route = |net: [u8; 4], prefix, gateway: Option<[u8; 4]>| Route {
        net: IpAddr::from(net),
        prefix,
        gateway: gateway.map(IpAddr::from),
        metric: 0,
    };
    let router = Router {
        lan: Side {
            mac: LAN_MAC,
            v4: Some(Ipv4Addr::new(10, 1, 0, 1)),
            v6: None,
            hops: Arc::new(NextHops {
                routes: vec![route([10, 1, 0, 0], 24, None)],
                neighbours: [(IpAddr::from(LAN_HOST), HOST_MAC)].into_iter().collect(),
            }),
        },
        wan: Side {
            mac: WAN_MAC,
            v4: Some(WAN),
            v6: None,
            hops: Arc::new(NextHops {
                routes: vec![route([192, 0, 2, 0], 24, None), route([0, 0, 0, 0], 0, Some([192, 0, 2, 254]))],
                neighbours: [(IpAddr::from([192, 0, 2, 254]), GATEWAY_MAC)].into_iter().collect(),
            }),
        },
        port: PORT,
        mtu: 1420,
    };
    let mut dev = Device::new(StaticSecret::random(&mut OsRng), now, EPOCH, OsRng);
    let me = SocketAddr::new(IpAddr::V4(WAN), PORT);
    let mut remote = Vec::with_capacity(peers);
    let fail = |what: &str| BenchError::Setup(format!("wg-router: {what}"));
    for k in 0..peers {
        let mut p = Device::new(StaticSecret::random(&mut OsRng), now, EPOCH, OsRng);
        let net = IpAddr::from(peer_net(k));
        dev.add_peer(*p.public(), None, Some(peer_endpoint(k)), None, &[(net, 24)])
            .map_err(|_| fail("adding a peer"))?;
        p.add_peer(*dev.public(), None, Some(me), None, &[(IpAddr::from([10, 1, 0, 0]), 24)])
            .map_err(|_| fail("adding the router to a peer"))?;
        // The peer starts; its first packet confirms the session.
        let (mut out, mut replies, mut data, mut buf) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut src = peer_net(k);
        src[3] = 5;
        p.send(&udp4(src, LAN_HOST, 8), now, &mut out).map_err(|_| fail("initiating"))?;
        let init = out.first().ok_or_else(|| fail("no initiation"))?;
        dev.receive(&init.datagram, peer_endpoint(k), now, &mut replies, &mut buf);
        let resp = replies.first().ok_or_else(|| fail("no response"))?;
        p.receive(&resp.datagram, me, now, &mut data, &mut buf);
        let first = data.first().ok_or_else(|| fail("no data after the handshake"))?;
        if !matches!(
            dev.receive(&first.datagram, peer_endpoint(k), now, &mut Vec::new(), &mut buf),
            Received::Packet { .. }
        ) {
            return Err(fail("the session did not come up"));
        }
        remote.push(p);
    }
    Ok(Lab { router, dev: Mutex::new(dev), peers: remote })
}

/// The router's clock as the kernel reports it, in GHz.
fn ghz() -> f64 {
    let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0.0, |mhz| mhz / 1000.0)
}

/// Packets per second through the seal path: LAN frames of `size` bytes
/// to the peers' networks, round-robin.
fn seal(lab: &Lab, size: usize, vector: usize, time: Duration) -> f64 {
    let peers = lab.peers.len();
    let templates: Vec<Vec<u8>> = (0..peers.min(4096))
        .map(|k| {
            let mut dst = peer_net(k);
            dst[3] = 9;
            build::eth(0x0800, &udp4(LAN_HOST, dst, size.saturating_sub(14 + 28)))
        })
        .collect();
    let mut bufs = vec![vec![0u8; FRAME]; vector];
    let (mut fates, mut extra, mut counts) = (Vec::new(), Extra::default(), Counts::default());
    let (mut spent, mut next) = (Duration::ZERO, 0usize);
    let started = Instant::now();
    while started.elapsed() < time {
        let mut lens = Vec::with_capacity(vector);
        for b in bufs.iter_mut() {
            let t = &templates[next % templates.len()];
            b[HEADROOM..HEADROOM + t.len()].copy_from_slice(t);
            lens.push(t.len());
            next += 1;
        }
        let mut frames: Vec<Frame<'_>> =
            bufs.iter_mut().zip(&lens).map(|(b, &len)| Frame { mem: &mut b[..], head: HEADROOM, len }).collect();
        extra.clear_vector();
        extra.transmits.clear();
        let t0 = Instant::now();
        seal_vector(
            &lab.router,
            WanSender::Frames,
            &lab.dev,
            &mut frames,
            &mut fates,
            &mut extra,
            &mut counts,
            Instant::now(),
        );
        spent += t0.elapsed();
    }
    rate(counts.sealed, spent)
}

fn rate(count: u64, spent: Duration) -> f64 {
    count as f64 / spent.as_secs_f64().max(1e-9)
}

/// Datagrams the peers sealed ahead of the timed runs, as WAN frames laid
/// end to end.
struct Sealed {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Sealed {
    fn frames(&self) -> impl Iterator<Item = &[u8]> {
        self.ends.iter().scan(0, |start, &end| {
            let f = &self.bytes[*start..end];
            *start = end;
            Some(f)
        })
    }
}

/// The peers seal `count` datagrams of `size`-byte frames, round-robin
/// from peer `next` on, each to a host on the router's LAN.
fn seal_ahead(lab: &mut Lab, size: usize, count: usize, next: &mut usize, now: Instant) -> Sealed {
    let peers = lab.peers.len();
    let mut sealed = Sealed { bytes: Vec::new(), ends: Vec::with_capacity(count) };
    let mut out = Vec::with_capacity(1);
    for _ in 0..count {
        let k = *next % peers;
        *next += 1;
        let mut src = peer_net(k);
        src[3] = 5;
        out.clear();
        let _ = lab.peers[k].send(&udp4(src, LAN_HOST, size.saturating_sub(14 + 28)), now, &mut out);
        let Some(t) = out.first() else { continue };
        let IpAddr::V4(from) = peer_endpoint(k).ip() else { continue };
        let seg =
            build::udp(PORT, PORT, &t.datagram, |len| checksum::pseudo_v4(from.octets(), WAN.octets(), 17, len as u16));
        let mut f = build::eth(0x0800, &build::ipv4(from.octets(), WAN.octets(), 17, &seg));
        f[..6].copy_from_slice(&WAN_MAC);
        sealed.bytes.extend_from_slice(&f);
        sealed.ends.push(sealed.bytes.len());
    }
    sealed
}

/// Packets per second through the open path: datagrams the peers sealed
/// (round-robin), to hosts on the router's LAN. The peers seal a pool of
/// up to [`POOL_BYTES`] first, untimed; then each vector is copied into
/// frame buffers (the NIC's DMA, untimed) and opened; pools follow until
/// `time` has passed, the first opened whole however short the run.
/// Sealing between vectors would run 1,000 other devices' state through
/// the cache, which a router meeting a burst from its NIC does not pay.
fn open(lab: &mut Lab, size: usize, vector: usize, time: Duration) -> f64 {
    let mut bufs = vec![vec![0u8; FRAME]; vector];
    let (mut fates, mut extra, mut counts) = (Vec::new(), Extra::default(), Counts::default());
    let (mut spent, mut next) = (Duration::ZERO, 0usize);
    let count = (POOL_BYTES / (size + 100)).max(vector);
    let started = Instant::now();
    let now = Instant::now();
    let mut first = true;
    while first || started.elapsed() < time {
        let sealed = seal_ahead(lab, size, count, &mut next, now);
        let mut frames_in = sealed.frames();
        loop {
            let mut lens = Vec::with_capacity(vector);
            for (b, f) in bufs.iter_mut().zip(frames_in.by_ref()) {
                b[HEADROOM..HEADROOM + f.len()].copy_from_slice(f);
                lens.push(f.len());
            }
            // The first pool is opened whole, however short the run.
            if lens.is_empty() || (started.elapsed() >= time && !first) {
                break;
            }
            let mut frames: Vec<Frame<'_>> =
                bufs.iter_mut().zip(&lens).map(|(b, &len)| Frame { mem: &mut b[..], head: HEADROOM, len }).collect();
            extra.clear_vector();
            extra.transmits.clear();
            let t0 = Instant::now();
            open_vector(&lab.router, &lab.dev, &mut frames, &mut fates, &mut extra, &mut counts, now);
            spent += t0.elapsed();
        }
        first = false;
    }
    rate(counts.opened, spent)
}

/// Every size and peer count, both directions.
pub fn run(
    time: Duration,
    sizes: &[usize],
    peers: &[usize],
    vector: usize,
    mut progress: impl FnMut(&Row),
) -> Result<Vec<Row>, BenchError> {
    let ghz = ghz();
    let mut rows = Vec::new();
    for &n in peers {
        let mut lab = lab(n.max(1))?;
        for &size in sizes {
            for dir in ["seal", "open"] {
                let pps =
                    if dir == "seal" { seal(&lab, size, vector, time) } else { open(&mut lab, size, vector, time) };
                let row =
                    Row { dir, size, peers: n.max(1), pps, cycles: if pps > 0.0 { ghz * 1e9 / pps } else { 0.0 } };
                progress(&row);
                rows.push(row);
            }
        }
    }
    Ok(rows)
}
