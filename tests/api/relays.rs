//! What a mirror applies is what its source wrote (issue 35, item 2):
//! every change a notification bundles is signed by the server that wrote
//! it, relays forward that signature unchanged, and a mirror refuses what
//! its source did not sign, what is older than what it holds, and leaves a
//! relay that forged or withheld a change. The malicious relay here is a
//! real listener of the test's that holds a real relaying mirror
//! subscription at the source (so the source offers it) and speaks the
//! peer protocol by hand.

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use tidings_protocol::tree::capability::{Included, hash_of, verify_signed};

use crate::both_stores;
use crate::helpers::federation::{Peer, Subscribe, execute_at, inbox_grant, server_hash};
use crate::helpers::federation::{Server, delivery};
use crate::helpers::mirrors::{PATH, entity, mirror_of, mirror_state};
use crate::helpers::{Backend, spawn_app};
use crate::helpers::{eventually, gather};

both_stores!(
    a_notification_carries_the_source_signature,
    a_relay_forwards_the_origin_signature_unchanged,
    a_relay_can_neither_forge_nor_roll_back,
    a_relay_cannot_roll_back_a_restarted_mirror,
    a_withholding_relay_is_detected_and_left,
);

/// The signed changes (`system/tree/change`) a notification's payload carries.
fn signed_changes(payload: &Value) -> Vec<(String, Value)> {
    let hashes = payload["data"]["signed"].as_array().cloned().unwrap_or_default();
    hashes
        .iter()
        .filter_map(|h| {
            let h = h.as_str()?;
            Some((h.to_owned(), payload["included"][h].clone()))
        })
        .collect()
}

/// `payload`'s included entities, as the verifier reads them.
fn included_of(payload: &Value) -> Included {
    payload["included"].as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default()
}

async fn a_notification_carries_the_source_signature(backend: Backend) {
    let app = spawn_app(backend).await;
    let server = server_hash(&app).await;
    let subscriber = Peer::new();
    let inbox = "system/inbox/signed";
    let mut included = Map::new();
    let token = subscriber.grant(&server, inbox_grant(inbox), None, &mut included);
    let params = json!({"deliver_to": {"uri": inbox}, "deliver_token": token, "include_payload": true});
    let envelope = Subscribe { author: &subscriber, pattern: "docs/**", params, capability: None, included }.envelope("subscribe");
    let (status, body) = execute_at(&app.http, &app.base, &envelope).await;
    assert_eq!(status, 200, "{body}");
    let r = app.http.put(app.url("/v1/tree/docs/a")).json(&json!({"type": "note", "data": {"v": 1}})).send().await.unwrap();
    assert!(r.status().is_success());
    let written: Value = r.json().await.unwrap();
    let got = app.http.get(app.url("/v1/tree/docs/a")).send().await.unwrap();
    let change_id: i64 = got.headers()["tidings-change-id"].to_str().unwrap().parse().unwrap();
    assert_eq!(change_id, written["event_id"].as_i64().unwrap(), "a read names the change that wrote the entity");
    let (app, inbox) = (&app, &inbox);
    let notification = gather(
        std::time::Duration::from_secs(30),
        (),
        |_| "the notification arrives".into(),
        |_| async move {
            let url = app.url(&format!("/v1/poll?types=subscription.notification&targets={inbox}&since=0&limit=10&wait_ms=1000"));
            let page: Value = app.http.get(url).send().await.unwrap().json().await.unwrap();
            match page["events"].as_array().and_then(|e| e.first()) {
                Some(e) => ControlFlow::Break(e["payload"].clone()),
                None => ControlFlow::Continue(()),
            }
        },
    )
    .await;
    let signed = signed_changes(&notification);
    assert_eq!(signed.len(), 1, "the server's own signature: {notification}");
    let (hash, change) = &signed[0];
    assert_eq!(change["type"], "system/tree/change");
    assert_eq!(
        change["data"],
        json!({"origin": server, "uri": "docs/a", "hash": written["hash"], "sequence": change_id}),
        "it signs the origin, the transition and its log id"
    );
    assert_eq!(hash_of(change).unwrap(), *hash);
    assert_eq!(verify_signed(&included_of(&notification), hash, &server), Ok(()), "signed by the server");
}

