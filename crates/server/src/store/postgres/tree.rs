//! The entity tree and the content store on PostgreSQL: compare-and-swap
//! writes serialised per path by an advisory lock, with their change event
//! appended in the same transaction.

use super::*;
use std::collections::HashMap;

/// One writer per tree path at a time (held to the end of the transaction).
pub(super) const PATH_LOCK_SQL: &str = "SELECT pg_advisory_xact_lock(hashtextextended($1, 7324002))";

/// A tree write inside `tx`: one writer per path at a time (also when the
/// path does not exist yet), the change event appended, and the entity kept
/// in the content store too.
pub(super) async fn tree_write_in(
    tx: &tokio_postgres::Transaction<'_>,
    write: TreeWrite,
    seen: EventId,
) -> Result<TreeOutcome, tokio_postgres::Error> {
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
    let row = tx.query_one(APPEND_SQL, &[&vec![record.event_type], &vec![record.body], &seen]).await?;
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

/// A path's state after a group: its entity (and hash), or none, and the
/// event of the write that left it so.
type FinalState<'a> = (Option<&'a (String, String)>, i64);

/// A group of tree writes inside `tx`, in a fixed number of round trips
/// whatever its size: every path's lock (in one order, before the head
/// row's, so two groups, or a group and a lone write, never wait on each
/// other in a cycle), the current hashes in one read, each write decided in
/// order against what the writes before it left (as if applied one after
/// the other), then one append of every change event, one upsert of every
/// path's final entity, one delete, and the content kept.
async fn tree_write_many_in(
    tx: &tokio_postgres::Transaction<'_>,
    writes: Vec<TreeWrite>,
    seen: EventId,
) -> Result<Vec<TreeOutcome>, tokio_postgres::Error> {
    let mut paths: Vec<&str> = writes.iter().map(|w| w.path.as_str()).collect();
    paths.sort_unstable();
    paths.dedup();
    // In the order given (the paths' order): `unnest` yields an array's
    // elements in order.
    tx.execute("SELECT pg_advisory_xact_lock(hashtextextended(p, 7324002)) FROM unnest($1::text[]) AS p", &[&paths]).await?;
    let rows = tx.query("SELECT path, hash FROM tree_entities WHERE path = ANY($1)", &[&paths]).await?;
    let mut current: HashMap<String, Option<String>> = rows.into_iter().map(|r| (r.get(0), Some(r.get(1)))).collect();
    // Decided in order; `applied` holds each accepted write's index into
    // the change events, in order.
    let (mut types, mut bodies, mut previous) = (Vec::new(), Vec::new(), Vec::new());
    let mut decided = Vec::with_capacity(writes.len());
    for write in &writes {
        let here = current.get(&write.path).cloned().flatten();
        match write.decide(here.as_deref()) {
            Ok(kind) => {
                let record = NewRecord::event(&(write.event)(kind, here.as_deref()));
                types.push(record.event_type);
                bodies.push(record.body);
                if let Some(h) = &here {
                    previous.push(h.clone());
                }
                current.insert(write.path.clone(), write.entity.as_ref().map(|(_, hash)| hash.clone()));
                decided.push(Ok((kind, here, types.len() as i64)));
            }
            Err(outcome) => decided.push(Err(outcome)),
        }
    }
    if types.is_empty() {
        // Every write was refused: nothing to store.
        return Ok(decided.into_iter().filter_map(Result::err).collect());
    }
    if !previous.is_empty() {
        // The change events name the replaced entities: keep them as long.
        tx.execute("UPDATE tidings_content SET stored_ms = (extract(epoch FROM now()) * 1000)::bigint WHERE hash = ANY($1)", &[&previous])
            .await?;
    }
    let base: i64 = tx.query_one(APPEND_SQL, &[&types, &bodies, &seen]).await?.get(0);
    // Each path's final state: the last accepted write to it.
    let mut last: HashMap<&str, FinalState<'_>> = HashMap::new();
    for (write, d) in writes.iter().zip(&decided) {
        if let Ok((_, _, n)) = d {
            last.insert(write.path.as_str(), (write.entity.as_ref(), base + n));
        }
    }
    let (mut up_paths, mut up_entities, mut up_hashes, mut up_events, mut gone) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (path, (entity, event_id)) in &last {
        match entity {
            Some((entity, hash)) => {
                up_paths.push(*path);
                up_entities.push(entity.as_str());
                up_hashes.push(hash.as_str());
                up_events.push(*event_id);
            }
            None => gone.push(*path),
        }
    }
    if !up_paths.is_empty() {
        tx.execute(
            "INSERT INTO tree_entities (path, entity, hash, changed_event)
             SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])
             ON CONFLICT (path) DO UPDATE SET entity = EXCLUDED.entity, hash = EXCLUDED.hash, changed_event = EXCLUDED.changed_event",
            &[&up_paths, &up_entities, &up_hashes, &up_events],
        )
        .await?;
    }
    if !gone.is_empty() {
        tx.execute("DELETE FROM tree_entities WHERE path = ANY($1)", &[&gone]).await?;
    }
    // Every entity written, also one replaced later in the group (its
    // change event names it).
    let mut content: HashMap<&str, &str> = HashMap::new();
    for (write, d) in writes.iter().zip(&decided) {
        if let (Ok(_), Some((entity, hash))) = (d, &write.entity) {
            content.insert(hash.as_str(), entity.as_str());
        }
    }
    if !content.is_empty() {
        let (hashes, entities): (Vec<&str>, Vec<&str>) = content.into_iter().unzip();
        tx.execute(
            "INSERT INTO tidings_content (hash, body, stored_ms, pinned)
             SELECT h, b, (extract(epoch FROM now()) * 1000)::bigint, false FROM unnest($1::text[], $2::text[]) AS t(h, b)
             ON CONFLICT (hash) DO UPDATE SET stored_ms = EXCLUDED.stored_ms",
            &[&hashes, &entities],
        )
        .await?;
    }
    Ok(decided
        .into_iter()
        .map(|d| match d {
            Ok((kind, previous_hash, n)) => TreeOutcome::Done { kind, previous_hash, event_id: base + n },
            Err(outcome) => outcome,
        })
        .collect())
}

