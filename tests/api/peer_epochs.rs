//! A server whose log loses history it had delivered to peers (restored
//! from a backup and a new epoch begun with `tidings epoch new`; on
//! PostgreSQL a failover does the same, `tests/api/failover.rs`): the
//! receiving inbox is told once, with a `subscription.history_lost` right
//! before the first notification after the loss, and a mirror of it reads
//! every path again at once, so nothing of the lost history stays mirrored
//! (docs/ref-subscriptions.md, "When the sender loses history").

use std::ops::ControlFlow;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tidings_protocol::tree::capability::hash_of;

use crate::both_stores;
use crate::helpers::epochs::{backup, epoch_command};
use crate::helpers::federation::{Peer, code, execute_at};
use crate::helpers::federation::{Server, delivery, granted_sender, subscribe_third_party};
use crate::helpers::mirrors::{mirror_of, mirror_state};
use crate::helpers::{Backend, eventually, gather};

both_stores!(
    an_inbox_is_told_once_when_its_sender_loses_history,
    a_mirror_reads_again_what_its_peer_lost,
    a_sender_s_list_of_epochs_is_checked_and_tells_its_own_stream_only,
);

/// Everything addressed to `inbox` after `since` (notifications and
/// notices), long-polling up to `wait_ms`.
async fn addressed(server: &Server, inbox: &str, since: i64, wait_ms: u32) -> Vec<Value> {
    let url = format!("{}/v1/poll?targets={inbox}&since={since}&limit=1000&wait_ms={wait_ms}", server.base());
    let r: Value = server.http.get(url).send().await.unwrap().json().await.unwrap();
    r["events"].as_array().unwrap().clone()
}

/// Waits (bounded) until `inbox` holds `n` envelopes after `since`.
async fn addressed_until(server: &Server, inbox: &str, since: i64, n: usize) -> Vec<Value> {
    let what = |got: &Vec<Value>| format!("{} of {n} envelopes arrived: {got:?}", got.len());
    gather(Duration::from_secs(60), Vec::new(), what, |mut got: Vec<Value>| async move {
        let after = got.last().map_or(since, |e| e["event_id"].as_i64().unwrap());
        got.extend(addressed(server, inbox, after, 5_000).await);
        if got.len() >= n { ControlFlow::Break(got) } else { ControlFlow::Continue(got) }
    })
    .await
}

/// Stops `server`, copies its store as a backup holds it; starts it again.
/// The backup's database URL on PostgreSQL.
async fn back_up(backend: Backend, server: &mut Server, into: &std::path::Path) -> Option<String> {
    server.kill().await;
    let url = backup(backend, server.data_dir(), server.database_url(), into).await;
    server.restart().await;
    url
}

/// Stops `server`, puts the backup back (its files, or its database), begins
/// a new epoch as an operator does, and starts it again; the epoch begun.
async fn restore(server: &mut Server, from: &std::path::Path, url: Option<&str>) -> Value {
    server.kill().await;
    match url {
        Some(url) => server.use_database(url),
        None => {
            for entry in std::fs::read_dir(server.data_dir()).unwrap() {
                let path = entry.unwrap().path();
                if path.is_file() {
                    std::fs::remove_file(path).unwrap();
                }
            }
            for entry in std::fs::read_dir(from).unwrap() {
                let entry = entry.unwrap();
                std::fs::copy(entry.path(), server.data_dir().join(entry.file_name())).unwrap();
            }
        }
    }
    let begun = epoch_command("new", server.data_dir(), server.database_url()).await;
    server.restart().await;
    begun
}

