//! SNAT rules and the keys of their mappings (the packet path is in
//! `snat`). Real servers (any host of a rule's source networks) reach the
//! outside through the balancer, going out from one of the rule's addresses
//! and a port of the core, as FNAT's local ports are allocated; replies to
//! that address and port come back to them.
//!
//! Sessions live in the same tables as the services': keyed by the inside
//! host's address and port and a context naming the rule and protocol
//! ([`SNAT`] set), the address and port they go out from in the record's
//! FNAT fields. The mapping is endpoint-independent (one inside address and
//! port goes out as one outside port, whatever it talks to), as RFC 4787
//! asks of a NAT; TCP mappings start only with a SYN.

use std::net::IpAddr;

use super::family::Family;
use super::{Plane, addr_key};
use crate::session::Key;
use gatehouse_wire::packet::{Ip, PROTO_TCP};

/// Marks an SNAT session's service field (and key context): the rule in
/// the low bits.
pub const SNAT: u16 = 0x4000;
/// With [`SNAT`]: a TCP mapping (TCP and UDP keep separate ones).
pub(super) const SNAT_TCP: u16 = 0x2000;
pub(super) const RULE_MASK: u16 = 0x1fff;

/// One `l4.snat[]` rule, compiled.
#[derive(Clone, Debug, PartialEq)]
pub struct SnatRule {
    pub name: String,
    /// Source networks: (address as an IPv6 or IPv4-mapped number, prefix
    /// length in that 128-bit space).
    pub sources: Vec<(u128, u8)>,
    /// The addresses it goes out as: indexes into `Plane::local_addrs`.
    pub addrs: Vec<u16>,
    /// Timeouts in ticks, by state.
    pub timeouts: [u32; 4],
}

/// Whether a session's service field names an SNAT rule.
pub fn is_snat(service: u16) -> bool {
    service & SNAT != 0 && service & crate::session::REVERSE == 0
}

/// A network as one 128-bit space holds both families (IPv4 as
/// `::ffff:a.b.c.d`): its address, masked, and its prefix length there.
pub fn prefix(addr: IpAddr, len: u8) -> (u128, u8) {
    let len = if addr.is_ipv4() { len.min(32) + 96 } else { len.min(128) };
    let mask = if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) };
    (addr_key(addr) & mask, len)
}

/// Whether address `a` (as [`prefix`] counts it) is in network `net`.
pub fn in_prefix(a: u128, (net, len): (u128, u8)) -> bool {
    len == 0 || (a ^ net) >> (128 - u32::from(len.min(128))) == 0
}

impl SnatRule {
    /// A rule from networks given as (address, prefix length in its family).
    pub fn new(name: String, nets: &[(IpAddr, u8)], timeouts: [u32; 4]) -> SnatRule {
        let sources = nets.iter().map(|&(a, len)| prefix(a, len)).collect();
        SnatRule { name, sources, addrs: Vec::new(), timeouts }
    }
}

impl Plane {
    /// Adds SNAT rules, each with the addresses it goes out as and their
    /// ports (`first..=last`), after the FNAT local addresses; the plane
    /// owns and answers for them too.
    pub fn with_snat(mut self, rules: Vec<(SnatRule, Vec<IpAddr>, (u16, u16))>) -> Plane {
        for (mut rule, addrs, ports) in rules {
            for a in addrs {
                let i = match self.local_addrs.iter().position(|x| *x == a) {
                    Some(i) => i,
                    None => {
                        self.local_addrs.push(a);
                        self.local_ports.push(ports);
                        if !self.owned.contains(&a) {
                            self.owned.push(a);
                        }
                        self.local_addrs.len() - 1
                    }
                };
                rule.addrs.push(i as u16);
            }
            self.snat.push(rule);
        }
        self.owned.sort();
        self
    }

    /// The first rule whose sources hold `src`.
    pub(super) fn snat_rule(&self, src: IpAddr) -> Option<u16> {
        if self.snat.is_empty() {
            return None;
        }
        let a = addr_key(src);
        self.snat.iter().position(|r| r.sources.iter().any(|&n| in_prefix(a, n))).map(|i| i as u16)
    }

    /// The timeouts of a session's service or SNAT rule.
    pub(super) fn timeouts_of(&self, service: u16) -> [u32; 4] {
        if is_snat(service) {
            self.snat.get(usize::from(service & RULE_MASK)).map_or([0; 4], |r| r.timeouts)
        } else {
            self.services.get(usize::from(service)).map_or([0; 4], |s| s.timeouts)
        }
    }
}

/// The service field of a mapping of `rule` for protocol `proto`.
pub(super) fn snat_key_for(rule: u16, proto: u8) -> u16 {
    SNAT | if proto == PROTO_TCP { SNAT_TCP } else { 0 } | (rule & RULE_MASK)
}

/// The protocol of an SNAT session's service field.
pub(super) fn snat_proto(service: u16) -> u8 {
    if service & SNAT_TCP != 0 { PROTO_TCP } else { gatehouse_wire::packet::PROTO_UDP }
}

/// The key of an inside host's mapping.
pub(super) fn snat_key<A: Family>(rule: u16, ip: &Ip) -> Key<A> {
    let tcp = if ip.flow.proto == PROTO_TCP { SNAT_TCP } else { 0 };
    Key { addr: A::of(ip.flow.src), port: ip.flow.sport, context: SNAT | tcp | rule }
}
