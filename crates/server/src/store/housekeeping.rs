//! The store's background work: retention (history, idempotency keys, the
//! outbox's set-aside rows) and the health probe behind
//! `tidings_database_up` and `tidings_listener_up`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{ListenerState, Store};

/// Prunes history by `retention` every `every` until `cancel` (the
/// background half of `TIDINGS_RETENTION`), and the idempotency keys older
/// than `idempotency_window`. Failures are logged and retried at the next
/// tick: retention is housekeeping, never a reason to stop.
pub async fn run_retention(store: Arc<dyn Store>, settings: crate::config::HistorySettings, cancel: CancellationToken) {
    let crate::config::HistorySettings {
        retention,
        idempotency_window,
        outbox_set_aside_retention: set_aside_retention,
        retention_interval: every,
    } = settings;
    // The first pass one interval after start, not at once: a server that
    // starts and stops at once has nothing to prune.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = chrono::Utc::now().timestamp_millis();
        let window = i64::try_from(idempotency_window.as_millis()).unwrap_or(i64::MAX);
        match store.prune_idempotency(now.saturating_sub(window)).await {
            Ok(0) => {}
            Ok(deleted) => tracing::debug!(deleted, "forgot expired idempotency keys"),
            Err(e) => tracing::warn!(error = %crate::report::chain(&e), "could not prune idempotency keys; retrying at the next interval"),
        }
        let kept = i64::try_from(set_aside_retention.as_millis()).unwrap_or(i64::MAX);
        match store.prune_set_aside(now.saturating_sub(kept)).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "forgot set-aside rows of the SQL outbox past TIDINGS_OUTBOX_SET_ASIDE_RETENTION"),
            Err(e) => {
                tracing::warn!(error = %crate::report::chain(&e), "could not prune the outbox's set-aside rows; retrying at the next interval")
            }
        }
        if !retention.is_on() {
            continue;
        }
        let before = retention.max_age.map(|age| now - age.as_millis().min(i64::MAX as u128) as i64);
        match store.prune(before, retention.max_events).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "retention pruned history"),
            Err(e) => tracing::warn!(error = %crate::report::chain(&e), "retention could not prune history; retrying at the next interval"),
        }
    }
}

/// Probes the store every `every` and publishes `tidings_database_up` and
/// `tidings_listener_up`, so alerts see an outage without a request failing.
pub async fn run_health_probe(store: Arc<dyn Store>, every: std::time::Duration, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let up = tokio::time::timeout(every, store.ping()).await.is_ok_and(|r| r.is_ok());
        let listening = store.listener().state == ListenerState::Listening;
        crate::metrics::store_health(up, listening);
    }
}
