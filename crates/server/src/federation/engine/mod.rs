//! The subscription engine: follows the log's tree changes in order, matches
//! each against the subscriptions, enforces limits and deliver-token expiry
//! (docs/ref-subscriptions.md, "Limits"), and appends one
//! `subscription.notification` per delivery, addressed (`ref`) to the
//! subscription's inbox ("Notifications"). Suppressed notifications bind
//! chain-error markers ("Chain-error markers"); terminations delete the
//! entity.
//!
//! Exactly once: everything a step produces is committed in one transaction
//! with the engine's cursor (compare-and-set), so a crash neither loses nor
//! repeats a notification, and per-subscription order is log (commit) order.
//! With several processes on one database exactly one engine runs (the
//! store's [`FederationStore::engine_lead`](crate::store::FederationStore::engine_lead)); the cursor's compare-and-set keeps a
//! deposed leader from committing twice.
//!
//! The index is a cache: at start (and after any failed step) it is rebuilt
//! from the subscription entities, rewound to the engine's cursor through
//! the content store, so it holds exactly the subscriptions that existed at
//! that point of the log. Subscriptions are matched in id order; limit
//! windows use the changes' commit times, so a replayed backlog decides as
//! the live engine would have. Each subscription's delivered count and
//! `rate_limit` window (a [`Tally`]) are committed with the cursor, so a
//! restarted engine, or another process taking over, decides exactly as the
//! one before it would have.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

mod deliver;

use super::courier::{Lane, Lanes};
use super::marker::Marker;
use super::signed::{self, SignedChange, Transition};
use super::{DIR, MARKER_DIR, PathSubscription, Subscriptions, subscription_id_of};
use crate::store::{Condition, EngineCommit, EngineEffect, NewRecord, Record, Store, StoreError, Tally, TreeWrite};
use deliver::is_marker_path;
use tidings_protocol::event::{EventBody, EventId, Visibility, names};
use tidings_protocol::glob::Glob;
use tidings_protocol::tree::change_event;

/// The engine's pace (settings with documented defaults).
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Tree changes read per step (`TIDINGS_ENGINE_BATCH`).
    pub batch: usize,
    /// The cursor is committed at least this often while only scanning (so
    /// retention may prune behind it), and at every step that produced
    /// output (`TIDINGS_ENGINE_IDLE_COMMIT`).
    pub idle_commit: Duration,
    /// How often a process that does not lead tries to take the lead, which
    /// bounds a takeover after the leader stops (`TIDINGS_ENGINE_LEAD_RETRY`).
    pub lead_retry: Duration,
    /// How notifications reach other servers' inboxes.
    pub courier: super::courier::CourierSettings,
    /// How mirrors keep up.
    pub mirror: super::mirror::MirrorSettings,
}

impl EngineSettings {
    /// The engine's, the courier's and the mirrors' settings from
    /// federation's section; peers are told to reach this server at
    /// `public_url`.
    pub fn from_settings(settings: &crate::config::FederationSettings, public_url: &str) -> Self {
        let allow = std::sync::Arc::new(settings.peer_allow.clone());
        Self {
            batch: settings.engine_batch as usize,
            idle_commit: settings.engine_idle_commit,
            lead_retry: settings.engine_lead_retry,
            courier: super::courier::CourierSettings {
                attempts: settings.peer_delivery_attempts,
                timeout: settings.peer_timeout,
                evict_after: settings.peer_evict_after,
                allow: allow.clone(),
            },
            mirror: super::mirror::MirrorSettings {
                token_ttl: settings.mirror_token_ttl,
                reconcile: settings.mirror_reconcile,
                timeout: settings.peer_timeout,
                public_url: public_url.to_owned(),
                repair_timeout: settings.mirror_repair_timeout,
                allow,
            },
        }
    }
}

/// Longest delegation chain walked for a token's expiry.
const MAX_CHAIN: usize = tidings_protocol::tree::capability::MAX_CHAIN;

const TREE_TYPES: [&str; 3] = [names::TREE_CREATED, names::TREE_UPDATED, names::TREE_DELETED];

/// Why a step stopped.
#[derive(Debug, thiserror::Error)]
pub(super) enum StepError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("another engine moved the cursor")]
    Deposed,
}

