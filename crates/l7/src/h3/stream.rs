//! What HTTP/3 allows on each kind of stream a client opens (RFC 9114 4.1,
//! 6.2, 7.2; RFC 9204 4.2), over [`FrameReader`]: a request stream's
//! HEADERS, DATA and trailers in that order; the control stream's SETTINGS
//! first and once; and the client's QPACK decoder stream, which this
//! server's encoder (it uses no dynamic table) gives nothing to
//! acknowledge. The client's encoder stream is read by
//! [`super::qpack_table`]. A breach is the error code the connection
//! closes with.

use std::borrow::Cow;

use super::frame::{Frame, FrameReader, Take, code, read_varint, setting, ty};

/// The largest control frame payload read whole (SETTINGS, GOAWAY,
/// MAX_PUSH_ID): a client's SETTINGS are a few pairs of integers.
const CONTROL_FRAME_MAX: usize = 4096;

/// What a request stream gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// The request's field section (QPACK-encoded).
    Head(Cow<'a, [u8]>),
    /// A piece of the body.
    Data(&'a [u8]),
    /// The trailer section (QPACK-encoded).
    Trailers(Cow<'a, [u8]>),
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    #[default]
    Head,
    Body,
    /// After the trailers: only frames of unknown types may follow.
    Done,
}

/// A request stream's frames, in the order RFC 9114 4.1 allows.
#[derive(Debug, Default)]
pub struct RequestReader {
    frames: FrameReader,
    phase: Phase,
}

impl RequestReader {
    /// The next thing `input` (advanced past it) gives; `Ok(None)` when it
    /// is used up first. A HEADERS frame over `max_head` bytes is
    /// `EXCESSIVE_LOAD`.
    pub fn next<'a>(&mut self, input: &mut &'a [u8], max_head: usize) -> Result<Option<Request<'a>>, u64> {
        let phase = &mut self.phase;
        let frame = self.frames.next(input, |t, _| match t {
            ty::HEADERS => {
                *phase = match *phase {
                    Phase::Head => Phase::Body,
                    Phase::Body => Phase::Done,
                    Phase::Done => return Err(code::FRAME_UNEXPECTED),
                };
                Ok(Take::Whole(max_head))
            }
            ty::DATA if *phase == Phase::Body => Ok(Take::Pieces),
            ty::DATA | ty::CANCEL_PUSH | ty::SETTINGS | ty::PUSH_PROMISE | ty::GOAWAY | ty::MAX_PUSH_ID => {
                Err(code::FRAME_UNEXPECTED)
            }
            t if ty::is_http2_reserved(t) => Err(code::FRAME_UNEXPECTED),
            // Unknown types (and PRIORITY_UPDATE, which belongs on the
            // control stream but names no state here) are skipped.
            _ => Ok(Take::Skip),
        })?;
        Ok(frame.map(|f| match f {
            Frame::Whole(_, block) if self.phase == Phase::Body => Request::Head(block),
            Frame::Whole(_, block) => Request::Trailers(block),
            Frame::Piece(p) => Request::Data(p),
        }))
    }

    /// The client ended the stream here: whether that is allowed.
    pub fn end(&self) -> Result<(), u64> {
        if !self.frames.at_frame_boundary() {
            return Err(code::FRAME_ERROR);
        }
        if self.phase == Phase::Head {
            return Err(code::REQUEST_INCOMPLETE);
        }
        Ok(())
    }

    /// Whether nothing has been read yet.
    pub fn is_fresh(&self) -> bool {
        self.phase == Phase::Head && self.frames.at_frame_boundary()
    }
}

/// The client's settings this server heeds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The largest field section the client takes (RFC 9114 4.2.2).
    pub max_field_section_size: Option<u64>,
}

/// What the control stream gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Control {
    Settings(Settings),
    /// The client will start no request past this one (RFC 9114 5.2).
    GoAway(u64),
    /// A request's new priority (RFC 9218 7.2): its stream and the
    /// priority field value.
    PriorityUpdate(u64, Vec<u8>),
}

/// The client's control stream (RFC 9114 6.2.1).
#[derive(Debug, Default)]
pub struct ControlReader {
    frames: FrameReader,
    settings_seen: bool,
}

