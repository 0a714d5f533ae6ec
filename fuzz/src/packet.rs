//! Packet views (`wire::packet`: Ethernet, VLAN, ARP, IPv4, IPv6 and its
//! extension headers, TCP, UDP, ICMP) and what a router does to a packet
//! (`wire::forward`). Input: one Ethernet frame.
//!
//! Properties: a frame the view takes as IP, etherparse takes too, with
//! the same addresses, protocol, TTL and ports; a packet the router's
//! header check takes keeps its addresses through lowering the TTL, is
//! cut into fragments (IPv4 without DF) that each pass the same check and
//! put back together give the original data, and an ICMP error about it
//! is itself a packet the view takes, quoting its flow.

use std::net::{IpAddr, Ipv4Addr};

use etherparse::err::Layer;
use etherparse::err::packet::SliceError;
use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use gatehouse_wire::forward::{self, Error};
use gatehouse_wire::packet::{self, Checks, Frame};

fn compare_with_etherparse(frame: &[u8], ip: &packet::Ip) {
    let sliced = match SlicedPacket::from_ethernet(frame) {
        Ok(s) => s,
        // etherparse holds ICMPv4 timestamp messages (types 13 and 14) to
        // their 20 bytes; the view, as a router, takes ICMP messages it does
        // not interpret at any length (corpus: crash-icmp-timestamp-*.bin).
        Err(SliceError::Len(e)) if matches!(e.layer, Layer::Icmpv4Timestamp | Layer::Icmpv4TimestampReply) => return,
        Err(e) => panic!("the view takes a frame etherparse refuses ({e}): {frame:02x?}"),
    };
    let (src, dst, ttl, proto) = match &sliced.net {
        Some(NetSlice::Ipv4(v4)) => {
            let h = v4.header();
            (IpAddr::from(h.source_addr()), IpAddr::from(h.destination_addr()), h.ttl(), v4.payload_ip_number().0)
        }
        Some(NetSlice::Ipv6(v6)) => {
            let h = v6.header();
            (IpAddr::from(h.source_addr()), IpAddr::from(h.destination_addr()), h.hop_limit(), v6.payload().ip_number.0)
        }
        other => panic!("the view took an IP packet, etherparse found {other:?}"),
    };
    assert_eq!((src, dst, ttl, proto), (ip.flow.src, ip.flow.dst, ip.ttl, ip.flow.proto), "header fields differ");
    match &sliced.transport {
        Some(TransportSlice::Tcp(t)) => {
            assert_eq!((t.source_port(), t.destination_port()), (ip.flow.sport, ip.flow.dport))
        }
        Some(TransportSlice::Udp(u)) => {
            assert_eq!((u.source_port(), u.destination_port()), (ip.flow.sport, ip.flow.dport))
        }
        _ => {}
    }
}

/// `flow`: the view's reading of the same packet, when it read one whose
/// ports an ICMP error's quote carries (TCP or UDP, not a fragment).
fn forward_checks(bytes: &[u8], frame_len: usize, flow: Option<packet::Flow>) {
    let Ok(h) = forward::header(bytes) else { return };
    assert!(h.len <= bytes.len() && h.header_len <= h.len);
    let mut copy = bytes[..h.len].to_vec();
    if forward::lower_ttl(&mut copy, &h).is_ok() {
        let again = forward::header(&copy).expect("a packet whose TTL was lowered no longer passes");
        assert_eq!((again.src, again.dst, again.len), (h.src, h.dst, h.len));
    }
    if !h.v6 && !h.dont_fragment {
        let mtu = 68 + (frame_len * 7) % 1400;
        if let Some(frags) = forward::fragment_v4(bytes, &h, mtu) {
            let mut data = Vec::new();
            for f in &frags {
                assert!(f.len() <= mtu, "a fragment of {} bytes for an MTU of {mtu}", f.len());
                let fh = forward::header(f).expect("a fragment does not pass the header check");
                assert_eq!((fh.src, fh.dst, fh.header_len), (h.src, h.dst, h.header_len));
                data.extend_from_slice(&f[fh.header_len..fh.len]);
            }
            assert_eq!(data, &bytes[h.header_len..h.len], "fragments do not add up to the packet");
        }
    }
    let from = if h.v6 {
        IpAddr::from([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xfe])
    } else {
        IpAddr::from(Ipv4Addr::new(192, 0, 2, 254))
    };
    for what in [Error::TimeExceeded, Error::TooBig { mtu: 1280 }] {
        let Some(icmp) = forward::icmp_error(bytes, &h, from, what) else { continue };
        let mut eth = vec![0u8; 12];
        eth.extend_from_slice(&(if h.v6 { packet::ETHERTYPE_IPV6 } else { packet::ETHERTYPE_IPV4 }).to_be_bytes());
        eth.extend_from_slice(&icmp);
        match packet::parse(&eth, Checks::default()) {
            Ok(Frame::Ip(ip)) => {
                assert_eq!((ip.flow.src, ip.flow.dst), (from, h.src), "the error goes back to the sender");
                let Some(flow) = flow else { continue };
                assert!(ip.icmp.is_some_and(|i| i.quoted), "the error does not quote the packet");
                assert_eq!(packet::quoted(&eth, &ip), Some(flow), "the error quotes another flow");
            }
            other => panic!("an ICMP error the view does not take: {other:?}"),
        }
    }
}

pub fn run(data: &[u8]) {
    let mut flow = None;
    if let Ok(Frame::Ip(ip)) = packet::parse(data, Checks::default()) {
        assert!(ip.l3 < ip.l4 && ip.l4 <= ip.end && ip.end <= data.len());
        compare_with_etherparse(data, &ip);
        let _ = packet::quoted(data, &ip);
        flow = matches!(ip.flow.proto, packet::PROTO_TCP | packet::PROTO_UDP).then_some((ip.l3, ip.flow));
    }
    // The router's checks read any bytes after an Ethernet header as an
    // IP packet (the link layer is the caller's).
    if let Ok((_, _, _, l3)) = packet::ethernet(data) {
        let flow = flow.filter(|&(at, _)| at == l3).map(|(_, f)| f);
        forward_checks(&data[l3..], data.len(), flow);
    }
}
