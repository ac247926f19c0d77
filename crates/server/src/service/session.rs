//! One subscriber's delivery, for every transport: register the live
//! subscription, read the head, replay history from the store up to the
//! position the broker reported at registration, then take live frames —
//! nothing missed, nothing repeated at the seam (the mercure order).
//!
//! A [`Session`] yields typed [`Item`]s; a transport only writes them in its
//! wire format (SSE frames, a poll answer, JSON-RPC notifications). What a
//! session owns, so no transport writes it again:
//! - the resume check: a resume point the log cannot serve gap-free (pruned,
//!   beyond the head, or further back than `TIDINGS_MAX_REPLAY`) is
//!   announced as an [`Item::Gap`], never papered over; so is history pruned
//!   while the session replays;
//! - the lagged→catch-up loop: a session whose queue overflowed while it was
//!   behind registers again and catches up from the store (KurrentDB's
//!   drop-to-catch-up);
//! - the slow-client drop ([`Item::Dropped`]) and the heartbeat tick;
//! - the gap metric. Deliveries are counted by the transport once written
//!   ([`record_delivery`]): a poll answers only part of what it read.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Services;
pub use super::delivered::record_delivery;
pub use super::gap::{Gap, GapReason};
use super::limits::StreamPermit;
use crate::broker::{Broker, Detached, Frame, Sink, SubscribeOptions, Subscription};
use crate::filter::Filter;
use crate::metrics as m;
use crate::store::{Bounds, EventLog, StoreError};
use tidings_protocol::event::{Event, EventId};

/// Where a session starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// With what is published from now on.
    Now,
    /// A client's resume point (`Last-Event-ID`, `since`): after this id,
    /// checked against retained history and the replay cap.
    Resume(EventId),
    /// After this id, checked against retained history and the head but
    /// not capped (a poll's cursor: a poll's scan is bounded per request
    /// instead).
    After(EventId),
}

/// How a session behaves; [`Services::session_options`] fills the defaults from
/// the settings.
#[derive(Debug)]
pub struct SessionOptions {
    /// The `transport` label of the metrics.
    pub transport: &'static str,
    /// Whether the session registers with the broker and goes on live after
    /// history; `false` serves history up to the head read at open, then ends.
    pub live: bool,
    /// Cancelled (after the eviction grace) when the broker evicts the
    /// client and its connection has not finished by then.
    pub kill: Option<CancellationToken>,
    /// A tick this often while live and idle; `None`: no ticks.
    pub heartbeat: Option<Duration>,
    /// Rows read from the store per replay page.
    pub read_batch: usize,
    /// How far back one resume may replay (`Start::Resume`).
    pub max_replay: u64,
    /// Rows one session may scan in history before [`Item::ScanLimit`]
    /// (`None`: unbounded).
    pub scan_budget: Option<usize>,
    /// The stream's place in the stream limits, held for the session's life.
    pub permit: Option<StreamPermit>,
    /// When the token that opened the session expires (Unix seconds,
    /// leeway included): nothing is delivered after it, and the session
    /// ends with [`Item::Expired`] (at the expiry when it has heartbeats,
    /// else at its next item).
    pub expires_at: Option<i64>,
    /// The stream the broker writes itself while the session waits live with
    /// everything delivered (it is *parked*: `broker::Sink`).
    pub sink: Option<Arc<dyn Sink>>,
}

/// A slow client's drop: the session ends after it; the client resumes
/// from `last_event_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dropped {
    /// Why.
    pub reason: tidings_protocol::wire::DropReason,
    /// The last id delivered.
    pub last_event_id: Option<EventId>,
    /// The queue length.
    pub queue: usize,
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The server is shutting down: the client should come back later.
    Shutdown,
    /// The store failed while replaying: the client resumes once it is back.
    Failed,
    /// Nothing more to deliver (dropped, or a history-only session done).
    Over,
}

