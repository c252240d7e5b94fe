//! The host's cluster access shared by every plugin ([`KubeServices`]): the Kubernetes
//! client, the runtime requests run on, the discovery cache, the host-wide event recorder,
//! revocation, and the call log of fixture runs.
//!
//! Kinds resolve through the host's one discovery implementation ([`Discovery`], the one
//! informers use; the binary hands this module the informer factory's, so both share a cache).
//!
//! Layering: the `client` and `events` imports both build on this module; it imports
//! neither of them (nor the store's state), so cluster access has one home and the two
//! imports do not depend on each other.
//!
//! Invariants:
//! - Once [`KubeServices::revoke`] ran (this replica lost its leader lease), no request is
//!   sent any more and none in flight is waited for: each fails at once as `unavailable`,
//!   so no write of a deposed leader reaches the cluster after the loss was noticed.
//! - [`KubeServices::block_on`] never waits past the call's deadline (plus a second when the
//!   runtime cannot run the request at all).
//! - Client errors map onto the WIT error variants by HTTP status ([`map_kube_error`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::call_log::CallLog;
use super::event_recorder::EventRecorder;
use crate::plugin::bindings::wasmctrl::controller::types::Error as WitError;
use crate::plugin::spec::Gvk;
use crate::source::{ApiResource, Discovery, DiscoveryError};

/// The host's cluster access shared by every plugin: client, runtime, discovery cache,
/// event recorder.
pub struct KubeServices {
    pub(crate) client: kube::Client,
    runtime: tokio::runtime::Handle,
    discovery: Discovery,
    pub(crate) events: EventRecorder,
    /// Cancelled for good by [`KubeServices::revoke`].
    revoked: CancellationToken,
    /// Where writes and Events are recorded (fixture runs only).
    pub(crate) call_log: Option<Arc<CallLog>>,
}

impl KubeServices {
    /// Cluster access for plugins through `client`; requests run on `runtime` (which must
    /// be a multi-threaded runtime: plugin calls block while they wait).
    pub fn new(
        client: kube::Client,
        runtime: tokio::runtime::Handle,
        reporting_instance: impl Into<String>,
    ) -> Arc<Self> {
        let discovery = Discovery::new(client.clone());
        Self::with_discovery(client, runtime, reporting_instance, discovery)
    }

    /// As [`KubeServices::new`], resolving kinds through `discovery` (e.g. the informer
    /// factory's, so plugins and informers share one discovery cache).
    pub fn with_discovery(
        client: kube::Client,
        runtime: tokio::runtime::Handle,
        reporting_instance: impl Into<String>,
        discovery: Discovery,
    ) -> Arc<Self> {
        Arc::new(KubeServices {
            events: EventRecorder::new(reporting_instance.into()),
            client,
            runtime,
            discovery,
            revoked: CancellationToken::new(),
            call_log: None,
        })
    }

    /// As [`KubeServices::new`], also recording every write and Event plugins make into
    /// `log` (for `wasmctrl test`).
    pub fn recording(
        client: kube::Client,
        runtime: tokio::runtime::Handle,
        reporting_instance: impl Into<String>,
        log: Arc<CallLog>,
    ) -> Arc<Self> {
        Arc::new(KubeServices {
            events: EventRecorder::new(reporting_instance.into()),
            discovery: Discovery::new(client.clone()),
            client,
            runtime,
            revoked: CancellationToken::new(),
            call_log: Some(log),
        })
    }

    /// Takes the plugins' cluster access away for good (the leader lease was lost): every
    /// later request fails without being sent, requests in flight are abandoned, and
    /// running plugin calls are interrupted at their next epoch tick.
    pub fn revoke(&self) {
        if !self.revoked.is_cancelled() {
            tracing::warn!("cluster access of plugins revoked: writes are refused, calls cancelled");
            self.revoked.cancel();
        }
    }

    /// A token cancelled by [`revoke`](Self::revoke) (plugin calls blocked in a host call
    /// wait on it).
    pub(crate) fn revocation(&self) -> CancellationToken {
        self.revoked.clone()
    }

