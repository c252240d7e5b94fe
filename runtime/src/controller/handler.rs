//! Event handlers that turn notifications into [`Request`]s on a controller's queue
//! (controller-runtime's `handler` package).
//!
//! - [`EnqueueForObject`] (`for` kind): the object's own key.
//! - [`EnqueueForOwner`] (`owns` kinds): the key of the object's *controller* owner reference
//!   when that owner is of the `for` kind (same group and kind; the version may differ). On
//!   update both the old and the new owner are enqueued (a changed owner hears of it); on delete
//!   the owner of the last known state, tombstones included.
//! - [`EnqueueMapped`] (`watches` kinds): the requests a [`Mapper`] returns, for the old and
//!   the new object on update.
//!
//! Every handler applies its source's predicates first. Adds from an initial list, and
//! resyncs (an update with an unchanged resourceVersion), go in with [`Priority::Low`] so live
//! changes overtake a start-up backlog. With tracing on, each key carries the event that
//! queued it ([`TraceOrigin::event`]; `None`, after one atomic load, with tracing off).

use std::sync::Arc;

use kube::core::GroupVersionKind;

use super::predicate::{And, Predicate};
use super::{HotSwap, Request};
use crate::informer::ResourceEventHandler;
use crate::object::{DeletedObject, Object};
use crate::queue::{Priority, RateLimitingQueue};
use crate::telemetry::TraceOrigin;

/// Maps an object of a watched kind to the requests (of the controller's `for` kind) it
/// affects. A Wasm plugin's `map` export implements it. Must be quick: it runs on the
/// informer's listener task.
pub trait Mapper: Send + Sync + 'static {
    fn map(&self, kind: &GroupVersionKind, obj: &Arc<Object>) -> Vec<Request>;
}

impl<F> Mapper for F
where
    F: Fn(&GroupVersionKind, &Arc<Object>) -> Vec<Request> + Send + Sync + 'static,
{
    fn map(&self, kind: &GroupVersionKind, obj: &Arc<Object>) -> Vec<Request> {
        self(kind, obj)
    }
}

/// The request naming `obj` itself.
pub fn request_for(obj: &Object) -> Request {
    Request { namespace: obj.namespace().map(str::to_owned), name: obj.name().to_owned() }
}

fn update_priority(old: &Object, new: &Object) -> Priority {
    if old.resource_version() == new.resource_version() { Priority::Low } else { Priority::Normal }
}

fn add_priority(in_initial_list: bool) -> Priority {
    if in_initial_list { Priority::Low } else { Priority::Normal }
}

/// Enqueues the object's own key (the `for` kind).
pub struct EnqueueForObject {
    queue: RateLimitingQueue<Request>,
    predicates: And,
}

impl EnqueueForObject {
    pub fn new(queue: RateLimitingQueue<Request>, predicates: Vec<Arc<dyn Predicate>>) -> Self {
        EnqueueForObject { queue, predicates: And(predicates) }
    }
}

impl ResourceEventHandler for EnqueueForObject {
    fn on_add(&self, obj: &Arc<Object>, in_initial_list: bool) {
        if self.predicates.create(obj) {
            let origin = TraceOrigin::event("add", obj);
            self.queue.add_traced(request_for(obj), add_priority(in_initial_list), origin);
        }
    }

    fn on_update(&self, old: &Arc<Object>, new: &Arc<Object>) {
        if self.predicates.update(old, new) {
            let origin = TraceOrigin::event("update", new);
            self.queue.add_traced(request_for(new), update_priority(old, new), origin);
        }
    }

    fn on_delete(&self, obj: &DeletedObject) {
        if self.predicates.delete(obj) {
            let origin = TraceOrigin::event("delete", obj.object());
            self.queue.add_traced(Request::from_key(obj.key()), Priority::Normal, origin);
        }
    }
}

/// Enqueues the controller owner of an owned object, if that owner is of the `for` kind.
pub struct EnqueueForOwner {
    queue: RateLimitingQueue<Request>,
    predicates: And,
    owner_group: String,
    owner_kind: String,
    owner_namespaced: bool,
}

