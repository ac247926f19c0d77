//! The entity tree's vocabulary: paths, entities and their hashes. Pure: no
//! I/O (the server's store keeps the tree, and its `http::tree` serves it).
//!
//! An entity is `{type, data}`. Its hash is `sha256:<hex>` of its RFC 8785
//! canonical JSON (through `serde_json_canonicalizer`), so two servers that
//! hold the same entity agree on its hash whatever key order or number
//! spelling they received. Writes are compare-and-swap on that hash.

pub mod capability;

use serde::{Deserialize, Serialize};

use crate::event::{Agent, EventBody, Visibility, names};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Most segments in a path.
pub const MAX_DEPTH: usize = 32;
/// Longest path, in bytes.
pub const MAX_PATH_LEN: usize = crate::glob::MAX_PATH_LEN;
/// Longest entity type, in bytes.
pub const MAX_TYPE_LEN: usize = 256;

/// Why a path is refused (`400 invalid_path`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct PathError(pub String);

/// Checks a tree path: `/`-separated segments of `[A-Za-z0-9._~:-]`, no
/// empty, `.` or `..` segment, at most [`MAX_DEPTH`] segments and
/// [`MAX_PATH_LEN`] bytes.
pub fn validate_path(path: &str) -> Result<(), PathError> {
    if path.is_empty() {
        return Err(PathError("the path is empty".into()));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(PathError(format!("the path is longer than {MAX_PATH_LEN} bytes")));
    }
    let mut depth = 0;
    for segment in path.split('/') {
        depth += 1;
        match segment {
            "" => return Err(PathError(format!("{path:?} has an empty segment"))),
            "." | ".." => return Err(PathError(format!("{path:?} has a {segment:?} segment"))),
            s if !s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._~:-".contains(&b)) => {
                return Err(PathError(format!("segment {s:?} has characters outside [A-Za-z0-9._~:-]")));
            }
            _ => {}
        }
    }
    if depth > MAX_DEPTH {
        return Err(PathError(format!("the path has more than {MAX_DEPTH} segments")));
    }
    Ok(())
}

/// An entity as written: a type and its data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entity {
    /// The entity type (`system/identity`, `note`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The content.
    pub data: Value,
}

/// Why an entity is refused (`400 invalid_entity`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct EntityError(pub String);

impl Entity {
    /// Validates the entity.
    pub fn check(&self) -> Result<(), EntityError> {
        if self.kind.is_empty() || self.kind.len() > MAX_TYPE_LEN {
            return Err(EntityError(format!("type must be 1 to {MAX_TYPE_LEN} bytes")));
        }
        Ok(())
    }

    /// The canonical JSON (RFC 8785) and its hash.
    pub fn canonical(&self) -> (String, String) {
        let value = serde_json::json!({"type": self.kind, "data": self.data});
        let canonical = serde_json_canonicalizer::to_string(&value).expect("a JSON value always canonicalises");
        let hash = hash_canonical(&canonical);
        (canonical, hash)
    }
}

/// Whether `s` is an entity hash: `sha256:` and 64 lowercase hex digits.
pub fn is_hash(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// `sha256:<hex>` of canonical JSON text.
pub fn hash_canonical(canonical: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(canonical.as_bytes())))
}

/// The `ref` of a tree change event.
pub fn event_ref(path: &str) -> String {
    format!("tree:{path}")
}

/// Longest chain id, in bytes.
pub const MAX_CHAIN_ID_LEN: usize = 128;

/// Checks a chain id (`X-Chain-Id`): one path segment, at most
/// [`MAX_CHAIN_ID_LEN`] bytes, since it names a directory of chain-error
/// markers.
pub fn validate_chain_id(id: &str) -> Result<(), PathError> {
    if id.len() > MAX_CHAIN_ID_LEN || id.contains('/') {
        return Err(PathError(format!("a chain id is one path segment of at most {MAX_CHAIN_ID_LEN} bytes")));
    }
    validate_path(id)
}

/// A fresh random id (32 hex digits): subscription ids, chain ids.
pub fn generate_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// What a write did to a path, for the change event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Nothing was there.
    Created,
    /// An entity was replaced.
    Updated,
    /// The entity was removed.
    Deleted,
}

