//! Session synchronisation between the two balancers of an active/standby
//! pair, I/O-free: the records, the datagram format, its authentication and
//! the receiver's replay checks.
//!
//! A datagram is a header, up to [`MAX_RECORDS`] session records and a
//! 16-byte MAC (keyed BLAKE2s over everything before it, with the pair's
//! shared key):
//!
//! ```text
//!  0   4  magic "GHSY"
//!  4   1  version (1)
//!  5   1  kind: 1 sessions, 2 hello (the sender (re)joined: send it all)
//!  6   1  sender's node id (1-255)
//!  7   1  record count
//!  8   8  sender's epoch (its start time, ns since 1970: grows at a restart)
//! 16   8  sequence number within the epoch, from 1
//! 24  80  × count: records
//!  …  16  MAC
//! ```
//!
//! A record names everything by address, not by table index, so the two
//! nodes need not number their services alike:
//!
//! ```text
//!  0  1  protocol (6 TCP, 17 UDP)      1  1  state (session::State)
//!  2  2  flags (bit 0: FNAT local address present)
//!  4  4  seconds left before it expires
//!  8 16  client address (IPv4 as ::ffff:a.b.c.d)   24 2  client port
//! 26 16  VIP                                        42 2  VIP port
//! 44 16  real server                                60 2  real server port
//! 62 16  FNAT local address                         78 2  local port
//! ```
//!
//! The receiver refuses, and counts, datagrams that are malformed, fail the
//! MAC, come from its own node id, come from an older epoch of the sender,
//! or repeat a sequence number (a 64-wide window, RFC 6479-style, allows
//! for reordering).

use std::net::{IpAddr, Ipv6Addr};

use blake2::digest::{FixedOutput, KeyInit, Update, consts::U16};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::session::State;

pub const MAGIC: [u8; 4] = *b"GHSY";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 24;
pub const RECORD_LEN: usize = 80;
pub const MAC_LEN: usize = 16;
/// Records per datagram: 1,400 bytes of UDP payload at most.
pub const MAX_RECORDS: usize = 17;
pub const MAX_DATAGRAM: usize = HEADER_LEN + MAX_RECORDS * RECORD_LEN + MAC_LEN;

/// What a datagram carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sessions = 1,
    /// The sender started (or became a standby) and wants every session.
    Hello = 2,
}

/// A session as the pair exchanges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    pub proto: u8,
    pub state: State,
    /// Seconds before it expires, as the sender counts.
    pub ttl: u32,
    pub client: IpAddr,
    pub client_port: u16,
    pub vip: IpAddr,
    pub vip_port: u16,
    pub real: IpAddr,
    pub real_port: u16,
    /// FNAT: the local address and port the session goes out from.
    pub local: Option<(IpAddr, u16)>,
}

impl Record {
    /// What identifies the session on either node.
    pub fn key(&self) -> (u8, IpAddr, u16, IpAddr, u16) {
        (self.proto, self.client, self.client_port, self.vip, self.vip_port)
    }
}

fn put_addr(out: &mut [u8], a: IpAddr) {
    let v6 = match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    };
    out[..16].copy_from_slice(&v6.octets());
}

