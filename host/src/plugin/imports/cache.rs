//! Host side of the `cache` import: reads from the informer caches of the kinds the
//! plugin declared.
//!
//! Layering: [`CacheCtx`] (one per plugin, shared by its instances) is this interface's
//! whole host context; the linker reaches it through [`CacheCtxView`], built from the
//! store's state by a getter (as wasmtime's WASI host code does per interface). This
//! module knows nothing of the store's state or of the other imports.
//!
//! Invariants:
//! - A kind the plugin did not declare readable, or a namespace outside the plugin's
//!   namespaces, is refused with `forbidden` (and logged) before any cache is touched; a
//!   list or index lookup of a namespace-limited plugin returns only objects in its
//!   namespaces (and cluster-scoped ones).
//! - `list` and `by-index` are bounded ([`ListBound`]): the objects are collected while the
//!   cache is walked and the walk stops once their JSON passes the plugin's memory limit
//!   (the guest could not hold more); the call then fails with `invalid`, naming the limit.
//!   Nothing past that point is copied, not even a pointer.
//! - Objects go to the guest as the cached JSON bytes, never re-serialised.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use wasmtime::component::HasData;

use super::access::Access;
use super::call::CallInfo;
use crate::object::{Object, key_of};
use crate::plugin::bindings::wasmctrl::controller::cache::Host;
use crate::plugin::bindings::wasmctrl::controller::types::{Error as WitError, Gvk as WitGvk};
use crate::plugin::spec::Gvk;

/// Why a cache read was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheReadError {
    #[error("invalid label selector {selector:?}: {reason}")]
    InvalidSelector { selector: String, reason: String },
    #[error("no index named {0:?} on this kind (declare it in the plugin's TOML)")]
    UnknownIndex(String),
    /// The matching objects' JSON passed the bound of one read.
    #[error(
        "the matching objects are more than {max_bytes} bytes of JSON (the walk stopped after {objects} \
         objects), more than the plugin's memory limit can hold: narrow the read with a namespace, a label \
         selector or an index, or raise the plugin's `memory`"
    )]
    TooLarge { max_bytes: usize, objects: usize },
}

/// What one bounded read may return: only the objects `keep` accepts, at most `max_bytes`
/// of their JSON together.
pub struct ListBound<'a> {
    pub max_bytes: usize,
    pub keep: &'a (dyn Fn(&Object) -> bool + Sync),
}

/// Collects the objects of one bounded read, refusing once over the bound.
pub struct BoundedCollector<'a> {
    bound: &'a ListBound<'a>,
    bytes: usize,
    out: Vec<Arc<Object>>,
}

impl<'a> BoundedCollector<'a> {
    pub fn new(bound: &'a ListBound<'a>) -> Self {
        BoundedCollector { bound, bytes: 0, out: Vec::new() }
    }

    /// Takes `obj` if the bound keeps it; breaks once the collected JSON passes the bound.
    pub fn push(&mut self, obj: &Arc<Object>) -> ControlFlow<()> {
        if !(self.bound.keep)(obj) {
            return ControlFlow::Continue(());
        }
        self.bytes = self.bytes.saturating_add(obj.json().len());
        if self.bytes > self.bound.max_bytes {
            return ControlFlow::Break(());
        }
        self.out.push(obj.clone());
        ControlFlow::Continue(())
    }

    /// The objects collected, or the refusal when the bound was passed.
    pub fn finish(self) -> Result<Vec<Arc<Object>>, CacheReadError> {
        if self.bytes > self.bound.max_bytes {
            return Err(CacheReadError::TooLarge {
                max_bytes: self.bound.max_bytes,
                objects: self.out.len(),
            });
        }
        Ok(self.out)
    }

    /// Collects `objects` (already gathered) under the bound.
    pub fn collect(
        bound: &'a ListBound<'a>,
        objects: impl IntoIterator<Item = Arc<Object>>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        let mut c = BoundedCollector::new(bound);
        for o in objects {
            if c.push(&o).is_break() {
                break;
            }
        }
        c.finish()
    }
}

