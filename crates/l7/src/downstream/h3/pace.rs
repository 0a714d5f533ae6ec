//! Pacing (RFC 9002 7.7): a connection's packets leave spread over the
//! round trip at a little more than the congestion window's rate, not as
//! one burst of the whole window.
//!
//! quiche's CUBIC gives every packet "now" as its send time, so without
//! this a connection that has been waiting (for its upstream, for the
//! client's next request) sends all its window at once. Through a router
//! with a small buffer the end of such a burst is lost; through a larger
//! one the burst's own queueing delay looks like congestion to HyStart++,
//! which leaves slow start long before the window fills the path. The
//! rate, the burst and the 1 ms floor on a wait are quic-go's (and its
//! gains are Linux TCP's): twice the window per round trip in slow start,
//! so that the rate can double as the window does, and the RFC's N = 1.25
//! after; a token bucket that holds at most ten packets or two
//! milliseconds of the rate (a wait and the timer's granularity),
//! whichever is more.
//!
//! On a path with a round trip of well under a millisecond (a data
//! centre, loopback) the bucket holds more than the window and nothing
//! waits.

use std::time::{Duration, Instant};

/// RFC 9002's N: a little faster than the window per round trip, so that
/// a window still fills the path when ACKs come unevenly.
const GAIN: f64 = 1.25;
/// In slow start the window doubles each round trip, and so may the rate.
const SLOW_START_GAIN: f64 = 2.0;

/// The bucket holds at least this many full packets.
const BURST_PACKETS: u64 = 10;

/// No wait shorter than this: the runtime's timers tick in milliseconds,
/// and a millisecond's packets leave together instead.
const MIN_WAIT: Duration = Duration::from_millis(1);
/// The bucket holds this long of the rate: a wait, and a timer that fires
/// up to a millisecond late.
const BURST_TIME: Duration = Duration::from_millis(2);

/// What the congestion controller says of the path now.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Smoothed round-trip time; `None` before the first sample, when
    /// nothing is paced (the window is the initial one, which may go at
    /// once).
    pub srtt: Option<Duration>,
    /// The largest packet the path takes.
    pub mtu: u64,
    /// Whether the controller is still in its first slow start.
    pub slow_start: bool,
}

// The pacer runs before and after every packet a connection sends: its
// sums are in f64, where the 128-bit integer divisions they were in cost
// about 0.5% of a 64 KiB HTTP/3 response's CPU (Intel Xeon, perf record). A
// pacing rate needs no more precision than a double's 53 bits.
impl Window {
    /// Bytes per second, with the gain; `None`: no pacing.
    fn rate(&self) -> Option<f64> {
        let rtt = self.srtt?.as_secs_f64();
        if rtt <= 0.0 {
            return None;
        }
        let gain = if self.slow_start { SLOW_START_GAIN } else { GAIN };
        Some((self.cwnd as f64 * gain / rtt).max(1.0))
    }

    fn burst(&self, rate: f64) -> u64 {
        // `as` saturates: a rate too fast to count is a bucket too big to.
        (self.mtu * BURST_PACKETS).max((rate * BURST_TIME.as_secs_f64()) as u64)
    }
}

/// A connection's token bucket.
#[derive(Debug, Default)]
pub struct Pacer {
    /// Bytes that could leave at `at`; `None` until the first packet, when
    /// the bucket is full.
    budget: Option<(u64, Instant)>,
}

impl Pacer {
    /// When the next full-sized packet may leave; `None`: now.
    pub fn wait_until(&self, w: &Window, now: Instant) -> Option<Instant> {
        let rate = w.rate()?;
        let (budget, at) = self.budget?;
        let budget = refill(budget, at, now, rate, w.burst(rate));
        if budget >= w.mtu {
            return None;
        }
        // The rate is a byte a second or more: the wait is at most a
        // packet's length in seconds.
        let wait = Duration::from_nanos(((w.mtu - budget) as f64 * 1e9 / rate) as u64 + 1);
        Some(now + wait.max(MIN_WAIT))
    }

    /// `bytes` left at `now`.
    pub fn on_sent(&mut self, w: &Window, now: Instant, bytes: u64) {
        let Some(rate) = w.rate() else {
            self.budget = None;
            return;
        };
        let burst = w.burst(rate);
        let budget = match self.budget {
            Some((b, at)) => refill(b, at, now, rate, burst),
            None => burst,
        };
        self.budget = Some((budget.saturating_sub(bytes), now));
    }
}

