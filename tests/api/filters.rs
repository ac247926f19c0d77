//! The filter DSL (docs/streams.md) end to end: types with agents, targets,
//! and a payload rule, over live delivery and over replay, and bad filters
//! refused before a stream opens.

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::{Backend, TestApp, spawn_app};

both_stores!(
    type_globs_and_agents_select_events,
    targets_select_events_by_ref_or_link,
    a_payload_rule_selects_events,
    clients_told_apart_by_a_field_get_their_own_events,
    bad_filters_open_no_stream
);

/// `?filter=<url-encoded JSON>` (and `since` when given).
fn query(filter: &Value, since: Option<i64>) -> String {
    let mut url = reqwest::Url::parse("http://x/").unwrap();
    url.query_pairs_mut().append_pair("filter", &filter.to_string());
    if let Some(since) = since {
        url.query_pairs_mut().append_pair("since", &since.to_string());
    }
    format!("?{}", url.query().unwrap())
}

async fn publish(app: &TestApp, body: Value) -> i64 {
    let (status, answer) = app.post_events(&body).await;
    assert_eq!(status, 201, "{answer}");
    answer["event_ids"][0].as_i64().unwrap()
}

/// Opens a live stream with `filter`, runs `expected` (which publishes a mix
/// and returns the ids that must match; its last event is a match, so a
/// leaked non-match would show up before it), and checks that live delivery
/// and a replay from 0 both yield exactly those ids, in order.
async fn live_and_replay(app: &TestApp, filter: Value, expected: impl AsyncFnOnce(&TestApp) -> Vec<i64>) {
    let mut live = app.stream(&query(&filter, None), None).await;
    let expected = expected(app).await;
    assert!(!expected.is_empty());
    assert_eq!(live.ids(expected.len()).await, expected, "live delivery of {filter}");
    let mut replay = app.stream(&query(&filter, Some(0)), None).await;
    assert_eq!(replay.ids(expected.len()).await, expected, "replay of {filter}");
}

async fn type_globs_and_agents_select_events(backend: Backend) {
    let app = spawn_app(backend).await;
    let filter = json!({"types": ["hypothesis.*"], "agents": ["persona:mendel"]});
    live_and_replay(&app, filter, async |app: &TestApp| {
        let mendel_hypothesis = json!({"event_type": "hypothesis.created", "agent": {"id": "persona:mendel"}});
        let a = publish(app, mendel_hypothesis.clone()).await;
        publish(app, json!({"event_type": "hypothesis.created", "agent": {"id": "persona:darwin"}})).await;
        publish(app, json!({"event_type": "comment.posted", "agent": {"id": "persona:mendel"}})).await;
        let b = publish(app, mendel_hypothesis).await;
        vec![a, b]
    })
    .await;
}

async fn targets_select_events_by_ref_or_link(backend: Backend) {
    let app = spawn_app(backend).await;
    let filter = json!({"targets": ["paper:p-123"]});
    live_and_replay(&app, filter, async |app: &TestApp| {
        let cites = |to: &str| json!({"event_type": "link.cites.added", "links": [{"rel": "target", "ref": to}]});
        let a = publish(app, cites("paper:p-123")).await;
        publish(app, cites("paper:p-999")).await;
        let b = publish(app, json!({"event_type": "paper.archived", "ref": "paper:p-123"})).await;
        vec![a, b]
    })
    .await;
}

async fn a_payload_rule_selects_events(backend: Backend) {
    let app = spawn_app(backend).await;
    let filter = json!({"types": ["signal.upvote.recorded"], "payload": {">=": [{"var": "weight"}, 5]}});
    live_and_replay(&app, filter, async |app: &TestApp| {
        let upvote = |w: f64| json!({"event_type": "signal.upvote.recorded", "payload": {"weight": w}});
        let mut expected = Vec::new();
        for w in [1.0, 5.0, 4.99, 7.0, 0.0] {
            let id = publish(app, upvote(w)).await;
            if w >= 5.0 {
                expected.push(id);
            }
        }
        publish(app, json!({"event_type": "signal.fund.recorded", "payload": {"weight": 50}})).await;
        expected.push(publish(app, upvote(12.0)).await);
        expected
    })
    .await;
}

