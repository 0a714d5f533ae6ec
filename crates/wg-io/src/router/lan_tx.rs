//! The LAN side's sends where its AF_XDP socket runs in copy mode (veth,
//! drivers without zero-copy AF_XDP). There every frame sent costs the
//! kernel a socket buffer and the receiver's stack a pass of its own, so
//! the packets a vector opened go out as TUN mode writes them to its
//! device: runs of segments of one TCP (or UDP) flow to one next hop are
//! coalesced into one super-frame behind a virtio-net header (GRO, with
//! `wire::offload`'s rules), which the kernel segments for the NIC or a
//! veth hands whole to the receiver; every other frame goes as it is.
//! All through one send-only AF_PACKET socket
//! ([`gatehouse_link::packet_tx`]), one `sendmmsg` per vector, in order.
//! A super-frame's headers are made again in an arena; its payloads stay
//! in the frames and the kernel gathers them (one copy, into its socket
//! buffer, where gathering them into the arena first made two).

use std::io::{self, ErrorKind};
use std::ops::Range;

use gatehouse_link::packet_tx::PacketTx;
use gatehouse_wire::field::ethernet;
use gatehouse_wire::offload::{self, Flow, VNET_HDR_LEN};
use gatehouse_wire::packet::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// IP packet bytes at most in a super-frame (IPv4's total length).
const SUPER: usize = 65_535;
/// Segments at most in a super-frame.
const SEGMENTS: usize = 64;
/// The virtio-net header of a frame sent as it is.
const PLAIN: [u8; VNET_HDR_LEN] = [0; VNET_HDR_LEN];

/// One frame to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Out {
    /// A super-frame of `count` frames of the vector from `first` on: its
    /// virtio-net header and headers in the arena, then each frame's
    /// payload, from byte `payload` of the frame on.
    Super { arena: Range<usize>, first: usize, count: usize, payload: usize },
    /// A frame of the vector as it is.
    Plain(usize),
}

/// The flow of an Ethernet frame carrying IPv4 or IPv6 that GRO may
/// coalesce (`offload::flow`).
fn flow_of(frame: &[u8]) -> Option<Flow> {
    let ether = u16::from_be_bytes(frame.get(ethernet::ETHERTYPE..ethernet::ETHERTYPE + 2)?.try_into().ok()?);
    let ip = frame.get(ethernet::HEADER_LEN..)?;
    let version = ip.first()? >> 4;
    if !matches!((ether, version), (ETHERTYPE_IPV4, 4) | (ETHERTYPE_IPV6, 6)) {
        return None;
    }
    offload::flow(ip)
}

/// Plans `frames` (Ethernet) for the LAN, in order: runs of one flow to
/// one next hop (the same Ethernet header) that `offload::continues`
/// allows are made, in `arena`, one super-frame each; the rest go as they
/// are.
pub(super) fn coalesce(frames: &[&[u8]], arena: &mut Vec<u8>) -> Vec<Out> {
    const ETH: usize = ethernet::HEADER_LEN;
    arena.clear();
    let mut out = Vec::with_capacity(frames.len());
    let mut i = 0;
    while i < frames.len() {
        let first = frames[i];
        let Some(f) = flow_of(first) else {
            out.push(Out::Plain(i));
            i += 1;
            continue;
        };
        let (mut j, mut so_far, mut bytes, mut last_flags, mut short) =
            (i + 1, f.payload(), first.len() - ETH, f.flags(), false);
        while j < frames.len() && j - i < SEGMENTS && !short {
            let next = frames[j];
            let Some(n) = flow_of(next) else { break };
            if next[..ETH] != first[..ETH]
                || bytes + n.payload() > SUPER
                || !offload::continues(&first[ETH..], &f, so_far, &next[ETH..], &n)
            {
                break;
            }
            so_far += n.payload();
            bytes += n.payload();
            last_flags = n.flags();
            short = n.payload() < f.payload();
            j += 1;
        }
        if j == i + 1 {
            out.push(Out::Plain(i));
            i = j;
            continue;
        }
        let payload = ETH + f.headers;
        let start = arena.len();
        arena.resize(start + VNET_HDR_LEN, 0);
        arena.extend_from_slice(&first[..payload]);
        let mut hdr = offload::finish_headers(&mut arena[start + VNET_HDR_LEN + ETH..], bytes, &f, last_flags);
        // The header's offsets count from the frame's first byte here, the
        // Ethernet header's, where TUN's count from the IP header's.
        hdr.hdr_len += ETH as u16;
        hdr.csum_start += ETH as u16;
        hdr.write(&mut arena[start..start + VNET_HDR_LEN]);
        out.push(Out::Super { arena: start..arena.len(), first: i, count: j - i, payload });
        i = j;
    }
    out
}

