//! Publishing from the application's own PostgreSQL transaction:
//! `tidings.publish(...)` (PostgreSQL only: the embedded store has no SQL
//! callers). A rolled-back call leaves nothing; a committed one reaches
//! every transport once; an open application transaction holds up no HTTP
//! publisher and its event lands after its commit; SQL and HTTP publishers
//! together keep the ids gap-free with each call's event there once; names
//! are checked in SQL (strict mode: unregistered types raise) and a payload
//! that breaks its schema is set aside, visible, never delivered; the
//! application's role needs EXECUTE on the function and nothing on the log.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with, wait_until};

/// Calls `tidings.publish(event_type, payload)` on `db` in its own
/// transaction.
async fn sql_publish(db: &tokio_postgres::Client, event_type: &str, payload: Value) {
    db.execute("SELECT tidings.publish($1, $2::text::jsonb)", &[&event_type, &payload.to_string()]).await.unwrap();
}

/// Waits until the outbox is empty and the log's head is `head`.
async fn settled(app: &TestApp, head: i64) {
    wait_until(&format!("the outbox to settle at head {head}"), Duration::from_secs(30), Duration::from_millis(20), || async {
        app.deep().await.1["outbox"]["depth"] == 0 && app.head().await == head
    })
    .await;
}

/// Every event in the log, in order (polled in pages).
async fn all_events(app: &TestApp) -> Vec<Value> {
    let mut events = Vec::new();
    let mut since = 0;
    loop {
        let page: Value = app.http.get(app.url(&format!("/v1/poll?since={since}&limit=1000"))).send().await.unwrap().json().await.unwrap();
        let batch = page["events"].as_array().unwrap().clone();
        since = page["next_since"].as_i64().unwrap();
        let more = page["has_more"] == true;
        events.extend(batch);
        if !more {
            return events;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_call_leaves_nothing_and_a_committed_one_is_delivered_once() {
    let app = spawn_app(Backend::Postgres).await;
    let mut stream = app.stream("?since=0&types=comment.*", None).await;
    let mut db = app.db().await;

    let tx = db.transaction().await.unwrap();
    tx.execute("SELECT tidings.publish('comment.posted', '{\"n\": 1}')", &[]).await.unwrap();
    tx.rollback().await.unwrap();
    // A marker after the rollback: the stream's first event must be it.
    let marker = app.publish("comment.edited", json!({"marker": true})).await;
    assert_eq!(stream.ids(1).await, vec![marker], "the rolled-back call left nothing");

    let tx = db.transaction().await.unwrap();
    tx.execute("CREATE TABLE app_orders (id int)", &[]).await.unwrap();
    tx.execute("INSERT INTO app_orders VALUES (7)", &[]).await.unwrap();
    let queued: i64 = tx
        .query_one(
            "SELECT tidings.publish('comment.posted', '{\"n\": 2}', ref => 'order:7', agent_id => 'shop', agent_kind => 'service',
                                    links => '[{\"rel\": \"target\", \"ref\": \"order:7\"}]', idempotency_key => 'order-7')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(queued > 0, "the call answers its place in the outbox");
    tx.commit().await.unwrap();
    // The same call again (an application retrying its own step) with the
    // same key: stored once.
    db.execute("SELECT tidings.publish('comment.posted', '{\"n\": 2}', ref => 'order:7', agent_id => 'shop', agent_kind => 'service', links => '[{\"rel\": \"target\", \"ref\": \"order:7\"}]', idempotency_key => 'order-7')", &[])
        .await
        .unwrap();
    settled(&app, marker + 1).await;

    let event = stream.next().await;
    let envelope: Value = serde_json::from_str(&event.data).unwrap();
    assert_eq!(envelope["event_id"], marker + 1);
    assert_eq!(envelope["payload"], json!({"n": 2}));
    assert_eq!(envelope["ref"], "order:7");
    assert_eq!(envelope["agent"], json!({"id": "shop", "kind": "service"}));
    assert_eq!(envelope["links"], json!([{"rel": "target", "ref": "order:7"}]));
    let events = all_events(&app).await;
    assert_eq!(events.len(), 2, "the marker and the committed call, once: {events:?}");

    // A WebSocket device catching up sees it once too.
    let mut device = crate::helpers::device::Client::connect(&app).await;
    let key = crate::helpers::device::Key::new();
    let answer = device.auth(&key, json!({"device_id": "till", "cursor": 0, "filter": {"types": ["comment.*"]}})).await;
    assert_eq!(answer["result"]["head_seq"], marker + 1, "{answer}");
    let page = device.call("sync.delta", json!({"device_id": "till", "since": 0, "limit": 10})).await;
    let seqs: Vec<i64> = page["result"]["items"].as_array().unwrap().iter().map(|i| i["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, vec![marker, marker + 1], "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_application_transaction_holds_up_no_publisher() {
    let app = spawn_app(Backend::Postgres).await;
    let mut db = app.db().await;
    let tx = db.transaction().await.unwrap();
    tx.execute("SELECT tidings.publish('comment.posted', '{\"long\": true}')", &[]).await.unwrap();
    // While it stays open (5 s), HTTP publishes are answered as usual.
    let open = Instant::now();
    let mut http_ids = Vec::new();
    while open.elapsed() < Duration::from_secs(5) {
        let answer = tokio::time::timeout(Duration::from_secs(4), app.publish("comment.edited", json!({})))
            .await
            .expect("an HTTP publish waited on the open application transaction");
        http_ids.push(answer);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.head().await, *http_ids.last().unwrap(), "nothing of the open transaction is in the log yet");
    tx.commit().await.unwrap();
    let head = http_ids.len() as i64 + 1;
    settled(&app, head).await;
    let events = all_events(&app).await;
    let last = events.last().unwrap();
    assert_eq!(last["payload"], json!({"long": true}), "after its commit, above everything committed before it");
    assert_eq!(last["event_id"], head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_and_http_publishers_together_keep_ids_gap_free() {
    let app = spawn_app(Backend::Postgres).await;
    let per = 25;
    let mut tasks = Vec::new();
    for p in 0..8 {
        let db = app.db().await;
        tasks.push(tokio::spawn(async move {
            for n in 0..per {
                sql_publish(&db, "comment.posted", json!({"sql": p, "n": n})).await;
            }
        }));
        let (http, url) = (app.http.clone(), app.url("/v1/events"));
        tasks.push(tokio::spawn(async move {
            for n in 0..per {
                let r =
                    http.post(&url).json(&json!({"event_type": "comment.edited", "payload": {"http": p, "n": n}})).send().await.unwrap();
                assert_eq!(r.status(), 201);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let total = 16 * per;
    settled(&app, total).await;
    let events = all_events(&app).await;
    let ids: Vec<i64> = events.iter().map(|e| e["event_id"].as_i64().unwrap()).collect();
    assert_eq!(ids, (1..=total).collect::<Vec<_>>(), "gap-free, in order");
    for p in 0..8 {
        for n in 0..per {
            let count = events.iter().filter(|e| e["payload"] == json!({"sql": p, "n": n})).count();
            assert_eq!(count, 1, "SQL call {p}/{n} is in the log once");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_checked_in_sql_and_schema_violations_are_set_aside() {
    let app = spawn_app_with(Backend::Postgres, |s| {
        s.publish.registry_mode = tidings_server::registry::RegistryMode::Strict;
        s.publish.max_payload = 1024;
    })
    .await;
    let db = app.db().await;
    for (event_type, code) in [("Not-A-Name", "invalid_event_name"), ("nobody.registered.this", "unregistered_event_type")] {
        let e = db.execute("SELECT tidings.publish($1)", &[&event_type]).await.unwrap_err();
        let e = e.as_db_error().expect("a database error");
        assert_eq!((e.message(), e.code().code()), (code, "22023"), "{event_type}");
    }
    let e = db.execute("SELECT tidings.publish('comment.posted', '[1]')", &[]).await.unwrap_err();
    assert_eq!(e.as_db_error().unwrap().message(), "invalid_event");
    // A payload far over TIDINGS_MAX_PAYLOAD is refused in the caller's
    // transaction, nothing queued.
    let payload = json!({"text": "x".repeat(200_000)});
    let e = db.execute("SELECT tidings.publish('comment.posted', $1)", &[&payload]).await.unwrap_err();
    assert_eq!(e.as_db_error().unwrap().message(), "payload_too_large");
    let queued: i64 = db.query_one("SELECT count(*) FROM tidings.outbox", &[]).await.unwrap().get(0);
    assert_eq!(queued, 0, "the refusal queued nothing");
    // hypothesis.promoted requires `to_state`: the row is set aside. So is
    // a payload just over the limit (the mover counts it exactly).
    sql_publish(&db, "hypothesis.promoted", json!({"score": 0.5})).await;
    sql_publish(&db, "comment.posted", json!({"text": "x".repeat(1_500)})).await;
    sql_publish(&db, "comment.posted", json!({"after": true})).await;
    wait_until("two rows set aside", Duration::from_secs(30), Duration::from_millis(20), || async {
        let deep = app.deep().await.1;
        deep["outbox"]["set_aside"] == 2 && deep["outbox"]["depth"] == 0
    })
    .await;
    let (_, deep) = app.deep().await;
    assert_eq!(deep["outbox"]["oldest_age_ms"], 0, "nothing is waiting");
    let events = all_events(&app).await;
    assert_eq!(events.len(), 1, "only the valid event was delivered: {events:?}");
    assert_eq!(events[0]["payload"], json!({"after": true}));
    let codes: Vec<String> =
        db.query("SELECT error_code FROM tidings.outbox ORDER BY seq", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(codes, ["payload_schema_violation", "payload_too_large"]);
    assert!(app.metric("tidings_outbox_set_aside_total{code=\"payload_schema_violation\"}").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishing_role_needs_execute_and_nothing_on_the_log() {
    let app = spawn_app(Backend::Postgres).await;
    let admin = app.db().await;
    let suffix = rand::random::<u32>();
    let (publisher, stranger) = (format!("app_pub_{suffix}"), format!("app_none_{suffix}"));
    admin
        .batch_execute(&format!(
            "CREATE ROLE {publisher} LOGIN; CREATE ROLE {stranger} LOGIN;
             GRANT USAGE ON SCHEMA tidings TO {publisher};
             GRANT EXECUTE ON FUNCTION tidings.publish TO {publisher};"
        ))
        .await
        .unwrap();
    let as_role = |role: String| {
        let url = app.db_url.clone().unwrap().replacen("postgres@", &format!("{role}@"), 1);
        async move {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            client
        }
    };
    let granted = as_role(publisher.clone()).await;
    sql_publish(&granted, "comment.posted", json!({"from": "app"})).await;
    let denied = granted.query("SELECT * FROM events", &[]).await.unwrap_err();
    assert!(denied.as_db_error().unwrap().message().contains("permission denied"), "{denied}");
    let denied = granted.query("SELECT * FROM tidings.outbox", &[]).await.unwrap_err();
    assert!(denied.as_db_error().unwrap().message().contains("permission denied"), "{denied}");
    let other = as_role(stranger.clone()).await;
    let refused = other.execute("SELECT tidings.publish('comment.posted')", &[]).await.unwrap_err();
    assert!(refused.as_db_error().unwrap().message().contains("permission denied"), "{refused}");
    settled(&app, 1).await;
    drop((granted, other));
    admin
        .batch_execute(&format!(
            "REVOKE ALL ON FUNCTION tidings.publish FROM {publisher};
             REVOKE ALL ON SCHEMA tidings FROM {publisher}; DROP ROLE {publisher}; DROP ROLE {stranger};"
        ))
        .await
        .unwrap();
}

/// A session of any role holding the advisory lock an earlier build moved
/// under (no privilege needed to take one) does not stop the mover: its
/// turn is a row of tidings' own table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_advisory_lock_of_a_stranger_stops_the_mover() {
    let app = spawn_app(Backend::Postgres).await;
    let squatter = app.db().await;
    squatter.execute("SELECT pg_advisory_lock(8388065426542498671)", &[]).await.unwrap();
    let db = app.db().await;
    sql_publish(&db, "comment.posted", json!({"moved": true})).await;
    settled(&app, 1).await;
    drop(squatter);
}

/// Rows set aside are kept for `TIDINGS_OUTBOX_SET_ASIDE_RETENTION`, then
/// forgotten by the retention sweep; newer ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_aside_rows_are_forgotten_after_their_retention() {
    let app = spawn_app_with(Backend::Postgres, |s| {
        s.publish.registry_mode = tidings_server::registry::RegistryMode::Strict;
        s.history.outbox_set_aside_retention = Duration::from_secs(3600);
        s.history.retention_interval = Duration::from_millis(200);
    })
    .await;
    let db = app.db().await;
    for score in [0.1, 0.2] {
        sql_publish(&db, "hypothesis.promoted", json!({"score": score})).await;
    }
    wait_until("two rows set aside", Duration::from_secs(30), Duration::from_millis(20), || async {
        app.deep().await.1["outbox"]["set_aside"] == 2
    })
    .await;
    // The first one queued two hours ago.
    db.execute("UPDATE tidings.outbox SET created_at = now() - interval '2 hours' WHERE seq = (SELECT min(seq) FROM tidings.outbox)", &[])
        .await
        .unwrap();
    wait_until("the old row forgotten", Duration::from_secs(30), Duration::from_millis(50), || async {
        app.deep().await.1["outbox"]["set_aside"] == 1
    })
    .await;
    let kept: Vec<Value> = db.query("SELECT event FROM tidings.outbox", &[]).await.unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0]["payload"]["score"], json!(0.2), "the newer row stays");
}
