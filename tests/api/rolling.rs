//! Rolling restarts (DESIGN "Scaling out"), PostgreSQL only (the embedded
//! store is one process's file by nature): three tidings processes on one
//! database behind a small TCP load balancer of this test's own (round
//! robin, skipping a backend whose `/health/ready` fails), with publishers,
//! SSE streams, a long-polling consumer and a WebSocket device running
//! through it. Every process is restarted in turn with SIGTERM: nothing is
//! lost or repeated, no publish is stored twice, and the streams a process
//! ends are ended spread over its drain window, not in one burst.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::helpers::device::Key;
use crate::helpers::{Backend, Process, free_port, gather, process_store, spawn_process_at, wait_until};

/// `TIDINGS_DRAIN` of the processes.
const WINDOW: Duration = Duration::from_secs(3);
/// SSE streams kept open through the balancer.
const STREAMS: usize = 24;

/// A round-robin TCP balancer on loopback that sends each new connection
/// to the next backend whose `/health/ready` answered `200` at its last
/// check (every 50 ms).
struct Balancer {
    base: String,
    stop: Arc<AtomicBool>,
}

impl Balancer {
    async fn start(ports: Vec<u16>) -> Balancer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let ready: Arc<Vec<AtomicBool>> = Arc::new(ports.iter().map(|_| AtomicBool::new(false)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let (checked, ports2, stopping) = (ready.clone(), ports.clone(), stop.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_millis(500)).pool_max_idle_per_host(0).build().unwrap();
            while !stopping.load(Ordering::Relaxed) {
                for (i, port) in ports2.iter().enumerate() {
                    let r = http.get(format!("http://127.0.0.1:{port}/health/ready")).send().await;
                    checked[i].store(r.is_ok_and(|r| r.status() == 200), Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let stopping = stop.clone();
        tokio::spawn(async move {
            let next = AtomicUsize::new(0);
            while !stopping.load(Ordering::Relaxed) {
                let Ok((mut client, _)) = listener.accept().await else { continue };
                let start = next.fetch_add(1, Ordering::Relaxed);
                let mut upstream = None;
                for k in 0..ports.len() {
                    let i = (start + k) % ports.len();
                    if ready[i].load(Ordering::Relaxed)
                        && let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", ports[i])).await
                    {
                        upstream = Some(s);
                        break;
                    }
                }
                let Some(mut upstream) = upstream else { continue };
                tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        });
        Balancer { base, stop }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A fresh connection per request: each one is balanced.
fn unpooled() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(10)).build().unwrap()
}

/// Publishes `{"p": p, "n": n}` until it is answered `201`, retrying what
/// failed without an answer (a connection refused or closed before a
/// request was read stores nothing); its id.
async fn publish(http: &reqwest::Client, base: &str, p: usize, n: usize) -> i64 {
    let body = json!({"event_type": "probe.rolling", "payload": {"p": p, "n": n}});
    let body = &body;
    gather(
        Duration::from_secs(30),
        (),
        |_| format!("publish {p}/{n} was never answered"),
        |_| async move {
            if let Ok(r) = http.post(format!("{base}/v1/events")).json(body).send().await
                && r.status() == 201
                && let Ok(answer) = r.json::<Value>().await
            {
                return ControlFlow::Break(answer["event_ids"][0].as_i64().unwrap());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            ControlFlow::Continue(())
        },
    )
    .await
}

/// One SSE stream through the balancer, resumed with `Last-Event-ID`
/// whenever it ends; the ids it saw and when each of its streams ended.
async fn stream(base: String, stop: Arc<AtomicBool>, until: Arc<std::sync::atomic::AtomicI64>) -> (Vec<i64>, Vec<Instant>) {
    // No pool (each stream is balanced anew) and no overall timeout (a
    // stream lasts as long as the server keeps it).
    let http = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let (mut ids, mut ends) = (Vec::new(), Vec::new());
    let url = format!("{base}/v1/stream?types=probe.*");
    loop {
        let last = ids.last().copied().unwrap_or(0);
        if stop.load(Ordering::Relaxed) && last >= until.load(Ordering::Relaxed) {
            return (ids, ends);
        }
        let Ok(mut reader) = tidings_client::sse::connect(&http, &url, Some(last)).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        loop {
            match tokio::time::timeout(Duration::from_secs(5), reader.next_event()).await {
                Ok(Some(event)) => {
                    if let Some(id) = event.id.as_deref().and_then(|i| i.parse().ok()) {
                        ids.push(id);
                    }
                    let done = stop.load(Ordering::Relaxed) && ids.last().copied().unwrap_or(0) >= until.load(Ordering::Relaxed);
                    if done {
                        return (ids, ends);
                    }
                }
                Ok(None) => {
                    ends.push(Instant::now());
                    break;
                }
                Err(_) => break,
            }
        }
    }
}

/// A durable consumer long-polling through the balancer; the ids it got.
async fn poll(base: String, stop: Arc<AtomicBool>, until: Arc<std::sync::atomic::AtomicI64>) -> Vec<i64> {
    let http = unpooled();
    let (mut ids, mut since) = (Vec::new(), 0i64);
    while !(stop.load(Ordering::Relaxed) && since >= until.load(Ordering::Relaxed)) {
        let url = format!("{base}/v1/poll?consumer_id=rolling&types=probe.*&since={since}&limit=100&wait_ms=500");
        let page = match http.get(url).send().await {
            Ok(r) => r.json::<Value>().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        let Some(events) = page["events"].as_array() else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        ids.extend(events.iter().map(|e| e["event_id"].as_i64().unwrap()));
        since = page["next_since"].as_i64().unwrap_or(since);
    }
    ids
}

/// A WebSocket device through the balancer: authenticates with its last
/// seq, pages `sync.delta` to the head, then takes realtime frames until the
/// server closes; again and again. The seqs it got.
async fn device(base: String, stop: Arc<AtomicBool>, until: Arc<std::sync::atomic::AtomicI64>) -> Vec<i64> {
    let key = Key::new();
    let mut seqs: Vec<i64> = Vec::new();
    let url = format!("{}/v1/ws", base.replace("http://", "ws://"));
    'connect: loop {
        let last = seqs.last().copied().unwrap_or(0);
        if stop.load(Ordering::Relaxed) && last >= until.load(Ordering::Relaxed) {
            return seqs;
        }
        let Ok(Ok((mut ws, _))) = tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(&url)).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let hello = loop {
            match tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => break serde_json::from_str::<Value>(t.as_str()).unwrap(),
                Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) | Err(_) => continue 'connect,
                Ok(Some(Ok(_))) => {}
            }
        };
        let nonce = hello["params"]["nonce"].as_str().unwrap_or_default().to_owned();
        let body = json!({"device_id": "rolling", "cursor": last, "filter": {"types": ["probe.*"]}});
        let proof = key.proof("stream.auth", &body, &nonce);
        let auth = json!({"jsonrpc": "2.0", "id": 1, "method": "stream.auth", "params": {"body": body, "origin_proof": proof}});
        if ws.send(Message::text(auth.to_string())).await.is_err() {
            continue;
        }
        let (mut since, mut id, mut head, mut caught_up) = (last, 1, i64::MAX, false);
        loop {
            if stop.load(Ordering::Relaxed) && seqs.last().copied().unwrap_or(0) >= until.load(Ordering::Relaxed) {
                return seqs;
            }
            let message = match tokio::time::timeout(Duration::from_secs(1), ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<Value>(t.as_str()).unwrap(),
                Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => continue 'connect,
                // Quiet (no publisher now), or a ping: ask again.
                _ => continue,
            };
            if message["id"] == id {
                let result = &message["result"];
                if id == 1 {
                    head = result["head_seq"].as_i64().unwrap_or(i64::MAX);
                } else {
                    seqs.extend(result["items"].as_array().into_iter().flatten().map(|i| i["seq"].as_i64().unwrap()));
                    since = result["next_since"].as_i64().unwrap_or(since);
                    caught_up = !result["has_more"].as_bool().unwrap_or(true) && since >= head;
                }
                if !caught_up {
                    id += 1;
                    let page = json!({"jsonrpc": "2.0", "id": id, "method": "sync.delta", "params": {"device_id": "rolling", "since": since, "limit": 100}});
                    if ws.send(Message::text(page.to_string())).await.is_err() {
                        continue 'connect;
                    }
                }
            } else if message["method"] == "stream.event" && caught_up {
                seqs.push(message["params"]["seq"].as_i64().unwrap());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_loses_repeats_and_stampedes_nothing() {
    let (mut envs, _dir) = process_store(Backend::Postgres).await;
    envs.push(("TIDINGS_DRAIN_DELAY", "1s".to_owned()));
    envs.push(("TIDINGS_DRAIN", format!("{}s", WINDOW.as_secs())));
    envs.push(("TIDINGS_HEARTBEAT", "1s".to_owned()));
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut processes: Vec<Process> = Vec::new();
    for port in &ports {
        processes.push(spawn_process_at(&envs, *port).await);
    }
    let balancer = Balancer::start(ports.clone()).await;
    let base = balancer.base.clone();
    let probe = unpooled();
    wait_until("the balancer to serve", Duration::from_secs(10), Duration::from_millis(50), || async {
        probe.get(format!("{base}/health/ready")).send().await.is_ok()
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let until = Arc::new(std::sync::atomic::AtomicI64::new(i64::MAX));
    let streams: Vec<_> = (0..STREAMS).map(|_| tokio::spawn(stream(base.clone(), stop.clone(), until.clone()))).collect();
    let poller = tokio::spawn(poll(base.clone(), stop.clone(), until.clone()));
    let device = tokio::spawn(device(base.clone(), stop.clone(), until.clone()));
    let publishers: Vec<_> = (0..2)
        .map(|p| {
            let (base, stop) = (base.clone(), stop.clone());
            tokio::spawn(async move {
                let http = unpooled();
                let mut ids = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    ids.push(publish(&http, &base, p, ids.len()).await);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                ids
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Every process in turn: SIGTERM, wait for it to exit, start it again.
    let mut windows = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let pid = processes[i].child.id().unwrap().to_string();
        let signalled = Instant::now();
        assert!(tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap().success());
        let exited = tokio::time::timeout(Duration::from_secs(30), processes[i].child.wait()).await;
        assert!(exited.is_ok_and(|s| s.unwrap().success()), "process {i} drained and exited");
        windows.push((signalled, Instant::now()));
        processes[i] = spawn_process_at(&envs, *port).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut published = Vec::new();
    for p in publishers {
        published.extend(p.await.unwrap());
    }
    published.sort_unstable();
    let head = *published.last().unwrap();
    until.store(head, Ordering::Relaxed);
    let all: Vec<i64> = (1..=head).collect();
    assert_eq!(published, all, "each publish stored exactly once, and nothing else");

    let mut ends = Vec::new();
    for s in streams {
        let (ids, e) = tokio::time::timeout(Duration::from_secs(60), s).await.expect("a stream reaches the head").unwrap();
        assert_eq!(ids, all, "an SSE stream resumed across every restart: every id once, in order");
        ends.extend(e);
    }
    let polled = tokio::time::timeout(Duration::from_secs(60), poller).await.expect("the consumer reaches the head").unwrap();
    assert_eq!(polled, all, "the durable consumer: every id once, in order");
    let seqs = tokio::time::timeout(Duration::from_secs(60), device).await.expect("the device reaches the head").unwrap();
    assert_eq!(seqs, all, "the WebSocket device: every seq once, in order");

    // The spread: each process ended its streams over its drain window,
    // not at once. Of the streams one process ended, no tenth of the
    // window saw more than half of them end.
    for (i, (signalled, exited)) in windows.iter().enumerate() {
        let mut mine: Vec<Duration> = ends.iter().filter(|t| *t >= signalled && *t <= exited).map(|t| *t - *signalled).collect();
        mine.sort_unstable();
        assert!(mine.len() >= 3, "process {i} ended {} streams", mine.len());
        let slice = WINDOW / 10;
        let crowded = mine.iter().map(|start| mine.iter().filter(|t| **t >= *start && **t < *start + slice).count()).max().unwrap();
        assert!(crowded * 2 <= mine.len(), "process {i}: {crowded} of {} streams ended within {slice:?}: {mine:?}", mine.len());
    }
    drop(balancer);
}
