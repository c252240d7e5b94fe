//! Rate limiters deciding how long a key waits before it is retried (client-go's
//! `workqueue` rate limiters).
//!
//! - [`ItemExponential`]: per key, `base · 2^failures`, capped at `max`.
//! - [`ItemFastSlow`]: per key, `fast` for the first `max_fast_attempts`, then `slow`.
//! - [`TokenBucket`]: overall, `qps` tokens per second with a `burst`; an empty bucket hands
//!   out reservations in the future (like Go's `rate.Limiter.Reserve().Delay()`).
//! - [`MaxOf`]: the longest delay of several limiters.
//!
//! [`default_controller_rate_limiter`] is client-go's `DefaultControllerRateLimiter`:
//! max(exponential 5 ms..1000 s, bucket 10 qps / burst 100). [`RateLimiterConfig`] builds the
//! same shape with other numbers.
//!
//! Every `when` call counts as one failure/reservation; `forget` clears a key's failures.
//! Time is tokio's, so a paused test clock drives the token bucket.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::workqueue::QueueKey;

/// Decides the delay before a key is added again after a failure.
pub trait RateLimiter<K>: Send + Sync + 'static {
    /// The delay for `key` now; records one more failure (or reservation).
    fn when(&self, key: &K) -> Duration;
    /// Stops tracking `key` (its next failure starts from the shortest delay).
    fn forget(&self, key: &K);
    /// How many failures `key` has had since it was last forgotten.
    fn num_requeues(&self, key: &K) -> u32;
}

impl<K, R: RateLimiter<K> + ?Sized> RateLimiter<K> for Arc<R> {
    fn when(&self, key: &K) -> Duration {
        (**self).when(key)
    }
    fn forget(&self, key: &K) {
        (**self).forget(key)
    }
    fn num_requeues(&self, key: &K) -> u32 {
        (**self).num_requeues(key)
    }
}

impl<K, R: RateLimiter<K> + ?Sized> RateLimiter<K> for Box<R> {
    fn when(&self, key: &K) -> Duration {
        (**self).when(key)
    }
    fn forget(&self, key: &K) {
        (**self).forget(key)
    }
    fn num_requeues(&self, key: &K) -> u32 {
        (**self).num_requeues(key)
    }
}

/// Per-key exponential backoff: the n-th failure (from 0) waits `base · 2^n`, at most `max`.
#[derive(Debug)]
pub struct ItemExponential<K> {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: QueueKey> ItemExponential<K> {
    pub fn new(base: Duration, max: Duration) -> Self {
        ItemExponential { base, max, failures: Mutex::new(HashMap::new()) }
    }
}

impl<K: QueueKey> RateLimiter<K> for ItemExponential<K> {
    fn when(&self, key: &K) -> Duration {
        let exp = {
            let mut f = self.failures.lock();
            let n = f.entry(key.clone()).or_insert(0);
            let exp = *n;
            *n = n.saturating_add(1);
            exp
        };
        // Integer nanoseconds: exact, and saturating long before the shift could overflow.
        let delay = self.base.as_nanos().saturating_mul(1u128 << exp.min(100));
        if delay >= self.max.as_nanos() {
            return self.max;
        }
        u64::try_from(delay).map_or(self.max, Duration::from_nanos)
    }

    fn forget(&self, key: &K) {
        self.failures.lock().remove(key);
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.failures.lock().get(key).copied().unwrap_or(0)
    }
}

/// Per key: `fast` for the first `max_fast_attempts` failures, then `slow`.
#[derive(Debug)]
pub struct ItemFastSlow<K> {
    fast: Duration,
    slow: Duration,
    max_fast_attempts: u32,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: QueueKey> ItemFastSlow<K> {
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: u32) -> Self {
        ItemFastSlow { fast, slow, max_fast_attempts, failures: Mutex::new(HashMap::new()) }
    }
}

impl<K: QueueKey> RateLimiter<K> for ItemFastSlow<K> {
    fn when(&self, key: &K) -> Duration {
        let mut f = self.failures.lock();
        let n = f.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        if *n <= self.max_fast_attempts { self.fast } else { self.slow }
    }

