//! The JSON the server sends besides the envelope, described once for the
//! clients in other languages: a stream's notices (`system.replay_gap`,
//! `system.client_dropped_slow`, `system.token_expired`,
//! `system.filter_budget_exceeded`), a poll's page, and the WebSocket
//! device protocol's messages both ways (docs/ref-websocket.md): what a
//! device sends (`stream.auth`, `sync.delta`, `stream.ack`,
//! `stream.reauth`) and what it is answered and told.
//!
//! Each type derives its JSON Schema ([`schemas`]); `tests/api/schemas.rs`
//! checks what the server writes against these types (every field known,
//! none missing) and the JavaScript and Python clients' types against the
//! schemas, so a field added, dropped or made optional here fails there
//! until the clients follow.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{Envelope, EventId};

/// Why a resume point could not be served whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GapReason {
    /// Retention deleted the history asked for.
    Pruned,
    /// Further back than one resume may replay.
    ReplayLimit,
    /// The resume point is past the head.
    BeyondHead,
    /// The store lost the history after `fork` (a failover, a restored
    /// backup): what the client saw after it is gone.
    HistoryLost,
}

/// A resume point the server could not serve whole (`system.replay_gap`,
/// a poll's `gap`, WebSocket's `stream.gap` and a `sync.delta` page's
/// `gap`): delivery goes on from `available_from`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayGap {
    /// What the client asked to resume after.
    pub requested: EventId,
    /// The oldest id it can still receive.
    pub available_from: EventId,
    /// The head when this was found.
    pub head: EventId,
    /// Why.
    pub reason: GapReason,
    /// With `history_lost`: the last id that survived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork: Option<EventId>,
}

/// Why the server dropped a slow stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// The client's queue filled up.
    QueueFull,
    /// The client made no progress for the slow-client timeout.
    NoProgress,
}

/// `system.client_dropped_slow`: the stream fell behind and is closed; the
/// client resumes after `last_event_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DroppedNotice {
    /// Why.
    pub reason: DropReason,
    /// The last id delivered to this stream (`null` when none was):
    /// always sent.
    #[schemars(schema_with = "always_sent_nullable_id")]
    pub last_event_id: Option<EventId>,
    /// How many events were queued.
    pub queue: u64,
}

/// `system.token_expired`: the stream's token expired and the stream ends;
/// the client resumes after `last_event_id` with a fresh token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenExpiredNotice {
    /// The last id delivered to this stream (`null` when none was):
    /// always sent.
    #[schemars(schema_with = "always_sent_nullable_id")]
    pub last_event_id: Option<EventId>,
}

/// `system.filter_budget_exceeded` (and WebSocket's
/// `stream.filter_budget_exceeded`): once per stream, the payload rule
/// went over its budget on an event, which did not match.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilterBudgetExceeded {
    /// The budget, in evaluation steps.
    pub budget: u64,
}

/// One page of `POST /v1/poll` (and of the MCP `poll` tool).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PollPage {
    /// The matching events, ascending.
    pub events: Vec<Envelope>,
    /// Where the next poll starts (and what to acknowledge once these are handled).
    pub next_since: EventId,
    /// Whether more matching events may follow right away.
    pub has_more: bool,
    /// The resume point could not be served whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<ReplayGap>,
}

/// `stream.hello`'s params: the server's first message on a device connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// The server's identity.
    pub server_did: String,
    /// The newest device seq now.
    pub head_seq: EventId,
    /// The protocol profiles the server speaks.
    pub profiles: Vec<String>,
    /// What the device's `stream.auth` proof signs.
    pub nonce: String,
}

/// `stream.auth`'s result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthAnswer {
    /// The newest seq now: catch up to it with `sync.delta`.
    pub head_seq: EventId,
    /// The device's stored cursor.
    pub cursor: EventId,
}

/// One event of a `sync.delta` page, and `stream.event`'s params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceEvent {
    /// The event's place in the device's sequence (its id).
    pub seq: EventId,
    /// The event.
    pub event: Envelope,
}

/// `sync.delta`'s result: one catch-up page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeltaPage {
    /// The page's events, ascending.
    pub items: Vec<DeviceEvent>,
    /// Where the next page starts.
    pub next_since: EventId,
    /// Whether more may follow right away.
    pub has_more: bool,
    /// The resume point could not be served whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gap: Option<ReplayGap>,
}