async fn a_relay_forwards_the_origin_signature_unchanged(backend: Backend) {
    // The source takes one subscriber: the second mirror is redirected to
    // the first, which relays.
    let source = Server::start_with(backend, &[("TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", "1")]).await;
    let relay = Server::start(backend).await;
    mirror_of(&relay, &source, "feeds").await;
    eventually("the relay subscribes", || async { mirror_state(&relay, "feeds").await["state"] == "subscribed" }).await;
    let leaf = Server::start(backend).await;
    mirror_of(&leaf, &source, "feeds").await;
    eventually("the leaf attaches through the relay", || async { mirror_state(&leaf, "feeds").await["upstream"] == relay.hash.as_str() })
        .await;
    let mut latest = String::new();
    for i in 0..5 {
        latest = source.put(PATH, json!({"n": i})).await;
    }
    eventually("the leaf holds the source's latest", || async {
        entity(&leaf).await.is_some_and(|e| hash_of(&serde_json::from_str(&e).unwrap()).unwrap() == latest)
    })
    .await;
    let arrived = leaf.inbox("system/inbox/mirror/feeds", 0, 0).await;
    assert_eq!(arrived.len(), 5, "one notification per write");
    for n in &arrived {
        assert_eq!(n["agent"]["id"], relay.hash.as_str(), "delivered by the relay");
        let signed = signed_changes(&n["payload"]);
        let origins: Vec<&str> = signed.iter().filter_map(|(_, c)| c["data"]["origin"].as_str()).collect();
        assert_eq!(origins, [relay.hash.as_str(), source.hash.as_str()], "the relay's own and the source's, forwarded: {n}");
        let (hash, _) = &signed[1];
        assert_eq!(verify_signed(&included_of(&n["payload"]), hash, &source.hash), Ok(()), "the source's signature verifies at the leaf");
    }
    let applied = leaf.metric("tidings_mirror_applies_total{outcome=\"applied\"}").await;
    assert_eq!(applied, 5.0, "applied from the relayed bytes, none re-read");
}

/// A relay of the attacker's: holds a relaying mirror subscription at the
/// source, takes the subscribe of a mirror the source redirects to it, and
/// records what the source delivers.
struct EvilRelay {
    peer: Arc<Peer>,
    base: String,
    state: Arc<Mutex<EvilState>>,
}

#[derive(Default)]
struct EvilState {
    /// The deliver token (and its chain) the mirror subscribed with.
    token: Option<(String, Map<String, Value>)>,
    /// What the source delivered: the notification payload data and its included.
    received: Vec<(Value, Map<String, Value>)>,
    /// Every request, in order.
    requests: usize,
}

