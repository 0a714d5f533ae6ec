//! The worker threads: thread per core, each with its own single-threaded
//! tokio runtime, accepting on its own SO_REUSEPORT socket of every
//! listener, so the kernel spreads connections and the hot path shares
//! nothing but the snapshot pointer. A connection goes TLS (when the
//! listener has it), then Gatehouse's own HTTP/2 server (ALPN h2, or the
//! cleartext preface) or its own HTTP/1.1 server, which hands requests of
//! other shapes to hyper's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32};
use std::time::Duration;

use boring::ssl::SslAcceptor;
use tokio::net::{TcpListener, TcpStream};

use crate::context::Worker;
use crate::downstream::conn::{ClientIo, ClientStream, ConnState, Open};
use crate::downstream::handover::handed_over;
use crate::gather::Gather;
use crate::idle::ReadAhead;
use crate::metrics::{HandshakeResult, ListenerMetrics};

/// A listener's identity for sockets: a name moved to another address is a
/// new socket; a protocol or TLS change is not (it is read per connection).
pub type ListenerKey = (Arc<str>, SocketAddr);

/// What the plane tells a worker about its listening sockets.
pub enum ListenerCommand {
    Open(ListenerKey, std::net::TcpListener),
    Close(ListenerKey),
    /// A listener's HTTP/3 socket.
    OpenQuic(ListenerKey, crate::downstream::h3::QuicSocket),
    /// Stop taking new QUIC connections; the open ones finish.
    CloseQuic(ListenerKey),
}

impl ListenerCommand {
    pub fn key(&self) -> &ListenerKey {
        match self {
            ListenerCommand::Open(k, _)
            | ListenerCommand::Close(k)
            | ListenerCommand::OpenQuic(k, _)
            | ListenerCommand::CloseQuic(k) => k,
        }
    }
}

pub type WorkerHandle = tokio::sync::mpsc::UnboundedSender<ListenerCommand>;

pub fn worker_main(worker: Arc<Worker>, mut commands: tokio::sync::mpsc::UnboundedReceiver<ListenerCommand>) {
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
        let _stop_timer = tokio_util::task::AbortOnDropHandle::new(batch_timer);
        let mut accepting: HashMap<ListenerKey, tokio::task::JoinHandle<()>> = HashMap::new();
        let mut quic: HashMap<ListenerKey, tokio::sync::oneshot::Sender<()>> = HashMap::new();
        // Close upstream connections that idled out.
        let mut sweep = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = sweep.tick() => worker.conns.sweep(std::time::Instant::now()),
                command = commands.recv() => match command {
                    Some(ListenerCommand::Open(key, socket)) => match listen(socket) {
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
                    Some(ListenerCommand::OpenQuic(key, socket)) => {
                        let (stop, stopped) = tokio::sync::oneshot::channel();
                        tokio::spawn(crate::downstream::h3::serve(socket, key.0.clone(), worker.clone(), stopped));
                        if let Some(old) = quic.insert(key, stop) {
                            let _ = old.send(());
                        }
                    }
                    // The endpoint serves its connections to their end.
                    Some(ListenerCommand::CloseQuic(key)) => {
                        if let Some(stop) = quic.remove(&key) {
                            let _ = stop.send(());
                        }
                    }
                    None => return,
                },
            }
        }
    });
}

/// A worker's listening socket, set up so that what it accepts needs no
/// option of its own: TCP_NODELAY is inherited by every connection (one
/// system call a listener, not one a connection), and connections come
/// with their first bytes ([`crate::sockopt::defer_accept`]).
fn listen(socket: std::net::TcpListener) -> std::io::Result<TcpListener> {
    socket2::SockRef::from(&socket).set_tcp_nodelay(true)?;
    if let Err(e) = crate::sockopt::defer_accept(&socket) {
        tracing::warn!("TCP_DEFER_ACCEPT refused, connections are accepted before their first bytes: {e}");
    }
    TcpListener::from_std(socket)
}

