//! Transport data: one session's keys sealing packets with a counter as the
//! nonce, and opening them behind a replay window (RFC 6479).

use crate::crypto::{self, Key, TAG_LEN};
use crate::handshake::Session;
use crate::messages::{self, transport};

/// After this many messages a session sends no more (2^64 - 2^13 - 1).
pub const REJECT_AFTER_MESSAGES: u64 = u64::MAX - (1 << 13);
/// After this many messages a new handshake is started (2^60).
pub const REKEY_AFTER_MESSAGES: u64 = 1 << 60;

/// Bits in the replay bitmap; the window is one word less (RFC 6479).
const WINDOW_BITS: u64 = 8192;
const WORDS: usize = (WINDOW_BITS / 64) as usize;
/// How far behind the highest counter a packet may be.
pub const WINDOW: u64 = WINDOW_BITS - 64;

/// Counters seen, the way RFC 6479 keeps them: a ring of 64-bit words, the
/// words ahead of the highest counter cleared as it moves.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct ReplayWindow {
    bits: [u64; WORDS],
    /// The highest counter accepted plus one (0: none yet).
    next: u64,
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow { bits: [0; WORDS], next: 0 }
    }
}

impl ReplayWindow {
    /// Whether `counter` may be accepted (not seen, not too old); does not
    /// record it (call [`ReplayWindow::accept`] once the packet opened).
    pub fn check(&self, counter: u64) -> bool {
        if counter >= REJECT_AFTER_MESSAGES {
            return false;
        }
        if counter >= self.next {
            return true;
        }
        if self.next - counter > WINDOW {
            return false;
        }
        let (word, bit) = ((counter / 64) as usize % WORDS, counter % 64);
        self.bits[word] & (1 << bit) == 0
    }

    /// Records `counter`; false if it was a replay or too old.
    pub fn accept(&mut self, counter: u64) -> bool {
        if !self.check(counter) {
            return false;
        }
        if counter >= self.next {
            // Clear the words the window moves into, after the highest
            // counter's word (at most the whole ring).
            let to = counter / 64;
            let from = if self.next == 0 { to } else { (self.next - 1) / 64 };
            for k in 0..(to - from).min(WORDS as u64) {
                self.bits[((to - k) % WORDS as u64) as usize] = 0;
            }
            self.next = counter + 1;
        }
        let (word, bit) = ((counter / 64) as usize % WORDS, counter % 64);
        self.bits[word] |= 1 << bit;
        true
    }
}

/// Why a transport message was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportError {
    /// It did not open with this session's key.
    Decrypt,
    /// Its counter was seen already or is behind the window.
    Replay,
    /// This session has sent all it may: a new handshake is needed.
    Exhausted,
}

/// One session's keys and counters.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct Keypair {
    pub local: u32,
    pub remote: u32,
    send: Key,
    recv: Key,
    next_send: u64,
    replay: ReplayWindow,
    pub initiator: bool,
}

impl From<Session> for Keypair {
    fn from(s: Session) -> Keypair {
        Keypair {
            local: s.local,
            remote: s.remote,
            send: s.send,
            recv: s.recv,
            next_send: 0,
            replay: ReplayWindow::default(),
            initiator: s.initiator,
        }
    }
}

/// The first 16 bytes of a transport message: type, receiver, counter.
pub fn header(receiver: u32, counter: u64) -> [u8; transport::DATA] {
    let mut h = [0u8; transport::DATA];
    h[0] = messages::TRANSPORT;
    h[transport::RECEIVER..transport::COUNTER].copy_from_slice(&receiver.to_le_bytes());
    h[transport::COUNTER..].copy_from_slice(&counter.to_le_bytes());
    h
}

/// The length a packet is padded to before sealing: a multiple of 16.
pub fn padded_len(packet: usize) -> usize {
    packet.next_multiple_of(16)
}

