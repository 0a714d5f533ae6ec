//! Body wrappers on the proxy path. Bodies are streamed frame by frame,
//! never collected.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};

use crate::completion::Completion;
use crate::upstream::connect::UpstreamBody;
use crate::upstream::h1::H1Body;
use crate::{BoxError, ClientBodyError};

/// The body of a response to a client, whatever produced it. An enum
/// rather than a boxed trait object: no allocation per response.
pub enum AnyBody {
    /// Made here (direct responses, refusals); `None` once sent or empty.
    Bytes(Option<Bytes>),
    /// Read straight from an HTTP/1.1 upstream.
    H1(H1Body),
    /// From an HTTP/2 upstream, through hyper.
    H2(Incoming),
}

impl AnyBody {
    /// An HTTP/1.1 upstream's response fields, when they were left for
    /// Gatehouse's own server to write as they came.
    pub fn raw_head(&self) -> Option<&crate::h1::response::ResponseHead> {
        match self {
            AnyBody::H1(b) => b.raw_head(),
            _ => None,
        }
    }
}

impl Body for AnyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut *self {
            AnyBody::Bytes(b) => Poll::Ready(b.take().map(|d| Ok(Frame::data(d)))),
            AnyBody::H1(b) => Pin::new(b).poll_frame(cx),
            AnyBody::H2(b) => Pin::new(b).poll_frame(cx).map_err(|e| Box::new(e) as BoxError),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            AnyBody::Bytes(b) => b.is_none(),
            AnyBody::H1(b) => b.is_end_stream(),
            AnyBody::H2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            AnyBody::Bytes(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            AnyBody::H1(b) => b.size_hint(),
            AnyBody::H2(b) => b.size_hint(),
        }
    }
}

/// A client's request body.
pub enum ClientBody {
    /// None: what Gatehouse's own HTTP/1.1 server reads (it takes only
    /// bodiless requests).
    None,
    Hyper(Incoming),
    /// From Gatehouse's own HTTP/2 and HTTP/3 servers.
    Stream(crate::downstream::recv::RecvBody),
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut *self {
            ClientBody::None => Poll::Ready(None),
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx).map_err(|e| Box::new(e) as BoxError),
            ClientBody::Stream(b) => Pin::new(b).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::None => true,
            ClientBody::Hyper(b) => b.is_end_stream(),
            ClientBody::Stream(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::None => SizeHint::with_exact(0),
            ClientBody::Hyper(b) => b.size_hint(),
            ClientBody::Stream(b) => b.size_hint(),
        }
    }
}

/// A client's request body on its way upstream: enforces the size limit,
/// counts bytes, and replays a first frame that was read ahead.
pub struct RequestBody {
    first: Option<Frame<Bytes>>,
    inner: ClientBody,
    limit: u64,
    seen: Arc<AtomicU64>,
}

impl RequestBody {
    /// Reads the first frame before anything goes upstream, so a body that
    /// is malformed from its first byte (a bad chunk size) or already too
    /// large is refused with nothing sent.
    pub async fn read_ahead(mut inner: ClientBody, limit: u64, seen: Arc<AtomicU64>) -> Result<Self, ClientBodyError> {
        let first = match inner.frame().await {
            None => None,
            Some(Err(e)) => return Err(ClientBodyError::Read(e)),
            Some(Ok(frame)) => Some(frame),
        };
        let body = RequestBody { first: None, inner, limit, seen };
        let first = match first {
            Some(f) => Some(body.count(f)?),
            None => None,
        };
        Ok(RequestBody { first, ..body })
    }

    fn count(&self, frame: Frame<Bytes>) -> Result<Frame<Bytes>, ClientBodyError> {
        if let Some(data) = frame.data_ref() {
            let total = self.seen.fetch_add(data.len() as u64, Ordering::Relaxed) + data.len() as u64;
            if total > self.limit {
                return Err(ClientBodyError::TooLarge);
            }
        }
        Ok(frame)
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        if let Some(f) = self.first.take() {
            return Poll::Ready(Some(Ok(f)));
        }
        match ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            None => Poll::Ready(None),
            Some(Err(e)) => Poll::Ready(Some(Err(ClientBodyError::Read(e)))),
            Some(Ok(frame)) => Poll::Ready(Some(self.count(frame))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let inner = self.inner.size_hint();
        let Some(len) = self.first.as_ref().and_then(|f| f.data_ref()).map(|d| d.len() as u64) else {
            return inner;
        };
        // Raise the upper bound first: SizeHint insists lower <= upper.
        let mut hint = SizeHint::new();
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper + len);
        }
        hint.set_lower(inner.lower() + len);
        hint
    }
}

/// A response body on its way to the client: counts bytes and finishes the
/// exchange (access log line, in-flight counts) when it ends or is dropped.
pub struct ResponseBody {
    inner: AnyBody,
    sent: u64,
    completion: Option<Completion>,
}

impl ResponseBody {
    pub fn new(inner: AnyBody, completion: Completion) -> Self {
        ResponseBody { inner, sent: 0, completion: Some(completion) }
    }

    pub fn raw_head(&self) -> Option<&crate::h1::response::ResponseHead> {
        self.inner.raw_head()
    }

    fn finish(&mut self, complete: bool) {
        if let Some(c) = self.completion.take() {
            c.finish(self.sent, complete);
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                if let Some(d) = frame.data_ref() {
                    self.sent += d.len() as u64;
                }
            }
            None => self.finish(true),
            Some(Err(_)) => {
                if let Some(c) = self.completion.as_mut() {
                    c.upstream_aborted();
                }
                self.finish(false);
            }
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for ResponseBody {
    fn drop(&mut self) {
        // An empty body may never be polled; it still completed.
        let complete = self.inner.is_end_stream();
        self.finish(complete);
    }
}

pub fn full(bytes: impl Into<Bytes>) -> AnyBody {
    let bytes = bytes.into();
    AnyBody::Bytes((!bytes.is_empty()).then_some(bytes))
}

pub fn empty() -> AnyBody {
    AnyBody::Bytes(None)
}

/// An empty request body for an upstream (a zero-sized box: no allocation).
pub fn empty_upstream() -> UpstreamBody {
    http_body_util::Empty::new().map_err(|never| match never {}).boxed_unsync()
}
