//! The cluster store: routes, upstreams and certificates kept in etcd and
//! shared by every node (`store: { type: etcd }`).
//!
//! Each resource is one key, `PREFIX/KIND/NAME`, holding its JSON. A node
//! keeps a mirror of everything under the prefix: it reads it all, remembers
//! the revision, watches from the next one and applies each change to the
//! mirror and then, merged into its local config file, through the same
//! validation and snapshot swap as any change. A compaction that outran the
//! watch, or a lost connection, ends in a full re-read. While etcd cannot be
//! reached the node keeps serving its last good config, says so in `/status`
//! and `/metrics`, and starts from a cache of the last mirror if it restarts
//! meanwhile. Writes through the admin API go to etcd in a transaction that
//! compares the key's mod revision, so a stale write loses on every node.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Txn, TxnOp, WatchOptions};
use gatehouse_config::EtcdStore;
use gatehouse_config::doc;
use gatehouse_config::yaml::Node as Doc;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{BoxFuture, Committed, Composed, Planned, Store, StoreError, Target, WriteError, write_atomically};
use crate::control::{Control, Versions};
use gatehouse_plane::metrics::Exposition;

/// Everything under the prefix, as last seen.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct Mirror {
    /// "KIND/NAME" → (the resource's JSON, its mod revision).
    pub entries: BTreeMap<String, (Value, i64)>,
    /// The store revision this mirror reflects.
    pub revision: i64,
}

/// Why etcd could not be read or watched; the node keeps serving its last
/// good config and tries again.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Client(#[from] etcd_client::Error),
    #[error("the watch ended")]
    WatchEnded,
    #[error("the watch was cancelled")]
    WatchCancelled,
}

impl Mirror {
    /// `local` with its resource lists replaced by the mirror's, by name.
    pub fn merged_into(&self, local: &Doc) -> Result<Doc, doc::ListError> {
        let mut out = local.clone();
        for kind in doc::KINDS {
            let list = doc::list_mut(&mut out, kind)?;
            list.clear();
            let start = format!("{kind}/");
            for (key, (value, _)) in self.entries.range(start.clone()..) {
                let Some(name) = key.strip_prefix(&start) else { break };
                let mut entry = serde_json::Map::new();
                entry.insert("name".into(), Value::from(name));
                if let Value::Object(fields) = value {
                    entry.extend(fields.iter().filter(|(k, _)| *k != "name").map(|(k, v)| (k.clone(), v.clone())));
                }
                list.push(doc::from_json(&Value::Object(entry)));
            }
        }
        // Peers: every interface's list is the store's, keyed
        // peers/INTERFACE/PEER; the interfaces are the file's.
        for iface in doc::interface_names(&out) {
            doc::entries_mut(&mut out, doc::PEERS, Some(&iface))?.0.clear();
        }
        let start = format!("{}/", doc::PEERS);
        for (key, (value, _)) in self.entries.range(start.clone()..) {
            let Some(full) = key.strip_prefix(&start) else { break };
            let loc = doc::locate(doc::PEERS, full);
            let Ok((list, _)) = doc::entries_mut(&mut out, doc::PEERS, loc.scope) else {
                tracing::warn!(key, "etcd peer ignored: its interface is not in the config file");
                continue;
            };
            let mut entry = serde_json::Map::new();
            entry.insert("name".into(), Value::from(loc.name));
            if let Value::Object(fields) = value {
                entry.extend(fields.iter().filter(|(k, _)| *k != "name").map(|(k, v)| (k.clone(), v.clone())));
            }
            list.push(doc::from_json(&Value::Object(entry)));
        }
        Ok(out)
    }

    /// Each resource's version: its mod revision in etcd (the same on every node).
    pub fn versions(&self) -> Versions {
        let mut out = Versions::new();
        for (key, (_, rev)) in &self.entries {
            if let Some((kind, name)) = key.split_once('/')
                && let Some(kind) = doc::KINDS.iter().copied().chain([doc::PEERS]).find(|k| *k == kind)
            {
                out.insert((kind, name.to_string()), u64::try_from(*rev).unwrap_or(0));
            }
        }
        out
    }
}

/// What `/status` and `/metrics` report about the store.
#[derive(Clone, Default)]
pub struct Health {
    pub connected: bool,
    pub revision: i64,
    pub last_error: Option<String>,
}

