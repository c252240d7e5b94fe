//! What a plugin hears when a reload changes its scope: an object that leaves the scope is
//! not reported as deleted.
//!
//! A reload may narrow what a plugin watches of its `for` kind (another namespace, a
//! narrower label or field selector, a `[[watches]]` entry dropped). Keys of objects that
//! were in the old scope reach the new version anyway: keys still queued, keys the old
//! version's handlers deliver while they drain, retries, and the deletes the retiring
//! version sends for objects its successor's informers no longer have (see `retire`). The
//! new version's cache does not hold those objects, so a reconcile would see them gone.
//!
//! Like controller-runtime (a manager restarted with a narrower cache starts empty and tells
//! its reconcilers nothing about what lies outside), the host does not tell a plugin that
//! keys left its scope. [`ScopedReconciler`] sits in front of the plugin's `reconcile`:
//! a key missing from the running version's cache is reconciled only when its object is
//! really gone.
//!
//! Invariants:
//! - A key whose object the running version's cache holds is always reconciled.
//! - A key missing from that cache whose last state known to a previous version is outside
//!   the running version's scope (namespace, label selector, field selector of its
//!   informers of the `for` kind) is not reconciled: it left the scope.
//! - A key missing from that cache whose last known state is inside the scope is looked up
//!   live: reconciled if the server has no such object (a real delete), skipped if it has
//!   (the running version's informer has not caught up yet, and enqueues it when it does).
//! - A key no previous version knew is reconciled (a real delete, or a request the plugin's
//!   own `map` made up).
//! - What a previous version knew is kept until the next reload, and only for objects
//!   outside the scope (the last states of the scope the plugin left).
//!
//! A label-selector watch's DELETED for an object whose labels no longer match (client-go
//! delivers it as a delete) reaches the plugin as a delete: that is the informer's own
//! event, not a reload's. A plugin tells the two apart with a live `client.get`.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::leases::{InformerLeases, Leases, WatchKey};
use super::union_cache::UnionCache;
use crate::cache::LabelSelector;
use crate::controller::{Action, ReconcileError, Reconciler, Request};
use crate::object::Object;
use crate::plugin::{CacheReader, Gvk, PluginReconciler};

/// The scope of a plugin's informers of one kind: an object is in it when any of them
/// would list it.
#[derive(Clone)]
pub(crate) struct Scope {
    parts: Vec<ScopePart>,
}

#[derive(Clone)]
struct ScopePart {
    namespace: Option<String>,
    labels: Option<LabelSelector>,
    fields: Option<wasmctrl_selectors::FieldSelector>,
}

impl Scope {
    /// The scope of the informers `keys` (of one kind).
    pub fn of<'a>(keys: impl IntoIterator<Item = &'a WatchKey>) -> Scope {
        let parts = keys
            .into_iter()
            .map(|k| ScopePart {
                namespace: k.namespace.clone(),
                // Selectors were checked when the TOML was read; one that does not parse
                // here counts as no selector (the object is then looked up live).
                labels: k.label_selector.as_deref().and_then(|s| LabelSelector::parse(s).ok()),
                fields: k
                    .field_selector
                    .as_deref()
                    .and_then(|s| wasmctrl_selectors::FieldSelector::parse(s).ok()),
            })
            .collect();
        Scope { parts }
    }

    /// Whether `object`, as it is, is within the scope.
    pub fn contains(&self, object: &Object) -> bool {
        self.parts.iter().any(|p| p.contains(object))
    }
}

impl ScopePart {
    fn contains(&self, object: &Object) -> bool {
        if let Some(ns) = &self.namespace
            && object.namespace() != Some(ns.as_str())
        {
            return false;
        }
        if let Some(labels) = &self.labels
            && !labels.matches(object)
        {
            return false;
        }
        match &self.fields {
            None => true,
            Some(fields) => {
                let parsed = (!fields.only_metadata())
                    .then(|| serde_json::from_slice::<serde_json::Value>(object.json()).ok())
                    .flatten();
                fields.matches_with(|path| match path {
                    "metadata.name" => object.name().to_owned(),
                    "metadata.namespace" => object.namespace().unwrap_or("").to_owned(),
                    path => parsed.as_ref().map(|v| field_value(v, path)).unwrap_or_default(),
                })
            }
        }
    }
}

