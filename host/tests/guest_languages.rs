//! Plugins written in TypeScript (componentize-js) and Python (componentize-py), run by the
//! same host as the Rust ones:
//! - each language's `configmap-mirror` against the embedded dev cluster seeded with
//!   `examples/seed`, checked against `examples/EXPECTED.md` as the Rust example is;
//! - each language's misbehaving plugin (`guests/{ts,python}/test-plugins/misbehave`): an
//!   exception, an endless loop and an unbounded allocation fail only their own call, a
//!   throwing hook traps only its call, and another plugin keeps reconciling meanwhile.
//!
//! Needs the guests built (`cargo xtask build-guests`). When a language's toolchain is not
//! installed (no `node`/`npm`, no `python3`), build-guests skips it and so do these tests,
//! saying so; when it is installed, a missing component is a failure.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use wasmctrl::cache::Indexer;
use wasmctrl::controller::{Action, ReconcileError, Request};
use wasmctrl::object::Object;
use wasmctrl::plugin::{
    CacheReader, CallError, EngineConfig, Gvk, Plugin, PluginEngine, PluginEnv, PluginSpec,
};
use wasmctrl_devcluster::{DevCluster, DevClusterConfig};

#[allow(dead_code)]
#[path = "common/host.rs"]
mod host;

use host::{HostSetup, PluginsDir, TestHost};

/// Bound on every wait for a plugin to get somewhere (not a timing assertion).
const PATIENCE: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug)]
enum Lang {
    Ts,
    Python,
}

impl Lang {
    /// Suffix of the example's plugin name (`configmap-mirror-ts`).
    fn suffix(self) -> &'static str {
        match self {
            Lang::Ts => "ts",
            Lang::Python => "py",
        }
    }

    /// `guests/target/<dir>/` holds this language's components.
    fn out_dir(self) -> PathBuf {
        let dir = match self {
            Lang::Ts => "ts",
            Lang::Python => "python",
        };
        repo().join("guests/target").join(dir)
    }

    /// Whether the toolchain build-guests needs is installed (the same probes as
    /// `xtask/src/guest_langs.rs`); prints why a test skips when not.
    fn available(self, test: &str) -> bool {
        let probes: &[(&str, &[&str])] = match self {
            Lang::Ts => &[("node", &["--version"]), ("npm", &["--version"])],
            Lang::Python => &[("python3", &["-c", "import sys, venv; assert sys.version_info >= (3, 10)"])],
        };
        for (cmd, args) in probes {
            let ok = std::process::Command::new(cmd).args(*args).output().is_ok_and(|o| o.status.success());
            if !ok {
                eprintln!(
                    "skipping {test}: `{cmd}` is missing or too old, so `cargo xtask build-guests` built no {self:?} guests"
                );
                return false;
            }
        }
        true
    }

    fn wasm(self, plugin: &str) -> Vec<u8> {
        let path = self.out_dir().join(format!("{plugin}.wasm"));
        std::fs::read(&path).unwrap_or_else(|e| {
            panic!("{}: {e}; run `cargo xtask build-guests` to build the {self:?} guests", path.display())
        })
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

// ---------------------------------------------------------------------------------------
// The examples against the dev cluster

struct Demo {
    cluster: DevCluster,
    client: kube::Client,
    host: TestHost,
}

impl Demo {
    /// The dev cluster with every seed file applied, and the manager running only `plugin`
    /// from `examples/plugins/languages`.
    async fn start(plugin: &str) -> Demo {
        let cluster = DevCluster::start(DevClusterConfig::plain_http()).await.expect("dev cluster");
        let mut seeds: Vec<PathBuf> = std::fs::read_dir(repo().join("examples/seed"))
            .expect("examples/seed")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        seeds.sort();
        for seed in seeds {
            let yaml = std::fs::read_to_string(&seed).expect("seed");
            cluster.apply_yaml(&yaml).unwrap_or_else(|e| panic!("{}: {e}", seed.display()));
        }
        let client = cluster.client().expect("client");
        let plugins = PluginsDir::new();
        plugins.install_from(&repo().join("examples/plugins/languages"), plugin, |toml| toml);
        let host =
            TestHost::start(client.clone(), plugins, HostSetup::new("wasmctrl-languages", PATIENCE)).await;
        host.assert_loaded(plugin);
        Demo { cluster, client, host }
    }

    async fn stop(self) {
        self.host.stop().await;
        self.cluster.shutdown().await;
    }
}

/// Polls `check` until it passes, or fails with its last complaint.
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    host::eventually(what, PATIENCE, check).await;
}

