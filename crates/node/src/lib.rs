//! The Gatehouse process. A [`Node`] owns the running config and its
//! version, the store it comes from (the file, or etcd), the one path every
//! change takes ([`Node::apply`]: SIGHUP, the admin API and etcd's watch),
//! signals and the drain, the control socket a new binary takes the
//! listening sockets over by, and the active health checks. The planes (L7,
//! L4, ...) run under it as [`gatehouse_plane::Plane`]s; none of them
//! knows another.
//!
//! The admin API talks to the node, never to a plane.
//!
//! `unsafe` is confined to `handover::fds` (owning descriptors received
//! over the control socket).

mod apply;
pub mod bgp;
mod control;
pub mod handover;
pub mod metrics;
mod run;
pub mod store;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use serde_json::{Map, Value, json};

pub use apply::{ApplyError, Change, Expect, Written, merge_patch, named_entry};
pub use control::{Control, Running, Versions};
pub use run::{AdminStart, HaRequestError, MakePlanes, RunError, check, ha_request, run};

use gatehouse_plane::Plane;
use gatehouse_plane::health::HealthRegistry;
use gatehouse_plane::listeners::Listeners;
use gatehouse_plane::metrics::Exposition;

use crate::metrics::ProcessMetrics;
use crate::store::Store;

/// The process.
pub struct Node {
    config_path: PathBuf,
    base_dir: PathBuf,
    running: ArcSwap<Running>,
    control: Mutex<Control>,
    planes: Vec<Arc<dyn Plane>>,
    health: Arc<HealthRegistry>,
    listeners: Arc<Listeners>,
    store: Arc<dyn Store>,
    pub metrics: ProcessMetrics,
    /// The admin listener's socket (a duplicate), for a takeover.
    admin_socket: Option<(SocketAddr, TcpListener)>,
    /// Set when a new process has taken the sockets over: time to drain.
    handed_over: tokio::sync::Notify,
    /// Admin API writes take turns.
    write_lock: tokio::sync::Mutex<()>,
    /// The active/standby role, when the config has `l4.ha`.
    ha: Mutex<Option<HaState>>,
    /// What this node announces to the routers (`bgp`).
    pub bgp: bgp::Announcer,
    /// Wakes the announcer's daemon task when the `bgp` section changes.
    bgp_changed: tokio::sync::Notify,
}

/// The node's active/standby role, as keepalived's notify set it last.
#[derive(Clone, Copy, Debug)]
pub struct HaState {
    pub role: gatehouse_config::HaRole,
    pub since: SystemTime,
    pub changes: u64,
}

/// The first plane that does not serve what its config asks, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{plane}: {reason}")]
pub struct PlaneNotReady {
    pub plane: &'static str,
    pub reason: gatehouse_plane::NotReady,
}

/// Why a role could not be set.
#[derive(Debug)]
pub struct HaError;

impl std::fmt::Display for HaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the config has no l4.ha section: this node has no active/standby role")
    }
}

impl std::error::Error for HaError {}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Node {
    /// The config in service.
    pub fn running(&self) -> Arc<Running> {
        self.running.load_full()
    }

    /// The control state, even if a panic poisoned its lock.
    pub fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// Whether every plane serves what its config asks: the first that
    /// does not, and why.
    pub fn ready(&self) -> Result<(), PlaneNotReady> {
        for p in &self.planes {
            p.ready().map_err(|reason| PlaneNotReady { plane: p.name(), reason })?;
        }
        Ok(())
    }

    /// The active/standby role, when there is one.
    pub fn ha(&self) -> Option<HaState> {
        *self.ha.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// keepalived's notify: every plane takes the role. Setting the role it
    /// has changes nothing.
    pub fn set_ha_role(&self, role: gatehouse_config::HaRole) -> Result<HaState, HaError> {
        let mut ha = self.ha.lock().unwrap_or_else(|e| e.into_inner());
        let running = self.running.load().config.l4.as_ref().is_some_and(|l| l.ha.is_some());
        let state = match (ha.as_mut(), running) {
            (Some(h), _) if h.role == role => return Ok(*h),
            (Some(h), true) => {
                h.role = role;
                h.since = SystemTime::now();
                h.changes += 1;
                *h
            }
            (None, true) => *ha.insert(HaState { role, since: SystemTime::now(), changes: 1 }),
            (_, false) => return Err(HaError),
        };
        for p in &self.planes {
            p.set_ha_role(role);
        }
        tracing::info!(role = role.name(), "high availability: role set");
        Ok(state)
    }

    /// Tells the announcer what the planes serve now and whether the node
    /// is fit to serve it.
    pub fn announce(&self) {
        if !self.bgp.enabled() {
            return;
        }
        let mut vips = Vec::new();
        for p in &self.planes {
            p.vips(&mut vips);
        }
        self.bgp.update(vips, self.ready().err().map(|e| e.to_string()));
    }

    /// `POST /drain` (`true`): withdraws every VIP from the routers and
    /// keeps serving; `DELETE /drain` (`false`): announces them again by
    /// health. False when the config has no `bgp` section.
    pub fn set_drained(&self, drained: bool) -> bool {
        let enabled = self.bgp.drain(drained.then_some(bgp::DrainReason::Admin));
        if enabled {
            tracing::info!(drained, "bgp: drain set through the admin API");
        }
        enabled
    }

    /// The Prometheus exposition of the process and every plane.
    pub fn scrape(&self) -> String {
        self.expose(Exposition::default()).into_text()
    }

    fn expose(&self, mut o: Exposition) -> Exposition {
        self.metrics.render(&mut o, self.running.load().version);
        self.bgp.metrics(&mut o);
        self.store.metrics(&mut o);
        for p in &self.planes {
            p.metrics(&mut o);
        }
        o
    }

    /// `/stats`, what the dashboard polls: the time (Unix milliseconds),
    /// `/status`, and every figure of `/metrics` as JSON, read from the
    /// same counters (nothing more is counted for it).
    pub fn stats(&self) -> Value {
        json!({
            "at": gatehouse_plane::metrics::unix_ms(SystemTime::now()),
            "status": self.status(),
            "metrics": self.expose(Exposition::json()).into_json(),
        })
    }

    /// `/status`: what is running, in one document.
    pub fn status(&self) -> Value {
        let now = SystemTime::now();
        let started = self.metrics.started;
        let mut m = Map::new();
        m.insert("version".into(), json!(env!("CARGO_PKG_VERSION")));
        m.insert("store".into(), self.store.describe());
        m.insert("started".into(), json!(unix_seconds(started).floor()));
        let uptime = now.duration_since(started).map_or(0.0, |d| (d.as_secs_f64() * 10.0).round() / 10.0);
        m.insert("uptime_seconds".into(), json!(uptime));
        m.insert("workers".into(), json!(self.metrics.workers));
        m.insert("config_version".into(), json!(self.running.load().version));
        if let Some(h) = self.ha() {
            m.insert(
                "ha".into(),
                json!({"role": h.role.name(), "since": unix_seconds(h.since).floor(), "changes": h.changes}),
            );
        }
        if let Some(b) = self.bgp.status() {
            m.insert("bgp".into(), b);
        }
        for p in &self.planes {
            p.status(&mut m);
        }
        Value::Object(m)
    }
}
