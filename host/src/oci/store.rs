//! The local store of pulled plugins: content addressed, under the host's cache directory
//! (`<cache-dir>/oci`).
//!
//! - `blobs/sha256/<hex>`: manifests, Wasm layers and signature payloads, each named by the
//!   digest of its bytes;
//! - `records/<hex of the record's key>`: small notes the host keeps to run offline — the
//!   digest a tag resolved to last, the signature manifest of an artifact — each holding one
//!   digest.
//!
//! Invariants: nothing is returned that was not checked — a blob is read back only if its
//! bytes hash to its name, and it is a regular file (never followed through a symlink) owned
//! by this process's user, mode 0600, in directories the user owns with mode 0700; anything
//! else is removed and reported as missing, so it is pulled again. Files are written under a
//! temporary name and renamed into place, so a reader never sees half a file. A blob's
//! modification time is its last use; [`OciStore::prune`] removes the least recently used
//! blobs beyond a byte budget, never one still in use.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::digest::Digest;

/// Why the store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is owned by uid {owner}, not by this host's user (uid {uid}); the host keeps pulled plugins only in a directory it owns"
    )]
    NotOwned { path: PathBuf, owner: u32, uid: u32 },
    #[error("{path} is not a directory")]
    NotADirectory { path: PathBuf },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_owned(), source }
}

fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The store. Cheap to clone (a path).
#[derive(Clone, Debug)]
pub struct OciStore {
    root: PathBuf,
}

impl OciStore {
    /// Opens (creating) the store at `root`: every directory of it is owned by this user and
    /// mode 0700.
    pub fn open(root: impl Into<PathBuf>) -> Result<OciStore, StoreError> {
        let root = root.into();
        let store = OciStore { root };
        for dir in [store.root.clone(), store.blob_dir(), store.record_dir()] {
            own_dir(&dir)?;
        }
        Ok(store)
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn blob_dir(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    fn record_dir(&self) -> PathBuf {
        self.root.join("records")
    }

    /// Where the blob `digest` is (or would be) kept.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blob_dir().join(digest.hex())
    }

    /// The blob `digest`, if the store has it intact and it is at most `max` bytes; marks it
    /// used. A blob that fails a check is removed (and logged), and `None` returned.
    pub fn get(&self, digest: &Digest, max: u64) -> Option<Vec<u8>> {
        let path = self.blob_path(digest);
        let bytes = match read_checked(&path, max) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return None,
            Err(why) => {
                tracing::warn!(blob = %path.display(), %why, "removing a blob of the OCI store that fails its checks");
                let _ = std::fs::remove_file(&path);
                return None;
            }
        };
        if let Err(e) = digest.verify(&bytes) {
            tracing::warn!(blob = %path.display(), error = %e, "removing a blob of the OCI store whose content is not its digest");
            let _ = std::fs::remove_file(&path);
            return None;
        }
        // Last use, for pruning; a failure only makes it look older.
        if let Ok(f) = File::options().write(true).custom_flags(libc::O_NOFOLLOW).open(&path) {
            let _ = f.set_modified(SystemTime::now());
        }
        Some(bytes)
    }

    /// Stores `bytes` as blob `digest`, after checking that they are; returns its path.
    pub fn put(&self, digest: &Digest, bytes: &[u8]) -> Result<PathBuf, StorePutError> {
        digest.verify(bytes).map_err(StorePutError::Mismatch)?;
        let path = self.blob_path(digest);
        write_atomic(&self.blob_dir(), &path, bytes).map_err(StorePutError::Store)?;
        Ok(path)
    }

    /// Records `digest` under `key` (a tag's last resolution, an artifact's signature manifest).
    pub fn record(&self, key: &str, digest: &Digest) -> Result<(), StoreError> {
        let path = self.record_path(key);
        write_atomic(&self.record_dir(), &path, format!("{digest}\n").as_bytes())
    }

