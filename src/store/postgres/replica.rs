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

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::Context as _;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use super::{PostgresOptions, pg_error, pool_error};
use crate::metrics as m;
use crate::store::{Record, ReplicaStatus, StoreError};

/// How often each standby is probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Most pooled connections to one standby.
const POOL_SIZE: usize = 8;

/// The standbys of one primary.
#[derive(Debug)]
pub(super) struct Replicas {
    list: Vec<Replica>,
    max_lag: Duration,
    /// History reads the primary answered (in part or whole).
    primary_reads: AtomicU64,
    /// Round-robin position.
    next: AtomicU64,
}

#[derive(Debug)]
struct Replica {
    /// `host:port/dbname`: the URL without credentials, for logs, metrics
    /// and `/health/deep`.
    name: String,
    pool: Pool,
    usable: AtomicBool,
    up: AtomicBool,
    /// Ids the standby is behind the primary's head, at the last probe.
    lag_events: AtomicI64,
    /// Milliseconds since the standby replayed a commit, while it is
    /// behind; 0 when it holds the primary's head.
    lag_ms: AtomicI64,
    reads: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
}

impl Replicas {
    /// Pools for `urls` (connected lazily), probed from now on while the
    /// returned set lives.
    pub(super) fn connect(urls: &[String], options: &PostgresOptions, max_lag: Duration, primary: Pool) -> anyhow::Result<Arc<Self>> {
        let mut list = Vec::with_capacity(urls.len());
        for url in urls {
            let mut config: tokio_postgres::Config = url.parse().context("a TIDINGS_REPLICA_URLS entry is not a valid PostgreSQL URL")?;
            if config.get_application_name().is_none() {
                config.application_name("tidings-replica-reader");
            }
            config.connect_timeout(options.acquire_timeout);
            config.keepalives(true).keepalives_idle(Duration::from_secs(10));
            let name = name_of(&config);
            let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
            let pool = Pool::builder(manager)
                .max_size(POOL_SIZE)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(options.acquire_timeout))
                .create_timeout(Some(options.acquire_timeout))
                .recycle_timeout(Some(options.acquire_timeout))
                .build()
                .context("building a standby's pool")?;
            metrics::gauge!(m::REPLICA_UP, "replica" => name.clone()).set(0.0);
            list.push(Replica {
                name,
                pool,
                usable: AtomicBool::new(false),
                up: AtomicBool::new(false),
                lag_events: AtomicI64::new(0),
                lag_ms: AtomicI64::new(0),
                reads: AtomicU64::new(0),
                last_error: std::sync::Mutex::new(Some("not probed yet".to_owned())),
            });
        }
        let replicas = Arc::new(Self { list, max_lag, primary_reads: AtomicU64::new(0), next: AtomicU64::new(0) });
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
        F: FnOnce(i64, usize) -> Fut,
        Fut: std::future::Future<Output = Result<Vec<Record>, StoreError>>,
    {
        let mut rows = match self.pick() {
            Some(replica) => replica.read(after, limit).await,
            None => Vec::new(),
        };
        // Only the run that starts right after the cursor and has no hole
        // is taken (a standby holds a prefix of the log; anything else,
        // pruning say, is the primary's to say).
        let contiguous = rows.iter().enumerate().take_while(|(i, r)| r.id == after + 1 + *i as i64).count();
        rows.truncate(contiguous);
        if rows.len() == limit {
            metrics::counter!(m::HISTORY_READS, "target" => "replica").increment(1);
            return Ok(rows);
        }
        let from = rows.last().map_or(after, |r| r.id);
        let rest = primary_read(from, limit - rows.len()).await?;
        self.primary_reads.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::HISTORY_READS, "target" => "primary").increment(1);
        if !rows.is_empty() {
            metrics::counter!(m::HISTORY_READS, "target" => "replica").increment(1);
        }
        rows.extend(rest);
        Ok(rows)
    }

    /// A usable standby, round robin.
    fn pick(&self) -> Option<&Replica> {
        let n = self.list.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) as usize;
        (0..n).map(|i| &self.list[(start + i) % n]).find(|r| r.usable.load(Ordering::Acquire))
    }

    /// Every standby's state, and the primary's share of history reads.
    pub(super) fn status(&self) -> (Vec<ReplicaStatus>, u64) {
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
            })
            .collect();
        (list, self.primary_reads.load(Ordering::Relaxed))
    }
}

