//! WireGuard, sans I/O: bytes and the time in, bytes out. No sockets, no
//! clock, no `unsafe`. The only Gatehouse crate below it is `wire`, for the
//! inner packets' IP headers.
//!
//! - [`allowed_ips`]: cryptokey routing, longest prefix first;
//! - [`crypto`]: the protocol's primitives, secrets zeroed on drop;
//! - [`messages`]: the four message types by field, and the parser that
//!   sorts a datagram (or refuses it);
//! - [`handshake`]: Noise_IKpsk2, step by step;
//! - [`cookie`]: cookie replies and mac2, what a responder under load asks
//!   for before doing any Diffie-Hellman work;
//! - [`device`]: an interface: peers, session indexes, the handshake and
//!   transport rules and the protocol's timers;
//! - [`ratelimit`]: handshakes per source under load, and load itself;
//! - [`uapi`]: the text protocol `wg` speaks to userspace implementations;
//! - [`transport`]: sealing and opening data with a session's keys, behind
//!   an RFC 6479 replay window.
//!
//! Checked against known-answer vectors (BLAKE2s, ChaCha20-Poly1305,
//! X25519) and, in memory, against boringtun's implementation both ways.

#![forbid(unsafe_code)]

pub mod allowed_ips;
pub mod cookie;
pub mod crypto;
pub mod device;
pub mod handoff;
pub mod handshake;
pub mod messages;
pub mod ratelimit;
pub mod transport;
pub mod uapi;

#[cfg(test)]
mod interop;
