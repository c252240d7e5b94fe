//! The controller runner: sources → handlers → rate-limited queue → workers → reconciler,
//! with controller-runtime's semantics.
//!
//! Invariants:
//! - Workers start only after every source registration reports synced; if that takes
//!   longer than the cache-sync timeout (default 2 min), `run` fails with
//!   [`ControllerError::CacheSyncTimeout`] and [`Readiness`] carries the error.
//! - A key is reconciled by at most one worker at a time (the queue's processing set).
//! - Result handling (controller-runtime `reconcileHandler`): error → `add_rate_limited`;
//!   terminal error → counted, logged, no retry, and *not* `forget` (the key's failure count,
//!   hence its next backoff, is kept, as controller-runtime does); panic (trap) → like an error plus
//!   the panics counter; `Requeue` → `add_rate_limited`; `RequeueAfter(d)` with `d > 0` →
//!   `forget` + `add_after(d)`; `Done` (and `RequeueAfter(0)`) → `forget`.
//! - A reconcile that outlives the per-reconcile deadline is dropped and counts as an error.
//! - Shutdown stops handing out keys, lets in-flight reconciles finish, then removes the
//!   handlers and shuts the queue down. A run that fails (its sources never synced) removes
//!   its handlers but leaves the queue as it is: keys it holds — some handed to it by a
//!   predecessor — stay for whoever takes the queue over next.
//! - Hot swap: each reconcile loads the current reconciler when it starts, so calls in flight
//!   finish on the old one and every later call (queued keys included) goes to the new one.
//! - With an [`Ownership`] (replicas sharing the work): only admitted requests enter the
//!   queue, and a reconcile runs only under a [`Claim`] held until its result is handled; a
//!   request that cannot be claimed is dropped (`forget` + `done`), not reconciled.
//! - Tracing (when on, see [`crate::telemetry`]): each reconcile is one trace rooted at the
//!   event its key carried; a key requeued by a reconcile carries a link to its trace.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use kube::core::GroupVersionKind;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::handler::{EnqueueForObject, EnqueueForOwner, EnqueueMapped, Mapper};
use super::ownership::{Claim, Ownership};
use super::predicate::{Filter, FilterPredicate, Predicate};
use super::source::{EventRegistration, EventSource, SourceError, describe};
use super::{Action, HotSwap, ReconcileError, Reconciler, Request};
use crate::informer::ResourceEventHandler;
use crate::metrics::{ControllerLabels, Metrics, ReconcileLabels};
use crate::queue::{Origin, RateLimiter, RateLimitingQueue, default_controller_rate_limiter};
use crate::telemetry::{ReconcileTrace, TraceOrigin};

/// controller-runtime's `CacheSyncTimeout` default.
pub const DEFAULT_CACHE_SYNC_TIMEOUT: Duration = Duration::from_secs(120);

/// How often sync is polled (client-go's `WaitForCacheSync` period).
const SYNC_POLL: Duration = Duration::from_millis(100);

/// Why a controller could not be built or run.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("controller {controller}: {reason}")]
    InvalidConfig { controller: String, reason: String },
    #[error("controller {controller} was already started")]
    AlreadyStarted { controller: String },
    #[error("controller {controller}: {source}")]
    Source {
        controller: String,
        #[source]
        source: SourceError,
    },
    #[error("controller {controller}: timed out after {timeout:?} waiting for caches to sync: {kinds}")]
    CacheSyncTimeout { controller: String, kinds: String, timeout: Duration },
}

/// One source of a controller, with the predicates its events must pass.
pub struct SourceSpec {
    source: Arc<dyn EventSource>,
    predicates: Vec<Arc<dyn Predicate>>,
    filter: bool,
}

impl SourceSpec {
    pub fn new(source: Arc<dyn EventSource>) -> Self {
        SourceSpec { source, predicates: Vec::new(), filter: false }
    }

    /// Adds a predicate; events must pass every predicate given.
    pub fn predicate(mut self, predicate: impl Predicate) -> Self {
        self.predicates.push(Arc::new(predicate));
        self
    }

    /// Adds predicates; events must pass every predicate given.
    pub fn predicates(mut self, predicates: impl IntoIterator<Item = Arc<dyn Predicate>>) -> Self {
        self.predicates.extend(predicates);
        self
    }

    /// Also asks the controller's [`Filter`] hook (see [`ControllerBuilder::filter`]).
    pub fn with_filter(mut self) -> Self {
        self.filter = true;
        self
    }
}

