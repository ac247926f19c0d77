//! The in-process broker: one task per process reads committed events after
//! its high-water mark, serialises each frame once, and pushes it into the
//! bounded queue of every live client whose filter matches. The loop never
//! waits on a client: a full queue or a client that makes no progress is
//! evicted with a named reason, and the client resumes from its last id.
//!
//! Registration and the high-water mark change under one lock, so a new
//! subscription learns exactly which events it will receive live (every id
//! above [`Subscription::position`]) and replays the rest from the store:
//! no gap, no duplicate at the seam (the mercure order: register, snapshot,
//! replay, then flush the live queue).
//!
//! A client still replaying history whose live queue fills is not slow, only
//! behind: it is detached as *lagged* and catches up from the store again
//! (KurrentDB's drop-to-catch-up) instead of being dropped.

mod ending;
mod fanout;
mod frame;
pub mod index;
mod queue;
mod subscription;

pub(crate) use frame::trace_of;
pub use frame::{Detached, Frame, FrameData};
pub use queue::{Sink, Wrote};
pub use subscription::Subscription;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::filter::Filter;
use crate::metrics as m;
use crate::store::{EventLog, HandOff};
use tidings_protocol::event::EventId;

/// How often a drain ends its next share of clients.
const DRAIN_TICK: Duration = Duration::from_millis(50);

/// Broker settings.
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    /// Per-client queue length.
    pub client_queue: usize,
    /// A client with queued events that takes none for this long is evicted.
    pub slow_client_timeout: Duration,
    /// How long an evicted client's connection may take to flush its last
    /// frames before it is closed by force.
    pub eviction_grace: Duration,
    /// Rows read from the store per round.
    pub read_batch: usize,
}

impl BrokerSettings {
    /// The broker's part of the streams' section.
    pub fn from_settings(streams: &crate::config::StreamSettings) -> Self {
        Self {
            client_queue: streams.client_queue as usize,
            slow_client_timeout: streams.slow_client_timeout,
            eviction_grace: streams.eviction_grace,
            read_batch: streams.read_batch as usize,
        }
    }
}

/// What a transport tells the broker about a new client.
#[derive(Debug, Default)]
pub struct SubscribeOptions {
    /// Cancelled (after the grace period) when the client is evicted and its
    /// connection has not finished by then; transports close the socket on it.
    pub kill: Option<CancellationToken>,
    /// The `transport` label.
    pub transport: &'static str,
    /// Whether the client starts in replay (catch-up) phase.
    pub catching_up: bool,
}

/// Per-client state shared between the broker and the transport.
#[derive(Debug)]
struct ClientState {
    catching_up: AtomicBool,
    /// The fan-out round of the last push, and how many frames that round
    /// pushed: a queue filled entirely by one round is a burst, not a slow
    /// client. Only the broker task touches these.
    round: AtomicU64,
    round_pushed: AtomicU64,
    detached: AtomicU8,
    /// Since when, in ms from the broker's epoch, the client has been
    /// clear of the no-progress eviction: its last take of frames, history
    /// or a heartbeat, or the push that found its queue empty.
    last_progress_ms: AtomicU64,
    /// The highest id the client was shown past the broker's position at
    /// registration (history its transport read from the store before the
    /// broker had fanned it out), else 0: if a new epoch of the log loses
    /// it, the client is ended though the broker's own position survived.
    shown: AtomicI64,
    finished: AtomicBool,
    kill: Option<CancellationToken>,
    /// The frames pushed and not yet taken.
    queue: queue::Queue,
}

#[derive(Debug)]
struct Slot {
    filter: Arc<Filter>,
    state: Arc<ClientState>,
}

impl Drop for Slot {
    /// The broker let go of the client (evicted, unsubscribed, stopped):
    /// it takes what is queued, then sees the end of its queue.
    fn drop(&mut self) {
        self.state.queue.close();
    }
}

