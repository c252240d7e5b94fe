//! Guest languages side by side (harness-free; `cargo bench -p wasmctrl --bench languages`).
//!
//! The same plugin, `configmap-mirror`, written in Rust (`guests/examples/configmap-mirror`),
//! TypeScript (`guests/ts/examples/configmap-mirror`, componentize-js) and Python
//! (`guests/python/examples/configmap-mirror`, componentize-py). Needs them built:
//! `cargo xtask build-guests` (a language whose component is missing is left out of the
//! table, with a note). One table, ratios against Rust:
//!
//! - `.wasm` size;
//! - compile: Cranelift compile of the component, no cache (median of `BENCH_COMPILES`, default 3);
//! - cached load: loading the compiled artifact from the compile cache;
//! - drop-in to first reconcile: what a user waits for after dropping the plugin in, as the
//!   host runs by default (tier-up: Winch compiles it first, Cranelift in the background; an
//!   empty compile cache): the load, a fresh instance and `init`, and the first reconcile
//!   (median of `BENCH_COMPILES`, each with a new engine and cache);
//! - instance: a fresh instance (instantiate + `init`) and its first call;
//! - idle instance: the resident memory an idle instance holds, what each instance a plugin
//!   keeps between calls costs the host: `IDLE_INSTANCES` plugins of the component, each
//!   called once (one idle instance each), then every idle instance released; the RSS that
//!   frees, per instance (median of 3);
//! - memory: the smallest per-instance `memory` limit (MiB, by bisection) under which a fresh
//!   instance initialises and reconciles; what a plugin TOML's `memory` must at least allow;
//! - no-op call: a reconcile that returns at once (`noop` of the Rust bench plugin, `fine`
//!   of the TS/Python misbehave plugins: the bare cost of a call through each runtime; the
//!   TS/Python SDKs also read the request's ConfigMap from the cache first, an empty cache
//!   here, where the Rust bench plugin, written against the WIT, reads nothing);
//! - reconcile: the mirror's steady-state reconcile of a source whose two copies are up to
//!   date (cache reads, index lookup, JSON parse and compare, one log line; no writes).
//!
//! Sizes: `BENCH_ITERS` (default 2000 calls per round), `BENCH_ROUNDS` (default 5; median).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmctrl::cache::{IndexFunc, Writer};
use wasmctrl::controller::{Action, Request};
use wasmctrl::object::Object;
use wasmctrl::plugin::{
    CacheReader, EngineConfig, Gvk, Permissions, Plugin, PluginEngine, PluginEnv, PluginSpec,
};
use wasmctrl_bench_support::{Figure, Plot, ProcStatus};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn guests() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guests/target")
}

/// One language's components.
struct Lang {
    name: &'static str,
    mirror: PathBuf,
    noop: PathBuf,
    /// Request name of the no-op call.
    noop_request: &'static str,
}

fn languages() -> Vec<Lang> {
    let rust = guests().join("wasm32-wasip2/release");
    vec![
        Lang {
            name: "Rust",
            mirror: rust.join("configmap_mirror.wasm"),
            noop: rust.join("test_plugin_bench.wasm"),
            noop_request: "noop",
        },
        Lang {
            name: "TypeScript",
            mirror: guests().join("ts/configmap-mirror-ts.wasm"),
            noop: guests().join("ts/test-plugin-ts-misbehave.wasm"),
            noop_request: "fine",
        },
        Lang {
            name: "Python",
            mirror: guests().join("python/configmap-mirror-py.wasm"),
            noop: guests().join("python/test-plugin-py-misbehave.wasm"),
            noop_request: "fine",
        },
    ]
}

fn object(json: serde_json::Value) -> Arc<Object> {
    Arc::new(Object::from_json(Bytes::from(json.to_string())).unwrap_or_else(|e| panic!("{e}")))
}

fn configmap_gvk() -> Gvk {
    Gvk::new("v1", "ConfigMap")
}

fn namespace_gvk() -> Gvk {
    Gvk::new("v1", "Namespace")
}