    /// Whether [`revoke`](Self::revoke) ran.
    pub fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// Runs `fut` on the runtime and waits for it, at most until `deadline`.
    pub(crate) fn block_on<T: Send + 'static>(
        &self,
        deadline: Instant,
        fut: impl Future<Output = Result<T, WitError>> + Send + 'static,
    ) -> Result<T, WitError> {
        if self.is_revoked() {
            return Err(revoked_error());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let until = tokio::time::Instant::from_std(deadline);
        let revoked = self.revoked.clone();
        self.runtime.spawn(async move {
            let result = tokio::select! {
                biased;
                _ = revoked.cancelled() => Err(revoked_error()),
                r = tokio::time::timeout_at(until, fut) => match r {
                    Ok(r) => r,
                    Err(_) => Err(WitError::Unavailable(
                        "the call's deadline passed while waiting for the API server".into(),
                    )),
                },
            };
            let _ = tx.send(result);
        });
        // Bounded even if the runtime cannot run the task (e.g. a current-thread runtime
        // whose only thread is the one waiting here).
        let wait = deadline.saturating_duration_since(Instant::now()) + std::time::Duration::from_secs(1);
        match super::call::blocking_wait(|| rx.recv_timeout(wait)) {
            Ok(result) => result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(WitError::Unavailable(
                "the runtime did not run the request before the call's deadline".into(),
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(WitError::Unavailable("the host is shutting down".into()))
            }
        }
    }

    /// The resource serving `kind` (discovery, cached).
    pub(crate) fn resolve(&self, kind: &Gvk, deadline: Instant) -> Result<ApiResource, WitError> {
        if let Some(r) = self.discovery.cached(&kind.api_version, &kind.kind) {
            return Ok(r);
        }
        let discovery = self.discovery.clone();
        let (api_version, name, shown) = (kind.api_version.clone(), kind.kind.clone(), kind.to_string());
        self.block_on(deadline, async move {
            discovery.resolve(&api_version, &name).await.map_err(|e| match e {
                DiscoveryError::UnknownKind { .. } | DiscoveryError::UnknownApiVersion { .. } => {
                    WitError::Invalid(format!("the API server does not serve {shown}"))
                }
                DiscoveryError::InvalidApiVersion(_) => WitError::Invalid(e.to_string()),
                DiscoveryError::Request { source, .. } => map_kube_error(source),
            })
        })
    }

    /// Sends `request` and returns the response body, bounded by `deadline`.
    pub(crate) fn send(
        &self,
        deadline: Instant,
        request: http::Request<Vec<u8>>,
    ) -> Result<String, WitError> {
        let span = crate::telemetry::api_request(&request);
        let (client, status) = (self.client.clone(), Arc::new(std::sync::atomic::AtomicU16::new(0)));
        let seen = status.clone();
        let result = span.in_scope(|| {
            self.block_on(deadline, async move {
                client.request_text(request).await.map_err(|e| map_kube_error_seen(e, &seen))
            })
        });
        let code = status.load(std::sync::atomic::Ordering::Relaxed);
        crate::telemetry::api_response(&span, &result, (code != 0).then_some(code));
        result
    }
}

/// [`map_kube_error`], keeping the API server's status code (for the request's span).
fn map_kube_error_seen(e: kube::Error, status: &std::sync::atomic::AtomicU16) -> WitError {
    if let kube::Error::Api(s) = &e {
        status.store(s.code, std::sync::atomic::Ordering::Relaxed);
    }
    map_kube_error(e)
}

/// What a request gets once cluster access is revoked.
pub(crate) fn revoked_error() -> WitError {
    WitError::Unavailable("this replica lost its leader lease: cluster access is revoked".into())
}

/// Maps a client error onto the WIT error variants by HTTP status.
pub(crate) fn map_kube_error(e: kube::Error) -> WitError {
    match e {
        kube::Error::Api(s) => {
            let msg = if s.message.is_empty() { s.reason.clone() } else { s.message.clone() };
            match s.code {
                404 => WitError::NotFound(msg),
                409 if s.reason == "AlreadyExists" => WitError::AlreadyExists(msg),
                409 => WitError::Conflict(msg),
                401 | 403 => WitError::Forbidden(msg),
                400 | 415 | 422 => WitError::Invalid(msg),
                429 | 500 | 502 | 503 | 504 => WitError::Unavailable(msg),
                code => WitError::Other((code, msg)),
            }
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            WitError::Unavailable(e.to_string())
        }
        other => WitError::Other((0, other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_map_by_status() {
        let status = |code: u16, reason: &str| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                reason: reason.into(),
                message: "m".into(),
                ..Default::default()
            }))
        };
        assert!(matches!(map_kube_error(status(404, "NotFound")), WitError::NotFound(_)));
        assert!(matches!(map_kube_error(status(409, "AlreadyExists")), WitError::AlreadyExists(_)));
        assert!(matches!(map_kube_error(status(409, "Conflict")), WitError::Conflict(_)));
        assert!(matches!(map_kube_error(status(403, "Forbidden")), WitError::Forbidden(_)));
        assert!(matches!(map_kube_error(status(422, "Invalid")), WitError::Invalid(_)));
        assert!(matches!(map_kube_error(status(429, "TooManyRequests")), WitError::Unavailable(_)));
        assert!(matches!(map_kube_error(status(418, "Teapot")), WitError::Other((418, _))));
    }
}
