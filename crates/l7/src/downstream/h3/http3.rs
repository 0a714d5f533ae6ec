//! HTTP/3 over one quiche connection: the streams' frames ([`crate::h3`])
//! read from and written to quiche's streams.
//!
//! Gatehouse's own rather than quiche's `h3` module, for what a request
//! costs: quiche's copied each field of a request into two vectors of its
//! own, Huffman-coded every response value, opened QPACK streams that a
//! table of capacity zero never uses, and copied request bodies twice.
//! Here a request's head is decoded once, straight into its
//! [`Fields`](crate::h2::request::Fields), and a body's bytes are read
//! from quiche once, into the [`Bytes`] the upstream gets.
//!
//! What the server opens: one control stream, with its SETTINGS
//! (`MAX_FIELD_SECTION_SIZE`, and the QPACK table a client's encoder may
//! fill), and a QPACK decoder stream once the client's encoder uses that
//! table. What it reads: the client's control stream and QPACK streams
//! (checked, [`crate::h3::stream`], [`crate::h3::qpack_table`]); streams
//! of unknown types are refused with STOP_SENDING, as RFC 9114 6.2 allows.
//!
//! A request whose head names table entries that have not arrived yet
//! waits, unread past its head, until the encoder stream brings them
//! ([`Http3::take_unblocked`]); at most the announced number of streams
//! wait at once.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use rustc_hash::FxHashMap;

use super::stream_buf::Quic;
use crate::h1::hop_by_hop_name;
use crate::h2::CONNECTION_SPECIFIC;
use crate::h3::frame::{
    FrameHeader, code, put_frame_header, put_varint, read_varint, setting, stream_type, ty, varint_len,
};
use crate::h3::priority::Priority;
use crate::h3::qpack::{self, Prefix};
use crate::h3::qpack_table::{DecoderInstructions, EncoderStream, Table};
use crate::h3::stream::{Control, ControlReader, DecoderStream, Request, RequestReader};

/// The server's control stream: its first unidirectional stream.
const CONTROL_STREAM: u64 = 3;
/// Its QPACK decoder stream, the second.
const DECODER_STREAM: u64 = 7;
/// Room in front of a field section for its HEADERS frame header (type
/// and a length of up to 8 bytes).
const HEADER_ROOM: usize = 9;
/// The most a read from a request stream takes from quiche at once.
const READ_CHUNK: usize = 16 * 1024;
/// Scratch room kept between requests; a head larger than this gives its
/// room back once the connection is idle.
const KEEP_SCRATCH: usize = 1024;
/// The most decoder stream bytes kept for a client that grants that
/// stream no flow-control room (a byte or two a request).
const DECODER_BACKLOG: usize = 64 * 1024;

/// What reading a request stream gave.
#[derive(Debug)]
pub enum Read {
    /// The head: [`Http3::decode`] gives its fields. `more`: a body or
    /// trailers may follow.
    Head {
        more: bool,
    },
    Data(Bytes),
    /// The trailers: [`Http3::decode`] gives their fields.
    Trailers,
    /// The client ended the stream.
    End,
    /// Nothing more for now.
    Nothing,
    /// The client reset the stream.
    Reset,
}

/// What went wrong, as the error code that ends a stream or the
/// connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Stream(u64),
    Connection(u64),
}

/// Why a write did not go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsent {
    /// No room on the stream or the connection yet.
    Blocked,
    /// The stream is gone (the client stopped it) or broken.
    Failed,
}

/// A client request stream's state.
#[derive(Default)]
struct Stream {
    reader: RequestReader,
    /// Bytes read from quiche and not given yet.
    rest: Bytes,
    /// quiche gave the stream's end.
    fin: bool,
    /// The end was given ([`Read::End`]).
    ended: bool,
    /// Payload still owed of the DATA frame being sent.
    data_left: u64,
    /// The response's priority, from the request and PRIORITY_UPDATE.
    priority: Priority,
    /// A field section waiting for table entries.
    held: Option<Box<Held>>,
}

/// A field section that names entries the table does not have yet.
struct Held {
    block: Vec<u8>,
    prefix: Prefix,
    trailers: bool,
}

