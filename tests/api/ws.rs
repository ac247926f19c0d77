//! `GET /v1/ws` (docs/ref-websocket.md) with a real WebSocket client
//! (tokio-tungstenite): hello first, signed auth, the head at auth, catch-up
//! then realtime with no gap and no duplicate at the seam, the ack-only
//! device cursor, and the close codes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::both_stores;
use crate::helpers::device::{Client, Key};
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(
    hello_first_then_auth_answers_the_head,
    catch_up_then_realtime_without_gap_or_duplicate,
    the_device_cursor_moves_only_by_acks,
    every_close_code,
    stream_limits_close_with_1013,
    the_per_identity_stream_limit_closes_with_1013,
    a_slow_consumer_is_closed_with_1013_and_resumes,
    the_books_example_device_catches_up_goes_live_and_acks,
    a_peer_that_answers_no_ping_is_closed
);

async fn hello_first_then_auth_answers_the_head(backend: Backend) {
    let app = spawn_app(backend).await;
    for i in 0..3 {
        app.publish("comment.posted", json!({"n": i})).await;
    }
    let mut client = Client::connect(&app).await;
    // The server speaks first.
    assert_eq!(client.hello["method"], "stream.hello");
    let identity: Value = app.http.get(app.url("/v1/identity")).send().await.unwrap().json().await.unwrap();
    assert_eq!(client.hello["params"]["server_did"], identity["hash"]);
    assert_eq!(client.hello["params"]["profiles"], json!(["x_tidings.stream.v1", "x_tidings.inbox.v1"]));
    assert!(client.nonce.len() >= 16, "a fresh nonce: {}", client.hello);
    let other = Client::connect(&app).await;
    assert_ne!(other.nonce, client.nonce, "one nonce per connection");
    // A new device starts at the authoritative head.
    let key = Key::new();
    let answer = client.auth(&key, json!({"device_id": "laptop"})).await;
    assert_eq!(answer["result"], json!({"head_seq": 3, "cursor": 3}), "{answer}");
    // At the head: realtime at once.
    let id = app.publish("comment.posted", json!({"n": 3})).await;
    let event = client.notification().await;
    assert_eq!(event["method"], "stream.event");
    assert_eq!(event["params"]["seq"], id);
    assert_eq!(event["params"]["event"]["event_id"], id);
    assert_eq!(event["params"]["event"]["payload"]["n"], 3);
}

