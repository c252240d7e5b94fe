//! What a [`DeltaFifo`] needs from the store it feeds, as [`KnownObjects`] (client-go's
//! `KeyListerGetter`; the cache implements it, so this stage never imports a later one), and
//! what the FIFO builds on it: the relist (`replace`) and the periodic resync.
//!
//! Invariants:
//! - a relist queues a `Replaced` delta for every listed object, then a `Deleted` tombstone
//!   (`FinalStateUnknown`, with the newest object known) for every queued or stored key the
//!   list lacks, so a deletion missed while the watch was down is still delivered;
//! - a resync queues a `Sync` delta only for stored keys with no pending deltas, so it never
//!   lands behind a real change.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Delta, DeltaFifo};
use crate::object::{DeletedObject, Object};

/// What a [`DeltaFifo`] needs from the store it feeds: which keys exist (for delete
/// detection on `Replace`, resync, and ignoring unknown deletes).
pub trait KnownObjects: Send + Sync {
    /// Every key the store holds.
    fn known_keys(&self) -> Vec<String>;
    /// The stored object for `key`.
    fn known_object(&self, key: &str) -> Option<Arc<Object>>;
}

impl DeltaFifo {
    /// The object the store holds for `obj`'s key when it has `obj`'s resourceVersion (so
    /// the same content: every write of an object changes its resourceVersion). A relist
    /// hands this to [`replace`](Self::replace) instead of its freshly decoded copy, so
    /// objects that did not change are not held twice while the list is applied.
    pub fn stored_unchanged(&self, obj: &Object) -> Option<Arc<Object>> {
        let rv = obj.resource_version();
        if rv.is_empty() {
            return None;
        }
        let stored = self.known.as_ref()?.known_object(obj.key())?;
        (stored.resource_version() == rv).then_some(stored)
    }

    /// Replaces the content with a fresh list (a relist): a `Replaced` delta per object, then
    /// a `Deleted` tombstone for every queued or known key the list lacks.
    pub fn replace(&self, list: Vec<Arc<Object>>) {
        let mut s = self.state.lock();
        let mut listed: HashSet<Arc<str>, foldhash::fast::RandomState> = HashSet::default();
        listed.reserve(list.len());
        for obj in list {
            let key = obj.key().to_owned();
            s.queue_delta(&key, Delta::Replaced(obj));
            if let Some(k) = s.items.get_key_value(key.as_str()).map(|(k, _)| k.clone()) {
                listed.insert(k);
            }
        }
        // Deletions among queued keys: tombstone with the newest object we have.
        let vanished_queued: Vec<(Arc<str>, Arc<Object>)> = s
            .queue
            .iter()
            .filter(|k| !listed.contains(&**k))
            .filter_map(|k| s.items.get(k).and_then(|d| d.last()).map(|d| (k.clone(), d.object().clone())))
            .collect();
        for (key, last_known) in vanished_queued {
            s.queue_delta(
                &key,
                Delta::Deleted(DeletedObject::FinalStateUnknown { key: key.clone(), last_known }),
            );
        }
        // Deletions among keys only the store knows.
        if let Some(known) = &self.known {
            for key in known.known_keys() {
                if listed.contains(key.as_str()) || s.items.contains_key(key.as_str()) {
                    continue;
                }
                let Some(last_known) = known.known_object(&key) else { continue };
                let key: Arc<str> = Arc::from(key);
                s.queue_delta(
                    &key,
                    Delta::Deleted(DeletedObject::FinalStateUnknown { key: key.clone(), last_known }),
                );
            }
        }
        if !s.populated {
            s.populated = true;
            s.initial_population = s.queue.len();
        }
        self.publish_synced(&s);
        drop(s);
        self.notify.notify_waiters();
    }

