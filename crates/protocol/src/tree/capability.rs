//! Identities, signatures and capability tokens, as the subscription
//! extension models them, in JSON. Pure: every check takes the entities it
//! needs from an `included` map (hash → entity), the way an EXECUTE carries
//! them, and does no I/O.
//!
//! - An identity `{"type":"system/identity","data":{"algorithm":"ed25519",
//!   "public_key":"<base64 of the raw 32 bytes>"}}` is named by its hash.
//! - A signature `{"type":"system/signature","data":{"target","signer",
//!   "algorithm":"ed25519","signature":"<base64>"}}` signs the ASCII bytes of
//!   the target's hash with the signer identity's key.
//! - A capability token `{"type":"system/capability/token","data":{"granter",
//!   "grantee","grants":[{"handler","operations","resources"}],"parent"?,
//!   "expires_at"?}}` is valid when its granter signed it, it has not
//!   expired, and, if it has a parent, the parent is valid and names this
//!   token's granter as its grantee. A chain only narrows: an operation is
//!   granted when every token in the chain grants it.

use std::collections::HashMap;

use base64::Engine as _;
use ed25519_dalek::{Signature, Verifier as _, VerifyingKey};
use serde::Deserialize;
use serde_json::Value;

use super::Entity;
use crate::glob::Glob;

/// Entities carried with a request, by hash.
pub type Included = HashMap<String, Value>;

/// Longest delegation chain followed.
pub const MAX_CHAIN: usize = 16;

/// Why a capability check failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapabilityError {
    /// A referenced entity is not in `included` (`chain_unreachable`).
    #[error("{0} is not among the included entities")]
    Missing(String),
    /// An entity does not have the expected shape.
    #[error("{0}")]
    Malformed(String),
    /// No valid signature by the expected signer.
    #[error("{0} is not signed by {1}")]
    Unsigned(String, String),
    /// A token has expired.
    #[error("capability {0} has expired")]
    Expired(String),
    /// The chain loops or is longer than [`MAX_CHAIN`].
    #[error("the delegation chain loops or is longer than {MAX_CHAIN}")]
    ChainTooLong,
    /// A parent does not delegate to this token's granter.
    #[error("capability {0} is not delegated by its parent")]
    BrokenDelegation(String),
}

/// The hash of an entity given as JSON `{type, data}`.
pub fn hash_of(entity: &Value) -> Result<String, CapabilityError> {
    let entity: Entity = serde_json::from_value(entity.clone()).map_err(|e| CapabilityError::Malformed(format!("not an entity: {e}")))?;
    Ok(entity.canonical().1)
}

fn get<'a>(included: &'a Included, hash: &str, kind: &str) -> Result<&'a Value, CapabilityError> {
    let entity = included.get(hash).ok_or_else(|| CapabilityError::Missing(hash.to_owned()))?;
    if entity["type"] != kind {
        return Err(CapabilityError::Malformed(format!("{hash} is not a {kind}")));
    }
    Ok(entity)
}

/// The public key of the identity named `hash`.
pub fn identity_key(included: &Included, hash: &str) -> Result<VerifyingKey, CapabilityError> {
    let identity = get(included, hash, "system/identity")?;
    if identity["data"]["algorithm"] != "ed25519" {
        return Err(CapabilityError::Malformed(format!("identity {hash} does not use ed25519")));
    }
    let raw = identity["data"]["public_key"]
        .as_str()
        .and_then(|k| base64::engine::general_purpose::STANDARD.decode(k).ok())
        .and_then(|k| <[u8; 32]>::try_from(k).ok())
        .ok_or_else(|| CapabilityError::Malformed(format!("identity {hash} has no 32-byte public key")))?;
    VerifyingKey::from_bytes(&raw).map_err(|_| CapabilityError::Malformed(format!("identity {hash} has an invalid key")))
}

/// Whether `included` holds a valid signature by `signer` over `target`.
pub fn verify_signed(included: &Included, target: &str, signer: &str) -> Result<(), CapabilityError> {
    let key = identity_key(included, signer)?;
    let valid = included.values().filter(|e| e["type"] == "system/signature").any(|sig| {
        let d = &sig["data"];
        d["target"] == target
            && d["signer"] == signer
            && d["algorithm"] == "ed25519"
            && d["signature"]
                .as_str()
                .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                .and_then(|s| Signature::from_slice(&s).ok())
                .is_some_and(|s| key.verify(target.as_bytes(), &s).is_ok())
    });
    if valid { Ok(()) } else { Err(CapabilityError::Unsigned(target.to_owned(), signer.to_owned())) }
}

