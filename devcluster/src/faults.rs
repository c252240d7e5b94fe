//! Fault injection for tests: drop watches, compact history, pause the whole API, and add
//! latency or error responses (5xx, 429 with `Retry-After`) to requests on a path.
//!
//! This is a test-only handle ([`crate::DevCluster::faults`]), compiled in only with the
//! crate's `faults` feature (tests enable it); a build without it has no fault hooks at all.

use std::sync::Arc;
use std::time::Duration;

use http::Method;
use parking_lot::Mutex;

use crate::error::ApiError;
use crate::store::Store;

/// What an injected fault does to a matching request.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// Wait this long before handling the request.
    Latency(Duration),
    /// Fail with this status code (e.g. 500, 503); 429 gets reason TooManyRequests.
    Error {
        /// HTTP status code.
        code: u16,
        /// `Retry-After` header value in seconds.
        retry_after: Option<u64>,
    },
}

/// A rule: requests whose path starts with `path_prefix` (and, if set, use `method` / are
/// or aren't watches) get `action`, at most `times` times (None: until cleared).
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// Path prefix to match, e.g. `/api/v1/namespaces/default/configmaps`.
    pub path_prefix: String,
    /// Only this method.
    pub method: Option<Method>,
    /// Only watch requests (`Some(true)`), only non-watch (`Some(false)`), or both.
    pub watch: Option<bool>,
    /// How many requests to affect.
    pub times: Option<u32>,
    /// What to do.
    pub action: FaultAction,
}

impl FaultRule {
    /// A rule failing requests under `path_prefix` with `code`.
    pub fn error(path_prefix: impl Into<String>, code: u16) -> Self {
        Self {
            path_prefix: path_prefix.into(),
            method: None,
            watch: None,
            times: None,
            action: FaultAction::Error { code, retry_after: None },
        }
    }

    /// A rule answering 429 with `Retry-After: retry_after_secs`.
    pub fn too_many_requests(path_prefix: impl Into<String>, retry_after_secs: u64) -> Self {
        Self {
            action: FaultAction::Error { code: 429, retry_after: Some(retry_after_secs) },
            ..Self::error(path_prefix, 429)
        }
    }

    /// A rule delaying requests under `path_prefix`.
    pub fn latency(path_prefix: impl Into<String>, delay: Duration) -> Self {
        Self { action: FaultAction::Latency(delay), ..Self::error(path_prefix, 0) }
    }

    /// Limits the rule to `n` matching requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Limits the rule to one method.
    pub fn method(mut self, m: Method) -> Self {
        self.method = Some(m);
        self
    }

    /// Limits the rule to watch (true) or non-watch (false) requests.
    pub fn watch(mut self, is_watch: bool) -> Self {
        self.watch = Some(is_watch);
        self
    }
}

#[derive(Debug)]
struct FaultState {
    rules: Mutex<Vec<FaultRule>>,
    paused: tokio::sync::watch::Sender<bool>,
}

/// Test-only fault handle of a running [`crate::DevCluster`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Faults {
    state: Arc<FaultState>,
    store: Arc<Store>,
}

impl Faults {
    pub(crate) fn new(store: Arc<Store>) -> Self {
        Self {
            state: Arc::new(FaultState {
                rules: Mutex::new(Vec::new()),
                paused: tokio::sync::watch::channel(false).0,
            }),
            store,
        }
    }

    /// Ends every open watch stream (clients see the stream close and re-watch).
    pub fn drop_watches(&self) {
        self.store.drop_watches();
    }

    /// Forgets the event history: a watch from any resourceVersion before now gets 410 Gone.
    pub fn compact_history(&self) {
        self.store.compact();
    }

    /// Stalls every request (and watch delivery) until [`Self::resume`].
    pub fn pause(&self) {
        self.state.paused.send_replace(true);
    }

    /// Ends a [`Self::pause`].
    pub fn resume(&self) {
        self.state.paused.send_replace(false);
    }

    /// Adds a rule.
    pub fn inject(&self, rule: FaultRule) {
        self.state.rules.lock().push(rule);
    }

    /// Removes every rule (and resumes).
    pub fn clear(&self) {
        self.state.rules.lock().clear();
        self.resume();
    }

    /// Waits while paused.
    pub(crate) async fn wait_unpaused(&self) {
        let mut rx = self.state.paused.subscribe();
        // Only fails if the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|p| !*p).await;
    }

    /// Applies matching rules to a request: sleeps for latency rules, returns the error of the
    /// first matching error rule.
    pub(crate) async fn before(&self, method: &Method, path: &str, is_watch: bool) -> Result<(), ApiError> {
        self.wait_unpaused().await;
        let mut delay = Duration::ZERO;
        let mut error = None;
        {
            let mut rules = self.state.rules.lock();
            for rule in rules.iter_mut() {
                let matches = path.starts_with(&rule.path_prefix)
                    && rule.method.as_ref().is_none_or(|m| m == method)
                    && rule.watch.is_none_or(|w| w == is_watch)
                    && rule.times != Some(0);
                if !matches {
                    continue;
                }
                match &rule.action {
                    FaultAction::Latency(d) => delay += *d,
                    FaultAction::Error { code, retry_after } => {
                        if error.is_some() {
                            continue;
                        }
                        error = Some(ApiError::injected(*code, *retry_after));
                    }
                }
                if let Some(t) = rule.times.as_mut() {
                    *t -= 1;
                }
            }
            rules.retain(|r| r.times != Some(0));
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        error.map_or(Ok(()), Err)
    }
}
