//! Failover to a synchronous standby (docs/failover.md): with `TIDINGS_DELIVERY=replicated` nothing a client was
//! shown, and no publish answered `201`, is lost by a promotion; without
//! it, a commit whose wait for the standby was cancelled is shown at once
//! and then lost (and the clients that saw it are told). The independent
//! checker (`checker`) judges what every client saw against the final log.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tidings_server::config::Delivery;

use crate::checker::{self, Follower, Seen, Verdict};
use crate::helpers::epochs::{host_of, pg_ctl, publish_within_5s};
use crate::helpers::{Backend, TestApp, spawn_app_with, wait_until};
use crate::readers;

/// What `/health/deep` says of the synchronous standby.
async fn standby_state(app: &TestApp) -> String {
    app.deep().await.1["delivery"]["synchronous_standby"].as_str().unwrap_or("none").to_owned()
}

async fn standby_becomes(app: &TestApp, state: &str) {
    wait_until(&format!("the synchronous standby to be {state}"), Duration::from_secs(20), Duration::from_millis(50), || async {
        standby_state(app).await == state
    })
    .await;
}

/// A publish of `payload` with an idempotency key made of it, as a
/// retrying publisher sends it.
fn keyed(app: &TestApp, payload: Value) -> reqwest::RequestBuilder {
    app.http
        .post(app.url("/v1/events"))
        .header("Idempotency-Key", format!("key-{}", payload["i"].to_string().trim_matches('"')))
        .json(&json!({"event_type": "comment.posted", "payload": payload}))
}

async fn get(app: &TestApp, path: &str) -> (u16, Value) {
    let r = app.http.get(app.url(path)).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// A client of the test's PostgreSQL cluster at `url`.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connecting to the test cluster");
    tokio::spawn(conn);
    client
}

