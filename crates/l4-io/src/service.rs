//! The L4 plane as the node sees it: started once when the config has L4
//! services, given each new `l4` section, stopped at once on a drain (packets
//! have no connections to finish) or when a process takes over (which needs
//! the interfaces, and gets the sessions: [`crate::takeover`]), and
//! rendering its own counters.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use gatehouse_config::{Config, FieldError, HaRole, KeySource, L4 as L4Config, L4Io, Named};
use gatehouse_l4::sync::Key;
use gatehouse_plane::health::HealthRegistry;
use gatehouse_plane::metrics::Exposition;
use gatehouse_plane::{HealthTarget, Init, NotReady, Plane, PlaneError, Prepare, Staged, Start};

use crate::runtime::{HaStart, L4Runtime, StartError};
use crate::shared::{HealthFn, WorkerStats};
use crate::steer::Loaded;
use crate::takeover::Handover;

/// The health-registry group of an L4 service's real servers.
fn health_group(service: &str) -> String {
    format!("l4/{service}")
}

/// The L4 packet plane.
#[derive(Clone)]
pub struct L4(Arc<Inner>);

struct Inner {
    health: Arc<HealthRegistry>,
    /// The `l4` section committed last.
    cfg: Mutex<Option<L4Config>>,
    runtime: OnceLock<L4Runtime>,
    /// Set once the process has started its planes.
    started: std::sync::atomic::AtomicBool,
    /// The role the node gave (keepalived's), once it gave one.
    role: Mutex<Option<HaRole>>,
    /// The sync key of the committed config.
    sync_key: Mutex<Option<Key>>,
    /// What a takeover brings, until the runtime starts with it.
    handover: Mutex<Handover>,
    /// Where the runtime's XDP links are recorded for the next takeover.
    listeners: Arc<gatehouse_plane::listeners::Listeners>,
    /// The interfaces whose XDP state is recorded there.
    recorded: Mutex<Vec<String>>,
}

impl L4 {
    pub fn new(init: &Init<'_>) -> L4 {
        L4(Arc::new(Inner {
            health: init.health.clone(),
            cfg: Mutex::new(None),
            runtime: OnceLock::new(),
            started: std::sync::atomic::AtomicBool::new(false),
            role: Mutex::new(None),
            sync_key: Mutex::new(None),
            handover: Mutex::new(Handover::default()),
            listeners: init.listeners.clone(),
            recorded: Mutex::new(Vec::new()),
        }))
    }

    /// Lets go of the XDP state recorded for a takeover: the programs
    /// leave the interfaces once no process holds their links.
    fn forget_xdp(&self) {
        for interface in self.0.recorded.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            self.0.listeners.forget_xdp(&interface);
        }
    }

    fn cfg(&self) -> MutexGuard<'_, Option<L4Config>> {
        self.0.cfg.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The committed `l4` section, if it has anything to run (services or
    /// SNAT rules).
    fn to_run(&self) -> Option<L4Config> {
        self.cfg().clone().filter(|l| !l.services.is_empty() || !l.snat.is_empty())
    }

    /// Loads the steering program for every interface of the config, as
    /// far as it loads (what does not is loaded again at the start, which
    /// says why). Where the previous process handed its link and sockets
    /// over, the program goes behind the link at once, sending to the
    /// previous process's sockets, which the start adopts.
    fn preload(&self) {
        let mut handover = self.0.handover.lock().unwrap_or_else(|e| e.into_inner());
        let Some(l4) = self.to_run().filter(|l| l.io != L4Io::AfPacket) else {
            // No XDP here: the previous process's programs go when it does.
            handover.xdp.clear();
            return;
        };
        handover.xdp.retain(|name, _| l4.interfaces.contains(name));
        let owns = match (&l4.ha, *self.0.role.lock().unwrap_or_else(|e| e.into_inner())) {
            (None, _) => true,
            (Some(h), role) => role.unwrap_or(h.initial) == HaRole::Master,
        };
        for name in &l4.interfaces {
            let loaded = match Loaded::load() {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!(interface = %name, "takeover: the XDP program is not loaded ahead: {e}");
                    continue;
                }
            };
            let Some(xdp) = handover.xdp.remove(name).filter(|x| !x.sockets.is_empty()) else {
                handover.programs.insert(name.clone(), loaded);
                continue;
            };
            match crate::runtime::swap_in_ahead(name, loaded, xdp, &l4, owns, &mut handover) {
                Ok(()) => tracing::info!(
                    interface = %name,
                    "XDP program swapped in behind the previous process's link; its sockets serve on"
                ),
                Err(e) => {
                    tracing::warn!(interface = %name, "takeover: the XDP program waits for the previous process: {e}")
                }
            }
        }
    }

    /// Starts the runtime if the config has services (once; later configs
    /// go to [`L4Runtime::update`]). `fallback` as for [`L4Runtime::start`].
    fn start_runtime(&self, fallback: bool) -> Result<(), StartError> {
        let Some(l4) = self.to_run() else { return Ok(()) };
        let registry = self.0.health.clone();
        let health: HealthFn = Arc::new(move |service, addr| registry.get(&health_group(service), addr).is_up());
        let ha = l4.ha.as_ref().map(|h| HaStart {
            role: self.0.role.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(h.initial),
            key: self.0.sync_key.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        });
        let mut handover = self.0.handover.lock().unwrap_or_else(|e| e.into_inner());
        let rt = L4Runtime::start(&l4, health, fallback, ha, &mut handover)?;
        if !handover.xdp.is_empty() || !handover.prepared.is_empty() {
            tracing::warn!(
                interfaces = handover.xdp.len() + handover.prepared.len(),
                "takeover: XDP links handed over and not used are let go"
            );
            handover.xdp.clear();
            handover.prepared.clear();
        }
        handover.frames.clear();
        drop(handover);
        for (interface, xdp) in rt.take_xdp_handover() {
            self.0.listeners.record_xdp(&interface, xdp);
            self.0.recorded.lock().unwrap_or_else(|e| e.into_inner()).push(interface);
        }
        // The role may have changed while the runtime was starting.
        if let Some(role) = *self.0.role.lock().unwrap_or_else(|e| e.into_inner()) {
            rt.set_role(role);
        }
        tracing::info!(services = l4.services.len(), backend = rt.backend, "L4 plane started");
        let _ = self.0.runtime.set(rt);
        Ok(())
    }
}

