//! JSON request decoding that takes objects only. serde's derived structs
//! also accept a JSON array of their fields in order (`[null, null]` as a
//! poll body), which no body of this API means: every request body and
//! every entity's `data` is decoded through here, so an array is refused
//! like any other wrong shape.

use serde::de::{DeserializeOwned, Error as _};
use serde_json::{Map, Value};

/// Decodes `bytes` as a JSON object into `T`.
pub fn from_object_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, serde_json::Error> {
    let map: Map<String, Value> = serde_json::from_slice(bytes)?;
    serde_json::from_value(Value::Object(map))
}

/// Decodes `value`, which must be a JSON object, into `T`.
pub fn from_object<T: DeserializeOwned>(value: Value) -> Result<T, serde_json::Error> {
    match value {
        Value::Object(_) => serde_json::from_value(value),
        other => Err(serde_json::Error::custom(format!("expected a JSON object, found {}", kind(&other)))),
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
    fn integers_as_json_schema_counts_them() {
        use serde_json::json;
        for (v, want) in
            [(json!(5), Some(5)), (json!(5.0), Some(5)), (json!(5.5), None), (json!(-1), None), (json!("5"), None), (json!(1e300), None)]
        {
            assert_eq!(as_uint(&v), want, "{v}");
        }
    }
}
