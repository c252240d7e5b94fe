//! The in-memory object store behind every resource.
//!
//! Invariants:
//! - One mutex guards everything; every committed change takes the next value of one global
//!   resourceVersion counter, so resourceVersions are totally ordered across resources.
//! - A committed change is appended to its resource's bounded history and handed to every
//!   matching watcher *under the same lock*, so a watcher that registered at RV `n` sees every
//!   later change exactly once and in RV order. Watchers that fall `WATCH_CHANNEL` events
//!   behind are dropped (their stream ends; clients re-watch), like the API server's watch cache.
//! - Objects are stored as their encoded JSON (`Bytes`), encoded once per change and shared by
//!   list responses, history and every watcher.
//! - `compacted_rv` of a resource is the highest RV no longer in its history: a watch from an
//!   older RV fails with 410 Expired.
//! - The uid and owner indexes change only in `Inner::index`, called by `commit` and `restore`,
//!   so they always describe exactly the stored objects.
//!
//! The stages of a write live beside this file: `validate` (what a body may be and the
//! defaults the API server sets), `write` (create and update: validation, then one `commit`),
//! `delete` (deletion, finalizers and garbage collection, run to completion before the lock is
//! released), `watch` (what a watcher sees of a change).

mod delete;
mod validate;
mod watch;
mod write;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::resources::{GroupResource, Registry, ResourceInfo, crd_resource};
use crate::selector::{FieldSelector, LabelSelector};
use crate::util::{meta_mut, meta_str};

pub use delete::DeleteOpts;
use delete::GcItem;
use watch::Watcher;
pub use watch::{Event, EventType, WATCH_CHANNEL, WatchFilter, WatchItem, WatchStart, WatchStream};

/// `(namespace, name)`; namespace is empty for cluster-scoped objects.
pub type ObjKey = (String, String);

/// Metadata parsed from a stored object, used for filtering and indexes.
#[derive(Debug, Clone, Default)]
pub struct ObjMeta {
    /// Namespace ("" if cluster-scoped).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// resourceVersion.
    pub rv: u64,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// UIDs of the owners in ownerReferences.
    pub owners: Vec<String>,
    /// Finalizers.
    pub finalizers: Vec<String>,
    /// Whether deletionTimestamp is set.
    pub deleting: bool,
}

impl ObjMeta {
    fn from_value(v: &Value) -> Self {
        let m = v.get("metadata");
        let labels = m
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object)
            .map(|l| l.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string())).collect())
            .unwrap_or_default();
        let owners = m
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter().filter_map(|o| o.get("uid").and_then(Value::as_str).map(str::to_string)).collect()
            })
            .unwrap_or_default();
        Self {
            namespace: meta_str(v, "namespace").to_string(),
            name: meta_str(v, "name").to_string(),
            uid: meta_str(v, "uid").to_string(),
            rv: meta_str(v, "resourceVersion").parse().unwrap_or(0),
            labels,
            owners,
            finalizers: finalizers(v),
            deleting: m.and_then(|m| m.get("deletionTimestamp")).is_some_and(|d| !d.is_null()),
        }
    }

    fn key(&self) -> ObjKey {
        (self.namespace.clone(), self.name.clone())
    }
}

/// A stored object: encoded JSON plus parsed metadata.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The object's JSON.
    pub json: Bytes,
    /// Its metadata.
    pub meta: Arc<ObjMeta>,
}

struct Bucket {
    info: Arc<ResourceInfo>,
    objects: BTreeMap<ObjKey, Stored>,
    history: VecDeque<Arc<Event>>,
    compacted_rv: u64,
    watchers: Vec<Watcher>,
}

impl Bucket {
    fn new(info: Arc<ResourceInfo>, compacted_rv: u64) -> Self {
        Self { info, objects: BTreeMap::new(), history: VecDeque::new(), compacted_rv, watchers: Vec::new() }
    }
}

