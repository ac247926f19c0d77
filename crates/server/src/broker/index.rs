//! Which live clients could match an event, by a payload field or by its
//! type, so that full filter evaluation (agents, targets, the compiled
//! payload rule) runs only on those candidates. Pure.
//!
//! A filter whose payload rule requires a field to equal a constant
//! ([`crate::filter::payload::Equality`]) is filed under that field's path
//! and the constant's keys only: an event is looked up by the keys of its
//! own value at each such path (one read per path, however many clients
//! share it), so clients told apart by a user id or a shard cost a lookup,
//! not an evaluation each. Clients told apart by a field are usually told
//! apart by nothing else, and the field is the sharper key.
//!
//! Any other filter has each type glob filed under one key:
//! - an exact name (`signal.upvote.recorded`): looked up by the event type;
//! - otherwise its literal prefix (`link` for `link.*.added`): looked up by
//!   every `.`-prefix of the event type;
//! - no literal prefix (`**.recorded`), or no `types` at all: a residual list
//!   checked for every event, which stays small in practice.
//!
//! The index only narrows; [`crate::filter::Filter::matches`] decides.

use std::collections::HashMap;
use std::sync::Arc;

use crate::filter::payload::{PathProbe, ValueKey};
use crate::filter::{Filter, MatchInput};

/// A client's key in the index.
pub type ClientId = u64;

/// The index: clients filed with a value `T` (the broker files its slot, so
/// fan-out reaches the queue without a second lookup).
#[derive(Debug)]
pub struct FilterIndex<T> {
    exact: HashMap<Box<str>, Vec<(ClientId, T)>>,
    prefix: HashMap<Box<str>, Vec<(ClientId, T)>>,
    residual: Vec<(ClientId, T)>,
    fields: HashMap<Box<str>, Field<T>>,
}

/// The clients filed under one payload path, by key.
#[derive(Debug)]
struct Field<T> {
    probe: Arc<PathProbe>,
    by_key: HashMap<ValueKey, Vec<(ClientId, T)>>,
}

impl<T> Default for FilterIndex<T> {
    fn default() -> Self {
        Self { exact: HashMap::new(), prefix: HashMap::new(), residual: Vec::new(), fields: HashMap::new() }
    }
}

/// A candidate: the client, its value, and whether its type is already known
/// to match (found under the event's exact name).
pub type Candidate<'a, T> = (ClientId, &'a T, bool);

enum Key<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Residual,
    Field(&'a str, &'a ValueKey, &'a Arc<PathProbe>),
}

