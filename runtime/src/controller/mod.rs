//! Controllers: workers that take keys from a rate-limited queue and reconcile them,
//! with controller-runtime's result handling, event sources and predicates.
//!
//! - [`Request`], [`Action`], [`ReconcileError`], [`Reconciler`]: the reconcile contract.
//! - [`Controller`] / [`ControllerBuilder`] (in `runner`): workers, result handling,
//!   metrics, readiness, graceful shutdown, hot swap of reconciler / mapper / filter.
//! - [`source`]: what notifications come from ([`EventSource`], [`ManualSource`]).
//! - [`handler`]: notifications → requests (`for`, `owns`, `watches` + [`Mapper`]).
//! - [`predicate`]: which notifications count.
//! - [`leader`]: leader election on a `coordination.k8s.io/v1` Lease.
//! - [`ownership`]: which keys this replica may work on when replicas share the work.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::future::BoxFuture;

pub mod handler;
pub mod leader;
pub mod ownership;

pub mod predicate;
mod runner;
pub mod source;

pub use handler::Mapper;
pub use ownership::{Claim, Ownership};
pub use predicate::{Filter, FilterEvent, Predicate};
pub use runner::{Controller, ControllerBuilder, ControllerError, Readiness, SourceSpec, Swap};
pub use source::{EventRegistration, EventSource, InformerSource, ManualSource};

/// The object a reconcile is for. `namespace` is `None` for cluster-scoped kinds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Request {
    pub namespace: Option<String>,
    pub name: String,
}

impl Request {
    /// Parses a cache key (`namespace/name` or `name`).
    pub fn from_key(key: &str) -> Self {
        match key.split_once('/') {
            Some((ns, name)) => Request { namespace: Some(ns.to_owned()), name: name.to_owned() },
            None => Request { namespace: None, name: key.to_owned() },
        }
    }

    /// The cache key of the requested object.
    pub fn key(&self) -> String {
        crate::object::key_of(self.namespace.as_deref(), &self.name)
    }
}

impl std::fmt::Display for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// How a reconcile ended well (controller-runtime's `Result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Done until something changes: the key's failure count is forgotten.
    Done,
    /// Reconcile again after the rate limiter's backoff.
    Requeue,
    /// Forget the failures, reconcile again after this delay.
    RequeueAfter(Duration),
}

/// How a reconcile failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReconcileError {
    /// Retried with rate-limited backoff.
    #[error("{0}")]
    Retryable(String),
    /// Logged and counted, not retried (controller-runtime's `TerminalError`).
    #[error("terminal: {0}")]
    Terminal(String),
    /// The reconciler crashed (a Wasm trap, a Rust panic); retried like `Retryable` and
    /// counted as a panic.
    #[error("panic: {0}")]
    Panic(String),
}

/// The business logic of a controller: native Rust in tests and benchmarks, a Wasm plugin
/// in production.
pub trait Reconciler: Send + Sync + 'static {
    fn reconcile(&self, request: Request) -> BoxFuture<'static, Result<Action, ReconcileError>>;
}

/// A [`Reconciler`] made of a closure (tests, benchmarks, small native controllers).
///
/// ```
/// use wasmctrl_runtime::controller::{Action, reconciler_fn};
/// let r = reconciler_fn(|_req| async { Ok(Action::Done) });
/// # let _ = r;
/// ```
pub fn reconciler_fn<F, Fut>(f: F) -> Arc<dyn Reconciler>
where
    F: Fn(Request) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    struct FnReconciler<F>(F);
    impl<F, Fut> Reconciler for FnReconciler<F>
    where
        F: Fn(Request) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Action, ReconcileError>> + Send + 'static,
    {
        fn reconcile(&self, request: Request) -> BoxFuture<'static, Result<Action, ReconcileError>> {
            Box::pin((self.0)(request))
        }
    }
    Arc::new(FnReconciler(f))
}

/// A shared slot holding the current implementation of something hot-swappable (a
/// reconciler, mapper or filter). `load` returns the current one; a caller keeps using what
/// it loaded even if a `store` happens meanwhile, so calls in flight finish on the old version.
///
/// A thin wrapper over [`arc_swap::ArcSwap`], so loads on the hot path take no lock.
/// `ArcSwap` needs a sized, thin-pointer payload, and the slots hold trait objects
/// (`dyn Reconciler`), so the payload is the `Arc<T>` itself: a store allocates one extra
/// `Arc`, a load clones the inner one.
pub struct HotSwap<T: ?Sized>(Arc<ArcSwap<Arc<T>>>);

impl<T: ?Sized> Clone for HotSwap<T> {
    fn clone(&self) -> Self {
        HotSwap(self.0.clone())
    }
}

impl<T: ?Sized> std::fmt::Debug for HotSwap<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HotSwap")
    }
}

impl<T: ?Sized> HotSwap<T> {
    pub fn new(value: Arc<T>) -> Self {
        HotSwap(Arc::new(ArcSwap::from_pointee(value)))
    }

    /// The current value.
    pub fn load(&self) -> Arc<T> {
        Arc::clone(&self.0.load())
    }

    /// Replaces the value; returns the previous one.
    pub fn store(&self, value: Arc<T>) -> Arc<T> {
        Arc::unwrap_or_clone(self.0.swap(Arc::new(value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    trait Named: Send + Sync {
        fn name(&self) -> &'static str;
    }
    struct N(&'static str);
    impl Named for N {
        fn name(&self) -> &'static str {
            self.0
        }
    }

    #[test]
    fn hot_swap_keeps_loaded_values_and_returns_the_previous_one() {
        let slot: HotSwap<dyn Named> = HotSwap::new(Arc::new(N("v1")));
        let other = slot.clone();
        let in_flight = slot.load();
        let previous = other.store(Arc::new(N("v2")));
        assert_eq!(previous.name(), "v1");
        assert_eq!(in_flight.name(), "v1", "a loaded value outlives the store");
        assert_eq!(slot.load().name(), "v2", "clones share one slot");
        assert!(Arc::ptr_eq(&previous, &in_flight));
    }
}
