//! The courier: carries notifications addressed to other servers' inboxes
//! (`entity://<peer>/...`) to those peers, as signed `receive` EXECUTEs on
//! their `POST /v1/execute`.
//!
//! The log is the queue. The engine appends a remote subscription's
//! notifications to this server's log like any other; the courier runs one
//! lane per remote subscription, which delivers its subscription's
//! notifications one at a time in log order and moves its durable cursor (a
//! device cursor owned by `tidings:courier`) past each once it is
//! delivered or given up. One dispatcher reads each new notification once
//! and hands it to its lane's bounded queue; a lane whose queue is full (it
//! is retrying a peer that is down, or the peer is slow) is marked behind
//! and reads the log itself from its cursor until it has caught up, then is
//! fed again, so a peer that is down costs a bounded queue, not a backlog
//! in memory, and a lane retrying never holds up another lane or local
//! inboxes.
//!
//! A failed attempt (transport error, timeout, 5xx, 408, 429) is retried
//! with exponential backoff and jitter up to the attempt budget
//! (`TIDINGS_PEER_DELIVERY_ATTEMPTS`); any other answer than 200 is a
//! refusal, and final.
//! Either way the notification binds a chain-error marker
//! (docs/ref-subscriptions.md, "Chain-error markers"; reason the peer's
//! error code or `delivery_failed`) and the lane goes on with the
//! next. The receiver recognises a retry by the delivery's `sequence` (the
//! notification's id in this log), so a crash between a delivery and the
//! cursor moving repeats nothing at the peer.
//!
//! The courier runs in the process that leads the engine, and learns the
//! remote subscriptions from it: a subscription registered while the engine
//! leads starts its lane at its creation in the log; one found at start-up
//! without a stored cursor (a crash before its lane first stored one)
//! rescans the log from its floor, which delivers nothing twice.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

mod send;

use super::inbox::NOTIFICATION;
use super::marker::Marker;
use crate::store::{Condition, Record, Store, StoreError, TreeOutcome, TreeWrite};
use send::Sender;
use tidings_protocol::event::{EventId, names};
use tidings_protocol::identity::ServerIdentity;
use tidings_protocol::peer::protocol::{Execute, PeerError};
use tidings_protocol::retry::{now_ms, sleep_or_stop};
use tidings_protocol::tree::change_event;

/// The owner of the courier's cursors in the device cursor table.
const CURSOR_OWNER: &str = crate::store::COURIER_CURSORS;
/// Notifications a lane that is behind reads per step.
const BATCH: usize = 256;
/// Notifications the dispatcher reads per step.
const DISPATCH_BATCH: usize = 512;
/// Notifications queued for a lane before it is left to read the log itself.
const FEED_QUEUE: usize = 256;
/// A lane stores its cursor at most this often (a retry after a crash is
/// recognised by the peer, so a cursor a little behind repeats nothing).
const ACK_EVERY: Duration = Duration::from_millis(200);

/// How often an idle lane moves its position up to what the dispatcher
/// decided, and the dispatcher polls when no wake-up came.
const SKIP_COMMIT: Duration = Duration::from_secs(1);

/// How hard the courier tries (settings).
#[derive(Debug, Clone)]
pub struct CourierSettings {
    /// Attempts per notification before it is given up
    /// (`TIDINGS_PEER_DELIVERY_ATTEMPTS`).
    pub attempts: u32,
    /// Time allowed for one attempt (`TIDINGS_PEER_TIMEOUT`).
    pub timeout: Duration,
    /// How long a lane's attempts may all fail before its subscription is
    /// ended (`TIDINGS_PEER_EVICT_AFTER`; zero: never; docs/ref-federation.md,
    /// "The courier"): a dead relay would otherwise hold its slot of the
    /// prefix's capacity until its token expires.
    pub evict_after: Duration,
    /// Where this server may call (`TIDINGS_PEER_ALLOW`).
    pub allow: std::sync::Arc<tidings_outbound::PeerAllow>,
}

