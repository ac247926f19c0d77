//! Acting as peers and subscribers: identities that sign ([`Peer`]), signed
//! EXECUTEs and what they answer, subscribing and reading an inbox, and
//! whole `tidings` processes that can be killed and started again
//! ([`Server`]), with third-party deliveries between them.

use std::ops::ControlFlow;
use std::time::Duration;

use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::{Map, Value, json};
use tidings_protocol::tree::capability::hash_of;

use super::{Backend, Process, Stream, TestApp, free_port, gather, process_store, spawn_process_at};

/// A peer: an Ed25519 key and its `system/identity` entity.
pub(crate) struct Peer {
    key: SigningKey,
    pub(crate) entity: Value,
    pub(crate) hash: String,
}

impl Peer {
    /// The identity whose key is the PKCS#8 PEM at `path` (a server's key
    /// file: the test then acts as that server).
    pub(crate) fn from_key_file(path: &std::path::Path) -> Self {
        use ed25519_dalek::pkcs8::DecodePrivateKey as _;
        let key = SigningKey::from_pkcs8_pem(&std::fs::read_to_string(path).unwrap()).unwrap();
        let public = base64::engine::general_purpose::STANDARD.encode(key.verifying_key().as_bytes());
        let entity = json!({"type": "system/identity", "data": {"algorithm": "ed25519", "public_key": public}});
        let hash = hash_of(&entity).unwrap();
        Peer { key, entity, hash }
    }

    pub(crate) fn new() -> Self {
        let (key, entity, hash) = crate::helpers::ed25519_identity();
        Peer { key, entity, hash }
    }

    /// Adds this identity and its signature over `target` to `included`.
    pub(crate) fn sign_into(&self, target: &str, included: &mut Map<String, Value>) {
        let sig = base64::engine::general_purpose::STANDARD.encode(self.key.sign(target.as_bytes()).to_bytes());
        let signature =
            json!({"type": "system/signature", "data": {"target": target, "signer": self.hash, "algorithm": "ed25519", "signature": sig}});
        included.insert(hash_of(&signature).unwrap(), signature);
        included.insert(self.hash.clone(), self.entity.clone());
    }

    /// A token from this peer to `grantee` (an identity hash), signed, with
    /// its signature in `included`; returns its hash.
    pub(crate) fn grant(&self, grantee: &str, grants: Value, parent: Option<&str>, included: &mut Map<String, Value>) -> String {
        let mut data = json!({"granter": self.hash, "grantee": grantee, "grants": grants});
        if let Some(p) = parent {
            data["parent"] = json!(p);
        }
        self.sign_token(data, included)
    }

    /// A token that expires at `expires_at` (Unix ms).
    pub(crate) fn grant_until(&self, grantee: &str, grants: Value, expires_at: i64, included: &mut Map<String, Value>) -> String {
        self.sign_token(json!({"granter": self.hash, "grantee": grantee, "grants": grants, "expires_at": expires_at}), included)
    }

    pub(crate) fn sign_token(&self, data: Value, included: &mut Map<String, Value>) -> String {
        let token = json!({"type": "system/capability/token", "data": data});
        let hash = hash_of(&token).unwrap();
        self.sign_into(&hash, included);
        included.insert(hash.clone(), token);
        hash
    }
}

pub(crate) fn inbox_grant(inbox: &str) -> Value {
    json!([{"handler": "system/inbox", "operations": ["receive"], "resources": [inbox]}])
}

/// The server's identity hash.
pub(crate) async fn server_hash(app: &TestApp) -> String {
    let id: Value = app.http.get(app.url("/v1/identity")).send().await.unwrap().json().await.unwrap();
    id["hash"].as_str().unwrap().to_owned()
}

/// A server-rooted caller capability for `grantee` (minted through the admin
/// endpoint, as an operator would), merged into `included`.
pub(crate) async fn caller_capability(app: &TestApp, grantee: &Peer, grants: Value, included: &mut Map<String, Value>) -> String {
    let r =
        app.http.post(app.url("/v1/admin/capabilities")).json(&json!({"grantee": grantee.hash, "grants": grants})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let minted: Value = r.json().await.unwrap();
    included.extend(minted["included"].as_object().unwrap().clone());
    minted["hash"].as_str().unwrap().to_owned()
}

/// A subscribe EXECUTE by `author`.
pub(crate) struct Subscribe<'a> {
    pub(crate) author: &'a Peer,
    pub(crate) pattern: &'a str,
    pub(crate) params: Value,
    pub(crate) capability: Option<String>,
    pub(crate) included: Map<String, Value>,
}

