//! The WireGuard router's vector pipeline (`wg_io::router::pipeline`):
//! two sites, A and B, wired WAN to WAN in memory with a session up, each
//! a router between its LAN host (10.0.0.1 and fd00::1 behind A, 10.0.0.2
//! and fd00::2 behind B) and the WAN (192.0.2.1 and 192.0.2.2). Input: a
//! sequence of steps, each a byte of choices and then a vector of frames:
//!
//! - bits 0–1 of the choices: a vector from A's LAN, from B's LAN, to B's
//!   WAN, to A's WAN; bit 2, a LAN vector sealed for the kernel's UDP
//!   socket (else framed whole for the WAN's AF_XDP socket); bits 4–5,
//!   how far the clock moves first (0, 1, 5 or 20 s).
//! - a LAN vector: its length (1–8), then per frame a byte: its low two
//!   bits 0 for raw bytes (a two-byte length and the frame), else a UDP
//!   packet to the other site's host over IPv4 or IPv6, or to a host no
//!   peer serves, its payload length and TTL read next, DF by bit 2, bytes
//!   of it overwritten (bits 3–4 say how many, each a position and a value),
//!   the IPv4 header checksum made right again by bit 5.
//! - a WAN vector: its length, then per frame a byte: bit 0 clear takes a
//!   frame the other site sealed in an earlier step (by the next byte),
//!   bits 1–2 how many of its bytes to flip, bit 4 the outer checksums
//!   made right again (so a change reaches the AEAD or the counter); bit 0
//!   set, raw bytes.
//!
//! Properties: no panic; every frame gets one fate, and every drop is
//! counted; a frame sealed whole has valid outer headers and checksums,
//! to the peer's endpoint and its next hop's MAC, and one sealed for the
//! kernel reads back as a datagram to the peer; what reaches a LAN is a
//! valid IP packet to that LAN's host, from the other site's allowed IPs,
//! and is a packet (or a fragment of one) that the other site's LAN
//! sent, two hops further; ICMP errors go back to the sender whole;
//! afterwards a new packet still crosses from A to B (unless a changed
//! frame made A roam: then it goes where A now finds B).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatehouse_link::nexthop::{NextHops, Route};
use gatehouse_wg_io::router::io::datagram_of;
use gatehouse_wg_io::router::pipeline::{WanSender, open_vector, seal_vector};
use gatehouse_wg_io::router::{Counts, Extra, Fate, Frame, Router, RouterDrop, Side};
use gatehouse_wire::checksum;
use gatehouse_wire::forward;
use gatehouse_wire::packet::build;

use crate::input::Input;
use crate::wg_pair::{Dev, established, start};

const PORT: u16 = 51820;
/// Where a frame starts in its buffer, as the AF_XDP socket hands it over.
const HEAD: usize = 256;
const BUFFER: usize = 2048;
const MTU: usize = 1420;
/// Steps at most per input, and how far the clock may move in all: the
/// sessions stay younger than their rekey time, so the last check holds.
const STEPS: usize = 16;
const CLOCK_LIMIT: Duration = Duration::from_secs(100);

const LAN_MAC: [[u8; 6]; 2] = [[2, 0, 0, 0, 0xa, 1], [2, 0, 0, 0, 0xb, 1]];
const WAN_MAC: [[u8; 6]; 2] = [[2, 0, 0, 0, 0xa, 2], [2, 0, 0, 0, 0xb, 2]];
const HOST_MAC: [[u8; 6]; 2] = [[2, 0, 0, 0, 0xa, 0x55], [2, 0, 0, 0, 0xb, 0x99]];
const HOST4: [[u8; 4]; 2] = [[10, 0, 0, 1], [10, 0, 0, 2]];
const HOST6: [&str; 2] = ["fd00::1", "fd00::2"];
const WAN4: [[u8; 4]; 2] = [[192, 0, 2, 1], [192, 0, 2, 2]];

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or(IpAddr::from([0u8; 4]))
}

fn host6(site: usize) -> [u8; 16] {
    match ip(HOST6[site]) {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(_) => [0; 16],
    }
}

