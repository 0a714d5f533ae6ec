//! The Noise_IKpsk2 handshake as WireGuard runs it (whitepaper section
//! 5.4): an initiation from the side that has packets to send, a response
//! from the other, and a pair of transport keys on each side. Each step is
//! a function from the state so far and the message to the next state and
//! message; which peer a message belongs to, replay of timestamps, rate
//! limits and cookies are the caller's (see the device).

use subtle::ConstantTimeEq;

use crate::crypto::{self, KEY_LEN, Key, MAC_LEN, StaticSecret, hash, kdf, mac};
use crate::messages::{self, initiation, response};

const CONSTRUCTION: &[u8] = b"Noise_IKpsk2_25519_ChaChaPoly_BLAKE2s";
const IDENTIFIER: &[u8] = b"WireGuard v1 zx2c4 Jason@zx2c4.com";
const LABEL_MAC1: &[u8] = b"mac1----";
const LABEL_COOKIE: &[u8] = b"cookie--";

/// Bytes of a TAI64N timestamp.
pub const TIMESTAMP_LEN: usize = 12;

/// TAI64N of a time given as the duration since the Unix epoch: seconds
/// from 2^62 + 10 (big-endian), then nanoseconds.
pub fn tai64n(since_epoch: std::time::Duration) -> [u8; TIMESTAMP_LEN] {
    let mut t = [0u8; TIMESTAMP_LEN];
    t[..8].copy_from_slice(&(0x4000_0000_0000_000a_u64 + since_epoch.as_secs()).to_be_bytes());
    t[8..].copy_from_slice(&since_epoch.subsec_nanos().to_be_bytes());
    t
}

/// The chaining key and hash every handshake starts from.
fn initial() -> (Key, [u8; KEY_LEN]) {
    let c = hash(&[CONSTRUCTION]);
    let h = hash(&[&c, IDENTIFIER]);
    (Key(c), h)
}

/// This side's static key and what is derived from it once.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct Identity {
    secret: StaticSecret,
    public: [u8; KEY_LEN],
    /// HASH(LABEL_MAC1 || public): checks mac1 of messages to us.
    mac1_key: [u8; KEY_LEN],
    /// HASH(LABEL_COOKIE || public): seals the cookies we send.
    cookie_key: [u8; KEY_LEN],
}

impl Identity {
    pub fn new(secret: StaticSecret) -> Identity {
        let public = secret.public();
        Identity { secret, public, mac1_key: hash(&[LABEL_MAC1, &public]), cookie_key: hash(&[LABEL_COOKIE, &public]) }
    }

    pub fn public(&self) -> &[u8; KEY_LEN] {
        &self.public
    }

    pub fn cookie_key(&self) -> &[u8; KEY_LEN] {
        &self.cookie_key
    }

    /// Whether mac1 of a message to us (its bytes before mac1) is right.
    pub fn mac1_ok(&self, before_mac1: &[u8], mac1: &[u8]) -> bool {
        bool::from(mac(&self.mac1_key, &[before_mac1]).ct_eq(mac1))
    }
}

/// A peer's static key, its pre-shared key, and what is derived from them.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct PeerKey {
    public: [u8; KEY_LEN],
    /// All zeros without a pre-shared key, as the protocol says.
    psk: Key,
    /// HASH(LABEL_MAC1 || peer's public): mac1 of messages to the peer.
    mac1_key: [u8; KEY_LEN],
    /// HASH(LABEL_COOKIE || peer's public): opens cookies from the peer.
    cookie_key: [u8; KEY_LEN],
    /// DH(our static key, the peer's): the same in every handshake with
    /// the peer, so computed once (as wireguard-go does), which takes one
    /// of the four Diffie-Hellmans out of each side's handshake. `None`
    /// for a key of small order: handshakes with it are refused.
    static_static: Option<Key>,
}

impl PeerKey {
    /// The peer with static key `public`, as seen by `me`.
    pub fn new(me: &Identity, public: [u8; KEY_LEN], psk: Option<[u8; KEY_LEN]>) -> PeerKey {
        PeerKey {
            public,
            psk: Key(psk.unwrap_or([0; KEY_LEN])),
            mac1_key: hash(&[LABEL_MAC1, &public]),
            cookie_key: hash(&[LABEL_COOKIE, &public]),
            static_static: me.secret.dh(&public),
        }
    }