/// The QPACK dynamic table a client's encoder may fill: its size and how
/// many request streams may wait for its entries at once (the server's
/// SETTINGS_QPACK_MAX_TABLE_CAPACITY and SETTINGS_QPACK_BLOCKED_STREAMS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpackLimits {
    pub capacity: usize,
    pub blocked_streams: usize,
}

/// A client unidirectional stream, by what its first bytes said it is.
enum Uni {
    /// Its type not read whole yet: the bytes so far.
    Type(Vec<u8>),
    Control,
    Encoder,
    Decoder,
}

pub struct Http3 {
    /// By stream ID (FxHash: quiche admits only IDs within the stream
    /// limits).
    streams: FxHashMap<u64, Stream>,
    uni: FxHashMap<u64, Uni>,
    control: ControlReader,
    decoder: DecoderStream,
    /// The largest field section a request may have.
    max_head: usize,
    /// The head or trailers last read (on `head_stream`, with its
    /// prefix), and room to decode them.
    head: Vec<u8>,
    head_prefix: Prefix,
    head_stream: u64,
    names: Vec<u8>,
    values: Vec<u8>,
    /// Where a response's HEADERS frame is made.
    out: Vec<u8>,
    /// The client's dynamic table, what fills it, and what this server's
    /// decoder stream owes the client.
    table: Table,
    encoder: EncoderStream,
    said: DecoderInstructions,
    decoder_opened: bool,
    /// Streams waiting for table entries, and the most that may.
    blocked: usize,
    max_blocked: usize,
    /// Streams whose wait ended, to be read again.
    unblocked: Vec<u64>,
}

impl Http3 {
    /// Opens the control stream with the server's SETTINGS.
    pub fn start(quic: &mut Quic, max_head: usize, qpack: QpackLimits) -> Result<Http3, Fault> {
        let mut settings = Vec::new();
        put_varint(&mut settings, setting::MAX_FIELD_SECTION_SIZE);
        put_varint(&mut settings, max_head as u64);
        if qpack.capacity > 0 {
            put_varint(&mut settings, setting::QPACK_MAX_TABLE_CAPACITY);
            put_varint(&mut settings, qpack.capacity as u64);
            put_varint(&mut settings, setting::QPACK_BLOCKED_STREAMS);
            put_varint(&mut settings, qpack.blocked_streams as u64);
        }
        let mut out = vec![stream_type::CONTROL as u8];
        put_frame_header(&mut out, ty::SETTINGS, settings.len() as u64);
        out.extend_from_slice(&settings);
        let _ = quic.stream_priority(CONTROL_STREAM, 0, false);
        match quic.stream_send(CONTROL_STREAM, &out, false) {
            Ok(n) if n == out.len() => {}
            _ => return Err(Fault::Connection(code::STREAM_CREATION_ERROR)),
        }
        Ok(Http3 {
            streams: FxHashMap::default(),
            uni: FxHashMap::default(),
            control: ControlReader::default(),
            decoder: DecoderStream::default(),
            max_head,
            head: Vec::new(),
            head_prefix: Prefix::default(),
            head_stream: 0,
            names: Vec::new(),
            values: Vec::new(),
            out: Vec::new(),
            table: Table::new(qpack.capacity),
            encoder: EncoderStream::default(),
            said: DecoderInstructions::default(),
            decoder_opened: false,
            blocked: 0,
            max_blocked: qpack.blocked_streams,
            unblocked: Vec::new(),
        })
    }

    // ---- reading ----

