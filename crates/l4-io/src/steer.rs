//! The XDP steering program (bpf/steer.c, compiled by build.rs): loaded
//! with aya and attached through a BPF link (`gatehouse_link::xdp_link`),
//! its maps kept equal to what the plane wants. A process taking over
//! receives its predecessor's link and swaps its own program in behind it
//! ([`Steering::replace`]): the interface is never without a program.

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use aya::Ebpf;
use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{HashMap, MapData, XskMap};
use aya::programs::{Xdp, XdpFlags};
use gatehouse_link::xdp_link::{self, Mode};

// ELF parsing needs the object aligned as the ELF structures are.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/steer.o"));

/// An address as the program's 16-byte key (IPv4 as ::ffff:a.b.c.d).
pub fn addr_key(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// A NAT real server as the program's key: address, port (network
/// order), protocol, zero.
pub fn real_key(a: IpAddr, port: u16, proto: u8) -> [u8; 20] {
    let mut k = [0u8; 20];
    k[..16].copy_from_slice(&addr_key(a));
    k[16..18].copy_from_slice(&port.to_be_bytes());
    k[18] = proto;
    k
}

/// What the program steers to the plane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wanted {
    /// VIPs and FNAT local addresses.
    pub owned: HashSet<[u8; 16]>,
    /// The host's own addresses (NAT replies to them are the host's).
    pub host: HashSet<[u8; 16]>,
    /// Real servers of NAT services.
    pub reals: HashSet<[u8; 20]>,
    /// SNAT source networks: (address key, prefix length in the 128-bit
    /// space).
    pub snat: HashSet<([u8; 16], u32)>,
}

/// A network as the program's LPM key: its address key, masked, and the
/// prefix length counted in the 128-bit space (IPv4 from bit 96), as the
/// plane counts it.
pub fn net_key(addr: IpAddr, len: u8) -> ([u8; 16], u32) {
    let (net, len) = gatehouse_l4::plane::prefix(addr, len);
    (net.to_be_bytes(), u32::from(len))
}

fn in_net(a: &[u8; 16], (net, len): &([u8; 16], u32)) -> bool {
    gatehouse_l4::plane::in_prefix(u128::from_be_bytes(*a), (u128::from_be_bytes(*net), *len as u8))
}

/// The program attached to one interface; detached when dropped (unless a
/// successor holds its link).
pub struct Steering {
    bpf: Ebpf,
    pub interface: String,
    /// Native (driver) mode; false: generic (skb) mode.
    pub native: bool,
    current: Wanted,
    /// The BPF link the program is attached through; `None` while not
    /// attached, or where the kernel attached it through netlink.
    link: Option<OwnedFd>,
    attached: bool,
}

/// Why the steering program could not be loaded, attached or told what
/// to steer. The plane falls back to AF_PACKET (with `io: auto`) or
/// refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    /// A step of loading, attaching or updating the program failed.
    #[error("{what}: {source}")]
    Bpf { what: String, source: Box<dyn std::error::Error + Send + Sync> },
    /// The embedded object lacks a program or map this code expects (a
    /// build mismatch).
    #[error("the XDP object has no {0}")]
    Missing(&'static str),
}

/// Maps an error of step `what`; the step's name is made only on error.
fn err<W: Into<String>, E: std::error::Error + Send + Sync + 'static>(what: W) -> impl FnOnce(E) -> SteerError {
    move |e| SteerError::Bpf { what: what.into(), source: Box::new(e) }
}

/// Maps an error of `action` ("adding to") on map `map`, per entry.
fn map_err<E: std::error::Error + Send + Sync + 'static>(
    action: &'static str,
    map: &'static str,
) -> impl FnOnce(E) -> SteerError {
    move |e| SteerError::Bpf { what: format!("{action} {map}"), source: Box::new(e) }
}

/// The program loaded into the kernel and verified, its maps made, not
/// yet attached: a process taking over loads it while the one before still
/// holds the interface (tens of milliseconds here), so that only the
/// attach falls between one process letting the interface go and the next
/// taking it.
pub struct Loaded {
    bpf: Ebpf,
}

impl Loaded {
    pub fn load() -> Result<Loaded, SteerError> {
        let mut bpf = Ebpf::load(OBJECT).map_err(err("loading the XDP program"))?;
        program(&mut bpf)?.load().map_err(err("verifying the XDP program"))?;
        Ok(Loaded { bpf })
    }

    /// Attaches to `interface` (index `ifindex`) through a new link, in
    /// native mode when the driver has it, generic mode otherwise.
    pub fn attach(self, interface: &str, ifindex: u32) -> Result<Steering, SteerError> {
        let mut s = self.unattached(interface);
        s.attach(ifindex)?;
        Ok(s)
    }

