//! Storage: the event log the broker and the transports stand on.
//!
//! A store is four concerns, one trait each, and [`Store`] is all of them:
//! [`EventLog`] (append with gap-free ids that become visible in commit
//! order, read after an id, the head, and a wake-up whenever something was
//! committed), [`ConsumerStore`], [`TreeStore`] and [`FederationStore`]. Each
//! backend keeps one file per concern; `tests/api/store.rs` is the
//! conformance suite every backend passes. Records are opaque
//! to the store (a type name for indexing, and a JSON body): no event
//! vocabulary (docs/events.md) lives here, so tree changes and
//! notifications share the log.
//!
//! Implementations: [`postgres`] (production, several processes, one LISTEN
//! connection per process) and [`embedded`] (a single-node SQLite file, for a
//! machine with nothing installed). Only the composition root (`app`) names a
//! concrete store. [`epoch`]: what survives a store that lost a suffix of its
//! log (a failover, a restore), and where a new epoch's ids begin.
//!
//! This file holds the four traits and the failures; what they carry is
//! beside it, one file per idea: `record` (the log's records), `tree_write`
//! (tree writes and engine steps), `consumer`, `idempotency`, `outbox`,
//! `status`; and `housekeeping` (retention and the health probe).

pub mod consumer;
pub mod embedded;
pub mod epoch;
pub mod group;
mod housekeeping;
pub mod idempotency;
pub mod outbox;
pub mod postgres;
mod record;
pub mod status;
mod tree_write;

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use consumer::{Acked, Actor, Consumer, ConsumerOpen, DeviceRead, Moved, Opened};
pub use epoch::{Epoch, EpochReason, Epochs};
pub use housekeeping::{run_health_probe, run_retention};
pub use idempotency::{IdempotencyKey, Publish, Published};
pub use outbox::{Decide, OutboxDecision, OutboxMoved, OutboxRow, OutboxStatus};
pub use record::{Bounds, HandOff, NewRecord, Record};
pub use status::{DeliveryStatus, DeviceCursor, Listener, ListenerState, ReplicaStatus, Replicas};
use tidings_protocol::event::EventId;
pub use tidings_protocol::tree::{ChangeEvent, ChangeKind};
pub use tree_write::{Condition, EngineCommit, EngineEffect, Tally, TreeEntry, TreeOutcome, TreeWrite};

/// Which store backs this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// PostgreSQL.
    Postgres,
    /// The embedded single-node store.
    Embedded,
}

impl StoreKind {
    /// The name shown in logs and `/health/deep`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
            Self::Embedded => "embedded",
        }
    }
}

/// Store failures, by what a caller can do about them.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached now; retrying later may work (`503`).
    #[error("the store is unavailable: {0}")]
    Unavailable(String),
    /// With `TIDINGS_DELIVERY=replicated`, the synchronous standby does not
    /// confirm: nothing new is stored or shown until it does (`503`).
    #[error("replication is unavailable: {0}")]
    Unreplicated(String),
    /// Anything else; a bug or corruption, logged and answered `500`.
    #[error("store error: {0}")]
    Other(#[from] anyhow::Error),
}

/// The owner under which the subscription courier keeps its lanes'
/// cursors in the device cursor table (not an identity hash, so no device
/// collides with it). Retention never prunes past the lowest of them.
pub const COURIER_CURSORS: &str = "tidings:courier";

