//! Plugin runtime tests through real compiled guests (`guests/test-plugins/*`).
//!
//! Needs the guests built: `cargo xtask build-guests`. Every test shares one engine
//! (as the host does) and one compile cache directory.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use wasmctrl::cache::{IndexFunc, Indexer, Writer};
use wasmctrl::controller::{Action, ReconcileError, Reconciler, Request};
use wasmctrl::metrics::Metrics;
use wasmctrl::object::{DeletedObject, Object};
use wasmctrl::plugin::{
    CacheReadError, CacheReader, CallError, CodeDrops, EngineConfig, FilterInput, Gvk, Permissions, Plugin,
    PluginEngine, PluginEnv, PluginReconciler, PluginSpec, Tier, inspect_component,
};
use wasmctrl_testkit::guests::wasm;

// ---------------------------------------------------------------------------------------
// Fixtures

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

/// An informer's indexer holding `objects`, with a `by-app` label index besides the
/// built-in `namespace` one.
fn indexer(objects: impl IntoIterator<Item = Arc<Object>>) -> Arc<Indexer> {
    let idx = Writer::new();
    idx.add_indexers([(
        "by-app".to_owned(),
        IndexFunc::custom(|o: &Object| o.label("app").map(|v| vec![v.to_owned()]).unwrap_or_default()),
    )])
    .unwrap_or_else(|e| panic!("{e}"));
    for o in objects {
        idx.upsert(o);
    }
    Arc::new(idx.reader())
}

