//! The entity tree and the content store in SQLite: compare-and-swap writes
//! (the writer connection serialises them) with their change event appended
//! in the same transaction.

use super::*;

/// A tree write inside `tx` (the writer connection serialises writers): the
/// change event appended, and the entity kept in the content store too.
pub(super) fn tree_write_in(tx: &rusqlite::Transaction<'_>, write: TreeWrite) -> rusqlite::Result<TreeOutcome> {
    let current: Option<String> = tx.query_row("SELECT hash FROM tree_entities WHERE path = ?1", [&write.path], |r| r.get(0)).optional()?;
    let kind = match write.decide(current.as_deref()) {
        Ok(kind) => kind,
        Err(outcome) => return Ok(outcome),
    };
    let record = NewRecord::event(&(write.event)(kind, current.as_deref()));
    if let Some(previous) = &current {
        // The change event names the replaced entity: keep it as long.
        tx.execute("UPDATE tidings_content SET stored_ms = ?2 WHERE hash = ?1", params![previous, chrono::Utc::now().timestamp_millis()])?;
    }
    let event_id = append_in(tx, std::slice::from_ref(&record))?[0];
    match (&write.entity, kind) {
        (Some((entity, hash)), _) => {
            tx.execute(
                "INSERT INTO tree_entities (path, entity, hash, changed_event) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (path) DO UPDATE SET entity = excluded.entity, hash = excluded.hash, changed_event = excluded.changed_event",
                params![write.path, entity, hash, event_id],
            )?;
            content_put_in(tx, hash, entity, chrono::Utc::now().timestamp_millis(), false)?;
        }
        (None, ChangeKind::Deleted) => {
            tx.execute("DELETE FROM tree_entities WHERE path = ?1", [&write.path])?;
        }
        (None, _) => {}
    }
    Ok(TreeOutcome::Done { kind, previous_hash: current, event_id })
}

#[async_trait]
impl TreeStore for EmbeddedStore {
    async fn tree_get(&self, path: &str) -> Result<Option<TreeEntry>, StoreError> {
        let path = path.to_owned();
        self.read(move |conn| {
            conn.query_row("SELECT entity, hash, changed_event FROM tree_entities WHERE path = ?1", [&path], |r| {
                Ok(TreeEntry { path: path.clone(), entity: r.get(0)?, hash: r.get(1)?, changed_event: r.get(2)? })
            })
            .optional()
        })
        .await
    }

    async fn tree_below(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        // Everything after "prefix/" and before "prefix0" ('0' follows '/').
        let (from, to) =
            if prefix.is_empty() { (String::new(), "\u{10FFFF}".to_owned()) } else { (format!("{prefix}/"), format!("{prefix}0")) };
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached("SELECT path FROM tree_entities WHERE path > ?1 AND path < ?2 ORDER BY path LIMIT ?3")?;
            let rows = stmt.query_map(params![from, to, limit as i64], |r| r.get(0))?;
            rows.collect()
        })
        .await
    }

    async fn tree_write(&self, write: TreeWrite) -> Result<TreeOutcome, StoreError> {
        let outcome = self
            .write(move |conn| {
                let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let outcome = tree_write_in(&tx, write)?;
                if matches!(outcome, TreeOutcome::Done { .. }) {
                    tx.commit()?;
                }
                Ok(outcome)
            })
            .await?;
        if matches!(outcome, TreeOutcome::Done { .. }) {
            self.wake();
        }
        Ok(outcome)
    }

    async fn tree_write_many(&self, writes: Vec<TreeWrite>) -> Result<Vec<TreeOutcome>, StoreError> {
        let outcomes = self
            .write(move |conn| {
                let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let outcomes = writes.into_iter().map(|write| tree_write_in(&tx, write)).collect::<rusqlite::Result<Vec<_>>>()?;
                if outcomes.iter().any(|o| matches!(o, TreeOutcome::Done { .. })) {
                    tx.commit()?;
                }
                Ok(outcomes)
            })
            .await?;
        if outcomes.iter().any(|o| matches!(o, TreeOutcome::Done { .. })) {
            self.wake();
        }
        Ok(outcomes)
    }

    async fn content_put(&self, entities: Vec<(String, String)>) -> Result<(), StoreError> {
        self.write(move |conn| {
            let tx = conn.transaction()?;
            let now = chrono::Utc::now().timestamp_millis();
            for (hash, body) in &entities {
                content_put_in(&tx, hash, body, now, true)?;
            }
            tx.commit()
        })
        .await
    }

    async fn content_get(&self, hash: &str) -> Result<Option<String>, StoreError> {
        let hash = hash.to_owned();
        self.read(move |conn| conn.query_row("SELECT body FROM tidings_content WHERE hash = ?1", [&hash], |r| r.get(0)).optional()).await
    }

    async fn tree_version_below(&self, prefix: &str) -> Result<(i64, i64), StoreError> {
        let (from, to) = (format!("{prefix}/"), format!("{prefix}0"));
        self.read(move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT count(*), coalesce(sum(changed_event), 0) FROM tree_entities WHERE path > ?1 AND path < ?2")?;
            stmt.query_row(params![from, to], |r| Ok((r.get(0)?, r.get(1)?)))
        })
        .await
    }

    async fn tree_entries_below(&self, prefix: &str, limit: usize) -> Result<Vec<TreeEntry>, StoreError> {
        let (from, to) = (format!("{prefix}/"), format!("{prefix}0"));
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT path, entity, hash, changed_event FROM tree_entities WHERE path > ?1 AND path < ?2 ORDER BY path LIMIT ?3",
            )?;
            let rows = stmt.query_map(params![from, to, limit as i64], |r| {
                Ok(TreeEntry { path: r.get(0)?, entity: r.get(1)?, hash: r.get(2)?, changed_event: r.get(3)? })
            })?;
            rows.collect()
        })
        .await
    }
}