async fn an_inbox_is_told_once_when_its_sender_loses_history(backend: Backend) {
    let (mut b, c) = (Server::start(backend).await, Server::start(backend).await);
    b.knows(&c).await;
    let inbox = "system/inbox/lossy";
    let (status, body) = subscribe_third_party(&Peer::new(), &b, &c, "feeds/*", inbox).await;
    assert_eq!(status, 200, "{body}");
    let sub = body["result"]["subscription_id"].as_str().unwrap().to_owned();
    for n in 0..3 {
        b.put("feeds/x", json!({"n": n})).await;
    }
    addressed_until(&c, inbox, 0, 3).await;
    let home = tempfile::tempdir().unwrap();
    let url = back_up(backend, &mut b, home.path()).await;
    // Two more are delivered, then lost with B's store.
    b.put("feeds/x", json!({"n": "lost 1"})).await;
    b.put("feeds/x", json!({"n": "lost 2"})).await;
    let before = addressed_until(&c, inbox, 0, 5).await;
    assert!(before.iter().all(|e| e["event_type"] == "subscription.notification"), "nothing but notifications yet: {before:?}");
    let begun = restore(&mut b, home.path(), url.as_deref()).await;
    let (fork, base) = (begun["fork"].as_i64().unwrap(), begun["base"].as_i64().unwrap());

    // The first change after the loss: C's inbox is told, then notified.
    b.put("feeds/x", json!({"n": "after"})).await;
    let since = before.last().unwrap()["event_id"].as_i64().unwrap();
    let after = addressed_until(&c, inbox, since, 2).await;
    assert_eq!(after.len(), 2, "{after:?}");
    let (told, next) = (&after[0], &after[1]);
    assert_eq!(told["event_type"], "subscription.history_lost", "{after:?}");
    assert_eq!((told["ref"].as_str(), &told["agent"]), (Some(inbox), &json!({"id": b.hash, "kind": "peer"})), "{told}");
    let data = &told["payload"]["data"];
    assert_eq!((&data["subscription_id"], &data["reason"]), (&json!(sub), &json!("history_lost")), "{told}");
    assert_eq!((data["fork"].as_i64(), data["base"].as_i64(), data["epoch"].as_i64()), (Some(fork), Some(base), Some(1)), "{told}");
    let requested = data["requested"].as_i64().unwrap();
    assert!(fork < requested && requested <= base, "the mark C had reached lies in the lost stretch: {told}");
    // Each notification says which of B's ids it was: the last one C had
    // is the mark, and the two above the fork are those B lost.
    let sequences: Vec<i64> = before.iter().map(|e| e["payload"]["data"]["sequence"].as_i64().unwrap()).collect();
    assert_eq!(sequences.last(), Some(&requested), "{before:?}");
    assert_eq!(sequences.iter().filter(|s| **s > fork).count(), 2, "{sequences:?} (fork {fork})");
    assert!(next["payload"]["data"]["sequence"].as_i64().unwrap() > base, "{next}");
    assert_eq!(next["event_type"], "subscription.notification", "{after:?}");
    assert_eq!(next["event_id"].as_i64().unwrap(), told["event_id"].as_i64().unwrap() + 1, "told right before it");

    // Told once: the next change brings its notification alone.
    b.put("feeds/x", json!({"n": "after 2"})).await;
    let since = next["event_id"].as_i64().unwrap();
    let more = addressed_until(&c, inbox, since, 1).await;
    assert_eq!(more.len(), 1, "{more:?}");
    assert_eq!(more[0]["event_type"], "subscription.notification", "{more:?}");
    assert_eq!(c.metric("tidings_peer_received_total{outcome=\"history_lost\"}").await, 1.0);
    assert_eq!(c.metric("tidings_replay_gaps_total{reason=\"history_lost\"}").await, 1.0);
}

async fn a_mirror_reads_again_what_its_peer_lost(backend: Backend) {
    // No reconciliation in this test's time: only the notice can set the
    // mirror right.
    let mut source = Server::start(backend).await;
    let mirror = Server::start_with(backend, &[("TIDINGS_MIRROR_RECONCILE", "1h")]).await;
    source.knows(&mirror).await;
    mirror_of(&mirror, &source, "feeds").await;
    eventually("the mirror subscribes", || async { mirror_state(&mirror, "feeds").await["state"] == "subscribed" }).await;
    let kept = source.put("feeds/x", json!({"v": "kept"})).await;
    let at = |path: &'static str| {
        let (http, base) = (mirror.http.clone(), mirror.base().to_owned());
        async move {
            let r = http.get(format!("{base}/v1/tree/{path}")).send().await.unwrap();
            (r.status() == 200).then(|| r.headers()["etag"].to_str().unwrap().trim_matches('"').to_owned())
        }
    };
    eventually("the mirror holds what is kept", || async { at("feeds/x").await.as_deref() == Some(kept.as_str()) }).await;
    let home = tempfile::tempdir().unwrap();
    let url = back_up(backend, &mut source, home.path()).await;
    eventually("the mirror subscribes again", || async { mirror_state(&mirror, "feeds").await["state"] == "subscribed" }).await;
    // A change and a new path, mirrored, then lost with the source's store.
    let lost = source.put("feeds/x", json!({"v": "lost"})).await;
    source.put("feeds/y", json!({"v": "lost"})).await;
    eventually("the mirror holds what will be lost", || async {
        at("feeds/x").await.as_deref() == Some(lost.as_str()) && at("feeds/y").await.is_some()
    })
    .await;
    restore(&mut source, home.path(), url.as_deref()).await;

    let new = source.put("feeds/z", json!({"v": "new"})).await;
    eventually("the mirror holds the source's tree again", || async {
        at("feeds/z").await.as_deref() == Some(new.as_str())
            && at("feeds/x").await.as_deref() == Some(kept.as_str())
            && at("feeds/y").await.is_none()
    })
    .await;
    let state = mirror_state(&mirror, "feeds").await;
    assert_eq!(state["applies"]["history_lost"], 1, "{state}");
}