/// With 8 publishers running, a device behind the head pages `sync.delta`
/// to the end, then takes realtime frames: every id exactly once,
/// ascending, and no realtime frame before its last catch-up answer.
async fn catch_up_then_realtime_without_gap_or_duplicate(backend: Backend) {
    let app = Arc::new(spawn_app(backend).await);
    for i in 0..50 {
        app.publish("comment.posted", json!({"n": i})).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..8)
        .map(|_| {
            let (app, stop) = (app.clone(), stop.clone());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    ids.push(app.publish("comment.posted", json!({})).await);
                }
                ids
            })
        })
        .collect();
    let mut client = Client::connect(&app).await;
    let key = Key::new();
    let answer = client.auth(&key, json!({"device_id": "phone", "cursor": 0, "filter": {"types": ["comment.*"]}})).await;
    let head = answer["result"]["head_seq"].as_i64().unwrap();
    assert_eq!(answer["result"]["cursor"], 0, "a new device with a given cursor resumes there: {answer}");
    assert!(head >= 50);
    let mut seen = Vec::new();
    let mut since = 0;
    loop {
        let page = client.call("sync.delta", json!({"device_id": "phone", "since": since, "limit": 40})).await;
        assert!(client.pending.is_empty(), "no realtime frame before catch-up is answered: {:?}", client.pending);
        let result = &page["result"];
        seen.extend(result["items"].as_array().unwrap().iter().map(|i| i["seq"].as_i64().unwrap()));
        since = result["next_since"].as_i64().unwrap();
        if !result["has_more"].as_bool().unwrap() && since >= head {
            break;
        }
    }
    // Realtime from here on, while the publishers go on a little longer.
    let mut realtime = Vec::new();
    for _ in 0..20 {
        let n = client.notification().await;
        assert_eq!(n["method"], "stream.event");
        realtime.push(n["params"]["seq"].as_i64().unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let mut published: Vec<i64> = (1..=50).collect();
    for p in publishers {
        published.extend(p.await.unwrap());
    }
    published.sort_unstable();
    let last = *published.last().unwrap();
    while realtime.last().copied().unwrap_or(0) < last {
        realtime.push(client.notification().await["params"]["seq"].as_i64().unwrap());
    }
    assert!(*seen.last().unwrap() >= head, "catch-up reached the head of the auth");
    assert!(seen.iter().any(|id| *id > head) || realtime.iter().any(|id| *id > head), "publishers ran across the seam");
    let all: Vec<i64> = seen.into_iter().chain(realtime).collect();
    assert_eq!(all, published, "every id exactly once, ascending");
}

/// The cursor: only acks move it, never backwards, never past the head;
/// an ack before auth or by another identity changes nothing; catch-up and
/// a given cursor never write it; (owner, device) is the key.
async fn the_device_cursor_moves_only_by_acks(backend: Backend) {
    let app = spawn_app(backend).await;
    let batch: Vec<Value> = (0..60).map(|_| json!({"event_type": "comment.posted"})).collect();
    assert_eq!(app.post_events(&json!({"events": batch})).await.0, 201);
    let (key, stranger) = (Key::new(), Key::new());
    // An ack before auth is a protocol error: close 1002, nothing stored.
    let mut early = Client::connect(&app).await;
    let body = json!({"seq": 30});
    let proof = key.proof("stream.ack", &body, &early.nonce);
    early.send(json!({"jsonrpc": "2.0", "id": 1, "method": "stream.ack", "params": {"body": body, "origin_proof": proof}})).await;
    assert_eq!(early.closed().await.0, 1002);

    let mut client = Client::connect(&app).await;
    let answer = client.auth(&key, json!({"device_id": "d1", "cursor": 5})).await;
    assert_eq!(answer["result"]["cursor"], 5, "a given cursor is used, not stored: {answer}");
    assert_eq!(client.ack(&key, 50).await["result"]["cursor"], 50);
    assert_eq!(client.ack(&key, 10).await["result"]["cursor"], 50, "never backwards");
    assert_eq!(client.ack(&key, 1000).await["result"]["cursor"], 60, "never past the head");
    let refused = client.ack(&stranger, 55).await;
    assert_eq!(refused["error"]["data"]["code"], "proof_not_owner", "{refused}");
    // A delta with a since does not move it.
    let page = client.call("sync.delta", json!({"device_id": "d1", "since": 0, "limit": 5})).await;
    assert_eq!(page["result"]["items"].as_array().unwrap().len(), 5, "{page}");
    drop(client);

    // The same (owner, device) resumes from its acked cursor, whatever
    // cursor it gives; another device of the owner, and the same device id
    // of another owner, have their own.
    let mut again = Client::connect(&app).await;
    assert_eq!(again.auth(&key, json!({"device_id": "d1", "cursor": 2})).await["result"]["cursor"], 60);
    let mut other_device = Client::connect(&app).await;
    assert_eq!(other_device.auth(&key, json!({"device_id": "d2"})).await["result"]["cursor"], 60, "d2 starts at the head");
    assert_eq!(other_device.ack(&key, 20).await["result"]["cursor"], 20);
    let mut other_owner = Client::connect(&app).await;
    assert_eq!(other_owner.auth(&stranger, json!({"device_id": "d1", "cursor": 7})).await["result"]["cursor"], 7);
    let mut check = Client::connect(&app).await;
    assert_eq!(check.auth(&key, json!({"device_id": "d2"})).await["result"]["cursor"], 20);
}

/// Each close code (docs/ref-websocket.md, "Close codes"), provoked.
async fn every_close_code(backend: Backend) {
    let app = spawn_app(backend).await;
    let key = Key::new();
    // 1003: a binary frame.
    let mut c = Client::connect(&app).await;
    c.ws.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    assert_eq!(c.closed().await.0, 1003);
    // 1007: not JSON, and a text frame that is not UTF-8.
    let mut c = Client::connect(&app).await;
    c.ws.send(Message::text("not json")).await.unwrap();
    assert_eq!(c.closed().await.0, 1007);
    let mut c = Client::connect(&app).await;
    let frame = tokio_tungstenite::tungstenite::protocol::frame::Frame::message(
        vec![0xff, 0xfe, 0x80],
        tokio_tungstenite::tungstenite::protocol::frame::coding::OpCode::Data(
            tokio_tungstenite::tungstenite::protocol::frame::coding::Data::Text,
        ),
        true,
    );
    c.ws.send(Message::Frame(frame)).await.unwrap();
    assert_eq!(c.closed().await.0, 1007);
    // 1009: over TIDINGS_WS_MAX_MESSAGE.
    let mut c = Client::connect(&app).await;
    c.ws.send(Message::text(format!("{{\"pad\": \"{}\"}}", "x".repeat(100 * 1024)))).await.unwrap();
    assert_eq!(c.closed().await.0, 1009);
    // 1002: JSON that is not JSON-RPC, and an unknown method.
    let mut c = Client::connect(&app).await;
    c.send(json!({"hello": "there"})).await;
    assert_eq!(c.closed().await.0, 1002);
    let mut c = Client::connect(&app).await;
    c.send(json!({"jsonrpc": "2.0", "id": 1, "method": "stream.nope"})).await;
    assert_eq!(c.closed().await.0, 1002);
    // A bad proof: one error frame, then 1000.
    let mut c = Client::connect(&app).await;
    let body = json!({"device_id": "x"});
    let wrong_nonce = key.proof("stream.auth", &body, "another-connection");
    let answer = c.call("stream.auth", json!({"body": body, "origin_proof": wrong_nonce})).await;
    assert_eq!(answer["error"]["data"]["code"], "proof_invalid", "{answer}");
    assert_eq!(c.closed().await.0, 1000);
    // A second auth: -32600 invalid_request, the connection stays.
    let mut c = Client::connect(&app).await;
    assert!(c.auth(&key, json!({"device_id": "x"})).await["result"].is_object());
    let second = c.auth(&key, json!({"device_id": "x"})).await;
    assert_eq!((second["error"]["code"].as_i64(), second["error"]["data"]["code"].as_str()), (Some(-32600), Some("invalid_request")));
    assert!(c.auth(&key, json!({"device_id": "x"})).await["error"].is_object(), "still open");
    // A client's close is answered with its own code.
    let mut leaving = Client::connect(&app).await;
    let bye = tokio_tungstenite::tungstenite::protocol::CloseFrame { code: 4000.into(), reason: "bye".into() };
    leaving.ws.send(Message::Close(Some(bye))).await.unwrap();
    assert_eq!(leaving.closed().await.0, 4000);
    // 1001: the server shuts down; every socket is told.
    let mut live = Client::connect(&app).await;
    live.auth(&key, json!({"device_id": "y"})).await;
    app.shutdown.cancel();
    assert_eq!(c.closed().await.0, 1001);
    assert_eq!(live.closed().await.0, 1001);
}

/// 1013 over the stream limit; a connection's place is given back when it
/// ends.
async fn stream_limits_close_with_1013(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.streams.max_streams = 1).await;
    let key = Key::new();
    let first = Client::connect(&app).await;
    let mut second = Client::connect(&app).await;
    assert_eq!(second.closed().await, (1013, "too_many_streams".to_owned()));
    drop(first);
    // The permit is released when the first connection's task ends: until
    // then a new connection is refused the same way.
    let mut tries = 0;
    loop {
        let mut c = Client::connect(&app).await;
        if c.authed_or_closed(&key, json!({"device_id": "next"})).await {
            break;
        }
        tries += 1;
        assert!(tries < 500, "the place was given back");
    }
}

