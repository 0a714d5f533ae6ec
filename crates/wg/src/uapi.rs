//! The cross-platform userspace API of WireGuard (the text protocol
//! wireguard-go serves on `/var/run/wireguard/IFNAME.sock`, which `wg show`,
//! `wg set` and `wg syncconf` speak): requests parsed into typed changes,
//! and the interface's state written as `get=1` answers it. Keys are
//! lowercase hex; errors are negative errno values.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

use crate::crypto::KEY_LEN;

/// errno for a malformed or invalid request.
pub const EINVAL: i32 = 22;
/// errno for a request the protocol does not know.
pub const EPROTO: i32 = 71;

/// A change to one peer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PeerChange {
    pub public_key: [u8; KEY_LEN],
    pub remove: bool,
    /// Change the peer only if it exists already.
    pub update_only: bool,
    /// `Some(None)`: remove the pre-shared key (all zeros).
    pub preshared_key: Option<Option<[u8; KEY_LEN]>>,
    pub endpoint: Option<SocketAddr>,
    /// Seconds; `Some(0)` turns it off.
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    pub allowed_ips: Vec<(IpAddr, u8)>,
}

/// A `set=1` request.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Change {
    /// `Some(None)`: remove the private key.
    pub private_key: Option<Option<[u8; KEY_LEN]>>,
    pub listen_port: Option<u16>,
    /// `Some(0)` removes it.
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerChange>,
}

/// A request on the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get,
    Set(Change),
}

/// Why a request was refused, with the errno to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UapiError {
    pub errno: i32,
    pub message: String,
}

fn invalid(message: impl Into<String>) -> UapiError {
    UapiError { errno: EINVAL, message: message.into() }
}

/// A 32-byte key in lowercase or uppercase hex.
pub fn parse_key(text: &str) -> Option<[u8; KEY_LEN]> {
    if text.len() != 2 * KEY_LEN || !text.is_ascii() {
        return None;
    }
    let mut k = [0u8; KEY_LEN];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(k)
}

/// A key as lowercase hex.
pub fn key_hex(k: &[u8; KEY_LEN]) -> String {
    let mut s = String::with_capacity(2 * KEY_LEN);
    for b in k {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn parse_bool(v: &str) -> Result<bool, UapiError> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(invalid(format!("expected true or false, found {v:?}"))),
    }
}

fn parse_prefix(v: &str) -> Result<(IpAddr, u8), UapiError> {
    let (addr, len) = v.split_once('/').ok_or_else(|| invalid(format!("allowed_ip {v:?}: expected ADDRESS/LENGTH")))?;
    let addr: IpAddr = addr.parse().map_err(|_| invalid(format!("allowed_ip {v:?}: not an address")))?;
    let len: u8 = len.parse().map_err(|_| invalid(format!("allowed_ip {v:?}: not a prefix length")))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if len > max {
        return Err(invalid(format!("allowed_ip {v:?}: longer than /{max}")));
    }
    Ok((addr, len))
}

