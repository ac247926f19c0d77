//! Dissemination trees between real `tidings` processes
//! (docs/ref-federation.md, "Relays" and "Repair"): a source that takes two
//! subscribers per prefix and six servers mirroring it form a tree of relays
//! by capacity redirects, and 100 writes reach every one byte-identical
//! within 1.5 × N settles; a relay killed with SIGKILL while writes go on is
//! replaced by its downstream servers (a cached alternative, else the
//! source's redirect anew), which re-read what they missed and end at the
//! source's latest bytes; and a relay that only stalled, when it was the
//! one place left, takes its mirror back.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::Backend;
use crate::helpers::eventually;
use crate::helpers::federation::Server;
use crate::helpers::mirrors::{PATH, entity, mirror_of, mirror_state, settle};

both_stores!(
    six_mirrors_of_a_capacity_two_source_form_a_tree,
    a_relay_killed_mid_drive_is_repaired_by_its_downstream,
    a_dead_relay_s_slot_is_freed_and_its_orphan_attaches_at_the_source,
    a_stalled_relay_that_was_the_only_offer_takes_its_mirror_back,
    the_subscribe_command_follows_a_redirect_to_a_relay,
);

/// Writes per drive.
const N: usize = 100;
/// Subscribers each server takes per prefix.
const K: &str = "2";

