//! `GET|PUT|DELETE /v1/tree/{path}`: the entity tree over HTTP. Writes are
//! compare-and-swap on the entity hash (`If-Match`, `If-None-Match: *`) and
//! append a `tree.created` / `tree.updated` / `tree.deleted` event in the
//! same transaction, so tree changes travel the same log, broker, replay and
//! filters as every other event (`targets=tree:<path>`).
//!
//! Who may: writing a path needs the `publish` grant for the change event's
//! type (`tree.*`), reading needs the `subscribe` grant: the tree is as
//! visible as the events that describe it.

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use crate::event::{Agent, names};
use crate::store::{ChangeKind, Condition, TreeOutcome, TreeWrite};
use crate::tree::{Entity, change_event, change_type, generate_id, validate_chain_id, validate_path};

/// Most entries one listing scans.
const LIST_SCAN: usize = 10_000;

fn invalid_path(e: crate::tree::PathError) -> ApiError {
    ApiError::bad_request("invalid_path", e.0)
}

fn etag(hash: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{hash}\"")).expect("hashes are header-safe")
}

fn unquote(v: &str) -> &str {
    let v = v.trim();
    v.strip_prefix("W/").unwrap_or(v).trim_matches('"')
}

fn condition(headers: &HeaderMap) -> Result<Condition, ApiError> {
    let text = |name| {
        headers.get(name).map(|v| v.to_str().map_err(|_| ApiError::bad_request("invalid_condition", "unreadable precondition header")))
    };
    match (text(header::IF_MATCH).transpose()?, text(header::IF_NONE_MATCH).transpose()?) {
        (Some(_), Some(_)) => Err(ApiError::bad_request("invalid_condition", "give If-Match or If-None-Match, not both")),
        (Some(m), None) => Ok(Condition::IfMatch(unquote(m).to_owned())),
        (None, Some("*")) => Ok(Condition::IfAbsent),
        (None, Some(_)) => Err(ApiError::bad_request("invalid_condition", "If-None-Match supports only *")),
        (None, None) => Ok(Condition::Always),
    }
}

