use std::net::{IpAddr, Ipv4Addr};

use gatehouse_config::{L4Mode, L4Scheduler};

use super::*;
use gatehouse_wire::checksum;
use gatehouse_wire::packet::{
    self, Checks, ETHERTYPE_IPV4, Malformed, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, build,
};

const CLIENT: [u8; 4] = [10, 0, 0, 1];
const VIP: [u8; 4] = [10, 0, 0, 100];
const LOCAL: [u8; 4] = [10, 0, 9, 1];
const MAC: [u8; 6] = [2, 0, 0, 0, 0, 0xaa];
const HOP: [u8; 6] = [2, 0, 0, 0, 0, 0xbb];

fn service(mode: L4Mode, scheduler: L4Scheduler, proto: u8) -> Service {
    Service {
        name: "s".into(),
        vip: VIP.into(),
        port: 80,
        proto,
        mode,
        scheduler,
        gue_port: 6080,
        reset_on_down: false,
        reals: vec![
            Real {
                addr: Ipv4Addr::new(10, 0, 1, 1).into(),
                port: if matches!(mode, L4Mode::Nat | L4Mode::Fnat) { 8080 } else { 80 },
                weight: 1,
                up: true,
            },
            Real {
                addr: Ipv4Addr::new(10, 0, 1, 2).into(),
                port: if matches!(mode, L4Mode::Nat | L4Mode::Fnat) { 8080 } else { 80 },
                weight: 3,
                up: true,
            },
        ],
        maglev: None,
        timeouts: [10, 900, 30, 60],
        syn_proxy: gatehouse_config::SynProxyMode::Off,
        syn_threshold: u32::MAX,
    }
}

fn tcp(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, flags: u8) -> Vec<u8> {
    let seg = build::tcp(sport, dport, flags, b"", |len| checksum::pseudo_v4(src, dst, PROTO_TCP, len as u16));
    build::eth(ETHERTYPE_IPV4, &build::ipv4(src, dst, PROTO_TCP, &seg))
}

/// Runs one frame through the worker with 64 bytes of headroom.
fn run(w: &mut Worker, plane: &Plane, frame: &[u8], now: u32) -> (Verdict, Vec<u8>) {
    let mut mem = vec![0u8; 64 + frame.len() + 64];
    mem[64..64 + frame.len()].copy_from_slice(frame);
    let mut bufs = [Buf { mem: &mut mem, head: 64, len: frame.len() }];
    let mut verdicts = Vec::new();
    w.process(plane, &mut bufs, &mut verdicts, now);
    (verdicts[0], bufs[0].frame().to_vec())
}

fn flow(frame: &[u8]) -> gatehouse_wire::packet::Flow {
    match packet::parse(frame, Checks::default()) {
        Ok(packet::Frame::Ip(ip)) => ip.flow,
        other => panic!("{other:?}"),
    }
}

#[test]
fn nat_rewrites_both_ways_and_keeps_the_session() {
    let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP)], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 1024, 1);
    let (v, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    assert_eq!(v, Verdict::Forward);
    let f = flow(&out); // the parser checks every checksum
    assert_eq!((f.src, f.sport), (IpAddr::from(CLIENT), 40000));
    let real = f.dst;
    assert_eq!(f.dport, 8080);
    assert_eq!(&out[..12], &[HOP, MAC].concat()[..]);
    // The same flow sticks to its server.
    let (_, again) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH), 1);
    assert_eq!(flow(&again).dst, real);
    // The reply from the real server goes back as the VIP.
    let real4 = match real {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => unreachable!(),
    };
    let (v, back) = run(&mut w, &plane, &tcp(real4, 8080, CLIENT, 40000, TCP_SYN | TCP_ACK), 2);
    assert_eq!(v, Verdict::Forward);
    let b = flow(&back);
    assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
    assert_eq!(w.sessions(), 1);
    assert_eq!(w.counters().services[0].sessions_total, 1);
}

#[test]
fn fnat_uses_this_cores_ports_and_maps_replies_back() {
    let plane =
        Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Wrr, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 4);
    let mut w = Worker::new(&plane, 3, 1024, 1);
    let (v, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    assert_eq!(v, Verdict::Forward);
    let f = flow(&out);
    assert_eq!(f.src, IpAddr::from(LOCAL));
    assert_eq!(f.sport % 4, 3, "a port of core 3");
    let real4 = match f.dst {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => unreachable!(),
    };
    let (v, back) = run(&mut w, &plane, &tcp(real4, 8080, LOCAL, f.sport, TCP_SYN | TCP_ACK), 1);
    assert_eq!(v, Verdict::Forward);
    let b = flow(&back);
    assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
    // An unknown local port is not a session.
    let (v, _) = run(&mut w, &plane, &tcp(real4, 8080, LOCAL, f.sport + 4, TCP_ACK), 1);
    assert_eq!(v, Verdict::Drop(DropReason::NoSession));
}

