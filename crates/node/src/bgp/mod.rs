//! Route announcements: which VIPs this node asks the routers to send it,
//! through a BGP daemon that runs as its own service (BIRD 2, [`bird`]).
//!
//! Gatehouse speaks no BGP. It holds a TUN interface (`bgp.interface`)
//! whose addresses are exactly the VIPs to announce; the daemon's `direct`
//! protocol exports them, so adding or removing an address announces or
//! withdraws a route within milliseconds, and when the process dies the
//! kernel removes the interface and the daemon withdraws everything, with no
//! watchdog. The addresses there are not the host's (their local routes
//! are removed). The VIPs themselves are served from elsewhere (the L4
//! plane takes its packets before the kernel; an L7 listener's address is
//! the host's, on `lo`), so a withdrawn VIP is still served while the
//! routers converge.
//!
//! A VIP is announced while the node is fit (every plane ready), not
//! drained, and some plane serving it has a healthy backend. The neighbours
//! and route attributes go into the daemon's config through an include file
//! Gatehouse owns, read again by the daemon's `configure`.

pub mod bird;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use gatehouse_config::Bgp;
use gatehouse_link::{netlink, tun};
use gatehouse_plane::Vip;
use gatehouse_plane::metrics::Exposition;
use serde_json::{Value, json};

use self::bird::ProtocolState;

/// How long a process that took over keeps its predecessor's announcements
/// while its planes start, before health may withdraw them.
const TAKEOVER_GRACE: Duration = Duration::from_secs(5);

/// Why the node asks for no traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainReason {
    /// `POST /drain` on the admin API.
    Admin,
    /// SIGTERM or SIGINT: the process is stopping.
    Shutdown,
}

impl DrainReason {
    fn name(self) -> &'static str {
        match self {
            DrainReason::Admin => "admin",
            DrainReason::Shutdown => "shutdown",
        }
    }
}

/// The interface the announced addresses sit on, held open.
struct Holder {
    _queue: OwnedFd,
    index: u32,
    name: String,
}

/// A VIP as the announcer last saw it.
#[derive(Debug, Clone)]
struct VipView {
    address: IpAddr,
    healthy: bool,
    of: Vec<String>,
}

#[derive(Default)]
struct State {
    /// The running `bgp` section.
    cfg: Option<Bgp>,
    /// The include file's text BIRD last accepted, and the section it was
    /// written from.
    configured: Option<(String, Bgp)>,
    holder: Option<Holder>,
    /// Addresses on the interface now.
    announced: BTreeSet<IpAddr>,
    vips: Vec<VipView>,
    drained: Option<(DrainReason, SystemTime)>,
    /// Why the node is not fit to serve, when it is not.
    unfit: Option<String>,
    /// Until then, health withdraws nothing (after a takeover).
    grace_until: Option<Instant>,
    /// The process was taken over: the new one owns the announcements.
    retired: bool,
    sessions: Vec<ProtocolState>,
    daemon_up: bool,
    daemon_error: Option<String>,
    interface_error: Option<String>,
    announcements: u64,
    withdrawals: u64,
}

/// The node's announcer: fed the planes' VIPs by the control loop.
pub struct Announcer {
    state: Mutex<State>,
    /// The config file, named in the include file.
    source: PathBuf,
}

