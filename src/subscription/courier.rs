//! The courier: carries notifications addressed to other servers' inboxes
//! (`entity://<peer>/...`) to those peers, as signed `receive` EXECUTEs on
//! their `POST /v1/execute`.
//!
//! The log is the queue. The engine appends a remote subscription's
//! notifications to this server's log like any other; the courier runs one
//! lane per remote subscription, and each lane reads the log from its own
//! durable cursor (a device cursor owned by `tidings:courier`), delivers its
//! subscription's notifications one at a time in log order, and moves the
//! cursor past each once it is delivered or given up. A peer that is down
//! costs one lane waiting with one notification in hand, not a backlog in
//! memory; a lane retrying never holds up another lane or local inboxes.
//!
//! A failed attempt (transport error, timeout, 5xx, 408, 429) is retried
//! with exponential backoff and jitter up to the attempt budget
//! (`TIDINGS_PEER_DELIVERY_ATTEMPTS`); a refusal (any other 4xx) is final.
//! Either way the notification binds a chain-error marker (§4.7, reason the
//! peer's error code or `delivery_failed`) and the lane goes on with the
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
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::inbox::NOTIFICATION;
use crate::event::{EventId, names};
use crate::identity::ServerIdentity;
use crate::store::{Record, Store, StoreError};
use crate::tree::Entity;

/// The owner of the courier's cursors in the device cursor table.
const CURSOR_OWNER: &str = crate::store::COURIER_CURSORS;
/// Notifications read per step.
const BATCH: usize = 256;
/// Retry backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A lane that only skips other subscriptions' notifications stores its
/// cursor at most this often.
const SKIP_COMMIT: Duration = Duration::from_secs(1);

