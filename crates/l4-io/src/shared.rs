//! What the L4 runtime's threads share: the ports (one per interface)
//! with their published plane and next hops, every worker's counters, the
//! running config and the active/standby part.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use gatehouse_config::L4;
use gatehouse_l4::plane::{Counters, Plane};
use gatehouse_l4::sync::Record;

use crate::ha::Ha;
use crate::steer::Steering;
use gatehouse_link::nexthop::NextHops;

/// Session timeouts count in ticks of this.
pub const TICK: Duration = Duration::from_secs(1);
/// How often the control thread looks at neighbours, routes and health.
pub(crate) const CONTROL_PERIOD: Duration = Duration::from_millis(200);

/// Whether a real server (service name, address) is healthy.
pub type HealthFn = Arc<dyn Fn(&str, SocketAddr) -> bool + Send + Sync>;

/// Per-worker figures beyond the plane's own counters.
#[derive(Clone, Debug, Default)]
pub struct IoCounters {
    pub rx_packets: u64,
    pub tx_packets: u64,
    /// Forwarded frames whose next hop's MAC is not known yet.
    pub no_neighbour: u64,
    pub no_route: u64,
    /// The transmit ring was full.
    pub tx_full: u64,
}

#[derive(Clone, Debug, Default)]
pub struct WorkerStats {
    pub interface: String,
    pub queue: u32,
    pub counters: Counters,
    pub io: IoCounters,
    pub sessions: usize,
}

pub(crate) struct Port {
    pub(crate) name: String,
    pub(crate) ifindex: u32,
    pub(crate) mac: [u8; 6],
    pub(crate) workers: u16,
    pub(crate) plane: ArcSwap<Plane>,
    pub(crate) hops: ArcSwap<NextHops>,
    pub(crate) misses: Mutex<Vec<IpAddr>>,
    /// The XDP program (AF_XDP only); taken out (detached) by `stop`.
    pub(crate) steering: Mutex<Option<Steering>>,
}

pub(crate) struct Shared {
    pub(crate) ports: Vec<Arc<Port>>,
    pub(crate) stats: Vec<Mutex<WorkerStats>>,
    pub(crate) stop: AtomicBool,
    pub(crate) cfg: Mutex<L4>,
    pub(crate) health: HealthFn,
    /// Active/standby, when `l4.ha` is configured.
    pub(crate) ha: Option<Arc<Ha>>,
    /// A second round of announcements after a promotion.
    pub(crate) reannounce: Mutex<Option<Instant>>,
    /// Set before `stop` when the sessions go to a new process: each
    /// worker, as it stops, adds those it owns to `exported`.
    pub(crate) export: AtomicBool,
    pub(crate) exported: Mutex<Vec<Record>>,
    /// And the frames its AF_XDP socket held unused, for the new process
    /// to adopt the socket.
    pub(crate) exported_frames: Mutex<Vec<crate::takeover::Frames>>,
}

impl Shared {
    /// Whether this node answers for its VIPs and local addresses now.
    pub(crate) fn owns(&self) -> bool {
        self.ha.as_ref().is_none_or(|h| h.is_master())
    }
}
