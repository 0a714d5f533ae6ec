//! Response heads from upstreams (`h1::response`). Input: one byte of
//! flags (bit 0: the request was HEAD), then the bytes an upstream sent.
//!
//! Properties: every shorter prefix of a head is partial; a final head
//! takes exactly its bytes off the buffer, keeps no hop-by-hop field (but
//! for a 101), and every field it keeps goes into a header map; its body
//! framing is the one RFC 9112 §6.3 gives, computed here separately from
//! httparse's fields, and an ambiguous length (Content-Length with
//! Transfer-Encoding, differing Content-Lengths) is refused.

use bytes::BytesMut;
use gatehouse_l7::h1::response::{Parsed, parse_response};
use gatehouse_l7::h1::{Framing, connection_tokens, hop_by_hop_name};

/// Framing by RFC 9112 §6.3, or `None` when the length is ambiguous.
fn reference(head: &[u8], is_head: bool) -> Option<(u16, Option<Framing>)> {
    let mut fields = [httparse::EMPTY_HEADER; 128];
    let mut r = httparse::Response::new(&mut fields);
    let Ok(httparse::Status::Complete(_)) = r.parse(head) else { return None };
    let code = r.code?;
    let (mut lengths, mut codings) = (Vec::new(), Vec::new());
    for h in r.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            lengths.push(h.value);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            codings.push(h.value);
        }
    }
    if code == 101 || is_head || code == 204 || code == 304 {
        return Some((code, Some(Framing::Empty)));
    }
    if !lengths.is_empty() && !codings.is_empty() {
        return Some((code, None));
    }
    if let Some(last) = codings.last() {
        let coding = last.rsplit(|&b| b == b',').next().unwrap_or_default().trim_ascii();
        return Some((
            code,
            Some(if coding.eq_ignore_ascii_case(b"chunked") { Framing::Chunked } else { Framing::Close }),
        ));
    }
    let mut n = None;
    for v in lengths {
        let ok = !v.is_empty() && v.len() <= 19 && v.iter().all(u8::is_ascii_digit);
        let value = std::str::from_utf8(v).ok().filter(|_| ok).and_then(|s| s.parse::<u64>().ok());
        match (n, value) {
            (_, None) => return Some((code, None)),
            (Some(a), Some(b)) if a != b => return Some((code, None)),
            (_, Some(b)) => n = Some(b),
        }
    }
    Some((
        code,
        Some(match n {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }),
    ))
}

pub fn run(data: &[u8]) {
    let Some((&flags, stream)) = data.split_first() else { return };
    let is_head = flags & 1 == 1;
    let mut buf = BytesMut::from(stream);
    let mut spans = Vec::new();
    let parsed = parse_response(&mut buf, is_head, &mut spans);
    let taken = stream.len() - buf.len();
    match parsed {
        Ok(Parsed::Partial) => assert_eq!(taken, 0),
        Ok(Parsed::Interim) => {
            let head = &stream[..taken];
            assert!(matches!(reference(head, is_head), Some((100..=199, _))), "interim head was not a 1xx");
        }
        Ok(Parsed::Final(head, framing)) => {
            assert!(taken > 0);
            let mut again = BytesMut::from(&stream[..taken - 1]);
            assert!(matches!(parse_response(&mut again, is_head, &mut Vec::new()), Ok(Parsed::Partial)));
            let code = head.status.as_u16();
            let Some((ref_code, ref_framing)) = reference(&stream[..taken], is_head) else {
                panic!("a head httparse refuses was taken");
            };
            assert_eq!(code, ref_code);
            if code != 101 {
                assert_eq!(Some(framing.framing), ref_framing, "framing differs from RFC 9112 §6.3");
            }
            let mut kept = 0;
            for (name, value, _) in head.field_lines() {
                kept += 1;
                if code != 101 {
                    assert_eq!(hop_by_hop_name(name), 0, "hop-by-hop field {name:?} kept");
                }
                let _ = connection_tokens(value).count();
            }
            assert_eq!(head.header_map().len(), kept, "a kept field is not a valid header");
            if !framing.reusable {
                return;
            }
            assert!(!matches!(framing.framing, Framing::Close), "a close-delimited response is reusable");
        }
        // Refused: nothing taken (the connection is not reused).
        Err(_) => assert_eq!(taken, 0),
    }
}
