//! A live client's queue: the frames the broker pushed and the client has
//! not taken yet, bounded, with one reader.
//!
//! Why not tokio's `mpsc`: its channel allocates its first block of 32
//! slots and two cache-padded halves when it is made (about 780 bytes per
//! client in heaptrack), which an idle stream carries for its whole life,
//! and each send goes through its semaphore. The broker is the only
//! writer (under its own lock) and the client the only reader, so here a
//! queue is a `VecDeque` behind a mutex that is held for one push or one
//! pop and never across an `.await`: no room is taken until the first
//! frame, and the room a burst took is given back once it has drained.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::Frame;

/// Room kept after the queue drains; a larger one (left by a burst) is freed.
const KEEP: usize = 16;

/// Why a push was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// The queue holds its bound.
    Full,
    /// The broker let go of this client.
    Closed,
}

/// One client's frames (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Queue {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    frames: VecDeque<Frame>,
    /// No frame follows what is queued.
    closed: bool,
    /// The reader, waiting for a frame.
    waker: Option<Waker>,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every mutation is one push or pop: a panic cannot leave it torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `frame` unless `bound` frames wait already or the queue was
    /// closed; wakes the reader. Says whether the queue was empty before
    /// (the reader had taken everything).
    pub(super) fn push(&self, frame: Frame, bound: usize) -> Result<bool, Refused> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(Refused::Closed);
        }
        if inner.frames.len() >= bound {
            return Err(Refused::Full);
        }
        let was_empty = inner.frames.is_empty();
        inner.frames.push_back(frame);
        let waker = inner.waker.take();
        drop(inner);
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(was_empty)
    }

    /// No frame follows: the reader takes what is queued, then sees the end.
    pub(super) fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        let waker = inner.waker.take();
        drop(inner);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The next frame; `None` once the queue is closed and drained.
    pub(super) fn poll_pop(&self, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        let mut inner = self.lock();
        if let Some(frame) = Self::take(&mut inner) {
            return Poll::Ready(Some(frame));
        }
        if inner.closed {
            return Poll::Ready(None);
        }
        match &mut inner.waker {
            Some(waker) => waker.clone_from(cx.waker()),
            none => *none = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// A queued frame, without waiting.
    pub(super) fn try_pop(&self) -> Option<Frame> {
        Self::take(&mut self.lock())
    }

    fn take(inner: &mut Inner) -> Option<Frame> {
        let frame = inner.frames.pop_front()?;
        if inner.frames.is_empty() && inner.frames.capacity() > KEEP {
            inner.frames = VecDeque::new();
        }
        Some(frame)
    }

    /// Frames waiting.
    pub(super) fn len(&self) -> usize {
        self.lock().frames.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn frame(id: i64) -> Frame {
        Frame::new(id, bytes::Bytes::from_static(b"{}"), 0)
    }

    /// Bounded, in order, the reader woken by a push and by the close,
    /// what was queued still taken after the close, and the room of a
    /// burst given back once it drained.
    #[test]
    fn a_queue_is_bounded_wakes_its_reader_and_drains_after_closing() {
        let queue = Queue::default();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);

        assert!(queue.poll_pop(&mut cx).is_pending());
        assert_eq!(queue.push(frame(1), 2), Ok(true), "pushed onto an empty queue");
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the push woke the reader");
        assert_eq!(queue.push(frame(2), 2), Ok(false));
        assert_eq!(queue.push(frame(3), 2), Err(Refused::Full));
        assert_eq!(queue.len(), 2);
        assert!(matches!(queue.poll_pop(&mut cx), Poll::Ready(Some(f)) if f.id == 1));
        assert_eq!(queue.try_pop().map(|f| f.id), Some(2));
        assert!(queue.poll_pop(&mut cx).is_pending());

        for id in 10..110 {
            queue.push(frame(id), 256).unwrap();
        }
        assert!(queue.lock().frames.capacity() >= 100);
        queue.close();
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "the close woke the reader");
        assert_eq!(queue.push(frame(200), 256), Err(Refused::Closed));
        let taken: Vec<_> = std::iter::from_fn(|| queue.try_pop()).map(|f| f.id).collect();
        assert_eq!(taken, (10..110).collect::<Vec<_>>());
        assert_eq!(queue.lock().frames.capacity(), 0, "the burst's room is freed");
        assert!(matches!(queue.poll_pop(&mut cx), Poll::Ready(None)));
    }
}
