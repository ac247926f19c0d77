//! "Did consumer X get event N?" without reading logs (`GET
//! /v1/events/{id}`, docs/polling.md "Which consumers have an event"): one
//! event, as its caller may see it, and every server-side cursor measured
//! against it: each durable consumer (acknowledged past it, still to do
//! so, or not asking for it) and each stored device cursor (WebSocket
//! devices, and tidings' own lanes: peer deliveries and mirrors).
//!
//! Grants and visibility apply as on a stream: an event the caller could
//! not receive is not found. A caller that is not an admin sees the
//! consumers it created and no device cursors (those belong to device
//! keys, not to tokens).

use serde::Serialize;

use super::Services;
use super::error::{Kind, Refusal};
use crate::auth::Identity;
use crate::filter::Filter;
use crate::store::{Actor, DeviceCursor, StoreError};
use tidings_protocol::event::{EventBody, EventId};

/// Most device cursors listed (the answer says when there were more).
pub const MAX_DEVICES: usize = 1000;

/// One event and the cursors measured against it.
#[derive(Debug)]
pub struct Audit {
    /// The event's envelope (JSON).
    pub envelope: bytes::Bytes,
    /// Every durable consumer the caller may see.
    pub consumers: Vec<ConsumerState>,
    /// Every device cursor (admins only), at most [`MAX_DEVICES`].
    pub devices: Vec<DeviceState>,
    /// There were more device cursors than [`MAX_DEVICES`].
    pub devices_truncated: bool,
}

/// A durable consumer measured against the event.
#[derive(Debug, Serialize)]
pub struct ConsumerState {
    /// Its id.
    pub consumer_id: String,
    /// Who created it.
    pub owner: String,
    /// Everything up to here is acknowledged.
    pub cursor: EventId,
    /// `acknowledged` (its filter takes the event and its cursor passed
    /// it), `pending` (it takes the event, not acknowledged yet) or
    /// `not_matched` (its filter does not take the event).
    pub state: &'static str,
}

/// A device cursor measured against the event.
#[derive(Debug, Serialize)]
pub struct DeviceState {
    /// The stored cursor.
    #[serde(flatten)]
    pub cursor: DeviceCursor,
    /// Its cursor passed the event (a device's filter is its session's,
    /// not stored: whether it asked for the event is not known here).
    pub acknowledged: bool,
}

/// Why an audit was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// `invalid_event_id`: not 1 to 16 digits without a leading zero.
    #[error("an event id is a positive integer of at most 16 digits, without a sign or a leading zero")]
    InvalidEventId,
    /// `event_not_found`: no such event, pruned, or not the caller's to see.
    #[error("no event {0} that this caller may see")]
    NotFound(EventId),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Refusal for AuditError {
    fn code(&self) -> &'static str {
        match self {
            Self::InvalidEventId => "invalid_event_id",
            Self::NotFound(_) => "event_not_found",
            Self::Store(e) => e.code(),
        }
    }

    fn kind(&self) -> Kind {
        match self {
            Self::InvalidEventId => Kind::Invalid,
            Self::NotFound(_) => Kind::NotFound,
            Self::Store(e) => e.kind(),
        }
    }

    fn wrapped(&self) -> Option<&dyn Refusal> {
        match self {
            Self::Store(e) => Some(e),
            _ => None,
        }
    }
}

/// Event `id` (as the path gave it) and the cursors measured against it,
/// as `caller` may see them.
pub async fn audit(core: &Services, caller: &Identity, id: &str) -> Result<Audit, AuditError> {
    // 1 to 16 digits, no sign, no leading zero; past the largest id there
    // is no event.
    let digits = (1..=16).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_digit()) && !id.starts_with('0');
    let id: EventId = id.parse().ok().filter(|_| digits).ok_or(AuditError::InvalidEventId)?;
    if id > crate::store::epoch::MAX_ID {
        return Err(AuditError::NotFound(id));
    }
    let store = core.store();
    let record = store.read_history(id - 1, 1).await?.into_iter().next().filter(|r| r.id == id).ok_or(AuditError::NotFound(id))?;
    let body: EventBody = serde_json::from_str(&record.body).map_err(|e| StoreError::Other(anyhow::anyhow!("event {id}: {e}")))?;
    if !caller.restrict(Filter::any()).matches(&body) {
        return Err(AuditError::NotFound(id));
    }
    let limits = core.filter_limits().merged();
    let consumers = store
        .consumer_list(Actor { sub: &caller.sub, admin: caller.admin })
        .await?
        .into_iter()
        .map(|c| {
            // A stored filter was valid when stored; one that no longer
            // parses (a limit lowered since) takes nothing.
            let takes = match &c.filter_json {
                None => true,
                Some(json) => Filter::from_json(json, limits).is_ok_and(|f| f.matches(&body)),
            };
            let state = if !takes {
                "not_matched"
            } else if c.cursor >= id {
                "acknowledged"
            } else {
                "pending"
            };
            let consumer_id = super::poll::consumer_id(&c.id, &c.owner).to_owned();
            ConsumerState { consumer_id, owner: c.owner, cursor: c.cursor, state }
        })
        .collect();
    let (devices, devices_truncated) = if caller.admin {
        let mut cursors = store.device_cursors(MAX_DEVICES + 1).await?;
        let truncated = cursors.len() > MAX_DEVICES;
        cursors.truncate(MAX_DEVICES);
        (cursors.into_iter().map(|cursor| DeviceState { acknowledged: cursor.cursor >= id, cursor }).collect(), truncated)
    } else {
        (Vec::new(), false)
    };
    Ok(Audit { envelope: tidings_protocol::event::encode_envelope(id, &record.body), consumers, devices, devices_truncated })
}
