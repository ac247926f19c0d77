//! Hot standbys serve history (`TIDINGS_REPLICA_URLS`), PostgreSQL only
//! (the embedded store is one process's file by nature): `scripts/test`
//! starts two hot standbys of a throwaway cluster of their own
//! (`pg_basebackup -R`, streaming replication). Replays, polls and
//! `sync.delta` read through a standby while publishers run and still see
//! every id exactly once, in order; history a caught-up standby holds
//! costs the primary no read; and a standby that lags (its replay paused)
//! or stops changes nothing a client sees. The second standby is this
//! file's alone to pause and stop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::device::{Client, Key};
use crate::helpers::eventually;
use crate::helpers::{TestApp, spawn_app_on};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_read_through_the_standby_exactly_once() {
    history_is_read_through_the_standby_exactly_once_on("TIDINGS_TEST_STANDBY_URL").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_reads_notified_commits_at_the_standby() {
    // A reads its tail at the standby; B, on the same database, publishes
    // (so A learns of each commit by NOTIFY and reads it, rather than being
    // handed its own).
    let a = on_their_primary(|s| {
        s.postgres.replica_urls = vec![standby_url("TIDINGS_TEST_STANDBY_URL", s.database_url.as_deref().unwrap())];
        s.postgres.broker_reads = tidings_server::config::BrokerReads::Replica;
    })
    .await;
    let url = a.db_url.clone().unwrap();
    let b = on_their_primary(|s| s.database_url = Some(url)).await;
    eventually("the standby serves", || async { standby(&a).await["usable"] == true }).await;
    let mut stream = a.stream("?types=probe.*", None).await;
    let batches = 40;
    let mut last = 0;
    for _ in 0..batches {
        last = publish_many(&b, 10).await;
    }
    let mut ids = Vec::new();
    while ids.last().copied().unwrap_or(0) < last {
        ids.push(stream.next().await.id.as_deref().unwrap().parse::<i64>().unwrap());
    }
    assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "every commit delivered once, in order");
    let replicas = &a.deep().await.1["replicas"];
    let primary = replicas["primary_broker_reads"].as_i64().unwrap();
    assert!(replicas["standbys"][0]["reads"].as_i64().unwrap() > 0, "the standby answered the broker: {replicas}");
    assert!(primary * 2 <= batches, "most of {batches} commits were read at the standby, not the primary ({primary}): {replicas}");
    let metrics = a.http.get(a.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("tidings_broker_reads_total{target=\"replica\"}"), "counted by target");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standbys_show_only_to_admins() {
    use crate::helpers::tokens::{SECRET, token};
    let app = on_their_primary(|s| {
        s.auth.jwt_hs256_secret = Some(SECRET.into());
        s.postgres.replica_urls = vec![standby_url("TIDINGS_TEST_STANDBY_URL", s.database_url.as_deref().unwrap())];
    })
    .await;
    let host = std::env::var("TIDINGS_TEST_STANDBY_URL").unwrap().split('@').nth(1).unwrap().split('/').next().unwrap().to_owned();
    let seen = app.deep_as(Some(token("ops", json!({"admin": true})))).await;
    assert!(seen["replicas"]["standbys"][0]["replica"].as_str().unwrap().starts_with(&host), "an admin sees the standbys: {seen}");
    for caller in [None, Some(token("someone", json!({"subscribe": ["**"]})))] {
        let shown = app.deep_as(caller).await;
        assert!(shown["replicas"].is_null() && !shown.to_string().contains(&host), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_or_stopped_standby_changes_nothing_a_client_sees() {
    lagging_or_stopped().await
}

/// A PostgreSQL server on a fresh database of the standbys' own primary
/// (`scripts/test` keeps it apart, so that only this file's databases are
/// copied to two standbys).
async fn on_their_primary(configure: impl FnOnce(&mut tidings_server::config::Settings)) -> TestApp {
    spawn_app_on(&their_primary(), configure).await
}

/// The standbys' primary's URL (its `postgres` database).
fn their_primary() -> String {
    std::env::var("TIDINGS_TEST_REPLICAS_PRIMARY_URL")
        .expect("TIDINGS_TEST_REPLICAS_PRIMARY_URL is not set: run the suite with scripts/test, which starts it")
}

/// The standby (named by the environment variable `var`) URL of the
/// database `primary` names.
fn standby_url(var: &str, primary: &str) -> String {
    let standby = std::env::var(var).unwrap_or_else(|_| panic!("{var} is not set: run the suite with scripts/test, which starts standbys"));
    let (base, _) = standby.rsplit_once('/').unwrap();
    let (_, db) = primary.rsplit_once('/').unwrap();
    format!("{base}/{db}")
}

/// A PostgreSQL server whose history is read at the standby `var` names.
async fn with_standby(var: &'static str, max_lag: Duration) -> TestApp {
    on_their_primary(|s| {
        s.postgres.replica_urls = vec![standby_url(var, s.database_url.as_deref().unwrap())];
        s.postgres.replica_max_lag = max_lag;
    })
    .await
}

/// The standby's entry in `/health/deep`.
async fn standby(app: &TestApp) -> Value {
    app.deep().await.1["replicas"]["standbys"][0].clone()
}

/// Waits until the first standby's copy of the database `url` names holds
/// the log up to `head` (at most 30 s): the copy itself may not be there
/// yet, as the standby replays the database's creation too.
async fn until_the_standby_holds(url: &str, head: i64) {
    let at_standby = standby_url("TIDINGS_TEST_STANDBY_URL", url);
    crate::helpers::wait_until("the standby holds the log", Duration::from_secs(30), Duration::from_millis(20), || async {
        let Ok((client, conn)) = tokio_postgres::connect(&at_standby, tokio_postgres::NoTls).await else { return false };
        tokio::spawn(conn);
        client.query_one("SELECT coalesce(max(id), 0) FROM events", &[]).await.is_ok_and(|row| row.get::<_, i64>(0) >= head)
    })
    .await;
}

async fn primary_reads(app: &TestApp) -> i64 {
    app.deep().await.1["replicas"]["primary_history_reads"].as_i64().unwrap()
}

/// Every id after `since` up to `until` through a replay stream.
async fn replayed(app: &TestApp, since: i64, until: i64) -> Vec<i64> {
    let mut stream = app.stream("?types=probe.*", Some(since)).await;
    let mut ids = Vec::new();
    while ids.last().copied().unwrap_or(since) < until {
        let event = stream.next().await;
        ids.push(event.id.as_deref().unwrap().parse().unwrap());
    }
    ids
}

/// Every id after `since` up to `until` through polls of `limit`.
async fn polled(app: &TestApp, since: i64, until: i64, limit: usize) -> Vec<i64> {
    let (mut ids, mut since) = (Vec::new(), since);
    while since < until {
        let url = app.url(&format!("/v1/poll?types=probe.*&since={since}&limit={limit}&wait_ms=5000"));
        let response = app.http.get(url).send().await.unwrap();
        let status = response.status();
        let page: Value = response.json().await.unwrap();
        let Some(events) = page["events"].as_array() else { panic!("a poll after {since} answered {status}: {page}") };
        ids.extend(events.iter().map(|e| e["event_id"].as_i64().unwrap()));
        since = page["next_since"].as_i64().unwrap();
    }
    ids
}

/// Every id after `since` up to `until` through `sync.delta` pages.
async fn synced(app: &TestApp, since: i64, until: i64) -> Vec<i64> {
    let mut client = Client::connect(app).await;
    let answer = client.auth(&Key::new(), json!({"device_id": "reader", "cursor": since, "filter": {"types": ["probe.*"]}})).await;
    assert!(answer["result"].is_object(), "{answer}");
    let (mut ids, mut since) = (Vec::new(), since);
    while since < until {
        let page = client.call("sync.delta", json!({"device_id": "reader", "since": since, "limit": 70})).await;
        let result = &page["result"];
        ids.extend(result["items"].as_array().unwrap().iter().map(|i| i["seq"].as_i64().unwrap()));
        since = result["next_since"].as_i64().unwrap();
    }
    ids
}

async fn publish_many(app: &TestApp, n: usize) -> i64 {
    let mut last = 0;
    for chunk in 0..n.div_ceil(50) {
        let events: Vec<Value> = (0..50.min(n - chunk * 50)).map(|i| json!({"event_type": "probe.tick", "payload": {"i": i}})).collect();
        let (status, body) = app.post_events(&json!({"events": events})).await;
        assert_eq!(status, 201, "{body}");
        last = body["event_ids"].as_array().unwrap().last().unwrap().as_i64().unwrap();
    }
    last
}

async fn history_is_read_through_the_standby_exactly_once_on(var: &'static str) {
    let app = Arc::new(with_standby(var, Duration::from_secs(5)).await);
    publish_many(&app, 600).await;
    eventually("the standby serves history", || async { standby(&app).await["usable"] == true }).await;

    // Readers catch up from the start while publishers run.
    let stop = Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..2)
        .map(|_| {
            let (app, stop) = (app.clone(), stop.clone());
            tokio::spawn(async move {
                let mut last = 0;
                while !stop.load(Ordering::Relaxed) {
                    last = last.max(publish_many(&app, 20).await);
                }
                last
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let until = app.head().await;
    let (stream, poll, sync) = tokio::join!(replayed(&app, 0, until), polled(&app, 0, until, 90), synced(&app, 0, until));
    stop.store(true, Ordering::Relaxed);
    let mut head = 0;
    for p in publishers {
        head = head.max(p.await.unwrap());
    }
    assert!(head > until, "publishers ran while the readers caught up");
    let expected: Vec<i64> = (1..=until).collect();
    for (how, ids) in [("replay", stream), ("poll", poll), ("sync.delta", sync)] {
        let ids: Vec<i64> = ids.into_iter().take_while(|id| *id <= until).collect();
        assert_eq!(ids, expected, "{how}: every id once, in order");
    }
    let reads = standby(&app).await["reads"].as_i64().unwrap();
    assert!(reads > 0, "the standby answered history reads");

    // Once the standby holds the head, history costs the primary nothing.
    let head = app.head().await;
    eventually("the standby holds the head", || async {
        let s = standby(&app).await;
        s["lag_events"] == 0 && s["usable"] == true
    })
    .await;
    let before = primary_reads(&app).await;
    let (stream, poll) = tokio::join!(replayed(&app, 0, head), polled(&app, 0, head, 100));
    assert_eq!(stream, (1..=head).collect::<Vec<_>>());
    assert_eq!(poll, (1..=head).collect::<Vec<_>>());
    assert_eq!(primary_reads(&app).await, before, "the primary read no history a caught-up standby holds");
    assert!(standby(&app).await["reads"].as_i64().unwrap() > reads);
    let metrics = app.http.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("tidings_history_reads_total{target=\"replica\"}"), "counted by target");
}

async fn standby_sql(sql: &str) {
    let url = std::env::var("TIDINGS_TEST_STANDBY2_URL").expect("TIDINGS_TEST_STANDBY2_URL");
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client.batch_execute(sql).await.unwrap();
}

async fn lagging_or_stopped() {
    // A lag limit this test never reaches: the lagging standby stays in use,
    // so reads take its part and the primary's (the limit itself is a unit
    // test of the probe's verdict).
    let app = with_standby("TIDINGS_TEST_STANDBY2_URL", Duration::from_secs(600)).await;
    let first = publish_many(&app, 300).await;
    eventually("the standby serves history", || async {
        let s = standby(&app).await;
        s["usable"] == true && s["lag_events"] == 0
    })
    .await;

    // Lagging: its replay paused, it holds the first 300 and no more.
    standby_sql("SELECT pg_wal_replay_pause()").await;
    let lagged = publish_many(&app, 300).await;
    eventually("the lag is seen", || async {
        let s = standby(&app).await;
        s["usable"] == true && s["up"] == true && s["lag_events"].as_i64().unwrap() >= lagged - first
    })
    .await;
    let (before, standby_before) = (primary_reads(&app).await, standby(&app).await["reads"].as_i64().unwrap());
    assert_eq!(replayed(&app, 0, lagged).await, (1..=lagged).collect::<Vec<_>>(), "a replay through a lagging standby");
    assert_eq!(polled(&app, 0, lagged, 100).await, (1..=lagged).collect::<Vec<_>>(), "polls through a lagging standby");
    assert!(primary_reads(&app).await > before, "the primary served what the standby did not hold");
    assert!(standby(&app).await["reads"].as_i64().unwrap() > standby_before, "and the standby what it did");

    // Stopped: fast, mid-stream (a replay is open across the stop).
    standby_sql("SELECT pg_wal_replay_resume()").await;
    let mut open = app.stream("?types=probe.*", Some(0)).await;
    let mut ids: Vec<i64> = Vec::new();
    for _ in 0..100 {
        ids.push(open.next().await.id.as_deref().unwrap().parse().unwrap());
    }
    let ctl = std::env::var("TIDINGS_TEST_STANDBY2_PG_CTL").expect("TIDINGS_TEST_STANDBY2_PG_CTL");
    let status = std::process::Command::new("sh").arg("-c").arg(format!("{ctl} -m immediate stop")).status().unwrap();
    assert!(status.success(), "stopping the standby");
    let last = publish_many(&app, 200).await;
    while ids.last().copied().unwrap_or(0) < last {
        ids.push(open.next().await.id.as_deref().unwrap().parse().unwrap());
    }
    assert_eq!(ids, (1..=last).collect::<Vec<_>>(), "a replay open across the standby's stop");
    assert_eq!(polled(&app, 0, last, 100).await, (1..=last).collect::<Vec<_>>(), "polls after the standby stopped");
    eventually("the standby is seen down", || async { standby(&app).await["up"] == false }).await;
}

/// Any role that can connect may `NOTIFY tidings_events` with a head of
/// its choosing. A head past the log's is set back at the first read that
/// finds nothing: the broker's reads at the head go on costing nothing, not
/// (after a 100 ms wait for a standby that can never have it) a read at the
/// primary on every wake-up for good; and nothing is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_notify_costs_the_broker_nothing_lasting() {
    let a = on_their_primary(|s| {
        s.postgres.replica_urls = vec![standby_url("TIDINGS_TEST_STANDBY_URL", s.database_url.as_deref().unwrap())];
        s.postgres.broker_reads = tidings_server::config::BrokerReads::Replica;
    })
    .await;
    let url = a.db_url.clone().unwrap();
    let b = on_their_primary(|s| s.database_url = Some(url.clone())).await;
    eventually("the standby serves", || async { standby(&a).await["usable"] == true }).await;
    let mut stream = a.stream("?types=probe.*", None).await;
    one_by_one(&b, &mut stream, 3).await;
    let primary_reads = || async { a.deep().await.1["replicas"]["primary_broker_reads"].as_i64().unwrap() };
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client.batch_execute("NOTIFY tidings_events, '9223372036854775000'").await.unwrap();
    let head = a.store.head().await.unwrap();
    let before = primary_reads().await;
    // Reads at the head, as the broker makes after each wake-up.
    for _ in 0..10 {
        assert!(a.store.read_tail(head, 100).await.unwrap().is_empty());
    }
    let after = primary_reads().await;
    assert!(after - before <= 2, "10 reads at the head after a forged NOTIFY cost the primary {} reads", after - before);
    // Commits go on being delivered, one by one.
    one_by_one(&b, &mut stream, 5).await;
}

/// `n` commits on `publisher`, each read from `stream` before the next.
async fn one_by_one(publisher: &TestApp, stream: &mut crate::helpers::Stream, n: usize) {
    for _ in 0..n {
        let last = publish_many(publisher, 1).await;
        while stream.next().await.id.as_deref().unwrap().parse::<i64>().unwrap() < last {}
    }
}

/// Two processes on one primary, each with the same hot standby, readers
/// replaying from 0 on each: each process serves its history reads from
/// the standby. They read there as a role with a connection limit (10)
/// below what their two pools may open (8 each), as issue 48 found: a
/// process refused a new connection marked the standby down, its probe
/// marked it usable again a second later, and it read nearly everything at
/// the primary while `/health/deep` showed the standby usable. Now the pool
/// keeps the connections it has. The readers start once the standby holds
/// the whole log, so that only the refusals (not a standby's replay lag on
/// a busy machine) could send a read to the primary, and a read waits for
/// a held connection up to 10 s (`TIDINGS_DB_TIMEOUT`), longer than twenty
/// readers keep eight connections busy on a loaded machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_reads_history_at_the_standby() {
    let role = format!("reader_{}", rand::random::<u32>());
    let (admin, conn) = tokio_postgres::connect(&their_primary(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    admin.batch_execute(&format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 10")).await.unwrap();
    let as_reader = |url: String| url.replacen("://postgres@", &format!("://{role}@"), 1);
    let a = Arc::new(
        on_their_primary(|s| {
            s.postgres.replica_urls = vec![as_reader(standby_url("TIDINGS_TEST_STANDBY_URL", s.database_url.as_deref().unwrap()))];
            s.postgres.db_timeout = Duration::from_secs(10);
        })
        .await,
    );
    let url = a.db_url.clone().unwrap();
    a.db().await.batch_execute(&format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")).await.unwrap();
    let b = Arc::new(
        on_their_primary(|s| {
            s.postgres.replica_urls = vec![as_reader(standby_url("TIDINGS_TEST_STANDBY_URL", &url))];
            s.database_url = Some(url.clone());
            s.postgres.db_timeout = Duration::from_secs(10);
        })
        .await,
    );
    // Publishers on both processes, then the standby catching up.
    let publishers: Vec<_> =
        [a.clone(), b.clone()].into_iter().map(|app| tokio::spawn(async move { publish_many(&app, 300).await })).collect();
    for p in publishers {
        p.await.unwrap();
    }
    let head = a.head().await;
    until_the_standby_holds(&url, head).await;
    for app in [&a, &b] {
        eventually("the standby serves history", || async { standby(app).await["usable"] == true }).await;
    }
    let before = [
        (primary_reads(&a).await, standby(&a).await["reads"].as_i64().unwrap()),
        (primary_reads(&b).await, standby(&b).await["reads"].as_i64().unwrap()),
    ];
    // Ten readers on each, each replaying from 0 five times over.
    let readers: Vec<_> = (0..20)
        .map(|i| {
            let app = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                for _ in 0..5 {
                    assert_eq!(polled(&app, 0, head, 100).await.len(), 600);
                }
            })
        })
        .collect();
    for reader in readers {
        reader.await.unwrap();
    }
    let mut capped = 0;
    for ((name, app), (primary_before, standby_before)) in [("a", &a), ("b", &b)].into_iter().zip(before) {
        let primary = primary_reads(app).await - primary_before;
        let now = standby(app).await;
        let at_standby = now["reads"].as_i64().unwrap() - standby_before;
        assert!(primary * 20 <= at_standby, "process {name}: {primary} history reads at the primary, {at_standby} at the standby");
        capped += usize::from(now["connections_capped_at"].is_number());
    }
    // Sixteen connections wanted, ten allowed: the standby refused one.
    assert!(capped > 0, "neither process was refused a connection");
}

/// A probe refused a connection for the standby's connection limits while
/// a read holds every connection the standby allows this process: the
/// standby is busy, not down. The reads' refusals were handled so (issue
/// 48), the probe's were not: a probe that found the pool's connections
/// busy marked the standby down, a probe a second later found one idle and
/// marked it usable, and a process under load read most of its history at
/// the primary. The role here may hold one connection; a proxy in front of
/// the standby holds a history read's query on it, so the probe asks for a
/// second while the pool's one is busy. And a standby no probe could check
/// for 3 s, its connections busy all along, is set aside (a standby left on
/// another epoch by a failover must not serve history for as long as the
/// load lasts): before the held read's own deadline (5 s) ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_refused_while_a_read_holds_the_connections_keeps_the_standby() {
    // A read may find the pool's one connection lent to a probe (a
    // millisecond in each second) and be refused itself, which this test
    // is not about: it starts again, on a server of its own.
    for _ in 0..3 {
        if let Some((refused, unchecked)) = probe_refused_while_a_read_is_held().await {
            assert_eq!(refused["usable"], true, "the probe's refusal marked the standby down: {refused}");
            assert_eq!(refused["connections_capped_at"], 1, "kept at the one connection the role may hold: {refused}");
            let why = unchecked["last_error"].as_str().unwrap_or_default();
            assert!(why.starts_with("not checked for 3s"), "set aside for going unchecked, before the read's own deadline: {unchecked}");
            return;
        }
    }
    panic!("three reads in a row were not the first to use the pool's connection");
}

/// The standby's state once its probe was refused while the proxy held a
/// read's query, and once it was no longer usable; `None` when the read
/// found no held connection of its own.
async fn probe_refused_while_a_read_is_held() -> Option<(Value, Value)> {
    use crate::helpers::proxy::HoldingProxy;
    let role = format!("reader_{}", rand::random::<u32>());
    let (admin, conn) = tokio_postgres::connect(&their_primary(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    admin.batch_execute(&format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 1")).await.unwrap();
    let direct = std::env::var("TIDINGS_TEST_STANDBY_URL").unwrap();
    let target: std::net::SocketAddr = direct.split('@').nth(1).unwrap().split('/').next().unwrap().parse().unwrap();
    let proxy = HoldingProxy::start(target, b"FROM events WHERE id >").await;
    let through_proxy = |url: String| {
        url.replacen("://postgres@", &format!("://{role}@"), 1).replacen(&target.to_string(), &format!("127.0.0.1:{}", proxy.port), 1)
    };
    let app = on_their_primary(|s| {
        s.postgres.replica_urls = vec![through_proxy(standby_url("TIDINGS_TEST_STANDBY_URL", s.database_url.as_deref().unwrap()))];
    })
    .await;
    app.db().await.batch_execute(&format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")).await.unwrap();
    let head = publish_many(&app, 20).await;
    until_the_standby_holds(app.db_url.as_deref().unwrap(), head).await;
    eventually("the standby serves history", || async { standby(&app).await["usable"] == true }).await;
    let app = Arc::new(app);
    let reader = tokio::spawn({
        let app = app.clone();
        async move { polled(&app, 0, head, 100).await }
    });
    // Held, or refused and answered by the primary.
    crate::helpers::wait_until("the read is held or answered", Duration::from_secs(20), Duration::from_millis(5), || async {
        proxy.held() > 0 || reader.is_finished()
    })
    .await;
    if proxy.held() == 0 {
        assert_eq!(reader.await.unwrap(), (1..=head).collect::<Vec<_>>());
        return None;
    }
    // The probe, once a second, finds the pool's connection busy; the read
    // stays held, and no probe checks the standby from then on.
    let refused = until_standby(&app, "a probe to be refused", |s| s["usable"] != true || s["connections_capped_at"].is_number()).await;
    let unchecked = until_standby(&app, "the standby to be set aside", |s| s["usable"] != true).await;
    proxy.release();
    assert_eq!(reader.await.unwrap(), (1..=head).collect::<Vec<_>>(), "every id once, in order");
    Some((refused, unchecked))
}

/// The standby's entry in `/health/deep` once `done` holds of it (at most
/// 20 s).
async fn until_standby(app: &TestApp, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = standby(app).await;
        if done(&now) {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "waited 20 s for {what}: {now}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