/// A LAN side's sender.
pub struct LanTx {
    socket: PacketTx,
    arena: Vec<u8>,
    /// Whether the kernel takes super-frames (until it once refuses one).
    gso: bool,
    /// Super-frames sent, and the frames they carried.
    pub(super) super_frames: u64,
    pub(super) coalesced: u64,
}

impl LanTx {
    pub fn open(ifindex: u32) -> io::Result<LanTx> {
        Ok(LanTx {
            socket: PacketTx::open(ifindex)?,
            arena: Vec::with_capacity(1 << 17),
            gso: true,
            super_frames: 0,
            coalesced: 0,
        })
    }

    /// Sends `frames` (Ethernet); returns how many could not be sent.
    pub(super) fn send(&mut self, frames: &[&[u8]]) -> usize {
        if frames.is_empty() {
            return 0;
        }
        let mut arena = std::mem::take(&mut self.arena);
        let plan = if self.gso { coalesce(frames, &mut arena) } else { (0..frames.len()).map(Out::Plain).collect() };
        let msgs: Vec<Vec<&[u8]>> = plan.iter().map(|o| pieces(o, &arena, frames)).collect();
        let refs: Vec<&[&[u8]]> = msgs.iter().map(Vec::as_slice).collect();
        let mut lost = 0;
        let mut at = 0;
        while at < refs.len() {
            match self.socket.send(&refs[at..]) {
                Ok(k) if k > 0 => {
                    for o in &plan[at..at + k] {
                        if let Out::Super { count, .. } = o {
                            self.super_frames += 1;
                            self.coalesced += *count as u64;
                        }
                    }
                    at += k;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // The device's queue is full: wait for room once, briefly.
                    let mut ready = [false];
                    let _ = gatehouse_udp::poll_writable(self.socket.fd(), 10, &mut ready);
                    if !ready[0] {
                        lost += plan[at..].iter().map(segments).sum::<usize>();
                        break;
                    }
                }
                Err(e) => {
                    if let (Out::Super { first, count, .. }, true) = (&plan[at], self.gso) {
                        // No GSO on this device or kernel: frames one by
                        // one from now on, these too.
                        tracing::info!("super-frames refused on the LAN ({e}); sending frames one by one");
                        self.gso = false;
                        lost += self.send(&frames[*first..first + count]);
                    } else {
                        lost += segments(&plan[at]);
                    }
                    at += 1;
                }
                Ok(_) => {
                    lost += plan[at..].iter().map(segments).sum::<usize>();
                    break;
                }
            }
        }
        drop(refs);
        drop(msgs);
        self.arena = arena;
        lost
    }
}

