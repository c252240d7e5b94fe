//! The assignment role: one replica, elected on its own Lease (`<ring>-assignment`, with
//! client-go's leader election, `controller::leader`), publishes the ring's epochs, labels
//! objects in label mode (`labeler`) and removes the Leases of replicas long gone.
//!
//! Publishing follows [`next_assignment`]: a new epoch only when the live shard Leases
//! differ from the current epoch's members and every replica involved in the current epoch
//! has acknowledged it or stopped. An epoch is written into the assignment Lease's
//! annotations by one JSON patch that first *tests* that this replica still holds the Lease
//! and that the epoch there is the one it read, so a replica that lost the role meanwhile, or
//! two writers, can never publish two different rings under one epoch number.
//!
//! Losing the role stops it (publishing, labelling, clean-up) and campaigns again; the
//! replica's own shard work is not affected: nothing a stale assignment role can still write
//! lets two replicas work on one key (the hand-over does not trust labels, and epochs are
//! tested as above).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::handover::{Assignment, next_assignment};
use super::labeler::Labeler;
use super::membership::Membership;
use super::metrics::ShardMetrics;
use super::protocol::{self, RING_LABEL, ROLE_ASSIGNMENT, ROLE_LABEL};
use crate::controller::leader::{LeaderElectionConfig, LeaderElector};

/// A stopped replica's Lease is removed this long after it stopped (and once no epoch that
/// still matters names it).
const ORPHANED_AFTER: Duration = Duration::from_secs(60);

