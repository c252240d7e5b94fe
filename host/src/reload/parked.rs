//! Queues of plugins that are not running: a removed plugin's pending keys, or the keys of
//! a `for` kind a plugin moved away from, kept for its return.
//!
//! Invariants:
//! - A parked queue carries the plugin's name and the kind its keys are of, and is handed
//!   only to a controller of the same name and kind ([`ParkedQueues::take`]); a plugin that
//!   comes back with another kind starts without it.
//! - Parked queues are bounded: at most [`MAX_PARKED`], the oldest dropped first, and each
//!   dropped once it has waited longer than the configured expiry. Every key dropped is
//!   counted in `wasmctrl_plugin_parked_keys_dropped_total{plugin, reason}` (`expired`,
//!   `evicted`) and logged.
//! - Parking a queue where one of the same name and kind waits merges them: nothing parked
//!   is dropped by a second park.
//! - A plugin renamed (its files renamed together) takes everything parked under its old
//!   name along ([`ParkedQueues::rename`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::controller::Request;
use crate::metrics::{Metrics, PluginReasonLabels};
use crate::plugin::Gvk;
use crate::queue::RateLimitingQueue;

/// At most this many parked queues are kept.
pub const MAX_PARKED: usize = 256;

struct Parked {
    queue: RateLimitingQueue<Request>,
    since: Instant,
}

/// The parked queues of a manager, by plugin name and `for` kind.
pub struct ParkedQueues {
    queues: BTreeMap<(String, Gvk), Parked>,
    ttl: Duration,
    metrics: Arc<Metrics>,
}

/// Keys a queue holds (ready, waiting for a retry, or in flight on a predecessor).
pub fn pending_keys(queue: &RateLimitingQueue<Request>) -> usize {
    queue.len() + queue.queue().waiting_len() + queue.queue().processing_len()
}

impl ParkedQueues {
    /// Parked queues expiring after `ttl`.
    pub fn new(ttl: Duration, metrics: Arc<Metrics>) -> Self {
        ParkedQueues { queues: BTreeMap::new(), ttl, metrics }
    }

    /// Parks `queue` (keys of `kind`) for `plugin`.
    pub fn park(&mut self, plugin: &str, kind: &Gvk, queue: RateLimitingQueue<Request>) {
        let key = (plugin.to_owned(), kind.clone());
        if let Some(existing) = self.queues.get(&key) {
            queue.hand_over_to(&existing.queue);
            return;
        }
        self.queues.insert(key, Parked { queue, since: Instant::now() });
        while self.queues.len() > MAX_PARKED {
            let Some(oldest) = self.queues.iter().min_by_key(|(_, p)| p.since).map(|(k, _)| k.clone()) else {
                break;
            };
            if let Some(p) = self.queues.remove(&oldest) {
                self.drop_parked(&oldest.0, &oldest.1, p, "evicted");
            }
        }
    }

    /// Hands everything parked for `from` to `to` (the same plugin, renamed), kind by kind.
    pub fn rename(&mut self, from: &str, to: &str) {
        let moved: Vec<(String, Gvk)> =
            self.queues.keys().filter(|(plugin, _)| plugin == from).cloned().collect();
        for key in moved {
            if let Some(p) = self.queues.remove(&key) {
                let at = (to.to_owned(), key.1);
                match self.queues.get(&at) {
                    Some(existing) => {
                        p.queue.hand_over_to(&existing.queue);
                    }
                    None => {
                        self.queues.insert(at, p);
                    }
                }
            }
        }
    }

    /// The queue parked for `plugin` with keys of `kind`, if any.
    pub fn take(&mut self, plugin: &str, kind: &Gvk) -> Option<RateLimitingQueue<Request>> {
        self.queues.remove(&(plugin.to_owned(), kind.clone())).map(|p| p.queue)
    }

