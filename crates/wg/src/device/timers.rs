//! The protocol's timers (whitepaper section 6): handshake retries and
//! giving up, keepalives, a new handshake when data goes unanswered, keys
//! forgotten when long unused. Time is an argument: the caller runs
//! [`Device::tick`] at least every second or so.

use std::time::{Duration, Instant};

use super::{Device, DropReason, PeerId, Transmit};

pub const REKEY_AFTER_TIME: Duration = Duration::from_secs(120);
pub const REJECT_AFTER_TIME: Duration = Duration::from_secs(180);
pub const REKEY_ATTEMPT_TIME: Duration = Duration::from_secs(90);
pub const REKEY_TIMEOUT: Duration = Duration::from_secs(5);
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Initiations from one peer closer together than this are dropped.
pub const INITIATION_MIN_INTERVAL: Duration = Duration::from_millis(20);
/// Packets kept per peer while its handshake runs.
pub const QUEUE_LEN: usize = 256;

impl<R: rand_core::CryptoRngCore> Device<R> {
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
