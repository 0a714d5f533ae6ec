//! The node's config state: the config in service, and what the paths
//! that change it (SIGHUP, the admin API, the store's watch) share while
//! they take turns.

use std::collections::HashMap;
use std::sync::Arc;

use gatehouse_config::Config;
use gatehouse_config::yaml::Node as Doc;
use gatehouse_plane::health::HealthChecks;

/// Each resource's version, by (list, name).
pub type Versions = HashMap<(&'static str, String), u64>;

/// The config in service.
pub struct Running {
    pub version: u64,
    pub config: Arc<Config>,
}

/// What changes the config, behind [`crate::Node::control`]: SIGHUP, the admin API
/// and the store's watch take turns on it.
pub struct Control {
    /// The active health checks, reconciled with each config applied.
    pub(crate) checks: HealthChecks,
    /// The running config as a document: what the admin API reads and edits.
    pub doc: Doc,
    /// The config file's document. The same as `doc` with the file store;
    /// with etcd, `doc` is this with its resource lists taken from etcd.
    pub local: Doc,
    /// Each resource's version, by (list, name): the config version that last
    /// changed it (with etcd: its mod revision).
    pub versions: Versions,
}
