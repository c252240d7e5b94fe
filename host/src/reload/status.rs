//! Per-plugin status as users see it: `/plugins` (JSON), `/readyz` details, and the
//! `wasmctrl_plugin_info` / `wasmctrl_plugin_reloads_total` / `wasmctrl_plugin_running`
//! metrics.
//!
//! Invariants: exactly one `wasmctrl_plugin_info{plugin, version}` series is 1 per running
//! plugin (the old version's series is removed on swap); a rejected reload keeps the running
//! version's state and records the rejection in `last_error` until the next success.
//!
//! Readiness (`/readyz`): the host is ready once the plugins directory was loaded and every
//! plugin it holds has a running version — its controller came up (synced, workers
//! running) and has not failed since. A plugin that is starting, waiting for its `.wasm`,
//! or failed (no version runs) makes the host not ready, and is named in the details. A
//! rejected reload is reported but does not: the running version keeps serving. A reload
//! in progress (a swap, or a controller restart handing its queue over) keeps a plugin
//! `running`; a plugin being removed no longer counts. A running version whose code is
//! gone (its `.wasm` removed, its registry tag deleted), or that was taken from the local
//! store because its registry could not be reached, keeps running and says so (`note`),
//! without making the host unready. A plugin waiting for its code is named with what it
//! waits for: its `.wasm`, or its registry reference.
//!
//! `wasmctrl_plugin_running{plugin}` is read from the board at each scrape: 1 for a plugin
//! with a running version, 0 for one without (the plugins `/readyz` names as having no
//! running version); a plugin being removed has no series.
//!
//! Entries are keyed by plugin name; a TOML refused because another file claims its name
//! has an entry of its own, keyed by its path.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::RwLock;
use serde::Serialize;

use crate::metrics::{Metrics, PluginInfoLabels, PluginLabels, PluginResultLabels};
use crate::server::{Readiness, StatusSource};

/// Where a plugin is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PluginState {
    /// Loading, or waiting for its informers to sync.
    Starting,
    /// Reconciling.
    Running,
    /// Its TOML is there but its `.wasm` is not (yet).
    WaitingForWasm,
    /// Could not be started; `last_error` says why. Nothing of it runs.
    Failed,
    /// Being drained after its files were removed.
    Stopping,
}

/// One plugin's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PluginStatus {
    pub name: String,
    /// The plugin TOML.
    pub toml: PathBuf,
    /// The component's file: the `.wasm`, or for a component from a registry, its blob in
    /// the local store.
    pub wasm: Option<PathBuf>,
    /// The registry reference the component was pulled from, pinned to its manifest digest
    /// (`oci://registry/repository:tag@sha256:...`), for a plugin whose `wasm` names one
    /// (while it waits for its tag: the reference as its TOML names it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Short content hash of the running `.wasm`, when one runs.
    pub version: Option<String>,
    pub state: PluginState,
    /// Whether its controller's informers have synced and its workers run.
    pub ready: bool,
    /// The last load or reload error (cleared by the next successful load).
    pub last_error: Option<String>,
    /// Something about the running version worth knowing (it runs without its file, or
    /// from the local store while its registry cannot be reached).
    pub note: Option<String>,
    /// Successful loads and reloads.
    pub reloads: u64,
    /// Rejected loads and reloads.
    pub rejected: u64,
    /// When the state last changed, in seconds since the Unix epoch.
    pub since: u64,
}

