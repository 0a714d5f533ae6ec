//! `gatehouse run` and `gatehouse check`: start-up, the control loop on the
//! main thread (SIGHUP reloads; SIGTERM or SIGINT drains; a takeover
//! drains), and the control socket.

use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use gatehouse_config::{ConfigErrors, FieldError};
use tokio_util::task::AbortOnDropHandle;

use crate::apply::{prepare_planes, resource_versions};
use crate::handover;
use crate::metrics::ProcessMetrics;
use crate::store::etcd::Etcd;
use crate::store::{BoxFuture, FileStore, Store};
use gatehouse_plane::health::{HealthChecks, HealthRegistry};
use gatehouse_plane::listeners::{Listeners, bind_exclusive};
use gatehouse_plane::resolve;
use gatehouse_plane::{Init, Plane, PlaneError, Purpose, Start};

use crate::store::{base_dir, read_document};
use crate::{Control, Node, Running};

/// Builds the planes, once, from the config the process starts with.
pub type MakePlanes<'a> = Box<dyn FnOnce(&Init<'_>) -> Result<Vec<Arc<dyn Plane>>, PlaneError> + 'a>;

/// Starts the admin listener (from the `admin` crate, which the binary wires
/// in) on the socket bound here (or handed over), and returns the server to
/// run on the control thread.
pub type AdminStart = Box<dyn FnOnce(Arc<Node>, TcpListener) -> std::io::Result<BoxFuture<'static, ()>>>;

/// Why the process could not start.
#[derive(Debug)]
pub enum RunError {
    /// The config file (or the store's resources merged into it) is invalid.
    Config(ConfigErrors),
    /// A plane could not start.
    Plane(PlaneError),
    /// Another Gatehouse serves this config.
    AlreadyRunning { control_socket: std::path::PathBuf, config: std::path::PathBuf },
    /// The running process did not hand its sockets over.
    Takeover(handover::TakeoverError),
    /// The host refused something the process needs.
    Io { what: String, error: std::io::Error },
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Config(e) => write!(f, "{e}"),
            RunError::Plane(e) => write!(f, "{e}"),
            RunError::AlreadyRunning { control_socket, config } => write!(
                f,
                "another Gatehouse runs on this config ({}); to replace it without refusing connections: gatehouse run -c {} --takeover",
                control_socket.display(),
                config.display()
            ),
            RunError::Takeover(e) => write!(f, "{e}"),
            RunError::Io { what, error } => write!(f, "{what}: {error}"),
        }
    }
}

impl std::error::Error for RunError {}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunError {
    let what = what.into();
    move |error| RunError::Io { what, error }
}

/// `gatehouse check`: everything `run` checks, without binding or writing.
pub fn check(path: &Path, make_planes: MakePlanes<'_>) -> Result<(), RunError> {
    let doc = read_document(path).map_err(RunError::Config)?;
    // With etcd, what needs etcd's resources is checked when a node loads
    // them (check does not reach etcd).
    let cfg = Arc::new(gatehouse_config::from_local_node(&doc, path).map_err(RunError::Config)?);
    let init = Init {
        config: &cfg,
        workers: 1,
        health: Arc::new(HealthRegistry::default()),
        listeners: Arc::new(Listeners::default()),
    };
    let planes = make_planes(&init).map_err(RunError::Plane)?;
    prepare_planes(&planes, &cfg, 0, &base_dir(path), Purpose::Check)
        .map(|_| ())
        .map_err(|errors| RunError::Config(ConfigErrors { file: path.to_path_buf(), errors }))
}

/// Why `gatehouse ha` got no role.
#[derive(Debug, thiserror::Error)]
pub enum HaRequestError {
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    #[error("no Gatehouse answers on {} ({source}): is it running on {}?", socket.display(), config.display())]
    NoAnswer { socket: std::path::PathBuf, config: std::path::PathBuf, source: std::io::Error },
    #[error("{}: {source}", socket.display())]
    Socket { socket: std::path::PathBuf, source: std::io::Error },
    /// The running Gatehouse's answer (`l4.ha is not configured`, `not fit
    /// to serve: ...`).
    #[error("{0}")]
    Refused(String),
}

