//! A loaded plugin: its compiled component, `InstancePre`, instance pool and the calls
//! into its exports, with the sandbox's limits applied to each call.
//!
//! Invariants:
//! - Every instance ran `init(settings)` successfully before its first other call.
//! - A plugin whose `init` reports a `for-kind` other than its spec's `for_kind` is not
//!   loaded ([`PluginError::KindMismatch`]).
//! - Each call gets the plugin's deadline and its instance's memory and table limits; any
//!   trap or host error fails that call only, and the instance is destroyed (wasmtime
//!   refuses to re-enter a trapped component anyway).
//! - At every epoch tick a running call checks its deadline and whether the host's cluster
//!   access was revoked (leader lease lost): either one interrupts it there. A call blocked
//!   in a host call (a WASI sleep or poll) is ended by its deadline, by the lease's loss and
//!   by the host's shutdown ([`PluginEngine::shut_down_calls`]) all the same, with a trap
//!   naming the host call it was blocked in (see [`crate::plugin::imports::call`]).
//! - Data a guest returns is measured against `max-output`; more is a sandbox violation,
//!   reported like a trap. Each store's hostcall fuel ([`hostcall_fuel`]) bounds what one
//!   host call's arguments or one export's results make wasmtime copy out of the guest,
//!   checked before the copy: past it the call traps, naming `max-output`. The resource
//!   handles an instance holds are bounded the same way (`handles`, in the store and in its
//!   WASI table): past it the call traps, naming the limit.
//! - An object handed to a hook, `map` or `filter` is what the plugin may see of it
//!   ([`Access::guest_view`]): whole if its kind is readable, else its metadata only; one
//!   outside the plugin's namespaces is not handed over at all (the hook is not called,
//!   `map` maps it to nothing, `filter` drops it), and requests `map` returns outside them
//!   are dropped.
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
    FilterEvent, Hooks, ReconcileError as WitReconcileError, ReconcileResult,
};
use crate::plugin::bindings::wasmctrl::controller::types::{Gvk as WitGvk, Request as WitRequest};
use crate::plugin::compile::tier::{Tier, TierUpTarget};
use crate::plugin::imports::access::{Access, GuestView};
use crate::plugin::imports::cache::{CacheCtx, CacheReader};
use crate::plugin::imports::call::{BlockedCallEnded, CallInfo, Interrupts};
use crate::plugin::imports::client::ClientCtx;
use crate::plugin::imports::cluster::KubeServices;
use crate::plugin::imports::config::ConfigCtx;
use crate::plugin::imports::events::EventsCtx;
use crate::plugin::imports::log::LogCtx;
use crate::plugin::imports::output_limit::GuestOutputLimit;
use crate::plugin::metrics::PluginCallLabels;
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

    /// Calls `on-add` with what the plugin may see of `object` (nothing when it is outside
    /// the plugin's namespaces: the hook is not called). Blocking.
    pub fn on_add_blocking(&self, kind: &Gvk, object: &[u8], in_initial_list: bool) -> Result<(), CallError> {
        let view = self.inner.access().guest_view(kind, object);
        let Some(object) = view.bytes() else { return Ok(()) };
        let kind = wit_gvk(kind);
        self.inner.call("on-add", None, |inst| {
            inst.bindings.wasmctrl_controller_reconciler().call_on_add(
                &mut inst.store,
                &kind,
                &object.to_vec(),
                in_initial_list,
            )
        })
    }

    /// Calls `on-update` (see [`on_add_blocking`](Self::on_add_blocking)). Blocking.
    pub fn on_update_blocking(&self, kind: &Gvk, old: &[u8], new: &[u8]) -> Result<(), CallError> {
        let access = self.inner.access();
        let (old, new) = (access.guest_view(kind, old), access.guest_view(kind, new));
        let (Some(old), Some(new)) = (old.bytes(), new.bytes()) else { return Ok(()) };
        let kind = wit_gvk(kind);
        self.inner.call("on-update", None, |inst| {
            inst.bindings.wasmctrl_controller_reconciler().call_on_update(
                &mut inst.store,
                &kind,
                &old.to_vec(),
                &new.to_vec(),
            )
        })
    }

    /// Calls `on-delete` (see [`on_add_blocking`](Self::on_add_blocking)). Blocking.
    pub fn on_delete_blocking(
        &self,
        kind: &Gvk,
        object: &[u8],
        final_state_unknown: bool,
    ) -> Result<(), CallError> {
        let view = self.inner.access().guest_view(kind, object);
        let Some(object) = view.bytes() else { return Ok(()) };
        let kind = wit_gvk(kind);
        self.inner.call("on-delete", None, |inst| {
            inst.bindings.wasmctrl_controller_reconciler().call_on_delete(
                &mut inst.store,
                &kind,
                &object.to_vec(),
                final_state_unknown,
            )
        })
    }

    /// Calls `map` with what the plugin may see of `object`; an object outside the plugin's
    /// namespaces maps to nothing, and so does a returned request outside them. Blocking.
    pub fn map_blocking(&self, kind: &Gvk, object: &[u8]) -> Result<Vec<Request>, CallError> {
        let access = self.inner.access();
        let view = access.guest_view(kind, object);
        let Some(object) = view.bytes() else { return Ok(Vec::new()) };
        let wit_kind = wit_gvk(kind);
        let max = self.inner.spec.limits.max_output;
        let requests = self.inner.call("map", None, |inst| {
            let list = inst.bindings.wasmctrl_controller_reconciler().call_map(
                &mut inst.store,
                &wit_kind,
                &object.to_vec(),
            )?;
            // Per request: the two strings plus the fixed part of its canonical-ABI layout.
            let size: usize =
                list.iter().map(|r| 20 + r.name.len() + r.namespace.as_ref().map_or(0, String::len)).sum();
            check_output(size, max)?;
            Ok(list)
        })?;
        let (kept, outside): (Vec<_>, Vec<_>) =
            requests.into_iter().partition(|r| access.in_scope(r.namespace.as_deref()));
        if !outside.is_empty() {
            tracing::warn!(plugin = %self.name(), version = %self.short_version(), kind = %kind, dropped = outside.len(), "map returned requests outside the plugin's namespaces; they were dropped");
        }
        Ok(kept.into_iter().map(|r| Request { namespace: r.namespace, name: r.name }).collect())
    }

    /// Calls `filter` with what the plugin may see of the event's objects; an event about
    /// an object outside the plugin's namespaces is dropped without asking. Blocking.
    pub fn filter_blocking(&self, kind: &Gvk, event: FilterInput<'_>) -> Result<bool, CallError> {
        let access = self.inner.access();
        let view = |json| access.guest_view(kind, json);
        let owned = |v: &GuestView<'_>| v.bytes().map(<[u8]>::to_vec);
        let event = match event {
            FilterInput::Create(o) => owned(&view(o)).map(FilterEvent::Create),
            FilterInput::Update(old, new) => match (owned(&view(old)), owned(&view(new))) {
                (Some(old), Some(new)) => Some(FilterEvent::Update((old, new))),
                _ => None,
            },
            FilterInput::Delete(o) => owned(&view(o)).map(FilterEvent::Delete),
        };
        let Some(event) = event else { return Ok(false) };
        let kind = wit_gvk(kind);
        self.inner.call("filter", None, |inst| {
            inst.bindings.wasmctrl_controller_reconciler().call_filter(&mut inst.store, &kind, &event)
        })
    }
}

