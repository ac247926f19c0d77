//! Epochs of the event log: what survives a store that lost a suffix of
//! its history (a PostgreSQL failover to a standby that was behind, a
//! point-in-time restore, a restored backup), so that no id ever names two
//! events and every resume point in a lost suffix is told so.
//!
//! An epoch is a stretch of the log whose ids are gap-free and
//! commit-ordered. A new epoch begins at its **fork** (the last id that
//! survived) and hands out ids from just after its **base**, which is past
//! every id any earlier epoch can have handed out, lost or not. The ids
//! between the fork and the base, `(fork, base]`, name no event in the log
//! any more: a resume point there was shown history that is gone, and is
//! answered with a gap whose reason is `history_lost` (see
//! `docs/guarantees.md` and `docs/failover.md` in the book).
//!
//! How far the base jumps ([`next_base`]): to a clock floor that grows by
//! [`IDS_PER_SECOND`] since 2024, plus [`MARGIN`] for a new primary whose
//! clock is behind. Every epoch begins on that one rising function of
//! time, so an epoch begun later begins past every id an earlier one
//! handed out, even after a restore to a point before an earlier epoch
//! change rolled the epochs table back. Ids stay below 2^53, so JavaScript
//! represents each exactly, for two thousand years at that rate.
//!
//! The epoch 0 of every store begins at 0 with fork 0: a deployment that
//! never lost history keeps the ids it has.

use tidings_protocol::event::EventId;

/// How far past the clock floor a new epoch's ids begin: 2^32, about nine
/// hours of the floor's growth, for a new primary whose clock is behind.
pub const MARGIN: EventId = 1 << 32;

/// How fast the clock floor of a new epoch's base grows: 2^17 ids per
/// second since [`CLOCK_ORIGIN_MS`], far above the rate one log appends at
/// (every append takes the log's head row in turn).
pub const IDS_PER_SECOND: EventId = 1 << 17;

/// 2024-01-01T00:00:00Z in Unix milliseconds: where the clock floor starts.
pub const CLOCK_ORIGIN_MS: i64 = 1_704_067_200_000;

/// The largest id JavaScript represents exactly (2^53 - 1).
pub const MAX_ID: EventId = (1 << 53) - 1;

/// Why an epoch began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EpochReason {
    /// The store's first epoch.
    Initial,
    /// PostgreSQL answers on another timeline than the epoch's (a standby
    /// was promoted, or a point-in-time restore).
    Timeline,
    /// PostgreSQL answers with another system identifier (another cluster:
    /// a restore into a new one).
    System,
    /// A process found the head below an id it had seen committed.
    HeadBehind,
    /// An operator began it (`tidings epoch new`, after restoring a backup).
    Operator,
}

impl EpochReason {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Initial => "initial",
            Self::Timeline => "timeline",
            Self::System => "system",
            Self::HeadBehind => "head_behind",
            Self::Operator => "operator",
        }
    }

    /// The reason of a stored name (an unknown one reads as `operator`:
    /// only tidings writes the column).
    pub fn parse(name: &str) -> Self {
        match name {
            "initial" => Self::Initial,
            "timeline" => Self::Timeline,
            "system" => Self::System,
            "head_behind" => Self::HeadBehind,
            _ => Self::Operator,
        }
    }
}

/// One epoch as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Epoch {
    /// Its number: 0, then one more each time.
    pub number: i32,
    /// The last id that survived into it (0 for the first).
    pub fork: EventId,
    /// Its ids are `base + 1`, `base + 2`, ... (0 for the first).
    pub base: EventId,
    /// Why it began.
    pub reason: EpochReason,
    /// When it began, Unix milliseconds.
    pub started_ms: i64,
}

/// Every epoch of a log, in order: what a resume point is checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epochs {
    /// Ascending by number (and so by base); never empty.
    list: Vec<Epoch>,
}

impl Default for Epochs {
    fn default() -> Self {
        Self::new(Vec::new())
    }
}

impl Epochs {
    /// The epochs of `list` (sorted here); an empty list is the first
    /// epoch alone.
    pub fn new(mut list: Vec<Epoch>) -> Self {
        list.sort_by_key(|e| e.number);
        if list.is_empty() {
            list.push(Epoch { number: 0, fork: 0, base: 0, reason: EpochReason::Initial, started_ms: 0 });
        }
        Self { list }
    }

    /// The current (newest) epoch.
    pub fn current(&self) -> &Epoch {
        self.list.last().expect("never empty")
    }

    /// Every epoch, oldest first.
    pub fn all(&self) -> &[Epoch] {
        &self.list
    }

    /// The fork of an epoch begun at `head`: the head, or, when the
    /// current epoch handed out nothing yet (the head is its base), that
    /// epoch's fork, the last id that survived.
    pub fn fork_at(&self, head: EventId) -> EventId {
        let current = self.current();
        if current.number > 0 && head == current.base { current.fork } else { head }
    }