#[derive(Debug, Default)]
struct Clients {
    /// Every event up to here has been fanned out.
    position: EventId,
    next_id: u64,
    map: HashMap<u64, Arc<Slot>>,
    /// Fan-out rounds so far.
    rounds: u64,
    /// The same slots, filed by what their filters could match.
    index: index::FilterIndex<Arc<Slot>>,
}

impl Clients {
    fn insert(&mut self, id: u64, slot: Slot) {
        let slot = Arc::new(slot);
        self.index.insert(id, &slot.filter, slot.clone());
        self.map.insert(id, slot);
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Slot>> {
        let slot = self.map.remove(&id)?;
        self.index.remove(id, &slot.filter);
        Some(slot)
    }
}

#[derive(Debug)]
struct Shared {
    store: Arc<dyn EventLog>,
    // A std mutex: it is held only for CPU work (registration, one fan-out
    // round) and never across an `.await`, which is cheaper than an async
    // mutex and cannot deadlock the runtime.
    clients: Mutex<Clients>,
    wake: Arc<Notify>,
    settings: BrokerSettings,
    /// What the clients' progress times count from: tokio's clock, so a
    /// test can move it (`tokio::time::advance`).
    epoch: Instant,
    lag_ms: AtomicU64,
    position: AtomicI64,
    /// The position, for tasks that follow the log (the subscription engine).
    advanced: watch::Sender<EventId>,
    stopped: CancellationToken,
    /// Where a round's writes for parked readers run (`fanout`); none
    /// outside a runtime (they then run in the round's caller).
    runtime: Option<tokio::runtime::Handle>,
}

/// A handle to the broker. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct Broker {
    shared: Arc<Shared>,
}

impl Broker {
    /// Creates a broker whose high-water mark starts at `head`: events up to
    /// it are history, served by replay.
    pub fn new(store: Arc<dyn EventLog>, head: EventId, settings: BrokerSettings) -> Self {
        let shared = Shared {
            store,
            clients: Mutex::new(Clients { position: head, ..Default::default() }),
            wake: Arc::new(Notify::new()),
            settings,
            epoch: Instant::now(),
            lag_ms: AtomicU64::new(0),
            position: AtomicI64::new(head),
            advanced: watch::Sender::new(head),
            stopped: CancellationToken::new(),
            runtime: tokio::runtime::Handle::try_current().ok(),
        };
        Self { shared: Arc::new(shared) }
    }

    /// The notifier that stores use to wake the broker after a commit.
    pub fn waker(&self) -> Arc<Notify> {
        self.shared.wake.clone()
    }

    /// Wakes the broker (after an in-process append).
    pub fn wake(&self) {
        self.shared.wake.notify_one();
    }

    /// The store this broker reads from.
    pub fn store(&self) -> &Arc<dyn EventLog> {
        &self.shared.store
    }

    /// Every event up to this id has been fanned out.
    pub fn position(&self) -> EventId {
        self.shared.position.load(Ordering::Acquire)
    }

    /// Follows [`Broker::position`]: changes whenever new events were fanned out.
    pub fn follow(&self) -> watch::Receiver<EventId> {
        self.shared.advanced.subscribe()
    }

    /// The length of every client's queue.
    pub fn queue_len(&self) -> usize {
        self.shared.settings.client_queue
    }

    /// Connected clients.
    pub fn client_count(&self) -> usize {
        self.lock().map.len()
    }

    /// Age of the last fanned-out event when the broker read it, in ms.
    pub fn lag_ms(&self) -> u64 {
        self.shared.lag_ms.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Clients> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (every mutation is a single insert/remove), so poisoning is ignored.
        self.shared.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.shared.epoch.elapsed().as_millis() as u64
    }

