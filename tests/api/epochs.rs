//! History that survives losing a suffix of the log (see
//! `crates/server/src/store/epoch.rs`): after a restore from a backup
//! (`tidings epoch new`, both stores), when PostgreSQL answers on another
//! timeline than the epoch's or below what a process saw committed, and
//! through a real promotion of an asynchronous standby that was behind
//! (scripts/test starts the pair), a new epoch begins; no id of the lost suffix names another event, a resume
//! point in it is told `history_lost` with the fork and goes on with every
//! event after the fork, and one at or below the fork goes on silently.

use std::ops::ControlFlow;
use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::device::{self as ws, Key};
use crate::helpers::epochs::*;
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with, wait_until};

both_stores!(a_restored_backup_begins_an_epoch_and_whoever_saw_lost_history_is_told);

/// Every id JavaScript represents exactly.
const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

async fn a_restored_backup_begins_an_epoch_and_whoever_saw_lost_history_is_told(backend: Backend) {
    let home = tempfile::tempdir().unwrap();
    let (settings_dir, restored_dir) = (home.path().join("live"), home.path().join("restored"));
    let app = spawn_app_with(backend, |s| s.data_dir = settings_dir.clone()).await;
    let stopped_url = app.db_url.clone();
    for i in 1..=3 {
        assert_eq!(app.publish("comment.posted", json!({"i": i})).await, i);
    }
    // Two durable consumers: one confirmed everything (3), one up to 2.
    assert_eq!(consume(&app, "at-fork", Some(0), Some(3)).await.0, vec![1, 2, 3]);
    assert_eq!(consume(&app, "behind", Some(0), Some(2)).await.0, vec![1, 2, 3]);
    // A WebSocket device that confirmed everything (3).
    let phone = Key::new();
    device_confirms(&app, &phone, Some(0), 3).await;
    // The backup is taken of the stopped server, at head 3.
    app.stop().await;
    let backup_url = backup(backend, &settings_dir, stopped_url.as_deref(), &restored_dir).await;

    // The original goes on: ids 4 and 5 are handed out and seen.
    let app = spawn_app_with(backend, |s| {
        s.data_dir = settings_dir.clone();
        s.database_url = stopped_url.clone();
    })
    .await;
    assert_eq!(app.publish("comment.posted", json!({"i": 4})).await, 4);
    assert_eq!(app.publish("comment.posted", json!({"i": 5})).await, 5);
    let (gap, ids) = resume(&app, 3, 2).await;
    assert_eq!((gap, ids), (None, vec![4, 5]), "a client saw 4 and 5");
    // The consumer at 3 is shown 4 and 5 (and confirms them).
    assert_eq!(consume(&app, "at-fork", None, Some(5)).await.0, vec![4, 5]);
    // The device is shown 4 and 5.
    device_confirms(&app, &phone, None, 5).await;
    app.stop().await;

    // The store is lost and restored from the backup (head 3); the
    // operator begins a new epoch before serving.
    let begun = epoch_command("new", &restored_dir, backup_url.as_deref()).await;
    assert_eq!(
        (begun["number"].as_i64(), begun["fork"].as_i64(), begun["reason"].as_str()),
        (Some(1), Some(3), Some("operator")),
        "{begun}"
    );
    let base = begun["base"].as_i64().unwrap();
    assert!(base > 5 && base < MAX_SAFE_INTEGER / 100, "the new epoch's ids begin past every id handed out: {begun}");
    let listed = epoch_command("list", &restored_dir, backup_url.as_deref()).await;
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!((listed[0]["number"].as_i64(), listed[0]["base"].as_i64()), (Some(0), Some(0)), "{listed}");

    let app = spawn_app_with(backend, |s| {
        s.data_dir = restored_dir.clone();
        s.database_url = backup_url.clone();
    })
    .await;
    let new = [app.publish("comment.posted", json!({"i": "new 1"})).await, app.publish("comment.posted", json!({"i": "new 2"})).await];
    assert_eq!(new, [base + 1, base + 2], "no id of the lost suffix is handed out again; gap-free within the epoch");

    // The client that saw 5 is told, with the fork, and gets every event
    // after the fork exactly once.
    let (gap, ids) = resume(&app, 5, 2).await;
    let gap = gap.expect("a resume point in the lost suffix is announced");
    assert_eq!(
        (gap["reason"].as_str(), gap["requested"].as_i64(), gap["fork"].as_i64(), gap["available_from"].as_i64()),
        (Some("history_lost"), Some(5), Some(3), Some(base + 1)),
        "{gap}"
    );
    assert_eq!(ids, new.to_vec());
    // At or below the fork: across the boundary, silently.
    assert_eq!(resume(&app, 2, 3).await, (None, vec![3, base + 1, base + 2]));
    assert_eq!(resume(&app, 3, 2).await, (None, new.to_vec()));
    // A poll from the lost suffix gets the same signal and the same events.
    let page: Value = app.http.get(app.url("/v1/poll?since=4")).send().await.unwrap().json().await.unwrap();
    assert_eq!((page["gap"]["reason"].as_str(), page["gap"]["fork"].as_i64()), (Some("history_lost"), Some(3)), "{page}");
    let polled: Vec<i64> = page["events"].as_array().unwrap().iter().map(|e| e["event_id"].as_i64().unwrap()).collect();
    assert_eq!(polled, new.to_vec());
    // The consumers' cursors rolled back with the store: the one at the
    // fork was shown lost events, and its first read says so, once; the
    // one behind the fork goes on silently.
    let (polled, gap) = consume(&app, "at-fork", None, None).await;
    assert_eq!((polled, gap["reason"].as_str(), gap["fork"].as_i64()), (new.to_vec(), Some("history_lost"), Some(3)), "{gap}");
    let (polled, gap) = consume(&app, "at-fork", None, None).await;
    assert_eq!((polled, gap), (new.to_vec(), Value::Null), "told once");
    let (polled, gap) = consume(&app, "behind", None, None).await;
    assert_eq!((polled, gap), (vec![3, base + 1, base + 2], Value::Null));
    // The device's stored cursor rolled back to 3 too: its hello answers
    // 3 and says, once, that what it saw after 3 is gone.
    let mut device = ws::Client::connect(&app).await;
    let answer = device.auth(&phone, json!({"device_id": "phone"})).await;
    assert_eq!(answer["result"]["cursor"], 3, "{answer}");
    let told = device.notification().await;
    assert_eq!(
        (told["method"].as_str(), told["params"]["reason"].as_str(), told["params"]["fork"].as_i64()),
        (Some("stream.gap"), Some("history_lost"), Some(3)),
        "{told}"
    );
    let page = device.call("sync.delta", json!({"device_id": "phone", "since": 3})).await;
    let delivered: Vec<i64> = page["result"]["items"].as_array().unwrap().iter().map(|i| i["seq"].as_i64().unwrap()).collect();
    assert_eq!(delivered, new.to_vec(), "{page}");
    drop(device);
    let mut device = ws::Client::connect(&app).await;
    assert_eq!(device.auth(&phone, json!({"device_id": "phone"})).await["result"]["cursor"], 3);
    device.call("sync.delta", json!({"device_id": "phone", "since": 3})).await;
    assert_eq!(device.pending(), 0, "told once");
    // A resume point past every id handed out is beyond the head, as before.
    let (gap, _) = resume(&app, base + 100, 0).await;
    assert_eq!(gap.unwrap()["reason"], "beyond_head");
    // (Every server of the test process counts into one registry.)
    assert!(app.metric("tidings_replay_gaps_total{reason=\"history_lost\"}").await >= 2.0);
}

