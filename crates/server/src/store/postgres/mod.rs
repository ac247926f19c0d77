//! The PostgreSQL event log: a connection pool for reads and appends, and the
//! one LISTEN connection per process that wakes the broker.
//!
//! An append is one statement (one implicit transaction, one round trip): it
//! bumps `tidings_head.last_id` under that row's lock, inserts the batch with
//! ids from the old value, and queues one `NOTIFY tidings_events` carrying
//! only the new head. Concurrent appenders wait on the row lock, so ids are
//! handed out in commit order with no gaps, and a rolled-back append leaves
//! no hole.
//!
//! The LISTEN task owns its connection (`application_name=tidings-listener`)
//! and nothing else touches it. A notification is only a hint: after every
//! (re)connect it wakes the broker, which reads rows after its high-water
//! mark, so a lost or coalesced NOTIFY loses nothing.
//!
//! One file per concern: `log` (the event log), `consumers`, `tree` (the
//! tree and the content store), `engine` (the subscription engine's state
//! and leader lock), `listen` (the LISTEN task), `migrate` (the schema),
//! `replica` (hot standbys that serve history), `sync` (delivery that
//! waits for the synchronous standby).

mod consumers;
mod engine;
mod epoch;
mod listen;
mod log;
mod migrate;
mod outbox;
mod replica;
mod sync;
mod tree;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use futures_util::StreamExt as _;
use tokio::sync::{Notify, mpsc};
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_util::sync::CancellationToken;

use super::{
    Acked, Actor, Bounds, ChangeKind, Consumer, ConsumerOpen, ConsumerStore, DeviceCursor, DeviceRead, EngineCommit, EngineEffect, Epoch,
    EpochReason, Epochs, EventLog, FederationStore, HandOff, ListenerState, Moved, NewRecord, Opened, Publish, Published, Record,
    StoreError, StoreKind, Tally, TreeEntry, TreeOutcome, TreeStore, TreeWrite, idempotency,
};
use tidings_protocol::event::EventId;

/// The NOTIFY channel.
const CHANNEL: &str = "tidings_events";
/// The channel `tidings.publish` notifies (at its caller's commit).
const OUTBOX_CHANNEL: &str = "tidings_outbox";

/// Pool and timeout settings.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Most pooled connections.
    pub pool_size: usize,
    /// Longest wait for a pooled connection (and for a new one to connect)
    /// before a request fails with `503` instead of hanging.
    pub acquire_timeout: Duration,
    /// Hot standbys of the primary that serve history
    /// (`TIDINGS_REPLICA_URLS`).
    pub replica_urls: Vec<String>,
    /// A standby further behind than this is skipped
    /// (`TIDINGS_REPLICA_MAX_LAG`).
    pub replica_max_lag: Duration,
    /// The broker's tail reads go to the standbys too
    /// (`TIDINGS_BROKER_READS=replica`).
    pub broker_reads_replica: bool,
    /// Nothing is answered or shown before the synchronous standby has it
    /// (`TIDINGS_DELIVERY=replicated`; [`sync`]).
    pub replicated_delivery: bool,
}

impl PostgresOptions {
    /// The options PostgreSQL's section of the settings asks for.
    pub fn from_settings(settings: &crate::config::PostgresSettings) -> Self {
        Self {
            pool_size: settings.db_pool,
            acquire_timeout: settings.db_timeout,
            replica_urls: settings.replica_urls.clone(),
            replica_max_lag: settings.replica_max_lag,
            broker_reads_replica: settings.broker_reads == crate::config::BrokerReads::Replica,
            replicated_delivery: settings.delivery == crate::config::Delivery::Replicated,
        }
    }
}

/// The PostgreSQL store. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: Pool,
    config: tokio_postgres::Config,
    listener: Arc<ListenerStatus>,
    /// The session holding the subscription engine's advisory lock.
    leader: Arc<tokio::sync::Mutex<Option<deadpool_postgres::Object>>>,
    /// Where appends hand what they commit ([`HandOff`]).
    hand_off: Arc<std::sync::Mutex<Option<HandOff>>>,
    /// Hot standbys that serve history (none unless configured).
    replicas: Arc<replica::Replicas>,
    /// Whether the broker's tail reads go to the standbys.
    broker_reads_replica: bool,
    /// The epochs read last.
    epochs: Arc<crate::store::epoch::EpochCache>,
    /// The gate of `TIDINGS_DELIVERY=replicated`.
    sync: Option<Arc<sync::SyncGate>>,
    /// Stops the store's own tasks (the barrier) with its last clone.
    tasks: Arc<TasksGuard>,
}

