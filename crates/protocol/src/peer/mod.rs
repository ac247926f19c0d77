//! Peers: the other tidings servers this one knows, each at
//! `system/peer/<identity hash>` as a `system/peer` entity `{endpoint}`,
//! written by an admin through the tree API or seeded at start-up from
//! `TIDINGS_PEERS` (`hash=url,...`). This module owns what such an entity
//! must be (checked on every tree write under `system/peer/`) and the
//! setting's syntax. The endpoint is only a URL: the hash is who the peer
//! is, proven by `GET /v1/identity` there before it is trusted. It also
//! owns what a capacity redirect offers ([`alternatives`],
//! docs/ref-federation.md, "Relays") and ([`protocol`]) what servers say to
//! each other. Calling a peer is `tidings-outbound`'s.

use serde_json::json;

pub mod protocol;
pub mod verify;
pub use protocol::{Execute, PeerError};

use crate::tree::{Entity, EntityError, is_hash};

/// Where peers live in the tree.
pub const PREFIX: &str = "system/peer/";
/// The entity type of a peer.
pub const TYPE: &str = "system/peer";
/// Longest endpoint URL.
const MAX_ENDPOINT: usize = 2048;

/// A peer: its identity hash and the URL it is reached at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The peer server's identity hash (`sha256:<hex>`).
    pub hash: String,
    /// Its base URL (`http://` or `https://`, no query or fragment).
    pub endpoint: String,
}

impl Peer {
    /// Its tree path.
    pub fn path(&self) -> String {
        format!("{PREFIX}{}", self.hash)
    }

    /// Its entity.
    pub fn entity(&self) -> Entity {
        Entity { kind: TYPE.to_owned(), data: json!({"endpoint": self.endpoint}) }
    }
}

/// Checks an entity written at `path`: under [`PREFIX`] it must be a
/// `system/peer` whose last path segment is an identity hash and whose data
/// is exactly `{endpoint}` with a valid endpoint; elsewhere nothing is
/// asked.
pub fn check(path: &str, entity: &Entity) -> Result<(), EntityError> {
    let Some(hash) = path.strip_prefix(PREFIX) else { return Ok(()) };
    if !is_hash(hash) {
        return Err(EntityError(format!("a peer lives at {PREFIX}<identity hash> (sha256:<64 hex>), not {path}")));
    }
    if entity.kind != TYPE {
        return Err(EntityError(format!("an entity under {PREFIX} is of type {TYPE}")));
    }
    let endpoint = entity.data.as_object().filter(|d| d.len() == 1).and_then(|d| d.get("endpoint")).and_then(|e| e.as_str());
    let Some(endpoint) = endpoint else { return Err(EntityError("a peer's data is {\"endpoint\": \"<url>\"}".into())) };
    check_endpoint(endpoint)
}

/// An endpoint: an absolute `http` or `https` URL with a host, no query, no
/// fragment, no user info.
pub fn check_endpoint(endpoint: &str) -> Result<(), EntityError> {
    if endpoint.len() > MAX_ENDPOINT {
        return Err(EntityError(format!("an endpoint is at most {MAX_ENDPOINT} bytes")));
    }
    let uri: http::Uri = endpoint.parse().map_err(|_| EntityError(format!("{endpoint:?} is not a URL")))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
    if !scheme_ok || authority.is_empty() || authority.contains('@') || uri.query().is_some() || endpoint.contains('#') {
        return Err(EntityError(format!("{endpoint:?} is not an http(s) URL with a host and no query, fragment or user info")));
    }
    Ok(())
}

/// Splits a remote inbox URI `entity://<peer hash>/<path>` into the peer's
/// hash and the path in its namespace; `None` for anything else.
pub fn parse_remote(uri: &str) -> Option<(&str, &str)> {
    let (hash, path) = uri.strip_prefix("entity://")?.split_once('/')?;
    (is_hash(hash) && !path.is_empty()).then_some((hash, path))
}

/// The endpoint of a known peer, read from its entity.
pub fn endpoint_of(entity: &str) -> Option<String> {
    let entity: Entity = serde_json::from_str(entity).ok()?;
    (entity.kind == TYPE).then(|| entity.data["endpoint"].as_str().map(|e| e.trim_end_matches('/').to_owned()))?
}

