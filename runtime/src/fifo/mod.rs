//! DeltaFIFO (client-go `tools/cache/delta_fifo.go`): a queue of keys, each with the ordered
//! list of changes ("deltas") that happened to its object since it was last popped.
//!
//! The queue itself lives here; the deltas it holds in `delta.rs`, what it asks of the store it
//! feeds and the relist and resync built on that in `relist.rs`, and the source's progress it
//! tracks in `progress.rs`.
//!
//! Invariants (kept under one mutex):
//! - a key is in `queue` if and only if it is in `items`, and at most once; `items[k]` is
//!   never empty;
//! - deltas of one key stay in arrival order (oldest first); the last two are never both
//!   `Deleted` (they collapse, keeping the one that is not a tombstone);
//! - `has_synced` is true once the keys queued by the first `replace` have all been popped
//!   and processed (or once an add/update/delete came before any replace);
//! - once drained, `items` and `queue` hold no more than 4 × [`RETAINED_SLOTS`] slots:
//!   a relist of a million keys does not leave their table behind (hash maps never shrink on
//!   their own, and a million keys' table is a sizeable fraction of the objects' JSON).
//!
//! `pop` runs the caller's `process` while holding the lock, as client-go does, so a key's
//! deltas are fully applied before anyone can observe `has_synced` flip.

mod delta;
mod progress;
mod relist;
#[cfg(test)]
mod test_support;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use delta::dedup_deltas;
pub use delta::{Delta, DeltaType, Deltas};
pub use progress::SourceProgress;
pub use relist::KnownObjects;

use crate::object::{DeletedObject, Object};

/// The capacity (keys) a drained FIFO keeps: what a watch's bursts need, so steady streaming
/// never reallocates, while a large list's table is given back once it has been popped.
pub const RETAINED_SLOTS: usize = 4096;

/// Why `pop` returned without processing anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("DeltaFIFO: manipulating with closed queue")]
pub struct Closed;

/// What `process` tells `pop` to do with the deltas it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PopOutcome {
    /// Done with them.
    Processed,
    /// Put them back (unless the key was queued again meanwhile, which wins).
    Requeue,
}

#[derive(Default)]
struct State {
    items: HashMap<Arc<str>, Deltas, foldhash::fast::RandomState>,
    queue: VecDeque<Arc<str>>,
    /// A replace or add/update/delete has happened.
    populated: bool,
    /// Keys from the first replace still to pop.
    initial_population: usize,
    closed: bool,
    /// The source's progress (see [`SourceProgress`]).
    received: Option<Arc<str>>,
    delivered: Option<Arc<str>>,
    streaming: bool,
    quiet_since: Option<tokio::time::Instant>,
}

impl State {
    fn has_synced(&self) -> bool {
        self.populated && self.initial_population == 0
    }

    /// Gives back the table of a large batch once the queue is empty (see the invariants);
    /// whether there was one. A table counts as large above four times what is retained (a
    /// hash table shrunk to hold `RETAINED_SLOTS` keys may have room for more), so a FIFO
    /// that streams small batches never shrinks, nor purges, again.
    fn release_spare_capacity(&mut self) -> bool {
        let large = self.items.capacity() > 4 * RETAINED_SLOTS || self.queue.capacity() > 4 * RETAINED_SLOTS;
        if large {
            self.items.shrink_to(RETAINED_SLOTS);
            self.queue.shrink_to(RETAINED_SLOTS);
        }
        large
    }

    fn queue_delta(&mut self, key: &str, delta: Delta) {
        match self.items.get_mut(key) {
            Some(deltas) => {
                deltas.push(delta);
                dedup_deltas(deltas);
            }
            None => {
                let key: Arc<str> = Arc::from(key);
                self.queue.push_back(key.clone());
                self.items.insert(key, vec![delta]);
            }
        }
    }
}

