//! Why the device drops a datagram or a packet, and the names its
//! counters go by.

use crate::cookie::CookieError;
use crate::handshake::HandshakeError;
use crate::messages::Malformed;
use crate::transport::TransportError;

/// Why a datagram or a packet was dropped (each is counted by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    Malformed(Malformed),
    /// A handshake message that did not open or whose mac1 is wrong.
    Handshake(HandshakeError),
    /// A cookie reply we did not ask for, or that did not open.
    Cookie(CookieError),
    /// An initiation from a key that is no peer of ours.
    UnknownPeer,
    /// An initiation whose timestamp is not newer than the last one.
    ReplayedInitiation,
    /// Initiations from one peer too close together.
    Flood,
    /// Under load, a source sending handshakes faster than its share.
    RateLimited,
    /// A message for an index we do not have (or no longer have).
    UnknownIndex,
    Transport(TransportError),
    /// A session past its time.
    Expired,
    /// A decrypted packet whose source is not the peer's (allowed IPs).
    NotAllowedSource,
    /// A decrypted packet that is not IPv4 or IPv6.
    NotIp,
    /// A packet to send whose destination no peer has.
    NoRoute,
    /// A peer with no endpoint to send to.
    NoEndpoint,
    /// A packet waiting for a handshake that did not come in time.
    HandshakeTimeout,
}

impl DropReason {
    /// Every reason's label, in [`DropReason::index`] order: the slots of
    /// counters kept per reason.
    pub const NAMES: [&'static str; 24] = [
        "short",
        "unknown_type",
        "reserved_bytes",
        "bad_length",
        "bad_mac1",
        "handshake_decrypt",
        "weak_key",
        "unknown_receiver",
        "cookie_unexpected",
        "cookie_decrypt",
        "unknown_peer",
        "replayed_initiation",
        "initiation_flood",
        "rate_limited",
        "unknown_index",
        "decrypt",
        "replay",
        "keys_exhausted",
        "expired",
        "not_allowed_source",
        "not_ip",
        "no_route",
        "no_endpoint",
        "handshake_timeout",
    ];

    /// The reason's slot in [`DropReason::NAMES`]: a counter array index,
    /// with no look-up by name on the drop path.
    pub fn index(self) -> usize {
        match self {
            DropReason::Malformed(Malformed::Short) => 0,
            DropReason::Malformed(Malformed::UnknownType) => 1,
            DropReason::Malformed(Malformed::Reserved) => 2,
            DropReason::Malformed(Malformed::BadLength) => 3,
            DropReason::Handshake(HandshakeError::Mac1) => 4,
            DropReason::Handshake(HandshakeError::Decrypt) => 5,
            DropReason::Handshake(HandshakeError::WeakKey) => 6,
            DropReason::Handshake(HandshakeError::UnknownReceiver) => 7,
            DropReason::Cookie(CookieError::Unexpected) => 8,
            DropReason::Cookie(CookieError::Decrypt) => 9,
            DropReason::UnknownPeer => 10,
            DropReason::ReplayedInitiation => 11,
            DropReason::Flood => 12,
            DropReason::RateLimited => 13,
            DropReason::UnknownIndex => 14,
            DropReason::Transport(TransportError::Decrypt) => 15,
            DropReason::Transport(TransportError::Replay) => 16,
            DropReason::Transport(TransportError::Exhausted) => 17,
            DropReason::Expired => 18,
            DropReason::NotAllowedSource => 19,
            DropReason::NotIp => 20,
            DropReason::NoRoute => 21,
            DropReason::NoEndpoint => 22,
            DropReason::HandshakeTimeout => 23,
        }
    }

    /// The label for metrics.
    pub fn name(self) -> &'static str {
        Self::NAMES[self.index()]
    }

    /// The reason's slot in [`PeerStats::drops`], for the reasons a peer
    /// is known for.
    pub fn peer_index(self) -> Option<usize> {
        match self {
            DropReason::Transport(TransportError::Replay) => Some(0),
            DropReason::Transport(TransportError::Decrypt) => Some(1),
            DropReason::Expired => Some(2),
            DropReason::NotAllowedSource => Some(3),
            DropReason::NotIp => Some(4),
            DropReason::ReplayedInitiation => Some(5),
            DropReason::Flood => Some(6),
            DropReason::Handshake(HandshakeError::Decrypt) => Some(7),
            DropReason::HandshakeTimeout => Some(8),
            DropReason::Transport(TransportError::Exhausted) => Some(9),
            _ => None,
        }
    }
}

/// The drop reasons a peer is known for, as counted in [`super::PeerStats::drops`].
pub const PEER_DROP_NAMES: [&str; 10] = [
    "replay",
    "decrypt",
    "expired",
    "not_allowed_source",
    "not_ip",
    "replayed_initiation",
    "initiation_flood",
    "handshake_decrypt",
    "handshake_timeout",
    "keys_exhausted",
];