/// `delivery` with `epochs` in its EXECUTE, signed again.
fn with_epochs(sender: &Peer, mut delivery: Value, epochs: Value, granted: &Map<String, Value>) -> Value {
    delivery["execute"]["data"]["epochs"] = epochs;
    let mut included = granted.clone();
    sender.sign_into(&hash_of(&delivery["execute"]).unwrap(), &mut included);
    delivery["included"] = json!(included);
    delivery
}

async fn a_sender_s_list_of_epochs_is_checked_and_tells_its_own_stream_only(backend: Backend) {
    let c = Server::start(backend).await;
    let inbox = "system/inbox/feed";
    let (sender, token, granted) = granted_sender(&c, inbox).await;
    let data =
        |stream: &str, n: i64| json!({"subscription_id": stream, "event": "created", "uri": "feeds/x", "hash": format!("sha256:{n:064x}")});
    let send = |seq: i64, stream: &'static str, epochs: Value| {
        let plain = delivery(&sender, &c, inbox, &token, seq, data(stream, seq), granted.clone());
        with_epochs(&sender, plain, epochs, &granted)
    };
    // Two streams of the sender, at 7 and at 2.
    for (seq, stream) in [(7, "s1"), (2, "s2")] {
        let (status, body) = execute_at(&c.http, c.base(), &send(seq, stream, json!([]))).await;
        assert_eq!(status, 200, "{body}");
    }
    let head = c.head().await;
    // Lists that are not a sender's epochs: refused, nothing stored.
    let many: Vec<Value> = (1..=65).map(|n| json!({"number": n, "fork": n, "base": n + 1})).collect();
    for bad in [
        json!([{"number": 0, "fork": 3, "base": 9}]),
        json!([{"number": 1, "fork": 9, "base": 3}]),
        json!([{"number": 1, "fork": -1, "base": 3}]),
        json!([{"number": 2, "fork": 3, "base": 9}, {"number": 1, "fork": 3, "base": 20}]),
        json!([{"number": 1, "fork": 3, "base": 9, "extra": true}]),
        json!(many),
        json!({"number": 1}),
    ] {
        let (status, body) = execute_at(&c.http, c.base(), &send(10, "s1", bad.clone())).await;
        assert_eq!((status, code(&body)), (400, "invalid_execute"), "{bad}: {body}");
    }
    assert_eq!(c.head().await, head, "no refused delivery stored anything");
    // The sender lost (3, 9]: stream s1 (at 7) is told, once; stream s2
    // (at 2, below the fork) is not.
    let epochs = json!([{"number": 1, "fork": 3, "base": 9}]);
    for (seq, stream) in [(10, "s1"), (11, "s1"), (10, "s2")] {
        let (status, body) = execute_at(&c.http, c.base(), &send(seq, stream, epochs.clone())).await;
        assert_eq!((status, body["result"]["duplicate"].as_bool()), (200, Some(false)), "{body}");
    }
    let got = addressed(&c, inbox, head, 0).await;
    let kinds: Vec<(&str, &str)> =
        got.iter().map(|e| (e["event_type"].as_str().unwrap(), e["payload"]["data"]["subscription_id"].as_str().unwrap())).collect();
    assert_eq!(
        kinds,
        [
            ("subscription.history_lost", "s1"),
            ("subscription.notification", "s1"),
            ("subscription.notification", "s1"),
            ("subscription.notification", "s2")
        ],
        "{got:?}"
    );
    let told = &got[0]["payload"]["data"];
    assert_eq!((told["requested"].as_i64(), told["fork"].as_i64(), told["base"].as_i64()), (Some(7), Some(3), Some(9)), "{told}");
    // A retry of the delivery that brought the notice stores nothing.
    let (status, body) = execute_at(&c.http, c.base(), &send(10, "s1", epochs)).await;
    assert_eq!((status, body["result"]["duplicate"].as_bool()), (200, Some(true)), "{body}");
    assert_eq!(c.head().await, head + 4);
}
