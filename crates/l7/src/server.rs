//! Workers and the control loop.
//!
//! Thread per core: each worker thread runs its own single-threaded tokio
//! runtime and accepts on its own SO_REUSEPORT socket of every listener, so
//! the kernel spreads connections and the hot path shares nothing but the
//! snapshot pointer. The control thread (the main thread) reloads config on
//! SIGHUP, runs active health checks and stops on SIGTERM or SIGINT.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use gatehouse_config::yaml::Node;
use gatehouse_config::{Config, ConfigErrors, Protocol};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use socket2::{Domain, Socket, Type};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use crate::accesslog::AccessLog;
use crate::conn::{ClientIo, ConnState};
use crate::filters::RateLimiters;
use crate::h1server::{Rewound, Served};
use crate::handover::{Inherited, Registry};
use crate::health::{HealthChecks, HealthRegistry};
use crate::metrics::{HandshakeResult, Metrics, ScrapeInput};
use crate::snapshot::{BuildContext, Snapshot};
use crate::upstream::ConnPool;

/// What every worker shares: the live snapshot and state that outlives it.
pub struct Shared {
    pub snapshot: ArcSwap<Snapshot>,
    pub access_log: AccessLog,
    pub health: HealthRegistry,
    pub limiters: RateLimiters,
    pub config_path: PathBuf,
    /// Set once on SIGTERM/SIGINT: every connection finishes what it is
    /// doing and closes.
    pub draining: tokio::sync::watch::Sender<bool>,
    /// Counters, per worker (open connections among them, for the drain).
    pub metrics: Metrics,
    /// What changes the config: SIGHUP and the admin API take turns on it.
    pub control: std::sync::Mutex<Control>,
    /// Every listening socket (a duplicate of each worker's), for handover.
    pub sockets: std::sync::Mutex<Registry>,
    /// The admin listener's socket (a duplicate), for handover.
    admin_socket: Option<(SocketAddr, std::net::TcpListener)>,
    /// Set when a new process has taken the sockets over: time to drain.
    handed_over: tokio::sync::Notify,
    /// The cluster store, with `store: { type: etcd }`.
    pub store: Option<Arc<crate::store::Etcd>>,
    /// The L4 packet plane, when `l4.services` has any.
    pub l4: std::sync::OnceLock<gatehouse_l4_io::L4Runtime>,
}

/// The health-registry name of an L4 service's real servers.
fn l4_health_name(service: &str) -> String {
    format!("l4/{service}")
}

impl Shared {
    /// Every active health check: upstream endpoints and L4 real servers.
    fn health_checks(
        &self,
        snap: &Snapshot,
    ) -> Vec<(String, Arc<crate::health::EndpointHealth>, gatehouse_config::HealthCheck)> {
        let mut out = snap.health_checks();
        for s in snap.config.l4.iter().flat_map(|l| &l.services) {
            let Some(check) = &s.health_check else { continue };
            let name = l4_health_name(&s.name);
            for addr in s.real_servers.iter().filter_map(|r| r.address) {
                out.push((name.clone(), self.health.get(&name, addr), check.clone()));
            }
        }
        out
    }

    /// Starts the L4 plane if the config has services (once; later configs
    /// go to [`gatehouse_l4_io::L4Runtime::update`]).
    /// `fallback` as for [`gatehouse_l4_io::L4Runtime::start`].
    fn start_l4(self: &Arc<Self>, fallback: bool) -> Result<(), String> {
        let snap = self.snapshot.load();
        let Some(l4) = snap.config.l4.as_ref().filter(|l| !l.services.is_empty()) else { return Ok(()) };
        let weak = Arc::downgrade(self);
        let health: gatehouse_l4_io::HealthFn = Arc::new(move |service, addr| {
            weak.upgrade().is_none_or(|s| s.health.get(&l4_health_name(service), addr).is_up())
        });
        let rt = gatehouse_l4_io::L4Runtime::start(l4, health, fallback)?;
        tracing::info!(services = l4.services.len(), backend = rt.backend, "L4 plane started");
        let _ = self.l4.set(rt);
        Ok(())
    }

    /// Starts the L4 plane after a takeover: the previous process gives
    /// the interfaces up when it starts draining, so this tries again for
    /// a few seconds before settling for what `io` allows.
    fn start_l4_after_takeover(self: &Arc<Self>) {
        let shared = self.clone();
        let spawned = std::thread::Builder::new().name("l4-start".into()).spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                let last = std::time::Instant::now() >= deadline;
                match shared.start_l4(last) {
                    Ok(()) => return,
                    Err(e) if last => {
                        tracing::error!("l4: {e}; the L4 plane is not running");
                        return;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!("l4: cannot start: {e}");
        }
    }
}

/// The control plane's state, behind [`Shared::control`].
pub struct Control {
    checks: HealthChecks,
    workers: Vec<WorkerHandle>,
    /// The running config as a document: what the admin API reads and edits.
    pub doc: Node,
    /// The config file's document. The same as `doc` with the file store;
    /// with etcd, `doc` is this with its resource lists taken from etcd.
    pub local: Node,
    /// Each resource's version, by (list, name): the config version that last
    /// changed it.
    pub versions: HashMap<(&'static str, String), u64>,
}

/// Why a change was not applied. Nothing changed in either case.
#[derive(Debug)]
pub enum ApplyError {
    /// The resulting config is invalid (or a new listener cannot bind).
    Invalid(ConfigErrors),
    /// The config file could not be written.
    Store(String),
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::Invalid(e) => write!(f, "{e}"),
            ApplyError::Store(e) => write!(f, "{e}"),
        }
    }
}

