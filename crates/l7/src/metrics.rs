//! Counters for `/metrics`, in the Prometheus text format.
//!
//! Every counter a request or connection touches lives in a slot owned by one
//! worker (one cache line or more per worker, `repr(align(64))`), written by
//! that worker alone with a plain load and store, and summed over the workers
//! when scraped: the request path shares no cache line with another worker.
//! The registry maps names to these per-worker tables; a snapshot build picks
//! up the table of each route, upstream and listener by name, so counters
//! carry across reloads and vanish when their object leaves the config.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gatehouse_plane::metrics::Exposition;

/// Upper bounds (seconds) of the latency histogram buckets; then +Inf.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
const LATENCY_BUCKETS_US: [u64; 14] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 5_000_000,
    10_000_000,
];

fn bump(a: &AtomicU64, by: u64) {
    // One writer per slot: load and store, no locked read-modify-write.
    a.store(a.load(Relaxed).wrapping_add(by), Relaxed);
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[derive(Default)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let us = micros(d);
        let i = LATENCY_BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(LATENCY_BUCKETS_US.len());
        bump(&self.buckets[i], 1);
        bump(&self.sum_us, us);
    }
}

/// Summed histogram: per-bucket counts (not cumulative) and the sum.
#[derive(Clone, Default)]
struct HistogramSum {
    buckets: [u64; LATENCY_BUCKETS.len() + 1],
    sum_us: u64,
}

impl HistogramSum {
    fn add(&mut self, h: &Histogram) {
        for (d, s) in self.buckets.iter_mut().zip(&h.buckets) {
            *d += s.load(Relaxed);
        }
        self.sum_us += h.sum_us.load(Relaxed);
    }
}

/// One table per worker, each on its own cache lines.
pub struct PerWorker<T> {
    slots: Box<[T]>,
}

impl<T: Default> PerWorker<T> {
    fn new(workers: usize) -> Self {
        PerWorker { slots: (0..workers.max(1)).map(|_| T::default()).collect() }
    }

    fn get(&self, worker: usize) -> &T {
        &self.slots[worker % self.slots.len()]
    }
}

#[derive(Default)]
#[repr(align(64))]
pub struct RouteSlot {
    /// Responses by status class: 1xx..5xx.
    by_class: [AtomicU64; 5],
    latency: Histogram,
}

/// A route's requests: count by status class and total duration.
pub type RouteMetrics = PerWorker<RouteSlot>;

impl RouteMetrics {
    /// A finished request: its status and the time from its head to the end
    /// of its response.
    pub fn record(&self, worker: usize, status: u16, elapsed: Duration) {
        let s = self.get(worker);
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        bump(&s.by_class[class], 1);
        s.latency.observe(elapsed);
    }
}

#[derive(Default)]
#[repr(align(64))]
pub struct UpstreamSlot {
    latency: Histogram,
    /// Connections opened to the upstream's endpoints.
    opened: AtomicU64,
    /// Requests sent on a connection that was already open.
    reused: AtomicU64,
}

/// An upstream's response times (request sent to response head received)
/// and how its connections were had: opened per request means the pool
/// churns.
pub type UpstreamMetrics = PerWorker<UpstreamSlot>;

impl UpstreamMetrics {
    pub fn record(&self, worker: usize, elapsed: Duration) {
        self.get(worker).latency.observe(elapsed);
    }

    pub fn connection_opened(&self, worker: usize) {
        bump(&self.get(worker).opened, 1);
    }

    pub fn connection_reused(&self, worker: usize) {
        bump(&self.get(worker).reused, 1);
    }
}

/// How a TLS handshake ended.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HandshakeResult {
    Ok,
    Failed,
    Timeout,
}

impl HandshakeResult {
    fn label(self) -> &'static str {
        match self {
            HandshakeResult::Ok => "ok",
            HandshakeResult::Failed => "failed",
            HandshakeResult::Timeout => "timeout",
        }
    }
}

type HandshakeKey = (&'static str, &'static str, HandshakeResult);

