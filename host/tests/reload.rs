//! Hot reload of the plugins directory against a Kubernetes API server (the dev cluster, or a
//! real kube-apiserver with `WASMCTRL_TEST_BACKEND=real`; see `wasmctrl-testkit`), through real
//! compiled guests (`guests/test-plugins/reload-stamp-{a,b,bad}`: the same logic, stamping
//! "a" or "b" into the `out-N` ConfigMap they write for each `src-N`; "bad" fails `init`).
//!
//! Needs the guests built: `cargo xtask build-guests`.
//!
//! Every reconcile of the stamp plugins logs `reconcile-start` / `reconcile-end` with its
//! stamp and key; a tracing layer records them in order, so the tests can check that no
//! key is ever reconciled by two calls (two versions) at once.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt;
use wasmctrl::informer::{FactoryOptions, InformerFactory};
use wasmctrl::metrics::Metrics;
use wasmctrl::plugin::{EngineConfig, PluginEngine};
use wasmctrl::reload::{ManagerOptions, PluginState, version_of};
use wasmctrl::source::BackoffConfig;
use wasmctrl_devcluster::FaultRule;
use wasmctrl_testkit::TestCluster;

/// Bound on every wait for the system to get somewhere (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------
// Fixtures

fn build(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../guests/target/wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; run `cargo xtask build-guests` to build the test plugins", path.display())
    })
}

/// One guest log line of a stamp plugin.
#[derive(Clone, Debug)]
struct GuestLog {
    plugin: String,
    /// The plugin version the host tags the line with.
    version: String,
    message: String,
    fields: String,
}

impl GuestLog {
    fn field(&self, name: &str) -> Option<String> {
        // Rendered by the host as `k="v" k2="v2"`.
        let at = self.fields.find(&format!("{name}=\""))? + name.len() + 2;
        let rest = &self.fields[at..];
        Some(rest[..rest.find('"')?].to_owned())
    }
}

static GUEST_LOGS: Mutex<Vec<GuestLog>> = Mutex::new(Vec::new());

/// The guest log lines recorded so far (installs the recorder on first use).
fn guest_logs() -> &'static Mutex<Vec<GuestLog>> {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(guest_log::GuestLogLayer(record_line)).with(
            std::env::var("RUST_LOG").ok().map(|_| {
                tracing_subscriber::fmt::layer()
                    .with_test_writer()
                    .with_filter(tracing_subscriber::EnvFilter::from_default_env())
            }),
        );
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
    &GUEST_LOGS
}

use tracing_subscriber::Layer;

#[path = "common/guest_log.rs"]
mod guest_log;

/// Records a guest log line, while still inside the call that logged: the order of the log
/// is the order of the calls' starts and ends.
fn record_line(f: guest_log::Fields) {
    let log = GuestLog {
        plugin: f.plugin(),
        version: f.0.get("version").cloned().unwrap_or_default(),
        message: f.0.get("message").cloned().unwrap_or_default(),
        fields: f.guest_fields(),
    };
    GUEST_LOGS.lock().push(log);
}

#[allow(dead_code)]
#[path = "common/host.rs"]
mod host;

use host::{HostSetup, PluginsDir, TestHost};

/// A host over a test cluster of its own, in a fresh namespace.
struct Host {
    /// Dropped with the host: the dev cluster stops, or the test's namespace is deleted.
    cluster: TestCluster,
    /// The test's namespace (the name asked for, with the cluster's unique suffix).
    ns: String,
    host: TestHost,
}

impl std::ops::Deref for Host {
    type Target = TestHost;

    fn deref(&self) -> &TestHost {
        &self.host
    }
}

/// One engine for every test, as the host has one, with one compile cache.
fn shared_engine(metrics: &Metrics) -> PluginEngine {
    static ENGINE: OnceLock<(PluginEngine, tempfile::TempDir)> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            let cache = tempfile::tempdir().expect("tempdir");
            let config = EngineConfig { cache_dir: Some(cache.path().to_owned()), ..EngineConfig::default() };
            (PluginEngine::new(config, Some(metrics)).unwrap_or_else(|e| panic!("engine: {e}")), cache)
        })
        .0
        .clone()
}

impl Host {
    /// A host whose cluster has a fresh namespace named after `namespace` (see [`Host::ns`]),
    /// watching its plugins directory if `watch`.
    async fn start(namespace: &str, watch: bool) -> Host {
        Host::start_with(namespace, watch, |_, setup| setup).await
    }

    /// As [`Host::start`], the host's setup changed by `edit` (given the namespace) first.
    async fn start_with(
        namespace: &str,
        watch: bool,
        edit: impl FnOnce(&str, HostSetup) -> HostSetup,
    ) -> Host {
        guest_logs();
        let cluster = TestCluster::start().await.expect("test cluster starts");
        let ns = cluster.namespace_named(namespace).await.expect("namespace");
        let setup = HostSetup {
            engine: Some(Box::new(shared_engine)),
            // Informers retry a failed list or watch soon.
            informers: FactoryOptions {
                backoff: BackoffConfig {
                    initial: Duration::from_millis(20),
                    max: Duration::from_millis(200),
                    ..BackoffConfig::default()
                },
                ..FactoryOptions::default()
            },
            options: Box::new(move |o| ManagerOptions {
                debounce: Duration::from_millis(50),
                cache_sync_timeout: Duration::from_secs(30),
                watch,
                // Tests see changes through the watches (or ask for a rescan).
                rescan_interval: None,
                ..o
            }),
            ..HostSetup::new("reload-test", PATIENCE)
        };
        let host = TestHost::start(cluster.client(), PluginsDir::new(), edit(&ns, setup)).await;
        Host { cluster, ns, host }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.plugins.path().join(file)
    }

    /// Installs a file the safe way (see [`PluginsDir::write`]).
    fn install(&self, file: &str, bytes: &[u8]) {
        self.plugins.write(file, bytes);
    }

    async fn until_version(&self, stem: &str, wasm: &[u8]) {
        let want = version_of(wasm);
        self.until(&format!("{stem} to run version {want}"), |h| {
            h.status(stem).is_some_and(|s| s.version.as_deref() == Some(&want) && s.ready)
        })
        .await;
    }

    /// Stops the host, then drops the cluster.
    async fn stop(self) {
        self.host.stop().await;
    }
}

fn stamp_toml(namespace: &str, edit: usize) -> String {
    // Odd edits also read Secrets: an informer added, then released by the next edit.
    let read = if edit % 2 == 1 { "read = [\"v1/Secret\"]\n" } else { "" };
    format!(
        "concurrency = 2\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{namespace}\"\nlabel-selector = \"role=src\"\n[permissions]\nwrite = [\"v1/ConfigMap\"]\n{read}[settings]\nedit = {edit}\n"
    )
}

async fn apply_src(api: &Api<ConfigMap>, name: &str, value: &str) {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "labels": { "role": "src" } },
        "data": { "value": value },
    });
    api.patch(name, &PatchParams::apply("churn").force(), &Patch::Apply(&cm)).await.expect("apply src");
}

async fn delete_src(api: &Api<ConfigMap>, name: &str) {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("delete {name}: {e}"),
    }
}

/// `src-N` → value, and `out-N` → (stamp, value), as the API server has them.
async fn cluster_state(
    api: &Api<ConfigMap>,
) -> (BTreeMap<String, String>, BTreeMap<String, (String, String)>) {
    let (mut src, mut out) = (BTreeMap::new(), BTreeMap::new());
    for cm in api.list(&Default::default()).await.expect("list").items {
        let name = cm.metadata.name.clone().unwrap_or_default();
        let data = cm.data.unwrap_or_default();
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        if let Some(n) = name.strip_prefix("src-") {
            src.insert(n.to_owned(), get("value"));
        } else if let Some(n) = name.strip_prefix("out-src-") {
            out.insert(n.to_owned(), (get("stamp"), get("value")));
        }
    }
    (src, out)
}

/// Waits until every `src-N` has an `out-N` with its value stamped `stamp`, and no `out-N`
/// is left without its `src-N`.
async fn until_converged(api: &Api<ConfigMap>, stamp: &str) -> usize {
    until_converged_or_explain(api, stamp, None, "").await
}

