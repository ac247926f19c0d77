//! The gap a session announces when a resume point cannot be served whole,
//! and why: pruned, past the replay limit, beyond the head, or in history
//! the store lost (see `crate::store::epoch`). One JSON shape for every
//! transport: `system.replay_gap` on streams, a poll's `gap`, WebSocket's
//! `stream.gap`.

use tidings_protocol::event::EventId;
use tidings_protocol::wire;

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
        serde_json::to_value(self.wire()).expect("a gap is plain JSON")
    }

    /// The gap as the protocol describes it to clients.
    pub fn wire(&self) -> wire::ReplayGap {
        let reason = match self.reason {
            GapReason::Pruned => wire::GapReason::Pruned,
            GapReason::ReplayLimit => wire::GapReason::ReplayLimit,
            GapReason::BeyondHead => wire::GapReason::BeyondHead,
            GapReason::HistoryLost => wire::GapReason::HistoryLost,
        };
        wire::ReplayGap { requested: self.requested, available_from: self.available_from, head: self.head, reason, fork: self.fork }
    }
}

impl Gap {
    /// What a server-side cursor's first read in a newer epoch announces: a
    /// cursor at the fork of an epoch begun since its last read
    /// (`read_epoch`) may have been shown events after the fork that the
    /// store lost (they were shown, not yet confirmed, when the store
    /// rolled back with its cursor). `None` when no such epoch began, when
    /// the cursor lies in a lost stretch (the resume check says so), and
    /// when it lies past the epoch's base: it was confirmed in that epoch,
    /// whose first read told it already.
    pub fn at_epoch_change(epochs: &crate::store::Epochs, cursor: EventId, read_epoch: i32, head: EventId) -> Option<Gap> {
        if epochs.lost(cursor).is_some() {
            return None;
        }
        let fork = epochs.all().iter().filter(|e| e.number > read_epoch).find(|e| cursor >= e.fork && cursor <= e.base)?.fork;
        Some(Gap { requested: cursor, available_from: epochs.next_after(cursor), head, reason: GapReason::HistoryLost, fork: Some(fork) })
    }
}

/// What a server-side cursor is told at its first read in a newer epoch
/// ([`Gap::at_epoch_change`]), counted. Under `TIDINGS_DELIVERY=replicated`
/// too: a failover to a standby that was not the synchronous one, or while
/// none was named, may have lost what the cursor was shown, and a notice
/// it did not need costs the client nothing (docs/failover.md).
pub fn told_at_epoch_change(epochs: &crate::store::Epochs, cursor: EventId, read_epoch: i32, head: EventId) -> Option<Gap> {
    let told = Gap::at_epoch_change(epochs, cursor, read_epoch, head)?;
    crate::metrics::replay_gap(GapReason::HistoryLost.as_str());
    Some(told)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Epoch, EpochReason, Epochs};

    #[test]
    fn a_cursor_at_or_past_a_new_fork_is_told_once_behind_it_is_not() {
        let epoch = |number, fork, base| Epoch { number, fork, base, reason: EpochReason::Timeline, started_ms: 0 };
        let epochs = Epochs::new(vec![epoch(0, 0, 0), epoch(1, 10, 1000)]);
        let told = Gap::at_epoch_change(&epochs, 10, 0, 1002).expect("at the fork");
        assert_eq!((told.reason, told.fork, told.requested, told.available_from), (GapReason::HistoryLost, Some(10), 10, 1001));
        assert_eq!(Gap::at_epoch_change(&epochs, 9, 0, 1002), None, "behind the fork: everything it was shown survived");
        assert_eq!(Gap::at_epoch_change(&epochs, 10, 1, 1002), None, "read in the new epoch already");
        assert_eq!(Gap::at_epoch_change(&epochs, 12, 0, 1002), None, "in the lost stretch: the resume check tells it");
        assert_eq!(Gap::at_epoch_change(&epochs, 1001, 0, 1002), None, "confirmed in the new epoch: told at that read");
    }
}
