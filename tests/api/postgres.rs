//! PostgreSQL specifics: one LISTEN connection per process, whatever the
//! number of clients.

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
    let rows = db
        .query("SELECT application_name, query FROM pg_stat_activity WHERE datname = $1 AND query ILIKE 'LISTEN%'", &[&name])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "exactly one LISTEN session: {:?}", rows.iter().map(|r| r.get::<_, String>(1)).collect::<Vec<_>>());
    assert_eq!(rows[0].get::<_, String>(0), "tidings-listener");
    let listeners: i64 = db
        .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'tidings-listener'", &[&name])
        .await
        .unwrap()
        .get(0);
    assert_eq!(listeners, 1);
}

/// Two servers on one database (each with its own broker and LISTEN
/// connection, as two processes would have): events published on one reach
/// the clients of the other, also across a LISTEN loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_one_database_survive_listen_loss() {
    let a = spawn_app(Backend::Postgres).await;
    let (url, name) = (a.db_url.clone().unwrap(), a.db_name.clone().unwrap());
    let mut settings = crate::helpers::test_settings();
    settings.database_url = Some(url.clone());
    let b = crate::helpers::start(settings, None, Some((url, name.clone()))).await;
    let mut clients = Vec::new();
    for _ in 0..10 {
        clients.push(b.stream("?types=comment.posted", None).await);
    }
    let db = a.db().await;
    let listeners = "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = 'tidings-listener'";
    // Both LISTEN sessions are up before we count on them.
    let mut waited = 0;
    while db.query(listeners, &[&name]).await.unwrap().len() < 2 {
        waited += 1;
        assert!(waited < 200, "both servers listen");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let mut published = Vec::new();
    for i in 0..100 {
        published.push(a.publish("comment.posted", json!({"i": i})).await);
        if i == 40 {
            // Kill every LISTEN session mid-run; server B must reconnect and
            // read everything after its high-water mark.
            let killed: i64 = db
                .query_one(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'tidings-listener'",
                    &[&name],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(killed, 2, "one LISTEN session per server");
        }
    }
    for c in &mut clients {
        assert_eq!(c.ids(published.len()).await, published, "every event once, in order, across the LISTEN loss");
    }
    let deep: serde_json::Value = b.http.get(b.url("/health/deep")).send().await.unwrap().json().await.unwrap();
    assert!(deep["listener"]["reconnects"].as_u64().unwrap() >= 1, "{deep}");
    assert_eq!(db.query(listeners, &[&name]).await.unwrap().len(), 2, "one LISTEN each after reconnecting");
}
