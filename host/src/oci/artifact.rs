//! The Wasm OCI artifact: how a plugin's component is laid out in a registry.
//!
//! `wasmctrl push` writes the CNCF TAG Runtime "Wasm OCI Artifact" layout, which `wkg`,
//! `oras` and the `oci-wasm` crate read: an OCI image manifest whose config has media type
//! [`WASM_CONFIG_MEDIA_TYPE`] (JSON: `created`, `architecture: "wasm"`, `os: "wasip2"`,
//! `layerDigests`, and the component's top-level `imports`/`exports`) and whose one layer
//! is the component, media type [`WASM_LAYER_MEDIA_TYPE`]. The host pulls that layout and
//! also the older `wasm-to-oci` one (Kubewarden's policies: config
//! `application/vnd.wasm.config.v1+json`, layer `application/vnd.wasm.content.layer.v1+wasm`).
//!
//! The `oci-wasm` crate writes the same config, but depends on an older `oci-client` and on
//! `wit-parser` to name the imports; the host already reads component sections with
//! `wasmparser`, so the few lines of the config are written here.
//!
//! Invariants: a pulled manifest is accepted only if it is an image manifest with a Wasm
//! config media type and exactly one Wasm layer, whose declared size is within the caller's
//! cap; only a component (not a core module) is pushed.

use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde::{Deserialize, Serialize};

use super::digest::Digest;

/// The config media type of the CNCF Wasm OCI artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of the CNCF Wasm OCI artifact.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// `wasm-to-oci`'s (and Kubewarden's) config and layer media types, read for compatibility.
const LEGACY_CONFIG_MEDIA_TYPE: &str = oci_client::manifest::WASM_CONFIG_MEDIA_TYPE;
const LEGACY_LAYER_MEDIA_TYPE: &str = oci_client::manifest::WASM_LAYER_MEDIA_TYPE;
/// The OCI image manifest media type.
pub const MANIFEST_MEDIA_TYPE: &str = oci_client::manifest::OCI_IMAGE_MEDIA_TYPE;
/// The WIT world every plugin targets (`config.component.target`).
pub const PLUGIN_WORLD: &str = "wasmctrl:controller/plugin@0.2.0";

/// Why a manifest is not a plugin, or a file cannot be pushed as one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    #[error("the manifest is not an OCI image manifest: {0}")]
    NotAManifest(String),
    #[error("not a Wasm artifact: its config media type is `{0}`, not `{WASM_CONFIG_MEDIA_TYPE}`")]
    NotWasm(String),
    #[error("the Wasm artifact has {0} Wasm layers; a plugin is exactly one component")]
    LayerCount(usize),
    #[error("the Wasm layer's digest `{0}` is not a sha256 digest")]
    LayerDigest(String),
    #[error("the Wasm layer is {size} bytes, more than the {max} allowed (`[oci] max-wasm-size`)")]
    TooLarge { size: i64, max: u64 },
    #[error("not a WebAssembly component: {0}")]
    NotAComponent(String),
}

/// The config blob (`application/vnd.wasm.config.v0+json`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WasmConfig {
    /// RFC 3339.
    pub created: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    pub architecture: String,
    pub os: String,
    pub layer_digests: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<ComponentSummary>,
}

/// What a component imports and exports at its top level.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ComponentSummary {
    pub exports: Vec<String>,
    pub imports: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// The top-level imports and exports of a component; an error when `wasm` is not one.
pub fn summarize_component(wasm: &[u8]) -> Result<ComponentSummary, ArtifactError> {
    use wasmparser::{Parser, Payload};
    if !Parser::is_component(wasm) {
        return Err(ArtifactError::NotAComponent(if Parser::is_core_wasm(wasm) {
            "a core module (build for wasm32-wasip2, or make a component with `wasm-tools component new`)"
                .into()
        } else {
            "no WebAssembly header".into()
        }));
    }
    let mut summary =
        ComponentSummary { target: Some(PLUGIN_WORLD.to_owned()), ..ComponentSummary::default() };
    // Nesting depth: only the outer component's sections name its imports and exports.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.map_err(|e| ArtifactError::NotAComponent(e.to_string()))?;
        match payload {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    let import = import.map_err(|e| ArtifactError::NotAComponent(e.to_string()))?;
                    summary.imports.push(import.name.name.to_owned());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 0 => {
                for export in reader {
                    let export = export.map_err(|e| ArtifactError::NotAComponent(e.to_string()))?;
                    summary.exports.push(export.name.name.to_owned());
                }
            }
            _ => {}
        }
    }
    Ok(summary)
}