#[derive(Default)]
#[repr(align(64))]
pub struct ListenerSlot {
    accepted: AtomicU64,
    closed: AtomicU64,
    /// By (version, cipher, result). Locked once per handshake by its own
    /// worker; only a scrape ever contends.
    handshakes: Mutex<Vec<(HandshakeKey, u64)>>,
    /// QUIC transport counters, by [`QuicCounts`]'s fields.
    quic: [AtomicU64; 6],
    /// QUIC connections closed, by [`QUIC_CLOSE_REASONS`].
    quic_closed: [AtomicU64; 6],
}

/// The QUIC transport counters a connection reports (quiche's `Stats`),
/// in this order: each one's series, and its `direction` label if any.
pub const QUIC_SERIES: [(&str, Option<&str>); 6] = [
    ("gatehouse_quic_packets_total", Some("sent")),
    ("gatehouse_quic_packets_total", Some("received")),
    ("gatehouse_quic_bytes_total", Some("sent")),
    ("gatehouse_quic_bytes_total", Some("received")),
    ("gatehouse_quic_packets_lost_total", None),
    ("gatehouse_quic_packets_retransmitted_total", None),
];

/// Counts in [`QUIC_SERIES`]'s order.
pub type QuicCounts = [u64; 6];

fn quic_help(metric: &str) -> &'static str {
    match metric {
        "gatehouse_quic_packets_total" => "QUIC packets sent and received, by listener.",
        "gatehouse_quic_bytes_total" => "QUIC UDP payload bytes sent and received, by listener.",
        "gatehouse_quic_packets_lost_total" => "QUIC packets declared lost, by listener.",
        _ => "QUIC packets that carried data again after a loss, by listener.",
    }
}

/// How a QUIC connection ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QuicClose {
    /// No packet within the idle timeout (or none to finish a handshake).
    IdleTimeout,
    /// Gatehouse closed it without an error (a drain, a reload's GOAWAY).
    Closed,
    /// Gatehouse closed it with an error: the client broke the protocol
    /// (a malformed frame, a flood, a stream past its limit, …).
    Error,
    /// The client closed it without an error.
    PeerClosed,
    /// The client closed it with an error code.
    PeerError,
    /// Neither side named a reason: a stateless reset, or a handshake
    /// that never began.
    Other,
}

/// [`QuicClose`]'s names, in its order.
pub const QUIC_CLOSE_REASONS: [&str; 6] = ["idle_timeout", "closed", "error", "peer_closed", "peer_error", "other"];

/// A listener's connections and TLS handshakes.
pub type ListenerMetrics = PerWorker<ListenerSlot>;

impl ListenerMetrics {
    pub fn accepted(&self, worker: usize) {
        bump(&self.get(worker).accepted, 1);
    }

    pub fn closed(&self, worker: usize) {
        bump(&self.get(worker).closed, 1);
    }

    /// Adds what a QUIC connection carried since it last reported.
    pub fn quic(&self, worker: usize, counts: &QuicCounts) {
        let slot = self.get(worker);
        for (a, &n) in slot.quic.iter().zip(counts) {
            if n > 0 {
                bump(a, n);
            }
        }
    }

    pub fn quic_closed(&self, worker: usize, why: QuicClose) {
        bump(&self.get(worker).quic_closed[why as usize], 1);
    }

    /// `version` and `cipher` are "-" when the handshake did not finish.
    pub fn handshake(&self, worker: usize, version: &'static str, cipher: &'static str, result: HandshakeResult) {
        let mut h = self.get(worker).handshakes.lock().unwrap_or_else(|e| e.into_inner());
        let key = (version, cipher, result);
        match h.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => h.push((key, 1)),
        }
    }
}

#[derive(Default)]
#[repr(align(64))]
pub struct OpenSlot {
    opened: AtomicU64,
    closed: AtomicU64,
    /// QUIC datagrams dropped, by [`QUIC_DROP_REASONS`].
    quic_dropped: [AtomicU64; 4],
}

/// Why a QUIC datagram was dropped.
#[derive(Clone, Copy)]
pub enum QuicDrop {
    Malformed,
    BadToken,
    QueueFull,
    UnknownConnection,
}

/// [`QuicDrop`]'s names, in its order.
pub const QUIC_DROP_REASONS: [&str; 4] = ["malformed", "bad_token", "queue_full", "unknown_connection"];