/// Parses one request (its lines up to the empty line that ends it).
pub fn parse_request(text: &str) -> Result<Request, UapiError> {
    let mut lines = text.lines();
    match lines.next() {
        Some("get=1") => return Ok(Request::Get),
        Some("set=1") => {}
        other => return Err(UapiError { errno: EPROTO, message: format!("unknown operation {other:?}") }),
    }
    let mut change = Change::default();
    for line in lines {
        if line.is_empty() {
            break;
        }
        let (key, value) = line.split_once('=').ok_or_else(|| invalid(format!("{line:?}: expected KEY=VALUE")))?;
        let peer = change.peers.last_mut();
        match (key, peer) {
            ("public_key", _) => {
                let k = parse_key(value).ok_or_else(|| invalid("public_key: expected 64 hex digits"))?;
                change.peers.push(PeerChange { public_key: k, ..PeerChange::default() });
            }
            ("private_key", None) => {
                let k = parse_key(value).ok_or_else(|| invalid("private_key: expected 64 hex digits"))?;
                change.private_key = Some((k != [0; KEY_LEN]).then_some(k));
            }
            ("listen_port", None) => {
                change.listen_port = Some(value.parse().map_err(|_| invalid("listen_port: expected 0 to 65535"))?);
            }
            ("fwmark", None) => {
                change.fwmark = Some(value.parse().map_err(|_| invalid("fwmark: expected a 32-bit number"))?);
            }
            ("replace_peers", None) => change.replace_peers = parse_bool(value)?,
            ("remove", Some(p)) => p.remove = parse_bool(value)?,
            ("update_only", Some(p)) => p.update_only = parse_bool(value)?,
            ("preshared_key", Some(p)) => {
                let k = parse_key(value).ok_or_else(|| invalid("preshared_key: expected 64 hex digits"))?;
                p.preshared_key = Some((k != [0; KEY_LEN]).then_some(k));
            }
            ("endpoint", Some(p)) => {
                // IPv6 endpoints come bracketed: [addr]:port.
                p.endpoint = Some(value.parse().map_err(|_| invalid(format!("endpoint {value:?}: not ADDRESS:PORT")))?);
            }
            ("persistent_keepalive_interval", Some(p)) => {
                let s = value.parse().map_err(|_| invalid("persistent_keepalive_interval: expected 0 to 65535"))?;
                p.persistent_keepalive = Some(s);
            }
            ("replace_allowed_ips", Some(p)) => p.replace_allowed_ips = parse_bool(value)?,
            ("allowed_ip", Some(p)) => p.allowed_ips.push(parse_prefix(value)?),
            ("protocol_version", Some(_)) if value == "1" => {}
            ("protocol_version", Some(_)) => return Err(invalid(format!("protocol_version {value}: only 1 is known"))),
            (key, Some(_)) => return Err(invalid(format!("{key}: not a peer key"))),
            (key, None) => return Err(invalid(format!("{key}: not an interface key (or before any public_key)"))),
        }
    }
    Ok(Request::Set(change))
}

/// What `get=1` reports of a peer.
#[derive(Debug, Clone, Default)]
pub struct PeerStatus {
    pub public_key: [u8; KEY_LEN],
    pub preshared_key: Option<[u8; KEY_LEN]>,
    pub endpoint: Option<SocketAddr>,
    /// Since the Unix epoch; `None` before any handshake.
    pub last_handshake: Option<std::time::Duration>,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub persistent_keepalive: u16,
    pub allowed_ips: Vec<(IpAddr, u8)>,
}

/// What `get=1` reports of the interface.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub private_key: Option<[u8; KEY_LEN]>,
    pub listen_port: u16,
    pub fwmark: u32,
    pub peers: Vec<PeerStatus>,
}

/// The answer to `get=1`, ending in `errno=0` and the empty line.
pub fn render_status(s: &Status) -> String {
    let mut o = String::new();
    if let Some(k) = &s.private_key {
        let _ = writeln!(o, "private_key={}", key_hex(k));
    }
    let _ = writeln!(o, "listen_port={}", s.listen_port);
    if s.fwmark != 0 {
        let _ = writeln!(o, "fwmark={}", s.fwmark);
    }
    for p in &s.peers {
        let _ = writeln!(o, "public_key={}", key_hex(&p.public_key));
        if let Some(k) = &p.preshared_key {
            let _ = writeln!(o, "preshared_key={}", key_hex(k));
        }
        let _ = writeln!(o, "protocol_version=1");
        if let Some(e) = p.endpoint {
            let _ = writeln!(o, "endpoint={e}");
        }
        let hs = p.last_handshake.unwrap_or_default();
        let _ = writeln!(o, "last_handshake_time_sec={}", hs.as_secs());
        let _ = writeln!(o, "last_handshake_time_nsec={}", hs.subsec_nanos());
        let _ = writeln!(o, "tx_bytes={}", p.tx_bytes);
        let _ = writeln!(o, "rx_bytes={}", p.rx_bytes);
        let _ = writeln!(o, "persistent_keepalive_interval={}", p.persistent_keepalive);
        for (a, l) in &p.allowed_ips {
            let _ = writeln!(o, "allowed_ip={a}/{l}");
        }
    }
    o.push_str("errno=0\n\n");
    o
}

