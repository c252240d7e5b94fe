//! The host TOML (`wasmctrl.toml`): where plugins live, how to reach the cluster, the
//! HTTP address, leader election and the defaults plugins fall back to. The file form
//! ([`HostToml`]) is in `schema`, the checks and defaults in `resolver`, and the checked
//! form the host runs ([`HostConfig`]) here.
//!
//! Invariants of a [`HostConfig`]: paths are resolved against the TOML's directory (and `~`
//! against `$HOME`); cluster keys that do not apply to the chosen mode are errors, not
//! ignored; leader-election timings satisfy client-go's ordering
//! (lease-duration > renew-deadline > 1.2 × retry-period); `[admission]` (the webhook
//! server, in `admission`) says how the API server reaches the host.

mod admission;
mod resolver;
mod schema;
mod sharding;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use admission::{AdmissionServerToml, ServiceToml};
pub use schema::{
    ClusterMode, ClusterToml, DefaultsToml, HostToml, LeaderElectionToml, OciToml, ServerAuthMode,
    ServerToml, ShardingMode, ShardingToml, TelemetryToml,
};
pub use sharding::{DEFAULT_VIRTUAL_NODES, ShardingConfig};

use super::decode::decode;
use super::error::{ConfigError, ConfigErrors};
use super::plugin::PluginDefaults;
use super::source::SourceMap;

/// Cluster access, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterConfig {
    Embedded {
        /// YAML files applied at start.
        seed: Vec<PathBuf>,
        /// Where the dev cluster persists its state, if anywhere.
        state_file: Option<PathBuf>,
    },
    Kubeconfig {
        /// `None`: `$KUBECONFIG` or `~/.kube/config`.
        path: Option<PathBuf>,
        context: Option<String>,
    },
    InCluster,
}

/// Who may read the host's HTTP endpoint, checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ServerAuth {
    /// Plain HTTP; whoever can connect reads every path.
    #[default]
    None,
    /// HTTPS; `/metrics` and `/plugins` need a bearer token the API server authenticates and
    /// authorizes for `get` on the path. `tls`: the certificate and key files (`None`: a
    /// self-signed certificate generated at start).
    Kubernetes { tls: Option<TlsFiles> },
}

/// A PEM certificate chain and its private key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Leader election, checked. Only present when enabled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    pub namespace: String,
    pub name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// `[oci]`, checked: how plugins are pulled from registries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciConfig {
    pub poll_interval: Duration,
    pub credentials: Option<PathBuf>,
    /// Loopback registries (`host:port`) reached over plain HTTP.
    pub insecure_registries: Vec<String>,
    pub ca_certificates: Vec<PathBuf>,
    /// The cosign public key every pulled plugin must be signed with.
    pub verify_key: Option<PathBuf>,
    /// Byte budget of the pulled plugins kept under `cache-dir`.
    pub cache_max_bytes: u64,
    pub max_wasm_bytes: u64,
}

impl Default for OciConfig {
    fn default() -> Self {
        OciConfig {
            poll_interval: crate::oci::source::DEFAULT_POLL_INTERVAL,
            credentials: None,
            insecure_registries: Vec::new(),
            ca_certificates: Vec::new(),
            verify_key: None,
            cache_max_bytes: crate::oci::source::DEFAULT_STORE_MAX_BYTES,
            max_wasm_bytes: crate::oci::source::DEFAULT_MAX_WASM_BYTES,
        }
    }
}

/// A checked host TOML with defaults applied and paths resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// The TOML this came from (`None` for the built-in default).
    pub path: Option<PathBuf>,
    pub plugins_dir: PathBuf,
    pub cache_dir: PathBuf,
    /// Byte budget of the compile cache in `cache_dir`.
    pub cache_max_bytes: u64,
    /// Plugin instances idle this long are released (zero: never).
    pub idle_instance_timeout: Duration,
    /// Plugins with no call for this long drop their compiled code (zero: never).
    pub idle_code_timeout: Duration,
    /// New plugin versions missing from the compile cache start on Winch code and tier up
    /// to Cranelift code in the background.
    pub tier_up: bool,
    /// How often the plugins directory is read again whatever the watches saw (`None`: never).
    pub rescan_interval: Option<Duration>,
    /// How long the pending keys of a stopped plugin are kept for its return.
    pub parked_keys_ttl: Duration,
    /// Plugin instances alive at once, every plugin together.
    pub instance_slots: u32,
    /// The most instances one plugin may hold.
    pub max_instances_per_plugin: u32,
    /// How long one compile may run.
    pub compile_timeout: Duration,
    pub cluster: ClusterConfig,
    /// The longest watch event or list item accepted from the API server.
    pub max_object_size: u64,
    pub server_address: SocketAddr,
    pub server_auth: ServerAuth,
    pub leader_election: Option<LeaderElectionConfig>,
    /// `[sharding]`, only present when enabled.
    pub sharding: Option<ShardingConfig>,
    pub plugin_defaults: PluginDefaults,
    /// How long a controller waits for its informers to sync before failing.
    pub cache_sync_timeout: Duration,
    /// OpenTelemetry traces (`None`: off).
    pub telemetry: Option<crate::telemetry::TelemetryConfig>,
    /// `[admission]`: the admission webhook server, when the table is there.
    pub admission: Option<crate::admission::AdmissionSettings>,
    /// `[oci]`: plugins from registries.
    pub oci: OciConfig,
    /// The file as written.
    pub file: HostToml,
}

impl HostConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigErrors> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::file_level(path, format!("cannot read: {e}")))?;
        Self::parse(path, &text)
    }

    /// Checks `text` as the contents of `path` (which need not exist).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigErrors> {
        let map = SourceMap::new(path, text);
        let file: HostToml = decode(&map)?;
        let base = path.parent().unwrap_or(Path::new("")).to_path_buf();
        resolver::resolve(&map, file, &base, Some(path.to_path_buf()))
    }

    /// The configuration used without a host TOML: everything default, relative to `base`
    /// (the same values an empty host TOML in `base` gives).
    pub fn default_in(base: &Path) -> Self {
        HostConfig {
            path: None,
            plugins_dir: base.join("plugins"),
            cache_dir: base.join(".wasmctrl-cache"),
            cache_max_bytes: crate::plugin::DEFAULT_CACHE_MAX_BYTES,
            idle_instance_timeout: crate::plugin::DEFAULT_IDLE_INSTANCE_TIMEOUT,
            idle_code_timeout: crate::plugin::DEFAULT_IDLE_CODE_TIMEOUT,
            tier_up: true,
            rescan_interval: Some(crate::reload::DEFAULT_RESCAN_INTERVAL),
            parked_keys_ttl: crate::reload::DEFAULT_PARKED_KEYS_TTL,
            instance_slots: crate::plugin::DEFAULT_INSTANCE_SLOTS,
            max_instances_per_plugin: crate::plugin::DEFAULT_INSTANCES_PER_PLUGIN,
            compile_timeout: crate::plugin::DEFAULT_COMPILE_TIMEOUT,
            cluster: ClusterConfig::Embedded { seed: Vec::new(), state_file: None },
            max_object_size: crate::source::DEFAULT_MAX_OBJECT_SIZE as u64,
            server_address: SocketAddr::from(([127, 0, 0, 1], 9090)),
            server_auth: ServerAuth::None,
            leader_election: None,
            sharding: None,
            plugin_defaults: PluginDefaults::default(),
            cache_sync_timeout: Duration::from_secs(120),
            telemetry: None,
            admission: None,
            oci: OciConfig::default(),
            file: HostToml::default(),
        }
    }
}
