//! Router mode's XDP programs (bpf/router.c, compiled by build.rs): loaded
//! and attached with aya, one on the LAN NIC and one on the WAN NIC, their
//! maps kept equal to the peers' allowed IPs, the host's addresses and the
//! tunnel's port. Detached when dropped, and the NICs are the kernel's
//! again.

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::RawFd;

use aya::Ebpf;
use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, MapData, XskMap};
use aya::programs::{Xdp, XdpFlags};

// ELF parsing needs the object aligned as the ELF structures are.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/router.o"));

/// An address as the programs' 16-byte key (IPv4 as ::ffff:a.b.c.d).
fn addr_key(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// A network as the LPM key: masked address key, prefix length in the
/// 128-bit space (IPv4 from bit 96).
fn net_key(addr: IpAddr, len: u8) -> ([u8; 16], u32) {
    let (bits, len) = match addr {
        IpAddr::V4(_) => (u128::from_be_bytes(addr_key(addr)), u32::from(len.min(32)) + 96),
        IpAddr::V6(a) => (u128::from(a), u32::from(len.min(128))),
    };
    let mask = if len == 0 { 0 } else { u128::MAX << (128 - len) };
    ((bits & mask).to_be_bytes(), len)
}

/// What the programs steer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wanted {
    /// The peers' allowed IPs.
    pub allowed: HashSet<([u8; 16], u32)>,
    /// The host's addresses on both NICs.
    pub host: HashSet<[u8; 16]>,
    pub port: u16,
}

impl Wanted {
    pub fn new(allowed: &[(IpAddr, u8)], host: &[IpAddr], port: u16) -> Wanted {
        Wanted {
            allowed: allowed.iter().map(|(a, l)| net_key(*a, *l)).collect(),
            host: host.iter().map(|a| addr_key(*a)).collect(),
            port,
        }
    }
}

/// Why the programs could not be loaded, attached or told what to steer.
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    #[error("{what}: {source}")]
    Bpf { what: String, source: Box<dyn std::error::Error + Send + Sync> },
    /// The embedded object lacks a program or map (a build mismatch).
    #[error("the XDP object has no {0}")]
    Missing(&'static str),
}

fn err<W: Into<String>, E: std::error::Error + Send + Sync + 'static>(what: W) -> impl FnOnce(E) -> SteerError {
    move |e| SteerError::Bpf { what: what.into(), source: Box::new(e) }
}

/// Both programs attached.
pub struct Steering {
    bpf: Ebpf,
    current: Wanted,
    /// Native (driver) mode on each side; false: generic (skb) mode.
    pub native: [bool; 2],
}

/// The sides, as the programs and maps name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Nic {
    Lan,
    Wan,
}

impl Nic {
    fn program(self) -> &'static str {
        match self {
            Nic::Lan => "gatehouse_wg_lan",
            Nic::Wan => "gatehouse_wg_wan",
        }
    }

    fn sockets(self) -> &'static str {
        match self {
            Nic::Lan => "LAN_XSKS",
            Nic::Wan => "WAN_XSKS",
        }
    }
}

impl Steering {
    /// Loads and verifies both programs and makes their maps; attaches
    /// nothing (a takeover loads while the process before still routes).
    pub fn load() -> Result<Steering, SteerError> {
        let mut bpf = Ebpf::load(OBJECT).map_err(err("loading the XDP programs"))?;
        for nic in [Nic::Lan, Nic::Wan] {
            let prog: &mut Xdp = bpf
                .program_mut(nic.program())
                .ok_or(SteerError::Missing("router program"))?
                .try_into()
                .map_err(err(nic.program()))?;
            prog.load().map_err(err(format!("verifying {}", nic.program())))?;
        }
        Ok(Steering { bpf, current: Wanted::default(), native: [false; 2] })
    }

    /// Attaches the programs to the NICs, in native mode where the driver
    /// has it: from now on the maps decide what the router takes.
    pub fn attach(&mut self, lan: &str, wan: &str) -> Result<(), SteerError> {
        for (k, (nic, name)) in [(Nic::Lan, lan), (Nic::Wan, wan)].into_iter().enumerate() {
            let prog: &mut Xdp = self
                .bpf
                .program_mut(nic.program())
                .ok_or(SteerError::Missing("router program"))?
                .try_into()
                .map_err(err(nic.program()))?;
            self.native[k] = match prog.attach(name, XdpFlags::DRV_MODE) {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(interface = name, error = %e, "native XDP refused; using generic (skb) mode");
                    prog.attach(name, XdpFlags::SKB_MODE).map_err(err(format!("attaching XDP to {name}")))?;
                    false
                }
            };
        }
        Ok(())
    }

    /// Registers the AF_XDP socket of a side's queue.
    pub fn set_socket(&mut self, nic: Nic, queue: u32, fd: RawFd) -> Result<(), SteerError> {
        let map = self.bpf.map_mut(nic.sockets()).ok_or(SteerError::Missing("XSKS map"))?;
        let mut xsks: XskMap<&mut MapData> = XskMap::try_from(map).map_err(err(nic.sockets()))?;
        xsks.set(queue, fd, 0).map_err(err(format!("registering the socket of queue {queue}")))
    }

    /// Makes the maps equal `wanted`: new entries first, stale ones after.
    pub fn update(&mut self, wanted: &Wanted) -> Result<(), SteerError> {
        if *wanted == self.current {
            return Ok(());
        }
        let map = self.bpf.map_mut("ALLOWED").ok_or(SteerError::Missing("ALLOWED map"))?;
        let mut lpm: LpmTrie<&mut MapData, [u8; 16], u8> = LpmTrie::try_from(map).map_err(err("ALLOWED"))?;
        for (a, len) in wanted.allowed.difference(&self.current.allowed) {
            lpm.insert(&LpmKey::new(*len, *a), 1u8, 0).map_err(err("adding to ALLOWED"))?;
        }
        for (a, len) in self.current.allowed.difference(&wanted.allowed) {
            lpm.remove(&LpmKey::new(*len, *a)).map_err(err("removing from ALLOWED"))?;
        }
        let map = self.bpf.map_mut("HOST").ok_or(SteerError::Missing("HOST map"))?;
        let mut host: HashMap<&mut MapData, [u8; 16], u8> = HashMap::try_from(map).map_err(err("HOST"))?;
        for a in wanted.host.difference(&self.current.host) {
            host.insert(a, 1u8, 0).map_err(err("adding to HOST"))?;
        }
        for a in self.current.host.difference(&wanted.host) {
            host.remove(a).map_err(err("removing from HOST"))?;
        }
        let map = self.bpf.map_mut("PORT").ok_or(SteerError::Missing("PORT map"))?;
        let mut port: Array<&mut MapData, u32> = Array::try_from(map).map_err(err("PORT"))?;
        // The program compares the port's two bytes as they lie in memory.
        port.set(0, u32::from(u16::from_ne_bytes(wanted.port.to_be_bytes())), 0).map_err(err("setting PORT"))?;
        self.current = wanted.clone();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_are_keyed_as_the_program_looks_them_up() {
        let (k, len) = net_key("10.1.2.3".parse().expect("ip"), 16);
        assert_eq!(len, 112);
        assert_eq!(&k[10..], &[0xff, 0xff, 10, 1, 0, 0]);
        let (k, len) = net_key("fd00:1::7".parse().expect("ip"), 64);
        assert_eq!(len, 64);
        assert_eq!(u128::from_be_bytes(k), u128::from("fd00:1::".parse::<std::net::Ipv6Addr>().expect("ip")));
        assert_eq!(net_key("0.0.0.0".parse().expect("ip"), 0).1, 96);
    }
}
