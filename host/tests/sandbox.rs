//! The sandbox as a security boundary against a plugin author with bad intent: one test per
//! attack of `guests/test-plugins/adv-*`, each in a host (the plugin manager, as `wasmctrl
//! run` runs it) on a Kubernetes API server of either test backend (the dev cluster, or a
//! real kube-apiserver with `WASMCTRL_TEST_BACKEND=real`; see `wasmctrl-testkit`), beside
//! `sandbox-bystander`, a plugin that behaves. Each test asserts that the attack is refused
//! with a clear error, and that the bystander's reconciles, writes, Events and log lines go
//! through after it as before (and its reconciles never fail).
//!
//! The adversarial plugins report what they got as guest log lines (`outcome`, with `step`
//! and `result`), which a tracing layer records; the tests wait for those lines, for metrics
//! and for objects on the API server, never for a fixed time.
//!
//! Needs the guests built: `cargo xtask build-guests`.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DynamicObject, PostParams};
use parking_lot::Mutex;
use tracing_subscriber::layer::SubscriberExt;
use wasmctrl::cache::Writer;
use wasmctrl::controller::{Action, Request};
use wasmctrl::informer::{FactoryOptions, InformerFactory, InformerSpec};
use wasmctrl::metrics::Metrics;
use wasmctrl::object::Object;
use wasmctrl::plugin::{
    CacheReader, EngineConfig, FilterInput, Gvk, Permissions, Plugin, PluginEngine, PluginEnv,
    PluginReconciler, PluginSpec,
};
use wasmctrl::reload::ManagerOptions;
use wasmctrl_testkit::TestCluster;
use wasmctrl_testkit::guests::wasm;

// This suite reads the fields one by one; the shared renderer goes unused here.
#[allow(dead_code)]
#[path = "common/guest_log.rs"]
mod guest_log;
#[allow(dead_code)]
#[path = "common/host.rs"]
mod host;

use host::{HostSetup, PluginsDir, TestHost};

/// Bound on every wait for the system to get somewhere (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(120);

const BYSTANDER: &str = "sandbox-bystander";

// ---------------------------------------------------------------------------------------
// What the host logs

/// One guest log line: the plugin that logged it, its message and its own fields.
#[derive(Clone, Debug)]
struct GuestLine {
    plugin: String,
    message: String,
    fields: BTreeMap<String, String>,
}

/// One warning or error the host logged: its message and fields.
#[derive(Clone, Debug)]
struct HostLine {
    message: String,
    fields: BTreeMap<String, String>,
}

static GUEST_LINES: Mutex<Vec<GuestLine>> = Mutex::new(Vec::new());
static HOST_LINES: Mutex<Vec<HostLine>> = Mutex::new(Vec::new());

/// Records the host's own warnings and errors (`wasmctrl` targets).
struct HostWarnings;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for HostWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > tracing::Level::WARN || !meta.target().starts_with("wasmctrl") {
            return;
        }
        let mut fields = guest_log::Fields::default();
        event.record(&mut fields);
        let mut fields: BTreeMap<String, String> =
            fields.0.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        let message = fields.remove("message").unwrap_or_default();
        HOST_LINES.lock().push(HostLine { message, fields });
    }
}

/// Installs the recorders once for the test process.
fn record_logs() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let guest = guest_log::GuestLogLayer(|f: guest_log::Fields| {
            let plugin = f.plugin();
            let message = f.0.get("message").cloned().unwrap_or_default();
            let fields = f.0.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            GUEST_LINES.lock().push(GuestLine { plugin, message, fields });
        });
        let subscriber = tracing_subscriber::registry().with(guest).with(HostWarnings);
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// The result of `plugin`'s last `outcome` line for `step`, if it logged one.
fn outcome(plugin: &str, step: &str) -> Option<String> {
    GUEST_LINES
        .lock()
        .iter()
        .rev()
        .find(|l| {
            l.plugin == plugin
                && l.message == "outcome"
                && l.fields.get("step").map(String::as_str) == Some(step)
        })
        .map(|l| l.fields.get("result").cloned().unwrap_or_default())
}

// ---------------------------------------------------------------------------------------
// A host with the bystander

/// One compile cache for every test's engine: each component is compiled once.
fn compile_cache() -> &'static std::path::Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("tempdir")).path()
}

/// A host on a test namespace, running the bystander there.
struct Host {
    cluster: TestCluster,
    /// The test's namespace.
    ns: String,
    host: TestHost,
}

/// The sandbox's host is the shared test host, plus the bystander and the attacks.
impl std::ops::Deref for Host {
    type Target = TestHost;
    fn deref(&self) -> &TestHost {
        &self.host
    }
}