/// As [`until_converged`]; on failure also reports what `diagnose`'s informer for the
/// plugin's `for` source (in `api_namespace`) holds.
async fn until_converged_or_explain(
    api: &Api<ConfigMap>,
    stamp: &str,
    diagnose: Option<&InformerFactory>,
    api_namespace: &str,
) -> usize {
    let mut last = String::new();
    let outcome = tokio::time::timeout(PATIENCE, async {
        loop {
            let (src, out) = cluster_state(api).await;
            let want: BTreeMap<String, (String, String)> =
                src.iter().map(|(n, v)| (n.clone(), (stamp.to_owned(), v.clone()))).collect();
            if out == want {
                return src.len();
            }
            let wrong: Vec<_> = want.iter().filter(|(k, v)| out.get(*k) != Some(v)).take(5).collect();
            let stale: Vec<_> = out.keys().filter(|k| !want.contains_key(*k)).take(5).collect();
            last = format!("{} sources; first differences {wrong:?}; leftovers {stale:?}", src.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    match outcome {
        Ok(n) => n,
        Err(_) => {
            // Tell a lost reconcile from a stale cache: what does the plugin's informer hold?
            let mut cached = String::new();
            if let Some(factory) = diagnose {
                let spec = wasmctrl::informer::InformerSpec::new("v1", "ConfigMap")
                    .namespace(api_namespace)
                    .label_selector("role=src");
                if let Ok(lease) = factory.informer(spec).await {
                    let keys = lease.indexer().keys();
                    cached = format!("; informer holds {} src objects", keys.len());
                    let (src, _) = cluster_state(api).await;
                    let stale: Vec<_> = keys
                        .iter()
                        .filter(|k| k.rsplit_once("/src-").is_some_and(|(_, n)| !src.contains_key(n)))
                        .collect();
                    cached.push_str(&format!(", of which deleted on the server: {stale:?}"));
                }
            }
            let recent: Vec<String> = GUEST_LOGS
                .lock()
                .iter()
                .rev()
                .take(20)
                .map(|l| format!("{} {}", l.message, l.fields))
                .collect();
            panic!(
                "never converged on stamp {stamp}: {last}{cached}; last guest logs (newest first): {recent:?}"
            )
        }
    }
}

/// Checks the recorded starts and ends of `plugin`'s reconciles: no key is reconciled by
/// two calls at once. Returns the number of reconciles per stamp.
fn check_no_concurrent_reconcile(plugin: &str) -> BTreeMap<String, usize> {
    let logs = guest_logs().lock().clone();
    let mut in_flight: HashMap<String, String> = HashMap::new();
    let mut per_stamp = BTreeMap::new();
    for log in logs.iter().filter(|l| l.plugin == plugin) {
        let (Some(key), Some(stamp)) = (log.field("key"), log.field("stamp")) else { continue };
        match log.message.as_str() {
            "reconcile-start" => {
                if let Some(other) = in_flight.insert(key.clone(), stamp.clone()) {
                    panic!("{key} reconciled by {stamp} while {other} was still reconciling it");
                }
                *per_stamp.entry(stamp).or_insert(0) += 1;
            }
            "reconcile-end" => {
                assert_eq!(
                    in_flight.remove(&key).as_deref(),
                    Some(stamp.as_str()),
                    "end without start for {key}"
                );
            }
            _ => {}
        }
    }
    per_stamp
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

// ---------------------------------------------------------------------------------------
// Tests

/// The scenario: a churn of object changes while the `.wasm` is replaced many times
/// (alternating two builds) and the TOML is edited (settings, and an informer added and
/// released). No key is reconciled by two versions at once; the final state of every
/// object is the latest version's; no key is left unreconciled; no reconcile fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hot_reload_under_load_loses_and_doubles_nothing() {
    let changes = env_or("RELOAD_CHANGES", 5000);
    let swaps = env_or("RELOAD_SWAPS", 50);
    let edits = env_or("RELOAD_EDITS", 10);
    let keys = 200;
    let host = Host::start("reload-load", true).await;
    let ns = &host.ns.clone();
    let (a, b) = (build("reload-stamp-a"), build("reload-stamp-b"));
    host.install("stamp.toml", stamp_toml(ns, 0).as_bytes());
    host.install("stamp.wasm", &a);
    host.until_version("stamp", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);

    // The churn: 4 writers, each owning the keys ≡ w (mod 4), so each key's changes are
    // ordered; every 7th change deletes the key.
    let churn = {
        let api = api.clone();
        tokio::spawn(async move {
            let writers = (0..4).map(|w| {
                let api = api.clone();
                async move {
                    for j in (w..changes).step_by(4) {
                        let name = format!("src-{}", j % keys);
                        if j % 7 == 3 {
                            delete_src(&api, &name).await;
                        } else {
                            apply_src(&api, &name, &j.to_string()).await;
                        }
                    }
                }
            });
            futures::future::join_all(writers).await;
        })
    };

    // Meanwhile: swap builds, and edit the TOML every few swaps.
    let mut latest = &a;
    let mut edit = 0;
    let edit_every = (swaps / edits.max(1)).max(1);
    for s in 1..=swaps {
        latest = if s % 2 == 1 { &b } else { &a };
        host.install("stamp.wasm", latest);
        host.until_version("stamp", latest).await;
        if s % edit_every == 0 && edit < edits {
            edit += 1;
            let before = host.status("stamp").map_or(0, |st| st.reloads);
            host.install("stamp.toml", stamp_toml(ns, edit).as_bytes());
            host.until(&format!("TOML edit {edit} to load"), |h| {
                h.status("stamp").is_some_and(|st| st.reloads > before && st.ready)
            })
            .await;
        }
    }
    churn.await.expect("churn");
    let stamp = if std::ptr::eq(latest, &a) { "a" } else { "b" };
    let sources = until_converged_or_explain(&api, stamp, Some(&host.factory), ns).await;

    let per_stamp = check_no_concurrent_reconcile("stamp");
    let status = host.status("stamp").expect("status");
    assert_eq!(status.state, PluginState::Running);
    assert_eq!(status.rejected, 0, "{status:?}");
    assert_eq!(status.reloads as usize, 1 + swaps + edit, "{status:?}");
    assert_eq!(host.metric("controller_runtime_reconcile_errors_total{controller=\"stamp\"}"), 0.0);
    assert_eq!(host.metric("wasmctrl_plugin_reloads_total{plugin=\"stamp\",result=\"rejected\"}"), 0.0);
    assert!(
        host.metric(&format!("wasmctrl_plugin_info{{plugin=\"stamp\",version=\"{}\"}}", version_of(latest)))
            == 1.0
    );
    assert!(
        per_stamp.get("a").is_some_and(|n| *n > 0) && per_stamp.get("b").is_some_and(|n| *n > 0),
        "{per_stamp:?}"
    );
    eprintln!(
        "hot reload under load: {changes} changes, {swaps} swaps, {edit} TOML edits, {sources} objects at the end, reconciles per build {per_stamp:?}"
    );
    host.stop().await;
}

/// A broken new version — not a component, a component whose `init` fails, a TOML with an
/// error — is rejected (status, metric, readiness detail) and the running version keeps
/// reconciling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_versions_are_rejected_and_the_old_one_keeps_serving() {
    let host = Host::start("reload-broken", true).await;
    let ns = &host.ns.clone();
    let a = build("reload-stamp-a");
    host.install("stamp.toml", stamp_toml(ns, 0).as_bytes());
    host.install("stamp.wasm", &a);
    host.until_version("stamp", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_src(&api, "src-1", "one").await;
    until_converged(&api, "a").await;

    let good_toml = stamp_toml(ns, 0).into_bytes();
    let broken: [(&str, Vec<u8>, &[u8]); 3] = [
        ("stamp.wasm", b"\0asm garbage that is no component".to_vec(), &a),
        ("stamp.wasm", build("reload-stamp-bad"), &a),
        (
            "stamp.toml",
            b"concurrency = 2\n[for]\napi-version = \"v1\"\nkind = \"ConfigMapp\"\n".to_vec(),
            &good_toml,
        ),
    ];
    let mut errors = Vec::new();
    for (i, (file, bytes, good)) in broken.iter().enumerate() {
        host.install(file, bytes);
        host.until(&format!("rejection {}", i + 1), |h| {
            h.status("stamp").is_some_and(|s| s.rejected == i as u64 + 1)
        })
        .await;
        let status = host.status("stamp").expect("status");
        assert_eq!(status.version, Some(version_of(&a)), "{status:?}");
        assert_eq!(status.state, PluginState::Running);
        errors.push(status.last_error.unwrap_or_default());
        let readiness = wasmctrl::server::StatusSource::readiness(&host.manager().status());
        assert!(
            readiness.details.iter().any(|d| d.contains("reload rejected, still running version")),
            "{readiness:?}"
        );
        // Still serving: a change is reconciled by the running version.
        apply_src(&api, "src-1", &format!("after-{i}")).await;
        until_converged(&api, "a").await;
        // Putting the good file back clears the rejection.
        host.install(file, good);
        host.until("the rejection to clear", |h| h.status("stamp").is_some_and(|s| s.last_error.is_none()))
            .await;
    }
    assert!(errors[0].contains("not a component") || errors[0].contains("compil"), "{}", errors[0]);
    assert!(errors[1].contains("init failed: build bad refuses to start"), "{}", errors[1]);
    assert!(
        errors[2].contains("stamp.toml:4:8: `for.kind`: the cluster serves no kind `ConfigMapp`"),
        "{}",
        errors[2]
    );
    assert!(errors[2].contains("did you mean `ConfigMap`?"), "{}", errors[2]);
    assert_eq!(host.metric("wasmctrl_plugin_reloads_total{plugin=\"stamp\",result=\"rejected\"}"), 3.0);
    assert_eq!(host.status("stamp").map(|s| s.reloads), Some(1));
    host.stop().await;
}

/// A `.wasm` written in two steps (no rename) is never run half-written: while only the
/// first half is there the old version keeps serving, and once the rest lands the new
/// version runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partially_written_wasm_is_never_loaded() {
    let host = Host::start("reload-partial", true).await;
    let ns = &host.ns.clone();
    let (a, b) = (build("reload-stamp-a"), build("reload-stamp-b"));
    host.install("stamp.toml", stamp_toml(ns, 0).as_bytes());
    host.install("stamp.wasm", &a);
    host.until_version("stamp", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_src(&api, "src-1", "one").await;
    until_converged(&api, "a").await;

    let half = b.len() / 2;
    std::fs::write(host.path("stamp.wasm"), &b[..half]).expect("first half");
    // The half file is seen and refused (or not yet seen); either way "a" keeps serving.
    host.until("the half-written file to be refused", |h| h.status("stamp").is_some_and(|s| s.rejected >= 1))
        .await;
    assert_eq!(host.status("stamp").and_then(|s| s.version), Some(version_of(&a)));
    apply_src(&api, "src-1", "two").await;
    until_converged(&api, "a").await;

    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(host.path("stamp.wasm")).expect("open");
        f.write_all(&b[half..]).expect("second half");
    }
    host.until_version("stamp", &b).await;
    until_converged(&api, "b").await;
    let per_stamp = check_no_concurrent_reconcile("stamp");
    assert!(!per_stamp.contains_key("bad"));
    host.stop().await;
}

/// New plugin → started; TOML change → informers added and released through the factory;
/// a name clash is refused; removed plugin → drained, stopped, informers released. Uses the
/// explicit rescan (what SIGHUP does) instead of file events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_come_and_go_with_their_files() {
    let host = Host::start("reload-life", false).await;
    let ns = &host.ns.clone();
    assert!(host.manager().status().snapshot().is_empty());
    assert_eq!(host.factory.informer_count(), 0);
    let a = build("reload-stamp-a");

    // A TOML without its component waits for it.
    host.install("stamp.toml", stamp_toml(ns, 0).as_bytes());
    host.manager().rescan().await;
    assert_eq!(host.status("stamp").map(|s| s.state), Some(PluginState::WaitingForWasm));
    host.install("stamp.wasm", &a);
    host.manager().rescan().await;
    host.until_version("stamp", &a).await;
    assert_eq!(host.factory.informer_count(), 1);
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_src(&api, "src-1", "one").await;
    until_converged(&api, "a").await;

    // Reading Secrets adds an informer; dropping it again releases it.
    host.install("stamp.toml", stamp_toml(ns, 1).as_bytes());
    host.manager().rescan().await;
    assert_eq!(host.factory.informer_count(), 2);
    host.install("stamp.toml", stamp_toml(ns, 2).as_bytes());
    host.manager().rescan().await;
    assert_eq!(host.factory.informer_count(), 1);

    // A second plugin with the same name is refused; the first runs on.
    host.install("clash.toml", format!("name = \"stamp\"\n{}", stamp_toml(ns, 0)).as_bytes());
    host.install("clash.wasm", &a);
    host.manager().rescan().await;
    let clash = host.status("clash").expect("clash status");
    assert_eq!(clash.state, PluginState::Failed);
    assert!(
        clash.last_error.as_deref().unwrap_or_default().contains("already used by stamp.toml"),
        "{clash:?}"
    );
    std::fs::remove_file(host.path("clash.toml")).expect("rm");
    host.manager().rescan().await;
    assert!(host.status("clash").is_none());

    // Removing the TOML drains and stops the plugin and releases its informers.
    std::fs::remove_file(host.path("stamp.toml")).expect("rm");
    host.manager().rescan().await;
    assert!(host.status("stamp").is_none());
    assert_eq!(host.factory.informer_count(), 0);
    apply_src(&api, "src-2", "two").await;
    let (_, out) = cluster_state(&api).await;
    assert!(!out.contains_key("2"));
    host.stop().await;
}

// ---------------------------------------------------------------------------------------
// Hand-off: every reload passes on what the previous version had not finished.
//
// These use the witness plugin (`guests/test-plugins/witness-{a,b}`), which changes nothing
// and logs every call it gets: `reconcile-start`/`reconcile-end` with the key and the
// resourceVersion its cache had (`not-found` once deleted), `hook-start`/`hook-end` with
// the event. Its `[settings]` make chosen calls slow, which is how these tests hold a
// notification in a buffer, or a key in flight, at the moment of the reload.

/// A witness TOML: `top` goes before `[for]` (concurrency, resync, ...), `predicates` into
/// `[for.predicates]`, `settings` into `[settings]`.
fn witness_toml(namespace: &str, top: &str, predicates: &str, settings: &str) -> String {
    format!(
        "deadline = \"20s\"\n{top}\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{namespace}\"\n[for.predicates]\n{predicates}\n[settings]\n{settings}\n"
    )
}

async fn apply_cm(api: &Api<ConfigMap>, name: &str, value: &str) -> String {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name },
        "data": { "value": value },
    });
    let cm =
        api.patch(name, &PatchParams::apply("handoff").force(), &Patch::Apply(&cm)).await.expect("apply");
    cm.metadata.resource_version.unwrap_or_default()
}