fn keys(filter: &Filter) -> Vec<Key<'_>> {
    if let Some(eq) = filter.payload_equality() {
        return eq.keys.iter().map(|k| Key::Field(&eq.path, k, &eq.probe)).collect();
    }
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
                Key::Field(path, k, probe) => self
                    .fields
                    .entry(path.into())
                    .or_insert_with(|| Field { probe: probe.clone(), by_key: HashMap::new() })
                    .by_key
                    .entry(k.clone())
                    .or_default(),
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
                Key::Field(path, k, _) => {
                    if let Some(field) = self.fields.get_mut(path) {
                        if let Some(list) = field.by_key.get_mut(k) {
                            remove_from(list, id);
                            if list.is_empty() {
                                field.by_key.remove(k);
                            }
                        }
                        if field.by_key.is_empty() {
                            self.fields.remove(path);
                        }
                    }
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

    /// Writes into `out` (cleared first) every client that could match
    /// `event`, each once, ascending by id.
    pub fn candidates<'a>(&'a self, event: &MatchInput<'_>, out: &mut Vec<Candidate<'a, T>>) {
        out.clear();
        let event_type = event.body().event_type.as_str();
        out.extend(self.residual.iter().map(|(id, v)| (*id, v, false)));
        if !self.fields.is_empty()
            && let Some(payload) = event.payload()
        {
            for field in self.fields.values() {
                match field.probe.keys(payload) {
                    Some(keys) => {
                        for key in &keys {
                            if let Some(list) = field.by_key.get(key) {
                                out.extend(list.iter().map(|(id, v)| (*id, v, false)));
                            }
                        }
                    }
                    // Unreadable: any rule on the field might match.
                    None => out.extend(field.by_key.values().flatten().map(|(id, v)| (*id, v, false))),
                }
            }
        }
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
        self.exact.is_empty() && self.prefix.is_empty() && self.residual.is_empty() && self.fields.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::filter::FilterLimits;
    use tidings_protocol::event::{EventBody, Visibility};

    fn f(types: &[&str]) -> Filter {
        Filter::from_parts(&types.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &[], &[], FilterLimits::default()).unwrap()
    }

    fn ruled(types: &[&str], rule: Value) -> Filter {
        f(types).with_payload(&rule, FilterLimits::default()).unwrap()
    }

    fn ev(name: &str, payload: Value) -> EventBody {
        EventBody {
            event_type: name.into(),
            reference: None,
            agent: None,
            session_id: None,
            occurred_at: String::new(),
            payload,
            links: vec![],
            visibility: Visibility::Public,
            traceparent: None,
            tracestate: None,
        }
    }

    fn ids<T: Clone>(index: &FilterIndex<T>, event: &EventBody) -> Vec<u64> {
        let mut out = Vec::new();
        index.candidates(&MatchInput::new(event), &mut out);
        out.iter().map(|c| c.0).collect()
    }

    #[test]
    fn narrows_by_exact_name_prefix_and_residual() {
        let mut index = FilterIndex::<()>::default();
        let filters =
            [f(&["signal.upvote.recorded"]), f(&["link.*.added"]), f(&["**.recorded"]), f(&[]), f(&["hypothesis.*", "signal.**"])];
        for (i, filter) in filters.iter().enumerate() {
            index.insert(i as u64, filter, ());
        }
        let upvote = ev("signal.upvote.recorded", Value::Null);
        let mut out = Vec::new();
        index.candidates(&MatchInput::new(&upvote), &mut out);
        let got: Vec<(u64, bool)> = out.iter().map(|(id, _, typed)| (*id, *typed)).collect();
        assert_eq!(got, vec![(0, true), (2, false), (3, false), (4, false)]);
        drop(out);
        assert_eq!(ids(&index, &ev("link.cites.added", Value::Null)), vec![1, 2, 3]);
        assert_eq!(ids(&index, &ev("comment.posted", Value::Null)), vec![2, 3]);
        // A client filed under an exact name and a prefix keeps "type known".
        let both = f(&["signal.upvote.recorded", "signal.*.recorded"]);
        index.insert(9, &both, ());
        let mut out = Vec::new();
        index.candidates(&MatchInput::new(&upvote), &mut out);
        assert!(out.iter().any(|c| c.0 == 9 && c.2));
        drop(out);
        index.remove(9, &both);
        for (i, filter) in filters.iter().enumerate() {
            index.remove(i as u64, filter);
        }
        assert!(index.is_empty());
    }

    #[test]
    fn clients_told_apart_by_a_field_are_looked_up_by_its_value() {
        let mut index = FilterIndex::<()>::default();
        let users: Vec<Filter> =
            (0..100).map(|i| ruled(&["chat.posted"], json!({"==": [{"var": "room.user"}, format!("u{i}")]}))).collect();
        for (i, filter) in users.iter().enumerate() {
            index.insert(i as u64, filter, ());
        }
        // In a conjunction, either order, strict or loose.
        let shard = ruled(&[], json!({"and": [{">": [{"var": "w"}, 1]}, {"===": [3, {"var": "shard"}]}]}));
        index.insert(200, &shard, ());
        let typed = f(&["chat.*"]);
        index.insert(300, &typed, ());
        assert_eq!(ids(&index, &ev("chat.posted", json!({"room": {"user": "u42"}, "shard": 3}))), vec![42, 200, 300]);
        assert_eq!(ids(&index, &ev("chat.posted", json!({"room": {"user": "nobody"}}))), vec![300]);
        // A loose equality's coercions find their clients: 3 == "3".
        assert_eq!(ids(&index, &ev("other", json!({"shard": "3"}))), vec![200]);
        // A rule without an indexable equality stays filed by type.
        let range = ruled(&["chat.posted"], json!({">": [{"var": "w"}, 1]}));
        index.insert(400, &range, ());
        assert_eq!(ids(&index, &ev("chat.posted", json!({}))), vec![300, 400]);
        for (i, filter) in users.iter().enumerate() {
            index.remove(i as u64, filter);
        }
        index.remove(200, &shard);
        index.remove(300, &typed);
        index.remove(400, &range);
        assert!(index.is_empty());
    }

    fn scalar() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-2i64..3).prop_map(|n| json!(n)),
            proptest::sample::select(vec![0.0f64, -0.0, 1.0, 1.5, -1.0, 1e300]).prop_map(|n| json!(n)),
            proptest::sample::select(vec!["", "0", "1", "-0", "1.0", "1.5", "true", "false", "inf", "NaN", " 1", "a", "1e0", "null"])
                .prop_map(|s| json!(s)),
        ]
    }

    fn any_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        prop_oneof![
            4 => scalar(),
            1 => scalar().prop_map(|v| json!([v])),
            1 => scalar().prop_map(|v| json!({"y": v})),
        ]
    }

    proptest::proptest! {
        // Enough cases that every pair of coercible scalars comes up.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

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
            let body = ev(&name.join("."), Value::Null);
            if filter.matches(&body) {
                proptest::prop_assert_eq!(ids(&index, &body), vec![7]);
            }
        }

        /// Filed by a field equality, a client is a candidate for every
        /// event its rule is true for, under the evaluator's own coercions.
        #[test]
        fn never_misses_a_field_match(
            constant in scalar(),
            x in any_value(),
            path in proptest::sample::select(vec!["x", "x.y", "x.0", "z"]),
            strict in proptest::bool::ANY,
            reversed in proptest::bool::ANY,
            conjunct in proptest::bool::ANY,
        ) {
            let op = if strict { "===" } else { "==" };
            let var = json!({"var": path});
            let mut rule = if reversed { json!({op: [constant, var]}) } else { json!({op: [var, constant]}) };
            if conjunct {
                rule = json!({"and": [true, rule]});
            }
            let filter = ruled(&[], rule);
            proptest::prop_assert!(filter.payload_equality().is_some());
            let mut index = FilterIndex::default();
            index.insert(7, &filter, ());
            let body = ev("e", json!({"x": x}));
            if filter.matches(&body) {
                proptest::prop_assert_eq!(ids(&index, &body), vec![7]);
            }
        }
    }
}
