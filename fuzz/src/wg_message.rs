//! WireGuard message parsing (`wg::messages`). Input: one datagram.
//!
//! Properties: the parser sorts every datagram as boringtun's does (the
//! same type, or both refuse it) and reads the same indices; a transport
//! message's counter and sealed bytes are where the format puts them.

use boringtun::noise::{Packet, Tunn};
use gatehouse_wg::messages::{Message, parse};

pub fn run(data: &[u8]) {
    let ours = parse(data);
    let theirs = Tunn::parse_incoming_packet(data);
    match (ours, theirs) {
        (Ok(Message::Initiation(_)), Ok(Packet::HandshakeInit(_))) => {}
        (Ok(Message::Response(m)), Ok(Packet::HandshakeResponse(t))) => {
            assert_eq!(u32::from_le_bytes([m[8], m[9], m[10], m[11]]), t.receiver_idx);
        }
        (Ok(Message::CookieReply(m)), Ok(Packet::PacketCookieReply(t))) => {
            assert_eq!(u32::from_le_bytes([m[4], m[5], m[6], m[7]]), t.receiver_idx);
        }
        (Ok(Message::Transport { receiver, counter, sealed }), Ok(Packet::PacketData(t))) => {
            // boringtun keeps the rest to itself: the counter and the
            // sealed bytes are where the format puts them.
            assert_eq!(receiver, t.receiver_idx);
            assert_eq!(counter.to_le_bytes(), data[8..16]);
            assert_eq!(sealed, &data[16..]);
        }
        (Err(_), Err(_)) => {}
        (ours, theirs) => panic!("ours {ours:?}, boringtun {}", theirs.is_ok()),
    }
}
