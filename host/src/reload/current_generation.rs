//! What a plugin's controller sees of the plugin's current generation. Generations change
//! while the controller runs (a swap wires a new one under the same controller), so the
//! controller reaches them only through the latest one recorded for it:
//!
//! - [`CurrentGenerationSource`], the controller's `for` source: events come from the
//!   plugin's generations (wired by the manager, see `generation`), so this source only
//!   tells the controller when the generation it runs has synced — the latest one, also when
//!   a reload came before the first one synced; once synced, the controller runs on;
//! - [`ForKeys`], for sharding: the current generation's `for` cache, and a wait until its
//!   informers handed their handlers every change the server had made.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use kube::core::GroupVersionKind;
use parking_lot::Mutex;

use super::generation::Generation;
use super::leases::InformerLeases;
use crate::controller::{EventRegistration, EventSource, source::SourceError};
use crate::informer::ResourceEventHandler;

/// The `for` cache of a controller's current generation, for sharding.
pub(super) struct ForKeys {
    pub(super) current: Arc<Mutex<Weak<Generation>>>,
    pub(super) informers: Arc<dyn InformerLeases>,
}

impl crate::shard::KeySource for ForKeys {
    fn keys(&self) -> Vec<String> {
        self.current.lock().upgrade().map(|g| g.for_keys()).unwrap_or_default()
    }

    fn cached(&self, key: &str) -> bool {
        self.current.lock().upgrade().is_some_and(|g| g.for_cached(key))
    }

    fn source(&self) -> Option<crate::config::WatchSource> {
        self.current.lock().upgrade().map(|g| g.config.for_source.clone())
    }

    fn catch_up(&self) -> futures::future::BoxFuture<'static, ()> {
        let generation = self.current.lock().upgrade();
        let informers = self.informers.clone();
        Box::pin(async move {
            if let Some(g) = generation {
                g.catch_up_with_server(&*informers).await;
            }
        })
    }
}

/// The controller's `for` source: events come from the plugin's generations (wired by the
/// manager, so they can change while the controller runs); this source only tells the
/// controller when the generation it runs has synced (the latest one, also when a reload
/// came before the first one synced).
pub(super) struct CurrentGenerationSource {
    pub(super) kind: GroupVersionKind,
    pub(super) namespaced: bool,
    pub(super) current: Arc<Mutex<Weak<Generation>>>,
}

struct CurrentGenerationRegistration {
    current: Arc<Mutex<Weak<Generation>>>,
    /// Latched: once synced, the controller runs on.
    synced: AtomicBool,
}

impl EventSource for CurrentGenerationSource {
    fn gvk(&self) -> GroupVersionKind {
        self.kind.clone()
    }

    fn namespaced(&self) -> bool {
        self.namespaced
    }

    fn register(
        &self,
        _handler: Arc<dyn ResourceEventHandler>,
    ) -> Result<Box<dyn EventRegistration>, SourceError> {
        // The controller's own handler is not needed: generations enqueue into its queue.
        Ok(Box::new(CurrentGenerationRegistration {
            current: self.current.clone(),
            synced: AtomicBool::new(false),
        }))
    }
}

impl EventRegistration for CurrentGenerationRegistration {
    fn has_synced(&self) -> bool {
        if self.synced.load(Ordering::Acquire) {
            return true;
        }
        let current = self.current.lock().upgrade();
        let synced = current.is_some_and(|g| g.has_synced());
        if synced {
            self.synced.store(true, Ordering::Release);
        }
        synced
    }

    fn remove(&self) {}
}
