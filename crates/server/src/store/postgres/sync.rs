//! Delivery that waits for the synchronous standby
//! (`TIDINGS_DELIVERY=replicated`; README "History that survives failover").
//!
//! With synchronous replication PostgreSQL answers a commit only once the
//! synchronous standby has flushed it, and shows it to other sessions only
//! then, with one exception: a commit whose wait is cancelled
//! (`pg_cancel_backend`, a statement timeout) is kept on the primary alone
//! and shown at once. A failover to the standby loses it, after clients
//! may have been shown it and its publisher answered `201`.
//!
//! The gate closes that: nothing read from the log is handed to a client,
//! and no append is answered, until a **barrier** begun after it has
//! committed. A barrier is a transaction that writes one WAL record (a
//! transactional `pg_logical_emit_message`, which touches no table and
//! needs no privilege or `wal_level=logical`) with `synchronous_commit` on:
//! its commit returns once the standby has flushed the WAL up to it, and so
//! everything committed before it began. One task runs barriers one at a
//! time on its own connection (`application_name=tidings-sync`); every
//! waiter is served by the first barrier begun after it asked, so a busy
//! process runs about one barrier per round trip to the standby, whatever
//! the rate of appends and reads.
//!
//! A barrier that is not confirmed within the patience (`TIDINGS_DB_TIMEOUT`)
//! marks replication **stalled**: appends are refused at once with `503
//! replication_unavailable` (nothing stored), waiting reads and appends end
//! with that error, and the barrier keeps waiting (it is never cancelled,
//! which would commit it unreplicated) until the standby is back. An idle
//! process runs a barrier every few seconds, so a lost standby is noticed
//! before the next publish. When the primary names no synchronous standby
//! at all (`synchronous_standby_names` empty, or CloudNativePG's
//! `dataDurability: preferred` with none left), barriers return at once
//! and the process says so in its log, `/health/deep` and metrics:
//! PostgreSQL's configuration decides what is durable; the gate only makes
//! sure nothing is shown before PostgreSQL holds it durable.

use super::*;
use crate::store::DeliveryStatus;

/// How often an idle process runs a barrier.
const IDLE_BARRIER: Duration = Duration::from_secs(5);

/// A transaction writing one WAL record; its commit waits for the
/// synchronous standby. It reads whether the primary names one (a reload
/// may change that at any time).
const BARRIER_SQL: &str = "SELECT current_setting('synchronous_standby_names'), pg_logical_emit_message(true, 'tidings', '')";

/// Whether the primary names a synchronous standby.
const UNKNOWN: u8 = 0;
const NAMED: u8 = 1;
const NONE_NAMED: u8 = 2;

/// The gate (see the module docs). Shared by the store's clones.
#[derive(Debug)]
pub(super) struct SyncGate {
    /// Barriers begun so far (the number of the last one begun).
    begun: AtomicU64,
    /// The number of the last barrier confirmed.
    confirmed: tokio::sync::watch::Sender<u64>,
    /// Ids at or below this are known to be on the synchronous standby.
    through: AtomicI64,
    /// Wakes the barrier task.
    demand: Notify,
    /// A barrier has waited longer than the patience.
    stalled: AtomicBool,
    /// [`NAMED`], [`NONE_NAMED`] or [`UNKNOWN`] (not connected yet).
    standby: AtomicU8,
    /// How long a barrier may take before replication counts as stalled.
    patience: Duration,
}

impl SyncGate {
    pub(super) fn new(patience: Duration) -> Arc<Self> {
        crate::metrics::replication_stalled(false);
        Arc::new(Self {
            begun: AtomicU64::new(0),
            confirmed: tokio::sync::watch::Sender::new(0),
            through: AtomicI64::new(0),
            demand: Notify::new(),
            stalled: AtomicBool::new(false),
            standby: AtomicU8::new(UNKNOWN),
            patience,
        })
    }

    /// Refuses an append while replication is stalled (nothing is stored).
    pub(super) fn admit(&self) -> Result<(), StoreError> {
        if self.stalled.load(Ordering::Acquire) {
            return Err(stalled());
        }
        Ok(())
    }

    /// Returns once every id up to `id`, committed before this call, is on
    /// the synchronous standby, or fails with `replication_unavailable`
    /// after the patience.
    pub(super) async fn replicated(&self, id: EventId) -> Result<(), StoreError> {
        if id <= self.through.load(Ordering::Acquire) {
            return Ok(());
        }
        // The first barrier begun after this line covers `id`.
        let needed = self.begun.load(Ordering::Acquire) + 1;
        let mut confirmed = self.confirmed.subscribe();
        self.demand.notify_one();
        match tokio::time::timeout(self.patience, confirmed.wait_for(|&n| n >= needed)).await {
            Ok(Ok(_)) => {
                self.through.fetch_max(id, Ordering::AcqRel);
                Ok(())
            }
            _ => Err(stalled()),
        }
    }

