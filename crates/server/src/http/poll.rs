//! `GET|POST /v1/poll`, `POST /v1/consumers/{id}/ack`, `GET /v1/consumers`
//! and `DELETE /v1/consumers/{id}`: long-poll and the durable consumers
//! over HTTP. What a poll does is [`crate::service::poll`]; this file reads
//! the query or JSON form and writes the answer, spliced from the stored
//! envelopes (no re-serialisation).

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::caller::{Caller, Params};
use super::error::ApiError;
use super::{AppState, ClientGone};
use crate::filter::{Filter, FilterQuery};
use crate::service::error::{InvalidField, check_envelope, parse_cursor};
use crate::service::poll::{self as service, PollPage, PollRequest, check_consumer_id};
use tidings_protocol::event::EventId;

/// Query form of a poll.
#[derive(Debug, Deserialize)]
pub(crate) struct PollQuery {
    #[serde(flatten)]
    filter: FilterQuery,
    since: Option<String>,
    consumer_id: Option<String>,
    limit: Option<String>,
    wait_ms: Option<String>,
    accept_envelope: Option<String>,
}

impl super::caller::QueryNames for PollQuery {
    const ENDPOINT: &'static str = "GET /v1/poll";
    const NAMES: &'static [&'static str] =
        &["filter", "types", "agents", "targets", "since", "consumer_id", "limit", "wait_ms", "accept_envelope"];
}

/// JSON form of a poll (for filters too long for a URL).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PollBody {
    #[serde(default)]
    filter: Option<Value>,
    #[serde(default)]
    since: Option<Value>,
    #[serde(default)]
    consumer_id: Option<String>,
    #[serde(default)]
    limit: Option<Value>,
    #[serde(default)]
    wait_ms: Option<Value>,
    #[serde(default)]
    accept_envelope: Option<String>,
}

/// A non-negative integer up to `max` from a query string or a JSON number
/// (`5.0` is the integer 5, as JSON Schema counts it).
fn uint(value: Option<&Value>, text: Option<&str>, max: u64, code: &'static str, what: &str) -> Result<Option<u64>, InvalidField> {
    let bad = || InvalidField::new(code, format!("{what} must be an integer from 0 to {max}"));
    let n = match (value, text) {
        (Some(Value::Null), _) | (None, None) => return Ok(None),
        (Some(v), _) => crate::json::as_uint(v),
        (None, Some(t)) => t.trim().parse::<u64>().ok(),
    };
    n.filter(|n| *n <= max).map(Some).ok_or_else(bad)
}

/// Largest event id (a resume point or a cursor).
const MAX_ID: u64 = i64::MAX as u64;

