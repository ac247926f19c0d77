//! Spans exported over OTLP/HTTP (docs/tracing.md), judged by a receiver
//! that decodes the real export requests with the OpenTelemetry project's
//! own protobuf messages (`opentelemetry-proto`): one event published with
//! a `traceparent` and received over SSE, a WebSocket device and a durable
//! consumer's poll is one trace holding the publish, the commit of its
//! group, the broker's fan-out and a delivery span per transport batch,
//! with the right parents and links, and every client's envelope carries
//! that trace. A publisher's unsampled flag is followed, and a server with
//! no endpoint configured exports nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt as _, StreamExt as _};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::both_stores;
use crate::helpers::device::Key;
use crate::helpers::{Backend, gather, process_store, spawn_process};

both_stores!(
    one_event_is_one_trace_from_publish_to_every_delivery,
    a_tree_write_is_traced_as_a_publish_is,
    a_peer_delivery_carries_the_trace_to_the_receiving_server,
);

/// A span as the receiver recorded it (ids in lowercase hex).
#[derive(Debug, Clone)]
struct Recorded {
    trace: String,
    id: String,
    parent: String,
    name: String,
    links: Vec<(String, String)>,
    attributes: BTreeMap<String, String>,
}

/// An OTLP/HTTP receiver on loopback: every span of every export request.
struct Receiver {
    endpoint: String,
    spans: Arc<Mutex<Vec<Recorded>>>,
}

impl Receiver {
    async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |headers: axum::http::HeaderMap, body: bytes::Bytes| {
                let kept = kept.clone();
                async move {
                    assert_eq!(headers.get("content-type").and_then(|v| v.to_str().ok()), Some("application/x-protobuf"));
                    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP export request");
                    let mut kept = kept.lock().unwrap();
                    for span in request.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
                        let attributes = span
                            .attributes
                            .iter()
                            .map(|kv| {
                                let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                    Some(Any::StringValue(s)) => s.clone(),
                                    Some(Any::IntValue(i)) => i.to_string(),
                                    Some(Any::BoolValue(b)) => b.to_string(),
                                    other => format!("{other:?}"),
                                };
                                (kv.key.clone(), value)
                            })
                            .collect();
                        kept.push(Recorded {
                            trace: hex::encode(&span.trace_id),
                            id: hex::encode(&span.span_id),
                            parent: hex::encode(&span.parent_span_id),
                            name: span.name.clone(),
                            links: span.links.iter().map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id))).collect(),
                            attributes,
                        });
                    }
                    ([("content-type", "application/x-protobuf")], ExportTraceServiceResponse::default().encode_to_vec())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Receiver { endpoint, spans }
    }

    fn of_trace(&self, trace: &str) -> Vec<Recorded> {
        self.spans.lock().unwrap().iter().filter(|s| s.trace == trace).cloned().collect()
    }

    /// Waits (within 20 s) until `trace` has a span of each of `names`;
    /// the trace's spans then.
    async fn spans_named(&self, trace: &str, names: &[&str]) -> Vec<Recorded> {
        gather(
            Duration::from_secs(20),
            Vec::new(),
            |spans: &Vec<Recorded>| format!("spans {names:?} of {trace} to be exported: {spans:#?}"),
            |_| {
                let spans = self.of_trace(trace);
                async move {
                    if names.iter().all(|n| spans.iter().any(|s| s.name == *n)) {
                        std::ops::ControlFlow::Break(spans)
                    } else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        std::ops::ControlFlow::Continue(spans)
                    }
                }
            },
        )
        .await
    }
}

/// The one span named `name` in `spans`.
fn one(spans: &[Recorded], name: &str) -> Recorded {
    let named: Vec<&Recorded> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(named.len(), 1, "one {name} span: {spans:#?}");
    named[0].clone()
}

