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
//! - An artifact's pages sit in the page cache one page per folio where this module put
//!   them there: it writes artifacts a page at a time, and reads a stored artifact that is
//!   not cached a page at a time ([`CompileCache::settle`]) before wasmtime maps it. Linux
//!   maps a large folio whole when one of its pages is touched, and an artifact written in
//!   one piece or read by readahead sits in folios of up to 2 MiB; a plugin whose `init`
//!   runs a little code here and there then holds all of its compiled code resident. With
//!   single pages only what runs is resident, plus the kernel's fault-around (64 KiB).

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

    /// Brings the pages of the artifact at `path` that are not in the page cache into it,
    /// one page per folio, before wasmtime maps the file (see the module's invariants).
    /// Pages already cached stay as they are. Best effort: a failure is logged and the load
    /// goes on (it costs memory, not correctness).
    ///
    /// How: a private read-only mapping of the file; `mincore` tells which pages are not
    /// cached (usually none: then that is all, a few µs); those are read one byte each under
    /// `MADV_RANDOM`, where a fault reads just the page it needs, into a single-page folio,
    /// and readahead would have read a large one.
    pub fn settle(&self, path: &Path) {
        if let Err(e) = read_in_single_pages(path) {
            tracing::debug!(path = %path.display(), error = %e, "compile cache: artifact not read ahead page by page");
        }
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
            // A page per write: the page cache then holds the artifact in single-page
            // folios (see the module's invariants).
            for page in bytes.chunks(page_size()) {
                f.write_all(page)?;
            }
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

/// The size of a memory page.
fn page_size() -> usize {
    // SAFETY: `sysconf` reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(4096)
}

/// See [`CompileCache::settle`]. Written on `libc` directly: it is a mapping, `mincore`,
/// `madvise` and a read per missing page; the mapping crates do not offer `mincore`.
fn read_in_single_pages(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    let len = usize::try_from(file.metadata()?.len()).map_err(std::io::Error::other)?;
    if len == 0 {
        return Ok(());
    }
    // SAFETY: a new private read-only mapping of an open file; nothing else refers to it.
    let base = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0)
    };
    if base == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let page = page_size();
    let result = (|| {
        // Which pages are cached: usually all of them, and then there is nothing to do
        // (a fault per page under `MADV_RANDOM` would cost ~1 µs per 4 KiB).
        let mut cached = vec![0u8; len.div_ceil(page)];
        // SAFETY: `base..base + len` is the mapping made above; `cached` has a byte per page.
        if unsafe { libc::mincore(base, len, cached.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if cached.iter().all(|c| c & 1 == 1) {
            return Ok(());
        }
        // SAFETY: as above.
        if unsafe { libc::madvise(base, len, libc::MADV_RANDOM) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut sum = 0u8;
        for (i, _) in cached.iter().enumerate().filter(|(_, c)| *c & 1 == 0) {
            // SAFETY: `i * page < len`, inside the mapping; artifacts are replaced by
            // rename and removed by unlink, never truncated in place, so the page exists.
            sum ^= unsafe { std::ptr::read_volatile(base.cast::<u8>().add(i * page)) };
        }
        std::hint::black_box(sum);
        Ok(())
    })();
    // SAFETY: unmaps the mapping made above; nothing refers to it any more.
    unsafe { libc::munmap(base, len) };
    result
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

    /// 2 MiB of artifact: large enough for the kernel to cache it in large folios.
    const ARTIFACT: usize = 2 << 20;

    /// A private read-only mapping of a whole test artifact, unmapped when dropped.
    struct Mapped(*mut libc::c_void);

    impl Mapped {
        fn of(path: &Path) -> Self {
            use std::os::fd::AsRawFd;
            let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{e}"));
            // SAFETY: a new private read-only mapping of the file, owned by the result.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    ARTIFACT,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE,
                    file.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(base, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
            Mapped(base)
        }
    }

    impl Drop for Mapped {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `of`; nothing refers to it any more.
            unsafe { libc::munmap(self.0, ARTIFACT) };
        }
    }

    /// KiB of `path` resident in a fresh mapping of it after one byte in its middle was
    /// read (the mapping's `Rss` in `/proc/self/smaps`).
    fn resident_after_one_touch(path: &Path) -> usize {
        let map = Mapped::of(path);
        // SAFETY: inside the mapping.
        std::hint::black_box(unsafe { std::ptr::read_volatile(map.0.cast::<u8>().add(ARTIFACT / 2 + 123)) });
        let start = format!("{:x}-", map.0 as usize);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_else(|e| panic!("{e}"));
        smaps
            .lines()
            .skip_while(|l| !l.starts_with(&start))
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no Rss for the mapping at {start}"))
    }

    fn pattern() -> Vec<u8> {
        (0..ARTIFACT).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    /// Whether any page of `path` is in the page cache (`mincore` touches no page).
    fn any_cached(path: &Path) -> bool {
        let map = Mapped::of(path);
        let mut pages = vec![0u8; ARTIFACT.div_ceil(page_size())];
        // SAFETY: `pages` has one byte per page of the mapping.
        let rc = unsafe { libc::mincore(map.0, ARTIFACT, pages.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        pages.iter().any(|p| p & 1 == 1)
    }

    #[test]
    fn a_stored_artifact_is_mapped_only_where_touched() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = CompileCache::new(dir.path().to_path_buf(), 1 << 30);
        let path = cache.path_of("big", "e");
        cache.store(&path, &pattern()).unwrap_or_else(|e| panic!("{e}"));
        // Fault-around maps up to 64 KiB around the page touched; a large folio would map
        // up to the whole 2 MiB.
        let rss = resident_after_one_touch(&path);
        assert!(rss <= 256, "one read made {rss} KiB of the artifact resident");
    }

    #[test]
    fn settle_reads_an_uncached_artifact_in_single_pages() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = CompileCache::new(dir.path().to_path_buf(), 1 << 30);
        let path = cache.path_of("copied", "e");
        // As `cp` or another writer leaves it, then out of the page cache (as after a reboot).
        std::fs::write(&path, pattern()).unwrap_or_else(|e| panic!("{e}"));
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{e}"));
        file.sync_all().unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: advice on an open file's cached pages (clean after the sync).
        let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
        assert!(
            !any_cached(&path),
            "the artifact left the page cache (a temporary directory on disk, not tmpfs)"
        );
        cache.settle(&path);
        assert!(any_cached(&path), "settle read the artifact");
        let rss = resident_after_one_touch(&path);
        assert!(rss <= 256, "one read made {rss} KiB of the settled artifact resident");
        assert_eq!(std::fs::read(&path).unwrap_or_else(|e| panic!("{e}")), pattern(), "contents unchanged");
    }
}
