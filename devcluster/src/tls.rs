//! Self-signed TLS: a throwaway CA and a server certificate for `127.0.0.1` / `localhost`
//! signed by it, generated at start. Clients trust the CA (it goes into the kubeconfig as
//! `certificate-authority-data` and into `kube::Config::root_cert`).

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::Error;

/// The generated CA and the server's TLS configuration.
pub struct TlsMaterial {
    /// CA certificate, PEM.
    pub ca_pem: String,
    /// CA certificate, DER.
    pub ca_der: Vec<u8>,
    /// rustls server config presenting the server certificate (ALPN h2 + http/1.1).
    pub server_config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial").finish_non_exhaustive()
    }
}

fn tls_err(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

/// Generates a CA and a server certificate for the loopback names.
pub fn generate() -> Result<TlsMaterial, Error> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
    ca_params.distinguished_name.push(DnType::CommonName, "wasmctrl-devcluster-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate().map_err(tls_err)?;
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(tls_err)?;

    let mut params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).map_err(tls_err)?;
    params.distinguished_name.push(DnType::CommonName, "wasmctrl-devcluster");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(tls_err)?;
    let cert = params.signed_by(&key, &ca).map_err(tls_err)?;

    let chain = vec![cert.der().clone(), ca.der().clone()];
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(tls_err)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let ca_der: CertificateDer<'static> = ca.der().clone();
    Ok(TlsMaterial { ca_pem: ca.pem(), ca_der: ca_der.to_vec(), server_config: Arc::new(config) })
}
