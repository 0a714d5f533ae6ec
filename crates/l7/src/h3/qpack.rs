//! QPACK (RFC 9204) without a dynamic table, both ways.
//!
//! This server tells clients its table's capacity is zero (the default
//! of SETTINGS_QPACK_MAX_TABLE_CAPACITY), so a request's field section may
//! name only the static table or spell fields out; a section that needs
//! the dynamic table is `QPACK_DECOMPRESSION_FAILED`. Responses are
//! encoded the same way, with literal values not Huffman-coded: the CPU
//! that coding costs buys a few bytes of a packet that has room. (quiche's
//! encoder coded every value, then decoded each request's twice over into
//! a vector per name and value.)

use super::frame::code;
use crate::h2::hpack::{HpackError, read_int, write_int};

/// A request's field section: each field in order to `field`. `names`
/// and `values` are scratch room for Huffman-coded strings.
pub fn decode(
    block: &[u8],
    names: &mut Vec<u8>,
    values: &mut Vec<u8>,
    mut field: impl FnMut(&[u8], &[u8]),
) -> Result<(), u64> {
    decode_fields(block, names, values, &mut field).map_err(|_| code::QPACK_DECOMPRESSION_FAILED)
}

fn decode_fields(
    block: &[u8],
    names: &mut Vec<u8>,
    values: &mut Vec<u8>,
    field: &mut impl FnMut(&[u8], &[u8]),
) -> Result<(), HpackError> {
    let mut pos = 0;
    // Required Insert Count: zero, as no table is allowed. The Base that
    // follows means nothing then.
    if read_int(block, &mut pos, 8)? != 0 {
        return Err(HpackError::BadIndex);
    }
    read_int(block, &mut pos, 7)?;
    while pos < block.len() {
        let b = block[pos];
        if b & 0x80 != 0 {
            // Indexed field line; T (0x40) must name the static table.
            if b & 0x40 == 0 {
                return Err(HpackError::BadIndex);
            }
            let (n, v) = entry(read_int(block, &mut pos, 6)?)?;
            field(n.as_bytes(), v.as_bytes());
        } else if b & 0xc0 == 0x40 {
            // Literal field line with name reference; T is 0x10.
            if b & 0x10 == 0 {
                return Err(HpackError::BadIndex);
            }
            let (n, _) = entry(read_int(block, &mut pos, 4)?)?;
            let value = string(block, &mut pos, 7, values)?;
            field(n.as_bytes(), value);
        } else if b & 0xe0 == 0x20 {
            // Literal field line with literal name: H is 0x08.
            let name = string(block, &mut pos, 3, names)?;
            let value = string(block, &mut pos, 7, values)?;
            field(name, value);
        } else {
            // Post-base references name the dynamic table.
            return Err(HpackError::BadIndex);
        }
    }
    Ok(())
}

/// A string literal whose length has a `prefix`-bit prefix, the Huffman
/// flag the bit above it: its bytes in the block, or decoded into `buf`.
fn string<'a>(block: &'a [u8], pos: &mut usize, prefix: u8, buf: &'a mut Vec<u8>) -> Result<&'a [u8], HpackError> {
    let huffman = *block.get(*pos).ok_or(HpackError::Truncated)? & (1 << prefix) != 0;
    let len = read_int(block, pos, prefix)?;
    let start = *pos;
    let end = start.checked_add(len).filter(|&e| e <= block.len()).ok_or(HpackError::Truncated)?;
    *pos = end;
    if !huffman {
        return Ok(&block[start..end]);
    }
    buf.clear();
    crate::h2::huffman::decode(&block[start..end], buf).map_err(|_| HpackError::BadHuffman)?;
    Ok(buf)
}

fn entry(index: usize) -> Result<(&'static str, &'static str), HpackError> {
    STATIC_TABLE.get(index).copied().ok_or(HpackError::BadIndex)
}

/// Starts a field section: no table needed (Required Insert Count and
/// Base zero).
pub fn begin(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0]);
}

