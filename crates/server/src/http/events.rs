//! `POST /v1/events`: one event or `{"events":[...]}`; what a publish
//! decides is [`crate::service::publish`]. Also the body reader every
//! handler with a request body shares.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use crate::config::Settings;
use crate::service::publish::PublishError;

/// Reads a request body up to `TIDINGS_MAX_BODY` bytes (over it is `413
/// body_too_large`), all of it within `TIDINGS_BODY_TIMEOUT` (else `408
/// body_timeout`, and the connection closes): a client that announces more
/// than it sends, or trickles, holds a task only that long.
pub(crate) async fn read_body(settings: &Settings, headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, ApiError> {
    let limit = settings.http.max_body;
    let too_large = || ApiError::too_large("body_too_large", format!("request body is over the limit of {limit} bytes"));
    if let Some(len) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
        && len > limit as u64
    {
        return Err(too_large());
    }
    let read = tokio::time::timeout(settings.http.body_timeout, axum::body::to_bytes(body, limit)).await.map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!("the request body did not arrive within {}", humantime::format_duration(settings.http.body_timeout)),
        )
        .closing()
    })?;
    read.map_err(|e| {
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
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "1–255 visible ASCII characters, new for each new publish and the same on its retries: within `TIDINGS_IDEMPOTENCY_WINDOW` (24 h) a retry with the same body stores nothing and is answered the original ids (with `Idempotent-Replayed: true`). Scoped by the publisher's identity."),
        ("traceparent" = Option<String>, Header, description = "The W3C trace context the publish belongs to (version 00): stored with every event of the request and delivered in its envelope, so that a subscriber continues the trace."),
        ("tracestate" = Option<String>, Header, description = "The W3C `tracestate` that goes with `traceparent` (ignored without one): stored and delivered with it.")
    ),
    responses(
        (status = 201, description = "Stored: `{\"event_ids\": [...]}`; with `Idempotent-Replayed: true`, stored before under this Idempotency-Key. To an admin (and with authentication off), `Server-Timing` names where the publish's time went, in milliseconds: `read`, `admit`, `queue`, `commit`, `wake` (docs/events.md)", body = Object),
        (status = 400, description = "`malformed_json` (the body is not JSON), `invalid_event` (a field is missing, of the wrong type, unknown, or too long), `malformed_body` (not a JSON object), `invalid_idempotency_key` (not 1–255 visible ASCII characters), `invalid_traceparent` (not a W3C `traceparent` of version 00 with ids that are not all zeros, or sent twice), `invalid_tracestate` (not 1 to 32 `key=value` members of the W3C grammar in at most 512 bytes, or sent twice)", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`forbidden_event_type` (outside the token's `publish` grants), `agent_spoofing` (an `agent.id` that is not the token's subject), `reserved_event_type` (a type only tidings writes: `tree.*`, `subscription.notification`, stream notices)", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "`body_too_large` (over `TIDINGS_MAX_BODY`), `payload_too_large` (a payload over `TIDINGS_MAX_PAYLOAD`), `batch_too_large` (more events than `TIDINGS_MAX_BATCH`)", body = crate::http::openapi::ErrorBody),
        (status = 408, description = "`body_timeout`: the body did not arrive within `TIDINGS_BODY_TIMEOUT` (the connection closes)", body = crate::http::openapi::ErrorBody),
        (status = 422, description = "`invalid_event_name` (the name breaks the grammar), `idempotency_key_reused` (the key was used with another body); in strict mode `unregistered_event_type` (the name is not in the registry), `payload_schema_violation` (the payload breaks the type's schema)", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "`rate_limited` (with Retry-After)", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`store_unavailable`, `replication_unavailable` (TIDINGS_DELIVERY=replicated: the synchronous standby does not confirm) (with Retry-After)", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn publish(
    State(app): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, HeaderMap, Json<Value>), ApiError> {
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(value) => Some(value.to_str().map_err(|_| ApiError::from(PublishError::InvalidIdempotencyKey))?),
    };
    let trace = trace_context(&headers)?;
    let entered = std::time::Instant::now();
    let bytes = read_body(app.settings(), &headers, body).await?;
    let read = entered.elapsed();
    let accepted = crate::service::publish::publish(app.core(), &caller, &bytes, key, trace.as_ref()).await?;
    let mut answer = HeaderMap::new();
    if accepted.replayed {
        answer.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    // Admins only: `queue` and `commit` are the commit group's, shared
    // with everyone else's publishes in it, so they tell of others' traffic.
    if caller.admin {
        answer.insert("server-timing", server_timing(read, &accepted.timing));
    }
    Ok((StatusCode::CREATED, answer, Json(json!({ "event_ids": accepted.event_ids }))))
}

/// A publish's parts as a `Server-Timing` header, in milliseconds: `read`
/// (its body), then the service's ([`crate::service::publish::Timing`]).
fn server_timing(read: std::time::Duration, timing: &crate::service::publish::Timing) -> HeaderValue {
    use std::fmt::Write as _;
    let parts = [("read", read), ("admit", timing.admit), ("queue", timing.queue), ("commit", timing.commit), ("wake", timing.wake)];
    // One buffer, written in place, in whole microseconds (integers: no
    // float formatting): this is on every admin's publish.
    let mut value = String::with_capacity(96);
    for (i, (name, d)) in parts.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let us = d.as_micros();
        let _ = write!(value, "{sep}{name};dur={}.{:03}", us / 1000, us % 1000);
    }
    HeaderValue::try_from(value).expect("names and numbers are a valid header value")
}

/// The W3C trace context of a request (`traceparent`, `tracestate`): at
/// most one of each header, checked ([`tidings_protocol::trace`]). An empty header
/// counts as none, as the W3C recommendation has it for `tracestate`.
pub(crate) fn trace_context(headers: &HeaderMap) -> Result<Option<tidings_protocol::trace::TraceContext>, PublishError> {
    use tidings_protocol::trace::{TraceContext, TraceError};
    let one = |name: &str, bad: TraceError| -> Result<Option<&str>, PublishError> {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (None, _) => Ok(None),
            (Some(v), None) => v.to_str().map(|v| Some(v).filter(|v| !v.is_empty())).map_err(|_| bad.into()),
            (Some(_), Some(_)) => Err(bad.into()),
        }
    };
    let traceparent = one("traceparent", TraceError::Traceparent)?;
    let tracestate = one("tracestate", TraceError::Tracestate)?;
    Ok(TraceContext::parse(traceparent, tracestate)?)
}

