//! `GET|POST /v1/poll` and the durable consumers behind it (SPEC-065 §2.6):
//! for agents that cannot hold a stream open (cron jobs, serverless
//! functions, scripts).
//!
//! A poll reads the log after its resume point with the same filter code as
//! SSE, returns up to `limit` envelopes with `next_since` (the id to pass
//! next) and `has_more`, and with `wait_ms` holds the request open until a
//! matching event exists. Waiting registers with the broker *before* the
//! scan (register, then read), so an event committed in between wakes it.
//!
//! A `consumer_id` makes the cursor durable: it is stored with the filter,
//! and only confirmations move it (`POST /v1/consumers/{id}/ack`, or the
//! next poll's `since`), as a monotonic max clamped to the head, so two
//! pollers sharing one id are safe and no future event is skipped.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use super::sse::{check_envelope, parse_cursor};
use crate::broker::SubscribeOptions;
use crate::event::{Event, EventId};
use crate::filter::{Filter, FilterQuery};
use crate::metrics as m;
use crate::store::{Acked, ConsumerOpen, Opened};

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

/// A validated poll.
struct PollRequest {
    /// The filter as JSON text (what a consumer stores), if one was given.
    filter_json: Option<String>,
    since: Option<EventId>,
    consumer_id: Option<String>,
    limit: usize,
    wait: Duration,
}

const MAX_CONSUMER_ID: usize = 128;

fn check_consumer_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty() && id.len() <= MAX_CONSUMER_ID && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "invalid_consumer_id",
            format!("consumer_id must be 1 to {MAX_CONSUMER_ID} characters of [A-Za-z0-9._:-]"),
        ))
    }
}

/// A non-negative integer from a query string or a JSON number.
fn uint(value: Option<&Value>, text: Option<&str>, code: &'static str, what: &str) -> Result<Option<u64>, ApiError> {
    let bad = || ApiError::bad_request(code, format!("{what} must be a non-negative integer"));
    match (value, text) {
        (Some(Value::Null), _) | (None, None) => Ok(None),
        (Some(v), _) => v.as_u64().map(Some).ok_or_else(bad),
        (None, Some(t)) => t.trim().parse::<u64>().map(Some).map_err(|_| bad()),
    }
}

impl PollRequest {
    fn build(
        app: &AppState,
        filter_json: Option<String>,
        since: Option<u64>,
        consumer_id: Option<String>,
        limit: Option<u64>,
        wait_ms: Option<u64>,
    ) -> Result<Self, ApiError> {
        if let Some(id) = &consumer_id {
            check_consumer_id(id)?;
        }
        let settings = app.settings();
        let limit = match limit {
            Some(0) => return Err(ApiError::bad_request("invalid_limit", "limit must be at least 1")),
            Some(n) => (n as usize).min(settings.poll_max_limit),
            None => 100.min(settings.poll_max_limit),
        };
        let wait = Duration::from_millis(wait_ms.unwrap_or(0)).min(settings.poll_max_wait);
        let since =
            since.map(|s| EventId::try_from(s).map_err(|_| ApiError::bad_request("invalid_since", "since is too large"))).transpose()?;
        Ok(Self { filter_json, since, consumer_id, limit, wait })
    }
}

fn filter_error(e: crate::filter::FilterError) -> ApiError {
    ApiError::bad_request("invalid_filter", e.0)
}