impl ControlReader {
    pub fn next(&mut self, input: &mut &[u8]) -> Result<Option<Control>, u64> {
        let seen = &mut self.settings_seen;
        let frame = self.frames.next(input, |t, _| {
            if !*seen && t != ty::SETTINGS {
                return Err(code::MISSING_SETTINGS);
            }
            match t {
                ty::SETTINGS if *seen => Err(code::FRAME_UNEXPECTED),
                ty::SETTINGS => {
                    *seen = true;
                    Ok(Take::Whole(CONTROL_FRAME_MAX))
                }
                ty::GOAWAY | ty::MAX_PUSH_ID => Ok(Take::Whole(8)),
                ty::PRIORITY_UPDATE_REQUEST => Ok(Take::Whole(CONTROL_FRAME_MAX)),
                // This server promises no push: no push ID can be named.
                ty::CANCEL_PUSH => Err(code::ID_ERROR),
                ty::DATA | ty::HEADERS | ty::PUSH_PROMISE => Err(code::FRAME_UNEXPECTED),
                t if ty::is_http2_reserved(t) => Err(code::FRAME_UNEXPECTED),
                _ => Ok(Take::Skip),
            }
        })?;
        match frame {
            None => Ok(None),
            Some(Frame::Whole(ty::SETTINGS, payload)) => settings(&payload).map(|s| Some(Control::Settings(s))),
            Some(Frame::Whole(ty::PRIORITY_UPDATE_REQUEST, payload)) => match read_varint(&payload) {
                // Only a client's request stream can be named.
                Some((id, n)) if id % 4 == 0 => Ok(Some(Control::PriorityUpdate(id, payload[n..].to_vec()))),
                Some(_) => Err(code::ID_ERROR),
                None => Err(code::FRAME_ERROR),
            },
            Some(Frame::Whole(t, payload)) => match read_varint(&payload) {
                Some((id, n)) if n == payload.len() && t == ty::GOAWAY => Ok(Some(Control::GoAway(id))),
                // MAX_PUSH_ID: nothing to do without push.
                Some((_, n)) if n == payload.len() => self.next(input),
                _ => Err(code::FRAME_ERROR),
            },
            Some(Frame::Piece(_)) => Err(code::INTERNAL_ERROR),
        }
    }
}

/// A SETTINGS payload (RFC 9114 7.2.4): identifier and value pairs, each
/// identifier once, none of HTTP/2's.
fn settings(mut p: &[u8]) -> Result<Settings, u64> {
    let mut s = Settings::default();
    let mut seen: Vec<u64> = Vec::new();
    while !p.is_empty() {
        let (id, a) = read_varint(p).ok_or(code::FRAME_ERROR)?;
        let (value, b) = read_varint(&p[a..]).ok_or(code::FRAME_ERROR)?;
        p = &p[a + b..];
        if setting::is_http2_reserved(id) || seen.contains(&id) {
            return Err(code::SETTINGS_ERROR);
        }
        seen.push(id);
        if id == setting::MAX_FIELD_SECTION_SIZE {
            s.max_field_section_size = Some(value);
        }
        // QPACK_MAX_TABLE_CAPACITY and QPACK_BLOCKED_STREAMS would let
        // this server's encoder use a dynamic table; it uses none.
        let _ = (setting::QPACK_MAX_TABLE_CAPACITY, setting::QPACK_BLOCKED_STREAMS);
    }
    Ok(s)
}

/// The client's QPACK decoder stream (RFC 9204 4.4). This server's field
/// sections never name the dynamic table, so a Section Acknowledgment or
/// an Insert Count Increment is `QPACK_DECODER_STREAM_ERROR`; Stream
/// Cancellations (a 6-bit prefix integer) are read and need nothing.
#[derive(Debug, Default)]
pub struct DecoderStream {
    /// Inside a Stream Cancellation's integer, in its continuation bytes.
    continuing: bool,
}

