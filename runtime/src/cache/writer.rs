//! The one handle that changes an indexed store (kube-runtime's `reflector::store::Writer`).
//!
//! Invariants: a [`Writer`] is not `Clone`, so each store has exactly one; the informer that
//! feeds the store owns it, and everyone else holds the read-only [`Indexer`] it hands out.
//! Each write takes the store's lock once, so readers see it whole or not at all.

use std::sync::Arc;

use super::index::{IndexError, IndexFunc};
use super::store::Indexer;
use crate::object::Object;

/// The write side of an indexed object cache.
///
/// ```
/// use std::sync::Arc;
/// use wasmctrl_runtime::cache::Writer;
/// use wasmctrl_runtime::object::Object;
///
/// let writer = Writer::new();
/// let reader = writer.reader();
/// writer.upsert(Arc::new(Object::from_json(r#"{"metadata":{"name":"a"}}"#.into()).unwrap()));
/// assert_eq!(reader.keys(), ["a"]);
/// writer.delete("a");
/// assert!(reader.is_empty());
/// ```
pub struct Writer {
    store: Indexer,
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Writer").field(&self.store).finish()
    }
}

impl Writer {
    /// A new, empty store with only the namespace index, and its writer.
    pub fn new() -> Self {
        Self { store: Indexer::fresh() }
    }

    /// A read-only handle on this writer's store (cheap: an `Arc`).
    pub fn reader(&self) -> Indexer {
        self.store.clone()
    }

    /// Adds index functions, indexing every object already stored. Redefining an index with
    /// the same definition is a no-op; with a different one it is an error (nothing changes).
    pub fn add_indexers(
        &self,
        indexers: impl IntoIterator<Item = (String, IndexFunc)>,
    ) -> Result<(), IndexError> {
        self.store.write().add_indexers(indexers.into_iter().collect())
    }

    /// Inserts or replaces the object under its key; returns the previous one.
    pub fn upsert(&self, obj: Arc<Object>) -> Option<Arc<Object>> {
        self.store.write().upsert(obj)
    }

    /// Removes the object stored under `key`; returns it.
    pub fn delete(&self, key: &str) -> Option<Arc<Object>> {
        self.store.write().delete(key)
    }

    /// Replaces the whole content with `objects`, rebuilding every index.
    pub fn replace(&self, objects: impl IntoIterator<Item = Arc<Object>>) {
        let mut inner = self.store.write();
        inner.clear();
        for obj in objects {
            inner.upsert(obj);
        }
    }

    /// Removes every object.
    pub fn clear(&self) {
        self.store.write().clear();
    }
}
