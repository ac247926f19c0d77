//! Convergent mirrors between real `tidings` processes
//! (docs/ref-federation.md, "Applying a notification" to "Reconciliation"):
//! for N = 200 external writes at one peer of a chain A→B→C, a pair A⇄B and a
//! ring A→B→C→A, every peer settles at most 1.5 × N writes on the mirrored
//! path and ends holding the source's latest entity byte-identical, with
//! lossless delivery and through a proxy that acknowledges a third of the
//! deliveries without forwarding them. A stale lap replayed to a mirror that
//! moved on changes nothing.

use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tidings_protocol::tree::capability::hash_of;

use crate::both_stores;
use crate::helpers::federation::{Server, inbox_grant};
use crate::helpers::mirrors::*;
use crate::helpers::{Backend, eventually, wait_until};

both_stores!(
    a_chain_converges,
    a_chain_converges_under_loss,
    a_pair_converges,
    a_pair_converges_under_loss,
    a_ring_converges,
    a_ring_converges_under_loss,
    a_stale_lap_changes_nothing,
    a_mirror_renews_its_subscription_and_cancels_it_when_deleted,
    a_mirror_of_a_peer_with_tokens_on_uses_its_capability,
    a_mirror_turned_away_at_capacity_attaches_through_a_relay,
    redirects_build_a_tree_and_a_redirect_loop_ends_with_an_error,
);

/// External writes per drive.
const N: usize = 200;
/// Servers with mirrors along `links` (upstream, downstream), each
/// downstream mirroring `feeds/**` from its upstream; with `loss`, every
/// delivery to a downstream goes through its own lossy proxy.
struct Topology {
    servers: Vec<Server>,
    proxies: Vec<tidings_cli::lossy::LossyProxy>,
}

