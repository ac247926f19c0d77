//! Path subscriptions over `POST /v1/execute`: every error code from a real
//! signed request, third-party delivery, ordered notifications with an
//! unbroken `previous_hash` chain, include_payload, one engine among
//! several servers (limits, renewal, redirects and restarts are in
//! `subscription_lifecycle`; the helpers that sign and send them are in
//! `helpers::federation`).

use serde_json::{Map, Value, json};
use tidings_protocol::tree::capability::hash_of;

use crate::both_stores;
use crate::helpers::federation::*;
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(every_error_code_from_signed_requests, capability_required_when_auth_is_on, notifications_follow_commit_order_with_payload,);

/// Several servers on one database (sharing the server key, as they must):
/// exactly one engine runs, every notification is appended once, and when
/// the leading server stops the other takes over. The leader is found, not
/// assumed: it is the one whose connection holds the engine's advisory
/// lock (each server names its connections). PostgreSQL only: the embedded
/// store has one process per data directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_engine_among_several_servers() {
    let named = |url: &str, name: &str| format!("{url}?application_name={name}");
    let first = spawn_app_with(Backend::Postgres, |s| s.database_url = s.database_url.as_deref().map(|u| named(u, "tidings-a"))).await;
    let db_url = first.db_url.clone().unwrap();
    let mut settings = crate::helpers::test_settings();
    let dir = tempfile::tempdir().unwrap();
    settings.data_dir = dir.path().to_path_buf();
    settings.database_url = Some(named(&db_url, "tidings-b"));
    settings.server_key_file = Some(first.data_dir().join("server.key"));
    let second = crate::helpers::start(settings, Some(dir), None).await;
    let server = server_hash(&first).await;
    assert_eq!(server_hash(&second).await, server, "one identity for the deployment");
    let (db, conn) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    // Which server's connection holds an advisory lock in this database.
    let leaders = || async {
        let rows = db
            .query(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                 WHERE l.locktype = 'advisory' AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[],
            )
            .await
            .unwrap();
        rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>()
    };
    let a = Peer::new();
    let (_, body) = subscribe(&second, &server, &a, "multi/*", "system/inbox/multi", json!({})).await;
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    let mut stream = inbox(&first, "system/inbox/multi").await;
    let mut hashes = Vec::new();
    for i in 0..20 {
        let app = if i % 2 == 0 { &first } else { &second };
        hashes.push(put(app, "multi/x", json!({"i": i}), None).await["hash"].as_str().unwrap().to_owned());
    }
    for (i, hash) in hashes.iter().enumerate() {
        let n = next_notification(&mut stream).await;
        assert_eq!(
            (n["data"]["subscription_id"].as_str(), n["data"]["hash"].as_str()),
            (Some(id.as_str()), Some(hash.as_str())),
            "write {i}"
        );
    }
    drop(stream);
    // Exactly one leads; stop that one.
    let held = leaders().await;
    assert_eq!(held.len(), 1, "one engine leads: {held:?}");
    let (leader, follower) = match held[0].as_str() {
        "tidings-a" => (first, second),
        "tidings-b" => (second, first),
        other => panic!("the lock is held by {other}"),
    };
    let standby = if held[0] == "tidings-a" { "tidings-b" } else { "tidings-a" };
    leader.stop().await;
    // The other takes the lead (it retries every TIDINGS_ENGINE_LEAD_RETRY).
    let mut tries = 0;
    while leaders().await != [standby] {
        tries += 1;
        assert!(tries < 200, "{standby} took over the engine: {:?}", leaders().await);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for i in 0..5 {
        let last = put(&follower, "multi/x", json!({"after": i}), None).await;
        hashes.push(last["hash"].as_str().unwrap().to_owned());
    }
    // The whole inbox from the start: every change once, in commit order.
    let mut stream = follower.stream("?types=subscription.notification&targets=system/inbox/multi&since=0", None).await;
    for (i, hash) in hashes.iter().enumerate() {
        let n = next_notification(&mut stream).await;
        assert_eq!(n["data"]["hash"].as_str(), Some(hash.as_str()), "notification {i}");
    }
    // A sentinel change: its notification comes next, so none was repeated.
    let sentinel = put(&follower, "multi/x", json!({"sentinel": true}), None).await;
    assert_eq!(next_notification(&mut stream).await["data"]["hash"], sentinel["hash"], "no notification was repeated");
}

