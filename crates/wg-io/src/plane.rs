//! The WireGuard plane as the node sees it: interfaces made at start,
//! changed peer by peer on each new config (an interface whose key, name
//! or port changed is made again), stopped on a drain, and rendering its
//! peers' counters and state.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gatehouse_config::{Config, FieldError, KeySource, WgSecret};
use gatehouse_plane::metrics::Exposition;
use gatehouse_plane::{HealthTarget, Init, Plane, PlaneError, Prepare, Staged, Start};
use gatehouse_wg::crypto::StaticSecret;
use serde_json::{Map, Value, json};

use crate::interface::Interface;
use crate::router::handover;
use crate::shared::{DROP_SLOTS, Settings};
use gatehouse_wg::device::DropReason;

/// The WireGuard VPN plane.
#[derive(Clone)]
pub struct WireGuard(Arc<Inner>);

struct Inner {
    workers: usize,
    /// The interfaces' settings committed last.
    wanted: Mutex<Vec<Settings>>,
    running: Mutex<HashMap<String, Interface>>,
    started: AtomicBool,
    /// Forwarding warnings given (interface and networks), each once.
    warned: Mutex<HashSet<String>>,
    /// What takeovers hand on, both ways ([`crate::handover`]).
    handover: Arc<crate::handover::Handover>,
}

impl WireGuard {
    pub fn new(init: &Init<'_>) -> WireGuard {
        WireGuard(Arc::new(Inner {
            workers: init.workers,
            wanted: Mutex::new(Vec::new()),
            running: Mutex::new(HashMap::new()),
            started: AtomicBool::new(false),
            warned: Mutex::new(HashSet::new()),
            handover: Arc::new(crate::handover::Handover::new(init.listeners.clone())),
        }))
    }

    fn running(&self) -> MutexGuard<'_, HashMap<String, Interface>> {
        self.0.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings the running interfaces in line with `wanted`.
    fn reconcile(&self, wanted: &[Settings]) -> Result<(), PlaneError> {
        self.reconcile_paused(wanted, false)
    }

    /// As [`WireGuard::reconcile`]; interfaces made now are left paused
    /// when `paused` (a takeover, until the sessions are handed over).
    fn reconcile_paused(&self, wanted: &[Settings], paused: bool) -> Result<(), PlaneError> {
        let mut running = self.running();
        let names: Vec<String> = running.keys().cloned().collect();
        for name in names {
            let keep = wanted.iter().find(|w| w.name == name).is_some_and(|w| {
                running.get(&name).is_some_and(|r| {
                    let s = r.shared.settings();
                    *s.secret.0 == *w.secret.0
                        && (w.listen_port == 0 || s.listen_port == w.listen_port)
                        && s.fwmark == w.fwmark
                        && s.router == w.router
                })
            });
            if !keep && let Some(i) = running.remove(&name) {
                i.stop();
                tracing::info!(interface = %name, "WireGuard interface stopped");
            }
        }
        let mut first_error = None;
        for (i, w) in wanted.iter().enumerate() {
            match running.get(&w.name) {
                Some(r) => r.update(w.clone()),
                None => match Interface::start(w.clone(), self.0.workers, paused, &self.0.handover) {
                    Ok(r) => {
                        tracing::info!(
                            interface = %w.name,
                            port = r.shared.settings().listen_port,
                            peers = w.peers.len(),
                            "WireGuard interface up"
                        );
                        running.insert(w.name.clone(), r);
                    }
                    Err(e) => {
                        let path = format!(
                            "wireguard.interfaces[{i}]{}",
                            e.field.map(|f| format!(".{f}")).unwrap_or_default()
                        );
                        tracing::error!("{path}: {}", e.message);
                        first_error.get_or_insert(PlaneError::at("wireguard", path, e.message));
                    }
                },
            }
        }
        self.note_forwarding(wanted);
        first_error.map_or(Ok(()), Err)
    }

