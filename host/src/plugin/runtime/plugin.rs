//! A loaded plugin: its compiled component, `InstancePre`, instance pool and the calls
//! into its exports, with the sandbox's limits applied to each call (in `calls`).
//!
//! Invariants:
//! - Every instance ran `init(settings)` successfully before its first other call.
//! - A plugin whose `init` reports a `for-kind` other than its spec's `for_kind` is not
//!   loaded ([`PluginError::KindMismatch`]).
//! - How a call runs under the sandbox's limits is `calls`'s (its invariants are there);
//!   what a hook, `map` or `filter` is handed is `hooks`'s; admission calls are `admit`'s.
//! - Calls block: run them on blocking threads ([`super::reconciler`] does).
//! - Plugins loaded from bytes share compiled code by content hash (one compile for any
//!   number of copies); instances idle past the engine's idle timeout are released and the
//!   next call instantiates (and `init`s) a new one.
//! - Tier-up (a plugin loaded on Winch code, see [`crate::plugin::compile::tier`]): when
//!   the optimised code is ready, new instances come from it; idle baseline instances are
//!   dropped, and one in a call finishes that call and is then dropped (never reused). The
//!   switch changes only which code serves a call: the pool's bound on instances (and so on
//!   calls at once) holds across it, no call is dropped or run twice, and the plugin's
//!   queue, handlers and hook dispatch are not involved.
//! - Idle code (see [`super::plugin_code`]): a plugin loaded from a file with no call for the
//!   engine's idle-code timeout releases its idle instances and drops its compiled code, only
//!   while no instance exists and no call is under way (decided under the pool's lock, so
//!   no checkout starts meanwhile) and never while on baseline code (a tier-up pending).
//!   The next call loads the code again before instantiating (concurrent calls wait for
//!   one load); a reload that fails fails that call only (retryable), and the next call
//!   tries again. Which code serves a call is all that changes: the pool, the plugin's
//!   queue and a hot reload's hand-off work the same with the code dropped or not.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use wasmtime::Store;
use wasmtime::component::Component;

use super::admission_exports::AdmissionFuncs;
use super::engine::PluginEngine;
use super::idle::IdlePlugin;
use super::plugin_code::{Code, PluginCode};
use super::pool::{CheckoutError, Pool};
use super::store_data::{HostState, PluginContexts};
use crate::controller::{Action, ReconcileError, Request};
use crate::plugin::PluginError;
use crate::plugin::bindings::Plugin as PluginBindings;
use crate::plugin::bindings::exports::wasmctrl::controller::reconciler::{
    Hooks, ReconcileError as WitReconcileError, ReconcileResult,
};
use crate::plugin::bindings::wasmctrl::controller::types::Request as WitRequest;
use crate::plugin::compile::tier::{Tier, TierUpTarget};
use crate::plugin::imports::access::Access;
use crate::plugin::imports::cache::{CacheCtx, CacheReader};
use crate::plugin::imports::call::Interrupts;
use crate::plugin::imports::client::ClientCtx;
use crate::plugin::imports::cluster::KubeServices;
use crate::plugin::imports::config::ConfigCtx;
use crate::plugin::imports::events::EventsCtx;
use crate::plugin::imports::log::LogCtx;
use crate::plugin::imports::output_limit::GuestOutputLimit;
use crate::plugin::spec::{Gvk, PluginSpec};

/// What the host gives a plugin beyond its spec: the caches of its readable kinds and
/// (optionally) cluster access for `client` and `events`.
#[derive(Clone, Default)]
pub struct PluginEnv {
    /// One cache per readable kind (informer indexers).
    pub caches: HashMap<Gvk, Arc<dyn CacheReader>>,
    pub kube: Option<Arc<KubeServices>>,
}

/// The optional exports a plugin implements (from its `init`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PluginHooks {
    pub on_add: bool,
    pub on_update: bool,
    pub on_delete: bool,
    pub map: bool,
    pub filter: bool,
}

impl From<Hooks> for PluginHooks {
    fn from(h: Hooks) -> Self {
        PluginHooks {
            on_add: h.contains(Hooks::ON_ADD),
            on_update: h.contains(Hooks::ON_UPDATE),
            on_delete: h.contains(Hooks::ON_DELETE),
            map: h.contains(Hooks::MAP),
            filter: h.contains(Hooks::FILTER),
        }
    }
}

