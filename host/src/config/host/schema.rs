//! The host TOML as written (`wasmctrl.toml`): the serde types, and nothing else.
//!
//! Invariants: every table refuses unknown keys (`deny_unknown_fields`) and every key is
//! kebab-case; every key is optional; a value left out stays `None` / empty here (the
//! defaults are applied by the resolver, not by serde, except `cluster.mode`, whose default
//! is `embedded`); serialising skips what was left out, so a file round-trips.

use serde::{Deserialize, Serialize};

use crate::config::units::{ByteSize, DurationValue};

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
    /// A plugin with no call for this long drops its compiled code (and its idle
    /// instances); the next call loads it again from the compile cache. `"0s"` keeps it.
    /// Default `10m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_code_timeout: Option<DurationValue>,
    /// Compile a new plugin version missing from the compile cache with Winch first (it
    /// serves at once) and tier up to Cranelift code in the background. Default `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier_up: Option<bool>,
    /// Read the whole plugins directory again this often, whatever the file watches saw;
    /// `"0s"` turns it off. Default `1m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescan_interval: Option<DurationValue>,
    /// How long the pending keys of a stopped plugin are kept for its return. Default `1h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parked_keys_ttl: Option<DurationValue>,
    /// Plugin instances alive at once, every plugin together (the pooling allocator's
    /// slots). Default `128`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_slots: Option<u32>,
    /// The most instances one plugin may hold; a plugin's `concurrency` may be at most one
    /// less. Default `32`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_instances_per_plugin: Option<u32>,
    /// How long one compile (in its child process) may run before it is killed and the
    /// plugin version rejected. Default `5m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_timeout: Option<DurationValue>,
    #[serde(default)]
    pub cluster: ClusterToml,
    #[serde(default)]
    pub server: ServerToml,
    #[serde(default)]
    pub leader_election: LeaderElectionToml,
    #[serde(default)]
    pub defaults: DefaultsToml,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetryToml>,
    /// The admission webhook server; none runs without this table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<super::admission::AdmissionServerToml>,
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

/// `[telemetry]`: OpenTelemetry traces over OTLP/gRPC. Without this table, no trace is made.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TelemetryToml {
    /// The collector's OTLP/gRPC endpoint, e.g. `"http://127.0.0.1:4317"`. Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The share of traces kept, from 0.0 to 1.0. Default `1.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_ratio: Option<f64>,
    /// `service.name` of the exported traces. Default `"wasmctrl"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

// The resolver refuses a ratio that is not a number, so equality is reflexive in practice.
impl Eq for TelemetryToml {}
