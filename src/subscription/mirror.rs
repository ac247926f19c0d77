//! Mirrors (seed 000 §2.2, §5.5, §6.3): an admin writes
//! `system/mirror/<name>` (`{peer, pattern, capability?}`) and this server
//! reproduces the peer's entities under `pattern` in its own tree,
//! byte-identical (same hashes).
//!
//! For each mirror the server holds an `include_payload` subscription at
//! the peer (or, when the peer's capacity redirects it, at a relay the
//! redirect offered, proven by `GET /v1/identity`, at most 10 redirects
//! away), delivering to its own inbox `system/inbox/mirror/<name>` with a
//! deliver token it signs itself, renewed before the token expires and
//! cancelled when the mirror entity is deleted. A mirror held at a relay
//! probes it and, when it stops answering for
//! `TIDINGS_MIRROR_REPAIR_TIMEOUT`, attaches elsewhere (a cached
//! alternative of its redirect, else the peer anew) and re-reads every path
//! it knows (seed 000 §8.4). Notifications arrive in that
//! inbox through the peer's courier (so exactly once, in change order) and
//! an applier consumes them from a durable cursor. A notification's
//! bundled bytes are taken only when the peer signed exactly that
//! transition, newer than what the path holds ([`super::signed`]): a
//! forgery is refused (`forged_refused`) and its relay left, an older
//! signed change is refused (`rollback_refused`), and what the peer did
//! not sign is read at the peer instead (`unsigned_reread`). Re-reads and
//! discovery always go to the peer itself, never to a relay. Each
//! notification is then applied with CAS, never an unconditional put:
//!
//! - the local entity already is the reported one: nothing to do
//!   (`unchanged`);
//! - the local entity is the reported `previous_hash` (or absent, for a
//!   creation): the bundled entity is written with `If-Match` on it
//!   (`If-None-Match: *` for a creation; a deletion `If-Match` the deleted
//!   hash) (`applied`);
//! - otherwise, if what is here was last written by this mirror (or nothing
//!   is here), this server missed transitions (a lost notification): it
//!   re-reads the path at the peer and writes the peer's current bytes
//!   with `If-Match` on the local hash (`gap_reread`), or nothing when the
//!   peer holds what is here (`stale_rejected`);
//! - otherwise what is here came from elsewhere (a local write, or another
//!   mirror: the writer of a ring, or a pair's other side) and the
//!   notification is an old lap coming round: rejected (`stale_rejected`).
//!
//! So a mirror only ever moves forward along the source's history: each
//! peer of a chain, pair or ring settles each write at most once, and a
//! stale lap changes nothing. Because the last notification of a burst can
//! be lost too (nothing after it would reveal the gap), each mirror also
//! reconciles every `TIDINGS_MIRROR_RECONCILE` (and, held at a relay,
//! lists the peer's paths first, and leaves a relay that has still not
//! notified a path one reconciliation after the peer was found ahead on
//! it: withholding): it re-reads the paths it
//! knows of with the same rule.
//!
//! Who wrote what is here is read from the log (the agent of the change
//! that put it there); when retention has pruned that change it is
//! unknown, and the entity is treated as written by someone else (never
//! overwritten by a re-read).
//!
//! Decisions and limits: states are told apart by their hashes, so a path
//! that returns to an earlier content while a lap is still travelling a
//! cycle can be taken back to it (as with any hash-based CAS recipe); a
//! stale creation lap can bring back an entity deleted meanwhile in a
//! cycle. Paths under `system/` are never mirrored. Re-reads use plain
//! `GET /v1/tree` at the peer, so a peer with tokens on serves mirrors
//! their notifications but not the re-reads (the mirror then relies on
//! the stream alone).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::inbox::NotificationData;
use super::retry::{jittered, now_ms};
use super::signed::{self, Proof, SignedChange, Transition};
use crate::event::{Agent, EventId, names};
use crate::glob::Glob;
use crate::identity::ServerIdentity;
use crate::peer::{Attached, Relay, Subscribed};
use crate::store::{Condition, Store, StoreError, TreeOutcome, TreeWrite};
use crate::tree::capability::hash_of;
use crate::tree::{Entity, EntityError, change_event_with, generate_id, is_hash, validate_path};

/// Where mirrors are configured.
pub const PREFIX: &str = "system/mirror/";
/// The entity type of a mirror.
pub const TYPE: &str = "system/mirror";
/// Where a mirror's notifications arrive.
pub(super) const INBOX_PREFIX: &str = "system/inbox/mirror/";
/// The owner of the appliers' cursors in the device cursor table.
const CURSOR_OWNER: &str = "tidings:mirror";
/// Notifications read per step.
const BATCH: usize = 256;
/// How far past a sequence it is about to take a mirror raises its stored
/// mark at once: one store write per this many ids of the peer's log, not
/// one per change.
const MARK_AHEAD: u64 = 1_024;
/// Most paths one mirror remembers for reconciliation.
const MAX_KNOWN: usize = 100_000;
/// Most directory listings one discovery at the peer reads.
const MAX_LISTINGS: usize = 10_000;
/// Most subscriptions at dead relays a mirror remembers to cancel.
const MAX_ABANDONED: usize = 16;
/// Backoff bounds of a subscribe that failed.
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// How mirrors keep up (settings).
#[derive(Debug, Clone)]
pub struct MirrorSettings {
    /// Lifetime of the deliver token a mirror subscribes with; renewed at
    /// half of it (`TIDINGS_MIRROR_TOKEN_TTL`).
    pub token_ttl: Duration,
    /// How often a mirror re-reads the paths it knows
    /// (`TIDINGS_MIRROR_RECONCILE`).
    pub reconcile: Duration,
    /// Time allowed for one request to the peer (`TIDINGS_PEER_TIMEOUT`).
    pub timeout: Duration,
    /// Where this server is reached (`TIDINGS_PUBLIC_URL`): given as the
    /// subscription's `relay_endpoint`, since a mirror serves what it
    /// mirrors onwards.
    pub public_url: String,
    /// How long a relay may stay unreachable before its downstream mirrors
    /// attach elsewhere (`TIDINGS_MIRROR_REPAIR_TIMEOUT`); the upstream is
    /// probed four times in that span.
    pub repair_timeout: Duration,
    /// Where this server may call (`TIDINGS_PEER_ALLOW`).
    pub allow: std::sync::Arc<crate::peer::PeerAllow>,
}

/// A mirror's status, for `/health/deep`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MirrorState {
    /// The peer mirrored.
    pub peer: String,
    /// The pattern mirrored.
    pub pattern: String,
    /// `subscribing`, `subscribed`, `failing`.
    pub state: &'static str,
    /// The subscription held upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subscription_id: Option<String>,
    /// The server the subscription is held at: the peer, or a relay its
    /// capacity redirect pointed to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Redirects followed to reach it (0: the peer itself).
    pub hops: u32,
    /// Times this mirror re-attached because its relay stopped answering.
    pub repairs: u64,
    /// How long the last repair took, from the first unanswered probe to
    /// holding a subscription elsewhere and having re-read every path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_repair_ms: Option<u64>,
    /// Notifications applied, by outcome.
    pub applies: BTreeMap<&'static str, u64>,
    /// The last failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Every mirror's status, shared with the HTTP layer.
