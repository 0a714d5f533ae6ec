//! Schedulers shared by the L4 and L7 planes.
//!
//! Each scheduler picks the index of one backend from a [`Backends`] view
//! that says how many backends there are, their weights, which are available
//! right now (healthy, not excluded by a retry) and their current load. The
//! schedulers own only their own small state (a cursor, current weights, a
//! lookup table); they never look at health or sockets themselves, which is
//! what lets L4 and L7 share them.

#![forbid(unsafe_code)]

pub mod hash;
pub mod maglev;

pub use maglev::MaglevTable;

/// What a scheduler may know about the backends it picks from.
pub trait Backends {
    fn len(&self) -> usize;
    fn weight(&self, i: usize) -> u32;
    /// Healthy and not excluded; only available backends are picked.
    fn available(&self, i: usize) -> bool;
    /// Requests or sessions in flight, for least connections.
    fn load(&self, i: usize) -> u64 {
        let _ = i;
        0
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Plain round robin over available backends, ignoring weights.
#[derive(Debug, Default, Clone)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    pub fn pick(&mut self, b: &impl Backends) -> Option<usize> {
        let n = b.len();
        for step in 0..n {
            let i = (self.next + step) % n;
            if b.available(i) && b.weight(i) > 0 {
                self.next = (i + 1) % n;
                return Some(i);
            }
        }
        None
    }
}

/// Smooth weighted round robin (the NGINX algorithm): over any window of
/// `sum(weights)` picks each backend is chosen exactly `weight` times, and the
/// picks of a heavy backend are spread out rather than bunched.
#[derive(Debug, Default, Clone)]
pub struct SmoothWeighted {
    current: Vec<i64>,
}

impl SmoothWeighted {
    pub fn pick(&mut self, b: &impl Backends) -> Option<usize> {
        let n = b.len();
        if self.current.len() != n {
            self.current = vec![0; n];
        }
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for i in 0..n {
            let w = i64::from(b.weight(i));
            if w == 0 || !b.available(i) {
                continue;
            }
            self.current[i] += w;
            total += w;
            if best.is_none_or(|j| self.current[i] > self.current[j]) {
                best = Some(i);
            }
        }
        let chosen = best?;
        self.current[chosen] -= total;
        Some(chosen)
    }
}

/// Least connections, weighted: the available backend with the lowest
/// `load / weight`. Ties go to the next backend after the previous pick, so
/// an idle pool is still spread evenly.
#[derive(Debug, Default, Clone)]
pub struct LeastConnections {
    next: usize,
}

impl LeastConnections {
    pub fn pick(&mut self, b: &impl Backends) -> Option<usize> {
        let n = b.len();
        let mut best: Option<(usize, u64, u64)> = None; // (index, load, weight)
        for step in 0..n {
            let i = (self.next + step) % n;
            let w = u64::from(b.weight(i));
            if w == 0 || !b.available(i) {
                continue;
            }
            let load = b.load(i);
            // load_i / w_i < load_b / w_b  <=>  load_i * w_b < load_b * w_i
            let better = match best {
                None => true,
                Some((_, bl, bw)) => u128::from(load) * u128::from(bw) < u128::from(bl) * u128::from(w),
            };
            if better {
                best = Some((i, load, w));
            }
        }
        let (chosen, _, _) = best?;
        self.next = (chosen + 1) % n;
        Some(chosen)
    }
}

#[cfg(test)]
pub(crate) mod testutil {
    use super::Backends;

    pub struct Pool {
        pub weights: Vec<u32>,
        pub down: Vec<bool>,
        pub loads: Vec<u64>,
    }

    impl Pool {
        pub fn new(weights: &[u32]) -> Self {
            Pool { weights: weights.to_vec(), down: vec![false; weights.len()], loads: vec![0; weights.len()] }
        }
    }

    impl Backends for Pool {
        fn len(&self) -> usize {
            self.weights.len()
        }
        fn weight(&self, i: usize) -> u32 {
            self.weights[i]
        }
        fn available(&self, i: usize) -> bool {
            !self.down[i]
        }
        fn load(&self, i: usize) -> u64 {
            self.loads[i]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::Pool;
    use super::*;

    #[test]
    fn round_robin_cycles_and_skips_unavailable() {
        let mut pool = Pool::new(&[1, 1, 1]);
        let mut rr = RoundRobin::default();
        let picks: Vec<_> = (0..6).filter_map(|_| rr.pick(&pool)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        pool.down[1] = true;
        let picks: Vec<_> = (0..4).filter_map(|_| rr.pick(&pool)).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
        pool.down = vec![true; 3];
        assert_eq!(rr.pick(&pool), None);
    }

    #[test]
    fn smooth_weighted_matches_the_nginx_sequence() {
        // NGINX's documented example: weights a=5, b=1, c=1 give a a b a c a a.
        let pool = Pool::new(&[5, 1, 1]);
        let mut s = SmoothWeighted::default();
        let picks: Vec<_> = (0..7).filter_map(|_| s.pick(&pool)).collect();
        assert_eq!(picks, [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn smooth_weighted_is_exact_over_a_window() {
        let pool = Pool::new(&[3, 1, 6, 0]);
        let mut s = SmoothWeighted::default();
        let mut counts = [0u32; 4];
        for _ in 0..10_000 {
            counts[s.pick(&pool).expect("pick")] += 1;
        }
        assert_eq!(counts, [3000, 1000, 6000, 0]);
    }

    #[test]
    fn smooth_weighted_redistributes_when_one_is_down() {
        let mut pool = Pool::new(&[1, 1, 2]);
        pool.down[2] = true;
        let mut s = SmoothWeighted::default();
        let mut counts = [0u32; 3];
        for _ in 0..1000 {
            counts[s.pick(&pool).expect("pick")] += 1;
        }
        assert_eq!(counts, [500, 500, 0]);
    }

    #[test]
    fn least_connections_prefers_the_least_loaded_per_weight() {
        let mut pool = Pool::new(&[1, 2, 1]);
        pool.loads = vec![3, 4, 1];
        let mut lc = LeastConnections::default();
        assert_eq!(lc.pick(&pool), Some(2));
        pool.loads = vec![3, 4, 3];
        // 4/2 = 2 is lower than 3/1.
        assert_eq!(lc.pick(&pool), Some(1));
        pool.down[1] = true;
        assert!(matches!(lc.pick(&pool), Some(0) | Some(2)));
    }

    #[test]
    fn least_connections_spreads_ties() {
        let pool = Pool::new(&[1, 1, 1]);
        let mut lc = LeastConnections::default();
        let picks: Vec<_> = (0..3).filter_map(|_| lc.pick(&pool)).collect();
        assert_eq!(picks, [0, 1, 2]);
    }
}