impl DecoderStream {
    pub fn read(&mut self, input: &[u8]) -> Result<(), u64> {
        for &b in input {
            if self.continuing {
                self.continuing = b & 0x80 != 0;
            } else if b & 0xc0 == 0x40 {
                self.continuing = b & 0x3f == 0x3f;
            } else {
                return Err(code::QPACK_DECODER_STREAM_ERROR);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h3::frame::frame;

    fn request(input: &[u8]) -> Result<Vec<String>, u64> {
        let mut r = RequestReader::default();
        let mut c = input;
        let mut out = Vec::new();
        while let Some(x) = r.next(&mut c, 64)? {
            out.push(match x {
                Request::Head(b) => format!("head {}", String::from_utf8_lossy(&b)),
                Request::Data(d) => format!("data {}", String::from_utf8_lossy(d)),
                Request::Trailers(b) => format!("trailers {}", String::from_utf8_lossy(&b)),
            });
        }
        r.end()?;
        Ok(out)
    }

    #[test]
    fn a_request_is_head_then_data_then_trailers() {
        let mut input = frame(ty::HEADERS, b"h");
        input.extend(frame(0x1f * 7 + 0x21, b"grease"));
        input.extend(frame(ty::DATA, b"d1"));
        input.extend(frame(ty::HEADERS, b"t"));
        input.extend(frame(0x21, b""));
        assert_eq!(request(&input), Ok(vec!["head h".into(), "data d1".into(), "trailers t".into()]));
    }

    #[test]
    fn frames_out_of_order_or_out_of_place_are_refused() {
        // DATA before HEADERS.
        assert_eq!(request(&frame(ty::DATA, b"x")), Err(code::FRAME_UNEXPECTED));
        // Anything but unknown frames after the trailers.
        let mut input = frame(ty::HEADERS, b"h");
        input.extend(frame(ty::HEADERS, b"t"));
        let mut more = input.clone();
        more.extend(frame(ty::DATA, b"x"));
        assert_eq!(request(&more), Err(code::FRAME_UNEXPECTED));
        let mut more = input.clone();
        more.extend(frame(ty::HEADERS, b"x"));
        assert_eq!(request(&more), Err(code::FRAME_UNEXPECTED));
        // Control frames, push promises and HTTP/2's types.
        for t in [ty::SETTINGS, ty::GOAWAY, ty::MAX_PUSH_ID, ty::CANCEL_PUSH, ty::PUSH_PROMISE, 0x02, 0x06, 0x08, 0x09]
        {
            let mut input = frame(ty::HEADERS, b"h");
            input.extend(frame(t, &[0]));
            assert_eq!(request(&input), Err(code::FRAME_UNEXPECTED), "type {t:#x}");
        }
    }

    #[test]
    fn a_request_stream_ends_only_after_a_head_and_between_frames() {
        assert_eq!(request(b""), Err(code::REQUEST_INCOMPLETE));
        let input = frame(ty::HEADERS, b"h");
        assert_eq!(request(&input[..input.len() - 1]), Err(code::FRAME_ERROR));
        assert_eq!(request(&input[..1]), Err(code::FRAME_ERROR));
        assert_eq!(request(&frame(ty::HEADERS, &[b'a'; 65])), Err(code::EXCESSIVE_LOAD));
    }

    fn control(input: &[u8]) -> Result<Vec<Control>, u64> {
        let mut r = ControlReader::default();
        let mut out = Vec::new();
        for piece in input.chunks(3) {
            let mut c = piece;
            while let Some(x) = r.next(&mut c)? {
                out.push(x);
            }
        }
        Ok(out)
    }

    #[test]
    fn the_control_stream_starts_with_settings_once() {
        let mut s = Vec::new();
        for (id, v) in
            [(setting::MAX_FIELD_SECTION_SIZE, 16_384u64), (setting::QPACK_MAX_TABLE_CAPACITY, 4096), (0x21, 1)]
        {
            crate::h3::frame::put_varint(&mut s, id);
            crate::h3::frame::put_varint(&mut s, v);
        }
        let mut input = frame(ty::SETTINGS, &s);
        input.extend(frame(ty::PRIORITY_UPDATE_REQUEST, b"\x04u=1"));
        input.extend(frame(ty::PRIORITY_UPDATE_PUSH, b"\x00u=1")); // no push: skipped
        input.extend(frame(ty::MAX_PUSH_ID, &[4]));
        input.extend(frame(ty::GOAWAY, &[8]));
        let settings = Settings { max_field_section_size: Some(16_384) };
        let update = Control::PriorityUpdate(4, b"u=1".to_vec());
        assert_eq!(control(&input), Ok(vec![Control::Settings(settings), update, Control::GoAway(8)]));
        // A PRIORITY_UPDATE naming anything but a client's request stream.
        let mut bad = frame(ty::SETTINGS, b"");
        bad.extend(frame(ty::PRIORITY_UPDATE_REQUEST, b"\x03u=1"));
        assert_eq!(control(&bad), Err(code::ID_ERROR));

        assert_eq!(control(&frame(ty::GOAWAY, &[0])), Err(code::MISSING_SETTINGS));
        let mut twice = frame(ty::SETTINGS, b"");
        twice.extend(frame(ty::SETTINGS, b""));
        assert_eq!(control(&twice), Err(code::FRAME_UNEXPECTED));
        for (t, want) in [
            (ty::DATA, code::FRAME_UNEXPECTED),
            (ty::HEADERS, code::FRAME_UNEXPECTED),
            (0x06, code::FRAME_UNEXPECTED),
            (ty::CANCEL_PUSH, code::ID_ERROR),
        ] {
            let mut input = frame(ty::SETTINGS, b"");
            input.extend(frame(t, &[0]));
            assert_eq!(control(&input), Err(want), "type {t:#x}");
        }
        let mut bad_goaway = frame(ty::SETTINGS, b"");
        bad_goaway.extend(frame(ty::GOAWAY, &[0, 0]));
        assert_eq!(control(&bad_goaway), Err(code::FRAME_ERROR));
    }

    #[test]
    fn settings_refuse_http2_identifiers_repeats_and_cut_pairs() {
        assert_eq!(settings(&[0x02, 0x00]), Err(code::SETTINGS_ERROR));
        assert_eq!(settings(&[0x06, 0x01, 0x06, 0x02]), Err(code::SETTINGS_ERROR));
        assert_eq!(settings(&[0x06]), Err(code::FRAME_ERROR));
        assert_eq!(settings(&[0x06, 0x40]), Err(code::FRAME_ERROR));
        assert_eq!(settings(&[0x06, 0x41, 0x00]), Ok(Settings { max_field_section_size: Some(256) }));
    }

    #[test]
    fn the_decoder_stream_may_only_cancel_streams() {
        let mut d = DecoderStream::default();
        // Stream cancellations, one with a multi-byte integer split.
        assert_eq!(d.read(&[0x44, 0x7f]), Ok(()));
        assert_eq!(d.read(&[0x81, 0x01, 0x45]), Ok(()));
        assert_eq!(DecoderStream::default().read(&[0x84]), Err(code::QPACK_DECODER_STREAM_ERROR));
        assert_eq!(DecoderStream::default().read(&[0x01]), Err(code::QPACK_DECODER_STREAM_ERROR));
    }
}