struct Inner {
    rv: u64,
    registry: Registry,
    buckets: HashMap<GroupResource, Bucket>,
    uids: HashMap<String, (GroupResource, ObjKey)>,
    dependents: HashMap<String, BTreeSet<(GroupResource, ObjKey)>>,
    history_size: usize,
    gc: Vec<GcItem>,
}

/// Options of a write.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    /// Don't persist (dryRun=All).
    pub dry_run: bool,
    /// The field manager recorded in managedFields.
    pub manager: Option<String>,
}

/// Which part of an object a write targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    /// The object itself (status ignored when a status subresource exists).
    Main,
    /// `/status`: only status changes.
    Status,
}

/// DeleteOptions that matter here./// How a list picks its snapshot.
#[derive(Debug, Clone, Default)]
pub struct ListOpts {
    /// Namespace, or all.
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
    /// `limit` (0 = none).
    pub limit: usize,
    /// Continue after this key.
    pub after: Option<ObjKey>,
    /// RV of the first page (from the continue token).
    pub continue_rv: Option<u64>,
    /// `resourceVersion` + `resourceVersionMatch=Exact`.
    pub exact_rv: Option<u64>,
}

/// A list result.
#[derive(Debug)]
pub struct ListResult {
    /// Matching objects' JSON, ordered by key.
    pub items: Vec<Bytes>,
    /// The list's resourceVersion.
    pub rv: u64,
    /// Key to continue after, when truncated by `limit`.
    pub next: Option<ObjKey>,
    /// How many more items match after this page.
    pub remaining: usize,
}

/// A snapshot of all objects, for persistence.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// The resourceVersion counter.
    pub resource_version: u64,
    /// Objects per `group/resource` (CRDs first so their kinds load).
    pub objects: Vec<(GroupResource, Vec<Value>)>,
}

/// The store.
pub struct Store {
    inner: Mutex<Inner>,
    /// Highest RV whose event has been dispatched to all watchers (for bookmarks).
    dispatched_rv: AtomicU64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("rv", &self.current_rv()).finish()
    }
}