    /// Warns, once for each interface and set of networks, when peers have
    /// networks behind them but this host does not forward IP packets: the
    /// tunnel then carries only this host's own traffic with those networks
    /// (the usual surprise of a new site-to-site gateway). `/status` shows
    /// the same while it lasts.
    fn note_forwarding(&self, wanted: &[Settings]) {
        let mut warned = self.0.warned.lock().unwrap_or_else(|e| e.into_inner());
        for w in wanted {
            for off in forwarding_off(w) {
                if warned.insert(format!("{} {}", w.name, off.networks.join(" "))) {
                    tracing::warn!(interface = %w.name, networks = %off.networks.join(", "), "{}", off.message());
                }
            }
        }
    }
}

/// A family whose forwarding is off while peers have networks of it behind them.
struct ForwardingOff {
    family: &'static str,
    sysctl: &'static str,
    networks: Vec<String>,
}

impl ForwardingOff {
    fn message(&self) -> String {
        format!(
            "{} forwarding is off ({} = 0): this host reaches the networks behind its peers ({}), but routes \
             nothing between them and its other interfaces",
            self.family,
            self.sysctl,
            self.networks.join(", ")
        )
    }
}

/// The families of `s`'s networks behind peers whose forwarding this host
/// has off (read from /proc/sys, in this process's network namespace).
fn forwarding_off(s: &Settings) -> Vec<ForwardingOff> {
    if s.router.is_some() {
        // Router mode forwards on its own, whatever the kernel does.
        return Vec::new();
    }
    const FAMILIES: [(bool, &str, &str); 2] =
        [(false, "IPv4", "net.ipv4.ip_forward"), (true, "IPv6", "net.ipv6.conf.all.forwarding")];
    let behind = crate::link::networks_behind_peers(s);
    FAMILIES
        .iter()
        .filter_map(|&(v6, family, sysctl)| {
            let networks: Vec<String> =
                behind.iter().filter(|n| n.addr().is_ipv6() == v6).map(ToString::to_string).collect();
            // The sysctl is read only for a family with networks behind peers.
            if networks.is_empty() {
                return None;
            }
            let path = format!("/proc/sys/{}", sysctl.replace('.', "/"));
            let off = std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "0");
            off.then_some(ForwardingOff { family, sysctl, networks })
        })
        .collect()
}

/// The suffix of the state's entry that carries an interface's AF_XDP
/// frames (no interface name holds a '/').
const XSK_SUFFIX: &str = "/xsk";

/// One interface of the state [`Plane::hand_over_state`] writes: its
/// name, its sessions, and what follows.
fn split_interface(b: &[u8]) -> Option<(&str, &[u8], &[u8])> {
    let (len, b) = b.split_first_chunk::<2>()?;
    let (name, b) = b.split_at_checked(usize::from(u16::from_le_bytes(*len)))?;
    let (len, b) = b.split_first_chunk::<4>()?;
    let (sessions, rest) = b.split_at_checked(usize::try_from(u32::from_le_bytes(*len)).ok()?)?;
    Some((std::str::from_utf8(name).ok()?, sessions, rest))
}

/// Reads an interface's private key.
fn read_key(source: &KeySource, base: &Path) -> Result<WgSecret, KeyFileError> {
    match source {
        KeySource::Inline(k) => Ok(k.clone()),
        KeySource::File(f) => {
            let path = gatehouse_plane::resolve(base, f);
            let text = zeroize::Zeroizing::new(
                std::fs::read_to_string(&path).map_err(|source| KeyFileError::Read { path: path.clone(), source })?,
            );
            gatehouse_config::decode_key(&text).map(WgSecret).ok_or(KeyFileError::NotAKey(path))
        }
    }
}

/// Why an interface's private key file could not be used.
#[derive(Debug, thiserror::Error)]
enum KeyFileError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: std::path::PathBuf, source: std::io::Error },
    #[error("{} does not hold a WireGuard key (32 bytes in base64)", .0.display())]
    NotAKey(std::path::PathBuf),
}

