//! The event vocabulary: names, visibility and the versioned envelope. Pure: no I/O, no clock except the publish
//! default for `occurred_at`.
//!
//! An event is stored as its envelope *body*: the envelope JSON without the
//! two fields the server owns (`envelope_version`, `event_id`). The store keeps
//! the id in a column, and [`encode_envelope`] splices both fields back in
//! front of the body when an event is sent, so a frame is one copy of bytes
//! the database already holds, never a re-serialisation.

use bytes::{BufMut, Bytes, BytesMut};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// An event id: gap-free, assigned by the store in commit order.
pub type EventId = i64;

/// The envelope versions this server can write, oldest first.
pub const SUPPORTED_ENVELOPE_VERSIONS: &[u32] = &[1];

/// The envelope version written by default.
pub const CURRENT_ENVELOPE_VERSION: u32 = 1;

/// Names of the event types tidings emits itself. Every emit site uses one of
/// these constants (a test rejects string literals at emit sites), and every
/// constant is in the shipped registry (a test checks that too).
pub mod names {
    /// A client was ended because it fell behind (queue overflow or no progress).
    pub const SYSTEM_CLIENT_DROPPED_SLOW: &str = "system.client_dropped_slow";
    /// A resume point could not be served gap-free from the retained history.
    pub const SYSTEM_REPLAY_GAP: &str = "system.replay_gap";
    /// The token that opened a stream expired; the stream ends.
    pub const SYSTEM_TOKEN_EXPIRED: &str = "system.token_expired";
    /// The stream's payload rule went over its evaluation budget (once).
    pub const SYSTEM_FILTER_BUDGET_EXCEEDED: &str = "system.filter_budget_exceeded";
    /// An entity was created in the tree.
    pub const TREE_CREATED: &str = "tree.created";
    /// An entity in the tree was replaced.
    pub const TREE_UPDATED: &str = "tree.updated";
    /// An entity was deleted from the tree.
    pub const TREE_DELETED: &str = "tree.deleted";
    /// A path subscription's notification, addressed (`ref`) to its inbox.
    pub const SUBSCRIPTION_NOTIFICATION: &str = "subscription.notification";
    /// The server delivering to an inbox lost history it had notified
    /// there (a new epoch of its log forked below it), addressed (`ref`)
    /// to the inbox.
    pub const SUBSCRIPTION_HISTORY_LOST: &str = "subscription.history_lost";

    /// Types only tidings itself writes: a publish of one is refused, so a
    /// tree change or a notification in the log is always real (the
    /// subscription engine trusts them).
    pub const RESERVED: &[&str] = &[
        TREE_CREATED,
        TREE_UPDATED,
        TREE_DELETED,
        SUBSCRIPTION_NOTIFICATION,
        SUBSCRIPTION_HISTORY_LOST,
        SYSTEM_CLIENT_DROPPED_SLOW,
        SYSTEM_REPLAY_GAP,
        SYSTEM_TOKEN_EXPIRED,
        SYSTEM_FILTER_BUDGET_EXCEEDED,
    ];
}

/// Longest accepted event name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Whether `name` follows the event-name grammar (docs/events.md): two or more lowercase
/// snake_case segments (`[a-z][a-z0-9_]*`) joined by `.`.
pub fn is_valid_event_name(name: &str) -> bool {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return false;
    }
    let mut segments = 0;
    for segment in name.split('.') {
        segments += 1;
        if !is_valid_segment(segment) {
            return false;
        }
    }
    segments >= 2
}

/// One segment of an event name: `[a-z][a-z0-9_]*`.
pub fn is_valid_segment(segment: &str) -> bool {
    let mut bytes = segment.bytes();
    match bytes.next() {
        Some(b'a'..=b'z') => bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_')),
        _ => false,
    }
}

/// Who may see an event (the visibility levels of docs/events.md, ordered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Visibility {
    /// Everyone allowed to subscribe.
    #[default]
    Public,
    /// Reviewers and admins.
    ReviewerOnly,
    /// Admins only.
    Admin,
}

