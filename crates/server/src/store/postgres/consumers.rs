//! Durable consumers on PostgreSQL: open, ack (monotonic, clamped to the
//! head), list, delete and expiry, each one statement or one transaction.

use super::*;

const COLLECT_SQL: &str = "
WITH gone AS (
    DELETE FROM consumer_subscriptions WHERE consumer_id = $1 AND last_activity_ms < $2 RETURNING consumer_id
)
INSERT INTO consumer_expired (consumer_id, expired_ms) SELECT consumer_id, $3 FROM gone
ON CONFLICT (consumer_id) DO UPDATE SET expired_ms = EXCLUDED.expired_ms";

/// Opens a consumer: its filter, cursor and activity, and the log's epoch
/// now, answering the epoch of its read before (the statement's snapshot
/// is taken before the update).
const CONSUMER_UPDATE_SQL: &str = "
WITH before AS (SELECT epoch FROM consumer_subscriptions WHERE consumer_id = $1)
UPDATE consumer_subscriptions SET
    filter_json = CASE WHEN $2 THEN $3 ELSE filter_json END,
    cursor = GREATEST(cursor, LEAST(COALESCE($4, cursor), (SELECT last_id FROM tidings_head))),
    last_activity_ms = $5,
    epoch = (SELECT epoch FROM tidings_head)
WHERE consumer_id = $1 AND (owner = $6 OR $7)
RETURNING consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner, (SELECT epoch FROM before), epoch";

fn consumer_row(r: &tokio_postgres::Row) -> Consumer {
    Consumer {
        id: r.get(0),
        filter_json: r.get(1),
        cursor: r.get(2),
        created_ms: r.get(3),
        last_activity_ms: r.get(4),
        owner: r.get(5),
        read_epoch: r.get(6),
        epoch: r.get(7),
    }
}

impl PostgresStore {
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
}

#[async_trait]
impl ConsumerStore for PostgresStore {
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
            // Created only while its owner has fewer than max_owned (the
            // owner's rows are locked first, so two creates of one owner
            // cannot both pass the count).
            let max_owned = i64::from(open.max_owned);
            tx.execute("SELECT 1 FROM consumer_subscriptions WHERE owner = $1 FOR UPDATE", &[&owner]).await.map_err(pg_error)?;
            let created = tx
                .execute(
                    "INSERT INTO consumer_subscriptions (consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner, epoch)
                     SELECT $1, $2, LEAST(COALESCE($3, last_id), last_id), $4, $4, $5, epoch FROM tidings_head
                     WHERE (SELECT count(*) FROM consumer_subscriptions WHERE owner = $5) < $6
                     ON CONFLICT (consumer_id) DO NOTHING",
                    &[&open.id, &filter, &open.since, &open.now_ms, &owner, &max_owned],
                )
                .await
                .map_err(pg_error)?;
            if created == 1 {
                tx.execute("DELETE FROM consumer_expired WHERE consumer_id = $1", &[&open.id]).await.map_err(pg_error)?;
            }
            row = tx.query_opt(CONSUMER_UPDATE_SQL, &params).await.map_err(pg_error)?;
        }
        let exists = match &row {
            Some(_) => true,
            None => {
                tx.query_opt("SELECT 1 FROM consumer_subscriptions WHERE consumer_id = $1", &[&open.id]).await.map_err(pg_error)?.is_some()
            }
        };
        tx.commit().await.map_err(pg_error)?;
        // Still none: it exists and belongs to someone else, or its owner
        // has no room for another.
        drop(client);
        Ok(match row {
            Some(row) => {
                let consumer = consumer_row(&row);
                // A new consumer starts at the head: one the synchronous
                // standby has (TIDINGS_DELIVERY=replicated).
                self.shown(consumer.cursor).await?;
                Opened::Ready(consumer)
            }
            None if exists => Opened::Forbidden,
            None => Opened::TooMany,
        })
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
        // The row is locked before it is moved, so `before` is the cursor
        // this update moved from, whatever acks run beside it.
        let row = client
            .query_opt(
                "UPDATE consumer_subscriptions c
                 SET cursor = GREATEST(c.cursor, LEAST($2, (SELECT last_id FROM tidings_head))), last_activity_ms = $3
                 FROM (SELECT consumer_id, cursor FROM consumer_subscriptions WHERE consumer_id = $1 FOR UPDATE) old
                 WHERE c.consumer_id = old.consumer_id AND (c.owner = $4 OR $5)
                 RETURNING c.cursor, old.cursor, c.filter_json",
                &[&id, &cursor, &now_ms, &actor.sub, &actor.admin],
            )
            .await
            .map_err(pg_error)?;
        match row {
            Some(row) => Ok(Acked::Moved(Moved { cursor: row.get(0), before: row.get(1), filter_json: row.get(2) })),
            None => self.why_not(&client, id).await,
        }
    }

    async fn consumer_list(&self, actor: Actor<'_>) -> Result<Vec<Consumer>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT consumer_id, filter_json, cursor, created_ms, last_activity_ms, owner, epoch, epoch FROM consumer_subscriptions
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

    async fn device_cursor(&self, owner: &str, device_id: &str) -> Result<Option<EventId>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT cursor FROM tidings_device_cursors WHERE owner = $1 AND device_id = $2", &[&owner, &device_id])
            .await
            .map_err(pg_error)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn device_read(&self, owner: &str, device_id: &str) -> Result<Option<DeviceRead>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "WITH before AS (SELECT epoch FROM tidings_device_cursors WHERE owner = $1 AND device_id = $2)
                 UPDATE tidings_device_cursors SET epoch = (SELECT epoch FROM tidings_head)
                 WHERE owner = $1 AND device_id = $2 RETURNING cursor, (SELECT epoch FROM before), epoch",
                &[&owner, &device_id],
            )
            .await
            .map_err(pg_error)?;
        Ok(row.map(|r| DeviceRead { cursor: r.get(0), read_epoch: r.get(1), epoch: r.get(2) }))
    }

    async fn device_ack(&self, owner: &str, device_id: &str, seq: EventId, now_ms: i64) -> Result<EventId, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "INSERT INTO tidings_device_cursors (owner, device_id, cursor, updated_ms, epoch)
                 VALUES ($1, $2, GREATEST(0, LEAST($3, (SELECT last_id FROM tidings_head))), $4, (SELECT epoch FROM tidings_head))
                 ON CONFLICT (owner, device_id) DO UPDATE SET
                     cursor = GREATEST(tidings_device_cursors.cursor, LEAST($3, (SELECT last_id FROM tidings_head))),
                     updated_ms = $4, epoch = EXCLUDED.epoch
                 RETURNING cursor",
                &[&owner, &device_id, &seq, &now_ms],
            )
            .await
            .map_err(pg_error)?;
        Ok(row.get(0))
    }

    async fn device_forget(&self, owner: &str, device_id: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute("DELETE FROM tidings_device_cursors WHERE owner = $1 AND device_id = $2", &[&owner, &device_id])
            .await
            .map_err(pg_error)?;
        Ok(())
    }

    async fn device_cursors(&self, limit: usize) -> Result<Vec<DeviceCursor>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT owner, device_id, cursor, updated_ms FROM tidings_device_cursors ORDER BY owner, device_id LIMIT $1",
                &[&(limit as i64)],
            )
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(|r| DeviceCursor { owner: r.get(0), device_id: r.get(1), cursor: r.get(2), updated_ms: r.get(3) }).collect())
    }
}