    /// The next thing on a client's request stream.
    pub fn read(&mut self, quic: &mut Quic, id: u64) -> Result<Read, Fault> {
        let s = self.streams.entry(id).or_default();
        if let Some(held) = &s.held {
            // Nothing past a waiting section is read until it is decoded.
            if held.prefix.required > self.table.inserted() {
                return Ok(Read::Nothing);
            }
            if let Some(held) = s.held.take() {
                self.blocked -= 1;
                self.head = held.block;
                self.head_prefix = held.prefix;
                self.head_stream = id;
                return Ok(if held.trailers {
                    Read::Trailers
                } else {
                    Read::Head { more: !(s.fin && s.rest.is_empty()) }
                });
            }
        }
        loop {
            if !s.rest.is_empty() {
                let mut input: &[u8] = &s.rest;
                let item = s.reader.next(&mut input, self.max_head).map_err(fault)?;
                let used = s.rest.len() - input.len();
                let read = match item {
                    Some(Request::Data(piece)) => {
                        let piece = s.rest.slice(used - piece.len()..used);
                        s.rest.advance(used);
                        return Ok(Read::Data(piece));
                    }
                    Some(Request::Head(ref block) | Request::Trailers(ref block)) => {
                        let trailers = matches!(item, Some(Request::Trailers(_)));
                        let prefix = qpack::prefix(block, &self.table).map_err(Fault::Connection)?;
                        if prefix.required > self.table.inserted() {
                            // It waits for the encoder stream.
                            if self.blocked >= self.max_blocked {
                                return Err(Fault::Connection(code::QPACK_DECOMPRESSION_FAILED));
                            }
                            self.blocked += 1;
                            s.held = Some(Box::new(Held { block: block.to_vec(), prefix, trailers }));
                            s.rest.advance(used);
                            return Ok(Read::Nothing);
                        }
                        self.head.clear();
                        self.head.extend_from_slice(block);
                        self.head_prefix = prefix;
                        self.head_stream = id;
                        if trailers { Read::Trailers } else { Read::Head { more: true } }
                    }
                    None => Read::Nothing,
                };
                s.rest.advance(used);
                match read {
                    Read::Head { .. } => return Ok(Read::Head { more: !(s.fin && s.rest.is_empty()) }),
                    Read::Nothing => {}
                    other => return Ok(other),
                }
            }
            if s.fin {
                if s.ended {
                    return Ok(Read::Nothing);
                }
                s.reader.end().map_err(fault)?;
                s.ended = true;
                return Ok(Read::End);
            }
            let len = quic.stream_readable_len(id, READ_CHUNK).max(1);
            let mut buf = BytesMut::with_capacity(len);
            match quic.stream_recv_buf(id, (&mut buf).limit(len)) {
                Ok((_, fin)) => {
                    s.fin = fin;
                    s.rest = buf.freeze();
                }
                Err(quiche::Error::Done) => {
                    if s.reader.is_fresh() && s.rest.is_empty() {
                        // Nothing came (a stream already done with, listed
                        // again): nothing to keep.
                        self.forget(id, false);
                    }
                    return Ok(Read::Nothing);
                }
                Err(quiche::Error::StreamReset(_)) => {
                    self.done(id);
                    return Ok(Read::Reset);
                }
                Err(_) => return Err(Fault::Stream(code::INTERNAL_ERROR)),
            }
        }
    }

    /// The fields of the head or trailers [`Http3::read`] last gave, to
    /// `field` until it returns false.
    pub fn decode(&mut self, field: impl FnMut(&[u8], &[u8]) -> bool) -> Result<(), Fault> {
        let (head, prefix) = (&self.head, &self.head_prefix);
        qpack::decode(head, prefix, &self.table, &mut self.names, &mut self.values, field)
            .map_err(Fault::Connection)?;
        self.said.section_decoded(self.head_stream, prefix.required);
        Ok(())
    }

    /// The request on this stream is over (answered, reset or refused):
    /// its state goes. The caller has stopped the stream's reading if the
    /// client had not ended it, so no more of it comes.
    pub fn done(&mut self, id: u64) {
        self.forget(id, true);
    }

    /// Forgets a stream; `cancel`: tell the client's encoder that field
    /// sections it sent there may never be read (RFC 9204 4.4.2), when
    /// some may not have been and the table has entries they could name.
    fn forget(&mut self, id: u64, cancel: bool) {
        let Some(s) = self.streams.remove(&id) else { return };
        if s.held.is_some() {
            self.blocked -= 1;
        }
        let all_read = s.fin && s.rest.is_empty() && s.held.is_none();
        if cancel && !all_read && self.table.inserted() > 0 {
            self.said.stream_cancelled(id);
        }
        if self.streams.is_empty() {
            // An idle connection keeps no room: no stream map, and no
            // scratch grown by a large head.
            self.streams = FxHashMap::default();
            for buf in [&mut self.head, &mut self.names, &mut self.values, &mut self.out] {
                if buf.capacity() > KEEP_SCRATCH {
                    *buf = Vec::new();
                }
            }
        }
    }

