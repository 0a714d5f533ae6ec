//! The response direction: what the client's SETTINGS allow (frame size,
//! initial stream window, HPACK table), the connection's send window, and
//! each stream's response sent as the windows allow.

use http::{HeaderMap, StatusCode};

use super::streams::{Stream, Streams};
use crate::h1::hop_by_hop_bit;
use crate::h2::CONNECTION_SPECIFIC;
use crate::h2::frame::{self, Reason};
use crate::h2::hpack::{self, Encoder};

/// What sending a stream's pending response did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// All pending data went out; the response goes on.
    More,
    /// The response ended.
    Ended,
    /// Data is left for want of a window; a wake comes when one opens.
    Waiting,
}

pub struct SendSide {
    max_frame: usize,
    initial_window: i64,
    conn_window: i64,
    encoder: Encoder,
    /// Slots with data waiting for the connection's send window.
    blocked: Vec<usize>,
    /// A stream waits for the client to open a window.
    window_wait: bool,
    /// The client opened a window since the stall was last checked.
    window_opened: bool,
}

impl SendSide {
    pub fn new() -> Self {
        SendSide {
            max_frame: frame::DEFAULT_MAX_FRAME,
            initial_window: frame::DEFAULT_WINDOW,
            conn_window: frame::DEFAULT_WINDOW,
            encoder: Encoder::default(),
            blocked: Vec::new(),
            window_wait: false,
            window_opened: false,
        }
    }

    /// The send window a new stream starts with.
    pub fn initial_window(&self) -> i64 {
        self.initial_window
    }

    /// Whether a stream waits for the client to open a window.
    pub fn waiting(&self) -> bool {
        self.window_wait
    }

    /// Whether the client opened a window since the last call.
    pub fn take_opened(&mut self) -> bool {
        std::mem::take(&mut self.window_opened)
    }

    /// Streams held for a window go again (and set `window_wait` again
    /// if still held).
    fn opened(&mut self) {
        self.window_wait = false;
        self.window_opened = true;
    }

    pub fn set_max_frame(&mut self, value: u32) -> Result<(), Reason> {
        if !(16_384..=16_777_215).contains(&value) {
            return Err(Reason::Protocol);
        }
        self.max_frame = value as usize;
        Ok(())
    }

    pub fn set_table_size(&mut self, value: u32) {
        self.encoder.set_peer_table_size(value as usize);
    }

    /// SETTINGS_INITIAL_WINDOW_SIZE: every open stream's send window moves
    /// by the change (RFC 9113 6.9.2); `wake` gets the slots it opened.
    pub fn set_initial_window(
        &mut self,
        value: u32,
        streams: &mut Streams,
        mut wake: impl FnMut(usize),
    ) -> Result<(), Reason> {
        let value = i64::from(value);
        if value > frame::MAX_WINDOW {
            return Err(Reason::FlowControl);
        }
        let delta = value - self.initial_window;
        self.initial_window = value;
        let mut opened = false;
        for (slot, s) in streams.iter_mut() {
            s.send_window += delta;
            if s.send_window > frame::MAX_WINDOW {
                return Err(Reason::FlowControl);
            }
            if delta > 0 {
                wake(slot);
                opened = true;
            }
        }
        if opened {
            self.opened();
        }
        Ok(())
    }

    /// WINDOW_UPDATE on the connection; `wake` gets the slots it frees.
    pub fn conn_update(&mut self, inc: u32, wake: impl FnMut(usize)) -> Result<(), Reason> {
        if inc == 0 {
            return Err(Reason::Protocol);
        }
        self.conn_window += i64::from(inc);
        if self.conn_window > frame::MAX_WINDOW {
            return Err(Reason::FlowControl);
        }
        self.blocked.drain(..).for_each(wake);
        self.opened();
        Ok(())
    }

    /// WINDOW_UPDATE on a stream: `Err` is a stream error.
    pub fn stream_update(&mut self, s: &mut Stream, inc: u32) -> Result<(), Reason> {
        if inc == 0 {
            return Err(Reason::Protocol);
        }
        s.send_window += i64::from(inc);
        if s.send_window > frame::MAX_WINDOW {
            return Err(Reason::FlowControl);
        }
        self.opened();
        Ok(())
    }

    /// A response head (`status`) or trailers (`None`) as HEADERS and,
    /// past the client's frame size, CONTINUATION frames. Fields that mean
    /// something only to one HTTP/1.1 connection are left out: responses
    /// made here may carry `Connection: close`.
    pub fn fields(&mut self, out: &mut Vec<u8>, id: u32, status: Option<StatusCode>, fields: &HeaderMap, end: bool) {
        let encoder = &mut self.encoder;
        BLOCK.with_borrow_mut(|block| {
            block.clear();
            encoder.begin_block(block);
            if let Some(status) = status {
                hpack::encode_status(block, status.as_u16());
            }
            for (name, value) in fields {
                if hop_by_hop_bit(name) & CONNECTION_SPECIFIC == 0 {
                    encoder.field(block, name.as_str(), value.as_bytes());
                }
            }
            frame::put_headers(out, id, block, end, self.max_frame);
        });
    }

    /// Sends what the windows allow of the pending data of the stream in
    /// `slot`, then its end.
    pub fn pending(&mut self, out: &mut Vec<u8>, slot: usize, s: &mut Stream) -> Sent {
        while !s.pending.is_empty() {
            let allowed = s.send_window.min(self.conn_window);
            if allowed <= 0 {
                self.window_wait = true;
                // Once: a stream polled again while the connection's
                // window stays shut must not grow the list.
                if self.conn_window <= 0 && !self.blocked.contains(&slot) {
                    self.blocked.push(slot);
                }
                return Sent::Waiting;
            }
            let n = (allowed as usize).min(self.max_frame).min(s.pending.len());
            let chunk = s.pending.split_to(n);
            let end = s.pending.is_empty() && s.pending_end && s.pending_trailers.is_none();
            frame::put_data(out, s.id, &chunk, end);
            s.send_window -= n as i64;
            self.conn_window -= n as i64;
            if end {
                s.pending_end = false;
                s.local_closed = true;
                return Sent::Ended;
            }
        }
        if let Some(t) = s.pending_trailers.take() {
            self.fields(out, s.id, None, &t, true);
            s.local_closed = true;
            return Sent::Ended;
        }
        if s.pending_end {
            frame::put_data(out, s.id, &[], true);
            s.pending_end = false;
            s.local_closed = true;
            return Sent::Ended;
        }
        Sent::More
    }
}

thread_local! {
    /// The worker's scratch buffer for one header block.
    static BLOCK: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}
