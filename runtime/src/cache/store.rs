//! The thread-safe indexed store (client-go's `threadSafeStore`) and its read handle.
//!
//! The store is split the way kube-runtime splits `reflector::store`: [`Indexer`] is the
//! cheap-to-clone, read-only handle every controller and plugin import holds, and
//! [`Writer`](super::Writer) is the one handle that can change the content, held by the
//! informer that feeds the store.
//!
//! Invariants (all kept under one `RwLock`):
//! - `items` holds at most one object per key; objects are shared `Arc`s, never copied.
//! - For every index `i` and object `o` in `items`, `o` is in `indices[i][v]` exactly for the
//!   values `v` of `i`'s function on `o`, and nothing else is in `indices[i]`. On update the
//!   old object's values are removed before the new ones are added; empty value sets are
//!   dropped so `list_index_values` only returns values some object has.
//! - The namespace index ([`NAMESPACE_INDEX`]) always exists.
//! - Nothing reachable from an [`Indexer`] takes the write lock.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use parking_lot::RwLock;

use super::index::{IndexError, IndexFunc, NAMESPACE_INDEX};
use super::selector::LabelSelector;
use crate::fifo::KnownObjects;
use crate::object::Object;

type Hasher_ = foldhash::fast::RandomState;

/// A set member keyed by the object's key, so sets need no separate key allocation.
#[derive(Clone)]
struct ByKey(Arc<Object>);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.key() == other.0.key()
    }
}
impl Eq for ByKey {}
impl Hash for ByKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.key().hash(state)
    }
}
impl Borrow<str> for ByKey {
    fn borrow(&self) -> &str {
        self.0.key()
    }
}

type KeySet = HashSet<ByKey, Hasher_>;
type Index = HashMap<Box<str>, KeySet, Hasher_>;

/// The store's content; only [`Writer`](super::Writer) calls the methods that change it.
#[derive(Default)]
pub(super) struct Inner {
    items: KeySet,
    indexers: BTreeMap<String, IndexFunc>,
    indices: HashMap<String, Index, Hasher_>,
}

impl Inner {
    /// The index named `name`, created if missing (`None` never happens). Looked up by `&str`:
    /// `entry` would need an owned name on every update.
    fn index_mut<'m>(indices: &'m mut HashMap<String, Index, Hasher_>, name: &str) -> Option<&'m mut Index> {
        if !indices.contains_key(name) {
            indices.insert(name.to_owned(), Index::default());
        }
        indices.get_mut(name)
    }

    fn add_to_indices(&mut self, obj: &Arc<Object>) {
        for (name, func) in &self.indexers {
            let Some(index) = Self::index_mut(&mut self.indices, name) else { continue };
            for v in func.values_of(obj).iter() {
                match index.get_mut(v) {
                    Some(set) => {
                        set.replace(ByKey(obj.clone()));
                    }
                    None => {
                        index.entry(v.into()).or_default().insert(ByKey(obj.clone()));
                    }
                }
            }
        }
    }

    fn remove_from_indices(&mut self, obj: &Object) {
        for (name, func) in &self.indexers {
            let Some(index) = self.indices.get_mut(name.as_str()) else { continue };
            for v in func.values_of(obj).iter() {
                if let Some(set) = index.get_mut(v) {
                    set.remove(obj.key());
                    if set.is_empty() {
                        index.remove(v);
                    }
                }
            }
        }
    }

    /// Moves `new` into the index entries of `old`'s key: stale values out, fresh ones in.
    fn update_indices(&mut self, old: &Object, new: &Arc<Object>) {
        for (name, func) in &self.indexers {
            let old_values = func.values_of(old);
            let new_values = func.values_of(new);
            let Some(index) = Self::index_mut(&mut self.indices, name) else { continue };
            for v in old_values.iter() {
                if !new_values.contains(v)
                    && let Some(set) = index.get_mut(v)
                {
                    set.remove(old.key());
                    if set.is_empty() {
                        index.remove(v);
                    }
                }
            }
            for v in new_values.iter() {
                // `replace` so the set holds the new Arc, letting the old object be freed.
                match index.get_mut(v) {
                    Some(set) => {
                        set.replace(ByKey(new.clone()));
                    }
                    None => {
                        index.entry(v.into()).or_default().insert(ByKey(new.clone()));
                    }
                }
            }
        }
    }

    pub(super) fn upsert(&mut self, obj: Arc<Object>) -> Option<Arc<Object>> {
        let old = self.items.replace(ByKey(obj.clone())).map(|b| b.0);
        match &old {
            Some(old) => self.update_indices(old, &obj),
            None => self.add_to_indices(&obj),
        }
        old
    }

    pub(super) fn delete(&mut self, key: &str) -> Option<Arc<Object>> {
        let old = self.items.take(key)?.0;
        self.remove_from_indices(&old);
        Some(old)
    }

    pub(super) fn clear(&mut self) {
        self.items.clear();
        self.indices.clear();
    }

    /// Adds index functions, indexing every stored object; all-or-nothing on a conflict.
    pub(super) fn add_indexers(&mut self, new: Vec<(String, IndexFunc)>) -> Result<(), IndexError> {
        for (name, func) in &new {
            if let Some(existing) = self.indexers.get(name)
                && !existing.same_as(func)
            {
                return Err(IndexError::Conflict {
                    name: name.clone(),
                    existing: format!("{existing:?}"),
                    requested: format!("{func:?}"),
                });
            }
        }
        for (name, func) in new {
            if self.indexers.contains_key(&name) {
                continue;
            }
            let mut index = Index::default();
            for b in &self.items {
                for v in func.values(&b.0) {
                    index.entry(v.into_boxed_str()).or_default().insert(b.clone());
                }
            }
            self.indices.insert(name.clone(), index);
            self.indexers.insert(name, func);
        }
        Ok(())
    }
}