impl<S: EventSource> From<Arc<S>> for SourceSpec {
    fn from(source: Arc<S>) -> Self {
        SourceSpec::new(source)
    }
}

impl From<Arc<dyn EventSource>> for SourceSpec {
    fn from(source: Arc<dyn EventSource>) -> Self {
        SourceSpec::new(source)
    }
}

/// Builds a [`Controller`].
pub struct ControllerBuilder {
    name: String,
    reconciler: Arc<dyn Reconciler>,
    for_source: Option<SourceSpec>,
    owns: Vec<SourceSpec>,
    watches: Vec<(SourceSpec, Arc<dyn Mapper>)>,
    filter: Option<Arc<dyn Filter>>,
    max_concurrent_reconciles: usize,
    reconcile_timeout: Option<Duration>,
    cache_sync_timeout: Duration,
    rate_limiter: Option<Arc<dyn RateLimiter<Request>>>,
    metrics: Option<Arc<Metrics>>,
    ownership: Option<Arc<dyn Ownership>>,
}

impl ControllerBuilder {
    /// The kind whose keys are reconciled: each of its events enqueues the object's own key.
    pub fn for_source(mut self, spec: impl Into<SourceSpec>) -> Self {
        self.for_source = Some(spec.into());
        self
    }

    /// A kind whose objects are controlled by `for` objects: events enqueue the controller
    /// owner's key.
    pub fn owns(mut self, spec: impl Into<SourceSpec>) -> Self {
        self.owns.push(spec.into());
        self
    }

    /// A kind whose events are mapped to requests by `mapper` (on the old and new object of
    /// an update).
    pub fn watches(mut self, spec: impl Into<SourceSpec>, mapper: Arc<dyn Mapper>) -> Self {
        self.watches.push((spec.into(), mapper));
        self
    }

    /// The filter hook consulted by sources built [`SourceSpec::with_filter`].
    pub fn filter(mut self, filter: Arc<dyn Filter>) -> Self {
        self.filter = Some(filter);
        self
    }

    /// Number of workers (default 1).
    pub fn max_concurrent_reconciles(mut self, n: usize) -> Self {
        self.max_concurrent_reconciles = n;
        self
    }

    /// Deadline of one reconcile; past it the reconcile is dropped and counts as an error.
    pub fn reconcile_timeout(mut self, timeout: Duration) -> Self {
        self.reconcile_timeout = Some(timeout);
        self
    }

    /// How long to wait for the sources to sync before failing (default 2 min).
    pub fn cache_sync_timeout(mut self, timeout: Duration) -> Self {
        self.cache_sync_timeout = timeout;
        self
    }

    /// The retry limiter (default: client-go's default controller limiter).
    pub fn rate_limiter(mut self, limiter: Arc<dyn RateLimiter<Request>>) -> Self {
        self.rate_limiter = Some(limiter);
        self
    }

    /// Export `controller_runtime_*{controller}` and `workqueue_*{name}` metrics.
    pub fn metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Works only on the keys `ownership` gives this replica (see [`Ownership`]).
    pub fn ownership(mut self, ownership: Arc<dyn Ownership>) -> Self {
        self.ownership = Some(ownership);
        self
    }

