//! The gap a session announces when a resume point cannot be served whole,
//! and why: pruned, past the replay limit, beyond the head, or in history
//! the store lost (see `crate::store::epoch`). One JSON shape for every
//! transport: `system.replay_gap` on streams, a poll's `gap`, WebSocket's
//! `stream.gap`.

use crate::event::EventId;

/// A resume point that the log cannot serve without a gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// What the client asked to resume after.
    pub requested: EventId,
    /// The oldest id it can still receive.
    pub available_from: EventId,
    /// The head when this was found.
    pub head: EventId,
    /// Why.
    pub reason: GapReason,
    /// With [`GapReason::HistoryLost`]: the last id that survived (the
    /// epoch's fork); delivery goes on with every event after it.
    pub fork: Option<EventId>,
}

/// Why a resume point could not be served whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GapReason {
    /// Retention deleted the history asked for.
    Pruned,
    /// Further back than one resume may replay (`TIDINGS_MAX_REPLAY`).
    ReplayLimit,
    /// The resume point is beyond the head (a client of another log, or of
    /// history that was lost before any process noticed).
    BeyondHead,
    /// The resume point lies in a suffix of the log that the store lost (a
    /// failover to a standby that was behind, a restored backup): what the
    /// client saw after the fork is gone, and its ids name nothing.
    HistoryLost,
}

impl GapReason {
    /// The wire name (`reason` of `system.replay_gap`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pruned => "pruned",
            Self::ReplayLimit => "replay_limit",
            Self::BeyondHead => "beyond_head",
            Self::HistoryLost => "history_lost",
        }
    }
}

impl Gap {
    /// The gap as its JSON object (`system.replay_gap`, a poll's `gap`,
    /// WebSocket's `stream.gap`).
    pub fn to_json(&self) -> serde_json::Value {
        let mut gap = serde_json::json!({
            "requested": self.requested,
            "available_from": self.available_from,
            "head": self.head,
            "reason": self.reason.as_str(),
        });
        if let Some(fork) = self.fork {
            gap["fork"] = fork.into();
        }
        gap
    }
}
