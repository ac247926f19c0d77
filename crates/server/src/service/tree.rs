//! The entity tree as a service: compare-and-swap writes on the entity hash
//! that append a `tree.created` / `tree.updated` / `tree.deleted` event in
//! the same transaction (so tree changes travel the same log, broker,
//! replay and filters as every other event), reads and listings.
//!
//! Who may: writing a path needs the `publish` grant for the change event's
//! type (`tree.*`), reading needs the `subscribe` grant: the tree is as
//! visible as the events that describe it. `system/…` holds what tidings
//! itself keeps (subscriptions, their configuration, chain-error markers):
//! only admins read or write it directly; subscribers go through `execute`
//! (docs/tree.md; docs/ref-subscriptions.md, "The subscription entity").

use std::collections::BTreeMap;

use super::Services;
use super::error::{Kind, Refusal};
use crate::auth::Identity;
use crate::store::{ChangeKind, Condition, StoreError, TreeEntry, TreeOutcome, TreeWrite};
use tidings_protocol::event::{Agent, EventId, names};
use tidings_protocol::trace::TraceContext;
use tidings_protocol::tree::{ChangeEvent, Entity, PathError, change_event, change_type, validate_path};

/// Most entries one listing scans: a bound on one request's work, not a
/// tuning knob (a listing that hits it says `truncated`).
const LIST_SCAN: usize = 10_000;

