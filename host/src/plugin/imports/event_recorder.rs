//! The host-wide Kubernetes event recorder's bookkeeping, in the manner of client-go's
//! `EventRecorder`: what to send for one published event, if anything.
//!
//! Layering: pure bookkeeping, no I/O and no import of the runtime beyond the generated
//! types; [`super::cluster::KubeServices`] holds one recorder for every plugin, and the
//! `events` import sends what [`EventRecorder::plan`] decides through the recorder's
//! bounded [`Outbox`].
//!
//! Invariants:
//! - Per plugin, a token bucket ([`PLUGIN_BURST`], refilled at [`PLUGIN_PER_SECOND`]) bounds
//!   how many Events it gets sent, whatever objects they name: one plugin cannot flood the
//!   API server, nor use up another's budget.
//! - Spam filter: per plugin and regarding object a token bucket (burst 25, one token per
//!   5 min, client-go's `EventSourceObjectSpamFilter` defaults; client-go keys it by source
//!   and object, so one plugin's events about an object never drop another plugin's).
//! - Aggregation: an identical event (same plugin, object, type, reason, action, note)
//!   within 10 minutes bumps the existing event's `series` instead of creating another.
//! - Memory is bounded whatever names a guest makes up: every map is an LRU cache of at most
//!   [`MAX_TRACKED`] entries (client-go's correlator caches hold 4096), and every key is
//!   made of fields the `events` import has capped in length; the [`Outbox`] holds at most
//!   [`OUTBOX`] events waiting to be sent.
//! - Event names are valid DNS subdomains: `<regarding name>.<hex nanoseconds>` as client-go
//!   makes them, the regarding name lowercased and cut to fit when it is not one already.
//! - Once the server is found to lack events.k8s.io/v1, core/v1 Events are written for good.
//!
//! Why not `kube::runtime::events::Recorder`: it keys its series by object, type, reason and
//! action but not the note, so two events that differ only in their note (a plugin's
//! "created x" and "created y") would be folded into one series and the second note lost
//! (client-go counts an event as a repeat only when its message matches too); it has no
//! spam filter and no core/v1 fallback for servers without events.k8s.io/v1. Adopting it
//! would change what users see.

use std::num::NonZeroUsize;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use lru::LruCache;
use parking_lot::Mutex;

use crate::plugin::bindings::wasmctrl::controller::events::{Event as WitEvent, EventType};

const BURST: f64 = 25.0;
const REFILL: Duration = Duration::from_secs(300);
const AGGREGATION_WINDOW: Duration = Duration::from_secs(600);
/// events.k8s.io/v1 caps `note` at 1 KiB.
pub(crate) const MAX_NOTE: usize = 1024;
/// events.k8s.io/v1 caps `reason` and `action` at 128 characters.
pub(crate) const MAX_REASON: usize = 128;
/// Entries of each of the recorder's caches.
pub(crate) const MAX_TRACKED: usize = 4096;
/// Events one plugin may have sent in a burst.
pub(crate) const PLUGIN_BURST: f64 = 100.0;
/// Events per second one plugin may have sent, sustained.
pub(crate) const PLUGIN_PER_SECOND: f64 = 10.0;
/// Events waiting to be sent, every plugin together.
pub(crate) const OUTBOX: usize = 1024;
/// Longest event name (a DNS subdomain).
const MAX_NAME: usize = 253;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct EventKey {
    plugin: String,
    regarding: String,
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

/// A token bucket: `burst` tokens, refilled at `per_second`.
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Self {
        Bucket { tokens: burst, at: now }
    }

    /// Refills for the time since the last look, then takes a token if there is one.
    fn take(&mut self, now: Instant, burst: f64, per_second: f64) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(burst);
        self.at = self.at.max(now);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

struct RecorderState {
    seen: LruCache<EventKey, Seen>,
    /// Spam filter, by plugin and regarding object.
    objects: LruCache<(String, String), Bucket>,
    /// Rate limit, by plugin.
    plugins: LruCache<String, Bucket>,
}

/// What to send for one `publish`.
pub(crate) enum Planned {
    Create { namespace: String, event: Box<Event> },
    Series { namespace: String, name: String, count: i32 },
}

/// Why a `publish` sends nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// The plugin's own budget is spent.
    RateLimit,
    /// Too many events about one object.
    SpamFilter,
}

impl Dropped {
    /// The `reason` label of `wasmctrl_plugin_events_dropped`.
    pub fn reason(self) -> &'static str {
        match self {
            Dropped::RateLimit => "rate-limit",
            Dropped::SpamFilter => "spam-filter",
        }
    }
}