impl Subscribe<'_> {
    pub(crate) fn envelope(mut self, operation: &str) -> Value {
        let (kind, target) = if operation == "subscribe" {
            ("system/subscription/request", json!({"targets": [self.pattern]}))
        } else {
            ("system/subscription/cancel", json!({"targets": []}))
        };
        let mut data = json!({
            "request_id": hex::encode(rand::random::<[u8; 8]>()),
            "uri": "system/subscription",
            "operation": operation,
            "resource": target,
            "params": {"type": kind, "data": self.params},
            "author": self.author.hash,
        });
        if let Some(c) = &self.capability {
            data["capability"] = json!(c);
        }
        let execute = json!({"type": "system/protocol/execute", "data": data});
        self.author.sign_into(&hash_of(&execute).unwrap(), &mut self.included);
        json!({"execute": execute, "included": self.included})
    }
}

pub(crate) async fn execute(app: &TestApp, envelope: &Value) -> (u16, Value) {
    execute_at(&app.http, &app.base, envelope).await
}

pub(crate) async fn execute_at(http: &reqwest::Client, base: &str, envelope: &Value) -> (u16, Value) {
    let r = http.post(format!("{base}/v1/execute")).json(envelope).send().await.unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], status, "the body carries the handler's status: {body}");
    (status, body)
}

pub(crate) fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

/// Subscribes `author` to `pattern` with delivery to `inbox` (a deliver token
/// from the author to the server); returns the answer.
pub(crate) async fn subscribe(app: &TestApp, server: &str, author: &Peer, pattern: &str, inbox: &str, extra: Value) -> (u16, Value) {
    let mut included = Map::new();
    // Every call mints a fresh token (a later expiry), as a renewing client would.
    let token = author.grant_until(
        server,
        inbox_grant(inbox),
        chrono::Utc::now().timestamp_millis() + 3_600_000 + rand::random::<u16>() as i64,
        &mut included,
    );
    let mut params = json!({"deliver_to": {"uri": inbox}, "deliver_token": token});
    params.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    execute(app, &Subscribe { author, pattern, params, capability: None, included }.envelope("subscribe")).await
}

/// Subscribes `author` as a relaying mirror does: into the mirror inbox
/// `name` on its own server, entities bundled, saying it relays at
/// `claimed`; the admin has written `author`'s endpoint as `known`.
pub(crate) async fn subscribe_as_mirror(
    app: &TestApp,
    server: &str,
    author: &Peer,
    pattern: &str,
    name: &str,
    known: &str,
    claimed: &str,
) -> (u16, Value) {
    let peer = json!({"type": "system/peer", "data": {"endpoint": known}});
    let r = app.http.put(app.url(&format!("/v1/tree/system/peer/{}", author.hash))).json(&peer).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let inbox = format!("system/inbox/mirror/{name}");
    let mut included = Map::new();
    let token = author.grant_until(
        server,
        inbox_grant(&inbox),
        chrono::Utc::now().timestamp_millis() + 3_600_000 + rand::random::<u16>() as i64,
        &mut included,
    );
    let params = json!({
        "deliver_to": {"uri": format!("entity://{}/{inbox}", author.hash)}, "deliver_token": token,
        "include_payload": true, "relay_endpoint": claimed,
    });
    execute(app, &Subscribe { author, pattern, params, capability: None, included }.envelope("subscribe")).await
}

pub(crate) async fn unsubscribe(app: &TestApp, author: &Peer, id: &str) -> (u16, Value) {
    let params = json!({"subscription_id": id});
    execute(app, &Subscribe { author, pattern: "", params, capability: None, included: Map::new() }.envelope("unsubscribe")).await
}

pub(crate) async fn put(app: &TestApp, path: &str, data: Value, chain: Option<&str>) -> Value {
    let mut r = app.http.put(app.url(&format!("/v1/tree/{path}"))).json(&json!({"type": "note", "data": data}));
    if let Some(c) = chain {
        r = r.header("x-chain-id", c);
    }
    let r = r.send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap()
}

pub(crate) async fn tree_status(app: &TestApp, path: &str) -> u16 {
    app.http.get(app.url(&format!("/v1/tree/{path}"))).send().await.unwrap().status().as_u16()
}

pub(crate) async fn children(app: &TestApp, dir: &str) -> Vec<String> {
    let list: Value = app.http.get(app.url(&format!("/v1/tree/{dir}/"))).send().await.unwrap().json().await.unwrap();
    list["children"].as_array().map(|c| c.iter().map(|c| c["name"].as_str().unwrap().to_owned()).collect()).unwrap_or_default()
}

/// The notifications delivered to `inbox`, read as its owner would.
pub(crate) async fn inbox(app: &TestApp, inbox: &str) -> Stream {
    app.stream(&format!("?types=subscription.notification&targets={inbox}"), None).await
}

pub(crate) async fn next_notification(stream: &mut Stream) -> Value {
    loop {
        let e = stream.next().await;
        if e.event.is_none() {
            let envelope: Value = serde_json::from_str(&e.data).unwrap();
            return envelope["payload"].clone();
        }
    }
}

