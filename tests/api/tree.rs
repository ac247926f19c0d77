//! The entity tree: CAS writes, bad paths and entities, listings, and the
//! change events every write appends (with correct hashes, in commit order).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with};

both_stores!(
    cas_matrix,
    if_match_star_matches_any_entity,
    bad_paths_and_entities_store_nothing,
    change_events_chain_hashes,
    concurrent_cas_writers_keep_the_chain,
    concurrent_writes_are_committed_together_each_with_its_own_outcome,
    peers_are_seeded_from_settings_and_checked_on_every_write
);

async fn put(app: &TestApp, path: &str, body: Value, header: Option<(&str, &str)>) -> (u16, Value) {
    let mut r = app.http.put(app.url(&format!("/v1/tree/{path}"))).json(&body);
    if let Some((k, v)) = header {
        r = r.header(k, v);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn delete(app: &TestApp, path: &str, if_match: Option<&str>) -> (u16, Value) {
    let mut r = app.http.delete(app.url(&format!("/v1/tree/{path}")));
    if let Some(h) = if_match {
        r = r.header("if-match", format!("\"{h}\""));
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn quoted(h: &Value) -> String {
    format!("\"{}\"", h.as_str().unwrap())
}

async fn cas_matrix(backend: Backend) {
    let app = spawn_app(backend).await;
    let (status, created) = put(&app, "notes/a", json!({"type": "note", "data": {"v": 1}}), None).await;
    assert_eq!(status, 201, "{created}");
    let h1 = created["hash"].clone();
    assert_eq!(created["previous_hash"], Value::Null);
    assert_eq!(created["uri"], "notes/a");
    // GET: the canonical entity, the hash as ETag.
    let r = app.http.get(app.url("/v1/tree/notes/a")).send().await.unwrap();
    assert_eq!(r.headers()["etag"].to_str().unwrap(), quoted(&h1));
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"type": "note", "data": {"v": 1}}));
    // Create-only on an existing entity.
    let (status, body) = put(&app, "notes/a", json!({"type": "note", "data": {"v": 9}}), Some(("if-none-match", "*"))).await;
    assert_eq!((status, body["error"].as_str(), &body["current_hash"]), (409, Some("hash_mismatch"), &h1));
    // If-Match with a stale hash, then the right one.
    let stale = "\"sha256:0000000000000000000000000000000000000000000000000000000000000000\"";
    let (status, body) = put(&app, "notes/a", json!({"type": "note", "data": {"v": 2}}), Some(("if-match", stale))).await;
    assert_eq!((status, &body["current_hash"]), (409, &h1));
    let (status, updated) = put(&app, "notes/a", json!({"type": "note", "data": {"v": 2}}), Some(("if-match", &quoted(&h1)))).await;
    assert_eq!(status, 200);
    assert_eq!(updated["previous_hash"], h1);
    let h2 = updated["hash"].clone();
    assert_ne!(h1, h2);
    // The same entity written with other key order and number spelling keeps its hash.
    let (status, same) = put(&app, "notes/a", serde_json::from_str(r#"{"data":{"v":2.0},"type":"note"}"#).unwrap(), None).await;
    assert_eq!((status, &same["hash"], &same["previous_hash"]), (200, &h2, &h2));
    // If-Match on a missing path, create-only on a missing path.
    let (status, body) = put(&app, "notes/b", json!({"type": "note", "data": {}}), Some(("if-match", &quoted(&h1)))).await;
    assert_eq!((status, &body["current_hash"]), (409, &Value::Null));
    assert_eq!(put(&app, "notes/b", json!({"type": "note", "data": {}}), Some(("if-none-match", "*"))).await.0, 201);
    // Delete: wrong hash, right hash, then nothing there.
    assert_eq!(delete(&app, "notes/a", Some(h1.as_str().unwrap())).await.0, 409);
    let (status, deleted) = delete(&app, "notes/a", Some(h2.as_str().unwrap())).await;
    assert_eq!((status, &deleted["previous_hash"], &deleted["hash"]), (200, &h2, &Value::Null));
    let r = app.http.get(app.url("/v1/tree/notes/a")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "entity_not_found");
    assert_eq!(delete(&app, "notes/a", None).await.1["error"], "entity_not_found");
    // Listings: children of a path, and the root.
    put(&app, "notes/deep/x", json!({"type": "note", "data": {}}), None).await;
    let list: Value = app.http.get(app.url("/v1/tree/notes/")).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        list["children"],
        json!([
            {"name": "b", "path": "notes/b", "entity": true, "has_children": false},
            {"name": "deep", "path": "notes/deep", "entity": false, "has_children": true}
        ])
    );
    let root: Value = app.http.get(app.url("/v1/tree/")).send().await.unwrap().json().await.unwrap();
    assert_eq!(root["children"][0]["name"], "notes");
}

/// `If-Match: *` (RFC 9110) matches any current entity: it updates or
/// deletes what is there, and is a `409 hash_mismatch` when nothing is.
async fn if_match_star_matches_any_entity(backend: Backend) {
    let app = spawn_app(backend).await;
    let star = Some(("if-match", "*"));
    let (status, body) = put(&app, "notes/s", json!({"type": "note", "data": {"v": 1}}), star).await;
    assert_eq!((status, body["error"].as_str(), &body["current_hash"]), (409, Some("hash_mismatch"), &Value::Null));
    assert_eq!(app.http.get(app.url("/v1/tree/notes/s")).send().await.unwrap().status(), 404, "nothing was stored");
    let (status, created) = put(&app, "notes/s", json!({"type": "note", "data": {"v": 1}}), None).await;
    assert_eq!(status, 201);
    let (status, updated) = put(&app, "notes/s", json!({"type": "note", "data": {"v": 2}}), star).await;
    assert_eq!((status, &updated["previous_hash"]), (200, &created["hash"]), "{updated}");
    let del = || app.http.delete(app.url("/v1/tree/notes/s")).header("if-match", "*").send();
    let r = del().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["previous_hash"], updated["hash"]);
    let r = del().await.unwrap();
    assert_eq!(r.status(), 409, "If-Match: * on nothing");
    assert_eq!(r.json::<Value>().await.unwrap()["current_hash"], Value::Null);
}

async fn bad_paths_and_entities_store_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let good = json!({"type": "note", "data": {}});
    for path in ["a//b", "a/%C3%A9", "a/b%20c", "a%2Fb/"] {
        let (status, body) = put(&app, path, good.clone(), None).await;
        assert_eq!((status, body["error"].as_str()), (400, Some("invalid_path")), "{path}: {body}");
    }
    // Dot segments, sent as they are (HTTP clients would resolve them).
    for path in ["a/../b", "a/./b", "../b"] {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let body = good.to_string();
        let mut socket = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://")).await.unwrap();
        let request = format!(
            "PUT /v1/tree/{path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        socket.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        socket.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{path}: {answer}");
        assert!(answer.contains("invalid_path"), "{path}: {answer}");
    }
    let deep = vec!["s"; 40].join("/");
    assert_eq!(put(&app, &deep, good.clone(), None).await.1["error"], "invalid_path");
    for chain in ["a/b", "..", "sp ace"] {
        assert_eq!(put(&app, "ok/path", good.clone(), Some(("x-chain-id", chain))).await.1["error"], "invalid_chain_id", "{chain}");
    }
    for body in [
        json!({"type": "note"}),
        json!({"data": {}}),
        json!({"type": "", "data": {}}),
        json!({"type": "n", "data": {}, "extra": 1}),
        json!([1]),
    ] {
        let (status, answer) = put(&app, "ok/path", body.clone(), None).await;
        assert_eq!((status, answer["error"].as_str()), (400, Some("invalid_entity")), "{body}");
    }
    let r = app.http.put(app.url("/v1/tree/ok/path")).header("content-type", "application/json").body("{\"type\":").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let (status, body) = put(&app, "ok/path", good.clone(), Some(("if-none-match", "\"abc\""))).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("invalid_condition")));
    assert_eq!(app.head().await, 0, "no event was appended");
    assert_eq!(app.http.get(app.url("/v1/tree/ok/path")).send().await.unwrap().status(), 404, "nothing was stored");
}

