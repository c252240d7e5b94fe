//! Host side of the `events` import: validates a plugin's event, records it for fixture
//! runs, and sends what the host-wide recorder ([`super::recorder`]) decides.
//!
//! Layering: [`EventsCtx`] (the plugin's name and cluster access) is this interface's whole
//! host context, reached through [`EventsCtxView`]; cluster access comes from
//! [`super::cluster`], the spam filter and aggregation from [`super::recorder`]. This module
//! imports neither the `client` import nor the store's state.
//!
//! Invariants:
//! - `publish` never blocks on the API server: the event is sent on the runtime and a
//!   failure is logged, as client-go's broadcaster does.
//! - events.k8s.io/v1 is used; when the server lacks it, core/v1 Events are written.
//! - Nothing is sent once the host's cluster access is revoked (leader lease lost), nor
//!   from a call that may not write (an admission call without side effects).

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::events::v1::EventSeries;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use wasmtime::component::HasData;

use super::bindings::wasmctrl::controller::events::{Event as WitEvent, EventType, Host};
use super::bindings::wasmctrl::controller::types::Error as WitError;
use super::call::CallInfo;
use super::cluster::{KubeServices, map_kube_error, revoked_error};
use super::record::RecordedEvent;
use super::recorder::{MAX_NOTE, Planned, jiff_now, to_core};
use super::spec::Gvk;

/// The `events` import's host context.
pub(crate) struct EventsCtx {
    pub plugin: String,
    /// Cluster access; `None` when the host runs plugins without one.
    pub kube: Option<Arc<KubeServices>>,
}

/// What an `events` call sees.
pub(crate) struct EventsCtxView<'a> {
    pub ctx: &'a EventsCtx,
    /// The call in progress (an admission call may not publish).
    pub call: &'a CallInfo,
}

/// Links `events` with [`EventsCtxView`] as its host.
pub(crate) struct HasEvents;

impl HasData for HasEvents {
    type Data<'a> = EventsCtxView<'a>;
}

/// Sends one planned event; falls back to core/v1 for good when the server lacks
/// events.k8s.io/v1.
async fn send_planned(kube: Arc<KubeServices>, send: Planned) -> Result<(), WitError> {
    if kube.is_revoked() {
        return Err(revoked_error());
    }
    let core = kube.events.uses_core_v1();
    let request = match (&send, core) {
        (Planned::Create { namespace, event }, false) => {
            let body = serde_json::to_vec(event).map_err(|e| WitError::Invalid(e.to_string()))?;
            kube::core::Request::new(format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events"))
                .create(&Default::default(), body)
        }
        (Planned::Create { namespace, event }, true) => {
            let body = serde_json::to_vec(&to_core(event)).map_err(|e| WitError::Invalid(e.to_string()))?;
            kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/events")).create(&Default::default(), body)
        }
        (Planned::Series { namespace, name, count }, false) => {
            let patch = serde_json::json!({"series": EventSeries { count: *count, last_observed_time: MicroTime(jiff_now()) }});
            kube::core::Request::new(format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events"))
                .patch(name, &Default::default(), &kube::api::Patch::Merge(patch))
        }
        (Planned::Series { namespace, name, count }, true) => {
            let patch = serde_json::json!({"count": count, "lastTimestamp": Time(jiff_now())});
            kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/events"))
                .patch(name, &Default::default(), &kube::api::Patch::Merge(patch))
        }
    }
    .map_err(|e| WitError::Invalid(e.to_string()))?;
    match kube.client.request_text(request).await {
        Err(kube::Error::Api(s)) if s.code == 404 && !core && matches!(send, Planned::Create { .. }) => {
            // No events.k8s.io group on this server: fall back to core/v1 for good.
            kube.events.fall_back_to_core_v1();
            Box::pin(send_planned(kube, send)).await
        }
        Err(e) => Err(map_kube_error(e)),
        Ok(_) => Ok(()),
    }
}

impl Host for EventsCtxView<'_> {
    fn publish(&mut self, mut event: WitEvent) -> wasmtime::Result<Result<(), WitError>> {
        if let Err(e) = super::access::check_call_may_write(&self.ctx.plugin, self.call) {
            return Ok(Err(e));
        }
        if event.reason.is_empty() || event.action.is_empty() {
            return Ok(Err(WitError::Invalid("an event needs a reason and an action".into())));
        }
        if event.regarding.name.is_empty() || event.regarding.kind.kind.is_empty() {
            return Ok(Err(WitError::Invalid(
                "an event needs the kind and name of the object it regards".into(),
            )));
        }
        if event.note.len() > MAX_NOTE {
            let mut end = MAX_NOTE;
            while !event.note.is_char_boundary(end) {
                end -= 1;
            }
            event.note.truncate(end);
        }
        if let Some(log) = self.ctx.kube.as_ref().and_then(|k| k.call_log.clone()) {
            log.push_event(RecordedEvent {
                kind: Gvk::new(event.regarding.kind.api_version.clone(), event.regarding.kind.kind.clone()),
                namespace: event.regarding.namespace.clone(),
                name: event.regarding.name.clone(),
                event_type: match event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                },
                reason: event.reason.clone(),
                action: event.action.clone(),
                note: event.note.clone(),
            });
        }
        let kube = match self.ctx.kube.clone() {
            Some(k) => k,
            None => {
                return Ok(Err(WitError::Unavailable(
                    "this host runs plugins without cluster access".into(),
                )));
            }
        };
        let plugin = self.ctx.plugin.clone();
        let Some(send) = kube.events.plan(&plugin, &event, Instant::now()) else {
            tracing::debug!(plugin, reason = %event.reason, object = %event.regarding.name, "event dropped by the spam filter");
            return Ok(Ok(()));
        };
        let runtime = kube.runtime().clone();
        runtime.spawn(async move {
            if let Err(e) = send_planned(kube, send).await {
                tracing::warn!(plugin, error = ?e, "recording an event failed");
            }
        });
        Ok(Ok(()))
    }
}
