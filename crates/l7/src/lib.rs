//! The L7 plane: listeners, TLS termination, HTTP routing, upstream pools,
//! health checks and per-route filters.
//!
//! Data flow: accept (worker's SO_REUSEPORT socket) → TLS (SNI picks a
//! certificate) → HTTP (hyper) → route → filters (ACL, rate limit, canary)
//! → balancer → pooled upstream connection → response streamed back →
//! access log line.

pub mod accesslog;
pub mod body;
pub mod conn;
mod deadline;
pub mod filters;
pub mod h1;
pub mod h1client;
pub mod h1server;
pub mod handover;
pub mod health;
pub mod metrics;
pub mod proxy;
pub mod router;
pub mod server;
pub mod snapshot;
pub mod store;
pub mod tls;
pub mod upstream;

pub use server::{check, run};