#[test]
fn dr_changes_only_the_macs_and_tunnels_wrap_the_packet() {
    let plane =
        Plane::new(vec![service(L4Mode::Dr, L4Scheduler::Maglev, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 1024, 1);
    let syn = tcp(CLIENT, 40000, VIP, 80, TCP_SYN);
    let (v, out) = run(&mut w, &plane, &syn, 0);
    assert_eq!(v, Verdict::Forward);
    assert_eq!(&out[12..], &syn[12..]);
    assert_eq!(&out[..12], &[HOP, MAC].concat()[..]);

    for (mode, proto, extra) in [(L4Mode::Ipip, 4u8, 20usize), (L4Mode::Gue, PROTO_UDP, 28)] {
        let plane =
            Plane::new(vec![service(mode, L4Scheduler::Maglev, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 1024, 1);
        let (v, out) = run(&mut w, &plane, &syn, 0);
        assert_eq!(v, Verdict::Forward);
        assert_eq!(out.len(), syn.len() + extra);
        assert_eq!(out[14 + 9], proto);
        assert_eq!(&out[14 + 12..14 + 16], &LOCAL);
        assert_eq!(&out[14 + extra..], &syn[14..], "the inner packet is unchanged");
    }
}

#[test]
fn what_cannot_be_served_is_dropped_and_counted() {
    let mut svc = service(L4Mode::Nat, L4Scheduler::Wlc, PROTO_TCP);
    let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 2, 1);
    // A mid-stream segment without a session.
    assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 1, VIP, 80, TCP_ACK), 0).0, Verdict::Drop(DropReason::NoSession));
    // Malformed: truncated.
    let syn = tcp(CLIENT, 2, VIP, 80, TCP_SYN);
    assert_eq!(run(&mut w, &plane, &syn[..30], 0).0, Verdict::Drop(DropReason::Malformed(Malformed::Truncated)));
    // A full table.
    assert_eq!(run(&mut w, &plane, &syn, 0).0, Verdict::Forward);
    assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 3, VIP, 80, TCP_SYN), 0).0, Verdict::Forward);
    assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 4, VIP, 80, TCP_SYN), 0).0, Verdict::Drop(DropReason::TableFull));
    // Not for a service: to the kernel.
    assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 5, [10, 0, 0, 7], 22, TCP_SYN), 0).0, Verdict::Pass);
    assert_eq!(w.counters().dropped(DropReason::NoSession), 1);
    assert_eq!(w.counters().dropped(DropReason::TableFull), 1);
    assert_eq!(w.counters().dropped(DropReason::Malformed(Malformed::Truncated)), 1);
    // Every reason has its own slot.
    let slots: std::collections::HashSet<usize> = DropReason::all().map(DropReason::index).collect();
    assert_eq!(slots.len(), DROP_KINDS);
    assert!(slots.iter().all(|&i| i < DROP_KINDS));
    // No healthy server.
    svc = service(L4Mode::Nat, L4Scheduler::Wrr, PROTO_TCP);
    for r in &mut svc.reals {
        r.up = false;
    }
    let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 16, 1);
    assert_eq!(run(&mut w, &plane, &syn, 0).0, Verdict::Drop(DropReason::NoHealthyServer));
}

#[test]
fn sessions_expire_by_state_and_free_their_ports() {
    let plane =
        Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Rr, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 64, 1);
    run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    assert_eq!(w.sessions(), 1);
    // A SYN-only session times out after 10 ticks (the sweep runs per vector).
    run(&mut w, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 22, TCP_SYN), 5);
    assert_eq!(w.sessions(), 1);
    run(&mut w, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 22, TCP_SYN), 11);
    assert_eq!(w.sessions(), 0);
    assert_eq!(w.counters().services[0].sessions_active, 0);
    let free = w.sessions.ports[0].free_count();
    assert_eq!(free, 65536 - 1024);
}

#[test]
fn weights_split_new_sessions() {
    let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Wrr, PROTO_TCP)], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 10_000, 1);
    for port in 0..4000u16 {
        run(&mut w, &plane, &tcp(CLIENT, 10_000 + port, VIP, 80, TCP_SYN), 0);
    }
    let per = &w.counters().services[0].per_real_active;
    assert_eq!(per, &vec![1000, 3000]);
}

fn tcp6(src: [u8; 16], sport: u16, dst: [u8; 16], dport: u16, flags: u8) -> Vec<u8> {
    let seg = build::tcp(sport, dport, flags, b"", |len| checksum::pseudo_v6(src, dst, PROTO_TCP, len as u32));
    build::eth(gatehouse_wire::packet::ETHERTYPE_IPV6, &build::ipv6(src, dst, PROTO_TCP, &seg))
}

fn v6(last: u8) -> [u8; 16] {
    let mut a = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    a[15] = last;
    a
}

#[test]
fn ipv6_services_in_nat_and_fnat() {
    for mode in [L4Mode::Nat, L4Mode::Fnat] {
        let mut svc = service(mode, L4Scheduler::Rr, PROTO_TCP);
        svc.vip = IpAddr::from(v6(100));
        for (i, r) in svc.reals.iter_mut().enumerate() {
            r.addr = IpAddr::from(v6(10 + i as u8));
        }
        let local = IpAddr::from(v6(200));
        let plane = Plane::new(vec![svc], vec![IpAddr::from(LOCAL), local], MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 1024, 1);
        let (v, out) = run(&mut w, &plane, &tcp6(v6(1), 40000, v6(100), 80, TCP_SYN), 0);
        assert_eq!(v, Verdict::Forward, "{mode:?}");
        let f = flow(&out);
        assert_eq!(f.dport, 8080);
        let real = match f.dst {
            IpAddr::V6(a) => a.octets(),
            IpAddr::V4(_) => unreachable!(),
        };
        let (reply_dst, reply_port) = if mode == L4Mode::Fnat {
            assert_eq!(f.src, local, "an IPv6 local address for IPv6 servers");
            (v6(200), f.sport)
        } else {
            assert_eq!(f.src, IpAddr::from(v6(1)));
            (v6(1), 40000)
        };
        let (v, back) = run(&mut w, &plane, &tcp6(real, 8080, reply_dst, reply_port, TCP_SYN | TCP_ACK), 1);
        assert_eq!(v, Verdict::Forward, "{mode:?} reply");
        let b = flow(&back);
        assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(v6(100)), 80, IpAddr::from(v6(1)), 40000));
        assert_eq!(w.sessions(), 1);
    }
    // An IPv6 VIP in front of IPv4 servers in NAT mode: no translation.
    let mut svc = service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP);
    svc.vip = IpAddr::from(v6(100));
    let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 16, 1);
    assert_eq!(run(&mut w, &plane, &tcp6(v6(1), 1, v6(100), 80, TCP_SYN), 0).0, Verdict::Drop(DropReason::Unsupported));
    assert_eq!(w.sessions(), 0);
}

