//! HPACK's Huffman code (RFC 7541 Appendix B), decoding only.
//!
//! The code is canonical: within one length, codes count up in symbol
//! order, and each length's first code follows the last of the length
//! before, shifted. So the table below, each symbol's code length, is the
//! whole code. Decoding looks the next 12 bits up, which give one or two
//! symbols when their codes fit (the common characters take 5 to 8 bits
//! each), and finds a code longer than that by comparing against each
//! length's first code (the tests check it against the RFC's examples and
//! against the bit-at-a-time decoder it replaced).

/// A Huffman-coded string that no code sequence produces: a code not in
/// the table, padding longer than seven bits, padding not of 1s, or the
/// end-of-string symbol inside the string (RFC 7541, 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadHuffman;

/// Code length in bits of symbols 0..=255 and EOS (256).
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28,
    28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12,
    10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6,
    5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22,
    22, 23, 22, 23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22, 21, 20,
    22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23,
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28,
    27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28,
    27, 27, 27, 27, 27, 26, 30,
];

const MAX_LEN: usize = 30;
const EOS: u16 = 256;

/// Per length: the first code, the number of codes, and where its symbols
/// start in [`Canonical::symbols`].
struct Canonical {
    first_code: [u32; MAX_LEN + 1],
    count: [u32; MAX_LEN + 1],
    start: [u16; MAX_LEN + 1],
    /// Symbols in (length, symbol) order.
    symbols: [u16; 257],
}

