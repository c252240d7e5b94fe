//! The trace of one reconcile: its root span, built with the OpenTelemetry API so that it
//! starts when the event arrived (before the worker's `tracing` span existed), the
//! `queue.wait` child, and the parent link of the worker's span.
//!
//! Invariants: the root ends exactly once (on [`ReconcileTrace::end`] or drop); the worker's
//! span is made a child of the root before it is first entered, so everything beneath it
//! (the Wasm call, host imports) lands in the same trace.

use std::time::SystemTime;

use opentelemetry::trace::{Link, Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::origin::{Cause, TraceOrigin};

/// One reconcile's root span (see the module doc).
pub struct ReconcileTrace {
    root: Span,
}

impl std::fmt::Debug for ReconcileTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconcileTrace").field("span", self.root.span_context()).finish()
    }
}

impl ReconcileTrace {
    /// Starts the trace of the reconcile of `request` by `controller`, taken from the queue
    /// now, and makes `worker` (the worker's span, not yet entered) its child. `None` while
    /// tracing is off.
    pub fn start(
        controller: &str,
        request: &str,
        origin: Option<Box<TraceOrigin>>,
        worker: &tracing::Span,
    ) -> Option<ReconcileTrace> {
        if !super::enabled() {
            return None;
        }
        let tracer = super::tracer()?;
        let now = SystemTime::now();
        let queued_at = origin.as_ref().map_or(now, |o| o.queued_at);
        let waited = now.duration_since(queued_at).unwrap_or_default();
        let mut attributes = vec![
            KeyValue::new("controller", controller.to_owned()),
            KeyValue::new("request", request.to_owned()),
            KeyValue::new("queue.wait_ms", waited.as_secs_f64() * 1e3),
        ];
        let mut links = Vec::new();
        let mut event = None;
        match origin.map(|o| o.cause) {
            Some(Cause::Event { event: kind, object, resource_version }) => {
                attributes.extend([
                    KeyValue::new("cause", "event"),
                    KeyValue::new("event.type", kind),
                    KeyValue::new("event.object", object.clone()),
                    KeyValue::new("event.resource_version", resource_version.clone()),
                    KeyValue::new("event.delay_ms", waited.as_secs_f64() * 1e3),
                ]);
                event = Some(vec![
                    KeyValue::new("event.type", kind),
                    KeyValue::new("event.object", object),
                    KeyValue::new("event.resource_version", resource_version),
                ]);
            }
            Some(Cause::Requeue { link, reason }) => {
                attributes.push(KeyValue::new("cause", reason));
                links.push(Link::with_context(link));
            }
            None => attributes.push(KeyValue::new("cause", "unknown")),
        }
        let mut root = tracer
            .span_builder("reconcile")
            .with_kind(SpanKind::Internal)
            .with_start_time(queued_at)
            .with_attributes(attributes)
            .with_links(links)
            .start_with_context(tracer, &Context::new());
        if let Some(attributes) = event {
            root.add_event_with_timestamp("watch event", queued_at, attributes);
        }
        let parent = Context::new().with_remote_span_context(root.span_context().clone());
        let mut wait =
            tracer.span_builder("queue.wait").with_start_time(queued_at).start_with_context(tracer, &parent);
        wait.end_with_timestamp(now);
        let _ = worker.set_parent(parent);
        Some(ReconcileTrace { root })
    }

    /// The root span's context: what a requeued key links to.
    pub fn span_context(&self) -> &SpanContext {
        self.root.span_context()
    }

    /// Ends the root with the reconcile's result (`success`, `error`, `requeue`,
    /// `requeue_after`), and the error if any.
    pub fn end(mut self, result: &'static str, error: Option<String>) {
        self.root.set_attribute(KeyValue::new("result", result));
        if let Some(e) = error {
            self.root.set_status(Status::error(e));
        }
        self.root.end();
    }
}
