//! Path subscriptions (docs/ref-subscriptions.md): the
//! `system/subscription` handler's subscribe and unsubscribe, the
//! subscription entity at `system/subscription/{id}` that is their only
//! source of truth, renewal, capacity (`303` redirects) and
//! `system/config/subscription`.
//!
//! [`execute`] checks the signed EXECUTE envelope and the caller capability
//! before a handler runs. While this process leads, the [`supervisor`] runs
//! three siblings: [`engine`] turns tree changes into notifications,
//! [`courier`] carries those addressed to other servers there, and
//! [`mirror`] applies a peer's notifications to this server's tree;
//! [`inbox`] receives what other servers carry here. Nothing here keeps
//! subscriptions in memory: the engine's index is a cache it rebuilds.
//!
//! Decisions of tidings' own (each described in docs/ref-subscriptions.md):
//! - tidings applies no default limits and never tightens requested ones;
//!   `notification_budget` is stored but has nothing to bound (a local
//!   delivery is one append).
//! - Subscribes and unsubscribes are serialised per process, so capacity and
//!   renewal checks are exact on one server; several processes on one
//!   database may overshoot a prefix's capacity by at most one subscriber
//!   per process racing.
//! - A signed EXECUTE is not single-use: replaying an old subscribe creates
//!   the subscription again (its deliver token's `expires_at` bounds that).
//! - Local inboxes have no owner identity yet, so any chain that grants
//!   this server `receive` on an inbox path may deliver there; who may *read*
//!   an inbox is decided by the `subscribe` grant for
//!   `subscription.notification`, like any other event type.
//! - `rate_limit` allows at most that many deliveries in any minute, the
//!   candidate counted. The minute is 60 whole seconds of commit time, so
//!   the window is at most 60 counts, committed with the engine's cursor.
//! - Delivery is to an inbox path on this server (a `subscription.notification`
//!   event whose `ref` is the inbox) or to another server's inbox
//!   (`entity://<peer hash>/<inbox path>`): the engine appends the
//!   notification to this server's log all the same (its `ref` the remote
//!   URI), and the [`courier`] carries it to the peer from a durable cursor.
//!   A remote inbox's peer must be known here (`system/peer/<hash>`), and
//!   the deliver token's chain must be rooted at that peer, since the peer
//!   checks it at every delivery.

pub mod courier;
pub mod engine;
pub mod execute;
pub mod inbox;
mod marker;
pub mod mirror;
pub mod signed;
mod subscribe;
pub mod supervisor;

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::seq::SliceRandom as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::refusal::{Kind, Refusal};
use crate::store::{Condition, Store, StoreError, TreeEntry, TreeWrite};
use tidings_protocol::event::Agent;
use tidings_protocol::glob::Glob;
use tidings_protocol::identity::ServerIdentity;
use tidings_protocol::tree::capability::{self, CapabilityError, Included, Token};
use tidings_protocol::tree::{Entity, change_event, generate_id, validate_path};

/// The handler a subscribe EXECUTE targets (its `uri`).
pub const HANDLER: &str = "system/subscription";
/// Where subscription entities live, and their type.
pub const DIR: &str = "system/subscription";
/// Where the capacity advertisement lives.
pub const CONFIG_PATH: &str = "system/config/subscription";
/// Where chain-error markers of lost notifications are bound.
pub const MARKER_DIR: &str = "system/runtime/chain-errors/lost";
/// The change kinds a subscription may ask for (all, by default).
pub const EVENTS: [&str; 3] = ["created", "updated", "deleted"];
/// Most subscriptions one server may keep (the bound of every scan over
/// them, and of `TIDINGS_MAX_SUBSCRIPTIONS`).
pub const MAX_SUBSCRIPTIONS: usize = 100_000;

/// The id in a subscription entity's path (`system/subscription/{id}`, one
/// segment), or `None` for any other path.
fn subscription_id_of(path: &str) -> Option<&str> {
    path.strip_prefix(DIR)?.strip_prefix('/').filter(|id| !id.is_empty() && !id.contains('/'))
}

