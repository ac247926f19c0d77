//! The SQL outbox on PostgreSQL: moving the rows `tidings.publish(...)`
//! committed into the log, the outbox's status, and the copy of the
//! registry the function checks names against.

use super::log::publish_in;
use super::*;
use crate::store::{Decide, OutboxDecision, OutboxMoved, OutboxRow, OutboxStatus};

/// Marks `rows` (seq, code, message) as set aside, in one statement.
async fn set_aside(tx: &deadpool_postgres::Transaction<'_>, rows: &[(i64, &'static str, String)]) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let seqs: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let codes: Vec<&str> = rows.iter().map(|r| r.1).collect();
    let messages: Vec<&str> = rows.iter().map(|r| r.2.as_str()).collect();
    tx.execute(
        "UPDATE tidings.outbox o SET error_code = t.code, error = t.message
         FROM unnest($1::bigint[], $2::text[], $3::text[]) AS t(seq, code, message) WHERE o.seq = t.seq",
        &[&seqs, &codes, &messages],
    )
    .await
    .map_err(pg_error)?;
    Ok(())
}

impl PostgresStore {
    pub(super) async fn move_outbox(&self, limit: usize, max_bytes: usize, decide: &Decide<'_>) -> Result<OutboxMoved, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let turn = tx.query_opt("SELECT 1 FROM tidings.mover FOR UPDATE SKIP LOCKED", &[]).await.map_err(pg_error)?;
        if turn.is_none() {
            return Ok(OutboxMoved { busy: true, ..OutboxMoved::default() });
        }
        // The size is tested in the same statement that reads the rows, so a
        // row no publish could carry is never loaded (one huge call cannot
        // make the mover hold a page of them), and only this page is looked at.
        let statement = tx
            .prepare_cached(
                "SELECT seq, CASE WHEN octet_length(event::text) <= $2::bigint THEN event::text END, idempotency_key, publisher,
                        (extract(epoch FROM created_at) * 1000)::bigint, left(traceparent, 64), left(tracestate, 1024)
                 FROM tidings.outbox WHERE error_code IS NULL ORDER BY seq LIMIT $1",
            )
            .await
            .map_err(pg_error)?;
        let rows = tx.query(&statement, &[&(limit as i64), &i64::try_from(max_bytes).unwrap_or(i64::MAX)]).await.map_err(pg_error)?;
        let mut moved = OutboxMoved { rows: rows.len(), ..OutboxMoved::default() };
        if rows.is_empty() {
            return Ok(moved);
        }
        // While the synchronous standby does not confirm, rows wait in the
        // outbox (TIDINGS_DELIVERY=replicated).
        self.admit()?;
        let now = chrono::Utc::now().timestamp_millis();
        let (mut publishes, mut published_seqs, mut aside) = (Vec::new(), Vec::new(), Vec::new());
        for r in rows {
            let Some(event) = r.get::<_, Option<String>>(1) else {
                aside.push((r.get::<_, i64>(0), "payload_too_large", "the event is over TIDINGS_MAX_PAYLOAD".to_owned()));
                continue;
            };
            let row = OutboxRow {
                seq: r.get(0),
                event,
                idempotency_key: r.get(2),
                publisher: r.get(3),
                created_ms: r.get(4),
                traceparent: r.get(5),
                tracestate: r.get(6),
            };
            match decide(&row) {
                OutboxDecision::Publish(publish) => {
                    publishes.push(publish);
                    published_seqs.push(row.seq);
                    moved.delays_ms.push(now.saturating_sub(row.created_ms));
                }
                OutboxDecision::SetAside { code, message } => aside.push((row.seq, code, message)),
            }
        }
        // Set aside in one statement, before the append takes the head row.
        set_aside(&tx, &aside).await?;
        moved.set_aside.extend(aside.drain(..).map(|(_, code, _)| code));
        let (answers, appended) = publish_in(&tx, publishes, self.seen()).await?;
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
        set_aside(&tx, &aside).await?;
        moved.set_aside.extend(aside.into_iter().map(|(_, code, _)| code));
        tx.commit().await.map_err(pg_error)?;
        drop(client);
        moved.appended = appended.len();
        if let Some((last, _)) = appended.last() {
            self.shown(*last).await?;
        }
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

    pub(super) async fn write_registry(&self, names: Vec<String>, strict: bool, max_payload: usize) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        // Processes starting together each replace the copy whole, one after
        // the other.
        tx.execute("LOCK TABLE tidings.registry IN EXCLUSIVE MODE", &[]).await.map_err(pg_error)?;
        tx.execute("DELETE FROM tidings.registry", &[]).await.map_err(pg_error)?;
        tx.execute("INSERT INTO tidings.registry (name) SELECT DISTINCT unnest($1::text[])", &[&names]).await.map_err(pg_error)?;
        let max_payload = i32::try_from(max_payload).unwrap_or(i32::MAX);
        tx.execute(
            "INSERT INTO tidings.registry_mode (strict, max_payload) VALUES ($1, $2) \
             ON CONFLICT (singleton) DO UPDATE SET strict = EXCLUDED.strict, max_payload = EXCLUDED.max_payload",
            &[&strict, &max_payload],
        )
        .await
        .map_err(pg_error)?;
        tx.commit().await.map_err(pg_error)
    }
}
