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

use std::path::PathBuf;

use wasmtime::component::Component;
use wasmtime::{Engine, Strategy};

use super::super::PluginError;
use super::child::{ChildFailure, CompileSettings, compatible, compile_in_child};
use super::compile_cache::EngineFingerprint;
use super::settings::{CompileLimits, EngineConfig, wasm_config};

/// The baseline compiler's engine, and where its compiles run.
pub(crate) struct Baseline {
    engine: Engine,
    /// Where Winch compiles run when a compile program is configured (and its Winch
    /// engine's artifacts load into `engine`): the program, its settings and limits.
    child: Option<(PathBuf, CompileSettings, CompileLimits)>,
}

impl Baseline {
    /// The Winch engine (the optimising engine's settings, Winch's code generator); an
    /// error when wasmtime refuses it here.
    pub(crate) fn new(config: &EngineConfig) -> wasmtime::Result<Baseline> {
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
        Ok(Baseline { engine, child })
    }

    /// The Winch engine.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `wasm` compiled with Winch: in the compile program when there is one (bounded like
    /// every compile there), else here. An error is Winch's refusal (Cranelift may compile
    /// it); a compile that broke the child's limits fails the load.
    pub(crate) fn compile(&self, wasm: &[u8]) -> Result<Component, BaselineError> {
        let Some((program, settings, limits)) = &self.child else {
            return Component::new(&self.engine, wasm).map_err(|e| BaselineError::Refused(format!("{e:#}")));
        };
        let fingerprint = EngineFingerprint::of(&self.engine);
        match compile_in_child(program, settings, &fingerprint, limits, wasm) {
            // SAFETY: the artifact authenticated as the answer of a Winch engine of this
            // engine's fingerprint to these bytes (see `child`).
            Ok(artifact) => unsafe { Component::deserialize(&self.engine, &artifact) }.map_err(|e| {
                BaselineError::Failed(PluginError::Compile(format!("loading the Winch code: {e:#}")))
            }),
            Err(ChildFailure::DoesNotCompile(why)) => Err(BaselineError::Refused(why)),
            Err(ChildFailure::Refused(why)) => Err(BaselineError::Failed(PluginError::Compile(why))),
            Err(ChildFailure::Unavailable(why)) => {
                tracing::warn!(error = %why, "the compile process is unavailable; compiling with Winch in the host");
                Component::new(&self.engine, wasm).map_err(|e| BaselineError::Refused(format!("{e:#}")))
            }
        }
    }
}

/// Why Winch gave no code.
pub(crate) enum BaselineError {
    /// Winch refused the component: Cranelift may compile it.
    Refused(String),
    /// The load fails.
    Failed(PluginError),
}
