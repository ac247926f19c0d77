//! The store conformance suite: the same trait-level checks against every
//! backend, with no server in between. A new backend passes these before
//! anything else: append and read ordering, gap-free ids under concurrent
//! appends, commit-ordered visibility, the consumer cursor rules, tree
//! compare-and-swap with its change events, the content store, the engine's
//! compare-and-set cursor, and pruning.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use crate::helpers::gather;
use tidings_protocol::event::{Agent, EventBody, Visibility};
use tidings_protocol::tree::change_event;
use tidings_server::store::embedded::EmbeddedStore;
use tidings_server::store::postgres::{PostgresOptions, PostgresStore};
use tidings_server::store::{
    Acked, Actor, Bounds, ChangeKind, Condition, ConsumerOpen, EngineCommit, EngineEffect, EpochReason, IdempotencyKey, Moved, NewRecord,
    Opened, Publish, Published, Store, TreeOutcome, TreeWrite,
};

/// Runs a conformance check once per backend, on a fresh store each.
macro_rules! every_store {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let store = super::postgres_store().await;
                super::$name(store).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn embedded() {
                let dir = tempfile::tempdir().unwrap();
                let store = super::embedded_store(dir.path()).await;
                super::$name(store).await
            }
        }
    )*};
}

every_store!(
    append_and_read_in_order,
    ids_stay_gap_free_under_concurrent_appends,
    readers_never_see_an_id_appear_below_one_seen,
    consumer_cursor_rules,
    consumer_ownership_and_expiry,
    peer_marks_only_rise_and_count_another_log,
    tree_compare_and_swap,
    content_store_is_idempotent,
    engine_cursor_is_compare_and_set,
    prune_keeps_history_contiguous_and_spares_the_engine,
    idempotency_keys_replay_refuse_expire_and_are_pruned,
    a_new_epoch_hands_out_ids_past_every_one_and_retention_counts_events,
);

async fn postgres_store() -> Arc<dyn Store> {
    let (url, _) = crate::helpers::fresh_database().await;
    let options = PostgresOptions {
        pool_size: 8,
        acquire_timeout: Duration::from_secs(5),
        replica_urls: Vec::new(),
        broker_reads_replica: false,
        replicated_delivery: false,
        replica_max_lag: Duration::ZERO,
    };
    Arc::new(PostgresStore::connect(&url, options).await.expect("connecting the test database"))
}

async fn embedded_store(dir: &std::path::Path) -> Arc<dyn Store> {
    Arc::new(EmbeddedStore::open(dir).await.expect("opening an embedded store"))
}

fn record(n: usize) -> NewRecord {
    NewRecord { event_type: "conformance.appended".into(), body: format!("{{\"n\":{n}}}") }
}

async fn append_and_read_in_order(store: Arc<dyn Store>) {
    assert_eq!(store.head().await.unwrap(), 0, "a new store is empty");
    assert_eq!(store.floor().await.unwrap(), 0);
    assert_eq!(store.bounds().await.unwrap(), Bounds { floor: 0, head: 0, epoch: 0 });
    assert!(store.read_after(0, 10).await.unwrap().is_empty());

    assert_eq!(store.append(vec![record(0)]).await.unwrap(), vec![1]);
    assert_eq!(store.append(vec![record(1), record(2), record(3)]).await.unwrap(), vec![2, 3, 4], "a batch takes consecutive ids");
    assert_eq!(store.head().await.unwrap(), 4);

    let rows = store.read_after(0, 10).await.unwrap();
    assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.body, format!("{{\"n\":{i}}}"), "bodies come back as appended");
        assert!(row.recorded_ms > 0, "every record has its commit time");
    }
    let page = store.read_after(1, 2).await.unwrap();
    assert_eq!(page.iter().map(|r| r.id).collect::<Vec<_>>(), vec![2, 3], "read_after honours its bound and its limit");
    assert!(store.read_after(4, 10).await.unwrap().is_empty(), "nothing after the head");
    store.ping().await.unwrap();
}