/// The caches of a mirror in steady state: source `default/app-config` (labelled, with the
/// finalizer), its up-to-date copies in team-a and team-b, and those Namespaces.
fn steady_state_env() -> PluginEnv {
    let data = serde_json::json!({
        "log-level": "info",
        "feature-flags": "search,comments",
        "app.properties": "server.port=8080\nserver.threads=16\ncache.size=512\n",
    });
    let source = object(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config", "namespace": "default", "uid": "u-src", "resourceVersion": "10",
                     "labels": {"mirror": "true", "app": "web"}, "finalizers": ["mirror.example.com/cleanup"]},
        "data": data,
    }));
    let copy = |ns: &str| {
        object(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-config", "namespace": ns, "uid": format!("u-{ns}"), "resourceVersion": "11",
                         "labels": {"app.kubernetes.io/managed-by": "configmap-mirror"},
                         "annotations": {"mirror.example.com/source": "default/app-config"}},
            "data": data,
        }))
    };
    let configmaps = Writer::new();
    configmaps
        .add_indexers([(
            "by-source".to_owned(),
            IndexFunc::custom(|o: &Object| {
                o.annotation("mirror.example.com/source").map(|v| vec![v.to_owned()]).unwrap_or_default()
            }),
        )])
        .unwrap_or_else(|e| panic!("{e}"));
    for o in [source, copy("team-a"), copy("team-b")] {
        configmaps.upsert(o);
    }
    let namespaces = Writer::new();
    for ns in ["default", "team-a", "team-b"] {
        namespaces.upsert(object(
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        ));
    }
    let mut caches: HashMap<Gvk, Arc<dyn CacheReader>> = HashMap::new();
    caches.insert(configmap_gvk(), Arc::new(configmaps.reader()));
    caches.insert(namespace_gvk(), Arc::new(namespaces.reader()));
    PluginEnv { caches, kube: None }
}

fn mirror_spec(memory: usize) -> PluginSpec {
    let mut spec = PluginSpec::new("configmap-mirror", configmap_gvk());
    spec.permissions = Permissions::new([configmap_gvk(), namespace_gvk()], [], [configmap_gvk()]);
    spec.settings = Bytes::from_static(br#"{"namespaces":["team-a","team-b"]}"#);
    spec.limits.deadline = Duration::from_secs(30);
    spec.limits.memory = memory;
    spec
}

fn source_request() -> Request {
    Request { namespace: Some("default".into()), name: "app-config".into() }
}

/// Median over `rounds` of the mean time per call of `iters` calls.
fn measure(rounds: usize, iters: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..(iters / 10).max(1) {
        f();
    }
    let mut per_call: Vec<Duration> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                f();
            }
            start.elapsed() / iters as u32
        })
        .collect();
    per_call.sort();
    per_call[per_call.len() / 2]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Whether a fresh instance of `component` initialises and reconciles under `memory` bytes.
fn fits(engine: &PluginEngine, component: &wasmtime::component::Component, memory: usize) -> bool {
    match Plugin::from_component(engine, mirror_spec(memory), component, "bench".into(), steady_state_env()) {
        Ok(p) => p.reconcile_blocking(&source_request()) == Ok(Action::Done),
        Err(_) => false,
    }
}

