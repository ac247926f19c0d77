//! HTTPS on the listener (`TIDINGS_TLS_CERT_FILE` / `TIDINGS_TLS_KEY_FILE`):
//! curl over HTTP/2 and over HTTP/1.1 streams events and resumes with
//! `Last-Event-ID`, plain HTTP is not answered on the TLS port, and
//! `SIGHUP` swaps the certificate for new connections while open streams
//! go on. Over HTTP/2 the stream guarantees hold with streams sharing a
//! connection (heartbeats, evicting one stream only, the resume, the
//! shutdown retry), and a WebSocket upgrades over HTTP/1.1 on the TLS port.
//! On the plain port, h2c with prior knowledge (how a proxy speaks HTTP/2
//! without TLS) streams and resumes too.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};

use crate::both_stores;
use crate::helpers::{Backend, Process, free_port, process_store, spawn_process_at};

both_stores!(
    curl_streams_and_resumes_over_http2_and_http1,
    sighup_reloads_the_certificate_and_open_streams_go_on,
    h2c_with_prior_knowledge_streams_and_resumes_on_the_plain_port,
    streams_over_http2_keep_heartbeats_eviction_and_the_shutdown_retry,
    a_websocket_upgrades_over_http1_on_the_tls_port
);

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
        // A leaf, not a CA: webpki (rustls' clients) refuses a CA
        // certificate as the server's own.
        .args(["-addext", "subjectAltName=IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:FALSE"])
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

/// Without TLS, a client that opens with the HTTP/2 preface (curl's
/// `--http2-prior-knowledge`, a proxy's h2c upstream) gets HTTP/2: a stream
/// replays from `Last-Event-ID` and goes live, two streams of one HTTP/2
/// client both receive, and HTTP/1.1 on the same port still works.
async fn h2c_with_prior_knowledge_streams_and_resumes_on_the_plain_port(backend: Backend) {
    let (envs, _dir) = process_store(backend).await;
    let server = spawn_process_at(&envs, free_port()).await;
    let base = server.base.clone();
    let first = publish(&base, 1).await;
    let second = publish(&base, 2).await;
    let mut h2 = CurlStream::open(&base, "--http2-prior-knowledge", first);
    assert_eq!(h2.ids(1).await, vec![second], "replayed after Last-Event-ID");
    let third = publish(&base, 3).await;
    assert_eq!(h2.ids(1).await, vec![third], "live over h2c");
    let log = h2.stop().await;
    assert!(log.contains("< HTTP/2 200"), "{log}");
    assert!(log.contains("content-type: text/event-stream"), "{log}");
    // Two streams at once on one h2c client (reqwest keeps one HTTP/2
    // connection per host and multiplexes): both HTTP/2, both live.
    let h2c = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let mut streams = Vec::new();
    for _ in 0..2 {
        let r = h2c.get(format!("{base}/v1/stream?types=signal.upvote.recorded")).send().await.unwrap();
        assert_eq!((r.status().as_u16(), r.version()), (200, reqwest::Version::HTTP_2));
        streams.push(crate::helpers::Stream::from_response(r));
    }
    let shared = publish(&base, 9).await;
    for s in &mut streams {
        assert_eq!(s.ids(1).await, vec![shared]);
    }
    let third = shared;
    // HTTP/1.1 on the same port, resuming where the h2c stream stopped.
    let mut h1 = CurlStream::open(&base, "--http1.1", third);
    let fourth = publish(&base, 4).await;
    assert_eq!(h1.ids(1).await, vec![fourth]);
    assert!(h1.stop().await.contains("< HTTP/1.1 200"));
}

/// A client over TLS that trusts the test certificate in `certs`; HTTP/2
/// by ALPN (one connection per host, streams multiplexed on it).
fn https_client(certs: &std::path::Path) -> reqwest::Client {
    let pem = std::fs::read(certs.join("cert.pem")).unwrap();
    reqwest::Client::builder().add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap()).build().unwrap()
}

async fn in_flight(http: &reqwest::Client, base: &str) -> i64 {
    let deep: serde_json::Value = http.get(format!("{base}/health/deep")).send().await.unwrap().json().await.unwrap();
    deep["events"]["in_flight_subscriptions"].as_i64().unwrap()
}

