//! What a device reports of its peers: their traffic and settings, for
//! `wg show`, `/status` and the metrics.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use super::PEER_DROP_NAMES;
#[cfg(doc)]
use super::REKEY_ATTEMPT_TIME;
use crate::crypto::KEY_LEN;

/// A peer's traffic, as `wg show` and the metrics report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Transport datagrams sent and their bytes (headers included).
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Transport datagrams received that opened, and their bytes.
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Handshakes completed (either side starting).
    pub handshakes: u64,
    /// Initiations sent (first tries and retries).
    pub initiations: u64,
    /// Handshake attempts given up after [`REKEY_ATTEMPT_TIME`].
    pub handshake_failures: u64,
    /// What was dropped of this peer's, by [`PEER_DROP_NAMES`].
    pub drops: [u64; PEER_DROP_NAMES.len()],
}

/// What the device knows of a peer, for `wg show` and `/status`.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub public: [u8; KEY_LEN],
    pub psk: Option<[u8; KEY_LEN]>,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<(IpAddr, u8)>,
    /// Since the Unix epoch, when the last handshake completed.
    pub last_handshake: Option<Duration>,
    pub stats: PeerStats,
}
