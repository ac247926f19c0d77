//! The subscription filter (docs/streams.md): parsed and validated once when a
//! client subscribes, then evaluated by [`Filter::matches`], the one matcher
//! every delivery path uses (live SSE, replay, and later poll, WebSocket and
//! subscriptions). Pure: no I/O.
//!
//! Fields are AND-combined, values within a field OR-combined, and an empty
//! or absent field means "any".

pub mod payload;

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::Value;

pub use payload::{PayloadRule, RuleLimits};
use tidings_protocol::glob::Glob;

use tidings_protocol::event::EventBody;

/// Limits on what one filter may ask for; each is a setting.
#[derive(Debug, Clone, Copy)]
pub struct FilterLimits {
    /// Longest `filter=` JSON, in bytes.
    pub max_bytes: usize,
    /// Most entries in any one list (`types`, `agents`, `targets`).
    pub max_list: usize,
    /// Limits on the payload rule.
    pub rule: RuleLimits,
}

impl Default for FilterLimits {
    fn default() -> Self {
        Self { max_bytes: 16 * 1024, max_list: 256, rule: RuleLimits::default() }
    }
}

/// Why a filter is refused (`400 invalid_filter`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct FilterError(pub String);

/// A compiled filter.
#[derive(Debug, Clone)]
pub struct Filter {
    types: Vec<Glob>,
    /// Boxed, like the rule below: most filters have none, and every live
    /// client keeps its filter for its whole life.
    agents: Names,
    targets: Names,
    payload: Option<Box<PayloadRule>>,
    /// The caller's `subscribe` grants, when they restrict anything: an event
    /// must match one of them as well as the filter's own types.
    grants: Option<Vec<Glob>>,
    /// The highest visibility the caller may see.
    max_visibility: tidings_protocol::event::Visibility,
    /// Whose tree-subscription notifications the caller may see: `None`
    /// for every one (admins), else only those whose `subscriber` is this
    /// identity (notifications are private, and may bundle entities).
    notifications_for: Option<String>,
}

/// Names an event must match one of (an agent, a target); `None` when the
/// filter does not restrict by them.
type Names = Option<Box<HashSet<String>>>;

fn names(list: &[String]) -> Names {
    (!list.is_empty()).then(|| Box::new(list.iter().cloned().collect()))
}

/// The JSON form, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterJson {
    #[serde(default)]
    types: Option<Vec<String>>,
    #[serde(default)]
    agents: Option<Vec<String>>,
    #[serde(default)]
    targets: Option<Vec<String>>,
    #[serde(default)]
    payload: Option<Value>,
    /// Cursor fields belong to the request, not the match; accepted (and
    /// ignored here) so a client can send one object.
    #[serde(default, rename = "since")]
    _since: Option<serde::de::IgnoredAny>,
    #[serde(default, rename = "consumer_id")]
    _consumer_id: Option<serde::de::IgnoredAny>,
}

/// The query form as one JSON filter (what a durable consumer stores):
/// `filter=` if given, with the `types=`/`agents=`/`targets=` entries added
/// to its lists; `None` when the query has no filter at all.
pub fn query_json(q: &FilterQuery, limits: FilterLimits) -> Result<Option<String>, FilterError> {
    let mut map = match &q.filter {
        None if q.types.is_none() && q.agents.is_none() && q.targets.is_none() => return Ok(None),
        None => serde_json::Map::new(),
        Some(text) if text.len() > limits.max_bytes => {
            return Err(FilterError(format!("filter is {} bytes, at most {} are allowed", text.len(), limits.max_bytes)));
        }
        Some(text) => match serde_json::from_str(text).map_err(|e| FilterError(format!("filter is not valid JSON: {e}")))? {
            Value::Object(map) => map,
            list @ Value::Array(_) => serde_json::Map::from_iter([("types".to_owned(), list)]),
            _ => return Err(FilterError("filter must be a JSON object or a list of type patterns".into())),
        },
    };
    for (name, list) in [("types", &q.types), ("agents", &q.agents), ("targets", &q.targets)] {
        let json_count = map.get(name).and_then(Value::as_array).map_or(0, Vec::len);
        let query_count = list.as_deref().map_or(0, |l| l.split(',').count());
        for (count, form) in [(json_count, "filter="), (query_count, "the query")] {
            if count > limits.max_list {
                return Err(FilterError(format!("{name} has {count} entries in {form}, at most {} are allowed", limits.max_list)));
            }
        }
        let Some(list) = list else { continue };
        // ASCII spaces around entries are dropped (as the OpenAPI pattern
        // says); anything else is part of the entry.
        let entries = list.split(',').map(|p| Value::String(p.trim_ascii().to_owned()));
        match map.entry(name).or_insert(Value::Null) {
            Value::Array(existing) => existing.extend(entries),
            slot @ Value::Null => *slot = Value::Array(entries.collect()),
            _ => return Err(FilterError(format!("{name} must be a list of strings"))),
        }
    }
    Ok(Some(Value::Object(map).to_string()))
}

