//! Long-poll and the durable consumers behind it (docs/polling.md), for
//! agents that cannot hold a stream open (cron jobs, serverless functions,
//! scripts).
//!
//! A poll is a bounded [`Session`]: it reads the log after its resume point
//! through the same filter code as every stream, answers up to `limit`
//! events with `next_since` (the id to pass next) and `has_more`, and with
//! `wait_ms` goes on live until a matching event arrives. The session
//! registers with the broker *before* it reads, so an event committed in
//! between wakes it. One request scans at most `TIDINGS_POLL_MAX_SCAN` rows
//! of history; stopping there answers `has_more: true` with the scan
//! position, so a sparse filter never makes one request unbounded.
//!
//! [`run_expiry`] collects consumers silent past `TIDINGS_CONSUMER_TTL`.
//!
//! A `consumer_id` makes the cursor durable: it is stored with the filter,
//! and only confirmations move it ([`ack`], or the next poll's `since`), as
//! a monotonic max clamped to the head, so two pollers sharing one id are
//! safe and no future event is skipped.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Services;
use super::error::{InvalidField, Kind, Refusal};
use super::gap::told_at_epoch_change;
use super::session::{End, Gap, Item, Session, Start};
use crate::auth::Identity;
use crate::broker::Frame;
use crate::filter::{Filter, FilterError};
use crate::metrics as m;
use crate::store::{Acked, Actor, Consumer, ConsumerOpen, Moved, Opened, Store, StoreError};
use tidings_protocol::event::EventId;

/// Why a poll or a consumer operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// A field is malformed (`invalid_since`, `invalid_limit`, `invalid_consumer_id`, ...).
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    /// `invalid_filter`.
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// `cursor_expired`: the consumer was collected after a long silence.
    #[error("this consumer was collected after a silence longer than the consumer TTL; poll again with an explicit since to start afresh")]
    Expired,
    /// `not_consumer_owner`.
    #[error("consumer {0:?} belongs to another identity")]
    NotOwner(String),
    /// `consumer_not_found`.
    #[error("no consumer {0:?}")]
    NotFound(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A long-poll over the stream limits (`too_many_streams`, `too_many_streams_for_identity`).
    #[error(transparent)]
    Limit(#[from] super::limits::LimitError),
    /// `too_many_consumers`: creating one more would pass the identity's cap.
    #[error("this identity keeps at most {0} durable consumers (TIDINGS_MAX_CONSUMERS_PER_IDENTITY); delete some")]
    TooManyConsumers(u32),
}

impl Refusal for PollError {
    fn code(&self) -> &'static str {
        match self {
            Self::Invalid(e) => e.code(),
            Self::Filter(e) => e.code(),
            Self::Expired => "cursor_expired",
            Self::NotOwner(_) => "not_consumer_owner",
            Self::NotFound(_) => "consumer_not_found",
            Self::Store(e) => e.code(),
            Self::Limit(e) => e.code(),
            Self::TooManyConsumers(_) => "too_many_consumers",
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::Invalid(_) | Self::Filter(_) => Kind::Invalid,
            Self::Expired => Kind::Gone,
            Self::NotOwner(_) => Kind::Forbidden,
            Self::NotFound(_) => Kind::NotFound,
            Self::Store(e) => e.kind(),
            Self::Limit(e) => e.kind(),
            Self::TooManyConsumers(_) => Kind::TooMany,
        }
    }

    fn wrapped(&self) -> Option<&dyn Refusal> {
        match self {
            Self::Store(e) => Some(e),
            Self::Limit(e) => Some(e),
            _ => None,
        }
    }
}

/// A poll as a transport read it (numbers already parsed).
#[derive(Debug, Default)]
pub struct PollRequest {
    /// The filter as JSON text (what a consumer stores), if one was given.
    pub filter_json: Option<String>,
    /// Resume after this id (and, with a consumer, confirm it).
    pub since: Option<u64>,
    /// The durable consumer.
    pub consumer_id: Option<String>,
    /// Most events to answer (default 100, at most `TIDINGS_POLL_MAX_LIMIT`).
    pub limit: Option<u64>,
    /// How long to wait for a first match (at most `TIDINGS_POLL_MAX_WAIT`).
    pub wait_ms: Option<u64>,
    /// Cancelled when the client is gone: the poll ends at once and gives
    /// its place in the stream limits back.
    pub gone: CancellationToken,
    /// The poll takes a place of its own in the stream limits, waiting or
    /// not (HTTP and MCP polls: concurrent page reads are bounded per
    /// identity); a device's `sync.delta` reads within its connection's.
    pub own_place: bool,
}