    /// Drops the queues parked for longer than the expiry; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let expired: Vec<(String, Gvk)> = self
            .queues
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.since) >= self.ttl)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &expired {
            if let Some(p) = self.queues.remove(key) {
                self.drop_parked(&key.0, &key.1, p, "expired");
            }
        }
        expired.len()
    }

    /// When the next queue expires.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.queues.values().map(|p| p.since + self.ttl).min()
    }

    /// How many queues are parked.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.queues.len()
    }

    fn drop_parked(&self, plugin: &str, kind: &Gvk, p: Parked, reason: &str) {
        let keys = pending_keys(&p.queue);
        p.queue.shut_down();
        self.metrics
            .plugin_parked_keys_dropped
            .get_or_create(&PluginReasonLabels { plugin: plugin.to_owned(), reason: reason.to_owned() })
            .inc_by(keys as u64);
        tracing::warn!(plugin = %plugin, kind = %kind, keys, reason, parked_for_s = p.since.elapsed().as_secs(),
            "dropping the pending keys kept for a plugin that did not come back");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_with(keys: &[&str]) -> RateLimitingQueue<Request> {
        let q = RateLimitingQueue::default();
        for k in keys {
            q.add(Request::from_key(k));
        }
        q
    }

    fn dropped(m: &Metrics, reason: &str) -> f64 {
        m.encode()
            .lines()
            .filter(|l| l.starts_with("wasmctrl_plugin_parked_keys_dropped_total") && l.contains(reason))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    #[tokio::test]
    async fn parked_keys_go_only_to_the_same_name_and_kind_and_expire() {
        let metrics = Metrics::new();
        let mut parked = ParkedQueues::new(Duration::from_secs(60), metrics.clone());
        let cm = Gvk::new("v1", "ConfigMap");
        let secret = Gvk::new("v1", "Secret");
        parked.park("p", &cm, queue_with(&["ns/a", "ns/b"]));
        assert!(parked.take("p", &secret).is_none(), "another kind gets nothing");
        assert!(parked.take("q", &cm).is_none(), "another name gets nothing");
        // A second park of the same name and kind merges.
        parked.park("p", &cm, queue_with(&["ns/c"]));
        let q = parked.take("p", &cm).expect("parked");
        assert_eq!(q.len(), 3);

        parked.park("p", &cm, queue_with(&["ns/a"]));
        let later = Instant::now() + Duration::from_secs(61);
        assert_eq!(parked.expire(Instant::now()), 0);
        assert_eq!(parked.expire(later), 1);
        assert_eq!(parked.len(), 0);
        assert_eq!(dropped(&metrics, "expired"), 1.0);
    }

    #[tokio::test]
    async fn a_rename_moves_every_kind_parked_for_the_plugin() {
        let metrics = Metrics::new();
        let mut parked = ParkedQueues::new(Duration::from_secs(60), metrics.clone());
        let (cm, secret) = (Gvk::new("v1", "ConfigMap"), Gvk::new("v1", "Secret"));
        parked.park("a", &cm, queue_with(&["ns/a"]));
        parked.park("a", &secret, queue_with(&["ns/s"]));
        parked.park("b", &cm, queue_with(&["ns/b"]));
        parked.park("other", &cm, queue_with(&["ns/o"]));
        parked.rename("a", "b");
        assert!(parked.take("a", &cm).is_none() && parked.take("a", &secret).is_none());
        assert_eq!(parked.take("b", &cm).expect("merged").len(), 2, "merged with what b had");
        assert_eq!(parked.take("b", &secret).expect("moved").len(), 1);
        assert_eq!(parked.take("other", &cm).expect("untouched").len(), 1);
    }

    #[tokio::test]
    async fn the_oldest_parked_queue_goes_past_the_bound() {
        let metrics = Metrics::new();
        let mut parked = ParkedQueues::new(Duration::from_secs(60), metrics.clone());
        let cm = Gvk::new("v1", "ConfigMap");
        for i in 0..=MAX_PARKED {
            parked.park(&format!("p{i}"), &cm, queue_with(&["ns/a"]));
        }
        assert_eq!(parked.len(), MAX_PARKED);
        assert!(parked.take("p0", &cm).is_none(), "the oldest went first");
        assert_eq!(dropped(&metrics, "evicted"), 1.0);
    }
}
