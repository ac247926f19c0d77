//! The request half of `/openapi.json` made exact: JSON Schemas for every
//! request body, and patterns and bounds for path, query and header
//! parameters, written from the same constants the handlers check. The
//! annotations on the handlers give routes, answers and descriptions; this
//! pass replaces their placeholder `{"type": "object"}` bodies and bare
//! `string` parameters, so the document accepts what the server accepts and
//! refuses what it refuses (a test runs schemathesis against it).
//!
//! What a schema cannot say is said in descriptions: a signature's validity,
//! grants, byte lengths of non-ASCII text (`maxLength` counts characters),
//! the payload size limit, and which JsonLogic rules compile (the schema
//! lists the common forms; the server takes any rule the compiler does).

use serde_json::{Value, json};

use crate::config::Settings;

/// One segment of an event name.
const NAME_SEGMENT: &str = "[a-z][a-z0-9_]*";
/// One literal segment of a tree path: `[A-Za-z0-9._~:-]`, never `.` or `..`.
const PATH_SEGMENT: &str = r"(?:[A-Za-z0-9_~:-][A-Za-z0-9._~:-]*|\.[A-Za-z0-9_~:-][A-Za-z0-9._~:-]*|\.\.[A-Za-z0-9._~:-]+)";

fn name_pattern() -> String {
    format!("^{NAME_SEGMENT}(?:\\.{NAME_SEGMENT})+$")
}

fn glob_pattern() -> String {
    let seg = format!(r"(?:{NAME_SEGMENT}|\*\*?)");
    format!("{seg}(?:\\.{seg})*")
}

fn path_pattern(trailing_slash: bool) -> String {
    format!("^{PATH_SEGMENT}(?:/{PATH_SEGMENT})*{}$", if trailing_slash { "/?" } else { "" })
}

/// ASCII whitespace, which the server trims around list entries.
const SPACE: &str = r"[\t\n\f\r ]";

/// A comma list of entries matching `entry` (spaces around entries allowed).
fn comma_list(entry: &str) -> String {
    format!("^{SPACE}*{entry}{SPACE}*(?:,{SPACE}*{entry}{SPACE}*)*$")
}

/// `accept_envelope`: a comma list of versions that names one this server
/// writes (none would be `406`).
fn envelope_pattern() -> String {
    let supported: Vec<String> = tidings_protocol::event::SUPPORTED_ENVELOPE_VERSIONS.iter().map(u32::to_string).collect();
    format!("^(?:[0-9]{{1,9}},)*(?:{})(?:,[0-9]{{1,9}})*$", supported.join("|"))
}

fn text(max: usize) -> Value {
    json!({"type": "string", "maxLength": max})
}

fn nullable(mut schema: Value) -> Value {
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        schema["type"] = json!([t, "null"]);
    }
    schema
}

fn event_schema() -> Value {
    use tidings_protocol::event::{MAX_FIELD_LEN, MAX_LINKS, MAX_NAME_LEN};
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["event_type"],
        "properties": {
            "event_type": {"type": "string", "pattern": name_pattern(), "maxLength": MAX_NAME_LEN,
                "description": "Two or more lowercase snake_case segments joined by `.`; `system.*`, `tree.*` and `subscription.notification` are the server's own (403)"},
            "ref": nullable(text(MAX_FIELD_LEN)),
            "agent": {"type": ["object", "null"], "additionalProperties": false, "required": ["id"], "properties": {
                "id": {"type": "string", "minLength": 1, "maxLength": MAX_FIELD_LEN},
                "kind": nullable(text(MAX_FIELD_LEN)),
            }},
            "session_id": nullable(text(MAX_FIELD_LEN)),
            "occurred_at": {"type": ["string", "null"], "format": "date-time"},
            "payload": {"type": ["object", "null"], "description": "At most TIDINGS_MAX_PAYLOAD bytes serialised; checked against the registry's schema for the type"},
            "links": {"type": "array", "maxItems": MAX_LINKS, "items": {
                "type": "object", "additionalProperties": false, "required": ["rel", "ref"],
                "properties": {"rel": text(MAX_FIELD_LEN), "ref": text(MAX_FIELD_LEN)},
            }},
            "visibility": {"type": "string", "enum": ["public", "reviewer_only", "admin"]},
        },
    })
}

/// Where the JsonLogic rule schema lives in the document (it is recursive).
const RULE_REF: &str = "#/components/schemas/JsonLogicRule";

