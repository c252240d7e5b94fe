//! The on-disk compile cache: compiled components (`.cwasm`) by content hash and engine,
//! kept within a byte budget, least recently used first out.
//!
//! Invariants:
//! - An artifact is stored under `<dir>/<sha256 of the wasm>-<engine hash>.cwasm`, written to
//!   a temporary file and renamed, so a reader never sees half an artifact.
//! - Every use of an artifact (a cache hit) refreshes its modification time; after each
//!   store, artifacts are removed oldest first until the rest fit in the budget. The one
//!   just stored is never removed, even when it alone is over the budget. Artifacts of
//!   other engines (another wasmtime) are never used again, so they age out first.
//! - Removing an artifact in use is harmless: wasmtime maps it copy-on-write and the mapping
//!   outlives the file (the next load of those bytes compiles again).
//! - Only `*.cwasm` files are counted or removed; anything else in the directory is left.
//!   The directory is trusted: it is the host's own, like its binary.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::PluginError;

/// Default byte budget of the compile cache (the host TOML's `cache-max-size`).
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 1 << 30;

/// The compile cache in one directory.
#[derive(Clone, Debug)]
pub(crate) struct CompileCache {
    dir: PathBuf,
    max_bytes: u64,
}

impl CompileCache {
    pub fn new(dir: PathBuf, max_bytes: u64) -> Self {
        CompileCache { dir, max_bytes }
    }

    /// Where the artifact of the wasm with hex SHA-256 `hash` for engine `engine_hash` lives.
    pub fn path_of(&self, hash: &str, engine_hash: &str) -> PathBuf {
        self.dir.join(format!("{hash}-{engine_hash}.cwasm"))
    }

    /// Marks `path` as just used (it moves to the back of the eviction order).
    pub fn touch(&self, path: &Path) {
        let now = SystemTime::now();
        if let Err(e) = std::fs::File::options().write(true).open(path).and_then(|f| f.set_modified(now)) {
            tracing::debug!(path = %path.display(), error = %e, "cannot refresh a cached artifact's time");
        }
    }

    /// Writes `bytes` to `path` atomically, then evicts down to the budget.
    pub fn store(&self, path: &Path, bytes: &[u8]) -> Result<(), PluginError> {
        self.write_atomically(path, bytes)?;
        let removed = self.evict(path);
        if removed > 0 {
            tracing::info!(dir = %self.dir.display(), removed, max_bytes = self.max_bytes, "compile cache: removed least recently used artifacts");
        }
        Ok(())
    }

    fn write_atomically(&self, path: &Path, bytes: &[u8]) -> Result<(), PluginError> {
        let dir = &self.dir;
        let io = |what: &str, e: std::io::Error| PluginError::Cache(format!("{what} {}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| io("creating", e))?;
        let tmp = dir.join(format!(".{}.{}.tmp", std::process::id(), rand::random::<u64>()));
        let result = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(io("writing compiled component into", e));
        }
        Ok(())
    }

    /// Removes artifacts, least recently used first, until the rest fit in the budget;
    /// never `keep`. Returns how many were removed.
    pub fn evict(&self, keep: &Path) -> usize {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "compile cache: cannot list artifacts");
                return 0;
            }
        };
        let mut artifacts: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                meta.is_file()
                    .then(|| (meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = artifacts.iter().map(|(_, len, _)| len).sum();
        // Oldest first; ties by name so the order is stable.
        artifacts.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.2.cmp(&b.2)));
        let mut removed = 0;
        for (_, len, path) in artifacts {
            if total <= self.max_bytes {
                break;
            }
            if path == keep {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    total = total.saturating_sub(len);
                    removed += 1;
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "compile cache: cannot remove an artifact")
                }
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(path: &Path, secs: u64) {
        let f = std::fs::File::options().write(true).open(path).unwrap_or_else(|e| panic!("{e}"));
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)).unwrap_or_else(|e| panic!("{e}"));
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{e}"))
            .map(|e| e.unwrap_or_else(|e| panic!("{e}")).file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn least_recently_used_artifacts_leave_first() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = CompileCache::new(dir.path().to_path_buf(), 250);
        let (a, b, c) = (cache.path_of("a", "e"), cache.path_of("b", "e"), cache.path_of("c", "e"));
        cache.store(&a, &[0; 100]).unwrap_or_else(|e| panic!("{e}"));
        cache.store(&b, &[0; 100]).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("notes.txt"), [0; 500]).unwrap_or_else(|e| panic!("{e}"));
        at(&a, 1_000);
        at(&b, 2_000);
        // `a` is used again: now `b` is the least recently used.
        cache.touch(&a);
        cache.store(&c, &[0; 100]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(names(dir.path()), ["a-e.cwasm", "c-e.cwasm", "notes.txt"]);
    }

    #[test]
    fn the_artifact_just_stored_stays_even_over_budget() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = CompileCache::new(dir.path().to_path_buf(), 50);
        let (old, new) = (cache.path_of("old", "other-engine"), cache.path_of("new", "e"));
        cache.store(&old, &[0; 10]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cache.evict(&new), 0, "within the budget: nothing removed");
        cache.store(&new, &[0; 100]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(names(dir.path()), ["new-e.cwasm"]);
    }
}
