//! A WireGuard interface without I/O: peers, the index of sessions, the
//! handshake and transport rules, and the protocol's timers (whitepaper
//! section 6). The caller gives it packets from the tunnel, datagrams from
//! the network with their source, and the time; it gives back datagrams to
//! send and packets for the tunnel.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use gatehouse_wire::ip;

use crate::allowed_ips::{AllowedIps, BadPrefix};
use crate::cookie::{CookieChecker, CookieError, CookieJar};
use crate::crypto::{KEY_LEN, StaticSecret};
use crate::handshake::{self, HandshakeError, Identity, Initiated, PeerKey, TIMESTAMP_LEN};
use crate::messages::{self, Malformed, Message, initiation, response};
use crate::ratelimit::HandshakeLimiter;
use crate::transport::{Keypair, REKEY_AFTER_MESSAGES, TransportError};

pub const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
pub const REJECT_AFTER_TIME: Duration = Duration::from_secs(180);
pub const REKEY_ATTEMPT_TIME: Duration = Duration::from_secs(90);
pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Initiations from one peer closer together than this are dropped.
pub const INITIATION_MIN_INTERVAL: Duration = Duration::from_millis(20);
/// Packets kept per peer while its handshake runs.
pub const QUEUE_LEN: usize = 256;

/// A peer's number in its device.
pub type PeerId = usize;

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub to: SocketAddr,
    pub datagram: Vec<u8>,
}

/// Why a datagram or a packet was dropped (each is counted by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    Malformed(Malformed),
    /// A handshake message that did not open or whose mac1 is wrong.
    Handshake(HandshakeError),
    /// A cookie reply we did not ask for, or that did not open.
    Cookie(CookieError),
    /// An initiation from a key that is no peer of ours.
    UnknownPeer,
    /// An initiation whose timestamp is not newer than the last one.
    ReplayedInitiation,
    /// Initiations from one peer too close together.
    Flood,
    /// Under load, a source sending handshakes faster than its share.
    RateLimited,
    /// A message for an index we do not have (or no longer have).
    UnknownIndex,
    Transport(TransportError),
    /// A session past its time.
    Expired,
    /// A decrypted packet whose source is not the peer's (allowed IPs).
    NotAllowedSource,
    /// A decrypted packet that is not IPv4 or IPv6.
    NotIp,
    /// A packet to send whose destination no peer has.
    NoRoute,
    /// A peer with no endpoint to send to.
    NoEndpoint,
    /// A packet waiting for a handshake that did not come in time.
    HandshakeTimeout,
}

impl DropReason {
    /// Every reason's label, in [`DropReason::index`] order: the slots of
    /// counters kept per reason.
    pub const NAMES: [&'static str; 24] = [
        "short",
        "unknown_type",
        "reserved_bytes",
        "bad_length",
        "bad_mac1",
        "handshake_decrypt",
        "weak_key",
        "unknown_receiver",
        "cookie_unexpected",
        "cookie_decrypt",
        "unknown_peer",
        "replayed_initiation",
        "initiation_flood",
        "rate_limited",
        "unknown_index",
        "decrypt",
        "replay",
        "keys_exhausted",
        "expired",
        "not_allowed_source",
        "not_ip",
        "no_route",
        "no_endpoint",
        "handshake_timeout",
    ];

    /// The reason's slot in [`DropReason::NAMES`]: a counter array index,
    /// with no look-up by name on the drop path.
    pub fn index(self) -> usize {
        match self {
            DropReason::Malformed(Malformed::Short) => 0,
            DropReason::Malformed(Malformed::UnknownType) => 1,
            DropReason::Malformed(Malformed::Reserved) => 2,
            DropReason::Malformed(Malformed::BadLength) => 3,
            DropReason::Handshake(HandshakeError::Mac1) => 4,
            DropReason::Handshake(HandshakeError::Decrypt) => 5,
            DropReason::Handshake(HandshakeError::WeakKey) => 6,
            DropReason::Handshake(HandshakeError::UnknownReceiver) => 7,
            DropReason::Cookie(CookieError::Unexpected) => 8,
            DropReason::Cookie(CookieError::Decrypt) => 9,
            DropReason::UnknownPeer => 10,
            DropReason::ReplayedInitiation => 11,
            DropReason::Flood => 12,
            DropReason::RateLimited => 13,
            DropReason::UnknownIndex => 14,
            DropReason::Transport(TransportError::Decrypt) => 15,
            DropReason::Transport(TransportError::Replay) => 16,
            DropReason::Transport(TransportError::Exhausted) => 17,
            DropReason::Expired => 18,
            DropReason::NotAllowedSource => 19,
            DropReason::NotIp => 20,
            DropReason::NoRoute => 21,
            DropReason::NoEndpoint => 22,
            DropReason::HandshakeTimeout => 23,
        }
    }

    /// The label for metrics.
    pub fn name(self) -> &'static str {
        Self::NAMES[self.index()]
    }

    /// The reason's slot in [`PeerStats::drops`], for the reasons a peer
    /// is known for.
    pub fn peer_index(self) -> Option<usize> {
        match self {
            DropReason::Transport(TransportError::Replay) => Some(0),
            DropReason::Transport(TransportError::Decrypt) => Some(1),
            DropReason::Expired => Some(2),
            DropReason::NotAllowedSource => Some(3),
            DropReason::NotIp => Some(4),
            DropReason::ReplayedInitiation => Some(5),
            DropReason::Flood => Some(6),
            DropReason::Handshake(HandshakeError::Decrypt) => Some(7),
            DropReason::HandshakeTimeout => Some(8),
            DropReason::Transport(TransportError::Exhausted) => Some(9),
            _ => None,
        }
    }
}

