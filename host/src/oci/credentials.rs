//! Registry credentials from a Docker `config.json`, the format of a Kubernetes
//! `kubernetes.io/dockerconfigjson` Secret (an imagePullSecret) — mount the Secret and name
//! its `.dockerconfigjson` file — or of the older `.dockercfg`.
//!
//! Hand-written because what exists on crates.io (`docker_credential`) reads only
//! `$DOCKER_CONFIG/config.json` and runs credential helpers; the host reads the one file its
//! TOML names and runs no programs, so `credsStore` / `credHelpers` are not used.
//!
//! Invariants: registry keys are matched as Docker matches them (scheme and path dropped,
//! case ignored, the Docker Hub aliases as one); a secret never appears in an error or a log
//! line; the file is read again when it changes (a Secret volume update swaps it), so
//! rotated credentials apply without a restart.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;
use parking_lot::Mutex;
use serde::Deserialize;

/// Why credentials could not be read or used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("registry credentials {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registry credentials {path}: not a Docker config.json (or .dockercfg): {why}")]
    Format { path: PathBuf, why: String },
    #[error(
        "registry credentials {path}: the entry for {registry} has an `auth` that is not base64 of `user:password`"
    )]
    BadAuth { path: PathBuf, registry: String },
    #[error(
        "registry credentials {path}: the entry for {registry} holds an identity token, which wasmctrl cannot exchange; give a username and password (or a registry token)"
    )]
    IdentityToken { path: PathBuf, registry: String },
}

/// One registry's entry.
#[derive(Clone, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
    #[serde(default)]
    registrytoken: Option<String>,
}

/// The credentials of one file, by registry.
#[derive(Clone, Default)]
pub struct RegistryCredentials {
    path: PathBuf,
    entries: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The registries only, never the secrets.
        f.debug_struct("RegistryCredentials")
            .field("path", &self.path)
            .field("registries", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `https://index.docker.io/v1/` → `docker.io`; `http://localhost:5000/x` → `localhost:5000`.
fn normalize(key: &str) -> String {
    let key = key.trim();
    let key = key.strip_prefix("https://").or_else(|| key.strip_prefix("http://")).unwrap_or(key);
    let host = key.split('/').next().unwrap_or_default().to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io".to_owned(),
        _ => host,
    }
}

impl RegistryCredentials {
    /// Parses the text of a `config.json` (`{"auths": {...}}`) or `.dockercfg` (the map alone).
    pub fn parse(path: &Path, text: &[u8]) -> Result<RegistryCredentials, CredentialsError> {
        let format = |why: String| CredentialsError::Format { path: path.to_owned(), why };
        let value: serde_json::Value = serde_json::from_slice(text).map_err(|e| format(e.to_string()))?;
        let serde_json::Value::Object(mut top) = value else {
            return Err(format("the top level is not an object".into()));
        };
        let map = match top.remove("auths") {
            Some(auths) => auths,
            // `.dockercfg`: the registries at the top level (helpers' keys are not registries).
            None => {
                top.retain(|k, v| {
                    v.is_object() && k != "credHelpers" && k != "HttpHeaders" && k != "proxies"
                });
                serde_json::Value::Object(top)
            }
        };
        let raw: BTreeMap<String, Entry> =
            serde_json::from_value(map).map_err(|e| format(format!("`auths`: {e}")))?;
        let entries = raw.into_iter().map(|(k, v)| (normalize(&k), v)).collect();
        Ok(RegistryCredentials { path: path.to_owned(), entries })
    }