/// A JsonLogic rule as the filter compiler takes it: a scalar, a list of
/// rules, or an object with exactly one known operator whose argument count
/// is within that operator's arity (`filter::payload::OPERATORS`, the table
/// the compiler checks). Depth and size limits are settings, in the text.
fn rule_schema() -> Value {
    let rule = json!({"$ref": RULE_REF});
    let operations: Vec<Value> = crate::filter::payload::OPERATORS
        .iter()
        .map(|&(op, min, max)| {
            let mut list = json!({"type": "array", "items": rule, "minItems": min});
            if let Some(max) = max {
                list["maxItems"] = json!(max);
            }
            // A single argument may also be written bare; a bare list would
            // be the argument list itself.
            let bare = json!({"$ref": RULE_REF, "type": ["string", "number", "boolean", "null", "object"]});
            let args = if min <= 1 && max.is_none_or(|m| m >= 1) { json!({"anyOf": [list, bare]}) } else { list };
            json!({"type": "object", "additionalProperties": false, "required": [op], "properties": {op: args}})
        })
        .collect();
    json!({
        "description": "A JsonLogic rule over the payload: known operators with their argument counts, at most TIDINGS_MAX_RULE_DEPTH deep and TIDINGS_MAX_RULE_NODES nodes",
        "anyOf": [{"type": ["string", "number", "boolean", "null"]}, {"type": "array", "items": rule}, {"anyOf": operations}],
    })
}

fn filter_schema(max_list: usize) -> Value {
    let globs = json!({"type": "array", "maxItems": max_list, "items": {"type": "string", "pattern": format!("^{}$", glob_pattern()), "maxLength": tidings_protocol::event::MAX_NAME_LEN}});
    let values = json!({"type": "array", "maxItems": max_list, "items": {"type": "string", "minLength": 1, "maxLength": tidings_protocol::event::MAX_FIELD_LEN}});
    json!({"anyOf": [
        globs,
        {"type": "object", "additionalProperties": false, "properties": {
            "types": nullable(globs), "agents": nullable(values.clone()), "targets": nullable(values), "payload": {"anyOf": [{"type": "null"}, {"$ref": RULE_REF}]},
            "since": {"description": "Accepted and ignored (a request field)"},
            "consumer_id": {"description": "Accepted and ignored (a request field)"},
        }},
    ]})
}

fn consumer_id() -> Value {
    json!({"type": "string", "pattern": format!("^[A-Za-z0-9._:-]{{1,{}}}$", crate::service::poll::MAX_CONSUMER_ID)})
}

/// An event id (a resume point, a cursor).
fn id() -> Value {
    json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": i64::MAX})
}

/// A count or a duration: any size is taken (and capped by the settings).
fn uint(minimum: u64) -> Value {
    json!({"type": "integer", "minimum": minimum, "maximum": u64::MAX})
}

fn path_glob() -> Value {
    let seg = format!(r"(?:{PATH_SEGMENT}|\*\*?)");
    json!({"type": "string", "pattern": format!("^{seg}(?:/{seg})*$"), "maxLength": tidings_protocol::tree::MAX_PATH_LEN})
}

fn hash() -> Value {
    json!({"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"})
}

/// The body schema of each operation that takes one.
fn body_schema(method: &str, path: &str, settings: &Settings) -> Option<Value> {
    let max_list = settings.filters.max_filter_list;
    Some(match (method, path) {
        ("post", "/v1/events") => json!({"oneOf": [
            event_schema(),
            {"type": "object", "additionalProperties": false, "required": ["events"], "properties": {
                "events": {"type": "array", "minItems": 1, "maxItems": settings.publish.max_batch, "items": event_schema()},
            }},
        ]}),
        ("post", "/v1/poll") => json!({"type": "object", "additionalProperties": false, "properties": {
            "filter": {"anyOf": [{"type": "null"}, filter_schema(max_list)]},
            "since": nullable(id()),
            "consumer_id": nullable(consumer_id()),
            "limit": nullable(uint(1)),
            "wait_ms": nullable(uint(0)),
            "accept_envelope": {"type": ["string", "null"], "pattern": envelope_pattern()},
        }}),
        ("post", "/v1/consumers/{id}/ack") => {
            json!({"type": "object", "additionalProperties": false, "required": ["cursor"], "properties": {
                "cursor": id(),
            }})
        }
        ("put", "/v1/tree/{path}") => json!({"type": "object", "additionalProperties": false, "required": ["type", "data"], "properties": {
            "type": {"type": "string", "minLength": 1, "maxLength": tidings_protocol::tree::MAX_TYPE_LEN},
            "data": {},
        }}),
        ("post", "/v1/admin/capabilities") => {
            json!({"type": "object", "additionalProperties": false, "required": ["grantee", "grants"], "properties": {
                "grantee": hash(),
                "grants": {"type": "array", "items": {"type": "object", "additionalProperties": false, "required": ["handler", "operations", "resources"], "properties": {
                    "handler": {"type": "string", "minLength": 1},
                    "operations": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                    "resources": {"type": "array", "minItems": 1, "items": path_glob()},
                }}, "minItems": 1},
                "expires_at": nullable(uint(0)),
            }})
        }
        ("post", "/v1/execute") => json!({"type": "object", "additionalProperties": false, "required": ["execute"], "properties": {
            "execute": {"type": "object", "required": ["type", "data"], "properties": {
                "type": {"const": "system/protocol/execute"},
                "data": {"type": "object"},
            }, "description": "A signed system/protocol/execute entity (the signature cannot be described by a schema)"},
            "included": {"type": "object", "additionalProperties": {"type": "object"}, "description": "Entities the EXECUTE refers to, each under its own hash"},
        }}),
        _ => return None,
    })
}

