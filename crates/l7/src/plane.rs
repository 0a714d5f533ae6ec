//! The L7 plane as the node sees it: each config compiled into a
//! [`Snapshot`] (new listeners bound while preparing, so an address in use
//! refuses the change), swapped in on commit, and the workers told which
//! sockets to open and close.

use std::net::TcpListener;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use gatehouse_config::{Config, FieldError, Named, Protocol};
use gatehouse_plane::health::HealthRegistry;
use gatehouse_plane::listeners::Listeners;
use gatehouse_plane::metrics::Exposition;
use gatehouse_plane::{HealthTarget, Init, Plane, PlaneError, Prepare, Purpose, Staged, Start};
use serde_json::{Map, Value, json};

use crate::accesslog::AccessLog;
use crate::context::{Shared, Worker};
use crate::downstream::accept::{ListenerCommand, ListenerKey, WorkerHandle, worker_main};
use crate::downstream::h3::cid::Keys;
use crate::downstream::h3::{Inherit, QuicSocket, bind_workers};
use crate::filters::RateLimiters;
use crate::metrics::ScrapeInput;
use crate::snapshot::{BuildContext, Snapshot};
use crate::upstream::connect::ConnPool;

/// Each worker's sockets, by listener.
type WorkerSockets = Vec<Vec<(ListenerKey, TcpListener)>>;
/// Each worker's HTTP/3 sockets, by listener.
type WorkerQuicSockets = Vec<Vec<(ListenerKey, QuicSocket)>>;

/// The L7 plane: listeners, TLS, HTTP routing and proxying.
#[derive(Clone)]
pub struct L7(Arc<Inner>);

struct Inner {
    shared: Arc<Shared>,
    health: Arc<HealthRegistry>,
    limiters: RateLimiters,
    listeners: Arc<Listeners>,
    workers: usize,
    /// QUIC's token and reset keys, one set per process.
    quic_keys: Arc<Keys>,
    /// Each worker's command channel once started, or the commands
    /// committed before the workers started.
    state: Mutex<Workers>,
}

enum Workers {
    Waiting(Vec<Vec<ListenerCommand>>),
    Running(Vec<WorkerHandle>),
}

impl L7 {
    pub fn new(init: &Init<'_>) -> Result<L7, PlaneError> {
        let access_log = AccessLog::start(&init.config.access_log.target)
            .map_err(|e| PlaneError::at("l7", "access_log", e.to_string()))?;
        let shared = Arc::new(Shared::new(Snapshot::empty(), access_log, init.workers));
        Ok(L7(Arc::new(Inner {
            shared,
            health: init.health.clone(),
            limiters: RateLimiters::default(),
            listeners: init.listeners.clone(),
            workers: init.workers,
            quic_keys: Arc::new(Keys::new()),
            state: Mutex::new(Workers::Waiting((0..init.workers).map(|_| Vec::new()).collect())),
        })))
    }

    fn state(&self) -> MutexGuard<'_, Workers> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One socket per worker for each key. All or nothing.
    fn bind(&self, keys: &[ListenerKey]) -> Result<WorkerSockets, (ListenerKey, std::io::Error)> {
        let mut per_worker: WorkerSockets = (0..self.0.workers).map(|_| Vec::new()).collect();
        for key in keys {
            for (w, sockets) in per_worker.iter_mut().enumerate() {
                let s = self.0.listeners.bind(&key.0, key.1, w).map_err(|e| (key.clone(), e))?;
                sockets.push((key.clone(), s));
            }
        }
        Ok(per_worker)
    }

    /// One UDP socket per worker for each HTTP/3 key. All or nothing.
    fn bind_quic(&self, keys: &[ListenerKey]) -> Result<WorkerQuicSockets, (ListenerKey, std::io::Error)> {
        let mut per_worker: WorkerQuicSockets = (0..self.0.workers).map(|_| Vec::new()).collect();
        for key in keys {
            let l = &self.0.listeners;
            let inherit = Inherit {
                sockets: (0..self.0.workers).map(|w| l.inherited_udp(&key.0, key.1, w)).collect(),
                predecessor: l.inherited_forward(&key.0, key.1),
            };
            let sockets =
                bind_workers(key.1, self.0.workers, &self.0.quic_keys, inherit).map_err(|e| (key.clone(), e))?;
            for (w, socket) in sockets.into_iter().enumerate() {
                per_worker[w].push((key.clone(), socket));
            }
        }
        Ok(per_worker)
    }
}

