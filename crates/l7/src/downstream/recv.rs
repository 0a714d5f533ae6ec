//! A request body as a multiplexed connection (HTTP/2, HTTP/3) receives
//! it: data handed from the connection's task to whoever forwards the body
//! (the proxy's upstream exchange), and the bytes taken counted back, so
//! the connection opens the client's flow-control windows only as fast as
//! the upstream takes the body. What one stream holds is bounded by its
//! window.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use hyper::body::{Body, Frame, SizeHint};

use crate::BoxError;

#[derive(Default)]
struct State {
    chunks: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    end: bool,
    error: Option<&'static str>,
    /// The body's reader, waiting for data.
    reader: Option<Waker>,
    /// Bytes taken since the connection last looked.
    taken: usize,
}

/// The connection's side.
pub struct Sender {
    shared: Arc<Mutex<State>>,
}

/// The reader's side: a `hyper::body::Body`.
pub struct RecvBody {
    shared: Arc<Mutex<State>>,
    /// Wakes the connection for this stream when enough is taken to be
    /// worth a window update.
    stream_waker: Waker,
    /// Bytes left of the declared Content-Length, counted down as chunks
    /// are taken: `Body::size_hint` is what remains.
    left: Option<u64>,
}

/// Taken bytes worth telling the connection about at once.
const TELL_AFTER: usize = 16 * 1024;

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn channel(stream_waker: Waker, content_length: Option<u64>) -> (Sender, RecvBody) {
    let shared = Arc::new(Mutex::new(State::default()));
    (Sender { shared: shared.clone() }, RecvBody { shared, stream_waker, left: content_length })
}

impl Sender {
    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut s = lock(&self.shared);
        f(&mut s);
        if let Some(w) = s.reader.take() {
            drop(s);
            w.wake();
        }
    }

    pub fn data(&self, data: Bytes) {
        self.update(|s| s.chunks.push_back(data));
    }

    pub fn end(&self, trailers: Option<HeaderMap>) {
        self.update(|s| {
            s.trailers = trailers;
            s.end = true;
        });
    }

    /// The body fails for its reader with this reason.
    pub fn fail(&self, why: &'static str) {
        self.update(|s| s.error = Some(why));
    }

    /// Bytes the reader took since the last call.
    pub fn take_released(&self) -> usize {
        std::mem::take(&mut lock(&self.shared).taken)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let ended = lock(&self.shared).end;
        if !ended {
            self.fail("stream closed");
        }
    }
}

#[derive(Debug)]
struct BodyError(&'static str);

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "request body: {}", self.0)
    }
}

impl std::error::Error for BodyError {}

impl Body for RecvBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let mut s = lock(&this.shared);
        if let Some(why) = s.error {
            return Poll::Ready(Some(Err(Box::new(BodyError(why)))));
        }
        if let Some(d) = s.chunks.pop_front() {
            let before = s.taken;
            s.taken += d.len();
            let tell = before < TELL_AFTER && s.taken >= TELL_AFTER;
            drop(s);
            if let Some(left) = &mut this.left {
                *left = left.saturating_sub(d.len() as u64);
            }
            if tell {
                this.stream_waker.wake_by_ref();
            }
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        if let Some(t) = s.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        if s.end {
            return Poll::Ready(None);
        }
        // Waiting: whatever was taken is worth a window update now.
        let tell = s.taken > 0;
        s.reader = Some(cx.waker().clone());
        drop(s);
        if tell {
            this.stream_waker.wake_by_ref();
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        let s = lock(&self.shared);
        s.end && s.chunks.is_empty() && s.trailers.is_none() && s.error.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.left {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn data_trailers_and_end_reach_the_reader_and_taken_bytes_come_back() {
        let (tx, mut rx) = channel(Waker::noop().clone(), Some(5));
        tx.data(Bytes::from_static(b"hel"));
        tx.data(Bytes::from_static(b"lo"));
        let mut t = HeaderMap::new();
        t.insert("x-t", "1".parse().expect("value"));
        tx.end(Some(t));
        assert_eq!(rx.size_hint().exact(), Some(5));
        assert_eq!(rx.frame().await.expect("frame").expect("ok").into_data().expect("data"), "hel");
        // The hint is what is left, as `Body::size_hint` asks.
        assert_eq!(rx.size_hint().exact(), Some(2));
        assert_eq!(rx.frame().await.expect("frame").expect("ok").into_data().expect("data"), "lo");
        assert_eq!(rx.size_hint().exact(), Some(0));
        assert_eq!(tx.take_released(), 5);
        let trailers = rx.frame().await.expect("frame").expect("ok").into_trailers().expect("trailers");
        assert_eq!(trailers["x-t"], "1");
        assert!(rx.frame().await.is_none());
        assert!(rx.is_end_stream());
    }

    #[tokio::test]
    async fn a_closed_stream_fails_the_body() {
        let (tx, mut rx) = channel(Waker::noop().clone(), None);
        drop(tx);
        assert!(rx.frame().await.expect("frame").is_err());
    }
}
