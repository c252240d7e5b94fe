//! The on-disk compile cache: compiled components (`.cwasm`) by content hash and engine,
//! each authenticated with this host's key, kept within a byte budget, least recently used
//! first out.
//!
//! An artifact is native code the host maps executable: whoever can change one runs code
//! in the host. So nothing in the directory is trusted until checked:
//!
//! Invariants:
//! - The directory is opened once ([`CompileCache::open`]) and every later operation is
//!   relative to that descriptor (`openat`, `renameat`, `unlinkat`): replacing the path
//!   (or a parent) afterwards changes nothing. A directory the host creates is made 0700.
//!   The opened directory must belong to the host's effective uid (else the cache is refused
//!   and every load compiles); write access for group or others is removed (with a warning)
//!   before anything in it is read.
//! - The key: 32 random bytes in `hmac-key`, created 0600 under an exclusive temporary name
//!   and linked into place. A key file that is not a regular file of the host's uid, mode
//!   0600 (no group or other bits), one link and 32 bytes is replaced by a new key (with a
//!   warning): every artifact is then compiled again. The key never leaves this process (the
//!   compile child gets a key of its own per compile, see [`super::child`]).
//! - An artifact is `<sha256 of the wasm>-<engine fingerprint, 16 hex>.cwasm`: the artifact
//!   bytes, then a trailer (8 bytes of magic and the HMAC-SHA256, under the key, of the
//!   engine's full fingerprint, the wasm's hash and the artifact bytes). An artifact cannot be
//!   replayed under another name or engine, and nothing but this host (with the key) makes one
//!   that passes.
//! - Loading ([`CompileCache::open_verified`]): the file is opened `O_NOFOLLOW | O_NONBLOCK`
//!   (a symbolic link, FIFO or device is never followed or waited on); the opened descriptor
//!   must be a regular file of the host's uid, not writable by group or others, with one
//!   link; its bytes are read through a mapping of that descriptor and the MAC checked in
//!   constant time before anything is handed to wasmtime, which then maps the same inode
//!   (`/proc/self/fd/N` of the checked descriptor, never the path again). Only the host's uid
//!   can write that inode (owner and mode checked on the descriptor, in a 0700 directory of
//!   that uid), so the bytes wasmtime maps are the bytes checked. An artifact that fails any
//!   check is logged (warning, with its path and why), counted in
//!   `wasmctrl_compile_cache_rejected_artifacts_total{reason}`, removed, and reported as
//!   absent: the caller compiles and stores a new one. It is never loaded.
//! - Writing: a temporary `.<pid>.<random>.tmp` created `O_CREAT | O_EXCL | O_NOFOLLOW`, mode
//!   0600, written, synced, then renamed over the name, so a reader never sees half an
//!   artifact and a planted file or link at the temporary name is never written through.
//! - Every use of an artifact (a cache hit) refreshes its modification time; after each
//!   store, artifacts are removed oldest first until the rest fit in the budget. The one
//!   just stored is never removed, even when it alone is over the budget. Artifacts of
//!   other engines (another wasmtime) are never used again, so they age out first.
//! - Removing an artifact in use is harmless: wasmtime maps it copy-on-write and the mapping
//!   outlives the file (the next load of those bytes compiles again).
//! - Only regular `*.cwasm` files are counted or removed by eviction; anything else in the
//!   directory is left.
//! - An artifact's pages sit in the page cache one page per folio where this module put
//!   them there: it writes artifacts a page at a time, and reads a stored artifact that is
//!   not cached under `MADV_RANDOM` (a fault reads one page) when it checks its MAC, before
//!   wasmtime maps it. Linux maps a large folio whole when one of its pages is touched, and
//!   an artifact written in one piece or read by readahead sits in folios of up to 2 MiB; a
//!   plugin whose `init` runs a little code here and there then holds all of its compiled
//!   code resident. With single pages only what runs is resident, plus the kernel's
//!   fault-around (64 KiB).
//!
//! - Unnamed files ([`CompileCache::unnamed_file`]), where a caller parks bytes on disk
//!   instead of in the heap (the `.wasm` of queued tier-ups): `O_TMPFILE`, mode 0600 (where
//!   the filesystem lacks it, a file created as above and unlinked at once). One never has a
//!   name another process could open, and is gone when its descriptor is closed. Whoever
//!   reads one back checks what it reads: the host's own uid can still write it through
//!   `/proc`.
//!
//! Written on `rustix` (the `*at` calls, `fstat`) and `libc` (`mmap`, `mincore`,
//! `madvise`): `std::fs` has no descriptor-relative operations, and the mapping crates do
//! not offer `mincore`.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hmac::{Hmac, Mac};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use sha2::Sha256;