/// A poll's answer.
#[derive(Debug)]
pub struct PollPage {
    /// The matching events, ascending.
    pub events: Vec<Frame>,
    /// The id to pass as `since` next.
    pub next_since: EventId,
    /// Whether more matching events may follow right away.
    pub has_more: bool,
    /// The resume point could not be served gap-free: history before it was
    /// pruned, or it is beyond the head (then `next_since` is the head).
    pub gap: Option<Gap>,
}

/// Longest consumer id.
pub const MAX_CONSUMER_ID: usize = 128;

/// Checks a consumer id: 1 to 128 characters of `[A-Za-z0-9._:-]`.
pub fn check_consumer_id(id: &str) -> Result<(), InvalidField> {
    let ok = !id.is_empty() && id.len() <= MAX_CONSUMER_ID && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(InvalidField::new("invalid_consumer_id", format!("consumer_id must be 1 to {MAX_CONSUMER_ID} characters of [A-Za-z0-9._:-]")))
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn actor(caller: &Identity) -> Actor<'_> {
    Actor { sub: &caller.sub, admin: caller.admin }
}

/// The stored key of `owner`'s consumer `id`: consumer ids are scoped by
/// owner, so two owners' `nightly` are two consumers and nobody learns
/// whether another owner's id exists. A consumer id has no `/`, so the key
/// reads back unambiguously ([`consumer_id`]).
fn key(owner: &str, id: &str) -> String {
    format!("{owner}/{id}")
}

/// The consumer id of a stored key (the part after the owner).
pub fn consumer_id<'a>(stored: &'a str, owner: &str) -> &'a str {
    stored.strip_prefix(owner).and_then(|rest| rest.strip_prefix('/')).unwrap_or(stored)
}

/// How long `caller`'s token has left (no limit with auth off).
pub fn until_expiry(caller: &Identity) -> Duration {
    match caller.expires_at {
        Some(at) => Duration::from_millis(u64::try_from(at.saturating_mul(1000) - now_ms()).unwrap_or(0)),
        None => Duration::MAX,
    }
}

/// Answers one poll for `caller`: checks the request, finds where the page
/// starts (after `since`, the head, or a durable consumer's cursor), reads
/// the page through a session, and says what the client must know of a
/// newer epoch.
pub async fn poll(core: &Services, caller: &Identity, request: PollRequest) -> Result<PollPage, PollError> {
    if let Some(id) = &request.consumer_id {
        check_consumer_id(id)?;
    }
    let settings = core.settings();
    let limit = match request.limit {
        Some(0) => return Err(InvalidField::new("invalid_limit", "limit must be at least 1").into()),
        Some(n) => (n as usize).min(settings.poll.poll_max_limit),
        None => 100.min(settings.poll.poll_max_limit),
    };
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(0)).min(settings.poll.poll_max_wait);
    let since =
        request.since.map(|s| EventId::try_from(s).map_err(|_| InvalidField::new("invalid_since", "since is too large"))).transpose()?;
    m::poll_request();
    // Transports hold each form a client sends to the limits; a filter
    // here may be the merge of two (`filter::query_json`).
    let limits = core.filter_limits().merged();
    // Validate a given filter before anything is stored.
    if let Some(json) = &request.filter_json {
        Filter::from_json(json, limits)?;
    }
    // A poll that waits is a stream while it waits: it holds a place in
    // the stream limits (taken before a consumer is stored, so a refusal
    // stores nothing).
    let permit = if wait.is_zero() && !request.own_place { None } else { Some(core.limits().acquire_stream(caller)?) };
    let PageStart { filter_json, after, told, waited_in } = page_start(core, caller, &request, since).await?;
    // Whatever was asked for, the caller receives only what its grants and
    // visibility allow.
    let filter = match &filter_json {
        Some(json) => Filter::from_json(json, limits)?,
        None => Filter::any(),
    };
    let filter = Arc::new(caller.restrict(filter));

    let mut options = core.session_options("poll");
    options.live = !wait.is_zero();
    options.heartbeat = None;
    options.scan_budget = Some(settings.poll.poll_max_scan);
    options.permit = permit;
    let mut session = Session::open(core, filter, Start::After(after), options).await?;
    // The wait ends at the token's expiry, whatever was asked: nothing is
    // delivered under a token past its life.
    let deadline = tokio::time::Instant::now() + wait.min(until_expiry(caller));
    let bounds = PageBounds { limit, max_bytes: settings.poll.poll_max_bytes, deadline };
    let (events, has_more, found) = read_page(&mut session, &request.gone, bounds).await;
    // The first gap is the one the client asked about.
    let mut gap = told.or(found);
    m::delivered("poll", events.len() as u64);
    let next_since = events.last().map_or_else(|| session.cursor(), |e| e.id);
    // The page's end (matching events or not: what the consumer confirms
    // next) may lie in an epoch begun while it waited.
    if let (Some((cursor, epoch)), None) = (waited_in, gap)
        && next_since > cursor
    {
        gap = begun_while_waiting(core, cursor, epoch, next_since).await;
    }
    Ok(PollPage { events, next_since, has_more, gap })
}