/// One tree change as the engine reads it.
#[derive(Debug, Deserialize)]
struct Change {
    uri: String,
    #[serde(default)]
    hash: Option<String>,
    #[serde(default)]
    previous_hash: Option<String>,
    #[serde(default)]
    chain_id: Option<String>,
    /// On a change a mirror applied: the signed changes it came with.
    #[serde(default)]
    signed: Vec<SignedChange>,
    /// The trace context the change event was stored with (its envelope's,
    /// not its payload's): its notifications carry it on.
    #[serde(skip)]
    trace: Option<tidings_protocol::trace::TraceContext>,
}

impl Change {
    fn transition(&self) -> Transition<'_> {
        Transition { uri: &self.uri, hash: self.hash.as_deref(), previous_hash: self.previous_hash.as_deref() }
    }
}

#[derive(Debug, Deserialize)]
struct ChangeRecord {
    event_type: String,
    payload: Change,
    #[serde(default)]
    traceparent: Option<String>,
    #[serde(default)]
    tracestate: Option<String>,
}

fn parse(record: &Record) -> Option<(&'static str, Change)> {
    let r: ChangeRecord = serde_json::from_str(&record.body).ok()?;
    let kind = match r.event_type.as_str() {
        names::TREE_CREATED => "created",
        names::TREE_UPDATED => "updated",
        names::TREE_DELETED => "deleted",
        _ => return None,
    };
    let mut change = r.payload;
    change.trace = r.traceparent.map(|traceparent| tidings_protocol::trace::TraceContext { traceparent, tracestate: r.tracestate });
    Some((kind, change))
}

/// A subscription in the index.
#[derive(Debug)]
struct Active {
    sub: PathSubscription,
    hash: String,
    glob: Glob,
    /// The earliest expiry in its deliver token's chain.
    token_expires_at: Option<u64>,
    delivered: i64,
    /// The `rate_limit` window: deliveries per second of commit time,
    /// `(second, count)` oldest first; pruned to the last minute at every
    /// delivery, so it never holds more than 61 entries.
    recent: VecDeque<(i64, u32)>,
}

impl Active {
    fn tally(&self) -> Tally {
        Tally { delivered: self.delivered, window: self.recent.iter().copied().collect() }
    }

    /// Records a delivery at commit time `at` (ms).
    fn delivered_at(&mut self, at: i64) {
        self.delivered += 1;
        let second = at.div_euclid(1000);
        prune(&mut self.recent, second);
        match self.recent.back_mut() {
            Some((s, n)) if *s == second => *n = n.saturating_add(1),
            _ => self.recent.push_back((second, 1)),
        }
    }
}

/// Drops the seconds that are no longer in the minute ending with `second`.
fn prune(window: &mut VecDeque<(i64, u32)>, second: i64) {
    while window.front().is_some_and(|(s, _)| *s <= second - 60) {
        window.pop_front();
    }
}

/// One lead's index and cursor.
#[derive(Debug)]
pub(super) struct State {
    /// The cursor as committed.
    committed: EventId,
    /// Everything up to here has been considered.
    scanned: EventId,
    subs: BTreeMap<String, Active>,
    last_commit: Instant,
    /// Zeroes the subscriptions gauge when the lead ends.
    _gauge: ResetGauge,
}

/// What one step produces.
#[derive(Default)]
struct Output {
    effects: Vec<EngineEffect>,
    counts: Vec<(String, Option<Tally>)>,
    outcomes: BTreeMap<&'static str, u64>,
}

/// What a step did.
enum Progress {
    More,
    Idle,
}

/// The engine, driven by the [`Supervisor`](super::supervisor::Supervisor)
/// while this process leads.
#[derive(Debug)]
pub(super) struct Engine {
    store: Arc<dyn Store>,
    handler: Arc<Subscriptions>,
    follow: watch::Receiver<EventId>,
    settings: EngineSettings,
    /// The remote subscriptions, for the courier.
    lanes: watch::Sender<Lanes>,
    /// Bumped at every change under `system/mirror/`.
    mirrors: watch::Sender<u64>,
}

impl Engine {
    /// An engine woken by `follow` (the broker's position).
    pub(super) fn new(
        store: Arc<dyn Store>,
        handler: Arc<Subscriptions>,
        follow: watch::Receiver<EventId>,
        settings: EngineSettings,
    ) -> Self {
        Self { store, handler, follow, settings, lanes: watch::channel(Lanes::default()).0, mirrors: watch::channel(0).0 }
    }

    /// The broker's position as the engine follows it, for its siblings:
    /// a clone of the receiver the engine waits on, so they start from the
    /// position it has seen rather than waking at once for an old change.
    pub(super) fn follow(&self) -> watch::Receiver<EventId> {
        self.follow.clone()
    }