/// One event waiting to be sent.
pub(crate) struct Outgoing {
    pub plugin: String,
    pub planned: Planned,
}

/// The bounded queue of events waiting to be sent: one sender task drains it (started by
/// the `events` import on first use), so a publish never spawns a task of its own.
#[derive(Default)]
pub(crate) struct Outbox {
    tx: OnceLock<tokio::sync::mpsc::Sender<Outgoing>>,
}

impl Outbox {
    /// The queue's sender; `start` makes the queue (and its consumer) on first use.
    pub fn sender(
        &self,
        start: impl FnOnce() -> tokio::sync::mpsc::Sender<Outgoing>,
    ) -> &tokio::sync::mpsc::Sender<Outgoing> {
        self.tx.get_or_init(start)
    }
}

/// Records plugin events with rate limits, spam filtering and aggregation.
pub(crate) struct EventRecorder {
    reporting_instance: String,
    state: Mutex<RecorderState>,
    core_v1: AtomicBool,
    pub outbox: Outbox,
}

/// `name` as the first part of an event name: a DNS subdomain of at most `max` bytes. A
/// name that is one already (every object name of most kinds) is kept as it is.
fn event_name_part(name: &str, max: usize) -> String {
    let labels: Vec<String> = name
        .to_ascii_lowercase()
        .split('.')
        .map(|label| {
            let mapped: String =
                label.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
            mapped.trim_matches('-').to_owned()
        })
        .filter(|l| !l.is_empty())
        .collect();
    let mut out = labels.join(".");
    if out.len() > max {
        out.truncate(max);
        let trimmed = out.trim_end_matches(['-', '.']).len();
        out.truncate(trimmed);
    }
    if out.is_empty() { "event".to_owned() } else { out }
}

impl EventRecorder {
    pub fn new(reporting_instance: String) -> Self {
        let cap = NonZeroUsize::new(MAX_TRACKED).unwrap_or(NonZeroUsize::MIN);
        EventRecorder {
            reporting_instance,
            state: Mutex::new(RecorderState {
                seen: LruCache::new(cap),
                objects: LruCache::new(cap),
                plugins: LruCache::new(cap),
            }),
            core_v1: AtomicBool::new(false),
            outbox: Outbox::default(),
        }
    }

    /// Decides what to send for `event` (already validated by the `events` import) at `now`.
    pub fn plan(&self, plugin: &str, event: &WitEvent, now: Instant) -> Result<Planned, Dropped> {
        let r = &event.regarding;
        let namespace = r.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".to_owned());
        let regarding = format!("{}/{}/{}/{}", r.kind.api_version, r.kind.kind, namespace, r.name);
        let mut state = self.state.lock();
        let budget = state.plugins.get_or_insert_mut(plugin.to_owned(), || Bucket::full(PLUGIN_BURST, now));
        if !budget.take(now, PLUGIN_BURST, PLUGIN_PER_SECOND) {
            return Err(Dropped::RateLimit);
        }
        let spam = state
            .objects
            .get_or_insert_mut((plugin.to_owned(), regarding.clone()), || Bucket::full(BURST, now));
        if !spam.take(now, BURST, 1.0 / REFILL.as_secs_f64()) {
            return Err(Dropped::SpamFilter);
        }

        let event_type = match event.type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let key = EventKey {
            plugin: plugin.to_owned(),
            regarding,
            event_type,
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
        };
        if let Some(seen) =
            state.seen.get_mut(&key).filter(|s| now.saturating_duration_since(s.first) < AGGREGATION_WINDOW)
        {
            seen.count += 1;
            return Ok(Planned::Series {
                namespace: seen.namespace.clone(),
                name: seen.name.clone(),
                count: seen.count,
            });
        }
        let stamp = jiff_now();
        let suffix = format!(".{:x}", stamp.as_nanosecond());
        let name = format!("{}{suffix}", event_name_part(&r.name, MAX_NAME - suffix.len()));
        state.seen.put(key, Seen { namespace: namespace.clone(), name: name.clone(), count: 1, first: now });
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
        Ok(Planned::Create { namespace, event: Box::new(event) })
    }