/// Read access to one kind's cache: what the runtime needs from an informer's indexer.
pub trait CacheReader: Send + Sync + 'static {
    /// The object stored under `key` (`namespace/name` or `name`).
    fn get(&self, key: &str) -> Option<Arc<Object>>;
    /// Every object, optionally only in `namespace`, optionally only those matching a
    /// Kubernetes label selector.
    fn list(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError>;
    /// Objects whose index `index` contains `value`.
    fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<Object>>, CacheReadError>;

    /// As [`list`](Self::list) under `bound`. The default lists first and then applies the
    /// bound; a cache that can stop its walk early overrides it.
    fn list_bounded(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
        bound: &ListBound<'_>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        BoundedCollector::collect(bound, self.list(namespace, label_selector)?)
    }

    /// As [`by_index`](Self::by_index) under `bound` (see [`list_bounded`](Self::list_bounded)).
    fn by_index_bounded(
        &self,
        index: &str,
        value: &str,
        bound: &ListBound<'_>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        BoundedCollector::collect(bound, self.by_index(index, value)?)
    }
}

fn parse_selector(label_selector: Option<&str>) -> Result<crate::cache::LabelSelector, CacheReadError> {
    match label_selector.filter(|s| !s.trim().is_empty()) {
        Some(text) => crate::cache::LabelSelector::parse(text)
            .map_err(|e| CacheReadError::InvalidSelector { selector: e.selector, reason: e.reason }),
        None => Ok(crate::cache::LabelSelector::default()),
    }
}

/// The informer's indexer is the production cache: label selectors use the cache
/// module's parser (the full Kubernetes syntax), indexes are the informer's. Bounded reads
/// walk the store under its read lock and stop at the bound.
impl CacheReader for crate::cache::Indexer {
    fn get(&self, key: &str) -> Option<Arc<Object>> {
        crate::cache::Indexer::get(self, key)
    }

    fn list(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        Ok(self.list_selected(namespace, &parse_selector(label_selector)?))
    }

    fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<Object>>, CacheReadError> {
        crate::cache::Indexer::by_index(self, index, value)
            .map_err(|_| CacheReadError::UnknownIndex(index.to_owned()))
    }

    fn list_bounded(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
        bound: &ListBound<'_>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        let selector = parse_selector(label_selector)?;
        let mut c = BoundedCollector::new(bound);
        self.visit_selected(namespace, &selector, |o| c.push(o));
        c.finish()
    }

    fn by_index_bounded(
        &self,
        index: &str,
        value: &str,
        bound: &ListBound<'_>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        let mut c = BoundedCollector::new(bound);
        self.visit_index(index, value, |o| c.push(o))
            .map_err(|_| CacheReadError::UnknownIndex(index.to_owned()))?;
        c.finish()
    }
}

/// The `cache` import's host context: the plugin's grants and one cache per readable kind.
pub(crate) struct CacheCtx {
    pub access: Arc<Access>,
    pub caches: HashMap<Gvk, Arc<dyn CacheReader>>,
}

/// What a `cache` call sees: the plugin's context and the call in progress.
pub(crate) struct CacheCtxView<'a> {
    pub ctx: &'a CacheCtx,
    pub call: &'a CallInfo,
}

/// Links `cache` with [`CacheCtxView`] as its host (the `D` of `add_to_linker`).
pub(crate) struct HasCache;

impl HasData for HasCache {
    type Data<'a> = CacheCtxView<'a>;
}

impl CacheCtxView<'_> {
    fn cache_for(
        &self,
        kind: &Gvk,
        namespace: Option<&str>,
        op: &'static str,
    ) -> Result<&Arc<dyn CacheReader>, WitError> {
        self.ctx.access.check_read(kind, self.call, op)?;
        self.ctx.access.check_namespace(kind, namespace, false, self.call, op)?;
        self.ctx.caches.get(kind).ok_or_else(|| {
            WitError::Unavailable(format!(
                "the host has no cache of {kind} for plugin {}",
                self.ctx.access.plugin()
            ))
        })
    }

    /// Runs a bounded read: only objects in the plugin's namespaces, at most its list budget.
    fn bounded(
        &self,
        kind: &Gvk,
        op: &'static str,
        read: impl FnOnce(&ListBound<'_>) -> Result<Vec<Arc<Object>>, CacheReadError>,
    ) -> Result<Vec<Vec<u8>>, WitError> {
        let access = &self.ctx.access;
        let keep = |o: &Object| access.in_scope(o.namespace());
        let bound = ListBound { max_bytes: access.list_budget(), keep: &keep };
        match read(&bound) {
            Ok(objects) => Ok(objects.iter().map(|o| o.json().to_vec()).collect()),
            Err(e @ CacheReadError::TooLarge { .. }) => {
                tracing::warn!(plugin = access.plugin(), request = self.call.request.as_deref().unwrap_or(""), kind = %kind, op, error = %e, "cache read refused: over the plugin's bound");
                Err(WitError::Invalid(format!("{op} of {kind}: {e}")))
            }
            Err(e) => Err(WitError::Invalid(e.to_string())),
        }
    }
}