    /// What the courier is to deliver: the remote subscriptions in the
    /// index, republished whenever they change.
    pub(super) fn lanes(&self) -> watch::Receiver<Lanes> {
        self.lanes.subscribe()
    }

    /// Bumped at every change under `system/mirror/`, for the mirrors.
    pub(super) fn mirror_changes(&self) -> watch::Receiver<u64> {
        self.mirrors.subscribe()
    }

    /// Starts a lead: loads the index and publishes its remote
    /// subscriptions, which the courier then delivers.
    pub(super) async fn begin(&mut self) -> Result<State, StepError> {
        let state = self.load().await?;
        tracing::info!(cursor = state.committed, subscriptions = state.subs.len(), "subscription engine leads");
        self.publish_lanes(&state, &HashMap::new());
        Ok(state)
    }

    /// Steps while this process leads; returns when `cancel` fires (after
    /// committing what was scanned) or when another process took the lead.
    pub(super) async fn steps(&mut self, state: &mut State, cancel: &CancellationToken) -> Result<(), StepError> {
        let mut checked_lead = Instant::now();
        loop {
            match self.step(state).await? {
                Progress::More => continue,
                Progress::Idle => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => {
                    if state.scanned != state.committed {
                        self.commit(state, Vec::new(), Vec::new()).await?;
                    }
                    return Ok(());
                }
                _ = self.follow.changed() => {}
                _ = tokio::time::sleep(self.settings.idle_commit) => {}
            }
            if checked_lead.elapsed() >= self.settings.lead_retry {
                checked_lead = Instant::now();
                if !self.store.engine_lead().await? {
                    return Ok(());
                }
            }
        }
    }

    /// The index as of the committed cursor: the stored subscriptions,
    /// rewound through every change to `system/subscription/*` after it.
    async fn load(&self) -> Result<State, StoreError> {
        let (cursor, counts) = self.store.engine_state().await?;
        let mut at: HashMap<String, Option<(String, String)>> = self
            .store
            .tree_entries_below(DIR, super::MAX_SUBSCRIPTIONS)
            .await?
            .into_iter()
            .map(|e| (e.path, Some((e.entity, e.hash))))
            .collect();
        let mut touched = Vec::new();
        let mut after = cursor;
        loop {
            let (records, reached) = self.store.engine_changes(after, &TREE_TYPES, self.settings.batch).await?;
            for record in &records {
                if let Some((_, change)) = parse(record)
                    && subscription_id_of(&change.uri).is_some()
                {
                    touched.push((change.uri, change.previous_hash));
                }
            }
            if records.len() < self.settings.batch {
                break;
            }
            after = reached;
        }
        for (uri, previous) in touched.into_iter().rev() {
            let before = match previous {
                Some(hash) => self.store.content_get(&hash).await?.map(|body| (body, hash)),
                None => None,
            };
            at.insert(uri, before);
        }
        let mut subs = BTreeMap::new();
        for (path, entry) in at {
            let Some((entity, hash)) = entry else { continue };
            let Some(id) = subscription_id_of(&path) else { continue };
            let tally = counts.get(id).cloned().unwrap_or_default();
            if let Some(active) = self.activate(&entity, hash, tally).await?
                && active.sub.subscription_id == id
            {
                subs.insert(active.sub.subscription_id.clone(), active);
            }
        }
        Ok(State { committed: cursor, scanned: cursor, subs, last_commit: Instant::now(), _gauge: ResetGauge })
    }

    async fn activate(&self, entity: &str, hash: String, tally: Tally) -> Result<Option<Active>, StoreError> {
        let Some(sub) = PathSubscription::from_json(entity) else { return Ok(None) };
        let Ok(glob) = Glob::new_path(&sub.pattern) else { return Ok(None) };
        let token_expires_at = self.chain_expiry(&sub.deliver_token).await?;
        Ok(Some(Active { sub, hash, glob, token_expires_at, delivered: tally.delivered, recent: tally.window.into() }))
    }

    /// The earliest `expires_at` along a stored token's delegation chain.
    async fn chain_expiry(&self, token: &str) -> Result<Option<u64>, StoreError> {
        let mut earliest: Option<u64> = None;
        let mut next = Some(token.to_owned());
        for _ in 0..MAX_CHAIN {
            let Some(hash) = next.take() else { break };
            let Some(body) = self.store.content_get(&hash).await? else { break };
            let Ok(entity) = serde_json::from_str::<Value>(&body) else { break };
            if let Some(t) = entity["data"]["expires_at"].as_u64() {
                earliest = Some(earliest.map_or(t, |e| e.min(t)));
            }
            next = entity["data"]["parent"].as_str().map(str::to_owned);
        }
        Ok(earliest)
    }

