//! `gatehouse bench l4-wire`: a packet generator for benchmarks on real
//! (virtual) links. It sends 64-byte UDP datagrams or TCP segments of a
//! fixed set of flows out of one interface, as fast as it can (or at a
//! smooth rate through AF_XDP), for a bounded time, and reports what it
//! sent. Whatever forwards them (Gatehouse, the kernel) is measured on the
//! other side of the link.
//!
//! Two ways to send: `xdp` has the kernel make the frames and transmit them
//! with XDP (BPF_PROG_TEST_RUN, live frames: bpf/trafficgen.c), so that the
//! receiving end gets them as from a NIC, without socket buffers; `af_xdp`
//! writes them into an AF_XDP socket (copy mode on veth: the kernel builds
//! a socket buffer for each, which the receiver then frees).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use gatehouse_wire::checksum;
use gatehouse_wire::packet::{ETHERTYPE_IPV4, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_SYN, build};

use gatehouse_l4_io::runtime::{parse_mac, sys};
use gatehouse_link::xsk;

use crate::error::{BenchError, failed};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    Xdp,
    AfXdp,
}

pub struct WireOptions {
    pub via: Via,
    pub interface: String,
    /// The next hop's MAC (the balancer's interface).
    pub dst_mac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: SocketAddrV4,
    /// `PROTO_UDP` or `PROTO_TCP` (one SYN per flow first, then ACKs).
    pub proto: u8,
    /// Flows: source ports from 10000 on.
    pub flows: u16,
    pub duration: Duration,
    /// Packets per second (`af_xdp` only); 0 for as fast as it can.
    pub pps: u64,
}

pub struct WireReport {
    pub sent: u64,
    pub elapsed: Duration,
}

impl std::fmt::Display for WireReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        write!(f, "l4-wire sent={} seconds={:.3} pps={:.0}", self.sent, secs, self.sent as f64 / secs)
    }
}

/// A 60-byte frame (64 on the wire with the FCS) of flow `i`.
fn frame(o: &WireOptions, src_mac: [u8; 6], i: u16, flags: u8) -> Vec<u8> {
    let (src, dst) = (o.src.octets(), o.dst.ip().octets());
    let sport = 10000u16.wrapping_add(i);
    let pseudo = |proto| move |len: usize| checksum::pseudo_v4(src, dst, proto, len as u16);
    let ip = if o.proto == PROTO_TCP {
        build::ipv4(src, dst, PROTO_TCP, &build::tcp(sport, o.dst.port(), flags, &[0; 6], pseudo(PROTO_TCP)))
    } else {
        build::ipv4(src, dst, PROTO_UDP, &build::udp(sport, o.dst.port(), &[0; 18], pseudo(PROTO_UDP)))
    };
    let mut f = build::eth(ETHERTYPE_IPV4, &ip);
    f[0..6].copy_from_slice(&o.dst_mac);
    f[6..12].copy_from_slice(&src_mac);
    f
}

pub fn generate(o: &WireOptions) -> Result<WireReport, BenchError> {
    if o.proto != PROTO_UDP && o.proto != PROTO_TCP {
        return Err(BenchError::Invalid("the protocol must be tcp or udp".into()));
    }
    if o.via == Via::Xdp && o.pps > 0 {
        // Each kernel call sends thousands of frames at full speed: an
        // average rate would arrive in bursts no receiver's ring holds.
        return Err(BenchError::Invalid(
            "a packet rate needs --via af_xdp (frames made by XDP come in bursts of thousands)".into(),
        ));
    }
    let ifindex =
        nix::net::if_::if_nametoindex(o.interface.as_str()).map_err(failed(format!("interface {}", o.interface)))?;
    let src_mac = parse_mac(&sys(&o.interface, "address")?)
        .ok_or_else(|| BenchError::Invalid(format!("interface {}: no MAC address", o.interface)))?;
    match o.via {
        Via::Xdp => generate_xdp(o, ifindex, src_mac),
        Via::AfXdp => generate_af_xdp(o, ifindex, src_mac),
    }
}

static TRAFFICGEN: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/trafficgen.o"));

/// bpf/trafficgen.c's `struct config`: the headers, then whether TCP,
/// and the flows (native-endian u32s).
fn xdp_config(template: &[u8], proto: u8, flows: u16) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[..54].copy_from_slice(&template[..54]);
    c[56..60].copy_from_slice(&u32::from(proto == PROTO_TCP).to_ne_bytes());
    c[60..64].copy_from_slice(&u32::from(flows).to_ne_bytes());
    c
}

