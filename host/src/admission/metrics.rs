//! The admission server's metrics, named as controller-runtime's webhook server names them
//! (`sigs.k8s.io/controller-runtime/pkg/webhook/internal/metrics`), so webhook dashboards
//! work unchanged: the `webhook` label is the request's path, `code` the HTTP status code
//! of the response (200 for every answered review, admitted or not).
//!
//! Plus what is wasmctrl's own: `wasmctrl_admission_answers_total{webhook, answer}` (how each
//! review was answered: `allowed`, `denied`, `patched`, or by the failure policy:
//! `failed-closed`, `failed-open`), and certificate reloads.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

use crate::metrics::Metrics;

/// `{webhook}`: the path the review was posted to.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub webhook: String,
}

/// `{webhook, code}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookCodeLabels {
    pub webhook: String,
    pub code: String,
}

/// `{webhook, answer}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnswerLabels {
    pub webhook: String,
    pub answer: &'static str,
}

fn latency_histogram() -> Histogram {
    // Prometheus' default buckets, which controller-runtime's webhook latency uses.
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
}

/// The admission server's metric families; cheap to clone.
#[derive(Clone)]
pub struct WebhookMetrics {
    pub requests: Family<WebhookCodeLabels, Counter>,
    pub latency: Family<WebhookLabels, Histogram, fn() -> Histogram>,
    pub in_flight: Family<WebhookLabels, Gauge>,
    /// Reviews whose plugin call trapped (controller-runtime counts its handlers' panics).
    pub panics: Counter,
    pub answers: Family<AnswerLabels, Counter>,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        WebhookMetrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            in_flight: Family::default(),
            panics: Counter::default(),
            answers: Family::default(),
        }
    }
}

impl WebhookMetrics {
    /// Registers the families in `m`; `certificate_reloads` counts the serving
    /// certificate's reloads.
    pub fn register(&self, m: &Metrics, certificate_reloads: Counter) {
        m.register(
            "controller_runtime_webhook_requests",
            "Total number of admission requests by HTTP status code.",
            self.requests.clone(),
        );
        m.register(
            "controller_runtime_webhook_latency_seconds",
            "Histogram of the latency of processing admission requests",
            self.latency.clone(),
        );
        m.register(
            "controller_runtime_webhook_requests_in_flight",
            "Current number of admission requests being served.",
            self.in_flight.clone(),
        );
        m.register(
            "controller_runtime_webhook_panics",
            "Total number of webhook panics (plugin traps in admission calls)",
            self.panics.clone(),
        );
        m.register(
            "wasmctrl_admission_answers",
            "Admission reviews by answer: allowed, denied, patched, failed-closed or failed-open (the failure policy's)",
            self.answers.clone(),
        );
        m.register(
            "wasmctrl_admission_certificate_reloads",
            "Reloads of the admission serving certificate from its files",
            certificate_reloads,
        );
    }

    /// Counts one answer.
    pub fn answered(&self, webhook: &str, answer: &'static str) {
        self.answers.get_or_create(&AnswerLabels { webhook: webhook.to_owned(), answer }).inc();
    }
}