/// One event and, for it, every durable consumer and device cursor that
/// has acknowledged past it or not (docs/polling.md, "Which consumers have
/// an event").
#[utoipa::path(
    get,
    path = "/v1/events/{event_id}",
    tag = "events",
    params(("event_id" = String, Path, description = "The event's id")),
    responses(
        (status = 200, description = "`{event, consumers: [{consumer_id, owner, cursor, state: acknowledged|pending|not_matched}], devices: [{owner, device_id, cursor, updated_ms, acknowledged}], devices_truncated}`: consumers the caller may see (an admin: all), device cursors for admins only", body = Object),
        (status = 400, description = "`invalid_event_id` (not 1 to 16 digits without a leading zero)", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`event_not_found` (no such event, pruned, lost, or not the caller's to see)", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`store_unavailable` (with Retry-After)", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn event(
    State(app): State<AppState>,
    Caller(caller): Caller,
    axum::extract::Path(event_id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    let audit = crate::service::audit::audit(app.core(), &caller, &event_id).await?;
    let event: Value = serde_json::from_slice(&audit.envelope).unwrap_or(Value::Null);
    Ok(Json(json!({
        "event": event,
        "consumers": audit.consumers,
        "devices": audit.devices,
        "devices_truncated": audit.devices_truncated,
    })))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Each part in milliseconds with three decimals (whole microseconds),
    /// in the order docs/events.md gives.
    #[test]
    fn server_timing_names_each_part_in_milliseconds() {
        let timing = crate::service::publish::Timing {
            admit: Duration::from_nanos(48_999),
            queue: Duration::ZERO,
            commit: Duration::from_micros(1_234_567),
            wake: Duration::from_micros(17),
        };
        let value = server_timing(Duration::from_micros(21), &timing);
        assert_eq!(value.to_str().unwrap(), "read;dur=0.021, admit;dur=0.048, queue;dur=0.000, commit;dur=1234.567, wake;dur=0.017");
    }
}