/// `gatehouse ha [ROLE]`: asks the Gatehouse running on the config at
/// `path` for its active/standby role, or sets it (keepalived's notify),
/// over the control socket. Returns the role it has after.
pub fn ha_request(
    path: &Path,
    role: Option<gatehouse_config::HaRole>,
) -> Result<gatehouse_config::HaRole, HaRequestError> {
    use std::io::{BufRead, Write};
    let cfg = gatehouse_config::load(path)?;
    let socket = handover::socket_path(&resolve(&base_dir(path), &cfg.data_dir));
    let mut s = std::os::unix::net::UnixStream::connect(&socket).map_err(|source| HaRequestError::NoAnswer {
        socket: socket.clone(),
        config: path.to_path_buf(),
        source,
    })?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let line = match role {
        Some(r) => format!("HA {}\n", r.name()),
        None => "HA\n".to_string(),
    };
    let lost = |source| HaRequestError::Socket { socket: socket.clone(), source };
    s.write_all(line.as_bytes()).map_err(lost)?;
    let mut answer = String::new();
    std::io::BufReader::new(s).read_line(&mut answer).map_err(lost)?;
    let answer = answer.trim();
    match answer.strip_prefix("OK ").and_then(gatehouse_config::HaRole::parse) {
        Some(r) => Ok(r),
        None => Err(HaRequestError::Refused(answer.strip_prefix("ERR ").unwrap_or(answer).to_string())),
    }
}