/// Where a page starts, and what it must say of a newer epoch.
struct PageStart {
    /// The filter asked for, or a durable consumer's stored one.
    filter_json: Option<String>,
    /// The page reads after this id.
    after: EventId,
    /// A durable consumer's first read in a newer epoch may be told, at its
    /// opening, that history it was shown is gone.
    told: Option<Gap>,
    /// A durable consumer's cursor and the epoch it was opened in: told of
    /// an epoch begun while the poll waits, with the page.
    waited_in: Option<(EventId, i32)>,
}

/// After `since`, else the head for a plain poll, else the consumer's
/// cursor (opening it, or creating it with the request's filter).
async fn page_start(core: &Services, caller: &Identity, request: &PollRequest, since: Option<EventId>) -> Result<PageStart, PollError> {
    let Some(id) = &request.consumer_id else {
        let after = match since {
            Some(since) => since,
            None => core.store().head().await?,
        };
        return Ok(PageStart { filter_json: request.filter_json.clone(), after, told: None, waited_in: None });
    };
    let max_owned = core.settings().poll.max_consumers_per_identity;
    let key = key(&caller.sub, id);
    let opened = core
        .store()
        .consumer_open(ConsumerOpen {
            id: &key,
            max_owned,
            filter_json: request.filter_json.as_deref().map(Some),
            since,
            expire_before_ms: now_ms() - core.consumer_ttl_ms(),
            now_ms: now_ms(),
            actor: actor(caller),
        })
        .await?;
    let consumer = match opened {
        Opened::Expired => return Err(PollError::Expired),
        Opened::Forbidden => return Err(PollError::NotOwner(id.clone())),
        Opened::TooMany => return Err(PollError::TooManyConsumers(max_owned)),
        Opened::Ready(consumer) => consumer,
    };
    let mut told = None;
    if since.is_none() && consumer.read_epoch < consumer.epoch {
        // The store may have lost what this consumer was shown past its
        // cursor since its last read.
        let epochs = core.store().epochs(consumer.epoch).await?;
        told = told_at_epoch_change(&epochs, consumer.cursor, consumer.read_epoch, core.store().head().await?);
    }
    let waited_in = (since.is_none() && told.is_none()).then_some((consumer.cursor, consumer.epoch));
    // `since` (already confirmed) wins; otherwise resume after the cursor.
    Ok(PageStart { filter_json: consumer.filter_json, after: since.unwrap_or(consumer.cursor), told, waited_in })
}

/// How much one page holds, and how long it waits for a first match.
struct PageBounds {
    limit: usize,
    max_bytes: usize,
    deadline: tokio::time::Instant,
}