async fn ids_stay_gap_free_under_concurrent_appends(store: Arc<dyn Store>) {
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for i in 0..25 {
                    let batch: Vec<NewRecord> = (0..1 + (t + i) % 3).map(|k| record(t * 1000 + i * 10 + k)).collect();
                    let len = batch.len();
                    let got = store.append(batch).await.unwrap();
                    assert_eq!(got.len(), len);
                    assert!(got.windows(2).all(|w| w[1] == w[0] + 1), "one batch's ids are consecutive: {got:?}");
                    ids.extend(got);
                }
                ids
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all.sort_unstable();
    let n = all.len() as i64;
    assert_eq!(all, (1..=n).collect::<Vec<_>>(), "every id from 1 to {n} exactly once");
    assert_eq!(store.head().await.unwrap(), n);
    let mut read = Vec::new();
    let mut after = 0;
    loop {
        let rows = store.read_after(after, 37).await.unwrap();
        let Some(last) = rows.last() else { break };
        after = last.id;
        read.extend(rows.into_iter().map(|r| r.id));
    }
    assert_eq!(read, (1..=n).collect::<Vec<_>>(), "reads page through every id in order");
}

async fn readers_never_see_an_id_appear_below_one_seen(store: Arc<dyn Store>) {
    const WRITERS: usize = 6;
    const EACH: usize = 40;
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..EACH {
                    store.append(vec![record(w * 100 + i)]).await.unwrap();
                }
            })
        })
        .collect();
    // A reader that follows the log by its high-water mark: if an id below
    // one it has seen became visible later, it would find a hole here.
    let reader = {
        let store = store.clone();
        tokio::spawn(async move {
            let end = (WRITERS * EACH) as i64;
            let store = &store;
            gather(
                Duration::from_secs(60),
                0,
                |high| format!("the reader reached {high} of {end}"),
                |mut high: i64| async move {
                    for row in store.read_after(high, 1000).await.unwrap() {
                        assert_eq!(row.id, high + 1, "ids become visible in order, with no hole");
                        high = row.id;
                    }
                    tokio::task::yield_now().await;
                    if high >= end { ControlFlow::Break(high) } else { ControlFlow::Continue(high) }
                },
            )
            .await
        })
    };
    for w in writers {
        w.await.unwrap();
    }
    assert_eq!(reader.await.unwrap(), (WRITERS * EACH) as i64);
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn open<'a>(id: &'a str, since: Option<i64>, actor: Actor<'a>) -> ConsumerOpen<'a> {
    ConsumerOpen { id, filter_json: None, since, expire_before_ms: 0, now_ms: now_ms(), actor, max_owned: 100 }
}

const ALICE: Actor<'static> = Actor { sub: "alice", admin: false };
const BOB: Actor<'static> = Actor { sub: "bob", admin: false };
const ADMIN: Actor<'static> = Actor { sub: "root", admin: true };