fn finalizers(v: &Value) -> Vec<String> {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

fn encode(v: &Value) -> Result<Bytes, ApiError> {
    let mut buf = serde_json::to_vec(v).map_err(|e| ApiError::internal(format!("encoding object: {e}")))?;
    // The encoded bytes are kept for the object's lifetime: drop the growth slack.
    buf.shrink_to_fit();
    Ok(Bytes::from(buf))
}

fn decode(b: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(b).map_err(|e| ApiError::internal(format!("decoding stored object: {e}")))
}

fn namespaces_gr() -> GroupResource {
    GroupResource { group: String::new(), resource: "namespaces".into() }
}

fn crd_gr() -> GroupResource {
    GroupResource { group: "apiextensions.k8s.io".into(), resource: "customresourcedefinitions".into() }
}

impl Store {
    /// A store serving the built-in kinds with the `default` namespace (and the usual
    /// `kube-system`, `kube-public`, `kube-node-lease`), keeping `history_size` events per
    /// resource.
    pub fn new(history_size: usize) -> Self {
        let registry = Registry::builtin();
        let buckets = registry.all().map(|i| (i.gr.clone(), Bucket::new(i.clone(), 0))).collect();
        let store = Self {
            inner: Mutex::new(Inner {
                rv: 0,
                registry,
                buckets,
                uids: HashMap::new(),
                dependents: HashMap::new(),
                history_size: history_size.max(1),
                gc: Vec::new(),
            }),
            dispatched_rv: AtomicU64::new(0),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            // Cannot fail: fresh store, valid names.
            let _ = store.create(&namespaces_gr(), "", obj, &WriteOpts::default());
        }
        store
    }

    /// The registry (a clone: resources change only on CRD writes).
    pub fn registry(&self) -> Registry {
        self.inner.lock().registry.clone()
    }

    /// The current resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.dispatched_rv.load(Ordering::Acquire)
    }

    /// Get one object.
    pub fn get(&self, gr: &GroupResource, ns: &str, name: &str) -> Result<Bytes, ApiError> {
        let inner = self.inner.lock();
        let bucket = inner.bucket(gr)?;
        bucket
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .map(|s| s.json.clone())
            .ok_or_else(|| ApiError::not_found(&gr.group, &gr.resource, name))
    }

    /// List objects.
    pub fn list(&self, gr: &GroupResource, opts: &ListOpts) -> Result<ListResult, ApiError> {
        let inner = self.inner.lock();
        let bucket = inner.bucket(gr)?;
        if let Some(rv) = opts.exact_rv
            && rv != inner.rv
        {
            return Err(ApiError::expired(format!("too old resource version: {rv} ({})", inner.rv)));
        }
        if let Some(crv) = opts.continue_rv
            && crv < bucket.compacted_rv
        {
            return Err(ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
            ));
        }
        let filter = WatchFilter {
            namespace: opts.namespace.clone(),
            labels: opts.labels.clone(),
            fields: opts.fields.clone(),
        };
        let range: Box<dyn Iterator<Item = (&ObjKey, &Stored)>> =
            match (&opts.after, &opts.namespace) {
                (Some(after), _) => Box::new(bucket.objects.range::<ObjKey, _>((
                    std::ops::Bound::Excluded(after.clone()),
                    std::ops::Bound::Unbounded,
                ))),
                (None, Some(ns)) if bucket.info.namespaced => {
                    Box::new(bucket.objects.range::<ObjKey, _>((ns.clone(), String::new())..))
                }
                _ => Box::new(bucket.objects.iter()),
            };
        let mut items = Vec::new();
        let mut next = None;
        let mut remaining = 0;
        for (key, s) in range {
            if let Some(ns) = &opts.namespace
                && bucket.info.namespaced
                && key.0 != *ns
            {
                if key.0 > *ns {
                    break;
                }
                continue;
            }
            if !filter.matches(&s.meta, &s.json) {
                continue;
            }
            if opts.limit > 0 && items.len() >= opts.limit {
                remaining += 1;
                continue;
            }
            if opts.limit > 0 && items.len() + 1 == opts.limit {
                next = Some(key.clone());
            }
            items.push(s.json.clone());
        }
        if remaining == 0 {
            next = None;
        }
        Ok(ListResult { items, rv: opts.continue_rv.unwrap_or(inner.rv), next, remaining })
    }
    /// Create an object (in the storage version). Returns the stored JSON.
    pub fn create(
        &self,
        gr: &GroupResource,
        ns: &str,
        obj: Value,
        opts: &WriteOpts,
    ) -> Result<Bytes, ApiError> {
        let mut inner = self.inner.lock();
        let out = inner.create(gr, ns, obj, opts)?;
        inner.run_gc();
        self.publish(&inner);
        Ok(out)
    }

    /// Read-modify-write one object: `f` gets the current object (None if absent) and returns
    /// the desired one. `create_if_missing` lets `f` create (server-side apply). A
    /// `metadata.resourceVersion` in the result is a precondition (409 if stale).
    #[allow(clippy::too_many_arguments)]
    pub fn modify<F>(
        &self,
        gr: &GroupResource,
        ns: &str,
        name: &str,
        sub: Subresource,
        opts: &WriteOpts,
        create_if_missing: bool,
        f: F,
    ) -> Result<(Bytes, bool), ApiError>
    where
        F: FnOnce(Option<Value>, &ResourceInfo) -> Result<Value, ApiError>,
    {
        let mut inner = self.inner.lock();
        let info = inner.bucket(gr)?.info.clone();
        let key = (ns.to_string(), name.to_string());
        let current = inner.bucket(gr)?.objects.get(&key).cloned();
        let out = match current {
            None => {
                if !create_if_missing {
                    return Err(ApiError::not_found(&gr.group, &gr.resource, name));
                }
                let mut obj = f(None, &info)?;
                let m = meta_mut(&mut obj);
                if m.get("name").and_then(Value::as_str).is_none_or(|n| n.is_empty()) {
                    m.insert("name".into(), Value::String(name.into()));
                }
                (inner.create(gr, ns, obj, opts)?, true)
            }
            Some(cur) => {
                let old = decode(&cur.json)?;
                let new = f(Some(old.clone()), &info)?;
                (inner.update(gr, &key, &cur, old, new, sub, opts)?, false)
            }
        };
        inner.run_gc();
        self.publish(&inner);
        Ok(out)
    }

    /// Delete one object. Returns the object's final (or deletion-pending) state.
    pub fn delete(
        &self,
        gr: &GroupResource,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Bytes, ApiError> {
        let mut inner = self.inner.lock();
        let out = inner.delete(gr, &(ns.to_string(), name.to_string()), opts)?;
        inner.run_gc();
        self.publish(&inner);
        Ok(out)
    }

    /// Delete every object matching `list` (deletecollection). Returns the deleted objects.
    pub fn delete_collection(
        &self,
        gr: &GroupResource,
        list: &ListOpts,
        opts: &DeleteOpts,
    ) -> Result<Vec<Bytes>, ApiError> {
        let keys: Vec<ObjKey> = {
            let inner = self.inner.lock();
            let bucket = inner.bucket(gr)?;
            let filter = WatchFilter {
                namespace: list.namespace.clone(),
                labels: list.labels.clone(),
                fields: list.fields.clone(),
            };
            bucket
                .objects
                .iter()
                .filter(|(_, s)| filter.matches(&s.meta, &s.json))
                .map(|(k, _)| k.clone())
                .collect()
        };
        let mut out = Vec::new();
        let mut inner = self.inner.lock();
        for key in keys {
            match inner.delete(gr, &key, opts) {
                Ok(b) => out.push(b),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        inner.run_gc();
        self.publish(&inner);
        Ok(out)
    }

    fn publish(&self, inner: &Inner) {
        self.dispatched_rv.store(inner.rv, Ordering::Release);
    }
    /// Fault: forget all history, so watches from any RV before now get 410.
    pub fn compact(&self) {
        let mut inner = self.inner.lock();
        let rv = inner.rv;
        for b in inner.buckets.values_mut() {
            b.history.clear();
            b.compacted_rv = rv;
        }
    }

    /// Number of objects stored across all resources.
    pub fn object_count(&self) -> usize {
        self.inner.lock().buckets.values().map(|b| b.objects.len()).sum()
    }

    /// A snapshot of all objects (CRDs first).
    pub fn snapshot(&self) -> Result<Snapshot, ApiError> {
        let inner = self.inner.lock();
        let mut objects = Vec::new();
        let mut grs: Vec<&GroupResource> = inner.buckets.keys().collect();
        grs.sort_by_key(|gr| (**gr != crd_gr(), (*gr).clone()));
        for gr in grs {
            let b = &inner.buckets[gr];
            let items = b.objects.values().map(|s| decode(&s.json)).collect::<Result<Vec<_>, _>>()?;
            if !items.is_empty() {
                objects.push((gr.clone(), items));
            }
        }
        Ok(Snapshot { resource_version: inner.rv, objects })
    }

    /// Load a snapshot into an empty-ish store (objects are inserted as they were, keeping
    /// uids and resourceVersions; CRDs register their kinds).
    pub fn restore(&self, snap: Snapshot) -> Result<(), ApiError> {
        let mut inner = self.inner.lock();
        inner.rv = inner.rv.max(snap.resource_version);
        for (gr, items) in snap.objects {
            for obj in items {
                if gr == crd_gr() {
                    let info = crd_resource(&obj).map_err(|e| {
                        ApiError::invalid(&gr.group, "CustomResourceDefinition", meta_str(&obj, "name"), e)
                    })?;
                    inner.register(info);
                }
                inner.bucket(&gr)?;
                let json = encode(&obj)?;
                let meta = Arc::new(ObjMeta::from_value(&obj));
                inner.index(&gr, None, Some(&meta));
                if let Some(b) = inner.buckets.get_mut(&gr) {
                    b.objects.insert(meta.key(), Stored { json, meta });
                }
            }
        }
        let rv = inner.rv;
        for b in inner.buckets.values_mut() {
            b.compacted_rv = rv;
        }
        self.publish(&inner);
        Ok(())
    }

    /// The resource for `apiVersion`/`kind`, if served.
    pub fn resource_for_kind(&self, api_version: &str, kind: &str) -> Option<(Arc<ResourceInfo>, String)> {
        self.inner.lock().registry.by_kind(api_version, kind)
    }
}

impl Inner {
    fn bucket(&self, gr: &GroupResource) -> Result<&Bucket, ApiError> {
        self.buckets.get(gr).ok_or_else(|| ApiError::not_found(&gr.group, &gr.resource, ""))
    }

    fn bucket_mut(&mut self, gr: &GroupResource) -> Result<&mut Bucket, ApiError> {
        self.buckets.get_mut(gr).ok_or_else(|| ApiError::not_found(&gr.group, &gr.resource, ""))
    }

    fn register(&mut self, info: ResourceInfo) {
        let rv = self.rv;
        let info = Arc::new(info);
        self.registry.insert((*info).clone());
        match self.buckets.get_mut(&info.gr) {
            Some(b) => b.info = info,
            None => {
                self.buckets.insert(info.gr.clone(), Bucket::new(info.clone(), rv));
            }
        }
    }

    /// Keeps the uid and owner indexes in step with a change from `old` to `new`.
    fn index(&mut self, gr: &GroupResource, old: Option<&Arc<ObjMeta>>, new: Option<&Arc<ObjMeta>>) {
        if let Some(o) = old {
            for owner in &o.owners {
                if let Some(set) = self.dependents.get_mut(owner) {
                    set.remove(&(gr.clone(), o.key()));
                    if set.is_empty() {
                        self.dependents.remove(owner);
                    }
                }
            }
            if new.is_none() {
                self.uids.remove(&o.uid);
            }
        }
        if let Some(n) = new {
            for owner in &n.owners {
                self.dependents.entry(owner.clone()).or_default().insert((gr.clone(), n.key()));
            }
            self.uids.insert(n.uid.clone(), (gr.clone(), n.key()));
        }
    }

    /// Assigns the next RV to `obj`, stores it (or removes it for DELETED), records history
    /// and dispatches to watchers.
    fn commit(
        &mut self,
        gr: &GroupResource,
        mut obj: Value,
        ty: EventType,
        prev: Option<&Stored>,
    ) -> Result<Bytes, ApiError> {
        self.rv += 1;
        let rv = self.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(rv.to_string()));
        let json = encode(&obj)?;
        let meta = Arc::new(ObjMeta::from_value(&obj));
        let key = meta.key();
        self.index(gr, prev.map(|p| &p.meta), (ty != EventType::Deleted).then_some(&meta));
        let history_size = self.history_size;
        let bucket = self.bucket_mut(gr)?;
        if ty == EventType::Deleted {
            bucket.objects.remove(&key);
        } else {
            bucket.objects.insert(key, Stored { json: json.clone(), meta: meta.clone() });
        }
        let event = Arc::new(Event {
            rv,
            ty,
            object: json.clone(),
            meta,
            prev: prev.filter(|_| ty == EventType::Modified).map(|p| p.meta.clone()),
            prev_object: prev.filter(|_| ty == EventType::Modified).map(|p| p.json.clone()),
        });
        bucket.history.push_back(event.clone());
        while bucket.history.len() > history_size {
            if let Some(old) = bucket.history.pop_front() {
                bucket.compacted_rv = old.rv;
            }
        }
        bucket.watchers.retain(|w| {
            if w.filter.view(&event).is_none() {
                return !w.tx.is_closed();
            }
            w.tx.try_send(WatchItem::Event(event.clone())).is_ok()
        });
        Ok(json)
    }
}
