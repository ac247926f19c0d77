//! The log an operator reads: written to a pipe or a file (what systemd,
//! Docker and Kubernetes collect), it is plain text, with no terminal
//! colour escapes.

use crate::helpers::spawn_process;

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