async fn change_events_chain_hashes(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut live = app.stream("?targets=tree:docs/readme", None).await;
    let (_, a) = put(&app, "docs/readme", json!({"type": "doc", "data": {"rev": 1}}), Some(("x-chain-id", "deploy-42"))).await;
    let (_, b) = put(&app, "docs/readme", json!({"type": "doc", "data": {"rev": 2}}), None).await;
    put(&app, "docs/other", json!({"type": "doc", "data": {}}), None).await; // another target
    let (_, c) = delete(&app, "docs/readme", None).await;
    let mut events = Vec::new();
    for _ in 0..3 {
        events.push(serde_json::from_str::<Value>(&live.next().await.data).unwrap());
    }
    let types: Vec<&str> = events.iter().map(|e| e["event_type"].as_str().unwrap()).collect();
    assert_eq!(types, ["tree.created", "tree.updated", "tree.deleted"]);
    assert!(events.iter().all(|e| e["ref"] == "tree:docs/readme" && e["payload"]["uri"] == "docs/readme"));
    // The chain id: X-Chain-Id when given, else a fresh one per write.
    assert_eq!(events[0]["payload"]["chain_id"], "deploy-42");
    let generated = events[1]["payload"]["chain_id"].as_str().unwrap().to_owned();
    assert!(generated.len() == 32 && generated != events[2]["payload"]["chain_id"], "{generated}");
    for e in &mut events {
        e["payload"].as_object_mut().unwrap().remove("chain_id");
    }
    assert_eq!(events[0]["payload"], json!({"uri": "docs/readme", "hash": a["hash"]}));
    assert_eq!(events[1]["payload"], json!({"uri": "docs/readme", "hash": b["hash"], "previous_hash": a["hash"]}));
    assert_eq!(events[2]["payload"], json!({"uri": "docs/readme", "previous_hash": b["hash"]}));
    assert_eq!(events[2]["event_id"], c["event_id"]);
    // The same through replay, with a type glob.
    let mut replay = app.stream("?since=0&types=tree.*&targets=tree:docs/readme", None).await;
    assert_eq!(replay.ids(3).await, events.iter().map(|e| e["event_id"].as_i64().unwrap()).collect::<Vec<_>>());
}

