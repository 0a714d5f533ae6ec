//! The one path a config change takes, whatever sent it: decode and
//! validate the document, prepare every plane (any error: nothing changes),
//! store it when asked, then commit every plane and swap the running config.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};

use gatehouse_config::yaml::Node as Doc;
use gatehouse_config::{Config, ConfigErrors, FieldError, doc};
use serde_json::{Map, Value};

use crate::store::{Planned, StoreError, Target, WriteError};
use crate::{Control, Node, Running, Versions};
use gatehouse_plane::{HealthTarget, Prepare, Purpose, Staged};

/// Why a change was not applied. Nothing changed in either case.
#[derive(Debug)]
pub enum ApplyError {
    /// The resulting config is invalid (or a plane cannot take it: a new
    /// listener that cannot bind).
    Invalid(ConfigErrors),
    /// The store could not write it.
    Store(StoreError),
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::Invalid(e) => write!(f, "{e}"),
            ApplyError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ApplyError {}

impl ApplyError {
    /// As the error of a resource write to the entry at `within` (its
    /// path in the config: `routes[3]`).
    pub fn into_write_error(self, within: Option<String>) -> WriteError {
        match self {
            ApplyError::Invalid(errors) => WriteError::Invalid { errors, within },
            ApplyError::Store(e) => WriteError::Failed(e.to_string()),
        }
    }
}

/// What a write expects of the version of what it changes (`If-Match`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Nothing.
    Nothing,
    /// That it exists.
    Exists,
    /// That it is at this version.
    Version(u64),
}

impl Expect {
    /// Whether `current` (`None`: absent) meets the expectation.
    fn check(self, current: Option<u64>, what: &str) -> Result<(), WriteError> {
        match (self, current) {
            (Expect::Nothing, _) | (Expect::Exists, Some(_)) => Ok(()),
            (Expect::Version(want), Some(have)) if want == have => Ok(()),
            (Expect::Exists, None) => Err(WriteError::Conflict(format!("{what} does not exist (If-Match: *)"))),
            (Expect::Version(want), Some(have)) => Err(WriteError::Conflict(format!(
                "{what} is at version {have}, not {want} (If-Match): read it again and retry"
            ))),
            (Expect::Version(want), None) => {
                Err(WriteError::Conflict(format!("{what} does not exist, not at version {want} (If-Match)")))
            }
        }
    }
}

/// A change to one resource.
pub enum Change {
    /// Its fields (`patch`: merged into the current ones, RFC 7396).
    Put {
        fields: Map<String, Value>,
        patch: bool,
    },
    Delete,
}

/// What a resource write came to.
pub struct Written {
    /// The entry as stored (`None` for a delete).
    pub entry: Option<Value>,
    /// Its new version; for a delete, see [`crate::store::Store::version_name`].
    pub version: u64,
    /// It did not exist before.
    pub created: bool,
}

/// Versions of the named entries of one list: unchanged entries keep theirs.
fn entry_versions<T: PartialEq>(
    kind: &'static str,
    lists: (&[T], &[T]),
    name: impl Fn(&T) -> &str,
    version: u64,
    prev: &Versions,
    out: &mut Versions,
) {
    let (old, new) = lists;
    for e in new {
        let key = (kind, name(e).to_string());
        let same = old.iter().find(|o| name(o) == key.1).is_some_and(|o| o == e);
        let v = match prev.get(&key) {
            Some(&v) if same => v,
            _ => version,
        };
        out.insert(key, v);
    }
}

pub(crate) fn resource_versions(old: &Config, new: &Config, version: u64, prev: &Versions) -> Versions {
    let mut out = HashMap::new();
    entry_versions("routes", (&old.routes, &new.routes), |r| &r.name, version, prev, &mut out);
    entry_versions("upstreams", (&old.upstreams, &new.upstreams), |u| &u.name, version, prev, &mut out);
    entry_versions("certificates", (&old.certificates, &new.certificates), |c| &c.name, version, prev, &mut out);
    // Peers by INTERFACE/PEER, unchanged ones keeping their versions.
    let peers = |c: &Config| -> Vec<(String, gatehouse_config::WgPeer)> {
        c.wireguard
            .iter()
            .flat_map(|w| &w.interfaces)
            .flat_map(|i| i.peers.iter().map(move |p| (format!("{}/{}", i.name, p.name), p.clone())))
            .collect()
    };
    let (old_peers, new_peers) = (peers(old), peers(new));
    entry_versions(doc::PEERS, (&old_peers, &new_peers), |(n, _)| n, version, prev, &mut out);
    out
}

/// The stored form of a resource: `name` (from the path) first, then the
/// fields as sent. A `name` field that differs from the path is refused.
pub fn named_entry(what: &str, name: &str, value: Value) -> Result<Value, WriteError> {
    let Value::Object(fields) = value else {
        return Err(WriteError::BadEntry { path: None, message: format!("{what} must stay a JSON object") });
    };
    if let Some(n) = fields.get("name")
        && n.as_str() != Some(name)
    {
        return Err(WriteError::BadEntry {
            path: Some("name".into()),
            message: format!("must be {name:?}, the name in the path"),
        });
    }
    let mut entry = Map::new();
    entry.insert("name".into(), Value::from(name));
    entry.extend(fields.into_iter().filter(|(k, _)| k != "name"));
    Ok(Value::Object(entry))
}

