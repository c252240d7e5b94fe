//! Every metric the host exports, registered once in one [`Registry`].
//!
//! Names follow client-go's workqueue metrics and controller-runtime's controller metrics,
//! so existing dashboards work unchanged. (prometheus-client adds the `_total` suffix to
//! counters itself.) Leader status uses client-go's `leader_election_master_status`; the
//! host's own families are `wasmctrl_*`; `process_resident_memory_bytes` is the Prometheus
//! client libraries' process metric. `deploy/monitoring/` charts and alerts on these names,
//! and its test checks every name it uses against a running host's `/metrics`.

use std::sync::Arc;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `{name}`: a workqueue (named after its controller).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub name: String,
}

/// `{controller}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

/// `{controller, result}` with result one of success, error, requeue, requeue_after.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub controller: String,
    pub result: String,
}

/// `{plugin, version}`: the content hash of the running `.wasm`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginInfoLabels {
    pub plugin: String,
    pub version: String,
}

/// `{plugin, result}` with result one of success, rejected.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginResultLabels {
    pub plugin: String,
    pub result: String,
}

/// `{plugin, reason}`: why something of a plugin was dropped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginReasonLabels {
    pub plugin: String,
    pub reason: String,
}

/// `{resource, event}`: a watch event (`added`, `modified`, `deleted`) of an informer's
/// resource (`apiVersion/Kind`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InformerEventLabels {
    pub resource: String,
    pub event: &'static str,
}

/// `{resource}`: an informer's resource (`apiVersion/Kind`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    pub resource: String,
}

/// `{name}`: a leader-election lease (`namespace/name`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub name: String,
}

/// `{plugin}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PluginLabels {
    pub plugin: String,
}

