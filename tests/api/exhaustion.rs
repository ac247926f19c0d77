//! Attacks on what the server spends: places in its limits held by long
//! polls, silent WebSockets and connections that say nothing, HTTP/2
//! streams that grant no window, expired tokens, subscriptions, consumers
//! and payload rules without bound, and refusals that must arrive before
//! a body is read. Each is tried against a real server on loopback.

use serde_json::{Map, Value, json};

use crate::both_stores;
use crate::helpers::federation::{Peer, Subscribe, inbox_grant, server_hash};
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(
    long_polls_and_silent_websockets_hold_bounded_places,
    abandoned_long_polls_give_their_places_back,
    poll_pages_are_bounded_in_bytes_on_every_transport,
    an_expired_token_ends_what_it_opened,
    connections_that_say_nothing_are_closed,
    http2_streams_that_grant_no_window_are_closed,
    one_subscriber_cannot_take_every_subscription,
    one_clients_rule_cannot_spend_without_bound,
    one_identity_cannot_create_consumers_without_bound,
    a_refusal_sent_before_the_body_is_read_arrives,
);

/// Item 7: a waiting long-poll holds a place in `TIDINGS_MAX_STREAMS` (the
/// next one, and an SSE stream, get `503 too_many_streams`), and gives it
/// back when it answers; a WebSocket that never sends `stream.auth` is
/// closed after `TIDINGS_WS_AUTH_TIMEOUT` (an `auth_timeout` error frame,
/// then 1008), giving its place back.
async fn long_polls_and_silent_websockets_hold_bounded_places(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.streams.max_streams = 2;
        s.ws.ws_auth_timeout = std::time::Duration::from_secs(1);
    })
    .await;
    let long_poll = |wait_ms: u32| {
        let request = app.http.get(app.url(&format!("/v1/poll?types=probe.*&wait_ms={wait_ms}")));
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let held: Vec<_> = (0..2).map(|_| tokio::spawn(long_poll(30_000))).collect();
    crate::helpers::eventually("both long-polls wait", || async { app.clients().await == 2 }).await;
    let (status, body) = long_poll(30_000).await;
    assert_eq!((status, body["error"].as_str()), (503, Some("too_many_streams")), "{body}");
    let sse = app.http.get(app.url("/v1/stream")).send().await.unwrap();
    assert_eq!(sse.status(), 503, "an SSE stream finds no place either");
    drop(sse);
    // An event answers both; their places are given back.
    app.publish("probe.done", json!({})).await;
    for poll in held {
        let (status, body) = poll.await.unwrap();
        assert_eq!((status, body["events"].as_array().map(Vec::len)), (200, Some(1)), "{body}");
    }
    crate::helpers::eventually("the places are back", || async {
        app.http.get(app.url("/v1/poll?wait_ms=1")).send().await.unwrap().status() == 200
    })
    .await;
    // Two WebSockets that never authenticate hold both places, for a while.
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(crate::helpers::device::Client::connect(&app).await);
    }
    let (status, _) = long_poll(1).await;
    assert_eq!(status, 503, "the silent sockets hold the places");
    for socket in &mut silent {
        let error = socket.notification().await;
        assert_eq!(error["error"]["data"]["code"], "auth_timeout", "{error}");
        assert_eq!(socket.closed().await, (1008, "auth_timeout".to_owned()));
    }
    crate::helpers::eventually("the sockets' places are back", || async {
        app.http.get(app.url("/v1/poll?wait_ms=1")).send().await.unwrap().status() == 200
    })
    .await;
}

