//! `GET /v1/stream`: Server-Sent Events with `Last-Event-ID` resume.
//!
//! The stream is a [`Session`] written as SSE: this file only turns session
//! items into bytes (`retry:` first, then `id:` + `data: <envelope>` per
//! event, the named notices `system.replay_gap` and
//! `system.client_dropped_slow`, comment heartbeats). Events delivered
//! together are coalesced into one write. The body is a plain `Stream` of
//! bytes built around the broker's shared envelopes, so axum's `Sse` type,
//! which serialises per event, is not used.
//!
//! Axum does not end an endless body on shutdown: the session ends at the
//! server's shutdown (the broker closes every live client's queue; a replay
//! stops on the shutdown token) and the stream closes with a jittered
//! `retry:`.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use bytes::{BufMut as _, Bytes, BytesMut};
use serde::Deserialize;

use super::AppState;
use super::caller::{Caller, Params};
use super::compress::{self, Gzip};
use super::error::ApiError;
use crate::broker::{Frame, FrameData, Wrote};
use crate::config::Compression;
use crate::filter::{Filter, FilterQuery};
use crate::server::{Connection, Link};
use crate::service::error::{check_envelope, parse_cursor};
use crate::service::session::{Dropped, End, Gap, Item, Session, Start, record_delivery};
use tidings_protocol::event::{EventId, names};
use tidings_protocol::wire;

/// Query parameters of `/v1/stream`.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamQuery {
    #[serde(flatten)]
    filter: FilterQuery,
    since: Option<String>,
    accept_envelope: Option<String>,
}

impl super::caller::QueryNames for StreamQuery {
    const ENDPOINT: &'static str = "GET /v1/stream";
    const NAMES: &'static [&'static str] = &["filter", "types", "agents", "targets", "since", "accept_envelope"];
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
        (status = 200, description = "An event stream: `retry:`, then `id:` + `data: <envelope>` per event; named notices `system.client_dropped_slow`, `system.replay_gap`, `system.token_expired` (the token expired: the stream ends), `system.filter_budget_exceeded` (once: the payload rule went over its budget on an event, which did not match); comment heartbeats", content_type = "text/event-stream", body = String),
        (status = 400, description = "`invalid_filter`, `invalid_since`, `invalid_last_event_id`, `invalid_accept_envelope`, `invalid_query` (a parameter the endpoint does not take, one given twice, or unreadable)", body = crate::http::openapi::ErrorBody),
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
    Params(query): Params<StreamQuery>,
) -> Result<Response, ApiError> {
    check_envelope(query.accept_envelope.as_deref())?;
    // What was asked for, intersected with what the caller may receive.
    let filter = Filter::from_query(&query.filter, app.core().filter_limits())?;
    let filter = Arc::new(caller.restrict(filter));
    let resume = match headers.get("last-event-id") {
        Some(v) => Some(parse_cursor(v.to_str().unwrap_or("x"), "invalid_last_event_id", "Last-Event-ID")?),
        None => query.since.as_deref().map(|s| parse_cursor(s, "invalid_since", "since")).transpose()?,
    };

    let core = app.core();
    let compression = app.settings().streams.compression == Compression::On;
    let gzip = (compression && compress::accepts_gzip(&headers)).then(SharedGzip::default);
    let gzipped = gzip.is_some();
    let mut options = core.session_options("sse");
    options.permit = Some(core.limits().acquire_stream(&caller)?);
    options.kill = connection.as_ref().map(|c| c.0.kill_token());
    options.expires_at = caller.expires_at;
    // A stream on the direct path, whose frames need no span of their own,
    // lets the broker write its frames while it waits (a compressed one's
    // gzip state with them: see [`SharedGzip`]).
    if crate::telemetry::tracer().is_none()
        && let Some(link) = connection.as_ref().and_then(|c| c.0.link())
    {
        let sink = Sink { link: link.clone(), filter: filter.clone(), expires_at: caller.expires_at, gzip: gzip.clone() };
        options.sink = Some(Arc::new(sink));
    }
    let start = resume.map_or(Start::Now, Start::Resume);
    let session = Session::open(core, filter, start, options).await?;

    let retry_ms = u32::try_from(app.settings().streams.sse_retry.as_millis()).unwrap_or(u32::MAX);
    let state = SseState { session, retry_ms, phase: Phase::Start, pending: Vec::new().into_iter(), gzip };
    // The session is awaited right in the stream's step, with no helper
    // future in between: an idle stream is this one future.
    let body = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            // One chunk per event, each the event's shared SSE frame (or
            // its shared compressed segment): the connection writes the
            // chunks that are ready in one go.
            if let Some(frame) = s.pending.next() {
                let chunk = event_chunk(&frame, s.gzip.as_deref());
                return Some((Ok::<_, std::convert::Infallible>(chunk), s));
            }
            let chunk = match s.first_or_done() {
                Some(chunk) => chunk,
                None => {
                    let item = s.session.next().await;
                    match s.write(item) {
                        Some(chunk) => chunk,
                        None => continue,
                    }
                }
            };
            return match chunk {
                Some(chunk) => Some((Ok(s.encode(chunk)), s)),
                // A compressed stream's last chunk is its trailer.
                None => s.gzip.take().map(|gzip| (Ok(lock(&gzip).trailer()), s)),
            };
        }
    });
    let mut response = Response::new(Body::from_stream(body));
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if compression {
        h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    if gzipped {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        crate::metrics::stream_compressed();
    }
    Ok(response)
}

