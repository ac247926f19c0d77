//! What the server sends has one description: the JSON Schemas the
//! protocol crate derives from its types (`tidings_protocol::wire::schemas`:
//! the envelope, a stream's notices, a poll's page, the WebSocket device
//! protocol's messages both ways). Checked three ways, so a field
//! added, dropped or made optional in Rust fails here until the clients
//! follow:
//! - the server writes what they describe: a real server's poll pages, gap
//!   frame and WebSocket messages parse into the protocol types, which know
//!   every field (`deny_unknown_fields`) and miss none; and it takes the
//!   device requests built from them;
//! - JavaScript: `clients/js/test/protocol.ts` is generated from them (for
//!   each shape a value with only what the server always sends, typed with
//!   the client's type, and one with everything it may send, typed
//!   `Required<…>`), and `tsc` must take both
//!   (`js_client::the_types_take_what_the_server_takes`);
//! - Python: the client's dataclasses read both values and have exactly the
//!   schema's fields; its `TypedDict`s have exactly its required and
//!   optional keys.

use serde_json::{Map, Value, json};
use tidings_protocol::wire;

use crate::both_stores;
use crate::helpers::{Backend, spawn_app};

both_stores!(the_server_writes_what_the_schemas_describe);

const TS: &str = "clients/js/test/protocol.ts";
const BEGIN: &str = "// generated from crates/protocol/src/wire.rs";
const END: &str = "// end of the generated shapes";

/// Each shape's TypeScript type in the JavaScript client.
const TS_TYPES: [(&str, &str); 20] = [
    ("Envelope", "Envelope"),
    ("ReplayGap", "ReplayGap"),
    ("DroppedNotice", "DroppedNotice"),
    ("TokenExpiredNotice", "TokenExpiredNotice"),
    ("FilterBudgetExceeded", "FilterBudgetExceeded"),
    ("PollPage", "PollPage"),
    ("Hello", "Hello"),
    ("AuthAnswer", "AuthAnswer"),
    ("DeviceEvent", "DeviceEvent"),
    ("DeltaPage", "DeltaPage"),
    ("AckAnswer", "AckAnswer"),
    ("DeviceTokenExpired", "DeviceTokenExpired"),
    ("Identity", "Identity"),
    ("OriginProof", "OriginProof"),
    ("AuthBody", "AuthBody"),
    ("AuthParams", "AuthParams"),
    ("DeltaParams", "DeltaParams"),
    ("AckBody", "AckBody"),
    ("AckParams", "AckParams"),
    ("ReauthParams", "ReauthParams"),
];

/// Each shape's Python type: a dataclass with `from_json`, or a `TypedDict`.
const PY_TYPES: [(&str, &str, bool); 20] = [
    ("Envelope", "Envelope", true),
    ("ReplayGap", "Gap", true),
    ("DroppedNotice", "Dropped", true),
    ("TokenExpiredNotice", "TokenExpiredNotice", false),
    ("FilterBudgetExceeded", "FilterBudgetExceeded", false),
    ("PollPage", "Page", true),
    ("Hello", "Hello", false),
    ("AuthAnswer", "AuthAnswer", false),
    ("DeviceEvent", "DeviceEvent", false),
    ("DeltaPage", "DeltaPage", false),
    ("AckAnswer", "AckAnswer", false),
    ("DeviceTokenExpired", "DeviceTokenExpired", false),
    ("Identity", "Identity", false),
    ("OriginProof", "OriginProof", false),
    ("AuthBody", "AuthBody", false),
    ("AuthParams", "AuthParams", false),
    ("DeltaParams", "DeltaParams", false),
    ("AckBody", "AckBody", false),
    ("AckParams", "AckParams", false),
    ("ReauthParams", "ReauthParams", false),
];

