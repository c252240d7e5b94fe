//! How one version of a plugin is wired to the informers: leases on every informer its
//! TOML needs, and the handlers that turn notifications into requests on its controller's
//! queue (or into calls of its `on-*` hooks).
//!
//! A [`Generation`] is one (TOML, `.wasm`) pair made live. Hot reload builds the next
//! generation from the running one, and nothing a handler was sent is dropped on the way:
//! - informers both generations use are never stopped (the factory's leases are reference
//!   counted: the new lease is taken before the old one is released);
//! - an enqueueing handler the next generation needs unchanged (same role, scope,
//!   predicates and resync, same queue) is carried over as it is; one that changed on the
//!   same informer is *replaced*: its undelivered notifications are handed, in order, to
//!   its successor ahead of the successor's synthetic adds (one instant of the informer's
//!   stream separates the two); one the next generation does not need *drains* (delivers its
//!   buffer into the queue, then ends) when the old generation retires, once its informer
//!   has caught up with the point the next generation's informers of that kind have reached
//!   (a change from before that point, say an object created and deleted, is in no cache the
//!   successor lists), and after a delete for every object its informer still caches that
//!   the next generation's informers of that kind no longer have (a lagging informer's
//!   unprocessed delete reaches no handler once its own has left, and the successor's
//!   synthetic adds never name the object);
//! - hook handlers (`on-*`) are never carried over or handed over: the old one is cut at the
//!   successor's registration and delivers what it already had to the old version, which
//!   [`Generation::retire`] waits for (listener and dispatcher), so the caller can open the
//!   new version's hooks only once the old version's last hook call returned;
//! - new handlers start with the informers' current contents (synthetic adds), so every
//!   existing object is enqueued once more and reconciled by the new version;
//! - dropping a generation removes whatever handlers it still has before its leases go.

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::core::GroupVersionKind;
use parking_lot::Mutex;

use super::predicates::builtin_predicates;
use super::slot::VersionSlot;
use super::union_cache::UnionCache;
use crate::cache::IndexSpec;
use crate::config::{KindLookupError, PluginConfig, Predicates, ResolvedKind, WatchSource};
use crate::controller::handler::{EnqueueForObject, EnqueueForOwner, EnqueueMapped, Mapper};
use crate::controller::predicate::{Filter, FilterEvent, FilterPredicate, Predicate};
use crate::controller::source::EventRegistration;
use crate::controller::{HotSwap, Request};
use crate::fifo::SourceProgress;
use crate::informer::ResourceEventHandler;
use crate::object::{Object, Transform, compare_resource_versions};
use crate::plugin::{CacheReader, FilterInput, Gvk, PluginReconciler};
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

/// The running version of a plugin, shared by every generation's handlers (and kept across
/// controller restarts): the `map` and `filter` they call are always the current version's,
/// so handlers outlive swaps, and calls of two versions never overlap (see `slot`).
pub(crate) type PluginSlot = VersionSlot;

/// The plugin's `map` export as the controller's [`Mapper`].
struct PluginMapper(PluginSlot);

impl Mapper for PluginMapper {
    fn map(&self, kind: &GroupVersionKind, obj: &Arc<Object>) -> Vec<Request> {
        self.0.call(|p| p.map(&gvk_of(kind), obj))
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
        self.0.call(|p| p.filter(&gvk_of(kind), input))
    }
}

/// A source's predicates: the built-in ones its TOML turns on, then the plugin's `filter`.
fn predicates(p: &Predicates, kind: &Gvk, plugin: &PluginSlot) -> Result<Vec<Arc<dyn Predicate>>, String> {
    let mut out = builtin_predicates(p).map_err(|e| e.to_string())?;
    if p.filter {
        let slot: HotSwap<dyn Filter> = HotSwap::new(Arc::new(PluginFilter(plugin.clone())));
        out.push(Arc::new(FilterPredicate::new(kube_gvk(kind), slot)));
    }
    Ok(out)
}

/// What an enqueueing handler is for: a handler with the same identity in the next
/// generation is carried over rather than registered again.
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
    enqueuers: Mutex<Vec<(HandlerId, Box<dyn LeasedRegistration>)>>,
    /// Handlers that call this version's `on-*` hooks, by informer.
    hooks: Mutex<Vec<(WatchKey, Box<dyn LeasedRegistration>)>>,
    /// Registrations replaced by a successor's, until they finished delivering.
    leaving: Mutex<Vec<Box<dyn LeasedRegistration>>>,
    /// Released after the registrations are removed (fields drop after `Drop::drop` runs).
    leases: Leases,
}

