//! Host side of the `events` import: validates a plugin's event, records it for fixture
//! runs, and queues what the host-wide recorder ([`super::event_recorder`]) decides.
//!
//! Layering: [`EventsCtx`] (the plugin's grants and cluster access) is this interface's whole
//! host context, reached through [`EventsCtxView`]; cluster access comes from
//! [`super::cluster`], the spam filter, rate limits and aggregation from
//! [`super::event_recorder`]. This module imports neither the `client` import nor the store's state.
//!
//! Invariants:
//! - A plugin publishes Events only about objects it may read: the regarding kind must be
//!   readable and its namespace one of the plugin's namespaces (an Event about a
//!   cluster-scoped object is written in `default`, which must then be one of them), else
//!   `forbidden`.
//! - Fields are checked as the API server checks them before anything is kept: the regarding
//!   kind, namespace (a DNS label) and name (a path segment, at most 253 bytes), `reason` and
//!   `action` (1 to 128 characters); `note` is cut at 1 KiB, as events.k8s.io/v1 caps it.
//! - `publish` never blocks on the API server and never spawns a task: the event goes to the
//!   recorder's bounded outbox, which one sender task drains (a few requests at a time); an
//!   event that finds the outbox full is dropped and counted, as is one over the plugin's
//!   rate limit or the spam filter (`wasmctrl_plugin_events_dropped`). A failed send is
//!   logged, as client-go's broadcaster does.
//! - events.k8s.io/v1 is used; when the server lacks it, core/v1 Events are written.
//! - Nothing is sent once the host's cluster access is revoked (leader lease lost), nor
//!   from a call that may not write (an admission call without side effects).

use std::sync::{Arc, Weak};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::events::v1::EventSeries;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use wasmtime::component::HasData;

use super::access::Access;
use super::call::CallInfo;
use super::call_log::RecordedEvent;
use super::cluster::{KubeServices, map_kube_error, revoked_error};
use super::event_recorder::{MAX_NOTE, MAX_REASON, OUTBOX, Outgoing, Planned, jiff_now, to_core};
use crate::plugin::bindings::wasmctrl::controller::events::{Event as WitEvent, EventType, Host};
use crate::plugin::bindings::wasmctrl::controller::types::Error as WitError;
use crate::plugin::spec::Gvk;

/// Requests the outbox's sender task has in flight at once.
const SENDERS: usize = 4;
/// Longest regarding name (a DNS subdomain's bound; API servers refuse longer names).
const MAX_OBJECT_NAME: usize = 253;

/// The `events` import's host context.
pub(crate) struct EventsCtx {
    pub access: Arc<Access>,
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

/// Checks an event's fields as the API server would, before anything is kept of it.
fn validate(event: &WitEvent) -> Result<(), WitError> {
    let invalid = |m: String| Err(WitError::Invalid(m));
    for (what, value) in [("reason", &event.reason), ("action", &event.action)] {
        if value.is_empty() {
            return invalid(format!("an event needs a {what}"));
        }
        if value.chars().count() > MAX_REASON {
            return invalid(format!("the event's {what} is longer than {MAX_REASON} characters"));
        }
    }
    let r = &event.regarding;
    let kind = &r.kind;
    if kind.kind.is_empty() || kind.kind.len() > 63 || !kind.kind.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return invalid(format!("the regarded kind {:?} is not a kind name", kind.kind));
    }
    if kind.api_version.is_empty()
        || kind.api_version.len() > MAX_OBJECT_NAME
        || !kind.api_version.bytes().all(|b| b.is_ascii_alphanumeric() || b"-./".contains(&b))
    {
        return invalid(format!("the regarded apiVersion {:?} is not an API version", kind.api_version));
    }
    let name = &r.name;
    if name.is_empty()
        || name.len() > MAX_OBJECT_NAME
        || name == "."
        || name == ".."
        || name.contains(['/', '%'])
        || name.chars().any(char::is_control)
    {
        return invalid(format!(
            "the regarded object's name {name:?} is not an object name (1 to {MAX_OBJECT_NAME} bytes, no `/` or `%`, not `.` or `..`)"
        ));
    }
    if let Some(ns) = r.namespace.as_deref().filter(|ns| !ns.is_empty())
        && !wasmctrl_selectors::is_dns_label(ns)
    {
        return invalid(format!("the regarded namespace {ns:?} is not a namespace name"));
    }
    Ok(())
}

