//! Upstream pools: choosing an endpoint, and the per-worker keep-alive
//! connection pool.
//!
//! An [`UpstreamPool`] is part of a snapshot: its endpoint list, weights and
//! Maglev table never change; only the scheduler cursor (behind an
//! uncontended lock) and the shared [`EndpointHealth`] states move.
//! A [`ConnPool`] belongs to one worker and holds that worker's idle
//! HTTP/1.1 connections per endpoint address.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use gatehouse_balance::hash::hash64;
use gatehouse_balance::maglev::DEFAULT_TABLE_SIZE;
use gatehouse_balance::{Backends, LeastConnections, MaglevTable, RoundRobin, SmoothWeighted};
use gatehouse_config::{Balance, HashKey, Upstream};
use http::HeaderMap;

use gatehouse_plane::health::{EndpointHealth, HealthRegistry, now_ms};

pub struct PoolEndpoint {
    pub addr: SocketAddr,
    pub weight: u32,
    pub health: Arc<EndpointHealth>,
}

enum Scheduler {
    RoundRobin(RoundRobin),
    Weighted(SmoothWeighted),
    LeastConnections(LeastConnections),
    Maglev,
}

pub struct UpstreamPool {
    pub cfg: Upstream,
    pub endpoints: Vec<PoolEndpoint>,
    scheduler: Mutex<Scheduler>,
    maglev: Option<MaglevTable>,
}

struct View<'a> {
    pool: &'a UpstreamPool,
    exclude: Option<usize>,
    now: u64,
}

impl Backends for View<'_> {
    fn len(&self) -> usize {
        self.pool.endpoints.len()
    }
    fn weight(&self, i: usize) -> u32 {
        self.pool.endpoints[i].weight
    }
    fn available(&self, i: usize) -> bool {
        Some(i) != self.exclude
            && self.pool.endpoints[i].weight > 0
            && self.pool.endpoints[i].health.available(self.now)
    }
    fn load(&self, i: usize) -> u64 {
        self.pool.endpoints[i].health.in_flight()
    }
}

impl UpstreamPool {
    pub fn build(
        cfg: &Upstream,
        registry: &HealthRegistry,
    ) -> Result<UpstreamPool, gatehouse_balance::maglev::MaglevError> {
        let endpoints: Vec<PoolEndpoint> = cfg
            .endpoints
            .iter()
            .filter_map(|e| {
                let addr = e.address?;
                Some(PoolEndpoint { addr, weight: e.weight, health: registry.get(&cfg.name, addr) })
            })
            .collect();
        let maglev = if cfg.balance == Balance::Maglev {
            let names: Vec<(String, u32)> = endpoints.iter().map(|e| (e.addr.to_string(), e.weight)).collect();
            Some(MaglevTable::build(&names, DEFAULT_TABLE_SIZE)?)
        } else {
            None
        };
        let scheduler = match cfg.balance {
            Balance::RoundRobin => Scheduler::RoundRobin(RoundRobin::default()),
            Balance::WeightedRoundRobin => Scheduler::Weighted(SmoothWeighted::default()),
            Balance::LeastConnections => Scheduler::LeastConnections(LeastConnections::default()),
            Balance::Maglev => Scheduler::Maglev,
        };
        Ok(UpstreamPool { cfg: cfg.clone(), endpoints, scheduler: Mutex::new(scheduler), maglev })
    }

    /// The Maglev key hash for a request, if this pool hashes.
    pub fn request_hash(&self, headers: &HeaderMap, client: IpAddr) -> Option<u64> {
        self.maglev.as_ref()?;
        let client_hash = || match client {
            IpAddr::V4(a) => hash64(0, &a.octets()),
            IpAddr::V6(a) => hash64(0, &a.octets()),
        };
        Some(match &self.cfg.hash_key {
            HashKey::ClientIp => client_hash(),
            HashKey::Header(name) => headers.get(name.as_str()).map_or_else(client_hash, |v| hash64(0, v.as_bytes())),
            HashKey::Cookie(name) => cookie(headers, name).map_or_else(client_hash, |v| hash64(0, v)),
        })
    }

    /// Picks an available endpoint, never `exclude` (the one that just
    /// failed). `None`: no endpoint is available.
    pub fn pick(&self, hash: Option<u64>, exclude: Option<usize>) -> Option<usize> {
        let view = View { pool: self, exclude, now: now_ms() };
        if let (Some(table), Some(h)) = (&self.maglev, hash) {
            return table.pick(h, &view);
        }
        let mut s = self.scheduler.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *s {
            Scheduler::RoundRobin(rr) => rr.pick(&view),
            Scheduler::Weighted(w) => w.pick(&view),
            Scheduler::LeastConnections(lc) => lc.pick(&view),
            Scheduler::Maglev => None,
        }
    }
}

/// The value of cookie `name` in the request's Cookie headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers.get_all(http::header::COOKIE).iter().find_map(|v| {
        v.as_bytes().split(|&b| b == b';').find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|&b| b == b'=')?;
            (&pair[..eq] == name.as_bytes()).then(|| &pair[eq + 1..])
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_config::Endpoint;

    fn upstream(balance: Balance, weights: &[u32]) -> Upstream {
        Upstream {
            name: "u".into(),
            balance,
            endpoints: weights
                .iter()
                .enumerate()
                .map(|(i, &w)| Endpoint {
                    address: Some(SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16))),
                    weight: w,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn weighted_pool_follows_weights_and_skips_excluded() {
        let reg = HealthRegistry::default();
        let pool = UpstreamPool::build(&upstream(Balance::WeightedRoundRobin, &[1, 3]), &reg).expect("pool");
        let mut counts = [0; 2];
        for _ in 0..400 {
            counts[pool.pick(None, None).expect("pick")] += 1;
        }
        assert_eq!(counts, [100, 300]);
        assert_eq!(pool.pick(None, Some(1)), Some(0));
    }

    #[test]
    fn maglev_pool_hashes_headers_and_cookies() {
        let reg = HealthRegistry::default();
        let mut cfg = upstream(Balance::Maglev, &[1, 1, 1, 1]);
        cfg.hash_key = HashKey::Cookie("session".into());
        let pool = UpstreamPool::build(&cfg, &reg).expect("pool");
        let client: IpAddr = "10.0.0.1".parse().expect("ip");
        let mut h = HeaderMap::new();
        h.insert(http::header::COOKIE, "a=1; session=abc; b=2".parse().expect("v"));
        let hash = pool.request_hash(&h, client);
        assert_eq!(hash, Some(hash64(0, b"abc")));
        let first = pool.pick(hash, None);
        for _ in 0..10 {
            assert_eq!(pool.pick(hash, None), first);
        }
        // Without the cookie, the client address is the key.
        assert_eq!(pool.request_hash(&HeaderMap::new(), client), Some(hash64(0, &[10, 0, 0, 1])));
    }

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut h = HeaderMap::new();
        h.append(http::header::COOKIE, "xsession=1".parse().expect("v"));
        h.append(http::header::COOKIE, "session=2".parse().expect("v"));
        assert_eq!(cookie(&h, "session"), Some(&b"2"[..]));
        assert_eq!(cookie(&h, "other"), None);
    }
}
