//! What a stream's writes count: every delivered event, on its transport
//! (`tidings_events_delivered_total`), replayed ones as replayed, and a
//! sample of live writes' publish-to-send latency
//! (`tidings_delivery_latency_seconds`), with the series looked up once.
//! docs/metrics.md describes the series.

use crate::broker::Frame;
use crate::metrics as m;

/// The series every write of a stream updates, looked up once. A
/// `counter!` or `histogram!` call hashes its name and labels and searches
/// the registry each time: with the handles' drops, 2.5% of the server's
/// CPU in a 1,000-stream fan-out (`perf`, `cpu-clock`); a handle is an
/// atomic add. Taken at the first write, after the recorder is installed.
static DELIVERY_SERIES: std::sync::LazyLock<m::Delivery> = std::sync::LazyLock::new(m::delivery);

/// Counts `frames` as delivered on `transport` once written: replayed ones
/// as replayed, live ones with their publish-to-send latency, sampled once
/// per [`LATENCY_SAMPLE`] writes on each worker thread (a clock read and a
/// histogram sample per client per fan-out were 2.5% of the server's CPU
/// at 1,000 × 100, `scripts/profile`; one in 16 writes still gives
/// thousands of samples a second under load, spread over every client).
pub fn record_delivery(transport: &'static str, frames: &[Frame], replayed: bool) {
    let Some(first) = frames.first() else { return };
    let series = &*DELIVERY_SERIES;
    let n = frames.len() as u64;
    match transport {
        "sse" => series.sse.increment(n),
        "ws" => series.ws.increment(n),
        other => m::delivered(other, n),
    }
    if replayed {
        series.replayed.increment(n);
    } else if latency_sampled() {
        let latency = (chrono::Utc::now().timestamp_millis() - first.recorded_ms).max(0) as f64 / 1000.0;
        series.latency.record(latency);
    }
}

/// One live write in this many, on each worker thread, records its latency.
pub const LATENCY_SAMPLE: u32 = 16;

/// Whether this live write records its latency: the first on each thread,
/// then every [`LATENCY_SAMPLE`]th.
fn latency_sampled() -> bool {
    thread_local!(static WRITES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
    WRITES.with(|writes| {
        let n = writes.get();
        writes.set(n.wrapping_add(1));
        n % LATENCY_SAMPLE == 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_write_in_sixteen_records_its_latency() {
        // On a thread of its own, so no other test's writes count.
        let sampled = std::thread::spawn(|| (0..64).filter(|_| latency_sampled()).count()).join().unwrap();
        assert_eq!(sampled, 4);
    }
}