    async fn step(&self, state: &mut State) -> Result<Progress, StepError> {
        let (records, reached) = self.store.engine_changes(state.scanned, &TREE_TYPES, self.settings.batch).await?;
        let mut out = Output::default();
        let mut terminated = false;
        let mut since = HashMap::new();
        let mut lanes_changed = false;
        for record in &records {
            let Some((kind, change)) = parse(record) else { continue };
            if !is_marker_path(&change.uri) {
                terminated |= self.fire(state, record, kind, &change, &mut out).await?;
            }
            // Register after matching: a subscription hears of changes
            // committed after its own creation.
            if change.uri.starts_with(super::mirror::PREFIX) {
                self.mirrors.send_modify(|n| *n += 1);
            }
            if let Some(id) = subscription_id_of(&change.uri) {
                self.register(state, id, &change, &mut out).await?;
                lanes_changed = true;
                since.insert(id.to_owned(), record.id);
            }
        }
        // Published before the commit that may carry their first
        // notifications, so the courier never starts a lane past them.
        if lanes_changed || terminated {
            self.publish_lanes(state, &since);
        }
        crate::metrics::subscriptions(state.subs.len());
        let full = records.len() == self.settings.batch;
        state.scanned = reached;
        let Output { effects, mut counts, outcomes } = out;
        // One row per subscription: its last tally of the step.
        let mut seen = std::collections::HashSet::new();
        counts.reverse();
        counts.retain(|(id, _)| seen.insert(id.clone()));
        if !(effects.is_empty() && counts.is_empty() && state.last_commit.elapsed() < self.settings.idle_commit) {
            self.commit(state, effects, counts).await?;
        }
        // Counted once committed (a failed step is redone after a reload).
        for (outcome, n) in outcomes {
            crate::metrics::notifications(outcome, n);
        }
        if terminated && let Err(e) = self.handler.refresh_config().await {
            tracing::warn!(error = %crate::report::chain(&e), "could not refresh system/config/subscription");
        }
        Ok(if full { Progress::More } else { Progress::Idle })
    }

    /// Hands the remote subscriptions in the index to the courier; `since`
    /// holds where in the log the ones registered by this step were created.
    fn publish_lanes(&self, state: &State, since: &HashMap<String, EventId>) {
        let lanes: BTreeMap<String, Lane> = state
            .subs
            .values()
            .filter_map(|a| {
                let (peer, _) = tidings_protocol::peer::parse_remote(&a.sub.deliver_uri)?;
                let id = &a.sub.subscription_id;
                Some((
                    id.clone(),
                    Lane {
                        subscription_id: id.clone(),
                        deliver_uri: a.sub.deliver_uri.clone(),
                        peer: peer.to_owned(),
                        operation: a.sub.deliver_operation.clone(),
                        deliver_token: a.sub.deliver_token.clone(),
                        deliver_chain: a.sub.deliver_chain.clone(),
                        since: since.get(id).copied(),
                    },
                ))
            })
            .collect();
        self.lanes.send_if_modified(|current| {
            let changed = **current != lanes;
            if changed {
                *current = Arc::new(lanes);
            }
            changed
        });
    }

    /// Follows a change to `system/subscription/{id}` in the index.
    async fn register(&self, state: &mut State, id: &str, change: &Change, out: &mut Output) -> Result<(), StoreError> {
        let Some(hash) = &change.hash else {
            state.subs.remove(id);
            out.counts.push((id.to_owned(), None));
            return Ok(());
        };
        if state.subs.get(id).is_some_and(|a| a.hash == *hash) {
            return Ok(());
        }
        let old = state.subs.remove(id);
        let tally = old.as_ref().map(Active::tally).unwrap_or_default();
        let Some(entity) = self.store.content_get(hash).await? else { return Ok(()) };
        if let Some(active) = self.activate(&entity, hash.clone(), tally).await?
            && active.sub.subscription_id == id
        {
            state.subs.insert(id.to_owned(), active);
        }
        Ok(())
    }

