//! The hand-over from one [`WorkQueue`] to its successor (on a hot reload the old controller's
//! queue goes to the new controller's, or to a parked queue kept for the plugin's return: a
//! hand-off, never a drop).
//!
//! Invariants:
//! - A hand-over moves every ready key (with its priority and trace origin) and every delayed
//!   key (with its ready time) to the successor, under both queues' locks, so no key is lost or
//!   doubled.
//! - A key processing on the old queue at the hand-over is *borrowed* by the successor: it
//!   counts as processing there and is not handed out until the old queue's `done` for it;
//!   that `done` then adds it to the successor once more (the reconcile that ended may have
//!   missed a change). One key is never reconciled by both queues at once.
//! - Once handed over, a queue forwards every add, `done` and later hand-over to its successor
//!   (also after it was shut down) and hands out nothing itself; chains of hand-overs forward
//!   to the end of the chain.
//! - Lock order: a queue before its successor, never the other way round.

use std::sync::Arc;

use tokio::time::Instant;

use super::workqueue::{Origin, Priority, QueueKey, WorkQueue};

impl<K: QueueKey> WorkQueue<K> {
    /// Whether an add now would be kept (here or by a successor).
    pub fn accepts_adds(&self) -> bool {
        let s = self.inner.state.lock();
        s.forward.is_some() || !s.shutting_down
    }

    /// Whether this queue was handed over to a successor.
    pub fn is_handed_over(&self) -> bool {
        self.inner.state.lock().forward.is_some()
    }

    /// Hands this queue's work to `to` (see the module doc): ready keys with their
    /// priority, delayed keys with their ready time, keys in processing borrowed until their
    /// `done`. Returns how many keys moved (ready, delayed, processing). A queue already
    /// handed over forwards the call; handing a queue to itself does nothing.
    pub fn hand_over_to(&self, to: &WorkQueue<K>) -> (usize, usize, usize) {
        if Arc::ptr_eq(&self.inner, &to.inner) {
            return (0, 0, 0);
        }
        let mut s = self.inner.state.lock();
        if let Some(next) = s.forward.clone() {
            drop(s);
            return next.hand_over_to(to);
        }
        let now = Instant::now();
        self.promote_due(&mut s, now);
        let mut ready = Vec::with_capacity(s.ready_len);
        for idx in 0..s.ready.len() {
            let deque = std::mem::take(&mut s.ready[idx]);
            for (key, seq) in deque {
                let live = s.dirty.get(&key).is_some_and(|d| d.queued == Some(seq));
                if live && let Some(d) = s.dirty.remove(&key) {
                    let origin = if s.origins.is_empty() { None } else { s.origins.remove(&key) };
                    ready.push((key, d.priority, origin));
                }
            }
        }
        // Dirty keys left are processing: their `done` adds them to `to` anyway.
        s.dirty.clear();
        s.ready_len = 0;
        self.set_depth(&s);
        let mut waiting_origins = std::mem::take(&mut s.waiting_origins);
        let waiting: Vec<(K, Instant, Origin)> = s
            .waiting_keys
            .drain()
            .map(|(k, (at, _))| {
                let origin = if waiting_origins.is_empty() { None } else { waiting_origins.remove(&k) };
                (k, at, origin)
            })
            .collect();
        s.waiting.clear();
        let processing: Vec<K> = s.processing.keys().cloned().collect();
        s.forward = Some(to.clone());
        let moved = (ready.len(), waiting.len(), processing.len());
        // Lock order: a queue before its successor (never the other way round).
        let mut t = to.inner.state.lock();
        for key in processing {
            if !t.processing.contains_key(&key) {
                t.processing.insert(key.clone(), now);
                t.borrowed.insert(key);
            }
        }
        for (key, priority, origin) in ready {
            to.add_locked(&mut t, key, priority, now, origin);
        }
        for (key, at, origin) in waiting {
            to.wait_locked(&mut t, key, at, origin);
        }
        drop(t);
        drop(s);
        to.inner.ready_notify.notify_waiters();
        self.inner.ready_notify.notify_waiters();
        moved
    }

