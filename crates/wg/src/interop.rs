//! This crate against boringtun's `Tunn`, in memory, each side starting
//! the handshake, with and without a pre-shared key: the handshake
//! completes and data crosses both ways.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519;

use crate::cookie::{CookieChecker, CookieJar};
use crate::messages::{initiation, response};

use crate::crypto::StaticSecret;
use crate::handshake::{self, Identity, PeerKey};
use crate::messages::{self, Message};
use crate::transport::Keypair;

/// A minimal IPv4 packet (boringtun reads its header to find the length
/// and the inner source) of `payload` bytes.
fn ipv4_packet(payload: usize) -> Vec<u8> {
    let total = 20 + payload;
    let mut p = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1];
    p.extend((0..payload).map(|i| i as u8));
    p
}

fn now() -> [u8; 12] {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    handshake::tai64n(since)
}

fn network(r: TunnResult<'_>) -> Vec<u8> {
    match r {
        TunnResult::WriteToNetwork(b) => b.to_vec(),
        other => panic!("expected a datagram, got {other:?}"),
    }
}

fn tunnel(r: TunnResult<'_>) -> Vec<u8> {
    match r {
        TunnResult::WriteToTunnelV4(b, _) => b.to_vec(),
        other => panic!("expected a packet, got {other:?}"),
    }
}

struct Sides {
    me: Identity,
    peer: PeerKey,
    bt: Tunn,
}

fn sides(psk: Option<[u8; 32]>) -> Sides {
    let mut rng = rand_core::OsRng;
    let bt_secret = x25519::StaticSecret::random_from_rng(rand_core::OsRng);
    let bt_public = x25519::PublicKey::from(&bt_secret);
    let me = Identity::new(StaticSecret::random(&mut rng));
    let bt = Tunn::new(bt_secret, x25519::PublicKey::from(*me.public()), psk, None, 1, None);
    Sides { peer: PeerKey::new(&me, bt_public.to_bytes(), psk), me, bt }
}

/// Data both ways over an established session.
fn exchange_data(s: &mut Sides, keys: &mut Keypair) {
    let mut buf = vec![0u8; 2048];
    let mut wire = Vec::new();
    let mut plain = Vec::new();
    for len in [0usize, 1, 100, 1400] {
        let packet = ipv4_packet(len);
        keys.seal(&packet, &mut wire).expect("seals");
        assert_eq!(tunnel(s.bt.decapsulate(None, &wire, &mut buf)), packet, "boringtun opens ours");
        let theirs = network(s.bt.encapsulate(&packet, &mut buf));
        let Ok(Message::Transport { receiver, counter, sealed }) = messages::parse(&theirs) else {
            panic!("a transport message")
        };
        assert_eq!(receiver, keys.local);
        keys.open(counter, sealed, &mut plain).expect("we open boringtun's");
        assert_eq!(&plain[..packet.len()], &packet[..]);
        assert!(plain[packet.len()..].iter().all(|b| *b == 0), "only zero padding after the packet");
    }
}

#[test]
fn boringtun_initiates_and_we_respond() {
    for psk in [None, Some([5u8; 32])] {
        let mut s = sides(psk);
        let mut rng = rand_core::OsRng;
        let mut buf = vec![0u8; 2048];
        let init = network(s.bt.format_handshake_initiation(&mut buf, false));
        let Ok(Message::Initiation(init)) = messages::parse(&init) else { panic!("an initiation") };
        let got = handshake::receive_initiation(&s.me, init).expect("opens");
        assert_eq!(&got.peer_public, s.peer.public());
        let got = got.from_peer(&s.peer).expect("from boringtun");
        let (resp, session) = handshake::respond(got, &s.peer, 77, None, &mut rng).expect("responds");
        let mut keys = Keypair::from(session);
        // boringtun confirms the session with a keepalive.
        let keepalive = network(s.bt.decapsulate(None, &resp, &mut buf));
        let Ok(Message::Transport { receiver, counter, sealed }) = messages::parse(&keepalive) else {
            panic!("a keepalive")
        };
        assert_eq!(receiver, 77);
        let mut plain = Vec::new();
        keys.open(counter, sealed, &mut plain).expect("opens");
        assert!(plain.is_empty());
        exchange_data(&mut s, &mut keys);
    }
}

#[test]
fn we_initiate_and_boringtun_responds() {
    for psk in [None, Some([6u8; 32])] {
        let mut s = sides(psk);
        let mut rng = rand_core::OsRng;
        let mut buf = vec![0u8; 2048];
        let (init, state) = handshake::initiate(&s.me, &s.peer, 9, now(), None, &mut rng).expect("initiates");
        let resp = network(s.bt.decapsulate(None, &init, &mut buf));
        let Ok(Message::Response(resp)) = messages::parse(&resp) else { panic!("a response") };
        let session = handshake::receive_response(&s.me, &state, &s.peer, resp).expect("completes");
        let mut keys = Keypair::from(session);
        exchange_data(&mut s, &mut keys);
    }
}

