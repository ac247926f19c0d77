//! A path subscription's life: limits with chain-error markers (events,
//! rate, duration, total), renewal, capacity redirects, restarts and
//! SIGKILL, concurrent writers, token expiry, retention, forged changes.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::both_stores;
use crate::helpers::federation::*;
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with};

both_stores!(
    max_events_delivers_exactly_n_then_terminates,
    rate_limit_drops_with_markers,
    the_rate_window_survives_a_restart,
    max_duration_ends_a_subscription_at_commit_time,
    too_many_subscriptions_refuses_new_ones_only,
    renewal_and_capacity_redirect,
    a_renewal_applies_its_terms,
    subscriptions_survive_a_restart,
    concurrent_writers_lose_and_repeat_nothing,
    an_expired_deliver_token_ends_the_subscription,
    retention_prunes_entities_no_longer_needed,
    notifications_survive_sigkill_exactly_once,
    changes_and_notifications_cannot_be_forged,
    redirects_list_at_most_ten_shuffled_alternatives,
);

/// Writes `n` versions to `path` under one chain id.
async fn write_n(app: &TestApp, path: &str, from: u64, n: u64, chain: &str) {
    for i in from..from + n {
        put(app, path, json!({"v": i}), Some(chain)).await;
    }
}

async fn max_events_delivers_exactly_n_then_terminates(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let (a, witness) = (Peer::new(), Peer::new());
    let (_, body) = subscribe(&app, &server, &a, "feed/*", "system/inbox/shared", json!({"limits": {"max_events": 2}})).await;
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    assert_eq!(body["result"]["limits"], json!({"max_events": 2}));
    // An unlimited subscription to the same inbox: its notifications show
    // where in the log the limited one stopped.
    let (_, body) = subscribe(&app, &server, &witness, "feed/*", "system/inbox/shared", json!({})).await;
    let witness_id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    let mut stream = inbox(&app, "system/inbox/shared").await;
    write_n(&app, "feed/a", 1, 2, "chain-ok").await;
    write_n(&app, "feed/a", 3, 1, "chain-over").await;
    write_n(&app, "feed/a", 4, 2, "chain-after").await;
    // Within one change subscriptions fire in id order, so read up to the
    // witness's notification of a change after the one that terminated.
    let mut limited = 0;
    let mut witnessed = 0;
    while witnessed < 5 {
        let n = next_notification(&mut stream).await;
        if n["data"]["subscription_id"] == id.as_str() {
            limited += 1;
        } else {
            assert_eq!(n["data"]["subscription_id"], witness_id.as_str());
            witnessed += 1;
        }
    }
    assert_eq!(limited, 2, "max_events delivers exactly N");
    assert_eq!(tree_status(&app, &format!("system/subscription/{id}")).await, 404, "the subscription was terminated");
    let markers = children(&app, &format!("system/runtime/chain-errors/lost/chain-over/{id}/max_events_reached")).await;
    assert_eq!(markers.len(), 1, "the suppressed change bound one marker");
    assert!(markers[0].starts_with("sha256:"));
    let marker: Value = app
        .http
        .get(app.url(&format!("/v1/tree/system/runtime/chain-errors/lost/chain-over/{id}/max_events_reached/{}", markers[0])))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!((marker["data"]["reason"].as_str(), marker["data"]["uri"].as_str()), (Some("max_events_reached"), Some("feed/a")));
    assert!(children(&app, "system/runtime/chain-errors/lost/chain-after").await.is_empty(), "a terminated subscription is silent");
}

async fn rate_limit_drops_with_markers(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let (a, witness) = (Peer::new(), Peer::new());
    let (_, body) = subscribe(&app, &server, &a, "ticks/*", "system/inbox/ticks", json!({"limits": {"rate_limit": 2}})).await;
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    subscribe(&app, &server, &witness, "ticks/*", "system/inbox/ticks", json!({})).await;
    let mut stream = inbox(&app, "system/inbox/ticks").await;
    write_n(&app, "ticks/t", 0, 5, "burst").await;
    let (mut limited, mut witnessed) = (0, 0);
    while witnessed < 5 {
        let n = next_notification(&mut stream).await;
        if n["data"]["subscription_id"] == id.as_str() { limited += 1 } else { witnessed += 1 }
    }
    assert_eq!(limited, 2, "2 per minute");
    let markers = children(&app, &format!("system/runtime/chain-errors/lost/burst/{id}/rate_limited")).await;
    assert_eq!(markers.len(), 3, "each dropped notification bound a marker: {markers:?}");
    assert_eq!(tree_status(&app, &format!("system/subscription/{id}")).await, 200, "rate_limit does not terminate");
}

