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

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::managed;
use crate::resources::{GroupResource, Registry, ResourceInfo, crd_resource, split_api_version};
use crate::selector::{FieldSelector, LabelSelector};
use crate::util::{meta_mut, meta_str, new_uid, now_rfc3339, random_suffix, valid_label_name, valid_name};

/// Capacity of each watcher's channel; a watcher further behind than this is dropped.
pub const WATCH_CHANNEL: usize = 65_536;

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

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// ADDED
    Added,
    /// MODIFIED
    Modified,
    /// DELETED
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change, shared by the history and all watchers.
#[derive(Debug)]
pub struct Event {
    /// The RV of the change.
    pub rv: u64,
    /// What happened.
    pub ty: EventType,
    /// The object after the change (for DELETED: its last state, carrying the deletion RV).
    pub object: Bytes,
    /// Metadata of `object`.
    pub meta: Arc<ObjMeta>,
    /// Metadata before the change (MODIFIED only), for selector transitions.
    pub prev: Option<Arc<ObjMeta>>,
    /// The object before the change (MODIFIED only), for field selectors on other fields.
    pub prev_object: Option<Bytes>,
}

/// What a watcher selects.
#[derive(Debug, Clone, Default)]
pub struct WatchFilter {
    /// Namespace, or all.
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, meta: &ObjMeta, json: &Bytes) -> bool {
        if let Some(ns) = &self.namespace
            && *ns != meta.namespace
        {
            return false;
        }
        if !self.labels.matches(&meta.labels) {
            return false;
        }
        if self.fields.is_empty() {
            return true;
        }
        if self.fields.only_metadata() {
            return self.fields.matches(&meta.name, &meta.namespace, None);
        }
        let parsed: Option<Value> = serde_json::from_slice(json).ok();
        self.fields.matches(&meta.name, &meta.namespace, parsed.as_ref())
    }

    /// How a change shows to this watcher: `None` if not at all.
    pub fn view(&self, ev: &Event) -> Option<EventType> {
        let now = self.matches(&ev.meta, &ev.object);
        match (ev.ty, &ev.prev, &ev.prev_object) {
            (EventType::Modified, Some(prev), Some(prev_obj)) => {
                let before = self.matches(prev, prev_obj);
                match (before, now) {
                    (true, true) => Some(EventType::Modified),
                    (false, true) => Some(EventType::Added),
                    (true, false) => Some(EventType::Deleted),
                    (false, false) => None,
                }
            }
            (ty, _, _) => now.then_some(ty),
        }
    }
}

/// An item delivered to a watcher.
#[derive(Debug, Clone)]
pub enum WatchItem {
    /// A change (the watcher applies its own filter view).
    Event(Arc<Event>),
}

struct Watcher {
    filter: WatchFilter,
    tx: mpsc::Sender<WatchItem>,
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

/// Work the garbage collector still has to do after a write.
#[derive(Debug, Clone)]
enum GcItem {
    /// An object went away: its dependents may be orphaned, its foreground owners unblocked.
    Gone { gr: GroupResource, meta: Arc<ObjMeta> },
    /// An object entered (or is in) deletion: orphan / foreground / namespace / CRD handling.
    Deleting { gr: GroupResource, key: ObjKey },
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

/// DeleteOptions that matter here.
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `propagationPolicy`: Orphan, Background or Foreground.
    pub propagation: Option<String>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// dryRun=All.
    pub dry_run: bool,
}

/// How a list picks its snapshot.
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

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED for the current state, then changes.
    Current,
    /// Changes after this RV (replayed from history).
    After(u64),
}

