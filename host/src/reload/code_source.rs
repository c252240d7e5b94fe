//! Where a plugin's code comes from: from its TOML to "these bytes, this version".
//!
//! This is the one seam between a plugin's configuration and its code. The manager asks a
//! [`CodeSource`] for the bytes and a version id and never looks at where they came from;
//! the hand-off logic works on what [`CodeSource::fetch`] returns. A plugin's code is a
//! `.wasm` file (its TOML's `wasm` key, or `<stem>.wasm` next to it), or a component in an
//! OCI registry (`wasm = "oci://..."`), pulled through the host's [`OciSource`] — by
//! digest, verified, kept in the local store, its tag followed. A tag that moves is, to the
//! manager, what a changed file is: the source's listener asks for a round, and the round
//! fetches the new code.
//!
//! Invariants: a fetched version id is the content hash of exactly the bytes returned; bytes
//! are only returned when they were read whole and the file did not change while being read
//! (a writer still at it gives [`Fetched::Unsettled`]), or, from a registry, when they were
//! checked against the digest that names them (and the signatures its keys require);
//! [`Code::file`] holds exactly those bytes. "Nothing there (yet)" — a missing file, a tag
//! or repository the registry does not have — is [`Fetched::Missing`], never an error.

use std::path::{Path, PathBuf};

use super::check::version_of;
use super::scan::read_settled;
use crate::config::{PluginConfig, RegistryWasm};
use crate::oci::{OciSource, VerifyKey};

/// Where one plugin version's code comes from.
#[derive(Clone, Debug)]
pub enum CodeSource {
    /// A `.wasm` file.
    File(PathBuf),
    /// A component in an OCI registry.
    Registry(Box<RegistryCode>),
}

/// A component in a registry, as one plugin TOML names it.
#[derive(Clone, Debug)]
pub struct RegistryCode {
    /// The TOML (errors are placed at its `wasm` and `verify-key` fields; the registry
    /// source follows the tag for this file).
    config: PluginConfig,
    wasm: RegistryWasm,
    /// The host's registry source (`None`: this host pulls no plugins from registries).
    registry: Option<OciSource>,
}

/// A plugin's code as fetched.
#[derive(Clone, Debug)]
pub struct Code {
    pub bytes: Vec<u8>,
    /// Short content hash of `bytes` (`version_of`).
    pub version: String,
    /// A file holding exactly `bytes` (the `.wasm`, or the blob in the registry store): read
    /// again should the compiled code be dropped while idle and the compile cache lose it.
    pub file: PathBuf,
    /// Where the code came from when that is not just `file` (shown as `source` in
    /// `/plugins`): a registry reference pinned to the manifest digest pulled.
    pub origin: Option<String>,
    /// Something worth knowing about this code while it runs (shown as `note` in
    /// `/plugins` and `/readyz`): it came from the local store because the registry could
    /// not be reached.
    pub note: Option<String>,
}

/// What a fetch found.
#[derive(Debug)]
pub enum Fetched {
    Ready(Code),
    /// There is no code (yet): the file is missing, or the registry has no such tag.
    Missing,
    /// The code is still being written: try again after the next quiet period.
    Unsettled,
}

impl CodeSource {
    /// The source a plugin TOML names; `registry` is the host's registry source, for a
    /// TOML whose `wasm` names a registry.
    pub fn of(config: &PluginConfig, registry: Option<&OciSource>) -> CodeSource {
        match &config.wasm_registry {
            Some(wasm) => CodeSource::Registry(Box::new(RegistryCode {
                config: config.clone(),
                wasm: wasm.clone(),
                registry: registry.cloned(),
            })),
            None => CodeSource::File(config.wasm_path.clone()),
        }
    }

    /// Reads (on a blocking thread) or pulls the code.
    pub async fn fetch(&self) -> Result<Fetched, String> {
        match self {
            CodeSource::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || fetch_file(&path))
                    .await
                    .map_err(|e| format!("reading the plugin's code failed: {e}"))?
            }
            CodeSource::Registry(code) => code.fetch().await,
        }
    }

    /// Whether the code is pulled from a registry: a fetch that may wait on the network
    /// (bounded by the registry client's timeouts), which the manager runs outside a
    /// plugin's lock.
    pub fn is_registry(&self) -> bool {
        matches!(self, CodeSource::Registry(_))
    }

    /// The file the code is configured to be read from, if the source is a file.
    pub fn file(&self) -> Option<&Path> {
        match self {
            CodeSource::File(path) => Some(path),
            CodeSource::Registry(_) => None,
        }
    }

    /// Where the code comes from when it is not a file of the plugins directory (shown as
    /// `source` in `/plugins`, also while waiting for it): the registry reference.
    pub fn origin(&self) -> Option<String> {
        match self {
            CodeSource::File(_) => None,
            CodeSource::Registry(code) => Some(code.wasm.reference.to_string()),
        }
    }

    /// What a running version whose code is gone from this source is told to its users.
    pub fn gone(&self) -> String {
        match self {
            CodeSource::File(path) => {
                format!("without its file: {} is gone (restore it to reload the code)", path.display())
            }
            CodeSource::Registry(code) => format!(
                "without its code in the registry: {} is gone (push it again to reload the code)",
                code.wasm.reference
            ),
        }
    }

    /// A directory to watch for changes of this source: the `.wasm`'s, or the directory of
    /// a registry component's own `verify-key` (a rotated key is checked at the next round).
    pub fn watch_dir(&self) -> Option<PathBuf> {
        match self {
            CodeSource::File(path) => path.parent().map(Path::to_path_buf),
            CodeSource::Registry(code) => {
                code.wasm.verify_key.as_deref().and_then(Path::parent).map(Path::to_path_buf)
            }
        }
    }
}

