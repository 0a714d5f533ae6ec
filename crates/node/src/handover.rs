//! Binary upgrade without refusing a connection: the new process takes the
//! running one's listening sockets over a Unix socket (SCM_RIGHTS), as
//! HAProxy (`-x`) and Envoy (hot restart) do.
//!
//! Every running Gatehouse serves `DATA_DIR/gatehouse.sock`. A new one started
//! with `--takeover` connects there, sends `TAKEOVER`, and receives every
//! listening socket (each worker's, and the admin listener's) and the L4
//! plane's XDP links and AF_XDP sockets with a JSON header naming them. Both processes now accept from the same kernel
//! queues. Once its workers are accepting, the new process sends `READY`;
//! the old one stops accepting, lets its connections finish (the SIGTERM
//! drain) and exits. No queue is ever closed while connections wait in it.
//!
//! The descriptors arrive as raw numbers; turning them into owned sockets is
//! the one `unsafe` step, in [`fds`].

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gatehouse_plane::listeners::{Inherited, Registry, XdpHandover, XdpSocket};
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

/// The most descriptors sent in one message (the kernel allows 253).
const MAX_FDS: usize = 250;

/// The control socket's name inside the data directory.
pub const SOCKET_NAME: &str = "gatehouse.sock";

#[derive(Serialize, Deserialize)]
struct Entry {
    /// Listener name; empty for the admin listener.
    name: String,
    addr: SocketAddr,
    worker: usize,
    /// What the descriptor is (a listening TCP socket when absent, as an
    /// older binary sends).
    #[serde(default)]
    kind: Kind,
}

#[derive(Serialize, Deserialize, Default, Clone, Copy, PartialEq, Debug)]
#[serde(rename_all = "lowercase")]
enum Kind {
    #[default]
    Tcp,
    /// A worker's UDP socket of an HTTP/3 listener.
    Udp,
    /// The Unix datagram socket on which to forward the old process's
    /// QUIC datagrams of that listener.
    Forward,
}

#[derive(Serialize, Deserialize)]
struct Header {
    sockets: Vec<Entry>,
    /// The interfaces whose XDP links follow the sockets' descriptors, in
    /// order, then the AF_XDP sockets (interface, queue, UMEM frames, ring
    /// entries), each as two descriptors: the socket and its UMEM. A binary
    /// that does not know them ignores the fields and closes the
    /// descriptors it did not expect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    xdp_links: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    xdp_sockets: Vec<(String, u32, u32, u32)>,
    /// Each link's mode (true: native), in `xdp_links`' order; older
    /// binaries do not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    xdp_native: Vec<Option<bool>>,
    /// Then the planes' own descriptors: a key and how many, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    plane_fds: Vec<(String, usize)>,
}

/// Where a config's control socket lives.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET_NAME)
}

fn io_err(e: nix::Error) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// Why a takeover failed: at which step, and what went wrong there.
#[derive(Debug)]
pub struct TakeoverError {
    pub socket: PathBuf,
    pub step: &'static str,
    pub cause: String,
}

impl std::fmt::Display for TakeoverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "takeover via {}: {}: {}", self.socket.display(), self.step, self.cause)
    }
}

impl std::error::Error for TakeoverError {}

