//! `GET /v1/stream`: Server-Sent Events with `Last-Event-ID` resume.
//!
//! A stream registers with the broker first, then replays history from the
//! store up to the position the broker reported at registration, then takes
//! live frames from its queue: nothing missed, nothing repeated at the seam.
//! Frames queued for one client are coalesced into one write. The body is a
//! plain `Stream` of pre-encoded bytes (the broker built each frame once), so
//! axum's `Sse` type, which serialises per event, is not used.
//!
//! Axum does not end an endless body on shutdown: each stream watches the
//! server's shutdown token and ends itself with a jittered `retry:`.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::AppState;
use super::caller::Caller;
use super::error::ApiError;
use super::limits::StreamPermit;
use crate::broker::{Broker, Detached, SubscribeOptions, Subscription};
use crate::event::{Event, EventId, names, negotiate_envelope, sse_frame};
use crate::filter::{Filter, FilterQuery};
use crate::metrics as m;
use crate::server::Connection;
use crate::store::EventLog;

/// Largest coalesced write, in bytes.
const COALESCE_BYTES: usize = 64 * 1024;

/// Query parameters of `/v1/stream`.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamQuery {
    #[serde(flatten)]
    filter: FilterQuery,
    since: Option<String>,
    accept_envelope: Option<String>,
}

/// Parses a resume point: a non-negative integer.
pub(crate) fn parse_cursor(value: &str, code: &'static str, what: &str) -> Result<EventId, ApiError> {
    value
        .trim()
        .parse::<EventId>()
        .ok()
        .filter(|v| *v >= 0)
        .ok_or_else(|| ApiError::bad_request(code, format!("{what} must be a non-negative integer event id")))
}

/// Checks `accept_envelope`: `406 envelope_version_unsupported` when the
/// client knows none of the versions this server writes.
pub(crate) fn check_envelope(accept: Option<&str>) -> Result<(), ApiError> {
    match negotiate_envelope(accept) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "envelope_version_unsupported",
            format!(
                "none of the requested envelope versions is supported; this server writes {:?}",
                crate::event::SUPPORTED_ENVELOPE_VERSIONS
            ),
        )
        .with_extra(json!({ "supported": crate::event::SUPPORTED_ENVELOPE_VERSIONS }))),
        Err(message) => Err(ApiError::bad_request("invalid_accept_envelope", message)),
    }
}

