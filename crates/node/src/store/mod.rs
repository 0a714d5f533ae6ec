//! Where the config lives: the config file alone ([`FileStore`]), or the
//! file with its routes, upstreams and certificates kept in etcd and shared
//! by every node ([`etcd::Etcd`]). Both sit behind [`Store`]; the node asks
//! it for the document to run, and sends the admin API's writes through it.

pub mod etcd;
mod file;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, MutexGuard};

use gatehouse_config::ConfigErrors;
use gatehouse_config::yaml::Node as Doc;
use serde_json::Value;

pub use file::{FileStore, base_dir, read_document, write_atomically};

use crate::control::{Control, Versions};
use gatehouse_plane::metrics::Exposition;

/// A future the store runs on the control thread.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The document to run, and the versions the store gives its resources
/// (`None`: the node numbers them by config version).
pub struct Composed {
    pub doc: Doc,
    pub versions: Option<Versions>,
}

/// One resource change, checked against the whole resulting config, ready
/// for the store.
pub struct Planned {
    pub kind: &'static str,
    pub name: String,
    /// The entry to store, or `None` to delete.
    pub entry: Option<Value>,
    /// The version the change was based on (0: the resource did not exist).
    pub expected: u64,
    pub existed: bool,
    /// Where the entry is in `doc` (`routes[3]`; not for a delete).
    pub within: Option<String>,
    /// The config version the change was made to.
    pub base_version: u64,
    /// The whole document with the change.
    pub doc: Doc,
}

/// What a resource write came to.
pub struct Committed {
    /// The resource's new version (for a delete: the config version, or the
    /// store's revision; see [`Store::version_name`]).
    pub version: u64,
}

/// Why the store could not give or take a whole document.
#[derive(Debug)]
pub enum StoreError {
    /// The store's resources do not fit the config file's document (a
    /// resource list that is not a list).
    Merge(String),
    /// The file could not be written.
    Write { path: std::path::PathBuf, error: std::io::Error },
    /// This store keeps resources one by one, not whole documents.
    WholeDocuments,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Merge(m) => f.write_str(m),
            StoreError::Write { path, error } => write!(f, "{}: cannot write the config: {error}", path.display()),
            StoreError::WholeDocuments => {
                f.write_str("with store: etcd, change routes, upstreams and certificates one by one")
            }
        }
    }
}

impl std::error::Error for StoreError {}

/// Why a write did not happen. Nothing changed in any case.
#[derive(Debug)]
pub enum WriteError {
    /// There is no such resource.
    NotFound(String),
    /// The resource is not at the version the write expected, or the
    /// running config cannot take it.
    Conflict(String),
    /// The request itself is wrong: (field path, message).
    BadEntry { path: Option<String>, message: String },
    /// The resulting config is invalid; `within` is the path of the
    /// resource written (`routes[3]`), when it is in the document.
    Invalid { errors: ConfigErrors, within: Option<String> },
    /// The store cannot take writes now.
    Unavailable(String),
    /// The store failed to write.
    Failed(String),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::NotFound(m) | WriteError::Conflict(m) | WriteError::Unavailable(m) | WriteError::Failed(m) => {
                f.write_str(m)
            }
            WriteError::BadEntry { path: Some(p), message } => write!(f, "{p}: {message}"),
            WriteError::BadEntry { path: None, message } => f.write_str(message),
            WriteError::Invalid { errors, .. } => write!(f, "{errors}"),
        }
    }
}

impl std::error::Error for WriteError {}

/// The node as a store sees it: what a store brings in step with the
/// changes it takes (the admin API's writes) and the ones it sees (etcd's
/// watch). The node implements it; a store never names the node itself.
pub trait Target: Send + Sync {
    /// The control state, locked: writes take turns on it.
    fn control(&self) -> MutexGuard<'_, Control>;

    /// The running config's version.
    fn version(&self) -> u64;

    /// Makes `doc` the running config (and, when `persist`, the config
    /// file's); returns its version. A refusal is said as a write error
    /// about the resource at `within` (`routes[3]`), the running config
    /// unchanged.
    fn apply(&self, control: &mut Control, doc: Doc, persist: bool, within: Option<String>) -> Result<u64, WriteError>;

    /// Whether `doc` would be accepted, changing nothing.
    fn check(&self, doc: &Doc, within: Option<String>) -> Result<(), WriteError>;

    /// Counts a change that came from the store and was refused.
    fn refused(&self);
}

/// Where the config lives.
pub trait Store: Send + Sync {
    /// `file` or `etcd`.
    fn kind(&self) -> &'static str;

    /// What `/status` says about the store.
    fn describe(&self) -> Value;

    /// The store's series in `/metrics`.
    fn metrics(&self, _out: &mut Exposition) {}

    /// Reads what the store holds, once, before the first config.
    fn load(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// The document to run, made from the config file's.
    fn compose(&self, local: &Doc) -> Result<Composed, StoreError>;

    /// Whether the admin API may replace the whole document at once.
    fn takes_documents(&self) -> bool;

    /// Writes a whole document the node has accepted.
    fn save(&self, doc: &Doc) -> Result<(), StoreError>;

    /// Name of what a delete reports as its version: `config_version` or
    /// `revision`.
    fn version_name(&self) -> &'static str;

    /// A resource as the store holds it, and its version.
    fn current(&self, control: &Control, kind: &'static str, name: &str) -> Option<(Value, u64)>;

    /// Stores a planned change, then brings `node` in step with it.
    fn commit<'a>(&'a self, node: &'a dyn Target, plan: Planned) -> BoxFuture<'a, Result<Committed, WriteError>>;

    /// Keeps the node in step with the store for the life of the process
    /// (etcd's watch); `None` when nothing changes behind the node's back.
    fn follow(self: Arc<Self>, _node: Arc<dyn Target>) -> Option<BoxFuture<'static, ()>> {
        None
    }
}
