//! The host's wasmtime [`Engine`]s (Cranelift, and Winch when tier-up is on), their linker,
//! their epoch ticker and the loads of components through the compile pipeline
//! (`plugin::compile`).
//!
//! Layering: the engine settings ([`EngineConfig`]) and every compile live in
//! `plugin::compile`; this module links the host imports (`plugin::imports`) against the
//! store's data ([`HostState`]) and builds on the compile pipeline, which imports nothing
//! of it.
//!
//! Invariants:
//! - The optimising engine is configured once (Cranelift, epoch interruption, optional
//!   pooling allocator) and shared by every plugin; so is the [`Linker`]: the WASI
//!   interfaces of [`wasi`] and each `wasmctrl:controller` import, every interface linked
//!   on its own with a getter that hands out only that interface's view of the store's
//!   state. With tier-up on, a baseline engine (Winch, otherwise the same settings) has a
//!   linker linked the same way; a component runs only in stores of the engine that
//!   compiled it.
//! - A component importing a WASI interface the host does not link is refused before any
//!   instance of it exists ([`PluginEngine::check_imports`]), naming the interface.
//! - By default ([`EngineConfig::tuning`]) each linear memory gets wasmtime's 4 GiB
//!   reservation plus its guard region (address space only, also under the pooling
//!   allocator), so compiled guest code has no explicit bounds check on loads and stores; a
//!   plugin's `memory` limit is enforced at `memory.grow` either way.
//! - While a [`PluginEngine`] lives, a ticker thread bumps every engine's epoch every
//!   [`EngineConfig::epoch_tick`]; running calls check their deadline (and cancellation)
//!   at each tick. The thread stops when the last handle is dropped.
//! - Compiled artifacts live in the on-disk compile cache
//!   ([`crate::plugin::compile::compile_cache`]: a directory of the host's uid, artifacts
//!   authenticated with the host's key, atomic writes, a byte budget, least recently used
//!   out first). An artifact that fails a check or does not load is removed and
//!   recompiled, never loaded. A cache directory that is refused (another uid's) leaves the
//!   engine without a cache, with an error logged. Only Cranelift artifacts are cached.
//! - [`PluginEngine::shared_component`] compiles (or loads from the cache) once per content
//!   hash: concurrent loads of the same bytes wait for one compile, and the compiled code is
//!   shared by every plugin using it for as long as one does (see
//!   [`crate::plugin::compile::single_flight`]).
//! - Tier-up ([`EngineConfig::tier_up`]): a load that misses the compile cache compiles with
//!   Winch ([`crate::plugin::compile::baseline`]) and returns at once; Cranelift compiles
//!   the same bytes in the background ([`crate::plugin::compile::tier_up`]) and the plugins
//!   switch to its code when ready ([`crate::plugin::compile::tier`]). A cache hit is used
//!   directly (no Winch). A component Winch cannot compile is compiled by Cranelift before
//!   the load returns, as with tier-up off: Winch's refusal never fails a load. With a compile program, Winch compiles run there too, under the same limits
//!   (a component that breaks them fails its load, as with Cranelift).
//! - Idle resources ([`super::idle`]): instances idle for [`EngineConfig::idle_instance_timeout`]
//!   are released; plugins without a call for [`EngineConfig::idle_code_timeout`] drop
//!   their compiled code ([`super::plugin_code`]), and [`PluginEngine::reload_component`]
//!   gives it back through the single-flight registry (the compile cache, normally).
//! - At most one Cranelift compile per core (and at least two) runs at once (each already uses every core);
//!   loads beyond that wait, so loading many distinct plugins at once does not hold the
//!   intermediate state of all their compiles in memory together. Background tier-ups wait
//!   behind loads; Winch compiles (a fraction of the time and memory) do not wait.
//! - Loads that take a [`PluginEngine::load_slot`] first (the reload manager's do) run at
//!   most [`load_slots`] at once, whatever the number of plugins: the rest wait without a
//!   thread, so loading a directory of many plugins does not start a blocking thread per
//!   plugin, each keeping the stack its load touched (and its compile's state) resident.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