/// The guest log lines of `plugin` with `message`, oldest first.
fn lines(plugin: &str, message: &str) -> Vec<GuestLog> {
    guest_logs().lock().iter().filter(|l| l.plugin == plugin && l.message == message).cloned().collect()
}

/// Waits until `plugin` logged a line `message` matching `pred`; `what` explains a timeout.
async fn until_line(plugin: &str, message: &str, what: &str, pred: impl Fn(&GuestLog) -> bool) -> GuestLog {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some(l) = lines(plugin, message).into_iter().find(|l| pred(l)) {
                return l;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| {
        let recent: Vec<String> = guest_logs()
            .lock()
            .iter()
            .filter(|l| l.plugin == plugin)
            .rev()
            .take(30)
            .map(|l| format!("{} {} {}", l.version, l.message, l.fields))
            .collect();
        panic!("{what}: never happened; last lines of {plugin} (newest first): {recent:?}")
    })
}

/// Waits until `key` is reconciled, after everything logged so far, and sees it gone.
async fn until_reconciled_gone(plugin: &str, key: &str, after: usize, what: &str) {
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let seen = guest_logs().lock().iter().skip(after).any(|l| {
                l.plugin == plugin
                    && l.message == "reconcile-start"
                    && l.field("key").as_deref() == Some(key)
                    && l.field("rv").as_deref() == Some("not-found")
            });
            if seen {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    if found.is_err() {
        let recent: Vec<String> = guest_logs()
            .lock()
            .iter()
            .skip(after)
            .filter(|l| l.plugin == plugin)
            .map(|l| format!("{} {} {}", l.version, l.message, l.fields))
            .collect();
        panic!("{what}: never happened; lines of {plugin} since the mark: {recent:?}");
    }
}

/// Issue scenario 1: a plugin with `concurrency = 1` is inside a slow reconcile; its TOML
/// changes `concurrency`, which restarts its controller; during the drain a ConfigMap is
/// deleted. The delete is reconciled afterwards (and sees the object gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_restart_during_a_drain_hands_over_a_delete() {
    let host = Host::start("handoff-restart", true).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    let settings = "slow = \"slow\"\nslow-ms = 4000\n";
    host.install("restart.toml", witness_toml(ns, "concurrency = 1", "", settings).as_bytes());
    host.install("restart.wasm", &a);
    host.until_version("restart", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "victim", "1").await;
    let victim = format!("{ns}/victim");
    until_line("restart", "reconcile-end", "victim's first reconcile", |l| {
        l.field("key").as_deref() == Some(&victim)
    })
    .await;
    let rv = apply_cm(&api, "slow", "1").await;
    let slow = format!("{ns}/slow");
    until_line("restart", "reconcile-start", "slow's reconcile", |l| {
        l.field("key").as_deref() == Some(&slow) && l.field("rv").as_deref() == Some(&rv)
    })
    .await;

    // Restart (concurrency 1 → 2) while `slow` is still being reconciled.
    let toml = witness_toml(ns, "concurrency = 2", "", &format!("{settings}edit = 1\n"));
    host.install("restart.toml", toml.as_bytes());
    host.until("the restart to begin", |h| {
        h.status("restart").is_some_and(|s| s.reloads >= 2 || s.state == PluginState::Stopping)
    })
    .await;
    assert!(
        !lines("restart", "reconcile-end").iter().any(|l| l.field("key").as_deref() == Some(&slow)),
        "the slow reconcile ended before the delete: the test did not delete during the drain"
    );
    let mark = guest_logs().lock().len();
    delete_src(&api, "victim").await;
    until_reconciled_gone("restart", &victim, mark, "victim reconciled after its delete").await;
    check_no_concurrent_reconcile_by_version("restart");
    host.stop().await;
}

/// Issue scenario 2: the handler registration of a plugin with a `filter` is replaced (its
/// `resync` changed) while a delete is still buffered behind a slow `filter` call. The
/// buffered delete reaches the successor and is reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replaced_registration_hands_its_buffer_to_its_successor() {
    let host = Host::start("handoff-replace", true).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    let settings = "slow-filter = \"blocker\"\nslow-ms = 5000\n";
    host.install("replace.toml", witness_toml(ns, "resync = \"0s\"", "filter = true", settings).as_bytes());
    host.install("replace.wasm", &a);
    host.until_version("replace", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "victim", "1").await;
    let victim = format!("{ns}/victim");
    until_line("replace", "reconcile-end", "victim's first reconcile", |l| {
        l.field("key").as_deref() == Some(&victim)
    })
    .await;

    // Hold the handler in `filter`, queue victim's delete behind it, then replace the handler.
    apply_cm(&api, "blocker", "1").await;
    until_line("replace", "filter-sleep", "the filter to hold the handler", |_| true).await;
    let mark = guest_logs().lock().len();
    delete_src(&api, "victim").await;
    let toml = witness_toml(ns, "resync = \"10m\"", "filter = true", &format!("{settings}edit = 1\n"));
    host.install("replace.toml", toml.as_bytes());
    host.until("the TOML edit to load", |h| h.status("replace").is_some_and(|s| s.reloads >= 2)).await;
    until_reconciled_gone("replace", &victim, mark, "victim reconciled after its buffered delete").await;
    host.stop().await;
}

/// A reload that moves the plugin to another informer of its `for` kind (namespaced →
/// cluster-wide) while the old informer lags behind (its watch is down): the new
/// informer's list no longer has `victim`, the old one has not seen its delete when its
/// handler leaves. The delete is still reconciled afterwards, by the new version, which
/// sees the object gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_a_lagging_informer_has_not_seen_is_reconciled_when_the_scope_changes() {
    let host = Host::start("handoff-scope", true).await;
    let Some(faults) =
        host.cluster.dev_or_skip("fault injection (failing the namespaced watch)").map(|d| d.faults())
    else {
        host.stop().await;
        return;
    };
    let ns = &host.ns.clone();
    let a = build("witness-a");
    host.install("scope.toml", witness_toml(ns, "", "", "").as_bytes());
    host.install("scope.wasm", &a);
    host.until_version("scope", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "victim", "1").await;
    let victim = format!("{ns}/victim");
    until_line("scope", "reconcile-end", "victim's first reconcile", |l| {
        l.field("key").as_deref() == Some(&victim)
    })
    .await;

    // The namespaced informer stops hearing of changes: every re-watch fails (no relist).
    faults.inject(FaultRule::error(format!("/api/v1/namespaces/{ns}/configmaps"), 500).watch(true));
    faults.drop_watches();
    let mark = guest_logs().lock().len();
    delete_src(&api, "victim").await;
    // The same plugin, cluster-wide: a new informer, listed after the delete.
    let cluster_wide =
        "deadline = \"20s\"\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[settings]\nedit = 1\n";
    host.install("scope.toml", cluster_wide.as_bytes());
    host.until("the TOML edit to load", |h| h.status("scope").is_some_and(|s| s.reloads >= 2)).await;
    faults.clear();
    until_reconciled_gone("scope", &victim, mark, "victim reconciled after its delete").await;
    host.stop().await;
}