impl Host {
    /// A host on a fresh namespace named after `name`, running the bystander there.
    async fn start(name: &str) -> Host {
        record_logs();
        let cluster = TestCluster::start().await.expect("test cluster starts");
        let ns = cluster.namespace_named(name).await.expect("namespace");
        let setup = HostSetup {
            compile_cache: Some(compile_cache().to_owned()),
            options: Box::new(|o| ManagerOptions {
                debounce: Duration::from_millis(50),
                cache_sync_timeout: Duration::from_secs(60),
                watch: true,
                ..o
            }),
            ..HostSetup::new("sandbox-test", PATIENCE)
        };
        let host = TestHost::start(cluster.client(), PluginsDir::new(), setup).await;
        let host = Host { cluster, ns, host };
        host.install(BYSTANDER, &bystander_toml(&host.ns), BYSTANDER);
        host.until_running(BYSTANDER).await;
        host
    }

    /// Installs `<stem>.wasm` (the build of `crate_name`) and `<stem>.toml`.
    fn install(&self, stem: &str, toml: &str, crate_name: &str) {
        self.plugins.install(stem, &wasm(crate_name), toml);
    }

    /// Waits for `plugin`'s `outcome` line of `step`; returns its result.
    async fn outcome(&self, plugin: &str, step: &str) -> String {
        self.until(&format!("{plugin} to report {step}"), |_| outcome(plugin, step).is_some()).await;
        outcome(plugin, step).unwrap_or_default()
    }

    fn config_maps(&self, ns: &str) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Whether the ConfigMap `name` exists in `ns`.
    async fn exists(&self, ns: &str, name: &str) -> bool {
        self.config_maps(ns).get_opt(name).await.expect("get").is_some()
    }

