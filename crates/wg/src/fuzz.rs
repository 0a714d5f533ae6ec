//! A bounded mutational fuzzer over the receive path, run by `make test`
//! (stable Rust: no coverage feedback, but it runs every time). Seeds are
//! the checked-in corpus in `crates/wg/fuzz/corpus`: every message type as
//! a real exchange between two devices with fixed keys and a seeded random
//! source makes them, byte for byte. Mutations (bit flips, edge values in
//! the index and counter fields, truncation, growth, splices) go to a
//! responder and to an initiator mid-session, from changing sources.
//! Nothing may panic, every datagram gets an outcome, and afterwards both
//! devices still complete a handshake and carry data.

#![cfg(test)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::crypto::StaticSecret;
use crate::device::{Device, DropReason, Received, Transmit};

/// A seeded random source, so that the corpus is reproducible.
struct Seeded(fastrand::Rng);

impl rand_core::RngCore for Seeded {
    fn next_u32(&mut self) -> u32 {
        self.0.u32(..)
    }
    fn next_u64(&mut self) -> u64 {
        self.0.u64(..)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        dest.iter_mut().for_each(|b| *b = self.0.u8(..));
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

// Only for tests: its output is predictable by design.
impl rand_core::CryptoRng for Seeded {}

const EPOCH: Duration = Duration::from_secs(1_800_000_000);
const A: &str = "192.0.2.1:51820";
const B: &str = "192.0.2.2:51820";

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|_| SocketAddr::from(([0; 4], 0)))
}

/// a (10.0.0.1, initiator) and b (10.0.0.2), fixed keys, seeded sources.
fn pair(t0: Instant, seed: u64) -> (Device<Seeded>, Device<Seeded>) {
    pair_at(t0, EPOCH, seed)
}

/// As [`pair`], with the wall clock at `t0` given.
fn pair_at(t0: Instant, wall: Duration, seed: u64) -> (Device<Seeded>, Device<Seeded>) {
    let ka = StaticSecret::from_bytes([0x11; 32]);
    let kb = StaticSecret::from_bytes([0x22; 32]);
    let (pa, pb) = (ka.public(), kb.public());
    let mut a = Device::new(ka, t0, wall, Seeded(fastrand::Rng::with_seed(seed)));
    let mut b = Device::new(kb, t0, wall, Seeded(fastrand::Rng::with_seed(seed + 1)));
    let ip = |s: &str| s.parse().unwrap_or(std::net::IpAddr::from([0u8; 4]));
    let _ = a.add_peer(pb, Some([7; 32]), Some(addr(B)), None, &[(ip("10.0.0.2"), 32), (ip("fd00::2"), 128)]);
    let _ = b.add_peer(pa, Some([7; 32]), Some(addr(A)), None, &[(ip("10.0.0.1"), 32), (ip("fd00::1"), 128)]);
    (a, b)
}

/// An IPv4 packet from 10.0.0.1 to 10.0.0.2 with `n` bytes of payload.
fn packet(n: usize) -> Vec<u8> {
    let total = 20 + n;
    let mut p = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
    p.extend((0..n).map(|i| i as u8));
    p
}

fn deliver(to: &mut Device<Seeded>, from: &str, out: Vec<Transmit>, now: Instant) -> Vec<Transmit> {
    let mut replies = Vec::new();
    for t in out {
        let _ = to.receive(&t.datagram, addr(from), now, &mut replies, &mut Vec::new());
    }
    replies
}

/// The seed datagrams, named, from one run of the protocol.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0, 42);
    let mut out = Vec::new();
    let _ = a.send(&packet(30), t0, &mut out);
    let initiation = out.first().map(|t| t.datagram.clone()).unwrap_or_default();
    let replies = deliver(&mut b, A, out, t0);
    let response = replies.first().map(|t| t.datagram.clone()).unwrap_or_default();
    // a takes the response and sends what waited: the first data.
    let data = deliver(&mut a, B, replies, t0);
    let first_data = data.first().map(|t| t.datagram.clone()).unwrap_or_default();
    let _ = deliver(&mut b, A, data, t0);
    let mut out = Vec::new();
    let _ = a.send(&packet(1300), t0, &mut out);
    let large = out.first().map(|t| t.datagram.clone()).unwrap_or_default();
    // A keepalive, from b's timer after it got data and sent nothing.
    let mut ka = Vec::new();
    let _ = b.tick(t0 + Duration::from_secs(11), &mut ka);
    let keepalive = ka.first().map(|t| t.datagram.clone()).unwrap_or_default();
    // Under load, b answers a fresh initiation with a cookie reply.
    b.set_under_load(true);
    let later = t0 + Duration::from_secs(200);
    let mut out = Vec::new();
    let _ = a.send(&packet(10), later, &mut out);
    let mut tick = Vec::new();
    let _ = a.tick(later + Duration::from_secs(6), &mut tick);
    out.extend(tick);
    let cookie = deliver(&mut b, A, out, later).into_iter().find(|t| t.datagram.first() == Some(&3));
    vec![
        ("initiation", initiation),
        ("response", response),
        ("transport-first", first_data),
        ("transport-1300", large),
        ("keepalive", keepalive),
        ("cookie-reply", cookie.map(|t| t.datagram).unwrap_or_default()),
        ("junk", (0..64u8).collect()),
    ]
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz").join("corpus")
}

