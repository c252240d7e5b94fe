//! The plugins directory manager: turns plugin TOMLs (and the code they name) into running
//! controllers and follows the directory as files change.
//!
//! A plugin is its `name` (the TOML's `name`, or the file's stem), not its file. Each round
//! reads the directory as one snapshot (`snapshot`), decides what each name should run
//! ([`Shared::plan`]), and brings every name in line, concurrently (one task per name, a
//! per-name lock serializing the loads, hand-offs and stops of one plugin):
//!
//! - a name whose TOML moved to another file is the same plugin: the move is a reload like
//!   any other (its queue, retries and pending deletes follow it);
//! - two files renamed together (TOML and code, contents unchanged, within one quiet
//!   period) are a rename of the same plugin even with default names: a controller restart
//!   under the new name that hands the queue over (and what it parked moves along). A
//!   round that reads the TOML renamed and its code not yet (the old code still there: a
//!   slow script, or a periodic rescan between the two renames) leaves the plugin as it is
//!   and waits for the code to follow, for [`RENAME_GRACE`] or a few quiet periods;
//! - two files that claim one name: the file the running version came from keeps it (else
//!   the first by path), the other is refused, in `/plugins` and `/readyz`, and loads once
//!   the conflict is gone (decided in one place, the plan, so there is no race);
//! - a name no file claims any more stops (its pending keys are parked with their kind, see
//!   `parked`).
//!
//! Loading one version: the checked TOML from the snapshot, its kinds resolved against
//! discovery, its code fetched ([`CodeSource`]: the one seam between a TOML and its bytes),
//! the TOML checked unchanged since the snapshot (so code and TOML are of one moment),
//! leases on its informers synced, the component compiled and its `init` run — all before
//! anything running is touched. Any failure rejects this version: logged, counted in
//! `wasmctrl_plugin_reloads_total{result="rejected"}`, shown in `/plugins` and `/readyz`;
//! a running version keeps running. The hand-offs themselves are in `handoff`.
//!
//! Admission (a plugin with `[[admission]]`, see [`crate::admission`]): once a new version
//! took over, the admission router is pointed at it in one swap — reviews after it go to the
//! new version, reviews in flight finish on the old one; a stopped plugin's webhooks go
//! first. A version whose sections need exports its component lacks, or a host without an
//! admission server, is rejected like any broken version.
//!
//! A running version whose code file is gone keeps running (its compiled code is kept
//! loaded from then on) and says so in `/plugins` and `/readyz`; a TOML edit meanwhile is
//! applied with the running version's compiled code, or refused saying why.
//!
//! Changes are seen through directory watches that follow symlinks (`watcher`), debounced,
//! through SIGHUP, and through a periodic full rescan, the safety net for whatever a watch
//! cannot see (a network file system, say).
//!
//! Field managers are unique like names: no plugin's manager is another's, or another's
//! followed by `/` (no plugin writes as another). The plan decides it as it decides names:
//! the running plugin keeps its manager, the other claim is refused until the overlap goes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::code_source::{Code, CodeSource, Fetched};
use super::handoff::{Candidate, Running, needs_restart};
use super::parked::ParkedQueues;
use super::snapshot::{Claim, FileId};
use super::status::{PluginState, StatusBoard};
use super::watcher::DirWatcher;
use super::wiring::{Generation, InformerLeases, Leases};
use crate::admission::AdmissionRouter;
use crate::config::{
    ConfigErrors, KindLookupError, KindResolver, PluginConfig, PluginDefaults, PluginToml, ResolvedKind,
};
use crate::metrics::Metrics;
use crate::plugin::spec::field_managers_overlap;
use crate::plugin::{Gvk, KubeServices, Plugin, PluginEngine, PluginEnv, PluginReconciler};

/// Where the plugins are and how to treat them.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    pub plugins_dir: PathBuf,
    /// Defaults for plugin TOMLs (the host TOML's `[defaults]`).
    pub defaults: PluginDefaults,
    /// How long informers may take to sync before a load fails.
    pub cache_sync_timeout: Duration,
    /// Quiet period after the last file event before files are read.
    pub debounce: Duration,
    /// Follow the directory (file events and SIGHUP). Off: load once (and on
    /// [`PluginManager::rescan`] or the periodic rescan).
    pub watch: bool,
    /// Read the whole directory again this often, whatever the watches saw (`None`: never).
    pub rescan_interval: Option<Duration>,
    /// How long the pending keys of a stopped plugin are kept for its return.
    pub parked_keys_ttl: Duration,
    /// Where admitting plugins' versions are installed (the host's admission server);
    /// `None`: the host serves no admission, and a plugin with `[[admission]]` is refused.
    pub admission: Option<AdmissionRouter>,
}

