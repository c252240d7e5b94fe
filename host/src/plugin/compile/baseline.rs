//! The baseline compiler of tier-up: Winch, with the optimising engine's settings, compiling
//! in the compile child when there is one.
//!
//! Invariants:
//! - The Winch engine is configured by the same [`wasm_config`] as the optimising engine,
//!   only its code generator differs; a component it compiled runs only in its stores.
//! - With a compile program, Winch compiles run there too, under the same limits and
//!   authentication as Cranelift's (a component that breaks them fails its load); only a
//!   child whose Winch engine's artifacts would not load here leaves Winch in the host.
//! - Winch refusing a component ([`BaselineError::Refused`]) never fails a load: the caller
//!   compiles it with Cranelift.
//! - With a compile cache, Winch's artifacts go through it as Cranelift's do (stored under
//!   the Winch engine's fingerprint, checked, then mapped from the file): only the pages of
//!   Winch code that run are resident, not the whole artifact in anonymous memory (Winch's
//!   code is several times the size of Cranelift's, and a cold start loads every plugin with
//!   it at once). A Winch artifact already in the cache (a restart before a tier-up was
//!   done) is used as it is. Once Cranelift's artifact of the same bytes exists, nothing
//!   reads the Winch one again: the cache's eviction takes it, oldest first.

use std::path::PathBuf;

use wasmtime::component::Component;
use wasmtime::{Engine, Strategy};

use super::super::PluginError;
use super::child::{ChildFailure, CompileSettings, compatible, compile_in_child};
use super::compile_cache::{CompileCache, EngineFingerprint};
use super::optimizer::map_cached;
use super::settings::{CompileLimits, EngineConfig, wasm_config};

/// The baseline compiler's engine, and where its compiles run.
pub(crate) struct Baseline {
    engine: Engine,
    /// Where Winch compiles run when a compile program is configured (and its Winch
    /// engine's artifacts load into `engine`): the program, its settings and limits.
    child: Option<(PathBuf, CompileSettings, CompileLimits)>,
    /// The compile cache the artifacts go through, when there is one.
    disk: Option<CompileCache>,
    /// The Winch engine's fingerprint (artifact names and MACs).
    fingerprint: EngineFingerprint,
}

impl Baseline {
    /// The Winch engine (the optimising engine's settings, Winch's code generator); an
    /// error when wasmtime refuses it here.
    pub(crate) fn new(config: &EngineConfig, disk: Option<CompileCache>) -> wasmtime::Result<Baseline> {
        let mut wasm = wasm_config(config);
        wasm.strategy(Strategy::Winch);
        let engine = Engine::new(&wasm)?;
        let settings = CompileSettings::of(config).winch();
        let child = match (&config.compile_process, settings.compile_engine()) {
            (Some(program), Ok(probe)) if compatible(&probe, &engine) => {
                Some((program.clone(), settings, config.compile_limits.clone()))
            }
            (Some(_), _) => {
                tracing::warn!(
                    "a Winch compile engine's artifacts would not load here; Winch compiles in the host"
                );
                None
            }
            (None, _) => None,
        };
        let fingerprint = EngineFingerprint::of(&engine);
        Ok(Baseline { engine, child, disk, fingerprint })
    }

    /// The Winch engine.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `wasm` (hex SHA-256 `hash`) compiled with Winch: from the compile cache when it holds
    /// the artifact, else compiled in the compile program when there is one (bounded like
    /// every compile there), else here. An error is Winch's refusal (Cranelift may compile
    /// it); a compile that broke the child's limits fails the load.
    pub(crate) fn compile(&self, wasm: &[u8], hash: &str) -> Result<Component, BaselineError> {
        if let Some(component) = self.cached(hash) {
            return Ok(component);
        }
        let artifact = self.precompile(wasm)?;
        if let Some(disk) = &self.disk {
            match disk.store(hash, &self.fingerprint, &artifact) {
                // Mapped from the file. One that does not read back (removed under us,
                // failed a check) is loaded from memory.
                Ok(()) => {
                    if let Some(component) = self.cached(hash) {
                        return Ok(component);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "compile cache not writable; using the Winch artifact from memory")
                }
            }
        }
        self.load_artifact(&artifact)
    }

    /// Winch's artifact of `wasm`: from the compile program, or else compiled here.
    fn precompile(&self, wasm: &[u8]) -> Result<Vec<u8>, BaselineError> {
        let here =
            || self.engine.precompile_component(wasm).map_err(|e| BaselineError::Refused(format!("{e:#}")));
        let Some((program, settings, limits)) = &self.child else {
            return here();
        };
        match compile_in_child(program, settings, &self.fingerprint, limits, wasm) {
            Ok(artifact) => Ok(artifact),
            Err(ChildFailure::DoesNotCompile(why)) => Err(BaselineError::Refused(why)),
            Err(ChildFailure::Refused(why)) => Err(BaselineError::Failed(PluginError::Compile(why))),
            Err(ChildFailure::Unavailable(why)) => {
                tracing::warn!(error = %why, "the compile process is unavailable; compiling with Winch in the host");
                here()
            }
        }
    }

    /// The cached Winch artifact of `hash`, if one exists, passes the cache's checks and
    /// loads (one that does not is removed).
    fn cached(&self, hash: &str) -> Option<Component> {
        map_cached(self.disk.as_ref()?, &self.engine, hash, &self.fingerprint)
    }

    /// Loads a Winch artifact made just now (in the child, authenticated; or here).
    fn load_artifact(&self, artifact: &[u8]) -> Result<Component, BaselineError> {
        // SAFETY: the artifact is the answer of a Winch engine of this engine's fingerprint
        // to these bytes: compiled here, or authenticated as such from the child (see `child`).
        unsafe { Component::deserialize(&self.engine, artifact) }.map_err(|e| {
            BaselineError::Failed(PluginError::Compile(format!("loading the Winch code: {e:#}")))
        })
    }
}

/// Why Winch gave no code.
pub(crate) enum BaselineError {
    /// Winch refused the component: Cranelift may compile it.
    Refused(String),
    /// The load fails.
    Failed(PluginError),
}
