//! The Rust client's stream (`tidings_client::Client::stream`), the one
//! `tidings tail` is a thin user of (its resume across a restart is
//! `cli::publish_and_tail_resume_across_a_restart`): a gap is surfaced and
//! delivery goes on after it; what a server repeats or garbles moves
//! nothing; a refusal ends the stream, and the resume carries the last id;
//! dropping the stream is how a caller stops it, and closes its connection.

use std::time::Duration;

use futures_util::StreamExt as _;
use serde_json::json;
use tidings_client::consumer::Delivered;
use tidings_client::{Client, Item, StreamError, StreamQuery};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::both_stores;
use crate::helpers::{Backend, spawn_app_with};

both_stores!(
    a_gap_is_surfaced_and_delivery_goes_on_after_it,
    a_consumer_acknowledges_a_page_only_once_the_caller_came_back,
    a_publish_says_whether_it_was_replayed_and_a_refusal_is_not_retried,
    a_stream_goes_on_under_a_fresh_token_from_its_source,
    dropping_a_stream_closes_its_connection,
);

/// The next item within 10 s.
async fn next<S: futures_util::Stream<Item = Result<Item, StreamError>> + Unpin>(stream: &mut S) -> Result<Item, StreamError> {
    tokio::time::timeout(Duration::from_secs(10), stream.next()).await.expect("an item within 10 s").expect("the stream goes on")
}

async fn a_gap_is_surfaced_and_delivery_goes_on_after_it(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.streams.max_replay = 3).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(app.publish("comment.posted", json!({"i": i})).await);
    }
    let query = StreamQuery { types: Some("comment.*".into()), since: Some(ids[0] - 1), ..StreamQuery::default() };
    let mut stream = std::pin::pin!(Client::new(&app.base).stream(query));
    assert_eq!(next(&mut stream).await.unwrap(), Item::Open);
    let Item::Gap(gap) = next(&mut stream).await.unwrap() else { panic!("a gap first") };
    assert_eq!((gap["reason"].as_str(), gap["available_from"].as_i64()), (Some("replay_limit"), Some(ids[3])), "{gap}");
    let mut got = Vec::new();
    while got.len() < 3 {
        match next(&mut stream).await.unwrap() {
            Item::Event { id, envelope } => {
                assert_eq!(envelope["event_id"].as_i64(), Some(id));
                got.push(id);
            }
            other => panic!("an event, not {other:?}"),
        }
    }
    assert_eq!(got, ids[3..], "after the gap, what could be served, in order");
    let live = app.publish("comment.posted", json!({"live": true})).await;
    assert!(matches!(next(&mut stream).await.unwrap(), Item::Event { id, .. } if id == live), "then live");
}

/// A server that answers the first stream with a repeated id, a body that
/// is not JSON and an event without an id, then ends it; and the second
/// with `401`. The client yields each good event once, resumes with the
/// last id it yielded, and stops at the refusal without trying again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_server_repeats_or_garbles_moves_nothing_and_a_refusal_ends_the_stream() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let mut heads = Vec::new();
        let answers = [
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\nretry: 50\n\n\
             id: 5\ndata: {\"event_id\":5}\n\nid: 3\ndata: {\"event_id\":3}\n\nid: 5\ndata: {\"event_id\":5}\n\n\
             id: 6\ndata: not json\n\ndata: {\"no\":\"id\"}\n\nevent: system.client_dropped_slow\ndata: {\"reason\":\"queue_full\"}\n\n\
             id: 7\ndata: {\"event_id\":7}\n\n"
                .to_owned(),
            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 55\r\n\r\n\
             {\"error\":\"unauthorized\",\"message\":\"the token expired\"}"
                .to_owned(),
        ];
        for answer in answers {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = socket.read(&mut buf).await.unwrap();
                assert!(n > 0, "a whole request head");
                head.extend_from_slice(&buf[..n]);
            }
            heads.push(String::from_utf8_lossy(&head).to_lowercase());
            socket.write_all(answer.as_bytes()).await.unwrap();
            socket.shutdown().await.unwrap();
        }
        heads
    });
    let client = Client::new(&base).with_token("a-token");
    let mut stream = std::pin::pin!(client.stream(StreamQuery { since: Some(4), ..StreamQuery::default() }));
    let mut items = Vec::new();
    let refused = loop {
        match next(&mut stream).await {
            Ok(item) => items.push(item),
            Err(e) => break e,
        }
    };
    assert!(matches!(&refused, StreamError::Refused(e) if e.to_string().contains("401: unauthorized")), "{refused}");
    assert!(tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().is_none(), "a refusal is not retried");
    let ids: Vec<i64> = items.iter().filter_map(|i| if let Item::Event { id, .. } = i { Some(*id) } else { None }).collect();
    assert_eq!(ids, [5, 7], "each good event once: {items:?}");
    assert!(items.contains(&Item::Notice { name: "system.client_dropped_slow".into(), data: json!({"reason": "queue_full"}) }));
    assert!(matches!(items.last(), Some(Item::Ended { wait }) if *wait == Duration::from_millis(50)), "at the server's retry: {items:?}");
    let heads = server.await.unwrap();
    assert!(heads[0].contains("last-event-id: 4") && heads[0].contains("authorization: bearer a-token"), "{}", heads[0]);
    assert!(heads[1].contains("last-event-id: 7"), "resumed after the last event yielded: {}", heads[1]);
    assert!(!heads[0].contains("a-token ") && !heads[0].lines().next().unwrap_or("").contains("a-token"), "the token is in no URL");
}