use super::idle::{IdlePlugin, IdleReaper, ReaperThread};
use super::instance_slots::InstanceSlots;
use super::store_data::HostState;
use crate::metrics::Metrics;
use crate::plugin::PluginError;
use crate::plugin::bindings::TypesHost;
use crate::plugin::bindings::wasmctrl::controller::{cache, client, config, events, log, types};
use crate::plugin::compile::baseline::{Baseline, BaselineError};
use crate::plugin::compile::child::CompileSettings;
use crate::plugin::compile::compile_cache::CompileCache;
use crate::plugin::compile::optimizer::Optimizer;
use crate::plugin::compile::permits::CompilePermits;
use crate::plugin::compile::settings::{EngineConfig, wasm_config};
use crate::plugin::compile::single_flight::{Outcome, SharedLoad, SingleFlight};
use crate::plugin::compile::tier::{Tier, TieredComponent};
use crate::plugin::compile::tier_up::TierUpWorker;
use crate::plugin::imports::{cache as cache_import, client as client_import, config as config_import};
use crate::plugin::imports::{events as events_import, log as log_import, wasi};
use crate::plugin::metrics::{ComponentLoadLabels, RuntimeMetrics, TierUpLabels};

/// How many component loads compiled (Cranelift), compiled with Winch (to tier up), read
/// the compile cache, or reused shared code.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ComponentLoads {
    /// Compiled with Cranelift (in this process or in the compile program).
    pub compiled: u64,
    /// Of `compiled` and of the background tier-ups, those the compile program did.
    pub compiled_in_child: u64,
    pub baseline: u64,
    pub from_cache: u64,
    pub shared: u64,
}

/// Background tier-ups so far, by result (also the `wasmctrl_plugin_tier_ups` metric).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierUps {
    /// The optimised code was handed to the plugins running the component.
    pub done: u64,
    /// No plugin ran the component any more.
    pub abandoned: u64,
    /// Cranelift refused the component (its plugins stay on the baseline code).
    pub failed: u64,
}

/// Plugins that dropped their compiled code while idle, and reloads of it (also the
/// `wasmctrl_plugin_code_drops` and `wasmctrl_plugin_code_reloads` metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeDrops {
    /// Code dropped after the idle-code timeout.
    pub dropped: u64,
    /// Dropped code loaded again for a call.
    pub reloaded: u64,
}

/// A compiled component shared by content hash; its code stays shared while one is alive.
pub type SharedComponent = SharedLoad<Arc<TieredComponent>, PluginError>;

/// A compiled component and where it came from.
#[derive(Clone)]
pub struct LoadedComponent {
    pub component: Component,
    /// Hex SHA-256 of the `.wasm` (the plugin's version in metrics).
    pub hash: String,
    /// Whether it was loaded from the compile cache rather than compiled.
    pub from_cache: bool,
    /// Time spent compiling or loading.
    pub elapsed: Duration,
}

/// The host's shared engine; cheap to clone.
#[derive(Clone)]
pub struct PluginEngine {
    inner: Arc<EngineInner>,
}

struct EngineInner {
    engine: Engine,
    linker: Linker<HostState>,
    config: EngineConfig,
    metrics: RuntimeMetrics,
    ticker: Option<EpochTicker>,
    /// Compiled components in use, by hex SHA-256 of their `.wasm`.
    components: SingleFlight<String, Arc<TieredComponent>, PluginError>,
    /// Releases idle instances and drops idle code, when either timeout is set.
    idle: Option<(Arc<IdleReaper>, ReaperThread)>,
    /// Cranelift through the compile cache (and the compile permits bounding compiles at once).
    optimizer: Optimizer,
    /// The Winch engine, its linker and the background compiles, when tier-up is on.
    tier_up: Option<(Baseline, Linker<HostState>, TierUpWorker)>,
    /// Bounds the loads running at once (see [`PluginEngine::load_slot`]).
    load_slots: Arc<tokio::sync::Semaphore>,
    /// Why the configured compile cache directory is not used, if it is not.
    cache_refusal: Option<String>,
    /// Cancelled by [`PluginEngine::shut_down_calls`].
    shutdown: tokio_util::sync::CancellationToken,
    /// The pooling allocator's slots, shared fairly by the plugins (none without pooling).
    slots: Option<Arc<InstanceSlots>>,
}