use crate::plugin::PluginError;
use crate::plugin::metrics::RejectedArtifactLabels;

/// The key file in the cache directory.
const KEY_FILE: &str = "hmac-key";
const KEY_LEN: usize = 32;
/// What ends every artifact this module writes, before its MAC.
const MAGIC: &[u8; 8] = b"wcmac\x01\0\0";
const MAC_LEN: usize = 32;
const TRAILER_LEN: usize = MAGIC.len() + MAC_LEN;
/// What the MAC of a cache artifact covers first (the compile child's output is framed
/// with another domain, so neither can pass for the other).
const DOMAIN: &[u8] = b"wasmctrl compile cache artifact v1\0";

type HmacSha256 = Hmac<Sha256>;

/// Why an artifact was not loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rejection {
    NotRegular(&'static str),
    Owner(u32),
    Mode(u32),
    Links(u64),
    Unauthenticated,
    Mac,
    Unloadable(String),
}

impl Rejection {
    fn label(&self) -> &'static str {
        match self {
            Rejection::NotRegular(_) => "not-regular",
            Rejection::Owner(_) => "owner",
            Rejection::Mode(_) => "mode",
            Rejection::Links(_) => "links",
            Rejection::Unauthenticated => "unauthenticated",
            Rejection::Mac => "mac",
            Rejection::Unloadable(_) => "unloadable",
        }
    }
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::NotRegular(what) => write!(f, "it is {what}, not a regular file"),
            Rejection::Owner(uid) => {
                write!(f, "it belongs to uid {uid}, not to this host's uid {}", euid())
            }
            Rejection::Mode(mode) => write!(f, "it is writable by group or others (mode {mode:o})"),
            Rejection::Links(n) => write!(f, "it has {n} hard links (an artifact has one)"),
            Rejection::Unauthenticated => {
                write!(f, "it carries no MAC (not written by this host's compile cache)")
            }
            Rejection::Mac => write!(
                f,
                "its MAC does not match this host's key for this name and engine (changed, or another artifact)"
            ),
            Rejection::Unloadable(why) => write!(f, "wasmtime refused it: {why}"),
        }
    }
}

/// What makes compiled artifacts compatible with an engine, as 32 bytes (SHA-256 of
/// wasmtime's compatibility hash), in hex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EngineFingerprint(String);

impl EngineFingerprint {
    /// The fingerprint of `engine`.
    pub fn of(engine: &wasmtime::Engine) -> Self {
        use sha2::Digest;
        use std::hash::Hash;
        /// Feeds what `Hash` writes into SHA-256.
        struct Sha(Sha256);
        impl std::hash::Hasher for Sha {
            fn write(&mut self, bytes: &[u8]) {
                self.0.update(bytes);
            }
            fn finish(&self) -> u64 {
                0
            }
        }
        let mut h = Sha(Sha256::new());
        engine.precompile_compatibility_hash().hash(&mut h);
        EngineFingerprint(hex::encode(h.0.finalize()))
    }

    /// The hex digest.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The part in artifact names.
    fn short(&self) -> &str {
        self.0.get(..16).unwrap_or(&self.0)
    }

    /// A fingerprint given as text (tests).
    #[cfg(test)]
    pub fn from_text(text: &str) -> Self {
        EngineFingerprint(text.to_owned())
    }
}

/// The compile cache in one directory; cheap to clone.
#[derive(Clone)]
pub(crate) struct CompileCache {
    inner: Arc<Inner>,
}

struct Inner {
    /// As configured (messages only: every operation goes through `fd`).
    dir: PathBuf,
    fd: OwnedFd,
    key: [u8; KEY_LEN],
    max_bytes: u64,
    rejected: Family<RejectedArtifactLabels, Counter>,
}

impl std::fmt::Debug for CompileCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileCache").field("dir", &self.inner.dir).finish_non_exhaustive()
    }
}