/// Site `s`'s router: its host on the LAN, the other site's WAN address
/// as the WAN's one neighbour.
fn router(s: usize) -> Router {
    let o = 1 - s;
    let route = |net: IpAddr, prefix| Route { net, prefix, gateway: None, metric: 0 };
    Router {
        lan: Side {
            mac: LAN_MAC[s],
            v4: Some([10, 9, s as u8, 1].into()),
            v6: None,
            hops: Arc::new(NextHops {
                routes: vec![route(HOST4[s].into(), 32), route(ip(HOST6[s]), 128)],
                neighbours: [(HOST4[s].into(), HOST_MAC[s]), (ip(HOST6[s]), HOST_MAC[s])].into_iter().collect(),
            }),
        },
        wan: Side {
            mac: WAN_MAC[s],
            v4: Some(WAN4[s].into()),
            v6: None,
            hops: Arc::new(NextHops {
                routes: vec![route([192, 0, 2, 0].into(), 24)],
                neighbours: [(WAN4[o].into(), WAN_MAC[o])].into_iter().collect(),
            }),
        },
        port: PORT,
        mtu: MTU,
    }
}

struct Site {
    router: Router,
    dev: Mutex<Dev>,
    /// Packets this site's LAN gave its seal path, whole by their headers.
    sent: Vec<Vec<u8>>,
    /// Frames this site sealed, as its peer's WAN gets them.
    wire: Vec<Vec<u8>>,
}

/// A UDP packet from site `s`'s host: to the other site's host over IPv4
/// (`kind` 1) or IPv6 (2), or over IPv4 to a host no peer serves (3).
fn packet(s: usize, kind: u8, payload: usize, ttl: u8, df: bool) -> Vec<u8> {
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    if kind == 2 {
        let (src, dst) = (host6(s), host6(1 - s));
        let seg = build::udp(4000, 5000, &data, |len| checksum::pseudo_v6(src, dst, 17, len as u32));
        let mut p = build::ipv6(src, dst, 17, &seg);
        p[7] = ttl;
        p
    } else {
        let dst = if kind == 1 { HOST4[1 - s] } else { [10, 0, 3, 3] };
        let seg = build::udp(4000, 5000, &data, |len| checksum::pseudo_v4(HOST4[s], dst, 17, len as u16));
        let mut p = build::ipv4(HOST4[s], dst, 17, &seg);
        p[8] = ttl;
        if !df {
            p[6] = 0;
        }
        ipv4_checksum(&mut p);
        p
    }
}

fn ipv4_checksum(p: &mut [u8]) {
    if p.len() >= 20 && p[0] >> 4 == 4 {
        let n = (usize::from(p[0] & 15) * 4).clamp(20, p.len());
        p[10..12].fill(0);
        let c = checksum::checksum(&p[..n]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
    }
}

fn ethernet(to: [u8; 6], from: [u8; 6], packet: &[u8]) -> Vec<u8> {
    let kind: u16 = if packet.first().is_some_and(|b| b >> 4 == 6) { 0x86dd } else { 0x0800 };
    [&to[..], &from, &kind.to_be_bytes(), packet].concat()
}

/// An outer IPv4 frame's header checksum and UDP checksum made right for
/// its bytes as they are now.
fn outer_checksums(f: &mut [u8]) {
    if f.len() < 14 + 28 || f[12..14] != [8, 0] || f[14] != 0x45 {
        return;
    }
    ipv4_checksum(&mut f[14..]);
    let four = |at: usize| [f[at], f[at + 1], f[at + 2], f[at + 3]];
    let (src, dst) = (four(26), four(30));
    let udp = &mut f[34..];
    let len = usize::from(u16::from_be_bytes([udp[4], udp[5]])).clamp(8, udp.len());
    udp[6..8].fill(0);
    let sum = checksum::fold(checksum::add(checksum::pseudo_v4(src, dst, 17, len as u16), &udp[..len]));
    udp[6..8].copy_from_slice(&(!sum).to_be_bytes());
}

/// A frame in a buffer laid out as the AF_XDP socket hands it over
/// (every frame here fits: raw ones are under 1,600 bytes, the others a
/// packet of at most 1,547 and its headers).
fn buffer(frame: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; BUFFER];
    b[HEAD..HEAD + frame.len()].copy_from_slice(frame);
    b
}

