//! How far delivery is behind commits (docs/metrics.md, "Freshness"): the
//! oldest committed event this process's broker has not fanned out, how
//! long the LISTEN session has heard nothing, and how old the SQL
//! outbox's oldest row is. `/health/deep` shows them, and a task keeps the
//! gauges the shipped alerts watch: a broker, a LISTEN session or an
//! outbox mover that stops while commits go on is seen within seconds,
//! not found days later.

use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::Services;
use crate::store::{Store, StoreError};
use tidings_protocol::event::EventId;

/// How often the gauges are measured.
pub const EVERY: Duration = Duration::from_secs(5);

/// Delivery's distance behind commits, now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Freshness {
    /// Committed events the broker has not fanned out yet.
    pub broker_behind_events: u64,
    /// The age of the oldest of them, in ms (0 when there is none).
    pub broker_behind_ms: u64,
    /// Since the LISTEN session last heard a notification or connected, in
    /// ms (`None` on the embedded store, which has no LISTEN session).
    pub listener_silence_ms: Option<u64>,
    /// The age of the oldest row waiting in the SQL outbox, in ms (`None`
    /// on the embedded store, which has no outbox).
    pub outbox_oldest_ms: Option<u64>,
}

/// Measures delivery's distance behind commits.
pub async fn measure(core: &Services) -> Result<Freshness, StoreError> {
    measure_at(core.store().as_ref(), core.broker().position()).await
}

/// Delivery's distance behind the commits of `store` for a broker that has
/// fanned out every event up to `position` (a broker that stopped there
/// while commits went on shows by this).
pub async fn measure_at(store: &dyn Store, position: EventId) -> Result<Freshness, StoreError> {
    let bounds = store.bounds().await?;
    let (behind, behind_ms) = if bounds.head > position {
        let epochs = store.epochs(bounds.epoch).await?;
        let behind = epochs.count_between(position, bounds.head);
        // The first event after the broker's position: the oldest it has
        // not fanned out (gone already if history was pruned past it).
        let oldest = store.read_history(position, 1).await?.into_iter().next();
        let age = oldest.map_or(0, |r| u64::try_from(chrono::Utc::now().timestamp_millis() - r.recorded_ms).unwrap_or(0));
        (behind, if behind > 0 { age } else { 0 })
    } else {
        (0, 0)
    };
    let silence = store.listener().silence_ms;
    let outbox = store.outbox_status().await?;
    Ok(Freshness {
        broker_behind_events: behind,
        broker_behind_ms: behind_ms,
        listener_silence_ms: silence,
        outbox_oldest_ms: outbox.map(|o| u64::try_from(o.oldest_age_ms).unwrap_or(0)),
    })
}

/// Keeps the freshness gauges every [`EVERY`] until `cancel`. A store that
/// does not answer leaves them as they were (`tidings_database_up` says so).
pub async fn run(core: Services, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Ok(Ok(f)) = tokio::time::timeout(EVERY, measure(&core)).await {
            let seconds = |ms: u64| ms as f64 / 1000.0;
            crate::metrics::freshness(
                seconds(f.broker_behind_ms),
                seconds(f.listener_silence_ms.unwrap_or(0)),
                seconds(f.outbox_oldest_ms.unwrap_or(0)),
            );
        }
    }
}