#[test]
fn arp_and_neighbour_discovery_for_our_addresses_are_answered() {
    let mut svc6 = service(L4Mode::Dr, L4Scheduler::Rr, PROTO_TCP);
    svc6.vip = IpAddr::from(v6(100));
    let plane = Plane::new(
        vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP), svc6],
        vec![IpAddr::from(LOCAL)],
        MAC,
        HOP,
        1,
    );
    let mut w = Worker::new(&plane, 0, 16, 1);
    let arp = |target: [u8; 4]| {
        let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 9, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        a.extend_from_slice(&target);
        build::eth(gatehouse_wire::packet::ETHERTYPE_ARP, &a)
    };
    for target in [VIP, LOCAL] {
        let (v, out) = run(&mut w, &plane, &arp(target), 0);
        assert_eq!(v, Verdict::Forward);
        assert_eq!(&out[14 + 6..14 + 8], &[0, 2], "an ARP reply");
        assert_eq!(&out[14 + 8..14 + 14], &MAC);
    }
    assert_eq!(run(&mut w, &plane, &arp([10, 0, 0, 55]), 0).0, Verdict::Pass, "not ours");
    // A solicitation for the IPv6 VIP.
    let snm = std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0x100).octets();
    let mut ns = vec![crate::neighbour::ND_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
    ns.extend_from_slice(&v6(100));
    let c = !checksum::fold(checksum::add(
        checksum::pseudo_v6(v6(1), snm, gatehouse_wire::packet::PROTO_ICMPV6, ns.len() as u32),
        &ns,
    ));
    ns[2..4].copy_from_slice(&c.to_be_bytes());
    let f = build::eth(
        gatehouse_wire::packet::ETHERTYPE_IPV6,
        &build::ipv6(v6(1), snm, gatehouse_wire::packet::PROTO_ICMPV6, &ns),
    );
    let (v, out) = run(&mut w, &plane, &f, 0);
    assert_eq!(v, Verdict::Forward);
    assert_eq!(out.len(), crate::neighbour::ND_ADVERT_LEN);
    assert_eq!(out[14 + 40], crate::neighbour::ND_ADVERT);
    assert_eq!(w.counters().answered, 3);
}

/// An ICMPv4 error from `from` to `to`, quoting `quoted` (an IP packet's
/// first bytes).
fn icmp_error(from: [u8; 4], to: [u8; 4], kind: u8, code: u8, quoted: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0, 0, 0, 0x05, 0xdc];
    m.extend_from_slice(quoted);
    let c = checksum::checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    build::eth(ETHERTYPE_IPV4, &build::ipv4(from, to, gatehouse_wire::packet::PROTO_ICMP, &m))
}

fn quoted(frame: &[u8]) -> gatehouse_wire::packet::Flow {
    match packet::parse(frame, Checks::default()) {
        Ok(packet::Frame::Ip(ip)) => packet::quoted(frame, &ip).expect("an error quoting a flow"),
        other => panic!("{other:?}"),
    }
}

/// An error translated for the client: from the VIP, about the client's
/// packet to the VIP.
fn assert_back_at_the_client(out: &[u8]) {
    let f = flow(out);
    assert_eq!((f.src, f.dst), (IpAddr::from(VIP), IpAddr::from(CLIENT)));
    let q = quoted(out);
    assert_eq!((q.src, q.sport, q.dst, q.dport), (IpAddr::from(CLIENT), 40000, IpAddr::from(VIP), 80));
}

#[test]
fn icmp_errors_go_back_to_where_their_packet_came_from() {
    const ROUTER: [u8; 4] = [192, 0, 2, 1];
    // NAT: a router on the client's side says the VIP's packet to the
    // client was too big; the real server gets it, translated.
    let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP)], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 64, 1);
    let (_, to_real) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    let real = flow(&to_real).dst;
    let real4 = match real {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => unreachable!(),
    };
    let sent = tcp(VIP, 80, CLIENT, 40000, TCP_ACK);
    let (v, out) = run(&mut w, &plane, &icmp_error(ROUTER, VIP, 3, 4, &sent[14..14 + 28]), 1);
    assert_eq!(v, Verdict::Forward);
    let f = flow(&out); // outer and ICMP checksums verified by the parser
    assert_eq!((f.src, f.dst), (IpAddr::from(ROUTER), real));
    let q = quoted(&out);
    assert_eq!((q.src, q.sport, q.dst, q.dport), (real, 8080, IpAddr::from(CLIENT), 40000));
    assert_eq!(
        gatehouse_wire::checksum::checksum(&out[14 + 20 + 8..14 + 20 + 8 + 20]),
        0,
        "the quoted header's checksum"
    );
    // NAT, server side: the real server says the client's port is
    // unreachable; the client gets it as coming from the VIP.
    let sent_to_real = tcp(CLIENT, 40000, real4, 8080, TCP_ACK);
    let (v, out) = run(&mut w, &plane, &icmp_error(real4, CLIENT, 3, 3, &sent_to_real[14..14 + 28]), 1);
    assert_eq!(v, Verdict::Forward);
    assert_back_at_the_client(&out);
    // An error about no session of ours is dropped, not forwarded.
    let stranger = tcp(VIP, 80, [10, 0, 0, 99], 1, TCP_ACK);
    assert_eq!(
        run(&mut w, &plane, &icmp_error(ROUTER, VIP, 3, 4, &stranger[14..14 + 28]), 1).0,
        Verdict::Drop(DropReason::NoSession)
    );

    // DR: the real server sent with the VIP as source; the error comes to
    // the balancer and goes to that server unchanged (path MTU discovery).
    let plane = Plane::new(vec![service(L4Mode::Dr, L4Scheduler::Rr, PROTO_TCP)], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 64, 1);
    run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    let err = icmp_error(ROUTER, VIP, 3, 4, &sent[14..14 + 28]);
    let (v, out) = run(&mut w, &plane, &err, 1);
    assert_eq!(v, Verdict::Forward);
    assert_eq!(&out[12..], &err[12..]);
    assert_eq!(&out[..12], &[HOP, MAC].concat()[..]);

    // FNAT, server side: the quoted packet left our local address.
    let plane =
        Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Rr, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 64, 1);
    let (_, to_real) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    let f = flow(&to_real);
    let real4 = match f.dst {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => unreachable!(),
    };
    let sent_to_real = tcp(LOCAL, f.sport, real4, 8080, TCP_ACK);
    let (v, out) = run(&mut w, &plane, &icmp_error(real4, LOCAL, 3, 3, &sent_to_real[14..14 + 28]), 1);
    assert_eq!(v, Verdict::Forward);
    assert_back_at_the_client(&out);
}

