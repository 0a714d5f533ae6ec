//! Answers for the addresses the plane owns (virtual and FNAT local
//! addresses): ARP requests (IPv4) and neighbour solicitations (IPv6) get
//! their reply written in place of the request, to be sent back out.

use std::net::{Ipv4Addr, Ipv6Addr};

use gatehouse_wire::checksum;
use gatehouse_wire::field::{arp, ethernet, icmp, ipv6, nd};
use gatehouse_wire::packet::{ETHERTYPE_IPV6, Ip, PROTO_ICMPV6};

/// ICMPv6 neighbour solicitation and advertisement.
pub const ND_SOLICIT: u8 = 135;
pub const ND_ADVERT: u8 = 136;

/// Turns the ARP request in `frame` (for `ip`, which we own) into our reply.
/// `frame` holds Ethernet + ARP at `arp_at`.
pub fn arp_reply(frame: &mut [u8], arp_at: usize, ip: Ipv4Addr, mac: [u8; 6]) -> bool {
    if frame.len() < arp_at + arp::LEN {
        return false;
    }
    let a = &mut frame[arp_at..arp_at + arp::LEN];
    let sender_mac: [u8; 6] = a[arp::SENDER_MAC..arp::SENDER_IP].try_into().unwrap_or([0; 6]);
    let sender_ip: [u8; 4] = a[arp::SENDER_IP..arp::TARGET_MAC].try_into().unwrap_or([0; 4]);
    a[arp::OPER..arp::SENDER_MAC].copy_from_slice(&2u16.to_be_bytes());
    a[arp::SENDER_MAC..arp::SENDER_IP].copy_from_slice(&mac);
    a[arp::SENDER_IP..arp::TARGET_MAC].copy_from_slice(&ip.octets());
    a[arp::TARGET_MAC..arp::TARGET_IP].copy_from_slice(&sender_mac);
    a[arp::TARGET_IP..arp::LEN].copy_from_slice(&sender_ip);
    let requester_mac: [u8; 6] = frame[ethernet::SRC..ethernet::ETHERTYPE].try_into().unwrap_or([0; 6]);
    crate::rewrite::set_macs(frame, requester_mac, mac);
    true
}

/// The target address of a neighbour solicitation (`ip` is its parse).
pub fn solicited_target(frame: &[u8], ip: &Ip) -> Option<Ipv6Addr> {
    let t = frame.get(ip.l4 + nd::TARGET..ip.l4 + nd::OPTIONS)?;
    <[u8; 16]>::try_from(t).ok().map(Ipv6Addr::from)
}

/// Length of the advertisement frame written by [`nd_advert`].
pub const ND_ADVERT_LEN: usize = ethernet::HEADER_LEN + ipv6::HEADER_LEN + ND_ADVERT_BODY;

/// The advertisement's ICMPv6 message: header, target, one option of 8 bytes.
const ND_ADVERT_BODY: usize = nd::OPTIONS + 8;

/// Writes into `out` (at least [`ND_ADVERT_LEN`] bytes) the neighbour
/// advertisement answering the solicitation in `frame` for `target`, which we
/// own. Returns the frame length.
pub fn nd_advert(frame: &[u8], ip: &Ip, target: Ipv6Addr, mac: [u8; 6], out: &mut [u8]) -> Option<usize> {
    if out.len() < ND_ADVERT_LEN || frame.len() < ip.l3 + ipv6::HEADER_LEN {
        return None;
    }
    let requester_mac: [u8; 6] = frame[ethernet::SRC..ethernet::ETHERTYPE].try_into().ok()?;
    let src: [u8; 16] = frame[ip.l3 + ipv6::SRC..ip.l3 + ipv6::DST].try_into().ok()?;
    // An unspecified source (duplicate address detection): answer all nodes.
    if src == [0; 16] {
        write_advert(&mut out[..ND_ADVERT_LEN], requester_mac, ALL_NODES, target, mac, false);
    } else {
        write_advert(&mut out[..ND_ADVERT_LEN], requester_mac, src, target, mac, true);
    }
    Some(ND_ADVERT_LEN)
}

const ALL_NODES: [u8; 16] = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// An unsolicited neighbour advertisement of `target` at `mac`, with the
/// override flag, to all nodes: what a node that takes an address over
/// sends so that neighbours update their caches (RFC 4861, 7.2.6).
pub fn unsolicited_advert(target: Ipv6Addr, mac: [u8; 6]) -> [u8; ND_ADVERT_LEN] {
    let mut out = [0u8; ND_ADVERT_LEN];
    write_advert(&mut out, [0x33, 0x33, 0, 0, 0, 1], ALL_NODES, target, mac, false);
    out
}

