//! What caused a key's reconcile, carried with the key through the queue (tracing only).
//!
//! Invariants: an origin is only built while tracing is on ([`super::enabled`]), so with
//! tracing off every constructor returns `None` after one atomic load and allocates nothing.

use std::time::SystemTime;

use opentelemetry::trace::SpanContext;

use crate::object::Object;

/// Why a key is in the queue.
#[derive(Clone, Debug)]
pub(crate) enum Cause {
    /// A watch event (as the informer delivered it to the controller).
    Event { event: &'static str, object: String, resource_version: String },
    /// A reconcile asked for another (error, requeue, requeue-after); its span is linked.
    Requeue { link: SpanContext, reason: &'static str },
}

/// What caused a key's reconcile, and when it was queued.
#[derive(Clone, Debug)]
pub struct TraceOrigin {
    pub(crate) cause: Cause,
    /// When the event arrived / the key was queued (wall clock: span timestamps).
    pub(crate) queued_at: SystemTime,
}

impl TraceOrigin {
    /// The origin of a key queued for a watch event (`add`, `update`, `delete`) on `obj`,
    /// when tracing is on.
    #[inline]
    pub fn event(event: &'static str, obj: &Object) -> Option<Box<Self>> {
        if !super::enabled() {
            return None;
        }
        Some(Box::new(TraceOrigin {
            cause: Cause::Event {
                event,
                object: obj.key().to_owned(),
                resource_version: obj.resource_version().to_owned(),
            },
            queued_at: SystemTime::now(),
        }))
    }

    /// The origin of a key a reconcile requeued (`reason`: `error`, `requeue`,
    /// `requeue_after`); `link` is that reconcile's span.
    pub fn requeue(link: Option<&SpanContext>, reason: &'static str) -> Option<Box<Self>> {
        let link = link.filter(|l| l.is_valid())?.clone();
        Some(Box::new(TraceOrigin { cause: Cause::Requeue { link, reason }, queued_at: SystemTime::now() }))
    }
}

#[cfg(test)]
impl TraceOrigin {
    /// An event origin whatever the switch says (queue tests).
    pub(crate) fn for_test(object: &str) -> Box<Self> {
        Box::new(TraceOrigin {
            cause: Cause::Event { event: "update", object: object.to_owned(), resource_version: "1".into() },
            queued_at: SystemTime::now(),
        })
    }

    /// The object of an event origin (queue tests).
    pub(crate) fn object(&self) -> Option<&str> {
        match &self.cause {
            Cause::Event { object, .. } => Some(object),
            Cause::Requeue { .. } => None,
        }
    }
}
