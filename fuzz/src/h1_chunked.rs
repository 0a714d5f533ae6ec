//! The chunked body decoder (`h1::chunked`). Input: one byte saying how
//! many split points follow, those bytes (the gaps between splits), then
//! the body as it would arrive.
//!
//! Properties: the decoder gives the same data and the same verdict
//! however the body is split into reads, and the same as a reference
//! decoder written from RFC 9112 §7.1 in the plainest way (the whole body
//! at once); data never comes out past a refusal.

use bytes::BytesMut;
use gatehouse_l7::h1::chunked::{ChunkedDecoder, Decoded, MAX_SIZE_LINE, MAX_TRAILER_LINE};

use crate::input::{Input, splits};

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The body ended after this many input bytes.
    End(usize),
    Incomplete,
    Refused,
}

fn decode(body: &[u8], cuts: &[usize]) -> (Vec<u8>, Verdict) {
    let mut dec = ChunkedDecoder::default();
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut from = 0;
    for &to in cuts {
        buf.extend_from_slice(&body[from..to]);
        from = to;
        loop {
            match dec.decode(&mut buf) {
                Ok(Decoded::Data(d)) => out.extend_from_slice(&d),
                Ok(Decoded::NeedMore) => break,
                Ok(Decoded::End) => return (out, Verdict::End(to - buf.len())),
                Err(_) => return (out, Verdict::Refused),
            }
        }
    }
    (out, Verdict::Incomplete)
}

/// RFC 9112 §7.1, the whole body in hand: `chunk-size [ext] CRLF data CRLF`
/// until a zero size, then trailer lines until an empty one.
fn reference(body: &[u8]) -> (Vec<u8>, Verdict) {
    let mut out = Vec::new();
    let mut at = 0;
    let line = |at: usize, max: usize| -> Result<Option<(usize, usize)>, ()> {
        match body[at..].iter().position(|&b| b == b'\n') {
            Some(n) if n > max => Err(()),
            Some(n) => Ok(Some((at + n, at + n + 1))),
            None if body.len() - at > max => Err(()),
            None => Ok(None),
        }
    };
    loop {
        let Ok(found) = line(at, MAX_SIZE_LINE) else { return (out, Verdict::Refused) };
        let Some((eol, next)) = found else { return (out, Verdict::Incomplete) };
        let Some(text) = body[at..eol].strip_suffix(b"\r") else { return (out, Verdict::Refused) };
        let digits = text.split(|&b| b == b';').next().unwrap_or_default().trim_ascii_end();
        if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
            return (out, Verdict::Refused);
        }
        let size = digits.iter().fold(0u64, |n, &d| n * 16 + u64::from((d as char).to_digit(16).unwrap_or(0)));
        at = next;
        if size == 0 {
            break;
        }
        let have = (body.len() - at) as u64;
        if have < size {
            out.extend_from_slice(&body[at..]);
            return (out, Verdict::Incomplete);
        }
        let end = at + size as usize;
        out.extend_from_slice(&body[at..end]);
        at = end;
        match body.get(at..at + 2) {
            Some(b"\r\n") => at += 2,
            Some(_) => return (out, Verdict::Refused),
            // The decoder waits for both bytes before it judges them.
            None => return (out, Verdict::Incomplete),
        }
    }
    loop {
        let Ok(found) = line(at, MAX_TRAILER_LINE) else { return (out, Verdict::Refused) };
        let Some((eol, next)) = found else { return (out, Verdict::Incomplete) };
        let empty = eol == at || (eol == at + 1 && body[at] == b'\r');
        at = next;
        if empty {
            return (out, Verdict::End(at));
        }
    }
}

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let n = usize::from(input.byte() % 16);
    let choices = input.take(n);
    let body = input.rest();
    let whole = decode(body, &[body.len()]);
    let split = decode(body, &splits(choices, body.len()));
    let bytewise = decode(body, &(1..=body.len()).collect::<Vec<_>>());
    let expected = reference(body);
    assert_eq!(whole, expected, "the decoder differs from the reference");
    assert_eq!(split, expected, "split reads change the result");
    assert_eq!(bytewise, expected, "byte-at-a-time reads change the result");
}