/// The new process's side: asks the running one for its sockets. Returns
/// them and the connection on which to say `READY`.
pub fn take_over(path: &Path) -> Result<(Inherited, UnixStream), TakeoverError> {
    let fail = |step: &'static str, e: &dyn std::fmt::Display| TakeoverError {
        socket: path.to_path_buf(),
        step,
        cause: e.to_string(),
    };
    let mut s = UnixStream::connect(path).map_err(|e| fail("no running Gatehouse answers", &e))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| fail("socket", &e))?;
    s.write_all(b"TAKEOVER\n").map_err(|e| fail("send", &e))?;

    let mut buf = vec![0u8; 64 * 1024];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (got, fds) = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(|e| fail("receive", &io_err(e)))?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(|e| fail("receive", &io_err(e)))? {
            if let ControlMessageOwned::ScmRights(r) = c {
                fds.extend(r);
            }
        }
        (msg.bytes, fds)
    };
    // Own the descriptors at once, so that any error below closes them.
    let mut sockets = fds::own(fds).into_iter();
    if got < 4 {
        return Err(fail("answer", &"too short"));
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > buf.len() - 4 {
        return Err(fail("answer", &"header too long"));
    }
    let mut have = got - 4;
    while have < len {
        let n = s.read(&mut buf[4 + have..4 + len]).map_err(|e| fail("receive", &e))?;
        if n == 0 {
            return Err(fail("answer", &"closed early"));
        }
        have += n;
    }
    let header: Header = serde_json::from_slice(&buf[4..4 + len]).map_err(|e| fail("header", &e))?;
    let mut inherited = Inherited::default();
    for entry in header.sockets {
        let Some(fd) = sockets.next() else { return Err(fail("answer", &"fewer sockets than named")) };
        match entry.kind {
            Kind::Tcp => {
                let socket = TcpListener::from(fd);
                socket.set_nonblocking(true).map_err(|e| fail("socket", &e))?;
                if entry.name.is_empty() {
                    inherited.set_admin(entry.addr, socket);
                } else {
                    inherited.insert(entry.name, entry.addr, entry.worker, socket);
                }
            }
            Kind::Udp => {
                let socket = std::net::UdpSocket::from(fd);
                socket.set_nonblocking(true).map_err(|e| fail("socket", &e))?;
                inherited.insert_udp(entry.name, entry.addr, entry.worker, socket);
            }
            Kind::Forward => {
                let socket = std::os::unix::net::UnixDatagram::from(fd);
                socket.set_nonblocking(true).map_err(|e| fail("socket", &e))?;
                inherited.insert_forward(entry.name, entry.addr, socket);
            }
        }
    }
    let mut xdp = std::collections::HashMap::new();
    for (k, interface) in header.xdp_links.into_iter().enumerate() {
        let Some(link) = sockets.next() else { return Err(fail("answer", &"fewer XDP links than named")) };
        let native = header.xdp_native.get(k).copied().flatten();
        xdp.insert(interface, XdpHandover { link, native, sockets: Vec::new() });
    }
    for (interface, queue, frames, ring) in header.xdp_sockets {
        let (Some(socket), Some(umem)) = (sockets.next(), sockets.next()) else {
            return Err(fail("answer", &"fewer AF_XDP sockets than named"));
        };
        match xdp.get_mut(&interface) {
            Some(x) => x.sockets.push(XdpSocket { queue, socket, umem, frames, ring }),
            None => return Err(fail("answer", &"an AF_XDP socket of an interface without a link")),
        }
    }
    for (interface, x) in xdp {
        inherited.insert_xdp(interface, x);
    }
    for (key, n) in header.plane_fds {
        let fds: Vec<OwnedFd> = sockets.by_ref().take(n).collect();
        if fds.len() != n {
            return Err(fail("answer", &"fewer plane descriptors than named"));
        }
        inherited.insert_fds(key, fds);
    }
    Ok((inherited, s))
}

/// Tells the old process the new one is accepting; returns the connection,
/// on which the old process then sends its planes' state.
pub fn ready(mut s: UnixStream) -> std::io::Result<UnixStream> {
    s.write_all(b"READY\n")?;
    Ok(s)
}

/// The most bytes of state one plane may hand over.
const MAX_STATE: usize = 64 << 20;