/// How many plugin loads run at once: twice the cores, at least 4, so a few plugins whose
/// `init` runs to its deadline cannot hold up every other load, while a directory of
/// hundreds of plugins is loaded by a handful of threads (loads are CPU-bound: more at once
/// would only add memory).
pub(crate) fn load_slots() -> usize {
    (2 * std::thread::available_parallelism().map_or(1, usize::from)).max(4)
}

/// A permit to run one plugin load; the slot is free again when this is dropped.
pub struct LoadSlot {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.tier_up.take();
        self.idle.take();
        if let Some(t) = self.ticker.take() {
            t.stop();
        }
    }
}

impl PluginEngine {
    /// Configures the engine, links the imports and starts the epoch ticker. Registers
    /// the runtime's metrics in `metrics` when given.
    pub fn new(config: EngineConfig, metrics: Option<&Metrics>) -> Result<Self, PluginError> {
        // Cranelift compiles a component's functions on rayon's global pool: its threads
        // allocate from the compile arena (`heap::InCompileArena`). Only with the
        // `jemalloc` feature, and only if nothing built the global pool before.
        #[cfg(feature = "jemalloc")]
        if rayon::ThreadPoolBuilder::new()
            .start_handler(|_| crate::heap::InCompileArena::bind_for_life())
            .build_global()
            .is_ok()
        {
            tracing::debug!("rayon's global pool compiles in the compile arena");
        }
        let engine = Engine::new(&wasm_config(&config)).map_err(|e| PluginError::Engine(format!("{e:#}")))?;
        let linker = link(&engine).map_err(|e| PluginError::Engine(format!("linking the imports: {e:#}")))?;
        let runtime_metrics = RuntimeMetrics::default();
        if let Some(m) = metrics {
            runtime_metrics.register(m);
        }
        let (disk, cache_refusal) = match config.cache_dir.clone() {
            None => (None, None),
            Some(dir) => {
                match CompileCache::open(
                    dir,
                    config.cache_max_bytes,
                    runtime_metrics.rejected_artifacts.clone(),
                ) {
                    Ok(cache) => (Some(cache), None),
                    Err(e) => {
                        tracing::error!(error = %e, "compile cache refused: every plugin load compiles");
                        (None, Some(e.to_string()))
                    }
                }
            }
        };
        // One compile per core, and at least two: one slow compile (a plugin's, up to the
        // compile timeout) never holds every compile slot.
        let permits =
            Arc::new(CompilePermits::new(std::thread::available_parallelism().map_or(1, usize::from).max(2)));
        let baseline_disk = disk.clone();
        let spool = disk.clone();
        let optimizer = Optimizer::new(
            engine.clone(),
            CompileSettings::of(&config),
            config.compile_process.clone(),
            config.compile_limits.clone(),
            disk,
            permits,
        );
        let tier_up = match config.tier_up.then(|| baseline_engine(&config, baseline_disk)).flatten() {
            Some((baseline, linker)) => Some((
                baseline,
                linker,
                TierUpWorker::start(optimizer.clone(), runtime_metrics.clone(), spool)?,
            )),
            None => None,
        };
        let mut ticked = vec![engine.clone()];
        ticked.extend(tier_up.as_ref().map(|(b, _, _)| b.engine().clone()));
        let ticker = EpochTicker::start(ticked, config.epoch_tick.max(Duration::from_micros(100)))?;
        let idle = IdleReaper::start(config.idle_instance_timeout, config.idle_code_timeout)?;
        let slots = config
            .pooling
            .as_ref()
            .map(|p| InstanceSlots::new(p.instances.max(1) as usize, p.per_plugin.max(1) as usize));
        Ok(PluginEngine {
            inner: Arc::new(EngineInner {
                engine,
                linker,
                config,
                metrics: runtime_metrics,
                ticker: Some(ticker),
                components: SingleFlight::default(),
                idle,
                optimizer,
                tier_up,
                load_slots: Arc::new(tokio::sync::Semaphore::new(load_slots())),
                cache_refusal,
                shutdown: tokio_util::sync::CancellationToken::new(),
                slots,
            }),
        })
    }

