//! The userspace API socket, `/var/run/wireguard/IFNAME.sock`, where
//! `wg show`, `wg set` and `wg syncconf` find userspace implementations.
//! Changes made here last until the next reload of the config, which is
//! where peers are kept.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use gatehouse_wg::uapi::{self, Change, PeerStatus, Request, Status, UapiError};

use crate::shared::{PeerMeta, Shared};

/// Where wireguard-tools look for a userspace interface's socket.
pub const SOCKET_DIR: &str = "/var/run/wireguard";

fn path(name: &str) -> PathBuf {
    PathBuf::from(SOCKET_DIR).join(format!("{name}.sock"))
}

/// Removes the interface's socket file.
pub fn remove(name: &str) {
    let _ = std::fs::remove_file(path(name));
}

/// Binds the socket (taking over a stale one) and serves it on a thread.
pub fn listen(sh: Arc<Shared>) -> std::io::Result<JoinHandle<()>> {
    std::fs::create_dir_all(SOCKET_DIR)?;
    let p = path(&sh.name);
    if p.exists() {
        if UnixStream::connect(&p).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is served already", p.display()),
            ));
        }
        std::fs::remove_file(&p)?;
    }
    let listener = UnixListener::bind(&p)?;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name(format!("wg-{}-uapi", sh.name)).spawn(move || {
        // Woken by a client or by `stop`, which joins this thread before a
        // takeover's new process may serve: a sleep between accepts held
        // the handover up to 50 ms, while the old process's socket took
        // datagrams that its close then dropped.
        let Some(wake) = sh.wake.last().map(AsRawFd::as_raw_fd) else { return };
        let fds = [listener.as_raw_fd(), wake];
        let mut ready = [false; 2];
        while !sh.stop.load(Ordering::Relaxed) {
            if let Err(e) = gatehouse_udp::poll_readable(&fds, 1000, &mut ready) {
                tracing::warn!(interface = %sh.name, "uapi poll: {e}");
                return;
            }
            if !ready[0] {
                continue;
            }
            match listener.accept() {
                Ok((conn, _)) => {
                    if let Err(e) = serve(&sh, conn) {
                        tracing::debug!(interface = %sh.name, "uapi connection: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    tracing::warn!(interface = %sh.name, "uapi accept: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    })
}

/// Answers requests on one connection until it closes.
fn serve(sh: &Shared, conn: UnixStream) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut writer = conn.try_clone()?;
    let mut reader = BufReader::new(conn);
    loop {
        let mut request = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\n" {
                break;
            }
            request.push_str(&line);
            if request.len() > 1 << 20 {
                writer.write_all(uapi::render_errno(uapi::EINVAL).as_bytes())?;
                return Ok(());
            }
        }
        let answer = match uapi::parse_request(&request) {
            Ok(Request::Get) => uapi::render_status(&status(sh)),
            Ok(Request::Set(change)) => match apply(sh, change) {
                Ok(()) => uapi::render_errno(0),
                Err(e) => {
                    tracing::warn!(interface = %sh.name, "wg set refused: {}", e.message);
                    uapi::render_errno(e.errno)
                }
            },
            Err(e) => {
                tracing::warn!(interface = %sh.name, "uapi request refused: {}", e.message);
                uapi::render_errno(e.errno)
            }
        };
        writer.write_all(answer.as_bytes())?;
    }
}

fn status(sh: &Shared) -> Status {
    let settings = sh.settings().clone();
    let dev = sh.device();
    let peers = dev
        .peer_ids()
        .filter_map(|id| dev.peer_info(id))
        .map(|p| PeerStatus {
            public_key: p.public,
            preshared_key: p.psk,
            endpoint: p.endpoint,
            last_handshake: p.last_handshake,
            tx_bytes: p.stats.tx_bytes,
            rx_bytes: p.stats.rx_bytes,
            persistent_keepalive: p.persistent_keepalive,
            allowed_ips: p.allowed_ips,
        })
        .collect();
    Status { private_key: Some(*settings.secret.0), listen_port: settings.listen_port, fwmark: settings.fwmark, peers }
}

const EPERM: i32 = 1;

fn refused(message: impl Into<String>) -> UapiError {
    UapiError { errno: EPERM, message: message.into() }
}

/// Applies a `set=1`. What the config owns (key, port, mark) may be
/// restated but not changed here.
fn apply(sh: &Shared, change: Change) -> Result<(), UapiError> {
    {
        let s = sh.settings();
        if change.private_key.is_some_and(|k| k != Some(*s.secret.0)) {
            return Err(refused("the private key comes from the config file"));
        }
        if change.listen_port.is_some_and(|p| p != s.listen_port) {
            return Err(refused("the listen port comes from the config file"));
        }
        if change.fwmark.is_some_and(|m| m != s.fwmark) {
            return Err(refused("the fwmark comes from the config file"));
        }
    }
    let mut dev = sh.device();
    let mut meta = sh.meta();
    if change.replace_peers {
        let keep: Vec<[u8; 32]> = change.peers.iter().filter(|p| !p.remove).map(|p| p.public_key).collect();
        let ids: Vec<_> = dev.peer_ids().collect();
        for id in ids {
            if dev.peer_info(id).is_some_and(|p| !keep.contains(&p.public)) {
                dev.remove_peer(id);
                meta.remove(&id);
            }
        }
    }
    for p in change.peers {
        let existing = dev.peer_by_key(&p.public_key);
        if p.remove {
            if let Some(id) = existing {
                dev.remove_peer(id);
                meta.remove(&id);
            }
            continue;
        }
        let id = match existing {
            Some(id) => id,
            None if p.update_only => continue,
            None => {
                let id = dev
                    .add_peer(p.public_key, None, None, None, &[])
                    .map_err(|e| UapiError { errno: uapi::EINVAL, message: format!("{e:?}") })?;
                let name = gatehouse_config::WgPublicKey(p.public_key).to_base64().chars().take(8).collect();
                meta.insert(id, PeerMeta { name, endpoint: None, last_resolved: None });
                id
            }
        };
        if let Some(psk) = p.preshared_key {
            dev.set_psk(id, psk);
        }
        if let Some(e) = p.endpoint {
            dev.set_endpoint(id, e);
        }
        if let Some(k) = p.persistent_keepalive {
            dev.set_persistent_keepalive(id, Some(k));
        }
        dev.set_allowed_ips(id, p.replace_allowed_ips, &p.allowed_ips)
            .map_err(|e| UapiError { errno: uapi::EINVAL, message: format!("{e:?}") })?;
    }
    Ok(())
}