fn duration_histogram() -> Histogram {
    // 10 µs .. ~10 min, as client-go's workqueue buckets span.
    Histogram::new(exponential_buckets(1e-5, 4.0, 13))
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// The host's metric families. Cheap to clone handles out of; register once per process.
pub struct Metrics {
    registry: Mutex<Registry>,

    pub workqueue_depth: Family<QueueLabels, Gauge>,
    pub workqueue_adds: Family<QueueLabels, Counter>,
    pub workqueue_queue_duration_seconds: Histograms<QueueLabels>,
    pub workqueue_work_duration_seconds: Histograms<QueueLabels>,
    pub workqueue_unfinished_work_seconds: Family<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub workqueue_longest_running_processor_seconds:
        Family<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub workqueue_retries: Family<QueueLabels, Counter>,

    pub reconcile_total: Family<ReconcileLabels, Counter>,
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    pub terminal_reconcile_errors: Family<ControllerLabels, Counter>,
    pub reconcile_panics: Family<ControllerLabels, Counter>,
    pub reconcile_time_seconds: Histograms<ControllerLabels>,
    pub max_concurrent_reconciles: Family<ControllerLabels, Gauge>,
    pub active_workers: Family<ControllerLabels, Gauge>,

    pub plugin_info: Family<PluginInfoLabels, Gauge>,
    pub plugin_reloads: Family<PluginResultLabels, Counter>,
    /// Keys kept for a stopped plugin that were dropped (reason `expired` or `evicted`).
    pub plugin_parked_keys_dropped: Family<PluginReasonLabels, Counter>,

    /// Watch events received, per resource and event type.
    pub informer_events: Family<InformerEventLabels, Counter>,
    /// Lists after an informer's first one (a 410 Gone, a failed watch or an undecodable
    /// event makes the reflector list again).
    pub informer_relists: Family<ResourceLabels, Counter>,

    /// client-go's `leader_election_master_status`: 1 while this replica holds the lease.
    pub leader_status: Family<LeaseLabels, Gauge>,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            workqueue_depth: Family::default(),
            workqueue_adds: Family::default(),
            workqueue_queue_duration_seconds: Family::new_with_constructor(duration_histogram),
            workqueue_work_duration_seconds: Family::new_with_constructor(duration_histogram),
            workqueue_unfinished_work_seconds: Family::default(),
            workqueue_longest_running_processor_seconds: Family::default(),
            workqueue_retries: Family::default(),
            reconcile_total: Family::default(),
            reconcile_errors: Family::default(),
            terminal_reconcile_errors: Family::default(),
            reconcile_panics: Family::default(),
            reconcile_time_seconds: Family::new_with_constructor(duration_histogram),
            max_concurrent_reconciles: Family::default(),
            active_workers: Family::default(),
            plugin_info: Family::default(),
            plugin_reloads: Family::default(),
            plugin_parked_keys_dropped: Family::default(),
            informer_events: Family::default(),
            informer_relists: Family::default(),
            leader_status: Family::default(),
        };
        {
            let mut r = m.registry.lock();
            r.register("workqueue_depth", "Current depth of workqueue", m.workqueue_depth.clone());
            r.register(
                "workqueue_adds",
                "Total number of adds handled by workqueue",
                m.workqueue_adds.clone(),
            );
            r.register(
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested",
                m.workqueue_queue_duration_seconds.clone(),
            );
            r.register(
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes",
                m.workqueue_work_duration_seconds.clone(),
            );
            r.register(
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been observed by work_duration",
                m.workqueue_unfinished_work_seconds.clone(),
            );
            r.register(
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running",
                m.workqueue_longest_running_processor_seconds.clone(),
            );
            r.register(
                "workqueue_retries",
                "Total number of retries handled by workqueue",
                m.workqueue_retries.clone(),
            );
            r.register(
                "controller_runtime_reconcile",
                "Total number of reconciliations per controller",
                m.reconcile_total.clone(),
            );
            r.register(
                "controller_runtime_reconcile_errors",
                "Total number of reconciliation errors per controller",
                m.reconcile_errors.clone(),
            );
            r.register(
                "controller_runtime_terminal_reconcile_errors",
                "Total number of terminal reconciliation errors per controller",
                m.terminal_reconcile_errors.clone(),
            );
            r.register(
                "controller_runtime_reconcile_panics",
                "Total number of reconciliation panics (plugin traps) per controller",
                m.reconcile_panics.clone(),
            );
            r.register(
                "controller_runtime_reconcile_time_seconds",
                "Length of time per reconciliation per controller",
                m.reconcile_time_seconds.clone(),
            );
            r.register(
                "controller_runtime_max_concurrent_reconciles",
                "Maximum number of concurrent reconciles per controller",
                m.max_concurrent_reconciles.clone(),
            );
            r.register(
                "controller_runtime_active_workers",
                "Number of currently used workers per controller",
                m.active_workers.clone(),
            );
            r.register(
                "wasmctrl_plugin_info",
                "1 for the version (content hash) each plugin is running",
                m.plugin_info.clone(),
            );
            r.register(
                "wasmctrl_plugin_reloads",
                "Plugin loads and reloads by result (success, rejected)",
                m.plugin_reloads.clone(),
            );
            r.register(
                "wasmctrl_plugin_parked_keys_dropped",
                "Pending keys kept for a stopped plugin and dropped: expired, or evicted past the bound",
                m.plugin_parked_keys_dropped.clone(),
            );
            r.register(
                "wasmctrl_informer_events",
                "Watch events received by informers, per resource (apiVersion/Kind) and event (added, modified, deleted)",
                m.informer_events.clone(),
            );
            r.register(
                "wasmctrl_informer_relists",
                "Lists after an informer's first (watch expired or failed, undecodable event), per resource",
                m.informer_relists.clone(),
            );
            r.register(
                "leader_election_master_status",
                "1 while this replica holds the leader lease (name: namespace/name), 0 otherwise",
                m.leader_status.clone(),
            );
            r.register_collector(Box::new(ProcessCollector));
        }
        Arc::new(m)
    }

    /// Registers a collector, asked for its series at every scrape.
    pub fn register_collector(&self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.registry.lock().register_collector(collector);
    }

    /// Registers an extra metric (e.g. a plugin runtime's own) in the shared registry.
    pub fn register(&self, name: &str, help: &str, metric: impl prometheus_client::registry::Metric) {
        self.registry.lock().register(name, help, metric);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry.lock());
        out
    }
}

/// `process_resident_memory_bytes`, read from `/proc/self/statm` at each scrape (the name the
/// Prometheus client libraries' process collectors use). Nothing is exported where the file
/// cannot be read.
#[derive(Debug)]
struct ProcessCollector;

/// Resident memory of this process in bytes, from `/proc/self/statm` (Linux).
pub fn resident_memory_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|p| *p > 0)?)
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let Some(bytes) = resident_memory_bytes() else { return Ok(()) };
        let gauge =
            prometheus_client::metrics::gauge::ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
        let metric = encoder.encode_descriptor(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_exported() {
        let text = Metrics::new().encode();
        let line = text
            .lines()
            .find(|l| l.starts_with("process_resident_memory_bytes "))
            .unwrap_or_else(|| panic!("{text}"));
        let value: u64 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(0);
        assert!(value > 1 << 20, "{line}");
    }
}