impl Announcer {
    pub fn new(source: &Path) -> Announcer {
        Announcer { state: Mutex::default(), source: source.to_path_buf() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the config has a `bgp` section.
    pub fn enabled(&self) -> bool {
        self.state().cfg.is_some()
    }

    /// Whether [`Announcer::sync_daemon`] has anything to do: a section to
    /// keep BIRD in step with, or one to take back from it.
    pub fn has_daemon_work(&self) -> bool {
        let s = self.state();
        !s.retired && (s.cfg.is_some() || s.configured.is_some())
    }

    /// A committed config's `bgp` section. The interface is (re)opened at
    /// once, so a start fails when it cannot be; the daemon is told at the
    /// next [`Announcer::sync_daemon`].
    pub fn configure(&self, cfg: Option<&Bgp>) -> std::io::Result<()> {
        let mut s = self.state();
        s.cfg = cfg.cloned();
        let want = cfg.map(|b| b.interface.as_str());
        if s.holder.as_ref().map(|h| h.name.as_str()) != want {
            // The old interface, its addresses and so its routes go.
            s.holder = None;
            s.announced.clear();
            if let Some(name) = want {
                let held = hold(name);
                s.interface_error = held.as_ref().err().map(|e| format!("interface {name}: {e}"));
                let h = held?;
                // A predecessor's announcements (takeover) are taken as ours.
                s.announced = netlink::addresses(h.index)?
                    .into_iter()
                    .filter(|(a, len)| u32::from(*len) == max_len(*a))
                    .map(|(a, _)| a)
                    .collect();
                s.holder = Some(h);
            }
        }
        Ok(())
    }

    /// This process took over from a running one: keep its announcements
    /// while the planes start.
    pub fn taking_over(&self) {
        self.state().grace_until = Some(Instant::now() + TAKEOVER_GRACE);
    }

    /// A new process has taken over: it owns the interface and the
    /// announcements now; this one changes nothing more.
    pub fn retire(&self) {
        self.state().retired = true;
    }

    /// Withdraws every VIP (and keeps serving), or with `None` announces
    /// them again by health. Returns whether there is a `bgp` section.
    pub fn drain(&self, reason: Option<DrainReason>) -> bool {
        let mut s = self.state();
        match reason {
            // A stop is never turned back into an admin drain.
            Some(r) if s.drained.is_none_or(|(was, _)| was != DrainReason::Shutdown) => {
                s.drained = Some((r, SystemTime::now()));
            }
            None if s.drained.is_some_and(|(r, _)| r == DrainReason::Admin) => s.drained = None,
            _ => {}
        }
        reconcile(&mut s);
        s.cfg.is_some()
    }

    /// The planes' VIPs now, and why the node is unfit (if it is): adds
    /// and removes the interface's addresses to match.
    pub fn update(&self, vips: Vec<Vip>, unfit: Option<String>) {
        let mut s = self.state();
        let mut views: Vec<VipView> = Vec::new();
        for v in vips {
            match views.iter_mut().find(|x| x.address == v.address) {
                Some(x) => {
                    x.healthy |= v.healthy;
                    x.of.push(v.of);
                }
                None => views.push(VipView { address: v.address, healthy: v.healthy, of: vec![v.of] }),
            }
        }
        s.vips = views;
        s.unfit = unfit;
        reconcile(&mut s);
    }

    /// Talks to the daemon (blocking, a few milliseconds; run it off the
    /// control loop): writes the include file and asks for `configure`
    /// when the section changed, then reads the sessions' states. When the
    /// section is gone, the file is emptied so BIRD closes the sessions.
    pub fn sync_daemon(&self) {
        let (cfg, was) = {
            let s = self.state();
            if s.retired {
                return;
            }
            (s.cfg.clone(), s.configured.as_ref().map(|(_, b)| b.clone()))
        };
        let Some(cfg) = cfg else {
            if let Some(old) = was {
                let text = format!("# Gatehouse announces nothing: {} has no bgp section.\n", self.source.display());
                match write_atomically(Path::new(&old.include), &text)
                    .map_err(|e| e.to_string())
                    .and_then(|()| bird::configure(&old.socket).map_err(|e| e.to_string()))
                {
                    Ok(()) => tracing::info!(file = %old.include, "bgp: section removed; BIRD's sessions closed"),
                    Err(e) => tracing::warn!("bgp: section removed, but BIRD was not told: {e}"),
                }
                let mut s = self.state();
                s.configured = None;
                s.sessions.clear();
            }
            return;
        };
        let text = bird::render(&cfg, &self.source);
        let mut error = None;
        if self.state().configured.as_ref().map(|(t, _)| t.as_str()) != Some(text.as_str()) {
            match write_atomically(Path::new(&cfg.include), &text) {
                Err(e) => error = Some(format!("cannot write {}: {e}", cfg.include)),
                Ok(()) => match bird::configure(&cfg.socket) {
                    Ok(()) => {
                        tracing::info!(file = %cfg.include, "bgp: BIRD read the neighbours and attributes");
                        self.state().configured = Some((text, cfg.clone()));
                    }
                    Err(e) => error = Some(e.to_string()),
                },
            }
        }
        let sessions = bird::protocols(&cfg.socket);
        let mut s = self.state();
        match sessions {
            Ok(rows) => {
                s.daemon_up = true;
                if error.is_none() && !rows.iter().any(|p| p.name == bird::VIPS_PROTOCOL) {
                    error = Some(format!(
                        "BIRD has no protocol {}: its config must include {:?}",
                        bird::VIPS_PROTOCOL,
                        cfg.include
                    ));
                }
                s.sessions = rows.into_iter().filter(|p| p.name.starts_with(bird::PREFIX)).collect();
            }
            Err(e) => {
                s.daemon_up = false;
                s.sessions.clear();
                error.get_or_insert(e.to_string());
            }
        }
        if error != s.daemon_error {
            match &error {
                Some(e) => tracing::warn!("bgp: {e}"),
                None => tracing::info!("bgp: BIRD answers"),
            }
            // Configure again next time, whatever failed (a BIRD that
            // restarted without the file, say).
            if error.is_some() {
                s.configured = None;
            }
        }
        s.daemon_error = error;
    }

    /// How long SIGTERM waits between withdrawing and stopping.
    pub fn drain_delay(&self) -> Option<Duration> {
        let s = self.state();
        s.cfg.as_ref().filter(|_| !s.announced.is_empty() && !s.retired).map(|b| b.drain_delay)
    }

    /// `/status`'s `bgp` section.
    pub fn status(&self) -> Option<Value> {
        let s = self.state();
        let b = s.cfg.as_ref()?;
        let vips: Vec<Value> = s
            .vips
            .iter()
            .map(|v| json!({"address": v.address.to_string(), "announced": s.announced.contains(&v.address), "healthy": v.healthy, "of": v.of}))
            .collect();
        let neighbors: Vec<Value> = b
            .neighbors
            .iter()
            .map(|n| {
                let name = format!("{}{}", bird::PREFIX, n.name);
                let row = s.sessions.iter().find(|p| p.name == name);
                json!({
                    "name": n.name,
                    "address": n.address.map(|a| a.to_string()),
                    "asn": n.asn,
                    "bfd": n.bfd,
                    "established": row.is_some_and(ProtocolState::established),
                    "state": row.map(|p| format!("{} {}", p.state, p.info).trim().to_string()),
                })
            })
            .collect();
        Some(json!({
            "daemon": "bird",
            "socket": b.socket,
            "daemon_up": s.daemon_up,
            "error": s.daemon_error.clone().or(s.interface_error.clone()),
            "interface": b.interface,
            "asn": b.asn,
            "drained": s.drained.map(|(r, at)| json!({"reason": r.name(), "since": crate::unix_seconds(at).floor()})),
            "unfit": s.unfit,
            "vips": vips,
            "neighbors": neighbors,
        }))
    }

    /// The announcer's series.
    pub fn metrics(&self, o: &mut Exposition) {
        let s = self.state();
        let Some(b) = &s.cfg else { return };
        o.header("gatehouse_bgp_announced", "gauge", "1 while the VIP is announced to the BGP daemon.");
        for v in &s.vips {
            let vip = v.address.to_string();
            o.sample("gatehouse_bgp_announced", &[("vip", &vip)], u8::from(s.announced.contains(&v.address)));
        }
        o.header("gatehouse_bgp_session_up", "gauge", "1 while the BGP session with the neighbor is established.");
        for n in &b.neighbors {
            let name = format!("{}{}", bird::PREFIX, n.name);
            let up = s.sessions.iter().any(|p| p.name == name && p.established());
            o.sample("gatehouse_bgp_session_up", &[("neighbor", &n.name)], u8::from(up));
        }
        o.header("gatehouse_bgp_daemon_up", "gauge", "1 while the BGP daemon answers on its control socket.");
        o.sample("gatehouse_bgp_daemon_up", &[], u8::from(s.daemon_up));
        o.header("gatehouse_bgp_drained", "gauge", "1 while the node withdraws its VIPs on purpose (drain).");
        o.sample("gatehouse_bgp_drained", &[], u8::from(s.drained.is_some()));
        o.header("gatehouse_bgp_announcements_total", "counter", "VIPs announced.");
        o.sample("gatehouse_bgp_announcements_total", &[], s.announcements);
        o.header("gatehouse_bgp_withdrawals_total", "counter", "VIPs withdrawn.");
        o.sample("gatehouse_bgp_withdrawals_total", &[], s.withdrawals);
    }
}

/// What should be announced now: nothing while drained or unfit; else
/// every VIP with a healthy backend, and during a takeover's grace also
/// what the predecessor announced.
fn wanted(s: &State, now: Instant) -> BTreeSet<IpAddr> {
    let grace = s.grace_until.is_some_and(|t| now < t);
    let serving = s.drained.is_none() && s.unfit.is_none();
    s.vips
        .iter()
        .filter(|v| serving && (v.healthy || (grace && s.announced.contains(&v.address))))
        .map(|v| v.address)
        .collect()
}

/// Adds and removes the interface's addresses to match what the state
/// says should be announced.
fn reconcile(s: &mut State) {
    if s.retired || s.cfg.is_none() {
        return;
    }
    let Some(index) = s.holder.as_ref().map(|h| h.index) else { return };
    let want = wanted(s, Instant::now());
    let gone: Vec<IpAddr> = s.announced.difference(&want).copied().collect();
    let new: Vec<IpAddr> = want.difference(&s.announced).copied().collect();
    for a in gone {
        match netlink::del_address(index, a, max_len(a) as u8) {
            Ok(()) => {
                s.announced.remove(&a);
                s.withdrawals += 1;
                tracing::info!(vip = %a, "bgp: withdrawn");
            }
            Err(e) => tracing::warn!(vip = %a, "bgp: cannot withdraw: {e}"),
        }
    }
    for a in new {
        // The address is for the daemon only: without its local route
        // the host neither answers ARP for the VIP on its other links
        // nor takes its packets in the kernel (where a dying process's
        // port would answer a moved flow with a reset).
        let added = netlink::add_address(index, a, max_len(a) as u8).and_then(|()| netlink::del_local_route(index, a));
        match added {
            Ok(()) => {
                s.announced.insert(a);
                s.announcements += 1;
                tracing::info!(vip = %a, "bgp: announced");
            }
            Err(e) => tracing::warn!(vip = %a, "bgp: cannot announce: {e}"),
        }
    }
}

/// The prefix length of a single address.
fn max_len(a: IpAddr) -> u32 {
    if a.is_ipv4() { 32 } else { 128 }
}

/// Opens (or joins) the TUN interface `name` and brings it up.
fn hold(name: &str) -> std::io::Result<Holder> {
    let queue = tun::open(name, tun::Kind::Holder)?;
    let index = netlink::ifindex(name)?;
    netlink::link_up(index, 1500)?;
    Ok(Holder { _queue: queue, index, name: name.to_string() })
}

/// Writes `text` to `path` through a temporary file and a rename, so the
/// daemon never reads half a file.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vip(a: [u8; 4], healthy: bool, of: &str) -> Vip {
        Vip { address: IpAddr::from(a), healthy, of: of.into() }
    }