/// What a plugin's `init` reported about itself.
struct InitInfo {
    hooks: PluginHooks,
    /// The kind the plugin was written for, when it says.
    for_kind: Option<Gvk>,
}

/// Why a call into a plugin failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The guest trapped (panic, unreachable, deadline, out of memory, stack overflow) or
    /// broke a sandbox limit; the instance was discarded.
    #[error("plugin {plugin} trapped in {export}: {reason}")]
    Trap { plugin: String, export: &'static str, reason: String },
    /// A fresh instance's `init` failed.
    #[error("plugin {plugin}: init failed: {reason}")]
    Init { plugin: String, reason: String },
    /// No instance became free before the deadline.
    #[error("plugin {plugin}: {reason}")]
    Busy { plugin: String, reason: String },
}

impl From<CallError> for ReconcileError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Trap { .. } => ReconcileError::Panic(e.to_string()),
            CallError::Init { .. } | CallError::Busy { .. } => ReconcileError::Retryable(e.to_string()),
        }
    }
}

/// One plugin instance: a store and the typed exports.
pub(crate) struct Instance {
    store: Store<HostState>,
    bindings: PluginBindings,
    /// The admission exports, when the component has them.
    admission: AdmissionFuncs,
    /// The compiler of the code it runs.
    tier: Tier,
    _live: LiveInstance,
}

/// Calls a plugin served so far, by the tier of the code that ran them (`init` excluded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierCalls {
    pub baseline: u64,
    pub optimized: u64,
}

/// Counts an instance in `wasmctrl_plugin_live_instances` (and its plugin's
/// `wasmctrl_plugin_instances`) while it exists.
struct LiveInstance([prometheus_client::metrics::gauge::Gauge; 2]);

impl LiveInstance {
    fn new(metrics: &crate::plugin::metrics::RuntimeMetrics, plugin: &str) -> Self {
        let labels = crate::metrics::PluginLabels { plugin: plugin.to_owned() };
        let gauges = [metrics.live_instances.clone(), metrics.instances.get_or_create(&labels).clone()];
        gauges.iter().for_each(|g| {
            g.inc();
        });
        LiveInstance(gauges)
    }
}

impl Drop for LiveInstance {
    fn drop(&mut self) {
        self.0.iter().for_each(|g| {
            g.dec();
        });
    }
}

/// A plugin ready to be called; cheap to clone.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    engine: PluginEngine,
    /// The code new instances are made from (replaced once by a tier-up; dropped while
    /// idle and loaded again).
    code: PluginCode,
    /// This plugin, for the tier-up of code loaded again (set once built).
    me: OnceLock<Weak<PluginInner>>,
    /// Calls served by baseline and by optimised code.
    calls: [AtomicU64; 2],
    /// The spec the plugin runs with (limits normalized).
    spec: PluginSpec,
    /// Short content hash of the `.wasm` (as `/plugins` shows it), for logs.
    short_version: String,
    /// The import contexts every instance's state holds.
    contexts: PluginContexts,
    pool: Pool<Instance>,
    hooks: PluginHooks,
    version: String,
}

impl TierUpTarget for PluginInner {
    fn tier_up(&self, optimized: &Component, since_load: Duration) {
        // Baseline code is never dropped: resident unless already switched.
        let Some(current) = self.code.current().filter(|c| c.tier == Tier::Baseline) else { return };
        let shared = current.shared().cloned();
        drop(current);
        match Code::prepare(&self.engine, &self.spec.name, optimized, Tier::Optimized, shared) {
            Ok(code) => {
                self.code.replace(code);
                // From here every checkout gets an instance of the optimised code: the
                // baseline ones idle now go, the busy ones once their call is done.
                self.pool.renew();
                tracing::info!(
                    plugin = %self.spec.name,
                    version = %self.short_version,
                    since_load_ms = since_load.as_secs_f64() * 1e3,
                    "tier-up: new instances run Cranelift code"
                );
            }
            Err(e) => {
                tracing::warn!(plugin = %self.spec.name, version = %self.short_version, error = %e, "tier-up: the optimised code does not link; staying on Winch code");
            }
        }
    }
}