/// A `POST /v1/poll` and an MCP `poll` that wait, whose clients hang up at
/// once, give their places in `TIDINGS_MAX_STREAMS` back right away (those
/// requests run detached so that writes are never cut off half-way; the
/// waits watch for their client leaving), not after their two minutes.
async fn abandoned_long_polls_give_their_places_back(backend: Backend) {
    use tokio::io::AsyncWriteExt as _;
    let app = spawn_app_with(backend, |s| {
        s.streams.max_streams = 2;
        s.poll.poll_max_wait = std::time::Duration::from_secs(120);
    })
    .await;
    let post = |path: &str, body: Value, accept: &str| {
        let body = body.to_string();
        format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: {accept}\r\nContent-Length: {}\r\n\r\n{body}",
            app.base.trim_start_matches("http://"),
            body.len()
        )
    };
    let requests = [
        post("/v1/poll", json!({"filter": {"types": ["probe.*"]}, "wait_ms": 120_000}), "application/json"),
        post(
            "/mcp",
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": "poll", "arguments": {"filter": {"types": ["probe.*"]}, "wait_ms": 120_000}}}),
            "application/json, text/event-stream",
        ),
    ];
    let mut sockets = Vec::new();
    for request in requests {
        let mut socket = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://")).await.unwrap();
        socket.write_all(request.as_bytes()).await.unwrap();
        sockets.push(socket);
    }
    crate::helpers::eventually("both polls wait, holding both places", || async { app.clients().await == 2 }).await;
    let (status, _) = {
        let r = app.http.get(app.url("/v1/poll?wait_ms=1")).send().await.unwrap();
        (r.status().as_u16(), r.text().await)
    };
    assert_eq!(status, 503, "the waiting polls hold the places");
    drop(sockets);
    crate::helpers::eventually("the abandoned polls give their places back", || async { app.clients().await == 0 }).await;
    let r = app.http.get(app.url("/v1/poll?wait_ms=1")).send().await.unwrap();
    assert_eq!(r.status(), 200, "a new poll finds a place");
    // The server goes on answering waits whose clients stay.
    let waiting = app.http.post(app.url("/v1/poll")).json(&json!({"filter": {"types": ["probe.*"]}, "wait_ms": 30_000})).send();
    let publish = async {
        crate::helpers::eventually("the next poll waits", || async { app.clients().await == 1 }).await;
        app.publish("probe.done", json!({})).await;
    };
    let (answer, ()) = tokio::join!(waiting, publish);
    let page: Value = answer.unwrap().json().await.unwrap();
    assert_eq!(page["events"].as_array().map(Vec::len), Some(1), "{page}");
}

/// A page is bounded in bytes (`TIDINGS_POLL_MAX_BYTES`), not only in
/// events, on HTTP, MCP and the WebSocket's `sync.delta`: large events come
/// a few to a page with `has_more`, every one once, in order. MCP answers a
/// page once (as structured content; its text only says what it holds).
/// Each poll holds a place in its identity's stream limit while it reads.
async fn poll_pages_are_bounded_in_bytes_on_every_transport(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.poll.poll_max_bytes = 64 * 1024).await;
    let big = "x".repeat(10_000);
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(app.publish("probe.big", json!({"i": i, "blob": big})).await);
    }
    // HTTP: pages of at most 64 KiB (6 of these events), every id once.
    let (mut since, mut seen, mut pages) = (0i64, Vec::new(), 0);
    loop {
        let r = app.http.get(app.url(&format!("/v1/poll?types=probe.*&since={since}&limit=1000"))).send().await.unwrap();
        let text = r.text().await.unwrap();
        assert!(text.len() <= 64 * 1024 + 256, "a page of {} bytes", text.len());
        let page: Value = serde_json::from_str(&text).unwrap();
        seen.extend(page["events"].as_array().unwrap().iter().map(|e| e["event_id"].as_i64().unwrap()));
        since = page["next_since"].as_i64().unwrap();
        pages += 1;
        if page["has_more"] != true {
            break;
        }
    }
    assert_eq!(seen, ids, "every event once, in order");
    assert!(pages >= 4, "{pages} pages");
    // MCP: the same bound, and the page once.
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "poll", "arguments": {"filter": {"types": ["probe.*"]}, "since": 0, "limit": 1000}}});
    let r = app.http.post(app.url("/mcp")).header("accept", "application/json, text/event-stream").json(&call).send().await.unwrap();
    let text = r.text().await.unwrap();
    assert!(text.len() <= 2 * 64 * 1024, "an MCP page of {} bytes carries the page once", text.len());
    let answer: Value = serde_json::from_str(&text).unwrap();
    let result = &answer["result"];
    let events = result["structuredContent"]["events"].as_array().unwrap();
    assert!(!events.is_empty() && events.len() < 20 && result["structuredContent"]["has_more"] == true, "{}", result["content"]);
    assert!(result["content"][0]["text"].as_str().unwrap().starts_with(&format!("{} events", events.len())));
    // The WebSocket's sync.delta.
    let mut client = crate::helpers::device::Client::connect(&app).await;
    let auth =
        client.auth(&crate::helpers::device::Key::new(), json!({"device_id": "big", "cursor": 0, "filter": {"types": ["probe.*"]}})).await;
    assert!(auth["result"].is_object(), "{auth}");
    let page = client.call("sync.delta", json!({"device_id": "big", "since": 0, "limit": 500})).await;
    let items = page["result"]["items"].as_array().unwrap();
    assert!(!items.is_empty() && items.len() < 20 && page["result"]["has_more"] == true, "{}", items.len());
    drop(client);
    // A poll holds its identity's place while it reads: with one place
    // and a long-poll waiting, a plain poll of the same identity is refused.
    let app = spawn_app_with(backend, |s| {
        s.auth.jwt_hs256_secret = Some(crate::helpers::tokens::SECRET.into());
        s.streams.max_streams_per_identity = 1;
    })
    .await;
    let token = crate::helpers::tokens::token("reader", json!({"subscribe": ["**"]}));
    let waiting = tokio::spawn({
        let request = app.http.get(app.url("/v1/poll?types=nothing.here&wait_ms=20000")).bearer_auth(&token);
        async move { request.send().await.unwrap().status().as_u16() }
    });
    crate::helpers::eventually("the long-poll waits", || async { app.clients().await == 1 }).await;
    let r = app.http.get(app.url("/v1/poll?types=probe.*&since=0")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(r.status(), 429, "a second read of the same identity waits its turn");
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "too_many_streams_for_identity");
    waiting.abort();
}