    /// An announcer with a section but no interface: it decides, and
    /// touches nothing.
    fn announcer() -> Announcer {
        let a = Announcer::new(Path::new("/etc/gatehouse.yaml"));
        a.state().cfg = Some(Bgp::default());
        a
    }

    fn wanted_now(a: &Announcer) -> Vec<IpAddr> {
        wanted(&a.state(), Instant::now()).into_iter().collect()
    }

    #[test]
    fn a_vip_is_wanted_while_one_of_its_servers_can_serve_it() {
        let a = announcer();
        let (web, dns) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        a.update(
            vec![
                vip([192, 0, 2, 1], false, "l4 service web"),
                vip([192, 0, 2, 1], true, "listener web"),
                vip([192, 0, 2, 2], false, "l4 service dns"),
            ],
            None,
        );
        assert_eq!(wanted_now(&a), [web]);
        let st = a.status().expect("status");
        assert_eq!(st["vips"][0]["of"], serde_json::json!(["l4 service web", "listener web"]));
        assert_eq!(st["vips"][1]["healthy"], false);
        // Unfit: nothing.
        a.update(
            vec![vip([192, 0, 2, 1], true, "listener web"), vip([192, 0, 2, 2], true, "l4 service dns")],
            Some("the L4 plane is not running".into()),
        );
        assert!(wanted_now(&a).is_empty());
        a.update(vec![vip([192, 0, 2, 1], true, "listener web"), vip([192, 0, 2, 2], true, "l4 service dns")], None);
        assert_eq!(wanted_now(&a), [web, dns]);
    }

