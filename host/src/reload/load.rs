//! One plugin name brought in line with the latest plan: stopped when no file claims it any
//! more, else the version its TOML describes loaded (see `candidate`) or rejected.
//!
//! Loading one version: the checked TOML from the snapshot, its kinds resolved against
//! discovery, its code fetched ([`CodeSource`]: the one seam between a TOML and its bytes,
//! a `.wasm` file or a component pulled from an OCI registry), the TOML checked unchanged
//! since the snapshot (so code and TOML are of one moment), then the candidate built from
//! them. Any failure rejects this version: logged, counted in
//! `wasmctrl_plugin_reloads_total{result="rejected"}`, shown in `/plugins` and `/readyz`;
//! a running version keeps running.
//!
//! A registry pull runs outside a plugin's lock (and never in the plan), so a slow registry
//! holds up no stop, shutdown or other plugin.
//!
//! A running version whose code is gone (its file removed, its registry tag deleted) keeps
//! running (its compiled code is kept loaded from then on) and says so in `/plugins` and
//! `/readyz`; a TOML edit meanwhile is applied with the running version's compiled code, or
//! refused saying why. A registry version that had to be taken from the local store (the
//! registry could not be reached) runs and says so the same way, until a round reaches the
//! registry again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::candidate::{CodeInput, ShownCode};
use super::code_source::{CodeSource, Fetched};
use super::manager_core::{ManagerCore, Rejection, Running};
use super::snapshot::{Claim, FileId};
use super::status::PluginState;
use crate::config::{KindLookupError, KindResolver, PluginConfig, ResolvedKind};
use crate::plugin::Gvk;

/// Discovery answers gathered up front, so the sync config checks can use them.
struct ResolvedKinds(BTreeMap<Gvk, Result<ResolvedKind, KindLookupError>>);

impl KindResolver for ResolvedKinds {
    fn resolve(&self, kind: &Gvk) -> Result<ResolvedKind, KindLookupError> {
        self.0.get(kind).cloned().unwrap_or(Err(KindLookupError::Unknown))
    }
}

/// A registry pull made before a plugin's lock was taken.
enum Prefetch {
    /// The plugin's code is not from a registry (or its TOML is refused): fetched, if at
    /// all, under the lock.
    NotNeeded,
    Pulled(Box<Prefetched>),
    /// The manager is shutting down.
    Cancelled,
}

/// What was pulled, and for which TOML (as the plan read it).
struct Prefetched {
    toml: PathBuf,
    id: FileId,
    fetched: Result<Fetched, String>,
}

