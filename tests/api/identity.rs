//! The server identity and server-rooted capabilities.

use serde_json::{Value, json};
use tidings_protocol::tree::capability::{Included, chain_grants, resolve_chain};

use crate::both_stores;
use crate::helpers::{Backend, spawn_app, spawn_app_with};

both_stores!(identity_is_stable_and_minted_capabilities_verify, minting_is_for_admins, the_identity_advertises_the_public_url);

async fn the_identity_advertises_the_public_url(backend: Backend) {
    // By default: http:// and the address the server is bound to.
    let app = spawn_app(backend).await;
    let id: Value = app.http.get(app.url("/v1/identity")).send().await.unwrap().json().await.unwrap();
    assert_eq!(id["endpoint"].as_str(), Some(app.base.as_str()), "{id}");
    // Behind a proxy or a name, what TIDINGS_PUBLIC_URL says.
    let app = spawn_app_with(backend, |s| s.public_url = "https://tidings.example:8443/".into()).await;
    let id: Value = app.http.get(app.url("/v1/identity")).send().await.unwrap().json().await.unwrap();
    assert_eq!(id["endpoint"], "https://tidings.example:8443");
}

async fn identity_is_stable_and_minted_capabilities_verify(backend: Backend) {
    let app = spawn_app(backend).await;
    let id: Value = app.http.get(app.url("/v1/identity")).send().await.unwrap().json().await.unwrap();
    let server = id["hash"].as_str().unwrap().to_owned();
    assert!(server.starts_with("sha256:") && server.len() == 71);
    assert_eq!(id["identity"]["data"]["algorithm"], "ed25519");

    let grantee = format!("sha256:{}", "ab".repeat(32));
    let request = json!({"grantee": grantee, "grants": [{"handler": "system/subscription", "operations": ["subscribe"], "resources": ["sensors/**"]}]});
    let r = app.http.post(app.url("/v1/admin/capabilities")).json(&request).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let minted: Value = r.json().await.unwrap();
    let included: Included = minted["included"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let chain = resolve_chain(&included, minted["hash"].as_str().unwrap(), 0).expect("a verifiable, server-signed token");
    assert_eq!(chain[0].granter, server);
    assert_eq!(chain[0].grantee, grantee);
    assert!(chain_grants(&chain, "system/subscription", "subscribe", "sensors/kitchen/temp"));
    assert!(!chain_grants(&chain, "system/subscription", "subscribe", "other/x"));

    for bad in [
        json!({"grantee": "nobody", "grants": request["grants"]}),
        json!({"grantee": grantee, "grants": []}),
        json!({"grantee": grantee, "grants": [{"handler": "h", "operations": ["o"], "resources": ["a//b"]}]}),
        json!({"grantee": grantee, "grants": request["grants"], "extra": 1}),
    ] {
        let r = app.http.post(app.url("/v1/admin/capabilities")).json(&bad).send().await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_capability");
    }

    // The identity survives a restart (the key is kept in the data directory).
    let app = app.restart().await;
    let again: Value = app.http.get(app.url("/v1/identity")).send().await.unwrap().json().await.unwrap();
    assert_eq!(again["hash"], server);
}

async fn minting_is_for_admins(backend: Backend) {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let secret = "identity-test-secret-of-enough-bytes-for-hs256";
    let app = spawn_app_with(backend, |s| s.jwt_hs256_secret = Some(secret.into())).await;
    let token = |admin: bool| {
        let claims = json!({"sub": "someone", "exp": chrono::Utc::now().timestamp() + 600, "admin": admin});
        encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap()).unwrap()
    };
    let request = json!({"grantee": format!("sha256:{}", "cd".repeat(32)), "grants": [{"handler": "system/tree", "operations": ["get"], "resources": ["**"]}]});
    let r = app.http.post(app.url("/v1/admin/capabilities")).bearer_auth(token(false)).json(&request).send().await.unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "admin_only");
    let r = app.http.post(app.url("/v1/admin/capabilities")).bearer_auth(token(true)).json(&request).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // The identity itself is public, like /health.
    assert_eq!(app.http.get(app.url("/v1/identity")).send().await.unwrap().status(), 200);
}
