//! Hot standbys that serve history (`TIDINGS_REPLICA_URLS`).
//!
//! A catch-up read asks for the ids after a cursor, all of them committed
//! (the session reads up to a position the broker or the head reported).
//! Ids are gap-free and commit-ordered, and a standby replays commits in
//! order, so what a standby holds is a prefix of the log: its answer is
//! complete exactly when it returns as many rows as were asked for, and
//! otherwise its rows from the cursor on are still exact. A read takes
//! what a usable standby has and the rest from the primary; it never
//! misses or repeats an id because of a standby.
//!
//! A probe checks every standby once a second: its replayed head against
//! the primary's, and how long since it replayed a commit. A standby that
//! does not answer, is not in recovery, is not a copy of the primary's
//! cluster, or is behind by more than `TIDINGS_REPLICA_MAX_LAG` is skipped
//! until a probe finds it usable again; a read that fails on a standby
//! marks it down at once and is served by the primary.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use deadpool_postgres::Pool;

use super::{PostgresOptions, pg_error, pool_error};
use crate::metrics as m;
use crate::store::{Record, ReplicaStatus, StoreError};

/// How often each standby is probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Most pooled connections to one standby.
const POOL_SIZE: usize = 8;
/// How long a pool kept at the connections a standby allowed waits before
/// it tries for [`POOL_SIZE`] again.
const REGROW_AFTER: Duration = Duration::from_secs(60);
/// Longest one read at a standby may take before the primary answers it.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest the broker waits for a standby to replay a notified commit
/// before it reads the primary (`TIDINGS_BROKER_READS=replica`).
const TAIL_WAIT: Duration = Duration::from_millis(100);
/// Longest a standby serves history without a probe having checked it
/// (its epoch, its recovery, its lag): a probe that finds every
/// connection busy lets it serve on only this long.
const UNCHECKED_LIMIT: Duration = Duration::from_secs(3);

/// The standbys of one primary.
#[derive(Debug)]
pub(super) struct Replicas {
    list: Vec<Replica>,
    max_lag: Duration,
    /// History reads the primary answered (in part or whole).
    primary_reads: AtomicU64,
    /// The broker's tail reads the primary answered.
    primary_tail_reads: AtomicU64,
    /// Round-robin position.
    next: AtomicU64,
}

#[derive(Debug)]
struct Replica {
    /// `host:port/dbname`: the URL without credentials, for logs and
    /// `/health/deep` (shown to admins only).
    name: String,
    /// Its position in `TIDINGS_REPLICA_URLS`: the `replica` label of the
    /// metrics, which anyone who reaches `/metrics` reads (no addresses).
    label: String,
    pool: Pool,
    usable: AtomicBool,
    up: AtomicBool,
    /// Ids the standby is behind the primary's head, at the last probe.
    lag_events: AtomicI64,
    /// Milliseconds since the standby replayed a commit, while it is
    /// behind; 0 when it holds the primary's head.
    lag_ms: AtomicI64,
    reads: AtomicU64,
    /// When a probe last checked it.
    checked: std::sync::Mutex<tokio::time::Instant>,
    last_error: std::sync::Mutex<Option<String>>,
    /// The connections this process kept reading through when the standby
    /// refused another, and when.
    capped: std::sync::Mutex<Option<(usize, tokio::time::Instant)>>,
    /// At most this many reads at the standby at once: [`POOL_SIZE`], or
    /// the connections the standby allowed while it refuses more.
    gate: tokio::sync::Semaphore,
    /// The gate's size now (changed under `capped`'s lock).
    gate_size: AtomicUsize,
    /// Permits still to be taken out of the gate: reads held them when it
    /// shrank, and each gives its own up as it ends.
    owed: AtomicUsize,
    /// How long a read waits at the gate before the primary answers it.
    wait: Duration,
}