/// Why a tree operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// `invalid_path`.
    #[error(transparent)]
    InvalidPath(#[from] PathError),
    /// `invalid_entity`.
    #[error("{0}")]
    InvalidEntity(String),
    /// `forbidden_tree_access`.
    #[error("{0}")]
    Forbidden(String),
    /// `entity_not_found`.
    #[error("nothing at {0:?}")]
    NotFound(String),
    /// `hash_mismatch`: the precondition names another entity.
    #[error("the entity at {path:?} is not the one the precondition names")]
    HashMismatch {
        /// The path.
        path: String,
        /// The current hash (`None`: nothing there).
        current: Option<String>,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Refusal for TreeError {
    fn code(&self) -> &'static str {
        match self {
            Self::InvalidPath(_) => "invalid_path",
            Self::InvalidEntity(_) => "invalid_entity",
            Self::Forbidden(_) => "forbidden_tree_access",
            Self::NotFound(_) => "entity_not_found",
            Self::HashMismatch { .. } => "hash_mismatch",
            Self::Store(e) => e.code(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::InvalidPath(_) | Self::InvalidEntity(_) => Kind::Invalid,
            Self::Forbidden(_) => Kind::Forbidden,
            Self::NotFound(_) => Kind::NotFound,
            Self::HashMismatch { .. } => Kind::Conflict,
            Self::Store(e) => e.kind(),
        }
    }

    fn details(&self) -> Option<serde_json::Value> {
        match self {
            Self::HashMismatch { current, .. } => Some(serde_json::json!({ "current_hash": current })),
            _ => None,
        }
    }

    fn wrapped(&self) -> Option<&dyn Refusal> {
        match self {
            Self::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// A committed write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// What happened.
    pub kind: ChangeKind,
    /// The path.
    pub uri: String,
    /// The new hash (`None` after a delete).
    pub hash: Option<String>,
    /// The hash before the write.
    pub previous_hash: Option<String>,
    /// The change event.
    pub event_id: EventId,
}

/// One child in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Child {
    /// Its last segment.
    pub name: String,
    /// Its path.
    pub path: String,
    /// Whether an entity is stored at it.
    pub entity: bool,
    /// Whether paths below it hold entities.
    pub has_children: bool,
}

/// The children of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The listed path (`""` for the root).
    pub path: String,
    /// Its children, by name.
    pub children: Vec<Child>,
    /// Whether the scan stopped at its bound.
    pub truncated: bool,
}

fn require(allowed: bool, what: &str) -> Result<(), TreeError> {
    if allowed { Ok(()) } else { Err(TreeError::Forbidden(format!("the caller may not {what} the tree"))) }
}

fn require_system(caller: &Identity, path: &str) -> Result<(), TreeError> {
    if tidings_protocol::tree::is_system(path) && !caller.admin {
        return Err(TreeError::Forbidden("only admins read or write system/ directly".into()));
    }
    Ok(())
}

fn agent(caller: &Identity) -> Agent {
    Agent { id: caller.sub.clone(), kind: None }
}

/// The entity at `path`.
pub async fn get(core: &Services, caller: &Identity, path: &str) -> Result<TreeEntry, TreeError> {
    require(caller.may_subscribe(names::TREE_UPDATED), "read")?;
    require_system(caller, path)?;
    validate_path(path)?;
    core.store().tree_get(path).await?.ok_or_else(|| TreeError::NotFound(path.to_owned()))
}

/// The children of `dir` (`""` for the root).
pub async fn list(core: &Services, caller: &Identity, dir: &str) -> Result<Listing, TreeError> {
    require(caller.may_subscribe(names::TREE_UPDATED), "read")?;
    require_system(caller, dir)?;
    if !dir.is_empty() {
        validate_path(dir)?;
    }
    let below = core.store().tree_below(dir, LIST_SCAN).await?;
    // name -> (is an entity, has children)
    let mut children: BTreeMap<String, (bool, bool)> = BTreeMap::new();
    let skip = if dir.is_empty() { 0 } else { dir.len() + 1 };
    for path in &below {
        let rest = &path[skip..];
        let (name, deeper) = match rest.split_once('/') {
            Some((name, _)) => (name, true),
            None => (rest, false),
        };
        let entry = children.entry(name.to_owned()).or_default();
        entry.0 |= !deeper;
        entry.1 |= deeper;
    }
    let children = children
        .into_iter()
        .map(|(name, (entity, has_children))| {
            let path = if dir.is_empty() { name.clone() } else { format!("{dir}/{name}") };
            Child { name, path, entity, has_children }
        })
        .collect();
    Ok(Listing { path: dir.to_owned(), children, truncated: below.len() == LIST_SCAN })
}

/// Writes the entity in `body` (`{type, data}`) at `path` if `condition`
/// holds, as `caller`, in causal chain `chain_id`; its change event
/// carries `trace`, the writer's W3C trace context, if any.
pub async fn put(
    core: &Services,
    caller: &Identity,
    path: &str,
    condition: Condition,
    body: &[u8],
    chain_id: String,
    trace: Option<TraceContext>,
) -> Result<Written, TreeError> {
    check_write(caller, path, false)?;
    let entity: Entity = crate::json::from_object_slice(body)
        .map_err(|e| TreeError::InvalidEntity(format!("the body must be {{\"type\", \"data\"}}: {e}")))?;
    entity.check().map_err(|e| TreeError::InvalidEntity(e.0))?;
    core.check_entity(path, &entity).map_err(|e| TreeError::InvalidEntity(e.0))?;
    let (canonical, hash) = entity.canonical();
    let entering = entering(path, trace.as_ref());
    let trace = entering.stored.clone().or(trace);
    let write = TreeWrite {
        path: path.to_owned(),
        entity: Some((canonical, hash.clone())),
        condition,
        event: traced(change_event(path, agent(caller), Some(hash.clone()), chain_id), trace),
    };
    let context = entering.context.clone();
    ended(entering, async { written(core, path, core.tree_writer().submit_traced(write, context).await?, Some(hash)) }.await)
}

/// The span of a tree write at `path` under `trace`, when spans are exported.
fn entering(path: &str, trace: Option<&TraceContext>) -> crate::telemetry::Entering {
    crate::telemetry::Entering::start("tree-write", trace, || vec![opentelemetry::KeyValue::new("tidings.path", path.to_owned())])
}

/// A tree write's outcome, recorded on its span.
fn ended(entering: crate::telemetry::Entering, outcome: Result<Written, TreeError>) -> Result<Written, TreeError> {
    if entering.span.is_some() {
        entering.end(match &outcome {
            Ok(w) => Ok(vec![opentelemetry::KeyValue::new("messaging.message.id", w.event_id.to_string())]),
            Err(e) => Err(e.code()),
        });
    }
    outcome
}

/// Checks what a write needs before its body is read: the path and the
/// caller's right to write there.
pub fn check_write(caller: &Identity, path: &str, delete: bool) -> Result<(), TreeError> {
    validate_path(path)?;
    let allowed = if delete {
        caller.may_publish(names::TREE_DELETED)
    } else {
        caller.may_publish(names::TREE_CREATED) && caller.may_publish(names::TREE_UPDATED)
    };
    require(allowed, "write")?;
    require_system(caller, path)
}

/// Deletes the entity at `path` if `condition` holds (its change event
/// carries `trace`, as [`put`]'s does).
pub async fn delete(
    core: &Services,
    caller: &Identity,
    path: &str,
    condition: Condition,
    chain_id: String,
    trace: Option<TraceContext>,
) -> Result<Written, TreeError> {
    check_write(caller, path, true)?;
    let entering = entering(path, trace.as_ref());
    let trace = entering.stored.clone().or(trace);
    let event = traced(change_event(path, agent(caller), None, chain_id), trace);
    let write = TreeWrite { path: path.to_owned(), entity: None, condition, event };
    let context = entering.context.clone();
    ended(entering, async { written(core, path, core.tree_writer().submit_traced(write, context).await?, None) }.await)
}

/// `event`, carrying `trace` when there is one.
fn traced(event: ChangeEvent, trace: Option<TraceContext>) -> ChangeEvent {
    match trace {
        None => event,
        Some(trace) => std::sync::Arc::new(move |kind, previous| event(kind, previous).traced(Some(&trace))),
    }
}

fn written(core: &Services, path: &str, outcome: TreeOutcome, hash: Option<String>) -> Result<Written, TreeError> {
    match outcome {
        TreeOutcome::Done { kind, previous_hash, event_id } => {
            core.broker().wake();
            crate::metrics::events_published(change_type(kind), 1);
            Ok(Written { kind, uri: path.to_owned(), hash, previous_hash, event_id })
        }
        TreeOutcome::Mismatch { current } => Err(TreeError::HashMismatch { path: path.to_owned(), current }),
        TreeOutcome::Missing => Err(TreeError::NotFound(path.to_owned())),
    }
}
