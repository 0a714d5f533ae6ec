//! Network interfaces as the kernel sees them: TUN devices ([`tun`]) and
//! their links, addresses and routes through rtnetlink ([`netlink`]).
//! The WireGuard plane runs its tunnels on them; the node's BGP announcer
//! holds the interface whose addresses are the VIPs it announces.
//!
//! `unsafe` is confined to [`tun`] (the `TUNSETIFF` ioctl).

pub mod netlink;
pub mod tun;
