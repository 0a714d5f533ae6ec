use super::*;
use crate::h3::qpack::{Prefix, decode, prefix};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or(0)).collect()
}

fn fields(block: &[u8], table: &Table) -> Result<(Prefix, Vec<(String, String)>), u64> {
    let p = prefix(block, table)?;
    let mut out = Vec::new();
    decode(block, &p, table, &mut Vec::new(), &mut Vec::new(), |n, v| {
        out.push((String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()));
        true
    })?;
    Ok((p, out))
}

/// What the decoder stream would send now, taken.
fn take(said: &mut DecoderInstructions, table: &Table) -> Option<Vec<u8>> {
    said.count_inserts(table);
    let owed = said.owed().to_vec();
    said.sent(owed.len());
    (!owed.is_empty()).then_some(owed)
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

fn entries(table: &Table) -> Vec<(String, String)> {
    let first = table.inserted() - table.entries.len() as u64;
    (first..table.inserted())
        .filter_map(|i| table.get(i))
        .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
        .collect()
}

/// RFC 9204 Appendix B.2 to B.5, step by step: the table after each
/// encoder stream piece, each section's fields, and what the decoder
/// stream says.
#[test]
fn rfc_9204_appendix_b_dynamic_table() {
    let mut table = Table::new(220);
    let mut enc = EncoderStream::default();
    let mut said = DecoderInstructions::default();
    // B.2: capacity 220, two insertions with static name references.
    let inserted = enc.read(&mut table, &hex("3fbd01c00f7777772e6578616d706c652e636f6dc10c2f73616d706c652f70617468"));
    assert_eq!(inserted, Ok(2));
    assert_eq!((table.size(), table.inserted()), (106, 2));
    let block = hex("03811011");
    let (p, got) = fields(&block, &table).expect("stream 4 decodes");
    assert_eq!(got, pairs(&[(":authority", "www.example.com"), (":path", "/sample/path")]));
    assert_eq!(p.required, 2);
    said.section_decoded(4, p.required);
    assert_eq!(take(&mut said, &table), Some(vec![0x84]), "Section Acknowledgment for stream 4, nothing to increment");
    // B.3: a literal name.
    assert_eq!(enc.read(&mut table, &hex("4a637573746f6d2d6b65790c637573746f6d2d76616c7565")), Ok(1));
    assert_eq!(table.size(), 160);
    assert_eq!(take(&mut said, &table), Some(vec![0x01]), "Insert Count Increment 1");
    // B.4: a duplicate, then stream 8 names three entries; it is cancelled.
    assert_eq!(enc.read(&mut table, &[0x02]), Ok(1));
    assert_eq!(table.size(), 217);
    let (p, got) = fields(&hex("050080c181"), &table).expect("stream 8 decodes");
    assert_eq!(p.required, 4);
    assert_eq!(got, pairs(&[(":authority", "www.example.com"), (":path", "/"), ("custom-key", "custom-value")]));
    said.stream_cancelled(8);
    assert_eq!(take(&mut said, &table), Some(vec![0x48, 0x01]), "Stream Cancellation 8, Insert Count Increment 1");
    // B.5: a dynamic name reference; the oldest entry is evicted.
    assert_eq!(enc.read(&mut table, &hex("810d637573746f6d2d76616c756532")), Ok(1));
    assert_eq!(table.size(), 215);
    assert_eq!(
        entries(&table),
        pairs(&[
            (":path", "/sample/path"),
            ("custom-key", "custom-value"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value2"),
        ])
    );
    assert_eq!(table.get(0), None, "evicted");
    assert_eq!(take(&mut said, &table), Some(vec![0x01]));
    assert_eq!(take(&mut said, &table), None);
}

#[test]
fn the_encoder_stream_reads_the_same_in_any_pieces() {
    let stream = hex(
        "3fbd01c00f7777772e6578616d706c652e636f6dc10c2f73616d706c652f706174684a637573746f6d2d6b65790c637573746f6d2d76616c756502810d637573746f6d2d76616c756532",
    );
    let mut whole = Table::new(220);
    assert_eq!(EncoderStream::default().read(&mut whole, &stream), Ok(5));
    for step in 1..8 {
        let mut t = Table::new(220);
        let mut enc = EncoderStream::default();
        let mut n = 0;
        for piece in stream.chunks(step) {
            n += enc.read(&mut t, piece).expect("pieces apply");
        }
        assert_eq!(n, 5);
        assert_eq!((entries(&t), t.size()), (entries(&whole), whole.size()), "pieces of {step}");
        assert!(enc.partial.is_empty());
    }
}

#[test]
fn what_does_not_fit_the_table_is_an_encoder_stream_error() {
    let fail = Err(code::QPACK_ENCODER_STREAM_ERROR);
    let read = |max: usize, bytes: &[u8]| EncoderStream::default().read(&mut Table::new(max), bytes);
    // A capacity above the announced one.
    assert_eq!(read(100, &[0x3f, 0x46]), fail, "capacity 101");
    assert_eq!(read(100, &[0x3f, 0x45]), Ok(0), "capacity 100");
    // Any insertion while the capacity is zero (the table's start).
    assert_eq!(read(100, &hex("c00178")), fail);
    // An entry larger than the capacity: 32 + 10 + 5 > 46.
    assert_eq!(read(100, &hex("3f0fc00568656c6c6f")), fail, "insert into capacity 46");
    assert_eq!(read(100, &hex("3f10c00568656c6c6f")), Ok(1), "insert into capacity 47");
    // Relative indexes past the table, and a static index past its end.
    assert_eq!(read(100, &hex("3f45800178")), fail, "dynamic name of an empty table");
    assert_eq!(read(100, &hex("3f4500")), fail, "duplicate of an empty table");
    assert_eq!(read(100, &hex("3f45ff240178")), fail, "static 99");
    assert_eq!(read(100, &hex("3f45c00178" /* one entry */).into_iter().chain([0x01]).collect::<Vec<_>>()), fail);
    // A string longer than any entry the table could hold is refused
    // before its bytes are waited for.
    assert_eq!(read(100, &hex("3f45c07f8004")), fail, "a value of 639 bytes announced");
    // Bad Huffman.
    assert_eq!(read(100, &hex("3f45c081ff")), fail);
}

#[test]
fn a_partial_instruction_is_held_and_bounded() {
    let mut t = Table::new(4096);
    let mut enc = EncoderStream::default();
    // Capacity, then the start of an insertion of a 300-byte value.
    assert_eq!(enc.read(&mut t, &hex("3fe11f")), Ok(0));
    assert_eq!(enc.read(&mut t, &hex("c07fad01")), Ok(0));
    assert_eq!(enc.partial.len(), 4);
    assert_eq!(enc.read(&mut t, &[b'a'; 299]), Ok(0));
    assert_eq!(enc.read(&mut t, &[b'a', 0x00]), Ok(2), "the value and a duplicate");
    assert!(enc.partial.is_empty());
    assert_eq!(t.get(1).map(|(n, v)| (n.len(), v.len())), Some((10, 300)));
}

#[test]
fn sections_name_only_entries_below_their_required_count_and_still_there() {
    let mut t = Table::new(220);
    let mut enc = EncoderStream::default();
    assert_eq!(enc.read(&mut t, &hex("3fbd01c00f7777772e6578616d706c652e636f6dc10c2f73616d706c652f70617468")), Ok(2));
    let fail = Err(code::QPACK_DECOMPRESSION_FAILED);
    // Required 1 (encoded 2), base 1: relative 0 is entry 0.
    assert_eq!(fields(&hex("020080"), &t).map(|r| r.1), Ok(pairs(&[(":authority", "www.example.com")])));
    // Entry 1 is not below a required count of 1.
    assert_eq!(fields(&hex("020010"), &t).map(|r| r.1), fail, "post-base past the required count");
    assert_eq!(fields(&hex("020081"), &t).map(|r| r.1), fail, "before the first entry");
    // A base below zero; an encoded count past twice the table's entries.
    assert_eq!(fields(&hex("0281"), &t).map(|r| r.1), fail);
    assert_eq!(fields(&hex("0f00"), &t).map(|r| r.1), fail);
    // Entries evicted: required 2 decodes; once entry 0 is gone it fails.
    assert!(fields(&hex("03811011"), &t).is_ok());
    assert_eq!(enc.read(&mut t, &hex("4a637573746f6d2d6b65790c637573746f6d2d76616c756502")), Ok(2));
    assert_eq!(enc.read(&mut t, &hex("810d637573746f6d2d76616c756532")), Ok(1));
    assert_eq!(fields(&hex("03811011"), &t).map(|r| r.1), fail, "entry 0 evicted");
    // A section needing more than has arrived is not decoded (the caller
    // holds it until the entries come).
    let p = prefix(&hex("078010"), &t).expect("a prefix");
    assert_eq!(p.required, 6);
    assert!(p.required > t.inserted());
}

/// RFC 9204 4.5.1.1: the encoded Required Insert Count wraps at twice the
/// table's most entries; the decoder takes the value nearest its own count.
#[test]
fn the_required_insert_count_wraps() {
    let max_entries = 100 / ENTRY_OVERHEAD as u64; // 3
    let mut t = Table::new(100);
    let mut enc = EncoderStream::default();
    assert_eq!(enc.read(&mut t, &[0x3f, 0x45]), Ok(0));
    for n in 1..40u64 {
        // An empty name and value: 32 bytes, three fit.
        assert_eq!(enc.read(&mut t, &hex("4000")), Ok(1), "insert {n}");
        assert!(t.size() <= 100);
        for required in n.saturating_sub(max_entries - 1).max(1)..=n + max_entries {
            let encoded = required % (2 * max_entries) + 1;
            let block = [encoded as u8, 0x00];
            assert_eq!(prefix(&block, &t).map(|p| p.required), Ok(required), "inserted {n}, required {required}");
        }
    }
}

#[test]
fn a_section_stops_when_the_receiver_says() {
    let mut t = Table::new(4096);
    let big = "v".repeat(1000);
    let mut insert = hex("3fe11f");
    // "big", then a length of 1000: 127 in the prefix, 873 in two bytes.
    insert.extend([0x43, b'b', b'i', b'g', 0x7f, 0xe9, 0x06]);
    insert.extend(big.as_bytes());
    assert_eq!(EncoderStream::default().read(&mut t, &insert), Ok(1));
    // A bomb: 10,000 one-byte references to a 1 KB entry.
    let mut block = vec![0x02, 0x00];
    block.extend(std::iter::repeat_n(0x80, 10_000));
    let p = prefix(&block, &t).expect("a prefix");
    let mut seen = 0usize;
    let r = decode(&block, &p, &t, &mut Vec::new(), &mut Vec::new(), |n, v| {
        seen += n.len() + v.len();
        seen < 64 * 1024
    });
    assert_eq!(r, Ok(()));
    assert_eq!(seen, 66 * 1003, "stopped at the first field past the limit");
}

/// Field sections from ls-qpack's encoder (the one aioquic runs), with a
/// dynamic table of several capacities: each decodes to the fields it was
/// made from. A section read before its encoder stream data that names
/// entries not yet there is seen to block.
#[test]
fn sections_from_ls_qpack_decode() {
    let text = include_str!("testdata/qpack_lsqpack.txt");
    let (mut table, mut enc) = (Table::new(0), EncoderStream::default());
    let (mut block, mut want, mut sections, mut blocked, mut dynamic) = (Vec::new(), Vec::new(), 0, 0, 0);
    let mut pending = Vec::new();
    for line in text.lines() {
        let (kind, rest) = line.split_once(' ').unwrap_or((line, ""));
        match kind {
            "conn" => {
                table = Table::new(rest.parse().unwrap_or(0));
                enc = EncoderStream::default();
            }
            "enc" => pending = hex(rest),
            "sec" => block = hex(rest.split_once(' ').map_or("", |s| s.1)),
            "f" => {
                let (n, v) = rest.split_once('\t').unwrap_or((rest, ""));
                want.push((n.to_string(), v.to_string()));
            }
            "end" => {
                if let Ok(p) = prefix(&block, &table)
                    && p.required > table.inserted()
                {
                    blocked += 1;
                    assert!(!pending.is_empty(), "blocked with nothing to come");
                }
                enc.read(&mut table, &pending).expect("ls-qpack's encoder stream applies");
                let (p, got) = fields(&block, &table).expect("ls-qpack's section decodes");
                assert_eq!(got, want, "section {sections}");
                dynamic += usize::from(p.required > 0);
                sections += 1;
                want.clear();
            }
            _ => panic!("unknown line {line}"),
        }
    }
    assert_eq!(sections, 180);
    assert!(dynamic > 100, "{dynamic} sections named the dynamic table");
    assert!(blocked > 10, "{blocked} sections would have blocked");
}
