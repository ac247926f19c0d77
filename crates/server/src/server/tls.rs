//! TLS for the listener: the certificate chain and key of
//! `TIDINGS_TLS_CERT_FILE` / `TIDINGS_TLS_KEY_FILE` (PEM), served with
//! rustls, ALPN `h2` then `http/1.1`; `SIGHUP` reads them again
//! ([`Certificates::reload`]) without touching open connections.
//!
//! Why rustls (through `tokio-rustls`, with the `ring` provider): memory-safe,
//! no system OpenSSL to install or match, the TLS stack hyper and axum users
//! reach for; `ring` builds with the C compiler the embedded store already
//! needs (aws-lc-rs would add CMake). PEM parsing is rustls' own
//! (`pki_types::pem`), so no separate parser crate.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
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

/// The certificate the listener presents, replaceable while it serves:
/// every handshake asks for the current one, so a reload reaches new
/// connections at once and leaves open ones (and their streams) alone.
#[derive(Debug)]
pub struct Certificates {
    cert_file: PathBuf,
    key_file: PathBuf,
    provider: Arc<rustls::crypto::CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificates {
    /// Reads the certificate chain and key again; on any error the one in
    /// use stays (and the error says why).
    pub fn reload(&self) -> Result<(), TlsError> {
        let key = certified(&self.cert_file, &self.key_file, &self.provider)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        Ok(())
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

fn certified(cert_file: &Path, key_file: &Path, provider: &rustls::crypto::CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| file_error(cert_file, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(cert_file, e))?;
    if certs.is_empty() {
        return Err(file_error(cert_file, "no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| file_error(key_file, e))?;
    let key = CertifiedKey::from_der(certs, key, provider)?;
    Ok(key)
}

/// The server configuration of a certificate chain and its key (ALPN
/// offers HTTP/2 first, then HTTP/1.1), and the handle that reloads them.
pub fn load(cert_file: &Path, key_file: &Path) -> Result<(Arc<ServerConfig>, Arc<Certificates>), TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = certified(cert_file, key_file, &provider)?;
    let certificates = Arc::new(Certificates {
        cert_file: cert_file.to_owned(),
        key_file: key_file.to_owned(),
        provider: provider.clone(),
        current: RwLock::new(Arc::new(key)),
    });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(certificates.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((Arc::new(config), certificates))
}
