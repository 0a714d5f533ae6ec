//! The connection's rules, driven frame by frame as a client would send
//! them, with the frames it answers read back.

use super::*;
use crate::h2::hpack::Encoder;

fn limits() -> Limits {
    Limits {
        max_concurrent: 4,
        max_header_list: 16 * 1024,
        max_fields: 100,
        stream_window: 65_535,
        conn_window: 1 << 20,
        stall_timeout: Duration::from_secs(5),
    }
}

const GET: [(&str, &str); 4] = [(":method", "GET"), (":scheme", "https"), (":path", "/a"), (":authority", "a.test")];
const POST: [(&str, &str); 4] = [(":method", "POST"), (":scheme", "https"), (":path", "/up"), (":authority", "a.test")];

/// A frame the server sent.
#[derive(Debug)]
struct Out {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Out {
    /// The error code of RST_STREAM or GOAWAY.
    fn code(&self) -> u32 {
        let at = if self.kind == frame::GOAWAY { 4 } else { 0 };
        u32::from_be_bytes(self.payload[at..at + 4].try_into().expect("4 bytes"))
    }
}

/// A client talking to a [`Connection`].
struct Client {
    conn: Connection,
    input: BytesMut,
    encoder: Encoder,
}

impl Client {
    /// A client past the preface and SETTINGS exchange.
    fn new(limits: Limits) -> Self {
        let mut c = Client { conn: Connection::new(limits), input: BytesMut::new(), encoder: Encoder::default() };
        let mut hello = frame::PREFACE.to_vec();
        frame::put_settings(&mut hello, &[]);
        c.send(&hello);
        let out = c.frames();
        assert_eq!(out[0].kind, frame::SETTINGS, "the server speaks first with SETTINGS");
        assert!(out.iter().any(|f| f.kind == frame::SETTINGS && f.flags == frame::ACK));
        c
    }

    fn send(&mut self, bytes: &[u8]) {
        self.input.extend_from_slice(bytes);
        self.conn.receive(&mut self.input);
    }

    fn send_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let mut f = Vec::new();
        frame::put_head(&mut f, payload.len(), kind, flags, stream);
        f.extend_from_slice(payload);
        self.send(&f);
    }

    fn block(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        let mut block = Vec::new();
        self.encoder.begin_block(&mut block);
        for (n, v) in fields {
            self.encoder.field(&mut block, n, v.as_bytes());
        }
        block
    }

    fn headers(&mut self, stream: u32, fields: &[(&str, &str)], end: bool) {
        let block = self.block(fields);
        let flags = frame::END_HEADERS | if end { frame::END_STREAM } else { 0 };
        self.send_frame(frame::HEADERS, flags, stream, &block);
    }

    fn data(&mut self, stream: u32, data: &[u8], end: bool) {
        self.send_frame(frame::DATA, if end { frame::END_STREAM } else { 0 }, stream, data);
    }

    /// `n` bytes of body in frames of the default size.
    fn data_chunks(&mut self, stream: u32, n: usize) {
        let chunk = vec![1u8; frame::DEFAULT_MAX_FRAME];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len());
            self.data(stream, &chunk[..k], false);
            left -= k;
        }
    }

    fn rst(&mut self, stream: u32) {
        self.send_frame(frame::RST_STREAM, 0, stream, &(Reason::Cancel as u32).to_be_bytes());
    }

    fn window_update(&mut self, stream: u32, inc: u32) {
        self.send_frame(frame::WINDOW_UPDATE, 0, stream, &inc.to_be_bytes());
    }

    /// The frames the server queued since the last look.
    fn frames(&mut self) -> Vec<Out> {
        let out = std::mem::take(self.conn.output());
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some(h) = Head::parse(&out[at..]) {
            let payload = out[at + frame::HEADER_LEN..at + frame::HEADER_LEN + h.len].to_vec();
            frames.push(Out { kind: h.kind, flags: h.flags, stream: h.stream, payload });
            at += frame::HEADER_LEN + h.len;
        }
        assert_eq!(at, out.len(), "whole frames only");
        frames
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.conn.poll_event()).collect()
    }

    /// The GOAWAY the server sent, if any.
    fn goaway(&mut self) -> Option<u32> {
        self.frames().iter().find(|f| f.kind == frame::GOAWAY).map(Out::code)
    }

    /// The slot of the request that just opened.
    fn opened(&mut self) -> usize {
        let events = self.events();
        match events.as_slice() {
            [Event::Request { slot, .. }] => *slot,
            other => panic!("expected one request, got {other:?}"),
        }
    }
}