/// What a received datagram came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// A packet for the tunnel from this peer: the first `len` bytes of
    /// the opened data (the rest is padding).
    Packet {
        peer: PeerId,
        len: usize,
    },
    /// A handshake, cookie or keepalive: handled (replies, if any, queued).
    Control,
    Dropped(DropReason),
}

/// A packet the caller seals (in a batch with others): the datagram is
/// `header`, the packet padded to [`crate::transport::padded_len`], and
/// the tag of ChaCha20-Poly1305 under `key` with `counter` over the padded
/// packet.
pub struct SealPlan {
    pub peer: PeerId,
    pub to: SocketAddr,
    pub header: [u8; crate::messages::transport::DATA],
    pub key: crate::crypto::Key,
    pub counter: u64,
}

/// A transport message the caller opens (in a batch with others), then
/// hands back to [`Device::finish_open`].
pub struct OpenPlan {
    pub peer: PeerId,
    /// The local index it came to.
    pub local: u32,
    pub key: crate::crypto::Key,
    pub counter: u64,
}

/// What the first look at a received datagram came to.
pub enum Inbound {
    /// Transport data: to be opened by the caller.
    Open(OpenPlan),
    /// Everything else: handled, or dropped.
    Done(Received),
}

struct Timed {
    keys: Keypair,
    born: Instant,
}

struct Peer {
    key: PeerKey,
    endpoint: Option<SocketAddr>,
    persistent_keepalive: Option<Duration>,
    /// A handshake we started: its state, when it was first and last sent.
    initiated: Option<(Initiated, Instant, Instant)>,
    last_timestamp: Option<[u8; TIMESTAMP_LEN]>,
    last_initiation: Option<Instant>,
    previous: Option<Timed>,
    current: Option<Timed>,
    /// A responder's keys, until the initiator's first data confirms them.
    next: Option<Timed>,
    cookies: CookieJar,
    queue: VecDeque<Vec<u8>>,
    last_sent: Option<Instant>,
    /// Data sent and nothing heard since: a new handshake is due then.
    new_handshake_at: Option<Instant>,
    /// Data received and nothing sent since: a keepalive is due then.
    keepalive_at: Option<Instant>,
    last_handshake: Option<Instant>,
    stats: PeerStats,
}

/// A peer's traffic, as `wg show` and the metrics report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Transport datagrams sent and their bytes (headers included).
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Transport datagrams received that opened, and their bytes.
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Handshakes completed (either side starting).
    pub handshakes: u64,
    /// Initiations sent (first tries and retries).
    pub initiations: u64,
    /// Handshake attempts given up after [`REKEY_ATTEMPT_TIME`].
    pub handshake_failures: u64,
    /// What was dropped of this peer's, by [`PEER_DROP_NAMES`].
    pub drops: [u64; PEER_DROP_NAMES.len()],
}

/// The drop reasons a peer is known for, as counted in [`PeerStats::drops`].
pub const PEER_DROP_NAMES: [&str; 10] = [
    "replay",
    "decrypt",
    "expired",
    "not_allowed_source",
    "not_ip",
    "replayed_initiation",
    "initiation_flood",
    "handshake_decrypt",
    "handshake_timeout",
    "keys_exhausted",
];

/// What the device knows of a peer, for `wg show` and `/status`.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub public: [u8; KEY_LEN],
    pub psk: Option<[u8; KEY_LEN]>,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<(IpAddr, u8)>,
    /// Since the Unix epoch, when the last handshake completed.
    pub last_handshake: Option<Duration>,
    pub stats: PeerStats,
}

/// A slot a local index points to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Handshake,
    Keys,
}

/// A WireGuard interface.
pub struct Device<R: rand_core::CryptoRngCore> {
    me: Identity,
    peers: Vec<Option<Peer>>,
    by_key: HashMap<[u8; KEY_LEN], PeerId>,
    allowed: AllowedIps<PeerId>,
    indexes: HashMap<u32, (PeerId, Slot)>,
    checker: CookieChecker,
    limiter: HandshakeLimiter,
    /// Load as the caller sees it (its queues), on top of the rate.
    under_load: bool,
    /// A monotonic instant and the wall-clock time then, for timestamps.
    clock: (Instant, Duration),
    rng: R,
}

impl<R: rand_core::CryptoRngCore> Device<R> {
    /// `wall` is the time since the Unix epoch at `now`: handshake
    /// timestamps count from it with the monotonic `now` the caller gives.
    pub fn new(secret: StaticSecret, now: Instant, wall: Duration, mut rng: R) -> Self {
        let me = Identity::new(secret);
        let checker = CookieChecker::new(&me, now, &mut rng);
        Device {
            me,
            peers: Vec::new(),
            by_key: HashMap::new(),
            allowed: AllowedIps::default(),
            indexes: HashMap::new(),
            checker,
            limiter: HandshakeLimiter::new(now),
            under_load: false,
            clock: (now, wall),
            rng,
        }
    }

    /// The time since the Unix epoch at `now`.
    fn wall(&self, now: Instant) -> Duration {
        self.clock.1 + now.saturating_duration_since(self.clock.0)
    }

    pub fn public(&self) -> &[u8; KEY_LEN] {
        self.me.public()
    }

    /// Whether handshake messages must carry a valid mac2 whatever their
    /// rate (the caller's queues are backing up). Above
    /// [`crate::ratelimit::UNDER_LOAD_PER_SECOND`] handshake messages a
    /// second the device is under load by itself.
    pub fn set_under_load(&mut self, on: bool) {
        self.under_load = on;
    }

