//! What a watcher sees of the store's changes.
//!
//! Invariants:
//! - A watcher is registered under the store's lock together with its initial events (the
//!   current state or the history after its RV), so nothing committed in between is lost or
//!   sent twice; `Inner::commit` hands each later change to it under the same lock.
//! - A watcher's view of a MODIFIED change follows its filter: entering the selection shows as
//!   ADDED, leaving it as DELETED, outside it before and after not at all.
//! - A watch from an RV older than the resource's `compacted_rv` fails with 410 Expired.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{ObjMeta, Store};
use crate::error::ApiError;
use crate::resources::GroupResource;
use crate::selector::{FieldSelector, LabelSelector};

/// Capacity of each watcher's channel; a watcher further behind than this is dropped.
pub const WATCH_CHANNEL: usize = 65_536;
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
    pub(super) fn matches(&self, meta: &ObjMeta, json: &Bytes) -> bool {
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

pub(super) struct Watcher {
    pub(super) filter: WatchFilter,
    pub(super) tx: mpsc::Sender<WatchItem>,
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

impl Store {
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
    /// Fault: end every watch stream now.
    pub fn drop_watches(&self) {
        let mut inner = self.inner.lock();
        for b in inner.buckets.values_mut() {
            b.watchers.clear();
        }
    }
}