impl Replicas {
    /// Pools for `urls` (connected lazily), probed from now on while the
    /// returned set lives.
    #[expect(clippy::disallowed_methods, reason = "each standby's prober is a task for the store's lifetime")]
    pub(super) fn connect(urls: &[String], options: &PostgresOptions, max_lag: Duration, primary: Pool) -> anyhow::Result<Arc<Self>> {
        let mut list = Vec::with_capacity(urls.len());
        for url in urls {
            let (config, pool) =
                super::pool(url, "a TIDINGS_REPLICA_URLS entry", "tidings-replica-reader", POOL_SIZE, options.acquire_timeout)?;
            let name = name_of(&config);
            let label = list.len().to_string();
            m::replica_up(&label, false);
            list.push(Replica {
                name,
                label,
                pool,
                usable: AtomicBool::new(false),
                up: AtomicBool::new(false),
                lag_events: AtomicI64::new(0),
                lag_ms: AtomicI64::new(0),
                reads: AtomicU64::new(0),
                checked: std::sync::Mutex::new(tokio::time::Instant::now()),
                last_error: std::sync::Mutex::new(Some("not probed yet".to_owned())),
                capped: std::sync::Mutex::new(None),
                gate: tokio::sync::Semaphore::new(POOL_SIZE),
                gate_size: AtomicUsize::new(POOL_SIZE),
                owed: AtomicUsize::new(0),
                wait: options.acquire_timeout,
            });
        }
        let replicas = Arc::new(Self {
            list,
            max_lag,
            primary_reads: AtomicU64::new(0),
            primary_tail_reads: AtomicU64::new(0),
            next: AtomicU64::new(0),
        });
        if !replicas.list.is_empty() {
            tokio::spawn(probe(Arc::downgrade(&replicas), primary));
        }
        Ok(replicas)
    }

    /// Whether any standby is configured.
    pub(super) fn any(&self) -> bool {
        !self.list.is_empty()
    }

    /// The ids after `after`, at most `limit`, every one of them committed
    /// on the primary: from a usable standby as far as it holds them, the
    /// rest from the primary (`primary_read`).
    pub(super) async fn read<F, Fut>(&self, after: i64, limit: usize, primary_read: F) -> Result<Vec<Record>, StoreError>
    where
        F: Fn(i64, usize) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Record>, StoreError>>,
    {
        let mut rows = self.prefix(after, limit).await;
        if rows.len() == limit {
            m::history_read(m::ReadAt::Replica);
            return Ok(rows);
        }
        let from = rows.last().map_or(after, |r| r.id);
        let rest = primary_read(from, limit - rows.len()).await?;
        self.primary_reads.fetch_add(1, Ordering::Relaxed);
        m::history_read(m::ReadAt::Primary);
        if rows.is_empty() {
            return Ok(rest);
        }
        if rest.first().is_some_and(|r| r.id != from + 1) {
            // The primary pruned past where the standby stopped: the page
            // would hide a hole in its middle. The primary's answer from
            // the cursor shows it where the session looks for it, first.
            return primary_read(after, limit).await;
        }
        m::history_read(m::ReadAt::Replica);
        rows.extend(rest);
        Ok(rows)
    }

    /// What a usable standby holds of the ids after `after` (at most
    /// `limit`): only the run that starts right after the cursor and has no
    /// hole is taken (a standby holds a prefix of the log; anything else,
    /// pruning say, is the primary's to say). Empty without a usable one.
    async fn prefix(&self, after: i64, limit: usize) -> Vec<Record> {
        let mut rows = match self.pick() {
            Some(replica) => replica.read(after, limit).await,
            None => Vec::new(),
        };
        let contiguous = rows.iter().enumerate().take_while(|(i, r)| r.id == after + 1 + *i as i64).count();
        rows.truncate(contiguous);
        rows
    }

