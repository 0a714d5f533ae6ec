//! Live sessions handed from one process to the next in a binary upgrade:
//! every peer's keypairs, counters, endpoint and last handshake, written
//! in `crate::handoff`'s byte format and read back by a device with the
//! same private key, so that tunnels carry on without a handshake.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::{Device, Peer, REJECT_AFTER_TIME, Slot, Timed};
use crate::crypto::KEY_LEN;
use crate::handshake::TIMESTAMP_LEN;
use crate::transport::Keypair;

/// Opens an export of sessions ([`Device::export_sessions`]).
const HANDOFF_MAGIC: [u8; 4] = *b"GHW1";
/// How far an imported keypair's sending counter moves on: the receiver's
/// window takes a jump, and no counter is ever used twice with one key.
pub(super) const HANDOFF_COUNTER_SKIP: u64 = 1 << 16;

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