/// Like the test above, but `ghost` is created *and* deleted while the old informer lags:
/// it is in neither informer's cache when the scope changes, so only the old informer can
/// still deliver it. The old version's handler stays until its informer has caught up with
/// the new informer's point, and the ghost's delete is reconciled (it sees not-found).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_created_and_deleted_while_the_old_informer_lags_is_reconciled_when_the_scope_changes() {
    let host = Host::start("handoff-ghost", true).await;
    let Some(faults) =
        host.cluster.dev_or_skip("fault injection (failing the namespaced watch)").map(|d| d.faults())
    else {
        host.stop().await;
        return;
    };
    let ns = &host.ns.clone();
    let other = host.cluster.namespace_named("handoff-ghost-other").await.expect("namespace");
    let a = build("witness-a");
    host.install("ghost.toml", witness_toml(ns, "", "", "").as_bytes());
    host.install("ghost.wasm", &a);
    host.until_version("ghost", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    let outside: Api<ConfigMap> = Api::namespaced(host.client.clone(), &other);
    apply_cm(&outside, "outsider", "1").await;
    apply_cm(&api, "anchor", "1").await;
    until_line("ghost", "reconcile-end", "anchor's first reconcile", |l| {
        l.field("key").as_deref() == Some(&format!("{ns}/anchor"))
    })
    .await;

    // The namespaced informer stops hearing of changes; ghost comes and goes meanwhile.
    faults.inject(FaultRule::error(format!("/api/v1/namespaces/{ns}/configmaps"), 500).watch(true));
    faults.drop_watches();
    apply_cm(&api, "ghost", "1").await;
    delete_src(&api, "ghost").await;
    let mark = guest_logs().lock().len();
    let cluster_wide =
        "deadline = \"20s\"\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n[settings]\nedit = 1\n";
    host.install("ghost.toml", cluster_wide.as_bytes());
    // The new version works (it reconciles a ConfigMap only the cluster-wide informer has)
    // while the old informer still lags; then the old informer's watch comes back.
    let outsider = format!("{other}/outsider");
    until_line("ghost", "reconcile-end", "the cluster-wide version's first reconcile", |l| {
        l.field("key").as_deref() == Some(&outsider)
    })
    .await;
    faults.clear();
    until_reconciled_gone("ghost", &format!("{ns}/ghost"), mark, "ghost reconciled after its delete").await;
    host.until("the TOML edit to load", |h| h.status("ghost").is_some_and(|s| s.reloads >= 2)).await;
    host.stop().await;
}

/// A delete the server applied before the plugin's TOML was removed, while the plugin's
/// informer lagged (its watch down): the plugin's stop first lets the informer catch up
/// with the server, so the delete is in the parked queue, and the plugin reconciles it
/// (not-found) when it comes back, although its new informer lists the object gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delete_applied_before_a_removal_is_reconciled_when_the_plugin_returns() {
    let host = Host::start("handoff-removal", true).await;
    let Some(faults) =
        host.cluster.dev_or_skip("fault injection (failing the namespaced watch)").map(|d| d.faults())
    else {
        host.stop().await;
        return;
    };
    let ns = &host.ns.clone();
    let a = build("witness-a");
    let toml = witness_toml(ns, "", "", "");
    host.install("gone.toml", toml.as_bytes());
    host.install("gone.wasm", &a);
    host.until_version("gone", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "victim", "1").await;
    let victim = format!("{ns}/victim");
    until_line("gone", "reconcile-end", "victim's first reconcile", |l| {
        l.field("key").as_deref() == Some(&victim)
    })
    .await;

    faults.inject(FaultRule::error(format!("/api/v1/namespaces/{ns}/configmaps"), 500).watch(true));
    faults.drop_watches();
    delete_src(&api, "victim").await;
    let mark = guest_logs().lock().len();
    std::fs::remove_file(host.path("gone.toml")).expect("rm");
    // The stop waits for the informer; its watch comes back meanwhile.
    host.until("the plugin to start stopping", |h| {
        h.status("gone").is_none_or(|s| s.state == PluginState::Stopping)
    })
    .await;
    faults.clear();
    host.until("the plugin to stop", |h| h.status("gone").is_none()).await;
    host.install("gone.toml", toml.as_bytes());
    host.until_version("gone", &a).await;
    until_reconciled_gone("gone", &victim, mark, "victim reconciled after the plugin came back").await;
    host.stop().await;
}

/// Issue scenario 3: a new version arrives while the first one is still syncing its
/// handlers (held in a slow `filter` over its initial list). Objects created and deleted
/// meanwhile are reconciled, by the new version, and workers start only once the version
/// that runs has synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_swap_during_the_first_versions_initial_sync_hands_everything_over() {
    let host = Host::start("handoff-initial", true).await;
    let ns = &host.ns.clone();
    let (a, b) = (build("witness-a"), build("witness-b"));
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "blocker", "1").await;
    // Long enough for b to be compiled and loaded while a still syncs.
    let settings = "slow-filter = \"blocker\"\nslow-ms = 8000\n";
    host.install("initial.toml", witness_toml(ns, "", "filter = true", settings).as_bytes());
    host.install("initial.wasm", &a);
    // Version a is syncing: its handler sits in `filter` for blocker's initial add.
    until_line("initial", "filter-sleep", "a's handler to sync", |_| true).await;
    apply_cm(&api, "victim", "1").await;
    delete_src(&api, "victim").await;
    host.install("initial.wasm", &b);
    host.until_version("initial", &b).await;
    let victim = format!("{ns}/victim");
    until_reconciled_gone("initial", &victim, 0, "victim reconciled after its delete").await;
    let blocker = format!("{ns}/blocker");
    until_line("initial", "reconcile-end", "blocker reconciled by b", |l| {
        l.field("key").as_deref() == Some(&blocker) && l.field("stamp").as_deref() == Some("b")
    })
    .await;
    check_no_concurrent_reconcile_by_version("initial");
    host.stop().await;
}

/// Issue scenario 4: while the old version's hook dispatcher still has calls to deliver
/// (held in a slow `on-update`), a new version is swapped in. Hook calls of the two versions
/// never overlap; each watch event's hook call goes to exactly one version; the new
/// version's synthetic adds come before its live events.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hook_calls_of_two_versions_never_overlap_and_each_event_goes_to_one() {
    let host = Host::start("handoff-hooks", true).await;
    let ns = &host.ns.clone();
    let (a, b) = (build("witness-a"), build("witness-b"));
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    for i in 0..5 {
        apply_cm(&api, &format!("h-{i}"), "0").await;
    }
    apply_cm(&api, "blocker", "0").await;
    let settings = "hooks = true\nslow-hook = \"blocker\"\nslow-ms = 6000\n";
    host.install("hooks.toml", witness_toml(ns, "", "", settings).as_bytes());
    host.install("hooks.wasm", &a);
    host.until_version("hooks", &a).await;
    // Wait for a's initial adds to be through (blocker's sleeps once).
    let blocker = format!("{ns}/blocker");
    until_line("hooks", "hook-end", "a's initial add of blocker", |l| {
        l.field("key").as_deref() == Some(&blocker)
    })
    .await;

    // Hold a's dispatcher in blocker's update, queue more events behind it, swap.
    let blocker_rv = apply_cm(&api, "blocker", "1").await;
    until_line("hooks", "hook-start", "a's slow hook", |l| l.field("rv").as_deref() == Some(&blocker_rv))
        .await;
    let mut live = Vec::new();
    for i in 0..5 {
        live.push((format!("{ns}/h-{i}"), apply_cm(&api, &format!("h-{i}"), "1").await));
    }
    host.install("hooks.wasm", &b);
    host.until_version("hooks", &b).await;
    // Events after the swap.
    for i in 0..5 {
        live.push((format!("{ns}/h-{i}"), apply_cm(&api, &format!("h-{i}"), "2").await));
    }
    for (key, rv) in &live {
        until_line("hooks", "hook-end", "every update hooked", |l| {
            l.field("key").as_deref() == Some(key) && l.field("rv").as_deref() == Some(rv)
        })
        .await;
    }
    // Anything still queued comes out before judging: a marker object created after every
    // event above is hooked by b only once each event queued to it before is through.
    apply_cm(&api, "marker", "0").await;
    let marker = format!("{ns}/marker");
    until_line("hooks", "hook-end", "b's hook of the marker, after everything queued", |l| {
        l.field("key").as_deref() == Some(&marker) && l.field("stamp").as_deref() == Some("b")
    })
    .await;
    let log: Vec<GuestLog> = guest_logs()
        .lock()
        .iter()
        .filter(|l| l.plugin == "hooks" && l.message.starts_with("hook-"))
        .cloned()
        .collect();
    // (1) No overlap: a hook of one version never starts while another version's runs.
    let mut running: Option<(String, String)> = None;
    for l in &log {
        let who = (l.version.clone(), l.field("stamp").unwrap_or_default());
        match l.message.as_str() {
            "hook-start" => {
                assert!(running.is_none(), "hook of {who:?} started while {running:?} was running a hook");
                running = Some(who);
            }
            _ => running = None,
        }
    }
    // (2) Each update event was hooked by exactly one version.
    for (key, rv) in &live {
        let calls: Vec<String> = log
            .iter()
            .filter(|l| {
                l.message == "hook-start"
                    && l.field("event").as_deref() == Some("update")
                    && l.field("key").as_deref() == Some(key)
                    && l.field("rv").as_deref() == Some(rv)
            })
            .map(|l| l.field("stamp").unwrap_or_default())
            .collect();
        assert_eq!(calls.len(), 1, "update {key}@{rv} hooked by {calls:?}");
    }
    // (3) b's synthetic adds (one per object) come before its first live event.
    let b_calls: Vec<&GuestLog> = log
        .iter()
        .filter(|l| l.message == "hook-start" && l.field("stamp").as_deref() == Some("b"))
        .collect();
    let first_live =
        b_calls.iter().position(|l| l.field("event").as_deref() != Some("add")).unwrap_or(b_calls.len());
    let synthetic: std::collections::BTreeSet<String> =
        b_calls[..first_live].iter().filter_map(|l| l.field("key")).collect();
    assert_eq!(synthetic.len(), 6, "b's synthetic adds before its live events: {synthetic:?}");
    host.stop().await;
}

