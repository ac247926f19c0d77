//! `POST /mcp`: tidings as a Model Context Protocol server on the
//! streamable HTTP transport, for AI agents, built on the official Rust SDK
//! (`rmcp`). The caller is authenticated like every other request (the
//! bearer token, through [`Caller`]) before the SDK reads a byte, and every
//! tool runs the same service call as its HTTP endpoint, so grants,
//! visibility, limits and stable error codes are the same: `publish`,
//! `poll`, `ack`, `event_types`, `tree_get`, `tree_list`, `tree_put`. A
//! refusal is a tool error (`isError: true`) whose structured content is
//! `{error, message}`; a tool the caller's grants cannot use is not listed
//! (and refused as `forbidden_tool` when called anyway).
//!
//! Stateless: each POST is one JSON-RPC exchange answered with JSON, and
//! no session outlives it, so any process behind a balancer answers any
//! request and a caller cannot make the server keep anything between them.

use std::sync::{Arc, LazyLock};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult, JsonObject, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::caller::Caller;
use super::error::ApiError;
use super::{AppState, ClientGone};
use crate::auth::Identity;
use crate::service::publish::PublishError;
use crate::service::tree as tree_service;
use tidings_protocol::event::names;
use tidings_protocol::trace::{TraceContext, TraceError};

/// Answers one MCP request (`initialize`, `tools/list`, `tools/call`, ...).
#[utoipa::path(
    post,
    path = "/mcp",
    tag = "agents",
    request_body(content = Object, content_type = "application/json", description = "One JSON-RPC 2.0 message of the Model Context Protocol (streamable HTTP transport, stateless: no `Mcp-Session-Id`). `Accept` must list `application/json` and `text/event-stream`. Tools: `publish {events, idempotency_key?}`, `poll {filter?, since?, consumer_id?, wait_ms?, limit?}`, `ack {consumer_id, cursor}`, `event_types {}`, `tree_get {path}`, `tree_list {path}`, `tree_put {path, entity, if_match?}`; only those the caller's grants can use are listed. A refusal is a tool result with `isError: true` and structured content `{error, message}` carrying the code the HTTP endpoint would answer, `invalid_arguments` for arguments the tool does not take, or `forbidden_tool` for a tool the caller cannot use"),
    responses(
        (status = 200, description = "The JSON-RPC answer", body = Object),
        (status = 202, description = "A notification or a response, accepted"),
        (status = 400, description = "`invalid_mcp_message`: not a JSON-RPC message of the protocol", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 405, description = "`method_not_allowed`", body = crate::http::openapi::ErrorBody),
        (status = 408, description = "`body_timeout`: the message did not arrive within `TIDINGS_BODY_TIMEOUT` (the connection closes)", body = crate::http::openapi::ErrorBody),
        (status = 406, description = "`not_acceptable`: `Accept` does not list both `application/json` and `text/event-stream`", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "`body_too_large`: the message is over TIDINGS_MAX_BODY", body = crate::http::openapi::ErrorBody),
        (status = 415, description = "`unsupported_media_type`: the body is not `application/json` (a JSON body that is not one message, a batch say, is `400 invalid_mcp_message`)", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "`invalid_mcp_message`: a message the protocol does not take here", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []))
)]
pub(crate) async fn post(State(app): State<AppState>, Caller(caller): Caller, request: Request) -> Response {
    // The body is read here, under the same size and time limits as every
    // other body (TIDINGS_MAX_BODY, TIDINGS_BODY_TIMEOUT), before the SDK
    // sees the request.
    let (mut parts, body) = request.into_parts();
    let bytes = match super::events::read_body(app.settings(), &parts.headers, body).await {
        Ok(bytes) => bytes,
        Err(refusal) => return refusal.into_response(),
    };
    let json = parts.headers.get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().to_ascii_lowercase().starts_with(b"application/json"));
    // The SDK keeps the last of a key given twice: such a message is
    // refused before it sees it (tool arguments are an event, an entity).
    if json && let Err(e) = crate::json::strict_value(&bytes) {
        return ApiError::bad_request("invalid_mcp_message", format!("the message is not valid JSON: {e}")).into_response();
    }
    parts.extensions.insert(caller);
    // A `poll` that waits stops when its client is gone (the request runs
    // detached, as every non-`GET` does).
    let gone = parts.extensions.get::<ClientGone>().map(|g| g.0.clone()).unwrap_or_default();
    let request = Request::from_parts(parts, Body::from(bytes));
    let max_body = app.settings().http.max_body;
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        // Which hosts and origins may call is the server's own policy
        // (TIDINGS_CORS_ORIGINS, tokens), the same as for every route.
        .disable_allowed_hosts()
        .with_max_request_body_bytes(max_body);
    // Built per request: cheap, and no handle on the application outlives it.
    let service = StreamableHttpService::new(
        move || Ok(Tools { app: app.clone(), gone: gone.clone() }),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let response = match service.oneshot(request).await {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    };
    stable(response, json).await
}