/// Rules that require a field to equal a constant are what the broker
/// indexes by (the field's value, not every rule per event): each client
/// still gets exactly the events its rule is true for, with JsonLogic's
/// coercions (`3 == "3"`, `1 == true`), live and on replay.
async fn clients_told_apart_by_a_field_get_their_own_events(backend: Backend) {
    let app = spawn_app(backend).await;
    let rules = [
        json!({"==": [{"var": "user"}, "ann"]}),
        json!({"==": [{"var": "user"}, "bob"]}),
        json!({"and": [{"==": [3, {"var": "room.n"}]}, {"var": "ok"}]}),
        json!({"===": [{"var": "room.n"}, 3]}),
        json!({"==": [{"var": "flag"}, 1]}),
    ];
    let filters: Vec<Value> = rules.iter().map(|r| json!({"types": ["chat.*"], "payload": r})).collect();
    let mut live = Vec::new();
    for filter in &filters {
        live.push(app.stream(&query(filter, None), None).await);
    }
    let payloads = [
        json!({"user": "ann"}),
        json!({"user": "bob", "room": {"n": 3}, "ok": true}),
        json!({"room": {"n": "3"}, "ok": 1}),
        json!({"room": {"n": "3"}, "ok": false}),
        json!({"user": "carl", "flag": true}),
        json!({"user": "ann", "flag": "1"}),
        json!({"flag": "one", "room": {"n": [3]}}),
    ];
    // Which rules each payload satisfies, by index into `rules`.
    let satisfies: [&[usize]; 7] = [&[0], &[1, 2, 3], &[2], &[], &[4], &[0, 4], &[]];
    let mut expected: Vec<Vec<i64>> = vec![Vec::new(); rules.len()];
    for (payload, rules) in payloads.iter().zip(satisfies) {
        let id = publish(&app, json!({"event_type": "chat.posted", "payload": payload})).await;
        for &r in rules {
            expected[r].push(id);
        }
        // The same payload under another type matches no one.
        publish(&app, json!({"event_type": "mail.sent", "payload": payload})).await;
    }
    // Each stream's last expected event comes after every other, so an
    // event leaked to it would show before that one.
    for (payload, list) in [
        json!({"user": "ann"}),
        json!({"user": "bob"}),
        json!({"room": {"n": 3}, "ok": true}),
        json!({"room": {"n": 3}}),
        json!({"flag": 1}),
    ]
    .into_iter()
    .zip(&mut expected)
    {
        list.push(publish(&app, json!({"event_type": "chat.posted", "payload": payload})).await);
    }
    // The fences of rules 2 and 3 satisfy both of them.
    let fence_2 = expected[2].last().copied().unwrap();
    let fence_3 = expected[3].pop().unwrap();
    expected[3].push(fence_2);
    expected[3].push(fence_3);
    for ((filter, stream), want) in filters.iter().zip(&mut live).zip(&expected) {
        assert_eq!(&stream.ids(want.len()).await, want, "live delivery of {filter}");
        let mut replay = app.stream(&query(filter, Some(0)), None).await;
        assert_eq!(&replay.ids(want.len()).await, want, "replay of {filter}");
    }
}

async fn bad_filters_open_no_stream(backend: Backend) {
    let app = spawn_app(backend).await;
    let deep = (0..40).fold(json!({"var": "x"}), |acc, _| json!({"!!": [acc]}));
    let cases: Vec<(&str, String)> = vec![
        ("unknown operator", query(&json!({"payload": {"frobnicate": [1]}}), None)),
        ("wrong arity", query(&json!({"payload": {">=": [1]}}), None)),
        ("log is not offered", query(&json!({"payload": {"log": "x"}}), None)),
        ("types not a list", query(&json!({"types": "hypothesis.*"}), None)),
        ("empty pattern", query(&json!({"types": [""]}), None)),
        ("empty segment", query(&json!({"types": ["a..b"]}), None)),
        ("unknown field", query(&json!({"typez": ["a.b"]}), None)),
        ("oversized rule", query(&json!({"payload": deep}), None)),
        ("malformed JSON", "?filter=%7B%22types%22%3A".to_owned()),
        ("comma form empty pattern", "?types=a.*,,b.*".to_owned()),
    ];
    for (what, q) in cases {
        let r = app.http.get(app.url(&format!("/v1/stream{q}"))).send().await.unwrap();
        assert_eq!(r.status(), 400, "{what}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "invalid_filter", "{what}: {body}");
        assert!(!body["message"].as_str().unwrap().is_empty());
    }
    assert_eq!(app.clients().await, 0, "no stream was opened");
}