async fn topology(backend: Backend, count: usize, links: &[(usize, usize)], loss: bool) -> Topology {
    let mut servers = Vec::new();
    for _ in 0..count {
        servers.push(Server::start_with(backend, &[("TIDINGS_MIRROR_RECONCILE", "1s")]).await);
    }
    let mut proxies = Vec::new();
    for &(up, down) in links {
        let (u, d) = (&servers[up], &servers[down]);
        d.knows(u).await;
        let endpoint = if loss {
            // A third of the deliveries acknowledged and never forwarded.
            let proxy = tidings_cli::lossy::start(d.base().to_owned(), 3).await.unwrap();
            let base = proxy.base.clone();
            proxies.push(proxy);
            base
        } else {
            d.base().to_owned()
        };
        u.knows_at(&d.hash, &endpoint).await;
        let mirror = json!({"type": "system/mirror", "data": {"peer": u.hash, "pattern": "feeds/**"}});
        let r = d.http.put(format!("{}/v1/tree/system/mirror/from-{up}", d.base())).json(&mirror).send().await.unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    // Every mirror holds its subscription before the drive starts.
    for &(_, down) in links {
        wait_until("every mirror to subscribe", Duration::from_secs(30), Duration::from_millis(50), || async {
            let deep = servers[down].deep().await;
            let mirrors = deep["mirrors"].as_array().cloned().unwrap_or_default();
            !mirrors.is_empty() && mirrors.iter().all(|m| m["state"] == "subscribed")
        })
        .await;
    }
    Topology { servers, proxies }
}

/// Drives N writes at the first server and checks (i) and (ii) on every
/// server; prints the settle counts and the time to converge.
async fn drive(name: &str, topology: Topology) {
    let source = &topology.servers[0];
    let started = Instant::now();
    for i in 0..N {
        source.put(PATH, json!({"n": i})).await;
    }
    let latest = entity(source).await.expect("the source holds the latest write");
    let mut counts = Vec::new();
    for server in &topology.servers {
        let settled = settle(server, &latest).await;
        counts.push(settled.len());
        assert!(settled.len() <= N * 3 / 2, "{name}: {} settled {} writes for {N} (bound 1.5 × N)", server.base(), settled.len());
        let last = settled.last().unwrap();
        assert_eq!(last["payload"]["hash"].as_str(), Some(hash_of(&serde_json::from_str(&latest).unwrap()).unwrap().as_str()));
    }
    let dropped: usize = topology.proxies.iter().map(|p| p.dropped()).sum();
    eprintln!(
        "mirror drive {name}: settles per peer {counts:?} for N = {N}, converged in {} ms, {dropped} deliveries dropped",
        started.elapsed().as_millis()
    );
    if !topology.proxies.is_empty() {
        assert!(dropped > 0, "the proxies dropped deliveries");
    }
}

const CHAIN: &[(usize, usize)] = &[(0, 1), (1, 2)];
const PAIR: &[(usize, usize)] = &[(0, 1), (1, 0)];
const RING: &[(usize, usize)] = &[(0, 1), (1, 2), (2, 0)];

async fn a_chain_converges(backend: Backend) {
    drive("chain", topology(backend, 3, CHAIN, false).await).await;
}

async fn a_chain_converges_under_loss(backend: Backend) {
    drive("chain, lossy", topology(backend, 3, CHAIN, true).await).await;
}

async fn a_pair_converges(backend: Backend) {
    drive("pair", topology(backend, 2, PAIR, false).await).await;
}

async fn a_pair_converges_under_loss(backend: Backend) {
    drive("pair, lossy", topology(backend, 2, PAIR, true).await).await;
}

async fn a_ring_converges(backend: Backend) {
    drive("ring", topology(backend, 3, RING, false).await).await;
}

async fn a_ring_converges_under_loss(backend: Backend) {
    drive("ring, lossy", topology(backend, 3, RING, true).await).await;
}

async fn a_stale_lap_changes_nothing(backend: Backend) {
    let topology = topology(backend, 2, &[(0, 1)], false).await;
    let (a, b) = (&topology.servers[0], &topology.servers[1]);
    let mut hashes = Vec::new();
    for i in 0..5 {
        hashes.push(a.put(PATH, json!({"n": i})).await);
    }
    let latest = entity(a).await.unwrap();
    let before = settle(b, &latest).await.len();
    assert_eq!(before, 5, "a one-way mirror settles exactly N");
    // A's second notification again (as A, with a sequence B has not seen,
    // so it is not a retry): B moved on long ago.
    let server = tidings_server::keyfile::open(&a.key_file()).unwrap();
    let inbox = "system/inbox/mirror/from-0";
    let mut included = Map::new();
    let expires = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let token = b.mint(&a.hash, inbox_grant(inbox), expires, &mut included).await;
    let old = json!({"type": "note", "data": {"n": 1}});
    included.insert(hashes[1].clone(), old);
    let uri = format!("entity://{}/{inbox}", b.hash);
    let execute = json!({"type": "system/protocol/execute", "data": {
        "request_id": "replayed", "uri": uri, "operation": "receive", "resource": {"targets": [uri]},
        "params": {"type": "system/subscription/notification", "data": {
            "subscription_id": "replayed", "event": "updated", "uri": PATH, "hash": hashes[1], "previous_hash": hashes[0]}},
        "author": a.hash, "capability": token, "sequence": 1_000_000,
    }});
    let signature = server.sign(&hash_of(&execute).unwrap());
    included.insert(hash_of(&signature).unwrap(), signature);
    included.insert(a.hash.clone(), server.entity().clone());
    let stale_before = b.metric("tidings_mirror_applies_total{outcome=\"stale_rejected\"}").await;
    let r = b.http.post(format!("{}/v1/execute", b.base())).json(&json!({"execute": execute, "included": included})).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    wait_until("the mirror to handle the replayed lap", Duration::from_secs(30), Duration::from_millis(50), || async {
        b.metric("tidings_mirror_applies_total{outcome=\"stale_rejected\"}").await > stale_before
    })
    .await;
    assert_eq!(entity(b).await.as_deref(), Some(latest.as_str()), "the stale lap is rejected");
    assert_eq!(changes(b, 0, 0).await.len(), before, "and settles nothing");

    // Another identity with a token for the mirror's inbox (B's admin
    // minted it) delivers a newer-looking change: not the mirrored peer,
    // so it is not applied.
    let intruder = crate::helpers::federation::Peer::new();
    let mut included = Map::new();
    let token = b.mint(&intruder.hash, inbox_grant(inbox), expires, &mut included).await;
    let forged = json!({"type": "note", "data": {"forged": true}});
    let forged_hash = hash_of(&forged).unwrap();
    included.insert(forged_hash.clone(), forged);
    let current = hash_of(&serde_json::from_str(&latest).unwrap()).unwrap();
    let execute = json!({"type": "system/protocol/execute", "data": {
        "request_id": "intruder", "uri": uri, "operation": "receive", "resource": {"targets": [uri]},
        "params": {"type": "system/subscription/notification", "data": {
            "subscription_id": "intruder", "event": "updated", "uri": PATH, "hash": forged_hash, "previous_hash": current}},
        "author": intruder.hash, "capability": token, "sequence": 1,
    }});
    intruder.sign_into(&hash_of(&execute).unwrap(), &mut included);
    let foreign_before = b.metric("tidings_mirror_applies_total{outcome=\"foreign_ignored\"}").await;
    let r = b.http.post(format!("{}/v1/execute", b.base())).json(&json!({"execute": execute, "included": included})).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    wait_until("the mirror to see the foreign delivery", Duration::from_secs(30), Duration::from_millis(50), || async {
        b.metric("tidings_mirror_applies_total{outcome=\"foreign_ignored\"}").await > foreign_before
    })
    .await;
    assert_eq!(entity(b).await.as_deref(), Some(latest.as_str()), "a delivery by anyone but the peer is not applied");
    assert_eq!(changes(b, 0, 0).await.len(), before);
}

async fn a_mirror_renews_its_subscription_and_cancels_it_when_deleted(backend: Backend) {
    let a = Server::start(backend).await;
    // Tokens live 10 s, so the subscription is renewed every 5 s.
    let b = Server::start_with(backend, &[("TIDINGS_MIRROR_TOKEN_TTL", "10s")]).await;
    a.knows(&b).await;
    b.knows(&a).await;
    let mirror = json!({"type": "system/mirror", "data": {"peer": a.hash, "pattern": "feeds/**"}});
    assert!(b.http.put(format!("{}/v1/tree/system/mirror/m", b.base())).json(&mirror).send().await.unwrap().status().is_success());
    eventually("the mirror subscribes", || async { mirror_state(&b, "m").await["state"] == "subscribed" }).await;
    let id = mirror_state(&b, "m").await["subscription_id"].as_str().unwrap().to_owned();
    let at_a = format!("{}/v1/tree/system/subscription/{id}", a.base());
    let token = |v: Value| v["data"]["deliver_token"].as_str().unwrap_or_default().to_owned();
    let held: Value = a.http.get(&at_a).send().await.unwrap().json().await.unwrap();
    let first = token(held.clone());
    assert!(first.starts_with("sha256:"));
    assert_eq!(held["data"]["relay_endpoint"], b.base(), "a mirror offers itself as a relay, at its public URL");
    eventually("the subscription is renewed with a fresh token, same id", || async {
        let now: Value = a.http.get(&at_a).send().await.unwrap().json().await.unwrap();
        !token(now.clone()).is_empty() && token(now) != first
    })
    .await;
    // Past the first token's expiry the subscription still delivers.
    let latest = a.put(PATH, json!({"after": "renewal"})).await;
    eventually("a write after the first token expired arrives", || async {
        entity(&b).await.is_some_and(|e| hash_of(&serde_json::from_str(&e).unwrap()).unwrap() == latest)
    })
    .await;
    // Deleting the mirror cancels the subscription at the peer.
    let r = b.http.delete(format!("{}/v1/tree/system/mirror/m", b.base())).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    eventually("the peer's subscription is gone", || async { a.http.get(&at_a).send().await.unwrap().status() == 404 }).await;
    assert_eq!(mirror_state(&b, "m").await, Value::Null, "no longer listed");
}

async fn a_mirror_of_a_peer_with_tokens_on_uses_its_capability(backend: Backend) {
    use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
    let secret = "mirror-test-secret-of-enough-bytes-for-hs256";
    let a = Server::start_with(backend, &[("TIDINGS_JWT_HS256_SECRET", secret)]).await;
    let b = Server::start(backend).await;
    let claims = json!({"sub": "ops", "exp": chrono::Utc::now().timestamp() + 600, "admin": true, "publish": ["**"], "subscribe": ["**"]});
    let admin = encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes()).unwrap()).unwrap();
    let peer = json!({"type": "system/peer", "data": {"endpoint": b.base()}});
    let r = a.http.put(format!("{}/v1/tree/system/peer/{}", a.base(), b.hash)).bearer_auth(&admin).json(&peer).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    b.knows(&a).await;
    // A's admin mints B a caller capability: subscribe (and bundle) feeds/**.
    let grants = json!([
        {"handler": "system/subscription", "operations": ["subscribe", "unsubscribe"], "resources": ["feeds/**"]},
        {"handler": "system/tree", "operations": ["get"], "resources": ["feeds/**"]},
    ]);
    let r =
        a.http.post(format!("{}/v1/admin/capabilities", a.base())).bearer_auth(&admin).json(&json!({"grantee": b.hash, "grants": grants}));
    let minted: Value = r.send().await.unwrap().json().await.unwrap();
    let capability = json!({"hash": minted["hash"], "included": minted["included"]});
    let with = json!({"type": "system/mirror", "data": {"peer": a.hash, "pattern": "feeds/**", "capability": capability}});
    let without = json!({"type": "system/mirror", "data": {"peer": a.hash, "pattern": "other/**"}});
    for (name, mirror) in [("with", with), ("without", without)] {
        let r = b.http.put(format!("{}/v1/tree/system/mirror/{name}", b.base())).json(&mirror).send().await.unwrap();
        assert!(r.status().is_success(), "{}", r.status());
    }
    eventually("the mirror with a capability subscribes", || async { mirror_state(&b, "with").await["state"] == "subscribed" }).await;
    eventually("the one without is refused", || async {
        let state = mirror_state(&b, "without").await;
        state["state"] == "failing" && state["last_error"].as_str().is_some_and(|e| e.contains("capability_required"))
    })
    .await;
    let mut latest = String::new();
    for i in 0..3 {
        let r = a.http.put(format!("{}/v1/tree/{PATH}", a.base())).bearer_auth(&admin).json(&json!({"type": "note", "data": {"n": i}}));
        latest = r.send().await.unwrap().json::<Value>().await.unwrap()["hash"].as_str().unwrap().to_owned();
    }
    eventually("B holds A's latest", || async {
        entity(&b).await.is_some_and(|e| hash_of(&serde_json::from_str(&e).unwrap()).unwrap() == latest)
    })
    .await;
    assert_eq!(changes(&b, 0, 0).await.len(), 3, "each write applied once");
}