/// Item 3: a token's life bounds what it opened. At its expiry (with the
/// 5 s leeway) an SSE stream ends with `system.token_expired`, a waiting
/// long-poll answers, a WebSocket stops live delivery and is told; a fresh
/// token for the same `sub` resumes the WebSocket from where it stopped,
/// and one that does not come in time closes it. Nothing published after
/// the expiry reaches anything opened under the old token.
async fn an_expired_token_ends_what_it_opened(backend: Backend) {
    use crate::helpers::tokens::{SECRET, token};
    let app = spawn_app_with(backend, |s| {
        s.auth.jwt_hs256_secret = Some(SECRET.into());
        s.ws.reauth_grace = std::time::Duration::from_secs(1);
    })
    .await;
    let short = |sub: &str| {
        let claims = json!({"sub": sub, "subscribe": ["probe.*"], "exp": chrono::Utc::now().timestamp() + 1});
        jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap())
            .unwrap()
    };
    let publisher = token("pub", json!({"publish": ["probe.*"]}));
    let publish = |n: u32| {
        let request =
            app.http.post(app.url("/v1/events")).bearer_auth(&publisher).json(&json!({"event_type": "probe.seen", "payload": {"n": n}}));
        async move { request.send().await.unwrap().json::<Value>().await.unwrap()["event_ids"][0].as_i64().unwrap() }
    };
    let alice = short("alice");
    let r = app.http.get(app.url("/v1/stream?types=probe.*")).bearer_auth(&alice).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut sse = crate::helpers::Stream::from_response(r);
    let key = crate::helpers::device::Key::new();
    let query = format!("?access_token={alice}");
    let mut renewed = crate::helpers::device::Client::connect_with(&app, &query).await;
    assert!(renewed.auth(&key, json!({"device_id": "renewed"})).await["result"].is_object());
    let mut lapsed = crate::helpers::device::Client::connect_with(&app, &query).await;
    assert!(lapsed.auth(&key, json!({"device_id": "lapsed"})).await["result"].is_object());
    let first = publish(1).await;
    assert_eq!(sse.next().await.id.as_deref(), Some(first.to_string().as_str()));
    for device in [&mut renewed, &mut lapsed] {
        let event = device.notification().await;
        assert_eq!((event["method"].as_str(), event["params"]["seq"].as_i64()), (Some("stream.event"), Some(first)), "{event}");
    }
    // A long-poll that would wait 60 s answers at the expiry.
    let poll = app.http.get(app.url("/v1/poll?types=probe.*&wait_ms=60000")).bearer_auth(&alice).send();
    let answered =
        tokio::time::timeout(std::time::Duration::from_secs(20), poll).await.expect("the long-poll answers at the expiry").unwrap();
    assert_eq!(answered.status(), 200);
    assert_eq!(answered.json::<Value>().await.unwrap()["events"], json!([]));
    // The stream ends with the notice.
    let notice = sse.next().await;
    assert_eq!(notice.event.as_deref(), Some("system.token_expired"));
    assert_eq!(serde_json::from_str::<Value>(&notice.data).unwrap(), json!({"last_event_id": first}));
    assert!(sse.next_or_end().await.is_none(), "and nothing after it");
    for device in [&mut renewed, &mut lapsed] {
        let told = device.notification().await;
        assert_eq!((told["method"].as_str(), told["params"]["last_seq"].as_i64()), (Some("stream.token_expired"), Some(first)), "{told}");
    }
    assert_eq!(app.http.get(app.url("/v1/me")).bearer_auth(&alice).send().await.unwrap().status(), 401);
    // Published after the expiry: only a fresh token receives it.
    let second = publish(2).await;
    let other = renewed.call("stream.reauth", json!({"token": token("mallory", json!({"subscribe": ["**"]}))})).await;
    assert_eq!(other["error"]["data"]["code"], "reauth_other_identity", "{other}");
    let fresh = renewed.call("stream.reauth", json!({"token": token("alice", json!({"subscribe": ["probe.*"]}))})).await;
    assert!(fresh["result"]["expires_at"].is_i64(), "{fresh}");
    let event = renewed.notification().await;
    assert_eq!((event["method"].as_str(), event["params"]["seq"].as_i64()), (Some("stream.event"), Some(second)), "{event}");
    let error = lapsed.notification().await;
    assert_eq!(error["error"]["data"]["code"], "token_expired", "{error}");
    assert_eq!(lapsed.closed().await, (1000, "token_expired".to_owned()));
    // The SSE client resumes with a fresh token, losing nothing.
    let r = app
        .http
        .get(app.url("/v1/stream?types=probe.*"))
        .bearer_auth(token("alice", json!({"subscribe": ["probe.*"]})))
        .header("last-event-id", first.to_string())
        .send()
        .await
        .unwrap();
    let mut resumed = crate::helpers::Stream::from_response(r);
    assert_eq!(resumed.next().await.id.as_deref(), Some(second.to_string().as_str()));
}

