//! HTTP/3's frames on a client's request or control stream and QPACK
//! field sections (`h3::frame`, `h3::stream`, `h3::qpack`). Input: a byte
//! of choices (bit 0: the control stream, else a request stream), a byte
//! saying how many split points follow, those bytes, then the stream's
//! bytes.
//!
//! Properties: the stream reads the same (the same heads, trailers, body
//! bytes, settings and verdict) however its bytes are split into reads; a
//! field section that decodes, encoded again by Gatehouse's encoder,
//! decodes to the same fields; no frame is gathered past its limit.

use gatehouse_l7::h3::qpack;
use gatehouse_l7::h3::stream::{ControlReader, Request, RequestReader};

use crate::input::{Input, splits};

/// The largest head the target reads whole (the server's limit is larger;
/// this one lets the fuzzer reach it).
const MAX_HEAD: usize = 512;

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let choices = input.byte();
    let n = usize::from(input.byte());
    let cuts = input.take(n).to_vec();
    let stream = input.rest();
    let pieces = splits(&cuts, stream.len());
    let whole = [stream.len()];
    if choices & 1 == 1 {
        assert_eq!(control(stream, &pieces), control(stream, &whole), "the control stream read differently in pieces");
        return;
    }
    let (items, verdict) = request(stream, &pieces);
    assert_eq!(
        (&items, &verdict),
        (&request(stream, &whole).0, &request(stream, &whole).1),
        "a request read differently in pieces"
    );
    for item in &items {
        if let Item::Head(block) | Item::Trailers(block) = item {
            assert!(block.len() <= MAX_HEAD, "a head of {} bytes gathered past the limit", block.len());
            round_trip(block);
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Item {
    Head(Vec<u8>),
    Trailers(Vec<u8>),
    Data(Vec<u8>),
    End,
}

/// What a request stream gives, read in the pieces ending at `cuts`; the
/// body's pieces joined.
fn request(stream: &[u8], cuts: &[usize]) -> (Vec<Item>, Result<(), u64>) {
    let mut r = RequestReader::default();
    let mut items: Vec<Item> = Vec::new();
    let mut from = 0;
    for &to in cuts {
        let mut piece = &stream[from..to];
        from = to;
        loop {
            match r.next(&mut piece, MAX_HEAD) {
                Ok(None) => break,
                Ok(Some(Request::Head(b))) => items.push(Item::Head(b.into_owned())),
                Ok(Some(Request::Trailers(b))) => items.push(Item::Trailers(b.into_owned())),
                Ok(Some(Request::Data(d))) => match items.last_mut() {
                    Some(Item::Data(body)) => body.extend_from_slice(d),
                    _ => items.push(Item::Data(d.to_vec())),
                },
                Err(e) => return (items, Err(e)),
            }
        }
    }
    let end = r.end();
    if end.is_ok() {
        items.push(Item::End);
    }
    (items, end)
}

fn control(stream: &[u8], cuts: &[usize]) -> (Vec<String>, Result<(), u64>) {
    let mut r = ControlReader::default();
    let mut got = Vec::new();
    let mut from = 0;
    for &to in cuts {
        let mut piece = &stream[from..to];
        from = to;
        loop {
            match r.next(&mut piece) {
                Ok(None) => break,
                Ok(Some(c)) => got.push(format!("{c:?}")),
                Err(e) => return (got, Err(e)),
            }
        }
    }
    (got, Ok(()))
}

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn round_trip(block: &[u8]) {
    let (mut names, mut values) = (Vec::new(), Vec::new());
    let mut fields: Fields = Vec::new();
    if qpack::decode(block, &mut names, &mut values, |n, v| fields.push((n.to_vec(), v.to_vec()))).is_err() {
        return;
    }
    let mut out = Vec::new();
    qpack::begin(&mut out);
    for (n, v) in &fields {
        // The encoder takes names as text, as a header map holds them.
        let Ok(name) = std::str::from_utf8(n) else { return };
        qpack::encode_field(&mut out, name, v);
    }
    let mut back: Fields = Vec::new();
    let r = qpack::decode(&out, &mut names, &mut values, |n, v| back.push((n.to_vec(), v.to_vec())));
    assert!(r.is_ok(), "our own field section does not decode: {r:?}");
    assert_eq!(back, fields, "fields differ after encoding and decoding again");
}
