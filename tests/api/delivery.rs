//! Delivery guarantees: slow clients are dropped with a named notice and
//! resume losing nothing; resume points history cannot serve are announced;
//! shutdown ends streams cleanly and a restart loses nothing.

use std::time::Duration;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(
    resume_beyond_the_head_is_a_replay_gap,
    shutdown_ends_streams_and_restart_loses_nothing,
    slow_client_is_dropped_and_resumes,
    stuck_client_is_dropped_for_no_progress,
    resume_older_than_retained_history_is_a_replay_gap,
    a_burst_larger_than_the_queue_is_caught_up_not_dropped,
    replaying_streams_that_never_read_hold_little_and_are_closed,
    stuck_replays_of_large_events_hold_about_one_event_each
);

async fn resume_beyond_the_head_is_a_replay_gap(backend: Backend) {
    let app = spawn_app(backend).await;
    app.publish("comment.posted", json!({})).await;
    let mut s = app.stream("", Some(1_000_000)).await;
    let gap = s.next().await;
    assert_eq!(gap.event.as_deref(), Some("system.replay_gap"));
    let v: Value = serde_json::from_str(&gap.data).unwrap();
    assert_eq!(v, json!({"requested": 1_000_000, "available_from": 1, "head": 1, "reason": "beyond_head"}));
    // Delivery continues live after the notice.
    let id = app.publish("comment.posted", json!({})).await;
    assert_eq!(s.ids(1).await, vec![id]);
}

async fn shutdown_ends_streams_and_restart_loses_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let first = app.publish("comment.posted", json!({})).await;
    let mut s = app.stream("?types=comment.*", Some(0)).await;
    assert_eq!(s.ids(1).await, vec![first]);
    // More streams, to see the jitter spread.
    let mut others = Vec::new();
    for _ in 0..20 {
        let mut o = app.stream("?types=comment.*", Some(0)).await;
        assert_eq!(o.ids(1).await, vec![first]);
        assert_eq!(o.retry_ms(), Some(2000), "the normal retry first");
        others.push(o);
    }
    let deadline = app_shutdown_deadline();
    let started = std::time::Instant::now();
    let restart = tokio::spawn(app.restart());
    // Every stream ends by itself with a jittered retry, well within the deadline.
    let mut retries = Vec::new();
    for stream in std::iter::once(&mut s).chain(others.iter_mut()) {
        let ended = tokio::time::timeout(deadline, async { while stream.next_or_end().await.is_some() {} }).await;
        assert!(ended.is_ok(), "the stream ended within the shutdown deadline");
        let retry = stream.retry_ms().expect("a retry hint");
        assert!((2000..=10_000).contains(&retry), "jittered retry between 1x and 5x the base: {retry}");
        retries.push(retry);
    }
    assert!(started.elapsed() < deadline);
    // Spread over the range, not one value for everyone (and not the normal
    // 2000 for all): 21 uniform draws over 8,000 ms land this close together
    // with negligible probability.
    let (min, max) = (*retries.iter().min().unwrap(), *retries.iter().max().unwrap());
    assert!(max - min >= 2000, "the goodbye retries spread: {retries:?}");
    assert!(retries.iter().any(|r| *r != 2000), "{retries:?}");
    let app = restart.await.unwrap();
    // Published after the restart; the client resumes from its last id.
    let later = app.publish("comment.posted", json!({})).await;
    let mut s = app.stream("?types=comment.*", Some(first)).await;
    assert_eq!(s.ids(1).await, vec![later]);
}

fn app_shutdown_deadline() -> Duration {
    Duration::from_secs(3)
}

