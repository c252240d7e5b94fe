//! The host's [`InformerFactory`] as the manager's [`InformerLeases`], and its discovery
//! as a [`KindResolver`]-like lookup.
//!
//! Thin adapters only (newtypes, so they never collide with impls other modules add):
//! leases, handler registrations as the controller's [`EventRegistration`]. An informer's
//! read handle is the runtime's [`CacheReader`] as it is (the plugin module implements it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::leases::{InformerLeases, LeasedInformer, LeasedRegistration, WatchKey};
use crate::cache::IndexSpec;
use crate::config::{KindLookupError, ResolvedKind};
use crate::controller::source::EventRegistration;
use crate::informer::HandlerRegistration;
use crate::informer::{InformerFactory, InformerLease, InformerSpec, ResourceEventHandler};
use crate::plugin::{CacheReader, Gvk};
use crate::source::DiscoveryError;

/// An [`InformerFactory`] seen by the plugins manager.
#[derive(Clone, Debug)]
pub struct FactoryLeases(pub InformerFactory);

struct Lease {
    lease: InformerLease,
    namespaced: bool,
}

impl InformerLeases for FactoryLeases {
    fn lease<'a>(
        &'a self,
        key: &'a WatchKey,
        indexes: &'a BTreeMap<String, IndexSpec>,
    ) -> BoxFuture<'a, Result<Arc<dyn LeasedInformer>, String>> {
        Box::pin(async move {
            let resource = self
                .0
                .discovery()
                .resolve(&key.kind.api_version, &key.kind.kind)
                .await
                .map_err(|e| e.to_string())?;
            let mut spec = InformerSpec::new(&key.kind.api_version, &key.kind.kind);
            spec.namespace = key.namespace.clone();
            spec.label_selector = key.label_selector.clone();
            spec.field_selector = key.field_selector.clone();
            spec.transform = Some(key.transform);
            spec.indexes = indexes.clone();
            let lease = self.0.informer(spec).await.map_err(|e| e.to_string())?;
            Ok(Arc::new(Lease { lease, namespaced: resource.namespaced }) as Arc<dyn LeasedInformer>)
        })
    }

    fn current_resource_version<'a>(&'a self, key: &'a WatchKey) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let mut spec = InformerSpec::new(&key.kind.api_version, &key.kind.kind);
            spec.namespace = key.namespace.clone();
            spec.label_selector = key.label_selector.clone();
            spec.field_selector = key.field_selector.clone();
            self.0.current_resource_version(&spec).await.map_err(|e| e.to_string())
        })
    }

    fn resolve<'a>(&'a self, kind: &'a Gvk) -> BoxFuture<'a, Result<ResolvedKind, KindLookupError>> {
        Box::pin(async move {
            match self.0.discovery().resolve(&kind.api_version, &kind.kind).await {
                Ok(r) => Ok(ResolvedKind { plural: r.plural, namespaced: r.namespaced }),
                Err(DiscoveryError::UnknownKind { known, .. }) => {
                    Err(KindLookupError::UnknownKind { known_kinds: known })
                }
                Err(DiscoveryError::UnknownApiVersion { .. }) => {
                    Err(KindLookupError::UnknownApiVersion { known_versions: Vec::new() })
                }
                Err(e) => Err(KindLookupError::Unavailable(e.to_string())),
            }
        })
    }

    fn exists<'a>(
        &'a self,
        kind: &'a Gvk,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(self.get_live(kind, namespace, name))
    }
}

impl FactoryLeases {
    async fn get_live(&self, kind: &Gvk, namespace: Option<&str>, name: &str) -> Result<bool, String> {
        let resource =
            self.0.discovery().resolve(&kind.api_version, &kind.kind).await.map_err(|e| e.to_string())?;
        let path = format!("{}/{name}", resource.collection_path(namespace.filter(|_| resource.namespaced)));
        let request = http::Request::get(path).body(Vec::new()).map_err(|e| e.to_string())?;
        match self.0.client().request_text(request).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl LeasedInformer for Lease {
    fn namespaced(&self) -> bool {
        self.namespaced
    }

    fn has_synced(&self) -> bool {
        self.lease.has_synced()
    }

    fn synced(&self) -> BoxFuture<'static, ()> {
        let mut synced = self.lease.fifo().synced();
        Box::pin(async move {
            let _ = synced.wait_for(|v| *v).await;
        })
    }

    fn cache(&self) -> Arc<dyn CacheReader> {
        Arc::new(self.lease.indexer())
    }

    fn keys(&self) -> Vec<String> {
        self.lease.indexer().keys()
    }

    fn progress(&self) -> crate::fifo::SourceProgress {
        self.lease.fifo().progress()
    }

    fn progress_seq(&self) -> u64 {
        self.lease.fifo().progress_seq()
    }

    fn progress_after(&self, seq: u64) -> BoxFuture<'static, ()> {
        let fifo = self.lease.fifo().clone();
        Box::pin(async move { fifo.progress_after(seq).await })
    }

    #[allow(clippy::type_complexity)]
    fn remove_handlers(&self, removals: &[(&dyn LeasedRegistration, Option<&dyn Fn(&str) -> bool>)]) {
        let mut ours = Vec::with_capacity(removals.len());
        for (r, present) in removals {
            match r.as_any().downcast_ref::<Registration>() {
                Some(Registration(registration)) => ours.push((registration, *present)),
                // Not ours (cannot happen with one provider): on its own.
                None => match present {
                    Some(present) => r.remove_draining_departed(present),
                    None => r.remove_draining(),
                },
            }
        }
        self.lease.remove_handlers_draining(&ours);
    }

    fn add_handler(
        &self,
        handler: Arc<dyn ResourceEventHandler>,
        resync: Option<Duration>,
    ) -> Box<dyn LeasedRegistration> {
        Box::new(Registration(self.lease.add_event_handler(handler, resync)))
    }

    fn replace_handler(
        &self,
        old: &dyn LeasedRegistration,
        handler: Arc<dyn ResourceEventHandler>,
        resync: Option<Duration>,
        hand_over: bool,
    ) -> Box<dyn LeasedRegistration> {
        match old.as_any().downcast_ref::<Registration>() {
            Some(Registration(old)) => {
                Box::new(Registration(self.lease.replace_event_handler(old, handler, resync, hand_over)))
            }
            // Not ours (cannot happen with one provider): add, and let `old` drain.
            None => {
                old.remove_draining();
                self.add_handler(handler, resync)
            }
        }
    }
}

/// A handler registration as the controller's [`EventRegistration`].
struct Registration(HandlerRegistration);

impl EventRegistration for Registration {
    fn has_synced(&self) -> bool {
        self.0.has_synced()
    }

    fn remove(&self) {
        self.0.remove();
    }
}

impl LeasedRegistration for Registration {
    fn remove_draining(&self) {
        self.0.remove_draining();
    }

    fn remove_draining_departed(&self, present: &dyn Fn(&str) -> bool) {
        self.0.remove_draining_departed(present);
    }

    fn finished(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.0.finished())
    }

    fn synced(&self) -> BoxFuture<'static, ()> {
        Box::pin(self.0.synced())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