/// Length of a gratuitous ARP frame (Ethernet + ARP, unpadded).
pub const GARP_LEN: usize = ethernet::HEADER_LEN + arp::LEN;

/// A gratuitous ARP request for `ip` at `mac`, broadcast: sender and
/// target address both `ip` (RFC 5227's announcement), which updates every
/// neighbour's cache entry for it.
pub fn gratuitous_arp(ip: Ipv4Addr, mac: [u8; 6]) -> [u8; GARP_LEN] {
    let mut f = [0u8; GARP_LEN];
    f[ethernet::DST..ethernet::SRC].copy_from_slice(&[0xff; 6]);
    f[ethernet::SRC..ethernet::ETHERTYPE].copy_from_slice(&mac);
    f[ethernet::ETHERTYPE..ethernet::HEADER_LEN].copy_from_slice(&gatehouse_wire::packet::ETHERTYPE_ARP.to_be_bytes());
    let a = &mut f[ethernet::HEADER_LEN..];
    // Ethernet, IPv4, 6- and 4-byte addresses, a request.
    a[..arp::SENDER_MAC].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
    a[arp::SENDER_MAC..arp::SENDER_IP].copy_from_slice(&mac);
    a[arp::SENDER_IP..arp::TARGET_MAC].copy_from_slice(&ip.octets());
    a[arp::TARGET_IP..arp::LEN].copy_from_slice(&ip.octets());
    f
}