/// The agent that caused an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Agent {
    /// Stable agent identifier (`persona:mendel`, `human:u-jane`).
    pub id: String,
    /// Free-form kind (`ai_persona`, `human`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl Agent {
    /// A tidings server acting on its own (its identity hash), as on the
    /// changes its subscription engine, courier and mirrors write.
    pub fn server(identity: &str) -> Self {
        Agent { id: identity.to_owned(), kind: Some("server".into()) }
    }
}

/// A typed relation from the event to another reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Relation name (`target`, `cites`, ...).
    pub rel: String,
    /// The referenced thing (`paper:p-123`).
    #[serde(rename = "ref")]
    pub reference: String,
}

/// What a publisher sends for one event. Unknown fields are refused so that a
/// typo (`refs`, `visiblity`) is an error instead of silently lost data.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishRequest {
    /// The event type (required).
    pub event_type: String,
    /// The primary reference the event is about.
    #[serde(default, rename = "ref")]
    pub reference: Option<String>,
    /// The agent that caused it.
    #[serde(default)]
    pub agent: Option<Agent>,
    /// Publisher session.
    #[serde(default)]
    pub session_id: Option<String>,
    /// When it happened (RFC 3339); server time when absent.
    #[serde(default)]
    pub occurred_at: Option<DateTime<Utc>>,
    /// Event data: a JSON object, `{}` when absent.
    #[serde(default)]
    pub payload: Option<Value>,
    /// Related references.
    #[serde(default)]
    pub links: Vec<Link>,
    /// Who may see it.
    #[serde(default)]
    pub visibility: Visibility,
}

/// A stored event: the envelope body without `envelope_version`/`event_id`.
/// Field order is the wire order of the envelope after those two fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EventBody {
    /// The event type.
    pub event_type: String,
    /// The primary reference, or `null`.
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    /// The agent, or `null`.
    pub agent: Option<Agent>,
    /// The publisher session, or `null`.
    pub session_id: Option<String>,
    /// RFC 3339 UTC timestamp.
    pub occurred_at: String,
    /// Event data object.
    pub payload: Value,
    /// Related references.
    pub links: Vec<Link>,
    /// Who may see it.
    pub visibility: Visibility,
    /// The W3C `traceparent` it was published in, if any
    /// ([`crate::trace`]): a subscriber continues the trace from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The `tracestate` that came with it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl EventBody {
    /// Carries `trace` (the publish's context, if any).
    pub fn traced(mut self, trace: Option<&crate::trace::TraceContext>) -> Self {
        self.traceparent = trace.map(|t| t.traceparent.clone());
        self.tracestate = trace.and_then(|t| t.tracestate.clone());
        self
    }
}

/// Why a publish request is not an event.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventError {
    /// The name breaks the grammar.
    #[error("event_type {0:?} is not a valid event name: two or more lowercase snake_case segments joined by '.', at most 255 bytes")]
    InvalidName(String),
    /// A field has the wrong shape.
    #[error("{0}")]
    InvalidField(String),
    /// The serialised payload is over the configured limit.
    #[error("payload is {size} bytes, over the limit of {limit}")]
    PayloadTooLarge {
        /// Serialised size.
        size: usize,
        /// Configured limit.
        limit: usize,
    },
}

/// Longest accepted `ref`, `session_id`, agent id/kind or link field, in bytes.
pub const MAX_FIELD_LEN: usize = 1024;
/// Most links one event may carry.
pub const MAX_LINKS: usize = 256;

