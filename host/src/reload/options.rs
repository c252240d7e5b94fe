//! What a [`PluginManager`](super::PluginManager) is started with: where the plugins are
//! and how to treat them ([`ManagerOptions`]), and what it runs them with
//! ([`ManagerDeps`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::leases::InformerLeases;
use crate::admission::AdmissionRouter;
use crate::config::PluginDefaults;
use crate::metrics::Metrics;
use crate::oci::OciSource;
use crate::plugin::{KubeServices, PluginEngine};

/// Where the plugins are and how to treat them.
#[derive(Clone, Debug)]
pub struct ManagerOptions {
    pub plugins_dir: PathBuf,
    /// Defaults for plugin TOMLs (the host TOML's `[defaults]`).
    pub defaults: PluginDefaults,
    /// How long informers may take to sync before a load fails.
    pub cache_sync_timeout: Duration,
    /// Quiet period after the last file event before files are read.
    pub debounce: Duration,
    /// Follow the directory (file events and SIGHUP). Off: load once (and on
    /// [`PluginManager::rescan`](super::PluginManager::rescan) or the periodic rescan).
    pub watch: bool,
    /// Share the plugins' keys with the other replicas of a ring (`[sharding]`).
    pub sharding: Option<crate::shard::Sharding>,
    /// Read the whole directory again this often, whatever the watches saw (`None`: never).
    pub rescan_interval: Option<Duration>,
    /// How long the pending keys of a stopped plugin are kept for its return.
    pub parked_keys_ttl: Duration,
    /// Where admitting plugins' versions are installed (the host's admission server);
    /// `None`: the host serves no admission, and a plugin with `[[admission]]` is refused.
    pub admission: Option<AdmissionRouter>,
    /// Where plugins whose TOML says `wasm = "oci://..."` are pulled from (`None`: such
    /// plugins are refused). A moved tag reloads its plugin as a changed file does.
    pub registry: Option<OciSource>,
}

/// Default of [`ManagerOptions::rescan_interval`].
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(60);
/// Default of [`ManagerOptions::parked_keys_ttl`].
pub const DEFAULT_PARKED_KEYS_TTL: Duration = Duration::from_secs(3600);

impl ManagerOptions {
    /// Options for `plugins_dir` with defaults (200 ms debounce, 2 min sync timeout,
    /// watching, a full rescan every minute, pending keys kept for an hour).
    pub fn new(plugins_dir: impl Into<PathBuf>) -> Self {
        ManagerOptions {
            plugins_dir: plugins_dir.into(),
            defaults: PluginDefaults::default(),
            cache_sync_timeout: Duration::from_secs(120),
            debounce: Duration::from_millis(200),
            watch: true,
            sharding: None,
            rescan_interval: Some(DEFAULT_RESCAN_INTERVAL),
            parked_keys_ttl: DEFAULT_PARKED_KEYS_TTL,
            admission: None,
            registry: None,
        }
    }
}

/// What the manager runs plugins with.
#[derive(Clone)]
pub struct ManagerDeps {
    pub engine: PluginEngine,
    pub informers: Arc<dyn InformerLeases>,
    /// Cluster access for plugins' `client` and `events` imports (`None`: refused).
    pub kube: Option<Arc<KubeServices>>,
    pub metrics: Arc<Metrics>,
}
