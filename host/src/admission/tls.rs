//! The admission server's certificate: read from PEM files (as cert-manager writes a
//! Secret volume: `tls.crt`, `tls.key`, `ca.crt`) and read again whenever they change, or
//! generated at start (a CA of its own and a serving certificate for the names the API
//! server dials). The CA bundle goes into the webhook configurations.
//!
//! Invariants:
//! - A handshake always gets a complete certificate and key that belong together: a reload
//!   swaps both at once, and a reload whose files do not parse, or whose key does not match
//!   the certificate, keeps the previous pair (and says so in the log).
//! - Files are watched through their directory, so a `..data` symlink swap (Kubernetes
//!   Secret volumes) is seen as well as an in-place write.
//! - Subscribers of the CA bundle ([`ServingCert::ca_bundle_changes`]) see every change of
//!   it, so webhook configurations follow a rotated CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

/// Where the serving certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertSource {
    /// PEM files, read again when they change. `ca`: the CA bundle for the webhook
    /// configurations (`None`: none written, e.g. cert-manager's CA injector fills it).
    Files { cert: PathBuf, key: PathBuf, ca: Option<PathBuf> },
    /// A CA and a certificate for these DNS names and IP addresses, generated at start.
    Generated { names: Vec<String> },
}

/// Why the certificate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("the key in {key} cannot serve the certificate in {cert} (does it belong to it?): {reason}")]
    Mismatch { cert: PathBuf, key: PathBuf, reason: String },
    #[error("generating the admission certificate: {0}")]
    Generate(String),
    #[error("watching {dir} for certificate changes: {source}")]
    Watch {
        dir: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// The certificate the admission server presents, and the CA bundle clients trust it by.
pub struct ServingCert {
    current: Arc<ArcSwap<CertifiedKey>>,
    ca: watch::Receiver<Option<Arc<[u8]>>>,
    /// Certificate reloads that took effect (`wasmctrl_admission_certificate_reloads`).
    reloads: prometheus_client::metrics::counter::Counter,
    _watcher: Option<notify::RecommendedWatcher>,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert").finish_non_exhaustive()
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|source| CertError::Read { path: path.to_owned(), source })
}

/// The certificate chain and key of two PEM files, checked to belong together.
fn load_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, CertError> {
    let pem = |path: &Path, reason: String| CertError::Pem { path: path.to_owned(), reason };
    let cert_pem = read(cert)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| pem(cert, format!("not a PEM certificate: {e}")))?;
    if chain.is_empty() {
        return Err(pem(cert, "holds no certificate".into()));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| pem(key, format!("not a PEM private key: {e}")))?;
    let certified = CertifiedKey::from_der(chain, key_der, &provider()).map_err(|e| CertError::Mismatch {
        cert: cert.to_owned(),
        key: key.to_owned(),
        reason: e.to_string(),
    })?;
    Ok(certified)
}

fn read_ca(path: Option<&Path>) -> Result<Option<Arc<[u8]>>, CertError> {
    let Some(path) = path else { return Ok(None) };
    let bytes = read(path)?;
    if CertificateDer::pem_slice_iter(&bytes).next().is_none_or(|c| c.is_err()) {
        return Err(CertError::Pem { path: path.to_owned(), reason: "holds no PEM certificate".into() });
    }
    Ok(Some(bytes.into()))
}

impl ServingCert {
    /// Loads (or generates) the certificate; with files, follows their changes until the
    /// returned value is dropped.
    pub fn load(source: &CertSource) -> Result<Self, CertError> {
        match source {
            CertSource::Generated { names } => {
                let (key, ca_pem) = generate(names)?;
                let (_, ca) = watch::channel(Some(Arc::from(ca_pem.into_bytes())));
                Ok(ServingCert {
                    current: Arc::new(ArcSwap::from_pointee(key)),
                    ca,
                    reloads: Default::default(),
                    _watcher: None,
                })
            }
            CertSource::Files { cert, key, ca } => {
                let current = Arc::new(ArcSwap::from_pointee(load_pair(cert, key)?));
                let (ca_tx, ca_rx) = watch::channel(read_ca(ca.as_deref())?);
                let reloads = prometheus_client::metrics::counter::Counter::default();
                let watcher = watch_files(cert, key, ca.as_deref(), current.clone(), ca_tx, reloads.clone())?;
                Ok(ServingCert { current, ca: ca_rx, reloads, _watcher: Some(watcher) })
            }
        }
    }

    /// The rustls configuration presenting the current certificate (HTTP/2 and HTTP/1.1).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Current(self.current.clone())));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// The CA bundle (PEM) the webhook configurations carry, if any.
    pub fn ca_bundle(&self) -> Option<Arc<[u8]>> {
        self.ca.borrow().clone()
    }

