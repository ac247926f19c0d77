//! The entity tree and the content store on PostgreSQL: compare-and-swap
//! writes serialised per path by an advisory lock, with their change event
//! appended in the same transaction.

use super::*;

/// One writer per tree path at a time (held to the end of the transaction).
pub(super) const PATH_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 7324002))";

/// A tree write inside `tx`: one writer per path at a time (also when the
/// path does not exist yet), the change event appended, and the entity kept
/// in the content store too.
pub(super) async fn tree_write_in(tx: &tokio_postgres::Transaction<'_>, write: TreeWrite) -> Result<TreeOutcome, tokio_postgres::Error> {
    tx.execute(PATH_LOCK_SQL, &[&write.path]).await?;
    let current: Option<String> = tx.query_opt("SELECT hash FROM tree_entities WHERE path = $1", &[&write.path]).await?.map(|r| r.get(0));
    let kind = match write.decide(current.as_deref()) {
        Ok(kind) => kind,
        Err(outcome) => return Ok(outcome),
    };
    let record = NewRecord::event(&(write.event)(kind, current.as_deref()));
    if let Some(previous) = &current {
        // The change event names the replaced entity: keep it as long.
        tx.execute("UPDATE tidings_content SET stored_ms = (extract(epoch FROM now()) * 1000)::bigint WHERE hash = $1", &[previous])
            .await?;
    }
    let row = tx.query_one(APPEND_SQL, &[&vec![record.event_type], &vec![record.body]]).await?;
    let event_id: i64 = row.get::<_, i64>(0) + 1;
    match (&write.entity, kind) {
        (Some((entity, hash)), _) => {
            tx.execute(
                "INSERT INTO tree_entities (path, entity, hash, changed_event) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (path) DO UPDATE SET entity = EXCLUDED.entity, hash = EXCLUDED.hash, changed_event = EXCLUDED.changed_event",
                &[&write.path, entity, hash, &event_id],
            )
            .await?;
            tx.execute(
                "INSERT INTO tidings_content (hash, body, stored_ms, pinned)
                 VALUES ($1, $2, (extract(epoch FROM now()) * 1000)::bigint, false)
                 ON CONFLICT (hash) DO UPDATE SET stored_ms = EXCLUDED.stored_ms",
                &[hash, entity],
            )
            .await?;
        }
        (None, ChangeKind::Deleted) => {
            tx.execute("DELETE FROM tree_entities WHERE path = $1", &[&write.path]).await?;
        }
        (None, _) => {}
    }
    Ok(TreeOutcome::Done { kind, previous_hash: current, event_id })
}

#[async_trait]
impl TreeStore for PostgresStore {
    async fn tree_get(&self, path: &str) -> Result<Option<TreeEntry>, StoreError> {
        let client = self.client().await?;
        let row =
            client.query_opt("SELECT entity, hash, changed_event FROM tree_entities WHERE path = $1", &[&path]).await.map_err(pg_error)?;
        Ok(row.map(|r| TreeEntry { path: path.to_owned(), entity: r.get(0), hash: r.get(1), changed_event: r.get(2) }))
    }

    async fn tree_below(&self, prefix: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        // Everything after "prefix/" and before "prefix0" ('0' follows '/').
        let (from, to) =
            if prefix.is_empty() { (String::new(), "\u{10FFFF}".to_owned()) } else { (format!("{prefix}/"), format!("{prefix}0")) };
        let rows = client
            .query("SELECT path FROM tree_entities WHERE path > $1 AND path < $2 ORDER BY path LIMIT $3", &[&from, &to, &(limit as i64)])
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn tree_write(&self, write: TreeWrite) -> Result<TreeOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let outcome = tree_write_in(&tx, write).await.map_err(pg_error)?;
        if matches!(outcome, TreeOutcome::Done { .. }) {
            tx.commit().await.map_err(pg_error)?;
        }
        Ok(outcome)
    }

    async fn content_put(&self, entities: Vec<(String, String)>) -> Result<(), StoreError> {
        let client = self.client().await?;
        let (hashes, bodies): (Vec<String>, Vec<String>) = entities.into_iter().unzip();
        client
            .execute(
                "INSERT INTO tidings_content (hash, body, stored_ms, pinned)
                 SELECT h, b, (extract(epoch FROM now()) * 1000)::bigint, true FROM unnest($1::text[], $2::text[]) AS t(h, b)
                 ON CONFLICT (hash) DO UPDATE SET stored_ms = EXCLUDED.stored_ms, pinned = true",
                &[&hashes, &bodies],
            )
            .await
            .map_err(pg_error)?;
        Ok(())
    }

    async fn content_get(&self, hash: &str) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT body FROM tidings_content WHERE hash = $1", &[&hash]).await.map_err(pg_error)?;
        Ok(row.map(|r| r.get(0)))
    }

    async fn tree_entries_below(&self, prefix: &str, limit: usize) -> Result<Vec<TreeEntry>, StoreError> {
        let client = self.client().await?;
        let (from, to) = (format!("{prefix}/"), format!("{prefix}0"));
        let rows = client
            .query(
                "SELECT path, entity, hash, changed_event FROM tree_entities WHERE path > $1 AND path < $2 ORDER BY path LIMIT $3",
                &[&from, &to, &(limit as i64)],
            )
            .await
            .map_err(pg_error)?;
        Ok(rows.iter().map(|r| TreeEntry { path: r.get(0), entity: r.get(1), hash: r.get(2), changed_event: r.get(3) }).collect())
    }
}