/// As [`check_no_concurrent_reconcile`], for the witness (two calls at once of one key,
/// whatever their versions, is a failure).
fn check_no_concurrent_reconcile_by_version(plugin: &str) {
    let logs = guest_logs().lock().clone();
    let mut in_flight: HashMap<String, String> = HashMap::new();
    for log in logs.iter().filter(|l| l.plugin == plugin) {
        let Some(key) = log.field("key") else { continue };
        let who = format!(
            "{}/{}/{}",
            log.version,
            log.field("stamp").unwrap_or_default(),
            log.field("edit").unwrap_or_default()
        );
        match log.message.as_str() {
            "reconcile-start" => {
                if let Some(other) = in_flight.insert(key.clone(), who.clone()) {
                    panic!("{key} reconciled by {who} while {other} was still reconciling it");
                }
            }
            "reconcile-end" => {
                in_flight.remove(&key);
            }
            _ => {}
        }
    }
}

/// `GET path` on the host's HTTP endpoint: (status code, body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("response");
    let code = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (code, body)
}

/// `/readyz`: 200 while every plugin has a running version; 503 naming each plugin that has
/// none; a rejected reload of a running plugin is listed but keeps the host ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_ready_while_every_plugin_has_a_running_version() {
    let host = Host::start("handoff-readyz", false).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    let token = CancellationToken::new();
    let (addr, _server) = wasmctrl::server::serve(
        "127.0.0.1:0".parse().expect("address"),
        host.metrics.clone(),
        Arc::new(host.manager().status()),
        token.clone(),
    )
    .await
    .expect("serve");
    assert_eq!(http_get(addr, "/readyz").await.0, 200, "no plugin: ready");

    host.install("good.toml", witness_toml(ns, "", "", "").as_bytes());
    host.install("good.wasm", &a);
    host.install("broken.toml", witness_toml(ns, "", "", "fail-init = true").as_bytes());
    host.install("broken.wasm", &a);
    host.manager().rescan().await;
    host.until_version("good", &a).await;
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("plugin broken: no running version: failed:"), "{body}");
    assert!(body.contains("witness a is told to refuse to start"), "{body}");
    assert!(!body.contains("plugin good"), "{body}");

    // Fixed: every plugin runs.
    host.install("broken.toml", witness_toml(ns, "", "", "fail-init = false").as_bytes());
    host.manager().rescan().await;
    host.until_version("broken", &a).await;
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));

    // A rejected reload keeps the running version, and the host ready.
    host.install("good.wasm", b"\0asm garbage");
    host.manager().rescan().await;
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("plugin good: reload rejected, still running version"), "{body}");

    // A plugin waiting for its .wasm has no running version.
    host.install("later.toml", witness_toml(ns, "", "", "").as_bytes());
    host.manager().rescan().await;
    let (code, body) = http_get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("plugin later: no running version: waiting for its .wasm"), "{body}");
    token.cancel();
    host.stop().await;
}

/// With idle instances and idle code let go after 20 ms, a plugin's code is dropped between
/// events and loaded again by the next one; hot swaps to a new build and back, each
/// happening while the running version's code is dropped, hand over exactly as they do with
/// the code loaded: every object ends up reconciled by the latest build, no key by two
/// calls at once, no reconcile fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reloads_work_the_same_with_the_code_dropped_while_idle() {
    let cache = tempfile::tempdir().expect("tempdir");
    let idle = Duration::from_millis(20);
    let cache_dir = cache.path().to_owned();
    let host = Host::start_with("idle-code", true, move |_, s| HostSetup {
        engine: Some(Box::new(move |metrics| {
            let config = EngineConfig {
                cache_dir: Some(cache_dir),
                idle_instance_timeout: Some(idle),
                idle_code_timeout: Some(idle),
                ..EngineConfig::default()
            };
            PluginEngine::new(config, Some(metrics)).unwrap_or_else(|e| panic!("engine: {e}"))
        })),
        ..s
    })
    .await;
    let ns = &host.ns.clone();
    let (a, b) = (build("reload-stamp-a"), build("reload-stamp-b"));
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    let drops = |h: &TestHost| h.metric("wasmctrl_plugin_code_drops_total");
    let reloads = |h: &TestHost| h.metric("wasmctrl_plugin_code_reloads_total");
    // No plugin of the engine holds compiled code (nor an instance): the running version's
    // code is dropped.
    let dropped = |h: &TestHost| h.engine.shared_components() == 0 && h.engine.live_instances() == 0;
    host.install("idlestamp.toml", stamp_toml(ns, 0).as_bytes());
    host.install("idlestamp.wasm", &a);
    host.until_version("idlestamp", &a).await;
    for i in 0..5 {
        apply_src(&api, &format!("src-{i}"), "1").await;
    }
    until_converged(&api, "a").await;

    // Dropped while idle, then loaded again by the next event.
    // The reaper takes the code out, then counts the drop: wait for both.
    host.until("the idle code to be dropped", |h| dropped(h) && drops(h) >= 1.0).await;
    apply_src(&api, "src-0", "2").await;
    until_converged(&api, "a").await;
    assert!(reloads(&host) >= 1.0, "the event's reconcile loaded the code again");

    // Swaps while the running version's code is dropped: to b, and back to a.
    for (build, stamp) in [(&b, "b"), (&a, "a")] {
        host.until("the running version's code to be dropped", dropped).await;
        host.install("idlestamp.wasm", build);
        host.until_version("idlestamp", build).await;
        apply_src(&api, "src-1", stamp).await;
        until_converged(&api, stamp).await;
    }
    let per_stamp = check_no_concurrent_reconcile("idlestamp");
    assert!(per_stamp.get("b").is_some_and(|n| *n >= 5), "b reconciled every key: {per_stamp:?}");
    let status = host.status("idlestamp").expect("status");
    assert_eq!((status.state, status.rejected), (PluginState::Running, 0), "{status:?}");
    assert_eq!(host.metric("controller_runtime_reconcile_errors_total{controller=\"idlestamp\"}"), 0.0);
    host.stop().await;
}

// ---------------------------------------------------------------------------------------
// Delivery: files arrive however they are made, and a plugin is its name, not its file.

/// Writes `files` into `dir` the way the kubelet's AtomicWriter updates a ConfigMap or
/// Secret volume: a new `..<timestamp>` directory, a `..data_tmp` symlink to it renamed
/// over `..data`, the old directory removed; each visible file is a symlink into `..data`.
fn volume_write(dir: &std::path::Path, generation: usize, files: &[(&str, &[u8])]) {
    let payload = format!("..2026_01_01_00_00_{generation:02}.000000001");
    let target = dir.join(&payload);
    std::fs::create_dir(&target).expect("payload dir");
    for (name, bytes) in files {
        std::fs::write(target.join(name), bytes).expect("payload file");
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(&payload, dir.join("..data_tmp")).expect("..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).expect("user-visible link");
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).expect("old payload");
    }
}

/// The `edit` a plugin's reconciles run with, seen in a reconcile of `key` after `after`.
async fn until_edit(plugin: &str, key: &str, edit: &str, what: &str) {
    until_line(plugin, "reconcile-start", what, |l| {
        l.field("key").as_deref() == Some(key) && l.field("edit").as_deref() == Some(edit)
    })
    .await;
}

/// A TOML delivered through a ConfigMap volume: each kubelet-style update (`..data`
/// swapped, the files themselves untouched) reloads the plugin, its code coming from
/// another directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_volume_update_reloads_the_plugin() {
    let host = Host::start("delivery-volume", true).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    let code = tempfile::tempdir().expect("tempdir");
    std::fs::write(code.path().join("vol.wasm"), &a).expect("wasm");
    let toml = |edit: usize| {
        format!(
            "wasm = \"{}\"\n{}",
            code.path().join("vol.wasm").display(),
            witness_toml(ns, "", "", &format!("edit = {edit}\n"))
        )
    };
    volume_write(host.plugins.path(), 1, &[("vol.toml", toml(1).as_bytes())]);
    host.until_version("vol", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "probe", "1").await;
    let probe = format!("{ns}/probe");
    until_edit("vol", &probe, "1", "the first version's reconcile").await;
    for edit in 2..=3 {
        volume_write(host.plugins.path(), edit, &[("vol.toml", toml(edit).as_bytes())]);
        until_edit("vol", &probe, &edit.to_string(), "the reloaded version's reconcile").await;
    }
    // The status records a load after its version runs: a reconcile of edit 3 may come
    // first. Wait for the record, then check no update was loaded twice.
    host.until("the third load to be recorded", |h| h.status("vol").is_some_and(|s| s.reloads >= 3)).await;
    assert_eq!(host.status("vol").map(|s| s.reloads), Some(3));
    // The code changes in its own directory: seen too.
    let b = build("witness-b");
    let tmp = code.path().join(".vol.wasm.tmp");
    std::fs::write(&tmp, &b).expect("write");
    std::fs::rename(&tmp, code.path().join("vol.wasm")).expect("rename");
    host.until_version("vol", &b).await;
    host.stop().await;
}

