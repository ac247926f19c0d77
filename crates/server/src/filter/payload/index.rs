//! What lets the broker index a rule: the equality it requires of one
//! payload field ([`Equality`]), the keys that class JSON scalars the way
//! JsonLogic's `==` coerces them ([`ValueKey`], [`value_keys`]), and the
//! probe that reads that field once per event ([`PathProbe`]).

use std::sync::Arc;

use datalogic_rs::{DataValue, Logic};
use serde_json::Value;

use super::{ARENA, Prepared, engine};

/// A payload field a rule requires to equal a constant: the rule is
/// `{"==": [{"var": path}, constant]}` (or `===`, either order), alone or as
/// one conjunct of a top-level `and`. Such a rule can only be true for an
/// event whose field has one of the constant's [`ValueKey`]s, so the broker
/// files the client under those keys and evaluates the rule only for the
/// events whose field has one of them: 10,000 clients told apart by a user
/// id cost one lookup per event, not 10,000 evaluations.
#[derive(Debug)]
pub struct Equality {
    /// The `var` path, as written.
    pub path: Box<str>,
    /// The constant's keys ([`value_keys`]).
    pub keys: Vec<ValueKey>,
    /// Reads the field from an event's payload.
    pub probe: Arc<PathProbe>,
}

/// A class of JSON scalars for the equality index. [`value_keys`] gives
/// every value a few keys such that two values that are equal under
/// JsonLogic's `==` (as the evaluator coerces: a number equals a string that
/// parses to it, `true` equals `1` and `"true"`, `null` equals `0`, `false`
/// and `""`) share at least one key. Sharing a key says nothing more: the
/// rule itself decides.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ValueKey {
    /// `null`, and what equals it (`false`, `""`).
    Null,
    /// A boolean, and the string naming it.
    Bool(bool),
    /// A number's bits (`-0` as `0`), and what coerces to it.
    Num(u64),
    /// A string.
    Str(Box<str>),
}

/// A JSON scalar, from either side: the rule's constant or the event's field.
#[derive(Debug, Clone, Copy)]
enum Scalar<'a> {
    Null,
    Bool(bool),
    Num(f64),
    Str(&'a str),
}

fn num_key(n: f64) -> Option<ValueKey> {
    // NaN equals nothing; -0 equals 0.
    (!n.is_nan()).then(|| ValueKey::Num(if n == 0.0 { 0.0f64.to_bits() } else { n.to_bits() }))
}

/// The keys of a scalar. Pairwise, for the evaluator's loose equality:
/// null–null, bool–bool, string–string and number–number share their own
/// key; number–string share `Num` (the evaluator parses the string as an
/// `f64`, as here); number–bool share `Num(0 or 1)`; string–bool share
/// `Bool` (`"true"`, `"false"`); null–number share `Num(0)`; null–`false`
/// and null–`""` share `Null`. Strict equality implies loose equality.
fn scalar_keys(value: Scalar<'_>) -> Vec<ValueKey> {
    match value {
        Scalar::Null => vec![ValueKey::Null, ValueKey::Num(0.0f64.to_bits())],
        Scalar::Bool(b) => {
            let mut keys = vec![ValueKey::Bool(b), ValueKey::Num(if b { 1.0f64 } else { 0.0 }.to_bits())];
            if !b {
                keys.push(ValueKey::Null);
            }
            keys
        }
        Scalar::Num(n) => num_key(n).into_iter().collect(),
        Scalar::Str(s) => {
            let mut keys = vec![ValueKey::Str(s.into())];
            keys.extend(s.parse::<f64>().ok().and_then(num_key));
            match s {
                "true" => keys.push(ValueKey::Bool(true)),
                "false" => keys.push(ValueKey::Bool(false)),
                "" => keys.push(ValueKey::Null),
                _ => {}
            }
            keys
        }
    }
}

/// The keys of a JSON value: none for an array or object, which equals no
/// scalar.
pub fn value_keys(value: &Value) -> Vec<ValueKey> {
    let scalar = match value {
        Value::Null => Scalar::Null,
        Value::Bool(b) => Scalar::Bool(*b),
        Value::Number(n) => Scalar::Num(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Scalar::Str(s),
        Value::Array(_) | Value::Object(_) => return Vec::new(),
    };
    scalar_keys(scalar)
}

pub(super) fn data_keys(value: &DataValue<'_>) -> Vec<ValueKey> {
    let scalar = match value {
        DataValue::Null => Scalar::Null,
        DataValue::Bool(b) => Scalar::Bool(*b),
        DataValue::Number(n) => Scalar::Num(n.as_f64()),
        DataValue::String(s) => Scalar::Str(s),
        _ => return Vec::new(),
    };
    scalar_keys(scalar)
}

/// The equality `rule` requires, if it is of the indexable form.
pub(super) fn equality(rule: &Value) -> Option<Equality> {
    let (op, args) = rule.as_object().filter(|m| m.len() == 1)?.iter().next()?;
    match (op.as_str(), args) {
        ("==" | "===", Value::Array(pair)) if pair.len() == 2 => {
            let (path, constant) = match (var_path(&pair[0]), var_path(&pair[1])) {
                (Some(path), None) => (path, &pair[1]),
                (None, Some(path)) => (path, &pair[0]),
                _ => return None,
            };
            // An object is an operation, an array a list of them: only a
            // literal scalar is a constant.
            if constant.is_object() || constant.is_array() {
                return None;
            }
            let probe = PathProbe::new(path)?;
            Some(Equality { path: path.into(), keys: value_keys(constant), probe: Arc::new(probe) })
        }
        ("and", Value::Array(conjuncts)) => conjuncts.iter().find_map(equality),
        _ => None,
    }
}

/// `{"var": "a.b"}` or `{"var": ["a.b"]}` (no default): the path.
fn var_path(value: &Value) -> Option<&str> {
    let (op, arg) = value.as_object().filter(|m| m.len() == 1)?.iter().next()?;
    if op != "var" {
        return None;
    }
    match arg {
        Value::String(path) => Some(path),
        Value::Array(a) if a.len() == 1 => a[0].as_str(),
        _ => None,
    }
}

/// Reads one payload field the way rules read it (`{"var": path}`,
/// evaluated by the same engine), once per event for every rule filed under
/// that path.
pub struct PathProbe {
    logic: Logic,
}

impl std::fmt::Debug for PathProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PathProbe")
    }
}

impl PathProbe {
    /// The probe of `path`.
    fn new(path: &str) -> Option<Self> {
        let logic = engine().compile(&serde_json::json!({ "var": path })).ok()?;
        Some(Self { logic })
    }

    /// The keys of the field in `payload`; `None` if it could not be read
    /// (then any rule on it might match).
    pub fn keys(&self, payload: &Prepared) -> Option<Vec<ValueKey>> {
        ARENA.with(|arena| {
            let mut arena = arena.borrow_mut();
            let keys = engine().evaluate(&self.logic, &payload.data, &arena).ok().map(data_keys);
            arena.reset();
            keys
        })
    }
}