/// The rate_limit window is committed with the engine's cursor: after a
/// restart within the minute, a subscription that used its rate is still
/// limited (a fresh window would deliver again).
async fn the_rate_window_survives_a_restart(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let (a, witness) = (Peer::new(), Peer::new());
    let (_, body) = subscribe(&app, &server, &a, "beat/*", "system/inbox/beat", json!({"limits": {"rate_limit": 2}})).await;
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    subscribe(&app, &server, &witness, "beat/*", "system/inbox/beat", json!({})).await;
    let mut stream = inbox(&app, "system/inbox/beat").await;
    write_n(&app, "beat/t", 0, 2, "before").await;
    let mut limited = 0;
    for _ in 0..4 {
        if next_notification(&mut stream).await["data"]["subscription_id"] == id.as_str() {
            limited += 1;
        }
    }
    assert_eq!(limited, 2, "the rate is used up");
    drop(stream);
    let app = app.restart().await;
    let mut stream = app.stream("?types=subscription.notification&targets=system/inbox/beat", Some(app.head().await)).await;
    write_n(&app, "beat/t", 2, 1, "after").await;
    // The witness's notification commits in the same step as the limited
    // one's verdict.
    let n = next_notification(&mut stream).await;
    assert_ne!(n["data"]["subscription_id"], id.as_str(), "the limited subscription got a third notification within the minute");
    let markers = children(&app, &format!("system/runtime/chain-errors/lost/after/{id}/rate_limited")).await;
    assert_eq!(markers.len(), 1, "the change after the restart was dropped by the rate: {markers:?}");
}

/// `max_duration_ms` end to end: changes committed within the duration are
/// delivered; the first change after it is suppressed with a
/// `max_duration_reached` marker and the subscription deleted.
async fn max_duration_ends_a_subscription_at_commit_time(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let (a, witness) = (Peer::new(), Peer::new());
    let duration = 1_500;
    let (_, body) = subscribe(&app, &server, &a, "span/*", "system/inbox/span", json!({"limits": {"max_duration_ms": duration}})).await;
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    subscribe(&app, &server, &witness, "span/*", "system/inbox/span", json!({})).await;
    let entity: Value = app.http.get(app.url(&format!("/v1/tree/system/subscription/{id}"))).send().await.unwrap().json().await.unwrap();
    let created_at = entity["data"]["created_at"].as_i64().unwrap();
    let mut stream = inbox(&app, "system/inbox/span").await;
    write_n(&app, "span/t", 0, 1, "within").await;
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(next_notification(&mut stream).await["data"]["subscription_id"].as_str().unwrap().to_owned());
    }
    assert!(got.contains(&id), "a change within the duration is delivered: {got:?}");
    // The limit is about time itself: wait until the duration has passed
    // on the server's clock (the entity's created_at), with a margin.
    let left = created_at + duration + 200 - chrono::Utc::now().timestamp_millis();
    if left > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(left as u64)).await;
    }
    write_n(&app, "span/t", 1, 1, "past").await;
    let n = next_notification(&mut stream).await;
    assert_ne!(n["data"]["subscription_id"], id.as_str(), "no delivery after max_duration_ms");
    let markers = children(&app, &format!("system/runtime/chain-errors/lost/past/{id}/max_duration_reached")).await;
    assert_eq!(markers.len(), 1, "the change past the duration bound a marker: {markers:?}");
    assert_eq!(tree_status(&app, &format!("system/subscription/{id}")).await, 404, "and ended the subscription");
}