    /// Reads a client unidirectional stream: its type, then what that
    /// kind of stream carries. An error closes the connection.
    pub fn read_uni(&mut self, quic: &mut Quic, id: u64) -> Result<(), u64> {
        let mut buf = [0u8; 1024];
        loop {
            let (n, fin) = match quic.stream_recv(id, &mut buf) {
                Ok(r) => r,
                Err(quiche::Error::Done) => return Ok(()),
                Err(quiche::Error::StreamReset(_)) => (0, true),
                Err(_) => return Ok(()),
            };
            let mut input = &buf[..n];
            let state = self.uni.entry(id).or_insert_with(|| Uni::Type(Vec::new()));
            if let Uni::Type(so_far) = state {
                so_far.extend_from_slice(input);
                input = &[];
                if let Some((t, len)) = read_varint(so_far) {
                    let after = so_far.split_off(len);
                    let kind = match t {
                        stream_type::CONTROL => Uni::Control,
                        stream_type::QPACK_ENCODER => Uni::Encoder,
                        stream_type::QPACK_DECODER => Uni::Decoder,
                        stream_type::PUSH => return Err(code::STREAM_CREATION_ERROR),
                        _ => {
                            // Unknown (or reserved, grease) types are not
                            // read (RFC 9114 6.2).
                            self.uni.remove(&id);
                            let _ = quic.stream_shutdown(id, quiche::Shutdown::Read, code::STREAM_CREATION_ERROR);
                            return Ok(());
                        }
                    };
                    let twice = self.uni.iter().any(|(&other, u)| other != id && same_kind(u, &kind));
                    if twice {
                        return Err(code::STREAM_CREATION_ERROR);
                    }
                    self.uni.insert(id, kind);
                    self.uni_bytes(quic, id, &after)?;
                } else if so_far.len() > 8 {
                    return Err(code::STREAM_CREATION_ERROR);
                }
            }
            self.uni_bytes(quic, id, input)?;
            if fin {
                // A critical stream must stay open (RFC 9114 6.2.1, RFC
                // 9204 4.2); one whose type never came is nothing.
                return match self.uni.remove(&id) {
                    Some(Uni::Type(_)) | None => Ok(()),
                    Some(_) => Err(code::CLOSED_CRITICAL_STREAM),
                };
            }
        }
    }

    fn uni_bytes(&mut self, quic: &mut Quic, id: u64, mut input: &[u8]) -> Result<(), u64> {
        if input.is_empty() {
            return Ok(());
        }
        match self.uni.get(&id) {
            Some(Uni::Control) => {
                while let Some(c) = self.control.next(&mut input)? {
                    match c {
                        // The client's limit on a response's field section:
                        // quiche's `h3` did not heed it either; a response
                        // head is far smaller than any client's.
                        Control::Settings(_) => {}
                        // The client will start no more requests: nothing
                        // to do (its open ones finish).
                        Control::GoAway(_) => {}
                        // A request not read yet (or done with) is not
                        // kept for: its own field, or the default, holds.
                        Control::PriorityUpdate(stream, value) => {
                            if let Some(s) = self.streams.get_mut(&stream) {
                                s.priority = s.priority.with_field(&value);
                                let _ = quic.stream_priority(stream, s.priority.urgency, s.priority.incremental);
                            }
                        }
                    }
                }
                Ok(())
            }
            Some(Uni::Encoder) => {
                if self.encoder.read(&mut self.table, input)? > 0 && self.blocked > 0 {
                    let inserted = self.table.inserted();
                    let ready = self
                        .streams
                        .iter()
                        .filter(|(_, s)| s.held.as_ref().is_some_and(|h| h.prefix.required <= inserted));
                    self.unblocked.extend(ready.map(|(&id, _)| id));
                }
                Ok(())
            }
            Some(Uni::Decoder) => self.decoder.read(input),
            Some(Uni::Type(_)) | None => Ok(()),
        }
    }

