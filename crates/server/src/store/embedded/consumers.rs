//! Durable consumers in SQLite: open, ack (monotonic, clamped to the head),
//! list, delete and expiry, each in one write transaction.

use super::*;

const COLLECT_SQL: &str = "
INSERT INTO consumer_expired (consumer_id, expired_ms)
SELECT consumer_id, ?3 FROM consumer_subscriptions WHERE consumer_id = ?1 AND last_activity_ms < ?2
ON CONFLICT (consumer_id) DO UPDATE SET expired_ms = excluded.expired_ms";
const COLLECT_DELETE_SQL: &str = "DELETE FROM consumer_subscriptions WHERE consumer_id = ?1 AND last_activity_ms < ?2";

const CONSUMER_UPDATE_SQL: &str = "
UPDATE consumer_subscriptions SET
    filter_json = CASE WHEN ?2 THEN ?3 ELSE filter_json END,
    cursor = max(cursor, min(coalesce(?4, cursor), (SELECT last_id FROM tidings_head))),
    last_activity_ms = ?5,
    epoch = (SELECT epoch FROM tidings_head)
WHERE consumer_id = ?1 AND (owner = ?6 OR ?7)
RETURNING consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner, ?8, epoch";

fn consumer_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Consumer> {
    Ok(Consumer {
        id: r.get(0)?,
        filter_json: r.get(1)?,
        cursor: r.get(2)?,
        created_ms: r.get(3)?,
        last_activity_ms: r.get(4)?,
        owner: r.get(5)?,
        read_epoch: r.get(6)?,
        epoch: r.get(7)?,
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

#[async_trait]
impl ConsumerStore for EmbeddedStore {
    async fn consumer_open(&self, open: ConsumerOpen<'_>) -> Result<Opened, StoreError> {
        let (id, since, now, before) = (open.id.to_owned(), open.since, open.now_ms, open.expire_before_ms);
        let (owner, admin, max_owned) = (open.actor.sub.to_owned(), open.actor.admin, open.max_owned);
        let replace = open.filter_json.is_some();
        let filter = open.filter_json.flatten().map(str::to_owned);
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            collect(&tx, &id, before, now)?;
            let update = |tx: &rusqlite::Transaction<'_>| {
                // The epoch of the read before this one (RETURNING answers
                // what the update wrote).
                let read_epoch: Option<i32> =
                    tx.query_row("SELECT epoch FROM consumer_subscriptions WHERE consumer_id = ?1", [&id], |r| r.get(0)).optional()?;
                tx.query_row(CONSUMER_UPDATE_SQL, params![id, replace, filter, since, now, owner, admin, read_epoch], consumer_row).optional()
            };
            let mut row = update(&tx)?;
            if row.is_none() {
                if is_expired(&tx, &id)? && since.is_none() {
                    tx.commit()?;
                    return Ok(Opened::Expired);
                }
                // Created only while its owner has fewer than max_owned.
                let created = tx.execute(
                    "INSERT OR IGNORE INTO consumer_subscriptions (consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner, epoch)
                     SELECT ?1, ?2, min(coalesce(?3, last_id), last_id), ?4, ?4, ?5, epoch FROM tidings_head
                     WHERE (SELECT count(*) FROM consumer_subscriptions WHERE owner = ?5) < ?6",
                    params![id, filter, since, now, owner, max_owned],
                )?;
                if created == 1 {
                    tx.execute("DELETE FROM consumer_expired WHERE consumer_id = ?1", [&id])?;
                }
                row = update(&tx)?;
            }
            let opened = match row {
                Some(row) => Opened::Ready(row),
                // Still none: it exists and belongs to someone else, or
                // its owner has no room for another.
                None if why_not(&tx, &id)? == Acked::Forbidden => Opened::Forbidden,
                None => Opened::TooMany,
            };
            tx.commit()?;
            Ok(opened)
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
            // The write lock is held: the cursor read here is the one the
            // update moves.
            let before: Option<i64> =
                tx.query_row("SELECT cursor FROM consumer_subscriptions WHERE consumer_id = ?1", params![id], |r| r.get(0)).optional()?;
            let row: Option<(i64, Option<String>)> = tx
                .query_row(
                    "UPDATE consumer_subscriptions
                     SET cursor = max(cursor, min(?2, (SELECT last_id FROM tidings_head))), last_activity_ms = ?3
                     WHERE consumer_id = ?1 AND (owner = ?4 OR ?5) RETURNING cursor, filter_json",
                    params![id, cursor, now_ms, owner, admin],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let acked = match (row, before) {
                (Some((cursor, filter_json)), Some(before)) => Acked::Moved(Moved { before, cursor, filter_json }),
                _ => why_not(&tx, &id)?,
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
                "SELECT consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner, epoch, epoch FROM consumer_subscriptions
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

    async fn device_cursor(&self, owner: &str, device_id: &str) -> Result<Option<EventId>, StoreError> {
        let (owner, device_id) = (owner.to_owned(), device_id.to_owned());
        self.read(move |conn| {
            conn.query_row(
                "SELECT cursor FROM tidings_device_cursors WHERE owner = ?1 AND device_id = ?2",
                params![owner, device_id],
                |r| r.get(0),
            )
            .optional()
        })
        .await
    }

    async fn device_read(&self, owner: &str, device_id: &str) -> Result<Option<DeviceRead>, StoreError> {
        let (owner, device_id) = (owner.to_owned(), device_id.to_owned());
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let before: Option<(EventId, i32)> = tx
                .query_row(
                    "SELECT cursor, epoch FROM tidings_device_cursors WHERE owner = ?1 AND device_id = ?2",
                    params![owner, device_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let epoch: i32 = tx.query_row("SELECT epoch FROM tidings_head WHERE singleton = 1", [], |r| r.get(0))?;
            if before.is_some() {
                tx.execute(
                    "UPDATE tidings_device_cursors SET epoch = ?3 WHERE owner = ?1 AND device_id = ?2",
                    params![owner, device_id, epoch],
                )?;
            }
            tx.commit()?;
            Ok(before.map(|(cursor, read_epoch)| DeviceRead { cursor, read_epoch, epoch }))
        })
        .await
    }

    async fn device_ack(&self, owner: &str, device_id: &str, seq: EventId, now_ms: i64) -> Result<EventId, StoreError> {
        let (owner, device_id) = (owner.to_owned(), device_id.to_owned());
        self.write(move |conn| {
            conn.query_row(
                "INSERT INTO tidings_device_cursors (owner, device_id, cursor, updated_ms, epoch)
                 VALUES (?1, ?2, max(0, min(?3, (SELECT last_id FROM tidings_head))), ?4, (SELECT epoch FROM tidings_head))
                 ON CONFLICT (owner, device_id) DO UPDATE SET
                     cursor = max(cursor, min(?3, (SELECT last_id FROM tidings_head))), updated_ms = ?4, epoch = excluded.epoch
                 RETURNING cursor",
                params![owner, device_id, seq, now_ms],
                |r| r.get(0),
            )
        })
        .await
    }

    async fn device_forget(&self, owner: &str, device_id: &str) -> Result<(), StoreError> {
        let (owner, device_id) = (owner.to_owned(), device_id.to_owned());
        self.write(move |conn| {
            conn.execute("DELETE FROM tidings_device_cursors WHERE owner = ?1 AND device_id = ?2", params![owner, device_id])
        })
        .await?;
        Ok(())
    }

    async fn device_cursors(&self, limit: usize) -> Result<Vec<DeviceCursor>, StoreError> {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT owner, device_id, cursor, updated_ms FROM tidings_device_cursors ORDER BY owner, device_id LIMIT ?1",
            )?;
            let rows = stmt.query_map(params![limit as i64], |r| {
                Ok(DeviceCursor { owner: r.get(0)?, device_id: r.get(1)?, cursor: r.get(2)?, updated_ms: r.get(3)? })
            })?;
            rows.collect()
        })
        .await
    }
}