/// `TIDINGS_MAX_SUBSCRIPTIONS`: at the limit a new subscription is refused
/// (`503 too_many_subscriptions`, nothing stored) while renewals pass; an
/// unsubscribe makes room.
async fn too_many_subscriptions_refuses_new_ones_only(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.federation.max_subscriptions = 2).await;
    let server = server_hash(&app).await;
    let (a, b, c) = (Peer::new(), Peer::new(), Peer::new());
    assert_eq!(subscribe(&app, &server, &a, "full/*", "system/inbox/a", json!({})).await.0, 200);
    let (_, body) = subscribe(&app, &server, &b, "full/*", "system/inbox/b", json!({})).await;
    let b_id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    let (status, body) = subscribe(&app, &server, &c, "other/*", "system/inbox/c", json!({})).await;
    assert_eq!((status, code(&body)), (503, "too_many_subscriptions"), "{body}");
    assert_eq!(children(&app, "system/subscription").await.len(), 2, "nothing stored");
    let (status, body) = subscribe(&app, &server, &a, "full/*", "system/inbox/a", json!({})).await;
    assert_eq!((status, &body["result"]["renewed"]), (200, &json!(true)), "a renewal is not a new subscription: {body}");
    assert_eq!(unsubscribe(&app, &b, &b_id).await.0, 200);
    assert_eq!(subscribe(&app, &server, &c, "other/*", "system/inbox/c", json!({})).await.0, 200, "room again");
}

async fn renewal_and_capacity_redirect(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.federation.max_subscribers_per_prefix = 2).await;
    let server = server_hash(&app).await;
    let (a, b, c) = (Peer::new(), Peer::new(), Peer::new());
    let at = |n: u8| format!("http://127.0.0.1:{}", 9000 + n as u16);
    let (_, first) = subscribe_as_mirror(&app, &server, &a, "hot/**", "a", &at(1), &at(1)).await;
    let id = first["result"]["subscription_id"].as_str().unwrap().to_owned();
    let (status, second) = subscribe_as_mirror(&app, &server, &b, "hot/**", "b", &at(2), &at(2)).await;
    assert_eq!(status, 200, "{second}");
    let b_id = second["result"]["subscription_id"].as_str().unwrap().to_owned();
    // At capacity: a redirect listing the current subscribers as relays
    // (the mirrors among them, at their known endpoints), never the
    // requester.
    let (status, body) = subscribe(&app, &server, &c, "hot/**", "system/inbox/c", json!({})).await;
    assert_eq!(status, 303, "{body}");
    let redirect = &body["result"];
    assert_eq!(redirect["type"], "system/subscription/redirect");
    assert_eq!((redirect["data"]["reason"].as_str(), redirect["data"]["prefix"].as_str()), (Some("at_capacity"), Some("hot/**")));
    assert_eq!(redirect["data"]["capacity"], 2);
    let alternatives: HashSet<(&str, &str)> = redirect["data"]["alternatives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["peer"].as_str().unwrap(), v["endpoint"].as_str().unwrap()))
        .collect();
    assert_eq!(alternatives, HashSet::from([(a.hash.as_str(), at(1).as_str()), (b.hash.as_str(), at(2).as_str())]));
    // A relay endpoint must be a URL.
    let (status, body) = subscribe(&app, &server, &c, "cold/**", "system/inbox/c", json!({"relay_endpoint": "not a url"})).await;
    assert_eq!((status, code(&body)), (400, "invalid_params"), "{body}");
    // Another prefix has room.
    assert_eq!(subscribe(&app, &server, &c, "cold/**", "system/inbox/c", json!({})).await.0, 200);
    // A renewal is not a new subscriber: same id, fresh token.
    let sub_url = app.url(&format!("/v1/tree/system/subscription/{id}"));
    let before: Value = app.http.get(&sub_url).send().await.unwrap().json().await.unwrap();
    let (status, renewed) = subscribe_as_mirror(&app, &server, &a, "hot/**", "a", &at(1), &at(1)).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["result"]["subscription_id"], id.as_str());
    assert_eq!(renewed["result"]["renewed"], true);
    let after: Value = app.http.get(&sub_url).send().await.unwrap().json().await.unwrap();
    assert_ne!(after["data"]["deliver_token"], before["data"]["deliver_token"], "the token rotated");
    assert_eq!(after["data"]["created_at"], before["data"]["created_at"]);
    assert_eq!(children(&app, "system/subscription").await.len(), 3, "no duplicate");
    // The capacity advertisement.
    let config: Value = app.http.get(app.url("/v1/tree/system/config/subscription")).send().await.unwrap().json().await.unwrap();
    assert_eq!(config["data"]["concern"], "subscription");
    assert_eq!(
        config["data"]["parameters"],
        json!({"max_subscribers_per_prefix": 2, "current_subscriber_prefixes": {"hot/**": 2, "cold/**": 1}})
    );
    // After an unsubscribe there is room again.
    assert_eq!(unsubscribe(&app, &b, &b_id).await.0, 200);
    assert_eq!(subscribe(&app, &server, &c, "hot/**", "system/inbox/c", json!({})).await.0, 200);
}

