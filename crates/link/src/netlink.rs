//! The interface's setup through rtnetlink, as `ip` would do it: the link
//! up with its MTU, its addresses, and routes into the tunnel for the
//! peers' allowed IPs. Each request is acknowledged or its error returned.

use std::io::{self, Read};
use std::net::IpAddr;

use socket2::{Domain, Protocol, Socket, Type};

const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETADDR: u16 = 22;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RT_TABLE_MAIN: u8 = 254;
const RT_TABLE_LOCAL: u8 = 255;
const RT_SCOPE_HOST: u8 = 254;
const RTN_LOCAL: u8 = 2;
/// Routes this plane adds carry this protocol number ("static").
const RTPROT_STATIC: u8 = 4;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RT_SCOPE_LINK: u8 = 253;
const RTN_UNICAST: u8 = 1;

/// One request under construction: header, fixed part, attributes.
struct Msg(Vec<u8>);

impl Msg {
    fn new(kind: u16, flags: i32) -> Msg {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(&0u32.to_ne_bytes()); // length, set at the end
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&((flags | libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
        b.extend_from_slice(&1u32.to_ne_bytes()); // sequence
        b.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's
        Msg(b)
    }

    fn put(&mut self, bytes: &[u8]) -> &mut Msg {
        self.0.extend_from_slice(bytes);
        self
    }

    fn attr(&mut self, kind: u16, value: &[u8]) -> &mut Msg {
        let len = 4 + value.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(value);
        self.0.resize(self.0.len().next_multiple_of(4), 0);
        self
    }

    /// Sends it on a socket of its own, returned for the answer.
    fn submit(&mut self) -> io::Result<Socket> {
        let len = self.0.len() as u32;
        self.0[..4].copy_from_slice(&len.to_ne_bytes());
        let sock = Socket::new(Domain::from(libc::AF_NETLINK), Type::RAW, Some(Protocol::from(libc::NETLINK_ROUTE)))?;
        sock.send(&self.0)?;
        Ok(sock)
    }

    /// Sends it and waits for the kernel's acknowledgement.
    fn send(&mut self) -> io::Result<()> {
        let mut sock = self.submit()?;
        let mut buf = [0u8; 4096];
        let n = sock.read(&mut buf)?;
        if n >= 20 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
            let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
            return if code == 0 { Ok(()) } else { Err(io::Error::from_raw_os_error(-code)) };
        }
        Err(io::Error::other("netlink: no acknowledgement"))
    }
}

fn family(a: IpAddr) -> u8 {
    if a.is_ipv4() { libc::AF_INET as u8 } else { libc::AF_INET6 as u8 }
}

fn octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

/// The interface's index.
pub fn ifindex(name: &str) -> io::Result<u32> {
    nix::net::if_::if_nametoindex(name).map_err(io::Error::from)
}

/// Sets the MTU and brings the link up.
pub fn link_up(index: u32, mtu: u32) -> io::Result<()> {
    let up = libc::IFF_UP as u32;
    // ifinfomsg: family, pad, type, index, flags, change.
    let mut info = Vec::with_capacity(16);
    info.extend_from_slice(&[0, 0, 0, 0]);
    info.extend_from_slice(&(index as i32).to_ne_bytes());
    info.extend_from_slice(&up.to_ne_bytes());
    info.extend_from_slice(&up.to_ne_bytes());
    Msg::new(RTM_NEWLINK, 0).put(&info).attr(IFLA_MTU, &mtu.to_ne_bytes()).send()
}

fn address(kind: u16, flags: i32, index: u32, addr: IpAddr, prefix: u8) -> io::Result<()> {
    // ifaddrmsg: family, prefix length, flags, scope, index.
    let mut m = vec![family(addr), prefix, 0, RT_SCOPE_UNIVERSE];
    m.extend_from_slice(&index.to_ne_bytes());
    let a = octets(addr);
    Msg::new(kind, flags).put(&m).attr(IFA_LOCAL, &a).attr(IFA_ADDRESS, &a).send()
}

/// Gives the interface `addr/prefix` (replacing it if present).
pub fn add_address(index: u32, addr: IpAddr, prefix: u8) -> io::Result<()> {
    address(RTM_NEWADDR, libc::NLM_F_CREATE | libc::NLM_F_REPLACE, index, addr, prefix)
}

/// The addresses of the interface with index `index`, with their prefix
/// lengths (IPv6 link-local ones included).
pub fn addresses(index: u32) -> io::Result<Vec<(IpAddr, u8)>> {
    // ifaddrmsg of a dump of every family: all zeros.
    let mut sock = Msg::new(RTM_GETADDR, libc::NLM_F_DUMP).put(&[0; 8]).submit()?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = sock.read(&mut buf)?;
        let mut at = 0;
        while at + 16 <= n {
            let len = u32::from_ne_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if len < 16 || at + len > n {
                return Err(io::Error::other("netlink: truncated address dump"));
            }
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let code = buf.get(at + 16..at + 20).map_or(0, |c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
                    return Err(io::Error::from_raw_os_error(-code));
                }
                RTM_NEWADDR => out.extend(parse_address(&buf[at + 16..at + len], index)),
                _ => {}
            }
            at += len.next_multiple_of(4);
        }
    }
}