fn octets(a: IpAddr) -> [u8; 4] {
    match a {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => unreachable!(),
    }
}

#[test]
fn a_syn_on_the_port_of_an_ending_connection_is_a_new_session() {
    let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP)], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 1024, 1);
    let (_, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    let first = flow(&out).dst;
    run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK), 0);
    // A retransmitted SYN of a live connection keeps its session.
    assert_eq!(flow(&run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0).1).dst, first);
    run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_FIN | TCP_ACK), 1);
    // Round robin: the new connection goes to the other server.
    let (v, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 2);
    assert_eq!(v, Verdict::Forward);
    assert_ne!(flow(&out).dst, first);
    let c = &w.counters().services[0];
    assert_eq!((c.sessions_total, c.sessions_active, w.sessions()), (2, 1, 1));
}

#[test]
fn packets_of_a_new_flow_in_one_vector_make_one_session() {
    let plane =
        Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Rr, PROTO_UDP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 1024, 1);
    let seg = build::udp(5000, 80, b"q", |len| checksum::pseudo_v4(CLIENT, VIP, PROTO_UDP, len as u16));
    let frame = build::eth(ETHERTYPE_IPV4, &build::ipv4(CLIENT, VIP, PROTO_UDP, &seg));
    let mut mems: Vec<Vec<u8>> = (0..8).map(|_| frame.clone()).collect();
    let mut bufs: Vec<Buf<'_>> = mems.iter_mut().map(|m| Buf { len: m.len(), mem: m, head: 0 }).collect();
    let mut verdicts = Vec::new();
    w.process(&plane, &mut bufs, &mut verdicts, 0);
    assert!(verdicts.iter().all(|v| *v == Verdict::Forward));
    let flows: std::collections::HashSet<_> = bufs.iter().map(|b| flow(b.frame())).collect();
    assert_eq!(flows.len(), 1, "one server, one local port: {flows:?}");
    assert_eq!((w.sessions(), w.counters().services[0].sessions_total), (1, 1));
}

/// A NAT or FNAT TCP session to the first server, established.
fn established(mode: L4Mode, reset: bool) -> (Plane, Worker, [u8; 4], gatehouse_wire::packet::Flow) {
    let mut svc = service(mode, L4Scheduler::Rr, PROTO_TCP);
    svc.reset_on_down = reset;
    let plane = Plane::new(vec![svc], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 1024, 1);
    let (_, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    let to_real = flow(&out);
    run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK), 0);
    (plane, w, octets(to_real.dst), to_real)
}

/// The same plane with the given server's health.
fn with_health(plane: &Plane, real: [u8; 4], up: bool) -> Plane {
    let mut svc = service(plane.services[0].mode, L4Scheduler::Rr, PROTO_TCP);
    svc.reset_on_down = plane.services[0].reset_on_down;
    for r in &mut svc.reals {
        if r.addr == IpAddr::from(real) {
            r.up = up;
        }
    }
    Plane::new(vec![svc], plane.local_addrs.clone(), MAC, HOP, 1)
}

#[test]
fn sessions_of_a_server_that_went_down_are_kept_or_reset() {
    // keep: the session goes on to its server.
    let (plane, mut w, real, _) = established(L4Mode::Nat, false);
    let down = with_health(&plane, real, false);
    assert!(down.extends(&plane));
    w.adopt(&down);
    let (v, out) = run(&mut w, &down, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH), 1);
    assert_eq!((v, flow(&out).dst), (Verdict::Forward, IpAddr::from(real)));

    // reset: the client's next segment is answered with an RST from
    // the VIP (SEQ = its ACK), and the session is gone.
    for mode in [L4Mode::Nat, L4Mode::Fnat] {
        let (plane, mut w, real, to_real) = established(mode, true);
        let down = with_health(&plane, real, false);
        w.adopt(&down);
        let seg = tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH);
        let (v, out) = run(&mut w, &down, &seg, 1);
        assert_eq!(v, Verdict::Forward, "{mode:?}");
        let f = flow(&out);
        assert_eq!((f.src, f.sport, f.dst, f.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
        assert_eq!(out[14 + 33], TCP_RST);
        assert_eq!(out[38..42], seg[42..46], "SEQ = the segment's ACK");
        assert_eq!(out.len(), 14 + 40);
        let c = &w.counters().services[0];
        assert_eq!((c.resets, c.sessions_active, w.sessions()), (1, 0, 0), "{mode:?}");
        // The connection is gone; a new one goes to the server that is up.
        assert_eq!(run(&mut w, &down, &seg, 1).0, Verdict::Drop(DropReason::NoSession));
        let (_, out) = run(&mut w, &down, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 1);
        assert_ne!(flow(&out).dst, IpAddr::from(real));

        // From the server's side, a packet of such a session gets the RST.
        let (plane, mut w, real, to_real2) = established(mode, true);
        assert_eq!(to_real, to_real2);
        let down = with_health(&plane, real, false);
        w.adopt(&down);
        let reply = tcp(real, to_real.dport, octets(to_real.src), to_real.sport, TCP_ACK);
        let (v, out) = run(&mut w, &down, &reply, 1);
        assert_eq!(v, Verdict::Forward);
        let f = flow(&out);
        assert_eq!((f.src, f.dst, f.dport), (to_real.src, IpAddr::from(real), to_real.dport));
        assert_eq!(out[14 + 33], TCP_RST);
        // The session stays for the client: its next segment (which would
        // otherwise find none and be dropped unanswered) gets its own RST,
        // and only then is the session gone.
        assert_eq!(w.sessions(), 1);
        let seg = tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH);
        let (v, out) = run(&mut w, &down, &seg, 2);
        assert_eq!(v, Verdict::Forward, "{mode:?}");
        let f = flow(&out);
        assert_eq!((f.src, f.dst, f.dport), (IpAddr::from(VIP), IpAddr::from(CLIENT), 40000));
        assert_eq!(out[14 + 33], TCP_RST);
        assert_eq!(w.sessions(), 0);
        assert_eq!(w.counters().services[0].resets, 2);
    }
}

