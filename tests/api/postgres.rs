//! PostgreSQL specifics: one LISTEN connection per process, whatever the
//! number of clients.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{Backend, spawn_app};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_listen_connection_for_a_hundred_clients() {
    let app = spawn_app(Backend::Postgres).await;
    let mut streams = Vec::new();
    for _ in 0..100 {
        streams.push(app.stream("?types=comment.*", None).await);
    }
    let id = app.publish("comment.posted", json!({})).await;
    for s in &mut streams {
        assert_eq!(s.ids(1).await, vec![id], "every client receives the event");
    }
    let db = app.db().await;
    let name = app.db_name.clone().unwrap();
    let listening = "SELECT application_name, query FROM pg_stat_activity WHERE datname = $1 AND query ILIKE 'LISTEN%'";
    // The LISTEN session settles the log's epoch before it listens (the
    // clients above were served by the publishing process's own hand-off).
    crate::helpers::wait_until("the LISTEN session to listen", Duration::from_secs(10), Duration::from_millis(20), || async {
        !db.query(listening, &[&name]).await.unwrap().is_empty()
    })
    .await;
    let rows = db.query(listening, &[&name]).await.unwrap();
    assert_eq!(rows.len(), 1, "exactly one LISTEN session: {:?}", rows.iter().map(|r| r.get::<_, String>(1)).collect::<Vec<_>>());
    assert_eq!(rows[0].get::<_, String>(0), "tidings-listener");
    let listeners: i64 = db
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'tidings-listener'", &[&name])
        .await
        .unwrap()
        .get(0);
    assert_eq!(listeners, 1);
}

/// Two server processes on one database: events published on one reach the
/// clients of the other, also across a LISTEN loss; one LISTEN each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_one_database_survive_listen_loss() {
    let a = spawn_app(Backend::Postgres).await;
    let (url, name) = (a.db_url.clone().unwrap(), a.db_name.clone().unwrap());
    // B is the real binary in its own process.
    let b_dir = tempfile::tempdir().unwrap();
    let b = crate::helpers::spawn_process(&[("DATABASE_URL", url), ("TIDINGS_DATA_DIR", b_dir.path().display().to_string())]).await;
    let mut clients = Vec::new();
    for _ in 0..10 {
        let reader = tidings_client::sse::connect(&a.http, &format!("{}/v1/stream?types=comment.posted", b.base), None).await.unwrap();
        clients.push(reader);
    }
    let db = a.db().await;
    let listeners = "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = 'tidings-listener'";
    // Both LISTEN sessions are up before we count on them.
    crate::helpers::wait_until(
        "both servers to listen",
        std::time::Duration::from_secs(5),
        std::time::Duration::from_millis(25),
        || async { db.query(listeners, &[&name]).await.unwrap().len() >= 2 },
    )
    .await;
    let mut published = Vec::new();
    for i in 0..100 {
        published.push(a.publish("comment.posted", json!({"i": i})).await);
        if i == 40 {
            // Kill every LISTEN session mid-run; server B must reconnect and
            // read everything after its high-water mark.
            assert_eq!(crate::helpers::terminate_listeners(&db, &name).await, 2, "one LISTEN session per server");
        }
    }
    for c in &mut clients {
        let mut got = Vec::new();
        while got.len() < published.len() {
            let e = tokio::time::timeout(std::time::Duration::from_secs(10), c.next_event()).await.expect("delivery").expect("open stream");
            assert_eq!(e.event, None, "no system notice: {e:?}");
            got.push(e.id.unwrap().parse::<i64>().unwrap());
        }
        assert_eq!(got, published, "every event once, in order, across the LISTEN loss");
    }
    let deep: serde_json::Value = a.http.get(format!("{}/health/deep", b.base)).send().await.unwrap().json().await.unwrap();
    assert!(deep["listener"]["reconnects"].as_u64().unwrap() >= 1, "{deep}");
    assert_eq!(db.query(listeners, &[&name]).await.unwrap().len(), 2, "one LISTEN each after reconnecting");
}