fn env_with(cache: Arc<Indexer>) -> PluginEnv {
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
    Plugin::load(&shared().engine, spec, &wasm(crate_name), env)
        .unwrap_or_else(|e| panic!("loading {crate_name}: {e}"))
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
    let cache = indexer([
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
    let plugin = load("test-plugin-probe", spec("probe-get"), env_with(indexer([original.clone()])));
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
    // The instance replacing a trapped one ran init with the settings too.
    assert!(matches!(plugin.reconcile_blocking(&req(None, "panic")), Err(ReconcileError::Panic(_))));
    assert_eq!(ok_payload(probe(&plugin, None, "config")), r#"probe|{"namespaces":["a","b"]}|true"#);
}

#[test]
fn log_import_reports_enabled_and_logs() {
    let plugin = probe_plugin();
    // No subscriber is installed in this test binary: nothing is enabled.
    assert_eq!(ok_payload(probe(&plugin, None, "log|v1|ConfigMap|hello|world")), "false");
}

/// Collects what a subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The JSON lines logged under the guest target.
    fn guest_lines(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .filter(|v| v["target"] == "wasmctrl::plugin::guest")
            .collect()
    }
}

#[test]
fn guest_log_fields_are_event_fields_and_span_fields_are_not_repeated() {
    let plugin = probe_plugin();
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt().json().with_writer(move || writer.clone()).finish();
    tracing::subscriber::with_default(subscriber, || {
        // Outside a reconcile span: the line says which plugin and request it is about.
        assert_eq!(ok_payload(probe(&plugin, Some("ns"), "log|v1|ConfigMap|hello|world")), "true");
        // Inside the controller's span, which already carries them: not repeated.
        let span = tracing::info_span!("reconcile", controller = "probe", request = "ns/x");
        span.in_scope(|| probe(&plugin, Some("ns"), "log|v1|ConfigMap|again|there"));
    });
    let lines = out.guest_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let first = &lines[0]["fields"];
    assert_eq!(first["message"], "hello");
    assert_eq!(first["k"], "world", "{first}");
    assert_eq!(first["plugin"], "probe");
    assert_eq!(first["request"], "ns/log|v1|ConfigMap|hello|world");
    assert!(first.get("fields").is_none(), "{first}");
    let second = &lines[1]["fields"];
    assert_eq!((second["message"].as_str(), second["k"].as_str()), (Some("again"), Some("there")));
    assert!(second.get("plugin").is_none() && second.get("request").is_none(), "{second}");
    assert_eq!(lines[1]["span"]["request"], "ns/x");
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
fn a_component_written_for_another_kind_is_rejected_naming_both() {
    let mut s = spec("probe-kind");
    s.settings = Bytes::from_static(br#"{"for-kind":"apps/v1/Deployment"}"#);
    let err = Plugin::load(&shared().engine, s, &wasm("test-plugin-probe"), PluginEnv::default())
        .err()
        .unwrap_or_else(|| panic!("a kind mismatch must reject the plugin"));
    let text = err.to_string();
    assert!(
        text.contains("written for apps/v1/Deployment") && text.contains("[for] is v1/ConfigMap"),
        "{text}"
    );

    // The kind its TOML names loads.
    let mut s = spec("probe-kind");
    s.settings = Bytes::from_static(br#"{"for-kind":"v1/ConfigMap"}"#);
    Plugin::load(&shared().engine, s, &wasm("test-plugin-probe"), PluginEnv::default())
        .unwrap_or_else(|e| panic!("same kind: {e}"));
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
    assert!(
        !adapter.filter(
            &configmap(),
            FilterInput::Update(cm("d", "a", "").json(), cm("d", "drop-me", "").json())
        )
    );
}

#[test]
fn adapter_is_the_controllers_mapper_and_filter() {
    use wasmctrl::controller::{Filter, FilterEvent, Mapper};
    let adapter = PluginReconciler::new(probe_plugin()).unwrap_or_else(|e| panic!("{e}"));
    let ns_kind = kube::core::GroupVersionKind::gvk("", "v1", "Namespace");
    let obj = cm("team", "x", "");
    assert_eq!(Mapper::map(&*adapter, &ns_kind, &obj), vec![req(Some("team"), "mapped-x")]);
    let cm_kind = kube::core::GroupVersionKind::gvk("", "v1", "ConfigMap");
    assert!(Filter::filter(&*adapter, &cm_kind, FilterEvent::Create(&obj)));
    let dropped = cm("team", "drop-it", "");
    assert!(!Filter::filter(&*adapter, &cm_kind, FilterEvent::Update { old: &obj, new: &dropped }));
    assert!(!Filter::filter(
        &*adapter,
        &cm_kind,
        FilterEvent::Delete(&DeletedObject::Known(dropped.clone()))
    ));
}

#[test]
fn plugins_without_hooks_pass_everything_and_map_nothing() {
    let adapter = PluginReconciler::new(load("test-plugin-panic", spec("no-hooks"), env_with(indexer([]))))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(adapter.plugin().hooks(), Default::default());
    assert!(adapter.map(&configmap(), &cm("a", "b", "")).is_empty());
    assert!(adapter.filter(&configmap(), FilterInput::Create(cm("a", "drop", "").json())));
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
    let plugin = load("test-plugin-undeclared-read", s, env_with(indexer([])));
    for (api_version, kind) in [("v1", "Secret"), ("apps/v1", "Deployment")] {
        let out = match plugin.reconcile_blocking(&req(Some(api_version), kind)) {
            Err(ReconcileError::Terminal(out)) => out,
            other => panic!("{other:?}"),
        };
        assert!(
            out.starts_with("cache=forbidden(")
                && out.contains(";list=forbidden(")
                && out.contains(";client=forbidden("),
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
    assert!(
        metrics
            .contains(r#"wasmctrl_plugin_forbidden_calls_total{plugin="undeclared-read",call="cache.get"}"#),
        "{metrics}"
    );
}

#[test]
fn declared_secrets_are_readable() {
    let secret = Gvk::new("v1", "Secret");
    let mut s = spec("declared-secret");
    s.permissions = Permissions::new([configmap()], [secret.clone()], []);
    let mut env = env_with(indexer([]));
    env.caches.insert(
        secret,
        indexer([object(
            r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x","namespace":"default"}}"#,
        )]),
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
    let plugin = load("test-plugin-undeclared-write", s, env_with(indexer([])));
    assert_eq!(
        plugin.reconcile_blocking(&req(None, "x")),
        Err(ReconcileError::Terminal(["forbidden"; 7].join(",")))
    );
}

// ---------------------------------------------------------------------------------------
// Misbehaviour: the call fails as a panic, the host stays up, a fresh instance serves the
// next call, other plugins keep reconciling.

fn assert_trap_then_recovery(crate_name: &str, name: &str, reason_part: &str) {
    let plugin = load(crate_name, spec(name), env_with(indexer([])));
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
    let mut s = spec("huge-output-map");
    s.limits.deadline = Duration::from_secs(10);
    s.limits.memory = 128 << 20;
    let plugin = load("test-plugin-huge-output", s, env_with(indexer([])));
    match plugin.map_blocking(&configmap(), cm("a", "b", "").json()) {
        Err(CallError::Trap { export: "map", reason, .. }) => {
            assert!(reason.contains("max-output"), "{reason}")
        }
        other => panic!("expected a refused map, got {other:?}"),
    }
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
}

#[test]
fn reconcile_panic_counts_once_through_the_adapter() {
    let plugin = load("test-plugin-panic", spec("panic-adapter"), env_with(indexer([])));
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
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    assert_eq!(artifacts.len(), 1, "{artifacts:?}");
    assert!(artifacts[0].file_name().is_some_and(|n| n.to_string_lossy().starts_with(&first.hash)));
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
fn concurrent_loads_of_the_same_bytes_compile_once_and_share_the_code() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let engine = PluginEngine::new(
        EngineConfig { cache_dir: Some(dir.path().to_owned()), pooling: None, ..Default::default() },
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let bytes = Arc::new(wasm("test-plugin-panic"));
    let copies = 8;
    let start = Arc::new(std::sync::Barrier::new(copies));
    let loads: Vec<_> = (0..copies)
        .map(|i| {
            let (engine, bytes, start) = (engine.clone(), bytes.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                Plugin::load(&engine, spec(&format!("copy-{i}")), &bytes, env_with(indexer([])))
                    .unwrap_or_else(|e| panic!("copy {i}: {e}"))
            })
        })
        .collect();
    let plugins: Vec<Plugin> =
        loads.into_iter().map(|t| t.join().unwrap_or_else(|_| panic!("load thread panicked"))).collect();
    let loads = engine.component_loads();
    assert_eq!(
        (loads.compiled, loads.from_cache, loads.shared),
        (1, 0, copies as u64 - 1),
        "one compile for {copies} concurrent copies: {loads:?}"
    );
    assert_eq!(engine.shared_components(), 1);
    for p in &plugins {
        assert_eq!(p.reconcile_blocking(&req(None, "fine")), Ok(Action::Done), "{}", p.name());
    }
    // A copy loaded later, while the others live, shares their code too.
    let late =
        Plugin::load(&engine, spec("late"), &bytes, env_with(indexer([]))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(engine.component_loads().shared, copies as u64);
    // Once no plugin uses the code, it is let go; the next load reads the compile cache.
    drop((plugins, late));
    assert_eq!(engine.shared_components(), 0);
    let again =
        Plugin::load(&engine, spec("again"), &bytes, env_with(indexer([]))).unwrap_or_else(|e| panic!("{e}"));
    let loads = engine.component_loads();
    assert_eq!((loads.compiled, loads.from_cache), (1, 1), "{loads:?}");
    assert_eq!(again.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
}

#[test]
fn idle_instances_are_released_and_the_next_call_instantiates_anew() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = |idle: Duration| EngineConfig {
        cache_dir: Some(dir.path().to_owned()),
        idle_instance_timeout: Some(idle),
        ..Default::default()
    };
    let bytes = wasm("test-plugin-panic");

    // Released by an explicit sweep at a chosen time: an hour's timeout never fires here.
    let hour = Duration::from_secs(3600);
    let engine = PluginEngine::new(config(hour), None).unwrap_or_else(|e| panic!("{e}"));
    let plugin =
        Plugin::load(&engine, spec("idle"), &bytes, env_with(indexer([]))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
    assert_eq!((plugin.pool_counts(), engine.live_instances()), ((1, 1), 1));
    let now = std::time::Instant::now();
    assert_eq!(engine.release_idle_instances_at(now), 0, "not idle for an hour yet");
    assert_eq!(engine.release_idle_instances_at(now + hour), 1);
    assert_eq!((plugin.pool_counts(), engine.live_instances()), ((0, 0), 0));
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done), "re-instantiated");
    assert_eq!((plugin.pool_counts(), engine.live_instances()), ((1, 1), 1));
    drop((plugin, engine));

    // Released by the engine's own reaper after a short configured timeout.
    let engine = PluginEngine::new(config(Duration::from_millis(20)), None).unwrap_or_else(|e| panic!("{e}"));
    let plugin =
        Plugin::load(&engine, spec("idle"), &bytes, env_with(indexer([]))).unwrap_or_else(|e| panic!("{e}"));
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    // The reaper updates the pool's counts, then tears the store down outside the pool's
    // lock: the live-instance gauge drops a moment after the counts do.
    while plugin.pool_counts() != (0, 0) || engine.live_instances() != 0 {
        assert!(std::time::Instant::now() < give_up, "the idle instance was never released");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(engine.live_instances(), 0);
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
}

#[test]
fn an_unwritable_compile_cache_does_not_stop_loading() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let not_a_dir = dir.path().join("file");
    std::fs::write(&not_a_dir, b"").unwrap_or_else(|e| panic!("{e}"));
    let engine = PluginEngine::new(
        EngineConfig { cache_dir: Some(not_a_dir.join("cache")), pooling: None, ..Default::default() },
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let plugin = Plugin::load(&engine, spec("uncached"), &wasm("test-plugin-panic"), env_with(indexer([])))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
}

#[test]
fn inspect_reports_world_and_fit() {
    let report =
        inspect_component(&shared().engine, &wasm("test-plugin-probe")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.world.as_deref(), Some("wasmctrl:controller/plugin@0.2.1"));
    assert!(report.fits.is_ok(), "{report}");
    assert!(report.imports.iter().any(|i| i == "wasmctrl:controller/cache@0.2.1"), "{report}");
    assert!(report.to_string().contains("fits:    yes"));

    // A core module is not a component.
    let core = b"\0asm\x01\0\0\0";
    let err =
        inspect_component(&shared().engine, core).err().unwrap_or_else(|| panic!("core module accepted"));
    assert!(err.to_string().contains("not a component"), "{err}");
    // Garbage is refused with an error, not a panic.
    assert!(inspect_component(&shared().engine, b"not wasm at all").is_err());
}

#[test]
fn a_component_of_another_world_is_refused() {
    // The smallest valid component: it exports nothing, so not the reconciler.
    let empty_component = b"\0asm\x0d\0\x01\0";
    let err = Plugin::load(&shared().engine, spec("other-world"), empty_component, PluginEnv::default())
        .err()
        .unwrap_or_else(|| panic!("a component without the reconciler export loaded"));
    assert!(matches!(err, wasmctrl::plugin::PluginError::Incompatible { .. }), "{err}");
    assert!(err.to_string().contains("wasmctrl:controller/reconciler"), "{err}");
    let report = inspect_component(&shared().engine, empty_component).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.world, None);
    assert!(report.fits.is_err(), "{report}");
}

/// A component importing `interface` as an instance with one function `handle: func()`
/// (and exporting nothing).
fn component_importing(interface: &str) -> Vec<u8> {
    use wasm_encoder::{
        Component, ComponentImportSection, ComponentTypeRef, ComponentTypeSection, InstanceType,
    };
    let mut instance = InstanceType::new();
    instance
        .ty()
        .function()
        .params(std::iter::empty::<(&str, wasm_encoder::ComponentValType)>())
        .result(None);
    instance.export("handle", ComponentTypeRef::Func(0));
    let mut types = ComponentTypeSection::new();
    types.instance(&instance);
    let mut imports = ComponentImportSection::new();
    imports.import(interface, ComponentTypeRef::Instance(0));
    let mut component = Component::new();
    component.section(&types).section(&imports);
    component.finish()
}

#[test]
fn a_component_importing_ungranted_wasi_is_refused_naming_the_interface() {
    for interface in ["wasi:http/outgoing-handler@0.2.0", "wasi:keyvalue/store@0.2.0-draft"] {
        let wasm = component_importing(interface);
        let err = Plugin::load(&shared().engine, spec("wants-more"), &wasm, PluginEnv::default())
            .err()
            .unwrap_or_else(|| panic!("a component importing {interface} loaded"));
        assert!(matches!(err, wasmctrl::plugin::PluginError::Ungranted { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("plugin wants-more imports") && text.contains(interface), "{text}");
        assert!(text.contains("does not grant"), "{text}");

        let report = inspect_component(&shared().engine, &wasm).unwrap_or_else(|e| panic!("{e}"));
        let why = report.fits.as_ref().err().unwrap_or_else(|| panic!("fits: {report}"));
        assert!(why.contains(interface) && why.contains("does not grant"), "{why}");
    }
    // An interface the language runtimes import is linked (granting nothing): the component
    // is refused only for not being a plugin, by wasmtime's type check.
    let wasm = component_importing("wasi:sockets/tcp-create-socket@0.2.0");
    let err = Plugin::load(&shared().engine, spec("runtime-import"), &wasm, PluginEnv::default())
        .err()
        .unwrap_or_else(|| panic!("a component without the reconciler export loaded"));
    assert!(!matches!(err, wasmctrl::plugin::PluginError::Ungranted { .. }), "{err}");
}

#[test]
fn invalid_bytes_are_refused_at_load() {
    let err =
        Plugin::load(&shared().engine, spec("broken"), b"\0asm\x0d\0\x01\0\xff\xff", PluginEnv::default())
            .err()
            .unwrap_or_else(|| panic!("broken bytes loaded"));
    assert!(matches!(err, wasmctrl::plugin::PluginError::Compile(_)), "{err}");
}

// ---------------------------------------------------------------------------------------
// Against a live API server of either test backend (see `wasmctrl-testkit`): a live informer
// cache and the client/events imports, in the test's own namespace.

mod live {
    use super::*;
    use kube::api::{Api, DynamicObject};
    use wasmctrl::cache::IndexSpec;
    use wasmctrl::informer::{FactoryOptions, InformerFactory, InformerSpec};
    use wasmctrl::plugin::KubeServices;
    use wasmctrl_testkit::TestCluster;

    /// The objects the test starts with, in namespace NS.
    const SEED: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: seed, namespace: NS, labels: {app: web}}
data: {k: v}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: other, namespace: NS, labels: {app: db}}
data: {k: v}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: NS}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
"#;

    /// Runs a probe op on a blocking thread (the probe blocks on the runtime).
    async fn run(plugin: &Plugin, ns: Option<&str>, op: String) -> String {
        let p = plugin.clone();
        let ns = ns.map(str::to_owned);
        tokio::task::spawn_blocking(move || probe(&p, ns.as_deref(), &op))
            .await
            .unwrap_or_else(|e| panic!("probe task: {e}"))
    }

    fn ok(out: String) -> serde_json::Value {
        serde_json::from_str(&ok_payload(out)).unwrap_or_else(|e| panic!("not JSON: {e}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_import_against_a_live_cache_and_the_dev_cluster() {
        let cluster = TestCluster::start().await.unwrap_or_else(|e| panic!("test cluster: {e}"));
        let client = cluster.client();
        let ns = cluster.namespace().await.unwrap_or_else(|e| panic!("namespace: {e}"));
        let ns = ns.as_str();
        cluster.apply_yaml(&SEED.replace("NS", ns)).await.unwrap_or_else(|e| panic!("seed: {e}"));

        // A live informer cache of the namespace's ConfigMaps with a label index.
        let factory = InformerFactory::new(client.clone(), FactoryOptions::default());
        let lease = factory
            .informer(
                InformerSpec::new("v1", "ConfigMap")
                    .namespace(ns)
                    .index("by-app", IndexSpec::Label("app".into())),
            )
            .await
            .unwrap_or_else(|e| panic!("informer: {e}"));
        lease.wait_for_sync().await;

        let deployment = Gvk::new("apps/v1", "Deployment");
        let mut s = spec("probe-live");
        s.limits.deadline = Duration::from_secs(10);
        s.field_manager = "wasmctrl-probe-live".into();
        s.permissions =
            Permissions::new([configmap()], [deployment.clone()], [configmap(), deployment.clone()]);
        let env = PluginEnv {
            caches: [(configmap(), Arc::new(lease.informer().indexer()) as Arc<dyn CacheReader>)]
                .into_iter()
                .collect(),
            kube: Some(KubeServices::new(client.clone(), tokio::runtime::Handle::current(), "plugin-test")),
        };
        let wasm = wasm("test-plugin-probe");
        let engine = shared().engine.clone();
        let plugin = tokio::task::spawn_blocking(move || Plugin::load(&engine, s, &wasm, env))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("load: {e}"));
        let d = Some(ns);

        // cache: get (the informer's bytes), list with selector, by-index, bad selector.
        let cached = lease
            .informer()
            .indexer()
            .get(&format!("{ns}/seed"))
            .unwrap_or_else(|| panic!("seed not cached"));
        let got = ok_payload(run(&plugin, d, "cache-get|v1|ConfigMap|seed".into()).await);
        assert_eq!(got.as_bytes(), &cached.json()[..]);
        assert_eq!(ok_payload(run(&plugin, d, "cache-list|v1|ConfigMap|app=web".into()).await), "seed");
        assert_eq!(
            ok_payload(run(&plugin, None, "cache-by-index|v1|ConfigMap|by-app|db".into()).await),
            "other"
        );
        let out = run(&plugin, d, "cache-list|v1|ConfigMap|app in (a".into()).await;
        assert!(out.starts_with("err:invalid:"), "{out}");

        // client.get
        assert_eq!(ok(run(&plugin, d, "client-get|v1|ConfigMap|seed".into()).await)["data"]["k"], "v");
        let out = run(&plugin, d, "client-get|v1|ConfigMap|missing".into()).await;
        assert!(out.starts_with("err:not-found:"), "{out}");

        // client.create, twice
        let obj = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"made","namespace":"{ns}"}},"data":{{"a":"1"}}}}"#
        );
        let created = ok(run(&plugin, d, format!("client-create|v1|ConfigMap|{obj}")).await);
        assert_eq!(created["metadata"]["name"], "made");
        let out = run(&plugin, d, format!("client-create|v1|ConfigMap|{obj}")).await;
        assert!(out.starts_with("err:already-exists:"), "{out}");

        // client.replace: compare-and-swap on resourceVersion
        let stale = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"made","namespace":"{ns}","resourceVersion":"1"}},"data":{{"a":"2"}}}}"#
        );
        let out = run(&plugin, d, format!("client-replace|v1|ConfigMap|{stale}")).await;
        assert!(out.starts_with("err:conflict:"), "{out}");
        let rv = created["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_owned();
        let fresh = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"made","namespace":"{ns}","resourceVersion":"{rv}"}},"data":{{"a":"2"}}}}"#
        );
        assert_eq!(
            ok(run(&plugin, d, format!("client-replace|v1|ConfigMap|{fresh}")).await)["data"]["a"],
            "2"
        );

        // client.patch: merge and JSON patch
        let patched =
            ok(run(&plugin, d, r#"client-patch|v1|ConfigMap|made|{"data":{"b":"3"}}"#.into()).await);
        assert_eq!(patched["data"]["b"], "3");
        let patched = ok(run(
            &plugin,
            d,
            r#"client-patch|v1|ConfigMap|made|json:[{"op":"add","path":"/data/c","value":"4"}]"#.into(),
        )
        .await);
        assert_eq!(patched["data"]["c"], "4");
        let out = run(&plugin, d, "client-patch|v1|ConfigMap|made|not json".into()).await;
        assert!(out.starts_with("err:invalid:"), "{out}");

        // client.apply: server-side apply with the plugin's field manager
        let applied = format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"applied","namespace":"{ns}"}},"data":{{"x":"1"}}}}"#
        );
        let out = ok(run(&plugin, d, format!("client-apply|v1|ConfigMap|{applied}|force")).await);
        assert_eq!(out["data"]["x"], "1");
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            ns,
            &kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("", "v1", "ConfigMap")),
        );
        let stored = api.get("applied").await.unwrap_or_else(|e| panic!("{e}"));
        let managers: Vec<String> = stored
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect();
        assert!(managers.iter().any(|m| m == "wasmctrl-probe-live"), "managers: {managers:?}");

        // status subresource of a writable kind
        let out = run(
            &plugin,
            d,
            r#"client-patch-status|apps/v1|Deployment|web|{"status":{"observedGeneration":7}}"#.into(),
        )
        .await;
        assert_eq!(ok(out)["status"]["observedGeneration"], 7);
        let live = ok(run(&plugin, d, "client-get|apps/v1|Deployment|web".into()).await);
        let mut with_status = live.clone();
        with_status["status"]["observedGeneration"] = serde_json::json!(8);
        let out = run(&plugin, d, format!("client-update-status|apps/v1|Deployment|{with_status}")).await;
        assert_eq!(ok(out)["status"]["observedGeneration"], 8);

        // client.delete with preconditions
        let out = run(&plugin, d, "client-delete|v1|ConfigMap|made|uid=not-the-uid".into()).await;
        assert!(out.starts_with("err:conflict:"), "{out}");
        assert_eq!(ok_payload(run(&plugin, d, "client-delete|v1|ConfigMap|made".into()).await), "");
        let out = run(&plugin, d, "client-delete|v1|ConfigMap|made".into()).await;
        assert!(out.starts_with("err:not-found:"), "{out}");

        // Undeclared writes never reach the server.
        let secret =
            format!(r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"s","namespace":"{ns}"}}}}"#);
        let out = run(&plugin, d, format!("client-create|v1|Secret|{secret}")).await;
        assert!(out.starts_with("err:forbidden:"), "{out}");

        // events.publish: recorded asynchronously as an events.k8s.io/v1 Event.
        assert_eq!(
            ok_payload(run(&plugin, d, "event|v1|ConfigMap|seed|something happened".into()).await),
            ""
        );
        let events: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            ns,
            &kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
                "events.k8s.io",
                "v1",
                "Event",
            )),
        );
        let mut found = None;
        for _ in 0..200 {
            let list = events.list(&Default::default()).await.unwrap_or_else(|e| panic!("{e}"));
            if let Some(e) = list.items.into_iter().find(|e| e.data["reason"] == "Probed") {
                found = Some(e);
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let event = found.unwrap_or_else(|| panic!("the event was never recorded"));
        assert_eq!(event.data["note"], "something happened");
        assert_eq!(event.data["regarding"]["name"], "seed");
        assert_eq!(event.data["reportingController"], "wasmctrl/probe-live");
        drop(lease);
        drop(cluster);
    }
}

