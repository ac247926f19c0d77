//! The command-line clients as a user runs them: `publish`, `tail` and
//! `listen` (which resume across a server restart with nothing missing or
//! repeated), `token` (whose tokens the server accepts, with their grants)
//! and `registry check`.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::both_stores;
use crate::helpers::{Backend, free_port, process_store, spawn_process_at};

both_stores!(
    publish_and_tail_resume_across_a_restart,
    listen_resumes_across_a_restart_and_acks,
    listen_stops_on_a_rejection,
    publish_retries_a_lost_answer_without_storing_twice,
    token_mints_what_the_server_accepts,
    tail_sends_its_token_as_a_header_and_says_what_went_wrong
);

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

/// The answer to `tidings publish` is lost once (a proxy drops it after
/// the server committed): it retries with the same Idempotency-Key, prints
/// the original id, and the log holds the event once.
async fn publish_retries_a_lost_answer_without_storing_twice(backend: Backend) {
    let app = crate::helpers::spawn_app(backend).await;
    let proxy = crate::helpers::answer_dropping_proxy(app.base.trim_start_matches("http://").parse().unwrap(), 1).await;
    let out = tidings().args(["publish", "comment.posted", "--url", &format!("http://{proxy}")]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("retrying with the same Idempotency-Key"), "the first answer was lost: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "the original id");
    assert_eq!(app.head().await, 1, "stored once");
    // A refusal is not retried.
    let out = tidings().args(["publish", "Not-A-Name", "--url", &app.base]).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("invalid_event_name") && !stderr.contains("retrying"), "{stderr}");
    assert_eq!(app.head().await, 1);
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

async fn sigterm(server: &mut tokio::process::Child) {
    let pid = server.id().unwrap().to_string();
    assert!(tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap().success());
    server.wait().await.unwrap();
}

/// `tidings listen` as a device: catches up from `--since`, goes live,
/// survives a server restart by reconnecting with its cursor, prints every
/// event exactly once, and acks what it printed (the server keeps the
/// cursor of its key and device).
async fn listen_resumes_across_a_restart_and_acks(backend: Backend) {
    let (envs, dir) = process_store(backend).await;
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let mut server = spawn_process_at(&envs, port).await.child;
    let mut published = vec![publish(&url, r#"{"n":1}"#).await, publish(&url, r#"{"n":2}"#).await];
    let key = dir.path().join("device.key");
    let mut listen = tidings()
        .args(["listen", "--url", &url, "--key", key.to_str().unwrap(), "--device", "box", "--since", "0", "--json"])
        .args(["--count", "5", "--types", "comment.*"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    use tokio::io::AsyncBufReadExt as _;
    let mut lines = tokio::io::BufReader::new(listen.stdout.take().unwrap()).lines();
    let mut got = Vec::new();
    let mut next = async || {
        let line =
            tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.expect("a line in time").unwrap().expect("a line");
        serde_json::from_str::<Value>(&line).unwrap()["event_id"].as_i64().unwrap()
    };
    got.push(next().await);
    got.push(next().await);
    // Live now.
    published.push(publish(&url, r#"{"n":3}"#).await);
    got.push(next().await);
    sigterm(&mut server).await;
    let _server = spawn_process_at(&envs, port).await;
    published.push(publish(&url, r#"{"n":4}"#).await);
    published.push(publish(&url, r#"{"n":5}"#).await);
    got.push(next().await);
    got.push(next().await);
    assert_eq!(got, published, "every event once, in order, across the restart");
    assert!(listen.wait().await.unwrap().success(), "listen stops after --count events");

    // The key file is the device's identity; the server kept its cursor at
    // what was printed last (the last ack lands just before the exit).
    let identity = tidings_server::keyfile::open(&key).unwrap();
    let ws = tidings_client::device::ws_url(&url, None);
    let mut tries = 0;
    loop {
        let mut client = tidings_client::device::DeviceClient::connect(&ws).await.unwrap();
        let answer = client.auth(&identity, serde_json::json!({"device_id": "box"})).await.unwrap();
        if answer["cursor"] == published[4] {
            break;
        }
        tries += 1;
        assert!(tries < 100, "the cursor reaches the last printed event: {answer}");
    }
}

/// A rejection is not retried: the same key, token or filter would be
/// rejected again.
async fn listen_stops_on_a_rejection(backend: Backend) {
    let (mut envs, dir) = process_store(backend).await;
    envs.push(("TIDINGS_JWT_HS256_SECRET", crate::helpers::tokens::SECRET.to_owned()));
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let _server = spawn_process_at(&envs, port).await;
    let key = dir.path().join("device.key");
    let run = |extra: Vec<String>| {
        let (url, key) = (url.clone(), key.clone());
        async move {
            let mut cmd = tidings();
            cmd.args(["listen", "--url", &url, "--key", key.to_str().unwrap()]).args(extra);
            tokio::time::timeout(Duration::from_secs(20), cmd.output()).await.expect("listen gives up at once").unwrap()
        }
    };
    let stderr = |out: &std::process::Output| String::from_utf8_lossy(&out.stderr).into_owned();
    let bad_token = run(vec!["--token".into(), "not-a-token".into()]).await;
    assert!(!bad_token.status.success());
    assert!(stderr(&bad_token).contains("unauthorized"), "{}", stderr(&bad_token));
    let token = crate::helpers::tokens::token("device-owner", serde_json::json!({"subscribe": ["**"]}));
    let bad_filter = run(vec!["--token".into(), token, "--filter".into(), r#"{"types": 5}"#.into()]).await;
    assert!(!bad_filter.status.success());
    assert!(stderr(&bad_filter).contains("invalid_filter"), "{}", stderr(&bad_filter));
}

/// Reads a registry directory only: no store is involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_check_validates_a_directory() {
    let ok = tidings().args(["registry", "check", "--registry", concat!(env!("CARGO_MANIFEST_DIR"), "/registry")]).output().await.unwrap();
    assert!(ok.status.success());
    assert!(String::from_utf8_lossy(&ok.stdout).contains("33 event types, all valid"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.b.json"), r#"{"name":"a.b","description":"x","payload_schema":{"type":"nonsense"}}"#).unwrap();
    let bad = tidings().args(["registry", "check", "--registry", dir.path().to_str().unwrap()]).output().await.unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("a.b.json"), "names the file: {}", String::from_utf8_lossy(&bad.stderr));
}

/// `tidings token`, run with the settings the server reads (the secret
/// and the audience from the environment), prints a token the server
/// accepts, with the grants asked for and nothing more; a secret shorter
/// than 32 bytes is refused by the command and by the server.
async fn token_mints_what_the_server_accepts(backend: Backend) {
    let secret = "a-secret-for-the-token-command-of-32-bytes";
    let (mut envs, _dir) = process_store(backend).await;
    envs.extend([("TIDINGS_JWT_HS256_SECRET", secret.to_owned()), ("TIDINGS_JWT_AUDIENCE", "tidings-test".to_owned())]);
    let port = free_port();
    let server = spawn_process_at(&envs, port).await;
    let mint = |args: &[&str]| {
        let mut cmd = tidings();
        cmd.arg("token").args(args).env("TIDINGS_JWT_HS256_SECRET", secret).env("TIDINGS_JWT_AUDIENCE", "tidings-test");
        async move {
            let out = cmd.output().await.unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        }
    };
    let http = reqwest::Client::new();
    let publish = |token: String, event_type: &str| {
        let request = http
            .post(format!("{}/v1/events", server.base))
            .bearer_auth(token)
            .json(&serde_json::json!({"event_type": event_type, "payload": {}}));
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let publisher = mint(&["persona:mendel", "--publish", "hypothesis.*", "--ttl", "10m"]).await;
    let (status, body) = publish(publisher.clone(), "hypothesis.created").await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = publish(publisher, "comment.posted").await;
    assert_eq!((status, body["error"].as_str()), (403, Some("forbidden_event_type")), "only the grants asked for: {body}");
    // Admin rights: publishing for another agent.
    let as_other = |token: String| {
        let request = http.post(format!("{}/v1/events", server.base)).bearer_auth(token).json(
            &serde_json::json!({"event_type": "hypothesis.created", "payload": {}, "agent": {"id": "persona:other", "kind": "ai_persona"}}),
        );
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(as_other(mint(&["ops", "--publish", "**", "--admin"]).await).await, 201, "an admin publishes for another agent");
    assert_eq!(as_other(mint(&["ops", "--publish", "**"]).await).await, 403, "without --admin, agent_spoofing");
    // A token for another audience is not.
    let other = tidings()
        .args(["token", "persona:mendel", "--publish", "hypothesis.*"])
        .env("TIDINGS_JWT_HS256_SECRET", secret)
        .env("TIDINGS_JWT_AUDIENCE", "another-service")
        .output()
        .await
        .unwrap();
    let (status, _) = publish(String::from_utf8(other.stdout).unwrap().trim().to_owned(), "hypothesis.created").await;
    assert_eq!(status, 401, "a token for another audience is refused");
    drop(server);
    // 31 bytes: the command refuses to mint, the server to start.
    let short = "a-secret-of-thirty-one-bytes-xx";
    assert_eq!(short.len(), 31);
    let out = tidings().args(["token", "someone"]).env("TIDINGS_JWT_HS256_SECRET", short).output().await.unwrap();
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 32 bytes"), "{}", String::from_utf8_lossy(&out.stderr));
    let mut cmd = crate::helpers::process_command(&envs, 0);
    cmd.env("TIDINGS_JWT_HS256_SECRET", short);
    let output = tokio::time::timeout(Duration::from_secs(20), cmd.output()).await.unwrap().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("at least 32 bytes"), "{}", String::from_utf8_lossy(&output.stderr));
}

/// `tidings tail --token` sends the token as a header: it is in no URL,
/// so in no log line of the server and no error of its own; a refusal
/// shows the server's code and message and is not retried; `--agents`
/// follows one agent's events only.
async fn tail_sends_its_token_as_a_header_and_says_what_went_wrong(backend: Backend) {
    use crate::helpers::tokens::token;
    use tokio::io::AsyncBufReadExt as _;
    let (mut envs, _dir) = process_store(backend).await;
    envs.extend([("TIDINGS_JWT_HS256_SECRET", crate::helpers::tokens::SECRET.to_owned()), ("TIDINGS_LOG", "debug".to_owned())]);
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let server = spawn_process_at(&envs, port).await;
    let grants = serde_json::json!({"publish": ["**"], "subscribe": ["**"]});
    let (a, b) = (token("persona:a", grants.clone()), token("persona:b", grants));
    let expired = crate::helpers::tokens::token_with(
        serde_json::json!({"sub": "persona:a", "exp": chrono::Utc::now().timestamp() - 600, "subscribe": ["**"]}),
        crate::helpers::tokens::SECRET,
    );
    let refused = tokio::time::timeout(Duration::from_secs(20), tidings().args(["tail", "--url", &url, "--token", &expired]).output())
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a refusal is not retried: {stderr}");
    assert!(stderr.contains("401: unauthorized (the token is not valid: it has expired)"), "the server's code and message: {stderr}");
    assert!(!stderr.contains(&expired), "the token is in no error: {stderr}");
    let mut tail = tidings()
        .args(["tail", "--url", &url, "--token", &a, "--agents", "persona:a", "--json", "--count", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let http = reqwest::Client::new();
    crate::helpers::eventually("tail's stream is open", || async {
        let deep: Value = http.get(format!("{url}/health/deep")).send().await.unwrap().json().await.unwrap();
        deep["events"]["in_flight_subscriptions"] == 1
    })
    .await;
    let mut ids = Vec::new();
    for t in [&b, &a] {
        let r = http
            .post(format!("{url}/v1/events"))
            .bearer_auth(t)
            .json(&serde_json::json!({"event_type": "comment.posted"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        ids.push(r.json::<Value>().await.unwrap()["event_ids"][0].as_i64().unwrap());
    }
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.unwrap().unwrap().unwrap();
    let printed: Value = serde_json::from_str(&line).unwrap();
    assert_eq!((printed["event_id"].as_i64(), printed["agent"]["id"].as_str()), (Some(ids[1]), Some("persona:a")), "{line}");
    assert!(tail.wait().await.unwrap().success());
    let logs = server.kill_and_log().await;
    assert!(logs.contains("/v1/stream"), "the stream's request was logged:\n{logs}");
    for secret in [&a, &expired] {
        assert!(!logs.contains(secret.as_str()), "a token reached the server's log");
    }
    assert!(!logs.contains("access_token"), "no token in a URL:\n{logs}");
}

/// With the server down and standard error a pipe (a service manager, a
/// log), `tidings tail` says what goes wrong and when it retries, in
/// words: no spinner that draws nothing, no nanoseconds, no "error sending
/// request".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_without_a_terminal_says_it_retries() {
    use tokio::io::AsyncBufReadExt as _;
    let url = format!("http://127.0.0.1:{}", free_port());
    let mut tail = tidings().args(["tail", "--url", &url, "--token", "a-token-never-shown"]).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(tail.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    while said.len() < 2 {
        let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await.expect("a line within 10 s").unwrap().unwrap();
        said.push(line);
    }
    tail.kill().await.unwrap();
    for line in &said {
        assert!(line.starts_with("tidings tail: cannot connect: "), "{said:?}");
        assert!(line.to_lowercase().contains("connection refused"), "{said:?}");
        let delay = line.rsplit_once("retrying in ").map(|(_, d)| d).unwrap_or_default();
        assert!(delay.ends_with(" s") && delay.trim_end_matches(" s").parse::<f64>().is_ok(), "{said:?}");
        assert!(!line.contains("error sending request") && !line.contains("a-token-never-shown") && !line.contains(&url), "{said:?}");
    }
}

/// `tidings health` (the container's HEALTHCHECK): 0 while the server
/// answers `/health`, 1 with the reason when nothing answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_whether_the_server_answers() {
    let dir = tempfile::tempdir().unwrap();
    let server = crate::helpers::spawn_process(&[("TIDINGS_DATA_DIR", dir.path().display().to_string())]).await;
    let ok = tidings().args(["health", "--url", &server.base]).output().await.unwrap();
    assert!(ok.status.success() && String::from_utf8_lossy(&ok.stdout).contains("/health: 200"));
    let ready = tidings().args(["health", "--ready", "--url", &server.base]).output().await.unwrap();
    assert!(ready.status.success() && String::from_utf8_lossy(&ready.stdout).contains("/health/ready: 200"));
    let down = tidings().args(["health", "--url", &format!("http://127.0.0.1:{}", free_port())]).output().await.unwrap();
    assert!(!down.status.success());
    assert!(String::from_utf8_lossy(&down.stderr).contains("cannot connect"), "{}", String::from_utf8_lossy(&down.stderr));
}