/// Verifies a proof of origin that carries its identity inline: `signature`
/// (base64 Ed25519) by the key of `identity` (a `system/identity` entity)
/// over the ASCII bytes of `target` (a hash). Returns the identity's hash:
/// who signed.
pub fn verify_inline(identity: &Value, target: &str, signature: &str) -> Result<String, CapabilityError> {
    let hash = hash_of(identity)?;
    let included: Included = std::iter::once((hash.clone(), identity.clone())).collect();
    let key = identity_key(&included, &hash)?;
    let valid = base64::engine::general_purpose::STANDARD
        .decode(signature)
        .ok()
        .and_then(|s| Signature::from_slice(&s).ok())
        .is_some_and(|s| key.verify(target.as_bytes(), &s).is_ok());
    if valid { Ok(hash) } else { Err(CapabilityError::Unsigned(target.to_owned(), hash)) }
}

/// One grant of a token.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The handler (`system/subscription`, `system/tree`, `system/inbox`).
    pub handler: String,
    /// Operations (`subscribe`, `get`, `receive`, `*`).
    pub operations: Vec<String>,
    /// Resource patterns.
    pub resources: Vec<Glob>,
}

/// A verified token.
#[derive(Debug, Clone)]
pub struct Token {
    /// Its hash.
    pub hash: String,
    /// Who granted it (identity hash).
    pub granter: String,
    /// To whom (identity hash).
    pub grantee: String,
    /// What it grants.
    pub grants: Vec<Grant>,
}

#[derive(Deserialize)]
struct GrantJson {
    handler: String,
    operations: Vec<String>,
    resources: Vec<String>,
}

#[derive(Deserialize)]
struct TokenJson {
    granter: String,
    grantee: String,
    grants: Vec<GrantJson>,
    #[serde(default)]
    parent: Option<String>,
    #[serde(default)]
    expires_at: Option<u64>,
}

/// Resolves and verifies the chain of the token named `hash`, leaf first.
pub fn resolve_chain(included: &Included, hash: &str, now_ms: u64) -> Result<Vec<Token>, CapabilityError> {
    let mut chain: Vec<Token> = Vec::new();
    let mut next = Some(hash.to_owned());
    while let Some(hash) = next.take() {
        if chain.len() >= MAX_CHAIN || chain.iter().any(|t| t.hash == hash) {
            return Err(CapabilityError::ChainTooLong);
        }
        let entity = get(included, &hash, "system/capability/token")?;
        let (token, (parent, expires_at)) = token_from(&hash, &entity["data"])?;
        if expires_at.is_some_and(|t| t <= now_ms) {
            return Err(CapabilityError::Expired(hash));
        }
        verify_signed(included, &hash, &token.granter)?;
        if let Some(child) = chain.last()
            && child.granter != token.grantee
        {
            return Err(CapabilityError::BrokenDelegation(child.hash.clone()));
        }
        next = parent;
        chain.push(token);
    }
    Ok(chain)
}

impl Token {
    /// Whether this token alone grants `operation` of `handler` on `resource`.
    pub fn grants(&self, handler: &str, operation: &str, resource: &str) -> bool {
        self.grants.iter().any(|g| {
            g.handler == handler
                && g.operations.iter().any(|o| o == operation || o == "*")
                && g.resources.iter().any(|r| r.matches(resource))
        })
    }
}

/// Whether every token in `chain` grants the operation (a chain only narrows).
pub fn chain_grants(chain: &[Token], handler: &str, operation: &str, resource: &str) -> bool {
    !chain.is_empty() && chain.iter().all(|t| t.grants(handler, operation, resource))
}

/// Whether every token in `chain` grants the operation on every path
/// `pattern` matches (a subscription pattern, not a single path).
pub fn chain_covers(chain: &[Token], handler: &str, operation: &str, pattern: &Glob) -> bool {
    !chain.is_empty()
        && chain.iter().all(|t| {
            t.grants.iter().any(|g| {
                g.handler == handler
                    && g.operations.iter().any(|o| o == operation || o == "*")
                    && g.resources.iter().any(|r| r.covers(pattern))
            })
        })
}

/// The token named `hash` as it reads, unverified (to check what it claims
/// before its chain is resolved).
pub fn read_token(included: &Included, hash: &str) -> Result<Token, CapabilityError> {
    let entity = get(included, hash, "system/capability/token")?;
    token_from(hash, &entity["data"]).map(|(token, _)| token)
}

/// A token's parent and expiry.
type Links = (Option<String>, Option<u64>);

