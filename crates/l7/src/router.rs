//! Route matching.
//!
//! The most specific match wins, decided in this order:
//!
//! 1. Host: routes naming the exact host, then routes with the longest
//!    matching `*.suffix` wildcard, then routes with no host condition.
//!    A host tier with no matching route falls through to the next tier.
//! 2. Within a tier, path: an exact `path` beats any prefix; a longer
//!    `path_prefix` beats a shorter one.
//! 3. Then the route with more header conditions, then one with a method
//!    condition over one without.
//! 4. Then the order of the routes in the config file.
//!
//! Host comparison ignores case and the port; a routing wildcard
//! `*.example.com` matches any name ending in `.example.com` (one label or
//! more), unlike a certificate wildcard, which matches one label only.

use std::collections::HashMap;

use gatehouse_config::{HeaderMatch, Route};
use http::{HeaderMap, Method};

#[derive(Debug, Clone, PartialEq, Eq)]
enum PathMatch {
    Exact(String),
    Prefix(String),
}

#[derive(Debug, Clone)]
struct Candidate {
    route: usize,
    path: PathMatch,
    methods: Vec<Method>,
    headers: Vec<HeaderMatch>,
    /// Bit i set: the route serves listener i. All bits set: every listener.
    listeners: u64,
}

impl Candidate {
    /// Sort key: larger is more specific.
    fn specificity(&self) -> (u8, usize, usize, u8) {
        let (exact, len) = match &self.path {
            PathMatch::Exact(p) => (1, p.len()),
            PathMatch::Prefix(p) => (0, p.len()),
        };
        (exact, len, self.headers.len(), u8::from(!self.methods.is_empty()))
    }

    fn matches(&self, listener: usize, method: &Method, path: &str, headers: &HeaderMap) -> bool {
        if listener < 64 && self.listeners & (1 << listener) == 0 {
            return false;
        }
        let path_ok = match &self.path {
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
        };
        path_ok
            && (self.methods.is_empty() || self.methods.contains(method))
            && self.headers.iter().all(|h| header_matches(h, headers))
    }
}

pub fn header_matches(h: &HeaderMatch, headers: &HeaderMap) -> bool {
    let mut values = headers.get_all(h.name.as_str()).iter().peekable();
    match &h.value {
        None => values.peek().is_some(),
        Some(want) => values.any(|v| v.as_bytes() == want.as_bytes()),
    }
}

#[derive(Debug, Default)]
pub struct Router {
    exact: HashMap<String, Vec<Candidate>>,
    /// (suffix including the leading dot, candidates), longest suffix first.
    wildcard: Vec<(String, Vec<Candidate>)>,
    any_host: Vec<Candidate>,
}

impl Router {
    /// `listener_index` maps a listener name to its index (for route.listeners).
    pub fn build(routes: &[Route], listener_index: &dyn Fn(&str) -> Option<usize>) -> Router {
        let mut r = Router::default();
        let mut wild: HashMap<String, Vec<Candidate>> = HashMap::new();
        for (i, route) in routes.iter().enumerate() {
            let m = &route.matches;
            let path = match (&m.path, &m.path_prefix) {
                (Some(p), _) => PathMatch::Exact(p.clone()),
                (None, Some(p)) => PathMatch::Prefix(p.clone()),
                (None, None) => PathMatch::Prefix("/".into()),
            };
            let listeners = if route.listeners.is_empty() {
                u64::MAX
            } else {
                route
                    .listeners
                    .iter()
                    .filter_map(|l| listener_index(l))
                    .filter(|&i| i < 64)
                    .fold(0, |acc, i| acc | 1 << i)
            };
            let cand = Candidate {
                route: i,
                path,
                methods: m.methods.iter().filter_map(|s| Method::from_bytes(s.as_bytes()).ok()).collect(),
                headers: m.headers.clone(),
                listeners,
            };
            if m.hosts.is_empty() {
                r.any_host.push(cand);
                continue;
            }
            for h in &m.hosts {
                let h = h.to_ascii_lowercase();
                match h.strip_prefix('*') {
                    Some(suffix) => wild.entry(suffix.to_string()).or_default().push(cand.clone()),
                    None => r.exact.entry(h).or_default().push(cand.clone()),
                }
            }
        }
        let sort = |v: &mut Vec<Candidate>| {
            // Stable sort keeps config order among equals.
            v.sort_by_key(|c| std::cmp::Reverse(c.specificity()));
        };
        r.exact.values_mut().for_each(sort);
        sort(&mut r.any_host);
        r.wildcard = wild.into_iter().collect();
        r.wildcard.iter_mut().for_each(|(_, v)| sort(v));
        r.wildcard.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        r
    }