/// A stored artifact whose descriptor passed every check and whose MAC matched.
pub(crate) struct VerifiedArtifact {
    file: std::fs::File,
    /// Where it was found (for messages).
    path: PathBuf,
    name: String,
}

impl VerifiedArtifact {
    /// A path naming the checked inode itself, for wasmtime to map.
    pub fn fd_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn errno_io(e: Errno) -> std::io::Error {
    std::io::Error::from(e)
}

impl CompileCache {
    /// Opens (creating it 0700 when missing) the cache directory `dir`, checks it belongs to
    /// this host's uid and removes write access for group and others, and reads or creates
    /// the key. An error says why the directory is refused; the caller then runs without a
    /// compile cache. `rejected` counts the artifacts refused later.
    pub fn open(
        dir: PathBuf,
        max_bytes: u64,
        rejected: Family<RejectedArtifactLabels, Counter>,
    ) -> Result<Self, PluginError> {
        let fail = |what: String| PluginError::Cache(format!("{}: {what}", dir.display()));
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| fail(format!("creating its parent: {e}")))?;
        }
        match rustix::fs::mkdir(&dir, Mode::RWXU) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(fail(format!("creating it: {e}"))),
        }
        // The configured path may be a link to the directory (an administrator's choice);
        // what is checked, and used from here on, is the directory opened.
        let fd = rustix::fs::open(&dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| fail(format!("opening it: {e}")))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| fail(format!("reading its owner and mode: {e}")))?;
        if st.st_uid != euid() {
            return Err(fail(format!(
                "it belongs to uid {}, not to this host's uid {}: whoever owns it could plant native code \
                 the host would run, so it is not used (every plugin load compiles); make this user its \
                 owner (`chown`) or point cache-dir at a directory of this user",
                st.st_uid,
                euid()
            )));
        }
        let mode = st.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            let repaired = mode & !0o077;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(repaired)).map_err(|e| {
                fail(format!(
                    "it is writable by group or others (mode {mode:o}) and its mode cannot be changed: {e}"
                ))
            })?;
            tracing::warn!(
                dir = %dir.display(),
                was = format!("{mode:o}"),
                now = format!("{repaired:o}"),
                "compile cache directory was writable by group or others: made it private to this user \
                 (every artifact in it is still checked against this host's key before use)"
            );
        }
        let key = load_or_create_key(&fd, &dir).map_err(|e| fail(format!("its key file {KEY_FILE}: {e}")))?;
        Ok(CompileCache { inner: Arc::new(Inner { dir, fd, key, max_bytes, rejected }) })
    }

    /// The file name of the artifact of the wasm with hex SHA-256 `hash` for `engine`.
    pub fn name_of(hash: &str, engine: &EngineFingerprint) -> String {
        format!("{hash}-{}.cwasm", engine.short())
    }

    /// The artifact's path (the cache itself works by name).
    #[cfg(test)]
    pub fn path_of(&self, hash: &str, engine: &EngineFingerprint) -> PathBuf {
        self.inner.dir.join(Self::name_of(hash, engine))
    }

    fn mac(&self, hash: &str, engine: &EngineFingerprint, body: &[u8]) -> HmacSha256 {
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.inner.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(DOMAIN);
        for field in [engine.as_str().as_bytes(), hash.as_bytes()] {
            mac.update(&(field.len() as u64).to_le_bytes());
            mac.update(field);
        }
        mac.update(body);
        mac
    }

    /// Whether a regular file stands under the artifact's name (not whether it passes).
    pub fn has_artifact(&self, hash: &str, engine: &EngineFingerprint) -> bool {
        rustix::fs::statat(&self.inner.fd, Self::name_of(hash, engine), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
    }

    /// The stored artifact of `hash` for `engine`, once its descriptor and MAC passed every
    /// check (see the module's invariants); `None` when there is none, or it was rejected
    /// (then logged, counted and removed).
    pub fn open_verified(&self, hash: &str, engine: &EngineFingerprint) -> Option<VerifiedArtifact> {
        let name = Self::name_of(hash, engine);
        let path = self.inner.dir.join(&name);
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.inner.fd, name.as_str(), flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return None,
            Err(Errno::LOOP) => {
                self.reject(&name, &Rejection::NotRegular("a symbolic link"));
                return None;
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "compile cache: cannot open an artifact; compiling");
                return None;
            }
        };
        match self.check(&fd, hash, engine) {
            Ok(()) => Some(VerifiedArtifact { file: std::fs::File::from(fd), path, name }),
            Err(Ok(rejection)) => {
                self.reject(&name, &rejection);
                None
            }
            Err(Err(e)) => {
                tracing::warn!(path = %path.display(), error = %e, "compile cache: cannot read an artifact; compiling");
                None
            }
        }
    }

    /// Checks an opened artifact: the descriptor, then the MAC over a mapping of it.
    fn check(
        &self,
        fd: &OwnedFd,
        hash: &str,
        engine: &EngineFingerprint,
    ) -> Result<(), Result<Rejection, std::io::Error>> {
        let st = rustix::fs::fstat(fd).map_err(|e| Err(errno_io(e)))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => {}
            FileType::Directory => return Err(Ok(Rejection::NotRegular("a directory"))),
            FileType::Fifo => return Err(Ok(Rejection::NotRegular("a FIFO"))),
            FileType::Socket => return Err(Ok(Rejection::NotRegular("a socket"))),
            _ => return Err(Ok(Rejection::NotRegular("a device or other special file"))),
        }
        if st.st_uid != euid() {
            return Err(Ok(Rejection::Owner(st.st_uid)));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(Ok(Rejection::Mode(st.st_mode & 0o7777)));
        }
        #[allow(clippy::useless_conversion)]
        let links = u64::from(st.st_nlink);
        if links != 1 {
            return Err(Ok(Rejection::Links(links)));
        }
        let len = usize::try_from(st.st_size).map_err(|e| Err(std::io::Error::other(e)))?;
        if len <= TRAILER_LEN {
            return Err(Ok(Rejection::Unauthenticated));
        }
        let map = Mapping::of(fd, len).map_err(Err)?;
        map.read_in_single_pages().map_err(Err)?;
        let (body, trailer) = map.bytes().split_at(len - TRAILER_LEN);
        let (magic, tag) = trailer.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(Ok(Rejection::Unauthenticated));
        }
        // `verify_slice` compares in constant time.
        self.mac(hash, engine, body).verify_slice(tag).map_err(|_| Ok(Rejection::Mac))
    }

    /// Logs, counts and removes a rejected artifact.
    pub fn reject_artifact(&self, artifact: VerifiedArtifact, why: &Rejection) {
        let VerifiedArtifact { name, .. } = artifact;
        self.reject(&name, why);
    }

    fn reject(&self, name: &str, why: &Rejection) {
        let path = self.inner.dir.join(name);
        tracing::warn!(path = %path.display(), reason = %why, "compile cache: artifact rejected, never loaded; removing it and compiling again");
        self.inner.rejected.get_or_create(&RejectedArtifactLabels { reason: why.label() }).inc();
        match rustix::fs::unlinkat(&self.inner.fd, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "compile cache: cannot remove a rejected artifact")
            }
        }
    }

    /// Marks `artifact` as just used (it moves to the back of the eviction order).
    pub fn touch(&self, artifact: &VerifiedArtifact) {
        if let Err(e) = artifact.file.set_modified(SystemTime::now()) {
            tracing::debug!(path = %artifact.path.display(), error = %e, "cannot refresh a cached artifact's time");
        }
    }

    /// Writes `bytes` (an artifact of the wasm `hash` for `engine`) with its MAC, atomically,
    /// then evicts down to the budget.
    pub fn store(&self, hash: &str, engine: &EngineFingerprint, bytes: &[u8]) -> Result<(), PluginError> {
        let name = Self::name_of(hash, engine);
        let mut trailer = Vec::with_capacity(TRAILER_LEN);
        trailer.extend_from_slice(MAGIC);
        trailer.extend_from_slice(&self.mac(hash, engine, bytes).finalize().into_bytes());
        self.write_atomically(&name, &[bytes, &trailer]).map_err(|e| {
            PluginError::Cache(format!(
                "writing compiled component {}: {e}",
                self.inner.dir.join(&name).display()
            ))
        })?;
        let removed = self.evict(&name);
        if removed > 0 {
            tracing::info!(dir = %self.inner.dir.display(), removed, max_bytes = self.inner.max_bytes, "compile cache: removed least recently used artifacts");
        }
        Ok(())
    }

    /// A new empty unnamed file in the directory, for reading and writing (see the
    /// module's invariants).
    pub fn unnamed_file(&self) -> std::io::Result<std::fs::File> {
        let mode = Mode::RUSR | Mode::WUSR;
        let flags = OFlags::RDWR | OFlags::TMPFILE | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&self.inner.fd, ".", flags, mode) {
            Ok(fd) => fd,
            // Filesystems without `O_TMPFILE` say one of these.
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                let tmp = format!(".{}.{}.spool", std::process::id(), rand::random::<u64>());
                let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let fd = rustix::fs::openat(&self.inner.fd, tmp.as_str(), flags, mode).map_err(errno_io)?;
                rustix::fs::unlinkat(&self.inner.fd, tmp.as_str(), AtFlags::empty()).map_err(errno_io)?;
                fd
            }
            Err(e) => return Err(errno_io(e)),
        };
        Ok(std::fs::File::from(fd))
    }

    fn write_atomically(&self, name: &str, parts: &[&[u8]]) -> std::io::Result<()> {
        write_new_file(&self.inner.fd, name, parts, true)
    }

    /// Removes artifacts, least recently used first, until the rest fit in the budget;
    /// never the one named `keep`. Returns how many were removed.
    pub fn evict(&self, keep: &str) -> usize {
        let dir = &self.inner.dir;
        let mut entries = match rustix::fs::Dir::read_from(&self.inner.fd) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "compile cache: cannot list artifacts");
                return 0;
            }
        };
        let mut artifacts: Vec<(SystemTime, u64, String)> = Vec::new();
        while let Some(entry) = entries.read() {
            let Ok(entry) = entry else { break };
            let Ok(name) = entry.file_name().to_str() else { continue };
            if !name.ends_with(".cwasm") {
                continue;
            }
            let Ok(st) = rustix::fs::statat(&self.inner.fd, name, AtFlags::SYMLINK_NOFOLLOW) else {
                continue;
            };
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                continue;
            }
            let modified = SystemTime::UNIX_EPOCH
                + Duration::new(
                    u64::try_from(st.st_mtime).unwrap_or(0),
                    u32::try_from(st.st_mtime_nsec).unwrap_or(0),
                );
            artifacts.push((modified, u64::try_from(st.st_size).unwrap_or(0), name.to_owned()));
        }
        let mut total: u64 = artifacts.iter().map(|(_, len, _)| len).sum();
        // Oldest first; ties by name so the order is stable.
        artifacts.sort();
        let mut removed = 0;
        for (_, len, name) in artifacts {
            if total <= self.inner.max_bytes {
                break;
            }
            if name == keep {
                continue;
            }
            match rustix::fs::unlinkat(&self.inner.fd, name.as_str(), AtFlags::empty()) {
                Ok(()) => {
                    total = total.saturating_sub(len);
                    removed += 1;
                }
                Err(e) => {
                    tracing::warn!(path = %dir.join(&name).display(), error = %e, "compile cache: cannot remove an artifact")
                }
            }
        }
        removed
    }
}

