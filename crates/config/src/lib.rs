//! Gatehouse's configuration: the typed model, its decoding from YAML with
//! every error reported at once, and whole-config validation.
//!
//! This crate owns the meaning of every config field. It does no I/O except
//! reading the file it is asked to load; turning a [`Config`] into live state
//! (sockets, TLS contexts, balancers) belongs to the planes.

#![forbid(unsafe_code)]

pub mod decode;
pub mod doc;
pub mod model;
pub mod validate;
pub mod yaml;

use std::fmt;
use std::path::{Path, PathBuf};

pub use decode::{Ctx, FieldError, Named};
pub use model::*;

/// Everything wrong with one config file, each error on its own line as
/// `FILE: path.to.field: what was expected`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigErrors {
    pub file: PathBuf,
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: {}", self.file.display(), e)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Parses, decodes and validates config text. `file` names it in errors.
pub fn from_str(text: &str, file: &Path) -> Result<Config, ConfigErrors> {
    from_node(&parse_document(text, file)?, file)
}

/// Parses YAML text into a document, or one error with its line.
pub fn parse_document(text: &str, file: &Path) -> Result<yaml::Node, ConfigErrors> {
    yaml::parse(text).map_err(|e| {
        let mut message = format!("invalid YAML: {}", e.message);
        // The usual cause: an IPv6 address with a port, left unquoted.
        // The line of the error, and the one before (lines count from 1).
        let near = text.lines().skip(e.line.saturating_sub(2)).take(e.line.min(2));
        if let Some(value) = near.filter_map(bare_bracketed_address).last() {
            message.push_str(&format!("; quote {value} as \"{value}\": a bare [ starts a YAML list"));
        }
        ConfigErrors {
            file: file.to_path_buf(),
            errors: vec![FieldError { path: String::new(), message, line: Some(e.line) }],
        }
    })
}

/// The value of a `key: [addr]:port` or `- [addr]:port` line, unquoted.
fn bare_bracketed_address(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let t = t.strip_prefix("- ").unwrap_or(t);
    let value = t.split_once(": ").map_or(t, |(_, v)| v).trim();
    let (_, port) = value.strip_prefix('[')?.rsplit_once("]:")?;
    (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())).then_some(value)
}

/// Decodes and validates a document (`file` names it in errors).
pub fn from_node(root: &yaml::Node, file: &Path) -> Result<Config, ConfigErrors> {
    checked(root, file, false)
}

/// Decodes and validates a node's own file when its resources may live
/// in a store: with `store: etcd` the routes, upstreams and certificates
/// come from etcd (the file's are ignored), so the rules that need them
/// are left to the document composed with etcd's, which [`from_node`]
/// checks whole. With the file store this is [`from_node`].
pub fn from_local_node(root: &yaml::Node, file: &Path) -> Result<Config, ConfigErrors> {
    checked(root, file, true)
}

fn checked(root: &yaml::Node, file: &Path, local: bool) -> Result<Config, ConfigErrors> {
    let fail = |errors| ConfigErrors { file: file.to_path_buf(), errors };
    let mut ctx = Ctx::default();
    let config = <Config as decode::Decode>::decode(root, &mut ctx);
    if let Some(c) = &config {
        ctx.resources_elsewhere = local && matches!(c.store, Store::Etcd(_));
        validate::validate(c, &mut ctx);
    }
    match config {
        Some(c) if ctx.errors.is_empty() => Ok(c),
        _ => Err(fail(ctx.errors)),
    }
}

