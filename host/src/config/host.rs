//! The host TOML (`wasmctrl.toml`): where plugins live, how to reach the cluster, the
//! HTTP address, leader election and the defaults plugins fall back to.
//!
//! Invariants of a [`HostConfig`]: paths are resolved against the TOML's directory (and `~`
//! against `$HOME`); cluster keys that do not apply to the chosen mode are errors, not
//! ignored; leader-election timings satisfy client-go's ordering
//! (lease-duration > renew-deadline > 1.2 × retry-period).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{ConfigError, ConfigErrors, PathSeg, SourceMap, from_toml_error};
use super::names::is_dns_label;
use super::plugin::PluginDefaults;
use super::units::{ByteSize, DurationValue};

/// The host TOML as written. Every key is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct HostToml {
    /// Plugins directory, relative to this file. Default `plugins`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugins_dir: Option<String>,
    /// Compiled-component cache, relative to this file. Default `.wasmctrl-cache`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_dir: Option<String>,
    /// Byte budget of the compile cache; past it the least recently used artifacts are
    /// removed. Default `1GiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_max_size: Option<ByteSize>,
    /// Release plugin instances idle this long; `"0s"` keeps them. Default `60s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_instance_timeout: Option<DurationValue>,
    #[serde(default)]
    pub cluster: ClusterToml,
    #[serde(default)]
    pub server: ServerToml,
    #[serde(default)]
    pub leader_election: LeaderElectionToml,
    #[serde(default)]
    pub defaults: DefaultsToml,
}

/// How the host reaches a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// Start the in-memory dev cluster in-process.
    #[default]
    Embedded,
    /// Use a kubeconfig file.
    Kubeconfig,
    /// Use the pod's service account.
    InCluster,
}

/// `[cluster]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ClusterToml {
    #[serde(default)]
    pub mode: ClusterMode,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seed: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_file: Option<String>,
}

/// `[server]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServerToml {
    /// `host:port` of /metrics, /healthz, /readyz, /plugins. Default `127.0.0.1:9090`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// `[leader-election]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct LeaderElectionToml {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_deadline: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_period: Option<DurationValue>,
}

/// `[defaults]`: what plugin TOMLs fall back to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct DefaultsToml {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_sync_timeout: Option<DurationValue>,
}

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

/// Leader election, checked. Only present when enabled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    pub namespace: String,
    pub name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
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
    pub cluster: ClusterConfig,
    pub server_address: SocketAddr,
    pub leader_election: Option<LeaderElectionConfig>,
    pub plugin_defaults: PluginDefaults,
    /// How long a controller waits for its informers to sync before failing.
    pub cache_sync_timeout: Duration,
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
        let file: HostToml = toml::from_str(text).map_err(|e| from_toml_error(&map, &e))?;
        let base = path.parent().unwrap_or(Path::new("")).to_path_buf();
        resolve(&map, file, &base, Some(path.to_path_buf()))
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
            cluster: ClusterConfig::Embedded { seed: Vec::new(), state_file: None },
            server_address: SocketAddr::from(([127, 0, 0, 1], 9090)),
            leader_election: None,
            plugin_defaults: PluginDefaults::default(),
            cache_sync_timeout: Duration::from_secs(120),
            file: HostToml::default(),
        }
    }
}

fn key(k: &str) -> PathSeg {
    PathSeg::Key(k.to_owned())
}

fn expand_home(p: &str, base: &Path) -> PathBuf {
    if let Some(rest) = p.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    base.join(p)
}

