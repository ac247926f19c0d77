//! Mirrors (docs/ref-federation.md, "Mirrors"): an admin writes
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
//! it knows (docs/ref-federation.md, "Repair"). Notifications arrive in that
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
use super::signed::{self, Proof, SignedChange, Transition};
use crate::store::{Condition, Store, StoreError, TreeOutcome, TreeWrite};
use tidings_outbound::Attached;
use tidings_protocol::event::{Agent, EventId, names};
use tidings_protocol::glob::Glob;
use tidings_protocol::identity::ServerIdentity;
use tidings_protocol::peer::{Relay, Subscribed};
use tidings_protocol::retry::now_ms;
use tidings_protocol::tree::{Entity, EntityError, change_event_with, generate_id, is_hash, validate_path};

mod apply;
mod link;
mod upstream;

use apply::{Applier, Reference, mark_name};
use link::Link;

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
    pub allow: std::sync::Arc<tidings_outbound::PeerAllow>,
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
    spec(name, &entity.data).map(|_| ())
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

fn spec(name: &str, data: &Value) -> Result<Spec, EntityError> {
    let d: SpecData = serde_json::from_value(data.clone())
        .map_err(|e| EntityError(format!("a mirror's data is {{peer, pattern, capability?: {{hash, included}}}}: {e}")))?;
    if !is_hash(&d.peer) {
        return Err(EntityError("peer is the mirrored server's identity hash (sha256:<64 hex>)".into()));
    }
    Glob::new_path(&d.pattern).map_err(|e| EntityError(format!("pattern: {e}")))?;
    if d.pattern == "system" || d.pattern.starts_with("system/") || d.pattern.starts_with("**") {
        return Err(EntityError("a mirror's pattern must not cover system/ (start it with a path segment)".into()));
    }
    let capability = match d.capability {
        Some(c) if is_hash(&c.hash) && c.included.contains_key(&c.hash) => Some((c.hash, c.included)),
        Some(_) => return Err(EntityError("capability is {hash, included} with the token among the included entities".into())),
        None => None,
    };
    Ok(Spec { name: name.to_owned(), peer: d.peer, pattern: d.pattern, capability })
}

/// The mirrors, run by the process that leads the engine.
#[derive(Debug)]
pub(super) struct Mirrors {
    store: Arc<dyn Store>,
    server: Arc<ServerIdentity>,
    http: tidings_outbound::Outbound,
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
        let http = tidings_outbound::Outbound::new(settings.allow.clone(), settings.timeout);
        Self { store, server, http, settings, follow, states, wakes: Default::default() }
    }

    /// Runs every configured mirror until `cancel`, re-reading the set when
    /// `changed` fires (a change under `system/mirror/`) and every 30 s.
    #[expect(clippy::disallowed_methods, reason = "the mirrors own one task per mirror, stopped with them")]
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
                Err(e) => tracing::warn!(error = %crate::report::chain(&e), "cannot read system/mirror/; retrying"),
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
                && let Ok((records, reached)) = self.store.engine_changes(at, apply::INBOX_TYPES, 1024).await
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
            resync: false,
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
                    tracing::warn!(error = %crate::report::chain(&e), mirror = spec.name, "cannot read the mirror's cursor; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(crate::pacing::MIRROR.peek()) => {}
                    }
                }
            }
        };
        // Whatever arrived while no applier ran (a restart, a takeover).
        match applier.step(cursor).await {
            Ok(c) => cursor = c,
            Err(e) => tracing::warn!(error = %crate::report::chain(&e), mirror = spec.name, "mirror apply step failed; retrying"),
        }
        if std::mem::take(&mut applier.resync) {
            applier.reread_all(&stop).await;
        }
        let mut link = Link::new();
        let mut reconcile = tokio::time::interval(self.settings.reconcile.max(Duration::from_millis(100)));
        reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        reconcile.tick().await;
        let mut probe = tokio::time::interval((self.settings.repair_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(10)));
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            link.leave_distrusted(&self, &spec, &mut applier);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(link.renew_at) => {
                    let attached = tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        attached = link.attach(&self, &spec, &applier) => attached,
                    };
                    match attached {
                        Ok(a) => link.held(&self, &spec, &mut applier, a, &stop).await,
                        Err(why) => link.failed(&self, &spec, &applier, why),
                    }
                }
                _ = probe.tick(), if link.subscription.is_some() => {
                    let answers = tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        answers = self.answers(&applier.upstream) => answers,
                    };
                    link.probed(&self, &spec, &applier, answers);
                }
                _ = wake.notified() => {
                    match applier.step(cursor).await {
                        Ok(c) => cursor = c,
                        Err(e) => tracing::warn!(error = %crate::report::chain(&e), mirror = spec.name, "mirror apply step failed; retrying"),
                    }
                    if std::mem::take(&mut applier.resync) {
                        applier.reread_all(&stop).await;
                    }
                }
                _ = reconcile.tick() => {
                    applier.reconcile(&stop).await;
                    let keep = link.returning_to(&applier);
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => break,
                        _ = self.cancel_abandoned(&spec, &mut link.abandoned, keep) => {}
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
            if let Some(id) = link.subscription
                && let Err(why) = self.unsubscribe(&spec, &applier.upstream, &id).await
            {
                tracing::warn!(mirror = spec.name, why = %why, "could not cancel the mirror's subscription; its token's expiry ends it");
            }
            let _ = self.store.device_forget(CURSOR_OWNER, &spec.name).await;
            let _ = self.store.peer_mark_forget(CURSOR_OWNER, &mark_name(&spec)).await;
            if let Ok(mut states) = self.states.lock() {
                states.remove(&spec.name);
            }
        }
    }
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
}
