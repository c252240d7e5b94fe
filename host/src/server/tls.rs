//! The endpoint's TLS configuration: a certificate chain and key read from PEM files, or a
//! self-signed certificate generated at start (as controller-runtime's secure metrics server
//! does when it is given no certificate).
//!
//! Invariants: only TLS 1.2 and 1.3 with rustls' safe defaults; the generated key never
//! leaves memory; a file that cannot be read or holds no certificate (or no key) is an error
//! naming the file, never a fallback to a generated certificate.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why the endpoint's TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {reason}")]
    File { path: String, reason: String },
    #[error("generating a self-signed certificate: {0}")]
    Generate(String),
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// What the endpoint presents.
#[derive(Clone)]
pub struct ServerTls {
    /// The rustls configuration (ALPN h2 and http/1.1).
    pub config: Arc<rustls::ServerConfig>,
    /// The certificate presented (the first of the chain), DER; a client that trusts it
    /// (e.g. a test) can verify the server.
    pub certificate: CertificateDer<'static>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// The chain of `cert` (PEM, leaf first) with the private key in `key` (PEM).
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let file_error =
            |path: &Path, reason: String| TlsError::File { path: path.display().to_string(), reason };
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| file_error(cert, e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file_error(cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(file_error(cert, "no PEM certificate in the file".into()));
        }
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e.to_string()))?;
        Self::new(chain, key)
    }

    /// A self-signed certificate for `localhost`, the loopback addresses and `names`.
    pub fn self_signed(names: &[String]) -> Result<Self, TlsError> {
        let mut sans = vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()];
        sans.extend(names.iter().filter(|n| !n.is_empty()).cloned());
        sans.dedup();
        let generated =
            rcgen::generate_simple_self_signed(sans).map_err(|e| TlsError::Generate(e.to_string()))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(generated.signing_key.serialize_der()));
        Self::new(vec![generated.cert.der().clone()], key)
    }

    fn new(chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> Result<Self, TlsError> {
        let certificate = chain.first().cloned().ok_or_else(|| TlsError::Config("no certificate".into()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls { config: Arc::new(config), certificate })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_hold_no_certificate_or_key_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        let (cert, key, empty) =
            (dir.path().join("tls.crt"), dir.path().join("tls.key"), dir.path().join("empty"));
        std::fs::write(&cert, generated.cert.pem()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&empty, "not PEM").unwrap_or_else(|e| panic!("{e}"));
        let tls = ServerTls::from_files(&cert, &key).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tls.certificate, *generated.cert.der());
        let error = ServerTls::from_files(&empty, &key).unwrap_err().to_string();
        assert!(error.contains("empty") && error.contains("no PEM certificate"), "{error}");
        let error = ServerTls::from_files(&cert, &empty).unwrap_err().to_string();
        assert!(error.contains("empty"), "{error}");
        let error = ServerTls::from_files(&dir.path().join("missing"), &key).unwrap_err().to_string();
        assert!(error.contains("missing"), "{error}");
    }
}