/// Builds the change event of a tree write from what the write found: the
/// store calls it inside the write's transaction, so the event and the
/// change commit together. The store knows nothing of event names. Shared
/// (`Fn`, not `FnOnce`), so a write whose group failed can be tried alone.
pub type ChangeEvent = std::sync::Arc<dyn Fn(ChangeKind, Option<&str>) -> EventBody + Send + Sync>;

/// The event type of a change.
pub fn change_type(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Created => names::TREE_CREATED,
        ChangeKind::Updated => names::TREE_UPDATED,
        ChangeKind::Deleted => names::TREE_DELETED,
    }
}

/// The response header of `GET /v1/tree/{path}` naming the log id of the
/// change that wrote the entity (the `sequence` its server signs that
/// change with; see `tidings_server::federation::signed`).
pub const CHANGE_ID_HEADER: &str = "tidings-change-id";

/// Whether `path` is in `system/`, which holds what tidings itself keeps
/// (subscriptions, their configuration, peers, chain-error markers).
pub fn is_system(path: &str) -> bool {
    path == "system" || path.starts_with("system/")
}

/// Who may see the change events of `path`: everyone allowed to subscribe,
/// except for `system/`, whose changes are admin-visibility events (only a
/// caller whose tokens grant `visibility: admin` receives them, on live
/// streams, replay and polls alike), as direct reads of it are admin-only.
pub fn change_visibility(path: &str) -> Visibility {
    if is_system(path) { Visibility::Admin } else { Visibility::Public }
}

/// The change event of a write to `path`, built from what the write found:
/// `{uri, hash?, previous_hash?, chain_id}`, `ref` `tree:<path>`.
pub fn change_event(path: &str, agent: Agent, hash: Option<String>, chain_id: String) -> ChangeEvent {
    change_event_with(path, agent, hash, chain_id, None)
}

/// [`change_event`] whose payload also carries `signed` (the signed
/// changes a mirror took this change from, forwarded by its engine).
pub fn change_event_with(
    path: &str,
    agent: Agent,
    hash: Option<String>,
    chain_id: String,
    signed: Option<serde_json::Value>,
) -> ChangeEvent {
    let path = path.to_owned();
    std::sync::Arc::new(move |kind, previous: Option<&str>| {
        let mut payload = serde_json::json!({ "uri": path });
        if let Some(h) = &hash {
            payload["hash"] = serde_json::json!(h);
        }
        if let Some(p) = previous {
            payload["previous_hash"] = serde_json::json!(p);
        }
        payload["chain_id"] = serde_json::json!(chain_id);
        if let Some(signed) = &signed {
            payload["signed"] = signed.clone();
        }
        EventBody {
            event_type: change_type(kind).to_owned(),
            reference: Some(event_ref(&path)),
            agent: Some(agent.clone()),
            session_id: None,
            occurred_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
            payload,
            links: vec![],
            visibility: change_visibility(&path),
            traceparent: None,
            tracestate: None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths() {
        for ok in ["a", "a/b/c", "system/subscription/x-1", "v1.2/~tilde/a:b", "A-Z_0.9"] {
            assert_eq!(validate_path(ok), Ok(()), "{ok}");
        }
        for bad in ["", "/a", "a/", "a//b", "a/./b", "a/../b", "..", "a b", "a/é", "a?b", "a%2Fb"] {
            assert!(validate_path(bad).is_err(), "{bad}");
        }
        assert!(validate_path(&vec!["a"; 33].join("/")).is_err());
        assert!(validate_path(&"a".repeat(1025)).is_err());
    }

    #[test]
    fn hashes_are_canonical() {
        let a: Entity = serde_json::from_value(json!({"type": "note", "data": {"b": 1, "a": [1.0, "x"]}})).unwrap();
        let b: Entity = serde_json::from_str(r#"{"data":{"a":[1,"x"],"b":1.0},"type":"note"}"#).unwrap();
        assert_eq!(a.canonical(), b.canonical(), "key order and number spelling do not matter");
        let (canonical, hash) = a.canonical();
        assert_eq!(canonical, r#"{"data":{"a":[1,"x"],"b":1},"type":"note"}"#);
        assert!(hash.starts_with("sha256:") && hash.len() == 7 + 64);
        assert_ne!(hash, Entity { kind: "note".into(), data: json!({}) }.canonical().1);
    }
}