/// With tokens on, each identity has its own limit over every transport:
/// a second socket of one identity gets 1013, another identity's is served.
async fn the_per_identity_stream_limit_closes_with_1013(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.auth.jwt_hs256_secret = Some(crate::helpers::tokens::SECRET.into());
        s.streams.max_streams_per_identity = 1;
    })
    .await;
    let key = Key::new();
    let query = |sub: &str| format!("?access_token={}", crate::helpers::tokens::token(sub, json!({"subscribe": ["**"]})));
    let mut first = Client::connect_with(&app, &query("alice")).await;
    assert!(first.authed_or_closed(&key, json!({"device_id": "a1"})).await);
    let mut second = Client::connect_with(&app, &query("alice")).await;
    assert_eq!(second.closed().await, (1013, "too_many_streams_for_identity".to_owned()));
    // An SSE stream of the same identity counts against the same limit.
    let sse = app
        .http
        .get(app.url("/v1/stream"))
        .bearer_auth(crate::helpers::tokens::token("alice", json!({"subscribe": ["**"]})))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 429);
    let mut other = Client::connect_with(&app, &query("bob")).await;
    assert!(other.authed_or_closed(&key, json!({"device_id": "b1"})).await, "another identity has its own place");
}

/// A ping goes out every heartbeat; a peer that answers them stays, one
/// that answers none by the next ping is closed.
async fn a_peer_that_answers_no_ping_is_closed(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.streams.heartbeat = Duration::from_secs(1)).await;
    let key = Key::new();
    // Reading answers pings (tungstenite replies as it reads). The
    // answering peer reads on a task of its own for the whole test, so
    // that it answers whatever the test is waiting for meanwhile (on a
    // loaded machine a health request can take longer than a heartbeat).
    let mut alive = Client::connect(&app).await;
    assert!(alive.auth(&key, json!({"device_id": "alive"})).await["result"].is_object());
    let (pinged, mut pings) = tokio::sync::mpsc::unbounded_channel();
    let mut socket = alive.ws;
    let reader = tokio::spawn(async move {
        while let Some(Ok(message)) = socket.next().await {
            if matches!(message, Message::Ping(_)) {
                let _ = pinged.send(());
            }
        }
    });
    for _ in 0..3 {
        let ping = tokio::time::timeout(Duration::from_secs(10), pings.recv()).await.expect("a ping in time");
        assert!(ping.is_some(), "the answering peer was closed");
    }
    assert_eq!(app.clients().await, 1, "the answering peer is still subscribed");
    // A second peer that reads nothing, so answers no ping (reading
    // would answer them): the server lets it go, and the answering one
    // stays, still pinged.
    let mut silent = Client::connect(&app).await;
    assert!(silent.auth(&key, json!({"device_id": "silent"})).await["result"].is_object());
    let mut tries = 0;
    while app.clients().await != 1 {
        tries += 1;
        assert!(tries < 400, "the silent peer is let go");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // Pings from now on (none left from before): the reader still reads.
    while pings.try_recv().is_ok() {}
    for _ in 0..2 {
        let ping = tokio::time::timeout(Duration::from_secs(10), pings.recv()).await.expect("a ping in time");
        assert!(ping.is_some(), "the answering peer was closed");
    }
    assert_eq!(app.clients().await, 1, "the answering peer is still subscribed");
    reader.abort();
    // What the silent peer finds: pings, then the end.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), silent.ws.next()).await.expect("the end in time") {
            Some(Ok(Message::Ping(_))) => {}
            None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break,
            Some(Ok(other)) => panic!("{other:?}"),
        }
    }
}

