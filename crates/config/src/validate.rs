//! Checks that need the whole config: names that must exist or be unique,
//! values that are well-typed but out of range, fields that exclude each other.

use std::collections::HashSet;
use std::time::Duration;

use crate::decode::Ctx;
use crate::model::*;

pub fn validate(c: &Config, ctx: &mut Ctx) {
    ctx.with_field("listeners", |ctx| listeners(c, ctx));
    ctx.with_field("certificates", |ctx| certificates(c, ctx));
    ctx.with_field("upstreams", |ctx| upstreams(c, ctx));
    ctx.with_field("routes", |ctx| routes(c, ctx));
    if let Some(l4) = &c.l4 {
        ctx.with_field("l4", |ctx| l4_plane(l4, ctx));
    }
    if let Some(wg) = &c.wireguard {
        ctx.with_field("wireguard", |ctx| wireguard(wg, ctx));
    }
    crate::model::validate_bgp(c, ctx);
    ctx.with_field("http", |ctx| {
        if c.http.max_header_bytes < 1024 {
            ctx.error_at("max_header_bytes", None, "must be at least 1024");
        }
        if c.http.max_headers == 0 {
            ctx.error_at("max_headers", None, "must be at least 1");
        }
        ctx.with_field("quic", |ctx| {
            let q = &c.http.quic;
            if !(1..=10_000).contains(&q.max_streams) {
                ctx.error_at("max_streams", None, "must be between 1 and 10000");
            }
            if q.retry == crate::RetryPolicy::Above(0) {
                ctx.error_at("retry_above", None, "must be at least 1 (retry_always: true retries every handshake)");
            }
            for (name, v) in [("stream_window", q.stream_window), ("connection_window", q.connection_window)] {
                if !(16 * 1024..=1 << 30).contains(&v) {
                    ctx.error_at(name, None, "must be between 16384 and 1073741824 bytes");
                }
            }
            if q.connection_window < q.stream_window {
                ctx.error_at("connection_window", None, "must not be below stream_window");
            }
            if q.qpack_table_capacity > 65536 {
                ctx.error_at("qpack_table_capacity", None, "must be at most 65536 bytes (it is held per connection)");
            }
            if q.qpack_blocked_streams as u64 > q.max_streams {
                ctx.error_at("qpack_blocked_streams", None, "must not be above max_streams");
            }
        });
    });
    if c.key_ops.max_delay > std::time::Duration::from_millis(100) {
        ctx.with_field("key_ops", |ctx| {
            ctx.error_at("max_delay", None, "must be at most 100ms (it delays TLS handshakes)")
        });
    }
    if let Some(a) = &c.admin {
        ctx.with_field("admin", |ctx| {
            if c.listeners.iter().any(|l| {
                l.address.is_some_and(|la| {
                    la.port() == a.address.port()
                        && (la.ip() == a.address.ip() || la.ip().is_unspecified() || a.address.ip().is_unspecified())
                })
            }) {
                ctx.error_at(
                    "address",
                    None,
                    format!("{} is a traffic listener's address; the admin listener needs its own", a.address),
                );
            }
            if a.api_key.as_deref().is_some_and(|k| k.len() < 16) {
                ctx.error_at("api_key", None, "must be at least 16 characters");
            }
            if a.read_requires_key && a.api_key.is_none() {
                ctx.error_at("read_requires_key", None, "needs admin.api_key");
            }
        });
    }
    if let Store::Etcd(e) = &c.store {
        ctx.with_field("store", |ctx| {
            if e.endpoints.is_empty() {
                ctx.error_at("endpoints", None, "needs at least one etcd client URL");
            }
            for (i, url) in e.endpoints.iter().enumerate() {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    ctx.with_field("endpoints", |ctx| {
                        ctx.error_at(
                            &format!("[{i}]"),
                            None,
                            format!("expected an http:// or https:// URL, found {url:?}"),
                        )
                    });
                }
            }
            if !e.prefix.starts_with('/') || e.prefix.len() < 2 || e.prefix.ends_with('/') {
                ctx.error_at("prefix", None, "must start with / and not end with / (e.g. /gatehouse)");
            }
        });
    }
    if c.workers > 1024 {
        ctx.error_at("workers", None, "must be between 0 (one per core) and 1024");
    }
}