/// A value `schema` takes: with every property of each object when `full`,
/// else with only the required ones.
fn sample(schema: &Value, defs: &Value, full: bool) -> Value {
    if let Some(reference) = schema["$ref"].as_str() {
        let name = reference.rsplit('/').next().unwrap();
        return sample(&defs[name], defs, full);
    }
    for union in ["anyOf", "oneOf"] {
        if let Some(branches) = schema[union].as_array() {
            let branch = branches.iter().find(|b| b["type"] != "null").expect("a branch that is not null");
            return sample(branch, defs, full);
        }
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(values) = schema["enum"].as_array() {
        return values[0].clone();
    }
    let kind = match &schema["type"] {
        Value::Array(kinds) => kinds.iter().find(|k| *k != "null").cloned().unwrap_or(Value::Null),
        kind => kind.clone(),
    };
    match kind.as_str() {
        Some("string") => json!("x"),
        Some("integer" | "number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([sample(&schema["items"], defs, full)]),
        Some("object") => {
            let required: Vec<&str> = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
            let mut out = Map::new();
            for (name, property) in schema["properties"].as_object().into_iter().flatten() {
                if full || required.contains(&name.as_str()) {
                    out.insert(name.clone(), sample(property, defs, full));
                }
            }
            Value::Object(out)
        }
        // Any JSON (the payload): an object, as the server only stores objects.
        _ => json!({}),
    }
}

/// One shape of `wire::schemas`, and two values its schema takes.
struct Shape {
    name: &'static str,
    /// Only the required fields.
    minimal: Value,
    /// Every field.
    full: Value,
    properties: Vec<String>,
    required: Vec<String>,
}

/// Every shape.
fn shapes() -> Vec<Shape> {
    wire::schemas()
        .into_iter()
        .map(|(name, schema)| {
            let defs = &schema["$defs"];
            let properties = schema["properties"].as_object().unwrap_or_else(|| panic!("{name}'s properties")).keys().cloned().collect();
            let required = schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
            Shape { name, minimal: sample(&schema, defs, false), full: sample(&schema, defs, true), properties, required }
        })
        .collect()
}

#[test]
fn every_shape_has_a_type_in_each_client() {
    let names: Vec<&str> = wire::schemas().into_iter().map(|(name, _)| name).collect();
    assert_eq!(names, TS_TYPES.map(|(name, _)| name), "the JavaScript table names every shape");
    assert_eq!(names, PY_TYPES.map(|(name, _, _)| name), "the Python table names every shape");
    // Always sent, and null when no event was delivered.
    for (name, schema) in wire::schemas().into_iter().filter(|(name, _)| ["DroppedNotice", "TokenExpiredNotice"].contains(name)) {
        assert!(schema["required"].as_array().unwrap().contains(&json!("last_event_id")), "{name}: {schema}");
        assert!(schema["properties"]["last_event_id"]["type"].as_array().is_some_and(|t| t.contains(&json!("null"))), "{name}: {schema}");
    }
}

/// Parses `value` as `T` (which knows every field), or fails naming `what`.
fn strict<T: serde::de::DeserializeOwned>(what: &str, value: &Value) -> T {
    serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{what} is not what the protocol describes: {e}: {value}"))
}

/// A real server's answers, parsed into the protocol's types: two poll
/// pages (one with a gap), a stream's gap frame, and a device's hello,
/// auth answer, catch-up page, realtime event and ack answer; and the
/// device's requests, built from the protocol's types, taken.
async fn the_server_writes_what_the_schemas_describe(backend: Backend) {
    let app = spawn_app(backend).await;
    let first = app.publish("schema.checked", json!({"n": 1})).await;
    let page: Value = app.http.post(app.url("/v1/poll")).json(&json!({"since": 0})).send().await.unwrap().json().await.unwrap();
    let page: wire::PollPage = strict("a poll page", &page);
    assert_eq!(page.events.last().map(|e| e.event_id), Some(first));
    let beyond: Value = app.http.post(app.url("/v1/poll")).json(&json!({"since": 1_000_000})).send().await.unwrap().json().await.unwrap();
    let beyond: wire::PollPage = strict("a poll page with a gap", &beyond);
    assert_eq!(beyond.gap.map(|g| g.reason), Some(wire::GapReason::BeyondHead));

    let mut stream = app.stream("", Some(1_000_000)).await;
    let frame = stream.next().await;
    assert_eq!(frame.event.as_deref(), Some("system.replay_gap"));
    let gap: wire::ReplayGap = strict("a gap frame", &serde_json::from_str(&frame.data).unwrap());
    assert_eq!((gap.requested, gap.head), (1_000_000, first));

    let key = crate::helpers::device::Key::new();
    let mut device = crate::helpers::device::Client::connect(&app).await;
    assert_eq!(device.hello["method"], "stream.hello");
    let hello: wire::Hello = strict("stream.hello", &device.hello["params"]);
    assert_eq!(hello.nonce, device.nonce);
    // The device's requests, built from the protocol's types: the server takes them.
    let body = wire::AuthBody { device_id: "schema-1".into(), cursor: Some(0), filter: Some(json!({"types": ["schema.*"]})) };
    let body_json = serde_json::to_value(&body).unwrap();
    let origin_proof: wire::OriginProof = strict("a device proof", &key.proof("stream.auth", &body_json, &device.nonce));
    let params = serde_json::to_value(wire::AuthParams { body, origin_proof }).unwrap();
    let auth: wire::AuthAnswer = strict("stream.auth's result", &device.call("stream.auth", params).await["result"]);
    assert_eq!(auth.head_seq, first);
    let params = serde_json::to_value(wire::DeltaParams { device_id: "schema-1".into(), since: 0, limit: Some(10) }).unwrap();
    let delta = device.call("sync.delta", params).await;
    let delta: wire::DeltaPage = strict("sync.delta's result", &delta["result"]);
    assert_eq!(delta.items.last().map(|i| i.seq), Some(first));
    let next = app.publish("schema.checked", json!({"n": 2})).await;
    let event = device.notification().await;
    assert_eq!(event["method"], "stream.event", "{event}");
    let event: wire::DeviceEvent = strict("stream.event's params", &event["params"]);
    assert_eq!((event.seq, event.event.event_id), (next, next));
    let body = wire::AckBody { seq: next };
    let origin_proof: wire::OriginProof =
        strict("a device proof", &key.proof("stream.ack", &serde_json::to_value(&body).unwrap(), &device.nonce));
    let params = serde_json::to_value(wire::AckParams { body, origin_proof }).unwrap();
    let ack: wire::AckAnswer = strict("stream.ack's result", &device.call("stream.ack", params).await["result"]);
    assert_eq!(ack.cursor, next);
}

fn envelopes() -> (Value, Value, Vec<String>) {
    let schema = tidings_protocol::event::envelope_schema();
    let defs = &schema["$defs"];
    let properties = schema["properties"].as_object().expect("the envelope's properties").keys().cloned().collect();
    (sample(&schema, defs, false), sample(&schema, defs, true), properties)
}

/// The Rust side agrees with itself: the envelope the server writes for a
/// stored body has exactly the schema's properties.
#[test]
fn the_schema_describes_the_envelope_the_server_writes() {
    let (_, full, properties) = envelopes();
    let body: Value =
        serde_json::from_value::<tidings_protocol::event::Envelope>(full.clone()).map(|e| serde_json::to_value(e.body).unwrap()).unwrap();
    let written: Value = serde_json::from_slice(&tidings_protocol::event::encode_envelope(7, &body.to_string())).unwrap();
    let mut keys: Vec<&String> = written.as_object().unwrap().keys().collect();
    keys.sort();
    let mut expected: Vec<&String> = properties.iter().collect();
    expected.sort();
    assert_eq!(keys, expected, "{written}");
    assert!(properties.len() >= 12, "the scan read the schema: {properties:?}");
}

#[test]
fn the_javascript_types_are_checked_against_the_schemas() {
    let mut generated = String::from("import type {\n");
    for (_, ts) in TS_TYPES {
        generated.push_str(&format!("  {ts},\n"));
    }
    generated.push_str("} from \"../src/tidings.js\";\n");
    for (Shape { name, minimal, full, .. }, (_, ts)) in shapes().into_iter().zip(TS_TYPES) {
        generated.push_str(&format!(
            "\n/** {name}: what the server always sends (the type takes it), and everything it may send (the type has each field, and no other). */\n\
             export const minimal{name}: {ts} = {minimal};\n\
             export const full{name}: Required<{ts}> = {full};\n"
        ));
    }
    crate::helpers::generated_in(TS, BEGIN, END, &generated);
    let config = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/js/test/tsconfig.json")).unwrap();
    assert!(config.contains("\"protocol.ts\""), "tsc -p test checks the generated shapes: {config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_types_are_checked_against_the_schemas() {
    let shapes: Vec<Value> = shapes().into_iter().map(|s| json!([s.name, s.minimal, s.full, s.properties, s.required])).collect();
    let types: Vec<Value> = PY_TYPES.iter().map(|(name, py, dataclass)| json!([name, py, dataclass])).collect();
    let venv = std::env::var("TIDINGS_TEST_PYCLIENT").expect("run scripts/test, which makes the Python client's virtual environment");
    let script = r#"
import dataclasses, json, sys
import tidings
from tidings import _wire
shapes, types = json.loads(sys.stdin.read())

def plain(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value

for (name, minimal, full, properties, required), (_, py, is_dataclass) in zip(shapes, types):
    kind = getattr(tidings, py, None) or getattr(_wire, py)
    if is_dataclass:
        fields = sorted(f.name for f in dataclasses.fields(kind))
        assert fields == sorted(properties), f"{py}'s fields {fields} are not {name}'s {sorted(properties)}"
        kind.from_json(minimal)
        read = kind.from_json(full)
        for field in properties:
            value = plain(getattr(read, field))
            assert value == full[field], f"{py}.{field}: read {value!r}, sent {full[field]!r}"
    else:
        assert set(kind.__required_keys__) == set(required), f"{py} requires {sorted(kind.__required_keys__)}, {name} {sorted(required)}"
        optional = set(properties) - set(required)
        assert set(kind.__optional_keys__) == optional, f"{py} has optional {sorted(kind.__optional_keys__)}, {name} {sorted(optional)}"
print("ok")
"#;
    let mut child = tokio::process::Command::new(format!("{venv}/bin/python"))
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    use tokio::io::AsyncWriteExt as _;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(json!([shapes, types]).to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output()).await.unwrap().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