async fn get(api: &Api<ConfigMap>, name: &str) -> Result<Option<ConfigMap>, String> {
    api.get_opt(name).await.map_err(|e| e.to_string())
}

const FINALIZER: &str = "mirror.example.com/cleanup";

fn has_finalizer(cm: &ConfigMap) -> bool {
    cm.metadata.finalizers.clone().unwrap_or_default().iter().any(|f| f == FINALIZER)
}

/// The `configmap-mirror` rows of `examples/EXPECTED.md`, for the plugin `plugin`.
/// The mirror tests run one at a time: each compiles a 12–19 MB language-runtime component
/// and runs its own dev cluster, and two of them side by side double the peak load of a
/// 2-core machine for no gain in coverage.
static ONE_MIRROR_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn mirror_follows_expected(plugin: &str) {
    let _turn = ONE_MIRROR_AT_A_TIME.lock().await;
    let demo = Demo::start(plugin).await;
    let ns = |n: &str| Api::<ConfigMap>::namespaced(demo.client.clone(), n);
    let copies_match = || async {
        let source = get(&ns("default"), "app-config").await?.ok_or("source gone")?;
        if !has_finalizer(&source) {
            return Err("source has no finalizer".to_owned());
        }
        for team in ["team-a", "team-b"] {
            let copy = get(&ns(team), "app-config").await?.ok_or(format!("no copy in {team}"))?;
            if copy.data != source.data
                || copy.binary_data != source.binary_data
                || copy.immutable != source.immutable
            {
                return Err(format!("{team} copy has {:?}", copy.data));
            }
            let labels = copy.metadata.labels.clone().unwrap_or_default();
            let annotations = copy.metadata.annotations.clone().unwrap_or_default();
            if labels.get("app.kubernetes.io/managed-by").map(String::as_str) != Some("configmap-mirror")
                || labels.contains_key("mirror")
                || annotations.get("mirror.example.com/source").map(String::as_str)
                    != Some("default/app-config")
                || copy.metadata.owner_references.is_some()
                || copy.metadata.finalizers.as_ref().is_some_and(|f| !f.is_empty())
            {
                return Err(format!("{team} copy metadata: {:?}", copy.metadata));
            }
        }
        Ok(())
    };
    eventually("copies after the seed", copies_match).await;
    for team in ["team-a", "team-b"] {
        assert!(get(&ns(team), "local-only").await.unwrap().is_none(), "local-only was mirrored into {team}");
    }
    let local = get(&ns("default"), "local-only").await.unwrap().expect("local-only");
    assert!(!has_finalizer(&local), "local-only got the finalizer");

    // The Normal `Mirrored` event on the source (events.k8s.io/v1 on the dev cluster).
    let events: Api<DynamicObject> = Api::namespaced_with(
        demo.client.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event"), "events"),
    );
    eventually("a Mirrored event on the source", || async {
        let list = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let found = list.items.iter().any(|e| {
            e.data["reason"] == "Mirrored"
                && e.data["action"] == "Sync"
                && e.data["regarding"]["name"] == "app-config"
                && e.data["note"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("copies created in [team-a, team-b]"))
        });
        if found {
            return Ok(());
        }
        let seen: Vec<String> = list
            .items
            .iter()
            .map(|e| {
                format!(
                    "{} {} {}: {}",
                    e.data["type"], e.data["reason"], e.data["regarding"]["name"], e.data["note"]
                )
            })
            .collect();
        Err(format!("{} events, none Mirrored: {seen:?}", list.items.len()))
    })
    .await;

    // Update: a changed and a removed key reach both copies.
    ns("default")
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"log-level": "debug", "feature-flags": null}})),
        )
        .await
        .unwrap();
    eventually("copies follow the source", || async {
        copies_match().await?;
        let copy = get(&ns("team-b"), "app-config").await?.ok_or("no copy")?;
        match copy.data.unwrap_or_default().get("log-level").map(String::as_str) {
            Some("debug") => Ok(()),
            other => Err(format!("log-level {other:?}")),
        }
    })
    .await;

    // An edited copy is put back.
    ns("team-a")
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"log-level": "x"}})),
        )
        .await
        .unwrap();
    eventually("the edited copy is put back", || async {
        copies_match().await?;
        let copy = get(&ns("team-a"), "app-config").await?.ok_or("no copy")?;
        match copy.data.unwrap_or_default().get("log-level").map(String::as_str) {
            Some("debug") => Ok(()),
            other => Err(format!("log-level {other:?}")),
        }
    })
    .await;

    // A deleted copy is re-created.
    ns("team-a").delete("app-config", &DeleteParams::default()).await.unwrap();
    eventually("the deleted copy comes back", copies_match).await;

    // Removing the label deletes the copies and the finalizer; the source stays.
    ns("default")
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"mirror": null}}})),
        )
        .await
        .unwrap();
    eventually("unlabelled: copies gone, finalizer gone", || async {
        let source = get(&ns("default"), "app-config").await?.ok_or("the source was deleted")?;
        if has_finalizer(&source) {
            return Err("source still has the finalizer".into());
        }
        for team in ["team-a", "team-b"] {
            if get(&ns(team), "app-config").await?.is_some() {
                return Err(format!("{team} copy still exists"));
            }
        }
        Ok(())
    })
    .await;

    // Labelled again, then deleted: copies come back, then everything goes.
    ns("default")
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"mirror": "true"}}})),
        )
        .await
        .unwrap();
    eventually("labelled again: copies back", copies_match).await;
    ns("default").delete("app-config", &DeleteParams::default()).await.unwrap();
    eventually("source and copies are gone", || async {
        for team in ["default", "team-a", "team-b"] {
            if get(&ns(team), "app-config").await?.is_some() {
                return Err(format!("{team}/app-config still exists"));
            }
        }
        Ok(())
    })
    .await;
    demo.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_configmap_mirror_follows_expected() {
    if Lang::Ts.available("typescript_configmap_mirror_follows_expected") {
        mirror_follows_expected("configmap-mirror-ts").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_configmap_mirror_follows_expected() {
    if Lang::Python.available("python_configmap_mirror_follows_expected") {
        mirror_follows_expected("configmap-mirror-py").await;
    }
}

// ---------------------------------------------------------------------------------------
// Misbehaving guests

struct Shared {
    engine: PluginEngine,
    _cache_dir: tempfile::TempDir,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let config = EngineConfig { cache_dir: Some(dir.path().to_owned()), ..Default::default() };
        let engine = PluginEngine::new(config, None).unwrap_or_else(|e| panic!("engine: {e}"));
        Shared { engine, _cache_dir: dir }
    })
}