/// A remote subscription, as the engine hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// The subscription.
    pub subscription_id: String,
    /// The remote inbox URI (`entity://<peer>/<path>`), the notifications' `ref`.
    pub deliver_uri: String,
    /// The peer's identity hash.
    pub peer: String,
    /// The inbox operation.
    pub operation: String,
    /// The deliver token (the delivery's capability).
    pub deliver_token: String,
    /// The content hashes that make the token's chain verifiable.
    pub deliver_chain: Vec<String>,
    /// Where its notifications start in the log, when the engine saw it created.
    pub since: Option<EventId>,
}

/// The remote subscriptions, by id.
pub type Lanes = Arc<BTreeMap<String, Lane>>;

/// What the courier last saw of one peer (for `/health/deep`).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PeerState {
    /// Remote subscriptions delivering to it.
    pub lanes: usize,
    /// Events its slowest lane is behind the head.
    pub backlog: i64,
    /// Notifications it accepted (duplicates included).
    pub delivered: u64,
    /// Attempts that failed (each retry counts).
    pub failed_attempts: u64,
    /// Notifications given up or refused.
    pub lost: u64,
    /// The last failure, if the last attempt failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When an attempt last succeeded, Unix ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_delivered_ms: Option<i64>,
    /// Whether the last attempt got no answer (a transport failure, a
    /// timeout, a 5xx): such a subscriber is not offered as a relay.
    pub unreachable: bool,
}

/// The courier's view of every peer it delivers to, shared with the HTTP
/// layer.
pub type PeerStates = Arc<std::sync::Mutex<BTreeMap<String, PeerState>>>;

/// One notification as a lane reads it from the log.
#[derive(Debug, Deserialize)]
struct Stored {
    #[serde(rename = "ref")]
    reference: Option<String>,
    payload: StoredPayload,
    /// The notification's trace context (its change's), sent on to the peer.
    #[serde(default)]
    traceparent: Option<String>,
    #[serde(default)]
    tracestate: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StoredPayload {
    data: Value,
    #[serde(default)]
    chain_id: Option<String>,
    #[serde(default)]
    included: Option<Map<String, Value>>,
}

/// The courier.
#[derive(Debug)]
pub(super) struct Courier {
    store: Arc<dyn Store>,
    server: Arc<ServerIdentity>,
    http: tidings_outbound::Outbound,
    settings: CourierSettings,
    /// The log's head as the broker follows it: wakes lanes.
    follow: watch::Receiver<EventId>,
    states: PeerStates,
}

impl Courier {
    pub(super) fn new(
        store: Arc<dyn Store>,
        server: Arc<ServerIdentity>,
        settings: CourierSettings,
        follow: watch::Receiver<EventId>,
        states: PeerStates,
    ) -> Self {
        // A peer's redirect is not followed: deliveries go to its endpoint only.
        let http = tidings_outbound::Outbound::new(settings.allow.clone(), settings.timeout);
        Self { store, server, http, settings, follow, states }
    }

    /// Updates what `/health/deep` shows of `peer`.
    fn note(&self, peer: &str, update: impl FnOnce(&mut PeerState)) {
        if let Ok(mut states) = self.states.lock() {
            update(states.entry(peer.to_owned()).or_default());
        }
    }