fn rst_codes(frames: &[Out]) -> Vec<(u32, u32)> {
    frames.iter().filter(|f| f.kind == frame::RST_STREAM).map(|f| (f.stream, f.code())).collect()
}

const PROTOCOL: u32 = Reason::Protocol as u32;
const FLOW_CONTROL: u32 = Reason::FlowControl as u32;
const CALM: u32 = Reason::EnhanceYourCalm as u32;

#[test]
fn the_server_speaks_first_and_wants_the_preface_then_settings() {
    let mut conn = Connection::new(limits());
    let mut out = std::mem::take(conn.output());
    let head = Head::parse(&out).expect("a frame");
    assert_eq!((head.kind, head.stream), (frame::SETTINGS, 0));
    out.drain(..frame::HEADER_LEN + head.len);
    let update = Head::parse(&out).expect("the connection window's update");
    assert_eq!(update.kind, frame::WINDOW_UPDATE);

    // A preface that goes wrong: GOAWAY PROTOCOL_ERROR, nothing more read.
    let mut input = BytesMut::from(&b"PRI * HTTP/2.0\r\n\r\nXX"[..]);
    conn.receive(&mut input);
    assert!(conn.read_done());
    let out = conn.output();
    let goaway = Head::parse(out).expect("goaway");
    assert_eq!(goaway.kind, frame::GOAWAY);
    assert_eq!(out[frame::HEADER_LEN + 7], PROTOCOL as u8);

    // The preface, then something other than SETTINGS.
    let mut conn = Connection::new(limits());
    conn.output().clear();
    let mut input = BytesMut::from(frame::PREFACE);
    input.extend_from_slice(&[0, 0, 8, frame::PING, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
    conn.receive(&mut input);
    assert!(conn.read_done() && conn.finished());

    // The preface may come a byte at a time.
    let mut conn = Connection::new(limits());
    let mut input = BytesMut::new();
    for &b in frame::PREFACE {
        input.extend_from_slice(&[b]);
        conn.receive(&mut input);
        assert!(!conn.read_done());
    }
    assert!(!conn.awaiting_preface());
}

#[test]
fn ping_and_settings_are_acknowledged_and_bad_ones_end_the_connection() {
    let mut c = Client::new(limits());
    c.send_frame(frame::PING, 0, 0, b"12345678");
    let f = c.frames();
    assert_eq!((f[0].kind, f[0].flags, f[0].payload.as_slice()), (frame::PING, frame::ACK, &b"12345678"[..]));
    c.send_frame(frame::PING, frame::ACK, 0, b"12345678");
    assert!(c.frames().is_empty(), "an ACK is not answered");

    let cases: [(u8, u8, u32, &[u8], Reason); 7] = [
        (frame::PING, 0, 1, b"12345678", Reason::Protocol),
        (frame::PING, 0, 0, b"1234", Reason::FrameSize),
        (frame::SETTINGS, 0, 0, &[0, 4, 0x80, 0, 0, 0], Reason::FlowControl),
        (frame::SETTINGS, 0, 0, &[0, 5, 0, 0, 0x10, 0], Reason::Protocol),
        (frame::SETTINGS, 0, 0, &[0, 2, 0, 0, 0, 2], Reason::Protocol),
        (frame::SETTINGS, 0, 0, &[0, 4, 0], Reason::FrameSize),
        (frame::PUSH_PROMISE, frame::END_HEADERS, 1, &[0, 0, 0, 2], Reason::Protocol),
    ];
    for (kind, flags, stream, payload, why) in cases {
        let mut c = Client::new(limits());
        c.send_frame(kind, flags, stream, payload);
        assert_eq!(c.goaway(), Some(why as u32), "frame {kind} {payload:?}");
        assert!(c.conn.read_done());
    }
    // Unknown frame types are ignored.
    let mut c = Client::new(limits());
    c.send_frame(0xfa, 0, 0, b"whatever");
    assert!(c.frames().is_empty() && !c.conn.read_done());
}

#[test]
fn a_request_and_its_body_come_out_as_events_and_the_response_goes_back() {
    let mut c = Client::new(limits());
    c.headers(1, &[POST[0], POST[1], POST[2], POST[3], ("content-length", "5")], false);
    let events = c.events();
    let [Event::Request { slot, request, end: false, content_length: Some(5) }] = events.as_slice() else {
        panic!("{events:?}")
    };
    let slot = *slot;
    assert_eq!(request.method(), Method::POST);
    assert_eq!(request.uri().path(), "/up");
    c.data(1, b"hel", false);
    c.data(1, b"lo", true);
    let events = c.events();
    assert!(matches!(&events[0], Event::Data { slot: s, data } if *s == slot && data == "hel"));
    assert!(matches!(&events[1], Event::Data { data, .. } if data == "lo"));
    assert!(matches!(&events[2], Event::End { trailers: None, .. }));
    assert_eq!(events.len(), 3, "{events:?}");

    let mut headers = HeaderMap::new();
    headers.insert("x-a", "1".parse().expect("value"));
    headers.insert("connection", "close".parse().expect("value"));
    c.conn.send_response(slot, StatusCode::OK, &headers, false);
    c.conn.queue_data(slot, Bytes::from_static(b"answer"), true);
    assert!(c.conn.has_pending(slot));
    assert_eq!(c.conn.send_pending(slot), Sent::Ended);
    c.conn.maybe_close(slot);
    assert!(matches!(c.events().as_slice(), [Event::Closed { .. }]));
    assert_eq!(c.conn.open_streams(), 0);
    let f = c.frames();
    assert_eq!((f[0].kind, f[0].stream, f[0].flags), (frame::HEADERS, 1, frame::END_HEADERS));
    let mut fields = Vec::new();
    Decoder::default()
        .decode(&f[0].payload, |n, v| fields.push((n.to_vec(), v.to_vec())))
        .expect("the response head decodes");
    assert_eq!(fields[0], (b":status".to_vec(), b"200".to_vec()));
    assert!(fields.iter().any(|(n, _)| n == b"x-a"));
    assert!(!fields.iter().any(|(n, _)| n == b"connection"), "no connection-specific fields in HTTP/2");
    assert_eq!((f[1].kind, f[1].flags, f[1].payload.as_slice()), (frame::DATA, frame::END_STREAM, &b"answer"[..]));
}

#[test]
fn trailers_end_the_request_body() {
    let mut c = Client::new(limits());
    c.headers(1, &POST, false);
    c.opened();
    c.data(1, b"x", false);
    c.headers(1, &[("grpc-status", "0")], true);
    let events = c.events();
    let Event::End { trailers: Some(t), .. } = &events[1] else { panic!("{events:?}") };
    assert_eq!(t["grpc-status"], "0");
    // Trailers without END_STREAM are malformed.
    c.headers(3, &POST, false);
    c.opened();
    c.headers(3, &[("x", "1")], false);
    assert_eq!(rst_codes(&c.frames()), [(3, PROTOCOL)]);
}

#[test]
fn response_data_waits_for_the_windows_and_an_update_wakes_it() {
    let mut c = Client::new(limits());
    c.headers(1, &GET, true);
    let slot = c.opened();
    c.conn.send_response(slot, StatusCode::OK, &HeaderMap::new(), false);
    c.conn.queue_data(slot, Bytes::from(vec![7u8; 150_000]), true);
    assert_eq!(c.conn.send_pending(slot), Sent::Waiting);
    let sent: usize = c.frames().iter().filter(|f| f.kind == frame::DATA).map(|f| f.payload.len()).sum();
    assert_eq!(sent, 65_535, "the client's initial windows, and not a byte more");
    let now = Instant::now();
    let deadline = c.conn.stall_deadline(|| now, 0, false).expect("a stream waits for a window");
    assert_eq!(deadline, now + Duration::from_secs(5));

    // The stream's window opens; the connection's is still shut.
    c.window_update(1, 40_000);
    assert!(matches!(c.events().as_slice(), [Event::Wake { slot: s }] if *s == slot));
    assert_eq!(c.conn.send_pending(slot), Sent::Waiting);
    assert!(c.frames().is_empty());
    c.window_update(0, 40_000);
    assert!(matches!(c.events().as_slice(), [Event::Wake { slot: s }] if *s == slot));
    assert_eq!(c.conn.send_pending(slot), Sent::Waiting);
    let sent: usize = c.frames().iter().map(|f| f.payload.len()).sum();
    assert_eq!(sent, 40_000, "both windows allow 40,000 bytes");
    // A window opened: the stall timer starts again from now.
    let later = now + Duration::from_secs(1);
    assert_eq!(c.conn.stall_deadline(|| later, 0, false), Some(later + Duration::from_secs(5)));
    // A larger initial window opens every stream's window.
    c.send_frame(frame::SETTINGS, 0, 0, &[0, 4, 0, 0x10, 0, 0]);
    assert!(matches!(c.events().as_slice(), [Event::Wake { .. }]));
    assert_eq!(c.conn.send_pending(slot), Sent::Waiting, "the connection's window is still shut");
    c.window_update(0, 44_465);
    assert_eq!(c.conn.send_pending(slot), Sent::Ended);
    let f = c.frames();
    assert_eq!(f.last().map(|f| (f.kind, f.flags)), Some((frame::DATA, frame::END_STREAM)));
    // Nothing owed: no deadline.
    assert_eq!(c.conn.stall_deadline(|| later, 0, false), None);
}

#[test]
fn a_window_never_passes_2_31_minus_1() {
    let mut c = Client::new(limits());
    c.window_update(0, 0x7fff_ffff);
    assert_eq!(c.goaway(), Some(FLOW_CONTROL));

    let mut c = Client::new(limits());
    c.headers(1, &GET, true);
    c.opened();
    c.window_update(1, 0x7fff_ffff);
    assert_eq!(rst_codes(&c.frames()), [(1, FLOW_CONTROL)]);
    assert!(!c.conn.read_done(), "a stream error only");
    assert!(matches!(c.events().as_slice(), [Event::Closed { .. }]));
    c.headers(3, &GET, true);
    c.opened();
    c.window_update(3, 0);
    assert_eq!(rst_codes(&c.frames()), [(3, PROTOCOL)]);
    c.window_update(0, 0);
    assert_eq!(c.goaway(), Some(PROTOCOL));

    // SETTINGS that push an open stream's window past the limit.
    let mut c = Client::new(limits());
    c.headers(1, &GET, true);
    c.opened();
    c.window_update(1, 0x7fff_0000);
    c.send_frame(frame::SETTINGS, 0, 0, &[0, 4, 0, 0x01, 0, 0]);
    assert_eq!(c.goaway(), Some(FLOW_CONTROL));
}

#[test]
fn data_past_a_window_is_refused() {
    let mut c = Client::new(limits());
    c.headers(1, &POST, false);
    c.opened();
    let chunk = vec![1u8; 16_384];
    for _ in 0..3 {
        c.data(1, &chunk, false);
    }
    c.data(1, &chunk[..16_383], false);
    assert!(c.frames().is_empty(), "65,535 bytes fit the stream's window");
    c.data(1, b"x", false);
    assert_eq!(rst_codes(&c.frames()), [(1, FLOW_CONTROL)]);

    // The connection's window: every stream's data counts.
    let mut c = Client::new(Limits { stream_window: 1 << 20, conn_window: 65_535, ..limits() });
    c.headers(1, &POST, false);
    c.opened();
    for _ in 0..4 {
        c.data(1, &chunk, false);
    }
    assert_eq!(c.goaway(), Some(FLOW_CONTROL));
}

#[test]
fn bytes_taken_reopen_the_windows() {
    let mut c = Client::new(Limits { conn_window: 200_000, ..limits() });
    c.headers(1, &POST, false);
    let slot = c.opened();
    c.data_chunks(1, 40_000);
    c.events();
    c.conn.released(slot, 20_000);
    assert!(c.frames().is_empty(), "under half the stream's window: no update yet");
    c.conn.released(slot, 20_000);
    let f = c.frames();
    assert_eq!(
        (f[0].kind, f[0].stream, f[0].payload.as_slice()),
        (frame::WINDOW_UPDATE, 1, &40_000u32.to_be_bytes()[..])
    );
    c.conn.release_conn_window();
    assert!(c.frames().is_empty(), "under a quarter of the connection's window");
    // A stream reset before its body was taken gives it all back.
    c.data_chunks(1, 65_535);
    c.rst(1);
    c.conn.release_conn_window();
    let f = c.frames();
    assert_eq!(
        (f[0].kind, f[0].stream, f[0].payload.as_slice()),
        (frame::WINDOW_UPDATE, 0, &105_535u32.to_be_bytes()[..])
    );
}

#[test]
fn a_stream_closed_never_comes_back() {
    let mut c = Client::new(limits());
    c.headers(1, &POST, false);
    let slot = c.opened();
    c.rst(1);
    assert!(matches!(c.events().as_slice(), [Event::Closed { slot: s }] if *s == slot));
    c.data(1, b"late", false);
    assert_eq!(rst_codes(&c.frames()), [(1, Reason::StreamClosed as u32)]);
    assert!(c.events().is_empty(), "no data for a closed stream");
    c.headers(1, &POST, true);
    assert_eq!(c.goaway(), Some(Reason::StreamClosed as u32));

    // A stream id below the last one, never opened; an even id; id 0.
    let mut c = Client::new(limits());
    c.headers(5, &GET, true);
    c.opened();
    c.headers(3, &GET, true);
    assert_eq!(c.goaway(), Some(PROTOCOL));
    for id in [2, 0] {
        let mut c = Client::new(limits());
        c.headers(id, &GET, true);
        assert_eq!(c.goaway(), Some(PROTOCOL));
    }
    let mut c = Client::new(limits());
    c.data(1, b"never opened", false);
    assert_eq!(c.goaway(), Some(PROTOCOL));
}

#[test]
fn a_body_must_match_its_content_length() {
    for (body, end) in [(&b"abc"[..], true), (&b"abcdef"[..], false)] {
        let mut c = Client::new(limits());
        c.headers(1, &[POST[0], POST[1], POST[2], POST[3], ("content-length", "5")], false);
        c.opened();
        c.data(1, body, end);
        assert_eq!(rst_codes(&c.frames()), [(1, PROTOCOL)]);
        assert!(matches!(c.events().as_slice(), [Event::Closed { .. }]));
    }
    let mut c = Client::new(limits());
    c.headers(1, &[GET[0], GET[1], GET[2], GET[3], ("content-length", "5")], true);
    assert_eq!(rst_codes(&c.frames()), [(1, PROTOCOL)]);
}

#[test]
fn connect_and_oversized_heads_are_answered_here() {
    let mut c = Client::new(limits());
    c.headers(1, &[(":method", "CONNECT"), (":authority", "a.test:443")], false);
    let events = c.events();
    assert!(matches!(events.as_slice(), [Event::Refused(StatusCode::METHOD_NOT_ALLOWED), Event::Closed { .. }]));
    let f = c.frames();
    assert_eq!((f[0].kind, f[0].flags), (frame::HEADERS, frame::END_HEADERS | frame::END_STREAM));
    assert_eq!(rst_codes(&f), [(1, Reason::NoError as u32)], "the client is told to stop sending");

    let mut c = Client::new(Limits { max_fields: 6, ..limits() });
    let mut fields = GET.to_vec();
    fields.extend([("a", "1"), ("b", "2"), ("c", "3")]);
    c.headers(1, &fields, true);
    let events = c.events();
    assert!(matches!(events[0], Event::Refused(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)), "{events:?}");
    let mut status = Vec::new();
    Decoder::default().decode(&c.frames()[0].payload, |n, v| status.push((n.to_vec(), v.to_vec()))).expect("decodes");
    assert_eq!(status, [(b":status".to_vec(), b"431".to_vec())]);

    // A malformed request is a stream error only.
    let mut c = Client::new(limits());
    c.headers(1, &[(":method", "GET"), (":path", "/")], true);
    assert_eq!(rst_codes(&c.frames()), [(1, PROTOCOL)]);
    assert!(!c.conn.read_done());
    // A block that does not decode is a connection error.
    let mut c = Client::new(limits());
    c.send_frame(frame::HEADERS, frame::END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    assert_eq!(c.goaway(), Some(Reason::Compression as u32));
}

#[test]
fn streams_past_the_concurrency_limit_are_refused() {
    let mut c = Client::new(limits());
    for id in [1, 3, 5, 7] {
        c.headers(id, &GET, true);
        c.opened();
    }
    c.headers(9, &GET, true);
    assert!(c.events().is_empty());
    assert_eq!(rst_codes(&c.frames()), [(9, Reason::RefusedStream as u32)]);
    assert_eq!(c.conn.open_streams(), 4);
    assert_eq!(c.conn.streams.slots(), 4, "no slot past the limit");
}

#[test]
fn rapid_reset_runs_out_of_budget() {
    let mut c = Client::new(limits());
    let mut id = 1;
    while !c.conn.read_done() {
        c.headers(id, &GET, true);
        c.rst(id);
        c.frames();
        assert!(id < 2 * (RESET_BUDGET as u32 + 2), "the budget never ran out");
        id += 2;
    }
    assert_eq!((id - 1) / 2, RESET_BUDGET as u32, "each reset of an unfinished stream costs one");
    assert_eq!(c.conn.open_streams(), 0);

    // Finished responses refill it: a client that resets only now and
    // then is served for ever.
    let mut c = Client::new(limits());
    for n in 0..1000u32 {
        let id = 2 * n + 1;
        c.headers(id, &GET, true);
        let slot = c.opened();
        if n % 2 == 0 {
            c.rst(id);
        } else {
            c.conn.send_response(slot, StatusCode::NO_CONTENT, &HeaderMap::new(), true);
            c.conn.maybe_close(slot);
        }
        c.events();
        c.frames();
        assert!(!c.conn.read_done(), "stream {id}");
    }
}

#[test]
fn empty_frame_floods_run_out_of_budget() {
    let mut c = Client::new(limits());
    c.headers(1, &POST, false);
    c.opened();
    for _ in 0..RESET_BUDGET {
        c.data(1, b"", false);
    }
    assert_eq!(c.goaway(), Some(CALM));

    let mut c = Client::new(limits());
    let block = c.block(&GET);
    c.send_frame(frame::HEADERS, 0, 1, &block);
    for _ in 0..RESET_BUDGET {
        c.send_frame(frame::CONTINUATION, 0, 1, b"");
    }
    assert_eq!(c.goaway(), Some(CALM));
}

#[test]
fn a_header_block_is_bounded_while_it_is_gathered() {
    let mut c = Client::new(limits());
    c.send_frame(frame::HEADERS, 0, 1, &[0x82]);
    let junk = vec![0u8; 4096];
    let mut sent = 0;
    while !c.conn.read_done() {
        c.send_frame(frame::CONTINUATION, 0, 1, &junk);
        sent += junk.len();
        assert!(sent <= limits().max_header_list + 1024 + junk.len(), "the block grew past its bound");
    }
    assert_eq!(c.goaway(), Some(CALM));
    assert!(c.conn.block.as_ref().is_none_or(|b| b.bytes.len() <= limits().max_header_list + 1024));

    // Nothing may come between a block's frames.
    let mut c = Client::new(limits());
    c.send_frame(frame::HEADERS, 0, 1, &[0x82]);
    c.send_frame(frame::PING, 0, 0, b"12345678");
    assert_eq!(c.goaway(), Some(PROTOCOL));
    let mut c = Client::new(limits());
    c.send_frame(frame::HEADERS, 0, 1, &[0x82]);
    c.send_frame(frame::CONTINUATION, frame::END_HEADERS, 3, &[0x84]);
    assert_eq!(c.goaway(), Some(PROTOCOL));
    let mut c = Client::new(limits());
    c.send_frame(frame::CONTINUATION, frame::END_HEADERS, 1, &[0x84]);
    assert_eq!(c.goaway(), Some(PROTOCOL));
}

#[test]
fn a_block_split_over_continuations_opens_its_stream() {
    let mut c = Client::new(limits());
    let block = c.block(&GET);
    let (a, b) = block.split_at(block.len() / 2);
    c.send_frame(frame::HEADERS, frame::END_STREAM, 1, a);
    assert!(c.events().is_empty());
    c.send_frame(frame::CONTINUATION, frame::END_HEADERS, 1, b);
    c.opened();
}

#[test]
fn frames_past_the_default_size_end_the_connection() {
    let mut c = Client::new(limits());
    let mut f = Vec::new();
    frame::put_head(&mut f, frame::DEFAULT_MAX_FRAME + 1, frame::DATA, 0, 1);
    c.send(&f);
    assert_eq!(c.goaway(), Some(Reason::FrameSize as u32));
}

#[test]
fn goaway_refuses_new_streams_and_lets_open_ones_finish() {
    let mut c = Client::new(limits());
    c.headers(1, &GET, true);
    let slot = c.opened();
    c.conn.go_away(Reason::NoError);
    let f = c.frames();
    assert_eq!((f[0].kind, f[0].code(), &f[0].payload[..4]), (frame::GOAWAY, 0, &1u32.to_be_bytes()[..]));
    assert!(!c.conn.finished(), "stream 1 is still open");
    c.headers(3, &GET, true);
    assert!(c.events().is_empty());
    assert_eq!(rst_codes(&c.frames()), [(3, Reason::RefusedStream as u32)]);
    c.conn.send_response(slot, StatusCode::OK, &HeaderMap::new(), true);
    c.conn.maybe_close(slot);
    assert!(c.conn.finished());

    // The client's GOAWAY: the connection ends once its streams do.
    let mut c = Client::new(limits());
    c.send_frame(frame::GOAWAY, 0, 0, &[0, 0, 0, 0, 0, 0, 0, 0]);
    assert!(c.conn.finished());
}

#[test]
fn a_client_gone_closes_every_stream() {
    let mut c = Client::new(limits());
    for id in [1, 3] {
        c.headers(id, &POST, false);
        c.opened();
    }
    c.conn.peer_gone();
    let closed = c.events().iter().filter(|e| matches!(e, Event::Closed { .. })).count();
    assert_eq!(closed, 2);
    assert!(c.conn.finished());
    c.headers(5, &GET, true);
    assert!(c.events().is_empty(), "nothing is read once the client is gone");
}

#[test]
fn the_stall_deadline_moves_only_when_the_client_does() {
    let mut conn = Connection::new(limits());
    let t0 = Instant::now();
    let timeout = Duration::from_secs(5);
    assert_eq!(conn.stall_deadline(|| t0, 0, false), None, "nothing owed");
    assert_eq!(conn.stall_deadline(|| t0, 100, false), Some(t0 + timeout));
    let t1 = t0 + Duration::from_secs(2);
    assert_eq!(conn.stall_deadline(|| t1, 100, false), Some(t0 + timeout), "no progress: the deadline stays");
    assert_eq!(conn.stall_deadline(|| t1, 50, true), Some(t1 + timeout), "bytes went out");
    assert_eq!(conn.stall_deadline(|| t1, 0, false), None);
}
