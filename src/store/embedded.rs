//! The embedded single-node store: the event log in a SQLite file inside
//! the data directory, so tidings runs on a machine with nothing installed.
//!
//! Why SQLite (through `rusqlite`, bundled): a single file with a write-ahead
//! log, crash-safe transactions, and one writer at a time, which is exactly
//! what gap-free, commit-ordered ids need: the id is allocated inside the
//! write transaction. The alternatives (sled, redb, fjall) would make us write
//! the ordering, the range reads and the migrations ourselves.
//!
//! Durability: `synchronous=FULL` in WAL mode, so an append answered `201`
//! has reached the disk and survives `kill -9` (and power loss).
//!
//! One process owns a data directory: an exclusive lock on `LOCK` is taken at
//! open and held for the life of the store; a second server on the same
//! directory refuses to start.
//!
//! SQLite calls block, so they run on tokio's blocking pool: the writer
//! connection behind a mutex (SQLite serialises writers anyway), readers from
//! a small pool of read-only connections that WAL lets run beside the writer.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags, OptionalExtension as _, params};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{
    Acked, Actor, ChangeKind, Consumer, ConsumerOpen, EngineCommit, EngineEffect, EventLog, ListenerState, NewRecord, Opened, Record,
    StoreError, StoreKind, TreeEntry, TreeOutcome, TreeWrite,
};
use crate::event::EventId;

const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "event_log", include_str!("../../migrations/embedded/0001_event_log.sql")),
    (2, "consumers", include_str!("../../migrations/embedded/0002_consumers.sql")),
    (3, "consumer_owner", include_str!("../../migrations/embedded/0003_consumer_owner.sql")),
    (4, "tree", include_str!("../../migrations/embedded/0004_tree.sql")),
    (5, "subscriptions", include_str!("../../migrations/embedded/0005_subscriptions.sql")),
];

/// Read connections kept open.
const READERS: usize = 4;

/// The embedded store. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    writer: Mutex<Connection>,
    readers: Mutex<Vec<Connection>>,
    wake: Mutex<Option<Arc<Notify>>>,
    /// Held for the life of the store: the directory's exclusive lock.
    _lock: File,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // SQLite rolls back an unfinished transaction itself; a panic elsewhere
    // cannot leave the connection half-used, so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EmbeddedStore {
    /// Opens (creating if needed) the store in `dir`, taking its lock.
    pub async fn open(dir: &Path) -> anyhow::Result<Self> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(&dir)).await?
    }

    fn open_blocking(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating the data directory {}", dir.display()))?;
        let lock_path = dir.join("LOCK");
        let lock_file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        match lock_file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
                "the data directory {} is in use by another tidings process; stop it, or give this one its own TIDINGS_DATA_DIR (several processes sharing data need DATABASE_URL and PostgreSQL)",
                dir.display()
            ),
            Err(std::fs::TryLockError::Error(e)) => return Err(e).with_context(|| format!("locking {}", lock_path.display())),
        }
        let db = dir.join("events.sqlite3");
        let writer = Connection::open(&db).with_context(|| format!("opening {}", db.display()))?;
        writer.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;")?;
        migrate(&writer)?;
        let readers = (0..READERS)
            .map(|_| {
                let c = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
                c.execute_batch("PRAGMA busy_timeout=5000;")?;
                Ok(c)
            })
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                writer: Mutex::new(writer),
                readers: Mutex::new(readers),
                wake: Mutex::new(None),
                _lock: lock_file,
            }),
        })
    }

    fn wake(&self) {
        if let Some(wake) = lock(&self.inner.wake).as_ref() {
            wake.notify_one();
        }
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Runs `f` with a read connection on the blocking pool.
    async fn read<T: Send + 'static>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let conn = lock(&inner.readers).pop();
            let conn = match conn {
                Some(c) => c,
                None => Connection::open_with_flags(
                    inner.dir.join("events.sqlite3"),
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?,
            };
            let result = f(&conn);
            let mut readers = lock(&inner.readers);
            if readers.len() < READERS {
                readers.push(conn);
            }
            result
        })
        .await
        .map_err(|e| StoreError::Other(e.into()))?
        .map_err(sqlite_error)
    }
}

