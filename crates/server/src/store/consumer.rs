//! What [`ConsumerStore`](super::ConsumerStore) keeps and answers: durable
//! consumers (their cursors, filters and owners), device cursors as a
//! hello reads them, and the outcomes of opening and acknowledging.

use serde::Serialize;

use tidings_protocol::event::EventId;

/// A durable consumer as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Consumer {
    /// Its id.
    pub id: String,
    /// The stored filter (JSON), `None` for "everything".
    pub filter_json: Option<String>,
    /// Everything up to here is confirmed.
    pub cursor: EventId,
    /// Created, Unix ms.
    pub created_ms: i64,
    /// Last poll or ack, Unix ms.
    pub last_activity_ms: i64,
    /// The identity that created it.
    pub owner: String,
    /// The log's epoch at its read before this one (an open is a read).
    #[serde(skip)]
    pub read_epoch: i32,
    /// The log's epoch at this read.
    #[serde(skip)]
    pub epoch: i32,
}

/// A device's stored cursor as a hello reads it ([`ConsumerStore::device_read`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRead {
    /// Everything up to here is confirmed.
    pub cursor: EventId,
    /// The log's epoch at its hello or ack before this read.
    pub read_epoch: i32,
    /// The log's epoch now.
    pub epoch: i32,
}

/// Who is acting on a consumer: its owner may, an admin may.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    /// The caller's identity.
    pub sub: &'a str,
    /// Admins act on every consumer.
    pub admin: bool,
}

/// How a poll opens a consumer.
#[derive(Debug, Clone)]
pub struct ConsumerOpen<'a> {
    /// The consumer id.
    pub id: &'a str,
    /// `Some` replaces the stored filter (the inner `None` clears it).
    pub filter_json: Option<Option<&'a str>>,
    /// A `since` given with the poll: confirms everything up to it.
    pub since: Option<EventId>,
    /// A consumer silent since before this (Unix ms) is collected first.
    pub expire_before_ms: i64,
    /// Now, Unix ms.
    pub now_ms: i64,
    /// Who polls: owns a consumer it creates; needs to own an existing one.
    pub actor: Actor<'a>,
    /// Most consumers its owner may have: creating one more is refused
    /// ([`Opened::TooMany`]) and stores nothing.
    pub max_owned: u32,
}

/// What opening a consumer found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// The consumer, created or updated.
    Ready(Consumer),
    /// It was collected for silence and no `since` was given.
    Expired,
    /// It belongs to another identity.
    Forbidden,
    /// It does not exist and its owner already has `max_owned` consumers.
    TooMany,
}

/// What an ack confirmed: the consumer's events after `before` up to
/// `cursor`, read through its filter (delivery spans link the events an
/// ack settles).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    /// The cursor before the ack.
    pub before: EventId,
    /// The cursor after it.
    pub cursor: EventId,
    /// The consumer's stored filter (`None`: every event).
    pub filter_json: Option<String>,
}

impl Acked {
    /// The cursor after an ack or a delete; `None` for a refusal.
    pub fn cursor(&self) -> Option<EventId> {
        match self {
            Self::Cursor(c) | Self::Moved(Moved { cursor: c, .. }) => Some(*c),
            Self::NotFound | Self::Expired | Self::Forbidden => None,
        }
    }
}

/// What an ack or a delete found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acked {
    /// The cursor after a delete.
    Cursor(EventId),
    /// What an ack confirmed.
    Moved(Moved),
    /// No such consumer.
    NotFound,
    /// It was collected for silence.
    Expired,
    /// It belongs to another identity.
    Forbidden,
}
