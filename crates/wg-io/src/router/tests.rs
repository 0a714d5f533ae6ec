//! Two routers wired WAN to WAN in memory: site A's LAN 10.1.0.0/24 and
//! fd00:1::/64, site B's 10.2.0.0/24 and fd00:2::/64. Frames go through
//! A's seal path and B's open path and come out as B's LAN would see them.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use gatehouse_link::nexthop::{NextHops, Route};
use gatehouse_wg::crypto::StaticSecret;
use gatehouse_wg::device::{Device, DropReason, Received};
use gatehouse_wg::transport::TransportError;
use gatehouse_wire::checksum;
use gatehouse_wire::packet::build;
use rand_core::OsRng;

use super::io::datagram_of;
use super::pipeline::{WanSender, open_vector, seal_vector};
use super::*;

const A_LAN_MAC: [u8; 6] = [2, 0, 0, 0, 0xa, 1];
const A_WAN_MAC: [u8; 6] = [2, 0, 0, 0, 0xa, 2];
const B_LAN_MAC: [u8; 6] = [2, 0, 0, 0, 0xb, 1];
const B_WAN_MAC: [u8; 6] = [2, 0, 0, 0, 0xb, 2];
const HOST_A: [u8; 6] = [2, 0, 0, 0, 0xa, 0x55];
const HOST_B: [u8; 6] = [2, 0, 0, 0, 0xb, 0x99];
const PORT: u16 = 51820;
const EPOCH: Duration = Duration::from_secs(1_700_000_000);

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

fn route(net: &str, prefix: u8) -> Route {
    Route { net: ip(net), prefix, gateway: None, metric: 0 }
}

fn hops(routes: Vec<Route>, neighbours: &[(&str, [u8; 6])]) -> Arc<NextHops> {
    Arc::new(NextHops { routes, neighbours: neighbours.iter().map(|(a, m)| (ip(a), *m)).collect() })
}

struct Site {
    router: Router,
    dev: Mutex<Device<OsRng>>,
}

struct Lab {
    a: Site,
    b: Site,
    now: Instant,
}

/// A's and B's WAN endpoints over the outer family.
fn ends(v6_outer: bool) -> (SocketAddr, SocketAddr) {
    if v6_outer {
        (SocketAddr::new(ip("2001:db8::1"), PORT), SocketAddr::new(ip("2001:db8::2"), PORT))
    } else {
        (SocketAddr::new(ip("192.0.2.1"), PORT), SocketAddr::new(ip("192.0.2.2"), PORT))
    }
}

