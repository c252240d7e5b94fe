//! This replica's shard Lease: membership of the ring, and where it acknowledges epochs.
//!
//! The Lease is named after the ring and the shard, labelled with the ring, and held by the
//! shard's *identity* (its name plus something unique to this process), so a restarted
//! replica with the same name takes it over only as client-go's leader election takes over a
//! Lease: once it is free, or has not changed for its lease duration as this replica saw it.
//!
//! Invariants:
//! - **Fencing.** A renewal's success counts from the instant its attempt *started* (before
//!   the read): the write happened after that, so every other replica saw the Lease change
//!   no earlier. If no attempt started within the last renew deadline has succeeded, or the
//!   Lease is found deleted or held by someone else, the keeper *fences*: it runs the
//!   fence hook (which stops every reconcile and revokes the plugins' cluster access) at
//!   once and ends with [`LeaseError::Lost`]; the caller exits. Since renew deadline < lease
//!   duration, this happens before any other replica can count the Lease as expired.
//! - An acknowledgement is published only in a successful write of the Lease, and
//!   [`ShardLease::ack`] returns only once it is (or fails if the Lease is lost first).
//! - Leaving releases the Lease (holder cleared) only after the caller stopped working: a
//!   released Lease tells the others that nothing of this shard is in flight.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::protocol::{
    ACKED_ANNOTATION, RING_LABEL, ROLE_LABEL, ROLE_SHARD, SCOPES_ANNOTATION, SHARD_ANNOTATION,
};

/// Why the keeper stopped.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("lost the shard lease {namespace}/{name}: {reason}")]
    Lost { namespace: String, name: String, reason: String },
}

/// The keeper's settings.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub ring: String,
    pub shard: String,
    /// The holder identity: the shard name and this process.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// What the Lease publishes besides holding it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Published {
    acked: Option<u64>,
    scopes: Option<String>,
}

/// The state shared with the keeper task.
struct Shared {
    wanted: Mutex<Published>,
    /// Wakes the keeper for an immediate write.
    write_now: Notify,
    /// The last state written successfully.
    written: watch::Sender<Option<Published>>,
    /// Cancelled once the Lease is lost (fenced).
    lost: CancellationToken,
}

/// This replica's shard Lease: hold it with [`run`](Self::run), acknowledge with
/// [`ack`](Self::ack).
pub struct ShardLease {
    api: Api<Lease>,
    settings: LeaseSettings,
    shared: std::sync::Arc<Shared>,
}

/// A handle on a running keeper.
#[derive(Clone)]
pub struct LeaseHandle {
    shared: std::sync::Arc<Shared>,
}

impl LeaseHandle {
    /// Publishes `epoch` as acknowledged and returns once a write carrying it succeeded, or
    /// `false` if the Lease was lost first.
    pub async fn ack(&self, epoch: u64) -> bool {
        {
            let mut wanted = self.shared.wanted.lock();
            if wanted.acked.is_some_and(|a| a >= epoch) {
                // Already asked for; wait for it below.
            } else {
                wanted.acked = Some(epoch);
            }
        }
        self.shared.write_now.notify_one();
        let mut written = self.shared.written.subscribe();
        loop {
            if written.borrow().as_ref().is_some_and(|p| p.acked.is_some_and(|a| a >= epoch)) {
                return true;
            }
            tokio::select! {
                _ = self.shared.lost.cancelled() => return false,
                changed = written.changed() => if changed.is_err() { return false },
            }
        }
    }

    /// Publishes the label scopes (label mode) with the next write.
    pub fn set_scopes(&self, scopes: String) {
        let changed = {
            let mut wanted = self.shared.wanted.lock();
            let changed = wanted.scopes.as_deref() != Some(scopes.as_str());
            wanted.scopes = Some(scopes);
            changed
        };
        if changed {
            self.shared.write_now.notify_one();
        }
    }

    /// Resolves once the Lease is held (first written).
    pub async fn held(&self) {
        let mut written = self.shared.written.subscribe();
        let _ = written.wait_for(Option::is_some).await;
    }
}

/// What the Lease was last seen as (local observation, for taking it over).
struct Observed {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    duration: Duration,
    at: Instant,
}

