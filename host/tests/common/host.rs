//! One host for the integration tests: the plugins manager, as `wasmctrl run` runs it, over a
//! Kubernetes client of whichever test cluster the test started (the testkit's
//! `TestCluster` on either backend, or a `DevCluster`), with its own metrics, informer
//! factory, engine (or one the test gives it, e.g. shared between hosts) and plugins
//! directory, and an admission server when asked for. The test changes the manager's options
//! through [`HostSetup::options`] (runtime values included: another plugins directory, a
//! registry). The real binary as a host is `common/process.rs`.
//!
//! It keeps these promises to the tests that use it:
//! - plugin files reach the plugins directory whole: each is written to a hidden temporary
//!   file and renamed into place, the component before its TOML, so the manager never reads
//!   half a file or a TOML whose component is not there yet;
//! - every wait is bounded by the test's patience and waits on state (a plugin's status, a
//!   metric, a check the test passes in) by polling it, never by sleeping a fixed time
//!   before an assertion; a wait that runs out fails naming what it waited for, with the
//!   last state it saw;
//! - [`TestHost::stop`] cancels what the host started and waits until each part stopped.
//!
//! The host does not own the cluster: the test keeps it, and drops it after `stop`.
//!
//! Included with `#[path = "common/host.rs"] mod host;`; not every suite uses every part.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use wasmctrl::admission::{Admission, AdmissionSettings};
use wasmctrl::informer::{FactoryOptions, InformerFactory};
use wasmctrl::metrics::Metrics;
use wasmctrl::plugin::{EngineConfig, KubeServices, PluginEngine};
use wasmctrl::reload::{FactoryLeases, ManagerDeps, ManagerOptions, PluginManager, PluginStatus};

/// How often [`eventually`] runs its check again (a check usually asks the API server).
const POLL_CHECK: Duration = Duration::from_millis(50);
/// How often a wait on the host's own state (statuses, metrics) looks again.
const POLL_STATE: Duration = Duration::from_millis(10);

/// Polls `check` until it passes (returns `Ok`), for at most `patience`; fails with its last
/// complaint when it never does.
pub async fn eventually<F, Fut>(what: &str, patience: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let last = match check().await {
            Ok(()) => return,
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("{what}: never happened; last: {last}");
        }
        tokio::time::sleep(POLL_CHECK).await;
    }
}

/// A plugins directory the test fills and the manager watches.
pub struct PluginsDir(tempfile::TempDir);

impl PluginsDir {
    pub fn new() -> PluginsDir {
        PluginsDir(tempfile::tempdir().expect("plugins dir"))
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes `file` the safe way: a hidden temporary file renamed into place.
    pub fn write(&self, file: &str, bytes: &[u8]) {
        let tmp = self.path().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, bytes).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
        std::fs::rename(&tmp, self.path().join(file)).unwrap_or_else(|e| panic!("rename to {file}: {e}"));
    }

    /// Installs the plugin `stem`: `<stem>.wasm`, then `<stem>.toml`.
    pub fn install(&self, stem: &str, wasm: &[u8], toml: &str) {
        self.write(&format!("{stem}.wasm"), wasm);
        self.write(&format!("{stem}.toml"), toml.as_bytes());
    }

    /// Installs the plugin `stem` from `<from>/<stem>.wasm` and `<from>/<stem>.toml`, the
    /// TOML's text changed by `edit` first. A missing file fails with the command that
    /// builds the guests.
    pub fn install_from(&self, from: &Path, stem: &str, edit: impl FnOnce(String) -> String) {
        let read = |ext: &str| {
            let path = from.join(format!("{stem}.{ext}"));
            std::fs::read(&path).unwrap_or_else(|e| {
                panic!("{}: {e}; run `cargo xtask build-guests` to build the guests", path.display())
            })
        };
        let toml = String::from_utf8(read("toml")).expect("the plugin TOML is UTF-8");
        self.install(stem, &read("wasm"), &edit(toml));
    }
}

/// Makes the engine a [`TestHost`] runs its plugins on, given the host's metrics.
pub type MakeEngine = Box<dyn FnOnce(&Metrics) -> PluginEngine>;

/// Changes the manager's options before it starts.
pub type EditOptions = Box<dyn FnOnce(ManagerOptions) -> ManagerOptions>;

/// How to set a [`TestHost`] up.
pub struct HostSetup {
    /// The field manager of the host's writes.
    pub field_manager: &'static str,
    /// Bound on every wait of the host for something to happen (not a timing assertion).
    pub patience: Duration,
    /// A compile cache shared with other hosts of the test process (each component is then
    /// compiled once); `None`: a fresh one for this host. Not used with [`HostSetup::engine`].
    pub compile_cache: Option<PathBuf>,
    /// The engine to run the plugins on (one the test keeps, or shares between hosts);
    /// `None`: a fresh one with the default settings over the compile cache.
    pub engine: Option<MakeEngine>,
    /// The options of the host's informer factory.
    pub informers: FactoryOptions,
    /// Start an admission server with these settings, its router given to the manager.
    pub admission: Option<AdmissionSettings>,
    /// The manager's options, given its plugins directory (and the admission router).
    pub options: EditOptions,
}

impl HostSetup {
    /// A host writing as `field_manager`, waiting at most `patience`, with its own engine
    /// and compile cache, the default informer factory, no admission server and the
    /// manager's default options.
    pub fn new(field_manager: &'static str, patience: Duration) -> HostSetup {
        HostSetup {
            field_manager,
            patience,
            compile_cache: None,
            engine: None,
            informers: FactoryOptions::default(),
            admission: None,
            options: Box::new(|o| o),
        }
    }

