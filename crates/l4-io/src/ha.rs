//! Active/standby: the node's role (set by keepalived's notify through the
//! node), what the workers do about it, the announcements a new master
//! makes, and the sync thread that carries sessions to the peer balancer
//! and keeps the peer's sessions apart until a promotion commits them.
//!
//! - Master: the XDP program steers the VIPs and FNAT local addresses to the
//!   plane, which answers ARP and neighbour solicitations for them. On
//!   promotion the sessions learnt from the peer go into every worker's
//!   inbox (committed before the worker's next vector), then the steering
//!   takes the addresses, then gratuitous ARPs and unsolicited neighbour
//!   advertisements tell the segment where they are now.
//! - Backup or fault: nothing is steered for those addresses, so the
//!   kernel, which does not have them, answers nothing; the workers' tables
//!   are emptied; the peer's sessions are kept in a cache with their expiry.
//!
//! The sync thread sends what the workers queued (new and changed sessions,
//! and the walk that sends long-lived ones again), at most `max_rate`
//! sessions a second, 17 to a datagram; a heartbeat every second; a hello
//! when it starts or becomes a standby, which makes the master send every
//! session it has (the workers walk their whole tables).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use gatehouse_config::{HaRole, L4Sync};
use gatehouse_l4::sync::{Key, Kind, MAX_DATAGRAM, MAX_RECORDS, Receiver, Record, Refused, Sender};

/// Records a worker may have waiting for the sync thread.
pub const OUTBOX_CAP: usize = 65_536;
const HEARTBEAT: Duration = Duration::from_secs(1);
const SEND_PERIOD: Duration = Duration::from_millis(5);

/// Counters of the sync channel, read by `/metrics`.
#[derive(Default)]
pub struct SyncCounters {
    pub sessions_sent: AtomicU64,
    pub datagrams_sent: AtomicU64,
    pub send_errors: AtomicU64,
    /// Sessions not sent: over `max_rate` for longer than a second's worth,
    /// or a worker's queue full.
    pub sessions_dropped: AtomicU64,
    pub sessions_received: AtomicU64,
    pub datagrams_received: AtomicU64,
    /// Datagrams refused, by [`Refused::NAMES`].
    pub refused: [AtomicU64; 5],
    pub committed: AtomicU64,
    /// Sessions a promotion could not commit, by `gatehouse_l4::plane::CommitError::NAMES`.
    pub commit_failed: [AtomicU64; 5],
    /// Full passes made because the peer (re)joined.
    pub bulk_syncs: AtomicU64,
    /// Sessions held for the peer (while standby).
    pub cached: AtomicU64,
    /// When the peer was last heard from (ms since the sync thread
    /// started; 0: never).
    pub peer_heard_ms: AtomicU64,
}

/// A session's identity on both nodes: protocol, client and port, VIP and
/// port.
type SessionKey = (u8, IpAddr, u16, IpAddr, u16);

/// The sync channel's shared state.
pub struct SyncShared {
    pub cfg: L4Sync,
    key: Key,
    /// By worker slot: records waiting to be sent.
    pub outbox: Vec<Mutex<Vec<Record>>>,
    /// By worker slot: records to commit before the next vector.
    pub inbox: Vec<Mutex<Vec<Record>>>,
    /// The peer's sessions, while this node is a standby: by key, with
    /// their expiry.
    cache: Mutex<HashMap<SessionKey, (Record, Instant)>>,
    cache_cap: usize,
    pub counters: SyncCounters,
    /// Set when a hello is due (start, and every demotion).
    hello: std::sync::atomic::AtomicBool,
    /// Sessions the sync thread has waiting to be sent: the workers' table
    /// walks pause while it is above a tenth of a second's worth, so that a
    /// bulk sync goes at the rate the channel sends, losing nothing.
    pub backlog: AtomicU64,
}

impl SyncShared {
    /// Whether the workers may walk their tables now.
    pub fn room(&self) -> bool {
        self.backlog.load(Ordering::Relaxed) < u64::from(self.cfg.max_rate / 10).max(MAX_RECORDS as u64)
    }
}