/// `:status`: one byte for the common ones the table has.
pub fn encode_status(out: &mut Vec<u8>, status: u16) {
    let index = match status {
        103 => 24,
        200 => 25,
        304 => 26,
        404 => 27,
        503 => 28,
        100 => 63,
        204 => 64,
        206 => 65,
        302 => 66,
        400 => 67,
        403 => 68,
        421 => 69,
        425 => 70,
        500 => 71,
        _ => {
            let s = status.min(999);
            let digits = [b'0' + (s / 100) as u8, b'0' + (s / 10 % 10) as u8, b'0' + (s % 10) as u8];
            return literal_with_name_ref(out, 24, &digits);
        }
    };
    write_int(out, 0xc0, 6, index);
}

/// One field; `name` lower case. The whole field when the table has it,
/// else its name from the table when it has that, else both spelled out.
pub fn encode_field(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    let entries = static_entries(name);
    if let Some(i) = entries.clone().find(|&i| STATIC_TABLE[i].1.as_bytes() == value) {
        return write_int(out, 0xc0, 6, i);
    }
    match entries.start {
        // An empty range names no entry.
        i if !entries.is_empty() => literal_with_name_ref(out, i, value),
        _ => {
            write_int(out, 0x20, 3, name.len());
            out.extend_from_slice(name.as_bytes());
            write_int(out, 0, 7, value.len());
            out.extend_from_slice(value);
        }
    }
}