/// What a session delivers next.
#[derive(Debug)]
pub enum Item {
    /// Matching events, ascending, each delivered once.
    Events {
        /// The frames.
        frames: Vec<Frame>,
        /// Read from history (`true`) or taken live.
        replayed: bool,
    },
    /// History the client asked for is gone (or its resume point is beyond
    /// the head); delivery goes on from `available_from`.
    Gap(Gap),
    /// Replay reached the live seam (or, history-only, the head).
    CaughtUp,
    /// The history scan budget is spent (history-only sessions).
    ScanLimit,
    /// Live and idle for a heartbeat interval.
    Heartbeat,
    /// Dropped as a slow client; the session ends.
    Dropped(Dropped),
    /// The session's payload rule went over `TIDINGS_RULE_BUDGET` on some
    /// event (which did not match); said once, delivery goes on.
    FilterBudgetExceeded {
        /// The budget, in bytes (and loop steps).
        budget: usize,
    },
    /// The token that opened the session expired; the session ends. The
    /// client resumes after `last_event_id` with a fresh token.
    Expired {
        /// The last id delivered.
        last_event_id: Option<EventId>,
    },
    /// The end; every later call answers the same.
    End(End),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Replay,
    Live,
    Done(End),
}

/// One subscriber's delivery state. It lives as long as the subscriber,
/// so it keeps only what delivery needs, compactly: an idle stream costs
/// this plus its waiting future.
#[derive(Debug)]
pub struct Session {
    broker: Broker,
    subscription: Option<Subscription>,
    filter: Arc<Filter>,
    /// Ends a replay at shutdown (a live session ends when the broker
    /// closes its queue).
    shutdown: CancellationToken,
    kill: Option<CancellationToken>,
    /// The stream's place in the stream limits, held for the session's life.
    _permit: Option<StreamPermit>,
    transport: &'static str,
    heartbeat: Option<Duration>,
    /// The heartbeat's timer, made when the session first waits live.
    beat: Option<Pin<Box<tokio::time::Sleep>>>,
    /// When the caller's token expires, in Unix seconds (see
    /// [`SessionOptions::expires_at`]; four bytes, which fit the
    /// session's padding).
    expiry: Option<std::num::NonZeroU32>,
    /// Every event up to here was delivered or filtered out.
    cursor: EventId,
    /// The last id delivered (what the client's Last-Event-ID is).
    last_sent: Option<EventId>,
    /// Replay runs up to here; live frames cover everything above.
    target: EventId,
    /// Rows scanned in history so far, and the budget (0: none).
    scanned: u64,
    scan_budget: u64,
    read_batch: u32,
    /// Bytes per stored row on the last page read (sizes the next page).
    row_bytes: u32,
    /// Pages read so far, up to the one of full size (see
    /// [`FIRST_PAGE_BYTES`]).
    pages: u8,
    phase: Phase,
    /// The session parks (its [`SessionOptions::sink`] is in its queue).
    parks: bool,
    /// A gap to announce, and the events read with it (rare; boxed so an
    /// idle session does not carry room for them).
    aside: Option<Box<Aside>>,
}

#[derive(Debug, Default)]
struct Aside {
    gap: Option<Gap>,
    /// Events read with a gap, delivered right after it.
    pending: Option<Vec<Frame>>,
    /// The span of the batch last handed out, when spans are exported: it
    /// ends when the transport asks for the next item (its write done) or
    /// drops the session. Kept here, so a session without spans carries no
    /// room for one.
    delivering: Option<opentelemetry_sdk::trace::Span>,
}

impl Services {
    /// Session options from the settings, for `transport`.
    pub fn session_options(&self, transport: &'static str) -> SessionOptions {
        let s = self.settings();
        SessionOptions {
            transport,
            live: true,
            kill: None,
            heartbeat: Some(s.streams.heartbeat),
            read_batch: s.streams.read_batch as usize,
            max_replay: s.streams.max_replay,
            scan_budget: None,
            permit: None,
            expires_at: None,
            sink: None,
        }
    }
}

/// Whether a token that expires at `at` (Unix seconds) has.
fn expired(at: std::num::NonZeroU32) -> bool {
    chrono::Utc::now().timestamp() >= i64::from(at.get())
}

/// Unix seconds as the runtime's instant.
fn instant_of(at: std::num::NonZeroU32) -> tokio::time::Instant {
    let left = (i64::from(at.get()) * 1000).saturating_sub(chrono::Utc::now().timestamp_millis());
    tokio::time::Instant::now() + Duration::from_millis(u64::try_from(left).unwrap_or(0))
}