async fn a_mirror_turned_away_at_capacity_attaches_through_a_relay(backend: Backend) {
    // The source takes two subscribers per prefix; three servers mirror it.
    let source = Server::start_with(backend, &[("TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", "2")]).await;
    let mut mirrors = Vec::new();
    for i in 0..3 {
        let m = Server::start(backend).await;
        m.knows(&source).await;
        // The source learns each mirror from its relay_endpoint; the third
        // learns its relay from the redirect (both proven by /v1/identity).
        let mirror = json!({"type": "system/mirror", "data": {"peer": source.hash, "pattern": "feeds/**"}});
        assert!(m.http.put(format!("{}/v1/tree/system/mirror/feeds", m.base())).json(&mirror).send().await.unwrap().status().is_success());
        eventually(&format!("mirror {i} subscribes"), || async { mirror_state(&m, "feeds").await["state"] == "subscribed" }).await;
        mirrors.push(m);
    }
    let states: Vec<Value> = {
        let mut v = Vec::new();
        for m in &mirrors {
            v.push(mirror_state(m, "feeds").await);
        }
        v
    };
    let direct = states.iter().filter(|s| s["upstream"] == source.hash.as_str()).count();
    assert_eq!(direct, 2, "the source holds two subscribers: {states:?}");
    let relayed = states.iter().find(|s| s["upstream"] != source.hash.as_str()).unwrap();
    assert_eq!(relayed["hops"], 1, "{relayed}");
    assert!(mirrors[..2].iter().any(|m| relayed["upstream"] == m.hash.as_str()), "attached to one of the first two: {relayed}");
    let listed: Value =
        source.http.get(format!("{}/v1/tree/system/subscription/", source.base())).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["children"].as_array().unwrap().len(), 2, "{listed}");
    // Writes at the source reach all three, the third through its relay.
    let mut latest = String::new();
    for i in 0..20 {
        latest = source.put(PATH, json!({"n": i})).await;
    }
    for m in &mirrors {
        eventually("every mirror holds the source's latest", || async {
            entity(m).await.is_some_and(|e| hash_of(&serde_json::from_str(&e).unwrap()).unwrap() == latest)
        })
        .await;
        assert!(changes(m, 0, 0).await.len() <= 30, "at most 1.5 x N settles");
    }
}

