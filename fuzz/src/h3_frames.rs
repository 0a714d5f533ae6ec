//! HTTP/3's frames on a client's request or control stream, QPACK field
//! sections and the QPACK encoder stream with its dynamic table
//! (`h3::frame`, `h3::stream`, `h3::qpack`, `h3::qpack_table`). Input: a
//! byte of choices (bit 0: the control stream; bit 1: QPACK's encoder
//! stream and a section, bits 2-3 the table's capacity; else a request
//! stream), a byte saying how many split points follow, those bytes, then
//! the stream's bytes (for QPACK: a 16-bit length, the encoder stream's
//! bytes, then the section).
//!
//! Properties: the stream reads the same (the same heads, trailers, body
//! bytes, settings, table entries and verdict) however its bytes are split
//! into reads; the table never holds more than its capacity; a field
//! section that decodes, encoded again by Gatehouse's encoder, decodes to
//! the same fields; a section's decoding stops when told to, however many
//! entries it names; no frame is gathered past its limit.

use gatehouse_l7::h3::qpack::{self, Prefix};
use gatehouse_l7::h3::qpack_table::{EncoderStream, Table};
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
    if choices & 2 == 2 {
        return dynamic_table([0, 100, 220, 4096][usize::from(choices >> 2 & 3)], &cuts, stream);
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
            if let Ok((_, fields)) = decoded(block, &Table::new(0)) {
                round_trip(&fields);
            }
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

/// The fields of `block` with `table`, or the error.
fn decoded(block: &[u8], table: &Table) -> Result<(Prefix, Fields), u64> {
    let p = qpack::prefix(block, table)?;
    let mut fields: Fields = Vec::new();
    qpack::decode(block, &p, table, &mut Vec::new(), &mut Vec::new(), |n, v| {
        fields.push((n.to_vec(), v.to_vec()));
        true
    })?;
    Ok((p, fields))
}

/// The table's entries, oldest first.
fn entries(table: &Table) -> Fields {
    let first = table.inserted() - table.len() as u64;
    (first..table.inserted()).filter_map(|i| table.get(i)).map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
}

/// Encoder stream bytes in pieces and whole give the same table; then a
/// section decoded against it.
fn dynamic_table(capacity: usize, cuts: &[u8], stream: &[u8]) {
    let mut input = Input::new(stream);
    let len = usize::from(input.u16());
    let encoder = input.take(len);
    let block = input.rest();
    let apply = |cuts: &[usize]| {
        let (mut table, mut reader) = (Table::new(capacity), EncoderStream::default());
        let mut from = 0;
        for &to in cuts {
            if let Err(e) = reader.read(&mut table, &encoder[from..to]) {
                return (table, Err(e));
            }
            assert!(table.size() <= capacity, "the table holds {} bytes past its capacity {capacity}", table.size());
            from = to;
        }
        (table, Ok(()))
    };
    let (table, verdict) = apply(&splits(cuts, encoder.len()));
    let (whole, whole_verdict) = apply(&[encoder.len()]);
    assert_eq!(verdict, whole_verdict, "the encoder stream's verdict differs in pieces");
    assert_eq!(entries(&table), entries(&whole), "the table differs in pieces");
    if verdict.is_err() {
        return;
    }
    // A section needing entries not there yet fails here.
    let Ok((p, fields)) = decoded(block, &table) else { return };
    // Told to stop at the first field, decoding stops there.
    let mut calls = 0;
    let r = qpack::decode(block, &p, &table, &mut Vec::new(), &mut Vec::new(), |_, _| {
        calls += 1;
        false
    });
    assert!(r.is_ok() && calls == usize::from(!fields.is_empty()), "decoding went on after being told to stop");
    round_trip(&fields);
}

fn round_trip(fields: &Fields) {
    let mut out = Vec::new();
    qpack::begin(&mut out);
    for (n, v) in fields {
        // The encoder takes names as text, as a header map holds them.
        let Ok(name) = std::str::from_utf8(n) else { return };
        qpack::encode_field(&mut out, name, v);
    }
    let back = decoded(&out, &Table::new(0)).map(|r| r.1);
    assert_eq!(back.as_ref(), Ok(fields), "our own field section does not decode to the same fields");
}