    async fn commit(&self, state: &mut State, effects: Vec<EngineEffect>, counts: Vec<(String, Option<Tally>)>) -> Result<(), StepError> {
        let notified = effects.iter().filter(|e| matches!(e, EngineEffect::Append(_))).count();
        let commit = EngineCommit { from: state.committed, to: state.scanned, effects, counts };
        if !self.store.engine_commit(commit).await? {
            return Err(StepError::Deposed);
        }
        state.committed = state.scanned;
        state.last_commit = Instant::now();
        if notified > 0 {
            crate::metrics::events_published(names::SUBSCRIPTION_NOTIFICATION, notified as u64);
        }
        Ok(())
    }
}

/// Zeroes the subscriptions gauge when this process stops leading.
#[derive(Debug)]
struct ResetGauge;

impl Drop for ResetGauge {
    fn drop(&mut self) {
        crate::metrics::subscriptions(0);
    }
}

#[cfg(test)]
mod tests {
    use super::deliver::{Verdict, check};
    use super::*;
    use crate::federation::Limits;

    fn active(limits: Option<Limits>, token_expires_at: Option<u64>) -> Active {
        let sub = PathSubscription {
            subscription_id: "s".into(),
            pattern: "a/*".into(),
            events: vec!["created".into()],
            deliver_uri: "system/inbox/x".into(),
            deliver_operation: "receive".into(),
            subscriber_identity: "sha256:a".into(),
            deliver_token: "sha256:t".into(),
            include_payload: false,
            created_at: 1_000,
            limits,
            deliver_chain: vec![],
            relay_endpoint: None,
            accountable: None,
        };
        Active {
            glob: Glob::new_path(&sub.pattern).unwrap(),
            sub,
            hash: "h".into(),
            token_expires_at,
            delivered: 0,
            recent: VecDeque::new(),
        }
    }

    fn deliver(a: &mut Active, at: i64) -> &'static str {
        match check(a, at) {
            Verdict::Deliver => {
                a.delivered_at(at);
                "deliver"
            }
            Verdict::Drop(r) | Verdict::Terminate(r) => r,
        }
    }

    #[test]
    fn max_events_terminates_on_the_first_change_after_n() {
        let mut a = active(Some(Limits { max_events: Some(2), ..Limits::default() }), None);
        assert_eq!([deliver(&mut a, 2_000), deliver(&mut a, 2_001), deliver(&mut a, 2_002)], ["deliver", "deliver", "max_events_reached"]);
    }

    #[test]
    fn max_duration_is_measured_from_creation_at_commit_time() {
        let mut a = active(Some(Limits { max_duration_ms: Some(500), ..Limits::default() }), None);
        assert_eq!(deliver(&mut a, 1_499), "deliver");
        assert_eq!(deliver(&mut a, 1_500), "max_duration_reached");
    }

    #[test]
    fn rate_limit_is_a_sliding_minute_and_never_terminates() {
        let mut a = active(Some(Limits { rate_limit: Some(2), ..Limits::default() }), None);
        let got: Vec<_> = [0, 10, 20, 59_999, 60_000, 60_011].iter().map(|t| deliver(&mut a, 100_000 + t)).collect();
        // The minute is counted in whole seconds: the slots taken in second
        // 100 are free again from second 160.
        assert_eq!(got, ["deliver", "deliver", "rate_limited", "rate_limited", "deliver", "deliver"]);
    }

    #[test]
    fn the_window_stays_small_without_a_rate_limit() {
        let mut a = active(None, None);
        for t in 0..10_000 {
            assert_eq!(deliver(&mut a, t * 100), "deliver");
        }
        assert!(a.recent.len() <= 61, "{} seconds kept", a.recent.len());
        assert_eq!(a.recent.iter().map(|(_, n)| n).sum::<u32>(), 600, "the last minute's 600 deliveries");
    }

    #[test]
    fn an_expired_deliver_token_terminates() {
        let mut a = active(None, Some(5_000));
        assert_eq!(deliver(&mut a, 4_999), "deliver");
        assert_eq!(deliver(&mut a, 5_000), "deliver_token_expired");
    }

    #[test]
    fn paths() {
        assert_eq!(subscription_id_of("system/subscription/abc"), Some("abc"));
        assert_eq!(subscription_id_of("system/subscription/abc/x"), None);
        assert_eq!(subscription_id_of("system/subscriptions/abc"), None);
        assert!(is_marker_path("system/runtime/chain-errors/lost/c/s/r/h"));
        assert!(!is_marker_path("system/runtime/chain-errors/lostx"));
    }
}
