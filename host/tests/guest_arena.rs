//! The guest SDK's per-call arena allocator (`export_plugin!(…, allocator = arena)`) in real
//! compiled components: values kept across calls stay intact, and a plugin that parses an
//! object on every call runs many calls inside a small memory limit.
//!
//! Needs the guests built: `cargo xtask build-guests`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use wasmctrl::cache::Writer;
use wasmctrl::controller::{Action, Request};
use wasmctrl::object::Object;
use wasmctrl::plugin::{CacheReader, EngineConfig, Gvk, Plugin, PluginEngine, PluginEnv, PluginSpec};
use wasmctrl_testkit::guests::wasm;

fn load(crate_name: &str, objects: &[&str]) -> Plugin {
    let engine = PluginEngine::new(EngineConfig::default(), None).unwrap_or_else(|e| panic!("engine: {e}"));
    let configmap = Gvk::new("v1", "ConfigMap");
    let writer = Writer::new();
    for json in objects {
        writer.upsert(Arc::new(
            Object::from_json(Bytes::from(json.to_string())).unwrap_or_else(|e| panic!("{e}")),
        ));
    }
    let mut caches: HashMap<Gvk, Arc<dyn CacheReader>> = HashMap::new();
    caches.insert(configmap.clone(), Arc::new(writer.reader()));
    let mut spec = PluginSpec::new(crate_name, configmap);
    spec.limits.deadline = Duration::from_secs(5);
    spec.limits.memory = 16 << 20;
    Plugin::load(&engine, spec, &wasm(crate_name), PluginEnv { caches, kube: None })
        .unwrap_or_else(|e| panic!("loading {crate_name}: {e}"))
}

fn req(name: &str) -> Request {
    Request { namespace: Some("default".into()), name: name.into() }
}

#[test]
fn values_allocated_in_calls_and_kept_across_calls_are_never_overwritten() {
    let plugin = load("test-plugin-arena-state", &[]);
    for n in 0..1500 {
        // Calls that keep nothing, between calls that grow the state.
        assert_eq!(plugin.reconcile_blocking(&req("tmp")), Ok(Action::Done), "before {n}");
        assert_eq!(plugin.reconcile_blocking(&req(&n.to_string())), Ok(Action::Done), "call {n}");
    }
}

#[test]
fn a_plugin_parsing_an_object_per_call_runs_in_a_small_memory_limit() {
    let data: Vec<String> = (0..24).map(|i| format!(r#""key-{i}":"{}""#, "v".repeat(40))).collect();
    let object = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"bench","namespace":"default"}},"data":{{{}}}}}"#,
        data.join(",")
    );
    let plugin = load("test-plugin-bench-arena", &[&object]);
    for n in 0..5000 {
        assert_eq!(plugin.reconcile_blocking(&req("bench")), Ok(Action::Done), "call {n}");
        assert_eq!(plugin.reconcile_blocking(&req("missing")), Ok(Action::Done), "call {n}");
    }
}