/// What the role needs.
pub struct AssignerSettings {
    pub namespace: String,
    pub ring: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Campaigns for the role until `stop` is cancelled; leads whenever elected.
pub async fn campaign(
    client: kube::Client,
    settings: AssignerSettings,
    membership: Arc<Membership>,
    labeler: Option<Labeler>,
    metrics: ShardMetrics,
    stop: CancellationToken,
) {
    let lease_name = protocol::assignment_lease_name(&settings.ring);
    let config = LeaderElectionConfig {
        lease_duration: settings.lease_duration,
        renew_deadline: settings.renew_deadline,
        retry_period: settings.retry_period,
        ..LeaderElectionConfig::new(&settings.namespace, &lease_name, &settings.identity)
    };
    let labeler = labeler.map(Arc::new);
    while !stop.is_cancelled() {
        let elector = match LeaderElector::new(client.clone(), config.clone()) {
            Ok(e) => e,
            Err(error) => {
                tracing::error!(%error, "the assignment role cannot campaign");
                return;
            }
        };
        let lead = |leading: CancellationToken| {
            let (client, membership, labeler, metrics) =
                (client.clone(), membership.clone(), labeler.clone(), metrics.clone());
            let settings = &settings;
            async move {
                metrics.assigner.set(1);
                tracing::info!(ring = %settings.ring, "running the ring's assignment role");
                lead(client, settings, membership, labeler, leading).await;
            }
        };
        let result = elector.run(stop.clone(), lead).await;
        metrics.assigner.set(0);
        match result {
            Ok(()) => return,
            Err(error) => tracing::warn!(%error, "lost the assignment role; campaigning again"),
        }
    }
}

async fn lead(
    client: kube::Client,
    settings: &AssignerSettings,
    membership: Arc<Membership>,
    labeler: Option<Arc<Labeler>>,
    leading: CancellationToken,
) {
    let leases: Api<Lease> = Api::namespaced(client, &settings.namespace);
    let lease_name = protocol::assignment_lease_name(&settings.ring);
    let mut current = loop {
        match leases.get_opt(&lease_name).await {
            Ok(lease) => {
                let annotations = lease.and_then(|l| l.metadata.annotations).unwrap_or_default();
                break protocol::decode_assignment(&annotations);
            }
            Err(error) => tracing::warn!(%error, "cannot read the assignment lease"),
        }
        tokio::select! {
            _ = leading.cancelled() => return,
            _ = tokio::time::sleep(settings.retry_period) => {}
        }
    };
    let (published_tx, published_rx) = watch::channel(current.clone());
    let labelling = labeler.map(|l| {
        let (membership, published, leading) = (membership.clone(), published_rx.clone(), leading.clone());
        tokio::spawn(async move { l.run(membership, published, leading).await })
    });
    let mut snapshots = membership.subscribe();
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        let now = Instant::now();
        if snapshot.synced_at.is_some() {
            let live = snapshot.live(now);
            let peer = |s: &str, identity: &str| snapshot.peer(s, identity, now);
            if let Some(next) = next_assignment(current.as_ref(), &live, &peer) {
                match publish(
                    &leases,
                    &lease_name,
                    &settings.identity,
                    settings.ring.as_str(),
                    current.as_ref(),
                    &next,
                )
                .await
                {
                    Ok(()) => {
                        let members: Vec<&String> = next.members.keys().collect();
                        tracing::info!(epoch = next.epoch, ?members, "published a ring epoch");
                        current = Some(next);
                        published_tx.send_replace(current.clone());
                    }
                    Err(error) => {
                        tracing::warn!(%error, epoch = next.epoch, "publishing a ring epoch failed")
                    }
                }
            }
            remove_orphans(&leases, &snapshot, current.as_ref(), now).await;
        }
        let wake = snapshot.next_change(now);
        tokio::select! {
            _ = leading.cancelled() => break,
            changed = snapshots.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(settings.retry_period) => {}
            _ = async { match wake { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {}
        }
    }
    if let Some(task) = labelling {
        task.abort();
    }
}

/// Writes `next` into the assignment Lease if this replica holds it and the Lease still
/// publishes `current`.
async fn publish(
    leases: &Api<Lease>,
    name: &str,
    identity: &str,
    ring: &str,
    current: Option<&Assignment>,
    next: &Assignment,
) -> Result<(), kube::Error> {
    let lease = leases.get(name).await?;
    let mut annotations = lease.metadata.annotations.clone().unwrap_or_default();
    let mut labels = lease.metadata.labels.clone().unwrap_or_default();
    labels.insert(RING_LABEL.to_owned(), ring.to_owned());
    labels.insert(ROLE_LABEL.to_owned(), ROLE_ASSIGNMENT.to_owned());
    let epoch_now = annotations.get(protocol::EPOCH_ANNOTATION).cloned();
    let expected = current.map(|c| c.epoch.to_string());
    if epoch_now != expected {
        return Err(kube::Error::Service(
            format!(
                "the assignment lease publishes epoch {epoch_now:?}, not the {expected:?} this replica read"
            )
            .into(),
        ));
    }
    for (k, v) in protocol::encode_assignment(next) {
        annotations.insert(k.to_owned(), v);
    }
    let epoch_test = match expected {
        Some(e) => {
            serde_json::json!({"op": "test", "path": "/metadata/annotations/wasmctrl.dev~1epoch", "value": e})
        }
        // No epoch yet: the whole annotation map is replaced below, tested by holder only.
        None => serde_json::json!({"op": "test", "path": "/spec/holderIdentity", "value": identity}),
    };
    let patch = serde_json::json!([
        {"op": "test", "path": "/spec/holderIdentity", "value": identity},
        epoch_test,
        {"op": "add", "path": "/metadata/labels", "value": labels},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
    ]);
    let patch = Patch::<()>::Json(serde_json::from_value(patch).map_err(kube::Error::SerdeError)?);
    leases.patch(name, &PatchParams::default(), &patch).await?;
    Ok(())
}

/// Deletes the Leases of shards stopped for [`ORPHANED_AFTER`] that no epoch still in
/// play names (with the resourceVersion last seen as a precondition: a Lease renewed
/// meanwhile is kept).
async fn remove_orphans(
    leases: &Api<Lease>,
    snapshot: &super::membership::Snapshot,
    current: Option<&Assignment>,
    now: Instant,
) {
    let involved: BTreeMap<&String, ()> =
        current.into_iter().flat_map(|c| c.involved()).map(|(s, _)| (s, ())).collect();
    for (shard, seen) in &snapshot.shards {
        let stopped = seen.holder.is_none() || !seen.is_live(now);
        let orphaned = seen.present
            && !involved.contains_key(shard)
            && stopped
            && now >= seen.expires_at().max(seen.changed_at) + ORPHANED_AFTER;
        if !orphaned {
            continue;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions { resource_version: seen.resource_version.clone(), uid: None }),
            ..DeleteParams::default()
        };
        match leases.delete(&seen.lease, &params).await {
            Ok(_) => {
                tracing::info!(%shard, lease = %seen.lease, "removed the lease of a replica gone for good")
            }
            Err(error) => tracing::debug!(%shard, %error, "could not remove an orphaned shard lease"),
        }
    }
}