    /// Queues a `Sync` delta for every key the store knows that has no pending deltas.
    pub fn resync(&self) {
        let Some(known) = &self.known else { return };
        let mut s = self.state.lock();
        let mut queued_any = false;
        for key in known.known_keys() {
            if s.items.contains_key(key.as_str()) {
                continue;
            }
            if let Some(obj) = known.known_object(&key) {
                s.queue_delta(&key, Delta::Sync(obj));
                queued_any = true;
            }
        }
        drop(s);
        if queued_any {
            self.notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::fifo::DeltaType;

    #[test]
    fn a_relisted_object_with_the_stored_resource_version_is_the_stored_one() {
        let cached = obj("a", 5);
        let (_s, known) = store(std::slice::from_ref(&cached));
        let f = DeltaFifo::new(Some(known));
        let same = f.stored_unchanged(&obj("a", 5)).expect("unchanged");
        assert!(Arc::ptr_eq(&same, &cached));
        assert!(f.stored_unchanged(&obj("a", 6)).is_none(), "a changed object is its new copy");
        assert!(f.stored_unchanged(&obj("b", 5)).is_none(), "an object the store lacks");
        assert!(DeltaFifo::new(None).stored_unchanged(&obj("a", 5)).is_none(), "no store");
        let no_rv = Arc::new(Object::from_json(r#"{"metadata":{"name":"a"}}"#.into()).unwrap());
        let (_s, known) = store(std::slice::from_ref(&no_rv));
        assert!(
            DeltaFifo::new(Some(known)).stored_unchanged(&no_rv).is_none(),
            "no resourceVersion to compare"
        );
    }

    // TestDeltaFIFO_ReplaceMakesDeletions / ReplaceMakesDeletionsReplaced
    #[tokio::test]
    async fn delta_fifo_replace_makes_deletions() {
        // "baz" is only in the store, "foo" is queued; neither is in the new list.
        let (_, k) = store(&[obj("foo", 5), obj("bar", 6), obj("baz", 7)]);
        let f = DeltaFifo::new(Some(k));
        f.delete(known(&obj("baz", 10)));
        f.add(obj("qux", 3));
        f.replace(vec![obj("foo", 5)]);

        let mut got = Vec::new();
        while !f.is_empty() {
            got.push(pop(&f).await);
        }
        got.sort();
        assert_eq!(
            got,
            [
                ("bar".into(), vec![(DeltaType::Deleted, "6".into(), true)]),
                ("baz".into(), vec![(DeltaType::Deleted, "10".into(), false)]),
                ("foo".into(), vec![(DeltaType::Replaced, "5".into(), false)]),
                (
                    "qux".into(),
                    vec![(DeltaType::Added, "3".into(), false), (DeltaType::Deleted, "3".into(), true)]
                ),
            ],
            "baz: the queued real delete wins over the tombstone (dedup); qux: queued then vanished \
             gets a tombstone with its newest object; bar: known only, tombstone from the store"
        );
    }

    // TestDeltaFIFO_ReplaceDeltaType / addReplace
    #[tokio::test]
    async fn delta_fifo_add_then_replace_keeps_order() {
        let f = DeltaFifo::new(None);
        f.add(obj("foo", 10));
        f.replace(vec![obj("foo", 15)]);
        let (_, d) = pop(&f).await;
        assert_eq!(d.iter().map(|x| x.0).collect::<Vec<_>>(), [DeltaType::Added, DeltaType::Replaced]);
    }

    // TestDeltaFIFO_Resync / ResyncNonExisting / UpdateResyncRace
    #[tokio::test]
    async fn delta_fifo_resync_skips_pending_keys() {
        let (s, k) = store(&[obj("foo", 5), obj("bar", 6)]);
        let f = DeltaFifo::new(Some(k));
        f.update(obj("foo", 7));
        f.resync();
        let foo = f.deltas_of("foo").unwrap();
        assert_eq!(foo.len(), 1, "no Sync behind a pending real change");
        assert_eq!(foo[0].delta_type(), DeltaType::Updated);
        let bar = f.deltas_of("bar").unwrap();
        assert!(matches!(&bar[..], [Delta::Sync(o)] if o.resource_version() == "6"));

        // A key deleted from the store meanwhile is not resynced (ResyncNonExisting).
        s.delete("bar");
        pop(&f).await;
        pop(&f).await;
        f.resync();
        assert_eq!(f.queued_keys(), ["foo"]);
    }
}