/// About how many bytes of stored rows one replay page reads at most: what
/// a stream whose client stopped reading holds (a constant: it trades
/// store round trips for memory per stuck client; small events still come
/// 64 rows a page and more, and replay was no slower for it: 50,000 events
/// of about 60 bytes replayed at 29–33k/s against 14–24k/s with pages of
/// 256 KiB and at least 16 rows, on a debug build).
const REPLAY_PAGE_BYTES: usize = 64 * 1024;
/// The first replay page reads about this many bytes, and each next one
/// twice as many up to [`REPLAY_PAGE_BYTES`]: a client that never reads
/// holds the first page (what its socket did not take), not a full one,
/// while a client that keeps up reaches full pages after three.
const FIRST_PAGE_BYTES: usize = 32 * 1024;
/// The fewest rows a replay page asks for, however large they are: one, so
/// a page of large events is one event.
const MIN_PAGE_ROWS: usize = 1;

/// Largest coalesced live delivery, in bytes of envelopes: one write of a
/// stream. A constant, not a setting: it only trades syscalls for latency
/// of the last frame in a burst, and 64 KiB is what a socket buffer takes.
pub const COALESCE_BYTES: usize = 64 * 1024;

impl Session {
    /// Opens a session for `filter` (already intersected with what the
    /// caller may receive). A live session is registered before the head is
    /// read, so nothing committed in between is missed.
    pub async fn open(core: &Services, filter: Arc<Filter>, start: Start, options: SessionOptions) -> Result<Self, StoreError> {
        let broker = core.broker().clone();
        let store = core.store();
        let subscription =
            options.live.then(|| broker.subscribe(filter.clone(), subscribe(&options.kill, options.transport, start != Start::Now)));
        let position = match &subscription {
            Some(s) => s.position(),
            None => store.head().await?,
        };
        // A resume point past the broker's position was shown by history
        // the broker has not fanned out yet; recorded before the epochs are
        // read, so a new epoch that loses it ends this client whichever of
        // the two comes first.
        if let (Some(s), Start::Resume(id) | Start::After(id)) = (&subscription, start) {
            s.shown(id);
        }
        let mut gap = None;
        let cursor = match start {
            Start::Now => position,
            Start::Resume(requested) | Start::After(requested) => {
                let mut bounds = store.bounds().await?;
                // Past the head: a promotion may have lost it before any
                // epoch says so; checked, and read again if one began.
                if requested > bounds.head && store.recheck_epoch(bounds.head).await? {
                    bounds = store.bounds().await?;
                }
                let Bounds { floor, head, epoch } = bounds;
                let epochs = store.epochs(epoch).await?;
                // The lowest retained id less one, or the fork when that id
                // begins an epoch: the oldest point served without a gap.
                let floor = epochs.before(floor + 1);
                // The oldest point one resume may replay from: retained
                // history, and for a stream at most max_replay events back
                // (mercure's maxHistoryScan: a reconnect cannot force an
                // unbounded scan).
                let cap = match start {
                    Start::Resume(_) => epochs.back(head, options.max_replay),
                    _ => 0,
                };
                let oldest = floor.max(cap);
                let (reason, fork, from) = if let Some(lost) = epochs.lost(requested) {
                    // What the client saw after the fork is gone: it goes on
                    // with every event after the fork that it may still get.
                    (Some(GapReason::HistoryLost), Some(lost.fork), lost.fork.max(oldest))
                } else if requested > head {
                    (Some(GapReason::BeyondHead), None, head.max(position))
                } else if requested < floor {
                    (Some(GapReason::Pruned), None, oldest)
                } else if requested < oldest {
                    (Some(GapReason::ReplayLimit), None, oldest)
                } else {
                    (None, None, requested)
                };
                if let Some(reason) = reason {
                    m::replay_gap(reason.as_str());
                    let available_from = epochs.next_after(if reason == GapReason::BeyondHead { oldest } else { from });
                    gap = Some(Gap { requested, available_from, head, reason, fork });
                }
                from
            }
        };
        let last_sent = match start {
            Start::Resume(id) | Start::After(id) => Some(id),
            Start::Now => None,
        };
        let SessionOptions { transport, kill, heartbeat, read_batch, scan_budget, permit, expires_at, sink, .. } = options;
        let parks = subscription.as_ref().zip(sink).map(|(sub, sink)| sub.attach(sink)).is_some();
        // Past 2106 a token lives as long as u32 seconds reach.
        let expiry = expires_at
            .map(|at| std::num::NonZeroU32::new(u32::try_from(at.max(1)).unwrap_or(u32::MAX)).unwrap_or(std::num::NonZeroU32::MIN));
        Ok(Self {
            broker,
            subscription,
            filter,
            shutdown: core.shutdown_token(),
            kill,
            _permit: permit,
            transport,
            heartbeat,
            beat: None,
            expiry,
            cursor,
            last_sent,
            target: position,
            scanned: 0,
            scan_budget: scan_budget.map_or(0, |b| b.max(1) as u64),
            read_batch: u32::try_from(read_batch.max(1)).unwrap_or(u32::MAX),
            // Until a page was read, nothing is known of the rows' size: the
            // first page is one row, which says it (a row may be 64 KiB).
            row_bytes: u32::MAX,
            pages: 0,
            phase: Phase::Replay,
            parks,
            aside: gap.map(|gap| Box::new(Aside { gap: Some(gap), ..Aside::default() })),
        })
    }