/// Runs a vector through site `s`'s seal (`sender` Some) or open path;
/// returns the frames sent on, with the fates, counts and extra.
fn run_path(
    site: &Site,
    sender: Option<WanSender>,
    frames: &[Vec<u8>],
    now: Instant,
) -> (Vec<Vec<u8>>, Vec<Fate>, Counts, Extra) {
    let mut bufs: Vec<Vec<u8>> = frames.iter().map(|f| buffer(f)).collect();
    let mut list: Vec<Frame<'_>> =
        bufs.iter_mut().zip(frames).map(|(b, f)| Frame { mem: &mut b[..], head: HEAD, len: f.len() }).collect();
    let (mut fates, mut extra, mut counts) = (Vec::new(), Extra::default(), Counts::default());
    match sender {
        Some(s) => seal_vector(&site.router, s, &site.dev, &mut list, &mut fates, &mut extra, &mut counts, now),
        None => open_vector(&site.router, &site.dev, &mut list, &mut fates, &mut extra, &mut counts, now),
    }
    assert_eq!(fates.len(), frames.len(), "a frame got no fate");
    let sent = list
        .iter()
        .zip(&fates)
        .filter_map(|(f, fate)| match *fate {
            Fate::Send { head, len } => {
                assert!(head + len <= f.mem.len(), "a frame sent past its buffer");
                Some(f.mem[head..head + len].to_vec())
            }
            _ => None,
        })
        .collect();
    (sent, fates, counts, extra)
}

fn drops(c: &Counts) -> u64 {
    c.drops.iter().sum::<u64>() + c.device.iter().sum::<u64>()
}

/// Where site `s`'s device now sends to its peer: its configured
/// endpoint, or where an authenticated packet last came from (roaming).
fn peer_endpoint(site: &Site) -> Option<SocketAddr> {
    let dev = site.dev.lock().unwrap_or_else(|e| e.into_inner());
    dev.peer_ids().next().and_then(|id| dev.endpoint(id))
}

/// A frame sealed whole for the WAN: valid outer IPv4 and UDP, from our
/// address to the peer's endpoint `to`, to the next hop's MAC (the one
/// neighbour the WAN has).
fn check_outer(s: usize, f: &[u8], to: Option<SocketAddr>) {
    let o = 1 - s;
    assert_eq!(&f[..6], &WAN_MAC[o], "sealed to the peer's MAC");
    assert_eq!(&f[6..12], &WAN_MAC[s]);
    let h = forward::header(&f[14..]).unwrap_or_else(|e| panic!("a sealed frame's outer header: {e:?}"));
    assert_eq!(h.len, f.len() - 14, "the outer length is the frame's");
    let udp = &f[14 + h.header_len..];
    let dst = SocketAddr::new(h.dst, u16::from_be_bytes([udp[2], udp[3]]));
    assert_eq!((h.src, Some(dst)), (IpAddr::from(WAN4[s]), to), "sealed from us to the peer's endpoint");
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (h.src, h.dst) else { panic!("an outer family we have no address of") };
    let pseudo = checksum::pseudo_v4(src.octets(), dst.octets(), 17, udp.len() as u16);
    assert_eq!(checksum::fold(checksum::add(pseudo, udp)), 0xffff, "the UDP checksum");
}

/// Whether `got` (delivered to a LAN) is `sent` (given to the other
/// site's LAN) two hops further: TTL or hop limit two lower, the ECN
/// field as sent or CE (a congested outer packet), else the same bytes.
fn forwarded(got: &[u8], sent: &[u8]) -> bool {
    if got.len() != sent.len() || got.len() < 20 {
        return false;
    }
    let v6 = got[0] >> 4 == 6;
    // The TTL's (hop limit's) byte, the ECN field's place in byte 1, and
    // the IPv4 header checksum, which the TTL changes.
    let (ttl, ecn_shift) = if v6 { (7, 4) } else { (8, 0) };
    let ecn = |p: &[u8]| (p[1] >> ecn_shift) & 3;
    let rest = !(3u8 << ecn_shift);
    got[ttl] == sent[ttl].wrapping_sub(2)
        && (ecn(got) == ecn(sent) || ecn(got) == 3)
        && got[1] & rest == sent[1] & rest
        && got
            .iter()
            .zip(sent)
            .enumerate()
            .all(|(i, (a, b))| a == b || i == 1 || i == ttl || (!v6 && (i == 10 || i == 11)))
}