/// The query form's filter as the JSON a consumer stores.
fn query_filter_json(q: &FilterQuery) -> Option<String> {
    if let Some(json) = &q.filter {
        return Some(json.clone());
    }
    let mut map = serde_json::Map::new();
    for (name, list) in [("types", &q.types), ("agents", &q.agents), ("targets", &q.targets)] {
        if let Some(list) = list {
            map.insert(name.to_owned(), list.split(',').map(|p| Value::String(p.trim().to_owned())).collect());
        }
    }
    (!map.is_empty()).then(|| Value::Object(map).to_string())
}

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
        (status = 400, description = "`invalid_filter`, `invalid_since`, `invalid_limit`, `invalid_wait_ms`, `invalid_consumer_id`, `invalid_accept_envelope`", body = crate::http::openapi::ErrorBody),
        (status = 200, description = "`{\"events\": [<envelope>...], \"next_since\": N, \"has_more\": bool}`", body = Object),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`not_consumer_owner`", body = crate::http::openapi::ErrorBody),
        (status = 406, description = "`envelope_version_unsupported`", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "`cursor_expired`: the consumer was collected; poll with `since` to start afresh", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`store_unavailable`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn poll_get(State(app): State<AppState>, caller: Caller, Query(q): Query<PollQuery>) -> Result<Response, ApiError> {
    check_envelope(q.accept_envelope.as_deref())?;
    // Validate the filter in whichever form it came; store its JSON form.
    Filter::from_query(&q.filter, app.filter_limits()).map_err(filter_error)?;
    let since = q.since.as_deref().map(|s| parse_cursor(s, "invalid_since", "since")).transpose()?.map(|s| s as u64);
    let limit = uint(None, q.limit.as_deref(), "invalid_limit", "limit")?;
    let wait = uint(None, q.wait_ms.as_deref(), "invalid_wait_ms", "wait_ms")?;
    let request = PollRequest::build(&app, query_filter_json(&q.filter), since, q.consumer_id, limit, wait)?;
    poll(app, caller, request).await
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
        (status = 200, description = "`{\"events\": [<envelope>...], \"next_since\": N, \"has_more\": bool}`", body = Object),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`not_consumer_owner`", body = crate::http::openapi::ErrorBody),
        (status = 406, description = "`envelope_version_unsupported`", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "`cursor_expired`: the consumer was collected; poll with `since` to start afresh", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`store_unavailable`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn poll_post(State(app): State<AppState>, caller: Caller, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let bytes = super::events::read_body(&headers, body, app.settings().max_body).await?;
    let body: PollBody =
        serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request("invalid_poll", format!("the poll body is not valid: {e}")))?;
    check_envelope(body.accept_envelope.as_deref())?;
    let filter_json = body.filter.filter(|f| !f.is_null()).map(|f| f.to_string());
    let since = uint(body.since.as_ref(), None, "invalid_since", "since")?;
    let limit = uint(body.limit.as_ref(), None, "invalid_limit", "limit")?;
    let wait = uint(body.wait_ms.as_ref(), None, "invalid_wait_ms", "wait_ms")?;
    let request = PollRequest::build(&app, filter_json, since, body.consumer_id, limit, wait)?;
    poll(app, caller, request).await
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn expired() -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "cursor_expired",
        "this consumer was collected after a silence longer than the consumer TTL; poll again with an explicit since to start afresh",
    )
}

fn not_owner(id: &str) -> ApiError {
    ApiError::forbidden("not_consumer_owner", format!("consumer {id:?} belongs to another identity"))
}

async fn poll(app: AppState, caller: Caller, request: PollRequest) -> Result<Response, ApiError> {
    metrics::counter!(m::POLL_REQUESTS).increment(1);
    let limits = app.filter_limits();
    // Validate a given filter before anything is stored.
    if let Some(json) = &request.filter_json {
        Filter::from_json(json, limits).map_err(filter_error)?;
    }
    let (filter_json, after) = match &request.consumer_id {
        None => (
            request.filter_json.clone(),
            match request.since {
                Some(since) => since,
                None => app.store().head().await?,
            },
        ),
        Some(id) => {
            let opened = app
                .store()
                .consumer_open(ConsumerOpen {
                    id,
                    filter_json: request.filter_json.as_deref().map(Some),
                    since: request.since,
                    expire_before_ms: now_ms() - app.consumer_ttl_ms(),
                    now_ms: now_ms(),
                    actor: caller.actor(),
                })
                .await?;
            match opened {
                Opened::Expired => return Err(expired()),
                Opened::Forbidden => return Err(not_owner(id)),
                // `since` (already confirmed) wins; otherwise resume after the cursor.
                Opened::Ready(consumer) => (consumer.filter_json, request.since.unwrap_or(consumer.cursor)),
            }
        }
    };
    // Whatever was asked for, the caller receives only what its grants and
    // visibility allow.
    let filter = Arc::new(
        match &filter_json {
            Some(json) => Filter::from_json(json, limits).map_err(filter_error)?,
            None => Filter::any(),
        }
        .restrict_to(&caller.0),
    );

    // Register before the first read, so nothing committed in between is missed.
    let mut subscription = (!request.wait.is_zero())
        .then(|| app.broker().subscribe(filter.clone(), SubscribeOptions { kill: None, transport: "poll", catching_up: true }));
    let deadline = tokio::time::Instant::now() + request.wait;
    let shutdown = app.shutdown_token();
    let mut page = scan(&app, &filter, after, request.limit).await?;
    while page.events.is_empty() {
        let Some(sub) = subscription.as_mut() else { break };
        let woke = tokio::select! {
            frame = sub.recv() => frame.is_some(),
            _ = tokio::time::sleep_until(deadline) => break,
            _ = shutdown.cancelled() => break,
        };
        if !woke {
            // Detached (behind, or shutting down): register again.
            subscription =
                Some(app.broker().subscribe(filter.clone(), SubscribeOptions { kill: None, transport: "poll", catching_up: true }));
        }
        page = scan(&app, &filter, page.next_since, request.limit).await?;
    }
    drop(subscription);
    metrics::counter!(m::EVENTS_DELIVERED, "transport" => "poll").increment(page.events.len() as u64);

    // The answer is spliced from the stored envelopes: no re-serialisation.
    let mut out = Vec::with_capacity(64 + page.events.iter().map(|e| e.envelope.len() + 1).sum::<usize>());
    out.extend_from_slice(b"{\"events\":[");
    for (i, event) in page.events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&event.envelope);
    }
    out.extend_from_slice(format!("],\"next_since\":{},\"has_more\":{}}}", page.next_since, page.has_more).as_bytes());
    Ok(([(header::CONTENT_TYPE, "application/json")], out).into_response())
}

