//! The SQL door of the W3C trace context (docs/tracing.md; PostgreSQL
//! only): `tidings.publish`'s `traceparent` and `tracestate` arguments, or
//! else the session's `tidings.traceparent` and `tidings.tracestate`
//! settings, reach the event's envelope; a malformed one refuses the call
//! and queues nothing. The migration that gave the function its new
//! arguments keeps every role's right to call it.

use std::ops::ControlFlow;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::{Backend, TestApp, fresh_database, gather, spawn_app, spawn_app_with};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const SESSION: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

/// The log's events after `since` with their trace context:
/// `(event_type, traceparent, tracestate)`, once `n` are there.
async fn traced(app: &TestApp, since: i64, n: usize) -> Vec<(String, Option<String>, Option<String>)> {
    let what = |got: &Vec<_>| format!("{} of {n} events moved out of the outbox: {got:?}", got.len());
    gather(Duration::from_secs(30), Vec::new(), what, |_| async move {
        let page: Value =
            app.http.get(app.url(&format!("/v1/poll?since={since}&limit=100&wait_ms=1000"))).send().await.unwrap().json().await.unwrap();
        let got: Vec<_> = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let field = |name: &str| e[name].as_str().map(str::to_owned);
                (e["event_type"].as_str().unwrap().to_owned(), field("traceparent"), field("tracestate"))
            })
            .collect();
        if got.len() >= n { ControlFlow::Break(got) } else { ControlFlow::Continue(got) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql_publish_carries_its_trace_context() {
    let app = spawn_app(Backend::Postgres).await;
    let db = app.db().await;
    let head = app.head().await;
    // Refused in the caller's transaction: nothing queued.
    for (call, code) in [
        ("SELECT tidings.publish('comment.posted', traceparent => '00-xyz')", "invalid_traceparent"),
        (&format!("SELECT tidings.publish('comment.posted', traceparent => '{PARENT}', tracestate => 'Bad=1')"), "invalid_tracestate"),
        (
            &format!("BEGIN; SET LOCAL tidings.traceparent = '{}'; SELECT tidings.publish('comment.posted')", &PARENT[..20]),
            "invalid_traceparent",
        ),
    ] {
        let refused = db.batch_execute(call).await.unwrap_err();
        assert_eq!(refused.as_db_error().map(|e| e.message()), Some(code), "{call}: {refused}");
        db.batch_execute("ROLLBACK").await.unwrap();
    }
    let queued: i64 = db.query_one("SELECT count(*) FROM tidings.outbox", &[]).await.unwrap().get(0);
    assert_eq!(queued, 0, "no refused call queued anything");

    // By argument; from the session's settings for one transaction; none.
    db.batch_execute(&format!("SELECT tidings.publish('comment.posted', traceparent => '{PARENT}', tracestate => 'congo=t61rcWkgMzE')"))
        .await
        .unwrap();
    db.batch_execute(&format!(
        "BEGIN; SET LOCAL tidings.traceparent = '{SESSION}'; SET LOCAL tidings.tracestate = 'rojo=1'; SELECT tidings.publish('comment.edited'); COMMIT;"
    ))
    .await
    .unwrap();
    db.batch_execute("SELECT tidings.publish('comment.posted')").await.unwrap();
    let got = traced(&app, head, 3).await;
    let owned = |s: &str| Some(s.to_owned());
    assert_eq!(
        got,
        [
            ("comment.posted".to_owned(), owned(PARENT), owned("congo=t61rcWkgMzE")),
            ("comment.edited".to_owned(), owned(SESSION), owned("rojo=1")),
            ("comment.posted".to_owned(), None, None),
        ]
    );
}

/// A database at the schema before the function took a trace context, with
/// a role granted EXECUTE on the old function, migrated by a tidings start:
/// the role calls the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migration_keeps_every_role_s_right_to_publish() {
    let (url, _) = fresh_database().await;
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    db.batch_execute(
        "CREATE TABLE tidings_migrations (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .unwrap();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for file in files {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        let version: i32 = name[..4].parse().unwrap();
        if version >= 19 {
            continue;
        }
        db.batch_execute(&std::fs::read_to_string(&file).unwrap()).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        db.execute("INSERT INTO tidings_migrations (version, name) VALUES ($1, $2)", &[&version, &name]).await.unwrap();
    }
    let role = format!("shop_{}", rand::random::<u32>());
    db.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA tidings TO {role};
         GRANT EXECUTE ON FUNCTION tidings.publish(TEXT, JSONB, TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TIMESTAMPTZ, TEXT) TO {role};"
    ))
    .await
    .unwrap();
    let app = spawn_app_with(Backend::Postgres, |s| s.database_url = Some(url.clone())).await;
    let (shop, conn) = tokio_postgres::connect(&url.replacen("postgres@", &format!("{role}@"), 1), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    shop.batch_execute(&format!("SELECT tidings.publish('comment.posted', traceparent => '{PARENT}')")).await.unwrap();
    let got = traced(&app, 0, 1).await;
    assert_eq!(got, [("comment.posted".to_owned(), Some(PARENT.to_owned()), None)]);
}