/// Whether `got` is a fragment of the IPv4 packet `sent` (which may be a
/// fragment itself): the same addresses, protocol and identification,
/// and its data where its offset puts it in `sent`'s.
fn fragment_of(got: &[u8], sent: &[u8]) -> bool {
    if got.len() < 20 || sent.len() < 20 || got[0] >> 4 != 4 || sent[0] >> 4 != 4 {
        return false;
    }
    let (hg, hs) = (usize::from(got[0] & 15) * 4, usize::from(sent[0] & 15) * 4);
    let offset = |p: &[u8]| usize::from(u16::from_be_bytes([p[6], p[7]]) & 0x1fff) * 8;
    let Some(at) = offset(got).checked_sub(offset(sent)) else { return false };
    let data = &got[hg.min(got.len())..];
    got[4..6] == sent[4..6]
        && got[9] == sent[9]
        && got[12..20] == sent[12..20]
        && sent.get(hs + at..hs + at + data.len()).is_some_and(|d| d == data)
}

/// What site `s`'s open path delivered to its LAN.
fn check_delivered(s: usize, f: &[u8], from: &Site) {
    assert_eq!(&f[..6], &HOST_MAC[s], "delivered to the LAN host's MAC");
    assert_eq!(&f[6..12], &LAN_MAC[s]);
    let p = &f[14..];
    let h = forward::header(p).unwrap_or_else(|e| panic!("a delivered packet's header: {e:?}"));
    assert_eq!(h.len, p.len(), "delivered without padding");
    let o = 1 - s;
    assert!(
        h.src == IpAddr::from(HOST4[o]) || h.src == ip(HOST6[o]),
        "delivered from {} outside the peer's allowed IPs",
        h.src
    );
    assert!(
        from.sent.iter().any(|sent| forwarded(p, sent) || fragment_of(p, sent)),
        "delivered a packet the other site's LAN never sent: {p:02x?}"
    );
}

/// A LAN vector through site `s`'s seal path.
fn lan_step(sites: &mut [Site; 2], s: usize, sender: WanSender, input: &mut Input<'_>, now: Instant) {
    let n = usize::from(input.byte() % 8) + 1;
    let mut frames = Vec::with_capacity(n);
    for _ in 0..n {
        let k = input.byte();
        if k & 3 == 0 {
            let len = usize::from(input.u16()) % 1600;
            frames.push(input.take(len).to_vec());
            continue;
        }
        let (payload, ttl) = (usize::from(input.u16()) % 1500, input.byte());
        let mut p = packet(s, k & 3, payload, ttl, k & 4 != 0);
        for _ in 0..(k >> 3) & 3 {
            let (at, value) = (usize::from(input.u16()), input.byte());
            let len = p.len();
            p[at % len] = value;
        }
        if k & 0x20 != 0 {
            ipv4_checksum(&mut p);
        }
        frames.push(ethernet(LAN_MAC[s], HOST_MAC[s], &p));
    }
    // What the seal path may send on: each packet whole by its header.
    for f in &frames {
        if let Some(p) = f.get(14..)
            && let Ok(h) = forward::header(p)
        {
            sites[s].sent.push(p[..h.len].to_vec());
        }
    }
    let (sent, fates, counts, extra) = run_path(&sites[s], Some(sender), &frames, now);
    let dropped = fates.iter().filter(|f| **f == Fate::Drop).count() as u64;
    assert!(dropped <= drops(&counts), "a frame dropped without a count: {counts:?}");
    let to = peer_endpoint(&sites[s]);
    for f in &sent {
        match sender {
            WanSender::Frames => check_outer(s, f, to),
            WanSender::Kernel => {
                let (_, got, _) = datagram_of(f).unwrap_or_else(|| panic!("no datagram in {f:02x?}"));
                assert_eq!(Some(got), to, "sealed for the peer's endpoint");
            }
        }
    }
    for f in &extra.to_wan {
        check_outer(s, f, to);
    }
    for f in &extra.to_lan {
        assert_eq!(&f[..6], &HOST_MAC[s], "an ICMP error goes back to the sender");
        assert!(forward::header(&f[14..]).is_ok(), "an ICMP error's header");
    }
    // Frames sealed for the kernel's socket are datagrams, not frames the
    // peer's WAN would see.
    let wire = &mut sites[s].wire;
    if sender == WanSender::Frames {
        wire.extend(sent);
    }
    wire.extend(extra.to_wan);
    let keep = wire.len().saturating_sub(64);
    wire.drain(..keep);
}

