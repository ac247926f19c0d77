//! A server's (or a device's) identity: an Ed25519 key and the
//! `system/identity` entity named by its hash. The server signs with it the
//! capabilities it mints. (Where the key is kept is the server's
//! `keyfile` module.)
//! Also [`proof_target`], what a device's origin proof signs
//! (docs/ref-websocket.md, "Origin proofs"): `tidings-client` signs it, the
//! server's `service::device` checks it.

use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey};
use serde_json::{Value, json};

use crate::tree::capability::hash_of;

/// The server identity. The key never leaves this struct.
pub struct ServerIdentity {
    key: SigningKey,
    entity: Value,
    hash: String,
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerIdentity").field("hash", &self.hash).finish_non_exhaustive()
    }
}

impl ServerIdentity {
    /// An identity from a key.
    pub fn from_key(key: SigningKey) -> Self {
        let public = base64::engine::general_purpose::STANDARD.encode(key.verifying_key().as_bytes());
        let entity = json!({"type": "system/identity", "data": {"algorithm": "ed25519", "public_key": public}});
        let hash = hash_of(&entity).expect("an identity is an entity");
        Self { key, entity, hash }
    }

    /// The identity entity.
    pub fn entity(&self) -> &Value {
        &self.entity
    }

    /// Its hash (the server's name).
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The base64 Ed25519 signature over `message`'s bytes.
    pub fn signature(&self, message: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.key.sign(message.as_bytes()).to_bytes())
    }

    /// A `system/signature` entity by this identity over `target` (a hash).
    pub fn sign(&self, target: &str) -> Value {
        let signature = self.signature(target);
        json!({"type": "system/signature", "data": {"target": target, "signer": self.hash, "algorithm": "ed25519", "signature": signature}})
    }

    /// Signs `target` into `included` (the signature under its hash) with
    /// this identity beside it: what a verifier of a request's `included`
    /// needs to check that this identity signed `target`.
    pub fn sign_into(&self, target: &str, included: &mut serde_json::Map<String, Value>) {
        let signature = self.sign(target);
        if let Ok(hash) = hash_of(&signature) {
            included.insert(hash, signature);
        }
        included.insert(self.hash.clone(), self.entity.clone());
    }
}

/// What a device's origin proof signs (docs/ref-websocket.md,
/// "Origin proofs"): the hash (`sha256:<hex>`) of the RFC 8785 canonical
/// JSON of `{"method", "body", "nonce"}`, the nonce being its connection's.
pub fn proof_target(method: &str, body: &Value, nonce: &str) -> String {
    let value = json!({ "method": method, "body": body, "nonce": nonce });
    let canonical = serde_json_canonicalizer::to_string(&value).expect("a JSON value always canonicalises");
    crate::tree::hash_canonical(&canonical)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::capability::{Included, verify_signed};

    #[test]
    fn signatures_verify_against_the_identity() {
        let first = ServerIdentity::from_key(ed25519_dalek::SigningKey::from_bytes(&[3; 32]));
        let target = "sha256:abc";
        let sig = first.sign(target);
        let included: Included = [(first.hash().to_owned(), first.entity().clone()), (hash_of(&sig).unwrap(), sig)].into_iter().collect();
        assert_eq!(verify_signed(&included, target, first.hash()), Ok(()));
        let other = ServerIdentity::from_key(ed25519_dalek::SigningKey::from_bytes(&[4; 32]));
        assert!(verify_signed(&included, target, other.hash()).is_err(), "signed by another");
    }
}