/// A cheap-to-clone, read-only handle to an indexed object cache.
///
/// Readers get `Arc<Object>`s (shared, immutable). Every store has the namespace index;
/// the [`Writer`](super::Writer) that owns the store adds more and changes the content.
///
/// ```
/// use std::sync::Arc;
/// use wasmctrl_runtime::cache::{IndexFunc, IndexSpec, LabelSelector, NAMESPACE_INDEX, Writer};
/// use wasmctrl_runtime::object::Object;
///
/// let writer = Writer::new();
/// writer.add_indexers([("by-app".to_string(), IndexFunc::from_spec(IndexSpec::Label("app".into())).unwrap())]).unwrap();
/// let obj = |ns: &str, name: &str, app: &str| Arc::new(Object::from_json(format!(
///     r#"{{"metadata":{{"namespace":"{ns}","name":"{name}","labels":{{"app":"{app}"}}}}}}"#).into()).unwrap());
/// writer.upsert(obj("a", "one", "web"));
/// writer.upsert(obj("b", "two", "db"));
///
/// let reader = writer.reader(); // cheap: an Arc; it cannot write
/// assert_eq!(reader.get("a/one").unwrap().name(), "one");
/// assert_eq!(reader.by_index(NAMESPACE_INDEX, "b").unwrap().len(), 1);
/// assert_eq!(reader.by_index("by-app", "web").unwrap()[0].key(), "a/one");
/// let sel = LabelSelector::parse("app in (web,db)").unwrap();
/// assert_eq!(reader.list_selected(None, &sel).len(), 2);
/// assert_eq!(reader.list_selected(Some("a"), &sel).len(), 1);
/// ```
#[derive(Clone)]
pub struct Indexer {
    inner: Arc<RwLock<Inner>>,
}

