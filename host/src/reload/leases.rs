//! One plugin version's leases on the host's shared informers: which informers its TOML
//! needs ([`WatchKey`]), what the manager needs from the host's informer factory
//! ([`InformerLeases`], [`LeasedInformer`], [`LeasedRegistration`]), and the caches the
//! plugin's reads go to ([`Leases::caches`]).
//!
//! Invariants: informers both generations of a plugin use are never stopped (the factory's
//! leases are reference counted: the next generation's lease is taken before the old one is
//! released); informers with different transforms never share a cache; a plugin reads a
//! kind through the union of its informers of that kind, and each index declared on the
//! kind is built on every one of them.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::union_cache::UnionCache;
use crate::cache::IndexSpec;
use crate::config::{KindLookupError, PluginConfig, ResolvedKind, WatchSource};
use crate::controller::source::EventRegistration;
use crate::fifo::SourceProgress;
use crate::informer::ResourceEventHandler;
use crate::object::Transform;
use crate::plugin::{CacheReader, Gvk};

/// One informer: a kind, the scope it is watched in and what its cache strips (informers
/// with different transforms never share a cache).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WatchKey {
    pub kind: Gvk,
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub transform: Transform,
}

impl WatchKey {
    pub(super) fn of(s: &WatchSource) -> Self {
        WatchKey {
            kind: s.kind.clone(),
            namespace: s.namespace.clone(),
            label_selector: s.label_selector.clone(),
            field_selector: s.field_selector.clone(),
            transform: s.transform,
        }
    }

    /// Whether every object `other` watches is watched by `self` too.
    fn covers(&self, other: &WatchKey) -> bool {
        let within = |mine: &Option<String>, theirs: &Option<String>| mine.is_none() || mine == theirs;
        self.kind == other.kind
            && within(&self.namespace, &other.namespace)
            && within(&self.label_selector, &other.label_selector)
            && within(&self.field_selector, &other.field_selector)
    }
}

impl std::fmt::Display for WatchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(ns) = &self.namespace {
            write!(f, " ns={ns}")?;
        }
        if let Some(l) = &self.label_selector {
            write!(f, " labels={l}")?;
        }
        if let Some(x) = &self.field_selector {
            write!(f, " fields={x}")?;
        }
        if self.transform.strip_last_applied {
            f.write_str(" strip=last-applied")?;
        }
        if !self.transform.strip_managed_fields {
            f.write_str(" keep=managed-fields")?;
        }
        Ok(())
    }
}

/// Shared informers, leased: what the manager needs from the host's informer factory
/// (implemented for [`crate::informer::InformerFactory`] by [`super::FactoryLeases`]).
pub trait InformerLeases: Send + Sync + 'static {
    /// A lease on the informer for `key`, started if it is not running, with `indexes`
    /// added to its cache. The informer stops when its last lease is dropped.
    fn lease<'a>(
        &'a self,
        key: &'a WatchKey,
        indexes: &'a BTreeMap<String, IndexSpec>,
    ) -> BoxFuture<'a, Result<Arc<dyn LeasedInformer>, String>>;
    /// The resourceVersion the server is at now for `key`'s scope (see
    /// [`crate::informer::InformerFactory::current_resource_version`]).
    fn current_resource_version<'a>(&'a self, key: &'a WatchKey) -> BoxFuture<'a, Result<String, String>>;
    /// Discovery: whether the cluster serves `kind`.
    fn resolve<'a>(&'a self, kind: &'a Gvk) -> BoxFuture<'a, Result<ResolvedKind, KindLookupError>>;
    /// Whether the server has the object `namespace/name` of `kind` now (a live GET).
    fn exists<'a>(
        &'a self,
        kind: &'a Gvk,
        namespace: Option<&'a str>,
        name: &'a str,
    ) -> BoxFuture<'a, Result<bool, String>>;
}

/// One lease on a shared informer. Dropping it releases the lease.
pub trait LeasedInformer: Send + Sync + 'static {
    fn namespaced(&self) -> bool;
    /// Whether the informer's cache holds the initial list.
    fn has_synced(&self) -> bool;
    /// Resolves once [`has_synced`](Self::has_synced) holds.
    fn synced(&self) -> BoxFuture<'static, ()>;
    /// Read access for plugins.
    fn cache(&self) -> Arc<dyn CacheReader>;
    /// Keys of every cached object.
    fn keys(&self) -> Vec<String>;
    /// How far the informer's source has got, and how much of it its handlers were sent.
    fn progress(&self) -> SourceProgress;
    /// Changes whenever [`progress`](Self::progress) may have (read it first).
    fn progress_seq(&self) -> u64;
    /// Resolves once [`progress_seq`](Self::progress_seq) is no longer `seq`.
    fn progress_after(&self, seq: u64) -> BoxFuture<'static, ()>;
    /// Removes registrations of this informer at one instant of its stream, each draining
    /// (with a `present`: as [`LeasedRegistration::remove_draining_departed`]); a
    /// notification reaches all of them or none.
    #[allow(clippy::type_complexity)]
    fn remove_handlers(&self, removals: &[(&dyn LeasedRegistration, Option<&dyn Fn(&str) -> bool>)]);
    /// Registers `handler` (it first receives the current contents as initial-list adds).
    fn add_handler(
        &self,
        handler: Arc<dyn ResourceEventHandler>,
        resync: Option<Duration>,
    ) -> Box<dyn LeasedRegistration>;
    /// Replaces `old` (a registration on this informer) with `handler` at one instant of the
    /// stream; with `hand_over`, `old`'s undelivered notifications go first to `handler`,
    /// else `old` delivers them itself and ends. See
    /// [`crate::informer::SharedIndexInformer::replace_event_handler`].
    fn replace_handler(
        &self,
        old: &dyn LeasedRegistration,
        handler: Arc<dyn ResourceEventHandler>,
        resync: Option<Duration>,
        hand_over: bool,
    ) -> Box<dyn LeasedRegistration>;
}