/// Most capacity redirects followed on the way to a relay
/// (docs/ref-federation.md, "Relays").
pub const MAX_HOPS: u32 = 10;

/// Most alternatives a capacity redirect offers, and reads.
pub const MAX_ALTERNATIVES: usize = 10;

/// A relay a redirect offered: its identity hash and endpoint.
pub type Relay = (String, String);

/// What one subscribe request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subscribed {
    /// Held there, with this id.
    Held(String),
    /// At capacity: these relays serve the prefix.
    Redirected(Vec<Relay>),
    /// Refused or unreachable.
    Failed(PeerError),
}

/// The alternatives of a `303` subscribe answer (`{status, result:
/// system/subscription/redirect}`): at most `max`, each an identity hash
/// with an endpoint that passes [`check_endpoint`].
pub fn alternatives(answer: &serde_json::Value, max: usize) -> Vec<Relay> {
    let offered = answer["result"]["data"]["alternatives"].as_array().map(Vec::as_slice).unwrap_or_default();
    offered
        .iter()
        .take(max)
        .filter_map(|a| Some((a["peer"].as_str()?.to_owned(), a["endpoint"].as_str()?.to_owned())))
        .filter(|(peer, endpoint)| is_hash(peer) && check_endpoint(endpoint).is_ok())
        .collect()
}

/// Parses `TIDINGS_PEERS`: `hash=url` pairs separated by commas (empty: none).
pub fn parse_setting(value: &str) -> Result<Vec<Peer>, String> {
    let mut peers: Vec<Peer> = Vec::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((hash, endpoint)) = pair.split_once('=') else { return Err(format!("{pair:?} is not hash=url")) };
        let (hash, endpoint) = (hash.trim(), endpoint.trim().trim_end_matches('/'));
        if !is_hash(hash) {
            return Err(format!("{hash:?} is not an identity hash (sha256:<64 hex>)"));
        }
        check_endpoint(endpoint).map_err(|e| e.0)?;
        if peers.iter().any(|p| p.hash == hash) {
            return Err(format!("{hash} is given twice"));
        }
        peers.push(Peer { hash: hash.to_owned(), endpoint: endpoint.to_owned() });
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn the_setting_is_hash_url_pairs() {
        let peers = parse_setting(&format!(" {HASH}=http://127.0.0.1:9000/ ,")).unwrap();
        assert_eq!(peers, vec![Peer { hash: HASH.into(), endpoint: "http://127.0.0.1:9000".into() }]);
        assert_eq!(parse_setting("").unwrap(), vec![]);
        for bad in ["nohash", "sha256:12=http://h", &format!("{HASH}=ftp://h"), &format!("{HASH}=http://h,{HASH}=http://i")] {
            assert!(parse_setting(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn remote_inboxes_name_a_peer_and_a_path() {
        assert_eq!(parse_remote(&format!("entity://{HASH}/system/inbox/a")), Some((HASH, "system/inbox/a")));
        for bad in ["system/inbox/a", "entity://nohash/system/inbox/a", &format!("entity://{HASH}/"), &format!("entity://{HASH}")] {
            assert_eq!(parse_remote(bad), None, "{bad}");
        }
        let good = Peer { hash: HASH.into(), endpoint: "http://h:1".into() };
        assert_eq!(endpoint_of(&good.entity().canonical().0).as_deref(), Some("http://h:1"));
    }

    #[test]
    fn peer_entities_are_checked_only_under_the_prefix() {
        let good = Peer { hash: HASH.into(), endpoint: "https://peer.example:8443/base".into() };
        assert_eq!(check(&good.path(), &good.entity()), Ok(()));
        let other = Entity { kind: "note".into(), data: json!({}) };
        assert_eq!(check("notes/a", &other), Ok(()));
        assert!(check(&good.path(), &other).is_err(), "wrong type");
        assert!(check("system/peer/not-a-hash", &good.entity()).is_err());
        for data in [json!({}), json!({"endpoint": 5}), json!({"endpoint": "http://h", "x": 1}), json!({"endpoint": "http://u@h"})] {
            assert!(check(&good.path(), &Entity { kind: TYPE.into(), data: data.clone() }).is_err(), "{data}");
        }
        for url in ["http://h?x=1", "http://h/#f", "/relative", "http://", "mailto:a@b"] {
            assert!(check_endpoint(url).is_err(), "{url}");
        }
    }
}