/// Versions of the named entries of one list: unchanged entries keep theirs.
fn entry_versions<T: PartialEq>(
    kind: &'static str,
    old: &[T],
    new: &[T],
    name: impl Fn(&T) -> &str,
    version: u64,
    prev: &HashMap<(&'static str, String), u64>,
    out: &mut HashMap<(&'static str, String), u64>,
) {
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

fn resource_versions(
    old: &Config,
    new: &Config,
    version: u64,
    prev: &HashMap<(&'static str, String), u64>,
) -> HashMap<(&'static str, String), u64> {
    let mut out = HashMap::new();
    entry_versions("routes", &old.routes, &new.routes, |r| &r.name, version, prev, &mut out);
    entry_versions("upstreams", &old.upstreams, &new.upstreams, |u| &u.name, version, prev, &mut out);
    entry_versions("certificates", &old.certificates, &new.certificates, |c| &c.name, version, prev, &mut out);
    out
}

/// Writes `text` to `path` so that a crash at any moment leaves either the
/// old file or the new one: a temporary file beside it, fsync, the old file
/// kept as `PATH.prev` (written the same way), rename over, fsync the
/// directory.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = config_base_dir(path);
    let name = path.file_name().map_or_else(|| "config".into(), |n| n.to_string_lossy().into_owned());
    // The new file keeps the old one's permissions (it may hold inline keys).
    let perms = std::fs::metadata(path).ok().map(|m| m.permissions());
    let put = |target: &Path, bytes: &[u8]| -> std::io::Result<()> {
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        if let Some(p) = &perms {
            f.set_permissions(p.clone())?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, target)
    };
    if let Ok(old) = std::fs::read(path) {
        put(&dir.join(format!("{name}.prev")), &old)?;
    }
    put(path, text.as_bytes())?;
    std::fs::File::open(&dir)?.sync_all()
}

impl Shared {
    /// Applies a new config document: compiles it whole (any error: nothing
    /// changes), binds new listeners, writes it to the config file when
    /// `persist` (the admin API; a SIGHUP reload read it from there), then
    /// swaps the snapshot on every worker. Returns the new config version.
    pub fn apply(&self, control: &mut Control, doc: Node, persist: bool) -> Result<u64, ApplyError> {
        let current = self.snapshot.load();
        let path = &self.config_path;
        let snap = build_snapshot(&doc, path, current.version + 1, &self.health, &self.limiters, &self.metrics, true)
            .map_err(ApplyError::Invalid)?;
        let old: Vec<ListenerKey> = current.listeners.iter().map(|l| (l.name.clone(), l.address)).collect();
        let new: Vec<ListenerKey> = snap.listeners.iter().map(|l| (l.name.clone(), l.address)).collect();
        let opening: Vec<ListenerKey> = new.iter().filter(|k| !old.contains(k)).cloned().collect();
        let closing: Vec<ListenerKey> = old.iter().filter(|k| !new.contains(k)).cloned().collect();
        let sockets = bind_for_workers(&opening, control.workers.len(), None, &self.sockets).map_err(|(key, e)| {
            let index = new.iter().position(|k| *k == key).unwrap_or(0);
            ApplyError::Invalid(ConfigErrors {
                file: path.clone(),
                errors: vec![gatehouse_config::FieldError {
                    path: format!("listeners[{index}].address"),
                    message: format!("cannot bind {}: {e}", key.1),
                    line: None,
                }],
            })
        })?;
        if persist {
            write_atomically(path, &gatehouse_config::doc::emit(&doc))
                .map_err(|e| ApplyError::Store(format!("{}: cannot write the config: {e}", path.display())))?;
        }

        let version = snap.version;
        control.versions = resource_versions(&current.config, &snap.config, version, &control.versions);
        if self.store.is_none() {
            control.local = doc.clone();
        }
        control.doc = doc;
        let keep: Vec<(String, SocketAddr)> =
            snap.upstreams
                .iter()
                .flat_map(|u| u.pool.endpoints.iter().map(move |e| (u.name.to_string(), e.addr)))
                .chain(snap.config.l4.iter().flat_map(|l| &l.services).flat_map(|s| {
                    s.real_servers.iter().filter_map(|r| r.address).map(|a| (l4_health_name(&s.name), a))
                }))
                .collect();
        control.checks.reconcile(self.health_checks(&snap));
        if let (Some(rt), Some(l4)) = (self.l4.get(), snap.config.l4.as_ref()) {
            rt.update(l4);
        } else if self.l4.get().is_none() && snap.config.l4.as_ref().is_some_and(|l| !l.services.is_empty()) {
            tracing::warn!("l4.services added to a running process: the L4 plane starts at the next start");
        }
        gatehouse_keyops::batcher::set_max_delay(snap.config.key_ops.max_delay);
        {
            let routes: Vec<&str> = snap.routes.iter().map(|r| &*r.name).collect();
            let upstreams: Vec<&str> = snap.upstreams.iter().map(|u| &*u.name).collect();
            let listeners: Vec<&str> = snap.listeners.iter().map(|l| &*l.name).collect();
            self.metrics.retain(&routes, &upstreams, &listeners);
        }
        self.snapshot.store(Arc::new(snap));
        self.metrics.reloaded(true);
        self.health.retain(&|u, a| keep.iter().any(|(ku, ka)| ku == u && *ka == a));
        for (worker, opened) in control.workers.iter().zip(sockets) {
            for key in &closing {
                let _ = worker.send(ListenerCommand::Close(key.clone()));
            }
            for (key, socket) in opened {
                let _ = worker.send(ListenerCommand::Open(key, socket));
            }
        }
        for (name, addr) in &closing {
            self.sockets.lock().unwrap_or_else(|e| e.into_inner()).remove(name, *addr);
            tracing::info!(listener = %name, "stopped listening on {addr}");
        }
        for (name, addr) in &opening {
            tracing::info!(listener = %name, "listening on {addr}");
        }
        Ok(version)
    }

    /// Whether a document would be accepted by [`Shared::apply`], without
    /// applying it.
    pub fn check_doc(&self, doc: &Node) -> Result<(), ApplyError> {
        let version = self.snapshot.load().version + 1;
        build_snapshot(doc, &self.config_path, version, &self.health, &self.limiters, &self.metrics, true)
            .map(|_| ())
            .map_err(ApplyError::Invalid)
    }

    /// The control state, even if a panic poisoned its lock.
    pub fn control(&self) -> std::sync::MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Shared {
    /// The Prometheus exposition of everything: the registry's counters plus
    /// what is read from the live snapshot.
    pub fn scrape(&self) -> String {
        let snap = self.snapshot.load();
        let input = ScrapeInput {
            config_version: snap.version,
            endpoints: snap
                .upstreams
                .iter()
                .flat_map(|u| {
                    u.pool.endpoints.iter().map(move |e| (&*u.name, e.addr, e.health.is_up(), e.health.in_flight()))
                })
                .collect(),
            certificates: snap.certificates.iter().map(|(n, t)| (n.as_str(), *t)).collect(),
            store: self.store.as_ref().map(|s| {
                let h = s.health();
                (h.connected, h.revision)
            }),
            l4: self.l4.get().map(|rt| crate::metrics::L4Scrape {
                workers: rt.stats(),
                services: rt
                    .layout()
                    .into_iter()
                    .map(|(name, reals)| {
                        let h = l4_health_name(&name);
                        let reals = reals.into_iter().map(|a| (a, self.health.get(&h, a).is_up())).collect();
                        (name, reals)
                    })
                    .collect(),
            }),
        };
        self.metrics.render(&input)
    }
}

/// One worker thread's state.
pub struct Worker {
    pub id: usize,
    pub shared: Arc<Shared>,
    pub conns: Arc<ConnPool>,
}

/// Binds a listening socket without SO_REUSEPORT (the admin listener: one
/// process at a time; a takeover passes the socket itself).
fn bind_plain(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// Binds one listening socket with SO_REUSEPORT, so every worker can bind
/// its own on the same address.
pub fn bind(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

fn config_base_dir(path: &Path) -> PathBuf {
    path.parent().filter(|p| !p.as_os_str().is_empty()).map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Loads and compiles a config file: the shared path of start-up, reload and
/// `gatehouse check`. Also returns the document it was parsed into.
pub fn load_snapshot(
    path: &Path,
    version: u64,
    health: &HealthRegistry,
    limiters: &RateLimiters,
    metrics: &Metrics,
    generate_certs: bool,
) -> Result<(Snapshot, Node), ConfigErrors> {
    let doc = read_document(path)?;
    let snap = build_snapshot(&doc, path, version, health, limiters, metrics, generate_certs)?;
    Ok((snap, doc))
}

/// Reads and parses a config file into its document.
fn read_document(path: &Path) -> Result<Node, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
        file: path.to_path_buf(),
        errors: vec![gatehouse_config::FieldError {
            path: String::new(),
            message: format!("cannot read: {e}"),
            line: None,
        }],
    })?;
    gatehouse_config::parse_document(&text, path)
}

/// Decodes, validates and compiles a document (`path` names it in errors
/// and anchors relative paths).
fn build_snapshot(
    doc: &Node,
    path: &Path,
    version: u64,
    health: &HealthRegistry,
    limiters: &RateLimiters,
    metrics: &Metrics,
    generate_certs: bool,
) -> Result<Snapshot, ConfigErrors> {
    let cfg: Config = gatehouse_config::from_node(doc, path)?;
    compile(cfg, path, version, health, limiters, metrics, generate_certs)
}

/// Compiles a decoded config into a snapshot.
fn compile(
    cfg: Config,
    path: &Path,
    version: u64,
    health: &HealthRegistry,
    limiters: &RateLimiters,
    metrics: &Metrics,
    generate_certs: bool,
) -> Result<Snapshot, ConfigErrors> {
    let base_dir = config_base_dir(path);
    let cx = BuildContext { base_dir: &base_dir, health, limiters, metrics, generate_certs };
    Snapshot::build(cfg, version, &cx).map_err(|errors| ConfigErrors { file: path.to_path_buf(), errors })
}

/// `gatehouse check`: everything `run` checks, without binding or writing.
pub fn check(path: &Path) -> Result<(), ConfigErrors> {
    load_snapshot(path, 0, &HealthRegistry::default(), &RateLimiters::default(), &Metrics::new(1), false).map(|_| ())
}

/// Starts the admin listener (from the `admin` crate, which the binary wires
/// in) on the socket bound here (or handed over), and returns the server to
/// run on the control thread.
pub type AdminStart = Box<
    dyn FnOnce(
        Arc<Shared>,
        std::net::TcpListener,
    ) -> Result<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>, String>,
>;

/// `gatehouse run`: starts workers and runs the control loop until SIGTERM
/// or SIGINT.
pub fn run(path: &Path, admin: Option<AdminStart>, takeover: bool) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the control runtime: {e}"))?;
    // Signal handlers go in before any socket is bound: a SIGHUP sent as
    // soon as the port answers must reload, not kill the process.
    let signals =
        rt.block_on(async { Signals::install() }).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let limiters = RateLimiters::default();
    // The file is read and decoded once; the worker count it sets is fixed
    // for the life of the process and sizes the per-worker counter tables
    // before the first snapshot is compiled.
    let local = read_document(path).map_err(|e| e.to_string())?;
    let cfg = gatehouse_config::from_node(&local, path).map_err(|e| e.to_string())?;
    let workers = match cfg.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let health = HealthRegistry::new(workers);
    let metrics = Metrics::new(workers);
    let mut snap = compile(cfg, path, 1, &health, &limiters, &metrics, true).map_err(|e| e.to_string())?;
    let mut doc = local.clone();
    let store = match &snap.config.store {
        gatehouse_config::Store::File => None,
        gatehouse_config::Store::Etcd(cfg) => {
            let data_dir = crate::tls::resolve(&config_base_dir(path), &snap.config.data_dir);
            let etcd = Arc::new(crate::store::Etcd::new(cfg.clone(), &data_dir));
            // Start from etcd's state; if it cannot be reached, from this
            // node's cache of it; else from the file alone until it returns.
            let mirror = match rt.block_on(etcd.read_all()) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(endpoints = ?cfg.endpoints, "etcd unreachable at start-up ({e}); using the cached copy of its resources");
                    etcd.load_cache()
                }
            };
            if let Some(m) = mirror {
                let merged = m.merged_into(&local).map_err(|e| format!("{}: {e}", path.display()))?;
                snap = build_snapshot(&merged, path, 1, &health, &limiters, &metrics, true)
                    .map_err(|e| format!("the resources in etcd do not make a valid config with this file:\n{e}"))?;
                doc = merged;
                *etcd.mirror.lock().unwrap_or_else(|e| e.into_inner()) = m;
            }
            Some(etcd)
        }
    };
    gatehouse_keyops::batcher::set_max_delay(snap.config.key_ops.max_delay);
    let access_log = AccessLog::start(&snap.config.access_log.target).map_err(|e| format!("access_log: {e}"))?;

    // The control socket: where a later binary takes this one's sockets over.
    let data_dir = crate::tls::resolve(&config_base_dir(path), &snap.config.data_dir);
    let control_path = crate::handover::socket_path(&data_dir);
    let (mut inherited, ready) = if takeover {
        let (inherited, ready) = crate::handover::take_over(&control_path)?;
        tracing::info!(sockets = inherited.leftover(), "took the listening sockets over from the running process");
        (Some(inherited), Some(ready))
    } else {
        if std::os::unix::net::UnixStream::connect(&control_path).is_ok() {
            return Err(format!(
                "another Gatehouse runs on this config ({}); to replace it without refusing connections: gatehouse run -c {} --takeover",
                control_path.display(),
                path.display()
            ));
        }
        (None, None)
    };

    // Bind every worker's sockets before starting anything, so an address
    // in use is reported at once.
    let registry = std::sync::Mutex::new(Registry::default());
    let keys: Vec<ListenerKey> = snap.listeners.iter().map(|l| (l.name.clone(), l.address)).collect();
    let per_worker = bind_for_workers(&keys, workers, inherited.as_mut(), &registry)
        .map_err(|(key, e)| format!("listener {:?} cannot bind {}: {e}", &*key.0, key.1))?;
    let admin_socket = match &snap.config.admin {
        Some(a) => {
            let socket = match inherited.as_mut().and_then(|i| i.take_admin(a.address)) {
                Some(s) => s,
                None => bind_plain(a.address).map_err(|e| format!("admin.address: cannot bind {}: {e}", a.address))?,
            };
            Some((a.address, socket))
        }
        None => None,
    };
    if let Some(left) = inherited.as_ref().map(Inherited::leftover).filter(|n| *n > 0) {
        tracing::warn!(
            sockets = left,
            "sockets handed over but not in this config (or beyond this worker count) are closed"
        );
    }
    drop(inherited);
    for l in &snap.listeners {
        let scheme = if l.protocol == Protocol::Https { "https" } else { "http" };
        tracing::info!(listener = %l.name, "listening on {scheme}://{}", l.address);
    }

    let shared = Arc::new(Shared {
        snapshot: ArcSwap::from_pointee(snap),
        access_log,
        health,
        limiters,
        config_path: path.to_path_buf(),
        draining: tokio::sync::watch::Sender::new(false),
        metrics,
        control: std::sync::Mutex::new(Control {
            checks: HealthChecks::default(),
            workers: Vec::new(),
            doc,
            local,
            versions: HashMap::new(),
        }),
        sockets: registry,
        admin_socket: admin_socket.as_ref().and_then(|(a, s)| s.try_clone().ok().map(|s| (*a, s))),
        handed_over: tokio::sync::Notify::new(),
        store,
        l4: std::sync::OnceLock::new(),
    });
    let admin_server = match (admin_socket, admin) {
        (Some((addr, socket)), Some(start)) => {
            tracing::info!("admin listening on http://{addr}");
            Some(start(shared.clone(), socket).map_err(|e| format!("admin.address: {e}"))?)
        }
        _ => None,
    };
    if ready.is_none() {
        shared.start_l4(true).map_err(|e| format!("l4: {e}"))?;
    }
    tracing::info!(workers, config = %path.display(), "gatehouse started");
    let mut handles = Vec::new();
    for (id, sockets) in per_worker.into_iter().enumerate() {
        let worker = Arc::new(Worker { id, shared: shared.clone(), conns: Arc::new(ConnPool::default()) });
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for (key, socket) in sockets {
            let _ = tx.send(ListenerCommand::Open(key, socket));
        }
        handles.push(tx);
        std::thread::Builder::new()
            .name(format!("worker-{id}"))
            .spawn(move || worker_main(worker, rx))
            .map_err(|e| format!("cannot start worker thread: {e}"))?;
    }

    rt.block_on(async move {
        let _admin = admin_server.map(|server| AbortOnDrop(tokio::spawn(server)));
        {
            let mut control = shared.control();
            control.workers = handles;
            let checks = shared.health_checks(&shared.snapshot.load());
            control.checks.reconcile(checks);
            let cfg = shared.snapshot.load().config.clone();
            control.versions = match &shared.store {
                Some(etcd) => etcd.mirror.lock().unwrap_or_else(|e| e.into_inner()).versions(),
                None => resource_versions(&cfg, &cfg, 1, &HashMap::new()),
            };
        }
        let _store_sync =
            shared.store.clone().map(|etcd| AbortOnDrop(tokio::spawn(crate::store::run(shared.clone(), etcd))));
        // Only now, with every worker accepting, may the old process stop.
        if let Some(ready) = ready {
            if let Err(e) = crate::handover::ready(ready) {
                tracing::warn!("could not tell the previous process to stop: {e}");
            }
            shared.start_l4_after_takeover();
        }
        let _control_socket = match serve_control_socket(shared.clone(), &control_path) {
            Ok(task) => Some(AbortOnDrop(task)),
            Err(e) => {
                tracing::warn!("control socket {}: {e}; this process cannot be taken over", control_path.display());
                None
            }
        };
        control_loop(shared, signals).await;
    });
    Ok(())
}

struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            hup: signal(SignalKind::hangup())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }
}

