//! `GET /v1/events/{event_id}` (docs/polling.md, "Which consumers have an
//! event"): the event, and each durable consumer and device cursor
//! measured against it; grants and visibility apply, and a caller that is
//! not an admin sees only its own consumers.

use serde_json::{Value, json};

use crate::both_stores;
use crate::helpers::device::{self as ws, Key};
use crate::helpers::tokens::{SECRET, token};
use crate::helpers::{Backend, TestApp, spawn_app, spawn_app_with};

both_stores!(an_event_shows_who_acknowledged_it, an_event_is_shown_only_as_its_caller_may_see_it);

async fn audit(app: &TestApp, id: &str, bearer: Option<&str>) -> (u16, Value) {
    let mut request = app.http.get(app.url(&format!("/v1/events/{id}")));
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let r = request.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Consumer `id` (with `filter`, a query string) reads from the start and
/// acknowledges `ack`.
async fn consumer(app: &TestApp, id: &str, filter: &str, ack: i64, bearer: Option<&str>) {
    let mut poll = app.http.get(app.url(&format!("/v1/poll?consumer_id={id}&since=0{filter}")));
    let mut acked = app.http.post(app.url(&format!("/v1/consumers/{id}/ack"))).json(&json!({"cursor": ack}));
    if let Some(token) = bearer {
        (poll, acked) = (poll.bearer_auth(token), acked.bearer_auth(token));
    }
    assert_eq!(poll.send().await.unwrap().status(), 200);
    assert_eq!(acked.send().await.unwrap().status(), 200);
}

/// `(consumer_id, state)` of each consumer in an answer, sorted.
fn states(answer: &Value) -> Vec<(String, String)> {
    let mut states: Vec<(String, String)> = answer["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["consumer_id"].as_str().unwrap().to_owned(), c["state"].as_str().unwrap().to_owned()))
        .collect();
    states.sort();
    states
}

async fn an_event_shows_who_acknowledged_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let posted = app.publish("comment.posted", json!({"n": 1})).await;
    let edited = app.publish("comment.edited", json!({"n": 2})).await;
    // `all` acknowledged both; `late` only the first; `posts` takes
    // comment.posted only and acknowledged it; `papers` takes none.
    consumer(&app, "all", "", edited, None).await;
    consumer(&app, "late", "", posted, None).await;
    consumer(&app, "posts", "&types=comment.posted", posted, None).await;
    consumer(&app, "papers", "&types=paper.*", edited, None).await;
    // A device that acknowledged the first.
    let key = Key::new();
    let mut device = ws::Client::connect(&app).await;
    device.auth(&key, json!({"device_id": "phone", "cursor": 0})).await;
    assert_eq!(device.ack(&key, posted).await["result"]["cursor"], posted);

    let (status, answer) = audit(&app, &edited.to_string(), None).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!((answer["event"]["event_id"].as_i64(), answer["event"]["payload"]["n"].as_i64()), (Some(edited), Some(2)), "{answer}");
    let expect = |pairs: &[(&str, &str)]| pairs.iter().map(|(c, s)| ((*c).to_owned(), (*s).to_owned())).collect::<Vec<_>>();
    assert_eq!(
        states(&answer),
        expect(&[("all", "acknowledged"), ("late", "pending"), ("papers", "not_matched"), ("posts", "not_matched")])
    );
    let phone: Vec<&Value> = answer["devices"].as_array().unwrap().iter().filter(|d| d["device_id"] == "phone").collect();
    assert_eq!(phone.len(), 1, "{answer}");
    assert_eq!((phone[0]["cursor"].as_i64(), &phone[0]["acknowledged"]), (Some(posted), &json!(false)), "{answer}");
    assert_eq!(answer["devices_truncated"], false);
    let (_, first) = audit(&app, &posted.to_string(), None).await;
    assert_eq!(
        states(&first),
        expect(&[("all", "acknowledged"), ("late", "acknowledged"), ("papers", "not_matched"), ("posts", "acknowledged")])
    );

    // Ids that are not ids, and ids of no event.
    for bad in ["abc", "0", "007", "-1", "%2B5", "12345678901234567"] {
        let (status, body) = audit(&app, bad, None).await;
        assert_eq!((status, body["error"].as_str()), (400, Some("invalid_event_id")), "{bad}: {body}");
    }
    for absent in ["999999", "9999999999999999"] {
        let (status, body) = audit(&app, absent, None).await;
        assert_eq!((status, body["error"].as_str()), (404, Some("event_not_found")), "{absent}: {body}");
    }
}

async fn an_event_is_shown_only_as_its_caller_may_see_it(backend: Backend) {
    let app = spawn_app_with(backend, |s| s.auth.jwt_hs256_secret = Some(SECRET.into())).await;
    let admin = token("ops", json!({"admin": true, "publish": ["**"], "subscribe": ["**"], "visibility": "admin"}));
    let alice = token("alice", json!({"subscribe": ["comment.*"]}));
    let bob = token("bob", json!({"subscribe": ["comment.*"]}));
    let publish = |body: Value| {
        let (http, url, admin) = (app.http.clone(), app.url("/v1/events"), admin.clone());
        async move {
            let r: Value = http.post(url).bearer_auth(admin).json(&body).send().await.unwrap().json().await.unwrap();
            r["event_ids"][0].as_i64().unwrap()
        }
    };
    let comment = publish(json!({"event_type": "comment.posted"})).await;
    let paper = publish(json!({"event_type": "paper.archived"})).await;
    let hidden = publish(json!({"event_type": "comment.posted", "visibility": "admin"})).await;
    consumer(&app, "alice-feed", "", comment, Some(&alice)).await;
    consumer(&app, "bob-feed", "", comment, Some(&bob)).await;

    // Alice sees the comment and her own consumer only, and no devices.
    let (status, answer) = audit(&app, &comment.to_string(), Some(&alice)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(states(&answer), [("alice-feed".to_owned(), "acknowledged".to_owned())]);
    assert_eq!(answer["devices"], json!([]));
    // Outside her grants, or above her visibility: not found.
    for id in [paper, hidden] {
        let (status, body) = audit(&app, &id.to_string(), Some(&alice)).await;
        assert_eq!((status, body["error"].as_str()), (404, Some("event_not_found")), "{id}: {body}");
    }
    // No token: 401. An admin sees every consumer.
    assert_eq!(audit(&app, &comment.to_string(), None).await.0, 401);
    let (_, all) = audit(&app, &comment.to_string(), Some(&admin)).await;
    assert_eq!(states(&all), [("alice-feed".to_owned(), "acknowledged".to_owned()), ("bob-feed".to_owned(), "acknowledged".to_owned())]);
}
