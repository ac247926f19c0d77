//! The embedded store as a real process: acknowledged events survive
//! `kill -9`, and one data directory has one owner.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::helpers::{Process, free_port, process_command, spawn_process};

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
    while acked.lock().unwrap().len() < 300 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    let mut reader = tidings::client::connect(&http, &format!("{}/v1/stream?since=0", server.base), None).await.unwrap();
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