fn configmap() -> Gvk {
    Gvk::new("v1", "ConfigMap")
}

fn req(name: &str) -> Request {
    Request { namespace: Some("default".into()), name: name.to_owned() }
}

fn env() -> PluginEnv {
    let mut caches: HashMap<Gvk, Arc<dyn CacheReader>> = HashMap::new();
    caches.insert(configmap(), Arc::new(Indexer::new()));
    PluginEnv { caches, kube: None }
}

fn load(lang: Lang, plugin: &str, name: &str, deadline: Duration, memory: usize) -> Plugin {
    let mut spec = PluginSpec::new(name, configmap());
    spec.limits.deadline = deadline;
    spec.limits.memory = memory;
    Plugin::load(&shared().engine, spec, &lang.wasm(plugin), env())
        .unwrap_or_else(|e| panic!("loading {plugin}: {e}"))
}

/// The same language's misbehaving plugin in a healthy role: `fine` returns `done`.
fn bystander(lang: Lang) -> Plugin {
    let plugin = format!("test-plugin-{}-misbehave", lang.suffix());
    load(lang, &plugin, &format!("bystander-{}", lang.suffix()), Duration::from_secs(10), 128 << 20)
}

/// `reconcile(request)` misbehaves on one thread while a bystander plugin keeps
/// reconciling on another; returns the misbehaving call's result.
fn misbehave_beside_bystander(lang: Lang, plugin: &Plugin, request: &str) -> Result<Action, ReconcileError> {
    let bystander = bystander(lang);
    let (result, bystander_calls) = std::thread::scope(|s| {
        let t = s.spawn(|| plugin.reconcile_blocking(&req(request)));
        let mut calls = 0;
        while !t.is_finished() || calls == 0 {
            assert_eq!(bystander.reconcile_blocking(&req("fine")), Ok(Action::Done), "the bystander failed");
            calls += 1;
        }
        (t.join().unwrap_or_else(|_| panic!("host thread panicked")), calls)
    });
    assert!(bystander_calls > 0);
    result
}

