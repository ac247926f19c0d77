//! The envelope every transport delivers has one description: the JSON
//! Schema the protocol crate derives from the types the server writes
//! (`tidings_protocol::event::envelope_schema`). The clients' envelope
//! types are checked against it, so a field added, dropped or made
//! optional in Rust fails here until the clients follow:
//! - JavaScript: `clients/js/test/envelope.ts` is generated from it (an
//!   envelope with only what the server always sends, typed `Envelope`,
//!   and one with everything it may send, typed `Required<Envelope>`), and
//!   `tsc` must take both (`js_client::the_types_take_what_the_server_takes`);
//! - Python: `tidings.Envelope.from_json` reads both, and its fields are
//!   the schema's properties, no more and no fewer.

use serde_json::{Map, Value, json};

const TS: &str = "clients/js/test/envelope.ts";
const BEGIN: &str = "// generated from crates/protocol/src/event.rs";
const END: &str = "// end of the generated envelopes";

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
fn the_javascript_envelope_type_is_checked_against_the_schema() {
    let (minimal, full, _) = envelopes();
    let generated = format!(
        "import type {{ Envelope }} from \"../src/tidings.js\";\n\n\
         /** What the server always sends: the type takes it. */\n\
         export const minimal: Envelope = {minimal};\n\n\
         /** Everything the server may send: the type has each field, and no other. */\n\
         export const full: Required<Envelope> = {full};\n"
    );
    crate::helpers::generated_in(TS, BEGIN, END, &generated);
    let config = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/clients/js/test/tsconfig.json")).unwrap();
    assert!(config.contains("\"envelope.ts\""), "tsc -p test checks the generated envelopes: {config}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_envelope_type_is_checked_against_the_schema() {
    let (minimal, full, properties) = envelopes();
    let venv = std::env::var("TIDINGS_TEST_PYCLIENT").expect("run scripts/test, which makes the Python client's virtual environment");
    let script = r#"
import dataclasses, json, sys
import tidings
minimal, full, properties = json.loads(sys.stdin.read())
fields = sorted(f.name for f in dataclasses.fields(tidings.Envelope))
assert fields == sorted(properties), f"Envelope's fields {fields} are not the schema's {sorted(properties)}"
tidings.Envelope.from_json(minimal)
read = tidings.Envelope.from_json(full)
for name in properties:
    value = getattr(read, name)
    if dataclasses.is_dataclass(value):
        value = dataclasses.asdict(value)
    elif isinstance(value, list):
        value = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]
    assert value == full[name], f"{name}: read {value!r}, sent {full[name]!r}"
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
    stdin.write_all(json!([minimal, full, properties]).to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output()).await.unwrap().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
