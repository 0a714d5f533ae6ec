//! Each core's FNAT local ports: a core takes only the ports `p` with
//! `p % cores == core` of every local address, so the XDP program steers a
//! reply (by its destination port) to the core that owns its session.

use super::Counters;
use crate::session::{Addr, Session};

/// First FNAT source port; below are left to the host.
pub const FNAT_PORTS: (u16, u16) = (1024, u16::MAX);

/// Free FNAT ports of one local address on this core: the ports `p` with
/// `p % cores == core`, so that the XDP program can steer replies (by their
/// destination port) to the core that owns the session.
pub(super) struct PortPool {
    pub(super) free: Vec<u16>,
    /// Session number + 1 by port; 0: free.
    pub(super) owner: Vec<u32>,
}

impl PortPool {
    /// The ports `first..=last` of this core.
    pub(super) fn new(core: u16, cores: u16, (first, last): (u16, u16)) -> PortPool {
        let free = (first..=last).rev().filter(|p| p % cores == core).collect();
        PortPool { free, owner: vec![0; 65536] }
    }

    /// A free port. A port a synced session took over is still on the free
    /// list (taking it off would cost a search): it is skipped, and goes
    /// back on when that session ends.
    pub(super) fn take(&mut self) -> Option<u16> {
        while let Some(p) = self.free.pop() {
            if self.owner[usize::from(p)] == 0 {
                return Some(p);
            }
        }
        None
    }
}

/// Frees what an ended session held.
pub(super) fn release<A: Addr>(ports: &mut [PortPool], counters: &mut Counters, s: &Session<A>) {
    if s.flags & crate::session::COPY != 0 {
        return;
    }
    if s.local != u16::MAX
        && let Some(p) = ports.get_mut(usize::from(s.local))
    {
        p.owner[usize::from(s.local_port)] = 0;
        p.free.push(s.local_port);
    }
    if let Some(sc) = counters.services.get_mut(usize::from(s.service)) {
        sc.sessions_active = sc.sessions_active.saturating_sub(1);
        if let Some(a) = sc.per_real_active.get_mut(usize::from(s.real)) {
            *a = a.saturating_sub(1);
        }
    }
}