pub type MirrorStates = Arc<std::sync::Mutex<BTreeMap<String, MirrorState>>>;

/// Checks an entity written at `path`: under [`PREFIX`] it must be a
/// `system/mirror` named by one segment, with `peer` an identity hash,
/// `pattern` a path pattern outside `system/`, and `capability`, when
/// given, `{hash, included}` as the peer's `POST /v1/admin/capabilities`
/// answered.
pub fn check(path: &str, entity: &Entity) -> Result<(), EntityError> {
    let Some(name) = path.strip_prefix(PREFIX) else { return Ok(()) };
    if name.is_empty() || name.contains('/') {
        return Err(EntityError(format!("a mirror lives at {PREFIX}<name> (one segment), not {path}")));
    }
    if entity.kind != TYPE {
        return Err(EntityError(format!("an entity under {PREFIX} is of type {TYPE}")));
    }
    spec(name, &entity.data).map(|_| ()).map_err(EntityError)
}

/// A mirror as configured.
#[derive(Debug, Clone, PartialEq)]
struct Spec {
    name: String,
    peer: String,
    pattern: String,
    capability: Option<(String, Map<String, Value>)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecData {
    peer: String,
    pattern: String,
    #[serde(default)]
    capability: Option<CapabilityData>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CapabilityData {
    hash: String,
    #[serde(default)]
    included: Map<String, Value>,
}

fn spec(name: &str, data: &Value) -> Result<Spec, String> {
    let d: SpecData = serde_json::from_value(data.clone())
        .map_err(|e| format!("a mirror's data is {{peer, pattern, capability?: {{hash, included}}}}: {e}"))?;
    if !is_hash(&d.peer) {
        return Err("peer is the mirrored server's identity hash (sha256:<64 hex>)".into());
    }
    Glob::new_path(&d.pattern).map_err(|e| format!("pattern: {e}"))?;
    if d.pattern == "system" || d.pattern.starts_with("system/") || d.pattern.starts_with("**") {
        return Err("a mirror's pattern must not cover system/ (start it with a path segment)".into());
    }
    let capability = match d.capability {
        Some(c) if is_hash(&c.hash) && c.included.contains_key(&c.hash) => Some((c.hash, c.included)),
        Some(_) => return Err("capability is {hash, included} with the token among the included entities".into()),
        None => None,
    };
    Ok(Spec { name: name.to_owned(), peer: d.peer, pattern: d.pattern, capability })
}

/// The mirrors, run by the process that leads the engine.
#[derive(Debug)]
pub(super) struct Mirrors {
    store: Arc<dyn Store>,
    server: Arc<ServerIdentity>,
    http: crate::peer::Outbound,
    settings: MirrorSettings,
    follow: watch::Receiver<EventId>,
    states: MirrorStates,
    /// Each running mirror's wake-up, by its inbox: the watcher reads each
    /// new notification once and wakes only the mirror it is for.
    wakes: std::sync::RwLock<HashMap<String, Arc<tokio::sync::Notify>>>,
}

impl Mirrors {
    pub(super) fn new(
        store: Arc<dyn Store>,
        server: Arc<ServerIdentity>,
        settings: MirrorSettings,
        follow: watch::Receiver<EventId>,
        states: MirrorStates,
    ) -> Self {
        // A peer's redirect is not followed: requests go to its endpoint only.
        let http = crate::peer::Outbound::new(settings.allow.clone(), settings.timeout);
        Self { store, server, http, settings, follow, states, wakes: Default::default() }
    }

    /// Runs every configured mirror until `cancel`, re-reading the set when
    /// `changed` fires (a change under `system/mirror/`) and every 30 s.
    pub(super) async fn run(self, mut changed: watch::Receiver<u64>, cancel: CancellationToken) {
        let this = Arc::new(self);
        let watcher = tokio::spawn(this.clone().watch_inboxes(cancel.clone()));
        let mut running: HashMap<String, (Spec, CancellationToken, Arc<std::sync::atomic::AtomicBool>)> = HashMap::new();
        let mut tasks = tokio::task::JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            changed.borrow_and_update();
            match this.store.tree_entries_below(PREFIX.trim_end_matches('/'), 10_000).await {
                Ok(entries) => {
                    let specs: BTreeMap<String, Spec> = entries
                        .iter()
                        .filter_map(|e| {
                            let name = e.path.strip_prefix(PREFIX)?;
                            let entity: Entity = serde_json::from_str(&e.entity).ok()?;
                            (entity.kind == TYPE).then(|| spec(name, &entity.data).ok()).flatten()
                        })
                        .map(|s| (s.name.clone(), s))
                        .collect();
                    running.retain(|name, (spec, stop, gone)| {
                        let keep = specs.get(name) == Some(spec);
                        if !keep {
                            gone.store(!specs.contains_key(name), std::sync::atomic::Ordering::Relaxed);
                            stop.cancel();
                        }
                        keep
                    });
                    for (name, spec) in specs {
                        if running.contains_key(&name) {
                            continue;
                        }
                        let (stop, gone) = (cancel.child_token(), Arc::new(std::sync::atomic::AtomicBool::new(false)));
                        running.insert(name, (spec.clone(), stop.clone(), gone.clone()));
                        tasks.spawn(this.clone().mirror(spec, stop, gone));
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot read system/mirror/; retrying"),
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                r = changed.changed() => if r.is_err() { break },
                _ = tokio::time::sleep(Duration::from_secs(30)) => {}
            }
        }
        for (_, (_, stop, _)) in running {
            stop.cancel();
        }
        // Every mirror task is waited for: none outlives the lead.
        while tasks.join_next().await.is_some() {}
        let _ = watcher.await;
    }

    /// Reads each new notification once and wakes the mirror whose inbox it
    /// was delivered to.
    async fn watch_inboxes(self: Arc<Self>, cancel: CancellationToken) {
        let mut follow = self.follow.clone();
        let mut position = None;
        while !cancel.is_cancelled() {
            let at = match position {
                Some(p) => p,
                None => match self.store.head().await {
                    Ok(h) => {
                        position = Some(h);
                        continue;
                    }
                    Err(_) => 0,
                },
            };
            if position.is_some()
                && let Ok((records, reached)) = self.store.engine_changes(at, &[names::SUBSCRIPTION_NOTIFICATION], 1024).await
            {
                let wakes = self.wakes.read().map(|w| w.clone()).unwrap_or_default();
                for record in &records {
                    if let Ok(stored) = serde_json::from_str::<Reference>(&record.body)
                        && let Some(wake) = stored.reference.as_deref().and_then(|r| wakes.get(r))
                    {
                        wake.notify_one();
                    }
                }
                position = Some(reached);
                if records.len() == 1024 {
                    continue;
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = follow.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    fn set_state(&self, name: &str, update: impl FnOnce(&mut MirrorState)) {
        if let Ok(mut states) = self.states.lock()
            && let Some(state) = states.get_mut(name)
        {
            update(state);
        }
    }

    /// One mirror: subscribe (and renew), apply, reconcile, until `stop`;
    /// when the mirror entity is `gone`, cancel the subscription at the peer.
    async fn mirror(self: Arc<Self>, spec: Spec, stop: CancellationToken, gone: Arc<std::sync::atomic::AtomicBool>) {
        if let Ok(mut states) = self.states.lock() {
            let state = MirrorState { peer: spec.peer.clone(), pattern: spec.pattern.clone(), state: "subscribing", ..Default::default() };
            states.insert(spec.name.clone(), state);
        }
        let Ok(glob) = Glob::new_path(&spec.pattern) else { return };
        let inbox = format!("{INBOX_PREFIX}{}", spec.name);
        let mut applier = Applier {
            mirror: &self,
            spec: &spec,
            glob,
            inbox,
            known: BTreeSet::new(),
            mine: HashMap::new(),
            touched: Default::default(),
            upstream: spec.peer.clone(),
            sequences: HashMap::new(),
            unknown_below: 0,
            taken: 0,
            marked: 0,
            suspects: Default::default(),
            distrusted: None,
        };
        // Registered before the first read, so no notification falls between.
        let wake = Arc::new(tokio::sync::Notify::new());
        if let Ok(mut wakes) = self.wakes.write() {
            wakes.insert(applier.inbox.clone(), wake.clone());
        }
        let mut cursor = loop {
            match applier.start().await {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(error = %e, mirror = spec.name, "cannot read the mirror's cursor; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(RETRY_MIN) => {}
                    }
                }
            }
        };
        // Whatever arrived while no applier ran (a restart, a takeover).
        match applier.step(cursor).await {
            Ok(c) => cursor = c,
            Err(e) => tracing::warn!(error = %e, mirror = spec.name, "mirror apply step failed; retrying"),
        }
        let mut subscription: Option<String> = None;
        let mut renew_at = tokio::time::Instant::now();
        let mut retry = RETRY_MIN;
        let mut reconcile = tokio::time::interval(self.settings.reconcile.max(Duration::from_millis(100)));
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        reconcile.tick().await;
        // Where the subscription is held, as seen from the peer: the
        // redirects followed, and the alternatives the last redirect
        // offered (seed 000 §8.4a: where to go first when the relay dies).
        let (mut hops, mut alternatives) = (0u32, Vec::<Relay>::new());
        let mut probe = tokio::time::interval((self.settings.repair_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(10)));
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Since when the upstream has not answered a probe; and, once that
        // outlasted the repair timeout, the repair under way.
        let (mut unanswered, mut repairing) = (None::<tokio::time::Instant>, false);
        // Subscriptions left at relays that stopped answering: cancelled
        // there if they answer again, forgotten when their token expires
        // (the relay then ends them itself, seed 000 §7.3).
        let mut abandoned: Vec<Abandoned> = Vec::new();
        // The upstream the metrics show as current, and every one shown.
        let (mut previous, mut shown) = (None::<String>, Vec::<String>::new());
        // Relays that forged or withheld a change: never attached to again
        // by this mirror (the newest MAX_ABANDONED of them).
        let mut shunned: Vec<String> = Vec::new();
        loop {
            // A relay that stopped answering withholds everything: the
            // repair above deals with it (and may come back to it).
            if let Some((relay, why)) = applier.distrusted.take()
                && relay == applier.upstream
                && relay != spec.peer
                && (why == "forged" || unanswered.is_none())
            {
                tracing::warn!(mirror = spec.name, relay, why, "the relay forged or withheld a change; attaching elsewhere");
                metrics::counter!(crate::metrics::MIRROR_RELAYS_LEFT, "mirror" => spec.name.clone()).increment(1);
                shunned.retain(|r| *r != relay);
                shunned.truncate(MAX_ABANDONED - 1);
                shunned.insert(0, relay.clone());
                if let Some(id) = subscription.take() {
                    Abandoned::push(&mut abandoned, &relay, id, self.settings.token_ttl);
                }
                // Its deliveries are foreign from now on.
                applier.upstream = spec.peer.clone();
                (unanswered, repairing, renew_at) = (None, false, tokio::time::Instant::now());
                let why = format!("left the relay {relay}: it {why} a change");
                self.set_state(&spec.name, |s| {
                    s.state = "repairing";
                    s.upstream = None;
                    s.last_error = Some(why);
                });
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(renew_at) => {
                    // Renewed where it is held; a first subscription starts
                    // at the peer and may be redirected to a relay; a repair
                    // tries the cached alternatives first, then the peer.
                    let (from, base) = if subscription.is_some() { (applier.upstream.clone(), hops) } else { (spec.peer.clone(), 0) };
                    let avoid: Vec<&str> = shunned.iter().map(String::as_str).collect();
                    let attached = tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        attached = async {
                            if repairing {
                                self.reattach(&spec, &applier.upstream, &alternatives, hops, &applier.inbox, &avoid).await
                            } else {
                                self.attach(&spec, &from, &applier.inbox, &avoid).await.map(|a| a.below(base))
                            }
                        } => attached,
                    };
                    match attached {
                        Ok(a) => {
                            // A first subscription, or one the upstream
                            // ended meanwhile (a new id): what was missed is
                            // re-read.
                            let fresh = subscription.as_ref() != Some(&a.id);
                            applier.upstream = a.upstream.clone();
                            // Held there again: nothing of it to cancel.
                            abandoned.retain(|x| x.upstream != a.upstream);
                            hops = a.hops;
                            if !a.alternatives.is_empty() {
                                alternatives = a.alternatives;
                            }
                            if fresh {
                                // What the upstream holds now: changes after
                                // the subscription come as notifications.
                                applier.discover(&stop).await;
                                applier.reread_all(&stop).await;
                            }
                            let repaired = std::mem::take(&mut repairing).then_some(unanswered).flatten().map(|since| since.elapsed());
                            unanswered = None;
                            if let Some(took) = repaired {
                                tracing::info!(mirror = spec.name, upstream = a.upstream, took_ms = took.as_millis() as u64, "mirror repaired");
                                metrics::counter!(crate::metrics::MIRROR_REPAIRS, "mirror" => spec.name.clone()).increment(1);
                            }
                            self.set_state(&spec.name, |s| {
                                s.state = "subscribed";
                                s.subscription_id = Some(a.id.clone());
                                s.upstream = Some(a.upstream.clone());
                                s.hops = hops;
                                s.last_error = None;
                                if let Some(took) = repaired {
                                    s.repairs += 1;
                                    s.last_repair_ms = Some(took.as_millis() as u64);
                                }
                            });
                            metrics::gauge!(crate::metrics::MIRROR_HOPS, "mirror" => spec.name.clone()).set(hops as f64);
                            // One series per upstream held at, at most
                            // MAX_ABANDONED of them, then "other": relays come
                            // from redirects, so their number is not ours.
                            let label = if shown.contains(&a.upstream) || shown.len() < MAX_ABANDONED {
                                a.upstream.clone()
                            } else {
                                "other".to_owned()
                            };
                            if previous.as_deref() != Some(label.as_str()) {
                                if let Some(p) = previous.take() {
                                    metrics::gauge!(crate::metrics::MIRROR_UPSTREAM, "mirror" => spec.name.clone(), "upstream" => p).set(0.0);
                                }
                                metrics::gauge!(crate::metrics::MIRROR_UPSTREAM, "mirror" => spec.name.clone(), "upstream" => label.clone()).set(1.0);
                                if !shown.contains(&label) {
                                    shown.push(label.clone());
                                }
                                previous = Some(label);
                            }
                            subscription = Some(a.id);
                            retry = RETRY_MIN;
                            renew_at = tokio::time::Instant::now() + (self.settings.token_ttl / 2).max(Duration::from_secs(5));
                        }
                        Err(why) => {
                            tracing::warn!(mirror = spec.name, why, "cannot subscribe at the mirrored peer; retrying");
                            self.set_state(&spec.name, |s| { s.state = "failing"; s.last_error = Some(why); });
                            // Started again from the peer (renewals too: the
                            // relay may be gone); a repair stays one until it
                            // holds a subscription somewhere.
                            if let Some(id) = subscription.take() {
                                Abandoned::push(&mut abandoned, &applier.upstream, id, self.settings.token_ttl);
                            }
                            renew_at = tokio::time::Instant::now() + jittered(retry);
                            retry = (retry * 2).min(RETRY_MAX);
                        }
                    }
                }
                _ = probe.tick(), if subscription.is_some() => {
                    let answers = tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        answers = self.answers(&applier.upstream) => answers,
                    };
                    if answers {
                        // Back after an outage: renewed now, in case it
                        // ended the subscription meanwhile.
                        if unanswered.take().is_some() {
                            renew_at = tokio::time::Instant::now();
                            self.set_state(&spec.name, |s| { s.state = "subscribed"; s.last_error = None; });
                        }
                    } else {
                        let since = *unanswered.get_or_insert_with(tokio::time::Instant::now);
                        let relayed = applier.upstream != spec.peer;
                        let why = format!("the upstream {} does not answer", applier.upstream);
                        // Only a relay is left: the peer itself has no
                        // stand-in, its subscription resumes when it is back.
                        if relayed && since.elapsed() >= self.settings.repair_timeout {
                            tracing::warn!(mirror = spec.name, upstream = applier.upstream, "the relay stopped answering; attaching elsewhere");
                            repairing = true;
                            renew_at = tokio::time::Instant::now();
                            if let Some(id) = subscription.take() {
                                Abandoned::push(&mut abandoned, &applier.upstream, id, self.settings.token_ttl);
                            }
                            self.set_state(&spec.name, |s| { s.state = "repairing"; s.last_error = Some(why); });
                        } else {
                            self.set_state(&spec.name, |s| { s.state = "unreachable"; s.last_error = Some(why); });
                        }
                    }
                }
                _ = wake.notified() => {
                    match applier.step(cursor).await {
                        Ok(c) => cursor = c,
                        Err(e) => tracing::warn!(error = %e, mirror = spec.name, "mirror apply step failed; retrying"),
                    }
                }
                _ = reconcile.tick() => {
                    applier.reconcile(&stop).await;
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        _ = self.cancel_abandoned(&spec, &mut abandoned) => {}
                    }
                }
            }
        }
        // Only this task's entry: a restarted mirror of the same name may
        // have registered its own already.
        if let Ok(mut wakes) = self.wakes.write()
            && wakes.get(&applier.inbox).is_some_and(|w| Arc::ptr_eq(w, &wake))
        {
            wakes.remove(&applier.inbox);
        }
        if gone.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(id) = subscription
                && let Err(why) = self.unsubscribe(&spec, &applier.upstream, &id).await
            {
                tracing::warn!(mirror = spec.name, why, "could not cancel the mirror's subscription; its token's expiry ends it");
            }
            let _ = self.store.device_forget(CURSOR_OWNER, &spec.name).await;
            let _ = self.store.peer_mark_forget(CURSOR_OWNER, &mark_name(&spec)).await;
            if let Ok(mut states) = self.states.lock() {
                states.remove(&spec.name);
            }
        }
    }

    async fn endpoint(&self, peer: &str) -> Result<String, String> {
        match self.store.tree_get(&format!("{}{peer}", crate::peer::PREFIX)).await {
            Ok(Some(entry)) => crate::peer::endpoint_of(&entry.entity).ok_or_else(|| "the peer entity has no endpoint".into()),
            Ok(None) => Err(format!("peer {peer} is not known here ({}{peer})", crate::peer::PREFIX)),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A signed EXECUTE on `upstream`'s `system/subscription` (the caller
    /// capability, minted by the peer, only travels to the peer).
    fn execute(
        &self,
        spec: &Spec,
        upstream: &str,
        operation: &str,
        targets: Value,
        params: Value,
        mut included: Map<String, Value>,
    ) -> Value {
        let mut data = json!({
            "request_id": generate_id(),
            "uri": super::HANDLER,
            "operation": operation,
            "resource": {"targets": targets},
            "params": params,
            "author": self.server.hash(),
        });
        if let Some((hash, bundle)) = spec.capability.as_ref().filter(|_| upstream == spec.peer) {
            data["capability"] = json!(hash);
            included.extend(bundle.clone());
        }
        let execute = Entity { kind: "system/protocol/execute".into(), data };
        let (_, hash) = execute.canonical();
        self.sign_into(&hash, &mut included);
        json!({"execute": execute, "included": included})
    }

    fn sign_into(&self, target: &str, included: &mut Map<String, Value>) {
        let signature = self.server.sign(target);
        if let Ok(hash) = hash_of(&signature) {
            included.insert(hash, signature);
        }
        included.insert(self.server.hash().to_owned(), self.server.entity().clone());
    }

    async fn post(&self, upstream: &str, envelope: &Value) -> Result<(u16, Value), String> {
        let endpoint = self.endpoint(upstream).await?;
        let r = self.http.post(&format!("{endpoint}/v1/execute"))?.json(envelope).send().await.map_err(|e| e.to_string())?;
        let status = r.status().as_u16();
        Ok((status, crate::peer::read_json(r).await))
    }

    /// Subscribes (or renews) at `upstream`.
    async fn subscribe(&self, spec: &Spec, upstream: &str, inbox: &str) -> Subscribed {
        let expires_at = chrono::Utc::now().timestamp_millis() + self.settings.token_ttl.as_millis() as i64;
        let token = Entity {
            kind: "system/capability/token".into(),
            data: json!({
                "granter": self.server.hash(),
                "grantee": upstream,
                "grants": [{"handler": "system/inbox", "operations": ["receive"], "resources": [inbox]}],
                "expires_at": expires_at,
            }),
        };
        let (_, token_hash) = token.canonical();
        let mut included = Map::new();
        self.sign_into(&token_hash, &mut included);
        included.insert(token_hash.clone(), serde_json::to_value(&token).unwrap_or_default());
        let params = json!({"type": "system/subscription/request", "data": {
            "deliver_to": {"uri": format!("entity://{}/{inbox}", self.server.hash())},
            "deliver_token": token_hash,
            "include_payload": true,
            "relay_endpoint": self.settings.public_url,
        }});
        let envelope = self.execute(spec, upstream, "subscribe", json!([spec.pattern]), params, included);
        match self.post(upstream, &envelope).await {
            Err(why) => Subscribed::Failed(why),
            Ok((200, body)) => match body["result"]["subscription_id"].as_str() {
                Some(id) => Subscribed::Held(id.to_owned()),
                None => Subscribed::Failed(format!("unexpected answer {body}")),
            },
            Ok((303, body)) => Subscribed::Redirected(crate::peer::alternatives(&body, super::MAX_ALTERNATIVES)),
            Ok((status, body)) => Subscribed::Failed(format!("{status} {}", body["error"]["code"].as_str().unwrap_or("refused"))),
        }
    }

    /// Subscribes at `from`, following capacity redirects to relays
    /// ([`crate::peer::follow_redirects`]; each relay proven by
    /// `GET /v1/identity` and learned here).
    async fn attach(&self, spec: &Spec, from: &str, inbox: &str, avoid: &[&str]) -> Result<Attached, String> {
        crate::peer::follow_redirects(from, self.server.hash(), avoid, &Asking { mirrors: self, spec, inbox }).await
    }

    /// Attaches again after `dead` stopped answering: at one of the cached
    /// `alternatives` (the dead relay's siblings, at its depth `hops`,
    /// following their redirects), else at the peer, which redirects anew.
    async fn reattach(
        &self,
        spec: &Spec,
        dead: &str,
        alternatives: &[Relay],
        hops: u32,
        inbox: &str,
        shunned: &[&str],
    ) -> Result<Attached, String> {
        use rand::seq::SliceRandom as _;
        let avoid: Vec<&str> = std::iter::once(dead).chain(shunned.iter().copied()).collect();
        let mut cached: Vec<&(String, String)> = alternatives
            .iter()
            .filter(|(peer, _)| !avoid.contains(&peer.as_str()) && peer != self.server.hash() && *peer != spec.peer)
            .collect();
        cached.shuffle(&mut rand::rng());
        for (peer, endpoint) in cached {
            if self.prove(peer, endpoint).await
                && let Ok(a) = self.attach(spec, peer, inbox, &avoid).await
            {
                return Ok(a.below(hops));
            }
        }
        self.attach(spec, &spec.peer, inbox, &avoid).await
    }

    /// Whether `peer` answers `GET /v1/identity` as itself within a
    /// quarter of the repair timeout (the probe of an upstream).
    async fn answers(&self, peer: &str) -> bool {
        let Ok(endpoint) = self.endpoint(peer).await else { return false };
        let within = (self.settings.repair_timeout / 4).min(self.settings.timeout).max(Duration::from_millis(50));
        self.http.proves(peer, &endpoint, within).await
    }

    /// Cancels the abandoned subscriptions whose relay answers again (all
    /// probed at once); forgets those whose token has expired. (One at a
    /// server attached to again is dropped from the list then: a renewal
    /// keeps the id, so it is the live subscription.)
    async fn cancel_abandoned(&self, spec: &Spec, abandoned: &mut Vec<Abandoned>) {
        let now = tokio::time::Instant::now();
        abandoned.retain(|a| a.until > now);
        let answering = futures_util::future::join_all(abandoned.iter().map(|a| self.answers(&a.upstream))).await;
        let mut kept = Vec::new();
        for (a, answers) in std::mem::take(abandoned).into_iter().zip(answering) {
            if !answers {
                kept.push(a);
                continue;
            }
            match self.unsubscribe(spec, &a.upstream, &a.id).await {
                Ok(()) => tracing::info!(
                    mirror = spec.name,
                    upstream = a.upstream,
                    "cancelled the subscription left at a relay that answers again"
                ),
                Err(why) => {
                    tracing::debug!(mirror = spec.name, upstream = a.upstream, why, "could not cancel a subscription left at a relay yet");
                    kept.push(a);
                }
            }
        }
        *abandoned = kept;
    }

    /// Whether `endpoint` answers `GET /v1/identity` as `peer`; if so, and
    /// this server does not know `peer` yet, it learns it there.
    async fn prove(&self, peer: &str, endpoint: &str) -> bool {
        if !self.http.proves(peer, endpoint, self.settings.timeout).await {
            return false;
        }
        let agent = Agent { id: self.server.hash().to_owned(), kind: Some("server".into()) };
        match self.store.tree_write(super::learned_peer(peer, endpoint, agent, generate_id())).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(error = %e, peer, "could not store a relay's endpoint");
                false
            }
        }
    }

    async fn unsubscribe(&self, spec: &Spec, upstream: &str, id: &str) -> Result<(), String> {
        let params = json!({"type": "system/subscription/cancel", "data": {"subscription_id": id}});
        let envelope = self.execute(spec, upstream, "unsubscribe", json!([]), params, Map::new());
        match self.post(upstream, &envelope).await? {
            (200 | 404, _) => Ok(()),
            (status, body) => Err(format!("{status} {body}")),
        }
    }

    /// The peer's entity at `path` now, read at the peer itself.
    async fn reread(&self, peer: &str, path: &str) -> Result<Read, String> {
        let endpoint = self.endpoint(peer).await?;
        let r = self.http.get(&format!("{endpoint}/v1/tree/{path}"))?.send().await.map_err(|e| e.to_string())?;
        // The change that wrote what is there, or (for nothing there) the
        // change as of which nothing is.
        let sequence = r.headers().get(crate::tree::CHANGE_ID_HEADER).and_then(|v| v.to_str().ok()?.parse().ok());
        match r.status().as_u16() {
            404 => Ok(Read { bytes: None, sequence }),
            200 => {
                let body = String::from_utf8(crate::peer::read_answer(r).await?).map_err(|e| e.to_string())?;
                let entity: Entity = serde_json::from_str(&body).map_err(|e| format!("the peer's entity at {path}: {e}"))?;
                entity.check().map_err(|e| e.0)?;
                Ok(Read { bytes: Some(entity.canonical()), sequence })
            }
            status => Err(format!("GET {path} at the peer answered {status}")),
        }
    }
}

/// One mirror subscribing, as [`crate::peer::follow_redirects`] drives it.
struct Asking<'a> {
    mirrors: &'a Mirrors,
    spec: &'a Spec,
    inbox: &'a str,
}

impl crate::peer::Subscriber for Asking<'_> {
    async fn subscribe_at(&self, at: &str) -> Subscribed {
        self.mirrors.subscribe(self.spec, at, self.inbox).await
    }