/// Reads and checks a config file.
pub fn load(file: &Path) -> Result<Config, ConfigErrors> {
    match std::fs::read_to_string(file) {
        Ok(text) => from_str(&text, file),
        Err(e) => Err(ConfigErrors {
            file: file.to_path_buf(),
            errors: vec![FieldError { path: String::new(), message: format!("cannot read: {e}"), line: None }],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_node_file_needs_no_certificates_of_its_own() {
        let text = "store: { type: etcd, endpoints: [http://127.0.0.1:2379] }\n\
                    listeners: [{ name: tls, address: 127.0.0.1:8443, protocol: https }]\n";
        let file = Path::new("node.yaml");
        let doc = parse_document(text, file).expect("parses");
        assert!(from_local_node(&doc, file).is_ok(), "the certificates come from etcd");
        let whole = from_node(&doc, file).expect_err("composed, it still needs one");
        assert_eq!(whole.errors[0].path, "listeners[0].protocol");
        let file_store = parse_document("listeners: [{ name: tls, address: 127.0.0.1:8443, protocol: https }]\n", file);
        assert!(from_local_node(&file_store.expect("parses"), file).is_err(), "the file store holds them itself");
    }

    const GOOD: &str = r#"
listeners:
  - name: web
    address: 127.0.0.1:8080
  - name: tls
    address: "[::1]:8443"
    protocol: https
    tls: { min_version: "1.3", session_resumption: false }
certificates:
  - name: local
    self_signed: true
    sni: [localhost, "*.example.com"]
upstreams:
  - name: api
    balance: maglev
    hash_key: header:X-User
    endpoints:
      - 127.0.0.1:9001
      - { address: 127.0.0.1:9002, weight: 3 }
    health_check: { type: http, path: /healthz, interval: 500ms, fall: 2 }
routes:
  - name: api
    match: { hosts: [api.example.com], path_prefix: /v1, methods: [GET, POST] }
    upstream: api
    canary: { upstream: api, weight: 10, header: { name: X-Canary, value: "1" } }
    deny: [10.0.0.0/8]
    rate_limit: { rate: 5 }
  - name: hello
    direct_response: { status: 200, headers: { content-type: text/plain }, body: "hi\n" }
"#;

    #[test]
    fn a_good_config_decodes() {
        let c = from_str(GOOD, Path::new("g.yaml")).expect("valid");
        assert_eq!(c.listeners.len(), 2);
        assert_eq!(c.listeners[1].protocol, Protocol::Https);
        let tls = c.listeners[1].tls.as_ref().expect("tls");
        assert_eq!(tls.min_version, TlsVersion::Tls13);
        assert!(!tls.session_resumption);
        assert_eq!(c.upstreams[0].hash_key, HashKey::Header("x-user".into()));
        assert_eq!(c.upstreams[0].endpoints[1].weight, 3);
        assert_eq!(c.upstreams[0].health_check.as_ref().map(|h| h.fall), Some(2));
        assert_eq!(c.routes[0].rate_limit.as_ref().map(|r| r.burst), Some(5));
        assert_eq!(
            c.routes[0].canary.as_ref().and_then(|c| c.header.as_ref()).map(|h| h.name.as_str()),
            Some("x-canary")
        );
        assert_eq!(c.routes[1].direct_response.as_ref().map(|d| d.body.as_str()), Some("hi\n"));
        assert_eq!(c.workers, 0);
    }

    #[test]
    fn every_mistake_is_listed_with_its_path() {
        let bad = r#"
workers: many
listeners:
  - name: web
    address: 127.0.0.1:99999
    protocol: htp
upstreams:
  - name: api
    endpoints: []
    balance: random
routes:
  - name: r
    upstream: api-v2
    match: { path: nope }
    rate_limit: { rate: 0 }
    colour: blue
"#;
        let err = from_str(bad, Path::new("bad.yaml")).expect_err("invalid");
        let text = err.to_string();
        for needle in [
            "bad.yaml: workers: expected an integer",
            "bad.yaml: listeners[0].address: expected an address",
            "bad.yaml: listeners[0].protocol: expected one of http, https, found \"htp\"",
            "bad.yaml: upstreams[0].balance: expected one of round_robin",
            "bad.yaml: routes[0].colour: unknown field",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
    }

    #[test]
    fn cross_references_are_checked() {
        let bad = r#"
listeners:
  - { name: a, address: 127.0.0.1:1, protocol: https, tls: { default_certificate: nope } }
  - { name: a, address: 127.0.0.1:1 }
upstreams:
  - { name: api, endpoints: [127.0.0.1:2, 127.0.0.1:2] }
routes:
  - name: r
    upstream: api-v2
    match: { path: nope, hosts: ["bad host"] }
    rate_limit: { rate: 0 }
    canary: { upstream: missing, weight: 101 }
"#;
        let err = from_str(bad, Path::new("x.yaml")).expect_err("invalid");
        let lines: Vec<String> = err.to_string().lines().map(str::to_string).collect();
        for needle in [
            "x.yaml: listeners[1].name: duplicate listener name \"a\"",
            "x.yaml: listeners[1].address: address 127.0.0.1:1 is used by another listener",
            "x.yaml: listeners[0].protocol: https needs at least one entry in certificates",
            "x.yaml: listeners[0].tls.default_certificate: no certificate named \"nope\"",
            "x.yaml: upstreams[0].endpoints[1].address: 127.0.0.1:2 is listed twice",
            "x.yaml: routes[0].upstream: no upstream named \"api-v2\"",
            "x.yaml: routes[0].match.hosts[0]: expected a host name",
            "x.yaml: routes[0].match.path: must start with /",
            "x.yaml: routes[0].rate_limit.rate: must be above 0",
            "x.yaml: routes[0].canary.upstream: no upstream named \"missing\"",
            "x.yaml: routes[0].canary.weight: is a percentage",
        ] {
            assert!(lines.iter().any(|l| l.starts_with(needle)), "missing {needle:?} in:\n{}", lines.join("\n"));
        }
    }

    #[test]
    fn tls13_suites_are_read_in_order_and_checked_with_their_paths() {
        let ok = "listeners:\n  - { name: a, address: 127.0.0.1:8443, protocol: https,\n      \
                  tls: { tls13_ciphers: [TLS_CHACHA20_POLY1305_SHA256, TLS_AES_256_GCM_SHA384] } }\n\
                  certificates: [{ name: c, self_signed: true, sni: [a.test] }]\n";
        let c = from_str(ok, Path::new("t.yaml")).expect("valid");
        let ids: Vec<u16> = c.listeners[0].tls.as_ref().expect("tls").tls13_ciphers.iter().map(|c| c.id()).collect();
        assert_eq!(ids, [0x1303, 0x1302]);
        let with = |suites: &str| {
            format!(
                "listeners:\n  - {{ name: a, address: 127.0.0.1:8443, protocol: https, tls: {{ tls13_ciphers: [{suites}] }} }}\n\
                 certificates: [{{ name: c, self_signed: true, sni: [a.test] }}]\n"
            )
        };
        for (suites, needle) in [
            (
                "TLS_AES_128_GCM_SHA256, TLS_AES_128_CCM_SHA256",
                "t.yaml: listeners[0].tls.tls13_ciphers[1]: expected one of TLS_AES_128_GCM_SHA256",
            ),
            (
                "TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_AES_128_GCM_SHA256",
                "t.yaml: listeners[0].tls.tls13_ciphers[2]: this suite is listed twice",
            ),
        ] {
            let err = from_str(&with(suites), Path::new("t.yaml")).expect_err("invalid").to_string();
            assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
        }
    }

    #[test]
    fn http3_settings_are_read_and_checked_with_their_paths() {
        let ok = "listeners:\n  - { name: a, address: 127.0.0.1:8443, protocol: https, http3: true }\n\
                  certificates: [{ name: c, self_signed: true, sni: [a.test] }]\n\
                  http: { quic: { retry_always: true, max_streams: 50, qpack_table_capacity: 0 } }\n";
        let c = from_str(ok, Path::new("q.yaml")).expect("valid");
        assert!(c.listeners[0].http3);
        assert_eq!(c.http.quic.retry, RetryPolicy::Always);
        assert_eq!(c.http.quic.max_streams, 50);
        assert_eq!((c.http.quic.qpack_table_capacity, c.http.quic.qpack_blocked_streams), (0, 16));
        let bad = "listeners:\n  - { name: a, address: 127.0.0.1:8080, http3: true }\n\
                   http: { quic: { max_streams: 0, stream_window: 100, retry_above: 0, qpack_table_capacity: 70000 } }\n";
        let err = from_str(bad, Path::new("q.yaml")).expect_err("invalid").to_string();
        for needle in [
            "q.yaml: listeners[0].http3: is only allowed on listeners with protocol: https",
            "q.yaml: http.quic.max_streams: must be between 1 and 10000",
            "q.yaml: http.quic.stream_window: must be between 16384",
            "q.yaml: http.quic.retry_above: must be at least 1",
            "q.yaml: http.quic.qpack_table_capacity: must be at most 65536 bytes",
            "q.yaml: http.quic.qpack_blocked_streams: must not be above max_streams",
        ] {
            assert!(err.contains(needle), "missing {needle:?} in:\n{err}");
        }
    }

    #[test]
    fn yaml_syntax_errors_are_reported_with_a_line() {
        let err = from_str("listeners: [\n", Path::new("s.yaml")).expect_err("invalid");
        assert!(err.to_string().starts_with("s.yaml: (document): invalid YAML"), "{err}");
        assert!(!err.to_string().contains("quote"), "{err}");
    }

    #[test]
    fn an_unquoted_ipv6_address_with_a_port_is_named() {
        for (text, value) in [
            ("listeners:\n  - name: web\n    address: [::]:8443\n", "[::]:8443"),
            (
                "l4:\n  services:\n    - name: dns\n      real_servers:\n        - [2001:db8::1]:53\n",
                "[2001:db8::1]:53",
            ),
        ] {
            let err = from_str(text, Path::new("s.yaml")).expect_err("invalid");
            let want = format!("quote {value} as \"{value}\": a bare [ starts a YAML list");
            assert!(err.to_string().contains(&want), "{err}");
        }
        assert_eq!(bare_bracketed_address("    endpoint: [fd61::2]:51821"), Some("[fd61::2]:51821"));
        assert_eq!(bare_bracketed_address("    allowed_ips: [10.0.0.0/8]"), None);
        assert_eq!(bare_bracketed_address("    address: \"[::1]:80\""), None);
    }

    #[test]
    fn the_l4_plane_decodes_and_is_checked() {
        let good = r#"
l4:
  interfaces: [veth-lb]
  local_addresses: [10.0.9.1, 10.0.9.2]
  services:
    - name: web
      address: 10.0.0.100:80
      scheduler: maglev
      mode: fnat
      real_servers: [10.0.1.1:8080, { address: 10.0.1.2:8080, weight: 3 }]
      timeouts: { tcp_established: 1h, udp: 30s }
      health_check: { type: tcp, interval: 1s }
      on_server_down: reset
    - name: dns
      address: "[2001:db8::53]:53"
      protocol: udp
      mode: dr
      real_servers: ["[2001:db8::1]:53"]
"#;
        let c = from_str(good, Path::new("l4.yaml")).expect("valid");
        let l4 = c.l4.expect("l4");
        assert_eq!(l4.services[0].mode, L4Mode::Fnat);
        assert_eq!(l4.services[0].scheduler, L4Scheduler::Maglev);
        assert_eq!(l4.services[0].real_servers[1].weight, 3);
        assert_eq!(l4.services[0].timeouts.tcp_established, std::time::Duration::from_secs(3600));
        assert_eq!(l4.services[0].timeouts.tcp_syn, std::time::Duration::from_secs(10));
        assert_eq!(l4.services[0].on_server_down, OnServerDown::Reset);
        assert_eq!(l4.services[1].protocol, L4Protocol::Udp);

        let bad = r#"
l4:
  services:
    - name: a
      address: 10.0.0.100:80
      mode: dr
      real_servers: [10.0.1.1:8080]
    - name: b
      address: 10.0.0.100:80
      mode: fnat
      scheduler: random
      real_servers: ["[2001:db8::1]:80"]
    - name: c
      address: 10.0.0.101:443
      mode: ipip
      real_servers: []
"#;
        let errs = from_str(bad, Path::new("l4.yaml")).expect_err("invalid").to_string();
        for want in [
            "l4.interfaces: needs at least one interface",
            "l4.services[0].real_servers[0].address: port 8080 differs from the service's 80: direct routing cannot change ports",
            "l4.services[1].address: 10.0.0.100:80 (Tcp) is already another service's",
            "l4.services[1].scheduler: expected one of rr, wrr, wlc, maglev",
            "l4.services[2].real_servers: needs at least one real server",
        ] {
            assert!(errs.contains(want), "missing {want:?} in:\n{errs}");
        }
    }

    #[test]
    fn the_wireguard_plane_decodes_and_is_checked() {
        let good = r#"
wireguard:
  interfaces:
    - name: wg0
      private_key: yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=
      listen_port: 51820
      addresses: [10.9.0.1/24, "fd00:9::1/64"]
      peers:
        - name: site-b
          public_key: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=
          preshared_key: FpCyhws9cxwWoV4xELtfJvjJN+zQVRPISllRWgeopVE=
          endpoint: "vpn.example.com:51820"
          allowed_ips: [10.9.0.2/32, 192.168.2.0/24]
          persistent_keepalive: 25
        - public_key: TrMvSoP4jYQlY6RIzBgbssQqY3vxI2Pi+y71lOWWXX0=
          endpoint: "[2001:db8::2]:51820"
          persistent_keepalive: 30s
    - name: wg1
      private_key_file: keys/wg1.key
      listen_port: 51821
"#;
        let c = from_str(good, Path::new("wg.yaml")).expect("valid");
        let wg = c.wireguard.expect("wireguard");
        let i = &wg.interfaces[0];
        assert_eq!(i.mtu, 1420);
        assert_eq!(i.addresses[0], InterfaceAddress { addr: "10.9.0.1".parse().expect("ip"), prefix: 24 });
        assert_eq!(i.peers[0].persistent_keepalive, Some(std::time::Duration::from_secs(25)));
        assert_eq!(i.peers[1].persistent_keepalive, Some(std::time::Duration::from_secs(30)));
        assert_eq!(i.peers[1].name, "TrMvSoP4");
        assert_eq!(i.peers[0].allowed_ips[1].to_string(), "192.168.2.0/24");
        assert_eq!(wg.interfaces[1].private_key, KeySource::File("keys/wg1.key".into()));
        // Keys never show in debug output.
        let shown = format!("{wg:?}");
        assert!(!shown.contains("yAnz5TF") && !shown.contains("FpCyhws"), "{shown}");

        let bad = r#"
wireguard:
  interfaces:
    - name: wg0/x
      private_key: not-a-key
      mtu: 100
      peers:
        - name: a
          public_key: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=
          endpoint: "nowhere"
          allowed_ips: [10.0.0.0/8]
        - name: b
          public_key: xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=
          allowed_ips: [10.0.0.0/8]
          persistent_keepalive: 70000
    - name: wg1
      listen_port: 51820
"#;
        let errs = from_str(bad, Path::new("wg.yaml")).expect_err("invalid").to_string();
        for want in [
            "wireguard.interfaces[0].private_key: expected a WireGuard key",
            "wireguard.interfaces[0].name: \"wg0/x\" is not an interface name",
            "wireguard.interfaces[0].mtu: expected a number from 576 to 65455",
            "wireguard.interfaces[0].peers[0].endpoint: expected host:port",
            "wireguard.interfaces[0].peers[1].public_key: is another peer's",
            "wireguard.interfaces[0].peers[1].allowed_ips[0]: 10.0.0.0/8 is already peer \"a\"'s",
            "wireguard.interfaces[0].peers[1].persistent_keepalive: expected whole seconds",
            "wireguard.interfaces[1].private_key: is required",
            "wireguard.interfaces[1].listen_port: 51820 is another interface's port",
        ] {
            assert!(errs.contains(want), "missing {want:?} in:\n{errs}");
        }
        assert!(!errs.contains("not-a-key"), "a secret is echoed:\n{errs}");
    }

    #[test]
    fn wireguard_router_mode_names_two_nics_and_no_tun_addresses() {
        let key = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=";
        let good = format!(
            "wireguard:\n  interfaces:\n    - name: site\n      mode: router\n      router: {{lan: eth1, wan: eth0}}\n      private_key: {key}\n"
        );
        let c = from_str(&good, Path::new("wg.yaml")).expect("valid");
        let i = &c.wireguard.expect("wireguard").interfaces[0];
        assert_eq!(i.mode, WgMode::Router);
        assert_eq!(i.router, Some(WgRouter { lan: "eth1".into(), wan: "eth0".into() }));
        for (bad, want) in [
            ("mode: router", "wireguard.interfaces[0].router: is required with mode: router"),
            (
                "mode: router\n      router: {lan: eth0, wan: eth0}",
                "wireguard.interfaces[0].router.wan: is the lan NIC too",
            ),
            ("mode: router\n      router: {lan: eth1}", "wireguard.interfaces[0].router.wan: is required"),
            (
                "mode: router\n      router: {lan: eth1, wan: eth0}\n      addresses: [10.0.0.1/24]",
                "wireguard.interfaces[0].addresses: has no use with mode: router",
            ),
            (
                "mode: router\n      router: {lan: eth1, wan: eth0}\n      mtu: 9000",
                "wireguard.interfaces[0].mtu: expected at most 1696",
            ),
            ("router: {lan: eth1, wan: eth0}", "wireguard.interfaces[0].router: is for mode: router only"),
            ("mode: bridge", "wireguard.interfaces[0].mode: expected one of"),
        ] {
            let text = format!("wireguard:\n  interfaces:\n    - name: site\n      {bad}\n      private_key: {key}\n");
            let errs = from_str(&text, Path::new("wg.yaml")).expect_err(bad).to_string();
            assert!(errs.contains(want), "missing {want:?} in:\n{errs}");
        }
    }
}
