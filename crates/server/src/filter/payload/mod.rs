//! The `payload` part of a filter: a JsonLogic rule over `event.payload`,
//! validated and compiled once when a client subscribes, evaluated to
//! truthiness per the JsonLogic spec.
//!
//! Evaluation is `datalogic-rs` (pinned to 5.4.0, the newest release that
//! builds on this toolchain). Why it over `jsonlogic-rs`: it compiles a rule
//! once into a tree that is evaluated many times without re-parsing (a
//! subscriber's rule runs against every candidate event), it is actively
//! maintained, and it ships the jsonlogic.com reference cases as its
//! compatibility suite; `jsonlogic-rs` re-interprets the JSON rule on every
//! call and has had no release in years. Our test runs the same reference
//! cases against this module (see `crates/server/tests/data/jsonlogic-compatible.json`).
//!
//! Validation is ours and stricter than either crate: every operator must be
//! one of jsonlogic.com's (except `log`, which would let a client write to
//! the server's output), objects must have exactly one key, each operator's
//! argument count must be within its documented arity, and the rule's depth
//! and size are bounded. A rule that fails any of these is refused with a
//! message naming the offending part; it never silently matches everything.
//!
//! This file compiles and evaluates a rule; beside it, one file per idea:
//! `validate` (operators, arity, limits), `budget` (what one evaluation may
//! spend) and `index` (the equality the broker files a client under).

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use datalogic_rs::{Engine, Logic, ParsedData};
use serde_json::Value;

use super::FilterError;

mod budget;
mod index;
mod validate;

use budget::{accumulator_reads, is_budget_stop, loop_nodes, quiet_budget_stops};
use index::equality;
pub use index::{Equality, PathProbe, ValueKey, value_keys};
pub(crate) use validate::OPERATORS;
pub use validate::RuleLimits;
use validate::validate;

/// A validated, compiled rule.
#[derive(Clone)]
pub struct PayloadRule {
    source: Value,
    logic: Arc<Logic>,
    /// The equality this rule requires of one payload field, if it has one
    /// the broker can index by ([`Equality`]).
    equality: Option<Arc<Equality>>,
    /// Most bytes one evaluation may build, and most loop steps it may
    /// take ([`RuleLimits::budget`]).
    budget: usize,
    /// Nodes inside loop bodies: each runs once per step.
    loop_nodes: usize,
    /// Reads of the accumulator in the bodies of `reduce`s that start from
    /// something else than a literal (it may be as large as the event).
    accumulator_reads: usize,
    /// Whether an evaluation of this rule (one client's) went over the
    /// budget yet: logged once, counted every time.
    over_budget: Arc<std::sync::atomic::AtomicBool>,
    /// Whether the client was told (`system.filter_budget_exceeded`).
    told: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for PayloadRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PayloadRule({})", self.source)
    }
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(Engine::new)
}

