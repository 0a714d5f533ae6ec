//! A bounded mutational fuzzer over parse and the pipeline, run by
//! `make test` (stable Rust: no sanitizer or coverage feedback, but it runs
//! everywhere and every time). Seeds are the checked-in corpus in
//! `crates/l4/fuzz/corpus`: real frames of every protocol and direction the
//! pipeline handles. Each round takes a vector of mutated frames (bit flips,
//! interesting values in length and flag fields, truncation, growth,
//! splices of two frames) through a worker serving every forwarding mode.
//! Nothing may panic; every frame gets a verdict; a forwarded frame still
//! parses, checksums included.

#![cfg(test)]

use std::net::Ipv4Addr;
use std::path::PathBuf;

use gatehouse_config::{L4Mode, L4Scheduler};

use crate::plane::{Buf, Plane, Real, Service, Verdict, Worker};
use gatehouse_wire::packet::{self, Checks, Frame, PROTO_TCP, PROTO_UDP};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("corpus")
}

fn service(name: &str, vip: [u8; 4], port: u16, proto: u8, mode: L4Mode) -> Service {
    let same_port = !matches!(mode, L4Mode::Nat | L4Mode::Fnat);
    Service {
        name: name.into(),
        vip: vip.into(),
        port,
        proto,
        mode,
        scheduler: L4Scheduler::Maglev,
        gue_port: 6080,
        reset_on_down: false,
        reals: (1..=3u8)
            .map(|i| Real {
                addr: Ipv4Addr::new(10, 0, 1, i).into(),
                port: if same_port { port } else { 8000 + u16::from(i) },
                weight: 1,
                up: i != 3,
            })
            .collect(),
        maglev: None,
        timeouts: [10, 900, 30, 60],
        syn_proxy: gatehouse_config::SynProxyMode::Off,
        syn_threshold: u32::MAX,
    }
}

fn plane() -> Plane {
    Plane::new(
        vec![
            service("nat", [10, 0, 0, 100], 80, PROTO_TCP, L4Mode::Nat),
            service("fnat", [10, 0, 0, 101], 53, PROTO_UDP, L4Mode::Fnat),
            service("dr", [10, 0, 0, 102], 443, PROTO_TCP, L4Mode::Dr),
            service("ipip", [10, 0, 0, 103], 80, PROTO_TCP, L4Mode::Ipip),
            service("gue", [10, 0, 0, 104], 80, PROTO_UDP, L4Mode::Gue),
            {
                // IPv6: the corpus's IPv6 SYN is addressed here.
                let mut s = service("nat6", [0; 4], 443, PROTO_TCP, L4Mode::Nat);
                s.vip = "2001:db8::2".parse::<std::net::Ipv6Addr>().map_or(s.vip, Into::into);
                for (i, r) in s.reals.iter_mut().enumerate() {
                    r.addr = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 1, i as u16 + 1).into();
                }
                s
            },
        ],
        vec![Ipv4Addr::new(10, 0, 9, 1).into()],
        [2, 0, 0, 0, 0, 0xaa],
        [2, 0, 0, 0, 0, 0xbb],
        2,
    )
}

fn corpus() -> Vec<Vec<u8>> {
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir())
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

