//! The subscription engine's state in SQLite: its cursor and counts, the
//! tree changes it follows and its compare-and-set commits. One process owns
//! a data directory, so it always leads.

use super::tree::tree_write_in;
use super::*;

#[async_trait]
impl FederationStore for EmbeddedStore {
    async fn engine_state(&self) -> Result<(EventId, HashMap<String, Tally>), StoreError> {
        self.read(|conn| {
            let cursor: i64 = conn.query_row("SELECT cursor FROM tidings_engine WHERE name = 'subscriptions'", [], |r| r.get(0))?;
            let mut stmt = conn.prepare_cached("SELECT subscription_id, delivered, rate_window FROM tidings_subscription_counts")?;
            let counts = stmt
                .query_map([], |r| Ok((r.get(0)?, Tally::from_stored(r.get(1)?, &r.get::<_, String>(2)?))))?
                .collect::<rusqlite::Result<HashMap<_, _>>>()?;
            Ok((cursor, counts))
        })
        .await
    }

    async fn engine_changes(&self, after: EventId, types: &[&str], limit: usize) -> Result<(Vec<Record>, EventId), StoreError> {
        let types = serde_json::to_string(types).expect("strings serialise");
        self.read(move |conn| {
            snapshot(conn, |tx| {
                let head: i64 = tx.prepare_cached("SELECT last_id FROM tidings_head WHERE singleton = 1")?.query_row([], |r| r.get(0))?;
                let mut stmt = tx.prepare_cached(
                    "SELECT id, body, recorded_at FROM events
                 WHERE id > ?1 AND id <= ?2 AND event_type IN (SELECT value FROM json_each(?3)) ORDER BY id LIMIT ?4",
                )?;
                let records = stmt
                    .query_map(params![after, head, types, limit as i64], |r| {
                        Ok(Record { id: r.get(0)?, body: r.get(1)?, recorded_ms: r.get(2)? })
                    })?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let reached = if records.len() == limit { records.last().map_or(head, |r| r.id) } else { head };
                Ok((records, reached.max(after)))
            })
        })
        .await
    }

    async fn engine_commit(&self, commit: EngineCommit) -> Result<bool, StoreError> {
        let committed = self
            .write(move |conn| {
                let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let moved = tx.execute(
                    "UPDATE tidings_engine SET cursor = ?2 WHERE name = 'subscriptions' AND cursor = ?1",
                    params![commit.from, commit.to],
                )?;
                if moved != 1 {
                    return Ok(false);
                }
                for effect in commit.effects {
                    match effect {
                        EngineEffect::Append(record) => {
                            append_in(&tx, std::slice::from_ref(&record))?;
                        }
                        EngineEffect::Tree(write) => {
                            tree_write_in(&tx, write)?;
                        }
                    }
                }
                for (id, count) in commit.counts {
                    match count {
                        Some(tally) => tx.execute(
                            "INSERT INTO tidings_subscription_counts (subscription_id, delivered, rate_window) VALUES (?1, ?2, ?3)
                             ON CONFLICT (subscription_id) DO UPDATE SET delivered = excluded.delivered, rate_window = excluded.rate_window",
                            params![id, tally.delivered, tally.window_json()],
                        )?,
                        None => tx.execute("DELETE FROM tidings_subscription_counts WHERE subscription_id = ?1", [&id])?,
                    };
                }
                tx.commit()?;
                Ok(true)
            })
            .await?;
        self.wake();
        Ok(committed)
    }

    async fn engine_lead(&self) -> Result<bool, StoreError> {
        // The data directory's lock already makes this the only process.
        Ok(true)
    }

    async fn engine_resign(&self) {}

    async fn peer_mark(&self, owner: &str, name: &str) -> Result<Option<i64>, StoreError> {
        let (owner, name) = (owner.to_owned(), name.to_owned());
        self.read(move |conn| {
            conn.query_row("SELECT mark FROM tidings_peer_marks WHERE owner = ?1 AND name = ?2", params![owner, name], |r| r.get(0))
                .optional()
        })
        .await
    }

    async fn peer_mark_raise(&self, owner: &str, name: &str, at_least: i64, now_ms: i64) -> Result<i64, StoreError> {
        let (owner, name) = (owner.to_owned(), name.to_owned());
        self.write(move |conn| {
            conn.query_row(
                "INSERT INTO tidings_peer_marks (owner, name, mark, updated_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (owner, name) DO UPDATE SET mark = max(mark, ?3), updated_ms = ?4
                 RETURNING mark",
                params![owner, name, at_least, now_ms],
                |r| r.get(0),
            )
        })
        .await
    }

    async fn peer_mark_forget(&self, owner: &str, name: &str) -> Result<(), StoreError> {
        let (owner, name) = (owner.to_owned(), name.to_owned());
        self.write(move |conn| conn.execute("DELETE FROM tidings_peer_marks WHERE owner = ?1 AND name = ?2", params![owner, name])).await?;
        Ok(())
    }
}