fn get_addr(b: &[u8]) -> IpAddr {
    let mut o = [0u8; 16];
    o.copy_from_slice(&b[..16]);
    let v6 = Ipv6Addr::from(o);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

fn state_of(b: u8) -> Option<State> {
    Some(match b {
        0 => State::SynSent,
        1 => State::Established,
        2 => State::Closing,
        3 => State::Datagram,
        _ => return None,
    })
}

impl Record {
    pub fn write(&self, out: &mut [u8; RECORD_LEN]) {
        *out = [0; RECORD_LEN];
        out[0] = self.proto;
        out[1] = self.state as u8;
        out[2..4].copy_from_slice(&u16::from(self.local.is_some()).to_be_bytes());
        out[4..8].copy_from_slice(&self.ttl.to_be_bytes());
        put_addr(&mut out[8..24], self.client);
        out[24..26].copy_from_slice(&self.client_port.to_be_bytes());
        put_addr(&mut out[26..42], self.vip);
        out[42..44].copy_from_slice(&self.vip_port.to_be_bytes());
        put_addr(&mut out[44..60], self.real);
        out[60..62].copy_from_slice(&self.real_port.to_be_bytes());
        if let Some((a, p)) = self.local {
            put_addr(&mut out[62..78], a);
            out[78..80].copy_from_slice(&p.to_be_bytes());
        }
    }

    pub fn read(b: &[u8; RECORD_LEN]) -> Result<Record, Malformed> {
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let proto = b[0];
        if proto != 6 && proto != 17 {
            return Err(Malformed::Record);
        }
        let state = state_of(b[1]).ok_or(Malformed::Record)?;
        let flags = u16_at(2);
        if flags > 1 {
            return Err(Malformed::Record);
        }
        let r = Record {
            proto,
            state,
            ttl: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            client: get_addr(&b[8..24]),
            client_port: u16_at(24),
            vip: get_addr(&b[26..42]),
            vip_port: u16_at(42),
            real: get_addr(&b[44..60]),
            real_port: u16_at(60),
            local: (flags & 1 != 0).then(|| (get_addr(&b[62..78]), u16_at(78))),
        };
        // One family per session (the pipeline does not translate).
        let v4 = r.client.is_ipv4();
        if r.vip.is_ipv4() != v4 || r.local.is_some_and(|(a, _)| a.is_ipv4() != r.real.is_ipv4()) {
            return Err(Malformed::Record);
        }
        Ok(r)
    }
}

/// Why a datagram was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Too short, too long, or a length that is no whole number of records.
    Length,
    Magic,
    Version,
    Kind,
    Record,
}

/// Every refusal reason, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    Malformed(Malformed),
    /// The MAC does not match: wrong key, or forged or damaged.
    Mac,
    /// From this node's own id (a loop, or a misconfigured peer).
    OwnId,
    /// From an epoch of the sender older than one already seen.
    OldEpoch,
    /// A sequence number already seen, or too far behind.
    Replay,
}

impl Refused {
    pub const NAMES: [&'static str; 5] = ["malformed", "bad_mac", "own_node_id", "old_epoch", "replayed"];

    pub fn index(self) -> usize {
        match self {
            Refused::Malformed(_) => 0,
            Refused::Mac => 1,
            Refused::OwnId => 2,
            Refused::OldEpoch => 3,
            Refused::Replay => 4,
        }
    }
}

/// The pair's shared key; zeroed on drop, never printed.
#[derive(Clone)]
pub struct Key(Zeroizing<[u8; 32]>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(secret)")
    }
}

impl Key {
    pub fn new(k: &[u8; 32]) -> Key {
        Key(Zeroizing::new(*k))
    }

    /// The MAC of `data` (what a datagram ends with).
    pub fn mac(&self, data: &[u8]) -> [u8; MAC_LEN] {
        let mut m = blake2::Blake2sMac::<U16>::new_from_slice(&self.0[..]).expect("a 32-byte key fits BLAKE2s");
        m.update(data);
        m.finalize_fixed().into()
    }
}

/// The sending side: numbers and seals datagrams.
pub struct Sender {
    key: Key,
    pub node: u8,
    pub epoch: u64,
    seq: u64,
}

impl Sender {
    pub fn new(key: Key, node: u8, epoch: u64) -> Sender {
        Sender { key, node, epoch, seq: 0 }
    }

    /// A datagram of `kind` with `records` (at most [`MAX_RECORDS`]) into
    /// `out`; returns its length.
    pub fn seal(&mut self, kind: Kind, records: &[Record], out: &mut Vec<u8>) -> usize {
        let records = &records[..records.len().min(MAX_RECORDS)];
        self.seq += 1;
        out.clear();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, kind as u8, self.node, records.len() as u8]);
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        let mut rec = [0u8; RECORD_LEN];
        for r in records {
            r.write(&mut rec);
            out.extend_from_slice(&rec);
        }
        let mac = self.key.mac(out);
        out.extend_from_slice(&mac);
        out.len()
    }
}

/// What a datagram that passed every check says.
#[derive(Debug, PartialEq, Eq)]
pub struct Message {
    pub kind: Kind,
    pub node: u8,
    pub epoch: u64,
    /// The sender's epoch is newer than the last one seen (it restarted),
    /// or it is the first heard from it.
    pub new_epoch: bool,
    pub records: Vec<Record>,
}

/// The receiving side: checks datagrams and remembers, per sender, its
/// epoch and the sequence numbers seen.
pub struct Receiver {
    key: Key,
    own: u8,
    /// By sender id: (epoch, highest sequence number, bitmap of the 64
    /// below it and it).
    peers: std::collections::HashMap<u8, (u64, u64, u64)>,
}

