//! `POST /v1/events`: accepted shapes, every refusal with its status and
//! code, nothing stored on refusal, and the server keeps serving.

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(
    single_and_batch,
    bad_input_stores_nothing,
    oversized_bodies_and_payloads,
    a_publish_whose_client_left_commits_and_is_counted,
    bodies_that_never_arrive_time_out,
    limits_on_batches_filters_and_poll_scans,
    concurrent_publishes_are_committed_together_with_gap_free_ids,
    strict_input_is_refused_with_where_and_stores_nothing,
    an_answer_names_where_its_publish_spent_its_time,
);

/// A `201`'s `Server-Timing` parts, in milliseconds, by name in order.
fn server_timing(r: &reqwest::Response) -> Vec<(String, f64)> {
    let header = r.headers().get("server-timing").expect("a 201 names its parts").to_str().unwrap();
    header
        .split(", ")
        .map(|part| {
            let (name, dur) = part.split_once(";dur=").unwrap_or_else(|| panic!("{header}"));
            (name.to_owned(), dur.parse().unwrap_or_else(|_| panic!("{header}")))
        })
        .collect()
}

/// Every `201` to an admin names its parts (docs/events.md, "Where a
/// publish's time goes"), in order; they add up to no more than the client
/// waited; the store's commit takes time; a replay names them too. Another
/// publisher's answer names none (a group's parts tell of others' traffic).
async fn an_answer_names_where_its_publish_spent_its_time(backend: Backend) {
    use crate::helpers::tokens::{SECRET, token};
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(SECRET.into())).await;
    let admin = token("ops", json!({"admin": true, "publish": ["**"]}));
    let publisher = token("alice", json!({"publish": ["comment.*"]}));
    let body = json!({"event_type": "comment.posted", "payload": {"text": "hi"}});
    let r = app.http.post(app.url("/v1/events")).bearer_auth(&publisher).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert!(r.headers().get("server-timing").is_none(), "only admins are told");
    for key in [None, Some("k-1"), Some("k-1")] {
        let mut request = app.http.post(app.url("/v1/events")).bearer_auth(&admin).json(&body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let sent = std::time::Instant::now();
        let r = request.send().await.unwrap();
        let waited = sent.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(r.status(), 201);
        let parts = server_timing(&r);
        let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["read", "admit", "queue", "commit", "wake"], "{key:?}");
        assert!(parts.iter().all(|(_, d)| *d >= 0.0), "{parts:?}");
        assert!(parts[3].1 > 0.0, "the store's commit takes time: {parts:?}");
        let sum: f64 = parts.iter().map(|(_, d)| d).sum();
        assert!(sum <= waited + 0.005, "the parts ({sum} ms) fit in the client's wait ({waited} ms): {parts:?}");
    }
    // A refusal names nothing: no part of it was a publish.
    let r = app.http.post(app.url("/v1/events")).bearer_auth(&admin).json(&json!({"event_type": "Not A Name"})).send().await.unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.headers().get("server-timing").is_none());
}

async fn single_and_batch(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, body) = app
        .post_events(&json!({
            "event_type": "link.cites.added",
            "ref": "paper:p-1",
            "agent": {"id": "persona:mendel", "kind": "ai_persona"},
            "session_id": "s-1",
            "occurred_at": "2026-05-01T12:34:56Z",
            "payload": {"source": "paper:p-1", "target": "paper:p-123"},
            "links": [{"rel": "target", "ref": "paper:p-123"}],
            "visibility": "reviewer_only"
        }))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body, json!({"event_ids": [1]}));
    let (status, body) = app.post_events(&json!({"events": [{"event_type": "comment.posted"}, {"event_type": "comment.edited"}]})).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body, json!({"event_ids": [2, 3]}));

    let mut s = app.stream("?since=0", None).await;
    let first: Value = serde_json::from_str(&s.next().await.data).unwrap();
    assert_eq!(
        first,
        json!({
            "envelope_version": 1, "event_id": 1, "event_type": "link.cites.added", "ref": "paper:p-1",
            "agent": {"id": "persona:mendel", "kind": "ai_persona"}, "session_id": "s-1",
            "occurred_at": "2026-05-01T12:34:56Z",
            "payload": {"source": "paper:p-1", "target": "paper:p-123"},
            "links": [{"rel": "target", "ref": "paper:p-123"}], "visibility": "reviewer_only"
        })
    );
    let second: Value = serde_json::from_str(&s.next().await.data).unwrap();
    assert_eq!(second["payload"], json!({}));
    assert_eq!(second["ref"], Value::Null);
    assert!(second["occurred_at"].is_string());
}