/// A ConfigMap-volume update that renames a plugin's files, read half-way through: the
/// kubelet has swapped `..data` (its payload now holds `vb.toml` and `vb.wasm`) but not yet
/// linked the new names (`va.toml` and `va.wasm` dangle). A round that reads the directory
/// then must not take the plugin for removed: it waits for the volume to settle, and once
/// the kubelet is done the plugin is renamed, never stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_update_read_half_way_stops_nothing() {
    let host = Host::start("delivery-volume-halfway", false).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    let toml = witness_toml(ns, "", "", "");
    volume_write(host.plugins.path(), 1, &[("va.toml", toml.as_bytes()), ("va.wasm", &a)]);
    host.manager().rescan().await;
    host.until_version("va", &a).await;
    // The kubelet's next update, up to its `..data` swap.
    let dir = host.plugins.path();
    let payload = "..2026_01_01_00_00_02.000000001";
    std::fs::create_dir(dir.join(payload)).expect("payload dir");
    std::fs::write(dir.join(payload).join("vb.toml"), &toml).expect("payload toml");
    std::fs::write(dir.join(payload).join("vb.wasm"), &a).expect("payload wasm");
    let old = std::fs::read_link(dir.join("..data")).expect("..data");
    std::os::unix::fs::symlink(payload, dir.join("..data_tmp")).expect("..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("swap ..data");
    host.manager().rescan().await;
    let va = host.status("va").expect("va runs on while the volume is half-way through an update");
    assert_eq!((va.state, va.version.clone()), (PluginState::Running, Some(version_of(&a))), "{va:?}");
    // The rest of the update: the new names linked, the old links and payload removed.
    for file in ["vb.toml", "vb.wasm"] {
        std::os::unix::fs::symlink(format!("..data/{file}"), dir.join(file)).expect("link");
    }
    for file in ["va.toml", "va.wasm"] {
        std::fs::remove_file(dir.join(file)).expect("old link");
    }
    std::fs::remove_dir_all(dir.join(old)).expect("old payload");
    host.manager().rescan().await;
    host.until_version("vb", &a).await;
    assert!(host.status("va").is_none(), "{:?}", host.manager().status().snapshot());
    host.stop().await;
}

/// `plugins-dir` is a symlink a deploy tool swaps to a new directory (`ln -s new tmp &&
/// mv -T tmp plugins`): the new directory's files are loaded, and the watch follows it
/// (a later change there is seen, after the old directory is gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swapped_plugins_dir_symlink_is_followed() {
    let root = tempfile::tempdir().expect("tempdir");
    let (one, two) = (root.path().join("one"), root.path().join("two"));
    std::fs::create_dir(&one).expect("one");
    std::fs::create_dir(&two).expect("two");
    let link = root.path().join("plugins");
    std::os::unix::fs::symlink(&one, &link).expect("link");
    let a = build("witness-a");
    let toml = |ns: &str, edit: usize| witness_toml(ns, "", "", &format!("edit = {edit}\n"));
    // The manager runs on the symlink, the first directory's files there before it starts.
    let host = Host::start_with("delivery-symlink", true, |ns, s| {
        std::fs::write(one.join("swap.toml"), toml(ns, 1)).expect("toml");
        std::fs::write(one.join("swap.wasm"), &a).expect("wasm");
        let link = link.clone();
        s.then_options(move |o| ManagerOptions { plugins_dir: link, ..o })
    })
    .await;
    let ns = &host.ns.clone();
    let toml = |edit: usize| toml(ns, edit);
    host.until_version("swap", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "probe", "1").await;
    let probe = format!("{ns}/probe");
    until_edit("swap", &probe, "1", "the first directory's version").await;

    std::fs::write(two.join("swap.toml"), toml(2)).expect("toml");
    std::fs::write(two.join("swap.wasm"), &a).expect("wasm");
    let tmp = root.path().join("plugins.tmp");
    std::os::unix::fs::symlink(&two, &tmp).expect("tmp link");
    std::fs::rename(&tmp, &link).expect("mv -T");
    until_edit("swap", &probe, "2", "the swapped-in directory's version").await;
    std::fs::remove_dir_all(&one).expect("old dir gone");
    let tmp = two.join(".swap.toml.tmp");
    std::fs::write(&tmp, toml(3)).expect("toml");
    std::fs::rename(&tmp, two.join("swap.toml")).expect("rename");
    until_edit("swap", &probe, "3", "a change in the new directory").await;
    host.stop().await;
}

/// Checks the starts and ends of reconciles of `plugins` together (one plugin under its
/// successive names): no key is reconciled by two calls at once.
fn check_no_overlap_across(plugins: &[&str]) {
    let logs = guest_logs().lock().clone();
    let mut in_flight: HashMap<String, String> = HashMap::new();
    for log in logs.iter().filter(|l| plugins.contains(&l.plugin.as_str())) {
        let Some(key) = log.field("key") else { continue };
        let who = format!("{}@{}", log.plugin, log.version);
        match log.message.as_str() {
            "reconcile-start" => {
                if let Some(other) = in_flight.insert(key.clone(), who.clone()) {
                    panic!("{key} reconciled by {who} while {other} was still reconciling it");
                }
            }
            "reconcile-end" => {
                in_flight.remove(&key);
            }
            _ => {}
        }
    }
}

/// The scenario: `mv a.toml b.toml; mv a.wasm b.wasm` (default names) while `a` has
/// three deletes and a create queued behind a slow reconcile. It is the same plugin under a
/// new name: the queue follows it, every delete and the create are reconciled (by `b`),
/// and `b` never reconciles the slow key while `a` is still in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renaming_both_files_hands_the_plugin_over() {
    let host = Host::start("delivery-rename", true).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    let toml = witness_toml(ns, "concurrency = 1", "", "slow = \"slow\"\nslow-ms = 3000\n");
    host.install("ra.toml", toml.as_bytes());
    host.install("ra.wasm", &a);
    host.until_version("ra", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    for v in ["v1", "v2", "v3"] {
        apply_cm(&api, v, "1").await;
        let key = format!("{ns}/{v}");
        until_line("ra", "reconcile-end", "the victims' first reconciles", |l| {
            l.field("key").as_deref() == Some(&key)
        })
        .await;
    }
    let rv = apply_cm(&api, "slow", "1").await;
    let slow = format!("{ns}/slow");
    until_line("ra", "reconcile-start", "the slow reconcile", |l| {
        l.field("key").as_deref() == Some(&slow) && l.field("rv").as_deref() == Some(&rv)
    })
    .await;
    let mark = guest_logs().lock().len();
    for v in ["v1", "v2", "v3"] {
        delete_src(&api, v).await;
    }
    apply_cm(&api, "fresh", "1").await;
    std::fs::rename(host.path("ra.toml"), host.path("rb.toml")).expect("mv toml");
    std::fs::rename(host.path("ra.wasm"), host.path("rb.wasm")).expect("mv wasm");
    for v in ["v1", "v2", "v3"] {
        until_reconciled_gone("rb", &format!("{ns}/{v}"), mark, "a delete reconciled under the new name")
            .await;
    }
    let fresh = format!("{ns}/fresh");
    until_line("rb", "reconcile-end", "the create reconciled under the new name", |l| {
        l.field("key").as_deref() == Some(&fresh)
    })
    .await;
    check_no_overlap_across(&["ra", "rb"]);
    assert!(host.status("ra").is_none(), "{:?}", host.manager().status().snapshot());
    let rb = host.status("rb").expect("rb");
    assert_eq!((rb.state, rb.rejected), (PluginState::Running, 0), "{rb:?}");
    host.stop().await;
}

/// `mv ha.toml hb.toml` read before `mv ha.wasm hb.wasm` (a slow script, or a rescan in
/// between): the TOML moved, its code not yet, the old code still there. The plugin is left
/// running while the code follows, and then it is a rename, never a stop. A TOML renamed
/// alone is taken for what it is once the code did not follow in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_read_half_way_waits_for_the_code() {
    let host = Host::start("delivery-rename-halfway", false).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    host.install("ha.toml", witness_toml(ns, "", "", "").as_bytes());
    host.install("ha.wasm", &a);
    host.manager().rescan().await;
    host.until_version("ha", &a).await;
    std::fs::rename(host.path("ha.toml"), host.path("hb.toml")).expect("mv toml");
    host.manager().rescan().await;
    let ha = host.status("ha").expect("ha runs on while its code has not followed its TOML");
    assert_eq!(ha.state, PluginState::Running, "{ha:?}");
    assert!(host.status("hb").is_none(), "{:?}", host.manager().status().snapshot());
    std::fs::rename(host.path("ha.wasm"), host.path("hb.wasm")).expect("mv wasm");
    host.manager().rescan().await;
    host.until_version("hb", &a).await;
    assert!(host.status("ha").is_none(), "{:?}", host.manager().status().snapshot());
    // The TOML alone: after the grace, `hb` stops and `hc` waits for its code.
    std::fs::rename(host.path("hb.toml"), host.path("hc.toml")).expect("mv toml");
    host.manager().rescan().await;
    host.until("hb to stop and hc to wait for its code", |h| {
        h.status("hb").is_none() && h.status("hc").is_some_and(|s| s.state == PluginState::WaitingForWasm)
    })
    .await;
    host.stop().await;
}

/// A plugin with an explicit `name` whose files move (`mv a.toml b.toml; mv a.wasm b.wasm`,
/// in two separate steps): the name runs on, from the new file, without a rejection; its
/// queued delete is reconciled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_name_moving_to_another_file_is_a_hand_off() {
    let host = Host::start("delivery-move", true).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    let toml =
        witness_toml(ns, "name = \"mirror\"\nconcurrency = 1", "", "slow = \"slow\"\nslow-ms = 2000\n");
    host.install("one.toml", toml.as_bytes());
    host.install("one.wasm", &a);
    host.until_version("mirror", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "victim", "1").await;
    let victim = format!("{ns}/victim");
    until_line("mirror", "reconcile-end", "victim's first reconcile", |l| {
        l.field("key").as_deref() == Some(&victim)
    })
    .await;
    let rv = apply_cm(&api, "slow", "1").await;
    until_line("mirror", "reconcile-start", "the slow reconcile", |l| l.field("rv").as_deref() == Some(&rv))
        .await;
    let mark = guest_logs().lock().len();
    delete_src(&api, "victim").await;
    std::fs::rename(host.path("one.toml"), host.path("two.toml")).expect("mv toml");
    // The TOML alone first: it now names two.wasm, which is not there yet.
    host.until("the name to move to two.toml", |h| {
        h.status("mirror").is_some_and(|s| s.toml.ends_with("two.toml"))
    })
    .await;
    std::fs::rename(host.path("one.wasm"), host.path("two.wasm")).expect("mv wasm");
    until_reconciled_gone("mirror", &victim, mark, "the delete reconciled after the move").await;
    let status = host.status("mirror").expect("status");
    assert_eq!((status.state, status.rejected), (PluginState::Running, 0), "{status:?}");
    assert_eq!(status.version, Some(version_of(&a)));
    check_no_concurrent_reconcile_by_version("mirror");
    host.stop().await;
}