/// A token's fields, and its parent and expiry.
fn token_from(hash: &str, data: &Value) -> Result<(Token, Links), CapabilityError> {
    let data: TokenJson =
        serde_json::from_value(data.clone()).map_err(|e| CapabilityError::Malformed(format!("capability {hash}: {e}")))?;
    let grants = data
        .grants
        .into_iter()
        .map(|g| {
            let resources = g.resources.iter().map(|r| Glob::new_path(r)).collect::<Result<Vec<_>, _>>();
            resources
                .map(|resources| Grant { handler: g.handler, operations: g.operations, resources })
                .map_err(|e| CapabilityError::Malformed(format!("capability {hash}: resource {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((Token { hash: hash.to_owned(), granter: data.granter, grantee: data.grantee, grants }, (data.parent, data.expires_at)))
}

/// Whether `identity` appears as a granter anywhere in `chain` (the in-chain
/// check; not only at the root, so third-party delivery works).
pub fn in_chain(chain: &[Token], identity: &str) -> bool {
    chain.iter().any(|t| t.granter == identity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer as _, SigningKey};
    use serde_json::json;

    struct Peer {
        key: SigningKey,
        entity: Value,
        hash: String,
    }

    fn peer(seed: u8) -> Peer {
        let key = SigningKey::from_bytes(&[seed; 32]);
        let public = base64::engine::general_purpose::STANDARD.encode(key.verifying_key().as_bytes());
        let entity = json!({"type": "system/identity", "data": {"algorithm": "ed25519", "public_key": public}});
        let hash = hash_of(&entity).unwrap();
        Peer { key, entity, hash }
    }

    fn sign(by: &Peer, target: &str) -> Value {
        let sig = base64::engine::general_purpose::STANDARD.encode(by.key.sign(target.as_bytes()).to_bytes());
        json!({"type": "system/signature", "data": {"target": target, "signer": by.hash, "algorithm": "ed25519", "signature": sig}})
    }

    fn token(included: &mut Included, granter: &Peer, grantee: &Peer, resources: &[&str], parent: Option<&str>) -> String {
        let mut data = json!({
            "granter": granter.hash, "grantee": grantee.hash,
            "grants": [{"handler": "system/inbox", "operations": ["receive"], "resources": resources}],
        });
        if let Some(p) = parent {
            data["parent"] = json!(p);
        }
        let entity = json!({"type": "system/capability/token", "data": data});
        let hash = hash_of(&entity).unwrap();
        let sig = sign(granter, &hash);
        included.insert(hash_of(&sig).unwrap(), sig);
        included.insert(hash.clone(), entity);
        hash
    }

    fn with(peers: &[&Peer]) -> Included {
        peers.iter().map(|p| (p.hash.clone(), p.entity.clone())).collect()
    }

    #[test]
    fn third_party_delivery_chain() {
        let (a, c, server) = (peer(1), peer(2), peer(3));
        let mut included = with(&[&a, &c, &server]);
        // Rooted at C (who owns the inbox), delegated to A, then to the server.
        let root = token(&mut included, &c, &a, &["system/inbox/**"], None);
        let leaf = token(&mut included, &a, &server, &["system/inbox/c-feed"], Some(&root));
        let chain = resolve_chain(&included, &leaf, 0).unwrap();
        assert_eq!(chain.len(), 2);
        assert!(in_chain(&chain, &a.hash), "A is in the chain, though not its root");
        assert!(in_chain(&chain, &c.hash));
        assert!(chain_grants(&chain, "system/inbox", "receive", "system/inbox/c-feed"));
        assert!(!chain_grants(&chain, "system/inbox", "receive", "system/inbox/other"), "the leaf narrows");
        // The same kind of token without A in the chain.
        let direct = token(&mut included, &c, &server, &["system/inbox/**"], None);
        assert!(!in_chain(&resolve_chain(&included, &direct, 0).unwrap(), &a.hash));
    }

    #[test]
    fn refusals() {
        let (a, b, mallory) = (peer(1), peer(2), peer(9));
        let mut included = with(&[&a, &b, &mallory]);
        let root = token(&mut included, &a, &b, &["x/**"], None);
        // Missing parent: unreachable.
        let orphan = token(&mut included, &b, &a, &["x/**"], Some("sha256:00"));
        assert_eq!(resolve_chain(&included, &orphan, 0).unwrap_err(), CapabilityError::Missing("sha256:00".into()));
        // A child whose granter is not the parent's grantee.
        let forged = token(&mut included, &mallory, &a, &["x/**"], Some(&root));
        assert!(matches!(resolve_chain(&included, &forged, 0), Err(CapabilityError::BrokenDelegation(_))));
        // A token signed by someone else than its granter.
        let data = json!({"granter": a.hash, "grantee": b.hash, "grants": []});
        let entity = json!({"type": "system/capability/token", "data": data});
        let hash = hash_of(&entity).unwrap();
        let sig = sign(&mallory, &hash);
        included.insert(hash_of(&sig).unwrap(), sig);
        included.insert(hash.clone(), entity);
        assert!(matches!(resolve_chain(&included, &hash, 0), Err(CapabilityError::Unsigned(..))));
        // Expiry.
        let data = json!({"granter": a.hash, "grantee": b.hash, "grants": [], "expires_at": 1000});
        let entity = json!({"type": "system/capability/token", "data": data});
        let hash = hash_of(&entity).unwrap();
        let sig = sign(&a, &hash);
        included.insert(hash_of(&sig).unwrap(), sig);
        included.insert(hash.clone(), entity);
        assert!(resolve_chain(&included, &hash, 999).is_ok());
        assert_eq!(resolve_chain(&included, &hash, 1000).unwrap_err(), CapabilityError::Expired(hash));
    }
}
