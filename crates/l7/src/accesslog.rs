//! JSON access log, one line per request, written by its own thread.
//!
//! Workers hand a [`LogRecord`] to a bounded channel and move on; the writer
//! thread formats and writes, flushing whenever the channel runs dry. If the
//! writer falls behind and the channel fills, records are dropped and
//! counted rather than slowing requests down.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gatehouse_config::AccessLogTarget;
use serde::Serialize;

/// Why a request ended badly (`-` when it did not). Short and stable, so
/// logs can be grepped and counted.
pub mod reason {
    pub const OK: &str = "-";
    pub const NO_ROUTE: &str = "no_route";
    pub const BAD_REQUEST: &str = "bad_request";
    pub const AMBIGUOUS_LENGTH: &str = "ambiguous_length";
    pub const MISSING_HOST: &str = "missing_host";
    pub const HEAD_TOO_LARGE: &str = "head_too_large";
    pub const ACL_DENIED: &str = "acl_denied";
    pub const RATE_LIMITED: &str = "rate_limited";
    pub const BODY_TOO_LARGE: &str = "body_too_large";
    pub const CLIENT_BODY_ERROR: &str = "client_body_error";
    pub const CLIENT_TIMEOUT: &str = "client_timeout";
    pub const NO_HEALTHY_ENDPOINT: &str = "no_healthy_endpoint";
    pub const CONNECT_FAILED: &str = "connect_failed";
    pub const CONNECT_TIMEOUT: &str = "connect_timeout";
    pub const UPSTREAM_TIMEOUT: &str = "upstream_timeout";
    pub const UPSTREAM_ERROR: &str = "upstream_error";
    pub const UPSTREAM_ABORTED: &str = "upstream_aborted";
    pub const UPGRADE_UNSUPPORTED: &str = "upgrade_unsupported";
    pub const CLIENT_ABORTED: &str = "client_aborted";
}

#[derive(Debug, Clone, Serialize)]
pub struct LogRecord {
    #[serde(serialize_with = "rfc3339")]
    pub time: SystemTime,
    pub client: SocketAddr,
    pub listener: Arc<str>,
    pub method: String,
    pub host: String,
    pub path: String,
    pub protocol: &'static str,
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub duration_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_ms: Option<f64>,
    pub route: Option<Arc<str>>,
    pub upstream: Option<Arc<str>>,
    pub endpoint: Option<SocketAddr>,
    pub tls_version: Option<&'static str>,
    pub tls_cipher: Option<&'static str>,
    pub reason: &'static str,
}

fn rfc3339<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_rfc3339(*t))
}

/// `2026-11-22T09:13:17.123Z`, without a date-time dependency.
pub fn format_rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = d.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, day) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, d.subsec_millis())
}

/// Days since 1970-01-01 to (year, month, day): Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The sending side, cloned into every worker.
#[derive(Clone)]
pub struct AccessLog {
    tx: Option<SyncSender<LogRecord>>,
    pub dropped: Arc<AtomicU64>,
}

impl AccessLog {
    pub fn off() -> Self {
        AccessLog { tx: None, dropped: Arc::new(AtomicU64::new(0)) }
    }

    /// Starts the writer thread for `target`.
    pub fn start(target: &AccessLogTarget) -> std::io::Result<Self> {
        let out: Box<dyn Write + Send> = match target {
            AccessLogTarget::Off => return Ok(AccessLog::off()),
            AccessLogTarget::Stdout => Box::new(std::io::stdout()),
            AccessLogTarget::File(path) => Box::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?),
        };
        let (tx, rx) = sync_channel(64 * 1024);
        std::thread::Builder::new().name("access-log".into()).spawn(move || write_loop(rx, out))?;
        Ok(AccessLog { tx: Some(tx), dropped: Arc::new(AtomicU64::new(0)) })
    }

    pub fn is_on(&self) -> bool {
        self.tx.is_some()
    }

    pub fn send(&self, record: LogRecord) {
        if let Some(tx) = &self.tx
            && let Err(TrySendError::Full(_)) = tx.try_send(record)
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn write_loop(rx: Receiver<LogRecord>, out: Box<dyn Write + Send>) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(rec) = next {
            if serde_json::to_writer(&mut out, &rec).is_ok() {
                let _ = out.write_all(b"\n");
            }
            next = rx.try_recv().ok();
        }
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_format_as_rfc3339() {
        assert_eq!(format_rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_338_797_123);
        assert_eq!(format_rfc3339(t), "2026-11-22T09:13:17.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(format_rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn records_serialise_as_one_json_object() {
        let rec = LogRecord {
            time: UNIX_EPOCH,
            client: "127.0.0.1:5000".parse().expect("addr"),
            listener: "web".into(),
            method: "GET".into(),
            host: "example.com".into(),
            path: "/a\"b".into(),
            protocol: "HTTP/1.1",
            status: 200,
            bytes_in: 0,
            bytes_out: 5,
            duration_ms: 1.5,
            upstream_ms: Some(1.0),
            route: Some("r".into()),
            upstream: None,
            endpoint: None,
            tls_version: None,
            tls_cipher: None,
            reason: reason::OK,
        };
        let line = serde_json::to_string(&rec).expect("json");
        let v: serde_json::Value = serde_json::from_str(&line).expect("parse");
        assert_eq!(v["path"], "/a\"b");
        assert_eq!(v["status"], 200);
        assert_eq!(v["reason"], "-");
        assert!(!line.contains('\n'));
    }
}