impl EmbeddedStore {
    /// Runs `f` with the writer connection on the blocking pool.
    async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&mut lock(&inner.writer)))
            .await
            .map_err(|e| StoreError::Other(e.into()))?
            .map_err(sqlite_error)
    }
}

const COLLECT_SQL: &str = "
INSERT INTO consumer_expired (consumer_id, expired_ms)
SELECT consumer_id, ?3 FROM consumer_subscriptions WHERE consumer_id = ?1 AND last_activity_ms < ?2
ON CONFLICT (consumer_id) DO UPDATE SET expired_ms = excluded.expired_ms";
const COLLECT_DELETE_SQL: &str = "DELETE FROM consumer_subscriptions WHERE consumer_id = ?1 AND last_activity_ms < ?2";

const CONSUMER_UPDATE_SQL: &str = "
UPDATE consumer_subscriptions SET
    filter_json = CASE WHEN ?2 THEN ?3 ELSE filter_json END,
    cursor = max(cursor, min(coalesce(?4, cursor), (SELECT last_id FROM tidings_head))),
    last_activity_ms = ?5
WHERE consumer_id = ?1 AND (owner = ?6 OR ?7)
RETURNING consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner";

fn consumer_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Consumer> {
    Ok(Consumer {
        id: r.get(0)?,
        filter_json: r.get(1)?,
        cursor: r.get(2)?,
        created_ms: r.get(3)?,
        last_activity_ms: r.get(4)?,
        owner: r.get(5)?,
    })
}

/// Collects `id` if it has been silent since before `before_ms`.
fn collect(conn: &Connection, id: &str, before_ms: i64, now_ms: i64) -> rusqlite::Result<()> {
    conn.execute(COLLECT_SQL, params![id, before_ms, now_ms])?;
    conn.execute(COLLECT_DELETE_SQL, params![id, before_ms])?;
    Ok(())
}

fn is_expired(conn: &Connection, id: &str) -> rusqlite::Result<bool> {
    conn.query_row("SELECT EXISTS (SELECT 1 FROM consumer_expired WHERE consumer_id = ?1)", [id], |r| r.get(0))
}

/// Why an owner-checked statement touched no consumer.
fn why_not(conn: &Connection, id: &str) -> rusqlite::Result<Acked> {
    let exists: bool = conn.query_row("SELECT EXISTS (SELECT 1 FROM consumer_subscriptions WHERE consumer_id = ?1)", [id], |r| r.get(0))?;
    Ok(if exists {
        Acked::Forbidden
    } else if is_expired(conn, id)? {
        Acked::Expired
    } else {
        Acked::NotFound
    })
}

/// Appends `batch` inside `tx`: ids continue from the head, allocated under
/// the write transaction (SQLite has one writer), so they are gap-free and
/// commit-ordered.
fn append_in(tx: &rusqlite::Transaction<'_>, batch: &[NewRecord]) -> rusqlite::Result<Vec<EventId>> {
    let base: i64 = tx.query_row("SELECT last_id FROM tidings_head WHERE singleton = 1", [], |r| r.get(0))?;
    let now = chrono::Utc::now().timestamp_millis();
    let mut insert = tx.prepare_cached("INSERT INTO events (id, event_type, body, recorded_at) VALUES (?1, ?2, ?3, ?4)")?;
    for (i, record) in batch.iter().enumerate() {
        insert.execute(params![base + 1 + i as i64, record.event_type, record.body, now])?;
    }
    let last = base + batch.len() as i64;
    tx.execute("UPDATE tidings_head SET last_id = ?1 WHERE singleton = 1", [last])?;
    Ok((base + 1..=last).collect())
}

/// Stores an entity by hash; a pinned one (a capability chain a subscription
/// keeps) is never pruned.
fn content_put_in(tx: &rusqlite::Transaction<'_>, hash: &str, body: &str, now: i64, pinned: bool) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO tidings_content (hash, body, stored_ms, pinned) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (hash) DO UPDATE SET stored_ms = excluded.stored_ms, pinned = max(pinned, excluded.pinned)",
        params![hash, body, now, pinned],
    )?;
    Ok(())
}