impl PublishRequest {
    /// Validates the request and turns it into a body, stamping `occurred_at`
    /// with `now` when the publisher gave none.
    pub fn into_body(self, max_payload: usize, now: DateTime<Utc>) -> Result<EventBody, EventError> {
        if !is_valid_event_name(&self.event_type) {
            return Err(EventError::InvalidName(self.event_type));
        }
        check_len("ref", self.reference.as_deref())?;
        check_len("session_id", self.session_id.as_deref())?;
        if let Some(agent) = &self.agent {
            if agent.id.is_empty() {
                return Err(EventError::InvalidField("agent.id must not be empty".into()));
            }
            check_len("agent.id", Some(&agent.id))?;
            check_len("agent.kind", agent.kind.as_deref())?;
        }
        if self.links.len() > MAX_LINKS {
            return Err(EventError::InvalidField(format!("links has {} entries, at most {MAX_LINKS} are allowed", self.links.len())));
        }
        for link in &self.links {
            check_len("links[].rel", Some(&link.rel))?;
            check_len("links[].ref", Some(&link.reference))?;
        }
        let payload = match self.payload {
            None => Value::Object(Map::new()),
            Some(Value::Object(map)) => Value::Object(map),
            Some(_) => return Err(EventError::InvalidField("payload must be a JSON object".into())),
        };
        let size = serde_json::to_vec(&payload).map(|v| v.len()).unwrap_or(usize::MAX);
        if size > max_payload {
            return Err(EventError::PayloadTooLarge { size, limit: max_payload });
        }
        Ok(EventBody {
            event_type: self.event_type,
            reference: self.reference,
            agent: self.agent,
            session_id: self.session_id,
            occurred_at: self.occurred_at.unwrap_or(now).to_rfc3339_opts(SecondsFormat::AutoSi, true),
            payload,
            links: self.links,
            visibility: self.visibility,
            traceparent: None,
            tracestate: None,
        })
    }
}

fn check_len(field: &str, value: Option<&str>) -> Result<(), EventError> {
    match value {
        Some(v) if v.len() > MAX_FIELD_LEN => Err(EventError::InvalidField(format!("{field} is longer than {MAX_FIELD_LEN} bytes"))),
        _ => Ok(()),
    }
}

impl EventBody {
    /// The JSON text stored for this body.
    pub fn to_json(&self) -> String {
        // Serialising a struct of strings, numbers and `Value`s cannot fail.
        serde_json::to_string(self).expect("event bodies always serialise")
    }

    /// Every reference a `targets` filter may match: `ref` and each link's `ref`.
    pub fn references(&self) -> impl Iterator<Item = &str> {
        self.reference.as_deref().into_iter().chain(self.links.iter().map(|l| l.reference.as_str()))
    }
}

/// An event as the broker and the transports see it: id, parsed body (for
/// filters) and the serialised envelope (for frames), built once.
#[derive(Debug)]
pub struct Event {
    /// The id.
    pub id: EventId,
    /// Parsed body.
    pub body: EventBody,
    /// The complete envelope JSON (version 1).
    pub envelope: Bytes,
    /// When it was committed, in Unix milliseconds.
    pub recorded_ms: i64,
}

impl Event {
    /// Builds an event from a stored row.
    pub fn from_stored(id: EventId, body_json: &str, recorded_ms: i64) -> Result<Self, serde_json::Error> {
        let body: EventBody = serde_json::from_str(body_json)?;
        Ok(Self { id, body, envelope: encode_envelope(id, body_json), recorded_ms })
    }
}

/// An event as every transport delivers it (envelope version 1): what
/// [`encode_envelope`] writes, described for the clients in other
/// languages ([`envelope_schema`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Envelope {
    /// The envelope's version ([`CURRENT_ENVELOPE_VERSION`]).
    pub envelope_version: u32,
    /// The event's id: increasing, the resume point of every transport.
    pub event_id: EventId,
    /// The rest, as stored.
    #[serde(flatten)]
    pub body: EventBody,
}

/// The JSON Schema of [`Envelope`]: what the JavaScript and Python
/// clients' envelope types are checked against (`tests/api/schemas.rs`).
pub fn envelope_schema() -> Value {
    schemars::schema_for!(Envelope).to_value()
}

/// The envelope JSON for a stored body: `envelope_version` and `event_id`
/// spliced in front of the body's fields.
pub fn encode_envelope(id: EventId, body_json: &str) -> Bytes {
    let rest = body_json.strip_prefix('{').unwrap_or(body_json);
    let mut out = BytesMut::with_capacity(body_json.len() + 48);
    out.put_slice(b"{\"envelope_version\":1,\"event_id\":");
    out.put_slice(id.to_string().as_bytes());
    if rest != "}" {
        out.put_u8(b',');
    }
    out.put_slice(rest.as_bytes());
    out.freeze()
}