    fn forget(&self, key: &K) {
        self.failures.lock().remove(key);
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.failures.lock().get(key).copied().unwrap_or(0)
    }
}

/// An overall token bucket: `qps` tokens per second, holding at most `burst`. Each `when`
/// takes a token; when none is left the reservation is in the future and its delay returned.
/// Per-key methods are no-ops.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    /// May go negative: outstanding reservations.
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket. `qps` must be positive (a non-positive rate is raised to one token per
    /// hour, so the limiter never divides by zero); `burst` of 0 is treated as 1.
    pub fn new(qps: f64, burst: u32) -> Self {
        let qps = if qps.is_finite() && qps > 0.0 { qps } else { 1.0 / 3600.0 };
        let burst = f64::from(burst.max(1));
        TokenBucket { qps, burst, state: Mutex::new(BucketState { tokens: burst, last: Instant::now() }) }
    }
}

impl<K> RateLimiter<K> for TokenBucket {
    fn when(&self, _key: &K) -> Duration {
        let mut s = self.state.lock();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(s.last).as_secs_f64();
        s.tokens = (s.tokens + elapsed * self.qps).min(self.burst);
        s.last = now;
        s.tokens -= 1.0;
        if s.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-s.tokens / self.qps).unwrap_or(Duration::MAX)
        }
    }

    fn forget(&self, _key: &K) {}

    fn num_requeues(&self, _key: &K) -> u32 {
        0
    }
}

/// The longest delay of several limiters; every limiter sees every call.
pub struct MaxOf<K> {
    limiters: Vec<Box<dyn RateLimiter<K>>>,
}

impl<K> std::fmt::Debug for MaxOf<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaxOf").field("limiters", &self.limiters.len()).finish()
    }
}

impl<K: 'static> MaxOf<K> {
    pub fn new(limiters: Vec<Box<dyn RateLimiter<K>>>) -> Self {
        MaxOf { limiters }
    }
}

impl<K: 'static> RateLimiter<K> for MaxOf<K> {
    fn when(&self, key: &K) -> Duration {
        self.limiters.iter().map(|l| l.when(key)).max().unwrap_or(Duration::ZERO)
    }

    fn forget(&self, key: &K) {
        for l in &self.limiters {
            l.forget(key);
        }
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.limiters.iter().map(|l| l.num_requeues(key)).max().unwrap_or(0)
    }
}

/// The numbers of the default controller limiter, configurable.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimiterConfig {
    /// Delay of a key's first retry (client-go: 5 ms).
    pub base_delay: Duration,
    /// Cap of a key's retry delay (client-go: 1000 s).
    pub max_delay: Duration,
    /// Overall retry rate (client-go: 10 per second).
    pub qps: f64,
    /// Overall retry burst (client-go: 100).
    pub burst: u32,
}

impl Default for RateLimiterConfig {
    fn default() -> Self {
        RateLimiterConfig {
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_secs(1000),
            qps: 10.0,
            burst: 100,
        }
    }
}

impl RateLimiterConfig {
    /// max(per-key exponential `base_delay..max_delay`, token bucket `qps`/`burst`).
    pub fn build<K: QueueKey>(&self) -> MaxOf<K> {
        MaxOf::new(vec![
            Box::new(ItemExponential::new(self.base_delay, self.max_delay)),
            Box::new(TokenBucket::new(self.qps, self.burst)),
        ])
    }
}

