//! The log an operator reads: written to a pipe or a file (what systemd,
//! Docker and Kubernetes collect), it is plain text, with no terminal
//! colour escapes; it says which event-type registry is in force; an
//! event the registry does not vouch for is logged once per type (and
//! counted, every one); an error is logged with its causes.

use crate::both_stores;
use crate::helpers::{Backend, process_store, spawn_process};

both_stores!(an_unvouched_type_is_logged_once_and_counted_every_time);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_written_to_a_pipe_holds_no_colour_escapes() {
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_process(&[("TIDINGS_DATA_DIR", dir.path().display().to_string())]).await;
    let logs = server.kill_and_log().await;
    // Start-up says where events are stored, and warns that authentication is off.
    assert!(logs.contains("WARN") && logs.contains("INFO"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "no ANSI escape in a log written to a pipe:\n{logs}");
}

/// With a debug log asked for (`TIDINGS_LOG=debug`), the MCP SDK's own
/// debug lines stay off unless the filter names it: they carry tool
/// arguments (event payloads, tree entities, idempotency keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debug_log_holds_no_mcp_tool_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_process(&[("TIDINGS_DATA_DIR", dir.path().display().to_string()), ("TIDINGS_LOG", "debug".to_owned())]).await;
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "publish",
        "arguments": {"events": [{"event_type": "probe.secret", "payload": {"card": "4111-marker-in-a-payload"}}], "idempotency_key": "key-marker-7f3a"}}});
    let answer = reqwest::Client::new()
        .post(format!("{}/mcp", server.base))
        .header("accept", "application/json, text/event-stream")
        .json(&call)
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(body["result"]["structuredContent"]["event_ids"].as_array().map(Vec::len), Some(1), "{body}");
    let logs = server.kill_and_log().await;
    assert!(logs.contains("DEBUG"), "a debug log was asked for:\n{logs}");
    for marker in ["4111-marker-in-a-payload", "key-marker-7f3a"] {
        assert!(!logs.contains(marker), "{marker} is in the log:\n{logs}");
    }
}

/// Warn mode (the default): 30 events of one type the registry lacks and 3
/// of another write two lines, not 33, and the metric counts all 33.
/// Start-up says which registry is in force: the directory the tests name.
async fn an_unvouched_type_is_logged_once_and_counted_every_time(backend: Backend) {
    let (envs, _dir) = process_store(backend).await;
    let server = spawn_process(&envs).await;
    let http = reqwest::Client::new();
    for (event_type, n) in [("probe.never_registered", 30), ("probe.nor_this", 3)] {
        for _ in 0..n {
            let r =
                http.post(format!("{}/v1/events", server.base)).json(&serde_json::json!({"event_type": event_type})).send().await.unwrap();
            assert_eq!(r.status(), 201);
        }
    }
    let metrics = http.get(format!("{}/metrics", server.base)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "tidings_registry_violations_total{kind=\"unregistered_type\"} 33"), "{metrics}");
    let logs = server.kill_and_log().await;
    let warned: Vec<&str> = logs.lines().filter(|l| l.contains("does not vouch for")).collect();
    assert_eq!(warned.len(), 2, "{warned:#?}");
    assert!(warned[0].contains("probe.never_registered") && warned[1].contains("probe.nor_this"), "{warned:#?}");
    let in_force = logs.lines().find(|l| l.contains("event-type registry in force")).expect("start-up names the registry");
    assert!(in_force.contains(concat!("directory ", env!("CARGO_MANIFEST_DIR"), "/registry")) && in_force.contains("types="), "{in_force}");
}

/// Without the directory it names, the registry built into the binary is
/// in force, and start-up says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_says_the_built_in_registry_is_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_process(&[
        ("TIDINGS_DATA_DIR", dir.path().display().to_string()),
        ("TIDINGS_REGISTRY", dir.path().join("no-such-directory").display().to_string()),
    ])
    .await;
    let logs = server.kill_and_log().await;
    let in_force = logs.lines().find(|l| l.contains("event-type registry in force")).expect("start-up names the registry");
    assert!(in_force.contains("built into the binary"), "{in_force}");
}

/// The LISTEN session terminated by the database: the line that says so
/// gives the cause, down to PostgreSQL's words, not only "LISTEN probe".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_listen_session_is_logged_with_its_cause() {
    let (envs, _dir) = process_store(Backend::Postgres).await;
    let url = envs.iter().find(|(k, _)| *k == "DATABASE_URL").unwrap().1.clone();
    let server = spawn_process(&envs).await;
    // An established session (one still settling the log's epoch when it
    // is ended reports the query it was in).
    crate::helpers::eventually("the LISTEN session is established", || async {
        let deep: serde_json::Value = reqwest::get(format!("{}/health/deep", server.base)).await.unwrap().json().await.unwrap();
        deep["listener"]["state"] == "listening"
    })
    .await;
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    db.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tidings-listener' AND datname = current_database()",
    )
    .await
    .unwrap();
    crate::helpers::eventually("the loss is logged", || async { server.log().contains("LISTEN connection lost") }).await;
    let logs = server.kill_and_log().await;
    let line = logs.lines().find(|l| l.contains("LISTEN connection lost")).unwrap();
    assert!(line.contains("terminating connection due to administrator command"), "{line}");
}
