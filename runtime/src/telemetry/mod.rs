//! OpenTelemetry traces of reconciles: what caused a key's reconcile ([`TraceOrigin`],
//! carried with the key through the queue) and the reconcile's root span
//! ([`ReconcileTrace`], started by the controller's worker). Off until a tracer is
//! installed ([`install`]); how spans are exported (an OTLP pipeline, a test exporter) is
//! the program's choice: the `wasmctrl` host installs an OTLP/gRPC pipeline
//! (`wasmctrl::telemetry`).
//!
//! A reconcile's trace: its root `reconcile` span starts when the watch event that caused
//! the reconcile reached the controller (or when the key was queued, for a retry) and ends
//! once the result was handled. It carries the event (`event.type`, `event.object`,
//! `event.resource_version`, `event.delay_ms` up to the reconcile's start) as attributes and
//! as a span event at its arrival, and `queue.wait_ms`. Its children are `queue.wait`
//! (queued → taken by a worker) and the worker's `reconcile` span. A key requeued by a
//! reconcile (error, requeue, requeue-after) carries that reconcile's span context: the next
//! reconcile links to it.
//!
//! Invariants:
//! - Off, the event → queue → worker path pays one relaxed atomic load per enqueue
//!   ([`enabled`]), and queue keys carry `None` (the queue's origin maps stay empty); no
//!   span is built through the OpenTelemetry API.
//! - A tracer is installed at most once per process ([`install`]).

mod origin;
mod reconcile;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry_sdk::trace::SdkTracer;

pub use origin::TraceOrigin;
pub use reconcile::ReconcileTrace;

/// Whether traces are built (set by [`install`], cleared by [`disable`]).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The tracer of the spans built here (reconcile roots, queue waits).
static TRACER: OnceLock<SdkTracer> = OnceLock::new();

/// Whether traces are built: the one check the hot path makes.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Installs the tracer of reconcile traces and turns tracing on; `false` (and nothing
/// changed) if a tracer was installed before in this process.
pub fn install(tracer: SdkTracer) -> bool {
    if TRACER.set(tracer).is_err() {
        return false;
    }
    ENABLED.store(true, Ordering::Relaxed);
    true
}

/// Whether a tracer was installed in this process.
pub fn installed() -> bool {
    TRACER.get().is_some()
}

/// Turns tracing off (for good: the tracer stays installed, so [`install`] refuses another).
pub fn disable() {
    ENABLED.store(false, Ordering::Relaxed);
}

/// The tracer, once installed.
fn tracer() -> Option<&'static SdkTracer> {
    TRACER.get()
}
