//! `tidings bench --mode publish`, `tree-write` and `replay`: closed-loop
//! publish (or tree write) throughput, with where each publish's time went
//! (its answer's `Server-Timing`), and one client replaying the log.

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
    /// `publish`: each part the answers' `Server-Timing` names (where the
    /// server spent the time, docs/events.md), then `http`: what the
    /// client waited beyond their sum (the request's head, the answer's
    /// write, the network).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<AnswerPart>,
}

/// One part of the answer time, over the answers that named it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AnswerPart {
    /// Its name.
    pub name: String,
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Mean, milliseconds.
    pub mean_ms: f64,
}

/// Most parts an answer's `Server-Timing` may name, and most names the
/// report keeps (tidings names five): the server under test is not
/// trusted to keep its header small or its names few.
const MAX_PARTS: usize = 16;
/// Longest part name taken.
const MAX_PART_NAME: usize = 32;
/// Longest part taken, in milliseconds (a day): sums stay finite.
const MAX_PART_MS: f64 = 86_400_000.0;

/// The parts of a `Server-Timing` header (`name;dur=ms, ...`), or none if
/// it is not one (or names more than [`MAX_PARTS`], a long name, or a
/// duration that is not a finite, non-negative number).
fn timing_parts(header: &str) -> Option<Vec<(&str, f64)>> {
    if header.split(',').count() > MAX_PARTS {
        return None;
    }
    header
        .split(',')
        .map(|part| {
            let (name, dur) = part.trim().split_once(";dur=")?;
            let ms: f64 = dur.parse().ok()?;
            (name.len() <= MAX_PART_NAME && (0.0..MAX_PART_MS).contains(&ms)).then_some((name, ms))
        })
        .collect()
}

/// Each part's samples by name, in the order the answers named them: the
/// first [`MAX_PARTS`] names and the client's own `http` (later names are
/// not reported). Kept as they come, with no allocation per answer: the
/// load generator shares the machine with the server it measures.
#[derive(Debug, Default)]
struct PartSamples(Vec<(String, Vec<f64>)>);

impl PartSamples {
    fn add(&mut self, name: &str, ms: f64) {
        let room = self.0.len() < MAX_PARTS || name == "http";
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some((_, values)) => values.push(ms),
            None if room => self.0.push((name.to_owned(), vec![ms])),
            None => {}
        }
    }

    /// Another publisher's samples, added to these.
    fn merge(&mut self, other: PartSamples) {
        for (name, values) in other.0 {
            values.into_iter().for_each(|ms| self.add(&name, ms));
        }
    }

    /// Each part's percentiles.
    fn stats(self) -> Vec<AnswerPart> {
        self.0
            .into_iter()
            .map(|(name, mut values)| {
                values.sort_by(f64::total_cmp);
                let mean_ms = values.iter().sum::<f64>() / values.len() as f64;
                AnswerPart {
                    name,
                    p50_ms: nearest_rank(&values, 0.5).unwrap_or(f64::NAN),
                    p99_ms: nearest_rank(&values, 0.99).unwrap_or(f64::NAN),
                    mean_ms,
                }
            })
            .collect()
    }
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
                let (mut answered, mut failed, mut parts) = (Vec::new(), 0u64, PartSamples::default());
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
                        Ok(r) if r.status().is_success() => {
                            let waited = sent.elapsed().as_secs_f64() * 1000.0;
                            answered.push(waited);
                            let named = r.headers().get("server-timing").and_then(|h| h.to_str().ok()).and_then(timing_parts);
                            if let Some(named) = named {
                                let server: f64 = named.iter().map(|(_, ms)| ms).sum();
                                named.into_iter().for_each(|(name, ms)| parts.add(name, ms));
                                parts.add("http", (waited - server).max(0.0));
                            }
                        }
                        _ => failed += 1,
                    }
                }
                (answered, failed, parts)
            })
        })
        .collect();
    let (mut answered, mut failed, mut parts) = (Vec::new(), 0, PartSamples::default());
    for w in workers {
        let (a, f, p) = w.await?;
        answered.extend(a);
        failed += f;
        parts.merge(p);
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
        parts: parts.stats(),
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
        parts: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timing_parts_and_their_percentiles() {
        assert_eq!(timing_parts("read;dur=0.010, commit;dur=1.5"), Some(vec![("read", 0.01), ("commit", 1.5)]));
        assert_eq!(timing_parts("read;desc=x"), None);
        assert_eq!(timing_parts("read;dur=fast"), None);
        assert_eq!(timing_parts("read;dur=NaN"), None);
        assert_eq!(timing_parts("read;dur=-1"), None);
        assert_eq!(timing_parts("read;dur=1e300"), None);
        assert_eq!(timing_parts(&format!("{};dur=1", "n".repeat(MAX_PART_NAME + 1))), None);
        let many = (0..=MAX_PARTS).map(|i| format!("p{i};dur=1")).collect::<Vec<_>>().join(", ");
        assert_eq!(timing_parts(&many), None, "more parts than any server names");
        // A server that names new parts in every answer: the report keeps
        // the first MAX_PARTS names.
        let mut fresh = PartSamples::default();
        for i in 0..100 {
            (0..MAX_PARTS).for_each(|j| fresh.add(&format!("p{i}-{j}"), 1.0));
            fresh.add("http", 1.0);
        }
        let kept = fresh.stats();
        assert_eq!(kept.len(), MAX_PARTS + 1);
        assert!(kept.iter().any(|p| p.name == "http"), "the client's own part is kept");
        // Two publishers' samples, merged.
        let (mut one, mut other) = (PartSamples::default(), PartSamples::default());
        for i in 1..=100 {
            let publisher = if i % 2 == 0 { &mut one } else { &mut other };
            publisher.add("commit", f64::from(i));
            publisher.add("http", 1.0);
        }
        one.merge(other);
        let parts = one.stats();
        assert_eq!(parts.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["commit", "http"]);
        assert_eq!((parts[0].p50_ms, parts[0].p99_ms, parts[0].mean_ms), (50.0, 99.0, 50.5));
    }
}