    /// The broker's read of the ids after `after` up to `until`, the
    /// highest head a NOTIFY carried (all committed): from a standby once
    /// it holds some of them, waiting for it at most [`TAIL_WAIT`]; from
    /// the primary (`primary_read`) when none does by then. A part is
    /// enough: the broker reads again from where it ends.
    pub(super) async fn tail<F, Fut>(&self, after: i64, until: i64, limit: usize, primary_read: F) -> Result<Vec<Record>, StoreError>
    where
        F: FnOnce(i64, usize) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Record>, StoreError>>,
    {
        let wanted = limit.min(usize::try_from(until - after).unwrap_or(0));
        if wanted > 0 {
            let deadline = tokio::time::Instant::now() + TAIL_WAIT;
            // Polls the standby's replay: 1 ms doubling to 20 ms.
            let mut pause = tidings_protocol::retry::Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
            loop {
                let rows = self.prefix(after, wanted).await;
                if !rows.is_empty() {
                    m::broker_read(m::ReadAt::Replica);
                    return Ok(rows);
                }
                if tokio::time::Instant::now() + pause.peek() > deadline {
                    break;
                }
                tokio::time::sleep(pause.step()).await;
            }
        }
        self.primary_tail_reads.fetch_add(1, Ordering::Relaxed);
        m::broker_read(m::ReadAt::Primary);
        primary_read(after, limit).await
    }

    /// A usable standby, round robin.
    fn pick(&self) -> Option<&Replica> {
        let n = self.list.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        (0..n).map(|i| &self.list[(start + i) % n]).find(|r| r.usable.load(Ordering::Acquire))
    }

    /// Every standby's state, and the primary's share of history reads
    /// and of the broker's tail reads.
    pub(super) fn status(&self) -> crate::store::Replicas {
        let list = self
            .list
            .iter()
            .map(|r| ReplicaStatus {
                replica: r.name.clone(),
                usable: r.usable.load(Ordering::Acquire),
                up: r.up.load(Ordering::Acquire),
                lag_events: r.lag_events.load(Ordering::Relaxed),
                lag_ms: r.lag_ms.load(Ordering::Relaxed),
                reads: r.reads.load(Ordering::Relaxed),
                last_error: r.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                connections_capped_at: r.capped.lock().unwrap_or_else(|p| p.into_inner()).map(|(held, _)| held),
            })
            .collect();
        crate::store::Replicas {
            standbys: list,
            primary_history_reads: self.primary_reads.load(Ordering::Relaxed),
            primary_broker_reads: self.primary_tail_reads.load(Ordering::Relaxed),
        }
    }
}

impl Replica {
    /// What this standby holds of the range; nothing when it fails (and
    /// it is then skipped until a probe finds it usable again), or takes
    /// longer than [`READ_TIMEOUT`], or has no connection free in time (a
    /// busy standby is not a broken one: it stays usable).
    ///
    /// A standby that refuses one more connection for its connection
    /// limits (SQLSTATE 53300: a role's or the database's `CONNECTION
    /// LIMIT`, `max_connections` taken by others) while this process holds
    /// some is not down either: the gate in front of the pool shrinks to
    /// the connections it holds, and reads wait there for one of them (at
    /// most `TIDINGS_DB_TIMEOUT`, then the primary answers), until
    /// [`REGROW_AFTER`] has passed and it tries for more again.
    async fn read(&self, after: i64, limit: usize) -> Vec<Record> {
        self.gated(self.wait, self.read_gated(after, limit)).await.unwrap_or_default()
    }

    /// Runs `work` once the gate lets it through (waiting at most `wait`;
    /// `None` when it did not): reads and probes alike, so that a probe of
    /// a standby that caps this process's connections waits its turn for
    /// one of them rather than asking for another.
    async fn gated<T>(&self, wait: Duration, work: impl std::future::Future<Output = T>) -> Option<T> {
        let permit = tokio::time::timeout(wait, self.gate.acquire()).await.ok()?.ok()?;
        let _pass = Pass { permit: Some(permit), owed: &self.owed };
        Some(work.await)
    }

