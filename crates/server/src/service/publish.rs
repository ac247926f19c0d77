//! Publishing: one event or `{"events":[...]}`, validated in full before
//! anything is stored, appended in one all-or-nothing batch. Everything a
//! publish decides lives here: the batch shape and size, agent attribution
//! (a publisher is its agent), reserved types, publish grants, the registry
//! (strict or warn, and renames that fire aliases), the publish budget, the
//! append and the broker wake-up.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::Services;
use super::error::{Kind, Refusal};
use super::limits::LimitError;
use crate::auth::Identity;
use crate::metrics as m;
use crate::registry::{Problem, Registry, RegistryMode};
use crate::store::{IdempotencyKey, NewRecord, Publish, Published, StoreError};
use sha2::{Digest as _, Sha256};
use tidings_protocol::event::EventBody;
use tidings_protocol::event::{EventError, EventId, PublishRequest};

/// Why a publish stored nothing. Each variant is one stable error code.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// `malformed_json`: the body is not JSON.
    #[error("the body is not valid JSON: {0}")]
    MalformedJson(String),
    /// `invalid_event`: the body or an event has the wrong shape.
    #[error("{0}")]
    InvalidEvent(String),
    /// `batch_too_large`.
    #[error("a batch holds at most {max} events, got {got}")]
    BatchTooLarge {
        /// The limit.
        max: usize,
        /// The batch's length.
        got: usize,
    },
    /// `invalid_event_name`: the type breaks the naming grammar.
    #[error("{0}")]
    InvalidEventName(String),
    /// `payload_too_large`.
    #[error("{0}")]
    PayloadTooLarge(String),
    /// `agent_spoofing`: the event claims another agent.
    #[error("{0}")]
    AgentSpoofing(String),
    /// `reserved_event_type`: a type only tidings writes.
    #[error("{0}")]
    ReservedEventType(String),
    /// `forbidden_event_type`: no publish grant for the type.
    #[error("{0}")]
    ForbiddenEventType(String),
    /// `unregistered_event_type` (strict registry).
    #[error("{0}")]
    UnregisteredEventType(String),
    /// `payload_schema_violation` (strict registry).
    #[error("{0}")]
    PayloadSchemaViolation(String),
    /// `invalid_idempotency_key`: not 1–255 visible ASCII characters.
    #[error("an Idempotency-Key is 1 to 255 visible ASCII characters")]
    InvalidIdempotencyKey,
    /// `idempotency_key_reused`: the key was used with another body.
    #[error("this Idempotency-Key was used for a publish with another body; use a new key for a new publish")]
    IdempotencyKeyReused,
    /// `invalid_traceparent` / `invalid_tracestate`: the W3C trace context
    /// is malformed.
    #[error(transparent)]
    Trace(#[from] tidings_protocol::trace::TraceError),
    /// `rate_limited`: the identity's publish budget is spent.
    #[error(transparent)]
    Limited(#[from] LimitError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Refusal for PublishError {
    fn code(&self) -> &'static str {
        match self {
            Self::MalformedJson(_) => "malformed_json",
            Self::InvalidEvent(_) => "invalid_event",
            Self::BatchTooLarge { .. } => "batch_too_large",
            Self::InvalidEventName(_) => "invalid_event_name",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::AgentSpoofing(_) => "agent_spoofing",
            Self::ReservedEventType(_) => "reserved_event_type",
            Self::ForbiddenEventType(_) => "forbidden_event_type",
            Self::UnregisteredEventType(_) => "unregistered_event_type",
            Self::PayloadSchemaViolation(_) => "payload_schema_violation",
            Self::InvalidIdempotencyKey => "invalid_idempotency_key",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::Trace(tidings_protocol::trace::TraceError::Traceparent) => "invalid_traceparent",
            Self::Trace(tidings_protocol::trace::TraceError::Tracestate) => "invalid_tracestate",
            Self::Limited(e) => e.code(),
            Self::Store(e) => e.code(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::MalformedJson(_) | Self::InvalidEvent(_) | Self::InvalidIdempotencyKey | Self::Trace(_) => Kind::Invalid,
            Self::BatchTooLarge { .. } | Self::PayloadTooLarge(_) => Kind::TooLarge,
            Self::InvalidEventName(_) | Self::UnregisteredEventType(_) | Self::PayloadSchemaViolation(_) | Self::IdempotencyKeyReused => {
                Kind::Unprocessable
            }
            Self::AgentSpoofing(_) | Self::ReservedEventType(_) | Self::ForbiddenEventType(_) => Kind::Forbidden,
            Self::Limited(e) => e.kind(),
            Self::Store(e) => e.kind(),
        }
    }

    fn wrapped(&self) -> Option<&dyn Refusal> {
        match self {
            Self::Limited(e) => Some(e),
            Self::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// The records one valid event appends: itself, then the aliases a rename
/// fires. In strict mode an unregistered type or a payload that breaks its
/// schema is refused; in warn mode it is logged and counted, and accepted.
pub(crate) fn registered_records(
    registry: &Registry,
    body: &EventBody,
    at: &dyn Fn(String) -> String,
) -> Result<Vec<NewRecord>, PublishError> {
    let check = registry.check(&body.event_type, &body.payload);
    if let Some(problem) = &check.problem {
        let (refusal, kind): (fn(String) -> PublishError, _) = match problem {
            Problem::Unregistered => (PublishError::UnregisteredEventType, "unregistered_type"),
            Problem::SchemaViolation(_) => (PublishError::PayloadSchemaViolation, "schema_violation"),
        };
        let message = match problem {
            Problem::Unregistered => format!("event type {:?} is not in the registry", body.event_type),
            Problem::SchemaViolation(detail) => format!("payload does not match the schema of {:?}: {detail}", body.event_type),
        };
        let refused = refusal(at(message));
        if registry.mode() == RegistryMode::Strict {
            return Err(refused);
        }
        // Once per type (every event is counted): a publisher of an
        // unregistered type would otherwise write a line per event.
        match registry.first_warning(&body.event_type) {
            crate::registry::Warning::First => tracing::warn!(
                event_type = %body.event_type,
                problem = refused.code(),
                "accepting events the registry does not vouch for (warn mode); logged once per type, counted in tidings_registry_violations_total"
            ),
            crate::registry::Warning::Full => tracing::warn!(
                "events of many types the registry does not vouch for: further types are counted in tidings_registry_violations_total, not logged"
            ),
            crate::registry::Warning::Again => {}
        }
        m::registry_violation(kind);
    }
    Ok(check
        .fire
        .into_iter()
        .map(|name| {
            let mut copy = body.clone();
            copy.event_type = name;
            NewRecord::event(&copy)
        })
        .collect())
}

/// What a publish was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The id of each published event, in order (aliases a rename fires get
    /// ids too, but are not listed).
    pub event_ids: Vec<EventId>,
    /// The publish's Idempotency-Key was already recorded with this body:
    /// these are the ids of that publish, and nothing was stored now.
    pub replayed: bool,
    /// Where the publish's time went.
    pub timing: Timing,
}

/// Where a publish's time went, in the parts its answer's `Server-Timing`
/// names (docs/events.md, "Where a publish's time goes").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    /// Parsing and checking the events, up to joining a commit group.
    pub admit: Duration,
    /// Waiting for the committer (the group before this one committing).
    pub queue: Duration,
    /// The store writing the group, durably (its fsync included).
    pub commit: Duration,
    /// From the group stored to the publish going on with its answer.
    pub wake: Duration,
}

/// Whether `key` may be an `Idempotency-Key`: 1 to 255 visible ASCII
/// characters (no spaces, no controls).
pub fn valid_idempotency_key(key: &str) -> bool {
    (1..=255).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_graphic())
}

/// Publishes the JSON `body` (one event, or `{"events": [...]}`) as
/// `caller`, once per `idempotency_key` if one is given (see
/// [`crate::store::idempotency`]: the key is scoped by the caller's
/// identity and compared by the SHA-256 of `body`). Every event carries
/// `trace`, the publish's W3C trace context, if any.
///
/// When spans are exported (`crate::telemetry`), the publish is a span
/// under `trace` (a root without one), and a sampled one is the context
/// the events are stored with, so their later spans and their receivers
/// continue from it.
pub async fn publish(
    core: &Services,
    caller: &Identity,
    body: &[u8],
    idempotency_key: Option<&str>,
    trace: Option<&tidings_protocol::trace::TraceContext>,
) -> Result<Accepted, PublishError> {
    use opentelemetry::KeyValue;
    let entering = crate::telemetry::Entering::start("publish", trace, || {
        vec![KeyValue::new("messaging.operation.type", "send"), KeyValue::new("messaging.operation.name", "publish")]
    });
    let result = publish_as(core, caller, body, idempotency_key, entering.stored.as_ref().or(trace), entering.context.clone()).await;
    if entering.span.is_some() {
        entering.end(match &result {
            Ok(accepted) => {
                let mut attributes = vec![
                    KeyValue::new("messaging.batch.message_count", accepted.event_ids.len() as i64),
                    KeyValue::new("tidings.replayed", accepted.replayed),
                ];
                if let [id] = accepted.event_ids[..] {
                    attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
                }
                Ok(attributes)
            }
            Err(e) => Err(e.code()),
        });
    }
    result
}

/// [`publish`] with `trace` the context the events are stored with and
/// `span` the publish's span, if any.
async fn publish_as(
    core: &Services,
    caller: &Identity,
    body: &[u8],
    idempotency_key: Option<&str>,
    trace: Option<&tidings_protocol::trace::TraceContext>,
    span: Option<opentelemetry::trace::SpanContext>,
) -> Result<Accepted, PublishError> {
    let entered = Instant::now();
    if idempotency_key.is_some_and(|k| !valid_idempotency_key(k)) {
        return Err(PublishError::InvalidIdempotencyKey);
    }
    let value: Value = crate::json::strict_value(body).map_err(|e| PublishError::MalformedJson(e.to_string()))?;
    let (items, batch) = match value {
        Value::Object(mut map) if map.contains_key("events") && !map.contains_key("event_type") => {
            if map.len() != 1 {
                return Err(PublishError::InvalidEvent("a batch is {\"events\": [...]} with no other fields".into()));
            }
            match map.remove("events") {
                Some(Value::Array(items)) => (items, true),
                _ => return Err(PublishError::InvalidEvent("events must be a list of events".into())),
            }
        }
        single @ Value::Object(_) => (vec![single], false),
        _ => return Err(PublishError::InvalidEvent("the body must be an event object or {\"events\": [...]}".into())),
    };
    if items.is_empty() {
        return Err(PublishError::InvalidEvent("events must not be empty".into()));
    }
    let max_batch = core.settings().publish.max_batch;
    if items.len() > max_batch {
        return Err(PublishError::BatchTooLarge { max: max_batch, got: items.len() });
    }

    let events = items.len();
    let registry = core.registry();
    let now = chrono::Utc::now();
    let mut records = Vec::with_capacity(items.len());
    // Index in `records` of each published event (aliases follow it).
    let mut primary = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = |msg: String| if batch { format!("events[{i}]: {msg}") } else { msg };
        let mut request: PublishRequest = crate::json::from_object(item).map_err(|e| PublishError::InvalidEvent(at(e.to_string())))?;
        // A publisher is its agent: it cannot claim another agent's id
        // (agent filters mean nothing if agents can be forged), and events
        // without an agent are attributed to it.
        match &request.agent {
            Some(agent) if agent.id != caller.sub && !caller.admin => {
                return Err(PublishError::AgentSpoofing(at(format!(
                    "agent.id {:?} is not the caller's identity; only admins may publish for another agent",
                    agent.id
                ))));
            }
            None if caller.authenticated => request.agent = Some(tidings_protocol::event::Agent { id: caller.sub.clone(), kind: None }),
            _ => {}
        }
        let body = request
            .into_body(core.settings().publish.max_payload, now)
            .map_err(|e| match e {
                EventError::InvalidName(_) => PublishError::InvalidEventName(at(e.to_string())),
                EventError::InvalidField(_) => PublishError::InvalidEvent(at(e.to_string())),
                EventError::PayloadTooLarge { .. } => PublishError::PayloadTooLarge(at(e.to_string())),
            })?
            .traced(trace);
        if tidings_protocol::event::names::RESERVED.contains(&body.event_type.as_str()) {
            return Err(PublishError::ReservedEventType(at(format!(
                "{:?} is written by tidings itself (tree writes, subscriptions, stream notices)",
                body.event_type
            ))));
        }
        if !caller.may_publish(&body.event_type) {
            return Err(PublishError::ForbiddenEventType(at(format!("the caller may not publish {:?}", body.event_type))));
        }
        primary.push(records.len());
        records.extend(registered_records(registry, &body, &at)?);
    }

    // Only a valid publish spends the budget.
    core.limits().take_publish(caller, events)?;
    let labels: Vec<String> =
        records.iter().map(|r| if registry.contains(&r.event_type) { r.event_type.clone() } else { "unregistered".to_owned() }).collect();
    // Group-committed with the publishes in flight alongside (one
    // transaction and one fsync for all of them).
    let key = idempotency_key.map(|key| {
        let now_ms = chrono::Utc::now().timestamp_millis();
        IdempotencyKey {
            scope: format!("token:{}", caller.sub),
            key: key.to_owned(),
            body_hash: Sha256::digest(body).into(),
            answer: primary.clone(),
            now_ms,
            window_ms: i64::try_from(core.settings().history.idempotency_window.as_millis()).unwrap_or(i64::MAX),
        }
    });
    let submitted = Instant::now();
    let (outcome, stamps) = core.appender().publish(Publish { records, key }, span).await;
    let timing = match stamps {
        Some(at) => Timing {
            admit: submitted - entered,
            queue: at.taken.saturating_duration_since(submitted),
            commit: at.stored.saturating_duration_since(at.taken),
            wake: at.stored.elapsed(),
        },
        None => Timing { admit: submitted - entered, ..Timing::default() },
    };
    let ids = match outcome? {
        Published::Stored(ids) => ids,
        Published::Replayed(event_ids) => {
            m::idempotent_replays(1);
            return Ok(Accepted { event_ids, replayed: true, timing });
        }
        Published::KeyReused => return Err(PublishError::IdempotencyKeyReused),
    };
    for label in labels {
        m::events_published(&label, 1);
    }
    // Wake the local broker at once instead of waiting for the NOTIFY round trip.
    core.broker().wake();
    Ok(Accepted { event_ids: primary.into_iter().map(|i| ids[i]).collect(), replayed: false, timing })
}
