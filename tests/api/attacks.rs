//! Attacks on the surfaces a browser, a subscriber or a peer can reach, each
//! tried against a real server on loopback as an attacker would, with the
//! headers a browser sends, and a real listener of the attacker's standing
//! by to see whether the server calls out. Every refusal is checked to
//! store nothing and call nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Map, Value, json};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with};
use crate::subscriptions::{Peer, Subscribe, inbox_grant, server_hash};

both_stores!(
    a_cross_origin_page_cannot_make_the_server_send_its_tree_away,
    a_refused_subscribe_calls_nothing_and_stores_nothing,
    the_server_calls_only_hosts_the_admin_allowed,
    notifications_reach_only_their_subscriber_and_admins,
    long_polls_and_silent_websockets_hold_bounded_places,
    peers_and_mirrors_show_only_to_admins,
    an_expired_token_ends_what_it_opened,
    connections_that_say_nothing_are_closed,
    http2_streams_that_grant_no_window_are_closed,
    a_page_over_plain_http_is_not_the_tls_servers_origin,
    one_subscriber_cannot_take_every_subscription,
    one_clients_rule_cannot_spend_without_bound,
    one_identity_cannot_create_consumers_without_bound,
    a_refusal_sent_before_the_body_is_read_arrives,
    a_cookie_authenticates_only_streams,
    a_reauth_applies_the_new_tokens_grants_at_once,
);

/// A listener of the attacker's: answers `GET /v1/identity` as `hash` (so
/// the endpoint would prove) and takes deliveries; counts every request.
struct Listener {
    base: String,
    requests: Arc<AtomicUsize>,
}

impl Listener {
    async fn start(hash: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let (seen, identity) = (requests.clone(), json!({"hash": hash}));
        let app = axum::Router::new().fallback(move || {
            seen.fetch_add(1, Ordering::SeqCst);
            let identity = identity.clone();
            async move { axum::Json(identity) }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base, requests }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// The subscribe an attacker sends: everything (`**`), entities bundled,
/// delivered to its own inbox at `relay` (which proves it).
fn exfiltrating_subscribe(
    attacker: &Peer,
    server: &str,
    relay: &str,
    capability: Option<String>,
    mut included: Map<String, Value>,
) -> Value {
    let inbox = "system/inbox/loot";
    let token = attacker.grant(server, inbox_grant(inbox), None, &mut included);
    let params = json!({
        "deliver_to": {"uri": format!("entity://{}/{inbox}", attacker.hash)},
        "deliver_token": token,
        "include_payload": true,
        "relay_endpoint": relay,
    });
    Subscribe { author: attacker, pattern: "**", params, capability, included }.envelope("subscribe")
}

/// Nothing of the attacker's is stored: no peer, no subscription.
async fn stored_nothing(app: &TestApp, attacker: &Peer) {
    let peer = app.http.get(app.url(&format!("/v1/tree/system/peer/{}", attacker.hash))).send().await.unwrap();
    assert_eq!(peer.status(), 404, "no peer entity was written for the attacker");
    let subscriptions = app.store.tree_entries_below("system/subscription", 100).await.unwrap();
    assert!(subscriptions.is_empty(), "no subscription was stored: {:?}", subscriptions.iter().map(|e| &e.path).collect::<Vec<_>>());
}

/// Item 1: a page on another origin posts the subscribe as a "simple"
/// request (`text/plain`, no preflight), as JSON, and through a name
/// re-bound to 127.0.0.1; each is refused before anything runs.
async fn a_cross_origin_page_cannot_make_the_server_send_its_tree_away(backend: Backend) {
    let app = spawn_app(backend).await;
    let attacker = Peer::new();
    let listener = Listener::start(&attacker.hash).await;
    let envelope = exfiltrating_subscribe(&attacker, &server_hash(&app).await, &listener.base, None, Map::new());
    let body = serde_json::to_string(&envelope).unwrap();
    let post = |content_type: &'static str, origin: Option<&'static str>, host: Option<&'static str>| {
        let mut request = app.http.post(app.url("/v1/execute")).header("content-type", content_type).body(body.clone());
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        if let Some(host) = host {
            request = request.header("host", host);
        }
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null)["error"].as_str().unwrap_or("").to_owned())
        }
    };
    let refused = [
        (post("text/plain", Some("https://evil.example"), None).await, (403, "origin_refused")),
        (post("application/json", Some("https://evil.example"), None).await, (403, "origin_refused")),
        (post("application/json", Some("null"), None).await, (403, "origin_refused")),
        (post("text/plain;charset=UTF-8", None, None).await, (415, "unsupported_media_type")),
        (post("application/x-www-form-urlencoded", None, None).await, (415, "unsupported_media_type")),
        (post("application/json", None, Some("evil.example:8080")).await, (403, "host_refused")),
    ];
    for ((status, code), expected) in refused {
        assert_eq!((status, code.as_str()), expected);
    }
    // A tree write meanwhile: nothing may carry it to the attacker.
    let put = app.http.put(app.url("/v1/tree/notes/private")).json(&json!({"type": "note", "data": {"api_key": "k"}})).send().await;
    assert_eq!(put.unwrap().status(), 201);
    stored_nothing(&app, &attacker).await;
    assert_eq!(listener.requests(), 0, "the server called the attacker's listener");
    // The server's own page (same origin) is served as before.
    let own = app.base.trim_start_matches("http://").to_owned();
    let r = app.http.get(app.url("/v1/me")).header("origin", format!("http://{own}")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

/// Item 1: a subscribe refused after the point where the server used to
/// prove the relay's endpoint (`payload_unauthorized`: the caller's
/// capability grants subscribe, not tree reads) makes no call and writes
/// no peer.
async fn a_refused_subscribe_calls_nothing_and_stores_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let attacker = Peer::new();
    let listener = Listener::start(&attacker.hash).await;
    let mut included = Map::new();
    let grants = json!([{"handler": "system/subscription", "operations": ["subscribe"], "resources": ["**"]}]);
    let r =
        app.http.post(app.url("/v1/admin/capabilities")).json(&json!({"grantee": attacker.hash, "grants": grants})).send().await.unwrap();
    let minted: Value = r.json().await.unwrap();
    included.extend(minted["included"].as_object().unwrap().clone());
    let capability = minted["hash"].as_str().unwrap().to_owned();
    let envelope = exfiltrating_subscribe(&attacker, &server_hash(&app).await, &listener.base, Some(capability), included);
    let r = app.http.post(app.url("/v1/execute")).json(&envelope).send().await.unwrap();
    let (status, body) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("payload_unauthorized")), "{body}");
    stored_nothing(&app, &attacker).await;
    assert_eq!(listener.requests(), 0, "a refused subscribe called the relay endpoint");
}

