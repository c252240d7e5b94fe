//! Many plugins in one host (harness-free; `cargo bench -p wasmctrl --bench many_plugins`).
//!
//! Needs the guests built (`cargo xtask build-guests`). Every scenario runs in a fresh child
//! process (this binary, re-executed), so its peak RSS (`VmHWM`) is its own; scenarios share
//! compile cache directories so the warm ones read what the cold ones wrote. The plugin is
//! `configmap-mirror` (the Rust example), loaded the way the host's reload manager loads a
//! plugins directory: every plugin at once, each taking a load slot (a few run at a time)
//! and then loading on a tokio blocking thread, on the engine the host runs (pooling
//! allocator, idle-instance reaper).
//!
//! - `copies, cold`: `PLUGINS` copies of the same `.wasm`, empty compile cache;
//! - `copies, warm`: the same, compile cache filled;
//! - `distinct, cold` / `warm`: `PLUGINS` *different* components: the mirror with one string
//!   constant in its data segment rewritten per copy (same length; a message of its
//!   `NameConflict` event), so every copy has its own content hash and its own code.
//!
//! Each plugin gets one steady-state reconcile (cache reads and a JSON compare; no writes), so
//! each holds one used, idle instance. Columns: load time (all plugins, wall), compiles,
//! peak RSS of the load, RSS with every plugin loaded (split into anonymous and file-backed:
//! the compiled artifacts are mapped from the compile cache, so their resident pages count as
//! file-backed; and the Rust heap live per plugin), RSS after the idle instances were
//! released (what idle-instance-timeout does), and from those memory per plugin beyond the
//! empty host and per idle instance. The process allocates with the binary's global
//! allocator (jemalloc with the default features), as the host does. Targets (issue 12): ≤ 150 MB with 100 distinct plugins
//! loaded, ≤ 150 KiB per idle instance beyond the shared code.
//!
//! A third table loads `PLUGINS` distinct plugins with tier-up on, as the `wasmctrl` binary
//! runs by default (`distinct, cold, tier-up`, an empty compile cache of its own): each loads
//! with Winch and gets one reconcile while the Cranelift compiles run in the background;
//! then, once every tier-up is done, each plugin is reconciled again (now on Cranelift code,
//! its Winch instance retired) and the RSS is taken. Columns: the load (Winch), the RSS with
//! every plugin loaded and reconciled on Winch code, the peak RSS of the whole run (loading
//! and tier-up), how long the tier-ups took, and the steady RSS (split into anonymous and
//! file-backed). Targets (issue 31): peak ≤ 150 MB, steady ≤ 100 MB.
//!
//! Then, per scenario, a second table on idle code (what `idle-code-timeout` does): each
//! plugin is loaded from its own file (as the host loads a plugins directory), so it may
//! drop its compiled code. After the release above, each plugin gets one call (a new
//! instance, its code resident: "new instance") and one more ("warm": an idle instance
//! reused); then every plugin drops its code (an explicit sweep as of a day later) and the
//! RSS is taken ("RSS dropped"); then each plugin gets one call, one plugin after another
//! ("first call": the code loaded again, from the compile cache or shared with a plugin
//! that loaded it already, then instantiated and `init`-ed, then the reconcile). Latencies
//! are p50 / max over the plugins, one call each.
//!
//! Compiles run as the `wasmctrl` binary runs them: in a child process of the binary
//! (`EngineConfig::compile_process`); `MANY_PLUGINS_COMPILE_IN_HOST=1` compiles in the
//! benchmark's own process instead.
//!
//! `PLUGINS` (default 100) sets the count; `SCENARIOS=copies` (or `distinct`) runs only those;
//! `MANY_PLUGINS_SMAPS=1` prints each child's resident memory by mapping kind (from
//! `/proc/self/smaps`) at each step.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmctrl::cache::{IndexFunc, Writer};
use wasmctrl::controller::{Action, Request};
use wasmctrl::object::Object;
use wasmctrl::plugin::{
    CacheReader, DEFAULT_IDLE_CODE_TIMEOUT, EngineConfig, Gvk, Permissions, Plugin, PluginEngine, PluginEnv,
    PluginError, PluginSpec, Tier,
};
use wasmctrl_bench_support::{Allocator, CountingAllocator, Figure, ProcStatus, allocated};