/// The DeltaFIFO between a reflector and an informer's processing loop.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use wasmctrl_runtime::fifo::{Delta, DeltaFifo, PopOutcome};
/// use wasmctrl_runtime::object::Object;
/// let fifo = DeltaFifo::new(None);
/// let obj = Arc::new(Object::from_json(r#"{"metadata":{"name":"a","resourceVersion":"1"}}"#.into()).unwrap());
/// fifo.add(obj.clone());
/// fifo.update(obj);
/// fifo.pop(|key, deltas, _initial| {
///     assert_eq!(key, "a");
///     assert!(matches!(deltas[..], [Delta::Added(_), Delta::Updated(_)]));
///     PopOutcome::Processed
/// }).await.unwrap();
/// # });
/// ```
pub struct DeltaFifo {
    state: Mutex<State>,
    known: Option<Arc<dyn KnownObjects>>,
    notify: Notify,
    /// Flips to true (once) when `has_synced` becomes true, after the last initial key's
    /// `process` returned.
    synced: tokio::sync::watch::Sender<bool>,
    /// Counts changes of [`progress`](Self::progress); waiters of
    /// [`progress_after`](Self::progress_after) are woken at each.
    progress_seq: std::sync::atomic::AtomicU64,
    progress_changed: Notify,
}

impl std::fmt::Debug for DeltaFifo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("DeltaFifo").field("queued", &s.queue.len()).field("closed", &s.closed).finish()
    }
}

impl DeltaFifo {
    /// A FIFO; `known` is the store it feeds (for `replace` delete detection and `resync`).
    pub fn new(known: Option<Arc<dyn KnownObjects>>) -> Self {
        Self {
            state: Mutex::new(State::default()),
            known,
            notify: Notify::new(),
            synced: tokio::sync::watch::Sender::new(false),
            progress_seq: std::sync::atomic::AtomicU64::new(0),
            progress_changed: Notify::new(),
        }
    }

    /// Publishes `has_synced` the first time it holds (called with the lock held).
    fn publish_synced(&self, s: &State) {
        if s.has_synced() && !*self.synced.borrow() {
            self.synced.send_replace(true);
        }
    }

    /// A receiver that turns true once [`has_synced`](Self::has_synced) does (it never turns
    /// back); lets waiters learn of a sync even when nothing is left to pop (an empty list).
    pub fn synced(&self) -> tokio::sync::watch::Receiver<bool> {
        self.synced.subscribe()
    }

    fn push(&self, key: &str, delta: Delta) {
        let mut s = self.state.lock();
        s.populated = true;
        s.queue_delta(key, delta);
        self.publish_synced(&s);
        drop(s);
        self.notify.notify_waiters();
    }

    /// Queues an `Added` delta.
    pub fn add(&self, obj: Arc<Object>) {
        let keyed = obj.clone();
        self.push(keyed.key(), Delta::Added(obj));
    }

    /// Queues an `Updated` delta.
    pub fn update(&self, obj: Arc<Object>) {
        let keyed = obj.clone();
        self.push(keyed.key(), Delta::Updated(obj));
    }

    /// Queues a `Deleted` delta, unless the key is neither queued nor known to the store
    /// (there is nothing to delete).
    pub fn delete(&self, obj: DeletedObject) {
        let key = obj.key().to_owned();
        let mut s = self.state.lock();
        let queued = s.items.contains_key(key.as_str());
        let known = match &self.known {
            Some(k) => k.known_object(&key).is_some(),
            None => false,
        };
        if !queued && !known {
            return;
        }
        s.populated = true;
        s.queue_delta(&key, Delta::Deleted(obj));
        self.publish_synced(&s);
        drop(s);
        self.notify.notify_waiters();
    }

    /// Waits for a key, removes it with its deltas, and calls `process(key, &deltas,
    /// in_initial_list)` under the lock. `Requeue` puts the deltas back unless the key was
    /// queued again meanwhile. Returns [`Closed`] once closed and empty.
    pub async fn pop<F>(&self, mut process: F) -> Result<(), Closed>
    where
        F: FnMut(&str, &[Delta], bool) -> PopOutcome,
    {
        self.pop_batch(1, |k, d, i| process(k, d, i)).await.map(|_| ())
    }

    /// Like [`pop`](Self::pop) but processes up to `max` ready keys under one lock
    /// acquisition, in queue order. Returns how many keys were processed.
    pub async fn pop_batch<F>(&self, max: usize, process: F) -> Result<usize, Closed>
    where
        F: FnMut(&str, &[Delta], bool) -> PopOutcome,
    {
        self.pop_batch_then(max, process, || ()).await
    }

