//! The HTTP/2 server connection's state machine (`h2::conn`), driven by
//! sequences of frames and of what its driver does. Input: records; each
//! starts with an operation byte:
//!
//! - 0–4: a frame: type, flags, stream number (one byte), then a payload
//!   (a length byte and that many bytes). A HEADERS frame with the unused
//!   flag 0x40 carries instead a well-formed request block, picked by its
//!   payload's first byte, so the fuzzer reaches streams with requests.
//! - 5: the driver answers the oldest open request with a body.
//! - 6: the driver takes the request data received, so windows reopen.
//! - 7: the driver resets a stream, sends GOAWAY, or sends what windows
//!   allow.
//!
//! Invariants, checked from the frames the server sends as a client sees
//! them: no window the server opens goes beyond what it advertised (the
//! connection's and each stream's; so never beyond 2^31-1); a stream the
//! server closed (END_STREAM or RST_STREAM) never sees another HEADERS or
//! DATA; the server sends on no stream the client did not open; GOAWAY's
//! last stream never grows; open streams stay within the limit; what one
//! step sends is bounded.

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::{Bytes, BytesMut};
use gatehouse_l7::h2::conn::{Connection, Event};
use gatehouse_l7::h2::frame::{self, Reason};
use gatehouse_l7::h2::hpack::Encoder;
use http::{HeaderMap, StatusCode};

use crate::h2_frames::{frames, limits};
use crate::input::Input;

/// Requests the fuzzer can send whole: the shapes clients send, and some
/// the server must refuse.
const REQUESTS: [&[(&str, &str)]; 6] = [
    &[(":method", "GET"), (":scheme", "https"), (":path", "/a"), (":authority", "a.test")],
    &[(":method", "POST"), (":scheme", "https"), (":path", "/up"), (":authority", "a.test")],
    &[(":method", "POST"), (":scheme", "https"), (":path", "/n"), (":authority", "a"), ("content-length", "5")],
    &[("te", "trailers"), ("x-trailer", "1")],
    &[(":method", "CONNECT"), (":authority", "a.test:443")],
    &[(":method", "GET"), (":path", "/"), (":scheme", "https"), ("connection", "close")],
];

/// The client's view of the flow-control windows the server opened.
#[derive(Default)]
struct Client {
    conn_sent: i64,
    conn_opened: i64,
    stream_sent: HashMap<u32, i64>,
    stream_opened: HashMap<u32, i64>,
    opened_by_client: HashSet<u32>,
    closed_by_server: HashSet<u32>,
    last_goaway: Option<u32>,
    /// The largest frame the client allowed in any SETTINGS it sent.
    max_frame: usize,
}