#[test]
fn maglev_picks_the_same_server_in_every_worker_and_picks_connections_up() {
    let mut svc = service(L4Mode::Nat, L4Scheduler::Maglev, PROTO_TCP);
    svc.reals.push(Real { addr: Ipv4Addr::new(10, 0, 1, 3).into(), port: 8080, weight: 1, up: true });
    let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
    // Two workers with different table seeds (two processes, or two
    // balancers behind ECMP) agree on every flow.
    let mut a = Worker::new(&plane, 0, 4096, 1);
    let mut b = Worker::new(&plane, 0, 4096, 99);
    let mut used = std::collections::HashSet::new();
    for port in 0..300u16 {
        let syn = tcp(CLIENT, 20000 + port, VIP, 80, TCP_SYN);
        let ra = flow(&run(&mut a, &plane, &syn, 0).1).dst;
        let rb = flow(&run(&mut b, &plane, &syn, 0).1).dst;
        assert_eq!(ra, rb);
        used.insert(ra);
    }
    assert_eq!(used.len(), 3);
    // A mid-connection segment the worker has no session for (it was
    // set up elsewhere) goes where the SYN went.
    let mut c = Worker::new(&plane, 0, 4096, 7);
    for port in 0..300u16 {
        let want = flow(&run(&mut a, &plane, &tcp(CLIENT, 20000 + port, VIP, 80, TCP_ACK), 1).1).dst;
        let (v, out) = run(&mut c, &plane, &tcp(CLIENT, 20000 + port, VIP, 80, TCP_ACK | TCP_PSH), 1);
        assert_eq!((v, flow(&out).dst), (Verdict::Forward, want));
    }
    // Picked up sessions hold the SYN timeout until their next packet.
    run(&mut c, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 22, TCP_SYN), 12);
    for _ in 0..200 {
        run(&mut c, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 22, TCP_SYN), 12);
    }
    assert_eq!(c.sessions(), 0);
    // An RST starts nothing; nor does FNAT (its source port is per process).
    assert_eq!(run(&mut c, &plane, &tcp(CLIENT, 5, VIP, 80, TCP_RST), 13).0, Verdict::Drop(DropReason::NoSession));
    let plane =
        Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Maglev, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 64, 1);
    assert_eq!(run(&mut w, &plane, &tcp(CLIENT, 5, VIP, 80, TCP_ACK), 0).0, Verdict::Drop(DropReason::NoSession));
}

#[test]
fn fnat_sessions_sync_to_a_standby_and_carry_on_there() {
    use crate::sync::Record;
    let tick = std::time::Duration::from_secs(1);
    let plane =
        Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Wrr, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 2);
    let mut master = Worker::new(&plane, 1, 1024, 1);
    master.enable_sync(1024, tick);
    let (_, out) = run(&mut master, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    let f = flow(&out);
    // A SYN alone is not synced (a flood of them would be); the ACK that
    // establishes the session is.
    assert!(master.sync_out().expect("test").records.is_empty());
    run(&mut master, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK), 1);
    let recs: Vec<Record> = std::mem::take(&mut master.sync_out().expect("test").records);
    assert_eq!(recs.len(), 1);
    let r = recs[0];
    assert_eq!((r.client, r.client_port, r.vip, r.vip_port), (IpAddr::from(CLIENT), 40000, IpAddr::from(VIP), 80));
    assert_eq!((r.real, r.real_port, r.local), (f.dst, 8080, Some((IpAddr::from(LOCAL), f.sport))));
    assert_eq!((r.state, r.ttl), (crate::session::State::Established, 900));

    // The standby commits it into both cores; the port's core owns it.
    let mut standby: Vec<Worker> = (0..2).map(|c| Worker::new(&plane, c, 1024, 7 + u64::from(c))).collect();
    for w in &mut standby {
        w.commit(&plane, &r, 5).expect("test");
        // Committing again (a refresh) changes nothing.
        w.commit(&plane, &r, 6).expect("test");
    }
    let owner = usize::from(f.sport % 2);
    assert_eq!(standby[owner].counters().services[0].sessions_active, 1);
    assert_eq!(standby[1 - owner].counters().services[0].sessions_active, 0);
    // The client's next segment, on either core, goes out as before.
    for w in &mut standby {
        let (v, out) = run(w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH), 7);
        assert_eq!(v, Verdict::Forward);
        let g = flow(&out);
        assert_eq!((g.src, g.sport, g.dst, g.dport), (f.src, f.sport, f.dst, 8080));
    }
    // The reply, steered to the port's core, goes back to the client.
    let (v, back) = run(&mut standby[owner], &plane, &tcp(octets(f.dst), 8080, LOCAL, f.sport, TCP_ACK), 8);
    assert_eq!(v, Verdict::Forward);
    let b = flow(&back);
    assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
    // New sessions there never take the synced port.
    for p in 0..200 {
        let (_, out) = run(&mut standby[owner], &plane, &tcp([10, 0, 0, 2], 1000 + p, VIP, 80, TCP_SYN), 9);
        assert_ne!(flow(&out).sport, f.sport);
    }
    // The master's walk sends its established sessions again.
    assert_eq!(master.sync_walk(&plane, 2, master.sync_slots()), 1);
}

