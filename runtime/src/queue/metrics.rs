//! Handles on one queue's `workqueue_*` metric series (label `name`), fetched once so the
//! hot path never looks a label set up.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::{Metrics, QueueLabels};

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The series of one named queue.
#[derive(Clone)]
pub(crate) struct QueueMetrics {
    pub depth: Gauge,
    pub adds: Counter,
    pub queue_duration: Histogram,
    pub work_duration: Histogram,
    pub unfinished_work: FloatGauge,
    pub longest_running: FloatGauge,
    pub retries: Counter,
}

impl QueueMetrics {
    pub fn new(name: &str, metrics: &Metrics) -> Self {
        let l = QueueLabels { name: name.to_owned() };
        QueueMetrics {
            depth: metrics.workqueue_depth.get_or_create(&l).clone(),
            adds: metrics.workqueue_adds.get_or_create(&l).clone(),
            queue_duration: metrics.workqueue_queue_duration_seconds.get_or_create(&l).clone(),
            work_duration: metrics.workqueue_work_duration_seconds.get_or_create(&l).clone(),
            unfinished_work: metrics.workqueue_unfinished_work_seconds.get_or_create(&l).clone(),
            longest_running: metrics.workqueue_longest_running_processor_seconds.get_or_create(&l).clone(),
            retries: metrics.workqueue_retries.get_or_create(&l).clone(),
        }
    }
}