/// The schema of a parameter, by where it is and its name.
fn parameter_schema(location: &str, name: &str, method: &str, settings: &Settings) -> Option<Value> {
    let max_list = settings.filters.max_filter_list;
    let any_entry = r"[^,\t\n\f\r ](?:[^,]*[^,\t\n\f\r ])?";
    Some(match (location, name) {
        // A GET of a path ending in `/` lists its children.
        ("path", "path") => {
            json!({"type": "string", "pattern": path_pattern(method == "get"), "maxLength": tidings_protocol::tree::MAX_PATH_LEN})
        }
        ("path", "id") => consumer_id(),
        // Any positive id: one past the largest is not found.
        ("path", "event_id") => json!({"type": "string", "pattern": "^[1-9][0-9]{0,15}$"}),
        ("query", "consumer_id") => consumer_id(),
        ("query", "since") => id(),
        ("query", "limit") => uint(1),
        ("query", "wait_ms") => uint(0),
        ("query", "accept_envelope") => json!({"type": "string", "pattern": envelope_pattern()}),
        ("query", "types") => {
            json!({"type": "string", "pattern": comma_list(&glob_pattern()), "description": format!("At most {max_list} entries")})
        }
        ("query", "agents" | "targets") => {
            json!({"type": "string", "pattern": comma_list(any_entry), "description": format!("At most {max_list} entries")})
        }
        ("query", "filter") => return None,
        ("header", "Last-Event-ID") => json!({"type": "string", "pattern": "^ *[0-9]{1,18} *$"}),
        ("header", "If-None-Match") => json!({"type": "string", "enum": ["*"]}),
        ("header", "If-Match") => json!({"type": "string", "pattern": "^(?:\\*|\"?sha256:[0-9a-f]{64}\"?)$"}),
        ("header", "Idempotency-Key") => json!({"type": "string", "pattern": "^[!-~]{1,255}$"}),
        // An empty header is none (docs/tracing.md).
        ("header", "traceparent") => json!({"type": "string", "pattern": or_empty(&tidings_protocol::trace::traceparent_pattern())}),
        ("header", "tracestate") => {
            json!({"type": "string", "pattern": or_empty(tidings_protocol::trace::TRACESTATE_PATTERN), "maxLength": tidings_protocol::trace::MAX_TRACESTATE})
        }
        ("header", "X-Chain-Id") => {
            json!({"type": "string", "pattern": format!("^{PATH_SEGMENT}$"), "maxLength": tidings_protocol::tree::MAX_CHAIN_ID_LEN})
        }
        _ => return None,
    })
}

/// `pattern` (anchored at both ends), or the empty string.
fn or_empty(pattern: &str) -> String {
    format!("^(?:{})?$", pattern.trim_start_matches('^').trim_end_matches('$'))
}

/// The envelope every event is delivered in (the `data:` of an unnamed
/// stream frame, an item of a poll's `events`).
fn envelope_schema() -> Value {
    let mut schema = event_schema();
    schema["required"] = json!(["envelope_version", "event_id", "event_type", "occurred_at", "payload", "links", "visibility"]);
    schema["additionalProperties"] = json!(false);
    schema["properties"]["envelope_version"] = json!({"type": "integer", "enum": tidings_protocol::event::SUPPORTED_ENVELOPE_VERSIONS});
    schema["properties"]["event_id"] = id();
    schema["properties"]["payload"] = json!({"type": "object"});
    schema["properties"]["traceparent"] = json!({"type": "string", "pattern": tidings_protocol::trace::traceparent_pattern()});
    schema["properties"]["tracestate"] = json!({"type": "string", "pattern": tidings_protocol::trace::TRACESTATE_PATTERN, "maxLength": tidings_protocol::trace::MAX_TRACESTATE});
    schema
}