    /// Registers a live client. It receives every matching event with an id
    /// above the returned subscription's [`Subscription::position`].
    pub fn subscribe(&self, filter: Arc<Filter>, options: SubscribeOptions) -> Subscription {
        let state = Arc::new(ClientState {
            catching_up: AtomicBool::new(options.catching_up),
            round: AtomicU64::new(0),
            round_pushed: AtomicU64::new(0),
            detached: AtomicU8::new(0),
            last_progress_ms: AtomicU64::new(self.now_ms()),
            shown: AtomicI64::new(0),
            finished: AtomicBool::new(false),
            kill: options.kill,
            queue: queue::Queue::default(),
        });
        let mut clients = self.lock();
        let id = clients.next_id;
        clients.next_id += 1;
        let position = clients.position;
        if self.shared.stopped.is_cancelled() {
            state.detached.store(4, Ordering::Release);
            state.queue.close();
        } else {
            clients.insert(id, Slot { filter, state: state.clone() });
        }
        drop(clients);
        m::client_connected(options.transport);
        Subscription { id, state, broker: self.clone(), position, transport: options.transport }
    }

    /// Runs the fan-out loop until `cancel`. Once `closing` (the server's
    /// shutdown) is cancelled, every client's queue is closed and new
    /// clients are refused, so every live session ends at once; the log is
    /// still followed until `cancel`, for whoever follows the position.
    #[expect(clippy::disallowed_methods, reason = "the broker's closer outlives one read of the log, and ends with the loop")]
    pub async fn run(self, closing: CancellationToken, cancel: CancellationToken) {
        // The slow-client sweep runs four times per timeout, so an eviction is
        // at most a quarter late; derived from the setting, not a setting.
        let sweep_every = (self.shared.settings.slow_client_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut sweep = tokio::time::interval(sweep_every);
        sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // On a task of its own, so the close cannot wait behind a read of
        // the log that is slow or retrying (a store that is down).
        let closer = {
            let (broker, cancel) = (self.clone(), cancel.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = closing.cancelled() => broker.shutdown(),
                    _ = cancel.cancelled() => {}
                }
            })
        };
        let mut backoff = crate::pacing::STORE;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = self.shared.wake.notified() => {}
                _ = sweep.tick() => { self.sweep(); continue; }
            }
            // Read until caught up; on a store failure retry with backoff
            // (no wake-up may come for rows that are already committed).
            loop {
                let after = self.position();
                match self.shared.store.read_tail(after, self.shared.settings.read_batch).await {
                    Ok(rows) if rows.is_empty() => {
                        backoff.reset();
                        break;
                    }
                    Ok(rows) => {
                        backoff.reset();
                        if rows[0].id > after + 1 {
                            self.crossed(after).await;
                        }
                        self.fan_out(rows, false);
                    }
                    Err(e) => {
                        // A stalled synchronous standby is logged once, where
                        // it is noticed (TIDINGS_DELIVERY=replicated).
                        if matches!(e, crate::store::StoreError::Unreplicated(_)) {
                            tracing::debug!(error = %crate::report::chain(&e), "broker waits for the synchronous standby");
                        } else {
                            tracing::warn!(error = %crate::report::chain(&e), "broker cannot read the event log; retrying");
                        }
                        tokio::select! {
                            _ = cancel.cancelled() => break,
                            _ = tokio::time::sleep(backoff.step()) => {}
                        }
                    }
                }
                if cancel.is_cancelled() {
                    break;
                }
            }
        }
        let _ = closer.await;
        self.shutdown();
    }

    /// What the store hands over after an append ([`HandOff`]): taken (and
    /// fanned out at once) when it holds the very next ids the broker owes
    /// its clients; otherwise left for the broker's read of the log. A
    /// weak handle, so the store does not keep the broker alive.
    pub fn hand_off(&self) -> HandOff {
        let shared = Arc::downgrade(&self.shared);
        HandOff::new(move |rows| {
            shared.upgrade().is_some_and(|shared| {
                let broker = Broker { shared };
                !broker.shared.stopped.is_cancelled() && broker.fan_out(rows, true)
            })
        })
    }

    /// Every event up to `last` has gone out (called under the lock).
    fn advance(&self, clients: &mut Clients, last: EventId) {
        clients.position = last;
        self.shared.position.store(last, Ordering::Release);
        self.shared.advanced.send_replace(last);
    }

    /// Evicts clients that have events waiting and took none in time.
    fn sweep(&self) {
        let now = self.now_ms();
        let timeout = self.shared.settings.slow_client_timeout.as_millis() as u64;
        let mut clients = self.lock();
        let mut stuck = Vec::new();
        for (id, slot) in &clients.map {
            let depth = slot.state.queue.len();
            if depth > 0 {
                // Sampled here, once per sweep, rather than on the hot path.
                m::queue_depth(depth);
                if now.saturating_sub(slot.state.last_progress_ms.load(Ordering::Relaxed)) > timeout {
                    stuck.push(*id);
                }
            }
        }
        for id in stuck {
            if let Some(slot) = clients.remove(id) {
                self.detach(&slot, Detached::NoProgress);
            }
        }
    }

    #[expect(clippy::disallowed_methods, reason = "a detached client's queue is closed off the fan-out's lock")]
    fn detach(&self, slot: &Slot, reason: Detached) {
        slot.state.detached.store(reason as u8 + 1, Ordering::Release);
        if reason == Detached::Lagged {
            return;
        }
        m::client_dropped(reason.label());
        tracing::info!(reason = reason.label(), "evicting a slow client");
        if let Some(kill) = slot.state.kill.clone() {
            let state = slot.state.clone();
            let grace = self.shared.settings.eviction_grace;
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                if !state.finished.load(Ordering::Acquire) {
                    kill.cancel();
                }
            });
        }
        // Dropping the slot (the last Arc, by the caller) closes the queue:
        // the client drains what is queued, then sees the end of it.
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods, reason = "tests start the tasks they drive")]
pub(crate) mod tests {
    use super::*;

