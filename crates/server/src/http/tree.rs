//! `GET|PUT|DELETE /v1/tree/{path}`: the entity tree over HTTP. What a
//! tree operation decides (grants, `system/`, CAS, the change event) is
//! [`crate::service::tree`]; this file reads `If-Match` / `If-None-Match`
//! and `X-Chain-Id`, and writes entities with their hash as `ETag`.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use crate::service::tree::{self as service, Listing, Written};
use crate::store::{ChangeKind, Condition};
use tidings_protocol::tree::{generate_id, is_hash, validate_chain_id};

fn etag(hash: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{hash}\"")).expect("hashes are header-safe")
}

fn unquote(v: &str) -> &str {
    let v = v.trim();
    v.strip_prefix("W/").unwrap_or(v).trim_matches('"')
}

fn condition(headers: &HeaderMap) -> Result<Condition, ApiError> {
    // An empty header lists no entity tag: no condition.
    let text = |name| {
        headers
            .get(name)
            .filter(|v| !v.as_bytes().iter().all(u8::is_ascii_whitespace))
            .map(|v| v.to_str().map_err(|_| ApiError::bad_request("invalid_condition", "unreadable precondition header")))
    };
    match (text(header::IF_MATCH).transpose()?, text(header::IF_NONE_MATCH).transpose()?) {
        (Some(_), Some(_)) => Err(ApiError::bad_request("invalid_condition", "give If-Match or If-None-Match, not both")),
        (Some(m), None) => if_match(Some(m)),
        (None, Some("*")) => Ok(Condition::IfAbsent),
        (None, Some(_)) => Err(ApiError::bad_request("invalid_condition", "If-None-Match supports only *")),
        (None, None) => Ok(Condition::Always),
    }
}

/// The condition of an `If-Match` (or the MCP `tree_put`'s `if_match`):
/// `*` matches any current entity; with none there the write is refused
/// like any other failed precondition (409, RFC 9110).
pub(crate) fn if_match(value: Option<&str>) -> Result<Condition, ApiError> {
    match value {
        None => Ok(Condition::Always),
        Some(m) if m.trim() == "*" => Ok(Condition::IfPresent),
        Some(m) if is_hash(unquote(m)) => Ok(Condition::IfMatch(unquote(m).to_owned())),
        Some(_) => Err(ApiError::bad_request("invalid_condition", "If-Match is * or an entity hash (sha256:<64 lowercase hex>)")),
    }
}

/// The causal chain a write belongs to: `X-Chain-Id`, else a fresh one.
/// Notifications the write triggers, and their chain-error markers, carry it.
pub(crate) fn chain_id(headers: &HeaderMap) -> Result<String, ApiError> {
    match headers.get("x-chain-id") {
        None => Ok(generate_id()),
        Some(v) => {
            let id = v.to_str().map_err(|_| ApiError::bad_request("invalid_chain_id", "X-Chain-Id is not readable text"))?;
            validate_chain_id(id).map_err(|e| ApiError::bad_request("invalid_chain_id", e.0))?;
            Ok(id.to_owned())
        }
    }
}