/// What the kernel gathers into the frame `o` sends.
fn pieces<'a>(o: &Out, arena: &'a [u8], frames: &[&'a [u8]]) -> Vec<&'a [u8]> {
    match o {
        Out::Super { arena: r, first, count, payload } => std::iter::once(&arena[r.clone()])
            .chain(frames[*first..first + count].iter().map(|f| &f[*payload..]))
            .collect(),
        Out::Plain(k) => vec![&PLAIN[..], frames[*k]],
    }
}

fn segments(o: &Out) -> usize {
    match o {
        Out::Super { count, .. } => *count,
        Out::Plain(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_wire::checksum;
    use gatehouse_wire::offload::{GSO_TCPV4, GSO_TCPV6, GSO_UDP_L4, VnetHdr};
    use gatehouse_wire::packet::build;

    const HOST: [u8; 6] = [2, 0, 0, 0, 0, 9];
    const OTHER: [u8; 6] = [2, 0, 0, 0, 0, 8];
    const ME: [u8; 6] = [2, 0, 0, 0, 0, 1];

    fn frame(to: [u8; 6], packet: &[u8]) -> Vec<u8> {
        let mut f = to.to_vec();
        f.extend_from_slice(&ME);
        let kind: u16 = if packet[0] >> 4 == 6 { 0x86dd } else { 0x0800 };
        f.extend_from_slice(&kind.to_be_bytes());
        f.extend_from_slice(packet);
        f
    }

    /// A TCP segment (ACK, and PSH if asked) of `len` payload bytes at
    /// `seq`, over IPv4 or IPv6.
    fn tcp(v6: bool, seq: u32, len: usize, psh: bool) -> Vec<u8> {
        let mut t = vec![0u8; 20 + len];
        t[0..2].copy_from_slice(&4000u16.to_be_bytes());
        t[2..4].copy_from_slice(&5201u16.to_be_bytes());
        t[4..8].copy_from_slice(&seq.to_be_bytes());
        t[8..12].copy_from_slice(&77u32.to_be_bytes());
        t[12] = 5 << 4;
        t[13] = 0x10 | if psh { 0x08 } else { 0 };
        t[14..16].copy_from_slice(&512u16.to_be_bytes());
        for (i, b) in t[20..].iter_mut().enumerate() {
            *b = (seq as usize + i) as u8;
        }
        if v6 {
            let (s, d) = ([0xfd; 16], [0xfe; 16]);
            let c = checksum::fold(checksum::add(checksum::pseudo_v6(s, d, 6, t.len() as u32), &t));
            t[16..18].copy_from_slice(&(!c).to_be_bytes());
            build::ipv6(s, d, 6, &t)
        } else {
            let (s, d) = ([10, 2, 0, 9], [10, 1, 0, 5]);
            let c = checksum::fold(checksum::add(checksum::pseudo_v4(s, d, 6, t.len() as u16), &t));
            t[16..18].copy_from_slice(&(!c).to_be_bytes());
            build::ipv4(s, d, 6, &t)
        }
    }

    #[test]
    fn a_flow_to_one_host_becomes_one_super_frame_and_the_rest_stays_apart() {
        for v6 in [false, true] {
            let packets = [
                frame(HOST, &tcp(v6, 1000, 1380, false)),
                frame(HOST, &tcp(v6, 2380, 1380, false)),
                frame(HOST, &tcp(v6, 3760, 1000, true)),
                // After a short segment nothing joins.
                frame(HOST, &tcp(v6, 4760, 1380, false)),
                // Another next hop, then a gap in the sequence.
                frame(OTHER, &tcp(v6, 6140, 1380, false)),
                frame(HOST, &tcp(v6, 9000, 1380, false)),
            ];
            let frames: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
            let mut arena = Vec::new();
            let plan = coalesce(&frames, &mut arena);
            assert_eq!(plan.len(), 4, "{plan:?}");
            let Out::Super { arena: r, first: 0, count: 3, .. } = plan[0].clone() else { panic!("{plan:?}") };
            assert_eq!(&plan[1..], &[Out::Plain(3), Out::Plain(4), Out::Plain(5)]);
            let hdr = VnetHdr::parse(&arena[r.clone()]).expect("header");
            let sent = pieces(&plan[0], &arena, &frames).concat();
            let ip_len: usize = if v6 { 40 } else { 20 };
            assert_eq!(hdr.gso_type, if v6 { GSO_TCPV6 } else { GSO_TCPV4 });
            assert_eq!((hdr.gso_size, usize::from(hdr.csum_start), hdr.csum_offset), (1380, 14 + ip_len, 16));
            assert_eq!(hdr.hdr_len as usize, 14 + ip_len + 20);
            let sup = &sent[VNET_HDR_LEN..];
            assert_eq!(&sup[..14], &frames[0][..14], "the next hop's Ethernet header");
            // The payloads in order, PSH from the last segment.
            let payload: Vec<u8> = frames[..3].iter().flat_map(|f| f[14 + ip_len + 20..].to_vec()).collect();
            assert_eq!(&sup[14 + ip_len + 20..], &payload[..]);
            assert_eq!(sup[14 + ip_len + 13], 0x18);
            // Segmented as a NIC would, the super-frame gives the segments back.
            let split = offload::plan(&hdr_from_ip(&hdr), &sup[14..]).expect("a valid super-packet");
            for (i, f) in frames[..3].iter().enumerate() {
                let mut seg = vec![0u8; split.segment_len(sup.len() - 14, i)];
                let n = offload::write_segment(&hdr_from_ip(&hdr), &split, &sup[14..], i, &mut seg);
                let want = &f[14..];
                // IPv4 IDs are the kernel's to number; the rest is as sent.
                let skip = if v6 { 0..0 } else { 4..6 };
                let cmp = |p: &[u8]| [&p[..skip.start], &p[skip.end..]].concat();
                let mut got = seg[..n].to_vec();
                if !v6 {
                    got[10..12].copy_from_slice(&want[10..12]);
                }
                assert_eq!(cmp(&got), cmp(want), "segment {i}");
            }
        }
    }

    /// The header with offsets counted from the IP header, as TUN has it.
    fn hdr_from_ip(h: &VnetHdr) -> VnetHdr {
        VnetHdr { hdr_len: h.hdr_len - 14, csum_start: h.csum_start - 14, ..*h }
    }

    #[test]
    fn udp_runs_coalesce_and_other_frames_pass_as_they_are() {
        let udp = |n: usize| {
            let data = vec![n as u8; 64];
            let seg =
                build::udp(4000, 5201, &data, |len| checksum::pseudo_v4([10, 2, 0, 9], [10, 1, 0, 5], 17, len as u16));
            frame(HOST, &build::ipv4([10, 2, 0, 9], [10, 1, 0, 5], 17, &seg))
        };
        let mut arp = frame(HOST, &tcp(false, 1, 10, false));
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let packets = [udp(1), udp(2), udp(3), arp, udp(4)];
        let frames: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
        let mut arena = Vec::new();
        let plan = coalesce(&frames, &mut arena);
        let Out::Super { arena: r, first: 0, count: 3, .. } = plan[0].clone() else { panic!("{plan:?}") };
        assert_eq!(VnetHdr::parse(&arena[r]).map(|h| (h.gso_type, h.gso_size)), Some((GSO_UDP_L4, 64)));
        // The datagrams' payloads follow the first one's headers.
        let sent = pieces(&plan[0], &arena, &frames).concat();
        let payloads: Vec<u8> = frames[..3].iter().flat_map(|f| f[14 + 28..].to_vec()).collect();
        assert_eq!(&sent[VNET_HDR_LEN + 14 + 28..], &payloads[..]);
        assert_eq!(u16::from_be_bytes([sent[VNET_HDR_LEN + 14 + 2], sent[VNET_HDR_LEN + 14 + 3]]), 20 + 8 + 3 * 64);
        assert_eq!(&plan[1..], &[Out::Plain(3), Out::Plain(4)]);
    }

    #[test]
    fn a_super_frame_stops_at_64_segments() {
        let packets: Vec<Vec<u8>> = (0..70u32).map(|i| frame(HOST, &tcp(false, 1000 + i * 100, 100, false))).collect();
        let frames: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
        let mut arena = Vec::new();
        let plan = coalesce(&frames, &mut arena);
        assert!(matches!(plan[..], [Out::Super { first: 0, count: 64, .. }, Out::Super { first: 64, count: 6, .. }]));
        // A message of 65 pieces: the headers and 64 payloads.
        assert_eq!(pieces(&plan[0], &arena, &frames).len(), 65);
    }
}