    /// Creates the ConfigMap `name` in `ns` with `labels` and `data`.
    async fn config_map(&self, ns: &str, name: &str, labels: &[(&str, &str)], data: &[(&str, &str)]) {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": name, "namespace": ns, "labels": labels.iter().copied().collect::<BTreeMap<_, _>>() },
            "data": data.iter().copied().collect::<BTreeMap<_, _>>(),
        }))
        .expect("ConfigMap");
        self.config_maps(ns)
            .create(&PostParams::default(), &cm)
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }

    /// Creates the ConfigMap `attack` that an adversarial plugin's `[for]` selects.
    async fn trigger(&self) {
        self.config_map(&self.ns, "attack", &[("role", "attack")], &[]).await;
    }

    /// Events in `ns` (events.k8s.io/v1).
    async fn events(&self, ns: &str) -> Vec<DynamicObject> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            ns,
            &kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
                "events.k8s.io",
                "v1",
                "Event",
            )),
        );
        api.list(&Default::default()).await.expect("list events").items
    }

    /// The bystander keeps working: a new source `src-<round>` gets its copy, an Event about
    /// it and a log line, and none of the bystander's reconciles failed so far.
    async fn bystander_keeps_working(&self, round: &str) {
        let name = format!("src-{round}");
        self.config_map(&self.ns, &name, &[("role", "src")], &[("value", round)]).await;
        let api = self.config_maps(&self.ns);
        let copy = format!("copy-{name}");
        tokio::time::timeout(PATIENCE, async {
            loop {
                let copied = api.get_opt(&copy).await.expect("get copy");
                let value = copied.and_then(|c| c.data).and_then(|d| d.get("value").cloned());
                if value.as_deref() == Some(round) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the bystander never copied {name}"));
        let key = format!("{}/{name}", self.ns);
        self.until(&format!("the bystander's log line for {key}"), |_| {
            GUEST_LINES.lock().iter().any(|l| {
                l.plugin == BYSTANDER
                    && l.message == "bystander reconciled"
                    && l.fields.get("key") == Some(&key)
            })
        })
        .await;
        tokio::time::timeout(PATIENCE, async {
            loop {
                let events = self.events(&self.ns).await;
                if events
                    .iter()
                    .any(|e| e.data["reason"] == "Copied" && e.data["regarding"]["name"] == name.as_str())
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the bystander's Event about {name} was never recorded"));
        // Its reconciles succeed, and none failed: none waited in vain for an instance (that
        // fails as busy), none trapped.
        let succeeded = self.metric(&format!(
            "controller_runtime_reconcile_total{{controller=\"{BYSTANDER}\",result=\"success\"}}"
        ));
        assert!(succeeded >= 1.0, "the bystander's reconciles succeed");
        let failed =
            self.metric(&format!("controller_runtime_reconcile_errors_total{{controller=\"{BYSTANDER}\""));
        assert_eq!(failed, 0.0, "the bystander's reconciles failed");
        let traps = self.metric(&format!("wasmctrl_plugin_traps_total{{plugin=\"{BYSTANDER}\""));
        assert_eq!(traps, 0.0, "the bystander trapped");
    }

    async fn stop(self) {
        self.host.stop().await;
        drop(self.cluster);
    }
}

fn bystander_toml(ns: &str) -> String {
    format!(
        "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\nlabel-selector = \"role=src\"\n\
         [permissions]\nwrite = [\"v1/ConfigMap\"]\n"
    )
}

/// A TOML whose `[for]` is the ConfigMap `attack` of `ns`, with the top-level keys `top`
/// before it and the tables `rest` after it.
fn attacker_toml(ns: &str, top: &str, rest: &str) -> String {
    format!(
        "{top}[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\nlabel-selector = \"role=attack\"\n{rest}"
    )
}

fn assert_refused(step: &str, result: &str, variant: &str, mentions: &[&str]) {
    assert!(result.starts_with(&format!("{variant}: ")), "{step}: expected {variant}, got {result}");
    for m in mentions {
        assert!(result.contains(m), "{step}: the error should mention {m:?}: {result}");
    }
}

// ---------------------------------------------------------------------------------------
// Item 1: Secrets reach a plugin only with permissions.read

/// A TOML that watches Secrets without `permissions.read` is rejected at load, naming the
/// file, the field and the fix; with the permission it loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_toml_watching_secrets_without_read_is_rejected() {
    let host = Host::start("secret-toml").await;
    let ns = host.ns.clone();
    let toml = format!(
        "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\n[[watches]]\napi-version = \"v1\"\nkind = \"Secret\"\nnamespace = \"{ns}\"\n"
    );
    host.install("adv-secret-hook", &toml, "adv-secret-hook");
    let error = host.until_rejected("adv-secret-hook").await;
    for part in ["adv-secret-hook.toml:7:8", "watches[0].kind", "v1/Secret", "permissions.read"] {
        assert!(error.contains(part), "the error names {part}: {error}");
    }
    assert!(host.status("adv-secret-hook").and_then(|s| s.version).is_none(), "nothing runs");
    host.bystander_keeps_working("1").await;
    // With the permission, the same plugin loads.
    host.install(
        "adv-secret-hook",
        &format!("{toml}[permissions]\nread = [\"v1/Secret\"]\n"),
        "adv-secret-hook",
    );
    host.until_running("adv-secret-hook").await;
    host.stop().await;
}

/// The hooks, `map` and `filter` of a plugin that watches Secrets it may not read get their
/// metadata only, whatever loaded it (a spec built by hand skips the TOML's check): no
/// `data`, no last-applied copy, no managed fields; its cache read of the Secret is refused.
/// Granted `read`, the same plugin sees the data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_map_and_filter_get_unreadable_secrets_as_metadata_only() {
    record_logs();
    let cluster = TestCluster::start().await.expect("test cluster");
    let ns = cluster.namespace_named("secret-hooks").await.expect("namespace");
    let client = cluster.client();
    let secret = Gvk::new("v1", "Secret");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let body: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "db", "namespace": ns, "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"password\":\"aHVudGVyMg==\"}}" } },
        "data": { "password": "aHVudGVyMg==" },
    }))
    .expect("Secret");
    secrets.create(&PostParams::default(), &body).await.expect("create secret");
    let factory = InformerFactory::new(client.clone(), FactoryOptions::default());
    let lease = factory.informer(InformerSpec::new("v1", "Secret").namespace(&ns)).await.expect("informer");
    lease.wait_for_sync().await;
    let metrics = Metrics::new();
    let config = EngineConfig { cache_dir: Some(compile_cache().to_owned()), ..EngineConfig::default() };
    let engine = PluginEngine::new(config, Some(&metrics)).expect("engine");

    // Two plugins of the same component, watching the same Secrets: one may read them.
    let mut adapters = Vec::new();
    let mut registrations = Vec::new();
    for (name, readable) in [("secret-blind", false), ("secret-reader", true)] {
        let mut spec = PluginSpec::new(name, secret.clone());
        let read = if readable { vec![secret.clone()] } else { Vec::new() };
        spec.permissions = Permissions::new([secret.clone()], read, []);
        let cache: Arc<dyn CacheReader> = Arc::new(lease.informer().indexer());
        let env = PluginEnv { caches: [(secret.clone(), cache)].into_iter().collect(), kube: None };
        let (engine, bytes) = (engine.clone(), wasm("adv-secret-hook"));
        let plugin = tokio::task::spawn_blocking(move || Plugin::load(&engine, spec, &bytes, env))
            .await
            .expect("load task")
            .expect("load");
        let adapter = PluginReconciler::new(plugin).expect("adapter");
        registrations.push(lease.informer().add_event_handler(adapter.event_handler(secret.clone()), None));
        adapters.push((name, readable, adapter));
    }
    let summary = |data: bool| {
        format!("name=db data={data} string-data=false last-applied={data} managed-fields=false")
    };
    let cached = lease.informer().indexer().get(&format!("{ns}/db")).expect("secret cached");
    for (name, readable, adapter) in &adapters {
        assert_eq!(wait_outcome(name, "on-add").await, summary(*readable), "{name} on-add");
        // `map` and `filter`, as the controller calls them, and a reconcile's cache read.
        let (adapter, cached, ns) = (adapter.clone(), cached.clone(), ns.clone());
        tokio::task::spawn_blocking(move || {
            assert!(adapter.map(&Gvk::new("v1", "Secret"), &cached).is_empty());
            assert!(adapter.filter(&Gvk::new("v1", "Secret"), FilterInput::Create(cached.json())));
            let request = Request { namespace: Some(ns), name: "db".into() };
            assert_eq!(adapter.plugin().reconcile_blocking(&request), Ok(Action::Done));
        })
        .await
        .expect("calls");
        assert_eq!(wait_outcome(name, "map").await, summary(*readable), "{name} map");
        assert_eq!(wait_outcome(name, "filter").await, summary(*readable), "{name} filter");
        let read = wait_outcome(name, "cache-get").await;
        if *readable {
            assert!(read.starts_with("ok: ") && read.contains("data=true"), "{name}: {read}");
        } else {
            assert_refused("cache-get", &read, "forbidden", &["v1/Secret", "permissions.read"]);
        }
    }
    // on-update and on-delete, through the informer.
    let mut changed = secrets.get("db").await.expect("get");
    changed.metadata.labels = Some([("touched".to_owned(), "yes".to_owned())].into());
    secrets.replace("db", &PostParams::default(), &changed).await.expect("update");
    secrets.delete("db", &Default::default()).await.expect("delete");
    for (name, readable, _) in &adapters {
        assert_eq!(wait_outcome(name, "on-update-old").await, summary(*readable), "{name} on-update old");
        assert_eq!(wait_outcome(name, "on-update").await, summary(*readable), "{name} on-update");
        assert_eq!(wait_outcome(name, "on-delete").await, summary(*readable), "{name} on-delete");
    }
    for r in registrations {
        r.remove();
    }
    drop(adapters);
    drop(lease);
    drop(cluster);
}