/// A durable consumer hands out a page's events in order; the page is
/// acknowledged by the poll that follows it, so a worker that stopped
/// mid-page gets it again, and one that came back for more does not.
async fn a_consumer_acknowledges_a_page_only_once_the_caller_came_back(backend: Backend) {
    let app = spawn_app_with(backend, |_| {}).await;
    let client = Client::new(&app.base);
    let filter = Some(json!({"types": ["comment.*"]}).to_string());
    let mut worker = client.consumer("rust-worker", filter.clone());
    worker.wait = Duration::from_millis(200);
    assert_eq!(worker.next().await.unwrap(), None, "a new consumer starts at the head");
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(app.publish("comment.posted", json!({"i": i})).await);
    }
    let event = |d: Option<Delivered>| match d {
        Some(Delivered::Event { id, .. }) => id,
        other => panic!("an event, not {other:?}"),
    };
    assert_eq!(event(worker.next().await.unwrap()), ids[0]);
    // Stopped mid-page: a new worker with the same id gets the page again.
    let mut again = client.consumer("rust-worker", filter.clone());
    again.wait = Duration::from_millis(200);
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(event(again.next().await.unwrap()));
    }
    assert_eq!(got, ids, "the unfinished page, whole and in order");
    // Coming back for more confirms it.
    assert_eq!(again.next().await.unwrap(), None);
    let later = app.publish("comment.posted", json!({"i": 3})).await;
    let mut third = client.consumer("rust-worker", filter);
    third.wait = Duration::from_secs(5);
    assert_eq!(event(third.next().await.unwrap()), later, "only what came after the confirmed page");
}

/// `Client::publish` answers the ids and whether the server had them under
/// the key already; a refusal is returned after one attempt.
async fn a_publish_says_whether_it_was_replayed_and_a_refusal_is_not_retried(backend: Backend) {
    use tidings_client::publish::{PublishError, PublishOptions};
    let app = spawn_app_with(backend, |_| {}).await;
    let client = Client::new(&app.base);
    let body = json!({"event_type": "comment.posted", "payload": {"n": 1}});
    let keyed = || PublishOptions { key: Some("rust-client-key".into()), retries: 2 };
    let first = client.publish(&body, keyed(), |_| panic!("nothing to retry")).await.unwrap();
    let again = client.publish(&body, keyed(), |_| panic!("nothing to retry")).await.unwrap();
    assert!(!first.replayed && again.replayed, "{first:?} {again:?}");
    assert_eq!((first.ids.len(), &first.ids), (1, &again.ids), "the same ids, stored once");
    assert_eq!(app.head().await, first.ids[0]);
    let mut retried = 0;
    let refused = client.publish(&json!({"event_type": "Not-A-Name"}), PublishOptions::default(), |_| retried += 1).await;
    assert!(matches!(&refused, Err(PublishError::Refused { status: 422, code, .. }) if code == "invalid_event_name"), "{refused:?}");
    assert_eq!(retried, 0);
}

/// With a token source, a stream whose token expires (the server ends it
/// with `system.token_expired`) goes on from its last event under a fresh
/// token; with a fixed token it would be refused.
async fn a_stream_goes_on_under_a_fresh_token_from_its_source(backend: Backend) {
    use crate::helpers::tokens::{SECRET, token, token_with};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(SECRET.into())).await;
    let publisher = token("publisher", json!({"publish": ["**"]}));
    let publish = |n: i64| {
        let request = app
            .http
            .post(app.url("/v1/events"))
            .bearer_auth(&publisher)
            .json(&json!({"event_type": "comment.posted", "payload": {"n": n}}));
        async move {
            let answer: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
            answer["event_ids"][0].as_i64().unwrap()
        }
    };
    let minted = Arc::new(AtomicUsize::new(0));
    let counter = minted.clone();
    let client = Client::new(&app.base).with_token_source(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        // Short-lived: it expires while the stream is open.
        token_with(json!({"sub": "reader", "exp": chrono::Utc::now().timestamp() + 2, "subscribe": ["**"]}), SECRET)
    });
    let mut stream = std::pin::pin!(client.stream(StreamQuery { types: Some("comment.*".into()), ..StreamQuery::default() }));
    assert_eq!(next(&mut stream).await.unwrap(), Item::Open);
    let first = publish(1).await;
    assert!(matches!(next(&mut stream).await.unwrap(), Item::Event { id, .. } if id == first));
    let mut expired = false;
    loop {
        match next(&mut stream).await.unwrap() {
            Item::Notice { name, .. } if name == "system.token_expired" => expired = true,
            Item::Open => break,
            Item::Ended { .. } | Item::Reconnecting { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(expired, "the first token expired");
    let second = publish(2).await;
    assert!(matches!(next(&mut stream).await.unwrap(), Item::Event { id, .. } if id == second), "then the next event, under a fresh token");
    assert!(minted.load(Ordering::SeqCst) >= 2);
}

/// Dropping a stream (how a caller stops it, from any task that owns it)
/// closes its connection: the server's subscription goes away.
async fn dropping_a_stream_closes_its_connection(backend: Backend) {
    let app = spawn_app_with(backend, |_| {}).await;
    let id = app.publish("comment.posted", json!({})).await;
    let query = StreamQuery { types: Some("comment.*".into()), since: Some(id - 1), ..StreamQuery::default() };
    let mut stream = Box::pin(Client::new(&app.base).stream(query));
    assert_eq!(next(&mut stream).await.unwrap(), Item::Open);
    assert!(matches!(next(&mut stream).await.unwrap(), Item::Event { id: got, .. } if got == id));
    let subscriptions = |want: i64, what: &'static str| {
        let app = &app;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while app.clients().await != want {
                assert!(tokio::time::Instant::now() < deadline, "{what} within 10 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    subscriptions(1, "the stream's subscription").await;
    drop(stream);
    subscriptions(0, "the connection closed after the drop").await;
}
