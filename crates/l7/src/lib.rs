//! The L7 plane: listeners, TLS termination, HTTP routing, upstream pools
//! and per-route filters, run under the node as [`L7`].
//!
//! Data flow: accept (worker's SO_REUSEPORT socket) → TLS (SNI picks a
//! certificate) → HTTP (Gatehouse's HTTP/1.1 and HTTP/2 servers; hyper for
//! HTTP/1.1 requests with bodies) → route →
//! filters (ACL, rate limit, canary) → balancer → pooled upstream
//! connection → response streamed back → access log line.

pub mod accesslog;
pub mod body;
pub mod completion;
pub mod conn;
pub mod context;
mod deadline;
pub mod error;
pub mod filters;
pub mod gather;
pub mod h1;
pub mod h1client;
pub mod h1server;
pub mod h2;
pub mod metrics;
pub mod plane;
pub mod proxy;
pub mod router;
pub mod snapshot;
pub mod spare;
pub mod tls;
pub mod upstream;
pub mod worker;

pub use error::{BoxError, ClientBodyError};
pub use plane::L7;
