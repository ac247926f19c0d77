//! Delivery that waits for the synchronous standby
//! (`TIDINGS_DELIVERY=replicated`; docs/failover.md).
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
//! Replication is **stalled** while a barrier has been wanted for longer
//! than the patience (`TIDINGS_DB_TIMEOUT`) without one confirmed: a barrier
//! waiting for a standby that is gone, or no connection to run one on.
//! Then appends are refused at once with `503 replication_unavailable`
//! (nothing stored), reads and appends waiting for a barrier end with that
//! error, and the barrier keeps waiting (this process never cancels it,
//! which would commit it unreplicated) until the standby is back. A barrier
//! whose wait someone else cancelled (`pg_cancel_backend`; PostgreSQL then
//! commits it with a warning) confirms nothing: the warning is read, and
//! the next barrier waits again. An idle process runs a barrier every few
//! seconds, so a lost standby is noticed before the next publish.
//!
//! When the primary names no synchronous standby at all
//! (`synchronous_standby_names` empty, or CloudNativePG's
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
    /// Declared stalled (see [`SyncGate::is_stalled`]); cleared by the next
    /// confirmed barrier.
    stalled: AtomicBool,
    /// Wakes waiters when a stall is declared.
    stall: Notify,
    /// Since when a barrier has been wanted and none confirmed, in ms after
    /// `started` (0: none wanted).
    wanted_since: AtomicU64,
    /// The gate's own clock origin.
    started: std::time::Instant,
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
            stall: Notify::new(),
            wanted_since: AtomicU64::new(0),
            started: std::time::Instant::now(),
            standby: AtomicU8::new(UNKNOWN),
            patience,
        })
    }

    /// Refuses an append while replication is stalled (nothing is stored).
    pub(super) fn admit(&self) -> Result<(), StoreError> {
        if self.is_stalled() {
            return Err(stalled());
        }
        Ok(())
    }

    /// Returns once every id up to `id`, committed before this call, is on
    /// the synchronous standby, or fails with `replication_unavailable`
    /// once replication is stalled.
    pub(super) async fn replicated(&self, id: EventId) -> Result<(), StoreError> {
        if id <= self.through.load(Ordering::Acquire) {
            return Ok(());
        }
        self.barrier_after().await?;
        self.through.fetch_max(id, Ordering::AcqRel);
        Ok(())
    }

    /// Returns once a barrier begun after this call is confirmed: what
    /// anyone committed before it is on the synchronous standby.
    pub(super) async fn barrier_after(&self) -> Result<(), StoreError> {
        let stall = self.stall.notified();
        tokio::pin!(stall);
        stall.as_mut().enable();
        if self.is_stalled() {
            return Err(stalled());
        }
        // The first barrier begun after this line covers what is committed.
        let needed = self.begun.load(Ordering::Acquire) + 1;
        let mut confirmed = self.confirmed.subscribe();
        self.want();
        self.demand.notify_one();
        tokio::select! {
            r = confirmed.wait_for(|&n| n >= needed) => r.map(|_| ()).map_err(|_| stalled()),
            _ = stall => Err(stalled()),
            // A barrier begun just before this call may take the patience,
            // and then the one this call needs may too.
            _ = tokio::time::sleep(self.patience * 2) => Err(stalled()),
        }
    }

    fn now_ms(&self) -> u64 {
        // Never 0, which means "none wanted".
        self.started.elapsed().as_millis() as u64 + 1
    }

    /// Notes that a barrier is wanted (keeping an earlier unanswered want).
    fn want(&self) {
        let _ = self.wanted_since.compare_exchange(0, self.now_ms(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// Whether a barrier has been wanted for longer than the patience
    /// without one confirmed; declares the stall (log, metric, waiters
    /// woken) the first time it finds one.
    fn is_stalled(&self) -> bool {
        if self.stalled.load(Ordering::Acquire) {
            return true;
        }
        let since = self.wanted_since.load(Ordering::Acquire);
        if since == 0 || self.now_ms().saturating_sub(since) <= self.patience.as_millis() as u64 {
            return false;
        }
        if !self.stalled.swap(true, Ordering::AcqRel) {
            crate::metrics::replication_stalled(true);
            self.stall.notify_waiters();
            tracing::error!(
                patience_ms = self.patience.as_millis() as u64,
                "the synchronous standby does not confirm: publishes are refused (503 replication_unavailable) and nothing new is shown \
                 until it does"
            );
        }
        true
    }

    /// A barrier was confirmed: nothing is wanted, nothing stalled.
    fn confirm(&self, number: u64) {
        self.confirmed.send_if_modified(|n| {
            let newer = number > *n;
            *n = (*n).max(number);
            newer
        });
        self.wanted_since.store(0, Ordering::Release);
        if self.stalled.swap(false, Ordering::AcqRel) {
            crate::metrics::replication_stalled(false);
            tracing::info!("the synchronous standby confirms again; publishes are accepted");
        }
    }

    /// Ids up to this one are known to be on the synchronous standby.
    pub(super) fn through(&self) -> EventId {
        self.through.load(Ordering::Acquire)
    }

    /// What `/health/deep` shows.
    pub(super) fn status(&self) -> DeliveryStatus {
        let standby = match self.standby.load(Ordering::Relaxed) {
            _ if self.is_stalled() => "stalled",
            NAMED => "confirming",
            NONE_NAMED => "none_named",
            _ => "unknown",
        };
        DeliveryStatus { mode: "replicated", synchronous_standby: standby, confirmed_through: self.through.load(Ordering::Relaxed) }
    }

    /// The barrier task: runs until `cancel`.
    pub(super) async fn run(self: Arc<Self>, mut config: tokio_postgres::Config, cancel: CancellationToken) {
        config.application_name("tidings-sync");
        let mut backoff = crate::pacing::LISTEN;
        loop {
            let result = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.serve(&config, &mut backoff) => r,
            };
            // The connection is gone (a failover, an outage): waiters time
            // out as unavailable; the next connection, to whichever host is
            // the primary now, serves them.
            self.standby.store(UNKNOWN, Ordering::Relaxed);
            self.want();
            tracing::warn!(error = %result.unwrap_err(), "the synchronous replication barrier failed; reconnecting");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
        }
    }

    /// One connection's life: barriers on demand, and every
    /// [`IDLE_BARRIER`] when idle.
    #[expect(clippy::disallowed_methods, reason = "a barrier's wait runs apart from its callers, which may be cancelled")]
    async fn serve(
        &self,
        config: &tokio_postgres::Config,
        backoff: &mut tidings_protocol::retry::Backoff,
    ) -> anyhow::Result<std::convert::Infallible> {
        let (mut client, mut connection) = config.connect(NoTls).await.context("connecting the synchronous replication barrier")?;
        // The connection is driven here so its notices are read: a barrier
        // whose wait was cancelled commits with a warning.
        let (notices, mut warned) = mpsc::unbounded_channel::<String>();
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message? {
                    AsyncMessage::Notice(notice) if notice.message().contains("synchronous replication") => {
                        let _ = notices.send(notice.message().to_owned());
                    }
                    _ => {}
                }
            }
            Ok(())
        });
        let _guard = AbortOnDrop(driver);
        // A barrier waits for the standby's flush whatever the database's
        // or role's defaults, and no timeout of ours cancels its wait.
        client
            .batch_execute(
                "SET synchronous_commit = on; SET statement_timeout = 0; SET lock_timeout = 0; SET idle_in_transaction_session_timeout = 0",
            )
            .await
            .context("setting up the barrier's session")?;
        loop {
            let number = self.begun.fetch_add(1, Ordering::AcqRel) + 1;
            self.want();
            let names = self.barrier(&mut client).await?;
            if let Ok(warning) = warned.try_recv() {
                anyhow::bail!("a barrier's wait for the synchronous standby was cancelled ({warning}); it confirms nothing");
            }
            backoff.reset();
            let named = if names.trim().is_empty() { NONE_NAMED } else { NAMED };
            if self.standby.swap(named, Ordering::Relaxed) != named && named == NONE_NAMED {
                tracing::warn!(
                    "TIDINGS_DELIVERY=replicated, but the primary names no synchronous standby (synchronous_standby_names is empty): \
                     events are shown once committed on the primary alone, and a failover may lose them"
                );
            }
            self.confirm(number);
            // Waiters that came while this barrier ran were not covered by
            // it: the next one begins at once.
            tokio::select! {
                _ = self.demand.notified() => {}
                _ = tokio::time::sleep(IDLE_BARRIER) => {}
            }
        }
    }

    /// One barrier, answering `synchronous_standby_names`. Past the
    /// patience replication is stalled, and the barrier goes on waiting:
    /// cancelling it would leave its commit on the primary alone, and a new
    /// one would wait behind it all the same.
    async fn barrier(&self, client: &mut tokio_postgres::Client) -> anyhow::Result<String> {
        let work = async {
            let tx = client.transaction().await?;
            let names: String = tx.query_one(BARRIER_SQL, &[]).await?.get(0);
            tx.commit().await.map(|()| names)
        };
        tokio::pin!(work);
        loop {
            tokio::select! {
                r = &mut work => return r.context("the synchronous replication barrier"),
                // Declares the stall once it is one.
                _ = tokio::time::sleep(self.patience / 4) => { self.is_stalled(); }
            }
        }
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
