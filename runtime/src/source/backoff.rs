//! Jittered exponential backoff with reset (client-go `wait.NewExponentialBackoffManager` as
//! the reflector configures it: 800 ms initial, ×2, 30 s cap, jitter 1.0, reset after 2 min).
//!
//! Invariant: without jitter, delays follow `initial · factor^n` capped at `max`; jitter adds
//! a uniformly random `[0, jitter · delay)`; after `reset_after` without a backoff the next
//! delay starts again from `initial`. Time is tokio's clock, so tests can pause it.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// Backoff parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffConfig {
    /// First delay.
    pub initial: Duration,
    /// Multiplier per consecutive failure.
    pub factor: f64,
    /// Largest delay before jitter.
    pub max: Duration,
    /// Random extra as a fraction of the delay (1.0: up to double).
    pub jitter: f64,
    /// A failure this long after the previous one starts again from `initial`.
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(800),
            factor: 2.0,
            max: Duration::from_secs(30),
            jitter: 1.0,
            reset_after: Duration::from_secs(120),
        }
    }
}

/// Backoff state.
#[derive(Debug)]
pub struct Backoff {
    config: BackoffConfig,
    current: Option<Duration>,
    last: Option<Instant>,
    rng: SmallRng,
}

impl Backoff {
    /// A fresh backoff.
    pub fn new(config: BackoffConfig) -> Self {
        Self { config, current: None, last: None, rng: SmallRng::from_os_rng() }
    }

    /// A fresh backoff with a deterministic jitter sequence (tests).
    pub fn with_seed(config: BackoffConfig, seed: u64) -> Self {
        Self { config, current: None, last: None, rng: SmallRng::seed_from_u64(seed) }
    }

    /// The delay before the next attempt, after a failure now.
    pub fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        let stale = self.last.is_some_and(|t| now.duration_since(t) > self.config.reset_after);
        let base = match self.current {
            Some(d) if !stale => d.mul_f64(self.config.factor).min(self.config.max),
            _ => self.config.initial.min(self.config.max),
        };
        self.current = Some(base);
        self.last = Some(now);
        let extra = if self.config.jitter > 0.0 {
            base.mul_f64(self.config.jitter * self.rng.random::<f64>())
        } else {
            Duration::ZERO
        };
        base + extra
    }

    /// Forgets past failures.
    pub fn reset(&mut self) {
        self.current = None;
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_jitter() -> BackoffConfig {
        BackoffConfig { jitter: 0.0, ..BackoffConfig::default() }
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_doubles_to_cap() {
        let mut b = Backoff::new(no_jitter());
        let delays: Vec<u64> = (0..9).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(delays, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000]);
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_resets_after_quiet_period() {
        let mut b = Backoff::new(no_jitter());
        b.next_delay();
        b.next_delay();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(b.next_delay(), Duration::from_millis(3200), "60 s is not long enough to reset");
        tokio::time::advance(Duration::from_secs(121)).await;
        assert_eq!(b.next_delay(), Duration::from_millis(800), "2 min of health resets");
        b.next_delay();
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(800));
    }

    #[tokio::test(start_paused = true)]
    async fn backoff_jitter_stays_in_bounds() {
        let mut b = Backoff::with_seed(BackoffConfig::default(), 7);
        let mut base = 800.0_f64;
        let mut distinct = std::collections::HashSet::new();
        for _ in 0..12 {
            let d = b.next_delay().as_secs_f64() * 1000.0;
            assert!(d >= base && d < 2.0 * base + 1.0, "{d} not in [{base}, {})", 2.0 * base);
            distinct.insert(d as u64);
            base = (base * 2.0).min(30_000.0);
        }
        assert!(distinct.len() > 3, "jitter varies the delays");
    }
}