async fn bad_input_stores_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    app.publish("comment.posted", json!({})).await;
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("not json", "{\"event_type\":".into(), 400, "malformed_json"),
        ("array body", "[1,2]".into(), 400, "invalid_event"),
        ("missing type", json!({"payload": {}}).to_string(), 400, "invalid_event"),
        ("type not a string", json!({"event_type": 5}).to_string(), 400, "invalid_event"),
        ("payload not an object", json!({"event_type": "comment.posted", "payload": [1]}).to_string(), 400, "invalid_event"),
        ("unknown field", json!({"event_type": "comment.posted", "refs": "x"}).to_string(), 400, "invalid_event"),
        ("server-owned id", json!({"event_type": "comment.posted", "event_id": 9}).to_string(), 400, "invalid_event"),
        ("bad visibility", json!({"event_type": "comment.posted", "visibility": "secret"}).to_string(), 400, "invalid_event"),
        ("bad time", json!({"event_type": "comment.posted", "occurred_at": "yesterday"}).to_string(), 400, "invalid_event"),
        ("agent without id", json!({"event_type": "comment.posted", "agent": {"kind": "x"}}).to_string(), 400, "invalid_event"),
        ("empty agent id", json!({"event_type": "comment.posted", "agent": {"id": ""}}).to_string(), 400, "invalid_event"),
        ("bad link", json!({"event_type": "comment.posted", "links": [{"rel": "x"}]}).to_string(), 400, "invalid_event"),
        ("empty batch", json!({"events": []}).to_string(), 400, "invalid_event"),
        ("events not a list", json!({"events": {}}).to_string(), 400, "invalid_event"),
        ("uppercase name", json!({"event_type": "Comment.Posted"}).to_string(), 422, "invalid_event_name"),
        ("one segment", json!({"event_type": "comment"}).to_string(), 422, "invalid_event_name"),
        ("empty segment", json!({"event_type": "a..b"}).to_string(), 422, "invalid_event_name"),
        ("glob as name", json!({"event_type": "comment.*"}).to_string(), 422, "invalid_event_name"),
        // All-or-nothing: the first event is fine, the second is not.
        (
            "batch with one bad",
            json!({"events": [{"event_type": "comment.posted"}, {"event_type": "Bad"}]}).to_string(),
            422,
            "invalid_event_name",
        ),
    ];
    for (what, body, status, code) in cases {
        let (got_status, got) = app.post_raw(body).await;
        assert_eq!(got_status, status, "{what}: {got}");
        assert_eq!(got["error"], code, "{what}: {got}");
        assert!(got["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: a message explains it");
    }
    assert_eq!(app.head().await, 1, "refused requests store nothing");
    assert_eq!(app.http.get(app.url("/health")).send().await.unwrap().status(), 200);
    assert_eq!(app.publish("comment.posted", json!({})).await, 2, "and the server keeps serving");
    // Unknown routes and methods answer JSON too.
    let r = app.http.get(app.url("/v1/nope")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "not_found");
    let r = app.http.delete(app.url("/v1/events")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "method_not_allowed");
}