impl IdlePlugin for PluginInner {
    fn release_idle_since(&self, cutoff: Instant) -> usize {
        let released = self.pool.release_idle_since(cutoff);
        if released > 0 {
            tracing::debug!(plugin = %self.spec.name, version = %self.short_version, released, "released idle instances");
        }
        released
    }

    fn drop_code_unused_since(&self, cutoff: Instant) -> bool {
        // The cheap checks first; the compile cache's (a file's metadata) last.
        if !self.code.droppable() || !self.pool.inactive_since(cutoff) {
            return false;
        }
        if !self.engine.has_cached_artifact(&self.version) {
            tracing::debug!(plugin = %self.spec.name, version = %self.short_version, "idle code kept: the compile cache does not have it");
            return false;
        }
        // Instances idle that long go with the code (they hold it).
        self.release_idle_since(cutoff);
        // Under the pool's lock: no instance exists and no checkout can start meanwhile.
        let Some(code) = self.pool.when_unused_since(cutoff, || self.code.take()).flatten() else {
            return false;
        };
        drop(code);
        self.engine.metrics().code_drops.inc();
        tracing::info!(plugin = %self.spec.name, version = %self.short_version, "compiled code dropped after idle-code-timeout without a call; the next call loads it again");
        true
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin").field("name", &self.name()).field("version", &self.inner.version).finish()
    }
}

impl Plugin {
    /// Compiles (or loads from the compile cache) `wasm`, checks it targets the `plugin`
    /// world, creates a first instance and runs its `init`. Blocking: run it on a blocking
    /// thread. Fails, leaving nothing behind, when any step fails. The compiled code stays
    /// loaded while the plugin lives ([`Plugin::load_file`]'s may be dropped while idle).
    pub fn load(
        engine: &PluginEngine,
        spec: PluginSpec,
        wasm: &[u8],
        env: PluginEnv,
    ) -> Result<Plugin, PluginError> {
        Self::load_shared(engine, spec, wasm, None, env)
    }

    /// As [`Plugin::load`], for `wasm` as read from the file `path`. Such a plugin drops
    /// its compiled code after the engine's idle-code timeout without a call, and loads it
    /// again for the next call: from the compile cache, or, should the cache have lost it,
    /// from `path` again if the file's content is still `wasm`'s (see [`super::plugin_code`]).
    pub fn load_file(
        engine: &PluginEngine,
        spec: PluginSpec,
        path: &Path,
        wasm: &[u8],
        env: PluginEnv,
    ) -> Result<Plugin, PluginError> {
        Self::load_shared(engine, spec, wasm, Some(path), env)
    }

    fn load_shared(
        engine: &PluginEngine,
        spec: PluginSpec,
        wasm: &[u8],
        file: Option<&Path>,
        env: PluginEnv,
    ) -> Result<Plugin, PluginError> {
        let shared = engine.shared_component(wasm)?;
        let (component, tier) = shared.value().current();
        let version = shared.value().hash().to_owned();
        engine.check_imports(&spec.name, &component)?;
        let code = Code::prepare(engine, &spec.name, &component, tier, Some(shared))?;
        Self::build(engine, spec, code, version, env, file)
    }

    /// As [`Plugin::load_file`], for the version whose `.wasm` had the hex SHA-256
    /// `version`, without its bytes: the code comes from a plugin that still has it loaded,
    /// or from the compile cache (for a TOML edit applied while the `.wasm` is missing).
    /// Fails when neither has it.
    pub fn load_version(
        engine: &PluginEngine,
        spec: PluginSpec,
        version: &str,
        path: &Path,
        env: PluginEnv,
    ) -> Result<Plugin, PluginError> {
        let name = spec.name.clone();
        let shared = engine.reload_component(version, || {
            Err(PluginError::Init {
                plugin: name.clone(),
                reason: "the compiled code of this version is no longer loaded or cached".into(),
            })
        })?;
        let (component, tier) = shared.value().current();
        engine.check_imports(&spec.name, &component)?;
        let code = Code::prepare(engine, &spec.name, &component, tier, Some(shared))?;
        Self::build(engine, spec, code, version.to_owned(), env, Some(path))
    }

    /// Keeps the plugin's compiled code loaded from now on (its file is gone, so code
    /// dropped while idle might not be had again), loading it again first if it was
    /// dropped. Fails when the code was dropped and can no longer be loaded.
    pub fn keep_code(&self) -> Result<(), PluginError> {
        self.inner.code.pin();
        self.inner
            .code
            .get_or_reload(&self.inner.engine, &self.inner.spec.name, &self.inner.version)
            .map(|_| ())
    }

