//! Endpoint health: active checks, passive ejection, in-flight counts.
//!
//! [`EndpointHealth`] is the one place an endpoint's liveness lives. It is
//! keyed by (upstream name, address) in the [`HealthRegistry`] and survives
//! reloads, so a reload neither forgets that an endpoint is down nor resets
//! its in-flight count. Workers read it with relaxed atomics; the active
//! checker (on the control thread) and connect failures (on workers) write it.
//!
//! The rise/fall logic is the sans-IO [`RiseFall`] machine; the probes are
//! plain async functions, so both are testable on their own.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatehouse_config::{HealthCheck, HealthCheckKind, PassiveHealth};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Milliseconds since the process started: a cheap monotonic clock for
/// ejection deadlines shared between threads.
pub fn now_ms() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

#[derive(Debug)]
pub struct EndpointHealth {
    pub addr: SocketAddr,
    /// Result of the active check (true when there is none).
    active_up: AtomicBool,
    /// Passive ejection: out of rotation until this `now_ms()`.
    ejected_until: AtomicU64,
    connect_failures: AtomicU32,
    /// Requests in flight, one slot per worker (written only by its worker,
    /// summed when read): for least connections and the status page.
    in_flight: Box<[InFlight]>,
    /// The last active check, for the status page (written by the
    /// checker on the control thread only).
    last_check: Mutex<Option<LastCheck>>,
}

/// When an endpoint was last checked, and what came of it.
#[derive(Debug, Clone, PartialEq)]
pub struct LastCheck {
    /// Unix seconds.
    pub at: f64,
    /// `None` when it passed; else why it failed.
    pub failure: Option<String>,
}

#[derive(Debug, Default)]
#[repr(align(64))]
struct InFlight(AtomicU64);

impl EndpointHealth {
    fn new(addr: SocketAddr, workers: usize) -> Self {
        EndpointHealth {
            addr,
            active_up: AtomicBool::new(true),
            ejected_until: AtomicU64::new(0),
            connect_failures: AtomicU32::new(0),
            in_flight: (0..workers.max(1)).map(|_| InFlight::default()).collect(),
            last_check: Mutex::new(None),
        }
    }

    fn slot(&self, worker: usize) -> &AtomicU64 {
        &self.in_flight[worker % self.in_flight.len()].0
    }

    /// A request of `worker` starts on this endpoint.
    pub fn request_started(&self, worker: usize) {
        let s = self.slot(worker);
        s.store(s.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// A request of `worker` on this endpoint ended (on the same worker).
    pub fn request_ended(&self, worker: usize) {
        let s = self.slot(worker);
        s.store(s.load(Ordering::Relaxed).saturating_sub(1), Ordering::Relaxed);
    }

    /// Requests in flight on every worker.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }

    pub fn available(&self, now: u64) -> bool {
        self.active_up.load(Ordering::Relaxed) && self.ejected_until.load(Ordering::Relaxed) <= now
    }

    pub fn is_up(&self) -> bool {
        self.available(now_ms())
    }

    /// Whether passive ejection holds it out of rotation now.
    pub fn ejected(&self) -> bool {
        self.ejected_until.load(Ordering::Relaxed) > now_ms()
    }

    /// The last active check; `None` before the first, or without one.
    pub fn last_check(&self) -> Option<LastCheck> {
        self.last_check.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn checked(&self, result: &Result<(), ProbeError>) {
        let at = crate::metrics::unix_ms(std::time::SystemTime::now()) as f64 / 1000.0;
        let c = LastCheck { at, failure: result.as_ref().err().map(ProbeError::to_string) };
        *self.last_check.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    /// Counts a failed connect; returns true if this failure ejected it.
    pub fn connect_failed(&self, passive: &PassiveHealth) -> bool {
        let n = self.connect_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if passive.consecutive_failures > 0 && n >= passive.consecutive_failures {
            self.connect_failures.store(0, Ordering::Relaxed);
            let until = now_ms() + passive.ejection_time.as_millis() as u64;
            self.ejected_until.store(until, Ordering::Relaxed);
            return true;
        }
        false
    }

    pub fn connect_succeeded(&self) {
        if self.connect_failures.load(Ordering::Relaxed) != 0 {
            self.connect_failures.store(0, Ordering::Relaxed);
        }
    }

    fn set_active(&self, up: bool) {
        self.active_up.store(up, Ordering::Relaxed);
        if up {
            // An active check that sees it come back ends a passive ejection.
            self.ejected_until.store(0, Ordering::Relaxed);
            self.connect_failures.store(0, Ordering::Relaxed);
        }
    }
}

/// All endpoint health states, shared by every snapshot.
#[derive(Default)]
pub struct HealthRegistry {
    map: Mutex<HashMap<(String, SocketAddr), Arc<EndpointHealth>>>,
    /// Worker threads, for the per-worker in-flight slots (0 counts as 1).
    workers: usize,
}

impl HealthRegistry {
    pub fn new(workers: usize) -> Self {
        HealthRegistry { map: Mutex::default(), workers }
    }

    pub fn get(&self, upstream: &str, addr: SocketAddr) -> Arc<EndpointHealth> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((upstream.to_string(), addr))
            .or_insert_with(|| Arc::new(EndpointHealth::new(addr, self.workers)))
            .clone()
    }

    /// Forgets endpoints no longer in any upstream.
    pub fn retain(&self, keep: &dyn Fn(&str, SocketAddr) -> bool) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|(u, a), _| keep(u, *a));
    }
}

/// Consecutive-result hysteresis: `fall` failures in a row take an endpoint
/// down, `rise` successes in a row bring it back.
#[derive(Debug, Clone)]
pub struct RiseFall {
    rise: u32,
    fall: u32,
    streak: u32,
    up: bool,
}

impl RiseFall {
    pub fn new(rise: u32, fall: u32, up: bool) -> Self {
        RiseFall { rise: rise.max(1), fall: fall.max(1), streak: 0, up }
    }