const WINDOW: u64 = 64;

impl Receiver {
    pub fn new(key: Key, own: u8) -> Receiver {
        Receiver { key, own, peers: std::collections::HashMap::new() }
    }

    /// Checks and parses one datagram. The replay state changes only for a
    /// datagram that passed the MAC, so forged ones cannot burn sequence
    /// numbers.
    pub fn open(&mut self, d: &[u8]) -> Result<Message, Refused> {
        let bad = |m| Err(Refused::Malformed(m));
        if d.len() < HEADER_LEN + MAC_LEN || d.len() > MAX_DATAGRAM {
            return bad(Malformed::Length);
        }
        if d[..4] != MAGIC {
            return bad(Malformed::Magic);
        }
        if d[4] != VERSION {
            return bad(Malformed::Version);
        }
        let (body, mac) = d.split_at(d.len() - MAC_LEN);
        if !bool::from(self.key.mac(body).ct_eq(mac)) {
            return Err(Refused::Mac);
        }
        let kind = match d[5] {
            1 => Kind::Sessions,
            2 => Kind::Hello,
            _ => return bad(Malformed::Kind),
        };
        let (node, count) = (d[6], usize::from(d[7]));
        if body.len() != HEADER_LEN + count * RECORD_LEN || count > MAX_RECORDS {
            return bad(Malformed::Length);
        }
        if node == self.own {
            return Err(Refused::OwnId);
        }
        let word = |i: usize| u64::from_be_bytes(d[i..i + 8].try_into().unwrap_or_default());
        let (epoch, seq) = (word(8), word(16));
        let mut records = Vec::with_capacity(count);
        for chunk in body[HEADER_LEN..].chunks_exact(RECORD_LEN) {
            let rec: &[u8; RECORD_LEN] = chunk.try_into().map_err(|_| Refused::Malformed(Malformed::Length))?;
            records.push(Record::read(rec).map_err(Refused::Malformed)?);
        }
        let new_epoch = self.accept(node, epoch, seq)?;
        Ok(Message { kind, node, epoch, new_epoch, records })
    }

    /// The replay checks; records the sequence number when it passes.
    fn accept(&mut self, node: u8, epoch: u64, seq: u64) -> Result<bool, Refused> {
        if seq == 0 {
            return Err(Refused::Replay);
        }
        let entry = self.peers.get(&node).copied();
        let (mut top, mut seen, new_epoch) = match entry {
            Some((e, _, _)) if epoch < e => return Err(Refused::OldEpoch),
            Some((e, top, seen)) if epoch == e => (top, seen, false),
            _ => (0, 0, true),
        };
        if seq > top {
            let shift = seq - top;
            seen = if shift >= WINDOW { 0 } else { seen << shift };
            seen |= 1;
            top = seq;
        } else {
            let back = top - seq;
            if back >= WINDOW || seen & (1 << back) != 0 {
                return Err(Refused::Replay);
            }
            seen |= 1 << back;
        }
        self.peers.insert(node, (epoch, top, seen));
        Ok(new_epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn rec(i: u16) -> Record {
        Record {
            proto: 6,
            state: State::Established,
            ttl: 900,
            client: IpAddr::V4(Ipv4Addr::new(10, 78, 0, 10)),
            client_port: 40000 + i,
            vip: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 102)),
            vip_port: 80,
            real: IpAddr::V4(Ipv4Addr::new(10, 77, 0, 11)),
            real_port: 80,
            local: Some((IpAddr::V4(Ipv4Addr::new(10, 77, 0, 3)), 1024 + i)),
        }
    }

    fn pair() -> (Sender, Receiver) {
        let k = Key::new(&[7; 32]);
        (Sender::new(k.clone(), 1, 1000), Receiver::new(k, 2))
    }

    #[test]
    fn records_round_trip_both_families() {
        let mut v6 = rec(1);
        v6.client = "2001:db8::10".parse().expect("test");
        v6.vip = "2001:db8::100".parse().expect("test");
        v6.real = "2001:db8::11".parse().expect("test");
        v6.local = None;
        v6.proto = 17;
        v6.state = State::Datagram;
        for r in [rec(5), v6] {
            let mut b = [0u8; RECORD_LEN];
            r.write(&mut b);
            assert_eq!(Record::read(&b), Ok(r));
        }
    }

