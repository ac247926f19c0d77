//! The event log on PostgreSQL: appends (one statement: the head row bumped
//! under its lock, the batch inserted, one NOTIFY), reads by id, the head,
//! the floor and retention.

use super::epoch;
use super::listen::listen_loop;
use super::*;
use crate::store::{Decide, OutboxMoved, OutboxStatus};

#[async_trait]
impl EventLog for PostgresStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Postgres
    }

    async fn append(&self, batch: Vec<NewRecord>) -> Result<Vec<EventId>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        self.admit()?;
        let (types, bodies): (Vec<String>, Vec<String>) = batch.into_iter().map(|r| (r.event_type, r.body)).unzip();
        let base = self.after_append_failed(self.append_rows(&types, &bodies).await).await?;
        self.saw(base + types.len() as i64);
        let ids: Vec<EventId> = (1..=types.len() as i64).map(|i| base + i).collect();
        self.shown(base + types.len() as i64).await?;
        // Committed (one statement): hand it to the broker, which takes it
        // when nothing committed before it is still unread (another
        // process's events come by NOTIFY and a read, as before). The
        // NOTIFY of this commit still wakes the broker; it finds nothing
        // new. `recorded_ms` is this process's clock, close to the row's:
        // it only feeds the latency metrics.
        let hand_off = lock_hand_off(&self.hand_off).clone();
        if let Some(to) = hand_off {
            let now = chrono::Utc::now().timestamp_millis();
            to.give(ids.iter().zip(bodies).map(|(&id, body)| Record { id, body, recorded_ms: now }).collect());
        }
        Ok(ids)
    }

    async fn append_once(&self, source: &str, stream: &str, seq: EventId, records: Vec<NewRecord>) -> Result<Option<EventId>, StoreError> {
        self.admit()?;
        let appended = self.after_append_failed(self.append_once_in(source, stream, seq, records).await).await?;
        match (appended, &self.sync) {
            (Some(id), _) => self.shown(id).await?,
            // Received before, perhaps by a commit whose wait for the
            // standby was cancelled: answered once a barrier covers it.
            (None, Some(gate)) => gate.barrier_after().await?,
            (None, None) => {}
        }
        Ok(appended)
    }

    async fn received_mark(&self, source: &str, stream: &str) -> Result<Option<EventId>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT seq FROM tidings_received WHERE source = $1 AND stream = $2", &[&source, &stream])
            .await
            .map_err(pg_error)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn read_after(&self, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError> {
        let rows = read_after_on(&self.client().await?, after, limit).await?;
        if let Some(last) = rows.last() {
            self.saw(last.id);
            self.shown(last.id).await?;
        }
        Ok(rows)
    }

    async fn read_history(&self, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError> {
        if !self.replicas.any() {
            crate::metrics::history_read(crate::metrics::ReadAt::Primary);
            return self.read_after(after, limit).await;
        }
        let rows = self.replicas.read(after, limit, |from, rest| self.read_after(from, rest)).await?;
        if let Some(last) = rows.last() {
            self.shown(last.id).await?;
        }
        Ok(rows)
    }

    async fn read_tail(&self, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError> {
        if !self.broker_reads_replica || !self.replicas.any() {
            return self.read_after(after, limit).await;
        }
        let listening = self.listener.state.load(Ordering::Relaxed) == 1;
        // After a (re)connect of the LISTEN session, or without one, the
        // notified heads say nothing certain: the primary answers.
        if !listening || self.listener.unsure.swap(false, Ordering::AcqRel) {
            return self.read_after(after, limit).await;
        }
        let until = self.listener.notified.load(Ordering::Acquire);
        if until <= after {
            // Every commit notifies its head; none past this one yet.
            return Ok(Vec::new());
        }
        let rows = self.replicas.tail(after, until, limit, |from, rest| self.read_after(from, rest)).await?;
        if let Some(last) = rows.last() {
            self.shown(last.id).await?;
        }
        if rows.is_empty() {
            // Neither a standby nor the primary holds anything past
            // `after`, below the head notified. Any role that can
            // connect may NOTIFY: a head above the primary's is unknown,
            // not a promise, and is set back (the next read asks the
            // primary, for a true head notified meanwhile).
            let client = self.client().await?;
            let head: EventId = client.query_one("SELECT last_id FROM tidings_head", &[]).await.map_err(pg_error)?.get(0);
            if head < until && self.listener.notified.compare_exchange(until, head, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.listener.unsure.store(true, Ordering::Release);
                tracing::debug!(notified = until, head, "a NOTIFY named a head past the log's: set back");
            }
        }
        Ok(rows)
    }

    fn replicas(&self) -> Option<crate::store::Replicas> {
        self.replicas.any().then(|| self.replicas.status())
    }

    fn delivery(&self) -> Option<crate::store::DeliveryStatus> {
        self.sync.as_ref().map(|gate| gate.status())
    }

    async fn head(&self) -> Result<EventId, StoreError> {
        let client = self.client().await?;
        let row = client.query_one("SELECT last_id FROM tidings_head", &[]).await.map_err(pg_error)?;
        drop(client);
        Ok(self.confirmed_head(row.get(0)).await)
    }

    async fn floor(&self) -> Result<EventId, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one("SELECT coalesce((SELECT min(id) - 1 FROM events), (SELECT last_id FROM tidings_head))", &[])
            .await
            .map_err(pg_error)?;
        Ok(row.get(0))
    }

    async fn publish(&self, publishes: Vec<Publish>) -> Result<Vec<Published>, StoreError> {
        if publishes.iter().all(|p| p.key.is_none()) {
            return idempotency::unkeyed(self, publishes).await;
        }
        self.admit()?;
        let published = async {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_error)?;
            let published = publish_in(&tx, publishes, self.seen()).await?;
            tx.commit().await.map_err(pg_error)?;
            Ok(published)
        };
        let (answers, appended) = self.after_append_failed(published.await).await?;
        if let Some((last, _)) = appended.last() {
            self.saw(*last);
        }
        // A replayed key's events were appended before: shown once the
        // standby has them too.
        let newest = answers.iter().filter_map(published_last).chain(appended.last().map(|(id, _)| *id)).max();
        if let Some(id) = newest {
            self.shown(id).await?;
        }
        self.hand_off_appended(appended);
        Ok(answers)
    }

    async fn outbox_move(&self, limit: usize, max_bytes: usize, decide: &Decide<'_>) -> Result<OutboxMoved, StoreError> {
        self.move_outbox(limit, max_bytes, decide).await
    }

    fn outbox_wakeups(&self) -> Option<Arc<Notify>> {
        Some(self.listener.outbox.clone())
    }

    async fn outbox_status(&self) -> Result<Option<OutboxStatus>, StoreError> {
        self.outbox_status_now().await.map(Some)
    }

    async fn registry_sync(&self, names: Vec<String>, strict: bool, max_payload: usize) -> Result<(), StoreError> {
        self.write_registry(names, strict, max_payload).await
    }

    async fn prune_set_aside(&self, before_ms: i64) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM tidings.outbox WHERE error_code IS NOT NULL AND created_at < to_timestamp($1::bigint / 1000.0)",
                &[&before_ms],
            )
            .await
            .map_err(pg_error)
    }

    async fn prune_idempotency(&self, before_ms: i64) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client.execute("DELETE FROM tidings_idempotency WHERE created_ms < $1", &[&before_ms]).await.map_err(pg_error)
    }

    async fn bounds(&self) -> Result<Bounds, StoreError> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached("SELECT coalesce((SELECT min(id) - 1 FROM events), last_id), last_id, epoch FROM tidings_head")
            .await
            .map_err(pg_error)?;
        let row = client.query_one(&statement, &[]).await.map_err(pg_error)?;
        drop(client);
        let floor: EventId = row.get(0);
        Ok(Bounds { floor, head: self.confirmed_head(row.get(1)).await.max(floor), epoch: row.get(2) })
    }

    async fn prune(&self, recorded_before_ms: Option<i64>, keep_last: Option<u64>) -> Result<u64, StoreError> {
        let client = self.client().await?;
        // The newest `keep_last` events are kept: the cut is counted in the
        // log's ids, which jump at an epoch's start.
        let keep = match keep_last {
            Some(n) => {
                let bounds = self.bounds().await?;
                Some(self.epochs(bounds.epoch).await?.back(bounds.head, n))
            }
            None => None,
        };
        let cut: i64 = client
            .query_one(
                // Never past the subscription engine's cursor (a change it
                // has not turned into notifications yet is kept), nor past
                // the courier's slowest lane (a notification a peer has not
                // taken yet is kept: the log is the courier's queue).
                "SELECT LEAST(GREATEST(
                    COALESCE((SELECT max(id) FROM events WHERE recorded_at < to_timestamp($1::bigint / 1000.0)), 0),
                    COALESCE($2::bigint, 0)),
                    (SELECT cursor FROM tidings_engine WHERE name = 'subscriptions'),
                    (SELECT min(cursor) FROM tidings_device_cursors WHERE owner = $3))",
                &[&recorded_before_ms, &keep, &crate::store::COURIER_CURSORS],
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

    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.simple_query("SELECT 1").await.map_err(pg_error)?;
        Ok(())
    }

    async fn epochs(&self, at_least: i32) -> Result<Arc<Epochs>, StoreError> {
        if let Some(epochs) = self.epochs.get(at_least) {
            return Ok(epochs);
        }
        let client = self.client().await?;
        let epochs = epoch::read_epochs(&**client).await?;
        Ok(self.epochs.set(epochs))
    }

    async fn recheck_epoch(&self, head: EventId) -> Result<bool, StoreError> {
        let seen = self.seen();
        let now = chrono::Utc::now().timestamp_millis();
        let last = self.listener.rechecked_ms.load(Ordering::Relaxed);
        if seen <= head
            || now - last < 1_000
            || self.listener.rechecked_ms.compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed).is_err()
        {
            return Ok(false);
        }
        Ok(self.settle(epoch::Settle::Check { seen }).await?.is_some())
    }

    async fn begin_epoch(&self, reason: EpochReason, seen: EventId) -> Result<Epoch, StoreError> {
        debug_assert_eq!(reason, EpochReason::Operator, "PostgreSQL begins the other epochs itself");
        let begun = self.settle(epoch::Settle::Begin { seen }).await?;
        begun.ok_or_else(|| StoreError::Other(anyhow::anyhow!("no epoch was begun")))
    }

    #[expect(clippy::disallowed_methods, reason = "the store's wake-up task lives until `cancel`")]
    fn start_wakeups(&self, wake: Arc<Notify>, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        let config = self.config.clone();
        let status = self.listener.clone();
        tokio::spawn(listen_loop(config, status, self.epochs.clone(), wake, cancel))
    }

    fn hand_off_to(&self, to: HandOff) {
        *lock_hand_off(&self.hand_off) = Some(to);
    }

    fn listener(&self) -> crate::store::Listener {
        let state = match self.listener.state.load(Ordering::Relaxed) {
            1 => ListenerState::Listening,
            2 => ListenerState::Reconnecting,
            _ => ListenerState::Starting,
        };
        let heard = self.listener.heard_ms.load(Ordering::Relaxed);
        let silence = u64::try_from(chrono::Utc::now().timestamp_millis() - heard).unwrap_or(0);
        crate::store::Listener {
            state,
            reconnects: self.listener.reconnects.load(Ordering::Relaxed),
            silence_ms: (heard > 0).then_some(silence),
        }
    }
}

