//! HTTP/3 frames (RFC 9114 7) over a stream's bytes, and QUIC's
//! variable-length integers (RFC 9000 16) they are made of.
//!
//! [`FrameReader`] takes a stream's bytes as they come, in pieces of any
//! size, and gives each frame's start and payload. What to do with a
//! payload is the caller's choice, frame by frame ([`Take`]): keep it
//! whole (a HEADERS or SETTINGS frame, up to a limit), hand it on as it
//! comes (DATA) or skip it (a frame type it does not know, as RFC 9114 9
//! asks). The request stream's and the control stream's rules sit on top
//! of it ([`super::stream`]).

use std::borrow::Cow;

pub mod ty {
    pub const DATA: u64 = 0x00;
    pub const HEADERS: u64 = 0x01;
    pub const CANCEL_PUSH: u64 = 0x03;
    pub const SETTINGS: u64 = 0x04;
    pub const PUSH_PROMISE: u64 = 0x05;
    pub const GOAWAY: u64 = 0x07;
    pub const MAX_PUSH_ID: u64 = 0x0d;
    /// RFC 9218 7.2: for a request stream, and for a push.
    pub const PRIORITY_UPDATE_REQUEST: u64 = 0xf0700;
    pub const PRIORITY_UPDATE_PUSH: u64 = 0xf0701;

    /// HTTP/2's frame types that HTTP/3 reserves (RFC 9114 7.2.8): a
    /// connection error wherever they come.
    pub fn is_http2_reserved(ty: u64) -> bool {
        matches!(ty, 0x02 | 0x06 | 0x08 | 0x09)
    }
}

/// Unidirectional stream types (RFC 9114 6.2, RFC 9204 4.2).
pub mod stream_type {
    pub const CONTROL: u64 = 0x00;
    pub const PUSH: u64 = 0x01;
    pub const QPACK_ENCODER: u64 = 0x02;
    pub const QPACK_DECODER: u64 = 0x03;
}

/// Settings (RFC 9114 7.2.4.1, RFC 9204 5).
pub mod setting {
    pub const QPACK_MAX_TABLE_CAPACITY: u64 = 0x01;
    pub const MAX_FIELD_SECTION_SIZE: u64 = 0x06;
    pub const QPACK_BLOCKED_STREAMS: u64 = 0x07;

    /// HTTP/2's settings that HTTP/3 reserves (RFC 9114 7.2.4.1).
    pub fn is_http2_reserved(id: u64) -> bool {
        matches!(id, 0x02..=0x05)
    }
}

/// HTTP/3 and QPACK error codes (RFC 9114 8.1, RFC 9204 6).
pub mod code {
    pub const NO_ERROR: u64 = 0x100;
    pub const GENERAL_PROTOCOL_ERROR: u64 = 0x101;
    pub const INTERNAL_ERROR: u64 = 0x102;
    pub const STREAM_CREATION_ERROR: u64 = 0x103;
    pub const CLOSED_CRITICAL_STREAM: u64 = 0x104;
    pub const FRAME_UNEXPECTED: u64 = 0x105;
    pub const FRAME_ERROR: u64 = 0x106;
    pub const EXCESSIVE_LOAD: u64 = 0x107;
    pub const ID_ERROR: u64 = 0x108;
    pub const SETTINGS_ERROR: u64 = 0x109;
    pub const MISSING_SETTINGS: u64 = 0x10a;
    pub const REQUEST_REJECTED: u64 = 0x10b;
    pub const REQUEST_CANCELLED: u64 = 0x10c;
    pub const REQUEST_INCOMPLETE: u64 = 0x10d;
    pub const MESSAGE_ERROR: u64 = 0x10e;
    pub const QPACK_DECOMPRESSION_FAILED: u64 = 0x200;
    pub const QPACK_ENCODER_STREAM_ERROR: u64 = 0x201;
    pub const QPACK_DECODER_STREAM_ERROR: u64 = 0x202;
}

/// The largest value a variable-length integer holds.
pub const VARINT_MAX: u64 = (1 << 62) - 1;

/// A variable-length integer at the start of `buf` and its length; `None`
/// when `buf` ends before it does.
pub fn read_varint(buf: &[u8]) -> Option<(u64, usize)> {
    let first = *buf.first()?;
    let len = 1usize << (first >> 6);
    let bytes = buf.get(..len)?;
    let mut v = u64::from(first & 0x3f);
    for &b in &bytes[1..] {
        v = (v << 8) | u64::from(b);
    }
    Some((v, len))
}

/// Writes `v` as a variable-length integer, in its shortest form, at the
/// start of `out` (room for 8 bytes); returns its length.
fn write_varint(out: &mut [u8], v: u64) -> usize {
    debug_assert!(v <= VARINT_MAX);
    let n = varint_len(v);
    // The length's two bits (0 to 3 for 1 to 8 bytes) at the top.
    let marked = v | (u64::from(n.trailing_zeros()) << (8 * n - 2));
    out[..n].copy_from_slice(&marked.to_be_bytes()[8 - n..]);
    n
}