    async fn read_gated(&self, after: i64, limit: usize) -> Vec<Record> {
        let client = match self.pool.get().await {
            Ok(c) => c,
            Err(deadpool_postgres::PoolError::Timeout(_)) => return Vec::new(),
            Err(e) => {
                let full = refused_for_capacity(&e);
                let why = pool_error(e).to_string();
                if !(full && self.refused(&why)) {
                    self.down(why);
                }
                return Vec::new();
            }
        };
        let Ok(result) = tokio::time::timeout(READ_TIMEOUT, super::log::read_after_on(&client, after, limit)).await else {
            self.down(format!("a read took longer than {READ_TIMEOUT:?}"));
            return Vec::new();
        };
        match result {
            Ok(rows) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                rows
            }
            Err(e) => {
                self.down(e.to_string());
                Vec::new()
            }
        }
    }

    /// The standby refused one more connection for its connection limits
    /// (`why`): when the pool holds some, the gate shrinks to them
    /// ([`Self::cap`]) and this answers true; with none held, the standby
    /// serves this process nothing, and the caller marks it down.
    fn refused(&self, why: &str) -> bool {
        let held = self.pool.status().size;
        if held > 0 {
            self.cap(held, why);
        }
        held > 0
    }

    /// Shrinks the gate to the `held` connections the pool has: the
    /// standby refused another (`why`). Said once per cap.
    fn cap(&self, held: usize, why: &str) {
        let mut capped = self.capped.lock().unwrap_or_else(|p| p.into_inner());
        if capped.is_none() {
            tracing::warn!(
                replica = self.name,
                connections = held,
                error = why,
                "a standby refused another connection; this process reads history through the connections it has"
            );
        }
        *capped = Some((held, tokio::time::Instant::now()));
        let size = self.gate_size.load(Ordering::Acquire);
        if held < size {
            self.gate_size.store(held, Ordering::Release);
            let excess = size - held;
            let forgotten = self.gate.forget_permits(excess);
            self.owed.fetch_add(excess - forgotten, Ordering::AcqRel);
        }
    }

    /// After [`REGROW_AFTER`], opens the gate to [`POOL_SIZE`] again.
    fn regrow(&self) {
        let mut capped = self.capped.lock().unwrap_or_else(|p| p.into_inner());
        if capped.is_some_and(|(_, at)| at.elapsed() >= REGROW_AFTER) {
            *capped = None;
            let missing = POOL_SIZE - self.gate_size.swap(POOL_SIZE, Ordering::AcqRel);
            // Permits still owed are with reads that now keep them.
            let owed = self.owed.swap(0, Ordering::AcqRel);
            self.gate.add_permits(missing - owed.min(missing));
        }
    }

    fn down(&self, why: String) {
        if self.usable.swap(false, Ordering::AcqRel) {
            tracing::warn!(replica = self.name, error = why, "a standby stopped serving history; the primary serves it");
        }
        self.up.store(false, Ordering::Release);
        m::replica_up(&self.label, false);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
    }
}

/// A permit of the gate, held while its work runs, ended or dropped: if
/// the gate shrank meanwhile, it is given up rather than handed back.
struct Pass<'a> {
    permit: Option<tokio::sync::SemaphorePermit<'a>>,
    owed: &'a AtomicUsize,
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if self.owed.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
            && let Some(permit) = self.permit.take()
        {
            permit.forget();
        }
    }
}

/// `host:port/dbname` of a connection config.
fn name_of(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().unwrap_or(""))
}

