//! A candidate version: built from a checked TOML and its code, and handed the plugin only
//! once every check passed.
//!
//! Everything the new version needs comes before anything running is touched: its field
//! manager checked against the other plugins', leases on its informers synced, the
//! component compiled and its `init` run, its hooks and handlers checked against its TOML.
//! Any failure rejects this version (a [`Rejection`]); a running version keeps running.
//! Then the hand-off (swap, restart or first start, see `handoff`) and the record of the
//! new version in `/plugins`, `/readyz` and the metrics.
//!
//! Admission (a plugin with `[[admission]]`, see [`crate::admission`]): once a new version
//! took over, the admission router is pointed at it in one swap — reviews after it go to the
//! new version, reviews in flight finish on the old one; a stopped plugin's webhooks go
//! first. A version whose sections need exports its component lacks, or a host without an
//! admission server, is rejected like any broken version.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::code_source::Code;
use super::generation::Generation;
use super::handoff::{Candidate, needs_restart};
use super::leases::Leases;
use super::manager_core::{ManagerCore, Rejection, RunInfo, Running};
use super::slot::VersionSlot;
use super::snapshot::Claim;
use super::status::PluginState;
use crate::config::PluginConfig;
use crate::plugin::{Plugin, PluginEnv, PluginReconciler};

/// The code a candidate version is built from.
pub(super) enum CodeInput {
    /// Bytes just fetched.
    Bytes(Code),
    /// The running version's compiled code (its code is gone from its source): its full
    /// content hash, and what the status shows of it.
    Loaded { full: String, short: String, shown: ShownCode },
}

/// What `/plugins` shows of a version's code: `wasm`, `source` and `note`.
#[derive(Clone, Debug, Default)]
pub(super) struct ShownCode {
    /// The file the code was read from (the `.wasm`, or the blob in the registry store).
    pub(super) file: Option<PathBuf>,
    /// Where it came from when that is not just the file (a pinned registry reference).
    pub(super) origin: Option<String>,
    pub(super) note: Option<String>,
}

impl CodeInput {
    fn version(&self) -> &str {
        match self {
            CodeInput::Bytes(c) => &c.version,
            CodeInput::Loaded { short, .. } => short,
        }
    }

    fn shown(&self) -> ShownCode {
        match self {
            CodeInput::Bytes(c) => {
                ShownCode { file: Some(c.file.clone()), origin: c.origin.clone(), note: c.note.clone() }
            }
            CodeInput::Loaded { shown, .. } => shown.clone(),
        }
    }
}

/// Checks a compiled component against its TOML (the hooks it exports, the
/// informers and predicates its handlers need) and wraps it in a dispatcher whose hooks stay
/// closed until they are opened by the hand-off.
fn check_component(
    config: &PluginConfig,
    leases: &Leases,
    plugin: Plugin,
) -> Result<Arc<PluginReconciler>, Rejection> {
    let hooks = plugin.hooks();
    config.check_hooks(hooks.map, hooks.filter)?;
    let reconciler = PluginReconciler::new_gated(plugin)
        .map_err(|e| Rejection(format!("cannot start the plugin's dispatcher: {e}")))?;
    Generation::check(config, leases, &VersionSlot::new(reconciler.clone())).map_err(Rejection)?;
    Ok(reconciler)
}