/// A listener's identity for sockets: a name moved to another address is a
/// new socket; a protocol or TLS change is not (it is read per connection).
type ListenerKey = (Arc<str>, SocketAddr);

/// What the control thread tells a worker about its listening sockets.
pub enum ListenerCommand {
    Open(ListenerKey, std::net::TcpListener),
    Close(ListenerKey),
}

type WorkerHandle = tokio::sync::mpsc::UnboundedSender<ListenerCommand>;

/// Each worker's sockets, by listener.
type WorkerSockets = Vec<Vec<(ListenerKey, std::net::TcpListener)>>;

/// One SO_REUSEPORT socket per worker for each key. All or nothing.
/// One SO_REUSEPORT socket per worker for each key. All or nothing. A socket
/// the previous process handed over is used rather than a new one, and every
/// socket is also recorded (duplicated) in `registry` for the next handover.
fn bind_for_workers(
    keys: &[ListenerKey],
    workers: usize,
    mut inherited: Option<&mut Inherited>,
    registry: &std::sync::Mutex<Registry>,
) -> Result<WorkerSockets, (ListenerKey, std::io::Error)> {
    let mut per_worker: Vec<Vec<_>> = (0..workers).map(|_| Vec::new()).collect();
    for key in keys {
        for (w, sockets) in per_worker.iter_mut().enumerate() {
            let s = match inherited.as_deref_mut().and_then(|i| i.take(&key.0, key.1, w)) {
                Some(s) => s,
                None => bind(key.1).map_err(|e| (key.clone(), e))?,
            };
            sockets.push((key.clone(), s));
        }
    }
    let mut reg = registry.lock().unwrap_or_else(|e| e.into_inner());
    for (w, sockets) in per_worker.iter().enumerate() {
        for (key, s) in sockets {
            reg.add(&key.0, key.1, w, s).map_err(|e| (key.clone(), e))?;
        }
    }
    Ok(per_worker)
}