struct StagedL4 {
    plane: L4,
    cfg: Option<L4Config>,
    sync_key: Option<Key>,
}

/// The sync key of `l4.ha.sync`, read from the config or its file.
fn read_sync_key(config: &Config, base: &std::path::Path) -> Result<Option<Key>, FieldError> {
    let Some(sync) = config.l4.as_ref().and_then(|l| l.ha.as_ref()).and_then(|h| h.sync.as_ref()) else {
        return Ok(None);
    };
    match &sync.key {
        KeySource::Inline(k) => Ok(Some(Key::new(&k.0))),
        KeySource::File(f) => {
            let path = gatehouse_plane::resolve(base, f);
            let fail = |message: String| FieldError { path: "l4.ha.sync.key_file".into(), message, line: None };
            let text = zeroize::Zeroizing::new(
                std::fs::read_to_string(&path).map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?,
            );
            let key = gatehouse_config::decode_key(&text)
                .ok_or_else(|| fail(format!("{} does not hold a key (32 bytes in base64)", path.display())))?;
            Ok(Some(Key::new(&key)))
        }
    }
}

impl Staged for StagedL4 {
    fn commit(self: Box<Self>) {
        let inner = &self.plane.0;
        let running = inner.started.load(std::sync::atomic::Ordering::Relaxed);
        if !running && let Some(l4) = &self.cfg {
            // A takeover: the previous process's links and sockets of this
            // config's interfaces, taken before the node closes what no
            // plane took.
            let mut handover = inner.handover.lock().unwrap_or_else(|e| e.into_inner());
            for name in &l4.interfaces {
                if let Some(x) = inner.listeners.take_xdp(name) {
                    handover.xdp.insert(name.clone(), x);
                }
            }
        }
        match (inner.runtime.get(), &self.cfg) {
            (Some(rt), Some(l4)) => rt.update(l4),
            (None, Some(l4)) if running && !l4.services.is_empty() => {
                tracing::warn!("l4.services added to a running process: the L4 plane starts at the next start");
            }
            _ => {}
        }
        *self.plane.cfg() = self.cfg;
        *self.plane.0.sync_key.lock().unwrap_or_else(|e| e.into_inner()) = self.sync_key;
    }
}

