//! JSON request decoding, strict: every request body, WebSocket message and
//! entity a client or a peer sends is read through here.
//! - Objects only: serde's derived structs also accept a JSON array of
//!   their fields in order (`[null, null]` as a poll body), which no body of
//!   this API means.
//! - A key given twice in one object is refused (`{"event_type": "a.b",
//!   "event_type": "c.d"}` would otherwise silently mean the last).
//! - Every refusal names where it is, as a field path (`events[0].agent:
//!   missing field `id``), through `serde_path_to_error`.

use std::fmt;

use serde::de::{DeserializeOwned, DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A JSON input refused, and where in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", if path.is_empty() || path == "." { message.clone() } else { format!("{path}: {message}") })]
pub struct JsonError {
    /// Where: `events[0].agent`, or `.` for the whole input.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl JsonError {
    fn whole(e: impl fmt::Display) -> Self {
        Self { path: String::new(), message: e.to_string() }
    }
}

/// Parses `bytes` as JSON, refusing a key given twice in any object.
pub fn strict_value(bytes: &[u8]) -> Result<Value, JsonError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = Strict(Place::Root).deserialize(&mut deserializer).map_err(JsonError::whole)?;
    deserializer.end().map_err(JsonError::whole)?;
    Ok(value)
}

/// Decodes `bytes` as a JSON object into `T` (strictly: see the module).
pub fn from_object_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, JsonError> {
    from_object(strict_value(bytes)?)
}

/// Decodes `value`, which must be a JSON object, into `T`; a refusal names
/// the field path.
pub fn from_object<T: DeserializeOwned>(value: Value) -> Result<T, JsonError> {
    match value {
        Value::Object(_) => serde_path_to_error::deserialize(value)
            .map_err(|e| JsonError { path: short(&e.path().to_string(), 256), message: short(&e.into_inner().to_string(), 512) }),
        other => Err(JsonError::whole(format!("expected a JSON object, found {}", kind(&other)))),
    }
}

/// Where a value sits, to name it in a refusal: built on the stack as the
/// parse descends, rendered only when something is refused.
#[derive(Clone, Copy)]
enum Place<'a> {
    Root,
    Key(&'a Place<'a>, &'a str),
    Index(&'a Place<'a>, usize),
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Root => Ok(()),
            Place::Key(Place::Root, key) => write!(f, "{}", short(key, 64)),
            Place::Key(parent, key) => write!(f, "{parent}.{}", short(key, 64)),
            Place::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// `text` cut to `max` characters: keys are the sender's to choose, and a
/// refusal quotes them.
fn short(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// A JSON value at a place, refusing duplicate keys.
struct Strict<'a>(Place<'a>);

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element_seed(Strict(Place::Index(&self.0, out.len())))? {
            out.push(item);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let place = Place::Key(&self.0, &key);
                return Err(A::Error::custom(format_args!("{place}: the key is given twice")));
            }
            let value = map.next_value_seed(Strict(Place::Key(&self.0, &key)))?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// A non-negative integer, as JSON Schema counts integers: `5` and `5.0`.
pub fn as_uint(value: &Value) -> Option<u64> {
    let n = value.as_number()?;
    n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f < u64::MAX as f64).map(|f| f as u64))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Two {
        a: Option<u8>,
        b: Option<u8>,
    }

    #[test]
    fn arrays_are_not_structs() {
        assert!(serde_json::from_slice::<Two>(b"[null, null]").is_ok(), "what serde alone accepts");
        assert!(from_object_slice::<Two>(b"[null, null]").is_err());
        assert!(from_object::<Two>(serde_json::json!([1, 2])).is_err());
        assert!(from_object_slice::<Two>(br#"{"a": 1}"#).is_ok());
        assert!(from_object::<Two>(serde_json::json!({"b": 2})).is_ok());
    }

    #[test]
    fn a_key_given_twice_is_refused_and_refusals_name_their_place() {
        let twice = strict_value(br#"{"events": [{"event_type": "a.b", "payload": {"x": 1, "x": 2}}]}"#).unwrap_err();
        assert!(twice.to_string().starts_with("events[0].payload.x: the key is given twice"), "{twice}");
        let top = strict_value(br#"{"event_type": "a.b", "event_type": "c.d"}"#).unwrap_err();
        assert!(top.to_string().starts_with("event_type: the key is given twice"), "{top}");
        assert_eq!(strict_value(br#"{"a": [1, {"b": null}], "c": "d"}"#).unwrap(), serde_json::json!({"a": [1, {"b": null}], "c": "d"}));
        assert!(strict_value(b"{} {}").is_err(), "one value only");
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Outer {
            inner: Vec<Inner>,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Inner {
            name: String,
        }
        let typed = from_object_slice::<Outer>(br#"{"inner": [{"name": "x"}, {"name": 5}]}"#).unwrap_err();
        assert_eq!(typed.path, "inner[1].name");
        assert!(typed.to_string().starts_with("inner[1].name: invalid type: integer `5`, expected a string"), "{typed}");
    }

    #[test]
    fn a_refusal_quotes_a_hostile_key_in_part() {
        let key = "k".repeat(100_000);
        let twice = strict_value(format!(r#"{{"{key}": 1, "{key}": 2}}"#).as_bytes()).unwrap_err();
        assert!(twice.to_string().len() < 300, "{}", twice.to_string().len());
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Strict {
            a: Option<u8>,
        }
        let unknown = from_object::<Strict>(serde_json::json!({ key.clone(): 1 })).unwrap_err();
        assert!(unknown.to_string().len() < 1_000, "{}", unknown.to_string().len());
    }

    #[test]
    fn integers_as_json_schema_counts_them() {
        use serde_json::json;
        for (v, want) in
            [(json!(5), Some(5)), (json!(5.0), Some(5)), (json!(5.5), None), (json!(-1), None), (json!("5"), None), (json!(1e300), None)]
        {
            assert_eq!(as_uint(&v), want, "{v}");
        }
    }
}