/// A tree write inside `tx` (the writer connection serialises writers): the
/// change event appended, and the entity kept in the content store too.
fn tree_write_in(tx: &rusqlite::Transaction<'_>, write: TreeWrite) -> rusqlite::Result<TreeOutcome> {
    let current: Option<String> = tx.query_row("SELECT hash FROM tree_entities WHERE path = ?1", [&write.path], |r| r.get(0)).optional()?;
    let kind = match write.decide(current.as_deref()) {
        Ok(kind) => kind,
        Err(outcome) => return Ok(outcome),
    };
    let record = (write.event)(kind, current.as_deref());
    if let Some(previous) = &current {
        // The change event names the replaced entity: keep it as long.
        tx.execute("UPDATE tidings_content SET stored_ms = ?2 WHERE hash = ?1", params![previous, chrono::Utc::now().timestamp_millis()])?;
    }
    let event_id = append_in(tx, std::slice::from_ref(&record))?[0];
    match (&write.entity, kind) {
        (Some((entity, hash)), _) => {
            tx.execute(
                "INSERT INTO tree_entities (path, entity, hash, changed_event) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (path) DO UPDATE SET entity = excluded.entity, hash = excluded.hash, changed_event = excluded.changed_event",
                params![write.path, entity, hash, event_id],
            )?;
            content_put_in(tx, hash, entity, chrono::Utc::now().timestamp_millis(), false)?;
        }
        (None, ChangeKind::Deleted) => {
            tx.execute("DELETE FROM tree_entities WHERE path = ?1", [&write.path])?;
        }
        (None, _) => {}
    }
    Ok(TreeOutcome::Done { kind, previous_hash: current, event_id })
}

fn sqlite_error(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked | rusqlite::ErrorCode::DiskFull) => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Other(e.into()),
    }
}

fn migrate(conn: &Connection) -> anyhow::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS tidings_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
    )?;
    for (version, name, sql) in MIGRATIONS {
        let done: bool = conn.query_row("SELECT EXISTS (SELECT 1 FROM tidings_migrations WHERE version = ?1)", [version], |r| r.get(0))?;
        if !done {
            tracing::info!(version, name, "applying migration");
            let tx = conn.unchecked_transaction()?;
            tx.execute_batch(sql).with_context(|| format!("migration {version} {name}"))?;
            tx.execute(
                "INSERT INTO tidings_migrations (version, name, applied_at) VALUES (?1, ?2, ?3)",
                params![version, name, chrono::Utc::now().timestamp_millis()],
            )?;
            tx.commit()?;
        }
    }
    Ok(())
}