impl Plane for L4 {
    fn name(&self) -> &'static str {
        "l4"
    }

    /// The config crate has validated the section; nothing else can fail
    /// before the interfaces are opened.
    fn prepare(&self, config: &Arc<Config>, cx: &Prepare<'_>) -> Result<Box<dyn Staged>, Vec<FieldError>> {
        let sync_key = read_sync_key(config, cx.base_dir).map_err(|e| vec![e])?;
        Ok(Box::new(StagedL4 { plane: self.clone(), cfg: config.l4.clone(), sync_key }))
    }

    fn ready(&self) -> Result<(), NotReady> {
        let wanted = self.cfg().as_ref().is_some_and(|l| !l.services.is_empty() || !l.snat.is_empty());
        match self.0.runtime.get() {
            None if wanted && self.0.started.load(std::sync::atomic::Ordering::Relaxed) => {
                Err(NotReady::NotRunning("L4"))
            }
            Some(rt) if !rt.alive() => Err(NotReady::ThreadStopped("L4 worker")),
            _ => Ok(()),
        }
    }

    fn set_ha_role(&self, role: HaRole) {
        *self.0.role.lock().unwrap_or_else(|e| e.into_inner()) = Some(role);
        if let Some(rt) = self.0.runtime.get() {
            rt.set_role(role);
        }
    }

    fn status(&self, out: &mut serde_json::Map<String, serde_json::Value>) {
        let Some(rt) = self.0.runtime.get() else { return };
        let services: Vec<serde_json::Value> = self
            .cfg()
            .iter()
            .flat_map(|l| &l.services)
            .map(|s| {
                let group = health_group(&s.name);
                let reals: Vec<serde_json::Value> = s
                    .real_servers
                    .iter()
                    .filter_map(|r| r.address.map(|a| (a, r.weight)))
                    .map(|(a, weight)| {
                        let up = self.0.health.get(&group, a).is_up();
                        serde_json::json!({ "address": a.to_string(), "weight": weight, "healthy": up })
                    })
                    .collect();
                serde_json::json!({
                    "name": s.name,
                    "address": s.address.map(|a| a.to_string()),
                    "protocol": s.protocol.name(),
                    "scheduler": s.scheduler.name(),
                    "mode": s.mode.name(),
                    "real_servers": reals,
                })
            })
            .collect();
        out.insert("l4_services".into(), serde_json::Value::from(services));
        let Some(ha) = rt.ha() else { return };
        let mut m = serde_json::Map::new();
        m.insert("role".into(), ha.role().name().into());
        if let Some(s) = &ha.sync {
            let c = &s.counters;
            let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            m.insert(
                "sync".into(),
                serde_json::json!({
                    "listen": s.cfg.listen.to_string(),
                    "peer": s.cfg.peer.to_string(),
                    "node_id": s.cfg.node(),
                    "peer_heard": get(&c.peer_heard_ms) > 0,
                    "sessions_sent": get(&c.sessions_sent),
                    "sessions_received": get(&c.sessions_received),
                    "sessions_cached": get(&c.cached),
                    "sessions_committed": get(&c.committed),
                    "bulk_syncs": get(&c.bulk_syncs),
                }),
            );
        }
        out.insert("l4_ha".into(), serde_json::Value::Object(m));
    }

    fn start(&self, how: Start) -> Result<(), PlaneError> {
        self.0.started.store(true, std::sync::atomic::Ordering::Relaxed);
        match how {
            Start::Fresh => {
                self.start_runtime(true).map_err(|e| PlaneError { plane: "l4", path: e.path, message: e.message })
            }
            // The previous process gives the interfaces up when it hands
            // over: meanwhile the programs are loaded, ready to attach.
            Start::TakingOver => {
                self.preload();
                Ok(())
            }
        }
    }

    /// Taken over: stops the workers (the interfaces go to the new
    /// process) and hands on the sessions they held.
    fn hand_over_state(&self) -> Option<zeroize::Zeroizing<Vec<u8>>> {
        let rt = self.0.runtime.get()?;
        let handed = rt.stop_and_export();
        // The new process holds the links now; this one lets go of its own.
        self.forget_xdp();
        let records = &handed.sessions;
        let state = crate::takeover::encode(records, &handed.frames);
        let left = records.len().saturating_sub(crate::takeover::MAX_RECORDS);
        if left > 0 {
            tracing::warn!(sessions = left, "takeover: too many L4 sessions to hand over; these are not");
        }
        tracing::info!(sessions = records.len() - left, "L4 plane stopped; its sessions go to the new process");
        Some(zeroize::Zeroizing::new(state))
    }

    /// A process that took the sockets over may have put its program
    /// behind this one's links already: this one's goes back.
    fn takeover_abandoned(&self) {
        if let Some(rt) = self.0.runtime.get() {
            rt.reclaim();
            tracing::info!("the XDP programs of this process steer again");
        }
    }

    fn take_over_state(&self, state: &[u8]) {
        match crate::takeover::decode(state) {
            Ok(state) => {
                let mut handover = self.0.handover.lock().unwrap_or_else(|e| e.into_inner());
                handover.sessions = state.sessions;
                handover.frames = state.frames.into_iter().map(|f| ((f.interface, f.queue), f.free)).collect();
            }
            Err(e) => tracing::warn!("takeover: the L4 sessions handed over are refused ({e}); they start anew"),
        }
    }

    /// After a takeover the previous process lets the interfaces go as it
    /// hands its sessions over: tries again for a few seconds before
    /// settling for what `io` allows.
    fn took_over(&self) {
        let plane = self.clone();
        let spawned = std::thread::Builder::new().name("l4-start".into()).spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                let last = std::time::Instant::now() >= deadline;
                match plane.start_runtime(last) {
                    Ok(()) => return,
                    Err(e) if last => {
                        tracing::error!("l4: {e}; the L4 plane is not running");
                        // The previous process's programs go when it does.
                        let mut handover = plane.0.handover.lock().unwrap_or_else(|e| e.into_inner());
                        handover.xdp.clear();
                        handover.prepared.clear();
                        return;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!("l4: cannot start: {e}");
        }
    }

    fn drain(&self) {
        if let Some(rt) = self.0.runtime.get() {
            rt.stop();
            // Nothing holds the programs on the interfaces any more.
            self.forget_xdp();
            tracing::info!("L4 plane stopped");
        }
    }

    fn metrics(&self, out: &mut Exposition) {
        let Some(rt) = self.0.runtime.get() else { return };
        let services = rt
            .layout()
            .into_iter()
            .map(|(name, reals)| {
                let group = health_group(&name);
                // What traffic follows: the published plane's view.
                let reals = reals
                    .into_iter()
                    .map(|(a, up)| (a, up.unwrap_or_else(|| self.0.health.get(&group, a).is_up())))
                    .collect();
                (name, reals)
            })
            .collect();
        render(out, &Scrape { workers: rt.stats(), services, snat: rt.snat_rules() });
        if let Some(ha) = rt.ha() {
            render_ha(out, ha);
        }
    }

    /// A service's VIP can be served while the plane runs, the node is the
    /// master (with `ha`), and one of its real servers is healthy.
    fn vips(&self, out: &mut Vec<gatehouse_plane::Vip>) {
        let running = self.0.runtime.get().is_some_and(|rt| rt.alive());
        let cfg = self.cfg();
        let Some(l4) = cfg.as_ref() else { return };
        let master = match &l4.ha {
            Some(h) => self.0.role.lock().unwrap_or_else(|e| e.into_inner()).unwrap_or(h.initial) == HaRole::Master,
            None => true,
        };
        for s in l4.services.iter().filter(|s| s.announce) {
            let Some(vip) = s.address else { continue };
            let group = health_group(&s.name);
            let up = || s.real_servers.iter().filter_map(|r| r.address).any(|a| self.0.health.get(&group, a).is_up());
            out.push(gatehouse_plane::Vip {
                address: vip.ip(),
                healthy: running && master && up(),
                of: format!("l4 service {}", s.name),
            });
        }
    }

    fn health_targets(&self, out: &mut Vec<HealthTarget>) {
        let cfg = self.cfg();
        for s in cfg.iter().flat_map(|l| &l.services) {
            let group = health_group(&s.name);
            for addr in s.real_servers.iter().filter_map(|r| r.address) {
                let health = self.0.health.get(&group, addr);
                out.push(HealthTarget { group: group.clone(), health, check: s.health_check.clone() });
            }
        }
    }
}