/// One poll of durable consumer `id` (from `since`, else its stored
/// cursor), confirming `ack` after it: the ids it was shown and the gap it
/// was told (`null` for none).
async fn consume(app: &TestApp, id: &str, since: Option<i64>, ack: Option<i64>) -> (Vec<i64>, Value) {
    let since = since.map(|s| format!("&since={s}")).unwrap_or_default();
    let page: Value = app.http.get(app.url(&format!("/v1/poll?consumer_id={id}{since}"))).send().await.unwrap().json().await.unwrap();
    let ids = page["events"].as_array().unwrap_or_else(|| panic!("{page}")).iter().map(|e| e["event_id"].as_i64().unwrap()).collect();
    if let Some(cursor) = ack {
        let r = app.http.post(app.url(&format!("/v1/consumers/{id}/ack"))).json(&json!({"cursor": cursor})).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    (ids, page.get("gap").cloned().unwrap_or(Value::Null))
}

/// WebSocket device `phone` of `key` says hello (from `given`, else its
/// stored cursor) and confirms `ack`.
async fn device_confirms(app: &TestApp, key: &Key, given: Option<i64>, ack: i64) {
    let mut device = ws::Client::connect(app).await;
    let hello = match given {
        Some(cursor) => json!({"device_id": "phone", "cursor": cursor}),
        None => json!({"device_id": "phone"}),
    };
    device.auth(key, hello).await;
    assert_eq!(device.ack(key, ack).await["result"]["cursor"], ack);
}

/// PostgreSQL: a database on another timeline than the epoch's (what a
/// promoted standby or a point-in-time restore is) refuses appends until a
/// new epoch begins, which the refused publish begins; a live stream that
/// was shown lost events is ended and told on resume. Then a head found
/// below what the process saw committed (the LISTEN session reconnects to
/// a database that lost a suffix) begins one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_timeline_or_cluster_or_a_head_below_what_was_seen_begins_an_epoch() {
    let app = spawn_app(Backend::Postgres).await;
    for i in 1..=5 {
        app.publish("comment.posted", json!({"i": i})).await;
    }
    let (mut watching, seen) = live(&app, 0, 5).await;
    assert_eq!(seen, vec![1, 2, 3, 4, 5]);

    // The database as a standby promoted while it was behind finds it: ids
    // 4 and 5 never reached it, and it writes on a new timeline.
    let db = app.db().await;
    db.batch_execute(
        "DELETE FROM events WHERE id > 3;
         UPDATE tidings_head SET last_id = 3, timeline = timeline + 1",
    )
    .await
    .unwrap();
    let (status, body) = app.post_events(&json!({"event_type": "comment.posted", "payload": {"i": "in flight"}})).await;
    assert_eq!(status, 503, "a publish in flight at the failover is not acknowledged: {body}");
    let id = app.publish("comment.posted", json!({"i": "after"})).await;
    let epochs = app.store.epochs(i32::MAX).await.unwrap();
    let epoch = epochs.current().clone();
    assert_eq!((epoch.number, epoch.fork, epoch.reason.as_str()), (1, 3, "timeline"));
    assert_eq!(id, epoch.base + 1);
    assert!(id > 5 && id < MAX_SAFE_INTEGER);

    // The live client saw 4 and 5: its stream ends, and its resume is told.
    ends(&mut watching).await;
    let (gap, ids) = resume(&app, 5, 1).await;
    let gap = gap.expect("told");
    assert_eq!((gap["reason"].as_str(), gap["fork"].as_i64()), (Some("history_lost"), Some(3)), "{gap}");
    assert_eq!(ids, vec![id]);

    // The database loses the last event without a timeline change; the
    // LISTEN session reconnects to it and finds the head below what it saw.
    let (mut watching, _) = live(&app, id - 1, 1).await;
    db.batch_execute(&format!(
        "DELETE FROM events WHERE id = {id};
         UPDATE tidings_head SET last_id = {};
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'tidings-listener' AND datname = current_database()",
        id - 1
    ))
    .await
    .unwrap();
    wait_until("a new epoch for the head below what was seen", Duration::from_secs(20), Duration::from_millis(50), || async {
        app.store.epochs(i32::MAX).await.unwrap().current().number == 2
    })
    .await;
    let epochs = app.store.epochs(i32::MAX).await.unwrap();
    let epoch = epochs.current().clone();
    // The epoch before handed out one id, and it was lost: the last id that
    // survived is that epoch's fork.
    assert_eq!((epoch.fork, epoch.reason.as_str()), (3, "head_behind"));
    let next = app.publish("comment.posted", json!({"i": "next"})).await;
    assert_eq!(next, epoch.base + 1);
    ends(&mut watching).await;
    let (gap, ids) = resume(&app, id, 1).await;
    assert_eq!(gap.expect("told")["fork"].as_i64(), Some(3));
    assert_eq!(ids, vec![next]);

    // A restore into another cluster (a dump loaded into a new one): the
    // system identifier is not the epoch's, and what came after the dump
    // is gone.
    let (mut watching, _) = live(&app, next - 1, 1).await;
    db.batch_execute(&format!(
        "DELETE FROM events WHERE id = {next};
         UPDATE tidings_head SET last_id = {}, system_id = 'a cluster restored elsewhere'",
        next - 1
    ))
    .await
    .unwrap();
    let (status, body) = app.post_events(&json!({"event_type": "comment.posted", "payload": {"i": "in flight"}})).await;
    assert_eq!(status, 503, "a publish in flight at the restore is not acknowledged: {body}");
    let restored = app.publish("comment.posted", json!({"i": "restored"})).await;
    let epochs = app.store.epochs(i32::MAX).await.unwrap();
    let epoch = epochs.current().clone();
    assert_eq!((epoch.number, epoch.fork, epoch.reason.as_str()), (3, 3, "system"));
    assert_eq!(restored, epoch.base + 1);
    ends(&mut watching).await;
    let (gap, ids) = resume(&app, next, 1).await;
    assert_eq!(gap.expect("told")["fork"].as_i64(), Some(3));
    assert_eq!(ids, vec![restored]);
    // Nothing lost, nothing told: a deployment that never fails over keeps
    // its ids (the first epoch begins at 0).
    let fresh = spawn_app(Backend::Postgres).await;
    assert_eq!(fresh.publish("comment.posted", json!({})).await, 1);
    assert_eq!(fresh.store.epochs(i32::MAX).await.unwrap().all().len(), 1);
    // Any role may NOTIFY: a forged head in a notification is no id this
    // process saw committed, and begins no epoch when the LISTEN session
    // reconnects.
    let db = fresh.db().await;
    let listener = "SELECT pid FROM pg_stat_activity WHERE application_name = 'tidings-listener' AND datname = current_database() AND query ILIKE 'LISTEN%'";
    let first: i32 = crate::helpers::gather(
        Duration::from_secs(10),
        (),
        |_| "the LISTEN session".into(),
        |()| {
            let db = &db;
            async move {
                match db.query(listener, &[]).await.unwrap().first() {
                    Some(row) => ControlFlow::Break(row.get(0)),
                    None => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        ControlFlow::Continue(())
                    }
                }
            }
        },
    )
    .await;
    db.batch_execute(&format!("NOTIFY tidings_events, '{}'; SELECT pg_terminate_backend({first})", i64::MAX)).await.unwrap();
    let first = Some(first);
    wait_until("the LISTEN session to reconnect", Duration::from_secs(20), Duration::from_millis(50), || async {
        db.query(listener, &[]).await.unwrap().first().is_some_and(|r| Some(r.get::<_, i32>(0)) != first)
    })
    .await;
    assert_eq!(fresh.publish("comment.posted", json!({})).await, 2);
    assert_eq!(fresh.store.epochs(i32::MAX).await.unwrap().all().len(), 1, "no epoch for a forged notification");
}

