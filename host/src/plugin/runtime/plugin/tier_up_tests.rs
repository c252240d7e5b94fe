//! Tier-up through real compiled guests: a cold load serves on Winch code, then on
//! Cranelift code; a warm load never uses Winch; a call in flight during the switch
//! completes; a version dropped before its tier-up leaves nothing behind (but its Winch
//! artifact, which a restart reads back); Winch code is
//! interrupted at its deadline like Cranelift code; a component Winch cannot compile loads
//! with Cranelift; queued tier-ups keep their `.wasm` in an unnamed file and compile it
//! only unchanged; code is never dropped while idle before its tier-up, and code loaded
//! again after a drop is the optimised code (or tiers up again, when the cache lost it).
//!
//! The background compiles are held back by taking every compile permit, so which code
//! serves which call is decided by the test, never by timing. Needs the guests built
//! (`cargo xtask build-guests`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use parking_lot::Mutex;

use super::*;
use crate::object::Object;
use crate::plugin::{CacheReadError, CacheReader, EngineConfig, TierUps};

/// Long enough for any background compile on a loaded machine; never reached when all is well.
const SETTLE: Duration = Duration::from_secs(300);

fn wasm(crate_name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release")
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask build-guests`", path.display()))
}

fn engine(cache: &Path, tier_up: bool) -> PluginEngine {
    let config = EngineConfig {
        cache_dir: Some(cache.to_owned()),
        pooling: None,
        epoch_tick: Duration::from_millis(2),
        tier_up,
        ..EngineConfig::default()
    };
    PluginEngine::new(config, None).unwrap_or_else(|e| panic!("engine: {e}"))
}

fn configmap() -> Gvk {
    Gvk::new("v1", "ConfigMap")
}

fn spec(name: &str) -> PluginSpec {
    let mut s = PluginSpec::new(name, configmap());
    s.limits.deadline = Duration::from_secs(60);
    s
}

fn env(cache: Arc<dyn CacheReader>) -> PluginEnv {
    PluginEnv { caches: HashMap::from([(configmap(), cache)]), kube: None }
}

fn fine() -> Request {
    Request { namespace: None, name: "fine".into() }
}

/// Compiled artifacts in the compile cache directory.
fn artifacts(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter_map(Result::ok).filter(|e| e.path().extension().is_some_and(|x| x == "cwasm")).count()
    })
}

/// The names of the compiled artifacts in the compile cache directory.
fn artifact_names(dir: &Path) -> Vec<String> {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{e}"));
    entries
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cwasm"))
        .collect()
}

/// Whether this process maps a file named `name` (`/proc/self/maps`).
fn mapped(name: &str) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_else(|e| panic!("{e}"));
    !name.is_empty() && maps.lines().any(|l| l.ends_with(&format!("/{name}")))
}

/// The inode of `dir/name`.
fn inode(dir: &Path, name: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}")).ino()
}

/// The unnamed (deleted) files in `dir` this process holds open: their `/proc/self/fd`
/// paths and lengths.
fn unnamed_files_in(dir: &Path) -> Vec<(PathBuf, u64)> {
    let dir = dir.canonicalize().unwrap_or_else(|e| panic!("{e}"));
    let fds = std::fs::read_dir("/proc/self/fd").unwrap_or_else(|e| panic!("{e}"));
    fds.filter_map(Result::ok)
        .filter_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let deleted = target.to_string_lossy().ends_with(" (deleted)");
            let len = std::fs::metadata(fd.path()).ok()?.len();
            (deleted && target.parent() == Some(dir.as_path())).then(|| (fd.path(), len))
        })
        .collect()
}

/// A cache whose `get` blocks until the test lets it return (it reports each entry).
struct BlockingCache {
    entered: Mutex<mpsc::Sender<()>>,
    release: Mutex<mpsc::Receiver<()>>,
}

impl CacheReader for BlockingCache {
    fn get(&self, _key: &str) -> Option<Arc<Object>> {
        let _ = self.entered.lock().send(());
        let _ = self.release.lock().recv();
        None
    }

    fn list(&self, _: Option<&str>, _: Option<&str>) -> Result<Vec<Arc<Object>>, CacheReadError> {
        Ok(Vec::new())
    }

    fn by_index(&self, _: &str, _: &str) -> Result<Vec<Arc<Object>>, CacheReadError> {
        Ok(Vec::new())
    }
}

#[test]
fn a_cold_load_serves_on_winch_code_then_on_cranelift_code() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = engine(dir.path(), true);
    assert!(engine.tier_up_enabled());
    let held = engine.hold_compiles();
    let plugin = Plugin::load(&engine, spec("cold"), &wasm("test-plugin-panic"), PluginEnv::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.tier(), Tier::Baseline);
    assert_eq!(engine.component_loads().baseline, 1);
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 1, optimized: 0 });
    assert_eq!(artifacts(dir.path()), 1, "the Winch artifact is in the compile cache");
    let winch = artifact_names(dir.path()).pop().unwrap_or_default();
    assert!(mapped(&winch), "the Winch code is mapped from its file ({winch}), not copied");

    drop(held);
    assert!(engine.wait_for_tier_ups(SETTLE), "the tier-up did not finish");
    assert_eq!(engine.tier_ups(), TierUps { done: 1, abandoned: 0, failed: 0 });
    assert_eq!(plugin.tier(), Tier::Optimized);
    assert_eq!(plugin.pool_counts(), (0, 0), "the idle Winch instance was dropped");
    for _ in 0..3 {
        assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    }
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 1, optimized: 3 });
    assert_eq!(plugin.pool_counts(), (1, 1), "one Cranelift instance, reused");
    assert_eq!(artifacts(dir.path()), 2, "the Cranelift artifact joins the Winch one in the compile cache");
    assert_eq!(engine.component_loads().compiled, 0, "no load waited for Cranelift");
}

/// A host restarted before a tier-up was done loads the Winch code of the first run from
/// the compile cache: the artifact is read, not compiled and written again.
#[test]
fn a_restart_before_the_tier_up_reads_the_winch_code_from_the_cache() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bytes = wasm("test-plugin-panic");
    let first = engine(dir.path(), true);
    let held = first.hold_compiles();
    let plugin =
        Plugin::load(&first, spec("first"), &bytes, PluginEnv::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.tier(), Tier::Baseline);
    let winch = artifact_names(dir.path());
    assert_eq!(winch.len(), 1, "{winch:?}");
    let before = inode(dir.path(), &winch[0]);
    // The first run ends before its tier-up: no Cranelift artifact.
    drop(plugin);
    drop(held);
    assert!(first.wait_for_tier_ups(SETTLE));
    assert_eq!(first.tier_ups(), TierUps { done: 0, abandoned: 1, failed: 0 });
    drop(first);
    assert_eq!(artifact_names(dir.path()), winch);

    let second = engine(dir.path(), true);
    let held = second.hold_compiles();
    let plugin =
        Plugin::load(&second, spec("second"), &bytes, PluginEnv::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.tier(), Tier::Baseline);
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!(inode(dir.path(), &winch[0]), before, "the same file: read, not stored again");
    assert!(mapped(&winch[0]));
    drop(held);
    assert!(second.wait_for_tier_ups(SETTLE));
    assert_eq!(plugin.tier(), Tier::Optimized);
}

#[test]
fn a_warm_cache_load_never_uses_winch() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bytes = wasm("test-plugin-panic");
    engine(dir.path(), false).load_component(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let engine = engine(dir.path(), true);
    let plugin =
        Plugin::load(&engine, spec("warm"), &bytes, PluginEnv::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.tier(), Tier::Optimized);
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 0, optimized: 1 });
    let loads = engine.component_loads();
    assert_eq!((loads.from_cache, loads.baseline, loads.compiled), (1, 0, 0), "{loads:?}");
    assert!(engine.wait_for_tier_ups(SETTLE));
    assert_eq!(engine.tier_ups(), TierUps::default(), "nothing to tier up");
}

#[test]
fn a_call_in_flight_during_the_switch_completes_on_winch_code_and_its_instance_goes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = engine(dir.path(), true);
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let cache = Arc::new(BlockingCache { entered: Mutex::new(entered_tx), release: Mutex::new(release_rx) });
    let held = engine.hold_compiles();
    let plugin = Plugin::load(&engine, spec("in-flight"), &wasm("test-plugin-probe"), env(cache))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.tier(), Tier::Baseline);
    let slow = std::thread::spawn({
        let plugin = plugin.clone();
        move || {
            let key =
                Request { namespace: Some("default".into()), name: "cache-get|v1|ConfigMap|cm1".into() };
            plugin.reconcile_blocking(&key)
        }
    });
    entered.recv_timeout(SETTLE).unwrap_or_else(|e| panic!("the call never reached the cache: {e}"));
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 1, optimized: 0 });

    drop(held);
    assert!(engine.wait_for_tier_ups(SETTLE), "the tier-up did not finish");
    assert_eq!(plugin.tier(), Tier::Optimized);
    assert_eq!(plugin.pool_counts(), (0, 1), "the busy Winch instance still counts against the pool");
    let requeue = Request { namespace: None, name: "requeue".into() };
    assert_eq!(plugin.reconcile_blocking(&requeue), Ok(Action::Requeue));
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 1, optimized: 1 });

    release.send(()).unwrap_or_else(|e| panic!("{e}"));
    let done = slow.join().unwrap_or_else(|_| panic!("the call in flight panicked"));
    assert_eq!(done, Err(ReconcileError::Terminal("ok:none".into())), "the call in flight completed");
    assert_eq!(plugin.pool_counts(), (1, 1), "the Winch instance was dropped, not returned");
    assert_eq!(engine.live_instances(), 1);
    assert_eq!(plugin.reconcile_blocking(&requeue), Ok(Action::Requeue));
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 1, optimized: 2 });
}

#[test]
fn a_version_dropped_before_its_tier_up_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = engine(dir.path(), true);
    let held = engine.hold_compiles();
    let plugin = Plugin::load(&engine, spec("removed"), &wasm("test-plugin-panic"), PluginEnv::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!((engine.shared_components(), engine.live_instances()), (1, 1));
    drop(plugin);
    drop(held);
    assert!(engine.wait_for_tier_ups(SETTLE), "the tier-up did not settle");
    assert_eq!(engine.tier_ups(), TierUps { done: 0, abandoned: 1, failed: 0 });
    assert_eq!((engine.shared_components(), engine.live_instances()), (0, 0));
    assert_eq!(artifacts(dir.path()), 1, "abandoned before compiling: only the Winch artifact");
}

/// While their tier-ups wait, the plugins' `.wasm` sit end to end in one unnamed file in
/// the compile cache directory, not in the heap; the file is gone once the tier-ups are done.
#[test]
fn queued_tier_ups_keep_their_wasm_in_one_unnamed_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = engine(dir.path(), true);
    let held = engine.hold_compiles();
    let (a, b) = (wasm("test-plugin-panic"), wasm("test-plugin-infinite-loop"));
    let load = |name, bytes: &[u8]| {
        Plugin::load(&engine, spec(name), bytes, PluginEnv::default()).unwrap_or_else(|e| panic!("{e}"))
    };
    let plugins = [load("a", &a), load("b", &b)];
    assert!(plugins.iter().all(|p| p.tier() == Tier::Baseline));
    let spooled = unnamed_files_in(dir.path());
    assert_eq!(spooled.len(), 1, "{spooled:?}");
    assert_eq!(std::fs::read(&spooled[0].0).unwrap_or_else(|e| panic!("{e}")), [a, b].concat());
    drop(held);
    assert!(engine.wait_for_tier_ups(SETTLE));
    assert_eq!(engine.tier_ups(), TierUps { done: 2, abandoned: 0, failed: 0 });
    assert!(plugins.iter().all(|p| p.tier() == Tier::Optimized));
    assert_eq!(unnamed_files_in(dir.path()), [], "closed once every job read its bytes");
}

/// Bytes changed in a queued tier-up's file (the host's uid can still write it through
/// `/proc`) are never compiled: the tier-up fails and the plugin keeps its Winch code.
#[test]
fn a_queued_wasm_changed_on_disk_is_not_compiled() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = engine(dir.path(), true);
    let held = engine.hold_compiles();
    let plugin = Plugin::load(&engine, spec("changed"), &wasm("test-plugin-panic"), PluginEnv::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let spooled = unnamed_files_in(dir.path());
    assert_eq!(spooled.len(), 1, "{spooled:?}");
    let file = std::fs::File::options().write(true).open(&spooled[0].0).unwrap_or_else(|e| panic!("{e}"));
    file.write_all_at(b"\0\0\0\0", spooled[0].1 / 2).unwrap_or_else(|e| panic!("{e}"));
    drop(file);
    drop(held);
    assert!(engine.wait_for_tier_ups(SETTLE));
    assert_eq!(engine.tier_ups(), TierUps { done: 0, abandoned: 0, failed: 1 });
    assert_eq!(plugin.tier(), Tier::Baseline);
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!(artifacts(dir.path()), 1, "only the Winch artifact: nothing was compiled");
}

#[test]
fn winch_code_is_interrupted_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = engine(dir.path(), true);
    let _held = engine.hold_compiles();
    let mut s = spec("loop");
    s.limits.deadline = Duration::from_millis(200);
    let plugin = Plugin::load(&engine, s, &wasm("test-plugin-infinite-loop"), PluginEnv::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.tier(), Tier::Baseline);
    let r = plugin.reconcile_blocking(&Request { namespace: None, name: "misbehave".into() });
    assert!(
        matches!(&r, Err(ReconcileError::Panic(m)) if m.contains("deadline of 200ms exceeded")),
        "epoch interruption stops Winch code too: {r:?}"
    );
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 2, optimized: 0 });
}

/// A component holding one core module whose function makes a tail call (Cranelift
/// supports tail calls, Winch does not).
fn component_with_a_tail_call() -> Vec<u8> {
    use wasm_encoder::{
        CodeSection, Function, FunctionSection, Instruction, Module, ModuleSection, TypeSection, ValType,
    };
    let none: [ValType; 0] = [];
    let mut types = TypeSection::new();
    types.ty().function(none, none);
    let mut functions = FunctionSection::new();
    functions.function(0).function(0);
    let mut code = CodeSection::new();
    let no_locals: [(u32, ValType); 0] = [];
    let mut caller = Function::new(no_locals);
    caller.instruction(&Instruction::ReturnCall(1));
    caller.instruction(&Instruction::End);
    let mut callee = Function::new(no_locals);
    callee.instruction(&Instruction::End);
    code.function(&caller).function(&callee);
    let mut module = Module::new();
    module.section(&types).section(&functions).section(&code);
    let mut component = wasm_encoder::Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

#[test]
fn a_component_winch_cannot_compile_loads_with_cranelift() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = engine(dir.path(), true);
    let bytes = component_with_a_tail_call();
    let shared = engine.shared_component(&bytes).unwrap_or_else(|e| panic!("Cranelift accepts it: {e}"));
    assert_eq!(shared.value().tier(), Tier::Optimized);
    let loads = engine.component_loads();
    assert_eq!((loads.compiled, loads.baseline), (1, 0), "{loads:?}");
    assert!(engine.wait_for_tier_ups(SETTLE));
    assert_eq!(engine.tier_ups(), TierUps::default());
}

#[test]
fn idle_code_waits_for_its_tier_up_and_comes_back_optimised() {
    let (dir, files) = (tempfile::tempdir(), tempfile::tempdir());
    let (dir, files) = (dir.unwrap_or_else(|e| panic!("{e}")), files.unwrap_or_else(|e| panic!("{e}")));
    let config = EngineConfig {
        cache_dir: Some(dir.path().to_owned()),
        pooling: None,
        tier_up: true,
        idle_instance_timeout: Some(Duration::from_secs(3600)),
        idle_code_timeout: Some(Duration::from_secs(3600)),
        ..EngineConfig::default()
    };
    let engine = PluginEngine::new(config, None).unwrap_or_else(|e| panic!("engine: {e}"));
    let later = || std::time::Instant::now() + Duration::from_secs(3600);
    let bytes = wasm("test-plugin-panic");
    let path = files.path().join("plugin.wasm");
    std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{e}"));
    let held = engine.hold_compiles();
    let plugin = Plugin::load_file(&engine, spec("idle"), &path, &bytes, PluginEnv::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.tier(), Tier::Baseline);
    assert_eq!(engine.drop_idle_code_at(later()), 0, "a tier-up is pending: the Winch code stays");
    assert!(plugin.code_resident());
    drop(held);
    assert!(engine.wait_for_tier_ups(SETTLE), "the tier-up did not finish");
    assert_eq!(plugin.tier(), Tier::Optimized);
    assert_eq!(engine.drop_idle_code_at(later()), 1);
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!(
        plugin.calls_by_tier(),
        TierCalls { baseline: 0, optimized: 1 },
        "the Cranelift code, from the cache"
    );
    assert_eq!(plugin.tier(), Tier::Optimized);
    let loads = engine.component_loads();
    assert_eq!((loads.baseline, loads.from_cache, loads.compiled), (1, 1, 0), "{loads:?}");

    // The cache lost the artifact: the file is compiled again, with Winch first, and the
    // plugin tiers up again.
    assert_eq!(engine.drop_idle_code_at(later()), 1);
    for entry in std::fs::read_dir(dir.path()).unwrap_or_else(|e| panic!("{e}")).filter_map(Result::ok) {
        std::fs::remove_file(entry.path()).unwrap_or_else(|e| panic!("{e}"));
    }
    let held = engine.hold_compiles();
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!(plugin.tier(), Tier::Baseline);
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 1, optimized: 1 });
    assert_eq!(engine.drop_idle_code_at(later()), 0, "Winch code again: kept until its tier-up");
    drop(held);
    assert!(engine.wait_for_tier_ups(SETTLE), "the second tier-up did not finish");
    assert_eq!(engine.tier_ups(), TierUps { done: 2, abandoned: 0, failed: 0 });
    assert_eq!(plugin.tier(), Tier::Optimized);
    assert_eq!(plugin.reconcile_blocking(&fine()), Ok(Action::Done));
    assert_eq!(plugin.calls_by_tier(), TierCalls { baseline: 1, optimized: 2 });
    assert_eq!(engine.code_drops(), crate::plugin::CodeDrops { dropped: 2, reloaded: 2 });
}