impl PluginStatus {
    pub(crate) fn new(name: &str, toml: PathBuf) -> Self {
        PluginStatus {
            name: name.to_owned(),
            toml,
            wasm: None,
            source: None,
            version: None,
            state: PluginState::Starting,
            ready: false,
            last_error: None,
            note: None,
            reloads: 0,
            rejected: 0,
            since: now(),
        }
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Asks a running controller whether it is ready, and why not.
pub(crate) type ReadinessProbe = Arc<dyn Fn() -> (bool, Option<String>) + Send + Sync>;

/// The status of every plugin, keyed by the stem of its TOML; shared between the manager
/// (which writes) and the HTTP server (which reads).
#[derive(Clone)]
pub struct StatusBoard {
    plugins: Arc<RwLock<BTreeMap<String, PluginStatus>>>,
    /// Readiness of each running controller, asked on demand.
    probes: Arc<RwLock<BTreeMap<String, ReadinessProbe>>>,
    metrics: Arc<Metrics>,
    /// Whether the initial scan finished (the host is not ready before).
    started: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for StatusBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusBoard").field("plugins", &*self.plugins.read()).finish_non_exhaustive()
    }
}

impl StatusBoard {
    /// A board reporting to `metrics` (its `wasmctrl_plugin_running` collector is registered
    /// there: one board per registry).
    pub fn new(metrics: Arc<Metrics>) -> Self {
        let board =
            StatusBoard { plugins: Arc::default(), probes: Arc::default(), metrics, started: Arc::default() };
        board.metrics.register_collector(Box::new(RunningCollector {
            plugins: board.plugins.clone(),
            probes: board.probes.clone(),
        }));
        board
    }

    /// Every plugin's status, by TOML stem, with `ready` filled in from its controller.
    pub fn snapshot(&self) -> Vec<PluginStatus> {
        self.snapshot_with_errors().into_iter().map(|(s, _)| s).collect()
    }

    /// As [`snapshot`](Self::snapshot), with each running controller's own error.
    fn snapshot_with_errors(&self) -> Vec<(PluginStatus, Option<String>)> {
        snapshot_with_errors(&self.plugins, &self.probes)
    }

    /// One plugin's status, by name (or else by the stem of its TOML).
    pub fn get(&self, name: &str) -> Option<PluginStatus> {
        let ids = self.ids();
        let all = self.snapshot();
        // The plugin's own entry first (a refused file claiming the name has its own).
        let at = ids
            .iter()
            .position(|id| id == name)
            .or_else(|| all.iter().position(|s| s.name == name))
            .or_else(|| all.iter().position(|s| s.toml.file_stem().is_some_and(|f| f == name)));
        at.and_then(|at| all.into_iter().nth(at))
    }

    /// The ids of every entry.
    pub(crate) fn ids(&self) -> Vec<String> {
        self.plugins.read().keys().cloned().collect()
    }

