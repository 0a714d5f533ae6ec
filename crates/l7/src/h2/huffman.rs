//! HPACK's Huffman code (RFC 7541 Appendix B), decoding only.
//!
//! The code is canonical: within one length, codes count up in symbol
//! order, and each length's first code follows the last of the length
//! before, shifted. So the table below, each symbol's code length, is the
//! whole code, and decoding walks one bit at a time comparing against each
//! length's first code (the tests check it against the RFC's examples).

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

/// Appends the decoded bytes of `src` to `out`.
pub fn decode(src: &[u8], out: &mut Vec<u8>) -> Result<(), BadHuffman> {
    let c = &CANONICAL;
    let mut code = 0u32;
    let mut len = 0usize;
    for &byte in src {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from(byte >> bit & 1);
            len += 1;
            let offset = code.wrapping_sub(c.first_code[len]);
            if offset < c.count[len] {
                let symbol = c.symbols[(c.start[len] as u32 + offset) as usize];
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

#[cfg(test)]
mod tests {
    use super::*;

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
