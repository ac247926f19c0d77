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
//!
//! One file per concern: `log`, `consumers`, `tree` (the tree and the
//! content store), `engine` (the subscription engine's state).

mod consumers;
mod engine;
mod log;
mod tree;

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
    Acked, Actor, Bounds, ChangeKind, Consumer, ConsumerOpen, ConsumerStore, DeviceCursor, DeviceRead, EngineCommit, EngineEffect, Epoch,
    EpochReason, Epochs, EventLog, FederationStore, HandOff, ListenerState, Moved, NewRecord, Opened, Publish, Published, Record,
    StoreError, StoreKind, Tally, TreeEntry, TreeOutcome, TreeStore, TreeWrite, epoch, idempotency,
};
use tidings_protocol::event::EventId;

const MIGRATIONS: &[(i64, &str, &str)] = &[
    (1, "event_log", include_str!("../../../../../migrations/embedded/0001_event_log.sql")),
    (2, "consumers", include_str!("../../../../../migrations/embedded/0002_consumers.sql")),
    (3, "consumer_owner", include_str!("../../../../../migrations/embedded/0003_consumer_owner.sql")),
    (4, "tree", include_str!("../../../../../migrations/embedded/0004_tree.sql")),
    (5, "subscriptions", include_str!("../../../../../migrations/embedded/0005_subscriptions.sql")),
    (6, "rate_window", include_str!("../../../../../migrations/embedded/0006_rate_window.sql")),
    (7, "device_cursors", include_str!("../../../../../migrations/embedded/0007_device_cursors.sql")),
    (8, "received", include_str!("../../../../../migrations/embedded/0008_received.sql")),
    (9, "consumer_scope", include_str!("../../../../../migrations/embedded/0009_consumer_scope.sql")),
    (10, "tree_version", include_str!("../../../../../migrations/embedded/0010_tree_version.sql")),
    (11, "peer_marks", include_str!("../../../../../migrations/embedded/0011_peer_marks.sql")),
    (12, "instance", include_str!("../../../../../migrations/embedded/0012_instance.sql")),
    (13, "idempotency", include_str!("../../../../../migrations/embedded/0013_idempotency.sql")),
    (14, "sql_publish", include_str!("../../../../../migrations/embedded/0014_sql_publish.sql")),
    (15, "epochs", include_str!("../../../../../migrations/embedded/0015_epochs.sql")),
    (16, "consumer_epoch", include_str!("../../../../../migrations/embedded/0016_consumer_epoch.sql")),
    (17, "device_epoch", include_str!("../../../../../migrations/embedded/0017_device_epoch.sql")),
];

/// Read connections kept open. A constant: SQLite readers in WAL mode run
/// beside the writer, and the broker, replays and polls share them; more
/// readers than a small machine has cores only add page caches (the
/// PostgreSQL pool, which crosses a network, is `TIDINGS_DB_POOL`).
const READERS: usize = 4;
/// How long opening waits for the directory's lock to be let go.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

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
    /// One permit per reader: at most that many reads run at once, each on
    /// a kept connection and one blocking thread. Beyond them a read waits
    /// here, holding nothing (a burst of replays, say, would otherwise
    /// open a connection, a page cache and a thread per read).
    reading: Arc<tokio::sync::Semaphore>,
    wake: Mutex<Option<Arc<Notify>>>,
    hand_off: Mutex<Option<HandOff>>,
    /// The epochs read last.
    epochs: super::epoch::EpochCache,
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
        // A store that is still letting go of the directory (a process
        // exiting, or an application in this one whose last reads are
        // finishing on blocking threads) is waited for, briefly.
        let waited_until = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match lock_file.try_lock() {
                Ok(()) => break,
                Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < waited_until => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(std::fs::TryLockError::WouldBlock) => anyhow::bail!(
                    "the data directory {} is in use by another tidings process; stop it, or give this one its own TIDINGS_DATA_DIR (several processes sharing data need DATABASE_URL and PostgreSQL)",
                    dir.display()
                ),
                Err(std::fs::TryLockError::Error(e)) => return Err(e).with_context(|| format!("locking {}", lock_path.display())),
            }
        }
        let db = dir.join("events.sqlite3");
        let writer = Connection::open(&db).with_context(|| format!("opening {}", db.display()))?;
        writer.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;")?;
        migrate(&writer)?;
        stable_plans(&writer)?;
        let readers = (0..READERS).map(|_| open_reader(&db)).collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                writer: Mutex::new(writer),
                readers: Mutex::new(readers),
                reading: Arc::new(tokio::sync::Semaphore::new(READERS)),
                wake: Mutex::new(None),
                hand_off: Mutex::new(None),
                epochs: Default::default(),
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
        let permit = inner.reading.clone().acquire_owned().await.map_err(|e| StoreError::Other(e.into()))?;
        tokio::task::spawn_blocking(move || {
            // Released once the read is done, even if its caller went away.
            let _permit = permit;
            let conn = lock(&inner.readers).pop();
            let conn = match conn {
                Some(c) => c,
                None => open_reader(&inner.dir.join("events.sqlite3"))?,
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

/// A read-only connection to `db`.
fn open_reader(db: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    conn.execute_batch("PRAGMA busy_timeout=5000;")?;
    stable_plans(&conn)?;
    Ok(conn)
}

/// Plans that do not depend on the values bound (SQLite's query planner
/// stability guarantee). The bundled SQLite is built with `STAT4`, under
/// which a statement whose plan might depend on a bound value is compiled
/// again each time that value changes: the log's reads (`id > ?`) were
/// re-prepared on every call, a tenth of the server's time under a
/// publish load. tidings' queries have one good plan whatever the values.
fn stable_plans(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map(|_| ())
}

/// Runs `f` in one `IMMEDIATE` write transaction, committed when it
/// succeeds and rolled back when it fails. The publish path's transaction:
/// its `BEGIN` and `COMMIT` are cached statements, where rusqlite's
/// `transaction_with_behavior` parses both again for every commit.
fn immediate<T>(conn: &Connection, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    in_transaction(conn, "BEGIN IMMEDIATE", f)
}

/// Runs `f` in one read transaction (one snapshot), with cached statements
/// as [`immediate`]: what follows the log after every commit.
fn snapshot<T>(conn: &Connection, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    in_transaction(conn, "BEGIN", f)
}

fn in_transaction<T>(conn: &Connection, begin: &str, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    conn.prepare_cached(begin)?.execute([])?;
    // Rolls back unless committed: on an error, and when `f` panics.
    let open = Open(conn);
    let value = f(conn)?;
    conn.prepare_cached("COMMIT")?.execute([])?;
    drop(open);
    Ok(value)
}

/// A transaction begun by [`in_transaction`]; rolled back on drop if still open.
struct Open<'c>(&'c Connection);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.0.is_autocommit() {
            let _ = self.0.prepare_cached("ROLLBACK").and_then(|mut rollback| rollback.execute([]));
        }
    }
}

