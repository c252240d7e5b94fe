//! Which plugin version answers a review: the running admitting plugins by name, swapped
//! one at a time as versions come and go, and the webhook configurations that follow them.
//!
//! Invariants:
//! - A review is served by the version installed when it arrived, start to finish: it holds
//!   that version's handler (and so its plugin, instances and caches) until it is answered.
//!   Installing a new version swaps one pointer: reviews after the swap go to it, reviews in
//!   flight finish on the old one, and none is refused because of the swap.
//! - A plugin's handler is installed before its webhook configurations are written, and its
//!   configurations are deleted before its handler is removed, so the API server is never
//!   pointed at a plugin that is not there (but for its own informer's delay).
//! - Changes of the handlers are serialized; the map readers see is always a whole one.
//! - Writing a plugin's configurations is bounded ([`CONFIG_WRITE_TIMEOUT`]): a failure or a
//!   timeout is logged and leaves the handler in place (reviews are still answered).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::StatusCode;
use tokio::sync::watch;

use super::handler::{Outcome, PluginAdmission};
use super::metrics::{WebhookCodeLabels, WebhookLabels, WebhookMetrics};
use super::review::{self, Answer};
use super::rules::AdmissionRule;
use super::server::{ReviewReply, ReviewService};
use super::webhooks::WebhookConfigs;
use crate::plugin::Plugin;

/// The path prefix of every webhook.
pub const PATH_PREFIX: &str = "/admission/";

/// How long writing one plugin's webhook configurations may take: the reload that installs
/// a version waits for it, and must not hang on an API server that does not answer.
pub const CONFIG_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Routes reviews to the running admitting plugins; cheap to clone.
#[derive(Clone)]
pub struct AdmissionRouter {
    inner: Arc<RouterInner>,
}

struct RouterInner {
    handlers: ArcSwap<HashMap<String, Arc<PluginAdmission>>>,
    /// Serializes installs and removals (each a read-copy-update of `handlers`).
    changes: tokio::sync::Mutex<()>,
    metrics: WebhookMetrics,
    /// Writes the webhook configurations, when the host manages them.
    configs: Option<WebhookConfigs>,
    /// The CA bundle the configurations carry.
    ca: watch::Receiver<Option<Arc<[u8]>>>,
}

impl std::fmt::Debug for AdmissionRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionRouter")
            .field("plugins", &self.inner.handlers.load().keys().collect::<Vec<_>>())
            .field("configs", &self.inner.configs)
            .finish()
    }
}

impl AdmissionRouter {
    /// A router with no plugin yet. `configs`: how the host writes webhook configurations
    /// (`None`: it does not; `wasmctrl webhook-config` prints them); `ca`: the bundle they carry.
    pub fn new(
        configs: Option<WebhookConfigs>,
        ca: watch::Receiver<Option<Arc<[u8]>>>,
        metrics: WebhookMetrics,
    ) -> Self {
        AdmissionRouter {
            inner: Arc::new(RouterInner {
                handlers: ArcSwap::from_pointee(HashMap::new()),
                changes: tokio::sync::Mutex::new(()),
                metrics,
                configs,
                ca,
            }),
        }
    }

    /// The metrics the router counts in.
    pub fn metrics(&self) -> &WebhookMetrics {
        &self.inner.metrics
    }

    /// The handler serving `plugin` now.
    pub fn handler(&self, plugin: &str) -> Option<Arc<PluginAdmission>> {
        self.inner.handlers.load().get(plugin).cloned()
    }

    /// Makes `plugin` (a new version, with its `rules`) the one that answers its webhooks,
    /// then writes its webhook configurations. `previous`: the name an earlier version ran
    /// under, when it changed (its handler and configurations go). A version without rules
    /// removes the plugin's.
    pub async fn install(&self, previous: Option<&str>, plugin: Plugin, rules: Vec<AdmissionRule>) {
        let _changing = self.inner.changes.lock().await;
        let name = plugin.name().to_owned();
        if let Some(old) = previous.filter(|p| *p != name) {
            self.remove_locked(old).await;
        }
        if rules.is_empty() {
            if self.inner.handlers.load().contains_key(&name) {
                self.remove_locked(&name).await;
            }
            return;
        }
        let version = plugin.short_version().to_owned();
        let handler = Arc::new(PluginAdmission::new(plugin, rules.clone()));
        let mut next = HashMap::clone(&self.inner.handlers.load());
        next.insert(name.clone(), handler);
        self.inner.handlers.store(Arc::new(next));
        tracing::info!(plugin = %name, %version, webhooks = rules.len(), "admission: this version answers the plugin's webhooks");
        self.write_configs(&name, &rules).await;
    }