impl Generation {
    /// What [`wire`](Self::wire) would refuse, checked without touching anything.
    pub fn check(config: &PluginConfig, leases: &Leases, slot: &PluginSlot) -> Result<(), String> {
        for s in std::iter::once(&config.for_source).chain(&config.owns).chain(&config.watches) {
            leases.get(s).ok_or_else(|| format!("no informer for {}", WatchKey::of(s)))?;
            predicates(&s.predicates, &s.kind, slot)?;
        }
        Ok(())
    }

    /// Registers the handlers of `config` on `leases`, enqueueing into `queue`. From
    /// `previous` (the generation this one follows), enqueuers this configuration needs
    /// unchanged are carried over when `same_queue`; the ones of the same role on the same
    /// informer are replaced with hand-over; its hook handlers on informers this one hooks
    /// too are replaced (cut, not handed over). What `previous` keeps goes when it retires.
    #[allow(clippy::too_many_arguments)]
    pub fn wire(
        config: PluginConfig,
        version: String,
        plugin: Arc<PluginReconciler>,
        slot: &PluginSlot,
        leases: Leases,
        queue: &RateLimitingQueue<Request>,
        previous: Option<&Generation>,
        same_queue: bool,
    ) -> Result<Generation, String> {
        let resync = config.resync;
        let for_kind = kube_gvk(&config.for_source.kind);
        let for_namespaced = leases.for_namespaced(&config);
        let generation = Generation {
            config: config.clone(),
            version,
            plugin: plugin.clone(),
            enqueuers: Mutex::new(Vec::new()),
            hooks: Mutex::new(Vec::new()),
            leaving: Mutex::new(Vec::new()),
            leases,
        };
        let sources: Vec<(&'static str, &WatchSource)> = std::iter::once(("for", &config.for_source))
            .chain(config.owns.iter().map(|s| ("owns", s)))
            .chain(config.watches.iter().map(|s| ("watches", s)))
            .collect();
        // Everything that can fail, before anything is taken from `previous`.
        let mut built = Vec::new();
        for (role, s) in &sources {
            let inf =
                generation.leases.get(s).ok_or_else(|| format!("no informer for {}", WatchKey::of(s)))?;
            let preds = predicates(&s.predicates, &s.kind, slot)?;
            built.push((*role, *s, inf.clone(), preds));
        }
        let mut enqueuers = Vec::new();
        for (role, s, inf, preds) in built {
            let id = HandlerId { role, key: WatchKey::of(s), predicates: s.predicates.clone(), resync };
            let (same, same_informer) = match previous {
                Some(p) => {
                    let mut list = p.enqueuers.lock();
                    let same = if same_queue {
                        list.iter().position(|(pid, _)| *pid == id).map(|at| list.swap_remove(at).1)
                    } else {
                        None
                    };
                    let same_informer = match same {
                        Some(_) => None,
                        None => list
                            .iter()
                            .position(|(pid, _)| pid.role == id.role && pid.key == id.key)
                            .map(|at| list.swap_remove(at).1),
                    };
                    (same, same_informer)
                }
                None => (None, None),
            };
            let registration = match same {
                Some(r) => r,
                None => {
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
                    match (same_informer, previous) {
                        (Some(old), Some(p)) => {
                            let r = inf.replace_handler(&*old, handler, resync, true);
                            p.leaving.lock().push(old);
                            r
                        }
                        _ => inf.add_handler(handler, resync),
                    }
                }
            };
            enqueuers.push((id, registration));
        }
        *generation.enqueuers.lock() = enqueuers;
        let hooks = plugin.plugin().hooks();
        if hooks.on_add || hooks.on_update || hooks.on_delete {
            let mut seen = std::collections::BTreeSet::new();
            let mut registrations = Vec::new();
            for s in std::iter::once(&config.for_source).chain(&config.owns).chain(&config.watches) {
                let key = WatchKey::of(s);
                if !seen.insert(key.clone()) {
                    continue;
                }
                let inf = generation.leases.get(s).ok_or_else(|| format!("no informer for {key}"))?;
                let handler = plugin.event_handler(s.kind.clone());
                let old = previous.and_then(|p| {
                    let mut list = p.hooks.lock();
                    list.iter().position(|(k, _)| *k == key).map(|at| list.swap_remove(at).1)
                });
                let registration = match (old, previous) {
                    (Some(old), Some(p)) => {
                        let r = inf.replace_handler(&*old, handler, resync, false);
                        p.leaving.lock().push(old);
                        r
                    }
                    _ => inf.add_handler(handler, resync),
                };
                registrations.push((key, registration));
            }
            *generation.hooks.lock() = registrations;
        }
        Ok(generation)
    }

    /// Keys of every object cached by the informers this generation's enqueuers of `kind`
    /// listen to (`None`: it enqueues nothing from that kind). Any later delete of one of
    /// them reaches one of those enqueuers.
    fn enqueued_keys_of_kind(&self, kind: &Gvk) -> Option<std::collections::HashSet<String>> {
        let watched: std::collections::BTreeSet<WatchKey> = self
            .enqueuers
            .lock()
            .iter()
            .filter(|(id, _)| &id.key.kind == kind)
            .map(|(id, _)| id.key.clone())
            .collect();
        if watched.is_empty() {
            return None;
        }
        Some(watched.iter().filter_map(|k| self.leases.informers.get(k)).flat_map(|i| i.keys()).collect())
    }

    /// Before its handlers leave, lets each informer of this generation that the successor
    /// does not use catch up with the successor's informers of the same kind: whatever
    /// happened before the successor's informers' current point is either in their caches
    /// (the successor's synthetic adds) or must reach this generation's handlers. An object
    /// created and deleted while this informer lagged is in neither cache, so only this
    /// informer can still deliver it.
    ///
    /// Resource versions of one resource are compared as integers (Kubernetes ≥ 1.35,
    /// KEP-5504; both our servers issue them so). A watch that is open, has handed out all it
    /// received and brought nothing for [`QUIET_STREAM`] counts as caught up (a quiet
    /// informer would otherwise wait for the server's next bookmark, about a minute on
    /// kube-apiserver). The wait is bounded by [`CATCH_UP_TIMEOUT`]; then a warning names the
    /// informer and what it had not reached.
    async fn catch_up_with(&self, successor: &Generation) {
        let mine: std::collections::BTreeSet<WatchKey> = self
            .enqueuers
            .lock()
            .iter()
            .map(|(id, _)| id.key.clone())
            .chain(self.hooks.lock().iter().map(|(key, _)| key.clone()))
            .filter(|key| !successor.leases.informers.contains_key(key))
            .collect();
        let deadline = tokio::time::Instant::now() + CATCH_UP_TIMEOUT;
        for key in mine {
            let Some(informer) = self.leases.informers.get(&key) else { continue };
            let Some(target) = successor
                .leases
                .informers
                .iter()
                .filter(|(k, _)| k.kind == key.kind)
                .filter_map(|(_, i)| i.progress().received)
                .max_by(|a, b| compare_resource_versions(a, b).unwrap_or(std::cmp::Ordering::Equal))
            else {
                continue;
            };
            let outcome = catch_up(&**informer, &target, deadline).await;
            match outcome {
                CatchUp::TimedOut(progress) => tracing::warn!(
                    plugin = %self.config.name, version = %self.version, informer = %key, %target,
                    delivered = progress.delivered.as_deref().unwrap_or(""),
                    "the retiring version's informer did not catch up with its successor's in time; \
                     changes it has not processed yet may reach no version"
                ),
                outcome => tracing::debug!(plugin = %self.config.name, version = %self.version,
                    informer = %key, %target, ?outcome, "retiring informer caught up"),
            }
        }
    }

    /// Before a plugin stops (no successor): lets each informer this generation has
    /// handlers on catch up with the server's current resourceVersion of its scope, so every
    /// change made before the stop began reaches the handlers, which then drain into the
    /// parked queue (a delete whose event was still on its way would otherwise reach no
    /// handler, and the plugin's return lists the object gone). Same bounds as
    /// [`catch_up_with`](Self::catch_up_with); a failed lookup skips the informer.
    pub async fn catch_up_with_server(&self, provider: &dyn InformerLeases) {
        let keys: std::collections::BTreeSet<WatchKey> = self
            .enqueuers
            .lock()
            .iter()
            .map(|(id, _)| id.key.clone())
            .chain(self.hooks.lock().iter().map(|(key, _)| key.clone()))
            .collect();
        let deadline = tokio::time::Instant::now() + CATCH_UP_TIMEOUT;
        for key in keys {
            let Some(informer) = self.leases.informers.get(&key) else { continue };
            let target = match provider.current_resource_version(&key).await {
                Ok(rv) => rv,
                Err(error) => {
                    tracing::warn!(plugin = %self.config.name, version = %self.version, informer = %key, %error,
                        "cannot read the server's resourceVersion; stopping without waiting for the informer");
                    continue;
                }
            };
            match catch_up(&**informer, &target, deadline).await {
                CatchUp::TimedOut(progress) => tracing::warn!(
                    plugin = %self.config.name, version = %self.version, informer = %key, %target,
                    delivered = progress.delivered.as_deref().unwrap_or(""),
                    "the stopping version's informer did not reach the server's resourceVersion in time"
                ),
                outcome => tracing::debug!(plugin = %self.config.name, version = %self.version,
                    informer = %key, %target, ?outcome, "stopping informer caught up with the server"),
            }
        }
    }

    /// Keys of every object the `for` source's informer caches.
    pub fn for_keys(&self) -> Vec<String> {
        self.leases.for_keys(&self.config)
    }

    /// Whether the `for` source's informer caches `key`.
    pub fn for_cached(&self, key: &str) -> bool {
        self.leases.get(&self.config.for_source).is_some_and(|i| i.cache().get(key).is_some())
    }

    /// The leases this generation holds.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Resolves once every handler has received its informer's initial contents.
    pub fn synced(&self) -> BoxFuture<'static, ()> {
        let waits: Vec<BoxFuture<'static, ()>> = self
            .enqueuers
            .lock()
            .iter()
            .map(|(_, r)| r.synced())
            .chain(self.hooks.lock().iter().map(|(_, r)| r.synced()))
            .collect();
        Box::pin(async move {
            futures::future::join_all(waits).await;
        })
    }

