//! The interface's link as the kernel sees it: brought up with its MTU,
//! its addresses and the routes to the peers' allowed prefixes (netlink),
//! and kept in step when a new config changes them.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::shared::Settings;
use gatehouse_link::netlink;

/// Every peer's allowed prefixes, each once, in order (the config holds
/// them as network addresses).
fn allowed_prefixes(s: &Settings) -> Vec<IpNet> {
    let mut r: Vec<IpNet> = s.peers.iter().flat_map(|p| p.allowed_ips.iter().copied()).collect();
    r.sort();
    r.dedup();
    r
}

fn routes_of(s: &Settings) -> Vec<(IpAddr, u8)> {
    if !s.routes {
        return Vec::new();
    }
    allowed_prefixes(s).iter().map(|n| (n.addr(), n.prefix_len())).collect()
}

/// The peers' prefixes outside every network of the interface's own
/// addresses: networks behind the peers (sites), which hosts other than
/// this one reach through it only if it forwards IP packets. Default
/// routes are left out: a host sending everything to a peer is its client.
pub fn networks_behind_peers(s: &Settings) -> Vec<IpNet> {
    let own: Vec<IpNet> = s.addresses.iter().filter_map(|&(a, len)| IpNet::new(a, len).ok()).collect();
    allowed_prefixes(s).into_iter().filter(|n| n.prefix_len() > 0 && !inside_any(&own, n)).collect()
}

/// Whether `n` lies inside one of `nets` (of its own family).
fn inside_any(nets: &[IpNet], n: &IpNet) -> bool {
    nets.iter().any(|o| o.contains(n))
}

/// What the kernel refused of an interface's link, addresses or routes.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("cannot bring {name} up with MTU {mtu}: {source}")]
    Up { name: String, mtu: u32, source: std::io::Error },
    #[error("cannot add {addr}/{len} to {name}: {source}")]
    AddAddress { name: String, addr: IpAddr, len: u8, source: std::io::Error },
    #[error("cannot remove {addr}/{len} from {name}: {source}")]
    RemoveAddress { name: String, addr: IpAddr, len: u8, source: std::io::Error },
    #[error("cannot route {net}/{len} into {name}: {source}")]
    AddRoute { name: String, net: IpAddr, len: u8, source: std::io::Error },
    #[error("cannot remove the route to {net}/{len} from {name}: {source}")]
    RemoveRoute { name: String, net: IpAddr, len: u8, source: std::io::Error },
}

/// The link up with its MTU, addresses and routes.
pub(crate) fn setup_link(index: u32, s: &Settings) -> Result<(), LinkError> {
    up(index, &s.name, s.mtu)?;
    for &(addr, len) in &s.addresses {
        address(index, &s.name, addr, len, true)?;
    }
    for (net, len) in routes_of(s) {
        route(index, &s.name, net, len, true)?;
    }
    Ok(())
}

/// What changed between `old` and `new`: the MTU, addresses removed and
/// added, routes removed and added.
pub(crate) fn update_link(index: u32, old: &Settings, new: &Settings) -> Result<(), LinkError> {
    if old.mtu != new.mtu {
        up(index, &new.name, new.mtu)?;
    }
    for &(addr, len) in old.addresses.iter().filter(|a| !new.addresses.contains(a)) {
        address(index, &new.name, addr, len, false)?;
    }
    for &(addr, len) in new.addresses.iter().filter(|a| !old.addresses.contains(a)) {
        address(index, &new.name, addr, len, true)?;
    }
    let (was, now) = (routes_of(old), routes_of(new));
    for &(net, len) in was.iter().filter(|r| !now.contains(r)) {
        route(index, &new.name, net, len, false)?;
    }
    for &(net, len) in now.iter().filter(|r| !was.contains(r)) {
        route(index, &new.name, net, len, true)?;
    }
    Ok(())
}

fn up(index: u32, name: &str, mtu: u32) -> Result<(), LinkError> {
    netlink::link_up(index, mtu).map_err(|source| LinkError::Up { name: name.into(), mtu, source })
}

fn address(index: u32, name: &str, addr: IpAddr, len: u8, add: bool) -> Result<(), LinkError> {
    if add {
        netlink::add_address(index, addr, len).map_err(|source| LinkError::AddAddress {
            name: name.into(),
            addr,
            len,
            source,
        })
    } else {
        netlink::del_address(index, addr, len).map_err(|source| LinkError::RemoveAddress {
            name: name.into(),
            addr,
            len,
            source,
        })
    }
}

fn route(index: u32, name: &str, net: IpAddr, len: u8, add: bool) -> Result<(), LinkError> {
    if add {
        netlink::add_route(index, net, len).map_err(|source| LinkError::AddRoute {
            name: name.into(),
            net,
            len,
            source,
        })
    } else {
        netlink::del_route(index, net, len).map_err(|source| LinkError::RemoveRoute {
            name: name.into(),
            net,
            len,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_config::{WgPeer, WgPublicKey, WgSecret};

    fn peer(n: u8, allowed: &[&str]) -> WgPeer {
        WgPeer {
            name: format!("p{n}"),
            public_key: WgPublicKey([n; 32]),
            preshared_key: None,
            endpoint: None,
            allowed_ips: allowed.iter().map(|a| a.parse().expect("a prefix")).collect(),
            persistent_keepalive: None,
        }
    }

    #[test]
    fn networks_behind_peers_are_those_outside_the_interface_s_own() {
        let s = Settings {
            name: "wg0".into(),
            secret: WgSecret(zeroize::Zeroizing::new([1; 32])),
            public: [2; 32],
            listen_port: 51820,
            addresses: vec![("10.9.0.1".parse().expect("ip"), 24), ("fd09::1".parse().expect("ip"), 64)],
            mtu: 1420,
            fwmark: 0,
            routes: true,
            router: None,
            peers: vec![
                peer(1, &["10.9.0.2/32", "fd09::2/128", "192.168.2.0/24", "10.9.0.0/16"]),
                peer(2, &["10.9.0.3/32", "2001:db8:5::/48", "192.168.2.0/24"]),
                peer(3, &["0.0.0.0/0", "::/0"]),
            ],
        };
        let nets: Vec<String> = networks_behind_peers(&s).iter().map(IpNet::to_string).collect();
        // 10.9.0.0/16 is wider than the interface's /24: a site too.
        assert_eq!(nets, ["10.9.0.0/16", "192.168.2.0/24", "2001:db8:5::/48"]);
        let none = Settings { peers: vec![peer(1, &["10.9.0.2/32", "fd09::2/128"])], ..s.clone() };
        assert!(networks_behind_peers(&none).is_empty());
        let net = |t: &str| t.parse::<IpNet>().expect("a prefix");
        assert!(inside_any(&[net("1.2.3.4/0")], &net("0.0.0.0/0")));
        assert!(!inside_any(&[net("fd09::/0")], &net("10.0.0.0/8")));
    }
}
