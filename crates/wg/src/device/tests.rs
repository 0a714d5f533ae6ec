//! The device against itself: two devices wired to each other on a
//! simulated clock.

use super::export::HANDOFF_COUNTER_SKIP;
use super::*;
use crate::cookie::CookieError;
use crate::messages::Malformed;
use rand_core::OsRng;

const A_ADDR: &str = "192.0.2.1:51820";
const B_ADDR: &str = "192.0.2.2:51820";
/// The wall-clock time at the start of every test.
const EPOCH: Duration = Duration::from_secs(1_700_000_000);

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("address")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address")
}

/// An IPv4 packet from `src` to `dst` with `payload` bytes.
fn packet(src: [u8; 4], dst: [u8; 4], payload: usize) -> Vec<u8> {
    let total = 20 + payload;
    let mut p = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0];
    p.extend(src);
    p.extend(dst);
    p.extend((0..payload).map(|i| i as u8));
    p
}

struct Pair {
    a: Device<OsRng>,
    b: Device<OsRng>,
    /// a's id for b, b's id for a.
    ab: PeerId,
    ba: PeerId,
    t0: Instant,
}

/// a (10.0.0.1) and b (10.0.0.2), each knowing the other's endpoint.
fn pair(psk: Option<[u8; 32]>, keepalive: Option<u16>) -> Pair {
    let t0 = Instant::now();
    let mut a = Device::new(StaticSecret::random(&mut OsRng), t0, EPOCH, OsRng);
    let mut b = Device::new(StaticSecret::random(&mut OsRng), t0, EPOCH, OsRng);
    let ab = a.add_peer(*b.public(), psk, Some(addr(B_ADDR)), keepalive, &[(ip("10.0.0.2"), 32)]).expect("ok");
    let ba = b.add_peer(*a.public(), psk, Some(addr(A_ADDR)), None, &[(ip("10.0.0.1"), 32)]).expect("ok");
    Pair { a, b, ab, ba, t0 }
}

/// Delivers `out` (from a when `from_a`) to the other side; returns what
/// it sent back and the packets it got.
fn deliver(p: &mut Pair, from_a: bool, out: Vec<Transmit>, now: Instant) -> (Vec<Transmit>, Vec<Vec<u8>>) {
    let (dev, src) = if from_a { (&mut p.b, addr(A_ADDR)) } else { (&mut p.a, addr(B_ADDR)) };
    let mut replies = Vec::new();
    let mut got = Vec::new();
    for t in out {
        let mut buf = Vec::new();
        if let Received::Packet { .. } = dev.receive(&t.datagram, src, now, &mut replies, &mut buf) {
            got.push(buf);
        }
    }
    (replies, got)
}

/// a sends one packet to b, the handshake runs, the packet arrives.
fn establish(p: &mut Pair) {
    let now = p.t0;
    let mut out = Vec::new();
    let data = packet([10, 0, 0, 1], [10, 0, 0, 2], 10);
    p.a.send(&data, now, &mut out).expect("queued");
    assert_eq!(out.len(), 1, "an initiation");
    assert_eq!(out[0].datagram[0], messages::INITIATION);
    let (resp, _) = deliver(p, true, out, now);
    assert_eq!(resp[0].datagram[0], messages::RESPONSE);
    let (flushed, _) = deliver(p, false, resp, now);
    let (_, got) = deliver(p, true, flushed, now);
    assert_eq!(got, vec![data], "the queued packet arrives");
}

