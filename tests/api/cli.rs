//! The command-line clients as a user runs them: `publish`, `tail` (which
//! resumes across a server restart with nothing missing) and
//! `registry check`.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::both_stores;
use crate::helpers::{Backend, free_port, process_store, spawn_process_at};

both_stores!(publish_and_tail_resume_across_a_restart);

fn tidings() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tidings"));
    cmd.kill_on_drop(true).stdin(Stdio::null());
    cmd
}

async fn publish(url: &str, payload: &str) -> i64 {
    let out = tidings().args(["publish", "comment.posted", "--payload", payload, "--url", url]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
}

async fn publish_and_tail_resume_across_a_restart(backend: Backend) {
    let (envs, _dir) = process_store(backend).await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = spawn_process_at(&envs, port).await.child;
    let first = publish(&url, r#"{"n":1}"#).await;
    let mut tail = tidings()
        .args(["tail", "--url", &url, "--since", "0", "--json", "--count", "3", "--types", "comment.*"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until tail has printed the first event, then restart the server.
    use tokio::io::AsyncBufReadExt as _;
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.unwrap().unwrap().unwrap();
    assert_eq!(serde_json::from_str::<Value>(&line).unwrap()["event_id"], first);
    let pid = server.id().unwrap().to_string();
    assert!(tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap().success());
    server.wait().await.unwrap();
    let _server = spawn_process_at(&envs, port).await;
    let second = publish(&url, r#"{"n":2}"#).await;
    let third = publish(&url, r#"{"n":3}"#).await;
    let mut got = Vec::new();
    while let Ok(Ok(Some(line))) = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await {
        got.push(serde_json::from_str::<Value>(&line).unwrap()["event_id"].as_i64().unwrap());
    }
    assert_eq!(got, vec![second, third], "tail resumed after the restart with nothing missing or repeated");
    assert!(tail.wait().await.unwrap().success(), "tail stops after --count events");
}

/// Reads a registry directory only: no store is involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_check_validates_a_directory() {
    let ok = tidings().args(["registry", "check", "--registry", concat!(env!("CARGO_MANIFEST_DIR"), "/registry")]).output().await.unwrap();
    assert!(ok.status.success());
    assert!(String::from_utf8_lossy(&ok.stdout).contains("30 event types, all valid"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.b.json"), r#"{"name":"a.b","description":"x","payload_schema":{"type":"nonsense"}}"#).unwrap();
    let bad = tidings().args(["registry", "check", "--registry", dir.path().to_str().unwrap()]).output().await.unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("a.b.json"), "names the file: {}", String::from_utf8_lossy(&bad.stderr));
}