/// The filter fields a request may carry in its query string.
#[derive(Debug, Default, Clone, Deserialize)]
pub struct FilterQuery {
    /// URL-encoded JSON filter.
    pub filter: Option<String>,
    /// Comma list of type globs.
    pub types: Option<String>,
    /// Comma list of agent ids.
    pub agents: Option<String>,
    /// Comma list of references.
    pub targets: Option<String>,
}

impl FilterLimits {
    /// The limits of a filter merged from the query's two forms, each held
    /// to `self` on its own ([`query_json`]): lists may hold both, and the
    /// text is no longer what a client sent.
    pub fn merged(self) -> Self {
        Self { max_bytes: usize::MAX, max_list: 2 * self.max_list, ..self }
    }
}

impl Default for Filter {
    fn default() -> Self {
        Self {
            types: Vec::new(),
            agents: None,
            targets: None,
            payload: None,
            grants: None,
            max_visibility: tidings_protocol::event::Visibility::Admin,
            notifications_for: None,
        }
    }
}

impl Filter {
    /// A filter that matches every event.
    pub fn any() -> Self {
        Self::default()
    }

    /// Intersects this filter with what a caller may receive: its `subscribe`
    /// grants (`None`: every type; asking for `**` with a grant of
    /// `hypothesis.*` yields only `hypothesis.*`), its visibility, and the
    /// identity whose tree-subscription notifications it may see (`None`:
    /// all, for admins). Every delivery path applies this, through
    /// `auth::Identity::restrict`.
    pub fn restrict(
        mut self,
        grants: Option<Vec<Glob>>,
        max_visibility: tidings_protocol::event::Visibility,
        notifications_for: Option<String>,
    ) -> Self {
        self.grants = grants;
        self.max_visibility = max_visibility;
        self.notifications_for = notifications_for;
        self
    }

    /// The payload rule's budget, once, after one of its evaluations went
    /// over it (see [`PayloadRule::take_budget_notice`]).
    pub fn take_budget_notice(&self) -> Option<usize> {
        self.payload.as_ref()?.take_budget_notice()
    }

    /// Whether [`Self::take_budget_notice`] has a notice to give: nothing
    /// is written for the stream before it.
    pub fn budget_notice_due(&self) -> bool {
        self.payload.as_ref().is_some_and(|rule| rule.budget_notice_due())
    }

    /// Builds a filter from its parts, validating each.
    pub fn from_parts(types: &[String], agents: &[String], targets: &[String], limits: FilterLimits) -> Result<Self, FilterError> {
        for (field, list) in [("types", types), ("agents", agents), ("targets", targets)] {
            if list.len() > limits.max_list {
                return Err(FilterError(format!("{field} has {} entries, at most {} are allowed", list.len(), limits.max_list)));
            }
        }
        let types = types.iter().map(|t| Glob::new(t).map_err(|e| FilterError(format!("types: {e}")))).collect::<Result<Vec<_>, _>>()?;
        for (field, list) in [("agents", agents), ("targets", targets)] {
            if let Some(bad) = list.iter().find(|v| v.is_empty() || v.len() > tidings_protocol::event::MAX_FIELD_LEN) {
                return Err(FilterError(format!(
                    "{field}: entries must be 1 to {} bytes, got {} bytes",
                    tidings_protocol::event::MAX_FIELD_LEN,
                    bad.len()
                )));
            }
        }
        Ok(Self { types, agents: names(agents), targets: names(targets), ..Self::default() })
    }

    /// Adds a payload rule (validated and compiled here).
    pub fn with_payload(mut self, rule: &Value, limits: FilterLimits) -> Result<Self, FilterError> {
        self.payload = Some(Box::new(PayloadRule::compile(rule, limits.rule)?));
        Ok(self)
    }

