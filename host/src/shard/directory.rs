//! The directory of one label-mode scope: every object in it (whoever it is assigned to),
//! known by key and shard label only, from a metadata-only watch.
//!
//! In label mode a replica caches only the objects labelled with its name, so its cache
//! cannot tell "not assigned to me (yet)" from "deleted". The directory can: it is what lets
//! a replica reconcile a delete of a key it owns but never cached, wait for an object it
//! gained to arrive instead of reporting it gone, and keep deletes of keys it may gain. It is
//! also what the assignment role labels from.
//!
//! Invariants: an entry exists for exactly the objects of the last list plus the watch
//! events since (kube's watcher relists on expiry; objects missing from a relist count as
//! deleted); every removal is reported to each listener, outside the directory's locks;
//! until the first list is in ([`Directory::is_synced`]) nothing is claimed absent;
//! [`Directory::sweep`] brings it up to a consistent read of the server (an entry missing
//! there, and not seen after the read, is removed). An entry costs its key, its label value
//! and a resourceVersion, not the object.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};

use futures::StreamExt;
use kube::api::ListParams;
use kube::api::{Api, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use parking_lot::{Mutex, RwLock};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::protocol::LabelScope;
use crate::source::Discovery;

/// `scope`'s kind as kube describes it, and whether it is namespaced: resolved by
/// discovery, retried (a CRD may not be served yet) until it resolves or `stop` is cancelled.
pub(crate) async fn resolve(
    discovery: &Discovery,
    scope: &LabelScope,
    stop: &CancellationToken,
) -> Option<(kube::core::ApiResource, bool)> {
    let mut wait = std::time::Duration::from_millis(200);
    loop {
        match discovery.resolve(&scope.api_version, &scope.kind).await {
            Ok(r) => return Some((kube_resource(&r), r.namespaced)),
            Err(error) => tracing::warn!(%scope, %error, "cannot resolve the scope's kind; retrying"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(10));
    }
}

/// kube's description of a resource, from ours.
pub(crate) fn kube_resource(r: &crate::source::ApiResource) -> kube::core::ApiResource {
    kube::core::ApiResource {
        group: r.group.clone(),
        version: r.version.clone(),
        api_version: r.api_version.clone(),
        kind: r.kind.clone(),
        plural: r.plural.clone(),
    }
}

/// Told when an object leaves the directory.
pub trait Departures: Send + Sync {
    fn departed(&self, key: &str);
}

/// What the directory keeps of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    label: Option<String>,
    /// Its resourceVersion as last seen (0 if it is not an integer).
    rv: u64,
}

/// One scope's objects: key → shard label.
pub struct Directory {
    scope: LabelScope,
    label_key: String,
    objects: RwLock<HashMap<String, Entry>>,
    synced: watch::Sender<bool>,
    /// The scope's API, once its kind resolved.
    api: std::sync::OnceLock<Api<PartialObjectMeta<DynamicObject>>>,
    /// Keys changed since the assignment role last looked (only while it tracks).
    dirty: Mutex<Option<HashSet<String>>>,
    changed: Notify,
    listeners: Mutex<Vec<Weak<dyn Departures>>>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("scope", &self.scope)
            .field("objects", &self.objects.read().len())
            .field("synced", &self.is_synced())
            .finish()
    }
}