fn unique_names<'a>(names: impl Iterator<Item = &'a str>, ctx: &mut Ctx, what: &str) {
    let mut seen = HashSet::new();
    for (i, name) in names.enumerate() {
        if name.is_empty() {
            continue; // already reported as missing
        }
        if !seen.insert(name) {
            ctx.with_index(i, |ctx| ctx.error_at("name", None, format!("duplicate {what} name {name:?}")));
        }
    }
}

fn listeners(c: &Config, ctx: &mut Ctx) {
    unique_names(c.listeners.iter().map(|l| l.name.as_str()), ctx, "listener");
    let mut addrs = HashSet::new();
    for (i, l) in c.listeners.iter().enumerate() {
        ctx.with_index(i, |ctx| {
            if let Some(a) = l.address
                && !addrs.insert(a)
            {
                ctx.error_at("address", None, format!("address {a} is used by another listener"));
            }
            match (l.protocol, &l.tls) {
                (Protocol::Http, Some(_)) => {
                    ctx.error_at("tls", None, "is only allowed on listeners with protocol: https")
                }
                (Protocol::Https, _) if c.certificates.is_empty() && !ctx.resources_elsewhere => {
                    ctx.error_at("protocol", None, "https needs at least one entry in certificates")
                }
                _ => {}
            }
            if l.http3 && l.protocol != Protocol::Https {
                ctx.error_at("http3", None, "is only allowed on listeners with protocol: https (QUIC is always TLS)");
            }
            if let Some(tls) = &l.tls {
                ctx.with_field("tls", |ctx| {
                    if tls.max_version < tls.min_version {
                        ctx.error_at("max_version", None, "must not be below min_version");
                    }
                    if let Some(d) = &tls.default_certificate
                        && !c.certificates.iter().any(|cert| &cert.name == d)
                    {
                        ctx.error_at("default_certificate", None, format!("no certificate named {d:?}"));
                    }
                    for (j, p) in tls.alpn.iter().enumerate() {
                        if p != "h2" && p != "http/1.1" {
                            ctx.with_field("alpn", |ctx| {
                                ctx.with_index(j, |ctx| {
                                    ctx.error(None, format!("expected h2 or http/1.1, found {p:?}"))
                                })
                            });
                        }
                    }
                    if let Some(ciphers) = &tls.ciphers
                        && (ciphers.is_empty() || ciphers.contains(char::is_whitespace))
                    {
                        ctx.error_at("ciphers", None, "expected a colon-separated cipher list without spaces");
                    }
                    for (j, suite) in tls.tls13_ciphers.iter().enumerate() {
                        if tls.tls13_ciphers[..j].contains(suite) {
                            ctx.with_field("tls13_ciphers", |ctx| {
                                ctx.with_index(j, |ctx| ctx.error(None, "this suite is listed twice"))
                            });
                        }
                    }
                });
            }
        });
    }
}