/// The slow-client drop (docs/streams.md): a client that stops reading is
/// dropped with `system.client_dropped_slow` carrying its last id;
/// reconnecting with that id yields the rest exactly once; a fast client at
/// the same time receives everything.
async fn slow_client_is_dropped_and_resumes(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.streams.client_queue = 8;
        // Out of reach: only overflow drops the client here (on a loaded
        // machine eight publishes can take longer than a short no-progress
        // timeout, which has its test below).
        s.streams.slow_client_timeout = Duration::from_secs(120);
        s.streams.eviction_grace = Duration::from_secs(30);
    })
    .await;
    let mut fast = app.stream("?types=comment.posted", None).await;
    // The slow client: connected, then not read at all.
    let slow = app.http.get(app.url("/v1/stream?types=comment.posted")).send().await.unwrap();
    assert_eq!(app.clients().await, 2);
    // Enough bytes to fill the socket buffers between server and client.
    let blob = "x".repeat(60_000);
    let mut published = Vec::new();
    let mut fast_got = Vec::new();
    for _ in 0..400 {
        published.push(app.publish("comment.posted", json!({"body": blob})).await);
        fast_got.extend(fast.ids(1).await);
        if app.clients().await == 1 {
            break;
        }
    }
    assert_eq!(app.clients().await, 1, "the slow client was dropped");
    assert_eq!(fast_got, published, "the fast client received everything on time");
    let after_drop: Vec<i64> = vec![app.publish("comment.posted", json!({})).await, app.publish("comment.posted", json!({})).await];
    assert_eq!(fast.ids(2).await, after_drop);

    // The slow client reads now: contiguous events, then the notice.
    let mut reader = tidings_client::sse::SseReader::new(Box::pin(slow.bytes_stream()) as tidings_client::sse::BodyStream);
    let mut got = Vec::new();
    let notice = loop {
        let e =
            tokio::time::timeout(Duration::from_secs(10), reader.next_event()).await.unwrap().expect("the notice arrives before the end");
        match e.event.as_deref() {
            None => got.push(e.id.unwrap().parse::<i64>().unwrap()),
            Some("system.client_dropped_slow") => break e,
            Some(other) => panic!("unexpected {other}"),
        }
    };
    let v: Value = serde_json::from_str(&notice.data).unwrap();
    assert_eq!(v["reason"], "queue_full");
    let last = v["last_event_id"].as_i64().expect("the last id it was sent");
    assert_eq!(got, published.iter().copied().take_while(|id| *id <= last).collect::<Vec<_>>(), "what it got is a prefix");
    assert!(reader.next_event().await.is_none(), "the stream ends after the notice");
    // Resume: the rest, exactly once.
    let mut resumed = app.stream("?types=comment.posted", Some(last)).await;
    let rest: Vec<i64> = published.iter().chain(after_drop.iter()).copied().filter(|id| *id > last).collect();
    assert_eq!(resumed.ids(rest.len()).await, rest);
}

/// A client whose socket stops draining, with room left in its queue, is
/// dropped by the no-progress timeout rather than by overflow.
async fn stuck_client_is_dropped_for_no_progress(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.streams.client_queue = 100_000;
        s.streams.slow_client_timeout = Duration::from_millis(300);
        s.streams.eviction_grace = Duration::from_secs(30);
    })
    .await;
    let stuck = app.http.get(app.url("/v1/stream?types=comment.posted")).send().await.unwrap();
    let blob = "x".repeat(60_000);
    let mut published = Vec::new();
    for _ in 0..2000 {
        published.push(app.publish("comment.posted", json!({"body": blob})).await);
        if app.clients().await == 0 {
            break;
        }
    }
    assert_eq!(app.clients().await, 0, "the stuck client was dropped");
    let mut reader = tidings_client::sse::SseReader::new(Box::pin(stuck.bytes_stream()) as tidings_client::sse::BodyStream);
    let notice = loop {
        let e = tokio::time::timeout(Duration::from_secs(10), reader.next_event()).await.unwrap().expect("the notice arrives");
        if e.event.is_some() {
            break e;
        }
    };
    assert_eq!(notice.event.as_deref(), Some("system.client_dropped_slow"));
    let v: Value = serde_json::from_str(&notice.data).unwrap();
    assert_eq!(v["reason"], "no_progress");
    assert!(v["last_event_id"].as_i64().is_some_and(|id| published.contains(&id)));
}

/// Retention prunes history in the background; a resume point older than
/// what is left gets `system.replay_gap`, then everything that is left.
async fn resume_older_than_retained_history_is_a_replay_gap(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.history.retention = tidings_server::config::Retention { max_age: None, max_events: Some(5) };
        s.history.retention_interval = Duration::from_millis(50);
    })
    .await;
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(app.publish("comment.posted", json!({})).await);
    }
    // Wait for the pruner (bounded): history then starts at id 6.
    crate::helpers::wait_until("retention to prune to the last 5 events", Duration::from_secs(5), Duration::from_millis(25), || async {
        app.deep().await.1["history_from"] == 6
    })
    .await;
    let mut s = app.stream("", Some(ids[0])).await;
    let gap = s.next().await;
    assert_eq!(gap.event.as_deref(), Some("system.replay_gap"));
    assert_eq!(
        serde_json::from_str::<Value>(&gap.data).unwrap(),
        json!({"requested": 1, "available_from": 6, "head": 10, "reason": "pruned"})
    );
    assert_eq!(s.ids(5).await, ids[5..].to_vec());
}