/// The config of an artifact holding the component `wasm`.
pub fn config_for(wasm: &[u8], created: chrono::DateTime<chrono::Utc>) -> Result<WasmConfig, ArtifactError> {
    let component = summarize_component(wasm)?;
    Ok(WasmConfig {
        created: created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        author: None,
        architecture: "wasm".into(),
        os: "wasip2".into(),
        layer_digests: vec![Digest::of(wasm).to_string()],
        component: Some(component),
    })
}

/// The annotation naming a layer's file: `oras pull` writes layers by it, and skips
/// layers without one.
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";

/// The manifest of an artifact whose config blob is `config` and whose layer is `wasm`,
/// titled `title` (its file name).
pub fn manifest_for(config: &[u8], wasm: &[u8], title: &str) -> OciImageManifest {
    let descriptor = |media_type: &str, bytes: &[u8]| OciDescriptor {
        media_type: media_type.to_owned(),
        digest: Digest::of(bytes).to_string(),
        size: bytes.len() as i64,
        urls: None,
        annotations: None,
        artifact_type: None,
    };
    OciImageManifest {
        schema_version: 2,
        media_type: Some(MANIFEST_MEDIA_TYPE.to_owned()),
        config: descriptor(WASM_CONFIG_MEDIA_TYPE, config),
        layers: vec![OciDescriptor {
            annotations: Some([(TITLE_ANNOTATION.to_owned(), title.to_owned())].into_iter().collect()),
            ..descriptor(WASM_LAYER_MEDIA_TYPE, wasm)
        }],
        subject: None,
        artifact_type: None,
        annotations: None,
    }
}