    /// Runs one task per lane in `lanes` until `cancel`, starting and
    /// stopping lanes as the set changes, and the dispatcher that feeds
    /// them.
    #[expect(clippy::disallowed_methods, reason = "the courier owns one task per peer lane, stopped with it")]
    pub(super) async fn run(self, mut lanes: watch::Receiver<Lanes>, cancel: CancellationToken) {
        let this = Arc::new(self);
        let feeds: Feeds = Arc::default();
        // Where the dispatcher starts, known before any lane: a lane reads
        // the log itself at least up to here.
        let mut retry = crate::pacing::DELIVERY;
        let start = loop {
            match this.store.head().await {
                Ok(h) => break h,
                Err(_) if sleep_or_stop(&cancel, retry.next_delay()).await => return,
                Err(_) => {}
            }
        };
        let decided = Arc::new(AtomicI64::new(start));
        let dispatcher = tokio::spawn(this.clone().dispatch(feeds.clone(), decided.clone(), cancel.clone()));
        let mut running: HashMap<String, (Lane, Stop)> = HashMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        let backlog = Arc::new(std::sync::Mutex::new(HashMap::<String, (String, EventId)>::new()));
        loop {
            let current = lanes.borrow_and_update().clone();
            running.retain(|id, (lane, stop)| {
                let keep = current.get(id).is_some_and(|l| same_lane(l, lane));
                if !keep {
                    stop.gone.store(!current.contains_key(id), Ordering::Relaxed);
                    stop.token.cancel();
                    if let Ok(mut f) = feeds.write() {
                        f.remove(id);
                    }
                }
                keep
            });
            for (id, lane) in current.iter() {
                if running.contains_key(id) {
                    continue;
                }
                let stop = Stop { token: cancel.child_token(), gone: Arc::default() };
                let (tx, rx) = tokio::sync::mpsc::channel(FEED_QUEUE);
                // A new lane starts behind: it reads the log from its cursor
                // until it reaches what the dispatcher skipped for it.
                let feed = Arc::new(Feed {
                    queue: tx,
                    state: std::sync::Mutex::new(FeedState { behind: true, skipped_upto: decided.load(Ordering::SeqCst) }),
                });
                if let Ok(mut f) = feeds.write() {
                    f.insert(id.clone(), feed.clone());
                }
                running.insert(id.clone(), (lane.clone(), stop.clone()));
                let fed = Fed { feed, queue: rx, decided: decided.clone() };
                tasks.spawn(this.clone().lane(lane.clone(), stop, fed, backlog.clone()));
            }
            report_backlog(&this, &backlog, &running).await;
            // Lanes that ended are reaped as they go.
            while tasks.try_join_next().is_some() {}
            tokio::select! {
                _ = cancel.cancelled() => break,
                changed = lanes.changed() => if changed.is_err() { break },
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
        for (_, (_, stop)) in running {
            stop.token.cancel();
        }
        // Every lane (stopped ones too) is waited for: none outlives the courier.
        while tasks.join_next().await.is_some() {}
        let _ = dispatcher.await;
        for peer in backlog.lock().map(|b| b.values().map(|(p, _)| p.clone()).collect::<Vec<_>>()).unwrap_or_default() {
            crate::metrics::peer_backlog(&peer, 0);
        }
    }

    /// Reads every notification once, from the head at start on, and hands
    /// each to its lane's queue; a lane whose queue is full (it is retrying,
    /// or slow) is marked behind and reads the log itself until it is back.
    async fn dispatch(self: Arc<Self>, feeds: Feeds, decided: Arc<AtomicI64>, cancel: CancellationToken) {
        let mut follow = self.follow.clone();
        let mut retry = crate::pacing::DELIVERY;
        let mut position = decided.load(Ordering::SeqCst);
        while !cancel.is_cancelled() {
            let (records, reached) = match self.store.engine_changes(position, &[names::SUBSCRIPTION_NOTIFICATION], DISPATCH_BATCH).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!(error = %crate::report::chain(&e), "courier cannot read the log; retrying");
                    if sleep_or_stop(&cancel, retry.next_delay()).await {
                        return;
                    }
                    continue;
                }
            };
            retry.reset();
            if !records.is_empty() {
                let feeds = feeds.read().map(|f| f.clone()).unwrap_or_default();
                for record in records.iter() {
                    let Some(id) = remote_subscription(record) else { continue };
                    let Some(feed) = feeds.get(&id) else { continue };
                    let Ok(mut state) = feed.state.lock() else { continue };
                    if state.behind || feed.queue.try_send(record.clone()).is_err() {
                        state.behind = true;
                        state.skipped_upto = record.id;
                    }
                }
            }
            position = reached;
            decided.store(position, Ordering::SeqCst);
            if records.len() == DISPATCH_BATCH {
                continue;
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = follow.changed() => {}
                _ = tokio::time::sleep(SKIP_COMMIT) => {}
            }
        }
    }

