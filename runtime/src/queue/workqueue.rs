//! The plain work queue: client-go's `workqueue.Type`, with controller-runtime's low priority
//! for initial-list events. Delayed adds live in [`super::delaying`], the hand-over between
//! queues in [`super::handover`]; all three share this queue's one mutex.
//!
//! Invariants (all under one mutex):
//! - A key is *dirty* while it waits to be processed, and *processing* between `get` and
//!   `done`. A key handed out by `get` is not handed out again until `done` is called for it,
//!   so two workers never hold the same key at once.
//! - Adding a dirty key is a no-op (it may raise its priority). Adding a processing key marks
//!   it dirty; `done` then puts it back in the ready queue, so no change is lost.
//! - A key is in a ready deque (with the sequence number its dirty entry records) if and only
//!   if it is dirty and not processing. Deque entries whose sequence number no longer matches
//!   are stale (left behind by a priority raise) and are skipped.
//! - After `shut_down`, adds are ignored and `get` hands out what is still ready, then returns
//!   `None`.
//! - With an admission filter ([`WorkQueue::set_admission`]), an add (immediate or delayed)
//!   of a key the filter refuses is dropped before it touches the queue; keys moved in by a
//!   hand-over are not filtered (whoever takes them out decides).
//! - A key may carry a [`TraceOrigin`] (what caused its reconcile, for tracing): the first
//!   one given while the key is dirty (or waiting) stays with it until `get_traced` hands the
//!   key out, and moves with it on a hand-over. Origins live in side maps that stay empty
//!   when tracing is off, so untraced adds and gets only look at an empty map's length.
//!
//! Time is tokio's (`tokio::time::Instant`), so tests can pause and advance the clock.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::delaying::Waiting;
use super::metrics::QueueMetrics;
use crate::metrics::Metrics;
use crate::telemetry::TraceOrigin;

/// The trace origin a key may carry (see the module doc).
pub type Origin = Option<Box<TraceOrigin>>;

/// What a queue key must be: `Request`, `String`, or any small value-like type.
pub trait QueueKey: Clone + Eq + Hash + Send + Sync + 'static {}
impl<T: Clone + Eq + Hash + Send + Sync + 'static> QueueKey for T {}

/// The priority of an add. Ready keys of [`Priority::Normal`] are always handed out before
/// keys of [`Priority::Low`] (controller-runtime gives initial-list events low priority, so
/// live changes are not stuck behind a start-up backlog). Re-adding a low-priority key with
/// normal priority raises it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// Live changes, retries, delayed re-adds.
    #[default]
    Normal,
    /// Start-up backlog (objects from an informer's initial list).
    Low,
}

impl Priority {
    pub(super) fn index(self) -> usize {
        match self {
            Priority::Normal => 0,
            Priority::Low => 1,
        }
    }
}

/// A key waiting to be processed.
pub(super) struct Dirty {
    /// When the key was first added since it was last handed out (for queue latency).
    pub(super) added_at: Instant,
    pub(super) priority: Priority,
    /// The sequence number of its live ready-deque entry; `None` while it is processing.
    pub(super) queued: Option<u64>,
}

pub(super) struct State<K: QueueKey> {
    pub(super) dirty: HashMap<K, Dirty>,
    /// Key → when its current processing started.
    pub(super) processing: HashMap<K, Instant>,
    /// Ready deques by [`Priority::index`]; entries carry the sequence number of the add.
    pub(super) ready: [VecDeque<(K, u64)>; 2],
    /// Number of live (non-stale) ready entries: the queue depth.
    pub(super) ready_len: usize,
    /// Delayed adds (min-heap; stale entries are skipped by sequence number).
    pub(super) waiting: BinaryHeap<Reverse<Waiting<K>>>,
    /// Key → (ready time, sequence number) of its live delayed add.
    pub(super) waiting_keys: HashMap<K, (Instant, u64)>,
    pub(super) next_seq: u64,
    pub(super) shutting_down: bool,
    pub(super) draining: bool,
    /// The successor this queue was handed over to.
    pub(super) forward: Option<WorkQueue<K>>,
    /// Keys processing here on behalf of a predecessor (see `handover.rs`).
    pub(super) borrowed: std::collections::HashSet<K>,
    /// Trace origins of dirty keys (empty unless tracing is on).
    pub(super) origins: HashMap<K, Box<TraceOrigin>>,
    /// Trace origins of waiting keys (empty unless tracing is on).
    pub(super) waiting_origins: HashMap<K, Box<TraceOrigin>>,
}