/// A compiled config and the listener changes it brings.
struct StagedL7 {
    plane: L7,
    snap: Snapshot,
    /// New listeners' sockets, per worker.
    opening: WorkerSockets,
    closing: Vec<ListenerKey>,
    /// New HTTP/3 sockets, per worker, and the HTTP/3 sides that go.
    opening_quic: WorkerQuicSockets,
    closing_quic: Vec<ListenerKey>,
}

fn keys(snap: &Snapshot) -> Vec<ListenerKey> {
    snap.listeners.iter().map(|l| (l.name.clone(), l.address)).collect()
}

/// The keys `new` has and `old` has not (to open), and the other way
/// round (to close).
fn changes(old: &[ListenerKey], new: &[ListenerKey]) -> (Vec<ListenerKey>, Vec<ListenerKey>) {
    let opening = new.iter().filter(|k| !old.contains(k)).cloned().collect();
    let closing = old.iter().filter(|k| !new.contains(k)).cloned().collect();
    (opening, closing)
}

/// A socket that could not be bound, at its listener's `field`.
fn bind_error(new: &[ListenerKey], key: &ListenerKey, field: &str, kind: &str, e: std::io::Error) -> Vec<FieldError> {
    let index = new.iter().position(|k| k == key).unwrap_or(0);
    vec![FieldError {
        path: format!("listeners[{index}].{field}"),
        message: format!("cannot bind {kind}{}: {e}", key.1),
        line: None,
    }]
}

fn quic_keys(snap: &Snapshot) -> Vec<ListenerKey> {
    snap.listeners.iter().filter(|l| l.quic.is_some()).map(|l| (l.name.clone(), l.address)).collect()
}

impl Staged for StagedL7 {
    fn commit(self: Box<Self>) {
        let StagedL7 { plane, snap, opening, closing, opening_quic, closing_quic } = *self;
        let inner = &plane.0;
        gatehouse_keyops::batcher::set_max_delay(snap.config.key_ops.max_delay);
        {
            let routes: Vec<&str> = snap.routes.iter().map(|r| &*r.name).collect();
            let upstreams: Vec<&str> = snap.upstreams.iter().map(|u| &*u.name).collect();
            let listeners: Vec<&str> = snap.listeners.iter().map(|l| &*l.name).collect();
            inner.shared.metrics.retain(&routes, &upstreams, &listeners);
        }
        for l in snap.listeners.iter().filter(|l| opening.iter().flatten().any(|(k, _)| k.0 == l.name)) {
            let scheme = if l.protocol == Protocol::Https { "https" } else { "http" };
            tracing::info!(listener = %l.name, "listening on {scheme}://{}", l.address);
        }
        for l in snap.listeners.iter().filter(|l| opening_quic.iter().flatten().any(|(k, _)| k.0 == l.name)) {
            tracing::info!(listener = %l.name, "serving HTTP/3 on udp://{}", l.address);
        }
        inner.shared.snapshot.store(Arc::new(snap));
        for (w, sockets) in opening.iter().enumerate() {
            for (key, socket) in sockets {
                if let Err(e) = inner.listeners.record(&key.0, key.1, w, socket) {
                    tracing::warn!(listener = %key.0, "cannot keep a socket for a takeover: {e}");
                }
            }
        }
        // Every worker has each new HTTP/3 listener's socket at the same
        // place in its list; worker 0's list names them.
        for (i, (key, first)) in opening_quic.first().into_iter().flatten().enumerate() {
            let sockets: Vec<&std::net::UdpSocket> = opening_quic.iter().map(|w| &w[i].1.socket).collect();
            if let Err(e) = inner.listeners.record_quic(&key.0, key.1, &sockets, first.forward.clone()) {
                tracing::warn!(listener = %key.0, "cannot keep an HTTP/3 socket for a takeover: {e}");
            }
        }
        for (name, addr) in &closing {
            inner.listeners.forget(name, *addr);
            tracing::info!(listener = %name, "stopped listening on {addr}");
        }
        for (name, addr) in &closing_quic {
            inner.listeners.forget_quic(name, *addr);
        }
        let mut commands: Vec<Vec<ListenerCommand>> = (0..inner.workers).map(|_| Vec::new()).collect();
        for cmds in commands.iter_mut() {
            cmds.extend(closing.iter().map(|k| ListenerCommand::Close(k.clone())));
            cmds.extend(closing_quic.iter().map(|k| ListenerCommand::CloseQuic(k.clone())));
        }
        for (cmds, sockets) in commands.iter_mut().zip(opening) {
            cmds.extend(sockets.into_iter().map(|(k, s)| ListenerCommand::Open(k, s)));
        }
        for (cmds, sockets) in commands.iter_mut().zip(opening_quic) {
            cmds.extend(sockets.into_iter().map(|(k, s)| ListenerCommand::OpenQuic(k, s)));
        }
        match &mut *plane.state() {
            Workers::Waiting(pending) => {
                for (w, cmds) in commands.into_iter().enumerate() {
                    for cmd in cmds {
                        match cmd {
                            // Not started yet: what closes is only dropped.
                            ListenerCommand::Close(k) | ListenerCommand::CloseQuic(k) => {
                                pending[w].retain(|c| *c.key() != k)
                            }
                            open => pending[w].push(open),
                        }
                    }
                }
            }
            Workers::Running(handles) => {
                for (worker, cmds) in handles.iter().zip(commands) {
                    for cmd in cmds {
                        let _ = worker.send(cmd);
                    }
                }
            }
        }
    }
}

