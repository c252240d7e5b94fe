//! client-go's `RateLimitingInterface`: a [`WorkQueue`] whose retries wait the delay a
//! [`RateLimiter`] decides.
//!
//! `add_rate_limited` = `add_after(key, limiter.when(key))` and counts a retry;
//! `forget` resets the key's failure history (call it when a key was handled for good).
//!
//! A queue handed over to a successor ([`RateLimitingQueue::hand_over_to`]) forwards its
//! rate-limited adds too; the failure counts live in the limiter, so a successor built
//! with the same limiter ([`RateLimitingQueue::limiter`]) keeps every key's backoff.

use std::sync::Arc;
use std::time::Duration;

use super::rate_limiter::{RateLimiter, default_controller_rate_limiter};
use super::workqueue::{Origin, Priority, QueueKey, WorkQueue};
use crate::metrics::Metrics;

/// A work queue with rate-limited re-adds. Cheap to clone: clones share one queue.
pub struct RateLimitingQueue<K: QueueKey> {
    queue: WorkQueue<K>,
    limiter: Arc<dyn RateLimiter<K>>,
}

impl<K: QueueKey> Clone for RateLimitingQueue<K> {
    fn clone(&self) -> Self {
        RateLimitingQueue { queue: self.queue.clone(), limiter: self.limiter.clone() }
    }
}

impl<K: QueueKey> std::fmt::Debug for RateLimitingQueue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitingQueue").field("queue", &self.queue).finish_non_exhaustive()
    }
}

impl<K: QueueKey> Default for RateLimitingQueue<K> {
    fn default() -> Self {
        Self::new(Arc::new(default_controller_rate_limiter()))
    }
}

impl<K: QueueKey> RateLimitingQueue<K> {
    /// A queue without metrics, retrying with `limiter`.
    pub fn new(limiter: Arc<dyn RateLimiter<K>>) -> Self {
        RateLimitingQueue { queue: WorkQueue::new(), limiter }
    }

    /// A queue exporting `workqueue_*{name}` (see [`WorkQueue::with_metrics`]).
    pub fn with_metrics(name: &str, metrics: Arc<Metrics>, limiter: Arc<dyn RateLimiter<K>>) -> Self {
        RateLimitingQueue { queue: WorkQueue::with_metrics(name, metrics), limiter }
    }

    /// The underlying queue (add, get, done, shut down, ...).
    pub fn queue(&self) -> &WorkQueue<K> {
        &self.queue
    }

    /// The limiter deciding retry delays.
    pub fn limiter(&self) -> &Arc<dyn RateLimiter<K>> {
        &self.limiter
    }

    /// Adds `key` after the limiter's delay for it, and counts a retry.
    pub fn add_rate_limited(&self, key: K) {
        self.add_rate_limited_traced(key, None);
    }

    /// As [`add_rate_limited`](Self::add_rate_limited), with what caused the retry.
    pub fn add_rate_limited_traced(&self, key: K, origin: Origin) {
        if !self.queue.accepts_adds() {
            return;
        }
        if let Some(m) = self.queue.metrics() {
            m.retries.inc();
        }
        let delay = self.limiter.when(&key);
        self.queue.add_after_traced(key, delay, origin);
    }

    /// Forgets `key`'s failures: its next rate-limited add starts from the shortest delay.
    /// Does not remove the key from the queue.
    pub fn forget(&self, key: &K) {
        self.limiter.forget(key);
    }