    /// The same setup, the manager's options then changed by `edit` too.
    pub fn then_options(self, edit: impl FnOnce(ManagerOptions) -> ManagerOptions + 'static) -> HostSetup {
        let first = self.options;
        HostSetup { options: Box::new(move |o| edit(first(o))), ..self }
    }
}

/// An engine with the default settings over the compile cache `cache_dir`.
fn fresh_engine(cache_dir: PathBuf, metrics: &Metrics) -> PluginEngine {
    PluginEngine::new(EngineConfig { cache_dir: Some(cache_dir), ..EngineConfig::default() }, Some(metrics))
        .unwrap_or_else(|e| panic!("engine: {e}"))
}

/// A running host: the manager over the test's cluster, and its admission server if any.
pub struct TestHost {
    pub client: kube::Client,
    pub metrics: Arc<Metrics>,
    /// The engine the plugins run on.
    pub engine: PluginEngine,
    /// The informer factory the manager leases its informers from.
    pub factory: InformerFactory,
    pub plugins: PluginsDir,
    patience: Duration,
    manager: Option<PluginManager>,
    admission: Option<Admission>,
    shutdown: CancellationToken,
    _cache: Option<tempfile::TempDir>,
}

impl TestHost {
    /// Starts the host over `client` with the plugins already in `plugins`; returns once the
    /// manager's first scan is done.
    pub async fn start(client: kube::Client, plugins: PluginsDir, setup: HostSetup) -> TestHost {
        let metrics = Metrics::new();
        let (engine, cache) = match (setup.engine, setup.compile_cache) {
            (Some(make), _) => (make(&metrics), None),
            (None, Some(dir)) => (fresh_engine(dir, &metrics), None),
            (None, None) => {
                let dir = tempfile::tempdir().expect("compile cache dir");
                (fresh_engine(dir.path().to_owned(), &metrics), Some(dir))
            }
        };
        let shutdown = CancellationToken::new();
        let admission = match &setup.admission {
            Some(settings) => Some(
                wasmctrl::admission::start(settings, Some(client.clone()), Some(&metrics), shutdown.clone())
                    .await
                    .unwrap_or_else(|e| panic!("admission server: {e}")),
            ),
            None => None,
        };
        let factory = InformerFactory::new(client.clone(), setup.informers);
        let deps = ManagerDeps {
            engine: engine.clone(),
            informers: Arc::new(FactoryLeases(factory.clone())),
            kube: Some(KubeServices::new(
                client.clone(),
                tokio::runtime::Handle::current(),
                setup.field_manager,
            )),
            metrics: metrics.clone(),
        };
        let options = (setup.options)(ManagerOptions {
            admission: admission.as_ref().map(|a| a.router.clone()),
            ..ManagerOptions::new(plugins.path())
        });
        let manager = PluginManager::start(options, deps, shutdown.clone())
            .await
            .unwrap_or_else(|e| panic!("manager: {e}"));
        TestHost {
            client,
            metrics,
            engine,
            factory,
            plugins,
            patience: setup.patience,
            manager: Some(manager),
            admission,
            shutdown,
            _cache: cache,
        }
    }

    pub fn manager(&self) -> &PluginManager {
        self.manager.as_ref().expect("manager running")
    }

    pub fn admission(&self) -> &Admission {
        self.admission.as_ref().expect("admission server running")
    }

    /// The status of the plugin `name` (or of the TOML stem `name`).
    pub fn status(&self, name: &str) -> Option<PluginStatus> {
        self.manager().status().get(name)
    }

    /// Asserts that the first scan loaded `name` without error.
    pub fn assert_loaded(&self, name: &str) {
        let status = self.status(name).unwrap_or_else(|| panic!("{name} has no status"));
        assert!(status.last_error.is_none(), "{name} did not load: {status:?}");
    }

    /// Waits until `cond` holds of the host, for at most the host's patience.
    pub async fn until(&self, what: &str, mut cond: impl FnMut(&TestHost) -> bool) {
        tokio::time::timeout(self.patience, async {
            while !cond(self) {
                tokio::time::sleep(POLL_STATE).await;
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!("timed out waiting for {what}; status: {:?}", self.manager().status().snapshot())
        });
    }

    /// Waits until `name` runs a version and its controller is ready.
    pub async fn until_running(&self, name: &str) {
        self.until(&format!("{name} to run"), |h| {
            h.status(name).is_some_and(|s| s.ready && s.version.is_some())
        })
        .await;
    }

    /// Waits until the manager rejected `name`'s files; returns the error it gives.
    pub async fn until_rejected(&self, name: &str) -> String {
        self.until(&format!("{name} to be rejected"), |h| {
            h.status(name).is_some_and(|s| s.last_error.is_some())
        })
        .await;
        self.status(name).and_then(|s| s.last_error).unwrap_or_default()
    }

    /// How many times `name` was reloaded so far.
    pub fn reloads(&self, name: &str) -> u64 {
        self.status(name).map_or(0, |s| s.reloads)
    }

    /// Waits until `name` was reloaded more than `before` times.
    pub async fn until_reloaded(&self, name: &str, before: u64) {
        self.until(&format!("{name} to reload"), |h| h.reloads(name) > before).await;
    }

    /// The sum of every sample of the host's metrics whose line starts with `prefix` (a
    /// name, or a name and the start of its labels as printed).
    pub fn metric(&self, prefix: &str) -> f64 {
        self.metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Cancels the host and waits until the manager and the admission server stopped.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(m) = self.manager.take() {
            tokio::time::timeout(self.patience, m.stopped()).await.expect("manager stops");
        }
        if let Some(a) = self.admission.take() {
            tokio::time::timeout(self.patience, a.server.stopped()).await.expect("admission server stops");
        }
    }
}