/// `example.com` or `*.example.com`: labels of letters, digits and hyphens.
pub fn valid_host_pattern(name: &str) -> bool {
    let name = name.strip_prefix("*.").unwrap_or(name);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn certificates(c: &Config, ctx: &mut Ctx) {
    unique_names(c.certificates.iter().map(|x| x.name.as_str()), ctx, "certificate");
    for (i, cert) in c.certificates.iter().enumerate() {
        ctx.with_index(i, |ctx| {
            match (cert.self_signed, &cert.cert, &cert.key) {
                (true, None, None) => {
                    if cert.sni.is_empty() {
                        ctx.error_at("sni", None, "a self_signed certificate needs at least one name");
                    }
                }
                (true, _, _) => ctx.error_at("self_signed", None, "cannot be combined with cert and key files"),
                (false, Some(_), Some(_)) => {}
                (false, None, _) => ctx.error_at("cert", None, "is required (or set self_signed: true)"),
                (false, Some(_), None) => ctx.error_at("key", None, "is required with cert"),
            }
            for (j, name) in cert.sni.iter().enumerate() {
                if !valid_host_pattern(name) {
                    ctx.with_field("sni", |ctx| {
                        ctx.with_index(j, |ctx| {
                            ctx.error(None, format!("expected a host name or *.domain wildcard, found {name:?}"))
                        })
                    });
                }
            }
        });
    }
}

fn upstreams(c: &Config, ctx: &mut Ctx) {
    unique_names(c.upstreams.iter().map(|u| u.name.as_str()), ctx, "upstream");
    for (i, u) in c.upstreams.iter().enumerate() {
        ctx.with_index(i, |ctx| {
            if u.endpoints.is_empty() {
                ctx.error_at("endpoints", None, "needs at least one endpoint");
            }
            if !u.endpoints.is_empty() && u.endpoints.iter().all(|e| e.weight == 0) {
                ctx.error_at("endpoints", None, "at least one endpoint needs a weight above 0");
            }
            let mut seen = HashSet::new();
            for (j, e) in u.endpoints.iter().enumerate() {
                if let Some(a) = e.address
                    && !seen.insert(a)
                {
                    ctx.with_field("endpoints", |ctx| {
                        ctx.with_index(j, |ctx| ctx.error_at("address", None, format!("{a} is listed twice")))
                    });
                }
                if e.weight > 10_000 {
                    ctx.with_field("endpoints", |ctx| {
                        ctx.with_index(j, |ctx| ctx.error_at("weight", None, "must be between 0 and 10000"))
                    });
                }
            }
            if u.hash_key != HashKey::ClientIp && u.balance != Balance::Maglev {
                ctx.error_at("hash_key", None, "is only used with balance: maglev");
            }
            if let Some(h) = &u.health_check {
                ctx.with_field("health_check", |ctx| {
                    if h.rise == 0 {
                        ctx.error_at("rise", None, "must be at least 1");
                    }
                    if h.fall == 0 {
                        ctx.error_at("fall", None, "must be at least 1");
                    }
                    if h.interval.is_zero() {
                        ctx.error_at("interval", None, "must be above 0");
                    }
                    if h.timeout.is_zero() {
                        ctx.error_at("timeout", None, "must be above 0");
                    }
                    if !h.path.starts_with('/') {
                        ctx.error_at("path", None, "must start with /");
                    }
                    if !(100..=599).contains(&h.expect_status) {
                        ctx.error_at("expect_status", None, "must be an HTTP status between 100 and 599");
                    }
                });
            }
            if u.connect_timeout.is_zero() {
                ctx.error_at("connect_timeout", None, "must be above 0");
            }
            if u.response_timeout.is_zero() {
                ctx.error_at("response_timeout", None, "must be above 0");
            }
        });
    }
}

fn valid_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

fn header_match(h: &HeaderMatch, ctx: &mut Ctx) {
    if !valid_token(&h.name) {
        ctx.error_at("name", None, format!("expected a header name, found {:?}", h.name));
    }
}

fn routes(c: &Config, ctx: &mut Ctx) {
    unique_names(c.routes.iter().map(|r| r.name.as_str()), ctx, "route");
    let upstream_exists = |name: &str| c.upstreams.iter().any(|u| u.name == name);
    for (i, r) in c.routes.iter().enumerate() {
        ctx.with_index(i, |ctx| {
            match (&r.upstream, &r.direct_response) {
                (Some(_), Some(_)) => {
                    ctx.error_at("direct_response", None, "a route has either upstream or direct_response, not both")
                }
                (None, None) => ctx.error_at("upstream", None, "is required (or set direct_response)"),
                _ => {}
            }
            if let Some(u) = &r.upstream
                && !upstream_exists(u)
            {
                ctx.error_at("upstream", None, format!("no upstream named {u:?}"));
            }
            for (j, l) in r.listeners.iter().enumerate() {
                if !c.listeners.iter().any(|x| &x.name == l) {
                    ctx.with_field("listeners", |ctx| {
                        ctx.with_index(j, |ctx| ctx.error(None, format!("no listener named {l:?}")))
                    });
                }
            }
            ctx.with_field("match", |ctx| {
                let m = &r.matches;
                for (j, h) in m.hosts.iter().enumerate() {
                    if !valid_host_pattern(h) {
                        ctx.with_field("hosts", |ctx| {
                            ctx.with_index(j, |ctx| {
                                ctx.error(None, format!("expected a host name or *.domain wildcard, found {h:?}"))
                            })
                        });
                    }
                }
                if m.path.is_some() && m.path_prefix.is_some() {
                    ctx.error_at("path_prefix", None, "cannot be combined with path");
                }
                for (key, p) in [("path", &m.path), ("path_prefix", &m.path_prefix)] {
                    if let Some(p) = p
                        && !p.starts_with('/')
                    {
                        ctx.error_at(key, None, format!("must start with /, found {p:?}"));
                    }
                }
                for (j, method) in m.methods.iter().enumerate() {
                    if !valid_token(method) || method.bytes().any(|b| b.is_ascii_lowercase()) {
                        ctx.with_field("methods", |ctx| {
                            ctx.with_index(j, |ctx| {
                                ctx.error(None, format!("expected an upper-case method such as GET, found {method:?}"))
                            })
                        });
                    }
                }
                for (j, h) in m.headers.iter().enumerate() {
                    ctx.with_field("headers", |ctx| ctx.with_index(j, |ctx| header_match(h, ctx)));
                }
            });
            if let Some(d) = &r.direct_response {
                ctx.with_field("direct_response", |ctx| {
                    if !(200..=599).contains(&d.status) {
                        ctx.error_at("status", None, "must be an HTTP status between 200 and 599");
                    }
                    for (name, value) in &d.headers {
                        if !valid_token(name) {
                            ctx.error_at("headers", None, format!("invalid header name {name:?}"));
                        }
                        if value.bytes().any(|b| b < 0x20 && b != b'\t' || b == 0x7f) {
                            ctx.error_at("headers", None, format!("header {name:?} has a control character"));
                        }
                    }
                });
            }
            if let Some(can) = &r.canary {
                ctx.with_field("canary", |ctx| {
                    if !upstream_exists(&can.upstream) && !can.upstream.is_empty() {
                        ctx.error_at("upstream", None, format!("no upstream named {:?}", can.upstream));
                    }
                    if can.weight > 100 {
                        ctx.error_at("weight", None, "is a percentage: 0 to 100");
                    }
                    if r.upstream.is_none() {
                        ctx.error(None, "a canary needs the route to have an upstream");
                    }
                    if let Some(h) = &can.header {
                        ctx.with_field("header", |ctx| header_match(h, ctx));
                    }
                });
            }
            if let Some(rl) = &r.rate_limit {
                ctx.with_field("rate_limit", |ctx| {
                    if rl.rate <= 0.0 {
                        ctx.error_at("rate", None, "must be above 0 (requests per second)");
                    }
                    if rl.burst == 0 {
                        ctx.error_at("burst", None, "must be at least 1");
                    }
                });
            }
        });
    }
}

fn l4_plane(l4: &L4, ctx: &mut Ctx) {
    if !l4.services.is_empty() && l4.interfaces.is_empty() {
        ctx.error_at("interfaces", None, "needs at least one interface for the services to run on");
    }
    if !(1024..=1 << 30).contains(&l4.max_sessions) {
        ctx.error_at("max_sessions", None, "expected a number from 1024 to 1073741824");
    }
    for (i, name) in l4.interfaces.iter().enumerate() {
        if name.is_empty() || name.len() > 15 || name.contains('/') || name.contains(char::is_whitespace) {
            ctx.with_field("interfaces", |ctx| {
                ctx.error_at(&format!("[{i}]"), None, format!("{name:?} is not an interface name"))
            });
        }
    }
    if let Some(ha) = &l4.ha {
        ctx.with_field("ha", |ctx| l4_ha(l4, ha, ctx));
    }
    ctx.with_field("snat", |ctx| l4_snat(l4, ctx));
    ctx.with_field("services", |ctx| {
        unique_names(l4.services.iter().map(|s| s.name.as_str()), ctx, "service");
        let mut seen = HashSet::new();
        // A NAT real server's replies are told apart by its address and
        // port alone, so it serves one NAT service.
        let mut nat_reals: std::collections::HashMap<(std::net::SocketAddr, L4Protocol), &str> = std::collections::HashMap::new();
        for (i, s) in l4.services.iter().enumerate() {
            ctx.with_index(i, |ctx| {
                l4_service(l4, s, &mut seen, ctx);
                if s.mode != L4Mode::Nat {
                    return;
                }
                for (j, r) in s.real_servers.iter().enumerate() {
                    let Some(a) = r.address else { continue };
                    if let Some(other) = nat_reals.insert((a, s.protocol), &s.name).filter(|o| *o != s.name) {
                        ctx.with_field("real_servers", |ctx| {
                            ctx.with_index(j, |ctx| {
                                ctx.error_at(
                                    "address",
                                    None,
                                    format!("{a} is already a real server of NAT service {other:?}: its replies could not be told apart"),
                                )
                            })
                        });
                    }
                }
            });
        }
    });
}

fn l4_snat(l4: &L4, ctx: &mut Ctx) {
    unique_names(l4.snat.iter().map(|s| s.name.as_str()), ctx, "SNAT rule");
    if !l4.snat.is_empty() && l4.interfaces.is_empty() {
        ctx.error(None, "needs l4.interfaces: the inside hosts' packets arrive there");
    }
    if l4.snat.len() > 8191 {
        ctx.error(None, "at most 8191 rules");
    }
    let vips: HashSet<std::net::IpAddr> = l4.services.iter().filter_map(|s| s.address.map(|a| a.ip())).collect();
    let mut ranges: std::collections::HashMap<std::net::IpAddr, (crate::PortRange, &str)> = Default::default();
    for (i, r) in l4.snat.iter().enumerate() {
        ctx.with_index(i, |ctx| {
            for (j, a) in r.addresses.iter().enumerate() {
                if let Some((other, name)) = ranges.insert(*a, (r.ports, &r.name))
                    && other != r.ports
                {
                    ctx.with_field("addresses", |ctx| {
                        ctx.error_at(
                            &format!("[{j}]"),
                            None,
                            format!("{a} goes out from other ports in rule {name:?}: one range per address"),
                        )
                    });
                }
            }
            if r.sources.is_empty() {
                ctx.error_at("sources", None, "needs at least one network (such as 10.0.1.0/24)");
            }
            if r.addresses.is_empty() {
                ctx.error_at("addresses", None, "needs at least one address to go out from");
            }
            for (j, a) in r.addresses.iter().enumerate() {
                let problem = if a.is_unspecified() || a.is_multicast() || a.is_loopback() {
                    Some("is not an address to go out from")
                } else if vips.contains(a) {
                    Some("is a service's VIP")
                } else if l4.local_addresses.contains(a) {
                    Some("is an FNAT local address (their ports are FNAT's)")
                } else {
                    None
                };
                if let Some(p) = problem {
                    ctx.with_field("addresses", |ctx| ctx.error_at(&format!("[{j}]"), None, format!("{a} {p}")));
                }
            }
            for (j, n) in r.sources.iter().enumerate() {
                if !r.addresses.iter().any(|a| a.is_ipv4() == n.addr().is_ipv4()) {
                    ctx.with_field("sources", |ctx| {
                        ctx.error_at(
                            &format!("[{j}]"),
                            None,
                            format!("{n}: no address of its family in addresses to go out from"),
                        )
                    });
                }
            }
        });
    }
}

fn l4_ha(l4: &L4, ha: &crate::L4Ha, ctx: &mut Ctx) {
    if l4.interfaces.is_empty() {
        ctx.error(None, "needs l4.interfaces: the addresses it owns are announced there");
    }
    if ha.announce > 100 {
        ctx.error_at("announce", None, "expected a number from 0 to 100");
    }
    let Some(sync) = &ha.sync else { return };
    ctx.with_field("sync", |ctx| {
        if sync.listen.ip().is_unspecified() || sync.listen.port() == 0 {
            ctx.error_at("listen", None, "expected an address of this node and a port, such as 10.0.0.2:8200");
        }
        if sync.peer.ip().is_unspecified() || sync.peer.port() == 0 || sync.peer.ip().is_multicast() {
            ctx.error_at("peer", None, "expected the peer balancer's address and port, such as 10.0.0.3:8200");
        } else if sync.peer == sync.listen {
            ctx.error_at("peer", None, "is this node's own listen address");
        }
        if sync.node() == 0 {
            ctx.error_at(
                "node_id",
                None,
                if sync.node_id.is_some() {
                    "expected a number from 1 to 255"
                } else {
                    "must be set (1-255): the last byte of listen's address is 0"
                },
            );
        }
        if sync.max_rate == 0 {
            ctx.error_at("max_rate", None, "expected a number of sessions per second above 0");
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(3600)).contains(&sync.refresh) {
            ctx.error_at("refresh", None, "expected a duration from 1s to 1h");
        }
        if let crate::KeySource::File(f) = &sync.key
            && f.is_empty()
        {
            ctx.error_at("key_file", None, "expected a file path");
        }
    });
}

fn l4_service(l4: &L4, s: &L4Service, seen: &mut HashSet<(std::net::SocketAddr, L4Protocol)>, ctx: &mut Ctx) {
    let Some(vip) = s.address else { return };
    if !seen.insert((vip, s.protocol)) {
        ctx.error_at("address", None, format!("{vip} ({:?}) is already another service's", s.protocol));
    }
    if vip.ip().is_unspecified() || vip.port() == 0 {
        ctx.error_at("address", None, "needs a specific address and a port (the virtual IP and port)");
    }
    if s.real_servers.is_empty() {
        ctx.error_at("real_servers", None, "needs at least one real server");
    }
    if s.mode == L4Mode::Gue && s.gue_port == 0 {
        ctx.error_at("gue_port", None, "must be a UDP port (1-65535)");
    }
    let proxied = s.protocol == L4Protocol::Tcp && matches!(s.mode, L4Mode::Nat | L4Mode::Fnat);
    if s.syn_proxy.mode == SynProxyMode::Always && !proxied {
        ctx.error_at(
            "syn_proxy.mode",
            None,
            "always needs a TCP service in nat or fnat mode (the proxy must see the server's answers)",
        );
    }
    if s.syn_proxy.threshold == 0 {
        ctx.error_at("syn_proxy.threshold", None, "expected SYNs per second above 0");
    }
    ctx.with_field("real_servers", |ctx| {
        for (j, r) in s.real_servers.iter().enumerate() {
            let Some(addr) = r.address else { continue };
            ctx.with_index(j, |ctx| {
                let same_family = addr.is_ipv4() == vip.is_ipv4();
                match s.mode {
                    // DR only changes the MAC: the server must own the VIP and port.
                    L4Mode::Dr if addr.port() != vip.port() => ctx.error_at(
                        "address",
                        None,
                        format!(
                            "port {} differs from the service's {}: direct routing cannot change ports",
                            addr.port(),
                            vip.port()
                        ),
                    ),
                    L4Mode::Dr | L4Mode::Nat if !same_family => ctx.error_at(
                        "address",
                        None,
                        "must be of the service address's family (IPv4 or IPv6) in this mode",
                    ),
                    L4Mode::Ipip | L4Mode::Gue if addr.port() != vip.port() => ctx.error_at(
                        "address",
                        None,
                        format!(
                            "port {} differs from the service's {}: a tunnel carries the packet unchanged",
                            addr.port(),
                            vip.port()
                        ),
                    ),
                    _ => {}
                }
            });
        }
    });
    if s.mode == L4Mode::Fnat {
        let families: HashSet<bool> = s.real_servers.iter().filter_map(|r| r.address).map(|a| a.is_ipv4()).collect();
        for v4 in families {
            if !l4.local_addresses.iter().any(|a| a.is_ipv4() == v4) {
                ctx.error_at(
                    "mode",
                    None,
                    format!(
                        "fnat needs an {} address in l4.local_addresses for its real servers",
                        if v4 { "IPv4" } else { "IPv6" }
                    ),
                );
            }
        }
    }
}

/// Whether `name` can be a network interface's name.
pub(crate) fn interface_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name.contains(['/', ':'])
        && !name.contains(char::is_whitespace)
}

