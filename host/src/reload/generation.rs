//! One version of a plugin wired to the informers. A [`Generation`] is one (TOML, `.wasm`)
//! pair made live: leases on every informer its TOML needs (see `leases`), and the handlers
//! that turn notifications into requests on its controller's queue (or into calls of its
//! `on-*` hooks).
//!
//! Hot reload builds the next generation from the running one, and nothing a handler was
//! sent is dropped on the way:
//! - informers both generations use are never stopped (the factory's leases are reference
//!   counted: the new lease is taken before the old one is released);
//! - an enqueueing handler the next generation needs unchanged (same role, scope,
//!   predicates and resync, same queue) is carried over as it is; one that changed on the
//!   same informer is *replaced*: its undelivered notifications are handed, in order, to
//!   its successor ahead of the successor's synthetic adds (one instant of the informer's
//!   stream separates the two); one the next generation does not need *drains* when the old
//!   generation retires (see `retire`);
//! - hook handlers (`on-*`) are never carried over or handed over: the old one is cut at the
//!   successor's registration and delivers what it already had to the old version, which
//!   [`Generation::retire`] waits for (listener and dispatcher), so the caller can open the
//!   new version's hooks only once the old version's last hook call returned;
//! - new handlers start with the informers' current contents (synthetic adds), so every
//!   existing object is enqueued once more and reconciled by the new version;
//! - dropping a generation removes whatever handlers it still has before its leases go.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::leases::{LeasedRegistration, Leases, WatchKey};
use super::map_filter::{PluginMapper, kube_gvk, predicates};
use super::slot::VersionSlot;
use crate::config::{PluginConfig, Predicates, WatchSource};
use crate::controller::handler::{EnqueueForObject, EnqueueForOwner, EnqueueMapped, Mapper};
use crate::controller::{HotSwap, Request};
use crate::informer::ResourceEventHandler;
use crate::plugin::PluginReconciler;
use crate::queue::RateLimitingQueue;

/// What an enqueueing handler is for: a handler with the same identity in the next
/// generation is carried over rather than registered again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct HandlerId {
    role: &'static str,
    pub(super) key: WatchKey,
    predicates: Predicates,
    resync: Option<Duration>,
}

/// One live version of a plugin: its leases and its handler registrations.
pub(super) struct Generation {
    pub config: PluginConfig,
    /// Short content hash of the `.wasm`.
    pub version: String,
    pub plugin: Arc<PluginReconciler>,
    /// Handlers that enqueue into the controller's queue (version-independent).
    pub(super) enqueuers: Mutex<Vec<(HandlerId, Box<dyn LeasedRegistration>)>>,
    /// Handlers that call this version's `on-*` hooks, by informer.
    pub(super) hooks: Mutex<Vec<(WatchKey, Box<dyn LeasedRegistration>)>>,
    /// Registrations replaced by a successor's, until they finished delivering.
    pub(super) leaving: Mutex<Vec<Box<dyn LeasedRegistration>>>,
    /// Released after the registrations are removed (fields drop after `Drop::drop` runs).
    pub(super) leases: Leases,
}

impl Generation {
    /// What [`wire`](Self::wire) would refuse, checked without touching anything.
    pub fn check(config: &PluginConfig, leases: &Leases, slot: &VersionSlot) -> Result<(), String> {
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
        slot: &VersionSlot,
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
