//! What one evaluation may spend: the nodes inside loop bodies and the
//! accumulator reads that scale a rule's work with the event, and the
//! budget stop (the arena refusing to grow) kept out of the log.

use serde_json::Value;

use super::EVALUATING;
use super::validate::LOOPS;

/// How many nodes of `value` sit inside a loop's body.
pub(super) fn loop_nodes(value: &Value, in_loop: bool) -> usize {
    let here = usize::from(in_loop);
    match value {
        Value::Array(items) => here + items.iter().map(|i| loop_nodes(i, in_loop)).sum::<usize>(),
        Value::Object(map) => match map.iter().next() {
            Some((op, Value::Array(args))) if LOOPS.contains(&op.as_str()) => {
                here + args.iter().enumerate().map(|(i, a)| loop_nodes(a, in_loop || i == 1)).sum::<usize>()
            }
            Some((_, args)) => here + loop_nodes(args, in_loop),
            None => here,
        },
        _ => here,
    }
}

/// How many `{"var": "accumulator…"}` sit in the bodies of `reduce`s whose
/// initial value is not a literal.
pub(super) fn accumulator_reads(value: &Value) -> usize {
    fn reads(value: &Value) -> usize {
        match value {
            Value::Array(items) => items.iter().map(reads).sum(),
            Value::Object(map) => match map.iter().next() {
                Some((op, Value::String(path))) if op == "var" && path.starts_with("accumulator") => 1,
                Some((op, Value::Array(args)))
                    if op == "var" && args.first().and_then(Value::as_str).is_some_and(|p| p.starts_with("accumulator")) =>
                {
                    1
                }
                Some((_, args)) => reads(args),
                None => 0,
            },
            _ => 0,
        }
    }
    match value {
        Value::Array(items) => items.iter().map(accumulator_reads).sum(),
        Value::Object(map) => match map.iter().next() {
            Some((op, Value::Array(args))) if op == "reduce" => {
                let body = args.get(1).map_or(0, reads);
                let literal = args.get(2).is_none_or(|initial| !initial.is_object() && !initial.is_array());
                (if literal { 0 } else { body }) + args.iter().map(accumulator_reads).sum::<usize>()
            }
            Some((_, args)) => accumulator_reads(args),
            None => 0,
        },
        _ => 0,
    }
}

/// Whether a panic is the arena refusing to grow past the budget (bumpalo
/// says "out of memory" for its own allocations, "encountered allocation
/// error" for a growing collection's).
pub(super) fn is_budget_stop(payload: &(dyn std::any::Any + Send)) -> bool {
    let message = payload.downcast_ref::<&str>().copied().or_else(|| payload.downcast_ref::<String>().map(String::as_str));
    message.is_some_and(|m| m == "out of memory" || m.starts_with("encountered allocation error"))
}

/// Installs (once) a panic hook that keeps budget stops out of the log and
/// passes every other panic to the hook that was there.
pub(super) fn quiet_budget_stops() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let budget_stop = EVALUATING.with(|e| e.get()) && is_budget_stop(info.payload());
            if !budget_stop {
                previous(info);
            }
        }));
    });
}