    pub fn is_up(&self) -> bool {
        self.up
    }

    /// Feeds one check result; returns the new state if it changed.
    pub fn observe(&mut self, ok: bool) -> Option<bool> {
        if ok == self.up {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        let needed = if self.up { self.fall } else { self.rise };
        if self.streak >= needed {
            self.up = ok;
            self.streak = 0;
            return Some(ok);
        }
        None
    }
}

/// Why an endpoint failed its active check (shown in `/status` and the
/// dashboard as the last check's failure).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("write: {0}")]
    Write(std::io::Error),
    #[error("read: {0}")]
    Read(std::io::Error),
    #[error("closed before a status line")]
    Closed,
    #[error("not an HTTP response")]
    NotHttp,
    #[error("status {got}, expected {expected}")]
    Status { got: u16, expected: u16 },
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// One active probe of `addr`. Ok if the endpoint passed.
pub async fn probe(addr: SocketAddr, check: &HealthCheck) -> Result<(), ProbeError> {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await.map_err(ProbeError::Connect)?;
        if check.kind == HealthCheckKind::Tcp {
            return Ok(());
        }
        let host = check.host.clone().unwrap_or_else(|| addr.to_string());
        let req = format!(
            "GET {} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: gatehouse-health-check\r\nConnection: close\r\n\r\n",
            check.path
        );
        stream.write_all(req.as_bytes()).await.map_err(ProbeError::Write)?;
        // The status line is all we need: "HTTP/1.1 200 ...".
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            let got = stream.read(&mut buf[n..]).await.map_err(ProbeError::Read)?;
            if got == 0 {
                return Err(ProbeError::Closed);
            }
            n += got;
        }
        let status = status_code(&buf[..n]).ok_or(ProbeError::NotHttp)?;
        if status == check.expect_status {
            Ok(())
        } else {
            Err(ProbeError::Status { got: status, expected: check.expect_status })
        }
    };
    match tokio::time::timeout(check.timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::Timeout(check.timeout)),
    }
}

/// The status code of an HTTP/1.x response head at the start of `buf`
/// (`HTTP/1.1 200 ...`), or `None` if `buf` does not start with one. The
/// one parser of status lines: health probes here, and the L7 plane's
/// client-side I/O.
pub fn status_code(buf: &[u8]) -> Option<u16> {
    let (minor, rest) = buf.strip_prefix(b"HTTP/1.")?.split_first()?;
    let digits = rest.strip_prefix(b" ")?.get(..3)?;
    if !minor.is_ascii_digit() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0')))
}