    /// Waits (without a thread) for a free load slot; hold it across the blocking load
    /// (compile or cached load, instantiation, `init`).
    pub async fn load_slot(&self) -> LoadSlot {
        // The semaphore is never closed; were it, the load would run without a slot.
        LoadSlot { _permit: self.inner.load_slots.clone().acquire_owned().await.ok() }
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The linker for instances of `component` (of the engine that compiled it).
    pub(crate) fn linker_for(&self, component: &Component) -> &Linker<HostState> {
        match &self.inner.tier_up {
            Some((baseline, linker, _)) if Engine::same(component.engine(), baseline.engine()) => linker,
            _ => &self.inner.linker,
        }
    }

    /// Whether loads that miss the compile cache start on Winch code and tier up.
    pub fn tier_up_enabled(&self) -> bool {
        self.inner.tier_up.is_some()
    }

    /// Waits until the background tier-ups queued so far have finished (each plugin using
    /// their components switched), at most `timeout`; whether they have. True at once with
    /// tier-up off.
    pub fn wait_for_tier_ups(&self, timeout: Duration) -> bool {
        self.inner.tier_up.as_ref().is_none_or(|(_, _, worker)| worker.wait_idle(timeout))
    }

    /// Every compile permit: Cranelift compiles (background tier-ups included) wait until
    /// they are dropped.
    #[cfg(test)]
    pub(crate) fn hold_compiles(&self) -> Vec<crate::plugin::compile::permits::Permit<'_>> {
        self.inner.optimizer.permits().enter_all()
    }

    /// Background tier-ups so far, by result.
    pub fn tier_ups(&self) -> TierUps {
        let get = |result| self.inner.metrics.tier_ups.get_or_create(&TierUpLabels { result }).get();
        TierUps { done: get("done"), abandoned: get("abandoned"), failed: get("failed") }
    }

    pub(crate) fn metrics(&self) -> &RuntimeMetrics {
        &self.inner.metrics
    }

    /// The host's instance slots, when the pooling allocator bounds them.
    pub(crate) fn instance_slots(&self) -> Option<&Arc<InstanceSlots>> {
        self.inner.slots.as_ref()
    }

    /// (instances alive, slots charged, plugins holding a reserved slot) of the host's
    /// instance slots; `None` without the pooling allocator.
    pub fn instance_slot_counts(&self) -> Option<(usize, usize, usize)> {
        self.inner.slots.as_ref().map(|s| s.counts())
    }

    /// The host is shutting down: every plugin call blocked in a host call (a WASI sleep or
    /// poll) ends now, and every later one at once, with a trap saying so. Calls running
    /// guest code go on to their end or their deadline (the drain).
    pub fn shut_down_calls(&self) {
        if !self.inner.shutdown.is_cancelled() {
            tracing::info!("shutting down: plugin calls blocked in host calls are cancelled");
            self.inner.shutdown.cancel();
        }
    }