// ---------------------------------------------------------------------------------------
// Idle code

/// An engine with its own compile cache in `dir`, idle instances and idle code after
/// `idle` (an hour: only explicit sweeps release anything).
fn idle_engine(dir: &std::path::Path, idle: Duration) -> PluginEngine {
    let config = EngineConfig {
        cache_dir: Some(dir.to_owned()),
        epoch_tick: Duration::from_millis(2),
        idle_instance_timeout: Some(idle),
        idle_code_timeout: Some(idle),
        ..Default::default()
    };
    PluginEngine::new(config, None).unwrap_or_else(|e| panic!("{e}"))
}

/// `crate_name`'s `.wasm` copied to `dir/<name>.wasm` (the plugin's file).
fn wasm_file(dir: &std::path::Path, crate_name: &str) -> (PathBuf, Vec<u8>) {
    let bytes = wasm(crate_name);
    let path = dir.join(format!("{crate_name}.wasm"));
    std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{e}"));
    (path, bytes)
}

fn load_file(engine: &PluginEngine, name: &str, path: &std::path::Path, bytes: &[u8]) -> Plugin {
    Plugin::load_file(engine, spec(name), path, bytes, env_with(indexer([])))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Removes every compiled artifact from the compile cache directory; how many.
fn clear_compile_cache(dir: &std::path::Path) -> usize {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{e}"));
    let artifacts: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .collect();
    for p in &artifacts {
        std::fs::remove_file(p).unwrap_or_else(|e| panic!("{e}"));
    }
    artifacts.len()
}

const HOUR: Duration = Duration::from_secs(3600);

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn idle_code_is_dropped_and_the_next_call_loads_it_from_the_compile_cache() {
    let (cache, files) = (tempdir(), tempdir());
    let engine = idle_engine(cache.path(), HOUR);
    let (path, bytes) = wasm_file(files.path(), "test-plugin-panic");
    let plugin = load_file(&engine, "idle-code", &path, &bytes);
    let before_call = std::time::Instant::now();
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
    assert_eq!(engine.drop_idle_code_at(before_call + HOUR), 0, "a call came since: kept");
    assert!(plugin.code_resident());

    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 1);
    assert!(!plugin.code_resident());
    assert_eq!((plugin.pool_counts(), engine.live_instances()), ((0, 0), 0), "its instances went too");
    assert_eq!(engine.shared_components(), 0, "no plugin holds the compiled code any more");
    assert_eq!(engine.code_drops(), CodeDrops { dropped: 1, reloaded: 0 });
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 0, "nothing left to drop");

    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done), "loaded again");
    assert!(plugin.code_resident());
    assert_eq!(plugin.tier(), Tier::Optimized);
    assert_eq!(engine.code_drops(), CodeDrops { dropped: 1, reloaded: 1 });
    let loads = engine.component_loads();
    assert_eq!((loads.compiled, loads.from_cache, loads.shared), (1, 1, 0), "read from the cache: {loads:?}");
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
    assert_eq!(engine.code_drops().reloaded, 1, "loaded once, then resident");

    // A trap after a reload discards the instance as usual; the code stays.
    assert!(matches!(plugin.reconcile_blocking(&req(None, "misbehave")), Err(ReconcileError::Panic(_))));
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
    assert_eq!(engine.code_drops().reloaded, 1);
}