    /// The gap found at open, if any (a transport may announce it before
    /// anything else; otherwise it is the first item).
    pub fn take_gap(&mut self) -> Option<Gap> {
        self.aside.as_mut()?.gap.take()
    }

    /// Every event up to here was delivered or filtered out. A live session
    /// with nothing queued is settled up to the broker's position.
    pub fn cursor(&self) -> EventId {
        if let (Phase::Live, Some(sub)) = (self.phase, &self.subscription) {
            // Read the position before looking at the queue: every frame up
            // to it was queued before the broker published it, if the
            // client was still registered (a detached client's queue gets
            // nothing more while the position goes on).
            let position = self.broker.position();
            if sub.attached() && sub.is_empty() {
                return self.cursor.max(position);
            }
        }
        self.cursor
    }

    fn store(&self) -> &Arc<dyn EventLog> {
        self.broker.store()
    }

    /// The next item; nothing is delivered once the caller's token has
    /// expired: the session ends with [`Item::Expired`] instead.
    pub async fn next(&mut self) -> Item {
        // The last batch's write is done.
        if let Some(aside) = self.aside.as_mut() {
            aside.delivering = None;
        }
        let item = self.next_unspanned().await;
        if let Item::Events { frames, replayed } = &item
            && crate::telemetry::tracer().is_some()
        {
            let span = crate::telemetry::batch(
                "deliver",
                opentelemetry::trace::SpanKind::Consumer,
                frames.iter().map(|f| f.trace.as_ref()),
                vec![
                    opentelemetry::KeyValue::new("messaging.operation.type", "receive"),
                    opentelemetry::KeyValue::new("messaging.batch.message_count", frames.len() as i64),
                    opentelemetry::KeyValue::new("tidings.transport", self.transport),
                    opentelemetry::KeyValue::new("tidings.replayed", *replayed),
                ],
            );
            if let Some(span) = span {
                self.aside.get_or_insert_with(Box::default).delivering = Some(span);
            }
        }
        item
    }

    async fn next_unspanned(&mut self) -> Item {
        if matches!(self.phase, Phase::Done(_)) {
            return self.next_item().await;
        }
        if let Some(budget) = self.filter.take_budget_notice() {
            return Item::FilterBudgetExceeded { budget };
        }
        let before = self.last_sent;
        let item = self.next_item().await;
        match self.expiry {
            Some(at) if expired(at) && !matches!(item, Item::End(_) | Item::Dropped(_)) => {
                // Frames taken but not delivered are not the client's: it
                // resumes after what it received.
                let last_event_id = if matches!(item, Item::Events { .. }) { before } else { self.last_sent };
                self.phase = Phase::Done(End::Over);
                Item::Expired { last_event_id }
            }
            _ => item,
        }
    }

    async fn next_item(&mut self) -> Item {
        if let Some(aside) = self.aside.as_mut() {
            if let Some(gap) = aside.gap.take() {
                return Item::Gap(gap);
            }
            let pending = aside.pending.take();
            self.aside = None;
            if let Some(frames) = pending {
                return Item::Events { frames, replayed: true };
            }
        }
        loop {
            match self.phase {
                Phase::Done(end) => return Item::End(end),
                // Boxed: a page's read is rare beside the live wait, and
                // its state would otherwise take room in every stream's
                // future for the stream's whole life.
                Phase::Replay => {
                    if let Some(item) = Box::pin(self.replay_page()).await {
                        return item;
                    }
                }
                Phase::Live => match std::future::poll_fn(|cx| self.poll_live(cx)).await {
                    None => return Item::Heartbeat,
                    Some(frame) => {
                        if let Some(item) = self.live(frame) {
                            return item;
                        }
                    }
                },
            }
        }
    }

