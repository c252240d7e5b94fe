//! The plugins directory manager: turns `<name>.toml` + `<name>.wasm` pairs into running
//! controllers and follows the directory as files change.
//!
//! Life of a plugin (one per TOML stem):
//! - **Load**: parse + check the TOML (kinds against discovery), read the `.wasm` once it
//!   has settled, take leases on its informers and wait for them to sync, compile the
//!   component and run `init` — all *before* anything running is touched. Any failure
//!   rejects this version: logged, counted in `wasmctrl_plugin_reloads_total{result="rejected"}`,
//!   shown in `/plugins` and `/readyz`; a running version keeps running.
//! - **Start**: a controller per plugin whose queue lives as long as the plugin's `for`
//!   kind, concurrency and name stay the same.
//!
//! Every reload is a hand-off, never a drop:
//!
//! - **Swap** (new `.wasm`, or a TOML change that keeps the `for` kind, concurrency and
//!   name): the controller's reconciler is replaced (calls in flight finish on the old
//!   version, every later call — queued keys included — goes to the new one; the queue's
//!   processing set keeps a key from being reconciled by both at once); the new version's
//!   handlers are wired from the old ones (see `wiring`: carried over, replaced with their
//!   buffer handed over, or added) and every cached object of the `for` kind is enqueued;
//!   once the new handlers have synced, the old generation retires (its remaining handlers
//!   deliver their buffers, its last hook call returns), and only then does the new
//!   version receive hook calls.
//! - **Restart** (the `for` kind, concurrency or name changed): a new controller is built
//!   with the old one's rate limiter (failure counts and backoff kept) and the old queue is
//!   handed over to it (ready keys, delayed keys with their ready time; keys in flight stay
//!   borrowed until their reconcile ends, then are added again); the new generation is wired
//!   into the new queue as for a swap, the old one retires, and the old controller winds
//!   down in the background (its in-flight reconciles finish; it hands out nothing more).
//!   The new controller's workers start once its handlers have synced.
//! - **Stop** (TOML removed): the queue is handed over to a parked queue, the handlers
//!   drain into it, in-flight reconciles finish; the informers are released. If the
//!   plugin comes back (same stem), the parked keys are handed to its new controller.
//! - A reload that comes while the previous version is still syncing follows the same
//!   rules: it is wired from that version, whatever it has received so far.
//!
//! Files are read only after the directory has been quiet for the debounce period and a
//! whole read saw no change in size or modification time; hidden files (`.x.wasm.tmp`) are
//! ignored, so writing a temporary file and renaming it is atomic for the manager. A
//! half-written `.wasm` that slips through is not a valid component and is rejected like any
//! broken build, leaving the running version in place.
//!
//! Invariants: at most one load/swap/stop runs per plugin at a time (a per-stem lock);
//! plugin names are unique across the directory; at most one version of a plugin receives
//! hook calls at any moment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use kube::core::GroupVersionKind;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::check::version_of;
use super::scan::{is_plugin_file, plugin_tomls, read_settled};
use super::status::{PluginState, StatusBoard};
use super::wiring::{Generation, InformerLeases, Leases, PluginSlot, kube_gvk};
use crate::config::{
    ConfigErrors, KindLookupError, KindResolver, PluginConfig, PluginDefaults, ResolvedKind,
};
use crate::controller::{
    Controller, ControllerError, EventRegistration, EventSource, Reconciler, Request, source::SourceError,
};
use crate::informer::ResourceEventHandler;
use crate::metrics::Metrics;
use crate::plugin::{Gvk, KubeServices, Plugin, PluginEngine, PluginEnv, PluginReconciler};
use crate::queue::{Priority, RateLimiter, RateLimitingQueue};

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
    /// Follow the directory (file events and SIGHUP). Off: load once.
    pub watch: bool,
    /// Share the plugins' keys with the other replicas of a ring (`[sharding]`).
    pub sharding: Option<crate::shard::Sharding>,
}