    /// The epoch whose lost stretch `(fork, base]` holds `id`: a resume
    /// point there was shown history that is gone. `None` for an id the
    /// log can still speak for.
    pub fn lost(&self, id: EventId) -> Option<&Epoch> {
        self.list.iter().skip(1).find(|e| e.fork < id && id <= e.base)
    }

    /// The id that follows `id` in the log when nothing was pruned: the
    /// next one, or, at an epoch's fork, the first id of the newest epoch
    /// that forked there (an epoch that handed out nothing before the next
    /// one began leaves that one the same fork).
    pub fn next_after(&self, id: EventId) -> EventId {
        self.list.iter().skip(1).rev().find(|e| e.fork == id).map_or(id, |e| e.base) + 1
    }

    /// The id before `id` in the log: the previous one, or the fork for
    /// the first id of an epoch.
    pub fn before(&self, id: EventId) -> EventId {
        self.list.iter().skip(1).find(|e| e.base == id - 1).map_or(id - 1, |e| e.fork)
    }

    /// The stretches of ids each epoch kept, `(base, upper]`, newest first
    /// (`upper` is `None` for the current epoch, which is still growing).
    fn kept(&self) -> impl Iterator<Item = (EventId, Option<EventId>)> + '_ {
        self.list.iter().enumerate().rev().map(|(i, e)| (e.base, self.list.get(i + 1).map(|next| next.fork.max(e.base))))
    }

    /// How many ids of the log lie in `(after, upto]`: those every epoch
    /// kept, none of the lost stretches.
    pub fn count_between(&self, after: EventId, upto: EventId) -> u64 {
        let n: i64 = self.kept().map(|(base, upper)| (upper.unwrap_or(upto).min(upto) - base.max(after)).max(0)).sum();
        u64::try_from(n).unwrap_or(0)
    }

    /// The id `n` ids of the log below `head` (never below 0): the oldest
    /// resume point a capped replay reaches.
    pub fn back(&self, head: EventId, n: u64) -> EventId {
        let mut left = i64::try_from(n).unwrap_or(i64::MAX);
        let mut at = head;
        for (base, upper) in self.kept() {
            at = at.min(upper.unwrap_or(at));
            let here = (at - base).max(0);
            if left < here {
                return at - left;
            }
            left -= here;
            // Every id this epoch kept is counted: the resume point is the
            // end of what the epoch before kept (this epoch's fork).
            at = base;
            if left == 0 {
                break;
            }
        }
        if left > 0 {
            return 0;
        }
        // `at` is an epoch's base: the point before its first id is its fork.
        self.list.iter().find(|e| e.base == at).map_or(at, |e| e.fork)
    }
}

/// The epochs a process read last, shared by its tasks: a resume checks
/// its point against them without a round trip unless the head row names
/// a newer epoch. Empty until the first read: a process that never read
/// them cannot answer for them.
#[derive(Debug, Default)]
pub struct EpochCache(std::sync::Mutex<Option<std::sync::Arc<Epochs>>>);

impl EpochCache {
    /// What was read last, if anything was and it is as new as epoch
    /// `at_least`.
    pub fn get(&self, at_least: i32) -> Option<std::sync::Arc<Epochs>> {
        let cached = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()?;
        (cached.current().number >= at_least).then_some(cached)
    }

    /// Keeps `epochs`, as read from the store now, and answers it. A read
    /// replaces whatever was kept, even a longer list: a store restored to
    /// a point before an epoch began has rolled its table back (a reader
    /// racing a newer one only makes the next resume read again).
    pub fn set(&self, epochs: Epochs) -> std::sync::Arc<Epochs> {
        let epochs = std::sync::Arc::new(epochs);
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(epochs.clone());
        epochs
    }
}