#[test]
fn sessions_handed_to_a_new_device_carry_on_without_a_handshake() {
    use rand_core::RngCore;
    let t0 = Instant::now();
    let mut secret = [0u8; 32];
    OsRng.fill_bytes(&mut secret);
    let a = Device::new(StaticSecret::from_bytes(secret), t0, EPOCH, OsRng);
    let mut b = Device::new(StaticSecret::random(&mut OsRng), t0, EPOCH, OsRng);
    let mut a = a;
    let ab = a.add_peer(*b.public(), None, Some(addr(B_ADDR)), None, &[(ip("10.0.0.2"), 32)]).expect("ok");
    let ba = b.add_peer(*a.public(), None, Some(addr(A_ADDR)), None, &[(ip("10.0.0.1"), 32)]).expect("ok");
    let mut p = Pair { a, b, ab, ba, t0 };
    establish(&mut p);
    // b -> a once, so that a has seen counter 0 (a replay of it must fail later).
    let now = t0 + Duration::from_secs(1);
    let mut early = Vec::new();
    p.b.send(&packet([10, 0, 0, 2], [10, 0, 0, 1], 8), now, &mut early).expect("sent");
    let (_, got) = deliver(&mut p, false, early.clone(), now);
    assert_eq!(got.len(), 1);

    let exported = p.a.export_sessions(now);
    // The next process: same key, same peer, no session of its own.
    let mut a2 = Device::new(StaticSecret::from_bytes(secret), now, EPOCH, OsRng);
    let ab2 = a2.add_peer(*p.b.public(), None, None, None, &[(ip("10.0.0.2"), 32)]).expect("ok");
    // Malformed or foreign exports change nothing.
    assert_eq!(a2.import_sessions(&exported[..exported.len() - 1], now), Err(HandoffError::Malformed));
    let other = Device::new(StaticSecret::random(&mut OsRng), now, EPOCH, OsRng);
    assert_eq!(a2.import_sessions(&other.export_sessions(now), now), Err(HandoffError::OtherKey));
    assert!(a2.endpoint(ab2).is_none() && a2.last_handshake(ab2).is_none());
    assert_eq!(a2.import_sessions(&exported, now), Ok(1));
    assert_eq!(a2.endpoint(ab2), Some(addr(B_ADDR)), "the endpoint comes along");
    assert!(a2.last_handshake(ab2).is_some());
    p.a = a2;
    p.ab = ab2;

    // a2 -> b: transport at once (no initiation), and b opens it.
    let later = now + Duration::from_secs(1);
    let data = packet([10, 0, 0, 1], [10, 0, 0, 2], 33);
    let mut out = Vec::new();
    p.a.send(&data, later, &mut out).expect("sent");
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].datagram[0], messages::TRANSPORT, "no new handshake");
    let counter = u64::from_le_bytes(out[0].datagram[8..16].try_into().expect("8 bytes"));
    assert!(counter >= HANDOFF_COUNTER_SKIP, "the sending counter moved on: {counter}");
    let (_, got) = deliver(&mut p, true, out, later);
    assert_eq!(got, vec![data]);
    // b -> a2 opens with the handed keys; the replay window came along.
    let back = packet([10, 0, 0, 2], [10, 0, 0, 1], 44);
    let mut out = Vec::new();
    p.b.send(&back, later, &mut out).expect("sent");
    let (_, got) = deliver(&mut p, false, out, later);
    assert_eq!(got, vec![back]);
    let (_, got) = deliver(&mut p, false, early, later);
    assert!(got.is_empty(), "a packet the old process opened is a replay");
}

#[test]
fn a_queued_packet_crosses_once_the_handshake_completes_and_data_flows_back() {
    for psk in [None, Some([4u8; 32])] {
        let mut p = pair(psk, None);
        establish(&mut p);
        let now = p.t0 + Duration::from_secs(1);
        let back = packet([10, 0, 0, 2], [10, 0, 0, 1], 100);
        let mut out = Vec::new();
        p.b.send(&back, now, &mut out).expect("sent");
        assert_eq!(out[0].datagram[0], messages::TRANSPORT, "b's keys are confirmed");
        let (_, got) = deliver(&mut p, false, out, now);
        assert_eq!(got, vec![back]);
        assert!(p.a.last_handshake(p.ab).is_some() && p.b.last_handshake(p.ba).is_some());
    }
}

