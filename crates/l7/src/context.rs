//! What a connection can reach of its worker: the live snapshot, the
//! access log, the counters, the drain signal (all workers share these),
//! and the worker's own idle upstream connections.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::accesslog::AccessLog;
use crate::metrics::Metrics;
use crate::snapshot::Snapshot;
use crate::upstream::connect::ConnPool;

/// What every worker shares: the live snapshot and the state that outlives it.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub access_log: AccessLog,
    /// Counters, per worker (open connections among them, for the drain).
    pub metrics: Metrics,
    /// Set once when the process drains: every connection finishes what it
    /// is doing and closes.
    pub draining: tokio::sync::watch::Sender<bool>,
    /// Woken when the process drains, one per worker: an idle HTTP/1
    /// connection waits on its worker's, 64 bytes instead of a watch
    /// receiver's wait (see [`Shared::drained`]).
    pub drain_wake: Box<[tokio::sync::Notify]>,
}

impl Shared {
    pub fn new(snapshot: Snapshot, access_log: AccessLog, workers: usize) -> Shared {
        Shared {
            snapshot: ArcSwap::from_pointee(snapshot),
            access_log,
            metrics: Metrics::new(workers),
            draining: tokio::sync::watch::Sender::new(false),
            drain_wake: (0..workers.max(1)).map(|_| tokio::sync::Notify::new()).collect(),
        }
    }

    pub fn is_draining(&self) -> bool {
        *self.draining.borrow()
    }

    /// Completes once the process drains, for a connection on `worker`.
    /// Make it before asking [`Shared::is_draining`]: a drain between the
    /// two then completes it.
    pub fn drained(&self, worker: usize) -> tokio::sync::futures::Notified<'_> {
        self.drain_wake[worker % self.drain_wake.len()].notified()
    }

    /// Starts the drain: every connection finishes what it is doing and
    /// closes.
    pub fn drain(&self) {
        self.draining.send_replace(true);
        for wake in &self.drain_wake {
            wake.notify_waiters();
        }
    }
}

/// One worker thread's state: what a connection on it can reach.
pub struct Worker {
    pub id: usize,
    pub shared: Arc<Shared>,
    /// Idle upstream connections of this worker.
    pub conns: Arc<ConnPool>,
}