/// A WAN vector through site `s`'s open path: frames the other site
/// sealed, some changed, and raw bytes.
fn wan_step(sites: &mut [Site; 2], s: usize, input: &mut Input<'_>, now: Instant) {
    let o = 1 - s;
    let n = usize::from(input.byte() % 8) + 1;
    let mut frames = Vec::with_capacity(n);
    for _ in 0..n {
        let k = input.byte();
        let wire = &sites[o].wire;
        if k & 1 == 1 || wire.is_empty() {
            let len = usize::from(input.u16()) % 1600;
            frames.push(input.take(len).to_vec());
            continue;
        }
        let mut f = wire[usize::from(input.byte()) % wire.len()].clone();
        for _ in 0..(k >> 1) & 3 {
            let (at, bits) = (usize::from(input.u16()), input.byte());
            let len = f.len();
            f[at % len] ^= bits;
        }
        if k & 0x10 != 0 {
            outer_checksums(&mut f);
        }
        frames.push(f);
    }
    let (sent, fates, counts, _) = run_path(&sites[s], None, &frames, now);
    let taken = fates.iter().filter(|f| **f == Fate::Taken).count() as u64;
    assert_eq!(counts.opened + drops(&counts) + taken, frames.len() as u64, "{counts:?}");
    assert_eq!(counts.opened, sent.len() as u64);
    for f in &sent {
        check_delivered(s, f, &sites[o]);
    }
}

pub fn run(data: &[u8]) {
    let (a, b) = established(42);
    let site = |s, d| Site { router: router(s), dev: Mutex::new(d), sent: Vec::new(), wire: Vec::new() };
    let mut sites = [site(0, a), site(1, b)];
    let mut input = Input::new(data);
    let mut now = start();
    for _ in 0..STEPS {
        if input.is_empty() {
            break;
        }
        let choices = input.byte();
        let later = now + Duration::from_secs([0, 1, 5, 20][usize::from((choices >> 4) & 3)]);
        if later <= start() + CLOCK_LIMIT {
            now = later;
        }
        let sender = if choices & 4 != 0 { WanSender::Kernel } else { WanSender::Frames };
        match choices & 3 {
            0 => lan_step(&mut sites, 0, sender, &mut input, now),
            1 => lan_step(&mut sites, 1, sender, &mut input, now),
            2 => wan_step(&mut sites, 1, &mut input, now),
            _ => wan_step(&mut sites, 0, &mut input, now),
        }
    }
    // A new packet still crosses from A to B, unless a frame from B that
    // the fuzzer moved to another outer source made A follow B there
    // (WireGuard's roaming): to an address A has no neighbour for, or to
    // one that is not B's.
    let p = packet(0, 1, 32, 64, true);
    sites[0].sent.push(p.clone());
    let (sent, _, counts, _) =
        run_path(&sites[0], Some(WanSender::Frames), &[ethernet(LAN_MAC[0], HOST_MAC[0], &p)], now);
    let Some(frame) = sent.first() else {
        let roamed = counts.drops[RouterDrop::NoNextHop.index()] + counts.drops[RouterDrop::NoSourceAddress.index()];
        assert_eq!(roamed, 1, "A no longer seals a packet to B: {counts:?}");
        return;
    };
    if frame[30..34] != WAN4[1] || frame[36..38] != PORT.to_be_bytes() {
        return;
    }
    let (got, _, counts, _) = run_path(&sites[1], None, &sent, now);
    assert_eq!(got.len(), 1, "B no longer opens A's packets: {counts:?}");
    check_delivered(1, &got[0], &sites[0]);
}