#[test]
fn a_stranger_gets_nothing_from_boringtun() {
    let mut s = sides(None);
    let mut rng = rand_core::OsRng;
    let stranger = Identity::new(StaticSecret::random(&mut rng));
    let mut buf = vec![0u8; 2048];
    let (init, _) = handshake::initiate(&stranger, &s.peer, 9, now(), None, &mut rng).expect("initiates");
    assert!(matches!(s.bt.decapsulate(None, &init, &mut buf), TunnResult::Err(_)));
}

#[test]
fn boringtun_under_load_gets_our_cookie_back_in_mac2() {
    let mut rng = rand_core::OsRng;
    let bt_secret = x25519::StaticSecret::random_from_rng(rand_core::OsRng);
    let bt_public = x25519::PublicKey::from(&bt_secret);
    let me = Identity::new(StaticSecret::random(&mut rng));
    // A limit of zero: every handshake message needs a valid mac2.
    let limiter = Arc::new(RateLimiter::new(&bt_public, 0));
    let mut bt = Tunn::new(bt_secret, x25519::PublicKey::from(*me.public()), None, None, 1, Some(limiter));
    let peer = PeerKey::new(&me, bt_public.to_bytes(), None);
    let from = IpAddr::from([192, 0, 2, 1]);
    let mut buf = vec![0u8; 2048];
    let mut jar = CookieJar::default();
    let (init, _) = handshake::initiate(&me, &peer, 3, now(), None, &mut rng).expect("initiates");
    jar.sent(&init, initiation::MAC1);
    let reply = network(bt.decapsulate(Some(from), &init, &mut buf));
    let Ok(Message::CookieReply(reply)) = messages::parse(&reply) else { panic!("a cookie reply") };
    assert_eq!(messages::cookie_receiver(reply), 3);
    let t = Instant::now();
    jar.receive(reply, &peer, t).expect("our jar opens boringtun's cookie");
    let (init, state) = handshake::initiate(&me, &peer, 4, now(), jar.cookie(t), &mut rng).expect("initiates");
    let resp = network(bt.decapsulate(Some(from), &init, &mut buf));
    let Ok(Message::Response(resp)) = messages::parse(&resp) else { panic!("a response once mac2 is right") };
    handshake::receive_response(&me, &state, &peer, resp).expect("completes");
}

#[test]
fn we_under_load_make_boringtun_prove_its_address() {
    let mut rng = rand_core::OsRng;
    let mut s = sides(None);
    let src: SocketAddr = "198.51.100.9:40000".parse().expect("addr");
    let t = Instant::now();
    let mut checker = CookieChecker::new(&s.me, t, &mut rng);
    let mut buf = vec![0u8; 2048];
    let init = network(s.bt.format_handshake_initiation(&mut buf, false));
    assert!(!checker.mac2_ok(&init, initiation::MAC1, src, t, &mut rng));
    let sender = messages::sender(&init);
    let reply = checker.reply(&init, initiation::MAC1, sender, src, t, &mut rng);
    assert!(matches!(s.bt.decapsulate(None, &reply, &mut buf), TunnResult::Done), "boringtun takes the cookie");
    let again = network(s.bt.format_handshake_initiation(&mut buf, true));
    assert!(checker.mac2_ok(&again, initiation::MAC1, src, t, &mut rng), "its retry carries a valid mac2");
    let Ok(Message::Initiation(again)) = messages::parse(&again) else { panic!("an initiation") };
    let got = handshake::receive_initiation(&s.me, again).and_then(|o| o.from_peer(&s.peer)).expect("opens");
    let (resp, _) = handshake::respond(got, &s.peer, 8, None, &mut rng).expect("responds");
    assert_eq!(resp.len(), response::LEN);
}

/// An IPv4 packet between the tunnel addresses used below.
fn inner(src: [u8; 4], dst: [u8; 4], payload: usize) -> Vec<u8> {
    let total = 20 + payload;
    let mut p = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0];
    p.extend(src);
    p.extend(dst);
    p.extend((0..payload).map(|i| (i * 7) as u8));
    p
}