/// Cancels its token when dropped.
#[derive(Debug)]
struct TasksGuard(tokio_util::sync::DropGuard);

impl TasksGuard {
    fn token(&self) -> CancellationToken {
        self.0.token().clone()
    }
}

fn lock_hand_off(m: &std::sync::Mutex<Option<HandOff>>) -> std::sync::MutexGuard<'_, Option<HandOff>> {
    // Only ever replaced whole: poisoning leaves nothing half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Default)]
struct ListenerStatus {
    state: AtomicU8,
    reconnects: AtomicU64,
    /// When the LISTEN session last heard a notification, or connected,
    /// Unix ms (0 before it first connected): its silence while commits go
    /// on is what the freshness alert watches.
    heard_ms: AtomicI64,
    /// The highest head a NOTIFY carried.
    notified: AtomicI64,
    /// The highest id this process appended or read from the primary: a
    /// head found below it is a lost suffix (appends check it, with
    /// `tidings_append_check`; so does each LISTEN reconnect). Never a
    /// notification's payload, which any role may send.
    seen: AtomicI64,
    /// Set on every (re)connect of the LISTEN session: notifications may
    /// have been missed, so the next tail read asks the primary.
    unsure: AtomicBool,
    /// When a resume point past the head last had this process check the
    /// log's epoch (Unix ms): at most once a second.
    rechecked_ms: AtomicI64,
    /// Woken by each `tidings.publish` commit (NOTIFY tidings_outbox) and
    /// each (re)connect: the outbox mover's wake-up.
    outbox: Arc<Notify>,
}

impl PostgresStore {
    /// Connects (lazily: the pool opens connections on demand) and applies
    /// pending migrations.
    #[expect(clippy::disallowed_methods, reason = "the LISTEN session and the synchronous gate are tasks for the store's lifetime")]
    pub async fn connect(url: &str, options: PostgresOptions) -> anyhow::Result<Self> {
        let (config, pool) = pool(url, "DATABASE_URL", "tidings", options.pool_size, options.acquire_timeout)?;
        let replicas = replica::Replicas::connect(&options.replica_urls, &options, options.replica_max_lag, pool.clone())?;
        let store = Self {
            pool,
            config,
            listener: Arc::default(),
            leader: Arc::default(),
            hand_off: Arc::default(),
            replicas,
            broker_reads_replica: options.broker_reads_replica,
            epochs: Arc::default(),
            sync: options.replicated_delivery.then(|| sync::SyncGate::new(options.acquire_timeout)),
            tasks: Arc::new(TasksGuard(CancellationToken::new().drop_guard())),
        };
        // The barrier task runs from the start (startup writes wait for it
        // too) until the last clone of the store is dropped.
        if let Some(gate) = &store.sync {
            tokio::spawn(gate.clone().run(store.config.clone(), store.tasks.token()));
        }
        store.migrate().await?;
        // The cluster found is the epoch's, or a new epoch begins before
        // anything is appended.
        store.settle(epoch::Settle::Check { seen: 0 }).await.context("checking the event log's epoch")?;
        Ok(store)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// [`epoch::settle`] on a pooled connection.
    async fn settle(&self, how: epoch::Settle) -> Result<Option<Epoch>, StoreError> {
        let mut client = self.client().await?;
        epoch::settle(&mut client, &self.epochs, how).await
    }

    /// The highest id this process saw committed (see [`ListenerStatus`]).
    fn seen(&self) -> EventId {
        self.listener.seen.load(Ordering::Acquire)
    }

    /// Notes ids this process saw committed.
    fn saw(&self, id: EventId) {
        self.listener.seen.fetch_max(id, Ordering::AcqRel);
    }

    /// Refuses an append while the synchronous standby does not confirm
    /// (`TIDINGS_DELIVERY=replicated`).
    fn admit(&self) -> Result<(), StoreError> {
        self.sync.as_ref().map_or(Ok(()), |gate| gate.admit())
    }

    /// Returns once what is committed up to `id` may be shown and
    /// answered: at once, or with `TIDINGS_DELIVERY=replicated` once the
    /// synchronous standby has it.
    async fn shown(&self, id: EventId) -> Result<(), StoreError> {
        match &self.sync {
            Some(gate) => gate.replicated(id).await,
            None => Ok(()),
        }
    }

    /// The head a caller may be given as a resume point: with
    /// `TIDINGS_DELIVERY=replicated`, once the synchronous standby has it,
    /// or (while replication is stalled) the newest id it is known to have,
    /// so nobody is handed a cursor past what a failover keeps.
    async fn confirmed_head(&self, head: EventId) -> EventId {
        match &self.sync {
            Some(gate) => match gate.replicated(head).await {
                Ok(()) => head,
                Err(_) => gate.through().min(head),
            },
            None => head,
        }
    }

    /// After an append failed: when it was refused for the timeline (the
    /// database was promoted or restored), the new epoch begins now, so
    /// the publisher's retry is appended in it. The failure stands (`503`):
    /// nothing was appended.
    async fn after_append_failed<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Unavailable(message)) = &result
            && message.starts_with(epoch::OFF_TIMELINE)
            && let Err(e) = self.settle(epoch::Settle::Check { seen: self.seen() }).await
        {
            tracing::warn!(error = %crate::report::chain(&e), "cannot begin the event log's new epoch yet");
        }
        result
    }
}