async fn consumer_cursor_rules(store: Arc<dyn Store>) {
    store.append((0..10).map(record).collect()).await.unwrap();
    // A new consumer starts at the head: it gets what is published from now on.
    let Opened::Ready(c) = store.consumer_open(open("c1", None, ALICE)).await.unwrap() else { panic!("not opened") };
    assert_eq!((c.cursor, c.owner.as_str(), c.filter_json), (10, "alice", None));
    // With a since, it starts there.
    let Opened::Ready(c) = store.consumer_open(open("c2", Some(3), ALICE)).await.unwrap() else { panic!("not opened") };
    assert_eq!(c.cursor, 3);
    // Only confirmations move the cursor: a monotonic max, clamped to the head.
    let moved = Moved { before: 3, cursor: 7, filter_json: None };
    assert_eq!(store.consumer_ack("c2", 7, now_ms(), 0, ALICE).await.unwrap(), Acked::Moved(moved), "an ack says what it confirmed");
    assert_eq!(store.consumer_ack("c2", 5, now_ms(), 0, ALICE).await.unwrap().cursor(), Some(7), "an ack never moves it back");
    assert_eq!(store.consumer_ack("c2", 1_000, now_ms(), 0, ALICE).await.unwrap().cursor(), Some(10), "an ack past the head stops there");
    let Opened::Ready(c) = store.consumer_open(open("c2", Some(4), ALICE)).await.unwrap() else { panic!("not opened") };
    assert_eq!(c.cursor, 10, "a poll's since confirms like an ack: never backwards");
    // A filter given with a poll replaces the stored one; none keeps it.
    let with_filter = ConsumerOpen { filter_json: Some(Some("{\"types\":[\"a.b\"]}")), ..open("c2", None, ALICE) };
    let Opened::Ready(c) = store.consumer_open(with_filter).await.unwrap() else { panic!("not opened") };
    assert_eq!(c.filter_json.as_deref(), Some("{\"types\":[\"a.b\"]}"));
    let Opened::Ready(c) = store.consumer_open(open("c2", None, ALICE)).await.unwrap() else { panic!("not opened") };
    assert_eq!(c.filter_json.as_deref(), Some("{\"types\":[\"a.b\"]}"));
    let moved = Moved { before: 10, cursor: 10, filter_json: Some("{\"types\":[\"a.b\"]}".into()) };
    assert_eq!(
        store.consumer_ack("c2", 9, now_ms(), 0, ALICE).await.unwrap(),
        Acked::Moved(moved),
        "with the filter its events are read through"
    );
    assert_eq!(store.consumer_ack("nobody", 1, now_ms(), 0, ALICE).await.unwrap(), Acked::NotFound);

    // Concurrent acks, ascending and descending interleaved: the maximum wins.
    let tasks: Vec<_> = (0..6)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let values: Vec<i64> = if t % 2 == 0 { (0..=10).collect() } else { (0..=10).rev().collect() };
                for v in values {
                    store.consumer_ack("c1", v, now_ms(), 0, ALICE).await.unwrap();
                }
            })
        })
        .collect();
    store.consumer_ack("c3", 0, now_ms(), 0, ALICE).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    let list = store.consumer_list(ALICE).await.unwrap();
    assert_eq!(list.iter().map(|c| (c.id.as_str(), c.cursor)).collect::<Vec<_>>(), vec![("c1", 10), ("c2", 10)]);

    // Concurrent acks from the start: each says the stretch it moved the
    // cursor over, and together they settle every event once.
    let Opened::Ready(_) = store.consumer_open(open("c4", Some(0), ALICE)).await.unwrap() else { panic!("not opened") };
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut stretches = Vec::new();
                for v in (1..=10).filter(|v| v % (t + 1) == 0 || v == &10) {
                    let Acked::Moved(m) = store.consumer_ack("c4", v, now_ms(), 0, ALICE).await.unwrap() else { panic!("not acked") };
                    assert!(m.before <= m.cursor, "{m:?}");
                    if m.cursor > m.before {
                        stretches.push((m.before, m.cursor));
                    }
                }
                stretches
            })
        })
        .collect();
    let mut stretches = Vec::new();
    for t in tasks {
        stretches.extend(t.await.unwrap());
    }
    stretches.sort_unstable();
    let mut at = 0;
    for (before, cursor) in &stretches {
        assert_eq!(*before, at, "stretches chain without overlap or hole: {stretches:?}");
        at = *cursor;
    }
    assert_eq!(at, 10, "{stretches:?}");
}

/// A mirror's mark of its peer's log: a monotonic max, not clamped to this
/// store's head, per (owner, name), forgotten on request.
async fn peer_marks_only_rise_and_count_another_log(store: Arc<dyn Store>) {
    store.append((0..3).map(record).collect()).await.unwrap();
    assert_eq!(store.peer_mark("tidings:mirror", "feeds").await.unwrap(), None);
    assert_eq!(store.peer_mark_raise("tidings:mirror", "feeds", 5_000, now_ms()).await.unwrap(), 5_000, "past this store's head");
    assert_eq!(store.peer_mark_raise("tidings:mirror", "feeds", 40, now_ms()).await.unwrap(), 5_000, "never lowered");
    assert_eq!(store.peer_mark_raise("tidings:mirror", "other", 7, now_ms()).await.unwrap(), 7);
    assert_eq!(store.peer_mark("tidings:mirror", "feeds").await.unwrap(), Some(5_000));
    store.peer_mark_forget("tidings:mirror", "feeds").await.unwrap();
    assert_eq!(store.peer_mark("tidings:mirror", "feeds").await.unwrap(), None);
    assert_eq!(store.peer_mark("tidings:mirror", "other").await.unwrap(), Some(7));
}