    #[test]
    fn a_drain_withdraws_everything_and_a_stop_is_never_undone() {
        let a = announcer();
        a.update(vec![vip([192, 0, 2, 1], true, "listener web")], None);
        assert!(a.drain(Some(DrainReason::Admin)));
        assert!(wanted_now(&a).is_empty());
        assert_eq!(a.status().expect("status")["vips"][0]["of"], serde_json::json!(["listener web"]));
        assert!(a.drain(None));
        assert_eq!(wanted_now(&a).len(), 1);
        a.drain(Some(DrainReason::Shutdown));
        // DELETE /drain during a stop, or another POST, changes nothing.
        a.drain(None);
        a.drain(Some(DrainReason::Admin));
        assert!(wanted_now(&a).is_empty());
        assert_eq!(a.status().expect("status")["drained"]["reason"], "shutdown");
        assert!(!Announcer::new(Path::new("x")).drain(Some(DrainReason::Admin)), "no bgp section");
    }

    #[test]
    fn a_takeover_keeps_its_predecessors_announcements_for_the_grace_only() {
        let a = announcer();
        let web = IpAddr::from([192, 0, 2, 1]);
        a.taking_over();
        a.state().announced.insert(web);
        // Its planes are not serving yet: the VIP looks unhealthy.
        a.update(vec![vip([192, 0, 2, 1], false, "l4 service web")], None);
        assert_eq!(wanted_now(&a), [web]);
        let later = Instant::now() + TAKEOVER_GRACE + Duration::from_millis(1);
        assert!(wanted(&a.state(), later).is_empty());
        // A drain wins even in the grace.
        a.drain(Some(DrainReason::Admin));
        assert!(wanted_now(&a).is_empty());
    }
}
