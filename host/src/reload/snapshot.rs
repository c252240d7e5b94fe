//! One consistent read of the plugins directory: every plugin TOML, parsed, with the name it
//! claims.
//!
//! Files arrive in many ways: written in place, renamed into place, through a ConfigMap or
//! Secret volume (the kubelet writes a new `..<timestamp>` directory and renames a
//! `..data_tmp` symlink over `..data`; `mirror.toml -> ..data/mirror.toml` never changes
//! itself), or with the whole `plugins-dir` a symlink a deploy tool swaps. So the directory
//! is read through its symlinks, and a read counts only if nothing moved under it: every
//! file is identified by what it resolves to (the real path, device, inode, size and
//! modification time), before and after the read; a read that saw a change is repeated.
//!
//! A volume is also read only between two updates: the kubelet swaps `..data` first and
//! only then links the new files' names and removes the links of files gone, so for a
//! moment the visible files are not what the volume holds (a renamed file has neither
//! name). A read that sees that moment is repeated, like one that saw a change.
//!
//! Invariants: a [`Snapshot`] holds, for each TOML, the bytes of one version of it and the
//! identity of the file they came from ([`FileId`]); the listing and every identity were the
//! same before and after the TOMLs were read, and a volume's visible files matched its
//! `..data` both times. Hidden files (the volume's `..data`, editors' temporaries) are never
//! plugins (see `scan`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::scan::{is_plugin_file, read_settled};
use crate::config::{PluginConfig, PluginDefaults};

/// What a path resolves to, and the state of that file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileId {
    pub real: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub len: u64,
    pub modified: Option<std::time::SystemTime>,
}

impl FileId {
    /// The identity of `path` (following symlinks); `None` when it does not exist.
    pub fn of(path: &Path) -> std::io::Result<Option<FileId>> {
        use std::os::unix::fs::MetadataExt;
        let real = match std::fs::canonicalize(path) {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = match std::fs::metadata(&real) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some(FileId {
            real,
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        }))
    }
}

/// One plugin TOML as read.
#[derive(Clone, Debug)]
pub struct Claim {
    /// The TOML's path in the plugins directory (as configured, not resolved).
    pub toml: PathBuf,
    pub id: FileId,
    /// The checked TOML, or why it is refused (file, line and field).
    pub config: Result<PluginConfig, String>,
}

impl Claim {
    pub fn stem(&self) -> String {
        self.toml.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    }

    /// Whether the TOML names its plugin (`name = ...`) rather than taking its file's stem.
    pub fn explicit_name(&self) -> bool {
        self.config.as_ref().is_ok_and(|c| c.file.name.is_some())
    }
}

/// The plugins directory at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The directory the configured path resolved to.
    pub real_dir: Option<PathBuf>,
    /// By TOML path, sorted.
    pub claims: Vec<Claim>,
}

/// How many times a read that saw the directory change is repeated before giving up for
/// this round (the watcher or the next rescan brings the next one).
const ATTEMPTS: usize = 5;

/// Reads `dir` consistently (see the module doc). `Ok(None)`: the directory kept changing
/// while being read; read it again after the next quiet period.
pub fn read(dir: &Path, defaults: &PluginDefaults) -> std::io::Result<Option<Snapshot>> {
    for _ in 0..ATTEMPTS {
        if !volume_settled(dir)? {
            continue;
        }
        let before = listing(dir)?;
        let mut claims = Vec::with_capacity(before.len());
        let mut settled = true;
        for (toml, id) in &before {
            match read_settled(toml) {
                Ok((bytes, _)) => {
                    let config = match std::str::from_utf8(&bytes) {
                        Ok(text) => PluginConfig::parse(toml, text, defaults).map_err(|e| e.to_string()),
                        Err(e) => Err(format!("{}: not UTF-8: {e}", toml.display())),
                    };
                    claims.push(Claim { toml: toml.clone(), id: id.clone(), config });
                }
                Err(e)
                    if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::WouldBlock) =>
                {
                    settled = false;
                    break;
                }
                Err(e) => {
                    let config = Err(format!("{}: cannot read: {e}", toml.display()));
                    claims.push(Claim { toml: toml.clone(), id: id.clone(), config });
                }
            }
        }
        if settled && listing(dir)? == before && volume_settled(dir)? {
            return Ok(Some(Snapshot { real_dir: std::fs::canonicalize(dir).ok(), claims }));
        }
    }
    Ok(None)
}

