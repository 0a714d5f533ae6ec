//! The HPACK decoder (`h2::hpack`, RFC 7541). Input: header blocks, each
//! a length byte and that many bytes, decoded in order on one connection
//! (so the dynamic table carries over).
//!
//! Properties: the decoder agrees with loona-hpack (a maintained fork of
//! the `hpack` crate, fuzzed on its own) field for field, and on which
//! blocks are errors, but for two rules where they differ on purpose (a
//! block may not end with a table size update, loona-hpack says; a size
//! update may not follow a field, RFC 7541 §4.2 and Gatehouse say); the fields of each block, encoded again
//! by Gatehouse's encoder and decoded by a fresh decoder, come back the
//! same.

use gatehouse_l7::h2::hpack::{Decoder, Encoder, HpackError, TABLE_SIZE};

use loona_hpack::decoder::DecoderError;

use crate::input::Input;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

pub fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let mut ours = Decoder::default();
    let mut theirs = loona_hpack::Decoder::new();
    theirs.set_max_allowed_table_size(TABLE_SIZE);
    while !input.is_empty() {
        let block = input.piece();
        let mut got: Fields = Vec::new();
        let mine = ours.decode(block, |n, v| got.push((n.to_vec(), v.to_vec())));
        let reference = theirs.decode(block);
        match (&mine, &reference) {
            (Ok(()), Ok(list)) => assert_eq!(&got, list, "fields differ from loona-hpack"),
            (Ok(()), Err(DecoderError::SizeUpdateAtEnd)) => return,
            // RFC 7541 §4.2: a size update comes before the block's first
            // field; loona-hpack takes one anywhere.
            (Err(HpackError::BadSizeUpdate), Ok(list)) if !list.is_empty() => return,
            (Err(_), Err(_)) => return,
            _ => panic!("verdicts differ: ours {mine:?}, loona-hpack {:?}", reference.map(|l| l.len())),
        }
        round_trip(&got);
    }
}

fn round_trip(fields: &Fields) {
    let mut enc = Encoder::default();
    let mut out = Vec::new();
    enc.begin_block(&mut out);
    for (n, v) in fields {
        // The encoder takes lower-case names, as the server sends them.
        let Ok(name) = std::str::from_utf8(n) else { return };
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return;
        }
        enc.field(&mut out, name, v);
    }
    let mut back: Fields = Vec::new();
    let r = Decoder::default().decode(&out, |n, v| back.push((n.to_vec(), v.to_vec())));
    assert!(r.is_ok(), "our own block does not decode: {r:?}");
    assert_eq!(&back, fields, "fields differ after encoding and decoding again");
}
