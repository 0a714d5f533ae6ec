//! A core's session tables, one per address family, and what generic
//! code over a family needs: its table and its address conversions.

use std::net::{IpAddr, Ipv4Addr};

use crate::session::{Addr, Table};

/// A core's session tables.
pub(super) struct Tables {
    pub(super) v4: Table<u32>,
    pub(super) v6: Table<u128>,
}

/// An address family's session table and conversions.
pub(super) trait Family: Addr {
    const V6: bool;
    fn of(ip: IpAddr) -> Self;
    fn ip(self) -> IpAddr;
    fn table(t: &Tables) -> &Table<Self>;
    fn table_mut(t: &mut Tables) -> &mut Table<Self>;
}

impl Family for u32 {
    const V6: bool = false;
    fn of(ip: IpAddr) -> u32 {
        match ip {
            IpAddr::V4(a) => u32::from(a),
            IpAddr::V6(_) => 0,
        }
    }
    fn ip(self) -> IpAddr {
        IpAddr::V4(Ipv4Addr::from(self))
    }
    fn table(t: &Tables) -> &Table<u32> {
        &t.v4
    }
    fn table_mut(t: &mut Tables) -> &mut Table<u32> {
        &mut t.v4
    }
}

impl Family for u128 {
    const V6: bool = true;
    fn of(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V6(a) => u128::from(a),
            IpAddr::V4(_) => 0,
        }
    }
    fn ip(self) -> IpAddr {
        IpAddr::V6(std::net::Ipv6Addr::from(self))
    }
    fn table(t: &Tables) -> &Table<u128> {
        &t.v6
    }
    fn table_mut(t: &mut Tables) -> &mut Table<u128> {
        &mut t.v6
    }
}
