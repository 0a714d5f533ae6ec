//! The WireGuard plane: [`gatehouse_wg`]'s sans-IO device on real
//! interfaces. Per interface, one worker per TUN queue with its own
//! `SO_REUSEPORT` socket moves packets in batches and seals and opens them
//! with [`gatehouse_mbx::aead`] across packets; a control thread answers
//! handshakes and runs the timers; the UAPI socket serves wireguard-tools.
//!
//! Datagrams move through [`gatehouse_udp`], shared with the QUIC plane.
//! `unsafe` is confined to [`sys`] (eventfd), that crate and
//! [`gatehouse_link`] (TUN, rtnetlink).

mod control;
pub mod handover;
pub mod interface;
mod link;
pub mod plane;
pub mod router;
pub mod shared;
pub mod sys;
pub mod uapi_server;
pub mod worker;

pub use plane::WireGuard;
