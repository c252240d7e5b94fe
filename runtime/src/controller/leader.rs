//! Leader election on a `coordination.k8s.io/v1` Lease (client-go `tools/leaderelection`).
//!
//! Algorithm (as client-go's `LeaderElector`):
//! - Every `retry_period` a candidate tries to acquire: it reads the Lease; it may take it if
//!   the Lease does not exist, has no holder, is its own, or has not changed for
//!   `lease_duration` *as observed on the candidate's own clock* (no cross-node clock
//!   comparison). Writes use the read `resourceVersion`, so of two racing candidates exactly one
//!   wins (the other gets 409 Conflict and retries).
//! - The leader renews every `retry_period`. If no renewal has succeeded for
//!   `renew_deadline`, or another candidate took the lease over, it has lost the lease. As
//!   in controller-runtime (which skips its graceful shutdown then and exits), nothing is
//!   drained while a new leader may already act: the [`on_lost`](LeaderElector::on_lost)
//!   hook runs first (the host revokes its plugins' cluster access there: writes refused,
//!   running calls interrupted, calls blocked in a host call such as a guest's sleep ended
//!   at once), the leading token is cancelled, the leading work is
//!   dropped unfinished, and [`LeaderElector::run`] returns
//!   [`LeaderElectionError::LeadershipLost`] at once; the caller exits the process.
//! - On shutdown the leader releases the Lease (clears the holder) so a standby takes over
//!   without waiting for expiry.
//!
//! Defaults: lease 15 s, renew deadline 10 s, retry 2 s (controller-runtime's).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Leader-election settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This candidate's identity (unique per replica: e.g. pod name + random suffix).
    pub identity: String,
    /// How long a non-renewed lease blocks other candidates.
    pub lease_duration: Duration,
    /// How long the leader keeps retrying a failed renewal before giving up.
    pub renew_deadline: Duration,
    /// Interval between acquire/renew attempts.
    pub retry_period: Duration,
}

impl LeaderElectionConfig {
    /// controller-runtime's defaults (15 s / 10 s / 2 s).
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaderElectionConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// client-go's checks: lease > renew deadline > retry period · 1.2 (its jitter factor).
    pub fn validate(&self) -> Result<(), LeaderElectionError> {
        let bad = |reason: &str| Err(LeaderElectionError::InvalidConfig(reason.to_owned()));
        if self.identity.is_empty() {
            return bad("identity must not be empty");
        }
        if self.name.is_empty() || self.namespace.is_empty() {
            return bad("lease namespace and name must not be empty");
        }
        if self.lease_duration <= self.renew_deadline {
            return bad("lease-duration must be greater than renew-deadline");
        }
        if self.renew_deadline.as_secs_f64() <= JITTER * self.retry_period.as_secs_f64() {
            return bad("renew-deadline must be greater than retry-period * 1.2");
        }
        if self.retry_period.is_zero() {
            return bad("retry-period must be positive");
        }
        Ok(())
    }
}

/// client-go's `JitterFactor`: acquire attempts wait `retry_period · (1 + rand·1.2)`.
const JITTER: f64 = 1.2;

/// Why leader election stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    #[error("invalid leader election settings: {0}")]
    InvalidConfig(String),
    #[error("lost the lease {namespace}/{name}: not renewed within the renew deadline")]
    LeadershipLost { namespace: String, name: String },
}

/// The Lease as last seen, and when this candidate saw it change (local clock).
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    lease_duration: Duration,
    observed_at: Instant,
}

/// Outcome of one acquire/renew attempt.
#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    /// We hold the lease (created, renewed or taken over).
    Held,
    /// Someone else holds a live lease.
    HeldByOther(String),
    /// The API call failed (conflict, network, ...): try again later.
    Failed(String),
}