    /// Waits, live, for the next frame or the end of the queue (`Some`) or
    /// for a heartbeat that is due (`None`). One poll function over the
    /// queue and one timer kept for the session's life, moved only when it
    /// fires: a wake-up for a frame touches neither the runtime's timers
    /// nor the shutdown token (at shutdown the broker closes every queue,
    /// which ends the session as [`End::Shutdown`]).
    fn poll_live(&mut self, cx: &mut Context<'_>) -> Poll<Option<Option<Frame>>> {
        let sub = self.subscription.as_mut().expect("a live phase has a subscription");
        // A session that parks is unparked by every poll, its cursor moved
        // past what the broker wrote for it meanwhile (delivered).
        let before = self.cursor;
        let polled = sub.poll_recv_or_park(cx, self.parks.then_some(&mut self.cursor));
        if self.cursor != before {
            self.last_sent = Some(self.cursor);
        }
        if let Poll::Ready(frame) = polled {
            return Poll::Ready(Some(frame));
        }
        let Some(every) = self.heartbeat else { return Poll::Pending };
        // A heartbeat is due an interval after the client last took a frame
        // (or history, or a heartbeat), and at the token's expiry (which
        // [`Session::next`] turns into the end).
        let expiry = self.expiry.map(instant_of);
        let due = || {
            let beat = sub.idle_since() + every;
            expiry.map_or(beat, |at| beat.min(at))
        };
        let beat = self.beat.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due())));
        loop {
            std::task::ready!(beat.as_mut().poll(cx));
            let due = due();
            if due > tokio::time::Instant::now() {
                beat.as_mut().reset(due);
                continue;
            }
            sub.progress();
            return Poll::Ready(None);
        }
    }

    /// One page of history; `None` when the page delivered nothing.
    async fn replay_page(&mut self) -> Option<Item> {
        if self.cursor >= self.target {
            match &self.subscription {
                Some(sub) => {
                    sub.set_live();
                    self.phase = Phase::Live;
                }
                None => self.phase = Phase::Done(End::Over),
            }
            return Some(Item::CaughtUp);
        }
        if self.scan_budget > 0 && self.scanned >= self.scan_budget {
            return Some(Item::ScanLimit);
        }
        // Pages are bounded in bytes as well as rows: a client that stops
        // reading holds one page at most, so a page is sized from the rows
        // seen so far, from FIRST_PAGE_BYTES doubling to REPLAY_PAGE_BYTES.
        let page_bytes = (FIRST_PAGE_BYTES << self.pages).min(REPLAY_PAGE_BYTES);
        self.pages = self.pages.saturating_add(1).min(8);
        let page_rows = (page_bytes / self.row_bytes.max(1) as usize).max(MIN_PAGE_ROWS).min(self.read_batch as usize);
        let mut limit = page_rows.min((self.target - self.cursor) as usize);
        if self.scan_budget > 0 {
            // A bounded scan reads no row past its budget.
            limit = limit.min(usize::try_from(self.scan_budget - self.scanned).unwrap_or(usize::MAX));
        }
        let page = tokio::select! {
            _ = self.shutdown.cancelled() => return Some(self.end(End::Shutdown)),
            page = self.store().read_history(self.cursor, limit) => page,
        };
        let rows = match page {
            Ok(rows) => rows,
            Err(e) => {
                // The client resumes from its last id once the store is back.
                tracing::warn!(error = %crate::report::chain(&e), "replay failed; ending the session");
                return Some(self.end(End::Failed));
            }
        };
        let Some(first) = rows.first() else {
            // Everything up to `target` is committed, so this only happens
            // if history was pruned meanwhile.
            self.cursor = self.target;
            return None;
        };
        if first.id > self.target {
            // Nothing is left up to the target. Either the broker's
            // position lay in a suffix the store lost (the broker ends its
            // clients when it finds that out, and they resume with the gap
            // announced), or retention pruned it all meanwhile: say so.
            let (cursor, target) = (self.cursor, self.target);
            self.cursor = target;
            let lost = self.store().epochs(0).await.is_ok_and(|epochs| epochs.lost(target).is_some());
            if lost || first.id <= self.next_after(cursor).await {
                return None;
            }
            m::replay_gap(GapReason::Pruned.as_str());
            return Some(Item::Gap(Gap {
                requested: cursor,
                available_from: first.id,
                head: target,
                reason: GapReason::Pruned,
                fork: None,
            }));
        }
        let mut gap = None;
        if first.id > self.cursor + 1 && first.id > self.next_after(self.cursor).await {
            // Retention pruned history while this client was replaying: say
            // so instead of skipping silently (a new epoch's first id after
            // its fork is no gap).
            m::replay_gap(GapReason::Pruned.as_str());
            gap = Some(Gap { requested: self.cursor, available_from: first.id, head: self.target, reason: GapReason::Pruned, fork: None });
        }
        self.scanned += rows.len() as u64;
        let page_bytes: usize = rows.iter().map(|r| r.body.len()).sum();
        self.row_bytes = u32::try_from(page_bytes / rows.len()).unwrap_or(u32::MAX).max(1);
        let mut frames = Vec::with_capacity(rows.len());
        let target = self.target;
        for row in rows.into_iter().take_while(|r| r.id <= target) {
            self.cursor = row.id;
            match Event::from_stored(row.id, &row.body, row.recorded_ms) {
                Ok(event) if self.filter.matches(&event.body) => frames.push(Frame::from_event(event)),
                Ok(_) => {}
                Err(e) => tracing::error!(id = row.id, error = %crate::report::chain(&e), "skipping an unreadable event row"),
            }
        }
        if let Some(sub) = &self.subscription {
            sub.progress();
        }
        if let Some(last) = frames.last() {
            self.last_sent = Some(last.id);
        }
        match (gap, frames.is_empty()) {
            (Some(gap), true) => Some(Item::Gap(gap)),
            (Some(gap), false) => {
                // The gap first, the page next.
                self.aside.get_or_insert_with(Box::default).pending = Some(frames);
                Some(Item::Gap(gap))
            }
            (None, true) => None,
            (None, false) => Some(Item::Events { frames, replayed: true }),
        }
    }

    /// The id after `id` in the log ([`crate::store::Epochs::next_after`]);
    /// `id + 1` if the epochs cannot be read.
    async fn next_after(&self, id: EventId) -> EventId {
        match self.store().epochs(0).await {
            Ok(epochs) => epochs.next_after(id),
            Err(_) => id + 1,
        }
    }

    /// What a live frame (or the end of the queue) delivers; `None` when
    /// nothing is to be delivered yet.
    fn live(&mut self, frame: Option<Frame>) -> Option<Item> {
        let sub = self.subscription.as_mut().expect("a live phase has a subscription");
        let Some(first) = frame else {
            return match sub.detached() {
                Detached::Lagged => {
                    // Behind while replaying: register again and catch up
                    // from the store.
                    self.resubscribe();
                    None
                }
                reason @ (Detached::QueueFull | Detached::NoProgress) => {
                    self.phase = Phase::Done(End::Over);
                    Some(Item::Dropped(Dropped { reason: reason.drop_reason()?, last_event_id: self.last_sent, queue: self.queue_len() }))
                }
                Detached::Closed => Some(self.end(End::Shutdown)),
            };
        };
        // Nothing is delivered after the token's expiry; the client resumes
        // after the last event it received (the broker's writes included).
        if self.expiry.is_some_and(expired) {
            self.phase = Phase::Done(End::Over);
            return Some(Item::Expired { last_event_id: self.last_sent });
        }
        let mut frames = Vec::new();
        let mut bytes = 0;
        let mut next = Some(first);
        while let Some(frame) = next {
            if frame.id > self.cursor {
                self.cursor = frame.id;
                bytes += frame.envelope.len();
                frames.push(frame);
            }
            next = if bytes < COALESCE_BYTES { sub.try_recv() } else { None };
        }
        let last = frames.last()?;
        self.last_sent = Some(last.id);
        Some(Item::Events { frames, replayed: false })
    }

    fn queue_len(&self) -> usize {
        self.broker.queue_len()
    }

    fn resubscribe(&mut self) {
        // Register anew before the old registration goes; its queue is
        // drained already.
        let fresh = self.broker.subscribe(self.filter.clone(), subscribe(&self.kill, self.transport, true));
        if let Some(sink) = self.subscription.as_ref().and_then(Subscription::sink) {
            fresh.attach(sink);
        }
        self.target = fresh.position();
        self.subscription = Some(fresh);
        self.phase = Phase::Replay;
    }

    fn end(&mut self, end: End) -> Item {
        self.phase = Phase::Done(end);
        Item::End(end)
    }
}

fn subscribe(kill: &Option<CancellationToken>, transport: &'static str, catching_up: bool) -> SubscribeOptions {
    SubscribeOptions { kill: kill.clone(), transport, catching_up }
}

#[cfg(test)]
mod tests;
