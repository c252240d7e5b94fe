//! Tests of the compile cache: eviction, the page-cache residency of artifacts, and every
//! check an artifact, the key and the directory must pass.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use super::*;

fn at(path: &Path, secs: u64) {
    let f = std::fs::File::options().write(true).open(path).unwrap_or_else(|e| panic!("{e}"));
    f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs)).unwrap_or_else(|e| panic!("{e}"));
}

/// The `.cwasm` files in `dir`.
fn artifacts(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|e| e.unwrap_or_else(|e| panic!("{e}")).file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cwasm") || n.ends_with(".txt"))
        .collect();
    v.sort();
    v
}

fn engine() -> EngineFingerprint {
    EngineFingerprint::from_text(&"e".repeat(64))
}

fn open(dir: &Path, max_bytes: u64) -> CompileCache {
    CompileCache::open(dir.to_path_buf(), max_bytes, Family::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn rejected(cache: &CompileCache, reason: &'static str) -> u64 {
    cache.inner.rejected.get_or_create(&RejectedArtifactLabels { reason }).get()
}

fn short(name: &str) -> String {
    format!("{name}-{}.cwasm", engine().short())
}

#[test]
fn least_recently_used_artifacts_leave_first() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // Each stored artifact is 100 bytes plus its trailer.
    let cache = open(dir.path(), 250 + 2 * TRAILER_LEN as u64);
    let e = engine();
    cache.store("a", &e, &[0; 100]).unwrap_or_else(|e| panic!("{e}"));
    cache.store("b", &e, &[0; 100]).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.path().join("notes.txt"), [0; 500]).unwrap_or_else(|e| panic!("{e}"));
    at(&cache.path_of("a", &e), 1_000);
    at(&cache.path_of("b", &e), 2_000);
    // `a` is used again: now `b` is the least recently used.
    let a = cache.open_verified("a", &e).unwrap_or_else(|| panic!("a passes"));
    cache.touch(&a);
    cache.store("c", &e, &[0; 100]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(artifacts(dir.path()), [short("a"), short("c"), "notes.txt".to_owned()]);
}

#[test]
fn an_unnamed_file_has_no_name_in_the_directory_and_is_private() {
    use std::io::{Read, Seek, Write};
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 1 << 20);
    let entries = || std::fs::read_dir(dir.path()).unwrap_or_else(|e| panic!("{e}")).count();
    let before = entries();
    let mut file = cache.unnamed_file().unwrap_or_else(|e| panic!("{e}"));
    file.write_all(b"queued bytes").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(entries(), before, "nothing new in the directory");
    assert_eq!(file.metadata().unwrap_or_else(|e| panic!("{e}")).permissions().mode() & 0o777, 0o600);
    let mut read = String::new();
    file.rewind().unwrap_or_else(|e| panic!("{e}"));
    file.read_to_string(&mut read).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(read, "queued bytes");
}

#[test]
fn the_artifact_just_stored_stays_even_over_budget() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 50 + TRAILER_LEN as u64);
    let other = EngineFingerprint::from_text(&"o".repeat(64));
    cache.store("old", &other, &[0; 10]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cache.evict(&short("new")), 0, "within the budget: nothing removed");
    cache.store("new", &engine(), &[0; 100]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(artifacts(dir.path()), [short("new")]);
}

#[test]
fn the_directory_and_key_are_private_to_the_host_and_files_are_made_exclusively() {
    let base = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = base.path().join("nested").join("cache");
    let cache = open(&dir, 1 << 30);
    let mode = |p: &Path| {
        std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{e}")).permissions().mode() & 0o777
    };
    assert_eq!(mode(&dir), 0o700, "created private");
    assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
    assert_eq!(std::fs::read(dir.join(KEY_FILE)).unwrap_or_default().len(), KEY_LEN);
    cache.store("h", &engine(), b"artifact").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(mode(&cache.path_of("h", &engine())), 0o600);
    // Reopening keeps the key: the artifact still passes.
    let again = open(&dir, 1 << 30);
    assert!(again.open_verified("h", &engine()).is_some());
    // No temporary file is left behind.
    let names: Vec<_> =
        std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{e}")).map(|e| e.map(|e| e.file_name())).collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_group_writable_directory_is_made_private_before_use() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
        .unwrap_or_else(|e| panic!("{e}"));
    let _cache = open(dir.path(), 1 << 30);
    let mode = std::fs::metadata(dir.path()).unwrap_or_else(|e| panic!("{e}")).permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}

