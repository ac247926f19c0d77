//! Server-to-server delivery between real `tidings` processes, each with its
//! own data directory (and, on PostgreSQL, its own database): third-party
//! delivery (docs/ref-subscriptions.md, "Deliver tokens"), what a receiving
//! server refuses, exactly-once delivery across SIGKILLs of either side.

use std::time::Duration;

use serde_json::{Map, Value, json};
use tidings_protocol::tree::capability::hash_of;

use crate::both_stores;
use crate::helpers::federation::*;
use crate::helpers::{Backend, free_port, wait_until};

both_stores!(
    third_party_delivery_reaches_the_inbox_owner,
    a_receiver_refuses_bad_deliveries_and_stores_nothing,
    deliveries_survive_killing_either_server,
    a_delivery_given_up_binds_a_marker_and_the_next_goes_on,
    a_peer_that_is_down_holds_up_nothing_else,
    retention_keeps_what_a_peer_has_not_taken,
    a_lane_that_falls_behind_catches_up_from_the_log,
    a_peer_subscribing_for_its_own_inbox_is_learned_once_its_endpoint_proves_it,
);

/// Notification payloads' `data`, checked to be an unbroken `previous_hash`
/// chain delivered by `sender`.
fn chain_of(envelopes: &[Value], sender: &str) -> Vec<String> {
    let mut previous: Option<String> = None;
    let mut hashes = Vec::new();
    for e in envelopes {
        assert_eq!(e["agent"]["id"], sender, "delivered by the sending server: {e}");
        let data = &e["payload"]["data"];
        assert_eq!(data["previous_hash"].as_str().map(str::to_owned), previous, "an unbroken previous_hash chain: {e}");
        let hash = data["hash"].as_str().unwrap().to_owned();
        previous = Some(hash.clone());
        hashes.push(hash);
    }
    hashes
}

async fn third_party_delivery_reaches_the_inbox_owner(backend: Backend) {
    let (a_server, b, c) = (Server::start(backend).await, Server::start(backend).await, Server::start(backend).await);
    // A is a server too: the test signs with its key, as A would.
    let a = Peer::from_key_file(&a_server.key_file());
    assert_eq!(a.hash, a_server.hash);
    let inbox = "system/inbox/sensor-data";
    // B must know where C is before it accepts an inbox there.
    let (status, body) = subscribe_third_party(&a, &b, &c, "local/sensors/*", inbox).await;
    assert_eq!((status, code(&body)), (400, "unknown_peer"), "{body}");
    b.knows(&c).await;
    // Refused at subscribe time: a chain that does not grant B receive on
    // C's inbox, and one that grants it but is not rooted at C.
    let mut included = Map::new();
    let expires = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let root = c.mint(&a.hash, inbox_grant("system/inbox/other"), expires, &mut included).await;
    let leaf = a.grant(&b.hash, inbox_grant("system/inbox/other"), Some(&root), &mut included);
    let params = json!({"deliver_to": {"uri": format!("entity://{}/{inbox}", c.hash)}, "deliver_token": leaf});
    let envelope = Subscribe { author: &a, pattern: "local/sensors/*", params, capability: None, included }.envelope("subscribe");
    let (status, body) = execute_at(&b.http, b.base(), &envelope).await;
    assert_eq!((status, code(&body)), (403, "deliver_token_insufficient"), "{body}");
    let mut included = Map::new();
    let self_rooted = a.grant(&b.hash, inbox_grant(inbox), None, &mut included);
    let params = json!({"deliver_to": {"uri": format!("entity://{}/{inbox}", c.hash)}, "deliver_token": self_rooted});
    let envelope = Subscribe { author: &a, pattern: "local/sensors/*", params, capability: None, included }.envelope("subscribe");
    let (status, body) = execute_at(&b.http, b.base(), &envelope).await;
    assert_eq!((status, code(&body)), (403, "deliver_token_insufficient"), "{body}");

    let (status, body) = subscribe_third_party(&a, &b, &c, "local/sensors/*", inbox).await;
    assert_eq!(status, 200, "{body}");
    let mut written = Vec::new();
    for i in 0..5 {
        written.push(b.put("local/sensors/t1", json!({"celsius": 20 + i})).await);
    }
    let got = c.inbox_until(inbox, 5).await;
    assert_eq!(chain_of(&got, &b.hash), written, "every change once, in commit order, at C");
    let sub = body["result"]["subscription_id"].as_str().unwrap();
    assert!(got.iter().all(|e| e["payload"]["data"]["subscription_id"] == sub && e["ref"] == inbox), "{got:?}");
    // Nothing of it lands at B's copy of the inbox path: B only relays.
    assert_eq!(b.inbox(inbox, 0, 0).await, Vec::<Value>::new(), "B delivers to C, not to itself");
    assert_eq!(a_server.inbox(inbox, 0, 0).await, Vec::<Value>::new(), "A is not in the delivery path");
    assert_eq!(a_server.metric("tidings_peer_received_total{outcome=\"appended\"}").await, 0.0);
}