/// Serves the control socket: a `TAKEOVER` hands every listening socket to
/// the asking process; its `READY` starts this one's drain.
fn serve_control_socket(shared: Arc<Shared>, path: &Path) -> std::io::Result<tokio::task::JoinHandle<()>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A file left by a process that is gone (or the one being replaced,
    // which no longer needs its path) is replaced.
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let admin = shared.admin_socket.as_ref().map(|(a, s)| (*a, s));
            match crate::handover::hand_over(stream, &shared.sockets, admin).await {
                Ok(true) => {
                    tracing::info!("a new process took the listening sockets over; finishing requests in flight");
                    shared.handed_over.notify_one();
                    return;
                }
                Ok(false) => tracing::warn!("a takeover did not complete; still serving"),
                Err(e) => tracing::warn!("takeover failed: {e}; still serving"),
            }
        }
    }))
}

async fn control_loop(shared: Arc<Shared>, mut signals: Signals) {
    loop {
        tokio::select! {
            _ = shared.handed_over.notified() => break,
            _ = signals.hup.recv() => reload(&shared),
            _ = signals.term.recv() => break,
            _ = signals.int.recv() => break,
        }
    }
    let workers = shared.control().workers.clone();
    drain(&shared, &workers, &mut signals).await;
}

/// Stops accepting, lets every connection finish its requests, and returns
/// when none is left or `shutdown_timeout` has passed. A second signal
/// stops at once.
async fn drain(shared: &Shared, workers: &[WorkerHandle], signals: &mut Signals) {
    // Packets have no connections to finish: the L4 plane stops at once,
    // leaving the interfaces to a process taking over (a short wait for its
    // threads to notice).
    if let Some(l4) = shared.l4.get() {
        l4.stop();
        tracing::info!("L4 plane stopped");
    }
    let snap = shared.snapshot.load();
    let deadline = tokio::time::Instant::now() + snap.config.shutdown_timeout;
    for worker in workers {
        for l in &snap.listeners {
            let _ = worker.send(ListenerCommand::Close((l.name.clone(), l.address)));
        }
    }
    shared.sockets.lock().unwrap_or_else(|e| e.into_inner()).clear();
    shared.draining.send_replace(true);
    tracing::info!(
        connections = shared.metrics.connections_open(),
        "stopping: listeners closed, finishing requests in flight"
    );
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = signals.term.recv() => break,
            _ = signals.int.recv() => break,
        }
        let open = shared.metrics.connections_open();
        if open == 0 {
            tracing::info!("stopped: all connections finished");
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(connections = open, "stopped: shutdown_timeout reached with connections still open");
            return;
        }
    }
    tracing::warn!("stopped at once on a second signal");
}

