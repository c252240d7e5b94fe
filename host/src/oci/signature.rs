//! Cosign-compatible signatures of plugin artifacts, checked offline with a public key.
//!
//! Cosign's format (the one `cosign sign --key` writes by default, and `cosign verify --key`
//! reads): the signatures of the artifact whose manifest has digest `sha256:<hex>` are the
//! layers of the manifest tagged `sha256-<hex>.sig` in the same repository. Each layer
//! (media type [`SIMPLE_SIGNING_MEDIA_TYPE`]) is a "simple signing" payload — JSON naming the
//! signed manifest digest under `critical.image.docker-manifest-digest` — and carries in its
//! annotation [`SIGNATURE_ANNOTATION`] the base64 ECDSA P-256 / SHA-256 signature (ASN.1
//! DER) of the payload's bytes.
//!
//! The `sigstore` crate implements this inside its cosign client, but only together with
//! its Fulcio, Rekor and OAuth clients and a TLS stack of its own; what offline verification
//! with a key needs is the signature check below and the payload's digest check.
//!
//! Invariants: an artifact is accepted only if, for every required key, some payload (a)
//! hashes to its layer's digest, (b) carries a signature that verifies over its exact bytes
//! with that key, and (c) names exactly the artifact's manifest digest with cosign's type;
//! anything else is refused with the reason for each signature looked at. Transparency log
//! entries (Rekor bundles) are not checked: this is `cosign verify --insecure-ignore-tlog`.

use base64::Engine as _;
use p256::ecdsa::DerSignature;
use p256::ecdsa::signature::{Signer, Verifier};
use serde::{Deserialize, Serialize};

use super::digest::Digest;
use super::keys::{SigningKey, VerifyKey};

/// Media type of a simple-signing payload layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// `critical.type` of a cosign payload.
const COSIGN_TYPE: &str = "cosign container image signature";

/// The tag cosign keeps the signatures of `digest` under.
pub fn signature_tag(digest: &Digest) -> String {
    format!("sha256-{}.sig", digest.hex())
}

/// The simple-signing payload, as cosign writes it.
#[derive(Serialize, Deserialize)]
struct Payload {
    critical: Critical,
    #[serde(default)]
    optional: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Serialize, Deserialize)]
struct Critical {
    identity: Identity,
    image: Image,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Serialize, Deserialize)]
struct Identity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Serialize, Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The payload signing the manifest `digest` of the repository `repository`
/// (`registry/repository`), byte for byte as cosign writes it.
pub fn payload(repository: &str, digest: &Digest) -> Vec<u8> {
    let p = Payload {
        critical: Critical {
            identity: Identity { docker_reference: repository.to_owned() },
            image: Image { docker_manifest_digest: digest.to_string() },
            kind: COSIGN_TYPE.to_owned(),
        },
        optional: None,
    };
    serde_json::to_vec(&p).unwrap_or_default()
}

/// The base64 signature of `payload` by `key`, for the layer's annotation.
pub fn sign(key: &SigningKey, payload: &[u8]) -> String {
    let signature: DerSignature = key.ecdsa().sign(payload);
    base64::engine::general_purpose::STANDARD.encode(signature.as_bytes())
}

/// One signature layer as found in a signature manifest.
#[derive(Clone, Debug)]
pub struct SignedPayload {
    /// The layer's digest (the payload must hash to it).
    pub digest: Digest,
    pub payload: Vec<u8>,
    /// The annotation's value (base64), if the layer had one.
    pub signature: Option<String>,
}

/// Why an artifact's signatures do not satisfy the keys.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("{artifact} is not signed: there is no cosign signature manifest at `{tag}`")]
    Unsigned { artifact: String, tag: String },
    #[error("no signature of {artifact} verifies with the key {key} ({})", reasons.join("; "))]
    NoValidSignature { artifact: String, key: String, reasons: Vec<String> },
}

/// Checks that, for every key, one of `signed` is a valid signature of manifest `digest`.
/// `artifact` names it in errors.
pub fn verify(
    artifact: &str,
    digest: &Digest,
    signed: &[SignedPayload],
    keys: &[VerifyKey],
) -> Result<(), SignatureError> {
    for key in keys {
        let mut reasons = Vec::new();
        let ok = signed.iter().any(|s| match check_one(digest, s, key) {
            Ok(()) => true,
            Err(why) => {
                reasons.push(format!("layer {}: {why}", s.digest.short()));
                false
            }
        });
        if !ok {
            if reasons.is_empty() {
                reasons.push("the signature manifest has no simple-signing layers".into());
            }
            return Err(SignatureError::NoValidSignature {
                artifact: artifact.to_owned(),
                key: key.origin().to_owned(),
                reasons,
            });
        }
    }
    Ok(())
}