/// A registered watch: replayed/initial events and the live channel.
pub struct WatchStream {
    /// Events to send first (initial state or history replay), in order.
    pub initial: Vec<Arc<Event>>,
    /// RV of the store when the watch registered.
    pub start_rv: u64,
    /// Live changes.
    pub rx: mpsc::Receiver<WatchItem>,
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

/// The API server's checks of `metadata.ownerReferences`: apiVersion, kind, name and uid are
/// required, and at most one reference is the controller.
fn validate_owner_references(
    gr: &GroupResource,
    info: &ResourceInfo,
    name: &str,
    obj: &Value,
) -> Result<(), ApiError> {
    let Some(refs) = obj.pointer("/metadata/ownerReferences").and_then(Value::as_array) else {
        return Ok(());
    };
    let invalid = |why: String| ApiError::invalid(&gr.group, &info.kind, name, why);
    let mut controllers = 0;
    for r in refs {
        let field = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        for (key, what) in [("apiVersion", "version"), ("kind", "kind"), ("name", "name"), ("uid", "uid")] {
            if field(key).is_empty() {
                let shown = if key == "apiVersion" { "apiVersion" } else { key };
                return Err(invalid(format!(
                    "metadata.ownerReferences.{shown}: Invalid value: \"\": {what} must not be empty"
                )));
            }
        }
        if r.get("controller").and_then(Value::as_bool) == Some(true) {
            controllers += 1;
        }
    }
    if controllers > 1 {
        return Err(invalid(
            "metadata.ownerReferences: Invalid value: []v1.OwnerReference: Only one reference can have Controller set to true"
                .into(),
        ));
    }
    Ok(())
}

/// Whether objects of a resource carry `metadata.generation`. The API server sets it only where
/// a strategy tracks spec changes: custom resources, CRDs and the workload kinds (of those
/// served here, Deployments); ConfigMaps, Secrets, Services, Pods, Namespaces, Leases and
/// Events have none.
fn tracks_generation(gr: &GroupResource, info: &ResourceInfo) -> bool {
    info.custom || *gr == crd_gr() || gr.group == "apps"
}

/// Everything outside `metadata` (and `status` when it is a subresource), for the
/// generation rule.
fn spec_part(v: &Value, status_sub: bool) -> Map<String, Value> {
    let mut m = v.as_object().cloned().unwrap_or_default();
    for k in ["metadata", "apiVersion", "kind"] {
        m.remove(k);
    }
    if status_sub {
        m.remove("status");
    }
    m
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

    /// Start a watch.
    pub fn watch(
        &self,
        gr: &GroupResource,
        filter: WatchFilter,
        start: WatchStart,
    ) -> Result<WatchStream, ApiError> {
        let mut inner = self.inner.lock();
        let current = inner.rv;
        let bucket = inner.bucket_mut(gr)?;
        let initial: Vec<Arc<Event>> = match start {
            WatchStart::After(rv) => {
                if rv < bucket.compacted_rv {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        bucket.compacted_rv
                    )));
                }
                let from = bucket.history.partition_point(|e| e.rv <= rv);
                bucket.history.range(from..).filter(|e| filter.view(e).is_some()).cloned().collect()
            }
            WatchStart::Current => bucket
                .objects
                .values()
                .filter(|s| filter.matches(&s.meta, &s.json))
                .map(|s| {
                    Arc::new(Event {
                        rv: s.meta.rv,
                        ty: EventType::Added,
                        object: s.json.clone(),
                        meta: s.meta.clone(),
                        prev: None,
                        prev_object: None,
                    })
                })
                .collect(),
        };
        let (tx, rx) = mpsc::channel(WATCH_CHANNEL);
        bucket.watchers.push(Watcher { filter, tx });
        Ok(WatchStream { initial, start_rv: current, rx })
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

    /// Fault: end every watch stream now.
    pub fn drop_watches(&self) {
        let mut inner = self.inner.lock();
        for b in inner.buckets.values_mut() {
            b.watchers.clear();
        }
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

    fn create(
        &mut self,
        gr: &GroupResource,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Bytes, ApiError> {
        let info = self.bucket(gr)?.info.clone();
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body of the request must be a JSON object"));
        }
        check_kind(&obj, &info)?;
        validate_owner_references(gr, &info, meta_str(&obj, "name"), &obj)?;
        obj["apiVersion"] = Value::String(info.api_version(info.storage_version()));
        obj["kind"] = Value::String(info.kind.clone());
        let meta = meta_mut(&mut obj);
        let mut name = meta.get("name").and_then(Value::as_str).unwrap_or("").to_string();
        if name.is_empty() {
            match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    name = format!("{prefix}{}", random_suffix());
                    meta.insert("name".into(), Value::String(name.clone()));
                }
                _ => {
                    return Err(ApiError::invalid(
                        &gr.group,
                        &info.kind,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            }
        }
        let name_ok = if gr == &namespaces_gr() {
            valid_label_name(&name)
        } else {
            valid_name(&name) || info.custom && !name.is_empty()
        };
        if !name_ok {
            return Err(ApiError::invalid(
                &gr.group,
                &info.kind,
                &name,
                format!(
                    "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            ));
        }
        if info.namespaced {
            let body_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta.insert("namespace".into(), Value::String(ns.into()));
        } else {
            meta.remove("namespace");
        }
        for k in ["deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"] {
            meta.remove(k);
        }
        meta.insert("uid".into(), Value::String(new_uid()));
        meta.insert("creationTimestamp".into(), Value::String(now_rfc3339()));
        if tracks_generation(gr, &info) {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
        if info.namespaced {
            self.check_namespace(ns)?;
        }
        let key = (if info.namespaced { ns.to_string() } else { String::new() }, name.clone());
        if self.bucket(gr)?.objects.contains_key(&key) {
            return Err(ApiError::already_exists(&gr.group, &gr.resource, &name));
        }
        if info.status_subresource && info.custom {
            // CRDs with a status subresource ignore status on create.
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        default_object(gr, &mut obj, &name);
        fold_string_data(gr, &mut obj);
        if *gr == crd_gr() {
            let new_info = self.validate_crd(&obj, &name)?;
            set_crd_status(&mut obj, &new_info);
            if !opts.dry_run {
                self.register(new_info);
            }
        }
        if let Some(manager) = &opts.manager {
            managed::record_update(None, &mut obj, manager, &info.api_version(info.storage_version()));
        }
        if opts.dry_run {
            return encode(&obj);
        }
        self.commit(gr, obj, EventType::Added, None)
    }

    fn validate_crd(&self, obj: &Value, name: &str) -> Result<ResourceInfo, ApiError> {
        let info = crd_resource(obj)
            .map_err(|e| ApiError::invalid("apiextensions.k8s.io", "CustomResourceDefinition", name, e))?;
        if let Some(existing) = self.registry.by_gr(&info.gr)
            && !existing.custom
        {
            return Err(ApiError::invalid(
                "apiextensions.k8s.io",
                "CustomResourceDefinition",
                name,
                format!("spec.group: {} is served by a built-in resource", info.gr),
            ));
        }
        Ok(info)
    }

    fn check_namespace(&self, ns: &str) -> Result<(), ApiError> {
        if ns.is_empty() {
            return Err(ApiError::bad_request("a namespace is required for a namespaced resource"));
        }
        let nsb = self.bucket(&namespaces_gr())?;
        match nsb.objects.get(&(String::new(), ns.to_string())) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(s) if s.meta.deleting => Err(ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ))),
            Some(_) => Ok(()),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn update(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        cur: &Stored,
        old: Value,
        new: Value,
        sub: Subresource,
        opts: &WriteOpts,
    ) -> Result<Bytes, ApiError> {
        let info = self.bucket(gr)?.info.clone();
        let name = key.1.as_str();
        if !new.is_object() {
            return Err(ApiError::bad_request("the body of the request must be a JSON object"));
        }
        check_kind(&new, &info)?;
        let new_name = meta_str(&new, "name");
        if !new_name.is_empty() && new_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({new_name}) does not match the name on the URL ({name})"
            )));
        }
        let new_ns = meta_str(&new, "namespace");
        if info.namespaced && !new_ns.is_empty() && new_ns != key.0 {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let want_rv = meta_str(&new, "resourceVersion");
        if !want_rv.is_empty() && want_rv != cur.meta.rv.to_string() {
            return Err(ApiError::conflict(
                &gr.group,
                &gr.resource,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let new_uid = meta_str(&new, "uid");
        if !new_uid.is_empty() && new_uid != cur.meta.uid {
            return Err(ApiError::conflict(
                &gr.group,
                &gr.resource,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {new_uid}, UID in object meta: {}",
                    cur.meta.uid
                ),
            ));
        }
        // Build the object that will be stored.
        let mut obj = match sub {
            Subresource::Status => {
                let mut o = old.clone();
                match new.get("status") {
                    Some(s) => o["status"] = s.clone(),
                    None => {
                        if let Some(m) = o.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                o
            }
            Subresource::Main => {
                let mut o = new;
                if info.status_subresource {
                    match old.get("status") {
                        Some(s) => o["status"] = s.clone(),
                        None => {
                            if let Some(m) = o.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                o
            }
        };
        obj["apiVersion"] = Value::String(info.api_version(info.storage_version()));
        obj["kind"] = Value::String(info.kind.clone());
        fold_string_data(gr, &mut obj);
        {
            let old_meta = old.get("metadata").cloned().unwrap_or_default();
            let m = meta_mut(&mut obj);
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old_meta.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
            m.remove("resourceVersion");
            if sub == Subresource::Status {
                // Status writes cannot change metadata except managedFields.
            }
        }
        if cur.meta.deleting {
            let old_f = &cur.meta.finalizers;
            if let Some(added) = finalizers(&obj).into_iter().find(|f| !old_f.contains(f)) {
                return Err(ApiError::invalid(
                    &gr.group,
                    &info.kind,
                    name,
                    format!(
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [\"{added}\"]"
                    ),
                ));
            }
        }
        validate_owner_references(gr, &info, name, &obj)?;
        if tracks_generation(gr, &info)
            && spec_part(&old, info.status_subresource) != spec_part(&obj, info.status_subresource)
        {
            let g = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
            meta_mut(&mut obj).insert("generation".into(), json!(g + 1));
        }
        if *gr == crd_gr() {
            let new_info = self.validate_crd(&obj, name)?;
            if obj.get("status").is_none() {
                set_crd_status(&mut obj, &new_info);
            }
            if !opts.dry_run && !cur.meta.deleting {
                self.register(new_info);
            }
        }
        if let Some(manager) = &opts.manager {
            managed::record_update(Some(&old), &mut obj, manager, &info.api_version(info.storage_version()));
        }
        // Compare without resourceVersion: a no-op write changes nothing and keeps the RV.
        let mut old_cmp = old;
        meta_mut(&mut old_cmp).remove("resourceVersion");
        if old_cmp == obj {
            return Ok(cur.json.clone());
        }
        if opts.dry_run {
            meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(cur.meta.rv.to_string()));
            return encode(&obj);
        }
        if cur.meta.deleting && finalizers(&obj).is_empty() && !self.blocks_deletion(gr, &obj) {
            let out = self.commit(gr, obj, EventType::Deleted, Some(cur))?;
            let meta = Arc::new(ObjMeta::from_value(&decode(&out)?));
            self.gc.push(GcItem::Gone { gr: gr.clone(), meta });
            return Ok(out);
        }
        let out = self.commit(gr, obj, EventType::Modified, Some(cur))?;
        if cur.meta.deleting {
            self.gc.push(GcItem::Deleting { gr: gr.clone(), key: key.clone() });
        }
        Ok(out)
    }

    /// Namespaces with content and CRDs with instances stay until those are gone.
    fn blocks_deletion(&self, gr: &GroupResource, obj: &Value) -> bool {
        let name = meta_str(obj, "name");
        if *gr == namespaces_gr() {
            return self.buckets.values().any(|b| {
                b.info.namespaced
                    && b.objects
                        .range::<ObjKey, _>((name.to_string(), String::new())..)
                        .next()
                        .is_some_and(|(k, _)| k.0 == name)
            });
        }
        if *gr == crd_gr()
            && let Ok(info) = crd_resource(obj)
        {
            return self.buckets.get(&info.gr).is_some_and(|b| !b.objects.is_empty());
        }
        false
    }

    fn delete(&mut self, gr: &GroupResource, key: &ObjKey, opts: &DeleteOpts) -> Result<Bytes, ApiError> {
        let info = self.bucket(gr)?.info.clone();
        let cur = self
            .bucket(gr)?
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&gr.group, &gr.resource, &key.1))?;
        if let Some(uid) = &opts.uid
            && *uid != cur.meta.uid
        {
            return Err(ApiError::conflict(
                &gr.group,
                &gr.resource,
                &key.1,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    cur.meta.uid
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && *rv != cur.meta.rv.to_string()
        {
            return Err(ApiError::conflict(
                &gr.group,
                &gr.resource,
                &key.1,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    cur.meta.rv
                ),
            ));
        }
        let mut obj = decode(&cur.json)?;
        let mut fins = cur.meta.finalizers.clone();
        match opts.propagation.as_deref() {
            None | Some("Background") => {}
            Some("Orphan") => {
                if !fins.iter().any(|f| f == "orphan") {
                    fins.push("orphan".into());
                }
            }
            Some("Foreground") => {
                if !fins.iter().any(|f| f == "foregroundDeletion") {
                    fins.push("foregroundDeletion".into());
                }
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    &gr.group,
                    &info.kind,
                    &key.1,
                    format!(
                        "propagationPolicy: Unsupported value: \"{other}\": supported values: \"Foreground\", \"Background\", \"Orphan\""
                    ),
                ));
            }
        }
        let blocked = !fins.is_empty() || self.blocks_deletion(gr, &obj);
        if opts.dry_run {
            return Ok(cur.json.clone());
        }
        if blocked {
            if cur.meta.deleting && fins == cur.meta.finalizers {
                self.gc.push(GcItem::Deleting { gr: gr.clone(), key: key.clone() });
                return Ok(cur.json.clone());
            }
            let m = meta_mut(&mut obj);
            if !cur.meta.deleting {
                m.insert("deletionTimestamp".into(), Value::String(now_rfc3339()));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            if fins.is_empty() {
                m.remove("finalizers");
            } else {
                m.insert("finalizers".into(), json!(fins));
            }
            if *gr == namespaces_gr() {
                obj["status"] = json!({"phase": "Terminating"});
            }
            let out = self.commit(gr, obj, EventType::Modified, Some(&cur))?;
            self.gc.push(GcItem::Deleting { gr: gr.clone(), key: key.clone() });
            return Ok(out);
        }
        let out = self.commit(gr, obj, EventType::Deleted, Some(&cur))?;
        let meta = Arc::new(ObjMeta::from_value(&decode(&out)?));
        self.gc.push(GcItem::Gone { gr: gr.clone(), meta });
        Ok(out)
    }

    /// Rewrites one object in place through `f` (used by the garbage collector).
    fn rewrite(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        f: impl FnOnce(&mut Value),
    ) -> Result<(), ApiError> {
        let Some(cur) = self.buckets.get(gr).and_then(|b| b.objects.get(key)).cloned() else {
            return Ok(());
        };
        let old = decode(&cur.json)?;
        let mut new = old.clone();
        f(&mut new);
        if new != old {
            self.update(gr, key, &cur, old, new, Subresource::Main, &WriteOpts::default())?;
        }
        Ok(())
    }

    fn remove_finalizer(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        finalizer: &str,
    ) -> Result<(), ApiError> {
        self.rewrite(gr, key, |o| {
            if let Some(a) = o.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
                a.retain(|f| f.as_str() != Some(finalizer));
                if a.is_empty()
                    && let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut)
                {
                    m.remove("finalizers");
                }
            }
        })
    }

    fn remove_owner_ref(
        &mut self,
        gr: &GroupResource,
        key: &ObjKey,
        owner_uid: &str,
    ) -> Result<(), ApiError> {
        self.rewrite(gr, key, |o| {
            if let Some(a) = o.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut) {
                a.retain(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid));
                if a.is_empty()
                    && let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut)
                {
                    m.remove("ownerReferences");
                }
            }
        })
    }

    /// Runs the garbage collector until it has nothing left to do. Errors inside are logged:
    /// the write that triggered collection has already been committed.
    fn run_gc(&mut self) {
        let mut guard = 0usize;
        while let Some(item) = self.gc.pop() {
            guard += 1;
            if guard > 1_000_000 {
                tracing::error!("garbage collector did not converge; giving up on this pass");
                self.gc.clear();
                break;
            }
            if let Err(error) = self.gc_step(item) {
                tracing::warn!(%error, "garbage collection step failed");
            }
        }
    }

    fn gc_step(&mut self, item: GcItem) -> Result<(), ApiError> {
        match item {
            GcItem::Gone { gr, meta } => {
                // Dependents of the deleted object: delete when no owner remains, else drop the ref.
                let deps: Vec<_> =
                    self.dependents.get(&meta.uid).map(|s| s.iter().cloned().collect()).unwrap_or_default();
                for (dgr, dkey) in deps {
                    let Some(dep) = self.buckets.get(&dgr).and_then(|b| b.objects.get(&dkey)).cloned() else {
                        continue;
                    };
                    let live_owner =
                        dep.meta.owners.iter().any(|o| *o != meta.uid && self.uids.contains_key(o));
                    if live_owner {
                        self.remove_owner_ref(&dgr, &dkey, &meta.uid)?;
                    } else if !dep.meta.deleting {
                        self.delete(&dgr, &dkey, &DeleteOpts::default())?;
                    }
                }
                // Owners waiting for their dependents (foreground) may now be done.
                for owner in &meta.owners {
                    if let Some((ogr, okey)) = self.uids.get(owner).cloned() {
                        self.gc.push(GcItem::Deleting { gr: ogr, key: okey });
                    }
                }
                // A terminating namespace / CRD may now be empty.
                if !meta.namespace.is_empty() {
                    self.gc.push(GcItem::Deleting {
                        gr: namespaces_gr(),
                        key: (String::new(), meta.namespace.clone()),
                    });
                }
                if let Some(b) = self.buckets.get(&gr)
                    && b.info.custom
                {
                    let crd_name = format!("{}.{}", gr.resource, gr.group);
                    self.gc.push(GcItem::Deleting { gr: crd_gr(), key: (String::new(), crd_name) });
                }
                let served = self
                    .registry
                    .all()
                    .find(|i| i.custom && format!("{}.{}", i.gr.resource, i.gr.group) == meta.name)
                    .map(|i| i.gr.clone());
                if gr == crd_gr()
                    && let Some(served) = served
                {
                    self.registry.remove(&served);
                    self.buckets.remove(&served);
                }
            }
            GcItem::Deleting { gr, key } => {
                let Some(cur) = self.buckets.get(&gr).and_then(|b| b.objects.get(&key)).cloned() else {
                    return Ok(());
                };
                if !cur.meta.deleting {
                    return Ok(());
                }
                let uid = cur.meta.uid.clone();
                let deps: Vec<_> =
                    self.dependents.get(&uid).map(|s| s.iter().cloned().collect()).unwrap_or_default();
                if cur.meta.finalizers.iter().any(|f| f == "orphan") {
                    for (dgr, dkey) in &deps {
                        self.remove_owner_ref(dgr, dkey, &uid)?;
                    }
                    return self.remove_finalizer(&gr, &key, "orphan");
                }
                if cur.meta.finalizers.iter().any(|f| f == "foregroundDeletion") {
                    if deps.is_empty() {
                        return self.remove_finalizer(&gr, &key, "foregroundDeletion");
                    }
                    for (dgr, dkey) in deps {
                        let Some(dep) = self.buckets.get(&dgr).and_then(|b| b.objects.get(&dkey)).cloned()
                        else {
                            continue;
                        };
                        if dep.meta.deleting {
                            continue;
                        }
                        let has_deps = self.dependents.contains_key(&dep.meta.uid);
                        let propagation = has_deps.then(|| "Foreground".to_string());
                        self.delete(&dgr, &dkey, &DeleteOpts { propagation, ..Default::default() })?;
                    }
                    return Ok(());
                }
                if gr == namespaces_gr() {
                    let ns = key.1.clone();
                    let mut content = Vec::new();
                    for (bgr, b) in &self.buckets {
                        if !b.info.namespaced {
                            continue;
                        }
                        for (k, s) in b.objects.range::<ObjKey, _>((ns.clone(), String::new())..) {
                            if k.0 != ns {
                                break;
                            }
                            if !s.meta.deleting {
                                content.push((bgr.clone(), k.clone()));
                            }
                        }
                    }
                    for (cgr, ckey) in content {
                        match self.delete(&cgr, &ckey, &DeleteOpts::default()) {
                            Ok(_) => {}
                            Err(e) if e.code == 404 => {}
                            Err(e) => return Err(e),
                        }
                    }
                } else if gr == crd_gr() {
                    let obj = decode(&cur.json)?;
                    if let Ok(info) = crd_resource(&obj) {
                        let keys: Vec<ObjKey> = self
                            .buckets
                            .get(&info.gr)
                            .map(|b| {
                                b.objects
                                    .iter()
                                    .filter(|(_, s)| !s.meta.deleting)
                                    .map(|(k, _)| k.clone())
                                    .collect()
                            })
                            .unwrap_or_default();
                        for k in keys {
                            self.delete(&info.gr, &k, &DeleteOpts::default())?;
                        }
                    }
                }
                // Finish deletion when nothing blocks it any more.
                let Some(cur) = self.buckets.get(&gr).and_then(|b| b.objects.get(&key)).cloned() else {
                    return Ok(());
                };
                let obj = decode(&cur.json)?;
                if cur.meta.finalizers.is_empty() && !self.blocks_deletion(&gr, &obj) {
                    let out = self.commit(&gr, obj, EventType::Deleted, Some(&cur))?;
                    let meta = Arc::new(ObjMeta::from_value(&decode(&out)?));
                    self.gc.push(GcItem::Gone { gr, meta });
                }
            }
        }
        Ok(())
    }
}

/// Rejects a body whose `kind`/`apiVersion` name another resource.
fn check_kind(obj: &Value, info: &ResourceInfo) -> Result<(), ApiError> {
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && !kind.is_empty()
        && kind != info.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind of the object ({kind}) does not match the resource ({})",
            info.kind
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
    {
        let (g, v) = split_api_version(av);
        if g != info.gr.group || !info.versions.iter().any(|x| x == v) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                info.api_version(info.storage_version())
            )));
        }
    }
    Ok(())
}