/// Opens a stream.
#[utoipa::path(
    get,
    path = "/v1/stream",
    tag = "streams",
    params(
        super::openapi::FilterParams,
        ("since" = Option<i64>, Query, description = "Resume after this id (Last-Event-ID wins)"),
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this id"),
    ),
    responses(
        (status = 200, description = "An event stream: `retry:`, then `id:` + `data: <envelope>` per event; named notices `system.client_dropped_slow`, `system.replay_gap`; comment heartbeats", content_type = "text/event-stream", body = String),
        (status = 400, description = "`invalid_filter`, `invalid_since`, `invalid_last_event_id`, `invalid_accept_envelope`", body = crate::http::openapi::ErrorBody),
        (status = 401, description = "`unauthorized`", body = crate::http::openapi::ErrorBody),
        (status = 406, description = "`envelope_version_unsupported` (lists `supported`)", body = crate::http::openapi::ErrorBody),
        (status = 429, description = "`too_many_streams_for_identity`", body = crate::http::openapi::ErrorBody),
        (status = 503, description = "`too_many_streams`, `store_unavailable` (with Retry-After)", body = crate::http::openapi::ErrorBody),
    ),
    security((), ("bearer" = []), ("access_token_query" = []), ("access_token_cookie" = []))
)]
pub(crate) async fn stream(
    State(app): State<AppState>,
    Caller(caller): Caller,
    connection: Option<Extension<Connection>>,
    headers: HeaderMap,
    Query(query): Query<StreamQuery>,
) -> Result<Response, ApiError> {
    check_envelope(query.accept_envelope.as_deref())?;
    // What was asked for, intersected with what the caller may receive.
    let filter = Filter::from_query(&query.filter, app.filter_limits()).map_err(|e| ApiError::bad_request("invalid_filter", e.0))?;
    let filter = Arc::new(filter.restrict_to(&caller));
    let resume = match headers.get("last-event-id") {
        Some(v) => Some(parse_cursor(v.to_str().unwrap_or("x"), "invalid_last_event_id", "Last-Event-ID")?),
        None => query.since.as_deref().map(|s| parse_cursor(s, "invalid_since", "since")).transpose()?,
    };

    let permit = app.limits().acquire_stream(&caller)?;
    let broker = app.broker().clone();
    let kill = connection.map(|c| c.0.kill_token());
    let subscription =
        broker.subscribe(filter.clone(), SubscribeOptions { kill: kill.clone(), transport: "sse", catching_up: resume.is_some() });
    let position = subscription.position();

    // A resume point the log cannot serve without a gap is announced, never
    // silently papered over.
    let mut gap = None;
    let cursor = match resume {
        None => position,
        Some(requested) => {
            let store = app.store();
            let head = store.head().await?;
            // The oldest point one resume may replay from: retained history,
            // and at most TIDINGS_MAX_REPLAY events back (mercure's
            // maxHistoryScan: a reconnect cannot force an unbounded scan).
            let cap = head.saturating_sub(i64::try_from(app.settings().max_replay).unwrap_or(i64::MAX));
            let floor = store.floor().await?.max(cap);
            if requested > head || requested < floor {
                metrics::counter!(m::REPLAY_GAPS).increment(1);
                let data = json!({ "requested": requested, "available_from": floor + 1, "head": head }).to_string();
                gap = Some(sse_frame(None, Some(names::SYSTEM_REPLAY_GAP), data.as_bytes()));
                if requested > head { head.max(position) } else { floor }
            } else {
                requested
            }
        }
    };

    let settings = app.settings();
    let state = SseState {
        subscription,
        broker,
        kill,
        filter,
        cursor,
        last_sent: resume,
        target: position,
        phase: Phase::Start,
        gap,
        heartbeat: settings.heartbeat,
        retry: settings.sse_retry,
        read_batch: settings.read_batch as usize,
        client_queue: settings.client_queue,
        shutdown: app.shutdown_token(),
        _permit: permit,
    };
    let body = futures_util::stream::unfold(state, |mut s| async move {
        s.next_chunk().await.map(|chunk| (Ok::<_, std::convert::Infallible>(chunk), s))
    });
    let mut response = Response::new(Body::from_stream(body));
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Replay,
    Live,
    Done,
}

struct SseState {
    subscription: Subscription,
    broker: Broker,
    kill: Option<CancellationToken>,
    filter: Arc<Filter>,
    /// Every event up to here was sent or filtered out.
    cursor: EventId,
    /// The last id written (what the client's Last-Event-ID is).
    last_sent: Option<EventId>,
    /// Replay runs up to here; live frames cover everything above.
    target: EventId,
    phase: Phase,
    gap: Option<Bytes>,
    heartbeat: Duration,
    retry: Duration,
    read_batch: usize,
    client_queue: u32,
    shutdown: CancellationToken,
    /// This stream's place in the stream limits, given back on drop.
    _permit: StreamPermit,
}

impl SseState {
    fn store(&self) -> &Arc<dyn EventLog> {
        self.broker.store()
    }