    #[test]
    fn a_datagram_opens_once() {
        let (mut s, mut r) = pair();
        let recs: Vec<Record> = (0..MAX_RECORDS as u16 + 3).map(rec).collect();
        let mut d = Vec::new();
        let n = s.seal(Kind::Sessions, &recs, &mut d);
        assert_eq!(n, MAX_DATAGRAM);
        let m = r.open(&d).expect("test");
        assert_eq!((m.kind, m.node, m.epoch, m.new_epoch), (Kind::Sessions, 1, 1000, true));
        assert_eq!(m.records, recs[..MAX_RECORDS]);
        // The same datagram again is a replay.
        assert_eq!(r.open(&d), Err(Refused::Replay));
    }

    #[test]
    fn forged_damaged_and_foreign_datagrams_are_refused() {
        let (mut s, mut r) = pair();
        let mut d = Vec::new();
        s.seal(Kind::Sessions, &[rec(1)], &mut d);
        // Every single-bit flip anywhere fails (the MAC covers it all, and
        // flips in the MAC itself fail the comparison).
        for i in 0..d.len() * 8 {
            let mut x = d.clone();
            x[i / 8] ^= 1 << (i % 8);
            assert!(r.open(&x).is_err(), "bit {i}");
        }
        // Flips did not burn the sequence number.
        assert!(r.open(&d).is_ok());
        // Another key.
        let mut other = Sender::new(Key::new(&[8; 32]), 1, 1000);
        other.seal(Kind::Sessions, &[rec(1)], &mut d);
        assert_eq!(r.open(&d), Err(Refused::Mac));
        // Our own id.
        let mut me = Sender::new(Key::new(&[7; 32]), 2, 1000);
        me.seal(Kind::Hello, &[], &mut d);
        assert_eq!(r.open(&d), Err(Refused::OwnId));
        // Truncated and padded.
        s.seal(Kind::Sessions, &[rec(2)], &mut d);
        assert_eq!(r.open(&d[..d.len() - 1]), Err(Refused::Mac));
        assert_eq!(r.open(&d[..10]), Err(Refused::Malformed(Malformed::Length)));
    }

    #[test]
    fn a_malformed_record_under_a_valid_mac_is_refused() {
        let (mut s, mut r) = pair();
        let mut d = Vec::new();
        s.seal(Kind::Sessions, &[rec(1)], &mut d);
        // Protocol 1 (ICMP) is no session protocol: resealed with the key.
        d[HEADER_LEN] = 1;
        let body = d.len() - MAC_LEN;
        let mac = Key::new(&[7; 32]).mac(&d[..body]);
        d[body..].copy_from_slice(&mac);
        assert_eq!(r.open(&d), Err(Refused::Malformed(Malformed::Record)));
    }

    #[test]
    fn epochs_and_the_window() {
        let (mut s, mut r) = pair();
        let mut ds = Vec::new();
        for _ in 0..100 {
            let mut d = Vec::new();
            s.seal(Kind::Sessions, &[], &mut d);
            ds.push(d);
        }
        // Out of order within the window: accepted once each.
        assert!(r.open(&ds[50]).expect("test").new_epoch);
        for i in (0..50).rev().take(63) {
            assert!(r.open(&ds[i]).is_ok(), "{i}");
        }
        // More than 63 behind: too old.
        assert_eq!(r.open(&ds[0]), Err(Refused::Replay));
        for d in &ds[51..] {
            assert!(!r.open(d).expect("test").new_epoch);
        }
        // A restart: a new, later epoch starts over, and the old epoch's
        // datagrams are refused from then on.
        let mut s2 = Sender::new(Key::new(&[7; 32]), 1, 2000);
        let mut d = Vec::new();
        s2.seal(Kind::Hello, &[], &mut d);
        assert!(r.open(&d).expect("test").new_epoch);
        let mut late = Vec::new();
        s.seal(Kind::Sessions, &[], &mut late);
        assert_eq!(r.open(&late), Err(Refused::OldEpoch));
    }

    #[test]
    fn random_datagrams_never_pass() {
        let (_, mut r) = pair();
        let mut rng = fastrand::Rng::with_seed(5);
        for _ in 0..20_000 {
            let n = rng.usize(0..MAX_DATAGRAM + 8);
            let mut d: Vec<u8> = (0..n).map(|_| rng.u8(..)).collect();
            if rng.bool() && d.len() >= 5 {
                d[..4].copy_from_slice(&MAGIC);
                d[4] = VERSION;
            }
            assert!(r.open(&d).is_err());
        }
    }
}