async fn wait_outcome(plugin: &str, step: &str) -> String {
    tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(r) = outcome(plugin, step) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{plugin} never reported {step}"))
}

// ---------------------------------------------------------------------------------------
// Item 2: writing grants no reading

/// A plugin that may write Secrets but not read them gets metadata only from every write
/// (a dry-run apply included), and the JSON patch operations that read the stored object
/// are refused; the Secret's data never reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_unreadable_kinds_answer_with_metadata_only() {
    let host = Host::start("write-read").await;
    let ns = host.ns.clone();
    let needle = "c2VjcmV0LXZhbHVlLTQyNDI=";
    let secrets: Api<Secret> = Api::namespaced(host.client.clone(), &ns);
    let target: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "target", "namespace": ns },
        "data": { "password": needle },
    }))
    .expect("Secret");
    secrets.create(&PostParams::default(), &target).await.expect("create target");
    let toml = attacker_toml(
        &ns,
        "",
        &format!(
            "[permissions]\nwrite = [\"v1/Secret\"]\n[settings]\ntarget = \"target\"\nneedle = \"{needle}\"\n"
        ),
    );
    host.install("adv-write-read", &toml, "adv-write-read");
    host.until_running("adv-write-read").await;
    host.trigger().await;
    host.outcome("adv-write-read", "done").await;
    let plugin = "adv-write-read";
    for step in ["client-get", "cache-get"] {
        assert_refused(
            step,
            &outcome(plugin, step).unwrap_or_default(),
            "forbidden",
            &["v1/Secret", "permissions.read"],
        );
    }
    for step in
        ["merge-patch", "strategic-patch", "json-patch-add", "apply-dry-run", "apply", "create", "replace"]
    {
        let result = outcome(plugin, step).unwrap_or_default();
        assert_eq!(
            result, "leaked=false kind=Secret",
            "{step}: the response of a write carries metadata only"
        );
    }
    for step in ["json-patch-copy", "json-patch-test", "json-patch-duplicate-op"] {
        assert_refused(
            step,
            &outcome(plugin, step).unwrap_or_default(),
            "forbidden",
            &["JSON patch", "permissions.read"],
        );
    }
    // The writes happened, the refused ones did not.
    let stored = secrets.get("target").await.expect("target");
    let labels = stored.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("touched").map(String::as_str), Some("yes"));
    assert_eq!(labels.get("applied").map(String::as_str), Some("yes"));
    assert!(!stored.metadata.annotations.unwrap_or_default().contains_key("leak"), "the copy was refused");
    let forbidden = host.metric("wasmctrl_plugin_forbidden_calls_total{plugin=\"adv-write-read\"");
    assert!(forbidden >= 5.0, "refusals are counted: {forbidden}");
    host.bystander_keeps_working("1").await;
    host.stop().await;
}

