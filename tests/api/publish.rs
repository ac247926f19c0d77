//! `POST /v1/events`: accepted shapes, every refusal with its status and
//! code, nothing stored on refusal, and the server keeps serving.

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(single_and_batch, bad_input_stores_nothing, oversized_bodies_and_payloads);

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
        s.max_body = 4096;
        s.max_payload = 1024;
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
    let r = app.http.post(app.url("/v1/events")).body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))).send().await.unwrap();
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "body_too_large");
    assert_eq!(app.head().await, 0);
    app.publish("comment.posted", json!({})).await;
}