/// The event log: append with gap-free, commit-ordered ids, read after an
/// id, the head and the floor, retention, and the wake-ups after commits.
#[async_trait]
pub trait EventLog: Send + Sync + std::fmt::Debug + 'static {
    /// Which store this is.
    fn kind(&self) -> StoreKind;

    /// Appends `batch` atomically (all or nothing) and returns the assigned
    /// ids, consecutive and in batch order. Ids are gap-free and commit-ordered:
    /// once a reader has seen id N, no id below N appears later.
    async fn append(&self, batch: Vec<NewRecord>) -> Result<Vec<EventId>, StoreError>;

    /// Appends `records` (one delivery) as [`Self::append`] does, unless
    /// stream `stream` of `source` has already delivered a sequence number
    /// `>= seq` here: then nothing is stored and `None` is returned; else
    /// the id of the last. The stream's high mark moves in the appending
    /// transaction, so a retried delivery is appended exactly once.
    async fn append_once(&self, source: &str, stream: &str, seq: EventId, records: Vec<NewRecord>) -> Result<Option<EventId>, StoreError>;

    /// The high mark of stream `stream` of `source` ([`Self::append_once`]).
    async fn received_mark(&self, source: &str, stream: &str) -> Result<Option<EventId>, StoreError>;

    /// Up to `limit` records with `id > after`, ascending.
    async fn read_after(&self, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError>;

    /// The same read, of history the caller knows to be committed (every
    /// id up to `after + limit` exists or was pruned): a catch-up, a poll.
    /// The PostgreSQL store serves it from a hot standby as far as one
    /// holds it (`TIDINGS_REPLICA_URLS`), the rest from the primary.
    async fn read_history(&self, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.read_after(after, limit).await
    }

    /// The broker's read of what follows its position: [`Self::read_after`],
    /// except on PostgreSQL with `TIDINGS_BROKER_READS=replica`, where the
    /// ids up to the highest notified head are read at a hot standby once it
    /// holds them (waiting a little), and nothing is read past that head
    /// while the LISTEN session holds (every commit notifies).
    async fn read_tail(&self, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.read_after(after, limit).await
    }

    /// The hot standbys serving history, and how many history reads and
    /// broker tail reads the primary answered; `None` without standbys.
    fn replicas(&self) -> Option<Replicas> {
        None
    }

    /// Delivery that waits for the synchronous standby; `None` unless
    /// `TIDINGS_DELIVERY=replicated`.
    fn delivery(&self) -> Option<DeliveryStatus> {
        None
    }

    /// The highest committed id (0 when empty).
    async fn head(&self) -> Result<EventId, StoreError>;

    /// The lowest retained id minus one, i.e. the oldest resume point that can
    /// be served without a gap (0 when nothing was ever pruned).
    async fn floor(&self) -> Result<EventId, StoreError>;

    /// Publishes: each one's records appended all or nothing, with its
    /// `Idempotency-Key` recorded in the same transaction, in one
    /// transaction for the whole group (see [`idempotency`]). A publish
    /// whose key is live stores nothing and is answered from the key.
    async fn publish(&self, publishes: Vec<Publish>) -> Result<Vec<Published>, StoreError>;

    /// Forgets the idempotency keys recorded before `before_ms` (Unix ms);
    /// how many.
    async fn prune_idempotency(&self, before_ms: i64) -> Result<u64, StoreError>;

    /// The SQL outbox (PostgreSQL's `tidings.publish`): moves up to `limit`
    /// committed rows into the log, each as `decide` says, in one
    /// transaction with their deletion (see [`outbox`]); a row over
    /// `max_bytes` is set aside as `payload_too_large` without being read.
    /// A store without an outbox moves nothing.
    async fn outbox_move(&self, _limit: usize, _max_bytes: usize, _decide: &Decide<'_>) -> Result<OutboxMoved, StoreError> {
        Ok(OutboxMoved::default())
    }

    /// Wakes whoever moves the outbox after a `tidings.publish` commits
    /// (and after each reconnect of the LISTEN session); `None` without an
    /// outbox.
    fn outbox_wakeups(&self) -> Option<Arc<Notify>> {
        None
    }

    /// The outbox's depth and age; `None` without one.
    async fn outbox_status(&self) -> Result<Option<OutboxStatus>, StoreError> {
        Ok(None)
    }

    /// Writes the registry's names (with aliases), whether it is strict,
    /// and the largest payload (`TIDINGS_MAX_PAYLOAD`) where
    /// `tidings.publish` checks them; nothing without an outbox.
    async fn registry_sync(&self, _names: Vec<String>, _strict: bool, _max_payload: usize) -> Result<(), StoreError> {
        Ok(())
    }

    /// Forgets the SQL outbox's set-aside rows queued before `before_ms`
    /// (Unix ms); how many. Nothing without an outbox.
    async fn prune_set_aside(&self, _before_ms: i64) -> Result<u64, StoreError> {
        Ok(0)
    }

    /// [`Self::floor`] and [`Self::head`] read together, in one round trip
    /// where the store has round trips: what a resuming stream checks its
    /// `Last-Event-ID` against (a reconnect storm pays it once per client).
    async fn bounds(&self) -> Result<Bounds, StoreError>;

    /// Deletes history: every event up to the newest one recorded before
    /// `recorded_before_ms` (Unix ms), and every event more than `keep_last`
    /// below the head, whichever cut is higher. History stays contiguous (the
    /// cut is by id), so [`Self::floor`] tells resumers what is left.
    /// Returns how many events were deleted.
    async fn prune(&self, recorded_before_ms: Option<i64>, keep_last: Option<u64>) -> Result<u64, StoreError>;

    /// Cheap round trip to the database.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Every epoch of the log (see [`epoch`]), as of epoch `at_least` at
    /// least: what this process read last, unless that is older (a
    /// [`Bounds::epoch`] names a newer one), when the store is read again.
    async fn epochs(&self, at_least: i32) -> Result<Arc<Epochs>, StoreError>;

    /// Begins a new epoch at the head, past every id the log can have handed
    /// out and past `seen` (what `tidings epoch new` does after a restore).
    async fn begin_epoch(&self, reason: EpochReason, seen: EventId) -> Result<Epoch, StoreError>;

    /// A resume point past `head` was asked for. When this process saw ids
    /// committed above it, the store lost them and no epoch says so yet (a
    /// promotion nobody has noticed): the epoch is checked now, at most
    /// once a second; whether one began. Never on the caller's word.
    async fn recheck_epoch(&self, _head: EventId) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// Starts whatever wakes `wake` after each commit (the LISTEN task for
    /// PostgreSQL; nothing for the embedded store, which wakes in-process)
    /// and runs until `cancel`. Also wakes once after every (re)connect, so a
    /// lost notification is never a lost event.
    fn start_wakeups(&self, wake: Arc<Notify>, cancel: CancellationToken) -> tokio::task::JoinHandle<()>;

    /// From now on, appends (of published events) hand what they commit to
    /// `to` before waking anyone ([`HandOff`]).
    fn hand_off_to(&self, to: HandOff);

    /// Listener state, reconnect count, and how long the LISTEN session has been silent, in ms (PostgreSQL).
    fn listener(&self) -> Listener;
}