// ---------------------------------------------------------------------------------------
// Item 3: Events

/// Events about objects the plugin may not read, with a path for a name or fields over the
/// API server's caps are refused; a flood of Events is cut by the plugin's own rate limit
/// (counted), and another plugin's Events still go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_checked_and_rate_limited_per_plugin() {
    let host = Host::start("event-spam").await;
    let ns = host.ns.clone();
    let toml = attacker_toml(&ns, "", "[settings]\nother = \"kube-system\"\nspam = 2000\n");
    host.install("adv-event-spam", &toml, "adv-event-spam");
    host.until_running("adv-event-spam").await;
    host.trigger().await;
    let spam = host.outcome("adv-event-spam", "spam").await;
    assert_eq!(spam, "published=2000 accepted=2000", "a dropped event is no error to the plugin");
    let plugin = "adv-event-spam";
    let result = |step| outcome(plugin, step).unwrap_or_default();
    assert_refused("unreadable-kind", &result("unreadable-kind"), "forbidden", &["v1/Pod"]);
    assert_refused("other-namespace", &result("other-namespace"), "forbidden", &["kube-system", &ns]);
    assert_refused("path-name", &result("path-name"), "invalid", &["name"]);
    assert_refused("bad-namespace", &result("bad-namespace"), "invalid", &["namespace"]);
    assert_refused("long-reason", &result("long-reason"), "invalid", &["128"]);
    assert_eq!(result("long-note"), "ok");
    let dropped =
        host.metric("wasmctrl_plugin_events_dropped_total{plugin=\"adv-event-spam\",reason=\"rate-limit\"}");
    assert!(dropped > 0.0, "the flood is cut by the plugin's rate limit");
    // The oversized note was cut to the API server's cap.
    tokio::time::timeout(PATIENCE, async {
        loop {
            let events = host.events(&ns).await;
            if let Some(e) = events.iter().find(|e| e.data["reason"] == "Oversized") {
                let note = e.data["note"].as_str().unwrap_or_default();
                assert!(!note.is_empty() && note.len() <= 1024, "note of {} bytes", note.len());
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the Event with the long note was recorded");
    assert!(
        host.events("kube-system")
            .await
            .iter()
            .all(|e| e.data["reportingController"] != "wasmctrl/adv-event-spam")
    );
    host.bystander_keeps_working("1").await;
    host.stop().await;
}

// ---------------------------------------------------------------------------------------
// Item 4: what a guest can make the host copy

/// A list larger than the plugin's memory limit is refused, naming the limit (the host
/// stops walking the cache at the limit); lists within it still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_over_the_memory_limit_are_refused() {
    let host = Host::start("list-flood").await;
    let ns = host.ns.clone();
    let value = "v".repeat(200 << 10);
    for i in 0..40 {
        host.config_map(&ns, &format!("flood-{i}"), &[("flood", "yes")], &[("value", &value)]).await;
    }
    let toml = attacker_toml(&ns, "memory = \"6MiB\"\n", "[permissions]\nread = [\"v1/ConfigMap\"]\n");
    host.install("adv-list-flood", &toml, "adv-list-flood");
    host.until_running("adv-list-flood").await;
    host.trigger().await;
    let plugin = "adv-list-flood";
    for step in ["list", "list-everywhere", "by-index"] {
        let result = host.outcome(plugin, step).await;
        assert_refused(step, &result, "invalid", &["memory", "6291456"]);
    }
    assert_eq!(host.outcome(plugin, "list-selected").await, "ok: 0");
    host.bystander_keeps_working("1").await;
    host.stop().await;
}

/// A body over `max-output` is refused by the import; one far over it (a log message of
/// megabytes) traps the call before the host copies it, with a reason naming the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_far_over_max_output_trap_before_the_host_copies() {
    let host = Host::start("copy-bomb").await;
    let ns = host.ns.clone();
    let toml = attacker_toml(
        &ns,
        "max-output = \"64KiB\"\n",
        "[permissions]\nwrite = [\"v1/ConfigMap\"]\n[settings]\nmax-output = 65536\nbomb = 8388608\n",
    );
    host.install("adv-copy-bomb", &toml, "adv-copy-bomb");
    host.until_running("adv-copy-bomb").await;
    host.trigger().await;
    let refused = host.outcome("adv-copy-bomb", "over-max-output").await;
    assert_refused("over-max-output", &refused, "invalid", &["max-output of 65536"]);
    host.until("the bomb to trap", |h| {
        h.metric("wasmctrl_plugin_traps_total{plugin=\"adv-copy-bomb\"") >= 1.0
    })
    .await;
    assert!(outcome("adv-copy-bomb", "after-bomb").is_none(), "the call did not go on after the bomb");
    let lines = HOST_LINES.lock().clone();
    let trap = lines
        .iter()
        .find(|l| {
            l.message.contains("trapped")
                && l.fields.get("plugin").map(String::as_str) == Some("adv-copy-bomb")
        })
        .unwrap_or_else(|| panic!("no trap logged: {lines:?}"));
    let reason = trap.fields.get("reason").cloned().unwrap_or_default();
    assert!(reason.contains("max-output of 65536") && reason.contains("nothing was copied"), "{reason}");
    assert!(!host.exists(&ns, "big").await, "the refused body was never sent");
    host.bystander_keeps_working("1").await;
    host.stop().await;
}

/// A plugin holding WASI resources without end (each an entry in the host's resource table)
/// is stopped at its `handles` limit: the call traps, naming the limit, and the next call
/// gets a fresh instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_handles_are_bounded_per_instance() {
    let host = Host::start("handle-flood").await;
    let ns = host.ns.clone();
    let toml = attacker_toml(&ns, "", "[settings]\nhandles = 100000\n");
    host.install("adv-handle-flood", &toml, "adv-handle-flood");
    host.until_running("adv-handle-flood").await;
    host.trigger().await;
    assert_eq!(host.outcome("adv-handle-flood", "holding").await, "100000");
    host.until("the flood to trap", |h| {
        h.metric("wasmctrl_plugin_traps_total{plugin=\"adv-handle-flood\"") >= 1.0
    })
    .await;
    assert!(outcome("adv-handle-flood", "held").is_none(), "the host gave out every handle asked for");
    let lines = HOST_LINES.lock().clone();
    let trap = lines
        .iter()
        .find(|l| {
            l.message.contains("trapped")
                && l.fields.get("plugin").map(String::as_str) == Some("adv-handle-flood")
        })
        .unwrap_or_else(|| panic!("no trap logged: {lines:?}"));
    let reason = trap.fields.get("reason").cloned().unwrap_or_default();
    assert!(reason.contains("more than 4096 resource handles"), "{reason}");
    host.bystander_keeps_working("1").await;
    host.stop().await;
}