#[test]
fn a_directory_of_another_user_is_refused_naming_both_uids() {
    let base = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let dir = if euid() == 0 {
        // Root can give a directory away: to `nobody`.
        let dir = base.path().join("theirs");
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap_or_else(|e| panic!("{e}"));
        dir
    } else {
        // Anyone else: `/` is root's.
        PathBuf::from("/")
    };
    let owner = std::fs::metadata(&dir).unwrap_or_else(|e| panic!("{e}")).uid();
    let err =
        CompileCache::open(dir.clone(), 1 << 30, Family::default()).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains(&format!("belongs to uid {owner}, not to this host's uid {}", euid())), "{err}");
    assert!(err.contains(&dir.display().to_string()), "{err}");
    assert!(!dir.join(KEY_FILE).exists(), "nothing was written into it");
}

#[test]
fn an_unusable_key_is_replaced_and_old_artifacts_no_longer_pass() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 1 << 30);
    cache.store("h", &engine(), b"artifact").unwrap_or_else(|e| panic!("{e}"));
    let key = dir.path().join(KEY_FILE);
    let old = std::fs::read(&key).unwrap_or_default();
    // Readable by others: it may have leaked.
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 1 << 30);
    assert_ne!(std::fs::read(&key).unwrap_or_default(), old, "a new key");
    assert_eq!(std::fs::metadata(&key).unwrap_or_else(|e| panic!("{e}")).permissions().mode() & 0o777, 0o600);
    assert!(cache.open_verified("h", &engine()).is_none(), "signed with the old key");
    assert_eq!(rejected(&cache, "mac"), 1);
    // A key file that is a link (to a key someone else knows) is replaced, not followed.
    let known = dir.path().join("known");
    std::fs::write(&known, [1u8; KEY_LEN]).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&known, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_file(&key).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&known, &key).unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 1 << 30);
    assert!(!std::fs::symlink_metadata(&key).unwrap_or_else(|e| panic!("{e}")).file_type().is_symlink());
    assert_ne!(cache.inner.key, [1u8; KEY_LEN]);
    assert_eq!(std::fs::read(&known).unwrap_or_default(), [1u8; KEY_LEN], "the link's target is untouched");
}

#[test]
fn changed_replayed_and_foreign_artifacts_are_rejected_counted_and_removed() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 1 << 30);
    let e = engine();
    cache.store("a", &e, b"artifact of a").unwrap_or_else(|e| panic!("{e}"));
    cache.store("b", &e, b"artifact of b").unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("a", &e).is_some());

    // A byte changed.
    let path_a = cache.path_of("a", &e);
    let mut bytes = std::fs::read(&path_a).unwrap_or_default();
    bytes[0] ^= 1;
    std::fs::write(&path_a, &bytes).unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("a", &e).is_none());
    assert_eq!(rejected(&cache, "mac"), 1);
    assert!(!path_a.exists(), "removed");

    // `b`'s valid artifact under `a`'s name.
    std::fs::copy(cache.path_of("b", &e), &path_a).unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("a", &e).is_none());
    assert_eq!(rejected(&cache, "mac"), 2);
    assert!(cache.open_verified("b", &e).is_some(), "b itself still passes");

    // Under another engine's name.
    let other = EngineFingerprint::from_text(&format!("{}{}", &"e".repeat(16), "f".repeat(48)));
    assert_eq!(cache.path_of("b", &other), cache.path_of("b", &e), "same short name");
    assert!(cache.open_verified("b", &other).is_none(), "the full fingerprint is in the MAC");

    // Garbage, and an artifact written by something else (no trailer).
    std::fs::write(&path_a, b"garbage").unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("a", &e).is_none());
    std::fs::write(&path_a, vec![0u8; 4096]).unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("a", &e).is_none());
    assert_eq!(rejected(&cache, "unauthenticated"), 2);

    // A good artifact another host (another key) wrote.
    let elsewhere = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let foreign = open(elsewhere.path(), 1 << 30);
    foreign.store("a", &e, b"artifact of a").unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(foreign.path_of("a", &e), &path_a).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&path_a, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("a", &e).is_none());
    assert_eq!(rejected(&cache, "mac"), 4);
}