/// The budget `b` of time `at`, grown at `rate` until `now`, at most `burst`.
fn refill(b: u64, at: Instant, now: Instant, rate: f64, burst: u64) -> u64 {
    let grown = (rate * now.saturating_duration_since(at).as_secs_f64()) as u64;
    b.saturating_add(grown).min(burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u64 = 1452;

    fn window(cwnd_packets: u64, rtt_ms: u64) -> Window {
        Window { cwnd: cwnd_packets * MTU, srtt: Some(Duration::from_millis(rtt_ms)), mtu: MTU, slow_start: false }
    }

    /// Sends full packets at `now` while the pacer lets them; how many.
    fn burst(p: &mut Pacer, w: &Window, now: Instant) -> u64 {
        let mut n = 0;
        while p.wait_until(w, now).is_none() {
            p.on_sent(w, now, MTU);
            n += 1;
            assert!(n < 100_000, "the pacer never stops");
        }
        n
    }

    /// From `now`, sends whenever the pacer lets it while `more(sent,
    /// elapsed)`; what was sent and when the pacer would let the next go.
    fn send_paced(p: &mut Pacer, w: &Window, now: Instant, more: impl Fn(u64, Duration) -> bool) -> (u64, Instant) {
        let (t0, mut now, mut sent) = (now, now, 0);
        loop {
            sent += burst(p, w, now);
            now = p.wait_until(w, now).expect("paced");
            if !more(sent, now - t0) {
                return (sent, now);
            }
        }
    }

    #[test]
    fn a_window_leaves_over_its_round_trip_not_at_once() {
        // 200 packets a 40 ms round trip: 1.25 x 200 / 40 ms = 6.25 a ms.
        let w = window(200, 40);
        let mut p = Pacer::default();
        let t0 = Instant::now();
        // At first a burst: 12 packets (two milliseconds' 12.5).
        assert_eq!(burst(&mut p, &w, t0), 12);
        let next = p.wait_until(&w, t0).expect("the bucket is empty");
        assert!(next - t0 >= MIN_WAIT, "{:?}", next - t0);
        assert!(next - t0 <= Duration::from_millis(2), "{:?}", next - t0);
        // Sending whenever allowed, the window takes 0.8 of a round trip.
        let (_, end) = send_paced(&mut p, &w, next, |sent, _| 12 + sent < 200);
        let took = end - t0;
        assert!(took >= Duration::from_millis(28) && took <= Duration::from_millis(36), "{took:?}");
    }

    #[test]
    fn an_idle_connection_gets_one_burst_not_its_window() {
        let w = window(200, 40);
        let mut p = Pacer::default();
        let t0 = Instant::now();
        burst(&mut p, &w, t0);
        // A second of silence refills the bucket to its cap only.
        let later = t0 + Duration::from_secs(1);
        assert_eq!(burst(&mut p, &w, later), 12);
    }

    #[test]
    fn a_fast_path_is_not_held_back() {
        // 100 us round trip: a millisecond's rate is far more than the window.
        let w = Window { cwnd: 200 * MTU, srtt: Some(Duration::from_micros(100)), mtu: MTU, slow_start: false };
        let mut p = Pacer::default();
        let now = Instant::now();
        assert!(burst(&mut p, &w, now) >= 2000);
        // Before an RTT sample nothing is paced at all.
        let w = Window { cwnd: 10 * MTU, srtt: None, mtu: MTU, slow_start: true };
        let mut p = Pacer::default();
        for _ in 0..1000 {
            assert_eq!(p.wait_until(&w, now), None);
            p.on_sent(&w, now, MTU);
        }
    }

    #[test]
    fn small_packets_cost_what_they_weigh() {
        // Two milliseconds at 1.25 x 100 / 40 ms are 6.25 packets: the
        // bucket holds ten.
        let w = window(100, 40);
        let mut p = Pacer::default();
        let now = Instant::now();
        // Acknowledgements of 50 bytes: the bucket's 14,520 bytes take 262.
        let mut n = 0;
        while p.wait_until(&w, now).is_none() {
            p.on_sent(&w, now, 50);
            n += 1;
        }
        assert_eq!(n, (10 * MTU - MTU) / 50 + 1);
    }

    #[test]
    fn slow_start_may_double_the_rate() {
        // 100 packets a 40 ms round trip: 2 x 100 / 40 ms = 5 a ms in slow
        // start, 1.25 x 100 / 40 = 3.125 after.
        let t0 = Instant::now();
        let sent_in = |slow_start: bool| {
            let w = Window { slow_start, ..window(100, 40) };
            let (sent, _) =
                send_paced(&mut Pacer::default(), &w, t0, |_, elapsed| elapsed <= Duration::from_millis(40));
            sent
        };
        let (slow, after) = (sent_in(true), sent_in(false));
        assert!((200..=215).contains(&slow), "{slow}");
        assert!((125..=140).contains(&after), "{after}");
    }

    #[test]
    fn the_wait_follows_the_rate() {
        // 20 packets a 100 ms round trip: 0.25 packets a ms, a packet
        // every 4 ms.
        let w = window(20, 100);
        let mut p = Pacer::default();
        let t0 = Instant::now();
        burst(&mut p, &w, t0);
        let wait = p.wait_until(&w, t0).expect("paced") - t0;
        assert!(wait >= Duration::from_millis(3) && wait <= Duration::from_millis(5), "{wait:?}");
    }
}