/// The global allocator of the `wasmctrl` binary built with this package's features (the
/// host's RSS is the binary's), counting the heap bytes live.
const BINARY_ALLOCATOR: Allocator =
    if cfg!(feature = "jemalloc") { Allocator::Jemalloc } else { Allocator::System };

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator::new(BINARY_ALLOCATOR);

/// The `wasmctrl` binary's jemalloc options, so that jemalloc here behaves as it does there.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: wasmctrl::heap::MallocConf = wasmctrl::heap::MallocConf::HOST;

/// Environment variable naming the scenario a child runs.
const SCENARIO: &str = "WASMCTRL_MANY_PLUGINS_SCENARIO";
/// Environment variable with the compile cache directory of a child.
const CACHE: &str = "WASMCTRL_MANY_PLUGINS_CACHE";
/// The constant rewritten in each distinct copy (must occur once in the component).
const PATCHED: &[u8] = b"left untouched";

fn plugins() -> usize {
    std::env::var("PLUGINS").ok().and_then(|v| v.parse().ok()).unwrap_or(100)
}

fn mirror_wasm() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release/configmap_mirror.wasm");
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask build-guests`", path.display()))
}

/// The mirror with the last four bytes of its `PATCHED` constant rewritten to `i` (zero
/// padded): a different, equally valid component per `i` below 10,000.
fn distinct_wasm(base: &[u8], i: usize) -> Vec<u8> {
    let at = base
        .windows(PATCHED.len())
        .position(|w| w == PATCHED)
        .unwrap_or_else(|| panic!("the mirror no longer contains {:?}", String::from_utf8_lossy(PATCHED)));
    assert!(
        base.windows(PATCHED.len()).filter(|w| *w == PATCHED).count() == 1,
        "the constant must occur once"
    );
    let mut wasm = base.to_vec();
    let tag = format!("{i:04}");
    let end = at + PATCHED.len();
    wasm[end - tag.len()..end].copy_from_slice(tag.as_bytes());
    wasm
}

fn object(v: serde_json::Value) -> Arc<Object> {
    Arc::new(Object::from_json(Bytes::from(v.to_string())).unwrap_or_else(|e| panic!("{e}")))
}

fn configmap_gvk() -> Gvk {
    Gvk::new("v1", "ConfigMap")
}

fn namespace_gvk() -> Gvk {
    Gvk::new("v1", "Namespace")
}

/// Caches in which the mirror's source and both copies are up to date (shared by every plugin).
fn steady_state_env() -> PluginEnv {
    let data = serde_json::json!({"log-level": "info", "app.properties": "server.port=8080\n"});
    let source = object(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config", "namespace": "default", "uid": "u-src", "resourceVersion": "10",
                     "labels": {"mirror": "true"}, "finalizers": ["mirror.example.com/cleanup"]},
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

fn mirror_spec(name: String) -> PluginSpec {
    let mut spec = PluginSpec::new(name, configmap_gvk());
    spec.permissions = Permissions::new([configmap_gvk(), namespace_gvk()], [], [configmap_gvk()]);
    spec.settings = Bytes::from_static(br#"{"namespaces":["team-a","team-b"]}"#);
    spec.limits.deadline = Duration::from_secs(120);
    spec
}

/// `VmRSS` and `VmHWM` of this process, bytes.
fn rss() -> (u64, u64) {
    let status = ProcStatus::read();
    (status.bytes("VmRSS:"), status.bytes("VmHWM:"))
}

/// Resident bytes of this process by kind: (anonymous, file-backed), from `/proc/self/status`
/// (file-backed: the mapped compile cache artifacts and the binary).
fn rss_split() -> (u64, u64) {
    let status = ProcStatus::read();
    (status.bytes("RssAnon:"), status.bytes("RssFile:") + status.bytes("RssShmem:"))
}

/// With `MANY_PLUGINS_SMAPS` set, writes to stderr where the resident memory is, by mapping
/// kind (compile cache artifacts, other files, anonymous by mapping size) and the largest
/// mappings: the breakdown behind the RSS columns.
fn dump_smaps(when: &str) {
    if std::env::var_os("MANY_PLUGINS_SMAPS").is_none() {
        return;
    }
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    // (name, size, rss, anonymous, private dirty, permissions) per mapping.
    let mut maps: Vec<(String, u64, u64, u64, u64, String)> = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            let name = line.split_whitespace().nth(5).unwrap_or("[anon]").to_owned();
            let perms = words.next().unwrap_or("").to_owned();
            maps.push((name, 0, 0, 0, 0, perms));
            continue;
        }
        let kb = words.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024;
        if let Some(m) = maps.last_mut() {
            match first {
                "Size:" => m.1 = kb,
                "Rss:" => m.2 = kb,
                "Anonymous:" => m.3 = kb,
                "Private_Dirty:" => m.4 = kb,
                _ => {}
            }
        }
    }
    let mut groups: std::collections::BTreeMap<String, (usize, u64, u64, u64)> = Default::default();
    for (name, size, rss, anon, dirty, _) in &maps {
        let group = if name.ends_with(".cwasm") {
            "cwasm files".to_owned()
        } else if name.starts_with('/') {
            format!("file {}", name.rsplit('/').next().unwrap_or(name))
        } else if *size >= 1 << 30 {
            "anon >= 1 GiB (pooling allocator, memories)".to_owned()
        } else if *size >= 64 << 20 {
            "anon 64 MiB..1 GiB".to_owned()
        } else if *size >= 2 << 20 {
            "anon 2..64 MiB".to_owned()
        } else {
            format!("anon < 2 MiB {name}")
        };
        let g = groups.entry(group).or_default();
        g.0 += 1;
        g.1 += rss;
        g.2 += anon;
        g.3 += dirty;
    }
    let mut rows: Vec<_> = groups.into_iter().collect();
    rows.sort_by_key(|(_, g)| std::cmp::Reverse(g.1));
    eprintln!("smaps {when}: group, mappings, rss KiB, anonymous KiB, private dirty KiB");
    for (group, (n, rss, anon, dirty)) in rows.iter().take(14) {
        eprintln!("  {group:<48} {n:>6} {:>9} {:>9} {:>9}", rss / 1024, anon / 1024, dirty / 1024);
    }
    // One artifact's mappings (the code image, and linear memory images mapped from it).
    if let Some((first, ..)) = maps.iter().find(|m| m.0.ends_with(".cwasm")) {
        let size = std::fs::metadata(first).map_or(0, |m| m.len());
        eprintln!("  one artifact, {} KiB on disk: size / rss KiB of its mappings:", size / 1024);
        for (_, map_size, rss, anon, _, perms) in maps.iter().filter(|m| &m.0 == first) {
            eprintln!("    {perms} {:>6} {:>6} (anonymous {})", map_size / 1024, rss / 1024, anon / 1024);
        }
    }
}

/// What one scenario measured (one line of the child's stdout).
#[derive(serde::Serialize, serde::Deserialize)]
struct Report {
    plugins: usize,
    load_ms: f64,
    compiled: u64,
    from_cache: u64,
    shared: u64,
    rss_empty: u64,
    peak: u64,
    rss_loaded: u64,
    /// `rss_loaded` split: anonymous and file-backed (mapped artifacts, the binary).
    anon_loaded: u64,
    file_loaded: u64,
    /// Heap bytes live (requested sizes) when empty and with every plugin loaded.
    heap_empty: u64,
    heap_loaded: u64,
    rss_released: u64,
    released: usize,
    /// The idle-code part.
    code: CodeReport,
}

/// What the idle-code part of a scenario measured.
#[derive(serde::Serialize, serde::Deserialize)]
struct CodeReport {
    /// First call per plugin after its instances were released (code resident), µs.
    new_instance_us: (f64, f64),
    /// A call on an idle instance, µs.
    warm_us: (f64, f64),
    /// Plugins that dropped their code.
    dropped: usize,
    rss_dropped: u64,
    /// First call per plugin after its code was dropped, µs.
    first_call_us: (f64, f64),
    /// How those first calls got the code: read from the compile cache, or shared.
    reload_from_cache: u64,
    reload_shared: u64,
    /// After those first calls.
    rss_reloaded: u64,
}

/// (p50, max) of `samples`, µs.
fn p50_max(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let us = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e6);
    (us(samples.get(samples.len() / 2)), us(samples.last()))
}

/// One reconcile per plugin, timed each.
fn time_calls(plugins: &[Plugin], request: &Request) -> Vec<Duration> {
    plugins
        .iter()
        .map(|p| {
            let start = Instant::now();
            assert_eq!(p.reconcile_blocking(request), Ok(Action::Done), "{}", p.name());
            start.elapsed()
        })
        .collect()
}

/// Releases the instances and drops the code of every plugin, and measures the first call
/// after each (see the header).
fn idle_code(engine: &PluginEngine, plugins: &[Plugin], request: &Request) -> CodeReport {
    let new_instance_us = p50_max(time_calls(plugins, request));
    let warm_us = p50_max(time_calls(plugins, request));
    let dropped = engine.drop_idle_code_at(Instant::now() + Duration::from_secs(24 * 3600));
    assert!(plugins.iter().all(|p| !p.code_resident()), "every plugin dropped its code");
    let (rss_dropped, _) = rss();
    dump_smaps("code dropped");
    let before = engine.component_loads();
    let first_call_us = p50_max(time_calls(plugins, request));
    let after = engine.component_loads();
    assert_eq!(after.compiled, before.compiled, "no compile: the code came from the cache");
    let (rss_reloaded, _) = rss();
    CodeReport {
        new_instance_us,
        warm_us,
        dropped,
        rss_dropped,
        first_call_us,
        reload_from_cache: after.from_cache - before.from_cache,
        reload_shared: after.shared - before.shared,
        rss_reloaded,
    }
}

/// The tokio runtime plugins load on: two workers, and blocking threads for the loads.
fn runtime() -> tokio::runtime::Runtime {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build();
    runtime.unwrap_or_else(|e| panic!("runtime: {e}"))
}

/// Loads `n` plugins at once, as the reload manager loads a plugins directory: each takes a
/// load slot, then runs `load(engine, i)` on a blocking thread.
fn load_all(
    runtime: &tokio::runtime::Runtime,
    engine: &PluginEngine,
    n: usize,
    load: impl Fn(&PluginEngine, usize) -> Result<Plugin, PluginError> + Send + Sync + 'static,
) -> Vec<Plugin> {
    let load = Arc::new(load);
    runtime.block_on(async {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let (engine, load) = (engine.clone(), load.clone());
                tokio::spawn(async move {
                    let _slot = engine.load_slot().await;
                    tokio::task::spawn_blocking(move || load(&engine, i)).await
                })
            })
            .collect();
        let mut plugins = Vec::with_capacity(tasks.len());
        for t in tasks {
            plugins.push(
                t.await
                    .and_then(|loaded| loaded)
                    .unwrap_or_else(|e| panic!("join: {e}"))
                    .unwrap_or_else(|e| panic!("load: {e}")),
            );
        }
        plugins
    })
}

/// What the tier-up scenario measured (one line of the child's stdout).
#[derive(serde::Serialize, serde::Deserialize)]
struct TierUpReport {
    plugins: usize,
    load_ms: f64,
    /// Plugins running Winch code once loaded.
    baseline: usize,
    rss_empty: u64,
    /// Every plugin loaded (Winch) and reconciled once.
    rss_baseline: u64,
    /// From the first load until every tier-up was done and every plugin reconciled again.
    tier_up_ms: f64,
    /// Every plugin on Cranelift code and reconciled on it.
    rss_steady: u64,
    anon_steady: u64,
    file_steady: u64,
    /// `VmHWM` at the end: the peak of the whole run.
    peak: u64,
}

/// Loads `plugins()` distinct plugins with tier-up on into an empty compile cache, one
/// reconcile each on Winch code, then waits for the tier-ups and reconciles each again (the
/// child side of the tier-up table).
fn run_tier_up(cache: &Path) -> TierUpReport {
    let n = plugins();
    let base = Arc::new(mirror_wasm());
    let config = EngineConfig {
        cache_dir: Some(cache.to_owned()),
        idle_code_timeout: Some(DEFAULT_IDLE_CODE_TIMEOUT),
        compile_process: Some(PathBuf::from(env!("CARGO_BIN_EXE_wasmctrl"))),
        tier_up: true,
        ..Default::default()
    };
    let engine = PluginEngine::new(config, None).unwrap_or_else(|e| panic!("engine: {e}"));
    assert!(engine.tier_up_enabled(), "Winch is available here");
    let env = steady_state_env();
    let runtime = runtime();
    let (rss_empty, _) = rss();
    let start = Instant::now();
    let loaded = load_all(&runtime, &engine, n, move |engine, i| {
        Plugin::load(engine, mirror_spec(format!("mirror-{i}")), &distinct_wasm(&base, i), env.clone())
    });
    let load_ms = start.elapsed().as_secs_f64() * 1e3;
    let baseline = loaded.iter().filter(|p| p.tier() == Tier::Baseline).count();
    let request = Request { namespace: Some("default".into()), name: "app-config".into() };
    for p in &loaded {
        assert_eq!(p.reconcile_blocking(&request), Ok(Action::Done), "{}", p.name());
    }
    let (rss_baseline, _) = rss();
    dump_smaps("tier-up: loaded and reconciled on Winch code");
    assert!(engine.wait_for_tier_ups(Duration::from_secs(1800)), "the tier-ups finish");
    for p in &loaded {
        assert_eq!(p.reconcile_blocking(&request), Ok(Action::Done), "{}", p.name());
        assert_eq!(p.tier(), Tier::Optimized, "{} runs Cranelift code", p.name());
    }
    let tier_up_ms = start.elapsed().as_secs_f64() * 1e3;
    let (rss_steady, peak) = rss();
    let (anon_steady, file_steady) = rss_split();
    dump_smaps("tier-up: every plugin on Cranelift code");
    TierUpReport {
        plugins: n,
        load_ms,
        baseline,
        rss_empty,
        rss_baseline,
        tier_up_ms,
        rss_steady,
        anon_steady,
        file_steady,
        peak,
    }
}

/// Runs one scenario in this process (the child side).
fn run_scenario(distinct: bool, cache: &Path) -> Report {
    let n = plugins();
    let base = Arc::new(mirror_wasm());
    let compile_in_host = std::env::var_os("MANY_PLUGINS_COMPILE_IN_HOST").is_some_and(|v| v == "1");
    let config = EngineConfig {
        cache_dir: Some(cache.to_owned()),
        idle_code_timeout: Some(DEFAULT_IDLE_CODE_TIMEOUT),
        compile_process: (!compile_in_host).then(|| PathBuf::from(env!("CARGO_BIN_EXE_wasmctrl"))),
        ..Default::default()
    };
    let engine = PluginEngine::new(config, None).unwrap_or_else(|e| panic!("engine: {e}"));
    // Each plugin's file (the fallback should the compile cache lose its code; never read
    // here, as the asserts on the loads check).
    let files = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let paths: Vec<PathBuf> = (0..n)
        .map(|i| {
            let path = files.path().join(format!("mirror-{i}.wasm"));
            let wasm = if distinct { distinct_wasm(&base, i) } else { base.to_vec() };
            std::fs::write(&path, wasm).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            path
        })
        .collect();
    let env = steady_state_env();
    let runtime = runtime();
    let (rss_empty, _) = rss();
    let heap_empty = allocated() as u64;
    dump_smaps("empty");

    let start = Instant::now();
    let loaded = load_all(&runtime, &engine, n, move |engine, i| {
        // Each plugin's own bytes, as the host reads each file; freed once loaded.
        let wasm = if distinct { distinct_wasm(&base, i) } else { base.to_vec() };
        Plugin::load_file(engine, mirror_spec(format!("mirror-{i}")), &paths[i], &wasm, env.clone())
    });
    let load_ms = start.elapsed().as_secs_f64() * 1e3;
    dump_smaps("loaded (each plugin init-ed), before the reconciles");
    let request = Request { namespace: Some("default".into()), name: "app-config".into() };
    for p in &loaded {
        assert_eq!(p.reconcile_blocking(&request), Ok(Action::Done), "{}", p.name());
        assert_eq!(p.pool_counts(), (1, 1));
    }
    let (rss_loaded, peak) = rss();
    let (anon_loaded, file_loaded) = rss_split();
    let heap_loaded = allocated() as u64;
    dump_smaps("loaded");
    // What the idle-instance reaper does once the timeout passed.
    let released = engine.release_idle_instances_at(Instant::now() + Duration::from_secs(24 * 3600));
    let (rss_released, _) = rss();
    dump_smaps("released");
    let loads = engine.component_loads();
    let code = idle_code(&engine, &loaded, &request);
    Report {
        plugins: n,
        load_ms,
        compiled: loads.compiled,
        from_cache: loads.from_cache,
        shared: loads.shared,
        rss_empty,
        peak,
        rss_loaded,
        anon_loaded,
        file_loaded,
        heap_empty,
        heap_loaded,
        rss_released,
        released,
        code,
    }
}

/// Records a figure of `bytes` in MB (lower is better), against `target` MB when given.
fn record_mb(measure: String, bytes: u64, target: Option<f64>) {
    let mut figure = Figure::lower("many_plugins", measure, bytes as f64 / 1e6, "MB");
    if let Some(target) = target {
        figure = figure.target(target);
    }
    figure.record();
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn kib(bytes: i64) -> String {
    format!("{:.0} KiB", bytes as f64 / 1024.0)
}

fn main() {
    if let Ok(scenario) = std::env::var(SCENARIO) {
        let cache = PathBuf::from(std::env::var(CACHE).unwrap_or_else(|e| panic!("{CACHE}: {e}")));
        let line = if scenario == "tier-up" {
            serde_json::to_string(&run_tier_up(&cache))
        } else {
            serde_json::to_string(&run_scenario(scenario == "distinct", &cache))
        };
        println!("{}", line.unwrap_or_else(|e| panic!("{e}")));
        return;
    }
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
    let copies_cache = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let distinct_cache = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    println!();
    println!(
        "{} plugins in one host (configmap-mirror, {} KB; each scenario a fresh process)",
        plugins(),
        mirror_wasm().len() / 1024
    );
    println!(
        "  {:<16} {:>9} {:>8} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "scenario",
        "load",
        "compiles",
        "empty",
        "peak RSS",
        "RSS loaded",
        "anon",
        "file",
        "heap",
        "released",
        "per plugin",
        "per instance"
    );
    let mut idle_code_rows: Vec<(&str, CodeReport, usize)> = Vec::new();
    for (label, scenario, cache) in [
        ("copies, cold", "copies", copies_cache.path()),
        ("copies, warm", "copies", copies_cache.path()),
        ("distinct, cold", "distinct", distinct_cache.path()),
        ("distinct, warm", "distinct", distinct_cache.path()),
    ] {
        if std::env::var("SCENARIOS").is_ok_and(|only| !only.split(',').any(|o| o == scenario)) {
            continue;
        }
        let r: Report = run_child(&exe, scenario, cache, label);
        let n = r.plugins.max(1) as i64;
        println!(
            "  {:<16} {:>7.0}ms {:>8} {:>10} {:>10} {:>11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
            label,
            r.load_ms,
            r.compiled,
            mib(r.rss_empty),
            mib(r.peak),
            mib(r.rss_loaded),
            mib(r.anon_loaded),
            mib(r.file_loaded),
            kib((r.heap_loaded as i64 - r.heap_empty as i64) / n),
            mib(r.rss_released),
            kib((r.rss_loaded as i64 - r.rss_empty as i64) / n),
            kib((r.rss_loaded as i64 - r.rss_released as i64) / r.released.max(1) as i64),
        );
        // Issue 12: ≤ 150 MB for the host with 100 loaded plugins, ≤ 150 KiB per idle instance.
        record_mb(format!("RSS MB with {} plugins loaded, {label}", r.plugins), r.rss_loaded, Some(150.0));
        record_mb(
            format!("anonymous RSS MB with {} plugins loaded, {label}", r.plugins),
            r.anon_loaded,
            None,
        );
        record_mb(
            format!("file-backed RSS MB with {} plugins loaded, {label}", r.plugins),
            r.file_loaded,
            None,
        );
        let per_instance = (r.rss_loaded as f64 - r.rss_released as f64) / r.released.max(1) as f64 / 1024.0;
        Figure::lower("many_plugins", format!("KiB per idle instance, {label}"), per_instance, "KiB")
            .target(150.0)
            .record();
        Figure::lower("many_plugins", format!("load ms of {} plugins, {label}", r.plugins), r.load_ms, "ms")
            .record();
        idle_code_rows.push((label, r.code, r.plugins));
    }
    println!("  (load: wall time of loading every plugin at once; compiles: Cranelift runs; empty: RSS");
    println!("   of the process with the engine and caches, before any plugin; anon / file: RSS loaded,");
    println!("   anonymous and file-backed (mapped compiled artifacts, the binary); heap: Rust heap bytes");
    println!("   live per plugin (loaded - empty, requested sizes); per plugin: (RSS loaded -");
    println!("   empty) / plugins; per instance: RSS freed by releasing the idle instances / instances)");
    print_idle_code(&idle_code_rows);
    if std::env::var("SCENARIOS").is_ok_and(|only| !only.split(',').any(|o| o == "tier-up")) {
        return;
    }
    let tier_up_cache = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let r: TierUpReport = run_child(&exe, "tier-up", tier_up_cache.path(), "distinct, cold, tier-up");
    print_tier_up(&r);
}

/// Runs `scenario` in a child process with compile cache `cache`; its report.
fn run_child<R: serde::de::DeserializeOwned>(exe: &Path, scenario: &str, cache: &Path, label: &str) -> R {
    let out = Command::new(exe)
        .env(SCENARIO, scenario)
        .env(CACHE, cache)
        .output()
        .unwrap_or_else(|e| panic!("running {label}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    if std::env::var_os("MANY_PLUGINS_SMAPS").is_some() {
        eprintln!("{label}:\n{}", String::from_utf8_lossy(&out.stderr));
    }
    let Some(r) = stdout.lines().rev().find_map(|l| serde_json::from_str::<R>(l).ok()) else {
        panic!("{label} failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    };
    r
}

/// The tier-up table (see the header).
fn print_tier_up(r: &TierUpReport) {
    println!();
    println!(
        "{} distinct plugins with tier-up (Winch first, Cranelift in the background), empty compile cache",
        r.plugins
    );
    println!(
        "  {:<24} {:>9} {:>9} {:>10} {:>12} {:>10} {:>10} {:>11} {:>10} {:>10}",
        "scenario",
        "load",
        "on Winch",
        "empty",
        "RSS (Winch)",
        "peak RSS",
        "tier-up",
        "RSS steady",
        "anon",
        "file"
    );
    println!(
        "  {:<24} {:>7.0}ms {:>9} {:>10} {:>12} {:>10} {:>8.1} s {:>11} {:>10} {:>10}",
        "distinct, cold, tier-up",
        r.load_ms,
        format!("{}/{}", r.baseline, r.plugins),
        mib(r.rss_empty),
        mib(r.rss_baseline),
        mib(r.peak),
        r.tier_up_ms / 1e3,
        mib(r.rss_steady),
        mib(r.anon_steady),
        mib(r.file_steady),
    );
    println!("  (load: wall time until every plugin ran its `init` on Winch code; RSS (Winch): every plugin");
    println!("   loaded and reconciled once on Winch code; peak RSS: VmHWM of the whole run; tier-up: from");
    println!("   the first load until every plugin was reconciled on Cranelift code; RSS steady: then)");
    // Issue 31: ≤ 150 MB at the peak, ≤ 100 MB steady, every plugin active.
    record_mb(
        format!("peak RSS MB, {} distinct plugins loading with tier-up", r.plugins),
        r.peak,
        Some(150.0),
    );
    record_mb(
        format!("steady RSS MB, {} distinct plugins after tier-up, each reconciled", r.plugins),
        r.rss_steady,
        Some(100.0),
    );
    Figure::lower(
        "many_plugins",
        format!("load ms of {} distinct plugins, tier-up", r.plugins),
        r.load_ms,
        "ms",
    )
    .record();
}

/// The idle-code table (see the header).
fn print_idle_code(rows: &[(&str, CodeReport, usize)]) {
    let us = |(p50, max): (f64, f64)| format!("{p50:.0} / {max:.0} µs");
    println!();
    println!("Idle code dropped, then the first call of each plugin (p50 / max over the plugins)");
    println!(
        "  {:<16} {:>17} {:>17} {:>8} {:>12} {:>19} {:>14} {:>13}",
        "scenario",
        "warm call",
        "new instance",
        "dropped",
        "RSS dropped",
        "first call",
        "code from",
        "RSS reloaded"
    );
    for (label, c, plugins) in rows {
        println!(
            "  {:<16} {:>17} {:>17} {:>8} {:>12} {:>19} {:>14} {:>13}",
            label,
            us(c.warm_us),
            us(c.new_instance_us),
            format!("{}/{plugins}", c.dropped),
            mib(c.rss_dropped),
            us(c.first_call_us),
            format!("{} cache, {} shared", c.reload_from_cache, c.reload_shared),
            mib(c.rss_reloaded),
        );
        Figure::lower(
            "many_plugins",
            format!("first call µs after idle code was dropped (p50), {label}"),
            c.first_call_us.0,
            "µs",
        )
        .against("warm call", c.warm_us.0)
        .record();
        record_mb(format!("RSS MB with the idle code dropped, {label}"), c.rss_dropped, None);
    }
    println!("  (warm call: an idle instance reused; new instance: the first call after the instances");
    println!("   were released (~instantiation + init); first call: after the code was dropped, the code");
    println!("   loaded again (compile cache, or shared with a copy that loaded it), instantiated, init-ed)");
}
