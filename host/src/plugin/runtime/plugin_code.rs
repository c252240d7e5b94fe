//! A loaded plugin's compiled code: resident while the plugin is used, dropped after the
//! engine's idle-code timeout without a call, and loaded again by the next call.
//!
//! Invariants:
//! - The code is taken out only by [`PluginCode::take`], which its caller runs while no
//!   instance of the plugin exists and no checkout can start (under its pool's lock): a call
//!   in flight, or an instance being created, always has the code it started with.
//! - Only code that can be had again cheaply is dropped ([`PluginCode::droppable`]): the
//!   optimised (Cranelift) code of a plugin loaded from a file through the engine's
//!   single-flight registry, while the compile cache holds its artifact. Baseline (Winch)
//!   code is never dropped, so a pending tier-up always finds its plugin's code in place; a
//!   plugin built from a caller's component, or loaded from bytes alone, keeps its code.
//! - Dropping the code drops this plugin's `InstancePre` and its handle on the shared
//!   component: the compiled code's memory goes once no other plugin shares it.
//! - A reload runs once however many calls want the code at once (the others wait for it)
//!   and goes through the engine's single-flight registry: code another plugin still shares
//!   is reused; else the compile cache is read (a cached load, as the `plugin` benchmark
//!   measures it). Only when the cache has lost the
//!   artifact (evicted, deleted, unusable) is the `.wasm` read again from the plugin's
//!   file, and then used only if its content hash is still the plugin's version.
//!
//! Why the file and not the bytes: keeping each plugin's `.wasm` in memory would cost its
//! size (the `languages` benchmark lists the sizes per guest language) for as long as the
//! plugin lives, which is what dropping the code is meant to save; the file costs a path.
//! Its failure case is narrow: the cache lost the artifact *and* the file changed or went
//! away since the load. The host's reload manager is then about to replace or remove this
//! version; until it does, calls fail with a retryable error naming the file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use super::admission_exports::{AdmissionExports, AdmissionIndices};
use super::engine::{PluginEngine, SharedComponent};
use super::store_data::HostState;
use crate::plugin::PluginError;
use crate::plugin::bindings::{PluginIndices, PluginPre};
use crate::plugin::compile::tier::Tier;

/// Compiled code ready to instantiate.
pub(crate) struct Code {
    pub pre: PluginPre<HostState>,
    /// The `reconciler` export's functions, looked up once for every instance.
    pub indices: PluginIndices,
    /// The admission exports the component has (`validator`, `mutator`), looked up once.
    pub admission: AdmissionIndices,
    pub tier: Tier,
    /// The shared component this code comes from (kept shared while this code lives);
    /// `None` when built from a caller's component.
    shared: Option<SharedComponent>,
}

impl Code {
    /// `component` (of `tier`) linked for instantiation.
    pub fn prepare(
        engine: &PluginEngine,
        plugin: &str,
        component: &Component,
        tier: Tier,
        shared: Option<SharedComponent>,
    ) -> Result<Code, PluginError> {
        let incompatible = |e: wasmtime::Error| PluginError::Incompatible {
            plugin: plugin.to_owned(),
            reason: format!("{e:#}"),
        };
        let instance_pre = engine.linker_for(component).instantiate_pre(component).map_err(incompatible)?;
        let indices = PluginIndices::new(&instance_pre).map_err(incompatible)?;
        let admission = AdmissionIndices::new(&instance_pre).map_err(incompatible)?;
        Ok(Code {
            pre: PluginPre::new(instance_pre).map_err(incompatible)?,
            indices,
            admission,
            tier,
            shared,
        })
    }

    /// The shared component this code comes from.
    pub fn shared(&self) -> Option<&SharedComponent> {
        self.shared.as_ref()
    }
}

/// One plugin's code, resident or dropped.
pub(crate) struct PluginCode {
    current: ArcSwapOption<Code>,
    /// Held while reloading: concurrent first calls wait for one reload.
    reloading: Mutex<()>,
    /// The `.wasm` the plugin was loaded from; `None`: the code is never dropped.
    file: Option<PathBuf>,
    /// Set once the file is gone: the code is never dropped again.
    pinned: std::sync::atomic::AtomicBool,
    /// What the component exports for admission (the same whichever code serves it).
    admission: AdmissionExports,
}

impl PluginCode {
    pub fn new(code: Code, file: Option<PathBuf>) -> Self {
        let admission = code.admission.exports();
        PluginCode {
            current: ArcSwapOption::from_pointee(code),
            reloading: Mutex::new(()),
            file,
            pinned: std::sync::atomic::AtomicBool::new(false),
            admission,
        }
    }

    /// The admission exports of the component (known while its code is dropped too).
    pub fn admission(&self) -> AdmissionExports {
        self.admission
    }

    /// The resident code, if any.
    pub fn current(&self) -> Option<Arc<Code>> {
        self.current.load_full()
    }

    /// Replaces the resident code (a tier-up).
    pub fn replace(&self, code: Code) {
        self.current.store(Some(Arc::new(code)));
    }

    /// Whether the code is of a kind that may be dropped (see the module's invariants; the
    /// caller checks that the compile cache holds its artifact).
    pub fn droppable(&self) -> bool {
        self.file.is_some()
            && !self.pinned.load(std::sync::atomic::Ordering::Acquire)
            && self.current.load().as_ref().is_some_and(|c| c.tier == Tier::Optimized && c.shared.is_some())
    }

    /// Keeps the code from now on (see [`droppable`](Self::droppable)).
    pub fn pin(&self) {
        self.pinned.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Takes the code out; the caller drops it (outside any lock: unmapping code is not
    /// free) once no instance or call can use it.
    pub fn take(&self) -> Option<Arc<Code>> {
        self.current.swap(None)
    }

    /// The resident code, or else the code loaded again (once, whoever else asks at the same
    /// time); with whether this call loaded it. Blocking.
    pub fn get_or_reload(
        &self,
        engine: &PluginEngine,
        plugin: &str,
        version: &str,
    ) -> Result<(Arc<Code>, bool), PluginError> {
        if let Some(code) = self.current() {
            return Ok((code, false));
        }
        let _reloading = self.reloading.lock();
        if let Some(code) = self.current() {
            return Ok((code, false));
        }
        let file = self.file.as_deref();
        let shared = engine.reload_component(version, || read_verified(plugin, file, version))?;
        let (component, tier) = shared.value().current();
        let code = Arc::new(Code::prepare(engine, plugin, &component, tier, Some(shared))?);
        self.current.store(Some(code.clone()));
        Ok((code, true))
    }
}

/// The `.wasm` at `file`, if its content hash is still `version`.
fn read_verified(plugin: &str, file: Option<&Path>, version: &str) -> Result<Vec<u8>, PluginError> {
    let reload_failed = |reason: String| PluginError::Init {
        plugin: plugin.to_owned(),
        reason: format!("reloading the code dropped while idle: {reason}"),
    };
    let Some(file) = file else {
        return Err(reload_failed("the compile cache no longer has it and no file was given".into()));
    };
    let wasm = std::fs::read(file).map_err(|e| {
        reload_failed(format!(
            "the compile cache no longer has it and {} cannot be read: {e}",
            file.display()
        ))
    })?;
    if hex::encode(Sha256::digest(&wasm)) != version {
        return Err(reload_failed(format!(
            "the compile cache no longer has it and {} changed since the load (the new version replaces this one once loaded)",
            file.display()
        )));
    }
    Ok(wasm)
}