    /// Not attached yet: its sockets and maps can be made ready before it
    /// goes behind a predecessor's link ([`Steering::replace`]).
    pub fn unattached(self, interface: &str) -> Steering {
        Steering {
            bpf: self.bpf,
            interface: interface.to_string(),
            native: false,
            current: Wanted::default(),
            link: None,
            attached: false,
        }
    }
}

fn program(bpf: &mut Ebpf) -> Result<&mut Xdp, SteerError> {
    bpf.program_mut("gatehouse_steer")
        .ok_or(SteerError::Missing("gatehouse_steer program"))?
        .try_into()
        .map_err(err("gatehouse_steer"))
}

impl Steering {
    fn attach(&mut self, ifindex: u32) -> Result<(), SteerError> {
        let interface = self.interface.clone();
        let prog = program(&mut self.bpf)?;
        let fd = prog.fd().map_err(err("the XDP program"))?.as_fd();
        match xdp_link::attach_best(fd, ifindex) {
            Ok(a) => {
                if let Some(refused) = &a.driver_refused {
                    tracing::warn!(interface, error = %refused, "native XDP refused; using generic (skb) mode");
                }
                self.link = Some(a.link);
                self.native = a.mode == Mode::Driver;
                self.attached = true;
                return Ok(());
            }
            Err(e) => tracing::debug!(interface, error = %e, "no XDP link; attaching through netlink"),
        }
        // A kernel without XDP links (before 5.9): through netlink, which a
        // successor cannot take over.
        self.native = match prog.attach(interface.as_str(), XdpFlags::DRV_MODE) {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(interface, error = %e, "native XDP refused; using generic (skb) mode");
                prog.attach(interface.as_str(), XdpFlags::SKB_MODE)
                    .map_err(err(format!("attaching XDP to {interface}")))?;
                false
            }
        };
        self.attached = true;
        Ok(())
    }

    /// Swaps this program in behind `link`, a predecessor's, in one step:
    /// every packet the interface receives from then on runs this program.
    /// Its sockets and maps should be ready first. `native`: the mode the
    /// link runs in, where the predecessor said.
    /// On failure the link comes back, for another try.
    pub fn replace(&mut self, link: OwnedFd, native: Option<bool>) -> Result<(), (SteerError, OwnedFd)> {
        match self.swap_in(link.as_fd()) {
            Ok(()) => {
                self.link = Some(link);
                self.native = native.unwrap_or(self.native);
                self.attached = true;
                Ok(())
            }
            Err(e) => Err((e, link)),
        }
    }

    /// Puts this program back behind its own link, after a successor that
    /// swapped its own in gave up (its takeover did not complete).
    pub fn reclaim(&mut self) -> Result<(), SteerError> {
        let Some(link) = self.link.take() else { return Ok(()) };
        let r = self.swap_in(link.as_fd());
        self.link = Some(link);
        r
    }

    fn swap_in(&mut self, link: BorrowedFd<'_>) -> Result<(), SteerError> {
        let prog = program(&mut self.bpf)?;
        let fd = prog.fd().map_err(err("the XDP program"))?.as_fd();
        xdp_link::replace(link, fd)
            .map_err(err(format!("putting the XDP program behind the link of {}", self.interface)))
    }

    /// The link the program is attached through, for a successor.
    pub fn link(&self) -> Option<BorrowedFd<'_>> {
        self.link.as_ref().map(AsFd::as_fd)
    }

    /// Back to a loaded program, if it is not attached yet (a start that
    /// failed before the swap keeps it for its next try).
    pub fn into_loaded(self) -> Option<Loaded> {
        (!self.attached).then_some(Loaded { bpf: self.bpf })
    }

    /// Registers the AF_XDP socket of `queue`.
    pub fn set_socket(&mut self, queue: u32, fd: impl AsRawFd) -> Result<(), SteerError> {
        let map = self.bpf.map_mut("XSKS").ok_or(SteerError::Missing("XSKS map"))?;
        let mut xsks: XskMap<&mut MapData> = XskMap::try_from(map).map_err(err("XSKS"))?;
        xsks.set(queue, fd, 0).map_err(err(format!("registering the socket of queue {queue}")))
    }

    /// Makes the maps equal `wanted`: new entries first, stale ones after,
    /// so that nothing the plane keeps wanting is missed in between.
    pub fn update(&mut self, wanted: &Wanted) -> Result<(), SteerError> {
        sync(&mut self.bpf, "OWNED", &self.current.owned, &wanted.owned)?;
        sync(&mut self.bpf, "HOST", &self.current.host, &wanted.host)?;
        sync(&mut self.bpf, "REALS", &self.current.reals, &wanted.reals)?;
        let map = self.bpf.map_mut("SNAT_SRC").ok_or(SteerError::Missing("SNAT_SRC map"))?;
        let mut lpm: LpmTrie<&mut MapData, [u8; 16], u8> = LpmTrie::try_from(map).map_err(err("SNAT_SRC"))?;
        for (a, len) in wanted.snat.difference(&self.current.snat) {
            lpm.insert(&LpmKey::new(*len, *a), 1u8, 0).map_err(err("adding to SNAT_SRC"))?;
        }
        for (a, len) in self.current.snat.difference(&wanted.snat) {
            lpm.remove(&LpmKey::new(*len, *a)).map_err(err("removing from SNAT_SRC"))?;
        }
        self.current = wanted.clone();
        Ok(())
    }
}