/// A stream the broker writes while its session waits (see
/// `broker::Sink`): what the stream would write, as one chunk.
#[derive(Debug)]
struct Sink {
    link: Arc<Link>,
    filter: Arc<Filter>,
    expires_at: Option<i64>,
    /// A compressed stream's gzip state, shared with its task.
    gzip: Option<SharedGzip>,
}

/// A compressed stream's gzip state (the checksum and length of what it
/// sent, for its trailer), shared by its task and the broker's writes for
/// it: each event is counted by whichever writes it, and the two never
/// write at once (the broker writes only while the task waits, see
/// `server::Link`), so the lock is never contended.
type SharedGzip = Arc<std::sync::Mutex<Gzip>>;

fn lock(gzip: &std::sync::Mutex<Gzip>) -> std::sync::MutexGuard<'_, Gzip> {
    // Each use is one update of a checksum: a panic cannot leave it torn.
    gzip.lock().unwrap_or_else(|p| p.into_inner())
}

/// An event as this stream writes it: its shared SSE frame, or its shared
/// compressed segment, counted by the stream's gzip state.
fn event_chunk(frame: &Frame, gzip: Option<&std::sync::Mutex<Gzip>>) -> Bytes {
    match gzip {
        None => frame.sse(event_frame),
        Some(gzip) => {
            let (plain, packed) = frame.sse_compressed(event_frame, compress::segment);
            lock(gzip).write(&plain, packed)
        }
    }
}

impl crate::broker::Sink for Sink {
    fn idle(&self) -> bool {
        self.link.idle()
    }

    fn settled(&self) -> bool {
        self.link.settled()
    }

    fn write(&self, frames: &[Frame]) -> Wrote {
        if task_must_write(&self.filter, self.expires_at) {
            return Wrote::Declined;
        }
        let gzip = self.gzip.as_deref();
        let whole = match frames {
            [one] => self.link.write_chunk(std::slice::from_ref(&event_chunk(one, gzip))),
            many => self.link.write_chunk(&many.iter().map(|f| event_chunk(f, gzip)).collect::<Vec<_>>()),
        };
        record_delivery("sse", frames, false);
        if whole { Wrote::All } else { Wrote::Part }
    }
}

/// Whether a broker write must be left to the stream's task: a notice that
/// is due and the token's expiry are the session's, and the task is woken
/// to write them (the notice after the frames it takes with it, as ever;
/// nothing after the expiry). Shared by the WebSocket's broker writes.
pub(super) fn task_must_write(filter: &Filter, expires_at: Option<i64>) -> bool {
    filter.budget_notice_due() || expires_at.is_some_and(|at| chrono::Utc::now().timestamp() >= at)
}

/// Kept per stream for its whole life, so kept small: an idle stream costs
/// what its state and its waiting future hold.
struct SseState {
    session: Session,
    retry_ms: u32,
    phase: Phase,
    /// The events of a delivery not written yet.
    pending: std::vec::IntoIter<Frame>,
    /// A compressed stream's own state (`Content-Encoding: gzip`, see
    /// [`compress`]); shared, so a plain stream carries a pointer.
    gzip: Option<SharedGzip>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing written yet: `retry:` and the resume gap go first.
    Start,
    Streaming,
    Done,
}

impl SseState {
    /// A chunk of this stream's own as written: compressed on its own
    /// when the stream is.
    fn encode(&mut self, chunk: Bytes) -> Bytes {
        match self.gzip.as_deref() {
            None => chunk,
            Some(gzip) => lock(gzip).own(&chunk),
        }
    }

    /// Before the session: the opening chunk (`retry:` and the resume gap),
    /// or the end once the stream is done (`Some(None)`); `None` to go on.
    fn first_or_done(&mut self) -> Option<Option<Bytes>> {
        match self.phase {
            Phase::Start => {
                self.phase = Phase::Streaming;
                let mut first = BytesMut::from(format!("retry: {}\n\n", self.retry_ms).as_bytes());
                if let Some(gap) = self.session.take_gap() {
                    first.extend_from_slice(&gap_frame(gap));
                }
                Some(Some(first.freeze()))
            }
            Phase::Done => Some(None),
            Phase::Streaming => None,
        }
    }

