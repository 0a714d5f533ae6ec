//! Cryptokey routing (whitepaper section 2): each peer owns a set of IP
//! prefixes. Sending, the longest prefix holding a packet's destination
//! picks the peer; receiving, a decrypted packet is accepted only if the
//! longest prefix holding its source belongs to the peer it came from.
//!
//! A table per address family keeps one hash map per prefix length in use,
//! longest first: a lookup probes only the lengths configured (a handful in
//! practice: /32, /24, /0), each one hash probe. The maps hash with
//! FxHash: what goes into them is configuration, so no packet can crowd a
//! bucket, and a packet's address only looks one up (std's SipHash cost
//! the router about a tenth of its instructions a packet).

use std::net::IpAddr;

use rustc_hash::FxHashMap;

/// A prefix longer than its address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadPrefix;

impl std::fmt::Display for BadPrefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an allowed IP's prefix is longer than its address (at most /32 for IPv4, /128 for IPv6)")
    }
}

impl std::error::Error for BadPrefix {}

/// One family's prefixes: (length, map from masked address to owner),
/// longest length first.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
struct Table<P> {
    bits: u8,
    by_len: Vec<(u8, FxHashMap<u128, P>)>,
}

impl<P: Copy + Eq> Table<P> {
    fn new(bits: u8) -> Self {
        Table { bits, by_len: Vec::new() }
    }

    fn mask(&self, addr: u128, len: u8) -> u128 {
        let shift = u32::from(self.bits - len);
        if len == 0 { 0 } else { addr >> shift << shift }
    }

    fn insert(&mut self, addr: u128, len: u8, peer: P) -> Result<(), BadPrefix> {
        if len > self.bits {
            return Err(BadPrefix);
        }
        let key = self.mask(addr, len);
        let at = match self.by_len.iter().position(|(l, _)| *l <= len) {
            Some(i) if self.by_len[i].0 == len => i,
            Some(i) => {
                self.by_len.insert(i, (len, FxHashMap::default()));
                i
            }
            None => {
                self.by_len.push((len, FxHashMap::default()));
                self.by_len.len() - 1
            }
        };
        self.by_len[at].1.insert(key, peer);
        Ok(())
    }

    fn lookup(&self, addr: u128) -> Option<P> {
        self.by_len.iter().find_map(|(len, map)| map.get(&self.mask(addr, *len)).copied())
    }

    fn remove(&mut self, addr: u128, len: u8) {
        let key = self.mask(addr, len.min(self.bits));
        for (l, map) in &mut self.by_len {
            if *l == len {
                map.remove(&key);
            }
        }
        self.by_len.retain(|(_, m)| !m.is_empty());
    }

    fn remove_peer(&mut self, peer: P) {
        for (_, map) in &mut self.by_len {
            map.retain(|_, p| *p != peer);
        }
        self.by_len.retain(|(_, m)| !m.is_empty());
    }

    fn of(&self, peer: P) -> impl Iterator<Item = (u128, u8)> + '_ {
        self.by_len
            .iter()
            .flat_map(move |(len, map)| map.iter().filter(move |(_, p)| **p == peer).map(|(a, _)| (*a, *len)))
    }
}

/// Every peer's prefixes, both families.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct AllowedIps<P> {
    v4: Table<P>,
    v6: Table<P>,
}

impl<P: Copy + Eq> Default for AllowedIps<P> {
    fn default() -> Self {
        AllowedIps { v4: Table::new(32), v6: Table::new(128) }
    }
}

impl<P: Copy + Eq> AllowedIps<P> {
    /// Gives `net/len` to `peer` (taking it from any peer that had it).
    pub fn insert(&mut self, net: IpAddr, len: u8, peer: P) -> Result<(), BadPrefix> {
        match net {
            IpAddr::V4(a) => self.v4.insert(u128::from(u32::from(a)), len, peer),
            IpAddr::V6(a) => self.v6.insert(u128::from(a), len, peer),
        }
    }

    /// Takes `net/len` away from whoever has it.
    pub fn remove(&mut self, net: IpAddr, len: u8) {
        match net {
            IpAddr::V4(a) => self.v4.remove(u128::from(u32::from(a)), len),
            IpAddr::V6(a) => self.v6.remove(u128::from(a), len),
        }
    }