async fn a_receiver_refuses_bad_deliveries_and_stores_nothing(backend: Backend) {
    let c = Server::start(backend).await;
    let inbox = "system/inbox/feed";
    let (sender, token, granted) = granted_sender(&c, inbox).await;
    let expires = chrono::Utc::now().timestamp_millis() + 3_600_000;
    let data = |n: i64| json!({"subscription_id": "s1", "event": "updated", "uri": "feeds/x", "hash": format!("sha256:{n:064x}"), "previous_hash": format!("sha256:{:064x}", n - 1)});
    let head = c.head().await;

    // Forged: signed by someone else than its author.
    let forger = Peer::new();
    let mut forged = delivery(&sender, &c, inbox, &token, 1, data(1), granted.clone());
    let execute = forged["execute"].clone();
    let mut included = granted.clone();
    forger.sign_into(&hash_of(&execute).unwrap(), &mut included);
    included.insert(sender.hash.clone(), sender.entity.clone());
    forged["included"] = json!(included);
    let (status, body) = execute_at(&c.http, c.base(), &forged).await;
    assert_eq!((status, code(&body)), (401, "signature_invalid"), "{body}");
    // Expired: a token C minted that ran out.
    let mut stale = Map::new();
    let expired = c.mint(&sender.hash, inbox_grant(inbox), 1_000, &mut stale).await;
    let (status, body) = execute_at(&c.http, c.base(), &delivery(&sender, &c, inbox, &expired, 1, data(1), stale)).await;
    assert_eq!((status, code(&body)), (403, "capability_invalid"), "{body}");
    // Not rooted at C: the sender granting itself.
    let mut own = Map::new();
    let self_made = sender.grant(&sender.hash, inbox_grant(inbox), None, &mut own);
    let (status, body) = execute_at(&c.http, c.base(), &delivery(&sender, &c, inbox, &self_made, 1, data(1), own)).await;
    assert_eq!((status, code(&body)), (403, "capability_invalid"), "{body}");
    // Rooted at C but for another inbox.
    let mut other = Map::new();
    let elsewhere = c.mint(&sender.hash, inbox_grant("system/inbox/other"), expires, &mut other).await;
    let (status, body) = execute_at(&c.http, c.base(), &delivery(&sender, &c, inbox, &elsewhere, 1, data(1), other)).await;
    assert_eq!((status, code(&body)), (403, "capability_insufficient"), "{body}");
    // Granted to someone else than the author.
    let stranger = Peer::new();
    let mut theirs = Map::new();
    let not_ours = c.mint(&stranger.hash, inbox_grant(inbox), expires, &mut theirs).await;
    let (status, body) = execute_at(&c.http, c.base(), &delivery(&sender, &c, inbox, &not_ours, 1, data(1), theirs)).await;
    assert_eq!((status, code(&body)), (403, "capability_invalid"), "{body}");
    // Malformed: no sequence, a notification that is not one.
    let mut unsequenced = delivery(&sender, &c, inbox, &token, 1, data(1), Map::new());
    unsequenced["execute"]["data"].as_object_mut().unwrap().remove("sequence");
    let mut resigned = granted.clone();
    sender.sign_into(&hash_of(&unsequenced["execute"]).unwrap(), &mut resigned);
    unsequenced["included"] = json!(resigned);
    let (status, body) = execute_at(&c.http, c.base(), &unsequenced).await;
    assert_eq!((status, code(&body)), (400, "invalid_execute"), "{body}");
    let bad = json!({"subscription_id": "s1", "event": "exploded", "uri": "feeds/x"});
    let (status, body) = execute_at(&c.http, c.base(), &delivery(&sender, &c, inbox, &token, 1, bad, granted.clone())).await;
    assert_eq!((status, code(&body)), (400, "invalid_params"), "{body}");
    assert_eq!(c.head().await, head, "no refused delivery stored anything");

    // A good one is appended once; its retry is answered as success and
    // stores nothing; an older sequence is a duplicate too.
    let good = delivery(&sender, &c, inbox, &token, 7, data(7), granted.clone());
    let (status, first) = execute_at(&c.http, c.base(), &good).await;
    assert_eq!((status, &first["result"]["duplicate"]), (200, &json!(false)), "{first}");
    let (status, again) = execute_at(&c.http, c.base(), &good).await;
    assert_eq!((status, &again["result"]["duplicate"]), (200, &json!(true)), "{again}");
    let older = delivery(&sender, &c, inbox, &token, 6, data(6), granted.clone());
    assert_eq!(execute_at(&c.http, c.base(), &older).await.1["result"]["duplicate"], true);
    let got = c.inbox(inbox, 0, 0).await;
    assert_eq!(got.len(), 1, "{got:?}");
    let mut stored = data(7);
    stored["sequence"] = json!(7);
    assert_eq!(got[0]["payload"]["data"], stored, "what was checked, with the sender's sequence");
    assert_eq!(got[0]["agent"], json!({"id": sender.hash, "kind": "peer"}));
    assert_eq!(c.head().await, head + 1, "one event for three deliveries of it");
}

