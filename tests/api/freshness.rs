//! How far delivery is behind commits (docs/metrics.md, "Freshness"):
//! `/health/deep` and the gauges say it on both stores; on PostgreSQL an
//! outbox mover that stops and a LISTEN session that hears nothing while
//! events are committed show there, and go back once they move again. A
//! broker that stops alone cannot be made to from outside the process
//! (nothing a client or the database does holds it while commits go on),
//! so its measure is held to a broker position kept still.
//! (That the alerts fire on those gauges: `alerts.test.yml`, run by
//! `tests/api/metrics.rs`.)

use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, spawn_app, wait_until};

both_stores!(a_caught_up_process_is_fresh, a_broker_held_still_while_commits_go_on_shows);

async fn freshness(app: &TestApp) -> Value {
    app.deep().await.1["freshness"].clone()
}

async fn a_caught_up_process_is_fresh(backend: Backend) {
    let app = spawn_app(backend).await;
    app.publish("comment.posted", json!({})).await;
    wait_until("the broker holds the head", Duration::from_secs(10), Duration::from_millis(20), || async {
        freshness(&app).await["broker_behind_events"] == 0
    })
    .await;
    let f = freshness(&app).await;
    assert_eq!(f["broker_behind_ms"], 0, "{f}");
    match backend {
        Backend::Embedded => assert!(f["listener_silence_ms"].is_null() && f["outbox_oldest_ms"].is_null(), "{f}"),
        Backend::Postgres => {
            assert!(f["listener_silence_ms"].as_u64().is_some_and(|ms| ms < 10_000), "the publish was heard: {f}");
            assert_eq!(f["outbox_oldest_ms"], 0, "{f}");
        }
    }
    // The gauges exist from the start (measured every 5 s).
    let text = app.http.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    for family in ["tidings_broker_behind_seconds", "tidings_listener_silence_seconds", "tidings_outbox_oldest_age_seconds"] {
        assert!(text.lines().any(|l| l.starts_with(&format!("{family} "))), "{family}");
    }
}

/// The outbox mover held up (a session holds its turn): the oldest row's
/// age grows in `/health/deep` and in the gauge; once let go, it is moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_outbox_mover_shows() {
    let app = spawn_app(Backend::Postgres).await;
    let mut holder = app.db().await;
    let turn = holder.transaction().await.unwrap();
    turn.query_one("SELECT 1 FROM tidings.mover FOR UPDATE", &[]).await.unwrap();
    app.db().await.batch_execute("SELECT tidings.publish('comment.posted')").await.unwrap();
    wait_until("the outbox's oldest row to age", Duration::from_secs(30), Duration::from_millis(100), || async {
        freshness(&app).await["outbox_oldest_ms"].as_u64().is_some_and(|ms| ms >= 2_000)
    })
    .await;
    wait_until("the gauge to show it", Duration::from_secs(30), Duration::from_millis(200), || async {
        app.metric("tidings_outbox_oldest_age_seconds").await >= 2.0
    })
    .await;
    turn.rollback().await.unwrap();
    wait_until("the row to be moved", Duration::from_secs(30), Duration::from_millis(50), || async {
        freshness(&app).await["outbox_oldest_ms"] == 0
    })
    .await;
}

/// The LISTEN session lost and kept from coming back (the database takes no
/// new connections) while publishes go on through the connections the
/// pools hold: its silence grows; once it reconnects, it hears again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_listen_session_shows() {
    let app = spawn_app(Backend::Postgres).await;
    // The pools hold connections before the database closes its door.
    for i in 0..4 {
        app.publish("comment.posted", json!({"warm": i})).await;
    }
    let db = app.db().await;
    let name: String = db.query_one("SELECT current_database()", &[]).await.unwrap().get(0);
    let (admin, conn) = tokio_postgres::connect(&crate::helpers::admin_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    admin.batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false")).await.unwrap();
    assert_eq!(crate::helpers::terminate_listeners(&admin, &name).await, 1, "the LISTEN session was found");
    let mut published = 0;
    wait_until(
        "the LISTEN session's silence to grow while events are published",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            published += 1;
            let app = &app;
            async move {
                app.publish("comment.posted", json!({"during": published})).await;
                freshness(app).await["listener_silence_ms"].as_u64().is_some_and(|ms| ms >= 3_000)
            }
        },
    )
    .await;
    admin.batch_execute(&format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true")).await.unwrap();
    wait_until("the LISTEN session to hear again", Duration::from_secs(30), Duration::from_millis(100), || async {
        app.publish("comment.posted", json!({"after": true})).await;
        freshness(&app).await["listener_silence_ms"].as_u64().is_some_and(|ms| ms < 2_000)
    })
    .await;
}

/// A broker that stopped at some position while commits go on: the
/// measure counts every event committed past it and the age of the oldest,
/// while the process's own broker, which kept moving, is fresh.
async fn a_broker_held_still_while_commits_go_on_shows(backend: Backend) {
    let app = spawn_app(backend).await;
    app.publish("comment.posted", json!({"before": true})).await;
    let stopped_at = app.store.head().await.unwrap();
    let held = tidings_server::service::freshness::measure_at(app.store.as_ref(), stopped_at).await.unwrap();
    assert_eq!((held.broker_behind_events, held.broker_behind_ms), (0, 0), "{held:?}");
    for i in 0..3 {
        app.publish("comment.posted", json!({"after": i})).await;
    }
    let measure = || tidings_server::service::freshness::measure_at(app.store.as_ref(), stopped_at);
    wait_until("the held broker's oldest unsent event to age", Duration::from_secs(10), Duration::from_millis(50), || async {
        measure().await.unwrap().broker_behind_ms >= 1_000
    })
    .await;
    let held = measure().await.unwrap();
    assert_eq!(held.broker_behind_events, 3, "{held:?}");
    assert!(held.broker_behind_ms < 60_000, "the oldest is the first published after it: {held:?}");
    let own = freshness(&app).await;
    assert_eq!((own["broker_behind_events"].as_u64(), own["broker_behind_ms"].as_u64()), (Some(0), Some(0)), "{own}");
}