/// Item 1: `TIDINGS_PEER_ALLOW` bounds every call out. With 10/8 allowed,
/// a relay endpoint on loopback (or the metadata address) is refused
/// without a call; with loopback allowed (the default) the same request is
/// accepted and the endpoint proven by one call.
async fn the_server_calls_only_hosts_the_admin_allowed(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.peer_allow = tidings_server::peer::PeerAllow::parse("10.0.0.0/8").unwrap()).await;
    let attacker = Peer::new();
    let listener = Listener::start(&attacker.hash).await;
    let server = server_hash(&app).await;
    let via_localhost = listener.base.replace("127.0.0.1", "localhost");
    for relay in [listener.base.as_str(), via_localhost.as_str(), "http://169.254.169.254", "http://[::ffff:127.0.0.1]:9"] {
        let envelope = exfiltrating_subscribe(&attacker, &server, relay, None, Map::new());
        let r = app.http.post(app.url("/v1/execute")).json(&envelope).send().await.unwrap();
        let (status, body) = (r.status().as_u16(), r.json::<Value>().await.unwrap());
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("unknown_peer")), "{relay}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("TIDINGS_PEER_ALLOW"), "{relay}: {body}");
    }
    stored_nothing(&app, &attacker).await;
    assert_eq!(listener.requests(), 0, "a host outside TIDINGS_PEER_ALLOW was called");
    // The default (loopback) allows it: one call, the proof.
    let open = spawn_app(backend).await;
    let envelope = exfiltrating_subscribe(&attacker, &server_hash(&open).await, &listener.base, None, Map::new());
    let r = open.http.post(open.url("/v1/execute")).json(&envelope).send().await.unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert!(listener.requests() >= 1, "the endpoint was proven");
}

