//! Plugin runtime tests through real compiled guests (`guests/test-plugins/*`).
//!
//! Needs the guests built: `cargo xtask build-guests`. Every test shares one engine
//! (as the host does) and one compile cache directory.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;
use wasmctrl::controller::{Action, ReconcileError, Reconciler, Request};
use wasmctrl::metrics::Metrics;
use wasmctrl::object::{DeletedObject, Object};
use wasmctrl::plugin::{
    CacheReadError, CacheReader, CallError, EngineConfig, FilterInput, Gvk, Permissions, Plugin, PluginEngine,
    PluginEnv, PluginReconciler, PluginSpec, inspect_component,
};

// ---------------------------------------------------------------------------------------
// Fixtures

fn wasm(crate_name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release")
        .join(format!("{}.wasm", crate_name.replace('-', "_")));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; run `cargo xtask build-guests` to build the test plugins", path.display())
    })
}

struct Shared {
    engine: PluginEngine,
    metrics: Arc<Metrics>,
    _cache_dir: tempfile::TempDir,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let metrics = Metrics::new();
        let config = EngineConfig {
            cache_dir: Some(dir.path().to_owned()),
            epoch_tick: Duration::from_millis(2),
            ..Default::default()
        };
        let engine = PluginEngine::new(config, Some(&metrics)).unwrap_or_else(|e| panic!("engine: {e}"));
        Shared { engine, metrics, _cache_dir: dir }
    })
}

fn configmap() -> Gvk {
    Gvk::new("v1", "ConfigMap")
}

fn object(json: &str) -> Arc<Object> {
    Arc::new(Object::from_json(Bytes::from(json.to_owned())).unwrap_or_else(|e| panic!("{e}")))
}

fn cm(ns: &str, name: &str, labels: &str) -> Arc<Object> {
    object(&format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"{ns}","labels":{{{labels}}}}},"data":{{"k":"v"}}}}"#
    ))
}

/// An in-memory cache reader: what an informer's indexer provides, for unit-level tests.
/// Selectors: comma-separated `k=v` / `k` terms only.
#[derive(Default)]
struct MemoryCache {
    objects: RwLock<BTreeMap<String, Arc<Object>>>,
}

impl MemoryCache {
    fn with(objects: impl IntoIterator<Item = Arc<Object>>) -> Arc<Self> {
        let c = MemoryCache::default();
        for o in objects {
            c.objects.write().insert(o.key().to_owned(), o);
        }
        Arc::new(c)
    }
}

impl CacheReader for MemoryCache {
    fn get(&self, key: &str) -> Option<Arc<Object>> {
        self.objects.read().get(key).cloned()
    }

    fn list(&self, namespace: Option<&str>, label_selector: Option<&str>) -> Result<Vec<Arc<Object>>, CacheReadError> {
        let terms: Vec<(&str, Option<&str>)> = label_selector
            .unwrap_or("")
            .split(',')
            .filter(|t| !t.is_empty())
            .map(|t| match t.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (t, None),
            })
            .collect();
        Ok(self
            .objects
            .read()
            .values()
            .filter(|o| namespace.is_none_or(|ns| o.namespace() == Some(ns)))
            .filter(|o| terms.iter().all(|(k, v)| o.label(k).is_some() && v.is_none_or(|v| o.label(k) == Some(v))))
            .cloned()
            .collect())
    }

    fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<Object>>, CacheReadError> {
        match index {
            "namespace" => self.list(Some(value), None),
            "by-app" => Ok(self.objects.read().values().filter(|o| o.label("app") == Some(value)).cloned().collect()),
            other => Err(CacheReadError::UnknownIndex(other.to_owned())),
        }
    }
}

fn env_with(cache: Arc<MemoryCache>) -> PluginEnv {
    let mut caches: HashMap<Gvk, Arc<dyn CacheReader>> = HashMap::new();
    caches.insert(configmap(), cache);
    PluginEnv { caches, kube: None }
}

fn spec(name: &str) -> PluginSpec {
    let mut s = PluginSpec::new(name, configmap());
    s.limits.deadline = Duration::from_millis(500);
    s.limits.memory = 32 << 20;
    s
}