/// `gatehouse run`: starts every plane and runs the control loop until
/// SIGTERM or SIGINT, or until a new process has taken over.
pub fn run(
    path: &Path,
    takeover: bool,
    make_planes: MakePlanes<'_>,
    admin: Option<AdminStart>,
) -> Result<(), RunError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io("cannot start the control runtime"))?;
    // Signal handlers go in before any socket is bound: a SIGHUP sent as
    // soon as the port answers must reload, not kill the process.
    let signals = rt.block_on(async { Signals::install() }).map_err(io("cannot install signal handlers"))?;
    // The file is read and decoded once; the worker count it sets is fixed
    // for the life of the process and sizes the per-worker tables.
    let local = read_document(path).map_err(RunError::Config)?;
    // With etcd the file has no certificates, routes or upstreams of its
    // own: the composed document below is checked whole. (Found by the
    // soak: an HTTPS listener on an etcd node was refused at start.)
    let file_cfg = gatehouse_config::from_local_node(&local, path).map_err(RunError::Config)?;
    let workers = match file_cfg.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let base = base_dir(path);
    let data_dir = resolve(&base, &file_cfg.data_dir);
    let store: Arc<dyn Store> = match &file_cfg.store {
        gatehouse_config::Store::File => Arc::new(FileStore::new(path)),
        gatehouse_config::Store::Etcd(cfg) => Arc::new(Etcd::new(cfg.clone(), &data_dir)),
    };
    rt.block_on(store.load());
    let composed = store.compose(&local).map_err(|e| {
        RunError::Config(ConfigErrors {
            file: path.to_path_buf(),
            errors: vec![FieldError { path: String::new(), message: e.to_string(), line: None }],
        })
    })?;
    let merged = composed.doc != local;
    let cfg = if merged || file_cfg.store != gatehouse_config::Store::File {
        let cfg = gatehouse_config::from_node(&composed.doc, path).map_err(RunError::Config)?;
        Arc::new(cfg)
    } else {
        Arc::new(file_cfg)
    };

    // The control socket: where a later binary takes this one's sockets over.
    let control_path = handover::socket_path(&data_dir);
    let ha_configured = cfg.l4.as_ref().and_then(|l| l.ha.as_ref()).map(|h| h.initial);
    // A process taking over starts in its predecessor's role: keepalived
    // will not say it again.
    let ha_role = match ha_configured {
        Some(initial) if takeover => Some(handover::query_role(&control_path).unwrap_or(initial)),
        other => other,
    };
    let (inherited, ready) = if takeover {
        let (inherited, ready) = handover::take_over(&control_path).map_err(RunError::Takeover)?;
        tracing::info!(sockets = inherited.leftover(), "took the listening sockets over from the running process");
        (Some(inherited), Some(ready))
    } else {
        if std::os::unix::net::UnixStream::connect(&control_path).is_ok() {
            return Err(RunError::AlreadyRunning { control_socket: control_path, config: path.to_path_buf() });
        }
        (None, None)
    };
    let listeners = Arc::new(Listeners::new(inherited));
    let admin_socket = match &cfg.admin {
        Some(a) => {
            let socket = match listeners.take_admin(a.address) {
                Some(s) => s,
                None => bind_exclusive(a.address).map_err(io(format!("admin.address: cannot bind {}", a.address)))?,
            };
            Some((a.address, socket))
        }
        None => None,
    };

    let health = Arc::new(HealthRegistry::new(workers));
    let init = Init { config: &cfg, workers, health: health.clone(), listeners: listeners.clone() };
    let planes = make_planes(&init).map_err(RunError::Plane)?;
    // Binds every worker's sockets before starting anything, so an address
    // in use is reported at once.
    let staged = prepare_planes(&planes, &cfg, 1, &base, Purpose::Apply).map_err(|errors| {
        let errors = ConfigErrors { file: path.to_path_buf(), errors };
        if merged {
            let text = format!("the resources in the store do not make a valid config with this file:\n{errors}");
            RunError::Config(ConfigErrors {
                file: path.to_path_buf(),
                errors: vec![FieldError { path: String::new(), message: text, line: None }],
            })
        } else {
            RunError::Config(errors)
        }
    })?;
    let versions = composed.versions.unwrap_or_else(|| resource_versions(&cfg, &cfg, 1, &Default::default()));
    let node = Arc::new(Node {
        config_path: path.to_path_buf(),
        base_dir: base,
        running: ArcSwap::from_pointee(Running { version: 1, config: cfg }),
        control: Mutex::new(Control { checks: HealthChecks::default(), doc: composed.doc, local, versions }),
        planes,
        health,
        listeners,
        store,
        metrics: ProcessMetrics::new(workers),
        admin_socket: admin_socket.as_ref().and_then(|(a, s)| s.try_clone().ok().map(|s| (*a, s))),
        handed_over: tokio::sync::Notify::new(),
        write_lock: tokio::sync::Mutex::new(()),
        ha: Mutex::new(ha_role.map(|role| crate::HaState { role, since: std::time::SystemTime::now(), changes: 0 })),
        bgp: crate::bgp::Announcer::new(path),
        bgp_changed: tokio::sync::Notify::new(),
    });
    node.bgp
        .configure(node.running.load().config.bgp.as_ref())
        .map_err(io("bgp.interface: cannot hold the TUN interface of the VIPs"))?;
    if takeover {
        node.bgp.taking_over();
    }
    if let Some(role) = ha_role {
        tracing::info!(role = role.name(), "high availability: starting in this role");
        for p in &node.planes {
            p.set_ha_role(role);
        }
    }
    for s in staged {
        s.commit();
    }
    let left = node.listeners.close_inherited();
    if left > 0 {
        tracing::warn!(
            sockets = left,
            "sockets handed over but not in this config (or beyond this worker count) are closed"
        );
    }
    let admin_server = match (admin_socket, admin) {
        (Some((addr, socket)), Some(start)) => {
            tracing::info!("admin listening on http://{addr}");
            let server =
                start(node.clone(), socket).map_err(|error| RunError::Io { what: "admin.address".into(), error })?;
            Some(server)
        }
        _ => None,
    };
    let how = if ready.is_some() { Start::TakingOver } else { Start::Fresh };
    for p in &node.planes {
        p.start(how).map_err(RunError::Plane)?;
    }
    tracing::info!(workers, config = %path.display(), "gatehouse started");

    rt.block_on(async move {
        let _admin = admin_server.map(|server| AbortOnDropHandle::new(tokio::spawn(server)));
        node.reconcile_health(&mut node.control());
        let _store_sync = node
            .store
            .clone()
            .follow(node.clone() as Arc<dyn crate::store::Target>)
            .map(|f| AbortOnDropHandle::new(tokio::spawn(f)));
        // Only now, with every worker accepting, may the old process stop.
        if let Some(ready) = ready {
            if std::env::var_os("GATEHOUSE_TEST_QUIT_BEFORE_READY").is_some() {
                // A test hook: a new process that dies before it serves.
                tracing::warn!("fault injection on (GATEHOUSE_TEST_QUIT_BEFORE_READY): quitting before READY");
                std::process::exit(70);
            }
            match handover::ready(ready) {
                // The previous process stops what its planes hand over
                // (WireGuard's sessions), then sends it: a few
                // milliseconds, but a process too old to say gives up.
                Ok(s) => {
                    for (name, state) in handover::receive_states(s, STATE_WAIT) {
                        match node.planes.iter().find(|p| p.name() == name) {
                            Some(p) => p.take_over_state(&state),
                            None => {
                                tracing::warn!(plane = %name, "takeover: state for a plane this process does not have")
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!("could not tell the previous process to stop: {e}"),
            }
            for p in &node.planes {
                p.took_over();
            }
        }
        let _control_socket = match serve_control_socket(node.clone(), &control_path) {
            Ok(task) => Some(AbortOnDropHandle::new(task)),
            Err(e) => {
                tracing::warn!("control socket {}: {e}; this process cannot be taken over", control_path.display());
                None
            }
        };
        let _announcer = AbortOnDropHandle::new(tokio::spawn(announce(node.clone())));
        let _daemon = AbortOnDropHandle::new(tokio::spawn(tell_daemon(node.clone())));
        control_loop(node, signals).await;
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

/// How long a process taking over waits for its predecessor's planes' state.
const STATE_WAIT: Duration = Duration::from_secs(5);

/// How often the announcer reads the planes' VIPs and their health.
const ANNOUNCE_EVERY: Duration = Duration::from_millis(100);
/// How often the announcer asks the BGP daemon for its sessions.
const DAEMON_EVERY: Duration = Duration::from_secs(2);

/// Keeps the announced VIPs in step with the planes' health.
async fn announce(node: Arc<Node>) {
    let mut tick = tokio::time::interval(ANNOUNCE_EVERY);
    loop {
        tick.tick().await;
        node.announce();
    }
}

/// Keeps the BGP daemon's config in step with `bgp`, and reads its
/// sessions' states, off the control thread.
async fn tell_daemon(node: Arc<Node>) {
    loop {
        if node.bgp.has_daemon_work() {
            let n = node.clone();
            let _ = tokio::task::spawn_blocking(move || n.bgp.sync_daemon()).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(DAEMON_EVERY) => {}
            _ = node.bgp_changed.notified() => {}
        }
    }
}

async fn control_loop(node: Arc<Node>, mut signals: Signals) {
    let stop = loop {
        tokio::select! {
            _ = node.handed_over.notified() => break false,
            _ = signals.hup.recv() => {
                let _ = node.reload();
            }
            _ = signals.term.recv() => break true,
            _ = signals.int.recv() => break true,
        }
    };
    if stop {
        withdraw(&node, &mut signals).await;
    } else {
        // The new process owns the announcements now.
        node.bgp.retire();
    }
    drain(&node, &mut signals).await;
}

/// On SIGTERM with VIPs announced: withdraws them, and serves on for
/// `bgp.drain_delay` while the routers converge. A second signal ends the
/// wait.
async fn withdraw(node: &Node, signals: &mut Signals) {
    let Some(delay) = node.bgp.drain_delay() else { return };
    node.bgp.drain(Some(crate::bgp::DrainReason::Shutdown));
    tracing::info!(drain_delay = ?delay, "stopping: VIPs withdrawn; serving while the routers converge");
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = signals.term.recv() => {}
        _ = signals.int.recv() => {}
    }
}

/// Every plane stops taking new work; returns when no work is left or
/// `shutdown_timeout` has passed. A second signal stops at once.
async fn drain(node: &Node, signals: &mut Signals) {
    let deadline = tokio::time::Instant::now() + node.running.load().config.shutdown_timeout;
    for p in &node.planes {
        p.drain();
    }
    node.listeners.clear();
    let in_progress = || node.planes.iter().map(|p| p.in_progress()).sum::<u64>();
    tracing::info!(connections = in_progress(), "stopping: listeners closed, finishing requests in flight");
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = signals.term.recv() => break,
            _ = signals.int.recv() => break,
        }
        let open = in_progress();
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

/// Serves the control socket: a `TAKEOVER` hands every listening socket to
/// the asking process; its `READY` starts this one's drain.
fn serve_control_socket(node: Arc<Node>, path: &Path) -> std::io::Result<tokio::task::JoinHandle<()>> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A file left by a process that is gone (or the one being replaced,
    // which no longer needs its path) is replaced.
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    Ok(tokio::spawn(async move {
        loop {
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
            let Ok((stream, _)) = listener.accept().await else { continue };
            let mut lines = tokio::io::BufReader::new(stream);
            let mut first = String::new();
            if lines.read_line(&mut first).await.is_err() {
                continue;
            }
            // `HA` asks for the active/standby role, `HA ROLE` sets it
            // (`gatehouse ha`, from keepalived's notify).
            if let Some(rest) = first.trim().strip_prefix("HA") {
                let answer = match rest.trim() {
                    "" => match (node.ha(), node.ready()) {
                        (None, _) => "ERR l4.ha is not configured".to_string(),
                        (Some(_), Err(e)) => format!("ERR not fit to serve: {e}"),
                        (Some(h), Ok(())) => format!("OK {}", h.role.name()),
                    },
                    role => match gatehouse_config::HaRole::parse(role) {
                        Some(r) => match node.set_ha_role(r) {
                            Ok(h) => format!("OK {}", h.role.name()),
                            Err(e) => format!("ERR {e}"),
                        },
                        None => format!("ERR {role:?} is not a role: expected master, backup or fault"),
                    },
                };
                let _ = lines.get_mut().write_all(format!("{answer}\n").as_bytes()).await;
                continue;
            }
            if first.trim() != "TAKEOVER" {
                continue;
            }
            let admin = node.admin_socket.as_ref().map(|(a, s)| (*a, s));
            match handover::hand_over(lines, node.listeners.registry(), admin).await {
                Ok(Some(mut lines)) => {
                    tracing::info!("a new process took the listening sockets over; finishing requests in flight");
                    let states: Vec<_> =
                        node.planes.iter().filter_map(|p| p.hand_over_state().map(|s| (p.name(), s))).collect();
                    if let Err(e) = handover::send_states(&mut lines, states).await {
                        tracing::warn!("takeover: the planes' state was not handed over: {e}");
                    }
                    node.handed_over.notify_one();
                    return;
                }
                Ok(None) => {
                    tracing::warn!("a takeover did not complete; still serving");
                    node.planes.iter().for_each(|p| p.takeover_abandoned());
                }
                Err(e) => {
                    tracing::warn!("takeover failed: {e}; still serving");
                    node.planes.iter().for_each(|p| p.takeover_abandoned());
                }
            }
        }
    }))
}
