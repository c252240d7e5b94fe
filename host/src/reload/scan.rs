//! Finding plugins in a plugins directory, shared by the manager and `wasmctrl check`.
//!
//! A plugin is a `<stem>.toml` (its `wasm` key, or `<stem>.wasm`, names the component).
//! Hidden files (`.x.wasm`), editor and copy leftovers (`x.wasm~`, `x.wasm.tmp`,
//! `x.wasm.part`, `x.wasm.swp`) are never plugins, so writing `.x.wasm.tmp` and renaming it
//! into place is the safe way to ship a new version.

use std::path::{Path, PathBuf};

/// Whether `path` is a file the manager reacts to (`*.toml` or `*.wasm`, not hidden).
pub fn is_plugin_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return false };
    if name.starts_with('.') || name.starts_with('#') {
        return false;
    }
    matches!(path.extension().and_then(|e| e.to_str()), Some("toml" | "wasm"))
}

/// The plugin TOMLs in `dir`, sorted.
pub fn plugin_tomls(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if is_plugin_file(&path) && path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// The `.wasm` files in `dir`, sorted.
pub fn wasm_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if is_plugin_file(&path) && path.extension().is_some_and(|e| e == "wasm") && path.is_file() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

/// Size and modification time: a file whose fingerprint did not change across a quiet
/// period and a full read is taken as completely written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub len: u64,
    pub modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    pub fn of(path: &Path) -> std::io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        Ok(FileStamp { len: meta.len(), modified: meta.modified().ok() })
    }
}

/// Reads `path` whole, failing with `ErrorKind::WouldBlock` when the file changed while
/// being read (a writer is still at it).
pub fn read_settled(path: &Path) -> std::io::Result<(Vec<u8>, FileStamp)> {
    let before = FileStamp::of(path)?;
    let bytes = std::fs::read(path)?;
    let after = FileStamp::of(path)?;
    if before != after || after.len != bytes.len() as u64 {
        return Err(std::io::Error::new(std::io::ErrorKind::WouldBlock, "file changed while being read"));
    }
    Ok((bytes, after))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_and_hidden_files_are_not_plugins() {
        for yes in ["a.toml", "a.wasm", "dir/b-c.wasm"] {
            assert!(is_plugin_file(Path::new(yes)), "{yes}");
        }
        for no in [
            ".a.wasm",
            ".a.wasm.tmp",
            "a.wasm.tmp",
            "a.wasm~",
            "a.wasm.part",
            "#a.toml#",
            "a.toml.swp",
            "a.txt",
        ] {
            assert!(!is_plugin_file(Path::new(no)), "{no}");
        }
    }
}
