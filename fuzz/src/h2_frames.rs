//! The HTTP/2 server connection's frame decoder (`h2::conn`), fed raw
//! bytes. Input: a byte saying how many split points follow, those bytes,
//! then what the client sends after the preface (which the target sends
//! first, so that every input reaches the frame layer).
//!
//! Properties: the connection does the same (the same events, the same
//! bytes out) however the client's bytes are split into reads; what it
//! sends is whole frames, each within the largest frame size.

use std::time::Duration;

use bytes::BytesMut;
use gatehouse_l7::h2::conn::{Connection, Event, Limits};
use gatehouse_l7::h2::frame::{self, Head};

use crate::input::{Input, splits};

/// The limits the server's defaults give, with small windows so that the
/// fuzzer reaches flow control.
pub fn limits() -> Limits {
    Limits {
        max_concurrent: 8,
        max_header_list: 16 * 1024,
        max_fields: 100,
        stream_window: 65_535,
        conn_window: 1 << 20,
        stall_timeout: Duration::from_secs(5),
    }
}

/// A frame the server sent.
#[derive(Debug, Clone)]
pub struct Out {
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
    pub payload: Vec<u8>,
}

/// The server's output as frames; it must be whole frames, each no larger
/// than `max_frame`.
pub fn frames(out: &[u8], max_frame: usize) -> Vec<Out> {
    let mut at = 0;
    let mut list = Vec::new();
    while at < out.len() {
        let head = Head::parse(&out[at..]).expect("the server sent part of a frame header");
        assert!(head.len <= max_frame, "a frame of {} bytes, over {max_frame}", head.len);
        let body = at + frame::HEADER_LEN;
        let end = body + head.len;
        assert!(end <= out.len(), "the server sent part of a frame");
        list.push(Out { kind: head.kind, flags: head.flags, stream: head.stream, payload: out[body..end].to_vec() });
        at = end;
    }
    list
}

/// Runs the client's bytes through a connection in the given reads;
/// returns the events and the bytes sent.
fn drive(client: &[u8], cuts: &[usize]) -> (Vec<String>, Vec<u8>) {
    let mut conn = Connection::new(limits());
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    let mut from = 0;
    for &to in cuts {
        buf.extend_from_slice(&client[from..to]);
        from = to;
        conn.receive(&mut buf);
        while let Some(e) = conn.poll_event() {
            events.push(describe(&e));
        }
    }
    (events, std::mem::take(conn.output()))
}

/// An event as text (requests compare by method, target and fields).
pub fn describe(e: &Event) -> String {
    match e {
        Event::Request { slot, request, end, content_length } => format!(
            "request {slot} {} {} {:?} end={end} len={content_length:?}",
            request.method(),
            request.uri(),
            request.headers()
        ),
        other => format!("{other:?}"),
    }
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let n = usize::from(input.byte() % 16);
    let choices = input.take(n);
    let mut client = frame::PREFACE.to_vec();
    client.extend_from_slice(input.rest());
    let whole = drive(&client, &[client.len()]);
    let split = drive(&client, &splits(choices, client.len()));
    assert_eq!(whole.0, split.0, "events differ with the bytes split into reads");
    assert_eq!(whole.1, split.1, "output differs with the bytes split into reads");
    frames(&whole.1, frame::DEFAULT_MAX_FRAME);
}