#[test]
fn udp_sessions_sync_at_once_and_bad_records_are_refused() {
    let tick = std::time::Duration::from_secs(1);
    let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Rr, PROTO_UDP)], vec![], MAC, HOP, 1);
    let mut master = Worker::new(&plane, 0, 1024, 1);
    master.enable_sync(2, tick);
    let udp = |sport: u16| {
        let seg = packet::build::udp(sport, 80, b"x", |len| checksum::pseudo_v4(CLIENT, VIP, PROTO_UDP, len as u16));
        build::eth(ETHERTYPE_IPV4, &build::ipv4(CLIENT, VIP, PROTO_UDP, &seg))
    };
    for p in 0..3 {
        run(&mut master, &plane, &udp(5000 + p), 0);
    }
    // Two fit; the third is counted as dropped.
    let out = master.sync_out().expect("test");
    assert_eq!((out.records.len(), out.dropped), (2, 1));
    let r = out.records[0];
    assert_eq!((r.proto, r.state, r.ttl), (PROTO_UDP, crate::session::State::Datagram, 60));

    let mut standby = Worker::new(&plane, 0, 1024, 3);
    let mut wrong = r;
    wrong.vip_port = 81;
    assert_eq!(standby.commit(&plane, &wrong, 0), Err(CommitError::NoService));
    wrong = r;
    wrong.real = IpAddr::from([10, 0, 1, 9]);
    assert_eq!(standby.commit(&plane, &wrong, 0), Err(CommitError::NoReal));
    wrong = r;
    wrong.local = Some((IpAddr::from(LOCAL), 2000));
    assert_eq!(standby.commit(&plane, &wrong, 0), Err(CommitError::NoLocal));
    // A committed session expires on the standby as it would have on the
    // master.
    let mut short = r;
    short.ttl = 5;
    standby.commit(&plane, &short, 0).expect("test");
    assert_eq!(standby.sessions(), 1);
    run(&mut standby, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 1, TCP_SYN), 4);
    assert_eq!(standby.sessions(), 1);
    // (The sweep looks at 64 records per vector.)
    for _ in 0..1024 / 64 {
        run(&mut standby, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 1, TCP_SYN), 7);
    }
    assert_eq!(standby.sessions(), 0);
}

#[test]
fn a_takeover_carries_every_session_over_once() {
    use crate::sync::Record;
    // NAT with weights: the reply may come before the client's next
    // segment; only the session carried over tells where it goes.
    let plane = Plane::new(vec![service(L4Mode::Nat, L4Scheduler::Wrr, PROTO_TCP)], vec![], MAC, HOP, 1);
    let mut old = Worker::new(&plane, 0, 1024, 1);
    let (_, out) = run(&mut old, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    let real = octets(flow(&out).dst);
    run(&mut old, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK), 1);
    // A handshake under way goes over too.
    run(&mut old, &plane, &tcp(CLIENT, 40001, VIP, 80, TCP_SYN), 1);
    let mut recs: Vec<Record> = Vec::new();
    old.export(&plane, 2, &mut recs);
    assert_eq!(recs.len(), 2, "{recs:?}");
    let states: Vec<_> = recs.iter().map(|r| (r.client_port, r.state, r.ttl)).collect();
    assert!(states.contains(&(40000, crate::session::State::Established, 899)), "{states:?}");
    assert!(states.contains(&(40001, crate::session::State::SynSent, 9)), "{states:?}");
    let reply = tcp(real, 8080, CLIENT, 40000, TCP_ACK | TCP_PSH);
    let mut fresh = Worker::new(&plane, 0, 1024, 2);
    assert_eq!(run(&mut fresh, &plane, &reply, 0).0, Verdict::Drop(DropReason::NoSession));
    let mut new = Worker::new(&plane, 0, 1024, 3);
    for r in &recs {
        new.commit(&plane, r, 0).expect("commit");
    }
    let (v, back) = run(&mut new, &plane, &reply, 0);
    assert_eq!(v, Verdict::Forward);
    let b = flow(&back);
    assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));

    // FNAT on two cores: each commits every session, the port's core owns
    // it, and only the owner exports it again.
    let plane =
        Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Wrr, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 2);
    let mut old = Worker::new(&plane, 1, 1024, 4);
    let (_, out) = run(&mut old, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    let f = flow(&out);
    run(&mut old, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK), 1);
    let mut recs = Vec::new();
    old.export(&plane, 2, &mut recs);
    assert_eq!(recs.len(), 1);
    let mut new: Vec<Worker> = (0..2).map(|c| Worker::new(&plane, c, 1024, 5 + u64::from(c))).collect();
    for w in &mut new {
        w.commit(&plane, &recs[0], 0).expect("commit");
    }
    for w in &mut new {
        let (v, out) = run(w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_ACK | TCP_PSH), 1);
        assert_eq!(v, Verdict::Forward);
        let g = flow(&out);
        assert_eq!((g.src, g.sport, g.dst, g.dport), (f.src, f.sport, f.dst, 8080));
    }
    let owner = usize::from(f.sport % 2);
    let (v, back) = run(&mut new[owner], &plane, &tcp(octets(f.dst), 8080, LOCAL, f.sport, TCP_ACK), 2);
    assert_eq!(v, Verdict::Forward);
    assert_eq!((flow(&back).dst, flow(&back).dport), (IpAddr::from(CLIENT), 40000));
    let mut again = Vec::new();
    for w in &new {
        w.export(&plane, 3, &mut again);
    }
    assert_eq!(again.len(), 1, "a copy is its owner's to export: {again:?}");
}

/// A TCP frame with the numbers, an MSS option and data given.
#[allow(clippy::too_many_arguments)]
fn seg(
    src: [u8; 4],
    sport: u16,
    dst: [u8; 4],
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    mss: Option<u16>,
    data: &[u8],
) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 24 + data.len()];
    f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let s =
        crate::rewrite::Segment { src: src.into(), dst: dst.into(), sport, dport, seq, ack, flags, window: 29200, mss };
    let n = crate::rewrite::write(&mut f, 14, &s, data).expect("room");
    f.truncate(n);
    f
}

