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

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use futures_util::StreamExt as _;
use tokio::sync::{Notify, mpsc};
use tokio_postgres::{AsyncMessage, NoTls};
use tokio_util::sync::CancellationToken;

use super::{
    Acked, Actor, ChangeKind, Consumer, ConsumerOpen, EngineCommit, EngineEffect, EventLog, ListenerState, NewRecord, Opened, Record,
    StoreError, StoreKind, TreeEntry, TreeOutcome, TreeWrite,
};
use crate::event::EventId;

/// The NOTIFY channel.
const CHANNEL: &str = "tidings_events";

/// Migrations, in order. Each runs once, inside a transaction, recorded in
/// `tidings_migrations`; the whole run is serialised by an advisory lock so
/// several processes starting together do not race.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "event_log", include_str!("../../migrations/postgres/0001_event_log.sql")),
    (2, "consumers", include_str!("../../migrations/postgres/0002_consumers.sql")),
    (3, "consumer_owner", include_str!("../../migrations/postgres/0003_consumer_owner.sql")),
    (4, "tree", include_str!("../../migrations/postgres/0004_tree.sql")),
    (5, "subscriptions", include_str!("../../migrations/postgres/0005_subscriptions.sql")),
];

/// Pool and timeout settings.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Most pooled connections.
    pub pool_size: usize,
    /// Longest wait for a pooled connection (and for a new one to connect)
    /// before a request fails with `503` instead of hanging.
    pub acquire_timeout: Duration,
}

/// The PostgreSQL store. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: Pool,
    config: tokio_postgres::Config,
    listener: Arc<ListenerStatus>,
    /// The session holding the subscription engine's advisory lock.
    leader: Arc<tokio::sync::Mutex<Option<deadpool_postgres::Object>>>,
}

#[derive(Debug, Default)]
struct ListenerStatus {
    state: AtomicU8,
    reconnects: AtomicU64,
}

impl PostgresStore {
    /// Connects (lazily: the pool opens connections on demand) and applies
    /// pending migrations.
    pub async fn connect(url: &str, options: PostgresOptions) -> anyhow::Result<Self> {
        let mut config: tokio_postgres::Config = url.parse().context("DATABASE_URL is not a valid PostgreSQL URL")?;
        if config.get_application_name().is_none() {
            config.application_name("tidings");
        }
        config.connect_timeout(options.acquire_timeout);
        config.keepalives(true).keepalives_idle(Duration::from_secs(10));
        let manager = Manager::from_config(config.clone(), NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.acquire_timeout))
            .create_timeout(Some(options.acquire_timeout))
            .recycle_timeout(Some(options.acquire_timeout))
            .build()
            .context("building the PostgreSQL pool")?;
        let store = Self { pool, config, listener: Arc::default(), leader: Arc::default() };
        store.migrate().await?;
        Ok(store)
    }

    /// Applies pending migrations; idempotent.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let mut client = self.pool.get().await.context("connecting to PostgreSQL")?;
        client.batch_execute("SELECT pg_advisory_lock(7324001)").await?;
        let result = async {
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS tidings_migrations (
                        version integer PRIMARY KEY, name text NOT NULL,
                        applied_at timestamptz NOT NULL DEFAULT now())",
                )
                .await?;
            for (version, name, sql) in MIGRATIONS {
                let tx = client.transaction().await?;
                let done = tx.query_opt("SELECT 1 FROM tidings_migrations WHERE version = $1", &[version]).await?;
                if done.is_none() {
                    tracing::info!(version, name, "applying migration");
                    tx.batch_execute(sql).await.with_context(|| format!("migration {version} {name}"))?;
                    tx.execute("INSERT INTO tidings_migrations (version, name) VALUES ($1, $2)", &[version, name]).await?;
                }
                tx.commit().await?;
            }
            anyhow::Ok(())
        }
        .await;
        client.batch_execute("SELECT pg_advisory_unlock(7324001)").await?;
        result
    }

    /// Why an owner-checked statement touched no consumer.
    async fn why_not(&self, client: &deadpool_postgres::Object, id: &str) -> Result<Acked, StoreError> {
        let row = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM consumer_subscriptions WHERE consumer_id = $1),
                        EXISTS (SELECT 1 FROM consumer_expired WHERE consumer_id = $1)",
                &[&id],
            )
            .await
            .map_err(pg_error)?;
        Ok(match (row.get(0), row.get(1)) {
            (true, _) => Acked::Forbidden,
            (false, true) => Acked::Expired,
            (false, false) => Acked::NotFound,
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_error)
    }
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
    let unavailable = e.is_closed()
        || e.code().is_some_and(|c| {
            let code = c.code();
            code.starts_with("08") || code.starts_with("57P") || code == "53300"
        })
        || std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
    if unavailable { StoreError::Unavailable(e.to_string()) } else { StoreError::Other(e.into()) }
}

