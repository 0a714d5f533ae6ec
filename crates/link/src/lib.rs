//! Network interfaces as the kernel sees them: TUN devices ([`tun`]),
//! their links, addresses and routes through rtnetlink ([`netlink`]),
//! AF_XDP sockets on a NIC's queues ([`xsk`]), XDP programs attached
//! through links a successor process can take over ([`xdp_link`]) and the next hop's MAC from
//! the kernel's routes and neighbours ([`nexthop`]), and send-only
//! AF_PACKET sockets whose frames may be super-frames ([`packet_tx`]). The WireGuard plane
//! runs its tunnels on TUN devices and its router mode on AF_XDP; the L4
//! plane forwards on AF_XDP; the node's BGP announcer holds the interface
//! whose addresses are the VIPs it announces. `bpf/` holds what the XDP
//! programs of the planes share (`common.h`, the build scripts' compiler).
//!
//! `unsafe` is confined to [`tun`] (the `TUNSETIFF` ioctl), [`xsk`]
//! (AF_XDP rings and UMEM), [`xdp_link`] (two `bpf(2)` calls) and
//! [`packet_tx`] (its socket and `sendmmsg`).

pub mod netlink;
pub mod nexthop;
pub mod packet_tx;
pub mod tun;
pub mod xdp_link;
pub mod xsk;
