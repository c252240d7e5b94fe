//! `InformerFactory`: one shared informer per (GVK, namespace, label selector, field
//! selector, transform), handed out as reference-counted [`InformerLease`]s. The transform
//! is part of the key: a cache that strips a field must never serve a user that wants it.
//!
//! Invariants (under the factory's mutex):
//! - at most one running informer per key; its lease count equals the number of live leases;
//! - when the count drops to zero the informer is removed and stopped (its watch closes, its
//!   listeners end); a later request starts a fresh one;
//! - indexes requested by several leases are merged into the one cache; the same index name
//!   with a different definition is refused (the request fails, nothing changes).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use kube::core::GroupVersionKind;
use parking_lot::Mutex;

use super::ResourceEventHandler;
use super::shared::{HandlerRegistration, InformerOptions, SharedIndexInformer};
use crate::cache::{IndexError, IndexFunc, IndexSpec, LabelSelector, SelectorError};
use crate::metrics::Metrics;
use crate::object::Transform;
use crate::source::{
    ApiResource, BackoffConfig, Discovery, DiscoveryError, Reflector, ReflectorConfig, ReflectorMetrics,
};

/// What a controller asks the factory for.
///
/// ```
/// use wasmctrl_runtime::cache::IndexSpec;
/// use wasmctrl_runtime::informer::InformerSpec;
/// let spec = InformerSpec::new("apps/v1", "Deployment")
///     .namespace("default")
///     .label_selector("tier=web")
///     .index("by-owner", IndexSpec::Owner(wasmctrl_runtime::cache::OwnerIndex::Controller));
/// assert_eq!(spec.gvk.group, "apps");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InformerSpec {
    /// Group, version, kind.
    pub gvk: GroupVersionKind,
    /// Namespace scope (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Label selector (Kubernetes syntax) for list and watch.
    pub label_selector: Option<String>,
    /// Field selector for list and watch.
    pub field_selector: Option<String>,
    /// Extra indexes this user needs (merged with other users').
    pub indexes: BTreeMap<String, IndexSpec>,
    /// Resync period of handlers added through [`InformerLease::add_handler`].
    pub resync: Option<Duration>,
    /// What the cache strips (`None`: the factory's [`FactoryOptions::transform`]).
    pub transform: Option<Transform>,
}

impl InformerSpec {
    /// A spec for every object of `api_version` / `kind`.
    pub fn new(api_version: &str, kind: &str) -> Self {
        let (group, version) = crate::source::split_api_version(api_version);
        Self {
            gvk: GroupVersionKind::gvk(group, version, kind),
            namespace: None,
            label_selector: None,
            field_selector: None,
            indexes: BTreeMap::new(),
            resync: None,
            transform: None,
        }
    }

    /// Sets what the cache strips from objects.
    pub fn transform(mut self, transform: Transform) -> Self {
        self.transform = Some(transform);
        self
    }

    /// Restricts to one namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Sets the label selector.
    pub fn label_selector(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Sets the field selector.
    pub fn field_selector(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    /// Adds an index.
    pub fn index(mut self, name: impl Into<String>, spec: IndexSpec) -> Self {
        self.indexes.insert(name.into(), spec);
        self
    }

    /// Sets the handler resync period.
    pub fn resync(mut self, period: Duration) -> Self {
        self.resync = Some(period);
        self
    }

    fn key(&self, default_transform: Transform) -> InformerKey {
        let norm =
            |s: &Option<String>| s.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned);
        InformerKey {
            gvk: self.gvk.clone(),
            namespace: norm(&self.namespace),
            label_selector: norm(&self.label_selector),
            field_selector: norm(&self.field_selector),
            transform: self.transform.unwrap_or(default_transform),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct InformerKey {
    gvk: GroupVersionKind,
    namespace: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    transform: Transform,
}

/// Why the factory could not provide an informer.
#[derive(Debug, thiserror::Error)]
pub enum FactoryError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error("informer for {kind}: {source}")]
    Index {
        kind: String,
        #[source]
        source: IndexError,
    },
    #[error("informer for {kind}: {source}")]
    Selector {
        kind: String,
        #[source]
        source: SelectorError,
    },
    #[error("{kind} is cluster-scoped but namespace {namespace:?} was requested")]
    NamespaceOnClusterScoped { kind: String, namespace: String },
    #[error("reading the current resourceVersion of {kind}: {message}")]
    CurrentVersion { kind: String, message: String },
}

/// Settings shared by every informer of a factory.
#[derive(Debug, Clone, Copy)]
pub struct FactoryOptions {
    /// What to strip from objects before caching.
    pub transform: Transform,
    /// List page size.
    pub page_size: u32,
    /// Backoff between failed list/watch attempts.
    pub backoff: BackoffConfig,
    /// The longest watch event or list item the reflectors accept.
    pub max_object_size: usize,
}

impl Default for FactoryOptions {
    fn default() -> Self {
        Self {
            transform: Transform::default(),
            page_size: 500,
            backoff: BackoffConfig::default(),
            max_object_size: crate::source::DEFAULT_MAX_OBJECT_SIZE,
        }
    }
}

struct Entry {
    informer: SharedIndexInformer,
    leases: usize,
}

struct FactoryInner {
    client: kube::Client,
    discovery: Discovery,
    options: FactoryOptions,
    entries: Mutex<HashMap<InformerKey, Entry>>,
    /// Where the informers' reflectors count watch events and relists.
    metrics: Option<Arc<Metrics>>,
}

/// Creates and shares informers.
///
/// ```no_run
/// # async fn demo(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
/// use wasmctrl_runtime::informer::{FactoryOptions, InformerFactory, InformerSpec};
/// let factory = InformerFactory::new(client, FactoryOptions::default());
/// let a = factory.informer(InformerSpec::new("v1", "ConfigMap").namespace("default")).await?;
/// let b = factory.informer(InformerSpec::new("v1", "ConfigMap").namespace("default")).await?;
/// assert!(a.same_informer(&b)); // one watch, one cache
/// a.wait_for_sync().await;
/// let cached = a.indexer().list();
/// drop(a);
/// b.release(); // the last lease: the informer stops
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct InformerFactory {
    inner: Arc<FactoryInner>,
}

impl std::fmt::Debug for InformerFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InformerFactory").field("informers", &self.inner.entries.lock().len()).finish()
    }
}

