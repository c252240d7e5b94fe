//! Where a plugin's code comes from: from its TOML to "these bytes, this version".
//!
//! This is the one seam between a plugin's configuration and its code. The manager asks a
//! [`CodeSource`] for the bytes and a version id and never looks at where they came from;
//! the hand-off logic works on what [`CodeSource::fetch`] returns. Today a plugin's code is a
//! `.wasm` file (its TOML's `wasm` key, or `<stem>.wasm` next to it); another origin (a
//! registry, say) is another variant with its own fetch, watch and describe.
//!
//! Invariants: a fetched version id is the content hash of exactly the bytes returned; bytes
//! are only returned when they were read whole and the file did not change while being read
//! (a writer still at it gives [`Fetched::Unsettled`]).

use std::path::{Path, PathBuf};

use super::check::version_of;
use super::scan::read_settled;
use crate::config::PluginConfig;

/// Where one plugin version's code comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodeSource {
    /// A `.wasm` file.
    File(PathBuf),
}

/// A plugin's code as fetched.
#[derive(Clone, Debug)]
pub struct Code {
    pub bytes: Vec<u8>,
    /// Short content hash of `bytes` (`version_of`).
    pub version: String,
}

/// What a fetch found.
#[derive(Debug)]
pub enum Fetched {
    Ready(Code),
    /// There is no code (yet): the file is missing.
    Missing,
    /// The code is still being written: try again after the next quiet period.
    Unsettled,
}

impl CodeSource {
    /// The source a plugin TOML names.
    pub fn of(config: &PluginConfig) -> CodeSource {
        CodeSource::File(config.wasm_path.clone())
    }

    /// Reads the code (on a blocking thread).
    pub async fn fetch(&self) -> Result<Fetched, String> {
        match self {
            CodeSource::File(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || fetch_file(&path))
                    .await
                    .map_err(|e| format!("reading the plugin's code failed: {e}"))?
            }
        }
    }

    /// The file the runtime may read the code from again (after dropping idle code), if
    /// the source is a file.
    pub fn file(&self) -> Option<&Path> {
        match self {
            CodeSource::File(path) => Some(path),
        }
    }

    /// Directories to watch for changes of this source.
    pub fn watch_dir(&self) -> Option<PathBuf> {
        match self {
            CodeSource::File(path) => path.parent().map(Path::to_path_buf),
        }
    }
}

impl std::fmt::Display for CodeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CodeSource::File(path) => write!(f, "{}", path.display()),
        }
    }
}

fn fetch_file(path: &Path) -> Result<Fetched, String> {
    match read_settled(path) {
        Ok((bytes, _)) => {
            let version = version_of(&bytes);
            Ok(Fetched::Ready(Code { bytes, version }))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Fetched::Missing),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(Fetched::Unsettled),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}