#[test]
fn a_lost_initiation_is_retried_then_given_up_and_its_packets_dropped() {
    let mut p = pair(None, None);
    let mut out = Vec::new();
    let data = packet([10, 0, 0, 1], [10, 0, 0, 2], 1);
    p.a.send(&data, p.t0, &mut out).expect("queued");
    assert_eq!(out.len(), 1);
    out.clear();
    let soon = p.t0 + Duration::from_secs(4);
    assert!(p.a.tick(soon, &mut out).is_empty());
    assert!(out.is_empty(), "not before REKEY_TIMEOUT");
    let retry = p.t0 + Duration::from_millis(5_400);
    p.a.tick(retry, &mut out);
    assert_eq!(out.len(), 1, "retried after 5 s and jitter");
    let mut t = retry;
    let mut dropped = Vec::new();
    while t < p.t0 + REKEY_ATTEMPT_TIME + Duration::from_secs(1) {
        t += Duration::from_secs(1);
        dropped.extend(p.a.tick(t, &mut out));
    }
    assert_eq!(dropped, vec![(p.ab, DropReason::HandshakeTimeout)]);
    assert!((15..=19).contains(&out.len()), "about one retry each 5 s: {}", out.len());
}

#[test]
fn keepalives_passive_and_persistent() {
    let mut p = pair(None, Some(25));
    establish(&mut p);
    // b got data and sent nothing: a keepalive after KEEPALIVE_TIMEOUT.
    let mut out = Vec::new();
    let t = p.t0 + Duration::from_secs(9);
    p.b.tick(t, &mut out);
    assert!(out.is_empty());
    let t = p.t0 + KEEPALIVE_TIMEOUT;
    p.b.tick(t, &mut out);
    assert_eq!(out.len(), 1, "a passive keepalive");
    let (_, got) = deliver(&mut p, false, std::mem::take(&mut out), t);
    assert!(got.is_empty(), "a keepalive is not a packet");
    // a has a persistent keepalive of 25 s.
    let t = p.t0 + Duration::from_secs(25);
    p.a.tick(t, &mut out);
    assert_eq!(out.len(), 1, "a persistent keepalive");
    assert_eq!(out[0].datagram.len(), messages::transport::MIN_LEN);
}

#[test]
fn unanswered_data_starts_a_new_handshake() {
    let mut p = pair(None, None);
    establish(&mut p);
    // b answers the first packet: nothing is due on a.
    let t0 = p.t0;
    let mut out = Vec::new();
    p.b.send(&packet([10, 0, 0, 2], [10, 0, 0, 1], 1), t0, &mut out).expect("sent");
    deliver(&mut p, false, out, t0);
    let t = p.t0 + Duration::from_secs(2);
    let mut out = Vec::new();
    p.a.send(&packet([10, 0, 0, 1], [10, 0, 0, 2], 5), t, &mut out).expect("sent");
    out.clear();
    let t2 = t + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT;
    p.a.tick(t2 - Duration::from_secs(1), &mut out);
    assert!(out.is_empty());
    p.a.tick(t2, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].datagram[0], messages::INITIATION);
}

#[test]
fn the_initiator_rekeys_after_two_minutes_and_sessions_overlap() {
    let mut p = pair(None, None);
    establish(&mut p);
    let t = p.t0 + REKEY_AFTER_TIME;
    let mut out = Vec::new();
    let data = packet([10, 0, 0, 1], [10, 0, 0, 2], 5);
    p.a.send(&data, t, &mut out).expect("sent");
    assert_eq!(out.iter().map(|o| o.datagram[0]).collect::<Vec<_>>(), [messages::TRANSPORT, messages::INITIATION]);
    let (resp, got) = deliver(&mut p, true, out, t);
    assert_eq!(got, vec![data.clone()], "the old session still carries data");
    let (flushed, _) = deliver(&mut p, false, resp, t);
    // a confirms the new session with a keepalive; then both use it.
    let (_, got) = deliver(&mut p, true, flushed, t);
    assert!(got.is_empty());
    let later = t + Duration::from_secs(100);
    let mut out = Vec::new();
    p.a.send(&data, later, &mut out).expect("sent");
    assert_eq!(out.len(), 1, "no rekey: the keys are new");
    let (_, got) = deliver(&mut p, true, out, later);
    assert_eq!(got.len(), 1);
}