    pub fn build(self) -> Result<Controller, ControllerError> {
        let invalid = |reason: &str| ControllerError::InvalidConfig {
            controller: self.name.clone(),
            reason: reason.to_owned(),
        };
        if self.name.is_empty() {
            return Err(invalid("the controller name is empty"));
        }
        if self.max_concurrent_reconciles == 0 {
            return Err(invalid("max_concurrent_reconciles must be at least 1"));
        }
        let Some(for_spec) = self.for_source else {
            return Err(invalid("no `for` source: a controller must name the kind it reconciles"));
        };
        let limiter = self.rate_limiter.unwrap_or_else(|| Arc::new(default_controller_rate_limiter()));
        let queue = match &self.metrics {
            Some(m) => RateLimitingQueue::with_metrics(&self.name, m.clone(), limiter),
            None => RateLimitingQueue::new(limiter),
        };
        if let Some(ownership) = &self.ownership {
            let admission = ownership.clone();
            queue.queue().set_admission(Arc::new(move |request: &Request| admission.admits(request)));
            ownership.attach(&queue);
        }
        let filter = self.filter.map(HotSwap::new);
        let predicates = |spec: &SourceSpec| -> Result<Vec<Arc<dyn Predicate>>, ControllerError> {
            let mut p = spec.predicates.clone();
            if spec.filter {
                let Some(filter) = &filter else {
                    return Err(invalid(&format!(
                        "source {} asks for the filter hook, but the controller has no filter",
                        describe(&spec.source.gvk())
                    )));
                };
                p.push(Arc::new(FilterPredicate::new(spec.source.gvk(), filter.clone())));
            }
            Ok(p)
        };

        let for_kind: GroupVersionKind = for_spec.source.gvk();
        let for_namespaced = for_spec.source.namespaced();
        let mut bindings: Vec<Binding> = Vec::new();
        bindings.push(Binding {
            handler: Arc::new(EnqueueForObject::new(queue.clone(), predicates(&for_spec)?)),
            source: for_spec.source,
        });
        for spec in self.owns {
            bindings.push(Binding {
                handler: Arc::new(EnqueueForOwner::new(
                    queue.clone(),
                    predicates(&spec)?,
                    &for_kind,
                    for_namespaced,
                )),
                source: spec.source,
            });
        }
        let mut mappers = Vec::new();
        for (spec, mapper) in self.watches {
            let slot = HotSwap::new(mapper);
            mappers.push(slot.clone());
            bindings.push(Binding {
                handler: Arc::new(EnqueueMapped::new(
                    queue.clone(),
                    predicates(&spec)?,
                    spec.source.gvk(),
                    slot,
                )),
                source: spec.source,
            });
        }

        let metrics = self.metrics.as_ref().map(|m| ControllerMetrics::new(&self.name, m));
        Ok(Controller {
            shared: Arc::new(Shared {
                name: self.name,
                queue,
                reconciler: HotSwap::new(self.reconciler),
                mappers,
                filter,
                bindings,
                max_concurrent_reconciles: self.max_concurrent_reconciles,
                reconcile_timeout: self.reconcile_timeout,
                cache_sync_timeout: self.cache_sync_timeout,
                metrics,
                ownership: self.ownership,
                started: AtomicBool::new(false),
                synced: AtomicBool::new(false),
                workers: AtomicUsize::new(0),
                sync_error: Mutex::new(None),
            }),
        })
    }
}

struct Binding {
    source: Arc<dyn EventSource>,
    handler: Arc<dyn ResourceEventHandler>,
}

/// The `controller_runtime_*` series of one controller.
struct ControllerMetrics {
    success: Counter,
    error: Counter,
    requeue: Counter,
    requeue_after: Counter,
    errors: Counter,
    terminal_errors: Counter,
    panics: Counter,
    reconcile_time: Histogram,
    max_concurrent: Gauge,
    active_workers: Gauge,
}

impl ControllerMetrics {
    fn new(name: &str, m: &Metrics) -> Self {
        let c = ControllerLabels { controller: name.to_owned() };
        let result = |r: &str| {
            m.reconcile_total
                .get_or_create(&ReconcileLabels { controller: name.to_owned(), result: r.to_owned() })
                .clone()
        };
        ControllerMetrics {
            success: result("success"),
            error: result("error"),
            requeue: result("requeue"),
            requeue_after: result("requeue_after"),
            errors: m.reconcile_errors.get_or_create(&c).clone(),
            terminal_errors: m.terminal_reconcile_errors.get_or_create(&c).clone(),
            panics: m.reconcile_panics.get_or_create(&c).clone(),
            reconcile_time: m.reconcile_time_seconds.get_or_create(&c).clone(),
            max_concurrent: m.max_concurrent_reconciles.get_or_create(&c).clone(),
            active_workers: m.active_workers.get_or_create(&c).clone(),
        }
    }
}

struct Shared {
    name: String,
    queue: RateLimitingQueue<Request>,
    reconciler: HotSwap<dyn Reconciler>,
    mappers: Vec<HotSwap<dyn Mapper>>,
    filter: Option<HotSwap<dyn Filter>>,
    bindings: Vec<Binding>,
    max_concurrent_reconciles: usize,
    reconcile_timeout: Option<Duration>,
    cache_sync_timeout: Duration,
    metrics: Option<ControllerMetrics>,
    ownership: Option<Arc<dyn Ownership>>,
    started: AtomicBool,
    synced: AtomicBool,
    workers: AtomicUsize,
    sync_error: Mutex<Option<String>>,
}