    /// The authentication for `registry` (`host[:port]`): anonymous when the file has no
    /// entry for it.
    pub fn for_registry(&self, registry: &str) -> Result<RegistryAuth, CredentialsError> {
        let key = normalize(registry);
        let Some(e) = self.entries.get(&key) else { return Ok(RegistryAuth::Anonymous) };
        if let Some(token) = e.registrytoken.as_deref().filter(|t| !t.is_empty()) {
            return Ok(RegistryAuth::Bearer(token.to_owned()));
        }
        if let (Some(u), Some(p)) = (&e.username, &e.password)
            && !u.is_empty()
        {
            return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
        }
        if let Some(auth) = e.auth.as_deref().filter(|a| !a.is_empty()) {
            let bad = || CredentialsError::BadAuth { path: self.path.clone(), registry: key.clone() };
            let decoded = base64::engine::general_purpose::STANDARD.decode(auth.trim()).map_err(|_| bad())?;
            let text = String::from_utf8(decoded).map_err(|_| bad())?;
            let (u, p) = text.split_once(':').ok_or_else(bad)?;
            return Ok(RegistryAuth::Basic(u.to_owned(), p.to_owned()));
        }
        if e.identitytoken.as_deref().is_some_and(|t| !t.is_empty()) {
            return Err(CredentialsError::IdentityToken { path: self.path.clone(), registry: key });
        }
        Ok(RegistryAuth::Anonymous)
    }
}

/// A credentials file, read again whenever it changes.
#[derive(Debug)]
pub struct CredentialsFile {
    path: PathBuf,
    cached: Mutex<Option<(FileId, Arc<RegistryCredentials>)>>,
}

/// What identifies one version of the file (a Secret volume swaps in a new file).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl CredentialsFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        CredentialsFile { path: path.into(), cached: Mutex::new(None) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's credentials as it is now.
    pub fn current(&self) -> Result<Arc<RegistryCredentials>, CredentialsError> {
        let read = |source| CredentialsError::Read { path: self.path.clone(), source };
        let meta = std::fs::metadata(&self.path).map_err(read)?;
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        };
        if let Some((cached, creds)) = &*self.cached.lock()
            && *cached == id
        {
            return Ok(creds.clone());
        }
        let text = std::fs::read(&self.path).map_err(read)?;
        let creds = Arc::new(RegistryCredentials::parse(&self.path, &text)?);
        *self.cached.lock() = Some((id, creds.clone()));
        Ok(creds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn basic(u: &str, p: &str) -> RegistryAuth {
        RegistryAuth::Basic(u.into(), p.into())
    }

    #[test]
    fn docker_config_json_as_docker_and_kubernetes_write_it() {
        let text = format!(
            r#"{{"auths": {{
                "ghcr.io": {{"auth": "{}"}},
                "https://index.docker.io/v1/": {{"username": "hub", "password": "hub-pw"}},
                "http://localhost:5000/ignored/path": {{"auth": "{}", "email": "x@example.com"}},
                "tokens.example.com": {{"registrytoken": "t0k"}},
                "acr.example.com": {{"identitytoken": "refresh"}}
             }}, "credsStore": "desktop"}}"#,
            b64("gh:pw:with:colons"),
            b64("local:pw"),
        );
        let c = RegistryCredentials::parse(Path::new("config.json"), text.as_bytes()).unwrap();
        assert_eq!(c.for_registry("ghcr.io").unwrap(), basic("gh", "pw:with:colons"));
        assert_eq!(c.for_registry("GHCR.IO").unwrap(), basic("gh", "pw:with:colons"));
        assert_eq!(c.for_registry("docker.io").unwrap(), basic("hub", "hub-pw"));
        assert_eq!(c.for_registry("localhost:5000").unwrap(), basic("local", "pw"));
        assert_eq!(c.for_registry("tokens.example.com").unwrap(), RegistryAuth::Bearer("t0k".into()));
        assert_eq!(c.for_registry("quay.io").unwrap(), RegistryAuth::Anonymous);
        let err = c.for_registry("acr.example.com").unwrap_err();
        assert!(err.to_string().contains("identity token"), "{err}");
    }

    proptest::proptest! {
        /// Any file content: credentials or an error, never a panic.
        #[test]
        fn any_content_parses_or_is_refused(text in "\\PC{0,200}", auth in "\\PC{0,40}") {
            let _ = RegistryCredentials::parse(Path::new("c.json"), text.as_bytes());
            let doc = serde_json::json!({"auths": {"r.example.com": {"auth": auth}}}).to_string();
            if let Ok(c) = RegistryCredentials::parse(Path::new("c.json"), doc.as_bytes()) {
                let _ = c.for_registry("r.example.com");
            }
        }
    }

    #[test]
    fn legacy_dockercfg() {
        let text = format!(r#"{{"registry.example.com": {{"auth": "{}", "email": "e"}}}}"#, b64("u:p"));
        let c = RegistryCredentials::parse(Path::new(".dockercfg"), text.as_bytes()).unwrap();
        assert_eq!(c.for_registry("registry.example.com").unwrap(), basic("u", "p"));
    }

    #[test]
    fn errors_name_the_file_and_registry_never_the_secret() {
        let e = RegistryCredentials::parse(Path::new("/s/.dockerconfigjson"), b"[1]").unwrap_err();
        assert!(e.to_string().starts_with("registry credentials /s/.dockerconfigjson: "), "{e}");
        let text = format!(r#"{{"auths": {{"r.example.com": {{"auth": "{}"}}}}}}"#, b64("no-colon-secret"));
        let c = RegistryCredentials::parse(Path::new("c.json"), text.as_bytes()).unwrap();
        let e = c.for_registry("r.example.com").unwrap_err().to_string();
        assert!(e.contains("r.example.com") && !e.contains("no-colon-secret"), "{e}");
        let text = r#"{"auths": {"r.example.com": {"username": "u", "password": "hunter2"}}}"#;
        let c = RegistryCredentials::parse(Path::new("c.json"), text.as_bytes()).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn a_changed_file_is_read_again() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("config.json");
        std::fs::write(&path, format!(r#"{{"auths": {{"r.example.com": {{"auth": "{}"}}}}}}"#, b64("a:1")))
            .unwrap();
        let file = CredentialsFile::new(&path);
        assert_eq!(file.current().unwrap().for_registry("r.example.com").unwrap(), basic("a", "1"));
        // As a Secret volume update does it: a new file renamed over the old one.
        let next = tmp.path().join("next.json");
        std::fs::write(&next, format!(r#"{{"auths": {{"r.example.com": {{"auth": "{}"}}}}}}"#, b64("b:2")))
            .unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(file.current().unwrap().for_registry("r.example.com").unwrap(), basic("b", "2"));
    }
}