/// Where a new epoch's ids begin: at the clock floor of `now_ms` plus
/// [`MARGIN`], and past `fork`, every earlier epoch's base and every id
/// `seen` by the process that begins it (`seen` is at most [`MAX_ID`]).
///
/// Every epoch begins on the same rising function of time, so an epoch's
/// ids (handed out at no more than [`IDS_PER_SECOND`] on average) stay
/// below the base of any epoch begun after it, even one whose table never
/// heard of it (a restore to a point before it began); the margin covers a
/// new primary whose clock is behind the old one's by up to nine hours.
pub fn next_base(epochs: &Epochs, fork: EventId, seen: EventId, now_ms: i64) -> EventId {
    let clock = (now_ms - CLOCK_ORIGIN_MS).max(0) / 1000 * IDS_PER_SECOND;
    let newest_base = epochs.all().iter().map(|e| e.base).max().unwrap_or(0);
    (clock + MARGIN).max(fork + 1).max(newest_base + 1).max(seen.min(MAX_ID) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(number: i32, fork: EventId, base: EventId) -> Epoch {
        Epoch { number, fork, base, reason: EpochReason::Operator, started_ms: 0 }
    }

    /// Ids 1..=10, lost 11..; ids 1000..=1005 (base 999), lost 1006..;
    /// then from 5000 (base 4999).
    fn three() -> Epochs {
        Epochs::new(vec![epoch(2, 1005, 4999), epoch(0, 0, 0), epoch(1, 10, 999)])
    }

    #[test]
    fn a_resume_point_in_a_lost_stretch_names_its_epoch() {
        let e = three();
        assert_eq!(e.current().number, 2);
        assert_eq!(e.lost(10), None);
        assert_eq!(e.lost(11).map(|e| e.fork), Some(10));
        assert_eq!(e.lost(999).map(|e| e.fork), Some(10));
        assert_eq!(e.lost(1000), None);
        assert_eq!(e.lost(1005), None);
        assert_eq!(e.lost(1006).map(|e| e.fork), Some(1005));
        assert_eq!(e.lost(5000), None);
        assert_eq!(Epochs::default().lost(7), None);
    }

    #[test]
    fn the_next_and_previous_ids_cross_epoch_boundaries() {
        let e = three();
        assert_eq!((e.next_after(9), e.next_after(10), e.next_after(1005), e.next_after(5000)), (10, 1000, 5000, 5001));
        assert_eq!((e.before(1000), e.before(5000), e.before(1001), e.before(1)), (10, 1005, 1000, 0));
        // An epoch that handed out nothing: its fork is the next one's too.
        let empty = Epochs::new(vec![epoch(0, 0, 0), epoch(1, 10, 999), epoch(2, 10, 4999)]);
        assert_eq!((empty.next_after(10), empty.before(5000)), (5000, 10));
        assert_eq!((empty.lost(500).map(|e| e.number), empty.lost(2000).map(|e| e.number)), (Some(1), Some(2)));
        assert_eq!((empty.count_between(0, 5002), empty.back(5002, 2), empty.back(5002, 3), empty.back(5002, 5)), (13, 5000, 10, 8));
    }

    #[test]
    fn counts_and_caps_skip_lost_stretches() {
        let e = three();
        assert_eq!(e.count_between(0, 5002), 10 + 6 + 3);
        assert_eq!(e.count_between(8, 1001), 2 + 2);
        assert_eq!(e.count_between(5, 5), 0);
        assert_eq!(e.back(5002, 2), 5000);
        assert_eq!(e.back(5002, 3), 1005);
        assert_eq!(e.back(5002, 4), 1004);
        assert_eq!(e.back(5002, 9), 10);
        assert_eq!(e.back(5002, 10), 9);
        assert_eq!(e.count_between(e.back(5002, 12), 5002), 12);
        assert_eq!(e.back(5002, 100), 0);
        assert_eq!(Epochs::default().back(50, 20), 30);
        // The new epoch has handed out nothing yet: the head is its fork.
        assert_eq!(Epochs::new(vec![epoch(0, 0, 0), epoch(1, 10, 999)]).back(10, 3), 7);
    }

    #[test]
    fn a_new_base_is_past_the_fork_every_base_and_the_clock() {
        let e = three();
        let now = CLOCK_ORIGIN_MS + 100_000 * 1000;
        assert_eq!(next_base(&e, 5003, 0, CLOCK_ORIGIN_MS), MARGIN);
        assert_eq!(next_base(&Epochs::default(), 10, 0, now), 100_000 * IDS_PER_SECOND + MARGIN);
        assert_eq!(next_base(&e, MARGIN + 7, 0, 0), MARGIN + 8, "past the fork");
        assert_eq!(next_base(&Epochs::new(vec![epoch(0, 0, 0), epoch(1, 3, MARGIN * 2)]), 3, 0, 0), MARGIN * 2 + 1, "past every base");
        assert_eq!(next_base(&Epochs::default(), 10, i64::MAX, 0), MAX_ID + 1, "a seen id is taken at most up to 2^53");
        // Two epochs a minute apart, then a restore to between them: the
        // third begins past every id the second can have handed out at
        // 2^17 a second, though its table never heard of the second.
        let (t1, t2, t3) = (now, now + 60_000, now + 120_000);
        let one = Epochs::new(vec![epoch(0, 0, 0), epoch(1, 10, next_base(&Epochs::default(), 10, 0, t1))]);
        let b2 = next_base(&one, one.current().base + 5, 0, t2);
        let b3 = next_base(&one, one.current().base + 2, 0, t3);
        assert!(b3 >= b2 + 60 * IDS_PER_SECOND, "{b2} {b3}");
        // Today's floor leaves room for centuries of ids below 2^53.
        let today = chrono::DateTime::parse_from_rfc3339("2026-12-04T00:00:00Z").unwrap().timestamp_millis();
        let base = next_base(&Epochs::default(), 0, 0, today);
        assert!(base > MARGIN && base < MAX_ID / 100, "{base}");
    }
}
