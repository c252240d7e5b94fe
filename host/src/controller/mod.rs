//! Controllers: workers that take keys from a rate-limited queue and reconcile them,
//! with controller-runtime's result handling, event sources and predicates.

use std::time::Duration;

use futures::future::BoxFuture;

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