/// The L4 plane's figures: every worker's counters, and the services'
/// names and real servers (with health) in counter order.
struct Scrape {
    workers: Vec<WorkerStats>,
    services: Vec<(String, Vec<(std::net::SocketAddr, bool)>)>,
    snat: Vec<String>,
}

/// A metric: name, type, help, and how to read it from what it is of.
type Series<'a, T, V> = (&'a str, &'a str, &'a str, &'a dyn Fn(&T) -> V);

fn render(o: &mut Exposition, l4: &Scrape) {
    use gatehouse_l4::plane::ServiceCounters;
    let per_service = |f: &dyn Fn(&ServiceCounters) -> u64, i: usize| -> u64 {
        l4.workers.iter().filter_map(|w| w.counters.services.get(i)).map(f).sum()
    };
    let series: [Series<'_, ServiceCounters, u64>; 8] = [
        ("gatehouse_l4_packets_total", "counter", "Packets from clients to each L4 service.", &|c| c.packets),
        ("gatehouse_l4_bytes_total", "counter", "Bytes from clients to each L4 service.", &|c| c.bytes),
        ("gatehouse_l4_sessions_total", "counter", "Sessions created per L4 service.", &|c| c.sessions_total),
        ("gatehouse_l4_sessions_active", "gauge", "Sessions in the tables per L4 service.", &|c| c.sessions_active),
        (
            "gatehouse_l4_resets_total",
            "counter",
            "TCP resets sent for sessions of real servers that went down (on_server_down: reset).",
            &|c| c.resets,
        ),
        (
            "gatehouse_l4_syn_cookies_sent_total",
            "counter",
            "SYN-ACKs with a cookie sent by the SYN proxy (no session kept).",
            &|c| c.syn_cookies_sent,
        ),
        (
            "gatehouse_l4_syn_cookies_valid_total",
            "counter",
            "ACKs that returned a good cookie: connections the SYN proxy opened.",
            &|c| c.syn_cookies_valid,
        ),
        (
            "gatehouse_l4_syn_cookies_failed_total",
            "counter",
            "ACKs whose cookie was not good (forged or too old), dropped.",
            &|c| c.syn_cookies_failed,
        ),
    ];
    for (name, kind, help, f) in series {
        o.header(name, kind, help);
        for (i, (service, _)) in l4.services.iter().enumerate() {
            o.sample(name, &[("service", service)], per_service(f, i));
        }
    }
    let per_real = |f: fn(&ServiceCounters) -> &[u64], i: usize, j: usize| -> u64 {
        l4.workers.iter().filter_map(|w| w.counters.services.get(i)).filter_map(|c| f(c).get(j)).sum()
    };
    type PerReal = fn(&ServiceCounters) -> &[u64];
    let reals: [(&str, &str, &str, PerReal); 2] = [
        ("gatehouse_l4_real_packets_total", "counter", "Packets sent to each real server.", |c| &c.per_real_packets),
        ("gatehouse_l4_real_sessions_active", "gauge", "Sessions per real server.", |c| &c.per_real_active),
    ];
    for (name, kind, help, f) in reals {
        o.header(name, kind, help);
        for (i, (service, rs)) in l4.services.iter().enumerate() {
            for (j, (addr, _)) in rs.iter().enumerate() {
                o.sample(name, &[("service", service), ("real", &addr.to_string())], per_real(f, i, j));
            }
        }
    }
    o.header("gatehouse_l4_real_up", "gauge", "1 while a real server passes its health check and takes new sessions.");
    for (service, rs) in &l4.services {
        for (addr, up) in rs {
            o.sample("gatehouse_l4_real_up", &[("service", service), ("real", &addr.to_string())], u8::from(*up));
        }
    }
    if !l4.snat.is_empty() {
        let per_rule = |f: fn(&gatehouse_l4::plane::SnatCounters) -> u64, i: usize| -> u64 {
            l4.workers.iter().filter_map(|w| w.counters.snat.get(i)).map(f).sum()
        };
        o.header("gatehouse_l4_snat_sessions_total", "counter", "Mappings SNAT made, per rule.");
        for (i, rule) in l4.snat.iter().enumerate() {
            o.sample("gatehouse_l4_snat_sessions_total", &[("rule", rule)], per_rule(|c| c.sessions_total, i));
        }
        o.header("gatehouse_l4_snat_packets_total", "counter", "Packets through SNAT, per rule and direction.");
        for (i, rule) in l4.snat.iter().enumerate() {
            o.sample(
                "gatehouse_l4_snat_packets_total",
                &[("rule", rule), ("direction", "out")],
                per_rule(|c| c.packets_out, i),
            );
            o.sample(
                "gatehouse_l4_snat_packets_total",
                &[("rule", rule), ("direction", "in")],
                per_rule(|c| c.packets_in, i),
            );
        }
    }
    o.header("gatehouse_l4_drops_total", "counter", "Packets the L4 plane dropped, by reason.");
    for d in gatehouse_l4::plane::DropReason::all() {
        let n: u64 = l4.workers.iter().map(|w| w.counters.dropped(d)).sum();
        o.sample("gatehouse_l4_drops_total", &[("reason", d.name())], n);
    }
    let no_neighbour: u64 = l4.workers.iter().map(|w| w.io.no_neighbour).sum();
    let no_route: u64 = l4.workers.iter().map(|w| w.io.no_route).sum();
    let tx_full: u64 = l4.workers.iter().map(|w| w.io.tx_full).sum();
    o.sample("gatehouse_l4_drops_total", &[("reason", "no_neighbour")], no_neighbour);
    o.sample("gatehouse_l4_drops_total", &[("reason", "no_route")], no_route);
    o.sample("gatehouse_l4_drops_total", &[("reason", "tx_ring_full")], tx_full);
    let io: [Series<'_, WorkerStats, u64>; 3] = [
        ("gatehouse_l4_rx_packets_total", "counter", "Frames the L4 plane received, per interface and queue.", &|w| {
            w.io.rx_packets
        }),
        ("gatehouse_l4_tx_packets_total", "counter", "Frames the L4 plane sent, per interface and queue.", &|w| {
            w.io.tx_packets
        }),
        (
            "gatehouse_l4_answered_total",
            "counter",
            "ARP and neighbour-discovery answers sent for owned addresses.",
            &|w| w.counters.answered,
        ),
    ];
    for (name, kind, help, f) in io {
        o.header(name, kind, help);
        for w in &l4.workers {
            o.sample(name, &[("interface", &w.interface), ("queue", &w.queue.to_string())], f(w));
        }
    }
}