/// After `READY`: what each plane of the old process hands over, as
/// `STATE NAME LEN` lines each followed by LEN bytes, up to `END`. Waits at
/// most `wait` in all; a previous process that sends nothing (an older
/// binary) or stops halfway yields what came complete.
pub fn receive_states(s: UnixStream, wait: Duration) -> Vec<(String, zeroize::Zeroizing<Vec<u8>>)> {
    let deadline = std::time::Instant::now() + wait;
    let mut states = Vec::new();
    let mut r = std::io::BufReader::new(s);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || r.get_ref().set_read_timeout(Some(left)).is_err() {
            tracing::warn!("takeover: the previous process's state did not all come in time");
            return states;
        }
        let mut line = String::new();
        match std::io::BufRead::read_line(&mut r, &mut line) {
            Ok(0) | Err(_) => return states,
            Ok(_) => {}
        }
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next().and_then(|n| n.parse::<usize>().ok())) {
            (Some("END"), None, None) => return states,
            (Some("STATE"), Some(name), Some(len)) if len <= MAX_STATE => {
                let mut bytes = zeroize::Zeroizing::new(vec![0u8; len]);
                if r.read_exact(&mut bytes).is_err() {
                    tracing::warn!(plane = name, "takeover: the previous process's state was cut short");
                    return states;
                }
                states.push((name.to_string(), bytes));
            }
            _ => {
                tracing::warn!("takeover: unexpected line from the previous process: {:?}", line.trim());
                return states;
            }
        }
    }
}

/// The old process's side of [`receive_states`]: each plane's state, then
/// `END`.
pub async fn send_states(
    lines: &mut tokio::io::BufReader<tokio::net::UnixStream>,
    states: Vec<(&str, zeroize::Zeroizing<Vec<u8>>)>,
) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let s = lines.get_mut();
    for (name, bytes) in states {
        s.write_all(format!("STATE {name} {}\n", bytes.len()).as_bytes()).await?;
        s.write_all(&bytes).await?;
    }
    s.write_all(b"END\n").await?;
    s.flush().await
}

/// Asks the process serving the control socket at `path` for its
/// active/standby role (`HA` on the socket): a process taking over starts
/// in the role of the one it replaces. None if it has none or cannot say.
pub fn query_role(path: &Path) -> Option<gatehouse_config::HaRole> {
    let mut s = UnixStream::connect(path).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2))).ok()?;
    s.write_all(b"HA\n").ok()?;
    let mut answer = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(s), &mut answer).ok()?;
    gatehouse_config::HaRole::parse(answer.trim().strip_prefix("OK ")?)
}