fn misbehaving_guests_fail_only_their_call(lang: Lang) {
    let plugin = format!("test-plugin-{}-misbehave", lang.suffix());
    let name = format!("misbehave-{}", lang.suffix());
    let guest = load(lang, &plugin, &name, Duration::from_secs(2), 96 << 20);

    // An exception is an error of that reconcile, retried; the instance stays.
    let thrown = misbehave_beside_bystander(lang, &guest, "throw");
    eprintln!("{lang:?}: an exception ended with {thrown:?}");
    match thrown {
        Err(ReconcileError::Retryable(msg)) => {
            assert!(msg.contains("TypeError") || msg.contains("KeyError"), "{lang:?}: {msg}")
        }
        other => panic!("{lang:?}: a throwing reconcile gave {other:?}"),
    }
    assert_eq!(guest.reconcile_blocking(&req("fine")), Ok(Action::Done));
    assert_eq!(guest.pool_counts(), (1, 1), "{lang:?}: an exception does not cost the instance");

    // An endless loop hits the deadline; the instance is discarded, a fresh one serves next.
    match misbehave_beside_bystander(lang, &guest, "loop") {
        Err(ReconcileError::Panic(reason)) => assert!(reason.contains("deadline"), "{lang:?}: {reason}"),
        other => panic!("{lang:?}: a looping reconcile gave {other:?}"),
    }
    assert_eq!(guest.pool_counts(), (0, 0), "{lang:?}: the interrupted instance was discarded");
    assert_eq!(guest.reconcile_blocking(&req("fine")), Ok(Action::Done), "{lang:?}: a fresh instance works");

    // Allocating without bound hits the memory cap.
    let allocated = misbehave_beside_bystander(lang, &guest, "alloc");
    eprintln!("{lang:?}: unbounded allocation ended with {allocated:?}");
    match allocated {
        Err(ReconcileError::Panic(reason)) => {
            assert!(reason.contains("memory") || reason.contains("deadline"), "{lang:?}: {reason}")
        }
        // A runtime may turn its own out-of-memory into an exception.
        Err(ReconcileError::Retryable(msg)) => {
            assert!(msg.to_lowercase().contains("memory"), "{lang:?}: {msg}")
        }
        other => panic!("{lang:?}: an allocating reconcile gave {other:?}"),
    }
    assert_eq!(
        guest.reconcile_blocking(&req("fine")),
        Ok(Action::Done),
        "{lang:?}: recovered after the allocation"
    );

    // A hook that throws traps only its call.
    let object = Object::from_json(Bytes::from_static(
        br#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x","namespace":"default"}}"#,
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let mapped = guest.map_blocking(&configmap(), object.json());
    eprintln!("{lang:?}: a throwing map ended with {mapped:?}");
    match mapped {
        Err(CallError::Trap { export: "map", .. }) => {}
        other => panic!("{lang:?}: a throwing map gave {other:?}"),
    }
    assert_eq!(
        guest.reconcile_blocking(&req("fine")),
        Ok(Action::Done),
        "{lang:?}: recovered after the hook"
    );
}

#[test]
fn typescript_misbehaving_guest_fails_only_its_call() {
    if Lang::Ts.available("typescript_misbehaving_guest_fails_only_its_call") {
        misbehaving_guests_fail_only_their_call(Lang::Ts);
    }
}

/// The filesystem and socket interfaces componentize-py imports are linked but grant
/// nothing: each attempt fails inside the guest, at the call.
#[test]
fn python_filesystem_and_network_are_denied_at_call_time() {
    if !Lang::Python.available("python_filesystem_and_network_are_denied_at_call_time") {
        return;
    }
    let guest =
        load(Lang::Python, "test-plugin-py-misbehave", "sandbox-py", Duration::from_secs(5), 96 << 20);
    let msg = match guest.reconcile_blocking(&req("sandbox")) {
        Err(ReconcileError::Retryable(msg)) => msg,
        other => panic!("the sandbox probe gave {other:?}"),
    };
    eprintln!("python sandbox probe: {msg}");
    for what in ["open", "listdir", "write", "connect"] {
        assert!(msg.contains(&format!("{what} failed: ")), "{what} was not refused: {msg}");
        assert!(!msg.contains(&format!("{what} succeeded")), "{msg}");
    }
    assert_eq!(guest.reconcile_blocking(&req("fine")), Ok(Action::Done), "a refusal costs nothing else");
}

#[test]
fn python_misbehaving_guest_fails_only_its_call() {
    if Lang::Python.available("python_misbehaving_guest_fails_only_its_call") {
        misbehaving_guests_fail_only_their_call(Lang::Python);
    }
}