/// A renewal carries the whole request: new events, include_payload and
/// limits replace the stored ones (checked as for a new subscription), and
/// the engine delivers by them; the id and creation time stay.
async fn a_renewal_applies_its_terms(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let a = Peer::new();
    let (status, first) = subscribe(&app, &server, &a, "terms/*", "system/inbox/t", json!({"events": ["created"]})).await;
    assert_eq!(status, 200, "{first}");
    let id = first["result"]["subscription_id"].as_str().unwrap().to_owned();
    let sub_url = app.url(&format!("/v1/tree/system/subscription/{id}"));
    let before: Value = app.http.get(&sub_url).send().await.unwrap().json().await.unwrap();
    assert_eq!(before["data"]["include_payload"], false);
    let terms = json!({"events": ["created", "updated"], "include_payload": true, "limits": {"max_events": 5}});
    let (status, renewed) = subscribe(&app, &server, &a, "terms/*", "system/inbox/t", terms).await;
    assert_eq!(status, 200, "{renewed}");
    assert_eq!(renewed["result"]["subscription_id"], id.as_str());
    assert_eq!(renewed["result"]["renewed"], true);
    assert_eq!(renewed["result"]["events"], json!(["created", "updated"]));
    assert_eq!(renewed["result"]["limits"]["max_events"], 5);
    let stored: Value = app.http.get(&sub_url).send().await.unwrap().json().await.unwrap();
    assert_eq!(stored["data"]["events"], json!(["created", "updated"]));
    assert_eq!(stored["data"]["include_payload"], true);
    assert_eq!(stored["data"]["limits"], json!({"max_events": 5}));
    assert_eq!(stored["data"]["created_at"], before["data"]["created_at"]);
    // The engine delivers by the new terms: an update fires, with its payload.
    let mut stream = inbox(&app, "system/inbox/t").await;
    put(&app, "terms/x", json!({"v": 1}), None).await;
    put(&app, "terms/x", json!({"v": 2}), None).await;
    let created = next_notification(&mut stream).await;
    assert_eq!(created["data"]["event"], "created", "{created}");
    let updated = next_notification(&mut stream).await;
    assert_eq!(updated["data"]["event"], "updated", "{updated}");
    assert!(updated["included"].as_object().is_some_and(|m| !m.is_empty()), "the payload is bundled: {updated}");
}

async fn subscriptions_survive_a_restart(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let a = Peer::new();
    let (_, body) = subscribe(&app, &server, &a, "state/*", "system/inbox/r", json!({"limits": {"max_events": 3}})).await;
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    let mut stream = inbox(&app, "system/inbox/r").await;
    put(&app, "state/a", json!({"v": 1}), None).await;
    assert_eq!(next_notification(&mut stream).await["data"]["subscription_id"], id.as_str());
    drop(stream);
    let app = app.restart().await;
    assert_eq!(server_hash(&app).await, server, "the same server identity");
    let mut stream = app.stream("?types=subscription.notification&targets=system/inbox/r", Some(app.head().await)).await;
    put(&app, "state/a", json!({"v": 2}), None).await;
    let n = next_notification(&mut stream).await;
    assert_eq!((n["data"]["subscription_id"].as_str(), n["data"]["event"].as_str()), (Some(id.as_str()), Some("updated")));
    // The delivered count survived too: the third delivery is the last.
    put(&app, "state/a", json!({"v": 3}), None).await;
    assert_eq!(next_notification(&mut stream).await["data"]["subscription_id"], id.as_str());
    let mut gone = app.stream(&format!("?types=tree.deleted&targets=tree:system/subscription/{id}"), None).await;
    put(&app, "state/a", json!({"v": 4}), None).await;
    let deleted: Value = serde_json::from_str(&gone.next().await.data).unwrap();
    assert_eq!(deleted["payload"]["uri"], format!("system/subscription/{id}"));
}

