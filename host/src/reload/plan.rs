//! The plan: which file each plugin name runs from, decided in one place from one snapshot
//! of the directory, so there is no race between two files, two names or two rounds.
//!
//! A plugin is its `name` (the TOML's `name`, or the file's stem), not its file:
//!
//! - a name whose TOML moved to another file is the same plugin: the move is a reload like
//!   any other (its queue, retries and pending deletes follow it);
//! - two files renamed together (TOML and code, contents unchanged, within one quiet
//!   period) are a rename of the same plugin even with default names: a controller restart
//!   under the new name that hands the queue over (and what it parked moves along). A
//!   round that reads the TOML renamed and its code not yet (the old code still there: a
//!   slow script, or a periodic rescan between the two renames) leaves the plugin as it is
//!   and waits for the code to follow, for [`RENAME_GRACE`] or a few quiet periods;
//! - two files that claim one name: the file the running version came from keeps it (else
//!   the first by path), the other is refused, in `/plugins` and `/readyz`, and loads once
//!   the conflict is gone;
//! - a name no file claims any more stops (its pending keys are parked with their kind, see
//!   `parked`).
//!
//! Field managers are unique like names: no plugin's manager is another's, or another's
//! followed by `/` (no plugin writes as another). The plan decides it as it decides names:
//! the running plugin keeps its manager, the other claim is refused until the overlap goes
//! (and a running plugin's new version is checked when it loads).
//!
//! The plan never waits on a registry: a registry component is not pulled here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::code_source::{CodeSource, Fetched};
use super::manager_core::{ManagerCore, Rejection, RunInfo};
use super::snapshot::Claim;
use super::status::PluginState;
use crate::config::PluginConfig;
use crate::plugin::spec::field_managers_overlap;

/// How long a rename whose TOML moved before its code is waited for (at least; four quiet
/// periods when that is longer), before the two files are taken for what they are.
pub(super) const RENAME_GRACE: Duration = Duration::from_secs(2);

impl ManagerCore {
    /// Reads the directory as one snapshot and decides which file each plugin name runs
    /// from (see the module doc). Returns the names to sync: every one claimed or running.
    pub(super) async fn plan(self: &Arc<Self>) -> Vec<String> {
        let dir = self.options.plugins_dir.clone();
        let defaults = self.options.defaults.clone();
        let read = tokio::task::spawn_blocking(move || super::snapshot::read(&dir, &defaults)).await;
        let snapshot = match read {
            Ok(Ok(Some(s))) => s,
            Ok(Ok(None)) => {
                tracing::debug!("the plugins directory changed while being read; reading it again later");
                self.retry_later();
                return Vec::new();
            }
            Ok(Err(e)) => {
                tracing::error!(dir = %self.options.plugins_dir.display(), error = %e, "cannot read the plugins directory");
                return Vec::new();
            }
            Err(e) => {
                tracing::error!(error = %e, "reading the plugins directory failed");
                return Vec::new();
            }
        };
        let runs = self.runs.lock().clone();
        let mut by_name: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        for claim in snapshot.claims {
            let name = match &claim.config {
                Ok(c) => c.name.clone(),
                // A broken TOML concerns the plugin that runs from it, else its stem's.
                Err(_) => runs
                    .iter()
                    .find(|(_, r)| r.toml == claim.toml)
                    .map(|(n, _)| n.clone())
                    .unwrap_or_else(|| claim.stem()),
            };
            by_name.entry(name).or_default().push(claim);
        }
        let mut desired: BTreeMap<String, Claim> = BTreeMap::new();
        let mut refused: Vec<(Claim, String, Refusal)> = Vec::new();
        for (name, mut claims) in by_name {
            // The file the running version came from keeps its name; else the first by path.
            let at =
                claims.iter().position(|c| runs.get(&name).is_some_and(|r| r.toml == c.toml)).unwrap_or(0);
            let winner = claims.remove(at);
            for other in claims {
                refused.push((other, name.clone(), Refusal::Name(winner.toml.clone())));
            }
            desired.insert(name, winner);
        }
        self.refuse_shared_field_managers(&runs, &mut desired, &mut refused);
        let waiting = self.find_renames(&runs, &desired).await;
        if !waiting.is_empty() {
            // A rename half-way: both names stay as the previous plan had them.
            let previous = self.desired.lock();
            for name in &waiting {
                match previous.get(name) {
                    Some(claim) => desired.insert(name.clone(), claim.clone()),
                    None => desired.remove(name),
                };
            }
        }
        self.record_refused(refused, &desired);
        let mut dirs: BTreeSet<PathBuf> = snapshot.real_dir.into_iter().collect();
        let mut from_registry = BTreeSet::new();
        for claim in desired.values() {
            let Ok(config) = &claim.config else { continue };
            let source = self.code_source(config);
            if let Some(d) = source.watch_dir()
                && let Ok(d) = std::fs::canonicalize(d)
            {
                dirs.insert(d);
            }
            if config.wasm_registry.is_some() {
                from_registry.insert(claim.toml.clone());
            }
        }
        *self.watch_dirs.lock() = dirs;
        // Tags are followed for the TOMLs that name them now, and no others.
        if let Some(registry) = &self.options.registry {
            registry.follow_only(&from_registry);
        }
        let mut names: BTreeSet<String> = desired.keys().cloned().collect();
        names.extend(self.slots.lock().keys().cloned());
        *self.desired.lock() = desired;
        names.into_iter().filter(|n| !waiting.contains(n)).collect()
    }