/// The string form of the field at dotted `path` (empty when absent), as the API server's
/// field selectors compare it.
fn field_value(object: &serde_json::Value, path: &str) -> String {
    let mut cur = object;
    for segment in path.split('.') {
        match cur.get(segment) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// What previous versions of the plugin knew of its `for` kind.
#[derive(Default)]
struct Known {
    /// The caches of the version this one replaced (live while its informers run).
    previous: Option<Arc<dyn CacheReader>>,
    /// Last states of objects that left the scope at an earlier reload.
    left: HashMap<String, Arc<Object>>,
}

/// The controller's reconciler for one version of a plugin: the plugin's `reconcile`,
/// except for keys whose objects left the plugin's scope (see the module doc).
pub(crate) struct ScopedReconciler {
    plugin: Arc<PluginReconciler>,
    kind: Gvk,
    /// This version's view of its `for` kind (the union of its informers of the kind).
    cache: Arc<dyn CacheReader>,
    scope: Scope,
    known: Mutex<Known>,
    /// Live lookups of objects.
    server: Arc<dyn InformerLeases>,
}

impl ScopedReconciler {
    /// The reconciler of `plugin` whose `for` kind is `kind`, watched through `leases`.
    pub fn new(
        plugin: Arc<PluginReconciler>,
        kind: Gvk,
        leases: &Leases,
        server: Arc<dyn InformerLeases>,
    ) -> Arc<Self> {
        let (cache, scope) = view_of(leases, &kind);
        Arc::new(ScopedReconciler { plugin, kind, cache, scope, known: Mutex::default(), server })
    }

    /// Takes over what `previous` (the version this one replaces, of the same `for` kind)
    /// knew: its caches (until the next reload), and the last states of objects outside
    /// this version's scope.
    pub fn succeed(&self, previous: &ScopedReconciler, previous_leases: &Leases) {
        if previous.kind != self.kind {
            return;
        }
        let (previous_cache, _) = view_of(previous_leases, &self.kind);
        let mut left = HashMap::new();
        {
            let known = previous.known.lock();
            let older = known.previous.iter().flat_map(|c| c.list(None, None).unwrap_or_default());
            for object in known.left.values().cloned().chain(older) {
                if self.cache.get(object.key()).is_none() && !self.scope.contains(&object) {
                    left.insert(object.key().to_owned(), object);
                }
            }
        }
        let mut known = self.known.lock();
        known.left = left;
        known.previous = Some(previous_cache);
    }

    /// Whether a retiring version need not send a delete for `key` (its informer caches
    /// the object, this version's informers do not): this version has the object, or the
    /// last known state of it is outside this version's scope.
    pub fn has_or_left(&self, key: &str) -> bool {
        if self.cache.get(key).is_some() {
            return true;
        }
        let known = self.known.lock();
        let last = known.previous.as_ref().and_then(|c| c.get(key)).or_else(|| known.left.get(key).cloned());
        last.is_some_and(|o| !self.scope.contains(&o))
    }
}

/// The union of `leases`' caches of `kind`, and their scope.
fn view_of(leases: &Leases, kind: &Gvk) -> (Arc<dyn CacheReader>, Scope) {
    let of_kind: Vec<(&WatchKey, Arc<dyn CacheReader>)> =
        leases.informers.iter().filter(|(k, _)| &k.kind == kind).map(|(k, i)| (k, i.cache())).collect();
    let scope = Scope::of(of_kind.iter().map(|(k, _)| *k));
    let caches: Vec<Arc<dyn CacheReader>> = of_kind.into_iter().map(|(_, c)| c).collect();
    let cache: Arc<dyn CacheReader> = match <[_; 1]>::try_from(caches) {
        Ok([only]) => only,
        Err(caches) => Arc::new(UnionCache::new(caches)),
    };
    (cache, scope)
}

impl Reconciler for ScopedReconciler {
    fn reconcile(&self, request: Request) -> BoxFuture<'static, Result<Action, ReconcileError>> {
        let key = request.key();
        if self.cache.get(&key).is_some() {
            return self.plugin.reconcile(request);
        }
        // A miss: decide (possibly after a live lookup) whether the plugin hears it.
        let me = ScopedCall { plugin: self.plugin.clone(), decide: self.left_scope_owned(key.clone()) };
        Box::pin(async move {
            if me.decide.await {
                tracing::debug!(plugin = %me.plugin.plugin().name(), version = %me.plugin.plugin().short_version(),
                    request = %key, "not reconciled: the object left the plugin's scope at a reload");
                return Ok(Action::Done);
            }
            me.plugin.reconcile(request).await
        })
    }
}

struct ScopedCall {
    plugin: Arc<PluginReconciler>,
    decide: BoxFuture<'static, bool>,
}

impl ScopedReconciler {
    /// [`left_scope`](Self::left_scope) as an owned future (the reconcile future must not
    /// borrow the reconciler).
    fn left_scope_owned(&self, key: String) -> BoxFuture<'static, bool> {
        let last = {
            let known = self.known.lock();
            known.previous.as_ref().and_then(|c| c.get(&key)).or_else(|| known.left.get(&key).cloned())
        };
        let Some(last) = last else { return Box::pin(async { false }) };
        if !self.scope.contains(&last) {
            return Box::pin(async { true });
        }
        let server = self.server.clone();
        let kind = self.kind.clone();
        let plugin = self.plugin.plugin().name().to_owned();
        Box::pin(async move {
            match server.exists(&kind, last.namespace(), last.name()).await {
                Ok(exists) => exists,
                Err(error) => {
                    tracing::warn!(%plugin, request = %key, %error,
                        "cannot look the object up; reconciling it as the cache has it (gone)");
                    false
                }
            }
        })
    }
}