impl InformerFactory {
    /// A factory using `client` for discovery, lists and watches.
    pub fn new(client: kube::Client, options: FactoryOptions) -> Self {
        Self::build(client, options, None)
    }

    /// A factory whose informers count their watch events and relists in `metrics`
    /// (`wasmctrl_informer_events_total`, `wasmctrl_informer_relists_total`).
    pub fn with_metrics(client: kube::Client, options: FactoryOptions, metrics: Arc<Metrics>) -> Self {
        Self::build(client, options, Some(metrics))
    }

    fn build(client: kube::Client, options: FactoryOptions, metrics: Option<Arc<Metrics>>) -> Self {
        let discovery = Discovery::new(client.clone());
        Self {
            inner: Arc::new(FactoryInner { client, discovery, options, entries: Mutex::default(), metrics }),
        }
    }

    /// The factory's discovery client (shared cache).
    pub fn discovery(&self) -> &Discovery {
        &self.inner.discovery
    }

    /// The client the factory lists and watches with.
    pub fn client(&self) -> &kube::Client {
        &self.inner.client
    }

    /// Number of running informers.
    pub fn informer_count(&self) -> usize {
        self.inner.entries.lock().len()
    }

    /// Number of handlers registered on the running informers, all together.
    pub fn handler_count(&self) -> usize {
        self.inner.entries.lock().values().map(|e| e.informer.handler_count()).sum()
    }

    /// The resourceVersion the server is at now for `spec`'s scope: a consistent list of at
    /// most one object (no `resourceVersion` parameter: read from storage, or from a cache
    /// the server has proven current). An informer of that scope whose stream has reached
    /// it has seen every change made before this call.
    pub async fn current_resource_version(&self, spec: &InformerSpec) -> Result<String, FactoryError> {
        let api_version = spec.gvk.api_version();
        let kind = format!("{api_version}/{}", spec.gvk.kind);
        let resource = self.inner.discovery.resolve(&api_version, &spec.gvk.kind).await?;
        let mut params = kube::api::ListParams::default().limit(1);
        if let Some(labels) = spec.label_selector.as_deref().filter(|s| !s.trim().is_empty()) {
            params = params.labels(labels);
        }
        if let Some(fields) = spec.field_selector.as_deref().filter(|s| !s.trim().is_empty()) {
            params = params.fields(fields);
        }
        let fail = |message: String| FactoryError::CurrentVersion { kind: kind.clone(), message };
        let request = kube::core::Request::new(resource.collection_path(spec.namespace.as_deref()))
            .list(&params)
            .map_err(|e| fail(e.to_string()))?;
        let body = self.inner.client.request_text(request).await.map_err(|e| fail(e.to_string()))?;
        #[derive(serde::Deserialize)]
        struct ListMeta {
            #[serde(rename = "resourceVersion")]
            resource_version: String,
        }
        #[derive(serde::Deserialize)]
        struct List {
            metadata: ListMeta,
        }
        let list: List =
            serde_json::from_str(&body).map_err(|e| fail(format!("the list has no resourceVersion: {e}")))?;
        Ok(list.metadata.resource_version)
    }