async fn deliveries_survive_killing_either_server(backend: Backend) {
    let (mut b, mut c) = (Server::start(backend).await, Server::start(backend).await);
    b.knows(&c).await;
    let a = Peer::new();
    let inbox = "system/inbox/faults";
    let (status, body) = subscribe_third_party(&a, &b, &c, "feeds/*", inbox).await;
    assert_eq!(status, 200, "{body}");
    let mut written = Vec::new();
    let write = async |b: &Server, n: usize, written: &mut Vec<String>| {
        for _ in 0..n {
            let i = written.len();
            written.push(b.put("feeds/x", json!({"n": i})).await);
        }
    };
    write(&b, 5, &mut written).await;
    c.inbox_until(inbox, 1).await;
    // The receiver dies mid-stream; the sender keeps writing and retrying.
    c.kill().await;
    write(&b, 10, &mut written).await;
    c.restart().await;
    write(&b, 5, &mut written).await;
    c.inbox_until(inbox, 16).await;
    // The sender dies with deliveries in flight, and comes back.
    write(&b, 5, &mut written).await;
    b.kill().await;
    b.restart().await;
    write(&b, 5, &mut written).await;
    let got = c.inbox_until(inbox, written.len()).await;
    // A sentinel after everything: the next notification is its, so
    // nothing was delivered twice.
    written.push(b.put("feeds/x", json!({"sentinel": true})).await);
    let since = got.last().unwrap()["event_id"].as_i64().unwrap();
    let mut rest = Vec::new();
    while rest.is_empty() {
        rest = c.inbox(inbox, since, 10_000).await;
    }
    let all: Vec<Value> = got.into_iter().chain(rest).collect();
    assert_eq!(chain_of(&all, &b.hash), written, "every notification exactly once, in order");
}

async fn a_delivery_given_up_binds_a_marker_and_the_next_goes_on(backend: Backend) {
    let b = Server::start_with(backend, &[("TIDINGS_PEER_DELIVERY_ATTEMPTS", "2")]).await;
    let (c, d) = (Server::start(backend).await, Server::start(backend).await);
    let a = Peer::new();
    let inbox = "system/inbox/markers";
    // C's endpoint is first a port nobody listens on.
    let nobody = format!("http://127.0.0.1:{}", free_port());
    b.knows_at(&c.hash, &nobody).await;
    let (status, body) = subscribe_third_party(&a, &b, &c, "feeds/*", inbox).await;
    assert_eq!(status, 200, "{body}");
    let sub = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    b.put_in_chain("feeds/x", json!({"n": 1}), "unreachable").await;
    let marker = b.marker("unreachable").await;
    assert!(marker.starts_with(&format!("system/runtime/chain-errors/lost/unreachable/{sub}/delivery_failed/")), "{marker}");
    // Then another server, which refuses what is not addressed to it: final
    // at once, the marker's reason its error code.
    b.knows_at(&c.hash, d.base()).await;
    b.put_in_chain("feeds/x", json!({"n": 2}), "misrouted").await;
    let marker = b.marker("misrouted").await;
    assert!(marker.starts_with(&format!("system/runtime/chain-errors/lost/misrouted/{sub}/handler_not_found/")), "{marker}");
    // Fixed: the next notification reaches C, and only it.
    b.knows(&c).await;
    let third = b.put_in_chain("feeds/x", json!({"n": 3}), "delivered").await;
    let got = c.inbox_until(inbox, 1).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0]["payload"]["data"]["hash"], third.as_str());
    assert_eq!(got[0]["payload"]["chain_id"], "delivered", "the causal chain travels with the delivery");
    assert_eq!(d.inbox(inbox, 0, 0).await, Vec::<Value>::new(), "D stored nothing");
}