const COLLECT_SQL: &str = "
WITH gone AS (
    DELETE FROM consumer_subscriptions WHERE consumer_id = $1 AND last_activity_ms < $2 RETURNING consumer_id
)
INSERT INTO consumer_expired (consumer_id, expired_ms) SELECT consumer_id, $3 FROM gone
ON CONFLICT (consumer_id) DO UPDATE SET expired_ms = EXCLUDED.expired_ms";

const CONSUMER_UPDATE_SQL: &str = "
UPDATE consumer_subscriptions SET
    filter_json = CASE WHEN $2 THEN $3 ELSE filter_json END,
    cursor = GREATEST(cursor, LEAST(COALESCE($4, cursor), (SELECT last_id FROM tidings_head))),
    last_activity_ms = $5
WHERE consumer_id = $1 AND (owner = $6 OR $7)
RETURNING consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner";

fn consumer_row(r: &tokio_postgres::Row) -> Consumer {
    Consumer { id: r.get(0), filter_json: r.get(1), cursor: r.get(2), created_ms: r.get(3), last_activity_ms: r.get(4), owner: r.get(5) }
}

const APPEND_SQL: &str = "
WITH head AS (
    UPDATE tidings_head SET last_id = last_id + cardinality($1::text[])
    WHERE singleton
    RETURNING last_id - cardinality($1::text[]) AS base, last_id
), inserted AS (
    INSERT INTO events (id, event_type, body)
    SELECT head.base + t.ord, t.event_type, t.body
    FROM head, unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(event_type, body, ord)
)
SELECT base FROM head, LATERAL (SELECT pg_notify('tidings_events', head.last_id::text)) AS notified";

/// One writer per tree path at a time (held to the end of the transaction).
const PATH_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 7324002))";

/// A tree write inside `tx`: one writer per path at a time (also when the
/// path does not exist yet), the change event appended, and the entity kept
/// in the content store too.
async fn tree_write_in(tx: &tokio_postgres::Transaction<'_>, write: TreeWrite) -> Result<TreeOutcome, tokio_postgres::Error> {
    tx.execute(PATH_LOCK_SQL, &[&write.path]).await?;
    let current: Option<String> = tx.query_opt("SELECT hash FROM tree_entities WHERE path = $1", &[&write.path]).await?.map(|r| r.get(0));
    let kind = match write.decide(current.as_deref()) {
        Ok(kind) => kind,
        Err(outcome) => return Ok(outcome),
    };
    let record = (write.event)(kind, current.as_deref());
    if let Some(previous) = &current {
        // The change event names the replaced entity: keep it as long.
        tx.execute("UPDATE tidings_content SET stored_ms = (extract(epoch FROM now()) * 1000)::bigint WHERE hash = $1", &[previous])
            .await?;
    }
    let row = tx.query_one(APPEND_SQL, &[&vec![record.event_type], &vec![record.body]]).await?;
    let event_id: i64 = row.get::<_, i64>(0) + 1;
    match (&write.entity, kind) {
        (Some((entity, hash)), _) => {
            tx.execute(
                "INSERT INTO tree_entities (path, entity, hash, changed_event) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (path) DO UPDATE SET entity = EXCLUDED.entity, hash = EXCLUDED.hash, changed_event = EXCLUDED.changed_event",
                &[&write.path, entity, hash, &event_id],
            )
            .await?;
            tx.execute(
                "INSERT INTO tidings_content (hash, body, stored_ms, pinned)
                 VALUES ($1, $2, (extract(epoch FROM now()) * 1000)::bigint, false)
                 ON CONFLICT (hash) DO UPDATE SET stored_ms = EXCLUDED.stored_ms",
                &[hash, entity],
            )
            .await?;
        }
        (None, ChangeKind::Deleted) => {
            tx.execute("DELETE FROM tree_entities WHERE path = $1", &[&write.path]).await?;
        }
        (None, _) => {}
    }
    Ok(TreeOutcome::Done { kind, previous_hash: current, event_id })
}