    pub fn add_peer(
        &mut self,
        public: [u8; KEY_LEN],
        psk: Option<[u8; KEY_LEN]>,
        endpoint: Option<SocketAddr>,
        persistent_keepalive: Option<u16>,
        allowed: &[(IpAddr, u8)],
    ) -> Result<PeerId, BadPrefix> {
        let id = self.peers.iter().position(Option::is_none).unwrap_or(self.peers.len());
        for (net, len) in allowed {
            self.allowed.insert(*net, *len, id)?;
        }
        let peer = Peer {
            key: PeerKey::new(public, psk),
            endpoint,
            persistent_keepalive: persistent_keepalive.filter(|s| *s > 0).map(|s| Duration::from_secs(u64::from(s))),
            initiated: None,
            last_timestamp: None,
            last_initiation: None,
            previous: None,
            current: None,
            next: None,
            cookies: CookieJar::default(),
            queue: VecDeque::new(),
            last_sent: None,
            new_handshake_at: None,
            keepalive_at: None,
            last_handshake: None,
            stats: PeerStats::default(),
        };
        if id == self.peers.len() {
            self.peers.push(Some(peer));
        } else {
            self.peers[id] = Some(peer);
        }
        self.by_key.insert(public, id);
        Ok(id)
    }

    pub fn remove_peer(&mut self, id: PeerId) {
        if let Some(Some(p)) = self.peers.get_mut(id).map(Option::take) {
            self.by_key.remove(p.key.public());
        }
        self.allowed.remove_peer(id);
        self.indexes.retain(|_, (p, _)| *p != id);
    }

    pub fn peer_by_key(&self, public: &[u8; KEY_LEN]) -> Option<PeerId> {
        self.by_key.get(public).copied()
    }

    /// Every peer's id.
    pub fn peer_ids(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.peers.iter().enumerate().filter(|(_, p)| p.is_some()).map(|(i, _)| i)
    }

    pub fn peer_info(&self, id: PeerId) -> Option<PeerInfo> {
        let p = self.peers.get(id)?.as_ref()?;
        Some(PeerInfo {
            public: *p.key.public(),
            psk: p.key.psk().copied(),
            endpoint: p.endpoint,
            persistent_keepalive: p.persistent_keepalive.map_or(0, |d| d.as_secs() as u16),
            allowed_ips: self.allowed.of(id),
            last_handshake: p.last_handshake.map(|t| self.wall(t)),
            stats: p.stats,
        })
    }

    /// Counts a drop against the peer it came from or was for, when the
    /// reason is one a peer is known for ([`PEER_DROP_NAMES`]).
    pub fn note_drop(&mut self, id: PeerId, reason: DropReason) {
        let Some(at) = reason.peer_index() else { return };
        if let Some(p) = self.peers.get_mut(id).and_then(Option::as_mut) {
            p.stats.drops[at] += 1;
        }
    }

    /// Sets where the peer is reached (a configured or resolved endpoint;
    /// authenticated packets from elsewhere move it again).
    pub fn set_endpoint(&mut self, id: PeerId, endpoint: SocketAddr) {
        if let Some(p) = self.peers.get_mut(id).and_then(Option::as_mut) {
            p.endpoint = Some(endpoint);
        }
    }

    /// Seconds; 0 or `None` turns it off.
    pub fn set_persistent_keepalive(&mut self, id: PeerId, seconds: Option<u16>) {
        if let Some(p) = self.peers.get_mut(id).and_then(Option::as_mut) {
            p.persistent_keepalive = seconds.filter(|s| *s > 0).map(|s| Duration::from_secs(u64::from(s)));
        }
    }

    /// Takes effect from the next handshake.
    pub fn set_psk(&mut self, id: PeerId, psk: Option<[u8; KEY_LEN]>) {
        if let Some(p) = self.peers.get_mut(id).and_then(Option::as_mut) {
            p.key.set_psk(psk);
        }
    }

    /// Adds prefixes to the peer's allowed IPs, after removing the ones it
    /// had if `replace`. A prefix another peer had moves to this one.
    pub fn set_allowed_ips(&mut self, id: PeerId, replace: bool, allowed: &[(IpAddr, u8)]) -> Result<(), BadPrefix> {
        if self.peers.get(id).and_then(Option::as_ref).is_none() {
            return Ok(());
        }
        if replace {
            self.allowed.remove_peer(id);
        }
        for (net, len) in allowed {
            self.allowed.insert(*net, *len, id)?;
        }
        Ok(())
    }

    /// The peer's endpoint as last authenticated (it follows roaming).
    pub fn endpoint(&self, id: PeerId) -> Option<SocketAddr> {
        self.peers.get(id)?.as_ref()?.endpoint
    }

    /// When the peer's last handshake completed.
    pub fn last_handshake(&self, id: PeerId) -> Option<Instant> {
        self.peers.get(id)?.as_ref()?.last_handshake
    }

    fn new_index(&mut self, peer: PeerId, slot: Slot) -> u32 {
        loop {
            let i = self.rng.next_u32();
            if i != 0 && !self.indexes.contains_key(&i) {
                self.indexes.insert(i, (peer, slot));
                return i;
            }
        }
    }

