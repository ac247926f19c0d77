//! Publishes a publisher can retry: what a publish with an `Idempotency-Key`
//! asks of the store, what it answers, and the decision both stores share.
//!
//! A keyed publish is stored with its key (the publisher's scope, the key,
//! the body's SHA-256 and the ids it was answered with) in one transaction.
//! A later publish with a live key stores nothing: with the same body it is
//! answered the original ids, with another it is refused. The stores find
//! the keys already recorded (PostgreSQL claims them first, so a retry that
//! races its first attempt in another process waits on the key's row for
//! that attempt's outcome); [`plan`] decides each member of a group from
//! them, members of one group sharing a key included, and [`finish`] turns
//! the plan and the appended ids into answers.

use std::collections::HashMap;

use super::{EventLog, NewRecord, StoreError};
use tidings_protocol::event::EventId;

/// A publish's `Idempotency-Key`, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// Whose key: the publisher's identity (keys of two publishers never meet).
    pub scope: String,
    /// The key the publisher sent.
    pub key: String,
    /// SHA-256 of the request body.
    pub body_hash: [u8; 32],
    /// Which of the publish's records the answer lists, by position (the
    /// aliases a rename fires are stored but not answered).
    pub answer: Vec<usize>,
    /// When the key is recorded, Unix ms.
    pub now_ms: i64,
    /// How long a key lives, ms (`TIDINGS_IDEMPOTENCY_WINDOW`): one recorded
    /// longer ago than this before `now_ms` counts as absent. One setting,
    /// so the members of a group share it (a store may take the first's).
    pub window_ms: i64,
}

/// One publish: its records, all or nothing, and its key if it has one.
#[derive(Debug, Clone)]
pub struct Publish {
    /// The records, in order.
    pub records: Vec<NewRecord>,
    /// The `Idempotency-Key`, if the publisher sent one.
    pub key: Option<IdempotencyKey>,
}

/// What became of a [`Publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// Stored now: the id of each record, in order.
    Stored(Vec<EventId>),
    /// The key is live with the same body: the ids the publish was answered
    /// with then; nothing was stored.
    Replayed(Vec<EventId>),
    /// The key is live with another body: nothing was stored.
    KeyReused,
}

/// A key already recorded: its body's hash and the ids it answered.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub(crate) body_hash: Vec<u8>,
    pub(crate) event_ids: Vec<EventId>,
}

/// What to do with one member of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Append its records (and record its key, if any).
    Append,
    /// Answer these ids, store nothing.
    Replay(Vec<EventId>),
    /// Refuse: the key is live with another body.
    Reused,
    /// Same key and body as member `j` of this group, which appends: answer
    /// what `j` is answered.
    Follow(usize),
}

/// The scope and key of a publish, if keyed.
pub(crate) fn key_of(publish: &Publish) -> Option<(&str, &str)> {
    publish.key.as_ref().map(|k| (k.scope.as_str(), k.key.as_str()))
}

/// The distinct keys of a group, sorted (the order every store claims them
/// in, so two groups never wait on each other's keys in a cycle): of each,
/// its first member's.
pub(crate) fn distinct_keys(publishes: &[Publish]) -> Vec<&IdempotencyKey> {
    let mut keys: Vec<&IdempotencyKey> = publishes.iter().filter_map(|p| p.key.as_ref()).collect();
    // Stable: the first member of a key stays ahead of the later ones.
    keys.sort_by(|a, b| (&a.scope, &a.key).cmp(&(&b.scope, &b.key)));
    keys.dedup_by(|a, b| a.scope == b.scope && a.key == b.key);
    keys
}

/// Takes the records of the members that append, in member order, for
/// one append: the batch, and each member's share of it (`None` for the
/// members that do not append).
pub(crate) fn take_batch(publishes: &mut [Publish], plans: &[Plan]) -> (Vec<NewRecord>, Vec<Option<std::ops::Range<usize>>>) {
    let mut batch = Vec::new();
    let shares = publishes
        .iter_mut()
        .zip(plans)
        .map(|(publish, plan)| {
            (*plan == Plan::Append).then(|| {
                let start = batch.len();
                batch.append(&mut publish.records);
                start..batch.len()
            })
        })
        .collect();
    (batch, shares)
}

/// The ids of each member's share of an appended batch.
pub(crate) fn split(ids: &[EventId], shares: &[Option<std::ops::Range<usize>>]) -> Vec<Option<Vec<EventId>>> {
    shares.iter().map(|share| share.clone().map(|range| ids[range].to_vec())).collect()
}

