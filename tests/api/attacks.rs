//! Attacks on the surfaces a browser, a subscriber or a peer can reach, each
//! tried against a real server on loopback as an attacker would, with the
//! headers a browser sends, and a real listener of the attacker's standing
//! by to see whether the server calls out. Every refusal is checked to
//! store nothing and call nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Map, Value, json};

use crate::both_stores;
use crate::helpers::federation::{Peer, Subscribe, inbox_grant, server_hash};
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with};

both_stores!(
    a_cross_origin_page_cannot_make_the_server_send_its_tree_away,
    a_refused_subscribe_calls_nothing_and_stores_nothing,
    the_server_calls_only_hosts_the_admin_allowed,
    notifications_reach_only_their_subscriber_and_admins,
    peers_and_mirrors_show_only_to_admins,
    a_page_over_plain_http_is_not_the_tls_servers_origin,
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
    let app = spawn_app_with(backend, |s| s.federation.peer_allow = tidings_outbound::PeerAllow::parse("10.0.0.0/8").unwrap()).await;
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
    use crate::helpers::tokens::{SECRET, token};
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(SECRET.into())).await;
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

/// Item 10: `/health/deep` shows peers (endpoints learned from requests
/// among them) and mirrors to admins only.
async fn peers_and_mirrors_show_only_to_admins(backend: Backend) {
    use crate::helpers::tokens::{SECRET, token};
    let peer = Peer::new();
    let app = spawn_app_with(backend, |s| {
        s.auth.jwt_hs256_secret = Some(SECRET.into());
        s.federation.peers = tidings_server::config::Peers(vec![tidings_protocol::peer::Peer {
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
        s.http.tls_cert_file = Some(cert.clone().into());
        s.http.tls_key_file = Some(key.into());
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

/// The `access_token` cookie goes with every request another site makes a
/// browser send (a link, an image: no `Origin` on such a GET), so it
/// authenticates only `EventSource` and WebSocket requests: a cross-site
/// `GET /v1/poll?consumer_id=…&since=…` cannot move a consumer's cursor.
async fn a_cookie_authenticates_only_streams(backend: Backend) {
    use crate::helpers::tokens::{SECRET, token};
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(SECRET.into())).await;
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
    use crate::helpers::tokens::{SECRET, token};
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(SECRET.into())).await;
    let wide = token("dev", json!({"subscribe": ["**"]}));
    let key = crate::helpers::device::Key::new();
    let mut device = crate::helpers::device::Client::connect_with(&app, &format!("?access_token={wide}")).await;
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