    /// Starts (or restarts) a handshake with `id`.
    fn initiate(&mut self, id: PeerId, now: Instant, out: &mut Vec<Transmit>) -> Result<(), DropReason> {
        let index = self.new_index(id, Slot::Handshake);
        let timestamp = handshake::tai64n(self.wall(now));
        let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else { return Err(DropReason::NoRoute) };
        let Some(to) = peer.endpoint else {
            self.indexes.remove(&index);
            return Err(DropReason::NoEndpoint);
        };
        let cookie = peer.cookies.cookie(now).copied();
        let made = handshake::initiate(&self.me, &peer.key, index, timestamp, cookie.as_ref(), &mut self.rng);
        let (msg, state) = match made {
            Ok(m) => m,
            Err(e) => {
                self.indexes.remove(&index);
                return Err(DropReason::Handshake(e));
            }
        };
        peer.cookies.sent(&msg, initiation::MAC1);
        let first = match peer.initiated.take() {
            Some((old, first, _)) => {
                self.indexes.remove(&old.sender);
                first
            }
            None => now,
        };
        peer.initiated = Some((state, first, now));
        peer.last_sent = Some(now);
        peer.stats.initiations += 1;
        out.push(Transmit { to, datagram: msg.to_vec() });
        Ok(())
    }

    /// Seals `packet` to whichever peer owns its destination; starts a
    /// handshake when there is no usable session (the packet waits).
    pub fn send(&mut self, packet: &[u8], now: Instant, out: &mut Vec<Transmit>) -> Result<(), DropReason> {
        let (_, dst) = ip::addresses(packet).ok_or(DropReason::NotIp)?;
        let id = self.allowed.lookup(dst).ok_or(DropReason::NoRoute)?;
        self.send_to(id, packet, now, out)
    }

    /// Like [`Device::send`], but the packet is sealed by the caller:
    /// `Ok(None)` when it waits for a handshake (kept here), `Ok(Some)`
    /// with what sealing it needs.
    pub fn plan_seal(
        &mut self,
        packet: &[u8],
        now: Instant,
        out: &mut Vec<Transmit>,
    ) -> Result<Option<SealPlan>, DropReason> {
        let (_, dst) = ip::addresses(packet).ok_or(DropReason::NotIp)?;
        let id = self.allowed.lookup(dst).ok_or(DropReason::NoRoute)?;
        self.reserve(id, packet, now, out)
    }

    /// Sends on the current session, or queues `packet` and starts a
    /// handshake when there is none usable.
    fn reserve(
        &mut self,
        id: PeerId,
        packet: &[u8],
        now: Instant,
        out: &mut Vec<Transmit>,
    ) -> Result<Option<SealPlan>, DropReason> {
        let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else { return Err(DropReason::NoRoute) };
        let to = peer.endpoint.ok_or(DropReason::NoEndpoint)?;
        let usable = peer.current.as_ref().is_some_and(|c| now.saturating_duration_since(c.born) < REJECT_AFTER_TIME);
        if !usable {
            if peer.queue.len() >= QUEUE_LEN {
                peer.queue.pop_front();
            }
            peer.queue.push_back(packet.to_vec());
            if peer.initiated.is_none() {
                self.initiate(id, now, out)?;
            }
            return Ok(None);
        }
        let Some(cur) = peer.current.as_mut() else { return Err(DropReason::Expired) };
        let counter = match cur.keys.reserve() {
            Ok(c) => c,
            Err(e) => {
                if let Some(at) = DropReason::Transport(e).peer_index() {
                    peer.stats.drops[at] += 1;
                }
                return Err(DropReason::Transport(e));
            }
        };
        let plan = SealPlan {
            peer: id,
            to,
            header: crate::transport::header(cur.keys.remote, counter),
            key: cur.keys.send_key().clone(),
            counter,
        };
        let rekey = cur.keys.initiator
            && (now.saturating_duration_since(cur.born) >= REKEY_AFTER_TIME || cur.keys.sent() >= REKEY_AFTER_MESSAGES);
        peer.last_sent = Some(now);
        peer.keepalive_at = None;
        peer.stats.tx_packets += 1;
        peer.stats.tx_bytes +=
            (crate::transport::padded_len(packet.len()) + crate::messages::transport::MIN_LEN) as u64;
        if !packet.is_empty() && peer.new_handshake_at.is_none() {
            peer.new_handshake_at = Some(now + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT);
        }
        if rekey && peer.initiated.is_none() {
            // This packet goes on the old keys; the next ones come.
            let _ = self.initiate(id, now, out);
        }
        Ok(Some(plan))
    }

    /// Seals here, one packet at a time (queued packets, keepalives).
    fn send_to(&mut self, id: PeerId, packet: &[u8], now: Instant, out: &mut Vec<Transmit>) -> Result<(), DropReason> {
        let mut handshakes = Vec::new();
        let plan = self.reserve(id, packet, now, &mut handshakes);
        if let Ok(Some(plan)) = &plan {
            out.push(Transmit { to: plan.to, datagram: seal_one(plan, packet) });
        }
        // A rekey's initiation goes after the packet it was started by.
        out.append(&mut handshakes);
        plan.map(|_| ())
    }

    /// Sends what waited for a session.
    fn flush(&mut self, id: PeerId, now: Instant, out: &mut Vec<Transmit>) {
        let queued: Vec<Vec<u8>> =
            self.peers.get_mut(id).and_then(Option::as_mut).map(|p| p.queue.drain(..).collect()).unwrap_or_default();
        for packet in queued {
            let _ = self.send_to(id, &packet, now, out);
        }
    }

