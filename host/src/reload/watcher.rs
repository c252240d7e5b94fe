//! Following the plugins directory as files arrive, however they are delivered.
//!
//! The watches (inotify on Linux, through `notify`) are on directories, never on files, and
//! on what a path resolves to: the plugins directory itself (a swapped `plugins-dir`
//! symlink is seen in its parent, which is watched too, and every scan points the watch at
//! the new target), and each directory a plugin's code lives in outside it. Any change in a
//! watched directory is worth a scan, hidden names included: a ConfigMap or Secret volume
//! announces an update only by renaming its `..data` symlink.
//!
//! Invariants: after [`DirWatcher::point_at`], exactly the directories asked for (that exist)
//! are watched; an event reaches the manager when it concerns a watched directory's
//! contents, or the configured plugins directory's own entry in its parent.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tokio::sync::mpsc;

/// The directory watches of a manager.
pub struct DirWatcher {
    watcher: notify::RecommendedWatcher,
    /// Directories watched for their contents (resolved).
    contents: BTreeSet<PathBuf>,
    /// The parent of the configured plugins directory, watched for the directory's own entry.
    parent: Option<PathBuf>,
    /// The configured plugins directory (possibly a symlink).
    configured: PathBuf,
}

impl DirWatcher {
    /// Starts watching `plugins_dir`; events (changed paths) go to `tx`.
    pub fn new(plugins_dir: &Path, tx: mpsc::UnboundedSender<PathBuf>) -> notify::Result<Self> {
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            // Only changes count: reading a file (ours included) reports access events,
            // which must not trigger another read.
            Ok(event) if !matches!(event.kind, notify::EventKind::Access(_) | notify::EventKind::Other) => {
                for path in event.paths {
                    let _ = tx.send(path);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "plugins directory watch error"),
        })?;
        let mut me = DirWatcher {
            watcher,
            contents: BTreeSet::new(),
            parent: None,
            configured: plugins_dir.to_owned(),
        };
        let resolved = std::fs::canonicalize(plugins_dir).unwrap_or_else(|_| plugins_dir.to_owned());
        me.point_at(std::iter::once(resolved).collect())?;
        Ok(me)
    }

    /// Watches exactly `dirs` (resolved paths; the plugins directory's target among them)
    /// for their contents, and the configured plugins directory's parent for its entry.
    /// A directory that cannot be watched (gone) is skipped with a debug line; the first
    /// one, the plugins directory, must be watchable.
    pub fn point_at(&mut self, dirs: BTreeSet<PathBuf>) -> notify::Result<()> {
        use notify::Watcher;
        let parent = self
            .configured
            .parent()
            .map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p })
            .and_then(|p| std::fs::canonicalize(p).ok());
        let mut wanted = dirs.clone();
        wanted.extend(parent.clone());
        let have: BTreeSet<PathBuf> = self.contents.iter().cloned().chain(self.parent.clone()).collect();
        for gone in have.difference(&wanted) {
            let _ = self.watcher.unwatch(gone);
        }
        for new in wanted.difference(&have) {
            if let Err(error) = self.watcher.watch(new, notify::RecursiveMode::NonRecursive) {
                tracing::debug!(dir = %new.display(), %error, "cannot watch directory");
            }
        }
        self.contents = dirs;
        self.parent = parent;
        Ok(())
    }

    /// Whether an event on `path` may change what the plugins directory holds.
    pub fn concerns(&self, path: &Path) -> bool {
        let dir = path.parent();
        if dir.is_some_and(|d| self.contents.contains(d)) || self.contents.contains(path) {
            return true;
        }
        // In the parent: only the plugins directory's own entry.
        dir.is_some_and(|d| self.parent.as_deref() == Some(d))
            && path.file_name() == self.configured.file_name()
    }
}
