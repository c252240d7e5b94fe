//! The `wasmctrl_shard_*` metrics of one replica.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::metrics::Metrics;

/// `{plugin}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: String,
}

fn seconds() -> Histogram {
    // 10 ms .. ~3 min.
    Histogram::new(exponential_buckets(0.01, 2.0, 15))
}

/// The sharding metrics, registered in the host's registry.
#[derive(Clone)]
pub struct ShardMetrics {
    /// Keys of each plugin this replica owns now.
    pub keys: Family<PluginLabels, Gauge>,
    /// Keys of each plugin gained in hand-overs.
    pub keys_gained: Family<PluginLabels, Counter>,
    /// Epochs this replica completed (each a hand-over step of the whole ring).
    pub handovers: Counter,
    /// From seeing an epoch published to completing it.
    pub handover_seconds: Histogram,
    /// From the last change seen on a stopped replica's Lease to completing the epoch that
    /// hands its keys to the others.
    pub takeover_seconds: Histogram,
    /// The epoch this replica works in.
    pub epoch: Gauge,
    /// Members of that epoch.
    pub members: Gauge,
    /// 1 while this replica runs the assignment role.
    pub assigner: Gauge,
    /// Shard labels written by the assignment role (label mode).
    pub labels_written: Counter,
}

impl ShardMetrics {
    pub fn register(metrics: &Metrics) -> ShardMetrics {
        let m = ShardMetrics {
            keys: Family::default(),
            keys_gained: Family::default(),
            handovers: Counter::default(),
            handover_seconds: seconds(),
            takeover_seconds: seconds(),
            epoch: Gauge::default(),
            members: Gauge::default(),
            assigner: Gauge::default(),
            labels_written: Counter::default(),
        };
        metrics.register("wasmctrl_shard_keys", "Keys of each plugin this replica owns", m.keys.clone());
        metrics.register(
            "wasmctrl_shard_keys_gained",
            "Keys of each plugin this replica gained in hand-overs",
            m.keys_gained.clone(),
        );
        metrics.register(
            "wasmctrl_shard_handovers",
            "Ring epochs this replica completed",
            m.handovers.clone(),
        );
        metrics.register(
            "wasmctrl_shard_handover_seconds",
            "Time from seeing a ring epoch published to completing it",
            m.handover_seconds.clone(),
        );
        metrics.register(
            "wasmctrl_shard_takeover_seconds",
            "Time from the last change of a stopped replica's Lease to working on its keys",
            m.takeover_seconds.clone(),
        );
        metrics.register("wasmctrl_shard_epoch", "The ring epoch this replica works in", m.epoch.clone());
        metrics.register(
            "wasmctrl_shard_members",
            "Replicas in the ring epoch this replica works in",
            m.members.clone(),
        );
        metrics.register(
            "wasmctrl_shard_assigner",
            "1 while this replica runs the assignment role",
            m.assigner.clone(),
        );
        metrics.register(
            "wasmctrl_shard_labels_written",
            "Shard labels written on objects by the assignment role",
            m.labels_written.clone(),
        );
        m
    }
}
