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
//!
//! A reader whose stream can be written without it (a [`Sink`]: an SSE
//! stream on the direct path, a WebSocket over plain TCP) may *park*: while it waits with everything
//! written, the broker writes what it pushes straight to the stream
//! ([`Queue::flush`]), with no wake-up, no poll of the reader's task and
//! no second take of the frame. The reader unparks as soon as it runs
//! again (a heartbeat, a notice, the end), and whatever the broker could
//! not write whole (the socket full, the token expired, a notice due) is
//! handed back to it, in order: the queue's lock orders every write of
//! frames (a WebSocket's task also writes answers and pings, and its link
//! orders those: `server::Link`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use super::Frame;
use tidings_protocol::event::EventId;

/// A stream the broker can write for its parked reader (see the module
/// docs); the SSE stream on the direct path and the WebSocket over plain
/// TCP are.
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// Whether the stream's task has written everything it took and waits:
    /// only then may the broker write for it.
    fn idle(&self) -> bool;
    /// Whether nothing the broker wrote is left for the task to finish
    /// (the rest of a write the socket did not take whole): only then may
    /// the reader park.
    fn settled(&self) -> bool;
    /// Writes `frames`, in order, without waiting.
    fn write(&self, frames: &[Frame]) -> Wrote;
}

/// What a [`Sink::write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wrote {
    /// Every frame went out whole.
    All,
    /// The socket took part: the sink keeps the rest for the stream's task,
    /// which must write it before anything else.
    Part,
    /// Nothing was written: the stream's task writes the frames (a notice
    /// is due first, the token expired, the stream failed).
    Declined,
}

