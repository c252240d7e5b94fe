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
    #[serde(default)]
    pub sharding: ShardingToml,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<TelemetryToml>,
    /// The admission webhook server; none runs without this table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<super::admission::AdmissionServerToml>,
    #[serde(default, skip_serializing_if = "OciToml::is_empty")]
    pub oci: OciToml,
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
    /// The longest watch event, list item or list envelope accepted from the API server;
    /// a longer one fails the watch or list (then backoff and relist). Default `16MiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_object_size: Option<ByteSize>,
}

/// `[server]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ServerToml {
    /// `host:port` of /metrics, /healthz, /readyz, /plugins. Default `127.0.0.1:9090`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Who may read /metrics and /plugins. Default `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<ServerAuthMode>,
    /// PEM certificate (chain) served with `auth = "kubernetes"`; default: self-signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_cert_file: Option<String>,
    /// PEM private key of `tls-cert-file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<String>,
}

/// `[server] auth`: who may read the endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerAuthMode {
    /// Plain HTTP; whoever can connect reads every path.
    #[default]
    None,
    /// HTTPS; /metrics and /plugins need a bearer token the API server authenticates
    /// (TokenReview) and authorizes for `get` on the path (SubjectAccessReview).
    Kubernetes,
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
    pub log_lines_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_sync_timeout: Option<DurationValue>,
}

/// `[oci]`: plugins whose TOML names an `oci://` registry reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct OciToml {
    /// How often the tags plugins name are resolved again. Default `1m`, at least `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval: Option<DurationValue>,
    /// A Docker `config.json` (or a mounted imagePullSecret's `.dockerconfigjson`),
    /// relative to this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    /// Registries (`host:port`) reached over plain HTTP; loopback hosts only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub insecure_registries: Vec<String>,
    /// PEM files of CAs trusted besides the system's, relative to this file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ca_certificates: Vec<String>,
    /// A cosign public key every pulled plugin must be signed with, relative to this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_key: Option<String>,
    /// Byte budget of the pulled plugins kept in `cache-dir`. Default `512MiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_max_size: Option<ByteSize>,
    /// The largest component pulled. Default `256MiB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wasm_size: Option<ByteSize>,
}

impl OciToml {
    fn is_empty(&self) -> bool {
        *self == OciToml::default()
    }
}

/// How `[sharding]` divides the objects of a sharded kind between the replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShardingMode {
    /// The assignment role labels each object with its replica; each replica caches only
    /// the objects labelled with its name.
    #[default]
    Label,
    /// No object is written: every replica caches everything and works on its own keys.
    NoWrite,
}

/// `[sharding]`: replicas share the keys of every plugin (see docs/sharding.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ShardingToml {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Name of the ring: the label of its Leases and (label mode) of the object label key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring: Option<String>,
    /// Namespace of the shard Leases and the assignment Lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ShardingMode>,
    /// Points each replica has on the hash ring.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_nodes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_deadline: Option<DurationValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_period: Option<DurationValue>,
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
