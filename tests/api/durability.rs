//! The real process: acknowledged events of the embedded store survive
//! `kill -9`, one data directory has one owner, and SIGTERM (on both
//! stores) ends streams and loses nothing across a restart. (PostgreSQL's
//! own durability is PostgreSQL's; its outage and recovery are in
//! `postgres.rs`.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::both_stores;
use crate::helpers::{Backend, Process, free_port, process_command, process_store, spawn_process};

both_stores!(sigterm_ends_streams_and_a_restart_loses_nothing, an_idle_server_exits_on_sigterm_without_waiting_out_the_drain);

async fn start(dir: &std::path::Path) -> Process {
    spawn_process(&[("TIDINGS_DATA_DIR", dir.display().to_string())]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path()).await;
    let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
    let http = reqwest::Client::new();
    let publishers: Vec<_> = (0..4)
        .map(|p| {
            let (http, acked, url) = (http.clone(), acked.clone(), format!("{}/v1/events", server.base));
            tokio::spawn(async move {
                for i in 0.. {
                    let body = if i % 3 == 0 {
                        json!({"events": [{"event_type": "comment.posted", "payload": {"p": p}}, {"event_type": "comment.edited"}]})
                    } else {
                        json!({"event_type": "comment.posted", "payload": {"p": p, "i": i}})
                    };
                    match http.post(&url).json(&body).send().await {
                        Ok(r) if r.status() == 201 => {
                            let v: serde_json::Value = r.json().await.unwrap();
                            acked.lock().unwrap().extend(v["event_ids"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()));
                        }
                        // The server is gone (killed mid-request): stop.
                        _ => break,
                    }
                }
            })
        })
        .collect();
    // Kill while publishers are mid-flight.
    crate::helpers::wait_until("300 publishes acknowledged", Duration::from_secs(60), Duration::from_millis(5), || async {
        acked.lock().unwrap().len() >= 300
    })
    .await;
    server.child.start_kill().unwrap(); // SIGKILL
    server.child.wait().await.unwrap();
    for p in publishers {
        p.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    let server = start(dir.path()).await;
    let health: serde_json::Value = http.get(format!("{}/health/deep", server.base)).send().await.unwrap().json().await.unwrap();
    let head = health["head_event_id"].as_i64().unwrap();
    assert!(head >= *acked.iter().max().unwrap(), "head {head} covers every acknowledged id");
    let mut reader = tidings_client::sse::connect(&http, &format!("{}/v1/stream?since=0", server.base), None).await.unwrap();
    let mut ids = Vec::new();
    while ids.len() < head as usize {
        let e = tokio::time::timeout(Duration::from_secs(10), reader.next_event()).await.unwrap().unwrap();
        ids.push(e.id.unwrap().parse::<i64>().unwrap());
    }
    assert_eq!(ids, (1..=head).collect::<Vec<_>>(), "gap-free and in order after recovery");
    for id in &acked {
        assert!(ids.contains(id), "acknowledged id {id} survived");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_data_directory_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let _first = start(dir.path()).await;
    let second = process_command(&[("TIDINGS_DATA_DIR", dir.path().display().to_string())], free_port()).spawn().unwrap();
    let output = tokio::time::timeout(Duration::from_secs(20), second.wait_with_output()).await.expect("the second server exits").unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is in use by another tidings process"), "a clear message: {stderr}");
}

/// SIGTERM on the real binary: open streams end with a jittered `retry:`,
/// the process exits cleanly within its shutdown deadline, and a restart on
/// the same data directory resumes the client with nothing lost.
async fn sigterm_ends_streams_and_a_restart_loses_nothing(backend: Backend) {
    let (mut envs, _dir) = process_store(backend).await;
    envs.push(("TIDINGS_SHUTDOWN_TIMEOUT", "5s".to_owned()));
    let mut server = spawn_process(&envs).await;
    let http = reqwest::Client::new();
    let publish = |base: String| {
        let http = http.clone();
        async move {
            let r = http.post(format!("{base}/v1/events")).json(&json!({"event_type": "comment.posted"})).send().await.unwrap();
            assert_eq!(r.status(), 201);
            r.json::<serde_json::Value>().await.unwrap()["event_ids"][0].as_i64().unwrap()
        }
    };
    let first = publish(server.base.clone()).await;
    let mut reader = tidings_client::sse::connect(&http, &format!("{}/v1/stream?since=0", server.base), None).await.unwrap();
    assert_eq!(reader.next_event().await.unwrap().id.as_deref(), Some("1"));
    let pid = server.child.id().unwrap().to_string();
    assert!(tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap().success());
    // The stream ends by itself (no more events, then the end).
    let end = tokio::time::timeout(Duration::from_secs(5), reader.next_event()).await.expect("the stream ends within the deadline");
    assert!(end.is_none());
    let retry = reader.parser().retry_ms.unwrap();
    assert!((2000..=10_000).contains(&retry), "a jittered retry: {retry}");
    let status = tokio::time::timeout(Duration::from_secs(10), server.child.wait()).await.expect("the process exits").unwrap();
    assert!(status.success(), "a clean exit: {status:?}");

    let server = spawn_process(&envs).await;
    let later = publish(server.base.clone()).await;
    let mut reader = tidings_client::sse::connect(&http, &format!("{}/v1/stream", server.base), Some(first)).await.unwrap();
    assert_eq!(reader.next_event().await.unwrap().id, Some(later.to_string()));
}

/// SIGTERM on an idle server: once the readiness delay is over and no
/// stream is open, nothing is left to drain, and the process exits without
/// waiting out the drain window (here two minutes, which the test's
/// deadline would not wait for).
async fn an_idle_server_exits_on_sigterm_without_waiting_out_the_drain(backend: Backend) {
    let (mut envs, _dir) = process_store(backend).await;
    envs.push(("TIDINGS_DRAIN_DELAY", "1s".to_owned()));
    envs.push(("TIDINGS_DRAIN", "120s".to_owned()));
    let mut server = spawn_process(&envs).await;
    let pid = server.child.id().unwrap().to_string();
    assert!(tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(30), server.child.wait()).await.expect("the idle process exits").unwrap();
    assert!(status.success(), "a clean exit: {status:?}");
}