/// Decides each member: a live recorded key answers it; else the first
/// member with a key appends and the later ones with that key follow it
/// (same body) or are refused (another body).
pub(crate) fn plan(publishes: &[Publish], recorded: &HashMap<(String, String), Recorded>) -> Vec<Plan> {
    let mut first: HashMap<(&str, &str), usize> = HashMap::new();
    publishes
        .iter()
        .enumerate()
        .map(|(i, publish)| {
            let (Some(key), Some(id)) = (&publish.key, key_of(publish)) else { return Plan::Append };
            if let Some(seen) = recorded.get(&(id.0.to_owned(), id.1.to_owned())) {
                return if seen.body_hash == key.body_hash { Plan::Replay(seen.event_ids.clone()) } else { Plan::Reused };
            }
            match first.get(&id) {
                None => {
                    first.insert(id, i);
                    Plan::Append
                }
                Some(&j) if publishes[j].key.as_ref().is_some_and(|k| k.body_hash == key.body_hash) => Plan::Follow(j),
                Some(_) => Plan::Reused,
            }
        })
        .collect()
}

/// The ids a keyed publish answers with, from the ids of all its records.
pub(crate) fn answered(key: &IdempotencyKey, ids: &[EventId]) -> Vec<EventId> {
    key.answer.iter().filter_map(|&p| ids.get(p).copied()).collect()
}

/// A group without keys: one append, each member its share of the ids.
pub(crate) async fn unkeyed<L: EventLog + ?Sized>(log: &L, publishes: Vec<Publish>) -> Result<Vec<Published>, StoreError> {
    let sizes: Vec<usize> = publishes.iter().map(|p| p.records.len()).collect();
    let ids = log.append(publishes.into_iter().flat_map(|p| p.records).collect()).await?;
    let mut ids = ids.into_iter();
    Ok(sizes.into_iter().map(|size| Published::Stored(ids.by_ref().take(size).collect())).collect())
}

/// Each member's answer, from its plan and, for those that appended, the ids
/// of their records (in member order).
pub(crate) fn finish(publishes: &[Publish], plans: Vec<Plan>, appended: Vec<Option<Vec<EventId>>>) -> Vec<Published> {
    let follow = |j: usize, appended: &[Option<Vec<EventId>>]| -> Published {
        match (&publishes[j].key, &appended[j]) {
            (Some(key), Some(ids)) => Published::Replayed(answered(key, ids)),
            _ => Published::KeyReused,
        }
    };
    plans
        .iter()
        .enumerate()
        .map(|(i, plan)| match plan {
            Plan::Append => Published::Stored(appended[i].clone().unwrap_or_default()),
            Plan::Replay(ids) => Published::Replayed(ids.clone()),
            Plan::Reused => Published::KeyReused,
            Plan::Follow(j) => follow(*j, &appended),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(key: &str, body: u8) -> Publish {
        Publish {
            records: vec![NewRecord { event_type: "a.b".into(), body: "{}".into() }],
            key: Some(IdempotencyKey {
                scope: "alice".into(),
                key: key.into(),
                body_hash: [body; 32],
                answer: vec![0],
                now_ms: 0,
                window_ms: 1,
            }),
        }
    }

    #[test]
    fn members_sharing_a_key_follow_the_first_or_are_refused() {
        let group = vec![keyed("k", 1), keyed("k", 1), keyed("k", 2), keyed("j", 1)];
        let plans = plan(&group, &HashMap::new());
        assert_eq!(plans, vec![Plan::Append, Plan::Follow(0), Plan::Reused, Plan::Append]);
        let answers = finish(&group, plans, vec![Some(vec![7]), None, None, Some(vec![8])]);
        assert_eq!(
            answers,
            vec![Published::Stored(vec![7]), Published::Replayed(vec![7]), Published::KeyReused, Published::Stored(vec![8])]
        );
    }

    #[test]
    fn a_recorded_key_answers_with_its_ids_or_refuses_another_body() {
        let recorded = HashMap::from([(("alice".into(), "k".into()), Recorded { body_hash: vec![1; 32], event_ids: vec![3, 5] })]);
        let plans = plan(&[keyed("k", 1), keyed("k", 2)], &recorded);
        assert_eq!(plans, vec![Plan::Replay(vec![3, 5]), Plan::Reused]);
    }

    #[test]
    fn keys_are_claimed_sorted_and_once() {
        let group = [keyed("b", 1), keyed("a", 1), keyed("b", 2)];
        let keys = distinct_keys(&group);
        assert_eq!(keys.iter().map(|k| (k.key.as_str(), k.body_hash[0])).collect::<Vec<_>>(), vec![("a", 1), ("b", 1)]);
    }
}