    pub fn public(&self) -> &[u8; KEY_LEN] {
        &self.public
    }

    pub fn cookie_key(&self) -> &[u8; KEY_LEN] {
        &self.cookie_key
    }

    /// The pre-shared key, if one is set (not all zeros).
    pub fn psk(&self) -> Option<&[u8; KEY_LEN]> {
        (self.psk.0 != [0; KEY_LEN]).then_some(&self.psk.0)
    }

    pub fn set_psk(&mut self, psk: Option<[u8; KEY_LEN]>) {
        self.psk = Key(psk.unwrap_or([0; KEY_LEN]));
    }
}

/// Why a handshake message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeError {
    /// mac1 does not match our public key.
    Mac1,
    /// A sealed field did not open: not for us, or tampered with.
    Decrypt,
    /// A public key of small order (an all-zero shared secret).
    WeakKey,
    /// A response to an initiation we did not send.
    UnknownReceiver,
}

/// Keys for one direction pair, as the handshake leaves them.
pub struct Session {
    /// Our index: the receiver field of messages to us.
    pub local: u32,
    /// The peer's index: the receiver field of what we send.
    pub remote: u32,
    pub send: Key,
    pub recv: Key,
    /// We sent the initiation (we may send data at once; the responder
    /// waits for the first data packet).
    pub initiator: bool,
}

/// Writes mac1 (and mac2 from `cookie`, else zeros) of a handshake message
/// whose mac1 sits at `at`.
fn put_macs(msg: &mut [u8], at: usize, mac1_key: &[u8; KEY_LEN], cookie: Option<&[u8; MAC_LEN]>) {
    let m1 = mac(mac1_key, &[&msg[..at]]);
    msg[at..at + MAC_LEN].copy_from_slice(&m1);
    let m2 = cookie.map_or([0; MAC_LEN], |c| mac(c, &[&msg[..at + MAC_LEN]]));
    msg[at + MAC_LEN..at + 2 * MAC_LEN].copy_from_slice(&m2);
}

/// The initiator's state between sending an initiation and its response.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct Initiated {
    pub sender: u32,
    ephemeral: StaticSecret,
    chaining: Key,
    hash: [u8; KEY_LEN],
}

/// Makes an initiation to `peer`. `sender` is our index for the session;
/// `cookie` the last cookie the peer sent us, if it is fresh.
pub fn initiate(
    me: &Identity,
    peer: &PeerKey,
    sender: u32,
    timestamp: [u8; TIMESTAMP_LEN],
    cookie: Option<&[u8; MAC_LEN]>,
    rng: &mut impl rand_core::CryptoRngCore,
) -> Result<([u8; initiation::LEN], Initiated), HandshakeError> {
    let mut msg = [0u8; initiation::LEN];
    msg[0] = messages::INITIATION;
    msg[initiation::SENDER..initiation::EPHEMERAL].copy_from_slice(&sender.to_le_bytes());
    let (c, h) = initial();
    let mut h = hash(&[&h, &peer.public]);
    let ephemeral = StaticSecret::random(rng);
    let e_pub = ephemeral.public();
    let [c] = kdf::<1>(&c.0, &e_pub);
    msg[initiation::EPHEMERAL..initiation::STATIC].copy_from_slice(&e_pub);
    h = hash(&[&h, &e_pub]);
    let es = ephemeral.dh(&peer.public).ok_or(HandshakeError::WeakKey)?;
    let [c, k] = kdf::<2>(&c.0, &es.0);
    let field = &mut msg[initiation::STATIC..initiation::TIMESTAMP];
    field[..KEY_LEN].copy_from_slice(&me.public);
    crypto::seal_fixed(&k, 0, field, &h);
    h = hash(&[&h, field]);
    let ss = peer.static_static.as_ref().ok_or(HandshakeError::WeakKey)?;
    let [c, k] = kdf::<2>(&c.0, &ss.0);
    let field = &mut msg[initiation::TIMESTAMP..initiation::MAC1];
    field[..TIMESTAMP_LEN].copy_from_slice(&timestamp);
    crypto::seal_fixed(&k, 0, field, &h);
    h = hash(&[&h, field]);
    put_macs(&mut msg, initiation::MAC1, &peer.mac1_key, cookie);
    Ok((msg, Initiated { sender, ephemeral, chaining: c, hash: h }))
}

