//! Epochs on PostgreSQL (see [`crate::store::epoch`]): the head row names
//! the timeline and cluster (system identifier) its ids are handed out on,
//! and every append checks the timeline under the head row's lock
//! and the head against the highest id the process saw committed
//! (`tidings_append_check`, migration 0015). When the database is another
//! one than the epoch's (a promoted standby, a point-in-time restore, a
//! restore into a new cluster), or its head is below an id this process saw
//! committed, [`settle`] begins a new epoch before anything is appended.
//!
//! [`settle`] runs when the store connects, after every (re)connect of the
//! LISTEN session (a failover ends it), and when an append is refused for
//! the timeline (`TD001`): all under the head row's lock, so processes that
//! find the change together begin one epoch between them.

use super::*;
use crate::store::epoch::{self, EpochCache};

/// The timeline WAL is written on now, and the cluster's system
/// identifier: what the head row must name.
const CLUSTER_SQL: &str = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint,
        (SELECT system_identifier::text FROM pg_control_system())";

/// The SQLSTATE of an append refused for the timeline.
pub(super) const OFF_TIMELINE: &str = "TD001";

/// What [`settle`] should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// Begin a new epoch if the database is not the epoch's, or its head is
    /// below `seen`.
    Check {
        /// The highest id the caller saw committed.
        seen: EventId,
    },
    /// Begin one whatever (the operator's command).
    Begin {
        /// The highest id the caller saw committed.
        seen: EventId,
    },
}

/// Checks the head row against the database it is on and begins a new
/// epoch when [`Settle`] says so, in one transaction on `client`; the epoch
/// begun, if any. The epochs read are kept in `cache`.
pub(super) async fn settle(client: &mut tokio_postgres::Client, cache: &EpochCache, how: Settle) -> Result<Option<Epoch>, StoreError> {
    // Rolled back if it is not committed, even when the caller's future is
    // dropped half-way: a pooled connection never goes back in the middle
    // of it, holding the head row.
    let tx = client.transaction().await.map_err(pg_error)?;
    match settle_in(&tx, how).await {
        Ok((begun, epochs)) => {
            tx.commit().await.map_err(pg_error)?;
            cache.set(epochs);
            if let Some(epoch) = &begun {
                tracing::warn!(
                    epoch = epoch.number,
                    fork = epoch.fork,
                    base = epoch.base,
                    reason = epoch.reason.as_str(),
                    "the event log begins a new epoch: ids after the fork that were handed out before are announced lost to whoever saw them"
                );
                crate::metrics::epoch_begun(epoch.reason.as_str());
            }
            Ok(begun)
        }
        Err(e) => Err(e),
    }
}

async fn settle_in(client: &tokio_postgres::Transaction<'_>, how: Settle) -> Result<(Option<Epoch>, Epochs), StoreError> {
    let head = client
        .query_one("SELECT last_id, timeline, system_id FROM tidings_head WHERE singleton FOR UPDATE", &[])
        .await
        .map_err(pg_error)?;
    let (last_id, timeline, system_id): (EventId, Option<i64>, Option<String>) = (head.get(0), head.get(1), head.get(2));
    let cluster = client.query_one(CLUSTER_SQL, &[]).await.map_err(pg_error)?;
    let (now_timeline, now_system): (i64, String) = (cluster.get(0), cluster.get(1));
    let epochs = read_epochs(client).await?;
    let (reason, seen) = match how {
        Settle::Begin { seen } => (Some(EpochReason::Operator), seen),
        Settle::Check { seen } => {
            let reason = match (timeline, &system_id) {
                // First start on this schema: the cluster found is the epoch's.
                (None, _) | (_, None) => None,
                (_, Some(system)) if *system != now_system => Some(EpochReason::System),
                (Some(t), _) if t != now_timeline => Some(EpochReason::Timeline),
                _ if seen > last_id => Some(EpochReason::HeadBehind),
                _ => None,
            };
            (reason, seen)
        }
    };
    let Some(reason) = reason else {
        if timeline != Some(now_timeline) || system_id.as_deref() != Some(now_system.as_str()) {
            client
                .execute("UPDATE tidings_head SET timeline = $1, system_id = $2 WHERE singleton", &[&now_timeline, &now_system])
                .await
                .map_err(pg_error)?;
        }
        return Ok((None, epochs));
    };
    let now = chrono::Utc::now().timestamp_millis();
    let begun = Epoch {
        number: epochs.current().number + 1,
        fork: epochs.fork_at(last_id),
        base: epoch::next_base(&epochs, last_id, seen, now),
        reason,
        started_ms: now,
    };
    client
        .execute(
            "INSERT INTO tidings_epochs (epoch, fork, base, reason, started_ms, timeline, system_id) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[&begun.number, &begun.fork, &begun.base, &reason.as_str(), &now, &now_timeline, &now_system],
        )
        .await
        .map_err(pg_error)?;
    client
        .execute(
            "UPDATE tidings_head SET last_id = $1, epoch = $2, timeline = $3, system_id = $4 WHERE singleton",
            &[&begun.base, &begun.number, &now_timeline, &now_system],
        )
        .await
        .map_err(pg_error)?;
    let mut list = epochs.all().to_vec();
    list.push(begun.clone());
    Ok((Some(begun), Epochs::new(list)))
}

/// Every epoch, as stored.
pub(super) async fn read_epochs(client: &impl tokio_postgres::GenericClient) -> Result<Epochs, StoreError> {
    let rows =
        client.query("SELECT epoch, fork, base, reason, started_ms FROM tidings_epochs ORDER BY epoch", &[]).await.map_err(pg_error)?;
    Ok(Epochs::new(
        rows.iter()
            .map(|r| Epoch { number: r.get(0), fork: r.get(1), base: r.get(2), reason: EpochReason::parse(r.get(3)), started_ms: r.get(4) })
            .collect(),
    ))
}