fn check_one(digest: &Digest, s: &SignedPayload, key: &VerifyKey) -> Result<(), String> {
    s.digest.verify(&s.payload).map_err(|e| e.to_string())?;
    let Some(b64) = &s.signature else { return Err("no signature annotation".into()) };
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| "the signature annotation is not base64".to_owned())?;
    let signature =
        DerSignature::from_bytes(&der).map_err(|_| "the signature is not an ECDSA signature".to_owned())?;
    key.ecdsa()
        .verify(&s.payload, &signature)
        .map_err(|_| "the signature does not verify with this key".to_owned())?;
    let p: Payload =
        serde_json::from_slice(&s.payload).map_err(|e| format!("the payload is not cosign's: {e}"))?;
    if p.critical.kind != COSIGN_TYPE {
        return Err(format!("the payload's type is `{}`, not `{COSIGN_TYPE}`", p.critical.kind));
    }
    if p.critical.image.docker_manifest_digest != digest.to_string() {
        return Err(format!("it signs {}, another manifest", p.critical.image.docker_manifest_digest));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR_PUB: &str = include_str!("testdata/cosign/cosign.pub");
    const VECTOR_SIG_MANIFEST: &str = include_str!("testdata/cosign/sig-manifest.json");
    const VECTOR_PAYLOADS: [&str; 2] =
        [include_str!("testdata/cosign/payload-1.json"), include_str!("testdata/cosign/payload-2.json")];
    const VECTOR_ARTIFACT: &str = include_str!("testdata/cosign/manifest.json");

    /// The vector's signature layers, as the host reads them from a registry.
    fn vector_layers() -> Vec<SignedPayload> {
        let m: oci_client::manifest::OciImageManifest = serde_json::from_str(VECTOR_SIG_MANIFEST).unwrap();
        m.layers
            .iter()
            .map(|l| {
                let digest: Digest = l.digest.parse().unwrap();
                let payload = VECTOR_PAYLOADS
                    .iter()
                    .map(|p| p.as_bytes().to_vec())
                    .find(|p| Digest::of(p) == digest)
                    .expect("the payload of each layer is in the vector");
                let signature = l.annotations.as_ref().and_then(|a| a.get(SIGNATURE_ANNOTATION)).cloned();
                SignedPayload { digest, payload, signature }
            })
            .collect()
    }

    #[test]
    fn accepts_signatures_cosign_made_and_writes_its_payload_byte_for_byte() {
        let artifact = Digest::of(VECTOR_ARTIFACT.as_bytes());
        let key = VerifyKey::from_pem(VECTOR_PUB, "cosign.pub").unwrap();
        let layers = vector_layers();
        assert_eq!(layers.len(), 2);
        verify("vectors/plugin", &artifact, &layers, std::slice::from_ref(&key)).unwrap();
        // Each of cosign's signatures verifies on its own.
        for l in &layers {
            verify("vectors/plugin", &artifact, std::slice::from_ref(l), std::slice::from_ref(&key)).unwrap();
        }
        // The payload this module writes is the one cosign wrote (no annotations).
        assert_eq!(payload("127.0.0.1:37627/vectors/plugin", &artifact), VECTOR_PAYLOADS[0].as_bytes());
    }

    #[test]
    fn refuses_another_key_another_digest_and_tampering() {
        let artifact = Digest::of(VECTOR_ARTIFACT.as_bytes());
        let cosign_key = VerifyKey::from_pem(VECTOR_PUB, "cosign.pub").unwrap();
        let other = SigningKey::generate().verify_key("other.pub");
        let layers = vector_layers();

        let e = verify("a", &artifact, &layers, std::slice::from_ref(&other)).unwrap_err();
        assert!(e.to_string().contains("does not verify with this key"), "{e}");
        assert!(e.to_string().contains("other.pub"), "{e}");

        let e = verify("a", &Digest::of(b"another manifest"), &layers, std::slice::from_ref(&cosign_key))
            .unwrap_err();
        assert!(e.to_string().contains("another manifest"), "{e}");

        let mut tampered = layers.clone();
        for l in &mut tampered {
            l.payload =
                String::from_utf8(l.payload.clone()).unwrap().replace("vectors", "vectorz").into_bytes();
            l.digest = Digest::of(&l.payload);
        }
        let e = verify("a", &artifact, &tampered, std::slice::from_ref(&cosign_key)).unwrap_err();
        assert!(e.to_string().contains("does not verify"), "{e}");

        let mut unsigned = layers.clone();
        for l in &mut unsigned {
            l.signature = None;
        }
        assert!(verify("a", &artifact, &unsigned, std::slice::from_ref(&cosign_key)).is_err());
        assert!(verify("a", &artifact, &[], std::slice::from_ref(&cosign_key)).is_err());
        // No key: nothing is required.
        verify("a", &artifact, &[], &[]).unwrap();
    }

    #[test]
    fn our_signatures_verify_and_every_key_must_be_satisfied() {
        let artifact = Digest::of(b"manifest");
        let (a, b) = (SigningKey::generate(), SigningKey::generate());
        let p = payload("r.example.com/p", &artifact);
        let signed_by = |k: &SigningKey| SignedPayload {
            digest: Digest::of(&p),
            payload: p.clone(),
            signature: Some(sign(k, &p)),
        };
        let keys = [a.verify_key("a.pub"), b.verify_key("b.pub")];
        verify("p", &artifact, &[signed_by(&a)], &keys[..1]).unwrap();
        let e = verify("p", &artifact, &[signed_by(&a)], &keys).unwrap_err();
        assert!(e.to_string().contains("b.pub"), "{e}");
        verify("p", &artifact, &[signed_by(&a), signed_by(&b)], &keys).unwrap();
    }
}