impl Drop for Directory {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn rv_of(meta: &kube::core::ObjectMeta) -> u64 {
    meta.resource_version.as_deref().and_then(|rv| rv.parse().ok()).unwrap_or(0)
}

impl Directory {
    /// Starts following `scope` with a metadata-only watch (after resolving its kind);
    /// stops when the directory is dropped.
    pub fn start(
        client: kube::Client,
        discovery: Discovery,
        scope: LabelScope,
        label_key: String,
    ) -> Arc<Directory> {
        let dir = Arc::new(Directory {
            scope: scope.clone(),
            label_key,
            objects: RwLock::new(HashMap::new()),
            synced: watch::Sender::new(false),
            api: std::sync::OnceLock::new(),
            dirty: Mutex::new(None),
            changed: Notify::new(),
            listeners: Mutex::new(Vec::new()),
            stop: CancellationToken::new(),
        });
        let mut config = watcher::Config::default();
        if let Some(l) = &scope.label_selector {
            config = config.labels(l);
        }
        if let Some(f) = &scope.field_selector {
            config = config.fields(f);
        }
        let weak = Arc::downgrade(&dir);
        let stop = dir.stop.clone();
        tokio::spawn(async move {
            let Some((resource, namespaced)) = resolve(&discovery, &scope, &stop).await else { return };
            // `PartialObjectMeta` makes the list and watch metadata-only.
            let api: Api<PartialObjectMeta<DynamicObject>> = match (&scope.namespace, namespaced) {
                (Some(ns), true) => Api::namespaced_with(client, ns, &resource),
                _ => Api::all_with(client, &resource),
            };
            match weak.upgrade() {
                Some(dir) => {
                    let _ = dir.api.set(api.clone());
                }
                None => return,
            }
            let stream = watcher::watcher(api, config).default_backoff();
            tokio::pin!(stream);
            let mut listing: Option<HashMap<String, Entry>> = None;
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    e = stream.next() => e,
                };
                let Some(dir) = weak.upgrade() else { return };
                match event {
                    Some(Ok(watcher::Event::Init)) => listing = Some(HashMap::new()),
                    Some(Ok(watcher::Event::InitApply(meta))) => {
                        if let Some(l) = listing.as_mut() {
                            let (key, entry) = dir.entry(&meta.metadata);
                            l.insert(key, entry);
                        }
                    }
                    Some(Ok(watcher::Event::InitDone)) => {
                        if let Some(l) = listing.take() {
                            dir.replace(l);
                        }
                    }
                    Some(Ok(watcher::Event::Apply(meta))) => {
                        let (key, entry) = dir.entry(&meta.metadata);
                        dir.upsert(key, entry);
                    }
                    Some(Ok(watcher::Event::Delete(meta))) => {
                        let (key, _) = dir.entry(&meta.metadata);
                        dir.remove(&key);
                    }
                    Some(Err(error)) => {
                        tracing::warn!(scope = %dir.scope, %error, "watching the scope's objects failed; retrying")
                    }
                    None => return,
                }
            }
        });
        dir
    }

    pub fn scope(&self) -> &LabelScope {
        &self.scope
    }

    /// Whether the first list is in.
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Resolves once the first list is in.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Whether an object of `key` exists (`None` until synced).
    pub fn exists(&self, key: &str) -> Option<bool> {
        self.is_synced().then(|| self.objects.read().contains_key(key))
    }

    /// Every key.
    pub fn keys(&self) -> Vec<String> {
        self.objects.read().keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.objects.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard label of `key` as last seen (outer `None`: no such object).
    pub fn label(&self, key: &str) -> Option<Option<String>> {
        self.objects.read().get(key).map(|e| e.label.clone())
    }

    /// Reports every later removal to `listener` (until it is dropped).
    pub fn listen(&self, listener: Weak<dyn Departures>) {
        let mut l = self.listeners.lock();
        l.retain(|w| w.strong_count() > 0);
        l.push(listener);
    }

    /// Starts (or stops) remembering which keys changed, for [`take_changed`](Self::take_changed).
    pub fn track_changes(&self, on: bool) {
        *self.dirty.lock() = on.then(HashSet::new);
    }

    /// The keys changed since the last call (while tracking).
    pub fn take_changed(&self) -> Vec<String> {
        self.dirty.lock().as_mut().map(|d| d.drain().collect()).unwrap_or_default()
    }

    /// Resolves at the next change (an object added, changed or removed, or the first list),
    /// or at once if one happened since the last call. One waiter at a time.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Brings the directory up to a consistent read of the server: every object it holds
    /// that the read does not list, and that it has not seen change since, is removed (and
    /// reported) now, without waiting for the watch to tell. Fails if the kind is not
    /// resolved yet or the read fails.
    pub async fn sweep(&self) -> Result<(), kube::Error> {
        let Some(api) = self.api.get() else {
            return Err(kube::Error::Service("the scope's kind is not resolved yet".into()));
        };
        let mut params = ListParams::default().limit(500);
        if let Some(l) = &self.scope.label_selector {
            params = params.labels(l);
        }
        if let Some(f) = &self.scope.field_selector {
            params = params.fields(f);
        }
        let mut listed: HashSet<String> = HashSet::new();
        let mut read_at: Option<u64> = None;
        loop {
            let page = api.list_metadata(&params).await?;
            if read_at.is_none() {
                read_at = page.metadata.resource_version.as_deref().and_then(|rv| rv.parse().ok());
            }
            for item in &page.items {
                listed.insert(self.entry(&item.metadata).0);
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params.continue_token = Some(token),
                None => break,
            }
        }
        let Some(read_at) = read_at else { return Ok(()) };
        let gone: Vec<String> = self
            .objects
            .read()
            .iter()
            .filter(|(key, entry)| !listed.contains(*key) && entry.rv <= read_at)
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            self.remove(&key);
        }
        Ok(())
    }

    fn entry(&self, meta: &kube::core::ObjectMeta) -> (String, Entry) {
        let name = meta.name.as_deref().unwrap_or_default();
        let key = crate::object::key_of(meta.namespace.as_deref(), name);
        let label = meta.labels.as_ref().and_then(|l| l.get(&self.label_key)).cloned();
        (key, Entry { label, rv: rv_of(meta) })
    }

    fn mark(&self, key: &str) {
        if let Some(d) = self.dirty.lock().as_mut() {
            d.insert(key.to_owned());
        }
    }

    fn upsert(&self, key: String, entry: Entry) {
        self.mark(&key);
        self.objects.write().insert(key, entry);
        self.changed.notify_one();
    }

    fn remove(&self, key: &str) {
        let removed = self.objects.write().remove(key).is_some();
        if removed {
            self.mark(key);
            self.depart(std::iter::once(key.to_owned()));
        }
        self.changed.notify_one();
    }

    fn replace(&self, listed: HashMap<String, Entry>) {
        let gone: Vec<String> = {
            let mut objects = self.objects.write();
            let gone: Vec<String> = objects.keys().filter(|k| !listed.contains_key(*k)).cloned().collect();
            *objects = listed;
            gone
        };
        if let Some(d) = self.dirty.lock().as_mut() {
            // A relist can change anything: the assignment role looks at every key.
            d.extend(self.objects.read().keys().cloned());
            d.extend(gone.iter().cloned());
        }
        self.synced.send_replace(true);
        self.depart(gone.into_iter());
        self.changed.notify_one();
    }

    fn depart(&self, keys: impl Iterator<Item = String>) {
        let listeners: Vec<Arc<dyn Departures>> =
            self.listeners.lock().iter().filter_map(Weak::upgrade).collect();
        if listeners.is_empty() {
            return;
        }
        for key in keys {
            for l in &listeners {
                l.departed(&key);
            }
        }
    }
}