/// Runs the active check of one endpoint until the task is aborted.
pub async fn check_loop(upstream: String, health: Arc<EndpointHealth>, check: HealthCheck) {
    let mut state = RiseFall::new(check.rise, check.fall, health.active_up.load(Ordering::Relaxed));
    // Spread the first probes of many endpoints over one interval.
    let jitter = Duration::from_millis(fastrand::u64(0..=check.interval.as_millis().min(1000) as u64));
    tokio::time::sleep(jitter).await;
    let mut tick = tokio::time::interval(check.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let result = probe(health.addr, &check).await;
        health.checked(&result);
        if let Some(up) = state.observe(result.is_ok()) {
            health.set_active(up);
            match (&result, up) {
                (Ok(()), _) => {
                    tracing::warn!(upstream = %upstream, endpoint = %health.addr, "endpoint is UP (health check passed {} times)", check.rise)
                }
                (Err(why), _) => {
                    tracing::warn!(upstream = %upstream, endpoint = %health.addr, reason = %why, "endpoint is DOWN (health check failed {} times)", check.fall)
                }
            }
        }
    }
}

/// The running active checks, reconciled with each new snapshot.
#[derive(Default)]
pub struct HealthChecks {
    tasks: HashMap<(String, SocketAddr), (HealthCheck, tokio::task::JoinHandle<()>)>,
}

impl HealthChecks {
    /// Starts checks that are new or changed, stops those that are gone.
    /// Must run inside a tokio runtime (the control thread's).
    pub fn reconcile(&mut self, wanted: Vec<(String, Arc<EndpointHealth>, HealthCheck)>) {
        let mut next = HashMap::new();
        for (upstream, health, check) in wanted {
            let key = (upstream.clone(), health.addr);
            match self.tasks.remove(&key) {
                Some((old, task)) if old == check => {
                    next.insert(key, (old, task));
                }
                other => {
                    if let Some((_, task)) = other {
                        task.abort();
                    }
                    let task = tokio::spawn(check_loop(upstream, health, check.clone()));
                    next.insert(key, (check, task));
                }
            }
        }
        for (_, (_, task)) in self.tasks.drain() {
            task.abort();
        }
        self.tasks = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_read_strictly() {
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Some(200));
        assert_eq!(status_code(b"HTTP/1.0 503 Busy"), Some(503));
        assert_eq!(status_code(b"HTTP/1.1 204\r\n"), Some(204));
        assert_eq!(status_code(b"HTTP/2 200 OK"), None);
        assert_eq!(status_code(b"HTTP/1.1 20x OK"), None);
        assert_eq!(status_code(b"SSH-2.0-OpenSSH"), None);
    }

    #[test]
    fn rise_and_fall_need_consecutive_results() {
        let mut s = RiseFall::new(2, 3, true);
        assert_eq!(s.observe(false), None);
        assert_eq!(s.observe(false), None);
        assert_eq!(s.observe(true), None, "a success breaks the failure streak");
        assert_eq!(s.observe(false), None);
        assert_eq!(s.observe(false), None);
        assert_eq!(s.observe(false), Some(false));
        assert!(!s.is_up());
        assert_eq!(s.observe(true), None);
        assert_eq!(s.observe(true), Some(true));
        assert_eq!(s.observe(true), None);
    }

    #[test]
    fn passive_ejection_after_consecutive_connect_failures() {
        let h = EndpointHealth::new("127.0.0.1:1".parse().expect("addr"), 2);
        let p = PassiveHealth { consecutive_failures: 3, ejection_time: Duration::from_secs(60) };
        assert!(!h.connect_failed(&p));
        h.connect_succeeded();
        assert!(!h.connect_failed(&p));
        assert!(!h.connect_failed(&p));
        assert!(h.is_up());
        assert!(h.connect_failed(&p));
        assert!(!h.is_up());
        // The active check seeing it healthy re-admits it at once.
        h.set_active(true);
        assert!(h.is_up());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn probes_real_sockets() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            for status in ["200 OK", "500 Internal Server Error"] {
                let (mut s, _) = listener.accept().await.expect("accept");
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
            }
        });
        let check = HealthCheck { path: "/healthz".into(), ..Default::default() };
        assert!(probe(addr, &check).await.is_ok());
        assert!(probe(addr, &check).await.expect_err("500").to_string().contains("status 500"));
        // Nothing listens now.
        let tcp = HealthCheck { kind: HealthCheckKind::Tcp, ..Default::default() };
        let closed: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        assert!(probe(closed, &tcp).await.is_err());
    }

    #[test]
    fn in_flight_is_counted_per_worker_and_summed() {
        let h = EndpointHealth::new("127.0.0.1:1".parse().expect("addr"), 2);
        h.request_started(0);
        h.request_started(1);
        h.request_started(1);
        h.request_ended(1);
        assert_eq!(h.in_flight(), 2);
        h.request_ended(0);
        h.request_ended(0); // never below zero
        assert_eq!(h.in_flight(), 1);
    }
}
