//! Coverage-guided fuzz targets for every parser that meets the network:
//! HTTP/1.1 and HTTP/2 (heads, chunked bodies, HPACK, the connection's
//! state machine), HTTP/3 (frames on each kind of stream, QPACK) and its QUIC glue (tokens, connection IDs), WireGuard (messages, the device's receive path,
//! cookies, the UAPI, the router's vector pipeline), packets (the views, the router's rewrites, the L4
//! pipeline, session sync), the config file and the admin API's bodies.
//!
//! Each target is a module with `run(&[u8])`, which panics when a
//! property fails: more than "does not crash" wherever a property exists
//! (round trips, a reference implementation, invariants of the state
//! machines). The same function runs three ways: under AFL++ (`make fuzz`
//! builds `src/bin/<target>.rs` with `cargo afl`), on every file of
//! `corpus/<target>/` in `make test` (`tests/corpus.rs`), and on bounded
//! mutations of that corpus there too.

pub mod admin_json;
pub mod config;
pub mod h1_chunked;
pub mod h1_request;
pub mod h1_response;
pub mod h2_conn;
pub mod h2_frames;
pub mod h2_hpack;
pub mod h3_frames;
pub mod h3_quic;
pub mod input;
pub mod l4_plane;
pub mod l4_sync;
pub mod mutate;
pub mod packet;
pub mod wg_cookie;
pub mod wg_device;
pub mod wg_message;
pub mod wg_pair;
pub mod wg_router;
pub mod wg_uapi;

/// A target's entry: it panics when a property fails.
pub type Target = fn(&[u8]);

/// Every target: its name (its binary's and its corpus directory's) and
/// its function.
pub const TARGETS: [(&str, Target); 18] = [
    ("h1_request", h1_request::run),
    ("h1_chunked", h1_chunked::run),
    ("h1_response", h1_response::run),
    ("h2_hpack", h2_hpack::run),
    ("h2_frames", h2_frames::run),
    ("h2_conn", h2_conn::run),
    ("h3_frames", h3_frames::run),
    ("h3_quic", h3_quic::run),
    ("wg_message", wg_message::run),
    ("wg_device", wg_device::run),
    ("wg_cookie", wg_cookie::run),
    ("wg_uapi", wg_uapi::run),
    ("wg_router", wg_router::run),
    ("packet", packet::run),
    ("l4_plane", l4_plane::run),
    ("l4_sync", l4_sync::run),
    ("config", config::run),
    ("admin_json", admin_json::run),
];