/// Appends `v` as a variable-length integer, in its shortest form.
pub fn put_varint(out: &mut Vec<u8>, v: u64) {
    let mut b = [0u8; 8];
    let n = write_varint(&mut b, v);
    out.extend_from_slice(&b[..n]);
}

/// The length of `v` as a variable-length integer.
pub fn varint_len(v: u64) -> usize {
    match v {
        0..0x40 => 1,
        0x40..0x4000 => 2,
        0x4000..0x4000_0000 => 4,
        _ => 8,
    }
}

/// A frame's type and length, ahead of its payload.
pub fn put_frame_header(out: &mut Vec<u8>, ty: u64, len: u64) {
    out.extend_from_slice(FrameHeader::new(ty, len).as_bytes());
}

/// A frame's type and length as they go ahead of its payload, made on
/// the stack (a response's frames are written one header at a time).
pub struct FrameHeader {
    bytes: [u8; 16],
    len: usize,
}

impl FrameHeader {
    pub fn new(ty: u64, len: u64) -> FrameHeader {
        let mut bytes = [0u8; 16];
        let a = write_varint(&mut bytes, ty);
        let b = write_varint(&mut bytes[a..], len);
        FrameHeader { bytes, len: a + b }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// What to do with a frame's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// Gather it and give it whole; the frame must not be longer than
    /// this (else the error `EXCESSIVE_LOAD`).
    Whole(usize),
    /// Give it on piece by piece as it comes.
    Pieces,
    /// Drop it.
    Skip,
}

/// What the reader found.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    /// A frame taken [`Take::Whole`]: its type and payload.
    Whole(u64, Cow<'a, [u8]>),
    /// A piece of a frame taken [`Take::Pieces`].
    Piece(&'a [u8]),
}

/// The frames on one stream, read as its bytes come.
#[derive(Debug, Default)]
pub struct FrameReader {
    /// Bytes of a frame header that came without the rest of it (at most
    /// 16), or of a whole frame's payload gathered so far.
    partial: Vec<u8>,
    /// The frame whose payload is being read: its type, how to take it,
    /// and how much of it is still to come.
    current: Option<(u64, Take, u64)>,
}

impl FrameReader {
    /// Reads from `input` (advancing it) up to the next thing to give: a
    /// whole frame or a piece of one. `Ok(None)` when `input` is used up
    /// first. `take` is asked what to do with each frame as its header is
    /// read; its error, or `EXCESSIVE_LOAD` for a frame over its
    /// [`Take::Whole`] limit, is the reader's.
    pub fn next<'a>(
        &mut self,
        input: &mut &'a [u8],
        mut take: impl FnMut(u64, u64) -> Result<Take, u64>,
    ) -> Result<Option<Frame<'a>>, u64> {
        loop {
            let Some((ty, how, left)) = self.current else {
                if input.is_empty() {
                    return Ok(None);
                }
                let Some((ty, len)) = self.header(input) else { return Ok(None) };
                let how = take(ty, len)?;
                if let Take::Whole(limit) = how {
                    if len > limit as u64 {
                        return Err(super::frame::code::EXCESSIVE_LOAD);
                    }
                    if len == 0 {
                        return Ok(Some(Frame::Whole(ty, Cow::Borrowed(&[]))));
                    }
                }
                if len > 0 {
                    self.current = Some((ty, how, len));
                }
                continue;
            };
            if input.is_empty() {
                return Ok(None);
            }
            let n = (left.min(input.len() as u64)) as usize;
            let (piece, rest) = input.split_at(n);
            *input = rest;
            let left = left - n as u64;
            self.current = (left > 0).then_some((ty, how, left));
            match how {
                Take::Skip => {}
                Take::Pieces => return Ok(Some(Frame::Piece(piece))),
                Take::Whole(_) if left == 0 && self.partial.is_empty() => {
                    return Ok(Some(Frame::Whole(ty, Cow::Borrowed(piece))));
                }
                Take::Whole(_) => {
                    self.partial.extend_from_slice(piece);
                    if left == 0 {
                        return Ok(Some(Frame::Whole(ty, Cow::Owned(std::mem::take(&mut self.partial)))));
                    }
                }
            }
        }
    }

    /// A frame header from what came before and `input`; `None` (and what
    /// there is kept) when it is not all there yet.
    fn header(&mut self, input: &mut &[u8]) -> Option<(u64, u64)> {
        if self.partial.is_empty()
            && let Some((ty, a)) = read_varint(input)
            && let Some((len, b)) = read_varint(&input[a..])
        {
            *input = &input[a + b..];
            return Some((ty, len));
        }
        // Byte by byte: a header is at most 16 bytes, and is split only at
        // the end of a packet.
        while let Some((&b, rest)) = input.split_first() {
            self.partial.push(b);
            *input = rest;
            if let Some((ty, a)) = read_varint(&self.partial)
                && let Some((len, _)) = read_varint(&self.partial[a..])
            {
                self.partial.clear();
                return Some((ty, len));
            }
        }
        None
    }