/// An IPv4 packet with header byte `at` set to `value`, checksum made again.
fn with_ipv4_byte(mut p: Vec<u8>, at: usize, value: u8) -> Vec<u8> {
    p[at] = value;
    p[10..12].fill(0);
    let c = checksum::checksum(&p[..20]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p
}

/// Two sites, each the other's peer, with sessions up (B started them).
fn lab(v6_outer: bool) -> Lab {
    let now = Instant::now();
    let wan = |v4: &str, v6: &str, mac, peer4: &str, peer6: &str, peer_mac| Side {
        mac,
        v4: Some(v4.parse().expect("v4")),
        v6: Some(v6.parse().expect("v6")),
        hops: hops(vec![route("192.0.2.0", 24), route("2001:db8::", 64)], &[(peer4, peer_mac), (peer6, peer_mac)]),
    };
    let a = Router {
        lan: Side {
            mac: A_LAN_MAC,
            v4: Some("10.1.0.1".parse().expect("v4")),
            v6: Some("fd00:1::1".parse().expect("v6")),
            hops: hops(
                vec![route("10.1.0.0", 24), route("fd00:1::", 64)],
                &[("10.1.0.5", HOST_A), ("fd00:1::5", HOST_A)],
            ),
        },
        wan: wan("192.0.2.1", "2001:db8::1", A_WAN_MAC, "192.0.2.2", "2001:db8::2", B_WAN_MAC),
        port: PORT,
        mtu: 1420,
    };
    let b = Router {
        lan: Side {
            mac: B_LAN_MAC,
            v4: Some("10.2.0.1".parse().expect("v4")),
            v6: Some("fd00:2::1".parse().expect("v6")),
            hops: hops(
                vec![route("10.2.0.0", 24), route("fd00:2::", 64)],
                &[("10.2.0.9", HOST_B), ("fd00:2::9", HOST_B)],
            ),
        },
        wan: wan("192.0.2.2", "2001:db8::2", B_WAN_MAC, "192.0.2.1", "2001:db8::1", A_WAN_MAC),
        port: PORT,
        mtu: 1420,
    };
    let (a_end, b_end) = ends(v6_outer);
    let mut da = Device::new(StaticSecret::random(&mut OsRng), now, EPOCH, OsRng);
    let mut db = Device::new(StaticSecret::random(&mut OsRng), now, EPOCH, OsRng);
    da.add_peer(*db.public(), None, Some(b_end), None, &[(ip("10.2.0.0"), 24), (ip("fd00:2::"), 64)]).expect("peer");
    db.add_peer(*da.public(), None, Some(a_end), None, &[(ip("10.1.0.0"), 24), (ip("fd00:1::"), 64)]).expect("peer");
    // B starts: a keepalive-sized packet to A's LAN queues and initiates.
    let mut out = Vec::new();
    let probe = build::ipv4([10, 2, 0, 9], [10, 1, 0, 5], 17, &[0; 8]);
    db.send(&probe, now, &mut out).expect("queued");
    let mut replies = Vec::new();
    let mut buf = Vec::new();
    da.receive(&out[0].datagram, b_end, now, &mut replies, &mut buf);
    let mut data = Vec::new();
    db.receive(&replies[0].datagram, a_end, now, &mut data, &mut buf);
    // The queued packet confirms the session to A.
    let r = da.receive(&data[0].datagram, b_end, now, &mut Vec::new(), &mut buf);
    assert!(matches!(r, Received::Packet { .. }), "{r:?}");
    Lab { a: Site { router: a, dev: Mutex::new(da) }, b: Site { router: b, dev: Mutex::new(db) }, now }
}

/// A LAN frame from host `src_mac` to the router's `dst_mac`, in a frame
/// buffer laid out as AF_XDP hands it over.
fn in_frame(to_mac: [u8; 6], from_mac: [u8; 6], packet: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 2048];
    f[256..262].copy_from_slice(&to_mac);
    f[262..268].copy_from_slice(&from_mac);
    let kind: u16 = if packet[0] >> 4 == 6 { 0x86dd } else { 0x0800 };
    f[268..270].copy_from_slice(&kind.to_be_bytes());
    f[270..270 + packet.len()].copy_from_slice(packet);
    f
}

fn udp4(src: [u8; 4], dst: [u8; 4], payload: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let seg = build::udp(4000, 5000, &data, |len| checksum::pseudo_v4(src, dst, 17, len as u16));
    build::ipv4(src, dst, 17, &seg)
}

fn udp6(src: &str, dst: &str, payload: usize) -> Vec<u8> {
    let (s, d) = (ip(src), ip(dst));
    let (IpAddr::V6(s), IpAddr::V6(d)) = (s, d) else { panic!("v6") };
    let data: Vec<u8> = (0..payload).map(|i| (i * 7) as u8).collect();
    let seg = build::udp(4000, 5000, &data, |len| checksum::pseudo_v6(s.octets(), d.octets(), 17, len as u32));
    build::ipv6(s.octets(), d.octets(), 17, &seg)
}

