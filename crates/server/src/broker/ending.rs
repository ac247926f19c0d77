//! How the broker ends the clients it holds all at once or spread over a
//! window: a rolling restart's drain, the end of a broker whose position lay
//! in history the store lost, and the shutdown.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Broker, DRAIN_TICK, Detached, index};
use tidings_protocol::event::EventId;

impl Broker {
    /// A rolling restart's drain: ends the clients it holds spread evenly
    /// over `window`, each as at shutdown (SSE: a jittered `retry:`;
    /// WebSocket: close 1001; a long-poll: answered), a share every tick,
    /// so their reconnections reach the other processes spread over the
    /// window instead of in one storm. Clients that arrive meanwhile are
    /// ended in the same way; whatever is left at the end of the window is
    /// ended then. Once none is left the drain is over, window or not: an
    /// idle process exits at once. The broker goes on serving until the
    /// shutdown.
    pub async fn drain(&self, window: Duration) {
        let started = Instant::now();
        let mut tick = tokio::time::interval(DRAIN_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Clients owed but not yet ended: a fraction carried to the next
        // tick, so a few clients spread over the window too.
        let mut due = 0.0_f64;
        loop {
            tick.tick().await;
            let elapsed = started.elapsed();
            let mut clients = self.lock();
            let left = clients.map.len();
            // Of those left, the share of the time left that one tick is.
            let ending = match window.checked_sub(elapsed) {
                Some(rest) if rest > DRAIN_TICK => {
                    due += left as f64 * DRAIN_TICK.as_secs_f64() / rest.as_secs_f64();
                    let now = due.floor();
                    due -= now;
                    now as usize
                }
                _ => left,
            };
            let ids: Vec<u64> = clients.map.keys().take(ending).copied().collect();
            for id in ids {
                if let Some(slot) = clients.remove(id) {
                    slot.state.detached.store(Detached::Closed as u8 + 1, Ordering::Release);
                }
            }
            let none_left = clients.map.is_empty();
            drop(clients);
            if none_left || elapsed >= window {
                return;
            }
        }
    }

    /// The log's next id after `after` is not `after + 1`: a new epoch
    /// began. When `after` lies in the suffix the store lost, every client
    /// may have been shown events that are gone: each is ended as at a
    /// drain, and resumes from its last id, where the lost history is
    /// announced (the sessions' resume check). Otherwise only the clients
    /// whose transports showed them history past `after` that is lost (a
    /// device that paged `sync.delta` ahead of a lagging broker, a stream
    /// resumed from an id another process had shown it) are ended; a client
    /// whose last id is at or below the fork goes on silently.
    pub(super) async fn crossed(&self, after: EventId) {
        let store = &self.shared.store;
        let epochs = match store.bounds().await {
            Ok(bounds) => store.epochs(bounds.epoch).await,
            Err(e) => Err(e),
        };
        let epochs = match epochs {
            Ok(epochs) => Some(epochs),
            Err(e) => {
                // Ending every client costs a reconnect each; keeping a
                // client that saw lost events would hide them from it.
                tracing::warn!(error = %crate::report::chain(&e), "cannot read the log's epochs; ending every client to be safe");
                None
            }
        };
        let fork_of = |id: EventId| match &epochs {
            Some(epochs) => epochs.lost(id).map(|epoch| epoch.fork),
            None => Some(EventId::MAX),
        };
        let mut clients = self.lock();
        if let Some(fork) = fork_of(after) {
            let ended = clients.map.len();
            for (_, slot) in clients.map.drain() {
                slot.state.detached.store(Detached::Closed as u8 + 1, Ordering::Release);
            }
            clients.index = index::FilterIndex::default();
            tracing::warn!(
                position = after,
                fork,
                ended,
                "the broker's position lay in history the store lost; its clients resume from their last ids"
            );
            return;
        }
        let shown_lost: Vec<u64> = clients
            .map
            .iter()
            .filter(|(_, slot)| {
                let shown = slot.state.shown.load(Ordering::Acquire);
                shown > after && fork_of(shown).is_some()
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &shown_lost {
            if let Some(slot) = clients.remove(*id) {
                slot.state.detached.store(Detached::Closed as u8 + 1, Ordering::Release);
            }
        }
        let ended = shown_lost.len();
        if ended > 0 {
            tracing::warn!(
                position = after,
                ended,
                "clients had been shown history past the broker's position that the store lost; they resume from their last ids"
            );
        }
    }

    /// Detaches every client (their streams end) and refuses new ones.
    pub(super) fn shutdown(&self) {
        self.shared.stopped.cancel();
        let mut clients = self.lock();
        for (_, slot) in clients.map.drain() {
            slot.state.detached.store(4, Ordering::Release);
        }
        clients.index = index::FilterIndex::default();
    }
}