/// The length a packet is padded to on an interface of `mtu`: a multiple
/// of 16 but never past the MTU (as the kernel and wireguard-go pad), so
/// that a full-sized packet's datagram still fits the path the MTU was
/// chosen for.
pub fn padded_within(packet: usize, mtu: usize) -> usize {
    padded_len(packet).min(mtu.max(packet))
}

impl Keypair {
    /// Messages sent so far.
    pub fn sent(&self) -> u64 {
        self.next_send
    }

    /// Takes the next sending counter, for a packet sealed by the caller
    /// with [`Keypair::send_key`].
    pub fn reserve(&mut self) -> Result<u64, TransportError> {
        if self.next_send >= REJECT_AFTER_MESSAGES {
            return Err(TransportError::Exhausted);
        }
        self.next_send += 1;
        Ok(self.next_send - 1)
    }

    pub fn send_key(&self) -> &Key {
        &self.send
    }

    pub fn recv_key(&self) -> &Key {
        &self.recv
    }

    /// Whether `counter` may still be accepted (before opening).
    pub fn check(&self, counter: u64) -> bool {
        self.replay.check(counter)
    }

    /// Records the counter of a packet that opened; false if it was a
    /// replay after all (two copies opened at once).
    pub fn accept(&mut self, counter: u64) -> bool {
        self.replay.accept(counter)
    }

    /// Seals an IP packet (empty: a keepalive) into a transport message in
    /// `out` (cleared first), padded to a multiple of 16 bytes.
    pub fn seal(&mut self, packet: &[u8], out: &mut Vec<u8>) -> Result<(), TransportError> {
        let counter = self.reserve()?;
        out.clear();
        out.extend_from_slice(&header(self.remote, counter));
        out.extend_from_slice(packet);
        out.resize(transport::DATA + padded_len(packet.len()) + TAG_LEN, 0);
        crypto::seal_fixed(&self.send, counter, &mut out[transport::DATA..], &[]);
        Ok(())
    }

    /// Opens a transport message's sealed part (`sealed`, copied into `out`)
    /// with `counter`; on success `out` holds the padded packet.
    pub fn open(&mut self, counter: u64, sealed: &[u8], out: &mut Vec<u8>) -> Result<(), TransportError> {
        if !self.replay.check(counter) {
            return Err(TransportError::Replay);
        }
        out.clear();
        out.extend_from_slice(sealed);
        crypto::open(&self.recv, counter, out, &[]).map_err(|_| TransportError::Decrypt)?;
        out.truncate(sealed.len() - TAG_LEN);
        // Checked before, recorded only once the packet proved genuine.
        if !self.replay.accept(counter) {
            return Err(TransportError::Replay);
        }
        Ok(())
    }
}

impl Keypair {
    /// Writes the keypair as a binary upgrade hands it on: indexes, keys,
    /// the next sending counter and the whole replay window.
    pub(crate) fn export(&self, out: &mut Vec<u8>) {
        use crate::handoff::{put_u8, put_u32, put_u64};
        put_u32(out, self.local);
        put_u32(out, self.remote);
        out.extend_from_slice(&self.send.0);
        out.extend_from_slice(&self.recv.0);
        put_u64(out, self.next_send);
        put_u64(out, self.replay.next);
        for w in &self.replay.bits {
            put_u64(out, *w);
        }
        put_u8(out, u8::from(self.initiator));
    }

