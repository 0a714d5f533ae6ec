//! The process's own series: build, start time, workers, config version
//! and reloads.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::SystemTime;

use gatehouse_plane::metrics::{Exposition, unix_ms};

/// The process's own figures.
pub struct ProcessMetrics {
    pub started: SystemTime,
    pub workers: usize,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    last_ok_unix_ms: AtomicU64,
}

impl ProcessMetrics {
    pub fn new(workers: usize) -> Self {
        let started = SystemTime::now();
        ProcessMetrics {
            started,
            workers,
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            last_ok_unix_ms: AtomicU64::new(unix_ms(started)),
        }
    }

    /// A config change was applied (or refused), whatever triggered it.
    pub fn reloaded(&self, ok: bool) {
        if ok {
            self.reloads_ok.fetch_add(1, Relaxed);
            self.last_ok_unix_ms.store(unix_ms(SystemTime::now()), Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Relaxed);
        }
    }

    pub fn render(&self, o: &mut Exposition, config_version: u64) {
        o.header("gatehouse_build_info", "gauge", "Version of the running binary.");
        o.sample("gatehouse_build_info", &[("version", env!("CARGO_PKG_VERSION"))], 1);
        o.header("gatehouse_start_time_seconds", "gauge", "When the process started (Unix time).");
        o.sample("gatehouse_start_time_seconds", &[], unix_ms(self.started) as f64 / 1000.0);
        o.header("gatehouse_workers", "gauge", "Worker threads.");
        o.sample("gatehouse_workers", &[], self.workers);
        o.header("gatehouse_config_version", "gauge", "Version of the running configuration.");
        o.sample("gatehouse_config_version", &[], config_version);
        o.header(
            "gatehouse_config_reloads_total",
            "counter",
            "Configuration changes applied (ok) or refused (failed).",
        );
        o.sample("gatehouse_config_reloads_total", &[("result", "ok")], self.reloads_ok.load(Relaxed));
        o.sample("gatehouse_config_reloads_total", &[("result", "failed")], self.reloads_failed.load(Relaxed));
        o.header(
            "gatehouse_config_last_reload_success_timestamp_seconds",
            "gauge",
            "When the running configuration was applied (Unix time).",
        );
        o.sample(
            "gatehouse_config_last_reload_success_timestamp_seconds",
            &[],
            self.last_ok_unix_ms.load(Relaxed) as f64 / 1000.0,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reloads_are_counted_by_result() {
        let m = ProcessMetrics::new(3);
        m.reloaded(true);
        m.reloaded(false);
        m.reloaded(false);
        let mut o = Exposition::default();
        m.render(&mut o, 7);
        let text = o.into_text();
        assert!(text.contains("gatehouse_config_reloads_total{result=\"ok\"} 1\n"));
        assert!(text.contains("gatehouse_config_reloads_total{result=\"failed\"} 2\n"));
        assert!(text.contains("gatehouse_config_version 7\n"));
        assert!(text.contains("gatehouse_workers 3\n"));
    }
}
