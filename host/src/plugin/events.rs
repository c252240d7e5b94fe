//! Host side of the `events` import: a Kubernetes event recorder in the manner of
//! client-go's `EventRecorder`.
//!
//! Invariants:
//! - `publish` never blocks on the API server: the event is sent on the runtime and a
//!   failure is logged, as client-go's broadcaster does.
//! - Spam filter: per regarding object a token bucket (burst 25, one token per 5 min,
//!   client-go's `EventSourceObjectSpamFilter` defaults) drops excess events.
//! - Aggregation: an identical event (same object, type, reason, action, note) within
//!   10 minutes bumps the existing event's `series` instead of creating another.
//! - events.k8s.io/v1 is used; when the server lacks it, core/v1 Events are written.
//! - Nothing is sent once the host's cluster access is revoked (leader lease lost).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use parking_lot::Mutex;

use super::bindings::wasmctrl::controller::events::{Event as WitEvent, EventType, Host};
use super::bindings::wasmctrl::controller::types::Error as WitError;
use super::client::{KubeServices, map_kube_error};
use super::state::HostState;

const BURST: f64 = 25.0;
const REFILL: Duration = Duration::from_secs(300);
const AGGREGATION_WINDOW: Duration = Duration::from_secs(600);
/// events.k8s.io/v1 caps `note` at 1 KiB.
const MAX_NOTE: usize = 1024;
/// Bounds the recorder's memory: older entries are forgotten first.
const MAX_TRACKED: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventKey {
    regarding: String,
    kind: String,
    event_type: &'static str,
    reason: String,
    action: String,
    note: String,
}

struct Seen {
    namespace: String,
    name: String,
    count: i32,
    first: Instant,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Default)]
struct RecorderState {
    seen: HashMap<EventKey, Seen>,
    buckets: HashMap<String, Bucket>,
}

/// What to send for one `publish`.
enum Send {
    Create { namespace: String, event: Box<Event> },
    Series { namespace: String, name: String, count: i32 },
}

/// Records plugin events with spam filtering and aggregation.
pub(crate) struct EventRecorder {
    reporting_instance: String,
    state: Mutex<RecorderState>,
    core_v1: AtomicBool,
}

impl EventRecorder {
    pub fn new(reporting_instance: String) -> Self {
        EventRecorder {
            reporting_instance,
            state: Mutex::new(RecorderState::default()),
            core_v1: AtomicBool::new(false),
        }
    }

    /// Decides what to send for `event` at `now`: `None` when the spam filter drops it.
    fn plan(&self, plugin: &str, event: &WitEvent, now: Instant) -> Option<Send> {
        let r = &event.regarding;
        let namespace = r.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".to_owned());
        let regarding = format!("{}/{}/{}/{}", r.kind.api_version, r.kind.kind, namespace, r.name);
        let mut state = self.state.lock();
        if state.buckets.len() > MAX_TRACKED {
            state.buckets.retain(|_, b| now.duration_since(b.at) < REFILL.mul_f64(BURST));
        }
        let bucket = state.buckets.entry(regarding.clone()).or_insert(Bucket { tokens: BURST, at: now });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() / REFILL.as_secs_f64()).min(BURST);
        bucket.at = now;
        if bucket.tokens < 1.0 {
            return None;
        }
        bucket.tokens -= 1.0;

        let event_type = match event.type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let key = EventKey {
            regarding,
            kind: r.kind.kind.clone(),
            event_type,
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
        };
        if state.seen.len() > MAX_TRACKED {
            state.seen.retain(|_, s| now.duration_since(s.first) < AGGREGATION_WINDOW);
        }
        if let Some(seen) =
            state.seen.get_mut(&key).filter(|s| now.duration_since(s.first) < AGGREGATION_WINDOW)
        {
            seen.count += 1;
            return Some(Send::Series {
                namespace: seen.namespace.clone(),
                name: seen.name.clone(),
                count: seen.count,
            });
        }
        let stamp = jiff_now();
        let name = format!("{}.{:x}", r.name, stamp.as_nanosecond());
        state
            .seen
            .insert(key, Seen { namespace: namespace.clone(), name: name.clone(), count: 1, first: now });
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(stamp)),
            type_: Some(event_type.to_owned()),
            reason: Some(event.reason.clone()),
            action: Some(event.action.clone()),
            note: Some(event.note.clone()),
            reporting_controller: Some(format!("wasmctrl/{plugin}")),
            reporting_instance: Some(self.reporting_instance.clone()),
            regarding: Some(ObjectReference {
                api_version: Some(r.kind.api_version.clone()),
                kind: Some(r.kind.kind.clone()),
                namespace: r.namespace.clone(),
                name: Some(r.name.clone()),
                ..Default::default()
            }),
            ..Default::default()
        };
        Some(Send::Create { namespace, event: Box::new(event) })
    }

    async fn send(kube: Arc<KubeServices>, send: Send) -> Result<(), WitError> {
        if kube.is_revoked() {
            return Err(super::client::revoked_error());
        }
        let core = kube.events.core_v1.load(Ordering::Relaxed);
        let request = match (&send, core) {
            (Send::Create { namespace, event }, false) => {
                let body = serde_json::to_vec(event).map_err(|e| WitError::Invalid(e.to_string()))?;
                kube::core::Request::new(format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events"))
                    .create(&Default::default(), body)
            }
            (Send::Create { namespace, event }, true) => {
                let body = serde_json::to_vec(&to_core(event)).map_err(|e| WitError::Invalid(e.to_string()))?;
                kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/events")).create(&Default::default(), body)
            }
            (Send::Series { namespace, name, count }, false) => {
                let patch = serde_json::json!({"series": EventSeries { count: *count, last_observed_time: MicroTime(jiff_now()) }});
                kube::core::Request::new(format!("/apis/events.k8s.io/v1/namespaces/{namespace}/events"))
                    .patch(name, &Default::default(), &kube::api::Patch::Merge(patch))
            }
            (Send::Series { namespace, name, count }, true) => {
                let patch = serde_json::json!({"count": count, "lastTimestamp": Time(jiff_now())});
                kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/events"))
                    .patch(name, &Default::default(), &kube::api::Patch::Merge(patch))
            }
        }
        .map_err(|e| WitError::Invalid(e.to_string()))?;
        match kube.client.request_text(request).await {
            Err(kube::Error::Api(s)) if s.code == 404 && !core && matches!(send, Send::Create { .. }) => {
                // No events.k8s.io group on this server: fall back to core/v1 for good.
                kube.events.core_v1.store(true, Ordering::Relaxed);
                Box::pin(Self::send(kube, send)).await
            }
            Err(e) => Err(map_kube_error(e)),
            Ok(_) => Ok(()),
        }
    }
}

fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

fn to_core(e: &Event) -> CoreEvent {
    CoreEvent {
        metadata: e.metadata.clone(),
        involved_object: e.regarding.clone().unwrap_or_default(),
        reason: e.reason.clone(),
        message: e.note.clone(),
        type_: e.type_.clone(),
        action: e.action.clone(),
        count: Some(1),
        first_timestamp: e.event_time.as_ref().map(|t| Time(t.0)),
        last_timestamp: e.event_time.as_ref().map(|t| Time(t.0)),
        event_time: e.event_time.clone(),
        reporting_component: e.reporting_controller.clone(),
        reporting_instance: e.reporting_instance.clone(),
        source: Some(EventSource { component: e.reporting_controller.clone(), host: None }),
        ..Default::default()
    }
}

impl Host for HostState {
    fn publish(&mut self, mut event: WitEvent) -> wasmtime::Result<Result<(), WitError>> {
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
        if let Some(log) = self.call_log() {
            log.push_event(super::record::RecordedEvent {
                kind: super::spec::Gvk::new(
                    event.regarding.kind.api_version.clone(),
                    event.regarding.kind.kind.clone(),
                ),
                namespace: event.regarding.namespace.clone(),
                name: event.regarding.name.clone(),
                event_type: match event.type_ {
                    super::bindings::wasmctrl::controller::events::EventType::Normal => "Normal",
                    super::bindings::wasmctrl::controller::events::EventType::Warning => "Warning",
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
        let plugin = self.plugin_name().to_owned();
        let Some(send) = kube.events.plan(&plugin, &event, Instant::now()) else {
            tracing::debug!(plugin, reason = %event.reason, object = %event.regarding.name, "event dropped by the spam filter");
            return Ok(Ok(()));
        };
        let runtime = kube.runtime().clone();
        runtime.spawn(async move {
            if let Err(e) = EventRecorder::send(kube, send).await {
                tracing::warn!(plugin, error = ?e, "recording an event failed");
            }
        });
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::bindings::wasmctrl::controller::types::{Gvk as WitGvk, ObjectRef};

    fn event(note: &str) -> WitEvent {
        WitEvent {
            regarding: ObjectRef {
                kind: WitGvk { api_version: "v1".into(), kind: "Pod".into() },
                namespace: Some("ns".into()),
                name: "p".into(),
            },
            type_: EventType::Warning,
            reason: "Missing".into(),
            action: "Check".into(),
            note: note.into(),
        }
    }

    #[test]
    fn identical_events_aggregate_into_a_series() {
        let r = EventRecorder::new("host".into());
        let t = Instant::now();
        let Some(Send::Create { event: first, .. }) = r.plan("p", &event("a"), t) else {
            panic!("expected create")
        };
        match r.plan("p", &event("a"), t + Duration::from_secs(1)) {
            Some(Send::Series { name, count, .. }) => {
                assert_eq!(Some(name), first.metadata.name);
                assert_eq!(count, 2);
            }
            _ => panic!("expected a series update"),
        }
        assert!(matches!(r.plan("p", &event("b"), t), Some(Send::Create { .. })));
        assert!(matches!(r.plan("p", &event("a"), t + AGGREGATION_WINDOW), Some(Send::Create { .. })));
    }

    #[test]
    fn spam_filter_drops_after_burst_and_refills() {
        let r = EventRecorder::new("host".into());
        let t = Instant::now();
        for i in 0..25 {
            assert!(r.plan("p", &event(&i.to_string()), t).is_some(), "event {i} within the burst");
        }
        assert!(r.plan("p", &event("x"), t).is_none());
        assert!(r.plan("p", &event("y"), t + REFILL).is_some());
    }
}