/// A source and `count` servers mirroring `feeds/**` from it, each
/// attached (through whatever redirects) before the next one asks; every
/// server takes K subscribers per prefix.
async fn grow(backend: Backend, count: usize) -> (Server, Vec<Server>) {
    // A repair timeout of 3 s (probes answered within 750 ms): on a loaded
    // two-core machine running fourteen servers, 1 s (250 ms probes) let a
    // live relay that was merely slow count as dead.
    let env: &[(&'static str, &str)] = &[("TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", K), ("TIDINGS_MIRROR_REPAIR_TIMEOUT", "3s")];
    let source = Server::start_with(backend, env).await;
    let mut mirrors = Vec::new();
    for i in 0..count {
        let m = Server::start_with(backend, env).await;
        mirror_of(&m, &source, "feeds").await;
        eventually(&format!("mirror {i} attaches"), || async { mirror_state(&m, "feeds").await["state"] == "subscribed" }).await;
        mirrors.push(m);
    }
    (source, mirrors)
}

/// Each mirror's state, in order.
async fn states(mirrors: &[Server]) -> Vec<Value> {
    let mut states = Vec::new();
    for m in mirrors {
        states.push(mirror_state(m, "feeds").await);
    }
    states
}

/// Drives `PATH` at the source to its end state on every server of
/// `mirrors`: byte-identical to the source, at most 1.5 × N settles each.
async fn converged(source: &Server, mirrors: &[&Server]) -> Vec<usize> {
    let latest = entity(source).await.expect("the source holds the latest write");
    let mut counts = Vec::new();
    for m in mirrors {
        let settled = settle(m, &latest).await;
        assert!(settled.len() <= N * 3 / 2, "{} settled {} writes for {N} (bound 1.5 × N)", m.base(), settled.len());
        assert_eq!(entity(m).await.as_deref(), Some(latest.as_str()), "byte-identical to the source");
        counts.push(settled.len());
    }
    counts
}

async fn six_mirrors_of_a_capacity_two_source_form_a_tree(backend: Backend) {
    let (source, mirrors) = grow(backend, 6).await;
    let states = states(&mirrors).await;
    let direct = states.iter().filter(|s| s["upstream"] == source.hash.as_str()).count();
    assert_eq!(direct, 2, "the source serves two of the six itself: {states:?}");
    let listed: Value =
        source.http.get(format!("{}/v1/tree/system/subscription/", source.base())).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["children"].as_array().unwrap().len(), 2, "{listed}");
    let depth = 1 + states.iter().map(|s| s["hops"].as_u64().unwrap()).max().unwrap();
    assert!(depth >= 2, "the others attach through relays: {states:?}");
    // Every relay serves at most K, and each mirror is attached to the
    // source or another of the six.
    for m in &mirrors {
        let below = states.iter().filter(|s| s["upstream"] == m.hash.as_str()).count();
        assert!(below <= 2, "{} serves {below}", m.base());
    }
    for s in &states {
        assert!(s["upstream"] == source.hash.as_str() || mirrors.iter().any(|m| s["upstream"] == m.hash.as_str()), "{s}");
    }
    let started = Instant::now();
    for i in 0..N {
        source.put(PATH, json!({"n": i})).await;
    }
    let counts = converged(&source, &mirrors.iter().collect::<Vec<_>>()).await;
    eprintln!("tree of six under K = 2: depth {depth}, settles {counts:?} for N = {N}, converged in {} ms", started.elapsed().as_millis());
}

async fn a_relay_killed_mid_drive_is_repaired_by_its_downstream(backend: Backend) {
    let (source, mut mirrors) = grow(backend, 6).await;
    let before = states(&mirrors).await;
    // A relay that serves someone: the one killed.
    let victim = (0..mirrors.len())
        .find(|&i| before.iter().any(|s| s["upstream"] == mirrors[i].hash.as_str()))
        .expect("some mirror relays to another");
    let victim_hash = mirrors[victim].hash.clone();
    let orphans: Vec<usize> = (0..mirrors.len()).filter(|&i| before[i]["upstream"] == victim_hash.as_str()).collect();

    // Writes go on at the source throughout: 100, paced over about 2 s.
    let (third, under_way) = tokio::sync::oneshot::channel();
    let writer = {
        let (http, base) = (source.http.clone(), source.base().to_owned());
        let mut third = Some(third);
        tokio::spawn(async move {
            for i in 0..N {
                if i == N / 3
                    && let Some(t) = third.take()
                {
                    let _ = t.send(());
                }
                let r = http.put(format!("{base}/v1/tree/{PATH}")).json(&json!({"type": "note", "data": {"n": i}})).send().await.unwrap();
                assert!(r.status().is_success(), "{}", r.status());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Killed once a third of the writes went out.
    under_way.await.unwrap();
    let killed = Instant::now();
    mirrors[victim].kill().await;
    for &o in &orphans {
        eventually("the orphan re-attaches elsewhere", || async {
            let s = mirror_state(&mirrors[o], "feeds").await;
            s["state"] == "subscribed" && s["upstream"] != victim_hash.as_str() && s["repairs"] == 1
        })
        .await;
    }
    let reattached = killed.elapsed();
    writer.await.unwrap();

    let survivors: Vec<&Server> = mirrors.iter().enumerate().filter(|(i, _)| *i != victim).map(|(_, m)| m).collect();
    let counts = converged(&source, &survivors).await;
    // No survivor is left without a live upstream, and what it reports
    // matches its metrics.
    let mut repair_ms = Vec::new();
    for (i, m) in mirrors.iter().enumerate().filter(|(i, _)| *i != victim) {
        let s = mirror_state(m, "feeds").await;
        assert_eq!(s["state"], "subscribed", "{s}");
        assert!(s["upstream"] == source.hash.as_str() || survivors.iter().any(|m| s["upstream"] == m.hash.as_str()), "{s}");
        let repairs = m.metric("tidings_mirror_repairs_total{mirror=\"feeds\"}").await;
        assert_eq!(repairs, if orphans.contains(&i) { 1.0 } else { 0.0 }, "{s}");
        assert_eq!(m.metric("tidings_mirror_hops{mirror=\"feeds\"}").await, s["hops"].as_f64().unwrap(), "{s}");
        let upstream = |hash: &str| format!("tidings_mirror_upstream{{mirror=\"feeds\",upstream=\"{hash}\"}}");
        assert_eq!(m.metric(&upstream(s["upstream"].as_str().unwrap())).await, 1.0, "{s}");
        if orphans.contains(&i) {
            repair_ms.push(s["last_repair_ms"].as_u64().unwrap());
            let old = format!("tidings_mirror_upstream{{mirror=\"feeds\",upstream=\"{victim_hash}\"}}");
            let text = m.http.get(format!("{}/metrics", m.base())).send().await.unwrap().text().await.unwrap();
            assert!(text.lines().any(|l| l == format!("{old} 0")), "the dead relay is shown as no longer the upstream");
        }
    }
    eprintln!(
        "relay killed: {} orphans re-attached {} ms after the kill (repair timeout 3 s; repair took {repair_ms:?} ms from the first unanswered probe), settles {counts:?} for N = {N}",
        orphans.len(),
        reattached.as_millis()
    );
}

async fn a_dead_relay_s_slot_is_freed_and_its_orphan_attaches_at_the_source(backend: Backend) {
    // One subscriber per prefix: S ← A ← B, so B's only cached alternative
    // is A itself and S is full with A's subscription.
    let env: &[(&'static str, &str)] = &[
        ("TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", "1"),
        ("TIDINGS_MIRROR_REPAIR_TIMEOUT", "1s"),
        ("TIDINGS_PEER_EVICT_AFTER", "2s"),
        ("TIDINGS_MIRROR_RECONCILE", "1s"),
    ];
    let source = Server::start_with(backend, env).await;
    let mut a = Server::start_with(backend, env).await;
    let b = Server::start_with(backend, env).await;
    for (m, i) in [(&a, 0), (&b, 1)] {
        mirror_of(m, &source, "feeds").await;
        eventually("attached", || async {
            mirror_state(m, "feeds").await["hops"] == i && mirror_state(m, "feeds").await["state"] == "subscribed"
        })
        .await;
    }
    a.kill().await;
    // Writes go on, so S's deliveries to A fail: A is no longer offered,
    // and after TIDINGS_PEER_EVICT_AFTER its subscription ends, freeing
    // the slot B then takes.
    let done = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (http, base, done) = (source.http.clone(), source.base().to_owned(), done.clone());
        tokio::spawn(async move {
            let mut i = 0;
            while !done.is_cancelled() {
                let r = http.put(format!("{base}/v1/tree/{PATH}")).json(&json!({"type": "note", "data": {"n": i}})).send().await.unwrap();
                assert!(r.status().is_success(), "{}", r.status());
                i += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    eventually("B attaches at the source itself", || async {
        let s = mirror_state(&b, "feeds").await;
        s["state"] == "subscribed" && s["upstream"] == source.hash.as_str() && s["hops"] == 0 && s["repairs"] == 1
    })
    .await;
    done.cancel();
    writer.await.unwrap();
    assert_eq!(source.metric("tidings_peer_evictions_total").await, 1.0, "A's subscription was ended for its failures");
    let listed: Value =
        source.http.get(format!("{}/v1/tree/system/subscription/", source.base())).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["children"].as_array().unwrap().len(), 1, "only B's subscription is left: {listed}");
    let latest = entity(&source).await.unwrap();
    settle(&b, &latest).await;
    assert_eq!(entity(&b).await.as_deref(), Some(latest.as_str()));

    // A comes back: the subscription B left there is cancelled by B (its
    // reconciliation tick), not left to deliver until its token expires.
    a.restart().await;
    let a = &a;
    let held_at_a = || async move {
        let listed: Value = a.http.get(format!("{}/v1/tree/system/subscription/", a.base())).send().await.unwrap().json().await.unwrap();
        listed["children"].as_array().map_or(0, Vec::len)
    };
    eventually("B cancels its subscription at A", || async { held_at_a().await == 0 }).await;
}

async fn a_stalled_relay_that_was_the_only_offer_takes_its_mirror_back(backend: Backend) {
    // S ← A ← B with one subscriber per prefix: A holds S's only slot, so
    // when A stalls (SIGSTOP) past B's repair timeout, B's repair has no
    // sibling to go to and S offers only A. Once A answers again, B renews
    // the subscription it left there instead of waiting on S forever; its
    // reconciliation (every second here) does not cancel that subscription
    // meanwhile, though A answers again.
    let env: &[(&'static str, &str)] =
        &[("TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", "1"), ("TIDINGS_MIRROR_REPAIR_TIMEOUT", "3s"), ("TIDINGS_MIRROR_RECONCILE", "1s")];
    let source = Server::start_with(backend, env).await;
    let a = Server::start_with(backend, env).await;
    let b = Server::start_with(backend, env).await;
    for (m, i) in [(&a, 0), (&b, 1)] {
        mirror_of(m, &source, "feeds").await;
        eventually("attached", || async {
            let s = mirror_state(m, "feeds").await;
            s["hops"] == i && s["state"] == "subscribed"
        })
        .await;
    }
    let held = mirror_state(&b, "feeds").await["subscription_id"].clone();
    a.signal("-STOP").await;
    // B's repair was refused everywhere while A was stalled.
    eventually("B's repair finds no place", || async { mirror_state(&b, "feeds").await["state"] == "failing" }).await;
    a.signal("-CONT").await;
    eventually("B is back at A", || async {
        let s = mirror_state(&b, "feeds").await;
        s["state"] == "subscribed" && s["upstream"] == a.hash.as_str() && s["hops"] == 1 && s["repairs"] == 1
    })
    .await;
    let s = mirror_state(&b, "feeds").await;
    assert_eq!(s["subscription_id"], held, "the subscription left at A was renewed, not a second one taken: {s}");
    let listed: Value = a.http.get(format!("{}/v1/tree/system/subscription/", a.base())).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["children"].as_array().unwrap().len(), 1, "A holds B's one subscription: {listed}");
    // And changes flow through A to B again.
    source.put(PATH, json!({"after": "the stall"})).await;
    let latest = entity(&source).await.unwrap();
    settle(&b, &latest).await;
    assert_eq!(entity(&b).await.as_deref(), Some(latest.as_str()));
}

async fn the_subscribe_command_follows_a_redirect_to_a_relay(backend: Backend) {
    use tokio::io::AsyncBufReadExt as _;
    // S takes one subscriber, R (mirroring S) holds that slot.
    let env: &[(&'static str, &str)] = &[("TIDINGS_MAX_SUBSCRIBERS_PER_PREFIX", "1")];
    let (source, relay) = (Server::start_with(backend, env).await, Server::start_with(backend, env).await);
    mirror_of(&relay, &source, "feeds").await;
    eventually("R attached", || async { mirror_state(&relay, "feeds").await["state"] == "subscribed" }).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("cli.key");
    let mut cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_tidings"))
        .args(["subscribe", "feeds/**", "--url", source.base(), "--key", key.to_str().unwrap(), "--json", "--count", "2"])
        .kill_on_drop(true)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(cli.stderr.take().unwrap()).lines();
    let said = loop {
        let line = tokio::time::timeout(Duration::from_secs(20), stderr.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("the command says where it subscribed");
        if line.contains("subscribed at") {
            break line;
        }
    };
    assert!(said.contains(&relay.hash) && said.contains("after 1 redirect"), "{said}");
    for path in ["feeds/a", "feeds/b"] {
        source.put(path, json!({"at": path})).await;
    }
    let mut stdout = tokio::io::BufReader::new(cli.stdout.take().unwrap()).lines();
    let mut uris = Vec::new();
    while let Ok(Ok(Some(line))) = tokio::time::timeout(Duration::from_secs(30), stdout.next_line()).await {
        let envelope: Value = serde_json::from_str(&line).unwrap();
        uris.push(envelope["payload"]["data"]["uri"].as_str().unwrap().to_owned());
    }
    assert_eq!(uris, ["feeds/a", "feeds/b"], "the relay's notifications, in order");
    assert!(cli.wait().await.unwrap().success(), "stops after --count notifications");
    let held: Value = relay.http.get(format!("{}/v1/tree/system/subscription/", relay.base())).send().await.unwrap().json().await.unwrap();
    assert_eq!(held["children"].as_array().unwrap().len(), 1, "the relay holds the command's subscription: {held}");
}
