//! The host-wide Kubernetes event recorder's bookkeeping, in the manner of client-go's
//! `EventRecorder`: what to send for one published event, if anything.
//!
//! Layering: pure bookkeeping, no I/O and no import of the runtime beyond the generated
//! types; [`super::cluster::KubeServices`] holds one recorder for every plugin, and the
//! `events` import sends what [`EventRecorder::plan`] decides.
//!
//! Invariants:
//! - Spam filter: per regarding object a token bucket (burst 25, one token per 5 min,
//!   client-go's `EventSourceObjectSpamFilter` defaults) drops excess events.
//! - Aggregation: an identical event (same object, type, reason, action, note) within
//!   10 minutes bumps the existing event's `series` instead of creating another.
//! - Memory is bounded: past [`MAX_TRACKED`] entries, expired ones are forgotten.
//! - Once the server is found to lack events.k8s.io/v1, core/v1 Events are written for good.
//!
//! Why not `kube::runtime::events::Recorder`: it keys its series by object, type, reason and
//! action but not the note, so two events that differ only in their note (a plugin's
//! "created x" and "created y") would be folded into one series and the second note lost
//! (client-go counts an event as a repeat only when its message matches too); it has no
//! spam filter and no core/v1 fallback for servers without events.k8s.io/v1. Adopting it
//! would change what users see.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use parking_lot::Mutex;

use super::bindings::wasmctrl::controller::events::{Event as WitEvent, EventType};

const BURST: f64 = 25.0;
const REFILL: Duration = Duration::from_secs(300);
const AGGREGATION_WINDOW: Duration = Duration::from_secs(600);
/// events.k8s.io/v1 caps `note` at 1 KiB.
pub(crate) const MAX_NOTE: usize = 1024;
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
pub(crate) enum Planned {
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
    pub fn plan(&self, plugin: &str, event: &WitEvent, now: Instant) -> Option<Planned> {
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
            return Some(Planned::Series {
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
        Some(Planned::Create { namespace, event: Box::new(event) })
    }

    /// Whether Events go out as core/v1 (the server lacks events.k8s.io/v1).
    pub fn uses_core_v1(&self) -> bool {
        self.core_v1.load(Ordering::Relaxed)
    }

    /// Writes core/v1 Events from now on.
    pub fn fall_back_to_core_v1(&self) {
        self.core_v1.store(true, Ordering::Relaxed);
    }
}

pub(crate) fn jiff_now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

pub(crate) fn to_core(e: &Event) -> CoreEvent {
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
        let Some(Planned::Create { event: first, .. }) = r.plan("p", &event("a"), t) else {
            panic!("expected create")
        };
        match r.plan("p", &event("a"), t + Duration::from_secs(1)) {
            Some(Planned::Series { name, count, .. }) => {
                assert_eq!(Some(name), first.metadata.name);
                assert_eq!(count, 2);
            }
            _ => panic!("expected a series update"),
        }
        assert!(matches!(r.plan("p", &event("b"), t), Some(Planned::Create { .. })));
        assert!(matches!(r.plan("p", &event("a"), t + AGGREGATION_WINDOW), Some(Planned::Create { .. })));
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