/// Folds a Secret's write-only `stringData` into `data` (base64), as the API server does.
fn fold_string_data(gr: &GroupResource, obj: &mut Value) {
    if gr.group.is_empty()
        && gr.resource == "secrets"
        && let Some(m) = obj.as_object_mut()
        && let Some(Value::Object(sd)) = m.remove("stringData")
    {
        use base64::Engine;
        let data = m.entry("data").or_insert_with(|| json!({}));
        if !data.is_object() {
            *data = json!({});
        }
        if let Some(d) = data.as_object_mut() {
            for (k, v) in sd {
                let s = v.as_str().unwrap_or_default();
                d.insert(k, Value::String(base64::engine::general_purpose::STANDARD.encode(s)));
            }
        }
    }
}

/// Server-side defaults a real API server sets on create.
fn default_object(gr: &GroupResource, obj: &mut Value, name: &str) {
    if gr.group.is_empty()
        && gr.resource == "secrets"
        && obj.get("type").and_then(Value::as_str).is_none_or(str::is_empty)
    {
        obj["type"] = json!("Opaque");
    }
    if *gr == namespaces_gr() {
        let m = meta_mut(obj);
        let labels = m.entry("labels").or_insert_with(|| json!({}));
        if let Some(l) = labels.as_object_mut() {
            l.insert("kubernetes.io/metadata.name".into(), Value::String(name.into()));
        }
        obj["spec"] = json!({"finalizers": ["kubernetes"]});
        obj["status"] = json!({"phase": "Active"});
    }
}

/// A CRD's status as the apiextensions controller would set it once established.
fn set_crd_status(obj: &mut Value, info: &ResourceInfo) {
    let names = obj.pointer("/spec/names").cloned().unwrap_or_default();
    let mut accepted = names.clone();
    if accepted.get("singular").is_none() {
        accepted["singular"] = Value::String(info.singular.clone());
    }
    if accepted.get("listKind").is_none() {
        accepted["listKind"] = Value::String(info.list_kind());
    }
    let now = now_rfc3339();
    obj["status"] = json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "storedVersions": [info.storage_version()],
    });
}