#[test]
fn code_shared_with_a_plugin_still_using_it_stays_and_is_shared_again() {
    let (cache, files) = (tempdir(), tempdir());
    let engine = idle_engine(cache.path(), HOUR);
    let (path, bytes) = wasm_file(files.path(), "test-plugin-panic");
    let idle = load_file(&engine, "idle", &path, &bytes);
    // Loaded from bytes alone: nothing to fall back on, so it keeps its code.
    let busy =
        Plugin::load(&engine, spec("busy"), &bytes, env_with(indexer([]))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 1);
    assert!(!idle.code_resident() && busy.code_resident());
    assert_eq!(engine.shared_components(), 1, "the other plugin still uses the compiled code");
    assert_eq!(idle.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
    let loads = engine.component_loads();
    assert_eq!(
        (loads.compiled, loads.from_cache, loads.shared),
        (1, 0, 2),
        "reused, not reloaded: {loads:?}"
    );
}

#[test]
fn concurrent_first_calls_after_a_drop_wait_for_one_load() {
    let (cache, files) = (tempdir(), tempdir());
    let engine = idle_engine(cache.path(), HOUR);
    let (path, bytes) = wasm_file(files.path(), "test-plugin-panic");
    let plugins: Vec<Plugin> = (0..2)
        .map(|i| {
            let mut s = spec(&format!("copy-{i}"));
            s.concurrency = 4;
            Plugin::load_file(&engine, s, &path, &bytes, env_with(indexer([])))
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 2);
    assert_eq!(engine.shared_components(), 0);
    let calls_per_plugin = 4;
    let start = Arc::new(std::sync::Barrier::new(2 * calls_per_plugin));
    let threads: Vec<_> = plugins
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), calls_per_plugin))
        .map(|p| {
            let start = start.clone();
            std::thread::spawn(move || {
                start.wait();
                p.reconcile_blocking(&req(None, "fine"))
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap_or_else(|_| panic!("call thread panicked")), Ok(Action::Done));
    }
    assert_eq!(engine.code_drops().reloaded, 2, "one reload per plugin");
    let loads = engine.component_loads();
    assert_eq!(
        (loads.compiled, loads.from_cache, loads.shared),
        (1, 1, 2),
        "one cache read for both plugins (and the second copy's first load shared): {loads:?}"
    );
}

#[test]
fn a_compile_cache_that_lost_the_code_reads_the_file_again_if_unchanged() {
    let (cache, files) = (tempdir(), tempdir());
    let engine = idle_engine(cache.path(), HOUR);
    let (path, bytes) = wasm_file(files.path(), "test-plugin-panic");
    let plugin = load_file(&engine, "lost", &path, &bytes);
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 1);
    assert_eq!(clear_compile_cache(cache.path()), 1);
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done), "compiled from the file");
    let loads = engine.component_loads();
    assert_eq!((loads.compiled, loads.from_cache), (2, 0), "{loads:?}");

    // The file changed since the load (its new version is on its way) and the cache lost
    // the code again: the call fails, retryably, naming the file; the plugin stays usable.
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 1);
    assert_eq!(clear_compile_cache(cache.path()), 1);
    std::fs::write(&path, wasm("test-plugin-probe")).unwrap_or_else(|e| panic!("{e}"));
    match plugin.reconcile_blocking(&req(None, "fine")) {
        Err(ReconcileError::Retryable(m)) => assert!(m.contains("changed since the load"), "{m}"),
        other => panic!("expected a retryable failure, got {other:?}"),
    }
    assert!(!plugin.code_resident());
    assert_eq!(plugin.pool_counts(), (0, 0), "the failed load freed its slot");
    std::fs::write(&path, &bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done), "retried");
    assert_eq!(engine.code_drops(), CodeDrops { dropped: 2, reloaded: 2 });
}