    /// Parses the JSON form; a bare list `["a.*"]` means `{"types":["a.*"]}`.
    pub fn from_json(text: &str, limits: FilterLimits) -> Result<Self, FilterError> {
        if text.len() > limits.max_bytes {
            return Err(FilterError(format!("filter is {} bytes, at most {} are allowed", text.len(), limits.max_bytes)));
        }
        let value: Value = serde_json::from_str(text).map_err(|e| FilterError(format!("filter is not valid JSON: {e}")))?;
        let parsed: FilterJson = match value {
            Value::Array(_) => FilterJson {
                types: Some(string_list("types", value)?),
                agents: None,
                targets: None,
                payload: None,
                _since: None,
                _consumer_id: None,
            },
            Value::Object(_) => serde_json::from_value(value).map_err(|e| FilterError(format!("filter: {e}")))?,
            _ => return Err(FilterError("filter must be a JSON object or a list of type patterns".into())),
        };
        let filter = Self::from_parts(
            parsed.types.as_deref().unwrap_or_default(),
            parsed.agents.as_deref().unwrap_or_default(),
            parsed.targets.as_deref().unwrap_or_default(),
            limits,
        )?;
        match &parsed.payload {
            None | Some(Value::Null) => Ok(filter),
            Some(rule) => filter.with_payload(rule, limits),
        }
    }

    /// Parses the query-string form: either `filter=<json>` or the comma
    /// lists, or both: the comma lists add to the JSON filter's lists (each
    /// list is a set of alternatives), so `filter={"payload": ...}&types=a.*`
    /// combines a rule with a type pattern.
    pub fn from_query(q: &FilterQuery, limits: FilterLimits) -> Result<Self, FilterError> {
        match query_json(q, limits)? {
            Some(json) => Self::from_json(&json, limits.merged()),
            None => Ok(Self::default()),
        }
    }

    /// The type globs (empty: any type).
    pub fn types(&self) -> &[Glob] {
        &self.types
    }

    /// The field equality the payload rule requires, if the broker can
    /// index the filter by it ([`payload::Equality`]).
    pub fn payload_equality(&self) -> Option<&payload::Equality> {
        self.payload.as_ref()?.equality()
    }

    /// Whether `event` passes every field of this filter.
    pub fn matches(&self, event: &EventBody) -> bool {
        self.matches_input(&MatchInput::new(event))
    }

    /// Whether the event passes; the form the broker and replay use, so that
    /// an event checked against many filters prepares its payload once.
    pub fn matches_input(&self, input: &MatchInput<'_>) -> bool {
        self.matches_after_types(input, false)
    }

    /// Like [`Self::matches_input`]; `type_matched` says the caller already
    /// knows a type glob matches (the broker's index found the client under
    /// the event's exact name), so that check is skipped.
    pub fn matches_after_types(&self, input: &MatchInput<'_>, type_matched: bool) -> bool {
        let event = input.body;
        if event.visibility > self.max_visibility {
            return false;
        }
        if let Some(identity) = &self.notifications_for
            && (event.event_type == tidings_protocol::event::names::SUBSCRIPTION_NOTIFICATION
                || event.event_type == tidings_protocol::event::names::SUBSCRIPTION_HISTORY_LOST)
            && event.payload.get("subscriber").and_then(|s| s.as_str()) != Some(identity.as_str())
        {
            return false;
        }
        if let Some(grants) = &self.grants
            && !grants.iter().any(|g| g.matches(&event.event_type))
        {
            return false;
        }
        if !type_matched && !self.types.is_empty() && !self.types.iter().any(|g| g.matches(&event.event_type)) {
            return false;
        }
        if let Some(agents) = &self.agents
            && !event.agent.as_ref().is_some_and(|a| agents.contains(&a.id))
        {
            return false;
        }
        if let Some(targets) = &self.targets
            && !event.references().any(|r| targets.contains(r))
        {
            return false;
        }
        // The rule last: it is the most expensive check.
        self.payload.as_ref().is_none_or(|rule| input.payload().is_some_and(|data| rule.matches_prepared(data)))
    }
}

/// One event being matched against many filters: the body, and its payload
/// converted for rule evaluation on first use, then shared.
#[derive(Debug)]
pub struct MatchInput<'a> {
    body: &'a EventBody,
    payload: std::cell::OnceCell<Option<payload::Prepared>>,
}

impl<'a> MatchInput<'a> {
    /// Wraps an event body.
    pub fn new(body: &'a EventBody) -> Self {
        Self { body, payload: std::cell::OnceCell::new() }
    }

    /// The event.
    pub fn body(&self) -> &'a EventBody {
        self.body
    }

    /// The payload in the rule evaluator's form, converted on first use.
    pub fn payload(&self) -> Option<&payload::Prepared> {
        self.payload.get_or_init(|| payload::prepare(&self.body.payload)).as_ref()
    }
}