/// Runs frames (whole buffers, data at 256) through a path; returns the
/// frames sent, as bytes, with the fates and what else came out.
fn run(
    site: &Site,
    seal: Option<WanSender>,
    bufs: &mut [Vec<u8>],
    lens: &[usize],
    now: Instant,
) -> (Vec<Vec<u8>>, Vec<Fate>, Extra, Counts) {
    let mut frames: Vec<Frame<'_>> =
        bufs.iter_mut().zip(lens).map(|(b, &len)| Frame { mem: &mut b[..], head: 256, len }).collect();
    let (mut fates, mut extra, mut counts) = (Vec::new(), Extra::default(), Counts::default());
    if let Some(sender) = seal {
        seal_vector(&site.router, sender, &site.dev, &mut frames, &mut fates, &mut extra, &mut counts, now);
    } else {
        open_vector(&site.router, &site.dev, &mut frames, &mut fates, &mut extra, &mut counts, now);
    }
    let sent = frames
        .iter()
        .zip(&fates)
        .filter_map(|(f, fate)| match *fate {
            Fate::Send { head, len } => Some(f.mem[head..head + len].to_vec()),
            _ => None,
        })
        .collect();
    (sent, fates, extra, counts)
}

/// Site A seals `packets` from its LAN host; returns the WAN frames.
fn a_to_wan(l: &Lab, packets: &[Vec<u8>]) -> (Vec<Vec<u8>>, Extra, Counts) {
    a_to_wan_for(l, packets, WanSender::Frames)
}

fn a_to_wan_for(l: &Lab, packets: &[Vec<u8>], sender: WanSender) -> (Vec<Vec<u8>>, Extra, Counts) {
    let mut bufs: Vec<Vec<u8>> = packets.iter().map(|p| in_frame(A_LAN_MAC, HOST_A, p)).collect();
    let lens: Vec<usize> = packets.iter().map(|p| 14 + p.len()).collect();
    let (sent, _, extra, counts) = run(&l.a, Some(sender), &mut bufs, &lens, l.now);
    (sent, extra, counts)
}

/// Site B opens WAN frames; returns its LAN frames.
fn b_from_wan(l: &Lab, wan: &[Vec<u8>]) -> (Vec<Vec<u8>>, Extra, Counts) {
    let mut bufs: Vec<Vec<u8>> = wan
        .iter()
        .map(|w| {
            let mut b = vec![0u8; 2048];
            b[256..256 + w.len()].copy_from_slice(w);
            b
        })
        .collect();
    let lens: Vec<usize> = wan.iter().map(Vec::len).collect();
    let (sent, _, extra, counts) = run(&l.b, None, &mut bufs, &lens, l.now);
    (sent, extra, counts)
}

/// The packet as B's LAN host gets it: TTL two lower, checksum updated.
fn forwarded(p: &[u8]) -> Vec<u8> {
    let mut q = p.to_vec();
    if q[0] >> 4 == 4 {
        q[8] -= 2;
        q[10..12].fill(0);
        let c = checksum::checksum(&q[..20]);
        q[10..12].copy_from_slice(&c.to_be_bytes());
    } else {
        q[7] -= 2;
    }
    q
}

fn outer_is_valid(frame: &[u8], v6: bool) {
    let p = &frame[14..];
    let h = gatehouse_wire::forward::header(p).expect("a valid outer packet");
    assert_eq!(h.v6, v6);
    assert_eq!(h.len, p.len());
    let udp = &p[h.header_len..];
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), PORT);
    let pseudo = match (h.src, h.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => checksum::pseudo_v4(s.octets(), d.octets(), 17, udp.len() as u16),
        (IpAddr::V6(s), IpAddr::V6(d)) => checksum::pseudo_v6(s.octets(), d.octets(), 17, udp.len() as u32),
        _ => panic!("mixed families"),
    };
    assert_eq!(checksum::fold(checksum::add(pseudo, udp)), 0xffff, "UDP checksum");
}