#[test]
fn expired_keys_are_not_used_and_old_ones_are_forgotten() {
    let mut p = pair(None, None);
    establish(&mut p);
    let t = p.t0 + REJECT_AFTER_TIME;
    let mut out = Vec::new();
    p.b.send(&packet([10, 0, 0, 2], [10, 0, 0, 1], 5), t, &mut out).expect("queued");
    assert_eq!(out[0].datagram[0], messages::INITIATION, "b may not send on 180 s old keys");
    let mut p2 = pair(None, None);
    establish(&mut p2);
    let t = p2.t0 + REJECT_AFTER_TIME * 3;
    let mut out = Vec::new();
    p2.a.tick(t, &mut out);
    let peer = p2.a.peers[p2.ab].as_ref().expect("peer");
    assert!(peer.current.is_none() && peer.previous.is_none(), "zeroed after 540 s");
    assert!(p2.a.indexes.is_empty(), "and their indexes gone");
}

#[test]
fn replays_floods_strangers_and_spoofed_sources_are_dropped() {
    let mut p = pair(None, None);
    let mut out = Vec::new();
    p.a.send(&packet([10, 0, 0, 1], [10, 0, 0, 2], 1), p.t0, &mut out).expect("queued");
    let init = out[0].datagram.clone();
    let t0 = p.t0;
    let (resp, _) = deliver(&mut p, true, out, t0);
    assert_eq!(resp.len(), 1);
    let mut sink = Vec::new();
    let replay = p.b.receive(&init, addr(A_ADDR), p.t0 + Duration::from_secs(1), &mut sink, &mut Vec::new());
    assert_eq!(replay, Received::Dropped(DropReason::ReplayedInitiation));
    // A second, newer initiation within 20 ms is a flood.
    let mut out = Vec::new();
    let t = p.t0 + Duration::from_millis(5_500);
    p.a.tick(t, &mut out);
    let again = out[0].datagram.clone();
    let early = p.t0 + Duration::from_millis(10);
    assert_eq!(
        p.b.receive(&again, addr(A_ADDR), early, &mut sink, &mut Vec::new()),
        Received::Dropped(DropReason::Flood)
    );
    // A stranger's initiation opens but names no peer.
    let mut s = Device::new(StaticSecret::random(&mut OsRng), p.t0, EPOCH, OsRng);
    let sb = s.add_peer(*p.b.public(), None, Some(addr(B_ADDR)), None, &[(ip("10.0.0.2"), 32)]).expect("ok");
    let mut out = Vec::new();
    s.send(&packet([10, 0, 0, 9], [10, 0, 0, 2], 1), p.t0, &mut out).expect("queued");
    let _ = sb;
    assert_eq!(
        p.b.receive(&out[0].datagram, addr("192.0.2.9:1"), p.t0, &mut sink, &mut Vec::new()),
        Received::Dropped(DropReason::UnknownPeer)
    );
    // Established, a packet whose inner source is not a's is dropped.
    let mut p = pair(None, None);
    establish(&mut p);
    let mut out = Vec::new();
    let mut wire = Vec::new();
    if let Some(c) = p.a.peers[p.ab].as_mut().and_then(|x| x.current.as_mut()) {
        c.keys.seal(&packet([10, 0, 0, 7], [10, 0, 0, 2], 3), &mut wire).expect("seal");
    }
    out.push(Transmit { to: addr(B_ADDR), datagram: wire });
    assert_eq!(
        p.b.receive(&out[0].datagram, addr(A_ADDR), p.t0, &mut sink, &mut Vec::new()),
        Received::Dropped(DropReason::NotAllowedSource)
    );
    let junk = [4u8, 0, 0, 0, 1, 2, 3];
    assert_eq!(
        p.b.receive(&junk, addr(A_ADDR), p.t0, &mut sink, &mut Vec::new()),
        Received::Dropped(DropReason::Malformed(Malformed::BadLength))
    );
}