    /// A running plugin with a default name whose files were renamed together (same TOML
    /// contents, same code) is the same plugin under its new name: its slot and the queues
    /// it parked move there, and the load that follows is a restart that hands its queue
    /// over.
    ///
    /// Returns the names to leave alone this round: a rename read half-way (the TOML under
    /// its new name, the code not yet, the old code still there) waits for the code to
    /// follow, for at most [`RENAME_GRACE`] (or four quiet periods), before the files are
    /// taken for what they are (the old plugin stopped, the new one waiting for its code).
    async fn find_renames(
        &self,
        runs: &BTreeMap<String, RunInfo>,
        desired: &BTreeMap<String, Claim>,
    ) -> BTreeSet<String> {
        let gone: Vec<(&String, &RunInfo)> =
            runs.iter().filter(|(n, r)| !desired.contains_key(*n) && r.file.name.is_none()).collect();
        let mut waiting = BTreeSet::new();
        let mut taken = BTreeSet::new();
        for (name, claim) in desired {
            let Ok(config) = &claim.config else { continue };
            if gone.is_empty() || runs.contains_key(name) || claim.explicit_name() {
                continue;
            }
            let Some((old, info)) =
                gone.iter().find(|(o, r)| !taken.contains(*o) && r.file == config.file).copied()
            else {
                continue;
            };
            // The same code too. A registry component is not pulled here (the plan never
            // waits on a registry): the same TOML names the same reference, and a tag
            // that moved meanwhile makes the restart under the new name a reload as well.
            let source = self.code_source(config);
            if !source.is_registry() {
                match source.fetch().await {
                    Ok(Fetched::Ready(code)) if code.version == info.version => {}
                    Ok(Fetched::Missing) => {
                        let old_code = CodeSource::File(info.wasm.clone()).fetch().await;
                        if matches!(old_code, Ok(Fetched::Ready(code)) if code.version == info.version) {
                            tracing::debug!(plugin = %name, previous_name = %old,
                                "a plugin's TOML was renamed and its code not yet: waiting for the code to follow");
                            waiting.extend([name.clone(), old.clone()]);
                        }
                        continue;
                    }
                    _ => continue,
                }
            }
            taken.insert(old.clone());
            tracing::info!(plugin = %name, previous_name = %old, file = %claim.toml.display(),
                "plugin files renamed together: the same plugin under a new name");
            let mut slots = self.slots.lock();
            if slots.get(name).is_none_or(|s| Arc::strong_count(s) <= 1)
                && let Some(slot) = slots.remove(old)
            {
                slots.insert(name.clone(), slot);
                drop(slots);
                let mut runs = self.runs.lock();
                if let Some(info) = runs.remove(old) {
                    runs.insert(name.clone(), info);
                }
                drop(runs);
                // What it parked (keys of a `for` kind it left) is its too.
                self.parked.lock().rename(old, name);
                self.status.remove(old);
            }
        }
        let mut since = self.rename_wait.lock();
        if waiting.is_empty() {
            *since = None;
            return waiting;
        }
        let grace = RENAME_GRACE.max(self.options.debounce * 4);
        if since.get_or_insert_with(Instant::now).elapsed() >= grace {
            tracing::info!(plugins = ?waiting, "the code of a renamed plugin TOML did not follow in time; taking the files as they are");
            *since = None;
            return BTreeSet::new();
        }
        drop(since);
        self.retry_later();
        waiting
    }