/// What `/readyz` needs to know about a controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// Every source of the controller has synced.
    pub synced: bool,
    /// Workers currently running (0 before sync, on a standby replica, and after shutdown).
    pub workers: usize,
    /// Workers configured.
    pub max_workers: usize,
    /// Why the controller is not running (e.g. a cache-sync timeout).
    pub error: Option<String>,
}

impl Readiness {
    /// Synced, with every worker running, and no error.
    pub fn is_ready(&self) -> bool {
        self.synced && self.workers == self.max_workers && self.error.is_none()
    }
}

/// What to replace in a running controller (see [`Controller::swap`]). `None` keeps the
/// current one.
#[derive(Default)]
pub struct Swap {
    pub reconciler: Option<Arc<dyn Reconciler>>,
    /// Replaces the mapper of every `watches` source.
    pub mapper: Option<Arc<dyn Mapper>>,
    pub filter: Option<Arc<dyn Filter>>,
}

/// A controller: build with [`Controller::builder`], drive with [`Controller::run`].
/// Cheap to clone: clones share one controller.
#[derive(Clone)]
pub struct Controller {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.shared.name)
            .field("readiness", &self.readiness())
            .finish_non_exhaustive()
    }
}

impl Controller {
    /// A builder for a controller named `name` (its metrics label and queue name).
    pub fn builder(name: impl Into<String>, reconciler: Arc<dyn Reconciler>) -> ControllerBuilder {
        ControllerBuilder {
            name: name.into(),
            reconciler,
            for_source: None,
            owns: Vec::new(),
            watches: Vec::new(),
            filter: None,
            max_concurrent_reconciles: 1,
            reconcile_timeout: None,
            cache_sync_timeout: DEFAULT_CACHE_SYNC_TIMEOUT,
            rate_limiter: None,
            metrics: None,
            ownership: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The controller's queue (to enqueue requests from elsewhere, or to inspect it).
    pub fn queue(&self) -> &RateLimitingQueue<Request> {
        &self.shared.queue
    }

    /// Readiness for `/readyz`.
    pub fn readiness(&self) -> Readiness {
        let s = &self.shared;
        Readiness {
            synced: s.synced.load(Ordering::Acquire),
            workers: s.workers.load(Ordering::Acquire),
            max_workers: s.max_concurrent_reconciles,
            error: s.sync_error.lock().clone(),
        }
    }

    /// Replaces parts of a running controller. Calls in flight finish on the old versions;
    /// every call that starts afterwards (for keys already queued too) uses the new ones.
    pub fn swap(&self, swap: Swap) -> Result<(), ControllerError> {
        if swap.filter.is_some() && self.shared.filter.is_none() {
            return Err(ControllerError::InvalidConfig {
                controller: self.shared.name.clone(),
                reason: "cannot swap in a filter: no source of this controller uses one".into(),
            });
        }
        if let Some(r) = swap.reconciler {
            self.shared.reconciler.store(r);
        }
        if let Some(m) = swap.mapper {
            for slot in &self.shared.mappers {
                slot.store(m.clone());
            }
        }
        if let (Some(f), Some(slot)) = (swap.filter, &self.shared.filter) {
            slot.store(f);
        }
        tracing::info!(controller = %self.shared.name, "swapped controller implementation");
        Ok(())
    }

    /// Replaces the reconciler (see [`swap`](Self::swap)); returns the previous one.
    pub fn swap_reconciler(&self, reconciler: Arc<dyn Reconciler>) -> Arc<dyn Reconciler> {
        self.shared.reconciler.store(reconciler)
    }

    /// Runs the controller until `shutdown` is cancelled: registers the handlers, waits for
    /// the sources to sync, runs the workers; on shutdown lets in-flight reconciles finish,
    /// removes the handlers and shuts the queue down. A controller runs once.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), ControllerError> {
        let s = &self.shared;
        if s.started.swap(true, Ordering::AcqRel) {
            return Err(ControllerError::AlreadyStarted { controller: s.name.clone() });
        }
        let mut guard = RunGuard { queue: s.queue.clone(), registrations: Vec::new(), keep_queue: false };
        for b in &s.bindings {
            let reg = b.handler.clone();
            match b.source.register(reg) {
                Ok(r) => guard.registrations.push((b.source.gvk(), r)),
                Err(source) => {
                    let e = ControllerError::Source { controller: s.name.clone(), source };
                    *s.sync_error.lock() = Some(e.to_string());
                    guard.keep_queue = true;
                    return Err(e);
                }
            }
        }
        if let Some(m) = &s.metrics {
            m.max_concurrent.set(i64::try_from(s.max_concurrent_reconciles).unwrap_or(i64::MAX));
        }

        let sync_deadline = Instant::now() + s.cache_sync_timeout;
        loop {
            let pending: Vec<String> = guard
                .registrations
                .iter()
                .filter(|(_, r)| !r.has_synced())
                .map(|(gvk, _)| describe(gvk))
                .collect();
            if pending.is_empty() {
                break;
            }
            if Instant::now() >= sync_deadline {
                let e = ControllerError::CacheSyncTimeout {
                    controller: s.name.clone(),
                    kinds: pending.join(", "),
                    timeout: s.cache_sync_timeout,
                };
                tracing::error!(controller = %s.name, error = %e, "caches did not sync");
                *s.sync_error.lock() = Some(e.to_string());
                guard.keep_queue = true;
                return Err(e);
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(SYNC_POLL) => {}
            }
        }
        s.synced.store(true, Ordering::Release);
        tracing::info!(
            controller = %s.name,
            workers = s.max_concurrent_reconciles,
            "caches synced, starting workers"
        );

        let stop = shutdown.child_token();
        let mut workers = JoinSet::new();
        for _ in 0..s.max_concurrent_reconciles {
            // Counted before the task first runs: a worker spawned is one readiness counts,
            // even while another has already taken the first keys.
            let slot = WorkerSlot::new(self.shared.clone());
            workers.spawn(worker(self.shared.clone(), stop.clone(), slot));
        }
        tokio::select! {
            // Stop first: workers end on it too, and one that already did is no surprise.
            biased;
            _ = stop.cancelled() => {}
            Some(ended) = workers.join_next() => {
                // Workers only end on shutdown; anything else is a bug worth a loud log.
                tracing::error!(controller = %s.name, result = ?ended, "a worker ended unexpectedly");
                stop.cancel();
            }
        }
        tracing::info!(controller = %s.name, "shutting down: waiting for in-flight reconciles");
        s.queue.shut_down_with_drain().await;
        while workers.join_next().await.is_some() {}
        drop(guard);
        tracing::info!(controller = %s.name, "stopped");
        Ok(())
    }
}

/// Undoes `run`'s effects however it ends (return, error, or the future being dropped).
struct RunGuard {
    queue: RateLimitingQueue<Request>,
    registrations: Vec<(GroupVersionKind, Box<dyn EventRegistration>)>,
    /// A failed run leaves the queue to its owner (see the module doc).
    keep_queue: bool,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        for (_, r) in &self.registrations {
            r.remove();
        }
        if !self.keep_queue {
            self.queue.shut_down();
        }
    }
}