/// The SDK's own refusals of a request it could not take as MCP (plain
/// text) as tidings' JSON errors with stable codes; JSON answers (the
/// protocol's, with their JSON-RPC errors) go through as they are.
async fn stable(response: Response, sent_json: bool) -> Response {
    let mut status = response.status();
    let json = response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !status.is_client_error() || json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 4096).await.unwrap_or_default();
    let message = String::from_utf8_lossy(&text).trim().to_owned();
    // A JSON body the SDK could not read as a message (malformed, or a
    // batch) is a bad message, not a wrong media type.
    if status == StatusCode::UNSUPPORTED_MEDIA_TYPE && sent_json {
        status = StatusCode::BAD_REQUEST;
    }
    let code = match status {
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        _ => "invalid_mcp_message",
    };
    ApiError::new(
        status,
        code,
        if message.is_empty() { "the request is not an MCP message this endpoint takes".to_owned() } else { message },
    )
    .into_response()
}

/// The tools, for one request.
#[derive(Clone)]
pub(crate) struct Tools {
    app: AppState,
    /// Cancelled when the client of this request goes away.
    gone: CancellationToken,
}

/// A tool, and who may use it.
struct Entry {
    tool: Tool,
    allowed: fn(&Identity) -> bool,
}

fn schema(value: Value) -> Arc<JsonObject> {
    Arc::new(value.as_object().cloned().unwrap_or_default())
}

fn tool(name: &'static str, description: &'static str, input: Value, output: Value, read_only: bool) -> Tool {
    let mut annotations = ToolAnnotations::default();
    annotations.read_only_hint = Some(read_only);
    annotations.destructive_hint = Some(false);
    annotations.open_world_hint = Some(false);
    Tool::new(name, description, schema(input)).with_raw_output_schema(schema(output)).with_annotations(annotations)
}

fn may_publish(caller: &Identity) -> bool {
    !caller.publish.is_empty()
}
fn may_subscribe(caller: &Identity) -> bool {
    !caller.subscribe.is_empty()
}
fn anyone(_: &Identity) -> bool {
    true
}
fn may_read_tree(caller: &Identity) -> bool {
    caller.may_subscribe(names::TREE_UPDATED)
}
fn may_write_tree(caller: &Identity) -> bool {
    caller.may_publish(names::TREE_CREATED) && caller.may_publish(names::TREE_UPDATED)
}

