//! One plugin's budget of guest log lines: what the `log` import and the guest's stdout and
//! stderr may put into the host's log, all instances of the plugin together.
//!
//! Invariants:
//! - A token bucket refilled at the plugin's `log-lines-per-second` (default
//!   [`crate::plugin::DEFAULT_LOG_LINES_PER_SECOND`]) holding [`BURST_SECONDS`] seconds'
//!   worth, shared by the plugin's `log` import and its stdout and stderr: a plugin logging
//!   in a loop fills the host's log at that rate at most, and another plugin's lines are not
//!   affected.
//! - Every line dropped is counted in `wasmctrl_plugin_guest_lines_dropped{plugin, stream}`;
//!   the host logs one warning when a plugin starts losing lines and one line with the count
//!   when its lines get through again, never one per dropped line.
//! - Only lines that would be recorded spend the budget: callers ask after the level check.
//!
//! This module imports nothing of the runtime but [`crate::plugin::metrics`].

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::plugin::metrics::RuntimeMetrics;

/// The burst a plugin may log at once: this many seconds of its rate.
pub(crate) const BURST_SECONDS: f64 = 10.0;

struct Budget {
    tokens: f64,
    at: Instant,
    /// Lines dropped since the last one that got through.
    dropped: u64,
}

/// One plugin's log line budget, shared by its instances.
pub(crate) struct GuestOutputLimit {
    plugin: Arc<str>,
    /// Lines a second, sustained.
    per_second: f64,
    /// Lines at once.
    burst: f64,
    budget: Mutex<Budget>,
    metrics: RuntimeMetrics,
}

impl GuestOutputLimit {
    /// `per_second` lines a second (at least one), with a burst of [`BURST_SECONDS`] of them.
    pub fn new(plugin: Arc<str>, per_second: u32, metrics: RuntimeMetrics) -> Self {
        let per_second = f64::from(per_second.max(1));
        let burst = per_second * BURST_SECONDS;
        GuestOutputLimit {
            plugin,
            per_second,
            burst,
            budget: Mutex::new(Budget { tokens: burst, at: Instant::now(), dropped: 0 }),
            metrics,
        }
    }

    /// The plugin's name.
    pub fn plugin(&self) -> &Arc<str> {
        &self.plugin
    }

    /// Whether one more line of `stream` (`log`, `stdout`, `stderr`) may be logged now;
    /// counts it when not.
    pub fn admit(&self, stream: &'static str) -> bool {
        self.admit_at(stream, Instant::now())
    }

    fn admit_at(&self, stream: &'static str, now: Instant) -> bool {
        let mut b = self.budget.lock();
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.per_second).min(self.burst);
        b.at = b.at.max(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            let dropped = std::mem::take(&mut b.dropped);
            drop(b);
            if dropped > 0 {
                tracing::info!(plugin = %self.plugin, dropped, "guest log lines get through again after the plugin's log rate limit dropped some");
            }
            return true;
        }
        b.dropped += 1;
        let first = b.dropped == 1;
        drop(b);
        self.metrics.count_guest_lines_dropped(&self.plugin, stream, 1);
        if first {
            tracing::warn!(
                plugin = %self.plugin,
                stream,
                burst = self.burst,
                per_second = self.per_second,
                "guest log lines dropped: the plugin logs faster than its rate limit (log-lines-per-second)"
            );
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_sustained_rate_and_drops_are_counted() {
        let metrics = RuntimeMetrics::default();
        let limit = GuestOutputLimit::new("p".into(), 1_000, metrics.clone());
        let t = Instant::now();
        let burst = (1_000.0 * BURST_SECONDS) as usize;
        assert!((0..burst).all(|_| limit.admit_at("log", t)));
        assert!(!limit.admit_at("stdout", t));
        assert!(!limit.admit_at("log", t));
        let later = t + Duration::from_millis(10);
        let refilled = (1_000.0 / 100.0) as usize;
        assert!((0..refilled).all(|_| limit.admit_at("log", later)));
        assert!(!limit.admit_at("log", later));
        let count = |stream| {
            metrics
                .guest_lines_dropped
                .get_or_create(&crate::plugin::metrics::GuestStreamLabels { plugin: "p".into(), stream })
                .get()
        };
        assert_eq!((count("log"), count("stdout")), (2, 1));
        // Another plugin's budget is its own.
        let other = GuestOutputLimit::new("q".into(), 1_000, metrics);
        assert!(other.admit_at("log", t));
    }
}