async fn a_peer_that_is_down_holds_up_nothing_else(backend: Backend) {
    let (b, c) = (Server::start(backend).await, Server::start(backend).await);
    let a = Peer::new();
    // A peer that never answers (an identity whose server is not running).
    let dead = Peer::new();
    subscribe_to_dead_peer(&a, &b, &dead, "system/inbox/d").await;
    b.knows(&c).await;
    assert_eq!(subscribe_third_party(&a, &b, &c, "feeds/*", "system/inbox/c").await.0, 200);
    let mut included = Map::new();
    let own = a.grant(&b.hash, inbox_grant("system/inbox/local"), None, &mut included);
    let params = json!({"deliver_to": {"uri": "system/inbox/local"}, "deliver_token": own});
    let envelope = Subscribe { author: &a, pattern: "feeds/*", params, capability: None, included }.envelope("subscribe");
    assert_eq!(execute_at(&b.http, b.base(), &envelope).await.0, 200);
    let mut written = Vec::new();
    for i in 0..3 {
        written.push(b.put("feeds/x", json!({"n": i})).await);
    }
    // The dead peer's lane retries its first notification meanwhile.
    assert_eq!(chain_of(&c.inbox_until("system/inbox/c", 3).await, &b.hash), written);
    assert_eq!(b.inbox_until("system/inbox/local", 3).await.len(), 3);
    let backlog = format!("tidings_peer_backlog_events{{peer=\"{}\"}}", dead.hash);
    let caught_up = format!("tidings_peer_backlog_events{{peer=\"{}\"}}", c.hash);
    // The gauges are sampled every few seconds: wait for the report.
    let what = "the dead peer's backlog and retries to be reported, and C's lane caught up";
    wait_until(what, Duration::from_secs(30), Duration::from_millis(200), || async {
        b.metric(&backlog).await > 0.0 && b.metric("tidings_peer_delivery_retries_total").await >= 1.0 && b.metric(&caught_up).await == 0.0
    })
    .await;
    // /health/deep lists both peers with their state.
    let deep: Value = b.http.get(format!("{}/health/deep", b.base())).send().await.unwrap().json().await.unwrap();
    let peer = |hash: &str| deep["peers"].as_array().unwrap().iter().find(|p| p["peer"] == hash).cloned().unwrap_or(Value::Null);
    assert_eq!(peer(&dead.hash)["state"], "failing", "{deep}");
    assert!(peer(&dead.hash)["delivery"]["last_error"].is_string(), "{deep}");
    assert_eq!(peer(&c.hash)["state"], "delivering", "{deep}");
    assert_eq!(peer(&c.hash)["endpoint"], c.base(), "{deep}");
    assert_eq!(peer(&c.hash)["delivery"]["delivered"], 3, "{deep}");
}

/// A subscription on `b` delivering to `inbox` at `dead`, a peer whose
/// server does not run (reached at a port nobody listens on).
async fn subscribe_to_dead_peer(a: &Peer, b: &Server, dead: &Peer, inbox: &str) -> String {
    b.knows_at(&dead.hash, &format!("http://127.0.0.1:{}", free_port())).await;
    let mut included = Map::new();
    let root = dead.grant(&a.hash, inbox_grant(inbox), None, &mut included);
    let leaf = a.grant(&b.hash, inbox_grant(inbox), Some(&root), &mut included);
    let params = json!({"deliver_to": {"uri": format!("entity://{}/{inbox}", dead.hash)}, "deliver_token": leaf});
    let envelope = Subscribe { author: a, pattern: "feeds/*", params, capability: None, included }.envelope("subscribe");
    let (status, body) = execute_at(&b.http, b.base(), &envelope).await;
    assert_eq!(status, 200, "{body}");
    body["result"]["subscription_id"].as_str().unwrap().to_owned()
}

