//! Host side of the `cache` import: reads from the informer caches of the kinds the
//! plugin declared.
//!
//! Layering: [`CacheCtx`] (one per plugin, shared by its instances) is this interface's
//! whole host context; the linker reaches it through [`CacheCtxView`], built from the
//! store's state by a getter (as wasmtime's WASI host code does per interface). This
//! module knows nothing of the store's state or of the other imports.
//!
//! Invariants: a kind the plugin did not declare readable is refused with `forbidden`
//! (and logged) before any cache is touched; objects go to the guest as the cached JSON
//! bytes, never re-serialised.

use std::collections::HashMap;
use std::sync::Arc;

use wasmtime::component::HasData;

use super::access::Access;
use super::bindings::wasmctrl::controller::cache::Host;
use super::bindings::wasmctrl::controller::types::{Error as WitError, Gvk as WitGvk};
use super::call::CallInfo;
use super::spec::Gvk;
use crate::object::{Object, key_of};

/// Why a cache read was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheReadError {
    #[error("invalid label selector {selector:?}: {reason}")]
    InvalidSelector { selector: String, reason: String },
    #[error("no index named {0:?} on this kind (declare it in the plugin's TOML)")]
    UnknownIndex(String),
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
}

/// The informer's indexer is the production cache: label selectors use the cache
/// module's parser (the full Kubernetes syntax), indexes are the informer's.
impl CacheReader for crate::cache::Indexer {
    fn get(&self, key: &str) -> Option<Arc<Object>> {
        crate::cache::Indexer::get(self, key)
    }

    fn list(
        &self,
        namespace: Option<&str>,
        label_selector: Option<&str>,
    ) -> Result<Vec<Arc<Object>>, CacheReadError> {
        let selector = match label_selector.filter(|s| !s.trim().is_empty()) {
            Some(text) => crate::cache::LabelSelector::parse(text)
                .map_err(|e| CacheReadError::InvalidSelector { selector: e.selector, reason: e.reason })?,
            None => crate::cache::LabelSelector::default(),
        };
        Ok(self.list_selected(namespace, &selector))
    }

    fn by_index(&self, index: &str, value: &str) -> Result<Vec<Arc<Object>>, CacheReadError> {
        crate::cache::Indexer::by_index(self, index, value)
            .map_err(|_| CacheReadError::UnknownIndex(index.to_owned()))
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
    fn cache_for(&self, kind: WitGvk, op: &'static str) -> Result<&Arc<dyn CacheReader>, WitError> {
        let kind = Gvk { api_version: kind.api_version, kind: kind.kind };
        self.ctx.access.check_read(&kind, self.call, op)?;
        self.ctx.caches.get(&kind).ok_or_else(|| {
            WitError::Unavailable(format!(
                "the host has no cache of {kind} for plugin {}",
                self.ctx.access.plugin()
            ))
        })
    }
}

fn to_json_list(objects: Vec<Arc<Object>>) -> Vec<Vec<u8>> {
    objects.iter().map(|o| o.json().to_vec()).collect()
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
        let cache = match self.cache_for(kind, "cache.get") {
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
        let cache = match self.cache_for(kind, "cache.list") {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let namespace = namespace.as_deref().filter(|ns| !ns.is_empty());
        Ok(cache
            .list(namespace, label_selector.as_deref())
            .map(to_json_list)
            .map_err(|e| WitError::Invalid(e.to_string())))
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
        let cache = match self.cache_for(kind, "cache.by-index") {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        Ok(cache.by_index(&index, &value).map(to_json_list).map_err(|e| WitError::Invalid(e.to_string())))
    }
}