    /// Handles a datagram from `src`. A packet for the tunnel goes into
    /// `packet` (its padding cut off).
    pub fn receive(
        &mut self,
        datagram: &[u8],
        src: SocketAddr,
        now: Instant,
        out: &mut Vec<Transmit>,
        packet: &mut Vec<u8>,
    ) -> Received {
        let plan = match self.plan_open(datagram, src, now, out) {
            Inbound::Done(r) => return r,
            Inbound::Open(plan) => plan,
        };
        packet.clear();
        packet.extend_from_slice(&datagram[crate::messages::transport::DATA..]);
        if crate::crypto::open(&plan.key, plan.counter, packet, &[]).is_err() {
            let decrypt = DropReason::Transport(TransportError::Decrypt);
            self.note_drop(plan.peer, decrypt);
            return Received::Dropped(decrypt);
        }
        packet.truncate(packet.len() - crate::crypto::TAG_LEN);
        let r = self.finish_open(&plan, packet, src, now, out);
        if let Received::Packet { len, .. } = r {
            packet.truncate(len);
        }
        r
    }

    /// The first look at a datagram from `src`: handshake and cookie
    /// messages are handled here; transport data is checked (index, age,
    /// replay) and handed back to be opened.
    pub fn plan_open(&mut self, datagram: &[u8], src: SocketAddr, now: Instant, out: &mut Vec<Transmit>) -> Inbound {
        let msg = match messages::parse(datagram) {
            Ok(m) => m,
            Err(e) => return Inbound::Done(Received::Dropped(DropReason::Malformed(e))),
        };
        Inbound::Done(match msg {
            Message::Transport { receiver, counter, .. } => {
                return match self.transport_keys(receiver, counter, now) {
                    Ok((peer, key)) => Inbound::Open(OpenPlan { peer, local: receiver, key, counter }),
                    Err(d) => Inbound::Done(Received::Dropped(d)),
                };
            }
            Message::Initiation(m) => self.on_initiation(m, src, now, out),
            Message::Response(m) => self.on_response(m, src, now, out),
            Message::CookieReply(m) => self.on_cookie_reply(m, now),
        })
    }

    fn on_cookie_reply(&mut self, m: &[u8; messages::cookie_reply::LEN], now: Instant) -> Received {
        let Some(&(id, Slot::Handshake)) = self.indexes.get(&messages::cookie_receiver(m)) else {
            return Received::Dropped(DropReason::UnknownIndex);
        };
        let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else {
            return Received::Dropped(DropReason::UnknownIndex);
        };
        match peer.cookies.receive(m, &peer.key, now) {
            Ok(()) => Received::Control,
            Err(e) => Received::Dropped(DropReason::Cookie(e)),
        }
    }

    /// The checks before any Diffie-Hellman work on a handshake message:
    /// mac1 must be ours; under load mac2 must carry our cookie for `src`
    /// (else the sender gets a cookie reply), and the source must be within
    /// its rate. `Some`: the message stops here, with this outcome.
    fn screen(
        &mut self,
        m: &[u8],
        mac1_at: usize,
        src: SocketAddr,
        now: Instant,
        out: &mut Vec<Transmit>,
    ) -> Option<Received> {
        let (before, mac1) = (&m[..mac1_at], &m[mac1_at..mac1_at + crate::crypto::MAC_LEN]);
        if !self.me.mac1_ok(before, mac1) {
            return Some(Received::Dropped(DropReason::Handshake(HandshakeError::Mac1)));
        }
        self.limiter.count(now);
        if !self.under_load && !self.limiter.under_load() {
            return None;
        }
        if !self.checker.mac2_ok(m, mac1_at, src, now, &mut self.rng) {
            let reply = self.checker.reply(m, mac1_at, messages::sender(m), src, now, &mut self.rng);
            out.push(Transmit { to: src, datagram: reply.to_vec() });
            return Some(Received::Control);
        }
        if !self.limiter.admit(src.ip(), now) {
            return Some(Received::Dropped(DropReason::RateLimited));
        }
        None
    }

    fn on_initiation(
        &mut self,
        m: &[u8; initiation::LEN],
        src: SocketAddr,
        now: Instant,
        out: &mut Vec<Transmit>,
    ) -> Received {
        if let Some(stop) = self.screen(m, initiation::MAC1, src, now, out) {
            return stop;
        }
        let got = match handshake::receive_initiation(&self.me, m) {
            Ok(g) => g,
            Err(e) => return Received::Dropped(DropReason::Handshake(e)),
        };
        let Some(&id) = self.by_key.get(&got.peer_public) else { return Received::Dropped(DropReason::UnknownPeer) };
        let index = self.new_index(id, Slot::Keys);
        let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        if peer.last_timestamp.is_some_and(|t| got.timestamp <= t) {
            self.indexes.remove(&index);
            self.note_drop(id, DropReason::ReplayedInitiation);
            return Received::Dropped(DropReason::ReplayedInitiation);
        }
        if peer.last_initiation.is_some_and(|t| now.saturating_duration_since(t) < INITIATION_MIN_INTERVAL) {
            self.indexes.remove(&index);
            self.note_drop(id, DropReason::Flood);
            return Received::Dropped(DropReason::Flood);
        }
        peer.last_timestamp = Some(got.timestamp);
        peer.last_initiation = Some(now);
        let cookie = peer.cookies.cookie(now).copied();
        let (msg, session) = match handshake::respond(got, &peer.key, index, cookie.as_ref(), &mut self.rng) {
            Ok(r) => r,
            Err(e) => {
                self.indexes.remove(&index);
                return Received::Dropped(DropReason::Handshake(e));
            }
        };
        peer.endpoint = Some(src);
        if let Some(old) = peer.next.replace(Timed { keys: session.into(), born: now }) {
            self.indexes.remove(&old.keys.local);
        }
        peer.last_sent = Some(now);
        out.push(Transmit { to: src, datagram: msg.to_vec() });
        Received::Control
    }