async fn retention_keeps_what_a_peer_has_not_taken(backend: Backend) {
    let b = Server::start_with(backend, &[("TIDINGS_RETENTION", "5"), ("TIDINGS_RETENTION_INTERVAL", "50ms")]).await;
    let c = Server::start(backend).await;
    let a = Peer::new();
    let inbox = "system/inbox/kept";
    b.knows_at(&c.hash, &format!("http://127.0.0.1:{}", free_port())).await;
    assert_eq!(subscribe_third_party(&a, &b, &c, "feeds/*", inbox).await.0, 200);
    let mut written = Vec::new();
    for i in 0..10 {
        written.push(b.put("feeds/x", json!({"n": i})).await);
    }
    // C is unreachable for a while: retention (5 events, every 50 ms) runs
    // many times over the 20 events written meanwhile.
    wait_until("the courier to retry", Duration::from_secs(30), Duration::from_millis(100), || async {
        b.metric("tidings_peer_delivery_retries_total").await >= 3.0
    })
    .await;
    assert!(b.deep().await["history_from"].as_i64().unwrap() > 1, "retention runs");
    b.knows(&c).await;
    assert_eq!(chain_of(&c.inbox_until(inbox, 10).await, &b.hash), written, "nothing a peer had not taken was pruned");

    // A lane stuck on a dead peer holds retention until its subscription
    // goes; then history is pruned past it.
    let dead = Peer::new();
    let sub = subscribe_to_dead_peer(&a, &b, &dead, "system/inbox/d").await;
    b.put("feeds/x", json!({"stuck": true})).await;
    let stuck = b.head().await;
    for i in 0..10 {
        b.put("feeds/y", json!({"n": i})).await;
    }
    let params = json!({"subscription_id": sub});
    let envelope = Subscribe { author: &a, pattern: "", params, capability: None, included: Map::new() }.envelope("unsubscribe");
    assert_eq!(execute_at(&b.http, b.base(), &envelope).await.0, 200);
    wait_until("history pruned past the forgotten lane", Duration::from_secs(30), Duration::from_millis(100), || async {
        b.deep().await["history_from"].as_i64().unwrap() > stuck
    })
    .await;
}

async fn a_lane_that_falls_behind_catches_up_from_the_log(backend: Backend) {
    let (b, c) = (Server::start(backend).await, Server::start(backend).await);
    let a = Peer::new();
    let inbox = "system/inbox/behind";
    b.knows_at(&c.hash, &format!("http://127.0.0.1:{}", free_port())).await;
    assert_eq!(subscribe_third_party(&a, &b, &c, "feeds/*", inbox).await.0, 200);
    // More notifications than a lane's queue holds pile up while C is
    // unreachable: the lane is left to read them from the log.
    let mut written = Vec::new();
    for i in 0..300 {
        written.push(b.put("feeds/x", json!({"n": i})).await);
    }
    b.knows(&c).await;
    assert_eq!(chain_of(&c.inbox_until(inbox, 300).await, &b.hash), written, "all of them, once, in order");
    // Caught up, it is fed live again.
    for i in 0..5 {
        written.push(b.put("feeds/x", json!({"after": i})).await);
    }
    assert_eq!(chain_of(&c.inbox_until(inbox, 305).await, &b.hash), written);
}

async fn a_peer_subscribing_for_its_own_inbox_is_learned_once_its_endpoint_proves_it(backend: Backend) {
    let (u, x, y) = (Server::start(backend).await, Server::start(backend).await, Server::start(backend).await);
    // The test acts as X: U does not know it.
    let as_x = Peer::from_key_file(&x.key_file());
    let inbox = "system/inbox/own";
    let subscribe = |relay: &str| {
        let mut included = Map::new();
        let token = as_x.grant(&u.hash, inbox_grant(inbox), None, &mut included);
        let params =
            json!({"deliver_to": {"uri": format!("entity://{}/{inbox}", x.hash)}, "deliver_token": token, "relay_endpoint": relay});
        Subscribe { author: &as_x, pattern: "feeds/*", params, capability: None, included }.envelope("subscribe")
    };
    // An endpoint that answers as someone else proves nothing.
    let (status, body) = execute_at(&u.http, u.base(), &subscribe(y.base())).await;
    assert_eq!((status, code(&body)), (400, "unknown_peer"), "{body}");
    let peer_at_u = format!("{}/v1/tree/system/peer/{}", u.base(), x.hash);
    assert_eq!(u.http.get(&peer_at_u).send().await.unwrap().status(), 404, "nothing learned");
    // X's own endpoint proves X: learned, and delivered to.
    let (status, body) = execute_at(&u.http, u.base(), &subscribe(x.base())).await;
    assert_eq!(status, 200, "{body}");
    let learned: Value = u.http.get(&peer_at_u).send().await.unwrap().json().await.unwrap();
    assert_eq!(learned["data"]["endpoint"], x.base());
    let hash = u.put("feeds/a", json!({"n": 1})).await;
    let got = x.inbox_until(inbox, 1).await;
    assert_eq!(got[0]["payload"]["data"]["hash"], hash.as_str());
}