/// The smallest memory limit in MiB under which `fits` holds (bisection over 1..=256 MiB).
fn min_memory_mib(engine: &PluginEngine, component: &wasmtime::component::Component) -> Option<usize> {
    let (mut lo, mut hi) = (0usize, 256usize);
    if !fits(engine, component, hi << 20) {
        return None;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(engine, component, mid << 20) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// Plugins [`idle_instance_kib`] loads, one idle instance each.
const IDLE_INSTANCES: usize = 20;

/// The RSS, in KiB, that releasing an idle instance of `component` frees: [`IDLE_INSTANCES`]
/// plugins of it, each reconciled once (so each keeps one used, idle instance), then their
/// instances released.
fn idle_instance_kib(
    engine: &PluginEngine,
    component: &wasmtime::component::Component,
    hash: &str,
    name: &str,
) -> f64 {
    let plugins: Vec<Plugin> = (0..IDLE_INSTANCES)
        .map(|_| {
            let p = Plugin::from_component(
                engine,
                mirror_spec(256 << 20),
                component,
                hash.into(),
                steady_state_env(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(p.reconcile_blocking(&source_request()), Ok(Action::Done), "{name}: reconcile");
            p
        })
        .collect();
    let with_instances = ProcStatus::read().bytes("VmRSS:");
    for p in &plugins {
        p.release_idle_instances();
    }
    let released = ProcStatus::read().bytes("VmRSS:");
    with_instances.saturating_sub(released) as f64 / 1024.0 / IDLE_INSTANCES as f64
}

/// From a new engine with tier-up (as the host runs) and an empty compile cache: the plugin
/// loaded (Winch's compile), instantiated, initialised and its first reconcile done.
fn drop_in_to_first_reconcile(wasm: &[u8], name: &str) -> Duration {
    let cache_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = PluginEngine::new(
        EngineConfig {
            cache_dir: Some(cache_dir.path().to_owned()),
            tier_up: true,
            ..EngineConfig::default()
        },
        None,
    )
    .unwrap_or_else(|e| panic!("engine: {e}"));
    let start = Instant::now();
    let plugin = Plugin::load(&engine, mirror_spec(256 << 20), wasm, steady_state_env())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let r = plugin.reconcile_blocking(&source_request());
    let elapsed = start.elapsed();
    assert_eq!(r, Ok(Action::Done), "{name}: first reconcile after a drop-in");
    // The background Cranelift compile ends here, not in the next measurement's time.
    if !engine.wait_for_tier_ups(Duration::from_secs(300)) {
        panic!("{name}: the tier-up compile did not finish in 300 s");
    }
    elapsed
}

struct Row {
    name: &'static str,
    size: usize,
    compile: Duration,
    cached_load: Duration,
    first_reconcile: Duration,
    instance: Duration,
    idle_instance_kib: f64,
    memory_mib: Option<usize>,
    noop: Duration,
    reconcile: Duration,
}

fn fmt(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 1_000_000_000 {
        format!("{:.2} s", d.as_secs_f64())
    } else if ns >= 1_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

fn ratio(x: f64, rust: f64) -> String {
    if rust <= 0.0 { "-".into() } else { format!("{:.1}x", x / rust) }
}

fn main() {
    let iters = env_usize("BENCH_ITERS", 2000);
    let rounds = env_usize("BENCH_ROUNDS", 5).max(1);
    let compiles = env_usize("BENCH_COMPILES", 3).max(1);
    let cache_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = PluginEngine::new(
        EngineConfig { cache_dir: Some(cache_dir.path().to_owned()), ..EngineConfig::default() },
        None,
    )
    .unwrap_or_else(|e| panic!("engine: {e}"));
    let uncached = PluginEngine::new(EngineConfig::default(), None).unwrap_or_else(|e| panic!("engine: {e}"));

    let mut rows = Vec::new();
    for lang in languages() {
        let (Ok(wasm), Ok(noop_wasm)) = (std::fs::read(&lang.mirror), std::fs::read(&lang.noop)) else {
            println!(
                "note: {} left out: {} or {} is missing (`cargo xtask build-guests`; it skips languages whose toolchain is not installed)",
                lang.name,
                lang.mirror.display(),
                lang.noop.display()
            );
            continue;
        };
        eprintln!("bench: {} ...", lang.name);
        let compile = median(
            (0..compiles)
                .map(|_| {
                    let start = Instant::now();
                    uncached.compile(&wasm).unwrap_or_else(|e| panic!("{}: {e}", lang.name));
                    start.elapsed()
                })
                .collect(),
        );
        let first = engine.load_component(&wasm).unwrap_or_else(|e| panic!("{}: {e}", lang.name));
        let cached_load = median(
            (0..5)
                .map(|_| {
                    let loaded =
                        engine.load_component(&wasm).unwrap_or_else(|e| panic!("{}: {e}", lang.name));
                    assert!(loaded.from_cache, "{}: the second load must come from the cache", lang.name);
                    loaded.elapsed
                })
                .collect(),
        );
        let memory_mib = min_memory_mib(&engine, &first.component);
        let idle_instance_kib = {
            let mut v: Vec<f64> = (0..3)
                .map(|_| idle_instance_kib(&engine, &first.component, &first.hash, lang.name))
                .collect();
            v.sort_by(f64::total_cmp);
            v[1]
        };
        let first_reconcile =
            median((0..compiles).map(|_| drop_in_to_first_reconcile(&wasm, lang.name)).collect());

        let plugin = Plugin::from_component(
            &engine,
            mirror_spec(256 << 20),
            &first.component,
            first.hash.clone(),
            steady_state_env(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", lang.name));
        assert_eq!(
            plugin.reconcile_blocking(&source_request()),
            Ok(Action::Done),
            "{}: steady-state reconcile",
            lang.name
        );
        let reconcile = measure(rounds, iters, || {
            let r = plugin.reconcile_blocking(&source_request());
            debug_assert_eq!(r, Ok(Action::Done));
        });
        let instance = median(
            (0..5.max(rounds))
                .map(|_| {
                    plugin.release_idle_instances();
                    let start = Instant::now();
                    let r = plugin.reconcile_blocking(&source_request());
                    let elapsed = start.elapsed();
                    assert_eq!(r, Ok(Action::Done));
                    elapsed
                })
                .collect(),
        );

        let mut noop_spec = PluginSpec::new("noop", configmap_gvk());
        noop_spec.limits.memory = 256 << 20;
        let noop_plugin = Plugin::load(&engine, noop_spec, &noop_wasm, steady_state_env())
            .unwrap_or_else(|e| panic!("{}: {e}", lang.name));
        let noop_request = Request { namespace: None, name: lang.noop_request.into() };
        assert_eq!(noop_plugin.reconcile_blocking(&noop_request), Ok(Action::Done), "{}: no-op", lang.name);
        let noop = measure(rounds, iters, || {
            let r = noop_plugin.reconcile_blocking(&noop_request);
            debug_assert_eq!(r, Ok(Action::Done));
        });
        rows.push(Row {
            name: lang.name,
            size: wasm.len(),
            compile,
            cached_load,
            first_reconcile,
            instance,
            idle_instance_kib,
            memory_mib,
            noop,
            reconcile,
        });
    }

    let Some(rust) = rows.iter().find(|r| r.name == "Rust") else {
        println!("no Rust row: build the guests first (`cargo xtask build-guests`)");
        std::process::exit(2);
    };
    println!();
    println!("configmap-mirror per guest language (ratio vs Rust); {rounds} rounds x {iters} calls, medians");
    println!(
        "| language | .wasm size | compile (no cache) | cached load | drop-in to first reconcile (Winch first) | fresh instance + call | idle instance | min memory | no-op call | reconcile (steady state) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    let secs = |d: Duration| d.as_secs_f64();
    for r in &rows {
        let mem = |m: Option<usize>| m.map(|v| v as f64).unwrap_or(f64::NAN);
        println!(
            "| {} | {:.2} MiB ({}) | {} ({}) | {} ({}) | {} ({}) | {} ({}) | {:.0} KiB ({}) | {} ({}) | {} ({}) | {} ({}) |",
            r.name,
            r.size as f64 / (1 << 20) as f64,
            ratio(r.size as f64, rust.size as f64),
            fmt(r.compile),
            ratio(secs(r.compile), secs(rust.compile)),
            fmt(r.cached_load),
            ratio(secs(r.cached_load), secs(rust.cached_load)),
            fmt(r.first_reconcile),
            ratio(secs(r.first_reconcile), secs(rust.first_reconcile)),
            fmt(r.instance),
            ratio(secs(r.instance), secs(rust.instance)),
            r.idle_instance_kib,
            ratio(r.idle_instance_kib, rust.idle_instance_kib),
            r.memory_mib.map(|m| format!("{m} MiB")).unwrap_or_else(|| "> 256 MiB".into()),
            ratio(mem(r.memory_mib), mem(rust.memory_mib)),
            fmt(r.noop),
            ratio(secs(r.noop), secs(rust.noop)),
            fmt(r.reconcile),
            ratio(secs(r.reconcile), secs(rust.reconcile)),
        );
    }
    // The Rust guest next to the others (the ratio says how many times the Rust one is better).
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut reconcile =
        Figure::lower("languages", "configmap-mirror reconcile µs, Rust guest", us(rust.reconcile), "µs");
    let mut cold = Figure::lower(
        "languages",
        "configmap-mirror fresh instance + call µs, Rust guest",
        us(rust.instance),
        "µs",
    );
    for r in rows.iter().filter(|r| r.name != "Rust") {
        reconcile = reconcile.against(r.name, us(r.reconcile));
        cold = cold.against(r.name, us(r.instance));
    }
    reconcile.record();
    cold.record();
    // An idle TypeScript or Python instance against at most 3× the memory of a Rust one.
    for r in rows.iter().filter(|r| r.name != "Rust") {
        Figure::lower(
            "languages",
            format!("configmap-mirror idle instance RSS ÷ the Rust guest's, {}", r.name),
            r.idle_instance_kib / rust.idle_instance_kib,
            "×",
        )
        .target(3.0)
        .record();
    }
    // Each language against the 2 s a user should wait at most after dropping a plugin in.
    for r in &rows {
        Figure::lower(
            "languages",
            format!("configmap-mirror drop-in to first reconcile ms (Winch first), {}", r.name),
            r.first_reconcile.as_secs_f64() * 1e3,
            "ms",
        )
        .target(2000.0)
        .record();
    }
    // For docs/benchmarks.md: each language's costs as multiples of the Rust guest's.
    let mut plot = Plot::new(
        "languages",
        "Per-language costs, × the Rust guest (x: 1 size, 2 compile, 3 cached load, 4 fresh instance + call, 5 no-op call, 6 reconcile)",
        "cost",
        "× Rust",
    )
    .log_y();
    for r in &rows {
        let costs = [
            r.size as f64 / rust.size as f64,
            secs(r.compile) / secs(rust.compile),
            secs(r.cached_load) / secs(rust.cached_load),
            secs(r.instance) / secs(rust.instance),
            secs(r.noop) / secs(rust.noop),
            secs(r.reconcile) / secs(rust.reconcile),
        ];
        plot.line(r.name, costs.iter().enumerate().map(|(i, c)| ((i + 1) as f64, *c)));
    }
    plot.record();
}
