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

/// The index.
#[derive(Debug, Default)]
pub struct FilterIndex {
    exact: HashMap<Box<str>, Vec<ClientId>>,
    prefix: HashMap<Box<str>, Vec<ClientId>>,
    residual: Vec<ClientId>,
}

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

fn remove_from(list: &mut Vec<ClientId>, id: ClientId) {
    if let Some(i) = list.iter().position(|x| *x == id) {
        list.swap_remove(i);
    }
}

impl FilterIndex {
    /// Files `id` under every key of `filter`.
    pub fn insert(&mut self, id: ClientId, filter: &Filter) {
        for key in keys(filter) {
            let list = match key {
                Key::Exact(k) => self.exact.entry(k.into()).or_default(),
                Key::Prefix(k) => self.prefix.entry(k.into()).or_default(),
                Key::Residual => &mut self.residual,
            };
            if !list.contains(&id) {
                list.push(id);
            }
        }
    }

    /// Removes `id`, filed with `filter`.
    pub fn remove(&mut self, id: ClientId, filter: &Filter) {
        for key in keys(filter) {
            match key {
                Key::Exact(k) => {
                    if let Some(list) = self.exact.get_mut(k) {
                        remove_from(list, id);
                        if list.is_empty() {
                            self.exact.remove(k);
                        }
                    }
                }
                Key::Prefix(k) => {
                    if let Some(list) = self.prefix.get_mut(k) {
                        remove_from(list, id);
                        if list.is_empty() {
                            self.prefix.remove(k);
                        }
                    }
                }
                Key::Residual => remove_from(&mut self.residual, id),
            }
        }
    }

    /// Writes into `out` (cleared first) every client that could match an
    /// event of `event_type`, each once, ascending.
    pub fn candidates(&self, event_type: &str, out: &mut Vec<ClientId>) {
        out.clear();
        out.extend_from_slice(&self.residual);
        if let Some(list) = self.exact.get(event_type) {
            out.extend_from_slice(list);
        }
        if !self.prefix.is_empty() {
            for (i, b) in event_type.bytes().enumerate() {
                if b == b'.'
                    && let Some(list) = self.prefix.get(&event_type[..i])
                {
                    out.extend_from_slice(list);
                }
            }
        }
        out.sort_unstable();
        out.dedup();
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
        let mut index = FilterIndex::default();
        let filters =
            [f(&["signal.upvote.recorded"]), f(&["link.*.added"]), f(&["**.recorded"]), f(&[]), f(&["hypothesis.*", "signal.**"])];
        for (i, filter) in filters.iter().enumerate() {
            index.insert(i as u64, filter);
        }
        let mut out = Vec::new();
        index.candidates("signal.upvote.recorded", &mut out);
        assert_eq!(out, vec![0, 2, 3, 4]);
        index.candidates("link.cites.added", &mut out);
        assert_eq!(out, vec![1, 2, 3]);
        index.candidates("comment.posted", &mut out);
        assert_eq!(out, vec![2, 3]);
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
            index.insert(7, &filter);
            let name = name.join(".");
            let mut out = Vec::new();
            index.candidates(&name, &mut out);
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