#[async_trait]
impl TreeStore for PostgresStore {
    async fn tree_get(&self, path: &str) -> Result<Option<TreeEntry>, StoreError> {
        let client = self.client().await?;
        let row =
            client.query_opt("SELECT entity, hash, changed_event FROM tree_entities WHERE path = $1", &[&path]).await.map_err(pg_error)?;
        drop(client);
        let entry = row.map(|r| TreeEntry { path: path.to_owned(), entity: r.get(0), hash: r.get(1), changed_event: r.get(2) });
        if let Some(entry) = &entry {
            self.shown(entry.changed_event).await?;
        }
        Ok(entry)
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
        self.admit()?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let outcome = tree_write_in(&tx, write, self.seen()).await.map_err(pg_error)?;
        if let TreeOutcome::Done { event_id, .. } = outcome {
            tx.commit().await.map_err(pg_error)?;
            drop(client);
            self.shown(event_id).await?;
        }
        Ok(outcome)
    }

    async fn tree_write_many(&self, writes: Vec<TreeWrite>) -> Result<Vec<TreeOutcome>, StoreError> {
        self.admit()?;
        let (outcomes, newest) = {
            let mut client = self.client().await?;
            let tx = client.transaction().await.map_err(pg_error)?;
            let outcomes = tree_write_many_in(&tx, writes, self.seen()).await.map_err(pg_error)?;
            let newest =
                outcomes.iter().filter_map(|o| if let TreeOutcome::Done { event_id, .. } = o { Some(*event_id) } else { None }).max();
            if newest.is_some() {
                tx.commit().await.map_err(pg_error)?;
            }
            (outcomes, newest)
        };
        if let Some(id) = newest {
            self.shown(id).await?;
        }
        Ok(outcomes)
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

    async fn tree_version_below(&self, prefix: &str) -> Result<(i64, i64), StoreError> {
        let client = self.client().await?;
        let (from, to) = (format!("{prefix}/"), format!("{prefix}0"));
        let row = client
            .query_one(
                "SELECT count(*), coalesce(sum(changed_event), 0)::bigint FROM tree_entities WHERE path > $1 AND path < $2",
                &[&from, &to],
            )
            .await
            .map_err(pg_error)?;
        Ok((row.get(0), row.get(1)))
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
        drop(client);
        let entries: Vec<TreeEntry> =
            rows.iter().map(|r| TreeEntry { path: r.get(0), entity: r.get(1), hash: r.get(2), changed_event: r.get(3) }).collect();
        if let Some(newest) = entries.iter().map(|e| e.changed_event).max() {
            self.shown(newest).await?;
        }
        Ok(entries)
    }
}
