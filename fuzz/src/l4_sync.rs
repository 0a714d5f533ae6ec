//! The L4 session-sync datagram (`l4::sync`). Input: one byte of choices
//! (bit 0: end the datagram with the right MAC, so the fuzzer gets past
//! it to the records), then the datagram.
//!
//! Properties: a datagram opened once is refused as a replay the second
//! time; each record it carries, written and read again, is the same
//! record in the same bytes; the records sealed again by a sender open
//! to the same records at another receiver.

use gatehouse_l4::sync::{Key, Kind, MAX_RECORDS, RECORD_LEN, Receiver, Record, Refused, Sender};

const KEY: [u8; 32] = [0x5a; 32];
/// The receiving node's id.
const OWN: u8 = 2;

pub fn run(data: &[u8]) {
    let Some((&choices, body)) = data.split_first() else { return };
    let key = Key::new(&KEY);
    let mut d = body.to_vec();
    if choices & 1 != 0 {
        let mac = key.mac(&d);
        d.extend_from_slice(&mac);
    }
    let mut rx = Receiver::new(key.clone(), OWN);
    let Ok(msg) = rx.open(&d) else { return };
    assert!(matches!(rx.open(&d), Err(Refused::Replay)), "a datagram opened twice");
    assert!(msg.records.len() <= MAX_RECORDS);
    for r in &msg.records {
        let mut bytes = [0u8; RECORD_LEN];
        r.write(&mut bytes);
        let back = Record::read(&bytes).expect("a record written does not read back");
        assert_eq!(&back, r);
        let mut again = [0u8; RECORD_LEN];
        back.write(&mut again);
        assert_eq!(again, bytes);
    }
    let mut tx = Sender::new(key.clone(), msg.node, msg.epoch);
    let mut out = Vec::new();
    tx.seal(if msg.kind == Kind::Hello { Kind::Hello } else { Kind::Sessions }, &msg.records, &mut out);
    let mut other = Receiver::new(key, OWN);
    let again = other.open(&out).expect("records sealed again do not open");
    assert_eq!(again.records, msg.records);
    assert_eq!((again.kind, again.node, again.epoch), (msg.kind, msg.node, msg.epoch));
}