    /// One lane: delivers its subscription's notifications in order from
    /// its cursor, until `stop`.
    async fn lane(
        self: Arc<Self>,
        lane: Lane,
        stopping: Stop,
        fed: Fed,
        backlog: Arc<std::sync::Mutex<HashMap<String, (String, EventId)>>>,
    ) {
        self.run_lane(&lane, &stopping.token, fed, &backlog).await;
        if stopping.gone.load(Ordering::Relaxed) {
            // The subscription is gone and takes its undelivered
            // notifications with it; its cursor no longer holds retention.
            if let Err(e) = self.store.device_forget(CURSOR_OWNER, &lane.subscription_id).await {
                tracing::warn!(error = %crate::report::chain(&e), subscription = lane.subscription_id, "could not forget a courier cursor");
            }
        }
    }

    /// The lane's loop, until `stop`: behind, it reads the log from its
    /// position; caught up, it takes what the dispatcher hands it.
    async fn run_lane(
        &self,
        lane: &Lane,
        stop: &CancellationToken,
        mut fed: Fed,
        backlog: &std::sync::Mutex<HashMap<String, (String, EventId)>>,
    ) {
        let mut retry = crate::pacing::DELIVERY;
        let mut position = loop {
            match self.start(lane).await {
                Ok(p) => break p,
                Err(e) => {
                    tracing::warn!(error = %crate::report::chain(&e), subscription = lane.subscription_id, "courier cannot read its cursor; retrying");
                    if sleep_or_stop(stop, retry.next_delay()).await {
                        return;
                    }
                }
            }
        };
        let mut sender = Sender::new(self, lane).await;
        let mut stored = position;
        let mut stored_at = tokio::time::Instant::now();
        while !stop.is_cancelled() {
            if let Ok(mut b) = backlog.lock() {
                b.insert(lane.subscription_id.clone(), (lane.peer.clone(), position));
            }
            if fed.behind() {
                let (records, reached) = match self.store.engine_changes(position, &[names::SUBSCRIPTION_NOTIFICATION], BATCH).await {
                    Ok(read) => read,
                    Err(e) => {
                        tracing::warn!(error = %crate::report::chain(&e), "courier cannot read the log; retrying");
                        if sleep_or_stop(stop, retry.next_delay()).await {
                            return;
                        }
                        continue;
                    }
                };
                retry.reset();
                for record in &records {
                    let Some(n) = mine(record, lane) else { continue };
                    let Some(()) = sender.deliver(record, n, stop).await else { return };
                    position = record.id;
                }
                position = position.max(reached);
                if records.len() < BATCH {
                    fed.catch_up(position);
                }
            } else {
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    next = fed.queue.recv() => {
                        let Some(record) = next else { break };
                        if record.id > position {
                            if let Some(n) = mine(&record, lane) {
                                let Some(()) = sender.deliver(&record, n, stop).await else { return };
                            }
                            position = record.id;
                        }
                    }
                    _ = tokio::time::sleep(SKIP_COMMIT) => {
                        // Idle and caught up: everything the dispatcher
                        // decided on is behind this lane.
                        let decided = fed.decided.load(Ordering::SeqCst);
                        if !stop.is_cancelled() && fed.queue.is_empty() && !fed.behind() {
                            position = position.max(decided);
                        }
                    }
                }
            }
            if position != stored && stored_at.elapsed() >= ACK_EVERY {
                if self.store.device_ack(CURSOR_OWNER, &lane.subscription_id, position, now_ms()).await.is_ok() {
                    stored = position;
                }
                stored_at = tokio::time::Instant::now();
            }
        }
        if position != stored {
            let _ = self.store.device_ack(CURSOR_OWNER, &lane.subscription_id, position, now_ms()).await;
        }
    }