/// A lazily connecting pool of at most `size` connections to `url` (named
/// `setting` in errors), waiting at most `timeout` for a connection, and
/// its connection config.
fn pool(url: &str, setting: &str, application: &str, size: usize, timeout: Duration) -> anyhow::Result<(tokio_postgres::Config, Pool)> {
    let mut config: tokio_postgres::Config = url.parse().with_context(|| format!("{setting} is not a valid PostgreSQL URL"))?;
    if config.get_application_name().is_none() {
        config.application_name(application);
    }
    config.connect_timeout(timeout);
    // TCP keepalives find a dead database connection in a pool that sits
    // idle, or a session waiting on a primary that vanished without a
    // reset (a failover), within about 25 s; a transport detail, not a
    // tuning knob.
    config.keepalives(true).keepalives_idle(Duration::from_secs(10)).keepalives_interval(Duration::from_secs(5)).keepalives_retries(3);
    let manager = Manager::from_config(config.clone(), NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(timeout))
        .create_timeout(Some(timeout))
        .recycle_timeout(Some(timeout))
        .build()
        .with_context(|| format!("building the pool of {setting}"))?;
    Ok((config, pool))
}

fn pool_error(e: PoolError) -> StoreError {
    match e {
        PoolError::Backend(e) => pg_error(e),
        other => StoreError::Unavailable(other.to_string()),
    }
}

/// Connection-level failures (closed socket, I/O, the server shutting down or
/// refusing connections) are "unavailable"; the rest are bugs.
fn pg_error(e: tokio_postgres::Error) -> StoreError {
    if e.code().is_some_and(|c| c.code() == epoch::OFF_TIMELINE) {
        return StoreError::Unavailable(format!(
            "{}: the database is not where the event log's epoch was (another timeline, or a head below what was seen); retry",
            epoch::OFF_TIMELINE
        ));
    }
    let unavailable = e.is_closed()
        || e.code().is_some_and(|c| {
            let code = c.code();
            code.starts_with("08") || code.starts_with("57P") || code == "53300"
        })
        || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
    // The database's own words ("too many connections for role ..."), not
    // only tokio-postgres' "db error".
    // On one line: PostgreSQL's DETAIL and HINT come on lines of their own.
    let text = || crate::report::chain(&e).to_string().split_whitespace().collect::<Vec<_>>().join(" ");
    if unavailable { StoreError::Unavailable(text()) } else { StoreError::Other(e.into()) }
}

/// Claims idempotency keys (sorted, one row each): inserts the new ones and
/// takes over the expired ones, returning what it claimed; a live key is
/// left alone (and, if another transaction is inserting it, waited for).
const CLAIM_KEYS_SQL: &str = "
INSERT INTO tidings_idempotency (scope, key, body_hash, event_ids, created_ms)
SELECT t.scope, t.key, t.body_hash, '[]', t.now
FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bigint[]) WITH ORDINALITY AS t(scope, key, body_hash, now, ord)
ORDER BY t.ord
ON CONFLICT (scope, key) DO UPDATE SET body_hash = EXCLUDED.body_hash, event_ids = '[]', created_ms = EXCLUDED.created_ms
WHERE tidings_idempotency.created_ms < EXCLUDED.created_ms - $5::bigint
RETURNING scope, key";

const APPEND_SQL: &str = "
WITH head AS (
    UPDATE tidings_head SET last_id = last_id + cardinality($1::text[])
    WHERE singleton AND tidings_append_check(timeline, last_id, $3::bigint)
    RETURNING last_id - cardinality($1::text[]) AS base, last_id
), inserted AS (
    INSERT INTO events (id, event_type, body)
    SELECT head.base + t.ord, t.event_type, t.body
    FROM head, unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(event_type, body, ord)
)
SELECT base FROM head, LATERAL (SELECT pg_notify('tidings_events', head.last_id::text)) AS notified";
