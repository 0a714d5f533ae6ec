//! The L4 plane's vector pipeline (`l4::plane`): classify, sessions,
//! SYN cookies' path, and the rewrites of every forwarding mode (NAT,
//! FNAT, DR, IPIP, GUE, IPv6). Input: a vector of frames, each a
//! two-byte length and that many bytes (a short last one takes what is
//! left), processed twice so that the second pass meets the sessions the
//! first made.
//!
//! Properties: no panic; every frame gets a verdict; a forwarded frame
//! still parses, checksums included.

use std::net::Ipv4Addr;
use std::sync::OnceLock;

use gatehouse_config::{L4Mode, L4Scheduler};
use gatehouse_l4::plane::{Buf, Plane, Real, Service, Verdict, Worker};
use gatehouse_wire::packet::{self, Checks, Frame, PROTO_TCP, PROTO_UDP};

use crate::input::Input;

/// Room before a frame for the headers a tunnel adds.
const HEADROOM: usize = 128;

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

/// One service per forwarding mode; the corpus's frames are addressed to
/// them.
pub fn plane() -> &'static Plane {
    static PLANE: OnceLock<Plane> = OnceLock::new();
    PLANE.get_or_init(|| {
        Plane::new(
            vec![
                service("nat", [10, 0, 0, 100], 80, PROTO_TCP, L4Mode::Nat),
                service("fnat", [10, 0, 0, 101], 53, PROTO_UDP, L4Mode::Fnat),
                service("dr", [10, 0, 0, 102], 443, PROTO_TCP, L4Mode::Dr),
                service("ipip", [10, 0, 0, 103], 80, PROTO_TCP, L4Mode::Ipip),
                service("gue", [10, 0, 0, 104], 80, PROTO_UDP, L4Mode::Gue),
                {
                    let mut s = service("nat6", [0; 4], 443, PROTO_TCP, L4Mode::Nat);
                    s.vip = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2).into();
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
    })
}

/// The frames of an input, each after its two-byte length.
pub fn frames(data: &[u8]) -> Vec<&[u8]> {
    let mut input = Input::new(data);
    let mut list = Vec::new();
    while !input.is_empty() && list.len() < 256 {
        let n = usize::from(input.u16());
        list.push(input.take(n));
    }
    list
}

pub fn process(w: &mut Worker, frames: &[&[u8]], now: u32) -> (usize, usize) {
    let plane = plane();
    let mut mems: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let mut m = vec![0u8; HEADROOM + f.len().max(64) + 64];
            m[HEADROOM..HEADROOM + f.len()].copy_from_slice(f);
            m
        })
        .collect();
    let mut bufs: Vec<Buf<'_>> =
        mems.iter_mut().zip(frames).map(|(m, f)| Buf { mem: m.as_mut_slice(), head: HEADROOM, len: f.len() }).collect();
    let mut verdicts = Vec::new();
    w.process(plane, &mut bufs, &mut verdicts, now);
    assert_eq!(verdicts.len(), bufs.len(), "a frame got no verdict");
    let (mut forwarded, mut dropped) = (0, 0);
    for (b, v) in bufs.iter().zip(&verdicts) {
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
    (forwarded, dropped)
}

pub fn run(data: &[u8]) {
    let list = frames(data);
    let mut w = Worker::new(plane(), 1, 256, 3);
    process(&mut w, &list, 1);
    process(&mut w, &list, 2);
}