    /// Streams whose field section can be decoded now: read them again.
    pub fn take_unblocked(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.unblocked)
    }

    /// Sends what the decoder stream owes: acknowledgments of the field
    /// sections decoded, cancellations, and how many entries arrived. The
    /// stream opens with the first of it. A client that takes none of it
    /// while it keeps sending requests is H3_EXCESSIVE_LOAD.
    pub fn flush_decoder(&mut self, quic: &mut Quic) -> Result<(), u64> {
        self.said.count_inserts(&self.table);
        if self.said.owed().is_empty() {
            return Ok(());
        }
        if !self.decoder_opened {
            self.decoder_opened = true;
            self.said.open(stream_type::QPACK_DECODER as u8);
            let _ = quic.stream_priority(DECODER_STREAM, 0, false);
        }
        // What quiche has no room for yet goes with a later flush; an
        // encoder that hears nothing only uses fewer entries.
        if let Ok(n) = quic.stream_send(DECODER_STREAM, self.said.owed(), false) {
            self.said.sent(n);
        }
        if self.said.owed().len() > DECODER_BACKLOG {
            return Err(code::EXCESSIVE_LOAD);
        }
        Ok(())
    }

    /// The request's `priority` field (RFC 9218), for its response.
    pub fn prioritize(&mut self, id: u64, field: &[u8]) {
        if let Some(s) = self.streams.get_mut(&id) {
            s.priority = s.priority.with_field(field);
        }
    }

    // ---- writing ----

    /// Tells quiche the response's priority, when its request asked for
    /// one other than the default (RFC 9218's, urgency 3, not
    /// incremental: a connection's responses go out one after the other,
    /// each whole, rather than a piece of every one in each packet). Our
    /// quiche gives every new stream that default
    /// (third_party/quiche/default-priority-rfc9218.patch).
    fn prioritize_response(&self, quic: &mut Quic, id: u64) {
        let p = self.streams.get(&id).map_or_else(Priority::default, |s| s.priority);
        if p != Priority::default() {
            let _ = quic.stream_priority(id, p.urgency, p.incremental);
        }
    }

    /// A response head (`:status` and the fields HTTP/3 carries), whole
    /// or not at all.
    pub fn send_head(
        &mut self,
        quic: &mut Quic,
        id: u64,
        status: StatusCode,
        fields: &HeaderMap,
        fin: bool,
    ) -> Result<(), Unsent> {
        self.prioritize_response(quic, id);
        self.send_fields(quic, id, Some(status), fields, &[], fin)
    }

    /// A response head and all of its body, which ends the stream: a
    /// HEADERS and a DATA frame in one write to quiche, whole or not at
    /// all. For small bodies: each write makes quiche look the stream up,
    /// queue a buffer and re-file the stream as flushable, and a 64-byte
    /// response took three (the head, the DATA frame's header, the body).
    pub fn send_whole(
        &mut self,
        quic: &mut Quic,
        id: u64,
        status: StatusCode,
        fields: &HeaderMap,
        body: &[u8],
    ) -> Result<(), Unsent> {
        self.prioritize_response(quic, id);
        self.send_fields(quic, id, Some(status), fields, body, true)
    }

    /// Trailers, which end the stream.
    pub fn send_trailers(&mut self, quic: &mut Quic, id: u64, fields: &HeaderMap) -> Result<(), Unsent> {
        self.send_fields(quic, id, None, fields, &[], true)
    }

    /// A field section (with `:status` for a head) as one HEADERS frame,
    /// and `body`, unless empty, as a DATA frame after it.
    fn send_fields(
        &mut self,
        quic: &mut Quic,
        id: u64,
        status: Option<StatusCode>,
        fields: &HeaderMap,
        body: &[u8],
        fin: bool,
    ) -> Result<(), Unsent> {
        // A stream waiting for room is asked again each time the client's
        // packets come: no room, nothing to encode.
        let room = match quic.stream_capacity(id) {
            Ok(0) => return Err(Unsent::Blocked),
            Ok(room) => room,
            Err(_) => return Err(Unsent::Failed),
        };
        let block = &mut self.out;
        block.clear();
        // Room for the frame header, put in front once the length is known.
        block.resize(HEADER_ROOM, 0);
        qpack::begin(block);
        if let Some(status) = status {
            qpack::encode_status(block, status.as_u16());
        }
        encode_fields(block, fields);
        let header = FrameHeader::new(ty::HEADERS, (block.len() - HEADER_ROOM) as u64);
        let start = HEADER_ROOM - header.as_bytes().len();
        block[start..HEADER_ROOM].copy_from_slice(header.as_bytes());
        if !body.is_empty() {
            block.extend_from_slice(FrameHeader::new(ty::DATA, body.len() as u64).as_bytes());
            block.extend_from_slice(body);
        }
        let frame = &block[start..];
        if room < frame.len() {
            return Err(Unsent::Blocked);
        }
        match quic.stream_send(id, frame, fin) {
            Ok(n) if n == frame.len() => Ok(()),
            Ok(0) | Err(quiche::Error::Done) => Err(Unsent::Blocked),
            // The room was there: a part sent is a stream broken.
            _ => Err(Unsent::Failed),
        }
    }

    /// As much of `data` as the stream takes, in one DATA frame whose
    /// header goes out with the first of it; what is left stays in `data`
    /// (then `Ok(false)`: try again with it when there is room). `fin`
    /// ends the stream with the last of it.
    pub fn send_data(&mut self, quic: &mut Quic, id: u64, data: &mut Bytes, fin: bool) -> Result<bool, Unsent> {
        let s = self.streams.entry(id).or_default();
        if s.data_left == 0 && data.is_empty() {
            return match quic.stream_send(id, &[], fin) {
                Ok(_) => Ok(true),
                Err(quiche::Error::Done) => Err(Unsent::Blocked),
                Err(_) => Err(Unsent::Failed),
            };
        }
        // quiche drops a buffer it has no room for: ask first, once.
        let room = quic.stream_capacity(id).map_err(|_| Unsent::Failed)?;
        if s.data_left == 0 {
            let len = data.len() as u64;
            let header = FrameHeader::new(ty::DATA, len);
            let header = header.as_bytes();
            // The header and at least a byte of the payload.
            if room <= header.len() {
                return Err(Unsent::Blocked);
            }
            match quic.stream_send(id, header, false) {
                Ok(n) if n == header.len() => {}
                _ => return Err(Unsent::Failed),
            }
            s.data_left = len;
        } else if room == 0 {
            return Err(Unsent::Blocked);
        }
        let chunk = std::mem::take(data);
        let len = chunk.len();
        match quic.stream_send_zc(id, chunk, fin) {
            Ok((sent, rest)) => {
                s.data_left -= sent as u64;
                if let Some(rest) = rest {
                    *data = rest;
                }
                Ok(sent == len)
            }
            Err(quiche::Error::Done) => Err(Unsent::Blocked),
            Err(_) => Err(Unsent::Failed),
        }
    }

    /// GOAWAY: no request past `next` will be served.
    pub fn send_goaway(&mut self, quic: &mut Quic, next: u64) {
        let mut frame = FrameHeader::new(ty::GOAWAY, varint_len(next) as u64).as_bytes().to_vec();
        put_varint(&mut frame, next);
        let _ = quic.stream_send(CONTROL_STREAM, &frame, false);
    }
}

fn same_kind(a: &Uni, b: &Uni) -> bool {
    matches!((a, b), (Uni::Control, Uni::Control) | (Uni::Encoder, Uni::Encoder) | (Uni::Decoder, Uni::Decoder))
}

/// Errors of a request stream: a stream that ends before its request is
/// whole costs only itself (RFC 9114 4.1); the others are connection
/// errors.
fn fault(c: u64) -> Fault {
    if c == code::REQUEST_INCOMPLETE { Fault::Stream(c) } else { Fault::Connection(c) }
}

/// A header map's fields as HTTP/3 carries them: without the
/// connection-specific ones (RFC 9114 4.2).
fn encode_fields(out: &mut Vec<u8>, fields: &HeaderMap) {
    for (name, value) in fields {
        if hop_by_hop_name(name.as_str().as_bytes()) & CONNECTION_SPECIFIC == 0 {
            qpack::encode_field(out, name.as_str(), value.as_bytes());
        }
    }
}

#[cfg(test)]
#[path = "http3_tests.rs"]
pub(super) mod tests;