fn gvk(kind: WitGvk) -> Gvk {
    Gvk { api_version: kind.api_version, kind: kind.kind }
}

impl Host for CacheCtxView<'_> {
    fn get(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        name: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, WitError>> {
        let _span =
            tracing::debug_span!(target: crate::telemetry::TARGET, "cache.get", kind = %kind.kind).entered();
        let kind = gvk(kind);
        let namespace = namespace.filter(|ns| !ns.is_empty());
        let cache = match self.cache_for(&kind, namespace.as_deref(), "cache.get") {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let key = key_of(namespace.as_deref(), &name);
        Ok(Ok(cache.get(&key).map(|o| o.json().to_vec())))
    }

    fn list(
        &mut self,
        kind: WitGvk,
        namespace: Option<String>,
        label_selector: Option<String>,
    ) -> wasmtime::Result<Result<Vec<Vec<u8>>, WitError>> {
        let _span =
            tracing::debug_span!(target: crate::telemetry::TARGET, "cache.list", kind = %kind.kind).entered();
        let kind = gvk(kind);
        let namespace = namespace.as_deref().filter(|ns| !ns.is_empty());
        let cache = match self.cache_for(&kind, namespace, "cache.list") {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        Ok(self.bounded(&kind, "cache.list", |bound| {
            cache.list_bounded(namespace, label_selector.as_deref(), bound)
        }))
    }

    fn by_index(
        &mut self,
        kind: WitGvk,
        index: String,
        value: String,
    ) -> wasmtime::Result<Result<Vec<Vec<u8>>, WitError>> {
        let _span =
            tracing::debug_span!(target: crate::telemetry::TARGET, "cache.by-index", kind = %kind.kind)
                .entered();
        let kind = gvk(kind);
        let cache = match self.cache_for(&kind, None, "cache.by-index") {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        Ok(self.bounded(&kind, "cache.by-index", |bound| cache.by_index_bounded(&index, &value, bound)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Writer;

    fn cm(ns: &str, name: &str, size: usize) -> Arc<Object> {
        let json = format!(
            r#"{{"metadata":{{"namespace":"{ns}","name":"{name}","labels":{{"app":"web"}}}},"data":{{"k":"{}"}}}}"#,
            "x".repeat(size)
        );
        Arc::new(Object::from_json(json.into()).unwrap())
    }

    #[test]
    fn bounded_reads_stop_at_the_bound_and_keep_only_what_the_scope_allows() {
        let w = Writer::new();
        for i in 0..20 {
            w.upsert(cm(if i % 2 == 0 { "a" } else { "b" }, &format!("o{i}"), 1000));
        }
        let idx = w.reader();
        let everything = |_: &Object| true;
        let only_a = |o: &Object| o.namespace() == Some("a");
        let wide = ListBound { max_bytes: 1 << 20, keep: &everything };
        assert_eq!(idx.list_bounded(None, Some("app=web"), &wide).unwrap().len(), 20);
        let scoped = ListBound { max_bytes: 1 << 20, keep: &only_a };
        let got = idx.list_bounded(None, None, &scoped).unwrap();
        assert!(got.len() == 10 && got.iter().all(|o| o.namespace() == Some("a")));
        assert_eq!(idx.by_index_bounded("namespace", "b", &scoped).unwrap().len(), 0);
        // Five objects fit; the walk stops at the sixth.
        let one = cm("a", "o0", 1000).json().len();
        let tight = ListBound { max_bytes: one * 5 + 10, keep: &everything };
        match idx.list_bounded(None, None, &tight) {
            Err(CacheReadError::TooLarge { objects, max_bytes }) => {
                assert_eq!((objects, max_bytes), (5, one * 5 + 10));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            idx.by_index_bounded("namespace", "a", &tight),
            Err(CacheReadError::TooLarge { .. })
        ));
        assert!(matches!(idx.by_index_bounded("nope", "a", &tight), Err(CacheReadError::UnknownIndex(_))));
        let message = CacheReadError::TooLarge { max_bytes: 10, objects: 1 }.to_string();
        assert!(message.contains("memory"), "{message}");
    }
}