/// Decides whether an add is kept (see [`WorkQueue::set_admission`]).
pub type Admission<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

pub(super) struct Inner<K: QueueKey> {
    pub(super) state: Mutex<State<K>>,
    /// Set once; consulted outside the state lock.
    pub(super) admission: std::sync::OnceLock<Admission<K>>,
    /// Wakes getters when a key becomes ready, the earliest deadline moves, or on shut down.
    pub(super) ready_notify: Notify,
    /// Wakes `shut_down_with_drain` when the processing set empties.
    pub(super) drained_notify: Notify,
    pub(super) metrics: Option<QueueMetrics>,
}

/// A FIFO work queue of keys with dirty/processing sets, delayed adds and two priorities.
///
/// Cheap to clone: clones share one queue.
///
/// ```
/// # tokio_test_block_on(async {
/// use wasmctrl_runtime::queue::WorkQueue;
/// let q = WorkQueue::new();
/// q.add("a");
/// q.add("a"); // already waiting: no-op
/// let key = q.get().await.unwrap();
/// q.add("a"); // processing: marked dirty, re-queued on done
/// assert_eq!(q.len(), 0);
/// q.done(&key);
/// assert_eq!(q.len(), 1);
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
/// # }
/// ```
pub struct WorkQueue<K: QueueKey> {
    pub(super) inner: Arc<Inner<K>>,
}

impl<K: QueueKey> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        WorkQueue { inner: self.inner.clone() }
    }
}

impl<K: QueueKey> Default for WorkQueue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: QueueKey> std::fmt::Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.inner.state.lock();
        f.debug_struct("WorkQueue")
            .field("ready", &s.ready_len)
            .field("dirty", &s.dirty.len())
            .field("processing", &s.processing.len())
            .field("waiting", &s.waiting_keys.len())
            .field("shutting_down", &s.shutting_down)
            .finish()
    }
}

impl<K: QueueKey> WorkQueue<K> {
    /// A queue without metrics.
    pub fn new() -> Self {
        Self::build(None)
    }