    fn on_response(
        &mut self,
        m: &[u8; response::LEN],
        src: SocketAddr,
        now: Instant,
        out: &mut Vec<Transmit>,
    ) -> Received {
        if let Some(stop) = self.screen(m, response::MAC1, src, now, out) {
            return stop;
        }
        let receiver = messages::response_receiver(m);
        let Some(&(id, Slot::Handshake)) = self.indexes.get(&receiver) else {
            return Received::Dropped(DropReason::UnknownIndex);
        };
        let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else {
            return Received::Dropped(DropReason::UnknownIndex);
        };
        let Some((state, _, _)) = peer.initiated.as_ref() else { return Received::Dropped(DropReason::UnknownIndex) };
        let session = match handshake::receive_response(&self.me, state, &peer.key, m) {
            Ok(s) => s,
            Err(e) => {
                self.note_drop(id, DropReason::Handshake(e));
                return Received::Dropped(DropReason::Handshake(e));
            }
        };
        peer.initiated = None;
        peer.endpoint = Some(src);
        peer.last_handshake = Some(now);
        peer.stats.handshakes += 1;
        peer.new_handshake_at = None;
        self.indexes.insert(receiver, (id, Slot::Keys));
        let retired = peer.previous.take();
        peer.previous = peer.current.replace(Timed { keys: session.into(), born: now });
        if let Some(old) = retired {
            self.indexes.remove(&old.keys.local);
        }
        let waiting = !peer.queue.is_empty();
        self.flush(id, now, out);
        if !waiting {
            // Confirms the session to the responder, which may not send
            // on it before hearing from us.
            let _ = self.send_to(id, &[], now, out);
        }
        Received::Control
    }

    /// The keypair a transport message names, if it may be opened now.
    fn keypair(&mut self, local: u32) -> Result<(PeerId, usize), DropReason> {
        let Some(&(id, Slot::Keys)) = self.indexes.get(&local) else { return Err(DropReason::UnknownIndex) };
        let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else { return Err(DropReason::UnknownIndex) };
        let slot = [&peer.current, &peer.next, &peer.previous]
            .into_iter()
            .position(|s| s.as_ref().is_some_and(|t| t.keys.local == local))
            .ok_or(DropReason::UnknownIndex)?;
        Ok((id, slot))
    }

    fn timed(&mut self, id: PeerId, slot: usize) -> Option<&mut Timed> {
        let peer = self.peers.get_mut(id)?.as_mut()?;
        match slot {
            0 => peer.current.as_mut(),
            1 => peer.next.as_mut(),
            _ => peer.previous.as_mut(),
        }
    }

    fn transport_keys(
        &mut self,
        local: u32,
        counter: u64,
        now: Instant,
    ) -> Result<(PeerId, crate::crypto::Key), DropReason> {
        let (id, slot) = self.keypair(local)?;
        let timed = self.timed(id, slot).ok_or(DropReason::UnknownIndex)?;
        let refused = if now.saturating_duration_since(timed.born) >= REJECT_AFTER_TIME {
            DropReason::Expired
        } else if !timed.keys.check(counter) {
            DropReason::Transport(TransportError::Replay)
        } else {
            return Ok((id, timed.keys.recv_key().clone()));
        };
        self.note_drop(id, refused);
        Err(refused)
    }

    /// After the caller opened `plan`'s message (`plain`: the padded
    /// packet): the replay window, the session and timer rules, roaming,
    /// and the inner source's check against the peer's allowed IPs.
    pub fn finish_open(
        &mut self,
        plan: &OpenPlan,
        plain: &[u8],
        src: SocketAddr,
        now: Instant,
        out: &mut Vec<Transmit>,
    ) -> Received {
        // The keys may have changed while the message was being opened.
        let (id, slot) = match self.keypair(plan.local) {
            Ok(k) if k.0 == plan.peer => k,
            Ok(_) => return Received::Dropped(DropReason::UnknownIndex),
            Err(d) => return Received::Dropped(d),
        };
        let Some(timed) = self.timed(id, slot) else { return Received::Dropped(DropReason::UnknownIndex) };
        if !timed.keys.accept(plan.counter) {
            let replay = DropReason::Transport(TransportError::Replay);
            self.note_drop(id, replay);
            return Received::Dropped(replay);
        }
        let initiator_age = timed.keys.initiator.then(|| now.saturating_duration_since(timed.born));
        let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else {
            return Received::Dropped(DropReason::UnknownIndex);
        };
        peer.endpoint = Some(src);
        peer.new_handshake_at = None;
        peer.stats.rx_packets += 1;
        peer.stats.rx_bytes += (plain.len() + crate::messages::transport::MIN_LEN) as u64;
        if slot == 1 {
            // The initiator used the new keys: they become current.
            let retired = peer.previous.take();
            peer.previous = peer.current.take();
            peer.current = peer.next.take();
            peer.last_handshake = Some(now);
            peer.stats.handshakes += 1;
            if let Some(old) = retired {
                self.indexes.remove(&old.keys.local);
            }
            self.flush(id, now, out);
        }
        let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else { return Received::Control };
        // The initiator renews keys that near their end on the receive side too.
        let renew = initiator_age.is_some_and(|a| a >= REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT);
        if plain.is_empty() {
            if renew && peer.initiated.is_none() {
                let _ = self.initiate(id, now, out);
            }
            return Received::Control;
        }
        let Some((inner_src, _)) = ip::addresses(plain) else {
            self.note_drop(id, DropReason::NotIp);
            return Received::Dropped(DropReason::NotIp);
        };
        if self.allowed.lookup(inner_src) != Some(id) {
            self.note_drop(id, DropReason::NotAllowedSource);
            return Received::Dropped(DropReason::NotAllowedSource);
        }
        let len = ip::total_len(plain).filter(|l| *l <= plain.len()).unwrap_or(plain.len());
        if peer.keepalive_at.is_none() {
            peer.keepalive_at = Some(now + KEEPALIVE_TIMEOUT);
        }
        if renew && peer.initiated.is_none() {
            let _ = self.initiate(id, now, out);
        }
        Received::Packet { peer: id, len }
    }