async fn concurrent_writers_lose_and_repeat_nothing(backend: Backend) {
    let app = Arc::new(spawn_app(backend).await);
    let server = server_hash(&app).await;
    let a = Peer::new();
    let (_, body) = subscribe(&app, &server, &a, "race/x", "system/inbox/race", json!({})).await;
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    let mut stream = inbox(&app, "system/inbox/race").await;
    let mut changes = app.stream("?types=tree.*&targets=tree:race/x", None).await;
    let (writers, per_writer) = (4, 25);
    let mut tasks = Vec::new();
    for w in 0..writers {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < per_writer {
                let current = app.http.get(app.url("/v1/tree/race/x")).send().await.unwrap();
                let etag = current.headers().get("etag").map(|v| v.to_str().unwrap().to_owned());
                let mut r = app.http.put(app.url("/v1/tree/race/x")).json(&json!({"type": "note", "data": {"w": w, "i": done}}));
                r = match etag {
                    Some(e) => r.header("if-match", e),
                    None => r.header("if-none-match", "*"),
                };
                match r.send().await.unwrap().status().as_u16() {
                    200 | 201 => done += 1,
                    409 => {}
                    s => panic!("unexpected {s}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = writers * per_writer;
    // Commit order, from the change events.
    let mut committed = Vec::new();
    while committed.len() < total {
        let e = changes.next().await;
        if e.event.is_none() {
            let v: Value = serde_json::from_str(&e.data).unwrap();
            committed.push(v["payload"]["hash"].as_str().unwrap().to_owned());
        }
    }
    let mut previous: Option<String> = None;
    for (i, hash) in committed.iter().enumerate() {
        let n = next_notification(&mut stream).await;
        assert_eq!(n["data"]["subscription_id"], id.as_str());
        assert_eq!(n["data"]["hash"].as_str(), Some(hash.as_str()), "notification {i} follows commit order");
        assert_eq!(n["data"]["previous_hash"].as_str().map(str::to_owned), previous, "the chain is unbroken at {i}");
        previous = Some(hash.clone());
    }
    // Nothing more: the next notification on this inbox is a fresh write's.
    let last = put(&app, "race/x", json!({"final": true}), None).await;
    let n = next_notification(&mut stream).await;
    assert_eq!(n["data"]["hash"], last["hash"], "no duplicate before the sentinel");
}

async fn an_expired_deliver_token_ends_the_subscription(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let a = Peer::new();
    let expires_at = chrono::Utc::now().timestamp_millis() + 3_000;
    let mut included = Map::new();
    let token = a.grant_until(&server, inbox_grant("system/inbox/e"), expires_at, &mut included);
    let params = json!({"deliver_to": {"uri": "system/inbox/e"}, "deliver_token": token});
    let (status, body) =
        execute(&app, &Subscribe { author: &a, pattern: "exp/*", params, capability: None, included }.envelope("subscribe")).await;
    assert_eq!(status, 200, "{body}");
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    let mut stream = inbox(&app, "system/inbox/e").await;
    put(&app, "exp/a", json!({"v": 1}), None).await;
    assert_eq!(next_notification(&mut stream).await["data"]["subscription_id"], id.as_str());
    // Past the token's expiry (the server compares the change's commit time,
    // on this same clock), the next change ends the subscription instead.
    let wait = expires_at + 1 - chrono::Utc::now().timestamp_millis();
    if wait > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(wait as u64)).await;
    }
    let mut gone = app.stream(&format!("?types=tree.deleted&targets=tree:system/subscription/{id}"), None).await;
    put(&app, "exp/a", json!({"v": 2}), Some("late")).await;
    gone.next().await;
    assert_eq!(children(&app, &format!("system/runtime/chain-errors/lost/late/{id}/deliver_token_expired")).await.len(), 1);
}

/// Retention also drops stored entities that no path holds and no retained
/// change names; the current entities and subscription chains stay.
async fn retention_prunes_entities_no_longer_needed(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.history.retention = tidings_server::config::Retention { max_age: None, max_events: Some(3) };
        s.history.retention_interval = std::time::Duration::from_millis(50);
    })
    .await;
    let server = server_hash(&app).await;
    let a = Peer::new();
    let mut included = Map::new();
    let token = a.grant(&server, inbox_grant("system/inbox/p"), None, &mut included);
    let params = json!({"deliver_to": {"uri": "system/inbox/p"}, "deliver_token": token});
    let (status, _) =
        execute(&app, &Subscribe { author: &a, pattern: "kept/*", params, capability: None, included }.envelope("subscribe")).await;
    assert_eq!(status, 200);
    let old = put(&app, "pruned/x", json!({"v": 0}), None).await["hash"].as_str().unwrap().to_owned();
    // Later writes happen on a later millisecond than the first.
    let t0 = chrono::Utc::now().timestamp_millis();
    while chrono::Utc::now().timestamp_millis() < t0 + 2 {
        tokio::task::yield_now().await;
    }
    let mut current = String::new();
    for i in 1..10 {
        current = put(&app, "pruned/x", json!({"v": i}), None).await["hash"].as_str().unwrap().to_owned();
    }
    crate::helpers::wait_until(
        "retention to drop the overwritten entity",
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(25),
        || async { app.store.content_get(&old).await.unwrap().is_none() },
    )
    .await;
    assert!(app.store.content_get(&current).await.unwrap().is_some(), "the current entity stays");
    assert!(app.store.content_get(&token).await.unwrap().is_some(), "a subscription's deliver token stays");
}