/// Reads one page from `session`: up to `limit` events and `max_bytes`
/// (one at least), history to the end of the page, and a live match at
/// once; waiting for a first match ends at the deadline or when nobody is
/// left to answer. Answers the events, whether there is more, and the
/// first gap met.
async fn read_page(session: &mut Session, gone: &CancellationToken, bounds: PageBounds) -> (Vec<Frame>, bool, Option<Gap>) {
    let PageBounds { limit, max_bytes, deadline } = bounds;
    let (mut events, mut has_more, mut caught_up, mut gap) = (Vec::new(), false, false, None);
    // Bytes of the envelopes in `events`: a page is bounded in bytes too.
    let mut bytes = 0usize;
    loop {
        let item = tokio::select! {
            // Nobody is left to answer: end, and give the permit back.
            _ = gone.cancelled() => break,
            item = session.next() => item,
            // Only waiting for a first match is bounded by wait_ms; history
            // is read to the end of the page regardless.
            _ = tokio::time::sleep_until(deadline), if events.is_empty() && caught_up => break,
        };
        match item {
            Item::Events { frames, .. } => {
                let before = events.len();
                events.extend(frames);
                bytes += events[before..].iter().map(|e| e.envelope.len()).sum::<usize>();
                if bytes > max_bytes && events.len() > 1 {
                    // Past the byte bound: as many as fit (one at least).
                    let mut kept = 0usize;
                    let fit = events.iter().take_while(|e| {
                        kept += e.envelope.len();
                        kept <= max_bytes
                    });
                    let fit = fit.count().max(1);
                    events.truncate(fit.min(limit));
                    has_more = true;
                    break;
                }
                if events.len() > limit {
                    // One match beyond the limit proves there is more.
                    events.truncate(limit);
                    has_more = true;
                    break;
                }
                if caught_up {
                    // A live match: answer at once.
                    break;
                }
            }
            Item::CaughtUp => {
                caught_up = true;
                if !events.is_empty() {
                    break;
                }
            }
            Item::ScanLimit => {
                has_more = true;
                break;
            }
            // The first gap is the one the client asked about.
            Item::Gap(found) => gap = gap.or(Some(found)),
            // A poll's filter lives for one request: the count and the log
            // say it; the page goes on.
            Item::Heartbeat | Item::FilterBudgetExceeded { .. } => {}
            Item::Dropped(_) | Item::Expired { .. } | Item::End(End::Over | End::Shutdown | End::Failed) => break,
        }
    }
    (events, has_more, gap)
}

/// What a consumer opened at `cursor` in `epoch` is told when its page
/// ends at `end`, past the base of an epoch begun while the poll waited:
/// the opening saw no new epoch, so this page is its first read in one,
/// and it is told here what the opening would have told it (see
/// [`Gap::at_epoch_change`]). A store that cannot say keeps the page as
/// it is: the consumer's next opening tells it then.
async fn begun_while_waiting(core: &Services, cursor: EventId, epoch: i32, end: EventId) -> Option<Gap> {
    let bounds = core.store().bounds().await.ok()?;
    if bounds.epoch <= epoch {
        return None;
    }
    let epochs = core.store().epochs(bounds.epoch).await.ok()?;
    if !epochs.all().iter().any(|e| e.number > epoch && end > e.base) {
        return None;
    }
    told_at_epoch_change(&epochs, cursor, epoch, bounds.head)
}

/// Confirms everything up to `cursor` on consumer `id`; answers the cursor
/// after the ack.
pub async fn ack(core: &Services, caller: &Identity, id: &str, cursor: EventId) -> Result<EventId, PollError> {
    check_consumer_id(id)?;
    let key = key(&caller.sub, id);
    let started = crate::telemetry::tracer().map(|_| std::time::SystemTime::now());
    match core.store().consumer_ack(&key, cursor, now_ms(), now_ms() - core.consumer_ttl_ms(), actor(caller)).await? {
        Acked::Moved(moved) => {
            if let Some(started) = started {
                settled(core, caller, id, &moved, started).await;
            }
            Ok(moved.cursor)
        }
        other => Err(refusal(id, other)),
    }
}

/// Most events of an ack read for its span's links: an ack of a longer
/// stretch is one span linked to the traced events among its first ones.
const SETTLED_SCAN: usize = 1_000;

/// Rows an ack's span reads at a time (each at most `TIDINGS_MAX_PAYLOAD`).
const SETTLED_PAGE: usize = 16;

