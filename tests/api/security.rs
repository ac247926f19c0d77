//! Security: bearer tokens, grants, no agent spoofing, visibility on every
//! path, consumer ownership, limits, CORS, and tokens kept out of logs.

use std::ops::ControlFlow;
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, gather, spawn_app, spawn_app_with};

both_stores!(
    bad_tokens_are_401,
    grants_and_agent_spoofing,
    visibility_matrix_has_no_leaks,
    grant_intersection_and_token_carriers,
    consumers_belong_to_their_creator,
    stream_publish_and_replay_limits,
    publish_rate_counts_every_event,
    cors_origins,
    tokens_never_reach_the_logs,
    public_key_tokens,
    the_caller_sees_what_its_token_grants
);

use crate::helpers::tokens::{SECRET, token, token_with};

fn admin() -> String {
    token("ops", json!({"admin": true, "publish": ["**"], "subscribe": ["**"], "visibility": "admin"}))
}

async fn secured(backend: Backend) -> TestApp {
    spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(SECRET.into())).await
}

async fn publish_as(app: &TestApp, token: &str, body: Value) -> (u16, Value) {
    let r = app.http.post(app.url("/v1/events")).bearer_auth(token).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn stream_as(app: &TestApp, token: &str, query: &str) -> crate::helpers::Stream {
    let url = app.url(&format!("/v1/stream?{query}"));
    let response = app.http.get(url).bearer_auth(token).send().await.unwrap();
    assert_eq!(response.status(), 200, "stream as token");
    crate::helpers::Stream::from_response(response)
}

async fn bad_tokens_are_401(backend: Backend) {
    let app = secured(backend).await;
    let b64 = |s: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
    };
    let exp = chrono::Utc::now().timestamp() + 600;
    let cases: Vec<(&str, Option<String>)> = vec![
        ("missing", None),
        (
            "alg none",
            Some(format!("{}.{}.", b64(r#"{"alg":"none","typ":"JWT"}"#), b64(&json!({"sub":"x","exp":exp,"publish":["**"]}).to_string()))),
        ),
        ("expired", Some(token_with(json!({"sub":"x","exp": chrono::Utc::now().timestamp() - 600, "publish":["**"]}), SECRET))),
        ("wrong key", Some(token_with(json!({"sub":"x","exp":exp,"publish":["**"]}), "another-secret-of-enough-bytes"))),
        ("no exp", Some(token_with(json!({"sub":"x","publish":["**"]}), SECRET))),
        ("garbage", Some("not.a.token".into())),
    ];
    for (what, token) in cases {
        for (method, path) in [("POST", "/v1/events"), ("GET", "/v1/stream"), ("GET", "/v1/poll"), ("GET", "/v1/consumers")] {
            let mut r = if method == "POST" {
                app.http.post(app.url(path)).json(&json!({"event_type": "comment.posted"}))
            } else {
                app.http.get(app.url(path))
            };
            if let Some(t) = &token {
                r = r.bearer_auth(t);
            }
            let r = r.send().await.unwrap();
            assert_eq!(r.status(), 401, "{what} on {method} {path}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer");
            let body: Value = r.json().await.unwrap();
            assert_eq!(body["error"], "unauthorized");
            if let Some(t) = &token {
                assert!(!body.to_string().contains(t.as_str()), "the token is never echoed");
            } else {
                // Where a token may travel, said for this request: a cookie
                // authenticates only the two browser streams.
                let message = body["message"].as_str().unwrap();
                assert!(message.contains("Authorization: Bearer") && message.contains("access_token query"), "{message}");
                let cookie_named = message.contains(", or an access_token cookie");
                assert_eq!(cookie_named, path == "/v1/stream", "{method} {path}: {message}");
            }
        }
    }
    assert_eq!(app.head().await, 0, "nothing was stored");
    // Health, metrics, the live page's HTML, the contract and the server's
    // public identity need no token (docs/security.md lists exactly these).
    for path in ["/health", "/health/ready", "/health/deep", "/metrics", "/", "/openapi.json", "/v1/identity"] {
        assert_eq!(app.http.get(app.url(path)).send().await.unwrap().status(), 200, "{path}");
    }
    let r = app.http.get(app.url("/v1/registry")).send().await.unwrap();
    assert_eq!(r.status(), 401, "everything else needs one");
}

async fn grants_and_agent_spoofing(backend: Backend) {
    let app = secured(backend).await;
    let mendel = token("persona:mendel", json!({"publish": ["hypothesis.*"], "subscribe": ["**"]}));
    let (status, body) = publish_as(&app, &mendel, json!({"event_type": "comment.posted"})).await;
    assert_eq!((status, body["error"].as_str()), (403, Some("forbidden_event_type")));
    let (status, body) = publish_as(&app, &mendel, json!({"event_type": "hypothesis.created", "agent": {"id": "persona:darwin"}})).await;
    assert_eq!((status, body["error"].as_str()), (403, Some("agent_spoofing")));
    // A batch with one bad event stores nothing.
    let (status, _) =
        publish_as(&app, &mendel, json!({"events": [{"event_type": "hypothesis.created"}, {"event_type": "comment.posted"}]})).await;
    assert_eq!(status, 403);
    assert_eq!(app.head().await, 0);
    // Its own agent id, or none (then it is attributed), is fine.
    let (status, _) =
        publish_as(&app, &mendel, json!({"event_type": "hypothesis.created", "agent": {"id": "persona:mendel", "kind": "ai_persona"}}))
            .await;
    assert_eq!(status, 201);
    let (status, _) = publish_as(&app, &mendel, json!({"event_type": "hypothesis.promoted", "payload": {"to_state": "x"}})).await;
    assert_eq!(status, 201);
    // An admin may publish for another agent.
    let (status, _) = publish_as(&app, &admin(), json!({"event_type": "comment.posted", "agent": {"id": "human:u-jane"}})).await;
    assert_eq!(status, 201);
    let mut s = stream_as(&app, &admin(), "since=0").await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let v: Value = serde_json::from_str(&s.next().await.data).unwrap();
        seen.push(v["agent"]["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, vec!["persona:mendel", "persona:mendel", "human:u-jane"], "events without an agent are attributed to the publisher");
}

/// Readers at each level x events at each level x live, replay and poll.
async fn visibility_matrix_has_no_leaks(backend: Backend) {
    let app = secured(backend).await;
    let levels = ["public", "reviewer_only", "admin"];
    let reader = |level: &str| token(&format!("reader-{level}"), json!({"subscribe": ["**"], "visibility": level}));
    let types = "types=comment.posted,tree.*";
    let mut live = Vec::new();
    let mut live_ws = Vec::new();
    let device = crate::helpers::device::Key::new();
    for level in levels {
        live.push(stream_as(&app, &reader(level), types).await);
        // WebSocket: the upgrade's token sets the grants and visibility.
        let mut ws = crate::helpers::device::Client::connect_with(&app, &format!("?access_token={}", reader(level))).await;
        let answer =
            ws.auth(&device, json!({"device_id": format!("live-{level}"), "filter": {"types": ["comment.posted", "tree.*"]}})).await;
        assert!(answer["result"].is_object(), "{answer}");
        live_ws.push(ws);
    }
    // (id, index of the lowest level that may see it)
    let mut ids = Vec::new();
    for (i, level) in levels.iter().enumerate() {
        let (status, body) = publish_as(&app, &admin(), json!({"event_type": "comment.posted", "visibility": level})).await;
        assert_eq!(status, 201);
        ids.push((body["event_ids"][0].as_i64().unwrap(), i));
    }
    // Tree changes: an ordinary path is public; system/ is tidings' own and
    // its changes are admin-visibility events.
    for (path, level) in [("notes/a", 0), ("system/secret", 2)] {
        let r = app
            .http
            .put(app.url(&format!("/v1/tree/{path}")))
            .bearer_auth(admin())
            .json(&json!({"type": "note", "data": {}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{path}");
        let body: Value = r.json().await.unwrap();
        ids.push((body["event_id"].as_i64().unwrap(), level));
    }
    // A public sentinel closes each reader's expected sequence.
    let (_, body) = publish_as(&app, &admin(), json!({"event_type": "comment.posted"})).await;
    let sentinel = body["event_ids"][0].as_i64().unwrap();
    for (r, level) in levels.iter().enumerate() {
        let mut expected: Vec<i64> = ids.iter().filter(|(_, at)| *at <= r).map(|(id, _)| *id).collect();
        expected.push(sentinel);
        assert_eq!(live[r].ids(expected.len()).await, expected, "live, reader {level}");
        let mut replay = stream_as(&app, &reader(level), &format!("{types}&since=0")).await;
        assert_eq!(replay.ids(expected.len()).await, expected, "replay, reader {level}");
        let response = app.http.get(app.url("/v1/poll?since=0&limit=100")).bearer_auth(reader(level)).send().await.unwrap();
        let page: Value = response.json().await.unwrap();
        let polled: Vec<i64> = page["events"].as_array().unwrap().iter().map(|e| e["event_id"].as_i64().unwrap()).collect();
        assert_eq!(polled, expected, "poll, reader {level}");
        let mut got = Vec::new();
        while got.len() < expected.len() {
            got.push(live_ws[r].notification().await["params"]["seq"].as_i64().unwrap());
        }
        assert_eq!(got, expected, "WebSocket live, reader {level}");
        let mut ws = crate::helpers::device::Client::connect_with(&app, &format!("?access_token={}", reader(level))).await;
        ws.auth(&device, json!({"device_id": format!("catch-up-{level}"), "cursor": 0, "filter": {"types": ["comment.posted", "tree.*"]}}))
            .await;
        let page = ws.call("sync.delta", json!({"device_id": format!("catch-up-{level}"), "since": 0, "limit": 100})).await;
        let caught: Vec<i64> = page["result"]["items"].as_array().unwrap().iter().map(|i| i["seq"].as_i64().unwrap()).collect();
        assert_eq!(caught, expected, "WebSocket catch-up, reader {level}");
    }
    // A bad token on the upgrade: one error frame, then close 1000.
    let mut ws = crate::helpers::device::Client::connect_with(&app, "?access_token=not-a-token").await;
    let error = ws.notification().await;
    assert_eq!(error["error"]["data"]["code"], "unauthorized", "{error}");
    assert_eq!(ws.closed().await.0, 1000);
}

async fn grant_intersection_and_token_carriers(backend: Backend) {
    let app = secured(backend).await;
    let narrow = token("watcher", json!({"subscribe": ["hypothesis.*"]}));
    let mut live = stream_as(&app, &narrow, "types=**").await;
    publish_as(&app, &admin(), json!({"event_type": "comment.posted"})).await;
    let (_, b) = publish_as(&app, &admin(), json!({"event_type": "hypothesis.created"})).await;
    assert_eq!(live.ids(1).await, vec![b["event_ids"][0].as_i64().unwrap()], "** with a grant of hypothesis.* yields only hypothesis.*");
    // By cookie and by query parameter (EventSource cannot set headers).
    let url = app.url("/v1/stream?since=0");
    let r = app.http.get(&url).header("cookie", format!("theme=dark; access_token={narrow}")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut by_cookie = crate::helpers::Stream::from_response(r);
    assert_eq!(by_cookie.ids(1).await, vec![b["event_ids"][0].as_i64().unwrap()]);
    let r = app.http.get(format!("{url}&access_token={narrow}")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut by_query = crate::helpers::Stream::from_response(r);
    assert_eq!(by_query.ids(1).await, vec![b["event_ids"][0].as_i64().unwrap()]);
}

/// Consumer ids are scoped by owner: another identity's `alice-feed` is a
/// consumer of its own, and nothing it does (poll, ack, delete, naming the
/// owner) reaches or reveals alice's; an admin sees every consumer and may
/// delete one by naming its owner.
async fn consumers_belong_to_their_creator(backend: Backend) {
    let app = secured(backend).await;
    let alice = token("alice", json!({"subscribe": ["**"], "publish": ["**"]}));
    let bob = token("bob", json!({"subscribe": ["**"]}));
    let get = |t: &str, path: &str| app.http.get(app.url(path)).bearer_auth(t.to_owned()).send();
    assert_eq!(get(&alice, "/v1/poll?consumer_id=alice-feed").await.unwrap().status(), 200);
    let r = app.http.post(app.url("/v1/events")).bearer_auth(&alice).json(&json!({"event_type": "comment.posted"})).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let ack = |t: &str, cursor: i64| {
        app.http.post(app.url("/v1/consumers/alice-feed/ack")).bearer_auth(t.to_owned()).json(&json!({"cursor": cursor})).send()
    };
    assert_eq!(ack(&alice, 1).await.unwrap().json::<Value>().await.unwrap()["cursor"], 1);
    // Bob's alice-feed is his own: created at the head, its cursor apart.
    let r = get(&bob, "/v1/poll?consumer_id=alice-feed").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["events"], json!([]), "a new consumer starts at the head");
    assert_eq!(ack(&bob, 0).await.unwrap().json::<Value>().await.unwrap()["cursor"], 1, "his own, clamped and monotonic");
    let del = |t: &str, query: &str| app.http.delete(app.url(&format!("/v1/consumers/alice-feed{query}"))).bearer_auth(t.to_owned()).send();
    assert_eq!(del(&bob, "").await.unwrap().status(), 204, "he deletes his own");
    let r = del(&bob, "?owner=alice").await.unwrap();
    assert_eq!(
        (r.status().as_u16(), r.json::<Value>().await.unwrap()["error"].clone()),
        (404, json!("consumer_not_found")),
        "another's is not his to name"
    );
    let list: Value = get(&bob, "/v1/consumers").await.unwrap().json().await.unwrap();
    assert_eq!(list["consumers"], json!([]), "bob sees none of alice's consumers");
    let list: Value = get(&alice, "/v1/consumers").await.unwrap().json().await.unwrap();
    assert_eq!(
        (list["consumers"][0]["consumer_id"].as_str(), list["consumers"][0]["cursor"].as_i64()),
        (Some("alice-feed"), Some(1)),
        "{list}"
    );
    let list: Value = get(&admin(), "/v1/consumers").await.unwrap().json().await.unwrap();
    assert_eq!(
        (list["consumers"][0]["owner"].as_str(), list["consumers"][0]["consumer_id"].as_str()),
        (Some("alice"), Some("alice-feed")),
        "{list}"
    );
    assert_eq!(del(&admin(), "?owner=alice").await.unwrap().status(), 204, "an admin deletes anyone's by naming the owner");
    let list: Value = get(&alice, "/v1/consumers").await.unwrap().json().await.unwrap();
    assert_eq!(list["consumers"], json!([]));
}

async fn stream_publish_and_replay_limits(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.auth.jwt_hs256_secret = Some(SECRET.into());
        s.streams.max_streams = 3;
        s.streams.max_streams_per_identity = 2;
        s.publish.publish_rate = 2;
        s.streams.max_replay = 5;
    })
    .await;
    let alice = token("alice", json!({"subscribe": ["**"], "publish": ["**"]}));
    let bob = token("bob", json!({"subscribe": ["**"]}));
    let open = |t: &str| app.http.get(app.url("/v1/stream")).bearer_auth(t.to_owned()).send();
    let a1 = open(&alice).await.unwrap();
    let a2 = open(&alice).await.unwrap();
    assert_eq!((a1.status().as_u16(), a2.status().as_u16()), (200, 200));
    let a3 = open(&alice).await.unwrap();
    assert_eq!(a3.status(), 429, "per identity");
    assert_eq!(a3.json::<Value>().await.unwrap()["error"], "too_many_streams_for_identity");
    let b1 = open(&bob).await.unwrap();
    assert_eq!(b1.status(), 200);
    let b2 = open(&bob).await.unwrap();
    assert_eq!(b2.status(), 503, "in total");
    assert!(b2.headers().contains_key("retry-after"));
    // A stream given back frees its place.
    drop(a1);
    let mut freed = false;
    for _ in 0..100 {
        let r = open(&bob).await.unwrap();
        if r.status() == 200 {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "a closed stream releases its permit");
    // Publish rate: 2 events/s for alice; a quick burst is refused with Retry-After.
    let mut refused = None;
    for _ in 0..5 {
        let r =
            app.http.post(app.url("/v1/events")).bearer_auth(&alice).json(&json!({"event_type": "comment.posted"})).send().await.unwrap();
        if r.status() == 429 {
            refused = Some(r);
            break;
        }
    }
    let refused = refused.expect("the rate limit applies");
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(refused.json::<Value>().await.unwrap()["error"], "rate_limited");
    // Replay cap: a resume 10 events back with a cap of 5 is a gap.
    let ops = admin();
    let what = |published: &usize| format!("{published} of the admin's 10 events within 30 s of the rate limit");
    let (server, admin) = (&app, &ops);
    gather(Duration::from_secs(30), 0, what, |mut published: usize| async move {
        // The same rate limit applies to the admin: wait it out when refused.
        match publish_as(server, admin, json!({"events": [{"event_type": "comment.posted"}, {"event_type": "comment.posted"}]})).await.0 {
            201 => published += 2,
            429 => tokio::time::sleep(Duration::from_millis(300)).await,
            other => panic!("unexpected {other}"),
        }
        if published >= 10 { ControlFlow::Break(()) } else { ControlFlow::Continue(published) }
    })
    .await;
    let head = app.head().await;
    drop((a2, b1));
    let mut s = stream_as(&app, &ops, &format!("since={}", head - 10)).await;
    let gap = s.next().await;
    assert_eq!(gap.event.as_deref(), Some("system.replay_gap"));
    let v: Value = serde_json::from_str(&gap.data).unwrap();
    assert_eq!(v, json!({"requested": head - 10, "available_from": head - 4, "head": head, "reason": "replay_limit"}));
    assert_eq!(s.ids(5).await, ((head - 4)..=head).collect::<Vec<_>>());
}

/// Every event costs one token of the publish budget, a batch larger than
/// the burst is refused whole, and refused requests take nothing.
async fn publish_rate_counts_every_event(backend: Backend) {
    let app = spawn_app_with(backend, |s| {
        s.auth.jwt_hs256_secret = Some(SECRET.into());
        s.publish.publish_rate = 5;
    })
    .await;
    let alice = token("alice", json!({"publish": ["**"], "subscribe": ["**"]}));
    let batch = |n: usize| json!({ "events": vec![json!({"event_type": "comment.posted"}); n] });
    // Invalid publishes are refused before they cost anything.
    for bad in [json!({"event_type": "Not.valid"}), json!({"events": [{"event_type": "comment.posted"}, {"nope": 1}]}), json!([1])] {
        let (status, body) = publish_as(&app, &alice, bad).await;
        assert!(status == 400 || status == 422, "{status} {body}");
    }
    // A batch over the burst is refused whole, with Retry-After; nothing is stored.
    let r = app.http.post(app.url("/v1/events")).bearer_auth(&alice).json(&batch(6)).send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "rate_limited");
    assert_eq!(app.head().await, 0, "a refused batch stores nothing");
    // The whole budget is still there: the refusals took none of it.
    assert_eq!(publish_as(&app, &alice, batch(5)).await.0, 201);
    // And five events spent it: a batch of two right after is refused.
    assert_eq!(publish_as(&app, &alice, batch(2)).await.0, 429);
    assert_eq!(app.head().await, 5);
}

async fn cors_origins(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.http.cors_origins = "https://app.example".into()).await;
    let preflight = |origin: &'static str| {
        app.http
            .request(reqwest::Method::OPTIONS, app.url("/v1/stream"))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .send()
    };
    let ok = preflight("https://app.example").await.unwrap();
    assert_eq!(ok.headers()["access-control-allow-origin"], "https://app.example");
    assert_eq!(ok.headers()["access-control-allow-credentials"], "true");
    let other = preflight("https://evil.example").await.unwrap();
    assert!(!other.headers().contains_key("access-control-allow-origin"));
    // A page's publish may carry an Idempotency-Key and read whether it
    // was replayed.
    let publish = app
        .http
        .request(reqwest::Method::OPTIONS, app.url("/v1/events"))
        .header("origin", "https://app.example")
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "content-type,idempotency-key")
        .send()
        .await
        .unwrap();
    let allowed = publish.headers()["access-control-allow-headers"].to_str().unwrap().to_owned();
    assert!(allowed.contains("idempotency-key"), "{allowed}");
    let r = app
        .http
        .post(app.url("/v1/events"))
        .header("origin", "https://app.example")
        .json(&json!({"event_type": "comment.posted"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["access-control-expose-headers"], "idempotent-replayed");
    let any = spawn_app_with(backend, |s| s.http.cors_origins = "*".into()).await;
    let r = any.http.get(any.url("/health")).header("origin", "https://x.example").send().await.unwrap();
    assert_eq!(r.headers()["access-control-allow-origin"], "*");
    assert!(!r.headers().contains_key("access-control-allow-credentials"), "never credentials with *");
}

/// The real binary with debug request logs: tokens sent by header, cookie
/// and query (valid and not) never appear in what it writes.
async fn tokens_never_reach_the_logs(backend: Backend) {
    let (mut envs, _dir) = crate::helpers::process_store(backend).await;
    envs.extend([("TIDINGS_JWT_HS256_SECRET", SECRET.to_owned()), ("TIDINGS_LOG", "debug".to_owned())]);
    let server = crate::helpers::spawn_process(&envs).await;
    let good = token("alice", json!({"subscribe": ["**"], "publish": ["**"]}));
    let bad = token_with(json!({"sub": "mallory", "exp": 1}), SECRET);
    let http = reqwest::Client::new();
    for t in [&good, &bad] {
        let _ = http.post(format!("{}/v1/events", server.base)).bearer_auth(t).json(&json!({"event_type": "comment.posted"})).send().await;
        let _ = http.get(format!("{}/v1/poll?access_token={t}", server.base)).send().await;
        let _ = http.get(format!("{}/v1/consumers", server.base)).header("cookie", format!("access_token={t}")).send().await;
        let _ = http.get(format!("{}/v1/nope?access_token={t}", server.base)).send().await;
        let _ = http.get(format!("{}/v1/registry?x=1;access_token={t}", server.base)).send().await;
        // A percent-encoded spelling of the name authenticates nothing (a
        // proxy's log redaction looks for the name as written), and is
        // redacted from the log all the same.
        for name in ["access%5Ftoken", "%61ccess_token", "access_toke%6E", "access%5ftoken"] {
            let r = http.get(format!("{}/v1/poll?{name}={t}", server.base)).send().await.unwrap();
            assert_eq!(r.status(), 401, "{name} carries no token");
            let r = http.get(format!("{}/v1/stream?{name}={t}", server.base)).send().await.unwrap();
            assert_eq!(r.status(), 401, "{name} carries no token on a stream");
        }
    }
    let logs = server.kill_and_log().await;
    assert!(logs.contains("access_token=REDACTED"), "requests were logged, with the query redacted:\n{logs}");
    for t in [&good, &bad] {
        assert!(!logs.contains(t.as_str()), "a token reached the logs");
        let signature = t.rsplit('.').next().unwrap();
        assert!(!logs.contains(signature), "a token signature reached the logs");
    }
}

/// Authentication off on a non-loopback address refuses to start, and says
/// why. One store: the refusal comes before any store is opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_off_refuses_a_public_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = crate::helpers::process_command(&[("TIDINGS_DATA_DIR", dir.path().display().to_string())], 0);
    cmd.env("TIDINGS_LISTEN", "0.0.0.0:0");
    let output = tokio::time::timeout(Duration::from_secs(20), cmd.output()).await.unwrap().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("refusing to listen on 0.0.0.0:0 with authentication off"), "{stderr}");
    assert!(stderr.contains("TIDINGS_JWT_HS256_SECRET"), "it says what to do: {stderr}");
    // TIDINGS_AUTH=jwt without a key refuses too.
    let mut cmd =
        crate::helpers::process_command(&[("TIDINGS_DATA_DIR", dir.path().display().to_string()), ("TIDINGS_AUTH", "jwt".into())], 0);
    let output = tokio::time::timeout(Duration::from_secs(20), cmd.output()).await.unwrap().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("TIDINGS_AUTH=jwt needs a key"));
}

/// Tokens checked with a PEM public key file: EdDSA for an Ed25519 key,
/// RS256 for an RSA key (the test key pair in `tests/data`). Only the key's
/// algorithm is accepted: the other one, and HS256 (an algorithm switch),
/// are refused.
async fn public_key_tokens(backend: Backend) {
    use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey, spki::der::pem::LineEnding};
    let signing = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let dir = tempfile::tempdir().unwrap();
    let ed_public = dir.path().join("public.pem");
    std::fs::write(&ed_public, signing.verifying_key().to_public_key_pem(LineEnding::LF).unwrap()).unwrap();
    let ed_private = signing.to_pkcs8_pem(LineEnding::LF).unwrap();
    let ed_key = EncodingKey::from_ed_pem(ed_private.as_bytes()).unwrap();
    let rsa_public = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/rs256-test-public.pem"));
    let rsa_key = EncodingKey::from_rsa_pem(include_bytes!("../data/rs256-test-private.pem")).unwrap();
    let claims = json!({"sub": "pk", "exp": chrono::Utc::now().timestamp() + 600, "publish": ["**"]});
    let ed_token = encode(&Header::new(Algorithm::EdDSA), &claims, &ed_key).unwrap();
    let rsa_token = encode(&Header::new(Algorithm::RS256), &claims, &rsa_key).unwrap();
    let hs_token = token("pk", json!({"publish": ["**"]}));
    for (public, good, others) in [(ed_public, &ed_token, [&rsa_token, &hs_token]), (rsa_public, &rsa_token, [&ed_token, &hs_token])] {
        let app = spawn_app_with(backend, |s| s.auth.jwt_public_key_file = Some(public.clone())).await;
        assert_eq!(publish_as(&app, good, json!({"event_type": "comment.posted"})).await.0, 201, "{public:?}");
        for other in others {
            let (status, body) = publish_as(&app, other, json!({"event_type": "comment.posted"})).await;
            assert_eq!(status, 401, "{public:?}: {body}");
        }
    }
}

/// `GET /v1/me` answers what the caller's token grants (never the token);
/// without a token it is `401`, and with authentication off the caller is
/// the local admin.
async fn the_caller_sees_what_its_token_grants(backend: Backend) {
    let app = secured(backend).await;
    let me = |token: Option<String>| {
        let mut r = app.http.get(app.url("/v1/me"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move {
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    assert_eq!(
        me(Some(admin())).await,
        (200, json!({"sub": "ops", "authenticated": true, "admin": true, "visibility": "admin", "publish": ["**"], "subscribe": ["**"]}))
    );
    let reader = token("viewer", json!({"subscribe": ["comment.*"], "visibility": "reviewer_only"}));
    let (status, body) = me(Some(reader.clone())).await;
    assert_eq!(
        (status, &body),
        (
            200,
            &json!({"sub": "viewer", "authenticated": true, "admin": false, "visibility": "reviewer_only", "publish": [], "subscribe": ["comment.*"]})
        )
    );
    assert!(!body.to_string().contains(&reader));
    let (status, body) = me(None).await;
    assert_eq!((status, body["error"].as_str()), (401, Some("unauthorized")));

    let open = spawn_app(backend).await;
    let local: Value = open.http.get(open.url("/v1/me")).send().await.unwrap().json().await.unwrap();
    assert_eq!((&local["admin"], &local["authenticated"]), (&json!(true), &json!(false)));
}