/// Writes a neighbour advertisement of `target` at `mac` to (`dst_mac`,
/// `dst`) into `o` ([`ND_ADVERT_LEN`] bytes).
fn write_advert(o: &mut [u8], dst_mac: [u8; 6], dst: [u8; 16], target: Ipv6Addr, mac: [u8; 6], solicited: bool) {
    o[ethernet::DST..ethernet::SRC].copy_from_slice(&dst_mac);
    o[ethernet::SRC..ethernet::ETHERTYPE].copy_from_slice(&mac);
    o[ethernet::ETHERTYPE..ethernet::HEADER_LEN].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let h = &mut o[ethernet::HEADER_LEN..][..ipv6::HEADER_LEN];
    h[ipv6::VER_TC_FLOW..ipv6::PAYLOAD_LEN].copy_from_slice(&[0x60, 0, 0, 0]);
    h[ipv6::PAYLOAD_LEN..ipv6::NEXT_HEADER].copy_from_slice(&(ND_ADVERT_BODY as u16).to_be_bytes());
    h[ipv6::NEXT_HEADER] = PROTO_ICMPV6;
    h[ipv6::HOP_LIMIT] = 255;
    h[ipv6::SRC..ipv6::DST].copy_from_slice(&target.octets());
    h[ipv6::DST..].copy_from_slice(&dst);
    let m = &mut o[ethernet::HEADER_LEN + ipv6::HEADER_LEN..];
    m[icmp::TYPE] = ND_ADVERT;
    m[icmp::CODE] = 0;
    m[icmp::CHECKSUM..icmp::CHECKSUM + 2].copy_from_slice(&[0, 0]);
    // Flags: solicited (when answering a node) and override.
    m[nd::FLAGS..nd::TARGET].copy_from_slice(&[if solicited { 0x60 } else { 0x20 }, 0, 0, 0]);
    m[nd::TARGET..nd::OPTIONS].copy_from_slice(&target.octets());
    // Option: target link-layer address (type 2, length 1 unit of 8 bytes).
    m[nd::OPTIONS] = 2;
    m[nd::OPTIONS + 1] = 1;
    m[nd::OPTIONS + 2..ND_ADVERT_BODY].copy_from_slice(&mac);
    let sum = checksum::pseudo_v6(target.octets(), dst, PROTO_ICMPV6, ND_ADVERT_BODY as u32);
    let c = !checksum::fold(checksum::add(sum, &m[..ND_ADVERT_BODY]));
    m[icmp::CHECKSUM..icmp::CHECKSUM + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_wire::packet::{self, Checks, ETHERTYPE_ARP, Frame, build};

    #[test]
    fn an_arp_request_becomes_our_reply() {
        let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1];
        a.extend_from_slice(&[2, 0, 0, 0, 0, 9]);
        a.extend_from_slice(&[10, 0, 0, 1]);
        a.extend_from_slice(&[0; 6]);
        a.extend_from_slice(&[10, 0, 0, 100]);
        let mut f = build::eth(ETHERTYPE_ARP, &a);
        f[0..6].copy_from_slice(&[0xff; 6]);
        let mac = [2, 0, 0, 0, 0, 0xaa];
        assert!(arp_reply(&mut f, 14, Ipv4Addr::new(10, 0, 0, 100), mac));
        match packet::parse(&f, Checks::default()) {
            Ok(Frame::Arp(r)) => {
                assert_eq!(r.op, 2);
                assert_eq!((r.sender_mac, r.sender_ip), (mac, Ipv4Addr::new(10, 0, 0, 100)));
                assert_eq!((r.target_mac, r.target_ip), ([2, 0, 0, 0, 0, 9], Ipv4Addr::new(10, 0, 0, 1)));
            }
            other => panic!("{other:?}"),
        }
        // Back to the Ethernet source of the request.
        assert_eq!(&f[0..12], &[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 0xaa]);
    }

    #[test]
    fn a_neighbour_solicitation_gets_a_valid_advertisement() {
        let client: [u8; 16] = "2001:db8::1".parse::<Ipv6Addr>().expect("v6").octets();
        let vip: Ipv6Addr = "2001:db8::100".parse().expect("v6");
        let snm = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0x100).octets();
        let mut ns = vec![ND_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
        ns.extend_from_slice(&vip.octets());
        ns.extend_from_slice(&[1, 1, 2, 0, 0, 0, 0, 9]);
        let c = !checksum::fold(checksum::add(checksum::pseudo_v6(client, snm, PROTO_ICMPV6, ns.len() as u32), &ns));
        ns[2..4].copy_from_slice(&c.to_be_bytes());
        let mut ip6 = build::ipv6(client, snm, PROTO_ICMPV6, &ns);
        ip6[7] = 255;
        let f = build::eth(ETHERTYPE_IPV6, &ip6);
        let Ok(Frame::Ip(ip)) = packet::parse(&f, Checks::default()) else { panic!("the solicitation parses") };
        assert_eq!(ip.icmp.map(|i| i.kind), Some(ND_SOLICIT));
        assert_eq!(solicited_target(&f, &ip), Some(vip));
        let mut out = [0u8; 128];
        let n = nd_advert(&f, &ip, vip, [2, 0, 0, 0, 0, 0xaa], &mut out).expect("advert");
        // The parser checks the ICMPv6 checksum over the pseudo-header.
        let Ok(Frame::Ip(adv)) = packet::parse(&out[..n], Checks::default()) else {
            panic!("the advertisement parses")
        };
        assert_eq!(adv.icmp.map(|i| i.kind), Some(ND_ADVERT));
        assert_eq!((adv.flow.src, adv.flow.dst), (vip.into(), Ipv6Addr::from(client).into()));
        assert_eq!(&out[14 + 40 + 8..14 + 40 + 24], &vip.octets());
        assert_eq!(&out[14 + 40 + 26..14 + 40 + 32], &[2, 0, 0, 0, 0, 0xaa]);
    }

    #[test]
    fn announcements_parse_as_what_they_claim() {
        let mac = [2, 0, 0, 0, 0, 0xaa];
        let vip = Ipv4Addr::new(10, 0, 0, 100);
        let f = gratuitous_arp(vip, mac);
        match packet::parse(&f, Checks::default()) {
            Ok(Frame::Arp(r)) => {
                assert_eq!(r.op, 1);
                assert_eq!((r.sender_mac, r.sender_ip, r.target_ip), (mac, vip, vip));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(&f[..6], &[0xff; 6]);
        let vip6: Ipv6Addr = "2001:db8::100".parse().expect("v6");
        let f = unsolicited_advert(vip6, mac);
        let Ok(Frame::Ip(adv)) = packet::parse(&f, Checks::default()) else { panic!("the advertisement parses") };
        assert_eq!(adv.icmp.map(|i| i.kind), Some(ND_ADVERT));
        assert_eq!((adv.flow.src, adv.flow.dst), (vip6.into(), Ipv6Addr::from(ALL_NODES).into()));
        // Override, not solicited.
        assert_eq!(f[14 + 40 + 4], 0x20);
        assert_eq!(&f[..6], &[0x33, 0x33, 0, 0, 0, 1]);
    }
}
