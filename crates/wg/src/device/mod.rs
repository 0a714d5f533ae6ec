//! A WireGuard interface without I/O: peers, the index of sessions, the
//! handshake and transport rules, and the protocol's timers (whitepaper
//! section 6). The caller gives it packets from the tunnel, datagrams from
//! the network with their source, and the time; it gives back datagrams to
//! send and packets for the tunnel.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use gatehouse_wire::ip;
use rustc_hash::FxHashMap;

use crate::allowed_ips::{AllowedIps, BadPrefix};
use crate::cookie::{CookieChecker, CookieJar};
use crate::crypto::{KEY_LEN, StaticSecret};
use crate::handshake::{self, HandshakeError, Identity, Initiated, PeerKey, TIMESTAMP_LEN};
use crate::messages::{self, Message, initiation, response};
use crate::ratelimit::HandshakeLimiter;
use crate::transport::{Keypair, REKEY_AFTER_MESSAGES, TransportError};

mod drop;
mod export;
mod report;
mod timers;

pub use drop::{DropReason, PEER_DROP_NAMES};
pub use export::HandoffError;
pub use report::{PeerInfo, PeerStats};
pub use timers::{
    INITIATION_MIN_INTERVAL, KEEPALIVE_TIMEOUT, QUEUE_LEN, REJECT_AFTER_TIME, REKEY_AFTER_TIME, REKEY_ATTEMPT_TIME,
    REKEY_TIMEOUT,
};

/// A peer's number in its device.
pub type PeerId = usize;

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub to: SocketAddr,
    pub datagram: Vec<u8>,
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

#[cfg_attr(feature = "fuzzing", derive(Clone))]
struct Timed {
    keys: Keypair,
    born: Instant,
}

#[cfg_attr(feature = "fuzzing", derive(Clone))]
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

/// A slot a local index points to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Handshake,
    Keys,
}

/// A WireGuard interface.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct Device<R: rand_core::CryptoRngCore> {
    me: Identity,
    peers: Vec<Option<Peer>>,
    by_key: HashMap<[u8; KEY_LEN], PeerId>,
    allowed: AllowedIps<PeerId>,
    /// FxHash: we draw the indexes at random, so nobody can crowd a
    /// bucket (a datagram's index only looks one up).
    indexes: FxHashMap<u32, (PeerId, Slot)>,
    checker: CookieChecker,
    limiter: HandshakeLimiter,
    /// Load as the caller sees it (its queues), on top of the rate.
    under_load: bool,
    /// A monotonic instant and the wall-clock time then, for timestamps.
    clock: (Instant, Duration),
    /// Packets it seals itself are padded up to this at most.
    mtu: usize,
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
            indexes: FxHashMap::default(),
            checker,
            limiter: HandshakeLimiter::new(now),
            under_load: false,
            clock: (now, wall),
            mtu: usize::MAX,
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
    /// The interface's MTU, which padding stops at (as the caller pads).
    pub fn set_mtu(&mut self, mtu: usize) {
        self.mtu = mtu;
    }

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
            key: PeerKey::new(&self.me, public, psk),
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
            (crate::transport::padded_within(packet.len(), self.mtu) + crate::messages::transport::MIN_LEN) as u64;
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
            let padded = crate::transport::padded_within(packet.len(), self.mtu);
            out.push(Transmit { to: plan.to, datagram: seal_padded(plan, packet, padded) });
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
        let opened = match handshake::receive_initiation(&self.me, m) {
            Ok(o) => o,
            Err(e) => return Received::Dropped(DropReason::Handshake(e)),
        };
        let Some(&id) = self.by_key.get(&opened.peer_public) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        let Some(peer) = self.peers.get(id).and_then(Option::as_ref) else {
            return Received::Dropped(DropReason::UnknownPeer);
        };
        let got = match opened.from_peer(&peer.key) {
            Ok(g) => g,
            Err(e) => return Received::Dropped(DropReason::Handshake(e)),
        };
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
}

/// A transport message for `packet` sealed by `plan`, one at a time.
pub fn seal_one(plan: &SealPlan, packet: &[u8]) -> Vec<u8> {
    seal_padded(plan, packet, crate::transport::padded_len(packet.len()))
}

/// As [`seal_one`], the packet padded to `padded` bytes.
fn seal_padded(plan: &SealPlan, packet: &[u8], padded: usize) -> Vec<u8> {
    use crate::messages::transport::DATA;
    let mut d = Vec::with_capacity(DATA + padded + crate::crypto::TAG_LEN);
    d.extend_from_slice(&plan.header);
    d.extend_from_slice(packet);
    d.resize(DATA + padded.max(packet.len()) + crate::crypto::TAG_LEN, 0);
    crate::crypto::seal_fixed(&plan.key, plan.counter, &mut d[DATA..], &[]);
    d
}

#[cfg(test)]
mod tests;
