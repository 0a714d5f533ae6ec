//! What a plane is to the node, and what the node lends every plane.
//!
//! A plane is a service built once at start-up, handed every new config in
//! two steps (prepare, then commit), drained at the end, and asked for its
//! metrics, status and health-check targets ([`Plane`]). The shape is
//! pingora's `Server` and `Service`, with the config swap made explicit.
//! What planes share comes from the node through [`Init`]: endpoint
//! [`health`], the listening sockets ([`listeners`]), and the Prometheus
//! writer ([`metrics`]).
//!
//! A change is all or nothing across planes: the node prepares every plane
//! first (compiling, loading certificates, binding new sockets), and only
//! when all of them accept does it commit each one. A prepared change that
//! is dropped instead of committed leaves its plane as it was.

#![forbid(unsafe_code)]

pub mod health;
pub mod listeners;
pub mod metrics;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gatehouse_config::{Config, FieldError, HealthCheck};
use serde_json::{Map, Value};

use crate::health::{EndpointHealth, HealthRegistry};
use crate::listeners::Listeners;
use crate::metrics::Exposition;

/// `p` from the config, relative to `base` unless absolute.
pub fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() { p.to_path_buf() } else { base.join(p) }
}

/// What a plane is given when it is built, before its first config.
pub struct Init<'a> {
    /// The config the process starts with (decoded and validated).
    pub config: &'a Config,
    /// Worker threads per plane that has workers: fixed for the life of the
    /// process (it sizes per-worker tables).
    pub workers: usize,
    /// Endpoint health, shared by every plane and kept across reloads.
    pub health: Arc<HealthRegistry>,
    /// Listening sockets: handed over by a previous process, or bound here.
    pub listeners: Arc<Listeners>,
}

/// What a plane needs to know to prepare a config.
pub struct Prepare<'a> {
    /// The version the config will have once committed.
    pub version: u64,
    /// Relative paths in the config are relative to this directory.
    pub base_dir: &'a Path,
    pub purpose: Purpose,
}

/// Why a config is prepared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// `gatehouse check`: read files, write none, bind nothing.
    Check,
    /// Whether a change would be accepted: may write what applying it would
    /// (generated certificates), binds nothing, is never committed.
    Trial,
    /// To be committed.
    Apply,
}

/// A config a plane has prepared and would run.
pub trait Staged: Send {
    /// Puts it in service. Cannot fail: everything that could was done in
    /// [`Plane::prepare`].
    fn commit(self: Box<Self>);
}

/// How the process starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Nothing else runs on this config.
    Fresh,
    /// A running process is handing its sockets over; it lets go of what it
    /// cannot share (interfaces) only after [`Plane::took_over`].
    TakingOver,
}

/// An endpoint whose health a plane reads: kept in the registry while some
/// plane names it, and checked actively when it has a check.
pub struct HealthTarget {
    /// The registry group (an upstream's name, `l4/SERVICE` for L4).
    pub group: String,
    pub health: Arc<EndpointHealth>,
    pub check: Option<HealthCheck>,
}

/// Why a plane could not start.
#[derive(Debug)]
pub struct PlaneError {
    pub plane: &'static str,
    /// The config field at fault, when one is.
    pub path: Option<String>,
    pub message: String,
}

impl PlaneError {
    pub fn new(plane: &'static str, message: impl Into<String>) -> Self {
        PlaneError { plane, path: None, message: message.into() }
    }

    pub fn at(plane: &'static str, path: impl Into<String>, message: impl Into<String>) -> Self {
        PlaneError { plane, path: Some(path.into()), message: message.into() }
    }
}

impl std::fmt::Display for PlaneError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}: {p}: {}", self.plane, self.message),
            None => write!(f, "{}: {}", self.plane, self.message),
        }
    }
}

impl std::error::Error for PlaneError {}

/// A service under the node: L7, L4, and the planes to come.
pub trait Plane: Send + Sync {
    /// For logs and errors: `l7`, `l4`.
    fn name(&self) -> &'static str;

    /// Compiles `config` into what this plane would run, touching no
    /// traffic. Errors name config fields.
    fn prepare(&self, config: &Arc<Config>, cx: &Prepare<'_>) -> Result<Box<dyn Staged>, Vec<FieldError>>;

    /// Starts serving the config committed first.
    fn start(&self, how: Start) -> Result<(), PlaneError>;

    /// After a takeover: the previous process has been told to stop, and
    /// what its plane of the same name handed over was given to
    /// [`Plane::take_over_state`].
    fn took_over(&self) {}

    /// Called on the process being replaced, once the new one serves: this
    /// plane's live state for the new process (WireGuard: its sessions), or
    /// `None`. The plane stops the work that state belongs to first. It may
    /// hold keys: it goes only over the root-only control socket, and is
    /// zeroed once sent.
    fn hand_over_state(&self) -> Option<zeroize::Zeroizing<Vec<u8>>> {
        None
    }

    /// On the new process, before [`Plane::took_over`]: what the previous
    /// process's plane of this name handed over.
    fn take_over_state(&self, _state: &[u8]) {}

    /// On the process that was to be replaced, when the new one received
    /// the sockets but never said it serves (it failed or exited): this
    /// process goes on serving, and takes back what the new one may have
    /// begun to take (the L4 plane: its XDP programs).
    fn takeover_abandoned(&self) {}

    /// Stops taking new work and lets work in progress finish.
    fn drain(&self);

    /// Work in progress the drain waits for (open connections).
    fn in_progress(&self) -> u64 {
        0
    }

    /// Adds this plane's series to the Prometheus exposition.
    fn metrics(&self, out: &mut Exposition);

    /// Adds this plane's sections to `/status`.
    fn status(&self, _out: &mut Map<String, Value>) {}

    /// Every endpoint whose health this plane reads, in the running config.
    fn health_targets(&self, out: &mut Vec<HealthTarget>);

    /// The addresses this plane serves that its config marks `announce:
    /// true`, each with whether it can serve them now. Called often (the
    /// BGP announcer polls it): reads, never waits.
    fn vips(&self, _out: &mut Vec<Vip>) {}

    /// The node's active/standby role changed (keepalived's notify), or is
    /// given before the start.
    fn set_ha_role(&self, _role: gatehouse_config::HaRole) {}

    /// Whether the plane serves what its config asks (keepalived's
    /// `track_script` asks, through `gatehouse ha`): Err says what does not.
    fn ready(&self) -> Result<(), NotReady> {
        Ok(())
    }
}

/// An address a plane wants announced to the routers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vip {
    pub address: std::net::IpAddr,
    /// It has a healthy backend (real server, upstream endpoint, or a route
    /// that answers itself) and the plane serves it.
    pub healthy: bool,
    /// What serves it, for `/status`: `listener web`, `l4 service dns`.
    pub of: String,
}

/// Why a plane does not serve what its config asks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// It has work in its config but is not running it (its start error
    /// is in the log).
    #[error("the {0} plane is not running")]
    NotRunning(&'static str),
    /// One of its threads has stopped.
    #[error("a {0} thread has stopped")]
    ThreadStopped(&'static str),
}