    /// The next chunk to write, or `None` to end the stream.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            match self.phase {
                Phase::Start => {
                    self.phase = Phase::Replay;
                    let mut out = BytesMut::from(format!("retry: {}\n\n", self.retry.as_millis()).as_bytes());
                    if let Some(gap) = self.gap.take() {
                        out.extend_from_slice(&gap);
                    }
                    return Some(out.freeze());
                }
                Phase::Replay => {
                    if self.cursor >= self.target {
                        self.subscription.set_live();
                        self.phase = Phase::Live;
                        continue;
                    }
                    let limit = self.read_batch.min((self.target - self.cursor) as usize);
                    let page = tokio::select! {
                        _ = self.shutdown.cancelled() => return self.goodbye(),
                        page = self.store().read_after(self.cursor, limit) => page,
                    };
                    let rows = match page {
                        Ok(rows) => rows,
                        Err(e) => {
                            // The client reconnects with its Last-Event-ID once
                            // the store is back.
                            tracing::warn!(error = %e, "replay failed; ending the stream");
                            self.phase = Phase::Done;
                            return None;
                        }
                    };
                    if rows.is_empty() {
                        // Everything up to `target` is committed, so this only
                        // happens if history was pruned meanwhile.
                        self.cursor = self.target;
                        continue;
                    }
                    let mut out = BytesMut::new();
                    if rows[0].id > self.cursor + 1 {
                        // Retention pruned history while this client was
                        // replaying: say so instead of skipping silently.
                        metrics::counter!(m::REPLAY_GAPS).increment(1);
                        let data = json!({ "requested": self.cursor, "available_from": rows[0].id, "head": self.target }).to_string();
                        out.extend_from_slice(&sse_frame(None, Some(names::SYSTEM_REPLAY_GAP), data.as_bytes()));
                    }
                    let mut sent = 0u64;
                    let target = self.target;
                    for row in rows.into_iter().take_while(|r| r.id <= target) {
                        self.cursor = row.id;
                        match Event::from_stored(row.id, &row.body, row.recorded_ms) {
                            Ok(event) if self.filter.matches(&event.body) => {
                                out.extend_from_slice(&event.sse_frame());
                                self.last_sent = Some(event.id);
                                sent += 1;
                            }
                            Ok(_) => {}
                            Err(e) => tracing::error!(id = row.id, error = %e, "skipping an unreadable event row"),
                        }
                    }
                    self.subscription.progress();
                    if sent > 0 {
                        metrics::counter!(m::REPLAYED_EVENTS).increment(sent);
                        metrics::counter!(m::EVENTS_DELIVERED, "transport" => "sse").increment(sent);
                    }
                    if !out.is_empty() {
                        return Some(out.freeze());
                    }
                }
                Phase::Live => {
                    let frame = tokio::select! {
                        biased;
                        _ = self.shutdown.cancelled() => return self.goodbye(),
                        frame = self.subscription.recv() => frame,
                        _ = tokio::time::sleep(self.heartbeat) => return Some(Bytes::from_static(b":\n\n")),
                    };
                    let Some(first) = frame else {
                        match self.subscription.detached() {
                            Detached::Lagged => {
                                // Behind while replaying: register again and
                                // catch up from the store.
                                self.resubscribe();
                                continue;
                            }
                            Detached::QueueFull | Detached::NoProgress => {
                                self.phase = Phase::Done;
                                let reason = self.subscription.detached().label();
                                let data =
                                    json!({ "reason": reason, "last_event_id": self.last_sent, "queue": self.client_queue }).to_string();
                                return Some(sse_frame(None, Some(names::SYSTEM_CLIENT_DROPPED_SLOW), data.as_bytes()));
                            }
                            Detached::Closed => return self.goodbye(),
                        }
                    };
                    let mut out = BytesMut::new();
                    let mut sent = 0u64;
                    let latency_from = first.recorded_ms;
                    let mut next = Some(first);
                    while let Some(frame) = next {
                        if frame.id > self.cursor {
                            self.cursor = frame.id;
                            self.last_sent = Some(frame.id);
                            out.extend_from_slice(&frame.bytes);
                            sent += 1;
                        }
                        next = if out.len() < COALESCE_BYTES { self.subscription.try_recv() } else { None };
                    }
                    if sent > 0 {
                        metrics::counter!(m::EVENTS_DELIVERED, "transport" => "sse").increment(sent);
                        // Sampled once per write: a histogram sample per frame
                        // would cost more than the frame.
                        let latency = (chrono::Utc::now().timestamp_millis() - latency_from).max(0) as f64 / 1000.0;
                        metrics::histogram!(m::DELIVERY_LATENCY).record(latency);
                        return Some(out.freeze());
                    }
                }
                Phase::Done => return None,
            }
        }
    }

    fn resubscribe(&mut self) {
        let options = SubscribeOptions { kill: self.kill.clone(), transport: "sse", catching_up: true };
        // Register before dropping the old registration's state; the old
        // queue is drained already.
        let fresh = self.broker.subscribe(self.filter.clone(), options);
        self.target = fresh.position();
        self.subscription = fresh;
        self.phase = Phase::Replay;
    }

    /// The last chunk on shutdown: when to come back, jittered over a few
    /// multiples of the normal retry so clients do not return in one storm.
    fn goodbye(&mut self) -> Option<Bytes> {
        if self.phase == Phase::Done {
            return None;
        }
        self.phase = Phase::Done;
        let base = self.retry.as_millis() as u64;
        let jittered = base + rand::random_range(0..=base.saturating_mul(4).max(1));
        Some(Bytes::from(format!("retry: {jittered}\n\n")))
    }
}
