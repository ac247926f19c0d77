//! The pacing the engine's neighbours share: jittered retry delays, sleeps
//! that end early on shutdown, and the wall clock in Unix milliseconds. A
//! leaf: it names no sibling, so the courier and the mirrors use it without
//! naming each other.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// Sleeps `d`; `true` if `stop` came first.
pub(super) async fn sleep_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// `d` scaled by a random factor in [0.5, 1.5).
pub(super) fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.5 + rand::random::<f64>())
}

/// Now, Unix ms.
pub(super) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