/// Probes every standby once per [`PROBE_EVERY`] until the set is dropped.
async fn probe(replicas: Weak<Replicas>, primary: Pool) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(replicas) = replicas.upgrade() else { return };
        let Ok(Ok(primary)) = tokio::time::timeout(PROBE_EVERY, identify(&primary)).await else {
            // The primary is down: the standbys keep their state (reads
            // that need the primary fail anyway).
            continue;
        };
        for replica in &replicas.list {
            replica.regrow();
            // Through the gate, as a read: under load it waits (half its
            // second) for a held connection instead of asking the standby
            // for one more; then it has its second.
            let found = replica.gated(PROBE_EVERY / 2, tokio::time::timeout(PROBE_EVERY, identify(&replica.pool))).await;
            let (answered, verdict) = match found {
                Some(Err(_)) => (false, Err(Unusable::Silent)),
                Some(Ok(Ok(standby))) => {
                    *replica.checked.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
                    (true, judge(&standby, &primary, replicas.max_lag, replica))
                }
                Some(Ok(Err(Probe::Capacity(e)))) if !replica.refused(&e.to_string()) => (false, Err(Unusable::Unreachable(e.to_string()))),
                Some(Ok(Err(Probe::Store(e)))) => (false, Err(Unusable::Unreachable(e.to_string()))),
                // Reads kept every connection this process may have busy
                // for that long, or the standby refused one more while the
                // pool holds some (capped, as for a read): busy, not down,
                // until it has gone unchecked too long. Then the primary
                // serves its history, the gate empties, and the next probe
                // gets through.
                None | Some(Ok(Err(Probe::Capacity(_)))) => {
                    if replica.checked.lock().unwrap_or_else(|p| p.into_inner()).elapsed() < UNCHECKED_LIMIT {
                        continue;
                    }
                    (true, Err(Unusable::Unchecked(UNCHECKED_LIMIT)))
                }
            };
            match verdict {
                Ok(()) => {
                    replica.up.store(true, Ordering::Release);
                    if !replica.usable.swap(true, Ordering::AcqRel) {
                        tracing::info!(replica = replica.name, "a standby serves history");
                    }
                    *replica.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    m::replica_up(&replica.label, true);
                }
                Err(why) => {
                    replica.down(why.to_string());
                    // Lagging (or misconfigured) is not down: it answered.
                    if answered {
                        replica.up.store(true, Ordering::Release);
                    }
                }
            }
            m::replica_lag(&replica.label, replica.lag_ms.load(Ordering::Relaxed));
        }
    }
}

/// Whether `standby` may serve history; records its lag.
fn judge(standby: &Server, primary: &Server, max_lag: Duration, replica: &Replica) -> Result<(), Unusable> {
    let (behind, lag_ms, verdict) = verdict(standby, primary, max_lag);
    replica.lag_events.store(behind, Ordering::Relaxed);
    replica.lag_ms.store(lag_ms, Ordering::Relaxed);
    verdict
}

/// How far `standby` is behind (ids, and ms since it replayed a commit
/// while behind), and whether it may serve history.
fn verdict(standby: &Server, primary: &Server, max_lag: Duration) -> (i64, i64, Result<(), Unusable>) {
    if !standby.in_recovery {
        return (0, 0, Err(Unusable::NotInRecovery));
    }
    if standby.instance != primary.instance {
        return (0, 0, Err(Unusable::AnotherDatabase));
    }
    if standby.epoch != primary.epoch {
        // A standby of a primary that is gone (left behind by a failover,
        // still holding what the new primary lost), or one that has not
        // replayed the new epoch yet: its history is not the log's.
        return (0, 0, Err(Unusable::AnotherEpoch { standby: standby.epoch, primary: primary.epoch }));
    }
    let behind = (primary.head - standby.head).max(0);
    let lag_ms = if behind == 0 { 0 } else { standby.since_replay_ms.max(0) };
    if u128::try_from(lag_ms).unwrap_or(0) > max_lag.as_millis() {
        return (behind, lag_ms, Err(Unusable::Lagging { behind, lag_ms }));
    }
    (behind, lag_ms, Ok(()))
}

/// Why a standby does not serve history now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Unusable {
    #[error("the standby did not answer the probe within 1 s")]
    Silent,
    #[error("not checked for {0:?}: reads kept every connection to it busy")]
    Unchecked(Duration),
    #[error("{0}")]
    Unreachable(String),
    #[error("not a standby (not in recovery)")]
    NotInRecovery,
    #[error("not a copy of the primary's database (another tidings_instance)")]
    AnotherDatabase,
    #[error("on epoch {standby} of the log, the primary on {primary}")]
    AnotherEpoch { standby: i32, primary: i32 },
    #[error("behind the primary by {behind} events, {lag_ms} ms")]
    Lagging { behind: i64, lag_ms: i64 },
}