/// Several writers doing read-modify-write with If-Match on one path: every
/// accepted write is one event, and each event's previous_hash is the hash of
/// the one before it, in commit order.
async fn concurrent_cas_writers_keep_the_chain(backend: Backend) {
    let app = Arc::new(spawn_app(backend).await);
    put(&app, "counter", json!({"type": "counter", "data": {"n": 0}}), None).await;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let app = app.clone();
            tokio::spawn(async move {
                let mut won = 0;
                for _ in 0..25 {
                    loop {
                        let r = app.http.get(app.url("/v1/tree/counter")).send().await.unwrap();
                        let etag = r.headers()["etag"].to_str().unwrap().to_owned();
                        let n = r.json::<Value>().await.unwrap()["data"]["n"].as_i64().unwrap();
                        let body = json!({"type": "counter", "data": {"n": n + 1, "by": w}});
                        match put(&app, "counter", body, Some(("if-match", &etag))).await.0 {
                            200 => break,
                            409 => continue,
                            other => panic!("unexpected {other}"),
                        }
                    }
                    won += 1;
                }
                won
            })
        })
        .collect();
    let mut total = 0;
    for w in writers {
        total += w.await.unwrap();
    }
    assert_eq!(total, 100);
    let value: Value = app.http.get(app.url("/v1/tree/counter")).send().await.unwrap().json().await.unwrap();
    assert_eq!(value["data"]["n"], 100, "no lost update");
    let mut replay = app.stream("?since=0&targets=tree:counter", None).await;
    let mut previous: Option<Value> = None;
    for _ in 0..101 {
        let e: Value = serde_json::from_str(&replay.next().await.data).unwrap();
        assert_eq!(e["payload"].get("previous_hash").cloned(), previous, "the chain is unbroken");
        previous = Some(e["payload"]["hash"].clone());
    }
}