/// Counts a started worker for readiness, from its spawn until its task ends or is dropped
/// (also if it is aborted before it first runs).
struct WorkerSlot(Arc<Shared>);

impl WorkerSlot {
    fn new(shared: Arc<Shared>) -> Self {
        shared.workers.fetch_add(1, Ordering::AcqRel);
        WorkerSlot(shared)
    }
}

impl Drop for WorkerSlot {
    fn drop(&mut self) {
        self.0.workers.fetch_sub(1, Ordering::AcqRel);
    }
}

async fn worker(shared: Arc<Shared>, stop: CancellationToken, _slot: WorkerSlot) {
    loop {
        let request = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            r = shared.queue.get_traced() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let (request, origin) = request;
        let claim = match &shared.ownership {
            Some(ownership) => match ownership.claim(&request) {
                Some(claim) => Some(claim),
                None => {
                    // Not this replica's to reconcile (now): dropped, never reconciled here.
                    tracing::debug!(controller = %shared.name, request = %request, "not owned here; dropped");
                    shared.queue.forget(&request);
                    shared.queue.done(&request);
                    continue;
                }
            },
            None => None,
        };
        reconcile_one(&shared, request, origin, claim).await;
    }
}

/// The `Done` of a request, even if the reconcile future is dropped mid-way.
struct InFlight<'a> {
    shared: &'a Shared,
    request: Request,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(m) = &self.shared.metrics {
            m.active_workers.dec();
        }
        self.shared.queue.done(&self.request);
    }
}

