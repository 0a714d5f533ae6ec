//! Where a forwarded frame goes on the wire: the host's routes through the
//! plane's interface pick the next hop (the destination itself when it is
//! on the link, else the route's gateway), and the host's neighbour table
//! gives its MAC. Both are read from the kernel by the control thread and
//! published to the workers as an immutable [`NextHops`]; a worker that
//! meets an unknown neighbour drops the frame and asks the control thread
//! to resolve it (an ICMP echo makes the kernel run ARP or neighbour
//! discovery), so the retransmission finds it.

use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    pub net: IpAddr,
    pub prefix: u8,
    /// None: on the link.
    pub gateway: Option<IpAddr>,
    pub metric: u32,
}

impl Route {
    fn contains(&self, a: IpAddr) -> bool {
        match (self.net, a) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix.min(32))) };
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix.min(128))) };
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// Routes of one interface and the MACs of its neighbours.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NextHops {
    pub routes: Vec<Route>,
    pub neighbours: HashMap<IpAddr, [u8; 6]>,
}

/// Why no MAC: the address to resolve, or no route at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    Unresolved(IpAddr),
    NoRoute,
}

impl NextHops {
    /// The neighbour a packet for `dst` goes to (longest prefix, then
    /// lowest metric).
    pub fn hop(&self, dst: IpAddr) -> Option<IpAddr> {
        let r = self.routes.iter().filter(|r| r.contains(dst)).max_by_key(|r| (r.prefix, u32::MAX - r.metric))?;
        Some(r.gateway.unwrap_or(dst))
    }

    /// The MAC to send a packet for `dst` to.
    pub fn mac(&self, dst: IpAddr) -> Result<[u8; 6], Miss> {
        let hop = self.hop(dst).ok_or(Miss::NoRoute)?;
        self.neighbours.get(&hop).copied().ok_or(Miss::Unresolved(hop))
    }

    /// Reads the kernel's routes and neighbours of interface `ifindex`
    /// (named `name`).
    pub fn read(name: &str, ifindex: u32) -> std::io::Result<NextHops> {
        let mut routes = parse_routes_v4(&std::fs::read_to_string("/proc/net/route").unwrap_or_default(), name);
        routes.extend(parse_routes_v6(&std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default(), name));
        Ok(NextHops { routes, neighbours: neighbours(ifindex)? })
    }
}

fn hex_u32_le(s: &str) -> Option<u32> {
    u32::from_str_radix(s, 16).ok().map(u32::from_be)
}

/// /proc/net/route: Iface Destination Gateway Flags RefCnt Use Metric Mask
/// ..., addresses in hex, in memory (little-endian) order.
pub fn parse_routes_v4(text: &str, iface: &str) -> Vec<Route> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 8 || f[0] != iface {
                return None;
            }
            let flags = u32::from_str_radix(f[3], 16).ok()?;
            if flags & 1 == 0 {
                return None; // not up
            }
            let net = Ipv4Addr::from(hex_u32_le(f[1])?);
            let gw = Ipv4Addr::from(hex_u32_le(f[2])?);
            let mask = hex_u32_le(f[7])?;
            Some(Route {
                net: net.into(),
                prefix: mask.leading_ones() as u8,
                gateway: (flags & 2 != 0 && !gw.is_unspecified()).then_some(gw.into()),
                metric: f[6].parse().ok()?,
            })
        })
        .collect()
}

/// /proc/net/ipv6_route: dest prefix src prefix nexthop metric refcnt use
/// flags device, addresses as 32 hex digits.
pub fn parse_routes_v6(text: &str, iface: &str) -> Vec<Route> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 10 || f[9] != iface {
                return None;
            }
            let net = Ipv6Addr::from(u128::from_str_radix(f[0], 16).ok()?);
            let prefix = u8::from_str_radix(f[1], 16).ok()?;
            let gw = Ipv6Addr::from(u128::from_str_radix(f[4], 16).ok()?);
            let flags = u32::from_str_radix(f[8], 16).ok()?;
            // Skip local, multicast and reject routes (RTF_LOCAL 0x80000000, RTF_REJECT 0x200).
            if flags & 0x8000_0200 != 0 || net.segments()[0] & 0xff00 == 0xff00 {
                return None;
            }
            Some(Route {
                net: net.into(),
                prefix,
                gateway: (flags & 2 != 0 && !gw.is_unspecified()).then_some(gw.into()),
                metric: u32::from_str_radix(f[5], 16).ok()?,
            })
        })
        .collect()
}

const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// NUD_INCOMPLETE | NUD_FAILED: no usable address.
const NUD_UNUSABLE: u16 = 0x01 | 0x20;

/// The kernel's neighbour table for `ifindex` (both families), by a
/// netlink RTM_GETNEIGH dump.
pub fn neighbours(ifindex: u32) -> std::io::Result<HashMap<IpAddr, [u8; 6]>> {
    let mut sock = Socket::new(Domain::from(libc::AF_NETLINK), Type::RAW, Some(Protocol::from(libc::NETLINK_ROUTE)))?;
    // nlmsghdr (16) + ndmsg (12): every family, dumped.
    let mut req = Vec::with_capacity(28);
    req.extend_from_slice(&28u32.to_ne_bytes());
    req.extend_from_slice(&RTM_GETNEIGH.to_ne_bytes());
    req.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    req.extend_from_slice(&[0u8; 12]);
    sock.send(&req)?;
    let mut out = HashMap::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = sock.read(&mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        let mut at = 0;
        while at + 16 <= n {
            let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if len < 16 || at + len > n {
                break;
            }
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => return Err(std::io::Error::other("netlink error in the neighbour dump")),
                RTM_NEWNEIGH => {
                    if let Some((ip, mac)) = parse_neighbour(&buf[at + 16..at + len], ifindex) {
                        out.insert(ip, mac);
                    }
                }
                _ => {}
            }
            at += len.next_multiple_of(4);
        }
    }
}

