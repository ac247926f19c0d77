//! `tidings bench --mode publish`, `tree-write` and `replay`: closed-loop
//! publish (or tree write) throughput, and one client replaying the log.

use std::time::Instant;

use serde_json::json;

use super::*;

/// Throughput of a `publish` or `replay` run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ThroughputReport {
    /// What was measured.
    pub mode: &'static str,
    /// Events in the measurement.
    pub events: u64,
    /// Wall time, seconds.
    pub seconds: f64,
    /// events / seconds.
    pub events_per_second: f64,
    /// `publish`: requests answered with an error (or not at all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<u64>,
    /// `publish`: time from sending a request to its answer, median.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_p50_ms: Option<f64>,
    /// `publish`: the same, 99th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_p99_ms: Option<f64>,
}

/// Closed-loop publish throughput: `concurrency` publishers, `batch` events
/// per request, for `duration`.
pub async fn publish_throughput(args: &BenchArgs) -> anyhow::Result<ThroughputReport> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(args.concurrency.max(1)).build()?;
    let url = format!("{}/v1/events", args.url);
    let tree = args.mode == Mode::TreeWrite;
    let start = Instant::now();
    let deadline = start + args.duration;
    let workers: Vec<_> = (0..args.concurrency)
        .map(|w| {
            let (http, url, batch, event_type, base) = (http.clone(), url.clone(), args.batch, args.event_type.clone(), args.url.clone());
            tokio::spawn(async move {
                let one = json!({"event_type": event_type, "payload": {"weight": 1}});
                let body = if batch == 1 { one } else { json!({"events": vec![one; batch]}) };
                let body = bytes::Bytes::from(serde_json::to_vec(&body).expect("serialisable"));
                let (mut answered, mut failed) = (Vec::new(), 0u64);
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    let r = if tree {
                        n += 1;
                        let entity = json!({"type": "bench", "data": {"n": n}});
                        http.put(format!("{base}/v1/tree/bench/w{w}/{}", n % 100)).json(&entity).send().await
                    } else {
                        http.post(&url).header("content-type", "application/json").body(body.clone()).send().await
                    };
                    match r {
                        Ok(r) if r.status().is_success() => answered.push(sent.elapsed().as_secs_f64() * 1000.0),
                        _ => failed += 1,
                    }
                }
                (answered, failed)
            })
        })
        .collect();
    let (mut answered, mut failed) = (Vec::new(), 0);
    for w in workers {
        let (a, f) = w.await?;
        answered.extend(a);
        failed += f;
    }
    let seconds = start.elapsed().as_secs_f64();
    let events = answered.len() as u64 * args.batch as u64;
    answered.sort_by(f64::total_cmp);
    let pct = |p: f64| nearest_rank(&answered, p);
    let mode = if tree {
        "tree_write"
    } else if args.batch == 1 {
        "publish_single"
    } else {
        "publish_batched"
    };
    Ok(ThroughputReport {
        mode,
        events,
        seconds,
        events_per_second: events as f64 / seconds,
        failed: Some(failed),
        answer_p50_ms: pct(0.5),
        answer_p99_ms: pct(0.99),
    })
}

/// Replay throughput: publishes `events` in batches of 1,000, then times one
/// client reading them all from the start.
pub async fn replay_throughput(args: &BenchArgs) -> anyhow::Result<ThroughputReport> {
    let http = reqwest::Client::new();
    let head_before = head(&http, &args.url).await?;
    let mut left = args.events;
    while left > 0 {
        let n = left.min(1000);
        let one = json!({"event_type": args.event_type, "payload": {"weight": 1}});
        let r = http.post(format!("{}/v1/events", args.url)).json(&json!({"events": vec![one; n as usize]})).send().await?;
        anyhow::ensure!(r.status() == 201, "preloading failed: {}", r.status());
        left -= n;
    }
    let start = Instant::now();
    let mut reader = client::connect(&http, &format!("{}/v1/stream?since={head_before}", args.url), None).await?;
    let mut got = 0;
    while got < args.events {
        match reader.next_event().await {
            Some(e) if e.event.is_none() => got += 1,
            Some(_) => {}
            None => anyhow::bail!("the stream ended after {got} events"),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(ThroughputReport {
        mode: "replay",
        events: got,
        seconds,
        events_per_second: got as f64 / seconds,
        failed: None,
        answer_p50_ms: None,
        answer_p99_ms: None,
    })
}