/// Re-reads the config file. On success: binds any new listeners, swaps the
/// new snapshot in and closes listeners that are gone. On any error (the
/// file, or a new address that cannot be bound): logs every problem and
/// keeps the running config, listeners included.
fn reload(shared: &Shared) {
    let refuse = |lines: &str| {
        for line in lines.lines() {
            tracing::error!("reload refused: {line}");
        }
        tracing::error!(version = shared.snapshot.load().version, "reload refused; the running config stays");
        shared.metrics.reloaded(false);
    };
    let text = match std::fs::read_to_string(&shared.config_path) {
        Ok(t) => t,
        Err(e) => return refuse(&format!("{}: cannot read: {e}", shared.config_path.display())),
    };
    let doc = match gatehouse_config::parse_document(&text, &shared.config_path) {
        Ok(d) => d,
        Err(e) => return refuse(&e.to_string()),
    };
    let mut control = shared.control();
    let (merged, versions) = match &shared.store {
        Some(etcd) => {
            let mirror = etcd.mirror.lock().unwrap_or_else(|e| e.into_inner()).clone();
            match mirror.merged_into(&doc) {
                Ok(m) => (m, Some(mirror.versions())),
                Err(e) => return refuse(&format!("{}: {e}", shared.config_path.display())),
            }
        }
        None => (doc.clone(), None),
    };
    match shared.apply(&mut control, merged, false) {
        Ok(version) => {
            control.local = doc;
            if let Some(v) = versions {
                control.versions = v;
            }
            tracing::info!(version, "configuration reloaded");
        }
        Err(e) => refuse(&e.to_string()),
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn worker_main(worker: Arc<Worker>, mut commands: tokio::sync::mpsc::UnboundedReceiver<ListenerCommand>) {
    // A worker about to park has no other ready work: that is when queued
    // private-key operations run without waiting for their batch to fill.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(gatehouse_keyops::batcher::on_idle)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(worker = worker.id, "cannot start runtime: {e}");
            return;
        }
    };
    rt.block_on(async move {
        let batch_timer = tokio::spawn(gatehouse_keyops::batcher::run_timer());
        let _stop_timer = AbortOnDrop(batch_timer);
        let mut accepting: HashMap<ListenerKey, tokio::task::JoinHandle<()>> = HashMap::new();
        // Close upstream connections that idled out.
        let mut sweep = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = sweep.tick() => worker.conns.sweep(std::time::Instant::now()),
                command = commands.recv() => match command {
                    Some(ListenerCommand::Open(key, socket)) => match TcpListener::from_std(socket) {
                        Ok(l) => {
                            let task = tokio::spawn(accept_loop(l, key.0.clone(), worker.clone()));
                            if let Some(old) = accepting.insert(key, task) {
                                old.abort();
                            }
                        }
                        Err(e) => tracing::error!(worker = worker.id, listener = %key.0, "cannot register socket: {e}"),
                    },
                    // Dropping the accept task closes the socket; connections
                    // already accepted carry on.
                    Some(ListenerCommand::Close(key)) => {
                        if let Some(task) = accepting.remove(&key) {
                            task.abort();
                        }
                    }
                    None => return,
                },
            }
        }
    });
}

