//! The log's epochs from outside: `tidings epoch` and backups, resuming and
//! living streams across an epoch, and driving PostgreSQL (`pg_ctl`) to
//! promote, stop and restart the clusters the failover tests use.

use std::time::Duration;

use serde_json::{Value, json};

use std::ops::ControlFlow;

use super::{Backend, Stream, TestApp};

/// Runs `tidings epoch <verb>` on a store as an operator would, with the
/// server stopped; its JSON output.
pub(crate) async fn epoch_command(verb: &str, data_dir: &std::path::Path, database_url: Option<&str>) -> Value {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_tidings"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("TIDINGS_DATA_DIR", data_dir)
        .env("TIDINGS_REGISTRY", concat!(env!("CARGO_MANIFEST_DIR"), "/registry"))
        .args(["epoch", verb]);
    if let Some(url) = database_url {
        cmd.env("DATABASE_URL", url);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output()).await.expect("tidings epoch finished").unwrap();
    assert!(out.status.success(), "tidings epoch {verb}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("tidings epoch {verb} printed JSON: {e}"))
}

/// A copy of a stopped server's store, as a backup holds it: the data
/// directory's files into `into`, or a new database made from the
/// server's (whose URL is answered).
pub(crate) async fn backup(
    backend: Backend,
    data_dir: &std::path::Path,
    database_url: Option<&str>,
    into: &std::path::Path,
) -> Option<String> {
    std::fs::create_dir_all(into).unwrap();
    match backend {
        Backend::Embedded => {
            for entry in std::fs::read_dir(data_dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_file() {
                    std::fs::copy(entry.path(), into.join(entry.file_name())).unwrap();
                }
            }
            None
        }
        Backend::Postgres => {
            let (base, source) = database_url.unwrap().rsplit_once('/').unwrap();
            let name = format!("t_{}", rand::random::<u64>());
            let (client, conn) = tokio_postgres::connect(&crate::helpers::admin_url(), tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            // PostgreSQL waits a few seconds for the stopped server's
            // sessions to end before it copies.
            client.batch_execute(&format!("CREATE DATABASE {name} TEMPLATE {source}")).await.expect("copying the database");
            Some(format!("{base}/{name}"))
        }
    }
}

/// The gap a resumed stream announces first, or `None` if its first frame
/// is an event; and the ids of the next `n` events.
pub(crate) async fn resume(app: &TestApp, last_event_id: i64, n: usize) -> (Option<Value>, Vec<i64>) {
    let mut stream: Stream = app.stream("", Some(last_event_id)).await;
    let first = stream.next().await;
    let (gap, mut ids) = match first.event.as_deref() {
        Some("system.replay_gap") => (Some(serde_json::from_str(&first.data).unwrap()), Vec::new()),
        None => (None, vec![first.id.unwrap().parse().unwrap()]),
        Some(other) => panic!("unexpected frame {other}"),
    };
    if ids.len() < n {
        ids.extend(stream.ids(n - ids.len()).await);
    }
    (gap, ids)
}

/// Opens a live stream after `since` and reads `n` event ids.
pub(crate) async fn live(app: &TestApp, since: i64, n: usize) -> (Stream, Vec<i64>) {
    let mut stream = app.stream(&format!("?since={since}"), None).await;
    let ids = stream.ids(n).await;
    (stream, ids)
}

/// The next id a stream delivers after ending and resuming as a browser
/// would: the stream ends (the broker found it may have shown lost
/// events), and the resume announces the loss.
pub(crate) async fn ends(stream: &mut Stream) {
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(e) = stream.next_or_end().await {
            assert!(e.event.is_some(), "no event is delivered across a lost suffix: {e:?}");
        }
    })
    .await
    .expect("the stream ends");
}

/// Runs a `pg_ctl` command line from the test environment (`PG_CTL` of
/// scripts/pg.sh: a `runuser` prefix, the binary, its data directory) with
/// `args`.
pub(crate) async fn pg_ctl(variable: &str, args: &[&str]) {
    let line = std::env::var(variable).unwrap_or_else(|_| panic!("{variable} is not set: run the suite with scripts/test"));
    pg_ctl_line(&line, args).await;
}

/// Runs the `pg_ctl` command `line` (a `runuser` prefix, the binary, its
/// data directory) with `args`, for at most 60 s.
pub(crate) async fn pg_ctl_line(line: &str, args: &[&str]) {
    let mut words = line.split_whitespace();
    let mut cmd = tokio::process::Command::new(words.next().unwrap());
    cmd.args(words).args(args).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    let status = tokio::time::timeout(Duration::from_secs(60), cmd.status()).await.expect("pg_ctl finished").unwrap();
    assert!(status.success(), "pg_ctl {args:?} ({line})");
}

/// Publishes `payload` through a failover, retrying each `503` for up to 5 s
/// (any other answer fails the test): the id, and how many were refused.
pub(crate) async fn publish_within_5s(app: &TestApp, payload: Value) -> (i64, u32) {
    crate::helpers::gather(
        Duration::from_secs(5),
        0,
        |refused| format!("publishing to resume within 5 s of the promotion ({refused} refused)"),
        |refused| {
            let body = json!({"event_type": "comment.posted", "payload": payload.clone()});
            async move {
                match app.post_events(&body).await {
                    (201, body) => ControlFlow::Break((body["event_ids"][0].as_i64().unwrap(), refused)),
                    (503, _) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        ControlFlow::Continue(refused + 1)
                    }
                    (status, body) => panic!("a publish during the failover answered {status}: {body}"),
                }
            }
        },
    )
    .await
}

/// `host:port` of a test cluster's URL.
pub(crate) fn host_of(url: &str) -> &str {
    url.split_once('@').unwrap().1.split('/').next().unwrap()
}