/// The event a `filter` call is about, as JSON.
#[derive(Clone, Copy, Debug)]
pub enum FilterInput<'a> {
    Create(&'a [u8]),
    Update(&'a [u8], &'a [u8]),
    Delete(&'a [u8]),
}

fn wit_gvk(kind: &Gvk) -> WitGvk {
    WitGvk { api_version: kind.api_version.clone(), kind: kind.kind.clone() }
}

/// The hostcall fuel of a plugin's stores: roughly the bytes wasmtime copies out of the
/// guest for one host call's arguments or one export's results. `max-output` plus room for
/// the small arguments beside a body, so a body just over `max-output` reaches the import
/// (which refuses it as `invalid`, a clear error) while anything larger traps before it is
/// copied.
fn hostcall_fuel(limits: &crate::plugin::spec::SandboxLimits) -> usize {
    limits.max_output.saturating_add(HOSTCALL_FUEL_SLACK)
}

/// What [`hostcall_fuel`] allows beyond `max-output`.
const HOSTCALL_FUEL_SLACK: usize = 64 << 10;

/// A guest returned more than `max-output` bytes.
#[derive(Debug, thiserror::Error)]
#[error("returned {size} bytes, over the plugin's max-output of {max}")]
struct OutputTooLarge {
    size: usize,
    max: usize,
}

fn check_output(size: usize, max: usize) -> wasmtime::Result<()> {
    if size > max {
        return Err(wasmtime::Error::new(OutputTooLarge { size, max }));
    }
    Ok(())
}

impl PluginInner {
    /// The plugin's grants.
    fn access(&self) -> &Access {
        &self.contexts.cache.access
    }

    /// When this plugin runs baseline code: asks to be told of its tier-up, or switches now
    /// when the tier-up came already (while the plugin was being built, or its code
    /// reloaded).
    fn follow_tier_up(self: &Arc<Self>) {
        let Some(code) = self.code.current().filter(|c| c.tier == Tier::Baseline) else { return };
        let Some(shared) = code.shared().cloned() else { return };
        drop(code);
        let target = Arc::downgrade(self) as Weak<dyn TierUpTarget>;
        if let Some(optimized) = shared.value().subscribe(target) {
            self.tier_up(&optimized, shared.value().loaded_at().elapsed());
        }
    }

    /// The code to instantiate: the resident code, or the code dropped while idle loaded
    /// again (once, whoever else is waiting for it).
    fn code(&self) -> Result<Arc<Code>, CallError> {
        let start = Instant::now();
        let (code, reloaded) =
            self.code.get_or_reload(&self.engine, &self.spec.name, &self.version).map_err(|e| {
                tracing::warn!(plugin = %self.spec.name, version = %self.short_version, error = %e, "loading the code dropped while idle failed");
                CallError::Init { plugin: self.spec.name.clone(), reason: e.to_string() }
            })?;
        if reloaded {
            self.engine.metrics().code_reloads.inc();
            tracing::info!(
                plugin = %self.spec.name,
                version = %self.short_version,
                tier = code.tier.as_str(),
                elapsed_ms = start.elapsed().as_secs_f64() * 1e3,
                "compiled code loaded again after it was dropped while idle"
            );
            if code.tier == Tier::Baseline
                && let Some(me) = self.me.get().and_then(Weak::upgrade)
            {
                me.follow_tier_up();
            }
        }
        Ok(code)
    }

    /// A new instance with `init` run on it, and what its `init` reported.
    fn instantiate(&self) -> Result<(Instance, InitInfo), CallError> {
        let plugin = &self.spec.name;
        let code = self.code()?;
        let mut store = Store::new(code.pre.engine(), HostState::new(&self.contexts));
        store.limiter(|s| &mut s.limits);
        store.set_hostcall_fuel(hostcall_fuel(&self.spec.limits));
        store.set_max_component_handles(self.spec.limits.handles);
        store.epoch_deadline_callback(check_at_tick);
        store.set_epoch_deadline(1);
        store.data_mut().call = CallInfo {
            export: "init",
            deadline: Instant::now() + self.spec.limits.deadline,
            ..CallInfo::idle()
        };
        self.engine
            .metrics()
            .instantiations
            .get_or_create(&PluginCallLabels { plugin: plugin.clone(), call: "init".into() })
            .inc();
        let init_failed = |e: wasmtime::Error, store: &Store<HostState>| CallError::Init {
            plugin: plugin.clone(),
            reason: describe_error(&e, store, &self.spec),
        };
        let instance = code.pre.instance_pre().instantiate(&mut store).map_err(|e| init_failed(e, &store))?;
        let bindings = code.indices.load(&mut store, &instance).map_err(|e| init_failed(e, &store))?;
        let admission = code.admission.load(&mut store, &instance).map_err(|e| init_failed(e, &store))?;
        let init = bindings
            .wasmctrl_controller_reconciler()
            .call_init(&mut store, &self.spec.settings.to_vec())
            .map_err(|e| CallError::Init {
                plugin: plugin.clone(),
                reason: describe_error(&e, &store, &self.spec),
            })?;
        let info = init.map_err(|reason| CallError::Init { plugin: plugin.clone(), reason })?;
        let for_kind = info.for_kind.map(|g| Gvk::new(g.api_version, g.kind));
        let live = LiveInstance::new(self.engine.metrics(), plugin);
        Ok((
            Instance { store, bindings, admission, tier: code.tier, _live: live },
            InitInfo { hooks: info.hooks.into(), for_kind },
        ))
    }

    /// Runs `f` on a pooled instance under the sandbox's limits.
    fn call<R>(
        &self,
        export: &'static str,
        request: Option<String>,
        f: impl FnOnce(&mut Instance) -> wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        self.call_until(export, request, Instant::now() + self.spec.limits.deadline, f)
    }

    /// As [`PluginInner::call`], with the call's deadline given (an admission call's).
    fn call_until<R>(
        &self,
        export: &'static str,
        request: Option<String>,
        deadline: Instant,
        f: impl FnOnce(&mut Instance) -> wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        let mut lease = match self.pool.checkout(deadline, || self.instantiate().map(|(i, _)| i)) {
            Ok(l) => l,
            Err(CheckoutError::Create(e)) => return Err(e),
            Err(e @ (CheckoutError::Exhausted(_) | CheckoutError::NoSlot)) => {
                return Err(CallError::Busy { plugin: self.spec.name.clone(), reason: e.to_string() });
            }
        };
        let inst = lease.get();
        inst.store.set_epoch_deadline(1);
        let data = inst.store.data_mut();
        data.call = CallInfo { export, request, deadline, writes_refused: None };
        data.stderr.lock().clear();
        self.calls[match inst.tier {
            Tier::Baseline => 0,
            Tier::Optimized => 1,
        }]
        .fetch_add(1, Ordering::Relaxed);
        match f(inst) {
            Ok(r) => Ok(r),
            Err(e) => {
                let reason = describe_error(&e, &inst.store, &self.spec);
                lease.poison();
                let plugin = self.spec.name.clone();
                self.engine
                    .metrics()
                    .traps
                    .get_or_create(&PluginCallLabels { plugin: plugin.clone(), call: export.into() })
                    .inc();
                tracing::warn!(plugin = %plugin, version = %self.short_version, export, %reason, "plugin call trapped; instance discarded");
                Err(CallError::Trap { plugin, export, reason })
            }
        }
    }
}

/// A call interrupted because the host's cluster access was revoked.
#[derive(Debug, thiserror::Error)]
#[error("cancelled: this replica lost its leader lease")]
struct Revoked;

/// Runs at each epoch tick of a running call: interrupts it once its deadline has passed
/// (reported as [`wasmtime::Trap::Interrupt`]) or its cluster access was revoked.
fn check_at_tick(
    store: wasmtime::StoreContextMut<'_, HostState>,
) -> wasmtime::Result<wasmtime::UpdateDeadline> {
    let state = store.data();
    if state.interrupts.revoked() {
        return Err(wasmtime::Error::new(Revoked));
    }
    if Instant::now() >= state.call.deadline {
        return Ok(wasmtime::UpdateDeadline::Interrupt);
    }
    Ok(wasmtime::UpdateDeadline::Continue(1))
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

/// A one-line reason for a failed call: the trap kind in words, the guest's last stderr
/// line (a Rust panic message) when it wrote one.
fn describe_error(e: &wasmtime::Error, store: &Store<HostState>, spec: &PluginSpec) -> String {
    let mut reason = if let Some(trap) = e.downcast_ref::<wasmtime::Trap>() {
        match trap {
            wasmtime::Trap::Interrupt => format!("deadline of {:?} exceeded", spec.limits.deadline),
            wasmtime::Trap::StackOverflow => "stack overflow".to_owned(),
            // Rust guests keep large frames on a shadow stack in linear memory; running
            // off its end reads below address 0.
            wasmtime::Trap::MemoryOutOfBounds => {
                "out of bounds memory access (a guest stack overflow looks like this too)".to_owned()
            }
            wasmtime::Trap::UnreachableCodeReached => {
                "unreachable executed (guest panic or abort)".to_owned()
            }
            other => other.to_string(),
        }
    } else if let Some(too_large) = e.downcast_ref::<OutputTooLarge>() {
        too_large.to_string()
    } else if let Some(ended) = e.downcast_ref::<BlockedCallEnded>() {
        ended.describe(Some(spec.limits.deadline))
    } else {
        // The root cause, without wasmtime's backtrace context.
        let text = e.root_cause().to_string();
        if text.contains("growing memory") || text.contains("memory growth") {
            format!("out of memory: the plugin's memory limit of {} bytes was reached", spec.limits.memory)
        } else if text.contains("resource table has no free keys")
            || text.contains("store handle limit exceeded")
        {
            // The resource limits of the store and of its WASI table (known by their messages).
            format!(
                "the plugin holds more than {} resource handles (WASI streams, pollables, ...) at once, \
                 its limit per instance",
                spec.limits.handles
            )
        } else if text.contains("fuel allocated for hostcalls has been exhausted") {
            // wasmtime's hostcall fuel (its error type is private: known by its message).
            format!(
                "a host call's arguments or a returned value would copy more than {} bytes out of the guest, \
                 over the plugin's max-output of {} (plus room for small arguments); nothing was copied",
                hostcall_fuel(&spec.limits),
                spec.limits.max_output
            )
        } else {
            text
        }
    };
    if let Some(text) = store.data().stderr.lock().explanation() {
        reason.push_str(" — guest stderr: ");
        reason.push_str(&text);
    }
    reason
}

#[cfg(test)]
mod tier_up_tests;

// Admission calls (`validator`, `mutator`): their own file, a child of this module.
mod admit;
pub use admit::{
    AdmissionInput, AdmissionOperation, AdmissionUser, AdmitError, GuestDenial, GuestMutation, GuestVerdict,
};
