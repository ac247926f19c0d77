//! The service layer: every use-case of tidings once, with no transport in
//! it. SSE, long-poll and (next) WebSocket and peer delivery are thin
//! translations of what these services return; none of them decides policy
//! or reads the log on its own.
//!
//! - [`publish`]: grants, agent attribution, reserved types, the registry,
//!   renames, the append and the broker wake-up;
//! - [`session`]: one subscriber's delivery: register, read the head, replay
//!   up to the live seam, then live, with the gap notices, the replay cap,
//!   the lagged-to-catch-up loop and the slow-client drop;
//! - [`delivered`]: what a stream's writes count (deliveries, and a sample
//!   of their latency);
//! - [`poll`]: long-poll as a bounded session, and the durable consumers
//!   (open, ack, list, delete);
//! - [`tree`]: compare-and-swap writes, reads and listings of the entity tree;
//! - [`limits`]: stream and publish budgets;
//! - [`error`]: what a refusal is ([`error::Refusal`]), so each transport maps
//!   every typed error to its wire form in one place.
//!
//! Nothing here names a type of the HTTP stack; nothing below this layer
//! (broker, store, filter, tree vocabulary) imports it.

pub mod audit;
pub mod delivered;
pub mod device;
pub mod error;
pub mod execute;
pub mod freshness;
pub mod gap;
pub mod limits;
pub mod outbox;
pub mod poll;
pub mod publish;
pub mod session;
pub mod tree;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::broker::Broker;
use crate::config::Settings;
use crate::federation::Subscriptions;
use crate::filter::FilterLimits;
use crate::registry::Registry;
use crate::store::Store;
use tidings_protocol::identity::ServerIdentity;

/// The handles every service works with. Cloning is shallow.
#[derive(Debug, Clone)]
pub struct Services {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: Settings,
    store: Arc<dyn Store>,
    appender: crate::store::group::GroupCommit<crate::store::group::Publishes>,
    tree_writer: crate::store::group::GroupCommit<crate::store::group::TreeWrites>,
    broker: Broker,
    registry: Arc<Registry>,
    limits: Arc<limits::Limits>,
    identity: Arc<ServerIdentity>,
    subscriptions: Arc<Subscriptions>,
    entity_rules: Vec<EntityRule>,
    shutdown: CancellationToken,
    draining: CancellationToken,
}

/// A rule on the entities written under some paths of the tree: `Err` with
/// what is wrong refuses the write (`400 invalid_entity`). The composition
/// root hands the service layer the rules of the parts that read the tree
/// (peers, mirrors), so the tree's write path names none of them.
pub type EntityRule = fn(&str, &tidings_protocol::tree::Entity) -> Result<(), tidings_protocol::tree::EntityError>;

/// What the services are built from (the composition root fills it).
#[derive(Debug)]
pub struct ServiceParts {
    /// Settings.
    pub settings: Settings,
    /// The store.
    pub store: Arc<dyn Store>,
    /// The broker.
    pub broker: Broker,
    /// The event-type registry.
    pub registry: Arc<Registry>,
    /// This server's identity.
    pub identity: Arc<ServerIdentity>,
    /// The `system/subscription` handler.
    pub subscriptions: Arc<Subscriptions>,
    /// What an entity written into the tree must be, beyond being an
    /// entity, where a part of tidings reads it ([`EntityRule`]).
    pub entity_rules: Vec<EntityRule>,
    /// Cancelled on shutdown: sessions end on it.
    pub shutdown: CancellationToken,
    /// Cancelled when a drain begins (`/health/ready` answers `503`).
    pub draining: CancellationToken,
}

impl Services {
    /// Bundles the handles and starts the group committers of publishes
    /// and tree writes (so it is called inside the runtime).
    pub fn new(parts: ServiceParts) -> Self {
        let ServiceParts { settings, store, broker, registry, identity, subscriptions, entity_rules, shutdown, draining } = parts;
        let limits = Arc::new(limits::Limits::new(
            settings.streams.max_streams,
            settings.streams.max_streams_per_identity,
            settings.publish.publish_rate,
        ));
        let group = crate::store::group::GroupSettings {
            max_events: settings.publish.publish_group_events as usize,
            max_delay: settings.publish.publish_group_delay,
        };
        let appender = crate::store::group::GroupCommit::start(store.clone(), group);
        // Tree writes are grouped within the same bounds.
        let tree_writer = crate::store::group::GroupCommit::start(store.clone(), group);
        Self {
            inner: Arc::new(Inner {
                settings,
                store,
                appender,
                tree_writer,
                broker,
                registry,
                limits,
                identity,
                subscriptions,
                entity_rules,
                shutdown,
                draining,
            }),
        }
    }

    /// Checks an entity written at `path` against every rule of the
    /// parts of tidings that read the tree (a peer's entry, a mirror).
    pub fn check_entity(&self, path: &str, entity: &tidings_protocol::tree::Entity) -> Result<(), tidings_protocol::tree::EntityError> {
        self.inner.entity_rules.iter().try_for_each(|rule| rule(path, entity))
    }

    /// Settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Publishes' appends, group-committed.
    pub fn appender(&self) -> &crate::store::group::GroupCommit<crate::store::group::Publishes> {
        &self.inner.appender
    }

    /// Tree writes (`PUT` and `DELETE` of a path), group-committed.
    pub fn tree_writer(&self) -> &crate::store::group::GroupCommit<crate::store::group::TreeWrites> {
        &self.inner.tree_writer
    }

    /// The broker.
    pub fn broker(&self) -> &Broker {
        &self.inner.broker
    }

    /// The event-type registry.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// Stream and publish budgets.
    pub fn limits(&self) -> &Arc<limits::Limits> {
        &self.inner.limits
    }

    /// This server's identity (its key and `system/identity` entity).
    pub fn identity(&self) -> &Arc<ServerIdentity> {
        &self.inner.identity
    }

    /// The `system/subscription` handler.
    pub fn subscriptions(&self) -> &Arc<Subscriptions> {
        &self.inner.subscriptions
    }

    /// Cancelled when the server shuts down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Whether a drain has begun (the process is on its way out).
    pub fn draining(&self) -> bool {
        self.inner.draining.is_cancelled()
    }

    /// The filter limits from the settings.
    pub fn filter_limits(&self) -> FilterLimits {
        self.inner.settings.filters.limits()
    }

    /// The consumer TTL in milliseconds.
    pub fn consumer_ttl_ms(&self) -> i64 {
        self.inner.settings.poll.consumer_ttl.as_millis().min(i64::MAX as u128) as i64
    }
}