/// The config's interfaces with their keys read and checked.
fn settings(config: &Config, base: &Path) -> Result<Vec<Settings>, Vec<FieldError>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, w) in config.wireguard.iter().flat_map(|wg| &wg.interfaces).enumerate() {
        let at = |field: &str| format!("wireguard.interfaces[{i}].{field}");
        let secret = match read_key(&w.private_key, base) {
            Ok(k) => k,
            Err(e) => {
                let field =
                    if matches!(w.private_key, KeySource::File(_)) { "private_key_file" } else { "private_key" };
                errors.push(FieldError { path: at(field), message: e.to_string(), line: None });
                continue;
            }
        };
        let public = StaticSecret::from_bytes(*secret.0).public();
        for (j, p) in w.peers.iter().enumerate() {
            if p.public_key.0 == public {
                errors.push(FieldError {
                    path: at(&format!("peers[{j}].public_key")),
                    message: "is this interface's own public key".into(),
                    line: None,
                });
            }
        }
        out.push(Settings {
            name: w.name.clone(),
            secret,
            public,
            listen_port: w.listen_port,
            addresses: w.addresses.iter().map(|a| (a.addr, a.prefix)).collect::<Vec<(IpAddr, u8)>>(),
            mtu: w.mtu,
            fwmark: w.fwmark,
            routes: w.routes,
            peers: w.peers.clone(),
            router: (w.mode == gatehouse_config::WgMode::Router).then(|| w.router.clone()).flatten(),
        });
    }
    if errors.is_empty() { Ok(out) } else { Err(errors) }
}

struct StagedWg {
    plane: WireGuard,
    wanted: Vec<Settings>,
}

impl Staged for StagedWg {
    fn commit(self: Box<Self>) {
        if !self.plane.0.started.load(Ordering::Relaxed) {
            // A takeover: what the previous process handed over of these
            // interfaces, taken before the node closes what no plane took.
            self.plane.0.handover.take_inherited(&self.wanted);
        }
        if self.plane.0.started.load(Ordering::Relaxed)
            && let Err(e) = self.plane.reconcile(&self.wanted)
        {
            tracing::error!("{e}");
        }
        *self.plane.0.wanted.lock().unwrap_or_else(|e| e.into_inner()) = self.wanted;
    }
}