/// The records after `after`, at most `limit`, read on `client` (the
/// primary's pool or a standby's).
pub(super) async fn read_after_on(client: &deadpool_postgres::Object, after: EventId, limit: usize) -> Result<Vec<Record>, StoreError> {
    let statement = client
        .prepare_cached("SELECT id, body, (extract(epoch FROM recorded_at) * 1000)::bigint FROM events WHERE id > $1 ORDER BY id LIMIT $2")
        .await
        .map_err(pg_error)?;
    let rows = client.query(&statement, &[&after, &(limit as i64)]).await.map_err(pg_error)?;
    Ok(rows.into_iter().map(|r| Record { id: r.get(0), body: r.get(1), recorded_ms: r.get(2) }).collect())
}

/// The newest id a publish was answered with.
fn published_last(published: &Published) -> Option<EventId> {
    match published {
        Published::Stored(ids) | Published::Replayed(ids) => ids.last().copied(),
        Published::KeyReused => None,
    }
}

/// Publishes in `tx` (see [`EventLog::publish`]): what became of each, and
/// the ids and bodies appended, for the broker once `tx` commits.
pub(super) async fn publish_in(
    tx: &deadpool_postgres::Transaction<'_>,
    mut publishes: Vec<Publish>,
    seen: EventId,
) -> Result<(Vec<Published>, Vec<(EventId, String)>), StoreError> {
    // Claim the keys first, sorted, before the head row: a key another
    // transaction holds (a retry racing its first attempt, in this
    // process or another) makes this one wait for that outcome, and no
    // transaction ever holds the head row while waiting for a key. An
    // expired key is taken over; a live one is left as it is and read.
    let keys = idempotency::distinct_keys(&publishes);
    let (scopes, names): (Vec<&str>, Vec<&str>) = keys.iter().map(|k| (k.scope.as_str(), k.key.as_str())).unzip();
    let hashes: Vec<&[u8]> = keys.iter().map(|k| k.body_hash.as_slice()).collect();
    let now: Vec<i64> = keys.iter().map(|k| k.now_ms).collect();
    let window = keys.first().map_or(0, |k| k.window_ms);
    let claimed = if keys.is_empty() {
        Vec::new()
    } else {
        let claim = tx.prepare_cached(CLAIM_KEYS_SQL).await.map_err(pg_error)?;
        tx.query(&claim, &[&scopes, &names, &hashes, &now, &window]).await.map_err(pg_error)?
    };
    let claimed: std::collections::HashSet<(String, String)> = claimed.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut recorded = HashMap::new();
    let unclaimed: Vec<(&str, &str)> =
        scopes.iter().zip(&names).map(|(s, k)| (*s, *k)).filter(|(s, k)| !claimed.contains(&((*s).to_owned(), (*k).to_owned()))).collect();
    if !unclaimed.is_empty() {
        let (scopes, names): (Vec<&str>, Vec<&str>) = unclaimed.into_iter().unzip();
        let rows = tx
            .query(
                "SELECT i.scope, i.key, i.body_hash, i.event_ids FROM tidings_idempotency i
                 JOIN unnest($1::text[], $2::text[]) AS t(scope, key) ON i.scope = t.scope AND i.key = t.key",
                &[&scopes, &names],
            )
            .await
            .map_err(pg_error)?;
        for row in rows {
            let event_ids = serde_json::from_str(row.get::<_, &str>(3)).unwrap_or_default();
            recorded.insert((row.get(0), row.get(1)), idempotency::Recorded { body_hash: row.get(2), event_ids });
        }
    }
    let plans = idempotency::plan(&publishes, &recorded);
    let (batch, shares) = idempotency::take_batch(&mut publishes, &plans);
    let (types, bodies): (Vec<String>, Vec<String>) = batch.into_iter().map(|r| (r.event_type, r.body)).unzip();
    let ids: Vec<EventId> = if types.is_empty() {
        Vec::new()
    } else {
        let statement = tx.prepare_cached(APPEND_SQL).await.map_err(pg_error)?;
        let base: i64 = tx.query_one(&statement, &[&types, &bodies, &seen]).await.map_err(pg_error)?.get(0);
        (1..=types.len() as i64).map(|i| base + i).collect()
    };
    let appended = idempotency::split(&ids, &shares);
    let (mut scopes, mut names, mut answers) = (Vec::new(), Vec::new(), Vec::new());
    for (publish, ids) in publishes.iter().zip(&appended) {
        if let (Some(key), Some(ids)) = (&publish.key, ids) {
            scopes.push(key.scope.as_str());
            names.push(key.key.as_str());
            answers.push(serde_json::to_string(&idempotency::answered(key, ids)).unwrap_or_default());
        }
    }
    if !scopes.is_empty() {
        tx.execute(
            "UPDATE tidings_idempotency i SET event_ids = t.ids FROM unnest($1::text[], $2::text[], $3::text[]) AS t(scope, key, ids)
             WHERE i.scope = t.scope AND i.key = t.key",
            &[&scopes, &names, &answers],
        )
        .await
        .map_err(pg_error)?;
    }
    let answers = idempotency::finish(&publishes, plans, appended);
    Ok((answers, ids.into_iter().zip(bodies).collect()))
}