fn numbers(frame: &[u8]) -> (u32, u32, u8, Vec<u8>) {
    let ip = match packet::parse(frame, Checks::default()) {
        Ok(packet::Frame::Ip(ip)) => ip,
        other => panic!("{other:?}"),
    };
    let t = &frame[ip.l4..ip.end];
    let hl = usize::from(t[12] >> 4) * 4;
    let be = |at: usize| u32::from_be_bytes([t[at], t[at + 1], t[at + 2], t[at + 3]]);
    (be(4), be(8), t[13], t[hl..].to_vec())
}

#[test]
fn the_syn_proxy_opens_connections_only_for_good_cookies() {
    for mode in [L4Mode::Fnat, L4Mode::Nat] {
        let mut svc = service(mode, L4Scheduler::Rr, PROTO_TCP);
        svc.syn_proxy = gatehouse_config::SynProxyMode::Always;
        let locals = if mode == L4Mode::Fnat { vec![IpAddr::from(LOCAL)] } else { vec![] };
        let plane = Plane::new(vec![svc], locals, MAC, HOP, 1);
        let mut w = Worker::new(&plane, 0, 1024, 1);
        let isn = 1_000_000u32;
        // The SYN gets our SYN-ACK; no session yet.
        let (v, out) = run(&mut w, &plane, &seg(CLIENT, 40000, VIP, 80, isn, 0, TCP_SYN, Some(1460), b""), 100);
        assert_eq!(v, Verdict::Forward, "{mode:?}");
        let f = flow(&out);
        assert_eq!((f.src, f.sport, f.dst, f.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
        let (cookie, ack, flags, _) = numbers(&out);
        assert_eq!((ack, flags), (isn + 1, TCP_SYN | TCP_ACK));
        assert_eq!(w.sessions(), 0);
        // A forged ACK is dropped and counted.
        let (v, _) = run(&mut w, &plane, &seg(CLIENT, 40000, VIP, 80, isn + 1, cookie + 2, TCP_ACK, None, b""), 100);
        assert_eq!(v, Verdict::Drop(DropReason::BadCookie));
        // The good one: the session, and the SYN to the real server.
        let (v, out) = run(&mut w, &plane, &seg(CLIENT, 40000, VIP, 80, isn + 1, cookie + 1, TCP_ACK, None, b""), 101);
        assert_eq!(v, Verdict::Forward);
        let to_real = flow(&out);
        let (s_seq, _, s_flags, _) = numbers(&out);
        assert_eq!((s_seq, s_flags), (isn, TCP_SYN));
        assert_eq!(to_real.dport, 8080);
        if mode == L4Mode::Fnat {
            assert_eq!(to_real.src, IpAddr::from(LOCAL));
        } else {
            assert_eq!((to_real.src, to_real.sport), (IpAddr::from(CLIENT), 40000));
        }
        assert_eq!(w.sessions(), 1);
        // The client's request before the server answered: kept, dropped.
        let (v, _) = run(
            &mut w,
            &plane,
            &seg(CLIENT, 40000, VIP, 80, isn + 1, cookie + 1, TCP_ACK | TCP_PSH, None, b"GET /"),
            101,
        );
        assert_eq!(v, Verdict::Drop(DropReason::SynProxyPending));
        // The server's SYN-ACK completes its handshake, with the request.
        let real = octets(to_real.dst);
        let (back_to, back_port) = (octets(to_real.src), to_real.sport);
        let rs_isn = 7_000_000u32;
        let (v, out) = run(
            &mut w,
            &plane,
            &seg(real, 8080, back_to, back_port, rs_isn, isn + 1, TCP_SYN | TCP_ACK, Some(1460), b""),
            102,
        );
        assert_eq!(v, Verdict::Forward);
        let g = flow(&out);
        assert_eq!((g.src, g.sport, g.dst, g.dport), (to_real.src, to_real.sport, to_real.dst, 8080));
        let (a_seq, a_ack, a_flags, data) = numbers(&out);
        assert_eq!((a_seq, a_ack, a_flags & TCP_ACK, data.as_slice()), (isn + 1, rs_isn + 1, TCP_ACK, &b"GET /"[..]));
        // The answer goes to the client in the cookie's numbers.
        let (v, out) = run(
            &mut w,
            &plane,
            &seg(real, 8080, back_to, back_port, rs_isn + 1, isn + 6, TCP_ACK | TCP_PSH, None, b"200"),
            103,
        );
        assert_eq!(v, Verdict::Forward);
        let h = flow(&out);
        assert_eq!((h.src, h.sport, h.dst, h.dport), (IpAddr::from(VIP), 80, IpAddr::from(CLIENT), 40000));
        let (c_seq, c_ack, _, _) = numbers(&out);
        assert_eq!((c_seq, c_ack), (cookie + 1, isn + 6));
        // The client's acknowledgment goes to the server in its numbers.
        let (v, out) = run(&mut w, &plane, &seg(CLIENT, 40000, VIP, 80, isn + 6, cookie + 4, TCP_ACK, None, b""), 103);
        assert_eq!(v, Verdict::Forward);
        assert_eq!(numbers(&out).1, rs_isn + 4);
        let c = &w.counters().services[0];
        assert_eq!((c.syn_cookies_sent, c.syn_cookies_valid, c.syn_cookies_failed), (1, 1, 1), "{mode:?}");
    }
}

#[test]
fn auto_turns_the_syn_proxy_on_past_the_threshold() {
    let mut svc = service(L4Mode::Nat, L4Scheduler::Rr, PROTO_TCP);
    svc.syn_proxy = gatehouse_config::SynProxyMode::Auto;
    svc.syn_threshold = 3;
    let plane = Plane::new(vec![svc], vec![], MAC, HOP, 1);
    let mut w = Worker::new(&plane, 0, 1024, 1);
    for p in 0..3 {
        run(&mut w, &plane, &tcp(CLIENT, 1000 + p, VIP, 80, TCP_SYN), 5);
    }
    assert_eq!(w.sessions(), 3);
    // The fourth SYN in the tick: cookies from now on, no session more.
    for p in 3..50 {
        let (v, out) = run(&mut w, &plane, &tcp(CLIENT, 1000 + p, VIP, 80, TCP_SYN), 5);
        assert_eq!(v, Verdict::Forward);
        assert_eq!(flow(&out).dst, IpAddr::from(CLIENT));
    }
    assert_eq!(w.sessions(), 3);
    assert_eq!(w.counters().services[0].syn_cookies_sent, 47);
    // Still on in the ticks after; off once HOLD ticks have passed quietly.
    let (_, out) = run(&mut w, &plane, &tcp(CLIENT, 2000, VIP, 80, TCP_SYN), 6);
    assert_eq!(flow(&out).dst, IpAddr::from(CLIENT));
    let (_, out) = run(&mut w, &plane, &tcp(CLIENT, 2001, VIP, 80, TCP_SYN), 5 + super::synproxy::HOLD + 1);
    assert_ne!(flow(&out).dst, IpAddr::from(CLIENT));
}

#[test]
fn snat_takes_inside_hosts_out_and_their_replies_back() {
    const INSIDE: [u8; 4] = [10, 0, 1, 1];
    const OUT: [u8; 4] = [10, 0, 9, 9];
    const REMOTE: [u8; 4] = [192, 0, 2, 7];
    let rule = SnatRule::new("servers".into(), &[(IpAddr::from([10, 0, 1, 0]), 24)], [10, 900, 30, 60]);
    let plane =
        Plane::new(vec![service(L4Mode::Fnat, L4Scheduler::Rr, PROTO_TCP)], vec![IpAddr::from(LOCAL)], MAC, HOP, 1)
            .with_snat(vec![(rule, vec![IpAddr::from(OUT)], (5000, 5999))]);
    let mut w = Worker::new(&plane, 0, 1024, 1);
    w.enable_sync(64, std::time::Duration::from_secs(1));
    // FNAT keeps to its own local address.
    let (_, out) = run(&mut w, &plane, &tcp(CLIENT, 40000, VIP, 80, TCP_SYN), 0);
    assert_eq!(flow(&out).src, IpAddr::from(LOCAL));
    // A real server's connection out: from the SNAT address.
    let (v, out) = run(&mut w, &plane, &tcp(INSIDE, 5555, REMOTE, 443, TCP_SYN), 1);
    assert_eq!(v, Verdict::Forward);
    let f = flow(&out);
    assert_eq!((f.src, f.dst, f.dport), (IpAddr::from(OUT), IpAddr::from(REMOTE), 443));
    let mapped = f.sport;
    assert!((5000..=5999).contains(&mapped), "{mapped}: the rule's ports");
    // The same inside port to another remote: the same mapping.
    let (_, out) = run(&mut w, &plane, &tcp(INSIDE, 5555, [192, 0, 2, 8], 443, TCP_ACK), 1);
    assert_eq!((flow(&out).src, flow(&out).sport), (IpAddr::from(OUT), mapped));
    // The reply goes back inside.
    let (v, back) = run(&mut w, &plane, &tcp(REMOTE, 443, OUT, mapped, TCP_SYN | TCP_ACK), 2);
    assert_eq!(v, Verdict::Forward);
    let b = flow(&back);
    assert_eq!((b.src, b.sport, b.dst, b.dport), (IpAddr::from(REMOTE), 443, IpAddr::from(INSIDE), 5555));
    // TCP mappings start with a SYN only; UDP with any datagram, apart
    // from TCP's.
    let (v, _) = run(&mut w, &plane, &tcp(INSIDE, 6000, REMOTE, 443, TCP_ACK), 2);
    assert_eq!(v, Verdict::Drop(DropReason::NoSession));
    let seg = packet::build::udp(5555, 53, b"q", |len| checksum::pseudo_v4(INSIDE, REMOTE, PROTO_UDP, len as u16));
    let (v, out) = run(&mut w, &plane, &build::eth(ETHERTYPE_IPV4, &build::ipv4(INSIDE, REMOTE, PROTO_UDP, &seg)), 3);
    assert_eq!(v, Verdict::Forward);
    let u = flow(&out);
    assert_eq!(u.src, IpAddr::from(OUT));
    assert_ne!(u.sport, mapped);
    // A TCP segment to the UDP mapping's port is nobody's.
    let (v, _) = run(&mut w, &plane, &tcp(REMOTE, 53, OUT, u.sport, TCP_ACK), 3);
    assert_eq!(v, Verdict::Drop(DropReason::NoSession));
    assert_eq!((w.counters().snat[0].sessions_total, w.counters().snat[0].packets_in), (2, 1));
    // Both mappings were synced (TCP once established); a standby that
    // commits them sends the replies in.
    let recs = std::mem::take(&mut w.sync_out().expect("sync on").records);
    assert_eq!(recs.len(), 2, "{recs:?}");
    let mut standby = Worker::new(&plane, 0, 1024, 9);
    for r in &recs {
        standby.commit(&plane, r, 3).expect("commit");
    }
    let (v, back) = run(&mut standby, &plane, &tcp(REMOTE, 443, OUT, mapped, TCP_ACK), 4);
    assert_eq!(v, Verdict::Forward);
    assert_eq!((flow(&back).dst, flow(&back).dport), (IpAddr::from(INSIDE), 5555));
    // ... and new mappings there never take the synced ports.
    let (_, out) = run(&mut standby, &plane, &tcp(INSIDE, 7000, REMOTE, 443, TCP_SYN), 4);
    assert!(flow(&out).sport != mapped && flow(&out).sport != u.sport);
    // Mappings expire by their rule's timeouts (UDP: 60 ticks) and free
    // their ports.
    for _ in 0..1024 / 64 + 1 {
        run(&mut w, &plane, &tcp(CLIENT, 1, [10, 0, 0, 7], 1, TCP_SYN), 1000);
    }
    assert_eq!(w.sessions(), 0);
}
