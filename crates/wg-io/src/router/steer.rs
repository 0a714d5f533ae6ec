//! Router mode's XDP programs (bpf/router.c, compiled by build.rs): loaded
//! with aya and attached through BPF links (`gatehouse_link::xdp_link`),
//! one on the LAN NIC and one on the WAN NIC, their maps kept equal to the
//! peers' allowed IPs, the host's addresses and the tunnel's port.
//! Detached when dropped, and the NICs are the kernel's again, unless a
//! process taking over holds the links: it swaps its own programs in
//! behind them ([`Steering::replace`]), and the NICs are never without.

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};

use aya::Ebpf;
use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, MapData, XskMap};
use aya::programs::{Xdp, XdpFlags};
use gatehouse_link::xdp_link::{self, Mode};

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

/// Both programs, loaded; attached once [`Steering::attach`] or
/// [`Steering::replace`] put them on the NICs.
pub struct Steering {
    bpf: Ebpf,
    current: Wanted,
    /// Native (driver) mode on each side; false: generic (skb) mode.
    pub native: [bool; 2],
    /// The link each side's program is attached through: `None` while
    /// not attached, or where the kernel attached it through netlink.
    links: [Option<OwnedFd>; 2],
    attached: bool,
}

/// The sides, as the programs and maps name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Nic {
    Lan,
    Wan,
}

impl Nic {
    pub(crate) fn index(self) -> usize {
        match self {
            Nic::Lan => 0,
            Nic::Wan => 1,
        }
    }

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
        Ok(Steering { bpf, current: Wanted::default(), native: [false; 2], links: [None, None], attached: false })
    }

    fn program(&mut self, nic: Nic) -> Result<&mut Xdp, SteerError> {
        self.bpf
            .program_mut(nic.program())
            .ok_or(SteerError::Missing("router program"))?
            .try_into()
            .map_err(err(nic.program()))
    }

    /// Attaches the programs to the NICs (name and index of each), through
    /// links, in native mode where the driver has it: from now on the maps
    /// decide what the router takes.
    pub fn attach(&mut self, lan: (&str, u32), wan: (&str, u32)) -> Result<(), SteerError> {
        for (nic, (name, ifindex)) in [(Nic::Lan, lan), (Nic::Wan, wan)] {
            let k = nic.index();
            let prog = self.program(nic)?;
            let fd = prog.fd().map_err(err(nic.program()))?.as_fd();
            match xdp_link::attach_best(fd, ifindex) {
                Ok(a) => {
                    if let Some(refused) = &a.driver_refused {
                        tracing::warn!(interface = name, error = %refused, "native XDP refused; using generic (skb) mode");
                    }
                    self.native[k] = a.mode == Mode::Driver;
                    self.links[k] = Some(a.link);
                    self.attached = true;
                    continue;
                }
                Err(e) => tracing::debug!(interface = name, error = %e, "no XDP link; attaching through netlink"),
            }
            // A kernel without XDP links (before 5.9): through netlink,
            // which a successor cannot take over.
            let prog = self.program(nic)?;
            self.native[k] = match prog.attach(name, XdpFlags::DRV_MODE) {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(interface = name, error = %e, "native XDP refused; using generic (skb) mode");
                    prog.attach(name, XdpFlags::SKB_MODE).map_err(err(format!("attaching XDP to {name}")))?;
                    false
                }
            };
            self.attached = true;
        }
        Ok(())
    }

    /// Whether the programs are on the NICs (attached, or swapped in).
    pub fn attached(&self) -> bool {
        self.attached
    }

    /// Lets go of the links, before attaching anew: the programs leave the
    /// NICs with the last process that holds them.
    pub fn let_go(&mut self) {
        self.links = [None, None];
        self.attached = false;
    }

    /// Swaps side `nic`'s program in behind `link`, a predecessor's, in
    /// one step (`native`: the mode that link runs in). Its sockets and
    /// maps should be ready first. On failure the link comes back.
    pub fn replace(&mut self, nic: Nic, link: OwnedFd, native: bool) -> Result<(), (SteerError, OwnedFd)> {
        match self.swap_in(nic, link.as_fd()) {
            Ok(()) => {
                self.links[nic.index()] = Some(link);
                self.native[nic.index()] = native;
                self.attached = true;
                Ok(())
            }
            Err(e) => Err((e, link)),
        }
    }

    /// Puts this process's programs back behind their own links, after a
    /// successor that swapped its own in gave up.
    pub fn reclaim(&mut self) -> Result<(), SteerError> {
        for nic in [Nic::Lan, Nic::Wan] {
            let Some(link) = self.links[nic.index()].take() else { continue };
            let r = self.swap_in(nic, link.as_fd());
            self.links[nic.index()] = Some(link);
            r?;
        }
        Ok(())
    }

    fn swap_in(&mut self, nic: Nic, link: BorrowedFd<'_>) -> Result<(), SteerError> {
        let prog = self.program(nic)?;
        let fd = prog.fd().map_err(err(nic.program()))?.as_fd();
        xdp_link::replace(link, fd).map_err(err(format!("putting {} behind the link handed over", nic.program())))
    }

    /// The link side `nic`'s program is attached through, for a successor.
    pub fn link(&self, nic: Nic) -> Option<BorrowedFd<'_>> {
        self.links[nic.index()].as_ref().map(AsFd::as_fd)
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