async fn every_error_code_from_signed_requests(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let (a, b, c) = (Peer::new(), Peer::new(), Peer::new());
    let inbox_a = "system/inbox/a";
    let subscribe_grant = json!([{"handler": "system/subscription", "operations": ["subscribe", "unsubscribe"], "resources": ["docs/**"]}]);
    let request = |token: &str, inbox: &str| json!({"deliver_to": {"uri": inbox}, "deliver_token": token});

    // 400 missing_deliver_token: the token is not in `included`.
    let mut included = Map::new();
    let token = a.grant(&server, inbox_grant(inbox_a), None, &mut included);
    included.remove(&token);
    let (status, body) = execute(
        &app,
        &Subscribe { author: &a, pattern: "docs/*", params: request(&token, inbox_a), capability: None, included }.envelope("subscribe"),
    )
    .await;
    assert_eq!((status, code(&body)), (400, "missing_deliver_token"), "{body}");

    // 403 deliver_token_insufficient: the token grants another inbox.
    let mut included = Map::new();
    let token = a.grant(&server, inbox_grant("system/inbox/other"), None, &mut included);
    let (status, body) = execute(
        &app,
        &Subscribe { author: &a, pattern: "docs/*", params: request(&token, inbox_a), capability: None, included }.envelope("subscribe"),
    )
    .await;
    assert_eq!((status, code(&body)), (403, "deliver_token_insufficient"), "{body}");

    // 404 chain_unreachable: the token's parent is not included.
    let mut included = Map::new();
    let mut elsewhere = Map::new();
    let root = c.grant(&a.hash, inbox_grant("system/inbox/**"), None, &mut elsewhere);
    let token = a.grant(&server, inbox_grant(inbox_a), Some(&root), &mut included);
    let (status, body) = execute(
        &app,
        &Subscribe { author: &a, pattern: "docs/*", params: request(&token, inbox_a), capability: None, included }.envelope("subscribe"),
    )
    .await;
    assert_eq!((status, code(&body)), (404, "chain_unreachable"), "{body}");

    // Third-party delivery: rooted at C (who owns the inbox), delegated to
    // the author A, then to the server. A is in the chain, not its root.
    let inbox_c = "system/inbox/c-feed";
    let mut included = Map::new();
    let root = c.grant(&a.hash, inbox_grant("system/inbox/**"), None, &mut included);
    let token = a.grant(&server, inbox_grant(inbox_c), Some(&root), &mut included);
    let (status, body) = execute(
        &app,
        &Subscribe { author: &a, pattern: "docs/*", params: request(&token, inbox_c), capability: None, included }.envelope("subscribe"),
    )
    .await;
    assert_eq!(status, 200, "third-party delivery is accepted: {body}");
    let third_party = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    assert!(app.store.content_get(&root).await.unwrap().is_some(), "the accepted chain is kept for later checks");

    // 403 embedded_cap_unauthorized: the same kind of token, but without A
    // anywhere in its chain.
    let mut included = Map::new();
    let token = c.grant(&server, inbox_grant(inbox_c), None, &mut included);
    let (status, body) = execute(
        &app,
        &Subscribe { author: &a, pattern: "docs/**", params: request(&token, inbox_c), capability: None, included }.envelope("subscribe"),
    )
    .await;
    assert_eq!((status, code(&body)), (403, "embedded_cap_unauthorized"), "{body}");
    assert_eq!(app.store.content_get(&token).await.unwrap(), None, "a refused subscribe stores nothing");

    // 403 payload_unauthorized: a caller capability that grants subscribe but
    // not tree:get; the same with tree:get is accepted.
    let mut included = Map::new();
    let cap = caller_capability(&app, &b, subscribe_grant.clone(), &mut included).await;
    let token = b.grant(&server, inbox_grant("system/inbox/b"), None, &mut included);
    let mut params = request(&token, "system/inbox/b");
    params["include_payload"] = json!(true);
    let (status, body) = execute(
        &app,
        &Subscribe { author: &b, pattern: "docs/*", params: params.clone(), capability: Some(cap), included: included.clone() }
            .envelope("subscribe"),
    )
    .await;
    assert_eq!((status, code(&body)), (403, "payload_unauthorized"), "{body}");
    let mut grants = subscribe_grant.clone();
    grants.as_array_mut().unwrap().push(json!({"handler": "system/tree", "operations": ["get"], "resources": ["docs/**"]}));
    let cap = caller_capability(&app, &b, grants, &mut included).await;
    let (status, body) = execute(
        &app,
        &Subscribe { author: &b, pattern: "docs/*", params, capability: Some(cap.clone()), included: included.clone() }
            .envelope("subscribe"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // The caller capability only covers docs/**.
    let (status, body) = execute(
        &app,
        &Subscribe { author: &b, pattern: "other/*", params: request(&token, "system/inbox/b"), capability: Some(cap), included }
            .envelope("subscribe"),
    )
    .await;
    assert_eq!((status, code(&body)), (403, "capability_insufficient"), "{body}");

    // 401 signature_invalid: signed by someone else than its author.
    let mut included = Map::new();
    let token = a.grant(&server, inbox_grant(inbox_a), None, &mut included);
    let mut forged =
        Subscribe { author: &a, pattern: "docs/*", params: request(&token, inbox_a), capability: None, included }.envelope("subscribe");
    let execute_hash = hash_of(&forged["execute"]).unwrap();
    let mut by_b = Map::new();
    b.sign_into(&execute_hash, &mut by_b);
    let included = forged["included"].as_object_mut().unwrap();
    included.retain(|_, e| e["type"] != "system/signature" || e["data"]["target"] != execute_hash);
    included.extend(by_b);
    let (status, body) = execute(&app, &forged).await;
    assert_eq!((status, code(&body)), (401, "signature_invalid"), "{body}");

    // 404 subscription_not_found, 403 not_subscription_owner, then the owner.
    let (status, body) = unsubscribe(&app, &a, "no-such-subscription").await;
    assert_eq!((status, code(&body)), (404, "subscription_not_found"), "{body}");
    let (status, body) = unsubscribe(&app, &b, &third_party).await;
    assert_eq!((status, code(&body)), (403, "not_subscription_owner"), "{body}");
    assert_eq!(tree_status(&app, &format!("system/subscription/{third_party}")).await, 200);
    let (status, body) = unsubscribe(&app, &a, &third_party).await;
    assert_eq!((status, &body["result"]), (200, &Value::Null), "{body}");
    assert_eq!(tree_status(&app, &format!("system/subscription/{third_party}")).await, 404, "the entity is gone");

    // Bad input stores nothing and the server keeps serving.
    let before = children(&app, "system/subscription").await;
    for bad in [json!("nope"), json!({"execute": {"type": "x", "data": {}}}), json!({"execute": null})] {
        let (status, body) = execute(&app, &bad).await;
        assert_eq!((status, code(&body)), (400, "invalid_execute"), "{body}");
    }
    let mut included = Map::new();
    let token = a.grant(&server, inbox_grant(inbox_a), None, &mut included);
    let mut wrong_name =
        Subscribe { author: &a, pattern: "docs/*", params: request(&token, inbox_a), capability: None, included }.envelope("subscribe");
    let entity = wrong_name["included"][&token].clone();
    wrong_name["included"].as_object_mut().unwrap().insert(format!("sha256:{}", "0".repeat(64)), entity);
    let (status, body) = execute(&app, &wrong_name).await;
    assert_eq!((status, code(&body)), (400, "invalid_included"), "{body}");
    // At most MAX_INCLUDED (256) entities travel with one EXECUTE.
    let mut crowded = Subscribe { author: &a, pattern: "docs/*", params: request(&token, inbox_a), capability: None, included: Map::new() }
        .envelope("subscribe");
    let extra = crowded["included"].as_object_mut().unwrap();
    for i in 0..tidings_protocol::peer::verify::MAX_INCLUDED {
        let entity = json!({"type": "note", "data": {"i": i}});
        extra.insert(hash_of(&entity).unwrap(), entity);
    }
    let (status, body) = execute(&app, &crowded).await;
    assert_eq!((status, code(&body)), (400, "invalid_included"), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("256"), "{body}");
    let r = app.http.post(app.url("/v1/execute")).header("content-type", "application/json").body("{").send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(children(&app, "system/subscription").await, before, "refused requests stored nothing");
    assert_eq!(app.http.get(app.url("/health")).send().await.unwrap().status(), 200);
}

async fn capability_required_when_auth_is_on(backend: Backend) {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let secret = "subscription-test-secret-of-enough-bytes";
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(secret.into())).await;
    let jwt = |admin: bool| {
        let claims =
            json!({"sub": "svc", "exp": chrono::Utc::now().timestamp() + 600, "admin": admin, "publish": ["**"], "subscribe": ["**"]});
        encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap()).unwrap()
    };
    let id: Value = app.http.get(app.url("/v1/identity")).send().await.unwrap().json().await.unwrap();
    let server = id["hash"].as_str().unwrap().to_owned();
    let a = Peer::new();
    let mut included = Map::new();
    let token = a.grant(&server, inbox_grant("system/inbox/a"), None, &mut included);
    let params = json!({"deliver_to": {"uri": "system/inbox/a"}, "deliver_token": token});
    let bare = Subscribe { author: &a, pattern: "docs/*", params: params.clone(), capability: None, included: included.clone() }
        .envelope("subscribe");
    // No bearer token: an EXECUTE carries its own credential (the caller
    // capability, which a peer delivering here has instead of a token), so
    // dispatch decides, and without one it is refused.
    let r = app.http.post(app.url("/v1/execute")).json(&bare).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "capability_required");
    // A bearer token that does not verify is refused by the HTTP layer.
    let r = app.http.post(app.url("/v1/execute")).bearer_auth("not-a-jwt").json(&bare).send().await.unwrap();
    assert_eq!(r.status(), 401);
    // A bearer token but no caller capability.
    let r = app.http.post(app.url("/v1/execute")).bearer_auth(jwt(false)).json(&bare).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "capability_required");
    // A capability minted for someone else is not the author's.
    let other = Peer::new();
    let mint = |grantee: &str| json!({"grantee": grantee, "grants": [{"handler": "system/subscription", "operations": ["subscribe"], "resources": ["docs/**"]}]});
    let mint_for = |grantee: String| {
        let request = app.http.post(app.url("/v1/admin/capabilities")).bearer_auth(jwt(true)).json(&mint(&grantee));
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let minted = mint_for(other.hash.clone()).await;
    let mut with_other = included.clone();
    with_other.extend(minted["included"].as_object().unwrap().clone());
    let envelope = Subscribe {
        author: &a,
        pattern: "docs/*",
        params: params.clone(),
        capability: Some(minted["hash"].as_str().unwrap().to_owned()),
        included: with_other,
    }
    .envelope("subscribe");
    let r = app.http.post(app.url("/v1/execute")).bearer_auth(jwt(false)).json(&envelope).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "capability_invalid");
    // The author's own capability is accepted.
    let minted = mint_for(a.hash.clone()).await;
    included.extend(minted["included"].as_object().unwrap().clone());
    let cap = minted["hash"].as_str().unwrap().to_owned();
    // With tokens on a capability is always in play, so bundling payloads
    // needs tree:get, which this one does not grant.
    let mut bundled = params.clone();
    bundled["include_payload"] = json!(true);
    let envelope = Subscribe { author: &a, pattern: "docs/*", params: bundled, capability: Some(cap.clone()), included: included.clone() }
        .envelope("subscribe");
    let r = app.http.post(app.url("/v1/execute")).bearer_auth(jwt(false)).json(&envelope).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["code"], "payload_unauthorized");
    // The capability is the credential: no bearer token is needed with it.
    let envelope = Subscribe { author: &a, pattern: "docs/*", params, capability: Some(cap), included }.envelope("subscribe");
    let r = app.http.post(app.url("/v1/execute")).json(&envelope).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // system/ is tidings' own: only admins read or write it directly.
    let list = |token: String| app.http.get(app.url("/v1/tree/system/subscription/")).bearer_auth(token).send();
    assert_eq!(list(jwt(false)).await.unwrap().status(), 403);
    assert_eq!(list(jwt(true)).await.unwrap().json::<Value>().await.unwrap()["children"].as_array().unwrap().len(), 1);
    let forged = json!({"type": "system/subscription", "data": {}});
    let r = app.http.put(app.url("/v1/tree/system/subscription/forged")).bearer_auth(jwt(false)).json(&forged).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "forbidden_tree_access");
}