    /// Refuses every desired claim of a plugin that does not run whose field manager
    /// overlaps (see [`field_managers_overlap`]) the manager of a running plugin, or of
    /// another such claim first by name. The refused claims leave `desired` and load once
    /// the overlap is gone. A running plugin's new version is checked when it loads
    /// ([`Self::check_field_manager`]): refused there, its running version keeps running.
    fn refuse_shared_field_managers(
        &self,
        runs: &BTreeMap<String, RunInfo>,
        desired: &mut BTreeMap<String, Claim>,
        refused: &mut Vec<(Claim, String, Refusal)>,
    ) {
        let mut kept: Vec<(String, PathBuf)> = runs
            .iter()
            .filter(|(name, _)| desired.contains_key(*name))
            .map(|(_, r)| (r.field_manager.clone(), r.toml.clone()))
            .collect();
        let mut losers = Vec::new();
        for (name, claim) in desired.iter() {
            let Ok(config) = &claim.config else { continue };
            if runs.contains_key(name) {
                continue;
            }
            match kept.iter().find(|(theirs, _)| field_managers_overlap(theirs, &config.field_manager)) {
                Some((theirs, toml)) => losers.push((
                    name.clone(),
                    Refusal::FieldManager {
                        mine: config.field_manager.clone(),
                        theirs: theirs.clone(),
                        toml: toml.clone(),
                    },
                )),
                None => kept.push((config.field_manager.clone(), claim.toml.clone())),
            }
        }
        for (name, why) in losers {
            if let Some(claim) = desired.remove(&name) {
                refused.push((claim, name, why));
            }
        }
    }

    /// Refuses a new version of `name` whose field manager overlaps the manager of another
    /// running plugin (no plugin writes as another).
    pub(super) fn check_field_manager(&self, name: &str, config: &PluginConfig) -> Result<(), Rejection> {
        let runs = self.runs.lock();
        let Some((other, info)) = runs.iter().find(|(n, r)| {
            n.as_str() != name && field_managers_overlap(&r.field_manager, &config.field_manager)
        }) else {
            return Ok(());
        };
        Err(Rejection(
            config
                .field_error(
                    "field-manager",
                    format!(
                        "field manager `{}` overlaps `{}`, the field manager of plugin {other} ({}): \
                         a plugin writes only as its own manager",
                        config.field_manager,
                        info.field_manager,
                        info.toml.display()
                    ),
                )
                .with_hint("give each plugin a field manager of its own (the default, `wasmctrl-<name>`, is)")
                .to_string(),
        ))
    }

    /// Shows each refused claim (another file has its name or its field manager) in the
    /// status, and clears the entries of claims no longer refused.
    fn record_refused(&self, refused: Vec<(Claim, String, Refusal)>, desired: &BTreeMap<String, Claim>) {
        let mut ids = BTreeSet::new();
        let mut by_manager = BTreeSet::new();
        for (claim, name, why) in refused {
            // A claim refused for its name is shown under its file (the name is another's);
            // one refused for its field manager under its own name, which nothing else runs.
            let id = match why {
                Refusal::Name(_) => claim.toml.display().to_string(),
                Refusal::FieldManager { .. } => {
                    by_manager.insert(name.clone());
                    name.clone()
                }
            };
            let file_name = |p: &PathBuf| {
                p.file_name().map_or_else(|| p.display().to_string(), |f| f.to_string_lossy().into_owned())
            };
            let error = match (&claim.config, why) {
                (Ok(config), Refusal::Name(winner)) => config
                    .field_error(
                        "name",
                        format!(
                            "plugin name `{name}` is already used by {}; a name can run from one file only (this one loads once the other is gone or renamed)",
                            file_name(&winner)
                        ),
                    )
                    .to_string(),
                (Ok(config), Refusal::FieldManager { mine, theirs, toml }) => config
                    .field_error(
                        "field-manager",
                        format!(
                            "field manager `{mine}` overlaps `{theirs}`, the field manager of {}: \
                             a plugin writes only as its own manager (this one loads once the overlap is gone)",
                            file_name(&toml)
                        ),
                    )
                    .with_hint("give each plugin a field manager of its own (the default, `wasmctrl-<name>`, is)")
                    .to_string(),
                (Err(e), _) => e.clone(),
            };
            self.status.update(&id, claim.toml.clone(), |s| {
                s.name = name.clone();
                s.state = PluginState::Failed;
                if s.last_error.as_deref() != Some(error.as_str()) {
                    s.rejected += 1;
                }
                s.last_error = Some(error);
            });
            ids.insert(id);
        }
        for id in self.status.ids() {
            if id.contains('/') && !ids.contains(&id) {
                self.status.remove(&id);
            }
        }
        // A name refused for its field manager in an earlier round whose claim is neither
        // refused nor wanted now (its file is gone) leaves the status.
        let mut previous = self.refused_managers.lock();
        for name in previous.difference(&by_manager) {
            if !desired.contains_key(name) && !self.runs.lock().contains_key(name) {
                self.status.remove(name);
            }
        }
        *previous = by_manager;
    }
}

/// Why a claim in the plugins directory was refused.
enum Refusal {
    /// Another file (this one) runs the same plugin name.
    Name(PathBuf),
    /// The claim's field manager `mine` overlaps `theirs`, of the plugin in `toml`.
    FieldManager { mine: String, theirs: String, toml: PathBuf },
}