fn resolve(
    map: &SourceMap<'_>,
    file: HostToml,
    base: &Path,
    path: Option<PathBuf>,
) -> Result<HostConfig, ConfigErrors> {
    let mut errors = ConfigErrors::default();
    let mut err = |p: &[PathSeg], at_key: bool, m: String, hint: Option<&str>| {
        let mut e = map.error_for(p, at_key, m);
        e.hint = hint.map(str::to_owned);
        errors.push(e);
    };

    let plugins_dir = base.join(file.plugins_dir.as_deref().unwrap_or("plugins"));
    let cache_dir = base.join(file.cache_dir.as_deref().unwrap_or(".wasmctrl-cache"));
    let cache_max_bytes = file.cache_max_size.map_or(crate::plugin::DEFAULT_CACHE_MAX_BYTES, ByteSize::bytes);
    let idle_instance_timeout =
        file.idle_instance_timeout.map_or(crate::plugin::DEFAULT_IDLE_INSTANCE_TIMEOUT, DurationValue::get);

    let c = &file.cluster;
    let mode_name = match c.mode {
        ClusterMode::Embedded => "embedded",
        ClusterMode::Kubeconfig => "kubeconfig",
        ClusterMode::InCluster => "in-cluster",
    };
    let mut only = |present: bool, k: &str, modes: &str| {
        if present {
            err(
                &[key("cluster"), key(k)],
                true,
                format!("`{k}` does not apply to mode = \"{mode_name}\""),
                Some(&format!("`{k}` is used with mode = {modes}")),
            );
        }
    };
    let cluster = match c.mode {
        ClusterMode::Embedded => {
            only(c.kubeconfig.is_some(), "kubeconfig", "\"kubeconfig\"");
            only(c.context.is_some(), "context", "\"kubeconfig\"");
            ClusterConfig::Embedded {
                seed: c.seed.iter().map(|s| base.join(s)).collect(),
                state_file: c.state_file.as_ref().map(|s| base.join(s)),
            }
        }
        ClusterMode::Kubeconfig => {
            only(!c.seed.is_empty(), "seed", "\"embedded\"");
            only(c.state_file.is_some(), "state-file", "\"embedded\"");
            ClusterConfig::Kubeconfig {
                path: c.kubeconfig.as_deref().map(|p| expand_home(p, base)),
                context: c.context.clone(),
            }
        }
        ClusterMode::InCluster => {
            only(c.kubeconfig.is_some(), "kubeconfig", "\"kubeconfig\"");
            only(c.context.is_some(), "context", "\"kubeconfig\"");
            only(!c.seed.is_empty(), "seed", "\"embedded\"");
            only(c.state_file.is_some(), "state-file", "\"embedded\"");
            ClusterConfig::InCluster
        }
    };

    let address = file.server.address.as_deref().unwrap_or("127.0.0.1:9090");
    let server_address = match address.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            err(
                &[key("server"), key("address")],
                false,
                format!("`{address}` is not an address"),
                Some("write `host:port` with an IP address, e.g. \"127.0.0.1:9090\" or \"0.0.0.0:9090\""),
            );
            SocketAddr::from(([127, 0, 0, 1], 9090))
        }
    };

    let le = &file.leader_election;
    let lease_duration = le.lease_duration.map_or(Duration::from_secs(15), |d| d.0);
    let renew_deadline = le.renew_deadline.map_or(Duration::from_secs(10), |d| d.0);
    let retry_period = le.retry_period.map_or(Duration::from_secs(2), |d| d.0);
    let le_path = |k: &str| [key("leader-election"), key(k)];
    if lease_duration <= renew_deadline {
        err(
            &le_path("lease-duration"),
            false,
            "lease-duration must be longer than renew-deadline".into(),
            None,
        );
    }
    if renew_deadline.as_millis() * 10 <= retry_period.as_millis() * 12 {
        err(
            &le_path("renew-deadline"),
            false,
            "renew-deadline must be longer than 1.2 × retry-period".into(),
            None,
        );
    }
    if retry_period.is_zero() {
        err(&le_path("retry-period"), false, "retry-period must be more than 0".into(), None);
    }
    let le_namespace = le.namespace.clone().unwrap_or_else(|| "default".into());
    let le_name = le.name.clone().unwrap_or_else(|| "wasmctrl".into());
    if !is_dns_label(&le_namespace) {
        err(&le_path("namespace"), false, format!("`{le_namespace}` is not a valid namespace name"), None);
    }
    if le_name.is_empty() || !super::names::is_dns_subdomain(&le_name) {
        err(&le_path("name"), false, format!("`{le_name}` is not a valid Lease name"), None);
    }
    let leader_election = le.enabled.unwrap_or(false).then_some(LeaderElectionConfig {
        namespace: le_namespace,
        name: le_name,
        lease_duration,
        renew_deadline,
        retry_period,
    });

    let d = &file.defaults;
    let base_defaults = PluginDefaults::default();
    let dp = |k: &str| [key("defaults"), key(k)];
    let concurrency = match d.concurrency {
        Some(0) => {
            err(&dp("concurrency"), false, "concurrency must be at least 1".into(), None);
            1
        }
        Some(n) => n as usize,
        None => base_defaults.concurrency,
    };
    let deadline = match d.deadline {
        Some(x) if x.0.is_zero() => {
            err(&dp("deadline"), false, "the deadline must be more than 0".into(), None);
            base_defaults.deadline
        }
        Some(x) => x.0,
        None => base_defaults.deadline,
    };
    let memory = match d.memory {
        Some(m) if m.0 < (1 << 20) => {
            err(&dp("memory"), false, format!("memory `{m}` is below the minimum, 1MiB"), None);
            base_defaults.memory
        }
        Some(m) => m.0,
        None => base_defaults.memory,
    };
    let max_output = match d.max_output {
        Some(m) if m.0 < 1024 => {
            err(&dp("max-output"), false, format!("max-output `{m}` is below the minimum, 1KiB"), None);
            base_defaults.max_output
        }
        Some(m) => m.0,
        None => base_defaults.max_output,
    };
    let resync = d.resync.map(|r| r.0).filter(|r| !r.is_zero());
    if let Some(r) = resync
        && r < Duration::from_secs(1)
    {
        err(
            &dp("resync"),
            false,
            format!("resync `{}` is below the minimum, 1s", DurationValue(r)),
            Some("use \"0s\" to turn resync off"),
        );
    }
    let cache_sync_timeout = d.cache_sync_timeout.map_or(Duration::from_secs(120), |t| t.0);
    if cache_sync_timeout.is_zero() {
        err(&dp("cache-sync-timeout"), false, "cache-sync-timeout must be more than 0".into(), None);
    }

    let config = HostConfig {
        path,
        plugins_dir,
        cache_dir,
        cache_max_bytes,
        idle_instance_timeout,
        cluster,
        server_address,
        leader_election,
        plugin_defaults: PluginDefaults { concurrency, deadline, memory, max_output, resync },
        cache_sync_timeout,
        file,
    };
    errors.into_result(config)
}