    /// [`pop_batch`](Self::pop_batch), then `finish()` still under the lock, before
    /// `has_synced` is published: lets the informer apply a batch and hand out its
    /// notifications atomically.
    pub async fn pop_batch_then<F, G>(&self, max: usize, mut process: F, finish: G) -> Result<usize, Closed>
    where
        F: FnMut(&str, &[Delta], bool) -> PopOutcome,
        G: FnOnce(),
    {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state.lock();
                if !s.queue.is_empty() {
                    let mut n = 0;
                    while n < max.max(1) {
                        let Some(key) = s.queue.pop_front() else { break };
                        let Some(deltas) = s.items.remove(&key) else { continue };
                        let in_initial_list = !s.has_synced();
                        if s.initial_population > 0 {
                            s.initial_population -= 1;
                        }
                        n += 1;
                        if process(&key, &deltas, in_initial_list) == PopOutcome::Requeue
                            && !s.items.contains_key(&key)
                        {
                            s.queue.push_back(key.clone());
                            s.items.insert(key, deltas);
                        }
                    }
                    finish();
                    let mut released = false;
                    let mut progressed = false;
                    if s.queue.is_empty() {
                        progressed = s.delivered != s.received;
                        s.delivered = s.received.clone();
                        released = s.release_spare_capacity();
                    }
                    self.publish_synced(&s);
                    drop(s);
                    if progressed {
                        self.progressed();
                    }
                    if released {
                        // A large list was applied: what it allocated beside the cache (this
                        // table, the decoded pages) goes back to the system now.
                        crate::heap::release_free_pages();
                    }
                    return Ok(n);
                }
                if s.closed {
                    return Err(Closed);
                }
            }
            notified.await;
        }
    }

    /// Runs `f` under the FIFO lock: no pop is processed meanwhile.
    pub(crate) fn locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let _s = self.state.lock();
        f()
    }

    /// Queues watch changes under one lock acquisition with one wake-up: `Added` / `Updated`
    /// as [`add`](Self::add) / [`update`](Self::update), `Deleted` as
    /// [`delete`](Self::delete) (ignored for unknown keys); other types are queued as given.
    pub fn push_all(&self, deltas: Vec<Delta>) {
        if deltas.is_empty() {
            return;
        }
        let mut s = self.state.lock();
        for delta in deltas {
            // Own the key apart from `delta`, which moves into the queue.
            let tombstone_key = match &delta {
                Delta::Deleted(DeletedObject::FinalStateUnknown { key, .. }) => Some(key.clone()),
                _ => None,
            };
            let keyed = delta.object().clone();
            let key: &str = tombstone_key.as_deref().unwrap_or(keyed.key());
            if matches!(delta, Delta::Deleted(_))
                && !s.items.contains_key(key)
                && self.known.as_ref().is_none_or(|k| k.known_object(key).is_none())
            {
                continue;
            }
            s.populated = true;
            s.queue_delta(key, delta);
        }
        self.publish_synced(&s);
        drop(s);
        self.notify.notify_waiters();
    }

    /// Wakes every waiting `pop` with [`Closed`] (after the queue drains).
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.notify.notify_waiters();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Whether the first list has been fully popped (see the module doc).
    pub fn has_synced(&self) -> bool {
        self.state.lock().has_synced()
    }

    /// Queued keys, in pop order.
    pub fn queued_keys(&self) -> Vec<String> {
        self.state.lock().queue.iter().map(|k| k.to_string()).collect()
    }

    /// The pending deltas of `key`, if queued.
    pub fn deltas_of(&self, key: &str) -> Option<Deltas> {
        self.state.lock().items.get(key).cloned()
    }

    /// Number of queued keys.
    pub fn len(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Whether no key is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::test_support::*;
    use super::*;

    // TestDeltaFIFO_basic
    #[tokio::test]
    async fn delta_fifo_basic() {
        let f = DeltaFifo::new(None);
        for i in 0..5 {
            f.add(obj(&format!("a{i}"), i));
        }
        for i in 0..5 {
            f.update(obj(&format!("b{i}"), i + 10));
        }
        let mut a = 0;
        let mut b = 0;
        for _ in 0..10 {
            let (key, deltas) = pop(&f).await;
            assert_eq!(deltas.len(), 1);
            if key.starts_with('a') {
                assert_eq!(deltas[0].0, DeltaType::Added);
                assert_eq!(key, format!("a{a}"), "FIFO order");
                a += 1;
            } else {
                assert_eq!(deltas[0].0, DeltaType::Updated);
                assert_eq!(key, format!("b{b}"));
                b += 1;
            }
        }
        assert!(f.is_empty());
    }

    // TestDeltaFIFO_requeueOnPop
    #[tokio::test]
    async fn delta_fifo_requeue_on_pop() {
        let f = DeltaFifo::new(None);
        f.add(obj("foo", 10));
        f.pop(|k, d, _| {
            assert_eq!(k, "foo");
            assert_eq!(d.len(), 1);
            PopOutcome::Requeue
        })
        .await
        .unwrap();
        assert_eq!(f.deltas_of("foo").map(|d| d.len()), Some(1), "requeued deltas are back");
        // The requeued key is popped again, with the same deltas.
        let (key, deltas) = pop(&f).await;
        assert_eq!((key.as_str(), deltas.len()), ("foo", 1));
        assert!(f.is_empty());
    }

    // TestDeltaFIFO_addUpdate
    #[tokio::test]
    async fn delta_fifo_add_update_delete_collapse_per_key() {
        let f = DeltaFifo::new(None);
        f.add(obj("foo", 10));
        f.update(obj("foo", 12));
        f.delete(known(&obj("foo", 15)));
        assert_eq!(f.queued_keys(), ["foo"], "one key, queued once");
        let (key, deltas) = pop(&f).await;
        assert_eq!(key, "foo");
        let types: Vec<_> = deltas.iter().map(|d| (d.0, d.1.as_str())).collect();
        assert_eq!(types, [(DeltaType::Added, "10"), (DeltaType::Updated, "12"), (DeltaType::Deleted, "15")]);
        // A later add of the same key is a new entry.
        f.add(obj("foo", 20));
        assert_eq!(pop(&f).await.1[0].1, "20");
    }

    // TestDeltaFIFO_DeleteExistingNonPropagated / ignored delete of unknown keys
    #[tokio::test]
    async fn delta_fifo_ignores_delete_of_unknown_key() {
        let f = DeltaFifo::new(None);
        f.delete(known(&obj("ghost", 1)));
        assert!(f.is_empty(), "delete of a key neither queued nor known is ignored");
        assert!(!f.has_synced(), "an ignored delete does not populate");

        let (_, k) = store(&[obj("known", 1)]);
        let f = DeltaFifo::new(Some(k));
        f.delete(known(&obj("ghost", 1)));
        assert!(f.is_empty());
        f.delete(known(&obj("known", 2)));
        assert_eq!(f.queued_keys(), ["known"], "delete of a key the store knows is queued");
    }

    // TestDeltaFIFO_HasSynced / HasSyncedCorrectOnDeletion
    #[tokio::test]
    async fn delta_fifo_has_synced_after_first_replace_popped() {
        let (_, k) = store(&[obj("gone", 1)]);
        let f = DeltaFifo::new(Some(k));
        assert!(!f.has_synced());
        f.replace(vec![obj("a", 1), obj("b", 2)]);
        assert!(!f.has_synced());
        assert_eq!(f.len(), 3, "a, b and the tombstone for 'gone'");
        pop(&f).await;
        pop(&f).await;
        assert!(!f.has_synced());
        f.add(obj("late", 3)); // not part of the initial batch
        pop(&f).await;
        assert!(f.has_synced(), "synced once the whole first batch (incl. deletions) is popped");
        // A second replace does not un-sync.
        f.replace(vec![obj("x", 9)]);
        assert!(f.has_synced());

        // An add before any replace counts as populated.
        let f = DeltaFifo::new(None);
        f.add(obj("a", 1));
        assert!(f.has_synced());

        // Empty first list: synced at once, and waiters learn it without any pop.
        let f = DeltaFifo::new(None);
        let mut rx = f.synced();
        f.replace(Vec::new());
        assert!(f.has_synced());
        rx.wait_for(|v| *v).await.unwrap();
    }

    #[tokio::test]
    async fn delta_fifo_in_initial_list_flag() {
        let f = DeltaFifo::new(None);
        f.replace(vec![obj("a", 1)]);
        f.add(obj("b", 2));
        let mut flags = Vec::new();
        for _ in 0..2 {
            f.pop(|k, _, initial| {
                flags.push((k.to_owned(), initial));
                PopOutcome::Processed
            })
            .await
            .unwrap();
        }
        assert_eq!(flags, [("a".to_owned(), true), ("b".to_owned(), false)]);
    }

    // TestDeltaFIFO_PopShouldUnblockWhenClosed
    #[tokio::test]
    async fn delta_fifo_pop_unblocks_on_close() {
        let f = Arc::new(DeltaFifo::new(None));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let f = f.clone();
                tokio::spawn(async move { f.pop(|_, _, _| PopOutcome::Processed).await })
            })
            .collect();
        tokio::task::yield_now().await;
        f.close();
        for w in waiters {
            assert_eq!(w.await.unwrap(), Err(Closed));
        }
        assert!(f.is_closed());
    }

    #[tokio::test]
    async fn delta_fifo_close_drains_remaining_items_first() {
        let f = DeltaFifo::new(None);
        f.add(obj("a", 1));
        f.close();
        assert_eq!(pop(&f).await.0, "a");
        assert_eq!(f.pop(|_, _, _| PopOutcome::Processed).await, Err(Closed));
    }

    #[tokio::test]
    async fn delta_fifo_blocking_pop_wakes_on_add() {
        let f = Arc::new(DeltaFifo::new(None));
        let popper = {
            let f = f.clone();
            tokio::spawn(async move { pop(&f).await.0 })
        };
        tokio::task::yield_now().await;
        f.add(obj("late", 1));
        assert_eq!(popper.await.unwrap(), "late");
    }

    #[tokio::test]
    async fn delta_fifo_push_all_matches_single_calls() {
        let (_, k) = store(&[obj("known", 1)]);
        let f = DeltaFifo::new(Some(k));
        f.push_all(vec![
            Delta::Added(obj("a", 1)),
            Delta::Updated(obj("a", 2)),
            Delta::Deleted(known(&obj("ghost", 3))),
            Delta::Deleted(known(&obj("known", 4))),
            Delta::Deleted(known(&obj("a", 5))),
            Delta::Deleted(known(&obj("a", 6))),
        ]);
        assert_eq!(f.queued_keys(), ["a", "known"], "unknown delete ignored");
        let a = f.deltas_of("a").unwrap();
        assert_eq!(
            a.iter().map(Delta::delta_type).collect::<Vec<_>>(),
            [DeltaType::Added, DeltaType::Updated, DeltaType::Deleted]
        );
        assert_eq!(a[2].object().resource_version(), "5", "deletes dedup as with delete()");
        assert!(f.has_synced());
    }

    // TestDeltaFIFO_detectLineJumpers: a re-added key keeps its original position.
    #[tokio::test]
    async fn delta_fifo_keys_keep_their_place() {
        let f = DeltaFifo::new(None);
        f.add(obj("foo", 10));
        f.add(obj("bar", 1));
        f.add(obj("foo", 11));
        f.add(obj("foo", 13));
        f.add(obj("zab", 30));
        assert_eq!(f.queued_keys(), ["foo", "bar", "zab"]);
        assert_eq!(pop(&f).await.1.len(), 3);
        f.add(obj("foo", 14));
        assert_eq!(f.queued_keys(), ["bar", "zab", "foo"]);
    }

    #[tokio::test]
    async fn delta_fifo_batch_pop_keeps_per_key_order() {
        let f = DeltaFifo::new(None);
        for i in 0..10 {
            f.add(obj(&format!("k{}", i % 4), i));
        }
        let mut seen = Vec::new();
        let n = f
            .pop_batch(3, |k, d, _| {
                seen.push((
                    k.to_owned(),
                    d.iter().map(|x| x.object().resource_version().to_owned()).collect::<Vec<_>>(),
                ));
                PopOutcome::Processed
            })
            .await
            .unwrap();
        assert_eq!(n, 3);
        assert_eq!(seen[0], ("k0".to_owned(), vec!["0".into(), "4".into(), "8".into()]));
        assert_eq!(seen[1].0, "k1");
        assert_eq!(seen[2].0, "k2");
        assert_eq!(f.queued_keys(), ["k3"]);
    }

    #[tokio::test]
    async fn delta_fifo_gives_back_a_large_lists_table_once_drained() {
        let f = DeltaFifo::new(None);
        let n = 5 * RETAINED_SLOTS;
        f.replace((0..n).map(|i| obj(&format!("k{i}"), i as u64)).collect());
        {
            let s = f.state.lock();
            assert!(s.items.capacity() >= n && s.queue.capacity() >= n);
        }
        let mut popped = 0;
        while popped < n {
            popped += f.pop_batch(1000, |_, _, _| PopOutcome::Processed).await.unwrap();
            if popped < n {
                assert!(f.state.lock().items.capacity() >= n - popped, "kept while keys are queued");
            }
        }
        {
            let mut s = f.state.lock();
            assert!(s.items.is_empty() && s.queue.is_empty());
            assert!(s.items.capacity() <= 2 * RETAINED_SLOTS, "items capacity {}", s.items.capacity());
            assert!(s.queue.capacity() <= 2 * RETAINED_SLOTS, "queue capacity {}", s.queue.capacity());
            // Given back once: later drains of small batches neither shrink nor purge again.
            assert!(!s.release_spare_capacity(), "a shrunk table is not large");
        }
        // Still a working FIFO.
        f.add(obj("again", 1));
        assert_eq!(pop(&f).await.0, "again");
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Create(u8),
            Modify(u8),
            Remove(u8),
            /// The watch broke; relist the truth.
            Relist,
            Resync,
            Pop(u8),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0u8..6).prop_map(Op::Create),
                (0u8..6).prop_map(Op::Modify),
                (0u8..6).prop_map(Op::Remove),
                Just(Op::Relist),
                Just(Op::Resync),
                (1u8..4).prop_map(Op::Pop),
            ]
        }

        fn check_invariant(f: &DeltaFifo) {
            let s = f.state.lock();
            let queued: HashSet<&str> = s.queue.iter().map(|k| &**k).collect();
            assert_eq!(queued.len(), s.queue.len(), "no duplicate keys in queue");
            assert_eq!(queued.len(), s.items.len(), "queue and items hold the same keys");
            for (k, d) in &s.items {
                assert!(queued.contains(&**k));
                assert!(!d.is_empty());
                for w in d.windows(2) {
                    assert!(
                        !(w[0].delta_type() == DeltaType::Deleted && w[1].delta_type() == DeltaType::Deleted),
                        "two consecutive deletes"
                    );
                }
                assert!(d.iter().all(|x| x.key() == &**k));
            }
        }

        /// HandleDeltas applied to a plain store.
        fn apply(cache: &MapStore, deltas: &[Delta]) {
            for d in deltas {
                match d {
                    Delta::Deleted(x) => {
                        cache.delete(x.key());
                    }
                    other => {
                        cache.upsert(other.object().clone());
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn fifo_invariant_and_cache_converges(ops in proptest::collection::vec(op(), 1..80)) {
                let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                rt.block_on(async {
                    let cache = Arc::new(MapStore::default());
                    let f = DeltaFifo::new(Some(cache.clone()));
                    // The API server's truth: name -> resourceVersion.
                    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
                    let mut rv = 0u64;
                    f.replace(Vec::new());
                    for op in ops {
                        match op {
                            Op::Create(n) => {
                                let name = format!("o{n}");
                                if !truth.contains_key(&name) {
                                    rv += 1;
                                    truth.insert(name.clone(), rv);
                                    f.add(obj(&name, rv));
                                }
                            }
                            Op::Modify(n) => {
                                let name = format!("o{n}");
                                if truth.contains_key(&name) {
                                    rv += 1;
                                    truth.insert(name.clone(), rv);
                                    f.update(obj(&name, rv));
                                }
                            }
                            Op::Remove(n) => {
                                let name = format!("o{n}");
                                if let Some(last) = truth.remove(&name) {
                                    f.delete(DeletedObject::Known(obj(&name, last)));
                                }
                            }
                            Op::Relist => {
                                f.replace(truth.iter().map(|(n, v)| obj(n, *v)).collect());
                            }
                            Op::Resync => f.resync(),
                            Op::Pop(n) => {
                                for _ in 0..n {
                                    if f.is_empty() { break; }
                                    f.pop(|_, d, _| { apply(&cache, d); PopOutcome::Processed }).await.unwrap();
                                }
                            }
                        }
                        check_invariant(&f);
                    }
                    while !f.is_empty() {
                        f.pop(|_, d, _| { apply(&cache, d); PopOutcome::Processed }).await.unwrap();
                        check_invariant(&f);
                    }
                    let cached: BTreeMap<String, u64> = cache
                        .0
                        .lock()
                        .values()
                        .map(|o| (o.key().to_owned(), o.resource_version().parse().unwrap()))
                        .collect();
                    assert_eq!(cached, truth, "cache == source of truth");
                });
            }
        }
    }
}
