//! The registry client: `oci-client` (the OCI distribution client of the ORAS project) with
//! the host's TLS, credentials and limits.
//!
//! Invariants: HTTPS, verified against the system's roots plus the configured CAs, except
//! for registries named in `insecure-registries`, which must be loopback hosts; rustls
//! runs on ring, the provider the rest of the host uses; credentials come from the
//! configured file as it is now (a changed file gives a fresh client, so rotated
//! credentials apply and no token of the old ones is reused); every manifest and blob
//! returned was checked against its digest, and no blob larger than the caller's cap is
//! held in memory; every error says what was being fetched, from where, and whether trying
//! again later can help ([`RegistryError::is_transient`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use parking_lot::Mutex;

use super::credentials::{CredentialsError, CredentialsFile, RegistryCredentials};
use super::digest::Digest;
use super::reference::{OciReference, is_loopback_registry};

/// How to reach registries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryOptions {
    /// Registries (`host:port`) reached over plain HTTP. Each must be a loopback host.
    pub insecure_registries: Vec<String>,
    /// PEM files of CAs trusted besides the system's.
    pub ca_certificates: Vec<PathBuf>,
    /// A Docker `config.json` / `.dockerconfigjson` with registry credentials.
    pub credentials: Option<PathBuf>,
}

/// Manifests larger than this are refused (the distribution spec's registries accept 4 MiB).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Connecting to a registry must take less than this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A registry silent for this long during a request fails it.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{what} {reference}: not found in the registry")]
    NotFound { what: &'static str, reference: String },
    #[error(
        "{what} {reference}: the registry denied access ({detail}); check the credentials in `[oci] credentials`"
    )]
    Denied { what: &'static str, reference: String, detail: String },
    #[error("{what} {reference}: the registry is unreachable or failing: {detail}")]
    Unavailable { what: &'static str, reference: String, detail: String },
    #[error("{what} {reference}: {detail}")]
    Invalid { what: &'static str, reference: String, detail: String },
    #[error(transparent)]
    Credentials(#[from] CredentialsError),
    #[error("registry client: {0}")]
    Setup(String),
}

impl RegistryError {
    /// Whether the same request may succeed later without any change on this side (the
    /// registry was down, the tag did not exist yet, credentials were refused and may be
    /// rotated); content that failed a check is not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RegistryError::NotFound { .. }
                | RegistryError::Denied { .. }
                | RegistryError::Unavailable { .. }
                | RegistryError::Credentials(_)
        )
    }

    fn from_oci(what: &'static str, reference: &str, e: OciDistributionError) -> RegistryError {
        let reference = reference.to_owned();
        let detail = e.to_string();
        let codes: Vec<&OciErrorCode> = match &e {
            OciDistributionError::RegistryError { envelope, .. } => {
                envelope.errors.iter().map(|e| &e.code).collect()
            }
            _ => Vec::new(),
        };
        let code_is = |wanted: &[OciErrorCode]| codes.iter().any(|c| wanted.contains(c));
        match &e {
            OciDistributionError::RegistryError { .. }
                if code_is(&[
                    OciErrorCode::ManifestUnknown,
                    OciErrorCode::NameUnknown,
                    OciErrorCode::NotFound,
                    OciErrorCode::BlobUnknown,
                ]) =>
            {
                RegistryError::NotFound { what, reference }
            }
            OciDistributionError::RegistryError { .. }
                if code_is(&[OciErrorCode::Unauthorized, OciErrorCode::Denied]) =>
            {
                RegistryError::Denied { what, reference, detail }
            }
            OciDistributionError::RegistryError { .. } if code_is(&[OciErrorCode::Toomanyrequests]) => {
                RegistryError::Unavailable { what, reference, detail }
            }
            OciDistributionError::ServerError { code: 404, .. } => {
                RegistryError::NotFound { what, reference }
            }
            OciDistributionError::ServerError { code: 401 | 403, .. }
            | OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => {
                RegistryError::Denied { what, reference, detail }
            }
            OciDistributionError::ServerError { code, .. }
                if *code == 408 || *code == 429 || *code >= 500 =>
            {
                RegistryError::Unavailable { what, reference, detail }
            }
            // Connection refused, reset, timed out; bytes damaged on the way.
            OciDistributionError::RequestError(_)
            | OciDistributionError::IoError(_)
            | OciDistributionError::DigestError(_) => RegistryError::Unavailable { what, reference, detail },
            _ => RegistryError::Invalid { what, reference, detail },
        }
    }
}

/// Refuses an `insecure-registries` entry that is not a loopback host.
pub fn check_insecure_registry(registry: &str) -> Result<(), String> {
    if is_loopback_registry(registry) {
        Ok(())
    } else {
        Err(format!(
            "`{registry}` is not a loopback registry: plain HTTP is allowed only for localhost, 127.0.0.0/8 and [::1]; give other registries TLS (and `ca-certificates` for a private CA)"
        ))
    }
}

/// Makes ring rustls's process-wide default, unless a provider is already installed:
/// `oci-client`'s HTTP client (reqwest, built without a provider of its own) takes it.
fn install_ring() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for every configured registry. Cheap to clone.
#[derive(Clone)]
pub struct RegistryClient {
    inner: Arc<Inner>,
}

struct Inner {
    options: RegistryOptions,
    roots: Vec<Certificate>,
    credentials: Option<CredentialsFile>,
    /// The client built for the credentials as last read.
    current: Mutex<Option<(Option<Arc<RegistryCredentials>>, oci_client::Client)>>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient").field("options", &self.inner.options).finish_non_exhaustive()
    }
}