/// Item 6: every stage of a connection has a deadline
/// (`TIDINGS_HEADER_TIMEOUT`): a TLS handshake followed by nothing (with
/// HTTP/2 or HTTP/1.1 negotiated, or nothing), an HTTP/2 preface alone, a
/// preface with half a HEADERS frame; and an HTTP/2 connection with a live
/// stream stays past it.
async fn connections_that_say_nothing_are_closed(backend: Backend) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let timeout = std::time::Duration::from_secs(1);
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = crate::tls::certificate(certs.path());
    let tls = spawn_app_with(backend, |s| {
        s.http.header_timeout = timeout;
        s.http.tls_cert_file = Some(cert.into());
        s.http.tls_key_file = Some(key.into());
    })
    .await;
    let address = tls.base.trim_start_matches("http://").to_owned();
    for alpn in [None, Some("h2"), Some("http/1.1")] {
        let mut command = tokio::process::Command::new("openssl");
        command.args(["s_client", "-quiet", "-connect", &address]);
        if let Some(alpn) = alpn {
            command.args(["-alpn", alpn]);
        }
        let started = std::time::Instant::now();
        let mut client = command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(20), client.wait()).await;
        assert!(ended.is_ok(), "a silent TLS connection ({alpn:?}) was not closed");
        let mut stderr = String::new();
        client.stderr.take().unwrap().read_to_string(&mut stderr).await.unwrap();
        assert!(started.elapsed() >= timeout - std::time::Duration::from_millis(100), "closed by the deadline, not at once: {stderr}");
    }
    // h2c on the plain port: a preface alone, and a preface with an
    // unfinished HEADERS frame.
    let plain = spawn_app_with(backend, |s| {
        s.http.header_timeout = timeout;
        s.streams.heartbeat = std::time::Duration::from_millis(200);
    })
    .await;
    let address = plain.base.trim_start_matches("http://").to_owned();
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let settings = [0u8, 0, 0, 4, 0, 0, 0, 0, 0];
    let half_headers = [0u8, 0, 100, 1, 4, 0, 0, 0, 1, 0x82, 0x86, 0x84];
    for opening in [PREFACE.to_vec(), [PREFACE, &settings[..], &half_headers[..]].concat()] {
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        socket.write_all(&opening).await.unwrap();
        let started = std::time::Instant::now();
        let mut sink = Vec::new();
        let ended = tokio::time::timeout(std::time::Duration::from_secs(20), socket.read_to_end(&mut sink)).await;
        assert!(ended.is_ok(), "a silent h2c connection ({} bytes sent) was not closed", opening.len());
        assert!(started.elapsed() >= timeout - std::time::Duration::from_millis(100), "closed by the deadline, not at once");
    }
    // A live stream holds its HTTP/2 connection past the deadline: six
    // heartbeats (1.2 s), then an event, on the same stream.
    let h2c = reqwest::Client::builder().http2_prior_knowledge().build().unwrap();
    let mut r = h2c.get(plain.url("/v1/stream?types=probe.*")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.version()), (200, reqwest::Version::HTTP_2));
    let mut beats = 0;
    while beats < 6 {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), r.chunk()).await.expect("a heartbeat").unwrap().expect("open");
        beats += chunk.windows(3).filter(|w| w == b":\n\n").count();
    }
    let id = plain.publish("probe.late", json!({})).await;
    let mut seen = String::new();
    while !seen.contains(&format!("id: {id}")) {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), r.chunk()).await.expect("the event").unwrap().expect("open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
}

