//! `tidings bench --mode poll`: long-pollers and a durable consumer far
//! behind, against publishes at a fixed rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::*;

/// Result of `poll`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PollReport {
    /// Long-pollers.
    pub pollers: usize,
    /// Publishes answered 201.
    pub publishes_accepted: u64,
    /// Events received by all pollers together.
    pub delivered: u64,
    /// accepted x pollers.
    pub expected: u64,
    /// Publish-to-answer latency, ms.
    pub latency_p50_ms: f64,
    /// 99th percentile, ms.
    pub latency_p99_ms: f64,
    /// Poll requests made.
    pub polls: u64,
    /// Round trip of one poll request (including its wait), ms.
    pub round_trip_p50_ms: f64,
    /// 99th percentile, ms.
    pub round_trip_p99_ms: f64,
    /// Events a consumer far behind read back.
    pub catch_up_events: u64,
    /// Its read rate, events/s.
    pub catch_up_events_per_second: f64,
}

/// `poll`: see [`Mode::Poll`].
pub async fn poll_bench(args: &BenchArgs) -> anyhow::Result<PollReport> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(args.clients + 16).build()?;
    let start_head = head(&http, &args.url).await?;
    let done = tokio_util::sync::CancellationToken::new();
    let latencies = Arc::new(Mutex::new(Vec::<u64>::new()));
    let trips = Arc::new(Mutex::new(Vec::<u64>::new()));
    let received = Arc::new(AtomicU64::new(0));
    let pollers: Vec<_> = (0..args.clients)
        .map(|i| {
            let (http, done, latencies, trips, received) = (http.clone(), done.clone(), latencies.clone(), trips.clone(), received.clone());
            let base = format!("{}/v1/poll?consumer_id=bench-poller-{i}&types={}&wait_ms=5000&limit=1000", args.url, args.event_type);
            tokio::spawn(async move {
                let (mut since, mut lat, mut rtt) = (start_head, Vec::new(), Vec::new());
                while !done.is_cancelled() {
                    let sent = Instant::now();
                    let answer = tokio::select! {
                        _ = done.cancelled() => break,
                        r = http.get(format!("{base}&since={since}")).send() => r,
                    };
                    let Ok(answer) = answer else { break };
                    let Ok(page) = answer.json::<Value>().await else { break };
                    rtt.push(sent.elapsed().as_micros() as u64);
                    let now = now_us();
                    for e in page["events"].as_array().into_iter().flatten() {
                        if let Some(t) = e["payload"]["sent_us"].as_u64() {
                            lat.push(now.saturating_sub(t));
                            received.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    since = page["next_since"].as_i64().unwrap_or(since);
                }
                latencies.lock().await.append(&mut lat);
                trips.lock().await.append(&mut rtt);
            })
        })
        .collect();
    // Let every poller register before publishing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let accepted = Arc::new(AtomicU64::new(0));
    let total = (args.rate * args.duration.as_secs_f64()).round() as u64;
    let interval = Duration::from_secs_f64(1.0 / args.rate);
    let start = tokio::time::Instant::now();
    let mut publishes = Vec::new();
    for n in 0..total {
        tokio::time::sleep_until(start + interval.mul_f64(n as f64)).await;
        let (http, url, accepted) = (http.clone(), format!("{}/v1/events", args.url), accepted.clone());
        let body = json!({"event_type": args.event_type, "payload": {"sent_us": now_us(), "weight": 1}});
        publishes.push(tokio::spawn(async move {
            if http.post(url).json(&body).send().await.is_ok_and(|r| r.status() == 201) {
                accepted.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for p in publishes {
        let _ = p.await;
    }
    let accepted = accepted.load(Ordering::Relaxed);
    let expected = accepted * args.clients as u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && received.load(Ordering::Relaxed) < expected {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    done.cancel();
    for p in pollers {
        let _ = p.await;
    }
    let mut lat = std::mem::take(&mut *latencies.lock().await);
    let mut rtt = std::mem::take(&mut *trips.lock().await);
    lat.sort_unstable();
    rtt.sort_unstable();

    // A consumer far behind: preload, then read back in pages of 1,000.
    let behind = head(&http, &args.url).await?;
    let one = json!({"event_type": args.event_type, "payload": {"weight": 1}});
    let mut left = args.events;
    while left > 0 {
        let n = left.min(1000);
        let r = http.post(format!("{}/v1/events", args.url)).json(&json!({"events": vec![one.clone(); n as usize]})).send().await?;
        anyhow::ensure!(r.status() == 201, "preloading failed: {}", r.status());
        left -= n;
    }
    let started = Instant::now();
    let (mut since, mut got) = (behind, 0u64);
    while got < args.events {
        let page: Value = http
            .get(format!("{}/v1/poll?consumer_id=bench-behind&types={}&limit=1000&since={since}", args.url, args.event_type))
            .send()
            .await?
            .json()
            .await?;
        let n = page["events"].as_array().map_or(0, Vec::len) as u64;
        let next = page["next_since"].as_i64().unwrap_or(since);
        // A page may hold no event and still move on: its scan budget
        // (TIDINGS_POLL_MAX_SCAN) ran out over other types' events, which a
        // log grown by earlier benches is full of.
        anyhow::ensure!(n > 0 || (page["has_more"] == true && next > since), "the catch-up stalled at {since}");
        got += n;
        since = next;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(PollReport {
        pollers: args.clients,
        publishes_accepted: accepted,
        delivered: received.load(Ordering::Relaxed),
        expected,
        latency_p50_ms: percentile(&lat, 0.5),
        latency_p99_ms: percentile(&lat, 0.99),
        polls: rtt.len() as u64,
        round_trip_p50_ms: percentile(&rtt, 0.5),
        round_trip_p99_ms: percentile(&rtt, 0.99),
        catch_up_events: got,
        catch_up_events_per_second: got as f64 / seconds,
    })
}