/// A handler registration on a leased informer.
pub trait LeasedRegistration: EventRegistration {
    /// Unregisters the handler after it delivered what it was already sent.
    fn remove_draining(&self);
    /// As [`remove_draining`](Self::remove_draining), after sending the handler a delete for
    /// every object its informer caches at the removal that `present` says is gone (see
    /// [`crate::informer::HandlerRegistration::remove_draining_departed`]).
    fn remove_draining_departed(&self, present: &dyn Fn(&str) -> bool);
    /// Resolves once the handler will be called no more (after any kind of removal).
    fn finished(&self) -> BoxFuture<'static, ()>;
    /// Resolves once the handler has synced (or stopped).
    fn synced(&self) -> BoxFuture<'static, ()>;
    /// For [`LeasedInformer::replace_handler`] to find its own registration type.
    fn as_any(&self) -> &dyn Any;
}

/// The leases a plugin's TOML needs, and the caches its reads go to.
pub struct Leases {
    pub informers: BTreeMap<WatchKey, Arc<dyn LeasedInformer>>,
}

impl Leases {
    /// Takes a lease on the informer of every source and read permission of `config`.
    pub async fn acquire(config: &PluginConfig, provider: &dyn InformerLeases) -> Result<Leases, String> {
        // A plugin reads a kind through the union of its informers of that kind, so each
        // index declared on the kind is built on every one of them.
        let mut kind_indexes: BTreeMap<&Gvk, BTreeMap<String, IndexSpec>> = BTreeMap::new();
        for s in std::iter::once(&config.for_source).chain(&config.owns).chain(&config.watches) {
            let indexes = kind_indexes.entry(&s.kind).or_default();
            for (name, spec) in &s.indexes {
                if let Some(existing) = indexes.get(name)
                    && existing != spec
                {
                    return Err(format!("index `{name}` on {} is declared twice, differently", s.kind));
                }
                indexes.insert(name.clone(), spec.clone());
            }
        }
        let mut wanted: BTreeMap<WatchKey, BTreeMap<String, IndexSpec>> = BTreeMap::new();
        for s in std::iter::once(&config.for_source).chain(&config.owns).chain(&config.watches) {
            wanted.insert(WatchKey::of(s), kind_indexes.get(&s.kind).cloned().unwrap_or_default());
        }
        for kind in &config.read {
            // Extra read kinds are cached where the plugin works: the `for` namespace.
            let covered = wanted.keys().any(|k| {
                &k.kind == kind
                    && k.label_selector.is_none()
                    && k.field_selector.is_none()
                    && (k.namespace.is_none() || k.namespace == config.for_source.namespace)
            });
            if !covered {
                wanted
                    .entry(WatchKey {
                        kind: kind.clone(),
                        namespace: config.for_source.namespace.clone(),
                        label_selector: None,
                        field_selector: None,
                        transform: config.transform,
                    })
                    .or_default();
            }
        }
        let mut informers = BTreeMap::new();
        for (key, indexes) in wanted {
            let lease =
                provider.lease(&key, &indexes).await.map_err(|e| format!("cannot watch {key}: {e}"))?;
            informers.insert(key, lease);
        }
        Ok(Leases { informers })
    }

    pub fn all_synced(&self) -> bool {
        self.informers.values().all(|i| i.has_synced())
    }

    pub(super) fn get(&self, s: &WatchSource) -> Option<&Arc<dyn LeasedInformer>> {
        self.informers.get(&WatchKey::of(s))
    }

    /// One cache per readable kind: everything the plugin declared for that kind. An
    /// informer whose scope another one covers adds nothing and is left out; when several
    /// remain (e.g. `[for]` and `[[watches]]` with different selectors), reads see their union.
    pub fn caches(&self) -> HashMap<Gvk, Arc<dyn CacheReader>> {
        type Members<'a> = Vec<(&'a WatchKey, &'a Arc<dyn LeasedInformer>)>;
        let mut by_kind: BTreeMap<&Gvk, Members<'_>> = BTreeMap::new();
        for (key, inf) in &self.informers {
            by_kind.entry(&key.kind).or_default().push((key, inf));
        }
        by_kind
            .into_iter()
            .map(|(kind, members)| {
                // Keep the informers no other one covers (of two equal scopes, the first).
                let kept: Vec<Arc<dyn CacheReader>> = members
                    .iter()
                    .enumerate()
                    .filter(|(i, (key, _))| {
                        !members.iter().enumerate().any(|(j, (other, _))| {
                            j != *i && other.covers(key) && (!key.covers(other) || j < *i)
                        })
                    })
                    .map(|(_, (_, inf))| inf.cache())
                    .collect();
                let cache: Arc<dyn CacheReader> = match <[_; 1]>::try_from(kept) {
                    Ok([only]) => only,
                    Err(kept) => Arc::new(UnionCache::new(kept)),
                };
                (kind.clone(), cache)
            })
            .collect()
    }

    /// Keys of every cached object of the `for` source.
    pub fn for_keys(&self, config: &PluginConfig) -> Vec<String> {
        self.get(&config.for_source).map(|i| i.keys()).unwrap_or_default()
    }

    pub fn for_namespaced(&self, config: &PluginConfig) -> bool {
        self.get(&config.for_source).is_none_or(|i| i.namespaced())
    }
}