/// An initiation opened as far as the initiator's static key: who it
/// says it is, not yet proven (the caller finds the peer by
/// `peer_public` and proves it with [`Opened::from_peer`]).
pub struct Opened {
    /// The initiator's static key, as the initiation claims it.
    pub peer_public: [u8; KEY_LEN],
    sender: u32,
    /// The sealed timestamp, opened with the static-static secret.
    sealed_timestamp: [u8; TIMESTAMP_LEN + crypto::TAG_LEN],
    remote_ephemeral: [u8; KEY_LEN],
    chaining: Key,
    hash: [u8; KEY_LEN],
}

/// What a responder learns from an initiation that opened.
pub struct Received {
    /// The initiator's static key: who it is.
    pub peer_public: [u8; KEY_LEN],
    /// The initiator's index.
    pub sender: u32,
    /// For the caller's replay check (each peer's must grow).
    pub timestamp: [u8; TIMESTAMP_LEN],
    remote_ephemeral: [u8; KEY_LEN],
    chaining: Key,
    hash: [u8; KEY_LEN],
}

/// Opens an initiation to us (mac1 checked first, the cheap test) as far
/// as the initiator's static key: one Diffie-Hellman, so an initiation
/// from a key that is no peer's costs no second one.
pub fn receive_initiation(me: &Identity, msg: &[u8; initiation::LEN]) -> Result<Opened, HandshakeError> {
    if !me.mac1_ok(&msg[..initiation::MAC1], &msg[initiation::MAC1..initiation::MAC2]) {
        return Err(HandshakeError::Mac1);
    }
    let (c, h) = initial();
    let mut h = hash(&[&h, &me.public]);
    let mut e_pub = [0u8; KEY_LEN];
    e_pub.copy_from_slice(&msg[initiation::EPHEMERAL..initiation::STATIC]);
    let [c] = kdf::<1>(&c.0, &e_pub);
    h = hash(&[&h, &e_pub]);
    let es = me.secret.dh(&e_pub).ok_or(HandshakeError::WeakKey)?;
    let [c, k] = kdf::<2>(&c.0, &es.0);
    let mut field = [0u8; KEY_LEN + crypto::TAG_LEN];
    field.copy_from_slice(&msg[initiation::STATIC..initiation::TIMESTAMP]);
    crypto::open(&k, 0, &mut field, &h).map_err(|_| HandshakeError::Decrypt)?;
    h = hash(&[&h, &msg[initiation::STATIC..initiation::TIMESTAMP]]);
    let mut peer_public = [0u8; KEY_LEN];
    peer_public.copy_from_slice(&field[..KEY_LEN]);
    let mut sealed_timestamp = [0u8; TIMESTAMP_LEN + crypto::TAG_LEN];
    sealed_timestamp.copy_from_slice(&msg[initiation::TIMESTAMP..initiation::MAC1]);
    Ok(Opened {
        peer_public,
        sender: messages::sender(msg),
        sealed_timestamp,
        remote_ephemeral: e_pub,
        chaining: c,
        hash: h,
    })
}

impl Opened {
    /// Proves the initiation came from `peer` (found by `peer_public`):
    /// its timestamp opens only with the secret our static key shares
    /// with the peer's.
    pub fn from_peer(self, peer: &PeerKey) -> Result<Received, HandshakeError> {
        let ss = peer.static_static.as_ref().ok_or(HandshakeError::WeakKey)?;
        let [c, k] = kdf::<2>(&self.chaining.0, &ss.0);
        let mut field = self.sealed_timestamp;
        crypto::open(&k, 0, &mut field, &self.hash).map_err(|_| HandshakeError::Decrypt)?;
        let h = hash(&[&self.hash, &self.sealed_timestamp]);
        let mut timestamp = [0u8; TIMESTAMP_LEN];
        timestamp.copy_from_slice(&field[..TIMESTAMP_LEN]);
        Ok(Received {
            peer_public: self.peer_public,
            sender: self.sender,
            timestamp,
            remote_ephemeral: self.remote_ephemeral,
            chaining: c,
            hash: h,
        })
    }
}