    /// What `/health/deep` shows.
    pub(super) fn status(&self) -> DeliveryStatus {
        let standby = match self.standby.load(Ordering::Relaxed) {
            NAMED if self.stalled.load(Ordering::Relaxed) => "stalled",
            NAMED => "confirming",
            NONE_NAMED => "none_named",
            _ => "unknown",
        };
        DeliveryStatus { mode: "replicated", synchronous_standby: standby, confirmed_through: self.through.load(Ordering::Relaxed) }
    }

    /// The barrier task: runs until `cancel`.
    pub(super) async fn run(self: Arc<Self>, mut config: tokio_postgres::Config, cancel: CancellationToken) {
        config.application_name("tidings-sync");
        let mut backoff = crate::retry::Backoff::LISTEN;
        loop {
            let result = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.serve(&config, &mut backoff) => r,
            };
            // The connection is gone (a failover, an outage): waiters time
            // out as unavailable; the next connection, to whichever host is
            // the primary now, serves them.
            self.standby.store(UNKNOWN, Ordering::Relaxed);
            tracing::warn!(error = %result.unwrap_err(), "the synchronous replication barrier lost its connection; reconnecting");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }

    /// One connection's life: barriers on demand, and every
    /// [`IDLE_BARRIER`] when idle.
    async fn serve(
        &self,
        config: &tokio_postgres::Config,
        backoff: &mut crate::retry::Backoff,
    ) -> anyhow::Result<std::convert::Infallible> {
        let (mut client, connection) = config.connect(NoTls).await.context("connecting the synchronous replication barrier")?;
        let driver = tokio::spawn(connection);
        let _guard = AbortOnDrop(driver);
        let commit: String =
            client.query_one("SELECT current_setting('synchronous_commit')", &[]).await.context("reading synchronous_commit")?.get(0);
        // A barrier must wait whatever the database's or role's default.
        if matches!(commit.as_str(), "off" | "local") {
            client.batch_execute("SET synchronous_commit = on").await.context("SET synchronous_commit")?;
        }
        loop {
            let number = self.begun.fetch_add(1, Ordering::AcqRel) + 1;
            let names = self.barrier(&mut client).await?;
            backoff.reset();
            let named = if names.trim().is_empty() { NONE_NAMED } else { NAMED };
            if self.standby.swap(named, Ordering::Relaxed) != named && named == NONE_NAMED {
                tracing::warn!(
                    "TIDINGS_DELIVERY=replicated, but the primary names no synchronous standby (synchronous_standby_names is empty): \
                     events are shown once committed on the primary alone, and a failover may lose them"
                );
            }
            self.confirmed.send_if_modified(|n| {
                let newer = number > *n;
                *n = (*n).max(number);
                newer
            });
            if self.stalled.swap(false, Ordering::AcqRel) {
                crate::metrics::replication_stalled(false);
                tracing::info!("the synchronous standby confirms again; publishes are accepted");
            }
            // Waiters that came while this barrier ran were not covered by
            // it: the next one begins at once.
            tokio::select! {
                _ = self.demand.notified() => {}
                _ = tokio::time::sleep(IDLE_BARRIER) => {}
            }
        }
    }

    /// One barrier, answering `synchronous_standby_names`. Past the patience replication counts as stalled, and
    /// the barrier goes on waiting: cancelling it would leave its commit on
    /// the primary alone, and a new one would wait behind it all the same.
    async fn barrier(&self, client: &mut tokio_postgres::Client) -> anyhow::Result<String> {
        let work = async {
            let tx = client.transaction().await?;
            let names: String = tx.query_one(BARRIER_SQL, &[]).await?.get(0);
            tx.commit().await.map(|()| names)
        };
        tokio::pin!(work);
        tokio::select! {
            r = &mut work => return r.context("the synchronous replication barrier"),
            _ = tokio::time::sleep(self.patience) => {}
        }
        if !self.stalled.swap(true, Ordering::AcqRel) {
            crate::metrics::replication_stalled(true);
            tracing::error!(
                patience_ms = self.patience.as_millis() as u64,
                "the synchronous standby does not confirm: publishes are refused (503 replication_unavailable) and nothing new is shown \
                 until it does"
            );
        }
        work.await.context("the synchronous replication barrier")
    }
}

fn stalled() -> StoreError {
    StoreError::Unreplicated("the synchronous standby has not confirmed in time".into())
}

/// Aborts the connection driver with the connection's owner.
struct AbortOnDrop(tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