impl Plane for WireGuard {
    fn name(&self) -> &'static str {
        "wireguard"
    }

    fn prepare(&self, config: &Arc<Config>, cx: &Prepare<'_>) -> Result<Box<dyn Staged>, Vec<FieldError>> {
        let wanted = settings(config, cx.base_dir)?;
        Ok(Box::new(StagedWg { plane: self.clone(), wanted }))
    }

    /// Taking over, the interfaces are joined (a TUN interface takes more
    /// queues, the UDP port is shared with SO_REUSEPORT) but left paused:
    /// the previous process stops its own, hands its sessions over, and
    /// only then does this one serve them ([`Plane::took_over`]), so peers
    /// carry on without a handshake and no counter is used twice.
    fn start(&self, how: Start) -> Result<(), PlaneError> {
        self.0.started.store(true, Ordering::Relaxed);
        let wanted = self.0.wanted.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let r = self.reconcile_paused(&wanted, matches!(how, Start::TakingOver));
        // What no interface took goes: a program no process holds leaves
        // its NIC rather than steer to sockets nobody reads.
        self.0.handover.clear();
        r
    }

    fn hand_over_state(&self) -> Option<zeroize::Zeroizing<Vec<u8>>> {
        let all: Vec<Interface> = self.running().drain().map(|(_, i)| i).collect();
        if all.is_empty() {
            return None;
        }
        // Per interface: name length (u16), name, sessions length (u32),
        // sessions; in router mode then an entry named NAME/xsk whose
        // "sessions" are the frames its sockets held unused (an older
        // binary has no interface of that name and passes it by).
        let mut out = zeroize::Zeroizing::new(Vec::new());
        let mut entry = |name: &str, body: &[u8]| {
            out.extend_from_slice(&u16::try_from(name.len()).unwrap_or(0).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(0).to_le_bytes());
            out.extend_from_slice(body);
        };
        for i in all {
            let name = i.shared.name.clone();
            let (sessions, frames) = i.stop_and_export();
            entry(&name, &sessions);
            if !frames.is_empty() {
                entry(&format!("{name}{XSK_SUFFIX}"), &crate::router::handover::encode(&frames));
            }
            tracing::info!(interface = %name, "WireGuard interface stopped; its sessions go to the new process");
        }
        Some(out)
    }

    fn take_over_state(&self, state: &[u8]) {
        let running = self.running();
        let mut rest = state;
        while !rest.is_empty() {
            let Some((name, sessions, after)) = split_interface(rest) else {
                tracing::warn!(
                    "takeover: the WireGuard sessions handed over are malformed; peers will handshake again"
                );
                return;
            };
            rest = after;
            if let Some(iface) = name.strip_suffix(XSK_SUFFIX) {
                match (running.get(iface).and_then(|i| i.shared.router.as_ref()), handover::decode(sessions)) {
                    (Some(r), Some(frames)) => r.take_frames(frames),
                    (Some(_), None) => {
                        tracing::warn!(interface = %iface, "takeover: the AF_XDP frames handed over are malformed")
                    }
                    (None, _) => {}
                }
                continue;
            }
            let Some(i) = running.get(name) else { continue };
            match i.shared.device().import_sessions(sessions, std::time::Instant::now()) {
                Ok(n) => tracing::info!(interface = %name, keypairs = n, "WireGuard sessions taken over"),
                Err(e) => tracing::warn!(interface = %name, "takeover: {e}; peers will handshake again"),
            }
        }
    }

    /// A process that took the sockets over may have put its programs
    /// behind this one's links already: this one's go back.
    fn takeover_abandoned(&self) {
        for i in self.running().values() {
            if let Some(r) = &i.shared.router {
                r.reclaim();
            }
        }
    }

    fn took_over(&self) {
        for (name, i) in self.running().iter_mut() {
            if let Err(e) = i.resume() {
                tracing::error!(interface = %name, "{e}");
            }
        }
    }

    fn drain(&self) {
        let all: Vec<Interface> = self.running().drain().map(|(_, i)| i).collect();
        for i in all {
            i.stop();
        }
    }

    fn metrics(&self, out: &mut Exposition) {
        let running = self.running();
        let mut ifaces: Vec<&Interface> = running.values().collect();
        ifaces.sort_by(|a, b| a.shared.name.cmp(&b.shared.name));
        let peers: Vec<(String, Vec<PeerRow>)> = ifaces.iter().map(|i| (i.shared.name.clone(), peer_rows(i))).collect();
        type PeerSeries<'a> = (&'a str, &'a str, &'a str, fn(&PeerRow) -> u64);
        let series: [PeerSeries<'_>; 7] = [
            ("gatehouse_wg_peer_rx_bytes_total", "counter", "Transport bytes received from each peer.", |p| {
                p.stats.rx_bytes
            }),
            ("gatehouse_wg_peer_tx_bytes_total", "counter", "Transport bytes sent to each peer.", |p| p.stats.tx_bytes),
            ("gatehouse_wg_peer_rx_packets_total", "counter", "Transport datagrams received from each peer.", |p| {
                p.stats.rx_packets
            }),
            ("gatehouse_wg_peer_tx_packets_total", "counter", "Transport datagrams sent to each peer.", |p| {
                p.stats.tx_packets
            }),
            ("gatehouse_wg_peer_handshakes_total", "counter", "Handshakes completed with each peer.", |p| {
                p.stats.handshakes
            }),
            ("gatehouse_wg_peer_initiations_total", "counter", "Handshake initiations sent to each peer.", |p| {
                p.stats.initiations
            }),
            (
                "gatehouse_wg_peer_last_handshake_seconds",
                "gauge",
                "Unix time of each peer's last completed handshake (0: none yet).",
                |p| p.last_handshake,
            ),
        ];
        for (name, kind, help, f) in series {
            out.header(name, kind, help);
            for (iface, rows) in &peers {
                for p in rows {
                    out.sample(name, &[("interface", iface), ("peer", &p.name), ("public_key", &p.public_key)], f(p));
                }
            }
        }
        out.header(
            "gatehouse_wg_peer_handshake_failures_total",
            "counter",
            "Handshakes with each peer given up after 90 seconds of retries.",
        );
        for (iface, rows) in &peers {
            for p in rows {
                let labels = [("interface", iface.as_str()), ("peer", &p.name), ("public_key", &p.public_key)];
                out.sample("gatehouse_wg_peer_handshake_failures_total", &labels, p.stats.handshake_failures);
            }
        }
        out.header("gatehouse_wg_peer_drops_total", "counter", "What was dropped of each peer's, by reason.");
        for (iface, rows) in &peers {
            for p in rows {
                for (reason, n) in gatehouse_wg::device::PEER_DROP_NAMES.iter().zip(p.stats.drops) {
                    let labels = [
                        ("interface", iface.as_str()),
                        ("peer", &p.name),
                        ("public_key", &p.public_key),
                        ("reason", reason),
                    ];
                    out.sample("gatehouse_wg_peer_drops_total", &labels, n);
                }
            }
        }
        out.header(
            "gatehouse_wg_drops_total",
            "counter",
            "Datagrams and packets the WireGuard plane dropped, by reason.",
        );
        for i in &ifaces {
            for slot in 0..DROP_SLOTS {
                let n: u64 = i.shared.counters.iter().map(|c| c.drops[slot].load(Ordering::Relaxed)).sum();
                out.sample(
                    "gatehouse_wg_drops_total",
                    &[("interface", &i.shared.name), ("reason", DropReason::NAMES[slot])],
                    n,
                );
            }
        }
        type IfSeries<'a> = (&'a str, &'a str, fn(&crate::shared::Counters) -> u64);
        let per_iface: [IfSeries<'_>; 7] = [
            ("gatehouse_wg_rx_datagrams_total", "UDP datagrams received.", |c| c.rx_datagrams.load(Ordering::Relaxed)),
            ("gatehouse_wg_tx_datagrams_total", "UDP datagrams sent.", |c| c.tx_datagrams.load(Ordering::Relaxed)),
            ("gatehouse_wg_tun_rx_packets_total", "Packets read from the tunnel interface.", |c| {
                c.tun_rx_packets.load(Ordering::Relaxed)
            }),
            ("gatehouse_wg_tun_tx_packets_total", "Packets written to the tunnel interface.", |c| {
                c.tun_tx_packets.load(Ordering::Relaxed)
            }),
            ("gatehouse_wg_tx_errors_total", "Datagrams or packets the kernel refused.", |c| {
                c.tx_errors.load(Ordering::Relaxed)
            }),
            (
                "gatehouse_wg_tun_malformed_total",
                "Packets from the tunnel whose headers did not match their offload description.",
                |c| c.tun_malformed.load(Ordering::Relaxed),
            ),
            (
                "gatehouse_wg_handshake_queue_full_total",
                "Handshake messages dropped because the control thread's queue was full.",
                |c| c.handshake_queue_full.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, f) in per_iface {
            out.header(name, "counter", help);
            for i in &ifaces {
                out.sample(name, &[("interface", &i.shared.name)], i.shared.counters.iter().map(f).sum::<u64>());
            }
        }
        let routers: Vec<(&str, &crate::router::runtime::RouterShared)> =
            ifaces.iter().filter_map(|i| i.shared.router.as_ref().map(|r| (i.shared.name.as_str(), r))).collect();
        crate::router::runtime::metrics(&routers, out);
    }

    fn status(&self, out: &mut Map<String, Value>) {
        let running = self.running();
        let mut ifaces: Vec<&Interface> = running.values().collect();
        ifaces.sort_by(|a, b| a.shared.name.cmp(&b.shared.name));
        let list: Vec<Value> = ifaces
            .iter()
            .map(|i| {
                let s = i.shared.settings();
                let peers: Vec<Value> = peer_rows(i)
                    .into_iter()
                    .map(|p| {
                        json!({
                            "name": p.name,
                            "public_key": p.public_key,
                            "endpoint": p.endpoint,
                            "allowed_ips": p.allowed_ips,
                            "last_handshake": (p.last_handshake > 0).then_some(p.last_handshake),
                            "rx_bytes": p.stats.rx_bytes,
                            "tx_bytes": p.stats.tx_bytes,
                            "persistent_keepalive": p.keepalive,
                        })
                    })
                    .collect();
                json!({
                    "name": s.name,
                    "public_key": gatehouse_config::WgPublicKey(s.public).to_base64(),
                    "listen_port": s.listen_port,
                    "mtu": s.mtu,
                    "mode": if i.shared.router.is_some() { "router" } else { "tun" },
                    "router": i.shared.router.as_ref().map(|r| r.status()),
                    "peers": peers,
                    "warnings": forwarding_off(&s).iter().map(ForwardingOff::message).collect::<Vec<_>>(),
                })
            })
            .collect();
        if !list.is_empty() {
            out.insert("wireguard".into(), json!({ "interfaces": list }));
        }
    }

    fn health_targets(&self, _out: &mut Vec<HealthTarget>) {}
}

