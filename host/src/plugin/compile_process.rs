//! Compiling a component in a child process: the host hands the `.wasm` to a program (the
//! `wasmctrl` binary's hidden `compile-component` command) on its stdin and reads the
//! compiled artifact from its stdout.
//!
//! Why: a compile in the host leaves memory behind. The optimising compiler's code in the
//! host binary (~6 MB) stays resident once it has run, and the compile's heap fragments
//! the host's. With 100 distinct plugins compiled at start-up that was 150.4 MB of RSS
//! against 143.2 MB from a warm compile cache (`cargo bench --bench many_plugins`); with
//! each compile in a child, 146.5 MB, and the load's peak 150.3 MB instead of 190.7 MB. A
//! child takes what it used with it when it exits, and a compiler crash cannot take the
//! host down.
//!
//! Invariants:
//! - The child builds its engine from [`CompileSettings`], the compile-relevant part of
//!   the host's [`EngineConfig`], with the same function the host uses for its own
//!   engines. It writes its engine's compatibility hash before the artifact; the host
//!   takes the artifact only if that hash is its own. A child of another wasmctrl version
//!   (the binary replaced on disk) is refused that way, not loaded.
//! - Every failure of the child (not started, killed, exit status, short or foreign
//!   output) is an error; the caller then compiles in its own process. A child failure
//!   never fails a load by itself.
//! - The child is given only the component's bytes and the settings: no network, no
//!   environment beyond the host's own, nothing to write but its stdout.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};
use wasmtime::{Engine, InstanceAllocationStrategy};

use super::PluginError;
use super::engine::{EngineConfig, EngineTuning, wasm_config};

/// The hidden command of the `wasmctrl` binary that serves a compile.
pub const COMMAND: &str = "compile-component";

/// What of an [`EngineConfig`] decides the compiled code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileSettings {
    epoch_interruption: bool,
    max_wasm_stack: usize,
    memory_reservation: Option<u64>,
    memory_guard_size: Option<u64>,
}

impl CompileSettings {
    pub(crate) fn of(config: &EngineConfig) -> Self {
        CompileSettings {
            epoch_interruption: config.tuning.epoch_interruption,
            max_wasm_stack: config.max_wasm_stack,
            memory_reservation: config.tuning.memory_reservation,
            memory_guard_size: config.tuning.memory_guard_size,
        }
    }

    /// The engine a compile runs in: the host's configuration for these settings, without
    /// an instance pool (nothing runs in it).
    pub(crate) fn compile_engine(&self) -> Result<Engine, PluginError> {
        let config = EngineConfig {
            max_wasm_stack: self.max_wasm_stack,
            tuning: EngineTuning {
                memory_reservation: self.memory_reservation,
                memory_guard_size: self.memory_guard_size,
                epoch_interruption: self.epoch_interruption,
            },
            pooling: None,
            ..EngineConfig::default()
        };
        let mut wasm = wasm_config(&config);
        wasm.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        Engine::new(&wasm).map_err(|e| PluginError::Engine(format!("{e:#}")))
    }
}

/// `engine`'s compatibility hash, as the child writes it ahead of the artifact.
pub(crate) fn compatibility(engine: &Engine) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    h.finish()
}

/// Compiles `wasm` by running `program compile-component SETTINGS`; the artifact, if the
/// child compiled it for an engine compatible with `expected` (a compatibility hash).
pub(crate) fn compile_in_child(
    program: &Path,
    settings: &CompileSettings,
    expected: u64,
    wasm: &[u8],
) -> Result<Vec<u8>, String> {
    let settings = serde_json::to_string(settings).map_err(|e| format!("encoding the settings: {e}"))?;
    let mut child = Command::new(program)
        .arg(COMMAND)
        .arg(settings)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", program.display()))?;
    // The child reads all of its input before it writes anything, so writing it all first
    // cannot deadlock on a full pipe.
    let written = match child.stdin.take() {
        Some(mut stdin) => stdin.write_all(wasm).map_err(|e| format!("writing the component: {e}")),
        None => Err("no stdin".to_owned()),
    };
    let output = child.wait_with_output().map_err(|e| format!("waiting for {}: {e}", program.display()))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!("{} exited with {}: {}", program.display(), output.status, stderr.trim()));
    }
    written?;
    let Some((hash, artifact)) = output.stdout.split_first_chunk::<8>() else {
        return Err("no artifact in the output".to_owned());
    };
    let hash = u64::from_le_bytes(*hash);
    if hash != expected {
        return Err(format!(
            "{} compiles for another engine (compatibility {hash:016x}, this host {expected:016x})",
            program.display()
        ));
    }
    Ok(artifact.to_vec())
}

/// The child's side: reads a component from `input`, compiles it with `settings` (the
/// JSON the host passed), writes the engine's compatibility hash (8 bytes, little-endian)
/// and the artifact to `output`.
pub fn serve_compile(
    settings: &str,
    mut input: impl Read,
    mut output: impl Write,
) -> Result<(), PluginError> {
    let settings: CompileSettings = serde_json::from_str(settings)
        .map_err(|e| PluginError::Engine(format!("compile settings {settings:?}: {e}")))?;
    let engine = settings.compile_engine()?;
    let mut wasm = Vec::new();
    input.read_to_end(&mut wasm).map_err(|e| PluginError::Compile(format!("reading the component: {e}")))?;
    let artifact = engine.precompile_component(&wasm).map_err(|e| PluginError::Compile(format!("{e:#}")))?;
    output
        .write_all(&compatibility(&engine).to_le_bytes())
        .and_then(|()| output.write_all(&artifact))
        .and_then(|()| output.flush())
        .map_err(|e| PluginError::Compile(format!("writing the artifact: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_childs_artifact_loads_into_a_host_engine_of_the_same_settings() {
        let config = EngineConfig { pooling: None, ..EngineConfig::default() };
        let settings = CompileSettings::of(&config);
        let json = serde_json::to_string(&settings).unwrap();
        let mut out = Vec::new();
        serve_compile(&json, wasmctrl_testkit::guests::wasm("test-plugin-panic").as_slice(), &mut out)
            .unwrap();

        let host = Engine::new(&wasm_config(&config)).unwrap();
        let (hash, artifact) = out.split_first_chunk::<8>().unwrap();
        assert_eq!(u64::from_le_bytes(*hash), compatibility(&host));
        // SAFETY: an artifact `precompile_component` just produced.
        unsafe { wasmtime::component::Component::deserialize(&host, artifact) }.unwrap();

        // Other settings are another engine: the host would refuse the artifact.
        let other = CompileSettings { epoch_interruption: false, ..settings };
        assert_ne!(compatibility(&other.compile_engine().unwrap()), compatibility(&host));
    }

    #[test]
    fn a_program_that_cannot_run_or_fails_is_an_error() {
        let settings = CompileSettings::of(&EngineConfig::default());
        let missing = compile_in_child(Path::new("/nonexistent/wasmctrl"), &settings, 0, b"");
        assert!(missing.unwrap_err().contains("starting /nonexistent/wasmctrl"));
        let failing = compile_in_child(Path::new("false"), &settings, 0, b"\0asm");
        assert!(failing.unwrap_err().contains("exited with"), "a non-zero exit");
        let silent = compile_in_child(Path::new("true"), &settings, 0, b"");
        assert_eq!(silent.unwrap_err(), "no artifact in the output");
    }
}
