//! HTTPS on the listener (`TIDINGS_TLS_CERT_FILE` / `TIDINGS_TLS_KEY_FILE`):
//! curl over HTTP/2 and over HTTP/1.1 streams events and resumes with
//! `Last-Event-ID`, plain HTTP is not answered on the TLS port, and
//! `SIGHUP` swaps the certificate for new connections while open streams
//! go on.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};

use crate::both_stores;
use crate::helpers::{Backend, Process, free_port, process_store, spawn_process_at};

both_stores!(curl_streams_and_resumes_over_http2_and_http1, sighup_reloads_the_certificate_and_open_streams_go_on);

/// A self-signed certificate for 127.0.0.1 and its key, in `dir`.
pub(crate) fn certificate(dir: &std::path::Path) -> (String, String) {
    certificate_named(dir, "tidings-test")
}

/// The same with common name `cn` (what a client's handshake log shows).
fn certificate_named(dir: &std::path::Path, cn: &str) -> (String, String) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let status = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj"])
        .arg(format!("/CN={cn}"))
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

/// The common name of the certificate a new connection to `base` is shown.
async fn served_name(base: &str) -> String {
    let out = tokio::process::Command::new("curl").args(["-skv", "-o", "/dev/null"]).arg(format!("{base}/health")).output().await.unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    log.lines().find_map(|l| l.trim().strip_prefix("*  subject: CN=").map(str::to_owned)).unwrap_or_else(|| panic!("{log}"))
}

/// One sample of the reloads counter, from `/metrics` over HTTPS.
async fn reloads(base: &str, outcome: &str) -> f64 {
    let out = tokio::process::Command::new("curl").arg("-sk").arg(format!("{base}/metrics")).output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let series = format!("tidings_tls_reloads_total{{outcome=\"{outcome}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(series.as_str())).and_then(|v| v.trim().parse().ok()).unwrap_or(0.0)
}

/// Sends SIGHUP to the server (this test's own child, by its pid) and waits
/// until the reloads counter for `outcome` has moved past what it was.
async fn hang_up(server: &Process, base: &str, outcome: &str) {
    let before = reloads(base, outcome).await;
    let pid = server.child.id().expect("running").to_string();
    assert!(std::process::Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    for _ in 0..200 {
        if reloads(base, outcome).await > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no {outcome} reload was counted");
}

async fn sighup_reloads_the_certificate_and_open_streams_go_on(backend: Backend) {
    let (mut envs, _dir) = process_store(backend).await;
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = certificate_named(certs.path(), "tidings-first");
    envs.push(("TIDINGS_TLS_CERT_FILE", cert.clone()));
    envs.push(("TIDINGS_TLS_KEY_FILE", key.clone()));
    let server = spawn_process_at(&envs, free_port()).await;
    let base = server.base.clone();
    assert_eq!(served_name(&base).await, "tidings-first");
    let first = publish(&base, 1).await;
    let mut h2 = CurlStream::open(&base, "--http2", first - 1);
    let mut h1 = CurlStream::open(&base, "--http1.1", first - 1);
    assert_eq!((h2.ids(1).await, h1.ids(1).await), (vec![first], vec![first]));
    // A renewed pair is put in place, then the server is told.
    let renewed = tempfile::tempdir().unwrap();
    let (new_cert, new_key) = certificate_named(renewed.path(), "tidings-second");
    std::fs::copy(&new_cert, &cert).unwrap();
    std::fs::copy(&new_key, &key).unwrap();
    hang_up(&server, &base, "ok").await;
    assert_eq!(served_name(&base).await, "tidings-second", "new connections see the new certificate");
    // Streams opened before the reload keep flowing.
    let second = publish(&base, 2).await;
    assert_eq!((h2.ids(1).await, h1.ids(1).await), (vec![second], vec![second]));
    // A pair that does not load is refused and the one in use stays.
    std::fs::write(&key, "not a key").unwrap();
    hang_up(&server, &base, "failed").await;
    assert_eq!(served_name(&base).await, "tidings-second");
    let third = publish(&base, 3).await;
    assert_eq!((h2.ids(1).await, h1.ids(1).await), (vec![third], vec![third]));
    h2.stop().await;
    h1.stop().await;
}
