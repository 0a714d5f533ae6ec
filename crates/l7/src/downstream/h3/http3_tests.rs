//! [`Http3`] against another implementation: quiche's own HTTP/3 client,
//! over a quiche connection in memory.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use quiche::h3::NameValue;

use super::*;
use crate::downstream::h3::stream_buf::BytesBufs;
use crate::downstream::tls::write_self_signed;

struct Pair {
    client: quiche::Connection,
    server: Quic,
    h3c: quiche::h3::Connection,
    h3s: Http3,
}

fn config(server: bool) -> quiche::Config {
    let mut c = quiche::Config::new(quiche::PROTOCOL_VERSION).expect("config");
    if server {
        // One certificate for the tests, which run at once.
        static FILES: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
        let (crt, key) = FILES.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("gh-h3-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("dir");
            let (crt, key) = (dir.join("a.crt"), dir.join("a.key"));
            write_self_signed(&["localhost".to_string()], &crt, &key).expect("certificate");
            (crt.display().to_string(), key.display().to_string())
        });
        c.load_cert_chain_from_pem_file(crt).expect("cert");
        c.load_priv_key_from_pem_file(key).expect("key");
    }
    c.verify_peer(false);
    c.set_application_protos(&[b"h3"]).expect("alpn");
    c.set_initial_max_data(4 << 20);
    c.set_initial_max_stream_data_bidi_local(1 << 20);
    c.set_initial_max_stream_data_bidi_remote(1 << 20);
    c.set_initial_max_stream_data_uni(64 << 10);
    c.set_initial_max_streams_bidi(100);
    c.set_initial_max_streams_uni(8);
    c.set_max_idle_timeout(30_000);
    c
}

const CLIENT: &str = "127.0.0.1:5000";
const SERVER: &str = "127.0.0.1:443";

fn addr(a: &str) -> SocketAddr {
    a.parse().expect("address")
}

/// The server's defaults: a 4 KB table, 16 streams may wait for it.
const QPACK: QpackLimits = QpackLimits { capacity: 4096, blocked_streams: 16 };

/// quiche's client and the server's connection, before any packet (the
/// server's ID is [2; 16]).
pub(in crate::downstream::h3) fn connections() -> (quiche::Connection, Quic) {
    let client = quiche::connect(
        Some("localhost"),
        &quiche::ConnectionId::from_ref(&[1; 16]),
        addr(CLIENT),
        addr(SERVER),
        &mut config(false),
    )
    .expect("client");
    let server = quiche::accept_with_buf_factory::<BytesBufs>(
        &quiche::ConnectionId::from_ref(&[2; 16]),
        None,
        addr(SERVER),
        addr(CLIENT),
        &mut config(true),
    )
    .expect("server");
    (client, server)
}

impl Pair {
    fn new() -> Pair {
        Pair::with(QPACK)
    }

    fn with(qpack: QpackLimits) -> Pair {
        let (mut client, mut server) = connections();
        pump(&mut client, &mut server);
        assert!(client.is_established() && server.is_established());
        let h3c = quiche::h3::Connection::with_transport(&mut client, &quiche::h3::Config::new().expect("h3"))
            .expect("h3 client");
        let h3s = Http3::start(&mut server, 64 * 1024, qpack).expect("h3 server");
        let mut p = Pair { client, server, h3c, h3s };
        p.pump();
        p
    }

    fn pump(&mut self) {
        pump(&mut self.client, &mut self.server);
    }

    /// What the server reads off its streams until there is nothing more.
    fn serve(&mut self) -> Result<Vec<(u64, Got)>, Fault> {
        let mut out = Vec::new();
        let mut ids: Vec<u64> = self.server.readable().collect();
        let mut next = 0;
        while let Some(&id) = ids.get(next) {
            next += 1;
            if id & 2 != 0 {
                let read = self.h3s.read_uni(&mut self.server, id);
                ids.extend(self.h3s.take_unblocked());
                read.map_err(Fault::Connection)?;
                continue;
            }
            loop {
                match self.h3s.read(&mut self.server, id)? {
                    Read::Head { more } => out.push((id, Got::Head(self.fields()?, more))),
                    Read::Data(d) => out.push((id, Got::Data(d))),
                    Read::Trailers => out.push((id, Got::Trailers(self.fields()?))),
                    Read::End => out.push((id, Got::End)),
                    Read::Reset => out.push((id, Got::Reset)),
                    Read::Nothing => break,
                }
            }
        }
        Ok(out)
    }