/// A tidings process on `backend` that exports spans to `receiver`; its
/// data directory, and its database's URL on PostgreSQL.
async fn traced_process(backend: Backend, receiver: &Receiver) -> (crate::helpers::Process, tempfile::TempDir, Option<String>) {
    let (mut envs, dir) = process_store(backend).await;
    let url = envs.iter().find(|(k, _)| *k == "DATABASE_URL").map(|(_, v)| v.clone());
    envs.push(("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint.clone()));
    envs.push(("OTEL_BSP_SCHEDULE_DELAY", "50".into()));
    (spawn_process(&envs).await, dir, url)
}

/// A WebSocket device on `base`, live from the head: the envelopes of its
/// next two `stream.event`s.
async fn device(base: &str) -> impl std::future::Future<Output = Vec<Value>> + use<> {
    let url = format!("{}/v1/ws", base.replace("http://", "ws://"));
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.expect("the upgrade");
    let text = |m: Message| serde_json::from_str::<Value>(m.into_text().unwrap().as_str()).unwrap();
    let hello = text(ws.next().await.unwrap().unwrap());
    let (key, body) = (Key::new(), json!({"device_id": "traced"}));
    let proof = key.proof("stream.auth", &body, hello["params"]["nonce"].as_str().unwrap());
    let auth = json!({"jsonrpc": "2.0", "id": 1, "method": "stream.auth", "params": {"body": body, "origin_proof": proof}});
    ws.send(Message::text(auth.to_string())).await.unwrap();
    let answer = text(ws.next().await.unwrap().unwrap());
    assert_eq!(answer["result"]["cursor"], answer["result"]["head_seq"], "live at once: {answer}");
    async move {
        tokio::time::timeout(Duration::from_secs(20), async {
            let mut events = Vec::new();
            while events.len() < 3 {
                if let Message::Text(t) = ws.next().await.unwrap().unwrap() {
                    let m: Value = serde_json::from_str(t.as_str()).unwrap();
                    if m["method"] == "stream.event" {
                        events.push(m["params"]["event"].clone());
                    }
                }
            }
            events
        })
        .await
        .expect("the device got the event")
    }
}

async fn one_event_is_one_trace_from_publish_to_every_delivery(backend: Backend) {
    let receiver = Receiver::start().await;
    let (traced, _dir, _) = traced_process(backend, &receiver).await;
    let http = reqwest::Client::new();
    let base = traced.base.clone();

    // A durable consumer at the head, a live stream and a live device.
    let created: Value = http.get(format!("{base}/v1/poll?consumer_id=traced&types=comment.*")).send().await.unwrap().json().await.unwrap();
    let cursor = created["next_since"].as_i64().unwrap();
    let mut stream = tidings_client::sse::connect(&http, &format!("{base}/v1/stream?types=comment.*"), None).await.unwrap();
    let device = device(&base).await;

    // An unsampled publish: its flag is followed, nothing of it is
    // exported, and its context is stored as it came.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319d-b7ad6b7169203331-00";
    // A traced event no client asked for comes first: no delivery or ack
    // links it.
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let unasked = "6bf92f3577b34da6a3ce929d0e0e4736";
    for (event_type, traceparent) in [
        ("order.placed", format!("00-{unasked}-{parent}-01")),
        ("comment.posted", unsampled.to_owned()),
        ("comment.posted", format!("00-{trace}-{parent}-01")),
    ] {
        let r = http
            .post(format!("{base}/v1/events"))
            .header("traceparent", traceparent)
            .header("tracestate", "vendor=value")
            .json(&json!({"event_type": event_type, "payload": {"traced": true}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let mut got = Vec::new();
    while got.len() < 2 {
        let frame = tokio::time::timeout(Duration::from_secs(20), stream.next_event()).await.expect("the stream's events").unwrap();
        if frame.event.is_none() {
            got.push(serde_json::from_str::<Value>(&frame.data).unwrap());
        }
    }
    let page: Value = http.get(format!("{base}/v1/poll?consumer_id=traced&since={cursor}")).send().await.unwrap().json().await.unwrap();
    assert_eq!(page["events"].as_array().map(Vec::len), Some(2), "{page}");
    got.push(page["events"][1].clone());
    got.push(device.await[2].clone());
    // The consumer's ack settles both: one span, linked to the sampled one.
    let next = page["next_since"].as_i64().unwrap();
    let acked = http.post(format!("{base}/v1/consumers/traced/ack")).json(&json!({"cursor": next})).send().await.unwrap();
    assert_eq!(acked.status(), 200);
    assert_eq!(
        (page["events"][0]["traceparent"].as_str(), page["events"][0]["tracestate"].as_str()),
        (Some(unsampled), Some("vendor=value"))
    );

    // The spans of the sampled one: publish under the publisher's span,
    // commit under the publish, fan-out under it (the stored context), and
    // one delivery per transport batch, under it and linked to it.
    let spans = gather(
        Duration::from_secs(20),
        Vec::new(),
        |spans: &Vec<Recorded>| format!("the trace's spans to be exported: {spans:#?}"),
        |_| {
            let spans = receiver.of_trace(trace);
            async move {
                let named = |n: &str| spans.iter().filter(|s| s.name == n).count();
                if named("publish") == 1 && named("commit") == 1 && named("fan-out") == 1 && named("deliver") >= 3 && named("ack") == 1 {
                    std::ops::ControlFlow::Break(spans)
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    std::ops::ControlFlow::Continue(spans)
                }
            }
        },
    )
    .await;
    // The trace as the receiver recorded it (docs/tracing.md shows one).
    eprintln!("recorded trace {trace}: {spans:#?}");
    let one = |n: &str| spans.iter().find(|s| s.name == n).unwrap().clone();
    let publish = one("publish");
    assert_eq!(publish.parent, parent, "{publish:?}");
    assert_eq!(publish.attributes.get("messaging.system").map(String::as_str), Some("tidings"));
    let id = got[1]["event_id"].as_i64().unwrap();
    assert_eq!(publish.attributes.get("messaging.message.id"), Some(&id.to_string()), "{publish:?}");
    assert_eq!(one("commit").parent, publish.id);
    let fan_out = one("fan-out");
    assert_eq!(
        (fan_out.parent.as_str(), fan_out.attributes.get("tidings.clients").map(String::as_str)),
        (publish.id.as_str(), Some("2")),
        "{fan_out:?}"
    );
    let mut transports: Vec<String> = Vec::new();
    for deliver in spans.iter().filter(|s| s.name == "deliver") {
        assert_eq!(deliver.parent, publish.id, "{deliver:?}");
        assert!(deliver.links.contains(&(trace.to_owned(), publish.id.clone())), "{deliver:?}");
        transports.push(deliver.attributes["tidings.transport"].clone());
    }
    transports.sort();
    transports.dedup();
    assert_eq!(transports, vec!["poll", "sse", "ws"], "{spans:#?}");
    let ack = one("ack");
    assert_eq!(ack.parent, publish.id, "{ack:?}");
    assert_eq!(ack.links, vec![(trace.to_owned(), publish.id.clone())], "only the sampled event the consumer was given: {ack:?}");
    assert_eq!(
        (
            ack.attributes.get("messaging.operation.type").map(String::as_str),
            ack.attributes.get("messaging.batch.message_count").map(String::as_str)
        ),
        (Some("settle"), Some("2")),
        "{ack:?}"
    );
    // The device (no filter) got the unasked event; the stream and the
    // consumer (comment.*) did not, and no ack settled it.
    let unasked_spans = receiver.spans_named(unasked, &["publish", "deliver"]).await;
    let transports: Vec<_> = unasked_spans.iter().filter_map(|s| s.attributes.get("tidings.transport")).collect();
    assert_eq!(transports, vec!["ws"], "{unasked_spans:#?}");
    assert!(unasked_spans.iter().all(|s| s.name != "ack"), "{unasked_spans:#?}");
    // Every client's envelope carries the trace, continuing from the publish.
    let stored = format!("00-{trace}-{}-01", publish.id);
    for envelope in &got[1..] {
        assert_eq!(
            (envelope["traceparent"].as_str(), envelope["tracestate"].as_str()),
            (Some(stored.as_str()), Some("vendor=value")),
            "{envelope}"
        );
    }
    assert!(receiver.spans.lock().unwrap().iter().all(|s| s.trace != unsampled[3..35]), "nothing of the unsampled publish");

    // A server with no endpoint configured exports nothing, not even at
    // its shutdown (when a configured exporter sends what it holds).
    let (envs, _dir) = process_store(backend).await;
    let mut quiet = spawn_process(&envs).await;
    let other = "5bf92f3577b34da6a3ce929d0e0e4736";
    let r = http
        .post(format!("{}/v1/events", quiet.base))
        .header("traceparent", format!("00-{other}-{parent}-01"))
        .json(&json!({"event_type": "comment.posted", "payload": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let stored: Value = http.get(format!("{}/v1/poll?since=0", quiet.base)).send().await.unwrap().json().await.unwrap();
    assert_eq!(stored["events"][0]["traceparent"].as_str(), Some(format!("00-{other}-{parent}-01").as_str()), "stored as it came");
    let pid = quiet.child.id().unwrap().to_string();
    assert!(tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await.unwrap().success());
    let exited = tokio::time::timeout(Duration::from_secs(30), quiet.child.wait()).await.expect("it exits").unwrap();
    assert!(exited.success(), "{exited}");
    assert!(receiver.of_trace(other).is_empty(), "a server without an endpoint exported spans");
}

/// A tree write is a producer span as a publish is, its change event
/// stored with the write's span; on PostgreSQL an event published from SQL
/// reaches the log in the outbox mover's span, under the application's.
async fn a_tree_write_is_traced_as_a_publish_is(backend: Backend) {
    let receiver = Receiver::start().await;
    let (traced, _dir, url) = traced_process(backend, &receiver).await;
    let http = reqwest::Client::new();
    let base = &traced.base;
    let (trace, parent) = ("6bf92f3577b34da6a3ce929d0e0e4736", "10f067aa0ba902b7");
    let mut stream = tidings_client::sse::connect(&http, &format!("{base}/v1/stream?types=tree.*"), None).await.unwrap();
    let r = http
        .put(format!("{base}/v1/tree/notes/traced"))
        .header("traceparent", format!("00-{trace}-{parent}-01"))
        .json(&json!({"type": "note", "data": {"v": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let frame = tokio::time::timeout(Duration::from_secs(20), stream.next_event()).await.expect("the change").unwrap();
    let change: Value = serde_json::from_str(&frame.data).unwrap();
    let spans = receiver.spans_named(trace, &["tree-write", "commit", "fan-out", "deliver"]).await;
    let write = one(&spans, "tree-write");
    assert_eq!((write.parent.as_str(), write.attributes.get("tidings.path").map(String::as_str)), (parent, Some("notes/traced")));
    assert_eq!(write.attributes.get("messaging.message.id"), Some(&change["event_id"].to_string()));
    assert_eq!(one(&spans, "commit").parent, write.id);
    assert_eq!(one(&spans, "fan-out").parent, write.id);
    assert_eq!(change["traceparent"].as_str(), Some(format!("00-{trace}-{}-01", write.id).as_str()), "{change}");

    if let Some(url) = url {
        let sql = ("7bf92f3577b34da6a3ce929d0e0e4736", "20f067aa0ba902b7");
        let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        db.batch_execute(&format!(
            "BEGIN; SET LOCAL tidings.traceparent = '00-{}-{}-01'; SELECT tidings.publish('comment.posted', '{{}}'); COMMIT;",
            sql.0, sql.1
        ))
        .await
        .unwrap();
        let spans = receiver.spans_named(sql.0, &["outbox-move", "fan-out"]).await;
        let moved = one(&spans, "outbox-move");
        assert_eq!(moved.parent, sql.1);
        assert!(moved.links.contains(&(sql.0.to_owned(), sql.1.to_owned())), "{moved:?}");
        assert_eq!(one(&spans, "fan-out").parent, sql.1, "the event keeps the application's context");
    }
}

/// A change on a sending server notifies a path subscription whose inbox
/// is on another server: the notification goes on with the change's
/// trace, the delivery is a client span under it, and the receiving
/// server's inbox notification carries the trace on, with the delivery's
/// span as its parent (without export, the change's context as it came).
async fn a_peer_delivery_carries_the_trace_to_the_receiving_server(backend: Backend) {
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint.clone();
    let sender = crate::helpers::federation::Server::start_with(
        backend,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), ("OTEL_BSP_SCHEDULE_DELAY", "50")],
    )
    .await;
    let quiet = crate::helpers::federation::Server::start(backend).await;
    let inbox_server = crate::helpers::federation::Server::start(backend).await;
    for from in [&sender, &quiet] {
        from.knows(&inbox_server).await;
        let (status, body) = crate::helpers::federation::subscribe_third_party(
            &crate::helpers::federation::Peer::new(),
            from,
            &inbox_server,
            "feeds/*",
            "system/inbox/traced",
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let write = |server: &crate::helpers::federation::Server, trace: &str| {
        server
            .http
            .put(format!("{}/v1/tree/feeds/x", server.base()))
            .header("traceparent", format!("00-{trace}-30f067aa0ba902b7-01"))
            .json(&json!({"type": "note", "data": {"v": trace}}))
            .send()
    };
    let (traced, untraced) = ("8bf92f3577b34da6a3ce929d0e0e4736", "9bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(write(&sender, traced).await.unwrap().status(), 201);
    assert_eq!(write(&quiet, untraced).await.unwrap().status(), 201);
    let got = inbox_server.inbox_until("system/inbox/traced", 2).await;
    let by_trace = |trace: &str| {
        got.iter()
            .find(|e| e["traceparent"].as_str().is_some_and(|t| t.contains(trace)))
            .unwrap_or_else(|| panic!("{trace} in {got:#?}"))
            .clone()
    };
    let spans = receiver.spans_named(traced, &["tree-write", "peer-deliver"]).await;
    let (written, delivered) = (one(&spans, "tree-write"), one(&spans, "peer-deliver"));
    assert_eq!(delivered.parent, written.id, "the notification carries the change's context: {spans:#?}");
    assert_eq!(by_trace(traced)["traceparent"].as_str(), Some(format!("00-{traced}-{}-01", delivered.id).as_str()));
    assert_eq!(by_trace(untraced)["traceparent"].as_str(), Some(format!("00-{untraced}-30f067aa0ba902b7-01").as_str()), "as it came");
}