    /// Cancelled once [`PluginEngine::shut_down_calls`] ran.
    pub(crate) fn shutdown_token(&self) -> tokio_util::sync::CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Why the configured compile cache directory was refused (not this host's, or it could
    /// not be made private or keyed), when it was; the engine then compiles every load.
    pub fn compile_cache_refusal(&self) -> Option<&str> {
        self.inner.cache_refusal.as_deref()
    }

    /// Compile cache artifacts rejected so far (never loaded), by reason (also the
    /// `wasmctrl_compile_cache_rejected_artifacts` metric).
    pub fn rejected_artifacts(&self, reason: &'static str) -> u64 {
        use crate::plugin::metrics::RejectedArtifactLabels;
        self.inner.metrics.rejected_artifacts.get_or_create(&RejectedArtifactLabels { reason }).get()
    }

    /// The engine's configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The compiled component of `wasm`, shared with every other plugin of the same bytes:
    /// the one in use, or the one a concurrent call is compiling (this call waits for it),
    /// or else a new load: [`PluginEngine::load_component`]'s, or with tier-up on and a
    /// compile cache miss, Winch's (Cranelift's follows in the background). Blocking.
    pub fn shared_component(&self, wasm: &[u8]) -> Result<SharedComponent, PluginError> {
        let hash = hex::encode(Sha256::digest(wasm));
        let (shared, outcome) =
            self.inner.components.get_or_load(&hash, || self.load_tiered(wasm, hash.clone()))?;
        if outcome == Outcome::Shared {
            self.count_load("shared");
        }
        Ok(shared)
    }

    /// The compiled component of the `.wasm` with hex SHA-256 `hash`, for a plugin whose
    /// code was dropped while idle: the one in use by other plugins, or a concurrent
    /// load's, or the compile cache's artifact; only when the cache lacks it, a new load of
    /// the bytes `wasm` gives (read then, checked by the caller). Blocking.
    pub(crate) fn reload_component(
        &self,
        hash: &str,
        wasm: impl FnOnce() -> Result<Vec<u8>, PluginError>,
    ) -> Result<SharedComponent, PluginError> {
        let (shared, outcome) = self.inner.components.get_or_load(&hash.to_owned(), || {
            let start = Instant::now();
            if let Some(component) = self.inner.optimizer.cached(hash) {
                self.count_load("cache");
                return Ok(Arc::new(TieredComponent::new(
                    hash.to_owned(),
                    component,
                    Tier::Optimized,
                    start,
                )));
            }
            self.load_tiered(&wasm()?, hash.to_owned())
        })?;
        if outcome == Outcome::Shared {
            self.count_load("shared");
        }
        Ok(shared)
    }

    /// Whether the compile cache holds an artifact for the `.wasm` with hex SHA-256 `hash`
    /// (for this engine).
    pub(crate) fn has_cached_artifact(&self, hash: &str) -> bool {
        self.inner.optimizer.has_artifact(hash)
    }

    /// Adds a plugin to the idle sweeps (a no-op without an idle timeout).
    pub(crate) fn register_idle(&self, plugin: std::sync::Weak<dyn IdlePlugin>) {
        if let Some((reaper, _)) = &self.inner.idle {
            reaper.register(plugin);
        }
    }

    /// Releases, as of `now`, the instances idle for the idle-instance timeout or longer
    /// (what the engine's reaper does on its own every quarter of the timeout); returns how
    /// many.
    pub fn release_idle_instances_at(&self, now: Instant) -> usize {
        self.inner.idle.as_ref().map_or(0, |(reaper, _)| reaper.sweep_instances(now))
    }

    /// Drops, as of `now`, the code of the plugins without a call for the idle-code timeout
    /// or longer that can drop it (what the engine's reaper does on its own every quarter
    /// of the timeout); returns how many dropped it.
    pub fn drop_idle_code_at(&self, now: Instant) -> usize {
        self.inner.idle.as_ref().map_or(0, |(reaper, _)| reaper.sweep_code(now))
    }

    /// Code dropped while idle and reloaded so far.
    pub fn code_drops(&self) -> CodeDrops {
        let m = &self.inner.metrics;
        CodeDrops { dropped: m.code_drops.get(), reloaded: m.code_reloads.get() }
    }

    /// Plugin instances alive now, every plugin and version together (also the
    /// `wasmctrl_plugin_live_instances` metric).
    pub fn live_instances(&self) -> i64 {
        self.inner.metrics.live_instances.get()
    }

    /// Distinct compiled components in use by plugins (or being compiled) now.
    pub fn shared_components(&self) -> usize {
        self.inner.components.live()
    }

    /// Component loads so far, by origin (also the `wasmctrl_plugin_component_loads` metric).
    pub fn component_loads(&self) -> ComponentLoads {
        let get =
            |origin| self.inner.metrics.component_loads.get_or_create(&ComponentLoadLabels { origin }).get();
        ComponentLoads {
            compiled: get("compiled"),
            compiled_in_child: self.inner.optimizer.compiled_in_child(),
            baseline: get("baseline"),
            from_cache: get("cache"),
            shared: get("shared"),
        }
    }

    fn count_load(&self, origin: &'static str) {
        self.inner.metrics.component_loads.get_or_create(&ComponentLoadLabels { origin }).inc();
    }

    /// Compiles `wasm`, or loads it from the compile cache when an artifact for the same
    /// bytes and the same engine exists. Blocking (compiling takes ~100s of ms). Every call
    /// compiles or reads the cache anew; plugins load through
    /// [`PluginEngine::shared_component`] instead.
    pub fn load_component(&self, wasm: &[u8]) -> Result<LoadedComponent, PluginError> {
        self.load_hashed(wasm, hex::encode(Sha256::digest(wasm)))
    }

    fn load_hashed(&self, wasm: &[u8], hash: String) -> Result<LoadedComponent, PluginError> {
        let start = Instant::now();
        let optimizer = &self.inner.optimizer;
        if let Some(component) = optimizer.cached(&hash) {
            self.count_load("cache");
            return Ok(LoadedComponent { component, hash, from_cache: true, elapsed: start.elapsed() });
        }
        self.validate_component(wasm)?;
        let component = optimizer.compile(wasm, &hash, optimizer.permits().enter())?;
        self.count_load("compiled");
        Ok(LoadedComponent { component, hash, from_cache: false, elapsed: start.elapsed() })
    }

    /// With tier-up on and no cached artifact, the Winch-compiled component (its tier-up
    /// queued); else [`PluginEngine::load_hashed`]'s.
    fn load_tiered(&self, wasm: &[u8], hash: String) -> Result<Arc<TieredComponent>, PluginError> {
        let start = Instant::now();
        let optimized =
            |component| Ok(Arc::new(TieredComponent::new(hash.clone(), component, Tier::Optimized, start)));
        let Some((baseline, _, worker)) = &self.inner.tier_up else {
            return optimized(self.load_hashed(wasm, hash.clone())?.component);
        };
        if let Some(component) = self.inner.optimizer.cached(&hash) {
            self.count_load("cache");
            return optimized(component);
        }
        self.validate_component(wasm)?;
        let version = hash.get(..12).unwrap_or(&hash);
        match baseline.compile(wasm, &hash) {
            Ok(component) => {
                self.count_load("baseline");
                let tiered = Arc::new(TieredComponent::new(hash.clone(), component, Tier::Baseline, start));
                tracing::debug!(%version, elapsed_ms = start.elapsed().as_secs_f64() * 1e3, "compiled with Winch; Cranelift follows in the background");
                worker.submit(wasm, hash.clone(), Arc::downgrade(&tiered));
                Ok(tiered)
            }
            Err(BaselineError::Failed(e)) => Err(e),
            Err(BaselineError::Refused(e)) => {
                // A feature Winch lacks (or bytes nobody can compile: Cranelift then says why).
                tracing::debug!(%version, error = %e, "Winch cannot compile this component; compiling with Cranelift");
                let optimizer = &self.inner.optimizer;
                let component = optimizer.compile(wasm, &hash, optimizer.permits().enter())?;
                self.count_load("compiled");
                optimized(component)
            }
        }
    }

    /// Compiles with Cranelift without touching the cache.
    pub fn compile(&self, wasm: &[u8]) -> Result<Component, PluginError> {
        self.validate_component(wasm)?;
        self.inner.optimizer.compile_uncached(wasm)
    }

    fn validate_component(&self, wasm: &[u8]) -> Result<(), PluginError> {
        if is_core_module(wasm) {
            return Err(PluginError::Compile(
                "this is a core WebAssembly module, not a component: build for wasm32-wasip2 or run `wasm-tools component new`"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Refuses `component` when it imports a WASI interface the host does not link (see
    /// `plugin::imports::wasi`); `plugin` names it in the message.
    pub fn check_imports(&self, plugin: &str, component: &Component) -> Result<(), PluginError> {
        let ty = component.component_type();
        let imports: Vec<&str> = ty.imports(component.engine()).map(|(name, _)| name).collect();
        let ungranted = wasi::ungranted_imports(imports);
        if ungranted.is_empty() {
            return Ok(());
        }
        Err(PluginError::Ungranted { plugin: plugin.to_owned(), reason: wasi::refusal(&ungranted) })
    }
}

/// The Winch engine and its linker; `None`, with a warning, when wasmtime refuses it here
/// (tier-up is then off: every load compiles with Cranelift).
fn baseline_engine(
    config: &EngineConfig,
    disk: Option<CompileCache>,
) -> Option<(Baseline, Linker<HostState>)> {
    let built = Baseline::new(config, disk).and_then(|baseline| Ok((link(baseline.engine())?, baseline)));
    match built {
        Ok((linker, baseline)) => Some((baseline, linker)),
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "Winch is unavailable on this host; tier-up is off (every load compiles with Cranelift)");
            None
        }
    }
}

/// Whether `wasm` is a core module (its preamble says so), read by `wasmparser`; anything
/// else (a component, or bytes that are not wasm) is left to the compiler to judge.
fn is_core_module(wasm: &[u8]) -> bool {
    matches!(
        wasmparser::Parser::new(0).parse(wasm, true),
        Ok(wasmparser::Chunk::Parsed {
            payload: wasmparser::Payload::Version { encoding: wasmparser::Encoding::Module, .. },
            ..
        })
    )
}

/// The linker every plugin is instantiated with: each interface on its own, with a getter
/// returning only that interface's view of the store's state.
fn link(engine: &Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut l = Linker::<HostState>::new(engine);
    wasi::add_to_linker(&mut l, HostState::poll)?;
    types::add_to_linker::<HostState, TypesHost>(&mut l, |_| TypesHost)?;
    cache::add_to_linker::<HostState, cache_import::HasCache>(&mut l, HostState::cache)?;
    client::add_to_linker::<HostState, client_import::HasClient>(&mut l, HostState::client)?;
    events::add_to_linker::<HostState, events_import::HasEvents>(&mut l, HostState::events)?;
    log::add_to_linker::<HostState, log_import::HasLog>(&mut l, HostState::log)?;
    config::add_to_linker::<HostState, config_import::HasConfig>(&mut l, HostState::config)?;
    Ok(l)
}

/// Bumps the engines' epochs at a fixed period on its own thread.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl EpochTicker {
    fn start(engines: Vec<Engine>, tick: Duration) -> Result<Self, PluginError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::park_timeout(tick);
                    for engine in &engines {
                        engine.increment_epoch();
                    }
                }
            })
            .map_err(|e| PluginError::Engine(format!("starting the epoch ticker: {e}")))?;
        Ok(EpochTicker { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

#[cfg(test)]
mod tests {
    use super::{EngineConfig, PluginEngine, load_slots};

    #[tokio::test]
    async fn loads_beyond_the_slots_wait_until_one_is_freed() {
        let engine = PluginEngine::new(EngineConfig { pooling: None, ..EngineConfig::default() }, None)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut held = Vec::new();
        for _ in 0..load_slots() {
            held.push(engine.load_slot().await);
        }
        let mut next = std::pin::pin!(engine.load_slot());
        assert!(futures::poll!(next.as_mut()).is_pending(), "every slot is taken");
        held.pop();
        assert!(futures::poll!(next.as_mut()).is_ready(), "a freed slot goes to the waiting load");
    }

    #[test]
    fn core_modules_are_told_from_components_by_their_preamble() {
        assert!(super::is_core_module(b"\0asm\x01\0\0\0"));
        assert!(!super::is_core_module(b"\0asm\x0d\0\x01\0"), "a component");
        assert!(!super::is_core_module(b"not wasm at all"));
        assert!(!super::is_core_module(b"\0as"), "too short to tell");
    }
}
