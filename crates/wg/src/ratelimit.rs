//! Handshake rate limits: a token bucket per source address, applied to
//! handshake messages that proved their address (a valid mac2) while the
//! device is under load, and the measure of load itself (handshake
//! messages per second). A source sending faster than its bucket refills
//! is dropped; forged sources cannot spend another's tokens, since their
//! mac2 would not be valid.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Handshake messages a source may send per second under load.
pub const PER_SOURCE_PER_SECOND: u32 = 20;
/// How many it may send at once.
pub const PER_SOURCE_BURST: u32 = 5;
/// Handshake messages per second above which the device is under load.
pub const UNDER_LOAD_PER_SECOND: u32 = 1_000;
/// Sources whose bucket refilled are forgotten this often.
const SWEEP: Duration = Duration::from_secs(1);

/// A source's tokens, in units of 1/PER_SOURCE_PER_SECOND s.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
struct Bucket {
    tokens: u64,
    at: Instant,
}

/// Per-source buckets and the device's handshake rate.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct HandshakeLimiter {
    buckets: HashMap<IpAddr, Bucket>,
    last_sweep: Instant,
    /// Handshake messages counted in the current second, and its start.
    window: (u32, Instant),
    /// The count of the second before.
    previous: u32,
}

/// The cost of one message, in nanoseconds of refill.
const COST_NS: u64 = 1_000_000_000 / PER_SOURCE_PER_SECOND as u64;
const MAX_NS: u64 = COST_NS * PER_SOURCE_BURST as u64;

impl HandshakeLimiter {
    pub fn new(now: Instant) -> Self {
        HandshakeLimiter { buckets: HashMap::new(), last_sweep: now, window: (0, now), previous: 0 }
    }

    /// Counts one handshake message toward the device's rate.
    pub fn count(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.window.1);
        if elapsed >= Duration::from_secs(1) {
            self.previous = if elapsed >= Duration::from_secs(2) { 0 } else { self.window.0 };
            self.window = (0, now);
        }
        self.window.0 = self.window.0.saturating_add(1);
    }

    /// Whether handshake messages arrive faster than the device should
    /// answer without cookies.
    pub fn under_load(&self) -> bool {
        self.window.0.max(self.previous) > UNDER_LOAD_PER_SECOND
    }

    /// Whether `src` may have one more handshake message answered.
    pub fn admit(&mut self, src: IpAddr, now: Instant) -> bool {
        if now.saturating_duration_since(self.last_sweep) >= SWEEP {
            self.last_sweep = now;
            self.buckets.retain(|_, b| now.saturating_duration_since(b.at).as_nanos() < u128::from(MAX_NS));
        }
        let b = self.buckets.entry(src).or_insert(Bucket { tokens: MAX_NS, at: now });
        let refill = u64::try_from(now.saturating_duration_since(b.at).as_nanos()).unwrap_or(u64::MAX);
        b.tokens = b.tokens.saturating_add(refill).min(MAX_NS);
        b.at = now;
        if b.tokens >= COST_NS {
            b.tokens -= COST_NS;
            true
        } else {
            false
        }
    }

    /// Sources tracked (for the tests and the status page).
    pub fn sources(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::new(t0);
        let a: IpAddr = "192.0.2.1".parse().expect("ip");
        let b: IpAddr = "192.0.2.2".parse().expect("ip");
        let burst = (0..10).filter(|_| l.admit(a, t0)).count();
        assert_eq!(burst, PER_SOURCE_BURST as usize);
        assert!(l.admit(b, t0), "another source has its own bucket");
        // Over ten seconds at 100 messages a second, 20 a second get through.
        let mut admitted = 0;
        for i in 1..=1000u64 {
            if l.admit(a, t0 + Duration::from_millis(i * 10)) {
                admitted += 1;
            }
        }
        assert!((199..=201).contains(&admitted), "{admitted}");
        // Idle sources are forgotten.
        l.admit(a, t0 + Duration::from_secs(60));
        assert_eq!(l.sources(), 1);
    }

    #[test]
    fn load_is_a_rate_over_the_last_second() {
        let t0 = Instant::now();
        let mut l = HandshakeLimiter::new(t0);
        for _ in 0..UNDER_LOAD_PER_SECOND {
            l.count(t0);
        }
        assert!(!l.under_load());
        l.count(t0 + Duration::from_millis(500));
        assert!(l.under_load());
        l.count(t0 + Duration::from_millis(1_500));
        assert!(l.under_load(), "the last full second still counts");
        l.count(t0 + Duration::from_millis(3_600));
        assert!(!l.under_load(), "after a quiet second, not any more");
    }
}