    /// The digest recorded under `key`, if any (and the record passes the file checks).
    pub fn recorded(&self, key: &str) -> Option<Digest> {
        let path = self.record_path(key);
        match read_checked(&path, 128) {
            Ok(Some(bytes)) => std::str::from_utf8(&bytes).ok()?.trim().parse().ok(),
            Ok(None) => None,
            Err(why) => {
                tracing::warn!(record = %path.display(), %why, "removing a record of the OCI store that fails its checks");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    fn record_path(&self, key: &str) -> PathBuf {
        self.record_dir().join(Digest::of(key.as_bytes()).hex())
    }

    /// Removes the least recently used blobs until the rest take at most `budget` bytes;
    /// blobs in `keep` stay whatever their size. Returns how many were removed.
    pub fn prune(&self, budget: u64, keep: &HashSet<Digest>) -> usize {
        let Ok(entries) = std::fs::read_dir(self.blob_dir()) else { return 0 };
        let mut blobs: Vec<(SystemTime, u64, PathBuf, bool)> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                let meta = e.metadata().ok()?;
                let name = e.file_name();
                let name = name.to_str()?;
                // Temporary files of a write in progress are not blobs.
                if name.starts_with('.') {
                    return None;
                }
                let kept = format!("sha256:{name}").parse::<Digest>().is_ok_and(|d| keep.contains(&d));
                Some((meta.modified().unwrap_or(SystemTime::UNIX_EPOCH), meta.len(), e.path(), kept))
            })
            .collect();
        let mut total: u64 = blobs.iter().map(|b| b.1).sum();
        blobs.sort();
        let mut removed = 0;
        for (_, len, path, kept) in blobs {
            if total <= budget {
                break;
            }
            if kept {
                continue;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
                removed += 1;
            }
        }
        removed
    }
}

/// Why a blob was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StorePutError {
    #[error(transparent)]
    Mismatch(super::digest::DigestMismatch),
    #[error(transparent)]
    Store(StoreError),
}

/// Creates `dir` if needed; it must be a directory owned by this user; its mode becomes 0700.
fn own_dir(dir: &Path) -> Result<(), StoreError> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io(dir))?;
        }
        Err(e) => return Err(io(dir)(e)),
    }
    let meta = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    if !meta.is_dir() {
        return Err(StoreError::NotADirectory { path: dir.to_owned() });
    }
    if meta.uid() != uid() {
        return Err(StoreError::NotOwned { path: dir.to_owned(), owner: meta.uid(), uid: uid() });
    }
    if meta.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    }
    Ok(())
}

/// Reads `path` if it is a regular file (not a symlink) owned by this user with mode 0600
/// and at most `max` bytes. `Ok(None)`: no such file; `Err`: it fails a check.
fn read_checked(path: &Path, max: u64) -> Result<Option<Vec<u8>>, String> {
    let mut file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open: {e}")),
    };
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.uid() != uid() {
        return Err(format!("owned by uid {}, not this host's user (uid {})", meta.uid(), uid()));
    }
    if meta.mode() & 0o777 != 0o600 {
        return Err(format!("mode {:o}, not 600", meta.mode() & 0o777));
    }
    if meta.len() > max {
        return Err(format!("{} bytes, more than the {max} allowed", meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    Read::by_ref(&mut file).take(max + 1).read_to_end(&mut bytes).map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("more than the {max} bytes allowed"));
    }
    Ok(Some(bytes))
}