/// Two servers on one database over a primary and its synchronous
/// standby: one with `TIDINGS_DELIVERY=replicated`, one without. While
/// the standby is down, the replicated one refuses publishes (`503
/// replication_unavailable`, nothing stored) and takes them again when it
/// is back. Then a publish to each is committed on the primary alone (its
/// wait for the standby is cancelled, as `pg_cancel_backend` does): the
/// replicated server answers its own `503` and shows neither (a poll past
/// them is refused), the other answers `201` and shows both. The primary
/// dies and the standby is promoted; the `503` publisher retries with its
/// key. The checker finds that every client's history matches the final
/// log, that every `201` of the replicated server is in it once, and that
/// its client was never told of a loss, while the other server's client,
/// which saw the lost events, was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicated_delivery_shows_and_acknowledges_nothing_a_failover_to_the_synchronous_standby_loses() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run the suite with scripts/test"));
    let (primary, standby) = (var("TIDINGS_TEST_SYNC_PRIMARY_URL"), var("TIDINGS_TEST_SYNC_STANDBY_URL"));
    let (primary_db, name) = crate::helpers::fresh_database_on(&primary).await;
    let url = format!("postgres://postgres@{},{}/{name}?target_session_attrs=read-write", host_of(&primary), host_of(&standby));
    let replicated = spawn_app_with(Backend::Postgres, |s| {
        s.database_url = Some(url.clone());
        s.postgres.delivery = Delivery::Replicated;
        // The patience: a publish sent right after the standby stops is
        // admitted.
        s.postgres.db_timeout = Duration::from_secs(3);
    })
    .await;
    let committed = spawn_app_with(Backend::Postgres, |s| s.database_url = Some(url.clone())).await;
    let mut acknowledged: Vec<(i64, Value)> = Vec::new();
    for i in 1..=3 {
        acknowledged.push((replicated.publish("comment.posted", json!({"i": i})).await, json!({"i": i})));
    }
    standby_becomes(&replicated, "confirming").await;
    assert_eq!(committed.deep().await.1["delivery"], Value::Null, "committed delivery is the default");
    let shown = Follower::start(&replicated, 0);
    let other = Follower::start(&committed, 0);
    // On each server too: a client polling with `since`, a durable
    // consumer, an MCP agent and a WebSocket device (the campaign's,
    // tests/api/readers.rs), until they read `until`.
    let until = Arc::new(AtomicI64::new(0));
    let others: Vec<(String, tokio::task::JoinHandle<Vec<Seen>>)> = [("replicated", &replicated), ("committed", &committed)]
        .into_iter()
        .flat_map(|(name, app)| {
            [
                (format!("{name} poll"), readers::poller(app.url(""), until.clone())),
                (format!("{name} consumer"), readers::consumer(app.url(""), format!("sync-{name}"), until.clone())),
                (format!("{name} mcp"), readers::agent(app.url(""), format!("sync-mcp-{name}"), until.clone())),
                (format!("{name} ws"), readers::device(app.url(""), format!("sync-{name}"), until.clone(), true)),
            ]
        })
        .collect();
    shown.wait_for("the replicated server's client to see 3", Duration::from_secs(10), 3).await;
    other.wait_for("the other server's client to see 3", Duration::from_secs(10), 3).await;

    // The standby stops: within the patience (TIDINGS_DB_TIMEOUT) the
    // replicated server refuses publishes and stores nothing.
    pg_ctl("TIDINGS_TEST_SYNC_STANDBY_PG_CTL", &["-m", "fast", "stop"]).await;
    standby_becomes(&replicated, "stalled").await;
    assert_eq!(replicated.metric("tidings_replication_stalled").await, 1.0);
    let db = connect(&primary_db).await;
    let head = || async { db.query_one("SELECT last_id FROM tidings_head", &[]).await.unwrap().get::<_, i64>(0) };
    let (status, body) = replicated.post_events(&json!({"event_type": "comment.posted", "payload": {"i": "refused"}})).await;
    assert_eq!((status, body["error"].as_str()), (503, Some("replication_unavailable")), "{body}");
    let r = replicated.http.put(replicated.url("/v1/tree/notes/a")).json(&json!({"type": "note", "data": {"v": 1}})).send().await.unwrap();
    assert_eq!(r.status(), 503, "a tree write is refused too");
    assert_eq!(head().await, 3, "a refused publish or tree write stores nothing");
    let entities: i64 = db.query_one("SELECT count(*) FROM tree_entities", &[]).await.unwrap().get(0);
    assert_eq!(entities, 0);
    // Back: accepted again, and shown.
    pg_ctl("TIDINGS_TEST_SYNC_STANDBY_PG_CTL", &["start"]).await;
    standby_becomes(&replicated, "confirming").await;
    let four = replicated.publish("comment.posted", json!({"i": 4})).await;
    acknowledged.push((four, json!({"i": 4})));
    shown.wait_for("the replicated server's client to see 4", Duration::from_secs(10), four).await;
    other.wait_for("the other server's client to see 4", Duration::from_secs(10), four).await;

    // The standby stops again. A publish to each server is admitted (the
    // standby has not been missed for the patience yet) and waits for it
    // inside PostgreSQL; cancelling that wait commits the event on the
    // primary alone. The replicated server does not answer 201 for its own
    // and shows neither; the other one answers 201 and shows both.
    pg_ctl("TIDINGS_TEST_SYNC_STANDBY_PG_CTL", &["-m", "fast", "stop"]).await;
    // Every session of the test's database waiting for the standby but the
    // replicated server's barrier (which this server never cancels).
    let cancel = "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
                  WHERE wait_event = 'SyncRep' AND datname = current_database() AND application_name <> 'tidings-sync'";
    let mut answers = Vec::new();
    for (app, payload) in [(&replicated, json!({"i": "own"})), (&committed, json!({"i": "lone"}))] {
        let mut publish = tokio::spawn(keyed(app, payload).send());
        // Its wait is cancelled as soon as it waits (and any other
        // session's of the database, such as a consumer's or the engine's).
        let answer = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                tokio::select! {
                    answer = &mut publish => break answer.unwrap().unwrap(),
                    _ = tokio::time::sleep(Duration::from_millis(20)) => { db.query(cancel, &[]).await.unwrap(); }
                }
            }
        })
        .await
        .expect("the publish is answered");
        answers.push((answer.status().as_u16(), answer.json::<Value>().await.unwrap()));
    }
    let [(own_status, own), (lone_status, lone)] = <[(u16, Value); 2]>::try_from(answers).unwrap();
    assert_eq!((own_status, own["error"].as_str()), (503, Some("replication_unavailable")), "{own}");
    assert_eq!(lone_status, 201, "PostgreSQL commits a cancelled wait on the primary alone: {lone}");
    let lone = lone["event_ids"][0].as_i64().unwrap();
    other.wait_for("the other server to show the lone event", Duration::from_secs(10), lone).await;
    // A poll past 4 on the replicated server is not shown them.
    let (status, body) = get(&replicated, "/v1/poll?since=4").await;
    assert_eq!((status, &body["events"]), (200, &json!([])), "{body}");
    standby_becomes(&replicated, "stalled").await;

    // The primary dies; the standby, which never got the lone event, is
    // promoted. It has no standby of its own, and says so (as
    // CloudNativePG does with `dataDurability: preferred` when no replica
    // is left): a reload of an empty synchronous_standby_names.
    pg_ctl("TIDINGS_TEST_SYNC_PRIMARY_PG_CTL", &["-m", "immediate", "stop"]).await;
    pg_ctl("TIDINGS_TEST_SYNC_STANDBY_PG_CTL", &["start"]).await;
    pg_ctl("TIDINGS_TEST_SYNC_STANDBY_PG_CTL", &["promote"]).await;
    let promoted = connect(&standby).await;
    promoted.batch_execute("ALTER SYSTEM SET synchronous_standby_names = ''").await.unwrap();
    promoted.batch_execute("SELECT pg_reload_conf()").await.unwrap();

    // Publishing resumes within 5 s.
    let (after, _) = publish_within_5s(&replicated, json!({"i": "after"})).await;
    acknowledged.push((after, json!({"i": "after"})));
    let epoch = replicated.store.epochs(i32::MAX).await.unwrap().current().clone();
    assert_eq!((epoch.fork, epoch.reason.as_str()), (four, "timeline"), "both events committed on the primary alone were lost");
    standby_becomes(&replicated, "none_named").await;
    // The publisher answered 503 retries with its key: stored once, now.
    let retried = keyed(&replicated, json!({"i": "own"})).send().await.unwrap();
    assert_eq!(retried.status(), 201);
    let retried = retried.json::<Value>().await.unwrap()["event_ids"][0].as_i64().unwrap();
    acknowledged.push((retried, json!({"i": "own"})));
    shown.wait_for("the replicated server's client to see the retry", Duration::from_secs(10), retried).await;
    other.wait_for("the other server's client to resume", Duration::from_secs(20), retried).await;

    until.store(retried, Ordering::Release);
    let log = checker::final_log(&replicated).await;
    let (shown, other) = (shown.stop().await, other.stop().await);
    for (name, client) in others {
        let seen = tokio::time::timeout(Duration::from_secs(30), client).await.expect("every client reads to the end").unwrap();
        let verdict = checker::check(&log, &[(name.clone(), seen.clone())]);
        if name.starts_with("replicated") {
            // Nothing it was shown was lost. A durable consumer whose kept
            // cursor stood at the fork may be told so all the same (the
            // server cannot know what it was shown past its cursor).
            let at_cursor = seen.iter().filter(|s| matches!(s, Seen::LostAtCursor { .. })).count();
            let told = if name.ends_with("consumer") { at_cursor } else { 0 };
            assert_eq!(verdict, Ok(Verdict { events: 6, announced: told, lost: 0 }), "{name} saw {seen:?}; the log is {log:?}");
            assert!(told <= 1 && !seen.iter().any(|s| matches!(s, Seen::Lost { .. })), "{name} saw {seen:?}");
        } else {
            assert!(verdict.is_ok(), "{name} saw {seen:?}; the log is {log:?}: {verdict:?}");
        }
    }
    checker::acknowledged_kept(&log, &acknowledged).unwrap();
    assert_eq!(
        checker::check(&log, &[("replicated".into(), shown.clone())]),
        Ok(Verdict { events: 6, announced: 0, lost: 0 }),
        "the replicated server's client saw {shown:?}; the log is {log:?}"
    );
    assert_eq!(
        checker::check(&log, &[("committed".into(), other.clone())]),
        Ok(Verdict { events: 8, announced: 1, lost: 2 }),
        "the other server's client saw {other:?}; the log is {log:?}"
    );
}