/// A durable consumer at the head, its poll waiting, when the store turns
/// out to have failed over (a new timeline): the poll was opened in the
/// epoch before, so the page that brings the new epoch's first event is
/// its first read in it, and tells it (its cursor is the fork, so it may
/// have been shown events past it that are gone). Its next read, having
/// confirmed an event of the new epoch, is told nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_waiting_when_an_epoch_begins_is_told_with_that_page() {
    let app = spawn_app(Backend::Postgres).await;
    for i in 1..=3 {
        app.publish("comment.posted", json!({"i": i})).await;
    }
    assert_eq!(consume(&app, "waiting", Some(0), Some(3)).await.0, vec![1, 2, 3]);
    let db = app.db().await;
    let opened = "SELECT last_activity_ms FROM consumer_subscriptions WHERE consumer_id LIKE '%waiting'";
    let before: i64 = db.query_one(opened, &[]).await.unwrap().get(0);
    // And one whose filter the new epoch's events do not match: its page
    // ends empty, past the new epoch's base, and is told all the same.
    let created = app.http.get(app.url("/v1/poll?consumer_id=filtered&since=3&types=other.*")).send().await.unwrap();
    assert_eq!(created.status(), 200);
    let filtered = "SELECT last_activity_ms FROM consumer_subscriptions WHERE consumer_id LIKE '%filtered'";
    let before_filtered: i64 = db.query_one(filtered, &[]).await.unwrap().get(0);
    let poll = app.http.get(app.url("/v1/poll?consumer_id=waiting&wait_ms=20000")).send();
    let waiting = tokio::spawn(async move { poll.await.unwrap().json::<Value>().await.unwrap() });
    let poll = app.http.get(app.url("/v1/poll?consumer_id=filtered&wait_ms=3000")).send();
    let waiting_filtered = tokio::spawn(async move { poll.await.unwrap().json::<Value>().await.unwrap() });
    wait_until("the polls to open their consumers", Duration::from_secs(10), Duration::from_millis(10), || async {
        db.query_one(opened, &[]).await.unwrap().get::<_, i64>(0) != before
            && db.query_one(filtered, &[]).await.unwrap().get::<_, i64>(0) != before_filtered
    })
    .await;
    db.batch_execute("UPDATE tidings_head SET timeline = timeline + 1").await.unwrap();
    let (status, _) = app.post_events(&json!({"event_type": "comment.posted", "payload": {"i": "in flight"}})).await;
    assert_eq!(status, 503);
    let id = app.publish("comment.posted", json!({"i": "after"})).await;
    let page = tokio::time::timeout(Duration::from_secs(20), waiting).await.expect("the waiting poll answered").unwrap();
    assert_eq!(page["events"][0]["event_id"].as_i64(), Some(id), "{page}");
    assert_eq!((page["gap"]["reason"].as_str(), page["gap"]["fork"].as_i64()), (Some("history_lost"), Some(3)), "{page}");
    let page = tokio::time::timeout(Duration::from_secs(20), waiting_filtered).await.expect("the filtered poll answered").unwrap();
    assert_eq!(page["events"], json!([]), "{page}");
    assert!(page["next_since"].as_i64() >= Some(id), "its page ends past the new epoch's base: {page}");
    assert_eq!((page["gap"]["reason"].as_str(), page["gap"]["fork"].as_i64()), (Some("history_lost"), Some(3)), "{page}");
    let next = app.publish("comment.posted", json!({"i": "next"})).await;
    let (ids, gap) = consume(&app, "waiting", Some(id), Some(next)).await;
    assert_eq!((ids, gap), (vec![next], Value::Null));
    let (ids, gap) = consume(&app, "waiting", None, None).await;
    assert_eq!((ids, gap), (vec![], Value::Null), "confirmed in the new epoch: told nothing again");
}