async fn oversized_bodies_and_payloads(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.http.max_body = 4096;
        s.publish.max_payload = 1024;
    })
    .await;
    let big = "x".repeat(2000);
    let (status, body) = app.post_events(&json!({"event_type": "comment.posted", "payload": {"body": big}})).await;
    assert_eq!((status, body["error"].as_str()), (413, Some("payload_too_large")), "{body}");
    let huge = "x".repeat(8000);
    let (status, body) = app.post_events(&json!({"event_type": "comment.posted", "payload": {"body": huge}})).await;
    assert_eq!((status, body["error"].as_str()), (413, Some("body_too_large")), "{body}");
    // Without a Content-Length (chunked), the limit still holds.
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> =
        vec![Ok(bytes::Bytes::from(format!("{{\"event_type\":\"comment.posted\",\"payload\":{{\"b\":\"{huge}\"}}}}")))];
    let body = reqwest::Body::wrap_stream(futures_util::stream::iter(chunks));
    let r = app.http.post(app.url("/v1/events")).header("content-type", "application/json").body(body).send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "body_too_large");
    assert_eq!(app.head().await, 0);
    app.publish("comment.posted", json!({})).await;
}

/// A publish whose client closes its socket before the answer is not cut
/// off: it commits whole and is counted (events and the 201) when it
/// commits. The real binary, since metrics are per process.
async fn a_publish_whose_client_left_commits_and_is_counted(backend: Backend) {
    use tokio::io::AsyncWriteExt as _;
    let dir = tempfile::tempdir().unwrap();
    let mut envs = vec![("TIDINGS_DATA_DIR", dir.path().display().to_string())];
    if backend == Backend::Postgres {
        envs.push(("DATABASE_URL", crate::helpers::fresh_database().await.0));
    }
    let server = crate::helpers::spawn_process(&envs).await;
    let addr = server.base.trim_start_matches("http://").to_owned();
    const BATCH: usize = 3000;
    const BATCHES: usize = 3;
    let one = json!({"event_type": "comment.posted", "payload": {"text": "x".repeat(200)}});
    let body = json!({ "events": vec![one; BATCH] }).to_string();
    for _ in 0..BATCHES {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST /v1/events HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(body.as_bytes()).await.unwrap();
        // Gone at once (the whole request was sent): no answer is read.
        drop(socket);
    }
    let http = reqwest::Client::new();
    let total = (BATCH * BATCHES) as f64;
    let value = |text: &str, prefix: &str| -> f64 {
        text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
    };
    let mut last = String::new();
    for _ in 0..400 {
        let deep: Value = http.get(format!("{}/health/deep", server.base)).send().await.unwrap().json().await.unwrap();
        let metrics = http.get(format!("{}/metrics", server.base)).send().await.unwrap().text().await.unwrap();
        let published = value(&metrics, "tidings_events_published_total{type=\"comment.posted\"}");
        let answered = value(&metrics, "tidings_http_requests_total{route=\"/v1/events\",status=\"201\"}");
        last = format!("head {} published {published} answered {answered}", deep["head_event_id"]);
        if deep["head_event_id"] == total as i64 && published == total && answered == BATCHES as f64 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("every publish commits whole and is counted once committed; last seen: {last}");
}

/// A body announced but never (fully) sent holds its connection only for
/// `TIDINGS_BODY_TIMEOUT`: a short Content-Length, a chunk larger than its
/// data, an endless chunk size and a trickle each get `408 body_timeout`
/// (JSON, connection closed), and nothing is stored; on `POST /mcp` too.
async fn bodies_that_never_arrive_time_out(backend: Backend) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = spawn_app_with(backend, |s| s.http.body_timeout = std::time::Duration::from_millis(300)).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    // The MCP endpoint reads its body under the same limits.
    let head = |path: &str, framing: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{framing}\r\n\r\n"
        )
    };
    let mut cases = Vec::new();
    for path in ["/v1/events", "/mcp"] {
        cases.extend([
            ("short content-length", head(path, "Content-Length: 100"), "{\"event_type\": \"comment.posted\"".to_owned(), false),
            ("chunk larger than its data", head(path, "Transfer-Encoding: chunked"), "64\r\n{\"event_type\":".to_owned(), false),
            ("endless chunk size", head(path, "Transfer-Encoding: chunked"), "ffffffffffffffff\r\n{".to_owned(), false),
            ("trickle", head(path, "Content-Length: 40"), "{\"event_type\": \"comment.posted\"}".to_owned(), true),
        ]);
    }
    for (what, head, body, trickle) in cases {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        socket.write_all(head.as_bytes()).await.unwrap();
        let started = std::time::Instant::now();
        if trickle {
            // One byte every 100 ms: never idle for long, never done in time.
            let (mut reader, mut writer) = socket.split();
            let mut answer = Vec::new();
            for b in body.bytes() {
                if writer.write_all(&[b]).await.is_err() {
                    break;
                }
                if let Ok(Ok(n)) = tokio::time::timeout(std::time::Duration::from_millis(100), reader.read_buf(&mut answer)).await
                    && n == 0
                {
                    break;
                }
                if !answer.is_empty() {
                    break;
                }
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), reader.read_to_end(&mut answer)).await;
            check(what, &answer, started);
            continue;
        }
        socket.write_all(body.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(5), socket.read_to_end(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer and no close within 5 s"))
            .unwrap();
        check(what, &answer, started);
    }
    assert_eq!(app.head().await, 0, "nothing was stored");
    // The server keeps serving.
    assert_eq!(app.post_events(&json!({"event_type": "comment.posted"})).await.0, 201);
}

