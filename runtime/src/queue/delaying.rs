//! Delayed adds to a [`WorkQueue`]: client-go's `DelayingQueue`, kept in the work queue's
//! own state (under its one mutex) rather than in a separate queue in front of it.
//!
//! Invariants:
//! - `add_after` keeps, per key, only the earliest ready time. Waiting keys become ready (are
//!   `add`ed) at that time; readiness is checked by every queue operation, and every waiting
//!   `get` sleeps until the earliest deadline, so no background task is needed.
//! - A key is in the waiting heap with a live entry if and only if `waiting_keys` records that
//!   entry's sequence number; entries left behind by an earlier ready time are stale and skipped.
//! - After `shut_down`, delayed adds are ignored and waiting keys (and their trace origins) are
//!   dropped.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::time::Duration;

use tokio::time::Instant;

use super::workqueue::{Origin, Priority, QueueKey, State, WorkQueue};

/// A delayed add, ordered by ready time then insertion order.
pub(super) struct Waiting<K> {
    pub(super) ready_at: Instant,
    pub(super) seq: u64,
    pub(super) key: K,
}

impl<K> PartialEq for Waiting<K> {
    fn eq(&self, other: &Self) -> bool {
        (self.ready_at, self.seq) == (other.ready_at, other.seq)
    }
}
impl<K> Eq for Waiting<K> {}
impl<K> PartialOrd for Waiting<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<K> Ord for Waiting<K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.ready_at, self.seq).cmp(&(other.ready_at, other.seq))
    }
}

impl<K: QueueKey> WorkQueue<K> {
    /// Adds `key` once `delay` has passed. If the key is already waiting, the earlier of the
    /// two ready times wins. A zero delay adds at once. Ignored after shut down.
    pub fn add_after(&self, key: K, delay: Duration) {
        self.add_after_traced(key, delay, None);
    }

    /// As [`add_after`](Self::add_after), with what caused the add.
    pub fn add_after_traced(&self, key: K, delay: Duration, origin: Origin) {
        if delay.is_zero() {
            self.add_traced(key, Priority::Normal, origin);
            return;
        }
        self.add_at_traced(key, Instant::now() + delay, origin);
    }

    /// Adds `key` at `ready_at` (at once if that has passed); as [`add_after`](Self::add_after).
    pub fn add_at(&self, key: K, ready_at: Instant) {
        self.add_at_traced(key, ready_at, None);
    }

    fn add_at_traced(&self, key: K, ready_at: Instant, origin: Origin) {
        let now = Instant::now();
        if ready_at <= now {
            self.add_traced(key, Priority::Normal, origin);
            return;
        }
        if !self.admitted(&key) {
            return;
        }
        let mut s = self.inner.state.lock();
        if let Some(next) = s.forward.clone() {
            drop(s);
            next.add_at_traced(key, ready_at, origin);
            return;
        }
        let earliest_before = s.waiting.peek().map(|Reverse(w)| w.ready_at);
        self.wait_locked(&mut s, key, ready_at, origin);
        let earliest_after = s.waiting.peek().map(|Reverse(w)| w.ready_at);
        drop(s);
        // A getter may be sleeping until a later deadline: let every getter recompute it.
        if earliest_after != earliest_before {
            self.inner.ready_notify.notify_waiters();
        }
    }

    /// Number of keys waiting for a delayed add.
    pub fn waiting_len(&self) -> usize {
        self.inner.state.lock().waiting_keys.len()
    }

    /// Records a delayed add (under the lock); the earliest ready time per key wins.
    pub(super) fn wait_locked(&self, s: &mut State<K>, key: K, ready_at: Instant, origin: Origin) {
        if s.shutting_down {
            return;
        }
        if let Some(o) = origin {
            s.waiting_origins.entry(key.clone()).or_insert(o);
        }
        let seq = s.next_seq;
        match s.waiting_keys.entry(key.clone()) {
            Entry::Occupied(mut e) => {
                if e.get().0 <= ready_at {
                    return;
                }
                e.insert((ready_at, seq));
            }
            Entry::Vacant(e) => {
                e.insert((ready_at, seq));
            }
        }
        s.next_seq += 1;
        s.waiting.push(Reverse(Waiting { ready_at, seq, key }));
    }

    /// Moves delayed keys whose time has come into the ready queue. Returns whether any key
    /// became ready.
    pub(super) fn promote_due(&self, s: &mut State<K>, now: Instant) -> bool {
        let mut any = false;
        while let Some(Reverse(w)) = s.waiting.peek() {
            if w.ready_at > now {
                break;
            }
            let Some(Reverse(w)) = s.waiting.pop() else { break };
            if s.waiting_keys.get(&w.key).is_some_and(|&(_, seq)| seq == w.seq) {
                s.waiting_keys.remove(&w.key);
                let origin =
                    if s.waiting_origins.is_empty() { None } else { s.waiting_origins.remove(&w.key) };
                any |= self.add_locked(s, w.key, Priority::Normal, now, origin);
            }
        }
        any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::TraceOrigin;

    #[tokio::test]
    async fn shutting_down_drops_waiting_trace_origins() {
        let q: WorkQueue<&str> = WorkQueue::new();
        q.add_after_traced("late", Duration::from_secs(60), Some(TraceOrigin::for_test("retry")));
        q.shut_down();
        assert!(q.inner.state.lock().waiting_origins.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_keeps_earliest_time() {
        let q = WorkQueue::new();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(5));
        q.add_after("a", Duration::from_secs(20));
        assert_eq!(q.waiting_len(), 1);
        let start = Instant::now();
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        q.done(&"a");
        // The later ready times were superseded: nothing else comes.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(q.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_orders_by_ready_time() {
        let q = WorkQueue::new();
        q.add_after("late", Duration::from_millis(300));
        q.add_after("early", Duration::from_millis(100));
        q.add_after("now", Duration::ZERO);
        assert_eq!(q.get().await, Some("now"));
        assert_eq!(q.get().await, Some("early"));
        assert_eq!(q.get().await, Some("late"));
    }

    #[tokio::test(start_paused = true)]
    async fn earlier_add_after_wakes_sleeping_getter() {
        let q = WorkQueue::new();
        q.add_after("a", Duration::from_secs(60));
        let getter = tokio::spawn({
            let q = q.clone();
            async move {
                let start = Instant::now();
                let k = q.get().await;
                (k, start.elapsed())
            }
        });
        tokio::task::yield_now().await;
        q.add_after("b", Duration::from_secs(1));
        let (k, waited) = getter.await.unwrap();
        assert_eq!(k, Some("b"));
        assert_eq!(waited, Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_key_already_dirty_is_not_duplicated() {
        let q = WorkQueue::new();
        q.add("a");
        q.add_after("a", Duration::from_millis(10));
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.len(), 0);
    }
}