/// A device that stops reading is closed with 1013 `slow_consumer` once its
/// queue overflows (or it makes no progress); what it read is a prefix of what matched, and a
/// reconnect from the last seq it got catches up on the rest exactly once.
async fn a_slow_consumer_is_closed_with_1013_and_resumes(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.streams.client_queue = 8;
        s.streams.slow_client_timeout = Duration::from_millis(300);
        s.streams.eviction_grace = Duration::from_secs(30);
    })
    .await;
    let key = Key::new();
    let filter = json!({"types": ["comment.posted"]});
    // Overflow, or (on a loaded machine, where publishes come slower than
    // the 300 ms timeout) no progress: either is a slow-client drop.
    let dropped = async || {
        app.metric("tidings_clients_dropped_total{reason=\"queue_full\"}").await
            + app.metric("tidings_clients_dropped_total{reason=\"no_progress\"}").await
    };
    let dropped_before = dropped().await;
    let mut slow = Client::connect(&app).await;
    assert!(slow.auth(&key, json!({"device_id": "slow", "filter": filter})).await["result"].is_object());
    assert_eq!(app.clients().await, 1);
    // Enough bytes to fill the socket buffers between server and client,
    // one event per publish so the queue backs up rather than bursting.
    let blob = "x".repeat(60_000);
    let mut published = Vec::new();
    for _ in 0..400 {
        published.push(app.publish("comment.posted", json!({"body": blob})).await);
        if app.clients().await == 0 {
            break;
        }
    }
    assert_eq!(app.clients().await, 0, "the slow device was dropped");
    assert!(dropped().await > dropped_before, "counted as a slow client");
    published.push(app.publish("comment.posted", json!({})).await);

    // It reads now: contiguous events, then close 1013.
    let mut got = Vec::new();
    let (code, reason) = loop {
        match tokio::time::timeout(Duration::from_secs(10), slow.ws.next()).await.expect("frames in time") {
            Some(Ok(Message::Text(text))) => {
                let n: Value = serde_json::from_str(text.as_str()).unwrap();
                assert_eq!(n["method"], "stream.event");
                got.push(n["params"]["seq"].as_i64().unwrap());
            }
            Some(Ok(Message::Close(Some(frame)))) => break (u16::from(frame.code), frame.reason.to_string()),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected events then a close frame, got {other:?}"),
        }
    };
    assert_eq!((code, reason.as_str()), (1013, "slow_consumer"));
    let last = *got.last().expect("it got some events first");
    assert_eq!(got, published.iter().copied().take_while(|id| *id <= last).collect::<Vec<_>>(), "what it got is a prefix");

    // Resume from the last seq it got: catch up, then realtime, nothing
    // missed and nothing twice.
    let mut again = Client::connect(&app).await;
    let answer = again.auth(&key, json!({"device_id": "slow", "cursor": last, "filter": filter})).await;
    assert_eq!(answer["result"]["cursor"], last, "{answer}");
    let head = answer["result"]["head_seq"].as_i64().unwrap();
    let mut seen = Vec::new();
    let mut since = last;
    loop {
        let page = again.call("sync.delta", json!({"device_id": "slow", "since": since, "limit": 50})).await;
        let result = &page["result"];
        seen.extend(result["items"].as_array().unwrap().iter().map(|i| i["seq"].as_i64().unwrap()));
        since = result["next_since"].as_i64().unwrap();
        if !result["has_more"].as_bool().unwrap() && since >= head {
            break;
        }
    }
    let live = app.publish("comment.posted", json!({})).await;
    published.push(live);
    assert_eq!(again.notification().await["params"]["seq"], live);
    seen.push(live);
    let rest: Vec<i64> = published.into_iter().filter(|id| *id > last).collect();
    assert_eq!(seen, rest);
}

