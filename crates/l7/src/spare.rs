//! Byte buffers a worker thread keeps for reuse, so that a hot path does
//! not allocate once the first few requests have run.

use std::cell::RefCell;
use std::thread::LocalKey;

/// A thread's spare buffers of one kind.
pub type Pool = RefCell<Vec<Vec<u8>>>;

/// One kind of spare buffer: at most `keep` per thread, none with more
/// than `largest` bytes of capacity.
pub struct Spares {
    pub pool: &'static LocalKey<Pool>,
    pub keep: usize,
    pub largest: usize,
}

impl Spares {
    /// A kept buffer, empty, if the thread has one.
    pub fn take(&self) -> Option<Vec<u8>> {
        self.pool.with_borrow_mut(Vec::pop)
    }

    /// Keeps `buf` for the next `take`, unless it holds no memory, is
    /// unusually large, or enough are kept already.
    pub fn give(&self, mut buf: Vec<u8>) {
        buf.clear();
        self.give_as_is(buf);
    }

    /// As [`Spares::give`], with its length and bytes left as they are:
    /// for a buffer read into through a slice, which the next user
    /// overwrites, so it is not zeroed again each time it is taken.
    pub fn give_as_is(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > self.largest {
            return;
        }
        self.pool.with_borrow_mut(|spare| {
            if spare.len() < self.keep {
                spare.push(buf);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        static POOL: Pool = const { RefCell::new(Vec::new()) };
    }
    static TWO: Spares = Spares { pool: &POOL, keep: 2, largest: 100 };

    #[test]
    fn keeps_up_to_its_count_and_size_cleared() {
        assert!(TWO.take().is_none());
        let mut a = Vec::with_capacity(50);
        a.extend_from_slice(b"used");
        TWO.give(a);
        TWO.give(Vec::with_capacity(10));
        TWO.give(Vec::with_capacity(20)); // a third: not kept
        TWO.give(Vec::with_capacity(1000)); // too large: not kept
        TWO.give(Vec::new()); // no memory: not kept
        let first = TWO.take().expect("kept");
        assert_eq!(first.capacity(), 10);
        let second = TWO.take().expect("kept");
        assert!(second.is_empty() && second.capacity() >= 50);
        assert!(TWO.take().is_none());
    }

    #[test]
    fn as_is_keeps_the_length() {
        TWO.give_as_is(vec![7u8; 64]);
        assert_eq!(TWO.take().expect("kept"), vec![7u8; 64]);
        TWO.give_as_is(vec![0u8; 1000]); // too large: not kept
        assert!(TWO.take().is_none());
    }
}