#[async_trait]
impl EventLog for PostgresStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Postgres
    }

    async fn append(&self, batch: Vec<NewRecord>) -> Result<Vec<EventId>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let (types, bodies): (Vec<String>, Vec<String>) = batch.into_iter().map(|r| (r.event_type, r.body)).unzip();
        let client = self.client().await?;
        let statement = client.prepare_cached(APPEND_SQL).await.map_err(pg_error)?;
        let row = client.query_one(&statement, &[&types, &bodies]).await.map_err(pg_error)?;
        let base: i64 = row.get(0);
        Ok((1..=types.len() as i64).map(|i| base + i).collect())
    }

    async fn read_after(&self, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT id, body, (extract(epoch FROM recorded_at) * 1000)::bigint FROM events WHERE id > $1 ORDER BY id LIMIT $2",
            )
            .await
            .map_err(pg_error)?;
        let rows = client.query(&statement, &[&after, &(limit as i64)]).await.map_err(pg_error)?;
        Ok(rows.into_iter().map(|r| Record { id: r.get(0), body: r.get(1), recorded_ms: r.get(2) }).collect())
    }

    async fn head(&self) -> Result<EventId, StoreError> {
        let client = self.client().await?;
        let row = client.query_one("SELECT last_id FROM tidings_head", &[]).await.map_err(pg_error)?;
        Ok(row.get(0))
    }

    async fn floor(&self) -> Result<EventId, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT coalesce((SELECT min(id) - 1 FROM events), (SELECT last_id FROM tidings_head))", &[])
            .await
            .map_err(pg_error)?;
        Ok(row.get(0))
    }

    async fn prune(&self, recorded_before_ms: Option<i64>, keep_last: Option<u64>) -> Result<u64, StoreError> {
        let client = self.client().await?;
        let keep = keep_last.map(|k| k.min(i64::MAX as u64) as i64);
        let cut: i64 = client
            .query_one(
                // Never past the subscription engine's cursor: a change it
                // has not turned into notifications yet is kept.
                "SELECT LEAST(GREATEST(
                    COALESCE((SELECT max(id) FROM events WHERE recorded_at < to_timestamp($1::bigint / 1000.0)), 0),
                    COALESCE((SELECT last_id FROM tidings_head) - $2::bigint, 0)),
                    (SELECT cursor FROM tidings_engine WHERE name = 'subscriptions'))",
                &[&recorded_before_ms, &keep],
            )
            .await
            .map_err(pg_error)?
            .get(0);
        // In slices, so one prune never holds a long transaction.
        let mut deleted = 0;
        loop {
            let n = client
                .execute("DELETE FROM events WHERE id <= LEAST($1::bigint, (SELECT min(id) FROM events) + 9999)", &[&cut])
                .await
                .map_err(pg_error)?;
            deleted += n;
            if n == 0 {
                break;
            }
        }
        if deleted > 0 {
            // Entities no path holds and no retained change names.
            client
                .execute(
                    "DELETE FROM tidings_content c
                     WHERE NOT c.pinned
                       AND c.stored_ms < COALESCE((SELECT (extract(epoch FROM min(recorded_at)) * 1000)::bigint FROM events),
                                                  (extract(epoch FROM now()) * 1000)::bigint)
                       AND NOT EXISTS (SELECT 1 FROM tree_entities t WHERE t.hash = c.hash)",
                    &[],
                )
                .await
                .map_err(pg_error)?;
        }
        Ok(deleted)
    }

    async fn consumer_open(&self, open: ConsumerOpen<'_>) -> Result<Opened, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        tx.execute(COLLECT_SQL, &[&open.id, &open.expire_before_ms, &open.now_ms]).await.map_err(pg_error)?;
        let replace = open.filter_json.is_some();
        let filter = open.filter_json.flatten();
        let (owner, admin) = (open.actor.sub, open.actor.admin);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] =
            [&open.id, &replace, &filter, &open.since, &open.now_ms, &owner, &admin];
        let mut row = tx.query_opt(CONSUMER_UPDATE_SQL, &params).await.map_err(pg_error)?;
        if row.is_none() {
            let expired =
                tx.query_opt("SELECT 1 FROM consumer_expired WHERE consumer_id = $1", &[&open.id]).await.map_err(pg_error)?.is_some();
            if expired && open.since.is_none() {
                tx.commit().await.map_err(pg_error)?;
                return Ok(Opened::Expired);
            }
            let created = tx
                .execute(
                    "INSERT INTO consumer_subscriptions (consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner)
                     SELECT $1, $2, LEAST(COALESCE($3, last_id), last_id), $4, $4, $5 FROM tidings_head
                     ON CONFLICT (consumer_id) DO NOTHING",
                    &[&open.id, &filter, &open.since, &open.now_ms, &owner],
                )
                .await
                .map_err(pg_error)?;
            if created == 1 {
                tx.execute("DELETE FROM consumer_expired WHERE consumer_id = $1", &[&open.id]).await.map_err(pg_error)?;
            }
            row = tx.query_opt(CONSUMER_UPDATE_SQL, &params).await.map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)?;
        // Still none: the consumer exists and belongs to someone else.
        Ok(row.map_or(Opened::Forbidden, |row| Opened::Ready(consumer_row(&row))))
    }

    async fn consumer_ack(
        &self,
        id: &str,
        cursor: EventId,
        now_ms: i64,
        expire_before_ms: i64,
        actor: Actor<'_>,
    ) -> Result<Acked, StoreError> {
        let client = self.client().await?;
        client.execute(COLLECT_SQL, &[&id, &expire_before_ms, &now_ms]).await.map_err(pg_error)?;
        let row = client
            .query_opt(
                "UPDATE consumer_subscriptions
                 SET cursor = GREATEST(cursor, LEAST($2, (SELECT last_id FROM tidings_head))), last_activity_ms = $3
                 WHERE consumer_id = $1 AND (owner = $4 OR $5) RETURNING cursor",
                &[&id, &cursor, &now_ms, &actor.sub, &actor.admin],
            )
            .await
            .map_err(pg_error)?;
        match row {
            Some(row) => Ok(Acked::Cursor(row.get(0))),
            None => self.why_not(&client, id).await,
        }
    }

    async fn consumer_list(&self, actor: Actor<'_>) -> Result<Vec<Consumer>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner FROM consumer_subscriptions
                 WHERE owner = $1 OR $2 ORDER BY consumer_id",
                &[&actor.sub, &actor.admin],
            )
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(consumer_row).collect())
    }

    async fn consumer_delete(&self, id: &str, actor: Actor<'_>) -> Result<Acked, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "DELETE FROM consumer_subscriptions WHERE consumer_id = $1 AND (owner = $2 OR $3) RETURNING cursor",
                &[&id, &actor.sub, &actor.admin],
            )
            .await
            .map_err(pg_error)?;
        match row {
            Some(row) => Ok(Acked::Cursor(row.get(0))),
            None => self.why_not(&client, id).await,
        }
    }

    async fn consumer_expire(&self, before_ms: i64) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "WITH gone AS (DELETE FROM consumer_subscriptions WHERE last_activity_ms < $1 RETURNING consumer_id)
                 INSERT INTO consumer_expired (consumer_id, expired_ms) SELECT consumer_id, $2 FROM gone
                 ON CONFLICT (consumer_id) DO UPDATE SET expired_ms = EXCLUDED.expired_ms",
                &[&before_ms, &chrono::Utc::now().timestamp_millis()],
            )
            .await
            .map_err(pg_error)
    }

    async fn tree_get(&self, path: &str) -> Result<Option<TreeEntry>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT entity, hash FROM tree_entities WHERE path = $1", &[&path]).await.map_err(pg_error)?;
        Ok(row.map(|r| TreeEntry { path: path.to_owned(), entity: r.get(0), hash: r.get(1) }))
    }

    async fn tree_below(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        // Everything after "prefix/" and before "prefix0" ('0' follows '/').
        let (from, to) =
            if prefix.is_empty() { (String::new(), "\u{10FFFF}".to_owned()) } else { (format!("{prefix}/"), format!("{prefix}0")) };
        let rows = client
            .query("SELECT path FROM tree_entities WHERE path > $1 AND path < $2 ORDER BY path LIMIT $3", &[&from, &to, &(limit as i64)])
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn tree_write(&self, write: TreeWrite) -> Result<TreeOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let outcome = tree_write_in(&tx, write).await.map_err(pg_error)?;
        if matches!(outcome, TreeOutcome::Done { .. }) {
            tx.commit().await.map_err(pg_error)?;
        }
        Ok(outcome)
    }

    async fn content_put(&self, entities: Vec<(String, String)>) -> Result<(), StoreError> {
        let client = self.client().await?;
        let (hashes, bodies): (Vec<String>, Vec<String>) = entities.into_iter().unzip();
        client
            .execute(
                "INSERT INTO tidings_content (hash, body, stored_ms, pinned)
                 SELECT h, b, (extract(epoch FROM now()) * 1000)::bigint, true FROM unnest($1::text[], $2::text[]) AS t(h, b)
                 ON CONFLICT (hash) DO UPDATE SET stored_ms = EXCLUDED.stored_ms, pinned = true",
                &[&hashes, &bodies],
            )
            .await
            .map_err(pg_error)?;
        Ok(())
    }

    async fn content_get(&self, hash: &str) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT body FROM tidings_content WHERE hash = $1", &[&hash]).await.map_err(pg_error)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn tree_entries_below(&self, prefix: &str, limit: usize) -> Result<Vec<TreeEntry>, StoreError> {
        let client = self.client().await?;
        let (from, to) = (format!("{prefix}/"), format!("{prefix}0"));
        let rows = client
            .query(
                "SELECT path, entity, hash FROM tree_entities WHERE path > $1 AND path < $2 ORDER BY path LIMIT $3",
                &[&from, &to, &(limit as i64)],
            )
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(|r| TreeEntry { path: r.get(0), entity: r.get(1), hash: r.get(2) }).collect())
    }

    async fn engine_state(&self) -> Result<(EventId, HashMap<String, i64>), StoreError> {
        let client = self.client().await?;
        let cursor: i64 =
            client.query_one("SELECT cursor FROM tidings_engine WHERE name = 'subscriptions'", &[]).await.map_err(pg_error)?.get(0);
        let rows = client.query("SELECT subscription_id, delivered FROM tidings_subscription_counts", &[]).await.map_err(pg_error)?;
        Ok((cursor, rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
    }

    async fn engine_changes(&self, after: EventId, types: &[&str], limit: usize) -> Result<(Vec<Record>, EventId), StoreError> {
        let client = self.client().await?;
        let head: i64 = client.query_one("SELECT last_id FROM tidings_head", &[]).await.map_err(pg_error)?.get(0);
        let statement = client
            .prepare_cached(
                "SELECT id, body, (extract(epoch FROM recorded_at) * 1000)::bigint FROM events
                 WHERE id > $1 AND id <= $2 AND event_type = ANY($3) ORDER BY id LIMIT $4",
            )
            .await
            .map_err(pg_error)?;
        let rows = client.query(&statement, &[&after, &head, &types, &(limit as i64)]).await.map_err(pg_error)?;
        let records: Vec<Record> = rows.into_iter().map(|r| Record { id: r.get(0), body: r.get(1), recorded_ms: r.get(2) }).collect();
        let reached = if records.len() == limit { records.last().map_or(head, |r| r.id) } else { head };
        Ok((records, reached.max(after)))
    }

    async fn engine_commit(&self, commit: EngineCommit) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let moved = tx
            .execute("UPDATE tidings_engine SET cursor = $2 WHERE name = 'subscriptions' AND cursor = $1", &[&commit.from, &commit.to])
            .await
            .map_err(pg_error)?;
        if moved != 1 {
            return Ok(false);
        }
        // Path locks first, in order, as every tree write takes them before
        // the head's row lock: an append here before them could deadlock
        // with a concurrent write to one of these paths.
        let mut paths: Vec<&str> =
            commit.effects.iter().filter_map(|e| if let EngineEffect::Tree(w) = e { Some(w.path.as_str()) } else { None }).collect();
        paths.sort_unstable();
        paths.dedup();
        for path in paths {
            tx.execute(PATH_LOCK_SQL, &[&path]).await.map_err(pg_error)?;
        }
        for effect in commit.effects {
            match effect {
                EngineEffect::Append(record) => {
                    tx.query_one(APPEND_SQL, &[&vec![record.event_type], &vec![record.body]]).await.map_err(pg_error)?;
                }
                EngineEffect::Tree(write) => {
                    tree_write_in(&tx, write).await.map_err(pg_error)?;
                }
            }
        }
        for (id, count) in commit.counts {
            match count {
                Some(n) => {
                    tx.execute(
                        "INSERT INTO tidings_subscription_counts (subscription_id, delivered) VALUES ($1, $2)
                         ON CONFLICT (subscription_id) DO UPDATE SET delivered = EXCLUDED.delivered",
                        &[&id, &n],
                    )
                    .await
                }
                None => tx.execute("DELETE FROM tidings_subscription_counts WHERE subscription_id = $1", &[&id]).await,
            }
            .map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)?;
        Ok(true)
    }

    async fn engine_lead(&self) -> Result<bool, StoreError> {
        let mut held = self.leader.lock().await;
        if let Some(client) = held.as_ref() {
            if client.simple_query("SELECT 1").await.is_ok() {
                return Ok(true);
            }
            // The session (and with it the lock) is gone; close it for good.
            if let Some(client) = held.take() {
                drop(deadpool_postgres::Object::take(client));
            }
        }
        let client = self.client().await?;
        let locked: bool = client.query_one("SELECT pg_try_advisory_lock(7324003)", &[]).await.map_err(pg_error)?.get(0);
        if locked {
            *held = Some(client);
        }
        Ok(locked)
    }

    async fn engine_resign(&self) {
        if let Some(client) = self.leader.lock().await.take() {
            // Closing the session releases its advisory lock.
            drop(deadpool_postgres::Object::take(client));
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await.map_err(pg_error)?;
        Ok(())
    }

    fn start_wakeups(&self, wake: Arc<Notify>, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        let config = self.config.clone();
        let status = self.listener.clone();
        tokio::spawn(listen_loop(config, status, wake, cancel))
    }

    fn listener(&self) -> (ListenerState, u64) {
        let state = match self.listener.state.load(Ordering::Relaxed) {
            1 => ListenerState::Listening,
            2 => ListenerState::Reconnecting,
            _ => ListenerState::Starting,
        };
        (state, self.listener.reconnects.load(Ordering::Relaxed))
    }
}

/// How often the LISTEN connection is probed, so a silently cut network is
/// noticed even when no notification is due.
const LISTENER_PROBE: Duration = Duration::from_secs(5);
/// Reconnect backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

async fn listen_loop(mut config: tokio_postgres::Config, status: Arc<ListenerStatus>, wake: Arc<Notify>, cancel: CancellationToken) {
    config.application_name("tidings-listener");
    let mut backoff = BACKOFF_MIN;
    let mut first = true;
    loop {
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listen_once(&config, &status, &wake, &cancel, &mut backoff) => r,
        };
        if cancel.is_cancelled() {
            return;
        }
        status.state.store(2, Ordering::Relaxed);
        if !first || result.is_err() {
            status.reconnects.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(crate::metrics::LISTENER_RECONNECTS).increment(1);
        }
        first = false;
        match result {
            Ok(()) => tracing::warn!("LISTEN connection closed; reconnecting"),
            Err(e) => tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "LISTEN connection lost; reconnecting"),
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(jitter(backoff)) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.5..1.0))
}

