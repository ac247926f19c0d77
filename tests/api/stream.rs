//! `/v1/stream`: frame format, Last-Event-ID resume, the replay/live seam,
//! envelope negotiation.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, spawn_app};

both_stores!(
    three_events_then_resume_from_the_first,
    seam_under_concurrent_publishers,
    envelope_negotiation,
    since_and_filters,
    heartbeat_and_live_page,
    streams_over_raw_sockets,
    a_trickled_request_head_meets_the_header_deadline,
    an_oversized_head_is_a_json_refusal
);

async fn three_events_then_resume_from_the_first(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(app.publish("comment.posted", json!({"comment_id": format!("c{i}")})).await);
    }
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "ids are consecutive: {ids:?}");

    // Raw frame format: retry once, then id + data per event.
    let response = app.http.get(app.url("/v1/stream?since=0")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["cache-control"], "no-cache");
    assert_eq!(response.headers()["x-accel-buffering"], "no");
    let mut reader = tidings_client::sse::SseReader::new(Box::pin(response.bytes_stream()) as tidings_client::sse::BodyStream);
    let mut got = Vec::new();
    while got.len() < 3 {
        let e = reader.next_event().await.unwrap();
        assert_eq!(e.event, None, "events are unnamed so onmessage sees them");
        let v: Value = serde_json::from_str(&e.data).unwrap();
        assert_eq!(v["envelope_version"], 1);
        assert_eq!(v["event_type"], "comment.posted");
        assert_eq!(e.id.as_deref().unwrap(), v["event_id"].to_string());
        assert!(v["occurred_at"].as_str().unwrap().ends_with('Z'));
        assert_eq!(v["visibility"], "public");
        assert_eq!(v["links"], json!([]));
        got.push(v["event_id"].as_i64().unwrap());
    }
    assert_eq!(got, ids);
    assert_eq!(reader.parser().retry_ms, Some(2000));
    drop(reader);

    // Resume after the first: exactly the other two, then live.
    let mut s = app.stream("", Some(ids[0])).await;
    assert_eq!(s.ids(2).await, ids[1..].to_vec());
    let live = app.publish("comment.posted", json!({})).await;
    assert_eq!(s.ids(1).await, vec![live]);
}

async fn seam_under_concurrent_publishers(backend: Backend) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let app = std::sync::Arc::new(spawn_app(backend).await);
    // Some history first.
    for _ in 0..20 {
        app.publish("signal.upvote.recorded", json!({"weight": 1})).await;
    }
    let resume_from = 10;
    // Eight publishers run until told to stop (25 events each at least).
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let publishers: Vec<_> = (0..8)
        .map(|_| {
            let (app, stop) = (app.clone(), stop.clone());
            tokio::spawn(async move {
                let mut ids = Vec::new();
                while ids.len() < 25 || !stop.load(Ordering::Acquire) {
                    ids.push(app.publish("signal.upvote.recorded", json!({"weight": 2})).await);
                }
                ids
            })
        })
        .collect();
    // Connect while they run: once they have committed some events...
    crate::helpers::wait_until("60 events committed", std::time::Duration::from_secs(30), std::time::Duration::ZERO, || async {
        app.head().await >= 60
    })
    .await;
    let mut s = app.stream("?types=signal.*.recorded", Some(resume_from)).await;
    // ...and let them commit more after the stream registered.
    let at_open = app.head().await;
    crate::helpers::wait_until("50 more events committed", std::time::Duration::from_secs(30), std::time::Duration::ZERO, || async {
        app.head().await >= at_open + 50
    })
    .await;
    stop.store(true, Ordering::Release);
    let mut published = BTreeSet::new();
    for p in publishers {
        published.extend(p.await.unwrap());
    }
    let head = app.head().await;
    assert!(at_open > 20 && head >= at_open + 50, "events were committed before ({at_open}) and after the stream opened ({head})");
    assert_eq!(published.len() as i64, head - 20);
    let expected: Vec<i64> = (resume_from + 1..=head).collect();
    let got = s.ids(expected.len()).await;
    assert_eq!(got, expected, "every id after the resume point exactly once, ascending");
    // Nothing more arrives: the next event is the one we publish now.
    let next = app.publish("signal.upvote.recorded", json!({})).await;
    assert_eq!(s.ids(1).await, vec![next]);
}

