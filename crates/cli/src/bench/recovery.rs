//! `tidings bench --mode listen-loss` and `--mode storm`: how fast
//! subscribers have everything again after the LISTEN connection is cut,
//! and after a reconnect storm.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::*;

/// Result of `listen-loss` or `storm`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RecoveryReport {
    /// What was measured.
    pub mode: &'static str,
    /// Clients involved.
    pub clients: usize,
    /// Events each client had to receive.
    pub events_per_client: u64,
    /// Clients that received them all.
    pub clients_complete: usize,
    /// `storm`: seconds until every connection was accepted (headers back).
    pub accept_seconds: Option<f64>,
    /// `storm`: connections accepted per second.
    pub connections_per_second: Option<f64>,
    /// Seconds until every client had every event.
    pub catch_up_seconds: f64,
}

async fn receive_ids(mut reader: client::SseReader<client::BodyStream>, n: u64, deadline: Instant) -> u64 {
    let mut got = 0;
    while got < n {
        match tokio::time::timeout_at(deadline.into(), reader.next_event()).await {
            Ok(Some(e)) if e.event.is_none() => got += 1,
            Ok(Some(_)) => {}
            _ => break,
        }
    }
    got
}

/// `listen-loss`: see [`Mode::ListenLoss`].
pub async fn listen_loss(args: &BenchArgs) -> anyhow::Result<RecoveryReport> {
    let database_url = args.database_url.as_deref().ok_or_else(|| anyhow::anyhow!("--database-url is required"))?;
    let publish_url = args.publish_url.as_deref().unwrap_or(&args.url);
    let http = reqwest::Client::new();
    let mut readers = Vec::new();
    for _ in 0..args.clients {
        readers.push(client::connect(&http, &format!("{}/v1/stream?types={}", args.url, args.event_type), None).await?);
    }
    let (db, conn) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let start = Instant::now();
    db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tidings-listener' AND datname = current_database()", &[])
        .await?;
    let one = json!({"event_type": args.event_type, "payload": {"weight": 1}});
    let r = http.post(format!("{publish_url}/v1/events")).json(&json!({"events": vec![one; args.events as usize]})).send().await?;
    anyhow::ensure!(r.status() == 201, "publishing failed: {}", r.status());
    let deadline = Instant::now() + Duration::from_secs(60);
    let tasks: Vec<_> = readers.into_iter().map(|r| tokio::spawn(receive_ids(r, args.events, deadline))).collect();
    let mut complete = 0;
    for t in tasks {
        complete += usize::from(t.await? == args.events);
    }
    Ok(RecoveryReport {
        mode: "listen_loss",
        clients: args.clients,
        events_per_client: args.events,
        clients_complete: complete,
        accept_seconds: None,
        connections_per_second: None,
        catch_up_seconds: start.elapsed().as_secs_f64(),
    })
}

/// `storm`: see [`Mode::Storm`].
pub async fn storm(args: &BenchArgs) -> anyhow::Result<RecoveryReport> {
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build()?;
    let one = json!({"event_type": args.event_type, "payload": {"weight": 1}});
    let r = http.post(format!("{}/v1/events", args.url)).json(&json!({"events": vec![one; 10]})).send().await?;
    anyhow::ensure!(r.status() == 201, "publishing failed: {}", r.status());
    let head = head(&http, &args.url).await?;
    let barrier = Arc::new(tokio::sync::Barrier::new(args.clients + 1));
    let accepted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            let (http, barrier, accepted) = (http.clone(), barrier.clone(), accepted.clone());
            let url = format!("{}/v1/stream?types={}", args.url, args.event_type);
            tokio::spawn(async move {
                barrier.wait().await;
                let reader = client::connect(&http, &url, Some(head - 10)).await.ok()?;
                let at = Instant::now();
                accepted.fetch_add(1, Ordering::Relaxed);
                let got = receive_ids(reader, 10, Instant::now() + Duration::from_secs(60)).await;
                Some((at, got, Instant::now()))
            })
        })
        .collect();
    barrier.wait().await;
    let start = Instant::now();
    let (mut last_accept, mut last_done, mut complete) = (start, start, 0);
    for t in tasks {
        if let Some((at, got, done)) = t.await? {
            last_accept = last_accept.max(at);
            last_done = last_done.max(done);
            complete += usize::from(got == 10);
        }
    }
    let accept_seconds = (last_accept - start).as_secs_f64();
    Ok(RecoveryReport {
        mode: "storm",
        clients: args.clients,
        events_per_client: 10,
        clients_complete: complete,
        accept_seconds: Some(accept_seconds),
        connections_per_second: Some(accepted.load(Ordering::Relaxed) as f64 / accept_seconds),
        catch_up_seconds: (last_done - start).as_secs_f64(),
    })
}
