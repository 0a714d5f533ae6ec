//! Lazily re-armed deadlines.
//!
//! Resetting a tokio timer touches the timer wheel; doing it per request
//! shows up in instruction counts. Instead a long-lived `Sleep` stays armed
//! at or before the real deadline: moving the deadline later is a field
//! write, and a timer that fires early is re-armed for the deadline then.
//! Used by the client connection wrapper (head and idle timeouts) and the
//! upstream HTTP/1.1 client (response timeout).

use std::pin::Pin;
use std::task::Context;

use tokio::time::{Instant, Sleep};

/// Moves the deadline; touches the timer only if it must fire sooner.
pub fn set_deadline(timer: Pin<&mut Sleep>, deadline: &mut Instant, new: Instant) {
    *deadline = new;
    if new < timer.deadline() {
        timer.reset(new);
    }
}

/// Whether `deadline` has passed. A timer that fires before it (armed for
/// an earlier, since moved deadline) is re-armed for it, which also
/// registers the waker.
pub fn expired(mut timer: Pin<&mut Sleep>, deadline: Instant, cx: &mut Context<'_>) -> bool {
    while timer.as_mut().poll(cx).is_ready() {
        if Instant::now() >= deadline {
            return true;
        }
        timer.as_mut().reset(deadline);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_moved_deadline_fires_late_and_an_earlier_one_fires_early() {
        let start = Instant::now();
        let mut timer = Box::pin(tokio::time::sleep_until(start + Duration::from_secs(10)));
        let mut deadline = start + Duration::from_secs(10);
        // Later: the timer is left alone, fires at 10 s, is re-armed for 20 s.
        set_deadline(timer.as_mut(), &mut deadline, start + Duration::from_secs(20));
        assert_eq!(timer.deadline(), start + Duration::from_secs(10));
        std::future::poll_fn(|cx| {
            if expired(timer.as_mut(), deadline, cx) { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }
        })
        .await;
        assert_eq!(Instant::now(), start + Duration::from_secs(20));
        // Sooner than the timer is armed for: it is reset at once.
        set_deadline(timer.as_mut(), &mut deadline, start + Duration::from_secs(60));
        assert_eq!(timer.deadline(), start + Duration::from_secs(20));
        set_deadline(timer.as_mut(), &mut deadline, start + Duration::from_secs(5));
        assert_eq!(timer.deadline(), start + Duration::from_secs(5));
        assert_eq!(deadline, start + Duration::from_secs(5));
    }
}
