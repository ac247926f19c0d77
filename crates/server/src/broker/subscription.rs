//! A live client's side of the broker: its [`Subscription`], which takes
//! frames from its bounded queue, says why they stopped, records progress,
//! and unregisters the client when dropped.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Broker, ClientState, Detached, Frame, Sink};
use crate::metrics as m;
use tidings_protocol::event::EventId;

/// A live client's registration. Dropping it unregisters the client.
#[derive(Debug)]
pub struct Subscription {
    pub(super) id: u64,
    pub(super) state: Arc<ClientState>,
    pub(super) broker: Broker,
    pub(super) position: EventId,
    pub(super) transport: &'static str,
}

impl Subscription {
    /// Live delivery covers every id above this; history up to it is replayed
    /// from the store.
    pub fn position(&self) -> EventId {
        self.position
    }

    /// The next live frame; `None` once detached (see [`Self::detached`]).
    pub async fn recv(&mut self) -> Option<Frame> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// [`Self::recv`] as a poll function, for a transport that waits on
    /// its queue and something else in one poll.
    pub fn poll_recv(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Frame>> {
        self.poll_recv_or_park(cx, None)
    }

    /// [`Self::poll_recv`] for a client with a stream attached
    /// ([`Self::attach`]), given its cursor (what it has delivered): it
    /// parks while it waits, and the broker writes its frames to the
    /// stream itself; its next poll unparks it, and moves the cursor past
    /// what was written meanwhile.
    pub fn poll_recv_or_park(&mut self, cx: &mut std::task::Context<'_>, park: Option<&mut EventId>) -> std::task::Poll<Option<Frame>> {
        let frame = std::task::ready!(self.state.queue.poll_pop(cx, park));
        self.progress();
        std::task::Poll::Ready(frame)
    }

    /// The stream the broker writes while the client is parked (see
    /// `broker::queue`).
    pub fn attach(&self, sink: Arc<dyn Sink>) {
        self.state.queue.attach(sink);
    }

    /// The stream attached, if any.
    pub fn sink(&self) -> Option<Arc<dyn Sink>> {
        self.state.queue.sink()
    }

    /// A frame already queued, without waiting (for coalescing writes).
    pub fn try_recv(&mut self) -> Option<Frame> {
        self.state.queue.try_pop()
    }

    /// Whether no frame is queued.
    pub fn is_empty(&self) -> bool {
        self.state.queue.len() == 0
    }

    /// Whether the broker still pushes to this client: read after the
    /// position, it says every matching frame up to that position was
    /// queued (a detach is stored before any later position).
    pub fn attached(&self) -> bool {
        self.state.detached.load(Ordering::Acquire) == 0
    }

    /// Why the queue ended.
    pub fn detached(&self) -> Detached {
        Detached::from_u8(self.state.detached.load(Ordering::Acquire))
    }

    /// When the client last took a frame, or history, or a heartbeat
    /// ([`Self::progress`]), or was pushed a frame into its empty queue, to
    /// the millisecond.
    pub fn idle_since(&self) -> Instant {
        self.broker.shared.epoch + Duration::from_millis(self.state.last_progress_ms.load(Ordering::Relaxed))
    }

    /// Records progress (frames taken or history written), which keeps the
    /// client clear of the no-progress eviction.
    pub fn progress(&self) {
        self.state.last_progress_ms.store(self.broker.now_ms(), Ordering::Relaxed);
    }

    /// Records that the client was shown history up to `id` beyond
    /// [`Self::position`] (read from the store before the broker fanned it
    /// out): should a new epoch of the log lose that history while the
    /// broker's own position survives, the client is ended all the same and
    /// told when it resumes (see `Broker::crossed`).
    pub fn shown(&self, id: EventId) {
        if id > self.position {
            self.state.shown.fetch_max(id, Ordering::Release);
        }
    }

    /// Marks the end of replay: from now on a full queue means a slow client.
    pub fn set_live(&self) {
        self.state.catching_up.store(false, Ordering::Release);
    }

    /// Marks the client's connection as finished, so no forced close follows.
    pub fn finish(&self) {
        self.state.finished.store(true, Ordering::Release);
    }

    /// The broker this subscription belongs to.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // The stream is over: the broker holds its socket no longer (an
        // evicted client's state outlives it for the eviction grace).
        self.state.queue.detach();
        self.finish();
        self.broker.lock().remove(self.id);
        m::client_disconnected(self.transport);
    }
}