/// Whether `text` is `host:port` or `[v6]:port` with a non-zero port.
pub fn endpoint_ok(text: &str) -> bool {
    let Some((host, port)) = text.rsplit_once(':') else { return false };
    let port_ok = port.parse::<u16>().is_ok_and(|p| p != 0);
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => !host.is_empty() && !host.contains([':', '[', ']', '/']) && !host.contains(char::is_whitespace),
    };
    port_ok && host_ok
}

fn wireguard(wg: &WireGuard, ctx: &mut Ctx) {
    ctx.with_field("interfaces", |ctx| {
        unique_names(wg.interfaces.iter().map(|i| i.name.as_str()), ctx, "interface");
        let mut ports = HashSet::new();
        for (i, w) in wg.interfaces.iter().enumerate() {
            ctx.with_index(i, |ctx| {
                if !w.name.is_empty() && !interface_name_ok(&w.name) {
                    ctx.error_at(
                        "name",
                        None,
                        format!("{:?} is not an interface name (1 to 15 bytes, no '/', ':' or spaces)", w.name),
                    );
                }
                if w.listen_port != 0 && !ports.insert(w.listen_port) {
                    ctx.error_at("listen_port", None, format!("{} is another interface's port", w.listen_port));
                }
                if !(576..=65_455).contains(&w.mtu) {
                    ctx.error_at("mtu", None, "expected a number from 576 to 65455");
                } else if w.mtu < 1280 && w.addresses.iter().any(|a| a.addr.is_ipv6()) {
                    ctx.error_at("mtu", None, "must be at least 1280 with an IPv6 address (IPv6's minimum)");
                }
                if let KeySource::File(f) = &w.private_key
                    && f.is_empty()
                {
                    ctx.error_at("private_key_file", None, "expected a file path");
                }
                wg_mode(w, ctx);
                for (j, a) in w.addresses.iter().enumerate() {
                    if a.addr.is_unspecified() || a.addr.is_multicast() {
                        ctx.with_field("addresses", |ctx| {
                            ctx.error_at(
                                &format!("[{j}]"),
                                None,
                                format!("{}/{} is not an interface address", a.addr, a.prefix),
                            )
                        });
                    }
                }
                ctx.with_field("peers", |ctx| wg_peers(w, ctx));
            });
        }
    });
}