impl std::fmt::Display for CodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CodeSource::File(path) => write!(f, "{}", path.display()),
            CodeSource::Registry(code) => write!(f, "{}", code.wasm.reference),
        }
    }
}

fn fetch_file(path: &Path) -> Result<Fetched, String> {
    match read_settled(path) {
        Ok((bytes, _)) => {
            let version = version_of(&bytes);
            Ok(Fetched::Ready(Code { bytes, version, file: path.to_owned(), origin: None, note: None }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Fetched::Missing),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Fetched::Unsettled),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

impl RegistryCode {
    /// Pulls the component (by digest, verified, from the store when it is there); from
    /// then on the registry source follows the tag for this TOML.
    async fn fetch(&self) -> Result<Fetched, String> {
        let reference = &self.wasm.reference;
        let Some(registry) = &self.registry else {
            let e = format!("`{reference}` is in a registry, but this host pulls no plugins from registries");
            return Err(self.config.field_error("wasm", e).to_string());
        };
        let keys = match &self.wasm.verify_key {
            Some(path) => {
                let path = path.clone();
                let key = tokio::task::spawn_blocking(move || VerifyKey::load(&path))
                    .await
                    .map_err(|e| format!("reading the plugin's verify-key failed: {e}"))?;
                vec![key.map_err(|e| self.config.field_error("verify-key", e.to_string()).to_string())?]
            }
            None => Vec::new(),
        };
        match registry.pull(&self.config.toml_path, reference, &keys).await {
            Ok(pulled) => {
                let version = version_of(&pulled.bytes);
                let note = pulled.offline.then(|| {
                    format!(
                        "version {version} runs from the local store: the registry cannot be reached ({} is what the tag named when last resolved); the tag is followed again once the registry answers",
                        pulled.reference
                    )
                });
                Ok(Fetched::Ready(Code {
                    version,
                    bytes: pulled.bytes,
                    file: pulled.path,
                    origin: Some(pulled.reference.to_string()),
                    note,
                }))
            }
            Err(e) if e.is_not_found() => Ok(Fetched::Missing),
            Err(e) => Err(self.config.field_error("wasm", e.to_string()).to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PluginDefaults;

    fn config(dir: &Path, text: &str) -> PluginConfig {
        PluginConfig::parse(&dir.join("p.toml"), text, &PluginDefaults::default()).expect("valid TOML")
    }

    const FOR: &str = "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n";

    #[tokio::test]
    async fn a_file_source_reads_its_file_and_says_when_it_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let source = CodeSource::of(&config(dir.path(), FOR), None);
        assert!(!source.is_registry());
        assert_eq!(source.file(), Some(dir.path().join("p.wasm").as_path()));
        assert_eq!(source.origin(), None);
        assert!(matches!(source.fetch().await, Ok(Fetched::Missing)));
        std::fs::write(dir.path().join("p.wasm"), b"code").unwrap();
        let Ok(Fetched::Ready(code)) = source.fetch().await else { panic!("the file is read") };
        assert_eq!((code.bytes.as_slice(), code.version), (&b"code"[..], version_of(b"code")));
        assert_eq!((code.file, code.origin, code.note), (dir.path().join("p.wasm"), None, None));
    }

    #[tokio::test]
    async fn a_registry_source_without_a_registry_is_refused_at_its_wasm_field() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("wasm = \"oci://localhost:5000/plugins/p:v1\"\n{FOR}");
        let source = CodeSource::of(&config(dir.path(), &text), None);
        assert!(source.is_registry());
        assert_eq!(source.file(), None);
        assert_eq!(source.origin().as_deref(), Some("oci://localhost:5000/plugins/p:v1"));
        let err = source.fetch().await.expect_err("no registry source");
        assert!(
            err.contains("p.toml:1:8: `wasm`") && err.contains("pulls no plugins from registries"),
            "{err}"
        );
    }
}