/// The role and what follows from it.
pub struct Ha {
    role: AtomicU8,
    /// Bumped at every demotion: the workers start over with empty tables.
    pub demotions: AtomicU32,
    /// Bumped when the peer (re)joins: the workers make a full pass.
    pub resyncs: AtomicU32,
    pub announce: u32,
    pub sync: Option<SyncShared>,
    pub changes: AtomicU64,
}

fn role_code(r: HaRole) -> u8 {
    match r {
        HaRole::Master => 0,
        HaRole::Backup => 1,
        HaRole::Fault => 2,
    }
}

impl Ha {
    /// `key` is the sync key already read (from the config or its file).
    pub fn new(initial: HaRole, announce: u32, sync: Option<(L4Sync, Key)>, slots: usize, cache_cap: usize) -> Ha {
        Ha {
            role: AtomicU8::new(role_code(initial)),
            demotions: AtomicU32::new(0),
            resyncs: AtomicU32::new(0),
            announce,
            sync: sync.map(|(cfg, key)| SyncShared {
                cfg,
                key,
                outbox: (0..slots).map(|_| Mutex::new(Vec::new())).collect(),
                inbox: (0..slots).map(|_| Mutex::new(Vec::new())).collect(),
                cache: Mutex::new(HashMap::new()),
                cache_cap,
                counters: SyncCounters::default(),
                hello: std::sync::atomic::AtomicBool::new(true),
                backlog: AtomicU64::new(0),
            }),
            changes: AtomicU64::new(0),
        }
    }

    pub fn role(&self) -> HaRole {
        match self.role.load(Ordering::Acquire) {
            0 => HaRole::Master,
            1 => HaRole::Backup,
            _ => HaRole::Fault,
        }
    }

    pub fn is_master(&self) -> bool {
        self.role() == HaRole::Master
    }