#[async_trait]
impl EventLog for EmbeddedStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Embedded
    }

    async fn append(&self, batch: Vec<NewRecord>) -> Result<Vec<EventId>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let ids = self
            .write(move |conn| {
                let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let ids = append_in(&tx, &batch)?;
                tx.commit()?;
                Ok(ids)
            })
            .await?;
        if let Some(wake) = lock(&self.inner.wake).as_ref() {
            wake.notify_one();
        }
        Ok(ids)
    }

    async fn read_after(&self, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached("SELECT id, body, recorded_at FROM events WHERE id > ?1 ORDER BY id LIMIT ?2")?;
            let rows =
                stmt.query_map(params![after, limit as i64], |r| Ok(Record { id: r.get(0)?, body: r.get(1)?, recorded_ms: r.get(2)? }))?;
            rows.collect()
        })
        .await
    }

    async fn head(&self) -> Result<EventId, StoreError> {
        self.read(|conn| conn.query_row("SELECT last_id FROM tidings_head WHERE singleton = 1", [], |r| r.get(0))).await
    }

    async fn floor(&self) -> Result<EventId, StoreError> {
        self.read(|conn| {
            conn.query_row("SELECT coalesce((SELECT min(id) - 1 FROM events), (SELECT last_id FROM tidings_head))", [], |r| r.get(0))
        })
        .await
    }

    async fn prune(&self, recorded_before_ms: Option<i64>, keep_last: Option<u64>) -> Result<u64, StoreError> {
        let keep = keep_last.map(|k| k.min(i64::MAX as u64) as i64);
        self.write(move |conn| {
            let cut: i64 = conn.query_row(
                // Never past the subscription engine's cursor: a change it
                // has not turned into notifications yet is kept.
                "SELECT min(max(
                    coalesce((SELECT max(id) FROM events WHERE recorded_at < ?1), 0),
                    coalesce((SELECT last_id FROM tidings_head) - ?2, 0)),
                    (SELECT cursor FROM tidings_engine WHERE name = 'subscriptions'))",
                params![recorded_before_ms, keep],
                |r| r.get(0),
            )?;
            let mut deleted = 0;
            loop {
                // In slices, so appends are not held up for long.
                let n = conn.execute("DELETE FROM events WHERE id <= min(?1, (SELECT min(id) FROM events) + 9999)", [cut])?;
                deleted += n as u64;
                if n == 0 {
                    break;
                }
            }
            if deleted > 0 {
                // Entities no path holds and no retained change names.
                conn.execute(
                    "DELETE FROM tidings_content
                     WHERE NOT pinned
                       AND stored_ms < coalesce((SELECT min(recorded_at) FROM events), ?1)
                       AND NOT EXISTS (SELECT 1 FROM tree_entities t WHERE t.hash = tidings_content.hash)",
                    [chrono::Utc::now().timestamp_millis()],
                )?;
            }
            Ok(deleted)
        })
        .await
    }

    async fn consumer_open(&self, open: ConsumerOpen<'_>) -> Result<Opened, StoreError> {
        let (id, since, now, before) = (open.id.to_owned(), open.since, open.now_ms, open.expire_before_ms);
        let (owner, admin) = (open.actor.sub.to_owned(), open.actor.admin);
        let replace = open.filter_json.is_some();
        let filter = open.filter_json.flatten().map(str::to_owned);
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            collect(&tx, &id, before, now)?;
            let update = |tx: &rusqlite::Transaction<'_>| {
                tx.query_row(CONSUMER_UPDATE_SQL, params![id, replace, filter, since, now, owner, admin], consumer_row).optional()
            };
            let mut row = update(&tx)?;
            if row.is_none() {
                if is_expired(&tx, &id)? && since.is_none() {
                    tx.commit()?;
                    return Ok(Opened::Expired);
                }
                let created = tx.execute(
                    "INSERT OR IGNORE INTO consumer_subscriptions (consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner)
                     SELECT ?1, ?2, min(coalesce(?3, last_id), last_id), ?4, ?4, ?5 FROM tidings_head",
                    params![id, filter, since, now, owner],
                )?;
                if created == 1 {
                    tx.execute("DELETE FROM consumer_expired WHERE consumer_id = ?1", [&id])?;
                }
                row = update(&tx)?;
            }
            tx.commit()?;
            // Still none: the consumer exists and belongs to someone else.
            Ok(row.map_or(Opened::Forbidden, Opened::Ready))
        })
        .await
    }

    async fn consumer_ack(
        &self,
        id: &str,
        cursor: EventId,
        now_ms: i64,
        expire_before_ms: i64,
        actor: Actor<'_>,
    ) -> Result<Acked, StoreError> {
        let id = id.to_owned();
        let (owner, admin) = (actor.sub.to_owned(), actor.admin);
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            collect(&tx, &id, expire_before_ms, now_ms)?;
            let row: Option<i64> = tx
                .query_row(
                    "UPDATE consumer_subscriptions
                     SET cursor = max(cursor, min(?2, (SELECT last_id FROM tidings_head))), last_activity_ms = ?3
                     WHERE consumer_id = ?1 AND (owner = ?4 OR ?5) RETURNING cursor",
                    params![id, cursor, now_ms, owner, admin],
                    |r| r.get(0),
                )
                .optional()?;
            let acked = match row {
                Some(c) => Acked::Cursor(c),
                None => why_not(&tx, &id)?,
            };
            tx.commit()?;
            Ok(acked)
        })
        .await
    }

    async fn consumer_list(&self, actor: Actor<'_>) -> Result<Vec<Consumer>, StoreError> {
        let (owner, admin) = (actor.sub.to_owned(), actor.admin);
        self.read(move |conn| {
            let mut stmt = conn.prepare(
                "SELECT consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner FROM consumer_subscriptions
                 WHERE owner = ?1 OR ?2 ORDER BY consumer_id",
            )?;
            let rows = stmt.query_map(params![owner, admin], consumer_row)?;
            rows.collect()
        })
        .await
    }

    async fn consumer_delete(&self, id: &str, actor: Actor<'_>) -> Result<Acked, StoreError> {
        let (id, owner, admin) = (id.to_owned(), actor.sub.to_owned(), actor.admin);
        self.write(move |conn| {
            let cursor: Option<i64> = conn
                .query_row(
                    "DELETE FROM consumer_subscriptions WHERE consumer_id = ?1 AND (owner = ?2 OR ?3) RETURNING cursor",
                    params![id, owner, admin],
                    |r| r.get(0),
                )
                .optional()?;
            match cursor {
                Some(c) => Ok(Acked::Cursor(c)),
                None => why_not(conn, &id),
            }
        })
        .await
    }

    async fn consumer_expire(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO consumer_expired (consumer_id, expired_ms)
                 SELECT consumer_id, ?2 FROM consumer_subscriptions WHERE last_activity_ms < ?1
                 ON CONFLICT (consumer_id) DO UPDATE SET expired_ms = excluded.expired_ms",
                params![before_ms, chrono::Utc::now().timestamp_millis()],
            )?;
            let n = tx.execute("DELETE FROM consumer_subscriptions WHERE last_activity_ms < ?1", [before_ms])?;
            tx.commit()?;
            Ok(n as u64)
        })
        .await
    }

    async fn tree_get(&self, path: &str) -> Result<Option<TreeEntry>, StoreError> {
        let path = path.to_owned();
        self.read(move |conn| {
            conn.query_row("SELECT entity, hash FROM tree_entities WHERE path = ?1", [&path], |r| {
                Ok(TreeEntry { path: path.clone(), entity: r.get(0)?, hash: r.get(1)? })
            })
            .optional()
        })
        .await
    }

    async fn tree_below(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        // Everything after "prefix/" and before "prefix0" ('0' follows '/').
        let (from, to) =
            if prefix.is_empty() { (String::new(), "\u{10FFFF}".to_owned()) } else { (format!("{prefix}/"), format!("{prefix}0")) };
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached("SELECT path FROM tree_entities WHERE path > ?1 AND path < ?2 ORDER BY path LIMIT ?3")?;
            let rows = stmt.query_map(params![from, to, limit as i64], |r| r.get(0))?;
            rows.collect()
        })
        .await
    }

    async fn tree_write(&self, write: TreeWrite) -> Result<TreeOutcome, StoreError> {
        let outcome = self
            .write(move |conn| {
                let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let outcome = tree_write_in(&tx, write)?;
                if matches!(outcome, TreeOutcome::Done { .. }) {
                    tx.commit()?;
                }
                Ok(outcome)
            })
            .await?;
        if matches!(outcome, TreeOutcome::Done { .. }) {
            self.wake();
        }
        Ok(outcome)
    }

    async fn content_put(&self, entities: Vec<(String, String)>) -> Result<(), StoreError> {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            let now = chrono::Utc::now().timestamp_millis();
            for (hash, body) in &entities {
                content_put_in(&tx, hash, body, now, true)?;
            }
            tx.commit()
        })
        .await
    }

    async fn content_get(&self, hash: &str) -> Result<Option<String>, StoreError> {
        let hash = hash.to_owned();
        self.read(move |conn| conn.query_row("SELECT body FROM tidings_content WHERE hash = ?1", [&hash], |r| r.get(0)).optional()).await
    }

    async fn tree_entries_below(&self, prefix: &str, limit: usize) -> Result<Vec<TreeEntry>, StoreError> {
        let (from, to) = (format!("{prefix}/"), format!("{prefix}0"));
        self.read(move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT path, entity, hash FROM tree_entities WHERE path > ?1 AND path < ?2 ORDER BY path LIMIT ?3")?;
            let rows =
                stmt.query_map(params![from, to, limit as i64], |r| Ok(TreeEntry { path: r.get(0)?, entity: r.get(1)?, hash: r.get(2)? }))?;
            rows.collect()
        })
        .await
    }

    async fn engine_state(&self) -> Result<(EventId, HashMap<String, i64>), StoreError> {
        self.read(|conn| {
            let cursor: i64 = conn.query_row("SELECT cursor FROM tidings_engine WHERE name = 'subscriptions'", [], |r| r.get(0))?;
            let mut stmt = conn.prepare_cached("SELECT subscription_id, delivered FROM tidings_subscription_counts")?;
            let counts = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<HashMap<_, _>>>()?;
            Ok((cursor, counts))
        })
        .await
    }

    async fn engine_changes(&self, after: EventId, types: &[&str], limit: usize) -> Result<(Vec<Record>, EventId), StoreError> {
        let types = serde_json::to_string(types).expect("strings serialise");
        self.read(move |conn| {
            let tx = conn.unchecked_transaction()?;
            let head: i64 = tx.query_row("SELECT last_id FROM tidings_head WHERE singleton = 1", [], |r| r.get(0))?;
            let mut stmt = tx.prepare_cached(
                "SELECT id, body, recorded_at FROM events
                 WHERE id > ?1 AND id <= ?2 AND event_type IN (SELECT value FROM json_each(?3)) ORDER BY id LIMIT ?4",
            )?;
            let records = stmt
                .query_map(params![after, head, types, limit as i64], |r| {
                    Ok(Record { id: r.get(0)?, body: r.get(1)?, recorded_ms: r.get(2)? })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let reached = if records.len() == limit { records.last().map_or(head, |r| r.id) } else { head };
            Ok((records, reached.max(after)))
        })
        .await
    }

    async fn engine_commit(&self, commit: EngineCommit) -> Result<bool, StoreError> {
        let committed = self
            .write(move |conn| {
                let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let moved = tx.execute(
                    "UPDATE tidings_engine SET cursor = ?2 WHERE name = 'subscriptions' AND cursor = ?1",
                    params![commit.from, commit.to],
                )?;
                if moved != 1 {
                    return Ok(false);
                }
                for effect in commit.effects {
                    match effect {
                        EngineEffect::Append(record) => {
                            append_in(&tx, std::slice::from_ref(&record))?;
                        }
                        EngineEffect::Tree(write) => {
                            tree_write_in(&tx, write)?;
                        }
                    }
                }
                for (id, count) in commit.counts {
                    match count {
                        Some(n) => tx.execute(
                            "INSERT INTO tidings_subscription_counts (subscription_id, delivered) VALUES (?1, ?2)
                             ON CONFLICT (subscription_id) DO UPDATE SET delivered = excluded.delivered",
                            params![id, n],
                        )?,
                        None => tx.execute("DELETE FROM tidings_subscription_counts WHERE subscription_id = ?1", [&id])?,
                    };
                }
                tx.commit()?;
                Ok(true)
            })
            .await?;
        self.wake();
        Ok(committed)
    }

    async fn engine_lead(&self) -> Result<bool, StoreError> {
        // The data directory's lock already makes this the only process.
        Ok(true)
    }

    async fn engine_resign(&self) {}

    async fn ping(&self) -> Result<(), StoreError> {
        self.read(|conn| conn.query_row("SELECT 1", [], |_| Ok(()))).await
    }

    fn start_wakeups(&self, wake: Arc<Notify>, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        // Appends wake the broker in-process; nothing to run.
        *lock(&self.inner.wake) = Some(wake.clone());
        wake.notify_one();
        tokio::spawn(async move { cancel.cancelled().await })
    }

    fn listener(&self) -> (ListenerState, u64) {
        (ListenerState::Listening, 0)
    }
}