/// RFC 7396 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.shift_remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// A decoded config and every plane's staged form of it.
pub(crate) type Prepared = (Arc<Config>, Vec<Box<dyn Staged>>);

impl Target for Node {
    fn control(&self) -> MutexGuard<'_, Control> {
        Node::control(self)
    }

    fn version(&self) -> u64 {
        self.running().version
    }

    fn apply(&self, control: &mut Control, doc: Doc, persist: bool, within: Option<String>) -> Result<u64, WriteError> {
        Node::apply(self, control, doc, persist).map_err(|e| e.into_write_error(within))
    }

    fn check(&self, doc: &Doc, within: Option<String>) -> Result<(), WriteError> {
        self.check_doc(doc).map_err(|e| e.into_write_error(within))
    }

    fn refused(&self) {
        self.metrics.reloaded(false);
    }
}

impl Node {
    fn config_errors(&self, errors: Vec<FieldError>) -> ConfigErrors {
        ConfigErrors { file: self.config_path.clone(), errors }
    }

    /// Decodes a document and prepares every plane for it.
    pub(crate) fn prepare(&self, doc: &Doc, version: u64, purpose: Purpose) -> Result<Prepared, ConfigErrors> {
        let cfg = Arc::new(gatehouse_config::from_node(doc, &self.config_path)?);
        let staged = prepare_planes(&self.planes, &cfg, version, &self.base_dir, purpose)
            .map_err(|errors| self.config_errors(errors))?;
        Ok((cfg, staged))
    }

    /// Applies a new config document: every plane prepares it (any error:
    /// nothing changes, and new sockets close again), the store writes it
    /// when `persist` (the admin API; a reload read it from there), then
    /// every plane commits it. Returns the new config version.
    pub fn apply(&self, control: &mut Control, doc: Doc, persist: bool) -> Result<u64, ApplyError> {
        let current = self.running.load_full();
        let version = current.version + 1;
        let (cfg, staged) = self.prepare(&doc, version, Purpose::Apply).map_err(ApplyError::Invalid)?;
        if persist {
            self.store.save(&doc).map_err(ApplyError::Store)?;
        }
        control.versions = resource_versions(&current.config, &cfg, version, &control.versions);
        if self.store.takes_documents() {
            control.local = doc.clone();
        }
        control.doc = doc;
        self.running.store(Arc::new(Running { version, config: cfg }));
        for s in staged {
            s.commit();
        }
        self.metrics.reloaded(true);
        self.reconcile_health(control);
        if let Err(e) = self.bgp.configure(self.running.load().config.bgp.as_ref()) {
            tracing::error!("bgp.interface: {e}; no VIP is announced");
        }
        self.bgp_changed.notify_one();
        Ok(version)
    }

    /// Whether a document would be accepted by [`Node::apply`], without
    /// applying it.
    pub fn check_doc(&self, doc: &Doc) -> Result<(), ApplyError> {
        let version = self.running.load().version + 1;
        self.prepare(doc, version, Purpose::Trial).map(|_| ()).map_err(ApplyError::Invalid)
    }

    /// Active checks for every target that has one; the registry forgets
    /// endpoints no plane names any more.
    pub(crate) fn reconcile_health(&self, control: &mut Control) {
        let mut targets: Vec<HealthTarget> = Vec::new();
        for p in &self.planes {
            p.health_targets(&mut targets);
        }
        let keep: Vec<(String, std::net::SocketAddr)> =
            targets.iter().map(|t| (t.group.clone(), t.health.addr)).collect();
        control.checks.reconcile(targets.into_iter().filter_map(|t| t.check.map(|c| (t.group, t.health, c))).collect());
        self.health.retain(&|g, a| keep.iter().any(|(kg, ka)| kg == g && *ka == a));
    }

    /// Re-reads the config file (merged with the store's resources) and
    /// applies it: SIGHUP, and the admin API's `POST /config/reload`.
    /// Returns the new version. On any error: logs every problem and keeps
    /// the running config, listeners included.
    pub fn reload(&self) -> Result<u64, ApplyError> {
        let result = self.reload_inner();
        match &result {
            Ok(version) => tracing::info!(version, "configuration reloaded"),
            Err(e) => {
                for line in e.to_string().lines() {
                    tracing::error!("reload refused: {line}");
                }
                tracing::error!(version = self.running.load().version, "reload refused; the running config stays");
                self.metrics.reloaded(false);
            }
        }
        result
    }

    fn reload_inner(&self) -> Result<u64, ApplyError> {
        let local = crate::store::read_document(&self.config_path).map_err(ApplyError::Invalid)?;
        let composed = self.store.compose(&local).map_err(ApplyError::Store)?;
        let mut control = self.control();
        let version = self.apply(&mut control, composed.doc, false)?;
        control.local = local;
        if let Some(v) = composed.versions {
            control.versions = v;
        }
        Ok(version)
    }