    /// The index of the route for a request, or `None` (404).
    /// `host` must already be lower-case and without a port.
    pub fn find(&self, listener: usize, host: &str, method: &Method, path: &str, headers: &HeaderMap) -> Option<usize> {
        let pick =
            |cands: &[Candidate]| cands.iter().find(|c| c.matches(listener, method, path, headers)).map(|c| c.route);
        if let Some(cands) = self.exact.get(host)
            && let Some(r) = pick(cands)
        {
            return Some(r);
        }
        for (suffix, cands) in &self.wildcard {
            if host.len() > suffix.len()
                && host.ends_with(suffix.as_str())
                && let Some(r) = pick(cands)
            {
                return Some(r);
            }
        }
        pick(&self.any_host)
    }
}

/// Normalises a Host header or :authority for matching: lower case, no
/// port, no trailing dot. IPv6 literals keep their brackets. Borrows when
/// the name is already in that form (the usual case).
pub fn normalize_host(raw: &str) -> std::borrow::Cow<'_, str> {
    let host = if raw.starts_with('[') {
        raw.find(']').map_or(raw, |end| &raw[..=end])
    } else {
        raw.rsplit_once(':').map_or(raw, |(h, port)| if port.bytes().all(|b| b.is_ascii_digit()) { h } else { raw })
    };
    let host = host.trim_end_matches('.');
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        std::borrow::Cow::Owned(host.to_ascii_lowercase())
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_config::RouteMatch;

    fn route(name: &str, hosts: &[&str], path: Option<&str>, prefix: Option<&str>) -> Route {
        Route {
            name: name.into(),
            matches: RouteMatch {
                hosts: hosts.iter().map(|s| s.to_string()).collect(),
                path: path.map(str::to_string),
                path_prefix: prefix.map(str::to_string),
                ..Default::default()
            },
            upstream: Some("u".into()),
            ..Default::default()
        }
    }

    fn find(r: &Router, host: &str, path: &str) -> Option<usize> {
        r.find(0, host, &Method::GET, path, &HeaderMap::new())
    }

    #[test]
    fn most_specific_wins() {
        let routes = vec![
            route("catch-all", &[], None, None),
            route("api-prefix", &["api.example.com"], None, Some("/v1")),
            route("api-longer", &["api.example.com"], None, Some("/v1/users")),
            route("api-exact", &["api.example.com"], Some("/v1/users/me"), None),
            route("wild", &["*.example.com"], None, Some("/")),
            route("deeper-wild", &["*.eu.example.com"], None, Some("/")),
            route("static", &[], None, Some("/static")),
        ];
        let r = Router::build(&routes, &|_| Some(0));
        assert_eq!(find(&r, "api.example.com", "/v1/users/me"), Some(3));
        assert_eq!(find(&r, "api.example.com", "/v1/users/42"), Some(2));
        assert_eq!(find(&r, "api.example.com", "/v1/x"), Some(1));
        // No route of the exact host matches: fall to the wildcard tier.
        assert_eq!(find(&r, "api.example.com", "/other"), Some(4));
        assert_eq!(find(&r, "www.example.com", "/"), Some(4));
        assert_eq!(find(&r, "a.eu.example.com", "/"), Some(5));
        assert_eq!(find(&r, "example.com", "/static/x"), Some(6));
        assert_eq!(find(&r, "other.test", "/"), Some(0));
    }

    #[test]
    fn methods_headers_and_listeners_narrow_a_match() {
        let mut post = route("post", &[], None, Some("/"));
        post.matches.methods = vec!["POST".into()];
        let mut beta = route("beta", &[], None, Some("/"));
        beta.matches.headers = vec![HeaderMatch { name: "x-beta".into(), value: Some("1".into()) }];
        let mut internal = route("internal", &[], None, Some("/admin"));
        internal.listeners = vec!["internal".into()];
        let any = route("any", &[], None, Some("/"));
        let routes = vec![any, post, beta, internal];
        let r = Router::build(&routes, &|name| (name == "internal").then_some(1));
        let mut h = HeaderMap::new();
        assert_eq!(r.find(0, "x", &Method::GET, "/", &h), Some(0));
        assert_eq!(r.find(0, "x", &Method::POST, "/", &h), Some(1));
        h.insert("x-beta", "1".parse().expect("value"));
        assert_eq!(r.find(0, "x", &Method::POST, "/", &h), Some(2), "headers outrank methods");
        assert_eq!(r.find(0, "x", &Method::GET, "/admin", &h), Some(2));
        assert_eq!(r.find(1, "x", &Method::GET, "/admin", &HeaderMap::new()), Some(3));
    }

    #[test]
    fn no_match_is_none() {
        let routes = vec![route("a", &["a.test"], None, Some("/"))];
        let r = Router::build(&routes, &|_| Some(0));
        assert_eq!(find(&r, "b.test", "/"), None);
    }

    #[test]
    fn hosts_are_normalised() {
        assert_eq!(normalize_host("API.Example.com:8443"), "api.example.com");
        assert_eq!(normalize_host("example.com."), "example.com");
        assert_eq!(normalize_host("[::1]:8080"), "[::1]");
        assert_eq!(normalize_host("localhost"), "localhost");
    }
}