/// Two files that really claim one name: the running one keeps it, the other is refused
/// (status, readiness); once the first file is gone the second loads, without a rescan
/// asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_files_claiming_one_name_are_refused_then_retried() {
    let host = Host::start("delivery-clash", true).await;
    let ns = &host.ns.clone();
    let (a, b) = (build("witness-a"), build("witness-b"));
    let named = |edit: usize| witness_toml(ns, "name = \"shared\"", "", &format!("edit = {edit}\n"));
    host.install("first.toml", named(1).as_bytes());
    host.install("first.wasm", &a);
    host.until_version("shared", &a).await;
    host.install("second.wasm", &b);
    host.install("second.toml", named(2).as_bytes());
    host.until("second.toml to be refused", |h| {
        h.status("second").is_some_and(|s| s.state == PluginState::Failed)
    })
    .await;
    let refused = host.status("second").expect("second");
    assert!(
        refused.last_error.as_deref().unwrap_or_default().contains("already used by first.toml"),
        "{refused:?}"
    );
    assert_eq!(
        host.status("shared").and_then(|s| s.version),
        Some(version_of(&a)),
        "the first keeps running"
    );
    std::fs::remove_file(host.path("first.toml")).expect("rm");
    host.until("second.toml to take the name over", |h| {
        h.status("shared").is_some_and(|s| s.version.as_deref() == Some(&version_of(&b)) && s.ready)
    })
    .await;
    assert!(host.status("second").is_none_or(|s| s.name == "shared" && s.state != PluginState::Failed));
    host.stop().await;
}

/// Parked keys carry their kind: a plugin removed with keys pending and brought back for
/// another `for` kind is not handed them (its witness checks the kind of every key); they
/// expire after the configured time, counted in the metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parked_keys_go_only_to_their_kind_and_expire() {
    let host = Host::start_with("delivery-parked", false, |_, s| {
        s.then_options(|o| ManagerOptions { parked_keys_ttl: Duration::from_secs(3), ..o })
    })
    .await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    // Every reconcile of a deleted key fails: the delete stays pending (in backoff).
    let cm_toml = witness_toml(ns, "", "", "fail-gone = true\n");
    host.install("kinds.toml", cm_toml.as_bytes());
    host.install("kinds.wasm", &a);
    host.manager().rescan().await;
    host.until_version("kinds", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "victim", "1").await;
    let victim = format!("{ns}/victim");
    until_line("kinds", "reconcile-end", "victim's first reconcile", |l| {
        l.field("key").as_deref() == Some(&victim)
    })
    .await;
    delete_src(&api, "victim").await;
    until_line("kinds", "reconcile-end", "the failing delete", |l| {
        l.field("key").as_deref() == Some(&victim) && l.field("result").as_deref() == Some("error")
    })
    .await;
    std::fs::remove_file(host.path("kinds.toml")).expect("rm");
    host.manager().rescan().await;
    assert!(host.status("kinds").is_none());
    // Back, for Secrets (ConfigMaps mapped to `secret-<name>`).
    let mark = guest_logs().lock().len();
    let secret_toml = format!(
        "deadline = \"20s\"\n[for]\napi-version = \"v1\"\nkind = \"Secret\"\nnamespace = \"{ns}\"\n[[watches]]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\n[permissions]\nread = [\"v1/Secret\"]\n[settings]\nfor-kind = \"Secret\"\nmap-prefix = \"secret-\"\n"
    );
    host.install("kinds.toml", secret_toml.as_bytes());
    host.manager().rescan().await;
    host.until_version("kinds", &a).await;
    apply_cm(&api, "after", "1").await;
    let after = format!("{ns}/after");
    until_line("kinds", "reconcile-end", "a reconcile of the Secret version", |l| {
        l.field("key").as_deref() == Some(&after)
    })
    .await;
    let wrong: Vec<GuestLog> = guest_logs()
        .lock()
        .iter()
        .skip(mark)
        .filter(|l| l.plugin == "kinds" && l.field("kind-ok").as_deref() == Some("no"))
        .cloned()
        .collect();
    assert!(wrong.is_empty(), "keys of another kind handed over: {wrong:?}");
    host.until("the parked ConfigMap keys to expire", |h| {
        h.metric("wasmctrl_plugin_parked_keys_dropped_total{plugin=\"kinds\",reason=\"expired\"}") >= 1.0
    })
    .await;
    host.stop().await;
}

/// A rename carries what the plugin parked: a delete pending for the `for` kind the plugin
/// left (ConfigMaps, for Secrets) is handed back when, under its new name, the plugin
/// returns to that kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rename_carries_the_keys_parked_for_another_kind() {
    let host = Host::start("delivery-rename-parked", false).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    // Every reconcile of a deleted key fails: the delete stays pending (in backoff).
    host.install("pa.toml", witness_toml(ns, "", "", "fail-gone = true\n").as_bytes());
    host.install("pa.wasm", &a);
    host.manager().rescan().await;
    host.until_version("pa", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "victim", "1").await;
    let victim = format!("{ns}/victim");
    until_line("pa", "reconcile-end", "victim's first reconcile", |l| {
        l.field("key").as_deref() == Some(&victim)
    })
    .await;
    delete_src(&api, "victim").await;
    until_line("pa", "reconcile-end", "the failing delete", |l| {
        l.field("key").as_deref() == Some(&victim) && l.field("result").as_deref() == Some("error")
    })
    .await;
    // For Secrets now: the ConfigMap queue, the failing delete in it, is parked.
    let secret_toml = format!(
        "deadline = \"20s\"\n[for]\napi-version = \"v1\"\nkind = \"Secret\"\nnamespace = \"{ns}\"\n[[watches]]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\n[permissions]\nread = [\"v1/Secret\"]\n[settings]\nfor-kind = \"Secret\"\nmap-prefix = \"secret-\"\n"
    );
    host.install("pa.toml", secret_toml.as_bytes());
    host.manager().rescan().await;
    host.until("the Secret version to run", |h| h.status("pa").is_some_and(|s| s.reloads >= 2 && s.ready))
        .await;
    // Both files renamed together: the same plugin, under the name `pb`.
    std::fs::rename(host.path("pa.toml"), host.path("pb.toml")).expect("mv toml");
    std::fs::rename(host.path("pa.wasm"), host.path("pb.wasm")).expect("mv wasm");
    host.manager().rescan().await;
    host.until_version("pb", &a).await;
    assert!(host.status("pa").is_none(), "{:?}", host.manager().status().snapshot());
    // Back to ConfigMaps, deletes no longer failing: the parked delete comes back with it.
    let mark = guest_logs().lock().len();
    host.install("pb.toml", witness_toml(ns, "", "", "edit = 1\n").as_bytes());
    host.manager().rescan().await;
    until_reconciled_gone("pb", &victim, mark, "the parked delete reconciled under the new name").await;
    host.stop().await;
}

/// A controller restart whose new controller never syncs (its handlers held in a slow
/// `filter` past the sync timeout) keeps the queue it was handed: a delete whose reconcile
/// keeps failing is still pending, and the next version reconciles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_controller_that_fails_to_sync_keeps_its_queue() {
    let host = Host::start_with("delivery-nosync", false, |_, s| {
        s.then_options(|o| ManagerOptions { cache_sync_timeout: Duration::from_secs(2), ..o })
    })
    .await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    host.install(
        "nosync.toml",
        witness_toml(ns, "concurrency = 1", "filter = true", "fail-gone = true\n").as_bytes(),
    );
    host.install("nosync.wasm", &a);
    host.manager().rescan().await;
    host.until_version("nosync", &a).await;
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    apply_cm(&api, "victim", "1").await;
    apply_cm(&api, "blocker", "1").await;
    let victim = format!("{ns}/victim");
    until_line("nosync", "reconcile-end", "victim's first reconcile", |l| {
        l.field("key").as_deref() == Some(&victim)
    })
    .await;
    delete_src(&api, "victim").await;
    until_line("nosync", "reconcile-end", "the failing delete", |l| {
        l.field("key").as_deref() == Some(&victim) && l.field("result").as_deref() == Some("error")
    })
    .await;
    // Restart (concurrency 1 → 2) into a version whose filter holds its initial list past
    // the sync timeout.
    let stuck = witness_toml(
        ns,
        "concurrency = 2",
        "filter = true",
        "fail-gone = true\nslow-filter = \"blocker\"\nslow-ms = 4000\nedit = 1\n",
    );
    host.install("nosync.toml", stuck.as_bytes());
    host.manager().rescan().await;
    host.until("the new controller to fail its sync", |h| {
        h.status("nosync").is_some_and(|s| s.last_error.as_deref().is_some_and(|e| e.contains("sync")))
    })
    .await;
    // A version that syncs and no longer fails deletes: it gets the pending delete.
    let mark = guest_logs().lock().len();
    host.install(
        "nosync.toml",
        witness_toml(ns, "concurrency = 2", "filter = true", "edit = 2\n").as_bytes(),
    );
    host.manager().rescan().await;
    until_line("nosync", "reconcile-end", "the pending delete reconciled by the fixed version", |l| {
        l.field("key").as_deref() == Some(&victim)
            && l.field("edit").as_deref() == Some("2")
            && l.field("result").as_deref() == Some("ok")
    })
    .await;
    let _ = mark;
    host.stop().await;
}

