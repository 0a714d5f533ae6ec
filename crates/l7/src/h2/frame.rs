//! HTTP/2 frames (RFC 9113 section 4 and 6): the 9-byte header, and the
//! frames this server writes.

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADER_LEN: usize = 9;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const PRIORITY: u8 = 0x2;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY_FLAG: u8 = 0x20;

pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// The largest window either side may have (2^31 - 1).
pub const MAX_WINDOW: i64 = (1 << 31) - 1;
/// The protocol's initial windows and frame size.
pub const DEFAULT_WINDOW: i64 = 65_535;
pub const DEFAULT_MAX_FRAME: usize = 16_384;

/// Error codes (RFC 9113 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Reason {
    NoError = 0x0,
    Protocol = 0x1,
    Internal = 0x2,
    FlowControl = 0x3,
    StreamClosed = 0x5,
    FrameSize = 0x6,
    RefusedStream = 0x7,
    /// Not sent by this server (it resets a stream for a reason, never
    /// for nothing), kept so the codes read as RFC 9113 lists them.
    #[allow(dead_code)]
    Cancel = 0x8,
    Compression = 0x9,
    EnhanceYourCalm = 0xb,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl Head {
    /// The header at the start of `buf`, when it holds one.
    pub fn parse(buf: &[u8]) -> Option<Head> {
        let h: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Head {
            len: (h[0] as usize) << 16 | (h[1] as usize) << 8 | h[2] as usize,
            kind: h[3],
            flags: h[4],
            // The reserved bit is ignored (RFC 9113 4.1).
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        })
    }

    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }
}

pub fn put_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let l = len as u32;
    out.extend_from_slice(&[(l >> 16) as u8, (l >> 8) as u8, l as u8, kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

pub fn put_settings(out: &mut Vec<u8>, settings: &[(u16, u32)]) {
    put_head(out, settings.len() * 6, SETTINGS, 0, 0);
    for &(id, value) in settings {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&value.to_be_bytes());
    }
}

pub fn put_settings_ack(out: &mut Vec<u8>) {
    put_head(out, 0, SETTINGS, ACK, 0);
}

pub fn put_ping_ack(out: &mut Vec<u8>, payload: &[u8]) {
    put_head(out, 8, PING, ACK, 0);
    out.extend_from_slice(payload);
}

pub fn put_window_update(out: &mut Vec<u8>, stream: u32, increment: u32) {
    put_head(out, 4, WINDOW_UPDATE, 0, stream);
    out.extend_from_slice(&increment.to_be_bytes());
}

pub fn put_rst(out: &mut Vec<u8>, stream: u32, reason: Reason) {
    put_head(out, 4, RST_STREAM, 0, stream);
    out.extend_from_slice(&(reason as u32).to_be_bytes());
}

pub fn put_goaway(out: &mut Vec<u8>, last_stream: u32, reason: Reason) {
    put_head(out, 8, GOAWAY, 0, 0);
    out.extend_from_slice(&last_stream.to_be_bytes());
    out.extend_from_slice(&(reason as u32).to_be_bytes());
}

pub fn put_data(out: &mut Vec<u8>, stream: u32, data: &[u8], end: bool) {
    put_head(out, data.len(), DATA, if end { END_STREAM } else { 0 }, stream);
    out.extend_from_slice(data);
}

/// A header block as HEADERS and, past `max_frame` bytes, CONTINUATION
/// frames.
pub fn put_headers(out: &mut Vec<u8>, stream: u32, block: &[u8], end_stream: bool, max_frame: usize) {
    let mut chunks = block.chunks(max_frame.max(1));
    let first = chunks.next().unwrap_or(&[]);
    let mut flags = if end_stream { END_STREAM } else { 0 };
    let single = block.len() <= max_frame;
    if single {
        flags |= END_HEADERS;
    }
    put_head(out, first.len(), HEADERS, flags, stream);
    out.extend_from_slice(first);
    let mut rest = chunks.peekable();
    while let Some(chunk) = rest.next() {
        let last = rest.peek().is_none();
        put_head(out, chunk.len(), CONTINUATION, if last { END_HEADERS } else { 0 }, stream);
        out.extend_from_slice(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_round_trip_and_ignore_the_reserved_bit() {
        let mut out = Vec::new();
        put_head(&mut out, 0x12_3456, HEADERS, END_HEADERS, 7);
        out[5] |= 0x80;
        assert_eq!(Head::parse(&out), Some(Head { len: 0x12_3456, kind: HEADERS, flags: END_HEADERS, stream: 7 }));
        assert_eq!(Head::parse(&out[..8]), None);
    }

    #[test]
    fn a_large_block_is_split_into_continuations() {
        let block = vec![7u8; 40];
        let mut out = Vec::new();
        put_headers(&mut out, 3, &block, true, 16);
        let mut pos = 0;
        let mut frames = Vec::new();
        while let Some(h) = Head::parse(&out[pos..]) {
            frames.push((h.kind, h.flags, h.len));
            pos += HEADER_LEN + h.len;
        }
        assert_eq!(frames, vec![(HEADERS, END_STREAM, 16), (CONTINUATION, 0, 16), (CONTINUATION, END_HEADERS, 8)]);
    }
}
