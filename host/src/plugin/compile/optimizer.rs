//! Compiling components with Cranelift (the optimising compiler) through the on-disk
//! compile cache; used by loads that wait for it and by background tier-ups alike.
//!
//! Invariants:
//! - Every compile runs holding a [`CompilePermits`] permit, which the caller takes (a load
//!   with [`CompilePermits::enter`], a tier-up with [`CompilePermits::enter_background`]);
//!   the permit is let go as soon as the compile is done, before the artifact is written.
//! - An artifact is read only from the cache file of the same content hash and engine
//!   fingerprint, and only once the compile cache checked its file and its MAC (see
//!   [`super::compile_cache`]); one that fails a check or does not load is removed and
//!   reported as absent, so it is recompiled and replaced.
//! - A cache directory that cannot be written never fails a compile: the artifact is then
//!   used from memory.
//! - With a compile program configured
//!   ([`EngineConfig::compile_process`](super::settings::EngineConfig::compile_process)),
//!   compiles run in a child process ([`super::child`]), under its time, memory and output
//!   limits. When the child cannot be used (not started, another build) the compile runs
//!   here instead, with a warning; when the component failed the compile there (does not
//!   compile, over a limit, crashed the child) the load fails and it is never compiled here.
//! - Compiles here run in an engine of their own ([`Compilers`]), which exists only while
//!   some compile runs; what they produce is loaded into the runtime engine. Cranelift keeps its
//!   per-thread compile contexts (the buffers of the largest function it compiled) for as
//!   long as their engine lives (megabytes after compiling one example plugin), freed when
//!   that engine is dropped. In the runtime engine they would stay for good.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use wasmtime::Engine;
use wasmtime::component::Component;

use super::child::{ChildFailure, CompileSettings, compatible, compile_in_child};
use super::compile_cache::{CompileCache, EngineFingerprint, Rejection};
use super::permits::{CompilePermits, Permit};
use super::settings::CompileLimits;
use crate::plugin::PluginError;

/// The optimising compiler of one engine, with its compile cache and compile permits;
/// cheap to clone.
#[derive(Clone)]
pub(crate) struct Optimizer {
    /// The runtime engine: every component is loaded into it.
    engine: Engine,
    compilers: Arc<Compilers>,
    /// The program compiles run in, when not in this process.
    compile_process: Option<PathBuf>,
    /// What a compile in that program may take.
    compile_limits: CompileLimits,
    /// Compiles a child process did.
    compiled_in_child: Arc<AtomicU64>,
    disk: Option<CompileCache>,
    /// The runtime engine's fingerprint (artifact names and MACs).
    fingerprint: EngineFingerprint,
    permits: Arc<CompilePermits>,
}

impl Optimizer {
    /// `settings` make the engines compiles run in (here or in `compile_process`): the
    /// runtime engine's code generation settings, without an instance pool.
    pub fn new(
        engine: Engine,
        settings: CompileSettings,
        compile_process: Option<PathBuf>,
        compile_limits: CompileLimits,
        disk: Option<CompileCache>,
        permits: Arc<CompilePermits>,
    ) -> Self {
        let compilers = Arc::new(Compilers::new(settings, &engine));
        let fingerprint = EngineFingerprint::of(&engine);
        Optimizer {
            engine,
            compilers,
            compile_process,
            compile_limits,
            compiled_in_child: Arc::default(),
            disk,
            fingerprint,
            permits,
        }
    }

    /// How many compiles a child process did.
    pub fn compiled_in_child(&self) -> u64 {
        self.compiled_in_child.load(Ordering::Relaxed)
    }

    /// Bounds the compiles running at once.
    pub fn permits(&self) -> &CompilePermits {
        &self.permits
    }

    /// Whether the cache has an artifact of the wasm with hex SHA-256 `hash` (not whether
    /// it passes its checks).
    pub fn has_artifact(&self, hash: &str) -> bool {
        self.disk.as_ref().is_some_and(|disk| disk.has_artifact(hash, &self.fingerprint))
    }

    /// The cached artifact of the wasm with hex SHA-256 `hash`, if one exists, passes the
    /// cache's checks (its MAC above all) and loads (its use refreshes its place in the
    /// cache). One that fails is removed (see [`CompileCache::open_verified`]).
    pub fn cached(&self, hash: &str) -> Option<Component> {
        map_cached(self.disk.as_ref()?, &self.engine, hash, &self.fingerprint)
    }