    async fn prove(&self, peer: &str, endpoint: &str) -> bool {
        self.mirrors.prove(peer, endpoint).await
    }
}

/// A subscription left at a relay that stopped answering.
struct Abandoned {
    upstream: String,
    id: String,
    /// When its deliver token expires (and the relay ends it itself).
    until: tokio::time::Instant,
}

impl Abandoned {
    /// Remembers subscription `id` left at `upstream` (the newest first,
    /// at most [`MAX_ABANDONED`]).
    fn push(abandoned: &mut Vec<Abandoned>, upstream: &str, id: String, token_ttl: Duration) {
        abandoned.truncate(MAX_ABANDONED - 1);
        abandoned.insert(0, Abandoned { upstream: upstream.to_owned(), id, until: tokio::time::Instant::now() + token_ttl });
    }
}

/// One mirror's applier state.
struct Applier<'a> {
    mirror: &'a Mirrors,
    spec: &'a Spec,
    glob: Glob,
    inbox: String,
    /// Paths seen in notifications or held locally: what reconciliation
    /// re-reads.
    known: BTreeSet<String>,
    /// The hash this mirror last wrote at a path (a cache of "who wrote
    /// what is here").
    mine: HashMap<String, Option<String>>,
    /// Paths notified since the last reconciliation: their stream is
    /// flowing, so reconciliation leaves them alone (re-reading a path
    /// mid-burst would jump ahead of its notifications).
    touched: std::collections::HashSet<String>,
    /// The server the subscription is held at: only its deliveries are
    /// applied. (Re-reads and discovery always go to the peer itself: a
    /// relay's answers are not signed.)
    upstream: String,
    /// The sequence of the peer's change this mirror last took at a path
    /// (a cache of what the log says): older signed changes are refused.
    sequences: HashMap<String, u64>,
    /// A signed change at or below this, for a path whose sequence is not
    /// known here (not cached, and not kept with the local change that
    /// wrote it: a deletion, a re-read), may be older than what the path
    /// holds: it is settled by reading the path at the peer, not applied.
    /// The stored mark at start (a restart forgets the cache), raised to
    /// [`Self::taken`] whenever the cache is dropped.
    unknown_below: u64,
    /// The highest sequence of the peer's this mirror took.
    taken: u64,
    /// The stored mark: every sequence taken, in this run or an earlier
    /// one, is at or below it (raised before a write takes one).
    marked: u64,
    /// Paths a reconciliation found behind the peer while a relay held
    /// the subscription: a relay that has still not notified them at the
    /// next reconciliation withheld them.
    suspects: std::collections::HashSet<String>,
    /// Set when the relay held at forged a change (`"forged"`) or withheld
    /// one (`"withheld"`): the mirror leaves it.
    distrusted: Option<(String, &'static str)>,
}

