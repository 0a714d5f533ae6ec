//! A connection's streams: the open ones by slot, and the ids of those
//! closed lately.

use std::collections::VecDeque;

use bytes::Bytes;
use http::HeaderMap;

/// Closed stream ids remembered, to tell a HEADERS on a closed stream
/// (STREAM_CLOSED) from one on a stream never opened (PROTOCOL_ERROR).
const CLOSED_REMEMBERED: usize = 64;

pub struct Stream {
    pub id: u32,
    /// The client ended its side (END_STREAM), or it will send nothing
    /// more that matters.
    pub remote_closed: bool,
    /// The response ended (END_STREAM or RST_STREAM sent).
    pub local_closed: bool,
    pub send_window: i64,
    /// Response data not yet sent for want of window, and whether the body
    /// ended with it.
    pub pending: Bytes,
    pub pending_end: bool,
    pub pending_trailers: Option<HeaderMap>,
    pub recv_window: i64,
    /// Request body bytes taken and not yet given back to its window.
    pub unacked: i64,
    /// Request body bytes received and not yet given back to the
    /// connection's window: given back as they are taken, and all at
    /// once when the stream closes (a response that ends before its
    /// request body leaves bytes no one will take).
    pub unreleased: usize,
    pub content_length: Option<u64>,
    pub received: u64,
}

impl Stream {
    /// A stream the client opened; `end`: with no request body.
    pub fn new(id: u32, send_window: i64, recv_window: i64, content_length: Option<u64>, end: bool) -> Self {
        Stream {
            id,
            remote_closed: end,
            local_closed: false,
            send_window,
            pending: Bytes::new(),
            pending_end: false,
            pending_trailers: None,
            recv_window,
            unacked: 0,
            unreleased: 0,
            content_length,
            received: 0,
        }
    }

    /// Whether the response has data, trailers or its end not yet sent.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty() || self.pending_end || self.pending_trailers.is_some()
    }
}

/// The streams of one connection. A slot is made only when more streams
/// are open at once than ever before, up to the concurrency limit, and is
/// reused after.
pub struct Streams {
    slots: Vec<Option<Stream>>,
    /// Each slot's stream id (0: free), apart so a lookup scans 1 KiB.
    ids: Vec<u32>,
    free: Vec<usize>,
    open: usize,
    max: usize,
    closed: VecDeque<u32>,
    /// The highest stream id the client used.
    last: u32,
}

impl Streams {
    pub fn new(max: usize) -> Self {
        Streams {
            slots: Vec::new(),
            ids: Vec::new(),
            free: Vec::new(),
            open: 0,
            max,
            closed: VecDeque::with_capacity(CLOSED_REMEMBERED),
            last: 0,
        }
    }

    /// Streams open.
    pub fn open(&self) -> usize {
        self.open
    }

    /// Slots made so far.
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The highest stream id the client used.
    pub fn last(&self) -> u32 {
        self.last
    }

    /// The client used a new stream id.
    pub fn saw(&mut self, id: u32) {
        self.last = self.last.max(id);
    }

    pub fn slot_of(&self, id: u32) -> Option<usize> {
        if id == 0 || id > self.last {
            return None;
        }
        self.ids.iter().position(|&i| i == id)
    }

    pub fn get(&self, slot: usize) -> Option<&Stream> {
        self.slots.get(slot)?.as_ref()
    }

    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Stream> {
        self.slots.get_mut(slot)?.as_mut()
    }

    /// Every open stream, with its slot.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut Stream)> {
        self.slots.iter_mut().enumerate().filter_map(|(slot, s)| Some((slot, s.as_mut()?)))
    }

    /// A slot for a new stream; `None` at the concurrency limit.
    pub fn insert(&mut self, stream: Stream) -> Option<usize> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if self.slots.len() < self.max => {
                self.slots.push(None);
                self.ids.push(0);
                self.slots.len() - 1
            }
            None => return None,
        };
        self.ids[slot] = stream.id;
        self.slots[slot] = Some(stream);
        self.open += 1;
        Some(slot)
    }

    /// Frees the slot; its id is remembered as closed.
    pub fn remove(&mut self, slot: usize) -> Option<Stream> {
        let s = self.slots.get_mut(slot)?.take()?;
        self.ids[slot] = 0;
        self.open -= 1;
        self.free.push(slot);
        self.remember_closed(s.id);
        Some(s)
    }

    pub fn remember_closed(&mut self, id: u32) {
        if self.closed.len() == CLOSED_REMEMBERED {
            self.closed.pop_front();
        }
        self.closed.push_back(id);
    }

    /// Whether the stream was closed lately.
    pub fn was_closed(&self, id: u32) -> bool {
        self.closed.contains(&id)
    }
}