/// A cache whose `get` blocks until the test lets it return (it reports each entry).
struct BlockingCache {
    entered: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl CacheReader for BlockingCache {
    fn get(&self, _key: &str) -> Option<Arc<Object>> {
        let _ = self.entered.lock().map(|tx| tx.send(()));
        let _ = self.release.lock().map(|rx| rx.recv());
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
fn a_call_in_flight_keeps_the_code() {
    let (cache, files) = (tempdir(), tempdir());
    let engine = idle_engine(cache.path(), HOUR);
    let (path, bytes) = wasm_file(files.path(), "test-plugin-probe");
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let blocking = Arc::new(BlockingCache {
        entered: std::sync::Mutex::new(entered_tx),
        release: std::sync::Mutex::new(release_rx),
    });
    let mut caches: HashMap<Gvk, Arc<dyn CacheReader>> = HashMap::new();
    caches.insert(configmap(), blocking);
    let mut s = spec("in-flight");
    s.limits.deadline = Duration::from_secs(60);
    let plugin = Plugin::load_file(&engine, s, &path, &bytes, PluginEnv { caches, kube: None })
        .unwrap_or_else(|e| panic!("{e}"));
    let slow = std::thread::spawn({
        let plugin = plugin.clone();
        move || plugin.reconcile_blocking(&req(Some("default"), "cache-get|v1|ConfigMap|cm1"))
    });
    entered
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("the call never reached the cache: {e}"));
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 0, "a call is under way");
    assert!(plugin.code_resident());
    release.send(()).unwrap_or_else(|e| panic!("{e}"));
    let done = slow.join().unwrap_or_else(|_| panic!("the call in flight panicked"));
    assert_eq!(done, Err(ReconcileError::Terminal("ok:none".into())), "the call in flight completed");
    assert_eq!(engine.code_drops().dropped, 0);
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 1, "idle now");
}

