//! The upstream side of the proxy: where a request goes and how it gets
//! there.
//!
//! - [`pool`]: an upstream's endpoints and the scheduler that picks one
//!   (part of a snapshot);
//! - [`connect`]: connections to endpoints, and each worker's keep-alive
//!   pool of them;
//! - [`h1`]: Gatehouse's own HTTP/1.1 client (HTTP/2 upstreams use hyper's);
//! - [`exchange`]: one request sent and its response head awaited, with
//!   the retries that are safe.

pub mod connect;
pub mod exchange;
pub mod h1;
pub mod pool;