fn agent(caller: &crate::auth::Identity) -> Agent {
    Agent { id: caller.sub.clone(), kind: None }
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

fn require(allowed: bool, what: &str) -> Result<(), ApiError> {
    if allowed { Ok(()) } else { Err(ApiError::forbidden("forbidden_tree_access", format!("the caller may not {what} the tree"))) }
}

/// `system/…` holds what tidings itself keeps (subscriptions, their
/// configuration, chain-error markers): only admins read or write it
/// directly (seed 000 §1.1, §7.1). Subscribers go through `/v1/execute`.
fn require_system(caller: &crate::auth::Identity, path: &str) -> Result<(), ApiError> {
    let system = path == "system" || path.starts_with("system/");
    if system && !caller.admin {
        return Err(ApiError::forbidden("forbidden_tree_access", "only admins read or write system/ directly"));
    }
    Ok(())
}

/// Reads an entity, or lists children when the path ends with `/`.
#[utoipa::path(
    get,
    path = "/v1/tree/{*path}",
    tag = "tree",
    params(("path" = String, Path, description = "A tree path; a trailing / lists its children")),
    responses(
        (status = 200, description = "The entity `{type, data}` with its hash as ETag, or `{path, children: [{name, path, entity, has_children}]}`", body = Object),
        (status = 400, description = "`invalid_path`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_tree_access`", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`entity_not_found`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn get(State(app): State<AppState>, Caller(caller): Caller, Path(path): Path<String>) -> Result<Response, ApiError> {
    require(caller.may_subscribe(names::TREE_UPDATED), "read")?;
    require_system(&caller, &path)?;
    if let Some(dir) = path.strip_suffix('/') {
        return list(&app, dir).await;
    }
    validate_path(&path).map_err(invalid_path)?;
    let entry = app
        .store()
        .tree_get(&path)
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "entity_not_found", format!("nothing at {path:?}")))?;
    let mut response = ([(header::CONTENT_TYPE, "application/json")], entry.entity).into_response();
    response.headers_mut().insert(header::ETAG, etag(&entry.hash));
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
        (status = 403, description = "`forbidden_tree_access`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn root(State(app): State<AppState>, Caller(caller): Caller) -> Result<Response, ApiError> {
    require(caller.may_subscribe(names::TREE_UPDATED), "read")?;
    list(&app, "").await
}

async fn list(app: &AppState, dir: &str) -> Result<Response, ApiError> {
    if !dir.is_empty() {
        validate_path(dir).map_err(invalid_path)?;
    }
    let below = app.store().tree_below(dir, LIST_SCAN).await?;
    // name -> (is an entity, has children)
    let mut children: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let skip = if dir.is_empty() { 0 } else { dir.len() + 1 };
    for path in &below {
        let rest = &path[skip..];
        let (name, deeper) = match rest.split_once('/') {
            Some((name, _)) => (name, true),
            None => (rest, false),
        };
        let entry = children.entry(name.to_owned()).or_default();
        entry.0 |= !deeper;
        entry.1 |= deeper;
    }
    let list: Vec<Value> = children
        .into_iter()
        .map(|(name, (entity, has_children))| {
            let path = if dir.is_empty() { name.clone() } else { format!("{dir}/{name}") };
            json!({ "name": name, "path": path, "entity": entity, "has_children": has_children })
        })
        .collect();
    Ok(Json(json!({ "path": dir, "children": list, "truncated": below.len() == LIST_SCAN })).into_response())
}

fn answer(app: &AppState, path: &str, outcome: TreeOutcome, hash: Option<&str>) -> Result<Response, ApiError> {
    match outcome {
        TreeOutcome::Done { kind, previous_hash, event_id } => {
            app.broker().wake();
            metrics::counter!(crate::metrics::EVENTS_PUBLISHED, "type" => change_type(kind)).increment(1);
            let status = if kind == ChangeKind::Created { StatusCode::CREATED } else { StatusCode::OK };
            let body = json!({ "uri": path, "hash": hash, "previous_hash": previous_hash, "event_id": event_id });
            let mut response = (status, Json(body)).into_response();
            if let Some(h) = hash {
                response.headers_mut().insert(header::ETAG, etag(h));
            }
            Ok(response)
        }
        TreeOutcome::Mismatch { current } => Err(ApiError::new(
            StatusCode::CONFLICT,
            "hash_mismatch",
            format!("the entity at {path:?} is not the one the precondition names"),
        )
        .with_extra(json!({ "current_hash": current }))),
        TreeOutcome::Missing => Err(ApiError::new(StatusCode::NOT_FOUND, "entity_not_found", format!("nothing at {path:?}"))),
    }
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
    ),
    request_body(content = Object, content_type = "application/json", description = "`{type, data}`"),
    responses(
        (status = 200, description = "Replaced: `{uri, hash, previous_hash, event_id}`", body = Object),
        (status = 201, description = "Created: `{uri, hash, previous_hash: null, event_id}`", body = Object),
        (status = 400, description = "`invalid_path`, `invalid_entity`, `invalid_condition`, `malformed_body`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_tree_access`", body = crate::http::openapi::ErrorBody),
        (status = 409, description = "`hash_mismatch` with `current_hash`", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "`body_too_large`", body = crate::http::openapi::ErrorBody),
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
    validate_path(&path).map_err(invalid_path)?;
    require(caller.may_publish(names::TREE_CREATED) && caller.may_publish(names::TREE_UPDATED), "write")?;
    require_system(&caller, &path)?;
    let condition = condition(&headers)?;
    let bytes = super::events::read_body(&headers, body, app.settings().max_body).await?;
    let entity: Entity = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request("invalid_entity", format!("the body must be {{\"type\", \"data\"}}: {e}")))?;
    entity.check().map_err(|e| ApiError::bad_request("invalid_entity", e.0))?;
    let (canonical, hash) = entity.canonical();
    let write = TreeWrite {
        path: path.clone(),
        entity: Some((canonical, hash.clone())),
        condition,
        event: change_event(&path, agent(&caller), Some(hash.clone()), chain_id(&headers)?),
    };
    let outcome = app.store().tree_write(write).await?;
    answer(&app, &path, outcome, Some(&hash))
}

/// Deletes the entity at a path.
#[utoipa::path(
    delete,
    path = "/v1/tree/{*path}",
    tag = "tree",
    params(("path" = String, Path, description = "A tree path"), ("If-Match" = Option<String>, Header, description = "Delete only if the current hash is this")),
    responses(
        (status = 200, description = "Deleted: `{uri, hash: null, previous_hash, event_id}`", body = Object),
        (status = 400, description = "`invalid_path`, `invalid_condition`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_tree_access`", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`entity_not_found`", body = crate::http::openapi::ErrorBody),
        (status = 409, description = "`hash_mismatch` with `current_hash`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn delete(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    validate_path(&path).map_err(invalid_path)?;
    require(caller.may_publish(names::TREE_DELETED), "write")?;
    require_system(&caller, &path)?;
    let condition = condition(&headers)?;
    let write =
        TreeWrite { path: path.clone(), entity: None, condition, event: change_event(&path, agent(&caller), None, chain_id(&headers)?) };
    let outcome = app.store().tree_write(write).await?;
    answer(&app, &path, outcome, None)
}