impl EnqueueForOwner {
    /// `owner` is the controller's `for` kind; `owner_namespaced` says whether the owner's
    /// request carries the owned object's namespace (owners of a namespaced object are either
    /// in its namespace or cluster-scoped).
    pub fn new(
        queue: RateLimitingQueue<Request>,
        predicates: Vec<Arc<dyn Predicate>>,
        owner: &GroupVersionKind,
        owner_namespaced: bool,
    ) -> Self {
        EnqueueForOwner {
            queue,
            predicates: And(predicates),
            owner_group: owner.group.clone(),
            owner_kind: owner.kind.clone(),
            owner_namespaced,
        }
    }

    /// The owner request of `obj`, if its controller is of the owner kind.
    pub fn owner_request(&self, obj: &Object) -> Option<Request> {
        let owner = obj.controller_owner()?;
        let group = owner.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        if group != self.owner_group || *owner.kind != *self.owner_kind {
            return None;
        }
        let namespace = if self.owner_namespaced { obj.namespace().map(str::to_owned) } else { None };
        Some(Request { namespace, name: owner.name.to_string() })
    }

    fn enqueue(&self, obj: &Object, priority: Priority, event: &'static str) {
        if let Some(r) = self.owner_request(obj) {
            self.queue.add_traced(r, priority, TraceOrigin::event(event, obj));
        }
    }
}

impl ResourceEventHandler for EnqueueForOwner {
    fn on_add(&self, obj: &Arc<Object>, in_initial_list: bool) {
        if self.predicates.create(obj) {
            self.enqueue(obj, add_priority(in_initial_list), "add");
        }
    }

    fn on_update(&self, old: &Arc<Object>, new: &Arc<Object>) {
        if !self.predicates.update(old, new) {
            return;
        }
        let priority = update_priority(old, new);
        let (a, b) = (self.owner_request(old), self.owner_request(new));
        if a != b
            && let Some(a) = a
        {
            self.queue.add_traced(a, priority, TraceOrigin::event("update", new));
        }
        if let Some(b) = b {
            self.queue.add_traced(b, priority, TraceOrigin::event("update", new));
        }
    }

    fn on_delete(&self, obj: &DeletedObject) {
        if self.predicates.delete(obj) {
            self.enqueue(obj.object(), Priority::Normal, "delete");
        }
    }
}

/// Enqueues the requests a [`Mapper`] returns for objects of a watched kind.
pub struct EnqueueMapped {
    queue: RateLimitingQueue<Request>,
    predicates: And,
    kind: GroupVersionKind,
    mapper: HotSwap<dyn Mapper>,
}

impl EnqueueMapped {
    pub fn new(
        queue: RateLimitingQueue<Request>,
        predicates: Vec<Arc<dyn Predicate>>,
        kind: GroupVersionKind,
        mapper: HotSwap<dyn Mapper>,
    ) -> Self {
        EnqueueMapped { queue, predicates: And(predicates), kind, mapper }
    }

    fn enqueue(&self, mapper: &dyn Mapper, obj: &Arc<Object>, priority: Priority, event: &'static str) {
        for r in mapper.map(&self.kind, obj) {
            self.queue.add_traced(r, priority, TraceOrigin::event(event, obj));
        }
    }
}

impl ResourceEventHandler for EnqueueMapped {
    fn on_add(&self, obj: &Arc<Object>, in_initial_list: bool) {
        if self.predicates.create(obj) {
            self.enqueue(&*self.mapper.load(), obj, add_priority(in_initial_list), "add");
        }
    }

    fn on_update(&self, old: &Arc<Object>, new: &Arc<Object>) {
        if !self.predicates.update(old, new) {
            return;
        }
        // One mapper for both calls, even if a swap happens in between.
        let mapper = self.mapper.load();
        let priority = update_priority(old, new);
        self.enqueue(&*mapper, old, priority, "update");
        self.enqueue(&*mapper, new, priority, "update");
    }

    fn on_delete(&self, obj: &DeletedObject) {
        if self.predicates.delete(obj) {
            self.enqueue(&*self.mapper.load(), obj.object(), Priority::Normal, "delete");
        }
    }
}