const fn build() -> Canonical {
    let mut c =
        Canonical { first_code: [0; MAX_LEN + 1], count: [0; MAX_LEN + 1], start: [0; MAX_LEN + 1], symbols: [0; 257] };
    let mut s = 0;
    while s < 257 {
        c.count[CODE_LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let mut code = 0u32;
    let mut next = 0u16;
    let mut len = 1;
    while len <= MAX_LEN {
        c.first_code[len] = code;
        c.start[len] = next;
        let mut s = 0;
        while s < 257 {
            if CODE_LENGTHS[s] as usize == len {
                c.symbols[next as usize] = s as u16;
                next += 1;
            }
            s += 1;
        }
        code = (code + c.count[len]) << 1;
        len += 1;
    }
    c
}

static CANONICAL: Canonical = build();

/// The bits a look-up takes.
const LOOKUP_BITS: u32 = 12;

/// What the next [`LOOKUP_BITS`] bits start with: the first symbol and
/// its code's length (0: a code longer than the look-up), and when a
/// second code fits in the rest, that symbol and both codes' length
/// (else `len` is `len0`).
#[derive(Clone, Copy)]
struct Lookup {
    s0: u8,
    s1: u8,
    len0: u8,
    len: u8,
}

static LOOKUP: [Lookup; 1 << LOOKUP_BITS] = lookup(&CANONICAL);

/// The symbol whose code of at most `max` bits starts `bits` (the look-up's
/// width, left-aligned at bit `width - 1`), and the code's length.
const fn first_code(c: &Canonical, bits: u32, width: u32, max: u32) -> Option<(u16, u32)> {
    let mut len = 1;
    while len <= max {
        if let Some(symbol) = symbol_of(c, len as usize, bits >> (width - len)) {
            return Some((symbol, len));
        }
        len += 1;
    }
    None
}

const fn lookup(c: &Canonical) -> [Lookup; 1 << LOOKUP_BITS] {
    let mut t = [Lookup { s0: 0, s1: 0, len0: 0, len: 0 }; 1 << LOOKUP_BITS];
    let mut i = 0u32;
    while i < 1 << LOOKUP_BITS {
        if let Some((s0, len0)) = first_code(c, i, LOOKUP_BITS, LOOKUP_BITS) {
            let mut e = Lookup { s0: s0 as u8, s1: 0, len0: len0 as u8, len: len0 as u8 };
            let rest = LOOKUP_BITS - len0;
            let tail = i & ((1 << rest) - 1);
            if let Some((s1, len1)) = first_code(c, tail, rest, rest) {
                e.s1 = s1 as u8;
                e.len = (len0 + len1) as u8;
            }
            t[i as usize] = e;
        }
        i += 1;
    }
    t
}

/// The symbol whose code is `code`, `len` bits long, if there is one.
#[inline]
const fn symbol_of(c: &Canonical, len: usize, code: u32) -> Option<u16> {
    let offset = code.wrapping_sub(c.first_code[len]);
    if offset < c.count[len] { Some(c.symbols[(c.start[len] as u32 + offset) as usize]) } else { None }
}

/// Appends the decoded bytes of `src` to `out` (nothing on an error).
pub fn decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), BadHuffman> {
    let base = out.len();
    // Each code takes at least 5 bits; a pair's second symbol is written
    // whether or not it counts, so one byte more.
    out.resize(base + src.len() * 8 / 5 + 2, 0);
    let decoded = decode_into(src, &mut out[base..]);
    out.truncate(base + decoded.unwrap_or(0));
    decoded.map(|_| ())
}

/// Decodes `src` into `buf` (room for every symbol it could hold and one
/// more): how many bytes.
///
/// The bits wait left-aligned in a 64-bit word, refilled four bytes at a
/// time while there are four; one look-up of the next 12 bits takes one or
/// two codes of that much, a longer one is found by length as the
/// canonical code allows. Past the input the word holds zeros, so a code
/// the look-up finds counts only if the input has all its bits.
fn decode_into(src: &[u8], buf: &mut [u8]) -> Result<usize, BadHuffman> {
    let c = &CANONICAL;
    let (mut acc, mut bits, mut next, mut o) = (0u64, 0u32, 0usize, 0usize);
    loop {
        if bits < 32 {
            if let Some(&[b0, b1, b2, b3]) = src.get(next..next + 4) {
                acc |= u64::from(u32::from_be_bytes([b0, b1, b2, b3])) << (32 - bits);
                bits += 32;
                next += 4;
            } else {
                while bits <= 56 && next < src.len() {
                    acc |= u64::from(src[next]) << (56 - bits);
                    bits += 8;
                    next += 1;
                }
            }
        }
        if bits == 0 {
            return Ok(o);
        }
        let e = LOOKUP[(acc >> (64 - LOOKUP_BITS)) as usize];
        if e.len0 != 0 {
            if u32::from(e.len) <= bits {
                buf[o] = e.s0;
                buf[o + 1] = e.s1;
                o += 1 + usize::from(e.len > e.len0);
                acc <<= e.len;
                bits -= u32::from(e.len);
                continue;
            }
            if u32::from(e.len0) <= bits {
                buf[o] = e.s0;
                o += 1;
                acc <<= e.len0;
                bits -= u32::from(e.len0);
                continue;
            }
        }
        let mut len = (LOOKUP_BITS as usize + 1).min(bits as usize + 1);
        let mut found = false;
        while len <= MAX_LEN && len <= bits as usize {
            if let Some(symbol) = symbol_of(c, len, (acc >> (64 - len)) as u32) {
                if symbol == EOS {
                    return Err(BadHuffman);
                }
                buf[o] = symbol as u8;
                o += 1;
                acc <<= len;
                bits -= len as u32;
                found = true;
                break;
            }
            len += 1;
        }
        if found {
            continue;
        }
        // No code fits what is left: padding, if the input is used up
        // (fewer than 8 bits, all ones: the start of EOS); else a code
        // not in the table.
        if next < src.len() || bits > 7 || acc >> (64 - bits) != (1 << bits) - 1 {
            return Err(BadHuffman);
        }
        return Ok(o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decoder as it was, a bit at a time: the reference.
    fn decode_bitwise(src: &[u8], out: &mut Vec<u8>) -> Result<(), BadHuffman> {
        let c = &CANONICAL;
        let mut code = 0u32;
        let mut len = 0usize;
        for &byte in src {
            for bit in (0..8).rev() {
                code = (code << 1) | u32::from(byte >> bit & 1);
                len += 1;
                if let Some(symbol) = symbol_of(c, len, code) {
                    if symbol == EOS {
                        return Err(BadHuffman);
                    }
                    out.push(symbol as u8);
                    code = 0;
                    len = 0;
                } else if len == MAX_LEN {
                    return Err(BadHuffman);
                }
            }
        }
        // What is left must be padding: fewer than 8 bits, all ones (the
        // start of EOS).
        if len > 7 || code != (1 << len) - 1 {
            return Err(BadHuffman);
        }
        Ok(())
    }

    #[test]
    fn the_fast_decoder_agrees_with_the_bitwise_one() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for round in 0..20_000 {
            // Mostly short strings; every fifth up to 400 bytes (the
            // look-up's four-byte refills and the byte-wise tail).
            let len = (next() % if round % 5 == 0 { 400 } else { 24 }) as usize;
            // Half random bytes (mostly invalid), half real codes (valid,
            // or damaged in one byte).
            let mut input: Vec<u8> = if round % 2 == 0 {
                (0..len).map(|_| next() as u8).collect()
            } else {
                let text: Vec<u8> = (0..len).map(|_| next() as u8 & if round % 4 == 1 { 0x7f } else { 0xff }).collect();
                encode(&text)
            };
            if round % 8 == 3 && !input.is_empty() {
                let at = next() as usize % input.len();
                input[at] ^= 1 << (next() % 8);
            }
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            let a = decode(&input, &mut fast);
            let b = decode_bitwise(&input, &mut slow);
            assert_eq!(a, b, "verdicts differ on {input:02x?}");
            if a.is_ok() {
                assert_eq!(fast, slow, "output differs on {input:02x?}");
            }
        }
    }

    /// A straightforward canonical encoder, for the tests only.
    fn encode(src: &[u8]) -> Vec<u8> {
        let c = &CANONICAL;
        let mut codes = [0u32; 257];
        for len in 1..=MAX_LEN {
            for i in 0..c.count[len] {
                codes[c.symbols[(c.start[len] as u32 + i) as usize] as usize] = c.first_code[len] + i;
            }
        }
        let (mut acc, mut bits, mut out) = (0u64, 0u32, Vec::new());
        for &b in src {
            let len = u32::from(CODE_LENGTHS[b as usize]);
            acc = (acc << len) | u64::from(codes[b as usize]);
            bits += len;
            while bits >= 8 {
                bits -= 8;
                out.push((acc >> bits) as u8);
            }
        }
        if bits > 0 {
            let pad = 8 - bits;
            out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
        }
        out
    }

    #[test]
    fn rfc7541_examples() {
        // C.4.1 and C.6.1.
        let www = [0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff];
        let mut out = Vec::new();
        decode(&www, &mut out).expect("decodes");
        assert_eq!(out, b"www.example.com");
        assert_eq!(encode(b"www.example.com"), www);
        let private = [0xae, 0xc3, 0x77, 0x1a, 0x4b];
        out.clear();
        decode(&private, &mut out).expect("decodes");
        assert_eq!(out, b"private");
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        let mut out = Vec::new();
        decode(&encode(&all), &mut out).expect("decodes");
        assert_eq!(out, all);
    }

    #[test]
    fn eos_and_bad_padding_are_refused() {
        // EOS itself (30 ones), padded.
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xff], &mut Vec::new()), Err(BadHuffman));
        // Eight bits of padding.
        let mut a = encode(b"a");
        a.push(0xff);
        assert_eq!(decode(&a, &mut Vec::new()), Err(BadHuffman));
        // Padding of zeros: 'a' is 00011 (5 bits), then 000.
        assert_eq!(decode(&[0b0001_1000], &mut Vec::new()), Err(BadHuffman));
        assert_eq!(decode(&[0b0001_1111], &mut Vec::new()), Ok(()));
    }
}
