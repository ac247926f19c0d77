//! The server's own identity: an Ed25519 key loaded from
//! `TIDINGS_SERVER_KEY_FILE`, or generated once into the data directory
//! (`server.key`, PKCS#8 PEM, mode 0600), and the `system/identity` entity
//! named by its hash. The server signs with it the capabilities it mints.
//! `tidings listen` keeps a device's key the same way ([`ServerIdentity::open`]).
//! Also [`proof_target`], what a device's origin proof signs
//! (docs/ref-websocket.md, "Origin proofs"): `tidings-client` signs it, the
//! server's `service::device` checks it.

use std::path::Path;

use anyhow::Context as _;
use base64::Engine as _;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
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
    /// Loads `key_file`, or `data_dir/server.key`, creating it on first start.
    pub fn load_or_create(key_file: Option<&Path>, data_dir: &Path) -> anyhow::Result<Self> {
        match key_file {
            Some(path) => {
                anyhow::ensure!(path.exists(), "TIDINGS_SERVER_KEY_FILE {} does not exist", path.display());
                Self::open(path)
            }
            None => {
                std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
                Self::open(&data_dir.join("server.key"))
            }
        }
    }

    /// Loads the key at `path`, generating it there (mode 0600) when the
    /// file does not exist.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let read = |path: &Path| -> anyhow::Result<SigningKey> {
            let pem = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            SigningKey::from_pkcs8_pem(&pem).map_err(|e| anyhow::anyhow!("{} is not an Ed25519 PKCS#8 key: {e}", path.display()))
        };
        if path.exists() {
            return Ok(Self::from_key(read(path)?));
        }
        let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
        let pem = key.to_pkcs8_pem(LineEnding::LF).map_err(|e| anyhow::anyhow!("encoding the key: {e}"))?;
        match write_private(path, pem.as_bytes()) {
            Ok(()) => {
                tracing::info!(path = %path.display(), "generated an identity key");
                Ok(Self::from_key(key))
            }
            // Another process sharing this directory (several servers on one
            // PostgreSQL) created it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(Self::from_key(read(path)?)),
            Err(e) => Err(e).with_context(|| format!("writing {}", path.display())),
        }
    }

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

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(bytes)
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
    fn generated_once_then_reloaded_and_signatures_verify() {
        let dir = tempfile::tempdir().unwrap();
        let first = ServerIdentity::load_or_create(None, dir.path()).unwrap();
        let again = ServerIdentity::load_or_create(None, dir.path()).unwrap();
        assert_eq!(first.hash(), again.hash(), "the same key after a restart");
        let target = "sha256:abc";
        let sig = first.sign(target);
        let included: Included = [(first.hash().to_owned(), first.entity().clone()), (hash_of(&sig).unwrap(), sig)].into_iter().collect();
        assert_eq!(verify_signed(&included, target, first.hash()), Ok(()));
        assert!(ServerIdentity::load_or_create(Some(&dir.path().join("missing.key")), dir.path()).is_err());
    }
}