    /// Where a lane starts: its stored cursor, else its creation in the log,
    /// else the log's floor; stored at once so a restart finds it.
    async fn start(&self, lane: &Lane) -> Result<EventId, StoreError> {
        if let Some(cursor) = self.store.device_cursor(CURSOR_OWNER, &lane.subscription_id).await? {
            return Ok(cursor);
        }
        let from = match lane.since {
            Some(since) => since,
            None => self.store.floor().await?,
        };
        self.store.device_ack(CURSOR_OWNER, &lane.subscription_id, from, now_ms()).await
    }

    /// Ends `lane`'s subscription, whose deliveries kept failing
    /// (docs/ref-federation.md, "The courier"): its
    /// entity is deleted only while it still holds the lane's deliver token
    /// (a renewal rotates the token: the peer is alive, and the renewed
    /// subscription stays). Whether it is gone.
    async fn evict(&self, lane: &Lane, chain_id: &str) -> bool {
        let path = format!("{}/{}", super::DIR, lane.subscription_id);
        let current = match self.store.tree_get(&path).await {
            Ok(Some(entry)) => {
                let renewed = super::PathSubscription::from_json(&entry.entity).is_none_or(|s| s.deliver_token != lane.deliver_token);
                if renewed {
                    return false;
                }
                entry.hash
            }
            Ok(None) => return true,
            Err(e) => {
                tracing::warn!(error = %crate::report::chain(&e), "cannot read a failing subscription; evicting it later");
                return false;
            }
        };
        let agent = tidings_protocol::event::Agent::server(self.server.hash());
        let write = TreeWrite {
            path: path.clone(),
            entity: None,
            condition: Condition::IfMatch(current),
            event: change_event(&path, agent, None, chain_id.to_owned()),
        };
        match self.store.tree_write(write).await {
            Ok(TreeOutcome::Done { .. }) => {
                tracing::warn!(subscription = lane.subscription_id, peer = lane.peer, "ended a subscription whose deliveries kept failing");
                crate::metrics::peer_evicted();
                true
            }
            Ok(_) => false,
            Err(e) => {
                tracing::warn!(error = %crate::report::chain(&e), "cannot end a failing subscription; retrying later");
                false
            }
        }
    }

    /// Binds the chain-error marker of a notification given up.
    async fn give_up(&self, lane: &Lane, record: &Record, stored: &Stored, chain_id: &str, reason: &str) {
        let data = &stored.payload.data;
        let marker = Marker {
            agent: tidings_protocol::event::Agent::server(self.server.hash()),
            subscription_id: &lane.subscription_id,
            reason,
            kind: data["event"].as_str().unwrap_or(""),
            uri: data["uri"].as_str().unwrap_or(""),
            hash: data["hash"].as_str(),
            previous_hash: data["previous_hash"].as_str(),
            chain_id,
            event_id: record.id,
        };
        if let Err(e) = self.store.tree_write(marker.write()).await {
            tracing::warn!(error = %crate::report::chain(&e), "could not bind the chain-error marker of a lost delivery");
        }
    }
}

/// The lanes' queues, by subscription id, shared with the dispatcher.
type Feeds = Arc<std::sync::RwLock<HashMap<String, Arc<Feed>>>>;

/// A lane's queue and whether the dispatcher feeds it.
#[derive(Debug)]
struct Feed {
    queue: tokio::sync::mpsc::Sender<Record>,
    state: std::sync::Mutex<FeedState>,
}

#[derive(Debug)]
struct FeedState {
    /// The lane reads the log itself: the dispatcher skips it.
    behind: bool,
    /// The last notification the dispatcher skipped for it.
    skipped_upto: EventId,
}

/// The lane's end of its feed.
#[derive(Debug)]
struct Fed {
    feed: Arc<Feed>,
    queue: tokio::sync::mpsc::Receiver<Record>,
    /// Everything up to here has been offered to the lanes.
    decided: Arc<AtomicI64>,
}

impl Fed {
    fn behind(&self) -> bool {
        self.feed.state.lock().map(|s| s.behind).unwrap_or(true)
    }

