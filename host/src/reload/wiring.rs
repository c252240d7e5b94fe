//! How one version of a plugin is wired to the informers: leases on every informer its
//! TOML needs, and the handlers that turn notifications into requests on its controller's
//! queue (or into calls of its `on-*` hooks).
//!
//! A [`Generation`] is one (TOML, `.wasm`) pair made live. Hot reload builds the next
//! generation beside the running one and then drops the old one, so:
//! - informers both generations use are never stopped (the factory's leases are reference
//!   counted: the new lease is taken before the old one is released);
//! - the new generation's handlers start with the informers' current contents (synthetic
//!   adds), so every existing object of the `for` kind is enqueued once more and reconciled
//!   by the new version, and a change that lands during the overlap is enqueued by at least
//!   one of the two generations (the queue merges duplicates);
//! - handlers that enqueue into the controller's queue do not depend on the version (they
//!   reach `map` / `filter` through the plugin's [`PluginSlot`]), so a handler the next
//!   generation needs unchanged is carried over instead of registered again: a notification
//!   still buffered in it is delivered, not dropped with the old registration;
//! - dropping a generation removes its remaining handlers before its leases go.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::core::GroupVersionKind;

use crate::cache::{IndexSpec, LabelSelector};
use crate::config::{KindLookupError, PluginConfig, Predicates, ResolvedKind, WatchSource};
use crate::controller::handler::{EnqueueForObject, EnqueueForOwner, EnqueueMapped, Mapper};
use crate::controller::predicate::{
    AnnotationPresent, AnnotationsChanged, Filter, FilterEvent, FilterPredicate, GenerationChanged,
    LabelSelectorPredicate, LabelsChanged, Predicate, ResourceVersionChanged,
};
use crate::controller::source::EventRegistration;
use crate::controller::{HotSwap, Request};
use crate::informer::ResourceEventHandler;
use crate::object::{Object, Transform};
use crate::plugin::{CacheReader, FilterInput, Gvk, PluginReconciler, UnionCache};
use crate::queue::RateLimitingQueue;

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
    fn of(s: &WatchSource) -> Self {
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
    /// Discovery: whether the cluster serves `kind`.
    fn resolve<'a>(&'a self, kind: &'a Gvk) -> BoxFuture<'a, Result<ResolvedKind, KindLookupError>>;
}

/// One lease on a shared informer. Dropping it releases the lease.
pub trait LeasedInformer: Send + Sync + 'static {
    fn namespaced(&self) -> bool;
    /// Whether the informer's cache holds the initial list.
    fn has_synced(&self) -> bool;
    /// Read access for plugins.
    fn cache(&self) -> Arc<dyn CacheReader>;
    /// Keys of every cached object.
    fn keys(&self) -> Vec<String>;
    /// Registers `handler` (it first receives the current contents as initial-list adds).
    fn add_handler(
        &self,
        handler: Arc<dyn ResourceEventHandler>,
        resync: Option<Duration>,
    ) -> Box<dyn EventRegistration>;
}

/// `apps/v1` + `Deployment` as kube's type.
pub(crate) fn kube_gvk(kind: &Gvk) -> GroupVersionKind {
    GroupVersionKind::gvk(kind.group(), kind.version(), &kind.kind)
}