/// Item 6, the HTTP/2 flow-control side: a client that reads its socket
/// but never grants a stream window, over a replay of large events (no
/// live queue, so no eviction, and the socket takes every byte it is
/// sent, so no write deadline), is closed once the stream's chunk has
/// waited longer than the write deadline; the stream's place is free
/// again.
async fn http2_streams_that_grant_no_window_are_closed(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.streams.max_streams = 1;
        // A 4 s write deadline: room for the checks below on a busy machine.
        s.streams.slow_client_timeout = std::time::Duration::from_secs(3);
        s.streams.eviction_grace = std::time::Duration::from_secs(1);
    })
    .await;
    let big = "x".repeat(8 * 1024);
    for n in 0..20 {
        app.publish("probe.big", json!({"n": n, "pad": big})).await;
    }
    let socket = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://")).await.unwrap();
    // A 1 KiB window for the stream and the connection, never released.
    let (mut client, connection) = h2::client::Builder::new()
        .initial_window_size(1024)
        .initial_connection_window_size(1024)
        .handshake::<_, bytes::Bytes>(socket)
        .await
        .unwrap();
    let closed = tokio::spawn(connection);
    let request = axum::http::Request::get(app.url("/v1/stream?types=probe.*&since=0")).body(()).unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let response = tokio::time::timeout(std::time::Duration::from_secs(10), response).await.expect("the head").unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), body.data()).await.expect("the first bytes");
    assert!(first.is_some_and(|d| d.is_ok()), "the stream starts");
    // Its one place is taken while the stream lives.
    assert_eq!(app.http.get(app.url("/v1/stream?types=probe.*")).send().await.unwrap().status(), 503);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(20), closed).await;
    assert!(ended.is_ok(), "a stream that is granted no window held its connection");
    crate::helpers::eventually("the stream's place is free again", || async {
        app.http.get(app.url("/v1/stream?types=probe.*")).send().await.unwrap().status() == 200
    })
    .await;
    let metrics = app.http.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.lines().any(|l| l.starts_with("tidings_clients_dropped_total{") && l.contains("reason=\"write_stalled\"")),
        "counted as a stalled write"
    );
}