/// The `.wasm` removed, the TOML kept: the running version keeps running and `/plugins`
/// and `/readyz` say it runs without its file; a TOML edit meanwhile is applied (with the
/// running version's compiled code); the file back clears the note.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_wasm_keeps_the_running_version_and_says_so() {
    let host = Host::start("delivery-nowasm", true).await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    host.install("gone.toml", witness_toml(ns, "", "", "edit = 1\n").as_bytes());
    host.install("gone.wasm", &a);
    host.until_version("gone", &a).await;
    std::fs::remove_file(host.path("gone.wasm")).expect("rm");
    host.until("the status to note the missing file", |h| {
        h.status("gone").is_some_and(|s| s.note.as_deref().is_some_and(|n| n.contains("without its file")))
    })
    .await;
    let readiness = wasmctrl::server::StatusSource::readiness(&host.manager().status());
    assert!(readiness.ready, "{readiness:?}");
    assert!(
        readiness
            .details
            .iter()
            .any(|d| d.contains("plugin gone: running version") && d.contains("without its file")),
        "{readiness:?}"
    );
    let plugins = wasmctrl::server::StatusSource::plugins(&host.manager().status()).to_string();
    assert!(plugins.contains("without its file"), "{plugins}");
    // A TOML edit is applied with the running code.
    host.install("gone.toml", witness_toml(ns, "", "", "edit = 2\n").as_bytes());
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), ns);
    host.until("the edit to load", |h| h.status("gone").is_some_and(|s| s.reloads >= 2)).await;
    apply_cm(&api, "probe", "1").await;
    until_edit("gone", &format!("{ns}/probe"), "2", "the edited version's reconcile").await;
    let status = host.status("gone").expect("status");
    assert_eq!(
        (status.state, status.version.clone(), status.rejected),
        (PluginState::Running, Some(version_of(&a)), 0),
        "{status:?}"
    );
    host.install("gone.wasm", &a);
    host.until("the note to clear", |h| h.status("gone").is_some_and(|s| s.note.is_none())).await;
    host.stop().await;
}

/// With the watches off, the periodic full rescan alone finds a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_rescan_finds_changes_the_watches_miss() {
    let host = Host::start_with("delivery-rescan", false, |_, s| {
        s.then_options(|o| ManagerOptions { rescan_interval: Some(Duration::from_millis(300)), ..o })
    })
    .await;
    let ns = &host.ns.clone();
    let a = build("witness-a");
    host.install("periodic.toml", witness_toml(ns, "", "", "").as_bytes());
    host.install("periodic.wasm", &a);
    host.until_version("periodic", &a).await;
    let b = build("witness-b");
    host.install("periodic.wasm", &b);
    host.until_version("periodic", &b).await;
    host.stop().await;
}

// ---------------------------------------------------------------------------------------
// Scope: a TOML edit that narrows (or widens) what a plugin watches never makes it hear
// that an existing object is gone; every real delete still reaches it.

/// How a scope test narrows and widens the witness's scope.
#[derive(Clone, Copy, Debug)]
enum ScopeKind {
    Namespace,
    LabelSelector,
    FieldSelector,
    Watches,
}

/// Objects: `keep-*` stay in scope, `leave-*` are in the wide scope only (in `other` for the
/// namespace case), `del-*` are in scope and deleted during the test.
const SCOPE_OBJECTS: usize = 5;

fn scope_toml(kind: ScopeKind, ns: &str, wide: bool, edit: usize) -> String {
    let settings = format!("[settings]\nedit = {edit}\n");
    let head = "deadline = \"20s\"\n[for]\napi-version = \"v1\"\nkind = \"ConfigMap\"\n";
    match kind {
        ScopeKind::Namespace if wide => format!("{head}{settings}"),
        ScopeKind::Namespace => format!("{head}namespace = \"{ns}\"\n{settings}"),
        ScopeKind::LabelSelector => {
            let sel = if wide { "scope in (keep,leave)" } else { "scope=keep" };
            format!("{head}namespace = \"{ns}\"\nlabel-selector = \"{sel}\"\n{settings}")
        }
        ScopeKind::FieldSelector => {
            let fields: Vec<String> =
                (0..SCOPE_OBJECTS).map(|i| format!("metadata.name!=leave-{i}")).collect();
            let fields = if wide { "metadata.name!=nothing".to_owned() } else { fields.join(",") };
            format!("{head}namespace = \"{ns}\"\nfield-selector = \"{fields}\"\n{settings}")
        }
        ScopeKind::Watches => {
            let watches = if wide {
                format!(
                    "[[watches]]\napi-version = \"v1\"\nkind = \"ConfigMap\"\nnamespace = \"{ns}\"\nlabel-selector = \"scope=leave\"\n"
                )
            } else {
                String::new()
            };
            format!("{head}namespace = \"{ns}\"\nlabel-selector = \"scope in (keep)\"\n{watches}{settings}")
        }
    }
}

async fn apply_scoped(api: &Api<ConfigMap>, name: &str, scope: &str, value: usize) {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "labels": { "scope": scope } },
        "data": { "value": value.to_string() },
    });
    api.patch(name, &PatchParams::apply("scope").force(), &Patch::Apply(&cm)).await.expect("apply");
}

/// Narrows and widens the witness's scope four times — twice during a churn of updates,
/// twice during a relist (dev cluster: history compacted, watches dropped) — while objects
/// in the kept scope are deleted. Asserts that no reconcile saw an object gone that exists,
/// and that every delete was reconciled (seeing it gone) afterwards.
async fn scope_change(kind: ScopeKind, base: &str) {
    let host = Host::start(base, true).await;
    let ns = host.ns.clone();
    let other = host.cluster.namespace_named(&format!("{base}-other")).await.expect("namespace");
    let plugin = base.to_owned();
    let a = build("witness-a");
    let api: Api<ConfigMap> = Api::namespaced(host.client.clone(), &ns);
    let leave_api: Api<ConfigMap> =
        Api::namespaced(host.client.clone(), if matches!(kind, ScopeKind::Namespace) { &other } else { &ns });
    for i in 0..SCOPE_OBJECTS {
        apply_scoped(&api, &format!("keep-{i}"), "keep", 0).await;
        apply_scoped(&leave_api, &format!("leave-{i}"), "leave", 0).await;
    }
    for i in 0..4 {
        apply_scoped(&api, &format!("del-{i}"), "keep", 0).await;
    }
    host.install(&format!("{plugin}.toml"), scope_toml(kind, &ns, true, 0).as_bytes());
    host.install(&format!("{plugin}.wasm"), &a);
    host.until_version(&plugin, &a).await;
    let leave_ns = if matches!(kind, ScopeKind::Namespace) { other.clone() } else { ns.clone() };
    let leaving = format!("{leave_ns}/leave-0");
    until_line(&plugin, "reconcile-end", "the wide scope's first reconciles", |l| {
        l.field("key").as_deref() == Some(&leaving)
    })
    .await;

    // The churn: updates of every kept and leaving object, until stopped.
    let stop = CancellationToken::new();
    let churn = {
        let (api, leave_api, stop) = (api.clone(), leave_api.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 1;
            while !stop.is_cancelled() {
                for i in 0..SCOPE_OBJECTS {
                    apply_scoped(&api, &format!("keep-{i}"), "keep", n).await;
                    apply_scoped(&leave_api, &format!("leave-{i}"), "leave", n).await;
                }
                n += 1;
            }
        })
    };
    let faults = host.cluster.dev().map(|d| d.faults());
    let mut deletes = Vec::new();
    for (step, wide) in [false, true, false, true].into_iter().enumerate() {
        let relist = step >= 2;
        if relist {
            match &faults {
                Some(f) => {
                    f.compact_history();
                    f.drop_watches();
                }
                None => eprintln!("{base}: relist step skipped on the real server (no fault injection)"),
            }
        }
        let before = host.status(&plugin).map_or(0, |s| s.reloads);
        host.install(&format!("{plugin}.toml"), scope_toml(kind, &ns, wide, step + 1).as_bytes());
        // A delete while the reload is under way, in the kept scope.
        let name = format!("del-{step}");
        let mark = guest_logs().lock().len();
        delete_src(&api, &name).await;
        deletes.push((format!("{ns}/{name}"), mark));
        host.until(&format!("step {step} to load"), |h| {
            h.status(&plugin).is_some_and(|s| s.reloads > before && s.ready)
        })
        .await;
        let kept = format!("{ns}/keep-0");
        until_edit(&plugin, &kept, &(step + 1).to_string(), "a reconcile of the new scope").await;
    }
    stop.cancel();
    churn.await.expect("churn");
    // Every delete reconciled afterwards, and nothing that exists reported gone. (The log
    // mark is taken before the delete: a reconcile logged after it that finds the object
    // gone saw the delete applied, and one may follow the delete before its response.)
    for (key, mark) in &deletes {
        until_reconciled_gone(&plugin, key, *mark, "a real delete reconciled").await;
    }
    let wrongly_gone: Vec<String> = guest_logs()
        .lock()
        .iter()
        .filter(|l| l.plugin == plugin && l.message == "reconcile-start")
        .filter(|l| l.field("rv").as_deref() == Some("not-found"))
        .filter_map(|l| l.field("key"))
        .filter(|k| k.contains("/keep-") || k.contains("/leave-"))
        .collect();
    assert!(wrongly_gone.is_empty(), "{kind:?}: existing objects reconciled as gone: {wrongly_gone:?}");
    host.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn narrowing_a_namespace_scope_reports_no_existing_object_gone() {
    scope_change(ScopeKind::Namespace, "scope-ns").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn narrowing_a_label_selector_reports_no_existing_object_gone() {
    scope_change(ScopeKind::LabelSelector, "scope-labels").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn narrowing_a_field_selector_reports_no_existing_object_gone() {
    scope_change(ScopeKind::FieldSelector, "scope-fields").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropping_a_watches_entry_reports_no_existing_object_gone() {
    scope_change(ScopeKind::Watches, "scope-watches").await;
}