impl Replica {
    /// What this standby holds of the range; nothing when it fails (and
    /// it is then skipped until a probe finds it usable again).
    async fn read(&self, after: i64, limit: usize) -> Vec<Record> {
        let result = async {
            let client = self.pool.get().await.map_err(pool_error)?;
            let statement = client
                .prepare_cached(
                    "SELECT id, body, (extract(epoch FROM recorded_at) * 1000)::bigint FROM events WHERE id > $1 ORDER BY id LIMIT $2",
                )
                .await
                .map_err(pg_error)?;
            client.query(&statement, &[&after, &(limit as i64)]).await.map_err(pg_error)
        }
        .await;
        match result {
            Ok(rows) => {
                self.reads.fetch_add(1, Ordering::Relaxed);
                rows.into_iter().map(|r| Record { id: r.get(0), body: r.get(1), recorded_ms: r.get(2) }).collect()
            }
            Err(e) => {
                self.down(e.to_string());
                Vec::new()
            }
        }
    }

    fn down(&self, why: String) {
        if self.usable.swap(false, Ordering::AcqRel) {
            tracing::warn!(replica = self.name, error = why, "a standby stopped serving history; the primary serves it");
        }
        self.up.store(false, Ordering::Release);
        metrics::gauge!(m::REPLICA_UP, "replica" => self.name.clone()).set(0.0);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
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
            let found = tokio::time::timeout(PROBE_EVERY, identify(&replica.pool)).await;
            let (answered, verdict) = match found {
                Err(_) => (false, Err("the standby did not answer the probe within 1 s".to_owned())),
                Ok(Err(e)) => (false, Err(e.to_string())),
                Ok(Ok(standby)) => (true, judge(&standby, &primary, replicas.max_lag, replica)),
            };
            match verdict {
                Ok(()) => {
                    replica.up.store(true, Ordering::Release);
                    if !replica.usable.swap(true, Ordering::AcqRel) {
                        tracing::info!(replica = replica.name, "a standby serves history");
                    }
                    *replica.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    metrics::gauge!(m::REPLICA_UP, "replica" => replica.name.clone()).set(1.0);
                }
                Err(why) => {
                    replica.down(why);
                    // Lagging (or misconfigured) is not down: it answered.
                    if answered {
                        replica.up.store(true, Ordering::Release);
                    }
                }
            }
            metrics::gauge!(m::REPLICA_LAG, "replica" => replica.name.clone()).set(replica.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0);
        }
    }
}

/// Whether `standby` may serve history; records its lag.
fn judge(standby: &Server, primary: &Server, max_lag: Duration, replica: &Replica) -> Result<(), String> {
    if !standby.in_recovery {
        return Err("not a standby (not in recovery)".to_owned());
    }
    if standby.instance != primary.instance {
        return Err("not a copy of the primary's database (another tidings_instance)".to_owned());
    }
    let behind = (primary.head - standby.head).max(0);
    let lag_ms = if behind == 0 { 0 } else { standby.since_replay_ms.max(0) };
    replica.lag_events.store(behind, Ordering::Relaxed);
    replica.lag_ms.store(lag_ms, Ordering::Relaxed);
    if u128::try_from(lag_ms).unwrap_or(0) > max_lag.as_millis() {
        return Err(format!("behind the primary by {behind} events, {lag_ms} ms"));
    }
    Ok(())
}

/// What a probe learns of a server, primary or standby.
struct Server {
    /// Its `tidings_head`.
    head: i64,
    /// The id the migrations wrote once into the primary's database, which
    /// a standby holds as a copy (no privilege needed to read it).
    instance: String,
    in_recovery: bool,
    /// Since it replayed a commit (a standby).
    since_replay_ms: i64,
}

/// Head, identity and recovery state of the server behind `pool`.
async fn identify(pool: &Pool) -> Result<Server, StoreError> {
    let client = pool.get().await.map_err(pool_error)?;
    let row = client
        .query_one(
            "SELECT (SELECT last_id FROM tidings_head), (SELECT id FROM tidings_instance), pg_is_in_recovery(),
                    coalesce((extract(epoch FROM now() - pg_last_xact_replay_timestamp()) * 1000)::bigint, 0)",
            &[],
        )
        .await
        .map_err(pg_error)?;
    Ok(Server { head: row.get(0), instance: row.get(1), in_recovery: row.get(2), since_replay_ms: row.get(3) })
}
