//! TLS for the listener: the certificate chain and key of
//! `TIDINGS_TLS_CERT_FILE` / `TIDINGS_TLS_KEY_FILE` (PEM), served with
//! rustls, ALPN `h2` then `http/1.1`.
//!
//! Why rustls (through `tokio-rustls`, with the `ring` provider): memory-safe,
//! no system OpenSSL to install or match, the TLS stack hyper and axum users
//! reach for; `ring` builds with the C compiler the embedded store already
//! needs (aws-lc-rs would add CMake). PEM parsing is rustls' own
//! (`pki_types::pem`), so no separate parser crate.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ServerConfig};

/// Why the certificate or key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// rustls refused the pair (a key that does not match, say).
    #[error("the certificate and key do not make a TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

fn file_error(path: &Path, why: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.display().to_string(), why: why.to_string() }
}

/// The server configuration of a certificate chain and its key: ALPN
/// offers HTTP/2 first, then HTTP/1.1.
pub fn load(cert_file: &Path, key_file: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| file_error(cert_file, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(cert_file, e))?;
    if certs.is_empty() {
        return Err(file_error(cert_file, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| file_error(key_file, e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
