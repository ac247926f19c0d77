//! A stream's socket on the direct path, shared between the stream's task
//! and the broker: while the task waits with everything written (*idle*),
//! the broker may write the stream's next chunk itself, without waking the
//! task (`broker::Sink`, written by `http/sse.rs`). What the socket does not
//! take whole (or a write that fails) is left here for the task, which
//! writes it before anything else, with its deadline, as it writes its own.
//!
//! Who writes is settled by two flags: the task lowers *idle* before it
//! looks at anything when it wakes, and raises it only when it waits again
//! with nothing in hand; the broker writes only while the task is parked in
//! the client's queue and idle, under the queue's lock, which the task
//! takes to unpark before it writes anything of its own. So the two never
//! write at once, and the bytes leave in the order they were queued.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tokio::net::TcpStream;

/// A direct stream's socket and what its writers share (see the module docs).
#[derive(Debug)]
pub(crate) struct Link {
    pub(super) stream: TcpStream,
    /// The task waits with everything written.
    idle: AtomicBool,
    /// A broker write left something for the task: the rest of a chunk,
    /// or a failure.
    owed: AtomicBool,
    /// That rest, or `None` when the write failed (boxed: it is rare, and
    /// every stream carries the room).
    #[expect(clippy::box_collection, reason = "one pointer of room in every stream, for a rest few ever have")]
    rest: Mutex<Option<Box<Vec<Bytes>>>>,
}

/// What a broker write left the task.
pub(super) enum Owed {
    /// The rest of a chunk, to write before anything else.
    Rest(Vec<Bytes>),
    /// The socket failed: the stream is over.
    Failed,
}

impl Link {
    pub(super) fn new(stream: TcpStream) -> Self {
        Self { stream, idle: AtomicBool::new(false), owed: AtomicBool::new(false), rest: Mutex::new(None) }
    }

    /// Whether the task waits with everything written.
    pub(crate) fn idle(&self) -> bool {
        self.idle.load(Ordering::Acquire)
    }

    /// Whether no broker write left anything for the task.
    pub(crate) fn settled(&self) -> bool {
        !self.owed.load(Ordering::Acquire)
    }

    /// The task's side: it waits with everything written (`true`), or it
    /// runs (`false`, before it looks at anything).
    pub(super) fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::Release);
    }

    /// What a broker write left the task, if anything.
    pub(super) fn take_owed(&self) -> Option<Owed> {
        if !self.owed.load(Ordering::Acquire) {
            return None;
        }
        let rest = self.rest.lock().unwrap_or_else(|p| p.into_inner()).take();
        self.owed.store(false, Ordering::Release);
        Some(rest.map_or(Owed::Failed, |rest| Owed::Rest(*rest)))
    }

    /// The broker's side: writes `frames` as one chunk, without waiting.
    /// Returns whether it went out whole; if not, the rest (or the failure)
    /// is the task's, and the stream is no longer idle.
    pub(crate) fn write_chunk(&self, frames: &[Bytes]) -> bool {
        let left = match super::chunked::try_write(&self.stream, frames, true) {
            Ok(None) => return true,
            Ok(Some(rest)) => Some(Box::new(rest)),
            Err(_) => None,
        };
        self.idle.store(false, Ordering::Release);
        *self.rest.lock().unwrap_or_else(|p| p.into_inner()) = left;
        self.owed.store(true, Ordering::Release);
        false
    }
}
