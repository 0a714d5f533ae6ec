//! `gatehouse bench l4-wire`: a packet generator for benchmarks on real
//! (virtual) links. It sends 64-byte UDP datagrams or TCP segments of a
//! fixed set of flows out of one interface through an AF_XDP socket, as
//! fast as it can or at a set rate, for a bounded time, and reports what
//! it sent. Whatever forwards them (Gatehouse, the kernel) is measured on
//! the other side of the link.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use gatehouse_l4::checksum;
use gatehouse_l4::packet::{ETHERTYPE_IPV4, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_SYN, build};

use crate::runtime::{parse_mac, sys};
use crate::xsk;

pub struct WireOptions {
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
    /// Packets per second; 0 for as fast as the link takes them.
    pub pps: u64,
}

pub struct WireReport {
    pub sent: u64,
    pub elapsed: Duration,
    pub zero_copy: bool,
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

pub fn generate(o: &WireOptions) -> Result<WireReport, String> {
    if o.proto != PROTO_UDP && o.proto != PROTO_TCP {
        return Err("the protocol must be tcp or udp".into());
    }
    let ifindex = nix::net::if_::if_nametoindex(o.interface.as_str()).map_err(|e| format!("interface {}: {e}", o.interface))?;
    let src_mac = parse_mac(&sys(&o.interface, "address")?).ok_or_else(|| format!("interface {}: no MAC address", o.interface))?;
    let mut sock = xsk::Socket::open(ifindex, 0, xsk::Config::default()).map_err(|e| format!("AF_XDP socket on {}: {e}", o.interface))?;
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
                std::hint::spin_loop();
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
    Ok(WireReport { sent: sent + steady, elapsed: start.elapsed(), zero_copy: sock.zero_copy })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_l4::packet::{Checks, Frame, parse};

    #[test]
    fn frames_are_64_bytes_on_the_wire_with_valid_checksums() {
        for proto in [PROTO_UDP, PROTO_TCP] {
            let o = WireOptions {
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
    }
}
