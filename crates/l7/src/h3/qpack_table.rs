//! QPACK's dynamic table on the decoding side (RFC 9204 3.2, 4.3, 4.4):
//! what a client's encoder stream puts in it, and the instructions this
//! server's decoder stream sends back.
//!
//! A client whose encoder uses the table sends a long field (a cookie, a
//! user agent, an authorization token) once and then names it with a
//! byte or two in every request after, as HPACK lets it over HTTP/2. The
//! table holds at most the capacity this server announced
//! (SETTINGS_QPACK_MAX_TABLE_CAPACITY), counted as RFC 9204 3.2.1 counts
//! it (each entry's name and value and 32 bytes); the client's encoder
//! chooses what goes in and what is evicted, within it. Anything the
//! encoder stream says that does not fit (an entry larger than the
//! table, a capacity above the announced one, an index past the table)
//! is `QPACK_ENCODER_STREAM_ERROR`.

use std::collections::VecDeque;

use super::frame::code;
use super::qpack_prim::{static_entry, string};
use crate::h2::hpack::{HpackError, read_int, write_int};

/// RFC 9204 3.2.1: an entry's size is its name's and value's lengths and
/// this much.
pub const ENTRY_OVERHEAD: usize = 32;

/// One entry: its name and value in one allocation.
struct Entry {
    field: Box<[u8]>,
    name_len: usize,
}

impl Entry {
    fn size(&self) -> usize {
        self.field.len() + ENTRY_OVERHEAD
    }
}

/// The table a client's encoder fills.
pub struct Table {
    /// Oldest first: the first has absolute index `inserted - len`.
    entries: VecDeque<Entry>,
    /// The entries' sizes added up.
    size: usize,
    /// The capacity the encoder set (at most `max_capacity`).
    capacity: usize,
    /// The capacity this server announced.
    max_capacity: usize,
    /// Entries inserted since the connection began.
    inserted: u64,
}

impl Table {
    pub fn new(max_capacity: usize) -> Table {
        Table { entries: VecDeque::new(), size: 0, capacity: 0, max_capacity, inserted: 0 }
    }

    pub fn max_capacity(&self) -> usize {
        self.max_capacity
    }

    /// Entries inserted so far (the Insert Count).
    pub fn inserted(&self) -> u64 {
        self.inserted
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Entries in the table now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry with this absolute index, while it is in the table.
    pub fn get(&self, absolute: u64) -> Option<(&[u8], &[u8])> {
        let first = self.inserted - self.entries.len() as u64;
        let e = self.entries.get(usize::try_from(absolute.checked_sub(first)?).ok()?)?;
        Some(e.field.split_at(e.name_len))
    }

    /// The entry `relative` places before the newest (the encoder
    /// stream's indexing, RFC 9204 3.2.5).
    fn relative(&self, relative: usize) -> Option<(&[u8], &[u8])> {
        self.get(self.inserted.checked_sub(1)?.checked_sub(relative as u64)?)
    }

    fn set_capacity(&mut self, capacity: usize) -> Result<(), HpackError> {
        if capacity > self.max_capacity {
            return Err(HpackError::BadSizeUpdate);
        }
        self.capacity = capacity;
        self.evict_to(capacity);
        Ok(())
    }

    fn evict_to(&mut self, room: usize) {
        while self.size > room {
            match self.entries.pop_front() {
                Some(e) => self.size -= e.size(),
                None => break,
            }
        }
    }

    /// Adds an entry: its name (the first `name_len` bytes) and value,
    /// copied out of wherever they were before anything is evicted (the
    /// name may be an entry this insertion evicts).
    fn insert(&mut self, field: Vec<u8>, name_len: usize) -> Result<(), HpackError> {
        let size = field.len() + ENTRY_OVERHEAD;
        if size > self.capacity {
            return Err(HpackError::BadSizeUpdate);
        }
        self.evict_to(self.capacity - size);
        self.entries.push_back(Entry { field: field.into_boxed_slice(), name_len });
        self.size += size;
        self.inserted += 1;
        Ok(())
    }
}

/// A name and value in one allocation, for [`Table::insert`].
fn joined(name: &[u8], value: &[u8]) -> (Vec<u8>, usize) {
    let mut field = Vec::with_capacity(name.len() + value.len());
    field.extend_from_slice(name);
    field.extend_from_slice(value);
    (field, name.len())
}

/// The longest instruction the encoder stream may send for this table
/// (an entry that fits, its strings Huffman-coded at up to 30 bits a
/// byte): what a partial instruction or a string's length may reach.
fn instruction_limit(table: &Table) -> usize {
    4 * table.max_capacity + 16
}

/// The client's encoder stream: instructions in any pieces, applied to
/// the table as each is whole.
#[derive(Default)]
pub struct EncoderStream {
    /// An instruction not whole yet.
    partial: Vec<u8>,
    /// Room to decode Huffman-coded strings.
    name: Vec<u8>,
    value: Vec<u8>,
}

impl EncoderStream {
    /// Applies what `input` completes; how many entries it inserted.
    pub fn read(&mut self, table: &mut Table, input: &[u8]) -> Result<u64, u64> {
        let before = table.inserted;
        let err = |_| code::QPACK_ENCODER_STREAM_ERROR;
        if self.partial.is_empty() {
            let used = self.apply(table, input).map_err(err)?;
            self.keep(table, &input[used..])?;
        } else {
            let mut buf = std::mem::take(&mut self.partial);
            buf.extend_from_slice(input);
            let used = self.apply(table, &buf).map_err(err)?;
            buf.drain(..used);
            self.partial = buf;
            self.keep(table, &[])?;
        }
        Ok(table.inserted - before)
    }