    /// Compiles `wasm` (hex SHA-256 `hash`) while holding `permit`, then stores the
    /// artifact in the compile cache, when there is one, and loads it from there.
    pub fn compile(&self, wasm: &[u8], hash: &str, permit: Permit<'_>) -> Result<Component, PluginError> {
        let artifact = self.precompile(wasm);
        drop(permit);
        let artifact = artifact?;
        let Some(disk) = &self.disk else {
            return self.load_artifact(&artifact);
        };
        if let Err(e) = disk.store(hash, &self.fingerprint, &artifact) {
            // A read-only or full cache directory must not stop plugins from loading.
            tracing::warn!(error = %e, "compile cache not writable; using the artifact from memory");
            return self.load_artifact(&artifact);
        }
        // Loaded from the file (not the bytes), so wasmtime maps it copy-on-write and only
        // the pages that run are resident; through the same checks as any cache hit.
        match self.cached(hash) {
            Some(component) => Ok(component),
            None => self.load_artifact(&artifact),
        }
    }

    /// Compiles `wasm` without touching the cache (waits for a permit like a load).
    pub fn compile_uncached(&self, wasm: &[u8]) -> Result<Component, PluginError> {
        let artifact = {
            let _permit = self.permits.enter();
            self.precompile(wasm)?
        };
        self.load_artifact(&artifact)
    }

    /// Cranelift's artifact of `wasm`: from the compile program, or else compiled here in a
    /// compile engine.
    fn precompile(&self, wasm: &[u8]) -> Result<Vec<u8>, PluginError> {
        if let (Some(program), Some(settings)) = (&self.compile_process, &self.compilers.settings) {
            match compile_in_child(program, settings, &self.fingerprint, &self.compile_limits, wasm) {
                Ok(artifact) => {
                    self.compiled_in_child.fetch_add(1, Ordering::Relaxed);
                    return Ok(artifact);
                }
                // What the component did to the child it would do to the host: not
                // compiled here.
                Err(ChildFailure::Refused(reason) | ChildFailure::DoesNotCompile(reason)) => {
                    return Err(PluginError::Compile(reason));
                }
                Err(ChildFailure::Unavailable(e)) => {
                    tracing::warn!(error = %e, "the compile process is unavailable; compiling in the host")
                }
            }
        }
        // What the compile allocates on this thread stays apart from long-lived objects
        // (`heap::InCompileArena`); the compile threads are bound to the same arena.
        let _arena = crate::heap::InCompileArena::enter();
        let compiler = self.compilers.enter(&self.engine)?;
        compiler.engine().precompile_component(wasm).map_err(|e| PluginError::Compile(format!("{e:#}")))
    }

    /// Loads an artifact [`Optimizer::precompile`] made just now into the runtime engine.
    fn load_artifact(&self, artifact: &[u8]) -> Result<Component, PluginError> {
        // SAFETY: `artifact` was produced by `precompile_component` of an engine whose
        // artifacts this engine loads (`Compilers` checks the compatibility hashes agree).
        unsafe { Component::deserialize(&self.engine, artifact) }
            .map_err(|e| PluginError::Compile(format!("loading the compiled component: {e:#}")))
    }

    /// Whether a compile engine exists now (only while a compile runs).
    #[cfg(test)]
    pub fn compile_engine_exists(&self) -> bool {
        self.compilers.state.lock().engine.is_some()
    }
}

/// The artifact of the wasm with hex SHA-256 `hash` for the engine of `fingerprint`, mapped
/// from the compile cache into `engine`, if one exists, passes the cache's checks (its MAC
/// above all) and loads (its use refreshes its place in the cache). One that fails is
/// removed (see [`CompileCache::open_verified`]).
pub(crate) fn map_cached(
    disk: &CompileCache,
    engine: &Engine,
    hash: &str,
    fingerprint: &EngineFingerprint,
) -> Option<Component> {
    let artifact = disk.open_verified(hash, fingerprint)?;
    // SAFETY: the bytes at this inode carry this host's MAC for `hash` and this engine's
    // fingerprint, checked just now: only this host wrote them, from `precompile_component`
    // of a compatible engine; only this host's uid can change the inode (checked on the
    // descriptor). wasmtime maps the checked inode itself (the descriptor's `/proc/self/fd`
    // link), not whatever the name points to now.
    match unsafe { Component::deserialize_file(engine, artifact.fd_path()) } {
        Ok(component) => {
            disk.touch(&artifact);
            Some(component)
        }
        Err(e) => {
            disk.reject_artifact(artifact, &Rejection::Unloadable(format!("{e:#}")));
            None
        }
    }
}

