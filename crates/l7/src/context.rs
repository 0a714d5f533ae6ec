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
}

/// One worker thread's state: what a connection on it can reach.
pub struct Worker {
    pub id: usize,
    pub shared: Arc<Shared>,
    /// Idle upstream connections of this worker.
    pub conns: Arc<ConnPool>,
}