fn gvk_of(kind: &GroupVersionKind) -> Gvk {
    let api_version =
        if kind.group.is_empty() { kind.version.clone() } else { format!("{}/{}", kind.group, kind.version) };
    Gvk::new(api_version, kind.kind.clone())
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

    fn get(&self, s: &WatchSource) -> Option<&Arc<dyn LeasedInformer>> {
        self.informers.get(&WatchKey::of(s))
    }

    /// One cache per readable kind: everything the plugin declared for that kind. An
    /// informer whose scope another one covers adds nothing and is left out; when several
    /// remain (e.g. `[for]` and `[[watches]]` with different selectors), reads see their union.
    pub fn caches(&self) -> HashMap<Gvk, Arc<dyn CacheReader>> {
        let mut by_kind: BTreeMap<&Gvk, Vec<(&WatchKey, &Arc<dyn LeasedInformer>)>> = BTreeMap::new();
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

/// The running version of a plugin, shared by every generation's handlers: the `map` and
/// `filter` they call are always the current version's, so handlers outlive swaps.
pub(crate) type PluginSlot = HotSwap<PluginReconciler>;

/// The plugin's `map` export as the controller's [`Mapper`].
struct PluginMapper(PluginSlot);

impl Mapper for PluginMapper {
    fn map(&self, kind: &GroupVersionKind, obj: &Arc<Object>) -> Vec<Request> {
        self.0.load().map(&gvk_of(kind), obj)
    }
}

/// The plugin's `filter` export as the controller's [`Filter`].
struct PluginFilter(PluginSlot);

impl Filter for PluginFilter {
    fn filter(&self, kind: &GroupVersionKind, event: FilterEvent<'_>) -> bool {
        let input = match event {
            FilterEvent::Create(o) => FilterInput::Create(o.json()),
            FilterEvent::Update { old, new } => FilterInput::Update(old.json(), new.json()),
            FilterEvent::Delete(d) => FilterInput::Delete(d.object().json()),
        };
        self.0.load().filter(&gvk_of(kind), input)
    }
}

fn predicates(p: &Predicates, kind: &Gvk, plugin: &PluginSlot) -> Result<Vec<Arc<dyn Predicate>>, String> {
    let mut out: Vec<Arc<dyn Predicate>> = Vec::new();
    if p.generation_changed {
        out.push(Arc::new(GenerationChanged));
    }
    if p.resource_version_changed {
        out.push(Arc::new(ResourceVersionChanged));
    }
    if p.labels_changed {
        out.push(Arc::new(LabelsChanged));
    }
    if p.annotations_changed {
        out.push(Arc::new(AnnotationsChanged));
    }
    if let Some(sel) = &p.label_selector {
        out.push(Arc::new(LabelSelectorPredicate(LabelSelector::parse(sel).map_err(|e| e.to_string())?)));
    }
    if let Some(key) = &p.annotation_present {
        out.push(Arc::new(AnnotationPresent(key.clone())));
    }
    if p.filter {
        let slot: HotSwap<dyn Filter> = HotSwap::new(Arc::new(PluginFilter(plugin.clone())));
        out.push(Arc::new(FilterPredicate::new(kube_gvk(kind), slot)));
    }
    Ok(out)
}

/// What an enqueueing handler is for: a handler with the same identity in the next
/// generation is carried over rather than registered again, so a notification still in its
/// buffer is never lost to a swap.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HandlerId {
    role: &'static str,
    key: WatchKey,
    predicates: Predicates,
    resync: Option<Duration>,
}

/// One live version of a plugin: its leases and its handler registrations.
pub(crate) struct Generation {
    pub config: PluginConfig,
    /// Short content hash of the `.wasm`.
    pub version: String,
    pub plugin: Arc<PluginReconciler>,
    /// Handlers that enqueue into the controller's queue (version-independent).
    enqueuers: Vec<(HandlerId, Box<dyn EventRegistration>)>,
    /// Handlers that call this version's `on-*` hooks.
    hooks: Vec<Box<dyn EventRegistration>>,
    /// Released after the registrations are removed (fields drop after `Drop::drop` runs).
    leases: Leases,
}

impl Generation {
    /// Registers the handlers of `config` on `leases`, enqueueing into `queue`. Handlers of
    /// `previous` that this configuration needs unchanged are taken over from it (the rest
    /// are removed when `previous` is dropped).
    pub fn wire(
        config: PluginConfig,
        version: String,
        plugin: Arc<PluginReconciler>,
        slot: &PluginSlot,
        leases: Leases,
        queue: &RateLimitingQueue<Request>,
        mut previous: Option<&mut Generation>,
    ) -> Result<Generation, String> {
        let resync = config.resync;
        let for_kind = kube_gvk(&config.for_source.kind);
        let for_namespaced = leases.for_namespaced(&config);
        let mut generation = Generation {
            config: config.clone(),
            version,
            plugin: plugin.clone(),
            enqueuers: Vec::new(),
            hooks: Vec::new(),
            leases,
        };
        let sources: Vec<(&'static str, &WatchSource)> = std::iter::once(("for", &config.for_source))
            .chain(config.owns.iter().map(|s| ("owns", s)))
            .chain(config.watches.iter().map(|s| ("watches", s)))
            .collect();
        // Everything that can fail, before any handler is taken from `previous`.
        for (_, s) in &sources {
            generation.leases.get(s).ok_or_else(|| format!("no informer for {}", WatchKey::of(s)))?;
            predicates(&s.predicates, &s.kind, slot)?;
        }
        for (role, s) in sources {
            let id = HandlerId { role, key: WatchKey::of(s), predicates: s.predicates.clone(), resync };
            let reused = previous.as_mut().and_then(|p| {
                let at = p.enqueuers.iter().position(|(pid, _)| *pid == id)?;
                Some(p.enqueuers.swap_remove(at).1)
            });
            let registration = match reused {
                Some(r) => r,
                None => {
                    let inf =
                        generation.leases.get(s).ok_or_else(|| format!("no informer for {}", id.key))?;
                    let preds = predicates(&s.predicates, &s.kind, slot)?;
                    let handler: Arc<dyn ResourceEventHandler> = match role {
                        "for" => Arc::new(EnqueueForObject::new(queue.clone(), preds)),
                        "owns" => {
                            Arc::new(EnqueueForOwner::new(queue.clone(), preds, &for_kind, for_namespaced))
                        }
                        _ => {
                            let mapper: HotSwap<dyn Mapper> =
                                HotSwap::new(Arc::new(PluginMapper(slot.clone())));
                            Arc::new(EnqueueMapped::new(queue.clone(), preds, kube_gvk(&s.kind), mapper))
                        }
                    };
                    inf.add_handler(handler, resync)
                }
            };
            generation.enqueuers.push((id, registration));
        }
        let hooks = plugin.plugin().hooks();
        if hooks.on_add || hooks.on_update || hooks.on_delete {
            let mut seen = std::collections::BTreeSet::new();
            for s in std::iter::once(&config.for_source).chain(&config.owns).chain(&config.watches) {
                if seen.insert(WatchKey::of(s)) {
                    let inf = generation
                        .leases
                        .get(s)
                        .ok_or_else(|| format!("no informer for {}", WatchKey::of(s)))?;
                    generation.hooks.push(inf.add_handler(plugin.event_handler(s.kind.clone()), resync));
                }
            }
        }
        Ok(generation)
    }

    /// Whether every handler has received its informer's initial contents.
    pub fn has_synced(&self) -> bool {
        self.enqueuers.iter().all(|(_, r)| r.has_synced()) && self.hooks.iter().all(|r| r.has_synced())
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        for (_, r) in &self.enqueuers {
            r.remove();
        }
        for r in &self.hooks {
            r.remove();
        }
        // The old version's idle instances are no longer needed; busy ones go when their
        // calls finish.
        self.plugin.plugin().release_idle_instances();
    }
}