/// The registry: every per-worker table, by name.
pub struct Metrics {
    workers: usize,
    routes: Mutex<BTreeMap<String, Arc<RouteMetrics>>>,
    upstreams: Mutex<BTreeMap<String, Arc<UpstreamMetrics>>>,
    listeners: Mutex<BTreeMap<String, Arc<ListenerMetrics>>>,
    /// Requests that matched no route (or were refused before routing).
    pub unrouted: RouteMetrics,
    /// Client connections opened and closed, all listeners (kept across
    /// reloads, unlike the per-listener tables): what the drain waits on.
    connections: PerWorker<OpenSlot>,
}

fn table<T: Default>(
    map: &Mutex<BTreeMap<String, Arc<PerWorker<T>>>>,
    name: &str,
    workers: usize,
) -> Arc<PerWorker<T>> {
    let mut m = map.lock().unwrap_or_else(|e| e.into_inner());
    m.entry(name.to_string()).or_insert_with(|| Arc::new(PerWorker::new(workers))).clone()
}

fn keep_only<T>(map: &Mutex<BTreeMap<String, Arc<PerWorker<T>>>>, names: &[&str]) {
    map.lock().unwrap_or_else(|e| e.into_inner()).retain(|k, _| names.contains(&k.as_str()));
}

impl Metrics {
    pub fn new(workers: usize) -> Metrics {
        Metrics {
            workers: workers.max(1),
            routes: Mutex::default(),
            upstreams: Mutex::default(),
            listeners: Mutex::default(),
            unrouted: RouteMetrics::new(workers),
            connections: PerWorker::new(workers),
        }
    }

    pub fn route(&self, name: &str) -> Arc<RouteMetrics> {
        table(&self.routes, name, self.workers)
    }

    pub fn upstream(&self, name: &str) -> Arc<UpstreamMetrics> {
        table(&self.upstreams, name, self.workers)
    }

    pub fn listener(&self, name: &str) -> Arc<ListenerMetrics> {
        table(&self.listeners, name, self.workers)
    }

    /// After a snapshot swap: forgets what the new config no longer has.
    pub fn retain(&self, routes: &[&str], upstreams: &[&str], listeners: &[&str]) {
        keep_only(&self.routes, routes);
        keep_only(&self.upstreams, upstreams);
        keep_only(&self.listeners, listeners);
    }

    pub fn connection_opened(&self, worker: usize) {
        bump(&self.connections.get(worker).opened, 1);
    }

    pub fn connection_closed(&self, worker: usize) {
        bump(&self.connections.get(worker).closed, 1);
    }

    pub fn quic_dropped(&self, worker: usize, why: QuicDrop) {
        bump(&self.connections.get(worker).quic_dropped[why as usize], 1);
    }

    /// Client connections open on all workers and listeners.
    pub fn connections_open(&self) -> u64 {
        let (o, c) = self
            .connections
            .slots
            .iter()
            .fold((0, 0), |(o, c), s| (o + s.opened.load(Relaxed), c + s.closed.load(Relaxed)));
        o.saturating_sub(c)
    }

    /// Open client connections on every listener.
    pub fn open_connections(&self) -> BTreeMap<String, u64> {
        let l = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
        l.iter()
            .map(|(name, t)| {
                let (a, c) =
                    t.slots.iter().fold((0, 0), |(a, c), s| (a + s.accepted.load(Relaxed), c + s.closed.load(Relaxed)));
                (name.clone(), a.saturating_sub(c))
            })
            .collect()
    }
}

