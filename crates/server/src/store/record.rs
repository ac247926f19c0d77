//! The log's records: what an append takes ([`NewRecord`]) and a read
//! answers ([`Record`]), where a commit hands them off ([`HandOff`]), and
//! the retained stretch ([`Bounds`]).

use std::sync::Arc;

use tidings_protocol::event::{EventBody, EventId};

/// One record to append.
#[derive(Debug, Clone)]
pub struct NewRecord {
    /// Type name, stored in its own column for operators and indexes.
    pub event_type: String,
    /// The JSON body.
    pub body: String,
}

impl NewRecord {
    /// The record of an event body.
    pub fn event(body: &EventBody) -> Self {
        Self { event_type: body.event_type.clone(), body: body.to_json() }
    }
}

/// One stored record.
#[derive(Debug, Clone)]
pub struct Record {
    /// Its id.
    pub id: EventId,
    /// The JSON body as appended.
    pub body: String,
    /// When it was committed, in Unix milliseconds.
    pub recorded_ms: i64,
}

/// Where an append hands the records it has just committed: the broker,
/// which fans them out at once when they are the next ids it owes its
/// clients, and answers whether it took them. When it did not (a commit of
/// another writer, or of another process, is still to be read first) the
/// store wakes it to read the log, as after any other commit. Handing off
/// spares a delivery the broker's wake-up and its read of the log: under
/// load each of those waits its turn behind every stream task.
#[derive(Clone)]
pub struct HandOff(Arc<dyn Fn(Vec<Record>) -> bool + Send + Sync>);

impl HandOff {
    /// A hand-off to `take`, which answers whether it took the records.
    pub fn new(take: impl Fn(Vec<Record>) -> bool + Send + Sync + 'static) -> Self {
        Self(Arc::new(take))
    }

    /// Hands `records` (committed, in id order) over; whether they were taken.
    pub fn give(&self, records: Vec<Record>) -> bool {
        (self.0)(records)
    }
}

impl std::fmt::Debug for HandOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandOff")
    }
}

/// The retained stretch of the log, read at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The oldest resume point served without a gap ([`EventLog::floor`]).
    pub floor: EventId,
    /// The highest committed id ([`EventLog::head`]).
    pub head: EventId,
    /// The current epoch's number ([`EventLog::epochs`]).
    pub epoch: i32,
}
