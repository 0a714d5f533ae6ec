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
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

use crate::body::ClientBody;
use crate::context::Worker;
use crate::downstream::conn::{ClientIo, ConnState};
use crate::downstream::h1::{Rewound, Served};
use crate::gather::Gather;
use crate::idle::ReadAhead;
use crate::metrics::{HandshakeResult, Metrics};
use crate::proxy::{self, HeadWriter};

/// A listener's identity for sockets: a name moved to another address is a
/// new socket; a protocol or TLS change is not (it is read per connection).
pub type ListenerKey = (Arc<str>, SocketAddr);

/// What the plane tells a worker about its listening sockets.
pub enum ListenerCommand {
    Open(ListenerKey, std::net::TcpListener),
    Close(ListenerKey),
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
            // A read-ahead under BoringSSL (one recvfrom for a flight of
            // records, no buffer held while idle: see `crate::idle`), and
            // `Gather` to send a large response's records together (on
            // HTTP/1.1: HTTP/2 gathers its frames itself).
            let stream = ReadAhead::new(Gather::new(stream));
            // Boxed, as every part of a connection's task that is not its
            // idle wait: the task is as large as its largest state, and an
            // idle connection should not pay for the handshake's.
            let accepted =
                Box::pin(tokio::time::timeout(http.client_header_timeout, tokio_boring::accept(&acceptor, stream)))
                    .await;
            let mut tls_stream = match accepted {
                Ok(Ok(s)) => s,
                Ok(Err(_)) => return metrics.handshake(worker.id, "-", "-", HandshakeResult::Failed),
                Err(_) => return metrics.handshake(worker.id, "-", "-", HandshakeResult::Timeout),
            };
            let ssl = tls_stream.ssl();
            let is_h2 = ssl.selected_alpn_protocol() == Some(b"h2");
            let info = (ssl.version_str(), ssl.current_cipher().map_or("-", |c| c.name()));
            metrics.handshake(worker.id, info.0, info.1, HandshakeResult::Ok);
            if is_h2 {
                tls_stream.get_mut().get_mut().pass_through();
            }
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
/// HTTP/1.x starts on Gatehouse's own server ([`crate::downstream::h1`]), which
/// hands the connection to hyper at the first request it does not take,
/// or to [`crate::downstream::h2`] when it reads the HTTP/2 preface.
async fn serve_http<T>(io: T, state: Arc<ConnState>, http: &gatehouse_config::HttpSettings, alpn_h2: Option<bool>)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let client = Box::pin(ClientIo::new(io, state.clone(), http.client_header_timeout, http.client_idle_timeout));
    let mut drain = state.worker.shared.draining.subscribe();
    let (client, prefix) = if alpn_h2 == Some(true) {
        (client, bytes::Bytes::new())
    } else {
        let served = crate::downstream::h1::serve(
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
    if alpn_h2 == Some(true) || client.is_h2() {
        let limits = crate::downstream::h2::Limits::new(http);
        return Box::pin(crate::downstream::h2::serve(client, prefix, state, limits, &mut drain)).await;
    }
    let io = TokioIo::new(Rewound::new(prefix, client));
    let h1_state = state.clone();
    // Boxed: hyper moves a request's future before it runs, and the
    // proxy's future is kilobytes, so each move was a large memcpy; a box
    // moves as one pointer.
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        Box::pin(proxy::handle(req.map(ClientBody::Hyper), state.clone(), HeadWriter::Map))
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .max_buf_size(http.max_header_bytes.max(8192))
        .max_headers(http.max_headers)
        // ClientIo enforces the head timeout (and answers 408); hyper's
        // own would arm a second timer per request.
        .header_read_timeout(None)
        .keep_alive(true);
    Box::pin(drive(b.serve_connection(io, svc).with_upgrades(), drain, Some(h1_state), |c| c.graceful_shutdown()))
        .await;
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