/// `examples/ws_device.py`, the book's example (docs/websocket.md), run as a user would with
/// the packages it names: it catches up from `--since`, takes a realtime
/// event, and its last ack is the device's cursor.
async fn the_books_example_device_catches_up_goes_live_and_acks(backend: Backend) {
    use tokio::io::AsyncBufReadExt as _;
    let python = std::env::var("TIDINGS_TEST_PYTHON").expect("run scripts/test, which installs the example's packages");
    let app = spawn_app(backend).await;
    let mut published = Vec::new();
    for i in 0..3 {
        published.push(app.publish("comment.posted", json!({"n": i})).await);
    }
    app.publish("vote.cast", json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("device.key");
    let url = tidings_client::device::ws_url(&app.base, None);
    let mut child = tokio::process::Command::new(python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/ws_device.py"))
        .args([url.as_str(), "--key", key.to_str().unwrap(), "--device", "py", "--types", "comment.*", "--since", "0", "--count", "4"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut got = Vec::new();
    for i in 0..4 {
        if i == 3 {
            published.push(app.publish("comment.posted", json!({"n": 3})).await);
        }
        let line =
            tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.expect("a line in time").unwrap().expect("a line");
        got.push(serde_json::from_str::<Value>(&line).unwrap()["event_id"].as_i64().unwrap());
    }
    assert_eq!(got, published, "history by the filter, then realtime");
    assert!(child.wait().await.unwrap().success());
    let identity = tidings_server::keyfile::open(&key).unwrap();
    let mut device = tidings_client::device::DeviceClient::connect(&url).await.unwrap();
    let answer = device.auth(&identity, json!({"device_id": "py"})).await.unwrap();
    assert_eq!(answer["cursor"], published[3], "the example acked what it printed: {answer}");
}