thread_local! {
    // One evaluation arena per thread, reset after each evaluation, so
    // matching allocates nothing once warmed up.
    static ARENA: RefCell<datalogic_rs::bumpalo::Bump> = RefCell::new(datalogic_rs::bumpalo::Bump::new());
    // Set while this thread evaluates a rule: the arena's refusal to grow
    // past the budget unwinds out of the evaluator (bumpalo panics with
    // "out of memory"), which is a budget stop, not a fault to report.
    static EVALUATING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl PayloadRule {
    /// Validates and compiles `rule`.
    pub fn compile(rule: &Value, limits: RuleLimits) -> Result<Self, FilterError> {
        let mut nodes = 0;
        validate(rule, "payload", 1, limits, &mut nodes, false)?;
        let logic = engine().compile(rule).map_err(|e| FilterError(format!("payload: {e}")))?;
        Ok(Self {
            source: rule.clone(),
            logic: Arc::new(logic),
            equality: equality(rule).map(Arc::new),
            budget: limits.budget.max(4096),
            loop_nodes: loop_nodes(rule, false),
            accumulator_reads: accumulator_reads(rule),
            over_budget: Arc::default(),
            told: Arc::default(),
        })
    }

    /// The field equality this rule requires, if the broker can index it.
    pub fn equality(&self) -> Option<&Equality> {
        self.equality.as_deref()
    }

    /// The rule as given.
    pub fn source(&self) -> &Value {
        &self.source
    }

    /// Evaluates the rule over `payload` and applies JsonLogic truthiness. An
    /// evaluation error (a division by a string, say) does not match.
    pub fn matches(&self, payload: &Value) -> bool {
        prepare(payload).is_some_and(|data| self.matches_prepared(&data))
    }

    /// Like [`Self::matches`] over a payload prepared once with [`prepare`],
    /// so that one event checked against many rules is converted once.
    ///
    /// The evaluation builds what it builds (strings, arrays) in an arena
    /// bounded by the budget: past it the arena refuses to grow, the
    /// evaluation stops there, and the event does not match. With loops
    /// never nested (see [`validate`]), the work an evaluation does is
    /// bounded by the rule's size times the event's, plus what it builds.
    pub fn matches_prepared(&self, prepared: &Prepared) -> bool {
        // A loop takes at most one step per two bytes of the event (an
        // element and its comma), each step evaluating its body: a rule
        // whose loops could take more steps than the budget does not run.
        // A `reduce` that starts from the event's data may read an
        // accumulator as large as the event at every step.
        let steps = prepared.bytes / 2 + 1;
        let cost = self.loop_nodes.saturating_mul(steps).saturating_add(self.accumulator_reads.saturating_mul(steps).saturating_mul(steps));
        if cost > self.budget {
            return self.over_budget();
        }
        let payload = &prepared.data;
        quiet_budget_stops();
        let outcome = ARENA.with(|arena| {
            let mut arena = arena.borrow_mut();
            arena.reset();
            arena.set_allocation_limit(Some(self.budget));
            EVALUATING.with(|e| e.set(true));
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                engine().evaluate(&self.logic, payload, &arena).map(|v| engine().truthy(v)).unwrap_or(false)
            }));
            EVALUATING.with(|e| e.set(false));
            arena.set_allocation_limit(None);
            arena.reset();
            outcome
        });
        match outcome {
            Ok(matched) => matched,
            Err(panic) if is_budget_stop(panic.as_ref()) => self.over_budget(),
            Err(_) => {
                // Not the budget: the evaluator failed (reported by the
                // panic hook); the event does not match this rule.
                tracing::error!(rule = %self.source, "the payload rule evaluator panicked; the event does not match");
                false
            }
        }
    }

    /// Counts (and logs once per rule) an evaluation over the budget: no match.
    fn over_budget(&self) -> bool {
        crate::metrics::rule_budget_exceeded();
        if !self.over_budget.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(budget = self.budget, rule = %self.source, "a payload rule went over its evaluation budget; the events it does so on do not match");
        }
        false
    }

    /// Whether an evaluation of this rule went over its budget.
    pub fn went_over_budget(&self) -> bool {
        self.over_budget.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether [`Self::take_budget_notice`] has a notice to give.
    pub fn budget_notice_due(&self) -> bool {
        self.went_over_budget() && !self.told.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The budget, once, the first time this is asked after an evaluation
    /// went over it: what the client is told.
    pub fn take_budget_notice(&self) -> Option<usize> {
        (self.went_over_budget() && !self.told.swap(true, std::sync::atomic::Ordering::Relaxed)).then_some(self.budget)
    }

    /// Evaluates the rule over `data` and returns the JSON result (for the
    /// reference tests and for operators debugging a rule).
    pub fn evaluate(&self, data: &Value) -> Result<Value, FilterError> {
        let mut session = engine().session();
        let text = session.eval_str(&self.logic, data).map_err(|e| FilterError(e.to_string()))?;
        serde_json::from_str(&text).map_err(|e| FilterError(e.to_string()))
    }
}

/// An event's payload in the evaluator's form, with its size in bytes
/// (what bounds the steps a rule's loops take over it).
pub struct Prepared {
    data: ParsedData,
    bytes: usize,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Prepared({} bytes)", self.bytes)
    }
}