/// Reconciles `request` (caused by `origin`, for tracing); `claim` (the ownership's, if
/// any) is released after the result was handled, so a requeue still happens while this
/// replica owns the key.
async fn reconcile_one(shared: &Shared, request: Request, origin: Origin, claim: Option<Claim>) {
    if let Some(m) = &shared.metrics {
        m.active_workers.inc();
    }
    // Dropped after `_in_flight` (reverse order): the key is `done` before it is released.
    let _claim = claim;
    let _in_flight = InFlight { shared, request: request.clone() };
    let span = tracing::info_span!("reconcile", controller = %shared.name, request = %request);
    let trace = if crate::telemetry::enabled() {
        ReconcileTrace::start(&shared.name, &request.to_string(), origin, &span)
    } else {
        None
    };
    let started = Instant::now();
    let result = call_reconciler(shared, request.clone()).instrument(span.clone()).await;
    let elapsed = started.elapsed();
    if let Some(m) = &shared.metrics {
        m.reconcile_time.observe(elapsed.as_secs_f64());
    }
    let _enter = span.enter();
    let outcome = handle_result(shared, request, result, trace.as_ref().map(ReconcileTrace::span_context));
    if let Some(trace) = trace {
        trace.end(outcome.0, outcome.1);
    }
}

async fn call_reconciler(shared: &Shared, request: Request) -> Result<Action, ReconcileError> {
    let reconciler = shared.reconciler.load();
    let future = match std::panic::catch_unwind(AssertUnwindSafe(|| reconciler.reconcile(request))) {
        Ok(f) => AssertUnwindSafe(f).catch_unwind(),
        Err(panic) => return Err(ReconcileError::Panic(panic_message(&*panic))),
    };
    let outcome = match shared.reconcile_timeout {
        Some(deadline) => match tokio::time::timeout(deadline, future).await {
            Ok(r) => r,
            Err(_) => {
                return Err(ReconcileError::Retryable(format!(
                    "reconcile did not finish within its deadline of {deadline:?}"
                )));
            }
        },
        None => future.await,
    };
    outcome.unwrap_or_else(|panic| Err(ReconcileError::Panic(panic_message(&*panic))))
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

/// Handles a reconcile's result; returns the result's label (as `controller_runtime_reconcile_total`
/// counts it) and the error, for the trace. A requeued key links to `trace`.
fn handle_result(
    shared: &Shared,
    request: Request,
    result: Result<Action, ReconcileError>,
    trace: Option<&opentelemetry::trace::SpanContext>,
) -> (&'static str, Option<String>) {
    let q = &shared.queue;
    let m = shared.metrics.as_ref();
    match result {
        Err(ReconcileError::Terminal(msg)) => {
            tracing::error!(error = %msg, "terminal reconcile error, not retrying");
            if let Some(m) = m {
                m.terminal_errors.inc();
                m.errors.inc();
                m.error.inc();
            }
            // No `forget`: controller-runtime keeps the key's failures after a terminal
            // error, so a later retryable error backs off from where it was.
            ("error", Some(msg))
        }
        Err(e) => {
            let panicked = matches!(e, ReconcileError::Panic(_));
            tracing::error!(
                error = %e,
                retries = q.num_requeues(&request),
                "reconcile failed, retrying with backoff"
            );
            if let Some(m) = m {
                if panicked {
                    m.panics.inc();
                }
                m.errors.inc();
                m.error.inc();
            }
            q.add_rate_limited_traced(request, TraceOrigin::requeue(trace, "error"));
            ("error", Some(e.to_string()))
        }
        Ok(Action::RequeueAfter(after)) if !after.is_zero() => {
            tracing::debug!(?after, "reconciled, requeueing after a delay");
            q.forget(&request);
            q.add_after_traced(request, after, TraceOrigin::requeue(trace, "requeue_after"));
            if let Some(m) = m {
                m.requeue_after.inc();
            }
            ("requeue_after", None)
        }
        Ok(Action::Requeue) => {
            tracing::debug!("reconciled, requeueing with backoff");
            q.add_rate_limited_traced(request, TraceOrigin::requeue(trace, "requeue"));
            if let Some(m) = m {
                m.requeue.inc();
            }
            ("requeue", None)
        }
        Ok(Action::Done | Action::RequeueAfter(_)) => {
            tracing::debug!("reconciled");
            q.forget(&request);
            if let Some(m) = m {
                m.success.inc();
            }
            ("success", None)
        }
    }
}