fn mutate(rng: &mut fastrand::Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut f = seeds[rng.usize(..seeds.len())].clone();
    for _ in 0..rng.usize(1..5) {
        match rng.u8(..8) {
            0 | 1 if !f.is_empty() => {
                let at = rng.usize(..f.len());
                f[at] ^= 1 << rng.u8(..8);
            }
            2 if !f.is_empty() => {
                let at = rng.usize(..f.len());
                f[at] = [0, 1, 0x7f, 0x80, 0xff, 0x40, 0x45, 0x60][rng.usize(..8)];
            }
            3 if f.len() > 1 => {
                // A 16-bit field (lengths, ports, checksums) set to an edge value.
                let at = rng.usize(..f.len() - 1);
                let v: u16 = [0, 1, 7, 8, 19, 20, 40, 0xffff, f.len() as u16, (f.len() as u16).wrapping_sub(14)]
                    [rng.usize(..10)];
                f[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
            4 => f.truncate(rng.usize(..=f.len())),
            5 => {
                let n = rng.usize(1..64);
                f.extend((0..n).map(|_| rng.u8(..)));
            }
            6 => {
                // Splice: the head of this frame, the tail of another.
                let other = &seeds[rng.usize(..seeds.len())];
                let cut = rng.usize(..=f.len());
                let from = rng.usize(..=other.len());
                f.truncate(cut);
                f.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    f
}

#[test]
fn mutated_frames_never_break_the_plane() {
    let seeds = corpus();
    assert!(seeds.len() >= 10, "the corpus in {} is missing", corpus_dir().display());
    let plane = plane();
    let mut w = Worker::new(&plane, 1, 4096, 3);
    let mut rng = fastrand::Rng::with_seed(0x5eed_f00d);
    let mut verdicts = Vec::new();
    let (mut forwarded, mut dropped, mut total) = (0u64, 0u64, 0u64);
    for round in 0..20_000u32 {
        let frames: Vec<Vec<u8>> = (0..rng.usize(1..=256)).map(|_| mutate(&mut rng, &seeds)).collect();
        let mut mems: Vec<Vec<u8>> = frames
            .iter()
            .map(|f| {
                let mut m = vec![0u8; 128 + f.len().max(64) + 64];
                m[128..128 + f.len()].copy_from_slice(f);
                m
            })
            .collect();
        let mut bufs: Vec<Buf<'_>> =
            mems.iter_mut().zip(&frames).map(|(m, f)| Buf { mem: m.as_mut_slice(), head: 128, len: f.len() }).collect();
        w.process(&plane, &mut bufs, &mut verdicts, round / 10);
        assert_eq!(verdicts.len(), bufs.len());
        for (b, v) in bufs.iter().zip(&verdicts) {
            total += 1;
            match v {
                Verdict::Forward => {
                    forwarded += 1;
                    assert!(
                        matches!(
                            packet::parse(b.frame(), Checks::default()),
                            Ok(Frame::Ip(_) | Frame::Arp(_) | Frame::Other)
                        ),
                        "a forwarded frame no longer parses: {:02x?}",
                        b.frame()
                    );
                }
                Verdict::Drop(_) => dropped += 1,
                Verdict::Pass => {}
            }
        }
    }
    eprintln!("fuzz: {total} frames, {forwarded} forwarded, {dropped} dropped");
    // The mutations must not all be dropped: some still reach services.
    assert!(forwarded > 1000 && dropped > 1000, "forwarded {forwarded}, dropped {dropped} of {total}");
}

/// The checked-in corpus is exactly the seed frames built here: a change to
/// what the pipeline handles shows up as a failure naming the file.
/// `GATEHOUSE_WRITE_CORPUS=1 cargo test -p gatehouse-l4 corpus` rewrites the
/// files (then check them in).
#[test]
fn the_corpus_holds_the_seed_frames() {
    use gatehouse_wire::checksum;
    use gatehouse_wire::packet::build;
    use gatehouse_wire::packet::{
        ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_ICMP, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN,
    };
    let dir = corpus_dir();
    let write = std::env::var_os("GATEHOUSE_WRITE_CORPUS").is_some();
    let c = [10, 0, 0, 1];
    let tcp = |src: [u8; 4], sp: u16, dst: [u8; 4], dp: u16, flags: u8, data: &[u8]| {
        let seg = build::tcp(sp, dp, flags, data, |l| checksum::pseudo_v4(src, dst, PROTO_TCP, l as u16));
        build::eth(ETHERTYPE_IPV4, &build::ipv4(src, dst, PROTO_TCP, &seg))
    };
    let udp = |src: [u8; 4], sp: u16, dst: [u8; 4], dp: u16, data: &[u8]| {
        let seg = build::udp(sp, dp, data, |l| checksum::pseudo_v4(src, dst, PROTO_UDP, l as u16));
        build::eth(ETHERTYPE_IPV4, &build::ipv4(src, dst, PROTO_UDP, &seg))
    };
    let mut frames: Vec<(&str, Vec<u8>)> = vec![
        ("nat-syn", tcp(c, 40000, [10, 0, 0, 100], 80, TCP_SYN, b"")),
        ("nat-ack-data", tcp(c, 40000, [10, 0, 0, 100], 80, TCP_ACK | TCP_PSH, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")),
        ("nat-fin", tcp(c, 40000, [10, 0, 0, 100], 80, TCP_FIN | TCP_ACK, b"")),
        ("nat-rst", tcp(c, 40000, [10, 0, 0, 100], 80, TCP_RST | TCP_ACK, b"")),
        ("nat-reply", tcp([10, 0, 1, 1], 8001, c, 40000, TCP_SYN | TCP_ACK, b"")),
        ("fnat-udp", udp(c, 5353, [10, 0, 0, 101], 53, b"\x12\x34\x01\x00\x00\x01")),
        ("fnat-reply", udp([10, 0, 1, 2], 8002, [10, 0, 9, 1], 1025, b"answer")),
        ("dr-syn", tcp(c, 40001, [10, 0, 0, 102], 443, TCP_SYN, b"")),
        ("ipip-syn", tcp(c, 40002, [10, 0, 0, 103], 80, TCP_SYN, b"")),
        ("gue-udp", udp(c, 40003, [10, 0, 0, 104], 80, b"datagram")),
        ("other-host", tcp(c, 1, [10, 0, 0, 7], 22, TCP_SYN, b"")),
    ];
    let quoted = build::ipv4([10, 0, 0, 100], c, PROTO_TCP, &[0, 80, 0x9c, 0x40, 0, 0, 0, 1]);
    let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc];
    icmp.extend_from_slice(&quoted);
    let sum = checksum::checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    frames.push((
        "icmp-frag-needed",
        build::eth(ETHERTYPE_IPV4, &build::ipv4([192, 0, 2, 1], [10, 0, 0, 100], PROTO_ICMP, &icmp)),
    ));
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 9, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 100];
    arp.resize(28, 0);
    frames.push(("arp-request", build::eth(ETHERTYPE_ARP, &arp)));
    let s6 = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let d6 = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let seg6 = build::tcp(1234, 443, TCP_SYN, b"", |l| checksum::pseudo_v6(s6, d6, PROTO_TCP, l as u32));
    frames.push(("ipv6-syn", build::eth(ETHERTYPE_IPV6, &build::ipv6(s6, d6, PROTO_TCP, &seg6))));
    for (name, f) in frames {
        let path = dir.join(format!("{name}.bin"));
        if write {
            std::fs::create_dir_all(&dir).expect("corpus dir");
            std::fs::write(&path, &f).expect("write");
        }
        let stored = std::fs::read(&path).unwrap_or_default();
        assert_eq!(stored, f, "{} differs from its seed (GATEHOUSE_WRITE_CORPUS=1 rewrites it)", path.display());
    }
}