    /// Whether every handler has received its informer's initial contents.
    pub fn has_synced(&self) -> bool {
        self.enqueuers.lock().iter().all(|(_, r)| r.has_synced())
            && self.hooks.lock().iter().all(|(_, r)| r.has_synced())
    }

    /// Takes this generation out of service without losing anything it was sent: every
    /// handler it still has is removed after delivering its buffer; returns once none of
    /// its handlers will be called again and its version's last hook call has returned.
    ///
    /// With a `successor` (the generation that follows this one), an enqueuer on a kind the
    /// successor watches too also delivers a delete for each object its informer still
    /// caches but the successor's informers of that kind no longer have: when the two
    /// watch through different informers (another scope, selector or transform), this one
    /// may lag behind, and a delete it has not processed yet when its handler leaves would
    /// otherwise reach no handler at all (the successor's synthetic adds start after it).
    ///
    /// `left` says which of those objects only left the successor's scope (see `scope`):
    /// no delete is sent for them. It applies to the successor's `for` kind.
    #[allow(clippy::type_complexity)]
    pub async fn retire(&self, successor: Option<&Generation>, left: Option<&(dyn Fn(&str) -> bool + Sync)>) {
        if let Some(successor) = successor {
            self.catch_up_with(successor).await;
        }
        type Leaving = (Box<dyn LeasedRegistration>, Option<Arc<std::collections::HashSet<String>>>);
        let mut by_informer: BTreeMap<WatchKey, Vec<Leaving>> = BTreeMap::new();
        // The successor's view of each kind, taken after its handlers were registered
        // (anything it drops later, its own handlers receive) and before these removals.
        let mut present_by_kind: HashMap<Gvk, Option<Arc<std::collections::HashSet<String>>>> =
            HashMap::new();
        for (id, r) in self.enqueuers.lock().drain(..) {
            let present = present_by_kind
                .entry(id.key.kind.clone())
                .or_insert_with(|| {
                    successor.and_then(|s| s.enqueued_keys_of_kind(&id.key.kind)).map(Arc::new)
                })
                .clone();
            by_informer.entry(id.key).or_default().push((r, present));
        }
        for (key, r) in self.hooks.lock().drain(..) {
            by_informer.entry(key).or_default().push((r, None));
        }
        let mut waits = Vec::new();
        {
            let mut leaving = self.leaving.lock();
            for (key, registrations) in by_informer {
                // All of this version's handlers on one informer leave at one instant of its
                // stream: a notification reaches all of them or none (an enqueuer must not
                // miss a delete its sibling hook handler still saw).
                let for_kind = successor.is_some_and(|s| s.config.for_source.kind == key.kind);
                let tests: Vec<Option<Box<dyn Fn(&str) -> bool + '_>>> = registrations
                    .iter()
                    .map(|(_, present)| {
                        present.as_ref().map(|p| {
                            Box::new(move |k: &str| {
                                p.contains(k) || (for_kind && left.is_some_and(|left| left(k)))
                            }) as Box<dyn Fn(&str) -> bool>
                        })
                    })
                    .collect();
                let removals: Vec<(&dyn LeasedRegistration, Option<&dyn Fn(&str) -> bool>)> =
                    registrations.iter().zip(&tests).map(|((r, _), t)| (&**r, t.as_deref())).collect();
                match self.leases.informers.get(&key) {
                    Some(informer) => informer.remove_handlers(&removals),
                    None => {
                        for &(r, present) in &removals {
                            match present {
                                Some(present) => r.remove_draining_departed(present),
                                None => r.remove_draining(),
                            }
                        }
                    }
                }
                drop(removals);
                drop(tests);
                leaving.extend(registrations.into_iter().map(|(r, _)| r));
            }
            for r in leaving.iter() {
                waits.push(r.finished());
            }
        }
        futures::future::join_all(waits).await;
        self.leaving.lock().clear();
        let plugin = self.plugin.clone();
        // The last calls queued to this version's hook dispatcher.
        if let Err(e) = tokio::task::spawn_blocking(move || plugin.drain_notifications()).await {
            tracing::warn!(plugin = %self.config.name, version = %self.version, error = %e, "waiting for the hook dispatcher failed");
        }
    }
}