/// A plugin logging in a loop (the `log` import, stdout, a huge line on stderr) is cut by
/// its own rate limit, counted per stream; no line it gets into the log is longer than the
/// cap; the bystander's lines still get through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_floods_are_rate_limited_per_plugin() {
    let host = Host::start("log-flood").await;
    let ns = host.ns.clone();
    let toml = attacker_toml(&ns, "", "[settings]\nlines = 30000\nlong = 1048576\n");
    host.install("adv-log-flood", &toml, "adv-log-flood");
    host.until_running("adv-log-flood").await;
    host.trigger().await;
    let done = "controller_runtime_reconcile_total{controller=\"adv-log-flood\",result=\"success\"}";
    host.until("the flood to end", |h| h.metric(done) >= 1.0).await;
    let dropped = |stream: &str| {
        host.metric(&format!(
            "wasmctrl_plugin_guest_lines_dropped_total{{plugin=\"adv-log-flood\",stream=\"{stream}\"}}"
        ))
    };
    assert!(dropped("log") > 0.0, "log import lines dropped");
    assert!(dropped("stdout") > 0.0, "stdout lines dropped");
    let flood_lines: Vec<usize> =
        GUEST_LINES.lock().iter().filter(|l| l.plugin == "adv-log-flood").map(|l| l.message.len()).collect();
    assert!(!flood_lines.is_empty());
    assert!(flood_lines.len() < 60_000, "{} lines got through", flood_lines.len());
    assert!(flood_lines.iter().all(|len| *len <= 8 << 10), "a line over the cap got through");
    // The budget is the TOML's `log-lines-per-second`: ten a second let ten seconds' worth
    // through in a burst, and the flood (more than that) is cut far below the default's.
    assert!(flood_lines.len() >= 10_000, "the default budget lets a burst of 10 000 through");
    let trickle =
        attacker_toml(&ns, "log-lines-per-second = 10\n", "[settings]\nlines = 30000\nlong = 1048576\n");
    host.install("adv-log-trickle", &trickle, "adv-log-flood");
    let done = "controller_runtime_reconcile_total{controller=\"adv-log-trickle\",result=\"success\"}";
    host.until("the second flood to end", |h| h.metric(done) >= 1.0).await;
    let trickle_lines = GUEST_LINES.lock().iter().filter(|l| l.plugin == "adv-log-trickle").count();
    assert!(trickle_lines < 1_000, "{trickle_lines} lines got through a budget of 10 a second");
    host.bystander_keeps_working("1").await;
    host.stop().await;
}

