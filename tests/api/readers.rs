//! The clients the fault campaign (`chaos`) and the failover tests
//! (`failover`) drive: each reads one server the way a client of that
//! transport does, through every fault, and records what it is shown and
//! the losses it is told of (`checker::Seen`) until it has read the id
//! `until` holds (0 until the last event is known).
//!
//! - [`poller`]: `GET /v1/poll` carrying its place as `since`;
//! - [`consumer`]: a durable consumer that trusts the server's cursor and
//!   acknowledges each page, reading again from the last id it handled
//!   when a page shows it was rolled back;
//! - [`agent`]: MCP `poll` with a consumer id, carrying `since` as the
//!   Python client's iterator does;
//! - [`device`]: a WebSocket device paging `sync.delta`, then live.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::checker::Seen;
use crate::helpers::device::Key;

/// Whether `seen` holds the last event (`until`, once known).
fn read_to_the_end(seen: &[Seen], until: &AtomicI64) -> bool {
    let last = until.load(Ordering::Acquire);
    last > 0 && seen.iter().any(|s| matches!(s, Seen::Event(id, _) if *id == last))
}

/// Records a page (`{events, gap?}`, as `/v1/poll` and MCP `poll` answer
/// it): the loss it announces (by the cursor the server keeps when the
/// page was asked for without `since`), then its events. The page's last
/// id.
fn record(seen: &mut Vec<Seen>, page: &Value, at_cursor: bool) -> Option<i64> {
    if page["gap"]["reason"] == "history_lost" {
        let fork = page["gap"]["fork"].as_i64().expect("a fork");
        seen.push(if at_cursor { Seen::LostAtCursor { fork } } else { Seen::Lost { fork } });
    }
    let events = page["events"].as_array()?;
    seen.extend(events.iter().map(|e| Seen::Event(e["event_id"].as_i64().unwrap(), e["payload"].clone())));
    events.last().and_then(|e| e["event_id"].as_i64())
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap()
}

/// A page from `GET url`, or `None` when the server could not answer.
async fn page_at(http: &reqwest::Client, url: String) -> Option<Value> {
    match http.get(url).send().await {
        Ok(r) if r.status() == 200 => r.json::<Value>().await.ok().filter(|p| p["events"].is_array()),
        _ => None,
    }
}

