//! QPACK's primitives, shared by field sections ([`super::qpack`]) and
//! the encoder stream ([`super::qpack_table`]): the static table (RFC 9204
//! Appendix A) and string literals (RFC 9204 4.1.2).

use crate::h2::hpack::{HpackError, read_int};

/// A string literal whose length has a `prefix`-bit prefix, the Huffman
/// flag the bit above it: its bytes in the block, or decoded into `buf`.
/// A length over `limit` is refused before its bytes are looked for.
pub(super) fn string<'a>(
    block: &'a [u8],
    pos: &mut usize,
    prefix: u8,
    buf: &'a mut Vec<u8>,
    limit: usize,
) -> Result<&'a [u8], HpackError> {
    let huffman = *block.get(*pos).ok_or(HpackError::Truncated)? & (1 << prefix) != 0;
    let len = read_int(block, pos, prefix)?;
    if len > limit {
        return Err(HpackError::IntegerOverflow);
    }
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

/// A static table entry.
pub(super) fn static_entry(index: usize) -> Result<(&'static str, &'static str), HpackError> {
    STATIC_TABLE.get(index).copied().ok_or(HpackError::BadIndex)
}

/// The static entries with this name, as a range of indices (names that
/// repeat are next to each other in the table, but for `:status` and
/// `access-control-allow-headers`, whose first run this gives).
pub(super) fn static_entries(name: &str) -> std::ops::Range<usize> {
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
pub(super) static STATIC_TABLE: [(&str, &str); 99] = [
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