/// A server that takes one subscriber per prefix.
async fn relay(backend: Backend) -> Server {
    Server::start_with(backend, &[("TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", "1")]).await
}

async fn redirects_build_a_tree_and_a_redirect_loop_ends_with_an_error(backend: Backend) {
    // Capacity 1 everywhere: S ← M1 ← M2 ← M3, each later mirror
    // redirected one hop further down.
    let source = relay(backend).await;
    let mut chain: Vec<Server> = Vec::new();
    for i in 0..3 {
        let m = relay(backend).await;
        mirror_of(&m, &source, "feeds").await;
        eventually(&format!("mirror {i} attaches"), || async { mirror_state(&m, "feeds").await["state"] == "subscribed" }).await;
        let state = mirror_state(&m, "feeds").await;
        assert_eq!(state["hops"], i, "{state}");
        let expected = if i == 0 { &source.hash } else { &chain[i - 1].hash };
        assert_eq!(state["upstream"], expected.as_str(), "{state}");
        chain.push(m);
    }
    let latest = source.put(PATH, json!({"deep": true})).await;
    let leaf = &chain[2];
    eventually("the write reaches the leaf, two relays down", || async {
        entity(leaf).await.is_some_and(|e| hash_of(&serde_json::from_str(&e).unwrap()).unwrap() == latest)
    })
    .await;

    // Two relays that each redirect to the other: R1 and R2 mirror each
    // other (each full with the other), X asks R1.
    let (r1, r2, x) = (relay(backend).await, relay(backend).await, relay(backend).await);
    mirror_of(&r1, &r2, "pair").await;
    eventually("R1 holds its slot at R2", || async { mirror_state(&r1, "pair").await["state"] == "subscribed" }).await;
    mirror_of(&r2, &r1, "pair").await;
    eventually("R2 holds its slot at R1", || async { mirror_state(&r2, "pair").await["state"] == "subscribed" }).await;
    mirror_of(&x, &r1, "looped").await;
    eventually("the loop ends with a clear error", || async {
        let state = mirror_state(&x, "looped").await;
        state["state"] == "failing" && state["last_error"].as_str().is_some_and(|e| e.contains("no alternative"))
    })
    .await;
    // And X backs off rather than looping: a handful of subscribes at R1
    // over two seconds, not hundreds.
    let series = "tidings_http_requests_total{route=\"/v1/execute\",status=\"303\"}";
    let before = r1.metric(series).await;
    assert!(before >= 1.0, "R1 redirected X (the series is read right)");
    // An observation window, not a wait: the count in it is the assertion.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let during = r1.metric(series).await - before;
    assert!(during <= 6.0, "{during} redirects in 2 s: X must back off");
}
