//! W3C trace context at the doors events enter by (docs/tracing.md): a
//! `traceparent` (and `tracestate`) sent with `POST /v1/events` is stored
//! with every event of the request and delivered in each envelope, on a
//! stream, a poll and a WebSocket device; a tree write's change event
//! carries the writer's; a malformed one is refused with a stable code and
//! stores nothing. (MCP's `_meta` door: `clients/python/tests/test_mcp.py`.)

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::device::{self as ws, Key};
use crate::helpers::{Backend, TestApp, spawn_app};

both_stores!(
    a_publish_s_trace_context_travels_with_its_events,
    a_malformed_trace_context_stores_nothing,
    a_tree_write_s_change_event_carries_the_writer_s_trace,
);

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

async fn publish_traced(app: &TestApp, body: &Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request = app.http.post(app.url("/v1/events")).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let r = request.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn a_publish_s_trace_context_travels_with_its_events(backend: Backend) {
    let app = spawn_app(backend).await;
    let batch = json!({"events": [{"event_type": "comment.posted"}, {"event_type": "comment.edited"}]});
    let (status, body) = publish_traced(&app, &batch, &[("traceparent", PARENT), ("tracestate", STATE)]).await;
    assert_eq!(status, 201, "{body}");
    // Without a trace context, the envelope has no such field; a tracestate
    // without a traceparent means nothing and is not kept.
    let (status, _) = publish_traced(&app, &json!({"event_type": "comment.posted"}), &[]).await;
    assert_eq!(status, 201);
    let (status, _) = publish_traced(&app, &json!({"event_type": "comment.posted"}), &[("tracestate", STATE)]).await;
    assert_eq!(status, 201);
    // An empty header is none.
    let (status, _) = publish_traced(&app, &json!({"event_type": "comment.posted"}), &[("traceparent", ""), ("tracestate", "")]).await;
    assert_eq!(status, 201);

    let expect = |envelopes: &[Value]| {
        assert_eq!(envelopes.len(), 5, "{envelopes:?}");
        for e in &envelopes[..2] {
            assert_eq!((e["traceparent"].as_str(), e["tracestate"].as_str()), (Some(PARENT), Some(STATE)), "{e}");
        }
        for e in &envelopes[2..] {
            let fields = e.as_object().unwrap();
            assert!(!fields.contains_key("traceparent") && !fields.contains_key("tracestate"), "{e}");
        }
    };
    // A stream from the beginning.
    let mut stream = app.stream("?since=0", None).await;
    let mut streamed = Vec::new();
    for _ in 0..5 {
        streamed.push(serde_json::from_str::<Value>(&stream.next().await.data).unwrap());
    }
    expect(&streamed);
    // A poll.
    let page: Value = app.http.get(app.url("/v1/poll?since=0")).send().await.unwrap().json().await.unwrap();
    expect(page["events"].as_array().unwrap());
    // A WebSocket device catching up from 0.
    let mut client = ws::Client::connect(&app).await;
    let answer = client.auth(&Key::new(), json!({"device_id": "tracer", "cursor": 0, "filter": {"types": ["comment.*"]}})).await;
    assert!(answer["result"].is_object(), "{answer}");
    let page = client.call("sync.delta", json!({"device_id": "tracer", "since": 0, "limit": 10})).await;
    let items: Vec<Value> = page["result"]["items"].as_array().unwrap().iter().map(|i| i["event"].clone()).collect();
    expect(&items);
}

async fn a_malformed_trace_context_stores_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let one = json!({"event_type": "comment.posted"});
    let head = app.head().await;
    for (headers, code) in [
        (vec![("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7")], "invalid_traceparent"),
        (vec![("traceparent", "00-00000000000000000000000000000000-00f067aa0ba902b7-01")], "invalid_traceparent"),
        (vec![("traceparent", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")], "invalid_traceparent"),
        (vec![("traceparent", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01")], "invalid_traceparent"),
        (vec![("traceparent", PARENT), ("traceparent", PARENT)], "invalid_traceparent"),
        (vec![("traceparent", PARENT), ("tracestate", "Congo=x")], "invalid_tracestate"),
        (vec![("traceparent", PARENT), ("tracestate", "congo=")], "invalid_tracestate"),
        (vec![("traceparent", PARENT), ("tracestate", STATE), ("tracestate", STATE)], "invalid_tracestate"),
        (vec![("tracestate", "{}")], "invalid_tracestate"),
    ] {
        let (status, body) = publish_traced(&app, &one, &headers).await;
        assert_eq!((status, body["error"].as_str()), (400, Some(code)), "{headers:?}: {body}");
    }
    // A trace context is a header's, never the body's.
    let (status, body) = publish_traced(&app, &json!({"event_type": "comment.posted", "traceparent": PARENT}), &[]).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_event")), "{body}");
    assert_eq!(app.head().await, head, "no refused publish stored anything");
    assert_eq!(app.publish("comment.posted", json!({})).await, head + 1, "and the server goes on");
}

async fn a_tree_write_s_change_event_carries_the_writer_s_trace(backend: Backend) {
    let app = spawn_app(backend).await;
    let url = app.url("/v1/tree/notes/traced");
    let entity = json!({"type": "note", "data": {"v": 1}});
    // Refused: nothing written, no change event.
    let head = app.head().await;
    let r = app.http.put(&url).header("traceparent", "00-xyz").json(&entity).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_traceparent");
    assert_eq!(app.http.get(&url).send().await.unwrap().status(), 404);
    assert_eq!(app.head().await, head, "the refused write stored nothing");
    // A write and a deletion, each in its own trace.
    let deleting = "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-00";
    let r = app.http.put(&url).header("traceparent", PARENT).header("tracestate", STATE).json(&entity).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let r = app.http.delete(&url).header("traceparent", deleting).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let page: Value = app.http.get(app.url("/v1/poll?types=tree.*&since=0")).send().await.unwrap().json().await.unwrap();
    let changes: Vec<(&str, Option<&str>, Option<&str>)> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["event_type"].as_str().unwrap(), e["traceparent"].as_str(), e["tracestate"].as_str()))
        .collect();
    assert_eq!(changes, [("tree.created", Some(PARENT), Some(STATE)), ("tree.deleted", Some(deleting), None)]);
}