/// `system/subscription/limits`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Terminate after this many notifications.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_events: Option<u64>,
    /// Terminate this long after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
    /// Drop notifications beyond this many per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<u64>,
    /// Budget per notification dispatch (stored; unused by local delivery).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notification_budget: Option<u64>,
}

/// The `data` of a `system/subscription` entity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathSubscription {
    /// Its id (the last segment of its path).
    pub subscription_id: String,
    /// The path pattern watched (`*` one segment, `**` one or more).
    pub pattern: String,
    /// Which changes fire it.
    pub events: Vec<String>,
    /// The inbox notifications are delivered to.
    pub deliver_uri: String,
    /// The inbox operation (`receive`).
    pub deliver_operation: String,
    /// Who subscribed (identity hash).
    pub subscriber_identity: String,
    /// The capability authorising delivery (token hash).
    pub deliver_token: String,
    /// Bundle the changed entity with each notification.
    #[serde(default)]
    pub include_payload: bool,
    /// Creation time, Unix ms.
    pub created_at: u64,
    /// Effective limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// For a remote inbox: the content hashes of the deliver token's chain
    /// (tokens, their signatures, their granters' identities), which travel
    /// with every delivery so the peer can verify it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deliver_chain: Vec<String>,
    /// Where the subscriber serves what it receives onwards: offered to
    /// later subscribers as an alternative when the prefix is at capacity
    /// (docs/ref-subscriptions.md, "Capacity and redirects").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_endpoint: Option<String>,
    /// Whom it counts against in `TIDINGS_MAX_SUBSCRIPTIONS_PER_IDENTITY`
    /// when that is not the subscriber: the identity this server granted
    /// the caller capability to (the root of its chain), so delegating the
    /// capability to fresh keys buys no more room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accountable: Option<String>,
}

impl PathSubscription {
    /// Its path in the tree.
    pub fn path(&self) -> String {
        format!("{DIR}/{}", self.subscription_id)
    }

    /// The identity it counts against: the capability's first grantee, or
    /// the subscriber.
    pub fn counted_against(&self) -> &str {
        self.accountable.as_deref().unwrap_or(&self.subscriber_identity)
    }

    /// As an entity.
    pub fn entity(&self) -> Entity {
        Entity { kind: DIR.to_owned(), data: serde_json::to_value(self).expect("a subscription serialises") }
    }

    /// Reads a stored entity; `None` if it is not a well-formed subscription
    /// (a direct tree write may put anything there: such entries are ignored).
    pub fn from_json(canonical: &str) -> Option<Self> {
        let entity: Entity = serde_json::from_str(canonical).ok()?;
        if entity.kind != DIR {
            return None;
        }
        let sub: Self = serde_json::from_value(entity.data).ok()?;
        Glob::new_path(&sub.pattern).ok()?;
        Some(sub)
    }
}

/// What a handler did.
#[derive(Debug, Clone, PartialEq)]
pub enum Executed {
    /// The operation's result (`{status: 200, result}`).
    Done(Value),
    /// A capacity redirect, a `system/subscription/redirect` (`{status: 303, result}`).
    Redirect(Value),
}

