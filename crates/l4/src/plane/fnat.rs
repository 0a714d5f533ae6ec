//! Each core's FNAT local ports: a core takes only the ports `p` with
//! `p % cores == core` of every local address, so the XDP program steers a
//! reply (by its destination port) to the core that owns its session.

use super::Counters;
use crate::session::{Addr, Session};

/// First FNAT source port; below are left to the host.
pub const FNAT_PORTS: (u16, u16) = (1024, u16::MAX);

/// Free FNAT ports of one local address on this core: the ports `p` with
/// `p % cores == core`, so that the XDP program can steer replies (by their
/// destination port) to the core that owns the session. Ports given back
/// are taken again first (last in, first out), then the ones never used,
/// lowest first; those are a cursor rather than a list, so a pool costs
/// nothing to make (a worker is made at every start and reload).
pub(super) struct PortPool {
    /// Ports given back.
    returned: Vec<u16>,
    /// The next port never used, the step between this core's ports and
    /// the end of the range (one past the last port).
    next: u32,
    step: u32,
    end: u32,
    /// Session number + 1 by port; 0: free.
    pub(super) owner: Vec<u32>,
}

impl PortPool {
    /// The ports `first..=last` of this core.
    pub(super) fn new(core: u16, cores: u16, (first, last): (u16, u16)) -> PortPool {
        let (core, step) = (u32::from(core), u32::from(cores.max(1)));
        // The first port at or after `first` that is `core` modulo `cores`
        // (none if `core` is not below `cores`).
        let next =
            if core < step { u32::from(first) + (core + step - u32::from(first) % step) % step } else { u32::MAX };
        PortPool { returned: Vec::new(), next, step, end: u32::from(last) + 1, owner: vec![0; 65536] }
    }

    /// A free port. A port a synced session took over may still be free
    /// here (taking it off would cost a search): it is skipped, and comes
    /// back when that session ends.
    pub(super) fn take(&mut self) -> Option<u16> {
        while let Some(p) = self.returned.pop().or_else(|| self.fresh()) {
            if self.owner[usize::from(p)] == 0 {
                return Some(p);
            }
        }
        None
    }

    fn fresh(&mut self) -> Option<u16> {
        let p = u16::try_from(self.next).ok().filter(|_| self.next < self.end)?;
        self.next += self.step;
        Some(p)
    }

    /// Gives a port back.
    pub(super) fn put_back(&mut self, port: u16) {
        self.returned.push(port);
    }

    /// Whether a port may be free (one a synced session took is counted).
    pub(super) fn has_free(&self) -> bool {
        !self.returned.is_empty() || self.next < self.end
    }

    /// The ports free, counted as [`PortPool::has_free`] does.
    #[cfg(test)]
    pub(super) fn free_count(&self) -> usize {
        self.returned.len() + (self.end.saturating_sub(self.next)).div_ceil(self.step) as usize
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
        p.put_back(s.local_port);
    }
    if let Some(sc) = counters.services.get_mut(usize::from(s.service)) {
        sc.sessions_active = sc.sessions_active.saturating_sub(1);
        if let Some(a) = sc.per_real_active.get_mut(usize::from(s.real)) {
            *a = a.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PortPool;

    fn drain(pool: &mut PortPool) -> Vec<u16> {
        std::iter::from_fn(|| pool.take()).collect()
    }

    #[test]
    fn a_core_gets_exactly_its_ports_lowest_first() {
        for cores in [1u16, 2, 3, 7, 16] {
            for core in 0..cores + 1 {
                for (first, last) in [(1024, u16::MAX), (0, 100), (5, 5), (6, 5), (65530, u16::MAX)] {
                    let want: Vec<u16> = (first..=last).filter(|p| p % cores == core).collect();
                    let mut pool = PortPool::new(core, cores, (first, last));
                    assert_eq!(pool.free_count(), want.len());
                    assert_eq!(pool.has_free(), !want.is_empty());
                    assert_eq!(drain(&mut pool), want, "core {core} of {cores}, {first}..={last}");
                    assert!(!pool.has_free());
                }
            }
        }
    }

    #[test]
    fn ports_given_back_come_first_and_taken_ports_are_skipped() {
        let mut pool = PortPool::new(1, 2, (1024, 1040));
        assert_eq!((pool.take(), pool.take()), (Some(1025), Some(1027)));
        pool.put_back(1025);
        assert_eq!(pool.take(), Some(1025));
        // A synced session took 1029 and 1031.
        pool.owner[1029] = 5;
        pool.owner[1031] = 6;
        assert_eq!(pool.take(), Some(1033));
        assert_eq!(drain(&mut pool), vec![1035, 1037, 1039]);
    }
}