/// Starts the outbox's sender task on `kube`'s runtime; it ends when `kube` is dropped.
fn start_sender(kube: &Arc<KubeServices>) -> tokio::sync::mpsc::Sender<Outgoing> {
    let (tx, rx) = tokio::sync::mpsc::channel(OUTBOX);
    let weak = Arc::downgrade(kube);
    kube.runtime().spawn(drain_outbox(weak, rx));
    tx
}

/// Sends what the outbox holds, a few at a time, until the recorder is dropped.
async fn drain_outbox(kube: Weak<KubeServices>, rx: tokio::sync::mpsc::Receiver<Outgoing>) {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|o| (o, rx)) })
        .for_each_concurrent(SENDERS, |o| {
            let kube = kube.upgrade();
            async move {
                let Some(kube) = kube else { return };
                if let Err(e) = send_planned(kube, o.planned).await {
                    tracing::warn!(plugin = %o.plugin, error = ?e, "recording an event failed");
                }
            }
        })
        .await;
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

impl EventsCtxView<'_> {
    /// Refuses an event about an object the plugin may not read.
    fn check_access(&self, event: &WitEvent) -> Result<(), WitError> {
        const OP: &str = "events.publish";
        let access = &self.ctx.access;
        let r = &event.regarding;
        let kind = Gvk::new(r.kind.api_version.clone(), r.kind.kind.clone());
        access.check_read(&kind, self.call, OP)?;
        match r.namespace.as_deref().filter(|ns| !ns.is_empty()) {
            Some(ns) => access.check_namespace(&kind, Some(ns), false, self.call, OP),
            None if access.in_scope(Some("default")) => Ok(()),
            None => {
                access.metrics().count_forbidden(access.plugin(), OP);
                tracing::warn!(plugin = access.plugin(), request = self.call.request.as_deref().unwrap_or(""), kind = %kind, "plugin refused: an Event about a cluster-scoped object goes to namespace default, outside its namespaces");
                Err(WitError::Forbidden(format!(
                    "plugin {} may not publish Events about {kind} {}: an Event about a cluster-scoped object is \
                     written in namespace default, which is not one of the plugin's namespaces",
                    access.plugin(),
                    r.name
                )))
            }
        }
    }
}

