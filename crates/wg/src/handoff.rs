//! The byte format live sessions take from one process to the next in a
//! binary upgrade ([`crate::device::Device::export_sessions`]): fixed-width
//! little-endian fields, read back with bounds checks. It carries keys, so
//! buffers holding it are zeroed when dropped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use zeroize::Zeroizing;

/// What an export is written into: zeroed when dropped.
pub type Buffer = Zeroizing<Vec<u8>>;

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_addr(out: &mut Vec<u8>, a: Option<SocketAddr>) {
    match a {
        None => put_u8(out, 0),
        Some(SocketAddr::V4(a)) => {
            put_u8(out, 4);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_le_bytes());
        }
        Some(SocketAddr::V6(a)) => {
            put_u8(out, 6);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_le_bytes());
        }
    }
}

/// Reads an export; every method answers `None` past the end.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    pub(crate) fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.rest.split_first_chunk::<N>()?;
        self.rest = rest;
        Some(*head)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.bytes::<1>().map(|b| b[0])
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.bytes().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.bytes().map(u64::from_le_bytes)
    }

    pub(crate) fn addr(&mut self) -> Option<Option<SocketAddr>> {
        let ip = match self.u8()? {
            0 => return Some(None),
            4 => IpAddr::V4(Ipv4Addr::from(self.bytes::<4>()?)),
            6 => IpAddr::V6(Ipv6Addr::from(self.bytes::<16>()?)),
            _ => return None,
        };
        let port = u16::from_le_bytes(self.bytes()?);
        Some(Some(SocketAddr::new(ip, port)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_read_back_and_nothing_past_the_end() {
        let mut out = Vec::new();
        put_u8(&mut out, 7);
        put_u32(&mut out, 0xdead_beef);
        put_u64(&mut out, u64::MAX - 3);
        let v4: SocketAddr = "192.0.2.1:51820".parse().expect("addr");
        let v6: SocketAddr = "[2001:db8::1]:443".parse().expect("addr");
        put_addr(&mut out, Some(v4));
        put_addr(&mut out, Some(v6));
        put_addr(&mut out, None);
        let mut r = Reader::new(&out);
        assert_eq!(r.u8(), Some(7));
        assert_eq!(r.u32(), Some(0xdead_beef));
        assert_eq!(r.u64(), Some(u64::MAX - 3));
        assert_eq!(r.addr(), Some(Some(v4)));
        assert_eq!(r.addr(), Some(Some(v6)));
        assert_eq!(r.addr(), Some(None));
        assert!(r.is_empty());
        assert_eq!(r.u8(), None);
        let mut bad = Reader::new(&[9]);
        assert_eq!(bad.addr(), None, "an unknown address family");
        let mut short = Reader::new(&[4, 1, 2]);
        assert_eq!(short.addr(), None);
    }
}