async fn accept_loop(listener: TcpListener, name: Arc<str>, worker: Arc<Worker>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                start(stream, peer, &name, &worker);
            }
            Err(e) => {
                // Out of file descriptors and the like: back off, don't spin.
                tracing::warn!(listener = %name, "accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Starts a connection's task. A cleartext connection's task is small
/// while its connection is idle: it holds what
/// [`crate::downstream::h1::serve`] waits with and little more, and every
/// other step (hyper, HTTP/2) is a boxed future of its own, made when it
/// starts. A task is as large as its largest state, and keeps room for
/// its arguments for its whole life: an idle connection should not pay
/// for the other steps (`docs/ARCHITECTURE.md`, idle connections).
fn start(stream: TcpStream, peer: SocketAddr, name: &Arc<str>, worker: &Arc<Worker>) {
    worker.shared.metrics.connection_opened(worker.id);
    let Some((index, tls, listener)) = listener_of(worker, name) else {
        return worker.shared.metrics.connection_closed(worker.id);
    };
    listener.accepted(worker.id);
    let open = Open { worker: worker.clone(), listener };
    let conn = NewConn { peer, name: name.clone(), index };
    match tls {
        Some(acceptor) => {
            tokio::spawn(serve_tls(stream, acceptor, conn, open));
        }
        None => {
            let client = client_io(stream, conn.state(worker, None, false));
            tokio::spawn(crate::downstream::h1::serve(client, open, None));
        }
    }
}

/// The listener's index in the live snapshot, its TLS acceptor (when it
/// has TLS) and its counters.
fn listener_of(worker: &Worker, name: &str) -> Option<(usize, Option<SslAcceptor>, Arc<ListenerMetrics>)> {
    let snap = worker.shared.snapshot.load();
    let index = snap.listener_index(name)?;
    let listener = &snap.listeners[index];
    Some((index, listener.tls.as_ref().map(|t| t.acceptor.clone()), listener.metrics.clone()))
}

/// Who a new connection is, until its state is made.
struct NewConn {
    peer: SocketAddr,
    name: Arc<str>,
    index: usize,
}

impl NewConn {
    fn state(self, worker: &Arc<Worker>, tls: Option<(&'static str, &'static str)>, is_h2: bool) -> Arc<ConnState> {
        Arc::new(ConnState {
            client: self.peer,
            listener: self.index,
            listener_name: self.name,
            tls,
            is_h2,
            worker: worker.clone(),
            in_flight: AtomicU32::new(0),
            requests: AtomicU32::new(0),
            head_flags: AtomicU8::new(0),
            closing: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

async fn serve_tls(stream: TcpStream, acceptor: SslAcceptor, conn: NewConn, open: Open) {
    let (worker, metrics) = (&open.worker, &open.listener);
    let header_timeout = worker.shared.snapshot.load().http.client_header_timeout;
    // A read-ahead under BoringSSL (one recvfrom for a flight of records,
    // no buffer held while idle: see `crate::idle`), and `Gather` to send a
    // large response's records together (on HTTP/1.1: HTTP/2 gathers its
    // frames itself).
    let stream = ReadAhead::new(Gather::new(stream));
    // Boxed, as every part of the task that is not its idle wait: the task
    // is as large as its largest state, and an idle connection should not
    // pay for the handshake's.
    let handshake = gatehouse_keyops::batcher::handshake_begins();
    let accepted = Box::pin(tokio::time::timeout(header_timeout, tokio_boring::accept(&acceptor, stream))).await;
    drop(handshake);
    let mut tls_stream = match accepted {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => return metrics.handshake(worker.id, "-", "-", HandshakeResult::Failed),
        Err(_) => return metrics.handshake(worker.id, "-", "-", HandshakeResult::Timeout),
    };
    let ssl = tls_stream.ssl();
    let is_h2 = ssl.selected_alpn_protocol() == Some(b"h2");
    let info = (ssl.version_str(), ssl.current_cipher().map_or("-", |c| c.name()));
    metrics.handshake(worker.id, info.0, info.1, HandshakeResult::Ok);
    if let Some(group) = ssl.curve() {
        gatehouse_keyops::stats::record_key_share(group, crate::downstream::key_share::engine_used(ssl));
    }
    if is_h2 {
        tls_stream.get_mut().get_mut().pass_through();
    }
    let client = client_io(tls_stream, conn.state(worker, Some(info), is_h2));
    if is_h2 {
        // ALPN settled it: no HTTP/1 server first.
        handed_over(client, bytes::Bytes::new(), Some(true)).await;
    } else {
        crate::downstream::h1::serve(client, open, Some(false)).await;
    }
}

/// The connection's reader, with its timeouts.
fn client_io<T>(io: T, state: Arc<ConnState>) -> ClientStream<T> {
    let (header, idle) = {
        let snap = state.worker.shared.snapshot.load();
        (snap.http.client_header_timeout, snap.http.client_idle_timeout)
    };
    Box::pin(ClientIo::new(io, state, header, idle))
}