/// Why an EXECUTE was refused: one variant per error code
/// (docs/ref-subscriptions.md, "Error codes"), with its message. The
/// `{status, error: {code, message}}` body is written by the transport
/// from [`Refusal::code`] and [`Refusal::kind`].
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    /// `missing_deliver_token`.
    #[error("{0}")]
    MissingDeliverToken(String),
    /// `deliver_token_insufficient`.
    #[error("{0}")]
    DeliverTokenInsufficient(String),
    /// `chain_unreachable`.
    #[error("{0}")]
    ChainUnreachable(String),
    /// `embedded_cap_unauthorized`.
    #[error("{0}")]
    EmbeddedCapUnauthorized(String),
    /// `subscription_changed`.
    #[error("{0}")]
    SubscriptionChanged(String),
    /// `too_many_subscriptions`.
    #[error("{0}")]
    TooManySubscriptions(String),
    /// `too_many_subscriptions_for_identity`.
    #[error("{0}")]
    TooManySubscriptionsForIdentity(String),
    /// `subscription_not_found`.
    #[error("{0}")]
    SubscriptionNotFound(String),
    /// `not_subscription_owner`.
    #[error("{0}")]
    NotSubscriptionOwner(String),
    /// `capability_insufficient`.
    #[error("{0}")]
    CapabilityInsufficient(String),
    /// `payload_unauthorized`.
    #[error("{0}")]
    PayloadUnauthorized(String),
    /// `invalid_execute`.
    #[error("{0}")]
    InvalidExecute(String),
    /// `invalid_included`.
    #[error("{0}")]
    InvalidIncluded(String),
    /// `signature_invalid`.
    #[error("{0}")]
    SignatureInvalid(String),
    /// `handler_not_found`.
    #[error("{0}")]
    HandlerNotFound(String),
    /// `unknown_operation`.
    #[error("{0}")]
    UnknownOperation(String),
    /// `invalid_resource`.
    #[error("{0}")]
    InvalidResource(String),
    /// `capability_required`.
    #[error("{0}")]
    CapabilityRequired(String),
    /// `capability_invalid`.
    #[error("{0}")]
    CapabilityInvalid(String),
    /// `invalid_params`.
    #[error("{0}")]
    InvalidParams(String),
    /// `delivery_unsupported`.
    #[error("{0}")]
    DeliveryUnsupported(String),
    /// `unknown_peer`: a remote inbox on a server this one does not know.
    #[error("{0}")]
    UnknownPeer(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Refusal for ExecuteError {
    fn code(&self) -> &'static str {
        match self {
            Self::MissingDeliverToken(_) => "missing_deliver_token",
            Self::DeliverTokenInsufficient(_) => "deliver_token_insufficient",
            Self::ChainUnreachable(_) => "chain_unreachable",
            Self::EmbeddedCapUnauthorized(_) => "embedded_cap_unauthorized",
            Self::SubscriptionChanged(_) => "subscription_changed",
            Self::TooManySubscriptions(_) => "too_many_subscriptions",
            Self::TooManySubscriptionsForIdentity(_) => "too_many_subscriptions_for_identity",
            Self::SubscriptionNotFound(_) => "subscription_not_found",
            Self::NotSubscriptionOwner(_) => "not_subscription_owner",
            Self::CapabilityInsufficient(_) => "capability_insufficient",
            Self::PayloadUnauthorized(_) => "payload_unauthorized",
            Self::InvalidExecute(_) => "invalid_execute",
            Self::InvalidIncluded(_) => "invalid_included",
            Self::SignatureInvalid(_) => "signature_invalid",
            Self::HandlerNotFound(_) => "handler_not_found",
            Self::UnknownOperation(_) => "unknown_operation",
            Self::InvalidResource(_) => "invalid_resource",
            Self::CapabilityRequired(_) => "capability_required",
            Self::CapabilityInvalid(_) => "capability_invalid",
            Self::InvalidParams(_) => "invalid_params",
            Self::DeliveryUnsupported(_) => "delivery_unsupported",
            Self::UnknownPeer(_) => "unknown_peer",
            Self::Store(_) => "store_unavailable",
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::MissingDeliverToken(_)
            | Self::InvalidExecute(_)
            | Self::InvalidIncluded(_)
            | Self::UnknownOperation(_)
            | Self::InvalidResource(_)
            | Self::InvalidParams(_)
            | Self::DeliveryUnsupported(_)
            | Self::UnknownPeer(_) => Kind::Invalid,
            Self::DeliverTokenInsufficient(_)
            | Self::EmbeddedCapUnauthorized(_)
            | Self::NotSubscriptionOwner(_)
            | Self::CapabilityInsufficient(_)
            | Self::PayloadUnauthorized(_)
            | Self::CapabilityRequired(_)
            | Self::CapabilityInvalid(_) => Kind::Forbidden,
            Self::ChainUnreachable(_) | Self::SubscriptionNotFound(_) | Self::HandlerNotFound(_) => Kind::NotFound,
            Self::SubscriptionChanged(_) => Kind::Conflict,
            Self::TooManySubscriptions(_) => Kind::Unavailable,
            Self::TooManySubscriptionsForIdentity(_) => Kind::TooMany,
            Self::SignatureInvalid(_) => Kind::Unauthenticated,
            Self::Store(_) => Kind::Unavailable,
        }
    }

    fn wrapped(&self) -> Option<&dyn Refusal> {
        match self {
            Self::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// A checked subscribe request (`system/subscription/request`).
#[derive(Debug, Clone)]
pub struct SubscribeRequest {
    /// `resource.targets[0]`.
    pub pattern: Glob,
    /// Change kinds (defaulted, deduplicated).
    pub events: Vec<String>,
    /// The inbox as given: a path on this server or `entity://<peer>/<path>`.
    pub deliver_uri: String,
    /// The inbox path in its server's namespace (what the token grants).
    pub deliver_path: String,
    /// The peer holding the inbox, when it is not this server.
    pub deliver_peer: Option<String>,
    /// The inbox operation.
    pub deliver_operation: String,
    /// The deliver token's hash, if given.
    pub deliver_token: Option<String>,
    /// Bundle changed entities.
    pub include_payload: bool,
    /// Requested limits.
    pub limits: Option<Limits>,
    /// Where the subscriber relays what it receives (its base URL).
    pub relay_endpoint: Option<String>,
}

/// Who calls a handler, as dispatch established it.
#[derive(Debug, Clone)]
pub struct Caller<'a> {
    /// The EXECUTE's author (identity hash), whose signature was verified.
    pub author: &'a str,
    /// The verified caller capability chain (leaf first); `None` when none was
    /// given and authentication is off.
    pub capability: Option<&'a [Token]>,
    /// An admin (JWT `admin` claim) may unsubscribe anyone.
    pub admin: bool,
    /// Entities carried with the request.
    pub included: &'a Included,
    /// The causal chain of the request.
    pub chain_id: &'a str,
    /// Now, Unix ms.
    pub now_ms: u64,
}

/// The subscription handler.
#[derive(Debug)]
pub struct Subscriptions {
    store: Arc<dyn Store>,
    server: Arc<ServerIdentity>,
    max_per_prefix: u64,
    max_total: usize,
    /// Most subscriptions one subscriber identity keeps.
    max_per_identity: usize,
    /// Serialises subscribes and unsubscribes in this process: capacity and
    /// renewal are read-then-write.
    gate: tokio::sync::Mutex<()>,
    /// What the courier last saw of each peer it delivers to.
    peer_states: courier::PeerStates,
    /// Each mirror's status.
    mirror_states: mirror::MirrorStates,
    /// For proving a peer's endpoint (`GET /v1/identity` there), under
    /// `TIDINGS_PEER_ALLOW`.
    http: tidings_outbound::Outbound,
    /// The subscriptions as last listed, with the version of their
    /// directory then: a subscribe reads the version (a count from the
    /// path index), not every entity, while nothing changed.
    listed: std::sync::Mutex<Option<Listed>>,
}

/// A stored subscription: its tree entry and what it says.
#[derive(Debug)]
pub struct Stored {
    /// Its entry in the tree (path, version, entity).
    pub entry: TreeEntry,
    /// The subscription the entity says.
    pub subscription: PathSubscription,
}

/// A stored subscription, shared by the listings that hold it.
pub type Held = Arc<Stored>;

/// A listing of the subscriptions and the directory version it is current at.
#[derive(Debug, Clone)]
struct Listed {
    version: (i64, i64),
    entries: Arc<Vec<Held>>,
}

impl Subscriptions {
    /// A handler over `store`, acting as `server`, keeping at most
    /// `max_total` subscriptions (capped at [`MAX_SUBSCRIPTIONS`]) and
    /// `max_per_identity` per subscriber, and redirecting beyond
    /// `max_per_prefix` per pattern (`0`: no limit).
    pub fn new(
        store: Arc<dyn Store>,
        server: Arc<ServerIdentity>,
        settings: &crate::config::FederationSettings,
        http: tidings_outbound::Outbound,
    ) -> Self {
        Self {
            store,
            server,
            max_per_prefix: settings.max_subscribers_per_prefix,
            max_total: settings.max_subscriptions.min(MAX_SUBSCRIPTIONS),
            max_per_identity: settings.max_subscriptions_per_identity,
            gate: tokio::sync::Mutex::new(()),
            peer_states: courier::PeerStates::default(),
            mirror_states: mirror::MirrorStates::default(),
            http,
            listed: std::sync::Mutex::new(None),
        }
    }

    /// Each mirror this process runs, with its status (only the process
    /// leading the engine runs mirrors).
    pub fn mirrors(&self) -> Value {
        let states = self.mirror_states.lock().map(|s| s.clone()).unwrap_or_default();
        Value::Array(
            states
                .into_iter()
                .map(|(name, state)| {
                    let mut v = serde_json::to_value(state).unwrap_or_default();
                    v["name"] = json!(name);
                    v
                })
                .collect(),
        )
    }

    /// The known peers (`system/peer/*`) with what this process's courier
    /// last saw of each (only the process leading the engine delivers).
    pub async fn peers(&self) -> Result<Vec<Value>, StoreError> {
        let known = self.store.tree_entries_below(tidings_protocol::peer::PREFIX.trim_end_matches('/'), 10_000).await?;
        let states = self.peer_states.lock().map(|s| s.clone()).unwrap_or_default();
        Ok(known
            .into_iter()
            .filter_map(|e| {
                let hash = e.path.strip_prefix(tidings_protocol::peer::PREFIX)?.to_owned();
                let state = states.get(&hash).cloned().unwrap_or_default();
                let status = match (&state.last_error, state.lanes) {
                    (_, 0) => "idle",
                    (Some(_), _) => "failing",
                    (None, _) => "delivering",
                };
                Some(json!({
                    "peer": hash,
                    "endpoint": tidings_protocol::peer::endpoint_of(&e.entity),
                    "state": status,
                    "delivery": state,
                }))
            })
            .collect())
    }

    /// This server's identity.
    pub fn identity(&self) -> &ServerIdentity {
        &self.server
    }

    fn agent(&self) -> Agent {
        Agent::server(self.server.hash())
    }

    /// Every stored subscription with its entry.
    ///
    /// Read again only when the directory's version moved (any write
    /// below it, by any process, moves it); this process's own writes
    /// update the listing in place ([`Self::wrote`]).
    pub async fn list(&self) -> Result<Arc<Vec<Held>>, StoreError> {
        let version = self.store.tree_version_below(DIR).await?;
        if let Some(listed) = self.listed.lock().ok().and_then(|l| l.clone()).filter(|l| l.version == version) {
            return Ok(listed.entries);
        }
        // Read after the version: a write in between makes the next
        // version differ, so this listing is read again then.
        let entries = self.store.tree_entries_below(DIR, MAX_SUBSCRIPTIONS).await?;
        let entries: Arc<Vec<_>> = Arc::new(
            entries
                .into_iter()
                .filter(|e| subscription_id_of(&e.path).is_some())
                .filter_map(|entry| PathSubscription::from_json(&entry.entity).map(|subscription| Arc::new(Stored { entry, subscription })))
                .collect(),
        );
        if let Ok(mut listed) = self.listed.lock() {
            *listed = Some(Listed { version, entries: entries.clone() });
        }
        Ok(entries)
    }

    /// Follows this process's own write of `subscription` (stored as
    /// `entry`, replacing `replaced`) in the listing `from` was read as:
    /// the listing moves to the version that write makes. Should another
    /// process have written meanwhile, the directory's real version
    /// differs from the one predicted here, and the next [`Self::list`]
    /// reads it again.
    fn wrote(&self, from: &[Held], replaced: Option<&TreeEntry>, entry: TreeEntry, subscription: PathSubscription) {
        let Ok(mut listed) = self.listed.lock() else { return };
        let Some(current) = listed.as_ref().filter(|l| std::ptr::eq(l.entries.as_slice(), from)) else {
            *listed = None;
            return;
        };
        let (mut count, mut sum) = current.version;
        let mut entries: Vec<Held> = from.iter().filter(|h| Some(&h.entry.path) != replaced.map(|r| &r.path)).cloned().collect();
        if let Some(old) = replaced {
            (count, sum) = (count - 1, sum - old.changed_event);
        }
        (count, sum) = (count + 1, sum + entry.changed_event);
        let at = entries.partition_point(|h| h.entry.path < entry.path);
        entries.insert(at, Arc::new(Stored { entry, subscription }));
        *listed = Some(Listed { version: (count, sum), entries: Arc::new(entries) });
    }

    /// `unsubscribe` (docs/ref-subscriptions.md, "Unsubscribe").
    pub async fn unsubscribe(&self, caller: &Caller<'_>, subscription_id: &str) -> Result<Executed, ExecuteError> {
        let not_found = || ExecuteError::SubscriptionNotFound(format!("no subscription {subscription_id:?}"));
        if subscription_id.contains('/') || validate_path(subscription_id).is_err() {
            return Err(not_found());
        }
        let path = format!("{DIR}/{subscription_id}");
        let _gate = self.gate.lock().await;
        let Some(entry) = self.store.tree_get(&path).await? else { return Err(not_found()) };
        let Some(subscription) = PathSubscription::from_json(&entry.entity) else { return Err(not_found()) };
        if subscription.subscriber_identity != caller.author && !caller.admin {
            return Err(ExecuteError::NotSubscriptionOwner("only the subscriber (or an admin) may unsubscribe".into()));
        }
        if let Some(chain) = caller.capability
            && !Glob::new_path(&subscription.pattern).is_ok_and(|p| capability::chain_covers(chain, HANDLER, "unsubscribe", &p))
        {
            return Err(ExecuteError::CapabilityInsufficient("the caller capability does not grant unsubscribe on this pattern".into()));
        }
        let write = TreeWrite {
            path: path.clone(),
            entity: None,
            condition: Condition::IfMatch(entry.hash),
            event: change_event(&path, self.agent(), None, caller.chain_id.to_owned()),
        };
        if !matches!(self.store.tree_write(write).await?, crate::store::TreeOutcome::Done { .. }) {
            return Err(ExecuteError::SubscriptionChanged("the subscription changed meanwhile; retry".into()));
        }
        drop(_gate);
        self.refresh_config_logged().await;
        Ok(Executed::Done(Value::Null))
    }

    /// Writes `subscription`; the entry it is stored as, `None` when the
    /// condition failed.
    async fn write(&self, subscription: &PathSubscription, condition: Condition, chain_id: &str) -> Result<Option<TreeEntry>, StoreError> {
        let path = subscription.path();
        let (canonical, hash) = subscription.entity().canonical();
        let write = TreeWrite {
            path: path.clone(),
            entity: Some((canonical.clone(), hash.clone())),
            condition,
            event: change_event(&path, self.agent(), Some(hash.clone()), chain_id.to_owned()),
        };
        Ok(match self.store.tree_write(write).await? {
            crate::store::TreeOutcome::Done { event_id, .. } => Some(TreeEntry { path, entity: canonical, hash, changed_event: event_id }),
            _ => None,
        })
    }

    /// [`Subscriptions::refresh_config`], logging a failure: the change it
    /// describes is committed, and the advertisement may lag.
    pub async fn refresh_config_logged(&self) {
        if let Err(e) = self.refresh_config().await {
            tracing::warn!(error = %crate::report::chain(&e), "could not refresh system/config/subscription");
        }
    }

    /// Rewrites `system/config/subscription` (capacity and subscribers per
    /// prefix) when it changed. Informative: it may lag a moment behind.
    pub async fn refresh_config(&self) -> Result<(), StoreError> {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for held in self.list().await?.iter() {
            *counts.entry(held.subscription.pattern.clone()).or_default() += 1;
        }
        let entity = Entity {
            kind: "system/config".into(),
            data: json!({
                "concern": "subscription",
                "parameters": { "max_subscribers_per_prefix": self.max_per_prefix, "current_subscriber_prefixes": counts },
            }),
        };
        let (canonical, hash) = entity.canonical();
        if self.store.tree_get(CONFIG_PATH).await?.is_some_and(|e| e.hash == hash) {
            return Ok(());
        }
        let write = TreeWrite {
            path: CONFIG_PATH.to_owned(),
            entity: Some((canonical, hash.clone())),
            condition: Condition::Always,
            event: change_event(CONFIG_PATH, self.agent(), Some(hash), generate_id()),
        };
        self.store.tree_write(write).await?;
        Ok(())
    }
}

/// Whether `s` delivers to a mirror inbox on its subscriber's own server
/// (what a relaying mirror subscribes with).
fn relays_as_mirror(s: &PathSubscription) -> bool {
    tidings_protocol::peer::parse_remote(&s.deliver_uri)
        .is_some_and(|(peer, path)| peer == s.subscriber_identity && path.starts_with(mirror::INBOX_PREFIX))
}

/// Whether `s` is the subscription `request` by `author` renews: same
/// subscriber, pattern, inbox and operation.
fn renewal_of(s: &PathSubscription, author: &str, request: &SubscribeRequest) -> bool {
    s.subscriber_identity == author
        && s.pattern == request.pattern.as_str()
        && s.deliver_uri == request.deliver_uri
        && s.deliver_operation == request.deliver_operation
}

fn unknown_peer(peer: &str, why: impl std::fmt::Display) -> ExecuteError {
    ExecuteError::UnknownPeer(format!(
        "this server does not know peer {peer} ({why}): an admin writes {}{peer} {{endpoint}}, or the peer subscribes for its own inbox with a relay_endpoint that proves it",
        tidings_protocol::peer::PREFIX
    ))
}

/// The tree write recording a peer whose endpoint was proven (see
/// [`tidings_outbound::proves`]): only where no entry is, so an admin's stays.
fn learned_peer(peer: &str, endpoint: &str, agent: Agent, chain_id: String) -> TreeWrite {
    let (canonical, hash) =
        tidings_protocol::peer::Peer { hash: peer.to_owned(), endpoint: endpoint.trim_end_matches('/').to_owned() }.entity().canonical();
    let path = format!("{}{peer}", tidings_protocol::peer::PREFIX);
    TreeWrite {
        event: change_event(&path, agent, Some(hash.clone()), chain_id),
        path,
        entity: Some((canonical, hash)),
        condition: Condition::IfAbsent,
    }
}

/// Bundling changed entities needs `get` on `system/tree` for the pattern
/// (when a caller capability is in play; docs/ref-subscriptions.md,
/// "Subscribe", check 6).
fn payload_check(caller: &Caller<'_>, include_payload: bool, pattern: &Glob) -> Option<ExecuteError> {
    let chain = caller.capability?;
    (include_payload && !capability::chain_covers(chain, "system/tree", "get", pattern))
        .then(|| ExecuteError::PayloadUnauthorized("include_payload requires tree:get on the subscribed resource".into()))
}

/// The entities that make a token chain verifiable again later: each token,
/// its granter's signatures over it, and the granter's identity.
fn chain_content(chain: &[Token], included: &Included) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut add = |hash: &str, entity: &Value| {
        if let Ok(e) = serde_json::from_value::<Entity>(entity.clone()) {
            out.push((hash.to_owned(), e.canonical().0));
        }
    };
    for token in chain {
        for (hash, entity) in included {
            let signs_it = entity["type"] == "system/signature" && entity["data"]["target"] == token.hash.as_str();
            if *hash == token.hash || *hash == token.granter || signs_it {
                add(hash, entity);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

fn result(s: &PathSubscription, renewed: bool) -> Value {
    json!({
        "subscription_id": s.subscription_id,
        "pattern": s.pattern,
        "events": s.events,
        "limits": s.limits.clone().unwrap_or_default(),
        "renewed": renewed,
    })
}