/// The database stops under a running server: publishing answers `503` with
/// `Retry-After` promptly (no hang), `/health/deep` says the database is
/// down, connected streams stay open on heartbeats, and once the database is
/// back everything resumes without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_outage_and_recovery() {
    use futures_util::StreamExt as _;
    let admin = std::env::var("TIDINGS_TEST_OUTAGE_DATABASE_URL").expect("scripts/test starts the outage cluster");
    let ctl = std::env::var("TIDINGS_TEST_OUTAGE_PG_CTL").unwrap();
    let pg_ctl = |action: &'static str| {
        let cmd = format!("{ctl} {action}");
        async move {
            let status = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .await
                .unwrap();
            assert!(status.success(), "{cmd}");
        }
    };
    let (url, name) = crate::helpers::fresh_database_on(&admin).await;
    let mut settings = crate::helpers::test_settings();
    settings.database_url = Some(url.clone());
    settings.postgres.db_timeout = std::time::Duration::from_secs(1);
    settings.streams.heartbeat = std::time::Duration::from_millis(100);
    let app = crate::helpers::start(settings, None, Some((url, name))).await;

    let response = app.http.get(app.url("/v1/stream?types=comment.posted")).send().await.unwrap();
    let mut body = response.bytes_stream();
    let mut parser = tidings_client::sse::SseParser::default();
    let first = app.publish("comment.posted", json!({})).await;
    let mut events = Vec::new();
    while events.is_empty() {
        events.extend(parser.feed(&body.next().await.unwrap().unwrap()));
    }
    assert_eq!(events[0].id.as_deref(), Some(first.to_string().as_str()));

    pg_ctl("stop -m fast").await;
    let started = std::time::Instant::now();
    let (status, answer) = app.post_events(&json!({"event_type": "comment.posted"})).await;
    assert_eq!((status, answer["error"].as_str()), (503, Some("store_unavailable")), "{answer}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "no hang: answered in {:?}", started.elapsed());
    let r = app.http.post(app.url("/v1/events")).json(&json!({"event_type": "comment.posted"})).send().await.unwrap();
    assert_eq!(r.headers()["retry-after"], "1");
    let (status, deep) = app.deep().await;
    assert_eq!((status, deep["database"].as_str()), (503, Some("down")));
    assert_eq!(deep["status"], "degraded", "{deep}");
    // The stream stays open: heartbeats keep arriving while the database is down.
    let beats = parser.comments;
    while parser.comments < beats + 2 {
        let chunk =
            tokio::time::timeout(std::time::Duration::from_secs(5), body.next()).await.expect("heartbeats continue").unwrap().unwrap();
        assert!(parser.feed(&chunk).is_empty(), "no event while the database is down");
    }

    pg_ctl("start").await;
    // Recovery without a restart: publishing works again (the pool reconnects)…
    let mut tries = 0;
    let second = loop {
        let (status, answer) = app.post_events(&json!({"event_type": "comment.posted"})).await;
        if status == 201 {
            break answer["event_ids"][0].as_i64().unwrap();
        }
        tries += 1;
        assert!(tries < 100, "publishing recovers: {answer}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    // …and the same stream receives the new event.
    let mut got = Vec::new();
    while got.is_empty() {
        let chunk =
            tokio::time::timeout(std::time::Duration::from_secs(10), body.next()).await.expect("delivery resumes").unwrap().unwrap();
        got.extend(parser.feed(&chunk));
    }
    assert_eq!(got[0].id.as_deref(), Some(second.to_string().as_str()));
    assert_eq!(second, first + 1, "nothing half-written while the database was down");
    let (status, deep) = app.deep().await;
    assert_eq!((status, deep["database"].as_str(), deep["status"].as_str()), (200, Some("up"), Some("ok")), "{deep}");
}
