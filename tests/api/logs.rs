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