/// What the scrape needs besides the registry, read from the live snapshot
/// and the other subsystems by the caller.
pub struct ScrapeInput<'a> {
    /// (upstream, endpoint, up, in flight)
    pub endpoints: Vec<(&'a str, std::net::SocketAddr, bool, u64)>,
    /// (certificate name, not-after as Unix seconds)
    pub certificates: Vec<(&'a str, i64)>,
}

fn latency_bounds() -> Vec<String> {
    LATENCY_BUCKETS.iter().map(|b| b.to_string()).collect()
}

impl Metrics {
    /// The plane's series.
    pub fn render(&self, o: &mut Exposition, input: &ScrapeInput<'_>) {
        let bounds = latency_bounds();

        // Requests by route and status class, and their durations.
        let routes: Vec<(String, Arc<RouteMetrics>)> = {
            let r = self.routes.lock().unwrap_or_else(|e| e.into_inner());
            r.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let mut per_route = Vec::new();
        for (name, t) in routes.iter().map(|(n, t)| (n.as_str(), &**t)).chain([("", &self.unrouted)]) {
            let mut classes = [0u64; 5];
            let mut h = HistogramSum::default();
            for s in t.slots.iter() {
                for (d, c) in classes.iter_mut().zip(&s.by_class) {
                    *d += c.load(Relaxed);
                }
                h.add(&s.latency);
            }
            per_route.push((name, classes, h));
        }
        o.header(
            "gatehouse_http_requests_total",
            "counter",
            "Requests answered, by route (\"\" = none matched) and status class.",
        );
        for (name, classes, _) in &per_route {
            for (i, n) in classes.iter().enumerate() {
                let code = ["1xx", "2xx", "3xx", "4xx", "5xx"][i];
                o.sample("gatehouse_http_requests_total", &[("route", name), ("code", code)], n);
            }
        }
        o.header(
            "gatehouse_http_request_duration_seconds",
            "histogram",
            "Time from a request's head to the end of its response, by route.",
        );
        for (name, _, h) in &per_route {
            o.histogram(
                "gatehouse_http_request_duration_seconds",
                &[("route", name)],
                &bounds,
                &h.buckets,
                h.sum_us as f64 / 1e6,
            );
        }

        let upstreams: Vec<(String, Arc<UpstreamMetrics>)> = {
            let u = self.upstreams.lock().unwrap_or_else(|e| e.into_inner());
            u.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        o.header(
            "gatehouse_upstream_response_duration_seconds",
            "histogram",
            "Time from sending a request upstream to its response head, by upstream.",
        );
        for (name, t) in &upstreams {
            let mut h = HistogramSum::default();
            for s in t.slots.iter() {
                h.add(&s.latency);
            }
            o.histogram(
                "gatehouse_upstream_response_duration_seconds",
                &[("upstream", name)],
                &bounds,
                &h.buckets,
                h.sum_us as f64 / 1e6,
            );
        }
        o.header(
            "gatehouse_upstream_connections_opened_total",
            "counter",
            "Connections opened to an upstream's endpoints.",
        );
        for (name, t) in &upstreams {
            let n: u64 = t.slots.iter().map(|s| s.opened.load(Relaxed)).sum();
            o.sample("gatehouse_upstream_connections_opened_total", &[("upstream", name)], n);
        }
        o.header(
            "gatehouse_upstream_connections_reused_total",
            "counter",
            "Requests sent to an upstream on a connection already open (pooled HTTP/1.1, or the shared h2c one).",
        );
        for (name, t) in &upstreams {
            let n: u64 = t.slots.iter().map(|s| s.reused.load(Relaxed)).sum();
            o.sample("gatehouse_upstream_connections_reused_total", &[("upstream", name)], n);
        }
        o.header(
            "gatehouse_upstream_endpoint_up",
            "gauge",
            "1 when an endpoint takes traffic (active check passing, not ejected).",
        );
        for (u, addr, up, _) in &input.endpoints {
            o.sample(
                "gatehouse_upstream_endpoint_up",
                &[("upstream", u), ("endpoint", &addr.to_string())],
                u8::from(*up),
            );
        }
        o.header("gatehouse_upstream_endpoint_in_flight", "gauge", "Requests in flight to an endpoint.");
        for (u, addr, _, n) in &input.endpoints {
            o.sample("gatehouse_upstream_endpoint_in_flight", &[("upstream", u), ("endpoint", &addr.to_string())], n);
        }

        // Connections and handshakes by listener.
        let listeners: Vec<(String, Arc<ListenerMetrics>)> = {
            let l = self.listeners.lock().unwrap_or_else(|e| e.into_inner());
            l.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        o.header("gatehouse_connections_total", "counter", "Client connections accepted, by listener.");
        let mut active = Vec::new();
        let mut handshakes: Vec<(&str, BTreeMap<HandshakeKey, u64>)> = Vec::new();
        for (name, t) in &listeners {
            let (mut acc, mut closed) = (0u64, 0u64);
            let mut hs = BTreeMap::new();
            for s in t.slots.iter() {
                acc += s.accepted.load(Relaxed);
                closed += s.closed.load(Relaxed);
                for (k, n) in s.handshakes.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    *hs.entry(*k).or_insert(0) += n;
                }
            }
            o.sample("gatehouse_connections_total", &[("listener", name)], acc);
            active.push((name.as_str(), acc.saturating_sub(closed)));
            handshakes.push((name.as_str(), hs));
        }
        o.header("gatehouse_connections_active", "gauge", "Client connections open, by listener.");
        for (name, n) in active {
            o.sample("gatehouse_connections_active", &[("listener", name)], n);
        }
        quic(o, &listeners);
        o.header(
            "gatehouse_tls_handshakes_total",
            "counter",
            "TLS handshakes by listener, version, cipher and result.",
        );
        for (name, hs) in &handshakes {
            for ((version, cipher, result), n) in hs {
                o.sample(
                    "gatehouse_tls_handshakes_total",
                    &[("listener", name), ("version", version), ("cipher", cipher), ("result", result.label())],
                    n,
                );
            }
        }

        o.header(
            "gatehouse_certificate_not_after_timestamp_seconds",
            "gauge",
            "When each certificate expires (Unix time).",
        );
        for (name, t) in &input.certificates {
            o.sample("gatehouse_certificate_not_after_timestamp_seconds", &[("certificate", name)], t);
        }

        o.header(
            "gatehouse_quic_datagrams_dropped_total",
            "counter",
            "UDP datagrams to HTTP/3 listeners dropped, by reason (unknown_connection: answered with a stateless reset when it could be).",
        );
        for (i, why) in QUIC_DROP_REASONS.iter().enumerate() {
            let n: u64 = self.connections.slots.iter().map(|s| s.quic_dropped[i].load(Relaxed)).sum();
            o.sample("gatehouse_quic_datagrams_dropped_total", &[("reason", why)], n);
        }

        keyops(o);
    }
}

/// The QUIC transport counters of the listeners that served HTTP/3:
/// connections report them once a second and when they close.
fn quic(o: &mut Exposition, listeners: &[(String, Arc<ListenerMetrics>)]) {
    let mut rows: Vec<(&str, [u64; 6], [u64; 6])> = Vec::new();
    for (name, t) in listeners {
        let mut counts = [0u64; 6];
        let mut closed = [0u64; 6];
        for s in t.slots.iter() {
            for (c, a) in counts.iter_mut().zip(&s.quic) {
                *c += a.load(Relaxed);
            }
            for (c, a) in closed.iter_mut().zip(&s.quic_closed) {
                *c += a.load(Relaxed);
            }
        }
        // A listener without HTTP/3 has none: no series for it.
        if counts.iter().chain(&closed).any(|n| *n > 0) {
            rows.push((name.as_str(), counts, closed));
        }
    }
    if rows.is_empty() {
        return;
    }
    for (i, (metric, direction)) in QUIC_SERIES.iter().enumerate() {
        // A family's samples follow its one header.
        if i == 0 || QUIC_SERIES[i - 1].0 != *metric {
            o.header(metric, "counter", quic_help(metric));
        }
        for (name, c, _) in &rows {
            match direction {
                Some(d) => o.sample(metric, &[("listener", name), ("direction", d)], c[i]),
                None => o.sample(metric, &[("listener", name)], c[i]),
            }
        }
    }
    o.header(
        "gatehouse_quic_connections_closed_total",
        "counter",
        "QUIC connections ended, by listener and reason (error: Gatehouse closed it for a protocol violation).",
    );
    for (name, _, closed) in &rows {
        for (why, n) in QUIC_CLOSE_REASONS.iter().zip(closed) {
            o.sample("gatehouse_quic_connections_closed_total", &[("listener", name), ("reason", why)], n);
        }
    }
}

/// The private-key batcher's counters (summed over workers by keyops).
fn keyops(o: &mut Exposition) {
    use gatehouse_keyops::stats::{self, DELAY_BUCKETS_US};
    let s = stats::snapshot();
    let keys = stats::KEYS;
    o.header(
        "gatehouse_keyops_batches_total",
        "counter",
        "Multi-buffer batches, by key (RSA size, or x25519 for key shares) and operations (lanes) in the batch.",
    );
    for ((k, sizes), max) in keys.iter().zip(&s.mb_batches).zip(stats::MAX_BATCH) {
        for (i, n) in sizes.iter().enumerate().take(max) {
            o.sample("gatehouse_keyops_batches_total", &[("key", k), ("size", &(i + 1).to_string())], n);
        }
    }
    o.header(
        "gatehouse_keyops_single_ops_total",
        "counter",
        "Private-key operations run one at a time (queue below the break-even batch size).",
    );
    for (k, n) in keys.iter().zip(&s.single_ops) {
        o.sample("gatehouse_keyops_single_ops_total", &[("key", k)], n);
    }
    o.header("gatehouse_keyops_queue_delay_seconds", "histogram", "Time a private-key operation waited in its queue.");
    let bounds: Vec<String> = DELAY_BUCKETS_US.iter().map(|us| (*us as f64 / 1e6).to_string()).collect();
    o.histogram("gatehouse_keyops_queue_delay_seconds", &[], &bounds, &s.delay, s.delay_sum_us as f64 / 1e6);
    o.header("gatehouse_keyops_faults_total", "counter", "Private-key results refused by the public-key check.");
    o.sample("gatehouse_keyops_faults_total", &[], s.faults);
    o.header("gatehouse_keyops_timer_flushes_total", "counter", "Batches run because max_delay passed.");
    o.sample("gatehouse_keyops_timer_flushes_total", &[], s.timer_flushes);
    o.header(
        "gatehouse_tls_key_shares_total",
        "counter",
        "The server's TLS key shares, by group and by the engine that computed them (boring: BoringSSL in the handshake; mb: the multi-buffer lanes; simd: ML-KEM-768 in Gatehouse's vector kernels, X25519 in BoringSSL).",
    );
    for (engine, groups) in stats::SHARE_ENGINES.iter().zip(&s.key_shares) {
        for (i, n) in groups.iter().enumerate() {
            o.sample(
                "gatehouse_tls_key_shares_total",
                &[("group", stats::group_name(i)), ("engine", engine.name())],
                n,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> ScrapeInput<'static> {
        ScrapeInput { endpoints: Vec::new(), certificates: vec![("c\"1", 1_900_000_000)] }
    }

    fn render(m: &Metrics) -> String {
        let mut o = Exposition::default();
        m.render(&mut o, &input());
        o.into_text()
    }

    #[test]
    fn counts_are_summed_over_workers() {
        let m = Metrics::new(2);
        let r = m.route("api");
        r.record(0, 200, Duration::from_micros(400));
        r.record(1, 204, Duration::from_millis(3));
        r.record(1, 503, Duration::from_secs(20));
        m.unrouted.record(0, 404, Duration::from_micros(10));
        let text = render(&m);
        assert!(text.contains("gatehouse_http_requests_total{route=\"api\",code=\"2xx\"} 2\n"), "{text}");
        assert!(text.contains("gatehouse_http_requests_total{route=\"api\",code=\"5xx\"} 1\n"));
        assert!(text.contains("gatehouse_http_requests_total{route=\"\",code=\"4xx\"} 1\n"));
        assert!(text.contains("gatehouse_http_request_duration_seconds_bucket{route=\"api\",le=\"0.0005\"} 1\n"));
        assert!(text.contains("gatehouse_http_request_duration_seconds_bucket{route=\"api\",le=\"0.005\"} 2\n"));
        assert!(text.contains("gatehouse_http_request_duration_seconds_bucket{route=\"api\",le=\"10\"} 2\n"));
        assert!(text.contains("gatehouse_http_request_duration_seconds_bucket{route=\"api\",le=\"+Inf\"} 3\n"));
        assert!(text.contains("gatehouse_http_request_duration_seconds_count{route=\"api\"} 3\n"));
        assert!(text.contains("gatehouse_http_request_duration_seconds_sum{route=\"api\"} 20.0034\n"));
        assert!(
            text.contains("gatehouse_certificate_not_after_timestamp_seconds{certificate=\"c\\\"1\"} 1900000000\n")
        );
    }

    #[test]
    fn connections_and_handshakes() {
        let m = Metrics::new(2);
        let l = m.listener("web");
        l.accepted(0);
        l.accepted(1);
        l.accepted(1);
        l.closed(0);
        l.handshake(0, "TLSv1.3", "TLS_AES_128_GCM_SHA256", HandshakeResult::Ok);
        l.handshake(1, "TLSv1.3", "TLS_AES_128_GCM_SHA256", HandshakeResult::Ok);
        l.handshake(1, "-", "-", HandshakeResult::Failed);
        let text = render(&m);
        assert!(text.contains("gatehouse_connections_total{listener=\"web\"} 3\n"));
        assert!(text.contains("gatehouse_connections_active{listener=\"web\"} 2\n"));
        assert!(text.contains(
            "gatehouse_tls_handshakes_total{listener=\"web\",version=\"TLSv1.3\",cipher=\"TLS_AES_128_GCM_SHA256\",result=\"ok\"} 2\n"
        ));
        assert!(text.contains(
            "gatehouse_tls_handshakes_total{listener=\"web\",version=\"-\",cipher=\"-\",result=\"failed\"} 1\n"
        ));
        assert_eq!(m.open_connections().get("web"), Some(&2));
    }

    #[test]
    fn quic_counters_sum_over_workers_and_skip_listeners_without_quic() {
        let m = Metrics::new(2);
        let h3 = m.listener("edge");
        m.listener("plain").accepted(0);
        // Sent and received packets, bytes, lost, retransmitted.
        let c: QuicCounts = [10, 4, 14_000, 500, 1, 1];
        h3.quic(0, &c);
        h3.quic(1, &c);
        h3.quic_closed(0, QuicClose::Error);
        h3.quic_closed(1, QuicClose::PeerClosed);
        h3.quic_closed(1, QuicClose::PeerClosed);
        let text = render(&m);
        for line in [
            "gatehouse_quic_packets_total{listener=\"edge\",direction=\"sent\"} 20\n",
            "gatehouse_quic_packets_total{listener=\"edge\",direction=\"received\"} 8\n",
            "gatehouse_quic_bytes_total{listener=\"edge\",direction=\"sent\"} 28000\n",
            "gatehouse_quic_bytes_total{listener=\"edge\",direction=\"received\"} 1000\n",
            "gatehouse_quic_packets_lost_total{listener=\"edge\"} 2\n",
            "gatehouse_quic_packets_retransmitted_total{listener=\"edge\"} 2\n",
            "gatehouse_quic_connections_closed_total{listener=\"edge\",reason=\"error\"} 1\n",
            "gatehouse_quic_connections_closed_total{listener=\"edge\",reason=\"peer_closed\"} 2\n",
            "gatehouse_quic_connections_closed_total{listener=\"edge\",reason=\"idle_timeout\"} 0\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("gatehouse_quic_packets_total{listener=\"plain\""), "{text}");
    }

    #[test]
    fn tables_survive_a_reload_by_name_and_go_with_their_object() {
        let m = Metrics::new(1);
        m.route("a").record(0, 200, Duration::ZERO);
        let again = m.route("a");
        m.retain(&["a"], &[], &[]);
        again.record(0, 200, Duration::ZERO);
        assert!(render(&m).contains("route=\"a\",code=\"2xx\"} 2\n"));
        m.retain(&[], &[], &[]);
        assert!(!render(&m).contains("route=\"a\""));
    }

    #[test]
    fn every_sample_line_is_well_formed() {
        let m = Metrics::new(1);
        m.route("x").record(0, 200, Duration::from_millis(1));
        m.upstream("u").record(0, Duration::from_millis(1));
        for line in render(&m).lines() {
            if line.starts_with('#') {
                assert!(line.starts_with("# HELP gatehouse_") || line.starts_with("# TYPE gatehouse_"), "{line}");
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect("name and value");
            assert!(series.starts_with("gatehouse_"), "{line}");
            assert!(value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