fn sync<const N: usize>(
    bpf: &mut Ebpf,
    name: &'static str,
    old: &HashSet<[u8; N]>,
    new: &HashSet<[u8; N]>,
) -> Result<(), SteerError> {
    let map = bpf.map_mut(name).ok_or(SteerError::Missing(name))?;
    let mut m: HashMap<&mut MapData, [u8; N], u8> = HashMap::try_from(map).map_err(err(name))?;
    for k in new.difference(old) {
        m.insert(k, 1u8, 0).map_err(map_err("adding to", name))?;
    }
    for k in old.difference(new) {
        m.remove(k).map_err(map_err("removing from", name))?;
    }
    Ok(())
}

/// The program's choice, made in user space (AF_PACKET sees every frame):
/// whether the plane wants `frame`.
pub fn wants(frame: &[u8], w: &Wanted) -> bool {
    use gatehouse_wire::field::{arp, ethernet, icmp, ipv4, ipv6, nd, tcp};
    use gatehouse_wire::packet::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP};
    let Some(ethertype) =
        frame.get(ethernet::ETHERTYPE..ethernet::HEADER_LEN).map(|b| u16::from_be_bytes([b[0], b[1]]))
    else {
        return false;
    };
    let l3 = &frame[ethernet::HEADER_LEN..];
    let v4 = |b: &[u8]| addr_key(IpAddr::from(<[u8; 4]>::try_from(&b[..4]).unwrap_or_default()));
    let v6 = |b: &[u8]| <[u8; 16]>::try_from(&b[..16]).unwrap_or_default();
    let nat_reply = |src: [u8; 16], dst: &[u8; 16], proto: u8, l4: &[u8]| {
        if !matches!(proto, PROTO_TCP | PROTO_UDP) || l4.len() < tcp::DST_PORT + 2 {
            return false;
        }
        let mut k = [0u8; 20];
        k[..16].copy_from_slice(&src);
        // TCP and UDP keep the source port at the same place.
        k[16..18].copy_from_slice(&l4[tcp::SRC_PORT..tcp::SRC_PORT + 2]);
        k[18] = proto;
        w.reals.contains(&k) && !w.host.contains(dst)
    };
    let snat = |src: [u8; 16], dst: &[u8; 16], proto: u8| {
        matches!(proto, PROTO_TCP | PROTO_UDP) && w.snat.iter().any(|n| in_net(&src, n)) && !w.host.contains(dst)
    };
    match ethertype {
        ETHERTYPE_ARP => {
            l3.len() >= arp::LEN
                && l3[arp::OPER..arp::SENDER_MAC] == [0, 1]
                && w.owned.contains(&v4(&l3[arp::TARGET_IP..]))
        }
        ETHERTYPE_IPV4 if l3.len() >= ipv4::MIN_HEADER_LEN => {
            let dst = v4(&l3[ipv4::DST..]);
            if w.owned.contains(&dst) {
                return true;
            }
            let ihl = usize::from(l3[ipv4::VER_IHL] & 0x0f) * 4;
            let frag = &l3[ipv4::FLAGS_FRAG..ipv4::FLAGS_FRAG + 2];
            let first_fragment = frag[0] & 0x1f == 0 && frag[1] == 0;
            first_fragment
                && (ipv4::MIN_HEADER_LEN..=60).contains(&ihl)
                && l3.len() > ihl
                && (nat_reply(v4(&l3[ipv4::SRC..]), &dst, l3[ipv4::PROTOCOL], &l3[ihl..])
                    || snat(v4(&l3[ipv4::SRC..]), &dst, l3[ipv4::PROTOCOL]))
        }
        ETHERTYPE_IPV6 if l3.len() >= ipv6::HEADER_LEN => {
            let dst = v6(&l3[ipv6::DST..]);
            if w.owned.contains(&dst) {
                return true;
            }
            let l4 = &l3[ipv6::HEADER_LEN..];
            if l3[ipv6::NEXT_HEADER] == PROTO_ICMPV6 {
                return l4.len() >= nd::OPTIONS
                    && l4[icmp::TYPE] == gatehouse_l4::neighbour::ND_SOLICIT
                    && w.owned.contains(&v6(&l4[nd::TARGET..]));
            }
            nat_reply(v6(&l3[ipv6::SRC..]), &dst, l3[ipv6::NEXT_HEADER], l4)
                || snat(v6(&l3[ipv6::SRC..]), &dst, l3[ipv6::NEXT_HEADER])
        }
        _ => false,
    }
}