fn render_ha(o: &mut Exposition, ha: &crate::ha::Ha) {
    use std::sync::atomic::Ordering::Relaxed;
    o.header("gatehouse_l4_ha_role", "gauge", "1 for the L4 plane's active/standby role now.");
    for r in HaRole::ALL {
        o.sample("gatehouse_l4_ha_role", &[("role", r.name())], u8::from(ha.role() == r));
    }
    o.header("gatehouse_l4_ha_role_changes_total", "counter", "Changes of the L4 plane's active/standby role.");
    o.sample("gatehouse_l4_ha_role_changes_total", &[], ha.changes.load(Relaxed));
    let Some(s) = &ha.sync else { return };
    let c = &s.counters;
    let plain: [(&str, &str, &str, &std::sync::atomic::AtomicU64); 9] = [
        ("gatehouse_l4_sync_sessions_sent_total", "counter", "Sessions sent to the peer balancer.", &c.sessions_sent),
        (
            "gatehouse_l4_sync_sessions_received_total",
            "counter",
            "Sessions received from the peer balancer (while standby).",
            &c.sessions_received,
        ),
        (
            "gatehouse_l4_sync_sessions_committed_total",
            "counter",
            "Synced sessions committed into the tables on promotion.",
            &c.committed,
        ),
        (
            "gatehouse_l4_sync_sessions_dropped_total",
            "counter",
            "Sessions not sent (over max_rate, queues full) or not kept (cache full).",
            &c.sessions_dropped,
        ),
        ("gatehouse_l4_sync_sessions_cached", "gauge", "The peer's sessions held while standby.", &c.cached),
        ("gatehouse_l4_sync_datagrams_sent_total", "counter", "Sync datagrams sent.", &c.datagrams_sent),
        (
            "gatehouse_l4_sync_datagrams_received_total",
            "counter",
            "Sync datagrams accepted from the peer.",
            &c.datagrams_received,
        ),
        ("gatehouse_l4_sync_send_errors_total", "counter", "Sync datagrams the socket refused.", &c.send_errors),
        (
            "gatehouse_l4_sync_bulk_total",
            "counter",
            "Full passes over the tables because the peer (re)joined.",
            &c.bulk_syncs,
        ),
    ];
    for (name, kind, help, v) in plain {
        o.header(name, kind, help);
        o.sample(name, &[], v.load(Relaxed));
    }
    o.header(
        "gatehouse_l4_sync_refused_total",
        "counter",
        "Sync datagrams refused, by reason (malformed, bad MAC, own node id, old epoch, replayed).",
    );
    for (i, name) in gatehouse_l4::sync::Refused::NAMES.iter().enumerate() {
        o.sample("gatehouse_l4_sync_refused_total", &[("reason", name)], c.refused[i].load(Relaxed));
    }
    o.header(
        "gatehouse_l4_sync_commit_failed_total",
        "counter",
        "Synced sessions a promotion could not commit, by reason.",
    );
    for (i, name) in gatehouse_l4::plane::CommitError::NAMES.iter().enumerate() {
        o.sample("gatehouse_l4_sync_commit_failed_total", &[("reason", name)], c.commit_failed[i].load(Relaxed));
    }
}