static CATALOG: LazyLock<Vec<Entry>> = LazyLock::new(|| {
    let filter = json!({"type": "object", "description": "A filter: {types?: [glob], agents?: [id], targets?: [ref], payload?: JsonLogic rule}; fields AND-combined, values within one OR-combined"});
    let envelope = json!({"type": "object", "required": ["event_id", "event_type", "payload"], "properties": {"event_id": {"type": "integer"}, "event_type": {"type": "string"}}});
    let gap = json!({"type": "object", "properties": {"requested": {"type": "integer"}, "available_from": {"type": "integer"}, "head": {"type": "integer"},
        "reason": {"type": "string", "enum": ["pruned", "replay_limit", "beyond_head", "history_lost"]}, "fork": {"type": "integer"}}});
    let event = json!({"type": "object", "required": ["event_type"], "properties": {
        "event_type": {"type": "string", "description": "Dotted lowercase name, e.g. comment.posted"},
        "ref": {"type": "string"}, "payload": {"type": "object"}, "session_id": {"type": "string"},
        "agent": {"type": "object", "properties": {"id": {"type": "string"}, "kind": {"type": "string"}}},
        "links": {"type": "array", "items": {"type": "object", "properties": {"rel": {"type": "string"}, "ref": {"type": "string"}}}},
        "visibility": {"type": "string", "enum": ["public", "reviewer_only", "admin"]},
        "occurred_at": {"type": "string", "format": "date-time"}}});
    let path = json!({"type": "string", "description": "A tree path: segments separated by /"});
    vec![
        Entry {
            tool: tool(
                "publish",
                "Publishes events (all or nothing) and returns their ids. Give an idempotency_key to make retries safe: the same key with the same events stores them once and answers the first ids.",
                json!({"type": "object", "additionalProperties": false, "required": ["events"], "properties": {
                    "events": {"type": "array", "minItems": 1, "items": event},
                    "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 255}}}),
                json!({"type": "object", "required": ["event_ids"], "properties": {"event_ids": {"type": "array", "items": {"type": "integer"}}, "replayed": {"type": "boolean"}}}),
                false,
            ),
            allowed: may_publish,
        },
        Entry {
            tool: tool(
                "poll",
                "Reads the events after `since` that match `filter` (or, with `consumer_id`, after that durable consumer's stored cursor, which moves only on `ack` or on the next poll with `since`), waiting up to `wait_ms` for one to match. Answers `next_since`: the `since` of the next poll and what to acknowledge.",
                json!({"type": "object", "additionalProperties": false, "properties": {
                    "filter": filter, "since": {"type": "integer", "minimum": 0}, "consumer_id": {"type": "string"},
                    "wait_ms": {"type": "integer", "minimum": 0}, "limit": {"type": "integer", "minimum": 1}}}),
                json!({"type": "object", "required": ["events", "next_since", "has_more"], "properties": {
                    "events": {"type": "array", "items": envelope}, "next_since": {"type": "integer"}, "has_more": {"type": "boolean"}, "gap": gap}}),
                true,
            ),
            allowed: may_subscribe,
        },
        Entry {
            tool: tool(
                "ack",
                "Confirms that a durable consumer has handled everything up to `cursor` (a poll's next_since); the cursor never moves backwards or past the head.",
                json!({"type": "object", "additionalProperties": false, "required": ["consumer_id", "cursor"], "properties": {
                    "consumer_id": {"type": "string"}, "cursor": {"type": "integer", "minimum": 0}}}),
                json!({"type": "object", "required": ["cursor"], "properties": {"cursor": {"type": "integer"}}}),
                false,
            ),
            allowed: may_subscribe,
        },
        Entry {
            tool: tool(
                "event_types",
                "Lists the registered event types, with their payload schemas and former names.",
                json!({"type": "object", "additionalProperties": false, "properties": {}}),
                json!({"type": "object", "required": ["types"], "properties": {"mode": {"type": "string"}, "types": {"type": "array", "items": {"type": "object"}}}}),
                true,
            ),
            allowed: anyone,
        },
        Entry {
            tool: tool(
                "tree_get",
                "Reads the entity at a tree path, with its hash (what tree_put's if_match takes).",
                json!({"type": "object", "additionalProperties": false, "required": ["path"], "properties": {"path": path}}),
                json!({"type": "object", "required": ["entity", "hash"], "properties": {"entity": {"type": "object"}, "hash": {"type": "string"}}}),
                true,
            ),
            allowed: may_read_tree,
        },
        Entry {
            tool: tool(
                "tree_list",
                "Lists the children of a tree path (the root for an empty path).",
                json!({"type": "object", "additionalProperties": false, "required": ["path"], "properties": {"path": {"type": "string"}}}),
                json!({"type": "object", "required": ["children"], "properties": {"path": {"type": "string"}, "truncated": {"type": "boolean"}, "children": {"type": "array", "items": {"type": "object"}}}}),
                true,
            ),
            allowed: may_read_tree,
        },
        Entry {
            tool: tool(
                "tree_put",
                "Writes the entity {type, data} at a tree path. With if_match (a hash from tree_get, or * for any existing entity) the write happens only if the entity is still that one; otherwise it is refused with hash_mismatch.",
                json!({"type": "object", "additionalProperties": false, "required": ["path", "entity"], "properties": {
                    "path": path, "entity": {"type": "object", "required": ["type", "data"], "properties": {"type": {"type": "string"}, "data": {}}},
                    "if_match": {"type": "string"}}}),
                json!({"type": "object", "required": ["hash"], "properties": {"hash": {"type": "string"}, "previous_hash": {"type": ["string", "null"]}, "event_id": {"type": "integer"}}}),
                false,
            ),
            allowed: may_write_tree,
        },
    ]
});

/// The caller the route authenticated.
fn caller(context: &RequestContext<RoleServer>) -> Result<Identity, ErrorData> {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Identity>())
        .cloned()
        .ok_or_else(|| ErrorData::internal_error("the request carries no caller", None))
}

/// A refusal as a tool error: `{error: <stable code>, message}`.
fn refused(error: ApiError) -> CallToolResult {
    let mut body = json!({ "error": error.code(), "message": error.message() });
    // What the HTTP answer adds (the current hash of a CAS conflict, ...).
    if let (Some(Value::Object(extra)), Value::Object(map)) = (error.details(), &mut body) {
        map.extend(extra.clone());
    }
    let mut result = CallToolResult::error(vec![ContentBlock::text(body.to_string())]);
    result.structured_content = Some(body);
    result
}

fn arguments<T: for<'de> Deserialize<'de>>(arguments: Option<JsonObject>) -> Result<T, ApiError> {
    serde_json::from_value(Value::Object(arguments.unwrap_or_default()))
        .map_err(|e| ApiError::bad_request("invalid_arguments", format!("the tool's arguments are not valid: {e}")))
}

/// The W3C trace context a request's `_meta` carries (`traceparent`,
/// `tracestate`: strings, checked as the HTTP door checks its headers).
fn trace_of(meta: &JsonObject) -> Result<Option<TraceContext>, PublishError> {
    let field = |name: &str, bad: TraceError| match meta.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str()).filter(|s| !s.is_empty())),
        Some(_) => Err(PublishError::from(bad)),
    };
    let traceparent = field("traceparent", TraceError::Traceparent)?;
    let tracestate = field("tracestate", TraceError::Tracestate)?;
    Ok(TraceContext::parse(traceparent, tracestate)?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishArgs {
    events: Vec<Value>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckArgs {
    consumer_id: String,
    cursor: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathArgs {
    path: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutArgs {
    path: String,
    entity: Value,
    #[serde(default)]
    if_match: Option<String>,
}

impl Tools {
    /// Runs tool `name`; `trace` is the W3C trace context of the request's
    /// `_meta` (`traceparent`, `tracestate`), which a publish carries.
    async fn call(
        &self,
        caller: &Identity,
        name: &str,
        args: Option<JsonObject>,
        trace: Result<Option<TraceContext>, PublishError>,
    ) -> Result<Value, ApiError> {
        let core = self.app.core();
        match name {
            "publish" => {
                let args: PublishArgs = arguments(args)?;
                let trace = trace?;
                let body = serde_json::to_vec(&json!({ "events": args.events })).unwrap_or_default();
                let accepted =
                    crate::service::publish::publish(core, caller, &body, args.idempotency_key.as_deref(), trace.as_ref()).await?;
                Ok(json!({ "event_ids": accepted.event_ids, "replayed": accepted.replayed }))
            }
            "poll" => {
                let body: super::poll::PollBody = arguments(args)?;
                let request = super::poll::request_of(&self.app, body, self.gone.clone())?;
                let page = crate::service::poll::poll(core, caller, request).await?;
                serde_json::from_slice(&super::poll::page_json(page)).map_err(|_| internal())
            }
            "ack" => {
                let args: AckArgs = arguments(args)?;
                crate::service::poll::check_consumer_id(&args.consumer_id)?;
                let cursor = super::poll::ack_cursor(&args.cursor)?;
                let cursor = crate::service::poll::ack(core, caller, &args.consumer_id, cursor).await?;
                Ok(json!({ "consumer_id": args.consumer_id, "cursor": cursor }))
            }
            "event_types" => {
                let _: NoArgs = arguments(args)?;
                let registry = self.app.registry();
                Ok(json!({ "mode": registry.mode(), "types": registry.docs().collect::<Vec<_>>() }))
            }
            "tree_get" => {
                let args: PathArgs = arguments(args)?;
                let entry = tree_service::get(core, caller, &args.path).await?;
                let entity: Value = serde_json::from_str(&entry.entity).map_err(|_| internal())?;
                Ok(json!({ "entity": entity, "hash": entry.hash }))
            }
            "tree_list" => {
                let args: PathArgs = arguments(args)?;
                let listing = tree_service::list(core, caller, args.path.trim_end_matches('/')).await?;
                Ok(super::tree::listing_json(listing))
            }
            "tree_put" => {
                let args: PutArgs = arguments(args)?;
                tree_service::check_write(caller, &args.path, false)?;
                let condition = super::tree::if_match(args.if_match.as_deref())?;
                let body = serde_json::to_vec(&args.entity).unwrap_or_default();
                let written =
                    tree_service::put(core, caller, &args.path, condition, &body, tidings_protocol::tree::generate_id(), trace?).await?;
                Ok(json!({ "hash": written.hash, "previous_hash": written.previous_hash, "event_id": written.event_id }))
            }
            // Only catalogued tools get here.
            _ => Err(internal()),
        }
    }
}

fn internal() -> ApiError {
    ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
}

impl ServerHandler for Tools {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("tidings", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "tidings is an event-stream broker. Publish events with `publish` (pass an idempotency_key to retry safely), read them with `poll` (a consumer_id keeps your place across sessions; `ack` its next_since once handled), learn the event types with `event_types`, and read and write the entity tree with `tree_get`, `tree_list` and `tree_put` (if_match for compare-and-set).",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let caller = caller(&context)?;
        Ok(ListToolsResult::with_all_items(CATALOG.iter().filter(|e| (e.allowed)(&caller)).map(|e| e.tool.clone()).collect()))
    }

    #[expect(
        clippy::disallowed_methods,
        reason = "a tool call runs apart from the session that asked, bounded by the request's cancellation"
    )]
    async fn call_tool(&self, request: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let caller = caller(&context)?;
        let Some(entry) = CATALOG.iter().find(|e| e.tool.name == request.name) else {
            return Err(ErrorData::invalid_params(format!("no tool named {:?}", request.name), None));
        };
        if !(entry.allowed)(&caller) {
            return Ok(refused(ApiError::forbidden("forbidden_tool", format!("the caller's grants do not allow {}", request.name))).into());
        }
        // On a task of its own: a tool that panicked answers `internal`
        // rather than leaving the request waiting for an answer forever.
        let trace = trace_of(&context.meta);
        let (tools, name) = (self.clone(), request.name.clone());
        let call = tokio::spawn(async move { tools.call(&caller, &name, request.arguments, trace).await });
        Ok(match call.await {
            // A page is answered once, as structured content; the text says
            // what it holds (rmcp's `structured` would carry it twice).
            Ok(Ok(value)) if request.name == "poll" => {
                let mut result = CallToolResult::structured(Value::Null);
                let summary = format!(
                    "{} events, next_since {}, has_more {} (the page is the structured content)",
                    value["events"].as_array().map_or(0, Vec::len),
                    value["next_since"],
                    value["has_more"]
                );
                result.content = vec![ContentBlock::text(summary)];
                result.structured_content = Some(value);
                result
            }
            Ok(Ok(value)) => CallToolResult::structured(value),
            Ok(Err(error)) => refused(error),
            Err(panicked) => {
                tracing::error!(error = %panicked, tool = %request.name, "an MCP tool panicked");
                refused(internal())
            }
        }
        .into())
    }
}