/// The real binary is killed (`SIGKILL`) while writers change watched paths;
/// after a restart every committed change, acknowledged or not, has exactly
/// one notification, in commit order.
async fn notifications_survive_sigkill_exactly_once(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let mut envs = vec![("TIDINGS_DATA_DIR", dir.path().display().to_string())];
    if backend == Backend::Postgres {
        envs.push(("DATABASE_URL", crate::helpers::fresh_database().await.0));
    }
    let http = reqwest::Client::new();
    let mut server = crate::helpers::spawn_process(&envs).await;
    let identity: Value = http.get(format!("{}/v1/identity", server.base)).send().await.unwrap().json().await.unwrap();
    let a = Peer::new();
    let mut included = Map::new();
    let token = a.grant(identity["hash"].as_str().unwrap(), inbox_grant("system/inbox/crash"), None, &mut included);
    let params = json!({"deliver_to": {"uri": "system/inbox/crash"}, "deliver_token": token});
    let envelope = Subscribe { author: &a, pattern: "crash/*", params, capability: None, included }.envelope("subscribe");
    assert_eq!(execute_at(&http, &server.base, &envelope).await.0, 200);
    let acked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (http, acked, url) = (http.clone(), acked.clone(), format!("{}/v1/tree/crash/w{w}", server.base));
            tokio::spawn(async move {
                for i in 0.. {
                    match http.put(&url).json(&json!({"type": "note", "data": {"i": i}})).send().await {
                        Ok(r) if r.status().is_success() => acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        _ => break, // killed mid-request
                    };
                }
            })
        })
        .collect();
    crate::helpers::wait_until(
        "150 writes acknowledged",
        std::time::Duration::from_secs(60),
        std::time::Duration::from_millis(5),
        || async { acked.load(std::sync::atomic::Ordering::Relaxed) >= 150 },
    )
    .await;
    server.child.start_kill().unwrap();
    server.child.wait().await.unwrap();
    for w in writers {
        w.await.unwrap();
    }
    let server = crate::helpers::spawn_process(&envs).await;
    let sentinel =
        http.put(format!("{}/v1/tree/crash/sentinel", server.base)).json(&json!({"type": "note", "data": {}})).send().await.unwrap();
    let sentinel: Value = sentinel.json().await.unwrap();
    let sentinel = sentinel["hash"].as_str().unwrap().to_owned();
    // Every committed change under crash/, in commit order.
    let read = |query: &str| {
        let (http, url) = (http.clone(), format!("{}/v1/stream?since=0&{query}", server.base));
        async move { tidings_client::sse::connect(&http, &url, None).await }
    };
    let mut changes = read("types=tree.*").await.unwrap();
    let mut committed = Vec::new();
    loop {
        let e = tokio::time::timeout(std::time::Duration::from_secs(10), changes.next_event()).await.unwrap().unwrap();
        let v: Value = serde_json::from_str(&e.data).unwrap();
        let (uri, hash) = (v["payload"]["uri"].as_str().unwrap().to_owned(), v["payload"]["hash"].as_str().unwrap_or("").to_owned());
        if uri.starts_with("crash/") {
            committed.push((uri, hash.clone()));
        }
        if hash == sentinel {
            break;
        }
    }
    assert!(committed.len() > 150, "{} changes", committed.len());
    let mut inbox = read("types=subscription.notification&targets=system/inbox/crash").await.unwrap();
    let mut notified = Vec::new();
    while notified.len() < committed.len() {
        let e = tokio::time::timeout(std::time::Duration::from_secs(10), inbox.next_event()).await.unwrap().unwrap();
        let v: Value = serde_json::from_str(&e.data).unwrap();
        let data = &v["payload"]["data"];
        notified.push((data["uri"].as_str().unwrap().to_owned(), data["hash"].as_str().unwrap().to_owned()));
    }
    // A repeat of a change from before the kill would come before the
    // sentinel's notification (the engine works in log order): exact
    // equality up to it means nothing was lost and nothing repeated.
    assert_eq!(notified, committed, "one notification per committed change, in commit order");
}

