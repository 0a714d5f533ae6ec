//! QPACK (RFC 9204) field sections: a request's decoded with the static
//! table and the client's dynamic table ([`Table`]), a response's encoded
//! with the static table and literals.
//!
//! A request's section names the dynamic table's entries by index from
//! its Base; one that needs entries the encoder stream has not brought
//! yet is blocked until they come ([`Prefix::required`]). Responses use
//! no dynamic table (so this server opens no encoder stream), with
//! literal values not Huffman-coded: the CPU that coding costs buys a few
//! bytes of a packet that has room.

use super::frame::code;
use super::qpack_prim::{STATIC_TABLE, static_entries, static_entry, string};
use super::qpack_table::Table;
use crate::h2::hpack::{HpackError, read_int, write_int};

/// A field section's prefix (RFC 9204 4.5.1).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// The Required Insert Count: entries the table must have had
    /// inserted before the section can be decoded.
    pub required: u64,
    base: u64,
    /// Where the field lines start.
    len: usize,
}

/// A field section's prefix, read with the table as it is now (which
/// disambiguates the encoded insert count).
pub fn prefix(block: &[u8], table: &Table) -> Result<Prefix, u64> {
    read_prefix(block, table).map_err(|_| code::QPACK_DECOMPRESSION_FAILED)
}

fn read_prefix(block: &[u8], table: &Table) -> Result<Prefix, HpackError> {
    let mut pos = 0;
    let encoded = read_int(block, &mut pos, 8)? as u64;
    let required = if encoded == 0 {
        0
    } else {
        // RFC 9204 4.5.1.1.
        let max_entries = (table.max_capacity() / super::qpack_table::ENTRY_OVERHEAD) as u64;
        let full_range = 2 * max_entries;
        if encoded > full_range {
            return Err(HpackError::BadIndex);
        }
        let max_value = table.inserted() + max_entries;
        let mut required = max_value / full_range * full_range + encoded - 1;
        if required > max_value {
            if required <= full_range {
                return Err(HpackError::BadIndex);
            }
            required -= full_range;
        }
        if required == 0 {
            return Err(HpackError::BadIndex);
        }
        required
    };
    let negative = *block.get(pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let delta = read_int(block, &mut pos, 7)? as u64;
    let base = if negative { required.checked_sub(delta + 1).ok_or(HpackError::BadIndex)? } else { required + delta };
    Ok(Prefix { required, base, len: pos })
}

/// A field section whose prefix is `prefix` (the table has its required
/// entries): each field in order to `field`, until it returns false.
/// `names` and `values` are scratch room for Huffman-coded strings.
pub fn decode(
    block: &[u8],
    prefix: &Prefix,
    table: &Table,
    names: &mut Vec<u8>,
    values: &mut Vec<u8>,
    mut field: impl FnMut(&[u8], &[u8]) -> bool,
) -> Result<(), u64> {
    decode_fields(block, prefix, table, names, values, &mut field).map_err(|_| code::QPACK_DECOMPRESSION_FAILED)
}

fn decode_fields(
    block: &[u8],
    prefix: &Prefix,
    table: &Table,
    names: &mut Vec<u8>,
    values: &mut Vec<u8>,
    field: &mut impl FnMut(&[u8], &[u8]) -> bool,
) -> Result<(), HpackError> {
    if prefix.required > table.inserted() {
        return Err(HpackError::BadIndex);
    }
    // An entry a line names: below the Required Insert Count, and still
    // in the table.
    let dynamic = |absolute: Option<u64>| {
        absolute.filter(|&a| a < prefix.required).and_then(|a| table.get(a)).ok_or(HpackError::BadIndex)
    };
    let before_base = |index: usize| prefix.base.checked_sub(1 + index as u64);
    let after_base = |index: usize| prefix.base.checked_add(index as u64);
    let mut pos = prefix.len;
    while pos < block.len() {
        let b = block[pos];
        let more = if b & 0x80 != 0 {
            // Indexed field line; T (0x40) names the static table.
            let index = read_int(block, &mut pos, 6)?;
            if b & 0x40 != 0 {
                let (n, v) = static_entry(index)?;
                field(n.as_bytes(), v.as_bytes())
            } else {
                let (n, v) = dynamic(before_base(index))?;
                field(n, v)
            }
        } else if b & 0xc0 == 0x40 {
            // Literal field line with name reference; T is 0x10.
            let index = read_int(block, &mut pos, 4)?;
            let name = if b & 0x10 != 0 { static_entry(index)?.0.as_bytes() } else { dynamic(before_base(index))?.0 };
            let value = string(block, &mut pos, 7, values, usize::MAX)?;
            field(name, value)
        } else if b & 0xe0 == 0x20 {
            // Literal field line with literal name: H is 0x08.
            let name = string(block, &mut pos, 3, names, usize::MAX)?;
            let value = string(block, &mut pos, 7, values, usize::MAX)?;
            field(name, value)
        } else if b & 0xf0 == 0x10 {
            // Indexed field line with post-base index.
            let (n, v) = dynamic(after_base(read_int(block, &mut pos, 4)?))?;
            field(n, v)
        } else {
            // Literal field line with post-base name reference.
            let name = dynamic(after_base(read_int(block, &mut pos, 3)?))?.0;
            let value = string(block, &mut pos, 7, values, usize::MAX)?;
            field(name, value)
        };
        if !more {
            break;
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoded with a table of capacity zero.
    fn decoded(block: &[u8]) -> Result<Vec<(String, String)>, u64> {
        let table = Table::new(0);
        let (mut n, mut v) = (Vec::new(), Vec::new());
        let mut out = Vec::new();
        let p = prefix(block, &table)?;
        decode(block, &p, &table, &mut n, &mut v, |n, v| {
            out.push((String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()));
            true
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
    fn without_a_table_a_section_that_needs_one_fails() {
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
