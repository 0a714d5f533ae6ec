//! What serves a connection after Gatehouse's own HTTP/1.1 server hands it
//! over, or in its place when ALPN chose h2: the HTTP/2 server, or hyper
//! for an HTTP/1 request of a shape the own server does not take, with
//! the bytes already read put back in front ([`Rewound`]); and how either
//! ends when the process drains ([`drive`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::body::ClientBody;
use crate::downstream::conn::{ClientStream, ConnState};
use crate::proxy::{self, HeadWriter};

/// How long a draining HTTP/1 connection may stay idle before it is
/// closed even though no request came to carry `Connection: close`
/// (closing it at once would race a request the client is already
/// sending).
pub const DRAIN_IDLE_GRACE: Duration = Duration::from_secs(1);

/// What serves a connection after Gatehouse's own HTTP/1 server (or in
/// its place, when ALPN chose h2): its HTTP/2 server (ALPN, or the
/// cleartext preface), or hyper for an HTTP/1 request of a shape the own
/// server does not take. `alpn_h2`: on TLS, what ALPN chose; `None` on
/// cleartext. The HTTP settings are read from the live snapshot here.
pub fn handed_over<T>(
    client: ClientStream<T>,
    prefix: bytes::Bytes,
    alpn_h2: Option<bool>,
) -> Pin<Box<dyn Future<Output = ()> + Send>>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    // One box for the server that takes it: an HTTP/2 connection does not
    // hold room for hyper's state, nor the other way round.
    if alpn_h2 == Some(true) || client.is_h2() {
        Box::pin(serve_h2(client, prefix))
    } else {
        Box::pin(serve_hyper(client, prefix))
    }
}

async fn serve_h2<T>(client: ClientStream<T>, prefix: bytes::Bytes)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let state = client.state().clone();
    let limits = crate::downstream::h2::Limits::new(&state.worker.shared.snapshot.load().http);
    let mut drain = state.worker.shared.draining.subscribe();
    crate::downstream::h2::serve(client, prefix, state, limits, &mut drain).await
}

async fn serve_hyper<T>(client: ClientStream<T>, prefix: bytes::Bytes)
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let state = client.state().clone();
    let (max_head, max_headers) = {
        let snap = state.worker.shared.snapshot.load();
        (snap.http.max_header_bytes, snap.http.max_headers)
    };
    let drain = state.worker.shared.draining.subscribe();
    let io = TokioIo::new(Rewound::new(prefix, client));
    let h1_state = state.clone();
    // Boxed: hyper moves a request's future before it runs, and the
    // proxy's future is kilobytes, so each move was a large memcpy; a box
    // moves as one pointer.
    let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        proxy::handle_boxed(req.map(ClientBody::Hyper), state.clone(), HeadWriter::Map)
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .max_buf_size(max_head.max(8192))
        .max_headers(max_headers)
        // ClientIo enforces the head timeout (and answers 408); hyper's
        // own would arm a second timer per request.
        .header_read_timeout(None)
        .keep_alive(true);
    drive(b.serve_connection(io, svc).with_upgrades(), drain, Some(h1_state), |c| c.graceful_shutdown()).await;
}

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

/// A client stream with bytes already read put back in front: how hyper
/// gets a connection this server hands over.
pub struct Rewound<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewound<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Rewound { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            let taken = self.prefix.split_to(n);
            buf.put_slice(&taken);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewound<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
