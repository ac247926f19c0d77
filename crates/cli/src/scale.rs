//! `tidings bench --mode resume`: the reconnect storm of a scaled-out
//! deployment. `--clients` SSE subscribers hold streams on one process
//! (`--url`); when it goes away (killed, or drained by SIGTERM) each
//! reconnects with its `Last-Event-ID` to the other processes
//! (`--peer-urls`, spread by client), as a load balancer would send them,
//! waiting the `retry:` the server last gave it, like `EventSource`. It
//! reports how long the storm took, from the first stream that ended to
//! the last one resumed and to the last one caught up with the log, and
//! whether any client saw an id twice or skipped one (every event of the
//! run is of the one type the clients ask for, so a client's ids must run
//! without a hole). `scripts/bench-scale` with `PROCESSES` drives it; it is
//! a benchmark, not a test: it reports, it asserts nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::bench::{BenchArgs, head, mark_ready};
use tidings_client::sse as client;

/// What one storm measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ResumeReport {
    /// Subscribers.
    pub clients: usize,
    /// Subscribers whose stream ended.
    pub clients_cut: u64,
    /// Of those, subscribers that reconnected.
    pub clients_resumed: u64,
    /// Subscribers that, at the end, had every event up to the head.
    pub clients_caught_up: usize,
    /// From the first stream that ended to the last reconnection answered.
    pub resume_seconds: f64,
    /// From the first stream that ended to every subscriber holding the
    /// head it had when the last one resumed.
    pub catch_up_seconds: f64,
    /// Ids received twice, summed over subscribers.
    pub repeated: u64,
    /// Ids skipped, summed over subscribers.
    pub skipped: u64,
    /// Reconnection attempts refused or failed (the process was down).
    pub failed_attempts: u64,
}

/// What the subscribers share with the driver.
#[derive(Default)]
struct Tally {
    cut: AtomicU64,
    resumed: AtomicU64,
    repeated: AtomicU64,
    skipped: AtomicU64,
    failed: AtomicU64,
    /// Microseconds since the run's start of the first cut, 0 while none.
    first_cut_us: AtomicU64,
    /// Of the last reconnection answered.
    last_resume_us: AtomicU64,
}

/// `resume`: see the module's documentation.
pub async fn resume(args: &BenchArgs) -> anyhow::Result<ResumeReport> {
    let peers: Vec<String> = args.peer_urls.split(',').filter(|u| !u.is_empty()).map(str::to_owned).collect();
    anyhow::ensure!(!peers.is_empty(), "--peer-urls names the processes the subscribers move to");
    let http = reqwest::Client::builder().http1_only().pool_max_idle_per_host(0).build()?;
    let started = Instant::now();
    let tally = Arc::new(Tally::default());
    let last_ids: Arc<Vec<AtomicI64>> = Arc::new((0..args.clients).map(|_| AtomicI64::new(0)).collect());
    let done = tokio_util::sync::CancellationToken::new();
    let path = format!("/v1/stream?types={}", args.event_type);
    let mut tasks = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let mut reader = client::connect(&http, &format!("{}{path}", args.url), None).await?;
        let (http, tally, last_ids, done) = (http.clone(), tally.clone(), last_ids.clone(), done.clone());
        let target = format!("{}{path}", peers[i % peers.len()]);
        tasks.push(tokio::spawn(async move {
            let mut last: Option<i64> = None;
            loop {
                let event = tokio::select! {
                    _ = done.cancelled() => return,
                    e = reader.next_event() => e,
                };
                match event {
                    Some(e) if e.event.is_none() => {
                        let Some(id) = e.id.as_deref().and_then(|id| id.parse::<i64>().ok()) else { continue };
                        match last {
                            Some(l) if id <= l => {
                                tally.repeated.fetch_add(1, Ordering::Relaxed);
                                continue;
                            }
                            Some(l) if id > l + 1 => {
                                tally.skipped.fetch_add(u64::try_from(id - l - 1).unwrap_or(0), Ordering::Relaxed);
                            }
                            _ => {}
                        }
                        last = Some(id);
                        last_ids[i].store(id, Ordering::Relaxed);
                    }
                    Some(_) => {}
                    None => {
                        // The stream ended: wait what the server asked, then
                        // move to this client's other process; while that
                        // refuses, back off a little more each time.
                        let at = started.elapsed().as_micros() as u64;
                        tally.cut.fetch_add(1, Ordering::Relaxed);
                        let _ = tally.first_cut_us.compare_exchange(0, at.max(1), Ordering::Relaxed, Ordering::Relaxed);
                        let retry = Duration::from_millis(reader.parser().retry_ms.unwrap_or(0));
                        let mut attempt = 0u32;
                        reader = loop {
                            tokio::select! {
                                _ = done.cancelled() => return,
                                _ = tokio::time::sleep(retry + Duration::from_millis(100) * attempt.min(10)) => {}
                            }
                            match client::connect(&http, &target, last).await {
                                Ok(r) => break r,
                                Err(_) => {
                                    tally.failed.fetch_add(1, Ordering::Relaxed);
                                    attempt += 1;
                                }
                            }
                        };
                        tally.resumed.fetch_add(1, Ordering::Relaxed);
                        tally.last_resume_us.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    mark_ready(args)?;

    // Wait until every subscriber was cut and has resumed, then until each
    // holds the head of that moment; `--duration` bounds the whole wait.
    let deadline = Instant::now() + args.duration;
    let clients = args.clients as u64;
    while Instant::now() < deadline && tally.resumed.load(Ordering::Relaxed) < clients {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let target_head = head(&http, &peers[0]).await?;
    let caught_up = || last_ids.iter().filter(|l| l.load(Ordering::Relaxed) >= target_head).count();
    while Instant::now() < deadline && caught_up() < args.clients {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let caught_up_at = started.elapsed();
    let clients_caught_up = caught_up();
    done.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let first_cut = Duration::from_micros(tally.first_cut_us.load(Ordering::Relaxed));
    Ok(ResumeReport {
        clients: args.clients,
        clients_cut: tally.cut.load(Ordering::Relaxed),
        clients_resumed: tally.resumed.load(Ordering::Relaxed),
        clients_caught_up,
        resume_seconds: Duration::from_micros(tally.last_resume_us.load(Ordering::Relaxed)).saturating_sub(first_cut).as_secs_f64(),
        catch_up_seconds: caught_up_at.saturating_sub(first_cut).as_secs_f64(),
        repeated: tally.repeated.load(Ordering::Relaxed),
        skipped: tally.skipped.load(Ordering::Relaxed),
        failed_attempts: tally.failed.load(Ordering::Relaxed),
    })
}
