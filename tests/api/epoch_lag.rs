//! A new epoch that loses history a client was shown ahead of its
//! process's broker (docs/failover.md, "What each client is told"): a
//! device that paged `sync.delta` past a broker whose LISTEN session was
//! down, and a stream resumed from an id another process had shown it,
//! are ended when that broker crosses into the new epoch, though its own
//! position survived, and are told when they resume.
//!
//! PostgreSQL only: a broker on the embedded store reads every commit in
//! its own process and cannot lag behind what a transport reads.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::device::{self as ws, Key};
use crate::helpers::epochs::{ends, live, publish_within_5s, resume};
use crate::helpers::{Backend, spawn_app, spawn_app_with, wait_until};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_shown_history_ahead_of_a_lagging_broker_are_told_when_it_is_lost() {
    let lagging = spawn_app(Backend::Postgres).await;
    let url = lagging.db_url.clone();
    let publisher = spawn_app_with(Backend::Postgres, |s| s.database_url = url.clone()).await;
    for i in 1..=3 {
        assert_eq!(publisher.publish("comment.posted", json!({"i": i})).await, i);
    }
    wait_until("the lagging process's broker to read 1 to 3", Duration::from_secs(20), Duration::from_millis(20), || async {
        lagging.deep().await.1["broker_position"] == 3
    })
    .await;
    // A stream on the lagging process that saw 1 to 3, and will see nothing
    // lost.
    let (mut behind_the_fork, seen) = live(&lagging, 0, 3).await;
    assert_eq!(seen, vec![1, 2, 3]);
    let db = lagging.db().await;
    let name: String = db.query_one("SELECT current_database()", &[]).await.unwrap().get(0);
    let (admin, conn) = tokio_postgres::connect(&crate::helpers::admin_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);

    // Both LISTEN sessions are lost and kept from coming back (the pools
    // keep the connections they hold): the lagging broker stays at 3, while
    // the publisher's, woken in its own process, reads what it publishes.
    admin.batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false")).await.unwrap();
    assert_eq!(crate::helpers::terminate_listeners(&admin, &name).await, 2, "both LISTEN sessions were found");
    assert_eq!(publisher.publish("comment.posted", json!({"i": 4})).await, 4);
    assert_eq!(publisher.publish("comment.posted", json!({"i": 5})).await, 5);

    // A device on the lagging process pages 4 and 5 from the store and goes
    // live ahead of its broker.
    let phone = Key::new();
    let mut device = ws::Client::connect(&lagging).await;
    assert_eq!(device.hello["params"]["head_seq"], 3, "the broker lags: {}", device.hello);
    let answer = device.auth(&phone, json!({"device_id": "phone", "cursor": 3})).await;
    assert_eq!((answer["result"]["head_seq"].as_i64(), answer["result"]["cursor"].as_i64()), (Some(5), Some(3)), "{answer}");
    let page = device.call("sync.delta", json!({"device_id": "phone", "since": 3})).await;
    let items: Vec<i64> = page["result"]["items"].as_array().unwrap().iter().map(|i| i["seq"].as_i64().unwrap()).collect();
    assert_eq!((items, page["result"]["has_more"].as_bool()), (vec![4, 5], Some(false)), "{page}");
    // A browser that saw 4 and 5 at the publisher resumes at the lagging
    // process.
    let mut resumed = lagging.stream("", Some(5)).await;

    // The database fails over to a standby that never got 4 and 5 (as the
    // epochs tests do it: the rows gone, a new timeline), and takes
    // connections again.
    db.batch_execute(
        "DELETE FROM events WHERE id > 3;
         UPDATE tidings_head SET last_id = 3, timeline = timeline + 1",
    )
    .await
    .unwrap();
    admin.batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true")).await.unwrap();
    let (after, _) = publish_within_5s(&publisher, json!({"i": "after"})).await;
    let epoch = publisher.store.epochs(i32::MAX).await.unwrap().current().clone();
    assert_eq!((epoch.fork, after), (3, epoch.base + 1));

    // The lagging broker hears again and crosses from 3, which survived;
    // the stream that saw only up to 3 goes on silently with the new event.
    assert_eq!(behind_the_fork.ids(1).await, vec![after]);
    // The two clients shown 4 and 5 are ended before any event of the new
    // epoch reaches them.
    let frames = device.frames_until_closed().await;
    assert!(frames.iter().all(|f| f["method"] != "stream.event"), "no event across a lost suffix: {frames:?}");
    ends(&mut resumed).await;

    // And told when they resume from what they saw.
    let mut device = ws::Client::connect(&lagging).await;
    let answer = device.auth(&phone, json!({"device_id": "phone", "cursor": 5})).await;
    assert_eq!(answer["result"]["cursor"], 5, "{answer}");
    let page = device.call("sync.delta", json!({"device_id": "phone", "since": 5})).await;
    let gap = &page["result"]["gap"];
    assert_eq!((gap["reason"].as_str(), gap["fork"].as_i64()), (Some("history_lost"), Some(3)), "{page}");
    let items: Vec<Value> = page["result"]["items"].as_array().unwrap().iter().map(|i| i["seq"].clone()).collect();
    assert_eq!(items, vec![json!(after)], "{page}");
    let (gap, ids) = resume(&lagging, 5, 1).await;
    let gap = gap.expect("told");
    assert_eq!((gap["reason"].as_str(), gap["fork"].as_i64(), gap["requested"].as_i64()), (Some("history_lost"), Some(3), Some(5)));
    assert_eq!(ids, vec![after]);
}

/// A resume point past the head, asked of a process that saw ids committed
/// past it before any epoch says they were lost (the database was promoted
/// and neither a publish nor the LISTEN session noticed yet): the process
/// checks the epoch at once, and the client is told `history_lost` rather
/// than `beyond_head`, whose `next_since` would have moved it back to the
/// fork without a word. A process that saw nothing past the head takes no
/// client's word for it: `beyond_head`, and no epoch begins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_past_the_head_that_the_process_saw_committed_is_told_it_was_lost() {
    let app = spawn_app(Backend::Postgres).await;
    for i in 1..=5 {
        assert_eq!(app.publish("comment.posted", json!({"i": i})).await, i);
    }
    let db = app.db().await;
    db.batch_execute("DELETE FROM events WHERE id > 3; UPDATE tidings_head SET last_id = 3, timeline = timeline + 1").await.unwrap();
    let page: Value = app.http.get(app.url("/v1/poll?since=5")).send().await.unwrap().json().await.unwrap();
    assert_eq!((page["gap"]["reason"].as_str(), page["gap"]["fork"].as_i64()), (Some("history_lost"), Some(3)), "{page}");
    let epoch = app.store.epochs(i32::MAX).await.unwrap().current().clone();
    assert_eq!((epoch.number, epoch.fork, epoch.reason.as_str()), (1, 3, "timeline"));
    let (gap, _) = resume(&app, 4, 0).await;
    assert_eq!(gap.expect("told")["reason"], "history_lost");

    // A process that saw nothing past the head: a client's word is not
    // enough to begin an epoch.
    let other = spawn_app(Backend::Postgres).await;
    other.publish("comment.posted", json!({})).await;
    let page: Value = other.http.get(other.url("/v1/poll?since=1000")).send().await.unwrap().json().await.unwrap();
    assert_eq!(page["gap"]["reason"], "beyond_head", "{page}");
    assert_eq!(other.store.epochs(i32::MAX).await.unwrap().all().len(), 1, "no epoch on a client's word");
}