fn generate_xdp(o: &WireOptions, ifindex: u32, src_mac: [u8; 6]) -> Result<WireReport, BenchError> {
    use std::os::fd::{AsFd, AsRawFd};
    let mut bpf = aya::Ebpf::load(TRAFFICGEN).map_err(failed("loading the generator"))?;
    let prog: &mut aya::programs::Xdp = bpf
        .program_mut("gatehouse_trafficgen")
        .ok_or(BenchError::Invalid("the generator object has no gatehouse_trafficgen program".into()))?
        .try_into()
        .map_err(failed("gatehouse_trafficgen"))?;
    prog.load().map_err(failed("verifying the generator"))?;
    let fd = prog.fd().map_err(failed("the generator"))?.as_fd().as_raw_fd();
    let flows = o.flows.max(1);
    let set = |bpf: &mut aya::Ebpf, frame: &[u8]| -> Result<(), BenchError> {
        let map = bpf.map_mut("CONFIG").ok_or(BenchError::Invalid("the generator object has no CONFIG map".into()))?;
        let mut a: aya::maps::Array<&mut aya::maps::MapData, [u8; 64]> =
            aya::maps::Array::try_from(map).map_err(failed("CONFIG"))?;
        a.set(0, xdp_config(frame, o.proto, flows), 0).map_err(failed("CONFIG"))
    };
    // The UDP checksum is left out (zero) so that the program need not
    // adjust it for each source port.
    let udp_no_checksum = |mut f: Vec<u8>| {
        if o.proto == PROTO_UDP {
            f[40..42].copy_from_slice(&[0, 0]);
        }
        f
    };
    let mut sent = 0u64;
    if o.proto == PROTO_TCP {
        let syn = frame(o, src_mac, 0, TCP_SYN);
        set(&mut bpf, &syn)?;
        crate::bpf_run::run_live(fd, &syn, ifindex, u32::from(flows), 64).map_err(failed("sending"))?;
        sent += u64::from(flows);
        std::thread::sleep(Duration::from_millis(200));
    }
    let f = udp_no_checksum(frame(o, src_mac, 0, TCP_ACK));
    set(&mut bpf, &f)?;
    let start = Instant::now();
    let mut steady = 0u64;
    // Each call sets up and tears down the kernel's frame pool (about ten
    // milliseconds, mostly waiting for RCU), so calls last about 100 ms at
    // the rate measured so far: the run ends near its time.
    let mut chunk: u64 = 1 << 14;
    while start.elapsed() < o.duration {
        if steady > 0 {
            let rate = steady as f64 / start.elapsed().as_secs_f64().max(1e-6);
            chunk = ((rate * 0.1) as u64).clamp(1 << 12, 1 << 20);
        }
        crate::bpf_run::run_live(fd, &f, ifindex, chunk as u32, 64).map_err(failed("sending"))?;
        steady += chunk;
    }
    Ok(WireReport { sent: sent + steady, elapsed: start.elapsed() })
}

fn generate_af_xdp(o: &WireOptions, ifindex: u32, src_mac: [u8; 6]) -> Result<WireReport, BenchError> {
    let mut sock = xsk::Socket::open(ifindex, 0, xsk::Config::default())
        .map_err(failed(format!("AF_XDP socket on {}", o.interface)))?;
    let flows = o.flows.max(1);
    let mut sent = 0u64;
    if o.proto == PROTO_TCP {
        // Sessions first: a balancer starts TCP sessions only on a SYN.
        let syns: Vec<Vec<u8>> = (0..flows).map(|i| frame(o, src_mac, i, TCP_SYN)).collect();
        let mut k = 0usize;
        let deadline = Instant::now() + Duration::from_secs(2);
        while k < syns.len() && Instant::now() < deadline {
            sock.reclaim();
            sent += sock.transmit(64.min(syns.len() - k), |buf| {
                let f = &syns[k];
                k += 1;
                buf[..f.len()].copy_from_slice(f);
                f.len()
            }) as u64;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let flags = TCP_ACK;
    let frames: Vec<Vec<u8>> = (0..flows).map(|i| frame(o, src_mac, i, flags)).collect();
    let start = Instant::now();
    let mut k = 0usize;
    let mut steady = 0u64;
    while start.elapsed() < o.duration {
        sock.reclaim();
        let mut room = 64;
        if o.pps > 0 {
            let due = (start.elapsed().as_secs_f64() * o.pps as f64) as u64;
            room = due.saturating_sub(steady).min(64) as usize;
            if room == 0 {
                // Ahead of the rate: leave the core to others (the sink may
                // share it).
                std::thread::sleep(Duration::from_micros(20));
                continue;
            }
        }
        steady += sock.transmit(room, |buf| {
            let f = &frames[k];
            k = if k + 1 == frames.len() { 0 } else { k + 1 };
            buf[..f.len()].copy_from_slice(f);
            f.len()
        }) as u64;
    }
    Ok(WireReport { sent: sent + steady, elapsed: start.elapsed() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_wire::packet::{Checks, Frame, parse};

    #[test]
    fn frames_are_64_bytes_on_the_wire_with_valid_checksums() {
        for proto in [PROTO_UDP, PROTO_TCP] {
            let o = WireOptions {
                via: Via::Xdp,
                interface: "x".into(),
                dst_mac: [2, 0, 0, 0, 0, 9],
                src: Ipv4Addr::new(10, 90, 0, 1),
                dst: "10.90.0.100:9000".parse().expect("an address"),
                proto,
                flows: 3,
                duration: Duration::ZERO,
                pps: 0,
            };
            let f = frame(&o, [2, 0, 0, 0, 0, 1], 2, TCP_ACK);
            assert_eq!(f.len(), 60);
            assert_eq!(&f[0..6], &[2, 0, 0, 0, 0, 9]);
            match parse(&f, Checks::default()) {
                Ok(Frame::Ip(ip)) => {
                    assert_eq!((ip.flow.proto, ip.flow.sport, ip.flow.dport), (proto, 10002, 9000));
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(parse_mac("02:00:0a:ff:00:01"), Some([2, 0, 10, 255, 0, 1]));
        assert_eq!(parse_mac("02:00"), None);
        // The generator's config: headers, then TCP or not, and the flows.
        let f = vec![7u8; 60];
        let c = xdp_config(&f, PROTO_TCP, 5);
        assert_eq!(&c[..54], &f[..54]);
        assert_eq!(u32::from_ne_bytes([c[56], c[57], c[58], c[59]]), 1);
        assert_eq!(u32::from_ne_bytes([c[60], c[61], c[62], c[63]]), 5);
    }
}
