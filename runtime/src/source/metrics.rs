//! Handles on one reflector's `wasmctrl_informer_*` series (label `resource`), fetched once so
//! the watch loop never looks a label set up.
//!
//! Invariants: every ADDED, MODIFIED and DELETED watch event the reflector queues counts once
//! in `wasmctrl_informer_events_total`; every list after the reflector's first counts once in
//! `wasmctrl_informer_relists_total`, whether it succeeds or not (a relist loop shows as a
//! rate of these).

use prometheus_client::metrics::counter::Counter;

use crate::metrics::{InformerEventLabels, Metrics, ResourceLabels};

/// The series of one reflector's resource.
#[derive(Clone)]
pub struct ReflectorMetrics {
    added: Counter,
    modified: Counter,
    deleted: Counter,
    relists: Counter,
}

impl std::fmt::Debug for ReflectorMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReflectorMetrics").field("relists", &self.relists.get()).finish_non_exhaustive()
    }
}

impl ReflectorMetrics {
    /// The series of `resource` (`apiVersion/Kind`) in `metrics`.
    pub fn new(resource: &str, metrics: &Metrics) -> Self {
        let event = |event| {
            metrics
                .informer_events
                .get_or_create(&InformerEventLabels { resource: resource.to_owned(), event })
                .clone()
        };
        ReflectorMetrics {
            added: event("added"),
            modified: event("modified"),
            deleted: event("deleted"),
            relists: metrics
                .informer_relists
                .get_or_create(&ResourceLabels { resource: resource.to_owned() })
                .clone(),
        }
    }

    /// Counts one watch event of type `kind` (`ADDED`, `MODIFIED`, `DELETED`).
    pub(super) fn event(&self, kind: &str) {
        match kind {
            "ADDED" => self.added.inc(),
            "MODIFIED" => self.modified.inc(),
            _ => self.deleted.inc(),
        };
    }

    /// Counts one list after the first.
    pub(super) fn relist(&self) {
        self.relists.inc();
    }
}