    /// The predecessor finished a key it held when it handed over: it is this queue's to
    /// hand out again, and is added once more.
    pub(super) fn finish_borrowed(&self, key: &K) {
        let mut s = self.inner.state.lock();
        let was_borrowed = s.borrowed.remove(key);
        if was_borrowed {
            s.processing.remove(key);
        }
        if let Some(next) = s.forward.clone() {
            drop(s);
            next.finish_borrowed(key);
            return;
        }
        let now = Instant::now();
        let mut woke = false;
        let seq = s.next_seq;
        match s.dirty.get_mut(key) {
            // Added while borrowed: it becomes ready now, as `done` would do.
            Some(d) if was_borrowed && d.queued.is_none() => {
                d.queued = Some(seq);
                let idx = d.priority.index();
                s.next_seq += 1;
                s.ready[idx].push_back((key.clone(), seq));
                s.ready_len += 1;
                self.set_depth(&s);
                woke = true;
            }
            Some(_) => {}
            None => woke = self.add_locked(&mut s, key.clone(), Priority::Normal, now, None),
        }
        let drained = s.processing.is_empty() && s.draining;
        drop(s);
        if woke {
            self.inner.ready_notify.notify_one();
        }
        if drained {
            self.inner.drained_notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::telemetry::TraceOrigin;

    fn origin_of(o: &Origin) -> Option<&str> {
        o.as_deref().and_then(TraceOrigin::object)
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_and_handed_over_keys_keep_their_trace_origin() {
        let q = WorkQueue::new();
        q.add_after_traced("late", Duration::from_secs(5), Some(TraceOrigin::for_test("retry")));
        q.add_traced("now", Priority::Low, Some(TraceOrigin::for_test("event")));
        let next = WorkQueue::new();
        assert_eq!(q.hand_over_to(&next), (1, 1, 0));
        let (k, o) = next.get_traced().await.unwrap();
        assert_eq!((k, origin_of(&o)), ("now", Some("event")));
        tokio::time::advance(Duration::from_secs(6)).await;
        let (k, o) = next.get_traced().await.unwrap();
        assert_eq!((k, origin_of(&o)), ("late", Some("retry")));
        let s = next.inner.state.lock();
        assert!(s.origins.is_empty() && s.waiting_origins.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn hand_over_moves_ready_delayed_and_in_flight_keys() {
        let old = WorkQueue::new();
        old.add_with_priority("low", Priority::Low);
        old.add("busy");
        let busy = old.get().await.unwrap();
        assert_eq!(busy, "busy");
        old.add("ready");
        let t0 = Instant::now();
        old.add_after("later", Duration::from_secs(5));
        let new = WorkQueue::new();
        assert_eq!(old.hand_over_to(&new), (2, 1, 1));
        assert!(old.is_handed_over());
        assert_eq!(old.len(), 0);
        assert_eq!(new.len(), 2);
        assert_eq!(new.waiting_len(), 1);
        // Priorities kept; the borrowed key is not handed out by the new queue.
        assert_eq!(new.get().await, Some("ready"));
        assert_eq!(new.get().await, Some("low"));
        new.add("busy");
        assert!(tokio::time::timeout(Duration::from_millis(1), new.get()).await.is_err(), "still borrowed");
        // Its reconcile ends on the old queue: it is the new queue's again.
        old.done(&busy);
        assert_eq!(old.processing_len(), 0);
        assert_eq!(new.get().await, Some("busy"));
        // The delayed key keeps its ready time.
        assert_eq!(new.get().await, Some("later"));
        assert!(t0.elapsed() >= Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_key_in_flight_at_the_hand_over_is_added_again_when_it_ends() {
        let old = WorkQueue::new();
        old.add("k");
        let k = old.get().await.unwrap();
        let new = WorkQueue::new();
        old.hand_over_to(&new);
        old.done(&k);
        assert_eq!(new.get().await, Some("k"), "the reconcile that ended may have missed a change");
    }

    #[tokio::test]
    async fn a_handed_over_queue_forwards_adds_even_after_shut_down() {
        let old = WorkQueue::new();
        let new = WorkQueue::new();
        old.hand_over_to(&new);
        old.shut_down();
        assert!(old.accepts_adds());
        old.add("x");
        old.add_after("y", Duration::from_millis(1));
        assert_eq!(old.get().await, None, "a handed-over queue hands out nothing");
        assert_eq!(new.get().await, Some("x"));
        assert_eq!(new.get().await, Some("y"));
    }

    #[tokio::test]
    async fn in_flight_key_finished_after_a_second_hand_over_lands_at_the_end_of_the_chain() {
        let first = WorkQueue::new();
        first.add("k");
        let k = first.get().await.unwrap();
        let second = WorkQueue::new();
        let third = WorkQueue::new();
        first.hand_over_to(&second);
        assert_eq!(second.processing_len(), 1);
        second.hand_over_to(&third);
        assert_eq!((second.processing_len(), third.processing_len()), (1, 1));
        first.done(&k);
        assert_eq!((second.processing_len(), third.processing_len()), (0, 0));
        assert_eq!(third.get().await, Some("k"));
        assert!(first.hand_over_to(&first) == (0, 0, 0));
    }
}
