//! HTTPS on the listener (`TIDINGS_TLS_CERT_FILE` / `TIDINGS_TLS_KEY_FILE`):
//! curl over HTTP/2 and over HTTP/1.1 streams events and resumes with
//! `Last-Event-ID`, and plain HTTP is not answered on the TLS port.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};

use crate::both_stores;
use crate::helpers::{Backend, Process, free_port, process_store, spawn_process_at};

both_stores!(curl_streams_and_resumes_over_http2_and_http1);

/// A self-signed certificate for 127.0.0.1 and its key, in `dir`.
fn certificate(dir: &std::path::Path) -> (String, String) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=tidings-test",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl");
    assert!(status.success());
    (cert.display().to_string(), key.display().to_string())
}

async fn start_tls(backend: Backend) -> (Process, tempfile::TempDir, tempfile::TempDir) {
    let (mut envs, dir) = process_store(backend).await;
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(certs.path());
    envs.push(("TIDINGS_TLS_CERT_FILE", cert));
    envs.push(("TIDINGS_TLS_KEY_FILE", key));
    (spawn_process_at(&envs, free_port()).await, dir, certs)
}

/// Publishes one event over HTTPS with curl; its id.
async fn publish(base: &str, n: u32) -> i64 {
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "-H", "content-type: application/json", "--data"])
        .arg(format!(r#"{{"event_type": "signal.upvote.recorded", "payload": {{"n": {n}}}}}"#))
        .arg(format!("{base}/v1/events"))
        .output()
        .await
        .unwrap();
    let body: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)));
    body["event_ids"][0].as_i64().unwrap_or_else(|| panic!("{body}"))
}

/// A curl stream of `/v1/stream` with `protocol` (`--http2`, `--http1.1`)
/// from `last_event_id`.
struct CurlStream {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl CurlStream {
    fn open(base: &str, protocol: &str, last_event_id: i64) -> Self {
        let mut child = tokio::process::Command::new("curl")
            .args(["-skNv", protocol, "-H"])
            .arg(format!("last-event-id: {last_event_id}"))
            .arg(format!("{base}/v1/stream?types=signal.upvote.recorded"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    /// The next `n` event ids.
    async fn ids(&mut self, n: usize) -> Vec<i64> {
        let mut ids = Vec::new();
        while ids.len() < n {
            let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line()).await.expect("an event in time").unwrap();
            let line = line.expect("the stream is open");
            if let Some(id) = line.strip_prefix("id: ") {
                ids.push(id.trim().parse().unwrap());
            }
        }
        ids
    }

    /// Stops curl (this process's own child) and returns its verbose log.
    async fn stop(mut self) -> String {
        let _ = self.child.kill().await;
        let mut log = String::new();
        self.child.stderr.take().unwrap().read_to_string(&mut log).await.unwrap();
        log
    }
}

async fn curl_streams_and_resumes_over_http2_and_http1(backend: Backend) {
    let (server, _dir, _certs) = start_tls(backend).await;
    let base = server.base.clone();
    let first = publish(&base, 1).await;
    let second = publish(&base, 2).await;
    // HTTP/2: replay from Last-Event-ID, then live.
    let mut h2 = CurlStream::open(&base, "--http2", first);
    assert_eq!(h2.ids(1).await, vec![second], "replayed after Last-Event-ID");
    let third = publish(&base, 3).await;
    assert_eq!(h2.ids(1).await, vec![third], "live over HTTP/2");
    let log = h2.stop().await;
    assert!(log.contains("ALPN: server accepted h2"), "{log}");
    // HTTP/1.1 on the same port: resumes where the HTTP/2 stream stopped.
    let mut h1 = CurlStream::open(&base, "--http1.1", third);
    let fourth = publish(&base, 4).await;
    assert_eq!(h1.ids(1).await, vec![fourth], "live over HTTP/1.1, nothing before it repeated");
    let log = h1.stop().await;
    assert!(log.contains("ALPN: server accepted http/1.1"), "{log}");
    // Plain HTTP gets no answer on the TLS port.
    let plain = tokio::process::Command::new("curl")
        .args(["-s", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(base.replace("https://", "http://") + "/health")
        .output()
        .await
        .unwrap();
    assert_ne!(plain.stdout, b"200", "the TLS port does not speak plain HTTP");
    // The server is still serving.
    assert_eq!(publish(&base, 5).await, fourth + 1);
    drop(server);
}