#[test]
fn packets_cross_both_ways_over_either_family() {
    for v6_outer in [false, true] {
        let l = lab(v6_outer);
        let packets = vec![
            udp4([10, 1, 0, 5], [10, 2, 0, 9], 10),
            udp4([10, 1, 0, 5], [10, 2, 0, 9], 1392),
            udp6("fd00:1::5", "fd00:2::9", 100),
            udp6("fd00:1::5", "fd00:2::9", 1372),
        ];
        let (wan, extra, counts) = a_to_wan(&l, &packets);
        assert_eq!((wan.len(), counts.sealed), (4, 4), "{counts:?}");
        assert!(extra.transmits.is_empty() && extra.to_lan.is_empty());
        for w in &wan {
            assert_eq!(&w[..6], &B_WAN_MAC, "to B's WAN MAC");
            assert_eq!(&w[6..12], &A_WAN_MAC);
            outer_is_valid(w, v6_outer);
        }
        let (lan, _, counts) = b_from_wan(&l, &wan);
        assert_eq!(counts.opened, 4, "{counts:?}");
        for (got, sent) in lan.iter().zip(&packets) {
            assert_eq!(&got[..6], &HOST_B, "to the LAN host's MAC");
            assert_eq!(&got[6..12], &B_LAN_MAC);
            assert_eq!(&got[14..], &forwarded(sent)[..], "the packet, one hop per router further");
        }
        // The same datagrams again are replays.
        let (lan, _, counts) = b_from_wan(&l, &wan);
        assert!(lan.is_empty());
        assert_eq!(counts.device[DropReason::Transport(TransportError::Replay).index()], 4);
    }
}

/// The frame A's kernel would send for a datagram its UDP socket was
/// given: its own headers and checksums, behind B's WAN MAC.
fn as_the_kernel_sends(payload: &[u8], from: SocketAddr, to: SocketAddr) -> Vec<u8> {
    let (ether, packet) = match (from.ip(), to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let (s, d) = (s.octets(), d.octets());
            let seg = build::udp(from.port(), to.port(), payload, |len| checksum::pseudo_v4(s, d, 17, len as u16));
            (0x0800u16, build::ipv4(s, d, 17, &seg))
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let (s, d) = (s.octets(), d.octets());
            let seg = build::udp(from.port(), to.port(), payload, |len| checksum::pseudo_v6(s, d, 17, len as u32));
            (0x86dd, build::ipv6(s, d, 17, &seg))
        }
        _ => panic!("mixed families"),
    };
    let mut f = B_WAN_MAC.to_vec();
    f.extend_from_slice(&A_WAN_MAC);
    f.extend_from_slice(&ether.to_be_bytes());
    f.extend_from_slice(&packet);
    f
}

#[test]
fn sealed_for_the_kernels_socket_without_a_neighbour_still_reach_the_peer() {
    for v6_outer in [false, true] {
        let mut l = lab(v6_outer);
        // A's WAN next hop is not resolved: the kernel's socket finds it.
        let routes = l.a.router.wan.hops.routes.clone();
        l.a.router.wan.hops = Arc::new(NextHops { routes, neighbours: Default::default() });
        let packets = vec![udp4([10, 1, 0, 5], [10, 2, 0, 9], 10), udp6("fd00:1::5", "fd00:2::9", 1372)];
        let (wan, extra, counts) = a_to_wan_for(&l, &packets, WanSender::Kernel);
        assert_eq!((wan.len(), counts.sealed), (2, 2), "{counts:?}");
        assert!(extra.resolve_wan.is_empty(), "nothing to resolve: the kernel sends");
        let (a_end, b_end) = ends(v6_outer);
        let again: Vec<Vec<u8>> = wan
            .iter()
            .map(|w| {
                let (payload, to, ecn) = datagram_of(w).expect("the datagram reads back");
                assert_eq!((to, ecn), (b_end, 0));
                as_the_kernel_sends(payload, a_end, to)
            })
            .collect();
        let (lan, _, counts) = b_from_wan(&l, &again);
        assert_eq!(counts.opened, 2, "{counts:?}");
        for (got, sent) in lan.iter().zip(&packets) {
            assert_eq!(&got[14..], &forwarded(sent)[..]);
        }
        // Framed for the AF_XDP socket, the same miss drops and asks.
        let (wan, extra, counts) = a_to_wan(&l, &packets);
        assert!(wan.is_empty());
        assert_eq!(counts.drops[RouterDrop::NoNextHop.index()], 2);
        assert_eq!(extra.resolve_wan.len(), 1);
    }
}

