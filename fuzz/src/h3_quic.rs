//! The QUIC glue of Gatehouse's HTTP/3 server (quiche is fuzzed upstream):
//! Retry tokens, connection IDs that name their worker, and the Initial
//! packet that refuses a bad token (`l7::quic`). Input: one byte of
//! choices (bit 0: IPv6 peer; the rest, which byte of a token to damage),
//! then three pieces (a length byte and its bytes): a client's
//! destination and source connection IDs, and a token it presents.
//!
//! Properties: a token the fuzzer makes up is refused; a token made for an
//! address and a connection ID gives that connection ID back at that
//! address only, and refuses any damage; a connection ID names the worker
//! it was made for; a refusing Initial is a QUIC v1 Initial that quiche
//! reads as coming from the server's connection ID to the client's.

use std::net::SocketAddr;
use std::sync::OnceLock;

use gatehouse_l7::quic::{CID_LEN, INVALID_TOKEN, Keys, VERSION_1, close_packet, worker_of};

use crate::input::Input;

fn keys() -> &'static Keys {
    static KEYS: OnceLock<Keys> = OnceLock::new();
    KEYS.get_or_init(Keys::new)
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let choices = input.byte();
    let (dcid, scid, token) = (input.piece(), input.piece(), input.piece());
    let peer: SocketAddr = if choices & 1 == 0 {
        SocketAddr::from(([192, 0, 2, 7], 4433))
    } else {
        SocketAddr::from(([0x2001, 0xdb8, 0, 0, 0, 0, 0, 7], 4433))
    };
    let other = SocketAddr::from(([192, 0, 2, 8], 4433));
    let keys = keys();
    assert_eq!(keys.check_token(token, &peer), None, "a token the fuzzer made up was taken");
    if dcid.len() <= quiche::MAX_CONN_ID_LEN {
        let mut made = keys.retry_token(&peer, dcid);
        assert_eq!(keys.check_token(&made, &peer), Some(dcid));
        assert_eq!(keys.check_token(&made, &other), None, "a token taken from another address");
        let at = usize::from(choices >> 1) % made.len();
        made[at] ^= 1 << (choices % 8);
        assert_eq!(keys.check_token(&made, &peer), None, "a damaged token was taken");
    }
    let worker = usize::from(dcid.first().copied().unwrap_or(0));
    let cid = keys.new_cid(worker);
    assert_eq!((cid.len(), worker_of(&cid)), (CID_LEN, Some(worker)));
    assert_eq!(worker_of(dcid), (dcid.len() == CID_LEN).then(|| usize::from(dcid[0])));
    let Some(mut pkt) = close_packet(dcid, scid, &cid, INVALID_TOKEN, b"invalid token") else {
        assert!(dcid.len() > 20 || scid.len() > 20, "no packet for valid connection IDs");
        return;
    };
    let h = quiche::Header::from_slice(&mut pkt, CID_LEN).expect("quiche cannot read our Initial");
    assert_eq!(h.ty, quiche::Type::Initial);
    assert_eq!(h.version, VERSION_1);
    assert_eq!((&h.dcid[..], &h.scid[..]), (scid, &cid[..]));
}