/// What a re-read at the peer found.
struct Read {
    /// The canonical bytes and hash, `None` when nothing is there.
    bytes: Option<(String, String)>,
    /// The peer's log id of the change that wrote them (`Tidings-Change-Id`).
    sequence: Option<u64>,
}

/// The key of a mirror's mark of its peer's log: the mirror and the peer
/// (a mirror pointed at another peer starts with no mark: the old one
/// counts another log).
fn mark_name(spec: &Spec) -> String {
    format!("{}@{}", spec.name, spec.peer)
}

/// Just the `ref` of a stored event.
#[derive(Deserialize)]
struct Reference {
    #[serde(rename = "ref")]
    reference: Option<String>,
}

#[derive(Deserialize)]
struct Stored {
    #[serde(rename = "ref")]
    reference: Option<String>,
    #[serde(default)]
    agent: Option<Agent>,
    payload: StoredPayload,
}

#[derive(Deserialize)]
struct StoredPayload {
    data: NotificationData,
    #[serde(default)]
    chain_id: Option<String>,
    #[serde(default)]
    included: Map<String, Value>,
}

impl Applier<'_> {
    /// The cursor: stored, else the head (nothing was delivered here for a
    /// mirror that never ran); also learns the paths held locally.
    async fn start(&mut self) -> Result<EventId, StoreError> {
        let store = &self.mirror.store;
        let mark = store.peer_mark(CURSOR_OWNER, &mark_name(self.spec)).await?.unwrap_or(0).max(0) as u64;
        (self.marked, self.unknown_below) = (mark, mark);
        let prefix = literal_prefix(&self.spec.pattern);
        for entry in store.tree_entries_below(&prefix, MAX_KNOWN).await? {
            if self.glob.matches(&entry.path) {
                self.known.insert(entry.path);
            }
        }
        if let Some(cursor) = store.device_cursor(CURSOR_OWNER, &self.spec.name).await? {
            return Ok(cursor);
        }
        let head = store.head().await?;
        store.device_ack(CURSOR_OWNER, &self.spec.name, head, now_ms()).await
    }

    fn agent(&self) -> Agent {
        Agent { id: self.mirror.server.hash().to_owned(), kind: Some(format!("mirror:{}", self.spec.name)) }
    }

    /// Applies the inbox's notifications after `cursor`; the new cursor.
    async fn step(&mut self, mut cursor: EventId) -> Result<EventId, StoreError> {
        loop {
            let (records, reached) = self.mirror.store.engine_changes(cursor, &[names::SUBSCRIPTION_NOTIFICATION], BATCH).await?;
            for record in &records {
                let Ok(stored) = serde_json::from_str::<Stored>(&record.body) else { continue };
                if stored.reference.as_deref() != Some(self.inbox.as_str()) {
                    continue;
                }
                // Only the mirrored peer's deliveries are applied (the
                // receiver set the agent from the verified signature).
                if stored.agent.as_ref().is_none_or(|a| a.id != self.upstream) {
                    self.count("foreign_ignored");
                    continue;
                }
                self.apply(stored.payload).await?;
            }
            if reached != cursor {
                cursor = self.mirror.store.device_ack(CURSOR_OWNER, &self.spec.name, reached, now_ms()).await?;
            }
            if records.len() < BATCH {
                return Ok(cursor);
            }
        }
    }

    async fn apply(&mut self, n: StoredPayload) -> Result<(), StoreError> {
        let path = n.data.uri.clone();
        if !self.glob.matches(&path) || crate::tree::is_system(&path) || validate_path(&path).is_err() {
            return Ok(());
        }
        let outcome = self.decide(&path, n).await?;
        self.count(outcome);
        Ok(())
    }

    /// Applies one notification for `path`; what became of it.
    ///
    /// Only a change the peer signed counts as the upstream notifying the
    /// path (it is then known, left alone by the next reconciliation, and
    /// clears a suspicion of withholding); anything else is settled by
    /// reading the path at the peer, never by its word.
    async fn decide(&mut self, path: &str, n: StoredPayload) -> Result<&'static str, StoreError> {
        let t = Transition { uri: &n.data.uri, hash: n.data.hash.as_deref(), previous_hash: n.data.previous_hash.as_deref() };
        let carried = signed::carried(n.data.signed.iter().map(String::as_str), &n.included);
        let proof = signed::prove(&carried, &self.spec.peer, t);
        if proof == Proof::Forged {
            // Never applied, never re-read on its word; a relay that
            // forges is left.
            if self.upstream != self.spec.peer {
                self.distrusted = Some((self.upstream.clone(), "forged"));
            }
            return Ok("forged_refused");
        }
        // What the change leaves at the path is its signed hash (none for a
        // deletion), whatever kind the notification names.
        let target = n.data.hash.clone();
        let local = self.mirror.store.tree_get(path).await?;
        let here = local.as_ref().map(|e| e.hash.clone());
        let chain_id = n.chain_id.clone().unwrap_or_else(generate_id);
        let mut proof = proof;
        if let Proof::Signed { sequence } = proof {
            match self.held_sequence(path, local.as_ref()).await? {
                // Older than what is held: an old lap, or a relay
                // replaying. Not a notification of the path: a
                // reconciliation still compares it with the peer.
                Some(held) if here != target && sequence <= held => return Ok("rollback_refused"),
                // Nothing here, and perhaps a deletion taken before a
                // restart (a deletion leaves nothing to read its sequence
                // from): the peer says what the path holds. With an entity
                // here, a replay would need the path to hold the old
                // content again (the A→B→A limit); a change that follows
                // what is held is taken, as before.
                None if local.is_none() && sequence <= self.unknown_below => proof = Proof::Unsigned,
                _ => {}
            }
        }
        if let Proof::Signed { sequence } = proof {
            if self.known.len() < MAX_KNOWN {
                self.known.insert(path.to_owned());
            }
            if self.touched.len() < MAX_KNOWN {
                self.touched.insert(path.to_owned());
            }
            // The relay notified this path: whatever a reconciliation found
            // it behind on is on its way.
            self.suspects.remove(path);
            if here == target {
                // Taken too (a deletion of what is absent here, say): a
                // replay of an older change is refused after a restart.
                self.mark(sequence).await?;
                self.held(path, sequence);
                return Ok("unchanged");
            }
            if here == n.data.previous_hash {
                let bundled = match &target {
                    None => Some(None),
                    Some(h) => n
                        .included
                        .get(h)
                        .and_then(|v| serde_json::from_value::<Entity>(v.clone()).ok())
                        .filter(|e| e.check().is_ok())
                        .map(|e| e.canonical())
                        .filter(|(_, bundled)| bundled == h)
                        .map(Some),
                };
                if let Some(bytes) = bundled {
                    self.mark(sequence).await?;
                    let kept = signed::verified(&carried, t);
                    let written = self.write(path, here.as_deref(), bytes, &chain_id, &kept).await?;
                    if written {
                        self.held(path, sequence);
                    }
                    return Ok(if written { "applied" } else { "stale_rejected" });
                }
                // No usable bundled entity: read it instead.
            }
        }
        if !self.faithful(path, local.as_ref()).await? {
            return Ok("stale_rejected");
        }
        let outcome = self.reread_and_apply(path, here, &chain_id).await?;
        // What the peer did not sign is taken from the peer itself.
        Ok(if proof == Proof::Unsigned && outcome == "gap_reread" { "unsigned_reread" } else { outcome })
    }

    /// Raises the stored mark before a write takes the peer's change
    /// `sequence`, so that after a restart no change at or below it is
    /// applied on its signature alone.
    async fn mark(&mut self, sequence: u64) -> Result<(), StoreError> {
        if sequence > self.marked {
            let ahead = i64::try_from(sequence.saturating_add(MARK_AHEAD)).unwrap_or(i64::MAX);
            let marked = self.mirror.store.peer_mark_raise(CURSOR_OWNER, &mark_name(self.spec), ahead, now_ms()).await?;
            self.marked = marked.max(0) as u64;
        }
        Ok(())
    }

    /// Records that the peer's change `sequence` is what `path` holds.
    fn held(&mut self, path: &str, sequence: u64) {
        self.taken = self.taken.max(sequence);
        if self.sequences.len() >= MAX_KNOWN {
            self.sequences.clear();
            self.unknown_below = self.unknown_below.max(self.taken);
        }
        let held = self.sequences.entry(path.to_owned()).or_default();
        *held = (*held).max(sequence);
    }

    /// The sequence of the peer's change that `path` holds here: cached,
    /// else read from the signed changes kept with the local change that
    /// wrote it; `None` when unknown.
    async fn held_sequence(&mut self, path: &str, local: Option<&crate::store::TreeEntry>) -> Result<Option<u64>, StoreError> {
        if let Some(s) = self.sequences.get(path) {
            return Ok(Some(*s));
        }
        let Some(entry) = local else { return Ok(None) };
        let Some(record) = self.writer_of(entry).await? else { return Ok(None) };
        #[derive(Deserialize)]
        struct Body {
            payload: Carried,
        }
        #[derive(Deserialize)]
        struct Carried {
            #[serde(default)]
            signed: Vec<SignedChange>,
        }
        let sequence = serde_json::from_str::<Body>(&record.body).ok().and_then(|b| {
            b.payload.signed.iter().find(|s| s.origin() == Some(self.spec.peer.as_str()) && s.verifies()).and_then(SignedChange::sequence)
        });
        if let Some(sequence) = sequence {
            self.held(path, sequence);
        }
        Ok(sequence)
    }

    /// Re-reads `path` at the peer and writes its bytes over `here`.
    async fn reread_and_apply(&mut self, path: &str, here: Option<String>, chain_id: &str) -> Result<&'static str, StoreError> {
        Ok(match self.mirror.reread(&self.spec.peer, path).await {
            Ok(read) if read.bytes.as_ref().map(|(_, h)| h) == here.as_ref() => {
                if let Some(sequence) = read.sequence {
                    self.held(path, sequence);
                }
                "stale_rejected"
            }
            Ok(read) => {
                self.mark(read.sequence.unwrap_or(0)).await?;
                match self.write(path, here.as_deref(), read.bytes, chain_id, &[]).await? {
                    true => {
                        if let Some(sequence) = read.sequence {
                            self.held(path, sequence);
                        }
                        "gap_reread"
                    }
                    false => "stale_rejected",
                }
            }
            Err(why) => {
                tracing::debug!(mirror = self.spec.name, why, "re-read failed; reconciliation retries it");
                self.mirror.set_state(&self.spec.name, |s| s.last_error = Some(why));
                "reread_failed"
            }
        })
    }

    /// Whether what is at `path` was put there by this mirror (or nothing
    /// is there): then a mismatch is a gap, not a stale lap.
    async fn faithful(&mut self, path: &str, local: Option<&crate::store::TreeEntry>) -> Result<bool, StoreError> {
        let Some(entry) = local else { return Ok(true) };
        if let Some(written) = self.mine.get(path) {
            return Ok(written.as_deref() == Some(entry.hash.as_str()));
        }
        // Not written since this mirror started: ask the log who did.
        let Some(record) = self.writer_of(entry).await? else {
            // Pruned: who wrote it is unknown, so it is not overwritten.
            return Ok(false);
        };
        let agent = serde_json::from_str::<Value>(&record.body).ok().map(|b| b["agent"].clone()).unwrap_or(Value::Null);
        let ours = serde_json::to_value(self.agent()).unwrap_or_default();
        Ok(agent == ours)
    }

    /// The change event that put `entry` there, unless retention pruned it.
    async fn writer_of(&self, entry: &crate::store::TreeEntry) -> Result<Option<crate::store::Record>, StoreError> {
        let records = self.mirror.store.read_after(entry.changed_event - 1, 1).await?;
        Ok(records.into_iter().next().filter(|r| r.id == entry.changed_event))
    }

    /// A CAS write of `bytes` (or a deletion) over `here`; `false` if the
    /// path changed meanwhile.
    /// `carried`: the signed changes it was taken from, kept with the
    /// change so the engine forwards them.
    async fn write(
        &mut self,
        path: &str,
        here: Option<&str>,
        bytes: Option<(String, String)>,
        chain_id: &str,
        carried: &[SignedChange],
    ) -> Result<bool, StoreError> {
        let condition = match here {
            Some(h) => Condition::IfMatch(h.to_owned()),
            None if bytes.is_none() => return Ok(true),
            None => Condition::IfAbsent,
        };
        let hash = bytes.as_ref().map(|(_, h)| h.clone());
        let write = TreeWrite {
            path: path.to_owned(),
            entity: bytes,
            condition,
            event: change_event_with(
                path,
                self.agent(),
                hash.clone(),
                chain_id.to_owned(),
                (!carried.is_empty()).then(|| serde_json::to_value(carried).unwrap_or_default()),
            ),
        };
        let done = matches!(self.mirror.store.tree_write(write).await?, TreeOutcome::Done { .. });
        if done {
            // A cache: dropped whole when it is full (the log answers then).
            if self.mine.len() >= MAX_KNOWN {
                self.mine.clear();
            }
            self.mine.insert(path.to_owned(), hash);
        }
        Ok(done)
    }

    /// Learns the paths the peer holds under the pattern (its tree listing,
    /// walked from the pattern's literal prefix, bounded).
    async fn discover(&mut self, stop: &CancellationToken) {
        let Ok(endpoint) = self.mirror.endpoint(&self.spec.peer).await else { return };
        let mut dirs = vec![literal_prefix(&self.spec.pattern)];
        if self.glob.matches(&dirs[0]) {
            self.known.insert(dirs[0].clone());
        }
        // Bounded whatever the peer answers: each directory once, only
        // below the one listed, at most MAX_LISTINGS listings.
        let mut listed = std::collections::HashSet::new();
        while let Some(dir) = dirs.pop() {
            if self.known.len() >= MAX_KNOWN || listed.len() >= MAX_LISTINGS || stop.is_cancelled() {
                break;
            }
            if !listed.insert(dir.clone()) {
                continue;
            }
            let Ok(request) = self.mirror.http.get(&format!("{endpoint}/v1/tree/{dir}/")) else { return };
            let Ok(r) = request.send().await else { return };
            let listing = crate::peer::read_json(r).await;
            let below = format!("{dir}/");
            for child in listing["children"].as_array().into_iter().flatten() {
                let Some(path) = child["path"].as_str() else { continue };
                if !path.starts_with(&below) || crate::tree::is_system(path) || validate_path(path).is_err() {
                    continue;
                }
                if child["entity"] == true && self.glob.matches(path) && self.known.len() < MAX_KNOWN {
                    self.known.insert(path.to_owned());
                }
                if child["has_children"] == true && path.split('/').count() < crate::tree::MAX_DEPTH && dirs.len() < MAX_LISTINGS {
                    dirs.push(path.to_owned());
                }
            }
        }
    }

    /// Compares with the peer: re-reads there every known path that was
    /// not notified since the last time (after listing the peer's paths,
    /// while a relay holds the subscription), and applies what moved on.
    /// The last notification of a burst, if it was lost, is found here;
    /// so is a relay that withholds: a path it has still not notified one
    /// reconciliation after the peer was found ahead marks it distrusted.
    async fn reconcile(&mut self, stop: &CancellationToken) {
        let relayed = self.upstream != self.spec.peer;
        if relayed && !self.suspects.is_empty() {
            tracing::warn!(mirror = self.spec.name, relay = self.upstream, paths = self.suspects.len(), "the relay withheld changes");
            self.distrusted = Some((self.upstream.clone(), "withheld"));
        }
        self.suspects.clear();
        if relayed {
            self.discover(stop).await;
        }
        self.compare(stop, relayed).await;
    }

    /// Re-reads every known path not notified since the last time; with
    /// `watch`, the paths found behind become suspects.
    async fn compare(&mut self, stop: &CancellationToken, watch: bool) {
        let touched = std::mem::take(&mut self.touched);
        let paths: Vec<String> = self.known.iter().filter(|p| !touched.contains(*p)).cloned().collect();
        for path in paths {
            if stop.is_cancelled() {
                return;
            }
            let local = match self.mirror.store.tree_get(&path).await {
                Ok(l) => l,
                Err(_) => return,
            };
            match self.faithful(&path, local.as_ref()).await {
                Ok(true) => {}
                _ => continue,
            }
            let here = local.map(|e| e.hash);
            let Ok(read) = self.mirror.reread(&self.spec.peer, &path).await else { continue };
            if let Some(sequence) = read.sequence {
                self.held(&path, sequence);
            }
            if read.bytes.as_ref().map(|(_, h)| h) != here.as_ref()
                && self.mark(read.sequence.unwrap_or(0)).await.is_ok()
                && let Ok(true) = self.write(&path, here.as_deref(), read.bytes, &generate_id(), &[]).await
            {
                self.count("gap_reread");
                if watch && self.suspects.len() < MAX_KNOWN {
                    self.suspects.insert(path);
                }
            }
        }
    }

    /// Re-reads every known path at the peer (after attaching anew:
    /// whatever the old upstream did not deliver is found here).
    async fn reread_all(&mut self, stop: &CancellationToken) {
        self.touched.clear();
        self.suspects.clear();
        self.compare(stop, false).await;
    }

    fn count(&self, outcome: &'static str) {
        metrics::counter!(crate::metrics::MIRROR_APPLIES, "outcome" => outcome).increment(1);
        self.mirror.set_state(&self.spec.name, |s| *s.applies.entry(outcome).or_default() += 1);
    }
}