    /// Replaces the whole document (the admin API's `PUT /config`), written
    /// back to the store. Returns the new config version.
    pub async fn replace_document(&self, doc: Doc, expect: Expect) -> Result<u64, WriteError> {
        if !self.store.takes_documents() {
            return Err(WriteError::Conflict(StoreError::WholeDocuments.to_string()));
        }
        let _turn = self.write_lock.lock().await;
        let mut control = self.control();
        expect.check(Some(self.running.load().version), "the config")?;
        self.apply(&mut control, doc, true).map_err(|e| e.into_write_error(None))
    }

    /// Writes one resource of `kind` through the store: checked against
    /// `expect`, merged when a patch, validated as part of the whole config.
    pub async fn write_resource(
        &self,
        kind: &'static str,
        name: &str,
        change: Change,
        expect: Expect,
    ) -> Result<Written, WriteError> {
        let what = format!("{kind}/{name}");
        let _turn = self.write_lock.lock().await;
        let plan = {
            let control = self.control();
            let current = self.store.current(&control, kind, name);
            let entry = match change {
                Change::Delete => {
                    if current.is_none() {
                        return Err(WriteError::NotFound(format!("no {what}")));
                    }
                    expect.check(current.as_ref().map(|c| c.1), &what)?;
                    None
                }
                Change::Put { fields, patch } => {
                    expect.check(current.as_ref().map(|c| c.1), &what)?;
                    let mut value = Value::Object(fields);
                    if patch {
                        let Some((base, _)) = &current else {
                            return Err(WriteError::NotFound(format!("no {what} to patch")));
                        };
                        let mut merged = base.clone();
                        merge_patch(&mut merged, &value);
                        value = merged;
                    }
                    Some(named_entry(&what, doc::locate(kind, name).name, value)?)
                }
            };
            let mut new_doc = control.doc.clone();
            let loc = doc::locate(kind, name);
            let (list, list_path) = doc::entries_mut(&mut new_doc, kind, loc.scope)
                .map_err(|e| WriteError::Conflict(format!("the running config cannot take {what}: {e}")))?;
            let at = list.iter().position(|e| doc::entry_name(kind, e) == Some(loc.name));
            let index = match (&entry, at) {
                (Some(e), Some(i)) => {
                    list[i] = doc::from_json(e);
                    Some(i)
                }
                (Some(e), None) => {
                    list.push(doc::from_json(e));
                    Some(list.len() - 1)
                }
                (None, Some(i)) => {
                    list.remove(i);
                    None
                }
                (None, None) => None,
            };
            let within = index.map(|i| format!("{list_path}[{i}]"));
            Planned {
                kind,
                name: name.to_string(),
                entry,
                expected: current.as_ref().map_or(0, |c| c.1),
                existed: current.is_some(),
                within,
                base_version: self.running.load().version,
                doc: new_doc,
            }
        };
        let (entry, created) = (plan.entry.clone(), !plan.existed);
        let committed = self.store.commit(self, plan).await?;
        Ok(Written { entry, version: committed.version, created })
    }
}

/// Prepares every plane; the errors of all of them, or all staged.
pub(crate) fn prepare_planes(
    planes: &[Arc<dyn gatehouse_plane::Plane>],
    cfg: &Arc<Config>,
    version: u64,
    base_dir: &std::path::Path,
    purpose: Purpose,
) -> Result<Vec<Box<dyn Staged>>, Vec<FieldError>> {
    let cx = Prepare { version, base_dir, purpose };
    let mut staged = Vec::new();
    let mut errors = Vec::new();
    for p in planes {
        match p.prepare(cfg, &cx) {
            Ok(s) => staged.push(s),
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() { Ok(staged) } else { Err(errors) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_patch_merges_and_null_removes() {
        let mut v = json!({ "a": 1, "b": { "c": 2, "d": 3 } });
        merge_patch(&mut v, &json!({ "a": null, "b": { "c": 5 }, "e": [1] }));
        assert_eq!(v, json!({ "b": { "c": 5, "d": 3 }, "e": [1] }));
    }

    #[test]
    fn the_name_comes_from_the_path() {
        let e = named_entry("routes/x", "x", json!({ "upstream": "u" })).expect("named");
        assert_eq!(e, json!({ "name": "x", "upstream": "u" }));
        let wrong = named_entry("routes/x", "x", json!({ "name": "y" }));
        assert!(matches!(wrong, Err(WriteError::BadEntry { path: Some(p), .. }) if p == "name"));
        assert!(matches!(named_entry("routes/x", "x", json!([1])), Err(WriteError::BadEntry { path: None, .. })));
    }

    #[test]
    fn expectations_name_the_versions() {
        assert!(Expect::Nothing.check(None, "r").is_ok());
        assert!(Expect::Exists.check(Some(3), "r").is_ok());
        assert!(Expect::Version(3).check(Some(3), "r").is_ok());
        let e = Expect::Version(2).check(Some(3), "routes/a").expect_err("stale");
        assert_eq!(e.to_string(), "routes/a is at version 3, not 2 (If-Match): read it again and retry");
        assert!(matches!(Expect::Exists.check(None, "r"), Err(WriteError::Conflict(_))));
    }
}