struct Page {
    events: Vec<Event>,
    next_since: EventId,
    has_more: bool,
}

/// Reads matching events after `after`: up to `limit`, then looks on for one
/// more match to answer `has_more`. One request scans at most
/// `TIDINGS_POLL_MAX_SCAN` rows; stopping there answers `has_more: true`
/// with the scan position, so a sparse filter never makes one request
/// unbounded.
async fn scan(app: &AppState, filter: &Filter, after: EventId, limit: usize) -> Result<Page, ApiError> {
    let store = app.store();
    let batch = app.settings().read_batch as usize;
    let max_scan = app.settings().poll_max_scan;
    let (mut position, mut events, mut scanned) = (after, Vec::new(), 0usize);
    loop {
        let rows = store.read_after(position, batch).await?;
        if rows.is_empty() {
            break;
        }
        for row in rows {
            let event = match Event::from_stored(row.id, &row.body, row.recorded_ms) {
                Ok(event) => event,
                Err(e) => {
                    tracing::error!(id = row.id, error = %e, "skipping an unreadable event row");
                    position = row.id;
                    continue;
                }
            };
            if filter.matches(&event.body) {
                if events.len() == limit {
                    return Ok(Page { next_since: events.last().map_or(position, |e: &Event| e.id), events, has_more: true });
                }
                events.push(event);
            }
            position = row.id;
            scanned += 1;
        }
        if scanned >= max_scan {
            let next_since = events.last().map_or(position, |e| e.id);
            return Ok(Page { events, next_since, has_more: true });
        }
    }
    Ok(Page { next_since: events.last().map_or(position, |e| e.id), events, has_more: false })
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
        (status = 400, description = "`invalid_cursor`, `invalid_consumer_id`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`not_consumer_owner`", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`consumer_not_found`", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "`cursor_expired`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn ack(
    State(app): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    check_consumer_id(&id)?;
    let bytes = super::events::read_body(&headers, body, app.settings().max_body).await?;
    let body: AckBody = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request("invalid_cursor", format!("the body must be {{\"cursor\": N}}: {e}")))?;
    let cursor = uint(Some(&body.cursor), None, "invalid_cursor", "cursor")?.unwrap_or(0);
    let cursor = EventId::try_from(cursor).map_err(|_| ApiError::bad_request("invalid_cursor", "cursor is too large"))?;
    match app.store().consumer_ack(&id, cursor, now_ms(), now_ms() - app.consumer_ttl_ms(), caller.actor()).await? {
        Acked::Cursor(cursor) => Ok(Json(json!({ "consumer_id": id, "cursor": cursor }))),
        other => Err(refusal(&id, other)),
    }
}

fn refusal(id: &str, outcome: Acked) -> ApiError {
    match outcome {
        Acked::Expired => expired(),
        Acked::Forbidden => not_owner(id),
        Acked::NotFound | Acked::Cursor(_) => ApiError::new(StatusCode::NOT_FOUND, "consumer_not_found", format!("no consumer {id:?}")),
    }
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
pub(crate) async fn list(State(app): State<AppState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    let head = app.store().head().await?;
    let consumers = app.store().consumer_list(caller.actor()).await?;
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
    params(("id" = String, Path, description = "Consumer id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "`invalid_consumer_id`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 403, description = "`not_consumer_owner`", body = crate::http::openapi::ErrorBody),
        (status = 404, description = "`consumer_not_found`", body = crate::http::openapi::ErrorBody),
        (status = 410, description = "`cursor_expired`", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn delete(State(app): State<AppState>, caller: Caller, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    check_consumer_id(&id)?;
    match app.store().consumer_delete(&id, caller.actor()).await? {
        Acked::Cursor(_) => Ok(StatusCode::NO_CONTENT),
        other => Err(refusal(&id, other)),
    }
}