impl ManagerCore {
    /// Takes the informer leases and waits for them to sync, compiles the component, checks
    /// it; only then the hand-off — swap, restart or first start (see `handoff`) — and the
    /// record of the new version.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply(
        self: &Arc<Self>,
        name: &str,
        claim: &Claim,
        config: PluginConfig,
        code: CodeInput,
        running: &mut Option<Running>,
        started: Instant,
    ) -> Result<(), Rejection> {
        let version = code.version().to_owned();
        if let Some(r) = running.as_ref()
            && r.generation.config == config
            && r.generation.version == version
            && r.name() == name
            && r.alive()
        {
            // The files are back to what runs: an earlier rejection no longer applies (and
            // the code is shown as fetched now: its file back, its registry reachable again).
            let shown = code.shown();
            self.status.update(name, claim.toml.clone(), |s| {
                s.last_error = None;
                s.wasm = shown.file;
                s.source = shown.origin;
                s.note = shown.note;
            });
            return Ok(());
        }

        self.check_field_manager(name, &config)?;
        // Everything the new version needs, before touching the running one.
        let Some(leases) = self.sync_leases(&config).await? else {
            return Ok(());
        };
        let shown = code.shown();
        let plugin = self.compile(&config, &leases, code).await?;
        config.check_admission_served(self.options.admission.is_some())?;
        config.check_admission_exports(plugin.admission_exports())?;
        let admitting = (plugin.clone(), config.admission.clone());
        let reconciler = check_component(&config, &leases, plugin)?;
        let previous_name = running.as_ref().map(|r| r.name().to_owned());

        let previous = running.as_ref().map(|r| r.generation.version.clone());
        let restart =
            running.as_ref().is_some_and(|r| needs_restart(&r.generation.config, &config) || !r.alive());
        let for_keys = leases.for_keys(&config);
        let (file, wasm) = (config.file.clone(), config.wasm_path.clone());
        let field_manager = config.field_manager.clone();
        let candidate = Candidate { config, version: version.clone(), reconciler, leases };
        match running.take() {
            Some(r) if !restart => self.swap(running, r, candidate, for_keys).await?,
            Some(old) => self.restart(running, old, candidate).await?,
            None => self.first_start(running, candidate)?,
        }
        if let Some(router) = &self.options.admission {
            // Reviews from now on go to this version; those in flight finish on the old one.
            router.install(previous_name.as_deref(), admitting.0, admitting.1).await;
        }
        self.runs.lock().insert(
            name.to_owned(),
            RunInfo { toml: claim.toml.clone(), file, version: version.clone(), field_manager, wasm },
        );
        self.record_loaded(name, &claim.toml, running, &version, previous.as_deref(), shown, started);
        Ok(())
    }

    /// Takes leases on the plugin's informers and waits (bounded by the sync timeout) until
    /// all have synced. `None`: the manager is shutting down.
    async fn sync_leases(&self, config: &PluginConfig) -> Result<Option<Leases>, Rejection> {
        let leases = Leases::acquire(config, &*self.deps.informers).await.map_err(Rejection)?;
        let all = futures::future::join_all(leases.informers.values().map(|i| i.synced()));
        tokio::select! {
            _ = self.shutdown.cancelled() => Ok(None),
            synced = tokio::time::timeout(self.options.cache_sync_timeout, all) => match synced {
                Ok(_) => Ok(Some(leases)),
                Err(_) => {
                    let pending: Vec<String> = leases
                        .informers
                        .iter()
                        .filter(|(_, i)| !i.has_synced())
                        .map(|(k, _)| k.to_string())
                        .collect();
                    Err(Rejection(format!(
                        "informers did not sync within {:?}: {}",
                        self.options.cache_sync_timeout,
                        pending.join(", ")
                    )))
                }
            }
        }
    }

    /// Compiles the component (or takes the running version's compiled code) and runs its
    /// `init` (on a blocking thread), with the leased caches as its view of the cluster.
    async fn compile(
        &self,
        config: &PluginConfig,
        leases: &Leases,
        code: CodeInput,
    ) -> Result<Plugin, Rejection> {
        let spec = config.to_plugin_spec();
        let env = PluginEnv { caches: leases.caches(), kube: self.deps.kube.clone() };
        let engine = self.deps.engine.clone();
        // The file holding exactly this code, read again should the compile cache lose it
        // (the code of a `Loaded` version is kept loaded: its file is not read again).
        let path = code.shown().file.unwrap_or_else(|| config.wasm_path.clone());
        // Many plugins starting together take turns (a few threads load them all).
        let _slot = engine.load_slot().await;
        tokio::task::spawn_blocking(move || match code {
            CodeInput::Bytes(code) => Plugin::load_file(&engine, spec, &path, &code.bytes, env),
            CodeInput::Loaded { full, .. } => {
                let plugin = Plugin::load_version(&engine, spec, &full, &path, env)?;
                plugin.keep_code()?;
                Ok(plugin)
            }
        })
        .await
        .map_err(|e| Rejection(format!("loading the component failed: {e}")))?
        .map_err(|e| Rejection(e.to_string()))
    }

    /// Records a loaded version: readiness probe, status and metrics.
    #[allow(clippy::too_many_arguments)]
    fn record_loaded(
        &self,
        name: &str,
        toml: &Path,
        running: &Option<Running>,
        version: &str,
        previous: Option<&str>,
        shown: ShownCode,
        started: Instant,
    ) {
        if let Some(r) = running.as_ref() {
            let controller = r.controller.clone();
            self.status.set_probe(
                name,
                Some(Arc::new(move || {
                    let r = controller.readiness();
                    (r.is_ready(), r.error)
                })),
            );
            self.status.update(name, toml.to_owned(), |s| {
                s.name = name.to_owned();
                s.toml = toml.to_owned();
                s.wasm = shown.file;
                s.source = shown.origin;
                s.note = shown.note;
                s.version = Some(version.to_owned());
                s.last_error = None;
                s.reloads += 1;
                if s.state != PluginState::Running {
                    s.state = PluginState::Starting;
                }
            });
        }
        self.status.set_info(name, previous, Some(version));
        self.status.count_reload(name, true);
        tracing::info!(
            plugin = %name,
            version = %version,
            previous = previous.unwrap_or("none"),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "plugin {}",
            if previous.is_some() { "reloaded" } else { "loaded" }
        );
    }
}