impl Host for EventsCtxView<'_> {
    fn publish(&mut self, mut event: WitEvent) -> wasmtime::Result<Result<(), WitError>> {
        if let Err(e) = super::access::check_call_may_write(self.ctx.access.plugin(), self.call) {
            return Ok(Err(e));
        }
        if let Err(e) = validate(&event).and_then(|()| self.check_access(&event)) {
            return Ok(Err(e));
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
        let Some(kube) = self.ctx.kube.as_ref() else {
            return Ok(Err(WitError::Unavailable("this host runs plugins without cluster access".into())));
        };
        let access = &self.ctx.access;
        let plugin = access.plugin();
        let planned = match kube.events.plan(plugin, &event, Instant::now()) {
            Ok(p) => p,
            Err(dropped) => {
                access.metrics().count_event_dropped(plugin, dropped.reason());
                tracing::debug!(plugin, reason = %event.reason, object = %event.regarding.name, dropped = dropped.reason(), "event dropped");
                return Ok(Ok(()));
            }
        };
        let outbox = kube.events.outbox.sender(|| start_sender(kube));
        match outbox.try_send(Outgoing { plugin: plugin.to_owned(), planned }) {
            Ok(()) => Ok(Ok(())),
            Err(tokio::sync::mpsc::error::TrySendError::Full(_)) => {
                access.metrics().count_event_dropped(plugin, "queue-full");
                tracing::debug!(plugin, reason = %event.reason, "event dropped: the host's event queue is full");
                Ok(Ok(()))
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {
                Ok(Err(WitError::Unavailable("the host's event sender has stopped".into())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::bindings::wasmctrl::controller::types::{Gvk as WitGvk, ObjectRef};
    use crate::plugin::imports::event_recorder::PLUGIN_BURST;
    use crate::plugin::metrics::{EventDropLabels, RuntimeMetrics};
    use crate::plugin::spec::{Permissions, SandboxLimits};

    /// `publish` hands each event to the outbox (no task of its own); once the outbox is
    /// full, events are dropped and counted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn publish_queues_to_the_bounded_outbox_and_a_full_one_drops_and_counts() {
        // A client that nothing is ever sent through.
        let url = "http://127.0.0.1:9".parse().unwrap_or_else(|e| panic!("{e}"));
        let client = kube::Client::try_from(kube::Config::new(url)).unwrap_or_else(|e| panic!("{e}"));
        let kube = KubeServices::new(client, tokio::runtime::Handle::current(), "test");
        // The outbox without its sender task: what publish queues stays there.
        let (tx, mut rx) = tokio::sync::mpsc::channel(OUTBOX);
        kube.events.outbox.sender(|| tx);
        let metrics = RuntimeMetrics::default();
        let per_plugin = PLUGIN_BURST as usize;
        let plugins = OUTBOX / per_plugin + 2;
        let call = CallInfo::idle();
        for p in 0..plugins {
            let permissions = Permissions::new([Gvk::new("v1", "ConfigMap")], [], []);
            let access = Arc::new(Access::new(
                format!("p{p}"),
                permissions,
                &SandboxLimits::default(),
                metrics.clone(),
            ));
            let ctx = EventsCtx { access, kube: Some(kube.clone()) };
            let mut view = EventsCtxView { ctx: &ctx, call: &call };
            for i in 0..per_plugin {
                let result = view.publish(event("v1", "ConfigMap", Some("ns"), &format!("o{i}")));
                assert!(matches!(result, Ok(Ok(()))), "{result:?}");
            }
        }
        let mut queued = 0;
        while rx.try_recv().is_ok() {
            queued += 1;
        }
        assert_eq!(queued, OUTBOX);
        let full: u64 = (0..plugins)
            .map(|p| {
                metrics
                    .events_dropped
                    .get_or_create(&EventDropLabels { plugin: format!("p{p}"), reason: "queue-full" })
                    .get()
            })
            .sum();
        assert_eq!(full as usize, plugins * per_plugin - OUTBOX);
    }

    fn event(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> WitEvent {
        WitEvent {
            regarding: ObjectRef {
                kind: WitGvk { api_version: api_version.into(), kind: kind.into() },
                namespace: namespace.map(str::to_owned),
                name: name.into(),
            },
            type_: EventType::Normal,
            reason: "Synced".into(),
            action: "Sync".into(),
            note: String::new(),
        }
    }

    fn refused(e: &WitEvent) -> String {
        match validate(e) {
            Err(WitError::Invalid(m)) => m,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn fields_are_checked_as_the_api_server_checks_them() {
        assert!(validate(&event("v1", "Pod", Some("team-a"), "web-1")).is_ok());
        assert!(validate(&event("apps/v1", "Deployment", None, "system:x")).is_ok());
        assert!(refused(&event("v1", "Pod", Some("team-a"), "../secrets")).contains("name"));
        assert!(refused(&event("v1", "Pod", Some("team-a"), "..")).contains("name"));
        assert!(refused(&event("v1", "Pod", Some("team-a"), "a%2F")).contains("name"));
        assert!(refused(&event("v1", "Pod", Some("team-a"), &"a".repeat(254))).contains("253"));
        assert!(refused(&event("v1", "Pod", Some("Team_A"), "x")).contains("namespace"));
        assert!(refused(&event("v1", "Pod", Some("a/b"), "x")).contains("namespace"));
        assert!(refused(&event("v1", "Po d", None, "x")).contains("kind"));
        assert!(refused(&event("v1?x=1", "Pod", None, "x")).contains("apiVersion"));
        let mut long = event("v1", "Pod", None, "x");
        long.reason = "R".repeat(129);
        assert!(refused(&long).contains("128"));
        long.reason = "R".repeat(128);
        assert!(validate(&long).is_ok());
        long.action = String::new();
        assert!(refused(&long).contains("action"));
    }
}
