//! What a payload rule may be: jsonlogic.com's operators and their arity
//! ([`OPERATORS`]), the limits on depth, size and budget ([`RuleLimits`]),
//! and the walk that refuses anything else, naming the offending part.

use serde_json::Value;

use super::super::FilterError;

/// Operators and their arity (min, max arguments; `None` = unbounded).
pub(crate) const OPERATORS: &[(&str, usize, Option<usize>)] = &[
    ("var", 0, Some(2)),
    ("missing", 0, None),
    ("missing_some", 2, Some(2)),
    ("if", 0, None),
    ("?:", 0, None),
    ("==", 2, Some(2)),
    ("===", 2, Some(2)),
    ("!=", 2, Some(2)),
    ("!==", 2, Some(2)),
    ("!", 1, Some(1)),
    ("!!", 1, Some(1)),
    ("or", 1, None),
    ("and", 1, None),
    (">", 2, Some(2)),
    (">=", 2, Some(2)),
    ("<", 2, Some(3)),
    ("<=", 2, Some(3)),
    ("max", 0, None),
    ("min", 0, None),
    ("+", 0, None),
    ("-", 1, Some(2)),
    ("*", 1, None),
    ("/", 2, Some(2)),
    ("%", 2, Some(2)),
    ("map", 2, Some(2)),
    ("filter", 2, Some(2)),
    ("reduce", 2, Some(3)),
    ("all", 2, Some(2)),
    ("none", 2, Some(2)),
    ("some", 2, Some(2)),
    ("merge", 0, None),
    ("in", 2, Some(2)),
    ("cat", 0, None),
    ("substr", 2, Some(3)),
];

/// Limits on a rule; each is a setting.
#[derive(Debug, Clone, Copy)]
pub struct RuleLimits {
    /// Deepest nesting of objects and arrays.
    pub max_depth: usize,
    /// Most nodes (objects, arrays and scalars) in the rule.
    pub max_nodes: usize,
    /// Most bytes one evaluation may build (`TIDINGS_RULE_BUDGET`): over
    /// it the event does not match, and it is counted.
    pub budget: usize,
}

impl Default for RuleLimits {
    fn default() -> Self {
        Self { max_depth: 32, max_nodes: 1024, budget: 1 << 20 }
    }
}

/// The iterating operators: their body runs once per element.
pub(super) const LOOPS: &[&str] = &["map", "filter", "reduce", "all", "some", "none"];

/// Walks the rule: operators known, one key per object, arity in range,
/// bounded depth and size. `at` names the current place for messages.
///
/// A loop (`map`, `filter`, `reduce`, `all`, `some`, `none`) may not sit in
/// another loop's body: nested, their work grows with the square of the
/// event (a rule of a few nodes could spend seconds on one large event).
pub(super) fn validate(
    value: &Value,
    at: &str,
    depth: usize,
    limits: RuleLimits,
    nodes: &mut usize,
    in_loop: bool,
) -> Result<(), FilterError> {
    *nodes += 1;
    if *nodes > limits.max_nodes {
        return Err(FilterError(format!("payload rule has more than {} nodes", limits.max_nodes)));
    }
    if depth > limits.max_depth {
        return Err(FilterError(format!("payload rule is nested deeper than {} levels (at {at})", limits.max_depth)));
    }
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                validate(item, &format!("{at}[{i}]"), depth + 1, limits, nodes, in_loop)?;
            }
            Ok(())
        }
        Value::Object(map) => {
            let mut keys = map.keys();
            let (Some(op), None) = (keys.next(), keys.next()) else {
                return Err(FilterError(format!("{at}: an operation is an object with exactly one operator key, got {} keys", map.len())));
            };
            let Some(&(_, min, max)) = OPERATORS.iter().find(|(name, _, _)| name == op) else {
                return Err(FilterError(format!("{at}: unknown operator {op:?}")));
            };
            let args = &map[op];
            let count = match args {
                Value::Array(a) => a.len(),
                _ => 1,
            };
            if count < min || max.is_some_and(|m| count > m) {
                let expected = match max {
                    Some(m) if m == min => format!("{min}"),
                    Some(m) => format!("{min} to {m}"),
                    None => format!("at least {min}"),
                };
                return Err(FilterError(format!("{at}: operator {op:?} takes {expected} arguments, got {count}")));
            }
            if LOOPS.contains(&op.as_str()) {
                if in_loop {
                    return Err(FilterError(format!(
                        "{at}: {op:?} inside another loop's body is refused (its cost grows with the square of the event)"
                    )));
                }
                // The body (the second argument) runs per element; the
                // list and `reduce`'s initial value run once.
                let Value::Array(items) = args else { return validate(args, &format!("{at}.{op}"), depth + 1, limits, nodes, false) };
                *nodes += 1;
                for (i, item) in items.iter().enumerate() {
                    validate(item, &format!("{at}.{op}[{i}]"), depth + 2, limits, nodes, i == 1)?;
                }
                return Ok(());
            }
            validate(args, &format!("{at}.{op}"), depth + 1, limits, nodes, in_loop)
        }
        _ => Ok(()),
    }
}