    /// Changes the role; returns the one before. A promotion hands the
    /// cached sessions to the workers first (they commit them before their
    /// next vector); the caller then steers the addresses and announces.
    pub fn set_role(&self, role: HaRole) -> HaRole {
        let old = self.role();
        if old == role {
            return old;
        }
        if role == HaRole::Master
            && let Some(s) = &self.sync
        {
            let records: Vec<Record> = {
                let mut cache = lock(&s.cache);
                let now = Instant::now();
                let out = cache
                    .drain()
                    .filter(|(_, (_, exp))| *exp > now)
                    .map(|(_, (mut r, exp))| {
                        r.ttl = exp.saturating_duration_since(now).as_secs().max(1) as u32;
                        r
                    })
                    .collect();
                s.counters.cached.store(0, Ordering::Relaxed);
                out
            };
            for inbox in &s.inbox {
                lock(inbox).extend_from_slice(&records);
            }
        }
        if role != HaRole::Master {
            self.demotions.fetch_add(1, Ordering::AcqRel);
            if let Some(s) = &self.sync {
                s.hello.store(true, Ordering::Release);
            }
        }
        self.role.store(role_code(role), Ordering::Release);
        self.changes.fetch_add(1, Ordering::Relaxed);
        old
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A worker's part, run between vectors: what came from the peer is
/// committed, what the worker queued goes to the sync thread.
pub fn worker_exchange(
    sync: &SyncShared,
    slot: usize,
    worker: &mut gatehouse_l4::plane::Worker,
    plane: &gatehouse_l4::plane::Plane,
    now: u32,
) {
    if let Ok(mut inbox) = sync.inbox[slot].try_lock()
        && !inbox.is_empty()
    {
        let records = std::mem::take(&mut *inbox);
        drop(inbox);
        let mut ok = 0;
        for r in &records {
            match worker.commit(plane, r, now) {
                Ok(()) => ok += 1,
                Err(e) => {
                    sync.counters.commit_failed[e.index()].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Every worker commits every session; count each once.
        if slot == 0 {
            sync.counters.committed.fetch_add(ok, Ordering::Relaxed);
        }
    }
    let Some(out) = worker.sync_out() else { return };
    if out.dropped > 0 {
        sync.counters.sessions_dropped.fetch_add(out.dropped, Ordering::Relaxed);
        out.dropped = 0;
    }
    if out.records.is_empty() {
        return;
    }
    if let Ok(mut q) = sync.outbox[slot].try_lock() {
        let room = OUTBOX_CAP.saturating_sub(q.len());
        let n = out.records.len().min(room);
        q.extend(out.records.drain(..n));
        let lost = out.records.len() as u64;
        if lost > 0 {
            sync.counters.sessions_dropped.fetch_add(lost, Ordering::Relaxed);
            out.records.clear();
        }
    }
}

/// The sync thread: until `stop`, sends what the workers queued and takes
/// in what the peer sends.
pub fn sync_loop(ha: &Ha, stop: &std::sync::atomic::AtomicBool) {
    let Some(s) = &ha.sync else { return };
    let socket = match bind(s.cfg.listen) {
        Ok(sock) => sock,
        Err(e) => {
            tracing::error!(listen = %s.cfg.listen, "l4.ha.sync: cannot listen: {e}; sessions are not synced");
            return;
        }
    };
    let node = s.cfg.node();
    let epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let mut sender = Sender::new(s.key.clone(), node, epoch);
    let mut receiver = Receiver::new(s.key.clone(), node);
    let started = Instant::now();
    let rate = f64::from(s.cfg.max_rate);
    let mut tokens = rate / 10.0;
    let mut last_fill = Instant::now();
    let mut last_beat = Instant::now() - HEARTBEAT;
    let mut pending: Vec<Record> = Vec::new();
    let mut buf = vec![0u8; 2048];
    let mut out = Vec::with_capacity(MAX_DATAGRAM);
    let c = &s.counters;
    tracing::info!(listen = %s.cfg.listen, peer = %s.cfg.peer, node, "L4 session sync started");
    while !stop.load(Ordering::Relaxed) {
        // Take in what the peer sent: wait at most SEND_PERIOD for it, then
        // read all there is (the socket does not block).
        wait(&socket, nix::poll::PollFlags::POLLIN, SEND_PERIOD);
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            receive(ha, s, &mut receiver, &buf[..n], from, started);
        }
        // Gather and send.
        for q in &s.outbox {
            let mut q = lock(q);
            pending.append(&mut q);
        }
        let now = Instant::now();
        tokens = (tokens + rate * now.duration_since(last_fill).as_secs_f64()).min(rate / 10.0 + MAX_RECORDS as f64);
        last_fill = now;
        // More than a second's worth waiting: the rest is dropped (the walk
        // sends long-lived sessions again later).
        if pending.len() as f64 > rate {
            let over = pending.len() - rate as usize;
            pending.drain(..over);
            c.sessions_dropped.fetch_add(over as u64, Ordering::Relaxed);
        }
        // Datagrams from the front while tokens last; what they took is
        // removed once (not per datagram: a bulk sync keeps a large backlog).
        let mut at = 0;
        while at < pending.len() && tokens >= 1.0 {
            let n = (pending.len() - at).min(MAX_RECORDS).min(tokens as usize);
            sender.seal(Kind::Sessions, &pending[at..at + n], &mut out);
            send(&socket, s, &out);
            c.sessions_sent.fetch_add(n as u64, Ordering::Relaxed);
            at += n;
            tokens -= n as f64;
        }
        pending.drain(..at);
        s.backlog.store(pending.len() as u64, Ordering::Relaxed);
        if s.hello.swap(false, Ordering::AcqRel) {
            sender.seal(Kind::Hello, &[], &mut out);
            send(&socket, s, &out);
        }
        if now.duration_since(last_beat) >= HEARTBEAT {
            last_beat = now;
            sender.seal(Kind::Sessions, &[], &mut out);
            send(&socket, s, &out);
            let mut cache = lock(&s.cache);
            cache.retain(|_, (_, exp)| *exp > now);
            c.cached.store(cache.len() as u64, Ordering::Relaxed);
        }
    }
}

fn bind(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let sock = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, None)?;
    sock.set_reuse_address(true)?;
    // The address may be one keepalived or the operator adds a moment
    // later; bind it anyway.
    let _ = sock.set_freebind_v4(true);
    sock.bind(&addr.into())?;
    let sock: UdpSocket = sock.into();
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// Waits until `socket` is ready for `what`, or `timeout` has passed.
fn wait(socket: &UdpSocket, what: nix::poll::PollFlags, timeout: Duration) {
    use nix::poll::{PollFd, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(socket.as_fd(), what)];
    let ms = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::ZERO);
    let _ = poll(&mut fds, ms);
}

/// Sends one datagram to the peer; a full socket buffer is waited out (a
/// little: the socket does not block).
fn send(socket: &UdpSocket, s: &SyncShared, d: &[u8]) {
    let mut r = socket.send_to(d, s.cfg.peer);
    if matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
        wait(socket, nix::poll::PollFlags::POLLOUT, SEND_PERIOD);
        r = socket.send_to(d, s.cfg.peer);
    }
    match r {
        Ok(_) => s.counters.datagrams_sent.fetch_add(1, Ordering::Relaxed),
        Err(_) => s.counters.send_errors.fetch_add(1, Ordering::Relaxed),
    };
}

fn receive(ha: &Ha, s: &SyncShared, rx: &mut Receiver, d: &[u8], from: SocketAddr, started: Instant) {
    let c = &s.counters;
    let msg = match rx.open(d) {
        Ok(m) => m,
        Err(r) => {
            c.refused[r.index()].fetch_add(1, Ordering::Relaxed);
            if !matches!(r, Refused::Replay) {
                tracing::debug!(%from, reason = Refused::NAMES[r.index()], "sync datagram refused");
            }
            return;
        }
    };
    c.datagrams_received.fetch_add(1, Ordering::Relaxed);
    c.peer_heard_ms.store(started.elapsed().as_millis().max(1) as u64, Ordering::Relaxed);
    // The peer started or became a standby: it gets everything we have.
    if (msg.new_epoch || msg.kind == Kind::Hello) && ha.is_master() {
        ha.resyncs.fetch_add(1, Ordering::AcqRel);
        c.bulk_syncs.fetch_add(1, Ordering::Relaxed);
        tracing::info!(peer = msg.node, "the sync peer joined: sending it every session");
    }
    if msg.records.is_empty() || ha.is_master() {
        // A master keeps its own sessions; two masters at once is
        // keepalived's to settle.
        return;
    }
    c.sessions_received.fetch_add(msg.records.len() as u64, Ordering::Relaxed);
    let now = Instant::now();
    let mut cache = lock(&s.cache);
    for r in msg.records {
        if cache.len() >= s.cache_cap && !cache.contains_key(&r.key()) {
            c.sessions_dropped.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let exp = now + Duration::from_secs(u64::from(r.ttl));
        cache.insert(r.key(), (r, exp));
    }
    c.cached.store(cache.len() as u64, Ordering::Relaxed);
}

/// Tells the segment the addresses are here now: gratuitous ARP for IPv4,
/// unsolicited neighbour advertisements for IPv6, `count` of each.
pub fn announce(ifindex: u32, mac: [u8; 6], addrs: &[IpAddr], count: u32) -> std::io::Result<usize> {
    use gatehouse_l4::neighbour::{gratuitous_arp, unsolicited_advert};
    let sock = crate::packet_socket::PacketSocket::open(ifindex)?;
    let mut sent = 0;
    for _ in 0..count {
        for a in addrs {
            let ok = match a {
                IpAddr::V4(v4) => sock.send(&gratuitous_arp(*v4, mac)),
                IpAddr::V6(v6) => sock.send(&unsolicited_advert(*v6, mac)),
            };
            sent += usize::from(ok);
        }
    }
    Ok(sent)
}