/// The checked-in corpus is exactly the seeds made here.
/// `GATEHOUSE_WRITE_CORPUS=1 cargo test -p gatehouse-wg corpus` rewrites it.
#[test]
fn the_corpus_holds_the_seed_datagrams() {
    let dir = corpus_dir();
    let write = std::env::var_os("GATEHOUSE_WRITE_CORPUS").is_some();
    for (name, d) in seeds() {
        assert!(!d.is_empty(), "seed {name} was not made");
        let path = dir.join(format!("{name}.bin"));
        if write {
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(&path, &d);
        }
        let stored = std::fs::read(&path).unwrap_or_default();
        assert_eq!(stored, d, "{} differs from its seed (GATEHOUSE_WRITE_CORPUS=1 rewrites it)", path.display());
    }
}

fn corpus() -> Vec<Vec<u8>> {
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir())
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

fn mutate(rng: &mut fastrand::Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[rng.usize(..seeds.len())].clone();
    for _ in 0..rng.usize(0..4) {
        match rng.u8(..8) {
            0 | 1 if !d.is_empty() => {
                let at = rng.usize(..d.len());
                d[at] ^= 1 << rng.u8(..8);
            }
            2 if !d.is_empty() => {
                let at = rng.usize(..d.len());
                d[at] = [0, 1, 2, 3, 4, 5, 0x80, 0xff][rng.usize(..8)];
            }
            3 if d.len() >= 16 => {
                // The receiver index or the counter set to an edge value.
                let at = [4usize, 8][rng.usize(..2)];
                let v: u64 = [0, 1, u64::MAX, u64::MAX - (1 << 13), 1 << 60, 8128, 8192][rng.usize(..7)];
                d[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            4 => d.truncate(rng.usize(..=d.len())),
            5 => d.extend((0..rng.usize(1..48)).map(|_| rng.u8(..))),
            6 => {
                let other = &seeds[rng.usize(..seeds.len())];
                let cut = rng.usize(..=d.len());
                let from = rng.usize(..=other.len());
                d.truncate(cut);
                d.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    d
}

#[test]
fn mutated_datagrams_never_break_a_device() {
    let seeds = corpus();
    assert!(seeds.len() >= 7, "the corpus in {} is missing", corpus_dir().display());
    let mut rng = fastrand::Rng::with_seed(0x5eed_f00d);
    let mut outcomes = std::collections::HashMap::<String, u64>::new();
    let t0 = Instant::now();
    let sources = [A, B, "198.51.100.7:4000", "[2001:db8::9]:51820"];
    for round in 0..200u64 {
        // A fresh pair each round, a session up, then the mutants: to b
        // (responder) and to a (initiator), the clock moving on.
        let (mut a, mut b) = pair(t0, 1000 + round);
        let mut out = Vec::new();
        let _ = a.send(&packet(40), t0, &mut out);
        let back = deliver(&mut b, A, out, t0);
        let _ = deliver(&mut a, B, back, t0);
        // This session's own data joins the seeds: unmutated, it opens.
        let mut live = seeds.clone();
        for n in [0usize, 1, 60, 1400] {
            let mut out = Vec::new();
            let _ = a.send(&packet(n), t0, &mut out);
            live.extend(out.into_iter().map(|t| t.datagram));
        }
        for i in 0..2_500u64 {
            let now = t0 + Duration::from_millis(i * 40);
            let d = mutate(&mut rng, &live);
            let src = addr(sources[rng.usize(..sources.len())]);
            let dev = if rng.bool() { &mut b } else { &mut a };
            let mut replies = Vec::new();
            let mut inner = Vec::new();
            let got = dev.receive(&d, src, now, &mut replies, &mut inner);
            let key = match got {
                Received::Packet { len, .. } => {
                    assert!(len <= inner.len() && len >= 20, "a packet of {len} bytes came out");
                    "packet".to_string()
                }
                Received::Control => "control".to_string(),
                Received::Dropped(r) => r.name().to_string(),
            };
            *outcomes.entry(key).or_default() += 1;
            if i % 500 == 0 {
                let _ = a.tick(now, &mut replies);
                let _ = b.tick(now, &mut replies);
            }
        }
        // Both still work: a handshake from scratch and data both ways.
        let later = t0 + Duration::from_secs(400);
        let mut out = Vec::new();
        let _ = a.tick(later, &mut out);
        let _ = b.tick(later, &mut out);
        // (A newer wall clock: its initiation's timestamp must be newer.)
        let (mut a2, _) = pair_at(later, EPOCH + Duration::from_secs(400), 7_000 + round);
        let mut out = Vec::new();
        let _ = a2.send(&packet(20), later, &mut out);
        let back = deliver(&mut b, A, out, later);
        assert_eq!(back.len(), 1, "round {round}: b no longer answers an initiation");
        let mut got = Vec::new();
        let data = deliver(&mut a2, A, back, later);
        for t in data {
            got.push(b.receive(&t.datagram, addr(A), later, &mut Vec::new(), &mut Vec::new()));
        }
        assert!(matches!(got.first(), Some(Received::Packet { .. })), "round {round}: {got:?}");
    }
    eprintln!("wg fuzz outcomes: {outcomes:?}");
    for want in ["short", "unknown_type", "bad_length", "bad_mac1", "unknown_index", "replay", "decrypt"] {
        assert!(outcomes.get(want).copied().unwrap_or(0) > 0, "no {want} among {outcomes:?}");
    }
    assert!(outcomes.get("packet").copied().unwrap_or(0) > 0, "nothing got through: {outcomes:?}");
    for name in outcomes.keys().filter(|k| *k != "packet" && *k != "control") {
        assert!(DropReason::NAMES.contains(&name.as_str()), "{name} is not a counted reason");
    }
}
