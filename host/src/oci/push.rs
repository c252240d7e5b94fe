//! `wasmctrl push FILE.wasm oci://registry/repository:tag [--sign-key KEY]`: publishes a
//! plugin as a Wasm OCI artifact ([`super::artifact`]) and, with a key, signs it as
//! `cosign sign --key` does ([`super::signature`]).
//!
//! Invariants: only a component is pushed; the blobs are uploaded before the manifest that
//! names them, and the tag is moved last, so a puller never sees a tag naming missing
//! content; a signature is added to the signatures already there (other keys' stay; the
//! same key signing again adds nothing), so an artifact can carry several, as with cosign.

use oci_client::manifest::{OciDescriptor, OciImageManifest};

use super::artifact::{self, ArtifactError};
use super::client::{RegistryClient, RegistryError};
use super::digest::Digest;
use super::keys::SigningKey;
use super::reference::OciReference;
use super::signature::{self, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE};

/// What was published.
#[derive(Clone, Debug)]
pub struct PushOutcome {
    /// The artifact, pinned to its manifest digest.
    pub reference: OciReference,
    /// The component's layer.
    pub layer: Digest,
    /// Where the signature went (`...:sha256-<hex>.sig`), when signed.
    pub signatures: Option<OciReference>,
}

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error("{0}: push to a tag (`oci://registry/repository:tag`), not a digest")]
    Pinned(String),
    #[error("the existing signatures at {tag} are not an image manifest: {why}")]
    Signatures { tag: String, why: String },
}

/// Publishes the component `wasm` (its file named `title`) at `reference` (a tag), signed
/// with `key` when given.
pub async fn push_plugin(
    client: &RegistryClient,
    wasm: Vec<u8>,
    title: &str,
    reference: &OciReference,
    key: Option<&SigningKey>,
) -> Result<PushOutcome, PushError> {
    if reference.digest().is_some() {
        return Err(PushError::Pinned(reference.to_string()));
    }
    let config = artifact::config_for(&wasm, chrono::Utc::now())?;
    let config = serde_json::to_vec(&config).map_err(|e| ArtifactError::NotAComponent(e.to_string()))?;
    let manifest = artifact::manifest_for(&config, &wasm, title);
    let manifest = serde_json::to_vec(&manifest).map_err(|e| ArtifactError::NotAManifest(e.to_string()))?;
    let layer = client.push_blob(reference, wasm).await?;
    client.push_blob(reference, config).await?;
    let digest = client.push_manifest(reference, manifest).await?;
    let signatures = match key {
        Some(key) => Some(sign_artifact(client, reference, &digest, key).await?),
        None => None,
    };
    Ok(PushOutcome { reference: reference.with_digest(digest), layer, signatures })
}

/// Adds `key`'s cosign signature of manifest `digest` to `reference`'s repository.
pub async fn sign_artifact(
    client: &RegistryClient,
    reference: &OciReference,
    digest: &Digest,
    key: &SigningKey,
) -> Result<OciReference, PushError> {
    let tag = reference.with_tag(&signature::signature_tag(digest));
    let payload = signature::payload(&reference.repository_path(), digest);
    let payload_digest = Digest::of(&payload);
    let mut layer = OciDescriptor {
        media_type: SIMPLE_SIGNING_MEDIA_TYPE.to_owned(),
        digest: payload_digest.to_string(),
        size: payload.len() as i64,
        urls: None,
        annotations: None,
        artifact_type: None,
    };
    layer.annotations =
        Some([(SIGNATURE_ANNOTATION.to_owned(), signature::sign(key, &payload))].into_iter().collect());
    let mut layers: Vec<OciDescriptor> = match client.manifest_if_any(&tag).await? {
        Some((bytes, _)) => {
            let existing: OciImageManifest = serde_json::from_slice(&bytes)
                .map_err(|e| PushError::Signatures { tag: tag.to_string(), why: e.to_string() })?;
            // Every key signs the same payload, so layers share a digest and differ in their
            // signature; only this very signature (ECDSA here is deterministic) is not added twice.
            existing
                .layers
                .into_iter()
                .filter(|l| !(l.digest == layer.digest && l.annotations == layer.annotations))
                .collect()
        }
        None => Vec::new(),
    };
    layers.push(layer);
    client.push_blob(reference, payload).await?;
    // The config cosign writes for a signature image: one empty history entry and one
    // diff ID per layer.
    let zero = "0001-01-01T00:00:00Z";
    let config = serde_json::json!({
        "architecture": "",
        "created": zero,
        "history": layers.iter().map(|_| serde_json::json!({"created": zero})).collect::<Vec<_>>(),
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.digest.clone()).collect::<Vec<_>>()},
        "config": {},
    });
    let config = serde_json::to_vec(&config).map_err(|e| ArtifactError::NotAManifest(e.to_string()))?;
    let config_descriptor = OciDescriptor {
        media_type: oci_client::manifest::IMAGE_CONFIG_MEDIA_TYPE.to_owned(),
        digest: Digest::of(&config).to_string(),
        size: config.len() as i64,
        urls: None,
        annotations: None,
        artifact_type: None,
    };
    client.push_blob(reference, config).await?;
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(artifact::MANIFEST_MEDIA_TYPE.to_owned()),
        config: config_descriptor,
        layers,
        subject: None,
        artifact_type: None,
        annotations: None,
    };
    let manifest = serde_json::to_vec(&manifest).map_err(|e| ArtifactError::NotAManifest(e.to_string()))?;
    client.push_manifest(&tag, manifest).await?;
    Ok(tag)
}