/// The segments of `pattern` before its first wildcard.
fn literal_prefix(pattern: &str) -> String {
    pattern.split('/').take_while(|s| !s.contains('*')).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn mirror_entities_are_checked_only_under_the_prefix() {
        let good = Entity { kind: TYPE.into(), data: json!({"peer": HASH, "pattern": "feeds/**"}) };
        assert_eq!(check("system/mirror/feeds", &good), Ok(()));
        assert_eq!(check("notes/a", &Entity { kind: "note".into(), data: json!({}) }), Ok(()));
        for data in [
            json!({"peer": "nohash", "pattern": "feeds/**"}),
            json!({"peer": HASH, "pattern": "system/**"}),
            json!({"peer": HASH, "pattern": "**"}),
            json!({"peer": HASH, "pattern": "feeds/**", "extra": 1}),
            json!({"peer": HASH, "pattern": "feeds/**", "capability": {"hash": HASH, "included": {}}}),
        ] {
            assert!(check("system/mirror/feeds", &Entity { kind: TYPE.into(), data: data.clone() }).is_err(), "{data}");
        }
        assert!(check("system/mirror/a/b", &good).is_err());
        assert!(check("system/mirror/feeds", &Entity { kind: "note".into(), data: good.data.clone() }).is_err());
    }

    #[test]
    fn the_literal_prefix_stops_at_the_first_wildcard() {
        assert_eq!(literal_prefix("feeds/**"), "feeds");
        assert_eq!(literal_prefix("a/b/*/c"), "a/b");
        assert_eq!(literal_prefix("a/b"), "a/b");
    }
}