    /// A queue exporting the `workqueue_*` metrics labelled `name="<name>"`.
    ///
    /// When called inside a tokio runtime, a background task refreshes the unfinished-work
    /// gauges every 500 ms (as client-go does) until the queue is dropped or shut down and idle.
    pub fn with_metrics(name: &str, metrics: Arc<Metrics>) -> Self {
        let q = Self::build(Some(QueueMetrics::new(name, &metrics)));
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(refresh_unfinished_work(Arc::downgrade(&q.inner)));
        }
        q
    }

    fn build(metrics: Option<QueueMetrics>) -> Self {
        WorkQueue {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    dirty: HashMap::new(),
                    processing: HashMap::new(),
                    ready: [VecDeque::new(), VecDeque::new()],
                    ready_len: 0,
                    waiting: BinaryHeap::new(),
                    waiting_keys: HashMap::new(),
                    next_seq: 0,
                    shutting_down: false,
                    draining: false,
                    forward: None,
                    borrowed: std::collections::HashSet::new(),
                    origins: HashMap::new(),
                    waiting_origins: HashMap::new(),
                }),
                admission: std::sync::OnceLock::new(),
                ready_notify: Notify::new(),
                drained_notify: Notify::new(),
                metrics,
            }),
        }
    }

    pub(super) fn metrics(&self) -> Option<&QueueMetrics> {
        self.inner.metrics.as_ref()
    }

    /// Filters every later add: a key `admission` refuses is dropped (immediate and delayed
    /// adds alike, checked when the add is made). Set once; returns `false` if a filter was
    /// already set (the first one stays).
    pub fn set_admission(&self, admission: Admission<K>) -> bool {
        self.inner.admission.set(admission).is_ok()
    }

    pub(super) fn admitted(&self, key: &K) -> bool {
        self.inner.admission.get().is_none_or(|a| a(key))
    }

    /// Marks `key` as needing processing (normal priority).
    pub fn add(&self, key: K) {
        self.add_with_priority(key, Priority::Normal);
    }

    /// Marks `key` as needing processing with `priority`. Ignored after shut down.
    pub fn add_with_priority(&self, key: K, priority: Priority) {
        self.add_traced(key, priority, None);
    }

    /// As [`add_with_priority`](Self::add_with_priority), with what caused the add (kept
    /// unless the key already carries an origin).
    pub fn add_traced(&self, key: K, priority: Priority, origin: Origin) {
        if !self.admitted(&key) {
            return;
        }
        let mut s = self.inner.state.lock();
        if let Some(next) = s.forward.clone() {
            drop(s);
            next.add_traced(key, priority, origin);
            return;
        }
        let now = Instant::now();
        let mut woke = self.promote_due(&mut s, now);
        woke |= self.add_locked(&mut s, key, priority, now, origin);
        drop(s);
        if woke {
            self.inner.ready_notify.notify_one();
        }
    }

    /// Waits for a ready key and marks it processing. The caller must call [`done`](Self::done)
    /// with it when finished. Returns `None` once the queue is shut down and nothing is ready.
    ///
    /// Cancel safe: dropping the future before it completes takes nothing from the queue.
    pub async fn get(&self) -> Option<K> {
        self.get_traced().await.map(|(key, _)| key)
    }

    /// As [`get`](Self::get), with the key's trace origin, if it carries one.
    pub async fn get_traced(&self) -> Option<(K, Origin)> {
        loop {
            let notified = self.inner.ready_notify.notified();
            tokio::pin!(notified);
            // Register before looking, so an add between the look and the wait is not missed.
            notified.as_mut().enable();
            let next_deadline = {
                let mut s = self.inner.state.lock();
                let now = Instant::now();
                self.promote_due(&mut s, now);
                if let Some(key) = self.pop_locked(&mut s, now) {
                    let more = s.ready_len > 0;
                    let origin = if s.origins.is_empty() { None } else { s.origins.remove(&key) };
                    drop(s);
                    if more {
                        // Pass the baton: a permit consumed by us may have been meant for two adds.
                        self.inner.ready_notify.notify_one();
                    }
                    return Some((key, origin));
                }
                if s.shutting_down {
                    return None;
                }
                s.waiting.peek().map(|Reverse(w)| w.ready_at)
            };
            match next_deadline {
                Some(deadline) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Returns `key` (handed out by [`get`](Self::get)) to the queue's care: if it was added
    /// while processing, it is ready again.
    pub fn done(&self, key: &K) {
        let mut s = self.inner.state.lock();
        let now = Instant::now();
        let Some(started) = s.processing.remove(key) else {
            return;
        };
        s.borrowed.remove(key);
        if let Some(next) = s.forward.clone() {
            let drained = s.processing.is_empty() && s.draining;
            drop(s);
            next.finish_borrowed(key);
            if drained {
                self.inner.drained_notify.notify_waiters();
            }
            return;
        }
        if let Some(m) = &self.inner.metrics {
            m.work_duration.observe(now.saturating_duration_since(started).as_secs_f64());
        }
        let mut requeued = false;
        let seq = s.next_seq;
        if let Some(d) = s.dirty.get_mut(key) {
            d.queued = Some(seq);
            let idx = d.priority.index();
            s.next_seq += 1;
            s.ready[idx].push_back((key.clone(), seq));
            s.ready_len += 1;
            self.set_depth(&s);
            requeued = true;
        }
        let drained = s.processing.is_empty() && s.draining;
        drop(s);
        if requeued {
            self.inner.ready_notify.notify_one();
        }
        if drained {
            self.inner.drained_notify.notify_waiters();
        }
    }

    /// Number of keys ready to be handed out (the `workqueue_depth`).
    pub fn len(&self) -> usize {
        let mut s = self.inner.state.lock();
        let promoted = self.promote_due(&mut s, Instant::now());
        let len = s.ready_len;
        drop(s);
        if promoted {
            self.inner.ready_notify.notify_one();
        }
        len
    }

    /// Whether no key is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of keys currently handed out and not yet `done`.
    pub fn processing_len(&self) -> usize {
        self.inner.state.lock().processing.len()
    }

    /// Whether some key that is waiting to be handed out (ready, or added again while
    /// processing) or is processing satisfies `f` (one consistent look; delayed adds are not
    /// looked at). `f` runs under the queue's lock: it must not use the queue.
    pub fn any_pending(&self, f: impl FnMut(&K) -> bool) -> bool {
        let s = self.inner.state.lock();
        s.dirty.keys().chain(s.processing.keys()).any(f)
    }

    /// Whether no key is ready, processing or waiting for a delayed add (one consistent look).
    pub fn is_idle(&self) -> bool {
        let s = self.inner.state.lock();
        s.ready_len == 0 && s.processing.is_empty() && s.waiting_keys.is_empty()
    }

    /// Stops the queue: adds are ignored from now on, delayed adds are dropped, and `get`
    /// returns what is still ready, then `None`. Does not wait for processing keys.
    pub fn shut_down(&self) {
        let mut s = self.inner.state.lock();
        s.shutting_down = true;
        // A plain shut down ends a drain in progress (as client-go's ShutDown does).
        s.draining = false;
        s.waiting.clear();
        s.waiting_keys.clear();
        s.waiting_origins.clear();
        drop(s);
        self.inner.ready_notify.notify_waiters();
        self.inner.drained_notify.notify_waiters();
    }

    /// Shuts the queue down like [`shut_down`](Self::shut_down), then waits until every key
    /// handed out has been marked `done`. A concurrent `shut_down` ends the wait.
    pub async fn shut_down_with_drain(&self) {
        {
            let mut s = self.inner.state.lock();
            s.draining = true;
            s.shutting_down = true;
            s.waiting.clear();
            s.waiting_keys.clear();
            s.waiting_origins.clear();
        }
        self.inner.ready_notify.notify_waiters();
        loop {
            let notified = self.inner.drained_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.inner.state.lock();
                if s.processing.is_empty() || !s.draining {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Whether [`shut_down`](Self::shut_down) or the drain variant was called.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.state.lock().shutting_down
    }

    /// Returns whether the key became ready (so a getter should be woken).
    pub(super) fn add_locked(
        &self,
        s: &mut State<K>,
        key: K,
        priority: Priority,
        now: Instant,
        origin: Origin,
    ) -> bool {
        if s.shutting_down {
            return false;
        }
        if let Some(o) = origin {
            s.origins.entry(key.clone()).or_insert(o);
        }
        let seq = s.next_seq;
        if let Some(d) = s.dirty.get_mut(&key) {
            if priority < d.priority {
                d.priority = priority;
                if d.queued.is_some() {
                    // Re-queue at the higher priority; the old entry goes stale.
                    d.queued = Some(seq);
                    s.next_seq += 1;
                    s.ready[priority.index()].push_back((key, seq));
                    return true;
                }
            }
            return false;
        }
        if let Some(m) = &self.inner.metrics {
            m.adds.inc();
        }
        let processing = s.processing.contains_key(&key);
        let queued = (!processing).then_some(seq);
        s.dirty.insert(key.clone(), Dirty { added_at: now, priority, queued });
        if processing {
            return false;
        }
        s.next_seq += 1;
        s.ready[priority.index()].push_back((key, seq));
        s.ready_len += 1;
        self.set_depth(s);
        true
    }

    fn pop_locked(&self, s: &mut State<K>, now: Instant) -> Option<K> {
        for idx in 0..s.ready.len() {
            while let Some((key, seq)) = s.ready[idx].pop_front() {
                let live = s.dirty.get(&key).is_some_and(|d| d.queued == Some(seq));
                if !live {
                    continue;
                }
                let Some(d) = s.dirty.remove(&key) else { continue };
                s.ready_len -= 1;
                self.set_depth(s);
                if let Some(m) = &self.inner.metrics {
                    m.queue_duration.observe(now.saturating_duration_since(d.added_at).as_secs_f64());
                }
                s.processing.insert(key.clone(), now);
                return Some(key);
            }
        }
        None
    }

    pub(super) fn set_depth(&self, s: &State<K>) {
        if let Some(m) = &self.inner.metrics {
            m.depth.set(i64::try_from(s.ready_len).unwrap_or(i64::MAX));
        }
    }
}

impl<K: QueueKey> Inner<K> {
    /// Seconds of work in progress (summed) and of the longest-running key, now.
    fn unfinished_work(&self) -> (f64, f64, bool) {
        let s = self.state.lock();
        let now = Instant::now();
        let mut total = 0.0;
        let mut longest = 0.0f64;
        for started in s.processing.values() {
            let secs = now.saturating_duration_since(*started).as_secs_f64();
            total += secs;
            longest = longest.max(secs);
        }
        (total, longest, s.shutting_down && s.processing.is_empty())
    }
}

/// client-go's `updateUnfinishedWorkLoop`: refresh the unfinished-work gauges every 500 ms.
async fn refresh_unfinished_work<K: QueueKey>(queue: Weak<Inner<K>>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = queue.upgrade() else { return };
        let (total, longest, finished) = inner.unfinished_work();
        if let Some(m) = &inner.metrics {
            m.unfinished_work.set(total);
            m.longest_running.set(longest);
        }
        if finished {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin_of(o: &Origin) -> Option<&str> {
        o.as_deref().and_then(TraceOrigin::object)
    }

    #[tokio::test]
    async fn a_key_keeps_its_first_trace_origin_until_handed_out() {
        let q = WorkQueue::new();
        q.add_traced("k", Priority::Normal, Some(TraceOrigin::for_test("first")));
        q.add_traced("k", Priority::Normal, Some(TraceOrigin::for_test("second")));
        q.add("plain");
        let (k, o) = q.get_traced().await.unwrap();
        assert_eq!((k, origin_of(&o)), ("k", Some("first")));
        assert_eq!(q.get_traced().await.map(|(k, o)| (k, o.is_none())), Some(("plain", true)));
        // Added while processing: the origin waits for `done` and comes with the next get.
        q.add_traced("k", Priority::Normal, Some(TraceOrigin::for_test("during")));
        q.done(&"k");
        let (_, o) = q.get_traced().await.unwrap();
        assert_eq!(origin_of(&o), Some("during"));
        q.done(&"k");
        // An untraced add of a key carries nothing, and leaves nothing behind.
        q.add("k");
        assert!(q.get_traced().await.unwrap().1.is_none());
        assert!(q.inner.state.lock().origins.is_empty());
    }

    #[tokio::test]
    async fn basic_fifo_and_dedup() {
        let q = WorkQueue::new();
        q.add(1);
        q.add(2);
        q.add(1);
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await, Some(1));
        assert_eq!(q.get().await, Some(2));
        assert_eq!(q.len(), 0);
        q.done(&1);
        q.done(&2);
        assert_eq!(q.processing_len(), 0);
    }

    #[tokio::test]
    async fn add_while_processing_is_requeued_on_done() {
        let q = WorkQueue::new();
        q.add("a");
        let k = q.get().await.unwrap();
        q.add("a");
        q.add("a");
        assert_eq!(q.len(), 0, "a processing key is not handed out again");
        q.done(&k);
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        assert_eq!(q.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn admission_drops_refused_adds_of_every_kind() {
        let q = WorkQueue::new();
        assert!(q.set_admission(Arc::new(|k: &&str| !k.starts_with("no"))));
        assert!(!q.set_admission(Arc::new(|_: &&str| true)), "set once");
        q.add("yes-1");
        q.add("no-1");
        q.add_with_priority("no-2", Priority::Low);
        q.add_after("no-3", Duration::from_millis(10));
        q.add_after("yes-2", Duration::from_millis(10));
        assert_eq!((q.len(), q.waiting_len()), (1, 1));
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(q.get().await, Some("yes-1"));
        assert_eq!(q.get().await, Some("yes-2"));
        assert!(q.is_empty());
        // What is pending: ready and processing keys, not delayed ones.
        q.add("yes-3");
        q.add_after("yes-4", Duration::from_secs(1));
        let k = q.get().await.unwrap();
        assert!(q.any_pending(|p| *p == k), "processing");
        q.add("yes-5");
        assert!(q.any_pending(|p| *p == "yes-5"), "ready");
        assert!(!q.any_pending(|p| *p == "yes-4"), "delayed adds are not pending");
        q.done(&k);
        assert_eq!(q.get().await, Some("yes-5"));
        q.done(&"yes-5");
        // Keys handed over from a queue without the filter are not filtered.
        let old = WorkQueue::new();
        old.add("no-4");
        old.hand_over_to(&q);
        assert_eq!(q.get().await, Some("no-4"));
    }

    #[tokio::test]
    async fn low_priority_waits_for_normal() {
        let q = WorkQueue::new();
        q.add_with_priority("initial-1", Priority::Low);
        q.add_with_priority("initial-2", Priority::Low);
        q.add("live");
        assert_eq!(q.get().await, Some("live"));
        assert_eq!(q.get().await, Some("initial-1"));
        assert_eq!(q.get().await, Some("initial-2"));
    }

    #[tokio::test]
    async fn normal_add_raises_low_priority_key() {
        let q = WorkQueue::new();
        q.add_with_priority("a", Priority::Low);
        q.add_with_priority("b", Priority::Low);
        q.add("c");
        q.add("b");
        assert_eq!(q.len(), 3, "a raise does not count twice");
        assert_eq!(q.get().await, Some("c"));
        assert_eq!(q.get().await, Some("b"));
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.len(), 0);
        // The stale low entry of b is skipped, and b is not handed out twice.
        q.shut_down();
        assert_eq!(q.get().await, None);
    }

    #[tokio::test]
    async fn low_add_does_not_lower_priority() {
        let q = WorkQueue::new();
        q.add("a");
        q.add_with_priority("b", Priority::Low);
        q.add_with_priority("a", Priority::Low);
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.get().await, Some("b"));
    }

    #[tokio::test]
    async fn shut_down_hands_out_ready_keys_then_none() {
        let q = WorkQueue::new();
        q.add(1);
        q.add_after(2, Duration::from_secs(1));
        q.shut_down();
        q.add(3);
        assert_eq!(q.get().await, Some(1));
        assert_eq!(q.get().await, None);
        assert_eq!(q.waiting_len(), 0);
    }

    #[tokio::test]
    async fn shut_down_wakes_blocked_getters() {
        let q: WorkQueue<u32> = WorkQueue::new();
        let getters: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move { q.get().await })
            })
            .collect();
        tokio::task::yield_now().await;
        q.shut_down();
        for g in getters {
            assert_eq!(g.await.unwrap(), None);
        }
    }

    #[tokio::test]
    async fn shut_down_with_drain_waits_for_processing() {
        let q = WorkQueue::new();
        q.add("a");
        let k = q.get().await.unwrap();
        let drain = tokio::spawn({
            let q = q.clone();
            async move { q.shut_down_with_drain().await }
        });
        tokio::task::yield_now().await;
        assert!(!drain.is_finished());
        assert!(q.is_shutting_down());
        q.done(&k);
        drain.await.unwrap();
    }

    #[tokio::test]
    async fn shut_down_ends_a_drain() {
        let q = WorkQueue::new();
        q.add("a");
        let _k = q.get().await.unwrap();
        let drain = tokio::spawn({
            let q = q.clone();
            async move { q.shut_down_with_drain().await }
        });
        tokio::task::yield_now().await;
        q.shut_down();
        drain.await.unwrap();
    }

    #[tokio::test]
    async fn drain_with_nothing_processing_returns_at_once() {
        let q: WorkQueue<u8> = WorkQueue::new();
        q.shut_down_with_drain().await;
    }

    #[tokio::test]
    async fn done_of_unknown_key_is_ignored() {
        let q = WorkQueue::new();
        q.done(&"x");
        q.add("x");
        q.done(&"x");
        assert_eq!(q.len(), 1);
    }

    #[tokio::test]
    async fn cancelled_get_takes_nothing() {
        let q = WorkQueue::new();
        let get = q.get();
        drop(get);
        q.add(7);
        let r = tokio::time::timeout(Duration::from_millis(0), q.get()).await;
        assert_eq!(r.ok().flatten(), Some(7));
    }
}