/// Whether `dir`, if it is a ConfigMap or Secret volume (it has `..data`), is between two
/// updates: every entry of `..data` has its visible link, and no link into `..data` dangles.
fn volume_settled(dir: &Path) -> std::io::Result<bool> {
    let data = dir.join("..data");
    if std::fs::symlink_metadata(&data).is_err() {
        return Ok(true);
    }
    let entries = match std::fs::read_dir(&data) {
        Ok(entries) => entries,
        // `..data` points nowhere: not a moment to read.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        if !name.to_string_lossy().starts_with("..") && std::fs::symlink_metadata(dir.join(&name)).is_err() {
            return Ok(false);
        }
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if let Ok(target) = std::fs::read_link(&path)
            && target.starts_with("..data")
            && !path.exists()
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The plugin TOMLs of `dir` with their identities, by path.
fn listing(dir: &Path) -> std::io::Result<BTreeMap<PathBuf, FileId>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !is_plugin_file(&path) || path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        // A dangling link (a volume mid-swap) or a directory is not a TOML.
        if let Some(id) = FileId::of(&path)?
            && std::fs::metadata(&id.real).is_ok_and(|m| m.is_file())
        {
            out.insert(path, id);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_style_swap_changes_the_identity_of_every_file_behind_it() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let v1 = d.join("..v1");
        std::fs::create_dir(&v1).unwrap();
        std::fs::write(v1.join("p.toml"), "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n").unwrap();
        std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/p.toml", d.join("p.toml")).unwrap();
        let first = read(d, &PluginDefaults::default()).unwrap().unwrap();
        assert_eq!(first.claims.len(), 1, "hidden entries are not plugins");
        assert!(first.claims[0].config.is_ok());

        let v2 = d.join("..v2");
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(
            v2.join("p.toml"),
            "concurrency = 2\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("..v2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        std::fs::remove_dir_all(&v1).unwrap();
        let second = read(d, &PluginDefaults::default()).unwrap().unwrap();
        assert_ne!(first.claims[0].id, second.claims[0].id);
        assert_eq!(second.claims[0].config.as_ref().map(|c| c.concurrency).ok(), Some(2));
        assert_eq!(second.claims[0].toml, d.join("p.toml"), "claims keep the configured path");
    }

    #[test]
    fn a_volume_between_its_data_swap_and_its_links_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let toml = "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n";
        std::fs::create_dir(d.join("..v1")).unwrap();
        std::fs::write(d.join("..v1/a.toml"), toml).unwrap();
        std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/a.toml", d.join("a.toml")).unwrap();
        assert_eq!(read(d, &PluginDefaults::default()).unwrap().unwrap().claims.len(), 1);
        // `a.toml` renamed `b.toml`: `..data` swapped, `b.toml` not linked yet.
        std::fs::create_dir(d.join("..v2")).unwrap();
        std::fs::write(d.join("..v2/b.toml"), toml).unwrap();
        std::os::unix::fs::symlink("..v2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        assert!(read(d, &PluginDefaults::default()).unwrap().is_none(), "a new name not linked yet");
        std::os::unix::fs::symlink("..data/b.toml", d.join("b.toml")).unwrap();
        assert!(read(d, &PluginDefaults::default()).unwrap().is_none(), "an old link dangling");
        std::fs::remove_file(d.join("a.toml")).unwrap();
        let settled = read(d, &PluginDefaults::default()).unwrap().unwrap();
        assert_eq!(settled.claims.iter().map(|c| c.stem()).collect::<Vec<_>>(), ["b"]);
    }
}