// ---------------------------------------------------------------------------------------
// Item 5: namespaces and field managers

/// A plugin whose `[for]` names its namespace reads and writes nowhere else, through any
/// import; objects there are untouched. TOMLs that would widen the scope are rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_a_boundary() {
    let host = Host::start("ns-escape").await;
    let ns = host.ns.clone();
    let other = host.cluster.namespace_named("ns-victim").await.expect("namespace");
    host.config_map(&other, "victim", &[], &[("original", "yes")]).await;
    let toml = attacker_toml(
        &ns,
        "",
        &format!(
            "[permissions]\nwrite = [\"v1/ConfigMap\"]\n[settings]\nother = \"{other}\"\ntarget = \"victim\"\n"
        ),
    );
    host.install("adv-namespace-escape", &toml, "adv-namespace-escape");
    host.until_running("adv-namespace-escape").await;
    host.trigger().await;
    let plugin = "adv-namespace-escape";
    assert_eq!(host.outcome(plugin, "own-namespace-create").await, "ok");
    for step in [
        "cache-get",
        "cache-list",
        "client-get",
        "client-create",
        "client-replace",
        "client-patch",
        "client-apply",
        "client-delete",
        "event",
    ] {
        assert_refused(step, &outcome(plugin, step).unwrap_or_default(), "forbidden", &[&other, &ns]);
    }
    for step in ["client-get-default-namespace", "client-create-default-namespace"] {
        assert_refused(step, &outcome(plugin, step).unwrap_or_default(), "forbidden", &[&ns]);
    }
    assert_eq!(outcome(plugin, "cache-list-everywhere").as_deref(), Some("ok: foreign=0"));
    let victim = host.config_maps(&other).get("victim").await.expect("victim");
    assert_eq!(victim.data.unwrap_or_default().get("original").map(String::as_str), Some("yes"));
    assert!(
        victim
            .metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .all(|m| m.manager.as_deref() != Some("wasmctrl-adv-namespace-escape"))
    );
    assert!(!host.exists(&other, "escaped").await);
    // TOMLs that reach out are rejected, naming the field.
    let cases = [
        (
            format!(
                "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\n[[watches]]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{other}\"\n[permissions]\nnamespaces = [\"{ns}\"]\n"
            ),
            vec!["watches[0].namespace", "permissions.namespaces"],
        ),
        (
            format!(
                "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\n[[watches]]\napi-version = \"v1\"\nkind = \"Pod\"\n"
            ),
            vec!["watches[0].kind", "every namespace"],
        ),
        (
            format!(
                "[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\n[permissions]\nwrite = [\"v1/Namespace\"]\n"
            ),
            vec!["permissions.write[0]", "cluster-scoped"],
        ),
    ];
    for (i, (toml, parts)) in cases.iter().enumerate() {
        let stem = format!("reach-out-{i}");
        host.install(&stem, toml, "adv-namespace-escape");
        let error = host.until_rejected(&stem).await;
        for part in parts {
            assert!(error.contains(part), "case {i}: the error names {part}: {error}");
        }
    }
    host.bystander_keeps_working("1").await;
    host.stop().await;
}

/// A plugin applies only as its own field manager (or `<own>/<suffix>`); a TOML naming
/// another plugin's manager is rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn field_managers_cannot_be_borrowed() {
    let host = Host::start("field-manager").await;
    let ns = host.ns.clone();
    let bystander_manager = format!("wasmctrl-{BYSTANDER}");
    let own_suffixed = "wasmctrl-adv-field-manager/extra";
    let toml = attacker_toml(
        &ns,
        "",
        &format!(
            "[permissions]\nwrite = [\"v1/ConfigMap\"]\n[settings]\ntarget = \"shared\"\nmanagers = [\"{bystander_manager}\", \"kubectl-client-side-apply\", \"{own_suffixed}\"]\n"
        ),
    );
    host.install("adv-field-manager", &toml, "adv-field-manager");
    host.until_running("adv-field-manager").await;
    host.trigger().await;
    let plugin = "adv-field-manager";
    assert_eq!(host.outcome(plugin, "own").await, "ok");
    assert_refused(
        "bystander's",
        &outcome(plugin, &bystander_manager).unwrap_or_default(),
        "forbidden",
        &["field manager", "wasmctrl-adv-field-manager"],
    );
    assert_refused(
        "kubectl's",
        &outcome(plugin, "kubectl-client-side-apply").unwrap_or_default(),
        "forbidden",
        &["field manager"],
    );
    assert_eq!(outcome(plugin, own_suffixed).as_deref(), Some("ok"));
    let shared = host.config_maps(&ns).get("shared").await.expect("shared");
    let managers: Vec<String> =
        shared.metadata.managed_fields.unwrap_or_default().into_iter().filter_map(|m| m.manager).collect();
    assert!(managers.iter().any(|m| m == "wasmctrl-adv-field-manager"), "{managers:?}");
    assert!(managers.iter().any(|m| m == own_suffixed), "{managers:?}");
    assert!(
        !managers.iter().any(|m| *m == bystander_manager || m == "kubectl-client-side-apply"),
        "{managers:?}"
    );
    // A TOML borrowing the bystander's manager is rejected.
    let borrowed = attacker_toml(&ns, &format!("field-manager = \"{bystander_manager}/x\"\n"), "");
    host.install("borrower", &borrowed, "adv-field-manager");
    let error = host.until_rejected("borrower").await;
    assert!(error.contains("field-manager") && error.contains(&bystander_manager), "{error}");
    host.bystander_keeps_working("1").await;
    host.stop().await;
}