impl Default for Indexer {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Indexer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.read();
        f.debug_struct("Indexer")
            .field("len", &inner.items.len())
            .field("indexes", &inner.indexers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Indexer {
    /// A handle on an empty store that has no writer, so it stays empty (a cache for a kind
    /// nothing feeds). A store with content comes from [`Writer::reader`](super::Writer::reader).
    pub fn new() -> Self {
        Self::fresh()
    }

    /// A new store with only the namespace index (its writer keeps the other handle).
    pub(super) fn fresh() -> Self {
        let mut inner = Inner::default();
        inner.indexers.insert(NAMESPACE_INDEX.to_owned(), IndexFunc::namespace());
        Self { inner: Arc::new(RwLock::new(inner)) }
    }

    /// The write lock, for the store's [`Writer`](super::Writer) only.
    pub(super) fn write(&self) -> parking_lot::RwLockWriteGuard<'_, Inner> {
        self.inner.write()
    }

    /// Whether two handles share one store.
    pub fn same_store(&self, other: &Indexer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    // ----- reads -----

    /// The object stored under `key` (`namespace/name` or `name`).
    pub fn get(&self, key: &str) -> Option<Arc<Object>> {
        self.inner.read().items.get(key).map(|b| b.0.clone())
    }

    /// The object with `namespace` and `name`.
    pub fn get_by_name(&self, namespace: Option<&str>, name: &str) -> Option<Arc<Object>> {
        self.get(&crate::object::key_of(namespace, name))
    }

    /// Every object, in no particular order.
    pub fn list(&self) -> Vec<Arc<Object>> {
        self.inner.read().items.iter().map(|b| b.0.clone()).collect()
    }

    /// Every key, in no particular order.
    pub fn keys(&self) -> Vec<String> {
        self.inner.read().items.iter().map(|b| b.0.key().to_owned()).collect()
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.inner.read().items.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Objects in `namespace` (or all, for `None`) whose labels match `selector`.
    pub fn list_selected(&self, namespace: Option<&str>, selector: &LabelSelector) -> Vec<Arc<Object>> {
        let inner = self.inner.read();
        let matching = |b: &ByKey| selector.matches(&b.0).then(|| b.0.clone());
        match namespace {
            None => inner.items.iter().filter_map(matching).collect(),
            Some(ns) => inner
                .indices
                .get(NAMESPACE_INDEX)
                .and_then(|idx| idx.get(ns))
                .map(|set| set.iter().filter_map(matching).collect())
                .unwrap_or_default(),
        }
    }

    /// Calls `f` with each object in `namespace` (or every object, for `None`) whose labels
    /// match `selector`, under the read lock, until `f` breaks: a caller that bounds what it
    /// collects never copies the rest. `f` must not call back into this store.
    pub fn visit_selected(
        &self,
        namespace: Option<&str>,
        selector: &LabelSelector,
        mut f: impl FnMut(&Arc<Object>) -> std::ops::ControlFlow<()>,
    ) {
        let inner = self.inner.read();
        let mut visit = |set: &KeySet| {
            for b in set {
                if selector.matches(&b.0) && f(&b.0).is_break() {
                    return;
                }
            }
        };
        match namespace {
            None => visit(&inner.items),
            Some(ns) => {
                if let Some(set) = inner.indices.get(NAMESPACE_INDEX).and_then(|idx| idx.get(ns)) {
                    visit(set);
                }
            }
        }
    }

    /// As [`visit_selected`](Self::visit_selected), over the objects whose index
    /// `index_name` has `value`.
    pub fn visit_index(
        &self,
        index_name: &str,
        value: &str,
        mut f: impl FnMut(&Arc<Object>) -> std::ops::ControlFlow<()>,
    ) -> Result<(), IndexError> {
        let inner = self.inner.read();
        let index = Self::index_of(&inner, index_name)?;
        for b in index.get(value).into_iter().flatten() {
            if f(&b.0).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Objects whose index `index_name` has `value`.
    pub fn by_index(&self, index_name: &str, value: &str) -> Result<Vec<Arc<Object>>, IndexError> {
        let inner = self.inner.read();
        let index = Self::index_of(&inner, index_name)?;
        Ok(index.get(value).map(|s| s.iter().map(|b| b.0.clone()).collect()).unwrap_or_default())
    }

    /// Keys of the objects whose index `index_name` has `value`.
    pub fn index_keys(&self, index_name: &str, value: &str) -> Result<Vec<String>, IndexError> {
        let inner = self.inner.read();
        let index = Self::index_of(&inner, index_name)?;
        Ok(index.get(value).map(|s| s.iter().map(|b| b.0.key().to_owned()).collect()).unwrap_or_default())
    }

    /// Every value index `index_name` currently holds.
    pub fn list_index_values(&self, index_name: &str) -> Result<Vec<String>, IndexError> {
        let inner = self.inner.read();
        let index = Self::index_of(&inner, index_name)?;
        Ok(index.keys().map(|v| v.to_string()).collect())
    }

    /// Objects sharing at least one value of index `index_name` with `obj`.
    pub fn index(&self, index_name: &str, obj: &Object) -> Result<Vec<Arc<Object>>, IndexError> {
        let inner = self.inner.read();
        let func =
            inner.indexers.get(index_name).ok_or_else(|| IndexError::UnknownIndex(index_name.into()))?;
        let index = Self::index_of(&inner, index_name)?;
        let values = func.values(obj);
        if let [single] = values.as_slice() {
            return Ok(index
                .get(single.as_str())
                .map(|s| s.iter().map(|b| b.0.clone()).collect())
                .unwrap_or_default());
        }
        let mut seen: HashSet<&str> = HashSet::new();
        let mut out = Vec::new();
        for v in &values {
            for b in index.get(v.as_str()).into_iter().flatten() {
                if seen.insert(b.0.key()) {
                    out.push(b.0.clone());
                }
            }
        }
        Ok(out)
    }

    /// Names of the indexes this store maintains.
    pub fn index_names(&self) -> Vec<String> {
        self.inner.read().indexers.keys().cloned().collect()
    }

    /// The function of index `name`, if defined.
    pub fn index_func(&self, name: &str) -> Option<IndexFunc> {
        self.inner.read().indexers.get(name).cloned()
    }

    fn index_of<'a>(inner: &'a Inner, name: &str) -> Result<&'a Index, IndexError> {
        static EMPTY: std::sync::OnceLock<Index> = std::sync::OnceLock::new();
        if !inner.indexers.contains_key(name) {
            return Err(IndexError::UnknownIndex(name.to_owned()));
        }
        Ok(inner.indices.get(name).unwrap_or_else(|| EMPTY.get_or_init(HashMap::default)))
    }
}

/// The store is what the informer's DeltaFIFO consults for the keys it already holds.
impl KnownObjects for Indexer {
    fn known_keys(&self) -> Vec<String> {
        self.keys()
    }
    fn known_object(&self, key: &str) -> Option<Arc<Object>> {
        self.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{IndexSpec, OwnerIndex, Writer};

    fn obj(ns: &str, name: &str, labels: &str) -> Arc<Object> {
        let json = format!(r#"{{"metadata":{{"namespace":"{ns}","name":"{name}","labels":{{{labels}}}}}}}"#);
        Arc::new(Object::from_json(json.into()).unwrap())
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    fn keys(v: Vec<Arc<Object>>) -> Vec<String> {
        sorted(v.into_iter().map(|o| o.key().to_owned()).collect())
    }

    // store_test.go: TestCache / doTestStore
    #[test]
    fn store_add_update_delete_list_get() {
        let w = Writer::new();
        let s = w.reader();
        w.upsert(obj("ns", "foo", r#""v":"1""#));
        assert_eq!(s.get("ns/foo").unwrap().label("v"), Some("1"));
        let old = w.upsert(obj("ns", "foo", r#""v":"2""#)).unwrap();
        assert_eq!(old.label("v"), Some("1"));
        assert_eq!(s.get("ns/foo").unwrap().label("v"), Some("2"));
        assert_eq!(w.delete("ns/foo").unwrap().label("v"), Some("2"));
        assert!(s.get("ns/foo").is_none());
        assert!(w.delete("ns/foo").is_none());

        w.upsert(obj("ns", "a", ""));
        w.upsert(obj("ns", "c", ""));
        w.upsert(obj("other", "e", ""));
        assert_eq!(sorted(s.keys()), ["ns/a", "ns/c", "other/e"]);
        assert_eq!(keys(s.list()), ["ns/a", "ns/c", "other/e"]);

        // Replace: afterwards exactly the given set.
        w.replace([obj("ns", "foo", ""), obj("ns", "bar", "")]);
        assert_eq!(sorted(s.keys()), ["ns/bar", "ns/foo"]);
        assert!(s.by_index(NAMESPACE_INDEX, "other").unwrap().is_empty());
        assert_eq!(s.list_index_values(NAMESPACE_INDEX).unwrap(), ["ns"]);
    }

    #[test]
    fn visits_stop_when_the_visitor_breaks() {
        use std::ops::ControlFlow;
        let w = Writer::new();
        let s = w.reader();
        for i in 0..10 {
            w.upsert(obj("ns", &format!("o{i}"), r#""app":"web""#));
        }
        w.upsert(obj("other", "x", r#""app":"web""#));
        let web = LabelSelector::parse("app=web").unwrap();
        let mut seen = 0;
        s.visit_selected(None, &web, |_| {
            seen += 1;
            if seen == 3 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        });
        assert_eq!(seen, 3);
        let mut in_other = Vec::new();
        s.visit_selected(Some("other"), &web, |o| {
            in_other.push(o.key().to_owned());
            ControlFlow::Continue(())
        });
        assert_eq!(in_other, ["other/x"]);
        let mut by_ns = 0;
        s.visit_index(NAMESPACE_INDEX, "ns", |_| {
            by_ns += 1;
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(by_ns, 10);
        assert!(s.visit_index("nope", "x", |_| ControlFlow::Continue(())).is_err());
    }

    fn with_label_index() -> (Writer, Indexer) {
        let w = Writer::new();
        let s = w.reader();
        w.add_indexers([("by-app".into(), IndexFunc::from_spec(IndexSpec::Label("app".into())).unwrap())])
            .unwrap();
        (w, s)
    }

    // index_test.go: TestGetIndexFuncValues / store_test.go: doTestIndex
    #[test]
    fn index_queries() {
        let w = Writer::new();
        let s = w.reader();
        let multi = IndexFunc::custom(|o| o.labels().map(|(_, v)| v.to_owned()).collect());
        w.add_indexers([("values".into(), multi)]).unwrap();
        w.upsert(obj("ns", "one", r#""a":"x","b":"y""#));
        w.upsert(obj("ns", "two", r#""a":"y""#));
        w.upsert(obj("ns", "three", r#""a":"z""#));
        assert_eq!(sorted(s.list_index_values("values").unwrap()), ["x", "y", "z"]);
        assert_eq!(keys(s.by_index("values", "y").unwrap()), ["ns/one", "ns/two"]);
        assert_eq!(sorted(s.index_keys("values", "y").unwrap()), ["ns/one", "ns/two"]);
        assert!(s.by_index("values", "nothing").unwrap().is_empty());
        // index(obj): everything sharing any value with "one" (x or y).
        let one = s.get("ns/one").unwrap();
        assert_eq!(keys(s.index("values", &one).unwrap()), ["ns/one", "ns/two"]);
        assert!(matches!(s.by_index("nope", "x"), Err(IndexError::UnknownIndex(_))));
        assert!(s.index_keys("nope", "x").is_err());
        assert!(s.list_index_values("nope").is_err());
    }

    // index_test.go: TestMultiIndexKeys / TestUpdateIndex — old values removed on update.
    #[test]
    fn update_moves_index_entries() {
        let (w, s) = with_label_index();
        w.upsert(obj("ns", "p", r#""app":"web""#));
        assert_eq!(s.index_keys("by-app", "web").unwrap(), ["ns/p"]);
        w.upsert(obj("ns", "p", r#""app":"db""#));
        assert!(s.index_keys("by-app", "web").unwrap().is_empty());
        assert_eq!(s.index_keys("by-app", "db").unwrap(), ["ns/p"]);
        assert_eq!(s.list_index_values("by-app").unwrap(), ["db"], "empty value sets are dropped");
        // by_index returns the newest object, not a stale one held by the index.
        let fresh = obj("ns", "p", r#""app":"db","v":"2""#);
        w.upsert(fresh.clone());
        assert!(Arc::ptr_eq(&s.by_index("by-app", "db").unwrap()[0], &fresh));
        w.upsert(obj("ns", "p", ""));
        assert!(s.list_index_values("by-app").unwrap().is_empty());
        w.delete("ns/p");
        assert!(s.list_index_values(NAMESPACE_INDEX).unwrap().is_empty());
    }

    // index_test.go: TestAddIndexerAfterAdd
    #[test]
    fn add_indexers_after_objects_exist_and_conflicts() {
        let w = Writer::new();
        let s = w.reader();
        w.upsert(obj("ns", "p", r#""app":"web""#));
        w.add_indexers([("by-app".into(), IndexFunc::from_spec(IndexSpec::Label("app".into())).unwrap())])
            .unwrap();
        assert_eq!(s.index_keys("by-app", "web").unwrap(), ["ns/p"]);
        // Same definition again: fine. Different one under the same name: refused.
        w.add_indexers([("by-app".into(), IndexFunc::from_spec(IndexSpec::Label("app".into())).unwrap())])
            .unwrap();
        let err = w
            .add_indexers([(
                "by-app".into(),
                IndexFunc::from_spec(IndexSpec::Owner(OwnerIndex::Uid)).unwrap(),
            )])
            .unwrap_err();
        assert!(matches!(err, IndexError::Conflict { .. }), "{err}");
    }

    #[test]
    fn list_with_selector_and_namespace() {
        let w = Writer::new();
        let s = w.reader();
        w.upsert(obj("a", "1", r#""app":"web""#));
        w.upsert(obj("a", "2", r#""app":"db""#));
        w.upsert(obj("b", "3", r#""app":"web""#));
        let web = LabelSelector::parse("app=web").unwrap();
        assert_eq!(keys(s.list_selected(None, &web)), ["a/1", "b/3"]);
        assert_eq!(keys(s.list_selected(Some("a"), &web)), ["a/1"]);
        assert_eq!(keys(s.list_selected(Some("a"), &LabelSelector::everything())), ["a/1", "a/2"]);
        assert!(s.list_selected(Some("zzz"), &web).is_empty());
    }

    #[test]
    fn concurrent_readers_and_writer() {
        let (w, s) = with_label_index();
        std::thread::scope(|scope| {
            let w = &w;
            scope.spawn(move || {
                for i in 0..500 {
                    w.upsert(obj("ns", &format!("o{}", i % 50), &format!(r#""app":"a{}""#, i % 7)));
                }
            });
            for _ in 0..2 {
                let r = s.clone();
                scope.spawn(move || {
                    for _ in 0..200 {
                        for v in r.list_index_values("by-app").unwrap() {
                            for o in r.by_index("by-app", &v).unwrap() {
                                assert_eq!(o.label("app"), Some(v.as_str()));
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(s.len(), 50);
    }
}