/// Reads an entity, or lists children when the path ends with `/`.
#[utoipa::path(
    get,
    path = "/v1/tree/{*path}",
    tag = "tree",
    params(("path" = String, Path, description = "A tree path; a trailing / lists its children")),
    responses(
        (status = 200, description = "The entity `{type, data}` with its hash as ETag and the log id of the change that wrote it as Tidings-Change-Id, or `{path, children: [{name, path, entity, has_children}]}`", body = Object),
        (status = 400, description = "`invalid_path`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_tree_access` (outside the token's tree grants)", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`entity_not_found`, with Tidings-Change-Id: the log id as of which the path is absent", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn get(State(app): State<AppState>, Caller(caller): Caller, Path(path): Path<String>) -> Result<Response, ApiError> {
    if let Some(dir) = path.strip_suffix('/') {
        return Ok(listing(service::list(app.core(), &caller, dir).await?));
    }
    let entry = match service::get(app.core(), &caller, &path).await {
        Ok(entry) => entry,
        Err(service::TreeError::NotFound(_)) => {
            // Absent as of at least this change (read, then the path read
            // again): what a mirror re-reading it compares older signed
            // changes with.
            let head = app.core().store().head().await.map_err(|e| ApiError::from(service::TreeError::from(e)))?;
            match service::get(app.core(), &caller, &path).await {
                Ok(entry) => entry,
                Err(e) => {
                    let mut response = ApiError::from(e).into_response();
                    response.headers_mut().insert(tidings_protocol::tree::CHANGE_ID_HEADER, HeaderValue::from(head));
                    return Ok(response);
                }
            }
        }
        Err(e) => return Err(e.into()),
    };
    let mut response = ([(header::CONTENT_TYPE, "application/json")], entry.entity).into_response();
    response.headers_mut().insert(header::ETAG, etag(&entry.hash));
    // The log id of the change that put it there: the `sequence` this
    // server signs that change with, so a mirror that re-reads a path
    // knows which older signed changes it must no longer take.
    response.headers_mut().insert(tidings_protocol::tree::CHANGE_ID_HEADER, HeaderValue::from(entry.changed_event));
    Ok(response)
}

/// Lists the tree's root.
#[utoipa::path(
    get,
    path = "/v1/tree/",
    tag = "tree",
    responses(
        (status = 200, description = "`{path, children: [{name, path, entity, has_children}]}`", body = Object),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_tree_access` (outside the token's tree grants)", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn root(State(app): State<AppState>, Caller(caller): Caller) -> Result<Response, ApiError> {
    Ok(listing(service::list(app.core(), &caller, "").await?))
}

fn listing(listing: Listing) -> Response {
    Json(listing_json(listing)).into_response()
}

/// A listing as JSON: `{path, children: [{name, path, entity, has_children}], truncated}`.
pub(crate) fn listing_json(listing: Listing) -> Value {
    let children: Vec<Value> = listing
        .children
        .into_iter()
        .map(|c| json!({ "name": c.name, "path": c.path, "entity": c.entity, "has_children": c.has_children }))
        .collect();
    json!({ "path": listing.path, "children": children, "truncated": listing.truncated })
}

fn written(written: Written) -> Response {
    let status = if written.kind == ChangeKind::Created { StatusCode::CREATED } else { StatusCode::OK };
    let body = json!({ "uri": written.uri, "hash": written.hash, "previous_hash": written.previous_hash, "event_id": written.event_id });
    let mut response = (status, Json(body)).into_response();
    if let Some(h) = &written.hash {
        response.headers_mut().insert(header::ETAG, etag(h));
    }
    response
}

/// Creates or replaces the entity at a path.
#[utoipa::path(
    put,
    path = "/v1/tree/{*path}",
    tag = "tree",
    params(
        ("path" = String, Path, description = "A tree path"),
        ("If-Match" = Option<String>, Header, description = "Write only if the current hash is this"),
        ("If-None-Match" = Option<String>, Header, description = "`*`: create only"),
        ("traceparent" = Option<String>, Header, description = "The writer's W3C trace context: its change event carries it (see `POST /v1/events`)."),
        ("tracestate" = Option<String>, Header, description = "The `tracestate` that goes with `traceparent`."),
    ),
    request_body(content = Object, content_type = "application/json", description = "`{type, data}`"),
    responses(
        (status = 200, description = "Replaced: `{uri, hash, previous_hash, event_id}`", body = Object),
        (status = 201, description = "Created: `{uri, hash, previous_hash: null, event_id}`", body = Object),
        (status = 400, description = "`invalid_path` (not a tree path), `invalid_entity` (not an entity of the tree), `invalid_condition` (`If-Match` is not `*` or an entity hash, `If-None-Match` is not `*`, or both are given), `malformed_body`, `invalid_traceparent`, `invalid_tracestate`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_tree_access` (outside the token's tree grants)", body = crate::http::openapi::ErrorBody),
        (status = 409, description = "`hash_mismatch` (the condition failed; the answer has `current_hash`)", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "`body_too_large`", body = crate::http::openapi::ErrorBody),
        (status = 408, description = "`body_timeout`: the body did not arrive within `TIDINGS_BODY_TIMEOUT` (the connection closes)", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`store_unavailable`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn put(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    service::check_write(&caller, &path, false)?;
    let condition = condition(&headers)?;
    let trace = super::events::trace_context(&headers)?;
    let bytes = super::events::read_body(app.settings(), &headers, body).await?;
    Ok(written(service::put(app.core(), &caller, &path, condition, &bytes, chain_id(&headers)?, trace).await?))
}

/// Deletes the entity at a path.
#[utoipa::path(
    delete,
    path = "/v1/tree/{*path}",
    tag = "tree",
    params(
        ("path" = String, Path, description = "A tree path"),
        ("If-Match" = Option<String>, Header, description = "Delete only if the current hash is this"),
        ("traceparent" = Option<String>, Header, description = "The writer's W3C trace context: the deletion's change event carries it."),
        ("tracestate" = Option<String>, Header, description = "The `tracestate` that goes with `traceparent`."),
    ),
    responses(
        (status = 200, description = "Deleted: `{uri, hash: null, previous_hash, event_id}`", body = Object),
        (status = 400, description = "`invalid_path`, `invalid_condition`, `invalid_traceparent`, `invalid_tracestate`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_tree_access` (outside the token's tree grants)", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`entity_not_found` (nothing at that path)", body = crate::http::openapi::ErrorBody),
        (status = 409, description = "`hash_mismatch` (the condition failed; the answer has `current_hash`)", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn delete(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    service::check_write(&caller, &path, true)?;
    let condition = condition(&headers)?;
    let trace = super::events::trace_context(&headers)?;
    Ok(written(service::delete(app.core(), &caller, &path, condition, chain_id(&headers)?, trace).await?))
}
