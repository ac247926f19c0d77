//! The live page in a real browser: headless Chromium (driven by
//! `tests/browser/live_page.mjs` with playwright-core) opens `/`, sees a
//! published event appear, follows the server through a restart, and resumes
//! after a reload, with nothing missing or repeated, on both stores, over
//! plain HTTP and over HTTPS.
//! `scripts/test` installs Chromium and the node module.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

use crate::both_stores;
use crate::helpers::{Backend, free_port, process_store, spawn_process_at};

both_stores!(
    console_shows_real_values_and_is_read_only_for_non_admins,
    live_page_shows_events_and_resumes_after_restart_and_reload,
    live_page_over_websocket_resumes_after_restart_and_reload,
    live_page_over_https_resumes_after_restart_and_reload,
    twelve_event_sources_on_one_origin_all_receive_over_http2
);

/// Twelve `EventSource`s on one origin (`tests/browser/twelve_streams.mjs`):
/// over HTTPS the browser speaks HTTP/2, all twelve open and every one
/// receives the event the page publishes; over plain HTTP/1.1, in the same
/// run, the browser opens six (its per-origin limit) and the page's own
/// publish never leaves it.
async fn twelve_event_sources_on_one_origin_all_receive_over_http2(backend: Backend) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/twelve_streams.mjs");
    let (mut tls_envs, _tls_dir) = process_store(backend).await;
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = crate::tls::certificate(certs.path());
    tls_envs.push(("TIDINGS_TLS_CERT_FILE", cert));
    tls_envs.push(("TIDINGS_TLS_KEY_FILE", key));
    // Compressed, over HTTP/2: each EventSource reads its gzip stream.
    tls_envs.push(("TIDINGS_COMPRESSION", "on".to_owned()));
    let tls = spawn_process_at(&tls_envs, free_port()).await;
    let (plain_envs, _plain_dir) = process_store(backend).await;
    let plain = spawn_process_at(&plain_envs, free_port()).await;
    let out = crate::helpers::output_within(
        tokio::process::Command::new("node").arg(script).arg(&tls.base).arg(&plain.base),
        Duration::from_secs(90),
    )
    .await
    .expect("the browser run ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary =
        stdout.lines().find_map(|l| l.strip_prefix("OK ")).unwrap_or_else(|| panic!("{stdout}{}", String::from_utf8_lossy(&out.stderr)));
    let seen: serde_json::Value = serde_json::from_str(summary).unwrap();
    assert_eq!(seen["tls"], serde_json::json!({"opened": 12, "published": true, "receivedBy": 12}), "{seen}");
    assert_eq!((&seen["plain"]["opened"], &seen["plain"]["published"]), (&serde_json::json!(6), &serde_json::json!(false)), "{seen}");
    assert!(tls.metric("tidings_streams_compressed_total").await >= 12.0, "the twelve streams were compressed");
}

/// The operator console with tokens on (`tests/browser/console.mjs`): as
/// the admin, the store card, the head, the published total, clients by
/// transport (the page's stream, two more and a WebSocket device), the
/// chart, the event list with pretty payloads, a durable consumer and its
/// lag, a tree entity (its secret-named field hidden), the publish form (and
/// a refusal it shows) and pause/resume without loss, all read back from the
/// page, and a peer known from the settings in the peers panel; as a
/// reader, no admin action and no system/ access.
async fn console_shows_real_values_and_is_read_only_for_non_admins(backend: Backend) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/console.mjs");
    let (mut envs, _dir) = process_store(backend).await;
    envs.push(("TIDINGS_JWT_HS256_SECRET", crate::helpers::tokens::SECRET.to_owned()));
    // A peer known from the settings: the peers panel shows it.
    envs.push(("TIDINGS_PEERS", format!("sha256:{}=http://127.0.0.1:9", "ab".repeat(32))));
    // The console's streams compressed: Chromium's EventSource reads gzip.
    envs.push(("TIDINGS_COMPRESSION", "on".to_owned()));
    let server = spawn_process_at(&envs, free_port()).await;
    let admin = crate::helpers::tokens::token(
        "ops",
        serde_json::json!({"admin": true, "publish": ["**"], "subscribe": ["**"], "visibility": "admin"}),
    );
    let reader = crate::helpers::tokens::token("viewer", serde_json::json!({"subscribe": ["comment.*", "tree.*"]}));
    let store = if backend == Backend::Postgres { "postgres" } else { "embedded" };
    let mut node = tokio::process::Command::new("node");
    node.arg("--experimental-websocket").arg(script).args([&server.base, &admin, &reader, store]);
    if let Some(shot) = std::env::var_os("TIDINGS_SCREENSHOT") {
        node.env("TIDINGS_SCREENSHOT", shot);
    }
    let out = crate::helpers::output_within(&mut node, Duration::from_secs(120)).await.expect("the browser run ends");
    let compressed = server.metric("tidings_streams_compressed_total").await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l.starts_with("OK ")),
        "the console run failed:\n{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.kill_and_log().await
    );
    assert!(compressed > 0.0, "the console's streams were compressed");
}

