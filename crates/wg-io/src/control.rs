//! The control thread of an interface: the handshake messages the
//! workers queue for it, the protocol's timers, and the peers' endpoint
//! names resolved again while their handshakes fail.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use gatehouse_wg::device::PeerId;

use crate::shared::{HANDSHAKE_QUEUE, HandshakeQueue, Shared, resolve_endpoint};
use crate::worker::send_all;

/// How often the control thread runs the protocol's timers.
const TICK: Duration = Duration::from_millis(100);
/// A named endpoint is resolved again this often while the peer has not
/// completed a handshake for [`RESOLVE_AFTER`].
const RESOLVE_EVERY: Duration = Duration::from_secs(30);
const RESOLVE_AFTER: Duration = Duration::from_secs(135);

/// The control thread: handshake messages from the workers, the timers,
/// endpoint names resolved again.
pub(crate) fn run(sh: Arc<Shared>, rx: HandshakeQueue) {
    let counters = &sh.counters[sh.counters.len() - 1];
    let Some(socket) = sh.sockets.first().cloned() else { return };
    let mut out = Vec::new();
    let mut last_tick = Instant::now();
    while !sh.stop.load(Ordering::Relaxed) {
        let wait = TICK.saturating_sub(last_tick.elapsed());
        match rx.recv_timeout(wait) {
            Ok(_) if sh.stop.load(Ordering::Relaxed) => return,
            Ok((datagram, src, local)) => {
                let backlog = sh.queued.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
                let mut dev = sh.device();
                dev.set_under_load(backlog >= HANDSHAKE_QUEUE / 8);
                if let gatehouse_wg::device::Inbound::Done(gatehouse_wg::device::Received::Dropped(d)) =
                    dev.plan_open(&datagram, src, Instant::now(), &mut out)
                {
                    counters.drop(d);
                }
                drop(dev);
                // A handshake that went through (a response to send, or
                // data after a response) proves the source: later replies
                // leave from the address it reached. A cookie reply proves
                // nothing.
                if out.iter().any(|t| t.to == src && matches!(t.datagram.first(), Some(2 | 4))) {
                    sh.sticky.learn(src, local);
                }
                send_all(&sh, &socket, &mut out, counters);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        }
        if last_tick.elapsed() >= TICK {
            last_tick = Instant::now();
            let dropped = sh.device().tick(last_tick, &mut out);
            for (_, d) in dropped {
                counters.drop(d);
            }
            send_all(&sh, &socket, &mut out, counters);
            resolve_again(&sh, last_tick);
            sh.refresh_router(false);
        }
    }
}

/// Named endpoints of peers not heard from lately, resolved again.
fn resolve_again(sh: &Shared, now: Instant) {
    let due: Vec<(PeerId, String)> = sh
        .meta()
        .iter_mut()
        .filter(|(_, m)| m.endpoint.as_deref().is_some_and(|e| e.parse::<SocketAddr>().is_err()))
        .filter(|(_, m)| m.last_resolved.is_none_or(|t| now.saturating_duration_since(t) >= RESOLVE_EVERY))
        .map(|(id, m)| {
            m.last_resolved = Some(now);
            (*id, m.endpoint.clone().unwrap_or_default())
        })
        .collect();
    for (id, name) in due {
        let quiet = sh.device().last_handshake(id).is_none_or(|t| now.saturating_duration_since(t) >= RESOLVE_AFTER);
        if quiet && let Some(addr) = resolve_endpoint(&name) {
            sh.device().set_endpoint(id, addr);
        }
    }
}
