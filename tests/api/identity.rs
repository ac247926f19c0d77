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
    let app = spawn_app_with(backend, |s| s.http.public_url = "https://tidings.example:8443/".into()).await;
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
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(secret.into())).await;
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

/// Every process of a deployment is one server: with the identity from
/// `TIDINGS_SERVER_KEY_FILE` (a key made as the deploy docs say, `openssl
/// genpkey -algorithm ed25519`), two processes on one database answer the
/// same `/v1/identity`, and a subscription whose deliver token names the
/// server as one process showed it is taken by the other. On PostgreSQL with
/// the key file, nothing is written to the data directory: one that cannot
/// be created changes nothing (a read-only root filesystem). A process with
/// an identity of its own (no key file) is another server, and refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_sharing_a_key_file_are_one_server() {
    use crate::helpers::federation::{Peer, Subscribe, execute_at, inbox_grant};
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("server.key");
    let made = std::process::Command::new("openssl").args(["genpkey", "-algorithm", "ed25519", "-out"]).arg(&key).output().unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let (mut envs, _data) = crate::helpers::process_store(Backend::Postgres).await;
    envs.retain(|(k, _)| *k != "TIDINGS_DATA_DIR");
    let own_identity = envs.clone();
    envs.push(("TIDINGS_SERVER_KEY_FILE", key.display().to_string()));
    // Not creatable, even by root.
    envs.push(("TIDINGS_DATA_DIR", "/proc/tidings-no-data-dir-here".to_owned()));
    let (a, b) = (crate::helpers::spawn_process(&envs).await, crate::helpers::spawn_process(&envs).await);
    let http = reqwest::Client::new();
    let identity = |base: String| {
        let http = http.clone();
        async move {
            http.get(format!("{base}/v1/identity")).send().await.unwrap().json::<Value>().await.unwrap()["hash"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let server = identity(a.base.clone()).await;
    assert_eq!(identity(b.base.clone()).await, server, "one identity on both processes");
    let subscribe_at = |base: String, author: &Peer, pattern: &'static str| {
        let mut included = serde_json::Map::new();
        let token = author.grant(&server, inbox_grant("system/inbox/mine"), None, &mut included);
        let params = json!({"deliver_to": {"uri": "system/inbox/mine"}, "deliver_token": token});
        let envelope = Subscribe { author, pattern, params, capability: None, included }.envelope("subscribe");
        let http = http.clone();
        async move { execute_at(&http, &base, &envelope).await }
    };
    let subscriber = Peer::new();
    let (status, body) = subscribe_at(b.base.clone(), &subscriber, "sensors/**").await;
    assert_eq!(status, 200, "B takes a deliver token granted to the server A showed: {body}");
    // A process with its own identity is another server.
    let mut other_envs = own_identity;
    let other_dir = tempfile::tempdir().unwrap();
    other_envs.push(("TIDINGS_DATA_DIR", other_dir.path().display().to_string()));
    let other = crate::helpers::spawn_process(&other_envs).await;
    assert_ne!(identity(other.base.clone()).await, server);
    let (status, body) = subscribe_at(other.base.clone(), &subscriber, "rooms/**").await;
    assert_eq!((status, crate::helpers::federation::code(&body)), (403, "deliver_token_insufficient"), "{body}");
}
