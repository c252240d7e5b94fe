//! Compiling components with Cranelift (the optimising compiler) through the on-disk
//! compile cache; used by loads that wait for it and by background tier-ups alike.
//!
//! Invariants:
//! - Every compile runs holding a [`Gate`] permit, which the caller takes (a load with
//!   [`Gate::enter`], a tier-up with [`Gate::enter_background`]); the permit is let go as
//!   soon as the compile is done, before the artifact is written.
//! - An artifact is read only from the cache file of the same content hash and the same
//!   engine compatibility hash; one that fails to load (other wasmtime, corrupted) is
//!   reported as absent, so it is recompiled and replaced.
//! - A cache directory that cannot be written never fails a compile: the artifact is then
//!   used from memory.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use wasmtime::Engine;
use wasmtime::component::Component;

use super::PluginError;
use super::compile_cache::CompileCache;
use super::gate::{Gate, Permit};

/// The optimising compiler of one engine, with its compile cache and gate; cheap to clone.
#[derive(Clone)]
pub(crate) struct Optimizer {
    engine: Engine,
    disk: Option<CompileCache>,
    gate: Arc<Gate>,
}

impl Optimizer {
    pub fn new(engine: Engine, disk: Option<CompileCache>, gate: Arc<Gate>) -> Self {
        Optimizer { engine, disk, gate }
    }

    /// Bounds the compiles running at once.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Whether the cache has an artifact of the wasm with hex SHA-256 `hash` (not whether
    /// it loads).
    pub fn has_artifact(&self, hash: &str) -> bool {
        self.disk.as_ref().is_some_and(|disk| disk.path_of(hash, &self.engine_hash()).is_file())
    }

    /// The cached artifact of the wasm with hex SHA-256 `hash`, if one exists and loads
    /// (its use refreshes its place in the cache).
    pub fn cached(&self, hash: &str) -> Option<Component> {
        let disk = self.disk.as_ref()?;
        let path = disk.path_of(hash, &self.engine_hash());
        if !path.is_file() {
            return None;
        }
        disk.settle(&path);
        // SAFETY: the cache directory holds only artifacts this host wrote with
        // `precompile_component` for an engine with the same compatibility hash (part of
        // the file name); it is trusted like the host binary.
        match unsafe { Component::deserialize_file(&self.engine, &path) } {
            Ok(component) => {
                disk.touch(&path);
                Some(component)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %format!("{e:#}"), "cached component unusable; recompiling");
                None
            }
        }
    }

    /// Compiles `wasm` (hex SHA-256 `hash`) while holding `permit`, then stores the
    /// artifact in the compile cache, when there is one.
    pub fn compile(&self, wasm: &[u8], hash: &str, permit: Permit<'_>) -> Result<Component, PluginError> {
        let Some(disk) = &self.disk else {
            let component =
                Component::new(&self.engine, wasm).map_err(|e| PluginError::Compile(format!("{e:#}")));
            drop(permit);
            return component;
        };
        let artifact =
            self.engine.precompile_component(wasm).map_err(|e| PluginError::Compile(format!("{e:#}")));
        drop(permit);
        let artifact = artifact?;
        let path = disk.path_of(hash, &self.engine_hash());
        match disk.store(&path, &artifact) {
            // SAFETY: as in `cached`; the file was written by this process just now. Loading
            // from the file (not the bytes) lets wasmtime map it copy-on-write.
            Ok(()) => unsafe { Component::deserialize_file(&self.engine, &path) },
            Err(e) => {
                // A read-only or full cache directory must not stop plugins from loading.
                tracing::warn!(error = %e, "compile cache not writable; using the artifact from memory");
                // SAFETY: `artifact` was produced by this engine's `precompile_component` just now.
                unsafe { Component::deserialize(&self.engine, &artifact) }
            }
        }
        .map_err(|e| PluginError::Compile(format!("loading the compiled component: {e:#}")))
    }

    /// Compiles `wasm` without touching the cache (waits for a permit like a load).
    pub fn compile_uncached(&self, wasm: &[u8]) -> Result<Component, PluginError> {
        let _permit = self.gate.enter();
        Component::new(&self.engine, wasm).map_err(|e| PluginError::Compile(format!("{e:#}")))
    }

    /// A short hex digest of what makes compiled artifacts compatible with this engine.
    fn engine_hash(&self) -> String {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        format!("{:016x}", h.finish())
    }
}