impl Plane for L7 {
    fn name(&self) -> &'static str {
        "l7"
    }

    fn prepare(&self, config: &Arc<Config>, cx: &Prepare<'_>) -> Result<Box<dyn Staged>, Vec<FieldError>> {
        let inner = &self.0;
        let bx = BuildContext {
            base_dir: cx.base_dir,
            health: &inner.health,
            limiters: &inner.limiters,
            metrics: &inner.shared.metrics,
            generate_certs: cx.purpose != Purpose::Check,
        };
        let snap = Snapshot::build(config.clone(), &bx)?;
        if cx.purpose != Purpose::Apply {
            return Ok(Box::new(StagedL7 {
                plane: self.clone(),
                snap,
                opening: Vec::new(),
                closing: Vec::new(),
                opening_quic: Vec::new(),
                closing_quic: Vec::new(),
            }));
        }
        let live = inner.shared.snapshot.load();
        let new = keys(&snap);
        let (opening, closing) = changes(&keys(&live), &new);
        let opening = self.bind(&opening).map_err(|(key, e)| bind_error(&new, &key, "address", "", e))?;
        let (opening_quic, closing_quic) = changes(&quic_keys(&live), &quic_keys(&snap));
        let opening_quic =
            self.bind_quic(&opening_quic).map_err(|(key, e)| bind_error(&new, &key, "http3", "udp ", e))?;
        Ok(Box::new(StagedL7 { plane: self.clone(), snap, opening, closing, opening_quic, closing_quic }))
    }

    fn start(&self, _how: Start) -> Result<(), PlaneError> {
        let mut state = self.state();
        let Workers::Waiting(pending) = &mut *state else { return Ok(()) };
        let pending = std::mem::take(pending);
        let mut handles = Vec::new();
        for (id, sockets) in pending.into_iter().enumerate() {
            let worker = Arc::new(Worker { id, shared: self.0.shared.clone(), conns: Arc::new(ConnPool::default()) });
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            for cmd in sockets {
                let _ = tx.send(cmd);
            }
            handles.push(tx);
            std::thread::Builder::new()
                .name(format!("worker-{id}"))
                .spawn(move || worker_main(worker, rx))
                .map_err(|e| PlaneError::new("l7", format!("cannot start worker thread: {e}")))?;
        }
        *state = Workers::Running(handles);
        Ok(())
    }

    fn drain(&self) {
        let snap = self.0.shared.snapshot.load();
        if let Workers::Running(handles) = &*self.state() {
            for worker in handles {
                for key in keys(&snap) {
                    let _ = worker.send(ListenerCommand::Close(key));
                }
                for key in quic_keys(&snap) {
                    let _ = worker.send(ListenerCommand::CloseQuic(key));
                }
            }
        }
        self.0.shared.drain();
    }

    fn in_progress(&self) -> u64 {
        self.0.shared.metrics.connections_open()
    }

    fn metrics(&self, out: &mut Exposition) {
        let snap = self.0.shared.snapshot.load();
        let input = ScrapeInput {
            endpoints: snap
                .upstreams
                .iter()
                .flat_map(|u| {
                    u.pool.endpoints.iter().map(move |e| (&*u.name, e.addr, e.health.is_up(), e.health.in_flight()))
                })
                .collect(),
            certificates: snap.certificates.iter().map(|(n, t)| (n.as_str(), *t)).collect(),
        };
        self.0.shared.metrics.render(out, &input);
    }

    fn status(&self, out: &mut Map<String, Value>) {
        let snap = self.0.shared.snapshot.load();
        let open = self.0.shared.metrics.open_connections();
        let listeners: Vec<Value> = snap
            .listeners
            .iter()
            .map(|l| {
                json!({
                    "name": &*l.name,
                    "address": l.address.to_string(),
                    "protocol": if l.tls.is_some() { "https" } else { "http" },
                    "http3": l.quic.is_some(),
                    "connections_open": open.get(&*l.name).copied().unwrap_or(0),
                })
            })
            .collect();
        let upstreams: Vec<Value> = snap
            .upstreams
            .iter()
            .map(|u| {
                let endpoints: Vec<Value> = u
                    .pool
                    .endpoints
                    .iter()
                    .map(|e| {
                        let last = e.health.last_check();
                        json!({
                            "address": e.addr.to_string(),
                            "weight": e.weight,
                            "healthy": e.health.is_up(),
                            "ejected": e.health.ejected(),
                            "in_flight": e.health.in_flight(),
                            "last_check": last.as_ref().map(|c| c.at),
                            "last_check_error": last.and_then(|c| c.failure),
                        })
                    })
                    .collect();
                json!({
                    "name": &*u.name,
                    "balance": u.pool.cfg.balance.name(),
                    "health_check": u.pool.cfg.health_check.as_ref().map(|c| c.kind.name()),
                    "endpoints": endpoints,
                })
            })
            .collect();
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        let certificates: Vec<Value> = snap
            .certificates
            .iter()
            .map(|(name, not_after)| {
                json!({
                    "name": name,
                    "not_after": not_after,
                    "expires_in_days": ((*not_after as f64 - now) / 86_400.0 * 10.0).round() / 10.0,
                })
            })
            .collect();
        let routes: Vec<Value> = snap
            .config
            .routes
            .iter()
            .map(|r| {
                let m = &r.matches;
                json!({
                    "name": r.name,
                    "listeners": r.listeners,
                    "hosts": m.hosts,
                    "path": m.path,
                    "path_prefix": m.path_prefix.clone().or_else(|| m.path.is_none().then(|| "/".to_string())),
                    "methods": m.methods,
                    "upstream": r.upstream,
                    "direct_response": r.direct_response.as_ref().map(|d| d.status),
                    "canary": r.canary.as_ref().map(|c| json!({
                        "upstream": c.upstream,
                        "weight": c.weight,
                        "header": c.header.as_ref().map(|h| &h.name),
                    })),
                    "rate_limit": r.rate_limit.as_ref().map(|l| l.rate),
                    "access_list": !r.allow.is_empty() || !r.deny.is_empty(),
                })
            })
            .collect();
        out.insert("listeners".into(), Value::from(listeners));
        out.insert("routes".into(), Value::from(routes));
        out.insert("upstreams".into(), Value::from(upstreams));
        out.insert("certificates".into(), Value::from(certificates));
    }

    /// A listener's address can be served while one of the routes it
    /// serves answers directly or has an upstream (or canary) endpoint up.
    fn vips(&self, out: &mut Vec<gatehouse_plane::Vip>) {
        let snap = self.0.shared.snapshot.load();
        let cfg = &snap.config;
        let up = |name: &str| {
            snap.upstreams
                .iter()
                .filter(|u| &*u.name == name)
                .any(|u| u.pool.endpoints.iter().any(|e| e.health.is_up()))
        };
        for l in cfg.listeners.iter().filter(|l| l.announce) {
            let Some(addr) = l.address else { continue };
            let healthy =
                cfg.routes.iter().filter(|r| r.listeners.is_empty() || r.listeners.contains(&l.name)).any(|r| {
                    r.direct_response.is_some()
                        || r.upstream.as_deref().is_some_and(up)
                        || r.canary.as_ref().is_some_and(|c| up(&c.upstream))
                });
            out.push(gatehouse_plane::Vip { address: addr.ip(), healthy, of: format!("listener {}", l.name) });
        }
    }

    fn health_targets(&self, out: &mut Vec<HealthTarget>) {
        let snap = self.0.shared.snapshot.load();
        for u in &snap.upstreams {
            for ep in &u.pool.endpoints {
                let check = u.pool.cfg.health_check.clone();
                out.push(HealthTarget { group: u.name.to_string(), health: ep.health.clone(), check });
            }
        }
    }
}
