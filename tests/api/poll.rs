//! `GET|POST /v1/poll` and durable consumers (docs/polling.md): paging,
//! long-poll, durable replay, cursor rules, expiry, operator endpoints and
//! bad input.

use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with};

both_stores!(
    paging_walks_the_stream,
    long_poll_returns_on_the_first_match,
    a_durable_consumer_replays_what_it_has_not_confirmed,
    cursor_rules,
    expiry_answers_410,
    operators_and_bad_input,
    a_resume_point_the_log_cannot_serve_is_a_gap,
    a_repeated_parameter_is_a_json_refusal,
    bodies_are_objects_and_query_filters_combine
);

async fn get(app: &TestApp, query: &str) -> (u16, Value) {
    let r = app.http.get(app.url(&format!("/v1/poll?{query}"))).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn post(app: &TestApp, path: &str, body: Value) -> (u16, Value) {
    let r = app.http.post(app.url(path)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn ids(answer: &Value) -> Vec<i64> {
    answer["events"].as_array().unwrap().iter().map(|e| e["event_id"].as_i64().unwrap()).collect()
}

async fn paging_walks_the_stream(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut matching = Vec::new();
    for i in 0..10 {
        matching.push(app.publish("comment.posted", json!({"i": i})).await);
        app.publish("flag.raised", json!({})).await; // filtered out
    }
    let (mut since, mut seen, mut pages) = (0, Vec::<i64>::new(), 0);
    loop {
        let (status, page) = get(&app, &format!("types=comment.posted&since={since}&limit=4")).await;
        assert_eq!(status, 200, "{page}");
        let got = ids(&page);
        assert!(got.len() <= 4);
        assert!(page["events"].as_array().unwrap().iter().all(|e| e["envelope_version"] == 1 && e["event_type"] == "comment.posted"));
        seen.extend(&got);
        since = page["next_since"].as_i64().unwrap();
        pages += 1;
        if !page["has_more"].as_bool().unwrap() {
            break;
        }
        assert_eq!(since, *got.last().unwrap(), "next_since is the last event returned");
    }
    assert_eq!(pages, 3, "4 + 4 + 2");
    assert_eq!(seen, matching, "nothing missed or repeated");
    // The POST form with the same filter as JSON is equivalent.
    let (status, page) = post(&app, "/v1/poll", json!({"filter": {"types": ["comment.posted"]}, "since": 0, "limit": 100})).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(ids(&page), matching);
    assert_eq!(page["has_more"], false);
}

async fn long_poll_returns_on_the_first_match(backend: Backend) {
    let app = std::sync::Arc::new(spawn_app(backend).await);
    let waiting = {
        let app = app.clone();
        tokio::spawn(async move {
            let answer = get(&app, "types=comment.posted&wait_ms=10000").await;
            (answer, std::time::Instant::now())
        })
    };
    // Non-matching events once the poll is registered: they do not end the
    // wait (the poll is still waiting well after them)...
    crate::helpers::wait_until("the poll to register", Duration::from_secs(30), Duration::ZERO, || async { app.clients().await != 0 })
        .await;
    app.publish("flag.raised", json!({})).await;
    app.publish("flag.raised", json!({})).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "non-matching events do not end the wait");
    // ...and a match ends it at once.
    let id = app.publish("comment.posted", json!({})).await;
    let published = std::time::Instant::now();
    let ((status, page), answered) = waiting.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(ids(&page), vec![id], "only the matching event");
    assert_eq!(page["next_since"], id);
    let after = answered.saturating_duration_since(published);
    assert!(after < Duration::from_secs(1), "it returned on the match, {after:?} after it was published");
}

/// Durable replay (docs/polling.md): register a consumer, disconnect, emit
/// 100 events, resume: the 100 missed events arrive in order from the
/// cursor.
async fn a_durable_consumer_replays_what_it_has_not_confirmed(backend: Backend) {
    let app = spawn_app(backend).await;
    app.publish("comment.posted", json!({})).await; // history before registration
    let (status, first) = get(&app, "consumer_id=ticker-prism-prod-1&types=comment.*").await;
    assert_eq!(status, 200);
    assert!(ids(&first).is_empty(), "a new consumer starts at the head");
    let mut emitted = Vec::new();
    for i in 0..100 {
        emitted.push(app.publish("comment.posted", json!({"i": i})).await);
    }
    // Resume with the consumer id alone: stored filter, stored cursor.
    let (status, page) = get(&app, "consumer_id=ticker-prism-prod-1&limit=1000").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(ids(&page), emitted, "the 100 missed events, in order");
    assert_eq!(page["has_more"], false);
}

async fn cursor_rules(backend: Backend) {
    let app = std::sync::Arc::new(spawn_app(backend).await);
    let (status, _) = get(&app, "consumer_id=c1").await;
    assert_eq!(status, 200);
    let mut all = Vec::new();
    for _ in 0..60 {
        all.push(app.publish("comment.posted", json!({})).await);
    }
    // Ack 50, then 10: the cursor stays at 50.
    assert_eq!(
        post(&app, "/v1/consumers/c1/ack", json!({"cursor": all[49]})).await,
        (200, json!({"consumer_id": "c1", "cursor": all[49]}))
    );
    assert_eq!(post(&app, "/v1/consumers/c1/ack", json!({"cursor": all[9]})).await.1["cursor"], all[49]);
    let (_, page) = get(&app, "consumer_id=c1&limit=1000").await;
    assert_eq!(ids(&page), all[50..].to_vec(), "resumes after 50");
    // Returning events does not move the cursor: the same poll again gives the same.
    let (_, again) = get(&app, "consumer_id=c1&limit=1000").await;
    assert_eq!(ids(&again), all[50..].to_vec());
    // A poll with since confirms up to it.
    let (_, page) = get(&app, &format!("consumer_id=c1&since={}", all[54])).await;
    assert_eq!(ids(&page), all[55..].to_vec());
    let (_, page) = get(&app, "consumer_id=c1").await;
    assert_eq!(ids(&page), all[55..].to_vec(), "since was confirmed");
    // Ack past the head is clamped: the next new event is still delivered.
    let head = app.head().await;
    assert_eq!(post(&app, "/v1/consumers/c1/ack", json!({"cursor": head + 1000})).await.1["cursor"], head);
    let next = app.publish("comment.posted", json!({})).await;
    let (_, page) = get(&app, "consumer_id=c1").await;
    assert_eq!(ids(&page), vec![next]);
    // Concurrent acks from two tasks end at the max.
    let head = app.head().await;
    let tasks: Vec<_> = (0..2)
        .map(|t| {
            let app = app.clone();
            tokio::spawn(async move {
                for c in (0..=head).filter(|c| c % 2 == t) {
                    let (status, _) = post(&app, "/v1/consumers/c1/ack", json!({"cursor": c})).await;
                    assert_eq!(status, 200);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let list: Value = app.http.get(app.url("/v1/consumers")).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["consumers"][0]["cursor"], head);
    assert_eq!(list["consumers"][0]["lag"], 0);
}

async fn expiry_answers_410(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.poll.consumer_ttl = Duration::from_millis(300)).await;
    assert_eq!(get(&app, "consumer_id=sleepy").await.0, 200);
    let id = app.publish("comment.posted", json!({})).await;
    // Collected by the sweep (or on access) after 300 ms of silence.
    crate::helpers::wait_until("the consumer to be collected", Duration::from_secs(5), Duration::from_millis(25), || async {
        let list: Value = app.http.get(app.url("/v1/consumers")).send().await.unwrap().json().await.unwrap();
        list["consumers"].as_array().unwrap().is_empty()
    })
    .await;
    let (status, body) = get(&app, "consumer_id=sleepy").await;
    assert_eq!((status, body["error"].as_str()), (410, Some("cursor_expired")), "{body}");
    let (status, body) = post(&app, "/v1/consumers/sleepy/ack", json!({"cursor": 1})).await;
    assert_eq!((status, body["error"].as_str()), (410, Some("cursor_expired")));
    // With since it starts afresh.
    let (status, page) = get(&app, "consumer_id=sleepy&since=0").await;
    assert_eq!(status, 200);
    assert_eq!(ids(&page), vec![id]);
    assert_eq!(get(&app, "consumer_id=sleepy").await.0, 200, "and is a live consumer again");
}

async fn operators_and_bad_input(backend: Backend) {
    let app = spawn_app(backend).await;
    app.publish("comment.posted", json!({})).await;
    assert_eq!(get(&app, "consumer_id=ops-1&since=0&types=comment.*").await.0, 200);
    app.publish("comment.posted", json!({})).await;
    let list: Value = app.http.get(app.url("/v1/consumers")).send().await.unwrap().json().await.unwrap();
    let c = &list["consumers"][0];
    assert_eq!((c["consumer_id"].as_str(), c["cursor"].as_i64(), c["lag"].as_i64()), (Some("ops-1"), Some(0), Some(2)));
    assert_eq!(c["filter"], json!({"types": ["comment.*"]}));
    assert!(c["last_activity"].as_str().unwrap().ends_with('Z'));

    for (query, code) in [
        ("since=-1", "invalid_since"),
        ("since=abc", "invalid_since"),
        ("limit=0", "invalid_limit"),
        ("limit=x", "invalid_limit"),
        ("limit=-3", "invalid_limit"),
        ("wait_ms=-5", "invalid_wait_ms"),
        ("wait_ms=soon", "invalid_wait_ms"),
        ("types=a..b", "invalid_filter"),
        ("filter=%7B%22payload%22%3A%7B%22nope%22%3A1%7D%7D", "invalid_filter"),
        ("consumer_id=no%20spaces", "invalid_consumer_id"),
        ("consumer_id=ops-1&types=a..b", "invalid_filter"),
    ] {
        let (status, body) = get(&app, query).await;
        assert_eq!((status, body["error"].as_str()), (400, Some(code)), "{query}: {body}");
    }
    for (body, code) in [
        (json!({"since": -1}), "invalid_since"),
        (json!({"since": "5"}), "invalid_since"),
        (json!({"limit": 1.5}), "invalid_limit"),
        (json!({"filter": {"types": "x"}}), "invalid_filter"),
        (json!({"sinse": 1}), "invalid_poll"),
    ] {
        let (status, answer) = post(&app, "/v1/poll", body.clone()).await;
        assert_eq!((status, answer["error"].as_str()), (400, Some(code)), "{body}: {answer}");
    }
    for body in [json!({"cursor": "x"}), json!({"cursor": -1}), json!({})] {
        let (status, answer) = post(&app, "/v1/consumers/ops-1/ack", body.clone()).await;
        assert_eq!((status, answer["error"].as_str()), (400, Some("invalid_cursor")), "{body}");
    }
    assert_eq!(post(&app, "/v1/consumers/nobody/ack", json!({"cursor": 1})).await.1["error"], "consumer_not_found");
    // Nothing changed by the refusals: the consumer's filter and cursor stand.
    let list: Value = app.http.get(app.url("/v1/consumers")).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["consumers"][0]["cursor"], 0);
    assert_eq!(list["consumers"][0]["filter"], json!({"types": ["comment.*"]}));
    // limit is capped, not refused.
    let (status, page) = get(&app, "since=0&limit=5000").await;
    assert_eq!((status, ids(&page).len()), (200, 2));
    // Delete.
    assert_eq!(app.http.delete(app.url("/v1/consumers/ops-1")).send().await.unwrap().status(), 204);
    let r = app.http.delete(app.url("/v1/consumers/ops-1")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

/// A poll gets the signal a stream gets for a resume point the log cannot
/// serve gap-free: `gap` beyond the head (and `next_since` never passes the
/// head), and `gap` when history before it was pruned.
async fn a_resume_point_the_log_cannot_serve_is_a_gap(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.history.retention = tidings_server::config::Retention { max_age: None, max_events: Some(5) };
        s.history.retention_interval = Duration::from_millis(50);
    })
    .await;
    let first = app.publish("comment.posted", json!({})).await;
    for wait in ["", "&wait_ms=100"] {
        let (status, page) = get(&app, &format!("since=1000{wait}")).await;
        assert_eq!(status, 200);
        assert_eq!(page["events"], json!([]));
        assert_eq!(page["next_since"], first, "never beyond the head: {page}");
        assert_eq!(page["gap"], json!({"requested": 1000, "available_from": 1, "head": first, "reason": "beyond_head"}), "{page}");
    }
    let (_, page) = get(&app, "since=0").await;
    assert_eq!(ids(&page), vec![first]);
    assert!(page.get("gap").is_none(), "no gap when the log serves it: {page}");
    // Pruned history: the gap says where delivery resumes.
    let mut all = vec![first];
    for _ in 0..9 {
        all.push(app.publish("comment.posted", json!({})).await);
    }
    crate::helpers::wait_until("retention to prune to the last 5 events", Duration::from_secs(5), Duration::from_millis(25), || async {
        app.deep().await.1["history_from"] == all[5]
    })
    .await;
    let (_, page) = get(&app, "since=0&limit=100").await;
    assert_eq!(page["gap"], json!({"requested": 0, "available_from": all[5], "head": all[9], "reason": "pruned"}), "{page}");
    assert_eq!(ids(&page), all[5..].to_vec());
}

/// A parameter given twice is ambiguous: refused with a JSON `400
/// invalid_query` (never axum's plain-text refusal, never last-wins), on
/// polls and streams alike.
async fn a_repeated_parameter_is_a_json_refusal(backend: Backend) {
    let app = spawn_app(backend).await;
    for path in [
        "/v1/poll?since=1&since=2",
        "/v1/poll?limit=1&limit=2",
        "/v1/poll?types=a.b&types=c.d",
        "/v1/stream?since=1&since=2",
        "/v1/stream?types=a.b&types=c.d",
    ] {
        let r = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 400, "{path}");
        assert_eq!(r.headers()["content-type"], "application/json", "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "invalid_query", "{path}: {body}");
        assert!(body["message"].as_str().unwrap().contains("is given twice"), "{path}: {body}");
    }
}

/// What `/openapi.json` says of requests holds: a body is a JSON object
/// (serde alone would take an array of the fields), `5.0` is an integer, a
/// malformed `If-Match` is refused, and the query's comma lists add to a
/// `filter=` JSON (a payload rule with a type pattern).
async fn bodies_are_objects_and_query_filters_combine(backend: Backend) {
    let app = spawn_app(backend).await;
    let post = |path: &str, body: &str| {
        let r = app.http.post(app.url(path)).header("content-type", "application/json").body(body.to_owned()).send();
        async move {
            let r = r.await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, body) = post("/v1/poll", "[null, null]").await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_poll")), "{body}");
    let (status, body) = post("/v1/events", r#"{"events": [["comment.posted"]]}"#).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_event")), "{body}");
    assert_eq!(app.head().await, 0, "nothing stored");
    let r = app.http.put(app.url("/v1/tree/notes/a")).json(&json!(["note", {}])).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r =
        app.http.put(app.url("/v1/tree/notes/a")).header("if-match", "{}").json(&json!({"type": "note", "data": {}})).send().await.unwrap();
    assert_eq!(r.status(), 400, "a malformed If-Match");
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_condition");
    let (status, body) = post("/v1/poll", r#"{"since": 0.0, "limit": 5.0, "wait_ms": 0.0}"#).await;
    assert_eq!(status, 200, "integral numbers are integers: {body}");
    let (status, body) = post("/v1/poll", r#"{"limit": 5.5}"#).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_limit")), "{body}");

    for (event_type, n) in [("comment.posted", 1), ("comment.posted", 2), ("paper.cited", 1)] {
        app.publish(event_type, json!({"n": n})).await;
    }
    let filter = r#"{"payload": {"==": [{"var": "n"}, 1]}}"#;
    let query = format!("since=0&types=comment.*&filter={}", form_urlencoded::byte_serialize(filter.as_bytes()).collect::<String>());
    let (status, page) = get(&app, &query).await;
    assert_eq!(status, 200, "{page}");
    let got: Vec<(&str, i64)> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["event_type"].as_str().unwrap(), e["payload"]["n"].as_i64().unwrap()))
        .collect();
    assert_eq!(got, [("comment.posted", 1)], "the rule and the type pattern both apply");
}