    /// Takes every prefix away from `peer`.
    pub fn remove_peer(&mut self, peer: P) {
        self.v4.remove_peer(peer);
        self.v6.remove_peer(peer);
    }

    /// The peer owning the longest prefix that holds `addr`.
    pub fn lookup(&self, addr: IpAddr) -> Option<P> {
        match addr {
            IpAddr::V4(a) => self.v4.lookup(u128::from(u32::from(a))),
            IpAddr::V6(a) => self.v6.lookup(u128::from(a)),
        }
    }

    /// `peer`'s prefixes (for `wg show`).
    pub fn of(&self, peer: P) -> Vec<(IpAddr, u8)> {
        let v4 = self.v4.of(peer).map(|(a, l)| (IpAddr::from(std::net::Ipv4Addr::from(a as u32)), l));
        let v6 = self.v6.of(peer).map(|(a, l)| (IpAddr::from(std::net::Ipv6Addr::from(a)), l));
        v4.chain(v6).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn the_longest_prefix_wins_and_sets_move_between_peers() {
        let mut t = AllowedIps::default();
        t.insert(ip("10.0.0.0"), 8, 1).expect("ok");
        t.insert(ip("10.1.0.0"), 16, 2).expect("ok");
        t.insert(ip("10.1.2.3"), 32, 3).expect("ok");
        t.insert(ip("0.0.0.0"), 0, 4).expect("ok");
        t.insert(ip("fd00::"), 8, 5).expect("ok");
        assert_eq!(t.lookup(ip("10.9.9.9")), Some(1));
        assert_eq!(t.lookup(ip("10.1.9.9")), Some(2));
        assert_eq!(t.lookup(ip("10.1.2.3")), Some(3));
        assert_eq!(t.lookup(ip("192.0.2.1")), Some(4));
        assert_eq!(t.lookup(ip("fd12::1")), Some(5));
        assert_eq!(t.lookup(ip("2001:db8::1")), None, "no ::/0");
        t.insert(ip("10.1.255.255"), 16, 6).expect("host bits are masked off");
        assert_eq!(t.lookup(ip("10.1.9.9")), Some(6));
        t.remove_peer(6);
        assert_eq!(t.lookup(ip("10.1.9.9")), Some(1));
        t.remove(ip("0.0.0.0"), 0);
        assert_eq!(t.lookup(ip("192.0.2.1")), None);
        assert_eq!(t.of(3), vec![(ip("10.1.2.3"), 32)]);
        assert_eq!(t.insert(ip("10.0.0.0"), 33, 7), Err(BadPrefix));
    }

    #[test]
    fn lookups_agree_with_a_linear_scan() {
        let mut rng = fastrand::Rng::with_seed(21);
        let mut t = AllowedIps::default();
        let mut list: Vec<(u32, u8, u16)> = Vec::new();
        for peer in 0..300u16 {
            let len = [0u8, 8, 12, 16, 20, 24, 28, 32][rng.usize(..8)];
            // Few distinct top bytes, so prefixes nest and overlap.
            let addr = (u32::from(rng.u8(..4)) << 24) | rng.u32(..(1 << 24));
            t.insert(IpAddr::from(std::net::Ipv4Addr::from(addr)), len, peer).expect("ok");
            let masked = if len == 0 { 0 } else { addr >> (32 - len) << (32 - len) };
            list.retain(|(a, l, _)| !(*a == masked && *l == len));
            list.push((masked, len, peer));
        }
        for _ in 0..20_000 {
            let addr = (u32::from(rng.u8(..5)) << 24) | rng.u32(..(1 << 24));
            let want = list
                .iter()
                .filter(|(a, l, _)| *l == 0 || addr >> (32 - l) == a >> (32 - l))
                .max_by_key(|(_, l, _)| *l)
                .map(|(_, _, p)| *p);
            assert_eq!(t.lookup(IpAddr::from(std::net::Ipv4Addr::from(addr))), want, "{addr:#x}");
        }
    }
}