/// `GET /v1/poll`.
#[utoipa::path(
    get,
    path = "/v1/poll",
    tag = "streams",
    params(
        super::openapi::FilterParams,
        ("since" = Option<i64>, Query, description = "Read after this id; with a consumer, confirms everything up to it"),
        ("consumer_id" = Option<String>, Query, description = "Durable consumer: stored filter and cursor"),
        ("limit" = Option<u32>, Query, description = "Most events (default 100, capped)"),
        ("wait_ms" = Option<u32>, Query, description = "Long-poll: wait up to this long for a match (capped)"),
    ),
    responses(
        (status = 400, description = "`invalid_filter`, `invalid_since`, `invalid_limit`, `invalid_wait_ms`, `invalid_consumer_id`, `invalid_accept_envelope`, `invalid_query` (a parameter the endpoint does not take, one given twice, or unreadable)", body = crate::http::openapi::ErrorBody),
        (status = 200, description = "`{\"events\": [<envelope>...], \"next_since\": N, \"has_more\": bool, \"gap\"?: {requested, available_from, head, reason, fork?}}`: `gap` when the resume point was pruned, beyond the head, past the replay limit, or in history the store lost (`reason` `history_lost`, with the `fork` delivery goes on after)", body = Object),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`not_consumer_owner` (another identity created the consumer)", body = crate::http::openapi::ErrorBody),
        (status = 406, description = "`envelope_version_unsupported`", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "`cursor_expired`: the consumer was collected; poll with `since` to start afresh", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "`too_many_consumers` (a new consumer past TIDINGS_MAX_CONSUMERS_PER_IDENTITY), `too_many_streams_for_identity` (a waiting poll)", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`store_unavailable`, `too_many_streams` (a waiting poll)", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn poll_get(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Params(q): Params<PollQuery>,
) -> Result<Response, ApiError> {
    check_envelope(q.accept_envelope.as_deref())?;
    // Validate the filter in whichever form it came; store its JSON form.
    Filter::from_query(&q.filter, app.core().filter_limits())?;
    let since = q.since.as_deref().map(|s| parse_cursor(s, "invalid_since", "since")).transpose()?.map(|s| s as u64);
    let request = PollRequest {
        filter_json: crate::filter::query_json(&q.filter, app.core().filter_limits())?,
        since,
        consumer_id: q.consumer_id,
        limit: uint(None, q.limit.as_deref(), u64::MAX, "invalid_limit", "limit")?,
        wait_ms: uint(None, q.wait_ms.as_deref(), u64::MAX, "invalid_wait_ms", "wait_ms")?,
        // A `GET` stops with its client: nothing to watch.
        gone: CancellationToken::new(),
        own_place: true,
    };
    Ok(answer(service::poll(app.core(), &caller, request).await?))
}

/// `POST /v1/poll`.
#[utoipa::path(
    post,
    path = "/v1/poll",
    tag = "streams",
    request_body(content = Object, content_type = "application/json", description = "`{filter?, since?, consumer_id?, limit?, wait_ms?, accept_envelope?}`"),
    responses(
        (status = 400, description = "`invalid_poll`, `invalid_filter`, `invalid_since`, `invalid_limit`, `invalid_wait_ms`, `invalid_consumer_id`, `malformed_body`", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "`body_too_large`", body = crate::http::openapi::ErrorBody),
        (status = 408, description = "`body_timeout`: the body did not arrive within `TIDINGS_BODY_TIMEOUT` (the connection closes)", body = crate::http::openapi::ErrorBody),
        (status = 200, description = "`{\"events\": [<envelope>...], \"next_since\": N, \"has_more\": bool, \"gap\"?: {requested, available_from, head, reason, fork?}}`: `gap` when the resume point was pruned, beyond the head, past the replay limit, or in history the store lost (`reason` `history_lost`, with the `fork` delivery goes on after)", body = Object),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`not_consumer_owner` (another identity created the consumer)", body = crate::http::openapi::ErrorBody),
        (status = 406, description = "`envelope_version_unsupported`", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "`cursor_expired`: the consumer was collected; poll with `since` to start afresh", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "`too_many_consumers` (a new consumer past TIDINGS_MAX_CONSUMERS_PER_IDENTITY), `too_many_streams_for_identity` (a waiting poll)", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`store_unavailable`, `too_many_streams` (a waiting poll)", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn poll_post(
    State(app): State<AppState>,
    Caller(caller): Caller,
    gone: Option<Extension<ClientGone>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = super::events::read_body(app.settings(), &headers, body).await?;
    let body: PollBody = crate::json::from_object_slice(&bytes)
        .map_err(|e| ApiError::bad_request("invalid_poll", format!("the poll body is not valid: {e}")))?;
    let request = request_of(&app, body, gone.map(|g| g.0.0).unwrap_or_default())?;
    Ok(answer(service::poll(app.core(), &caller, request).await?))
}

/// A poll in its JSON form (the body of `POST /v1/poll`, the arguments of
/// the MCP `poll` tool), checked.
/// `gone` is cancelled when the client goes away.
pub(crate) fn request_of(app: &AppState, body: PollBody, gone: CancellationToken) -> Result<PollRequest, ApiError> {
    check_envelope(body.accept_envelope.as_deref())?;
    let filter_json = body.filter.filter(|f| !f.is_null()).map(|f| f.to_string());
    if let Some(json) = &filter_json {
        Filter::from_json(json, app.core().filter_limits())?;
    }
    Ok(PollRequest {
        filter_json,
        since: uint(body.since.as_ref(), None, MAX_ID, "invalid_since", "since")?,
        consumer_id: body.consumer_id,
        limit: uint(body.limit.as_ref(), None, u64::MAX, "invalid_limit", "limit")?,
        wait_ms: uint(body.wait_ms.as_ref(), None, u64::MAX, "invalid_wait_ms", "wait_ms")?,
        gone,
        own_place: true,
    })
}

/// The answer, spliced from the stored envelopes: no re-serialisation.
fn answer(page: PollPage) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], page_json(page)).into_response()
}

/// A page as JSON: `{events, next_since, has_more, gap?}`.
pub(crate) fn page_json(page: PollPage) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + page.events.iter().map(|e| e.envelope.len() + 1).sum::<usize>());
    out.extend_from_slice(b"{\"events\":[");
    for (i, event) in page.events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&event.envelope);
    }
    out.extend_from_slice(format!("],\"next_since\":{},\"has_more\":{}", page.next_since, page.has_more).as_bytes());
    if let Some(gap) = page.gap {
        let gap = gap.to_json();
        out.extend_from_slice(format!(",\"gap\":{gap}").as_bytes());
    }
    out.push(b'}');
    out
}