/// One publish of more events than a client's queue holds is a burst, not a
/// slow client: a live client that keeps reading gets every event, in order,
/// and is not dropped.
async fn a_burst_larger_than_the_queue_is_caught_up_not_dropped(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.streams.client_queue = 8).await;
    let mut s = app.stream("?types=comment.*", None).await;
    let batch: Vec<Value> = (0..50).map(|i| json!({"event_type": "comment.posted", "payload": {"i": i}})).collect();
    let (status, answer) = app.post_events(&json!({"events": batch})).await;
    assert_eq!(status, 201);
    let ids: Vec<i64> = answer["event_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let mut got = Vec::new();
    while got.len() < ids.len() {
        let e = s.next().await;
        assert_eq!(e.event, None, "no system notice: {e:?}");
        got.push(e.id.unwrap().parse::<i64>().unwrap());
    }
    assert_eq!(got, ids);
    // Still live afterwards.
    let next = app.publish("comment.posted", json!({})).await;
    assert_eq!(s.ids(1).await, vec![next]);
    assert_eq!(app.clients().await, 1);
}

/// Streams that resume from the start over large events (60 KB each) to
/// clients that never read hold about one event each, not a page of them:
/// a replay's first page is one row, and pages grow only as a client takes
/// them, to at most 64 KiB of rows; and the embedded store runs at most as
/// many reads at once as it keeps connections, so a burst of replays opens
/// no connection, page cache or thread per read. (300 such streams held
/// 2.5–2.9 GiB when a page was at least 16 rows, 27–33 MiB of peak RSS with
/// unbounded reads; 0–3 MiB now: the bound, 20 MiB, is asserted.)
async fn stuck_replays_of_large_events_hold_about_one_event_each(backend: Backend) {
    const STUCK: usize = 300;
    let (server, _dir) = quiet_server(backend, &[("TIDINGS_MAX_BODY", "8MiB")]).await;
    let pid = server.child.id().unwrap();
    let http = reqwest::Client::new();
    let one = json!({"event_type": "comment.posted", "payload": {"text": "x".repeat(60_000)}});
    for _ in 0..10 {
        let r = http.post(format!("{}/v1/events", server.base)).json(&json!({"events": vec![one.clone(); 100]})).send().await.unwrap();
        assert_eq!(r.status(), 201);
    }
    let peak = || peak_rss_kib(pid);
    let before = peak();
    let addr: std::net::SocketAddr = server.base.trim_start_matches("http://").parse().unwrap();
    let mut stuck = Vec::new();
    for _ in 0..STUCK {
        stuck.push(never_reading(addr, "/v1/stream?since=0&types=comment.posted").await);
    }
    // Every stream has started its replay (registered with the broker)
    // and written what its socket takes.
    let metrics = || async { http.get(format!("{}/metrics", server.base)).send().await.unwrap().text().await.unwrap() };
    let connected = || async { metric_sum(&metrics().await, "tidings_clients_connected{transport=\"sse\"}") };
    crate::helpers::eventually("every stuck stream is replaying", || async { connected().await >= STUCK as f64 }).await;
    // Until the replays stop moving (each is stuck on its socket), for at
    // most 30 s.
    let mut last = -1.0;
    for _ in 0..60 {
        let now = metric_sum(&metrics().await, "tidings_replayed_events_total");
        if now == last {
            break;
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let grew_mib = peak().saturating_sub(before) / 1024;
    eprintln!("{STUCK} stuck replays of large events grew the peak RSS by {grew_mib} MiB");
    assert!(grew_mib <= 20, "{STUCK} stuck replays of large events grew the peak RSS by {grew_mib} MiB");
    drop(stuck);
}

/// A server process for the stuck-client tests, with `extra` settings, its
/// stderr quiet (a pipe nobody reads here).
async fn quiet_server(backend: Backend, extra: &[(&'static str, &str)]) -> (crate::helpers::Process, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut envs = vec![("TIDINGS_DATA_DIR", dir.path().display().to_string()), ("TIDINGS_LOG", "warn".to_owned())];
    envs.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    if backend == Backend::Postgres {
        envs.push(("DATABASE_URL", crate::helpers::fresh_database().await.0));
    }
    (crate::helpers::spawn_process(&envs).await, dir)
}

/// The peak resident size of process `pid`, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap().trim().trim_end_matches(" kB").parse::<u64>().unwrap()
}

/// The sum of a metric family's series whose line starts with `prefix`.
fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// A client with a 4 KiB receive window that sends `GET path` and never
/// reads a byte of the answer.
async fn never_reading(addr: std::net::SocketAddr, path: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes()).await.unwrap();
    stream
}

/// Streams that replay a large history to clients that never read hold at
/// most about one bounded replay page each (not a whole read batch), are
/// closed once they take no bytes for the slow-client timeout, and live
/// clients keep receiving meanwhile. The real binary: its peak RSS is read
/// from /proc.
async fn replaying_streams_that_never_read_hold_little_and_are_closed(backend: Backend) {
    const EVENTS: usize = 20_000;
    const STUCK: usize = 200;
    // Poll pages larger than a socket's send buffer can grow to (4 MiB).
    let extra = [
        ("TIDINGS_SLOW_CLIENT_TIMEOUT", "1s"),
        ("TIDINGS_EVICTION_GRACE", "1s"),
        ("TIDINGS_MAX_BODY", "4MiB"),
        ("TIDINGS_POLL_MAX_LIMIT", "10000"),
    ];
    let (server, _dir) = quiet_server(backend, &extra).await;
    let pid = server.child.id().unwrap();
    let http = reqwest::Client::new();
    // 20,000 events of about 1 KiB: about 20 MiB of history.
    let one = json!({"event_type": "comment.posted", "payload": {"text": "x".repeat(1000)}});
    for _ in 0..EVENTS / 1000 {
        let r = http.post(format!("{}/v1/events", server.base)).json(&json!({"events": vec![one.clone(); 1000]})).send().await.unwrap();
        assert_eq!(r.status(), 201);
    }
    let peak = || peak_rss_kib(pid);
    let before = peak();
    // A live client on another type: nothing it receives reaches the stuck
    // streams' queues, so only their own writes can get them closed.
    let mut live =
        crate::helpers::Stream::from_response(http.get(format!("{}/v1/stream?types=flag.raised", server.base)).send().await.unwrap());
    // Clients with a tiny receive window that never read a byte.
    let addr: std::net::SocketAddr = server.base.trim_start_matches("http://").parse().unwrap();
    let mut stuck = Vec::new();
    for _ in 0..STUCK {
        stuck.push(never_reading(addr, "/v1/stream?since=0&types=comment.posted").await);
    }
    // A live client still gets what is published meanwhile.
    let r = http.post(format!("{}/v1/events", server.base)).json(&json!({"event_type": "flag.raised"})).send().await.unwrap();
    let id = r.json::<Value>().await.unwrap()["event_ids"][0].as_i64().unwrap();
    assert_eq!(live.ids(1).await, vec![id], "live delivery goes on beside the stuck streams");
    drop(live);
    // Every stuck stream is closed by the server for taking no bytes.
    let connected = |text: &str| metric_sum(text, "tidings_clients_connected{transport=\"sse\"}");
    let mut last = f64::NAN;
    for _ in 0..1200 {
        let metrics = http.get(format!("{}/metrics", server.base)).send().await.unwrap().text().await.unwrap();
        last = connected(&metrics);
        if last == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(last, 0.0, "the stuck streams were closed for taking no bytes");
    let grew_mib = peak().saturating_sub(before) / 1024;
    assert!(grew_mib < 200, "{STUCK} stuck replaying streams grew the peak RSS by {grew_mib} MiB");
    drop(stuck);

    // Polls too: pages of 10,000 events (about 10 MiB, more than the kernel
    // takes off the server's hands) to clients that never read are given
    // up on after the same deadline, not held for good.
    let stalled = |text: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("tidings_clients_dropped_total{") && l.contains("reason=\"write_stalled\""))
            .map(|l| metric_sum(l, ""))
            .sum()
    };
    let metrics = || async { http.get(format!("{}/metrics", server.base)).send().await.unwrap().text().await.unwrap() };
    let stalled_before = stalled(&metrics().await);
    const POLLS: usize = 10;
    let mut polls = Vec::new();
    for _ in 0..POLLS {
        polls.push(never_reading(addr, "/v1/poll?since=0&limit=10000").await);
    }
    let mut closed = 0.0;
    for _ in 0..1200 {
        closed = stalled(&metrics().await) - stalled_before;
        if closed >= POLLS as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // (A page is as large as TIDINGS_POLL_MAX_LIMIT lets it be; what the
    // deadline bounds is how long it is held.)
    assert_eq!(closed, POLLS as f64, "every poll whose client takes no bytes was closed");
    drop(polls);
}