impl EvilRelay {
    async fn start(source: &Server) -> EvilRelay {
        let peer = Arc::new(Peer::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(EvilState::default()));
        let (hash, seen) = (peer.hash.clone(), state.clone());
        let identity = axum::routing::get(move || {
            let hash = hash.clone();
            async move { axum::Json(json!({"hash": hash})) }
        });
        let execute = axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                let data = &body["execute"]["data"];
                let included = body["included"].as_object().cloned().unwrap_or_default();
                let mut state = seen.lock().unwrap();
                state.requests += 1;
                let result = match data["operation"].as_str() {
                    Some("subscribe") => {
                        let token = data["params"]["data"]["deliver_token"].as_str().unwrap_or_default().to_owned();
                        state.token = Some((token, included));
                        json!({"subscription_id": "held-by-the-relay"})
                    }
                    Some("receive") => {
                        state.received.push((data["params"]["data"].clone(), included));
                        json!({"event_id": state.received.len(), "duplicate": false})
                    }
                    _ => Value::Null,
                };
                axum::Json(json!({"status": 200, "result": result}))
            }
        });
        let app = axum::Router::new().route("/v1/identity", identity).route("/v1/execute", execute);
        tokio::spawn(async move { axum::serve(listener, app).await });
        // Its relaying mirror subscription at the source (entities
        // bundled, into its own mirror inbox): the source learns it by
        // its endpoint, proven.
        let inbox = "system/inbox/mirror/loot";
        let mut included = Map::new();
        let expires = chrono::Utc::now().timestamp_millis() + 3_600_000;
        let token = peer.grant_until(&source.hash, inbox_grant(inbox), expires, &mut included);
        let params = json!({
            "deliver_to": {"uri": format!("entity://{}/{inbox}", peer.hash)}, "deliver_token": token,
            "include_payload": true, "relay_endpoint": base,
        });
        let envelope = Subscribe { author: &peer, pattern: "feeds/**", params, capability: None, included }.envelope("subscribe");
        let (status, body) = execute_at(&source.http, source.base(), &envelope).await;
        assert_eq!(status, 200, "{body}");
        EvilRelay { peer, base, state }
    }

    /// Waits until the source delivered `n` notifications here.
    async fn received(&self, n: usize) -> Vec<(Value, Map<String, Value>)> {
        eventually(&format!("the source delivers {n} notifications to the relay"), || async {
            self.state.lock().unwrap().received.len() >= n
        })
        .await;
        self.state.lock().unwrap().received.clone()
    }

    /// Delivers `data` (with `extra` included) to `mirror`'s inbox as its
    /// upstream, at delivery sequence `seq`; the answer's status.
    async fn deliver(&self, mirror: &Server, seq: i64, data: Value, extra: Map<String, Value>) -> u16 {
        let (token, mut included) = self.state.lock().unwrap().token.clone().expect("the mirror subscribed here");
        included.extend(extra);
        let envelope = delivery(&self.peer, mirror, "system/inbox/mirror/feeds", &token, seq, data, included);
        let (status, _) = execute_at(&mirror.http, mirror.base(), &envelope).await;
        status
    }
}

