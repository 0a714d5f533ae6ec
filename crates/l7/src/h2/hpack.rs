//! HPACK (RFC 7541): the decoder for request header blocks and a stateless
//! encoder for response header blocks.
//!
//! The decoder hands each field to a callback as borrowed bytes, so a
//! block that expands to far more than it carries (a field indexed into the
//! table, then referenced thousands of times) costs the caller only what it
//! chooses to keep. The dynamic table is bounded by the size this server
//! advertises ([`TABLE_SIZE`]).
//!
//! The encoder uses the static table and literals that are not indexed: it
//! keeps no state, so the client's `SETTINGS_HEADER_TABLE_SIZE` never
//! matters to it, and its output is the same for the same fields.

use std::collections::VecDeque;

/// The dynamic table size this server allows (the protocol's default).
pub const TABLE_SIZE: usize = 4096;

/// What makes a header block undecodable: the connection's HPACK state is
/// lost, a connection error of type COMPRESSION_ERROR (RFC 9113 4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HpackError {
    /// The block ended inside a representation.
    Truncated,
    /// An integer too large for any field, table or index.
    IntegerOverflow,
    /// Index 0, or past the static and dynamic tables.
    BadIndex,
    /// A table size update above the allowed size, or after a field.
    BadSizeUpdate,
    /// Huffman code with the EOS symbol, or padding that is not 1 bits of
    /// at most 7.
    BadHuffman,
}

/// RFC 7541 Appendix A.
pub const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// A dynamic table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// An entry's size in the dynamic table: its bytes and 32 (RFC 7541 4.1).
fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// A dynamic table (RFC 7541 2.3.2, 4): the decoder and the encoder each
/// keep one, and the two ends of a connection keep them alike.
struct Table {
    /// Newest first.
    entries: VecDeque<Entry>,
    size: usize,
    max_size: usize,
}

impl Default for Table {
    fn default() -> Self {
        Table { entries: VecDeque::new(), size: 0, max_size: TABLE_SIZE }
    }
}

impl Table {
    fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.entries.get(i).map(|(n, v)| (&n[..], &v[..]))
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = entry_size(name, value);
        if size > self.max_size {
            // An entry larger than the table empties it (RFC 7541 4.4).
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict(size);
        self.size += size;
        self.entries.push_front((name.into(), value.into()));
    }

    fn set_max_size(&mut self, size: usize) {
        self.max_size = size;
        self.evict(0);
    }

    /// Evicts until `room` more bytes fit.
    fn evict(&mut self, room: usize) {
        while self.size + room > self.max_size {
            match self.entries.pop_back() {
                Some((n, v)) => self.size -= entry_size(&n, &v),
                None => break,
            }
        }
    }
}

/// The decoder's half of the connection's HPACK state.
#[derive(Default)]
pub struct Decoder {
    table: Table,
    /// Huffman-decoded strings of the field being read.
    name_buf: Vec<u8>,
    value_buf: Vec<u8>,
}

/// Where a field's name or value lies while a representation is decoded.
#[derive(Clone, Copy)]
enum Str {
    /// In the block, at this range.
    Raw(usize, usize),
    /// Huffman-decoded into the decoder's buffer.
    Decoded,
    /// The name of a table entry (static up to 61).
    Name(usize),
}

impl Decoder {
    /// Decodes one whole header block, calling `field` for each field in
    /// order. The table changes as the block says even when the caller
    /// stops keeping fields, so later blocks still decode.
    pub fn decode(&mut self, block: &[u8], mut field: impl FnMut(&[u8], &[u8])) -> Result<(), HpackError> {
        let mut pos = 0;
        let mut fields_seen = false;
        while pos < block.len() {
            let b = block[pos];
            if b & 0x80 != 0 {
                let index = read_int(block, &mut pos, 7)?;
                let (name, value) = self.entry(index)?;
                field(name, value);
                fields_seen = true;
            } else if b & 0xe0 == 0x20 {
                // Dynamic table size update: only before the first field.
                let size = read_int(block, &mut pos, 5)?;
                if fields_seen || size > TABLE_SIZE {
                    return Err(HpackError::BadSizeUpdate);
                }
                self.table.set_max_size(size);
            } else {
                // Literal: with incremental indexing (01), without (0000),
                // never indexed (0001).
                let (prefix, index_it) = if b & 0xc0 == 0x40 { (6, true) } else { (4, false) };
                let name_index = read_int(block, &mut pos, prefix)?;
                let name = if name_index == 0 {
                    read_string(block, &mut pos, &mut self.name_buf)?
                } else {
                    self.entry(name_index)?;
                    Str::Name(name_index)
                };
                let value = read_string(block, &mut pos, &mut self.value_buf)?;
                let name_bytes = self.resolve(block, name, true);
                let value_bytes = self.resolve(block, value, false);
                field(name_bytes, value_bytes);
                fields_seen = true;
                if index_it {
                    let entry: Entry = (name_bytes.into(), value_bytes.into());
                    self.table.insert(&entry.0, &entry.1);
                }
            }
        }
        Ok(())
    }