/// Item 4: a token that may receive `subscription.notification` but may
/// not read the tree sees no other subscriber's notification (which
/// bundles the entity the tree refuses it); the subscriber's own identity
/// and an admin see it, over a poll, a replaying stream and a live one.
async fn notifications_reach_only_their_subscriber_and_admins(backend: Backend) {
    use crate::security::{SECRET, token};
    let app = spawn_app_with(backend, |s| s.jwt_hs256_secret = Some(SECRET.into())).await;
    let admin = token("ops", json!({"admin": true, "publish": ["**"], "subscribe": ["**"], "visibility": "admin"}));
    let subscriber = Peer::new();
    let nosy = token("mallory", json!({"subscribe": ["subscription.notification"]}));
    let own = token(&subscriber.hash, json!({"subscribe": ["subscription.notification"]}));
    // The subscriber subscribes docs/** with entities bundled, under a
    // capability an admin minted for it (subscribe and tree reads).
    let grants = json!([
        {"handler": "system/subscription", "operations": ["subscribe"], "resources": ["docs/**"]},
        {"handler": "system/tree", "operations": ["get"], "resources": ["docs/**"]},
    ]);
    let minted: Value = app
        .http
        .post(app.url("/v1/admin/capabilities"))
        .bearer_auth(&admin)
        .json(&json!({"grantee": subscriber.hash, "grants": grants}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut included = minted["included"].as_object().unwrap().clone();
    let inbox = "system/inbox/private";
    let deliver = subscriber.grant(&server_hash(&app).await, inbox_grant(inbox), None, &mut included);
    let params = json!({"deliver_to": {"uri": inbox}, "deliver_token": deliver, "include_payload": true});
    let capability = Some(minted["hash"].as_str().unwrap().to_owned());
    let envelope = Subscribe { author: &subscriber, pattern: "docs/**", params, capability, included }.envelope("subscribe");
    let r = app.http.post(app.url("/v1/execute")).bearer_auth(&admin).json(&envelope).send().await.unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    // A live stream of another identity, open before the write.
    let everything = token("mallory", json!({"subscribe": ["subscription.notification", "probe.done"]}));
    let open = |query: &'static str| {
        let request = app.http.get(app.url(&format!("/v1/stream{query}"))).bearer_auth(&everything);
        async move {
            let r = request.send().await.unwrap();
            assert_eq!(r.status(), 200);
            crate::helpers::Stream::from_response(r)
        }
    };
    let mut live = open("?types=subscription.notification,probe.done").await;
    let put = app.http.put(app.url("/v1/tree/docs/secret")).bearer_auth(&admin).json(&json!({"type": "note", "data": {"salary": 123456}}));
    assert_eq!(put.send().await.unwrap().status(), 201);
    // The tree refuses the nosy token the entity...
    let r = app.http.get(app.url("/v1/tree/docs/secret")).bearer_auth(&nosy).send().await.unwrap();
    assert_eq!(r.status(), 403);
    // ...and the subscriber's poll (waiting for it) gets it, bundled.
    let poll = |bearer: &str, wait: u32| {
        let request =
            app.http.get(app.url(&format!("/v1/poll?types=subscription.notification&since=0&wait_ms={wait}"))).bearer_auth(bearer);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let mine = poll(&own, 10_000).await;
    let events = mine["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{mine}");
    assert!(events[0].to_string().contains("123456"), "the subscriber gets the bundled entity: {mine}");
    let seen = poll(&admin, 0).await;
    assert_eq!(seen["events"].as_array().unwrap().len(), 1, "an admin sees it: {seen}");
    let theirs = poll(&nosy, 0).await;
    assert_eq!(theirs["events"].as_array().unwrap().len(), 0, "another token holder sees nothing: {theirs}");
    assert_eq!(theirs["next_since"], mine["next_since"], "and is moved past it");
    // A replaying stream and the live one of that identity skip it: the
    // first thing either gets is a probe published after it.
    let marker = token("pub", json!({"publish": ["probe.done"]}));
    let r =
        app.http.post(app.url("/v1/events")).bearer_auth(&marker).json(&json!({"event_type": "probe.done", "payload": {}})).send().await;
    assert_eq!(r.unwrap().status(), 201);
    let mut replay = open("?types=subscription.notification,probe.done&since=0").await;
    for (name, stream) in [("replaying", &mut replay), ("live", &mut live)] {
        let first = stream.next().await;
        assert!(first.data.contains("probe.done"), "the {name} stream of another identity got the notification: {}", first.data);
    }
}

/// Item 7: a waiting long-poll holds a place in `TIDINGS_MAX_STREAMS` (the
/// next one, and an SSE stream, get `503 too_many_streams`), and gives it
/// back when it answers; a WebSocket that never sends `stream.auth` is
/// closed after `TIDINGS_WS_AUTH_TIMEOUT` (an `auth_timeout` error frame,
/// then 1008), giving its place back.
async fn long_polls_and_silent_websockets_hold_bounded_places(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.max_streams = 2;
        s.ws_auth_timeout = std::time::Duration::from_secs(1);
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
        silent.push(crate::ws::Client::connect(&app).await);
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

/// Item 10: `/health/deep` shows peers (endpoints learned from requests
/// among them) and mirrors to admins only.
async fn peers_and_mirrors_show_only_to_admins(backend: Backend) {
    use crate::security::{SECRET, token};
    let peer = Peer::new();
    let app = spawn_app_with(backend, |s| {
        s.jwt_hs256_secret = Some(SECRET.into());
        s.peers = tidings_server::config::Peers(vec![tidings_server::peer::Peer {
            hash: peer.hash.clone(),
            endpoint: "http://127.0.0.1:9".into(),
        }]);
    })
    .await;
    let admin = token("ops", json!({"admin": true}));
    let seen = app.deep_as(Some(admin)).await;
    assert!(seen["peers"].to_string().contains("127.0.0.1:9"), "an admin sees the peers: {seen}");
    for caller in [None, Some(token("someone", json!({"subscribe": ["**"]}))), Some("not-a-token".to_owned())] {
        let shown = app.deep_as(caller).await;
        assert_eq!(shown["status"], "ok");
        assert!(shown["peers"].is_null() && shown["mirrors"].is_null(), "{shown}");
        assert!(!shown.to_string().contains("127.0.0.1:9"), "{shown}");
    }
}

/// Item 3: a token's life bounds what it opened. At its expiry (with the
/// 5 s leeway) an SSE stream ends with `system.token_expired`, a waiting
/// long-poll answers, a WebSocket stops live delivery and is told; a fresh
/// token for the same `sub` resumes the WebSocket from where it stopped,
/// and one that does not come in time closes it. Nothing published after
/// the expiry reaches anything opened under the old token.
async fn an_expired_token_ends_what_it_opened(backend: Backend) {
    use crate::security::{SECRET, token};
    let app = spawn_app_with(backend, |s| {
        s.jwt_hs256_secret = Some(SECRET.into());
        s.reauth_grace = std::time::Duration::from_secs(1);
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
    let key = crate::ws::Key::new();
    let query = format!("?access_token={alice}");
    let mut renewed = crate::ws::Client::connect_with(&app, &query).await;
    assert!(renewed.auth(&key, json!({"device_id": "renewed"})).await["result"].is_object());
    let mut lapsed = crate::ws::Client::connect_with(&app, &query).await;
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
        s.header_timeout = timeout;
        s.tls_cert_file = Some(cert.into());
        s.tls_key_file = Some(key.into());
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
        s.header_timeout = timeout;
        s.heartbeat = std::time::Duration::from_millis(200);
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
        s.max_streams = 1;
        // A 4 s write deadline: room for the checks below on a busy machine.
        s.slow_client_timeout = std::time::Duration::from_secs(3);
        s.eviction_grace = std::time::Duration::from_secs(1);
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

/// Item 1, the scheme: on this server's TLS port, a page served over plain
/// `http` from the same name and port is another origin (whoever can alter
/// plain traffic could script it) and is refused; `https` is the server's
/// own. On a plain port, an `https` origin of the same name passes (TLS may
/// end at a proxy in front).
async fn a_page_over_plain_http_is_not_the_tls_servers_origin(backend: Backend) {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = crate::tls::certificate(certs.path());
    let pem = std::fs::read(&cert).unwrap();
    let tls = spawn_app_with(backend, |s| {
        s.tls_cert_file = Some(cert.clone().into());
        s.tls_key_file = Some(key.into());
    })
    .await;
    let https = reqwest::Client::builder().add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap()).build().unwrap();
    let authority = tls.base.trim_start_matches("http://").to_owned();
    let publish = |client: &reqwest::Client, base: String, origin: String| {
        let request =
            client.post(format!("{base}/v1/events")).header("origin", origin).json(&json!({"event_type": "probe.origin", "payload": {}}));
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap()["error"].as_str().map(str::to_owned))
        }
    };
    let base = format!("https://{authority}");
    assert_eq!(publish(&https, base.clone(), format!("http://{authority}")).await, (403, Some("origin_refused".to_owned())));
    assert_eq!(tls_events(&https, &base).await, 0, "a refusal stores nothing");
    assert_eq!(publish(&https, base.clone(), format!("https://{authority}")).await.0, 201);
    let plain = spawn_app(backend).await;
    let authority = plain.base.trim_start_matches("http://").to_owned();
    assert_eq!(publish(&plain.http, plain.base.clone(), format!("https://{authority}")).await.0, 201);
    assert_eq!(publish(&plain.http, plain.base.clone(), format!("http://{authority}")).await.0, 201);
}

/// How many `probe.origin` events the server at `base` holds.
async fn tls_events(http: &reqwest::Client, base: &str) -> usize {
    let page: Value = http.get(format!("{base}/v1/poll?types=probe.origin&since=0")).send().await.unwrap().json().await.unwrap();
    page["events"].as_array().unwrap().len()
}

/// Item 9: one subscriber identity keeps at most
/// `TIDINGS_MAX_SUBSCRIPTIONS_PER_IDENTITY` subscriptions (`429`, nothing
/// stored); a renewal of its own still passes, and another identity is
/// served.
async fn one_subscriber_cannot_take_every_subscription(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.max_subscriptions_per_identity = 2).await;
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
    use crate::security::{SECRET, token};
    let app = spawn_app_with(backend, |s| {
        s.jwt_hs256_secret = Some(SECRET.into());
        s.max_consumers_per_identity = 3;
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

/// The `access_token` cookie goes with every request another site makes a
/// browser send (a link, an image: no `Origin` on such a GET), so it
/// authenticates only `EventSource` and WebSocket requests: a cross-site
/// `GET /v1/poll?consumer_id=…&since=…` cannot move a consumer's cursor.
async fn a_cookie_authenticates_only_streams(backend: Backend) {
    use crate::security::{SECRET, token};
    let app = spawn_app_with(backend, |s| s.jwt_hs256_secret = Some(SECRET.into())).await;
    let alice = token("alice", json!({"subscribe": ["**"], "publish": ["**"]}));
    let r = app.http.get(app.url("/v1/poll?consumer_id=nightly")).bearer_auth(&alice).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let cookie = format!("access_token={alice}");
    let r = app.http.get(app.url("/v1/poll?consumer_id=nightly&since=1000000")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(r.status(), 401, "a cookie does not authenticate a poll");
    let list: Value = app.http.get(app.url("/v1/consumers")).bearer_auth(&alice).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["consumers"][0]["cursor"], 0, "the cursor did not move: {list}");
    let r = app.http.get(app.url("/v1/stream")).header("cookie", &cookie).send().await.unwrap();
    assert_eq!(r.status(), 200, "an EventSource still authenticates by cookie");
}

/// A `stream.reauth` before the expiry replaces the live session: the new
/// token's grants apply to the next event (a narrower token stops what the
/// old one allowed).
async fn a_reauth_applies_the_new_tokens_grants_at_once(backend: Backend) {
    use crate::security::{SECRET, token};
    let app = spawn_app_with(backend, |s| s.jwt_hs256_secret = Some(SECRET.into())).await;
    let wide = token("dev", json!({"subscribe": ["**"]}));
    let key = crate::ws::Key::new();
    let mut device = crate::ws::Client::connect_with(&app, &format!("?access_token={wide}")).await;
    assert!(device.auth(&key, json!({"device_id": "d"})).await["result"].is_object());
    let narrow = token("dev", json!({"subscribe": ["other.*"]}));
    assert!(device.call("stream.reauth", json!({"token": narrow})).await["result"].is_object());
    let publisher = token("pub", json!({"publish": ["**"]}));
    for event_type in ["probe.hidden", "other.shown"] {
        let r = app.http.post(app.url("/v1/events")).bearer_auth(&publisher).json(&json!({"event_type": event_type})).send().await.unwrap();
        assert_eq!(r.status(), 201);
    }
    let first = device.notification().await;
    assert_eq!(first["params"]["event"]["event_type"], "other.shown", "the old token's grants no longer apply: {first}");
}