    /// Reads what [`Keypair::export`] wrote. The sending counter goes
    /// `skip` further, so that no counter the previous process may have
    /// taken is used twice with the same key.
    pub(crate) fn import(r: &mut crate::handoff::Reader<'_>, skip: u64) -> Option<Keypair> {
        let local = r.u32()?;
        let remote = r.u32()?;
        let send = Key(r.bytes()?);
        let recv = Key(r.bytes()?);
        let next_send = r.u64()?.saturating_add(skip).min(REJECT_AFTER_MESSAGES);
        let mut replay = ReplayWindow { bits: [0; WORDS], next: r.u64()? };
        for w in &mut replay.bits {
            *w = r.u64()?;
        }
        let initiator = match r.u8()? {
            0 => false,
            1 => true,
            _ => return None,
        };
        Some(Keypair { local, remote, send, recv, next_send, replay, initiator })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_stops_at_the_mtu() {
        assert_eq!(padded_within(20, 1420), 32);
        assert_eq!(padded_within(1420, 1420), 1420, "not 1424: the datagram must fit the path");
        assert_eq!(padded_within(1419, 1420), 1420);
        assert_eq!(padded_within(0, 1420), 0);
    }

    #[test]
    fn replays_and_old_counters_are_refused() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(0));
        assert!(!w.accept(0));
        assert!(w.accept(5));
        assert!(w.accept(3), "late but inside the window");
        assert!(!w.accept(3));
        assert!(w.accept(10_000));
        assert!(!w.check(10_000 - WINDOW - 1), "behind the window");
        assert!(w.check(10_000 - WINDOW + 1));
        assert!(!w.check(REJECT_AFTER_MESSAGES));
    }

    #[test]
    fn the_window_agrees_with_a_set_of_everything_seen() {
        let mut rng = fastrand::Rng::with_seed(17);
        let mut w = ReplayWindow::default();
        let mut seen = std::collections::HashSet::new();
        let mut top = 0u64;
        for _ in 0..200_000 {
            // Mostly near the top, sometimes far ahead, sometimes far behind.
            let c = match rng.u8(..10) {
                0 => top + rng.u64(..20_000),
                1 => top.saturating_sub(rng.u64(..20_000)),
                _ => (top + 100).saturating_sub(rng.u64(..300)),
            };
            let fresh = !seen.contains(&c);
            let want = fresh && (c >= top || top - c <= WINDOW);
            let got = w.accept(c);
            assert_eq!(got, want, "counter {c}, next {top}");
            if got {
                seen.insert(c);
                top = top.max(c + 1);
            }
        }
    }

    fn pair() -> (Keypair, Keypair) {
        let k = |b: u8| Key([b; 32]);
        let a = Session { local: 1, remote: 2, send: k(1), recv: k(2), initiator: true };
        let b = Session { local: 2, remote: 1, send: k(2), recv: k(1), initiator: false };
        (a.into(), b.into())
    }

    #[test]
    fn packets_cross_padded_and_in_any_order() {
        let (mut a, mut b) = pair();
        let mut wire = Vec::new();
        let mut sealed = Vec::new();
        for len in [0usize, 1, 20, 1420] {
            let packet: Vec<u8> = (0..len).map(|i| i as u8).collect();
            a.seal(&packet, &mut wire).expect("seals");
            assert_eq!((wire.len() - transport::MIN_LEN) % 16, 0);
            sealed.push(wire.clone());
        }
        let mut out = Vec::new();
        for (i, msg) in sealed.iter().enumerate().rev() {
            let messages::Message::Transport { receiver, counter, sealed } = messages::parse(msg).expect("parses")
            else {
                panic!("transport")
            };
            assert_eq!((receiver, counter), (2, i as u64));
            b.open(counter, sealed, &mut out).expect("opens");
            assert_eq!(b.open(counter, sealed, &mut Vec::new()), Err(TransportError::Replay));
        }
        assert!(out.is_empty(), "the first packet was empty");
        // A forged packet is refused and does not burn its counter: the
        // genuine one with that counter still opens.
        let (_, mut fresh) = pair();
        let mut forged = sealed[3].clone();
        forged[40] ^= 1;
        let messages::Message::Transport { counter, sealed: bad, .. } = messages::parse(&forged).expect("parses")
        else {
            panic!("transport")
        };
        assert_eq!(fresh.open(counter, bad, &mut out), Err(TransportError::Decrypt));
        let messages::Message::Transport { sealed: good, .. } = messages::parse(&sealed[3]).expect("parses") else {
            panic!("transport")
        };
        fresh.open(counter, good, &mut out).expect("the genuine packet opens");
        assert_eq!(out.len(), 1424, "padded to 16");
    }
}