/// A client that polls `base` with `since`, from 0.
pub(crate) fn poller(base: String, until: Arc<AtomicI64>) -> tokio::task::JoinHandle<Vec<Seen>> {
    tokio::spawn(async move {
        let http = http();
        let (mut seen, mut since) = (Vec::new(), 0i64);
        while !read_to_the_end(&seen, &until) {
            let Some(page) = page_at(&http, format!("{base}/v1/poll?since={since}&limit=200&wait_ms=300")).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            record(&mut seen, &page, false);
            since = page["next_since"].as_i64().unwrap_or(since);
        }
        seen
    })
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next text frame as JSON (`Some(None)` after 2 s of quiet or for a
/// ping), or `None` once the connection is closed.
async fn next_message(ws: &mut Ws) -> Option<Option<Value>> {
    match tokio::time::timeout(Duration::from_secs(2), ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => Some(Some(serde_json::from_str::<Value>(t.as_str()).unwrap_or(Value::Null))),
        Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => None,
        _ => Some(None),
    }
}

/// A WebSocket device on `base` (device `name`): says hello with the last
/// seq it saw, pages `sync.delta` to the head, then takes `stream.event`
/// frames, and on any close does it all again; records what it is shown
/// (and the losses it is told of, by `stream.gap` or in a `sync.delta`
/// page) until it has read the id `until` holds. With `acks`, it
/// acknowledges each page and each event once recorded (a failed ack is
/// not retried, as when a device dies before it), so the server keeps its
/// cursor, and a `stream.gap` right after auth (a stored cursor at or past
/// the fork of an epoch begun since) is a loss told by that cursor.
pub(crate) fn device(base: String, name: String, until: Arc<AtomicI64>, acks: bool) -> tokio::task::JoinHandle<Vec<Seen>> {
    tokio::spawn(async move {
        let key = Key::new();
        let mut seen: Vec<Seen> = Vec::new();
        let url = format!("{}/v1/ws", base.replace("http://", "ws://"));
        let last_seq = |seen: &[Seen]| seen.iter().rev().find_map(|s| if let Seen::Event(id, _) = s { Some(*id) } else { None });
        let done = |seen: &[Seen]| read_to_the_end(seen, &until);
        'connect: loop {
            if done(&seen) {
                return seen;
            }
            let Ok(Ok((mut ws, _))) = tokio::time::timeout(Duration::from_secs(5), tokio_tungstenite::connect_async(&url)).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let hello = loop {
                match next_message(&mut ws).await {
                    Some(Some(m)) if m["method"] == "stream.hello" => break m,
                    Some(_) => {}
                    None => continue 'connect,
                }
            };
            let cursor = last_seq(&seen).unwrap_or(0);
            let nonce = hello["params"]["nonce"].as_str().unwrap_or_default().to_owned();
            let body = json!({"device_id": name, "cursor": cursor});
            let proof = key.proof("stream.auth", &body, &nonce);
            let auth = json!({"jsonrpc": "2.0", "id": 1, "method": "stream.auth", "params": {"body": body, "origin_proof": proof}});
            if ws.send(Message::text(auth.to_string())).await.is_err() {
                continue;
            }
            let (mut since, mut id, mut head, mut caught_up) = (cursor, 1, i64::MAX, false);
            // Acks are requests of their own, whose answers are not waited for.
            let (mut ack_id, mut paged) = (1u64 << 40, false);
            let mut ack = |seq: i64| {
                ack_id += 1;
                let body = json!({"seq": seq});
                let proof = key.proof("stream.ack", &body, &nonce);
                Message::text(
                    json!({"jsonrpc": "2.0", "id": ack_id, "method": "stream.ack", "params": {"body": body, "origin_proof": proof}})
                        .to_string(),
                )
            };
            loop {
                if done(&seen) {
                    return seen;
                }
                let message = match next_message(&mut ws).await {
                    Some(Some(m)) => m,
                    Some(None) => continue,
                    None => continue 'connect,
                };
                if message["method"] == "stream.gap" {
                    if message["params"]["reason"] == "history_lost" {
                        let fork = message["params"]["fork"].as_i64().expect("a fork");
                        // Before any page: told at auth, by the stored cursor.
                        seen.push(if acks && !paged { Seen::LostAtCursor { fork } } else { Seen::Lost { fork } });
                    }
                } else if message["id"] == id {
                    let result = &message["result"];
                    if result.is_null() {
                        // Refused (the store is down, say): again.
                        continue 'connect;
                    }
                    if id == 1 {
                        head = result["head_seq"].as_i64().unwrap_or(i64::MAX);
                    } else {
                        // A page from a point in a lost stretch says so.
                        if result["gap"]["reason"] == "history_lost" {
                            seen.push(Seen::Lost { fork: result["gap"]["fork"].as_i64().expect("a fork") });
                        }
                        for item in result["items"].as_array().into_iter().flatten() {
                            seen.push(Seen::Event(item["seq"].as_i64().unwrap(), item["event"]["payload"].clone()));
                        }
                        since = result["next_since"].as_i64().unwrap_or(since);
                        caught_up = !result["has_more"].as_bool().unwrap_or(true) && since >= head;
                        paged = true;
                        if acks && ws.send(ack(since)).await.is_err() {
                            continue 'connect;
                        }
                    }
                    if !caught_up {
                        id += 1;
                        let page = json!({"jsonrpc": "2.0", "id": id, "method": "sync.delta", "params": {"device_id": name, "since": since, "limit": 200}});
                        if ws.send(Message::text(page.to_string())).await.is_err() {
                            continue 'connect;
                        }
                    }
                } else if message["method"] == "stream.event" && caught_up {
                    let params = &message["params"];
                    let seq = params["seq"].as_i64().unwrap();
                    seen.push(Seen::Event(seq, params["event"]["payload"].clone()));
                    if acks && ws.send(ack(seq)).await.is_err() {
                        continue 'connect;
                    }
                }
            }
        }
    })
}

/// A durable consumer on `base` (consumer `name`) as a program that
/// trusts the server to keep its place: after its first poll (from 0) it
/// polls with its consumer id alone, and acknowledges each page's
/// `next_since` once it has recorded the page (an acknowledgement that
/// fails is not retried: the cursor then lags, as it does when a process
/// dies between a page and its ack). It keeps the last id it handled.
/// When a page starts at or below it, the server's cursor went back (an
/// ack lost with a process, or rolled back with the database by a
/// failover), and the consumer reads again from that id with `since`: the
/// hint that lets the server tell it of events it was shown and the
/// failover lost, which its rolled-back cursor no longer records (docs/failover.md, "What each
/// configuration can lose").
pub(crate) fn consumer(base: String, name: String, until: Arc<AtomicI64>) -> tokio::task::JoinHandle<Vec<Seen>> {
    tokio::spawn(async move {
        let http = http();
        let poll = |since: Option<i64>| {
            let since = since.map(|s| format!("&since={s}")).unwrap_or_default();
            format!("{base}/v1/poll?consumer_id={name}&limit=200&wait_ms=300{since}")
        };
        let (mut seen, mut handled, mut started) = (Vec::new(), 0i64, false);
        while !read_to_the_end(&seen, &until) {
            let Some(mut page) = page_at(&http, poll((!started).then_some(0))).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let mut at_cursor = started;
            if page["events"][0]["event_id"].as_i64().is_some_and(|first| first <= handled) {
                // Handed again what it handled: it says where it is.
                let Some(again) = page_at(&http, poll(Some(handled))).await else { continue };
                (page, at_cursor) = (again, false);
            }
            started = true;
            if let Some(last) = record(&mut seen, &page, at_cursor) {
                handled = last;
            }
            if let Some(next) = page["next_since"].as_i64() {
                let _ = http.post(format!("{base}/v1/consumers/{name}/ack")).json(&json!({"cursor": next})).send().await;
            }
        }
        seen
    })
}

/// An AI agent on `base`'s MCP endpoint: `tools/call poll` with the
/// consumer `name`, from 0, each call a request of its own (tidings' MCP
/// is stateless), carrying the page's `next_since` as `since` on the next
/// call, as the Python client's consumer iterator does.
pub(crate) fn agent(base: String, name: String, until: Arc<AtomicI64>) -> tokio::task::JoinHandle<Vec<Seen>> {
    tokio::spawn(async move {
        let http = http();
        let (mut seen, mut since, mut call) = (Vec::new(), 0i64, 0u64);
        while !read_to_the_end(&seen, &until) {
            call += 1;
            let arguments = json!({"consumer_id": name, "since": since, "limit": 200, "wait_ms": 300});
            let request = json!({"jsonrpc": "2.0", "id": call, "method": "tools/call", "params": {"name": "poll", "arguments": arguments}});
            let sent = http.post(format!("{base}/mcp")).header("Accept", "application/json, text/event-stream").json(&request).send().await;
            let answer = match sent {
                Ok(r) if r.status() == 200 => r.json::<Value>().await.unwrap_or(Value::Null),
                _ => Value::Null,
            };
            let page = &answer["result"]["structuredContent"];
            // A tool error (the store is down, say) or no answer: again.
            if answer["result"]["isError"] != false || !page["events"].is_array() {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            record(&mut seen, page, false);
            since = page["next_since"].as_i64().unwrap_or(since);
        }
        seen
    })
}

/// A reader of a path-subscription inbox on another server (`receiver`),
/// as a service watching the tree does: polls what is addressed to `inbox`
/// with `since` and records each notification under the sender's log id of
/// it (`data.sequence`) with the changed entity's hash as its body, and each
/// `subscription.history_lost` as a loss told at the fork, until it holds
/// the notification of the hash `until` holds (`None` until the last write
/// is known).
pub(crate) fn inbox(receiver: String, inbox: String, until: Arc<std::sync::Mutex<Option<String>>>) -> tokio::task::JoinHandle<Vec<Seen>> {
    tokio::spawn(async move {
        let http = http();
        let (mut seen, mut since) = (Vec::new(), 0i64);
        let done = |seen: &[Seen]| {
            let last = until.lock().unwrap().clone();
            last.is_some_and(|hash| seen.iter().any(|s| matches!(s, Seen::Event(_, h) if *h == hash)))
        };
        while !done(&seen) {
            let Some(page) = page_at(&http, format!("{receiver}/v1/poll?targets={inbox}&since={since}&limit=200&wait_ms=300")).await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            for e in page["events"].as_array().into_iter().flatten() {
                let data = &e["payload"]["data"];
                match e["event_type"].as_str() {
                    Some("subscription.history_lost") => seen.push(Seen::Lost { fork: data["fork"].as_i64().expect("a fork") }),
                    Some("subscription.notification") => {
                        seen.push(Seen::Event(data["sequence"].as_i64().expect("a sequence"), data["hash"].clone()));
                    }
                    other => panic!("{other:?} in the inbox"),
                }
            }
            since = page["next_since"].as_i64().unwrap_or(since);
        }
        seen
    })
}

/// The notifications of subscription `id` in the sender's final `log`, as
/// [`inbox`] records them: the sender's id and the changed entity's hash.
pub(crate) fn notifications_of(log: &[(i64, Value)], id: &str) -> Vec<(i64, Value)> {
    log.iter()
        .filter(|(_, p)| p["type"] == "system/subscription/notification" && p["data"]["subscription_id"] == id)
        .map(|(seq, p)| (*seq, p["data"]["hash"].clone()))
        .collect()
}
