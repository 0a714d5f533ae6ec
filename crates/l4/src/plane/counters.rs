//! What one core counts: packets, bytes and sessions per service and real
//! server, and every frame dropped, by reason.

use gatehouse_wire::packet::Malformed;

/// Why a frame was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DropReason {
    Malformed(Malformed),
    /// Addressed to no service (and not a reply of a session).
    NoService,
    /// A TCP segment other than SYN for a session this core does not have.
    NoSession,
    NoHealthyServer,
    TableFull,
    /// FNAT: no free local port on this core.
    PortsExhausted,
    TtlExceeded,
    /// ICMP, or a change of address family, which this pipeline does not do.
    Unsupported,
    /// An ACK to a SYN-proxied service without a session, whose cookie
    /// is not good (forged, or too old).
    BadCookie,
    /// A client's segment while the SYN proxy opens its connection to the
    /// real server (the first one's data is kept and sent on).
    SynProxyPending,
}

impl DropReason {
    /// Every reason, in counter order.
    pub fn all() -> impl Iterator<Item = DropReason> {
        Malformed::ALL.into_iter().map(DropReason::Malformed).chain([
            DropReason::NoService,
            DropReason::NoSession,
            DropReason::NoHealthyServer,
            DropReason::TableFull,
            DropReason::PortsExhausted,
            DropReason::TtlExceeded,
            DropReason::Unsupported,
            DropReason::BadCookie,
            DropReason::SynProxyPending,
        ])
    }

    /// Its slot in [`Counters::drops`].
    pub fn index(self) -> usize {
        let base = Malformed::ALL.len();
        match self {
            DropReason::Malformed(m) => Malformed::ALL.iter().position(|x| *x == m).unwrap_or(0),
            DropReason::NoService => base,
            DropReason::NoSession => base + 1,
            DropReason::NoHealthyServer => base + 2,
            DropReason::TableFull => base + 3,
            DropReason::PortsExhausted => base + 4,
            DropReason::TtlExceeded => base + 5,
            DropReason::Unsupported => base + 6,
            DropReason::BadCookie => base + 7,
            DropReason::SynProxyPending => base + 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DropReason::Malformed(m) => m.name(),
            DropReason::NoService => "no_service",
            DropReason::NoSession => "no_session",
            DropReason::NoHealthyServer => "no_healthy_server",
            DropReason::TableFull => "table_full",
            DropReason::PortsExhausted => "ports_exhausted",
            DropReason::TtlExceeded => "ttl_exceeded",
            DropReason::Unsupported => "unsupported",
            DropReason::BadCookie => "syn_cookie_failed",
            DropReason::SynProxyPending => "syn_proxy_pending",
        }
    }
}

/// Drop reasons counted.
pub const DROP_KINDS: usize = Malformed::ALL.len() + 9;

/// Per-service and per-real-server counters of one core.
#[derive(Clone, Debug, Default)]
pub struct ServiceCounters {
    pub packets: u64,
    pub bytes: u64,
    pub sessions_total: u64,
    pub sessions_active: u64,
    /// TCP resets sent for sessions of a real server that went down.
    pub resets: u64,
    /// SYN cookies sent (SYN-ACKs of the SYN proxy), ACKs whose cookie was
    /// good (a session opened), and ACKs whose cookie was not.
    pub syn_cookies_sent: u64,
    pub syn_cookies_valid: u64,
    pub syn_cookies_failed: u64,
    pub per_real_packets: Vec<u64>,
    pub per_real_active: Vec<u64>,
}

/// Per-SNAT-rule counters of one core.
#[derive(Clone, Debug, Default)]
pub struct SnatCounters {
    pub sessions_total: u64,
    pub packets_out: u64,
    pub packets_in: u64,
}

#[derive(Clone, Debug)]
pub struct Counters {
    pub services: Vec<ServiceCounters>,
    /// By SNAT rule (grown as rules are used).
    pub snat: Vec<SnatCounters>,
    /// By [`DropReason::index`].
    pub drops: [u64; DROP_KINDS],
    pub passed: u64,
    /// ARP and neighbour discovery answers sent.
    pub answered: u64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters { services: Vec::new(), snat: Vec::new(), drops: [0; DROP_KINDS], passed: 0, answered: 0 }
    }
}

impl Counters {
    pub fn dropped(&self, d: DropReason) -> u64 {
        self.drops[d.index()]
    }

    /// The SNAT counters of rule `rule` (a session's service field may be
    /// given: its rule bits count), grown on first use.
    pub(super) fn snat_mut(&mut self, rule: u16) -> &mut SnatCounters {
        let r = usize::from(rule & super::snat_rules::RULE_MASK);
        if self.snat.len() <= r {
            self.snat.resize(r + 1, SnatCounters::default());
        }
        &mut self.snat[r]
    }
}