    /// A lease on the informer for `spec`, started if it was not running. Must be called
    /// within a tokio runtime.
    pub async fn informer(&self, spec: InformerSpec) -> Result<InformerLease, FactoryError> {
        let api_version = spec.gvk.api_version();
        let kind_name = format!("{api_version}/{}", spec.gvk.kind);
        if let Some(sel) = spec.label_selector.as_deref().filter(|s| !s.trim().is_empty()) {
            LabelSelector::parse(sel)
                .map_err(|source| FactoryError::Selector { kind: kind_name.clone(), source })?;
        }
        let resource = self.inner.discovery.resolve(&api_version, &spec.gvk.kind).await?;
        let key = spec.key(self.inner.options.transform);
        if let Some(ns) = &key.namespace
            && !resource.namespaced
        {
            return Err(FactoryError::NamespaceOnClusterScoped { kind: kind_name, namespace: ns.clone() });
        }
        let indexes = spec
            .indexes
            .iter()
            .map(|(name, s)| IndexFunc::from_spec(s.clone()).map(|f| (name.clone(), f)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| FactoryError::Index { kind: kind_name.clone(), source })?;

        let mut entries = self.inner.entries.lock();
        let informer = match entries.get_mut(&key) {
            Some(entry) => {
                entry
                    .informer
                    .add_indexers(indexes)
                    .map_err(|source| FactoryError::Index { kind: kind_name.clone(), source })?;
                entry.leases += 1;
                entry.informer.clone()
            }
            None => {
                let informer = self.start(&key, &resource, indexes, &kind_name)?;
                entries.insert(key.clone(), Entry { informer: informer.clone(), leases: 1 });
                informer
            }
        };
        Ok(InformerLease { factory: Arc::downgrade(&self.inner), key, informer, resync: spec.resync })
    }

    fn start(
        &self,
        key: &InformerKey,
        resource: &ApiResource,
        indexes: Vec<(String, IndexFunc)>,
        kind_name: &str,
    ) -> Result<SharedIndexInformer, FactoryError> {
        let mut name = kind_name.to_owned();
        for (label, value) in
            [("ns", &key.namespace), ("labels", &key.label_selector), ("fields", &key.field_selector)]
        {
            if let Some(v) = value {
                name.push_str(&format!(" {label}={v}"));
            }
        }
        if key.transform != Transform::default() {
            name.push_str(&format!(
                " strip-managed-fields={} strip-last-applied={}",
                key.transform.strip_managed_fields, key.transform.strip_last_applied
            ));
        }
        let informer = SharedIndexInformer::new(InformerOptions { name, indexes, default_resync: None })
            .map_err(|source| FactoryError::Index { kind: kind_name.to_owned(), source })?;
        let options = self.inner.options;
        let reflector = Reflector::new(
            self.inner.client.clone(),
            resource.clone(),
            ReflectorConfig {
                namespace: key.namespace.clone(),
                label_selector: key.label_selector.clone(),
                field_selector: key.field_selector.clone(),
                page_size: options.page_size,
                backoff: options.backoff,
                transform: key.transform,
                max_object_size: options.max_object_size,
                metrics: self.inner.metrics.as_ref().map(|m| {
                    ReflectorMetrics::new(&format!("{}/{}", resource.api_version, resource.kind), m)
                }),
                ..ReflectorConfig::default()
            },
        );
        informer.start(reflector);
        tracing::info!(informer = informer.name(), "informer started");
        Ok(informer)
    }

    /// Stops every informer (their leases become inert).
    pub fn shutdown(&self) {
        for (_, entry) in self.inner.entries.lock().drain() {
            entry.informer.stop();
        }
    }
}

/// A reference-counted claim on a shared informer. Dereferences to the
/// [`SharedIndexInformer`]; dropping (or [`release`](Self::release)-ing) the last lease
/// stops it.
pub struct InformerLease {
    factory: Weak<FactoryInner>,
    key: InformerKey,
    informer: SharedIndexInformer,
    resync: Option<Duration>,
}

impl std::fmt::Debug for InformerLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InformerLease").field("informer", &self.informer).finish()
    }
}

impl InformerLease {
    /// The shared informer.
    pub fn informer(&self) -> &SharedIndexInformer {
        &self.informer
    }

    /// Registers a handler with this lease's resync period.
    pub fn add_handler(&self, handler: Arc<dyn ResourceEventHandler>) -> HandlerRegistration {
        self.informer.add_event_handler(handler, Some(self.resync.unwrap_or(Duration::ZERO)))
    }

    /// Whether two leases share one informer.
    pub fn same_informer(&self, other: &InformerLease) -> bool {
        self.key == other.key && self.informer.indexer().same_store(&other.informer.indexer())
    }

    /// Gives the lease back (same as dropping it).
    pub fn release(self) {}
}

impl std::ops::Deref for InformerLease {
    type Target = SharedIndexInformer;
    fn deref(&self) -> &SharedIndexInformer {
        &self.informer
    }
}

impl Drop for InformerLease {
    fn drop(&mut self) {
        let Some(factory) = self.factory.upgrade() else { return };
        let mut entries = factory.entries.lock();
        let Some(entry) = entries.get_mut(&self.key) else { return };
        // The entry may be a newer informer for the same key (after shutdown + restart).
        if !entry.informer.indexer().same_store(&self.informer.indexer()) {
            return;
        }
        entry.leases -= 1;
        if entry.leases == 0 {
            entries.remove(&self.key);
            drop(entries);
            self.informer.stop();
        }
    }
}
