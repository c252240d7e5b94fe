//! Plugin runtime benchmark (harness-free; `cargo bench -p wasmctrl --bench plugin`).
//!
//! Needs the guests built (`cargo xtask build-guests`). Measures, in one run so the
//! ratios are comparable:
//!   1. reconcile reading one ~2 KB cached ConfigMap and parsing it into k8s-openapi's
//!      `ConfigMap`: in Wasm (`test-plugin-bench`) vs the same logic natively;
//!   2. where the Wasm time goes: a no-op call, the cache read alone, the parse alone;
//!   3. the same reconcile through the controller-facing adapter (tokio + spawn_blocking);
//!   4. instance pool checkout + return, and a fresh instance (instantiate + init + call);
//!   5. cold compile vs cached load of each example plugin and the bench plugin.
//!
//! Sizes: `BENCH_ITERS` (default 20000 per round), `BENCH_ROUNDS` (default 5; the median
//! round is reported). `BENCH_PLUGIN` overrides the bench plugin's path (e.g. a build
//! with another opt-level).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use k8s_openapi::api::core::v1::ConfigMap;
use wasmctrl::cache::Writer;
use wasmctrl::controller::{Action, ReconcileError, Reconciler, Request};
use wasmctrl::object::Object;
use wasmctrl::plugin::pool::Pool;
use wasmctrl::plugin::{
    CacheReader, EngineConfig, Gvk, Plugin, PluginEngine, PluginEnv, PluginReconciler, PluginSpec,
};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn guest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../guests/target/wasm32-wasip2/release")
}

fn read_wasm(path: &PathBuf) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| {
        eprintln!("{}: {e}; run `cargo xtask build-guests` first", path.display());
        std::process::exit(2)
    })
}

/// Median over `rounds` of the mean time per call of `iters` calls.
fn measure(rounds: usize, iters: usize, mut f: impl FnMut()) -> Duration {
    for _ in 0..iters / 10 {
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

/// A named benchmark case.
type Case<'a> = (&'a str, Box<dyn FnMut() + 'a>);

/// Like [`measure`] for several cases, one batch of each per round.
fn measure_interleaved(rounds: usize, iters: usize, cases: &mut [Case<'_>]) -> Vec<Duration> {
    for (_, f) in cases.iter_mut() {
        for _ in 0..iters / 10 {
            f();
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, (_, f)) in cases.iter_mut().enumerate() {
            let start = Instant::now();
            for _ in 0..iters {
                f();
            }
            samples[i].push(start.elapsed() / iters as u32);
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort();
            s[s.len() / 2]
        })
        .collect()
}

fn fmt(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 1_000_000 { format!("{:.2} ms", ns as f64 / 1e6) } else { format!("{:.2} µs", ns as f64 / 1e3) }
}

/// A ~2 KB ConfigMap as an API server would return it.
fn configmap_json() -> Bytes {
    let data: Vec<String> =
        (0..24).map(|i| format!(r#""key-{i:02}":"value {i:02} {}""#, "x".repeat(40))).collect();
    let json = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"bench","namespace":"default","uid":"6f1c2b1e-8a4e-4c7a-9d55-1b2f3c4d5e6f","resourceVersion":"123456","creationTimestamp":"2026-11-22T18:00:00Z","labels":{{"app":"bench","tier":"backend"}},"annotations":{{"example.com/owner":"team-a"}},"managedFields":[{{"manager":"kubectl","operation":"Apply","apiVersion":"v1","time":"2026-11-22T18:00:00Z","fieldsType":"FieldsV1","fieldsV1":{{"f:data":{{}}}}}}]}},"data":{{{}}}}}"#,
        data.join(",")
    );
    Bytes::from(json)
}

/// The logic of the bench plugin's reconcile, compiled natively.
fn native_reconcile(cache: &dyn CacheReader, request: &Request) -> Result<Action, ReconcileError> {
    let obj = cache.get(&request.key()).ok_or_else(|| ReconcileError::Terminal("not found".into()))?;
    let cm: ConfigMap =
        serde_json::from_slice(obj.json()).map_err(|e| ReconcileError::Terminal(e.to_string()))?;
    if cm.data.as_ref().is_none_or(|d| d.is_empty()) {
        return Err(ReconcileError::Terminal("empty".into()));
    }
    Ok(Action::Done)
}