    fn resolve<'a>(&'a self, block: &'a [u8], s: Str, name: bool) -> &'a [u8] {
        match s {
            Str::Raw(a, b) => &block[a..b],
            Str::Decoded if name => &self.name_buf,
            Str::Decoded => &self.value_buf,
            Str::Name(i) => self.entry(i).map_or(&[][..], |(n, _)| n),
        }
    }

    /// Entry `index` (1-based) of the static then the dynamic table.
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        match index {
            0 => Err(HpackError::BadIndex),
            1..=61 => {
                let (n, v) = STATIC_TABLE[index - 1];
                Ok((n.as_bytes(), v.as_bytes()))
            }
            _ => self.table.get(index - 62).ok_or(HpackError::BadIndex),
        }
    }
}

/// An HPACK integer with an `prefix`-bit prefix (RFC 7541 5.1), at most
/// 2^28: nothing in a header block needs more.
pub(crate) fn read_int(block: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, HpackError> {
    let max_prefix = (1usize << prefix) - 1;
    let first = *block.get(*pos).ok_or(HpackError::Truncated)? as usize & max_prefix;
    *pos += 1;
    if first < max_prefix {
        return Ok(first);
    }
    let mut value = max_prefix;
    let mut shift = 0;
    loop {
        let b = *block.get(*pos).ok_or(HpackError::Truncated)?;
        *pos += 1;
        // Four continuation bytes hold 28 bits, all a value we take may
        // need: a fifth is refused, as loona-hpack and nghttp2 refuse it.
        // Found by the h2_hpack fuzz target: the shift overflowed on a long
        // run of zero continuation bytes, and then (against loona-hpack) a
        // six-octet encoding of a small value was taken.
        if shift > 21 {
            return Err(HpackError::IntegerOverflow);
        }
        value += ((b & 0x7f) as usize) << shift;
        if value > 1 << 28 {
            return Err(HpackError::IntegerOverflow);
        }
        if b & 0x80 == 0 {
            return Ok(value);
        }
        shift += 7;
    }
}

/// A string literal (RFC 7541 5.2): raw, or Huffman-decoded into `buf`.
fn read_string(block: &[u8], pos: &mut usize, buf: &mut Vec<u8>) -> Result<Str, HpackError> {
    let huffman = *block.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = read_int(block, pos, 7)?;
    let start = *pos;
    let end = start.checked_add(len).filter(|&e| e <= block.len()).ok_or(HpackError::Truncated)?;
    *pos = end;
    if !huffman {
        return Ok(Str::Raw(start, end));
    }
    buf.clear();
    super::huffman::decode(&block[start..end], buf).map_err(|_| HpackError::BadHuffman)?;
    Ok(Str::Decoded)
}

/// Writes an HPACK integer with a `prefix`-bit prefix; `flags` fills the
/// first byte's other bits.
#[inline]
pub fn write_int(out: &mut Vec<u8>, flags: u8, prefix: u8, mut value: usize) {
    let max_prefix = (1usize << prefix) - 1;
    if value < max_prefix {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max_prefix as u8);
    value -= max_prefix;
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn write_raw_string(out: &mut Vec<u8>, s: &[u8]) {
    write_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// `:status` as one byte where the static table has it.
pub fn encode_status(out: &mut Vec<u8>, status: u16) {
    let index = match status {
        200 => 8,
        204 => 9,
        206 => 10,
        304 => 11,
        400 => 12,
        404 => 13,
        500 => 14,
        _ => {
            // Literal without indexing, name `:status` (index 8).
            out.push(0x08);
            let mut digits = [0u8; 3];
            let s = status.min(999);
            digits[0] = b'0' + (s / 100) as u8;
            digits[1] = b'0' + (s / 10 % 10) as u8;
            digits[2] = b'0' + (s % 10) as u8;
            write_raw_string(out, &digits);
            return;
        }
    };
    out.push(0x80 | index);
}

/// The encoder's half of the connection's HPACK state. A field an
/// upstream sends the same on every response (`server`, `content-type`,
/// `etag`) goes into the dynamic table once and is one byte after that;
/// fields that change on every response (`date`) or may carry secrets
/// (`set-cookie`) are never put in the table.
#[derive(Default)]
pub struct Encoder {
    table: Table,
    /// Size updates owed at the start of the next block: the smallest the
    /// limit went to, then where it ended (RFC 7541 4.2).
    min_update: Option<usize>,
    final_update: Option<usize>,
}

/// Values longer than this are not put in the table: they are unlikely to
/// repeat and would push out fields that do.
const INDEX_VALUES_UP_TO: usize = 128;

impl Encoder {
    /// The client's SETTINGS_HEADER_TABLE_SIZE; the encoder uses at most
    /// [`TABLE_SIZE`] whatever the client allows.
    pub fn set_peer_table_size(&mut self, size: usize) {
        let size = size.min(TABLE_SIZE);
        if size == self.table.max_size {
            return;
        }
        self.table.set_max_size(size);
        self.min_update = Some(self.min_update.map_or(size, |m| m.min(size)));
        self.final_update = Some(size);
    }

    /// Starts a header block: the table size updates owed, if any.
    pub fn begin_block(&mut self, out: &mut Vec<u8>) {
        if let (Some(min), Some(last)) = (self.min_update.take(), self.final_update.take()) {
            if min < last {
                write_int(out, 0x20, 5, min);
            }
            write_int(out, 0x20, 5, last);
        }
    }

    /// One field; `name` must be lower case.
    pub fn field(&mut self, out: &mut Vec<u8>, name: &str, value: &[u8]) {
        let (flags, prefix) = match name {
            "set-cookie" | "authorization" | "proxy-authorization" | "cookie" => (0x10, 4),
            "date" | "content-length" | "last-modified" | "expires" | "age" => (0x00, 4),
            _ if value.len() <= INDEX_VALUES_UP_TO && entry_size(name.as_bytes(), value) <= self.table.max_size => {
                (0x40, 6)
            }
            _ => (0x00, 4),
        };
        let mut name_index = static_name_index(name);
        // The table holds only fields of the indexed kind: the others (and
        // `date` on every response) need not look through it for a static
        // name.
        if flags == 0x40 || name_index.is_none() {
            for (i, (n, v)) in self.table.entries.iter().enumerate() {
                if &n[..] == name.as_bytes() {
                    if &v[..] == value {
                        write_int(out, 0x80, 7, 62 + i);
                        return;
                    }
                    name_index = name_index.or(Some(62 + i));
                }
            }
        }
        match name_index {
            Some(i) => write_int(out, flags, prefix, i),
            None => {
                out.push(flags);
                write_raw_string(out, name.as_bytes());
            }
        }
        write_raw_string(out, value);
        if flags == 0x40 {
            self.table.insert(name.as_bytes(), value);
        }
    }
}

/// The static table's index of a name that is not a pseudo-header.
fn static_name_index(name: &str) -> Option<usize> {
    // Entries 15..=61 are regular names, each once.
    STATIC_TABLE[14..].iter().position(|(n, _)| *n == name).map(|p| p + 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    fn decode_all(d: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, HpackError> {
        let mut out = Vec::new();
        d.decode(block, |n, v| {
            out.push((String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
        })?;
        Ok(out)
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
    }

    /// RFC 7541 C.3 and C.4: three requests on one connection, without and
    /// with Huffman coding; the table carries fields from block to block.
    #[test]
    fn rfc7541_request_examples() {
        for blocks in [
            [
                "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
                "8286 84be 5808 6e6f 2d63 6163 6865",
                "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
            ],
            [
                "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
                "8286 84be 5886 a8eb 1064 9cbf",
                "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            ],
        ] {
            let mut d = Decoder::default();
            let first = decode_all(&mut d, &hex(blocks[0])).expect("first");
            assert_eq!(
                first,
                pairs(&[(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "www.example.com")])
            );
            assert_eq!(d.table.size, 57);
            let second = decode_all(&mut d, &hex(blocks[1])).expect("second");
            assert_eq!(
                second,
                pairs(&[
                    (":method", "GET"),
                    (":scheme", "http"),
                    (":path", "/"),
                    (":authority", "www.example.com"),
                    ("cache-control", "no-cache"),
                ])
            );
            let third = decode_all(&mut d, &hex(blocks[2])).expect("third");
            assert_eq!(
                third,
                pairs(&[
                    (":method", "GET"),
                    (":scheme", "https"),
                    (":path", "/index.html"),
                    (":authority", "www.example.com"),
                    ("custom-key", "custom-value"),
                ])
            );
            assert_eq!(d.table.size, 164);
            assert_eq!(d.table.entries.len(), 3);
        }
    }

    /// RFC 7541 C.6: responses with Huffman coding into a 256-byte table,
    /// so entries are evicted.
    #[test]
    fn rfc7541_response_examples_with_eviction() {
        let mut d = Decoder::default();
        d.decode(&hex("3f e1 01"), |_, _| {}).expect("size update to 256");
        assert_eq!(d.table.max_size, 256);
        let first = decode_all(
            &mut d,
            &hex("4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3"),
        )
        .expect("first");
        assert_eq!(
            first,
            pairs(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        assert_eq!(d.table.size, 222);
        let second = decode_all(&mut d, &hex("4883 640e ffc1 c0bf")).expect("second");
        assert_eq!(second[0], (":status".into(), "307".into()));
        assert_eq!(d.table.size, 222);
        let third = decode_all(
            &mut d,
            &hex("88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07"),
        )
        .expect("third");
        assert_eq!(third.len(), 6);
        assert_eq!(third[5], ("set-cookie".into(), "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1".into()));
        assert_eq!(d.table.size, 215);
        assert_eq!(d.table.entries.len(), 3);
    }

    #[test]
    fn bad_blocks_are_refused() {
        let cases: [(&str, HpackError); 9] = [
            ("80", HpackError::BadIndex),
            ("be", HpackError::BadIndex),
            ("82 3f e1 01", HpackError::BadSizeUpdate),
            ("3f e2 1f", HpackError::BadSizeUpdate),
            ("ff ff ff ff ff 0f", HpackError::IntegerOverflow),
            // Over-long: zero continuation bytes past 28 bits, then 1.
            ("ff 80 80 80 80 80 80 80 80 80 80 01", HpackError::IntegerOverflow),
            // Six octets for a small value (zero padding).
            ("ff 80 80 80 80 00", HpackError::IntegerOverflow),
            ("40 85 f2", HpackError::Truncated),
            ("00 81 ff 00", HpackError::BadHuffman),
        ];
        for (block, want) in cases {
            let got = Decoder::default().decode(&hex(block), |_, _| {});
            assert_eq!(got, Err(want), "{block}");
        }
    }

    #[test]
    fn every_prefix_of_a_block_decodes_or_fails_cleanly() {
        let block = hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf");
        for end in 0..block.len() {
            let mut d = Decoder::default();
            let _ = d.decode(&block[..end], |_, _| {});
        }
    }

    #[test]
    fn encoded_responses_decode_to_the_same_fields() {
        let mut e = Encoder::default();
        let mut d = Decoder::default();
        let mut sizes = Vec::new();
        for round in 0..3 {
            let mut out = Vec::new();
            e.begin_block(&mut out);
            encode_status(&mut out, if round == 0 { 200 } else { 418 });
            e.field(&mut out, "content-type", b"text/plain");
            e.field(&mut out, "server", b"nginx");
            e.field(&mut out, "date", format!("Mon, 0{round} Jan").as_bytes());
            e.field(&mut out, "set-cookie", b"id=secret");
            e.field(&mut out, "x-long", &[b'a'; 300]);
            e.field(&mut out, "x-custom", format!("v{round}").as_bytes());
            let got = decode_all(&mut d, &out).expect("decodes");
            assert_eq!(got[0].1, if round == 0 { "200" } else { "418" });
            assert_eq!(got[1], ("content-type".into(), "text/plain".into()));
            assert_eq!(got[2], ("server".into(), "nginx".into()));
            assert_eq!(got[3], ("date".into(), format!("Mon, 0{round} Jan")));
            assert_eq!(got[4], ("set-cookie".into(), "id=secret".into()));
            assert_eq!(got[5].1.len(), 300);
            assert_eq!(got[6], ("x-custom".into(), format!("v{round}")));
            // Both tables agree, entry by entry.
            assert_eq!(d.table.entries, e.table.entries);
            assert!(!d.table.entries.iter().any(|(n, _)| &n[..] == b"set-cookie" || &n[..] == b"date"));
            sizes.push(out.len());
        }
        // content-type and server went from literals to one byte each.
        assert!(sizes[1] + 20 < sizes[0], "{sizes:?}");
    }

    #[test]
    fn a_smaller_peer_table_is_announced_and_kept_to() {
        let mut e = Encoder::default();
        let mut d = Decoder::default();
        let mut out = Vec::new();
        e.field(&mut out, "x-a", &[b'a'; 100]);
        decode_all(&mut d, &out).expect("decodes");
        e.set_peer_table_size(0);
        e.set_peer_table_size(64);
        out.clear();
        e.begin_block(&mut out);
        e.field(&mut out, "x-a", &[b'a'; 100]);
        e.field(&mut out, "x-b", b"1");
        assert_eq!(&out[..2], &[0x20, 0x3f], "updates to 0, then to 64 (0x3f 0x21)");
        decode_all(&mut d, &out).expect("decodes");
        assert_eq!(d.table.max_size, 64);
        assert_eq!(d.table.entries, e.table.entries);
        assert!(e.table.size <= 64);
    }

    #[test]
    fn integers_round_trip_at_every_prefix() {
        for prefix in 1..=8u8 {
            for v in [0usize, 1, 30, 31, 127, 128, 255, 1337, 1 << 20] {
                let mut out = Vec::new();
                write_int(&mut out, 0, prefix, v);
                let mut pos = 0;
                assert_eq!(read_int(&out, &mut pos, prefix), Ok(v));
                assert_eq!(pos, out.len());
            }
        }
    }
}