/// The engine compiles run in: made when a compile starts and none runs, shared by the
/// compiles that overlap it, dropped when the last of them ends (creating one takes
/// microseconds; a compile, hundreds of milliseconds).
struct Compilers {
    /// What makes their engines; `None` if such an engine's artifacts would not load into
    /// the runtime engine (never seen: the two configurations differ only in the instance
    /// allocator), so that compiles use the runtime engine itself.
    settings: Option<CompileSettings>,
    state: Mutex<CompilersState>,
}

#[derive(Default)]
struct CompilersState {
    engine: Option<Engine>,
    running: usize,
}

impl Compilers {
    fn new(settings: CompileSettings, runtime: &Engine) -> Self {
        let compatible = match settings.compile_engine() {
            Ok(probe) if compatible(&probe, runtime) => true,
            Ok(_) => {
                tracing::warn!(
                    "a compile engine's artifacts would not load into the runtime engine; compiling in the runtime engine"
                );
                false
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "no compile engine; compiling in the runtime engine");
                false
            }
        };
        Compilers { settings: compatible.then_some(settings), state: Mutex::new(CompilersState::default()) }
    }

    /// The engine to compile in, until the returned guard is dropped.
    fn enter(&self, runtime: &Engine) -> Result<Compiling<'_>, PluginError> {
        let Some(settings) = &self.settings else {
            return Ok(Compiling { engine: runtime.clone(), owner: None });
        };
        let mut state = self.state.lock();
        let engine = match &state.engine {
            Some(engine) => engine.clone(),
            None => {
                let engine = settings.compile_engine()?;
                state.engine = Some(engine.clone());
                engine
            }
        };
        state.running += 1;
        Ok(Compiling { engine, owner: Some(self) })
    }
}

/// One compile's hold on the compile engine.
struct Compiling<'a> {
    engine: Engine,
    owner: Option<&'a Compilers>,
}

impl Compiling<'_> {
    fn engine(&self) -> &Engine {
        &self.engine
    }
}

impl Drop for Compiling<'_> {
    fn drop(&mut self) {
        let Some(owner) = self.owner else { return };
        let last = {
            let mut state = owner.state.lock();
            state.running = state.running.saturating_sub(1);
            if state.running == 0 { state.engine.take() } else { None }
        };
        // Dropped outside the lock (it frees the compile contexts).
        if let Some(engine) = last {
            drop(engine);
            // The compile threads (of the pool this runs in: rayon's global pool for a
            // load, the tier-up pool for a tier-up) keep freed objects in their caches;
            // flushed, the purge after the load can hand their pages back.
            rayon::broadcast(|_| crate::heap::flush_thread_cache());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiles_run_in_an_engine_of_their_own_gone_when_the_last_ends() {
        let config = crate::plugin::compile::settings::EngineConfig { pooling: None, ..Default::default() };
        let runtime = Engine::new(&crate::plugin::compile::settings::wasm_config(&config)).unwrap();
        let settings = CompileSettings::of(&config);
        let optimizer = Optimizer::new(
            runtime.clone(),
            settings,
            None,
            CompileLimits::default(),
            None,
            Arc::new(CompilePermits::new(2)),
        );
        let wasm = wasmctrl_testkit::guests::wasm("test-plugin-panic");
        assert!(!optimizer.compile_engine_exists());

        let component = optimizer.compile(&wasm, "a", optimizer.permits().enter()).unwrap();
        assert!(Engine::same(component.engine(), &runtime), "loaded into the runtime engine");
        assert!(!optimizer.compile_engine_exists(), "dropped once its compile ended");

        // A compile that overlaps another uses the same engine, which stays until both end.
        let other = optimizer.compilers.enter(&runtime).unwrap();
        assert!(!Engine::same(other.engine(), &runtime));
        optimizer.compile_uncached(&wasm).unwrap();
        assert!(optimizer.compile_engine_exists(), "still in use");
        assert!(Engine::same(optimizer.compilers.state.lock().engine.as_ref().unwrap(), other.engine()));
        drop(other);
        assert!(!optimizer.compile_engine_exists());
    }
}