impl ManagerOptions {
    /// Options for `plugins_dir` with defaults (200 ms debounce, 2 min sync timeout, watching).
    pub fn new(plugins_dir: impl Into<PathBuf>) -> Self {
        ManagerOptions {
            plugins_dir: plugins_dir.into(),
            defaults: PluginDefaults::default(),
            cache_sync_timeout: Duration::from_secs(120),
            debounce: Duration::from_millis(200),
            watch: true,
            sharding: None,
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
        let watcher = if options.watch { Some(watch_dir(&dir, events_tx.clone())?) } else { None };
        let shared = Arc::new(Shared {
            options,
            deps,
            status: status.clone(),
            slots: Mutex::default(),
            names: Mutex::default(),
            wasm_users: Mutex::default(),
            parked: Mutex::default(),
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

/// A running plugin: its controller and current generation.
struct Running {
    controller: Controller,
    /// The running version, as the handlers' `map` / `filter` see it.
    slot: PluginSlot,
    stop: CancellationToken,
    task: JoinHandle<Result<(), ControllerError>>,
    generation: Arc<Generation>,
    /// The generation the controller's start gate waits for.
    current: Arc<Mutex<Weak<Generation>>>,
    /// Earlier controllers of this plugin still finishing their in-flight reconciles.
    retiring: Vec<JoinHandle<()>>,
}

impl Running {
    fn name(&self) -> &str {
        &self.generation.config.name
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Running>>>;

struct Shared {
    options: ManagerOptions,
    deps: ManagerDeps,
    status: StatusBoard,
    /// Per TOML stem; the async mutex serializes loads, swaps and stops of one plugin.
    slots: Mutex<BTreeMap<String, Slot>>,
    /// Plugin name → stem that runs it.
    names: Mutex<BTreeMap<String, String>>,
    /// `.wasm` path → stems whose TOML names it.
    wasm_users: Mutex<BTreeMap<PathBuf, BTreeSet<String>>>,
    /// Stem → the queue of a removed plugin, handed to it if it comes back.
    parked: Mutex<BTreeMap<String, RateLimitingQueue<Request>>>,
    shutdown: CancellationToken,
    /// Feeds a path back into the debouncer (a file that was still being written).
    retry: mpsc::UnboundedSender<PathBuf>,
}

fn watch_dir(
    dir: &Path,
    tx: mpsc::UnboundedSender<PathBuf>,
) -> Result<notify::RecommendedWatcher, ManagerError> {
    use notify::Watcher;
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
        // Only changes count: reading a file (ours included) reports access events, which
        // must not trigger another read.
        Ok(event)
            if matches!(
                event.kind,
                notify::EventKind::Create(_)
                    | notify::EventKind::Modify(_)
                    | notify::EventKind::Remove(_)
                    | notify::EventKind::Any
            ) && !matches!(
                event.kind,
                notify::EventKind::Modify(notify::event::ModifyKind::Metadata(
                    notify::event::MetadataKind::AccessTime
                ))
            ) =>
        {
            for path in event.paths {
                let _ = tx.send(path);
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "plugins directory watch error"),
    })
    .map_err(|source| ManagerError::Watch { dir: dir.to_owned(), source })?;
    watcher
        .watch(dir, notify::RecursiveMode::NonRecursive)
        .map_err(|source| ManagerError::Watch { dir: dir.to_owned(), source })?;
    Ok(watcher)
}

async fn run_loop(
    shared: Arc<Shared>,
    mut events: mpsc::UnboundedReceiver<PathBuf>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    _watcher: Option<notify::RecommendedWatcher>,
) {
    let mut hangup = if shared.options.watch {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .inspect_err(|e| tracing::warn!(error = %e, "cannot listen for SIGHUP"))
            .ok()
    } else {
        None
    };
    // Stem → time of its last file event.
    let mut pending: BTreeMap<String, Instant> = BTreeMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let due = pending.values().min().map(|t| *t + shared.options.debounce);
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            Some(path) = events.recv() => {
                for stem in shared.stems_for(&path) {
                    pending.insert(stem, Instant::now());
                }
            }
            Some(cmd) = commands.recv() => match cmd {
                Command::Rescan(done) => {
                    pending.clear();
                    shared.rescan().await;
                    let _ = done.send(());
                }
            },
            Some(()) = async { match &mut hangup { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                tracing::info!("SIGHUP: rescanning the plugins directory");
                pending.clear();
                shared.rescan().await;
            }
            _ = tokio::time::sleep_until(due.map_or_else(tokio::time::Instant::now, tokio::time::Instant::from_std)), if due.is_some() => {
                let now = Instant::now();
                let ready: Vec<String> = pending
                    .iter()
                    .filter(|(_, t)| **t + shared.options.debounce <= now)
                    .map(|(s, _)| s.clone())
                    .collect();
                for stem in ready {
                    pending.remove(&stem);
                    let shared = shared.clone();
                    tasks.spawn(async move { shared.sync_stem(&stem).await });
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    // Let loads in progress finish (they are bounded by the sync timeout), then stop all.
    while tasks.join_next().await.is_some() {}
    shared.stop_all().await;
}

/// A failed load, with the reason shown to users.
struct Rejection(String);

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

/// A new version that passed every check, ready to be handed the plugin.
struct Candidate {
    config: PluginConfig,
    version: String,
    /// Its hooks stay closed until the previous version's last hook call returned.
    reconciler: Arc<PluginReconciler>,
    leases: Leases,
}

/// Whether going from `old` to `new` needs a new controller (restart) rather than a swap:
/// the `for` kind, the concurrency or the name changed.
fn needs_restart(old: &PluginConfig, new: &PluginConfig) -> bool {
    old.for_source.kind != new.for_source.kind || old.concurrency != new.concurrency || old.name != new.name
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
    Generation::check(config, leases, &PluginSlot::new(reconciler.clone())).map_err(Rejection)?;
    Ok(reconciler)
}

impl Shared {
    fn toml_of(&self, stem: &str) -> PathBuf {
        self.options.plugins_dir.join(format!("{stem}.toml"))
    }

    fn slot(&self, stem: &str) -> Slot {
        self.slots.lock().entry(stem.to_owned()).or_default().clone()
    }

    /// The plugins a changed file concerns.
    fn stems_for(&self, path: &Path) -> Vec<String> {
        if !is_plugin_file(path) {
            return Vec::new();
        }
        let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else { return Vec::new() };
        let mut stems = vec![stem.to_owned()];
        if path.extension().is_some_and(|e| e == "wasm")
            && let Some(users) = self.wasm_users.lock().get(path)
        {
            stems.extend(users.iter().filter(|u| *u != stem).cloned());
        }
        stems
    }

    /// Syncs every plugin of the directory and every running one, concurrently.
    async fn rescan(self: &Arc<Self>) {
        let mut stems: BTreeSet<String> = self.slots.lock().keys().cloned().collect();
        match plugin_tomls(&self.options.plugins_dir) {
            Ok(tomls) => {
                stems.extend(tomls.iter().filter_map(|t| t.file_stem()?.to_str().map(str::to_owned)))
            }
            Err(e) => {
                tracing::error!(dir = %self.options.plugins_dir.display(), error = %e, "cannot list plugins directory")
            }
        }
        let mut set = tokio::task::JoinSet::new();
        for stem in stems {
            let me = self.clone();
            set.spawn(async move { me.sync_stem(&stem).await });
        }
        while set.join_next().await.is_some() {}
    }

    /// Brings one plugin in line with its files.
    async fn sync_stem(self: &Arc<Self>, stem: &str) {
        let slot = self.slot(stem);
        let mut running = slot.lock().await;
        if self.shutdown.is_cancelled() {
            return;
        }
        let toml = self.toml_of(stem);
        if !toml.is_file() {
            if let Some(r) = running.take() {
                self.stop_plugin(stem, r).await;
            }
            self.status.remove(stem);
            self.forget_stem(stem);
            return;
        }
        let result = self.load(stem, &toml, &mut running).await;
        if let Err(Rejection(error)) = result {
            let name = running.as_ref().map(|r| r.name().to_owned()).unwrap_or_else(|| stem.to_owned());
            let keeps = running.as_ref().map(|r| r.generation.version.clone());
            tracing::warn!(
                plugin = %name,
                file = %toml.display(),
                running_version = keeps.as_deref().unwrap_or("none"),
                error = %error,
                "plugin rejected{}",
                if keeps.is_some() { "; the running version keeps running" } else { "" }
            );
            self.status.count_reload(&name, false);
            self.status.update(stem, toml.clone(), |s| {
                s.last_error = Some(error);
                s.rejected += 1;
                if keeps.is_none() {
                    s.state = PluginState::Failed;
                }
            });
        }
    }

    fn forget_stem(&self, stem: &str) {
        self.names.lock().retain(|_, s| s != stem);
        for users in self.wasm_users.lock().values_mut() {
            users.remove(stem);
        }
    }

    /// Loads the files of `stem` and starts, swaps or restarts its plugin. Nothing running
    /// changes unless every check passed.
    ///
    /// The steps, in this order: read the TOML ([`Self::read_config`]), resolve its kinds
    /// ([`Self::resolve_kinds`]), read the `.wasm` ([`Self::read_wasm`]), take the informer
    /// leases and wait for them to sync ([`Self::sync_leases`]), compile the component
    /// ([`Self::compile`]), check it against the TOML ([`check_component`]); only then the
    /// hand-off — [`Self::swap`], [`Self::restart`] or [`Self::first_start`] — and the record
    /// of the new version ([`Self::record_loaded`]).
    async fn load(
        self: &Arc<Self>,
        stem: &str,
        toml: &Path,
        running: &mut Option<Running>,
    ) -> Result<(), Rejection> {
        let started = Instant::now();
        let config = self.read_config(stem, toml, running.is_none())?;
        self.resolve_kinds(&config).await?;
        let Some(bytes) = self.read_wasm(stem, toml, &config, running.is_none())? else {
            return Ok(());
        };
        let version = version_of(&bytes);
        if let Some(r) = running.as_ref()
            && r.generation.config == config
            && r.generation.version == version
        {
            // The files are back to what runs: an earlier rejection no longer applies.
            self.status.update(stem, toml.to_owned(), |s| s.last_error = None);
            return Ok(());
        }

        // Everything the new version needs, before touching the running one.
        let Some(leases) = self.sync_leases(&config).await? else {
            return Ok(());
        };
        let plugin = self.compile(&config, &leases, bytes).await?;
        let reconciler = check_component(&config, &leases, plugin)?;

        let name = config.name.clone();
        let previous = running.as_ref().map(|r| r.generation.version.clone());
        let restart = running.as_ref().is_some_and(|r| needs_restart(&r.generation.config, &config));
        let for_keys = leases.for_keys(&config);
        let candidate = Candidate { config, version: version.clone(), reconciler, leases };
        match running.take() {
            Some(r) if !restart => self.swap(running, r, candidate, for_keys).await?,
            Some(old) => self.restart(running, old, candidate).await?,
            None => self.first_start(stem, running, candidate)?,
        }
        self.record_loaded(stem, toml, running, &name, &version, previous.as_deref(), started);
        Ok(())
    }

    /// Step 1: parses and checks the TOML, records which `.wasm` it names, and refuses a
    /// plugin name another TOML already uses. A plugin with no running version shows as
    /// starting from here on.
    fn read_config(&self, stem: &str, toml: &Path, first: bool) -> Result<PluginConfig, Rejection> {
        let mut config = PluginConfig::load(toml, &self.options.defaults)?;
        if let Some(sharding) = &self.options.sharding {
            sharding.scope(&mut config);
        }
        {
            let mut users = self.wasm_users.lock();
            for u in users.values_mut() {
                u.remove(stem);
            }
            users.entry(config.wasm_path.clone()).or_default().insert(stem.to_owned());
        }
        if let Some(other) = self.names.lock().get(&config.name).filter(|s| *s != stem) {
            return Err(Rejection(
                config
                    .field_error(
                        "name",
                        format!("plugin name `{}` is already used by {other}.toml", config.name),
                    )
                    .to_string(),
            ));
        }
        if first {
            // Loading: no version of it runs yet.
            self.status.update(stem, toml.to_owned(), |s| {
                s.name = config.name.clone();
                s.state = PluginState::Starting;
            });
        }
        Ok(config)
    }

    /// Step 2: asks discovery about every kind the TOML names (each once) and checks the
    /// TOML's use of them.
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

    /// Step 3: reads the `.wasm` once it has settled. `None`: nothing to load yet — the file
    /// is missing (a first load shows as waiting for it) or still being written (it is looked
    /// at again after another quiet period).
    fn read_wasm(
        &self,
        stem: &str,
        toml: &Path,
        config: &PluginConfig,
        first: bool,
    ) -> Result<Option<Vec<u8>>, Rejection> {
        match read_settled(&config.wasm_path) {
            Ok((bytes, _)) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if first {
                    tracing::info!(plugin = %config.name, wasm = %config.wasm_path.display(), "waiting for the plugin's .wasm");
                    self.status.update(stem, toml.to_owned(), |s| {
                        s.state = PluginState::WaitingForWasm;
                        s.wasm = Some(config.wasm_path.clone());
                    });
                }
                Ok(None)
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                // Still being written: look again after another quiet period.
                let _ = self.retry.send(config.wasm_path.clone());
                Ok(None)
            }
            Err(e) => Err(Rejection(format!("cannot read {}: {e}", config.wasm_path.display()))),
        }
    }

    /// Step 4: takes leases on the plugin's informers and waits (bounded by the sync timeout)
    /// until all have synced. `None`: the manager is shutting down.
    async fn sync_leases(&self, config: &PluginConfig) -> Result<Option<Leases>, Rejection> {
        let leases = Leases::acquire(config, &*self.deps.informers).await.map_err(Rejection)?;
        let deadline = tokio::time::Instant::now() + self.options.cache_sync_timeout;
        while !leases.all_synced() {
            if tokio::time::Instant::now() >= deadline {
                let pending: Vec<String> = leases
                    .informers
                    .iter()
                    .filter(|(_, i)| !i.has_synced())
                    .map(|(k, _)| k.to_string())
                    .collect();
                return Err(Rejection(format!(
                    "informers did not sync within {:?}: {}",
                    self.options.cache_sync_timeout,
                    pending.join(", ")
                )));
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return Ok(None),
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        Ok(Some(leases))
    }

    /// Step 5: compiles the component and runs its `init` (on a blocking thread), with the
    /// leased caches as its view of the cluster.
    async fn compile(
        &self,
        config: &PluginConfig,
        leases: &Leases,
        bytes: Vec<u8>,
    ) -> Result<Plugin, Rejection> {
        let spec = config.to_plugin_spec();
        let env = PluginEnv { caches: leases.caches(), kube: self.deps.kube.clone() };
        let engine = self.deps.engine.clone();
        let path = config.wasm_path.clone();
        // Many plugins starting together take turns (a few threads load them all).
        let _slot = engine.load_slot().await;
        tokio::task::spawn_blocking(move || Plugin::load_file(&engine, spec, &path, &bytes, env))
            .await
            .map_err(|e| Rejection(format!("loading the component failed: {e}")))?
            .map_err(|e| Rejection(e.to_string()))
    }

    /// Swap: the new reconciler first, then the new handlers (wired from the old ones), then
    /// every `for` key once more (a key the old version took meanwhile is done again by the
    /// new one); the old generation retires before the new one receives hook calls. A wiring
    /// failure puts the old version back, untouched.
    async fn swap(
        &self,
        running: &mut Option<Running>,
        mut r: Running,
        next: Candidate,
        for_keys: Vec<String>,
    ) -> Result<(), Rejection> {
        let Candidate { config, version, reconciler, leases } = next;
        r.controller.swap_reconciler(reconciler.clone() as Arc<dyn Reconciler>);
        r.slot.store(reconciler.clone());
        let wired = Generation::wire(
            config,
            version,
            reconciler.clone(),
            &r.slot,
            leases,
            r.controller.queue(),
            Some(&r.generation),
            true,
        );
        let generation = match wired {
            Ok(g) => Arc::new(g),
            Err(e) => {
                // Nothing was taken from the old generation: put its version back.
                r.controller.swap_reconciler(r.generation.plugin.clone() as Arc<dyn Reconciler>);
                r.slot.store(r.generation.plugin.clone());
                *running = Some(r);
                return Err(Rejection(e));
            }
        };
        *r.current.lock() = Arc::downgrade(&generation);
        for key in for_keys {
            r.controller.queue().add_with_priority(Request::from_key(&key), Priority::Low);
        }
        self.hand_over_hooks(&r.generation, &generation).await;
        r.generation = generation;
        *running = Some(r);
        Ok(())
    }

    /// Restart: a new controller with the old one's rate limiter takes over the old queue;
    /// the old generation retires before the new one receives hook calls, and the old
    /// controller winds down in the background. A refusal before the queue was handed over
    /// leaves the old controller running.
    async fn restart(
        &self,
        running: &mut Option<Running>,
        old: Running,
        next: Candidate,
    ) -> Result<(), Rejection> {
        let Candidate { config, version, reconciler, leases } = next;
        tracing::info!(plugin = %old.name(), version = %version, previous = %old.generation.version,
            "the `for` kind, concurrency or name changed: restarting the plugin's controller, handing its queue over");
        let name = config.name.clone();
        let limiter = old.controller.queue().limiter().clone();
        let started = self.start_controller(
            config,
            version,
            reconciler,
            leases,
            Some(limiter),
            Some(old.controller.queue()),
            Some(&old.generation),
        );
        let mut new = match started {
            Ok(new) => new,
            Err(e) => {
                // Refused before the queue was handed over: the old one runs on.
                *running = Some(old);
                return Err(Rejection(e));
            }
        };
        self.hand_over_hooks(&old.generation, &new.generation).await;
        let Running { stop, task, generation, mut retiring, .. } = old;
        // The old controller hands out nothing more; let its in-flight reconciles
        // finish without holding up the new one.
        let plugin = name;
        retiring.push(tokio::spawn(async move {
            stop.cancel();
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(plugin = %plugin, error = %e, "previous controller ended with an error")
                }
                Err(e) => tracing::error!(plugin = %plugin, error = %e, "previous controller task failed"),
            }
            drop(generation);
        }));
        new.retiring = retiring;
        *running = Some(new);
        Ok(())
    }

    /// First start: a new controller, taking over the queue parked when the plugin was last
    /// removed (if any, with its rate limiter); its hooks open at once. A refusal parks that
    /// queue again.
    fn first_start(
        &self,
        stem: &str,
        running: &mut Option<Running>,
        next: Candidate,
    ) -> Result<(), Rejection> {
        let Candidate { config, version, reconciler, leases } = next;
        let parked = self.parked.lock().remove(stem);
        let limiter = parked.as_ref().map(|q| q.limiter().clone());
        let started = self.start_controller(
            config,
            version,
            reconciler.clone(),
            leases,
            limiter,
            parked.as_ref(),
            None,
        );
        let started = match started {
            Ok(r) => r,
            Err(e) => {
                if let Some(q) = parked {
                    self.parked.lock().insert(stem.to_owned(), q);
                }
                return Err(Rejection(e));
            }
        };
        reconciler.open_hooks();
        *running = Some(started);
        Ok(())
    }

    /// Records a loaded version: the plugin's name, readiness probe, status and metrics.
    #[allow(clippy::too_many_arguments)]
    fn record_loaded(
        &self,
        stem: &str,
        toml: &Path,
        running: &Option<Running>,
        name: &str,
        version: &str,
        previous: Option<&str>,
        started: Instant,
    ) {
        let r = running.as_ref().map(|r| (r.controller.clone(), r.generation.config.wasm_path.clone()));
        self.names.lock().retain(|_, s| s != stem);
        self.names.lock().insert(name.to_owned(), stem.to_owned());
        if let Some((controller, wasm)) = r {
            let probe_controller = controller.clone();
            self.status.set_probe(
                stem,
                Some(Arc::new(move || {
                    let r = probe_controller.readiness();
                    (r.is_ready(), r.error)
                })),
            );
            self.status.update(stem, toml.to_owned(), |s| {
                s.name = name.to_owned();
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

    /// Builds the plugin's controller (with `limiter`, to keep a predecessor's backoff),
    /// takes over `predecessor`'s queue, wires the generation (from `previous`) and starts
    /// the controller; its workers start once the generation has synced.
    #[allow(clippy::too_many_arguments)]
    fn start_controller(
        &self,
        config: PluginConfig,
        version: String,
        reconciler: Arc<PluginReconciler>,
        leases: Leases,
        limiter: Option<Arc<dyn RateLimiter<Request>>>,
        predecessor: Option<&RateLimitingQueue<Request>>,
        previous: Option<&Generation>,
    ) -> Result<Running, String> {
        let current: Arc<Mutex<Weak<Generation>>> = Arc::new(Mutex::new(Weak::new()));
        let source = Arc::new(GateSource {
            kind: kube_gvk(&config.for_source.kind),
            namespaced: leases.for_namespaced(&config),
            current: current.clone(),
        });
        let mut builder = Controller::builder(config.name.clone(), reconciler.clone() as Arc<dyn Reconciler>)
            .for_source(source as Arc<dyn EventSource>)
            .max_concurrent_reconciles(config.concurrency)
            .cache_sync_timeout(self.options.cache_sync_timeout)
            .metrics(self.deps.metrics.clone());
        if let Some(limiter) = limiter {
            builder = builder.rate_limiter(limiter);
        }
        if let Some(sharding) = &self.options.sharding {
            let keys = ForKeys { current: current.clone(), informers: self.deps.informers.clone() };
            builder = builder.ownership(sharding.ownership(&config.name, Arc::new(keys)));
        }
        let controller = builder.build().map_err(|e| e.to_string())?;
        if let Some(old) = predecessor {
            let (ready, delayed, in_flight) = old.hand_over_to(controller.queue());
            tracing::info!(plugin = %config.name, ready, delayed, in_flight, "queue handed over to the new controller");
        }
        let slot = PluginSlot::new(reconciler.clone());
        let generation = Arc::new(Generation::wire(
            config,
            version,
            reconciler,
            &slot,
            leases,
            controller.queue(),
            previous,
            false,
        )?);
        *current.lock() = Arc::downgrade(&generation);
        let stop = self.shutdown.child_token();
        let run = controller.clone();
        let token = stop.clone();
        let task = tokio::spawn(async move { run.run(token).await });
        Ok(Running { controller, slot, stop, task, generation, current, retiring: Vec::new() })
    }

    /// Waits (bounded by the sync timeout) for `new`'s handlers to sync, retires `old` —
    /// its remaining handlers deliver their buffers, its last hook call returns — and only
    /// then lets `new`'s version receive hook calls.
    async fn hand_over_hooks(&self, old: &Generation, new: &Generation) {
        let deadline = tokio::time::Instant::now() + self.options.cache_sync_timeout;
        while !new.has_synced() && tokio::time::Instant::now() < deadline && !self.shutdown.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if !new.has_synced() {
            tracing::warn!(plugin = %new.config.name, version = %new.version,
                "the new version's handlers did not sync in time; retiring the old version anyway");
        }
        old.retire(Some(new)).await;
        new.plugin.open_hooks();
    }

    /// Stops a plugin without dropping its work: its informers first catch up with the
    /// server (every change made before the stop began reaches its handlers), its queue is
    /// parked (handed to the plugin if it comes back), its handlers drain into it, its
    /// in-flight reconciles finish; then its informers are released.
    async fn stop_plugin(&self, stem: &str, r: Running) {
        let name = r.name().to_owned();
        self.status.update(stem, self.toml_of(stem), |s| s.state = PluginState::Stopping);
        r.generation.catch_up_with_server(&*self.deps.informers).await;
        let parked = RateLimitingQueue::new(r.controller.queue().limiter().clone());
        r.controller.queue().hand_over_to(&parked);
        r.generation.retire(None).await;
        r.stop.cancel();
        match r.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(plugin = %name, error = %e, "controller ended with an error"),
            Err(e) => tracing::error!(plugin = %name, error = %e, "controller task failed"),
        }
        for t in r.retiring {
            let _ = t.await;
        }
        self.status.set_probe(stem, None);
        self.status.set_info(&name, Some(&r.generation.version), None);
        drop(r.generation);
        let pending = parked.len() + parked.queue().waiting_len();
        if pending > 0 {
            tracing::info!(plugin = %name, pending, "plugin stopped; its pending keys are kept for its return");
        } else {
            tracing::info!(plugin = %name, "plugin stopped");
        }
        self.parked.lock().insert(stem.to_owned(), parked);
    }

    async fn stop_all(&self) {
        let slots: Vec<(String, Slot)> =
            self.slots.lock().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut set = tokio::task::JoinSet::new();
        for (stem, slot) in slots {
            let Some(r) = slot.lock().await.take() else { continue };
            let name = r.name().to_owned();
            // Stop concurrently: each drains its own in-flight reconciles.
            r.stop.cancel();
            set.spawn(async move {
                let _ = r.task.await;
                for t in r.retiring {
                    let _ = t.await;
                }
                drop(r.generation);
                tracing::info!(plugin = %name, stem = %stem, "plugin stopped");
            });
        }
        while set.join_next().await.is_some() {}
    }
}

/// The `for` cache of a controller's current generation, for sharding.
struct ForKeys {
    current: Arc<Mutex<Weak<Generation>>>,
    informers: Arc<dyn InformerLeases>,
}

impl crate::shard::KeySource for ForKeys {
    fn keys(&self) -> Vec<String> {
        self.current.lock().upgrade().map(|g| g.for_keys()).unwrap_or_default()
    }

    fn cached(&self, key: &str) -> bool {
        self.current.lock().upgrade().is_some_and(|g| g.for_cached(key))
    }

    fn source(&self) -> Option<crate::config::WatchSource> {
        self.current.lock().upgrade().map(|g| g.config.for_source.clone())
    }

    fn catch_up(&self) -> futures::future::BoxFuture<'static, ()> {
        let generation = self.current.lock().upgrade();
        let informers = self.informers.clone();
        Box::pin(async move {
            if let Some(g) = generation {
                g.catch_up_with_server(&*informers).await;
            }
        })
    }
}

/// The controller's `for` source: events come from the plugin's generations (wired by the
/// manager, so they can change while the controller runs); this source only tells the
/// controller when the generation it runs has synced (the latest one, also when a reload
/// came before the first one synced).
struct GateSource {
    kind: GroupVersionKind,
    namespaced: bool,
    current: Arc<Mutex<Weak<Generation>>>,
}

struct GateRegistration {
    current: Arc<Mutex<Weak<Generation>>>,
    /// Latched: once synced, the controller runs on.
    synced: AtomicBool,
}

impl EventSource for GateSource {
    fn gvk(&self) -> GroupVersionKind {
        self.kind.clone()
    }

    fn namespaced(&self) -> bool {
        self.namespaced
    }

    fn register(
        &self,
        _handler: Arc<dyn ResourceEventHandler>,
    ) -> Result<Box<dyn EventRegistration>, SourceError> {
        // The controller's own handler is not needed: generations enqueue into its queue.
        Ok(Box::new(GateRegistration { current: self.current.clone(), synced: AtomicBool::new(false) }))
    }
}

impl EventRegistration for GateRegistration {
    fn has_synced(&self) -> bool {
        if self.synced.load(Ordering::Acquire) {
            return true;
        }
        let current = self.current.lock().upgrade();
        let synced = current.is_some_and(|g| g.has_synced());
        if synced {
            self.synced.store(true, Ordering::Release);
        }
        synced
    }

    fn remove(&self) {}
}