#[test]
fn our_device_and_boringtun_each_start_and_carry_data() {
    use crate::device::{Device, Received, Transmit};
    let bt_addr: SocketAddr = "192.0.2.20:51820".parse().expect("addr");
    let our_addr: SocketAddr = "192.0.2.10:51820".parse().expect("addr");
    for we_start in [true, false] {
        let t = Instant::now();
        let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let bt_secret = x25519::StaticSecret::random_from_rng(rand_core::OsRng);
        let bt_public = x25519::PublicKey::from(&bt_secret);
        let mut dev = Device::new(StaticSecret::random(&mut rand_core::OsRng), t, wall, rand_core::OsRng);
        let mut bt = Tunn::new(bt_secret, x25519::PublicKey::from(*dev.public()), Some([1; 32]), None, 7, None);
        let allowed = [(IpAddr::from([10, 9, 0, 2]), 32)];
        let id = dev.add_peer(bt_public.to_bytes(), Some([1; 32]), Some(bt_addr), None, &allowed).expect("peer");
        let mut buf = vec![0u8; 2048];
        let mut out: Vec<Transmit> = Vec::new();
        let ours = inner([10, 9, 0, 1], [10, 9, 0, 2], 300);
        let mut packet = Vec::new();
        if we_start {
            dev.send(&ours, t, &mut out).expect("queued");
            let resp = network(bt.decapsulate(Some(our_addr.ip()), &out[0].datagram, &mut buf));
            out.clear();
            assert_eq!(dev.receive(&resp, bt_addr, t, &mut out, &mut packet), Received::Control);
            assert_eq!(tunnel(bt.decapsulate(None, &out[0].datagram, &mut buf)), ours, "the queued packet");
        } else {
            let init = network(bt.format_handshake_initiation(&mut buf, false));
            assert_eq!(dev.receive(&init, bt_addr, t, &mut out, &mut packet), Received::Control);
            let keepalive = network(bt.decapsulate(None, &out[0].datagram, &mut buf));
            out.clear();
            assert_eq!(dev.receive(&keepalive, bt_addr, t, &mut out, &mut packet), Received::Control);
            dev.send(&ours, t, &mut out).expect("sent");
            assert_eq!(tunnel(bt.decapsulate(None, &out[0].datagram, &mut buf)), ours);
        }
        let theirs = inner([10, 9, 0, 2], [10, 9, 0, 1], 1000);
        let datagram = network(bt.encapsulate(&theirs, &mut buf));
        let got = dev.receive(&datagram, bt_addr, t, &mut out, &mut packet);
        assert!(matches!(got, Received::Packet { peer, .. } if peer == id), "{got:?}");
        assert_eq!(packet, theirs, "padding cut off");
    }
}

#[test]
fn our_rekey_after_two_minutes_is_taken_by_boringtun() {
    use crate::device::{Device, REKEY_AFTER_TIME, Received, Transmit};
    let bt_addr: SocketAddr = "192.0.2.20:51820".parse().expect("addr");
    let t = Instant::now();
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let bt_secret = x25519::StaticSecret::random_from_rng(rand_core::OsRng);
    let bt_public = x25519::PublicKey::from(&bt_secret);
    let mut dev = Device::new(StaticSecret::random(&mut rand_core::OsRng), t, wall, rand_core::OsRng);
    let mut bt = Tunn::new(bt_secret, x25519::PublicKey::from(*dev.public()), None, None, 3, None);
    let id = dev.add_peer(bt_public.to_bytes(), None, Some(bt_addr), None, &[(IpAddr::from([10, 9, 0, 2]), 32)]);
    let id = id.expect("peer");
    let mut buf = vec![0u8; 2048];
    let mut out: Vec<Transmit> = Vec::new();
    let mut packet = Vec::new();
    let ours = inner([10, 9, 0, 1], [10, 9, 0, 2], 64);
    dev.send(&ours, t, &mut out).expect("queued");
    let resp = network(bt.decapsulate(None, &out[0].datagram, &mut buf));
    out.clear();
    dev.receive(&resp, bt_addr, t, &mut out, &mut packet);
    assert_eq!(tunnel(bt.decapsulate(None, &out[0].datagram, &mut buf)), ours);
    let first = dev.last_handshake(id);
    // Two minutes on: the packet still goes on the old keys, and a new
    // handshake starts beside it.
    let later = t + REKEY_AFTER_TIME;
    out.clear();
    dev.send(&ours, later, &mut out).expect("sent");
    assert_eq!(out.len(), 2);
    assert_eq!(tunnel(bt.decapsulate(None, &out[0].datagram, &mut buf)), ours);
    let resp = network(bt.decapsulate(None, &out[1].datagram, &mut buf));
    let mut confirm = Vec::new();
    assert_eq!(dev.receive(&resp, bt_addr, later, &mut confirm, &mut packet), Received::Control);
    assert!(dev.last_handshake(id) > first, "a new session");
    // Our keepalive confirms it to boringtun, and its data still reaches us.
    assert!(matches!(bt.decapsulate(None, &confirm[0].datagram, &mut buf), TunnResult::Done));
    let theirs = inner([10, 9, 0, 2], [10, 9, 0, 1], 64);
    let datagram = network(bt.encapsulate(&theirs, &mut buf));
    let got = dev.receive(&datagram, bt_addr, later, &mut out, &mut packet);
    assert!(matches!(got, Received::Packet { peer, .. } if peer == id), "{got:?}");
    assert_eq!(packet, theirs);
}
