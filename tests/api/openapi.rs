//! `/openapi.json` describes every route and every error code.

use serde_json::Value;

use crate::both_stores;
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(schemathesis_finds_no_disagreement, delivered_frames_match_the_document);

/// One store: the document and the routing are built before, and apart
/// from, the store (the route probes only need answers, not data).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_error_code_is_documented() {
    let app = spawn_app(Backend::Embedded).await;
    let doc: Value = app.http.get(app.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 12);
    // Paths are OpenAPI templates (`{path}`), never axum's `{*path}`.
    for path in paths.keys() {
        assert!(!path.contains("{*"), "{path} is not an OpenAPI path template");
    }
    assert!(paths.contains_key("/v1/tree/{path}"), "the tree routes are documented as /v1/tree/{{path}}");
    // Every documented operation is served (a real route, not the fallback).
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            let url = app.url(&path.replace("{id}", "some-id"));
            let r = app.http.request(method.to_uppercase().parse().unwrap(), url).send().await.unwrap();
            let status = r.status().as_u16();
            // Only a 404 body is read: a stream's body never ends.
            let fallback = status == 404 && r.json::<Value>().await.unwrap_or(Value::Null)["error"] == "not_found";
            assert!(status != 405 && !fallback, "{method} {path} is routed ({status})");
        }
    }
    // Every route is registered through the annotated handlers: the router
    // has no plain `.route(`, so nothing can be served without being documented.
    let http_mod = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/crates/server/src/http/mod.rs")).unwrap();
    assert!(!http_mod.contains(".route("), "routes are added with routes!(...) only");
    // Every error code the HTTP layer can answer appears in the document:
    // those HTTP builds itself, and every code of the service layer's typed
    // refusals (the arms of their `code()`, and the field refusals).
    let text = doc.to_string();
    let codes = source_codes();
    assert!(codes.len() > 25, "the scan found the error codes: {codes:?}");
    for c in codes {
        assert!(text.contains(&format!("`{c}`")), "error code {c} is documented");
    }
}

/// schemathesis (every check; the exceptions, each a rule no JSON Schema can
/// state, are in `tests/schemathesis/schemathesis.toml`) finds no request
/// the document and the server disagree on: nothing schema-valid refused,
/// nothing schema-invalid accepted, every answer documented, JSON and of
/// its documented shape. The stream is left out (its answer never ends; its
/// frames are checked below), and so is the WebSocket upgrade (what
/// follows it is not HTTP; `ws.rs` tests it with a WebSocket client). On the embedded store every phase runs; on
/// PostgreSQL all but the boundary-value coverage phase (the document and
/// its checks are the same; the whole run costs 90 s on a debug build).
async fn schemathesis_finds_no_disagreement(backend: Backend) {
    let schemathesis = std::env::var("TIDINGS_TEST_SCHEMATHESIS")
        .expect("TIDINGS_TEST_SCHEMATHESIS is not set: run the suite with scripts/test, which installs schemathesis");
    // Short polls, small batches: the generated requests stay quick.
    let app = spawn_app_with(backend, |s| {
        s.poll.poll_max_wait = std::time::Duration::from_millis(200);
        s.publish.max_batch = 16;
    })
    .await;
    let phases = match backend {
        Backend::Embedded => "examples,coverage,fuzzing,stateful",
        Backend::Postgres => "examples,fuzzing,stateful",
    };
    // Its example database and reports go to a directory of its own.
    let work = tempfile::tempdir().unwrap();
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/schemathesis/schemathesis.toml");
    let run = tokio::process::Command::new(schemathesis)
        .current_dir(work.path())
        .args(["--no-color", "--config-file", config, "run", &app.url("/openapi.json")])
        .args(["--max-examples", "30", "--generation-deterministic", "--phases", phases])
        .args(["--exclude-path", "/v1/stream", "--exclude-path", "/v1/ws", "--request-timeout", "10"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(600), run).await.expect("schemathesis finishes").unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "schemathesis found disagreements:\n{report}{}", String::from_utf8_lossy(&out.stderr));
    assert!(report.contains(" passed"), "schemathesis ran test cases:\n{report}");
}

/// What the server delivers has the shapes the document gives: poll events
/// and stream frames are `Envelope`s, and the `system.replay_gap` notice
/// matches its schema in `StreamFrames`.
async fn delivered_frames_match_the_document(backend: Backend) {
    let app = spawn_app(backend).await;
    let doc: Value = app.http.get(app.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    let schemas = &doc["components"]["schemas"];
    let envelope = jsonschema::validator_for(&schemas["Envelope"]).unwrap();
    let gap = jsonschema::validator_for(&schemas["StreamFrames"]["properties"]["system.replay_gap"]).unwrap();
    app.publish("comment.posted", serde_json::json!({"n": 1})).await;
    let full = serde_json::json!({"event_type": "paper.cited", "ref": "paper:p1", "agent": {"id": "a", "kind": "human"}, "session_id": "s",
        "payload": {"x": [1]}, "links": [{"rel": "cites", "ref": "paper:p2"}], "visibility": "public"});
    assert_eq!(app.post_events(&full).await.0, 201);
    let page: Value = app.http.get(app.url("/v1/poll?since=0")).send().await.unwrap().json().await.unwrap();
    let events = page["events"].as_array().unwrap();
    assert_eq!(events.len(), 2);
    for event in events {
        assert!(
            envelope.is_valid(event),
            "{event} is an Envelope: {:?}",
            envelope.iter_errors(event).map(|e| e.to_string()).collect::<Vec<_>>()
        );
    }
    let mut stream = app.stream("", Some(0)).await;
    let frame: Value = serde_json::from_str(&stream.next().await.data).unwrap();
    assert!(envelope.is_valid(&frame), "a stream frame is an Envelope: {frame}");
    // A resume point beyond the head is a gap notice first.
    let mut stream = app.stream("", Some(1000)).await;
    let notice = stream.next().await;
    assert_eq!(notice.event.as_deref(), Some("system.replay_gap"));
    let data: Value = serde_json::from_str(&notice.data).unwrap();
    assert!(gap.is_valid(&data), "{data} matches system.replay_gap");
}

/// Every error code the HTTP layer can answer, from the source: those HTTP
/// builds itself, and every code of the service layer's typed refusals
/// (the arms of their `code()`, and the field refusals).
pub(crate) fn source_codes() -> std::collections::BTreeSet<String> {
    let code = regex::Regex::new(
        r#"(?:bad_request|unprocessable|too_large|forbidden|InvalidField::new|parse_cursor\([^,]+,)\(?\s*"([a-z_]+)"|StatusCode::[A-Z_]+,\s*"([a-z_]+)"|=> "([a-z_]+)",?\n"#,
    )
    .unwrap();
    let mut codes = std::collections::BTreeSet::new();
    let dirs =
        [concat!(env!("CARGO_MANIFEST_DIR"), "/crates/server/src/http"), concat!(env!("CARGO_MANIFEST_DIR"), "/crates/server/src/service")];
    for entry in dirs.iter().flat_map(|d| std::fs::read_dir(d).unwrap()) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let source = std::fs::read_to_string(&path).unwrap();
            for c in code.captures_iter(&source) {
                codes.insert(c.get(1).or(c.get(2)).or(c.get(3)).unwrap().as_str().to_owned());
            }
        }
    }
    codes
}