    fn fields(&mut self) -> Result<Vec<(String, String)>, Fault> {
        let mut f = Vec::new();
        self.h3s.decode(|n, v| {
            f.push((text(n), text(v)));
            true
        })?;
        Ok(f)
    }

    /// The client's events until there are none: heads and bodies.
    fn client_events(&mut self) -> (Vec<Fields>, Vec<u8>, bool) {
        let (mut heads, mut body, mut finished) = (Vec::new(), Vec::new(), false);
        let mut buf = vec![0; 65_536];
        loop {
            match self.h3c.poll(&mut self.client) {
                Ok((_, quiche::h3::Event::Headers { list, .. })) => {
                    heads.push(list.iter().map(|h| (text(h.name()), text(h.value()))).collect())
                }
                Ok((id, quiche::h3::Event::Data)) => {
                    while let Ok(n) = self.h3c.recv_body(&mut self.client, id, &mut buf) {
                        body.extend_from_slice(&buf[..n]);
                    }
                }
                Ok((_, quiche::h3::Event::Finished)) => finished = true,
                Ok(_) => {}
                Err(_) => return (heads, body, finished),
            }
        }
    }
}

type Fields = Vec<(String, String)>;

#[derive(Debug, PartialEq)]
enum Got {
    Head(Vec<(String, String)>, bool),
    Data(Bytes),
    Trailers(Vec<(String, String)>),
    End,
    Reset,
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(in crate::downstream::h3) fn pump(a: &mut quiche::Connection, b: &mut Quic) {
    let mut buf = vec![0u8; 1500];
    loop {
        let mut moved = false;
        while let Ok((n, info)) = a.send(&mut buf) {
            let _ = b.recv(&mut buf[..n], quiche::RecvInfo { from: info.from, to: info.to });
            moved = true;
        }
        while let Ok((n, info)) = b.send(&mut buf) {
            let _ = a.recv(&mut buf[..n], quiche::RecvInfo { from: info.from, to: info.to });
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

fn request(method: &str) -> Vec<quiche::h3::Header> {
    [
        (":method", method),
        (":scheme", "https"),
        (":authority", "localhost"),
        (":path", "/a?b=c"),
        ("user-agent", "quiche"),
        ("x-trace", "t-1"),
    ]
    .iter()
    .map(|(n, v)| quiche::h3::Header::new(n.as_bytes(), v.as_bytes()))
    .collect()
}

fn pairs(h: &[quiche::h3::Header]) -> Vec<(String, String)> {
    h.iter().map(|h| (text(h.name()), text(h.value()))).collect()
}

#[test]
fn a_get_and_its_response_pass_between_quiches_client_and_this_server() {
    let mut p = Pair::new();
    let id = p.h3c.send_request(&mut p.client, &request("GET"), true).expect("request");
    p.pump();
    let got = p.serve().expect("served");
    assert_eq!(got, vec![(id, Got::Head(pairs(&request("GET")), false)), (id, Got::End)]);

    let mut head = HeaderMap::new();
    head.insert("content-type", HeaderValue::from_static("text/plain"));
    head.insert("x-upstream", HeaderValue::from_static("a b"));
    head.insert("connection", HeaderValue::from_static("close")); // not carried
    p.h3s.send_head(&mut p.server, id, StatusCode::IM_A_TEAPOT, &head, false).expect("head");
    let mut body = Bytes::from_static(b"hello");
    assert_eq!(p.h3s.send_data(&mut p.server, id, &mut body, true), Ok(true));
    p.h3s.done(id);
    p.pump();
    let (heads, body, finished) = p.client_events();
    let want: Vec<(String, String)> = [(":status", "418"), ("content-type", "text/plain"), ("x-upstream", "a b")]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    assert_eq!((heads, body, finished), (vec![want], b"hello".to_vec(), true));
}

#[test]
fn a_small_body_goes_with_its_head_in_one_write() {
    let mut p = Pair::new();
    let id = p.h3c.send_request(&mut p.client, &request("GET"), true).expect("request");
    p.pump();
    p.serve().expect("served");
    let mut head = HeaderMap::new();
    head.insert("content-type", HeaderValue::from_static("text/plain"));
    let before = p.server.stats().sent;
    p.h3s.send_whole(&mut p.server, id, StatusCode::OK, &head, b"hello").expect("whole");
    p.h3s.done(id);
    p.pump();
    assert_eq!(p.server.stats().sent - before, 1, "head, body and end in one packet");
    let (heads, body, finished) = p.client_events();
    let want: Fields = [(":status", "200"), ("content-type", "text/plain")]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    assert_eq!((heads, body, finished), (vec![want], b"hello".to_vec(), true));
}

#[test]
fn large_bodies_both_ways_with_trailers_under_flow_control() {
    let mut p = Pair::new();
    let id = p.h3c.send_request(&mut p.client, &request("POST"), false).expect("request");
    let upload: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let (mut sent, mut received, mut trailers, mut ended) = (0, Vec::new(), None, false);
    while !ended {
        if sent < upload.len() {
            sent += p.h3c.send_body(&mut p.client, id, &upload[sent..], false).unwrap_or(0);
            if sent == upload.len() {
                let t = [quiche::h3::Header::new(b"x-sum", b"ok")];
                p.h3c.send_additional_headers(&mut p.client, id, &t, true, true).expect("trailers");
            }
        }
        p.pump();
        for (_, g) in p.serve().expect("served") {
            match g {
                Got::Head(_, more) => assert!(more),
                Got::Data(d) => received.extend_from_slice(&d),
                Got::Trailers(t) => trailers = Some(t),
                Got::End => ended = true,
                Got::Reset => panic!("reset"),
            }
        }
    }
    assert!(received == upload, "the body arrived whole ({} of {} bytes)", received.len(), upload.len());
    assert_eq!(trailers, Some(vec![("x-sum".to_string(), "ok".to_string())]));

    // A 3 MiB response, more than the client's 1 MiB window: sent as the
    // client makes room, what is left kept by the caller.
    p.h3s.send_head(&mut p.server, id, StatusCode::OK, &HeaderMap::new(), false).expect("head");
    let mut rest = Bytes::from(upload.clone());
    let mut got = Vec::new();
    let mut finished = false;
    for _ in 0..1000 {
        if !rest.is_empty() || !finished {
            match p.h3s.send_data(&mut p.server, id, &mut rest, true) {
                Ok(_) | Err(Unsent::Blocked) => {}
                Err(Unsent::Failed) => panic!("send failed"),
            }
        }
        p.pump();
        let (_, body, fin) = p.client_events();
        got.extend(body);
        finished |= fin;
        if finished {
            break;
        }
    }
    assert!(finished && got == upload, "the response arrived whole ({} of {} bytes)", got.len(), upload.len());
}

#[test]
fn data_before_headers_closes_the_connection_as_frame_unexpected() {
    let mut p = Pair::new();
    p.client.stream_send(0, b"\x00\x03abc", false).expect("send");
    p.pump();
    assert_eq!(p.serve(), Err(Fault::Connection(code::FRAME_UNEXPECTED)));
}

#[test]
fn a_second_control_stream_is_a_stream_creation_error() {
    let mut p = Pair::new();
    // quiche's client opened its control, QPACK and grease streams (2 to
    // 14); another control stream:
    let sent = p.client.stream_send(18, b"\x00\x04\x00", false);
    assert_eq!(sent, Ok(3), "{:?}", p.client.peer_streams_left_uni());
    p.pump();
    assert_eq!(p.serve(), Err(Fault::Connection(code::STREAM_CREATION_ERROR)));
}

#[test]
fn a_client_reset_is_read_as_one() {
    let mut p = Pair::new();
    let id = p.h3c.send_request(&mut p.client, &request("POST"), false).expect("request");
    p.pump();
    assert!(matches!(p.serve().expect("served")[..], [(_, Got::Head(_, true))]));
    p.client.stream_shutdown(id, quiche::Shutdown::Write, code::REQUEST_CANCELLED).expect("reset");
    p.pump();
    assert_eq!(p.serve(), Ok(vec![(id, Got::Reset)]));
}

/// Two GET requests on `p`, read by the server: their stream IDs.
fn two_gets(p: &mut Pair) -> (u64, u64) {
    let a = p.h3c.send_request(&mut p.client, &request("GET"), true).expect("a");
    let b = p.h3c.send_request(&mut p.client, &request("GET"), true).expect("b");
    p.pump();
    p.serve().expect("served");
    (a, b)
}

/// Which stream's response data the server sends first, when it has
/// queued two whole responses before any packet goes out: its packets
/// reach quiche's client one at a time until one carries response data
/// (the client's own order of readable streams, by its priorities, would
/// hide the server's order when both arrive together).
fn first_served(p: &mut Pair, a: u64, b: u64) -> u64 {
    let body = Bytes::from(vec![7u8; 5_000]);
    for id in [a, b] {
        p.h3s.send_head(&mut p.server, id, StatusCode::OK, &HeaderMap::new(), false).expect("head");
        let mut d = body.clone();
        assert_eq!(p.h3s.send_data(&mut p.server, id, &mut d, true), Ok(true));
    }
    let mut buf = vec![0u8; 1500];
    while let Ok((n, info)) = p.server.send(&mut buf) {
        let _ = p.client.recv(&mut buf[..n], quiche::RecvInfo { from: info.from, to: info.to });
        loop {
            match p.h3c.poll(&mut p.client) {
                Ok((id, quiche::h3::Event::Data)) => return id,
                Ok(_) => {}
                Err(quiche::h3::Error::Done) => break,
                Err(e) => panic!("no data: {e:?}"),
            }
        }
    }
    panic!("the server sent no response data");
}

#[test]
fn a_requests_priority_field_orders_the_responses() {
    let mut p = Pair::new();
    let a = p.h3c.send_request(&mut p.client, &request("GET"), true).expect("a");
    let mut urgent = request("GET");
    urgent.push(quiche::h3::Header::new(b"priority", b"u=0"));
    let b = p.h3c.send_request(&mut p.client, &urgent, true).expect("b");
    p.pump();
    for (id, got) in p.serve().expect("served") {
        if let Got::Head(fields, _) = got
            && let Some((_, v)) = fields.iter().find(|(n, _)| n == "priority")
        {
            p.h3s.prioritize(id, v.as_bytes());
        }
    }
    assert_eq!(first_served(&mut p, a, b), b, "urgency 0 goes before the default 3");
}

#[test]
fn a_priority_update_reorders_requests_in_flight() {
    let mut p = Pair::new();
    let (a, b) = two_gets(&mut p);
    // Same urgency: the older request first.
    let mut q = Pair::new();
    let (qa, qb) = two_gets(&mut q);
    assert_eq!(first_served(&mut q, qa, qb), qa);
    // B made urgent by a PRIORITY_UPDATE on the control stream.
    p.h3c.send_priority_update_for_request(&mut p.client, b, &quiche::h3::Priority::new(0, false)).expect("update");
    p.pump();
    p.serve().expect("served");
    assert_eq!(first_served(&mut p, a, b), b);
}

#[test]
fn an_idle_connection_gives_back_the_room_a_large_head_took() {
    let mut p = Pair::new();
    let mut big = request("GET");
    big.push(quiche::h3::Header::new(b"x-large", &[b'v'; 8000]));
    let id = p.h3c.send_request(&mut p.client, &big, true).expect("request");
    p.pump();
    let got = p.serve().expect("served");
    assert!(matches!(&got[0], (_, Got::Head(f, false)) if f.len() == big.len()));
    assert!(p.h3s.head.capacity() > KEEP_SCRATCH && p.h3s.values.capacity() + p.h3s.head.capacity() > 8000);
    p.h3s.done(id);
    assert!(p.h3s.streams.capacity() == 0);
    assert!([&p.h3s.head, &p.h3s.names, &p.h3s.values, &p.h3s.out].iter().all(|b| b.capacity() <= KEEP_SCRATCH));
}

// ---- QPACK's dynamic table ----

/// quiche's client opened its QPACK encoder stream (6) and never writes
/// to it again: the tests write a table-using encoder's instructions
/// there, and requests by hand on streams quiche's client does not use.
const ENCODER: u64 = 6;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or(0)).collect()
}

/// RFC 9204 B.2: the table's capacity, then `:authority` and `:path`.
const B2_ENCODER: &str = "3fbd01c00f7777772e6578616d706c652e636f6dc10c2f73616d706c652f70617468";

/// A HEADERS frame holding the B.2 section (both entries, post-base).
fn b2_headers() -> Vec<u8> {
    [vec![0x01, 0x04], hex("03811011")].concat()
}

fn b2_fields() -> Vec<(String, String)> {
    vec![(":authority".into(), "www.example.com".into()), (":path".into(), "/sample/path".into())]
}

/// What the server's decoder stream carried to the client.
fn decoder_stream(p: &mut Pair) -> Vec<u8> {
    assert_eq!(p.h3s.flush_decoder(&mut p.server), Ok(()));
    p.pump();
    let mut buf = [0u8; 256];
    let mut out = Vec::new();
    while let Ok((n, _)) = p.client.stream_recv(7, &mut buf) {
        out.extend_from_slice(&buf[..n]);
    }
    out
}

#[test]
fn a_head_that_names_entries_not_there_yet_waits_for_them() {
    let mut p = Pair::new();
    p.client.stream_send(0, &b2_headers(), true).expect("request");
    p.pump();
    assert_eq!(p.serve(), Ok(vec![]), "blocked: nothing read");
    assert_eq!(p.h3s.blocked, 1);
    p.client.stream_send(ENCODER, &hex(B2_ENCODER), false).expect("encoder stream");
    p.pump();
    assert_eq!(p.serve(), Ok(vec![(0, Got::Head(b2_fields(), false)), (0, Got::End)]));
    assert_eq!(p.h3s.blocked, 0);
    // Answered: everything on the stream was read, nothing to cancel.
    p.h3s.done(0);
    // The decoder stream opens with its type and acknowledges stream 0's
    // section, which tells the encoder both entries arrived.
    assert_eq!(decoder_stream(&mut p), [0x03, 0x80]);
    // The same entries again, now in the table: no wait.
    p.client.stream_send(4, &b2_headers(), true).expect("request");
    p.pump();
    assert_eq!(p.serve(), Ok(vec![(4, Got::Head(b2_fields(), false)), (4, Got::End)]));
    assert_eq!(decoder_stream(&mut p), [0x84]);
}

#[test]
fn entries_are_counted_back_and_unread_sections_cancelled() {
    let mut p = Pair::new();
    p.client.stream_send(ENCODER, &hex(B2_ENCODER), false).expect("encoder stream");
    p.pump();
    assert_eq!(p.serve(), Ok(vec![]));
    assert_eq!(decoder_stream(&mut p), [0x03, 0x02], "Insert Count Increment 2");
    // A request whose body (and trailers) the server stops reading.
    p.client.stream_send(0, &b2_headers(), false).expect("request");
    p.pump();
    assert_eq!(p.serve(), Ok(vec![(0, Got::Head(b2_fields(), true))]));
    p.h3s.done(0);
    assert_eq!(decoder_stream(&mut p), [0x80, 0x40], "acknowledged, then cancelled");
}

#[test]
fn more_waiting_streams_than_announced_close_the_connection() {
    let mut p = Pair::with(QpackLimits { capacity: 4096, blocked_streams: 1 });
    p.client.stream_send(0, &b2_headers(), true).expect("request");
    p.client.stream_send(4, &b2_headers(), true).expect("request");
    p.pump();
    assert_eq!(p.serve(), Err(Fault::Connection(code::QPACK_DECOMPRESSION_FAILED)));
}

#[test]
fn without_a_table_an_insertion_is_an_encoder_stream_error() {
    let mut p = Pair::with(QpackLimits { capacity: 0, blocked_streams: 0 });
    p.client.stream_send(ENCODER, &hex(B2_ENCODER), false).expect("encoder stream");
    p.pump();
    assert_eq!(p.serve(), Err(Fault::Connection(code::QPACK_ENCODER_STREAM_ERROR)));
}

#[test]
fn small_responses_of_many_streams_share_a_packet() {
    // quiche as published puts one stream's frame in a packet; with
    // third_party/quiche's patch, frames of other streams fill the rest.
    let mut p = Pair::new();
    let ids: Vec<u64> =
        (0..10).map(|_| p.h3c.send_request(&mut p.client, &request("GET"), true).expect("request")).collect();
    p.pump();
    p.serve().expect("served");
    for &id in &ids {
        p.h3s.send_head(&mut p.server, id, StatusCode::OK, &HeaderMap::new(), false).expect("head");
        let mut body = Bytes::from_static(&[b'x'; 64]);
        assert_eq!(p.h3s.send_data(&mut p.server, id, &mut body, true), Ok(true));
        p.h3s.done(id);
    }
    let mut buf = vec![0u8; 1500];
    let mut packets = Vec::new();
    while let Ok((n, info)) = p.server.send(&mut buf) {
        packets.push(n);
        let _ = p.client.recv(&mut buf[..n], quiche::RecvInfo { from: info.from, to: info.to });
    }
    assert_eq!(packets.len(), 1, "ten responses of about 80 bytes in one packet: {packets:?}");
    p.pump();
    let (heads, body, _) = p.client_events();
    assert_eq!(heads.len(), 10);
    assert_eq!(body.len(), 10 * 64);
}

#[test]
fn a_head_without_room_waits_and_then_goes_whole() {
    let mut p = Pair::new();
    let (a, b) = two_gets(&mut p);
    // Stream a takes all the room the congestion window leaves.
    p.h3s.send_head(&mut p.server, a, StatusCode::OK, &HeaderMap::new(), false).expect("head");
    let body: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 253) as u8).collect();
    let mut rest = Bytes::from(body.clone());
    assert_eq!(p.h3s.send_data(&mut p.server, a, &mut rest, true), Ok(false));
    assert_eq!(p.server.stream_capacity(b), Ok(0));
    let mut head = HeaderMap::new();
    head.insert("x-b", HeaderValue::from_static("second"));
    // Refused whole: nothing of it reaches the stream.
    assert_eq!(p.h3s.send_head(&mut p.server, b, StatusCode::OK, &head, true), Err(Unsent::Blocked));
    let (mut heads, mut got, mut b_sent) = (Vec::new(), Vec::new(), false);
    for _ in 0..1000 {
        p.pump();
        if !b_sent {
            match p.h3s.send_head(&mut p.server, b, StatusCode::OK, &head, true) {
                Ok(()) => b_sent = true,
                Err(Unsent::Blocked) => {}
                Err(Unsent::Failed) => panic!("head failed"),
            }
        }
        if !rest.is_empty() {
            assert_ne!(p.h3s.send_data(&mut p.server, a, &mut rest, true), Err(Unsent::Failed));
        }
        let (h, d, _) = p.client_events();
        heads.extend(h);
        got.extend(d);
        if b_sent && rest.is_empty() && got.len() == body.len() && heads.len() == 2 {
            break;
        }
    }
    assert!(b_sent, "room came with the client's acknowledgements");
    assert!(got == body, "a's body arrived whole ({} of {} bytes)", got.len(), body.len());
    let second = vec![(":status".to_string(), "200".to_string()), ("x-b".to_string(), "second".to_string())];
    assert!(heads.contains(&second), "b's head arrived whole: {heads:?}");
}