    /// How many times `key` was rate-limited since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.limiter.num_requeues(key)
    }

    /// See [`WorkQueue::add`].
    pub fn add(&self, key: K) {
        self.queue.add(key);
    }

    /// See [`WorkQueue::add_with_priority`].
    pub fn add_with_priority(&self, key: K, priority: Priority) {
        self.queue.add_with_priority(key, priority);
    }

    /// See [`WorkQueue::add_traced`].
    pub fn add_traced(&self, key: K, priority: Priority, origin: Origin) {
        self.queue.add_traced(key, priority, origin);
    }

    /// See [`WorkQueue::add_after`].
    pub fn add_after(&self, key: K, delay: Duration) {
        self.queue.add_after(key, delay);
    }

    /// See [`WorkQueue::add_after_traced`].
    pub fn add_after_traced(&self, key: K, delay: Duration, origin: Origin) {
        self.queue.add_after_traced(key, delay, origin);
    }

    /// See [`WorkQueue::get`].
    pub async fn get(&self) -> Option<K> {
        self.queue.get().await
    }

    /// See [`WorkQueue::get_traced`].
    pub async fn get_traced(&self) -> Option<(K, Origin)> {
        self.queue.get_traced().await
    }

    /// See [`WorkQueue::done`].
    pub fn done(&self, key: &K) {
        self.queue.done(key);
    }

    /// See [`WorkQueue::len`].
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// See [`WorkQueue::is_empty`].
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// See [`WorkQueue::shut_down`].
    pub fn shut_down(&self) {
        self.queue.shut_down();
    }

    /// See [`WorkQueue::shut_down_with_drain`].
    pub async fn shut_down_with_drain(&self) {
        self.queue.shut_down_with_drain().await;
    }

    /// See [`WorkQueue::hand_over_to`]. Share the limiter (build `to` with this queue's
    /// [`limiter`](Self::limiter)) to keep the keys' failure counts.
    pub fn hand_over_to(&self, to: &RateLimitingQueue<K>) -> (usize, usize, usize) {
        self.queue.hand_over_to(&to.queue)
    }

    /// See [`WorkQueue::is_shutting_down`].
    pub fn is_shutting_down(&self) -> bool {
        self.queue.is_shutting_down()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::ItemExponential;
    use tokio::time::Instant;

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_and_forget_resets() {
        let q = RateLimitingQueue::new(Arc::new(ItemExponential::new(
            Duration::from_millis(10),
            Duration::from_secs(1),
        )));
        for n in 0..4u32 {
            let start = Instant::now();
            q.add_rate_limited("k");
            assert_eq!(q.get().await, Some("k"));
            assert_eq!(start.elapsed(), Duration::from_millis(10) * 2u32.pow(n));
            q.done(&"k");
        }
        assert_eq!(q.num_requeues(&"k"), 4);
        q.forget(&"k");
        assert_eq!(q.num_requeues(&"k"), 0);
        let start = Instant::now();
        q.add_rate_limited("k");
        assert_eq!(q.get().await, Some("k"));
        assert_eq!(start.elapsed(), Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_adds_retries_and_depth() {
        let metrics = Metrics::new();
        let q: RateLimitingQueue<&str> = RateLimitingQueue::with_metrics(
            "m",
            metrics.clone(),
            Arc::new(default_controller_rate_limiter()),
        );
        q.add("a");
        q.add("a");
        q.add("b");
        q.add_rate_limited("c");
        let text = metrics.encode();
        assert!(text.contains(r#"workqueue_adds_total{name="m"} 2"#), "{text}");
        assert!(text.contains(r#"workqueue_depth{name="m"} 2"#), "{text}");
        assert!(text.contains(r#"workqueue_retries_total{name="m"} 1"#), "{text}");
        let k = q.get().await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        // Let the 500 ms refresher run.
        tokio::task::yield_now().await;
        let text = metrics.encode();
        assert!(text.contains(r#"workqueue_longest_running_processor_seconds{name="m"} 2"#), "{text}");
        assert!(text.contains(r#"workqueue_queue_duration_seconds_count{name="m"} 1"#), "{text}");
        q.done(&k);
        let text = metrics.encode();
        assert!(text.contains(r#"workqueue_work_duration_seconds_count{name="m"} 1"#), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_successor_with_the_same_limiter_keeps_the_backoff() {
        let limiter: Arc<dyn RateLimiter<&str>> =
            Arc::new(ItemExponential::new(Duration::from_millis(10), Duration::from_secs(10)));
        let old = RateLimitingQueue::new(limiter.clone());
        old.add_rate_limited("k");
        old.add_rate_limited("k");
        let new = RateLimitingQueue::new(old.limiter().clone());
        old.hand_over_to(&new);
        assert_eq!(new.num_requeues(&"k"), 2, "failure count kept");
        // A retry of a reconcile that was in flight on the old queue lands in the new one,
        // with the next backoff step.
        old.add_rate_limited("k");
        assert_eq!(new.num_requeues(&"k"), 3);
        let start = Instant::now();
        assert_eq!(new.get().await, Some("k"));
        assert_eq!(start.elapsed(), Duration::from_millis(10), "the earliest delayed add wins");
    }
}