/// Item 9: one subscriber identity keeps at most
/// `TIDINGS_MAX_SUBSCRIPTIONS_PER_IDENTITY` subscriptions (`429`, nothing
/// stored); a renewal of its own still passes, and another identity is
/// served.
async fn one_subscriber_cannot_take_every_subscription(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.federation.max_subscriptions_per_identity = 2).await;
    let server = server_hash(&app).await;
    let subscribe = |who: &Peer, pattern: &'static str| {
        let mut included = Map::new();
        let inbox = "system/inbox/mine";
        let token = who.grant(&server, inbox_grant(inbox), None, &mut included);
        let params = json!({"deliver_to": {"uri": inbox}, "deliver_token": token});
        let envelope = Subscribe { author: who, pattern, params, capability: None, included }.envelope("subscribe");
        let request = app.http.post(app.url("/v1/execute")).json(&envelope);
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (greedy, other) = (Peer::new(), Peer::new());
    for pattern in ["a/**", "b/**"] {
        assert_eq!(subscribe(&greedy, pattern).await.0, 200);
    }
    let (status, body) = subscribe(&greedy, "c/**").await;
    assert_eq!((status, body["error"]["code"].as_str()), (429, Some("too_many_subscriptions_for_identity")), "{body}");
    assert_eq!(app.store.tree_entries_below("system/subscription", 100).await.unwrap().len(), 2, "the refusal stored nothing");
    let (status, body) = subscribe(&greedy, "a/**").await;
    assert_eq!((status, body["result"]["renewed"].as_bool()), (200, Some(true)), "a renewal passes: {body}");
    assert_eq!(subscribe(&other, "c/**").await.0, 200, "another identity has its own room");

    // A capability's holder who delegates it to fresh keys buys no more
    // room: every subscription under it counts against the identity the
    // server granted it to.
    let holder = Peer::new();
    let (status, minted) = {
        let grants = json!([{"handler": "system/subscription", "operations": ["subscribe"], "resources": ["**"]}]);
        let r =
            app.http.post(app.url("/v1/admin/capabilities")).json(&json!({"grantee": holder.hash, "grants": grants})).send().await.unwrap();
        (r.status().as_u16(), r.json::<Value>().await.unwrap())
    };
    assert_eq!(status, 200, "{minted}");
    let delegated = |delegate: &Peer, pattern: &'static str| {
        let mut included = minted["included"].as_object().unwrap().clone();
        let grants = json!([{"handler": "system/subscription", "operations": ["subscribe"], "resources": ["**"]}]);
        let capability = holder.grant(&delegate.hash, grants, Some(minted["hash"].as_str().unwrap()), &mut included);
        let inbox = "system/inbox/delegated";
        let token = delegate.grant(&server, inbox_grant(inbox), None, &mut included);
        let params = json!({"deliver_to": {"uri": inbox}, "deliver_token": token});
        let envelope = Subscribe { author: delegate, pattern, params, capability: Some(capability), included }.envelope("subscribe");
        let request = app.http.post(app.url("/v1/execute")).json(&envelope);
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let stored = app.store.tree_entries_below("system/subscription", 100).await.unwrap().len();
    let (first, second, third) = (Peer::new(), Peer::new(), Peer::new());
    for (delegate, pattern) in [(&first, "d/**"), (&second, "e/**")] {
        let (status, body) = delegated(delegate, pattern).await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, body) = delegated(&third, "f/**").await;
    assert_eq!((status, body["error"]["code"].as_str()), (429, Some("too_many_subscriptions_for_identity")), "{body}");
    assert_eq!(app.store.tree_entries_below("system/subscription", 100).await.unwrap().len(), stored + 2, "the refusal stored nothing");
}

/// Item 5: a rule within every limit that would build 30 MB per event (500
/// copies of a 60 KB field) stops at `TIDINGS_RULE_BUDGET`: that event does
/// not match it (counted), its stream goes on, and another client receives
/// everything.
async fn one_clients_rule_cannot_spend_without_bound(backend: Backend) {
    let app = spawn_app(backend).await;
    let heavy = json!({"or": [{"==": [{"var": "n"}, 2]}, {"==": [{"cat": vec![json!({"var": "s"}); 500]}, "never"]}]});
    let filter = json!({"types": ["probe.*"], "payload": heavy}).to_string();
    let query: String = form_urlencoded::Serializer::new(String::new()).append_pair("filter", &filter).finish();
    let mut taxing = app.stream(&format!("?{query}"), None).await;
    let mut plain = app.stream("?types=probe.*", None).await;
    let big = app.publish("probe.big", json!({"n": 1, "s": "x".repeat(60_000)})).await;
    let marker = app.publish("probe.marker", json!({"n": 2, "s": "small"})).await;
    assert_eq!(plain.ids(2).await, vec![big, marker], "another client receives everything");
    assert_eq!(taxing.ids(1).await, vec![marker], "the event over the budget did not match; the stream goes on");
    assert!(app.metric("tidings_filter_budget_exceeded_total").await >= 1.0);
    // The client is told, once.
    let notice = taxing.next().await;
    assert_eq!(notice.event.as_deref(), Some("system.filter_budget_exceeded"), "{notice:?}");
    assert_eq!(serde_json::from_str::<Value>(&notice.data).unwrap(), json!({"budget": 1 << 20}));
    app.publish("probe.big", json!({"n": 1, "s": "x".repeat(60_000)})).await;
    let again = app.publish("probe.marker", json!({"n": 2})).await;
    let next = taxing.next().await;
    assert_eq!((next.event, next.id), (None, Some(again.to_string())), "told once, not at every event");
}