/// Appends `batch` inside a write transaction: ids continue from the head,
/// allocated under it (SQLite has one writer), so they are gap-free and
/// commit-ordered.
fn append_in(tx: &Connection, batch: &[NewRecord]) -> rusqlite::Result<Vec<EventId>> {
    append_at(tx, batch, chrono::Utc::now().timestamp_millis())
}

/// [`append_in`], recorded at `now` (Unix ms).
fn append_at(tx: &Connection, batch: &[NewRecord], now: i64) -> rusqlite::Result<Vec<EventId>> {
    let base: i64 = tx.prepare_cached("SELECT last_id FROM tidings_head WHERE singleton = 1")?.query_row([], |r| r.get(0))?;
    let mut insert = tx.prepare_cached("INSERT INTO events (id, event_type, body, recorded_at) VALUES (?1, ?2, ?3, ?4)")?;
    for (i, record) in batch.iter().enumerate() {
        insert.execute(params![base + 1 + i as i64, record.event_type, record.body, now])?;
    }
    let last = base + batch.len() as i64;
    tx.prepare_cached("UPDATE tidings_head SET last_id = ?1 WHERE singleton = 1")?.execute([last])?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A store opened while another in this process is letting go of the
    /// directory (an application restarted in place) waits for it; one
    /// that is kept is still refused.
    #[tokio::test]
    async fn opening_waits_briefly_for_the_lock_to_be_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = EmbeddedStore::open(dir.path()).await.unwrap();
        let letting_go = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(first);
        });
        EmbeddedStore::open(dir.path()).await.expect("opened once the first let go");
        letting_go.join().unwrap();
        let kept = dir.path().join("kept");
        let _held = EmbeddedStore::open(&kept).await.unwrap();
        let refused = EmbeddedStore::open(&kept).await.expect_err("a kept directory is refused");
        assert!(refused.to_string().contains("is in use by another tidings process"), "{refused}");
    }

    /// The log's reads bind a new id each time; with the bundled SQLite's
    /// `STAT4` they would be compiled again for every call unless plans are
    /// kept stable (see [`stable_plans`]).
    #[test]
    fn a_read_of_the_log_is_not_compiled_again_for_each_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open_blocking(dir.path()).unwrap();
        let conn = open_reader(&dir.path().join("events.sqlite3")).unwrap();
        for after in [0_i64, 5, 17, 42] {
            let mut stmt = conn.prepare_cached("SELECT id, body, recorded_at FROM events WHERE id > ?1 ORDER BY id LIMIT ?2").unwrap();
            stmt.query_map(params![after, 10_i64], |r| r.get::<_, i64>(0)).unwrap().for_each(drop);
            assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0, "compiled again after binding {after}");
        }
        drop(store);
    }

    /// A write that fails, or panics, inside [`immediate`] changes nothing
    /// and leaves no transaction open on the writer behind it.
    #[test]
    fn a_failed_or_panicking_write_leaves_no_transaction_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open_blocking(dir.path()).unwrap();
        let conn = lock(&store.inner.writer);
        let head = || conn.query_row("SELECT last_id FROM tidings_head WHERE singleton = 1", [], |r| r.get::<_, i64>(0)).unwrap();
        let bump = "UPDATE tidings_head SET last_id = 99 WHERE singleton = 1";

        let failed = immediate(&conn, |tx| -> rusqlite::Result<()> {
            tx.execute(bump, [])?;
            Err(rusqlite::Error::InvalidQuery)
        });
        assert!(failed.is_err());
        assert!(conn.is_autocommit(), "rolled back after an error");
        assert_eq!(head(), 0);

        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            immediate(&conn, |tx| -> rusqlite::Result<()> {
                tx.execute(bump, [])?;
                panic!("inside the write")
            })
        }));
        assert!(panicked.is_err());
        assert!(conn.is_autocommit(), "rolled back after a panic");
        assert_eq!(head(), 0);

        immediate(&conn, |tx| tx.execute(bump, [])).unwrap();
        assert_eq!(head(), 99);
    }
}
