//! Shared informers: one watch and one cache per (kind, namespace, selectors), fanned out
//! to any number of handlers, each with its own buffer.
//!
//! - [`SharedIndexInformer`]: reflector → DeltaFIFO → indexer → listeners.
//! - [`InformerFactory`]: hands out reference-counted [`InformerLease`]s so every controller
//!   asking for the same (kind, namespace, selectors) shares one informer; the last lease
//!   released stops it.

use std::sync::Arc;

use crate::object::{DeletedObject, Object};

mod factory;
mod processor;
mod shared;

pub use factory::{FactoryError, FactoryOptions, InformerFactory, InformerLease, InformerSpec};
pub use processor::MINIMUM_RESYNC_PERIOD;
pub use shared::{HandlerRegistration, InformerOptions, SharedIndexInformer};

/// Receives an informer's notifications, in order, on the handler's own listener task.
///
/// Handlers must return quickly (enqueue a key, hand off work): a slow handler delays only
/// its own listener, but it does delay it. A panic is caught, logged, and the notification
/// skipped.
pub trait ResourceEventHandler: Send + Sync + 'static {
    /// A new object. `in_initial_list` is true for objects from the first list, and for the
    /// synthetic adds a handler registered on a running informer receives.
    fn on_add(&self, obj: &Arc<Object>, in_initial_list: bool);
    /// A changed object, or an unchanged one re-delivered by a resync (`old` and `new` then
    /// have the same resourceVersion).
    fn on_update(&self, old: &Arc<Object>, new: &Arc<Object>);
    /// A deleted object, possibly learned late (see [`DeletedObject::FinalStateUnknown`]).
    fn on_delete(&self, obj: &DeletedObject);
}
