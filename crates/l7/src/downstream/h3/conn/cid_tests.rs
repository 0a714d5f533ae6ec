//! A packet that comes behind the retirement of its connection ID.

use quiche::ConnectionId;

use super::names_another_cid;
use crate::downstream::h3::cid::CID_LEN;
use crate::downstream::h3::http3::tests::{connections, pump};
use crate::downstream::h3::stream_buf::Quic;

fn established() -> (quiche::Connection, Quic) {
    let (mut client, mut server) = connections();
    pump(&mut client, &mut server);
    assert!(client.is_established() && server.is_established());
    (client, server)
}

/// The client's next packet, not delivered.
fn held(client: &mut quiche::Connection) -> (Vec<u8>, quiche::RecvInfo) {
    client.send_ack_eliciting().expect("ping");
    let mut buf = vec![0u8; 1500];
    let (n, info) = client.send(&mut buf).expect("a packet");
    buf.truncate(n);
    (buf, quiche::RecvInfo { from: info.from, to: info.to })
}

#[test]
fn a_packet_behind_the_retirement_of_its_connection_id_names_another_connection() {
    let (mut client, mut server) = established();
    // The server gives the client a second ID to move to.
    server.new_scid(&ConnectionId::from_ref(&[3; CID_LEN]), 3, false).expect("a second ID");
    pump(&mut client, &mut server);
    assert_eq!(client.available_dcids(), 1);

    // A packet with the first ID, held back; the client then retires that
    // ID and the retirement reaches the server first.
    let (mut late, info) = held(&mut client);
    assert_eq!(&late[1..1 + CID_LEN], &[2; CID_LEN]);
    assert!(!names_another_cid(&late, &server), "the first ID is the server's until retired");
    client.retire_dcid(0).expect("retire the first ID");
    pump(&mut client, &mut server);
    assert!(server.source_ids().all(|c| c.as_ref() != [2; CID_LEN]), "retired at the server");
    assert!(names_another_cid(&late, &server));

    // A packet with the second ID is the connection's; and so is any
    // packet before the handshake's end, and a long header.
    let (now, _) = held(&mut client);
    assert_eq!(&now[1..1 + CID_LEN], &[3; CID_LEN]);
    assert!(!names_another_cid(&now, &server));
    let mut long = late.clone();
    long[0] |= 0x80;
    assert!(!names_another_cid(&long, &server));
    assert!(!names_another_cid(&late[..CID_LEN], &server), "too short to name an ID");
    assert!(!names_another_cid(&[], &server));

    // What the check spares the connection: quiche closes it for the
    // late packet (PROTOCOL_VIOLATION).
    assert_eq!(server.recv(&mut late, info), Err(quiche::Error::InvalidState));
    assert_eq!(server.local_error().map(|e| e.error_code), Some(0x0a));
}

#[test]
fn before_the_handshake_ends_no_packet_is_judged() {
    let (mut client, server) = connections();
    let mut buf = vec![0u8; 1500];
    let (n, _) = client.send(&mut buf).expect("the Initial");
    let mut short = buf[..n].to_vec();
    short[0] &= 0x7f;
    short[1..1 + CID_LEN].copy_from_slice(&[9; CID_LEN]);
    assert!(!names_another_cid(&short, &server));
}