/// `POST /v1/consumers/{id}/ack` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckBody {
    cursor: Value,
}

/// Confirms everything up to `cursor`.
#[utoipa::path(
    post,
    path = "/v1/consumers/{id}/ack",
    tag = "streams",
    params(("id" = String, Path, description = "Consumer id")),
    request_body(content = Object, content_type = "application/json", description = "`{\"cursor\": N}`: everything up to N is confirmed (monotonic, clamped to the head)"),
    responses(
        (status = 200, description = "`{\"consumer_id\", \"cursor\"}`", body = Object),
        (status = 400, description = "`invalid_cursor` (the body is not `{\"cursor\": N}` with an integer event id), `invalid_consumer_id` (not 1–128 characters of `[A-Za-z0-9._:-]`)", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`not_consumer_owner` (another identity created the consumer)", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`consumer_not_found` (no consumer by that id)", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "`cursor_expired`", body = crate::http::openapi::ErrorBody),
        (status = 408, description = "`body_timeout`: the body did not arrive within `TIDINGS_BODY_TIMEOUT` (the connection closes)", body = crate::http::openapi::ErrorBody),
        (status = 413, description = "`body_too_large`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn ack(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    check_consumer_id(&id)?;
    let bytes = super::events::read_body(app.settings(), &headers, body).await?;
    let body: AckBody = crate::json::from_object_slice(&bytes)
        .map_err(|e| ApiError::bad_request("invalid_cursor", format!("the body must be {{\"cursor\": N}}: {e}")))?;
    let cursor = service::ack(app.core(), &caller, &id, ack_cursor(&body.cursor)?).await?;
    Ok(Json(json!({ "consumer_id": id, "cursor": cursor })))
}

/// An ack's cursor: an integer event id.
pub(crate) fn ack_cursor(value: &Value) -> Result<EventId, InvalidField> {
    let cursor = uint(Some(value), None, MAX_ID, "invalid_cursor", "cursor")?
        .ok_or_else(|| InvalidField::new("invalid_cursor", "cursor must be an integer event id, not null"))?;
    EventId::try_from(cursor).map_err(|_| InvalidField::new("invalid_cursor", "cursor is too large"))
}

/// Lists the caller's durable consumers (every one for an admin) with their
/// lag behind the head.
#[utoipa::path(
    get,
    path = "/v1/consumers",
    tag = "streams",
    responses(
        (status = 200, description = "`{head_event_id, consumers: [{consumer_id, owner, filter, cursor, lag, last_activity, created}]}`", body = Object),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn list(State(app): State<AppState>, Caller(caller): Caller) -> Result<Json<Value>, ApiError> {
    let (head, consumers) = service::list(app.core(), &caller).await?;
    let ms = |ms: i64| chrono::DateTime::from_timestamp_millis(ms).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    let list: Vec<Value> = consumers
        .into_iter()
        .map(|c| {
            json!({
                "consumer_id": c.id,
                "owner": c.owner,
                "filter": c.filter_json.as_deref().and_then(|f| serde_json::from_str::<Value>(f).ok()),
                "cursor": c.cursor,
                "lag": (head - c.cursor).max(0),
                "last_activity": ms(c.last_activity_ms),
                "created": ms(c.created_ms),
            })
        })
        .collect();
    Ok(Json(json!({ "head_event_id": head, "consumers": list })))
}

/// Deletes a consumer.
#[utoipa::path(
    delete,
    path = "/v1/consumers/{id}",
    tag = "streams",
    params(
        ("id" = String, Path, description = "Consumer id (ids are scoped by owner)"),
        ("owner" = Option<String>, Query, description = "Whose consumer: an admin may name any owner; anyone else only their own"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "`invalid_consumer_id`, `invalid_query` (a parameter the endpoint does not take, one given twice)", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`not_consumer_owner` (another identity created the consumer)", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`consumer_not_found` (no consumer by that id)", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "`cursor_expired`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn delete(
    State(app): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    Params(query): Params<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    service::delete(app.core(), &caller, &id, query.owner.as_deref()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/consumers/{id}` query.
#[derive(Debug, Deserialize)]
pub(crate) struct DeleteQuery {
    /// Whose consumer (admins only; default: the caller's).
    owner: Option<String>,
}

impl super::caller::QueryNames for DeleteQuery {
    const ENDPOINT: &'static str = "DELETE /v1/consumers/{id}";
    const NAMES: &'static [&'static str] = &["owner"];
}