    /// Runs every peer's timers: handshake retries and giving up,
    /// keepalives, a new handshake when data goes unanswered, and zeroing
    /// keys long unused. Call it at least every second or so.
    pub fn tick(&mut self, now: Instant, out: &mut Vec<Transmit>) -> Vec<(PeerId, DropReason)> {
        let mut dropped = Vec::new();
        for id in 0..self.peers.len() {
            let Some(peer) = self.peers[id].as_mut() else { continue };
            let since = |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t));
            // Handshake retries, with jitter, until REKEY_ATTEMPT_TIME.
            if let Some((_, first, last)) = &peer.initiated {
                let (first, last) = (*first, *last);
                if now.saturating_duration_since(first) >= REKEY_ATTEMPT_TIME {
                    if let Some((state, _, _)) = peer.initiated.take() {
                        self.indexes.remove(&state.sender);
                    }
                    peer.stats.handshake_failures += 1;
                    for _ in peer.queue.drain(..) {
                        if let Some(at) = DropReason::HandshakeTimeout.peer_index() {
                            peer.stats.drops[at] += 1;
                        }
                        dropped.push((id, DropReason::HandshakeTimeout));
                    }
                    continue;
                }
                let jitter = Duration::from_millis(u64::from(self.rng.next_u32() % 334));
                if now.saturating_duration_since(last) >= REKEY_TIMEOUT + jitter {
                    let _ = self.initiate(id, now, out);
                }
                continue;
            }
            let Some(peer) = self.peers[id].as_mut() else { continue };
            // Keys long unused are forgotten (zeroed as they drop).
            if since(peer.last_handshake).is_some_and(|d| d >= REJECT_AFTER_TIME * 3) {
                for t in [peer.previous.take(), peer.current.take(), peer.next.take()].into_iter().flatten() {
                    self.indexes.remove(&t.keys.local);
                }
                peer.last_handshake = None;
                continue;
            }
            let has_keys = peer.current.is_some();
            // Data sent and nothing heard back: a new handshake.
            if peer.new_handshake_at.is_some_and(|t| now >= t) {
                peer.new_handshake_at = None;
                let _ = self.initiate(id, now, out);
                continue;
            }
            // Data received and nothing sent back for a while, or the
            // persistent keepalive's interval: a keepalive.
            let passive = peer.keepalive_at.is_some_and(|t| now >= t);
            let persistent = peer.persistent_keepalive.is_some_and(|k| since(peer.last_sent).is_none_or(|d| d >= k));
            if has_keys && (passive || persistent) {
                let _ = self.send_to(id, &[], now, out);
            }
        }
        dropped
    }
}

/// Opens an export of sessions ([`Device::export_sessions`]).
const HANDOFF_MAGIC: [u8; 4] = *b"GHW1";
/// How far an imported keypair's sending counter moves on: the receiver's
/// window takes a jump, and no counter is ever used twice with one key.
const HANDOFF_COUNTER_SKIP: u64 = 1 << 16;

/// Why an export of sessions was refused. Nothing was imported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandoffError {
    /// Cut short, or not in the format.
    Malformed,
    /// Made by an interface with another private key.
    OtherKey,
}

impl std::fmt::Display for HandoffError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HandoffError::Malformed => "the sessions handed over are malformed",
            HandoffError::OtherKey => "the sessions handed over belong to another private key",
        })
    }
}

impl std::error::Error for HandoffError {}

/// One peer's sessions as read from an export.
struct Handed {
    public: [u8; KEY_LEN],
    endpoint: Option<SocketAddr>,
    last_timestamp: Option<[u8; TIMESTAMP_LEN]>,
    last_handshake: Option<Instant>,
    /// previous, current, next.
    slots: [Option<Timed>; 3],
}

fn put_age(out: &mut Vec<u8>, at: Option<Instant>, now: Instant) {
    use crate::handoff::{put_u8, put_u64};
    match at {
        None => put_u8(out, 0),
        Some(t) => {
            put_u8(out, 1);
            put_u64(out, u64::try_from(now.saturating_duration_since(t).as_millis()).unwrap_or(u64::MAX));
        }
    }
}

/// An age written by [`put_age`] as an instant before `now`; `Some(None)`
/// for none, or for one older than this clock can say.
fn read_age(r: &mut crate::handoff::Reader<'_>, now: Instant) -> Option<Option<Instant>> {
    match r.u8()? {
        0 => Some(None),
        1 => Some(now.checked_sub(Duration::from_millis(r.u64()?))),
        _ => None,
    }
}