#[test]
fn the_engine_drops_idle_code_on_its_own_after_the_timeout() {
    let (cache, files) = (tempdir(), tempdir());
    let engine = idle_engine(cache.path(), Duration::from_millis(50));
    let (path, bytes) = wasm_file(files.path(), "test-plugin-panic");
    let plugin = load_file(&engine, "swept", &path, &bytes);
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    // The reaper takes the code out, then counts the drop: wait for both.
    while plugin.code_resident() || engine.code_drops().dropped == 0 {
        assert!(std::time::Instant::now() < give_up, "the idle code was never dropped");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(engine.code_drops().dropped, 1);
    assert_eq!(plugin.reconcile_blocking(&req(None, "fine")), Ok(Action::Done));
    assert_eq!(engine.code_drops().reloaded, 1);
}

#[test]
fn plugins_without_a_file_or_an_idle_code_timeout_keep_their_code() {
    let (cache, files) = (tempdir(), tempdir());
    let (path, bytes) = wasm_file(files.path(), "test-plugin-panic");
    let engine = idle_engine(cache.path(), HOUR);
    let from_bytes =
        Plugin::load(&engine, spec("bytes"), &bytes, env_with(indexer([]))).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 0);
    assert!(from_bytes.code_resident());
    drop((from_bytes, engine));
    let config = EngineConfig {
        cache_dir: Some(cache.path().to_owned()),
        idle_instance_timeout: Some(HOUR),
        ..Default::default()
    };
    let engine = PluginEngine::new(config, None).unwrap_or_else(|e| panic!("{e}"));
    let plugin = load_file(&engine, "kept", &path, &bytes);
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + 100 * HOUR), 0, "no idle-code timeout");
    assert!(plugin.code_resident());
    drop((plugin, engine));

    // Code the compile cache does not have (it would cost a compile to get back) is kept.
    let engine = idle_engine(cache.path(), HOUR);
    let plugin = load_file(&engine, "uncached", &path, &bytes);
    assert_eq!(clear_compile_cache(cache.path()), 1);
    assert_eq!(engine.drop_idle_code_at(std::time::Instant::now() + HOUR), 0);
    assert!(plugin.code_resident());
}
