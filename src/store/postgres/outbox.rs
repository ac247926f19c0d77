//! The SQL outbox on PostgreSQL: moving the rows `tidings.publish(...)`
//! committed into the log, the outbox's status, and the copy of the
//! registry the function checks names against.

use super::log::publish_in;
use super::*;
use crate::store::{Decide, OutboxDecision, OutboxMoved, OutboxRow, OutboxStatus};

/// The advisory lock one mover at a time holds for its transaction, so
/// rows are moved in the order they became visible, whichever process
/// moves them (the subscription engine's lock is another key).
const OUTBOX_LOCK: i64 = 0x7469_6469_6e67_736f;

impl PostgresStore {
    pub(super) async fn move_outbox(&self, limit: usize, max_bytes: usize, decide: &Decide<'_>) -> Result<OutboxMoved, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let locked: bool = tx.query_one("SELECT pg_try_advisory_xact_lock($1)", &[&OUTBOX_LOCK]).await.map_err(pg_error)?.get(0);
        if !locked {
            return Ok(OutboxMoved { busy: true, ..OutboxMoved::default() });
        }
        // A row no publish could carry is set aside unread, so one huge call
        // never makes the mover hold a page of them in memory.
        let oversized = tx
            .execute(
                "UPDATE tidings.outbox SET error_code = 'payload_too_large', error = 'the event is over TIDINGS_MAX_PAYLOAD'
                 WHERE error_code IS NULL AND octet_length(event::text) > $1::bigint",
                &[&i64::try_from(max_bytes).unwrap_or(i64::MAX)],
            )
            .await
            .map_err(pg_error)?;
        let mut set_aside_unread = vec!["payload_too_large"; usize::try_from(oversized).unwrap_or(0)];
        let statement = tx
            .prepare_cached(
                "SELECT seq, event::text, idempotency_key, publisher, (extract(epoch FROM created_at) * 1000)::bigint
                 FROM tidings.outbox WHERE error_code IS NULL ORDER BY seq LIMIT $1",
            )
            .await
            .map_err(pg_error)?;
        let rows = tx.query(&statement, &[&(limit as i64)]).await.map_err(pg_error)?;
        let rows: Vec<OutboxRow> = rows
            .into_iter()
            .map(|r| OutboxRow { seq: r.get(0), event: r.get(1), idempotency_key: r.get(2), publisher: r.get(3), created_ms: r.get(4) })
            .collect();
        let mut moved = OutboxMoved { rows: rows.len() + set_aside_unread.len(), ..OutboxMoved::default() };
        moved.set_aside.append(&mut set_aside_unread);
        if rows.is_empty() {
            tx.commit().await.map_err(pg_error)?;
            return Ok(moved);
        }
        let now = chrono::Utc::now().timestamp_millis();
        let (mut publishes, mut published_seqs, mut aside) = (Vec::new(), Vec::new(), Vec::new());
        for row in &rows {
            match decide(row) {
                OutboxDecision::Publish(publish) => {
                    publishes.push(publish);
                    published_seqs.push(row.seq);
                    moved.delays_ms.push(now.saturating_sub(row.created_ms));
                }
                OutboxDecision::SetAside { code, message } => aside.push((row.seq, code, message)),
            }
        }
        let (answers, appended) = publish_in(&tx, publishes).await?;
        let mut done = Vec::with_capacity(published_seqs.len());
        for (seq, answer) in published_seqs.into_iter().zip(answers) {
            match answer {
                Published::Stored(_) => done.push(seq),
                Published::Replayed(_) => {
                    moved.replayed += 1;
                    done.push(seq);
                }
                Published::KeyReused => aside.push((
                    seq,
                    "idempotency_key_reused",
                    "this idempotency key was used by the same role for another event".to_owned(),
                )),
            }
        }
        if !done.is_empty() {
            tx.execute("DELETE FROM tidings.outbox WHERE seq = ANY($1)", &[&done]).await.map_err(pg_error)?;
        }
        for (seq, code, message) in &aside {
            tx.execute("UPDATE tidings.outbox SET error_code = $2, error = $3 WHERE seq = $1", &[seq, code, message])
                .await
                .map_err(pg_error)?;
            moved.set_aside.push(code);
        }
        tx.commit().await.map_err(pg_error)?;
        drop(client);
        moved.appended = appended.len();
        self.hand_off_appended(appended);
        Ok(moved)
    }

    pub(super) async fn outbox_status_now(&self) -> Result<OutboxStatus, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE error_code IS NULL),
                        coalesce((extract(epoch FROM clock_timestamp() - min(created_at) FILTER (WHERE error_code IS NULL)) * 1000)::bigint, 0),
                        count(*) FILTER (WHERE error_code IS NOT NULL)
                 FROM tidings.outbox",
                &[],
            )
            .await
            .map_err(pg_error)?;
        Ok(OutboxStatus { depth: row.get(0), oldest_age_ms: row.get(1), set_aside: row.get(2) })
    }

    pub(super) async fn write_registry(&self, names: Vec<String>, strict: bool) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        tx.execute("DELETE FROM tidings.registry", &[]).await.map_err(pg_error)?;
        tx.execute("INSERT INTO tidings.registry (name) SELECT DISTINCT unnest($1::text[])", &[&names]).await.map_err(pg_error)?;
        tx.execute(
            "INSERT INTO tidings.registry_mode (strict) VALUES ($1) ON CONFLICT (singleton) DO UPDATE SET strict = EXCLUDED.strict",
            &[&strict],
        )
        .await
        .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)
    }
}