fn load(crate_name: &str, spec: PluginSpec, env: PluginEnv) -> Plugin {
    Plugin::load(&shared().engine, spec, &wasm(crate_name), env).unwrap_or_else(|e| panic!("loading {crate_name}: {e}"))
}

fn req(ns: Option<&str>, name: &str) -> Request {
    Request { namespace: ns.map(str::to_owned), name: name.to_owned() }
}

/// Runs a probe op; returns the payload after `ok:` or the whole `err:...` text.
fn probe(plugin: &Plugin, ns: Option<&str>, op: &str) -> String {
    match plugin.reconcile_blocking(&req(ns, op)) {
        Err(ReconcileError::Terminal(out)) => out,
        other => panic!("probe op {op}: unexpected {other:?}"),
    }
}

fn ok_payload(out: String) -> String {
    out.strip_prefix("ok:").map(str::to_owned).unwrap_or_else(|| panic!("expected ok, got {out}"))
}

fn probe_plugin() -> Plugin {
    let cache = MemoryCache::with([
        cm("default", "cm1", r#""app":"web","tier":"a""#),
        cm("default", "cm2", r#""app":"db""#),
        cm("other", "cm3", r#""app":"web""#),
    ]);
    let mut s = spec("probe");
    s.settings = Bytes::from_static(br#"{"namespaces":["a","b"]}"#);
    load("test-plugin-probe", s, env_with(cache))
}

// ---------------------------------------------------------------------------------------
// Imports

#[test]
fn cache_get_hands_over_the_cached_bytes_unchanged() {
    let original = cm("default", "cm1", r#""app":"web""#);
    let plugin = load("test-plugin-probe", spec("probe-get"), env_with(MemoryCache::with([original.clone()])));
    let got = ok_payload(probe(&plugin, Some("default"), "cache-get|v1|ConfigMap|cm1"));
    assert_eq!(got.as_bytes(), &original.json()[..]);
    assert_eq!(ok_payload(probe(&plugin, Some("default"), "cache-get|v1|ConfigMap|missing")), "none");
}

#[test]
fn cache_list_filters_by_namespace_and_label_selector() {
    let plugin = probe_plugin();
    assert_eq!(ok_payload(probe(&plugin, None, "cache-list|v1|ConfigMap|")), "cm1,cm2,cm3");
    assert_eq!(ok_payload(probe(&plugin, Some("default"), "cache-list|v1|ConfigMap|")), "cm1,cm2");
    assert_eq!(ok_payload(probe(&plugin, None, "cache-list|v1|ConfigMap|app=web")), "cm1,cm3");
    assert_eq!(ok_payload(probe(&plugin, Some("default"), "cache-list|v1|ConfigMap|app=web")), "cm1");
}

#[test]
fn cache_by_index_reads_declared_indexes_and_refuses_unknown_ones() {
    let plugin = probe_plugin();
    assert_eq!(ok_payload(probe(&plugin, None, "cache-by-index|v1|ConfigMap|by-app|web")), "cm1,cm3");
    assert_eq!(ok_payload(probe(&plugin, None, "cache-by-index|v1|ConfigMap|namespace|other")), "cm3");
    let out = probe(&plugin, None, "cache-by-index|v1|ConfigMap|by-nothing|x");
    assert!(out.starts_with("err:invalid:") && out.contains("by-nothing"), "{out}");
}

#[test]
fn config_import_gives_name_and_the_settings_init_saw() {
    let plugin = probe_plugin();
    assert_eq!(ok_payload(probe(&plugin, None, "config")), r#"probe|{"namespaces":["a","b"]}|true"#);
}

#[test]
fn log_import_reports_enabled_and_logs() {
    let plugin = probe_plugin();
    // No subscriber is installed in this test binary: nothing is enabled.
    assert_eq!(ok_payload(probe(&plugin, None, "log|v1|ConfigMap|hello|world")), "false");
}

#[test]
fn client_and_events_without_cluster_access_are_unavailable() {
    let plugin = probe_plugin();
    let out = probe(&plugin, Some("default"), "client-get|v1|ConfigMap|cm1");
    assert!(out.starts_with("err:unavailable:"), "{out}");
    let out = probe(&plugin, Some("default"), "event|v1|ConfigMap|cm1|note");
    assert!(out.starts_with("err:unavailable:"), "{out}");
}

#[test]
fn reconcile_results_map_to_controller_actions() {
    let plugin = probe_plugin();
    assert_eq!(plugin.reconcile_blocking(&req(None, "done")), Ok(Action::Done));
    assert_eq!(plugin.reconcile_blocking(&req(None, "requeue")), Ok(Action::Requeue));
    assert_eq!(
        plugin.reconcile_blocking(&req(None, "requeue-after")),
        Ok(Action::RequeueAfter(Duration::from_millis(1500)))
    );
}

#[test]
fn init_error_rejects_the_plugin() {
    let mut s = spec("probe-reject");
    s.settings = Bytes::from_static(br#"{"reject":true}"#);
    let err = Plugin::load(&shared().engine, s, &wasm("test-plugin-probe"), PluginEnv::default())
        .err()
        .unwrap_or_else(|| panic!("init error must reject the plugin"));
    assert!(err.to_string().contains("settings rejected on purpose"), "{err}");
}

#[test]
fn hooks_reach_the_plugin_in_order() {
    let plugin = probe_plugin();
    assert!(plugin.hooks().on_add && plugin.hooks().map && plugin.hooks().filter);
    let adapter = PluginReconciler::new(plugin.clone()).unwrap_or_else(|e| panic!("{e}"));
    let handler = adapter.event_handler(configmap());
    let a = cm("default", "a", "");
    let b = cm("default", "b", "");
    handler.on_add(&a, true);
    handler.on_update(&a, &b);
    handler.on_delete(&DeletedObject::Known(b.clone()));
    handler.on_delete(&DeletedObject::FinalStateUnknown { key: "default/a".into(), last_known: a.clone() });
    adapter.drain_notifications();
    assert_eq!(
        ok_payload(probe(&plugin, None, "hooks-seen")),
        "add:ConfigMap:a:true,update:ConfigMap:a>b,delete:ConfigMap:b:false,delete:ConfigMap:a:true"
    );
}

#[test]
fn map_and_filter_hooks_answer() {
    let plugin = probe_plugin();
    let adapter = PluginReconciler::new(plugin).unwrap_or_else(|e| panic!("{e}"));
    let ns = Gvk::new("v1", "Namespace");
    assert_eq!(adapter.map(&ns, &cm("team", "x", "")), vec![req(Some("team"), "mapped-x")]);
    assert!(adapter.filter(&configmap(), FilterInput::Create(cm("d", "keep", "").json())));
    assert!(!adapter.filter(&configmap(), FilterInput::Update(cm("d", "a", "").json(), cm("d", "drop-me", "").json())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciler_adapter_runs_calls_off_the_runtime() {
    let adapter = PluginReconciler::new(probe_plugin()).unwrap_or_else(|e| panic!("{e}"));
    let calls = (0..8).map(|_| adapter.reconcile(req(None, "done")));
    for r in futures::future::join_all(calls).await {
        assert_eq!(r, Ok(Action::Done));
    }
    // map under block_in_place from a runtime worker.
    assert_eq!(adapter.map(&configmap(), &cm("n", "o", "")), vec![req(Some("n"), "mapped-o")]);
}

// ---------------------------------------------------------------------------------------
// Permissions

#[test]
fn undeclared_kinds_and_secrets_are_not_readable() {
    let mut s = spec("undeclared-read");
    // Watching Secrets does not make them readable.
    s.permissions = Permissions::new([configmap(), Gvk::new("v1", "Secret")], [], []);
    let plugin = load("test-plugin-undeclared-read", s, env_with(MemoryCache::with([])));
    for (api_version, kind) in [("v1", "Secret"), ("apps/v1", "Deployment")] {
        let out = match plugin.reconcile_blocking(&req(Some(api_version), kind)) {
            Err(ReconcileError::Terminal(out)) => out,
            other => panic!("{other:?}"),
        };
        assert!(
            out.starts_with("cache=forbidden(") && out.contains(";list=forbidden(") && out.contains(";client=forbidden("),
            "{kind}: {out}"
        );
        assert!(out.contains(kind), "the refusal names the kind: {out}");
    }
    // The declared kind is readable (the cache answers, the client has no cluster).
    let out = match plugin.reconcile_blocking(&req(Some("v1"), "ConfigMap")) {
        Err(ReconcileError::Terminal(out)) => out,
        other => panic!("{other:?}"),
    };
    assert!(out.starts_with("cache=ok;list=ok;client=other("), "{out}");
    let metrics = shared().metrics.encode();
    assert!(metrics.contains(r#"wasmctrl_plugin_forbidden_calls_total{plugin="undeclared-read",call="cache.get"}"#), "{metrics}");
}

#[test]
fn declared_secrets_are_readable() {
    let secret = Gvk::new("v1", "Secret");
    let mut s = spec("declared-secret");
    s.permissions = Permissions::new([configmap()], [secret.clone()], []);
    let mut env = env_with(MemoryCache::with([]));
    env.caches.insert(
        secret,
        MemoryCache::with([object(r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x","namespace":"default"}}"#)]),
    );
    let plugin = load("test-plugin-undeclared-read", s, env);
    let out = match plugin.reconcile_blocking(&req(Some("v1"), "Secret")) {
        Err(ReconcileError::Terminal(out)) => out,
        other => panic!("{other:?}"),
    };
    assert!(out.starts_with("cache=ok;list=ok;"), "{out}");
}

#[test]
fn undeclared_kinds_are_not_writable() {
    let mut s = spec("undeclared-write");
    s.permissions = Permissions::new([configmap()], [Gvk::new("v1", "Secret")], [configmap()]);
    let plugin = load("test-plugin-undeclared-write", s, env_with(MemoryCache::with([])));
    assert_eq!(
        plugin.reconcile_blocking(&req(None, "x")),
        Err(ReconcileError::Terminal(["forbidden"; 7].join(",")))
    );
}

// ---------------------------------------------------------------------------------------
// Misbehaviour: the call fails as a panic, the host stays up, a fresh instance serves the
// next call, other plugins keep reconciling.

fn assert_trap_then_recovery(crate_name: &str, name: &str, reason_part: &str) {
    let plugin = load(crate_name, spec(name), env_with(MemoryCache::with([])));
    let bystander = probe_plugin();
    let (trapped, bystander_ok) = std::thread::scope(|s| {
        let t = s.spawn(|| plugin.reconcile_blocking(&req(None, "misbehave")));
        // The other plugin keeps reconciling while this one misbehaves.
        let ok = (0..20).all(|_| bystander.reconcile_blocking(&req(None, "done")) == Ok(Action::Done));
        (t.join().unwrap_or_else(|_| panic!("host thread panicked")), ok)
    });
    assert!(bystander_ok);
    match trapped {
        Err(ReconcileError::Panic(reason)) => {
            assert!(reason.contains(reason_part), "{crate_name}: reason {reason:?} lacks {reason_part:?}")
        }
        other => panic!("{crate_name}: expected a panic, got {other:?}"),
    }
    assert_eq!(plugin.pool_counts(), (0, 0), "the trapped instance was discarded");
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done), "a fresh instance works");
    assert_eq!(plugin.pool_counts(), (1, 1));
    let metrics = shared().metrics.encode();
    assert!(
        metrics.contains(&format!(r#"wasmctrl_plugin_traps_total{{plugin="{name}",call="reconcile"}} 1"#)),
        "{metrics}"
    );
}

#[test]
fn panic_traps_only_that_call() {
    assert_trap_then_recovery("test-plugin-panic", "panic", "boom: plugin panicked on purpose");
}

#[test]
fn infinite_loop_hits_the_deadline() {
    assert_trap_then_recovery("test-plugin-infinite-loop", "infinite-loop", "deadline of 500ms exceeded");
}

#[test]
fn memory_bomb_hits_the_memory_limit() {
    assert_trap_then_recovery("test-plugin-memory-bomb", "memory-bomb", "out of memory");
}

#[test]
fn deep_recursion_overflows_the_stack() {
    assert_trap_then_recovery("test-plugin-deep-recursion", "deep-recursion", "stack overflow");
}

#[test]
fn imports_during_a_trap_work_and_the_next_instance_is_fresh() {
    assert_trap_then_recovery("test-plugin-after-trap", "after-trap", "panic hook ran");
}

#[test]
fn huge_output_is_refused() {
    assert_trap_then_recovery("test-plugin-huge-output", "huge-output", "over the plugin's max-output");
    let plugin = load("test-plugin-huge-output", spec("huge-output-map"), env_with(MemoryCache::with([])));
    match plugin.map_blocking(&configmap(), cm("a", "b", "").json()) {
        Err(CallError::Trap { export: "map", reason, .. }) => assert!(reason.contains("max-output"), "{reason}"),
        other => panic!("expected a refused map, got {other:?}"),
    }
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
}

#[test]
fn reconcile_panic_counts_once_through_the_adapter() {
    let plugin = load("test-plugin-panic", spec("panic-adapter"), env_with(MemoryCache::with([])));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build();
    let rt = rt.unwrap_or_else(|e| panic!("{e}"));
    let adapter = PluginReconciler::new(plugin).unwrap_or_else(|e| panic!("{e}"));
    let r = rt.block_on(adapter.reconcile(req(None, "misbehave")));
    assert!(matches!(r, Err(ReconcileError::Panic(_))), "{r:?}");
    assert_eq!(rt.block_on(adapter.reconcile(req(None, "ok"))), Ok(Action::Done));
}

// ---------------------------------------------------------------------------------------
// Engine, compile cache, inspection

#[test]
fn compile_cache_serves_the_second_load_and_survives_corruption() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = PluginEngine::new(
        EngineConfig { cache_dir: Some(dir.path().to_owned()), pooling: None, ..Default::default() },
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let bytes = wasm("test-plugin-panic");
    let first = engine.load_component(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert!(!first.from_cache);
    let second = engine.load_component(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert!(second.from_cache);
    assert_eq!(first.hash, second.hash);
    let artifacts: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    assert_eq!(artifacts.len(), 1, "{artifacts:?}");
    assert!(artifacts[0].file_name().is_some_and(|n| n.to_string_lossy().starts_with(&first.hash)));
    let hash = first.hash.clone();
    // Components map their artifact: corrupt it as a new file, as a crash mid-write by
    // another tool would leave it (the cache itself only ever renames files into place).
    drop((first, second));
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, b"garbage").unwrap_or_else(|e| panic!("{e}"));
    std::fs::rename(&garbage, &artifacts[0]).unwrap_or_else(|e| panic!("{e}"));
    let third = engine.load_component(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert!(!third.from_cache, "a corrupted artifact is recompiled");
    assert!(engine.load_component(&bytes).unwrap_or_else(|e| panic!("{e}")).from_cache);
}

#[test]
fn inspect_reports_world_and_fit() {
    let report = inspect_component(&shared().engine, &wasm("test-plugin-probe")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.world.as_deref(), Some("wasmctrl:controller/plugin@0.1.0"));
    assert!(report.fits.is_ok(), "{report}");
    assert!(report.imports.iter().any(|i| i == "wasmctrl:controller/cache@0.1.0"), "{report}");
    assert!(report.to_string().contains("fits:    yes"));

    // A core module is not a component.
    let core = b"\0asm\x01\0\0\0";
    let err = inspect_component(&shared().engine, core).err().unwrap_or_else(|| panic!("core module accepted"));
    assert!(err.to_string().contains("not a component"), "{err}");
    // Garbage is refused with an error, not a panic.
    assert!(inspect_component(&shared().engine, b"not wasm at all").is_err());
}

#[test]
fn invalid_bytes_are_refused_at_load() {
    let err = Plugin::load(&shared().engine, spec("broken"), b"\0asm\x0d\0\x01\0", PluginEnv::default())
        .err()
        .unwrap_or_else(|| panic!("broken bytes loaded"));
    assert!(matches!(err, wasmctrl::plugin::PluginError::Compile(_)), "{err}");
}