/// Durable consumers: a stored filter and a cursor that only confirmations
/// move (a monotonic max, clamped to the head).
#[async_trait]
pub trait ConsumerStore: Send + Sync + std::fmt::Debug + 'static {
    /// Opens a durable consumer for a poll, in one transaction: collects it
    /// first if it has been silent too long; creates it when absent (its
    /// cursor at `since`, else at the head: a new consumer starts with what is
    /// published from now on), unless it was collected and no `since` is
    /// given; replaces its filter when one is given; confirms `since` (a
    /// monotonic max, clamped to the head); records the activity.
    async fn consumer_open(&self, open: ConsumerOpen<'_>) -> Result<Opened, StoreError>;

    /// Confirms everything up to `cursor` (monotonic max, clamped to the head).
    /// A consumer silent since before `expire_before_ms` is collected first.
    async fn consumer_ack(
        &self,
        id: &str,
        cursor: EventId,
        now_ms: i64,
        expire_before_ms: i64,
        actor: Actor<'_>,
    ) -> Result<Acked, StoreError>;

    /// Every consumer `actor` may see (all of them for an admin), by id.
    async fn consumer_list(&self, actor: Actor<'_>) -> Result<Vec<Consumer>, StoreError>;

    /// Deletes a consumer (not remembered as expired).
    async fn consumer_delete(&self, id: &str, actor: Actor<'_>) -> Result<Acked, StoreError>;

    /// Collects consumers silent since before `before_ms` (their ids kept); how many.
    async fn consumer_expire(&self, before_ms: i64) -> Result<u64, StoreError>;

    /// The acknowledged cursor of a WebSocket device, if it ever acked.
    async fn device_cursor(&self, owner: &str, device_id: &str) -> Result<Option<EventId>, StoreError>;

    /// The stored cursor of `owner`'s device `device_id`, marked as read in
    /// the current epoch, with its epoch before and the current one.
    async fn device_read(&self, owner: &str, device_id: &str) -> Result<Option<DeviceRead>, StoreError>;

    /// Acknowledges `seq` for a device: the cursor becomes
    /// `max(cursor, min(seq, head))` (created at that value); returns it.
    async fn device_ack(&self, owner: &str, device_id: &str, seq: EventId, now_ms: i64) -> Result<EventId, StoreError>;

    /// Forgets a device cursor (a courier lane whose subscription is gone).
    async fn device_forget(&self, owner: &str, device_id: &str) -> Result<(), StoreError>;

    /// Up to `limit` stored device cursors, by owner and device id.
    async fn device_cursors(&self, limit: usize) -> Result<Vec<DeviceCursor>, StoreError>;
}

/// The entity tree (compare-and-swap writes that append their change event
/// in the same transaction) and the content-addressed store.
#[async_trait]
pub trait TreeStore: Send + Sync + std::fmt::Debug + 'static {
    /// The entity at `path`.
    async fn tree_get(&self, path: &str) -> Result<Option<TreeEntry>, StoreError>;

    /// Paths below `prefix` (`""` for the whole tree), ascending, at most `limit`.
    async fn tree_below(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StoreError>;

    /// Applies a write and appends its change event in one transaction;
    /// writes to one path are serialised, so their events are in commit order.
    async fn tree_write(&self, write: TreeWrite) -> Result<TreeOutcome, StoreError>;

    /// Applies `writes` in order in one transaction, as if one after the
    /// other (a write sees those before it; one whose condition fails
    /// changes nothing and the others go on): each write's outcome, in
    /// order. An error fails them all and stores nothing.
    async fn tree_write_many(&self, writes: Vec<TreeWrite>) -> Result<Vec<TreeOutcome>, StoreError>;

    /// Stores content-addressed entities (hash, canonical JSON); idempotent.
    async fn content_put(&self, entities: Vec<(String, String)>) -> Result<(), StoreError>;

    /// The entity with this hash, as canonical JSON, if stored.
    async fn content_get(&self, hash: &str) -> Result<Option<String>, StoreError>;

    /// Entries below `prefix` (not `""`), ascending by path, at most `limit`.
    async fn tree_entries_below(&self, prefix: &str, limit: usize) -> Result<Vec<TreeEntry>, StoreError>;

    /// The version of what is below `prefix`: how many entries, and the sum
    /// of the log ids of the changes that wrote them. Every write below it
    /// changes one or the other (a write takes a new, highest id; a
    /// deletion lowers the count), so a listing is current while its
    /// version is; read from the path index, without the entities.
    async fn tree_version_below(&self, prefix: &str) -> Result<(i64, i64), StoreError>;
}

/// Federation's own state (path subscriptions): the subscription engine's
/// cursor and delivered counts, the tree changes it follows, its
/// compare-and-set commits and who leads, and the marks a mirror keeps of
/// its peer's log.
#[async_trait]
pub trait FederationStore: Send + Sync + std::fmt::Debug + 'static {
    /// The subscription engine's cursor and its tallies.
    async fn engine_state(&self) -> Result<(EventId, std::collections::HashMap<String, Tally>), StoreError>;

    /// Records of `types` after `after`, at most `limit`, and how far the
    /// scan reached: the last id returned when `limit` were found, else the
    /// head read before the scan (every record up to it was considered).
    async fn engine_changes(&self, after: EventId, types: &[&str], limit: usize) -> Result<(Vec<Record>, EventId), StoreError>;

    /// Commits an engine step; `false` (nothing written) when the cursor is
    /// no longer at `commit.from` (another engine committed first).
    async fn engine_commit(&self, commit: EngineCommit) -> Result<bool, StoreError>;

    /// Whether this process may run the subscription engine: exactly one
    /// process on a database holds it. Called repeatedly; cheap while held.
    async fn engine_lead(&self) -> Result<bool, StoreError>;

    /// Gives up the engine lead (at shutdown), so another process takes it.
    async fn engine_resign(&self);

    /// A mark kept for `(owner, name)`: a number of another server's log
    /// (what a mirror took from its peer), if one was ever raised.
    async fn peer_mark(&self, owner: &str, name: &str) -> Result<Option<i64>, StoreError>;

    /// Raises the mark to at least `at_least` (a monotonic max, not clamped:
    /// it counts another server's log); returns it.
    async fn peer_mark_raise(&self, owner: &str, name: &str, at_least: i64, now_ms: i64) -> Result<i64, StoreError>;

    /// Forgets a mark (a mirror that was deleted).
    async fn peer_mark_forget(&self, owner: &str, name: &str) -> Result<(), StoreError>;
}

/// A whole store: every concern. The composition root opens one; each part
/// of tidings takes the concern it needs (the broker only the [`EventLog`]).
pub trait Store: EventLog + ConsumerStore + TreeStore + FederationStore {}

impl<T: EventLog + ConsumerStore + TreeStore + FederationStore> Store for T {}
