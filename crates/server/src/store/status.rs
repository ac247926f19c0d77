//! What the store reports about itself for `/health/deep` and metrics:
//! the wake-up listener, the hot standbys, and delivery that waits for the
//! synchronous standby.

use serde::Serialize;

/// State of the wake-up listener, for `/health/deep` and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerState {
    /// Connected and listening (or in-process for the embedded store).
    Listening,
    /// Reconnecting after a loss.
    Reconnecting,
    /// Not started yet.
    Starting,
}

/// The wake-up listener as the store reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    /// Whether it listens.
    pub state: ListenerState,
    /// How often it reconnected.
    pub reconnects: u64,
    /// Since it last heard a notification or connected, in ms (`None`
    /// without a LISTEN session: the embedded store, or before the first).
    pub silence_ms: Option<u64>,
}

/// The hot standbys serving history, as `/health/deep` shows them.
#[derive(Debug, Clone, Serialize)]
pub struct Replicas {
    /// Each standby.
    pub standbys: Vec<ReplicaStatus>,
    /// History reads the primary answered (no standby could).
    pub primary_history_reads: u64,
    /// Broker tail reads the primary answered.
    pub primary_broker_reads: u64,
}

/// One standby as `/health/deep` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicaStatus {
    /// `host:port/dbname`.
    pub replica: String,
    /// Whether reads go to it now.
    pub usable: bool,
    /// Whether it answered the last probe.
    pub up: bool,
    /// Ids it is behind the primary's head.
    pub lag_events: i64,
    /// Milliseconds since it replayed a commit, while behind.
    pub lag_ms: i64,
    /// History reads it answered.
    pub reads: u64,
    /// Why it is not usable, when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The connections this process reads through since the standby
    /// refused another (a connection limit), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections_capped_at: Option<usize>,
}

/// Delivery that waits for the synchronous standby
/// (`TIDINGS_DELIVERY=replicated`), as `/health/deep` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryStatus {
    /// `replicated`.
    pub mode: &'static str,
    /// `confirming` (the standby confirms barriers), `stalled` (it has
    /// not within `TIDINGS_DB_TIMEOUT`: publishes are refused),
    /// `none_named` (the primary names no synchronous standby) or
    /// `unknown` (not connected).
    pub synchronous_standby: &'static str,
    /// Ids up to this one are known to be on the synchronous standby.
    pub confirmed_through: i64,
}

/// A stored device cursor as an operator sees it (`GET /v1/events/{id}`):
/// a WebSocket device's, or a lane of tidings' own (`tidings:courier`, a
/// peer delivery; `tidings:mirror`, a mirror's inbox).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceCursor {
    /// The device's identity (its key's hash), or the lane's owner.
    pub owner: String,
    /// The device (or lane) id.
    pub device_id: String,
    /// Everything up to here is acknowledged.
    pub cursor: i64,
    /// Last moved, Unix ms.
    pub updated_ms: i64,
}