    /// As [`Plugin::load`], from an already compiled component.
    pub fn from_component(
        engine: &PluginEngine,
        spec: PluginSpec,
        component: &Component,
        version: String,
        env: PluginEnv,
    ) -> Result<Plugin, PluginError> {
        engine.check_imports(&spec.name, component)?;
        let code = Code::prepare(engine, &spec.name, component, Tier::Optimized, None)?;
        Self::build(engine, spec, code, version, env, None)
    }

    fn build(
        engine: &PluginEngine,
        mut spec: PluginSpec,
        code: Code,
        version: String,
        env: PluginEnv,
        file: Option<&Path>,
    ) -> Result<Plugin, PluginError> {
        spec.limits = spec.limits.normalized();
        spec.concurrency = spec.concurrency.max(1);
        let name = spec.name.clone();
        let tier = code.tier;
        // One instance per concurrent reconcile plus one for notifications (hooks, map,
        // filter), so those never wait behind a full set of reconciles; each holds one of
        // the host's instance slots, of which a plugin gets a fair share (see `instance_slots`).
        let size = spec.concurrency + 1;
        let quota = engine
            .instance_slots()
            .map(|slots| slots.register(size, spec.concurrency))
            .transpose()
            .map_err(|e| PluginError::Slots { plugin: name.clone(), reason: e.to_string() })?;
        let pool = Pool::with_quota(size, quota);
        let short = short_version(&version).to_owned();
        let contexts = contexts(&spec, &short, env, engine);
        let mut inner = PluginInner {
            engine: engine.clone(),
            code: PluginCode::new(code, file.map(Path::to_path_buf)),
            me: OnceLock::new(),
            calls: [AtomicU64::new(0), AtomicU64::new(0)],
            spec,
            short_version: short,
            contexts,
            pool,
            hooks: PluginHooks::default(),
            version,
        };
        // The first instance, through the pool (it takes its slot there) and back into it.
        let mut info = None;
        let deadline = Instant::now() + inner.spec.limits.deadline;
        let reason = {
            let first = inner.pool.checkout(deadline, || {
                inner.instantiate().map(|(instance, i)| {
                    info = Some(i);
                    instance
                })
            });
            match first {
                Ok(lease) => {
                    drop(lease);
                    None
                }
                Err(CheckoutError::Create(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
            }
        };
        let info = match (reason, info) {
            (None, Some(info)) => info,
            (reason, _) => {
                let reason = reason.unwrap_or_else(|| "no instance was created".to_owned());
                return Err(PluginError::Init { plugin: name, reason });
            }
        };
        if let Some(written_for) = info.for_kind
            && written_for != inner.spec.for_kind
        {
            return Err(PluginError::KindMismatch {
                plugin: name,
                written_for,
                toml: inner.spec.for_kind.clone(),
            });
        }
        let hooks = info.hooks;
        inner.hooks = hooks;
        tracing::info!(plugin = %name, version = %inner.version, ?hooks, tier = tier.as_str(), "plugin loaded");
        let inner = Arc::new(inner);
        let _ = inner.me.set(Arc::downgrade(&inner));
        engine.register_idle(Arc::downgrade(&inner) as Weak<dyn IdlePlugin>);
        inner.follow_tier_up();
        // What the load allocated and freed goes back to the system now, not in seconds.
        if !crate::heap::release_free_pages() {
            tracing::debug!(plugin = %name, "jemalloc refused to purge its free pages");
        }
        Ok(Plugin { inner })
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.inner.spec.name
    }

    /// The hex SHA-256 of the plugin's `.wasm`.
    pub fn version(&self) -> &str {
        &self.inner.version
    }

    /// The version as `/plugins` and every log line of the plugin show it (12 hex digits).
    pub fn short_version(&self) -> &str {
        &self.inner.short_version
    }

    /// The spec the plugin runs with (limits normalized).
    pub fn spec(&self) -> &PluginSpec {
        &self.inner.spec
    }

    /// The optional exports the plugin declared in `init`.
    pub fn hooks(&self) -> PluginHooks {
        self.inner.hooks
    }

    /// The compiler of the code new instances run: [`Tier::Baseline`] from a cold load with
    /// tier-up on until the background Cranelift compile is done, then [`Tier::Optimized`].
    /// Code dropped while idle was optimised (baseline code is never dropped).
    pub fn tier(&self) -> Tier {
        self.inner.code.current().map_or(Tier::Optimized, |c| c.tier)
    }

    /// Whether the compiled code is loaded (false once dropped after the engine's
    /// idle-code timeout, until the next call loads it again).
    pub fn code_resident(&self) -> bool {
        self.inner.code.current().is_some()
    }

    /// Calls served so far (`init` excluded), by the tier of the code that ran them.
    pub fn calls_by_tier(&self) -> TierCalls {
        TierCalls {
            baseline: self.inner.calls[0].load(Ordering::Relaxed),
            optimized: self.inner.calls[1].load(Ordering::Relaxed),
        }
    }

    /// (idle, live) instances of the pool.
    pub fn pool_counts(&self) -> (usize, usize) {
        self.inner.pool.counts()
    }

    /// Drops the idle instances (e.g. when the plugin is being replaced).
    pub fn release_idle_instances(&self) {
        self.inner.pool.clear_idle();
    }

    /// Calls `reconcile`. Blocking.
    pub fn reconcile_blocking(&self, request: &Request) -> Result<Action, ReconcileError> {
        let wit = WitRequest { namespace: request.namespace.clone(), name: request.name.clone() };
        let max = self.inner.spec.limits.max_output;
        let result = self.inner.call("reconcile", Some(request.key()), |inst| {
            let r = inst.bindings.wasmctrl_controller_reconciler().call_reconcile(&mut inst.store, &wit)?;
            if let Err(WitReconcileError::Retryable(m) | WitReconcileError::Terminal(m)) = &r {
                check_output(m.len(), max)?;
            }
            Ok(r)
        })?;
        match result {
            Ok(ReconcileResult::Done) => Ok(Action::Done),
            Ok(ReconcileResult::Requeue) => Ok(Action::Requeue),
            Ok(ReconcileResult::RequeueAfterMs(ms)) => Ok(Action::RequeueAfter(Duration::from_millis(ms))),
            Err(WitReconcileError::Retryable(m)) => Err(ReconcileError::Retryable(m)),
            Err(WitReconcileError::Terminal(m)) => Err(ReconcileError::Terminal(m)),
        }
    }
}

/// Each import's host context for one plugin, built once and shared by its instances.
fn contexts(spec: &PluginSpec, short_version: &str, env: PluginEnv, engine: &PluginEngine) -> PluginContexts {
    let interrupts =
        Interrupts { shutdown: engine.shutdown_token(), revoked: env.kube.as_ref().map(|k| k.revocation()) };
    let access = Arc::new(Access::new(
        spec.name.clone(),
        spec.permissions.clone(),
        &spec.limits,
        engine.metrics().clone(),
    ));
    let output = Arc::new(GuestOutputLimit::new(
        spec.name.as_str().into(),
        spec.limits.log_lines_per_second,
        engine.metrics().clone(),
    ));
    PluginContexts {
        output: output.clone(),
        limits: spec.limits.clone(),
        cache: Arc::new(CacheCtx { access: access.clone(), caches: env.caches }),
        client: Arc::new(ClientCtx {
            access: access.clone(),
            field_manager: spec.field_manager.clone(),
            kube: env.kube.clone(),
        }),
        events: Arc::new(EventsCtx { access, kube: env.kube }),
        log: Arc::new(LogCtx { plugin: spec.name.clone(), version: short_version.to_owned(), limit: output }),
        config: Arc::new(ConfigCtx { plugin: spec.name.clone(), settings: spec.settings.clone() }),
        interrupts,
    }
}

/// The first 12 hex digits of a content hash (what `reload::version_of` gives).
fn short_version(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod admit_in_task_tests;
#[cfg(test)]
mod tier_up_tests;

// How a call runs (instances, limits, errors), the event hooks and the admission calls
// (`validator`, `mutator`): files of their own, children of this module.
mod calls;
use calls::check_output;
mod hooks;
pub use hooks::FilterInput;
mod admit;
pub use admit::{
    AdmissionInput, AdmissionOperation, AdmissionUser, AdmitError, GuestDenial, GuestMutation, GuestVerdict,
};