/// The answer to a `set=1` (0 when it was applied, else the errno).
pub fn render_errno(errno: i32) -> String {
    format!("errno={}\n\n", -errno.abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a";
    const K2: &str = "b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85a8e75a33";

    #[test]
    fn a_wg_set_request_parses_into_typed_changes() {
        let text = format!(
            "set=1\nprivate_key={K1}\nlisten_port=51820\nfwmark=0\nreplace_peers=true\n\
             public_key={K2}\npreshared_key={K1}\nendpoint=[2001:db8::1]:51820\n\
             persistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.0.0.0/24\n\
             allowed_ip=fd00::/64\nprotocol_version=1\n\
             public_key={K1}\nremove=true\n\n"
        );
        let Ok(Request::Set(c)) = parse_request(&text) else { panic!("set") };
        assert_eq!(c.private_key, Some(parse_key(K1)));
        assert_eq!((c.listen_port, c.fwmark, c.replace_peers), (Some(51820), Some(0), true));
        assert_eq!(c.peers.len(), 2);
        let p = &c.peers[0];
        assert_eq!(p.public_key, parse_key(K2).expect("key"));
        assert_eq!(p.endpoint, Some("[2001:db8::1]:51820".parse().expect("addr")));
        assert_eq!((p.persistent_keepalive, p.replace_allowed_ips), (Some(25), true));
        assert_eq!(p.allowed_ips, vec![("10.0.0.0".parse().expect("ip"), 24), ("fd00::".parse().expect("ip"), 64)]);
        assert!(c.peers[1].remove);
        assert_eq!(parse_request("get=1\n\n"), Ok(Request::Get));
    }

    #[test]
    fn bad_requests_get_an_errno_and_a_reason() {
        for (text, errno) in [
            ("frob=1\n\n", EPROTO),
            ("set=1\nlisten_port=70000\n\n", EINVAL),
            ("set=1\nendpoint=1.2.3.4:5\n\n", EINVAL),
            (&*format!("set=1\npublic_key={K2}\nallowed_ip=10.0.0.0/33\n\n"), EINVAL),
            (&*format!("set=1\npublic_key={K2}\nlisten_port=1\n\n"), EINVAL),
            ("set=1\nprivate_key=zz\n\n", EINVAL),
            (&*format!("set=1\npublic_key={K2}\nprotocol_version=2\n\n"), EINVAL),
            ("set=1\nnonsense\n\n", EINVAL),
        ] {
            let e = parse_request(text).expect_err(text);
            assert_eq!(e.errno, errno, "{text:?}: {}", e.message);
            assert!(!e.message.is_empty());
        }
        assert_eq!(render_errno(EINVAL), "errno=-22\n\n");
    }

    #[test]
    fn get_answers_in_wireguard_gos_shape() {
        let s = Status {
            private_key: parse_key(K1),
            listen_port: 51820,
            fwmark: 0,
            peers: vec![PeerStatus {
                public_key: parse_key(K2).expect("key"),
                endpoint: Some("192.0.2.1:51820".parse().expect("addr")),
                last_handshake: Some(std::time::Duration::new(1_700_000_000, 5)),
                tx_bytes: 10,
                rx_bytes: 20,
                persistent_keepalive: 25,
                allowed_ips: vec![("10.0.0.2".parse().expect("ip"), 32)],
                ..PeerStatus::default()
            }],
        };
        let text = render_status(&s);
        let want = format!(
            "private_key={K1}\nlisten_port=51820\npublic_key={K2}\nprotocol_version=1\nendpoint=192.0.2.1:51820\n\
             last_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\ntx_bytes=10\nrx_bytes=20\n\
             persistent_keepalive_interval=25\nallowed_ip=10.0.0.2/32\nerrno=0\n\n"
        );
        assert_eq!(text, want);
        assert_eq!(key_hex(&parse_key(K1).expect("key")), K1);
    }
}
