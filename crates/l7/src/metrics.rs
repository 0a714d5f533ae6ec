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
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
}

/// A listener's connections and TLS handshakes.
pub type ListenerMetrics = PerWorker<ListenerSlot>;

impl ListenerMetrics {
    pub fn accepted(&self, worker: usize) {
        bump(&self.get(worker).accepted, 1);
    }

    pub fn closed(&self, worker: usize) {
        bump(&self.get(worker).closed, 1);
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
}

/// Config reloads, whatever triggered them.
#[derive(Default)]
struct Reloads {
    ok: AtomicU64,
    failed: AtomicU64,
    last_ok_unix_ms: AtomicU64,
}

/// The registry: every per-worker table, by name.
pub struct Metrics {
    workers: usize,
    started: SystemTime,
    routes: Mutex<BTreeMap<String, Arc<RouteMetrics>>>,
    upstreams: Mutex<BTreeMap<String, Arc<UpstreamMetrics>>>,
    listeners: Mutex<BTreeMap<String, Arc<ListenerMetrics>>>,
    /// Requests that matched no route (or were refused before routing).
    pub unrouted: RouteMetrics,
    /// Client connections opened and closed, all listeners (kept across
    /// reloads, unlike the per-listener tables): what the drain waits on.
    connections: PerWorker<OpenSlot>,
    reloads: Reloads,
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
        let started = SystemTime::now();
        let reloads = Reloads::default();
        reloads.last_ok_unix_ms.store(unix_ms(started), Relaxed);
        Metrics {
            workers: workers.max(1),
            started,
            routes: Mutex::default(),
            upstreams: Mutex::default(),
            listeners: Mutex::default(),
            unrouted: RouteMetrics::new(workers),
            connections: PerWorker::new(workers),
            reloads,
        }
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    pub fn started(&self) -> SystemTime {
        self.started
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

    pub fn reloaded(&self, ok: bool) {
        if ok {
            self.reloads.ok.fetch_add(1, Relaxed);
            self.reloads.last_ok_unix_ms.store(unix_ms(SystemTime::now()), Relaxed);
        } else {
            self.reloads.failed.fetch_add(1, Relaxed);
        }
    }

    pub fn connection_opened(&self, worker: usize) {
        bump(&self.connections.get(worker).opened, 1);
    }

    pub fn connection_closed(&self, worker: usize) {
        bump(&self.connections.get(worker).closed, 1);
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

/// Escapes a label value (backslash, double quote, newline).
fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// What the scrape needs besides the registry, read from the live snapshot
/// and the other subsystems by the caller.
pub struct ScrapeInput<'a> {
    pub config_version: u64,
    /// (upstream, endpoint, up, in flight)
    pub endpoints: Vec<(&'a str, std::net::SocketAddr, bool, u64)>,
    /// (certificate name, not-after as Unix seconds)
    pub certificates: Vec<(&'a str, i64)>,
    /// With the etcd store: (connected, revision).
    pub store: Option<(bool, i64)>,
    /// With the L4 plane running.
    pub l4: Option<L4Scrape>,
}

/// The L4 plane's figures: every worker's counters, and the services'
/// names and real servers (with health) in counter order.
pub struct L4Scrape {
    pub workers: Vec<gatehouse_l4_io::WorkerStats>,
    pub services: Vec<(String, Vec<(std::net::SocketAddr, bool)>)>,
}

struct Out {
    text: String,
}

impl Out {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{k}=\"{}\"", label(v));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {value}");
    }

    /// A histogram's `_bucket` (cumulative), `_sum` and `_count` lines.
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], bounds: &[String], buckets: &[u64], sum_seconds: f64) {
        let mut cumulative = 0;
        for (bound, n) in bounds.iter().map(String::as_str).chain(["+Inf"]).zip(buckets) {
            cumulative += n;
            let mut l = labels.to_vec();
            l.push(("le", bound));
            self.sample(&format!("{name}_bucket"), &l, cumulative);
        }
        self.sample(&format!("{name}_sum"), labels, sum_seconds);
        self.sample(&format!("{name}_count"), labels, cumulative);
    }
}

fn latency_bounds() -> Vec<String> {
    LATENCY_BUCKETS.iter().map(|b| b.to_string()).collect()
}

impl Metrics {
    /// The whole exposition.
    pub fn render(&self, input: &ScrapeInput<'_>) -> String {
        let mut o = Out { text: String::with_capacity(16 * 1024) };
        let bounds = latency_bounds();

        o.header("gatehouse_build_info", "gauge", "Version of the running binary.");
        o.sample("gatehouse_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1);
        o.header("gatehouse_start_time_seconds", "gauge", "When the process started (Unix time).");
        o.sample("gatehouse_start_time_seconds", &[], unix_ms(self.started) as f64 / 1000.0);
        o.header("gatehouse_workers", "gauge", "Worker threads.");
        o.sample("gatehouse_workers", &[], self.workers);

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

        // Configuration.
        o.header("gatehouse_config_version", "gauge", "Version of the running configuration.");
        o.sample("gatehouse_config_version", &[], input.config_version);
        o.header(
            "gatehouse_config_reloads_total",
            "counter",
            "Configuration changes applied (ok) or refused (failed).",
        );
        o.sample("gatehouse_config_reloads_total", &[("result", "ok")], self.reloads.ok.load(Relaxed));
        o.sample("gatehouse_config_reloads_total", &[("result", "failed")], self.reloads.failed.load(Relaxed));
        o.header(
            "gatehouse_config_last_reload_success_timestamp_seconds",
            "gauge",
            "When the running configuration was applied (Unix time).",
        );
        o.sample(
            "gatehouse_config_last_reload_success_timestamp_seconds",
            &[],
            self.reloads.last_ok_unix_ms.load(Relaxed) as f64 / 1000.0,
        );
        o.header(
            "gatehouse_certificate_not_after_timestamp_seconds",
            "gauge",
            "When each certificate expires (Unix time).",
        );
        for (name, t) in &input.certificates {
            o.sample("gatehouse_certificate_not_after_timestamp_seconds", &[("certificate", name)], t);
        }

        if let Some((connected, revision)) = input.store {
            o.header("gatehouse_store_connected", "gauge", "1 while the etcd store is reachable and watched.");
            o.sample("gatehouse_store_connected", &[], u8::from(connected));
            o.header("gatehouse_store_revision", "gauge", "The etcd revision this node's config reflects.");
            o.sample("gatehouse_store_revision", &[], revision);
        }
        keyops(&mut o);
        if let Some(l4) = &input.l4 {
            render_l4(&mut o, l4);
        }
        o.text
    }
}

/// A metric: name, type, help, and how to read it from what it is of.
type Series<'a, T, V> = (&'a str, &'a str, &'a str, &'a dyn Fn(&T) -> V);

fn render_l4(o: &mut Out, l4: &L4Scrape) {
    use gatehouse_l4::plane::ServiceCounters;
    let per_service = |f: &dyn Fn(&ServiceCounters) -> u64, i: usize| -> u64 {
        l4.workers.iter().filter_map(|w| w.counters.services.get(i)).map(f).sum()
    };
    let series: [Series<'_, ServiceCounters, u64>; 5] = [
        ("gatehouse_l4_packets_total", "counter", "Packets from clients to each L4 service.", &|c| c.packets),
        ("gatehouse_l4_bytes_total", "counter", "Bytes from clients to each L4 service.", &|c| c.bytes),
        ("gatehouse_l4_sessions_total", "counter", "Sessions created per L4 service.", &|c| c.sessions_total),
        ("gatehouse_l4_sessions_active", "gauge", "Sessions in the tables per L4 service.", &|c| c.sessions_active),
        (
            "gatehouse_l4_resets_total",
            "counter",
            "TCP resets sent for sessions of real servers that went down (on_server_down: reset).",
            &|c| c.resets,
        ),
    ];
    for (name, kind, help, f) in series {
        o.header(name, kind, help);
        for (i, (service, _)) in l4.services.iter().enumerate() {
            o.sample(name, &[("service", service)], per_service(f, i));
        }
    }
    let per_real = |f: fn(&ServiceCounters) -> &[u64], i: usize, j: usize| -> u64 {
        l4.workers.iter().filter_map(|w| w.counters.services.get(i)).filter_map(|c| f(c).get(j)).sum()
    };
    type PerReal = fn(&ServiceCounters) -> &[u64];
    let reals: [(&str, &str, &str, PerReal); 2] = [
        ("gatehouse_l4_real_packets_total", "counter", "Packets sent to each real server.", |c| &c.per_real_packets),
        ("gatehouse_l4_real_sessions_active", "gauge", "Sessions per real server.", |c| &c.per_real_active),
    ];
    for (name, kind, help, f) in reals {
        o.header(name, kind, help);
        for (i, (service, rs)) in l4.services.iter().enumerate() {
            for (j, (addr, _)) in rs.iter().enumerate() {
                o.sample(name, &[("service", service), ("real", &addr.to_string())], per_real(f, i, j));
            }
        }
    }
    o.header("gatehouse_l4_real_up", "gauge", "1 while a real server passes its health check.");
    for (service, rs) in &l4.services {
        for (addr, up) in rs {
            o.sample("gatehouse_l4_real_up", &[("service", service), ("real", &addr.to_string())], u8::from(*up));
        }
    }
    o.header("gatehouse_l4_drops_total", "counter", "Packets the L4 plane dropped, by reason.");
    for d in gatehouse_l4::plane::Drop::all() {
        let n: u64 = l4.workers.iter().map(|w| w.counters.dropped(d)).sum();
        o.sample("gatehouse_l4_drops_total", &[("reason", d.name())], n);
    }
    let no_neighbour: u64 = l4.workers.iter().map(|w| w.io.no_neighbour).sum();
    let no_route: u64 = l4.workers.iter().map(|w| w.io.no_route).sum();
    let tx_full: u64 = l4.workers.iter().map(|w| w.io.tx_full).sum();
    o.sample("gatehouse_l4_drops_total", &[("reason", "no_neighbour")], no_neighbour);
    o.sample("gatehouse_l4_drops_total", &[("reason", "no_route")], no_route);
    o.sample("gatehouse_l4_drops_total", &[("reason", "tx_ring_full")], tx_full);
    let io: [Series<'_, gatehouse_l4_io::WorkerStats, u64>; 3] = [
        ("gatehouse_l4_rx_packets_total", "counter", "Frames the L4 plane received, per interface and queue.", &|w| {
            w.io.rx_packets
        }),
        ("gatehouse_l4_tx_packets_total", "counter", "Frames the L4 plane sent, per interface and queue.", &|w| {
            w.io.tx_packets
        }),
        (
            "gatehouse_l4_answered_total",
            "counter",
            "ARP and neighbour-discovery answers sent for owned addresses.",
            &|w| w.counters.answered,
        ),
    ];
    for (name, kind, help, f) in io {
        o.header(name, kind, help);
        for w in &l4.workers {
            o.sample(name, &[("interface", &w.interface), ("queue", &w.queue.to_string())], f(w));
        }
    }
}

/// The private-key batcher's counters (summed over workers by keyops).
fn keyops(o: &mut Out) {
    use gatehouse_keyops::stats::{self, DELAY_BUCKETS_US};
    let s = stats::snapshot();
    let keys = ["rsa2048", "rsa3072", "rsa4096"];
    o.header(
        "gatehouse_keyops_batches_total",
        "counter",
        "Multi-buffer private-key batches, by key size and operations in the batch.",
    );
    for (k, sizes) in keys.iter().zip(&s.mb_batches) {
        for (i, n) in sizes.iter().enumerate() {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> ScrapeInput<'static> {
        ScrapeInput {
            config_version: 3,
            endpoints: Vec::new(),
            certificates: vec![("c\"1", 1_900_000_000)],
            store: None,
            l4: None,
        }
    }

    #[test]
    fn counts_are_summed_over_workers() {
        let m = Metrics::new(2);
        let r = m.route("api");
        r.record(0, 200, Duration::from_micros(400));
        r.record(1, 204, Duration::from_millis(3));
        r.record(1, 503, Duration::from_secs(20));
        m.unrouted.record(0, 404, Duration::from_micros(10));
        let text = m.render(&input());
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
        let text = m.render(&input());
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
    fn tables_survive_a_reload_by_name_and_go_with_their_object() {
        let m = Metrics::new(1);
        m.route("a").record(0, 200, Duration::ZERO);
        let again = m.route("a");
        m.retain(&["a"], &[], &[]);
        again.record(0, 200, Duration::ZERO);
        assert!(m.render(&input()).contains("route=\"a\",code=\"2xx\"} 2\n"));
        m.retain(&[], &[], &[]);
        assert!(!m.render(&input()).contains("route=\"a\""));
    }

    #[test]
    fn every_sample_line_is_well_formed() {
        let m = Metrics::new(1);
        m.route("x").record(0, 200, Duration::from_millis(1));
        m.upstream("u").record(0, Duration::from_millis(1));
        for line in m.render(&input()).lines() {
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