#[test]
fn each_packet_of_a_vector_goes_to_its_own_next_hop() {
    let mut l = lab(false);
    const HOST_B2: [u8; 6] = [2, 0, 0, 0, 0xb, 0x77];
    let routes = l.b.router.lan.hops.routes.clone();
    l.b.router.lan.hops = Arc::new(NextHops {
        routes,
        neighbours: [(ip("10.2.0.9"), HOST_B), (ip("10.2.0.7"), HOST_B2)].into_iter().collect(),
    });
    let to = |last: u8| udp4([10, 1, 0, 5], [10, 2, 0, last], 40);
    let packets = vec![to(9), to(9), to(7), to(9), to(7)];
    let (wan, _, _) = a_to_wan(&l, &packets);
    let (lan, _, counts) = b_from_wan(&l, &wan);
    assert_eq!(counts.opened, 5, "{counts:?}");
    let macs: Vec<&[u8]> = lan.iter().map(|f| &f[..6]).collect();
    assert_eq!(macs, vec![&HOST_B[..], &HOST_B, &HOST_B2, &HOST_B, &HOST_B2]);
}

#[test]
fn an_inner_source_outside_the_peers_allowed_ips_is_dropped() {
    let l = lab(false);
    let (wan, _, _) = a_to_wan(&l, &[udp4([10, 9, 9, 9], [10, 2, 0, 9], 40)]);
    assert_eq!(wan.len(), 1, "A seals what its LAN sends");
    let (lan, _, counts) = b_from_wan(&l, &wan);
    assert!(lan.is_empty());
    assert_eq!(counts.device[DropReason::NotAllowedSource.index()], 1);
}

#[test]
fn routers_answer_with_icmp_and_fragment_what_may_be() {
    let l = lab(false);
    let ttl1 = with_ipv4_byte(udp4([10, 1, 0, 5], [10, 2, 0, 9], 20), 8, 1);
    let big_df = udp4([10, 1, 0, 5], [10, 2, 0, 9], 1472);
    let mut big = big_df.clone();
    big[6] = 0; // DF off
    big[10..12].fill(0);
    let c = checksum::checksum(&big[..20]);
    big[10..12].copy_from_slice(&c.to_be_bytes());
    let big6 = udp6("fd00:1::5", "fd00:2::9", 1452);
    let (wan, extra, counts) = a_to_wan(&l, &[ttl1, big_df, big.clone(), big6]);
    assert!(wan.is_empty());
    assert_eq!(counts.drops[RouterDrop::TimeExceeded.index()], 1);
    assert_eq!(counts.drops[RouterDrop::TooBig.index()], 2);
    assert_eq!((counts.icmp, counts.fragments, counts.sealed), (3, 2, 2));
    let kinds: Vec<(u8, u8, u32)> = extra
        .to_lan
        .iter()
        .map(|f| {
            assert_eq!(&f[..6], &HOST_A, "back to the sender");
            let p = &f[14..];
            let at = if p[0] >> 4 == 4 { 20 } else { 40 };
            (p[at], p[at + 1], u32::from_be_bytes([p[at + 4], p[at + 5], p[at + 6], p[at + 7]]))
        })
        .collect();
    assert_eq!(kinds, [(11, 0, 0), (3, 4, 1420), (2, 0, 1420)]);
    // The fragments open at B and add up to the packet.
    assert_eq!(extra.to_wan.len(), 2);
    let (lan, _, counts) = b_from_wan(&l, &extra.to_wan);
    assert_eq!(counts.opened, 2);
    let data: Vec<u8> = lan.iter().flat_map(|f| f[14 + 20..].to_vec()).collect();
    assert_eq!(data, &big[20..]);
}