/// Outcome of one write attempt.
enum Attempt {
    Held,
    /// Someone else holds a live Lease (only while acquiring).
    Busy(String),
    /// The Lease is gone or held by another: this replica no longer holds it.
    Lost(String),
    Failed(String),
}

impl ShardLease {
    pub fn new(client: kube::Client, settings: LeaseSettings) -> (ShardLease, LeaseHandle) {
        let shared = std::sync::Arc::new(Shared {
            wanted: Mutex::new(Published::default()),
            write_now: Notify::new(),
            written: watch::Sender::new(None),
            lost: CancellationToken::new(),
        });
        let handle = LeaseHandle { shared: shared.clone() };
        (ShardLease { api: Api::namespaced(client, &settings.namespace), settings, shared }, handle)
    }

    /// Acquires the Lease, then renews it until `leave` is cancelled (then releases it and
    /// returns `Ok`) or it is lost (then runs `fence` at once and returns the error).
    pub async fn run(self, leave: CancellationToken, fence: impl FnOnce()) -> Result<(), LeaseError> {
        let s = &self.settings;
        let mut observed: Option<Observed> = None;
        // Acquire.
        let mut last_success;
        loop {
            if leave.is_cancelled() {
                return Ok(());
            }
            let started = Instant::now();
            let attempt = tokio::time::timeout(s.renew_deadline, self.write(true, &mut observed))
                .await
                .unwrap_or_else(|_| Attempt::Failed("timed out".into()));
            match attempt {
                Attempt::Held => {
                    last_success = started;
                    break;
                }
                Attempt::Busy(holder) => {
                    tracing::info!(lease = %s.name, %holder, "shard lease held by a previous holder; waiting for it to expire")
                }
                Attempt::Lost(reason) | Attempt::Failed(reason) => {
                    tracing::warn!(lease = %s.name, %reason, "cannot acquire the shard lease yet")
                }
            }
            tokio::select! {
                _ = leave.cancelled() => return Ok(()),
                _ = tokio::time::sleep(s.retry_period) => {}
            }
        }
        tracing::info!(lease = %s.name, shard = %s.shard, identity = %s.identity, "holding the shard lease");
        // Renew.
        let lost = loop {
            let fence_at = last_success + s.renew_deadline;
            let next = Instant::now() + s.retry_period;
            tokio::select! {
                _ = leave.cancelled() => break None,
                _ = tokio::time::sleep_until(fence_at) => break Some("not renewed within the renew deadline".to_owned()),
                _ = tokio::time::sleep_until(next) => {}
                _ = self.shared.write_now.notified() => {}
            }
            let started = Instant::now();
            let left = fence_at.saturating_duration_since(started);
            let attempt = match tokio::time::timeout(left, self.write(false, &mut observed)).await {
                Ok(a) => a,
                Err(_) => break Some("not renewed within the renew deadline".to_owned()),
            };
            match attempt {
                Attempt::Held => last_success = started,
                Attempt::Lost(reason) => break Some(reason),
                Attempt::Busy(holder) => break Some(format!("held by {holder}")),
                Attempt::Failed(reason) => {
                    tracing::warn!(lease = %s.name, %reason, "failed to renew the shard lease");
                }
            }
        };
        match lost {
            Some(reason) => {
                fence();
                self.shared.lost.cancel();
                tracing::error!(lease = %s.name, shard = %s.shard, %reason, "shard lease lost: stopped all work");
                Err(LeaseError::Lost { namespace: s.namespace.clone(), name: s.name.clone(), reason })
            }
            None => {
                self.release().await;
                Ok(())
            }
        }
    }

    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (RING_LABEL.to_owned(), self.settings.ring.clone()),
            (ROLE_LABEL.to_owned(), ROLE_SHARD.to_owned()),
        ])
    }

    /// Writes the Lease once: creates or takes it over (`acquiring`), or renews it, with the
    /// wanted annotations.
    async fn write(&self, acquiring: bool, observed: &mut Option<Observed>) -> Attempt {
        let s = &self.settings;
        let now = Instant::now();
        let wanted = self.shared.wanted.lock().clone();
        let secs = i32::try_from(s.lease_duration.as_secs()).unwrap_or(i32::MAX).max(1);
        let existing = match self.api.get_opt(&s.name).await {
            Ok(l) => l,
            Err(e) => return Attempt::Failed(e.to_string()),
        };
        let Some(mut lease) = existing else {
            if !acquiring {
                return Attempt::Lost("the shard lease was deleted".into());
            }
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    namespace: Some(s.namespace.clone()),
                    labels: Some(self.labels()),
                    annotations: Some(self.annotations(&BTreeMap::new(), &wanted)),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(s.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(micro_now()),
                    renew_time: Some(micro_now()),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => {
                    self.shared.written.send_replace(Some(wanted));
                    Attempt::Held
                }
                Err(e) => Attempt::Failed(e.to_string()),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(s.identity.as_str());
        if !mine {
            if !acquiring {
                return Attempt::Lost(format!("now held by {}", holder.as_deref().unwrap_or("nobody")));
            }
            // Taking over: only a free Lease, or one unchanged for its whole duration as seen here.
            let duration = spec
                .lease_duration_seconds
                .and_then(|d| u64::try_from(d).ok())
                .map_or(s.lease_duration, Duration::from_secs);
            let changed =
                observed.as_ref().is_none_or(|o| o.holder != holder || o.renew_time != spec.renew_time);
            if changed {
                *observed = Some(Observed {
                    holder: holder.clone(),
                    renew_time: spec.renew_time.clone(),
                    duration,
                    at: now,
                });
            }
            let expired = observed.as_ref().is_some_and(|o| now >= o.at + o.duration);
            if let Some(h) = &holder
                && !expired
            {
                return Attempt::Busy(h.clone());
            }
        }
        let old_annotations = lease.metadata.annotations.clone().unwrap_or_default();
        // A new holder starts with nothing acknowledged: what a previous holder wrote is not ours.
        let base = if mine { old_annotations } else { BTreeMap::new() };
        lease.metadata.annotations = Some(self.annotations(&base, &wanted));
        let mut labels = lease.metadata.labels.clone().unwrap_or_default();
        labels.extend(self.labels());
        lease.metadata.labels = Some(labels);
        let mut new_spec = spec.clone();
        new_spec.holder_identity = Some(s.identity.clone());
        new_spec.lease_duration_seconds = Some(secs);
        new_spec.renew_time = Some(micro_now());
        if !mine {
            new_spec.acquire_time = Some(micro_now());
            new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        lease.spec = Some(new_spec);
        // `replace` sends the read resourceVersion: a concurrent writer makes this a 409.
        match self.api.replace(&s.name, &PostParams::default(), &lease).await {
            Ok(_) => {
                self.shared.written.send_replace(Some(wanted));
                Attempt::Held
            }
            Err(e) => Attempt::Failed(e.to_string()),
        }
    }

    fn annotations(&self, base: &BTreeMap<String, String>, wanted: &Published) -> BTreeMap<String, String> {
        let mut a = base.clone();
        a.insert(SHARD_ANNOTATION.to_owned(), self.settings.shard.clone());
        match wanted.acked {
            Some(e) => a.insert(ACKED_ANNOTATION.to_owned(), e.to_string()),
            None => a.remove(ACKED_ANNOTATION),
        };
        match &wanted.scopes {
            Some(scopes) => a.insert(SCOPES_ANNOTATION.to_owned(), scopes.clone()),
            None => a.remove(SCOPES_ANNOTATION),
        };
        a
    }

    /// Clears the holder (client-go sets a one-second duration on release so it reads as
    /// expired at once).
    async fn release(&self) {
        let s = &self.settings;
        for _ in 0..3 {
            let Ok(Some(mut lease)) = self.api.get_opt(&s.name).await else { return };
            let Some(spec) = lease.spec.as_mut() else { return };
            if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
                return;
            }
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(micro_now());
            match self.api.replace(&s.name, &PostParams::default(), &lease).await {
                Ok(_) => {
                    tracing::info!(lease = %s.name, "released the shard lease");
                    return;
                }
                Err(e) => tracing::warn!(lease = %s.name, error = %e, "failed to release the shard lease"),
            }
        }
    }
}

fn micro_now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}