fn check(what: &str, answer: &[u8], started: std::time::Instant) {
    let text = String::from_utf8_lossy(answer);
    assert!(text.starts_with("HTTP/1.1 408 "), "{what}: {text}");
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    assert_eq!(
        serde_json::from_str::<Value>(body).ok().and_then(|v| v["error"].as_str().map(str::to_owned)).as_deref(),
        Some("body_timeout"),
        "{what}: {text}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(4), "{what}: answered within the deadline's reach");
}

/// `TIDINGS_MAX_BATCH`, `TIDINGS_MAX_FILTER_LIST` and `TIDINGS_POLL_MAX_SCAN`
/// hold: a batch over the limit is `413 batch_too_large` storing nothing, a
/// filter list over the limit is `400 invalid_filter` on stream and poll,
/// and a sparse poll stops at the scan bound with `has_more` and the scan
/// position.
async fn limits_on_batches_filters_and_poll_scans(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.publish.max_batch = 3;
        s.filters.max_filter_list = 2;
        s.poll.poll_max_scan = 5;
        s.streams.read_batch = 5;
    })
    .await;
    let one = json!({"event_type": "flag.raised"});
    let (status, body) = app.post_events(&json!({"events": [one, one, one, one]})).await;
    assert_eq!((status, body["error"].as_str()), (413, Some("batch_too_large")), "{body}");
    assert_eq!(app.head().await, 0, "nothing stored");
    for path in ["/v1/stream?types=a.b,c.d,e.f", "/v1/poll?types=a.b,c.d,e.f"] {
        let r = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 400, "{path}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_filter", "{path}");
    }
    // Twelve non-matching events, then a match: one poll scans at most 5 rows.
    for _ in 0..4 {
        assert_eq!(app.post_events(&json!({"events": [one, one, one]})).await.0, 201);
    }
    let wanted = app.publish("comment.posted", json!({})).await;
    let page: Value = app.http.get(app.url("/v1/poll?since=0&types=comment.posted")).send().await.unwrap().json().await.unwrap();
    assert_eq!(page["events"], json!([]), "{page}");
    assert_eq!(page["has_more"], true, "{page}");
    assert_eq!(page["next_since"], 5, "the scan position: {page}");
    // Following next_since reaches the match.
    let mut since = 5;
    let mut found = Vec::new();
    for _ in 0..5 {
        let page: Value =
            app.http.get(app.url(&format!("/v1/poll?since={since}&types=comment.posted"))).send().await.unwrap().json().await.unwrap();
        found.extend(page["events"].as_array().unwrap().iter().map(|e| e["event_id"].as_i64().unwrap()));
        since = page["next_since"].as_i64().unwrap();
        if page["has_more"] == false {
            break;
        }
    }
    assert_eq!(found, vec![wanted]);
    // /health/deep reports the state and the broker's lag.
    let (status, deep) = app.deep().await;
    assert_eq!((status, deep["status"].as_str(), deep["head_event_id"].as_i64()), (200, Some("ok"), Some(wanted)), "{deep}");
    assert!(deep["events"]["broker_lag_ms"].is_u64(), "{deep}");
    // The broker reads the log on its wake-up (on PostgreSQL a NOTIFY, which
    // a loaded machine delivers a little later): its position reaches the
    // head (bounded wait).
    let mut tries = 0;
    loop {
        let (_, deep) = app.deep().await;
        if deep["broker_position"] == wanted {
            break;
        }
        tries += 1;
        assert!(tries < 200, "the broker reaches the head: {deep}");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

async fn concurrent_publishes_are_committed_together_with_gap_free_ids(backend: Backend) {
    // A group waits up to 300 ms for company, so the concurrent requests
    // below share commits (a lone publish would not wait: nothing else is
    // queued when it arrives).
    let server = crate::helpers::federation::Server::start_with(backend, &[("TIDINGS_PUBLISH_GROUP_DELAY", "300ms")]).await;
    let before = server.head().await;
    let url = format!("{}/v1/events", server.base());
    let requests = (0..32).map(|i| {
        let (http, url) = (server.http.clone(), url.clone());
        async move {
            // Every fourth request is invalid: refused before it joins a
            // group, and its neighbours are committed all the same.
            let event_type = if i % 4 == 3 { "Not A Name" } else { "comment.posted" };
            let body = json!({"events": [{"event_type": event_type, "payload": {"n": i, "k": 0}}, {"event_type": "comment.posted", "payload": {"n": i, "k": 1}}]});
            let r = http.post(&url).json(&body).send().await.unwrap();
            let queued = if r.status() == 201 { server_timing(&r)[2].1 } else { 0.0 };
            (i, r.status().as_u16(), r.json::<Value>().await.unwrap(), queued)
        }
    });
    let answers = futures_util::future::join_all(requests).await;
    // The first member of a group waited the group's delay for company,
    // and its answer's `queue` part says so.
    let longest = answers.iter().map(|a| a.3).fold(0.0, f64::max);
    assert!(longest >= 250.0, "a publish waited 300 ms for its group: {longest} ms");
    let answers: Vec<_> = answers.into_iter().map(|(i, status, body, _)| (i, status, body)).collect();
    let mut ids = Vec::new();
    let mut expected = std::collections::BTreeMap::new();
    for (i, status, body) in &answers {
        if i % 4 == 3 {
            assert_eq!(*status, 422, "{body}");
            assert_eq!(body["error"], "invalid_event_name", "{body}");
            continue;
        }
        assert_eq!(*status, 201, "{body}");
        let got: Vec<i64> = body["event_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1], got[0] + 1, "a request's events are consecutive: {got:?}");
        expected.insert(got[0], (*i, 0));
        expected.insert(got[1], (*i, 1));
        ids.extend(got);
    }
    ids.sort_unstable();
    let want: Vec<i64> = (before + 1..=before + 48).collect();
    assert_eq!(ids, want, "24 requests of 2 events: ids gap-free from the head, none twice");
    assert_eq!(server.head().await, before + 48, "the refused requests stored nothing");
    // The log holds each event under the id its request was answered with.
    let r: Value =
        server.http.get(format!("{}/v1/poll?since={before}&limit=100", server.base())).send().await.unwrap().json().await.unwrap();
    for event in r["events"].as_array().unwrap() {
        let id = event["event_id"].as_i64().unwrap();
        let (i, k) = expected[&id];
        assert_eq!((event["payload"]["n"].as_i64(), event["payload"]["k"].as_i64()), (Some(i), Some(k)), "{event}");
    }
    assert_eq!(r["events"].as_array().unwrap().len(), 48);
    assert!(server.metric("tidings_publish_group_events_count{kind=\"publish\"}").await >= 1.0, "requests were committed together");
}

/// Strict input everywhere: a query parameter an endpoint does not take
/// (`type`, a typo of `types`, would otherwise stream everything), a JSON
/// key given twice (on publish, poll, the tree, MCP and the WebSocket), and
/// a value of the wrong type are refused with their usual codes, each
/// naming where it is; nothing is stored and the server goes on serving.
async fn strict_input_is_refused_with_where_and_stores_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    for (path, hint) in [
        ("/v1/stream?type=a.b", "did you mean `types`?"),
        ("/v1/poll?sinse=0", "did you mean `since`?"),
        ("/v1/poll?types=a.b&wait=5", "did you mean `wait_ms`?"),
        ("/v1/stream?x=1", "(it takes filter, types, agents, targets, since, accept_envelope, and access_token)"),
    ] {
        let r = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 400, "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "invalid_query", "{path}: {body}");
        assert!(body["message"].as_str().unwrap().contains(hint), "{path}: {body}");
    }
    let r = app.http.get(app.url("/v1/poll?types=a.b&access_token=ignored-with-auth-off")).send().await.unwrap();
    assert_eq!(r.status(), 200, "access_token is taken everywhere");
    let raw = |path: &str, body: &'static str| {
        app.http
            .post(app.url(path))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body)
            .send()
    };
    for (path, body, code, place) in [
        ("/v1/events", r#"{"event_type":"a.b","event_type":"c.d"}"#, "malformed_json", "event_type: the key is given twice"),
        (
            "/v1/events",
            r#"{"events":[{"event_type":"a.b","payload":{"n":1,"n":2}}]}"#,
            "malformed_json",
            "events[0].payload.n: the key is given twice",
        ),
        ("/v1/events", r#"{"event_type":5}"#, "invalid_event", "event_type: invalid type: integer `5`, expected a string"),
        (
            "/v1/events",
            r#"{"events":[{"event_type":"a.b"},{"event_type":"a.b","agent":{"kind":"human"}}]}"#,
            "invalid_event",
            "events[1]: agent: missing field `id`",
        ),
        ("/v1/poll", r#"{"since":0,"since":5}"#, "invalid_poll", "since: the key is given twice"),
        (
            "/mcp",
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"publish","arguments":{"events":[{"event_type":"a.b","event_type":"c.d"}]}}}"#,
            "invalid_mcp_message",
            "params.arguments.events[0].event_type: the key is given twice",
        ),
    ] {
        let r = raw(path, body).await.unwrap();
        let status = r.status();
        let answer: Value = r.json().await.unwrap();
        assert_eq!((status.as_u16(), answer["error"].as_str()), (400, Some(code)), "{path} {body}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains(place), "{path} {body}: {answer}");
    }
    let put = app
        .http
        .put(app.url("/v1/tree/notes/a"))
        .header("content-type", "application/json")
        .body(r#"{"data":{"x":1,"x":2}}"#)
        .send()
        .await
        .unwrap();
    let status = put.status();
    let answer: Value = put.json().await.unwrap();
    assert_eq!(status, 400, "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("data.x: the key is given twice"), "{answer}");
    assert_eq!(app.head().await, 0, "nothing was stored");
    app.publish("a.b", json!({})).await;
}