/// Converts a payload into the evaluator's form, once per event.
pub fn prepare(payload: &Value) -> Option<Prepared> {
    let text = payload.to_string();
    Some(Prepared { bytes: text.len(), data: ParsedData::from_json(&text).ok()? })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rule(v: Value) -> Result<PayloadRule, FilterError> {
        PayloadRule::compile(&v, RuleLimits::default())
    }

    #[test]
    fn spec_example_and_truthiness() {
        let r = rule(json!({">=": [{"var": "weight"}, 5]})).unwrap();
        assert!(r.matches(&json!({"weight": 5})));
        assert!(r.matches(&json!({"weight": 9.5})));
        assert!(!r.matches(&json!({"weight": 4})));
        assert!(!r.matches(&json!({})));
        // Truthiness: empty arrays and strings, 0 and null are false.
        assert!(!rule(json!({"var": "xs"})).unwrap().matches(&json!({"xs": []})));
        assert!(rule(json!({"var": "xs"})).unwrap().matches(&json!({"xs": [0]})));
        assert!(!rule(json!({"var": "s"})).unwrap().matches(&json!({"s": ""})));
        assert!(rule(json!({"var": "s"})).unwrap().matches(&json!({"s": "0"})));
        assert!(rule(json!({"in": ["x", {"var": "tags"}]})).unwrap().matches(&json!({"tags": ["x", "y"]})));
    }

    /// One client's rule cannot spend what it likes on an event: building
    /// past the budget stops the evaluation (no match, counted), a rule
    /// within it on the same event is unaffected, and nested loops are
    /// refused when the rule is compiled.
    #[test]
    fn an_evaluation_stops_at_its_budget() {
        // The rule of the review: 500 copies of a 60 KB field (30 MB).
        let big = "x".repeat(60_000);
        let payload = json!({"s": big, "n": 3});
        let heavy = json!({"==": [{"cat": vec![json!({"var": "s"}); 500]}, "never"]});
        let limits = RuleLimits { max_nodes: 2048, ..RuleLimits::default() };
        let heavy = PayloadRule::compile(&heavy, limits).unwrap();
        let data = prepare(&payload).unwrap();
        assert!(!heavy.matches_prepared(&data) && heavy.went_over_budget());
        // A copy the budget allows still works, on the same thread (the
        // arena is whole again) and the same event.
        let fits = PayloadRule::compile(&json!({"==": [{"cat": [{"var": "s"}, "!"]}, format!("{big}!")]}), limits).unwrap();
        assert!(fits.matches_prepared(&data) && !fits.went_over_budget());
        // An accumulator that doubles each step stops at the budget too.
        let doubling = json!({"reduce": [{"var": "xs"}, {"cat": [{"var": "accumulator"}, {"var": "accumulator"}]}, "ab"]});
        let doubling = PayloadRule::compile(&doubling, limits).unwrap();
        assert!(!doubling.matches(&json!({"xs": vec![0; 64]})) && doubling.went_over_budget());
        // A reduce that starts from the event's data and reads its
        // accumulator at every step does not run on a large event.
        let scan = json!({"reduce": [{"var": "xs"}, {"if": [{"in": [{"var": "current"}, {"var": "accumulator"}]}, {"var": "accumulator"}, {"var": "accumulator"}]}, {"var": "xs"}]});
        let scan = PayloadRule::compile(&scan, limits).unwrap();
        assert!(!scan.matches(&json!({"xs": (0..30_000).collect::<Vec<_>>()})) && scan.went_over_budget());
        let sum = PayloadRule::compile(
            &json!({"==": [{"reduce": [{"var": "xs"}, {"+": [{"var": "current"}, {"var": "accumulator"}]}, {"var": "from"}]}, 16]}),
            limits,
        )
        .unwrap();
        assert!(sum.matches(&json!({"xs": [1, 2, 3], "from": 10})), "a small event runs");
        // Loops do not nest.
        // Loops whose steps over this event could pass the budget do not run.
        let many = json!({"and": vec![json!({"some": [{"var": "xs"}, {"==": [{"var": ""}, 1]}]}); 100]});
        let many = PayloadRule::compile(&many, limits).unwrap();
        assert!(!many.matches(&json!({"xs": vec![1; 30_000]})) && many.went_over_budget());
        let nested = json!({"some": [{"var": "xs"}, {"some": [{"var": "xs"}, {"==": [1, 2]}]}]});
        assert!(PayloadRule::compile(&nested, limits).unwrap_err().0.contains("inside another loop's body"));
        let sequential =
            json!({"and": [{"some": [{"var": "xs"}, {"==": [{"var": ""}, 1]}]}, {"all": [{"var": "xs"}, {">": [{"var": ""}, 0]}]}]});
        assert!(PayloadRule::compile(&sequential, limits).unwrap().matches(&json!({"xs": [1, 2]})));
    }

    #[test]
    fn refusals_name_the_offending_part() {
        let e = rule(json!({"and": [{"==": [1, 1]}, {"bogus": [1]}]})).unwrap_err().0;
        assert!(e.contains("payload.and[1]") && e.contains("unknown operator \"bogus\""), "{e}");
        let e = rule(json!({">=": [1]})).unwrap_err().0;
        assert!(e.contains("\">=\" takes 2 arguments, got 1"), "{e}");
        assert!(rule(json!({"log": "x"})).unwrap_err().0.contains("unknown operator \"log\""));
        assert!(rule(json!({"==": [1, 1], "!=": [1, 2]})).unwrap_err().0.contains("exactly one operator key"));
        let deep = (0..40).fold(json!(true), |acc, _| json!({"!!": [acc]}));
        assert!(rule(deep).unwrap_err().0.contains("nested deeper"));
        let wide = json!({"and": vec![json!({"==": [1, 1]}); 600]});
        assert!(rule(wide).unwrap_err().0.contains("nodes"));
    }

    /// The jsonlogic.com reference cases. Every case whose rule passes our
    /// validation must evaluate to the reference result; the cases our
    /// stricter validation refuses are listed, so a change in either shows.
    #[test]
    fn reference_cases() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/jsonlogic-compatible.json")).unwrap();
        let cases: Vec<Value> = serde_json::from_str(&text).unwrap();
        let (mut passed, mut refused, mut failed) = (0, Vec::new(), Vec::new());
        for case in cases.iter().filter(|c| c.is_object()) {
            let description = case["description"].as_str().unwrap_or_default();
            let data = case.get("data").cloned().unwrap_or(Value::Null);
            match rule(case["rule"].clone()) {
                Err(e) => refused.push(format!("{description}: {e}")),
                Ok(r) => match (r.evaluate(&data), case.get("result")) {
                    (Ok(got), Some(want)) if same(&got, want) => passed += 1,
                    (Err(_), None) if case.get("error").is_some() => passed += 1,
                    (got, want) => failed.push(format!("{description}: got {got:?}, want {want:?}")),
                },
            }
        }
        println!("reference cases: {passed} passed, {} refused at validation, {} failed", refused.len(), failed.len());
        for r in &refused {
            println!("refused: {r}");
        }
        assert!(failed.is_empty(), "reference cases that evaluate differently:\n{}", failed.join("\n"));
        assert!(refused.is_empty(), "no reference case is refused by validation");
        assert_eq!(passed, 278, "every reference case runs and passes");
    }

    /// JSON equality with numbers compared by value (`1` equals `1.0`).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
            (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w))),
            _ => a == b,
        }
    }
}