    /// An item as SSE: a chunk to write, the end (`Some(None)`), or nothing
    /// to write (`None`).
    fn write(&mut self, item: Item) -> Option<Option<Bytes>> {
        Some(match item {
            Item::Events { frames, replayed } => {
                record_delivery("sse", &frames, replayed);
                self.pending = frames.into_iter();
                return None;
            }
            Item::Gap(gap) => Some(gap_frame(gap)),
            Item::Heartbeat => Some(Bytes::from_static(b":\n\n")),
            Item::CaughtUp | Item::ScanLimit => return None,
            Item::Dropped(dropped) => {
                self.phase = Phase::Done;
                Some(dropped_frame(dropped))
            }
            Item::FilterBudgetExceeded { budget } => {
                let data = wire_json(&wire::FilterBudgetExceeded { budget: u64::try_from(budget).unwrap_or(u64::MAX) });
                Some(sse_frame(None, Some(names::SYSTEM_FILTER_BUDGET_EXCEEDED), data.as_bytes()))
            }
            Item::Expired { last_event_id } => {
                self.phase = Phase::Done;
                let data = wire_json(&wire::TokenExpiredNotice { last_event_id });
                Some(sse_frame(None, Some(names::SYSTEM_TOKEN_EXPIRED), data.as_bytes()))
            }
            Item::End(End::Shutdown) => {
                self.phase = Phase::Done;
                Some(self.goodbye())
            }
            Item::End(End::Failed | End::Over) => {
                self.phase = Phase::Done;
                None
            }
        })
    }

    /// The last chunk on shutdown: when to come back, jittered over a few
    /// multiples of the normal retry so clients do not return in one storm.
    fn goodbye(&self) -> Bytes {
        let base = u64::from(self.retry_ms);
        let jittered = base + rand::random_range(0..=base.saturating_mul(4).max(1));
        Bytes::from(format!("retry: {jittered}\n\n"))
    }
}

/// An event as an SSE frame: `id: N`, `data: <envelope>`.
fn event_frame(frame: &FrameData) -> Bytes {
    let mut out = BytesMut::with_capacity(frame.envelope.len() + 40);
    out.put_slice(b"id: ");
    out.put_slice(itoa::Buffer::new().format(frame.id).as_bytes());
    out.put_slice(b"\ndata: ");
    out.put_slice(&frame.envelope);
    out.put_slice(b"\n\n");
    out.freeze()
}

fn gap_frame(gap: Gap) -> Bytes {
    let data = gap.to_json().to_string();
    sse_frame(None, Some(names::SYSTEM_REPLAY_GAP), data.as_bytes())
}

fn dropped_frame(dropped: Dropped) -> Bytes {
    let data = wire_json(&wire::DroppedNotice {
        reason: dropped.reason,
        last_event_id: dropped.last_event_id,
        queue: u64::try_from(dropped.queue).unwrap_or(u64::MAX),
    });
    sse_frame(None, Some(names::SYSTEM_CLIENT_DROPPED_SLOW), data.as_bytes())
}

/// A notice's data: its protocol type (`tidings_protocol::wire`) as compact JSON.
fn wire_json(notice: &impl serde::Serialize) -> String {
    serde_json::to_string(notice).expect("a notice is plain JSON")
}

/// One SSE frame. `data` must not contain a newline: compact JSON never does.
pub fn sse_frame(id: Option<EventId>, event: Option<&str>, data: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(data.len() + 40);
    if let Some(event) = event {
        out.put_slice(b"event: ");
        out.put_slice(event.as_bytes());
        out.put_u8(b'\n');
    }
    if let Some(id) = id {
        out.put_slice(b"id: ");
        out.put_slice(id.to_string().as_bytes());
        out.put_u8(b'\n');
    }
    out.put_slice(b"data: ");
    out.put_slice(data);
    out.put_slice(b"\n\n");
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidings_protocol::event::Event;

    #[test]
    fn an_event_frame_is_id_then_data_with_the_envelope() {
        let body = crate::broker::tests::sample_body();
        let event = Event::from_stored(42, &body.to_json(), 0).unwrap();
        let frame = Frame::of(&event).sse(event_frame);
        assert!(frame.starts_with(b"id: 42\ndata: {\"envelope_version\":1,\"event_id\":42,\"event_type\""));
        assert!(frame.ends_with(b"}\n\n"));
        assert_eq!(frame, sse_frame(Some(42), None, &event.envelope));
    }
}
