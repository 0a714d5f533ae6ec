//! A packet that comes behind the retirement of its connection ID
//! (`third_party/quiche/retired-connection-id-dropped.patch`).

use quiche::ConnectionId;

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
fn a_packet_behind_the_retirement_of_its_connection_id_is_dropped_and_the_connection_lives_on() {
    let (mut client, mut server) = established();
    // The server gives the client a second ID to move to.
    server.new_scid(&ConnectionId::from_ref(&[3; CID_LEN]), 3, false).expect("a second ID");
    pump(&mut client, &mut server);
    assert_eq!(client.available_dcids(), 1);

    // A packet with the first ID, held back; the client then retires that
    // ID and the retirement reaches the server first.
    let (mut late, info) = held(&mut client);
    assert_eq!(&late[1..1 + CID_LEN], &[2; CID_LEN]);
    assert!(server.source_ids().any(|c| c.as_ref() == [2; CID_LEN]), "the first ID is the server's until retired");
    client.retire_dcid(0).expect("retire the first ID");
    pump(&mut client, &mut server);
    assert!(server.source_ids().all(|c| c.as_ref() != [2; CID_LEN]), "retired at the server");

    // quiche as published closed the connection for the late packet
    // (InvalidState, PROTOCOL_VIOLATION); it is now dropped whole.
    let received = server.stats().recv;
    assert_eq!(server.recv(&mut late, info), Ok(late.len()));
    assert_eq!(server.stats().recv, received, "not taken as the connection's");
    assert!(server.local_error().is_none() && !server.is_closed() && !server.is_draining());

    // A packet with the second ID is the connection's, and the two still talk.
    let (mut now, info) = held(&mut client);
    assert_eq!(&now[1..1 + CID_LEN], &[3; CID_LEN]);
    assert_eq!(server.recv(&mut now, info), Ok(now.len()));
    assert_eq!(server.stats().recv, received + 1);
    pump(&mut client, &mut server);
    assert!(client.peer_error().is_none() && !client.is_closed());
    assert!(server.local_error().is_none() && !server.is_closed());
}
