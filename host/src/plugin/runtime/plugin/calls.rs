//! How a call runs: an instance made and `init`ed, taken from the pool, run under the
//! sandbox's limits, and a failure described in one line. A child of `runtime::plugin`;
//! every export's call (reconcile, hooks, admission) goes through [`PluginInner::call`] or
//! [`PluginInner::call_until`], or, for an admission call running as a future in a task,
//! [`PluginInner::checkout_idle_for_async`] and [`PluginInner::end`].
//!
//! Invariants:
//! - Every instance ran `init(settings)` successfully before its first other call.
//! - Each call gets the plugin's deadline and its instance's memory and table limits; any
//!   trap or host error fails that call only, and the instance is destroyed (wasmtime
//!   refuses to re-enter a trapped component anyway).
//! - At every epoch tick a running call checks its deadline and whether the host's cluster
//!   access was revoked (leader lease lost): either one interrupts it there. A call running
//!   as a future yields to its executor at every tick besides. A call blocked
//!   in a host call (a WASI sleep or poll) is ended by its deadline, by the lease's loss and
//!   by the host's shutdown
//!   ([`PluginEngine::shut_down_calls`](crate::plugin::PluginEngine::shut_down_calls)) all
//!   the same, with a trap naming the host call it was blocked in (see
//!   [`crate::plugin::imports::call`]).
//! - Data a guest returns is measured against `max-output`; more is a sandbox violation,
//!   reported like a trap. Each store's hostcall fuel ([`hostcall_fuel`]) bounds what one
//!   host call's arguments or one export's results make wasmtime copy out of the guest,
//!   checked before the copy: past it the call traps, naming `max-output`. The resource
//!   handles an instance holds are bounded the same way (`handles`, in the store and in its
//!   WASI table): past it the call traps, naming the limit.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use wasmtime::Store;

use super::{CallError, InitInfo, Instance, LiveInstance, PluginInner};
use crate::plugin::compile::tier::{Tier, TierUpTarget};
use crate::plugin::imports::access::Access;
use crate::plugin::imports::call::{BlockedCallEnded, CallInfo};
use crate::plugin::metrics::PluginCallLabels;
use crate::plugin::runtime::plugin_code::Code;
use crate::plugin::runtime::pool::{CheckoutError, Lease};
use crate::plugin::runtime::store_data::HostState;
use crate::plugin::spec::{Gvk, PluginSpec};

/// The hostcall fuel of a plugin's stores: roughly the bytes wasmtime copies out of the
/// guest for one host call's arguments or one export's results. `max-output` plus room for
/// the small arguments beside a body, so a body just over `max-output` reaches the import
/// (which refuses it as `invalid`, a clear error) while anything larger traps before it is
/// copied.
pub(super) fn hostcall_fuel(limits: &crate::plugin::spec::SandboxLimits) -> usize {
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

pub(super) fn check_output(size: usize, max: usize) -> wasmtime::Result<()> {
    if size > max {
        return Err(wasmtime::Error::new(OutputTooLarge { size, max }));
    }
    Ok(())
}

impl PluginInner {
    /// The plugin's grants.
    pub(super) fn access(&self) -> &Access {
        &self.contexts.cache.access
    }

    /// When this plugin runs baseline code: asks to be told of its tier-up, or switches now
    /// when the tier-up came already (while the plugin was being built, or its code
    /// reloaded).
    pub(super) fn follow_tier_up(self: &Arc<Self>) {
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
    pub(super) fn code(&self) -> Result<Arc<Code>, CallError> {
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
    pub(super) fn instantiate(&self) -> Result<(Instance, InitInfo), CallError> {
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
    pub(super) fn call<R>(
        &self,
        export: &'static str,
        request: Option<String>,
        f: impl FnOnce(&mut Instance) -> wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        self.call_until(export, request, Instant::now() + self.spec.limits.deadline, f)
    }

    /// As [`PluginInner::call`], with the call's deadline given (an admission call's).
    pub(super) fn call_until<R>(
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
        self.begin(inst, CallInfo { export, request, deadline, writes_refused: None, yields: false });
        let result = f(inst);
        self.end(export, &mut lease, result)
    }

    /// An idle instance readied for a call that runs as a future (`call_async`, yielding at
    /// each epoch tick: see [`CallInfo::yields`]), or `None` when no instance is idle: the
    /// caller then makes the call through [`PluginInner::call_until`] on a thread that may
    /// block (making an instance runs `init`, and waiting for one blocks). The lease comes
    /// poisoned, so a call abandoned half-way (its future dropped) destroys its instance;
    /// [`PluginInner::end`] clears the mark of a call that finished.
    pub(super) fn checkout_idle_for_async(
        &self,
        export: &'static str,
        request: Option<String>,
        deadline: Instant,
    ) -> Option<Lease<'_, Instance>> {
        let mut lease = self.pool.checkout_idle()?;
        self.begin(lease.get(), CallInfo { export, request, deadline, writes_refused: None, yields: true });
        lease.poison();
        Some(lease)
    }

    /// Readies `inst` for the call `call`: a fresh epoch deadline, the call's record, no
    /// stderr of an earlier call; counts the call by tier.
    fn begin(&self, inst: &mut Instance, call: CallInfo) {
        inst.store.set_epoch_deadline(1);
        let data = inst.store.data_mut();
        data.call = call;
        data.stderr.lock().clear();
        self.calls[match inst.tier {
            Tier::Baseline => 0,
            Tier::Optimized => 1,
        }]
        .fetch_add(1, Ordering::Relaxed);
    }

    /// The outcome of the call `export` on `lease`'s instance: a clean return keeps the
    /// instance; a trap or host error destroys it, is counted and logged, and becomes a
    /// [`CallError::Trap`].
    pub(super) fn end<R>(
        &self,
        export: &'static str,
        lease: &mut Lease<'_, Instance>,
        result: wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        let inst = lease.get();
        inst.store.data_mut().call.yields = false;
        match result {
            Ok(r) => {
                lease.unpoison();
                Ok(r)
            }
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
/// (reported as [`wasmtime::Trap::Interrupt`]) or its cluster access was revoked; else a
/// call running as a future yields to its executor, and a blocking call goes on.
pub(super) fn check_at_tick(
    store: wasmtime::StoreContextMut<'_, HostState>,
) -> wasmtime::Result<wasmtime::UpdateDeadline> {
    let state = store.data();
    if state.interrupts.revoked() {
        return Err(wasmtime::Error::new(Revoked));
    }
    if Instant::now() >= state.call.deadline {
        return Ok(wasmtime::UpdateDeadline::Interrupt);
    }
    if state.call.yields {
        return Ok(wasmtime::UpdateDeadline::Yield(1));
    }
    Ok(wasmtime::UpdateDeadline::Continue(1))
}

/// A one-line reason for a failed call: the trap kind in words, the guest's last stderr
/// line (a Rust panic message) when it wrote one.
pub(super) fn describe_error(e: &wasmtime::Error, store: &Store<HostState>, spec: &PluginSpec) -> String {
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
