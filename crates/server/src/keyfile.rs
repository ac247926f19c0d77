//! Where a server's (or a device's) Ed25519 key is kept: loaded from
//! `TIDINGS_SERVER_KEY_FILE`, or generated once into the data directory
//! (`server.key`, PKCS#8 PEM, mode 0600). `tidings listen` and `tidings
//! subscribe` keep a device's key the same way ([`open`]). What the key
//! signs and the identity entity it names are the protocol crate's
//! ([`ServerIdentity`]).

use std::path::Path;

use anyhow::Context as _;
use ed25519_dalek::SigningKey;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use tidings_protocol::identity::ServerIdentity;

/// Loads `key_file`, or `data_dir/server.key`, creating it on first start.
pub fn load_or_create(key_file: Option<&Path>, data_dir: &Path) -> anyhow::Result<ServerIdentity> {
    match key_file {
        Some(path) => {
            anyhow::ensure!(path.exists(), "TIDINGS_SERVER_KEY_FILE {} does not exist", path.display());
            open(path)
        }
        None => {
            std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
            open(&data_dir.join("server.key"))
        }
    }
}

/// Loads the key at `path`, generating it there (mode 0600) when the file
/// does not exist.
pub fn open(path: &Path) -> anyhow::Result<ServerIdentity> {
    let read = |path: &Path| -> anyhow::Result<SigningKey> {
        let pem = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        SigningKey::from_pkcs8_pem(&pem).map_err(|e| anyhow::anyhow!("{} is not an Ed25519 PKCS#8 key: {e}", path.display()))
    };
    if path.exists() {
        return Ok(ServerIdentity::from_key(read(path)?));
    }
    let key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let pem = key.to_pkcs8_pem(LineEnding::LF).map_err(|e| anyhow::anyhow!("encoding the key: {e}"))?;
    match write_private(path, pem.as_bytes()) {
        Ok(()) => {
            tracing::info!(path = %path.display(), "generated an identity key");
            Ok(ServerIdentity::from_key(key))
        }
        // Another process sharing this directory (several servers on one
        // PostgreSQL) created it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(ServerIdentity::from_key(read(path)?)),
        Err(e) => Err(e).with_context(|| format!("writing {}", path.display())),
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn generated_once_private_then_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(None, dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join("server.key")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only its owner reads the key");
        let again = load_or_create(None, dir.path()).unwrap();
        assert_eq!(first.hash(), again.hash(), "the same key after a restart");
        assert!(load_or_create(Some(&dir.path().join("missing.key")), dir.path()).is_err(), "a named file must exist");
        std::fs::write(dir.path().join("bad.key"), "not a key").unwrap();
        assert!(open(&dir.path().join("bad.key")).is_err());
    }
}