/// A source that takes one subscriber (the evil relay), and a mirror of it
/// redirected to the relay.
async fn attacked(backend: Backend, extra: &[(&'static str, &str)]) -> (Server, EvilRelay, Server) {
    let source = Server::start_with(backend, &[("TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", "1")]).await;
    let evil = EvilRelay::start(&source).await;
    let mirror = Server::start_with(backend, extra).await;
    mirror_of(&mirror, &source, "feeds").await;
    eventually("the source redirects the mirror to the relay", || async {
        let state = mirror_state(&mirror, "feeds").await;
        state["state"] == "subscribed" && state["upstream"] == evil.peer.hash.as_str()
    })
    .await;
    assert!(evil.state.lock().unwrap().token.is_some());
    (source, evil, mirror)
}

async fn outcome(server: &Server, outcome: &str) -> f64 {
    server.metric(&format!("tidings_mirror_applies_total{{outcome=\"{outcome}\"}}")).await
}

async fn a_relay_can_neither_forge_nor_roll_back(backend: Backend) {
    let (source, evil, mirror) = attacked(backend, &[]).await;
    // The source writes A, B, then A again; the relay forwards all three
    // faithfully (as the source delivered them, signatures included).
    let a = json!({"n": "a"});
    let hash_a = source.put(PATH, a.clone()).await;
    let hash_b = source.put(PATH, json!({"n": "b"})).await;
    assert_eq!(source.put(PATH, a).await, hash_a);
    let received = evil.received(3).await;
    for (seq, (data, included)) in received.iter().enumerate() {
        assert_eq!(evil.deliver(&mirror, seq as i64 + 1, data.clone(), included.clone()).await, 200);
    }
    eventually("the mirror applies the three", || async { outcome(&mirror, "applied").await == 3.0 }).await;
    let holds = |hash: String| {
        let mirror = &mirror;
        async move { entity(mirror).await.is_some_and(|e| hash_of(&serde_json::from_str(&e).unwrap()).unwrap() == hash) }
    };
    assert!(holds(hash_a.clone()).await);

    // 1. A replay of the source's own signed A → B: the mirror holds A, so
    // the compare-and-set alone would take it; its sequence is older than
    // what the mirror holds.
    let (data, included) = received[1].clone();
    assert_eq!(data["previous_hash"], hash_a.as_str());
    assert_eq!(data["hash"], hash_b.as_str());
    assert_eq!(evil.deliver(&mirror, 10, data, included).await, 200);
    eventually("the replay is refused", || async { outcome(&mirror, "rollback_refused").await == 1.0 }).await;
    assert!(holds(hash_a.clone()).await, "rolled back to B");

    // The same signed update passed off as a deletion: refused at the
    // door (a deletion names no entity), nothing changes.
    let (mut data, included) = received[1].clone();
    data["event"] = json!("deleted");
    assert_eq!(evil.deliver(&mirror, 9, data, included).await, 400);
    assert!(holds(hash_a.clone()).await, "deleted on the word of a relay");

    // 2. Bytes the source never wrote, unsigned: not applied; the path is
    // read at the source instead, which holds A.
    let forged = json!({"type": "note", "data": {"n": "forged"}});
    let forged_hash = hash_of(&forged).unwrap();
    let mut extra = Map::new();
    extra.insert(forged_hash.clone(), forged.clone());
    let data = json!({"subscription_id": "s", "event": "updated", "uri": PATH, "hash": forged_hash, "previous_hash": hash_a});
    assert_eq!(evil.deliver(&mirror, 11, data.clone(), extra.clone()).await, 200);
    eventually("the unsigned change is settled from the source", || async { outcome(&mirror, "stale_rejected").await >= 1.0 }).await;
    assert!(holds(hash_a.clone()).await, "the unsigned bytes were applied");

    // 3. The same bytes under a change that names the source as its
    // origin, signed by the relay: refused, and the relay is left.
    let change = json!({"type": "system/tree/change", "data": {
        "origin": source.hash, "uri": PATH, "hash": forged_hash, "previous_hash": hash_a, "sequence": 1_000_000}});
    let change_hash = hash_of(&change).unwrap();
    let mut signed = Map::new();
    evil.peer.sign_into(&change_hash, &mut signed);
    for (_, v) in signed.iter_mut() {
        if v["type"] == "system/signature" {
            v["data"]["signer"] = json!(source.hash);
        }
    }
    let mut extra: Map<String, Value> = signed.into_iter().map(|(_, v)| (hash_of(&v).unwrap(), v)).collect();
    extra.insert(change_hash.clone(), change);
    extra.insert(forged_hash.clone(), forged);
    // The source's identity, as a relay would copy it.
    let identity = &received[0].1[&source.hash];
    extra.insert(source.hash.clone(), identity.clone());
    let mut data = data;
    data["signed"] = json!([change_hash]);
    assert_eq!(evil.deliver(&mirror, 12, data, extra).await, 200);
    eventually("the forgery is refused", || async { outcome(&mirror, "forged_refused").await == 1.0 }).await;
    assert!(holds(hash_a.clone()).await, "the forged bytes were applied");
    eventually("the mirror leaves the relay", || async {
        mirror.metric("tidings_mirror_relays_left_total{mirror=\"feeds\"}").await == 1.0
            && mirror_state(&mirror, "feeds").await["upstream"] != evil.peer.hash.as_str()
    })
    .await;
    // Whatever it sends now is foreign.
    let ignored = outcome(&mirror, "foreign_ignored").await;
    let (data, included) = received[1].clone();
    assert_eq!(evil.deliver(&mirror, 13, data, included).await, 200);
    eventually("later deliveries of the relay are ignored", || async { outcome(&mirror, "foreign_ignored").await > ignored }).await;
    assert!(holds(hash_a).await);
}

/// After a restart the mirror no longer holds in memory which of the
/// source's changes each path last took, and a deletion leaves nothing in
/// the tree to read it from: a relay that replays the source's own signed
/// creation of a path deleted since must not bring it back. The mirror
/// keeps a mark of the source's log across restarts; a signed change at
/// or below it whose path it knows nothing of is settled by reading the
/// path at the source.
async fn a_relay_cannot_roll_back_a_restarted_mirror(backend: Backend) {
    let (source, evil, mut mirror) = attacked(backend, &[]).await;
    source.put(PATH, json!({"n": "secret, then withdrawn"})).await;
    let r = source.http.delete(format!("{}/v1/tree/{PATH}", source.base())).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let received = evil.received(2).await;
    assert_eq!(received[1].0["event"], "deleted");
    for (seq, (data, included)) in received.iter().enumerate() {
        assert_eq!(evil.deliver(&mirror, seq as i64 + 1, data.clone(), included.clone()).await, 200);
    }
    eventually("the mirror applies the creation and the deletion", || async { outcome(&mirror, "applied").await == 2.0 }).await;
    assert_eq!(entity(&mirror).await, None);

    mirror.kill().await;
    evil.state.lock().unwrap().token = None;
    mirror.restart().await;
    eventually("the restarted mirror is redirected to the relay again", || async {
        mirror_state(&mirror, "feeds").await["upstream"] == evil.peer.hash.as_str() && evil.state.lock().unwrap().token.is_some()
    })
    .await;
    // The replay: the source's signed creation, faithfully forwarded.
    let (data, included) = received[0].clone();
    assert_eq!(evil.deliver(&mirror, 100, data, included).await, 200);
    eventually("the replay is settled", || async { outcome(&mirror, "applied").await + outcome(&mirror, "stale_rejected").await >= 1.0 })
        .await;
    assert_eq!(outcome(&mirror, "stale_rejected").await, 1.0, "read at the source, which holds nothing there");
    assert_eq!(entity(&mirror).await, None, "the relay brought a deleted entity back");
    assert_eq!(outcome(&mirror, "applied").await, 0.0);
}

async fn a_withholding_relay_is_detected_and_left(backend: Backend) {
    let (source, evil, mirror) = attacked(backend, &[("TIDINGS_MIRROR_RECONCILE", "1s")]).await;
    // Known to the mirror: it holds the path (its first reconciliation reads it at the source).
    let first = source.put(PATH, json!({"n": 1})).await;
    let held = |hash: String| {
        let mirror = &mirror;
        async move { entity(mirror).await.is_some_and(|e| hash_of(&serde_json::from_str(&e).unwrap()).unwrap() == hash) }
    };
    // The relay forwards the first write, then nothing.
    let received = evil.received(1).await;
    assert_eq!(evil.deliver(&mirror, 1, received[0].0.clone(), received[0].1.clone()).await, 200);
    eventually("the mirror holds the first write", || held(first.clone())).await;
    let latest = source.put(PATH, json!({"n": 2})).await;
    evil.received(2).await;
    // Reconciliation reads the source, finds the mirror behind, and a
    // round later the relay has still not delivered it: withheld.
    eventually("the mirror catches up from the source", || held(latest.clone())).await;
    eventually("and leaves the relay", || async {
        mirror.metric("tidings_mirror_relays_left_total{mirror=\"feeds\"}").await == 1.0
            && mirror_state(&mirror, "feeds").await["upstream"] != evil.peer.hash.as_str()
    })
    .await;
    assert!(evil.base.starts_with("http://127.0.0.1:"));
}
