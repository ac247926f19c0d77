//! The event log in SQLite: appends with ids allocated inside the write
//! transaction (one writer), reads by id on the reader pool, the head, the
//! floor and retention.

use super::*;

#[async_trait]
impl EventLog for EmbeddedStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Embedded
    }

    async fn append(&self, batch: Vec<NewRecord>) -> Result<Vec<EventId>, StoreError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let hand_off = lock(&self.inner.hand_off).clone();
        let (ids, taken) = self
            .write(move |conn| {
                let now = chrono::Utc::now().timestamp_millis();
                let ids = immediate(conn, |tx| append_at(tx, &batch, now))?;
                // Handed off with the writer still held, so hand-offs come
                // in commit order; the bodies move, nothing is copied.
                let taken = hand_off.is_some_and(|to| {
                    to.give(ids.iter().zip(batch).map(|(&id, record)| Record { id, body: record.body, recorded_ms: now }).collect())
                });
                Ok((ids, taken))
            })
            .await?;
        if !taken {
            self.wake();
        }
        Ok(ids)
    }

    async fn append_once(&self, source: &str, stream: &str, seq: EventId, records: Vec<NewRecord>) -> Result<Option<EventId>, StoreError> {
        let (source, stream) = (source.to_owned(), stream.to_owned());
        let id = self
            .write(move |conn| {
                let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let seen: Option<i64> = tx
                    .query_row("SELECT seq FROM tidings_received WHERE source = ?1 AND stream = ?2", params![source, stream], |r| r.get(0))
                    .optional()?;
                if seen.is_some_and(|s| s >= seq) {
                    return Ok(None);
                }
                let ids = append_in(&tx, &records)?;
                tx.execute(
                    "INSERT INTO tidings_received (source, stream, seq) VALUES (?1, ?2, ?3)
                     ON CONFLICT (source, stream) DO UPDATE SET seq = excluded.seq",
                    params![source, stream, seq],
                )?;
                tx.commit()?;
                Ok(ids.last().copied())
            })
            .await?;
        if id.is_some()
            && let Some(wake) = lock(&self.inner.wake).as_ref()
        {
            wake.notify_one();
        }
        Ok(id)
    }

    async fn received_mark(&self, source: &str, stream: &str) -> Result<Option<EventId>, StoreError> {
        let (source, stream) = (source.to_owned(), stream.to_owned());
        self.read(move |conn| {
            conn.prepare_cached("SELECT seq FROM tidings_received WHERE source = ?1 AND stream = ?2")?
                .query_row(params![source, stream], |r| r.get(0))
                .optional()
        })
        .await
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
        self.read(|conn| conn.prepare_cached("SELECT last_id FROM tidings_head WHERE singleton = 1")?.query_row([], |r| r.get(0))).await
    }

    async fn floor(&self) -> Result<EventId, StoreError> {
        self.read(|conn| {
            conn.query_row("SELECT coalesce((SELECT min(id) - 1 FROM events), (SELECT last_id FROM tidings_head))", [], |r| r.get(0))
        })
        .await
    }

    async fn publish(&self, mut publishes: Vec<Publish>) -> Result<Vec<Published>, StoreError> {
        if publishes.iter().all(|p| p.key.is_none()) {
            return idempotency::unkeyed(self, publishes).await;
        }
        let hand_off = lock(&self.inner.hand_off).clone();
        let (answers, taken) = self
            .write(move |conn| {
                let now = chrono::Utc::now().timestamp_millis();
                let (answers, batch, ids) = immediate(conn, |tx| {
                    let mut recorded = HashMap::new();
                    let mut find = tx.prepare_cached(
                        "SELECT body_hash, event_ids FROM tidings_idempotency WHERE scope = ?1 AND key = ?2 AND created_ms >= ?3",
                    )?;
                    for key in idempotency::distinct_keys(&publishes) {
                        let row = find
                            .query_row(params![key.scope, key.key, key.now_ms.saturating_sub(key.window_ms)], |r| Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, String>(1)?)))
                            .optional()?;
                        if let Some((body_hash, ids)) = row {
                            let event_ids = serde_json::from_str(&ids).unwrap_or_default();
                            recorded.insert((key.scope.clone(), key.key.clone()), idempotency::Recorded { body_hash, event_ids });
                        }
                    }
                    let plans = idempotency::plan(&publishes, &recorded);
                    let (batch, shares) = idempotency::take_batch(&mut publishes, &plans);
                    let ids = if batch.is_empty() { Vec::new() } else { append_at(tx, &batch, now)? };
                    let appended = idempotency::split(&ids, &shares);
                    let mut record = tx.prepare_cached(
                        "INSERT OR REPLACE INTO tidings_idempotency (scope, key, body_hash, event_ids, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?;
                    for (publish, ids) in publishes.iter().zip(&appended) {
                        if let (Some(key), Some(ids)) = (&publish.key, ids) {
                            let answered = serde_json::to_string(&idempotency::answered(key, ids)).unwrap_or_default();
                            record.execute(params![key.scope, key.key, key.body_hash.as_slice(), answered, key.now_ms])?;
                        }
                    }
                    Ok((idempotency::finish(&publishes, plans, appended), batch, ids))
                })?;
                // Handed off with the writer still held, as `append` does.
                let taken = !batch.is_empty()
                    && hand_off.is_some_and(|to| {
                        to.give(ids.iter().zip(batch).map(|(&id, record)| Record { id, body: record.body, recorded_ms: now }).collect())
                    });
                Ok((answers, taken))
            })
            .await?;
        if !taken {
            self.wake();
        }
        Ok(answers)
    }

    async fn prune_idempotency(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.write(move |conn| Ok(conn.execute("DELETE FROM tidings_idempotency WHERE created_ms < ?1", [before_ms])? as u64)).await
    }

    async fn bounds(&self) -> Result<Bounds, StoreError> {
        self.read(|conn| {
            conn.prepare_cached(
                "SELECT coalesce((SELECT min(id) - 1 FROM events), last_id), last_id, epoch FROM tidings_head WHERE singleton = 1",
            )?
            .query_row([], |r| Ok(Bounds { floor: r.get(0)?, head: r.get(1)?, epoch: r.get(2)? }))
        })
        .await
    }

    async fn prune(&self, recorded_before_ms: Option<i64>, keep_last: Option<u64>) -> Result<u64, StoreError> {
        // The newest `keep_last` events are kept: the cut is counted in the
        // log's ids, which jump at an epoch's start.
        let keep = match keep_last {
            Some(n) => {
                let bounds = self.bounds().await?;
                Some(self.epochs(bounds.epoch).await?.back(bounds.head, n))
            }
            None => None,
        };
        self.write(move |conn| {
            let cut: i64 = conn.query_row(
                // Never past the subscription engine's cursor (a change it
                // has not turned into notifications yet is kept), nor past
                // the courier's slowest lane (a notification a peer has not
                // taken yet is kept: the log is the courier's queue).
                "SELECT min(max(
                    coalesce((SELECT max(id) FROM events WHERE recorded_at < ?1), 0),
                    coalesce(?2, 0)),
                    (SELECT cursor FROM tidings_engine WHERE name = 'subscriptions'),
                    coalesce((SELECT min(cursor) FROM tidings_device_cursors WHERE owner = ?3), (SELECT last_id FROM tidings_head)))",
                params![recorded_before_ms, keep, crate::store::COURIER_CURSORS],
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

    async fn ping(&self) -> Result<(), StoreError> {
        self.read(|conn| conn.query_row("SELECT 1", [], |_| Ok(()))).await
    }

    async fn epochs(&self, at_least: i32) -> Result<Arc<Epochs>, StoreError> {
        if let Some(epochs) = self.inner.epochs.get(at_least) {
            return Ok(epochs);
        }
        let epochs = self.read(read_epochs).await?;
        Ok(self.inner.epochs.set(epochs))
    }

    async fn begin_epoch(&self, reason: EpochReason, seen: EventId) -> Result<Epoch, StoreError> {
        let (epoch, epochs) = self
            .write(move |conn| {
                immediate(conn, |tx| {
                    let epochs = read_epochs(tx)?;
                    let head: EventId = tx.query_row("SELECT last_id FROM tidings_head WHERE singleton = 1", [], |r| r.get(0))?;
                    let fork = epochs.fork_at(head);
                    let now = chrono::Utc::now().timestamp_millis();
                    let epoch = Epoch {
                        number: epochs.current().number + 1,
                        fork,
                        base: epoch::next_base(&epochs, head, seen, now),
                        reason,
                        started_ms: now,
                    };
                    tx.execute(
                        "INSERT INTO tidings_epochs (epoch, fork, base, reason, started_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                        params![epoch.number, epoch.fork, epoch.base, reason.as_str(), now],
                    )?;
                    tx.execute("UPDATE tidings_head SET last_id = ?1, epoch = ?2 WHERE singleton = 1", params![epoch.base, epoch.number])?;
                    let mut list = epochs.all().to_vec();
                    list.push(epoch.clone());
                    Ok((epoch, Epochs::new(list)))
                })
            })
            .await?;
        self.inner.epochs.set(epochs);
        Ok(epoch)
    }

    #[expect(clippy::disallowed_methods, reason = "the store's wake-up task lives until `cancel`")]
    fn start_wakeups(&self, wake: Arc<Notify>, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
        // Appends wake the broker in-process; nothing to run.
        *lock(&self.inner.wake) = Some(wake.clone());
        wake.notify_one();
        tokio::spawn(async move { cancel.cancelled().await })
    }

    fn hand_off_to(&self, to: HandOff) {
        *lock(&self.inner.hand_off) = Some(to);
    }

    fn listener(&self) -> crate::store::Listener {
        crate::store::Listener { state: ListenerState::Listening, reconnects: 0, silence_ms: None }
    }
}

/// Every epoch, as stored.
fn read_epochs(conn: &Connection) -> rusqlite::Result<Epochs> {
    let mut stmt = conn.prepare_cached("SELECT epoch, fork, base, reason, started_ms FROM tidings_epochs ORDER BY epoch")?;
    let rows = stmt.query_map([], |r| {
        Ok(Epoch {
            number: r.get(0)?,
            fork: r.get(1)?,
            base: r.get(2)?,
            reason: EpochReason::parse(&r.get::<_, String>(3)?),
            started_ms: r.get(4)?,
        })
    })?;
    Ok(Epochs::new(rows.collect::<rusqlite::Result<Vec<_>>>()?))
}
