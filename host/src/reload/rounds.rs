//! When the manager runs a round: the loop that follows the plugins directory.
//!
//! Changes are seen through directory watches that follow symlinks (`watcher`), debounced
//! (a round runs once no file event came for a quiet period), through SIGHUP, through a
//! periodic full rescan, the safety net for whatever a watch cannot see (a network file
//! system, say), and — for plugins from a registry — through the registry source's tag
//! polls: a moved tag asks for a round as a file event does, so it is a reload with the
//! same hand-off rules. Each round plans (see `plan`) and brings every name it concerns in
//! line concurrently, one task per name (see `load`). The watches are re-pointed after each
//! round at what the plan needs; expired parked queues are dropped on time. At shutdown,
//! loads in progress finish, then every plugin is drained and stopped.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use super::manager_core::ManagerCore;
use super::watcher::DirWatcher;

/// What a [`PluginManager`](super::PluginManager) handle asks of its loop.
pub(super) enum Command {
    /// Reload every plugin whose files changed (SIGHUP does the same); reply when done.
    Rescan(oneshot::Sender<()>),
}

/// Follows the plugins directory until the shutdown token is cancelled, then stops every
/// plugin.
pub(super) async fn run_loop(
    shared: Arc<ManagerCore>,
    mut events: mpsc::UnboundedReceiver<PathBuf>,
    mut wakes: mpsc::UnboundedReceiver<()>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut watcher: Option<DirWatcher>,
) {
    let mut hangup = if shared.options.watch {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .inspect_err(|e| tracing::warn!(error = %e, "cannot listen for SIGHUP"))
            .ok()
    } else {
        None
    };
    if let Some(w) = watcher.as_mut() {
        shared.repoint(w);
    }
    let mut rescan = shared.options.rescan_interval.map(|every| {
        let mut t = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    // The time of the last file event not yet acted on.
    let mut pending: Option<Instant> = None;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let due = pending.map(|t| t + shared.options.debounce);
        let expiry = shared.parked.lock().next_expiry();
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            Some(path) = events.recv() => {
                if watcher.as_ref().is_none_or(|w| w.concerns(&path)) {
                    pending = Some(Instant::now());
                }
            }
            Some(()) = wakes.recv() => pending = Some(Instant::now()),
            Some(cmd) = commands.recv() => match cmd {
                Command::Rescan(done) => {
                    pending = None;
                    shared.rescan().await;
                    if let Some(w) = watcher.as_mut() {
                        shared.repoint(w);
                    }
                    let _ = done.send(());
                }
            },
            Some(()) = async { match &mut hangup { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                tracing::info!("SIGHUP: rescanning the plugins directory");
                pending = None;
                shared.rescan().await;
                if let Some(w) = watcher.as_mut() {
                    shared.repoint(w);
                }
            }
            _ = async { match &mut rescan { Some(t) => { t.tick().await; } None => std::future::pending().await } } => {
                tracing::debug!("periodic rescan of the plugins directory");
                for name in shared.plan().await {
                    let shared = shared.clone();
                    tasks.spawn(async move { shared.sync_name(&name).await });
                }
                if let Some(w) = watcher.as_mut() {
                    shared.repoint(w);
                }
            }
            _ = tokio::time::sleep_until(due.map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std)), if due.is_some() => {
                pending = None;
                for name in shared.plan().await {
                    let shared = shared.clone();
                    tasks.spawn(async move { shared.sync_name(&name).await });
                }
                if let Some(w) = watcher.as_mut() {
                    shared.repoint(w);
                }
            }
            _ = tokio::time::sleep_until(expiry.map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std)), if expiry.is_some() => {
                shared.parked.lock().expire(Instant::now());
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    // Let loads in progress finish (they are bounded by the sync timeout), then stop all.
    while tasks.join_next().await.is_some() {}
    shared.stop_all().await;
}

impl ManagerCore {
    /// Points the watches at what the latest plan needs.
    fn repoint(&self, watcher: &mut DirWatcher) {
        let dirs = self.watch_dirs.lock().clone();
        if !dirs.is_empty()
            && let Err(error) = watcher.point_at(dirs)
        {
            tracing::warn!(%error, "cannot watch the plugins directory");
        }
    }

    /// Plans a round and syncs every plugin it concerns, concurrently; returns when done.
    pub(super) async fn rescan(self: &Arc<Self>) {
        let names = self.plan().await;
        let mut set = tokio::task::JoinSet::new();
        for name in names {
            let me = self.clone();
            set.spawn(async move { me.sync_name(&name).await });
        }
        while set.join_next().await.is_some() {}
    }
}
