//! What the tree's writes and the subscription engine's steps hand the
//! store: a stored entity ([`TreeEntry`]), a write and its precondition
//! ([`TreeWrite`], [`Condition`]), what it found ([`TreeOutcome`]), and one
//! engine step committed with its cursor ([`EngineCommit`], [`Tally`]).

use tidings_protocol::event::EventId;
use tidings_protocol::tree::{ChangeEvent, ChangeKind};

use super::NewRecord;

/// A stored tree entity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    /// Its path.
    pub path: String,
    /// Its canonical JSON.
    pub entity: String,
    /// `sha256:<hex>` of that JSON.
    pub hash: String,
    /// The log id of the change that put it there.
    pub changed_event: EventId,
}

/// The precondition of a tree write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// None: write whatever is there.
    Always,
    /// Only if the current entity has this hash (`If-Match`).
    IfMatch(String),
    /// Only if an entity is there, whatever it is (`If-Match: *`).
    IfPresent,
    /// Only if nothing is there (`If-None-Match: *`).
    IfAbsent,
}

/// A tree write: a put (`entity` is the canonical JSON and its hash) or a
/// delete (`entity` is `None`).
#[derive(Clone)]
pub struct TreeWrite {
    /// The path.
    pub path: String,
    /// What to store, or `None` to delete.
    pub entity: Option<(String, String)>,
    /// The precondition.
    pub condition: Condition,
    /// The change event to append with it.
    pub event: ChangeEvent,
}

impl std::fmt::Debug for TreeWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeWrite").field("path", &self.path).field("condition", &self.condition).finish_non_exhaustive()
    }
}

/// One effect of a subscription-engine step, applied in its commit.
#[derive(Debug)]
pub enum EngineEffect {
    /// Append a record (a notification).
    Append(NewRecord),
    /// A tree write (a chain-error marker, or deleting a terminated
    /// subscription). A write whose precondition does not hold is skipped.
    Tree(TreeWrite),
}

/// One step of the subscription engine: everything it produced for the tree
/// changes in `(from, to]`, committed together with its cursor, so a crash
/// neither loses nor repeats a notification.
#[derive(Debug)]
pub struct EngineCommit {
    /// The cursor this step started from; the commit fails if it moved.
    pub from: EventId,
    /// The cursor after this step.
    pub to: EventId,
    /// Notifications, markers and terminations, in order.
    pub effects: Vec<EngineEffect>,
    /// Tallies per subscription to store (`None` forgets one).
    pub counts: Vec<(String, Option<Tally>)>,
}

/// What the subscription engine keeps per subscription between steps,
/// committed with its cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Notifications delivered so far (for `max_events`).
    pub delivered: i64,
    /// The `rate_limit` window: deliveries per second of commit time,
    /// `(second, count)` oldest first, over at most the last minute.
    pub window: Vec<(i64, u32)>,
}

impl Tally {
    /// The window as stored: JSON `[[second, count], ...]`.
    pub fn window_json(&self) -> String {
        serde_json::to_string(&self.window).expect("pairs of integers serialise")
    }

    /// A tally read back; an unreadable window (never written so) is empty.
    pub fn from_stored(delivered: i64, window: &str) -> Self {
        Self { delivered, window: serde_json::from_str(window).unwrap_or_default() }
    }
}

/// What a tree write found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TreeOutcome {
    /// Written; the change event has this id.
    Done {
        /// What happened.
        kind: ChangeKind,
        /// The hash before the write.
        previous_hash: Option<String>,
        /// The change event.
        event_id: EventId,
    },
    /// The precondition failed; this is what is there now.
    Mismatch {
        /// The current hash (`None`: nothing there).
        current: Option<String>,
    },
    /// A delete found nothing to delete.
    Missing,
}

impl TreeWrite {
    /// Decides the outcome from the current hash, before anything is written.
    pub fn decide(&self, current: Option<&str>) -> Result<ChangeKind, TreeOutcome> {
        let mismatch = || TreeOutcome::Mismatch { current: current.map(str::to_owned) };
        match (&self.condition, current) {
            (Condition::IfMatch(h), Some(c)) if h != c => return Err(mismatch()),
            (Condition::IfMatch(_) | Condition::IfPresent, None) | (Condition::IfAbsent, Some(_)) => return Err(mismatch()),
            _ => {}
        }
        match (&self.entity, current) {
            (Some(_), None) => Ok(ChangeKind::Created),
            (Some(_), Some(_)) => Ok(ChangeKind::Updated),
            (None, Some(_)) => Ok(ChangeKind::Deleted),
            (None, None) => Err(TreeOutcome::Missing),
        }
    }
}