/// Parses a pulled manifest.
pub fn parse_manifest(bytes: &[u8]) -> Result<OciImageManifest, ArtifactError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        #[serde(default)]
        media_type: Option<String>,
        #[serde(default)]
        manifests: Option<serde_json::Value>,
    }
    let probe: Probe =
        serde_json::from_slice(bytes).map_err(|e| ArtifactError::NotAManifest(e.to_string()))?;
    if probe.manifests.is_some() {
        return Err(ArtifactError::NotAManifest(format!(
            "it is an image index ({}); push the plugin as a single Wasm artifact",
            probe.media_type.as_deref().unwrap_or("no media type")
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| ArtifactError::NotAManifest(e.to_string()))
}

/// The component's layer of a plugin artifact, checked against `max` bytes.
pub fn wasm_layer(manifest: &OciImageManifest, max: u64) -> Result<(Digest, u64), ArtifactError> {
    let config = manifest.config.media_type.as_str();
    if config != WASM_CONFIG_MEDIA_TYPE && config != LEGACY_CONFIG_MEDIA_TYPE {
        return Err(ArtifactError::NotWasm(config.to_owned()));
    }
    let layers: Vec<&OciDescriptor> = manifest
        .layers
        .iter()
        .filter(|l| l.media_type == WASM_LAYER_MEDIA_TYPE || l.media_type == LEGACY_LAYER_MEDIA_TYPE)
        .collect();
    let [layer] = layers[..] else { return Err(ArtifactError::LayerCount(layers.len())) };
    let digest: Digest =
        layer.digest.parse().map_err(|_| ArtifactError::LayerDigest(layer.digest.clone()))?;
    if layer.size < 0 || layer.size as u64 > max {
        return Err(ArtifactError::TooLarge { size: layer.size, max });
    }
    Ok((digest, layer.size as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smallest component: the preamble of the component layer.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";

    #[test]
    fn manifest_and_config_follow_the_cncf_layout() {
        let created = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let config = config_for(EMPTY_COMPONENT, created).unwrap();
        let json = serde_json::to_value(&config).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "created": "2027-01-15T08:00:00Z",
                "architecture": "wasm",
                "os": "wasip2",
                "layerDigests": [Digest::of(EMPTY_COMPONENT).to_string()],
                "component": {"exports": [], "imports": [], "target": PLUGIN_WORLD},
            })
        );
        let config_bytes = serde_json::to_vec(&config).unwrap();
        let manifest = manifest_for(&config_bytes, EMPTY_COMPONENT, "p.wasm");
        let json = serde_json::to_value(&manifest).unwrap();
        assert_eq!(json["mediaType"], MANIFEST_MEDIA_TYPE);
        assert_eq!(json["config"]["mediaType"], "application/vnd.wasm.config.v0+json");
        assert_eq!(json["layers"][0]["mediaType"], "application/wasm");
        assert_eq!(json["layers"][0]["size"], EMPTY_COMPONENT.len());
        assert_eq!(json["layers"][0]["annotations"][TITLE_ANNOTATION], "p.wasm");
        let back = parse_manifest(&serde_json::to_vec(&manifest).unwrap()).unwrap();
        assert_eq!(wasm_layer(&back, 1 << 20).unwrap(), (Digest::of(EMPTY_COMPONENT), 8));
    }

    #[test]
    fn a_real_component_lists_its_world() {
        let wasm = wasmctrl_testkit::guests::wasm("configmap-mirror");
        let s = summarize_component(&wasm).unwrap();
        assert!(s.exports.iter().any(|e| e.starts_with("wasmctrl:controller/reconciler@")), "{s:?}");
        assert!(s.imports.iter().any(|i| i.starts_with("wasmctrl:controller/cache@")), "{s:?}");
        assert!(
            !s.imports.iter().any(|i| i.contains("canonical_abi")),
            "only the outer component's names: {s:?}"
        );
    }

    proptest::proptest! {
        /// Bytes behind a component header, and any manifest text: an answer, never a panic.
        #[test]
        fn arbitrary_components_and_manifests_never_panic(body in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let mut wasm = EMPTY_COMPONENT.to_vec();
            wasm.extend_from_slice(&body);
            let _ = summarize_component(&wasm);
            if let Ok(m) = parse_manifest(&body) {
                let _ = wasm_layer(&m, 1 << 20);
            }
        }
    }

    #[test]
    fn refuses_what_is_not_a_single_component_artifact() {
        assert!(
            matches!(summarize_component(b"\0asm\x01\0\0\0"), Err(ArtifactError::NotAComponent(m)) if m.contains("core module"))
        );
        assert!(matches!(summarize_component(b"hello"), Err(ArtifactError::NotAComponent(_))));

        let config = b"{}";
        let mut m = manifest_for(config, EMPTY_COMPONENT, "p.wasm");
        assert!(matches!(wasm_layer(&m, 4), Err(ArtifactError::TooLarge { size: 8, max: 4 })));
        m.config.media_type = "application/vnd.oci.image.config.v1+json".into();
        assert!(matches!(wasm_layer(&m, 1 << 20), Err(ArtifactError::NotWasm(_))));
        let mut two = manifest_for(config, EMPTY_COMPONENT, "p.wasm");
        two.layers.push(two.layers[0].clone());
        assert!(matches!(wasm_layer(&two, 1 << 20), Err(ArtifactError::LayerCount(2))));
        // wasm-to-oci's layout (Kubewarden) is read too.
        let mut legacy = manifest_for(config, EMPTY_COMPONENT, "p.wasm");
        legacy.config.media_type = "application/vnd.wasm.config.v1+json".into();
        legacy.layers[0].media_type = "application/vnd.wasm.content.layer.v1+wasm".into();
        assert!(wasm_layer(&legacy, 1 << 20).is_ok());
        let index =
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
        assert!(
            matches!(parse_manifest(index), Err(ArtifactError::NotAManifest(m)) if m.contains("image index"))
        );
    }
}
