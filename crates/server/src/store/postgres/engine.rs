//! The subscription engine's state on PostgreSQL: its cursor and counts,
//! the tree changes it follows, its compare-and-set commits, and the
//! advisory lock that makes one process on a database its leader.

use super::tree::{PATH_LOCK_SQL, tree_write_in};
use super::*;

#[async_trait]
impl FederationStore for PostgresStore {
    async fn engine_state(&self) -> Result<(EventId, HashMap<String, Tally>), StoreError> {
        let client = self.client().await?;
        let cursor: i64 =
            client.query_one("SELECT cursor FROM tidings_engine WHERE name = 'subscriptions'", &[]).await.map_err(pg_error)?.get(0);
        let rows =
            client.query("SELECT subscription_id, delivered, rate_window FROM tidings_subscription_counts", &[]).await.map_err(pg_error)?;
        Ok((cursor, rows.iter().map(|r| (r.get(0), Tally::from_stored(r.get(1), r.get(2)))).collect()))
    }

    async fn engine_changes(&self, after: EventId, types: &[&str], limit: usize) -> Result<(Vec<Record>, EventId), StoreError> {
        let client = self.client().await?;
        let head: i64 = client.query_one("SELECT last_id FROM tidings_head", &[]).await.map_err(pg_error)?.get(0);
        let statement = client
            .prepare_cached(
                "SELECT id, body, (extract(epoch FROM recorded_at) * 1000)::bigint FROM events
                 WHERE id > $1 AND id <= $2 AND event_type = ANY($3) ORDER BY id LIMIT $4",
            )
            .await
            .map_err(pg_error)?;
        let rows = client.query(&statement, &[&after, &head, &types, &(limit as i64)]).await.map_err(pg_error)?;
        drop(client);
        let mut records: Vec<Record> = rows.into_iter().map(|r| Record { id: r.get(0), body: r.get(1), recorded_ms: r.get(2) }).collect();
        let mut reached = if records.len() == limit { records.last().map_or(head, |r| r.id) } else { head };
        // Path subscriptions are notified of nothing the synchronous
        // standby lacks (`TIDINGS_DELIVERY=replicated`): while it does not
        // confirm, the engine goes as far as it is known to have.
        if let Some(gate) = &self.sync
            && reached > after
            && gate.replicated(reached).await.is_err()
        {
            let through = gate.through();
            records.retain(|r| r.id <= through);
            reached = reached.min(through);
        }
        Ok((records, reached.max(after)))
    }

    async fn engine_commit(&self, commit: EngineCommit) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let moved = tx
            .execute("UPDATE tidings_engine SET cursor = $2 WHERE name = 'subscriptions' AND cursor = $1", &[&commit.from, &commit.to])
            .await
            .map_err(pg_error)?;
        if moved != 1 {
            return Ok(false);
        }
        // Path locks first, in order, as every tree write takes them before
        // the head's row lock: an append here before them could deadlock
        // with a concurrent write to one of these paths.
        let mut paths: Vec<&str> =
            commit.effects.iter().filter_map(|e| if let EngineEffect::Tree(w) = e { Some(w.path.as_str()) } else { None }).collect();
        paths.sort_unstable();
        paths.dedup();
        for path in paths {
            tx.execute(PATH_LOCK_SQL, &[&path]).await.map_err(pg_error)?;
        }
        for effect in commit.effects {
            match effect {
                EngineEffect::Append(record) => {
                    tx.query_one(APPEND_SQL, &[&vec![record.event_type], &vec![record.body], &self.seen()]).await.map_err(pg_error)?;
                }
                EngineEffect::Tree(write) => {
                    tree_write_in(&tx, write, self.seen()).await.map_err(pg_error)?;
                }
            }
        }
        for (id, count) in commit.counts {
            match count {
                Some(tally) => {
                    tx.execute(
                        "INSERT INTO tidings_subscription_counts (subscription_id, delivered, rate_window) VALUES ($1, $2, $3)
                         ON CONFLICT (subscription_id) DO UPDATE SET delivered = EXCLUDED.delivered, rate_window = EXCLUDED.rate_window",
                        &[&id, &tally.delivered, &tally.window_json()],
                    )
                    .await
                }
                None => tx.execute("DELETE FROM tidings_subscription_counts WHERE subscription_id = $1", &[&id]).await,
            }
            .map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)?;
        Ok(true)
    }

    async fn engine_lead(&self) -> Result<bool, StoreError> {
        let mut held = self.leader.lock().await;
        if let Some(client) = held.as_ref() {
            if client.simple_query("SELECT 1").await.is_ok() {
                return Ok(true);
            }
            // The session (and with it the lock) is gone; close it for good.
            if let Some(client) = held.take() {
                drop(deadpool_postgres::Object::take(client));
            }
        }
        let client = self.client().await?;
        let locked: bool = client.query_one("SELECT pg_try_advisory_lock(7324003)", &[]).await.map_err(pg_error)?.get(0);
        if locked {
            *held = Some(client);
        }
        Ok(locked)
    }

    async fn engine_resign(&self) {
        if let Some(client) = self.leader.lock().await.take() {
            // Closing the session releases its advisory lock.
            drop(deadpool_postgres::Object::take(client));
        }
    }

    async fn peer_mark(&self, owner: &str, name: &str) -> Result<Option<i64>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT mark FROM tidings_peer_marks WHERE owner = $1 AND name = $2", &[&owner, &name])
            .await
            .map_err(pg_error)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn peer_mark_raise(&self, owner: &str, name: &str, at_least: i64, now_ms: i64) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "INSERT INTO tidings_peer_marks (owner, name, mark, updated_ms) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (owner, name) DO UPDATE SET mark = GREATEST(tidings_peer_marks.mark, $3), updated_ms = $4
                 RETURNING mark",
                &[&owner, &name, &at_least, &now_ms],
            )
            .await
            .map_err(pg_error)?;
        Ok(row.get(0))
    }

    async fn peer_mark_forget(&self, owner: &str, name: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client.execute("DELETE FROM tidings_peer_marks WHERE owner = $1 AND name = $2", &[&owner, &name]).await.map_err(pg_error)?;
        Ok(())
    }
}