/// One RTM_NEWNEIGH body: ndmsg then attributes.
fn parse_neighbour(body: &[u8], ifindex: u32) -> Option<(IpAddr, [u8; 6])> {
    let nd = body.get(..12)?;
    let index = i32::from_ne_bytes([nd[4], nd[5], nd[6], nd[7]]);
    let state = u16::from_ne_bytes([nd[8], nd[9]]);
    if index as u32 != ifindex || state & NUD_UNUSABLE != 0 || state == 0 {
        return None;
    }
    let (mut ip, mut mac) = (None, None);
    let mut at = 12;
    while at + 4 <= body.len() {
        let len = usize::from(u16::from_ne_bytes([body[at], body[at + 1]]));
        let kind = u16::from_ne_bytes([body[at + 2], body[at + 3]]);
        if len < 4 || at + len > body.len() {
            break;
        }
        let v = &body[at + 4..at + len];
        match (kind, v.len()) {
            (NDA_DST, 4) => ip = Some(IpAddr::from(<[u8; 4]>::try_from(v).ok()?)),
            (NDA_DST, 16) => ip = Some(IpAddr::from(<[u8; 16]>::try_from(v).ok()?)),
            (NDA_LLADDR, 6) => mac = <[u8; 6]>::try_from(v).ok(),
            _ => {}
        }
        at += len.next_multiple_of(4);
    }
    Some((ip?, mac?))
}

/// Makes the kernel resolve `addr` on the link: one ICMP echo request
/// (the answer, if any, is the kernel's to drop).
pub fn solicit(addr: IpAddr, device: &str) -> std::io::Result<()> {
    let (domain, proto, kind) = match addr {
        IpAddr::V4(_) => (Domain::IPV4, Protocol::ICMPV4, 8u8),
        IpAddr::V6(_) => (Domain::IPV6, Protocol::ICMPV6, 128u8),
    };
    let sock = Socket::new(domain, Type::RAW, Some(proto))?;
    sock.bind_device(Some(device.as_bytes()))?;
    let mut msg = [kind, 0, 0, 0, 0x67, 0x68, 0, 1];
    if addr.is_ipv4() {
        // ICMPv4 checksums are the sender's (the kernel does ICMPv6's).
        let sum = gatehouse_wire::checksum::checksum(&msg);
        msg[2..4].copy_from_slice(&sum.to_be_bytes());
    }
    sock.send_to(&msg, &SockAddr::from(SocketAddr::new(addr, 0)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_from_proc() {
        let v4 = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  lb0\t00000000\t01004D0A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  lb0\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  eth9\t00004E0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let r = parse_routes_v4(v4, "lb0");
        assert_eq!(r.len(), 2);
        let hops = NextHops {
            routes: r,
            neighbours: [(IpAddr::from([10, 77, 0, 1]), [1; 6]), (IpAddr::from([10, 77, 0, 11]), [2; 6])]
                .into_iter()
                .collect(),
        };
        assert_eq!(hops.hop("10.77.0.11".parse().expect("ip")), Some("10.77.0.11".parse().expect("ip")));
        assert_eq!(hops.hop("10.78.0.10".parse().expect("ip")), Some("10.77.0.1".parse().expect("ip")));
        assert_eq!(hops.mac("10.78.0.10".parse().expect("ip")), Ok([1; 6]));
        assert_eq!(
            hops.mac("10.77.0.12".parse().expect("ip")),
            Err(Miss::Unresolved("10.77.0.12".parse().expect("ip")))
        );
        assert_eq!(hops.mac("fd00::1".parse().expect("ip")), Err(Miss::NoRoute));

        let v6 = "fd000077000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001 lb0\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000077000000000000000000000001 00000400 00000001 00000000 00000003 lb0\n\
                  fd000077000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000001 00000000 80200001 lb0\n";
        let r6 = parse_routes_v6(v6, "lb0");
        assert_eq!(r6.len(), 2, "{r6:?}");
        let hops = NextHops { routes: r6, neighbours: HashMap::new() };
        assert_eq!(hops.hop("fd00:77::5".parse().expect("ip")), Some("fd00:77::5".parse().expect("ip")));
        assert_eq!(hops.hop("2001:db8::1".parse().expect("ip")), Some("fd00:77::1".parse().expect("ip")));
    }

    #[test]
    fn neighbour_messages_parse() {
        let mut body = vec![2u8, 0, 0, 0];
        body.extend_from_slice(&7i32.to_ne_bytes());
        body.extend_from_slice(&0x02u16.to_ne_bytes()); // NUD_REACHABLE
        body.extend_from_slice(&[0, 1]);
        body.extend_from_slice(&8u16.to_ne_bytes());
        body.extend_from_slice(&NDA_DST.to_ne_bytes());
        body.extend_from_slice(&[10, 77, 0, 11]);
        body.extend_from_slice(&10u16.to_ne_bytes());
        body.extend_from_slice(&NDA_LLADDR.to_ne_bytes());
        body.extend_from_slice(&[2, 0, 0, 0, 0, 0x11, 0, 0]);
        assert_eq!(parse_neighbour(&body, 7), Some((IpAddr::from([10, 77, 0, 11]), [2, 0, 0, 0, 0, 0x11])));
        assert_eq!(parse_neighbour(&body, 8), None, "another interface");
        body[8..10].copy_from_slice(&0x20u16.to_ne_bytes());
        assert_eq!(parse_neighbour(&body, 7), None, "failed entry");
        assert_eq!(parse_neighbour(&body[..5], 7), None, "truncated");
    }
}