impl RegistryClient {
    /// A client with `options`; reads the CA files now (the credentials when used).
    pub fn new(options: RegistryOptions) -> Result<RegistryClient, RegistryError> {
        for r in &options.insecure_registries {
            check_insecure_registry(r).map_err(RegistryError::Setup)?;
        }
        let mut roots = Vec::new();
        for path in &options.ca_certificates {
            let data = std::fs::read(path).map_err(|e| {
                RegistryError::Setup(format!("reading CA certificates {}: {e}", path.display()))
            })?;
            roots.push(Certificate { encoding: CertificateEncoding::Pem, data });
        }
        install_ring();
        let credentials = options.credentials.as_ref().map(CredentialsFile::new);
        let client = RegistryClient {
            inner: Arc::new(Inner { options, roots, credentials, current: Mutex::new(None) }),
        };
        // Build once now, so a bad CA file or TLS setup fails at start, not at first pull.
        client.build()?;
        Ok(client)
    }

    fn build(&self) -> Result<oci_client::Client, RegistryError> {
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(self.inner.options.insecure_registries.clone()),
            extra_root_certificates: self.inner.roots.clone(),
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            user_agent: concat!("wasmctrl/", env!("CARGO_PKG_VERSION")),
            // A plugin is one artifact, never an index to pick a platform from.
            platform_resolver: None,
            ..ClientConfig::default()
        };
        oci_client::Client::try_from(config).map_err(|e| RegistryError::Setup(e.to_string()))
    }

    /// The client for the current credentials and the authentication for `registry`.
    fn client_for(&self, registry: &str) -> Result<(oci_client::Client, RegistryAuth), RegistryError> {
        let creds = match &self.inner.credentials {
            Some(file) => Some(file.current()?),
            None => None,
        };
        let auth = match &creds {
            Some(c) => c.for_registry(registry)?,
            None => RegistryAuth::Anonymous,
        };
        let mut current = self.inner.current.lock();
        let same = |c: &Option<Arc<RegistryCredentials>>| match (c, &creds) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if let Some((c, client)) = &*current
            && same(c)
        {
            return Ok((client.clone(), auth));
        }
        let client = self.build()?;
        *current = Some((creds, client.clone()));
        Ok((client, auth))
    }

    /// The digest the tag of `reference` names now.
    pub async fn resolve(&self, reference: &OciReference) -> Result<Digest, RegistryError> {
        const WHAT: &str = "resolving";
        let shown = reference.to_string();
        let (client, auth) = self.client_for(reference.registry())?;
        let digest = client
            .fetch_manifest_digest(&reference.to_client(), &auth)
            .await
            .map_err(|e| RegistryError::from_oci(WHAT, &shown, e))?;
        digest.parse().map_err(|e: super::digest::DigestParseError| RegistryError::Invalid {
            what: WHAT,
            reference: shown,
            detail: format!("the registry answered with {e}"),
        })
    }

    /// The manifest `digest` of `reference`'s repository, checked against its digest.
    pub async fn manifest(
        &self,
        reference: &OciReference,
        digest: &Digest,
    ) -> Result<Vec<u8>, RegistryError> {
        self.manifest_raw(&reference.with_digest(*digest), "pulling manifest").await.map(|(bytes, _)| bytes)
    }

    /// The manifest a tag or digest reference names, with its digest; `Ok(None)` when the
    /// registry has none.
    pub async fn manifest_if_any(
        &self,
        reference: &OciReference,
    ) -> Result<Option<(Vec<u8>, Digest)>, RegistryError> {
        match self.manifest_raw(reference, "pulling manifest").await {
            Ok(found) => Ok(Some(found)),
            Err(RegistryError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn manifest_raw(
        &self,
        reference: &OciReference,
        what: &'static str,
    ) -> Result<(Vec<u8>, Digest), RegistryError> {
        let shown = reference.to_string();
        let (client, auth) = self.client_for(reference.registry())?;
        let (bytes, digest) = client
            .pull_manifest_raw(
                &reference.to_client(),
                &auth,
                &[
                    oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
                    oci_client::manifest::IMAGE_MANIFEST_MEDIA_TYPE,
                    oci_client::manifest::OCI_IMAGE_INDEX_MEDIA_TYPE,
                    oci_client::manifest::IMAGE_MANIFEST_LIST_MEDIA_TYPE,
                ],
            )
            .await
            .map_err(|e| RegistryError::from_oci(what, &shown, e))?;
        let invalid = |detail: String| RegistryError::Invalid { what, reference: shown.clone(), detail };
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(invalid(format!(
                "the manifest is {} bytes, more than {MAX_MANIFEST_BYTES}",
                bytes.len()
            )));
        }
        // oci-client checked the bytes against the requested digest; check them against the
        // one returned, which is the one used from here on.
        let digest: Digest =
            digest.parse().map_err(|e| invalid(format!("the registry answered with {e}")))?;
        digest.verify(&bytes).map_err(|e| invalid(e.to_string()))?;
        if let Some(wanted) = reference.digest()
            && wanted != digest
        {
            return Err(invalid(format!("asked for {wanted}, got {digest}")));
        }
        Ok((bytes.to_vec(), digest))
    }

    /// The blob `digest` of `reference`'s repository (declared `size` bytes, at most `max`),
    /// checked against its digest.
    pub async fn blob(
        &self,
        reference: &OciReference,
        digest: &Digest,
        size: u64,
        max: u64,
    ) -> Result<Vec<u8>, RegistryError> {
        const WHAT: &str = "pulling blob";
        let shown = format!("{}@{digest}", reference.repository_path());
        let invalid =
            |detail: String| RegistryError::Invalid { what: WHAT, reference: shown.clone(), detail };
        if size > max {
            return Err(invalid(format!("{size} bytes, more than the {max} allowed")));
        }
        let (client, auth) = self.client_for(reference.registry())?;
        let image = reference.with_digest(*digest).to_client();
        // pull_blob_stream authenticates with what an earlier call stored: store it first.
        client.store_auth_if_needed(image.resolve_registry(), &auth).await;
        let digest_text = digest.to_string();
        let mut stream = client
            .pull_blob_stream(&image, digest_text.as_str())
            .await
            .map_err(|e| RegistryError::from_oci(WHAT, &shown, e))?;
        if stream.content_length.is_some_and(|len| len > max) {
            return Err(invalid(format!(
                "the registry sends {} bytes, more than {max}",
                stream.content_length.unwrap_or(0)
            )));
        }
        let mut bytes = Vec::with_capacity(size.min(max) as usize);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| RegistryError::Unavailable {
                what: WHAT,
                reference: shown.clone(),
                detail: e.to_string(),
            })?;
            if (bytes.len() + chunk.len()) as u64 > max {
                return Err(invalid(format!("the registry sent more than {max} bytes")));
            }
            bytes.extend_from_slice(&chunk);
        }
        digest.verify(&bytes).map_err(|e| RegistryError::Unavailable {
            what: WHAT,
            reference: shown.clone(),
            detail: e.to_string(),
        })?;
        Ok(bytes)
    }

    /// Uploads `bytes` as a blob of `reference`'s repository (unless it is there); returns
    /// its digest.
    pub async fn push_blob(&self, reference: &OciReference, bytes: Vec<u8>) -> Result<Digest, RegistryError> {
        const WHAT: &str = "pushing blob to";
        let digest = Digest::of(&bytes);
        let shown = reference.repository_path();
        let (client, auth) = self.client_for(reference.registry())?;
        let image = reference.to_client();
        client.store_auth_if_needed(image.resolve_registry(), &auth).await;
        let digest_text = digest.to_string();
        match client.blob_exists(&image, &digest_text).await {
            Ok(true) => return Ok(digest),
            Ok(false) => {}
            Err(e) => return Err(RegistryError::from_oci(WHAT, &shown, e)),
        }
        client
            .push_blob(&image, bytes, &digest_text)
            .await
            .map_err(|e| RegistryError::from_oci(WHAT, &shown, e))?;
        Ok(digest)
    }

    /// Uploads `manifest` (an OCI image manifest, exactly these bytes) as `reference`'s tag;
    /// returns its digest.
    pub async fn push_manifest(
        &self,
        reference: &OciReference,
        manifest: Vec<u8>,
    ) -> Result<Digest, RegistryError> {
        const WHAT: &str = "pushing manifest to";
        let digest = Digest::of(&manifest);
        let shown = reference.to_string();
        let (client, auth) = self.client_for(reference.registry())?;
        let image = reference.to_client();
        client.store_auth_if_needed(image.resolve_registry(), &auth).await;
        let content_type = http::HeaderValue::from_static(oci_client::manifest::OCI_IMAGE_MEDIA_TYPE);
        client
            .push_manifest_raw(&image, manifest, content_type)
            .await
            .map_err(|e| RegistryError::from_oci(WHAT, &shown, e))?;
        Ok(digest)
    }
}