/// Runs leader election for one candidate.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observed: Mutex<Option<Observed>>,
    leading: watch::Sender<bool>,
    on_lost: Option<Box<dyn Fn() + Send + Sync>>,
    /// `leader_election_master_status{name}`, when exported.
    status: Option<prometheus_client::metrics::gauge::Gauge>,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .field("leading", &*self.leading.borrow())
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Result<Self, LeaderElectionError> {
        config.validate()?;
        Ok(LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: Mutex::new(None),
            leading: watch::Sender::new(false),
            on_lost: None,
            status: None,
        })
    }

    /// Runs `hook` the moment the lease is found lost, before anything else happens (not
    /// on a graceful shutdown). It must be quick and must not block.
    pub fn on_lost(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.on_lost = Some(Box::new(hook));
        self
    }

    /// Exports `leader_election_master_status{name="namespace/name"}` (client-go's name): 1
    /// while this candidate leads, 0 otherwise (0 from now on, before the first campaign).
    pub fn metrics(mut self, metrics: &crate::metrics::Metrics) -> Self {
        let name = format!("{}/{}", self.config.namespace, self.config.name);
        let gauge = metrics.leader_status.get_or_create(&crate::metrics::LeaseLabels { name }).clone();
        gauge.set(i64::from(self.is_leader()));
        self.status = Some(gauge);
        self
    }

    fn set_leading(&self, leading: bool) {
        self.leading.send_replace(leading);
        if let Some(g) = &self.status {
            g.set(i64::from(leading));
        }
    }

    /// Whether this candidate currently leads.
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Follows leadership changes.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leading.subscribe()
    }

    /// The current holder as last observed.
    pub fn observed_holder(&self) -> Option<String> {
        self.observed.lock().as_ref().and_then(|o| o.holder.clone())
    }

    /// Campaigns until elected, then runs `lead` with a token that is cancelled when the
    /// lease is lost or `shutdown` is cancelled, and keeps renewing meanwhile.
    ///
    /// Returns `Ok` after a shutdown (once `lead` has finished), or when `lead` ends by
    /// itself (the lease is released either way), and [`LeaderElectionError::LeadershipLost`]
    /// as soon as the lease is lost (not renewed within the renew deadline, or taken over):
    /// then `lead` is dropped without being awaited.
    pub async fn run<F, Fut>(&self, shutdown: CancellationToken, lead: F) -> Result<(), LeaderElectionError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        // Campaign.
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let attempt = tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew())
                .await
                .unwrap_or_else(|_| Attempt::Failed("acquire attempt timed out".into()));
            match attempt {
                Attempt::Held => break,
                Attempt::HeldByOther(holder) => {
                    tracing::debug!(lease = %self.config.name, %holder, "lease held by another candidate");
                }
                Attempt::Failed(e) => {
                    tracing::warn!(lease = %self.config.name, error = %e, "failed to acquire lease");
                }
            }
            let wait = jittered(self.config.retry_period);
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
        tracing::info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
        self.set_leading(true);

        let leading = shutdown.child_token();
        let lead = lead(leading.clone());
        tokio::pin!(lead);
        let mut lead_done = false;
        let mut last_renew = Instant::now();
        let mut lost = false;
        loop {
            let next = Instant::now() + self.config.retry_period;
            tokio::select! {
                _ = &mut lead => {
                    // The leading work ended by itself: holding the lease any longer would
                    // only keep a standby from taking over.
                    tracing::warn!(lease = %self.config.name, "leading work ended; giving up the lease");
                    lead_done = true;
                    break;
                }
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {
                    // Each attempt is bounded by what is left of the renew deadline.
                    let left = self.config.renew_deadline.saturating_sub(last_renew.elapsed());
                    let attempt = tokio::time::timeout(left, self.try_acquire_or_renew())
                        .await
                        .unwrap_or_else(|_| Attempt::Failed("renewal timed out".into()));
                    match attempt {
                        Attempt::Held => last_renew = Instant::now(),
                        Attempt::HeldByOther(holder) => {
                            tracing::warn!(lease = %self.config.name, %holder, "lease taken over by another candidate");
                            lost = true;
                            break;
                        }
                        Attempt::Failed(e) => {
                            tracing::warn!(lease = %self.config.name, error = %e, "failed to renew lease");
                            if last_renew.elapsed() >= self.config.renew_deadline {
                                lost = true;
                                break;
                            }
                        }
                    }
                }
            }
        }
        self.set_leading(false);
        if lost {
            // controller-runtime: no graceful shutdown once the lease is gone. Fence first,
            // then stop; the leading work is dropped here, not drained.
            if let Some(hook) = &self.on_lost {
                hook();
            }
            leading.cancel();
            tracing::error!(lease = %self.config.name, identity = %self.config.identity, "leadership lost");
            return Err(LeaderElectionError::LeadershipLost {
                namespace: self.config.namespace.clone(),
                name: self.config.name.clone(),
            });
        }
        // A shutdown: stop the workers (promptly), wait for in-flight work, give the lease up.
        leading.cancel();
        if !lead_done {
            lead.await;
        }
        self.release().await;
        Ok(())
    }

    /// client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&self) -> Attempt {
        let now = Instant::now();
        let lease_secs = i32::try_from(self.config.lease_duration.as_secs()).unwrap_or(i32::MAX).max(1);
        let existing = match self.api.get_opt(&self.config.name).await {
            Ok(l) => l,
            Err(e) => return Attempt::Failed(e.to_string()),
        };
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(lease_secs),
                    acquire_time: Some(micro_now()),
                    renew_time: Some(micro_now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created, now);
                    Attempt::Held
                }
                Err(e) => Attempt::Failed(e.to_string()),
            };
        };
        self.observe(&lease, now);
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let is_mine = holder.as_deref() == Some(self.config.identity.as_str());
        if let Some(holder) = &holder
            && !is_mine
            && !self.observed_expired(now)
        {
            return Attempt::HeldByOther(holder.clone());
        }
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(self.config.identity.clone());
        new_spec.lease_duration_seconds = Some(lease_secs);
        new_spec.renew_time = Some(micro_now());
        if !is_mine {
            new_spec.acquire_time = Some(micro_now());
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        lease.spec = Some(new_spec);
        // `replace` sends the read resourceVersion: a concurrent writer makes this a 409.
        match self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
            Ok(updated) => {
                self.observe(&updated, now);
                Attempt::Held
            }
            Err(e) => Attempt::Failed(e.to_string()),
        }
    }

    /// Records the Lease; the observation time moves only when the record changed.
    fn observe(&self, lease: &Lease, now: Instant) {
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty());
        let renew_time = spec.and_then(|s| s.renew_time.clone());
        let lease_duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.config.lease_duration, Duration::from_secs);
        let mut observed = self.observed.lock();
        let changed = observed.as_ref().is_none_or(|o| o.holder != holder || o.renew_time != renew_time);
        if changed {
            *observed = Some(Observed { holder, renew_time, lease_duration, observed_at: now });
        } else if let Some(o) = observed.as_mut() {
            o.lease_duration = lease_duration;
        }
    }

    fn observed_expired(&self, now: Instant) -> bool {
        self.observed.lock().as_ref().is_none_or(|o| o.observed_at + o.lease_duration <= now)
    }

    /// Gives the lease up so a standby need not wait for it to expire.
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else { return };
        let Some(spec) = lease.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        // client-go sets a 1 s duration on release so watchers see it expire at once.
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(micro_now());
        if let Err(e) = self.api.replace(&self.config.name, &PostParams::default(), &lease).await {
            tracing::warn!(lease = %self.config.name, error = %e, "failed to release lease");
        } else {
            tracing::info!(lease = %self.config.name, "released lease");
        }
    }
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// `d · (1 + rand · JITTER)` (client-go `wait.Jitter`).
fn jittered(d: Duration) -> Duration {
    let f: f64 = rand::random::<f64>() * JITTER;
    d.mul_f64(1.0 + f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_controller_runtimes_and_valid() {
        let c = LeaderElectionConfig::new("default", "wasmctrl", "me");
        assert_eq!(c.lease_duration, Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        c.validate().unwrap();
    }

    #[test]
    fn invalid_timings_are_rejected() {
        let mut c = LeaderElectionConfig::new("default", "wasmctrl", "me");
        c.renew_deadline = Duration::from_secs(15);
        assert!(c.validate().is_err());
        let mut c = LeaderElectionConfig::new("default", "wasmctrl", "me");
        c.retry_period = Duration::from_secs(9);
        assert!(c.validate().is_err());
        let c = LeaderElectionConfig::new("default", "wasmctrl", "");
        assert!(c.validate().is_err());
    }

    #[test]
    fn jitter_stays_in_bounds() {
        for _ in 0..100 {
            let j = jittered(Duration::from_secs(2));
            assert!(j >= Duration::from_secs(2) && j <= Duration::from_secs_f64(4.4));
        }
    }
}
