//! Publishing you can retry: `Idempotency-Key` on `POST /v1/events`. A
//! retry after an answer that never arrived stores nothing more and gets
//! the original ids; the same key with another body is refused; keys of two
//! publishers never meet; concurrent attempts with one key (one group
//! commit, or several) store once; a key is forgotten after its window
//! (pruning itself is in the store conformance suite).

use std::ops::ControlFlow;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::tokens::{SECRET, token};
use crate::helpers::{Backend, TestApp, answer_dropping_proxy, gather, spawn_app, spawn_app_with};

both_stores!(
    a_retry_after_a_lost_answer_stores_once,
    a_key_with_another_body_is_refused,
    keys_of_two_publishers_do_not_collide,
    concurrent_attempts_with_one_key_store_once,
    malformed_keys_are_refused_and_store_nothing,
    a_key_is_forgotten_after_its_window,
);

/// Publishes `body` with `key` (and a bearer token if given): status, the
/// `Idempotent-Replayed` header, the answer.
async fn publish_keyed(app: &TestApp, key: &str, body: &Value, bearer: Option<&str>) -> (u16, Option<String>, Value) {
    let mut request = app.http.post(app.url("/v1/events")).header("idempotency-key", key).json(body);
    if let Some(t) = bearer {
        request = request.bearer_auth(t);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_owned());
    (status, replayed, response.json().await.unwrap_or(Value::Null))
}

async fn a_retry_after_a_lost_answer_stores_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = json!({"events": [{"event_type": "comment.posted", "payload": {"n": 1}}, {"event_type": "comment.edited"}]});
    let proxy = answer_dropping_proxy(app.base.trim_start_matches("http://").parse().unwrap(), 1).await;
    let lost =
        reqwest::Client::new().post(format!("http://{proxy}/v1/events")).header("idempotency-key", "retry-1").json(&body).send().await;
    assert!(lost.is_err(), "the publisher never saw an answer: {lost:?}");
    assert_eq!(app.head().await, 2, "the lost attempt committed");

    // The publisher cannot know that; it retries with the same key. (The
    // metrics are the test process's: other tests count too.)
    let replays = app.metric("tidings_publish_idempotent_replays_total").await;
    let (status, replayed, answer) = publish_keyed(&app, "retry-1", &body, None).await;
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer, json!({"event_ids": [1, 2]}), "the original ids");
    assert_eq!(replayed.as_deref(), Some("true"));
    assert_eq!(app.head().await, 2, "the retry stored nothing");
    assert!(app.metric("tidings_publish_idempotent_replays_total").await >= replays + 1.0);

    // Streams see each event once.
    app.publish("comment.deleted", json!({})).await;
    let mut stream = app.stream("?since=0", None).await;
    assert_eq!(stream.ids(3).await, vec![1, 2, 3]);

    // A new key is a new publish.
    let (status, replayed, answer) = publish_keyed(&app, "retry-2", &body, None).await;
    assert_eq!((status, replayed, answer), (201, None, json!({"event_ids": [4, 5]})));
}

async fn a_key_with_another_body_is_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, _, _) = publish_keyed(&app, "k", &json!({"event_type": "comment.posted", "payload": {"n": 1}}), None).await;
    assert_eq!(status, 201);
    let (status, replayed, answer) = publish_keyed(&app, "k", &json!({"event_type": "comment.posted", "payload": {"n": 2}}), None).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["error"], "idempotency_key_reused");
    assert_eq!(replayed, None);
    assert_eq!(app.head().await, 1, "the refusal stored nothing");
    // The key still answers its own body.
    let (status, replayed, answer) = publish_keyed(&app, "k", &json!({"event_type": "comment.posted", "payload": {"n": 1}}), None).await;
    assert_eq!((status, replayed.as_deref(), answer), (201, Some("true"), json!({"event_ids": [1]})));
}

async fn keys_of_two_publishers_do_not_collide(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(SECRET.into())).await;
    let alice = token("alice", json!({"publish": ["comment.*"]}));
    let bob = token("bob", json!({"publish": ["comment.*"]}));
    let body = json!({"event_type": "comment.posted"});
    let (status, replayed, answer) = publish_keyed(&app, "same-key", &body, Some(&alice)).await;
    assert_eq!((status, replayed, answer), (201, None, json!({"event_ids": [1]})));
    let (status, replayed, answer) = publish_keyed(&app, "same-key", &body, Some(&bob)).await;
    assert_eq!((status, replayed, answer), (201, None, json!({"event_ids": [2]})), "bob's key is his own");
    // Another body under bob's key is bob's problem, not alice's.
    let (status, _, answer) = publish_keyed(&app, "same-key", &json!({"event_type": "comment.edited"}), Some(&bob)).await;
    assert_eq!((status, &answer["error"]), (422, &json!("idempotency_key_reused")));
    let (status, replayed, answer) = publish_keyed(&app, "same-key", &body, Some(&alice)).await;
    assert_eq!((status, replayed.as_deref(), answer), (201, Some("true"), json!({"event_ids": [1]})));
    assert_eq!(app.head().await, 2);
}