/// A server process that can be killed and started again on the same port
/// and store.
pub(crate) struct Server {
    process: Process,
    envs: Vec<(&'static str, String)>,
    port: u16,
    pub(crate) hash: String,
    pub(crate) http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Server {
    pub(crate) async fn start(backend: Backend) -> Server {
        Self::start_with(backend, &[]).await
    }

    pub(crate) async fn start_with(backend: Backend, extra: &[(&'static str, &str)]) -> Server {
        let (mut envs, dir) = process_store(backend).await;
        envs.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        let port = free_port();
        let process = spawn_process_at(&envs, port).await;
        let http = reqwest::Client::new();
        let id: Value = http.get(format!("{}/v1/identity", process.base)).send().await.unwrap().json().await.unwrap();
        let hash = id["hash"].as_str().unwrap().to_owned();
        Server { process, envs, port, hash, http, _dir: dir }
    }

    /// The server's key file (its identity).
    pub(crate) fn key_file(&self) -> std::path::PathBuf {
        self._dir.path().join("server.key")
    }

    pub(crate) fn base(&self) -> &str {
        &self.process.base
    }

    /// SIGKILL: no shutdown, no flush beyond what was committed.
    pub(crate) async fn kill(&mut self) {
        self.process.child.kill().await.unwrap();
    }

    /// Sends `signal` (`-STOP`, `-CONT`, …) to the process.
    pub(crate) async fn signal(&self, signal: &str) {
        let pid = self.process.child.id().expect("a running process").to_string();
        let status = tokio::process::Command::new("kill").args([signal, &pid]).status().await.unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    pub(crate) async fn restart(&mut self) {
        self.process = spawn_process_at(&self.envs, self.port).await;
    }

    /// Its data directory.
    pub(crate) fn data_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// Its PostgreSQL database, if it runs on one.
    pub(crate) fn database_url(&self) -> Option<&str> {
        self.envs.iter().find(|(k, _)| *k == "DATABASE_URL").map(|(_, v)| v.as_str())
    }

    /// Runs on the database `url` from the next restart (a restored one).
    pub(crate) fn use_database(&mut self, url: &str) {
        for (k, v) in &mut self.envs {
            if *k == "DATABASE_URL" {
                *v = url.to_owned();
            }
        }
    }

    /// Tells this server where `other` is.
    pub(crate) async fn knows(&self, other: &Server) {
        self.knows_at(&other.hash, other.base()).await;
    }

    /// Tells this server that peer `hash` is at `endpoint`.
    pub(crate) async fn knows_at(&self, hash: &str, endpoint: &str) {
        let r = self
            .http
            .put(format!("{}/v1/tree/system/peer/{hash}", self.base()))
            .json(&json!({"type": "system/peer", "data": {"endpoint": endpoint}}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }

    /// Writes a note in causal chain `chain`; returns its hash.
    pub(crate) async fn put_in_chain(&self, path: &str, data: Value, chain: &str) -> String {
        let r = self
            .http
            .put(format!("{}/v1/tree/{path}", self.base()))
            .header("x-chain-id", chain)
            .json(&json!({"type": "note", "data": data}))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        r.json::<Value>().await.unwrap()["hash"].as_str().unwrap().to_owned()
    }

    /// Waits (bounded, on the log) for a chain-error marker of `chain` to be
    /// bound; returns its path.
    pub(crate) async fn marker(&self, chain: &str) -> String {
        let prefix = format!("system/runtime/chain-errors/lost/{chain}/");
        let prefix = &prefix;
        gather(
            Duration::from_secs(30),
            0,
            |_| format!("no marker for chain {chain}"),
            |since: i64| async move {
                let url = format!("{}/v1/poll?types=tree.created&since={since}&limit=1000&wait_ms=5000", self.base());
                let r: Value = self.http.get(url).send().await.unwrap().json().await.unwrap();
                for e in r["events"].as_array().unwrap() {
                    if let Some(path) = e["payload"]["uri"].as_str().filter(|p| p.starts_with(prefix.as_str())) {
                        return ControlFlow::Break(path.to_owned());
                    }
                }
                ControlFlow::Continue(r["next_since"].as_i64().unwrap_or(since))
            },
        )
        .await
    }

    /// A token rooted at this server for `grantee`, minted by its admin.
    pub(crate) async fn mint(&self, grantee: &str, grants: Value, expires_at: i64, included: &mut Map<String, Value>) -> String {
        let body = json!({"grantee": grantee, "grants": grants, "expires_at": expires_at});
        let r = self.http.post(format!("{}/v1/admin/capabilities", self.base())).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let minted: Value = r.json().await.unwrap();
        included.extend(minted["included"].as_object().unwrap().clone());
        minted["hash"].as_str().unwrap().to_owned()
    }

    /// Writes a note; returns its hash.
    pub(crate) async fn put(&self, path: &str, data: Value) -> String {
        let r = self.http.put(format!("{}/v1/tree/{path}", self.base())).json(&json!({"type": "note", "data": data})).send().await.unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        r.json::<Value>().await.unwrap()["hash"].as_str().unwrap().to_owned()
    }

    /// The envelopes in `inbox` after `since`, long-polling up to `wait_ms`.
    pub(crate) async fn inbox(&self, inbox: &str, since: i64, wait_ms: u32) -> Vec<Value> {
        let url =
            format!("{}/v1/poll?types=subscription.notification&targets={inbox}&since={since}&limit=1000&wait_ms={wait_ms}", self.base());
        let r: Value = self.http.get(url).send().await.unwrap().json().await.unwrap();
        r["events"].as_array().unwrap().clone()
    }

    /// Waits (bounded) until `inbox` holds at least `n` notifications; returns them all.
    pub(crate) async fn inbox_until(&self, inbox: &str, n: usize) -> Vec<Value> {
        let what = |got: &Vec<Value>| format!("{} of {n} notifications arrived", got.len());
        gather(Duration::from_secs(90), Vec::new(), what, |mut got: Vec<Value>| async move {
            if got.len() < n {
                let since = got.last().map_or(0, |e| e["event_id"].as_i64().unwrap());
                got.extend(self.inbox(inbox, since, 5_000).await);
            }
            if got.len() >= n { ControlFlow::Break(got) } else { ControlFlow::Continue(got) }
        })
        .await
    }

    pub(crate) async fn metric(&self, series: &str) -> f64 {
        let text = self.http.get(format!("{}/metrics", self.base())).send().await.unwrap().text().await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    pub(crate) async fn deep(&self) -> Value {
        self.http.get(format!("{}/health/deep", self.base())).send().await.unwrap().json().await.unwrap()
    }

    pub(crate) async fn head(&self) -> i64 {
        let r: Value = self.http.get(format!("{}/health/deep", self.base())).send().await.unwrap().json().await.unwrap();
        r["head_event_id"].as_i64().unwrap()
    }
}

/// A subscriber (not a server) subscribes on `b` to `pattern`, delivering
/// to `c`'s `inbox`: C's admin mints the subscriber a token rooted at C, and
/// the subscriber delegates it to B (third-party delivery:
/// docs/ref-subscriptions.md, "Deliver tokens").
pub(crate) async fn subscribe_third_party(a: &Peer, b: &Server, c: &Server, pattern: &str, inbox: &str) -> (u16, Value) {
    subscribe_third_party_at(a, (&b.http, b.base(), &b.hash), c, pattern, inbox).await
}

/// [`subscribe_third_party`] on a server `b` given as its client, base
/// URL and identity hash (processes that are not a [`Server`]).
pub(crate) async fn subscribe_third_party_at(
    a: &Peer,
    (http, base, hash): (&reqwest::Client, &str, &str),
    c: &Server,
    pattern: &str,
    inbox: &str,
) -> (u16, Value) {
    let mut included = Map::new();
    let expires = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let root = c.mint(&a.hash, inbox_grant(inbox), expires, &mut included).await;
    let leaf = a.grant(hash, inbox_grant(inbox), Some(&root), &mut included);
    let params = json!({"deliver_to": {"uri": format!("entity://{}/{inbox}", c.hash)}, "deliver_token": leaf});
    execute_at(http, base, &Subscribe { author: a, pattern, params, capability: None, included }.envelope("subscribe")).await
}

/// A delivery as a server `sender` would send it, for `inbox` at `to`.
pub(crate) fn delivery(
    sender: &Peer,
    to: &Server,
    inbox: &str,
    token: &str,
    seq: i64,
    data: Value,
    mut included: Map<String, Value>,
) -> Value {
    let uri = format!("entity://{}/{inbox}", to.hash);
    let execute = json!({"type": "system/protocol/execute", "data": {
        "request_id": format!("r-{seq}"),
        "uri": uri,
        "operation": "receive",
        "resource": {"targets": [uri]},
        "params": {"type": "system/subscription/notification", "data": data},
        "author": sender.hash,
        "capability": token,
        "sequence": seq,
    }});
    sender.sign_into(&hash_of(&execute).unwrap(), &mut included);
    json!({"execute": execute, "included": included})
}

/// A sending server's key and the deliver token `c` minted it for `inbox`
/// (valid for an hour), with the token's chain to include.
pub(crate) async fn granted_sender(c: &Server, inbox: &str) -> (Peer, String, Map<String, Value>) {
    let sender = Peer::new();
    let expires = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let mut granted = Map::new();
    let token = c.mint(&sender.hash, inbox_grant(inbox), expires, &mut granted).await;
    (sender, token, granted)
}
