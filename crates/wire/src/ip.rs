//! Bare IP packets, with no link-layer header before them: what a TUN
//! device reads and writes and what a tunnel carries inside its datagrams.
//! The version nibble tells IPv4 from IPv6; nothing here trusts a length
//! it has not checked against the slice.

use std::net::IpAddr;

use crate::checksum;
use crate::field::{ipv4, ipv6};

/// The source and destination of an IP packet (IPv4 or IPv6), if it has a
/// whole header.
pub fn addresses(packet: &[u8]) -> Option<(IpAddr, IpAddr)> {
    match packet.first()? >> 4 {
        4 => {
            let h = packet.get(..ipv4::MIN_HEADER_LEN)?;
            let src: [u8; 4] = h[ipv4::SRC..ipv4::SRC + 4].try_into().ok()?;
            let dst: [u8; 4] = h[ipv4::DST..ipv4::DST + 4].try_into().ok()?;
            Some((IpAddr::from(src), IpAddr::from(dst)))
        }
        6 => {
            let h = packet.get(..ipv6::HEADER_LEN)?;
            let src: [u8; 16] = h[ipv6::SRC..ipv6::SRC + 16].try_into().ok()?;
            let dst: [u8; 16] = h[ipv6::DST..ipv6::DST + 16].try_into().ok()?;
            Some((IpAddr::from(src), IpAddr::from(dst)))
        }
        _ => None,
    }
}

/// The length an IP packet's header says it has (what follows it, such as
/// a tunnel's padding, is not the packet's), if it has a whole length field.
pub fn total_len(packet: &[u8]) -> Option<usize> {
    let field = |at: usize| Some(usize::from(u16::from_be_bytes([*packet.get(at)?, *packet.get(at + 1)?])));
    match packet.first()? >> 4 {
        4 => field(ipv4::TOTAL_LEN),
        6 => Some(ipv6::HEADER_LEN + field(ipv6::PAYLOAD_LEN)?),
        _ => None,
    }
}

/// The pseudo-header sum of `packet` (an IPv4 packet, or IPv6 when `v6`,
/// whose header the caller has checked is whole) for a TCP or UDP header
/// and payload of `len` bytes.
pub fn pseudo_header(packet: &[u8], v6: bool, proto: u8, len: usize) -> u64 {
    fn addr<const N: usize>(packet: &[u8], at: usize) -> [u8; N] {
        let mut a = [0u8; N];
        a.copy_from_slice(&packet[at..at + N]);
        a
    }
    if v6 {
        checksum::pseudo_v6(addr(packet, ipv6::SRC), addr(packet, ipv6::DST), proto, len as u32)
    } else {
        checksum::pseudo_v4(addr(packet, ipv4::SRC), addr(packet, ipv4::DST), proto, len as u16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    fn ip_bytes(s: &str) -> [u8; 16] {
        match ip(s) {
            IpAddr::V6(a) => a.octets(),
            IpAddr::V4(_) => [0; 16],
        }
    }

    #[test]
    fn packet_headers_give_their_addresses_and_length() {
        let mut v4 = vec![0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1];
        v4.extend([0; 8 + 4]);
        assert_eq!(addresses(&v4), Some((ip("10.0.0.2"), ip("10.0.0.1"))));
        assert_eq!(total_len(&v4), Some(28), "the padding is not the packet's");
        let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        v6.extend(ip_bytes("fd00::2"));
        v6.extend(ip_bytes("fd00::1"));
        v6.extend([0; 8]);
        assert_eq!(addresses(&v6), Some((ip("fd00::2"), ip("fd00::1"))));
        assert_eq!(total_len(&v6), Some(48));
        assert_eq!(addresses(&v4[..19]), None);
        assert_eq!(addresses(&[0x50; 40]), None);
        assert_eq!(total_len(&[]), None);
        assert_eq!(total_len(&[0x45, 0, 0]), None, "a length field cut short");
    }

    #[test]
    fn the_pseudo_header_is_the_one_built_from_the_addresses() {
        let v4 = [0x45, 0, 0, 28, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1];
        assert_eq!(pseudo_header(&v4, false, 17, 8), checksum::pseudo_v4([10, 0, 0, 2], [10, 0, 0, 1], 17, 8));
        let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 6, 64];
        v6.extend(ip_bytes("fd00::2"));
        v6.extend(ip_bytes("fd00::1"));
        assert_eq!(pseudo_header(&v6, true, 6, 8), checksum::pseudo_v6(ip_bytes("fd00::2"), ip_bytes("fd00::1"), 6, 8));
    }
}