/// Writes `bytes` to `path` (in `dir`): a new temporary file (mode 0600), synced, renamed
/// over `path`.
fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn blobs_round_trip_owned_and_private() {
        let tmp = tempfile::tempdir().unwrap();
        let store = OciStore::open(tmp.path().join("oci")).unwrap();
        let d = Digest::of(b"component");
        assert_eq!(store.get(&d, 1 << 20), None);
        let path = store.put(&d, b"component").unwrap();
        assert_eq!(path, store.blob_path(&d));
        assert_eq!(mode(&path), 0o600);
        for dir in [store.root().to_owned(), store.blob_dir(), store.record_dir()] {
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        }
        assert_eq!(store.get(&d, 1 << 20).as_deref(), Some(&b"component"[..]));
        // Bytes that are not what the digest names are refused before they are written.
        assert!(matches!(store.put(&Digest::of(b"x"), b"y"), Err(StorePutError::Mismatch(_))));
    }

    #[test]
    fn a_blob_that_fails_a_check_is_removed_not_returned() {
        let tmp = tempfile::tempdir().unwrap();
        let store = OciStore::open(tmp.path()).unwrap();
        let d = Digest::of(b"original");
        let path = store.put(&d, b"original").unwrap();

        // Changed content: the digest check catches it.
        std::fs::write(&path, b"tampered").unwrap();
        assert_eq!(store.get(&d, 1 << 20), None);
        assert!(!path.exists(), "a tampered blob is removed");

        // Readable by others: not a file the host wrote.
        store.put(&d, b"original").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(store.get(&d, 1 << 20), None);
        assert!(!path.exists());

        // A symlink planted in its place is not followed.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::write(&elsewhere, b"original").unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        assert_eq!(store.get(&d, 1 << 20), None);

        // Larger than the caller allows.
        let _ = std::fs::remove_file(&path);
        store.put(&d, b"original").unwrap();
        assert_eq!(store.get(&d, 4), None);

        // Owned by another user (only root can make one).
        store.put(&d, b"original").unwrap();
        if uid() == 0 {
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
            assert_eq!(store.get(&d, 1 << 20), None);
            assert!(!path.exists());
        }
    }

    #[test]
    fn a_store_dir_of_another_user_is_refused_and_a_loose_mode_tightened() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("oci");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        OciStore::open(&root).unwrap();
        assert_eq!(mode(&root), 0o700);
        if uid() == 0 {
            std::os::unix::fs::chown(&root, Some(65534), None).unwrap();
            let err = OciStore::open(&root).unwrap_err();
            assert!(matches!(err, StoreError::NotOwned { owner: 65534, .. }), "{err}");
        }
    }

    #[test]
    fn records_keep_a_digest_per_key() {
        let tmp = tempfile::tempdir().unwrap();
        let store = OciStore::open(tmp.path()).unwrap();
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        assert_eq!(store.recorded("tag oci://r/x:1"), None);
        store.record("tag oci://r/x:1", &a).unwrap();
        store.record("tag oci://r/x:2", &b).unwrap();
        assert_eq!(store.recorded("tag oci://r/x:1"), Some(a));
        store.record("tag oci://r/x:1", &b).unwrap();
        assert_eq!(store.recorded("tag oci://r/x:1"), Some(b));
    }

    #[test]
    fn prune_removes_least_recently_used_beyond_the_budget_but_never_kept_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let store = OciStore::open(tmp.path()).unwrap();
        let blobs: Vec<(Digest, Vec<u8>)> = (0..4u8)
            .map(|i| {
                let bytes = vec![i; 100];
                (Digest::of(&bytes), bytes)
            })
            .collect();
        for (i, (d, bytes)) in blobs.iter().enumerate() {
            let path = store.put(d, bytes).unwrap();
            // Oldest first: blob 0 was used longest ago.
            let f = File::options().write(true).open(path).unwrap();
            f.set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1000 + i as u64)).unwrap();
        }
        let keep: HashSet<Digest> = [blobs[0].0].into_iter().collect();
        // 400 bytes, budget 200: blob 0 is kept (in use), so 1 and 2 go; 3 is the newest.
        assert_eq!(store.prune(200, &keep), 2);
        let present: Vec<bool> = blobs.iter().map(|(d, _)| store.blob_path(d).exists()).collect();
        assert_eq!(present, [true, false, false, true]);
    }
}
