//! OpenTelemetry traces of reconciles and hook calls, exported over OTLP/gRPC. Off unless the
//! host TOML has a `[telemetry]` table with an endpoint.
//!
//! What a trace holds:
//! - One trace per reconcile. Its root `reconcile` span starts when the watch event that
//!   caused the reconcile reached the controller (or when the key was queued, for a retry)
//!   and ends once the result was handled. It carries the event (`event.type`,
//!   `event.object`, `event.resource_version`, `event.delay_ms` up to the reconcile's start)
//!   as attributes and as a span event at its arrival, and `queue.wait_ms`. Its children are
//!   `queue.wait` (queued → taken by a worker) and the worker's `reconcile` span, under which
//!   come the Wasm call (`plugin_reconcile`) and each host import the plugin made
//!   (`cache.get`, `cache.list`, `cache.by-index`, `client.*` with its `api.request`: method,
//!   path, status). A key requeued by a reconcile (error, requeue, requeue-after) carries that
//!   reconcile's span context: the next reconcile links to it.
//! - One trace per hook call: the `hook` span (on-add, on-update, on-delete, with the
//!   object's resourceVersion) and the `map` / `filter` spans, each with the host imports
//!   beneath.
//!
//! Invariants:
//! - Off, the event → queue → worker path pays one relaxed atomic load per enqueue
//!   ([`enabled`]), and queue keys carry `None` (the queue's origin maps stay empty); no
//!   span is built through the OpenTelemetry API and nothing is exported.
//! - The pipeline is installed at most once per process ([`Telemetry::install`]); sampling is
//!   decided at each trace's root (parent-based, trace-id ratio), so a trace is kept or
//!   dropped whole.
//!
//! The reconcile's trace (its origin carried through the queue, its root span) is built by
//! the informer machinery in `wasmctrl-runtime` (`wasmctrl_runtime::telemetry`, re-exported
//! here); this module adds the export pipeline and the spans of the plugins' host imports.

mod pipeline;

pub use pipeline::{Telemetry, TelemetryConfig, TelemetryError};
pub use wasmctrl_runtime::telemetry::{ReconcileTrace, TraceOrigin, enabled};

/// The target of the host's trace-only spans (host imports, API requests): they are at
/// DEBUG level, which the OpenTelemetry layer takes and the default log filter leaves out.
pub const TARGET: &str = "wasmctrl::telemetry";

/// A span around one API request a plugin's call made (`api.request`: method and path now,
/// status when [`api_response`] is told). Disabled (free) unless traced or debug-logged.
pub fn api_request<B>(request: &http::Request<B>) -> tracing::Span {
    tracing::debug_span!(
        target: TARGET,
        "api.request",
        http.request.method = %request.method(),
        url.path = request.uri().path(),
        http.response.status_code = tracing::field::Empty,
        error = tracing::field::Empty,
    )
}

/// Records how the request of [`api_request`] ended: its HTTP status when the server
/// answered with an error status, `2xx` when it succeeded, the error otherwise.
pub fn api_response<T, E: std::fmt::Display>(
    span: &tracing::Span,
    result: &Result<T, E>,
    status: Option<u16>,
) {
    if span.is_disabled() {
        return;
    }
    match (result, status) {
        (Ok(_), _) => span.record("http.response.status_code", "2xx"),
        (Err(e), Some(code)) => span.record("http.response.status_code", code).record("error", e.to_string()),
        (Err(e), None) => span.record("error", e.to_string()),
    };
}