#[test]
fn links_fifos_and_loose_files_in_the_directory_are_never_followed_or_loaded() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 1 << 30);
    let e = engine();
    cache.store("good", &e, b"artifact").unwrap_or_else(|e| panic!("{e}"));
    let good = cache.path_of("good", &e);

    // A symbolic link to a valid artifact: refused as a link; the link goes, not its target.
    let link = cache.path_of("link", &e);
    std::os::unix::fs::symlink(&good, &link).unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("link", &e).is_none());
    assert_eq!(rejected(&cache, "not-regular"), 1);
    assert!(std::fs::symlink_metadata(&link).is_err() && good.exists());

    // A FIFO: refused without waiting for a writer.
    let fifo = cache.path_of("fifo", &e);
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap_or_default();
    // SAFETY: `mkfifo` with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(cache.open_verified("fifo", &e).is_none());
    assert_eq!(rejected(&cache, "not-regular"), 2);

    // A second hard link to an artifact.
    let hard = dir.path().join("hard");
    std::fs::hard_link(&good, &hard).unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("good", &e).is_none());
    assert_eq!(rejected(&cache, "links"), 1);
    std::fs::remove_file(&hard).unwrap_or_else(|e| panic!("{e}"));

    // Writable by others.
    cache.store("loose", &e, b"artifact").unwrap_or_else(|e| panic!("{e}"));
    let loose = cache.path_of("loose", &e);
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o666))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(cache.open_verified("loose", &e).is_none());
    assert_eq!(rejected(&cache, "mode"), 1);

    // A link planted where the temporary file or the artifact goes is replaced, not written through.
    let target = dir.path().join("target");
    std::fs::write(&target, b"untouched").unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(&target, cache.path_of("planted", &e)).unwrap_or_else(|e| panic!("{e}"));
    cache.store("planted", &e, b"artifact").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(std::fs::read(&target).unwrap_or_default(), b"untouched");
    assert!(cache.open_verified("planted", &e).is_some());
}

/// 2 MiB of artifact: large enough for the kernel to cache it in large folios.
const ARTIFACT: usize = 2 << 20;

/// A private read-only mapping of the whole artifact file, unmapped when dropped.
struct Mapped(*mut libc::c_void, usize);

impl Mapped {
    fn of(path: &Path) -> Self {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{e}"));
        let len = file.metadata().map(|m| m.len() as usize).unwrap_or_else(|e| panic!("{e}"));
        // SAFETY: a new private read-only mapping of the file, owned by the result.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0)
        };
        assert_ne!(base, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
        Mapped(base, len)
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`; nothing refers to it any more.
        unsafe { libc::munmap(self.0, self.1) };
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
    let mut pages = vec![0u8; map.1.div_ceil(page_size())];
    // SAFETY: `pages` has one byte per page of the mapping.
    let rc = unsafe { libc::mincore(map.0, map.1, pages.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    pages.iter().any(|p| p & 1 == 1)
}

#[test]
fn a_stored_artifact_is_mapped_only_where_touched() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 1 << 30);
    cache.store("big", &engine(), &pattern()).unwrap_or_else(|e| panic!("{e}"));
    // Fault-around maps up to 64 KiB around the page touched; a large folio would map
    // up to the whole 2 MiB.
    let rss = resident_after_one_touch(&cache.path_of("big", &engine()));
    assert!(rss <= 256, "one read made {rss} KiB of the artifact resident");
}

#[test]
fn checking_an_uncached_artifact_reads_it_in_single_pages() {
    use std::os::fd::AsRawFd;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cache = open(dir.path(), 1 << 30);
    cache.store("cold", &engine(), &pattern()).unwrap_or_else(|e| panic!("{e}"));
    let path = cache.path_of("cold", &engine());
    // Out of the page cache, as after a reboot.
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: advice on an open file's cached pages (clean: the store synced them).
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
    assert!(
        !any_cached(&path),
        "the artifact left the page cache (a temporary directory on disk, not tmpfs)"
    );
    assert!(cache.open_verified("cold", &engine()).is_some(), "it passes");
    assert!(any_cached(&path), "checking it read it");
    let rss = resident_after_one_touch(&path);
    assert!(rss <= 256, "one read made {rss} KiB of the checked artifact resident");
}