    pub(crate) fn mark_started(&self) {
        self.started.store(true, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn update(&self, stem: &str, toml: PathBuf, f: impl FnOnce(&mut PluginStatus)) {
        let mut plugins = self.plugins.write();
        let s = plugins.entry(stem.to_owned()).or_insert_with(|| PluginStatus::new(stem, toml));
        let before = s.state;
        f(s);
        if s.state != before {
            s.since = now();
        }
    }

    pub(crate) fn set_probe(&self, stem: &str, probe: Option<ReadinessProbe>) {
        let mut probes = self.probes.write();
        match probe {
            Some(p) => probes.insert(stem.to_owned(), p),
            None => probes.remove(stem),
        };
    }

    pub(crate) fn remove(&self, stem: &str) {
        self.plugins.write().remove(stem);
        self.probes.write().remove(stem);
    }

    /// Counts a load/reload outcome in `wasmctrl_plugin_reloads_total`.
    pub(crate) fn count_reload(&self, plugin: &str, success: bool) {
        self.metrics
            .plugin_reloads
            .get_or_create(&PluginResultLabels {
                plugin: plugin.to_owned(),
                result: if success { "success" } else { "rejected" }.to_owned(),
            })
            .inc();
    }

    /// Points `wasmctrl_plugin_info` at `version` (removing `previous`'s series).
    pub(crate) fn set_info(&self, plugin: &str, previous: Option<&str>, version: Option<&str>) {
        if let Some(prev) = previous
            && Some(prev) != version
        {
            self.metrics
                .plugin_info
                .remove(&PluginInfoLabels { plugin: plugin.to_owned(), version: prev.to_owned() });
        }
        if let Some(v) = version {
            self.metrics
                .plugin_info
                .get_or_create(&PluginInfoLabels { plugin: plugin.to_owned(), version: v.to_owned() })
                .set(1);
        }
    }
}

type Plugins = Arc<RwLock<BTreeMap<String, PluginStatus>>>;
type Probes = Arc<RwLock<BTreeMap<String, ReadinessProbe>>>;

/// Every plugin's status with `ready` filled in from its controller, and each running
/// controller's own error.
fn snapshot_with_errors(plugins: &Plugins, probes: &Probes) -> Vec<(PluginStatus, Option<String>)> {
    let probes = probes.read();
    let mut plugins = plugins.write();
    plugins
        .iter_mut()
        .map(|(stem, stored)| {
            let mut controller_error = None;
            if let Some(probe) = probes.get(stem) {
                let (ready, error) = probe();
                stored.ready = ready;
                // Running from the first time its controller is up until it stops.
                if stored.state == PluginState::Starting && ready {
                    stored.state = PluginState::Running;
                    stored.since = now();
                }
                controller_error = error;
            } else {
                stored.ready = false;
            }
            let mut s = stored.clone();
            if let (Some(e), None) = (&controller_error, &s.last_error) {
                s.last_error = Some(e.clone());
            }
            (s, controller_error)
        })
        .collect()
}

/// Why a plugin has no running version (`/readyz`), or `None` when one runs or the plugin
/// is being removed.
fn no_running_version(s: &PluginStatus, controller_error: Option<String>) -> Option<String> {
    match s.state {
        PluginState::Running => controller_error.map(|e| format!("its controller failed: {e}")),
        PluginState::Starting => Some("starting (informers syncing or workers not running yet)".to_owned()),
        PluginState::WaitingForWasm => Some(format!(
            "waiting for its .wasm ({})",
            // A registry reference (its tag not pushed yet), or the file.
            s.source.clone().unwrap_or_else(|| {
                s.wasm.as_ref().map_or_else(|| "?".to_owned(), |w| w.display().to_string())
            })
        )),
        PluginState::Failed => {
            Some(format!("failed: {}", s.last_error.as_deref().unwrap_or("unknown error")))
        }
        PluginState::Stopping => None,
    }
}

/// `wasmctrl_plugin_running{plugin}`, computed from the board at each scrape.
struct RunningCollector {
    plugins: Plugins,
    probes: Probes,
}

impl std::fmt::Debug for RunningCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningCollector").finish_non_exhaustive()
    }
}

impl prometheus_client::collector::Collector for RunningCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        let family = Family::<PluginLabels, Gauge>::default();
        for (s, controller_error) in snapshot_with_errors(&self.plugins, &self.probes) {
            if s.state == PluginState::Stopping {
                continue;
            }
            let running = no_running_version(&s, controller_error).is_none();
            family.get_or_create(&PluginLabels { plugin: s.name.clone() }).set(i64::from(running));
        }
        let metric = encoder.encode_descriptor(
            "wasmctrl_plugin_running",
            "1 while a version of the plugin runs (its controller synced and up), 0 while it has none (starting, waiting for its .wasm, failed)",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

impl StatusSource for StatusBoard {
    fn readiness(&self) -> Readiness {
        let mut details = Vec::new();
        let mut ready = self.started.load(std::sync::atomic::Ordering::Acquire);
        if !ready {
            details.push("plugins directory not loaded yet".to_owned());
        }
        for (s, controller_error) in self.snapshot_with_errors() {
            let missing = no_running_version(&s, controller_error);
            if let Some(why) = missing {
                ready = false;
                details.push(format!("plugin {}: no running version: {why}", s.name));
                continue;
            }
            if s.state == PluginState::Running
                && let Some(note) = &s.note
            {
                details.push(format!("plugin {}: {note}", s.name));
            }
            if s.state == PluginState::Running
                && let Some(e) = &s.last_error
            {
                details.push(format!(
                    "plugin {}: reload rejected, still running version {}: {e}",
                    s.name,
                    s.version.as_deref().unwrap_or("?")
                ));
            }
        }
        Readiness { ready, details }
    }

    fn plugins(&self) -> serde_json::Value {
        serde_json::to_value(self.snapshot()).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> StatusBoard {
        let b = StatusBoard::new(Metrics::new());
        b.mark_started();
        b
    }

    fn probe(ready: bool, error: Option<&str>) -> ReadinessProbe {
        let error = error.map(str::to_owned);
        Arc::new(move || (ready, error.clone()))
    }

    fn set(b: &StatusBoard, stem: &str, state: PluginState, error: Option<&str>) {
        b.update(stem, PathBuf::from(format!("{stem}.toml")), |s| {
            s.state = state;
            s.version = Some("abc".into());
            s.last_error = error.map(str::to_owned);
        });
    }

    #[test]
    fn ready_while_every_plugin_has_a_running_version() {
        let b = board();
        assert!(b.readiness().ready, "no plugin: nothing to wait for");
        set(&b, "one", PluginState::Starting, None);
        b.set_probe("one", Some(probe(false, None)));
        let r = b.readiness();
        assert!(!r.ready);
        assert!(r.details.iter().any(|d| d.starts_with("plugin one: no running version: starting")), "{r:?}");
        b.set_probe("one", Some(probe(true, None)));
        assert!(b.readiness().ready);
        // Once up, a restart's new controller that is not up yet keeps the plugin running.
        b.set_probe("one", Some(probe(false, None)));
        assert!(b.readiness().ready);
        assert_eq!(b.get("one").map(|s| s.state), Some(PluginState::Running));
        // A rejected reload is listed, not fatal.
        b.update("one", PathBuf::from("one.toml"), |s| s.last_error = Some("bad wasm".into()));
        let r = b.readiness();
        assert!(r.ready);
        assert!(
            r.details.iter().any(|d| d.contains("reload rejected, still running version abc: bad wasm")),
            "{r:?}"
        );
        // A controller that failed is not a running version.
        b.update("one", PathBuf::from("one.toml"), |s| s.last_error = None);
        b.set_probe("one", Some(probe(false, Some("caches did not sync"))));
        let r = b.readiness();
        assert!(!r.ready);
        assert!(
            r.details.iter().any(|d| d.contains("plugin one: no running version: its controller failed")),
            "{r:?}"
        );
    }

    #[test]
    fn each_plugin_without_a_version_is_named() {
        let b = board();
        set(&b, "ok", PluginState::Starting, None);
        b.set_probe("ok", Some(probe(true, None)));
        set(&b, "broken", PluginState::Failed, Some("init failed"));
        set(&b, "waiting", PluginState::WaitingForWasm, None);
        set(&b, "leaving", PluginState::Stopping, None);
        let r = b.readiness();
        assert!(!r.ready);
        assert_eq!(r.details.len(), 2, "{r:?}");
        assert!(
            r.details.iter().any(|d| d == "plugin broken: no running version: failed: init failed"),
            "{r:?}"
        );
        assert!(
            r.details
                .iter()
                .any(|d| d.starts_with("plugin waiting: no running version: waiting for its .wasm"))
        );
    }

    #[test]
    fn running_gauge_follows_each_plugin() {
        let metrics = Metrics::new();
        let b = StatusBoard::new(metrics.clone());
        b.mark_started();
        set(&b, "ok", PluginState::Starting, None);
        b.set_probe("ok", Some(probe(true, None)));
        set(&b, "broken", PluginState::Failed, Some("init failed"));
        set(&b, "leaving", PluginState::Stopping, None);
        let text = metrics.encode();
        assert!(text.contains("wasmctrl_plugin_running{plugin=\"ok\"} 1"), "{text}");
        assert!(text.contains("wasmctrl_plugin_running{plugin=\"broken\"} 0"), "{text}");
        assert!(!text.contains("plugin=\"leaving\""), "{text}");
        // A controller that failed after start is no running version either.
        b.set_probe("ok", Some(probe(false, Some("caches did not sync"))));
        assert!(metrics.encode().contains("wasmctrl_plugin_running{plugin=\"ok\"} 0"));
    }

    #[test]
    fn not_ready_before_the_directory_was_loaded() {
        let b = StatusBoard::new(Metrics::new());
        let r = b.readiness();
        assert!(!r.ready);
        assert_eq!(r.details, vec!["plugins directory not loaded yet".to_owned()]);
    }
}
