//! HTTP/1.1 request heads as Gatehouse's own server takes them
//! (`h1::request`). Input: the bytes a client sent.
//!
//! Properties: a head taken as simple lies within the input, its field
//! spans are ordered and inside it, and it names none of the fields that
//! send a request to hyper instead (bodies, upgrades, `Expect`); it is
//! complete only at its last byte; a request built from it, written back by
//! the upstream writer (`h1::write`) and parsed again, is the same request.
//! The head parser is httparse itself, so the reference is the round trip.

use bytes::Bytes;
use gatehouse_l7::h1::request::{Parse, build_request, parse_head};
use gatehouse_l7::h1::write::encode_request_head;

/// The field limit the server's default config gives.
const MAX_HEADERS: usize = 100;

pub fn run(data: &[u8]) {
    let mut spans = Vec::new();
    let Parse::Simple(h) = parse_head(data, MAX_HEADERS, &mut spans) else { return };
    assert!(h.len <= data.len() && h.path.0 < h.path.1 && h.path.1 <= h.len);
    assert_eq!(spans.len(), h.fields);
    for &(n0, n1, v0, v1) in &spans {
        assert!(n0 < n1 && n1 <= v0 && v0 <= v1 && v1 as usize <= h.len, "span out of order");
        let name = &data[n0 as usize..n1 as usize];
        for other in [&b"content-length"[..], b"transfer-encoding", b"upgrade", b"expect"] {
            assert!(!name.eq_ignore_ascii_case(other), "a simple head has {name:?}");
        }
    }
    assert!(matches!(parse_head(&data[..h.len - 1], MAX_HEADERS, &mut Vec::new()), Parse::Partial));
    let bytes = Bytes::copy_from_slice(&data[..h.len]);
    let Some(req) = build_request(&h, &bytes, &spans, ()) else { return };
    assert_eq!(req.headers().len(), h.fields, "a field was lost building the request");
    let (parts, ()) = req.into_parts();
    let mut written = Vec::new();
    encode_request_head(&parts, false, &mut written);
    let mut again = Vec::new();
    let Parse::Simple(h2) = parse_head(&written, MAX_HEADERS, &mut again) else {
        panic!("a written head does not parse back: {:?}", String::from_utf8_lossy(&written));
    };
    assert_eq!(h2.len, written.len());
    let bytes2 = Bytes::from(written);
    let req2 = build_request(&h2, &bytes2, &again, ()).expect("a written head builds a request");
    assert_eq!(req2.method(), parts.method);
    // The target in origin form, as an upstream gets it.
    let path = if parts.uri.path().is_empty() { "/" } else { parts.uri.path() };
    assert_eq!((req2.uri().path(), req2.uri().query()), (path, parts.uri.query()));
    assert_eq!(req2.headers(), &parts.headers, "fields differ after a round trip");
    assert_eq!(h2.close, h.close);
}