async fn concurrent_attempts_with_one_key_store_once(backend: Backend) {
    // A group delay gathers the attempts into one group commit (members of
    // one group with one key), and more attempts land in later groups.
    let app = spawn_app_with(backend, |s| s.publish.publish_group_delay = std::time::Duration::from_millis(20)).await;
    let body = json!({"event_type": "comment.posted", "payload": {"text": "once"}});
    let other = json!({"event_type": "comment.posted", "payload": {"text": "other"}});
    let attempts: Vec<_> = (0..16)
        .map(|i| {
            let (http, url) = (app.http.clone(), app.url("/v1/events"));
            let body = if i == 5 { other.clone() } else { body.clone() };
            tokio::spawn(async move {
                let r = http.post(url).header("idempotency-key", "together").json(&body).send().await.unwrap();
                let replayed = r.headers().contains_key("idempotent-replayed");
                (i, r.status().as_u16(), replayed, r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let mut stored = Vec::new();
    let mut answers = Vec::new();
    for attempt in attempts {
        let (i, status, replayed, answer) = attempt.await.unwrap();
        if status == 201 && !replayed {
            stored.push(i);
        }
        answers.push((i, status, answer));
    }
    assert_eq!(stored.len(), 1, "exactly one attempt stored: {answers:?}");
    assert_eq!(app.head().await, 1);
    let first = answers.iter().find(|a| a.0 == stored[0]).unwrap().2.clone();
    for (i, status, answer) in &answers {
        // Attempt 5 sent another body: whichever body stored first, the
        // attempts with the other one are refused.
        if (*i == 5) != (stored[0] == 5) {
            assert_eq!((*status, &answer["error"]), (422, &json!("idempotency_key_reused")));
        } else {
            assert_eq!((*status, answer), (201, &first), "attempt {i}");
        }
    }
}

async fn malformed_keys_are_refused_and_store_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = json!({"event_type": "comment.posted"});
    for key in ["", "has space", &"k".repeat(256), "tab\there", "caf\u{e9}"] {
        let r = app.http.post(app.url("/v1/events")).header("idempotency-key", key.as_bytes()).json(&body).send().await.unwrap();
        let status = r.status().as_u16();
        let answer: Value = r.json().await.unwrap();
        assert_eq!((status, &answer["error"]), (400, &json!("invalid_idempotency_key")), "key {key:?}");
    }
    assert_eq!(app.head().await, 0, "no refusal stored anything");
    let longest = "k".repeat(255);
    let (status, _, _) = publish_keyed(&app, &longest, &body, None).await;
    assert_eq!(status, 201, "255 visible characters are a key");
}

async fn a_key_is_forgotten_after_its_window(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.history.idempotency_window = std::time::Duration::from_millis(300);
        s.history.retention_interval = std::time::Duration::from_millis(100);
    })
    .await;
    let body = json!({"event_type": "comment.posted"});
    let (status, _, answer) = publish_keyed(&app, "short-lived", &body, None).await;
    assert_eq!((status, answer), (201, json!({"event_ids": [1]})));
    // Retried until the key has expired: every retry before that is a
    // replay of id 1, the first after it a new publish.
    let (app, body) = (&app, &body);
    gather(
        std::time::Duration::from_secs(20),
        (),
        |_| "the key never expired".into(),
        |_| async move {
            let (status, replayed, answer) = publish_keyed(app, "short-lived", body, None).await;
            assert_eq!(status, 201);
            if replayed.is_none() {
                assert_eq!(answer, json!({"event_ids": [2]}), "a new publish once the window passed");
                return ControlFlow::Break(());
            }
            assert_eq!(answer, json!({"event_ids": [1]}));
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            ControlFlow::Continue(())
        },
    )
    .await;
}

/// Two processes on one PostgreSQL database: attempts with one key on
/// either store once (the key's row is claimed before the head row, so an
/// attempt waits for the other process's outcome rather than both storing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_on_two_servers_of_one_database_store_once() {
    let a = spawn_app(Backend::Postgres).await;
    let url = a.db_url.clone().unwrap();
    let b = spawn_app_with(Backend::Postgres, |s| s.database_url = Some(url)).await;
    for round in 0..5 {
        let key = format!("shared-{round}");
        let body = json!({"event_type": "comment.posted", "payload": {"round": round}});
        let attempts: Vec<_> = (0..12)
            .map(|i| {
                let app = if i % 2 == 0 { &a } else { &b };
                let (http, url, key, body) = (app.http.clone(), app.url("/v1/events"), key.clone(), body.clone());
                tokio::spawn(async move {
                    let r = http.post(url).header("idempotency-key", key).json(&body).send().await.unwrap();
                    (r.status().as_u16(), r.headers().contains_key("idempotent-replayed"), r.json::<Value>().await.unwrap())
                })
            })
            .collect();
        let mut answers = Vec::new();
        for attempt in attempts {
            answers.push(attempt.await.unwrap());
        }
        assert_eq!(answers.iter().filter(|(_, replayed, _)| !replayed).count(), 1, "one attempt stored: {answers:?}");
        assert!(answers.iter().all(|(status, _, answer)| *status == 201 && *answer == answers[0].2), "{answers:?}");
    }
    assert_eq!(a.head().await, 5, "one event per key");
}