fn main() {
    let iters = env_usize("BENCH_ITERS", 20_000);
    let rounds = env_usize("BENCH_ROUNDS", 5);
    let bench_path = std::env::var("BENCH_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| guest_dir().join("test_plugin_bench.wasm"));
    let bench_wasm = read_wasm(&bench_path);

    let cache_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let engine = PluginEngine::new(
        EngineConfig { cache_dir: Some(cache_dir.path().to_owned()), ..Default::default() },
        None,
    )
    .unwrap_or_else(|e| panic!("engine: {e}"));

    let json = configmap_json();
    let object = Arc::new(Object::from_json(json.clone()).unwrap_or_else(|e| panic!("{e}")));
    let writer = Writer::new();
    writer.upsert(object);
    let cache: Arc<dyn CacheReader> = Arc::new(writer.reader());
    let configmap = Gvk::new("v1", "ConfigMap");
    let env = PluginEnv { caches: [(configmap.clone(), cache.clone())].into_iter().collect(), kube: None };
    let spec = PluginSpec::new("bench", configmap);
    let plugin = Plugin::load(&engine, spec, &bench_wasm, env).unwrap_or_else(|e| panic!("loading: {e}"));

    let request = |name: &str| Request { namespace: Some("default".into()), name: name.into() };
    let bench = request("bench");
    let noop = request("noop");
    let get_only = request("get:bench");
    let parse_only = request("parse:bench");
    assert_eq!(native_reconcile(&*cache, &bench), Ok(Action::Done));
    for r in [&bench, &noop, &get_only, &parse_only] {
        assert_eq!(plugin.reconcile_blocking(r), Ok(Action::Done), "{r}");
    }

    println!(
        "plugin runtime benchmark: {iters} calls x {rounds} rounds (median round), object {} bytes",
        json.len()
    );
    println!("plugin: {} ({} bytes)", bench_path.display(), bench_wasm.len());
    // Interleaved rounds: every case runs once per round, so a noisy neighbour (2 shared
    // cores) skews all cases alike and the ratios stay meaningful.
    let mut cases: Vec<Case<'_>> = vec![
        (
            "native",
            Box::new(|| {
                std::hint::black_box(native_reconcile(&*cache, std::hint::black_box(&bench))).ok();
            }),
        ),
        (
            "wasm",
            Box::new(|| {
                std::hint::black_box(plugin.reconcile_blocking(&bench)).ok();
            }),
        ),
        (
            "noop",
            Box::new(|| {
                std::hint::black_box(plugin.reconcile_blocking(&noop)).ok();
            }),
        ),
        (
            "get",
            Box::new(|| {
                std::hint::black_box(plugin.reconcile_blocking(&get_only)).ok();
            }),
        ),
        (
            "parse",
            Box::new(|| {
                std::hint::black_box(plugin.reconcile_blocking(&parse_only)).ok();
            }),
        ),
        (
            "native-parse",
            Box::new(|| {
                std::hint::black_box(serde_json::from_slice::<ConfigMap>(std::hint::black_box(&json)).ok());
            }),
        ),
    ];
    let results = measure_interleaved(rounds, iters, &mut cases);
    let [native, wasm, noop_t, get_t, parse_t, native_parse] = results[..] else { unreachable!() };
    println!();
    println!("reconcile (cache get + parse into ConfigMap)");
    println!("  native                      {:>10}", fmt(native));
    println!(
        "  wasm (blocking call)        {:>10}   ratio {:.2}x",
        fmt(wasm),
        wasm.as_secs_f64() / native.as_secs_f64()
    );
    println!("where the wasm time goes");
    println!("  no-op call                  {:>10}", fmt(noop_t));
    println!(
        "  call + cache get (2 KB)     {:>10}   (get ≈ {})",
        fmt(get_t),
        fmt(get_t.saturating_sub(noop_t))
    );
    println!(
        "  call + parse only           {:>10}   (parse ≈ {}; native parse {}, {:.2}x)",
        fmt(parse_t),
        fmt(parse_t.saturating_sub(noop_t)),
        fmt(native_parse),
        parse_t.saturating_sub(noop_t).as_secs_f64() / native_parse.as_secs_f64()
    );

    // Through the adapter, as the controller calls it.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build();
    let rt = rt.unwrap_or_else(|e| panic!("runtime: {e}"));
    let adapter = PluginReconciler::new(plugin.clone()).unwrap_or_else(|e| panic!("{e}"));
    let async_iters = (iters / 4).max(100);
    let via_adapter = rt.block_on(async {
        let mut samples = Vec::new();
        for _ in 0..rounds {
            let start = Instant::now();
            for _ in 0..async_iters {
                std::hint::black_box(adapter.reconcile(bench.clone()).await).ok();
            }
            samples.push(start.elapsed() / async_iters as u32);
        }
        samples.sort();
        samples[samples.len() / 2]
    });
    println!(
        "  via adapter (block_in_place){:>10}   ratio {:.2}x",
        fmt(via_adapter),
        via_adapter.as_secs_f64() / native.as_secs_f64()
    );

    // Instance pool.
    let pool: Pool<u64> = Pool::new(4);
    let far = Instant::now() + Duration::from_secs(3600);
    let checkout = measure(rounds, iters, || {
        let mut lease = pool.checkout(far, || Ok::<_, ()>(7)).unwrap_or_else(|_| unreachable!());
        std::hint::black_box(lease.get());
    });
    let fresh_iters = 200;
    let fresh = measure(3, fresh_iters, || {
        plugin.release_idle_instances();
        std::hint::black_box(plugin.reconcile_blocking(&noop)).ok();
    });
    println!();
    println!("instances");
    println!("  pool checkout + return      {:>10}", fmt(checkout));
    println!("  fresh instance + init + call{:>10}   (pooling allocator)", fmt(fresh));

    // Compile vs cached load.
    println!();
    println!("compile (Cranelift) vs cached load (deserialize_file)");
    let mut plugins: Vec<(String, Vec<u8>)> = ["configmap_mirror", "website_operator", "pod_node_policy"]
        .iter()
        .filter_map(|n| std::fs::read(guest_dir().join(format!("{n}.wasm"))).ok().map(|b| (n.to_string(), b)))
        .collect();
    plugins.push(("test_plugin_bench".into(), bench_wasm.clone()));
    for (name, bytes) in &plugins {
        let cold_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cold_engine = PluginEngine::new(
            EngineConfig { cache_dir: Some(cold_dir.path().to_owned()), ..Default::default() },
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let compiled = cold_engine.load_component(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!compiled.from_cache);
        let mut loads: Vec<Duration> = (0..20)
            .map(|_| {
                let l = cold_engine.load_component(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(l.from_cache);
                l.elapsed
            })
            .collect();
        loads.sort();
        println!(
            "  {name:<22} {:>7} KB  compile {:>10}  cached load {:>10}",
            bytes.len() / 1024,
            fmt(compiled.elapsed),
            fmt(loads[loads.len() / 2])
        );
    }
}