/// Router mode has its NICs and no TUN interface; TUN mode has no NICs.
fn wg_mode(w: &WgInterface, ctx: &mut Ctx) {
    match (w.mode, &w.router) {
        (WgMode::Router, None) => {
            ctx.error_at("router", None, "is required with mode: router (the lan and wan NICs to route between)")
        }
        (WgMode::Router, Some(r)) => {
            ctx.with_field("router", |ctx| {
                for (field, name) in [("lan", &r.lan), ("wan", &r.wan)] {
                    if !interface_name_ok(name) {
                        ctx.error_at(
                            field,
                            None,
                            format!("{name:?} is not an interface name (1 to 15 bytes, no '/', ':' or spaces)"),
                        );
                    }
                }
                if r.lan == r.wan {
                    ctx.error_at("wan", None, format!("is the lan NIC too ({:?}): a router needs two", r.wan));
                }
            });
            if !w.addresses.is_empty() {
                ctx.error_at(
                    "addresses",
                    None,
                    "has no use with mode: router (no TUN interface: the gateway's addresses are its NICs')",
                );
            }
            if w.mtu > 1696 {
                // A WAN frame lands 256 bytes into a 2 KiB AF_XDP frame, and
                // carries 96 bytes of outer headers, padding and tag.
                ctx.error_at("mtu", None, "expected at most 1696 with mode: router (packets travel in 2 KiB frames)");
            }
        }
        (WgMode::Tun, Some(_)) => ctx.error_at("router", None, "is for mode: router only"),
        (WgMode::Tun, None) => {}
    }
}

fn wg_peers(w: &WgInterface, ctx: &mut Ctx) {
    unique_names(w.peers.iter().map(|p| p.name.as_str()), ctx, "peer");
    let mut keys = HashSet::new();
    // Cryptokey routing: a prefix leads to one peer.
    let mut prefixes: std::collections::HashMap<ipnet::IpNet, &str> = std::collections::HashMap::new();
    for (j, p) in w.peers.iter().enumerate() {
        ctx.with_index(j, |ctx| {
            if !keys.insert(p.public_key) {
                ctx.error_at("public_key", None, "is another peer's of this interface");
            }
            if let Some(e) = &p.endpoint
                && !endpoint_ok(e)
            {
                ctx.error_at("endpoint", None, format!("expected host:port or IP:port ([IPv6]:port), found {e:?}"));
            }
            for (k, net) in p.allowed_ips.iter().enumerate() {
                if let Some(other) = prefixes.insert(*net, &p.name).filter(|o| *o != p.name) {
                    ctx.with_field("allowed_ips", |ctx| {
                        ctx.error_at(&format!("[{k}]"), None, format!("{net} is already peer {other:?}'s"))
                    });
                }
            }
        });
    }
}
