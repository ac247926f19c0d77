//! `tidings bench --mode sql-publish`: publishing from SQL beside publishing
//! over HTTP, in one run on one PostgreSQL server. Phase one: `--concurrency`
//! closed-loop HTTP publishers, each `POST /v1/events` of one event at a
//! time, for `--duration`. Phase two: as many database sessions, each
//! calling `SELECT tidings.publish(...)` in its own transaction (autocommit)
//! for `--duration`. One SSE subscriber follows both and measures, from the
//! stamp each event carries (taken just before the request or the call), the
//! time until it was delivered; for SQL that is call, commit, the move from
//! the outbox into the log and the fan-out. A benchmark, not a test.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Mutex;

use super::bench::{BenchArgs, nearest_rank, now_us};
use tidings_client::sse as client;

/// One phase's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseReport {
    /// `http` or `sql`.
    pub publisher: &'static str,
    /// Publishes answered (HTTP 201, or a call that committed).
    pub published: u64,
    /// Publishes per second.
    pub per_second: f64,
    /// Publishes that failed.
    pub failed: u64,
    /// Events the subscriber received of this phase.
    pub delivered: u64,
    /// Stamp to delivery, ms.
    pub delivery_p50_ms: Option<f64>,
    /// 99th percentile.
    pub delivery_p99_ms: Option<f64>,
}

/// `sql-publish`: see the module's documentation.
pub async fn sql_publish(args: &BenchArgs) -> anyhow::Result<Vec<PhaseReport>> {
    let database_url = args.database_url.clone().ok_or_else(|| anyhow::anyhow!("--database-url is required"))?;
    let http = reqwest::Client::builder().pool_max_idle_per_host(args.concurrency.max(1) + 1).build()?;
    let mut reader = client::connect(&http, &format!("{}/v1/stream?types={}", args.url, args.event_type), None).await?;
    // The subscriber: each event's phase and latency.
    let latencies: Arc<Mutex<Vec<(String, f64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let subscriber = {
        let (latencies, stop) = (latencies.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(200), reader.next_event()).await else { continue };
                let Ok(envelope) = serde_json::from_str::<serde_json::Value>(&event.data) else { continue };
                let (Some(sent), Some(phase)) = (envelope["payload"]["sent_us"].as_u64(), envelope["payload"]["phase"].as_str()) else {
                    continue;
                };
                let ms = now_us().saturating_sub(sent) as f64 / 1000.0;
                latencies.lock().await.push((phase.to_owned(), ms));
            }
        })
    };
    let mut reports = Vec::new();
    for phase in ["http", "sql"] {
        let start = Instant::now();
        let deadline = start + args.duration;
        let mut workers = Vec::new();
        for _ in 0..args.concurrency {
            let (http, url, event_type, database_url) =
                (http.clone(), format!("{}/v1/events", args.url), args.event_type.clone(), database_url.clone());
            workers.push(tokio::spawn(async move {
                let (mut ok, mut failed) = (0u64, 0u64);
                let db = if phase == "sql" {
                    let (db, connection) = tokio_postgres::connect(&database_url, tokio_postgres::NoTls).await?;
                    tokio::spawn(connection);
                    Some(db)
                } else {
                    None
                };
                while Instant::now() < deadline {
                    let payload = json!({"sent_us": now_us(), "phase": phase});
                    let done = match &db {
                        Some(db) => {
                            db.execute("SELECT tidings.publish($1, $2::text::jsonb)", &[&event_type, &payload.to_string()]).await.is_ok()
                        }
                        None => http
                            .post(&url)
                            .json(&json!({"event_type": event_type, "payload": payload}))
                            .send()
                            .await
                            .is_ok_and(|r| r.status().is_success()),
                    };
                    if done { ok += 1 } else { failed += 1 }
                }
                anyhow::Ok((ok, failed))
            }));
        }
        let (mut published, mut failed) = (0, 0);
        for w in workers {
            let (o, f) = w.await??;
            published += o;
            failed += f;
        }
        let seconds = start.elapsed().as_secs_f64();
        // Until the subscriber has this phase's events, or 30 s.
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let got = latencies.lock().await.iter().filter(|(p, _)| p == phase).count() as u64;
            if got >= published || Instant::now() > until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut mine: Vec<f64> = latencies.lock().await.iter().filter(|(p, _)| p == phase).map(|(_, ms)| *ms).collect();
        mine.sort_by(f64::total_cmp);
        reports.push(PhaseReport {
            publisher: phase,
            published,
            per_second: published as f64 / seconds,
            failed,
            delivered: mine.len() as u64,
            delivery_p50_ms: nearest_rank(&mine, 0.5),
            delivery_p99_ms: nearest_rank(&mine, 0.99),
        });
    }
    stop.store(true, Ordering::Relaxed);
    let _ = subscriber.await;
    Ok(reports)
}