impl<R: rand_core::CryptoRngCore> Device<R> {
    /// Every peer's live sessions (keypairs with their counters and replay
    /// windows, endpoint, last handshake and initiation timestamp), for the
    /// process that takes this one's place in a binary upgrade: with them
    /// its peers' traffic goes on without a handshake. Sealing and opening
    /// with this device must have stopped. Holds keys: zeroed when dropped,
    /// and to be sent only where the private key may go.
    pub fn export_sessions(&self, now: Instant) -> crate::handoff::Buffer {
        use crate::handoff::{put_addr, put_u8, put_u32};
        let mut out = crate::handoff::Buffer::default();
        out.extend_from_slice(&HANDOFF_MAGIC);
        out.extend_from_slice(self.me.public());
        let mut live: Vec<(&[u8; KEY_LEN], &Peer)> = self
            .by_key
            .iter()
            .filter_map(|(k, &id)| Some((k, self.peers.get(id)?.as_ref()?)))
            .filter(|(_, p)| p.previous.is_some() || p.current.is_some() || p.next.is_some())
            .collect();
        live.sort_by_key(|(k, _)| **k);
        put_u32(&mut out, u32::try_from(live.len()).unwrap_or(u32::MAX));
        for (public, p) in live {
            out.extend_from_slice(public);
            put_addr(&mut out, p.endpoint);
            match p.last_timestamp {
                None => put_u8(&mut out, 0),
                Some(t) => {
                    put_u8(&mut out, 1);
                    out.extend_from_slice(&t);
                }
            }
            put_age(&mut out, p.last_handshake, now);
            for slot in [&p.previous, &p.current, &p.next] {
                match slot {
                    None => put_u8(&mut out, 0),
                    Some(t) => {
                        put_u8(&mut out, 1);
                        put_age(&mut out, Some(t.born), now);
                        t.keys.export(&mut out);
                    }
                }
            }
        }
        out
    }

    /// Takes the sessions another process exported (same private key) for
    /// the peers this device has; returns how many keypairs were taken.
    /// Peers it does not have, keypairs past [`REJECT_AFTER_TIME`] and
    /// indexes already in use are left out. Malformed input changes
    /// nothing.
    pub fn import_sessions(&mut self, bytes: &[u8], now: Instant) -> Result<usize, HandoffError> {
        let handed = self.read_export(bytes, now)?;
        let mut taken = 0;
        for h in handed {
            let Some(&id) = self.by_key.get(&h.public) else { continue };
            let mut slots = h.slots;
            for s in &mut slots {
                if s.as_ref().is_some_and(|t| self.indexes.contains_key(&t.keys.local)) {
                    *s = None;
                }
            }
            let Some(peer) = self.peers.get_mut(id).and_then(Option::as_mut) else { continue };
            let [previous, current, next] = slots;
            for t in [&previous, &current, &next].into_iter().flatten() {
                self.indexes.insert(t.keys.local, (id, Slot::Keys));
                taken += 1;
            }
            for old in [
                std::mem::replace(&mut peer.previous, previous),
                std::mem::replace(&mut peer.current, current),
                std::mem::replace(&mut peer.next, next),
            ]
            .into_iter()
            .flatten()
            {
                self.indexes.remove(&old.keys.local);
            }
            if h.endpoint.is_some() {
                peer.endpoint = h.endpoint;
            }
            if h.last_timestamp > peer.last_timestamp {
                peer.last_timestamp = h.last_timestamp;
            }
            peer.last_handshake = peer.last_handshake.max(h.last_handshake);
        }
        Ok(taken)
    }

    /// Reads a whole export before anything is changed.
    fn read_export(&self, bytes: &[u8], now: Instant) -> Result<Vec<Handed>, HandoffError> {
        let mut r = crate::handoff::Reader::new(bytes);
        if r.bytes::<4>() != Some(HANDOFF_MAGIC) {
            return Err(HandoffError::Malformed);
        }
        match r.bytes::<KEY_LEN>() {
            Some(k) if k == *self.me.public() => read_peers(&mut r, now).ok_or(HandoffError::Malformed),
            Some(_) => Err(HandoffError::OtherKey),
            None => Err(HandoffError::Malformed),
        }
    }
}

/// The peers of an export, after its header; `None`: malformed.
fn read_peers(r: &mut crate::handoff::Reader<'_>, now: Instant) -> Option<Vec<Handed>> {
    let n = r.u32()?;
    let mut handed = Vec::new();
    for _ in 0..n {
        let public = r.bytes::<KEY_LEN>()?;
        let endpoint = r.addr()?;
        let last_timestamp = match r.u8()? {
            0 => None,
            1 => Some(r.bytes::<TIMESTAMP_LEN>()?),
            _ => return None,
        };
        let last_handshake = read_age(r, now)?;
        let mut slots: [Option<Timed>; 3] = [None, None, None];
        for s in &mut slots {
            match r.u8()? {
                0 => {}
                1 => {
                    let born = read_age(r, now)?;
                    let keys = Keypair::import(r, HANDOFF_COUNTER_SKIP)?;
                    *s = born
                        .filter(|b| now.saturating_duration_since(*b) < REJECT_AFTER_TIME)
                        .map(|born| Timed { keys, born });
                }
                _ => return None,
            }
        }
        handed.push(Handed { public, endpoint, last_timestamp, last_handshake, slots });
    }
    r.is_empty().then_some(handed)
}

/// A transport message for `packet` sealed by `plan`, one at a time.
pub fn seal_one(plan: &SealPlan, packet: &[u8]) -> Vec<u8> {
    use crate::messages::transport::DATA;
    let mut d = Vec::with_capacity(DATA + crate::transport::padded_len(packet.len()) + crate::crypto::TAG_LEN);
    d.extend_from_slice(&plan.header);
    d.extend_from_slice(packet);
    d.resize(DATA + crate::transport::padded_len(packet.len()) + crate::crypto::TAG_LEN, 0);
    crate::crypto::seal_fixed(&plan.key, plan.counter, &mut d[DATA..], &[]);
    d
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let outcomes: Vec<Received> = (0..10)
            .map(|_| p.b.receive(&retry[0].datagram, addr(A_ADDR), t, &mut Vec::new(), &mut Vec::new()))
            .collect();
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
}