async fn accept_loop(listener: TcpListener, name: Arc<str>, worker: Arc<Worker>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve(stream, peer, name.clone(), worker.clone()));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, don't spin.
                tracing::warn!(listener = %name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Bytes read from a TLS client's socket at a time (see `serve`).
const TLS_READ_BUFFER: usize = 4096;

async fn serve(stream: TcpStream, peer: SocketAddr, name: Arc<str>, worker: Arc<Worker>) {
    struct Open<'a>(&'a Metrics, usize);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.connection_closed(self.1);
        }
    }
    worker.shared.metrics.connection_opened(worker.id);
    let _open = Open(&worker.shared.metrics, worker.id);
    let snap = worker.shared.snapshot.load_full();
    let Some(index) = snap.listener_index(&name) else { return };
    let http = snap.http.clone();
    let tls = snap.listeners[index].tls.as_ref().map(|t| t.acceptor.clone());
    let metrics = snap.listeners[index].metrics.clone();
    drop(snap);
    metrics.accepted(worker.id);
    struct Closed<'a>(&'a crate::metrics::ListenerMetrics, usize);
    impl Drop for Closed<'_> {
        fn drop(&mut self) {
            self.0.closed(self.1);
        }
    }
    let _closed = Closed(&metrics, worker.id);
    let state = |tls: Option<(&'static str, &'static str)>, is_h2: bool| {
        Arc::new(ConnState {
            client: peer,
            client_ip: client_ip_value(peer),
            listener: index,
            listener_name: name.clone(),
            tls,
            is_h2,
            worker: worker.clone(),
            in_flight: AtomicU32::new(0),
            requests: AtomicU32::new(0),
            head_flags: AtomicU8::new(0),
            closing: std::sync::atomic::AtomicBool::new(false),
        })
    };
    match tls {
        Some(acceptor) => {
            // BoringSSL reads a record as two reads, its 5-byte header then its
            // body; a small buffer under it turns a flight of records that
            // arrived together into one recvfrom. Reads larger than the buffer
            // (bulk request bodies) bypass it.
            let stream = tokio::io::BufReader::with_capacity(TLS_READ_BUFFER, stream);
            let accepted =
                tokio::time::timeout(http.client_header_timeout, tokio_boring::accept(&acceptor, stream)).await;
            let tls_stream = match accepted {
                Ok(Ok(s)) => s,
                Ok(Err(_)) => return metrics.handshake(worker.id, "-", "-", HandshakeResult::Failed),
                Err(_) => return metrics.handshake(worker.id, "-", "-", HandshakeResult::Timeout),
            };
            let ssl = tls_stream.ssl();
            let is_h2 = ssl.selected_alpn_protocol() == Some(b"h2");
            let info = (ssl.version_str(), ssl.current_cipher().map_or("-", |c| c.name()));
            metrics.handshake(worker.id, info.0, info.1, HandshakeResult::Ok);
            serve_http(tls_stream, state(Some(info), is_h2), &http, Some(is_h2)).await;
        }
        None => serve_http(stream, state(None, false), &http, None).await,
    }
}