/// Default of [`ManagerOptions::rescan_interval`].
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(60);
/// Default of [`ManagerOptions::parked_keys_ttl`].
pub const DEFAULT_PARKED_KEYS_TTL: Duration = Duration::from_secs(3600);

impl ManagerOptions {
    /// Options for `plugins_dir` with defaults (200 ms debounce, 2 min sync timeout,
    /// watching, a full rescan every minute, pending keys kept for an hour).
    pub fn new(plugins_dir: impl Into<PathBuf>) -> Self {
        ManagerOptions {
            plugins_dir: plugins_dir.into(),
            defaults: PluginDefaults::default(),
            cache_sync_timeout: Duration::from_secs(120),
            debounce: Duration::from_millis(200),
            watch: true,
            rescan_interval: Some(DEFAULT_RESCAN_INTERVAL),
            parked_keys_ttl: DEFAULT_PARKED_KEYS_TTL,
            admission: None,
        }
    }
}

/// What the manager runs plugins with.
#[derive(Clone)]
pub struct ManagerDeps {
    pub engine: PluginEngine,
    pub informers: Arc<dyn InformerLeases>,
    /// Cluster access for plugins' `client` and `events` imports (`None`: refused).
    pub kube: Option<Arc<KubeServices>>,
    pub metrics: Arc<Metrics>,
}

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

enum Command {
    /// Reload every plugin whose files changed (SIGHUP does the same); reply when done.
    Rescan(oneshot::Sender<()>),
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
                DirWatcher::new(&dir, events_tx.clone())
                    .map_err(|source| ManagerError::Watch { dir: dir.clone(), source })?,
            )
        } else {
            None
        };
        let parked = ParkedQueues::new(options.parked_keys_ttl, deps.metrics.clone());
        let shared = Arc::new(Shared {
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
            retry: events_tx,
        });
        shared.rescan().await;
        status.mark_started();
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run_loop(shared, events_rx, commands_rx, watcher));
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

type Slot = Arc<tokio::sync::Mutex<Option<Running>>>;

/// What runs under a name, as the plan needs to know it.
#[derive(Clone, Debug)]
struct RunInfo {
    toml: PathBuf,
    file: PluginToml,
    version: String,
    /// The field manager the running version writes as.
    field_manager: String,
    /// Where its code came from.
    wasm: PathBuf,
}

/// How long a rename whose TOML moved before its code is waited for (at least; four quiet
/// periods when that is longer), before the two files are taken for what they are.
pub const RENAME_GRACE: Duration = Duration::from_secs(2);

pub(super) struct Shared {
    pub(super) options: ManagerOptions,
    pub(super) deps: ManagerDeps,
    pub(super) status: StatusBoard,
    /// Per plugin name; the async mutex serializes loads, swaps and stops of one plugin.
    slots: Mutex<BTreeMap<String, Slot>>,
    /// Name → the TOML it should run (the latest plan).
    desired: Mutex<BTreeMap<String, Claim>>,
    /// Name → what runs under it.
    runs: Mutex<BTreeMap<String, RunInfo>>,
    /// Names whose claim the latest plan refused for its field manager.
    refused_managers: Mutex<BTreeSet<String>>,
    /// Queues of plugins that are not running, by name and kind.
    pub(super) parked: Mutex<ParkedQueues>,
    /// The directories the latest plan wants watched.
    watch_dirs: Mutex<BTreeSet<PathBuf>>,
    /// Since when a rename has waited for its code to follow (see [`RENAME_GRACE`]).
    rename_wait: Mutex<Option<Instant>>,
    pub(super) shutdown: CancellationToken,
    /// Feeds a path back into the debouncer (a file that was still being written).
    retry: mpsc::UnboundedSender<PathBuf>,
}

