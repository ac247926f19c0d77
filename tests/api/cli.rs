//! The command-line clients as a user runs them: `publish`, `tail` (which
//! resumes across a server restart with nothing missing) and
//! `registry check`.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{free_port, process_command};

fn tidings() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tidings"));
    cmd.kill_on_drop(true).stdin(Stdio::null());
    cmd
}

async fn start_on(dir: &std::path::Path, port: u16) -> tokio::process::Child {
    let mut child = process_command(&[("TIDINGS_DATA_DIR", dir.display().to_string())], port).spawn().unwrap();
    let http = reqwest::Client::new();
    for _ in 0..200 {
        if http.get(format!("http://127.0.0.1:{port}/health")).send().await.is_ok_and(|r| r.status() == 200) {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.start_kill();
    panic!("tidings did not start");
}

async fn publish(url: &str, payload: &str) -> i64 {
    let out = tidings().args(["publish", "comment.posted", "--payload", payload, "--url", url]).output().await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_and_tail_resume_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = start_on(dir.path(), port).await;
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
    let _server = start_on(dir.path(), port).await;
    let second = publish(&url, r#"{"n":2}"#).await;
    let third = publish(&url, r#"{"n":3}"#).await;
    let mut got = Vec::new();
    while let Ok(Ok(Some(line))) = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await {
        got.push(serde_json::from_str::<Value>(&line).unwrap()["event_id"].as_i64().unwrap());
    }
    assert_eq!(got, vec![second, third], "tail resumed after the restart with nothing missing or repeated");
    assert!(tail.wait().await.unwrap().success(), "tail stops after --count events");
}

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