/// Tree writes that arrive together are committed in groups (one
/// transaction, one fsync), and each still gets the outcome it would have
/// had alone, in commit order: of eight writes with the same `If-Match`
/// exactly one wins and the others see its hash; of four create-only
/// writes one creates; invalid bodies are refused before they join and
/// store nothing; every accepted write is one event, ids gap-free.
async fn concurrent_writes_are_committed_together_each_with_its_own_outcome(backend: Backend) {
    let server = crate::helpers::federation::Server::start_with(backend, &[("TIDINGS_PUBLISH_GROUP_DELAY", "300ms")]).await;
    let base = server.base().to_owned();
    let put = |path: String, body: Value, header: Option<(&'static str, String)>| {
        let (http, base) = (server.http.clone(), base.clone());
        async move {
            let mut r = http.put(format!("{base}/v1/tree/{path}")).json(&body);
            if let Some((k, v)) = header {
                r = r.header(k, v);
            }
            let r = r.send().await.unwrap();
            (path, r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let (_, status, first) = put("g/shared".into(), json!({"type": "note", "data": {"v": 0}}), None).await;
    assert_eq!(status, 201, "{first}");
    let h0 = first["hash"].as_str().unwrap().to_owned();
    let (_, status, _) = put("g/gone".into(), json!({"type": "note", "data": {"v": 0}}), None).await;
    assert_eq!(status, 201);
    let before = server.head().await;
    let mut writes = Vec::new();
    for i in 0..16 {
        writes.push(put(format!("g/p{i}"), json!({"type": "note", "data": {"i": i}}), None));
    }
    for i in 0..8 {
        writes.push(put("g/shared".into(), json!({"type": "note", "data": {"v": 1, "by": i}}), Some(("if-match", format!("\"{h0}\"")))));
    }
    for i in 0..4 {
        writes.push(put("g/new".into(), json!({"type": "note", "data": {"by": i}}), Some(("if-none-match", "*".to_owned()))));
    }
    for i in 0..4 {
        writes.push(put(format!("g/bad{i}"), json!({"type": "note"}), None));
    }
    // Unconditional writes to one path: all apply, one after the other.
    for i in 0..4 {
        writes.push(put("g/same".into(), json!({"type": "note", "data": {"by": i}}), None));
    }
    let gone = {
        let (http, base) = (server.http.clone(), base.clone());
        async move { http.delete(format!("{base}/v1/tree/g/gone")).send().await.unwrap().status().as_u16() }
    };
    let (answers, gone) = tokio::join!(futures_util::future::join_all(writes), gone);
    assert_eq!(gone, 200);
    let count = |path: &str, status: u16| answers.iter().filter(|(p, s, _)| p.starts_with(path) && *s == status).count();
    assert_eq!(count("g/p", 201), 16, "{answers:?}");
    assert_eq!((count("g/shared", 200), count("g/shared", 409)), (1, 7), "{answers:?}");
    assert_eq!((count("g/new", 201), count("g/new", 409)), (1, 3), "{answers:?}");
    assert_eq!(count("g/bad", 400), 4, "{answers:?}");
    // The losers of the shared path saw the winner's hash.
    let winner = answers.iter().find(|(p, s, _)| p == "g/shared" && *s == 200).unwrap();
    assert_eq!(winner.2["previous_hash"], h0.as_str());
    for (_, _, body) in answers.iter().filter(|(p, s, _)| p == "g/shared" && *s == 409) {
        assert_eq!(body["current_hash"], winner.2["hash"], "{body}");
    }
    assert_eq!(count("g/same", 201) + count("g/same", 200), 4, "{answers:?}");
    // 23 accepted writes, 23 events, gap-free from the head; the refused
    // and the mismatched stored nothing.
    assert_eq!(server.head().await, before + 23);
    let r: Value =
        server.http.get(format!("{base}/v1/poll?since={before}&limit=100&types=tree.*")).send().await.unwrap().json().await.unwrap();
    let events = r["events"].as_array().unwrap();
    let ids: Vec<i64> = events.iter().map(|e| e["event_id"].as_i64().unwrap()).collect();
    assert_eq!(ids, (before + 1..=before + 23).collect::<Vec<_>>());
    let mut uris: Vec<&str> = events.iter().map(|e| e["payload"]["uri"].as_str().unwrap()).collect();
    uris.sort_unstable();
    let mut want: Vec<String> = (0..16).map(|i| format!("g/p{i}")).collect();
    want.extend(["g/new", "g/shared", "g/gone", "g/same", "g/same", "g/same", "g/same"].map(String::from));
    want.sort_unstable();
    assert_eq!(uris, want);
    // Each answer names its own event; one path's events chain their
    // hashes in commit order, and the path holds the last one's entity.
    for (path, _, body) in answers.iter().filter(|(_, s, _)| *s == 200 || *s == 201) {
        let event = events.iter().find(|e| e["event_id"] == body["event_id"]).unwrap_or_else(|| panic!("{body}"));
        assert_eq!((event["payload"]["uri"].as_str(), &event["payload"]["hash"]), (Some(path.as_str()), &body["hash"]));
    }
    let same: Vec<&Value> = events.iter().filter(|e| e["payload"]["uri"] == "g/same").collect();
    assert_eq!(same[0]["payload"].get("previous_hash"), None, "{:?}", same[0]);
    for pair in same.windows(2) {
        assert_eq!(pair[1]["payload"]["previous_hash"], pair[0]["payload"]["hash"]);
    }
    let r = server.http.get(format!("{base}/v1/tree/g/same")).send().await.unwrap();
    assert_eq!(r.headers()["etag"].to_str().unwrap(), format!("\"{}\"", same[3]["payload"]["hash"].as_str().unwrap()));
    let r = server.http.get(format!("{base}/v1/tree/g/gone")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let r = server.http.get(format!("{base}/v1/tree/g/bad0")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(server.metric("tidings_publish_group_events_count{kind=\"tree\"}").await >= 1.0, "writes were committed together");
}

/// `TIDINGS_PEERS` writes `system/peer/<hash>` entities at start-up, once
/// (a restart writes nothing new, and puts back what an admin changed);
/// every write under `system/peer/` must be a `system/peer` `{endpoint}` at
/// an identity hash, or it is `400 invalid_entity` and nothing is stored.
async fn peers_are_seeded_from_settings_and_checked_on_every_write(backend: Backend) {
    let (_, _, seeded) = crate::helpers::ed25519_identity();
    let peer = tidings_protocol::peer::Peer { hash: seeded.clone(), endpoint: "http://127.0.0.1:9".into() };
    let app = spawn_app_with(backend, |s| s.federation.peers = tidings_server::config::Peers(vec![peer.clone()])).await;
    let path = format!("system/peer/{seeded}");
    let r = app.http.get(app.url(&format!("/v1/tree/{path}"))).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"type": "system/peer", "data": {"endpoint": "http://127.0.0.1:9"}}));
    let changes = |app: &TestApp| {
        let url = app.url("/v1/poll?since=0&types=tree.*&limit=100");
        let http = app.http.clone();
        async move { http.get(url).send().await.unwrap().json::<Value>().await.unwrap()["events"].as_array().unwrap().len() }
    };
    assert_eq!(changes(&app).await, 1, "one write at start-up");
    // An admin may change it; the setting puts it back at the next start.
    let (status, _) = put(&app, &path, json!({"type": "system/peer", "data": {"endpoint": "https://elsewhere:8443"}}), None).await;
    assert_eq!(status, 200);
    let app = app.restart().await;
    let r: Value = app.http.get(app.url(&format!("/v1/tree/{path}"))).send().await.unwrap().json().await.unwrap();
    assert_eq!(r["data"]["endpoint"], "http://127.0.0.1:9");
    let app = app.restart().await;
    assert_eq!(changes(&app).await, 3, "a restart with the entity in place writes nothing");

    // Admin writes: a good one, then each kind of bad one.
    let (_, _, other) = crate::helpers::ed25519_identity();
    let good = json!({"type": "system/peer", "data": {"endpoint": "https://peer.example/base"}});
    assert_eq!(put(&app, &format!("system/peer/{other}"), good.clone(), None).await.0, 201);
    let (_, _, third) = crate::helpers::ed25519_identity();
    let bad_path = "system/peer/not-a-hash".to_owned();
    let at = format!("system/peer/{third}");
    for (path, body) in [
        (&bad_path, good.clone()),
        (&at, json!({"type": "note", "data": {"endpoint": "http://h"}})),
        (&at, json!({"type": "system/peer", "data": {}})),
        (&at, json!({"type": "system/peer", "data": {"endpoint": "ftp://h"}})),
        (&at, json!({"type": "system/peer", "data": {"endpoint": "http://h/?q=1"}})),
        (&at, json!({"type": "system/peer", "data": {"endpoint": "http://h", "extra": true}})),
    ] {
        let (status, answer) = put(&app, path, body.clone(), None).await;
        assert_eq!((status, answer["error"].as_str()), (400, Some("invalid_entity")), "{body}: {answer}");
    }
    let r = app.http.get(app.url(&format!("/v1/tree/{at}"))).send().await.unwrap();
    assert_eq!(r.status(), 404, "nothing stored");
    assert_eq!(changes(&app).await, 4);
}
