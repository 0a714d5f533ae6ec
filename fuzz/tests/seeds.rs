//! The seeds each corpus starts from, made here from the protocols' own
//! builders (so they are valid byte for byte), written as
//! `corpus/<target>/seed-<name>.bin`. Beside them the corpus keeps
//! captures of real traffic (`capture-*`) and every crasher found
//! (`crash-*`), which are not made here. The test checks the stored seeds
//! are exactly these; `GATEHOUSE_WRITE_CORPUS=1 cargo test -p
//! gatehouse-fuzz --test seeds` rewrites them (then check them in).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use gatehouse_fuzz::wg_pair::{A, B, deliver, packet, pair};
use gatehouse_l4::session::State;
use gatehouse_l4::sync::{Key, Kind, Record, Sender};
use gatehouse_l7::h2::frame;
use gatehouse_l7::h2::hpack::Encoder;
use gatehouse_wire::checksum;
use gatehouse_wire::packet::build;
use gatehouse_wire::packet::{
    ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN, PROTO_ICMP, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_FIN,
    TCP_PSH, TCP_RST, TCP_SYN,
};

type Seeds = Vec<(&'static str, Vec<u8>)>;

fn with(prefix: &[u8], rest: &[u8]) -> Vec<u8> {
    [prefix, rest].concat()
}

fn h1_request() -> Seeds {
    vec![
        ("get", b"GET /a?b=1 HTTP/1.1\r\nHost: x.test\r\nUser-Agent: t\r\nAccept: */*\r\n\r\n".to_vec()),
        ("head-close", b"HEAD / HTTP/1.1\r\nhost: a\r\nConnection: keep-alive, close\r\nX-Empty:\r\n\r\n".to_vec()),
        ("absolute-lf", b"DELETE http://x.test:8080/p HTTP/1.1\nHost: x.test\n\n".to_vec()),
        ("asterisk-obs", b"OPTIONS * HTTP/1.1\r\nHost: a\r\nX-Obs: caf\xc3\xa9\r\n\r\n".to_vec()),
        ("post", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc".to_vec()),
        ("upgrade", b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".to_vec()),
    ]
}

fn h1_chunked() -> Seeds {
    let body = b"5\r\nhello\r\n1;ext=1\r\n \r\n6\r\n world\r\n0\r\nx-trailer: 1\r\n\r\n";
    vec![
        ("whole", with(&[0], body)),
        ("split", with(&[3, 2, 7, 0], body)),
        ("empty", with(&[0], b"0\r\n\r\n")),
        ("large-size", with(&[1, 4], b"fffffffffffffff\r\nabc")),
    ]
}

fn h1_response() -> Seeds {
    vec![
        ("length", with(&[0], b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello")),
        ("chunked", with(&[0], b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")),
        ("switching", with(&[0], b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")),
        ("continue", with(&[0], b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")),
        ("http10", with(&[0], b"HTTP/1.0 200 OK\r\nConnection: keep-alive, x-drop\r\nX-Drop: 1\r\nContent-Length: 2\r\n\r\nok")),
        ("head", with(&[1], b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n")),
        ("ambiguous", with(&[0], b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")),
        ("nginx", with(&[0], b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Mon, 23 Nov 2026 10:00:00 GMT\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")),
        ("connection-listed", with(&[0], b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: X-A, close\r\nX-A: 1\r\nKeep-Alive: t=5\r\n\r\n")),
        ("obs-text-lf", with(&[0], b"HTTP/1.0 404 Not Found\nX-Obs: caf\xc3\xa9\nX-Empty:\n\n")),
    ]
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or(0)).collect()
}

/// Blocks, each after its length byte.
fn blocks(list: &[Vec<u8>]) -> Vec<u8> {
    list.iter().flat_map(|b| std::iter::once(b.len() as u8).chain(b.iter().copied())).collect()
}

fn h2_hpack() -> Seeds {
    // RFC 7541 C.3 (plain) and C.4 (Huffman): three requests on one
    // connection each; C.5 and C.6 responses with a 256-byte table.
    let c3 = [
        "828684410f7777772e6578616d706c652e636f6d",
        "828684be58086e6f2d6361636865",
        "828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565",
    ];
    let c4 = [
        "828684418cf1e3c2e5f23a6ba0ab90f4ff",
        "828684be5886a8eb10649cbf",
        "828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf",
    ];
    let c6 = "3f e1 1f 48 82 64 02 58 85 ae c3 77 1a 4b 61 96 d0 7a be 94 10 54 d4 44 a8 20 05 95 04 0b 81 66 e0 82 a6 2d 1b ff 6e 91 9d 29 ad 17 18 63 c7 8f 0b 97 c8 e9 ae 82 ae 43 d3".replace(' ', "");
    let mut enc = Encoder::default();
    let mut ours = Vec::new();
    enc.begin_block(&mut ours);
    for (n, v) in [(":status", "200"), ("content-type", "text/html"), ("set-cookie", "a=b"), ("etag", "\"x\"")] {
        enc.field(&mut ours, n, v.as_bytes());
    }
    vec![
        ("rfc7541-c3", blocks(&c3.iter().map(|s| hex(s)).collect::<Vec<_>>())),
        ("rfc7541-c4", blocks(&c4.iter().map(|s| hex(s)).collect::<Vec<_>>())),
        ("rfc7541-c6-size-update", blocks(&[hex(&c6)])),
        ("gatehouse-encoder", blocks(&[ours.clone(), ours])),
    ]
}

fn request_block(enc: &mut Encoder, fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = Vec::new();
    enc.begin_block(&mut b);
    for (n, v) in fields {
        enc.field(&mut b, n, v.as_bytes());
    }
    b
}

fn h2_frames() -> Seeds {
    let get = [(":method", "GET"), (":scheme", "https"), (":path", "/"), (":authority", "a.test")];
    let post = [(":method", "POST"), (":scheme", "https"), (":path", "/up"), (":authority", "a.test")];
    let mut enc = Encoder::default();
    let mut s = Vec::new();
    frame::put_settings(
        &mut s,
        &[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20), (frame::SETTINGS_MAX_FRAME_SIZE, 1 << 15)],
    );
    frame::put_window_update(&mut s, 0, 1 << 20);
    let b = request_block(&mut enc, &get);
    frame::put_headers(&mut s, 1, &b, true, 16_384);
    let mut post_s = Vec::new();
    frame::put_settings(&mut post_s, &[]);
    let b = request_block(&mut enc, &post);
    let (first, rest) = b.split_at(b.len() / 2);
    frame::put_head(&mut post_s, first.len(), frame::HEADERS, 0, 3);
    post_s.extend_from_slice(first);
    frame::put_head(&mut post_s, rest.len(), frame::CONTINUATION, frame::END_HEADERS, 3);
    post_s.extend_from_slice(rest);
    frame::put_data(&mut post_s, 3, b"hello", false);
    frame::put_head(&mut post_s, 8, frame::PING, 0, 0);
    post_s.extend_from_slice(b"pingpong");
    frame::put_data(&mut post_s, 3, b"", true);
    let mut reset = Vec::new();
    frame::put_settings(&mut reset, &[]);
    for id in [1u32, 3, 5, 7] {
        let b = request_block(&mut enc, &get);
        frame::put_headers(&mut reset, id, &b, false, 16_384);
        frame::put_rst(&mut reset, id, frame::Reason::Internal);
    }
    frame::put_goaway(&mut reset, 0, frame::Reason::NoError);
    vec![
        ("get", with(&[0], &s)),
        ("post-continuation", with(&[2, 10, 30], &post_s)),
        ("rapid-reset", with(&[0], &reset)),
    ]
}

fn h2_conn() -> Seeds {
    // op 0 (a frame): type, flags, stream, payload length, payload.
    let headers = |flags: u8, stream: u8, which: u8| vec![0, frame::HEADERS, flags | 0x40, stream, 1, which];
    let data = |stream: u8, end: bool, n: u8| {
        let mut v = vec![1, frame::DATA, u8::from(end), stream, n];
        v.extend(std::iter::repeat_n(b'x', usize::from(n)));
        v
    };
    let settings = vec![2, frame::SETTINGS, 0, 0, 6, 0, 4, 0, 0, 0x10, 0];
    let window = vec![3, frame::WINDOW_UPDATE, 0, 1, 4, 0, 0, 0x40, 0];
    let get = [headers(frame::END_HEADERS | frame::END_STREAM, 1, 0), vec![5, 200], vec![7, 2]].concat();
    let post =
        [headers(frame::END_HEADERS, 1, 1), data(1, false, 200), vec![6], data(1, true, 50), vec![5, 1]].concat();
    let mixed = [
        settings,
        headers(frame::END_HEADERS | frame::END_STREAM, 1, 0),
        headers(frame::END_HEADERS, 3, 2),
        data(3, false, 3),
        window,
        vec![5, 255],
        vec![7, 0],
        headers(frame::END_HEADERS | frame::END_STREAM, 5, 4),
        vec![7, 1],
    ]
    .concat();
    vec![("get", get), ("post", post), ("mixed", mixed)]
}

/// Datagrams from one run of the protocol between two devices.
fn h3_quic() -> Seeds {
    let piece = |b: &[u8]| with(&[b.len() as u8], b);
    let cid8 = [0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08];
    let ours = [1u8; 16];
    vec![
        ("rfc9001-ids", [vec![0], piece(&cid8), piece(&[]), piece(&[])].concat()),
        ("our-cid-v6", [vec![3], piece(&ours), piece(&cid8), piece(&[0; 41])].concat()),
        ("long-ids", [vec![8], piece(&[7; 20]), piece(&[9; 20]), piece(b"token")].concat()),
    ]
}

fn wg_datagrams() -> Seeds {
    let t0 = Instant::now();
    let (mut a, mut b) = pair(t0, 42);
    let mut out = Vec::new();
    let _ = a.send(&packet(30), t0, &mut out);
    let initiation = out.first().map(|t| t.datagram.clone()).unwrap_or_default();
    let replies = deliver(&mut b, A, out, t0);
    let response = replies.first().map(|t| t.datagram.clone()).unwrap_or_default();
    let data = deliver(&mut a, B, replies, t0);
    let first_data = data.first().map(|t| t.datagram.clone()).unwrap_or_default();
    let _ = deliver(&mut b, A, data, t0);
    let mut out = Vec::new();
    let _ = a.send(&packet(1300), t0, &mut out);
    let large = out.first().map(|t| t.datagram.clone()).unwrap_or_default();
    let mut ka = Vec::new();
    let _ = b.tick(t0 + Duration::from_secs(11), &mut ka);
    let keepalive = ka.first().map(|t| t.datagram.clone()).unwrap_or_default();
    b.set_under_load(true);
    let later = t0 + Duration::from_secs(200);
    let mut out = Vec::new();
    let _ = a.send(&packet(10), later, &mut out);
    let cookie = deliver(&mut b, A, out, later).into_iter().find(|t| t.datagram.first() == Some(&3));
    vec![
        ("initiation", initiation),
        ("response", response),
        ("transport-first", first_data),
        ("transport-1300", large),
        ("keepalive", keepalive),
        ("cookie-reply", cookie.map(|t| t.datagram).unwrap_or_default()),
        ("junk", (0..64u8).collect()),
    ]
}

fn wg_device() -> Seeds {
    // Choices: to b (1) or a (0), mac1 fixed (2), under load (4).
    wg_datagrams()
        .into_iter()
        .map(|(name, d)| {
            let choices = match name {
                "initiation" => 1 | 2,
                "response" | "cookie-reply" => 2,
                "transport-first" | "transport-1300" => 1,
                _ => 1 | 4,
            };
            (name, with(&[choices], &d))
        })
        .collect()
}

fn wg_cookie() -> Seeds {
    let d = wg_datagrams();
    let cookie = d.iter().find(|(n, _)| *n == "cookie-reply").map(|(_, d)| d.clone()).unwrap_or_default();
    vec![
        ("stale-cookie", with(&[0], &cookie)),
        ("after-genuine", with(&[3], &cookie)),
        ("junk", with(&[1], &[3, 0, 0, 0])),
    ]
}

fn wg_uapi() -> Seeds {
    let k = "e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a";
    let p = "b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85481e7a58";
    vec![
        ("get", b"get=1\n\n".to_vec()),
        (
            "set-interface",
            format!("set=1\nprivate_key={k}\nlisten_port=51820\nfwmark=0\nreplace_peers=true\n\n").into_bytes(),
        ),
        (
            "set-peer",
            format!(
                "set=1\npublic_key={p}\npreshared_key={k}\nendpoint=[2001:db8::1]:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.0.0.0/8\nallowed_ip=fd00::/64\nprotocol_version=1\n\n"
            )
            .into_bytes(),
        ),
        ("remove-peer", format!("set=1\npublic_key={p}\nremove=true\nupdate_only=true\n\n").into_bytes()),
    ]
}

fn frames() -> Seeds {
    let c = [10, 0, 0, 1];
    let tcp = |src: [u8; 4], sp: u16, dst: [u8; 4], dp: u16, flags: u8, data: &[u8]| {
        let seg = build::tcp(sp, dp, flags, data, |l| checksum::pseudo_v4(src, dst, PROTO_TCP, l as u16));
        build::eth(ETHERTYPE_IPV4, &build::ipv4(src, dst, PROTO_TCP, &seg))
    };
    let udp = |src: [u8; 4], sp: u16, dst: [u8; 4], dp: u16, data: &[u8]| {
        let seg = build::udp(sp, dp, data, |l| checksum::pseudo_v4(src, dst, PROTO_UDP, l as u16));
        build::eth(ETHERTYPE_IPV4, &build::ipv4(src, dst, PROTO_UDP, &seg))
    };
    let mut list: Seeds = vec![
        ("nat-syn", tcp(c, 40000, [10, 0, 0, 100], 80, TCP_SYN, b"")),
        ("nat-ack-data", tcp(c, 40000, [10, 0, 0, 100], 80, TCP_ACK | TCP_PSH, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")),
        ("nat-fin", tcp(c, 40000, [10, 0, 0, 100], 80, TCP_FIN | TCP_ACK, b"")),
        ("nat-rst", tcp(c, 40000, [10, 0, 0, 100], 80, TCP_RST | TCP_ACK, b"")),
        ("nat-reply", tcp([10, 0, 1, 1], 8001, c, 40000, TCP_SYN | TCP_ACK, b"")),
        ("fnat-udp", udp(c, 5353, [10, 0, 0, 101], 53, b"\x12\x34\x01\x00\x00\x01")),
        ("fnat-reply", udp([10, 0, 1, 2], 8002, [10, 0, 9, 1], 1025, b"answer")),
        ("dr-syn", tcp(c, 40001, [10, 0, 0, 102], 443, TCP_SYN, b"")),
        ("ipip-syn", tcp(c, 40002, [10, 0, 0, 103], 80, TCP_SYN, b"")),
        ("gue-udp", udp(c, 40003, [10, 0, 0, 104], 80, b"datagram")),
        ("other-host", tcp(c, 1, [10, 0, 0, 7], 22, TCP_SYN, b"")),
    ];
    let quoted = build::ipv4([10, 0, 0, 100], c, PROTO_TCP, &[0, 80, 0x9c, 0x40, 0, 0, 0, 1]);
    let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc];
    icmp.extend_from_slice(&quoted);
    let sum = checksum::checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    list.push((
        "icmp-frag-needed",
        build::eth(ETHERTYPE_IPV4, &build::ipv4([192, 0, 2, 1], [10, 0, 0, 100], PROTO_ICMP, &icmp)),
    ));
    let mut arp = vec![0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 9, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 100];
    arp.resize(28, 0);
    list.push(("arp-request", build::eth(ETHERTYPE_ARP, &arp)));
    let s6 = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let d6 = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let seg6 = build::tcp(1234, 443, TCP_SYN, b"", |l| checksum::pseudo_v6(s6, d6, PROTO_TCP, l as u32));
    list.push(("ipv6-syn", build::eth(ETHERTYPE_IPV6, &build::ipv6(s6, d6, PROTO_TCP, &seg6))));
    // A VLAN tag, and an IPv4 packet that may be fragmented (DF clear).
    let mut vlan = tcp(c, 40000, [10, 0, 0, 100], 80, TCP_SYN, b"");
    let ethertype = vlan[12..14].to_vec();
    vlan.splice(12..14, [(ETHERTYPE_VLAN >> 8) as u8, ETHERTYPE_VLAN as u8, 0, 5].into_iter().chain(ethertype));
    list.push(("vlan-syn", vlan));
    let mut big = udp(c, 5353, [10, 0, 0, 101], 53, &[7u8; 600]);
    big[14 + 6] &= !0x40;
    let sum = checksum::checksum(&{
        let mut h = big[14..34].to_vec();
        h[10] = 0;
        h[11] = 0;
        h
    });
    big[24..26].copy_from_slice(&sum.to_be_bytes());
    list.push(("udp-may-fragment", big));
    list
}

fn l4_plane() -> Seeds {
    let f = frames();
    let get = |n: &str| f.iter().find(|(name, _)| *name == n).map(|(_, d)| d.clone()).unwrap_or_default();
    let vector = |names: &[&str]| {
        names
            .iter()
            .flat_map(|n| {
                let d = get(n);
                (d.len() as u16).to_be_bytes().into_iter().chain(d)
            })
            .collect::<Vec<u8>>()
    };
    vec![
        ("nat-session", vector(&["nat-syn", "nat-reply", "nat-ack-data", "nat-fin"])),
        ("fnat", vector(&["fnat-udp", "fnat-reply"])),
        ("tunnels", vector(&["dr-syn", "ipip-syn", "gue-udp", "other-host"])),
        ("misc", vector(&["icmp-frag-needed", "arp-request", "ipv6-syn", "vlan-syn", "nat-rst"])),
    ]
}

fn l4_sync() -> Seeds {
    let v4 = |a: [u8; 4]| std::net::IpAddr::from(a);
    let records = [
        Record {
            proto: 6,
            state: State::Established,
            ttl: 900,
            client: v4([192, 0, 2, 7]),
            client_port: 40000,
            vip: v4([10, 0, 0, 100]),
            vip_port: 80,
            real: v4([10, 0, 1, 1]),
            real_port: 8001,
            local: None,
        },
        Record {
            proto: 17,
            state: State::Datagram,
            ttl: 30,
            client: v4([192, 0, 2, 8]),
            client_port: 5353,
            vip: v4([10, 0, 0, 101]),
            vip_port: 53,
            real: v4([10, 0, 1, 2]),
            real_port: 8002,
            local: Some((v4([10, 0, 9, 1]), 1025)),
        },
    ];
    let mut tx = Sender::new(Key::new(&[0x5a; 32]), 1, 1_800_000_000_000_000_000);
    let mut out = Vec::new();
    let seal = |tx: &mut Sender, kind, recs: &[Record], out: &mut Vec<u8>| {
        tx.seal(kind, recs, out);
        with(&[1], &out[..out.len() - 16])
    };
    vec![
        ("sessions", seal(&mut tx, Kind::Sessions, &records, &mut out)),
        ("hello", seal(&mut tx, Kind::Hello, &[], &mut out)),
        ("one", seal(&mut tx, Kind::Sessions, &records[1..], &mut out)),
    ]
}

fn config() -> Seeds {
    vec![
        ("example", include_bytes!("../../examples/gatehouse.yaml").to_vec()),
        (
            "flow-styles",
            br#"workers: 2
admin: { address: 127.0.0.1:9180, allow: [10.0.0.0/8, "::1/128"] }
listeners:
  - { name: web, address: "[::1]:8080" }
upstreams:
  - name: u
    endpoints: [127.0.0.1:9001, { address: 127.0.0.1:9002, weight: 3 }]
    health_check: { interval: 500ms, timeout: -1 }
routes:
  - name: hello
    match: { path_prefix: /, headers: [{ name: x-a, value: "yes: really # not a comment" }] }
    direct_response: { status: 200, headers: { content-type: text/plain }, body: "line one\nline \"two\"\t\u00e9" }
"#
            .to_vec(),
        ),
        (
            "wireguard",
            br#"listeners: []
wireguard:
  interfaces:
    - name: wg0
      private_key: "e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a"
      listen_port: 51820
      peers:
        - name: site-b
          public_key: "b85996fecc9c7f1fc6d2572a76eda11d59bcd20be8e543b15ce4bd85481e7a58"
          allowed_ips: [10.1.0.0/16]
"#
            .to_vec(),
        ),
    ]
}

fn admin_json() -> Seeds {
    vec![
        ("route", with(&[0], br#"{"match":{"path_prefix":"/api"},"direct_response":{"status":200,"body":"ok"}}"#)),
        ("upstream", with(&[1], br#"{"endpoints":["127.0.0.1:9001",{"address":"127.0.0.1:9002","weight":3}]}"#)),
        ("certificate", with(&[2], br#"{"self_signed":true,"sni":["a.test","*.b.test"]}"#)),
        ("patch-route", with(&[4], br#"{"direct_response":{"status":201,"body":null}}"#)),
    ]
}

/// Steps of the `wg_router` target (see its module): a byte of choices,
/// then a vector.
fn wg_router() -> Seeds {
    // A LAN packet: its kind (1 IPv4, 2 IPv6, 3 IPv4 to no peer; +4 DF),
    // payload length and TTL.
    let packet = |kind: u8, len: u16, ttl: u8| [&[kind][..], &len.to_be_bytes(), &[ttl]].concat();
    let vector = |choices: u8, frames: &[Vec<u8>]| [vec![choices, frames.len() as u8 - 1], frames.concat()].concat();
    // Frame `i` of what the other site sealed, as it was.
    let wire = |i: u8| vec![0, i];
    vec![
        (
            "both-ways",
            [
                vector(0, &[packet(5, 100, 64), packet(2, 200, 64), packet(1, 1460, 64)]),
                vector(2, &[wire(0), wire(1), wire(2), wire(3)]),
                vector(1, &[packet(5, 64, 64), packet(2, 1300, 9)]),
                vector(3, &[wire(0), wire(1)]),
            ]
            .concat(),
        ),
        (
            "replayed-and-changed",
            [
                vector(0, &[packet(5, 64, 64), packet(6, 64, 64)]),
                // The same frame twice; one bit of its ciphertext, then of
                // its counter, flipped with the checksums made right.
                vector(2, &[wire(0), wire(0), vec![0x12, 0, 0, 60, 1], vec![0x12, 1, 0, 50, 0x80], wire(1)]),
            ]
            .concat(),
        ),
        (
            "errors-and-kernel",
            [
                // For the kernel's socket; TTL 1; no peer; a raw ARP frame.
                vector(
                    4,
                    &[packet(5, 50, 64), packet(5, 50, 1), packet(7, 50, 64), {
                        let arp = build::eth(
                            ETHERTYPE_ARP,
                            &[0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 9, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2],
                        );
                        [&[0][..], &(arp.len() as u16).to_be_bytes(), &arp].concat()
                    }],
                ),
                // Too big with DF; the sealed frame's outer TTL at B.
                vector(0, &[packet(5, 1450, 64), packet(5, 20, 2)]),
                vector(2, &[wire(0)]),
            ]
            .concat(),
        ),
        (
            "clock",
            [
                vector(0x30, &[packet(5, 10, 64)]),
                vector(0x32, &[wire(0)]),
                vector(0x21, &[packet(6, 10, 64)]),
                vector(0x13, &[wire(0)]),
            ]
            .concat(),
        ),
    ]
}

fn all() -> Vec<(&'static str, Seeds)> {
    let packets = frames();
    vec![
        ("h1_request", h1_request()),
        ("h1_chunked", h1_chunked()),
        ("h1_response", h1_response()),
        ("h2_hpack", h2_hpack()),
        ("h2_frames", h2_frames()),
        ("h2_conn", h2_conn()),
        ("h3_quic", h3_quic()),
        ("wg_message", wg_datagrams()),
        ("wg_device", wg_device()),
        ("wg_cookie", wg_cookie()),
        ("wg_uapi", wg_uapi()),
        ("wg_router", wg_router()),
        ("packet", packets),
        ("l4_plane", l4_plane()),
        ("l4_sync", l4_sync()),
        ("config", config()),
        ("admin_json", admin_json()),
    ]
}

#[test]
fn the_corpus_holds_the_seeds() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let write = std::env::var_os("GATEHOUSE_WRITE_CORPUS").is_some();
    for (target, seeds) in all() {
        let dir = root.join(target);
        for (name, data) in seeds {
            assert!(!data.is_empty(), "seed {target}/{name} was not made");
            let path = dir.join(format!("seed-{name}.bin"));
            if write {
                let _ = std::fs::create_dir_all(&dir);
                let _ = std::fs::write(&path, &data);
            }
            let stored = std::fs::read(&path).unwrap_or_default();
            assert!(stored == data, "{} differs from its seed (GATEHOUSE_WRITE_CORPUS=1 rewrites it)", path.display());
        }
    }
}