/// What a probe learns of a server, primary or standby.
struct Server {
    /// Its `tidings_head`.
    head: i64,
    /// The log's epoch its head row names.
    epoch: i32,
    /// The id the migrations wrote once into the primary's database, which
    /// a standby holds as a copy (no privilege needed to read it).
    instance: String,
    in_recovery: bool,
    /// Since it replayed a commit (a standby).
    since_replay_ms: i64,
}

/// Head, identity and recovery state of the server behind `pool`.
/// Why a probe found nothing: the standby refused a connection for its
/// connection limits, or anything else.
#[derive(Debug, thiserror::Error)]
enum Probe {
    #[error("{0}")]
    Capacity(StoreError),
    #[error("{0}")]
    Store(#[from] StoreError),
}

/// Whether a connection was refused for the server's connection limits
/// (SQLSTATE 53300, `too_many_connections`).
fn refused_for_capacity(e: &deadpool_postgres::PoolError) -> bool {
    matches!(e, deadpool_postgres::PoolError::Backend(e) if e.code() == Some(&tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS))
}

async fn identify(pool: &Pool) -> Result<Server, Probe> {
    let client = match pool.get().await {
        Ok(c) => c,
        Err(e) if refused_for_capacity(&e) => return Err(Probe::Capacity(pool_error(e))),
        Err(e) => return Err(Probe::Store(pool_error(e))),
    };
    let row = client
        .query_one(
            "SELECT (SELECT last_id FROM tidings_head), (SELECT id FROM tidings_instance), pg_is_in_recovery(),
                    coalesce((extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000)::bigint, 0),
                    (SELECT epoch FROM tidings_head)",
            &[],
        )
        .await
        .map_err(pg_error)?;
    // A database without the tables' rows yet answers NULLs: an error, not a
    // panic of the probe.
    let missing = |e: tokio_postgres::Error| StoreError::Unavailable(format!("not a tidings database yet: {e}"));
    Ok(Server {
        head: row.try_get::<_, i64>(0).map_err(missing)?,
        instance: row.try_get::<_, String>(1).map_err(missing)?,
        in_recovery: row.try_get(2).map_err(pg_error)?,
        since_replay_ms: row.try_get(3).map_err(pg_error)?,
        epoch: row.try_get(4).map_err(missing)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(head: i64, instance: &str, in_recovery: bool, since_replay_ms: i64) -> Server {
        Server { head, epoch: 0, instance: instance.to_owned(), in_recovery, since_replay_ms }
    }

    #[test]
    fn a_standby_serves_only_while_it_is_a_close_enough_copy() {
        let primary = server(100, "db-1", false, 0);
        let lag = Duration::from_secs(5);
        // Holding the head: no lag, however long since the last commit.
        assert_eq!(verdict(&server(100, "db-1", true, 60_000), &primary, lag), (0, 0, Ok(())));
        // Behind, replaying recently: usable, its lag shown.
        assert_eq!(verdict(&server(90, "db-1", true, 1_200), &primary, lag), (10, 1_200, Ok(())));
        // Behind and stuck for longer than the limit: skipped.
        assert!(verdict(&server(90, "db-1", true, 6_000), &primary, lag).2.is_err());
        // Another database, or a primary given as a standby: never.
        assert!(verdict(&server(100, "db-2", true, 0), &primary, lag).2.is_err());
        assert!(verdict(&server(100, "db-1", false, 0), &primary, lag).2.is_err());
        // A standby left on an epoch the primary has left (it may hold what
        // the failover lost): never.
        let new_epoch = Server { epoch: 1, ..server(5000, "db-1", false, 0) };
        assert_eq!(verdict(&server(100, "db-1", true, 0), &new_epoch, lag).2, Err(Unusable::AnotherEpoch { standby: 0, primary: 1 }));
    }
}