/// The frames of `GET /v1/stream`, by SSE event name (`message` is an
/// unnamed frame): each frame's `data:` is one line of this JSON.
fn stream_frames() -> Value {
    json!({
        "type": "object",
        "description": "The frames of the stream, by SSE event name: unnamed frames (`message`, with `id:` the event id) carry an envelope; `system.replay_gap` says a resume point could not be served whole (resume from `available_from`; `reason` says why: `pruned`, `replay_limit`, `beyond_head`, or `history_lost`, which names the `fork` after which history was lost); `system.client_dropped_slow` ends a stream whose client fell behind (resume from `last_event_id`); `system.token_expired` ends a stream whose token expired (resume from `last_event_id` with a fresh token); `system.filter_budget_exceeded` says, once, that the payload rule went over its budget on an event (which did not match). Comment lines are heartbeats; `retry:` opens and closes the stream.",
        "properties": {
            "message": envelope_schema(),
            "system.replay_gap": {"type": "object", "additionalProperties": false, "required": ["requested", "available_from", "head", "reason"], "properties": {
                "requested": id(), "available_from": id(), "head": id(),
                "reason": {"type": "string", "enum": ["pruned", "replay_limit", "beyond_head", "history_lost"], "description": "`history_lost`: the store lost the history after `fork` (a failover, a restored backup) and what the client saw after it is gone"},
                "fork": id(),
            }},
            "system.client_dropped_slow": {"type": "object", "additionalProperties": false, "required": ["reason", "last_event_id", "queue"], "properties": {
                "reason": {"type": "string", "enum": ["queue_full", "no_progress"]},
                "last_event_id": id(),
                "queue": {"type": "integer", "minimum": 0},
            }},
            "system.token_expired": {"type": "object", "additionalProperties": false, "required": ["last_event_id"], "properties": {
                "last_event_id": {"oneOf": [id(), {"type": "null"}]},
            }},
            "system.filter_budget_exceeded": {"type": "object", "additionalProperties": false, "required": ["budget"], "properties": {
                "budget": {"type": "integer", "minimum": 0},
            }},
        },
    })
}

/// Replaces the placeholder request schemas of `doc` (see the module docs).
pub(crate) fn refine(doc: &mut Value, settings: &Settings) {
    if let Some(schemas) = doc.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        schemas.insert("JsonLogicRule".into(), rule_schema());
        schemas.insert("Envelope".into(), envelope_schema());
        schemas.insert("StreamFrames".into(), stream_frames());
    }
    if let Some(content) = doc.pointer_mut("/paths/~1v1~1stream/get/responses/200/content/text~1event-stream") {
        content["schema"] = json!({"type": "string", "description": "Server-Sent Events; the data of each frame is in `StreamFrames`"});
        content["x-sse-frames"] = json!({"$ref": "#/components/schemas/StreamFrames"});
    }
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else { return };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else { continue };
        for (method, operation) in item.iter_mut() {
            // The connection loop's refusals of oversized heads answer any route.
            if let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) {
                let error = json!({"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}});
                responses.entry("414").or_insert(
                    json!({"description": "`uri_too_long`: the request target is over 48 KiB (the connection closes)", "content": error}),
                );
                responses.entry("431").or_insert(json!({"description": "`headers_too_large`: over 100 headers or a 64 KiB head (the connection closes)", "content": error}));
                // The guard's refusals (`http::guard`), before any handler runs.
                let guard = "`origin_refused`: the `Origin` is not this server's own nor in `TIDINGS_CORS_ORIGINS`; `host_refused`: with auth off, the request was not addressed to a loopback name";
                let forbidden = responses.entry("403").or_insert(json!({"description": "", "content": error}));
                let said = forbidden["description"].as_str().unwrap_or("").to_owned();
                forbidden["description"] = json!(if said.is_empty() { guard.to_owned() } else { format!("{said}; {guard}") });
                if operation.get("requestBody").is_some()
                    && let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut)
                {
                    responses.entry("415").or_insert(
                        json!({"description": "`unsupported_media_type`: a body that is not `application/json`", "content": error}),
                    );
                }
            }
            if let Some(schema) = body_schema(method, path, settings)
                && let Some(content) = operation.pointer_mut("/requestBody/content/application~1json")
            {
                content["schema"] = schema;
                operation["requestBody"]["required"] = json!(true);
            }
            let Some(parameters) = operation.get_mut("parameters").and_then(Value::as_array_mut) else { continue };
            for parameter in parameters.iter_mut() {
                let (Some(location), Some(name)) = (parameter["in"].as_str(), parameter["name"].as_str()) else { continue };
                if (location, name) == ("query", "filter") {
                    // A JSON filter in the query: described by its content.
                    if let Some(p) = parameter.as_object_mut() {
                        p.remove("schema");
                        p.insert(
                            "content".into(),
                            json!({"application/json": {"schema": filter_schema(settings.filters.max_filter_list)}}),
                        );
                    }
                } else if let Some(schema) = parameter_schema(location, name, method, settings) {
                    parameter["schema"] = schema;
                }
            }
        }
    }
}