/// The transport keys from the final chaining key: the initiator sends with
/// the first, the responder with the second.
fn split(c: &Key, initiator: bool) -> (Key, Key) {
    let [first, second] = kdf::<2>(&c.0, &[]);
    if initiator { (first, second) } else { (second, first) }
}

/// Answers an initiation from `peer` (whose static key the caller found
/// from `received.peer_public`). `sender` is our index for the session.
pub fn respond(
    received: Received,
    peer: &PeerKey,
    sender: u32,
    cookie: Option<&[u8; MAC_LEN]>,
    rng: &mut impl rand_core::CryptoRngCore,
) -> Result<([u8; response::LEN], Session), HandshakeError> {
    let mut msg = [0u8; response::LEN];
    msg[0] = messages::RESPONSE;
    msg[response::SENDER..response::RECEIVER].copy_from_slice(&sender.to_le_bytes());
    msg[response::RECEIVER..response::EPHEMERAL].copy_from_slice(&received.sender.to_le_bytes());
    let ephemeral = StaticSecret::random(rng);
    let e_pub = ephemeral.public();
    let [c] = kdf::<1>(&received.chaining.0, &e_pub);
    msg[response::EPHEMERAL..response::EMPTY].copy_from_slice(&e_pub);
    let mut h = hash(&[&received.hash, &e_pub]);
    let ee = ephemeral.dh(&received.remote_ephemeral).ok_or(HandshakeError::WeakKey)?;
    let [c] = kdf::<1>(&c.0, &ee.0);
    let se = ephemeral.dh(&peer.public).ok_or(HandshakeError::WeakKey)?;
    let [c] = kdf::<1>(&c.0, &se.0);
    let [c, tau, k] = kdf::<3>(&c.0, &peer.psk.0);
    h = hash(&[&h, &tau.0]);
    let field = &mut msg[response::EMPTY..response::MAC1];
    crypto::seal_fixed(&k, 0, field, &h);
    put_macs(&mut msg, response::MAC1, &peer.mac1_key, cookie);
    let (send, recv) = split(&c, false);
    Ok((msg, Session { local: sender, remote: received.sender, send, recv, initiator: false }))
}

