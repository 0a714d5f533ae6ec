//! The L7 plane: listeners, TLS termination, HTTP routing, upstream pools
//! and per-route filters, run under the node as [`L7`].
//!
//! By role: `h1/`, `h2/` and `h3/` are the protocols' codecs, without I/O;
//! `downstream/` accepts clients and serves them (TLS, the HTTP/1.1 and
//! HTTP/2 servers; HTTP/3 goes there too); `upstream/` picks an endpoint,
//! connects and exchanges; `proxy` is a request's flow from route to
//! relay, `refusal` every way it can fail; `snapshot`, `router` and
//! `filters` are the compiled config it runs on.
//!
//! Data flow: accept (worker's SO_REUSEPORT socket) → TLS (SNI picks a
//! certificate) → HTTP (Gatehouse's HTTP/1.1 and HTTP/2 servers; hyper for
//! HTTP/1.1 requests with bodies) → route →
//! filters (ACL, rate limit, canary) → balancer → pooled upstream
//! connection → response streamed back → access log line.

mod accesslog;
mod body;
mod completion;
mod context;
mod deadline;
mod downstream;
mod error;
mod filters;
mod gather;
pub mod h1;
pub mod h2;
pub mod h3;
mod idle;
mod metrics;
pub mod plane;
mod proxy;
mod refusal;
mod router;
mod snapshot;
mod sockopt;
mod spare;
mod ssl_ffi;
mod upstream;

pub use error::{BoxError, ClientBodyError};

/// The QUIC glue of the HTTP/3 server that is Gatehouse's own (quiche does
/// the rest): connection IDs that name their worker, Retry tokens, and the
/// Initial packet that refuses a bad token. Public for the fuzz targets.
pub mod quic {
    pub use crate::downstream::h3::cid::{CID_LEN, Keys, worker_of};
    pub use crate::downstream::h3::initial::{INVALID_TOKEN, VERSION_1, close_packet};
}
pub use plane::L7;