/// The old process's side of one takeover, once `TAKEOVER` was read from
/// `lines`: sends the sockets, then waits for `READY`. Returns the
/// connection when the new process took over (for [`send_states`]).
pub async fn hand_over(
    mut lines: tokio::io::BufReader<tokio::net::UnixStream>,
    registry: &std::sync::Mutex<Registry>,
    admin: Option<(SocketAddr, &TcpListener)>,
) -> std::io::Result<Option<tokio::io::BufReader<tokio::net::UnixStream>>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut line = String::new();
    // Duplicates, so the registry's lock is not held while sending.
    let mut entries = Vec::new();
    let mut sockets: Vec<OwnedFd> = Vec::new();
    let (tcp, quic, links, planes) = {
        let r = registry.lock().unwrap_or_else(|e| e.into_inner());
        (r.duplicates()?, r.quic_duplicates()?, r.xdp_duplicates()?, r.fds_duplicates()?)
    };
    for ((name, addr, worker), s) in tcp {
        entries.push(Entry { name, addr, worker, kind: Kind::Tcp });
        sockets.push(s.into());
    }
    if let Some((addr, l)) = admin {
        entries.push(Entry { name: String::new(), addr, worker: 0, kind: Kind::Tcp });
        sockets.push(l.try_clone()?.into());
    }
    // QUIC: each worker's UDP socket, and a socket pair per listener on
    // which the new process forwards the datagrams of our connections.
    let mut forwards = Vec::new();
    for q in quic {
        for (worker, s) in q.sockets {
            entries.push(Entry { name: q.name.clone(), addr: q.addr, worker, kind: Kind::Udp });
            sockets.push(s.into());
        }
        let (keep, give) = std::os::unix::net::UnixDatagram::pair()?;
        entries.push(Entry { name: q.name, addr: q.addr, worker: 0, kind: Kind::Forward });
        sockets.push(give.into());
        forwards.push((keep, q.handover));
    }
    // The XDP links and sockets last: a binary that does not know them
    // drops them.
    let (mut xdp_links, mut xdp_sockets, mut xdp_native, mut xsks) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (interface, x) in links {
        xdp_links.push(interface.clone());
        xdp_native.push(x.native);
        sockets.push(x.link);
        for s in x.sockets {
            xdp_sockets.push((interface.clone(), s.queue, s.frames, s.ring));
            xsks.extend([s.socket, s.umem]);
        }
    }
    sockets.extend(xsks);
    // The planes' own descriptors last of all.
    let mut plane_fds = Vec::new();
    for (key, fds) in planes {
        plane_fds.push((key, fds.len()));
        sockets.extend(fds);
    }
    if sockets.len() > MAX_FDS {
        return Err(std::io::Error::other(format!(
            "{} listening sockets: more than {MAX_FDS} cannot be handed over",
            sockets.len()
        )));
    }
    let fds: Vec<RawFd> = sockets.iter().map(AsRawFd::as_raw_fd).collect();
    let json = serde_json::to_vec(&Header { sockets: entries, xdp_links, xdp_sockets, xdp_native, plane_fds })
        .map_err(std::io::Error::other)?;
    let mut header = u32::try_from(json.len()).map_err(std::io::Error::other)?.to_le_bytes().to_vec();
    header.extend_from_slice(&json);
    // The descriptors ride on the first bytes; the rest of a long header follows.
    let sent = loop {
        let stream = lines.get_ref();
        stream.writable().await?;
        let r = stream.try_io(tokio::io::Interest::WRITABLE, || {
            sendmsg::<()>(
                stream.as_raw_fd(),
                &[IoSlice::new(&header)],
                &[ControlMessage::ScmRights(&fds)],
                MsgFlags::empty(),
                None,
            )
            .map_err(io_err)
        });
        match r {
            Ok(n) => break n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    drop(sockets);
    lines.get_mut().write_all(&header[sent..]).await?;
    // Forwarded datagrams may come as soon as the new process serves.
    let mut readers = Vec::new();
    for (keep, handover) in &forwards {
        keep.set_nonblocking(true)?;
        let socket = tokio::net::UnixDatagram::from_std(keep.try_clone()?)?;
        let handover = handover.clone();
        readers.push(tokio::spawn(async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok(n) = socket.recv(&mut buf).await {
                handover.forwarded(&buf[..n]);
            }
        }));
    }
    line.clear();
    lines.read_line(&mut line).await?;
    if line.trim() != "READY" {
        readers.iter().for_each(tokio::task::JoinHandle::abort);
        return Ok(None);
    }
    for (_, handover) in &forwards {
        handover.handed_over();
    }
    Ok(Some(lines))
}

/// Turning received descriptor numbers into owned sockets.
#[allow(unsafe_code)]
mod fds {
    use std::os::fd::{FromRawFd, OwnedFd, RawFd};