/// A real failover, as production has it: two tidings servers on a
/// multi-host `DATABASE_URL` (`target_session_attrs=read-write`) over a
/// primary and its asynchronous standby, with live streams on both, a
/// durable consumer and a WebSocket device; the standby falls behind (stopped) while two
/// publishes are acknowledged and seen live; the primary dies (`pg_ctl -m
/// immediate stop`) and the standby is promoted (`pg_ctl promote`). The
/// process finds the new primary by itself, publishing resumes within 5 s of
/// the promotion, the lost ids are never handed out again, and the client
/// that saw them is told; one that saw nothing lost goes on silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_that_lost_acknowledged_events_is_told_and_reuses_no_id() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: run the suite with scripts/test"));
    let (primary, standby) = (var("TIDINGS_TEST_FAILOVER_PRIMARY_URL"), var("TIDINGS_TEST_FAILOVER_STANDBY_URL"));
    let (name_url, name) = crate::helpers::fresh_database_on(&primary).await;
    let url = format!("postgres://postgres@{},{}/{name}?target_session_attrs=read-write", host_of(&primary), host_of(&standby));
    // Two tidings servers on the one database, each with its pools and its
    // LISTEN session.
    let app = spawn_app_with(Backend::Postgres, |s| s.database_url = Some(url.clone())).await;
    let other = spawn_app_with(Backend::Postgres, |s| s.database_url = Some(url.clone())).await;
    for i in 1..=3 {
        assert_eq!(app.publish("comment.posted", json!({"i": i})).await, i);
    }
    // A durable consumer (on the other server) and a WebSocket device (on
    // this one) confirm 3.
    assert_eq!(consume(&other, "worker", Some(0), Some(3)).await.0, vec![1, 2, 3]);
    let phone = Key::new();
    device_confirms(&app, &phone, Some(0), 3).await;
    // The standby holds the first three events and both cursors.
    let standby_db = standby.rsplit_once('/').unwrap().0.to_owned() + "/" + &name;
    wait_until(
        "the standby replays the first three events and the cursors",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || async {
            match tokio_postgres::connect(&standby_db, tokio_postgres::NoTls).await {
                Ok((client, conn)) => {
                    tokio::spawn(conn);
                    let held = "SELECT (SELECT last_id FROM tidings_head), (SELECT max(cursor) FROM consumer_subscriptions),
                                   (SELECT max(cursor) FROM tidings_device_cursors WHERE device_id = 'phone')";
                    client.query_one(held, &[]).await.is_ok_and(|r| {
                        (r.get::<_, i64>(0), r.get::<_, Option<i64>>(1), r.get::<_, Option<i64>>(2)) == (3, Some(3), Some(3))
                    })
                }
                Err(_) => false,
            }
        },
    )
    .await;
    drop(name_url);
    let (mut watching, _) = live(&app, 0, 3).await;
    let (mut watching_other, _) = live(&other, 0, 3).await;

    // The standby falls behind; two publishes are acknowledged and seen.
    pg_ctl("TIDINGS_TEST_FAILOVER_STANDBY_PG_CTL", &["-m", "fast", "stop"]).await;
    // Event 4 goes with an idempotency key, as a retrying publisher sends it.
    let keyed = || {
        app.http
            .post(app.url("/v1/events"))
            .header("Idempotency-Key", "four")
            .json(&json!({"event_type": "comment.posted", "payload": {"i": 4}}))
    };
    let answer = keyed().send().await.unwrap();
    assert_eq!(answer.status(), 201);
    assert_eq!(answer.json::<Value>().await.unwrap()["event_ids"], json!([4]));
    assert_eq!(app.publish("comment.posted", json!({"i": 5})).await, 5);
    assert_eq!(watching.ids(2).await, vec![4, 5]);
    assert_eq!(watching_other.ids(2).await, vec![4, 5], "the other server's client saw them too");
    assert_eq!(consume(&other, "worker", None, Some(5)).await.0, vec![4, 5]);
    device_confirms(&app, &phone, None, 5).await;

    // The primary dies; the standby, which never got 4 and 5, is promoted.
    pg_ctl("TIDINGS_TEST_FAILOVER_PRIMARY_PG_CTL", &["-m", "immediate", "stop"]).await;
    pg_ctl("TIDINGS_TEST_FAILOVER_STANDBY_PG_CTL", &["start"]).await;
    pg_ctl("TIDINGS_TEST_FAILOVER_STANDBY_PG_CTL", &["promote"]).await;

    // Publishing resumes within 5 s; what fails meanwhile is refused, never
    // acknowledged.
    let (after, refused) = publish_within_5s(&app, json!({"i": "after"})).await;
    let epochs = app.store.epochs(i32::MAX).await.unwrap();
    let epoch = epochs.current().clone();
    assert_eq!((epoch.number, epoch.fork, epoch.reason.as_str()), (1, 3, "timeline"), "{epochs:?}");
    assert_eq!(after, epoch.base + 1, "the first id of the new epoch, past 4 and 5 (after {refused} refusals)");

    // The client that saw 4 and 5 is ended and told on resume; the log holds
    // 1, 2, 3 and the new event.
    ends(&mut watching).await;
    let (gap, ids) = resume(&app, 5, 1).await;
    let gap = gap.expect("told");
    assert_eq!(
        (gap["reason"].as_str(), gap["fork"].as_i64(), gap["requested"].as_i64()),
        (Some("history_lost"), Some(3), Some(5)),
        "{gap}"
    );
    assert_eq!(ids, vec![after]);
    assert_eq!(resume(&app, 0, 4).await, (None, vec![1, 2, 3, after]));

    // The other server publishes within 5 s of the promotion too, in the
    // same epoch; its live client is ended and told as well.
    let (next, _) = publish_within_5s(&other, json!({"i": "other"})).await;
    assert_eq!(next, after + 1, "one epoch between the two servers");
    assert_eq!(other.store.epochs(i32::MAX).await.unwrap().current().number, 1);
    ends(&mut watching_other).await;
    let (gap, ids) = resume(&other, 5, 2).await;
    assert_eq!(gap.expect("told")["fork"].as_i64(), Some(3));
    assert_eq!(ids, vec![after, next]);
    // The cursors rolled back to 3 with the database: the consumer and the
    // device are each told once.
    let (polled, gap) = consume(&other, "worker", None, None).await;
    assert_eq!((polled, gap["reason"].as_str(), gap["fork"].as_i64()), (vec![after, next], Some("history_lost"), Some(3)), "{gap}");
    let mut device = ws::Client::connect(&app).await;
    assert_eq!(device.auth(&phone, json!({"device_id": "phone"})).await["result"]["cursor"], 3);
    let told = device.notification().await;
    assert_eq!((told["method"].as_str(), told["params"]["fork"].as_i64()), (Some("stream.gap"), Some(3)), "{told}");

    // The publisher of 4 retries with its key: the key was lost with the
    // event, so it is stored again, once, under a new id of the new epoch;
    // the final log holds every event under one id each.
    let answer = keyed().send().await.unwrap();
    assert_eq!((answer.status().as_u16(), answer.headers().get("idempotent-replayed")), (201, None));
    let again = answer.json::<Value>().await.unwrap()["event_ids"][0].as_i64().unwrap();
    assert_eq!(again, next + 1);
    let log: Value = app.http.get(app.url("/v1/poll?since=0&limit=100")).send().await.unwrap().json().await.unwrap();
    let log: Vec<(i64, Value)> =
        log["events"].as_array().unwrap().iter().map(|e| (e["event_id"].as_i64().unwrap(), e["payload"]["i"].clone())).collect();
    assert_eq!(log, vec![(1, json!(1)), (2, json!(2)), (3, json!(3)), (after, json!("after")), (next, json!("other")), (again, json!(4))]);
    let answer = keyed().send().await.unwrap();
    assert_eq!(
        answer.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_owned()),
        Some("true".into()),
        "kept in the new epoch"
    );
}