impl ManagerCore {
    /// Brings the plugin `name` in line with the latest plan.
    pub(super) async fn sync_name(self: &Arc<Self>, name: &str) {
        // A registry pull may take long (a slow or unreachable registry): it runs before the
        // plugin's lock is taken, so a stop, a shutdown or a load of the same plugin never
        // waits behind it.
        let prefetched = match self.prefetch(name).await {
            Prefetch::Pulled(p) => Some(p),
            Prefetch::NotNeeded => None,
            Prefetch::Cancelled => return,
        };
        let (slot, mut running) = loop {
            let slot = self.slot(name);
            let guard = slot.clone().lock_owned().await;
            // The slot may have moved (a rename) or gone (a stop) while this task waited.
            if self.slots.lock().get(name).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                break (slot, guard);
            }
        };
        if self.shutdown.is_cancelled() {
            return;
        }
        let claim = self.desired.lock().get(name).cloned();
        let Some(claim) = claim else {
            if let Some(r) = running.take() {
                self.stop_plugin(name, r).await;
            }
            self.status.remove(name);
            self.runs.lock().remove(name);
            let mut slots = self.slots.lock();
            if slots.get(name).is_some_and(|s| Arc::ptr_eq(s, &slot)) {
                slots.remove(name);
            }
            return;
        };
        let fetched = match prefetched {
            // Pulled for this very TOML: used as it is.
            Some(p) if p.toml == claim.toml && p.id == claim.id => Some(p.fetched),
            // The plan changed while pulling: the round that changed it syncs this plugin
            // again, with a pull of its own.
            Some(_) => return,
            None => None,
        };
        if let Err(Rejection(error)) = self.load(name, &claim, fetched, &mut running).await {
            let keeps = running.as_ref().map(|r| r.generation.version.clone());
            tracing::warn!(
                plugin = %name,
                file = %claim.toml.display(),
                running_version = keeps.as_deref().unwrap_or("none"),
                error = %error,
                "plugin rejected{}",
                if keeps.is_some() { "; the running version keeps running" } else { "" }
            );
            self.status.count_reload(name, false);
            self.status.update(name, claim.toml.clone(), |s| {
                s.name = name.to_owned();
                s.last_error = Some(error);
                s.rejected += 1;
                if keeps.is_none() {
                    s.state = PluginState::Failed;
                }
            });
        }
    }

    /// Pulls the code of the plugin `name` when it comes from a registry, for the TOML the
    /// latest plan gives it, without holding any lock (see [`Self::sync_name`]).
    async fn prefetch(&self, name: &str) -> Prefetch {
        let claim = self.desired.lock().get(name).cloned();
        let Some(Claim { toml, id, config: Ok(config) }) = claim else { return Prefetch::NotNeeded };
        let source = self.code_source(&config);
        if !source.is_registry() {
            return Prefetch::NotNeeded;
        }
        // A plugin new to the manager is starting while its code is pulled.
        if self.status.get(name).is_none() {
            self.status.update(name, toml.clone(), |s| {
                s.name = name.to_owned();
                s.state = PluginState::Starting;
            });
        }
        tokio::select! {
            _ = self.shutdown.cancelled() => Prefetch::Cancelled,
            fetched = source.fetch() => Prefetch::Pulled(Box::new(Prefetched { toml, id, fetched })),
        }
    }

    /// Loads the version `claim` describes and starts, swaps or restarts the plugin.
    /// Nothing running changes unless every check passed.
    ///
    /// The steps, in this order: the TOML as read by the plan, its kinds resolved
    /// ([`Self::resolve_kinds`]), its code fetched ([`CodeSource::fetch`]; `fetched` when
    /// it was pulled before the lock was taken) and the TOML checked unchanged since, then
    /// [`Self::apply`].
    async fn load(
        self: &Arc<Self>,
        name: &str,
        claim: &Claim,
        fetched: Option<Result<Fetched, String>>,
        running: &mut Option<Running>,
    ) -> Result<(), Rejection> {
        let started = Instant::now();
        let mut config = claim.config.clone().map_err(Rejection)?;
        if let Some(sharding) = &self.options.sharding {
            // Label mode: the `for` source watches this shard's objects only.
            sharding.scope(&mut config);
        }
        if running.is_none() {
            self.status.update(name, claim.toml.clone(), |s| {
                s.name = name.to_owned();
                s.state = PluginState::Starting;
            });
        }
        self.resolve_kinds(&config).await?;
        let source = self.code_source(&config);
        let fetched = match fetched {
            Some(fetched) => fetched,
            None => source.fetch().await,
        };
        let code = match fetched.map_err(Rejection)? {
            Fetched::Ready(code) => code,
            Fetched::Unsettled => {
                self.retry_later();
                return Ok(());
            }
            Fetched::Missing => {
                return self.without_code(name, claim, config, &source, running, started).await;
            }
        };
        // One snapshot: the TOML this code goes with is still the one read.
        if FileId::of(&claim.toml).ok().flatten().as_ref() != Some(&claim.id) {
            self.retry_later();
            return Ok(());
        }
        self.apply(name, claim, config, CodeInput::Bytes(code), running, started).await
    }

    /// The plugin's code is missing. With no running version, the plugin waits for it; a
    /// running version keeps running (its compiled code kept loaded) and says so, and a
    /// changed TOML is applied with that code.
    async fn without_code(
        self: &Arc<Self>,
        name: &str,
        claim: &Claim,
        config: PluginConfig,
        source: &CodeSource,
        running: &mut Option<Running>,
        started: Instant,
    ) -> Result<(), Rejection> {
        let Some(r) = running.as_ref() else {
            tracing::info!(plugin = %name, code = %source, "waiting for the plugin's code");
            self.status.update(name, claim.toml.clone(), |s| {
                s.state = PluginState::WaitingForWasm;
                s.wasm = source.file().map(Path::to_path_buf);
                s.source = source.origin();
            });
            return Ok(());
        };
        let plugin = r.generation.plugin.plugin().clone();
        let mut note = format!("running version {} keeps running {}", r.generation.version, source.gone());
        if let Err(e) = plugin.keep_code() {
            note.push_str(&format!("; its compiled code can no longer be loaded: {e}"));
        }
        if r.generation.config != config {
            note.push_str("; TOML edits are applied with the running version's compiled code");
        }
        tracing::warn!(plugin = %name, version = %r.generation.version, code = %source, "{note}");
        self.status.update(name, claim.toml.clone(), |s| s.note = Some(note.clone()));
        // Shown as it was loaded (a file: as the TOML names it now).
        let (file, origin) = self.status.get(name).map(|s| (s.wasm, s.source)).unwrap_or_default();
        let shown = ShownCode {
            file: source.file().map(Path::to_path_buf).or(file),
            origin: source.origin().map(|now| origin.unwrap_or(now)),
            note: Some(note),
        };
        let input = CodeInput::Loaded {
            full: plugin.version().to_owned(),
            short: r.generation.version.clone(),
            shown,
        };
        self.apply(name, claim, config, input, running, started).await
    }

    /// Asks discovery about every kind the TOML names (each once) and checks the TOML's use
    /// of them.
    async fn resolve_kinds(&self, config: &PluginConfig) -> Result<(), Rejection> {
        let mut kinds = BTreeMap::new();
        for (_, kind) in config.kinds() {
            if !kinds.contains_key(kind) {
                kinds.insert(kind.clone(), self.deps.informers.resolve(kind).await);
            }
        }
        config.check_kinds(&ResolvedKinds(kinds))?;
        Ok(())
    }
}