/// A peer as metrics and status show it.
struct PeerRow {
    name: String,
    public_key: String,
    endpoint: Option<String>,
    allowed_ips: Vec<String>,
    /// Unix seconds; 0 before the first.
    last_handshake: u64,
    keepalive: u16,
    stats: gatehouse_wg::device::PeerStats,
}

fn peer_rows(i: &Interface) -> Vec<PeerRow> {
    let meta = i.shared.meta().clone();
    let dev = i.shared.device();
    let mut rows: Vec<PeerRow> = dev
        .peer_ids()
        .filter_map(|id| dev.peer_info(id).map(|p| (id, p)))
        .map(|(id, p)| {
            let public_key = gatehouse_config::WgPublicKey(p.public).to_base64();
            PeerRow {
                name: meta.get(&id).map(|m| m.name.clone()).unwrap_or_else(|| public_key.chars().take(8).collect()),
                public_key,
                endpoint: p.endpoint.map(|e| e.to_string()),
                allowed_ips: p.allowed_ips.iter().map(|(a, l)| format!("{a}/{l}")).collect(),
                last_handshake: p.last_handshake.map_or(0, |d| d.as_secs()),
                keepalive: p.persistent_keepalive,
                stats: p.stats,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

#[cfg(test)]
mod tests {
    use super::split_interface;

    #[test]
    fn handed_over_state_splits_by_interface() {
        let mut b = Vec::new();
        for (name, sessions) in [("wg0", &b"abc"[..]), ("wg1", &b""[..])] {
            b.extend_from_slice(&(name.len() as u16).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
            b.extend_from_slice(&(sessions.len() as u32).to_le_bytes());
            b.extend_from_slice(sessions);
        }
        let (n, s, rest) = split_interface(&b).expect("first");
        assert_eq!((n, s), ("wg0", &b"abc"[..]));
        let (n, s, rest) = split_interface(rest).expect("second");
        assert_eq!((n, s, rest), ("wg1", &b""[..], &b""[..]));
        assert!(split_interface(&b[..b.len() - 1]).is_some(), "the first one stands alone");
        assert!(split_interface(&b[..8]).is_none(), "cut inside the sessions");
        assert!(split_interface(&[5, 0, b'w']).is_none(), "cut inside the name");
    }
}