/// How hard the courier tries (settings).
#[derive(Debug, Clone)]
pub struct CourierSettings {
    /// Attempts per notification before it is given up
    /// (`TIDINGS_PEER_DELIVERY_ATTEMPTS`).
    pub attempts: u32,
    /// Time allowed for one attempt (`TIDINGS_PEER_TIMEOUT`).
    pub timeout: Duration,
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
    http: reqwest::Client,
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
        let http = reqwest::Client::builder().timeout(settings.timeout).build().unwrap_or_default();
        Self { store, server, http, settings, follow, states }
    }

    /// Updates what `/health/deep` shows of `peer`.
    fn note(&self, peer: &str, update: impl FnOnce(&mut PeerState)) {
        if let Ok(mut states) = self.states.lock() {
            update(states.entry(peer.to_owned()).or_default());
        }
    }

    /// Runs one task per lane in `lanes` until `cancel`, starting and
    /// stopping lanes as the set changes.
    pub(super) async fn run(self, mut lanes: watch::Receiver<Lanes>, cancel: CancellationToken) {
        let this = Arc::new(self);
        let mut running: HashMap<String, (Lane, Stop)> = HashMap::new();
        let backlog = Arc::new(std::sync::Mutex::new(HashMap::<String, (String, EventId)>::new()));
        loop {
            let current = lanes.borrow_and_update().clone();
            running.retain(|id, (lane, stop)| {
                let keep = current.get(id).is_some_and(|l| same_lane(l, lane));
                if !keep {
                    stop.gone.store(!current.contains_key(id), std::sync::atomic::Ordering::Relaxed);
                    stop.token.cancel();
                }
                keep
            });
            for (id, lane) in current.iter() {
                if running.contains_key(id) {
                    continue;
                }
                let stop = Stop { token: cancel.child_token(), gone: Arc::default() };
                running.insert(id.clone(), (lane.clone(), stop.clone()));
                tokio::spawn(this.clone().lane(lane.clone(), stop, backlog.clone()));
            }
            report_backlog(&this, &backlog, &running).await;
            tokio::select! {
                _ = cancel.cancelled() => break,
                changed = lanes.changed() => if changed.is_err() { break },
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }
        for (_, (_, stop)) in running {
            stop.token.cancel();
        }
        for peer in backlog.lock().map(|b| b.values().map(|(p, _)| p.clone()).collect::<Vec<_>>()).unwrap_or_default() {
            metrics::gauge!(crate::metrics::PEER_BACKLOG, "peer" => peer).set(0.0);
        }
        if let Ok(mut states) = this.states.lock() {
            states.clear();
        }
    }

    /// One lane: reads its subscription's notifications from its cursor and
    /// delivers them in order, until `stop`.
    async fn lane(self: Arc<Self>, lane: Lane, stopping: Stop, backlog: Arc<std::sync::Mutex<HashMap<String, (String, EventId)>>>) {
        self.run_lane(&lane, &stopping.token, &backlog).await;
        if stopping.gone.load(std::sync::atomic::Ordering::Relaxed) {
            // The subscription is gone and takes its undelivered
            // notifications with it; its cursor no longer holds retention.
            if let Err(e) = self.store.device_forget(CURSOR_OWNER, &lane.subscription_id).await {
                tracing::warn!(error = %e, subscription = lane.subscription_id, "could not forget a courier cursor");
            }
        }
    }

    /// The lane's loop, until `stop`.
    async fn run_lane(&self, lane: &Lane, stop: &CancellationToken, backlog: &std::sync::Mutex<HashMap<String, (String, EventId)>>) {
        let (lane, stop) = (lane.clone(), stop.clone());
        let mut follow = self.follow.clone();
        let mut retry = BACKOFF_MIN;
        let mut position = loop {
            match self.start(&lane).await {
                Ok(p) => break p,
                Err(e) => {
                    tracing::warn!(error = %e, subscription = lane.subscription_id, "courier cannot read its cursor; retrying");
                    if sleep_or_stop(&stop, jittered(retry)).await {
                        return;
                    }
                    retry = (retry * 2).min(BACKOFF_MAX);
                }
            }
        };
        let mut stored = position;
        let mut stored_at = tokio::time::Instant::now();
        while !stop.is_cancelled() {
            if let Ok(mut b) = backlog.lock() {
                b.insert(lane.subscription_id.clone(), (lane.peer.clone(), position));
            }
            let (records, reached) = match self.store.engine_changes(position, &[names::SUBSCRIPTION_NOTIFICATION], BATCH).await {
                Ok(read) => read,
                Err(e) => {
                    tracing::warn!(error = %e, "courier cannot read the log; retrying");
                    if sleep_or_stop(&stop, jittered(retry)).await {
                        return;
                    }
                    retry = (retry * 2).min(BACKOFF_MAX);
                    continue;
                }
            };
            retry = BACKOFF_MIN;
            for record in &records {
                let Some(stored_n) = mine(record, &lane) else { continue };
                let Some(()) = self.deliver(&lane, record, stored_n, &stop).await else { return };
                position = record.id;
                if self.store.device_ack(CURSOR_OWNER, &lane.subscription_id, position, now_ms()).await.is_ok() {
                    stored = position;
                    stored_at = tokio::time::Instant::now();
                }
            }
            position = reached;
            if let Ok(mut b) = backlog.lock() {
                b.insert(lane.subscription_id.clone(), (lane.peer.clone(), position));
            }
            if position != stored && stored_at.elapsed() >= SKIP_COMMIT {
                if self.store.device_ack(CURSOR_OWNER, &lane.subscription_id, position, now_ms()).await.is_ok() {
                    stored = position;
                }
                stored_at = tokio::time::Instant::now();
            }
            if records.len() == BATCH {
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = follow.changed() => {}
                _ = tokio::time::sleep(SKIP_COMMIT) => {}
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

    /// Delivers one notification, retrying per the settings; `None` if the
    /// lane was stopped meanwhile (the notification is then left for the
    /// next run, its cursor unmoved).
    async fn deliver(&self, lane: &Lane, record: &Record, stored: Stored, stop: &CancellationToken) -> Option<()> {
        let chain_id = stored.payload.chain_id.clone().unwrap_or_else(|| format!("event-{}", record.id));
        let envelope = match self.envelope(lane, record.id, &stored).await {
            Ok(envelope) => envelope,
            Err(e) => {
                tracing::warn!(error = %e, subscription = lane.subscription_id, "cannot build a delivery; giving it up");
                self.give_up(lane, record, &stored, &chain_id, "delivery_failed").await;
                return Some(());
            }
        };
        let mut backoff = BACKOFF_MIN;
        for attempt in 1..=self.settings.attempts.max(1) {
            if stop.is_cancelled() {
                return None;
            }
            let outcome = self.attempt(&lane.peer, &envelope, &chain_id).await;
            match outcome {
                Attempt::Delivered { duplicate } => {
                    self.note(&lane.peer, |s| {
                        s.delivered += 1;
                        s.last_error = None;
                        s.last_delivered_ms = Some(now_ms());
                    });
                    let outcome = if duplicate { "duplicate" } else { "delivered" };
                    metrics::counter!(crate::metrics::PEER_DELIVERIES, "outcome" => outcome).increment(1);
                    return Some(());
                }
                Attempt::Refused(code) => {
                    tracing::warn!(code, subscription = lane.subscription_id, peer = lane.peer, "a peer refused a delivery");
                    metrics::counter!(crate::metrics::PEER_DELIVERIES, "outcome" => "refused").increment(1);
                    self.note(&lane.peer, |s| {
                        s.lost += 1;
                        s.last_error = Some(format!("refused: {code}"));
                    });
                    self.give_up(lane, record, &stored, &chain_id, &code).await;
                    return Some(());
                }
                Attempt::Failed(why) => {
                    tracing::debug!(why, attempt, subscription = lane.subscription_id, "delivery to a peer failed");
                    self.note(&lane.peer, |s| {
                        s.failed_attempts += 1;
                        s.last_error = Some(why.clone());
                    });
                    if attempt == self.settings.attempts.max(1) {
                        break;
                    }
                    metrics::counter!(crate::metrics::PEER_RETRIES).increment(1);
                    if sleep_or_stop(stop, jittered(backoff)).await {
                        return None;
                    }
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        tracing::warn!(subscription = lane.subscription_id, peer = lane.peer, "giving up a delivery after its attempts");
        metrics::counter!(crate::metrics::PEER_DELIVERIES, "outcome" => "given_up").increment(1);
        self.note(&lane.peer, |s| s.lost += 1);
        self.give_up(lane, record, &stored, &chain_id, "delivery_failed").await;
        Some(())
    }

    /// One POST to the peer's `/v1/execute`.
    async fn attempt(&self, peer: &str, envelope: &Value, chain_id: &str) -> Attempt {
        let endpoint = match self.store.tree_get(&format!("{}{peer}", crate::peer::PREFIX)).await {
            Ok(Some(entry)) => match crate::peer::endpoint_of(&entry.entity) {
                Some(endpoint) => endpoint,
                None => return Attempt::Failed("the peer entity has no endpoint".into()),
            },
            Ok(None) => return Attempt::Failed("the peer is not known".into()),
            Err(e) => return Attempt::Failed(e.to_string()),
        };
        let sent = self.http.post(format!("{endpoint}/v1/execute")).header("x-chain-id", chain_id).json(envelope).send().await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => return Attempt::Failed(e.to_string()),
        };
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        match status {
            200 => Attempt::Delivered { duplicate: body["result"]["duplicate"] == true },
            408 | 429 | 500..=599 => Attempt::Failed(format!("status {status}")),
            _ => Attempt::Refused(body["error"]["code"].as_str().unwrap_or("delivery_refused").to_owned()),
        }
    }

    /// The signed `receive` EXECUTE for the notification at `seq`, with the
    /// deliver token chain, the signature, this server's identity and (for
    /// `include_payload`) the changed entity in `included`.
    async fn envelope(&self, lane: &Lane, seq: EventId, stored: &Stored) -> Result<Value, StoreError> {
        let execute = Entity {
            kind: "system/protocol/execute".into(),
            data: json!({
                "request_id": format!("{}-{seq}", lane.subscription_id),
                "uri": lane.deliver_uri,
                "operation": lane.operation,
                "resource": {"targets": [lane.deliver_uri]},
                "params": {"type": NOTIFICATION, "data": stored.payload.data},
                "author": self.server.hash(),
                "capability": lane.deliver_token,
                "sequence": seq,
            }),
        };
        let (_, execute_hash) = execute.canonical();
        let mut included = Map::new();
        for hash in &lane.deliver_chain {
            if let Some(body) = self.store.content_get(hash).await?
                && let Ok(entity) = serde_json::from_str::<Value>(&body)
            {
                included.insert(hash.clone(), entity);
            }
        }
        if let Some(bundled) = &stored.payload.included {
            included.extend(bundled.clone());
        }
        included.insert(self.server.hash().to_owned(), self.server.entity().clone());
        let signature = self.server.sign(&execute_hash);
        if let Ok(hash) = crate::tree::capability::hash_of(&signature) {
            included.insert(hash, signature);
        }
        Ok(json!({ "execute": execute, "included": included }))
    }

    /// Binds the chain-error marker of a notification given up.
    async fn give_up(&self, lane: &Lane, record: &Record, stored: &Stored, chain_id: &str, reason: &str) {
        let data = &stored.payload.data;
        let marker = super::engine::Marker {
            agent: crate::event::Agent { id: self.server.hash().to_owned(), kind: Some("server".into()) },
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
            tracing::warn!(error = %e, "could not bind the chain-error marker of a lost delivery");
        }
    }
}

/// How a lane is stopped: `gone` when its subscription no longer exists.
#[derive(Debug, Clone)]
struct Stop {
    token: CancellationToken,
    gone: Arc<std::sync::atomic::AtomicBool>,
}

enum Attempt {
    Delivered { duplicate: bool },
    Refused(String),
    Failed(String),
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
        metrics::gauge!(crate::metrics::PEER_BACKLOG, "peer" => peer.to_owned()).set(behind as f64);
    }
}

/// Sleeps `d`; `true` if `stop` came first.
async fn sleep_or_stop(stop: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

/// `d` scaled by a random factor in [0.5, 1.5).
pub(super) fn jittered(d: Duration) -> Duration {
    d.mul_f64(0.5 + rand::random::<f64>())
}

/// Now, Unix ms.
pub(super) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