/// Most frames one write of a flush carries.
const MAX_FLUSH: usize = 64;

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
    /// The reader's stream, which the broker writes while it is parked.
    sink: Option<Arc<dyn Sink>>,
    /// The reader waits with everything written: the broker writes for it.
    parked: bool,
    /// Frames at or below this id were delivered already (parked only).
    cursor: EventId,
    /// The last id the broker wrote for the reader since it last polled
    /// (0: none).
    written: EventId,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every mutation is one push or pop: a panic cannot leave it torn.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `frame` unless `bound` frames wait already or the queue was
    /// closed; wakes the reader, unless it is parked: the frame is then the
    /// broker's to write ([`Self::flush`], which wakes the reader instead
    /// if its stream's task runs meanwhile). Whether the stream is idle is
    /// looked at by that flush, not here: the look is a cache miss per
    /// client, and the flush pays it with the write, off the round.
    pub(super) fn push(&self, frame: Frame, bound: usize) -> Result<Pushed, Refused> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(Refused::Closed);
        }
        if inner.frames.len() >= bound {
            return Err(Refused::Full);
        }
        let was_empty = inner.frames.is_empty();
        inner.frames.push_back(frame);
        if inner.parked {
            return Ok(Pushed { was_empty, flush: true });
        }
        let waker = inner.waker.take();
        drop(inner);
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(Pushed { was_empty, flush: false })
    }

    /// The stream the broker may write while the reader is parked.
    pub(super) fn attach(&self, sink: Arc<dyn Sink>) {
        self.lock().sink = Some(sink);
    }

    /// The stream is gone: nothing is written to it, and it is let go.
    pub(super) fn detach(&self) {
        let mut inner = self.lock();
        inner.parked = false;
        let sink = inner.sink.take();
        drop(inner);
        drop(sink);
    }

    /// The stream attached, if any.
    pub(super) fn sink(&self) -> Option<Arc<dyn Sink>> {
        self.lock().sink.clone()
    }

    /// Writes what is queued to the parked reader's stream, in order;
    /// wakes the reader when it cannot (see [`Wrote`]). Returns how many
    /// frames went out.
    pub(super) fn flush(&self) -> usize {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let mut sent = 0;
        while inner.parked {
            let cursor = inner.cursor;
            while inner.frames.front().is_some_and(|f| f.id <= cursor) {
                inner.frames.pop_front();
            }
            if inner.frames.is_empty() {
                break;
            }
            let Some(sink) = inner.sink.as_ref() else { break };
            let n = inner.frames.len().min(MAX_FLUSH);
            let wrote = if sink.idle() { sink.write(&inner.frames.make_contiguous()[..n]) } else { Wrote::Declined };
            if wrote != Wrote::Declined {
                let last = inner.frames[n - 1].id;
                inner.frames.drain(..n);
                inner.cursor = last;
                inner.written = last;
                sent += n;
            }
            if wrote != Wrote::All {
                inner.parked = false;
                let waker = inner.waker.take();
                drop(guard);
                if let Some(waker) = waker {
                    waker.wake();
                }
                return sent;
            }
        }
        if inner.frames.is_empty() && inner.frames.capacity() > KEEP {
            inner.frames = VecDeque::new();
        }
        sent
    }

    /// No frame follows: the reader takes what is queued, then sees the end.
    pub(super) fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        inner.parked = false;
        let waker = inner.waker.take();
        drop(inner);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// The next frame; `None` once the queue is closed and drained.
    ///
    /// With `park` (the reader's cursor: what it has delivered) the reader
    /// first unparks (the broker writes for it no more), its cursor moved
    /// past what the broker wrote for it meanwhile; and if it must wait,
    /// it parks, when its stream has nothing of the broker's left to
    /// finish. Every poll of a reader that parks must give it.
    pub(super) fn poll_pop(&self, cx: &mut Context<'_>, mut park: Option<&mut EventId>) -> Poll<Option<Frame>> {
        let mut inner = self.lock();
        if let Some(cursor) = park.as_deref_mut() {
            inner.parked = false;
            *cursor = std::mem::take(&mut inner.written).max(*cursor);
        }
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
        if let Some(cursor) = park
            && inner.sink.as_ref().is_some_and(|s| s.settled())
        {
            inner.parked = true;
            inner.cursor = *cursor;
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

/// What a [`Queue::push`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pushed {
    /// The queue was empty before (the reader had taken everything).
    pub(super) was_empty: bool,
    /// The reader is parked: the frame is the broker's to write.
    pub(super) flush: bool,
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

        assert!(queue.poll_pop(&mut cx, None).is_pending());
        assert_eq!(queue.push(frame(1), 2), Ok(Pushed { was_empty: true, flush: false }), "pushed onto an empty queue");
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "the push woke the reader");
        assert_eq!(queue.push(frame(2), 2), Ok(Pushed { was_empty: false, flush: false }));
        assert_eq!(queue.push(frame(3), 2), Err(Refused::Full));
        assert_eq!(queue.len(), 2);
        assert!(matches!(queue.poll_pop(&mut cx, None), Poll::Ready(Some(f)) if f.id == 1));
        assert_eq!(queue.try_pop().map(|f| f.id), Some(2));
        assert!(queue.poll_pop(&mut cx, None).is_pending());

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
        assert!(matches!(queue.poll_pop(&mut cx, None), Poll::Ready(None)));
    }

    /// A stream that records what the broker wrote to it, and answers as
    /// told.
    #[derive(Debug, Default)]
    struct Stream {
        idle: std::sync::atomic::AtomicBool,
        owed: std::sync::atomic::AtomicBool,
        answer: Mutex<Option<Wrote>>,
        wrote: Mutex<Vec<i64>>,
    }

    impl Sink for Stream {
        fn idle(&self) -> bool {
            self.idle.load(Ordering::SeqCst)
        }
        fn settled(&self) -> bool {
            !self.owed.load(Ordering::SeqCst)
        }
        fn write(&self, frames: &[Frame]) -> Wrote {
            let answer = self.answer.lock().unwrap().unwrap_or(Wrote::All);
            if answer != Wrote::Declined {
                self.wrote.lock().unwrap().extend(frames.iter().map(|f| f.id));
            }
            answer
        }
    }

    /// A parked reader is not woken: the broker writes its frames, in
    /// order, skipping what it delivered already, and its next poll moves
    /// its cursor past them; a write the stream declines or takes in part
    /// unparks it and wakes it, with what was not written still queued;
    /// a reader does not park while its stream owes a rest, and the close
    /// unparks it.
    #[test]
    fn a_parked_reader_is_written_for_and_woken_only_when_it_must_write() {
        let queue = Queue::default();
        let stream = Arc::new(Stream::default());
        queue.attach(stream.clone());
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let wakes = || count.0.load(Ordering::SeqCst);
        let mut cursor = 2;

        // Parked with everything up to 2 delivered, the stream idle.
        assert!(queue.poll_pop(&mut cx, Some(&mut cursor)).is_pending());
        stream.idle.store(true, Ordering::SeqCst);
        assert_eq!(queue.push(frame(2), 8), Ok(Pushed { was_empty: true, flush: true }));
        assert_eq!(queue.push(frame(3), 8), Ok(Pushed { was_empty: false, flush: true }));
        assert_eq!(wakes(), 0, "a parked reader is not woken");
        assert_eq!(queue.flush(), 1);
        assert_eq!(*stream.wrote.lock().unwrap(), vec![3], "2 was delivered already");
        assert_eq!(queue.len(), 0);
        queue.push(frame(4), 8).unwrap();
        assert_eq!(queue.flush(), 1);
        // The reader's poll unparks it, past what was written.
        assert!(queue.poll_pop(&mut cx, Some(&mut cursor)).is_pending());
        assert_eq!(cursor, 4);
        // Parked again by that poll: a frame ≤ its cursor is not written.
        queue.push(frame(4), 8).unwrap();
        assert_eq!(queue.flush(), 0);
        // A stream that is not idle (its task runs) is not written: the
        // flush writes nothing and wakes the reader.
        stream.idle.store(false, Ordering::SeqCst);
        assert_eq!(queue.push(frame(5), 8), Ok(Pushed { was_empty: true, flush: true }), "parked: the flush looks");
        assert_eq!(wakes(), 0);
        assert_eq!(queue.flush(), 0);
        assert_eq!(wakes(), 1, "not idle: its task writes");
        assert!(matches!(queue.poll_pop(&mut cx, Some(&mut cursor)), Poll::Ready(Some(f)) if f.id == 5));
        cursor = 5;

        // Declined: nothing written, the reader woken, the frames its own.
        assert!(queue.poll_pop(&mut cx, Some(&mut cursor)).is_pending());
        stream.idle.store(true, Ordering::SeqCst);
        *stream.answer.lock().unwrap() = Some(Wrote::Declined);
        queue.push(frame(7), 8).unwrap();
        assert_eq!(queue.flush(), 0);
        assert_eq!(wakes(), 2);
        assert!(matches!(queue.poll_pop(&mut cx, Some(&mut cursor)), Poll::Ready(Some(f)) if f.id == 7));
        assert_eq!(cursor, 5, "nothing was written for it");
        cursor = 7;

        // In part: the frames are the stream's (it owes their rest), the
        // reader is woken, and it does not park again until the rest is out.
        assert!(queue.poll_pop(&mut cx, Some(&mut cursor)).is_pending());
        *stream.answer.lock().unwrap() = Some(Wrote::Part);
        queue.push(frame(8), 8).unwrap();
        assert_eq!(queue.flush(), 1);
        assert_eq!(wakes(), 3);
        stream.owed.store(true, Ordering::SeqCst);
        assert!(queue.poll_pop(&mut cx, Some(&mut cursor)).is_pending());
        assert_eq!(cursor, 8);
        assert_eq!(queue.push(frame(9), 8), Ok(Pushed { was_empty: true, flush: false }), "not parked while owing");
        assert_eq!(wakes(), 4);
        assert_eq!(queue.try_pop().map(|f| f.id), Some(9));

        // The close unparks: the reader is woken and takes what is queued.
        stream.owed.store(false, Ordering::SeqCst);
        *stream.answer.lock().unwrap() = None;
        cursor = 9;
        assert!(queue.poll_pop(&mut cx, Some(&mut cursor)).is_pending());
        queue.push(frame(10), 8).unwrap();
        queue.close();
        assert_eq!(queue.flush(), 0);
        assert_eq!(wakes(), 5);
        assert_eq!(queue.try_pop().map(|f| f.id), Some(10));
        assert_eq!(*stream.wrote.lock().unwrap(), vec![3, 4, 8]);
    }
}
