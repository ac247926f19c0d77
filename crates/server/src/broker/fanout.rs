//! One fan-out round: the rows a read or a hand-off brings, parsed once
//! outside the lock, then, under it, each event offered to the clients the
//! index names, its frame built once and queued for every client whose
//! filter matches; a queue that refuses marks its client for eviction
//! after the round (lagged if it was behind, slow if it was backed up).
//! Frames for parked readers (`queue`'s module docs) are written to their
//! streams after the round, off the lock.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, SpanKind};

use super::{Broker, ClientState, Clients, Detached, Frame, Slot, frame, index, queue};
use crate::filter::MatchInput;
use crate::metrics as m;
use crate::store::Record;
use tidings_protocol::event::{Event, EventId};

impl Broker {
    /// Fans `rows` (in id order) out to every matching client. Rows at or
    /// below the position went out already (handed off while the broker
    /// read them) and are skipped. With `next_only` the rows are taken only
    /// if they leave no id out (the first is at most the next one): whether
    /// they were.
    pub(super) fn fan_out(&self, rows: Vec<Record>, next_only: bool) -> bool {
        let (Some(first), Some(last)) = (rows.first().map(|r| r.id), rows.last().map(|r| r.id)) else { return true };
        {
            let mut clients = self.lock();
            if let Some(taken) = settled(&clients, first, last, next_only) {
                return taken;
            }
            if clients.map.is_empty() {
                // Nobody to match: nothing is parsed, and the position moves
                // on under the lock (a client registering now learns it).
                self.record_lags(&rows);
                self.advance(&mut clients, last);
                return true;
            }
        }
        let mut events = self.parse(rows);
        let mut guard = self.lock();
        let clients = &mut *guard;
        // Checked again: the broker's own read may have gone out meanwhile.
        if let Some(taken) = settled(clients, first, last, next_only) {
            return taken;
        }
        let position = clients.position;
        events.retain(|e| e.id > position);
        clients.rounds += 1;
        let mut round =
            Round { number: clients.rounds, bound: self.shared.settings.client_queue, now: None, evict: Vec::new(), flush: Vec::new() };
        {
            let mut candidates = Vec::new();
            for event in &events {
                self.offer(&clients.index, event, &mut round, &mut candidates);
            }
        }
        for (id, reason) in round.evict {
            if let Some(slot) = clients.remove(id) {
                self.detach(&slot, reason);
            }
        }
        self.advance(clients, last);
        drop(guard);
        self.flush(round.flush);
        true
    }

    /// Records each row's lag (commit to fan-out) and keeps the last.
    fn record_lags(&self, rows: &[Record]) {
        let now_wall = chrono::Utc::now().timestamp_millis();
        let lags = m::broker_lag();
        for row in rows {
            let lag = (now_wall - row.recorded_ms).max(0) as f64 / 1000.0;
            lags.record(lag);
            self.shared.lag_ms.store((lag * 1000.0) as u64, Ordering::Relaxed);
        }
    }

    /// The rows as events (outside the lock), their lags recorded.
    fn parse(&self, rows: Vec<Record>) -> Vec<Event> {
        self.record_lags(&rows);
        let mut events = Vec::with_capacity(rows.len());
        for row in rows {
            match Event::from_stored(row.id, &row.body, row.recorded_ms) {
                Ok(event) => events.push(event),
                // A row that does not parse was not written by this version of
                // tidings; skipping it keeps every other client live.
                Err(e) => tracing::error!(id = row.id, error = %crate::report::chain(&e), "skipping an unreadable event row"),
            }
        }
        events
    }