async fn consumer_ownership_and_expiry(store: Arc<dyn Store>) {
    store.append((0..5).map(record).collect()).await.unwrap();
    assert!(matches!(store.consumer_open(open("mine", Some(1), ALICE)).await.unwrap(), Opened::Ready(_)));
    assert_eq!(store.consumer_open(open("mine", None, BOB)).await.unwrap(), Opened::Forbidden, "another identity may not poll it");
    assert_eq!(store.consumer_ack("mine", 2, now_ms(), 0, BOB).await.unwrap(), Acked::Forbidden);
    assert_eq!(store.consumer_delete("mine", BOB).await.unwrap(), Acked::Forbidden);
    assert!(store.consumer_list(BOB).await.unwrap().is_empty(), "one sees only one's own consumers");
    assert_eq!(store.consumer_ack("mine", 2, now_ms(), 0, ADMIN).await.unwrap().cursor(), Some(2), "an admin acts on every consumer");
    assert_eq!(store.consumer_list(ADMIN).await.unwrap().len(), 1);

    // Silence past the TTL collects it; a poll without since is told so.
    assert_eq!(store.consumer_expire(now_ms() + 1_000).await.unwrap(), 1);
    assert_eq!(store.consumer_open(open("mine", None, ALICE)).await.unwrap(), Opened::Expired);
    assert_eq!(store.consumer_ack("mine", 3, now_ms(), 0, ALICE).await.unwrap(), Acked::Expired);
    // An explicit since starts it afresh.
    let Opened::Ready(c) = store.consumer_open(open("mine", Some(4), ALICE)).await.unwrap() else { panic!("not reopened") };
    assert_eq!(c.cursor, 4);
    // A consumer silent since before `expire_before_ms` is collected on open.
    let stale = ConsumerOpen { expire_before_ms: now_ms() + 1_000, ..open("mine", None, ALICE) };
    assert_eq!(store.consumer_open(stale).await.unwrap(), Opened::Expired);
    // Deleting is not expiring: the id is simply free again.
    assert!(matches!(store.consumer_open(open("gone", Some(0), ALICE)).await.unwrap(), Opened::Ready(_)));
    assert_eq!(store.consumer_delete("gone", ALICE).await.unwrap(), Acked::Cursor(0));
    assert_eq!(store.consumer_delete("gone", ALICE).await.unwrap(), Acked::NotFound);
    assert!(matches!(store.consumer_open(open("gone", None, ALICE)).await.unwrap(), Opened::Ready(_)));

    // At its owner's cap a new consumer is refused and nothing is stored;
    // an existing one still opens, and another owner has its own room.
    const CAROL: Actor<'static> = Actor { sub: "carol", admin: false };
    let capped = |id, actor| ConsumerOpen { max_owned: 2, ..open(id, None, actor) };
    for id in ["a", "b"] {
        assert!(matches!(store.consumer_open(capped(id, CAROL)).await.unwrap(), Opened::Ready(_)));
    }
    assert_eq!(store.consumer_open(capped("c", CAROL)).await.unwrap(), Opened::TooMany);
    assert_eq!(store.consumer_list(CAROL).await.unwrap().len(), 2, "the refusal stored nothing");
    assert!(matches!(store.consumer_open(capped("a", CAROL)).await.unwrap(), Opened::Ready(_)));
    assert!(matches!(store.consumer_open(capped("c", BOB)).await.unwrap(), Opened::Ready(_)));
}

fn agent() -> Agent {
    Agent { id: "writer".into(), kind: None }
}

fn put(path: &str, entity: &str, condition: Condition) -> TreeWrite {
    let hash = tidings_protocol::tree::hash_canonical(entity);
    TreeWrite {
        path: path.into(),
        entity: Some((entity.into(), hash.clone())),
        condition,
        event: change_event(path, agent(), Some(hash), "chain".into()),
    }
}

fn delete(path: &str, condition: Condition) -> TreeWrite {
    TreeWrite { path: path.into(), entity: None, condition, event: change_event(path, agent(), None, "chain".into()) }
}