/// Records the span of an ack that confirmed `moved` on consumer `id`: one
/// span, linked to each traced event it settled (the consumer's events in
/// the stretch, through its filter and the caller's grants, as its polls
/// read them). Nothing when no event of the stretch was traced.
async fn settled(core: &Services, caller: &Identity, id: &str, moved: &Moved, started: std::time::SystemTime) {
    use opentelemetry::KeyValue;
    let Ok(stretch) = usize::try_from(moved.cursor - moved.before) else { return };
    if stretch == 0 {
        return;
    }
    let filter = match &moved.filter_json {
        Some(json) => match Filter::from_json(json, core.filter_limits().merged()) {
            Ok(filter) => filter,
            Err(_) => return,
        },
        None => Filter::any(),
    };
    let filter = caller.restrict(filter);
    // Read in small pages, keeping only each settled event's trace
    // context: an ack holds at most one page of rows (a poll page is
    // bounded in bytes the same way), however many acks run at once.
    let (mut contexts, mut settled_count, mut after, mut scanned) = (Vec::new(), 0i64, moved.before, 0usize);
    while after < moved.cursor && scanned < stretch.min(SETTLED_SCAN) {
        let Ok(page) = core.store().read_history(after, SETTLED_PAGE).await else { return };
        let Some(last) = page.last() else { break };
        after = last.id;
        scanned += page.len();
        for record in page.iter().filter(|r| r.id <= moved.cursor) {
            if let Ok(event) = tidings_protocol::event::Event::from_stored(record.id, &record.body, record.recorded_ms)
                && filter.matches(&event.body)
            {
                settled_count += 1;
                contexts.push(crate::broker::trace_of(&event));
            }
        }
    }
    let attributes = vec![
        KeyValue::new("messaging.operation.type", "settle"),
        KeyValue::new("messaging.consumer.group.name", id.to_owned()),
        KeyValue::new("messaging.batch.message_count", settled_count),
        KeyValue::new("tidings.transport", "poll"),
        KeyValue::new("tidings.cursor.before", moved.before),
        KeyValue::new("tidings.cursor", moved.cursor),
    ];
    drop(crate::telemetry::batch_since(
        "ack",
        opentelemetry::trace::SpanKind::Consumer,
        contexts.iter().map(Option::as_ref),
        attributes,
        Some(started),
    ));
}

/// Deletes consumer `id` of `owner` (the caller's own when `None`; only an
/// admin may name another owner, anyone else finds no such consumer).
pub async fn delete(core: &Services, caller: &Identity, id: &str, owner: Option<&str>) -> Result<(), PollError> {
    check_consumer_id(id)?;
    let owner = owner.unwrap_or(&caller.sub);
    if owner != caller.sub && !caller.admin {
        return Err(PollError::NotFound(id.to_owned()));
    }
    match core.store().consumer_delete(&key(owner, id), actor(caller)).await? {
        Acked::Cursor(_) => Ok(()),
        other => Err(refusal(id, other)),
    }
}

/// The head and every consumer `caller` may see (all of them for an admin).
pub async fn list(core: &Services, caller: &Identity) -> Result<(EventId, Vec<Consumer>), PollError> {
    let head = core.store().head().await?;
    let mut consumers = core.store().consumer_list(actor(caller)).await?;
    for c in &mut consumers {
        c.id = consumer_id(&c.id, &c.owner).to_owned();
    }
    Ok((head, consumers))
}

fn refusal(id: &str, outcome: Acked) -> PollError {
    match outcome {
        Acked::Expired => PollError::Expired,
        Acked::Forbidden => PollError::NotOwner(id.to_owned()),
        Acked::NotFound | Acked::Cursor(_) | Acked::Moved(_) => PollError::NotFound(id.to_owned()),
    }
}

/// Collects durable consumers silent for longer than `ttl`, checking about
/// four times per TTL (at most once a minute), and samples every remaining
/// consumer's lag into `tidings_consumer_lag_events`.
pub async fn run_expiry(store: Arc<dyn Store>, ttl: Duration, cancel: CancellationToken) {
    let every = (ttl / 4).clamp(Duration::from_millis(20), Duration::from_secs(60));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let before = chrono::Utc::now().timestamp_millis() - ttl.as_millis().min(i64::MAX as u128) as i64;
        match store.consumer_expire(before).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(collected = n, "collected silent durable consumers"),
            Err(e) => tracing::warn!(error = %crate::report::chain(&e), "consumer expiry failed; retrying at the next interval"),
        }
        if let (Ok(head), Ok(consumers)) = (store.head().await, store.consumer_list(Actor { sub: "", admin: true }).await) {
            for c in consumers {
                crate::metrics::consumer_lag(head - c.cursor);
            }
        }
    }
}