fn client_ip_value(peer: SocketAddr) -> http::HeaderValue {
    let ip = crate::filters::canonical(peer.ip()).to_string();
    http::HeaderValue::from_str(&ip).unwrap_or_else(|_| http::HeaderValue::from_static("unknown"))
}

/// `alpn_h2`: on TLS, whether ALPN chose h2 (then the protocol is settled
/// and served directly); `None` on cleartext, where HTTP/1.1 and
/// prior-knowledge HTTP/2 are told apart by the connection preface.
///
/// HTTP/1.x starts on Gatehouse's own server ([`crate::h1server`]), which
/// hands the connection to hyper at the first request it does not take.
async fn serve_http<T>(io: T, state: Arc<ConnState>, http: &gatehouse_config::HttpSettings, alpn_h2: Option<bool>)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let client = Box::pin(ClientIo::new(io, state.clone(), http.client_header_timeout, http.client_idle_timeout));
    let mut drain = state.worker.shared.draining.subscribe();
    let (client, prefix) = if alpn_h2 == Some(true) {
        (client, bytes::Bytes::new())
    } else {
        let served = crate::h1server::serve(
            client,
            state.clone(),
            http.max_header_bytes,
            http.max_headers,
            &mut drain,
            DRAIN_IDLE_GRACE,
        )
        .await;
        match served {
            Served::Closed => return,
            Served::Handover(client, prefix) => (client, prefix),
        }
    };
    let io = TokioIo::new(Rewound::new(prefix, client));
    let h1_state = (alpn_h2 != Some(true)).then(|| state.clone());
    // Boxed: hyper moves a request's future several times before it runs
    // (into its stream task, and for HTTP/2 into a task spawned per
    // stream), and the proxy's future is kilobytes, so each move was a
    // large memcpy; a box moves as one pointer.
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        Box::pin(crate::proxy::handle(req.map(crate::proxy::ClientBody::Hyper), state.clone()))
    });
    let max_header_list = u32::try_from(http.max_header_bytes).unwrap_or(u32::MAX);
    match alpn_h2 {
        Some(true) => {
            let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            b.timer(TokioTimer::new()).max_header_list_size(max_header_list).max_concurrent_streams(256);
            drive(b.serve_connection(io, svc), drain, None, |c| c.graceful_shutdown()).await;
        }
        Some(false) => {
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .max_buf_size(http.max_header_bytes.max(8192))
                .max_headers(http.max_headers)
                // ClientIo enforces the head timeout (and answers 408);
                // hyper's own would arm a second timer per request.
                .header_read_timeout(None)
                .keep_alive(true);
            drive(b.serve_connection(io, svc).with_upgrades(), drain, h1_state, |c| c.graceful_shutdown()).await;
        }
        None => {
            let mut b = auto::Builder::new(TokioExecutor::new());
            b.http1()
                .timer(TokioTimer::new())
                .max_buf_size(http.max_header_bytes.max(8192))
                .max_headers(http.max_headers)
                .header_read_timeout(None)
                .keep_alive(true);
            b.http2().timer(TokioTimer::new()).max_header_list_size(max_header_list).max_concurrent_streams(256);
            drive(b.serve_connection_with_upgrades(io, svc), drain, h1_state, |c| c.graceful_shutdown()).await;
        }
    }
}

/// How long a draining HTTP/1 connection may go on before it is closed even
/// though no request came to carry `Connection: close`.
const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// Runs a connection to its end. When draining starts: an HTTP/1 connection
/// (`h1_state`) first gets [`DRAIN_IDLE_GRACE`] to end by itself, its next
/// response saying `Connection: close` (closing an idle keep-alive
/// connection at once would race a request the client is already sending);
/// then, and at once for HTTP/2, it is asked to finish its requests and
/// close (HTTP/2: GOAWAY).
async fn drive<C: std::future::Future>(
    conn: C,
    mut drain: tokio::sync::watch::Receiver<bool>,
    h1_state: Option<Arc<ConnState>>,
    shutdown: impl FnOnce(std::pin::Pin<&mut C>),
) {
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = drain.wait_for(|d| *d) => {}
    }
    if let Some(state) = h1_state {
        state.closing.store(true, Ordering::Relaxed);
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tokio::time::sleep(DRAIN_IDLE_GRACE) => {}
        }
    }
    shutdown(conn.as_mut());
    conn.await;
}