async fn envelope_negotiation(backend: Backend) {
    let app = spawn_app(backend).await;
    // Envelope versions (docs/events.md): a subscriber that only accepts a
    // version we do not write gets a typed error, not a crash and not a
    // silent downgrade.
    let r = app.http.get(app.url("/v1/stream?accept_envelope=2")).send().await.unwrap();
    assert_eq!(r.status(), 406);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "envelope_version_unsupported");
    assert_eq!(body["supported"], json!([1]));
    let r = app.http.get(app.url("/v1/stream?accept_envelope=two")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_accept_envelope");
    // A client that knows 1 and 2 gets 1.
    let id = app.publish("comment.posted", json!({})).await;
    let mut s = app.stream("?accept_envelope=1,2&since=0", None).await;
    let e = s.next().await;
    let v: Value = serde_json::from_str(&e.data).unwrap();
    assert_eq!((v["envelope_version"].as_i64(), v["event_id"].as_i64()), (Some(1), Some(id)));
    // And the server is still serving.
    assert_eq!(app.http.get(app.url("/health")).send().await.unwrap().status(), 200);
}

async fn since_and_filters(backend: Backend) {
    let app = spawn_app(backend).await;
    let a = app.publish("hypothesis.created", json!({})).await;
    let _b = app.publish("comment.posted", json!({})).await;
    let c = app.publish("hypothesis.promoted", json!({"to_state": "promoted"})).await;
    // since= works like Last-Event-ID, and types= globs filter replay.
    let mut s = app.stream("?since=0&types=hypothesis.*", None).await;
    assert_eq!(s.ids(2).await, vec![a, c]);
    // Last-Event-ID wins over since.
    let mut s = app.stream("?since=0&types=hypothesis.*", Some(a)).await;
    assert_eq!(s.ids(1).await, vec![c]);
    // Live only without a resume point.
    let mut live = app.stream("?types=comment.posted", None).await;
    let d = app.publish("comment.posted", json!({})).await;
    assert_eq!(live.ids(1).await, vec![d]);
    // Bad resume points and filters are refused before a stream opens.
    for (query, header, code) in [
        ("?since=-1", None, "invalid_since"),
        ("?since=abc", None, "invalid_since"),
        ("", Some("x1"), "invalid_last_event_id"),
        ("?types=a..b", None, "invalid_filter"),
        ("?types=", None, "invalid_filter"),
        ("?filter=%7B%22types%22%3A%22a.*%22%7D", None, "invalid_filter"),
        ("?filter=%7Bnot%20json", None, "invalid_filter"),
    ] {
        let mut r = app.http.get(app.url(&format!("/v1/stream{query}")));
        if let Some(h) = header {
            r = r.header("last-event-id", h);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 400, "{query} {header:?}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], code, "{query} {header:?}");
    }
}

async fn heartbeat_and_live_page(backend: Backend) {
    use futures_util::StreamExt as _;
    let app = crate::helpers::spawn_app_with(backend, |s| s.streams.heartbeat = std::time::Duration::from_millis(100)).await;
    let response = app.http.get(app.url("/v1/stream")).send().await.unwrap();
    let mut body = response.bytes_stream();
    let mut seen = Vec::new();
    // The first chunk is the retry line; a comment heartbeat follows while idle.
    while !seen.windows(3).any(|w| w == b":\n\n") {
        let chunk =
            tokio::time::timeout(std::time::Duration::from_secs(5), body.next()).await.expect("a heartbeat while idle").unwrap().unwrap();
        seen.extend_from_slice(&chunk);
    }
    assert!(seen.starts_with(b"retry: 2000\n\n"));
    // The console is served from the binary, and follows through the
    // client module the server serves too.
    let r = app.http.get(app.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = r.text().await.unwrap();
    assert!(html.contains(r#"from "/tidings.js";"#), "the console imports the client");
    assert!(html.contains(r#"transport: "eventsource""#), "its live list follows over EventSource");
}

/// Streams are written by tidings itself (chunked frames); HTTP/1.0 and
/// other first requests go to hyper; a client that closes its socket is
/// unregistered without waiting for a write to fail.
async fn streams_over_raw_sockets(backend: Backend) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = spawn_app(backend).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let read_until = |mut socket: tokio::net::TcpStream, needle: String| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains(&needle) {
            let n = tokio::time::timeout(std::time::Duration::from_secs(10), socket.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0, "closed before {needle:?}: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
        (socket, String::from_utf8_lossy(&got).into_owned())
    };
    // HTTP/1.1: chunked, the head, then the first frame as a chunk.
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket.write_all(b"GET /v1/stream?types=comment.posted HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let (socket, head) = read_until(socket, "retry:".into()).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.contains("transfer-encoding: chunked\r\n") && head.contains("content-type: text/event-stream"), "{head}");
    assert!(head.contains("x-request-id: "), "the router's middleware ran: {head}");
    let id = app.publish("comment.posted", json!({"n": 1})).await;
    let (socket, body) = read_until(socket, format!("id: {id}\n")).await;
    assert!(body.contains("\r\n") && body.contains("data: {"), "{body}");
    // Closing the socket ends the stream on the server at once.
    assert_eq!(app.clients().await, 1);
    drop(socket);
    crate::helpers::wait_until(
        "the closed stream to be unregistered",
        std::time::Duration::from_secs(2),
        std::time::Duration::from_millis(10),
        || async { app.clients().await == 0 },
    )
    .await;
    // HTTP/1.0 goes to hyper, which answers in HTTP/1.0.
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket.write_all(b"GET /v1/stream HTTP/1.0\r\n\r\n").await.unwrap();
    let (_, head) = read_until(socket, "retry:".into()).await;
    assert!(head.starts_with("HTTP/1.0 200 OK\r\n"), "{head}");
    // Refusals on the direct path carry one Content-Length, a JSON body of
    // that length, and close the connection.
    for (query, status) in [("since=x", "400"), ("accept_envelope=9", "406")] {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        socket.write_all(format!("GET /v1/stream?{query} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes()).await.unwrap();
        let mut all = Vec::new();
        tokio::time::timeout(std::time::Duration::from_secs(10), socket.read_to_end(&mut all)).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&all).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
        let lengths: Vec<&str> = head.lines().filter(|l| l.to_ascii_lowercase().starts_with("content-length:")).collect();
        assert_eq!(lengths.len(), 1, "one Content-Length: {head}");
        assert_eq!(lengths[0].split(':').nth(1).unwrap().trim().parse::<usize>().unwrap(), body.len(), "{head}");
        assert!(serde_json::from_str::<Value>(body).unwrap()["error"].is_string(), "{body}");
    }
    // A path that only starts like a stream is an ordinary request.
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    socket.write_all(b"GET /v1/streams HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    let (_, head) = read_until(socket, "\r\n\r\n".into()).await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
}

/// `TIDINGS_HEADER_TIMEOUT` is a deadline for the whole request head, not
/// per byte: a client trickling a head (one byte every 100 ms, never idle
/// for long) is closed when it runs out, however the head begins.
async fn a_trickled_request_head_meets_the_header_deadline(backend: Backend) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = crate::helpers::spawn_app_with(backend, |s| s.http.header_timeout = std::time::Duration::from_secs(1)).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    for head in [
        "GET /v1/xyz HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "GET /v1/stream HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ] {
        let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let started = std::time::Instant::now();
        let mut closed = None;
        for b in head.bytes() {
            if socket.write_all(&[b]).await.is_err() {
                closed = Some(started.elapsed());
                break;
            }
            let mut buf = [0u8; 256];
            if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(std::time::Duration::from_millis(100), socket.read(&mut buf)).await {
                closed = Some(started.elapsed());
                break;
            }
        }
        let closed = closed.unwrap_or_else(|| panic!("{head:?}: still open after {:?}", started.elapsed()));
        assert!(closed < std::time::Duration::from_millis(1600), "{head:?}: closed after {closed:?}, the deadline is 1 s");
    }
    // A head that starts late and is not a GET: the deadline counts from
    // the connection, not from the first byte (before, hyper's own timer
    // started again at the first byte: 0.7 s + 1 s).
    let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let started = std::time::Instant::now();
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let mut closed = None;
    for b in "POST /v1/events HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".bytes() {
        let mut buf = [0u8; 256];
        if socket.write_all(&[b]).await.is_err()
            || matches!(tokio::time::timeout(std::time::Duration::from_millis(50), socket.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
        {
            closed = Some(started.elapsed());
            break;
        }
    }
    let closed = closed.expect("a trickled POST head is closed");
    assert!(closed < std::time::Duration::from_millis(1500), "a late POST head closed after {closed:?}, the deadline is 1 s");
}

/// Heads over the limits get the JSON refusal (`414 uri_too_long`,
/// `431 headers_too_large`), and a head that does not parse `400
/// malformed_request`, with a content type, then the connection closes; on
/// the first request of a connection and on a later one of a kept-alive
/// connection alike. The server keeps serving.
async fn an_oversized_head_is_a_json_refusal(backend: Backend) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = spawn_app(backend).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let huge_filter = format!("GET /v1/stream?filter={} HTTP/1.1\r\nHost: localhost\r\n\r\n", "a".repeat(1 << 20));
    let long_filter = format!("GET /v1/stream?filter={} HTTP/1.1\r\nHost: localhost\r\n\r\n", "a".repeat(56 * 1024));
    let long_target = format!("GET /v1/poll?types={} HTTP/1.1\r\nHost: localhost\r\n\r\n", "a".repeat(50 * 1024));
    let many: String = (0..120).map(|i| format!("X-H{i}: v\r\n")).collect();
    let many_headers = format!("POST /v1/events HTTP/1.1\r\nHost: localhost\r\n{many}Content-Length: 0\r\n\r\n");
    let big_header = format!("GET /v1/poll HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n", "b".repeat(70 * 1024));
    let huge_header = format!("GET /v1/poll HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n", "b".repeat(600 * 1024));
    let malformed = "GET /health HTTP/1.1\r\nHost: localhost\r\nNo colon here\r\n\r\n".to_owned();
    // (request, status, code, also as a later request of a kept-alive
    // connection, where hyper reads the head: past its own limits, its
    // empty refusal is written as the JSON one).
    // (request, answer on a connection's first request, answer on a later
    // request of a kept-alive connection, where hyper reads the head and a
    // 1 MiB request line is past its buffer before its URI limit).
    type Answer = (u16, &'static str);
    let cases: [(String, Answer, Answer); 7] = [
        (huge_filter, (414, "uri_too_long"), (431, "headers_too_large")),
        (long_filter, (414, "uri_too_long"), (414, "uri_too_long")),
        (long_target, (414, "uri_too_long"), (414, "uri_too_long")),
        (many_headers, (431, "headers_too_large"), (431, "headers_too_large")),
        (big_header, (431, "headers_too_large"), (431, "headers_too_large")),
        (huge_header, (431, "headers_too_large"), (431, "headers_too_large")),
        (malformed, (400, "malformed_request"), (400, "malformed_request")),
    ];
    for (request, first, later) in &cases {
        // First request of a connection (read by the connection loop), and
        // the second of a kept-alive one (read by hyper).
        for kept_alive in [false, true] {
            let (status, code) = if kept_alive { later } else { first };
            let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
            if kept_alive {
                // A whole first exchange: the head, then its body by length.
                socket.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
                let mut got = Vec::new();
                let mut buf = vec![0u8; 4096];
                loop {
                    let n = socket.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the first answer arrives");
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let length: usize =
                            head.split("content-length: ").nth(1).and_then(|v| v.split("\r\n").next()).unwrap().parse().unwrap();
                        if body.len() >= length {
                            break;
                        }
                    }
                }
            }
            let (mut reader, mut writer) = socket.into_split();
            let request = request.clone();
            let sender = tokio::spawn(async move {
                let _ = writer.write_all(request.as_bytes()).await;
                writer
            });
            let mut got = Vec::new();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), reader.read_to_end(&mut got))
                .await
                .expect("the connection closes");
            drop(sender);
            let text = String::from_utf8_lossy(&got).into_owned();
            let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{code} kept_alive={kept_alive}: no answer: {text:?}"));
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "kept_alive={kept_alive}: {head}");
            assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
            let body: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
            assert_eq!(body["error"], *code, "kept_alive={kept_alive}");
        }
    }
    assert_eq!(app.http.get(app.url("/health")).send().await.unwrap().status(), 200);
}
