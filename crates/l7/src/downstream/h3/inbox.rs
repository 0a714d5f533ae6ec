//! A connection's queue of datagrams from its endpoint: bounded, many
//! senders (one route per connection ID), one receiver, the task woken on
//! each arrival.
//!
//! tokio's bounded channel did this, but it allocates its first block of
//! 32 slots (2.8 KB of datagram headers here) with the channel and keeps it
//! for the channel's life: 2.8 KB of every idle connection. This queue
//! holds its room only while datagrams wait in it; the receiver gives it
//! back once it has taken the last one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;

struct Inbox<T> {
    queue: Mutex<VecDeque<T>>,
    capacity: usize,
    waker: AtomicWaker,
    senders: AtomicUsize,
    /// The receiver is gone: sends fail.
    closed: AtomicBool,
}

impl<T> Inbox<T> {
    fn queue(&self) -> MutexGuard<'_, VecDeque<T>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A queue of at most `capacity` datagrams (or anything else).
pub fn inbox<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let inbox = Arc::new(Inbox {
        queue: Mutex::new(VecDeque::new()),
        capacity,
        waker: AtomicWaker::new(),
        senders: AtomicUsize::new(1),
        closed: AtomicBool::new(false),
    });
    (Sender(inbox.clone()), Receiver(inbox))
}

pub struct Sender<T>(Arc<Inbox<T>>);

impl<T> Sender<T> {
    /// Queues `d`, or gives it back when the queue is full or its
    /// connection has ended.
    pub fn try_send(&self, d: T) -> Result<(), T> {
        if self.0.closed.load(Ordering::Acquire) {
            return Err(d);
        }
        {
            let mut q = self.0.queue();
            if q.len() >= self.0.capacity {
                return Err(d);
            }
            q.push_back(d);
        }
        self.0.waker.wake();
        Ok(())
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Sender<T> {
        self.0.senders.fetch_add(1, Ordering::Relaxed);
        Sender(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last one: the receiver learns that nothing more comes.
            self.0.waker.wake();
        }
    }
}

pub struct Receiver<T>(Arc<Inbox<T>>);

impl<T> Receiver<T> {
    /// The next datagram; `None` once every sender is gone and the queue
    /// is empty.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(d) = self.take() {
            return Poll::Ready(Some(d));
        }
        self.0.waker.register(cx.waker());
        // Again, after registering: a send in between has woken nobody.
        if let Some(d) = self.take() {
            return Poll::Ready(Some(d));
        }
        if self.0.senders.load(Ordering::Acquire) == 0 {
            // A sender may have queued one last datagram before it went.
            return Poll::Ready(self.take());
        }
        Poll::Pending
    }

    fn take(&mut self) -> Option<T> {
        let mut q = self.0.queue();
        let d = q.pop_front();
        if d.is_some() && q.is_empty() {
            // Drained: the room goes back until the next datagram.
            *q = VecDeque::new();
        }
        d
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        // What waits is never read: freed now, not with the last route.
        *self.0.queue() = VecDeque::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// A datagram's bytes, as the queue's contents.
    fn datagram(byte: u8) -> Vec<u8> {
        vec![byte]
    }

    fn poll(rx: &mut Receiver<Vec<u8>>) -> Poll<Option<Vec<u8>>> {
        rx.poll_recv(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn datagrams_come_out_in_order_and_the_room_goes_back_when_drained() {
        let (tx, mut rx) = inbox(8);
        for b in 0..3 {
            assert!(tx.try_send(datagram(b)).is_ok());
        }
        for b in 0..3 {
            match poll(&mut rx) {
                Poll::Ready(Some(d)) => assert_eq!(d, [b]),
                _ => panic!("datagram {b} missing"),
            }
        }
        assert_eq!(rx.0.queue().capacity(), 0, "an empty queue holds no room");
        assert!(poll(&mut rx).is_pending());
    }

    #[test]
    fn a_full_queue_refuses_and_gives_the_datagram_back() {
        let (tx, _rx) = inbox(2);
        assert!(tx.try_send(datagram(1)).is_ok());
        assert!(tx.try_send(datagram(2)).is_ok());
        match tx.try_send(datagram(3)) {
            Err(d) => assert_eq!(d, [3]),
            Ok(()) => panic!("a third datagram went into a queue of two"),
        }
    }

    #[test]
    fn the_receiver_ends_when_the_last_sender_goes_after_what_was_queued() {
        let (tx, mut rx) = inbox(4);
        let tx2 = tx.clone();
        assert!(tx2.try_send(datagram(7)).is_ok());
        drop(tx);
        assert!(matches!(poll(&mut rx), Poll::Ready(Some(_))));
        assert!(poll(&mut rx).is_pending(), "one sender is still there");
        drop(tx2);
        assert!(matches!(poll(&mut rx), Poll::Ready(None)));
    }

    #[test]
    fn sends_fail_once_the_connection_has_gone() {
        let (tx, rx) = inbox(4);
        drop(rx);
        assert!(tx.try_send(datagram(1)).is_err());
    }

    #[test]
    fn a_send_wakes_the_waiting_task() {
        use std::sync::atomic::AtomicUsize;
        struct Count(AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (tx, mut rx) = inbox(4);
        assert!(rx.poll_recv(&mut Context::from_waker(&waker)).is_pending());
        assert!(tx.try_send(datagram(1)).is_ok());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