    /// Whether the stream may end here: not inside a frame.
    pub fn at_frame_boundary(&self) -> bool {
        self.current.is_none() && self.partial.is_empty()
    }

    /// Memory held for a frame not read whole yet.
    pub fn holding(&self) -> usize {
        self.partial.capacity()
    }
}

/// A whole frame, for tests.
#[cfg(test)]
pub(crate) fn frame(ty: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_frame_header(&mut out, ty, payload.len() as u64);
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything the reader gives for `input` fed in pieces of `step`
    /// bytes: whole frames, and the pieces of DATA joined.
    fn read_all(input: &[u8], step: usize) -> Result<Vec<(u64, Vec<u8>)>, u64> {
        let mut r = FrameReader::default();
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut data = false;
        for chunk in input.chunks(step) {
            let mut c = chunk;
            while let Some(f) = r.next(&mut c, |ty, _| {
                Ok(match ty {
                    ty::DATA => Take::Pieces,
                    ty::HEADERS | ty::SETTINGS => Take::Whole(100),
                    _ => Take::Skip,
                })
            })? {
                match f {
                    Frame::Whole(ty, p) => {
                        out.push((ty, p.into_owned()));
                        data = false;
                    }
                    Frame::Piece(p) => match out.last_mut() {
                        Some((ty::DATA, d)) if data => d.extend_from_slice(p),
                        _ => {
                            out.push((ty::DATA, p.to_vec()));
                            data = true;
                        }
                    },
                }
            }
        }
        assert!(r.at_frame_boundary());
        Ok(out)
    }

    #[test]
    fn varints_round_trip_in_their_shortest_form() {
        for (v, len) in [(0u64, 1), (63, 1), (64, 2), (16_383, 2), (16_384, 4), (1 << 30, 8), (VARINT_MAX, 8)] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(out.len(), len, "{v}");
            assert_eq!(varint_len(v), len);
            assert_eq!(read_varint(&out), Some((v, len)));
            assert_eq!(read_varint(&out[..len - 1]), None, "cut short");
        }
        // RFC 9000 A.1's examples.
        assert_eq!(read_varint(&[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c]), Some((151_288_809_941_952_652, 8)));
        assert_eq!(read_varint(&[0x9d, 0x7f, 0x3e, 0x7d]), Some((494_878_333, 4)));
        assert_eq!(read_varint(&[0x7b, 0xbd]), Some((15_293, 2)));
        assert_eq!(read_varint(&[0x40, 0x25]), Some((37, 2)));
    }

    #[test]
    fn frames_read_the_same_whatever_the_pieces_they_come_in() {
        let mut input = frame(ty::HEADERS, b"head");
        input.extend(frame(0x21, &[9; 300])); // reserved type: skipped
        input.extend(frame(ty::DATA, b"hello "));
        input.extend(frame(ty::DATA, b""));
        input.extend(frame(ty::DATA, &[b'x'; 70]));
        input.extend(frame(ty::HEADERS, b""));
        for step in [1, 2, 3, 7, 64, 1000] {
            let got = read_all(&input, step).expect("frames");
            let mut body = b"hello ".to_vec();
            body.extend([b'x'; 70]);
            // Pieces of consecutive DATA frames come joined when fed whole.
            let data: Vec<u8> = got.iter().filter(|(t, _)| *t == ty::DATA).flat_map(|(_, d)| d.clone()).collect();
            assert_eq!(data, body, "step {step}");
            let heads: Vec<_> = got.iter().filter(|(t, _)| *t == ty::HEADERS).map(|(_, p)| p.clone()).collect();
            assert_eq!(heads, vec![b"head".to_vec(), Vec::new()], "step {step}");
        }
    }

    #[test]
    fn a_whole_frame_over_its_limit_is_excessive_load() {
        let input = frame(ty::HEADERS, &[0; 101]);
        assert_eq!(read_all(&input, 5), Err(code::EXCESSIVE_LOAD));
        // The limit is known from the header: nothing is gathered first.
        let mut r = FrameReader::default();
        let mut c = &input[..3];
        assert_eq!(r.next(&mut c, |_, _| Ok(Take::Whole(100))), Err(code::EXCESSIVE_LOAD));
    }

    #[test]
    fn the_callers_refusal_is_the_readers_error() {
        let input = frame(ty::GOAWAY, &[0]);
        let mut r = FrameReader::default();
        let mut c = &input[..];
        assert_eq!(r.next(&mut c, |_, _| Err(code::FRAME_UNEXPECTED)), Err(code::FRAME_UNEXPECTED));
    }

    #[test]
    fn a_stream_cut_inside_a_frame_is_not_at_a_boundary() {
        let input = frame(ty::DATA, b"abc");
        for cut in 1..input.len() {
            let mut r = FrameReader::default();
            let mut c = &input[..cut];
            while r.next(&mut c, |_, _| Ok(Take::Pieces)).expect("frames").is_some() {}
            assert!(!r.at_frame_boundary(), "cut at {cut}");
        }
    }
}
