//! Which live clients could match an event, by its type, so that full filter
//! evaluation (agents, targets, the compiled payload rule) runs only on
//! those candidates. Pure.
//!
//! Each type glob of a filter is filed under one key:
//! - an exact name (`signal.upvote.recorded`): looked up by the event type;
//! - otherwise its literal prefix (`link` for `link.*.added`): looked up by
//!   every `.`-prefix of the event type;
//! - no literal prefix (`**.recorded`), or no `types` at all: a residual list
//!   checked for every event, which stays small in practice.
//!
//! The index only narrows; [`crate::filter::Filter::matches`] decides.

use std::collections::HashMap;

use crate::filter::Filter;

/// A client's key in the index.
pub type ClientId = u64;

/// The index: clients filed with a value `T` (the broker files its slot, so
/// fan-out reaches the queue without a second lookup).
#[derive(Debug)]
pub struct FilterIndex<T> {
    exact: HashMap<Box<str>, Vec<(ClientId, T)>>,
    prefix: HashMap<Box<str>, Vec<(ClientId, T)>>,
    residual: Vec<(ClientId, T)>,
}

impl<T> Default for FilterIndex<T> {
    fn default() -> Self {
        Self { exact: HashMap::new(), prefix: HashMap::new(), residual: Vec::new() }
    }
}

/// A candidate: the client, its value, and whether its type is already known
/// to match (found under the event's exact name).
pub type Candidate<'a, T> = (ClientId, &'a T, bool);

enum Key<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Residual,
}

fn keys(filter: &Filter) -> Vec<Key<'_>> {
    if filter.types().is_empty() {
        return vec![Key::Residual];
    }
    filter
        .types()
        .iter()
        .map(|g| match (g.exact(), g.literal_prefix()) {
            (Some(name), _) => Key::Exact(name),
            (None, Some(prefix)) => Key::Prefix(prefix),
            (None, None) => Key::Residual,
        })
        .collect()
}

fn remove_from<T>(list: &mut Vec<(ClientId, T)>, id: ClientId) {
    if let Some(i) = list.iter().position(|(x, _)| *x == id) {
        list.swap_remove(i);
    }
}

impl<T: Clone> FilterIndex<T> {
    /// Files `id` (with `value`) under every key of `filter`.
    pub fn insert(&mut self, id: ClientId, filter: &Filter, value: T) {
        for key in keys(filter) {
            let list = match key {
                Key::Exact(k) => self.exact.entry(k.into()).or_default(),
                Key::Prefix(k) => self.prefix.entry(k.into()).or_default(),
                Key::Residual => &mut self.residual,
            };
            if !list.iter().any(|(x, _)| *x == id) {
                list.push((id, value.clone()));
            }
        }
    }

    /// Removes `id`, filed with `filter`.
    pub fn remove(&mut self, id: ClientId, filter: &Filter) {
        for key in keys(filter) {
            let (map, k) = match key {
                Key::Exact(k) => (&mut self.exact, k),
                Key::Prefix(k) => (&mut self.prefix, k),
                Key::Residual => {
                    remove_from(&mut self.residual, id);
                    continue;
                }
            };
            if let Some(list) = map.get_mut(k) {
                remove_from(list, id);
                if list.is_empty() {
                    map.remove(k);
                }
            }
        }
    }

    /// Writes into `out` (cleared first) every client that could match an
    /// event of `event_type`, each once, ascending by id.
    pub fn candidates<'a>(&'a self, event_type: &str, out: &mut Vec<Candidate<'a, T>>) {
        out.clear();
        out.extend(self.residual.iter().map(|(id, v)| (*id, v, false)));
        if let Some(list) = self.exact.get(event_type) {
            out.extend(list.iter().map(|(id, v)| (*id, v, true)));
        }
        if !self.prefix.is_empty() {
            for (i, b) in event_type.bytes().enumerate() {
                if b == b'.'
                    && let Some(list) = self.prefix.get(&event_type[..i])
                {
                    out.extend(list.iter().map(|(id, v)| (*id, v, false)));
                }
            }
        }
        if out.len() > 1 {
            out.sort_unstable_by_key(|(id, _, typed)| (*id, !*typed));
            // Keep the first of each id: the one whose type is known, if any.
            out.dedup_by_key(|(id, _, _)| *id);
        }
    }

    /// Whether nothing is filed.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefix.is_empty() && self.residual.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::FilterLimits;

    fn f(types: &[&str]) -> Filter {
        Filter::from_parts(&types.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &[], &[], FilterLimits::default()).unwrap()
    }

    #[test]
    fn narrows_by_exact_name_prefix_and_residual() {
        let mut index = FilterIndex::<()>::default();
        let filters =
            [f(&["signal.upvote.recorded"]), f(&["link.*.added"]), f(&["**.recorded"]), f(&[]), f(&["hypothesis.*", "signal.**"])];
        for (i, filter) in filters.iter().enumerate() {
            index.insert(i as u64, filter, ());
        }
        let mut out = Vec::new();
        index.candidates("signal.upvote.recorded", &mut out);
        let got: Vec<(u64, bool)> = out.iter().map(|(id, _, typed)| (*id, *typed)).collect();
        assert_eq!(got, vec![(0, true), (2, false), (3, false), (4, false)]);
        index.candidates("link.cites.added", &mut out);
        assert_eq!(out.iter().map(|c| c.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        index.candidates("comment.posted", &mut out);
        assert_eq!(out.iter().map(|c| c.0).collect::<Vec<_>>(), vec![2, 3]);
        // A client filed under an exact name and a prefix keeps "type known".
        drop(out);
        let both = f(&["signal.upvote.recorded", "signal.*.recorded"]);
        index.insert(9, &both, ());
        let mut out = Vec::new();
        index.candidates("signal.upvote.recorded", &mut out);
        assert!(out.iter().any(|c| c.0 == 9 && c.2));
        drop(out);
        index.remove(9, &both);
        for (i, filter) in filters.iter().enumerate() {
            index.remove(i as u64, filter);
        }
        assert!(index.is_empty());
    }

    proptest::proptest! {
        /// Every client whose filter matches is a candidate: the index never
        /// loses a match.
        #[test]
        fn never_misses_a_match(
            patterns in proptest::collection::vec(proptest::collection::vec(proptest::prop_oneof!["a", "b", "c", "\\*", "\\*\\*"], 1..4), 0..4),
            name in proptest::collection::vec(proptest::prop_oneof!["a", "b", "c"], 1..5),
        ) {
            let patterns: Vec<String> = patterns.iter().map(|p| p.join(".")).collect();
            let filter = Filter::from_parts(&patterns, &[], &[], FilterLimits::default()).unwrap();
            let mut index = FilterIndex::default();
            index.insert(7, &filter, ());
            let name = name.join(".");
            let mut out = Vec::new();
            index.candidates(&name, &mut out);
            let out: Vec<u64> = out.iter().map(|c| c.0).collect();
            let body = crate::event::EventBody {
                event_type: name.clone(), reference: None, agent: None, session_id: None, occurred_at: String::new(),
                payload: serde_json::Value::Null, links: vec![], visibility: crate::event::Visibility::Public,
            };
            if filter.matches(&body) {
                proptest::prop_assert_eq!(out, vec![7]);
            }
        }
    }
}