async fn run_loop(
    shared: Arc<Shared>,
    mut events: mpsc::UnboundedReceiver<PathBuf>,
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

/// A failed load, with the reason shown to users.
pub(super) struct Rejection(pub String);

impl From<ConfigErrors> for Rejection {
    fn from(e: ConfigErrors) -> Self {
        Rejection(e.to_string())
    }
}

/// Discovery answers gathered up front, so the sync config checks can use them.
struct ResolvedKinds(BTreeMap<Gvk, Result<ResolvedKind, KindLookupError>>);

impl KindResolver for ResolvedKinds {
    fn resolve(&self, kind: &Gvk) -> Result<ResolvedKind, KindLookupError> {
        self.0.get(kind).cloned().unwrap_or(Err(KindLookupError::Unknown))
    }
}

/// The code a candidate version is built from.
enum CodeInput {
    /// Bytes just fetched.
    Bytes(Code),
    /// The running version's compiled code (its file is gone): its full content hash.
    Loaded { full: String, short: String },
}

impl CodeInput {
    fn version(&self) -> &str {
        match self {
            CodeInput::Bytes(c) => &c.version,
            CodeInput::Loaded { short, .. } => short,
        }
    }
}

/// Step 6: checks a compiled component against its TOML (the hooks it exports, the
/// informers and predicates its handlers need) and wraps it in a dispatcher whose hooks stay
/// closed until they are opened by the hand-off.
fn check_component(
    config: &PluginConfig,
    leases: &Leases,
    plugin: Plugin,
) -> Result<Arc<PluginReconciler>, Rejection> {
    let hooks = plugin.hooks();
    config.check_hooks(hooks.map, hooks.filter)?;
    let reconciler = PluginReconciler::new_gated(plugin)
        .map_err(|e| Rejection(format!("cannot start the plugin's dispatcher: {e}")))?;
    Generation::check(config, leases, &super::slot::VersionSlot::new(reconciler.clone()))
        .map_err(Rejection)?;
    Ok(reconciler)
}

impl Shared {
    fn slot(&self, name: &str) -> Slot {
        self.slots.lock().entry(name.to_owned()).or_default().clone()
    }

    /// Asks for another round after the next quiet period.
    fn retry_later(&self) {
        let _ = self.retry.send(self.options.plugins_dir.clone());
    }

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
    async fn rescan(self: &Arc<Self>) {
        let names = self.plan().await;
        let mut set = tokio::task::JoinSet::new();
        for name in names {
            let me = self.clone();
            set.spawn(async move { me.sync_name(&name).await });
        }
        while set.join_next().await.is_some() {}
    }

    /// Reads the directory as one snapshot and decides which file each plugin name runs
    /// from (see the module doc). Returns the names to sync: every one claimed or running.
    async fn plan(self: &Arc<Self>) -> Vec<String> {
        let dir = self.options.plugins_dir.clone();
        let defaults = self.options.defaults.clone();
        let read = tokio::task::spawn_blocking(move || super::snapshot::read(&dir, &defaults)).await;
        let snapshot = match read {
            Ok(Ok(Some(s))) => s,
            Ok(Ok(None)) => {
                tracing::debug!("the plugins directory changed while being read; reading it again later");
                self.retry_later();
                return Vec::new();
            }
            Ok(Err(e)) => {
                tracing::error!(dir = %self.options.plugins_dir.display(), error = %e, "cannot read the plugins directory");
                return Vec::new();
            }
            Err(e) => {
                tracing::error!(error = %e, "reading the plugins directory failed");
                return Vec::new();
            }
        };
        let runs = self.runs.lock().clone();
        let mut by_name: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        for claim in snapshot.claims {
            let name = match &claim.config {
                Ok(c) => c.name.clone(),
                // A broken TOML concerns the plugin that runs from it, else its stem's.
                Err(_) => runs
                    .iter()
                    .find(|(_, r)| r.toml == claim.toml)
                    .map(|(n, _)| n.clone())
                    .unwrap_or_else(|| claim.stem()),
            };
            by_name.entry(name).or_default().push(claim);
        }
        let mut desired: BTreeMap<String, Claim> = BTreeMap::new();
        let mut refused: Vec<(Claim, String, Refusal)> = Vec::new();
        for (name, mut claims) in by_name {
            // The file the running version came from keeps its name; else the first by path.
            let at =
                claims.iter().position(|c| runs.get(&name).is_some_and(|r| r.toml == c.toml)).unwrap_or(0);
            let winner = claims.remove(at);
            for other in claims {
                refused.push((other, name.clone(), Refusal::Name(winner.toml.clone())));
            }
            desired.insert(name, winner);
        }
        self.refuse_shared_field_managers(&runs, &mut desired, &mut refused);
        let waiting = self.find_renames(&runs, &desired).await;
        if !waiting.is_empty() {
            // A rename half-way: both names stay as the previous plan had them.
            let previous = self.desired.lock();
            for name in &waiting {
                match previous.get(name) {
                    Some(claim) => desired.insert(name.clone(), claim.clone()),
                    None => desired.remove(name),
                };
            }
        }
        self.record_refused(refused, &desired);
        let mut dirs: BTreeSet<PathBuf> = snapshot.real_dir.into_iter().collect();
        for claim in desired.values() {
            if let Ok(config) = &claim.config
                && let Some(d) = CodeSource::of(config).watch_dir()
                && let Ok(d) = std::fs::canonicalize(d)
            {
                dirs.insert(d);
            }
        }
        *self.watch_dirs.lock() = dirs;
        let mut names: BTreeSet<String> = desired.keys().cloned().collect();
        names.extend(self.slots.lock().keys().cloned());
        *self.desired.lock() = desired;
        names.into_iter().filter(|n| !waiting.contains(n)).collect()
    }

    /// A running plugin with a default name whose files were renamed together (same TOML
    /// contents, same code) is the same plugin under its new name: its slot and the queues
    /// it parked move there, and the load that follows is a restart that hands its queue
    /// over.
    ///
    /// Returns the names to leave alone this round: a rename read half-way (the TOML under
    /// its new name, the code not yet, the old code still there) waits for the code to
    /// follow, for at most [`RENAME_GRACE`] (or four quiet periods), before the files are
    /// taken for what they are (the old plugin stopped, the new one waiting for its code).
    async fn find_renames(
        &self,
        runs: &BTreeMap<String, RunInfo>,
        desired: &BTreeMap<String, Claim>,
    ) -> BTreeSet<String> {
        let gone: Vec<(&String, &RunInfo)> =
            runs.iter().filter(|(n, r)| !desired.contains_key(*n) && r.file.name.is_none()).collect();
        let mut waiting = BTreeSet::new();
        let mut taken = BTreeSet::new();
        for (name, claim) in desired {
            let Ok(config) = &claim.config else { continue };
            if gone.is_empty() || runs.contains_key(name) || claim.explicit_name() {
                continue;
            }
            let Some((old, info)) =
                gone.iter().find(|(o, r)| !taken.contains(*o) && r.file == config.file).copied()
            else {
                continue;
            };
            match CodeSource::of(config).fetch().await {
                Ok(Fetched::Ready(code)) if code.version == info.version => {}
                Ok(Fetched::Missing) => {
                    let old_code = CodeSource::File(info.wasm.clone()).fetch().await;
                    if matches!(old_code, Ok(Fetched::Ready(code)) if code.version == info.version) {
                        tracing::debug!(plugin = %name, previous_name = %old,
                            "a plugin's TOML was renamed and its code not yet: waiting for the code to follow");
                        waiting.extend([name.clone(), old.clone()]);
                    }
                    continue;
                }
                _ => continue,
            }
            taken.insert(old.clone());
            tracing::info!(plugin = %name, previous_name = %old, file = %claim.toml.display(),
                "plugin files renamed together: the same plugin under a new name");
            let mut slots = self.slots.lock();
            if slots.get(name).is_none_or(|s| Arc::strong_count(s) <= 1)
                && let Some(slot) = slots.remove(old)
            {
                slots.insert(name.clone(), slot);
                drop(slots);
                let mut runs = self.runs.lock();
                if let Some(info) = runs.remove(old) {
                    runs.insert(name.clone(), info);
                }
                drop(runs);
                // What it parked (keys of a `for` kind it left) is its too.
                self.parked.lock().rename(old, name);
                self.status.remove(old);
            }
        }
        let mut since = self.rename_wait.lock();
        if waiting.is_empty() {
            *since = None;
            return waiting;
        }
        let grace = RENAME_GRACE.max(self.options.debounce * 4);
        if since.get_or_insert_with(Instant::now).elapsed() >= grace {
            tracing::info!(plugins = ?waiting, "the code of a renamed plugin TOML did not follow in time; taking the files as they are");
            *since = None;
            return BTreeSet::new();
        }
        drop(since);
        self.retry_later();
        waiting
    }

    /// Refuses every desired claim of a plugin that does not run whose field manager
    /// overlaps (see [`field_managers_overlap`]) the manager of a running plugin, or of
    /// another such claim first by name. The refused claims leave `desired` and load once
    /// the overlap is gone. A running plugin's new version is checked when it loads
    /// ([`Self::check_field_manager`]): refused there, its running version keeps running.
    fn refuse_shared_field_managers(
        &self,
        runs: &BTreeMap<String, RunInfo>,
        desired: &mut BTreeMap<String, Claim>,
        refused: &mut Vec<(Claim, String, Refusal)>,
    ) {
        let mut kept: Vec<(String, PathBuf)> = runs
            .iter()
            .filter(|(name, _)| desired.contains_key(*name))
            .map(|(_, r)| (r.field_manager.clone(), r.toml.clone()))
            .collect();
        let mut losers = Vec::new();
        for (name, claim) in desired.iter() {
            let Ok(config) = &claim.config else { continue };
            if runs.contains_key(name) {
                continue;
            }
            match kept.iter().find(|(theirs, _)| field_managers_overlap(theirs, &config.field_manager)) {
                Some((theirs, toml)) => losers.push((
                    name.clone(),
                    Refusal::FieldManager {
                        mine: config.field_manager.clone(),
                        theirs: theirs.clone(),
                        toml: toml.clone(),
                    },
                )),
                None => kept.push((config.field_manager.clone(), claim.toml.clone())),
            }
        }
        for (name, why) in losers {
            if let Some(claim) = desired.remove(&name) {
                refused.push((claim, name, why));
            }
        }
    }

    /// Refuses a new version of `name` whose field manager overlaps the manager of another
    /// running plugin (no plugin writes as another).
    fn check_field_manager(&self, name: &str, config: &PluginConfig) -> Result<(), Rejection> {
        let runs = self.runs.lock();
        let Some((other, info)) = runs.iter().find(|(n, r)| {
            n.as_str() != name && field_managers_overlap(&r.field_manager, &config.field_manager)
        }) else {
            return Ok(());
        };
        Err(Rejection(
            config
                .field_error(
                    "field-manager",
                    format!(
                        "field manager `{}` overlaps `{}`, the field manager of plugin {other} ({}): \
                         a plugin writes only as its own manager",
                        config.field_manager,
                        info.field_manager,
                        info.toml.display()
                    ),
                )
                .with_hint("give each plugin a field manager of its own (the default, `wasmctrl-<name>`, is)")
                .to_string(),
        ))
    }

    /// Shows each refused claim (another file has its name or its field manager) in the
    /// status, and clears the entries of claims no longer refused.
    fn record_refused(&self, refused: Vec<(Claim, String, Refusal)>, desired: &BTreeMap<String, Claim>) {
        let mut ids = BTreeSet::new();
        let mut by_manager = BTreeSet::new();
        for (claim, name, why) in refused {
            // A claim refused for its name is shown under its file (the name is another's);
            // one refused for its field manager under its own name, which nothing else runs.
            let id = match why {
                Refusal::Name(_) => claim.toml.display().to_string(),
                Refusal::FieldManager { .. } => {
                    by_manager.insert(name.clone());
                    name.clone()
                }
            };
            let file_name = |p: &PathBuf| {
                p.file_name().map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into_owned())
            };
            let error = match (&claim.config, why) {
                (Ok(config), Refusal::Name(winner)) => config
                    .field_error(
                        "name",
                        format!(
                            "plugin name `{name}` is already used by {}; a name can run from one file only (this one loads once the other is gone or renamed)",
                            file_name(&winner)
                        ),
                    )
                    .to_string(),
                (Ok(config), Refusal::FieldManager { mine, theirs, toml }) => config
                    .field_error(
                        "field-manager",
                        format!(
                            "field manager `{mine}` overlaps `{theirs}`, the field manager of {}: \
                             a plugin writes only as its own manager (this one loads once the overlap is gone)",
                            file_name(&toml)
                        ),
                    )
                    .with_hint("give each plugin a field manager of its own (the default, `wasmctrl-<name>`, is)")
                    .to_string(),
                (Err(e), _) => e.clone(),
            };
            self.status.update(&id, claim.toml.clone(), |s| {
                s.name = name.clone();
                s.state = PluginState::Failed;
                if s.last_error.as_deref() != Some(error.as_str()) {
                    s.rejected += 1;
                }
                s.last_error = Some(error);
            });
            ids.insert(id);
        }
        for id in self.status.ids() {
            if id.contains('/') && !ids.contains(&id) {
                self.status.remove(&id);
            }
        }
        // A name refused for its field manager in an earlier round whose claim is neither
        // refused nor wanted now (its file is gone) leaves the status.
        let mut previous = self.refused_managers.lock();
        for name in previous.difference(&by_manager) {
            if !desired.contains_key(name) && !self.runs.lock().contains_key(name) {
                self.status.remove(name);
            }
        }
        *previous = by_manager;
    }

    /// Brings the plugin `name` in line with the latest plan.
    async fn sync_name(self: &Arc<Self>, name: &str) {
        let (slot, mut running) = loop {
            let slot = self.slot(name);
            let guard = slot.clone().lock_owned().await;
            // The slot may have moved (a rename) or gone (a stop) while this task waited.
            if self.slots.lock().get(name).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                break (slot, guard);
            }
        };
        if self.shutdown.is_cancelled() {
            return;
        }
        let claim = self.desired.lock().get(name).cloned();
        let Some(claim) = claim else {
            if let Some(r) = running.take() {
                self.stop_plugin(name, r).await;
            }
            self.status.remove(name);
            self.runs.lock().remove(name);
            let mut slots = self.slots.lock();
            if slots.get(name).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                slots.remove(name);
            }
            return;
        };
        if let Err(Rejection(error)) = self.load(name, &claim, &mut running).await {
            let keeps = running.as_ref().map(|r| r.generation.version.clone());
            tracing::warn!(
                plugin = %name,
                file = %claim.toml.display(),
                running_version = keeps.as_deref().unwrap_or("none"),
                error = %error,
                "plugin rejected{}",
                if keeps.is_some() { "; the running version keeps running" } else { "" }
            );
            self.status.count_reload(name, false);
            self.status.update(name, claim.toml.clone(), |s| {
                s.name = name.to_owned();
                s.last_error = Some(error);
                s.rejected += 1;
                if keeps.is_none() {
                    s.state = PluginState::Failed;
                }
            });
        }
    }

    /// Loads the version `claim` describes and starts, swaps or restarts the plugin.
    /// Nothing running changes unless every check passed.
    ///
    /// The steps, in this order: the TOML as read by the plan, its kinds resolved
    /// ([`Self::resolve_kinds`]), its code fetched ([`CodeSource::fetch`]) and the TOML
    /// checked unchanged since, then [`Self::apply`].
    async fn load(
        self: &Arc<Self>,
        name: &str,
        claim: &Claim,
        running: &mut Option<Running>,
    ) -> Result<(), Rejection> {
        let started = Instant::now();
        let config = claim.config.clone().map_err(Rejection)?;
        if running.is_none() {
            self.status.update(name, claim.toml.clone(), |s| {
                s.name = name.to_owned();
                s.state = PluginState::Starting;
            });
        }
        self.resolve_kinds(&config).await?;
        let source = CodeSource::of(&config);
        let code = match source.fetch().await.map_err(Rejection)? {
            Fetched::Ready(code) => code,
            Fetched::Unsettled => {
                self.retry_later();
                return Ok(());
            }
            Fetched::Missing => {
                return self.without_code(name, claim, config, &source, running, started).await;
            }
        };
        // One snapshot: the TOML this code goes with is still the one read.
        if FileId::of(&claim.toml).ok().flatten().as_ref() != Some(&claim.id) {
            self.retry_later();
            return Ok(());
        }
        self.apply(name, claim, config, CodeInput::Bytes(code), &source, running, started).await
    }

    /// The plugin's code is missing. With no running version, the plugin waits for it; a
    /// running version keeps running (its compiled code kept loaded) and says so, and a
    /// changed TOML is applied with that code.
    async fn without_code(
        self: &Arc<Self>,
        name: &str,
        claim: &Claim,
        config: PluginConfig,
        source: &CodeSource,
        running: &mut Option<Running>,
        started: Instant,
    ) -> Result<(), Rejection> {
        let Some(r) = running.as_ref() else {
            tracing::info!(plugin = %name, code = %source, "waiting for the plugin's code");
            self.status.update(name, claim.toml.clone(), |s| {
                s.state = PluginState::WaitingForWasm;
                s.wasm = Some(config.wasm_path.clone());
            });
            return Ok(());
        };
        let plugin = r.generation.plugin.plugin().clone();
        let mut note = format!(
            "running version {} keeps running without its file: {} is gone (restore it to reload the code)",
            r.generation.version, source
        );
        if let Err(e) = plugin.keep_code() {
            note.push_str(&format!("; its compiled code can no longer be loaded: {e}"));
        }
        if r.generation.config != config {
            note.push_str("; TOML edits are applied with the running version's compiled code");
        }
        tracing::warn!(plugin = %name, version = %r.generation.version, code = %source, "{note}");
        self.status.update(name, claim.toml.clone(), |s| s.note = Some(note.clone()));
        let input =
            CodeInput::Loaded { full: plugin.version().to_owned(), short: r.generation.version.clone() };
        self.apply(name, claim, config, input, source, running, started).await
    }

    /// Takes the informer leases and waits for them to sync, compiles the component, checks
    /// it; only then the hand-off — swap, restart or first start (see `handoff`) — and the
    /// record of the new version.
    #[allow(clippy::too_many_arguments)]
    async fn apply(
        self: &Arc<Self>,
        name: &str,
        claim: &Claim,
        config: PluginConfig,
        code: CodeInput,
        source: &CodeSource,
        running: &mut Option<Running>,
        started: Instant,
    ) -> Result<(), Rejection> {
        let version = code.version().to_owned();
        if let Some(r) = running.as_ref()
            && r.generation.config == config
            && r.generation.version == version
            && r.name() == name
            && r.alive()
        {
            // The files are back to what runs: an earlier rejection no longer applies.
            let has_file = matches!(code, CodeInput::Bytes(_));
            self.status.update(name, claim.toml.clone(), |s| {
                s.last_error = None;
                if has_file {
                    s.note = None;
                }
            });
            return Ok(());
        }

        self.check_field_manager(name, &config)?;
        // Everything the new version needs, before touching the running one.
        let Some(leases) = self.sync_leases(&config).await? else {
            return Ok(());
        };
        let plugin = self.compile(&config, &leases, code, source).await?;
        config.check_admission_served(self.options.admission.is_some())?;
        config.check_admission_exports(plugin.admission_exports())?;
        let admitting = (plugin.clone(), config.admission.clone());
        let reconciler = check_component(&config, &leases, plugin)?;
        let previous_name = running.as_ref().map(|r| r.name().to_owned());

        let previous = running.as_ref().map(|r| r.generation.version.clone());
        let restart =
            running.as_ref().is_some_and(|r| needs_restart(&r.generation.config, &config) || !r.alive());
        let for_keys = leases.for_keys(&config);
        let (file, wasm) = (config.file.clone(), config.wasm_path.clone());
        let field_manager = config.field_manager.clone();
        let candidate = Candidate { config, version: version.clone(), reconciler, leases };
        match running.take() {
            Some(r) if !restart => self.swap(running, r, candidate, for_keys).await?,
            Some(old) => self.restart(running, old, candidate).await?,
            None => self.first_start(running, candidate)?,
        }
        if let Some(router) = &self.options.admission {
            // Reviews from now on go to this version; those in flight finish on the old one.
            router.install(previous_name.as_deref(), admitting.0, admitting.1).await;
        }
        self.runs.lock().insert(
            name.to_owned(),
            RunInfo { toml: claim.toml.clone(), file, version: version.clone(), field_manager, wasm },
        );
        self.record_loaded(name, &claim.toml, running, &version, previous.as_deref(), started);
        Ok(())
    }

    /// Asks discovery about every kind the TOML names (each once) and checks the TOML's use
    /// of them.
    async fn resolve_kinds(&self, config: &PluginConfig) -> Result<(), Rejection> {
        let mut kinds = BTreeMap::new();
        for (_, kind) in config.kinds() {
            if !kinds.contains_key(kind) {
                kinds.insert(kind.clone(), self.deps.informers.resolve(kind).await);
            }
        }
        config.check_kinds(&ResolvedKinds(kinds))?;
        Ok(())
    }

    /// Takes leases on the plugin's informers and waits (bounded by the sync timeout) until
    /// all have synced. `None`: the manager is shutting down.
    async fn sync_leases(&self, config: &PluginConfig) -> Result<Option<Leases>, Rejection> {
        let leases = Leases::acquire(config, &*self.deps.informers).await.map_err(Rejection)?;
        let all = futures::future::join_all(leases.informers.values().map(|i| i.synced()));
        tokio::select! {
            _ = self.shutdown.cancelled() => Ok(None),
            synced = tokio::time::timeout(self.options.cache_sync_timeout, all) => match synced {
                Ok(_) => Ok(Some(leases)),
                Err(_) => {
                    let pending: Vec<String> = leases
                        .informers
                        .iter()
                        .filter(|(_, i)| !i.has_synced())
                        .map(|(k, _)| k.to_string())
                        .collect();
                    Err(Rejection(format!(
                        "informers did not sync within {:?}: {}",
                        self.options.cache_sync_timeout,
                        pending.join(", ")
                    )))
                }
            }
        }
    }

    /// Compiles the component (or takes the running version's compiled code) and runs its
    /// `init` (on a blocking thread), with the leased caches as its view of the cluster.
    async fn compile(
        &self,
        config: &PluginConfig,
        leases: &Leases,
        code: CodeInput,
        source: &CodeSource,
    ) -> Result<Plugin, Rejection> {
        let spec = config.to_plugin_spec();
        let env = PluginEnv { caches: leases.caches(), kube: self.deps.kube.clone() };
        let engine = self.deps.engine.clone();
        let path = source.file().map_or_else(|| config.wasm_path.clone(), Path::to_path_buf);
        // Many plugins starting together take turns (a few threads load them all).
        let _slot = engine.load_slot().await;
        tokio::task::spawn_blocking(move || match code {
            CodeInput::Bytes(code) => Plugin::load_file(&engine, spec, &path, &code.bytes, env),
            CodeInput::Loaded { full, .. } => {
                let plugin = Plugin::load_version(&engine, spec, &full, &path, env)?;
                plugin.keep_code()?;
                Ok(plugin)
            }
        })
        .await
        .map_err(|e| Rejection(format!("loading the component failed: {e}")))?
        .map_err(|e| Rejection(e.to_string()))
    }

    /// Records a loaded version: readiness probe, status and metrics.
    fn record_loaded(
        &self,
        name: &str,
        toml: &Path,
        running: &Option<Running>,
        version: &str,
        previous: Option<&str>,
        started: Instant,
    ) {
        if let Some(r) = running.as_ref() {
            let controller = r.controller.clone();
            let wasm = r.generation.config.wasm_path.clone();
            self.status.set_probe(
                name,
                Some(Arc::new(move || {
                    let r = controller.readiness();
                    (r.is_ready(), r.error)
                })),
            );
            self.status.update(name, toml.to_owned(), |s| {
                s.name = name.to_owned();
                s.toml = toml.to_owned();
                s.wasm = Some(wasm);
                s.version = Some(version.to_owned());
                s.last_error = None;
                s.reloads += 1;
                if s.state != PluginState::Running {
                    s.state = PluginState::Starting;
                }
            });
        }
        self.status.set_info(name, previous, Some(version));
        self.status.count_reload(name, true);
        tracing::info!(
            plugin = %name,
            version = %version,
            previous = previous.unwrap_or("none"),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "plugin {}",
            if previous.is_some() { "reloaded" } else { "loaded" }
        );
    }

    async fn stop_all(&self) {
        let slots: Vec<(String, Slot)> =
            self.slots.lock().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut set = tokio::task::JoinSet::new();
        for (name, slot) in slots {
            let Some(r) = slot.lock().await.take() else { continue };
            // Stop concurrently: each drains its own in-flight reconciles.
            r.stop.cancel();
            set.spawn(async move {
                let _ = r.task.await;
                for t in r.retiring {
                    let _ = t.await;
                }
                drop(r.generation);
                tracing::info!(plugin = %name, "plugin stopped");
            });
        }
        while set.join_next().await.is_some() {}
    }
}

/// Why a claim in the plugins directory was refused.
enum Refusal {
    /// Another file (this one) runs the same plugin name.
    Name(PathBuf),
    /// The claim's field manager `mine` overlaps `theirs`, of the plugin in `toml`.
    FieldManager { mine: String, theirs: String, toml: PathBuf },
}