    /// Changes of the CA bundle.
    pub fn ca_bundle_changes(&self) -> watch::Receiver<Option<Arc<[u8]>>> {
        self.ca.clone()
    }

    /// The leaf certificate served now (DER).
    pub fn leaf(&self) -> Vec<u8> {
        self.current.load().cert.first().map(|c| c.to_vec()).unwrap_or_default()
    }

    /// Reloads that took effect so far (also `wasmctrl_admission_certificate_reloads_total`).
    pub fn reloads(&self) -> prometheus_client::metrics::counter::Counter {
        self.reloads.clone()
    }
}

/// Hands every handshake the certificate current at that moment.
#[derive(Debug)]
struct Current(Arc<ArcSwap<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// Watches the directories of the files; on any change, reads them again.
fn watch_files(
    cert: &Path,
    key: &Path,
    ca: Option<&Path>,
    current: Arc<ArcSwap<CertifiedKey>>,
    ca_tx: watch::Sender<Option<Arc<[u8]>>>,
    reloads: prometheus_client::metrics::counter::Counter,
) -> Result<notify::RecommendedWatcher, CertError> {
    use notify::Watcher;
    let (cert, key, ca) = (cert.to_owned(), key.to_owned(), ca.map(Path::to_owned));
    let mut dirs: Vec<PathBuf> = [Some(&cert), Some(&key), ca.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_owned())
        .collect();
    dirs.sort();
    dirs.dedup();
    let reload = move || {
        match load_pair(&cert, &key) {
            Ok(pair) => {
                let changed = current.load().cert != pair.cert;
                if changed {
                    current.store(Arc::new(pair));
                    reloads.inc();
                    tracing::info!(cert = %cert.display(), "admission serving certificate reloaded");
                }
            }
            // Mid-update (one file written, not the other): the next event finishes it.
            Err(e) => {
                tracing::warn!(error = %e, "admission certificate not reloaded; serving the previous one")
            }
        }
        match read_ca(ca.as_deref()) {
            Ok(bundle) => {
                ca_tx.send_if_modified(|old| {
                    let changed = *old != bundle;
                    if changed {
                        *old = bundle.clone();
                    }
                    changed
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "admission CA bundle not reloaded; keeping the previous one")
            }
        }
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
        Ok(e) if !matches!(e.kind, notify::EventKind::Access(_)) => reload(),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "admission certificate watch error"),
    })
    .map_err(|source| CertError::Watch { dir: dirs[0].clone(), source })?;
    for dir in &dirs {
        watcher
            .watch(dir, notify::RecursiveMode::NonRecursive)
            .map_err(|source| CertError::Watch { dir: dir.clone(), source })?;
    }
    Ok(watcher)
}

/// A CA of its own and a serving certificate signed by it for `names` (DNS names, or IP
/// addresses); the CA's PEM.
fn generate(names: &[String]) -> Result<(CertifiedKey, String), CertError> {
    let err = |e: rcgen::Error| CertError::Generate(e.to_string());
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.distinguished_name.push(DnType::CommonName, "wasmctrl admission CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(err)?).map_err(err)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(err)?;
    params.distinguished_name.push(DnType::CommonName, names.first().map_or("wasmctrl", String::as_str));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(err)?;
    let cert = params.signed_by(&key, &ca).map_err(err)?;
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let certified = CertifiedKey::from_der(vec![cert.der().clone(), ca.der().clone()], key_der, &provider())
        .map_err(|e| CertError::Generate(e.to_string()))?;
    Ok((certified, ca.pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_certificate_names_the_addresses_and_comes_with_its_ca() {
        let cert = ServingCert::load(&CertSource::Generated {
            names: vec!["127.0.0.1".into(), "hooks.wasmctrl-system.svc".into()],
        })
        .unwrap();
        let ca = cert.ca_bundle().unwrap();
        assert!(std::str::from_utf8(&ca).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(!cert.leaf().is_empty());
        assert!(cert.server_config().is_ok());
    }

    #[test]
    fn files_that_do_not_belong_together_are_refused_with_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let params = CertificateParams::new(vec!["a.example".to_owned()]).unwrap();
        let cert = params.self_signed(&KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("tls.key"), KeyPair::generate().unwrap().serialize_pem()).unwrap();
        let files =
            CertSource::Files { cert: dir.path().join("tls.crt"), key: dir.path().join("tls.key"), ca: None };
        let e = ServingCert::load(&files).unwrap_err();
        assert!(e.to_string().contains("belong"), "{e}");
        std::fs::write(dir.path().join("tls.crt"), "garbage").unwrap();
        let e = ServingCert::load(&files).unwrap_err();
        assert!(e.to_string().contains("tls.crt"), "{e}");
    }
}