    /// Queues `event` for every client the index names whose full filter
    /// matches it (minus the type check when the index already settled
    /// it); a client whose queue refuses it is marked for eviction, and
    /// gets no later frame of this round.
    fn offer<'a>(
        &self,
        index: &'a index::FilterIndex<Arc<Slot>>,
        event: &Event,
        round: &mut Round,
        candidates: &mut Vec<index::Candidate<'a, Arc<Slot>>>,
    ) {
        let input = MatchInput::new(&event.body);
        index.candidates(&input, candidates);
        // Built once per event, and only if someone wants it.
        let mut frame = None;
        // The event's fan-out span, when spans are exported and it is
        // traced: how many clients it was queued for.
        let span = frame::trace_of(event).and_then(|parent| {
            crate::telemetry::start(
                "fan-out",
                SpanKind::Internal,
                Some(&parent),
                &[],
                vec![KeyValue::new("messaging.message.id", event.id)],
            )
        });
        let mut queued = 0i64;
        for &(id, slot, type_matched) in candidates.iter() {
            if !slot.filter.matches_after_types(&input, type_matched) || round.evict.iter().any(|(e, _)| *e == id) {
                continue;
            }
            let frame = frame.get_or_insert_with(|| Frame::of(event));
            match self.push(&slot.state, frame.clone(), round) {
                Ok(true) => queued += 1,
                Ok(false) => {}
                Err(reason) => round.evict.push((id, reason)),
            }
        }
        if let Some(mut span) = span {
            span.set_attribute(KeyValue::new("tidings.clients", queued));
            span.set_attribute(KeyValue::new("tidings.bytes", queued * event.envelope.len() as i64));
        }
    }

    /// Queues one frame for one client: whether it was queued (`false`: the
    /// client is gone), or why the client must go.
    #[inline]
    fn push(&self, state: &Arc<ClientState>, frame: Frame, round: &mut Round) -> Result<bool, Detached> {
        match state.queue.push(frame, round.bound) {
            Ok(queue::Pushed { was_empty, flush }) => {
                if flush && was_empty {
                    // Written once the round is over, off the lock.
                    round.flush.push(state.clone());
                }
                if was_empty {
                    // A client that had taken everything is not behind:
                    // the no-progress clock starts with this frame, not at
                    // its last take (which, for an idle client, may be long
                    // ago). Read once per round, and only if a queue needs it.
                    state.last_progress_ms.store(*round.now.get_or_insert_with(|| self.now_ms()), Ordering::Relaxed);
                }
                if state.round.swap(round.number, Ordering::Relaxed) == round.number {
                    state.round_pushed.fetch_add(1, Ordering::Relaxed);
                } else {
                    state.round_pushed.store(1, Ordering::Relaxed);
                }
                Ok(true)
            }
            Err(queue::Refused::Full) => {
                // Behind, not slow: still replaying, or the whole queue was
                // filled by this round (a burst larger than the queue). Such
                // a client catches up from the store; one whose queue was
                // already backed up before this round is slow and is dropped.
                let burst =
                    state.round.load(Ordering::Relaxed) == round.number && state.round_pushed.load(Ordering::Relaxed) >= round.bound as u64;
                Err(if burst || state.catching_up.load(Ordering::Acquire) { Detached::Lagged } else { Detached::QueueFull })
            }
            Err(queue::Refused::Closed) => Ok(false),
        }
    }
}

/// One fan-out round: its number, the queue bound, the time (read once,
/// and only if a queue needs it) and the clients to evict after it.
struct Round {
    number: u64,
    bound: usize,
    now: Option<u64>,
    evict: Vec<(u64, Detached)>,
    /// Parked readers with frames to write.
    flush: Vec<Arc<ClientState>>,
}

/// Parked readers one write task takes: a round's writes are spread over
/// tasks of this many, which the runtime's workers share (64 gave a lower
/// p99 than 256 at 1,000 clients: docs/benchmarks.md, "What parking a
/// waiting stream saved").
const FLUSH_SHARE: usize = 64;

impl Broker {
    /// Writes what the round queued for parked readers to their streams,
    /// on the runtime's workers, not in the caller: a hand-off fans out in
    /// the thread that committed (the embedded store's writer), which must
    /// not wait on a thousand sockets. The tasks are the broker's own and
    /// end by themselves (a write never waits).
    fn flush(&self, mut states: Vec<Arc<ClientState>>) {
        let write = |share: Vec<Arc<ClientState>>| {
            for state in share {
                state.queue.flush();
            }
        };
        let Some(runtime) = self.shared.runtime.as_ref() else { return write(states) };
        while !states.is_empty() {
            let share = states.split_off(states.len().saturating_sub(FLUSH_SHARE));
            runtime.spawn(async move { write(share) });
        }
    }
}

/// Whether rows `first..=last` are settled without a fan-out: not taken
/// (`Some(false)`) when `next_only` and they would leave an id out; taken
/// (`Some(true)`) when they all went out already.
fn settled(clients: &Clients, first: EventId, last: EventId, next_only: bool) -> Option<bool> {
    if next_only && first > clients.position + 1 {
        return Some(false);
    }
    (last <= clients.position).then_some(true)
}