#[test]
fn the_endpoint_follows_a_roaming_peer() {
    let mut p = pair(None, None);
    establish(&mut p);
    let moved = addr("203.0.113.5:40000");
    let mut out = Vec::new();
    p.b.send(&packet([10, 0, 0, 2], [10, 0, 0, 1], 4), p.t0, &mut out).expect("sent");
    let got = p.a.receive(&out[0].datagram, moved, p.t0, &mut Vec::new(), &mut Vec::new());
    assert!(matches!(got, Received::Packet { peer, .. } if peer == p.ab), "{got:?}");
    assert_eq!(p.a.endpoint(p.ab), Some(moved));
    let mut out = Vec::new();
    p.a.send(&packet([10, 0, 0, 1], [10, 0, 0, 2], 4), p.t0, &mut out).expect("sent");
    assert_eq!(out[0].to, moved, "replies go where the peer is now");
}

#[test]
fn under_load_the_initiator_must_prove_its_address_first() {
    let mut p = pair(None, None);
    p.b.set_under_load(true);
    let mut out = Vec::new();
    p.a.send(&packet([10, 0, 0, 1], [10, 0, 0, 2], 1), p.t0, &mut out).expect("queued");
    let t0 = p.t0;
    let (reply, _) = deliver(&mut p, true, out, t0);
    assert_eq!(reply[0].datagram[0], messages::COOKIE_REPLY);
    let (nothing, _) = deliver(&mut p, false, reply, t0);
    assert!(nothing.is_empty());
    let t = p.t0 + Duration::from_millis(5_400);
    let mut out = Vec::new();
    p.a.tick(t, &mut out);
    let retry = out.clone();
    let (resp, _) = deliver(&mut p, true, out, t);
    assert_eq!(resp[0].datagram[0], messages::RESPONSE, "the retry's mac2 carries the cookie");
    // The same source, proven, but sending faster than its share.
    let outcomes: Vec<Received> =
        (0..10).map(|_| p.b.receive(&retry[0].datagram, addr(A_ADDR), t, &mut Vec::new(), &mut Vec::new())).collect();
    assert_eq!(
        outcomes.iter().filter(|r| **r == Received::Dropped(DropReason::RateLimited)).count(),
        10 - (crate::ratelimit::PER_SOURCE_BURST as usize - 1),
        "{outcomes:?}"
    );
}

#[test]
fn a_handshake_storm_puts_the_device_under_load_by_itself() {
    let mut p = pair(None, None);
    let mut out = Vec::new();
    p.a.send(&packet([10, 0, 0, 1], [10, 0, 0, 2], 1), p.t0, &mut out).expect("queued");
    let init = out[0].datagram.clone();
    let mut replies = Vec::new();
    for _ in 0..=crate::ratelimit::UNDER_LOAD_PER_SECOND {
        p.b.receive(&init, addr("198.51.100.1:9"), p.t0, &mut replies, &mut Vec::new());
    }
    replies.clear();
    p.b.receive(&init, addr("198.51.100.1:9"), p.t0, &mut replies, &mut Vec::new());
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].datagram[0], messages::COOKIE_REPLY, "a cookie, not a response");
}