async fn listen_once(
    config: &tokio_postgres::Config,
    status: &ListenerStatus,
    wake: &Notify,
    cancel: &CancellationToken,
    backoff: &mut Duration,
) -> anyhow::Result<()> {
    let (client, mut connection) = config.connect(NoTls).await.context("connecting the LISTEN session")?;
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    // The connection future must be polled for the client to make progress;
    // it also yields the notifications.
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(_)) => {
                    if tx.send(()).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    let guard = DriverGuard(driver);
    let listen = format!("LISTEN {CHANNEL}");
    client.batch_execute(&listen).await.context("LISTEN")?;
    status.state.store(1, Ordering::Relaxed);
    *backoff = BACKOFF_MIN;
    tracing::info!("LISTEN connection established");
    // Anything committed while we were not listening is read now.
    wake.notify_one();
    let mut probe = tokio::time::interval(LISTENER_PROBE);
    probe.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            n = rx.recv() => match n {
                Some(()) => wake.notify_one(),
                None => break,
            },
            _ = probe.tick() => {
                // The probe re-issues LISTEN (a no-op on a channel already
                // listened to), so pg_stat_activity keeps showing what this
                // session is for.
                tokio::time::timeout(LISTENER_PROBE, client.batch_execute(&listen))
                    .await
                    .context("LISTEN probe timed out")?
                    .context("LISTEN probe")?;
            }
        }
    }
    drop(guard);
    anyhow::bail!("LISTEN connection ended")
}

/// Aborts the connection driver when the listener gives up on it.
struct DriverGuard(tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>);

impl Drop for DriverGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}
