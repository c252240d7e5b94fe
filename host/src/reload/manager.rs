//! The plugins directory manager: turns plugin TOMLs (and the code they name) into running
//! controllers and follows the directory as files change.
//!
//! A plugin is its `name` (the TOML's `name`, or the file's stem), not its file. Each round
//! reads the directory as one snapshot (`snapshot`), decides what each name should run
//! (`plan`: names, renames, conflicts and field managers), and brings every name in line,
//! concurrently (one task per name, a per-name lock serializing the loads, hand-offs and
//! stops of one plugin; see `load`). Loading a version builds and checks it before anything
//! running is touched (`candidate`); the hand-offs themselves are in `handoff`; when rounds
//! run (file events, SIGHUP, periodic rescans, registry tags) is in `rounds`.
//!
//! This module is the handle: [`PluginManager`], started with [`ManagerOptions`] and
//! [`ManagerDeps`].

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::manager_core::ManagerCore;
use super::parked::ParkedQueues;
use super::rounds::{Command, run_loop};
use super::status::StatusBoard;
use super::watcher::DirWatcher;

pub use super::options::{DEFAULT_PARKED_KEYS_TTL, DEFAULT_RESCAN_INTERVAL, ManagerDeps, ManagerOptions};

/// Why the manager could not start.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error("plugins directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("watching plugins directory {dir}: {source}")]
    Watch {
        dir: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// Runs the plugins of one directory. Dropping it does not stop the plugins: cancel the
/// shutdown token given to [`PluginManager::start`] and await [`PluginManager::stopped`].
pub struct PluginManager {
    status: StatusBoard,
    commands: mpsc::UnboundedSender<Command>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for PluginManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginManager").field("status", &self.status).finish_non_exhaustive()
    }
}

impl PluginManager {
    /// Loads every plugin of the directory (an invalid one is reported and skipped), then
    /// follows the directory until `shutdown` is cancelled, when every plugin is drained and
    /// stopped. Returns once the initial load is done.
    pub async fn start(
        options: ManagerOptions,
        deps: ManagerDeps,
        shutdown: CancellationToken,
    ) -> Result<Self, ManagerError> {
        let dir = options.plugins_dir.clone();
        if !dir.is_dir() {
            return Err(ManagerError::Dir {
                dir,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
            });
        }
        let status = StatusBoard::new(deps.metrics.clone());
        let (events_tx, events_rx) = mpsc::unbounded_channel::<PathBuf>();
        // Watch before the first scan, so a change made during it is not missed.
        let watcher = if options.watch {
            Some(
                DirWatcher::new(&dir, events_tx)
                    .map_err(|source| ManagerError::Watch { dir: dir.clone(), source })?,
            )
        } else {
            None
        };
        // Rounds asked for by the manager itself (a file still being written) and by the
        // registry source (a plugin's tag moved, or a pull that failed may now succeed):
        // not file events, so never filtered by what the watches cover.
        let (wake_tx, wake_rx) = mpsc::unbounded_channel::<()>();
        if let Some(registry) = &options.registry {
            let tx = wake_tx.clone();
            registry.on_change(move |_| {
                let _ = tx.send(());
            });
        }
        let parked = ParkedQueues::new(options.parked_keys_ttl, deps.metrics.clone());
        let shared = Arc::new(ManagerCore {
            options,
            deps,
            status: status.clone(),
            slots: Mutex::default(),
            desired: Mutex::default(),
            runs: Mutex::default(),
            refused_managers: Mutex::default(),
            parked: Mutex::new(parked),
            watch_dirs: Mutex::default(),
            rename_wait: Mutex::default(),
            shutdown: shutdown.clone(),
            wake: wake_tx,
        });
        shared.rescan().await;
        status.mark_started();
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run_loop(shared, events_rx, wake_rx, commands_rx, watcher));
        Ok(PluginManager { status, commands, task })
    }

    /// The per-plugin status (serve it as the HTTP server's [`crate::server::StatusSource`]).
    pub fn status(&self) -> StatusBoard {
        self.status.clone()
    }

    /// Re-reads the whole directory now (as SIGHUP does) and returns when done.
    pub async fn rescan(&self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Rescan(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// Waits until the manager stopped (after its shutdown token was cancelled, every plugin
    /// drained).
    pub async fn stopped(self) {
        let _ = self.task.await;
    }
}