/// One RTM_NEWADDR body (ifaddrmsg and attributes): its address if it is
/// on interface `index`.
fn parse_address(body: &[u8], index: u32) -> Option<(IpAddr, u8)> {
    let (head, mut attrs) = (body.get(..8)?, body.get(8..)?);
    let (family, prefix) = (head[0], head[1]);
    if u32::from_ne_bytes([head[4], head[5], head[6], head[7]]) != index {
        return None;
    }
    let (mut local, mut address) = (None, None);
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        let value = attrs.get(4..len.max(4))?;
        let ip = match (family as i32, value.len()) {
            (libc::AF_INET, 4) => Some(IpAddr::from(<[u8; 4]>::try_from(value).ok()?)),
            (libc::AF_INET6, 16) => Some(IpAddr::from(<[u8; 16]>::try_from(value).ok()?)),
            _ => None,
        };
        match kind {
            IFA_LOCAL => local = ip,
            IFA_ADDRESS => address = ip,
            _ => {}
        }
        attrs = attrs.get(len.next_multiple_of(4).min(attrs.len())..)?;
    }
    Some((local.or(address)?, prefix))
}

/// A removal's result, where `errno` says what was to go was not there.
fn absent_ok(r: io::Result<()>, errno: i32) -> io::Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(errno) => Ok(()),
        r => r,
    }
}

/// Takes `addr/prefix` off the interface; an address already gone is no error.
pub fn del_address(index: u32, addr: IpAddr, prefix: u8) -> io::Result<()> {
    absent_ok(address(RTM_DELADDR, 0, index, addr, prefix), libc::EADDRNOTAVAIL)
}

/// Where a route goes and what it is: its rtmsg's table, protocol, scope
/// and type.
struct RouteKind {
    table: u8,
    protocol: u8,
    scope: u8,
    kind: u8,
}

/// A route through the interface, in the main table: what this crate adds.
const THROUGH: RouteKind =
    RouteKind { table: RT_TABLE_MAIN, protocol: RTPROT_STATIC, scope: RT_SCOPE_LINK, kind: RTN_UNICAST };
/// The local route the kernel makes for an address (any protocol).
const LOCAL: RouteKind = RouteKind { table: RT_TABLE_LOCAL, protocol: 0, scope: RT_SCOPE_HOST, kind: RTN_LOCAL };

fn route(kind: u16, flags: i32, index: u32, net: IpAddr, prefix: u8, r: &RouteKind) -> io::Result<()> {
    // rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
    let mut m = vec![family(net), prefix, 0, 0, r.table, r.protocol, r.scope, r.kind];
    m.extend_from_slice(&0u32.to_ne_bytes());
    Msg::new(kind, flags).put(&m).attr(RTA_DST, &octets(net)).attr(RTA_OIF, &index.to_ne_bytes()).send()
}

/// Removes the local route the kernel made for address `addr` of the
/// interface: the address stays on it (a routing daemon still sees it),
/// but the host no longer takes packets for it, nor answers ARP or
/// neighbour solicitations for it there. A route already gone is no error.
pub fn del_local_route(index: u32, addr: IpAddr) -> io::Result<()> {
    let len = if addr.is_ipv4() { 32 } else { 128 };
    absent_ok(route(RTM_DELROUTE, 0, index, addr, len, &LOCAL), libc::ESRCH)
}

/// Routes `net/prefix` into the interface (replacing a route to the same
/// prefix in the main table).
pub fn add_route(index: u32, net: IpAddr, prefix: u8) -> io::Result<()> {
    route(RTM_NEWROUTE, libc::NLM_F_CREATE | libc::NLM_F_REPLACE, index, net, prefix, &THROUGH)
}

/// Removes a route [`add_route`] added; a route already gone is no error.
pub fn del_route(index: u32, net: IpAddr, prefix: u8) -> io::Result<()> {
    absent_ok(route(RTM_DELROUTE, 0, index, net, prefix, &THROUGH), libc::ESRCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_interface_lists_its_addresses() {
        let lo = ifindex("lo").expect("lo");
        let got = addresses(lo).expect("dump");
        assert!(got.contains(&(IpAddr::from([127, 0, 0, 1]), 8)), "{got:?}");
    }

    #[test]
    fn an_address_body_of_another_interface_or_cut_short_is_skipped() {
        // ifaddrmsg for AF_INET /32 on index 7, then IFA_LOCAL 192.0.2.1.
        let mut body = vec![libc::AF_INET as u8, 32, 0, 0];
        body.extend_from_slice(&7u32.to_ne_bytes());
        body.extend_from_slice(&8u16.to_ne_bytes());
        body.extend_from_slice(&IFA_LOCAL.to_ne_bytes());
        body.extend_from_slice(&[192, 0, 2, 1]);
        assert_eq!(parse_address(&body, 7), Some((IpAddr::from([192, 0, 2, 1]), 32)));
        assert_eq!(parse_address(&body, 8), None);
        assert_eq!(parse_address(&body[..10], 7), None);
    }
}