impl Client {
    fn sent(&mut self, kind: u8, stream: u32, payload: &[u8]) {
        let len = payload.len();
        if kind == frame::SETTINGS && stream == 0 {
            for s in payload.chunks_exact(6) {
                let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]) as usize;
                if u16::from_be_bytes([s[0], s[1]]) == frame::SETTINGS_MAX_FRAME_SIZE && value < 1 << 24 {
                    self.max_frame = self.max_frame.max(value);
                }
            }
        }
        if kind == frame::DATA {
            self.conn_sent += len as i64;
            *self.stream_sent.entry(stream).or_default() += len as i64;
        }
        if kind == frame::HEADERS && stream != 0 {
            self.opened_by_client.insert(stream);
        }
    }

    fn check(&mut self, out: &[u8]) {
        let lim = limits();
        for f in frames(out, self.max_frame.max(frame::DEFAULT_MAX_FRAME)) {
            match f.kind {
                frame::WINDOW_UPDATE => {
                    let inc =
                        i64::from(u32::from_be_bytes(f.payload[..4].try_into().unwrap_or_default()) & 0x7fff_ffff);
                    if f.stream == 0 {
                        self.conn_opened += inc;
                    } else {
                        *self.stream_opened.entry(f.stream).or_default() += inc;
                    }
                }
                frame::HEADERS | frame::DATA => {
                    assert!(!self.closed_by_server.contains(&f.stream), "stream {} came back", f.stream);
                    assert!(self.opened_by_client.contains(&f.stream), "stream {} was never opened", f.stream);
                    if f.flags & frame::END_STREAM != 0 {
                        self.closed_by_server.insert(f.stream);
                    }
                }
                frame::RST_STREAM => {
                    self.closed_by_server.insert(f.stream);
                }
                frame::GOAWAY => {
                    let last = u32::from_be_bytes(f.payload[..4].try_into().unwrap_or_default());
                    assert!(self.last_goaway.is_none_or(|l| last <= l), "GOAWAY's last stream grew");
                    self.last_goaway = Some(last);
                }
                _ => {}
            }
        }
        let conn = frame::DEFAULT_WINDOW + self.conn_opened - self.conn_sent;
        assert!(conn <= i64::from(lim.conn_window), "the connection window grew to {conn}");
        for (id, opened) in &self.stream_opened {
            let w = i64::from(lim.stream_window) + opened - self.stream_sent.get(id).copied().unwrap_or(0);
            assert!(w <= i64::from(lim.stream_window), "stream {id}'s window grew to {w}");
        }
    }
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let lim = limits();
    let mut conn = Connection::new(lim);
    let mut client = Client::default();
    let mut encoder = Encoder::default();
    let mut buf = BytesMut::new();
    let mut hello = frame::PREFACE.to_vec();
    frame::put_settings(&mut hello, &[]);
    buf.extend_from_slice(&hello);
    conn.receive(&mut buf);
    let mut open: VecDeque<usize> = VecDeque::new();
    let mut taken: HashMap<usize, usize> = HashMap::new();
    while !input.is_empty() {
        let op = input.byte() % 8;
        match op {
            0..=4 => {
                let (kind, mut flags, stream) = (input.byte() % 10, input.byte(), u32::from(input.byte()));
                let mut payload = input.piece().to_vec();
                if kind == frame::HEADERS && flags & 0x40 != 0 {
                    let fields = REQUESTS[usize::from(payload.first().copied().unwrap_or(0)) % REQUESTS.len()];
                    payload.clear();
                    encoder.begin_block(&mut payload);
                    for (n, v) in fields {
                        encoder.field(&mut payload, n, v.as_bytes());
                    }
                    flags &= !(frame::PADDED | frame::PRIORITY_FLAG);
                }
                let mut f = Vec::new();
                frame::put_head(&mut f, payload.len(), kind, flags, stream);
                f.extend_from_slice(&payload);
                client.sent(kind, stream, &payload);
                buf.extend_from_slice(&f);
                conn.receive(&mut buf);
            }
            5 => {
                if let Some(slot) = open.pop_front() {
                    let body = Bytes::from(vec![b'x'; usize::from(input.byte()) * 512]);
                    conn.send_response(slot, StatusCode::OK, &HeaderMap::new(), false);
                    conn.queue_data(slot, body, true);
                    conn.send_pending(slot);
                    conn.maybe_close(slot);
                }
            }
            6 => {
                for (slot, n) in taken.drain() {
                    conn.released(slot, n);
                }
                conn.release_conn_window();
            }
            _ => match input.byte() % 3 {
                0 => {
                    if let Some(slot) = open.pop_back() {
                        conn.reset(slot, Reason::Internal);
                    }
                }
                1 => conn.go_away(Reason::NoError),
                _ => {
                    for &slot in &open {
                        conn.send_pending(slot);
                    }
                }
            },
        }
        while let Some(e) = conn.poll_event() {
            match e {
                Event::Request { slot, .. } => open.push_back(slot),
                Event::Data { slot, data } => *taken.entry(slot).or_default() += data.len(),
                Event::Closed { slot } => {
                    open.retain(|&s| s != slot);
                    taken.remove(&slot);
                }
                Event::Wake { slot } => {
                    conn.send_pending(slot);
                }
                Event::End { .. } | Event::Refused(_) => {}
            }
        }
        assert!(conn.open_streams() <= lim.max_concurrent, "{} streams open", conn.open_streams());
        let out = std::mem::take(conn.output());
        assert!(out.len() <= 1 << 20, "one step sent {} bytes", out.len());
        client.check(&out);
    }
}