#[test]
fn the_wan_side_drops_and_counts_what_is_not_ours() {
    let l = lab(false);
    let (wan, _, _) = a_to_wan(&l, &[udp4([10, 1, 0, 5], [10, 2, 0, 9], 64)]);
    let good = wan[0].clone();
    let mut wrong_port = good.clone();
    wrong_port[14 + 20 + 2] ^= 1;
    let mut truncated = good.clone();
    truncated.truncate(14 + 20 + 4);
    let mut fragment = good.clone();
    fragment[14 + 6] = 0x20;
    fragment[14 + 10..14 + 12].fill(0);
    let c = checksum::checksum(&fragment[14..14 + 20]);
    fragment[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
    let mut garbage = good.clone();
    garbage[14 + 28] = 9; // an unknown message type
    let mut forged = good.clone();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    let (lan, extra, counts) = b_from_wan(&l, &[wrong_port, truncated, fragment, garbage, forged, good]);
    assert_eq!(lan.len(), 1, "only the genuine one");
    assert_eq!(counts.drops[RouterDrop::NotOurs.index()], 1);
    assert_eq!(counts.drops[RouterDrop::Malformed.index()], 1);
    assert_eq!(counts.drops[RouterDrop::OuterFragment.index()], 1);
    assert_eq!(extra.handshakes.len(), 1, "not transport data: the control thread's to refuse");
    assert_eq!(counts.device[DropReason::Transport(TransportError::Decrypt).index()], 1);
}

#[test]
fn an_unknown_next_hop_is_dropped_and_resolved() {
    let mut l = lab(false);
    l.b.router.lan.hops = hops(vec![route("10.2.0.0", 24)], &[]);
    let (wan, _, _) = a_to_wan(&l, &[udp4([10, 1, 0, 5], [10, 2, 0, 9], 64)]);
    let (lan, extra, counts) = b_from_wan(&l, &wan);
    assert!(lan.is_empty());
    assert_eq!(counts.drops[RouterDrop::NoNextHop.index()], 1);
    assert_eq!(extra.resolve_lan, [ip("10.2.0.9")]);
    // No route at all for a destination: dropped at A, nothing to resolve.
    let (wan, extra, counts) = a_to_wan(&l, &[udp4([10, 1, 0, 5], [10, 3, 0, 9], 64)]);
    assert!(wan.is_empty() && extra.resolve_wan.is_empty());
    assert_eq!(counts.device[DropReason::NoRoute.index()], 1);
}

#[test]
fn a_packet_without_a_session_waits_for_the_handshake() {
    let l = lab(false);
    let now = l.now + Duration::from_secs(200);
    // Past the session's life: the packet waits and an initiation goes.
    let mut bufs = vec![in_frame(A_LAN_MAC, HOST_A, &udp4([10, 1, 0, 5], [10, 2, 0, 9], 64))];
    let (sent, fates, extra, _) = run(&l.a, Some(WanSender::Frames), &mut bufs, &[14 + 92], now);
    assert!(sent.is_empty());
    assert_eq!(fates, [Fate::Taken]);
    assert_eq!(extra.transmits.len(), 1);
    assert_eq!(extra.transmits[0].datagram[0], gatehouse_wg::messages::INITIATION);
}

/// A worker takes a turn's vectors through one `Extra`: the initiation
/// the LAN side's vector made must still be there when the turn ends, after
/// the WAN side's vector (and the kernel socket's) made room for theirs.
#[test]
fn an_initiation_made_by_a_turns_lan_vector_outlives_its_wan_vector() {
    let l = lab(false);
    let now = l.now + Duration::from_secs(200);
    let (mut fates, mut extra, mut counts) = (Vec::new(), Extra::default(), Counts::default());
    let mut lan = [in_frame(A_LAN_MAC, HOST_A, &udp4([10, 1, 0, 5], [10, 2, 0, 9], 64))];
    let mut frames: Vec<Frame<'_>> =
        lan.iter_mut().map(|b| Frame { mem: &mut b[..], head: 256, len: 14 + 92 }).collect();
    extra.clear_vector();
    seal_vector(&l.a.router, WanSender::Frames, &l.a.dev, &mut frames, &mut fates, &mut extra, &mut counts, now);
    assert_eq!(fates, [Fate::Taken]);
    // The same turn's WAN vector: a datagram that is not ours.
    let mut wan = in_frame(A_WAN_MAC, B_WAN_MAC, &udp4([192, 0, 2, 2], [192, 0, 2, 1], 7));
    let mut frames = vec![Frame { mem: &mut wan[..], head: 256, len: 14 + 35 }];
    extra.clear_vector();
    open_vector(&l.a.router, &l.a.dev, &mut frames, &mut fates, &mut extra, &mut counts, now);
    assert_eq!(fates, [Fate::Drop]);
    assert_eq!(extra.transmits.len(), 1, "the initiation was lost");
    assert_eq!(extra.transmits[0].datagram[0], gatehouse_wg::messages::INITIATION);
}

/// One random change to a frame: a bit, a byte, a length field, its end.
fn mutate(rng: &mut fastrand::Rng, f: &mut Vec<u8>) {
    match rng.u8(..6) {
        0 => {
            let at = rng.usize(..f.len());
            f[at] ^= 1 << rng.u8(..8);
        }
        1 => {
            let at = rng.usize(..f.len());
            f[at] = rng.u8(..);
        }
        2 => f.truncate(rng.usize(..f.len())),
        3 => f.extend((0..rng.usize(1..64)).map(|_| rng.u8(..))),
        // The IPv4 total length or the UDP length.
        4 if f.len() > 40 => {
            let at = if rng.bool() { 14 + 2 } else { 14 + 20 + 4 };
            f[at..at + 2].copy_from_slice(&rng.u16(..).to_be_bytes());
        }
        _ => {
            // The transport counter: a replay, or far ahead.
            if f.len() > 14 + 28 + 16 {
                let at = 14 + 28 + 8;
                f[at..at + 8].copy_from_slice(&rng.u64(..).to_le_bytes());
            }
        }
    }
}

/// A bounded fuzz of the WAN receive path (no coverage feedback; it runs
/// in `make test`): mutated copies of genuine frames, then the genuine
/// ones. Nothing panics, every frame gets one fate, and what reaches the
/// LAN is only ever a packet A's LAN sent, forwarded.
#[test]
fn mutated_wan_frames_never_panic_and_only_genuine_packets_pass() {
    let l = lab(false);
    let mut rng = fastrand::Rng::with_seed(36);
    let mut delivered = 0;
    for _ in 0..200 {
        let packets = vec![
            udp4([10, 1, 0, 5], [10, 2, 0, 9], rng.usize(0..1392)),
            udp6("fd00:1::5", "fd00:2::9", rng.usize(0..1372)),
        ];
        let expected: Vec<Vec<u8>> = packets.iter().map(|p| forwarded(p)).collect();
        let (wan, _, _) = a_to_wan(&l, &packets);
        let mut frames = Vec::new();
        for w in &wan {
            for _ in 0..6 {
                let mut m = w.clone();
                for _ in 0..rng.usize(1..4) {
                    if !m.is_empty() {
                        mutate(&mut rng, &mut m);
                    }
                }
                frames.push(m);
            }
        }
        frames.extend(wan.iter().cloned());
        frames.retain(|f| f.len() <= 2048 - 256);
        let mut bufs: Vec<Vec<u8>> = frames
            .iter()
            .map(|w| {
                let mut b = vec![0u8; 2048];
                b[256..256 + w.len()].copy_from_slice(w);
                b
            })
            .collect();
        let lens: Vec<usize> = frames.iter().map(Vec::len).collect();
        let (lan, fates, _, counts) = run(&l.b, None, &mut bufs, &lens, l.now);
        assert_eq!(fates.len(), frames.len());
        let dropped = counts.drops.iter().sum::<u64>() + counts.device.iter().sum::<u64>();
        let taken = fates.iter().filter(|f| **f == Fate::Taken).count() as u64;
        assert_eq!(counts.opened + dropped + taken, frames.len() as u64, "{counts:?}");
        for got in &lan {
            assert!(expected.iter().any(|e| e[..] == got[14..]), "only genuine packets reach the LAN");
        }
        delivered += lan.len();
    }
    assert!(delivered >= 400, "the genuine frames got through: {delivered}");
}

#[test]
fn datagrams_read_back_from_sealed_frames_open_at_the_peer() {
    for v6_outer in [false, true] {
        let l = lab(v6_outer);
        // Inner ECN bits (ECT(0), CE) go to the outer header (RFC 6040).
        let ect = with_ipv4_byte(udp4([10, 1, 0, 5], [10, 2, 0, 9], 64), 1, 2);
        let mut ce = udp6("fd00:1::5", "fd00:2::9", 64);
        ce[1] |= 3 << 4;
        let packets = vec![ect, ce, udp4([10, 1, 0, 5], [10, 2, 0, 9], 1392)];
        let (wan, _, _) = a_to_wan(&l, &packets);
        assert_eq!(wan.len(), 3);
        let (a_end, b_end) = ends(v6_outer);
        let outer = if v6_outer { 14 + 40 + 8 } else { 14 + 20 + 8 };
        for (w, ecn) in wan.iter().zip([2, 3, 0]) {
            let (payload, to, got_ecn) = io::datagram_of(w).expect("a datagram");
            assert_eq!((to, got_ecn), (b_end, ecn));
            assert_eq!(payload, &w[outer..], "the whole UDP payload");
            let mut dev = l.b.dev.lock().expect("device");
            let r = dev.receive(payload, a_end, l.now, &mut Vec::new(), &mut Vec::new());
            assert!(matches!(r, Received::Packet { .. }), "{r:?}");
        }
        // What the seal path did not make is not taken for a datagram.
        assert!(io::datagram_of(&wan[0][..outer - 1]).is_none());
        let mut arp = wan[0].clone();
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        assert!(io::datagram_of(&arp).is_none());
    }
}

#[test]
fn the_linger_grows_while_reads_find_few_frames_and_shrinks_when_they_fill() {
    use super::io::next_linger;
    let min = next_linger(Duration::from_micros(1), VECTOR);
    let mut l = min;
    let mut grew = vec![l];
    for _ in 0..6 {
        l = next_linger(l, 3);
        grew.push(l);
    }
    assert!(grew.windows(2).all(|w| w[1] >= w[0]), "{grew:?}");
    let max = l;
    assert!(max > min && max <= Duration::from_micros(200), "bounded: {max:?}");
    assert_eq!(next_linger(max, 3), max, "stays at its bound");
    assert_eq!(next_linger(max, VECTOR / 3), max, "a read of a third of a vector still grows it");
    let mid = max / 2;
    assert_eq!(next_linger(mid, VECTOR * 3 / 4), mid, "a read of three quarters keeps it");
    assert!(next_linger(mid, VECTOR / 4) > mid, "a read of a quarter grows it");
    let mut back = max;
    for _ in 0..6 {
        back = next_linger(back, VECTOR);
    }
    assert_eq!(back, min, "full reads bring it back to the shortest");
}
