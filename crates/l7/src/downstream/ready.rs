//! Which streams of a multiplexed connection (HTTP/2, HTTP/3) have work:
//! each stream slot has its own waker, which marks the slot in a bit set
//! and wakes the connection's task, so a wake polls only the slots that
//! have something to do, with no task, channel or lock per stream.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Wake, Waker};

use futures_util::task::AtomicWaker;

/// Which slots' wakers fired since the connection last looked.
pub struct ReadySet {
    bits: Box<[AtomicU64]>,
    /// The connection's task.
    pub task: AtomicWaker,
}

impl ReadySet {
    /// Room for `slots` slots.
    pub fn new(slots: usize) -> Arc<ReadySet> {
        Arc::new(ReadySet {
            bits: (0..slots.div_ceil(64).max(1)).map(|_| AtomicU64::new(0)).collect(),
            task: AtomicWaker::new(),
        })
    }

    /// How many slots it has room for.
    pub fn capacity(&self) -> usize {
        self.bits.len() * 64
    }

    pub fn mark(&self, slot: usize) {
        self.bits[slot / 64].fetch_or(1 << (slot % 64), Ordering::AcqRel);
    }

    pub fn any(&self) -> bool {
        self.bits.iter().any(|w| w.load(Ordering::Acquire) != 0)
    }

    /// Takes the marks, calling `f` for each slot marked.
    pub fn drain(&self, mut f: impl FnMut(usize)) {
        for (w, word) in self.bits.iter().enumerate() {
            let mut bits = word.swap(0, Ordering::AcqRel);
            while bits != 0 {
                f(w * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
    }

    /// A waker for one slot.
    pub fn waker(self: &Arc<Self>, slot: usize) -> Waker {
        Waker::from(Arc::new(SlotWaker { set: self.clone(), slot }))
    }
}

struct SlotWaker {
    set: Arc<ReadySet>,
    slot: usize,
}

impl Wake for SlotWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.set.mark(self.slot);
        self.set.task.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slots_waker_marks_it_once_until_drained() {
        let set = ReadySet::new(100);
        assert_eq!(set.capacity(), 128);
        set.waker(3).wake_by_ref();
        set.waker(70).wake();
        set.waker(3).wake();
        let mut seen = Vec::new();
        set.drain(|s| seen.push(s));
        assert_eq!(seen, [3, 70]);
        assert!(!set.any());
    }
}
