//! What it costs to carry a small UDP datagram from one network namespace
//! to another over veth, by three paths a tunnel daemon could take for its
//! outer packets: a UDP socket a datagram at a time; UDP GSO on send and
//! UDP GRO on receive (what the WireGuard plane does); AF_XDP (native XDP on
//! veth, in copy mode, through this crate's `xsk` and `steer`). One sender
//! and one receiver process, both pinned to one CPU by the caller; each
//! prints its own run time (`/proc/self/schedstat`, which includes the
//! softirq work done in its context) and how many datagrams it moved.
//!
//! Driven by `bench/wg_outer_path.py`:
//!
//! ```text
//! outer_path rx sockets|gso ADDR:PORT SECONDS
//! outer_path rx xdp IFACE ADDR SECONDS
//! outer_path tx sockets|gso ADDR:PORT PPS BURST SECONDS
//! outer_path tx xdp IFACE SRC_MAC DST_MAC SRC DST PORT PPS BURST SECONDS
//! ```

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use gatehouse_l4::rewrite;
use gatehouse_l4_io::steer;
use gatehouse_link::xsk;
use gatehouse_wire::checksum;
use gatehouse_wire::packet::{ETHERTYPE_IPV4, PROTO_UDP, build};
use nix::sys::socket::{setsockopt, sockopt};

/// UDP payload bytes of every datagram: a 64-byte packet sealed by WireGuard.
const PAYLOAD: usize = 128;
const SOURCE_PORT: u16 = 40_000;

fn run_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/self/schedstat").expect("reads /proc/self/schedstat");
    s.split_whitespace().next().and_then(|v| v.parse().ok()).expect("schedstat's run time")
}

fn arg<T: std::str::FromStr>(a: &[String], i: usize, what: &str) -> T {
    a.get(i).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("argument {i}: {what}"))
}

fn mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s.split(':').filter_map(|x| u8::from_str_radix(x, 16).ok()).collect();
    v.try_into().expect("a MAC address as aa:bb:cc:dd:ee:ff")
}

/// The Ethernet + IPv4 + UDP frame every datagram is sent as, built once.
fn frame(macs: ([u8; 6], [u8; 6]), src: Ipv4Addr, dst: Ipv4Addr, port: u16) -> Vec<u8> {
    let (src, dst) = (src.octets(), dst.octets());
    let udp =
        build::udp(SOURCE_PORT, port, &[7u8; PAYLOAD], |len| checksum::pseudo_v4(src, dst, PROTO_UDP, len as u16));
    let mut f = build::eth(ETHERTYPE_IPV4, &build::ipv4(src, dst, PROTO_UDP, &udp));
    rewrite::set_macs(&mut f, macs.1, macs.0);
    f
}

/// Calls `send` once per burst, `pps / burst` times a second, until `end`;
/// returns the datagrams sent.
fn paced(pps: f64, burst: usize, end: Instant, mut send: impl FnMut() -> usize) -> u64 {
    let period = Duration::from_secs_f64(burst as f64 / pps);
    let mut next = Instant::now();
    let mut n = 0u64;
    while Instant::now() < end {
        n += send() as u64;
        next += period;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
    }
    n
}

fn receive(a: &[String], end: Instant) -> u64 {
    let path = a[2].as_str();
    let mut n = 0u64;
    if path == "xdp" {
        let dst: Ipv4Addr = arg(a, 4, "the receiver's address");
        let ifindex = nix::net::if_::if_nametoindex(a[3].as_str()).expect("the interface's index");
        let loaded = steer::Loaded::load().expect("loads the XDP program");
        let mut st = loaded.attach(&a[3], ifindex).expect("attaches the XDP program");
        let mut wanted = steer::Wanted::default();
        wanted.owned.insert(steer::addr_key(dst.into()));
        st.update(&wanted).expect("steers the address");
        let mut s = xsk::Socket::open(ifindex, 0, xsk::Config::default()).expect("opens an AF_XDP socket");
        st.set_socket(0, s.fd()).expect("registers the socket");
        eprintln!("native XDP {}, zero copy {}", st.native, s.zero_copy);
        let mut got = Vec::new();
        while Instant::now() < end {
            s.wait(100);
            got.clear();
            n += s.recv(&mut got, 64) as u64;
            for d in &got {
                s.recycle(d.addr);
            }
            s.refill();
        }
        return n;
    }
    let s = UdpSocket::bind(&a[3]).expect("binds the receiving socket");
    s.set_read_timeout(Some(Duration::from_millis(100))).expect("sets a read timeout");
    if path == "gso" {
        setsockopt(&s.as_fd(), sockopt::UdpGroSegment, &true).expect("turns UDP GRO on");
    }
    let mut buf = vec![0u8; 65_536];
    while Instant::now() < end {
        if let Ok(k) = s.recv(&mut buf) {
            n += k.div_ceil(PAYLOAD) as u64;
        }
    }
    n
}

fn transmit(a: &[String], end: Instant) -> u64 {
    let path = a[2].as_str();
    if path == "xdp" {
        let macs = (mac(&a[4]), mac(&a[5]));
        let (src, dst): (Ipv4Addr, Ipv4Addr) = (arg(a, 6, "source address"), arg(a, 7, "destination address"));
        let port: u16 = arg(a, 8, "destination port");
        let (pps, burst): (f64, usize) = (arg(a, 9, "packets per second"), arg(a, 10, "burst"));
        let ifindex = nix::net::if_::if_nametoindex(a[3].as_str()).expect("the interface's index");
        let mut s = xsk::Socket::open(ifindex, 0, xsk::Config::default()).expect("opens an AF_XDP socket");
        let f = frame(macs, src, dst, port);
        return paced(pps, burst, end, || {
            s.reclaim();
            s.transmit(burst, |b| {
                b[..f.len()].copy_from_slice(&f);
                f.len()
            })
        });
    }
    let to: SocketAddr = arg(a, 3, "destination address:port");
    let (pps, burst): (f64, usize) = (arg(a, 4, "packets per second"), arg(a, 5, "burst"));
    let s = UdpSocket::bind(("0.0.0.0", SOURCE_PORT)).expect("binds the sending socket");
    if path == "gso" {
        // One send per burst: the kernel cuts it into datagrams of PAYLOAD.
        setsockopt(&s.as_fd(), sockopt::UdpGsoSegment, &(PAYLOAD as i32)).expect("turns UDP GSO on");
        let buf = vec![7u8; PAYLOAD * burst];
        return paced(pps, burst, end, || if s.send_to(&buf, to).is_ok() { burst } else { 0 });
    }
    let buf = [7u8; PAYLOAD];
    paced(pps, burst, end, || (0..burst).filter(|_| s.send_to(&buf, to).is_ok()).count())
}

fn main() {
    let start = run_ns();
    let a: Vec<String> = std::env::args().collect();
    // The pacing sleeps wake when asked, not up to 50 µs later.
    let _ = nix::sys::prctl::set_timerslack(1000);
    let seconds: f64 = arg(&a, a.len() - 1, "seconds");
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let n = match a.get(1).map(String::as_str) {
        Some("rx") => receive(&a, end),
        Some("tx") => transmit(&a, end),
        _ => panic!("usage: outer_path rx|tx sockets|gso|xdp ..."),
    };
    println!("packets={n} run_ns={}", run_ns() - start);
}
