//! Two WireGuard devices with fixed keys and seeded random sources, so
//! that a run is the same every time: what the WireGuard targets and the
//! corpus's seeds are made from.
//!
//! A handshake is a few X25519 multiplications, which would be most of a
//! run: the prepared states (a pair with a session up, an initiation made)
//! are made once per thread from the fixed clock [`start`] and cloned for
//! each run (`gatehouse-wg`'s `fuzzing` feature), which is the same as
//! making them again since everything in them is seeded.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use gatehouse_wg::crypto::{StaticSecret, hash, mac};
use gatehouse_wg::device::{Device, Transmit};
use gatehouse_wg::messages::{INITIATION, RESPONSE, initiation, response};

/// A seeded random source: its output is predictable by design, so it is
/// only for fuzzing and tests.
#[derive(Clone)]
pub struct Seeded(pub fastrand::Rng);

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

impl rand_core::CryptoRng for Seeded {}

pub type Dev = Device<Seeded>;

/// The monotonic clock's reading every run starts from, so that a state
/// prepared once fits every run.
pub fn start() -> Instant {
    static START: LazyLock<Instant> = LazyLock::new(Instant::now);
    *START
}

/// `make()` the first time a thread asks for `key`, a clone of it after.
pub fn cached<V: Clone>(
    cache: &'static std::thread::LocalKey<RefCell<HashMap<u64, V>>>,
    key: u64,
    make: impl FnOnce() -> V,
) -> V {
    if let Some(v) = cache.with(|c| c.borrow().get(&key).cloned()) {
        return v;
    }
    let v = make();
    cache.with(|c| c.borrow_mut().insert(key, v.clone()));
    v
}

pub const EPOCH: Duration = Duration::from_secs(1_800_000_000);
pub const A: &str = "192.0.2.1:51820";
pub const B: &str = "192.0.2.2:51820";
const KEY_A: [u8; 32] = [0x11; 32];
const KEY_B: [u8; 32] = [0x22; 32];

pub fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap_or_else(|_| SocketAddr::from(([0; 4], 0)))
}

/// a (10.0.0.1, the initiator) and b (10.0.0.2), the wall clock at `wall`.
pub fn pair_at(t0: Instant, wall: Duration, seed: u64) -> (Dev, Dev) {
    let ka = StaticSecret::from_bytes(KEY_A);
    let kb = StaticSecret::from_bytes(KEY_B);
    let (pa, pb) = (ka.public(), kb.public());
    let mut a = Device::new(ka, t0, wall, Seeded(fastrand::Rng::with_seed(seed)));
    let mut b = Device::new(kb, t0, wall, Seeded(fastrand::Rng::with_seed(seed + 1)));
    let ip = |s: &str| s.parse().unwrap_or(std::net::IpAddr::from([0u8; 4]));
    let _ = a.add_peer(pb, Some([7; 32]), Some(addr(B)), None, &[(ip("10.0.0.2"), 32), (ip("fd00::2"), 128)]);
    let _ = b.add_peer(pa, Some([7; 32]), Some(addr(A)), None, &[(ip("10.0.0.1"), 32), (ip("fd00::1"), 128)]);
    (a, b)
}

pub fn pair(t0: Instant, seed: u64) -> (Dev, Dev) {
    pair_at(t0, EPOCH, seed)
}

/// An IPv4 packet from 10.0.0.1 to 10.0.0.2 with `n` bytes of payload.
pub fn packet(n: usize) -> Vec<u8> {
    let total = 20 + n;
    let mut p = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
    p.extend((0..n).map(|i| i as u8));
    p
}

/// Delivers datagrams to `to`; returns what it sent back.
pub fn deliver(to: &mut Dev, from: &str, out: Vec<Transmit>, now: Instant) -> Vec<Transmit> {
    let mut replies = Vec::new();
    for t in out {
        let _ = to.receive(&t.datagram, addr(from), now, &mut replies, &mut Vec::new());
    }
    replies
}

/// A pair with a session up at [`start`] (a initiated, data went both
/// ways).
pub fn established(seed: u64) -> (Dev, Dev) {
    thread_local!(static CACHE: RefCell<HashMap<u64, (Dev, Dev)>> = RefCell::new(HashMap::new()));
    cached(&CACHE, seed, || {
        let t0 = start();
        let (mut a, mut b) = pair(t0, seed);
        let mut out = Vec::new();
        let _ = a.send(&packet(40), t0, &mut out);
        let back = deliver(&mut b, A, out, t0);
        let _ = deliver(&mut a, B, back, t0);
        (a, b)
    })
}

/// The datagram with mac1 made right for a handshake message to the
/// device with secret key `to` (`KEY_A` or `KEY_B`), so that a fuzzer
/// gets past it to what lies behind; other datagrams as they are.
pub fn with_mac1(d: &[u8], to_b: bool) -> Vec<u8> {
    let mut d = d.to_vec();
    let public = StaticSecret::from_bytes(if to_b { KEY_B } else { KEY_A }).public();
    let at = match (d.first(), d.len()) {
        (Some(&INITIATION), initiation::LEN) => initiation::MAC1,
        (Some(&RESPONSE), response::LEN) => response::MAC1,
        _ => return d,
    };
    let m = mac(&hash(&[b"mac1----", &public]), &[&d[..at]]);
    d[at..at + 16].copy_from_slice(&m);
    d
}

/// b still works: a fresh initiator 400 s after [`start`], with a newer
/// clock, completes a handshake with b and its data opens.
pub fn still_works(b: &mut Dev, seed: u64) {
    thread_local!(static CACHE: RefCell<HashMap<u64, (Dev, Vec<Transmit>)>> = RefCell::new(HashMap::new()));
    let later = start() + Duration::from_secs(400);
    let (mut a2, out) = cached(&CACHE, seed, || {
        let (mut a2, _) = pair_at(later, EPOCH + Duration::from_secs(400), seed);
        let mut out = Vec::new();
        let _ = a2.send(&packet(20), later, &mut out);
        (a2, out)
    });
    let back = deliver(b, A, out, later);
    assert_eq!(back.len(), 1, "b no longer answers an initiation");
    let data = deliver(&mut a2, B, back, later);
    let got: Vec<_> =
        data.iter().map(|t| b.receive(&t.datagram, addr(A), later, &mut Vec::new(), &mut Vec::new())).collect();
    assert!(
        matches!(got.first(), Some(gatehouse_wg::device::Received::Packet { .. })),
        "b no longer takes data: {got:?}"
    );
}