fn literal_with_name_ref(out: &mut Vec<u8>, index: usize, value: &[u8]) {
    write_int(out, 0x50, 4, index);
    write_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// The static entries with this name, as a range of indices (names that
/// repeat are next to each other in the table, but for `:status` and
/// `access-control-allow-headers`, whose first run this gives).
fn static_entries(name: &str) -> std::ops::Range<usize> {
    // By length first: rustc switches on it, then compares only the
    // names of that length.
    let (start, len) = match (name.len(), name) {
        (3, "age") => (2, 1),
        (19, "content-disposition") => (3, 1),
        (14, "content-length") => (4, 1),
        (6, "cookie") => (5, 1),
        (4, "date") => (6, 1),
        (4, "etag") => (7, 1),
        (17, "if-modified-since") => (8, 1),
        (13, "if-none-match") => (9, 1),
        (13, "last-modified") => (10, 1),
        (4, "link") => (11, 1),
        (8, "location") => (12, 1),
        (7, "referer") => (13, 1),
        (10, "set-cookie") => (14, 1),
        (6, "accept") => (29, 2),
        (15, "accept-encoding") => (31, 1),
        (13, "accept-ranges") => (32, 1),
        (28, "access-control-allow-headers") => (33, 2),
        (27, "access-control-allow-origin") => (35, 1),
        (13, "cache-control") => (36, 6),
        (16, "content-encoding") => (42, 2),
        (12, "content-type") => (44, 11),
        (5, "range") => (55, 1),
        (25, "strict-transport-security") => (56, 3),
        (4, "vary") => (59, 2),
        (22, "x-content-type-options") => (61, 1),
        (16, "x-xss-protection") => (62, 1),
        (15, "accept-language") => (72, 1),
        (32, "access-control-allow-credentials") => (73, 2),
        (28, "access-control-allow-methods") => (76, 3),
        (29, "access-control-expose-headers") => (79, 1),
        (30, "access-control-request-headers") => (80, 1),
        (29, "access-control-request-method") => (81, 2),
        (7, "alt-svc") => (83, 1),
        (13, "authorization") => (84, 1),
        (23, "content-security-policy") => (85, 1),
        (10, "early-data") => (86, 1),
        (9, "expect-ct") => (87, 1),
        (9, "forwarded") => (88, 1),
        (8, "if-range") => (89, 1),
        (6, "origin") => (90, 1),
        (7, "purpose") => (91, 1),
        (6, "server") => (92, 1),
        (19, "timing-allow-origin") => (93, 1),
        (25, "upgrade-insecure-requests") => (94, 1),
        (10, "user-agent") => (95, 1),
        (15, "x-forwarded-for") => (96, 1),
        (15, "x-frame-options") => (97, 2),
        _ => (0, 0),
    };
    start..start + len
}

/// RFC 9204 Appendix A.
static STATIC_TABLE: [(&str, &str); 99] = [
    (":authority", ""),
    (":path", "/"),
    ("age", "0"),
    ("content-disposition", ""),
    ("content-length", "0"),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("referer", ""),
    ("set-cookie", ""),
    (":method", "CONNECT"),
    (":method", "DELETE"),
    (":method", "GET"),
    (":method", "HEAD"),
    (":method", "OPTIONS"),
    (":method", "POST"),
    (":method", "PUT"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "103"),
    (":status", "200"),
    (":status", "304"),
    (":status", "404"),
    (":status", "503"),
    ("accept", "*/*"),
    ("accept", "application/dns-message"),
    ("accept-encoding", "gzip, deflate, br"),
    ("accept-ranges", "bytes"),
    ("access-control-allow-headers", "cache-control"),
    ("access-control-allow-headers", "content-type"),
    ("access-control-allow-origin", "*"),
    ("cache-control", "max-age=0"),
    ("cache-control", "max-age=2592000"),
    ("cache-control", "max-age=604800"),
    ("cache-control", "no-cache"),
    ("cache-control", "no-store"),
    ("cache-control", "public, max-age=31536000"),
    ("content-encoding", "br"),
    ("content-encoding", "gzip"),
    ("content-type", "application/dns-message"),
    ("content-type", "application/javascript"),
    ("content-type", "application/json"),
    ("content-type", "application/x-www-form-urlencoded"),
    ("content-type", "image/gif"),
    ("content-type", "image/jpeg"),
    ("content-type", "image/png"),
    ("content-type", "text/css"),
    ("content-type", "text/html; charset=utf-8"),
    ("content-type", "text/plain"),
    ("content-type", "text/plain;charset=utf-8"),
    ("range", "bytes=0-"),
    ("strict-transport-security", "max-age=31536000"),
    ("strict-transport-security", "max-age=31536000; includesubdomains"),
    ("strict-transport-security", "max-age=31536000; includesubdomains; preload"),
    ("vary", "accept-encoding"),
    ("vary", "origin"),
    ("x-content-type-options", "nosniff"),
    ("x-xss-protection", "1; mode=block"),
    (":status", "100"),
    (":status", "204"),
    (":status", "206"),
    (":status", "302"),
    (":status", "400"),
    (":status", "403"),
    (":status", "421"),
    (":status", "425"),
    (":status", "500"),
    ("accept-language", ""),
    ("access-control-allow-credentials", "FALSE"),
    ("access-control-allow-credentials", "TRUE"),
    ("access-control-allow-headers", "*"),
    ("access-control-allow-methods", "get"),
    ("access-control-allow-methods", "get, post, options"),
    ("access-control-allow-methods", "options"),
    ("access-control-expose-headers", "content-length"),
    ("access-control-request-headers", "content-type"),
    ("access-control-request-method", "get"),
    ("access-control-request-method", "post"),
    ("alt-svc", "clear"),
    ("authorization", ""),
    ("content-security-policy", "script-src 'none'; object-src 'none'; base-uri 'none'"),
    ("early-data", "1"),
    ("expect-ct", ""),
    ("forwarded", ""),
    ("if-range", ""),
    ("origin", ""),
    ("purpose", "prefetch"),
    ("server", ""),
    ("timing-allow-origin", "*"),
    ("upgrade-insecure-requests", "1"),
    ("user-agent", ""),
    ("x-forwarded-for", ""),
    ("x-frame-options", "deny"),
    ("x-frame-options", "sameorigin"),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(block: &[u8]) -> Result<Vec<(String, String)>, u64> {
        let (mut n, mut v) = (Vec::new(), Vec::new());
        let mut out = Vec::new();
        decode(block, &mut n, &mut v, |n, v| {
            out.push((String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
        })?;
        Ok(out)
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_name_ranges_cover_every_entry_but_the_pseudo_fields() {
        for (i, (name, _)) in STATIC_TABLE.iter().enumerate() {
            if name.starts_with(':') {
                assert!(static_entries(name).is_empty());
                continue;
            }
            let r = static_entries(name);
            let second_run = matches!(name, &"access-control-allow-headers") && i == 75;
            assert!(r.contains(&i) || second_run, "{name} at {i} not in {r:?}");
            assert!(r.clone().all(|j| STATIC_TABLE[j].0 == *name), "{name}");
        }
    }

    #[test]
    fn a_response_round_trips_through_the_static_table_and_literals() {
        let fields = [
            ("content-type", "text/plain"),
            ("content-type", "application/xml"),
            ("server", "gatehouse"),
            ("x-request-id", "abc-123"),
            ("cache-control", "no-store"),
            ("content-length", "0"),
            ("x-long", &"v".repeat(300)),
        ];
        for status in [200u16, 404, 500, 201, 599, 100, 425] {
            let mut out = Vec::new();
            begin(&mut out);
            encode_status(&mut out, status);
            for (n, v) in fields {
                encode_field(&mut out, n, v.as_bytes());
            }
            let mut want = pairs(&[(":status", &status.to_string())]);
            want.extend(pairs(&fields));
            assert_eq!(decoded(&out), Ok(want), "status {status}");
        }
        // The common ones are a byte each.
        let mut out = Vec::new();
        encode_status(&mut out, 200);
        encode_field(&mut out, "content-type", b"text/plain");
        assert_eq!(out, [0xc0 | 25, 0xc0 | 53]);
    }

    #[test]
    fn rfc_9204_b1_literal_field_line_with_name_reference() {
        // RFC 9204 B.1: ":path /index.html", with no dynamic table.
        let block = [0x00, 0x00, 0x51, 0x0b, b'/', b'i', b'n', b'd', b'e', b'x', b'.', b'h', b't', b'm', b'l'];
        assert_eq!(decoded(&block), Ok(pairs(&[(":path", "/index.html")])));
    }

    #[test]
    fn huffman_coded_names_and_values_decode() {
        // "www.example.com" Huffman-coded (RFC 7541 C.4.1), as a value of
        // :authority (static 0) and as a literal name with a plain value.
        let www = [0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff];
        let mut block = vec![0x00, 0x00, 0x50, 0x80 | www.len() as u8];
        block.extend(www);
        block.push(0x28 | 7); // literal name, Huffman, length 12 > 7: prefix full
        block.push((www.len() - 7) as u8);
        block.extend(www);
        block.extend([0x01, b'x']);
        assert_eq!(decoded(&block), Ok(pairs(&[(":authority", "www.example.com"), ("www.example.com", "x")])));
    }

    #[test]
    fn a_section_that_needs_the_dynamic_table_fails() {
        let fails = Err(code::QPACK_DECOMPRESSION_FAILED);
        assert_eq!(decoded(&[0x01, 0x00]), fails, "required insert count");
        assert_eq!(decoded(&[0x00, 0x00, 0x80]), fails, "dynamic indexed");
        assert_eq!(decoded(&[0x00, 0x00, 0x40, 0x00]), fails, "dynamic name reference");
        assert_eq!(decoded(&[0x00, 0x00, 0x10]), fails, "post-base index");
        assert_eq!(decoded(&[0x00, 0x00, 0x00, 0x00]), fails, "post-base name reference");
        assert_eq!(decoded(&[0x00, 0x00, 0xff, 0x24]), fails, "static index 99");
        assert_eq!(decoded(&[0x00, 0x00, 0x51, 0x05, b'/']), fails, "cut value");
        assert_eq!(decoded(&[0x00]), fails, "cut prefix");
        assert_eq!(decoded(&[0x00, 0x00, 0xff, 0x23]), Ok(pairs(&[("x-frame-options", "sameorigin")])));
    }
}