/// Tree changes and notifications are written by tidings only: publishing
/// one is refused, so the engine never acts on a forged change.
async fn changes_and_notifications_cannot_be_forged(backend: Backend) {
    let app = spawn_app(backend).await;
    let head = app.head().await;
    for forged in ["tree.created", "tree.updated", "tree.deleted", "subscription.notification", "system.replay_gap"] {
        let body = json!({"event_type": forged, "ref": "system/inbox/x", "payload": {"uri": "system/subscription/evil", "hash": format!("sha256:{}", "a".repeat(64))}});
        let (status, answer) = app.post_events(&body).await;
        assert_eq!((status, answer["error"].as_str()), (403, Some("reserved_event_type")), "{forged}: {answer}");
    }
    assert_eq!(app.head().await, head, "nothing was appended");
}

/// Offered as relays: only subscribers that hold a relaying mirror of the
/// prefix, at the endpoint this server knows for them (issue 35, item 2:
/// cheap subscriptions that claimed an endpoint took over mirrors).
async fn redirects_list_at_most_ten_shuffled_alternatives(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.federation.max_subscribers_per_prefix = 14).await;
    let server = server_hash(&app).await;
    let peers: Vec<Peer> = (0..12).map(|_| Peer::new()).collect();
    for (i, p) in peers.iter().enumerate() {
        // Each claims another endpoint than the one this server knows for
        // it: the known one is offered.
        let (known, claimed) = (format!("http://127.0.0.1:{}", 9000 + i), format!("http://127.0.0.1:{}", 8000 + i));
        let (status, body) = subscribe_as_mirror(&app, &server, p, "wide/**", &format!("w{i}"), &known, &claimed).await;
        assert_eq!(status, 200, "{body}");
    }
    // One more that relays nothing, and a cheap one that says it relays
    // but receives into a local inbox (capacity 14): never offered.
    let (quiet, cheap) = (Peer::new(), Peer::new());
    assert_eq!(subscribe(&app, &server, &quiet, "wide/**", "system/inbox/quiet", json!({})).await.0, 200);
    let claim = json!({"relay_endpoint": "http://127.0.0.1:7000"});
    assert_eq!(subscribe(&app, &server, &cheap, "wide/**", "system/inbox/cheap", claim).await.0, 200);
    let everyone: HashSet<&str> = peers.iter().map(|p| p.hash.as_str()).collect();
    // A subscriber already on the prefix (through another inbox) is never
    // offered itself.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (status, body) = subscribe(&app, &server, &peers[0], "wide/**", "system/inbox/another", json!({})).await;
        assert_eq!(status, 303, "{body}");
        let offered = body["result"]["data"]["alternatives"].as_array().unwrap();
        let alternatives: Vec<String> = offered.iter().map(|v| v["peer"].as_str().unwrap().to_owned()).collect();
        assert!(offered.iter().all(|v| v["endpoint"].as_str().unwrap().starts_with("http://127.0.0.1:90")), "{offered:?}");
        assert_eq!(alternatives.len(), 10);
        assert!(alternatives.iter().all(|a| everyone.contains(a.as_str()) && *a != peers[0].hash), "{alternatives:?}");
        assert_eq!(alternatives.iter().collect::<HashSet<_>>().len(), 10, "no repeats");
        seen.push(alternatives);
    }
    assert!(seen.windows(2).any(|w| w[0] != w[1]), "the order is randomised");
}