/// `stream.ack`'s result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AckAnswer {
    /// The cursor the server stored (never backwards, never past the head).
    pub cursor: EventId,
}

/// `stream.token_expired`'s params: live delivery stopped until a
/// `stream.reauth` with a fresh token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceTokenExpired {
    /// The last seq delivered.
    pub last_seq: EventId,
    /// Until when (Unix milliseconds) a `stream.reauth` resumes delivery.
    pub reauth_by_ms: i64,
}

/// The kind of a device's identity entity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum IdentityKind {
    /// The only one.
    #[serde(rename = "system/identity")]
    SystemIdentity,
}

/// The signature scheme of a device key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum KeyAlgorithm {
    /// The only one.
    #[serde(rename = "ed25519")]
    Ed25519,
}

/// The public half of a device key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IdentityData {
    /// The scheme.
    pub algorithm: KeyAlgorithm,
    /// The raw public key, base64.
    pub public_key: String,
}

/// A `system/identity` entity: who a device is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// Always `system/identity`.
    #[serde(rename = "type")]
    pub kind: IdentityKind,
    /// The key.
    pub data: IdentityData,
}

/// A device's signature over one call: the key's Ed25519 signature over
/// `sha256:<hex>` of the canonical `{method, body, nonce}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OriginProof {
    /// Whose key signed.
    pub identity: Identity,
    /// The signature, base64.
    pub signature: String,
}

/// What a device's `stream.auth` signs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthBody {
    /// The device's id: with its key, it names its cursor.
    pub device_id: String,
    /// Where a device the server does not know starts (exclusive), and the
    /// high-water mark a known one carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<EventId>,
    /// What the device receives (a filter, as `POST /v1/poll` takes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Value>,
}

/// `stream.auth`'s params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthParams {
    /// What is signed.
    pub body: AuthBody,
    /// The signature over it and the hello's nonce.
    pub origin_proof: OriginProof,
}

/// `sync.delta`'s params: the page after `since`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeltaParams {
    /// The authenticated device.
    pub device_id: String,
    /// Exclusive.
    pub since: EventId,
    /// At most this many events (the server caps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// What a device's `stream.ack` signs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// Everything up to here is handled.
    pub seq: EventId,
}

/// `stream.ack`'s params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AckParams {
    /// What is signed.
    pub body: AckBody,
    /// The signature over it and the hello's nonce.
    pub origin_proof: OriginProof,
}

/// `stream.reauth`'s params: a fresh token for the same subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReauthParams {
    /// The bearer token.
    pub token: String,
}

/// An event id or `null`, and required: a field the server always sends,
/// null when there is no id (schemars takes an `Option` as one it may leave out).
fn always_sent_nullable_id(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": ["integer", "null"], "format": "int64"})
}

/// Every shape above by name, with its JSON Schema, and the envelope's.
pub fn schemas() -> Vec<(&'static str, Value)> {
    fn schema<T: JsonSchema>() -> Value {
        schemars::schema_for!(T).to_value()
    }
    vec![
        ("Envelope", schema::<Envelope>()),
        ("ReplayGap", schema::<ReplayGap>()),
        ("DroppedNotice", schema::<DroppedNotice>()),
        ("TokenExpiredNotice", schema::<TokenExpiredNotice>()),
        ("FilterBudgetExceeded", schema::<FilterBudgetExceeded>()),
        ("PollPage", schema::<PollPage>()),
        ("Hello", schema::<Hello>()),
        ("AuthAnswer", schema::<AuthAnswer>()),
        ("DeviceEvent", schema::<DeviceEvent>()),
        ("DeltaPage", schema::<DeltaPage>()),
        ("AckAnswer", schema::<AckAnswer>()),
        ("DeviceTokenExpired", schema::<DeviceTokenExpired>()),
        ("Identity", schema::<Identity>()),
        ("OriginProof", schema::<OriginProof>()),
        ("AuthBody", schema::<AuthBody>()),
        ("AuthParams", schema::<AuthParams>()),
        ("DeltaParams", schema::<DeltaParams>()),
        ("AckBody", schema::<AckBody>()),
        ("AckParams", schema::<AckParams>()),
        ("ReauthParams", schema::<ReauthParams>()),
    ]
}
