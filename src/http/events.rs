//! `POST /v1/events`: one event or `{"events":[...]}`, validated in full
//! before anything is stored, appended in one all-or-nothing batch.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use crate::event::{EventError, PublishRequest};
use crate::metrics as m;
use crate::registry::{Problem, RegistryMode};
use crate::store::NewRecord;

/// Reads a request body up to `limit` bytes; over it is `413 body_too_large`.
pub(crate) async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<bytes::Bytes, ApiError> {
    let too_large = || ApiError::too_large("body_too_large", format!("request body is over the limit of {limit} bytes"));
    if let Some(len) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large());
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(s) = source {
            if s.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            source = s.source();
        }
        ApiError::bad_request("malformed_body", "the request body could not be read")
    })
}

/// Publishes one event or a batch.
#[utoipa::path(
    post,
    path = "/v1/events",
    tag = "events",
    request_body(
        content = Object,
        content_type = "application/json",
        description = "One event `{event_type, ref?, agent?: {id, kind?}, session_id?, occurred_at?, payload?, links?: [{rel, ref}], visibility?}` or a batch `{\"events\": [...]}` (all or nothing)"
    ),
    responses(
        (status = 201, description = "Stored: `{\"event_ids\": [...]}`", body = Object),
        (status = 400, description = "`malformed_json`, `invalid_event`, `malformed_body`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_event_type`, `agent_spoofing`, `reserved_event_type`", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "`body_too_large`, `payload_too_large`, `batch_too_large`", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "`invalid_event_name`; in strict mode `unregistered_event_type`, `payload_schema_violation`", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "`rate_limited` (with Retry-After)", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`store_unavailable` (with Retry-After)", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn publish(
    State(app): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let bytes = read_body(&headers, body, app.settings().max_body).await?;
    let value: Value =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request("malformed_json", format!("the body is not valid JSON: {e}")))?;
    let (items, batch) = match value {
        Value::Object(mut map) if map.contains_key("events") && !map.contains_key("event_type") => {
            if map.len() != 1 {
                return Err(ApiError::bad_request("invalid_event", "a batch is {\"events\": [...]} with no other fields"));
            }
            match map.remove("events") {
                Some(Value::Array(items)) => (items, true),
                _ => return Err(ApiError::bad_request("invalid_event", "events must be a list of events")),
            }
        }
        single @ Value::Object(_) => (vec![single], false),
        _ => return Err(ApiError::bad_request("invalid_event", "the body must be an event object or {\"events\": [...]}")),
    };
    if items.is_empty() {
        return Err(ApiError::bad_request("invalid_event", "events must not be empty"));
    }
    let max_batch = app.settings().max_batch;
    if items.len() > max_batch {
        return Err(ApiError::too_large("batch_too_large", format!("a batch holds at most {max_batch} events, got {}", items.len())));
    }

    app.limits().take_publish(&caller, items.len())?;
    let registry = app.registry();
    let now = chrono::Utc::now();
    let mut records = Vec::with_capacity(items.len());
    // Index in `records` of each published event (aliases follow it).
    let mut primary = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = |msg: String| if batch { format!("events[{i}]: {msg}") } else { msg };
        let request: PublishRequest =
            serde_json::from_value(item).map_err(|e| ApiError::bad_request("invalid_event", at(e.to_string())))?;
        let mut request = request;
        // A publisher is its agent: it cannot claim another agent's id
        // (agent filters mean nothing if agents can be forged), and events
        // without an agent are attributed to it.
        match &request.agent {
            Some(agent) if agent.id != caller.sub && !caller.admin => {
                return Err(ApiError::forbidden(
                    "agent_spoofing",
                    at(format!("agent.id {:?} is not the caller's identity; only admins may publish for another agent", agent.id)),
                ));
            }
            None if caller.authenticated => request.agent = Some(crate::event::Agent { id: caller.sub.clone(), kind: None }),
            _ => {}
        }
        let body = request.into_body(app.settings().max_payload, now).map_err(|e| match e {
            EventError::InvalidName(_) => ApiError::unprocessable("invalid_event_name", at(e.to_string())),
            EventError::InvalidField(_) => ApiError::bad_request("invalid_event", at(e.to_string())),
            EventError::PayloadTooLarge { .. } => ApiError::too_large("payload_too_large", at(e.to_string())),
        })?;
        if crate::event::names::RESERVED.contains(&body.event_type.as_str()) {
            return Err(ApiError::forbidden(
                "reserved_event_type",
                at(format!("{:?} is written by tidings itself (tree writes, subscriptions, stream notices)", body.event_type)),
            ));
        }
        if !caller.may_publish(&body.event_type) {
            return Err(ApiError::forbidden("forbidden_event_type", at(format!("the caller may not publish {:?}", body.event_type))));
        }
        let check = registry.check(&body.event_type, &body.payload);
        if let Some(problem) = &check.problem {
            let (code, kind, message) = match problem {
                Problem::Unregistered => {
                    ("unregistered_event_type", "unregistered_type", format!("event type {:?} is not in the registry", body.event_type))
                }
                Problem::SchemaViolation(detail) => (
                    "payload_schema_violation",
                    "schema_violation",
                    format!("payload does not match the schema of {:?}: {detail}", body.event_type),
                ),
            };
            if registry.mode() == RegistryMode::Strict {
                return Err(ApiError::unprocessable(code, at(message)));
            }
            tracing::warn!(event_type = %body.event_type, problem = code, "accepting an event the registry does not vouch for (warn mode)");
            metrics::counter!(m::REGISTRY_VIOLATIONS, "kind" => kind).increment(1);
        }
        primary.push(records.len());
        for name in check.fire {
            let mut copy = body.clone();
            copy.event_type = name;
            records.push(NewRecord { event_type: copy.event_type.clone(), body: copy.to_json() });
        }
    }

    let labels: Vec<String> =
        records.iter().map(|r| if registry.contains(&r.event_type) { r.event_type.clone() } else { "unregistered".to_owned() }).collect();
    let ids = app.store().append(records).await?;
    for label in labels {
        metrics::counter!(m::EVENTS_PUBLISHED, "type" => label).increment(1);
    }
    // Wake the local broker at once instead of waiting for the NOTIFY round trip.
    app.broker().wake();
    let event_ids: Vec<i64> = primary.into_iter().map(|i| ids[i]).collect();
    Ok((StatusCode::CREATED, Json(json!({ "event_ids": event_ids }))))
}