    /// Stops admitting for `plugin`: its configurations go first, then its handler.
    pub async fn remove(&self, plugin: &str) {
        let _changing = self.inner.changes.lock().await;
        self.remove_locked(plugin).await;
    }

    async fn remove_locked(&self, plugin: &str) {
        if let Some(configs) = &self.inner.configs {
            match configs.delete(plugin).await {
                Ok(()) => tracing::info!(plugin, "admission: webhook configurations deleted"),
                Err(e) => {
                    tracing::warn!(plugin, error = %e, "admission: deleting the webhook configurations failed")
                }
            }
        }
        let mut next = HashMap::clone(&self.inner.handlers.load());
        if next.remove(plugin).is_some() {
            self.inner.handlers.store(Arc::new(next));
            tracing::info!(plugin, "admission: the plugin no longer answers webhooks");
        }
    }

    async fn write_configs(&self, plugin: &str, rules: &[AdmissionRule]) {
        let Some(configs) = &self.inner.configs else { return };
        let ca = self.inner.ca.borrow().clone();
        match configs.apply(plugin, rules, ca.as_deref()).await {
            Ok(()) => tracing::info!(plugin, "admission: webhook configurations applied"),
            Err(e) => {
                tracing::warn!(plugin, error = %e, "admission: applying the webhook configurations failed; the API server will not call this plugin's webhooks until they exist")
            }
        }
    }

    /// Writes every plugin's configurations again whenever the CA bundle changes, until
    /// `stop`.
    pub async fn follow_ca_bundle(&self, stop: tokio_util::sync::CancellationToken) {
        let mut changes = self.inner.ca.clone();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
            }
            let _changing = self.inner.changes.lock().await;
            let handlers = self.inner.handlers.load_full();
            tracing::info!(
                plugins = handlers.len(),
                "admission: the CA bundle changed; writing the webhook configurations again"
            );
            for (name, handler) in handlers.iter() {
                self.write_configs(name, handler.rules()).await;
            }
        }
    }

    /// Answers one review posted to `path`.
    pub async fn review(&self, path: &str, body: Bytes) -> ReviewReply {
        let arrived = Instant::now();
        let Some((plugin, rule_name)) = path.strip_prefix(PATH_PREFIX).and_then(|p| p.split_once('/')) else {
            return ReviewReply::text(StatusCode::NOT_FOUND, format!("no webhook at {path}"));
        };
        // Held until answered: this version serves the whole review.
        let Some(handler) = self.handler(plugin) else {
            return ReviewReply::text(
                StatusCode::NOT_FOUND,
                format!("plugin {plugin} has no running version that admits (not loaded, or failed to load)"),
            );
        };
        let Some(rule) = handler.rule(rule_name) else {
            return ReviewReply::text(
                StatusCode::NOT_FOUND,
                format!("plugin {plugin} has no webhook {rule_name}"),
            );
        };
        let metrics = &self.inner.metrics;
        let webhook = WebhookLabels { webhook: path.to_owned() };
        let in_flight = metrics.in_flight.get_or_create(&webhook).clone();
        in_flight.inc();
        let (answer, outcome) = match review::parse(&body) {
            Ok(request) => {
                let (answer, outcome, trapped) = handler.admit(rule, &request, arrived).await;
                if trapped {
                    metrics.panics.inc();
                }
                (answer, outcome)
            }
            Err(e) => {
                tracing::warn!(%plugin, webhook = %rule_name, error = %e, "admission: unreadable review");
                (Answer::invalid(&e.to_string()), Outcome::Denied)
            }
        };
        in_flight.dec();
        metrics.answered(path, outcome.as_str());
        metrics.latency.get_or_create(&webhook).observe(arrived.elapsed().as_secs_f64());
        metrics
            .requests
            .get_or_create(&WebhookCodeLabels { webhook: path.to_owned(), code: "200".into() })
            .inc();
        ReviewReply::json(answer.to_json())
    }
}

impl ReviewService for AdmissionRouter {
    fn review<'a>(&'a self, path: &'a str, body: Bytes) -> BoxFuture<'a, ReviewReply> {
        Box::pin(AdmissionRouter::review(self, path, body))
    }
}