async fn notifications_follow_commit_order_with_payload(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let a = Peer::new();
    let (status, body) = subscribe(&app, &server, &a, "docs/**", "system/inbox/a", json!({"include_payload": true})).await;
    assert_eq!(status, 200, "{body}");
    let id = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    assert_eq!(body["result"]["events"], json!(["created", "updated", "deleted"]));
    let (status, body) = subscribe(&app, &server, &a, "docs/**", "system/inbox/deletions", json!({"events": ["deleted"]})).await;
    assert_eq!(status, 200, "{body}");
    // The entity is the source of truth, readable in the tree.
    let stored: Value = app.http.get(app.url(&format!("/v1/tree/system/subscription/{id}"))).send().await.unwrap().json().await.unwrap();
    assert_eq!((stored["type"].as_str(), stored["data"]["pattern"].as_str()), (Some("system/subscription"), Some("docs/**")));
    assert_eq!(stored["data"]["subscriber_identity"], a.hash.as_str());

    let mut stream = inbox(&app, "system/inbox/a").await;
    let mut deletions = inbox(&app, "system/inbox/deletions").await;
    let w1 = put(&app, "docs/x", json!({"v": 1}), Some("chain-1")).await;
    put(&app, "elsewhere/x", json!({"v": 1}), None).await;
    let w2 = put(&app, "docs/x", json!({"v": 2}), None).await;
    let w3 = put(&app, "docs/deep/y", json!({"v": 3}), None).await;
    let r: Value = app.http.delete(app.url("/v1/tree/docs/x")).send().await.unwrap().json().await.unwrap();
    let expected = [("created", &w1), ("updated", &w2), ("created", &w3), ("deleted", &r)];
    let mut last_for_x: Option<String> = None;
    for (i, (event, write)) in expected.into_iter().enumerate() {
        let n = next_notification(&mut stream).await;
        if i == 0 {
            assert_eq!(n["chain_id"], "chain-1", "the write's X-Chain-Id travels with its notifications");
        }
        assert_eq!(n["type"], "system/subscription/notification");
        let data = &n["data"];
        assert_eq!((data["subscription_id"].as_str(), data["event"].as_str()), (Some(id.as_str()), Some(event)), "{n}");
        assert_eq!(data["uri"], write["uri"]);
        assert_eq!(data.get("hash"), write.get("hash").filter(|h| !h.is_null()));
        assert_eq!(data.get("previous_hash"), write.get("previous_hash").filter(|h| !h.is_null()));
        if data["uri"] == "docs/x" {
            assert_eq!(data["previous_hash"].as_str().map(str::to_owned), last_for_x, "the previous_hash chain is unbroken");
            last_for_x = data["hash"].as_str().map(str::to_owned);
        }
        // include_payload: the changed entity rides along, except on
        // delete; so does the change, signed by the server.
        match data["hash"].as_str() {
            Some(h) => assert_eq!(n["included"][h]["type"], "note", "{n}"),
            None => assert!(n["included"].as_object().unwrap().values().all(|e| e["type"] != "note"), "no entity on a deletion: {n}"),
        }
        let signed = data["signed"][0].as_str().unwrap();
        assert_eq!(n["included"][signed]["data"]["origin"], server.as_str(), "{n}");
    }
    let d = next_notification(&mut deletions).await;
    assert_eq!((d["data"]["event"].as_str(), d["data"]["uri"].as_str()), (Some("deleted"), Some("docs/x")));
    assert!(d.get("included").is_none(), "a lean subscription carries hashes only");
}