#[test]
fn drop_slots_and_names_agree() {
    use crate::messages::Malformed::*;
    let all = [
        DropReason::Malformed(Short),
        DropReason::Malformed(UnknownType),
        DropReason::Malformed(Reserved),
        DropReason::Malformed(BadLength),
        DropReason::Handshake(HandshakeError::Mac1),
        DropReason::Handshake(HandshakeError::Decrypt),
        DropReason::Handshake(HandshakeError::WeakKey),
        DropReason::Handshake(HandshakeError::UnknownReceiver),
        DropReason::Cookie(CookieError::Unexpected),
        DropReason::Cookie(CookieError::Decrypt),
        DropReason::UnknownPeer,
        DropReason::ReplayedInitiation,
        DropReason::Flood,
        DropReason::RateLimited,
        DropReason::UnknownIndex,
        DropReason::Transport(TransportError::Decrypt),
        DropReason::Transport(TransportError::Replay),
        DropReason::Transport(TransportError::Exhausted),
        DropReason::Expired,
        DropReason::NotAllowedSource,
        DropReason::NotIp,
        DropReason::NoRoute,
        DropReason::NoEndpoint,
        DropReason::HandshakeTimeout,
    ];
    // Every slot taken once, in order.
    assert_eq!(all.map(DropReason::index), std::array::from_fn(|i| i));
    assert_eq!(DropReason::Malformed(BadLength).name(), "bad_length");
    for r in all {
        if let Some(at) = r.peer_index() {
            assert_eq!(PEER_DROP_NAMES[at], r.name());
        }
    }
    assert_eq!(all.iter().filter_map(|r| r.peer_index()).count(), PEER_DROP_NAMES.len());
}

#[test]
fn planned_batches_seal_and_open_and_a_copy_opened_twice_counts_once() {
    let mut p = pair(None, None);
    establish(&mut p);
    let now = p.t0 + Duration::from_millis(5);
    let mut out = Vec::new();
    // Plans first, all of them, then sealing: as a worker batches.
    let packets: Vec<Vec<u8>> = (0..5).map(|i| packet([10, 0, 0, 1], [10, 0, 0, 2], i * 37)).collect();
    let plans: Vec<SealPlan> =
        packets.iter().map(|d| p.a.plan_seal(d, now, &mut out).expect("routed").expect("a session")).collect();
    assert!(out.is_empty(), "no handshake is due");
    let counters: Vec<u64> = plans.iter().map(|pl| pl.counter).collect();
    assert!(counters.windows(2).all(|w| w[1] == w[0] + 1), "{counters:?}");
    let datagrams: Vec<Vec<u8>> = plans.iter().zip(&packets).map(|(pl, d)| seal_one(pl, d)).collect();
    // b plans every datagram, the last one twice (a duplicate in one batch).
    let mut inbound: Vec<&Vec<u8>> = datagrams.iter().collect();
    inbound.push(&datagrams[4]);
    let opened: Vec<OpenPlan> = inbound
        .iter()
        .map(|d| match p.b.plan_open(d, addr(A_ADDR), now, &mut out) {
            Inbound::Open(o) => o,
            Inbound::Done(r) => panic!("not opened: {r:?}"),
        })
        .collect();
    let mut got = Vec::new();
    for (plan, d) in opened.iter().zip(&inbound) {
        let mut buf = d[crate::messages::transport::DATA..].to_vec();
        crate::crypto::open(&plan.key, plan.counter, &mut buf, &[]).expect("opens");
        buf.truncate(buf.len() - crate::crypto::TAG_LEN);
        got.push(p.b.finish_open(plan, &buf, addr(A_ADDR), now, &mut out));
    }
    for (i, r) in got[..5].iter().enumerate() {
        assert_eq!(*r, Received::Packet { peer: p.ba, len: packets[i].len() });
    }
    assert_eq!(got[5], Received::Dropped(DropReason::Transport(TransportError::Replay)));
    let stats = p.b.peer_info(p.ba).expect("peer").stats;
    assert_eq!((stats.drops[0], stats.rx_packets), (1, 6), "the replay is counted against a");
    // A plan whose keys were forgotten meanwhile is dropped, not opened.
    let late = p.a.plan_seal(&packets[0], now, &mut out).expect("routed").expect("a session");
    let d = seal_one(&late, &packets[0]);
    let Inbound::Open(plan) = p.b.plan_open(&d, addr(A_ADDR), now, &mut out) else { panic!("opens") };
    p.b.remove_peer(p.ba);
    assert_eq!(
        p.b.finish_open(&plan, &packets[0], addr(A_ADDR), now, &mut out),
        Received::Dropped(DropReason::UnknownIndex)
    );
}