/// Completes our handshake with the response to `initiated`.
pub fn receive_response(
    me: &Identity,
    initiated: &Initiated,
    peer: &PeerKey,
    msg: &[u8; response::LEN],
) -> Result<Session, HandshakeError> {
    if !me.mac1_ok(&msg[..response::MAC1], &msg[response::MAC1..response::MAC2]) {
        return Err(HandshakeError::Mac1);
    }
    if messages::response_receiver(msg) != initiated.sender {
        return Err(HandshakeError::UnknownReceiver);
    }
    let mut e_pub = [0u8; KEY_LEN];
    e_pub.copy_from_slice(&msg[response::EPHEMERAL..response::EMPTY]);
    let [c] = kdf::<1>(&initiated.chaining.0, &e_pub);
    let mut h = hash(&[&initiated.hash, &e_pub]);
    let ee = initiated.ephemeral.dh(&e_pub).ok_or(HandshakeError::WeakKey)?;
    let [c] = kdf::<1>(&c.0, &ee.0);
    let se = me.secret.dh(&e_pub).ok_or(HandshakeError::WeakKey)?;
    let [c] = kdf::<1>(&c.0, &se.0);
    let [c, tau, k] = kdf::<3>(&c.0, &peer.psk.0);
    h = hash(&[&h, &tau.0]);
    let mut field = [0u8; crypto::TAG_LEN];
    field.copy_from_slice(&msg[response::EMPTY..response::MAC1]);
    crypto::open(&k, 0, &mut field, &h).map_err(|_| HandshakeError::Decrypt)?;
    let (send, recv) = split(&c, true);
    Ok(Session { local: initiated.sender, remote: messages::sender(msg), send, recv, initiator: true })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(seed: u8) -> Identity {
        Identity::new(StaticSecret::from_bytes([seed; 32]))
    }

    #[test]
    fn both_sides_derive_the_same_keys() {
        let mut rng = rand_core::OsRng;
        let (a, b) = (identity(1), identity(2));
        for psk in [None, Some([7u8; 32])] {
            let (a_sees_b, b_sees_a) = (PeerKey::new(&a, *b.public(), psk), PeerKey::new(&b, *a.public(), psk));
            let ts = tai64n(std::time::Duration::from_secs(1_700_000_000));
            let (init, state) = initiate(&a, &a_sees_b, 11, ts, None, &mut rng).expect("initiation");
            let got = receive_initiation(&b, &init).expect("opens").from_peer(&b_sees_a).expect("from a");
            assert_eq!((got.peer_public, got.sender, got.timestamp), (*a.public(), 11, ts));
            let (resp, b_session) = respond(got, &b_sees_a, 22, None, &mut rng).expect("response");
            let a_session = receive_response(&a, &state, &a_sees_b, &resp).expect("completes");
            assert_eq!((a_session.local, a_session.remote), (11, 22));
            assert_eq!((b_session.local, b_session.remote), (22, 11));
            assert_eq!(a_session.send.0, b_session.recv.0);
            assert_eq!(a_session.recv.0, b_session.send.0);
            assert_ne!(a_session.send.0, a_session.recv.0);
        }
    }

    #[test]
    fn tampering_and_strangers_are_refused() {
        let mut rng = rand_core::OsRng;
        let (a, b, c) = (identity(1), identity(2), identity(3));
        let a_sees_b = PeerKey::new(&a, *b.public(), None);
        let b_sees_a = PeerKey::new(&b, *a.public(), None);
        let ts = tai64n(std::time::Duration::from_secs(1));
        let (init, state) = initiate(&a, &a_sees_b, 1, ts, None, &mut rng).expect("initiation");
        assert!(matches!(receive_initiation(&c, &init), Err(HandshakeError::Mac1)), "not for c");
        for i in [initiation::EPHEMERAL, initiation::STATIC, initiation::TIMESTAMP + 3] {
            let mut bad = init;
            bad[i] ^= 1;
            // mac1 covers the whole message: recompute it so the tamper
            // reaches the sealed fields.
            let m1 = mac(&b.mac1_key, &[&bad[..initiation::MAC1]]);
            bad[initiation::MAC1..initiation::MAC2].copy_from_slice(&m1);
            let got = receive_initiation(&b, &bad).and_then(|o| o.from_peer(&b_sees_a));
            assert!(matches!(got, Err(HandshakeError::Decrypt)), "byte {i}");
        }
        // Another key than the one the initiation names: its timestamp
        // does not open with that key's static-static secret.
        let c_sees_b = PeerKey::new(&b, *c.public(), None);
        let opened = receive_initiation(&b, &init).expect("opens");
        assert_eq!(opened.peer_public, *a.public());
        assert!(matches!(opened.from_peer(&c_sees_b), Err(HandshakeError::Decrypt)), "not from c");
        // A peer key of small order is refused on both sides.
        let weak = PeerKey::new(&a, [0; KEY_LEN], None);
        assert!(matches!(initiate(&a, &weak, 1, ts, None, &mut rng), Err(HandshakeError::WeakKey)));
        let opened = receive_initiation(&b, &init).expect("opens");
        assert!(matches!(opened.from_peer(&PeerKey::new(&b, [0; KEY_LEN], None)), Err(HandshakeError::WeakKey)));
        // The right responder with the wrong pre-shared key.
        let b_sees_a = PeerKey::new(&b, *a.public(), Some([9; 32]));
        let got = receive_initiation(&b, &init).expect("opens").from_peer(&b_sees_a).expect("from a");
        let (resp, _) = respond(got, &b_sees_a, 2, None, &mut rng).expect("response");
        assert!(matches!(receive_response(&a, &state, &a_sees_b, &resp), Err(HandshakeError::Decrypt)));
    }

    #[test]
    fn timestamps_grow_with_time() {
        let t1 = tai64n(std::time::Duration::new(100, 5));
        let t2 = tai64n(std::time::Duration::new(100, 6));
        let t3 = tai64n(std::time::Duration::new(101, 0));
        assert!(t1 < t2 && t2 < t3);
        assert_eq!(&t1[..8], &(0x4000_0000_0000_000a_u64 + 100).to_be_bytes());
    }
}