/// Item 8: one identity keeps at most `TIDINGS_MAX_CONSUMERS_PER_IDENTITY`
/// durable consumers: one more is `429 too_many_consumers` and stores
/// nothing; its existing ones still poll, and another identity has its own
/// room (and its own namespace: the same id is another consumer).
async fn one_identity_cannot_create_consumers_without_bound(backend: Backend) {
    use crate::helpers::tokens::{SECRET, token};
    let app = spawn_app_with(backend, |s| {
        s.auth.jwt_hs256_secret = Some(SECRET.into());
        s.poll.max_consumers_per_identity = 3;
    })
    .await;
    let (greedy, other) = (token("greedy", json!({"subscribe": ["**"]})), token("other", json!({"subscribe": ["**"]})));
    let poll = |bearer: &str, id: &str| {
        let request = app.http.get(app.url(&format!("/v1/poll?consumer_id={id}"))).bearer_auth(bearer);
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    for id in ["c1", "c2", "c3"] {
        assert_eq!(poll(&greedy, id).await.0, 200);
    }
    let (status, body) = poll(&greedy, "c4").await;
    assert_eq!((status, body["error"].as_str()), (429, Some("too_many_consumers")), "{body}");
    let list: Value = app.http.get(app.url("/v1/consumers")).bearer_auth(&greedy).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["consumers"].as_array().unwrap().len(), 3, "the refusal stored nothing: {list}");
    assert_eq!(poll(&greedy, "c1").await.0, 200, "an existing consumer still polls");
    for id in ["c1", "c4"] {
        assert_eq!(poll(&other, id).await.0, 200, "another identity has its own room and namespace");
    }
}

/// Item 11: a client that sends its whole oversized body before reading
/// (as Python's `http.client` does) reads the `413`, and a WebSocket
/// client that sent a frame over `TIDINGS_WS_MAX_MESSAGE` reads the 1009
/// close: the server discards what comes after its refusal (bounded)
/// instead of resetting the connection under the answer.
async fn a_refusal_sent_before_the_body_is_read_arrives(backend: Backend) {
    use futures_util::{SinkExt as _, StreamExt as _};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = spawn_app(backend).await;
    let address = app.base.trim_start_matches("http://").to_owned();
    let body = vec![b' '; 1_500_000];
    for attempt in 0..8 {
        let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
        let head = format!(
            "POST /v1/events HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(&body).await.unwrap_or_else(|e| panic!("attempt {attempt}: the body could not be sent: {e}"));
        let mut answer = Vec::new();
        let read =
            tokio::time::timeout(std::time::Duration::from_secs(20), socket.read_to_end(&mut answer)).await.expect("the answer in time");
        read.unwrap_or_else(|e| panic!("attempt {attempt}: reading the answer failed: {e}"));
        assert!(answer.starts_with(b"HTTP/1.1 413"), "attempt {attempt}: {}", String::from_utf8_lossy(&answer));
    }
    for attempt in 0..4 {
        let url = format!("{}/v1/ws", app.base.replace("http://", "ws://"));
        let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
        ws.send(tokio_tungstenite::tungstenite::Message::text("x".repeat(1_000_000))).await.unwrap();
        let code = loop {
            let next = tokio::time::timeout(std::time::Duration::from_secs(20), ws.next()).await.expect("a frame in time");
            match next {
                Some(Ok(tokio_tungstenite::tungstenite::Message::Close(Some(frame)))) => break u16::from(frame.code),
                Some(Ok(_)) => continue,
                other => panic!("attempt {attempt}: no close frame: {other:?}"),
            }
        };
        assert_eq!(code, 1009, "attempt {attempt}");
    }
}
