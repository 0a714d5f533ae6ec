//! A WireGuard device's receive path (`wg::device`): the responder's and
//! the initiator's handshake handling, cookies under load, the transport
//! path and its replay window. Input: one byte of choices, then a
//! datagram. The choices: bit 0, to the responder (else to the
//! initiator); bit 1, mac1 made right first (so the fuzzer gets past it);
//! bit 2, the responder is under load; bits 4–5, the source address; bits
//! 6–7, how far the clock has moved.
//!
//! Each run starts from two devices with a session up. Properties: no
//! panic; a packet that comes out is at least an IP header and within
//! the buffer; a drop has a counted reason; afterwards the responder
//! still completes a handshake and takes data.

use std::time::Duration;

use gatehouse_wg::device::{DropReason, Received};

use crate::wg_pair::{addr, established, start, still_works, with_mac1};

const SOURCES: [&str; 4] = [crate::wg_pair::A, crate::wg_pair::B, "198.51.100.7:4000", "[2001:db8::9]:51820"];

pub fn run(data: &[u8]) {
    let Some((&choices, datagram)) = data.split_first() else { return };
    let to_b = choices & 1 == 1;
    let d = if choices & 2 != 0 { with_mac1(datagram, to_b) } else { datagram.to_vec() };
    let t0 = start();
    let (mut a, mut b) = established(42);
    b.set_under_load(choices & 4 != 0);
    let now = t0 + Duration::from_secs([0, 1, 130, 200][usize::from(choices >> 6)]);
    let src = addr(SOURCES[usize::from((choices >> 4) & 3)]);
    let dev = if to_b { &mut b } else { &mut a };
    let mut replies = Vec::new();
    let mut inner = Vec::new();
    for _ in 0..2 {
        match dev.receive(&d, src, now, &mut replies, &mut inner) {
            Received::Packet { len, .. } => assert!(len >= 20 && len <= inner.len(), "a packet of {len} bytes"),
            Received::Control => {}
            Received::Dropped(r) => assert!(DropReason::NAMES.contains(&r.name()), "{} is not counted", r.name()),
        }
    }
    let _ = a.tick(now, &mut replies);
    let _ = b.tick(now, &mut replies);
    b.set_under_load(false);
    still_works(&mut b, 7);
}
