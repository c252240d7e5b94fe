//! Compiles in a child process (`EngineConfig::compile_process`, the `wasmctrl` binary's
//! hidden `compile-component` command): a plugin compiled there loads and serves, its
//! artifact lands in the compile cache like one compiled in the host, and a compile
//! program that cannot run leaves the host compiling by itself.
//!
//! Needs the guests built: `cargo xtask build-guests`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use wasmctrl::cache::Writer;
use wasmctrl::controller::{Action, Request};
use wasmctrl::plugin::{CacheReader, EngineConfig, Gvk, Plugin, PluginEngine, PluginEnv, PluginSpec};
use wasmctrl_testkit::guests::wasm;

fn engine(cache: &Path, compile_process: Option<PathBuf>) -> PluginEngine {
    let config = EngineConfig {
        cache_dir: Some(cache.to_owned()),
        pooling: None,
        compile_process,
        ..EngineConfig::default()
    };
    PluginEngine::new(config, None).unwrap_or_else(|e| panic!("engine: {e}"))
}

/// A small test plugin (its reconcile returns `Done` for any name but `misbehave`).
fn load(engine: &PluginEngine) -> Plugin {
    let configmap = Gvk::new("v1", "ConfigMap");
    let mut caches: HashMap<Gvk, Arc<dyn CacheReader>> = HashMap::new();
    caches.insert(configmap.clone(), Arc::new(Writer::new().reader()));
    let env = PluginEnv { caches, kube: None };
    Plugin::load(engine, PluginSpec::new("compiled", configmap), &wasm("test-plugin-panic"), env)
        .unwrap_or_else(|e| panic!("loading: {e}"))
}

fn request() -> Request {
    Request { namespace: Some("default".into()), name: "fine".into() }
}

#[test]
fn a_plugin_compiled_in_a_child_process_serves_and_is_cached() {
    let cache = tempfile::tempdir().unwrap();
    let compiler = PathBuf::from(env!("CARGO_BIN_EXE_wasmctrl"));

    let host = engine(cache.path(), Some(compiler.clone()));
    let plugin = load(&host);
    assert_eq!(plugin.reconcile_blocking(&request()), Ok(Action::Done));
    let loads = host.component_loads();
    assert_eq!((loads.compiled, loads.compiled_in_child), (1, 1), "{loads:?}");

    // Another host (no compile program) finds the child's artifact in the cache.
    let other = engine(cache.path(), None);
    let again = load(&other);
    assert_eq!(again.reconcile_blocking(&request()), Ok(Action::Done));
    let loads = other.component_loads();
    assert_eq!((loads.compiled, loads.from_cache), (0, 1), "{loads:?}");
}

#[test]
fn a_compile_program_that_cannot_run_leaves_the_compile_to_the_host() {
    let cache = tempfile::tempdir().unwrap();
    let host = engine(cache.path(), Some(PathBuf::from("/nonexistent/wasmctrl")));
    let plugin = load(&host);
    assert_eq!(plugin.reconcile_blocking(&request()), Ok(Action::Done));
    let loads = host.component_loads();
    assert_eq!((loads.compiled, loads.compiled_in_child), (1, 0), "{loads:?}");
}
