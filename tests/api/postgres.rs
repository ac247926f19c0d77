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