async fn tree_compare_and_swap(store: Arc<dyn Store>) {
    let v1 = r#"{"data":{"v":1},"type":"note"}"#;
    let v2 = r#"{"data":{"v":2},"type":"note"}"#;
    let (h1, h2) = (tidings_protocol::tree::hash_canonical(v1), tidings_protocol::tree::hash_canonical(v2));

    let TreeOutcome::Done { kind, previous_hash, event_id } = store.tree_write(put("a/b", v1, Condition::IfAbsent)).await.unwrap() else {
        panic!("create refused")
    };
    assert_eq!((kind, previous_hash, event_id), (ChangeKind::Created, None, 1));
    assert_eq!(
        store.tree_write(put("a/b", v2, Condition::IfAbsent)).await.unwrap(),
        TreeOutcome::Mismatch { current: Some(h1.clone()) },
        "create-only finds the entity there"
    );
    assert_eq!(
        store.tree_write(put("a/b", v2, Condition::IfMatch(h2.clone()))).await.unwrap(),
        TreeOutcome::Mismatch { current: Some(h1.clone()) },
        "a stale precondition writes nothing"
    );
    assert_eq!(
        store.tree_write(put("a/b", v2, Condition::IfMatch(h1.clone()))).await.unwrap(),
        TreeOutcome::Done { kind: ChangeKind::Updated, previous_hash: Some(h1.clone()), event_id: 2 }
    );
    let entry = store.tree_get("a/b").await.unwrap().expect("the entity");
    assert_eq!((entry.entity.as_str(), entry.hash.as_str()), (v2, h2.as_str()));
    assert_eq!(
        store.tree_write(put("c", v1, Condition::IfMatch(h1.clone()))).await.unwrap(),
        TreeOutcome::Mismatch { current: None },
        "If-Match on nothing is a mismatch"
    );
    store.tree_write(put("a/c/d", v1, Condition::Always)).await.unwrap();
    assert_eq!(store.tree_below("a", 10).await.unwrap(), vec!["a/b".to_owned(), "a/c/d".to_owned()]);
    assert_eq!(store.tree_below("", 1).await.unwrap().len(), 1, "listings honour their limit");
    assert_eq!(store.tree_entries_below("a/c", 10).await.unwrap().iter().map(|e| e.path.as_str()).collect::<Vec<_>>(), vec!["a/c/d"]);

    // The version below a prefix: entries, and the sum of their change ids.
    assert_eq!(store.tree_version_below("a").await.unwrap(), (2, 2 + 3));
    assert_eq!(store.tree_version_below("a/c").await.unwrap(), (1, 3));
    assert_eq!(store.tree_version_below("none").await.unwrap(), (0, 0));
    assert_eq!(store.tree_write(delete("nothing", Condition::Always)).await.unwrap(), TreeOutcome::Missing);
    assert_eq!(
        store.tree_write(delete("a/b", Condition::IfMatch(h1.clone()))).await.unwrap(),
        TreeOutcome::Mismatch { current: Some(h2.clone()) }
    );
    assert_eq!(
        store.tree_write(delete("a/b", Condition::IfMatch(h2.clone()))).await.unwrap(),
        TreeOutcome::Done { kind: ChangeKind::Deleted, previous_hash: Some(h2.clone()), event_id: 4 }
    );
    assert_eq!(store.tree_get("a/b").await.unwrap(), None);
    assert_eq!(store.tree_version_below("a").await.unwrap(), (1, 3), "a deletion lowers the count");

    // Every committed write appended its change event, in commit order; the
    // refused ones appended nothing.
    let rows = store.read_after(0, 100).await.unwrap();
    let changes: Vec<(String, Option<String>, Option<String>)> = rows
        .iter()
        .map(|r| {
            let body: EventBody = serde_json::from_str(&r.body).unwrap();
            assert_eq!(body.visibility, Visibility::Public);
            let field = |k: &str| body.payload.get(k).and_then(|v| v.as_str()).map(str::to_owned);
            (body.event_type, field("uri"), field("previous_hash"))
        })
        .collect();
    assert_eq!(
        changes,
        vec![
            ("tree.created".to_owned(), Some("a/b".to_owned()), None),
            ("tree.updated".to_owned(), Some("a/b".to_owned()), Some(h1.clone())),
            ("tree.created".to_owned(), Some("a/c/d".to_owned()), None),
            ("tree.deleted".to_owned(), Some("a/b".to_owned()), Some(h2.clone())),
        ]
    );
    // What a change names stays readable by hash.
    assert_eq!(store.content_get(&h1).await.unwrap().as_deref(), Some(v1));
}