    /// A plain stored event body for the broker's and the transports' unit
    /// tests.
    pub(crate) fn sample_body() -> tidings_protocol::event::EventBody {
        serde_json::from_value(serde_json::json!({
            "event_type": "comment.posted",
            "ref": "paper:p-1",
            "occurred_at": "2026-01-01T00:00:00Z",
            "payload": {"x": 1},
            "links": [],
            "visibility": "public",
        }))
        .expect("a sample body")
    }

    fn row(id: EventId) -> crate::store::Record {
        crate::store::Record { id, body: sample_body().to_json(), recorded_ms: 0 }
    }

    fn ids(sub: &mut Subscription) -> Vec<EventId> {
        std::iter::from_fn(|| sub.try_recv()).map(|f| f.id).collect()
    }

    /// A commit handed over is fanned out at once only when it holds the
    /// very next ids; the broker's own read of rows handed over meanwhile
    /// delivers only what is new, so nothing goes out twice or out of order.
    fn settings() -> BrokerSettings {
        BrokerSettings {
            client_queue: 16,
            slow_client_timeout: Duration::from_secs(5),
            eviction_grace: Duration::from_secs(1),
            read_batch: 100,
        }
    }

    /// A broker at position 10 over a fresh embedded store (kept alive by
    /// the directory), and a client taking everything.
    async fn broker_with_a_client() -> (tempfile::TempDir, Broker, Subscription) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::embedded::EmbeddedStore::open(dir.path()).await.unwrap());
        let broker = Broker::new(store, 10, settings());
        let sub = broker.subscribe(Arc::new(Filter::any()), SubscribeOptions::default());
        (dir, broker, sub)
    }

    #[tokio::test]
    async fn a_hand_off_is_taken_only_when_it_holds_the_next_ids() {
        let (_dir, broker, mut sub) = broker_with_a_client().await;
        let hand_off = broker.hand_off();

        assert!(!hand_off.give(vec![row(12), row(13)]), "11 has not gone out: 12 is not next");
        assert_eq!((broker.position(), ids(&mut sub)), (10, vec![]));

        assert!(hand_off.give(vec![row(11), row(12)]));
        assert_eq!((broker.position(), ids(&mut sub)), (12, vec![11, 12]));

        // The broker read 11..=14 while 11 and 12 were handed over.
        assert!(broker.fan_out(vec![row(11), row(12), row(13), row(14)], false));
        assert_eq!((broker.position(), ids(&mut sub)), (14, vec![13, 14]));
        assert!(broker.fan_out(vec![row(13), row(14)], false));
        assert_eq!((broker.position(), ids(&mut sub)), (14, vec![]));

        // With no client, nothing is parsed but the position moves on.
        drop(sub);
        assert!(hand_off.give(vec![row(15), row(16)]));
        assert_eq!(broker.position(), 16);
        let mut sub = broker.subscribe(Arc::new(Filter::any()), SubscribeOptions::default());
        assert_eq!(sub.position(), 16);
        assert!(hand_off.give(vec![row(17)]));
        assert_eq!(ids(&mut sub), vec![17]);

        // Stopped: nothing is taken (the store wakes the broker instead).
        broker.shutdown();
        assert!(!hand_off.give(vec![row(18)]));
    }

    /// The no-progress clock of a client that had taken everything starts
    /// with the frame that finds its queue empty, not at its last take: an
    /// idle client is not evicted because the sweep came before its task.
    /// A client that has not taken what it was pushed for longer than the
    /// timeout is (on tokio's clock, moved here rather than waited for).
    #[tokio::test]
    async fn an_idle_client_is_not_stuck_for_a_frame_just_pushed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(crate::store::embedded::EmbeddedStore::open(dir.path()).await.unwrap());
        let timeout = Duration::from_secs(2);
        let broker = Broker::new(store, 10, BrokerSettings { slow_client_timeout: timeout, ..settings() });
        let mut idle = broker.subscribe(Arc::new(Filter::any()), SubscribeOptions::default());
        let stuck = broker.subscribe(Arc::new(Filter::any()), SubscribeOptions::default());
        assert!(broker.fan_out(vec![row(11)], true));
        assert_eq!(ids(&mut idle), vec![11]);
        // Both are idle for longer than the timeout; only `stuck` holds a
        // frame it did not take.
        tokio::time::pause();
        tokio::time::advance(timeout + Duration::from_millis(200)).await;
        assert!(broker.fan_out(vec![row(12)], true));
        broker.sweep();
        assert!(idle.attached(), "evicted as {:?} for a frame pushed a moment ago", idle.detached());
        assert_eq!(ids(&mut idle), vec![12]);
        assert_eq!(stuck.detached(), Detached::NoProgress, "the clock moved: a client that took nothing is evicted");
    }

    /// The server's shutdown ends every live client (its queue closes after
    /// what it holds) and every client that comes later, while the broker
    /// goes on following the log until it is stopped.
    #[tokio::test]
    async fn closing_ends_every_live_client_and_refuses_later_ones() {
        let (_dir, broker, mut sub) = broker_with_a_client().await;
        assert!(broker.fan_out(vec![row(11)], true));
        let (closing, cancel) = (CancellationToken::new(), CancellationToken::new());
        let task = tokio::spawn(broker.clone().run(closing.clone(), cancel.clone()));

        assert!(sub.attached());
        closing.cancel();
        assert_eq!(sub.recv().await.map(|f| f.id), Some(11), "what was queued is still taken");
        assert!(sub.recv().await.is_none());
        assert_eq!(sub.detached(), Detached::Closed);
        assert!(!sub.attached(), "the position no longer speaks for it");
        let mut late = broker.subscribe(Arc::new(Filter::any()), SubscribeOptions::default());
        assert!(late.recv().await.is_none());
        assert_eq!(late.detached(), Detached::Closed);

        cancel.cancel();
        task.await.unwrap();
    }
}