impl PostgresStore {
    /// [`EventLog::append_once`], once.
    async fn append_once_in(
        &self,
        source: &str,
        stream: &str,
        seq: EventId,
        records: Vec<NewRecord>,
    ) -> Result<Option<EventId>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        // The row lock taken here serialises concurrent retries of one stream.
        let moved = tx
            .query_opt(
                "INSERT INTO tidings_received (source, stream, seq) VALUES ($1, $2, $3)
                 ON CONFLICT (source, stream) DO UPDATE SET seq = EXCLUDED.seq WHERE tidings_received.seq < EXCLUDED.seq
                 RETURNING seq",
                &[&source, &stream, &seq],
            )
            .await
            .map_err(pg_error)?;
        if moved.is_none() {
            return Ok(None);
        }
        let statement = tx.prepare_cached(APPEND_SQL).await.map_err(pg_error)?;
        let n = i64::try_from(records.len()).unwrap_or(i64::MAX);
        let (types, bodies): (Vec<String>, Vec<String>) = records.into_iter().map(|r| (r.event_type, r.body)).unzip();
        let row = tx.query_one(&statement, &[&types, &bodies, &self.seen()]).await.map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)?;
        let base: i64 = row.get(0);
        self.saw(base + n);
        Ok(Some(base + n))
    }

    /// One append of `types` and `bodies` on a pooled connection: the id
    /// before the first.
    async fn append_rows(&self, types: &[String], bodies: &[String]) -> Result<EventId, StoreError> {
        let client = self.client().await?;
        let statement = client.prepare_cached(APPEND_SQL).await.map_err(pg_error)?;
        let row = client.query_one(&statement, &[&types, &bodies, &self.seen()]).await.map_err(pg_error)?;
        Ok(row.get(0))
    }

    /// Hands committed records to the broker, as [`EventLog::append`] does.
    pub(super) fn hand_off_appended(&self, appended: Vec<(EventId, String)>) {
        if appended.is_empty() {
            return;
        }
        let hand_off = lock_hand_off(&self.hand_off).clone();
        if let Some(to) = hand_off {
            let now = chrono::Utc::now().timestamp_millis();
            to.give(appended.into_iter().map(|(id, body)| Record { id, body, recorded_ms: now }).collect());
        }
    }
}