/// The stream guarantees over HTTP/2, with streams sharing one connection:
/// a comment heartbeat while idle; a stream that stops reading is evicted
/// (`system.client_dropped_slow`) while the stream beside it on the same
/// connection gets every event on time, and its resume from the notice's
/// id gets the rest exactly once; at shutdown every stream ends by itself
/// with a jittered retry.
async fn streams_over_http2_keep_heartbeats_eviction_and_the_shutdown_retry(backend: Backend) {
    let (mut envs, _dir) = process_store(backend).await;
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = certificate(certs.path());
    envs.extend([
        ("TIDINGS_TLS_CERT_FILE", cert),
        ("TIDINGS_TLS_KEY_FILE", key),
        ("TIDINGS_CLIENT_QUEUE", "8".to_owned()),
        ("TIDINGS_SLOW_CLIENT_TIMEOUT", "300ms".to_owned()),
        ("TIDINGS_EVICTION_GRACE", "30s".to_owned()),
        ("TIDINGS_HEARTBEAT", "200ms".to_owned()),
    ]);
    let mut server = spawn_process_at(&envs, free_port()).await;
    let base = server.base.clone();
    let http = https_client(certs.path());
    let open = |query: &str| {
        let request = http.get(format!("{base}/v1/stream?types=comment.posted{query}"));
        async move {
            let r = request.send().await.unwrap();
            assert_eq!((r.status().as_u16(), r.version()), (200, reqwest::Version::HTTP_2));
            r
        }
    };
    // A heartbeat while idle, as raw bytes.
    let mut idle = open("").await;
    let mut seen = Vec::new();
    while !seen.windows(3).any(|w| w == b":\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), idle.chunk()).await.expect("a heartbeat while idle").unwrap().unwrap();
        seen.extend_from_slice(&chunk);
    }
    drop(idle);

    // Two streams on one connection: one read, one not.
    let mut fast = crate::helpers::Stream::from_response(open("").await);
    let slow = open("").await;
    crate::helpers::wait_until("both streams to register", Duration::from_secs(2), Duration::from_millis(20), || async {
        in_flight(&http, &base).await == 2
    })
    .await;
    let blob = "x".repeat(60_000);
    let publish_blob = |n: u32| {
        let request = http
            .post(format!("{base}/v1/events"))
            .json(&serde_json::json!({"event_type": "comment.posted", "payload": {"n": n, "body": blob}}));
        async move { request.send().await.unwrap().json::<serde_json::Value>().await.unwrap()["event_ids"][0].as_i64().unwrap() }
    };
    let mut published = Vec::new();
    let mut fast_got = Vec::new();
    for n in 0..400 {
        published.push(publish_blob(n).await);
        fast_got.extend(fast.ids(1).await);
        if in_flight(&http, &base).await == 1 {
            break;
        }
    }
    assert_eq!(in_flight(&http, &base).await, 1, "the stream that stopped reading was evicted");
    assert_eq!(fast_got, published, "the stream beside it on the same connection got everything on time");
    let after = publish_blob(1000).await;
    assert_eq!(fast.ids(1).await, vec![after]);
    published.push(after);
    // The evicted stream reads now: a prefix, then the notice, then the end.
    let mut slow = crate::helpers::Stream::from_response(slow);
    let mut got = Vec::new();
    let notice = loop {
        let e = slow.next().await;
        match e.event.as_deref() {
            None => got.push(e.id.unwrap().parse::<i64>().unwrap()),
            Some("system.client_dropped_slow") => break e,
            Some(other) => panic!("unexpected {other}"),
        }
    };
    let last = serde_json::from_str::<serde_json::Value>(&notice.data).unwrap()["last_event_id"].as_i64().unwrap();
    assert_eq!(got, published.iter().copied().take_while(|id| *id <= last).collect::<Vec<_>>(), "a prefix");
    assert!(slow.next_or_end().await.is_none(), "the stream ends after the notice");
    let mut resumed = crate::helpers::Stream::from_response(open(&format!("&since={last}")).await);
    let rest: Vec<i64> = published.iter().copied().filter(|id| *id > last).collect();
    assert_eq!(resumed.ids(rest.len()).await, rest, "the rest, exactly once");

    // Shutdown: every HTTP/2 stream ends by itself with a jittered retry.
    let mut others = Vec::new();
    for _ in 0..10 {
        others.push(crate::helpers::Stream::from_response(open("").await));
    }
    let pid = server.child.id().unwrap().to_string();
    assert!(tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap().success());
    let mut retries = Vec::new();
    for stream in std::iter::once(&mut resumed).chain(std::iter::once(&mut fast)).chain(others.iter_mut()) {
        while stream.next_or_end().await.is_some() {}
        let retry = stream.retry_ms().expect("a retry hint");
        assert!((2000..=10_000).contains(&retry), "a jittered retry: {retry}");
        retries.push(retry);
    }
    assert!(retries.iter().max().unwrap() - retries.iter().min().unwrap() >= 1000, "the retries spread: {retries:?}");
    assert!(server.child.wait().await.unwrap().success());
}

/// A WebSocket upgrades over HTTP/1.1 on the TLS port: the book's
/// example device, over `wss://` with the test certificate trusted, catches
/// up and takes a realtime event.
async fn a_websocket_upgrades_over_http1_on_the_tls_port(backend: Backend) {
    let python = std::env::var("TIDINGS_TEST_PYTHON").expect("run scripts/test, which installs the example's packages");
    let (server, _dir, certs) = start_tls(backend).await;
    let base = server.base.clone();
    let mut published = vec![publish(&base, 1).await, publish(&base, 2).await];
    let keys = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/ws_device.py"))
        .arg(format!("{}/v1/ws", base.replace("https://", "wss://")))
        .args(["--key", keys.path().join("device.key").to_str().unwrap(), "--device", "tls"])
        .args(["--types", "signal.upvote.recorded", "--since", "0", "--count", "3"])
        .env("SSL_CERT_FILE", certs.path().join("cert.pem"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut got = Vec::new();
    for i in 0..3 {
        if i == 2 {
            published.push(publish(&base, 3).await);
        }
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.expect("a line in time").unwrap();
        let Some(line) = line else {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).await.unwrap();
            panic!("the device ended: {err}");
        };
        got.push(serde_json::from_str::<serde_json::Value>(&line).unwrap()["event_id"].as_i64().unwrap());
    }
    assert_eq!(got, published, "history, then realtime, over wss");
    assert!(child.wait().await.unwrap().success());
}
