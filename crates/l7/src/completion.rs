//! What is known about a request as it goes, and what ends it: when its
//! response body ends or is dropped, the request is counted (route and
//! upstream metrics), its endpoint's in-flight count drops, and its access
//! log line is written.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use gatehouse_plane::health::EndpointHealth;

use crate::accesslog::{LogRecord, reason};
use crate::downstream::conn::ConnState;
use crate::snapshot::Snapshot;

/// What is known about a request as it goes; becomes its log line.
pub struct Exchange {
    /// Whether an access log line will be written: what only the log needs
    /// (times, names) is recorded only then.
    pub logging: bool,
    pub start: Instant,
    pub time: Option<SystemTime>,
    pub method: String,
    pub path: String,
    pub protocol: &'static str,
    pub host: String,
    pub route: Option<Arc<str>>,
    pub upstream: Option<Arc<str>>,
    pub endpoint: Option<(SocketAddr, Arc<EndpointHealth>)>,
    pub upstream_start: Option<Instant>,
    pub upstream_elapsed: Option<Duration>,
    /// Indexes into the request's snapshot, for the metrics.
    pub route_idx: Option<usize>,
    pub pool_idx: Option<usize>,
    pub bytes_in: Option<Arc<AtomicU64>>,
    pub reason: &'static str,
}

/// Finishes an exchange when its response body ends or is dropped.
pub struct Completion {
    pub ex: Exchange,
    pub status: u16,
    pub conn: Arc<ConnState>,
    pub snap: Arc<Snapshot>,
}

impl Completion {
    pub fn upstream_aborted(&mut self) {
        self.ex.reason = reason::UPSTREAM_ABORTED;
    }

    pub fn finish(mut self, bytes_out: u64, complete: bool) {
        self.conn.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some((_, h)) = &self.ex.endpoint {
            h.request_ended(self.conn.worker.id);
        }
        if !complete && self.ex.reason == reason::OK {
            self.ex.reason = reason::CLIENT_ABORTED;
        }
        let c = &self.conn;
        let elapsed = self.ex.start.elapsed();
        let worker = c.worker.id;
        match self.ex.route_idx.and_then(|i| self.snap.routes.get(i)) {
            Some(r) => r.metrics.record(worker, self.status, elapsed),
            None => c.worker.shared.metrics.unrouted.record(worker, self.status, elapsed),
        }
        if let (Some(d), Some(u)) =
            (self.ex.upstream_elapsed, self.ex.pool_idx.and_then(|i| self.snap.upstreams.get(i)))
        {
            u.metrics.record(worker, d);
        }
        let log = &c.worker.shared.access_log;
        if !log.is_on() {
            return;
        }
        let ex = self.ex;
        log.send(LogRecord {
            time: ex.time.unwrap_or_else(SystemTime::now),
            client: c.client,
            listener: c.listener_name.clone(),
            method: ex.method,
            host: ex.host,
            path: ex.path,
            protocol: ex.protocol,
            status: self.status,
            bytes_in: ex.bytes_in.map_or(0, |b| b.load(Ordering::Relaxed)),
            bytes_out,
            duration_ms: elapsed.as_secs_f64() * 1000.0,
            upstream_ms: ex.upstream_elapsed.map(|d| d.as_secs_f64() * 1000.0),
            route: ex.route,
            upstream: ex.upstream,
            endpoint: ex.endpoint.map(|(a, _)| a),
            tls_version: c.tls.map(|t| t.0),
            tls_cipher: c.tls.map(|t| t.1),
            reason: ex.reason,
        });
    }
}