/// Writes `parts` into a new file `name` in `dir`: a temporary file created exclusively
/// (0600, no link followed), written a page per write when `by_page` (the page cache then
/// holds it in single-page folios), synced and renamed into place.
fn write_new_file(dir: &OwnedFd, name: &str, parts: &[&[u8]], by_page: bool) -> std::io::Result<()> {
    let tmp = format!(".{}.{}.tmp", std::process::id(), rand::random::<u64>());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(dir, tmp.as_str(), flags, Mode::RUSR | Mode::WUSR).map_err(errno_io)?;
    let result = (|| {
        let mut f = std::fs::File::from(fd);
        let page = if by_page { page_size() } else { usize::MAX };
        for part in parts {
            for chunk in part.chunks(page) {
                f.write_all(chunk)?;
            }
        }
        f.sync_all()?;
        rustix::fs::renameat(dir, tmp.as_str(), dir, name).map_err(errno_io)
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    result
}

/// Reads the key in `dir`, or makes one (see the module's invariants).
fn load_or_create_key(dir: &OwnedFd, shown: &Path) -> std::io::Result<[u8; KEY_LEN]> {
    // Twice at most: a key another host linked in between our look and our link is read.
    for _ in 0..2 {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let unusable = match rustix::fs::openat(dir, KEY_FILE, flags, Mode::empty()) {
            Ok(fd) => match read_key(fd)? {
                Ok(key) => return Ok(key),
                Err(why) => Some(why),
            },
            Err(Errno::NOENT) => None,
            Err(Errno::LOOP) => Some("it is a symbolic link".to_owned()),
            Err(e) => return Err(errno_io(e)),
        };
        let mut key = [0u8; KEY_LEN];
        rand::TryRngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut key).map_err(std::io::Error::other)?;
        if let Some(why) = unusable {
            tracing::warn!(
                key = %shown.join(KEY_FILE).display(),
                reason = %why,
                "compile cache key unusable: replaced by a new key (every cached artifact will be compiled again)"
            );
            // Renamed over the old one (a link is replaced, not followed).
            write_new_file(dir, KEY_FILE, &[&key], false)?;
            return Ok(key);
        }
        let tmp = format!(".{}.{}.key.tmp", std::process::id(), rand::random::<u64>());
        let fd = rustix::fs::openat(
            dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(errno_io)?;
        let mut f = std::fs::File::from(fd);
        let written = f.write_all(&key).and_then(|()| f.sync_all());
        let linked = written.and_then(|()| {
            rustix::fs::linkat(dir, tmp.as_str(), dir, KEY_FILE, AtFlags::empty()).map_err(errno_io)
        });
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
        match linked {
            Ok(()) => {
                tracing::info!(key = %shown.join(KEY_FILE).display(), "compile cache: created this host's artifact key");
                return Ok(key);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other("the key file keeps changing under this host"))
}

/// The key in an opened key file, or why it is not usable.
fn read_key(fd: OwnedFd) -> std::io::Result<Result<[u8; KEY_LEN], String>> {
    use std::io::Read;
    let st = rustix::fs::fstat(&fd).map_err(errno_io)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Ok(Err("it is not a regular file".to_owned()));
    }
    if st.st_uid != euid() {
        return Ok(Err(format!("it belongs to uid {}, not to this host's uid {}", st.st_uid, euid())));
    }
    if st.st_mode & 0o077 != 0 {
        return Ok(Err(format!("group or others may access it (mode {:o})", st.st_mode & 0o7777)));
    }
    #[allow(clippy::useless_conversion)]
    if u64::from(st.st_nlink) != 1 {
        return Ok(Err("it has more than one hard link".to_owned()));
    }
    if st.st_size != KEY_LEN as i64 {
        return Ok(Err(format!("it holds {} bytes, not {KEY_LEN}", st.st_size)));
    }
    let mut key = [0u8; KEY_LEN];
    std::fs::File::from(fd).read_exact(&mut key)?;
    Ok(Ok(key))
}

/// The size of a memory page.
fn page_size() -> usize {
    // SAFETY: `sysconf` reads a constant of the system.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(4096)
}

/// A private read-only mapping of a whole file, unmapped when dropped.
struct Mapping {
    base: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn of(fd: impl AsFd, len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a new private read-only mapping of an open file; nothing else refers to it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                fd.as_fd().as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { base, len })
    }

    /// Under `MADV_RANDOM` when some page is not in the page cache, so that reading the
    /// mapping reads those pages one per fault, each into a folio of its own (readahead
    /// would have read large ones); pages already cached stay as they are.
    fn read_in_single_pages(&self) -> std::io::Result<()> {
        let page = page_size();
        // Which pages are cached: usually all of them, and then there is nothing to do.
        let mut cached = vec![0u8; self.len.div_ceil(page)];
        // SAFETY: `base..base + len` is this mapping; `cached` has a byte per page.
        if unsafe { libc::mincore(self.base, self.len, cached.as_mut_ptr()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if cached.iter().all(|c| c & 1 == 1) {
            return Ok(());
        }
        // SAFETY: as above.
        if unsafe { libc::madvise(self.base, self.len, libc::MADV_RANDOM) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes for as long as `self` lives. The file
        // is the host's own (owner and mode checked), replaced only by rename and removed by
        // unlink, never truncated in place, so every page exists.
        unsafe { std::slice::from_raw_parts(self.base.cast::<u8>(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `of`; nothing refers to it any more.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

#[cfg(test)]
#[path = "compile_cache_tests.rs"]
mod tests;
