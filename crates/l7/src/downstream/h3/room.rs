//! Which of a connection's streams take the room that comes free.

/// Slots that found no room on the connection for what they had to send,
/// in the order they found none. When room comes (the client's
/// acknowledgements and window updates) they take it first, oldest first:
/// quiche counts bytes against the client's connection window when it
/// takes them, not when it sends them, so without a queue the streams
/// polled first would take all the room again and again, and a stream that
/// waited could wait until the client stopped sending new requests.
#[derive(Default)]
pub struct Waiting {
    order: Vec<usize>,
    queued: Vec<bool>,
    room: bool,
}

impl Waiting {
    pub fn block(&mut self, slot: usize) {
        if self.queued.len() <= slot {
            self.queued.resize(slot + 1, false);
        }
        if !self.queued[slot] {
            self.queued[slot] = true;
            self.order.push(slot);
        }
    }

    pub fn is_waiting(&self, slot: usize) -> bool {
        self.queued.get(slot).copied().unwrap_or(false)
    }

    /// Room may have come.
    pub fn room(&mut self) {
        self.room = true;
    }

    /// If room came since the last call, the waiting slots, oldest first,
    /// appended to `out` (and waiting no more).
    pub fn release(&mut self, out: &mut Vec<usize>) {
        if !std::mem::take(&mut self.room) {
            return;
        }
        for &slot in &self.order {
            self.queued[slot] = false;
        }
        out.append(&mut self.order);
    }

    /// The slot's stream is gone (a new one may take the slot).
    pub fn forget(&mut self, slot: usize) {
        if let Some(q) = self.queued.get_mut(slot) {
            *q = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_slots_take_room_oldest_first_once_each() {
        let mut w = Waiting::default();
        w.block(7);
        w.block(2);
        w.block(7);
        w.block(40);
        assert!(w.is_waiting(7) && w.is_waiting(40) && !w.is_waiting(3));
        let mut out = vec![];
        // No room yet: they keep waiting.
        w.release(&mut out);
        assert!(out.is_empty() && w.is_waiting(2));
        w.room();
        w.release(&mut out);
        assert_eq!(out, [7, 2, 40]);
        assert!(!w.is_waiting(7) && !w.is_waiting(2) && !w.is_waiting(40));
        // Released once: the next room finds nobody until they block again.
        out.clear();
        w.room();
        w.release(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_freed_slot_does_not_wait_and_can_wait_again() {
        let mut w = Waiting::default();
        w.block(1);
        w.block(5);
        w.forget(1);
        assert!(!w.is_waiting(1));
        w.block(1);
        assert!(w.is_waiting(1));
        let mut out = vec![];
        w.room();
        w.release(&mut out);
        // The slot's old place and its new one: polling it twice is harmless.
        assert_eq!(out, [1, 5, 1]);
    }
}
