//! Event sources: where a controller's handlers get their notifications from.
//!
//! An [`EventSource`] is a kind plus the ability to register a
//! [`ResourceEventHandler`]; the returned [`EventRegistration`] says when that handler has
//! seen the source's initial state (`has_synced`) and removes it again. Shared informers are
//! the production source; [`ManualSource`] delivers events pushed by code (controller-runtime's
//! `source.Channel`: external triggers, tests, benchmarks). [`InformerSource`] adapts a
//! leased shared informer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kube::core::GroupVersionKind;
use parking_lot::RwLock;

use crate::informer::{
    FactoryError, HandlerRegistration, InformerFactory, InformerLease, InformerSpec, ResourceEventHandler,
};
use crate::object::{DeletedObject, Object};

/// Why a handler could not be attached to a source.
#[derive(Debug, thiserror::Error)]
#[error("cannot watch {kind}: {reason}")]
pub struct SourceError {
    /// `apiVersion/kind` of the source.
    pub kind: String,
    pub reason: String,
}

/// A stream of notifications about one kind of object.
pub trait EventSource: Send + Sync + 'static {
    /// The kind of the objects this source reports.
    fn gvk(&self) -> GroupVersionKind;
    /// Whether objects of this kind live in namespaces.
    fn namespaced(&self) -> bool;
    /// Starts delivering notifications to `handler` (beginning with the current state, as
    /// initial-list adds) until the registration is removed.
    fn register(
        &self,
        handler: Arc<dyn ResourceEventHandler>,
    ) -> Result<Box<dyn EventRegistration>, SourceError>;
}

/// One handler attached to an [`EventSource`].
pub trait EventRegistration: Send + Sync {
    /// Whether the handler has received the source's initial state.
    fn has_synced(&self) -> bool;
    /// Stops delivery to the handler. Idempotent.
    fn remove(&self);
}

/// `apiVersion/Kind` for messages.
pub(crate) fn describe(gvk: &GroupVersionKind) -> String {
    format!("{}/{}", gvk.api_version(), gvk.kind)
}

/// A shared informer as a source: holds a lease on it (keeping it running) and registers
/// handlers with the lease's resync period.
pub struct InformerSource {
    lease: InformerLease,
    gvk: GroupVersionKind,
    namespaced: bool,
}

impl std::fmt::Debug for InformerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InformerSource").field("gvk", &self.gvk).field("lease", &self.lease).finish()
    }
}

impl InformerSource {
    /// Leases the informer for `spec` from `factory` (starting it if needed) and learns
    /// from discovery whether the kind is namespaced.
    pub async fn new(factory: &InformerFactory, spec: InformerSpec) -> Result<Arc<Self>, FactoryError> {
        let resource = factory.discovery().resolve(&spec.gvk.api_version(), &spec.gvk.kind).await?;
        let gvk = spec.gvk.clone();
        let lease = factory.informer(spec).await?;
        Ok(Arc::new(InformerSource { lease, gvk, namespaced: resource.namespaced }))
    }

    /// The informer lease (for cache reads through its indexer).
    pub fn lease(&self) -> &InformerLease {
        &self.lease
    }
}

impl EventSource for InformerSource {
    fn gvk(&self) -> GroupVersionKind {
        self.gvk.clone()
    }

    fn namespaced(&self) -> bool {
        self.namespaced
    }

    fn register(
        &self,
        handler: Arc<dyn ResourceEventHandler>,
    ) -> Result<Box<dyn EventRegistration>, SourceError> {
        if self.lease.is_stopped() {
            return Err(SourceError { kind: describe(&self.gvk), reason: "the informer was stopped".into() });
        }
        Ok(Box::new(InformerRegistration(self.lease.add_handler(handler))))
    }
}

struct InformerRegistration(HandlerRegistration);

impl EventRegistration for InformerRegistration {
    fn has_synced(&self) -> bool {
        self.0.has_synced()
    }

    fn remove(&self) {
        self.0.remove();
    }
}

/// Registered handlers of a [`ManualSource`], by registration id.
type HandlerList = Arc<RwLock<Vec<(u64, Arc<dyn ResourceEventHandler>)>>>;

/// A source fed by code: every `add`/`update`/`delete` is delivered synchronously, on the
/// caller's thread, to every registered handler. It is synced once [`ManualSource::set_synced`]
/// says so (initially true).
pub struct ManualSource {
    gvk: GroupVersionKind,
    namespaced: bool,
    synced: Arc<AtomicBool>,
    next_id: AtomicU64,
    handlers: HandlerList,
}

impl std::fmt::Debug for ManualSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualSource")
            .field("gvk", &self.gvk)
            .field("handlers", &self.handlers.read().len())
            .finish()
    }
}

impl ManualSource {
    /// A source for objects of `gvk`, synced from the start.
    pub fn new(gvk: GroupVersionKind, namespaced: bool) -> Arc<Self> {
        Arc::new(ManualSource {
            gvk,
            namespaced,
            synced: Arc::new(AtomicBool::new(true)),
            next_id: AtomicU64::new(0),
            handlers: Arc::new(RwLock::new(Vec::new())),
        })
    }

    /// Sets whether registrations report `has_synced`.
    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Release);
    }

    /// Number of registered handlers.
    pub fn handler_count(&self) -> usize {
        self.handlers.read().len()
    }

    fn each(&self, f: impl Fn(&dyn ResourceEventHandler)) {
        // Clone the list so a handler may (un)register without deadlocking.
        let handlers: Vec<_> = self.handlers.read().iter().map(|(_, h)| h.clone()).collect();
        for h in handlers {
            f(&*h);
        }
    }

    /// Delivers an add.
    pub fn add(&self, obj: &Arc<Object>, in_initial_list: bool) {
        self.each(|h| h.on_add(obj, in_initial_list));
    }

    /// Delivers an update.
    pub fn update(&self, old: &Arc<Object>, new: &Arc<Object>) {
        self.each(|h| h.on_update(old, new));
    }

    /// Delivers a delete.
    pub fn delete(&self, obj: &DeletedObject) {
        self.each(|h| h.on_delete(obj));
    }
}

impl EventSource for ManualSource {
    fn gvk(&self) -> GroupVersionKind {
        self.gvk.clone()
    }

    fn namespaced(&self) -> bool {
        self.namespaced
    }

    fn register(
        &self,
        handler: Arc<dyn ResourceEventHandler>,
    ) -> Result<Box<dyn EventRegistration>, SourceError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.handlers.write().push((id, handler));
        Ok(Box::new(ManualRegistration { id, synced: self.synced.clone(), handlers: self.handlers.clone() }))
    }
}

struct ManualRegistration {
    id: u64,
    synced: Arc<AtomicBool>,
    handlers: HandlerList,
}

impl EventRegistration for ManualRegistration {
    fn has_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn remove(&self) {
        self.handlers.write().retain(|(id, _)| *id != self.id);
    }
}