    /// Keeps the start of an instruction, within what an instruction that
    /// fits the table can take.
    fn keep(&mut self, table: &Table, rest: &[u8]) -> Result<(), u64> {
        self.partial.extend_from_slice(rest);
        if self.partial.len() > instruction_limit(table) {
            return Err(code::QPACK_ENCODER_STREAM_ERROR);
        }
        if self.partial.is_empty() {
            // Between instructions nothing is held: insertions come
            // seldom (a field the client has not sent before), and an
            // idle connection keeps no room for them.
            for buf in [&mut self.partial, &mut self.name, &mut self.value] {
                if buf.capacity() > 0 {
                    *buf = Vec::new();
                }
            }
        }
        Ok(())
    }

    /// Applies the whole instructions at the start of `buf`: how many
    /// bytes they took.
    fn apply(&mut self, table: &mut Table, buf: &[u8]) -> Result<usize, HpackError> {
        let mut done = 0;
        while done < buf.len() {
            match self.one(table, buf, done) {
                Ok(end) => done = end,
                Err(HpackError::Truncated) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// One instruction from `at`: where it ends.
    fn one(&mut self, table: &mut Table, buf: &[u8], at: usize) -> Result<usize, HpackError> {
        let mut pos = at;
        let b = buf[at];
        let limit = instruction_limit(table);
        if b & 0x80 != 0 {
            // Insert with name reference: T (0x40) the static table.
            let index = read_int(buf, &mut pos, 6)?;
            let value = string(buf, &mut pos, 7, &mut self.value, limit)?;
            let name = if b & 0x40 != 0 {
                static_entry(index)?.0.as_bytes()
            } else {
                table.relative(index).ok_or(HpackError::BadIndex)?.0
            };
            let (field, name_len) = joined(name, value);
            table.insert(field, name_len)?;
        } else if b & 0x40 != 0 {
            // Insert with literal name: H is 0x20.
            let name = string(buf, &mut pos, 5, &mut self.name, limit)?;
            let value = string(buf, &mut pos, 7, &mut self.value, limit)?;
            let (field, name_len) = joined(name, value);
            table.insert(field, name_len)?;
        } else if b & 0x20 != 0 {
            let capacity = read_int(buf, &mut pos, 5)?;
            table.set_capacity(capacity)?;
        } else {
            // Duplicate.
            let index = read_int(buf, &mut pos, 5)?;
            let (name, value) = table.relative(index).ok_or(HpackError::BadIndex)?;
            let (field, name_len) = joined(name, value);
            table.insert(field, name_len)?;
        }
        Ok(pos)
    }
}

/// The decoder stream: instructions for the client's encoder (RFC 9204
/// 4.4) until the stream takes them, and what it was told: its Known
/// Received Count.
#[derive(Default)]
pub struct DecoderInstructions {
    owed: Vec<u8>,
    acknowledged: u64,
}

impl DecoderInstructions {
    /// A field section on `stream` that needed `required` entries was
    /// decoded (a section that needed none is not acknowledged).
    pub fn section_decoded(&mut self, stream: u64, required: u64) {
        if required > 0 {
            write_int(&mut self.owed, 0x80, 7, stream as usize);
            self.acknowledged = self.acknowledged.max(required);
        }
    }

    /// The sections still unread on `stream` will not be.
    pub fn stream_cancelled(&mut self, stream: u64) {
        write_int(&mut self.owed, 0x40, 6, stream as usize);
    }

    /// An Insert Count Increment for entries the encoder does not know
    /// arrived (after the acknowledgments, which may have told it).
    pub fn count_inserts(&mut self, table: &Table) {
        let new = table.inserted().saturating_sub(self.acknowledged);
        if new > 0 {
            write_int(&mut self.owed, 0x00, 6, new as usize);
            self.acknowledged = table.inserted();
        }
    }

    /// The stream's type goes ahead of everything owed: it opens now.
    pub fn open(&mut self, stream_type: u8) {
        self.owed.insert(0, stream_type);
    }

    /// What is owed to the stream.
    pub fn owed(&self) -> &[u8] {
        &self.owed
    }

    /// The first `n` bytes owed went out.
    pub fn sent(&mut self, n: usize) {
        self.owed.drain(..n);
    }
}

#[cfg(test)]
#[path = "qpack_table_tests.rs"]
mod tests;