/// An `accept_envelope` list that is not one: the item that is not a
/// version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("accept_envelope must be a comma list of positive integers, got {0:?}")]
pub struct BadEnvelopeList(pub String);

/// Picks the envelope version to answer with from a client's
/// `accept_envelope=1,2` list: the newest both sides know. `None` when the
/// client accepts none of ours; `Err` when the list is malformed.
pub fn negotiate_envelope(accept: Option<&str>) -> Result<Option<u32>, BadEnvelopeList> {
    let Some(list) = accept else { return Ok(Some(CURRENT_ENVELOPE_VERSION)) };
    let mut best = None;
    for item in list.split(',') {
        let item = item.trim();
        let version: u32 = item.parse().map_err(|_| BadEnvelopeList(item.to_owned()))?;
        if SUPPORTED_ENVELOPE_VERSIONS.contains(&version) && best.is_none_or(|b| version > b) {
            best = Some(version);
        }
    }
    Ok(best)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn names_follow_the_grammar() {
        for ok in ["hypothesis.created", "signal.upvote.recorded", "system.client_dropped_slow", "a.b", "link.cites2.added"] {
            assert!(is_valid_event_name(ok), "{ok}");
        }
        for bad in ["", "hypothesis", "Hypothesis.created", "a..b", ".a.b", "a.b.", "a.1b", "a.b-c", "a.b c", "a.*", "_a.b"] {
            assert!(!is_valid_event_name(bad), "{bad}");
        }
        assert!(!is_valid_event_name(&format!("a.{}", "b".repeat(300))));
    }

    /// A plain event body for unit tests.
    pub(crate) fn sample_body() -> EventBody {
        EventBody {
            event_type: "comment.posted".into(),
            reference: Some("paper:p-1".into()),
            agent: None,
            session_id: None,
            occurred_at: "2026-01-01T00:00:00Z".into(),
            payload: serde_json::json!({"x": 1}),
            links: vec![],
            visibility: Visibility::Public,
            traceparent: None,
            tracestate: None,
        }
    }

    #[test]
    fn envelope_splices_server_fields_in_front() {
        let body = sample_body();
        let event = Event::from_stored(42, &body.to_json(), 0).unwrap();
        let v: Value = serde_json::from_slice(&event.envelope).unwrap();
        assert_eq!(v["envelope_version"], 1);
        assert_eq!(v["event_id"], 42);
        assert_eq!(v["event_type"], "comment.posted");
        assert_eq!(v["ref"], "paper:p-1");
        assert_eq!(v["visibility"], "public");
        assert!(event.envelope.starts_with(b"{\"envelope_version\":1,\"event_id\":42,\"event_type\""));
        assert!(event.envelope.ends_with(b"}"));
    }

    #[test]
    fn negotiation_picks_newest_common_version() {
        assert_eq!(negotiate_envelope(None), Ok(Some(1)));
        assert_eq!(negotiate_envelope(Some("1,2")), Ok(Some(1)));
        assert_eq!(negotiate_envelope(Some("2")), Ok(None));
        assert!(negotiate_envelope(Some("x")).is_err());
    }

    #[test]
    fn publish_validation() {
        let now = Utc::now();
        let req: PublishRequest = serde_json::from_str(r#"{"event_type":"a.b","payload":[1]}"#).unwrap();
        assert!(matches!(req.into_body(100, now), Err(EventError::InvalidField(_))));
        let req: PublishRequest = serde_json::from_str(r#"{"event_type":"a.b","payload":{"k":"0123456789"}}"#).unwrap();
        assert!(matches!(req.into_body(10, now), Err(EventError::PayloadTooLarge { .. })));
        assert!(serde_json::from_str::<PublishRequest>(r#"{"event_type":"a.b","event_id":3}"#).is_err());
    }
}