pub struct Etcd {
    cfg: EtcdStore,
    client: tokio::sync::Mutex<Option<Client>>,
    mirror: std::sync::Mutex<Mirror>,
    /// Whether the mirror holds etcd's resources (read from etcd or from the
    /// cache); until then the config file's own lists stand.
    loaded: AtomicBool,
    health: std::sync::Mutex<Health>,
    cache: PathBuf,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Etcd {
    pub fn new(cfg: EtcdStore, data_dir: &std::path::Path) -> Etcd {
        Etcd {
            cfg,
            client: tokio::sync::Mutex::new(None),
            mirror: std::sync::Mutex::new(Mirror::default()),
            loaded: AtomicBool::new(false),
            health: std::sync::Mutex::new(Health::default()),
            cache: data_dir.join("etcd-cache.json"),
        }
    }

    pub fn health(&self) -> Health {
        lock(&self.health).clone()
    }

    fn set_health(&self, connected: bool, error: Option<String>) {
        let mut h = lock(&self.health);
        if h.connected != connected || (error.is_some() && h.last_error != error) {
            match &error {
                Some(e) => {
                    tracing::warn!(endpoints = ?self.cfg.endpoints, "etcd unreachable, serving the last good config: {e}")
                }
                None => tracing::info!(endpoints = ?self.cfg.endpoints, "etcd connected"),
            }
        }
        h.connected = connected;
        if error.is_some() {
            h.last_error = error;
        }
        h.revision = lock(&self.mirror).revision;
    }

    fn key(&self, kind: &str, name: &str) -> String {
        format!("{}/{kind}/{name}", self.cfg.prefix)
    }

    async fn client(&self) -> Result<Client, EtcdError> {
        let mut c = self.client.lock().await;
        if let Some(client) = c.as_ref() {
            return Ok(client.clone());
        }
        let opts = ConnectOptions::new()
            .with_connect_timeout(self.cfg.timeout)
            .with_timeout(self.cfg.timeout)
            .with_keep_alive(Duration::from_secs(2), self.cfg.timeout);
        let client = tokio::time::timeout(self.cfg.timeout, Client::connect(&self.cfg.endpoints, Some(opts)))
            .await
            .map_err(|_| EtcdError::Timeout(self.cfg.timeout))??;
        *c = Some(client.clone());
        Ok(client)
    }

    async fn forget_client(&self) {
        *self.client.lock().await = None;
    }

    /// Reads everything under the prefix.
    pub async fn read_all(&self) -> Result<Mirror, EtcdError> {
        let mut client = self.client().await?;
        let prefix = format!("{}/", self.cfg.prefix);
        let resp =
            tokio::time::timeout(self.cfg.timeout, client.get(prefix.as_str(), Some(GetOptions::new().with_prefix())))
                .await
                .map_err(|_| EtcdError::Timeout(self.cfg.timeout))??;
        let mut m = Mirror { revision: resp.header().map_or(0, |h| h.revision()), ..Mirror::default() };
        for kv in resp.kvs() {
            if let Some((k, v)) = self.entry(kv.key_str().unwrap_or(""), kv.value()) {
                m.entries.insert(k, (v, kv.mod_revision()));
            }
        }
        Ok(m)
    }

    /// "KIND/NAME" and the JSON of a key under the prefix; anything else
    /// there (unknown kinds, values that are not JSON objects) is logged and
    /// left out.
    fn entry(&self, key: &str, value: &[u8]) -> Option<(String, Value)> {
        let rest = key.strip_prefix(&self.cfg.prefix)?.strip_prefix('/')?;
        let (kind, name) = rest.split_once('/')?;
        // Peers are INTERFACE/PEER; the rest one name.
        let parts_ok = match kind {
            doc::PEERS => name.split('/').filter(|p| !p.is_empty()).count() == 2 && name.matches('/').count() == 1,
            _ => doc::KINDS.contains(&kind) && !name.is_empty() && !name.contains('/'),
        };
        if !parts_ok {
            tracing::warn!(
                key,
                "etcd key ignored: expected PREFIX/routes|upstreams|certificates/NAME or PREFIX/peers/INTERFACE/NAME"
            );
            return None;
        }
        match serde_json::from_slice::<Value>(value) {
            Ok(v @ Value::Object(_)) => Some((rest.to_string(), v)),
            _ => {
                tracing::error!(key, "etcd value ignored: not a JSON object");
                None
            }
        }
    }

    /// The last mirror saved by this node, for a start while etcd is away.
    pub fn load_cache(&self) -> Option<Mirror> {
        let text = std::fs::read(&self.cache).ok()?;
        serde_json::from_slice(&text).ok()
    }

    fn save_cache(&self, m: &Mirror) {
        match serde_json::to_string(m) {
            Ok(text) => {
                if let Err(e) = write_atomically(&self.cache, &text) {
                    tracing::warn!("cannot write {}: {e}", self.cache.display());
                }
            }
            Err(e) => tracing::warn!("cannot encode the etcd cache: {e}"),
        }
    }

    /// Writes (or with `value` None deletes) one resource if its mod revision
    /// is still `expected` (0: must not exist). Returns the new revision.
    async fn write(&self, kind: &str, name: &str, value: Option<&Value>, expected: i64) -> Result<i64, WriteError> {
        let unavailable =
            |e: EtcdError| WriteError::Unavailable(format!("the store cannot take writes now: etcd: {e}"));
        let mut client = self.client().await.map_err(unavailable)?;
        let key = self.key(kind, name);
        let op = match value {
            Some(v) => TxnOp::put(key.as_str(), v.to_string(), None),
            None => TxnOp::delete(key.as_str(), None),
        };
        let txn = Txn::new().when([Compare::mod_revision(key.as_str(), CompareOp::Equal, expected)]).and_then([op]);
        let resp = tokio::time::timeout(self.cfg.timeout, client.txn(txn))
            .await
            .map_err(|_| unavailable(EtcdError::Timeout(self.cfg.timeout)))?
            .map_err(|e| unavailable(EtcdError::Client(e)))?;
        if !resp.succeeded() {
            return Err(WriteError::Conflict(format!(
                "{kind}/{name} was changed on another node since version {expected}: read it again and retry"
            )));
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut m = lock(&self.mirror);
        let k = format!("{kind}/{name}");
        match value {
            Some(v) => {
                m.entries.insert(k, (v.clone(), revision));
            }
            None => {
                m.entries.remove(&k);
            }
        }
        m.revision = m.revision.max(revision);
        Ok(revision)
    }
}

/// Applies the mirror, merged into the local file's document, to the running
/// config. A mirror that does not validate (someone wrote a bad value into
/// etcd directly) is refused like a bad reload: logged, and the running
/// config stays.
fn apply_mirror(node: &dyn Target, etcd: &Etcd) {
    let mirror = lock(&etcd.mirror).clone();
    etcd.loaded.store(true, Ordering::Relaxed);
    let mut control = node.control();
    let doc = match mirror.merged_into(&control.local) {
        Ok(d) => d,
        Err(e) => return tracing::error!("etcd content cannot be applied: {e}"),
    };
    if doc == control.doc {
        control.versions = mirror.versions();
        return;
    }
    match node.apply(&mut control, doc, false, None) {
        Ok(version) => {
            control.versions = mirror.versions();
            etcd.save_cache(&mirror);
            tracing::info!(version, revision = mirror.revision, "configuration updated from etcd");
        }
        Err(e) => {
            node.refused();
            for line in e.to_string().lines() {
                tracing::error!("etcd change refused: {line}");
            }
        }
    }
}

/// Keeps the node in step with etcd for the life of the process.
async fn run(node: Arc<dyn Target>, etcd: Arc<Etcd>) {
    let mut backoff = Duration::from_millis(200);
    loop {
        match follow(&*node, &etcd).await {
            Ok(()) => backoff = Duration::from_millis(200),
            Err(e) => {
                etcd.forget_client().await;
                etcd.set_health(false, Some(e.to_string()));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// One full read, then the watch from the next revision until it fails or a
/// compaction makes a full read necessary again (`Ok`).
async fn follow(node: &dyn Target, etcd: &Etcd) -> Result<(), EtcdError> {
    let fresh = etcd.read_all().await?;
    let from = fresh.revision + 1;
    *lock(&etcd.mirror) = fresh;
    etcd.set_health(true, None);
    apply_mirror(node, etcd);
    let mut client = etcd.client().await?;
    let prefix = format!("{}/", etcd.cfg.prefix);
    let mut stream =
        client.watch(prefix.as_str(), Some(WatchOptions::new().with_prefix().with_start_revision(from))).await?;
    loop {
        let Some(resp) = stream.message().await? else {
            return Err(EtcdError::WatchEnded);
        };
        if resp.compact_revision() > 0 {
            tracing::warn!(
                compacted = resp.compact_revision(),
                "etcd compacted past the watch; reading everything again"
            );
            return Ok(());
        }
        if resp.canceled() {
            return Err(EtcdError::WatchCancelled);
        }
        if resp.events().is_empty() {
            continue;
        }
        {
            let mut m = lock(&etcd.mirror);
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let key = kv.key_str().unwrap_or("");
                match ev.event_type() {
                    EventType::Put => {
                        if let Some((k, v)) = etcd.entry(key, kv.value()) {
                            m.entries.insert(k, (v, kv.mod_revision()));
                        }
                    }
                    EventType::Delete => {
                        if let Some(rest) = key.strip_prefix(&etcd.cfg.prefix).and_then(|r| r.strip_prefix('/')) {
                            m.entries.remove(rest);
                        }
                    }
                }
                m.revision = m.revision.max(kv.mod_revision());
            }
            if let Some(h) = resp.header() {
                m.revision = m.revision.max(h.revision());
            }
        }
        etcd.set_health(true, None);
        apply_mirror(node, etcd);
    }
}

impl Store for Etcd {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn describe(&self) -> Value {
        let h = self.health();
        json!({
            "type": "etcd",
            "endpoints": self.cfg.endpoints,
            "prefix": self.cfg.prefix,
            "connected": h.connected,
            "revision": h.revision,
            "last_error": h.last_error,
        })
    }

    fn metrics(&self, o: &mut Exposition) {
        let h = self.health();
        o.header("gatehouse_store_connected", "gauge", "1 while the etcd store is reachable and watched.");
        o.sample("gatehouse_store_connected", &[], u8::from(h.connected));
        o.header("gatehouse_store_revision", "gauge", "The etcd revision this node's config reflects.");
        o.sample("gatehouse_store_revision", &[], h.revision);
    }

    /// Starts from etcd's state; if it cannot be reached, from this node's
    /// cache of it; else from the file alone until it returns.
    fn load(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mirror = match self.read_all().await {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(endpoints = ?self.cfg.endpoints, "etcd unreachable at start-up ({e}); using the cached copy of its resources");
                    self.load_cache()
                }
            };
            if let Some(m) = mirror {
                *lock(&self.mirror) = m;
                self.loaded.store(true, Ordering::Relaxed);
            }
        })
    }

    fn compose(&self, local: &Doc) -> Result<Composed, StoreError> {
        if !self.loaded.load(Ordering::Relaxed) {
            return Ok(Composed { doc: local.clone(), versions: None });
        }
        let mirror = lock(&self.mirror).clone();
        let doc = mirror.merged_into(local).map_err(|e| StoreError::Merge(e.to_string()))?;
        Ok(Composed { doc, versions: Some(mirror.versions()) })
    }

    fn takes_documents(&self) -> bool {
        false
    }

    fn save(&self, _doc: &Doc) -> Result<(), StoreError> {
        Err(StoreError::WholeDocuments)
    }

    fn version_name(&self) -> &'static str {
        "revision"
    }

    fn current(&self, _control: &Control, kind: &'static str, name: &str) -> Option<(Value, u64)> {
        let (value, rev) = lock(&self.mirror).entries.get(&format!("{kind}/{name}")).cloned()?;
        Some((value, u64::try_from(rev).unwrap_or(0)))
    }

    /// A transaction that holds only if the key's mod revision is still the
    /// one this node knows (another node may have changed it), then applied
    /// here at once; other nodes get it through their watch.
    fn commit<'a>(&'a self, node: &'a dyn Target, plan: Planned) -> BoxFuture<'a, Result<Committed, WriteError>> {
        Box::pin(async move {
            // The whole resulting config must be valid before anything is written.
            node.check(&plan.doc, plan.within.clone())?;
            let expected = i64::try_from(plan.expected).unwrap_or(i64::MAX);
            let revision = self.write(plan.kind, &plan.name, plan.entry.as_ref(), expected).await?;
            apply_mirror(node, self);
            Ok(Committed { version: u64::try_from(revision).unwrap_or(0) })
        })
    }

    fn follow(self: Arc<Self>, node: Arc<dyn Target>) -> Option<BoxFuture<'static, ()>> {
        Some(Box::pin(run(node, self)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mirror_replaces_the_lists_by_name() {
        let local = gatehouse_config::yaml::parse(
            "listeners: [{ name: web, address: 127.0.0.1:1 }]\nroutes: [{ name: from_file, direct_response: { status: 200 } }]\n",
        )
        .expect("parses");
        let mut m = Mirror { revision: 9, ..Mirror::default() };
        m.entries.insert("routes/b".into(), (serde_json::json!({ "upstream": "u" }), 7));
        m.entries.insert(
            "routes/a".into(),
            (serde_json::json!({ "name": "ignored", "direct_response": { "status": 204 } }), 8),
        );
        m.entries.insert("upstreams/u".into(), (serde_json::json!({ "endpoints": ["127.0.0.1:2"] }), 5));
        let merged = m.merged_into(&local).expect("merged");
        let names: Vec<_> = doc::list(&merged, "routes").iter().filter_map(doc::name_of).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(doc::list(&merged, "upstreams").len(), 1);
        assert!(doc::list(&merged, "certificates").is_empty());
        let cfg = gatehouse_config::from_node(&merged, std::path::Path::new("x")).expect("valid");
        assert_eq!(cfg.routes[1].upstream.as_deref(), Some("u"));
        let v = m.versions();
        assert_eq!(v.get(&("routes", "a".to_string())), Some(&8));
        assert_eq!(v.get(&("upstreams", "u".to_string())), Some(&5));
    }
}