    /// The lane has read the log up to `position`: fed again if that covers
    /// everything the dispatcher skipped for it.
    fn catch_up(&self, position: EventId) {
        if let Ok(mut state) = self.feed.state.lock()
            && position >= state.skipped_upto
        {
            state.behind = false;
        }
    }
}

/// A peer's error code, as a marker's `reason` (a path segment): kept when
/// it looks like a code (`[a-z0-9_]`, at most 64 bytes), else
/// `delivery_refused`.
fn refusal_code(body: &Value) -> String {
    let code = body["error"]["code"].as_str().unwrap_or("");
    let ok = !code.is_empty() && code.len() <= 64 && code.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok { code.to_owned() } else { "delivery_refused".to_owned() }
}

/// The subscription of a notification addressed to a remote inbox.
fn remote_subscription(record: &Record) -> Option<String> {
    let stored: Stored = serde_json::from_str(&record.body).ok()?;
    if !stored.reference.as_deref().is_some_and(|r| r.starts_with("entity://")) {
        return None;
    }
    stored.payload.data["subscription_id"].as_str().map(str::to_owned)
}

/// How a lane is stopped: `gone` when its subscription no longer exists.
#[derive(Debug, Clone)]
struct Stop {
    token: CancellationToken,
    gone: Arc<std::sync::atomic::AtomicBool>,
}

/// The notification in `record` if it is one of `lane`'s.
fn mine(record: &Record, lane: &Lane) -> Option<Stored> {
    let stored: Stored = serde_json::from_str(&record.body).ok()?;
    let ours = stored.reference.as_deref() == Some(lane.deliver_uri.as_str())
        && stored.payload.data["subscription_id"].as_str() == Some(lane.subscription_id.as_str());
    ours.then_some(stored)
}

/// A lane is restarted when what it delivers with changes (a renewal
/// rotates the token); `since` only matters to a new lane.
fn same_lane(a: &Lane, b: &Lane) -> bool {
    a.deliver_uri == b.deliver_uri && a.operation == b.operation && a.deliver_token == b.deliver_token && a.deliver_chain == b.deliver_chain
}

/// Sets each peer's backlog gauge: the head minus its slowest lane's cursor.
async fn report_backlog(
    courier: &Courier,
    backlog: &std::sync::Mutex<HashMap<String, (String, EventId)>>,
    running: &HashMap<String, (Lane, Stop)>,
) {
    let Ok(head) = courier.store.head().await else { return };
    let Ok(mut lanes) = backlog.lock() else { return };
    lanes.retain(|id, _| running.contains_key(id));
    let mut per_peer: BTreeMap<&str, EventId> = BTreeMap::new();
    for (lane, _) in running.values() {
        per_peer.entry(&lane.peer).or_insert(0);
    }
    for (peer, position) in lanes.values() {
        let behind = (head - position).max(0);
        let slot = per_peer.entry(peer).or_insert(0);
        *slot = (*slot).max(behind);
    }
    let lanes_per_peer = |peer: &str| running.values().filter(|(l, _)| l.peer == peer).count();
    if let Ok(mut states) = courier.states.lock() {
        states.retain(|peer, _| per_peer.contains_key(peer.as_str()));
        for (peer, behind) in &per_peer {
            let state = states.entry((*peer).to_owned()).or_default();
            state.backlog = *behind;
            state.lanes = lanes_per_peer(peer);
        }
    }
    for (peer, behind) in per_peer {
        crate::metrics::peer_backlog(peer, behind);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_error_code_becomes_a_marker_reason_only_if_it_looks_like_one() {
        assert_eq!(refusal_code(&json!({"error": {"code": "capability_invalid"}})), "capability_invalid");
        for bad in
            [json!({}), json!({"error": {"code": "a/b/.."}}), json!({"error": {"code": "x".repeat(65)}}), json!({"error": {"code": "Bad"}})]
        {
            assert_eq!(refusal_code(&bad), "delivery_refused", "{bad}");
        }
    }
}
