//! The state behind a [`PluginManager`](super::PluginManager), shared by its tasks: its
//! options and dependencies, what runs under each plugin name, the latest plan, the queues
//! of stopped plugins. Its work is done in the modules above this one, each adding the
//! methods of one step: `plan` (which file each name runs from), `handoff` (swap, restart,
//! first start, stop), `candidate` (a new version built and checked, then handed the
//! plugin), `load` (one name brought in line with the plan), `rounds` (when a round runs).
//!
//! Invariants: one async lock per plugin name (its slot) serializes the loads, hand-offs and
//! stops of that plugin, while different plugins load, swap and stop concurrently; a failed
//! load is a [`Rejection`], whose reason users see, and changes nothing that runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::code_source::CodeSource;
use super::generation::Generation;
use super::options::{ManagerDeps, ManagerOptions};
use super::parked::ParkedQueues;
use super::scope::ScopedReconciler;
use super::slot::VersionSlot;
use super::snapshot::Claim;
use super::status::StatusBoard;
use crate::config::{ConfigErrors, PluginConfig, PluginToml};
use crate::controller::{Controller, ControllerError};

/// A running plugin: its controller and current generation.
pub(super) struct Running {
    pub controller: Controller,
    /// The running version, as the handlers' `map` / `filter` see it (kept across restarts).
    pub slot: VersionSlot,
    /// The controller's reconciler (the plugin behind its scope check).
    pub scoped: Arc<ScopedReconciler>,
    pub stop: CancellationToken,
    pub task: JoinHandle<Result<(), ControllerError>>,
    pub generation: Arc<Generation>,
    /// The generation the controller's `for` source follows (see `current_generation`).
    pub current: Arc<Mutex<Weak<Generation>>>,
    /// Earlier controllers of this plugin still finishing their in-flight reconciles.
    pub retiring: Vec<JoinHandle<()>>,
}

impl Running {
    pub fn name(&self) -> &str {
        &self.generation.config.name
    }

    /// Whether the controller is still running (it ends only when stopped, or when its
    /// sources never synced).
    pub fn alive(&self) -> bool {
        !self.task.is_finished()
    }
}

/// A plugin name's slot: what runs under it, behind the lock that serializes its loads,
/// hand-offs and stops.
pub(super) type Slot = Arc<tokio::sync::Mutex<Option<Running>>>;

/// What runs under a name, as the plan needs to know it.
#[derive(Clone, Debug)]
pub(super) struct RunInfo {
    pub(super) toml: PathBuf,
    pub(super) file: PluginToml,
    pub(super) version: String,
    /// The field manager the running version writes as.
    pub(super) field_manager: String,
    /// Where its code came from.
    pub(super) wasm: PathBuf,
}

/// The manager itself; [`PluginManager`](super::PluginManager) is the handle to it.
pub(super) struct ManagerCore {
    pub(super) options: ManagerOptions,
    pub(super) deps: ManagerDeps,
    pub(super) status: StatusBoard,
    /// Per plugin name; the async mutex serializes loads, swaps and stops of one plugin.
    pub(super) slots: Mutex<BTreeMap<String, Slot>>,
    /// Name → the TOML it should run (the latest plan).
    pub(super) desired: Mutex<BTreeMap<String, Claim>>,
    /// Name → what runs under it.
    pub(super) runs: Mutex<BTreeMap<String, RunInfo>>,
    /// Names whose claim the latest plan refused for its field manager.
    pub(super) refused_managers: Mutex<BTreeSet<String>>,
    /// Queues of plugins that are not running, by name and kind.
    pub(super) parked: Mutex<ParkedQueues>,
    /// The directories the latest plan wants watched.
    pub(super) watch_dirs: Mutex<BTreeSet<PathBuf>>,
    /// Since when a rename has waited for its code to follow (see
    /// [`RENAME_GRACE`](super::plan::RENAME_GRACE)).
    pub(super) rename_wait: Mutex<Option<Instant>>,
    pub(super) shutdown: CancellationToken,
    /// Asks for a round after the next quiet period (a file that was still being written).
    pub(super) wake: mpsc::UnboundedSender<()>,
}

/// A failed load, with the reason shown to users.
pub(super) struct Rejection(pub String);

impl From<ConfigErrors> for Rejection {
    fn from(e: ConfigErrors) -> Self {
        Rejection(e.to_string())
    }
}

impl ManagerCore {
    /// Where the code of the plugin `config` describes comes from.
    pub(super) fn code_source(&self, config: &PluginConfig) -> CodeSource {
        CodeSource::of(config, self.options.registry.as_ref())
    }

    pub(super) fn slot(&self, name: &str) -> Slot {
        self.slots.lock().entry(name.to_owned()).or_default().clone()
    }

    /// Asks for another round after the next quiet period.
    pub(super) fn retry_later(&self) {
        let _ = self.wake.send(());
    }
}