    /// Entries in the recorder's caches (aggregation, spam filter, plugin budgets).
    #[cfg(test)]
    fn tracked(&self) -> (usize, usize, usize) {
        let s = self.state.lock();
        (s.seen.len(), s.objects.len(), s.plugins.len())
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

    fn about(name: &str, note: &str) -> WitEvent {
        WitEvent {
            regarding: ObjectRef {
                kind: WitGvk { api_version: "v1".into(), kind: "Pod".into() },
                namespace: Some("ns".into()),
                name: name.into(),
            },
            type_: EventType::Warning,
            reason: "Missing".into(),
            action: "Check".into(),
            note: note.into(),
        }
    }

    fn event(note: &str) -> WitEvent {
        about("p", note)
    }

    #[test]
    fn identical_events_aggregate_into_a_series() {
        let r = EventRecorder::new("host".into());
        let t = Instant::now();
        let Ok(Planned::Create { event: first, .. }) = r.plan("p", &event("a"), t) else {
            panic!("expected create")
        };
        match r.plan("p", &event("a"), t + Duration::from_secs(1)) {
            Ok(Planned::Series { name, count, .. }) => {
                assert_eq!(Some(name), first.metadata.name);
                assert_eq!(count, 2);
            }
            _ => panic!("expected a series update"),
        }
        assert!(matches!(r.plan("p", &event("b"), t), Ok(Planned::Create { .. })));
        assert!(matches!(r.plan("p", &event("a"), t + AGGREGATION_WINDOW), Ok(Planned::Create { .. })));
        // Another plugin's identical event is its own.
        assert!(matches!(r.plan("q", &event("a"), t), Ok(Planned::Create { .. })));
    }

    #[test]
    fn spam_filter_drops_after_burst_and_refills() {
        let r = EventRecorder::new("host".into());
        let t = Instant::now();
        for i in 0..25 {
            assert!(r.plan("p", &event(&i.to_string()), t).is_ok(), "event {i} within the burst");
        }
        assert_eq!(r.plan("p", &event("x"), t).err(), Some(Dropped::SpamFilter));
        // Another plugin's events about the same object are not dropped.
        assert!(r.plan("q", &event("x"), t).is_ok());
        assert!(r.plan("p", &event("y"), t + REFILL).is_ok());
    }

    #[test]
    fn each_plugin_has_a_budget_of_its_own() {
        let r = EventRecorder::new("host".into());
        let t = Instant::now();
        let burst = PLUGIN_BURST as usize;
        for i in 0..burst {
            assert!(r.plan("spam", &about(&format!("o{i}"), "x"), t).is_ok(), "event {i} within the burst");
        }
        assert_eq!(r.plan("spam", &about("more", "x"), t).err(), Some(Dropped::RateLimit));
        assert!(r.plan("quiet", &about("more", "x"), t).is_ok(), "another plugin is not affected");
        // A second later the budget has refilled by the sustained rate.
        let later = t + Duration::from_secs(1);
        for i in 0..PLUGIN_PER_SECOND as usize {
            assert!(r.plan("spam", &about(&format!("later{i}"), "x"), later).is_ok());
        }
        assert_eq!(r.plan("spam", &about("again", "x"), later).err(), Some(Dropped::RateLimit));
    }

    #[test]
    fn made_up_names_do_not_grow_the_recorder_past_its_bound() {
        let r = EventRecorder::new("host".into());
        let t = Instant::now();
        // Many plugins' worth of distinct objects, each time within its budget.
        for i in 0..3 * MAX_TRACKED {
            let _ = r.plan(
                &format!("p{}", i % 50),
                &about(&format!("o{i}"), &i.to_string()),
                t + Duration::from_secs(i as u64),
            );
        }
        let (seen, objects, plugins) = r.tracked();
        assert!(
            seen <= MAX_TRACKED && objects <= MAX_TRACKED && plugins <= MAX_TRACKED,
            "{seen} {objects} {plugins}"
        );
        assert_eq!(seen, MAX_TRACKED);
    }

    #[test]
    fn event_names_are_dns_subdomains() {
        assert_eq!(event_name_part("web-1", 100), "web-1");
        assert_eq!(event_name_part("a.b.c", 100), "a.b.c");
        assert_eq!(event_name_part("system:Controller", 100), "system-controller");
        assert_eq!(event_name_part("..--x--..", 100), "x");
        assert_eq!(event_name_part(":", 100), "event");
        assert_eq!(event_name_part(&"a".repeat(300), 236).len(), 236);
        assert_eq!(event_name_part(&format!("{}-b", "a".repeat(9)), 10), "aaaaaaaaa");
        let r = EventRecorder::new("host".into());
        let Ok(Planned::Create { event, .. }) = r.plan("p", &about(&"n".repeat(253), "x"), Instant::now())
        else {
            panic!("expected create")
        };
        assert!(event.metadata.name.unwrap_or_default().len() <= MAX_NAME);
    }
}