/// The namespace boundary holds for what the host hands a plugin too, whatever built its
/// spec: an object outside its namespaces reaches no hook, `map` or `filter`, a cache list
/// leaves it out, and requests `map` returns outside them are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_outside_the_namespaces_reach_no_export() {
    record_logs();
    tokio::task::spawn_blocking(|| {
        let cm = Gvk::new("v1", "ConfigMap");
        let object = |ns: &str, name: &str| {
            let json = format!(
                r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"{ns}"}}}}"#
            );
            Arc::new(Object::from_json(json.into()).expect("object"))
        };
        let (in_a, in_b, drop_a) = (object("a", "in-a"), object("b", "in-b"), object("a", "drop-me"));
        let writer = Writer::new();
        writer.upsert(in_a.clone());
        writer.upsert(in_b.clone());
        let cache: Arc<dyn CacheReader> = Arc::new(writer.reader());
        let config = EngineConfig { cache_dir: Some(compile_cache().to_owned()), ..EngineConfig::default() };
        let engine = PluginEngine::new(config, None).expect("engine");
        let load = |name: &str, crate_name: &str, settings: &'static [u8]| {
            let mut spec = PluginSpec::new(name, cm.clone());
            spec.permissions = Permissions::new([cm.clone()], [], []).with_namespaces(["a"]);
            spec.settings = settings.into();
            let env = PluginEnv { caches: [(cm.clone(), cache.clone())].into_iter().collect(), kube: None };
            Plugin::load(&engine, spec, &wasm(crate_name), env).unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let probe = |plugin: &Plugin, ns: Option<&str>, op: &str| match plugin
            .reconcile_blocking(&Request { namespace: ns.map(str::to_owned), name: op.to_owned() })
        {
            Err(wasmctrl::controller::ReconcileError::Terminal(out)) => out,
            other => panic!("{op}: {other:?}"),
        };
        let plugin = load("scoped-probe", "test-plugin-probe", b"{}");
        plugin.on_add_blocking(&cm, in_a.json(), false).expect("on-add");
        plugin.on_add_blocking(&cm, in_b.json(), false).expect("on-add");
        plugin.on_update_blocking(&cm, in_b.json(), in_b.json()).expect("on-update");
        plugin.on_delete_blocking(&cm, in_b.json(), false).expect("on-delete");
        assert_eq!(probe(&plugin, None, "hooks-seen"), "ok:add:ConfigMap:in-a:false", "no hook saw in-b");
        let mapped = plugin.map_blocking(&cm, in_a.json()).expect("map");
        assert_eq!(mapped, [Request { namespace: Some("a".into()), name: "mapped-in-a".into() }]);
        assert!(plugin.map_blocking(&cm, in_b.json()).expect("map").is_empty());
        assert!(plugin.filter_blocking(&cm, FilterInput::Create(in_a.json())).expect("filter"));
        assert!(!plugin.filter_blocking(&cm, FilterInput::Create(drop_a.json())).expect("filter"));
        assert!(!plugin.filter_blocking(&cm, FilterInput::Create(in_b.json())).expect("filter"), "not asked");
        assert_eq!(probe(&plugin, None, "cache-list|v1|ConfigMap|"), "ok:in-a");
        assert_eq!(probe(&plugin, None, "cache-by-index|v1|ConfigMap|namespace|b"), "ok:");
        let refused = probe(&plugin, Some("b"), "cache-get|v1|ConfigMap|in-b");
        assert!(refused.starts_with("err:forbidden:") && refused.contains("namespace b"), "{refused}");
        // A `map` that names another namespace enqueues nothing there.
        let escape = load("scoped-escape", "adv-namespace-escape", br#"{"other":"b"}"#);
        assert!(escape.map_blocking(&cm, in_a.json()).expect("map").is_empty());
    })
    .await
    .expect("calls");
}