async fn live_page_shows_events_and_resumes_after_restart_and_reload(backend: Backend) {
    drive_live_page(backend, "sse", false).await;
}

/// The same checks over HTTPS (a test certificate; Chromium speaks HTTP/2
/// to it): the page's EventSource resumes after the restart and the
/// reloads with nothing missed or repeated.
async fn live_page_over_https_resumes_after_restart_and_reload(backend: Backend) {
    drive_live_page(backend, "sse", true).await;
}

/// The same checks with the page on its WebSocket transport: Chromium's own
/// `WebSocket` and WebCrypto Ed25519, the server's cursor for the page's
/// key, and its high-water mark across reloads.
async fn live_page_over_websocket_resumes_after_restart_and_reload(backend: Backend) {
    drive_live_page(backend, "ws", false).await;
}

async fn drive_live_page(backend: Backend, transport: &str, tls: bool) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/live_page.mjs");
    let modules = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/node_modules/playwright-core");
    assert!(std::path::Path::new(modules).is_dir(), "run scripts/test, which installs playwright-core (npm ci in tests/browser)");
    assert!(std::path::Path::new("/usr/bin/chromium").exists(), "run scripts/test, which installs Debian's chromium");

    let (mut envs, _dir) = process_store(backend).await;
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = crate::tls::certificate(certs.path());
    if tls {
        envs.push(("TIDINGS_TLS_CERT_FILE", cert.clone()));
        envs.push(("TIDINGS_TLS_KEY_FILE", key));
    }
    let port = free_port();
    let base = format!("{}://127.0.0.1:{port}", if tls { "https" } else { "http" });
    let mut server = spawn_process_at(&envs, port).await.child;
    let mut node = tokio::process::Command::new("node")
        .arg(script)
        .arg(&base)
        .arg(transport)
        // The script's own requests trust the test certificate.
        .env("NODE_EXTRA_CA_CERTS", &cert)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    // Node and what it started (Chromium) are stopped whole if this test
    // fails before node ends.
    let tree = crate::helpers::Tree(node.id().expect("node runs"));
    let mut stdin = node.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(node.stdout.take().unwrap()).lines();
    let mut ok = None;
    while let Ok(Ok(Some(line))) = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await {
        if line == "RESTART" {
            let pid = server.id().unwrap().to_string();
            assert!(tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap().success());
            server.wait().await.unwrap();
            server = spawn_process_at(&envs, port).await.child;
            // Published before the page has reconnected: it must still arrive.
            let out = tokio::process::Command::new("curl")
                .args(["-sS", "--cacert", &cert, "-H", "content-type: application/json", "--data"])
                .arg(r#"{"event_type": "comment.posted", "payload": {"step": "b"}}"#)
                .arg(format!("{base}/v1/events"))
                .output()
                .await
                .unwrap();
            let id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["event_ids"][0].as_i64().unwrap();
            stdin.write_all(format!("RESTARTED {id}\n").as_bytes()).await.unwrap();
        } else if let Some(summary) = line.strip_prefix("OK ") {
            ok = Some(summary.to_owned());
        }
    }
    let mut end = std::pin::pin!(node.wait_with_output());
    let ended = tokio::time::timeout(Duration::from_secs(60), &mut end).await;
    match ended {
        Ok(_) => tree.disarm(),
        // Stopped now, while node still holds its children.
        Err(_) => drop(tree),
    }
    let out = ended.expect("the browser run ends").unwrap();
    assert!(out.status.success() && ok.is_some(), "the browser run failed: {}", String::from_utf8_lossy(&out.stderr));
}