/// client-go's `DefaultControllerRateLimiter`.
pub fn default_controller_rate_limiter<K: QueueKey>() -> MaxOf<K> {
    RateLimiterConfig::default().build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_doubles_and_caps() {
        let l = ItemExponential::new(Duration::from_millis(1), Duration::from_secs(1));
        let expected = [1u64, 2, 4, 8, 16];
        for ms in expected {
            assert_eq!(l.when(&"one"), Duration::from_millis(ms));
        }
        assert_eq!(l.num_requeues(&"one"), 5);
        for _ in 0..20 {
            l.when(&"one");
        }
        assert_eq!(l.when(&"one"), Duration::from_secs(1));
        assert_eq!(l.when(&"two"), Duration::from_millis(1), "keys are independent");
        l.forget(&"one");
        assert_eq!(l.num_requeues(&"one"), 0);
        assert_eq!(l.when(&"one"), Duration::from_millis(1));
    }

    #[test]
    fn exponential_survives_huge_failure_counts() {
        let l = ItemExponential::new(Duration::from_millis(5), Duration::from_secs(1000));
        l.failures.lock().insert("k", u32::MAX - 1);
        assert_eq!(l.when(&"k"), Duration::from_secs(1000));
        assert_eq!(l.when(&"k"), Duration::from_secs(1000));
    }

    #[test]
    fn fast_slow_switches_after_max_fast_attempts() {
        let l = ItemFastSlow::new(Duration::from_millis(5), Duration::from_secs(10), 3);
        for _ in 0..3 {
            assert_eq!(l.when(&"a"), Duration::from_millis(5));
        }
        assert_eq!(l.when(&"a"), Duration::from_secs(10));
        assert_eq!(l.num_requeues(&"a"), 4);
        l.forget(&"a");
        assert_eq!(l.when(&"a"), Duration::from_millis(5));
    }

    #[tokio::test(start_paused = true)]
    async fn token_bucket_burst_then_rate() {
        let b = TokenBucket::new(10.0, 3);
        let when = |b: &TokenBucket| RateLimiter::<&str>::when(b, &"x");
        for _ in 0..3 {
            assert_eq!(when(&b), Duration::ZERO);
        }
        assert_eq!(when(&b), Duration::from_millis(100));
        assert_eq!(when(&b), Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(200)).await;
        // Two tokens accrued, both already reserved: the next one is 100 ms away.
        assert_eq!(when(&b), Duration::from_millis(100));
        tokio::time::advance(Duration::from_secs(10)).await;
        // Refilled to the burst, not beyond.
        for _ in 0..3 {
            assert_eq!(when(&b), Duration::ZERO);
        }
        assert!(when(&b) > Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn default_limiter_matches_client_go() {
        let l = default_controller_rate_limiter::<String>();
        let a = "a".to_owned();
        // Per-key exponential dominates while the bucket has tokens.
        for n in 0..10u32 {
            assert_eq!(l.when(&a), Duration::from_millis(5) * 2u32.pow(n));
        }
        assert_eq!(l.num_requeues(&a), 10);
        l.forget(&a);
        assert_eq!(l.num_requeues(&a), 0);
        assert_eq!(l.when(&a), Duration::from_millis(5));
        // 11 tokens used; 89 more empty the 100-token burst.
        for i in 0..89 {
            l.when(&i.to_string());
        }
        // The 101st reservation in the same instant waits for the bucket: 100 ms at 10 qps.
        assert_eq!(l.when(&"fresh".to_owned()), Duration::from_millis(100));
        assert_eq!(l.when(&"fresh2".to_owned()), Duration::from_millis(200));
    }

    #[test]
    fn max_of_forgets_everywhere() {
        let l = MaxOf::new(vec![
            Box::new(ItemExponential::new(Duration::from_millis(1), Duration::from_secs(1))),
            Box::new(ItemFastSlow::new(Duration::from_millis(3), Duration::from_secs(1), 1)),
        ]);
        assert_eq!(l.when(&1), Duration::from_millis(3));
        assert_eq!(l.when(&1), Duration::from_secs(1));
        assert_eq!(l.num_requeues(&1), 2);
        l.forget(&1);
        assert_eq!(l.num_requeues(&1), 0);
        assert_eq!(l.when(&1), Duration::from_millis(3));
    }

    #[test]
    fn config_builds_custom_limiter() {
        let cfg = RateLimiterConfig {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(250),
            ..RateLimiterConfig::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        rt.block_on(async {
            let l = cfg.build::<u8>();
            assert_eq!(l.when(&0), Duration::from_millis(100));
            assert_eq!(l.when(&0), Duration::from_millis(200));
            assert_eq!(l.when(&0), Duration::from_millis(250));
        });
    }
}