fn string_list(field: &str, value: Value) -> Result<Vec<String>, FilterError> {
    serde_json::from_value(value).map_err(|_| FilterError(format!("{field} must be a list of strings")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidings_protocol::event::{Agent, Link, Visibility, names};

    /// Every live client keeps its filter for its whole life: its size is
    /// carried by every idle stream and device, so it may not grow
    /// unnoticed (264 bytes with the agents, the targets and the rule
    /// inline, which most filters do not have).
    #[test]
    fn a_filter_stays_small() {
        let size = std::mem::size_of::<Filter>();
        assert!(size <= 112, "a filter takes {size} bytes");
    }

    fn ev(t: &str, agent: Option<&str>, r: Option<&str>, links: &[&str]) -> EventBody {
        EventBody {
            event_type: t.into(),
            reference: r.map(Into::into),
            agent: agent.map(|a| Agent { id: a.into(), kind: None }),
            session_id: None,
            occurred_at: String::new(),
            payload: Value::Null,
            links: links.iter().map(|l| Link { rel: "target".into(), reference: (*l).into() }).collect(),
            visibility: Visibility::Public,
            traceparent: None,
            tracestate: None,
        }
    }

    #[test]
    fn fields_and_combine_values_or_combine() {
        let f = Filter::from_json(r#"{"types":["hypothesis.*"],"agents":["persona:mendel"]}"#, FilterLimits::default()).unwrap();
        assert!(f.matches(&ev("hypothesis.created", Some("persona:mendel"), None, &[])));
        assert!(!f.matches(&ev("hypothesis.created", Some("persona:darwin"), None, &[])));
        assert!(!f.matches(&ev("comment.posted", Some("persona:mendel"), None, &[])));
        let t = Filter::from_json(r#"{"targets":["paper:p-123"]}"#, FilterLimits::default()).unwrap();
        assert!(t.matches(&ev("link.cites.added", None, None, &["paper:p-123"])));
        assert!(t.matches(&ev("paper.archived", None, Some("paper:p-123"), &[])));
        assert!(!t.matches(&ev("link.cites.added", None, None, &["paper:p-9"])));
    }

    #[test]
    fn a_caller_not_an_admin_sees_only_its_own_notifications_and_no_peer_notice() {
        let everything = || Filter::from_json(r#"{"types":["**"]}"#, FilterLimits::default()).unwrap();
        let mine = everything().restrict(None, Visibility::Public, Some("alice".into()));
        let admin = everything().restrict(None, Visibility::Public, None);
        let mut own = ev(names::SUBSCRIPTION_NOTIFICATION, None, Some("system/inbox/a"), &[]);
        own.payload = serde_json::json!({"subscriber": "alice"});
        let mut other = own.clone();
        other.payload = serde_json::json!({"subscriber": "bob"});
        // Delivered by a peer: no subscriber, for admins alone.
        let notice = ev(names::SUBSCRIPTION_HISTORY_LOST, Some("sha256:peer"), Some("system/inbox/a"), &[]);
        let peer = ev(names::SUBSCRIPTION_NOTIFICATION, Some("sha256:peer"), Some("system/inbox/a"), &[]);
        assert!(mine.matches(&own) && !mine.matches(&other) && !mine.matches(&notice) && !mine.matches(&peer));
        assert!([own, other, notice, peer].iter().all(|e| admin.matches(e)));
    }

    #[test]
    fn bare_list_and_query_forms_are_equivalent() {
        let a = Filter::from_json(r#"["a.*"]"#, FilterLimits::default()).unwrap();
        let b = Filter::from_query(&FilterQuery { types: Some("a.*".into()), ..Default::default() }, FilterLimits::default()).unwrap();
        assert_eq!(a.types(), b.types());
    }

    #[test]
    fn cursor_fields_ride_along() {
        let f = Filter::from_json(r#"{"types":["a.*"],"since":5,"consumer_id":"c-1"}"#, FilterLimits::default()).unwrap();
        assert_eq!(f.types().len(), 1);
    }

    #[test]
    fn bad_filters_are_refused() {
        let l = FilterLimits::default();
        assert!(Filter::from_json(r#"{"types":"a.*"}"#, l).is_err());
        assert!(Filter::from_json(r#"{"types":[""]}"#, l).is_err());
        assert!(Filter::from_json(r#"{"types":["a..b"]}"#, l).is_err());
        assert!(Filter::from_json(r#"{"typos":["a.b"]}"#, l).is_err());
        assert!(Filter::from_json(r#"{"types":"#, l).is_err());
        assert!(Filter::from_json(&format!(r#"{{"agents":["{}"]}}"#, "x".repeat(20000)), l).is_err());
    }
}
