//! What a connection tells the listener's metrics about its transport:
//! quiche's packet and byte counters, reported once a second while the
//! connection lives and once more when it ends, and how it ended.

use std::time::{Duration, Instant};

use super::Conn;
use crate::h3::frame::code;
use crate::metrics::{QuicClose, QuicCounts};

/// How often a live connection adds its counters to the listener's.
const REPORT_EVERY: Duration = Duration::from_secs(1);

impl Conn {
    /// Adds what quiche counted since the last report to the listener's
    /// metrics, at most once per [`REPORT_EVERY`].
    pub(super) fn report(&mut self) {
        if self.reported_at.elapsed() < REPORT_EVERY {
            return;
        }
        self.reported_at = Instant::now();
        let delta = self.counted_since_report();
        if delta.iter().any(|n| *n > 0)
            && let Some(l) = self.listener_metrics()
        {
            l.quic(self.worker.id, &delta);
        }
    }

    /// The last report, and how the connection ended.
    pub(super) fn report_close(&mut self) {
        let delta = self.counted_since_report();
        let error = |e: &quiche::ConnectionError| (e.is_app, e.error_code);
        let why = close_reason(
            self.quic.is_timed_out(),
            self.quic.local_error().map(error),
            self.quic.peer_error().map(error),
        );
        if let Some(l) = self.listener_metrics() {
            l.quic(self.worker.id, &delta);
            l.quic_closed(self.worker.id, why);
        }
    }

    /// quiche's counters since the last call, in `QUIC_SERIES`'s order.
    fn counted_since_report(&mut self) -> QuicCounts {
        let st = self.quic.stats();
        let now = [st.sent as u64, st.recv as u64, st.sent_bytes, st.recv_bytes, st.lost as u64, st.retrans as u64];
        let delta = since(&now, &self.reported);
        self.reported = now;
        delta
    }
}

/// What was counted since `before` (quiche's counters only grow).
fn since(now: &QuicCounts, before: &QuicCounts) -> QuicCounts {
    std::array::from_fn(|i| now[i].saturating_sub(before[i]))
}

/// How a connection ended, from whether its idle timer fired and the
/// (application?, code) each side closed it with.
fn close_reason(timed_out: bool, local: Option<(bool, u64)>, peer: Option<(bool, u64)>) -> QuicClose {
    // The transport's NO_ERROR; in HTTP/3's space any code but its errors
    // (0x101-0x110) and QPACK's (0x200-0x202): an unknown one counts as
    // H3_NO_ERROR (RFC 9114 8.1 and 9), as aioquic's plain close, code 0,
    // and the reserved codes clients send to test that.
    let clean = |(app, c): (bool, u64)| {
        if app { !(code::NO_ERROR + 1..=0x110).contains(&c) && !(0x200..=0x202).contains(&c) } else { c == 0 }
    };
    match (timed_out, local, peer) {
        (true, _, _) => QuicClose::IdleTimeout,
        (false, Some(e), _) if clean(e) => QuicClose::Closed,
        (false, Some(_), _) => QuicClose::Error,
        (false, None, Some(e)) if clean(e) => QuicClose::PeerClosed,
        (false, None, Some(_)) => QuicClose::PeerError,
        (false, None, None) => QuicClose::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_end_is_named_by_who_closed_and_with_what() {
        assert_eq!(close_reason(true, None, None), QuicClose::IdleTimeout);
        // A drain's GOAWAY and close: H3_NO_ERROR.
        assert_eq!(close_reason(false, Some((true, 0x100)), None), QuicClose::Closed);
        // A close before HTTP/3 started: the transport's NO_ERROR.
        assert_eq!(close_reason(false, Some((false, 0)), None), QuicClose::Closed);
        // H3_FRAME_UNEXPECTED from Gatehouse; STREAM_LIMIT_ERROR from quiche.
        assert_eq!(close_reason(false, Some((true, 0x105)), None), QuicClose::Error);
        assert_eq!(close_reason(false, Some((false, 0x4)), None), QuicClose::Error);
        // An HTTP/3 code it does not define is H3_NO_ERROR; a QPACK error is not.
        assert_eq!(close_reason(false, None, Some((true, 0))), QuicClose::PeerClosed);
        assert_eq!(close_reason(false, None, Some((true, 0x21))), QuicClose::PeerClosed);
        assert_eq!(close_reason(false, Some((true, 0x201)), None), QuicClose::Error);
        assert_eq!(close_reason(false, None, Some((true, 0x100))), QuicClose::PeerClosed);
        assert_eq!(close_reason(false, None, Some((true, 0x10c))), QuicClose::PeerError);
        assert_eq!(close_reason(false, None, Some((false, 0x0a))), QuicClose::PeerError);
        assert_eq!(close_reason(false, None, None), QuicClose::Other);
    }

    #[test]
    fn a_report_adds_only_what_came_since_the_last() {
        // Sent and received packets, bytes, lost, retransmitted.
        let a: QuicCounts = [10, 4, 12_000, 300, 1, 1];
        let b: QuicCounts = [25, 9, 30_000, 700, 1, 2];
        let d = since(&b, &a);
        assert_eq!(d, [15, 5, 18_000, 400, 0, 1]);
        assert_eq!(since(&a, &a), [0; 6]);
    }
}