async fn content_store_is_idempotent(store: Arc<dyn Store>) {
    let body = r#"{"data":{},"type":"x"}"#;
    let hash = tidings_protocol::tree::hash_canonical(body);
    assert_eq!(store.content_get(&hash).await.unwrap(), None);
    store.content_put(vec![(hash.clone(), body.to_owned())]).await.unwrap();
    store.content_put(vec![(hash.clone(), body.to_owned())]).await.unwrap();
    assert_eq!(store.content_get(&hash).await.unwrap().as_deref(), Some(body));
}

async fn engine_cursor_is_compare_and_set(store: Arc<dyn Store>) {
    let (cursor, counts) = store.engine_state().await.unwrap();
    assert_eq!((cursor, counts.len()), (0, 0));
    assert!(store.engine_lead().await.unwrap(), "a lone process leads");
    store.tree_write(put("watched/x", r#"{"data":{},"type":"n"}"#, Condition::Always)).await.unwrap();
    store.append(vec![record(0)]).await.unwrap();
    let (changes, reached) = store.engine_changes(0, &["tree.created"], 10).await.unwrap();
    assert_eq!(changes.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1], "only the types asked for");
    assert_eq!(reached, 2, "the scan reached the head");

    let notification = NewRecord { event_type: "subscription.notification".into(), body: "{}".into() };
    // The tally, its rate_limit window included, comes back as committed.
    let tally = tidings_server::store::Tally { delivered: 1, window: vec![(1_700_000_000, 3), (1_700_000_042, 1)] };
    let step = |from, to| EngineCommit {
        from,
        to,
        effects: vec![EngineEffect::Append(notification.clone())],
        counts: vec![("s1".into(), Some(tally.clone()))],
    };
    assert!(store.engine_commit(step(0, 2)).await.unwrap());
    assert!(!store.engine_commit(step(0, 2)).await.unwrap(), "a second commit from the same cursor loses");
    let (cursor, counts) = store.engine_state().await.unwrap();
    assert_eq!(cursor, 2);
    assert_eq!(counts.get("s1"), Some(&tally));
    assert_eq!(store.head().await.unwrap(), 3, "exactly one notification was appended");
    let forget = EngineCommit { from: 2, to: 3, effects: vec![], counts: vec![("s1".into(), None)] };
    assert!(store.engine_commit(forget).await.unwrap());
    assert!(store.engine_state().await.unwrap().1.is_empty(), "a count can be forgotten");
    store.engine_resign().await;
}

fn keyed(scope: &str, key: &str, body: u8, records: usize, now_ms: i64) -> Publish {
    Publish {
        records: (0..records).map(record).collect(),
        key: Some(IdempotencyKey {
            scope: scope.into(),
            key: key.into(),
            body_hash: [body; 32],
            // The second record is an alias: stored, not answered.
            answer: (0..records).filter(|&p| p != 1).collect(),
            now_ms,
            window_ms: 1_000,
        }),
    }
}

async fn idempotency_keys_replay_refuse_expire_and_are_pruned(store: Arc<dyn Store>) {
    let plain = Publish { records: vec![record(0)], key: None };
    let answers = store.publish(vec![plain.clone(), keyed("alice", "k", 1, 3, 10_000), plain]).await.unwrap();
    assert_eq!(answers, vec![Published::Stored(vec![1]), Published::Stored(vec![2, 3, 4]), Published::Stored(vec![5])]);
    // Later groups: the same body is answered the recorded ids (the alias
    // left out), another body refused, another scope is another key; a
    // group holding one key twice stores it once.
    let answers = store
        .publish(vec![
            keyed("alice", "k", 1, 3, 10_500),
            keyed("alice", "k", 2, 3, 10_500),
            keyed("bob", "k", 1, 1, 10_500),
            keyed("bob", "j", 1, 1, 10_500),
            keyed("bob", "j", 1, 1, 10_500),
        ])
        .await
        .unwrap();
    assert_eq!(
        answers,
        vec![
            Published::Replayed(vec![2, 4]),
            Published::KeyReused,
            Published::Stored(vec![6]),
            Published::Stored(vec![7]),
            Published::Replayed(vec![7]),
        ]
    );
    assert_eq!(store.head().await.unwrap(), 7, "replays and refusals stored nothing");
    // Past its window a key is absent: the publish is new.
    let answers = store.publish(vec![keyed("alice", "k", 2, 1, 11_001)]).await.unwrap();
    assert_eq!(answers, vec![Published::Stored(vec![8])]);
    // Pruning forgets keys recorded before the cut, and only those.
    assert_eq!(store.prune_idempotency(10_600).await.unwrap(), 2, "bob's two keys, recorded at 10,500");
    assert_eq!(store.publish(vec![keyed("alice", "k", 2, 1, 11_002)]).await.unwrap(), vec![Published::Replayed(vec![8])]);
    assert_eq!(store.publish(vec![keyed("bob", "j", 1, 1, 10_600)]).await.unwrap(), vec![Published::Stored(vec![9])]);
}

async fn prune_keeps_history_contiguous_and_spares_the_engine(store: Arc<dyn Store>) {
    store.append((0..10).map(record).collect()).await.unwrap();
    assert_eq!(store.prune(None, Some(3)).await.unwrap(), 0, "nothing the engine has not reached is pruned");
    assert!(store.engine_commit(EngineCommit { from: 0, to: 10, effects: vec![], counts: vec![] }).await.unwrap());
    assert_eq!(store.prune(None, Some(3)).await.unwrap(), 7);
    assert_eq!(store.floor().await.unwrap(), 7, "the oldest resume point served without a gap");
    assert_eq!(store.bounds().await.unwrap(), Bounds { floor: 7, head: 10, epoch: 0 }, "both read at once");
    assert_eq!(store.read_after(0, 100).await.unwrap().iter().map(|r| r.id).collect::<Vec<_>>(), vec![8, 9, 10]);
    assert_eq!(store.head().await.unwrap(), 10, "pruning never moves the head");
    assert_eq!(store.append(vec![record(10)]).await.unwrap(), vec![11], "ids go on after a prune");
    assert_eq!(store.prune(Some(0), None).await.unwrap(), 0, "nothing is older than the epoch");
}

async fn a_new_epoch_hands_out_ids_past_every_one_and_retention_counts_events(store: Arc<dyn Store>) {
    store.append((0..3).map(record).collect()).await.unwrap();
    let first = store.begin_epoch(EpochReason::Operator, 0).await.unwrap();
    assert_eq!((first.number, first.fork), (1, 3));
    assert_eq!(store.bounds().await.unwrap(), Bounds { floor: 0, head: first.base, epoch: 1 });
    // An epoch that hands out nothing before the next begins: the next
    // one's fork is still the last id that survived.
    let second = store.begin_epoch(EpochReason::Operator, first.base + 7).await.unwrap();
    assert_eq!((second.number, second.fork), (2, 3));
    assert!(second.base > first.base + 7, "past every id seen: {second:?}");
    let ids = store.append((0..4).map(record).collect()).await.unwrap();
    assert_eq!(ids, (1..=4).map(|i| second.base + i).collect::<Vec<_>>(), "gap-free within the epoch");
    let epochs = store.epochs(2).await.unwrap();
    assert_eq!(
        epochs.all().iter().map(|e| (e.number, e.fork, e.base)).collect::<Vec<_>>(),
        vec![(0, 0, 0), (1, 3, first.base), (2, 3, second.base)]
    );
    // Ids past the first new base may have been handed out by epoch 1 in a
    // history that is lost too: epoch 2 forked where epoch 1 did.
    assert_eq!((epochs.lost(first.base).map(|e| e.number), epochs.lost(first.base + 3).map(|e| e.number)), (Some(1), Some(2)));
    assert_eq!(epochs.next_after(3), second.base + 1);
    // Retention keeps the newest five events, across the boundary.
    assert!(store.engine_commit(EngineCommit { from: 0, to: second.base + 4, effects: vec![], counts: vec![] }).await.unwrap());
    assert_eq!(store.prune(None, Some(5)).await.unwrap(), 2);
    let kept: Vec<i64> = store.read_after(0, 100).await.unwrap().iter().map(|r| r.id).collect();
    assert_eq!(kept, [vec![3], ids].concat());
}