/// Upper bound of [`Generation::catch_up_with`].
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an open watch that handed out everything it received must have brought nothing
/// to count as caught up (watch latency on a healthy server is milliseconds).
const QUIET_STREAM: Duration = Duration::from_secs(1);

/// How a wait for an informer to reach a resourceVersion ended.
#[derive(Debug)]
enum CatchUp {
    Reached,
    Quiet,
    /// The resource versions are not integers: nothing to wait for by them.
    Incomparable,
    TimedOut(SourceProgress),
}

/// Waits until `informer` has handed out every change up to `target` (see
/// [`Generation::catch_up_with`]).
async fn catch_up(informer: &dyn LeasedInformer, target: &str, deadline: tokio::time::Instant) -> CatchUp {
    loop {
        let seq = informer.progress_seq();
        let progress = informer.progress();
        if let Some(delivered) = &progress.delivered {
            match compare_resource_versions(delivered, target) {
                Some(std::cmp::Ordering::Less) => {}
                Some(_) => return CatchUp::Reached,
                None => return CatchUp::Incomparable,
            }
        }
        // Quiet: the stream is open, everything received was handed out, and nothing came
        // for `QUIET_STREAM` (when that is still ahead, it is a time to wake at).
        let quiet_at = match progress.quiet_since {
            Some(since) if progress.streaming && progress.delivered == progress.received => {
                Some(since + QUIET_STREAM)
            }
            _ => None,
        };
        let now = tokio::time::Instant::now();
        if quiet_at.is_some_and(|at| at <= now) {
            return CatchUp::Quiet;
        }
        if now >= deadline {
            return CatchUp::TimedOut(progress);
        }
        // Woken by the next change of the informer's progress (a signal, not a poll), or
        // when the stream would count as quiet, or at the deadline.
        let wake = quiet_at.map_or(deadline, |at| at.min(deadline));
        tokio::select! {
            () = informer.progress_after(seq) => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        for (_, r) in self.enqueuers.get_mut().iter() {
            r.remove();
        }
        for (_, r) in self.hooks.get_mut().iter() {
            r.remove();
        }
        for r in self.leaving.get_mut().iter() {
            r.remove();
        }
        // The old version's idle instances are no longer needed; busy ones go when their
        // calls finish.
        self.plugin.plugin().release_idle_instances();
    }
}