    /// Owns descriptors the kernel just installed in this process.
    pub(super) fn own(fds: Vec<RawFd>) -> Vec<OwnedFd> {
        fds.into_iter()
            .map(|fd| {
                // SAFETY: `fd` came in an SCM_RIGHTS message just received:
                // the kernel installed it in our table for us, it is open,
                // and nothing else in this process knows or owns it.
                unsafe { OwnedFd::from_raw_fd(fd) }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    #[derive(Default)]
    struct Recorder {
        got: std::sync::Mutex<Vec<Vec<u8>>>,
        handed: AtomicBool,
    }

    impl gatehouse_plane::listeners::QuicHandover for Recorder {
        fn forwarded(&self, message: &[u8]) {
            self.got.lock().expect("lock").push(message.to_vec());
        }
        fn handed_over(&self) {
            self.handed.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[test]
    fn sockets_cross_to_the_taking_process_with_their_names() {
        let dir = std::env::temp_dir().join(format!("gh-handover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = socket_path(&dir);
        let _ = std::fs::remove_file(&path);
        let web = TcpListener::bind("127.0.0.1:0").expect("bind");
        let admin = TcpListener::bind("127.0.0.1:0").expect("bind");
        let (web_addr, admin_addr) = (web.local_addr().expect("addr"), admin.local_addr().expect("addr"));
        let registry = std::sync::Mutex::new(Registry::default());
        registry.lock().expect("lock").add("web", web_addr, 1, &web).expect("dup");
        // An HTTP/3 listener: two workers' UDP sockets and its handover.
        let udp = [
            std::net::UdpSocket::bind("127.0.0.1:0").expect("udp"),
            std::net::UdpSocket::bind("127.0.0.1:0").expect("udp"),
        ];
        let h3_addr = udp[0].local_addr().expect("addr");
        let quic = Arc::new(Recorder::default());
        registry.lock().expect("lock").add_quic("h3", h3_addr, &[&udp[0], &udp[1]], quic.clone()).expect("dup");
        // An L4 interface's XDP link (any descriptor crosses the same way:
        // here one end of a socket pair, to show it is the same object).
        let (link, far_end) = std::os::unix::net::UnixDatagram::pair().expect("pair");
        let (xsk, xsk_far_end) = std::os::unix::net::UnixDatagram::pair().expect("pair");
        let (umem, umem_far_end) = std::os::unix::net::UnixDatagram::pair().expect("pair");
        let xdp = XdpHandover {
            link: std::os::fd::OwnedFd::from(link.try_clone().expect("dup")),
            native: Some(true),
            sockets: vec![XdpSocket {
                queue: 3,
                socket: std::os::fd::OwnedFd::from(xsk),
                umem: std::os::fd::OwnedFd::from(umem),
                frames: 4096,
                ring: 2048,
            }],
        };
        registry.lock().expect("lock").add_xdp("lb0", xdp);
        // A plane's own descriptors (a WireGuard interface's two workers'
        // sockets), after everything else.
        let (wg0, wg0_far) = std::os::unix::net::UnixDatagram::pair().expect("pair");
        let (wg1, wg1_far) = std::os::unix::net::UnixDatagram::pair().expect("pair");
        registry.lock().expect("lock").add_fds("wireguard/wg0/udp", vec![wg0.into(), wg1.into()]);

        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let listener = rt.block_on(async { tokio::net::UnixListener::bind(&path) }).expect("unix bind");
        let taker = {
            let path = path.clone();
            std::thread::spawn(move || {
                let (mut inherited, stream) = take_over(&path).expect("take over");
                let got = inherited.take("web", web_addr, 1).expect("the web socket");
                assert!(inherited.take("web", web_addr, 0).is_none());
                let got_admin = inherited.take_admin(admin_addr).expect("the admin socket");
                let got_udp = inherited.take_udp("h3", h3_addr, 1).expect("worker 1's UDP socket");
                assert!(inherited.take_udp("h3", h3_addr, 0).is_some());
                let forward = inherited.take_forward("h3", h3_addr).expect("the forwarding socket");
                let mut lb0 = inherited.take_xdp("lb0").expect("lb0's XDP state");
                assert!(inherited.take_xdp("lb0").is_none(), "taken once");
                assert_eq!(lb0.native, Some(true));
                let link = std::os::unix::net::UnixDatagram::from(lb0.link);
                link.send(b"the same link").expect("send");
                let q3 = lb0.sockets.pop().expect("queue 3's socket");
                assert_eq!((q3.queue, q3.frames, q3.ring, lb0.sockets.len()), (3, 4096, 2048, 0));
                std::os::unix::net::UnixDatagram::from(q3.socket).send(b"queue 3").expect("send");
                std::os::unix::net::UnixDatagram::from(q3.umem).send(b"its umem").expect("send");
                let wg = inherited.take_fds("wireguard/wg0/udp").expect("the plane's descriptors");
                assert!(inherited.take_fds("wireguard/wg0/udp").is_none(), "taken once");
                for (fd, text) in wg.into_iter().zip([&b"worker 0"[..], b"worker 1"]) {
                    std::os::unix::net::UnixDatagram::from(fd).send(text).expect("send");
                }
                assert_eq!(inherited.leftover(), 0);
                assert_eq!(got_udp.local_addr().expect("addr"), udp[1].local_addr().expect("addr"));
                forward.send(b"a datagram of yours").expect("forward");
                let stream = ready(stream).expect("ready");
                let states = receive_states(stream, Duration::from_secs(5));
                (got, got_admin, states)
            })
        };
        let took = rt.block_on(async {
            use tokio::io::AsyncBufReadExt;
            let (stream, _) = listener.accept().await.expect("accept");
            let mut lines = tokio::io::BufReader::new(stream);
            let mut first = String::new();
            lines.read_line(&mut first).await.expect("the request");
            assert_eq!(first.trim(), "TAKEOVER");
            let mut lines = hand_over(lines, &registry, Some((admin_addr, &admin))).await.expect("hand over");
            if let Some(lines) = lines.as_mut() {
                let states = vec![
                    ("wireguard", zeroize::Zeroizing::new(b"STATE x 1\nEND\n\x00".to_vec())),
                    ("empty", zeroize::Zeroizing::new(Vec::new())),
                ];
                send_states(lines, states).await.expect("states sent");
            }
            lines.is_some()
        });
        assert!(took);
        let (got, got_admin, states) = taker.join().expect("taker");
        // The forwarded datagram reached the old process's handover, and it
        // was told to stop reading once the new process was ready.
        rt.block_on(async {
            for _ in 0..100 {
                if !quic.got.lock().expect("lock").is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert_eq!(*quic.got.lock().expect("lock"), vec![b"a datagram of yours".to_vec()]);
        assert!(quic.handed.load(std::sync::atomic::Ordering::Relaxed));
        let mut buf = [0u8; 32];
        let n = far_end.recv(&mut buf).expect("through the link handed over");
        assert_eq!(&buf[..n], b"the same link");
        let n = xsk_far_end.recv(&mut buf).expect("through the socket handed over");
        assert_eq!(&buf[..n], b"queue 3");
        let n = umem_far_end.recv(&mut buf).expect("through the UMEM handed over");
        assert_eq!(&buf[..n], b"its umem");
        for (far, text) in [(&wg0_far, &b"worker 0"[..]), (&wg1_far, b"worker 1")] {
            let n = far.recv(&mut buf).expect("through the plane's descriptor, in order");
            assert_eq!(&buf[..n], text);
        }
        drop(link);
        // Each plane's bytes as sent, whatever they hold.
        let states: Vec<(&str, &[u8])> = states.iter().map(|(n, b)| (n.as_str(), &b[..])).collect();
        assert_eq!(states, vec![("wireguard", &b"STATE x 1\nEND\n\x00"[..]), ("empty", &b""[..])]);
        assert_eq!(got.local_addr().expect("addr"), web_addr);
        assert_eq!(got_admin.local_addr().expect("addr"), admin_addr);
        // The same kernel socket: a connection made to it is accepted through the received copy.
        drop(web);
        registry.lock().expect("lock").clear();
        got.set_nonblocking(false).expect("blocking");
        let _client = std::net::TcpStream::connect(web_addr).expect("connect");
        assert!(got.accept().is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
